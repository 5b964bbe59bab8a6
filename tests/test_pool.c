/*
 * test_pool.c — max_pool2d's disjoint 2x2 paths (kernel 2, stride 2: the
 * CNNs' pool) against plain loops written here, bit for bit: the CPU kernels
 * take a row's windows in blocks and let a row's last block run on into the
 * rows below (tmpl/pool.h), so the shapes cover rows shorter than, equal to
 * and longer than a block, odd sizes (a row and a column outside every
 * window), planes of one window, every dtype of the forward, and values
 * with ties, NaNs, -inf and signed zeros. Then the same pool inside a
 * compiled training step against eager. PyTorch's values and the gradchecks
 * are in test_fixtures.c, test_nn.c and grad_nn.c.
 */
#include "harness.h"
#include "nn_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const int64_t shapes[][4] = {
    {2, 3, 26, 26}, /* fashion's first pool: rows of 13 windows */
    {2, 3, 11, 11}, /* its second: rows of 5, an odd row and column left out */
    {1, 2, 27, 9}, {3, 1, 2, 2}, {1, 1, 3, 5}, {2, 2, 64, 66}, {1, 3, 5, 40}, {1, 1, 13, 33},
    {2, 1, 8, 17},  {1, 2, 4, 16}, {1, 1, 2, 64}, {2, 2, 6, 35},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* Values in {-2, ..., 2} (many ties, signed zeros among them), some NaN and
 * -inf for floating dtypes. */
static kl_tensor *pool_input(const int64_t *shape, kl_dtype t) {
    kl_tensor *x = kl_round(kl_mul_scalar(kl_randn(4, shape, KL_F64), 1.5));
    int fl = t == KL_F32 || t == KL_F64;
    if (fl) {
        kl_tensor *u = kl_rand(4, shape, KL_F64);
        x = kl_where(kl_gt_scalar(u, 0.95), kl_full(KL_SHAPE(1), NAN, KL_F64), x);
        x = kl_where(kl_lt_scalar(u, 0.03), kl_full(KL_SHAPE(1), -INFINITY, KL_F64), x);
        x = kl_where(kl_lt_scalar(kl_rand(4, shape, KL_F64), 0.1), kl_full(KL_SHAPE(1), -0.0, KL_F64), x);
    } else {
        x = t == KL_U8 ? kl_relu(kl_add_scalar(x, 3)) : x; /* u8: no negatives to convert */
    }
    return kl_contiguous(kl_to_dtype(x, t));
}

/* The flat index of window (oh, ow)'s maximum in plane x: the first maximum
 * in window order, a NaN always taking over (PyTorch's choice). */
#define ARGMAX2X2(T, sfx)                                                                       \
    static int64_t argmax_##sfx(const T *x, int64_t W, int64_t oh, int64_t ow) {                \
        int64_t best = 2 * oh * W + 2 * ow;                                                     \
        T m = x[best];                                                                          \
        for (int i = 0; i < 2; i++)                                                             \
            for (int j = 0; j < 2; j++) {                                                       \
                int64_t at = (2 * oh + i) * W + 2 * ow + j;                                     \
                if (x[at] > m || x[at] != x[at]) m = x[at], best = at;                          \
            }                                                                                   \
        return best;                                                                            \
    }
ARGMAX2X2(float, f32)
ARGMAX2X2(double, f64)
ARGMAX2X2(int64_t, i64)

/* Every dtype's forward: the window's maximum element itself (its bits). */
static void pool2x2_forward(void **s) {
    (void)s;
    kl_manual_seed(161);
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_I32, KL_I64, KL_U8};
    kl_pool2d_options o = kl_pool2d_options_default(2);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t i = 0; i < NSHAPES; i++) {
            kl_scope_begin();
            const int64_t *sh = shapes[i];
            int64_t planes = sh[0] * sh[1], H = sh[2], W = sh[3], OH = H / 2, OW = W / 2;
            kl_tensor *x = pool_input(sh, dts[d]), *y = kl_max_pool2d(x, &o);
            kt_assert_shape(y, 4, (int64_t[]){sh[0], sh[1], OH, OW});
            /* integers: compared as int64, where argmax's order is theirs */
            kl_tensor *xi = dts[d] == KL_F32 || dts[d] == KL_F64 ? x : kl_contiguous(kl_to_dtype(x, KL_I64));
            kl_tensor *yi = xi == x ? y : kl_contiguous(kl_to_dtype(y, KL_I64));
            size_t es = dts[d] == KL_F32 ? 4 : 8;
            const char *xp = kl_data_ptr(xi), *yp = kl_data_ptr(yi);
            for (int64_t p = 0; p < planes; p++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        const char *xpl = xp + (size_t)(p * H * W) * es;
                        int64_t at = dts[d] == KL_F32   ? argmax_f32((const float *)xpl, W, oh, ow)
                                     : dts[d] == KL_F64 ? argmax_f64((const double *)xpl, W, oh, ow)
                                                        : argmax_i64((const int64_t *)xpl, W, oh, ow);
                        const char *want = xpl + (size_t)at * es, *got = yp + (size_t)((p * OH + oh) * OW + ow) * es;
                        if (memcmp(want, got, es)) {
                            print_error("dtype %d shape %zu plane %lld window (%lld, %lld) differs\n", (int)dts[d], i,
                                        (long long)p, (long long)oh, (long long)ow);
                            fail();
                        }
                    }
            kl_scope_end();
        }
}

