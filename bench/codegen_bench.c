/*
 * codegen_bench.c — compiled-code speed (issue 5) on the workloads of
 * shared/WORKLOADS.md, written with primitive ops: chain5 and gelu at 2^16,
 * 2^20, 2^24; softmax and layernorm at [4096,1024] and [256,4096]; xent
 * [4096,1000]; mlp 256x1024 -> 4096 -> 1024; adamw over 10M parameters in
 * place. Each workload runs as Kiln eager, Kiln compiled (kl_compile FUSE,
 * the default backend; the first call's time reported apart), Kiln compiled
 * on the interpreter backend (when kl_compile_options has a `backend` field,
 * detected by bench/meson.build), and the hand-written fused C loop of
 * bench/fused_ref.c; STREAM copy/add on 64 MiB arrays and cblas_sgemm 1024^3
 * are measured in the same run. Before timing, compiled and eager results (and
 * the fused loop's) are compared once (rtol 1e-3, atol 1e-4) on copies of the
 * inputs. The first call of a compiled function is reported apart, twice: cold,
 * and again from a second kl_compile ("kiln_again": the kernels come from the
 * disk cache when the backend has one).
 *
 * Method (shared/WORKLOADS.md): warm-up, then at least 10 repetitions and
 * 0.5 s, median and interquartile range. The output is one line per result,
 * machine-readable (bench/run_codegen_bench.sh joins it with
 * bench/torch_codegen.py's lines into the tables of bench/RESULTS.md):
 *
 *   RES <workload> <size> <system> <median ms> <q1 ms> <q3 ms> <floor bytes> <flops>
 *   FIRST <workload> <size> <system> <first-call ms> <compile_ms> <kernels> <check>
 *   LIMIT stream_copy|stream_add|sgemm <median ms> <GB/s or GFLOP/s>
 *
 *   build/bench/codegen_bench [threads] [filter ...]
 *
 * A filter keeps the workloads whose "id/size" contains it (chain5, gelu/1048576,
 * softmax/256x4096). KB_QUICK=1 cuts the method to 3 repetitions and 0.05 s
 * for development runs (not for numbers that get reported).
 */
#include "kiln.h"

#include "bench_util.h"
#include "fused_ref.h"
#include "threadpool.h"
#include "workloads.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KB_HAVE_BACKEND
#define KB_HAVE_BACKEND 0
#endif

static int min_reps = 10;
static double min_time = 0.5;

/* Times fn(ctx) (each call inside its own scope: temporaries are freed as in
 * a real step) after 3 warm-up calls, until min_reps and min_time. */
static kb_stats timeit(void (*fn)(void *), void *ctx) {
    enum { MAXR = 4000 };
    static double t[MAXR];
    for (int w = 0; w < 3; w++) {
        kl_scope_begin();
        fn(ctx);
        kl_scope_end();
    }
    int n = 0;
    double start = kb_now_s();
    while (n < MAXR && (n < min_reps || kb_now_s() - start < min_time)) {
        kl_scope_begin();
        double s = kb_now_s();
        fn(ctx);
        t[n++] = kb_now_s() - s;
        kl_scope_end();
    }
    return kb_summarize(t, n);
}

/* ---- the workloads: WORKLOADS.md's, defined once in src/bench/workloads.c --- */

static kl_traceable wfn(const char *id) {
    const kw_def *d = kw_find(id);
    if (!d) {
        fprintf(stderr, "codegen_bench: %s\n", kl_last_error());
        exit(1);
    }
    return d->fn;
}

/* ---- one workload instance ------------------------------------------------ */

typedef struct wl {
    const char *id;
    char size[32];
    kl_traceable fn;
    int n_in;
    kl_tensor *in[5];
    double bytes, flops;
    int64_t a, b, c, d; /* sizes for the fused reference */
    float *scratch, *scratch2;
    volatile float loss; /* fr_xent's result */
    kl_fn *f;
} wl;

