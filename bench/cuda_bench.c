/*
 * cuda_bench.c — the CUDA runtime's costs on a real GPU (bench/RESULTS.md,
 * "GPU"): the caching allocator's alloc+free when the cache hits, next to raw
 * cuMemAlloc+cuMemFree; device-to-device copy bandwidth at 2^26 floats timed
 * with events; NVRTC cold compile of one unary vmath kernel. Without a GPU
 * (or on the emulated device) it says so and exits 0; never run by meson test.
 * Before that, on any machine with NVRTC (no GPU needed): cold compile vs a
 * load from the on-disk kernel cache (ku_nvrtc_compile_cached) for sm_90, and
 * 6 kernels as one NVRTC program against 6 programs (kl_compile's group).
 *
 *     cuda_bench            # prints one line per measurement
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../src/codegen_nvrtc/cuda_api.h"
#include "../src/eager/diskcache.h"
#include "bench_util.h"
#include "kiln.h"

static const char *OP = "cuda_bench";

#define CHECK(x)                                                      \
    do {                                                              \
        if (x) {                                                      \
            fprintf(stderr, "cuda_bench: %s\n", kl_last_error());    \
            return 1;                                                 \
        }                                                             \
    } while (0)

/* Cold NVRTC compile vs disk-cache hit for unary vmath kernels, in a fresh
 * cache folder under /tmp (removed after). A hit's time is the whole
 * ku_nvrtc_compile_cached call: key, read, checksum. */
static int bench_disk_cache(int arch) {
    if (!ku_nvrtc_available(OP)) {
        printf("disk cache: %s\n", kl_last_error());
        kl_clear_error();
        return 0;
    }
    char dir[] = "/tmp/kiln_cuda_bench_XXXXXX";
    if (!mkdtemp(dir)) return 0;
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
    const char *fns[] = {"exp", "log", "tanh", "sigmoid", "gelu_tanh", "erf", "gelu_erf", "sin", "rsqrt"};
    enum { NF = sizeof fns / sizeof *fns, NHIT = 20 };
    double cold[NF], hit[NF * NHIT];
    int nh = 0;
    for (int f = 0; f < NF; f++) {
        char src[1024], nm[64];
        snprintf(src, sizeof src,
                 "#include \"vmath.h\"\n"
                 "extern \"C\" __global__ void k_%s(const float *x, float *y, long long n) {\n"
                 "  for (long long i = blockIdx.x * 128LL + threadIdx.x; i < n; i += (long long)gridDim.x * 128)\n"
                 "    y[i] = ke_v%sf(x[i]);\n"
                 "}\n",
                 fns[f], fns[f]);
        snprintf(nm, sizeof nm, "k_%s.cu", fns[f]);
        for (int r = 0; r <= NHIT; r++) {
            ku_cubin c;
            CHECK(ku_nvrtc_compile_cached(OP, src, nm, arch, &c));
            if (r == 0 && c.cached) printf("disk cache: unexpected hit on a fresh folder\n");
            if (r == 0) cold[f] = c.compile_ms;
            else hit[nh++] = c.compile_ms;
            ku_cubin_free(&c);
        }
    }
    kb_stats cs = kb_summarize(cold, NF), hs = kb_summarize(hit, nh);
    printf("NVRTC cold compile (cache miss, then stored), unary vmath kernel, sm_%d: median %.1f ms (q1 %.1f, q3 %.1f)\n",
           arch, cs.median, cs.q1, cs.q3);
    printf("disk-cache load of the same kernels: median %.3f ms (q1 %.3f, q3 %.3f) over %d loads\n", hs.median, hs.q1,
           hs.q3, nh);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    unsetenv("KL_CACHE_DIR");
    ke_cache_reset();
    return 0;
}

/* One NVRTC program of N kernels vs N programs of one kernel each (what
 * kl_compile did before it handed a graph's kernels over as one group):
 * NVRTC's fixed cost per program is paid once. N unary vmath kernels,
 * compiled without the disk cache, alternating the two forms; the ratio is
 * within this process. */
