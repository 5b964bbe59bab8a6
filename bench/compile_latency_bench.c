/*
 * compile_latency_bench.c — what a compiled function's first call waits for
 * (issue 15 part 3): the digits training step (bench/train_bench.c's
 * loss_and_grads: 64 -> 256 -> 256 -> 10, GELU, cross-entropy, gradients of
 * all six parameters in one graph) called cold at batch 64, then at batch 256
 * (the automatic-dynamic retrace), then cached; and a graph of 100 distinct
 * elementwise kernels between matmuls, called cold (per-kernel average) and
 * cached. Per-phase times come from kl_fn_explain (trace, passes, codegen,
 * LLVM's share). The disk cache is turned off (KL_CACHE_DIR=off unless set),
 * or a second run would load every object from it.
 *
 *   ninja -C build bench/compile_latency_bench
 *   build/bench/compile_latency_bench [threads] [all|digits|setup|tiers]
 *
 * "all" (default) starts with the digits step in a fresh process, so its
 * first call includes the process's one-time LLVM setup (JIT, target
 * machine, eager bitcode); "digits" stops after the digits step (for
 * callgrind: instruction counts of the cold call without the 100-kernel graph). "setup" times that setup alone: a one-kernel
 * function's first call minus a second, different one-kernel function's.
 * With KL_COMPILE_ASYNC=1 in the environment every first call runs eagerly
 * while the kernels compile in the background: the bench then also prints
 * the slowest call of the first 50 against the eager step. With
 * KL_COMPILE_INTERP=1 the first calls run the kernels on the interpreter
 * instead (the interpreter tier): it prints how many calls did.
 *
 * "tiers" compares the interpreter tier off and on in one process: after the
 * one-time setup, three pairs of cold first calls of the digits step at batch
 * 64 (each function released before the next, so its code is unloaded and the
 * next compiles cold), then, per pair, its wall time, the caller's CPU time,
 * the process's CPU time, the calls of the next 50 that ran interpreted and
 * the wall time until every kernel was compiled (kl_fn_wait_compiled).
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <kiln.h>

#include "bench_util.h"
#include "workloads.h"
#include <kiln/nn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double ms_since(double t0) { return (kb_now_s() - t0) * 1e3; }

/* CPU time of the whole process (all its threads), ms: on a loaded machine the wall
 * time of a cold call says little, its CPU time still says how much work it was. */
static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}
/* CPU time of the calling thread alone, ms: what a tiered first call itself does,
 * apart from the background compile and the pool's helpers. */
static double thread_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The calling thread's page faults (minor) and context switches (voluntary, involuntary):
 * where a tiered first call's CPU time goes when it is far above the eager step's. */
static void thread_counts(long out[3]) {
    struct rusage r;
    getrusage(RUSAGE_THREAD, &r);
    out[0] = r.ru_minflt, out[1] = r.ru_nvcsw, out[2] = r.ru_nivcsw;
}

/* The "compile time:" line of entry e of f's explanation: trace, passes, codegen, LLVM. */
static void phases(const kl_fn *f, int e, double out[4]) {
    memset(out, 0, sizeof(double) * 4);
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m) return;
    kl_fn_explain(f, m);
    fclose(m);
    const char *p = buf;
    for (int i = 0; p && i <= e; i++)
        if ((p = strstr(p, "compile time:")) && i < e) p++;
    if (p)
        sscanf(p, "compile time: trace %lf ms, passes %lf ms, codegen %lf ms (LLVM %lf ms)", &out[0], &out[1],
               &out[2], &out[3]);
    free(buf);
}

static void print_phases(const char *what, double total, const double ph[4], int64_t kernels) {
    printf("%-34s %8.2f ms  (trace %.2f, passes %.2f, codegen %.2f of which LLVM %.2f; %lld kernels)\n", what,
           total, ph[0], ph[1], ph[2], ph[3], (long long)kernels);
}

/* The standard lines measure the compile a first call makes: the interpreter tier (on by
 * default with two threads) off unless KL_COMPILE_INTERP=1 turns it on. */
static kl_compile_options standard_options(void) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1;
    return o;
}

/* ---- the digits step ------------------------------------------------------------------ */

/* WORKLOADS.md's digits_step, defined once in src/bench/workloads.c */
static int loss_and_grads(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    return kw_find("digits_step")->fn(u, in, n_in, out, n_out);
}

static void check(int rc, const char *what) {
    if (rc) {
        fprintf(stderr, "%s failed: %s\n", what, kl_last_error());
        exit(1);
    }
}

