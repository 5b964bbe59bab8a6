/*
 * test_bench.c — kl_bench's statistics over a fake clock (median, quartiles
 * by linear interpolation, the noise warning, min_runs / min_time_s /
 * max_runs, warm-up), the pinned thread count, scopes per call, errors, and
 * the printed row and Compare tables against golden text. No assertion here
 * depends on real time.
 */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fake clock: each call of the callable advances it by the next duration. */
typedef struct fake {
    double now;
    const double *dur;
    int ndur, calls, threads_seen, fail_at;
    int64_t live_in_call;
} fake;

static double fake_clock(void *u) { return ((fake *)u)->now; }

static int fake_call(void *u) {
    fake *f = u;
    f->threads_seen = kl_get_num_threads();
    if (f->calls == f->fail_at) {
        f->calls++;
        return -1;
    }
    kl_tensor *t = kl_ones(KL_SHAPE(4), KL_F32); /* freed by the call's scope */
    (void)t;
    f->live_in_call = kl_live_tensors();
    f->now += f->dur[f->calls % f->ndur];
    f->calls++;
    return 0;
}

static kl_bench_options fake_opts(fake *f) {
    kl_bench_options o = kl_bench_options_default();
    o.clock = fake_clock;
    o.clock_user = f;
    return o;
}

static void defaults_follow_workloads_md(void **state) {
    (void)state;
    kl_bench_options o = kl_bench_options_default();
    assert_int_equal(o.min_runs, 10);
    assert_true(o.min_time_s == 0.5);
    assert_int_equal(o.warmup, 3);
    assert_int_equal(o.threads, 0);
    assert_null(o.clock);
}

static void median_and_quartiles_interpolate(void **state) {
    (void)state;
    /* warm-up durations (3 calls) then 1..10 ms shuffled */
    const double d[] = {9, 9, 9, 5e-3, 1e-3, 4e-3, 2e-3, 3e-3, 10e-3, 6e-3, 8e-3, 7e-3, 9e-3};
    fake f = {.dur = d, .ndur = 13, .fail_at = -1};
    kl_bench_options o = fake_opts(&f);
    o.min_time_s = 0;
    o.label = "lbl", o.sub_label = "sub", o.description = "desc";
    kl_bench_result r;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(f.calls, 13); /* 3 warm-up calls, untimed */
    assert_int_equal(r.runs, 10);
    assert_float_equal(r.median_s, 5.5e-3, 1e-12);
    assert_float_equal(r.q1_s, 3.25e-3, 1e-12); /* rank 2.25 */
    assert_float_equal(r.q3_s, 7.75e-3, 1e-12); /* rank 6.75 */
    assert_float_equal(r.iqr_s, 4.5e-3, 1e-12);
    assert_float_equal(r.mean_s, 5.5e-3, 1e-12);
    assert_float_equal(r.min_s, 1e-3, 1e-12);
    assert_float_equal(r.total_s, 55e-3, 1e-12);
    assert_true(r.noisy);
    assert_string_equal(r.warning, "IQR 81.8% of the median: noisy measurement");
    assert_string_equal(r.label, "lbl");
    assert_string_equal(r.sub_label, "sub");
    assert_string_equal(r.description, "desc");
    /* the call's tensor lived during the call and died with its scope */
    assert_true(f.live_in_call >= 1);
    assert_int_equal(kl_live_tensors(), 0);
}