static int bench_one_program(int arch) {
    if (!ku_nvrtc_available(OP)) {
        printf("one program: %s\n", kl_last_error());
        kl_clear_error();
        return 0;
    }
    const char *fns[] = {"exp", "tanh", "sigmoid", "gelu_tanh", "erf", "rsqrt"};
    enum { NK = sizeof fns / sizeof *fns, REPS = 3 };
    static char one[NK][1024], all[NK * 1024];
    int n = snprintf(all, sizeof all, "#include \"vmath.h\"\n");
    for (int f = 0; f < NK; f++) {
        const char *body = "extern \"C\" __global__ void k_%s(const float *x, float *y, long long n) {\n"
                           "  for (long long i = blockIdx.x * 128LL + threadIdx.x; i < n; i += (long long)gridDim.x * 128)\n"
                           "    y[i] = ke_v%sf(x[i]);\n"
                           "}\n";
        int m = snprintf(one[f], sizeof one[f], "#include \"vmath.h\"\n");
        snprintf(one[f] + m, sizeof one[f] - (size_t)m, body, fns[f], fns[f]);
        n += snprintf(all + n, sizeof all - (size_t)n, body, fns[f], fns[f]);
    }
    double tsep[REPS], tone[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = kb_now_s();
        for (int f = 0; f < NK; f++) {
            ku_cubin c;
            CHECK(ku_nvrtc_compile(OP, one[f], "one.cu", arch, &c));
            ku_cubin_free(&c);
        }
        double t1 = kb_now_s();
        ku_cubin c;
        CHECK(ku_nvrtc_compile(OP, all, "all.cu", arch, &c));
        ku_cubin_free(&c);
        tsep[r] = (t1 - t0) * 1e3;
        tone[r] = (kb_now_s() - t1) * 1e3;
    }
    kb_stats ss = kb_summarize(tsep, REPS), so = kb_summarize(tone, REPS);
    printf("NVRTC, %d unary vmath kernels for sm_%d: %d programs %.1f ms (%.1f ms a kernel), one program %.1f ms "
           "(%.1f ms a kernel): one program takes %.2fx the time of %d (medians of %d)\n",
           NK, arch, NK, ss.median, ss.median / NK, so.median, so.median / NK, so.median / ss.median, NK, REPS);
    return 0;
}

