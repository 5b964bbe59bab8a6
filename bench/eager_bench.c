/*
 * eager_bench.c — the eager-core speed targets of bench/RESULTS.md, measured
 * side by side in one run with the machine's own limits (STREAM copy/add on
 * 64 MiB arrays and a direct cblas_sgemm), since this machine is shared and
 * noisy. Method (shared/WORKLOADS.md): warm-up, then at least 10 repetitions
 * and 0.5 s, median and interquartile range.
 *
 *   build/bench/eager_bench [threads]
 */
#include "kiln.h"

#include "bench_util.h"
#include "threadpool.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


typedef kb_stats stats;

/* Times fn(ctx) (each call inside its own scope) until 10 reps and 0.5 s. */
static stats timeit(void (*fn)(void *), void *ctx) {
    enum { MAXR = 2000 };
    static double t[MAXR];
    for (int w = 0; w < 3; w++) {
        kl_scope_begin();
        fn(ctx);
        kl_scope_end();
    }
    int n = 0;
    double start = kb_now_s();
    while (n < MAXR && (n < 10 || kb_now_s() - start < 0.5)) {
        kl_scope_begin();
        double s = kb_now_s();
        fn(ctx);
        t[n++] = kb_now_s() - s;
        kl_scope_end();
    }
    return kb_summarize(t, n);
}

/* ---- machine limits ------------------------------------------------------ */

typedef struct stream_ctx {
    float *a, *b, *c;
    int add;
} stream_ctx;

static void stream_range(void *ctx_, int64_t b, int64_t e) {
    stream_ctx *s = ctx_;
    if (s->add)
        for (int64_t i = b; i < e; i++) s->c[i] = s->a[i] + s->b[i];
    else
        for (int64_t i = b; i < e; i++) s->c[i] = s->a[i];
}

static stream_ctx sc;
static int64_t stream_n;
static void stream_fn(void *ctx) {
    (void)ctx;
    ke_parallel_for(stream_n, 1 << 16, stream_range, &sc);
}

typedef struct gemm_ctx {
    int n;
    float *a, *b, *c;
} gemm_ctx;
static void sgemm_fn(void *ctx) {
    gemm_ctx *g = ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f,
                g->c, g->n);
}

/* ---- Kiln ops ---------------------------------------------------------------- */

typedef struct op_ctx {
    kl_tensor *x, *y, *w, *b;
} op_ctx;
static void add_fn(void *c) { kl_add(((op_ctx *)c)->x, ((op_ctx *)c)->y); }
static void mul_fn(void *c) { kl_mul(((op_ctx *)c)->x, ((op_ctx *)c)->y); }
static void exp_fn(void *c) { kl_exp(((op_ctx *)c)->x); }
static void mm_fn(void *c) { kl_matmul(((op_ctx *)c)->x, ((op_ctx *)c)->y); }
static void softmax_fn(void *c) { kl_softmax(((op_ctx *)c)->x, -1); }
static void layernorm_fn(void *c) {
    op_ctx *o = c;
    kl_layer_norm(o->x, 1, o->w, o->b, 1e-5);
}
static void add1_fn(void *c) {
    op_ctx *o = c;
    for (int i = 0; i < 1000; i++) kl_add(o->x, o->y);
}

static void report(const char *name, stats s, double bytes, double ref_gbs, const char *ref_name) {
    double gbs = bytes / s.median / 1e9;
    printf("%-34s %9.3f ms  [%8.3f, %8.3f]  %7.1f GB/s  %5.0f%% of %s\n", name, s.median * 1e3, s.q1 * 1e3,
           s.q3 * 1e3, gbs, 100 * gbs / ref_gbs, ref_name);
}