static void digits(void) {
    static const int64_t sizes[4] = {64, 256, 256, 10};
    kl_manual_seed(0);
    kl_scope_begin();
    kl_tensor *in[2][8];
    for (int b = 0; b < 2; b++) {
        int64_t batch = b ? 256 : 64;
        in[b][0] = kl_randn(KL_SHAPE(batch, 64), KL_F32);
        in[b][1] = kl_randint(0, 10, KL_SHAPE(batch), KL_I64);
    }
    for (int l = 0; l < 3; l++) {
        in[0][2 + 2 * l] = in[1][2 + 2 * l] = kl_mul_scalar(kl_randn(KL_SHAPE(sizes[l + 1], sizes[l]), KL_F32), 0.1);
        in[0][3 + 2 * l] = in[1][3 + 2 * l] = kl_zeros(KL_SHAPE(sizes[l + 1]), KL_F32);
    }
    kl_tensor *out[7];
    /* eager step time (median of 9) for the async comparison; and the calling thread's
     * CPU time of the step (median) */
    double eager[2], eager_cpu[2];
    for (int b = 0; b < 2; b++) {
        double t[9], c[9];
        for (int r = 0; r < 9; r++) {
            kl_scope_begin();
            double t0 = kb_now_s(), c0 = thread_cpu_ms();
            check(loss_and_grads(NULL, in[b], 8, out, 7), "eager step");
            t[r] = ms_since(t0);
            c[r] = thread_cpu_ms() - c0;
            kl_scope_end();
        }
        eager[b] = kb_summarize(t, 9).median;
        eager_cpu[b] = kb_summarize(c, 9).median;
    }
    kl_compile_options so = standard_options();
    kl_fn *f = kl_compile(loss_and_grads, NULL, &so);
    int async = getenv("KL_COMPILE_ASYNC") && strcmp(getenv("KL_COMPILE_ASYNC"), "0");
    int interp = !async && getenv("KL_COMPILE_INTERP") && strcmp(getenv("KL_COMPILE_INTERP"), "0");
    double worst[2] = {0, 0};
    int worst_at[2] = {0, 0}; /* which call: 0 the first, r + 1 the r-th after it */
    double most_cpu[2] = {0, 0}; /* the calling thread's CPU time of the costliest call after the first */
    int most_cpu_at[2] = {0, 0};
    double first[2], first_cpu[2], first_tcpu[2];
    long cnt[2][3];
    for (int b = 0; b < 2; b++) {
        kl_scope_begin();
        long n0[3];
        thread_counts(n0);
        double t0 = kb_now_s(), c0 = cpu_ms(), tc0 = thread_cpu_ms();
        check(kl_fn_call(f, in[b], 8, out, 7), "compiled step");
        first[b] = ms_since(t0);
        first_cpu[b] = cpu_ms() - c0;
        first_tcpu[b] = thread_cpu_ms() - tc0;
        thread_counts(cnt[b]);
        for (int i = 0; i < 3; i++) cnt[b][i] -= n0[i];
        if (getenv("BENCH_MARKS")) /* CLOCK_MONOTONIC, for perf record -k CLOCK_MONOTONIC's --time */
            fprintf(stderr, "first call b%d: %.6f to %.6f s\n", b ? 256 : 64, t0, t0 + first[b] / 1e3);
        kl_scope_end();
    }
    double cached[2];
    for (int b = 0; b < 2; b++) {
        double t[50];
        for (int r = 0; r < 50; r++) {
            kl_scope_begin();
            double t0 = kb_now_s(), c0 = thread_cpu_ms();
            check(kl_fn_call(f, in[b], 8, out, 7), "compiled step");
            t[r] = ms_since(t0);
            double c = thread_cpu_ms() - c0;
            if (t[r] > worst[b]) worst[b] = t[r], worst_at[b] = r + 1;
            if (c > most_cpu[b]) most_cpu[b] = c, most_cpu_at[b] = r + 1;
            kl_scope_end();
        }
        if (first[b] > worst[b]) worst[b] = first[b], worst_at[b] = 0;
        cached[b] = kb_summarize(t, 50).median;
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    double ph[4];
    phases(f, 0, ph);
    print_phases("digits step, cold first call b64", first[0], ph, st.kernels);
    phases(f, 1, ph);
    print_phases("digits step, first call b256", first[1], ph, st.kernels);
    printf("%-34s %8.2f ms b64, %.2f ms b256 (process CPU time, all threads)\n",
           "digits step, first call CPU", first_cpu[0], first_cpu[1]);
    printf("%-34s %8.3f ms b64, %.3f ms b256 (eager %.3f, %.3f)\n", "digits step, cached call", cached[0], cached[1],
           eager[0], eager[1]);
    if (async) {
        printf("%-34s %8.3f ms b64, %.3f ms b256 (%.2fx, %.2fx eager)\n", "async: slowest of first 51 calls",
               worst[0], worst[1], worst[0] / eager[0], worst[1] / eager[1]);
        printf("%-34s %8d b64, %d b256 (0: the first call)\n", "async: slowest call was call", worst_at[0], worst_at[1]);
        printf("%-34s %8lld (calls that ran eagerly while the kernels compiled)\n", "async: eager calls",
               (long long)st.async_eager_calls);
        printf("%-34s %8.3f ms b64, %.3f ms b256 (the eager step's: %.3f, %.3f)\n", "async: first call, caller's CPU",
               first_tcpu[0], first_tcpu[1], eager_cpu[0], eager_cpu[1]);
        printf("%-34s %8.3f ms b64 (call %d), %.3f ms b256 (call %d)\n", "async: later call, most caller CPU",
               most_cpu[0], most_cpu_at[0], most_cpu[1], most_cpu_at[1]);
        double ph1[4];
        phases(f, 0, ph);
        phases(f, 1, ph1);
        printf("%-34s %8.3f ms b64, %.3f ms b256 (first call's wall less trace and passes)\n", "async: first call, the rest",
               first[0] - ph[0] - ph[1], first[1] - ph1[0] - ph1[1]);
        printf("%-34s %5ld/%ld/%ld b64, %ld/%ld/%ld b256 (page faults / voluntary / involuntary switches)\n",
               "async: first call, caller's", cnt[0][0], cnt[0][1], cnt[0][2], cnt[1][0], cnt[1][1], cnt[1][2]);
    }
    if (interp) {
        printf("%-34s %8lld (of 102; kernels not compiled yet ran on the interpreter)\n", "interp tier: interpreted calls",
               (long long)st.interp_calls);
        printf("%-34s %8.3f ms b64, %.3f ms b256 (caller's CPU; the eager step's: %.3f, %.3f)\n",
               "interp tier: first call", first_tcpu[0], first_tcpu[1], eager_cpu[0], eager_cpu[1]);
    }
    kl_fn_release(f);
    kl_scope_end();
}

/* ---- the interpreter tier off and on, in one process ---------------------------------- */

static void tiers(void) {
    kl_manual_seed(0);
    kl_scope_begin();
    static const int64_t sizes[4] = {64, 256, 256, 10};
    kl_tensor *in[8];
    in[0] = kl_randn(KL_SHAPE(64, 64), KL_F32);
    in[1] = kl_randint(0, 10, KL_SHAPE(64), KL_I64);
    for (int l = 0; l < 3; l++) {
        in[2 + 2 * l] = kl_mul_scalar(kl_randn(KL_SHAPE(sizes[l + 1], sizes[l]), KL_F32), 0.1);
        in[3 + 2 * l] = kl_zeros(KL_SHAPE(sizes[l + 1]), KL_F32);
    }
    kl_tensor *out[7], *ref[7];
    check(loss_and_grads(NULL, in, 8, ref, 7), "eager step");
    for (int pair = 0; pair < 3; pair++)
        for (int on = 0; on < 2; on++) {
            kl_compile_options o = kl_compile_options_default();
            o.interp_tier = on ? 1 : -1;
            kl_fn *f = kl_compile(loss_and_grads, NULL, &o);
            kl_scope_begin();
            double t0 = kb_now_s(), c0 = cpu_ms(), tc0 = thread_cpu_ms();
            check(kl_fn_call(f, in, 8, out, 7), "compiled step");
            double wall = ms_since(t0), tcpu = thread_cpu_ms() - tc0, pcpu = cpu_ms() - c0;
            kl_scope_end();
            for (int r = 0; r < 50; r++) {
                kl_scope_begin();
                check(kl_fn_call(f, in, 8, out, 7), "compiled step");
                kl_scope_end();
            }
            kl_fn_wait_compiled(f);
            double ready = ms_since(t0);
            kl_fn_stats st;
            kl_fn_get_stats(f, &st);
            printf("tier %-3s pair %d: cold first call %7.2f ms wall, caller CPU %7.2f ms, process CPU %7.2f ms; "
                   "%2lld of 51 calls interpreted; all compiled after %7.2f ms\n",
                   on ? "on" : "off", pair, wall, tcpu, pcpu, (long long)st.interp_calls, ready);
            kl_fn_release(f);
        }
    kl_scope_end();
}

/* ---- 100 kernels ---------------------------------------------------------------------- */

#define NK 100
typedef kl_tensor *(*unary)(kl_tensor *);
static const unary ops[7] = {kl_tanh, kl_sigmoid, kl_relu, kl_neg, kl_abs, kl_sin, kl_square};

/* h = matmul(kernel_i(h), w) for i < 100, kernel_i two or three elementwise ops picked
 * from i, so no two kernels have the same code (a shared kernel would compile once). */
static int hundred(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = in[0];
    for (int i = 0; i < NK; i++) {
        h = ops[i % 7](h);
        h = ops[(i / 7) % 7](h);
        if (i / 49) h = kl_mul_scalar(ops[(i + 3) % 7](h), 0.5);
        h = kl_matmul(h, in[1]);
    }
    out[0] = h;
    return h ? 0 : -1;
}

static void k100(void) {
    kl_scope_begin();
    kl_tensor *in[2] = {kl_randn(KL_SHAPE(8, 32), KL_F32), kl_mul_scalar(kl_randn(KL_SHAPE(32, 32), KL_F32), 0.2)};
    kl_tensor *y;
    kl_compile_options so = standard_options();
    kl_fn *f = kl_compile(hundred, NULL, &so);
    double t0 = kb_now_s();
    check(kl_fn_call(f, in, 2, &y, 1), "100-kernel graph");
    double cold = ms_since(t0);
    double t[21];
    for (int r = 0; r < 21; r++) {
        t0 = kb_now_s();
        check(kl_fn_call(f, in, 2, &y, 1), "100-kernel graph");
        t[r] = ms_since(t0);
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    int64_t nk = st.kernels - st.library_calls;
    double ph[4];
    phases(f, 0, ph);
    print_phases("100-kernel graph, cold first call", cold, ph, nk);
    printf("%-34s %8.3f ms per kernel (codegen phase / kernels), LLVM %.3f ms per kernel\n", "100-kernel graph, average",
           ph[2] / (double)(nk ? nk : 1), ph[3] / (double)(nk ? nk : 1));
    printf("%-34s %8.3f ms\n", "100-kernel graph, cached call", kb_summarize(t, 21).median);
    kl_fn_release(f);
    kl_scope_end();
}

/* ---- one-time setup ------------------------------------------------------------------- */

static int one_a(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    return (out[0] = kl_add_scalar(kl_mul_scalar(in[0], 2), 1)) ? 0 : -1;
}
static int one_b(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    return (out[0] = kl_sub(kl_mul(in[0], in[0]), in[0])) ? 0 : -1;
}

static void setup(void) {
    kl_scope_begin();
    kl_tensor *x = kl_randn(KL_SHAPE(64), KL_F32), *y;
    double ms[2];
    for (int i = 0; i < 2; i++) {
        kl_compile_options so = standard_options();
        kl_fn *f = kl_compile(i ? one_b : one_a, NULL, &so);
        double t0 = kb_now_s();
        check(kl_fn_call(f, &x, 1, &y, 1), "one-kernel function");
        ms[i] = ms_since(t0);
        kl_fn_release(f);
    }
    printf("%-34s %8.2f ms (first one-kernel call %.2f ms, second %.2f ms)\n", "one-time setup (difference)",
           ms[0] - ms[1], ms[0], ms[1]);
    kl_scope_end();
}

int main(int argc, char **argv) {
    setenv("KL_CACHE_DIR", "off", 0);
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *which = argc > 2 ? argv[2] : "all";
    kl_set_num_threads(threads);
    printf("compile_latency_bench: %d threads, Kiln %s, KL_CACHE_DIR=%s, KL_COMPILE_ASYNC=%s\n", kl_get_num_threads(),
           kl_version(), getenv("KL_CACHE_DIR"), getenv("KL_COMPILE_ASYNC") ? getenv("KL_COMPILE_ASYNC") : "unset");
    if (!strcmp(which, "setup")) {
        setup();
        return 0;
    }
    if (!strcmp(which, "tiers")) {
        setup(); /* the one-time setup, out of both sides */
        tiers();
        return 0;
    }
    digits();
    if (!strcmp(which, "digits")) return 0;
    k100();
    return 0;
}
