/*
 * compile_bench.c — compile mode's fixed costs: (a) a cache hit of a compiled
 * identity function (guard check plus the call's bookkeeping; the graph does
 * nothing) with 1, 4 and 16 inputs, and the per-input slope; (b) trace and
 * pass-pipeline time per op for chains of 10, 100 and 1000 elementwise ops
 * (kl_fn_stats.compile_ms of the first call: TRACE_ONLY = trace alone,
 * FUSE = trace + the whole pipeline). Numbers go to bench/RESULTS.md.
 *
 *   ninja -C build bench/compile_bench && KL_NUM_THREADS=2 ./build/bench/compile_bench
 */
#include "bench_util.h"

#include "kiln.h"

#include <stdio.h>

static int identity(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = in[0];
    return 0;
}

/* ns per cache-hit call with 1, 4 and 16 inputs: batches interleaved (so load
 * drift hits all three alike), median and quartiles of 21 batches each */
static void hit_cost(kb_stats *out, double *best) {
    enum { BATCH = 100000, REPS = 21 };
    static const int ns[3] = {1, 4, 16};
    kl_scope_begin();
    kl_tensor *in[16], *y;
    for (int i = 0; i < 16; i++) in[i] = kl_ones(2, (int64_t[]){4, 8}, KL_F32);
    kl_fn *f[3];
    for (int k = 0; k < 3; k++) {
        f[k] = kl_compile(identity, NULL, NULL);
        if (kl_fn_call(f[k], in, ns[k], &y, 1) != 0) {
            fprintf(stderr, "call failed: %s\n", kl_last_error());
            exit(1);
        }
    }
    double t[3][REPS];
    for (int r = 0; r < REPS; r++)
        for (int k = 0; k < 3; k++) {
            double t0 = kb_now_s();
            for (int i = 0; i < BATCH; i++) kl_fn_call(f[k], in, ns[k], &y, 1);
            t[k][r] = (kb_now_s() - t0) / BATCH * 1e9;
        }
    for (int k = 0; k < 3; k++) {
        kl_fn_stats st;
        kl_fn_get_stats(f[k], &st);
        if (st.cache_hits != (int64_t)BATCH * REPS) fprintf(stderr, "warning: %lld cache hits\n", (long long)st.cache_hits);
        kl_fn_release(f[k]);
        out[k] = kb_summarize(t[k], REPS);
        best[k] = t[k][0];
    }
    kl_scope_end();
}

/* A chain of n elementwise ops on two inputs: add, mul by a scalar, tanh, sub, ... */
static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    int n = *(const int *)u;
    kl_tensor *x = in[0];
    for (int i = 0; i < n; i++) {
        switch (i % 4) {
        case 0: x = kl_add(x, in[1]); break;
        case 1: x = kl_mul_scalar(x, 0.5); break;
        case 2: x = kl_tanh(x); break;
        default: x = kl_sub(x, in[1]); break;
        }
    }
    out[0] = x;
    return x ? 0 : -1;
}

/* compile_ms of the first call (and the first call's wall time: trace +
 * passes + one run), medians of reps fresh compiles */
static void compile_cost(int n, kl_compile_mode m, int reps, kb_stats *ms, kb_stats *wall) {
    double t[32], w[32];
    for (int r = 0; r < reps; r++) {
        kl_scope_begin();
        kl_tensor *in[2] = {kl_ones(2, (int64_t[]){16, 16}, KL_F32), kl_ones(1, (int64_t[]){16}, KL_F32)}, *y;
        kl_compile_options o = kl_compile_options_default();
        o.mode = m;
        o.interp_tier = -1; /* the compile is what is timed */
        kl_fn *f = kl_compile(chain, &n, &o);
        double t0 = kb_now_s();
        if (kl_fn_call(f, in, 2, &y, 1) != 0) {
            fprintf(stderr, "call failed: %s\n", kl_last_error());
            exit(1);
        }
        w[r] = (kb_now_s() - t0) * 1e3;
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        t[r] = st.compile_ms;
        kl_fn_release(f);
        kl_scope_end();
    }
    *ms = kb_summarize(t, reps);
    *wall = kb_summarize(w, reps);
}

int main(void) {
    printf("(a) cache hit of a compiled identity (guard check + call), ns per call, median [q1, q3] (min)\n");
    kb_stats hs[3];
    double best[3];
    const int ins[3] = {1, 4, 16};
    hit_cost(hs, best);
    for (int k = 0; k < 3; k++)
        printf("  %2d inputs: %7.1f ns  [%.1f, %.1f]  (%.1f)\n", ins[k], hs[k].median, hs[k].q1, hs[k].q3, best[k]);
    double slope = (hs[2].median - hs[0].median) / 15, base = hs[0].median - slope;
    printf("  fit of the medians: %.1f ns + %.1f ns per input (target <= 200 ns + 20 ns per input)\n\n", base, slope);

    printf("(b) first call: compile_ms (trace [+ passes]) per op, and the first call's wall time; medians\n");
    printf("  %5s  %10s %8s  %10s %8s  %12s\n", "ops", "trace ms", "us/op", "FUSE ms", "us/op", "FUSE wall ms");
    const int sizes[3] = {10, 100, 1000};
    for (int k = 0; k < 3; k++) {
        int reps = sizes[k] >= 1000 ? 7 : 21;
        kb_stats tr, trw, fu, fuw;
        compile_cost(sizes[k], KL_COMPILE_TRACE_ONLY, reps, &tr, &trw);
        compile_cost(sizes[k], KL_COMPILE_FUSE, reps, &fu, &fuw);
        printf("  %5d  %10.3f %8.2f  %10.3f %8.2f  %12.3f\n", sizes[k], tr.median, tr.median * 1e3 / sizes[k],
               fu.median, fu.median * 1e3 / sizes[k], fuw.median);
    }
    return 0;
}