int main(int argc, char **argv) {
    if (argc > 1) kl_set_num_threads(atoi(argv[1]));
    int nt = kl_get_num_threads();
    openblas_set_num_threads(nt); /* the direct sgemm uses as many threads as Kiln */
    printf("eager_bench: %d threads, Kiln %s\n\n", nt, kl_version());

    /* STREAM on 64 MiB arrays */
    stream_n = 16 << 20;
    sc.a = aligned_alloc(64, (size_t)stream_n * 4);
    sc.b = aligned_alloc(64, (size_t)stream_n * 4);
    sc.c = aligned_alloc(64, (size_t)stream_n * 4);
    for (int64_t i = 0; i < stream_n; i++) sc.a[i] = 1, sc.b[i] = 2, sc.c[i] = 0;
    sc.add = 0;
    stats copy = timeit(stream_fn, NULL);
    sc.add = 1;
    stats add = timeit(stream_fn, NULL);
    double copy_gbs = 8.0 * stream_n / copy.median / 1e9, add_gbs = 12.0 * stream_n / add.median / 1e9;
    printf("%-34s %9.3f ms  %7.1f GB/s\n", "STREAM copy 64 MiB", copy.median * 1e3, copy_gbs);
    printf("%-34s %9.3f ms  %7.1f GB/s\n", "STREAM add 64 MiB", add.median * 1e3, add_gbs);
    free(sc.a), free(sc.b), free(sc.c);

    gemm_ctx g = {1024, aligned_alloc(64, 4 << 20), aligned_alloc(64, 4 << 20), aligned_alloc(64, 4 << 20)};
    for (int i = 0; i < 1024 * 1024; i++) g.a[i] = (float)(i % 7) * 0.1f, g.b[i] = (float)(i % 5) * 0.1f;
    stats sg = timeit(sgemm_fn, &g);
    double sg_gflops = 2.0 * 1024 * 1024 * 1024 / sg.median / 1e9;
    printf("%-34s %9.3f ms  %7.1f GFLOP/s\n\n", "cblas_sgemm 1024^3", sg.median * 1e3, sg_gflops);

    kl_manual_seed(0);
    op_ctx o = {0};
    /* dispatch overhead: 1-element add, result in a scope */
    o.x = kl_retain(kl_randn(KL_SHAPE(1), KL_F32));
    o.y = kl_retain(kl_randn(KL_SHAPE(1), KL_F32));
    stats s1 = timeit(add1_fn, &o);
    printf("%-34s %9.1f ns per call  [%.1f, %.1f]\n", "kl_add 1 element (in a scope)", s1.median * 1e6,
           s1.q1 * 1e6, s1.q3 * 1e6);
    kl_release(o.x), kl_release(o.y);

    int64_t N = 1 << 24;
    o.x = kl_retain(kl_randn(KL_SHAPE(N), KL_F32));
    o.y = kl_retain(kl_randn(KL_SHAPE(N), KL_F32));
    report("kl_add 2^24 f32", timeit(add_fn, &o), 12.0 * N, add_gbs, "STREAM add");
    report("kl_mul 2^24 f32", timeit(mul_fn, &o), 12.0 * N, add_gbs, "STREAM add");
    report("kl_exp 2^24 f32", timeit(exp_fn, &o), 8.0 * N, copy_gbs, "STREAM copy");
    kl_release(o.x), kl_release(o.y);

    o.x = kl_retain(kl_from_data(g.a, KL_SHAPE(1024, 1024), KL_F32));
    o.y = kl_retain(kl_from_data(g.b, KL_SHAPE(1024, 1024), KL_F32));
    stats smm = timeit(mm_fn, &o);
    double mm_gflops = 2.0 * 1024 * 1024 * 1024 / smm.median / 1e9;
    printf("%-34s %9.3f ms  [%8.3f, %8.3f]  %7.1f GFLOP/s  %5.0f%% of cblas_sgemm\n", "kl_matmul 1024^3 f32",
           smm.median * 1e3, smm.q1 * 1e3, smm.q3 * 1e3, mm_gflops, 100 * mm_gflops / sg_gflops);
    kl_release(o.x), kl_release(o.y);
    free(g.a), free(g.b), free(g.c);

    const int64_t shapes[2][2] = {{4096, 1024}, {256, 4096}};
    for (int k = 0; k < 2; k++) {
        int64_t R = shapes[k][0], C = shapes[k][1];
        char name[64];
        o.x = kl_retain(kl_randn(KL_SHAPE(R, C), KL_F32));
        o.w = kl_retain(kl_randn(KL_SHAPE(C), KL_F32));
        o.b = kl_retain(kl_randn(KL_SHAPE(C), KL_F32));
        snprintf(name, sizeof name, "kl_softmax [%lld,%lld]", (long long)R, (long long)C);
        report(name, timeit(softmax_fn, &o), 8.0 * R * C, copy_gbs, "STREAM copy");
        snprintf(name, sizeof name, "kl_layer_norm [%lld,%lld]", (long long)R, (long long)C);
        report(name, timeit(layernorm_fn, &o), 8.0 * R * C + 8.0 * C, copy_gbs, "STREAM copy");
        kl_release(o.x), kl_release(o.w), kl_release(o.b);
    }
    if (kl_last_status() != KL_OK) {
        fprintf(stderr, "error: %s\n", kl_last_error());
        return 1;
    }
    return 0;
}
