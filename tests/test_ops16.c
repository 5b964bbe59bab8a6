/*
 * test_ops16.c — scatter, scatter_reduce, interpolate and prelu beyond the
 * PyTorch fixtures (test_fixtures.c), gradchecks (grad_shape.c, grad_nn.c)
 * and compiled training steps (test_compile.c): error messages, a large
 * scatter_reduce against a plain loop and the same on 1 and 2 threads,
 * include_self false on integers (identity fill), Meta shapes, and the ops
 * inside a compiled function against eager in each mode.
 */
#include "harness.h"

#include <stdlib.h>

static void scatter_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(3, 4), KL_F32), *src = kl_ones(KL_SHAPE(2, 4), KL_F32);
    kl_tensor *bad = kl_from_data((const int64_t[]){0, 1, 5, 2, 0, 0, 0, 0}, KL_SHAPE(2, 4), KL_I64);
    assert_null(kl_scatter(x, 0, bad, src));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter: index 5 is out of range for dim 0 with size 3");
    assert_null(kl_scatter_reduce(x, 0, bad, src, KL_SCATTER_AMAX, false));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter_reduce: index 5 is out of range for dim 0 with size 3");
    kl_tensor *neg = kl_from_data((const int64_t[]){0, -1}, KL_SHAPE(1, 2), KL_I64);
    assert_null(kl_scatter_value(x, 1, neg, 2));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "index -1 is out of range for dim 1 with size 4 (negative indices are not accepted)");
    kl_tensor *ok = kl_zeros(KL_SHAPE(2, 4), KL_I64);
    assert_null(kl_scatter_reduce(x, 0, ok, src, (kl_scatter_reduction)9, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_scatter_reduce: reduce 9 is not a kl_scatter_reduction");
    assert_null(kl_scatter_reduce(x, 0, kl_to_dtype(ok, KL_I32), src, KL_SCATTER_SUM, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter_reduce: index must be int64");
    assert_null(kl_scatter(x, 0, ok, kl_ones(KL_SHAPE(2, 4), KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter: src");
    assert_null(kl_scatter_reduce(kl_zeros(KL_SHAPE(3, 4), KL_BOOL), 0, ok, kl_ones(KL_SHAPE(2, 4), KL_BOOL),
                                  KL_SCATTER_MEAN, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "reduce mean needs a numeric self");
    assert_null(kl_scatter(x, 2, ok, src));
    assert_int_equal(kl_last_status(), KL_ERR_INDEX);
    kl_clear_error();
    assert_null(kl_scatter(x, 0, kl_zeros(KL_SHAPE(4, 4), KL_I64), src));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_scatter: index [4,4]");
    kl_clear_error();
}

/* A scatter_reduce big enough to split across threads, every reduction,
 * against a loop over the entries in index order; 1 and 2 threads agree
 * bitwise. */
static void scatter_reduce_large(void **s) {
    (void)s;
    enum { R = 300, C = 70, K = 900 };
    kl_manual_seed(7);
    kl_tensor *x = kl_add_scalar(kl_rand(KL_SHAPE(R, C), KL_F64), 0.5);
    kl_tensor *src = kl_add_scalar(kl_rand(KL_SHAPE(K, C), KL_F64), 0.5);
    kl_tensor *idx = kl_randint(0, R, KL_SHAPE(K, C), KL_I64);
    const double *xv = kl_data_ptr(x), *sv = kl_data_ptr(src);
    const int64_t *iv = kl_data_ptr(idx);
    double *want = malloc(sizeof *want * R * C), *cnt = malloc(sizeof *cnt * R * C);
    int threads = kl_get_num_threads();
    for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++)
        for (int inc = 0; inc < 2; inc++) {
            for (int i = 0; i < R * C; i++) {
                want[i] = inc ? xv[i] : r == KL_SCATTER_PROD ? 1 : r == KL_SCATTER_AMAX ? -INFINITY
                                       : r == KL_SCATTER_AMIN ? INFINITY : 0;
                cnt[i] = inc;
            }
            int hit[R * C];
            memset(hit, 0, sizeof hit);
            for (int k = 0; k < K; k++)
                for (int c = 0; c < C; c++) {
                    int o = (int)iv[k * C + c] * C + c;
                    double v = sv[k * C + c];
                    hit[o] = 1;
                    cnt[o] += 1;
                    want[o] = r == KL_SCATTER_PROD ? want[o] * v : r == KL_SCATTER_AMAX ? fmax(want[o], v)
                              : r == KL_SCATTER_AMIN ? fmin(want[o], v) : want[o] + v;
                }
            for (int i = 0; i < R * C; i++) {
                if (!hit[i]) want[i] = xv[i];
                else if (r == KL_SCATTER_MEAN) want[i] /= cnt[i];
            }
            kl_set_num_threads(1);
            kl_tensor *y1 = kl_scatter_reduce(x, 0, idx, src, (kl_scatter_reduction)r, inc);
            kl_set_num_threads(2);
            kl_tensor *y2 = kl_scatter_reduce(x, 0, idx, src, (kl_scatter_reduction)r, inc);
            kl_set_num_threads(threads);
            assert_int_equal(kl_equal(y1, y2), 1);
            kl_tensor *w = kl_from_data(want, KL_SHAPE(R, C), KL_F64);
            int ok = kl_allclose(y1, w, 1e-12, 0, false);
            if (ok != 1) print_error("reduce %d include_self %d differs from the loop\n", r, inc);
            assert_int_equal(ok, 1);
        }
    free(want);
    free(cnt);
}

/* include_self false on int32: elements index names start from the identity
 * (INT32_MIN for amax), mean floor-divides. */
static void scatter_reduce_int_identity(void **s) {
    (void)s;
    kl_tensor *x = kl_from_data((const int32_t[]){100, 100, 100}, KL_SHAPE(3), KL_I32);
    kl_tensor *idx = kl_from_data((const int64_t[]){0, 0, 1}, KL_SHAPE(3), KL_I64);
    kl_tensor *src = kl_from_data((const int32_t[]){-7, -3, 4}, KL_SHAPE(3), KL_I32);
    kl_tensor *mx = kl_scatter_reduce(x, 0, idx, src, KL_SCATTER_AMAX, false);
    kl_tensor *mn = kl_scatter_reduce(x, 0, idx, src, KL_SCATTER_MEAN, false);
    assert_int_equal(kl_equal(mx, kl_from_data((const int32_t[]){-3, 4, 100}, KL_SHAPE(3), KL_I32)), 1);
    assert_int_equal(kl_equal(mn, kl_from_data((const int32_t[]){-5, 4, 100}, KL_SHAPE(3), KL_I32)), 1);
    /* 300 entries into one uint8 element: the count does not wrap */
    kl_tensor *u = kl_scatter_reduce(kl_full(KL_SHAPE(2), 9, KL_U8), 0, kl_zeros(KL_SHAPE(300), KL_I64),
                                     kl_full(KL_SHAPE(300), 200, KL_U8), KL_SCATTER_MEAN, true);
    assert_int_equal(kl_equal(u, kl_from_data((const uint8_t[]){(uint8_t)((9 + 300 * 200) % 256 / 301), 9}, KL_SHAPE(2),
                                              KL_U8)), 1);
}

static void interpolate_and_prelu_errors(void **s) {
    (void)s;
    kl_tensor *x4 = kl_zeros(KL_SHAPE(1, 2, 3, 3), KL_F32), *x3 = kl_zeros(KL_SHAPE(1, 2, 3), KL_F32);
    kl_interpolate_options o = kl_interpolate_options_default();
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_interpolate: exactly one of size and scale_factor must be given");
    o.size[0] = o.size[1] = 4;
    o.scale_factor[0] = o.scale_factor[1] = 2;
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "exactly one of size and scale_factor");
    o.scale_factor[0] = o.scale_factor[1] = 0;
    o.align_corners = true;
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "align_corners can only be set with the interpolating modes");
    o.mode = KL_INTERP_BILINEAR;
    assert_null(kl_interpolate(x3, &o));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_interpolate: bilinear input must be 4-D [N, C, H, W], got [1,2,3] float32 cpu");
    o.mode = KL_INTERP_LINEAR;
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "linear input must be 3-D");
    o.mode = KL_INTERP_BILINEAR;
    assert_null(kl_interpolate(kl_zeros(KL_SHAPE(1, 2, 3, 3), KL_I64), &o));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "linear modes need a floating input");
    o.mode = (kl_interp_mode)7;
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "mode 7 is not a kl_interp_mode");
    o = kl_interpolate_options_default();
    o.scale_factor[0] = NAN;
    o.scale_factor[1] = 2;
    assert_null(kl_interpolate(x4, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "scale_factor[0] = nan must be positive and finite");
    assert_null(kl_interpolate(kl_zeros(KL_SHAPE(2, 3), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "input must be 3-D [N, C, L] or 4-D [N, C, H, W], got [2,3]");
    assert_null(kl_prelu(x4, kl_ones(KL_SHAPE(3), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_prelu: weight [3] float32 cpu must have 1 or 2");
    assert_null(kl_prelu(x4, kl_ones(KL_SHAPE(1, 2), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_prelu: weight must be a scalar or 1-D");
    assert_null(kl_prelu(x4, kl_ones(KL_SHAPE(2), KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_prelu: x [1,2,3,3] float32 cpu and weight");
    kl_clear_error();
}

static void meta_shapes(void **s) {
    (void)s;
    kl_device M = KL_DEVICE_META;
    kl_tensor *x = kl_empty_on(KL_SHAPE(2, 3, 5, 4), KL_F32, M), *i = kl_empty_on(KL_SHAPE(2, 3, 5, 4), KL_I64, M);
    kt_assert_shape(kl_scatter(x, 1, i, x), KL_SHAPE(2, 3, 5, 4));
    kt_assert_shape(kl_scatter_value(x, 1, i, 3), KL_SHAPE(2, 3, 5, 4));
    kt_assert_shape(kl_scatter_reduce(x, 1, i, x, KL_SCATTER_MEAN, false), KL_SHAPE(2, 3, 5, 4));
    kl_interpolate_options o = kl_interpolate_options_default();
    o.scale_factor[0] = 2.5, o.scale_factor[1] = 0.5;
    o.mode = KL_INTERP_BILINEAR;
    kl_tensor *y = kl_interpolate(x, &o);
    kt_assert_shape(y, KL_SHAPE(2, 3, 12, 2));
    assert_int_equal(kl_device_of(y).type, KL_META);
    kt_assert_shape(kl_prelu(x, kl_empty_on(KL_SHAPE(3), KL_F32, M)), KL_SHAPE(2, 3, 5, 4));
}

/* Every op of this file in one function: compiled equals eager. */
static int all_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0], *idx = in[1];
    kl_interpolate_options o = kl_interpolate_options_default();
    o.scale_factor[0] = 1.5, o.scale_factor[1] = 2, o.mode = KL_INTERP_BILINEAR, o.align_corners = true;
    out[0] = kl_interpolate(kl_prelu(x, in[2]), &o);
    o = kl_interpolate_options_default();
    o.size[0] = 3, o.size[1] = 7;
    out[1] = kl_interpolate(x, &o);
    kl_tensor *t = kl_reshape(x, 2, (int64_t[]){6, 20});
    out[2] = kl_add(kl_scatter_reduce(t, 0, idx, kl_exp(t), KL_SCATTER_AMIN, false), kl_scatter_value(t, 0, idx, 2));
    out[3] = kl_scatter_reduce(kl_scatter(t, 0, idx, kl_neg(t)), 0, idx, t, KL_SCATTER_MEAN, true);
    return out[0] && out[1] && out[2] && out[3] ? 0 : -1;
}

static void compiled_equals_eager(void **s) {
    (void)s;
    kl_manual_seed(5);
    kl_tensor *in[3] = {kl_randn(KL_SHAPE(2, 3, 4, 5), KL_F32), kl_randint(0, 6, KL_SHAPE(4, 20), KL_I64),
                        kl_rand(KL_SHAPE(3), KL_F32)}, *e[4], *c[4];
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        kl_compile_options o = kl_compile_options_default();
        o.mode = (kl_compile_mode)m;
        kl_fn *f = kl_compile(all_ops, NULL, &o);
        for (int call = 0; call < 2; call++) { /* the trace, then the cache */
            assert_int_equal(all_ops(NULL, in, 3, e, 4), 0);
            int rc = kl_fn_call(f, in, 3, c, 4);
            if (rc) print_error("mode %d: %s\n", m, kl_last_error());
            assert_int_equal(rc, 0);
            for (int k = 0; k < 4; k++) {
                int ok = m == KL_COMPILE_TRACE_ONLY ? kl_equal(c[k], e[k]) : kl_allclose(c[k], e[k], 1e-5, 1e-6, false);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(scatter_errors),
        KT_TEST(scatter_reduce_large),
        KT_TEST(scatter_reduce_int_identity),
        KT_TEST(interpolate_and_prelu_errors),
        KT_TEST(meta_shapes),
        KT_TEST(compiled_equals_eager),
    };
    return cmocka_run_group_tests_name("ops16", tests, NULL, NULL);
}