int main(void) {
    if (bench_disk_cache(90)) return 1;
    if (bench_one_program(90)) return 1;
    if (!kl_cuda_is_available()) {
        printf("cuda_bench: no GPU: %s\n", kl_cuda_unavailable_reason());
        return 0;
    }
    const ku_driver *d = ku_driver_get(OP);
    char name[256];
    CHECK(kl_cuda_device_name(0, name, sizeof name));
    int drv = 0;
    d->DriverGetVersion(&drv);
    printf("device: %s, sm_%d, driver API %d%s\n", name, kl_cuda_compute_capability(0), drv,
           d->emulated ? " (EMULATED: timings mean nothing)" : "");
    CHECK(ku_device_enter(OP, 0));

    /* Allocator, cache hit: the same size freed and taken again. */
    size_t sizes[] = {4096, (size_t)64 << 20};
    for (int k = 0; k < 2; k++) {
        CUdeviceptr p = ku_malloc(OP, 0, sizes[k], NULL);
        CHECK(!p || ku_free(OP, p));
        double t[7];
        enum { N = 200000 };
        for (int r = 0; r < 7; r++) {
            double t0 = kb_now_s();
            for (int i = 0; i < N; i++) {
                p = ku_malloc(OP, 0, sizes[k], NULL);
                ku_free(OP, p);
            }
            t[r] = (kb_now_s() - t0) / N * 1e9;
        }
        kb_stats s = kb_summarize(t, 7);
        printf("allocator alloc+free, cache hit, %zu bytes: median %.1f ns (q1 %.1f, q3 %.1f)\n", sizes[k], s.median,
               s.q1, s.q3);
    }
    {
        double t[7];
        enum { N = 200 };
        for (int r = 0; r < 7; r++) {
            double t0 = kb_now_s();
            for (int i = 0; i < N; i++) {
                CUdeviceptr p;
                CHECK(KU_CALL(OP, d, MemAlloc, &p, 4096));
                CHECK(KU_CALL(OP, d, MemFree, p));
            }
            t[r] = (kb_now_s() - t0) / N * 1e6;
        }
        kb_stats s = kb_summarize(t, 7);
        printf("raw cuMemAlloc+cuMemFree, 4096 bytes: median %.2f us (q1 %.2f, q3 %.2f)\n", s.median, s.q1, s.q3);
    }
    kl_cuda_mem_stats ms;
    CHECK(kl_cuda_memory_stats(0, &ms));
    printf("allocator stats: %lld allocs, %lld cache hits, %lld cuMemAlloc\n", (long long)ms.num_allocs,
           (long long)ms.cache_hits, (long long)ms.num_device_allocs);

    /* Device-to-device copy, 2^26 floats (256 MiB), events around each. */
    size_t bytes = ((size_t)1 << 26) * sizeof(float);
    CUstream st;
    CUevent e0, e1;
    CHECK(KU_CALL(OP, d, StreamCreate, &st, CU_STREAM_NON_BLOCKING));
    CHECK(KU_CALL(OP, d, EventCreate, &e0, CU_EVENT_DEFAULT));
    CHECK(KU_CALL(OP, d, EventCreate, &e1, CU_EVENT_DEFAULT));
    CUdeviceptr a = ku_malloc(OP, 0, bytes, st), b = ku_malloc(OP, 0, bytes, st);
    CHECK(!a || !b);
    CHECK(KU_CALL(OP, d, MemsetD8Async, a, 1, bytes, st));
    for (int w = 0; w < 3; w++) CHECK(KU_CALL(OP, d, MemcpyDtoDAsync, b, a, bytes, st));
    double t[21];
    for (int r = 0; r < 21; r++) {
        CHECK(KU_CALL(OP, d, EventRecord, e0, st));
        CHECK(KU_CALL(OP, d, MemcpyDtoDAsync, b, a, bytes, st));
        CHECK(KU_CALL(OP, d, EventRecord, e1, st));
        CHECK(KU_CALL(OP, d, EventSynchronize, e1));
        float ms1 = 0;
        CHECK(KU_CALL(OP, d, EventElapsedTime, &ms1, e0, e1));
        t[r] = ms1;
    }
    kb_stats s = kb_summarize(t, 21);
    printf("cuMemcpyDtoDAsync 2^26 f32 (%zu MiB): median %.3f ms (q1 %.3f, q3 %.3f) = %.0f GB/s read+write "
           "(%.0f GB/s counting the copy once)\n",
           bytes >> 20, s.median, s.q1, s.q3, 2.0 * bytes / (s.median * 1e-3) / 1e9, bytes / (s.median * 1e-3) / 1e9);
    CHECK(ku_free(OP, a) || ku_free(OP, b));
    CHECK(KU_CALL(OP, d, StreamSynchronize, st));
    CHECK(kl_cuda_empty_cache(0));

    /* NVRTC: cold compile of one unary vmath kernel to CUBIN, per function. */
    if (ku_nvrtc_available(OP)) {
        const char *fns[] = {"exp", "log", "tanh", "sigmoid", "gelu_tanh", "erf", "gelu_erf", "sin", "rsqrt"};
        enum { NF = sizeof fns / sizeof *fns };
        double ct[NF];
        int cc = kl_cuda_compute_capability(0);
        for (int f = 0; f < NF; f++) {
            char src[1024], nm[64];
            snprintf(src, sizeof src,
                     "#include \"vmath.h\"\n"
                     "extern \"C\" __global__ void k_%s(const float *x, float *y, long long n) {\n"
                     "  for (long long i = blockIdx.x * 128LL + threadIdx.x; i < n; i += (long long)gridDim.x * 128)\n"
                     "    y[i] = ke_v%sf(x[i]);\n"
                     "}\n",
                     fns[f], fns[f]);
            snprintf(nm, sizeof nm, "k_%s.cu", fns[f]);
            ku_cubin c;
            CHECK(ku_nvrtc_compile(OP, src, nm, cc, &c));
            ct[f] = c.compile_ms;
            ku_cubin_free(&c);
        }
        double first = ct[0];
        kb_stats cs = kb_summarize(ct, NF);
        printf("NVRTC cold compile, unary vmath kernel -> CUBIN sm_%d: median %.1f ms (q1 %.1f, q3 %.1f; first call "
               "%.1f ms) over %d kernels\n",
               cc, cs.median, cs.q1, cs.q3, first, NF);
        /* Where the time goes: NVRTC's fixed cost per program (a kernel with
         * no math), what parsing vmath.h adds (included, unused), and the
         * unary kernel again. A comment with a counter makes each source new. */
        const char *parts[][2] = {
            {"no math, no include", ""},
            {"vmath.h included, unused", "#include \"vmath.h\"\n"},
        };
        for (int v = 0; v < 2; v++) {
            double pt[7];
            for (int r = 0; r < 7; r++) {
                char src[1024];
                snprintf(src, sizeof src,
                         "// %d.%d\n%sextern \"C\" __global__ void k(const float *x, float *y, long long n) {\n"
                         "  for (long long i = blockIdx.x * 128LL + threadIdx.x; i < n; i += (long long)gridDim.x * 128)\n"
                         "    y[i] = x[i] * 2.0f + 1.0f;\n}\n",
                         v, r, parts[v][1]);
                ku_cubin c;
                CHECK(ku_nvrtc_compile(OP, src, "part.cu", cc, &c));
                pt[r] = c.compile_ms;
                ku_cubin_free(&c);
            }
            kb_stats ps = kb_summarize(pt, 7);
            printf("NVRTC cold compile, CUBIN sm_%d, %s: median %.1f ms (q1 %.1f, q3 %.1f)\n", cc, parts[v][0],
                   ps.median, ps.q1, ps.q3);
        }
    } else {
        printf("NVRTC: %s\n", kl_last_error());
        kl_clear_error();
    }
    return 0;
}
