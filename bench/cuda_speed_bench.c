/*
 * cuda_speed_bench.c — issue 13's speed targets on a real GPU, each a ratio
 * measured in this one process (bench/RESULTS.md, "GPU: speed"):
 *
 *   copy       cuMemcpyDtoDAsync of 2^26 f32: the bandwidth every
 *              memory-bound kernel is compared with (bytes read + written)
 *   fused      compiled x*2+1 (streaming only), chain5 and GELU at 2^26 f32:
 *              GB/s as a fraction of the copy's; eager CUDA for the last two
 *              (compiled / eager speedup)
 *   rows       softmax, log_softmax, layer_norm, rms_norm over [4096, 4096]
 *              f32, eager op and compiled: time against the floor 2 * 64 MiB
 *              / copy bandwidth; softmax and layer_norm also over rows on
 *              either side of the register cache's limit (4096) and short
 *              rows, with the eager block size
 *   matmul     kl_matmul [4096,4096] @ [4096,4096] f32 (TF32 off, then on)
 *              against ku_gemm, Kiln's one cuBLAS call, on the same buffers
 *   launch     eager kl_add of two 1-element CUDA tensors: host time per call
 *              over 20000 calls in scopes of 100, then one synchronize
 *
 * Every time is the median of >= 15 timed repetitions after warm-up, each
 * repetition `reps` calls enqueued back to back and closed by
 * kl_cuda_synchronize (launch latency is thus hidden except in "launch").
 * Without a GPU it says so and exits 0; never run by meson test.
 *
 *     cuda_speed_bench [--fast]     # one line per measurement
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/codegen_nvrtc/cn.h"
#include "../src/codegen_nvrtc/cuda_api.h"
#include "bench_util.h"
#include "workloads.h"
#include "kiln.h"
#include "kiln/cuda.h"

static const char *OP = "cuda_speed_bench";
#define CUDA0 ((kl_device){KL_CUDA, 0})
#define N26 ((int64_t)1 << 26)

#define DIE_IF(x)                                                          \
    do {                                                                   \
        if (x) {                                                           \
            fprintf(stderr, "%s: %s (line %d)\n", OP, kl_last_error(), __LINE__); \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

/* ---- the functions ------------------------------------------------------------------ */

static int axpb(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(kl_mul_scalar(in[0], 2), 1);
    return out[0] ? 0 : -1;
}
/* WORKLOADS.md's chain5 and gelu, defined once in src/bench/workloads.c */
static int chain5(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    return kw_find("chain5")->fn(u, in, n_in, out, n_out);
}
static int gelu(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    return kw_find("gelu")->fn(u, in, n_in, out, n_out);
}
static int softmax_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}
static int layer_norm_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    return out[0] ? 0 : -1;
}
static int log_softmax_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_log_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}
static int rms_norm_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_rms_norm(in[0], 1, in[1], 1e-6);
    return out[0] ? 0 : -1;
}

/* ---- timing --------------------------------------------------------------------------- */

typedef struct run {
    kl_traceable fn;
    kl_fn *compiled; /* NULL: call fn eagerly */
    kl_tensor **in;
    int n_in;
} run;

static void call_once(const run *r) {
    kl_tensor *out = NULL;
    kl_scope_begin();
    if (r->compiled) DIE_IF(kl_fn_call(r->compiled, r->in, r->n_in, &out, 1));
    else DIE_IF(r->fn(NULL, r->in, r->n_in, &out, 1));
    kl_scope_end(); /* the output is the scope's */
}

/* Median seconds per call: 15 repetitions of `reps` calls, synchronized. */
static kb_stats time_calls(const run *r, int reps) {
    for (int w = 0; w < 3; w++) call_once(r);
    DIE_IF(kl_cuda_synchronize(0));
    double t[15];
    for (int i = 0; i < 15; i++) {
        double t0 = kb_now_s();
        for (int j = 0; j < reps; j++) call_once(r);
        DIE_IF(kl_cuda_synchronize(0));
        t[i] = (kb_now_s() - t0) / reps;
    }
    return kb_summarize(t, 15);
}

