/*
 * test_reduce.c — reductions, scans and comparisons: values against PyTorch
 * 1.13 (hardcoded), result dtypes, dim lists and keepdim, non-contiguous and
 * broadcast inputs against a naive reference, empty reductions, NaN, integer
 * wrap-around, f32 summation accuracy, thread-count independence and the
 * error paths.
 */
#include "harness.h"

#include <stdlib.h>

/* x = arange(24) as [2,3,4] in dtype dt */
static kl_tensor *iota3(kl_dtype dt) { return kl_reshape(kl_arange(0, 24, 1, dt), KL_SHAPE(2, 3, 4)); }

/* y = (arange(24) - 11.5) * 0.37 as [2,3,4] f32 (the values torch saw) */
static kl_tensor *centered3(void) {
    return kl_mul_scalar(kl_add_scalar(iota3(KL_F32), -11.5), 0.37);
}

/* ---- a naive reference: any layout, logical order, double -------------------- */

enum { NV_SUM, NV_PROD, NV_MAX, NV_MIN, NV_ARGMAX, NV_ARGMIN };

/* Reduces x over the dims in mask into out[] (kept dims in order). */
static void naive_reduce(const kl_tensor *x, unsigned mask, int op, double *out, int64_t nout) {
    int nd = kl_ndim(x);
    const int64_t *shape = kl_shape(x);
    int64_t n = kl_numel(x);
    int64_t *pos = calloc((size_t)nout, sizeof *pos);
    for (int64_t o = 0; o < nout; o++)
        out[o] = op == NV_PROD ? 1 : op == NV_SUM ? 0 : NAN;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, o = 0, ostride = 1, r = 0, rstride = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t id = rem % shape[d];
            rem /= shape[d];
            if (mask >> d & 1) {
                r += id * rstride;
                rstride *= shape[d];
            } else {
                o += id * ostride;
                ostride *= shape[d];
            }
        }
        double v = kt_get(x, i), *a = &out[o];
        switch (op) {
        case NV_SUM: *a += v; break;
        case NV_PROD: *a *= v; break;
        default: {
            int first = isnan(*a) && pos[o] == 0 && r == 0;
            int better = (op == NV_MAX || op == NV_ARGMAX) ? v > *a : v < *a;
            if (first || (!isnan(*a) && (isnan(v) || better))) {
                *a = v;
                pos[o] = r;
            }
        }
        }
    }
    if (op == NV_ARGMAX || op == NV_ARGMIN)
        for (int64_t o = 0; o < nout; o++) out[o] = (double)pos[o];
    free(pos);
}

/* Checks sum/prod/amax/amin/max_dim/argmin of x over every single dim and
 * some dim lists against the naive reference. */
static void check_layout(kl_tensor *x, double tol) {
    int nd = kl_ndim(x);
    double *want = malloc(sizeof(double) * (size_t)(kl_numel(x) + 1));
    for (unsigned mask = 1; mask < (1u << nd); mask++) {
        int64_t dims[KL_MAX_DIMS], nout = 1;
        int nr = 0;
        for (int d = 0; d < nd; d++) {
            if (mask >> d & 1) dims[nr++] = d - (d % 2 ? nd : 0); /* mix in negative dims */
            else nout *= kl_shape(x)[d];
        }
        kl_scope_begin();
        naive_reduce(x, mask, NV_SUM, want, nout);
        kt_assert_values(kl_sum(x, nr, dims, false), want, nout, tol);
        if (kl_numel(x) / nout <= 12) { /* longer products of these values leave f32's range */
            naive_reduce(x, mask, NV_PROD, want, nout);
            kt_assert_values(kl_prod(x, nr, dims, false), want, nout, tol);
        }
        naive_reduce(x, mask, NV_MAX, want, nout);
        kt_assert_values(kl_amax(x, nr, dims, true), want, nout, 0);
        naive_reduce(x, mask, NV_MIN, want, nout);
        kt_assert_values(kl_amin(x, nr, dims, false), want, nout, 0);
        if (nr == 1) {
            kl_tensor *v, *i;
            assert_int_equal(kl_max_dim(x, (int)dims[0], false, &v, &i), 0);
            naive_reduce(x, mask, NV_MAX, want, nout);
            kt_assert_values(v, want, nout, 0);
            naive_reduce(x, mask, NV_ARGMAX, want, nout);
            kt_assert_values(i, want, nout, 0);
            naive_reduce(x, mask, NV_ARGMIN, want, nout);
            kt_assert_values(kl_argmin(x, (int)dims[0], false), want, nout, 0);
        }
        kl_scope_end();
    }
    naive_reduce(x, (1u << nd) - 1, NV_ARGMAX, want, 1);
    kt_assert_values(kl_argmax(x, KL_DIM_NONE, false), want, 1, 0);
    free(want);
}

/* Small integers with ties, so sums are exact and argmax has to pick the first. */
static kl_tensor *ties(int ndim, const int64_t *shape, kl_dtype dt) {
    kl_manual_seed(7);
    return kl_to_dtype(kl_randint(-3, 4, ndim, shape, KL_I64), dt);
}

/* ---- values against PyTorch ---------------------------------------------------- */

