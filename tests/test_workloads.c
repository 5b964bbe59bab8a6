/*
 * test_workloads.c — the standard workloads of shared/WORKLOADS.md as the
 * library defines them (src/bench/workloads.c, what kiln-bench times): every
 * workload at its small size in every compile mode agrees with eager, traces
 * once and never falls back; FUSE mode's kernel and library-call counts are
 * pinned (a fusion regression shows up here); training steps move their
 * parameters; bad names are errors.
 */
#include "harness.h"

#include "workloads.h"

#include <string.h>

/* Launches per call in FUSE mode at the small size: compiled kernels +
 * library calls (ops run through the dispatcher: matmul's BLAS, gather, ...). */
typedef struct expect {
    const char *id;
    int64_t kernels, library_calls;
} expect;

static const expect fuse_counts[] = {
    {"chain5", 1, 0},
    {"gelu", 1, 0},
    {"softmax", 1, 0},
    {"layernorm", 1, 0},
    /* the log-softmax kernel, then gather, mean and neg op by op */
    {"xent", 4, 3},
    /* matmul, bias + GELU kernel, matmul, and the last bias add alone (a
     * one-op group runs through the dispatcher) */
    {"mlp", 4, 3},
    {"mlp_step", 14, 10},
    {"digits_step", 23, 15},
    {"adamw", 1, 0},
    {"attention", 7, 5},
};

static const expect *expected(const char *id) {
    for (size_t i = 0; i < sizeof fuse_counts / sizeof fuse_counts[0]; i++)
        if (!strcmp(fuse_counts[i].id, id)) return &fuse_counts[i];
    return NULL;
}

static void every_workload_in_every_mode_matches_eager(void **state) {
    (void)state;
    assert_int_equal(kw_count(), 10);
    for (int w = 0; w < kw_count(); w++) {
        const kw_def *d = kw_at(w);
        for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
            kw_case *c = kw_case_new(d->id, KW_SMALL, 42);
            assert_non_null(c);
            kl_fn *f = kw_case_compile(c, (kl_compile_mode)m);
            assert_non_null(f);
            char what[64] = "";
            int ok = kw_case_check(c, f, what, sizeof what);
            if (ok != 1) print_error("%s mode %d: %s %s\n", d->id, m, what, kl_last_error());
            assert_int_equal(ok, 1);
            /* and the timed path: eager, then compiled, the optimizer after each */
            kl_scope_begin();
            assert_int_equal(kw_case_run(c, NULL, NULL), 0);
            assert_int_equal(kw_case_run(c, f, NULL), 0);
            kl_scope_end();
            kl_fn_stats st;
            assert_int_equal(kl_fn_get_stats(f, &st), 0);
            assert_int_equal(st.traces, 1);
            assert_int_equal(st.eager_calls, 0);
            assert_true(st.library_calls <= st.kernels);
            if (m == KL_COMPILE_FUSE) {
                const expect *e = expected(d->id);
                assert_non_null(e);
                print_message("%-12s %-10s FUSE: %lld launches, %lld library calls\n", d->id, c->size_name,
                              (long long)st.kernels, (long long)st.library_calls);
                assert_int_equal(st.kernels, e->kernels);
                assert_int_equal(st.library_calls, e->library_calls);
            } else {
                assert_int_equal(st.library_calls, st.kernels); /* op by op: every launch is dispatched */
            }
            kl_fn_release(f);
            kw_case_free(c);
        }
    }
}

static void training_steps_move_their_parameters(void **state) {
    (void)state;
    const char *ids[] = {"mlp_step", "digits_step"};
    for (int i = 0; i < 2; i++) {
        kw_case *c = kw_case_new(ids[i], KW_SMALL, 1);
        assert_non_null(c);
        kl_tensor *before = kl_clone(kl_params_get(c->params, 0));
        kl_fn *f = kw_case_compile(c, KL_COMPILE_FUSE);
        kl_tensor *out[KW_MAX_OUT];
        assert_int_equal(kw_case_run(c, f, out), 0);
        assert_int_equal(kl_optim_steps(c->opt), 1);
        assert_int_equal(kl_ndim(out[0]), 0); /* the loss */
        assert_int_equal(kl_allclose(before, kl_params_get(c->params, 0), 0, 0, true), 0);
        /* the step's input is an alias of the parameter: it sees the update */
        assert_int_equal(kl_equal(c->in[c->def->n_in - c->def->n_params], kl_params_get(c->params, 0)), 1);
        kl_fn_release(f);
        kw_case_free(c);
    }
}

static void sizes_and_floors_follow_workloads_md(void **state) {
    (void)state;
    kw_case *c = kw_case_new("chain5", KW_LARGE, 0);
    assert_non_null(c);
    assert_string_equal(c->size_name, "16777216");
    assert_true(c->standard);
    assert_true(c->floor_bytes == 8.0 * (1 << 24));
    kw_case_free(c);
    c = kw_case_new("layernorm", KW_MEDIUM, 0);
    assert_string_equal(c->size_name, "256x4096");
    assert_true(c->floor_bytes == 8.0 * 256 * 4096 + 8.0 * 4096);
    kw_case_free(c);
    c = kw_case_new("mlp", KW_MEDIUM, 0);
    assert_float_equal(c->flops, 4.29e9, 0.01e9);
    assert_true(c->def->matmul_heavy);
    kw_case_free(c);
    c = kw_case_new("xent", KW_SMALL, 0);
    assert_false(c->standard);
    assert_true(c->floor_bytes == 4.0 * 256 * 100 + 8.0 * 256 + 4);
    kw_case_free(c);
    /* inputs are randn with a fixed seed: equal seeds, equal inputs; never zeros */
    kw_case *a = kw_case_new("gelu", KW_SMALL, 7), *b = kw_case_new("gelu", KW_SMALL, 7);
    assert_int_equal(kl_equal(a->in[0], b->in[0]), 1);
    assert_true(kl_item(kl_sum(kl_abs(a->in[0]), 0, NULL, false)) > 0);
    kw_case_free(a);
    kw_case_free(b);
}

static void bad_names_are_errors(void **state) {
    (void)state;
    assert_null(kw_find("chain6"));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown workload \"chain6\" (known: chain5, gelu,");
    assert_null(kw_case_new("nope", KW_SMALL, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown workload");
    assert_null(kw_case_new("gelu", (kw_size)7, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid size 7");
    assert_int_equal(kw_size_parse("huge"), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown size \"huge\"");
    assert_int_equal(kw_size_parse("medium"), KW_MEDIUM);
    assert_string_equal(kw_size_name(KW_LARGE), "large");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(every_workload_in_every_mode_matches_eager),
        KT_TEST(training_steps_move_their_parameters),
        KT_TEST(sizes_and_floors_follow_workloads_md),
        KT_TEST(bad_names_are_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