static void quiet_runs_have_no_warning(void **state) {
    (void)state;
    /* 10% is the edge: 0.95, 1.0, 1.05 ... IQR of exactly 10% is not noisy */
    const double d[] = {1.0};
    fake f = {.dur = d, .ndur = 1, .fail_at = -1};
    kl_bench_options o = fake_opts(&f);
    o.min_time_s = 0;
    kl_bench_result r;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_float_equal(r.iqr_s, 0, 0);
    assert_false(r.noisy);
    assert_string_equal(r.warning, "");
    const double e[] = {0.9, 1.0, 1.1, 1.0, 0.9, 1.0, 1.1, 1.0}; /* q1 0.975, q3 1.025: 5% */
    fake g = {.dur = e, .ndur = 8, .fail_at = -1};
    o = fake_opts(&g);
    o.warmup = 0, o.min_runs = 8, o.min_time_s = 0;
    assert_int_equal(kl_bench(fake_call, &g, &o, &r), 0);
    assert_int_equal(r.runs, 8);
    assert_float_equal(r.q1_s, 0.975, 1e-12);
    assert_float_equal(r.q3_s, 1.025, 1e-12);
    assert_false(r.noisy);
}

static void runs_until_min_runs_and_min_time(void **state) {
    (void)state;
    const double d[] = {0.125}; /* exact in binary: the sums are exact */
    fake f = {.dur = d, .ndur = 1, .fail_at = -1};
    kl_bench_options o = fake_opts(&f);
    o.warmup = 0, o.min_runs = 3, o.min_time_s = 0.5;
    kl_bench_result r;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(r.runs, 4); /* time decides: 4 x 0.125 = 0.5 */
    o.min_runs = 7;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(r.runs, 7); /* the count decides */
    o.min_runs = 2, o.max_runs = 3, o.min_time_s = 100;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(r.runs, 3); /* the cap decides */
}

static void thread_count_is_pinned_and_restored(void **state) {
    (void)state;
    const double d[] = {1e-3};
    int before = kl_get_num_threads();
    kl_set_num_threads(2);
    fake f = {.dur = d, .ndur = 1, .fail_at = -1};
    kl_bench_options o = fake_opts(&f);
    o.threads = 1, o.min_time_s = 0;
    kl_bench_result r;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(f.threads_seen, 1);
    assert_int_equal(r.threads, 1);
    assert_int_equal(kl_get_num_threads(), 2);
    o.threads = 0; /* keep the current count */
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), 0);
    assert_int_equal(f.threads_seen, 2);
    assert_int_equal(r.threads, 2);
    kl_set_num_threads(before);
}

static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_tanh(kl_mul_scalar(in[0], 2));
    return out[0] ? 0 : -1;
}

/* a fake clock that moves 1 ms per reading */
static double ticking(void *u) { return (*(double *)u += 1e-3); }