static const char *sys_name;

static void run_eager(void *c) {
    wl *w = c;
    kl_tensor *y;
    if (w->fn(NULL, w->in, w->n_in, &y, 1) != 0) {
        fprintf(stderr, "codegen_bench: %s eager: %s\n", w->id, kl_last_error());
        exit(1);
    }
}

static void run_compiled(void *c) {
    wl *w = c;
    kl_tensor *y;
    if (kl_fn_call(w->f, w->in, w->n_in, &y, 1) != 0) {
        fprintf(stderr, "codegen_bench: %s %s: %s\n", w->id, sys_name, kl_last_error());
        exit(1);
    }
}

static float *fptr(kl_tensor *t) { return kl_data_ptr(t); }

static void run_fused(void *c) {
    wl *w = c;
    if (!strcmp(w->id, "chain5")) {
        fr_chain5(fptr(w->in[0]), w->scratch, w->a);
    } else if (!strcmp(w->id, "gelu")) {
        fr_gelu(fptr(w->in[0]), w->scratch, w->a);
    } else if (!strcmp(w->id, "softmax")) {
        fr_softmax(fptr(w->in[0]), w->scratch, w->a, w->b);
    } else if (!strcmp(w->id, "layernorm")) {
        fr_layernorm(fptr(w->in[0]), fptr(w->in[1]), fptr(w->in[2]), w->scratch, w->a, w->b);
    } else if (!strcmp(w->id, "xent")) {
        w->loss = fr_xent(fptr(w->in[0]), kl_data_ptr(w->in[1]), w->scratch, w->a, w->b);
    } else if (!strcmp(w->id, "mlp")) {
        fr_mlp(fptr(w->in[0]), fptr(w->in[1]), fptr(w->in[2]), fptr(w->in[3]), fptr(w->in[4]), w->scratch,
               w->scratch2, w->a, w->b, w->c, w->d);
    } else if (!strcmp(w->id, "adamw")) {
        const double bc1 = 1 - pow(KW_ADAM_B1, KW_ADAM_T), bc2 = 1 - pow(KW_ADAM_B2, KW_ADAM_T);
        fr_adamw_consts k = {(float)(1 - KW_ADAM_LR * KW_ADAM_WD), (float)KW_ADAM_B1, (float)(1 - KW_ADAM_B1), (float)KW_ADAM_B2,
                             (float)(1 - KW_ADAM_B2), (float)bc2, (float)KW_ADAM_EPS, (float)(KW_ADAM_LR / bc1)};
        fr_adamw(fptr(w->in[0]), fptr(w->in[1]), fptr(w->in[2]), fptr(w->in[3]), w->a, &k);
    }
}

static void res(const wl *w, const char *sys, kb_stats s) {
    printf("RES %-9s %-10s %-13s %10.4f %10.4f %10.4f %.6g %.6g\n", w->id, w->size, sys, s.median * 1e3, s.q1 * 1e3,
           s.q3 * 1e3, w->bytes, w->flops);
    fflush(stdout);
}

/* First call of a fresh kl_compile of w->fn on copies of the inputs (in-place
 * workloads mutate them), checked against eager; prints a FIRST line. */
