/*
 * nvrtc.c — CUDA C -> CUBIN through NVRTC, loaded with dlopen at the first
 * compile (loading it costs ~100 ms, so a process that never compiles a
 * kernel never pays). Programs see the eager math: "vmath.h" is served from
 * memory with the three things NVRTC lacks (stdint.h, string.h, GCC builtins),
 * and __FMA__ is defined exactly when the CPU build has it, so vmath takes the
 * same path on both devices; -fmad=false keeps NVRTC from contracting what
 * the C source keeps separate. ptxas -v's report (registers, spills, stack)
 * is parsed from the log; NVRTC's own cache is turned off (see the options).
 */
#include "cuda_api.h"

#include "core.h"
#include "sha256.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

/* X(return type, name, params): the entry points used, by their unversioned
 * names (NVRTC exports no _v2 variants). */
#define KU_NVRTC_FUNCS(X)                                                                          \
    X(nvrtcResult, nvrtcVersion, (int *major, int *minor))                                         \
    X(const char *, nvrtcGetErrorString, (nvrtcResult r))                                          \
    X(nvrtcResult, nvrtcCreateProgram, (nvrtcProgram * p, const char *src, const char *name, int nh, \
                                        const char *const *headers, const char *const *names))     \
    X(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram p, int nopt, const char *const *opts))       \
    X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram p, size_t *n))                            \
    X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram p, char *log))                                \
    X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram p, size_t *n))                                 \
    X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram p, char *cubin))                                   \
    X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram * p))

static struct {
#define KU_NV_FIELD_(ret, name, params) ret(*name) params;
    KU_NVRTC_FUNCS(KU_NV_FIELD_)
#undef KU_NV_FIELD_
} nv;