static void compiled_functions_in_their_mode(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(16), KL_F32);
    for (int m = KL_COMPILE_OFF; m <= KL_COMPILE_FUSE; m++) {
        kl_compile_options co = kl_compile_options_default();
        co.mode = (kl_compile_mode)m;
        kl_fn *f = kl_compile(chain, NULL, &co);
        double now = 0;
        kl_bench_options o = kl_bench_options_default();
        o.clock = ticking, o.clock_user = &now, o.min_time_s = 0, o.warmup = 2;
        kl_bench_result r;
        assert_int_equal(kl_bench_fn(f, &x, 1, 1, &o, &r), 0);
        assert_int_equal(r.runs, 10);
        assert_float_equal(r.median_s, 1e-3, 1e-12); /* two readings per call */
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.calls, 12); /* warm-up included */
        assert_int_equal(st.traces, m == KL_COMPILE_OFF ? 0 : 1);
        assert_int_equal(st.eager_calls, m == KL_COMPILE_OFF ? 12 : 0);
        kl_fn_release(f);
    }
    kl_bench_result r;
    assert_int_equal(kl_bench_fn(NULL, &x, 1, 1, NULL, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "NULL function");
    kl_fn *f = kl_compile(chain, NULL, NULL);
    assert_int_equal(kl_bench_fn(f, &x, 1, 65, NULL, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "bad counts");
    /* a call that fails (wrong input count after the first call) stops the run */
    kl_bench_options o = kl_bench_options_default();
    o.min_time_s = 0;
    assert_int_equal(kl_bench_fn(f, &x, 1, 1, &o, &r), 0);
    assert_int_equal(kl_bench_fn(f, (kl_tensor *[]){x, x}, 2, 1, &o, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "");
    kl_fn_release(f);
    assert_int_equal(kl_live_tensors(), 1); /* x */
}

static int failing_with_error(void *u) {
    (void)u;
    return kl_add(kl_ones(KL_SHAPE(2), KL_F32), kl_ones(KL_SHAPE(3), KL_F32)) ? 0 : -1;
}

static void errors_stop_the_run(void **state) {
    (void)state;
    kl_bench_result r;
    kl_bench_options o = kl_bench_options_default();
    o.min_time_s = 0;
    assert_int_equal(kl_bench(failing_with_error, NULL, &o, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "broadcast");
    /* -1 without an error of its own: the run still fails, with a message */
    const double d[] = {1e-3};
    fake f = {.dur = d, .ndur = 1, .fail_at = 5};
    o = fake_opts(&f);
    o.min_time_s = 0;
    int threads = kl_get_num_threads();
    o.threads = threads == 1 ? 2 : 1;
    assert_int_equal(kl_bench(fake_call, &f, &o, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "returned -1 without an error");
    assert_int_equal(kl_get_num_threads(), threads); /* restored on failure too */
    assert_int_equal(kl_live_tensors(), 0);
}

static void bad_options_are_errors(void **state) {
    (void)state;
    kl_bench_result r;
    fake f = {.dur = (const double[]){1}, .ndur = 1, .fail_at = -1};
    assert_int_equal(kl_bench(NULL, NULL, NULL, &r), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "NULL callable");
    assert_int_equal(kl_bench(fake_call, &f, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "NULL result");
    kl_bench_options bad[5];
    for (int i = 0; i < 5; i++) bad[i] = fake_opts(&f);
    bad[0].min_runs = 0;
    bad[1].max_runs = 5;
    bad[2].min_time_s = -1;
    bad[3].warmup = -2;
    bad[4].threads = -1;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kl_bench(fake_call, &f, &bad[i], &r), -1);
        KT_EXPECT_ERROR(KL_ERR_ARG, "invalid options");
    }
    assert_int_equal(f.calls, 0); /* nothing ran */
    assert_int_equal(kl_bench_compare(NULL, 2, stdout), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "NULL rows");
    assert_int_equal(kl_bench_compare(NULL, 0, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "NULL stream");
    assert_int_equal(kl_bench_compare(NULL, 0, stdout), 0);
}

static void quartiles_of_small_sets(void **state) {
    (void)state;
    double q1, m, q3;
    double one[] = {7};
    kl_bench_quartiles(one, 1, &q1, &m, &q3);
    assert_true(q1 == 7 && m == 7 && q3 == 7);
    double four[] = {4, 1, 3, 2}; /* numpy: 1.75, 2.5, 3.25 */
    kl_bench_quartiles(four, 4, &q1, &m, &q3);
    assert_float_equal(q1, 1.75, 1e-15);
    assert_float_equal(m, 2.5, 1e-15);
    assert_float_equal(q3, 3.25, 1e-15);
}

/* ---- printing, golden text ----------------------------------------------------------- */

static kl_bench_result row(const char *label, const char *sub, const char *desc, double median, double iqr) {
    kl_bench_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.label, sizeof r.label, "%s", label);
    snprintf(r.sub_label, sizeof r.sub_label, "%s", sub);
    snprintf(r.description, sizeof r.description, "%s", desc);
    r.runs = 12, r.threads = 2;
    r.median_s = median, r.iqr_s = iqr, r.q1_s = median - iqr / 2, r.q3_s = median + iqr / 2;
    r.noisy = iqr > 0.1 * median;
    if (r.noisy) snprintf(r.warning, sizeof r.warning, "IQR %.1f%% of the median: noisy measurement", 100 * iqr / median);
    return r;
}

/* What f prints, as a malloc'd string. */
static char *captured(void (*f)(const kl_bench_result *, int, FILE *), const kl_bench_result *r, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    f(r, n, m);
    fclose(m);
    return buf;
}

static void print_rows(const kl_bench_result *r, int n, FILE *f) {
    for (int i = 0; i < n; i++) kl_bench_print_row(&r[i], f);
}

static void compare_rows(const kl_bench_result *r, int n, FILE *f) { assert_int_equal(kl_bench_compare(r, n, f), 0); }

static void row_text_is_golden(void **state) {
    (void)state;
    kl_bench_result r[2] = {row("softmax", "256x4096", "FUSE", 1.5e-3, 0.03e-3),
                            row("chain5", "", "", 42e-6, 9e-6)};
    char *s = captured(print_rows, r, 2);
    assert_string_equal(s, "softmax / 256x4096 / FUSE: median 1.5 ms, IQR 0.03 ms (2.0%), 12 runs, 2 threads\n"
                           "chain5: median 42 us, IQR 9 us (21.4%), 12 runs, 2 threads  "
                           "WARNING: IQR 21.4% of the median: noisy measurement\n");
    free(s);
}

static void compare_text_is_golden(void **state) {
    (void)state;
    kl_bench_result r[] = {
        row("softmax", "256x4096", "eager", 4.2e-3, 0.1e-3),  row("softmax", "256x4096", "FUSE", 1.25e-3, 0.5e-3),
        row("chain5", "65536", "eager", 310e-6, 5e-6),        row("softmax", "4096x1024", "eager", 4.4e-3, 0.1e-3),
        row("chain5", "65536", "FUSE", 45.5e-6, 1e-6),        row("chain5", "1048576", "FUSE", 2.5e-3, 0.01e-3),
    };
    char *s = captured(compare_rows, r, 6);
    assert_string_equal(s, "[--------------- softmax ---------------]\n"
                           "            |      eager   |       FUSE  \n"
                           " 256x4096   |      4.200   |      1.250 !\n"
                           "4096x1024   |      4.400   |          -  \n"
                           "Times are in milliseconds (ms). ! marks a noisy median (IQR > 10% of it).\n"
                           "\n"
                           "[-------------- chain5 ---------------]\n"
                           "          |      eager   |       FUSE  \n"
                           "  65536   |     310.00   |      45.50  \n"
                           "1048576   |          -   |    2500.00  \n"
                           "Times are in microseconds (us).\n"
                           "\n");
    free(s);
}

static void config_string_names_openblas(void **state) {
    (void)state;
    const char *c = kl_config_string();
    assert_non_null(c);
    char want[64];
    snprintf(want, sizeof want, "Kiln %s, %d threads; OpenBLAS core ", kl_version(), kl_get_num_threads());
    if (strncmp(c, want, strlen(want))) print_error("got \"%s\"\n", c);
    assert_int_equal(strncmp(c, want, strlen(want)), 0);
    assert_non_null(strstr(c, " threads; OpenBLAS ")); /* the thread count, then openblas_get_config() */
    /* the environment's forcing is reported as such */
    const char *old = getenv("OPENBLAS_CORETYPE");
    assert_non_null(strstr(c, old ? "OPENBLAS_CORETYPE=" : "chosen by OpenBLAS"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(defaults_follow_workloads_md),
        KT_TEST(median_and_quartiles_interpolate),
        KT_TEST(quiet_runs_have_no_warning),
        KT_TEST(runs_until_min_runs_and_min_time),
        KT_TEST(thread_count_is_pinned_and_restored),
        KT_TEST(errors_stop_the_run),
        KT_TEST(compiled_functions_in_their_mode),
        KT_TEST(bad_options_are_errors),
        KT_TEST(quartiles_of_small_sets),
        KT_TEST(row_text_is_golden),
        KT_TEST(compare_text_is_golden),
        KT_TEST(config_string_names_openblas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
