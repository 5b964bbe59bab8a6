/*
 * cuda_emu_bench.c — what a launch costs on the emulated device (docs/GPU.md,
 * "Running kernels on the emulated device"): an elementwise grid-stride
 * kernel (plain calls, no fibers) and a shared-memory block reduction
 * (KL_EMU_EXPORT_SYNC: one fiber per CUDA thread), each on 1 element and on
 * 2^20. The emulator is for correctness: these numbers say how long tests
 * take, nothing about a GPU. Never run by meson test. Each launch is timed
 * by the wall clock and by the thread's CPU clock (which a loaded machine
 * inflates much less: the launch runs on the calling thread).
 *
 *     cuda_emu_bench [case [reps]]   # case: all (default), ew1, ew20, red1, red20
 *     valgrind --tool=callgrind --toggle-collect=ku_launch build/bench/cuda_emu_bench ew1 10
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/codegen_nvrtc/cuda_api.h"
#include "bench_util.h"
#include "kiln.h"

static const char *OP = "cuda_emu_bench";

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char src[] =
    "#include \"kiln_cuda.h\"\n"
    "extern \"C\" __global__ void ew(float *y, const float *x, unsigned long long n) {\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x)\n"
    "    y[i] = x[i] * 2.0f + 1.0f;\n"
    "}\n"
    "KL_EMU_EXPORT(ew)\n"
    "extern \"C\" __global__ void block_sum(const float *x, float *out, unsigned long long n) {\n"
    "  __shared__ float buf[256];\n"
    "  unsigned long long i = blockIdx.x * 256ull + threadIdx.x;\n"
    "  buf[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
    "  __syncthreads();\n"
    "  for (unsigned s = 128; s > 0; s >>= 1) {\n"
    "    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(block_sum)\n";

#define CHECK(x)                                                      \
    do {                                                              \
        if (x) {                                                      \
            fprintf(stderr, "cuda_emu_bench: %s\n", kl_last_error()); \
            exit(1);                                                  \
        }                                                             \
    } while (0)

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "all";
    int reps = argc > 2 ? atoi(argv[2]) : 0;
    setenv("KL_CUDA_EMULATE", "1", 1);
    if (!kl_cuda_is_available()) {
        printf("cuda_emu_bench: %s\n", kl_cuda_unavailable_reason());
        return 1;
    }
    const ku_driver *d = ku_driver_get(OP);
    size_t big = (size_t)1 << 20;
    float *h = malloc(big * sizeof *h);
    for (size_t i = 0; i < big; i++) h[i] = (float)(i % 1000) * 0.25f;
    CUdeviceptr x = ku_malloc(OP, 0, big * 4, NULL), y = ku_malloc(OP, 0, big * 4, NULL);
    CHECK(!x || !y);
    CHECK(KU_CALL(OP, d, MemcpyHtoD, x, h, big * 4));
    ku_module *m;
    double t0 = kb_now_s();
    CHECK(ku_module_get(OP, src, 0, &m));
    printf("module load (compile or disk cache): %.1f ms\n", 1e3 * (kb_now_s() - t0));
    CUfunction ew, red;
    CHECK(ku_module_function(OP, m, "ew", &ew));
    CHECK(ku_module_function(OP, m, "block_sum", &red));
    struct {
        const char *name, *what;
        CUfunction *f;
        unsigned long long n;
        unsigned grid, block;
        int reps;
    } cases[] = {
        {"ew1", "elementwise, 1 element (1 block of 128)", &ew, 1, 1, 128, 2000},
        {"ew20", "elementwise, 2^20 elements (1024 blocks of 128, grid-stride)", &ew, big, 1024, 128, 20},
        {"red1", "block reduction (fibers), 1 element (1 block of 256)", &red, 1, 1, 256, 200},
        {"red20", "block reduction (fibers), 2^20 elements (4096 blocks of 256)", &red, big, 4096, 256, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (strcmp(which, "all") && strcmp(which, cases[c].name)) continue;
        int r = reps > 0 ? reps : cases[c].reps;
        void *args[] = {cases[c].f == &ew ? (void *)&y : (void *)&x, cases[c].f == &ew ? (void *)&x : (void *)&y,
                        &cases[c].n};
        const unsigned g[3] = {cases[c].grid, 1, 1}, b[3] = {cases[c].block, 1, 1};
        double *t = malloc((size_t)r * sizeof *t), *tc = malloc((size_t)r * sizeof *tc);
        for (int i = 0; i < r; i++) {
            double s = kb_now_s(), sc = cpu_s();
            CHECK(ku_launch(OP, *cases[c].f, g, b, 0, NULL, args));
            tc[i] = cpu_s() - sc;
            t[i] = kb_now_s() - s;
        }
        kb_stats st = kb_summarize(t, r), sc = kb_summarize(tc, r);
        printf("%-6s %-62s median wall %12.1f us (q1 %.1f, q3 %.1f), cpu %12.1f us; %d launches\n", cases[c].name,
               cases[c].what, 1e6 * st.median, 1e6 * st.q1, 1e6 * st.q3, 1e6 * sc.median, r);
        free(t);
        free(tc);
    }
    ku_free(OP, x);
    ku_free(OP, y);
    free(h);
    return 0;
}