static void sum_dims_keepdim(void **s) {
    (void)s;
    kl_tensor *x = iota3(KL_F32);
    kl_tensor *t = kl_sum(x, KL_ALL_DIMS, false);
    kt_assert_shape(t, 0, NULL);
    KT_VALUES(t, 0, 276);
    t = kl_sum(x, KL_ALL_DIMS, true);
    kt_assert_shape(t, 3, (int64_t[]){1, 1, 1});
    t = kl_sum(x, KL_DIMS(0), false);
    kt_assert_shape(t, 2, (int64_t[]){3, 4});
    KT_VALUES(t, 0, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34);
    t = kl_sum(x, KL_DIMS(-2), true);
    kt_assert_shape(t, 3, (int64_t[]){2, 1, 4});
    KT_VALUES(t, 0, 12, 15, 18, 21, 48, 51, 54, 57);
    t = kl_sum(x, KL_DIMS(2), false);
    KT_VALUES(t, 0, 6, 22, 38, 54, 70, 86);
    t = kl_sum(x, KL_DIMS(-1, 0), false);
    kt_assert_shape(t, 1, (int64_t[]){3});
    KT_VALUES(t, 0, 60, 92, 124);
    t = kl_sum(x, KL_DIMS(0, 1, 2), true);
    kt_assert_shape(t, 3, (int64_t[]){1, 1, 1});
    KT_VALUES(t, 0, 276);
    /* a 0-dim tensor reduces over dim 0 / -1 as PyTorch */
    kl_tensor *z = kl_scalar_tensor(3, KL_F32);
    KT_VALUES(kl_sum(z, KL_DIMS(0), false), 0, 3);
    KT_VALUES(kl_sum(z, KL_DIMS(-1), true), 0, 3);
    kt_assert_shape(kl_sum(z, KL_ALL_DIMS, false), 0, NULL);
}

static void mean_prod_amax_amin(void **s) {
    (void)s;
    kl_tensor *y = centered3();
    KT_VALUES(kl_mean(y, KL_DIMS(0, 2), false), 1e-6, -1.4800001382827759, 0.0, 1.4800000190734863);
    KT_VALUES(kl_prod(kl_select(y, 0, 0), KL_DIMS(1), false), 1e-6, 182.7412567138672, 22.612926483154297,
              0.12299183756113052);
    kl_tensor *x = iota3(KL_F32);
    KT_VALUES(kl_amax(x, KL_DIMS(1), false), 0, 8, 9, 10, 11, 20, 21, 22, 23);
    KT_VALUES(kl_amin(x, KL_DIMS(0, 1), false), 0, 0, 1, 2, 3);
    kt_assert_shape(kl_amax(x, KL_DIMS(1), true), 3, (int64_t[]){2, 1, 4});
    /* amax keeps integer dtypes */
    kl_tensor *i = kl_amax(iota3(KL_I32), KL_DIMS(-1), false);
    assert_int_equal(kl_dtype_of(i), KL_I32);
    KT_VALUES(i, 0, 3, 7, 11, 15, 19, 23);
}

static void max_min_dim_and_arg(void **s) {
    (void)s;
    /* ties go to the first position; a NaN beats every number */
    kl_tensor *a = kl_from_data((float[]){1, NAN, 2, 5, 3, 5}, KL_SHAPE(2, 3), KL_F32), *v, *i;
    assert_int_equal(kl_max_dim(a, 1, false, &v, &i), 0);
    KT_VALUES(v, 0, NAN, 5);
    KT_VALUES(i, 0, 1, 0);
    assert_int_equal(kl_dtype_of(i), KL_I64);
    assert_int_equal(kl_min_dim(a, -1, true, &v, &i), 0);
    kt_assert_shape(v, 2, (int64_t[]){2, 1});
    KT_VALUES(v, 0, NAN, 3);
    KT_VALUES(i, 0, 1, 1);
    assert_int_equal(kl_max_dim(a, 0, false, &v, &i), 0);
    KT_VALUES(v, 0, 5, NAN, 5);
    KT_VALUES(i, 0, 1, 0, 1);
    kl_tensor *c = kl_from_data((float[]){3, 1, 3, 1}, KL_SHAPE(4), KL_F32);
    KT_VALUES(kl_argmax(c, KL_DIM_NONE, false), 0, 0);
    KT_VALUES(kl_argmin(c, 0, false), 0, 1);
    /* flattened index over all dims; keepdim gives all ones */
    kl_tensor *x = iota3(KL_F32);
    KT_VALUES(kl_argmax(x, KL_DIM_NONE, false), 0, 23);
    kl_tensor *k = kl_argmax(x, KL_DIM_NONE, true);
    kt_assert_shape(k, 3, (int64_t[]){1, 1, 1});
    KT_VALUES(kl_argmin(x, 2, true), 0, 0, 0, 0, 0, 0, 0);
    /* a 0-dim input: value and index 0 */
    assert_int_equal(kl_max_dim(kl_scalar_tensor(3, KL_F32), 0, false, &v, &i), 0);
    kt_assert_shape(i, 0, NULL);
    KT_VALUES(v, 0, 3);
    KT_VALUES(i, 0, 0);
    /* bool works for max_dim (not for argmax, see errors) */
    kl_tensor *b = kl_from_data((uint8_t[]){0, 1, 1}, KL_SHAPE(3), KL_BOOL);
    assert_int_equal(kl_min_dim(b, 0, false, &v, &i), 0);
    assert_int_equal(kl_dtype_of(v), KL_BOOL);
    KT_VALUES(i, 0, 0);
    /* the first NaN of a long row, past the vector lanes */
    kl_tensor *big = kl_zeros(KL_SHAPE(3000), KL_F64);
    double *d = kl_data_ptr(big);
    d[2500] = 7;
    d[2999] = 7;
    KT_VALUES(kl_argmax(big, 0, false), 0, 2500);
    d[1777] = NAN;
    d[2222] = NAN;
    KT_VALUES(kl_argmax(big, 0, false), 0, 1777);
    KT_VALUES(kl_argmin(big, 0, false), 0, 1777);
    KT_VALUES(kl_amax(big, KL_ALL_DIMS, false), 0, NAN);
}