static int nv_ok;
static char nv_reason[512];
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void) {
    /* Versioned names first: the unversioned one is a development symlink. */
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    void *h = ku_dlopen_first("NVRTC", names, sizeof names / sizeof *names, nv_reason, sizeof nv_reason);
    if (!h) return;
#define KU_NV_LOAD_(ret, name, params) \
    if (ku_dlsym_into(h, "NVRTC", #name, (void **)&nv.name, nv_reason, sizeof nv_reason)) return;
    KU_NVRTC_FUNCS(KU_NV_LOAD_)
#undef KU_NV_LOAD_
    nv_ok = 1;
}

int ku_nvrtc_available(const char *op) {
    pthread_once(&nv_once, nv_load);
    if (!nv_ok) ke_err(KL_ERR_UNSUPPORTED, op, "%s", nv_reason);
    return nv_ok;
}

int ku_nvrtc_version(int *major, int *minor) {
    pthread_once(&nv_once, nv_load);
    if (!nv_ok || nv.nvrtcVersion(major, minor) != 0) return -1;
    return 0;
}

extern const char ku_vmath_h[];
extern const char ku_kiln_cuda_h[];

/* What NVRTC lacks for vmath.h (docs/GPU.md): fixed-width integers, string.h
 * (device code has memcpy built in) and the GCC builtins vmath calls. */
static const char hdr_stdint[] =
    "#pragma once\n"
    "typedef signed char int8_t; typedef unsigned char uint8_t;\n"
    "typedef short int16_t; typedef unsigned short uint16_t;\n"
    "typedef int int32_t; typedef unsigned int uint32_t;\n"
    "typedef long long int64_t; typedef unsigned long long uint64_t;\n"
    "typedef long long intptr_t; typedef unsigned long long uintptr_t;\n"
    "#define INT32_MIN (-2147483647 - 1)\n#define INT32_MAX 2147483647\n"
    "#define INT64_MIN (-9223372036854775807LL - 1)\n#define INT64_MAX 9223372036854775807LL\n"
    "#define UINT32_MAX 4294967295u\n";
static const char hdr_string[] = "#pragma once\n";
/* The eager formulas (cn_emit.c) include <math.h> and <stdbool.h>: device code
 * has the math functions built in; these are the macros it lacks. */
static const char hdr_math[] =
    "#pragma once\n"
    "#define INFINITY __int_as_float(0x7f800000)\n"
    "#define NAN __int_as_float(0x7fc00000)\n"
    "#define M_SQRT1_2 0.70710678118654752440\n";
static const char hdr_stdbool[] = "#pragma once\n";
/* The eager files the generated programs include (embed_header.py --table). */
typedef struct ku_embedded {
    const char *name, *text;
} ku_embedded;
extern const ku_embedded ku_dev_files[];
static const char hdr_prelude[] =
    "#pragma once\n"
    "#define __builtin_nanf(s) __int_as_float(0x7fc00000)\n"
    "#define __builtin_inff() __int_as_float(0x7f800000)\n"
    "#define __builtin_fmaf(a, b, c) fmaf((a), (b), (c))\n"
    "#define __builtin_fma(a, b, c) fma((a), (b), (c))\n"
    "#include \"kiln_vmath_impl.h\"\n";

/* The in-memory headers and the options of every compile: one list, which the
 * disk cache's key hashes too (ku_nvrtc_inputs), so changing a header's text or
 * an option changes every key. */
enum { KU_MAX_HDR = 64 };
static const char *hdr_texts[KU_MAX_HDR];
static const char *hdr_names[KU_MAX_HDR];
static int n_hdr;
static char hdr_hex[KU_MAX_HDR][65];
static pthread_once_t hdr_once = PTHREAD_ONCE_INIT;
/* The fixed headers, then the eager files the generated programs include;
 * each one's digest once per process (vmath.h is tens of KB: hashing it at
 * every kernel load would cost more than the rest of a cache hit). */
static void hdr_init(void) {
    static const char *const fixed[][2] = {
        {"stdint.h", hdr_stdint}, {"string.h", hdr_string}, {"vmath.h", hdr_prelude},
        {"kiln_vmath_impl.h", ku_vmath_h}, {"math.h", hdr_math}, {"stdbool.h", hdr_stdbool},
        {"kiln_cuda.h", ku_kiln_cuda_h},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) {
        hdr_names[n_hdr] = fixed[i][0];
        hdr_texts[n_hdr++] = fixed[i][1];
    }
    for (const ku_embedded *e = ku_dev_files; e->name; e++) {
        KE_ASSERT(n_hdr < KU_MAX_HDR);
        hdr_names[n_hdr] = e->name;
        hdr_texts[n_hdr++] = e->text;
    }
    for (int i = 0; i < n_hdr; i++) {
        uint8_t d[32];
        ke_sha256(hdr_texts[i], strlen(hdr_texts[i]), d);
        for (int j = 0; j < 32; j++) snprintf(hdr_hex[i] + 2 * j, 3, "%02x", d[j]);
    }
}

/* KL_CUDA_FAST_MATH=1 (read once per process): CUDA's fast math instead of
 * the CPU's bits — NVRTC's -use_fast_math (approximate division and square
 * root, multiply-adds contracted, denormals flushed to zero). Off by default:
 * then every f32 elementwise op gives the CPU's bits (docs/GPU.md). */
static int fast_math(void) {
    static _Atomic int v = -1;
    int f = atomic_load(&v);
    if (f < 0) {
        const char *e = getenv("KL_CUDA_FAST_MATH");
        f = e && *e && strcmp(e, "0") != 0;
        atomic_store(&v, f);
    }
    return f;
}

/* Fills opts (room for 8) for sm_<arch>, archopt holding its -arch; returns the count. */
static int compile_options(int arch, char archopt[32], const char **opts) {
    snprintf(archopt, 32, "-arch=sm_%d", arch);
    /* -no-cache: NVRTC 12.9+ keeps its own cache in the driver's compute
     * cache when libcuda is loaded; a hit skips ptxas, so there is no resource
     * report (the spill check could not run) and compile times measure the
     * cache. Kiln keeps its own kernel cache, with its own keys and checks. */
    int n = 0;
    opts[n++] = archopt;
    opts[n++] = fast_math() ? "-use_fast_math" : "-fmad=false";
    opts[n++] = "-default-device";
    opts[n++] = "-Xptxas=-v";
    opts[n++] = "-no-cache";
#if defined(__FMA__)
    opts[n++] = "-D__FMA__=1";
#endif
    return n;
}

int ku_nvrtc_inputs(int arch, char *buf, size_t cap) {
    char archopt[32];
    const char *opts[8];
    int n = compile_options(arch, archopt, opts);
    pthread_once(&hdr_once, hdr_init);
    size_t len = 0;
    for (int i = 0; i < n + n_hdr; i++) {
        int w = i < n ? snprintf(buf + len, cap - len, "%s\n", opts[i])
                      : snprintf(buf + len, cap - len, "header %s %s\n", hdr_names[i - n], hdr_hex[i - n]);
        if (w < 0 || (size_t)w >= cap - len) return -1;
        len += (size_t)w;
    }
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ptxas -v lines: "Used 72 registers", "0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads". */
static void parse_usage(const char *log, ku_cubin *c) {
    for (const char *p = log; (p = strstr(p, "Used ")); p += 5) {
        int r;
        if (sscanf(p, "Used %d registers", &r) == 1 && r > c->registers) c->registers = r;
    }
    for (const char *p = log; (p = strstr(p, "bytes stack frame")); p++) {
        const char *q = p;
        while (q > log && q[-1] != '.' && q[-1] != '\n') q--;
        int st = 0, ss = 0, sl = 0;
        if (sscanf(q, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &st, &ss, &sl) == 3) {
            if (st > c->stack_bytes) c->stack_bytes = st;
            c->spill_bytes += ss + sl;
        }
    }
}

int ku_nvrtc_compile(const char *op, const char *src, const char *name, int arch, ku_cubin *out) {
    memset(out, 0, sizeof *out);
    if (!src || !name) return ke_err(KL_ERR_NULL_ARG, op, "NVRTC compile: NULL source or name");
    if (arch < 50 || arch > 199) return ke_err(KL_ERR_ARG, op, "NVRTC compile of %s: bad architecture sm_%d", name, arch);
    if (!ku_nvrtc_available(op)) return -1;
    pthread_once(&hdr_once, hdr_init);
    char archopt[32];
    const char *opts[8];
    int nopt = compile_options(arch, archopt, opts);
    double t0 = now_ms();
    nvrtcProgram prog = NULL;
    nvrtcResult r = nv.nvrtcCreateProgram(&prog, src, name, n_hdr, hdr_texts, hdr_names);
    if (r != 0) return ke_err(KL_ERR_INTERNAL, op, "nvrtcCreateProgram failed: %s", nv.nvrtcGetErrorString(r));
    r = nv.nvrtcCompileProgram(prog, nopt, opts);
    size_t logn = 0;
    nv.nvrtcGetProgramLogSize(prog, &logn);
    char *log = malloc(logn + 1);
    if (!log) {
        nv.nvrtcDestroyProgram(&prog);
        return ke_err(KL_ERR_OOM, op, "out of host memory for NVRTC's log");
    }
    log[0] = 0;
    if (logn) nv.nvrtcGetProgramLog(prog, log);
    log[logn] = 0;
    if (r != 0) {
        ke_err(KL_ERR_INTERNAL, op, "NVRTC compile of %s for sm_%d failed: %s\n%s", name, arch,
               nv.nvrtcGetErrorString(r), log);
        free(log);
        nv.nvrtcDestroyProgram(&prog);
        return -1;
    }
    size_t n = 0;
    r = nv.nvrtcGetCUBINSize(prog, &n);
    char *img = r == 0 && n ? malloc(n) : NULL;
    if (!img || nv.nvrtcGetCUBIN(prog, img) != 0) {
        free(img);
        free(log);
        nv.nvrtcDestroyProgram(&prog);
        return ke_err(KL_ERR_INTERNAL, op, "NVRTC compile of %s for sm_%d gave no CUBIN", name, arch);
    }
    nv.nvrtcDestroyProgram(&prog);
    out->image = img;
    out->size = n;
    out->log = log;
    out->compile_ms = now_ms() - t0;
    out->registers = out->spill_bytes = out->stack_bytes = -1;
    if (strstr(log, "Used ")) {
        out->registers = out->spill_bytes = out->stack_bytes = 0;
        parse_usage(log, out);
    }
    return 0;
}

void ku_cubin_free(ku_cubin *c) {
    if (!c) return;
    free(c->image);
    free(c->log);
    memset(c, 0, sizeof *c);
}