static double copy_gbs(void) {
    const ku_driver *d = ku_driver_get(OP);
    DIE_IF(!d);
    size_t bytes = (size_t)N26 * sizeof(float);
    kl_tensor *a = kl_to_device(kl_zeros(1, (int64_t[]){N26}, KL_F32), CUDA0), *b = kl_empty_on(1, (int64_t[]){N26}, KL_F32, CUDA0);
    DIE_IF(!a || !b);
    CUstream st = ku_current_stream(0);
    double t[21];
    for (int i = 0; i < 24; i++) {
        double t0 = kb_now_s();
        DIE_IF(KU_CALL(OP, d, MemcpyDtoDAsync, (CUdeviceptr)kl_data_ptr(b), (CUdeviceptr)kl_data_ptr(a), bytes, st));
        DIE_IF(kl_cuda_synchronize(0));
        if (i >= 3) t[i - 3] = kb_now_s() - t0;
    }
    kb_stats s = kb_summarize(t, 21);
    double gbs = 2.0 * (double)bytes / s.median / 1e9;
    printf("copy      cuMemcpyDtoDAsync 2^26 f32: %.1f us = %.0f GB/s read+write\n", s.median * 1e6, gbs);
    return gbs;
}

static kl_fn *compile_fn(kl_traceable fn) {
    kl_fn *f = kl_compile(fn, NULL, NULL);
    DIE_IF(!f);
    return f;
}

static void fused(double copy, kl_tensor *x) {
    static const struct {
        const char *name;
        kl_traceable fn;
        int eager;
    } fns[] = {{"x*2+1", axpb, 0}, {"chain5", chain5, 1}, {"gelu", gelu, 1}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        run c = {fns[i].fn, compile_fn(fns[i].fn), &x, 1};
        kb_stats sc = time_calls(&c, 10);
        double gbs = 8.0 * (double)N26 / sc.median / 1e9;
        printf("fused     %-7s 2^26 f32 compiled: %.1f us (q1 %.1f, q3 %.1f) = %.0f GB/s = %.0f%% of copy", fns[i].name,
               sc.median * 1e6, sc.q1 * 1e6, sc.q3 * 1e6, gbs, 100 * gbs / copy);
        if (fns[i].eager) {
            run e = {fns[i].fn, NULL, &x, 1};
            kb_stats se = time_calls(&e, 10);
            printf("; eager %.1f us: compiled %.2fx eager", se.median * 1e6, se.median / sc.median);
        }
        printf("\n");
        kl_fn_release(c.compiled);
    }
}

/* softmax, log_softmax, layer_norm and rms_norm over [R, C] f32: the
 * target shape [4096, 4096] (issue 13: within 1.2x of the floor), then row
 * lengths on either side of the register cache's limit (cn.h: rows of up
 * to CN_ROW_KR_MAX * CN_ROW_MAX_THREADS elements are read once; longer ones
 * take one strided pass per reduction) and short rows, each line naming the
 * block size the eager kernel launches with and whether the row is cached. */
static void rows(double copy) {
    static const int64_t shapes[][2] = {{4096, 4096}, {16384, 1024}, {65536, 256}, {2048, 8192}, {4096, 4097}};
    static const struct {
        const char *name;
        kl_traceable fn;
        int n_in;
    } fns[] = {{"softmax", softmax_fn, 1}, {"log_softmax", log_softmax_fn, 1}, {"layer_norm", layer_norm_fn, 3},
               {"rms_norm", rms_norm_fn, 2}};
    const int64_t limit = (int64_t)CN_ROW_KR_MAX * CN_ROW_MAX_THREADS;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t R = shapes[s][0], C = shapes[s][1];
        kl_scope_begin();
        kl_manual_seed(1);
        kl_tensor *x = kl_to_device(kl_randn(2, (int64_t[]){R, C}, KL_F32), CUDA0);
        kl_tensor *w = kl_to_device(kl_randn(1, (int64_t[]){C}, KL_F32), CUDA0);
        kl_tensor *b = kl_to_device(kl_randn(1, (int64_t[]){C}, KL_F32), CUDA0);
        DIE_IF(!x || !w || !b);
        double floor_us = 2.0 * (double)(R * C * 4) / (copy * 1e9) * 1e6;
        kl_tensor *in[3] = {x, w, b};
        for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
            /* the [4096, 4096] target for every op; the other shapes for softmax and layer_norm */
            if (s && (fns[i].fn == log_softmax_fn || fns[i].fn == rms_norm_fn)) continue;
            run e = {fns[i].fn, NULL, in, fns[i].n_in}, c = {fns[i].fn, compile_fn(fns[i].fn), in, fns[i].n_in};
            kb_stats se = time_calls(&e, 10), sc = time_calls(&c, 10);
            printf("rows      %-11s [%lld,%lld] f32: eager %.1f us (%.2fx the floor), compiled %.1f us (%.2fx the floor); "
                   "floor %.1f us; eager block %u threads, row %s\n",
                   fns[i].name, (long long)R, (long long)C, se.median * 1e6, se.median * 1e6 / floor_us,
                   sc.median * 1e6, sc.median * 1e6 / floor_us, floor_us, cn_row_threads(C, CN_ROW_KR_MAX),
                   C <= limit ? "in registers (read once)" : "re-read per pass (past the cache limit)");
            kl_fn_release(c.compiled);
        }
        kl_scope_end();
    }
}