/* The gradient: g (as g + 0: no -0) at each window's maximum, +0 everywhere
 * else, the uncovered row and column included. */
static void pool2x2_backward(void **s) {
    (void)s;
    kl_manual_seed(162);
    kl_pool2d_options o = kl_pool2d_options_default(2);
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < NSHAPES; i++) {
            kl_scope_begin();
            kl_dtype t = dt ? KL_F64 : KL_F32;
            const int64_t *sh = shapes[i];
            int64_t planes = sh[0] * sh[1], H = sh[2], W = sh[3], OH = H / 2, OW = W / 2;
            kl_tensor *x = pool_input(sh, t);
            assert_int_equal(kl_set_requires_grad(x, true), 0);
            kl_tensor *y = kl_max_pool2d(x, &o);
            kl_tensor *g = kl_randn(4, kl_shape(y), t);
            kl_tensor *negz = kl_full(KL_SHAPE(1), -0.0, t);
            g = kl_contiguous(kl_where(kl_gt_scalar(kl_rand(4, kl_shape(y), t), 0.8), negz, g));
            kl_tensor *gx;
            assert_int_equal(kl_autograd_grad(1, &y, &g, 1, &x, &gx, NULL), 0);
            gx = kl_contiguous(gx);
            kl_tensor *want = kl_zeros(4, sh, KL_F64);
            kl_tensor *x64 = kl_contiguous(kl_to_dtype(kl_detach(x), KL_F64));
            kl_tensor *g64 = kl_contiguous(kl_to_dtype(g, KL_F64));
            double *wp = kl_data_ptr(want);
            const double *gp = kl_data_ptr(g64), *xp = kl_data_ptr(x64);
            for (int64_t p = 0; p < planes; p++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++)
                        wp[p * H * W + argmax_f64(xp + p * H * W, W, oh, ow)] = gp[(p * OH + oh) * OW + ow] + 0.0;
            kl_tensor *got = kl_contiguous(kl_to_dtype(gx, KL_F64));
            const double *gotp = kl_data_ptr(got);
            for (int64_t k = 0; k < planes * H * W; k++)
                if (memcmp(&wp[k], &gotp[k], sizeof(double))) {
                    print_error("dtype %d shape %zu element %lld: %g, want %g\n", (int)t, i, (long long)k, gotp[k],
                                wp[k]);
                    fail();
                }
            kl_scope_end();
        }
}

/* The compiled step (FUSE: the pool and its backward kept whole on the CPU)
 * against eager, within the rounding of the fused kernels around the pool. */
static void pool2x2_compiled(void **s) {
    (void)s;
    kl_manual_seed(163);
    kl_tensor *in[4] = {kl_randn(KL_SHAPE(3, 4, 26, 26), KL_F32), kl_add_scalar(kl_rand(KL_SHAPE(4), KL_F32), 0.5),
                        kl_randn(KL_SHAPE(4), KL_F32), kl_randn(KL_SHAPE(3, 4, 13, 13), KL_F32)};
    kl_tensor *e[3], *c[3];
    assert_int_equal(kt_bn_relu_pool_step(NULL, in, 4, e, 3), 0);
    kl_compile_options co = kl_compile_options_default();
    co.mode = KL_COMPILE_FUSE;
    kl_fn *f = kl_compile(kt_bn_relu_pool_step, NULL, &co);
    assert_non_null(f);
    for (int call = 0; call < 2; call++) {
        int rc = kl_fn_call(f, in, 4, c, 3);
        if (rc) print_error("%s\n", kl_last_error());
        assert_int_equal(rc, 0);
        assert_int_equal(kl_allclose(c[0], e[0], 1e-4, 1e-5, false), 1);
        assert_int_equal(kl_allclose(c[1], e[1], 1e-4, 1e-5, false), 1);
        assert_int_equal(kl_allclose(c[2], e[2], 1e-5, 1e-6, false), 1);
    }
    kl_fn_release(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(pool2x2_forward),
        KT_TEST(pool2x2_backward),
        KT_TEST(pool2x2_compiled),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
