/*
 * test_sortops.c — issue 16's sorting, sampling and reordering ops beyond the
 * PyTorch fixtures (test_fixtures.c) and gradchecks (grad_shape.c): sort's
 * stable ties and NaN order on long rows and any thread count, topk's
 * documented tie order, multinomial's statistics with a fixed seed
 * (chi-square bounds, distinct draws without replacement, zero-probability
 * categories never drawn, reproducibility), the error paths with their
 * messages, Meta shapes, and every op inside a compiled function against
 * eager in each compile mode.
 */
#include "harness.h"

#include <stdlib.h>

static kl_tensor *f32v(int64_t n, const float *v) { return kl_from_data(v, 1, &n, KL_F32); }

/* Ties keep their input order and NaN sorts last, on a row long enough to be
 * split across threads, with the same result on 1 and 2 threads. */
static void sort_stable_nan_threads(void **s) {
    (void)s;
    int64_t n = 50000;
    kl_tensor *x = kl_remainder_scalar(kl_arange(0, (double)n, 1, KL_F32), 7); /* many ties */
    x = kl_masked_fill(x, kl_eq_scalar(kl_remainder_scalar(kl_arange(0, (double)n, 1, KL_I64), 1000), 3), NAN);
    x = kl_reshape(kl_expand(kl_unsqueeze(x, 0), 2, (int64_t[]){3, n}), 2, (int64_t[]){3, n});
    kl_tensor *v[2], *i[2];
    int threads = kl_get_num_threads();
    for (int t = 0; t < 2; t++) {
        kl_set_num_threads(t ? 2 : 1);
        assert_int_equal(kl_sort(x, 1, t == 1, false, &v[t], &i[t]), 0);
    }
    kl_set_num_threads(threads);
    /* ascending: value first, then position; descending: NaN first, then value descending */
    const int64_t *ia = kl_data_ptr(kl_contiguous(i[0]));
    const float *va = kl_data_ptr(kl_contiguous(v[0]));
    for (int64_t k = 1; k < n; k++) {
        bool nan0 = isnan(va[k - 1]), nan1 = isnan(va[k]);
        assert_false(nan0 && !nan1);
        if (!nan0 && !nan1) assert_true(va[k - 1] < va[k] || (va[k - 1] == va[k] && ia[k - 1] < ia[k]));
        if (nan0 && nan1) assert_true(ia[k - 1] < ia[k]);
    }
    const int64_t *id = kl_data_ptr(kl_contiguous(i[1]));
    const float *vd = kl_data_ptr(kl_contiguous(v[1]));
    assert_true(isnan(vd[0]));
    for (int64_t k = 1; k < n; k++)
        if (vd[k - 1] == vd[k] || (isnan(vd[k - 1]) && isnan(vd[k]))) assert_true(id[k - 1] < id[k]);
    /* every row is the same row: same answer; and kl_argsort is kl_sort's indices */
    kl_tensor *rows_equal = kl_eq(kl_select(i[0], 0, 0), kl_select(i[0], 0, 2));
    assert_true(kl_item(kl_all(rows_equal, KL_ALL_DIMS, false)) == 1);
    assert_int_equal(kl_equal(kl_argsort(x, -1, true, true), i[1]), 1);
    /* the same sort on 1 thread and 2 threads */
    kl_set_num_threads(1);
    kl_tensor *v1, *i1;
    assert_int_equal(kl_sort(x, 1, false, true, &v1, &i1), 0);
    kl_set_num_threads(threads);
    assert_int_equal(kl_equal(i1, i[0]), 1);
}

/* topk: PyTorch's values; among equal values the lower index comes first. */
static void topk_ties_and_nan(void **s) {
    (void)s;
    kl_tensor *x = f32v(6, (const float[]){2, 1, 2, NAN, 1, 2}), *v, *i;
    assert_int_equal(kl_topk(x, 3, 0, true, true, &v, &i), 0);
    KT_VALUES(i, 0, 3, 0, 2);
    assert_true(isnan(kt_get(v, 0)));
    assert_int_equal(kl_topk(x, 2, 0, false, false, &v, &i), 0);
    KT_VALUES(i, 0, 1, 4);
    KT_VALUES(v, 0, 1, 1);
    assert_int_equal(kl_topk(kl_to_dtype(x, KL_I64), 2, -1, true, true, &v, &i), 0); /* NaN -> 0 as int64 */
    KT_VALUES(i, 0, 0, 2);
}

