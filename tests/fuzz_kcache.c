/*
 * fuzz_kcache.c — fuzzes the kernel cache loader (ke_cache_load, the bytes
 * of an entry file in $KL_CACHE_DIR). Two modes, by the first input byte:
 *  - raw: the rest of the input is the entry file. A hit must return exactly
 *    the bytes after the 88-byte header; a miss must have removed the file
 *    (a bad entry is never trusted twice).
 *  - mutate: the rest is a payload, stored by ke_cache_store as a valid
 *    entry, then damaged as the next input bytes say (flip a byte, truncate,
 *    append, rewrite a header field). A hit must return the original payload
 *    and only when the damage changed nothing; a miss must remove the file.
 * The payload's meaning (an ELF object for LLVM) is trusted as far as whoever
 * can write the folder (src/eager/diskcache.h); only the checks before it are
 * fuzzed here. Plain build: replays tests/fuzz/kcache/.
 */
#include "fuzz_replay.h"

#include <fcntl.h>
#include <unistd.h>

#include "../src/eager/diskcache.h"
#include "kiln.h"

static void finding(const char *what) {
    fprintf(stderr, "fuzz_kcache: %s\n", what);
    abort();
}

static char dir[64], path[256];
static ke_cache_key key;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(dir, sizeof dir, "/tmp/kt_fuzz_kcache_%d", (int)getpid());
    mkdir(dir, 0700);
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
    const char *part = "fuzz_kcache";
    size_t len = strlen(part);
    ke_cache_key_of(&key, 1, (const void *const[]){part}, &len);
    char hex[65];
    ke_cache_key_hex(&key, hex);
    snprintf(path, sizeof path, "%s/%s%s", dir, hex, KE_CACHE_OBJ);
    return 0;
}

static size_t file_bytes(uint8_t **out) {
    FILE *f = fopen(path, "rb");
    if (!f) finding("the entry file cannot be read back");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (fread(*out, 1, (size_t)n, f) != (size_t)n) finding("short read of the entry file");
    fclose(f);
    return (size_t)n;
}

static void write_file(const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) finding("cannot write the entry file");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unlink(path);
    bool mutate = data[0] & 1;
    const uint8_t *body = data + 1;
    size_t n = size - 1, plen = n;
    uint8_t *orig = NULL, *file = NULL;
    size_t flen = 0;
    bool changed = true;
    if (!mutate) {
        write_file(body, n);
        flen = file_bytes(&file);
    } else {
        /* payload = the first half of the body, edits = the second */
        plen = n / 2;
        ke_cache_store(KE_CACHE_OBJ, &key, body, plen);
        size_t olen = file_bytes(&orig);
        file = malloc(olen + 64);
        memcpy(file, orig, olen);
        flen = olen;
        for (size_t i = plen; i + 2 < n; i += 3) {
            size_t at = flen ? (size_t)body[i + 1] * 7 % flen : 0;
            switch (body[i] % 4) {
            case 0: if (flen) file[at] ^= (uint8_t)(body[i + 2] | 1); break;
            case 1: flen = at; break;
            case 2: if (flen < olen + 64) file[flen++] = body[i + 2]; break;
            default: if (flen >= 24) memcpy(file + 16, &(uint64_t){body[i + 2]}, 8); break;
            }
        }
        changed = flen != olen || memcmp(file, orig, flen) != 0;
        write_file(file, flen);
    }
    void *obj = NULL;
    size_t osize = 0;
    int hit = ke_cache_load(KE_CACHE_OBJ, &key, &obj, &osize);
    if (hit) {
        if (!obj) finding("a hit without a payload");
        if (mutate) {
            if (changed) finding("a damaged entry was trusted");
            if (osize != plen || (plen && memcmp(obj, body, plen) != 0)) finding("a hit returned other bytes than stored");
        } else if (flen < 88 || osize != flen - 88 || (osize && memcmp(obj, file + 88, osize) != 0)) {
            finding("a hit returned other bytes than the file's payload");
        }
    } else {
        if (obj || osize) finding("a miss with a payload");
        if (!mutate || changed) {
            if (access(path, F_OK) == 0) finding("a bad entry was left in place");
        } else {
            finding("an intact entry missed");
        }
    }
    if (kl_last_status() != KL_OK) finding("the cache recorded a Kiln error (it must only log)");
    free(obj);
    free(orig);
    free(file);
    return 0;
}