static void matmul(void) {
    const int64_t n = 4096;
    kl_manual_seed(2);
    kl_tensor *a = kl_to_device(kl_randn(2, (int64_t[]){n, n}, KL_F32), CUDA0);
    kl_tensor *b = kl_to_device(kl_randn(2, (int64_t[]){n, n}, KL_F32), CUDA0);
    kl_tensor *c = kl_empty_on(2, (int64_t[]){n, n}, KL_F32, CUDA0);
    DIE_IF(!a || !b || !c);
    for (int tf32 = 0; tf32 < 2; tf32++) {
        kl_cuda_set_allow_tf32(tf32);
        double tk[15], tg[15];
        /* alternate the two, so clocks and heat treat them alike */
        for (int i = -2; i < 15; i++) {
            double t0 = kb_now_s();
            for (int j = 0; j < 5; j++) {
                kl_scope_begin();
                DIE_IF(!kl_matmul(a, b));
                kl_scope_end();
            }
            DIE_IF(kl_cuda_synchronize(0));
            double t1 = kb_now_s();
            for (int j = 0; j < 5; j++) {
                ku_matrix ma = {(CUdeviceptr)kl_data_ptr(a), n, 1, 0}, mb = {(CUdeviceptr)kl_data_ptr(b), n, 1, 0},
                          mc = {(CUdeviceptr)kl_data_ptr(c), n, 1, 0};
                DIE_IF(ku_gemm(OP, 0, KL_F32, 1, n, n, n, 1.0, ma, mb, 0.0, mc, ku_current_stream(0)));
            }
            DIE_IF(kl_cuda_synchronize(0));
            if (i >= 0) tk[i] = (t1 - t0) / 5, tg[i] = (kb_now_s() - t1) / 5;
        }
        kb_stats sk = kb_summarize(tk, 15), sg = kb_summarize(tg, 15);
        double flop = 2.0 * (double)n * n * n;
        printf("matmul    [4096,4096]^2 f32, TF32 %s: kl_matmul %.3f ms (%.1f TFLOP/s), ku_gemm %.3f ms (%.1f TFLOP/s): "
               "kl_matmul / gemm = %.3f\n",
               tf32 ? "on " : "off", sk.median * 1e3, flop / sk.median / 1e12, sg.median * 1e3, flop / sg.median / 1e12,
               sk.median / sg.median);
    }
    kl_cuda_set_allow_tf32(false);
}

static void launch(void) {
    kl_tensor *x = kl_to_device(kl_ones(1, (int64_t[]){1}, KL_F32), CUDA0);
    kl_tensor *y = kl_to_device(kl_ones(1, (int64_t[]){1}, KL_F32), CUDA0);
    DIE_IF(!x || !y);
    double t[15];
    for (int i = -1; i < 15; i++) {
        double t0 = kb_now_s();
        for (int blk = 0; blk < 200; blk++) {
            kl_scope_begin();
            for (int j = 0; j < 100; j++) DIE_IF(!kl_add(x, y));
            kl_scope_end();
        }
        double t1 = kb_now_s();
        DIE_IF(kl_cuda_synchronize(0));
        if (i >= 0) t[i] = (t1 - t0) / 20000;
    }
    kb_stats s = kb_summarize(t, 15);
    printf("launch    eager kl_add, 1-element CUDA tensors: %.2f us per call from C (q1 %.2f, q3 %.2f), host time "
           "before the final synchronize\n",
           s.median * 1e6, s.q1 * 1e6, s.q3 * 1e6);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    if (!kl_cuda_is_available() || getenv("KL_CUDA_EMULATE")) {
        printf("%s: no GPU: %s\n", OP, kl_cuda_is_available() ? "the emulated device has no timing" : kl_cuda_unavailable_reason());
        return 0;
    }
    char name[256] = "?";
    kl_cuda_device_name(0, name, sizeof name);
    printf("device: %s, sm_%d\n", name, kl_cuda_compute_capability(0));
    /* each part's tensors are its scope's */
    kl_scope_begin();
    double copy = copy_gbs();
    kl_scope_end();
    kl_scope_begin();
    kl_manual_seed(3);
    kl_tensor *x = kl_to_device(kl_randn(1, (int64_t[]){N26}, KL_F32), CUDA0);
    DIE_IF(!x);
    fused(copy, x);
    kl_scope_end();
    kl_scope_begin();
    rows(copy);
    kl_scope_end();
    kl_scope_begin();
    matmul();
    kl_scope_end();
    kl_scope_begin();
    launch();
    kl_scope_end();
    return 0;
}
