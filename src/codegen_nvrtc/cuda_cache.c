/*
 * cuda_cache.c — CUBINs in the on-disk kernel cache (src/eager/diskcache.c,
 * the same folder, file format, checksum and rules as the LLVM backend's
 * objects: KL_CACHE_DIR / XDG / HOME, "off" disables, written to a temporary
 * name and renamed, a bad entry deleted and recompiled, never trusted).
 *
 * The key hashes all that decides the CUBIN — the source, the architecture,
 * NVRTC's version and the options (with the in-memory headers' digests) —
 * the four parts CuPy's and PyTorch's jiterator caches learned they need. A
 * payload is an 8-byte tag, ptxas's register / spill / stack report (so the
 * spill check still works on a hit) and the CUBIN.
 */
#include "cuda_api.h"

#include "core.h"
#include "diskcache.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAYLOAD_TAG "KUCUBIN1" /* change when the payload or the key's parts change */
enum { PAYLOAD_HDR = 8 + 3 * 4 };

static void put_i32(uint8_t *p, int32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)((uint32_t)v >> (8 * i));
}
static int32_t get_i32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return (int32_t)v;
}

void ku_cubin_key(ke_cache_key *k, const char *src, int arch, const char *nvrtc_version, const char *options) {
    char a[16];
    snprintf(a, sizeof a, "sm_%d", arch);
    const void *parts[] = {PAYLOAD_TAG, src, a, nvrtc_version, options};
    const size_t sizes[] = {8, strlen(src), strlen(a), strlen(nvrtc_version), strlen(options)};
    ke_cache_key_of(k, 5, parts, sizes);
}

int ku_cache_get(const ke_cache_key *k, ku_cubin *out) {
    memset(out, 0, sizeof *out);
    void *p;
    size_t n;
    if (!ke_cache_load(KE_CACHE_CUBIN, k, &p, &n)) return 0;
    const uint8_t *b = p;
    char *log = malloc(1);
    /* The digest matched, so a bad payload was written by another Kiln (an
     * older tag): a miss, and the recompile's store replaces it. */
    if (n <= PAYLOAD_HDR || memcmp(b, PAYLOAD_TAG, 8) != 0 || !log) {
        ke_log(KE_LOG_CACHE, "CUBIN entry with another payload format (%zu bytes): recompiling", n);
        free(p);
        free(log);
        return 0;
    }
    out->registers = get_i32(b + 8);
    out->spill_bytes = get_i32(b + 12);
    out->stack_bytes = get_i32(b + 16);
    out->size = n - PAYLOAD_HDR;
    memmove(p, b + PAYLOAD_HDR, out->size); /* keep one allocation: image is p */
    out->image = p;
    log[0] = 0;
    out->log = log;
    out->cached = 1;
    return 1;
}

void ku_cache_put(const ke_cache_key *k, const ku_cubin *c) {
    uint8_t *b = malloc(PAYLOAD_HDR + c->size);
    if (!b) return; /* an optimization only: no entry */
    memcpy(b, PAYLOAD_TAG, 8);
    put_i32(b + 8, c->registers);
    put_i32(b + 12, c->spill_bytes);
    put_i32(b + 16, c->stack_bytes);
    memcpy(b + PAYLOAD_HDR, c->image, c->size);
    ke_cache_store(KE_CACHE_CUBIN, k, b, PAYLOAD_HDR + c->size);
    free(b);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int ku_nvrtc_compile_cached(const char *op, const char *src, const char *name, int arch, ku_cubin *out) {
    memset(out, 0, sizeof *out);
    if (!src || !name) return ke_err(KL_ERR_NULL_ARG, op, "NVRTC compile: NULL source or name");
    /* NVRTC's version is part of the key, so NVRTC must load even for a hit
     * (~100 ms once per process; a process that loads kernels compiles some). */
    int ma, mi;
    if (!ku_nvrtc_available(op) || ku_nvrtc_version(&ma, &mi)) return ku_nvrtc_compile(op, src, name, arch, out);
    char ver[32], opts[KU_NVRTC_INPUTS_MAX];
    snprintf(ver, sizeof ver, "%d.%d", ma, mi);
    if (arch < 50 || arch > 199 || ku_nvrtc_inputs(arch, opts, sizeof opts))
        return ku_nvrtc_compile(op, src, name, arch, out); /* its error, or uncached */
    ke_cache_key k;
    double t0 = now_ms();
    ku_cubin_key(&k, src, arch, ver, opts);
    if (ku_cache_get(&k, out)) {
        out->compile_ms = now_ms() - t0;
        return 0;
    }
    if (ku_nvrtc_compile(op, src, name, arch, out)) return -1;
    ku_cache_put(&k, out);
    return 0;
}
