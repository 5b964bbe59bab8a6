/*
 * kiln/bench.h — benchmarking like torch.utils.benchmark (Timer, Compare):
 * warm-up, repetitions, median and interquartile range, comparison tables.
 * Included by kiln.h; may also be included on its own.
 */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Benchmarking (like torch.utils.benchmark's Timer and Compare)             */
/*                                                                          */
/*     static int step(void *user) {                                         */
/*         return kl_fn_call(user, in, 1, &y, 1);                            */
/*     }                                                                    */
/*     kl_bench_options o = kl_bench_options_default();                      */
/*     o.label = "chain5"; o.sub_label = "2^20"; o.description = "FUSE";     */
/*     kl_bench_result r[2];                                                 */
/*     kl_bench(step, f, &o, &r[0]);                                         */
/*     kl_bench_print_row(&r[0], stdout);                                    */
/*     kl_bench_compare(r, 2, stdout);                                       */
/*                                                                          */
/* Each call of the callable runs inside its own scope (its temporaries are */
/* freed between calls, as in a training loop). Warm-up calls run first and */
/* are not timed; then calls are timed one by one until both min_runs and   */
/* min_time_s are reached (or max_runs). The thread count is pinned to      */
/* opts.threads (0: the current count) for the run and restored after it.   */
/* ------------------------------------------------------------------------ */

/* The timed callable: returns 0, or -1 with an error recorded (which stops the run). */
typedef int (*kl_bench_callable)(void *user);
/* A clock in seconds (tests inject a fake one; NULL = CLOCK_MONOTONIC). */
typedef double (*kl_bench_clock)(void *clock_user);

typedef struct kl_bench_options {
    const char *label;       /* what is measured ("softmax"): kl_bench_compare's table */
    const char *sub_label;   /* a row of that table ("256x4096") */
    const char *description; /* a column of that table ("FUSE") */
    int warmup;              /* untimed calls first (default 3) */
    int min_runs;            /* at least this many timed calls (default 10) */
    int max_runs;            /* at most this many (default 100000) */
    double min_time_s;       /* and at least this much timed time (default 0.5 s) */
    int threads;             /* kl_set_num_threads during the run; 0 = keep the current count */
    kl_bench_clock clock;    /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
} kl_bench_options;
KL_API kl_bench_options kl_bench_options_default(void);

typedef struct kl_bench_result {
    char label[64], sub_label[64], description[64];
    int runs;                   /* timed calls */
    int threads;                /* the pinned thread count */
    double median_s, q1_s, q3_s; /* quartiles of the per-call times (linear interpolation, as numpy) */
    double iqr_s;               /* q3 - q1 */
    double mean_s, min_s, total_s;
    bool noisy;                 /* iqr_s > 10% of median_s */
    char warning[96];           /* "IQR 12.3% of the median: noisy measurement", or "" */
} kl_bench_result;

/* Times fn(user) as the options say; fills *out. Returns 0, or -1: KL_ERR_ARG
 * (NULL fn/out, min_runs < 1, max_runs < min_runs, min_time_s < 0 or NaN,
 * warmup < 0, threads < 0) or the callable's own error. */
KL_API int kl_bench(kl_bench_callable fn, void *user, const kl_bench_options *opts, kl_bench_result *out);
/* kl_bench of kl_fn_call(f, inputs, n_in, outputs, n_out), each call's outputs
 * dropped with its scope: a compiled function in the mode it was compiled in
 * (kl_compile_options.mode; KL_COMPILE_OFF times it eagerly through the same
 * entry). The first call of a new signature traces and compiles: warmup >= 1
 * keeps that out of the timings. KL_ERR_ARG on NULL f, n_in or n_out outside
 * [0, 64]; otherwise as kl_bench. */
struct kl_fn; /* kiln/compile.h's kl_fn: named so that compile.h may be included first */
KL_API int kl_bench_fn(struct kl_fn *f, kl_tensor *const *inputs, int n_in, int n_out, const kl_bench_options *opts,
                       kl_bench_result *out);
/* Median and quartiles of t[0..n) by linear interpolation (sorts t in place;
 * n >= 1). What kl_bench reports: exposed so other timings summarize alike. */
KL_API void kl_bench_quartiles(double *t, int n, double *q1, double *median, double *q3);
/* Prints one result as one line: label, sub-label, description, median, IQR
 * (and its % of the median), runs, threads, the warning if any. */
KL_API void kl_bench_print_row(const kl_bench_result *r, FILE *stream);
/* Prints rows grouped like torch.utils.benchmark.Compare: one table per label
 * (first-seen order), a row per sub_label, a column per description, each
 * cell the median in one unit per table and marked "!" when noisy. Returns 0,
 * or -1 (KL_ERR_ARG) on NULL rows with n > 0 or a NULL stream. */
KL_API int kl_bench_compare(const kl_bench_result *rows, int n, FILE *stream);

#ifdef __cplusplus
}
#endif
#endif /* KILN_BENCH_H */