static void var_std(void **s) {
    (void)s;
    kl_tensor *y = centered3();
    KT_VALUES(kl_var(y, KL_DIMS(1), 1, false), 1e-6, 2.1904001235961914, 2.1903998851776123, 2.1904001235961914,
              2.1903998851776123, 2.1903998851776123, 2.1904001235961914, 2.1903998851776123, 2.1904001235961914);
    KT_VALUES(kl_var(y, KL_ALL_DIMS, 0, false), 1e-6, 6.5597920417785645);
    KT_VALUES(kl_std(y, KL_DIMS(0, 2), 1, false), 1e-6, 2.4141311645507812, 2.4141311645507812, 2.4141311645507812);
    /* correction >= N divides by zero: inf, or nan for a zero sum of squares */
    KT_VALUES(kl_var(y, KL_DIMS(1), 5, false), 0, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY,
              INFINITY, INFINITY);
    KT_VALUES(kl_var(kl_ones(KL_SHAPE(1), KL_F32), KL_DIMS(0), 1, false), 0, NAN);
    /* f64 and f16 keep their dtype */
    kl_tensor *v = kl_var(kl_to_dtype(y, KL_F64), KL_ALL_DIMS, 0, false);
    assert_int_equal(kl_dtype_of(v), KL_F64);
    KT_VALUES(v, 1e-12, 6.559791863312327); /* the exact variance of the f32 values */
    kl_tensor *h = kl_std(kl_from_data((float[]){1, 2}, KL_SHAPE(2), KL_F32), KL_ALL_DIMS, 1, false);
    KT_VALUES(h, 1e-6, 0.70710678);
    assert_int_equal(kl_dtype_of(kl_var(kl_to_dtype(y, KL_F16), KL_ALL_DIMS, 1, false)), KL_F16);
}

static void logsumexp_values(void **s) {
    (void)s;
    kl_tensor *y = centered3();
    KT_VALUES(kl_logsumexp(y, KL_DIMS(-1), false), 1e-6, -2.2297470569610596, -0.7497469782829285,
              0.7302531003952026, 2.2102530002593994, 3.6902530193328857, 5.170253276824951);
    KT_VALUES(kl_logsumexp(y, KL_DIMS(0, 1), false), 1e-6, 3.4031622409820557, 3.773162364959717,
              4.143162250518799, 4.513162612915039);
    /* max-subtracted: no overflow or underflow */
    KT_VALUES(kl_logsumexp(kl_from_data((float[]){1000, 1000}, KL_SHAPE(2), KL_F32), KL_DIMS(0), false), 1e-6,
              1000.6931762695312);
    KT_VALUES(kl_logsumexp(kl_from_data((float[]){-1000, -1000}, KL_SHAPE(2), KL_F32), KL_DIMS(0), false), 1e-6,
              -999.3068237304688);
    /* infinities and NaN as PyTorch */
    kl_tensor *e = kl_from_data((float[]){-INFINITY, -INFINITY, INFINITY, 1, INFINITY, -INFINITY, NAN, 1},
                                KL_SHAPE(4, 2), KL_F32);
    KT_VALUES(kl_logsumexp(e, KL_DIMS(1), false), 0, -INFINITY, INFINITY, INFINITY, NAN);
    /* integers promote to the default float dtype (torch.logsumexp does) */
    kl_tensor *i = kl_logsumexp(kl_from_data((int32_t[]){1, 2}, KL_SHAPE(2), KL_I32), KL_ALL_DIMS, false);
    assert_int_equal(kl_dtype_of(i), KL_F32);
    KT_VALUES(i, 1e-6, 2.3132617);
}

static void norm_values(void **s) {
    (void)s;
    kl_tensor *v = kl_from_data((float[]){3, -4, 0, 1.5, -2, 0, 0, 0.5}, KL_SHAPE(2, 4), KL_F32);
    struct {
        double p, row0, row1, all;
    } cases[] = {
        {2, 5.220153331756592, 2.0615527629852295, 5.612485885620117},
        {1, 8.5, 2.5, 11},
        {INFINITY, 4, 2, 4},
        {-INFINITY, 0, 0, 0},
        {0, 3, 2, 5},
        {0.5, 24.56982421875, 4.499999523162842, 50.09972381591797},
        {-1, 0, 0, 0},
        {3, 4.552874565124512, 2.0103628635406494, 4.679951190948486},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kt_assert_values(kl_norm(v, cases[c].p, KL_DIMS(1), false), (double[]){cases[c].row0, cases[c].row1}, 2,
                         1e-6);
        kt_assert_values(kl_norm(v, cases[c].p, KL_ALL_DIMS, false), &cases[c].all, 1, 1e-6);
    }
    kl_tensor *n = kl_norm(kl_to_dtype(v, KL_BF16), 2, KL_DIMS(0), true);
    assert_int_equal(kl_dtype_of(n), KL_BF16);
    kt_assert_shape(n, 2, (int64_t[]){1, 4});
    KT_VALUES(kl_norm(kl_from_data((float[]){3, NAN}, KL_SHAPE(2), KL_F32), INFINITY, KL_ALL_DIMS, false), 0, NAN);
}

static void all_any(void **s) {
    (void)s;
    kl_tensor *f = kl_from_data((float[]){1, NAN, 0, 2, 3, 4}, KL_SHAPE(2, 3), KL_F32);
    kl_tensor *a = kl_all(f, KL_DIMS(1), false);
    assert_int_equal(kl_dtype_of(a), KL_BOOL);
    KT_VALUES(a, 0, 0, 1);
    KT_VALUES(kl_any(f, KL_DIMS(0), false), 0, 1, 1, 1);
    KT_VALUES(kl_all(f, KL_ALL_DIMS, false), 0, 0);
    KT_VALUES(kl_any(kl_zeros(KL_SHAPE(3, 300), KL_I64), KL_ALL_DIMS, false), 0, 0);
    /* uint8 stays uint8, as in PyTorch 1.13 */
    kl_tensor *u = kl_all(kl_from_data((uint8_t[]){1, 2}, KL_SHAPE(2), KL_U8), KL_ALL_DIMS, false);
    assert_int_equal(kl_dtype_of(u), KL_U8);
    KT_VALUES(u, 0, 1);
    kl_tensor *b = kl_from_data((uint8_t[]){1, 0, 1, 1}, KL_SHAPE(2, 2), KL_BOOL);
    KT_VALUES(kl_all(b, KL_DIMS(1), false), 0, 0, 1);
    KT_VALUES(kl_any(b, KL_DIMS(0), true), 0, 1, 1);
}