static void first_call(wl *w, const char *sys, const kl_compile_options *o) {
    kl_fn *f = kl_compile(w->fn, NULL, o);
    kl_scope_begin();
    kl_tensor *a[5], *b[5], *ya, *yb;
    for (int i = 0; i < w->n_in; i++) a[i] = kl_clone(w->in[i]), b[i] = kl_clone(w->in[i]);
    if (w->fn(NULL, a, w->n_in, &ya, 1) != 0) {
        fprintf(stderr, "codegen_bench: %s eager: %s\n", w->id, kl_last_error());
        exit(1);
    }
    double t0 = kb_now_s();
    int rc = kl_fn_call(f, b, w->n_in, &yb, 1);
    double first = (kb_now_s() - t0) * 1e3;
    if (rc != 0) {
        fprintf(stderr, "codegen_bench: %s %s: %s\n", w->id, sys, kl_last_error());
        exit(1);
    }
    int ok = kl_allclose(yb, ya, 1e-3, 1e-4, true) == 1;
    for (int i = 0; i < w->n_in; i++) ok = ok && kl_allclose(b[i], a[i], 1e-3, 1e-4, true) == 1;
    kl_scope_end();
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    printf("FIRST %-9s %-10s %-13s %10.3f %10.3f %lld %s\n", w->id, w->size, sys, first, st.compile_ms,
           (long long)st.kernels, ok ? "ok" : "MISMATCH");
    kl_fn_release(f);
}

/* Compiles w->fn with the given backend (NULL: default): the first call
 * (cold: run_codegen_bench.sh gives each run an empty KL_CACHE_DIR), then for
 * the default backend a second fresh kl_compile's first call (the kernels now
 * come from the disk cache where there is one), then the cached calls timed. */
static void bench_compiled(wl *w, const char *sys, const char *backend) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* FIRST lines time the compile a first call makes */
    o.mode = KL_COMPILE_FUSE;
    o.name = w->id;
#if KB_HAVE_BACKEND
    o.backend = backend;
#else
    (void)backend;
#endif
    sys_name = sys;
    first_call(w, sys, &o);
    if (!backend) first_call(w, "kiln_again", &o);
    w->f = kl_compile(w->fn, NULL, &o);
    res(w, sys, timeit(run_compiled, w));
    kl_fn_stats st;
    kl_fn_get_stats(w->f, &st);
    if (st.eager_calls || st.traces != 1)
        printf("NOTE %s %s %s: %lld traces, %lld eager calls (%s)\n", w->id, w->size, sys, (long long)st.traces,
               (long long)st.eager_calls, st.last_reason);
    kl_fn_release(w->f);
    w->f = NULL;
}

static int nfilters;
static char **filters;

static int selected(const wl *w) {
    if (!nfilters) return 1;
    char key[64];
    snprintf(key, sizeof key, "%s/%s", w->id, w->size);
    for (int i = 0; i < nfilters; i++)
        if (strstr(key, filters[i])) return 1;
    return 0;
}

/* Runs the fused loop once on copies of the inputs and compares its result
 * with eager's (rtol 1e-3, atol 1e-4): the reference must compute the same thing. */
static void check_fused(wl *w) {
    kl_scope_begin();
    kl_tensor *a[5], *y, *ref;
    wl c = *w;
    for (int i = 0; i < w->n_in; i++) a[i] = kl_clone(w->in[i]), c.in[i] = kl_clone(w->in[i]);
    if (w->fn(NULL, a, w->n_in, &y, 1) != 0) exit(1);
    run_fused(&c);
    if (!strcmp(w->id, "xent"))
        ref = kl_scalar_tensor(c.loss, KL_F32);
    else if (!strcmp(w->id, "adamw"))
        ref = c.in[0];
    else
        ref = kl_from_data(!strcmp(w->id, "mlp") ? c.scratch2 : c.scratch, kl_ndim(y), kl_shape(y), KL_F32);
    int ok = kl_allclose(ref, y, 1e-3, 1e-4, true) == 1;
    for (int i = 0; i < w->n_in && ok; i++) ok = kl_allclose(c.in[i], a[i], 1e-3, 1e-4, true) == 1;
    printf("FIRST %-9s %-10s %-13s %10.3f %10.3f %d %s\n", w->id, w->size, "fused_c", 0.0, 0.0, 1,
           ok ? "ok" : "MISMATCH");
    kl_scope_end();
}

static void bench(wl *w) {
    res(w, "kiln_eager", timeit(run_eager, w));
    bench_compiled(w, "kiln_compiled", NULL);
    if (KB_HAVE_BACKEND) bench_compiled(w, "kiln_interp", "interp");
    check_fused(w);
    res(w, "fused_c", timeit(run_fused, w));
}