static void sort_topk_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(2, 3), KL_F32), *v = x, *i = x;
    assert_int_equal(kl_sort(x, 2, false, true, &v, &i), -1);
    assert_null(v);
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_sort");
    assert_int_equal(kl_topk(x, 4, 1, true, true, &v, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_topk: k = 4 is out of range for dim 1 of size 3 of [2,3] float32");
    assert_int_equal(kl_topk(x, -1, 0, true, true, &v, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "k = -1");
    assert_int_equal(kl_sort(x, 0, false, true, NULL, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_sort: values and indices must not be NULL");
    assert_int_equal(kl_sort(NULL, 0, false, true, &v, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_sort");
    assert_null(kl_argsort(x, 5, false, true));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_sort");
}

/* chi-square of counts against probabilities p (sum 1) over categories with p > 0 */
static double chi2(const int64_t *count, const double *p, int n, int64_t total) {
    double c = 0;
    for (int k = 0; k < n; k++)
        if (p[k] > 0) c += (count[k] - total * p[k]) * (count[k] - total * p[k]) / (total * p[k]);
    return c;
}

static void multinomial_with_replacement(void **s) {
    (void)s;
    const double p[] = {0.1, 0.2, 0, 0.3, 0.4};
    kl_tensor *probs = kl_mul_scalar(kl_from_data(p, 1, (int64_t[]){5}, KL_F64), 3); /* unnormalized */
    kl_manual_seed(7);
    kl_tensor *y = kl_multinomial(probs, 20000, true);
    assert_int_equal(kl_dtype_of(y), KL_I64);
    kt_assert_shape(y, KL_SHAPE(20000));
    int64_t count[5] = {0};
    const int64_t *d = kl_data_ptr(y);
    for (int k = 0; k < 20000; k++) {
        assert_true(d[k] >= 0 && d[k] < 5);
        count[d[k]]++;
    }
    assert_int_equal(count[2], 0); /* zero probability: never drawn */
    /* 3 degrees of freedom: P(chi2 > 25) < 2e-5 */
    double c = chi2(count, p, 5, 20000);
    if (c > 25) print_error("chi2 = %g (counts %lld %lld %lld %lld)\n", c, (long long)count[0], (long long)count[1],
                            (long long)count[3], (long long)count[4]);
    assert_true(c < 25);
    /* the same seed draws the same samples, the next call others; f32 and 2-D rows agree with f64 and 1-D */
    kl_manual_seed(7);
    assert_int_equal(kl_equal(kl_multinomial(probs, 20000, true), y), 1);
    assert_int_equal(kl_equal(kl_multinomial(probs, 20000, true), y), 0);
    kl_manual_seed(7);
    kl_tensor *y2 = kl_multinomial(kl_unsqueeze(kl_to_dtype(probs, KL_F32), 0), 20000, true);
    assert_int_equal(kl_equal(kl_reshape(y2, 1, (int64_t[]){-1}), y), 1);
}

static void multinomial_without_replacement(void **s) {
    (void)s;
    const double p[] = {0.05, 0.3, 0, 0.15, 0.25, 0.25};
    int64_t rows = 4000;
    kl_tensor *probs = kl_expand(kl_from_data(p, 2, (int64_t[]){1, 6}, KL_F64), 2, (int64_t[]){rows, 6});
    kl_manual_seed(11);
    kl_tensor *y = kl_contiguous(kl_multinomial(probs, 5, false));
    kt_assert_shape(y, KL_SHAPE(rows, 5));
    const int64_t *d = kl_data_ptr(y);
    int64_t first[6] = {0};
    for (int64_t r = 0; r < rows; r++) {
        int seen = 0;
        for (int k = 0; k < 5; k++) {
            int64_t c = d[r * 5 + k];
            assert_true(c >= 0 && c < 6 && c != 2); /* zero probability: never drawn */
            assert_false(seen & (1 << c));         /* distinct within a row */
            seen |= 1 << c;
        }
        first[d[r * 5]]++;
    }
    /* the first draw of each row follows p (4 degrees of freedom: P(chi2 > 30) < 5e-6) */
    double c = chi2(first, p, 6, rows);
    if (c > 30) print_error("chi2 = %g\n", c);
    assert_true(c < 30);
}

static void multinomial_errors(void **s) {
    (void)s;
    assert_null(kl_multinomial(f32v(3, (const float[]){0.2f, -0.1f, 0.5f}), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 0: probability 1 is -0.1 (must be finite and >= 0)");
    assert_null(kl_multinomial(f32v(2, (const float[]){NAN, 0.5f}), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "probability 0 is nan");
    assert_null(kl_multinomial(f32v(2, (const float[]){INFINITY, 0.5f}), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "probability 0 is inf");
    assert_null(kl_multinomial(kl_zeros(KL_SHAPE(2, 3), KL_F32), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "row 0: the probabilities sum to 0");
    assert_null(kl_multinomial(f32v(3, (const float[]){0.2f, 0, 0.5f}), 3, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "only 2 categories have non-zero probability, too few for 3 samples");
    assert_null(kl_multinomial(f32v(3, (const float[]){0.2f, 0.1f, 0.5f}), 4, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "cannot draw 4 samples from 3 categories without replacement");
    assert_null(kl_multinomial(f32v(3, (const float[]){0.2f, 0.1f, 0.5f}), 0, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "num_samples must be positive");
    assert_null(kl_multinomial(kl_ones(KL_SHAPE(3), KL_I64), 1, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_multinomial: expects floating-point tensors");
    assert_null(kl_multinomial(kl_ones(KL_SHAPE(2, 2, 2), KL_F32), 1, true));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "probabilities must be 1-D or 2-D");
    assert_null(kl_multinomial(NULL, 1, true));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "multinomial");
}

static void one_hot_and_reorder_errors(void **s) {
    (void)s;
    kl_tensor *ix = kl_from_data((const int64_t[]){0, 3}, 1, (int64_t[]){2}, KL_I64);
    assert_null(kl_one_hot(ix, 3));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_one_hot: class value 3 is out of range [0, 3)");
    assert_null(kl_one_hot(kl_neg(ix), -1));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "class value -3 is out of range");
    assert_null(kl_one_hot(kl_to_dtype(ix, KL_I32), 4));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_one_hot: class indices must be int64");
    assert_null(kl_one_hot(kl_zeros(KL_SHAPE(0), KL_I64), -1));
    KT_EXPECT_ERROR(KL_ERR_ARG, "cannot infer num_classes from the empty tensor");
    assert_null(kl_one_hot(ix, -2));
    KT_EXPECT_ERROR(KL_ERR_ARG, "num_classes must be -1");
    kl_tensor *oh = kl_one_hot(ix, -1);
    kt_assert_shape(oh, KL_SHAPE(2, 4));
    KT_VALUES(oh, 0, 1, 0, 0, 0, 0, 0, 0, 1);
    kl_tensor *x = kl_zeros(KL_SHAPE(2, 3), KL_F32);
    assert_null(kl_flip(x, 2, (int64_t[]){1, -1}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_flip: dim 1 appears more than once");
    assert_null(kl_flip(x, 1, (int64_t[]){2}));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_flip");
    assert_null(kl_roll(x, 2, (int64_t[]){1, 1}, NULL));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_roll: without dims, shifts must have one element");
    assert_null(kl_roll(x, 1, (int64_t[]){1}, (int64_t[]){3}));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_roll");
    assert_null(kl_roll(x, 0, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_roll: needs 1 to 8 shifts");
}

static void einsum_errors_name_the_equation(void **s) {
    (void)s;
    kl_tensor *a = kl_ones(KL_SHAPE(3, 3), KL_F32), *b = kl_ones(KL_SHAPE(3, 4), KL_F32);
    assert_null(kl_einsum("ii,jj->ij", 2, (kl_tensor *[]){a, a}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_einsum: \"ii,jj->ij\": repeated subscripts within an operand");
    assert_null(kl_einsum("...ij,...jk->...ik", 2, (kl_tensor *[]){a, b}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "\"...ij,...jk->...ik\": ellipses (...) are not supported");
    assert_null(kl_einsum("ij,jk,kl->il", 3, (kl_tensor *[]){a, b, b}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "\"ij,jk,kl->il\": only one- and two-operand equations are supported");
    assert_null(kl_einsum("ij,jk->ik", 2, (kl_tensor *[]){b, b}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "subscript 'j' has size 4 in operand 0 and 3 in operand 1");
    assert_null(kl_einsum("ij,jk->iz", 2, (kl_tensor *[]){a, b}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "output subscript 'z' appears in no operand");
    assert_null(kl_einsum("ijk,jk->ik", 2, (kl_tensor *[]){a, b}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "operand 0 has 2 dims but 3 subscripts");
    assert_null(kl_einsum("iij->j", 1, (kl_tensor *[]){kl_ones(KL_SHAPE(2, 2, 3), KL_F32)}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "\"iij->j\": repeated subscripts are supported only as");
    assert_null(kl_einsum("ij,jk", 1, &a));
    KT_EXPECT_ERROR(KL_ERR_ARG, "2 terms for 1 operands");
    assert_null(kl_einsum(NULL, 1, &a));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "equation is NULL");
    assert_null(kl_baddbmm(kl_ones(KL_SHAPE(3, 3, 4), KL_F32), kl_ones(KL_SHAPE(2, 3, 5), KL_F32),
                           kl_ones(KL_SHAPE(2, 5, 4), KL_F32), 1, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_baddbmm: self [3,3,4] float32 cpu does not broadcast to the product's shape [2,3,4]");
    assert_null(kl_outer(a, b));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_outer: expects two 1-D tensors");
}

static void meta_shapes(void **s) {
    (void)s;
    kl_device M = KL_DEVICE_META;
    kl_tensor *x = kl_empty_on(KL_SHAPE(2, 3, 4), KL_F32, M), *v, *i;
    assert_int_equal(kl_sort(x, 1, false, true, &v, &i), 0);
    kt_assert_shape(i, KL_SHAPE(2, 3, 4));
    assert_int_equal(kl_dtype_of(i), KL_I64);
    assert_int_equal(kl_topk(x, 2, -1, true, true, &v, &i), 0);
    kt_assert_shape(v, KL_SHAPE(2, 3, 2));
    kt_assert_shape(kl_argsort(x, 0, false, false), KL_SHAPE(2, 3, 4));
    kt_assert_shape(kl_flip(x, 2, (int64_t[]){0, 2}), KL_SHAPE(2, 3, 4));
    kt_assert_shape(kl_roll(x, 1, (int64_t[]){5}, NULL), KL_SHAPE(2, 3, 4));
    kt_assert_shape(kl_one_hot(kl_empty_on(KL_SHAPE(5), KL_I64, M), 7), KL_SHAPE(5, 7));
    assert_null(kl_one_hot(kl_empty_on(KL_SHAPE(5), KL_I64, M), -1)); /* needs data */
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "meta");
    kl_tensor *y = kl_multinomial(kl_empty_on(KL_SHAPE(3, 6), KL_F32, M), 4, false);
    kt_assert_shape(y, KL_SHAPE(3, 4));
    assert_int_equal(kl_device_of(y).type, KL_META);
    kt_assert_shape(kl_outer(kl_empty_on(KL_SHAPE(3), KL_F32, M), kl_empty_on(KL_SHAPE(5), KL_F32, M)), KL_SHAPE(3, 5));
    kt_assert_shape(kl_baddbmm(kl_empty_on(KL_SHAPE(6), KL_F32, M), x, kl_empty_on(KL_SHAPE(2, 4, 6), KL_F32, M), 1, 1),
                    KL_SHAPE(2, 3, 6));
    kt_assert_shape(kl_einsum("bij,bkj->bki", 2, (kl_tensor *[]){x, kl_empty_on(KL_SHAPE(2, 5, 4), KL_F32, M)}),
                    KL_SHAPE(2, 5, 3));
}

/* Every op of the issue in one function: compiled equals eager. */
static int all_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0], *v, *i, *tv, *ti;
    if (kl_sort(x, 1, true, true, &v, &i) || kl_topk(kl_exp(x), 3, -1, false, true, &tv, &ti)) return -1;
    out[0] = kl_add(kl_add(kl_flip(v, 1, (int64_t[]){0}), kl_roll(v, 2, (int64_t[]){1, 3}, (int64_t[]){0, 1})),
                    kl_sum(tv, KL_ALL_DIMS, false));
    out[1] = kl_add(kl_argsort(x, 0, false, true), kl_one_hot(kl_select(ti, 1, 0), 8));
    out[2] = kl_baddbmm(in[1], kl_einsum("bij->bji", 1, &in[2]), kl_reshape(x, 3, (int64_t[]){2, 4, 6}), 0.5, 2);
    out[3] = kl_einsum("ij,kj->ik", 2, (kl_tensor *[]){kl_outer(kl_select(x, 0, 0), kl_select(x, 0, 1)), x});
    out[4] = kl_multinomial(kl_softmax(x, -1), 5, false);
    return out[0] && out[1] && out[2] && out[3] && out[4] ? 0 : -1;
}

static void compiled_equals_eager(void **s) {
    (void)s;
    kl_manual_seed(5);
    kl_tensor *in[3] = {kl_randn(KL_SHAPE(6, 8), KL_F32), kl_randn(KL_SHAPE(1, 6), KL_F32),
                        kl_randn(KL_SHAPE(2, 4, 3), KL_F32)}, *e[5], *c[5];
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        kl_compile_options o = kl_compile_options_default();
        o.mode = (kl_compile_mode)m;
        kl_fn *f = kl_compile(all_ops, NULL, &o);
        for (int call = 0; call < 2; call++) { /* the trace, then the cache */
            kl_manual_seed(100 + call);
            assert_int_equal(all_ops(NULL, in, 3, e, 5), 0);
            kl_manual_seed(100 + call);
            int rc = kl_fn_call(f, in, 3, c, 5);
            if (rc) print_error("mode %d: %s\n", m, kl_last_error());
            assert_int_equal(rc, 0);
            for (int k = 0; k < 5; k++) {
                int ok = m == KL_COMPILE_TRACE_ONLY || k != 2 ? kl_equal(c[k], e[k]) : kl_allclose(c[k], e[k], 1e-5, 1e-6, false);
                if (ok != 1) print_error("mode %d call %d: output %d differs from eager\n", m, call, k);
                assert_int_equal(ok, 1);
            }
        }
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.eager_calls, 0);
        kl_fn_release(f);
    }
}

/* one_hot with num_classes -1 reads data: a trace break, and the call runs eagerly. */
static int one_hot_inferred(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_one_hot(in[0], -1);
    return out[0] ? 0 : -1;
}

static void one_hot_inferred_breaks_the_trace(void **s) {
    (void)s;
    kl_tensor *ix = kl_from_data((const int64_t[]){2, 0, 1}, 1, (int64_t[]){3}, KL_I64), *y;
    kl_fn *f = kl_compile(one_hot_inferred, NULL, NULL);
    assert_int_equal(kl_fn_call(f, &ix, 1, &y, 1), 0);
    assert_int_equal(kl_equal(y, kl_one_hot(ix, 3)), 1);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_true(st.eager_calls >= 1);
    kl_fn_release(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(sort_stable_nan_threads),
        KT_TEST(topk_ties_and_nan),
        KT_TEST(sort_topk_errors),
        KT_TEST(multinomial_with_replacement),
        KT_TEST(multinomial_without_replacement),
        KT_TEST(multinomial_errors),
        KT_TEST(one_hot_and_reorder_errors),
        KT_TEST(einsum_errors_name_the_equation),
        KT_TEST(meta_shapes),
        KT_TEST(compiled_equals_eager),
        KT_TEST(one_hot_inferred_breaks_the_trace),
    };
    return cmocka_run_group_tests_name("sortops", tests, NULL, NULL);
}