static void cumsum_cumprod(void **s) {
    (void)s;
    kl_tensor *x = iota3(KL_F32);
    kl_tensor *c = kl_cumsum(x, 1);
    kt_assert_shape(c, 3, (int64_t[]){2, 3, 4});
    KT_VALUES(c, 0, 0, 1, 2, 3, 4, 6, 8, 10, 12, 15, 18, 21, 12, 13, 14, 15, 28, 30, 32, 34, 48, 51, 54, 57);
    KT_VALUES(kl_cumsum(kl_select(x, 0, 0), -1), 0, 0, 1, 3, 6, 4, 9, 15, 22, 8, 17, 27, 38);
    kl_tensor *m = kl_from_data((float[]){1, 2, 3, 0.5, -2, 4}, KL_SHAPE(2, 3), KL_F32);
    KT_VALUES(kl_cumprod(m, 1), 0, 1, 2, 6, 0.5, -1, -4);
    KT_VALUES(kl_cumprod(m, 0), 0, 1, 2, 3, 0.5, -4, 12);
    /* a transposed input, scanned along both dims */
    kl_tensor *t = kl_t(m);
    KT_VALUES(kl_cumsum(t, 0), 0, 1, 0.5, 3, -1.5, 6, 2.5);
    KT_VALUES(kl_cumsum(t, 1), 0, 1, 1.5, 2, 0, 3, 7);
    /* integers and bool give int64; uint8 does not wrap at 256 */
    kl_tensor *u = kl_cumsum(kl_from_data((uint8_t[]){200, 100}, KL_SHAPE(2), KL_U8), 0);
    assert_int_equal(kl_dtype_of(u), KL_I64);
    KT_VALUES(u, 0, 200, 300);
    kl_tensor *b = kl_cumsum(kl_from_data((uint8_t[]){1, 0, 1}, KL_SHAPE(3), KL_BOOL), 0);
    assert_int_equal(kl_dtype_of(b), KL_I64);
    KT_VALUES(b, 0, 1, 1, 2);
    assert_int_equal(kl_dtype_of(kl_cumprod(kl_ones(KL_SHAPE(2), KL_I32), 0)), KL_I64);
    /* f16 keeps its dtype (accumulating in double) */
    kl_tensor *h = kl_cumsum(kl_to_dtype(kl_from_data((float[]){0.1f, 0.2f, 0.3f}, KL_SHAPE(3), KL_F32), KL_F16), 0);
    assert_int_equal(kl_dtype_of(h), KL_F16);
    KT_VALUES(h, 0, 0.0999755859375, 0.2998046875, 0.60009765625);
    /* 0-dim and empty */
    KT_VALUES(kl_cumsum(kl_scalar_tensor(4, KL_F32), -1), 0, 4);
    kt_assert_shape(kl_cumprod(kl_zeros(KL_SHAPE(0, 3), KL_F32), 0), 2, (int64_t[]){0, 3});
    /* a long line and many lines (the parallel paths) against a running sum */
    kl_tensor *big = kl_reshape(kl_arange(0, 3 * 50000, 1, KL_I32), KL_SHAPE(3, 50000));
    kl_tensor *cs = kl_cumsum(big, 1), *cs0 = kl_cumsum(kl_t(big), 0);
    const int64_t *p = kl_data_ptr(cs), *q = kl_data_ptr(cs0);
    for (int64_t r = 0; r < 3; r++) {
        int64_t run = 0;
        for (int64_t j = 0; j < 50000; j++) {
            run += r * 50000 + j;
            assert_int_equal(p[r * 50000 + j], run);
            assert_int_equal(q[j * 3 + r], run);
        }
    }
}

/* ---- layouts -------------------------------------------------------------------- */

static void noncontiguous_inputs(void **s) {
    (void)s;
    kl_tensor *x = ties(KL_SHAPE(4, 5, 6), KL_F32);
    check_layout(x, 0);
    check_layout(kl_permute(x, KL_DIMS(2, 0, 1)), 0);                 /* transposed */
    check_layout(kl_slice(kl_slice(x, 2, 1, 6, 2), 0, 0, 4, 3), 0);    /* sliced with steps */
    check_layout(kl_expand(kl_slice(x, 1, 2, 3, 1), KL_SHAPE(4, 7, 6)), 0); /* broadcast dim */
    check_layout(kl_expand(kl_reshape(kl_arange(0, 5, 1, KL_F32), KL_SHAPE(5, 1)), KL_SHAPE(3, 5, 4)), 0);
    /* dtypes the loops read through conversion buffers */
    check_layout(kl_permute(ties(KL_SHAPE(3, 4, 5), KL_F16), KL_DIMS(1, 2, 0)), 0);
    check_layout(kl_t(ties(KL_SHAPE(7, 9), KL_BF16)), 0);
    check_layout(kl_slice(ties(KL_SHAPE(6, 8), KL_I32), 1, 1, 8, 3), 0);
    check_layout(kl_transpose(ties(KL_SHAPE(5, 2, 3), KL_U8), 0, 2), 0);
    check_layout(ties(KL_SHAPE(4, 3), KL_I64), 0);
    check_layout(ties(KL_SHAPE(2, 3, 2, 3), KL_F64), 0);
}

static void large_layouts(void **s) {
    (void)s;
    /* big enough for the parallel and split paths, the cascade, column tiles
     * longer than a segment, rows longer than a chunk */
    kl_tensor *x = ties(KL_SHAPE(300, 700), KL_F32);
    check_layout(x, 0);
    check_layout(kl_t(x), 0);
    check_layout(kl_slice(x, 1, 3, 700, 4), 0);
    check_layout(ties(KL_SHAPE(3, 70000), KL_I32), 0);
    check_layout(kl_t(ties(KL_SHAPE(3, 70000), KL_F64)), 0);
    check_layout(ties(KL_SHAPE(200000), KL_F32), 0);
    check_layout(ties(KL_SHAPE(5000, 3), KL_F32), 0);
    /* var/mean of a column layout against the contiguous one */
    kl_tensor *r = kl_randn(KL_SHAPE(1000, 65), KL_F32);
    kl_tensor *rt = kl_contiguous(kl_t(r));
    assert_int_equal(kl_allclose(kl_var(r, KL_DIMS(0), 1, false), kl_var(rt, KL_DIMS(1), 1, false), 1e-5, 1e-6, false), 1);
    assert_int_equal(kl_allclose(kl_logsumexp(r, KL_DIMS(0), false), kl_logsumexp(rt, KL_DIMS(1), false), 1e-5, 1e-6,
                                 false), 1);
    assert_int_equal(kl_allclose(kl_norm(r, 3, KL_DIMS(0), false), kl_norm(rt, 3, KL_DIMS(1), false), 1e-5, 1e-6,
                                 false), 1);
}