static void release_all(wl *w) {
    for (int i = 0; i < w->n_in; i++) kl_release(w->in[i]);
    free(w->scratch), free(w->scratch2);
}

static float *falloc(int64_t n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p) exit(1);
    memset(p, 0, (size_t)n * 4); /* touch the pages before timing */
    return p;
}

/* ---- machine limits --------------------------------------------------------- */

typedef struct stream_ctx {
    float *a, *b, *c;
    int64_t n;
} stream_ctx;
static void copy_fn(void *c) {
    stream_ctx *s = c;
    fr_stream_copy(s->a, s->c, s->n);
}
static void add_fn(void *c) {
    stream_ctx *s = c;
    fr_stream_add(s->a, s->b, s->c, s->n);
}
static void sgemm_fn(void *c) {
    stream_ctx *s = c;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, s->a, 1024, s->b, 1024, 0.0f, s->c,
                1024);
}

static void limits(void) {
    stream_ctx s = {falloc(16 << 20), falloc(16 << 20), falloc(16 << 20), 16 << 20};
    for (int64_t i = 0; i < s.n; i++) s.a[i] = 1, s.b[i] = 2;
    kb_stats c = timeit(copy_fn, &s), a = timeit(add_fn, &s);
    printf("LIMIT stream_copy %10.4f %8.2f\n", c.median * 1e3, 8.0 * s.n / c.median / 1e9);
    printf("LIMIT stream_add  %10.4f %8.2f\n", a.median * 1e3, 12.0 * s.n / a.median / 1e9);
    for (int64_t i = 0; i < 1024 * 1024; i++) s.a[i] = (float)(i % 7) * 0.1f, s.b[i] = (float)(i % 5) * 0.1f;
    ke_pool_quiesce();
    kb_stats g = timeit(sgemm_fn, &s);
    printf("LIMIT sgemm       %10.4f %8.2f\n", g.median * 1e3, 2.0 * 1024 * 1024 * 1024 / g.median / 1e9);
    fflush(stdout);
    free(s.a), free(s.b), free(s.c);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    kl_set_num_threads(threads);
    openblas_set_num_threads(kl_get_num_threads()); /* sgemm and kl_matmul: as many threads as Kiln */
    filters = argv + 2;
    nfilters = argc > 2 ? argc - 2 : 0;
    if (getenv("KB_QUICK") && atoi(getenv("KB_QUICK"))) min_reps = 3, min_time = 0.05;
    const char *be = getenv("KL_CPU_BACKEND");
    printf("INFO codegen_bench: %d threads, Kiln %s, interp row %s, KL_CPU_BACKEND=%s%s\n", kl_get_num_threads(),
           kl_version(), KB_HAVE_BACKEND ? "on (options.backend)" : "off (no options.backend in kiln.h)",
           be ? be : "(unset)", min_reps < 10 ? ", KB_QUICK (numbers not for reporting)" : "");
    fflush(stdout);
    limits();

    kl_manual_seed(0);
    static const int64_t ns[3] = {1 << 16, 1 << 20, 1 << 24};
    for (int k = 0; k < 6; k++) {
        wl w = {.id = k < 3 ? "chain5" : "gelu", .fn = wfn(k < 3 ? "chain5" : "gelu"), .n_in = 1};
        int64_t n = ns[k % 3];
        snprintf(w.size, sizeof w.size, "%lld", (long long)n);
        if (!selected(&w)) continue;
        w.a = n, w.bytes = 8.0 * n;
        w.in[0] = kl_retain(kl_randn(KL_SHAPE(n), KL_F32));
        w.scratch = falloc(n);
        bench(&w);
        release_all(&w);
    }
    static const int64_t rc[2][2] = {{4096, 1024}, {256, 4096}};
    for (int k = 0; k < 4; k++) {
        int ln = k >= 2;
        int64_t R = rc[k % 2][0], C = rc[k % 2][1];
        wl w = {.id = ln ? "layernorm" : "softmax", .fn = wfn(ln ? "layernorm" : "softmax"), .n_in = ln ? 3 : 1};
        snprintf(w.size, sizeof w.size, "%lldx%lld", (long long)R, (long long)C);
        if (!selected(&w)) continue;
        w.a = R, w.b = C, w.bytes = 8.0 * R * C + (ln ? 8.0 * C : 0);
        w.in[0] = kl_retain(kl_randn(KL_SHAPE(R, C), KL_F32));
        if (ln) {
            w.in[1] = kl_retain(kl_randn(KL_SHAPE(C), KL_F32));
            w.in[2] = kl_retain(kl_randn(KL_SHAPE(C), KL_F32));
        }
        w.scratch = falloc(R * C);
        bench(&w);
        release_all(&w);
    }
    {
        const int64_t B = 4096, C = 1000;
        wl w = {.id = "xent", .fn = wfn("xent"), .n_in = 2, .a = B, .b = C, .bytes = 4.0 * B * C + 8.0 * B + 4};
        snprintf(w.size, sizeof w.size, "%lldx%lld", (long long)B, (long long)C);
        if (selected(&w)) {
            w.in[0] = kl_retain(kl_randn(KL_SHAPE(B, C), KL_F32));
            w.in[1] = kl_retain(kl_randint(0, C, KL_SHAPE(B), KL_I64));
            w.scratch = falloc(B);
            bench(&w);
            release_all(&w);
        }
    }
    {
        const int64_t M = 256, K = 1024, H = 4096, N = 1024;
        wl w = {.id = "mlp", .fn = wfn("mlp"), .n_in = 5, .a = M, .b = K, .c = H, .d = N,
                .flops = 2.0 * M * K * H + 2.0 * M * H * N};
        snprintf(w.size, sizeof w.size, "256x1024"); /* -> 4096 -> 1024 */
        if (selected(&w)) {
            /* weights scaled like nn.Linear's init so the GELU sees O(1) inputs */
            w.in[0] = kl_retain(kl_randn(KL_SHAPE(M, K), KL_F32));
            w.in[1] = kl_retain(kl_mul_scalar(kl_randn(KL_SHAPE(K, H), KL_F32), 1 / sqrt((double)K)));
            w.in[2] = kl_retain(kl_randn(KL_SHAPE(H), KL_F32));
            w.in[3] = kl_retain(kl_mul_scalar(kl_randn(KL_SHAPE(H, N), KL_F32), 1 / sqrt((double)H)));
            w.in[4] = kl_retain(kl_randn(KL_SHAPE(N), KL_F32));
            w.scratch = falloc(M * H);
            w.scratch2 = falloc(M * N);
            bench(&w);
            release_all(&w);
        }
    }
    {
        const int64_t n = 10000000;
        wl w = {.id = "adamw", .fn = wfn("adamw"), .n_in = 4, .a = n, .bytes = 28.0 * n};
        snprintf(w.size, sizeof w.size, "10M");
        if (selected(&w)) {
            w.in[0] = kl_retain(kl_randn(KL_SHAPE(n), KL_F32));
            w.in[1] = kl_retain(kl_randn(KL_SHAPE(n), KL_F32));
            w.in[2] = kl_retain(kl_mul_scalar(kl_randn(KL_SHAPE(n), KL_F32), 0.1));
            w.in[3] = kl_retain(kl_mul_scalar(kl_abs(kl_randn(KL_SHAPE(n), KL_F32)), 0.01));
            bench(&w);
            release_all(&w);
        }
    }
    if (kl_last_status() != KL_OK) {
        fprintf(stderr, "codegen_bench: %s\n", kl_last_error());
        return 1;
    }
    return 0;
}