static void thread_count_independent(void **s) {
    (void)s;
    kl_manual_seed(3);
    kl_tensor *x = kl_randn(KL_SHAPE(1 << 18), KL_F32), *m = kl_randn(KL_SHAPE(513, 1031), KL_F32);
    int nt = kl_get_num_threads();
    kl_tensor *r[2][5];
    for (int k = 0; k < 2; k++) {
        kl_set_num_threads(k ? 3 : 1);
        r[k][0] = kl_sum(x, KL_ALL_DIMS, false);
        r[k][1] = kl_sum(m, KL_DIMS(0), false);
        r[k][2] = kl_sum(m, KL_DIMS(1), false);
        r[k][3] = kl_var(x, KL_ALL_DIMS, 1, false);
        r[k][4] = kl_norm(kl_t(m), 2, KL_DIMS(1), false);
    }
    kl_set_num_threads(nt);
    for (int j = 0; j < 5; j++) {
        assert_int_equal(kl_numel(r[0][j]), kl_numel(r[1][j]));
        assert_memory_equal(kl_data_ptr(r[0][j]), kl_data_ptr(r[1][j]), (size_t)kl_numel(r[0][j]) * 4);
    }
}

static void meta_tensors(void **s) {
    (void)s;
    kl_tensor *x = kl_empty_on(KL_SHAPE(2, 3, 4), KL_I32, KL_DEVICE_META);
    kl_tensor *t = kl_sum(x, KL_DIMS(1), true);
    kt_assert_shape(t, 3, (int64_t[]){2, 1, 4});
    assert_int_equal(kl_dtype_of(t), KL_I64);
    kl_tensor *v, *i;
    assert_int_equal(kl_min_dim(x, 2, false, &v, &i), 0);
    assert_int_equal(kl_dtype_of(v), KL_I32);
    assert_int_equal(kl_dtype_of(i), KL_I64);
    assert_int_equal(kl_device_of(i).type, KL_META);
    assert_null(kl_mean(x, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_mean: expects a floating-point input, got [2,3,4] int32");
    assert_int_equal(kl_equal(x, x), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_equal: meta tensors hold no values");
}

/* ---- empty tensors, NaN, dtypes, wrap-around, precision ---------------------------- */

static void zero_size(void **s) {
    (void)s;
    kl_tensor *e = kl_zeros(KL_SHAPE(0, 3), KL_F32);
    KT_VALUES(kl_sum(e, KL_DIMS(0), false), 0, 0, 0, 0);
    KT_VALUES(kl_prod(e, KL_DIMS(0), false), 0, 1, 1, 1);
    KT_VALUES(kl_mean(e, KL_DIMS(0), false), 0, NAN, NAN, NAN);
    KT_VALUES(kl_var(e, KL_DIMS(0), 1, false), 0, NAN, NAN, NAN);
    KT_VALUES(kl_std(e, KL_DIMS(0), 0, false), 0, NAN, NAN, NAN);
    KT_VALUES(kl_logsumexp(e, KL_DIMS(0), false), 0, -INFINITY, -INFINITY, -INFINITY);
    KT_VALUES(kl_logsumexp(e, KL_ALL_DIMS, false), 0, -INFINITY);
    KT_VALUES(kl_norm(e, 2, KL_DIMS(0), false), 0, 0, 0, 0);
    KT_VALUES(kl_norm(e, 0, KL_DIMS(0), false), 0, 0, 0, 0);
    KT_VALUES(kl_norm(e, 3, KL_DIMS(0), false), 0, 0, 0, 0);
    KT_VALUES(kl_all(e, KL_DIMS(0), false), 0, 1, 1, 1);
    KT_VALUES(kl_any(e, KL_DIMS(0), false), 0, 0, 0, 0);
    KT_VALUES(kl_sum(kl_zeros(KL_SHAPE(0), KL_I32), KL_ALL_DIMS, false), 0, 0);
    /* reducing a non-empty dim of an empty tensor gives an empty result */
    kt_assert_shape(kl_amax(e, KL_DIMS(1), false), 1, (int64_t[]){0});
    kt_assert_shape(kl_sum(e, KL_DIMS(1), true), 2, (int64_t[]){0, 1});
    kl_tensor *v, *i;
    assert_int_equal(kl_min_dim(e, 1, false, &v, &i), 0);
    kt_assert_shape(i, 1, (int64_t[]){0});
    kt_assert_shape(kl_argmax(e, 1, false), 1, (int64_t[]){0});
    kt_assert_shape(kl_norm(e, INFINITY, KL_DIMS(1), false), 1, (int64_t[]){0});
    /* no identity: an error */
    assert_null(kl_amax(e, KL_DIMS(0), false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_amax: expected reduction dim 0 to have non-zero size");
    assert_null(kl_amin(e, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_amin: expected a reduction dim to be specified for an input with 0 elements");
    assert_null(kl_amax(kl_zeros(KL_SHAPE(3, 0), KL_F32), KL_DIMS(-1), false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_amax: expected reduction dim 1 to have non-zero size");
    assert_null(kl_argmax(e, KL_DIM_NONE, false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_argmax: expected a reduction dim to be specified");
    assert_null(kl_argmin(e, 0, false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_argmin: expected reduction dim 0 to have non-zero size");
    assert_int_equal(kl_max_dim(e, 0, false, &v, &i), -1);
    assert_null(v);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_max_dim: expected reduction dim 0 to have non-zero size");
    assert_null(kl_norm(e, INFINITY, KL_DIMS(0), false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_norm: cannot compute the inf norm over dim 0");
    assert_null(kl_norm(e, -INFINITY, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_norm: cannot compute the -inf norm of an empty tensor [0,3] float32 cpu");
    assert_null(kl_norm(e, -1, KL_DIMS(0), false)); /* 1/sum(|x|^-1) has no identity either */
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_norm: cannot compute the -1 norm over dim 0 of [0,3] float32 cpu");
}

static void nan_propagation(void **s) {
    (void)s;
    kl_tensor *a = kl_from_data((float[]){1, NAN, 2, 5, 3, 5}, KL_SHAPE(2, 3), KL_F32);
    KT_VALUES(kl_sum(a, KL_DIMS(1), false), 0, NAN, 13);
    KT_VALUES(kl_amax(a, KL_DIMS(1), false), 0, NAN, 5);
    KT_VALUES(kl_amin(a, KL_DIMS(0), false), 0, 1, NAN, 2);
    KT_VALUES(kl_mean(a, KL_ALL_DIMS, false), 0, NAN);
    /* NaN in a column layout and at the end of a row */
    kl_tensor *c = kl_zeros(KL_SHAPE(700, 5), KL_F32);
    ((float *)kl_data_ptr(c))[699 * 5 + 3] = NAN;
    KT_VALUES(kl_amax(c, KL_DIMS(0), false), 0, 0, 0, 0, NAN, 0);
    KT_VALUES(kl_amin(kl_t(c), KL_DIMS(1), false), 0, 0, 0, 0, NAN, 0);
    kl_tensor *v, *i;
    assert_int_equal(kl_max_dim(c, 0, false, &v, &i), 0);
    KT_VALUES(i, 0, 0, 0, 0, 699, 0);
}

static void result_dtypes(void **s) {
    (void)s;
    struct {
        kl_dtype in, sum, amax, all;
    } cases[] = {
        {KL_F32, KL_F32, KL_F32, KL_BOOL}, {KL_F64, KL_F64, KL_F64, KL_BOOL}, {KL_F16, KL_F16, KL_F16, KL_BOOL},
        {KL_BF16, KL_BF16, KL_BF16, KL_BOOL}, {KL_I32, KL_I64, KL_I32, KL_BOOL}, {KL_I64, KL_I64, KL_I64, KL_BOOL},
        {KL_U8, KL_I64, KL_U8, KL_U8}, {KL_BOOL, KL_I64, KL_BOOL, KL_BOOL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kl_tensor *x = kl_ones(KL_SHAPE(3, 2), cases[c].in);
        kl_tensor *sm = kl_sum(x, KL_DIMS(0), false), *p = kl_prod(x, KL_DIMS(0), false);
        assert_int_equal(kl_dtype_of(sm), cases[c].sum);
        assert_int_equal(kl_dtype_of(p), cases[c].sum);
        KT_VALUES(sm, 0, 3, 3);
        KT_VALUES(p, 0, 1, 1);
        assert_int_equal(kl_dtype_of(kl_amax(x, KL_ALL_DIMS, false)), cases[c].amax);
        assert_int_equal(kl_dtype_of(kl_amin(x, KL_ALL_DIMS, false)), cases[c].amax);
        assert_int_equal(kl_dtype_of(kl_all(x, KL_ALL_DIMS, false)), cases[c].all);
        assert_int_equal(kl_dtype_of(kl_any(x, KL_ALL_DIMS, false)), cases[c].all);
    }
    /* f16 / bf16 accumulate in f32 and round once */
    kl_tensor *h = kl_to_dtype(kl_from_data((float[]){0.1f, 0.2f, 0.3f, 1000}, KL_SHAPE(4), KL_F32), KL_F16);
    KT_VALUES(kl_sum(h, KL_ALL_DIMS, false), 0, 1000.5);
    KT_VALUES(kl_mean(h, KL_ALL_DIMS, false), 0, 250.125);
    kl_tensor *b = kl_to_dtype(kl_from_data((float[]){0.1f, 0.2f, 0.3f}, KL_SHAPE(3), KL_F32), KL_BF16);
    KT_VALUES(kl_sum(b, KL_ALL_DIMS, false), 0, 0.6015625);
    KT_VALUES(kl_mean(b, KL_ALL_DIMS, false), 0, 0.2001953125);
    assert_int_equal(kl_dtype_of(kl_argmax(h, 0, false)), KL_I64);
    assert_int_equal(kl_dtype_of(kl_norm(h, 1, KL_ALL_DIMS, false)), KL_F16);
}

static void integer_wraparound(void **s) {
    (void)s;
    const int64_t q = (int64_t)1 << 62;
    kl_tensor *big = kl_from_data((int64_t[]){q, q, q, q}, KL_SHAPE(4), KL_I64);
    KT_VALUES(kl_sum(big, KL_ALL_DIMS, false), 0, 0);
    kl_tensor *i32 = kl_sum(kl_from_data((int32_t[]){INT32_MAX, 1}, KL_SHAPE(2), KL_I32), KL_ALL_DIMS, false);
    assert_int_equal(kl_item_int(i32), 2147483648ll);
    assert_int_equal(kl_item_int(kl_prod(kl_from_data((int64_t[]){1ll << 40, 1ll << 40}, KL_SHAPE(2), KL_I64),
                                         KL_ALL_DIMS, false)),
                     0);
    assert_int_equal(kl_item_int(kl_prod(kl_from_data((int64_t[]){(1ll << 32) + 1, (1ll << 32) + 1}, KL_SHAPE(2),
                                                      KL_I64),
                                         KL_ALL_DIMS, false)),
                     8589934593ll);
    assert_int_equal(kl_item_int(kl_prod(kl_from_data((int32_t[]){-3, 5, 7}, KL_SHAPE(3), KL_I32), KL_ALL_DIMS, false)),
                     -105);
    assert_int_equal(
        kl_item_int(kl_prod(kl_from_data((uint8_t[]){100, 100, 100, 100}, KL_SHAPE(4), KL_U8), KL_ALL_DIMS, false)),
        100000000);
    kl_tensor *c = kl_cumsum(kl_from_data((int64_t[]){q + 5, q + 5, q + 5, q + 5}, KL_SHAPE(4), KL_I64), 0);
    const int64_t *p = kl_data_ptr(c);
    assert_int_equal(p[0], 4611686018427387909ll);
    assert_int_equal(p[1], -9223372036854775807ll - 1 + 10);
    assert_int_equal(p[2], -4611686018427387889ll);
    assert_int_equal(p[3], 20);
    /* min/max of extreme integers are exact */
    kl_tensor *e = kl_from_data((int64_t[]){INT64_MIN, INT64_MAX, 0}, KL_SHAPE(3), KL_I64);
    assert_int_equal(kl_item_int(kl_amin(e, KL_ALL_DIMS, false)), INT64_MIN);
    assert_int_equal(kl_item_int(kl_amax(e, KL_ALL_DIMS, false)), INT64_MAX);
}

static void f32_sum_precision(void **s) {
    (void)s;
    /* 2^24 values of 0.1f: a serial f32 sum stops growing at 2^21 */
    const int64_t n = (int64_t)1 << 24;
    kl_tensor *x = kl_full(KL_SHAPE(n), 0.1, KL_F32);
    double exact = (double)n * (double)0.1f;
    double got = kl_item(kl_sum(x, KL_ALL_DIMS, false));
    assert_true(fabs(got - exact) <= 1e-6 * exact);
    assert_true(fabs(kl_item(kl_mean(x, KL_ALL_DIMS, false)) - (double)0.1f) <= 1e-6 * 0.1);
    kl_release(x); /* the big temporaries go early: this test peaks near 200 MB */
    /* values around 0.1, against the f64 sum of the same values */
    kl_manual_seed(11);
    kl_tensor *r = kl_add_scalar(kl_mul_scalar(kl_rand(KL_SHAPE(n), KL_F32), 0.01), 0.095);
    kl_tensor *r64 = kl_to_dtype(r, KL_F64);
    double ref = kl_item(kl_sum(r64, KL_ALL_DIMS, false));
    kl_release(r64);
    assert_true(fabs(kl_item(kl_sum(r, KL_ALL_DIMS, false)) - ref) <= 1e-6 * ref);
    /* a column reduction over 2^20 rows and a strided row */
    kl_tensor *cols = kl_reshape(r, KL_SHAPE(1 << 20, 16));
    kl_tensor *c64 = kl_to_dtype(cols, KL_F64);
    kl_tensor *cs = kl_sum(cols, KL_DIMS(0), false), *cd = kl_sum(c64, KL_DIMS(0), false);
    kl_release(c64);
    for (int j = 0; j < 16; j++) assert_true(fabs(kt_get(cs, j) - kt_get(cd, j)) <= 1e-6 * kt_get(cd, j));
    kl_tensor *strided = kl_slice(r, 0, 0, n, 3);
    double sref = kl_item(kl_sum(kl_to_dtype(strided, KL_F64), KL_ALL_DIMS, false));
    assert_true(fabs(kl_item(kl_sum(strided, KL_ALL_DIMS, false)) - sref) <= 1e-6 * sref);
}

/* ---- comparisons -------------------------------------------------------------------- */

static void allclose_equal(void **s) {
    (void)s;
    kl_tensor *a = kl_from_data((float[]){1, 2, 3, 1, 2, 3}, KL_SHAPE(2, 3), KL_F32);
    kl_tensor *b = kl_from_data((float[]){1, 2, 3.00001f}, KL_SHAPE(3), KL_F32);
    assert_int_equal(kl_allclose(a, b, 1e-5, 1e-8, false), 1); /* broadcast */
    assert_int_equal(kl_allclose(a, b, 0, 0, false), 0);
    assert_int_equal(kl_allclose(kl_from_data((float[]){1.1f}, KL_SHAPE(1), KL_F32),
                                 kl_from_data((float[]){1}, KL_SHAPE(1), KL_F32), 0.1, 0, false),
                     0); /* |a-b| <= rtol*|b| is not symmetric */
    assert_int_equal(kl_allclose(kl_from_data((float[]){1}, KL_SHAPE(1), KL_F32),
                                 kl_from_data((float[]){1.1f}, KL_SHAPE(1), KL_F32), 0.1, 0, false),
                     1);
    kl_tensor *n = kl_from_data((double[]){NAN, INFINITY, -INFINITY}, KL_SHAPE(3), KL_F64);
    assert_int_equal(kl_allclose(n, n, 1e-5, 1e-8, false), 0);
    assert_int_equal(kl_allclose(n, n, 1e-5, 1e-8, true), 1);
    assert_int_equal(kl_allclose(kl_slice(n, 0, 1, 3, 1), kl_slice(n, 0, 1, 3, 1), 0, 0, false), 1);
    assert_int_equal(kl_allclose(kl_slice(n, 0, 1, 2, 1), kl_slice(n, 0, 2, 3, 1), 0, 1e300, false), 0);
    kl_tensor *i = kl_from_data((uint8_t[]){2}, KL_SHAPE(1), KL_U8), *j = kl_from_data((uint8_t[]){5}, KL_SHAPE(1), KL_U8);
    assert_int_equal(kl_allclose(i, j, 0, 3, false), 1);
    assert_int_equal(kl_allclose(i, j, 0, 2.9, false), 0);
    kl_tensor *l1 = kl_from_data((int64_t[]){(1ll << 62) + 1}, KL_SHAPE(1), KL_I64);
    kl_tensor *l2 = kl_from_data((int64_t[]){1ll << 62}, KL_SHAPE(1), KL_I64);
    assert_int_equal(kl_allclose(l1, l2, 0, 0, false), 0);
    assert_int_equal(kl_allclose(kl_zeros(KL_SHAPE(0, 3), KL_F32), kl_zeros(KL_SHAPE(3), KL_F32), 0, 0, false), 1);
    /* equal: same shape required (else 0), values after type promotion */
    assert_int_equal(kl_equal(a, a), 1);
    assert_int_equal(kl_equal(a, kl_ones(KL_SHAPE(3), KL_F32)), 0);
    assert_int_equal(kl_equal(kl_zeros(KL_SHAPE(0, 2), KL_F32), kl_zeros(KL_SHAPE(0, 3), KL_F32)), 0);
    assert_int_equal(kl_equal(kl_zeros(KL_SHAPE(0, 2), KL_F32), kl_zeros(KL_SHAPE(0, 2), KL_I32)), 1);
    assert_int_equal(kl_equal(kl_ones(KL_SHAPE(3), KL_F32), kl_ones(KL_SHAPE(3), KL_I32)), 1);
    assert_int_equal(kl_equal(kl_full(KL_SHAPE(1), 0.1, KL_F32), kl_full(KL_SHAPE(1), 0.1, KL_F64)), 0);
    assert_int_equal(kl_equal(l1, kl_full(KL_SHAPE(1), (double)(1ll << 62), KL_F32)), 1);
    assert_int_equal(kl_equal(l1, l2), 0);
    assert_int_equal(kl_equal(n, n), 0); /* NaN != NaN */
    assert_int_equal(kl_equal(kl_full(KL_SHAPE(1), 0.0, KL_F32), kl_full(KL_SHAPE(1), -0.0, KL_F32)), 1);
    kl_tensor *h = kl_to_dtype(kl_full(KL_SHAPE(1), 2048, KL_F32), KL_F16);
    assert_int_equal(kl_equal(h, kl_from_data((int64_t[]){2049}, KL_SHAPE(1), KL_I64)), 1); /* 2049 -> f16 2048 */
    kl_tensor *m = kl_reshape(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4));
    assert_int_equal(kl_equal(kl_t(m), kl_contiguous(kl_t(m))), 1);
    assert_int_equal(kl_equal(kl_t(m), kl_reshape(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(4, 3))), 0);
    /* errors */
    assert_int_equal(kl_allclose(a, kl_ones(KL_SHAPE(2), KL_F32), 1e-5, 1e-8, false), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_allclose: shapes [2,3] and [2] cannot broadcast");
    assert_int_equal(kl_allclose(a, kl_ones(KL_SHAPE(3), KL_F64), 1e-5, 1e-8, false), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_allclose: dtypes must match, got [2,3] float32 cpu and [3] float64 cpu");
    assert_int_equal(kl_allclose(a, a, -1, 0, false), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_allclose: rtol must be greater than or equal to zero, but got -1");
    assert_int_equal(kl_allclose(a, a, 0, NAN, false), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "atol must be greater than or equal to zero");
    assert_int_equal(kl_equal(NULL, a), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_equal: tensor argument 1 is NULL");
}

/* ---- errors --------------------------------------------------------------------------- */

static void reduce_errors(void **s) {
    (void)s;
    kl_tensor *x = iota3(KL_F32), *xi = iota3(KL_I32);
    assert_null(kl_sum(x, KL_DIMS(3), false));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_sum: dim 3 out of range for a tensor with 3 dims");
    assert_null(kl_amax(x, KL_DIMS(-4), false));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_amax: dim -4 out of range");
    assert_null(kl_sum(x, KL_DIMS(1, -2), false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_sum: dim 1 appears more than once in the dim list");
    assert_null(kl_sum(x, 17, (int64_t[17]){0}, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_sum: list of 17 values is too long");
    assert_null(kl_sum(x, 2, NULL, false));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_sum: list pointer is NULL");
    assert_null(kl_mean(xi, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_mean: expects a floating-point input, got [2,3,4] int32 cpu");
    assert_null(kl_var(xi, KL_DIMS(0), 1, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_var: expects a floating-point input");
    assert_null(kl_std(kl_ones(KL_SHAPE(2), KL_BOOL), KL_ALL_DIMS, 1, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_std: expects a floating-point input, got [2] bool cpu");
    assert_null(kl_norm(xi, 2, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_norm: expects a floating-point input");
    assert_null(kl_argmax(kl_ones(KL_SHAPE(2), KL_BOOL), KL_DIM_NONE, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_argmax: not implemented for bool input [2] bool cpu");
    assert_null(kl_argmin(x, 5, false));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_argmin: dim 5 out of range");
    kl_tensor *v = x, *i = x;
    assert_int_equal(kl_max_dim(x, -4, false, &v, &i), -1);
    assert_null(v);
    assert_null(i);
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_max_dim: dim -4 out of range");
    assert_int_equal(kl_min_dim(x, 0, false, NULL, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_min_dim: values and indices must not be NULL");
    assert_null(kl_cumsum(x, 3));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_cumsum: dim 3 out of range");
    assert_null(kl_cumprod(kl_scalar_tensor(1, KL_F32), 1));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_cumprod: dim 1 out of range for a tensor with 0 dims");
    /* a NULL input keeps the first error */
    assert_null(kl_sum(kl_mean(xi, KL_ALL_DIMS, false), KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_mean");
    assert_null(kl_logsumexp(NULL, KL_ALL_DIMS, false));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_logsumexp: tensor argument 1 is NULL");
    assert_int_equal(kl_max_dim(NULL, 0, false, &v, &i), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_max_dim: tensor argument 1 is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(sum_dims_keepdim),
        KT_TEST(mean_prod_amax_amin),
        KT_TEST(max_min_dim_and_arg),
        KT_TEST(var_std),
        KT_TEST(logsumexp_values),
        KT_TEST(norm_values),
        KT_TEST(all_any),
        KT_TEST(cumsum_cumprod),
        KT_TEST(noncontiguous_inputs),
        KT_TEST(large_layouts),
        KT_TEST(thread_count_independent),
        KT_TEST(meta_tensors),
        KT_TEST(zero_size),
        KT_TEST(nan_propagation),
        KT_TEST(result_dtypes),
        KT_TEST(integer_wraparound),
        KT_TEST(f32_sum_precision),
        KT_TEST(allclose_equal),
        KT_TEST(reduce_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
