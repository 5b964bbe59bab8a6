/*
 * test_nn_layers.c — convolution (conv2d, its weight/input gradient kernels,
 * conv_transpose2d), pooling, batch_norm, the fused normalization backward
 * kernels and dropout2d: values against PyTorch 1.13 (computed once with
 * torch and written here), each fused kernel against the ops it replaces,
 * shape rules and error messages. Split from test_nn.c.
 */
#include "harness.h"

#include "alloc.h"
#include "kernels_nn.h"
#include "nn_util.h"

#include <stdlib.h>

/* ---- convolution and pooling ---------------------------------------------------------------- */

static const double conv_g2_expect[] = {
    2, -9, -9, -9, -2, -11, -12, 7, -3, 8, 16, 1, 11, 10, -10, -8, -11, 4, 14, -1, 29, 29, 0, -2, -13, -11, -8, -17,
    -4, 3, 0.5, 15.5, 5.5, -9.5, -6.5, -12.5, -11.5, -8.5, -12.5, 14.5, -9.5, 1.5, 23.5, 0.5, -0.5, -8, -1, -2, 3,
    21, -2, 9, 36, -3, -17, 11, -9, -8, -9, -6, 15, 0, 10, 9, -11, -1, -12, -23, -4, -3, -3, 4, 9, 19, 16, -12, -9,
    -18, -5, 2, -15, 12, 8, 5, 16, -2, -3, 1, -13, -12, -6, -10, -7, 5, 5, 15, 21, 15, 19, 9, 0, -1, -17, -9, -1,
    0, 18, 5, -2, -3, -6, -20, -19, -17, 7, -12, -9, 13, 3, 3, 9.5, -10.5, -9.5, -10.5, -7.5, -3.5, -2.5, 5.5,
    20.5, -1.5, 19.5, 16.5, -3.5, -1.5, -9.5, 6, 6, 17, 18, -6, 20, 10, -22, -10, -17, -8, 0, -2, 18, 21, -1, -2,
    -18, -10, -2, -16, 8, 11, -2, 20, 4, 4, 14, -8, -11, -13, -10, 12, 2, 2, 18, -4, 9, 6, -18, -4, -12, -20, -4,
    -3};
static const double conv_unb_expect[] = {
    3, 3, -7, -10, 0, -4, 19, 12, 19, -4, -9, -16, -9, 19, 1, 14, -9, -16, -16, -1, 9, 12, 19, -9, -10, -4, -7, 3,
    6, 14, -3, -2, -5, -1, 8, 7, 0, -13, -12, -5, 1, 26, 13, 0, -5, -12, -11, -3, 26, 2, 3, -13, -12, -11, 2, 14,
    6, 3, -7, -4, 6, -2, 12, -2, -9, -12, -4, 7, -3, 14, 1, -12, -15, -4, 9, 7, 22, 5, -12, -10, -8, 7, -3, 22, -1,
    -3, -6, -2, -5, -2, -1, -6, -3, 7, 4, 1, 7, -4, -15, -9, -1, 22, -3, 7, -8, -10, -12, 5, 22, 7, 9, -4, -15,
    -12, 1, 6, -2, 12, -2, -9, -5, 6, 16, -2, -6, -5, -13, 0, 13, 18, 2, -11, -12, -13, 3, 2, 26, -3, -11, -12, -5,
    0, 13, 26, 1, -5, -2, -6, -3, 4, 6, -7, -10, -6, 4, 9, 12, 19, -9, -10, -10, -9, 19, 12, 9, -1, -16, -16, -9,
    14, 1, 19, -9, -16, -9, -1, 3, 6, 16, -3};

static void conv2d_values(void **s) {
    (void)s;
    kl_tensor *x = kl_sub_scalar(kl_remainder_scalar(ar(KL_SHAPE(2, 4, 5, 5)), 7), 3);
    kl_tensor *w = kl_sub_scalar(kl_remainder_scalar(ar(KL_SHAPE(6, 2, 3, 3)), 5), 2);
    kl_tensor *b = TF(KL_SHAPE(6), 1, -1, 0.5, 2, 0, -2);
    kl_conv2d_options o = kl_conv2d_options_default();
    assert_int_equal(o.stride[0], 1);
    assert_int_equal(o.groups, 1);
    o.stride[0] = 2, o.padding[0] = 1, o.padding[1] = 2, o.dilation[1] = 2, o.groups = 2;
    kl_tensor *r = kl_conv2d(x, w, b, &o);
    kt_assert_shape(r, KL_SHAPE(2, 6, 3, 5));
    kt_assert_values(r, conv_g2_expect, 180, 1e-6);
    /* f64 and a non-contiguous input give the same */
    kt_assert_values(kl_conv2d(kl_to_dtype(x, KL_F64), kl_to_dtype(w, KL_F64), kl_to_dtype(b, KL_F64), &o),
                     conv_g2_expect, 180, 1e-12);
    kl_tensor *xt = kl_transpose(kl_contiguous(kl_transpose(x, 2, 3)), 2, 3);
    kt_assert_values(kl_conv2d(xt, w, b, &o), conv_g2_expect, 180, 1e-6);
    /* 1x1 kernels skip im2col */
    kl_tensor *w1 = kl_sub_scalar(kl_remainder_scalar(ar(KL_SHAPE(3, 4, 1, 1)), 3), 1);
    r = kl_conv2d(kl_narrow(x, 0, 0, 1), w1, NULL, NULL);
    kt_assert_shape(r, KL_SHAPE(1, 3, 5, 5));
    KT_VALUES(r, 0, -1, -2, 4, 3, 2, 1, -7, -1, -2, 4, 3, 2, 1, -7, -1, -2, 4, 3, 2, 1, -7, -1, -2, 4, 3, 3, 3, 3,
              -4, -4, -4, 3, 3, 3, 3, -4, -4, -4, 3, 3, 3, 3, -4, -4, -4, 3, 3, 3, 3, -4, -2, -1, -7, 1, 2, 3, 4, -2,
              -1, -7, 1, 2, 3, 4, -2, -1, -7, 1, 2, 3, 4, -2, -1, -7, 1);
    /* unbatched [C,H,W] input */
    o = kl_conv2d_options_default();
    o.padding[0] = o.padding[1] = 1, o.groups = 2;
    r = kl_conv2d(kl_select(x, 0, 0), kl_narrow(w, 2, 0, 2), NULL, &o);
    kt_assert_shape(r, KL_SHAPE(6, 6, 5));
    kt_assert_values(r, conv_unb_expect, 180, 1e-6);
    /* integers, stride 2 */
    kl_tensor *wi = kl_sub_scalar(kl_remainder_scalar(ar_dt(KL_SHAPE(2, 4, 2, 2), KL_I64), 3), 1);
    o = kl_conv2d_options_default();
    o.stride[0] = o.stride[1] = 2;
    r = kl_conv2d(kl_to_dtype(kl_narrow(x, 0, 0, 1), KL_I64), wi, NULL, &o);
    assert_int_equal(kl_dtype_of(r), KL_I64);
    KT_VALUES(r, 0, -2, -4, 2, 7, 6, 6, -1, -1);
    /* a larger batch of small images runs the batch in parallel */
    kl_manual_seed(2);
    kl_tensor *xb = kl_randn(KL_SHAPE(9, 3, 6, 6), KL_F32), *wb = kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32);
    kl_tensor *rb = kl_conv2d(xb, wb, NULL, NULL);
    for (int64_t n = 0; n < 9; n++) {
        kl_tensor *one = kl_conv2d(kl_narrow(xb, 0, n, 1), wb, NULL, NULL);
        assert_int_equal(kl_allclose(kl_narrow(rb, 0, n, 1), one, 1e-6, 1e-6, false), 1);
    }
}

/* conv2d with a small output and a large reduction (P <= 1024 positions,
 * Og * P * Kc >= KE_GEMM_SMALL: conv2d as its own weight gradient) puts
 * several samples' column matrices side by side in one GEMM: the same as
 * one sample at a time, with groups, bias, stride and padding, across the
 * chunks the column budget (16 MiB) cuts the batch into. */
static void conv2d_batched_columns(void **s) {
    (void)s;
    kl_manual_seed(5);
    /* Kc = 16 * 11 * 11 = 1936, P = 3 * 9 = 27, Og = 16 */
    kl_tensor *x = kl_randn(KL_SHAPE(3, 32, 13, 13), KL_F32), *w = kl_randn(KL_SHAPE(32, 16, 11, 11), KL_F32);
    kl_tensor *b = kl_randn(KL_SHAPE(32), KL_F32);
    kl_conv2d_options o = kl_conv2d_options_default();
    o.groups = 2, o.stride[0] = 2, o.padding[1] = 2;
    for (int dt = 0; dt < 2; dt++) {
        kl_dtype t = dt ? KL_F64 : KL_F32;
        double tol = dt ? 1e-10 : 1e-4;
        kl_tensor *xt = kl_to_dtype(x, t), *wt = kl_to_dtype(w, t), *bt = kl_to_dtype(b, t);
        kl_tensor *r = kl_conv2d(xt, wt, bt, &o);
        kt_assert_shape(r, KL_SHAPE(3, 32, 2, 7));
        for (int64_t n = 0; n < 3; n++)
            assert_int_equal(kl_allclose(kl_narrow(r, 0, n, 1), kl_conv2d(kl_narrow(xt, 0, n, 1), wt, bt, &o), tol, tol,
                                         false), 1);
        /* no bias */
        kl_tensor *r0 = kl_conv2d(xt, wt, NULL, &o);
        assert_int_equal(kl_allclose(kl_add(r0, kl_reshape(bt, KL_SHAPE(32, 1, 1))), r, tol, tol, false), 1);
    }
    /* 250 samples of 1936 x 9 f32 columns: chunks of 240 and 10 */
    kl_tensor *xb = kl_randn(KL_SHAPE(250, 16, 13, 13), KL_F32), *wb = kl_randn(KL_SHAPE(8, 16, 11, 11), KL_F32);
    kl_tensor *rb = kl_conv2d(xb, wb, NULL, NULL);
    kt_assert_shape(rb, KL_SHAPE(250, 8, 3, 3));
    static const int64_t picks[] = {0, 1, 239, 240, 249};
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++)
        assert_int_equal(kl_allclose(kl_narrow(rb, 0, picks[i], 1), kl_conv2d(kl_narrow(xb, 0, picks[i], 1), wb, NULL, NULL),
                                     1e-4, 1e-4, false),
                         1);
}

/* max_pool2d's gradient from the fused max_pool2d_backward (first order,
 * f32/f64 CPU) equals the one its create_graph formula builds from
 * max_pool2d_indices and scatter_add, bit for bit: ties, NaNs, overlapping
 * windows, padding, dilation, ceil_mode windows past the input, 3-D input;
 * the disjoint 2x2 windows of the vectorized paths (cfg 0 and 4: odd sizes
 * leave a row and a column outside every window, NaNs, -inf, -0 gradients),
 * whose forward is also the amax of each 2x2 block. */
static void max_pool2d_fused_backward(void **s) {
    (void)s;
    kl_manual_seed(9);
    for (int dt = 0; dt < 2; dt++)
        for (int cfg = 0; cfg < 5; cfg++) {
            kl_scope_begin();
            kl_dtype t = dt ? KL_F64 : KL_F32;
            kl_pool2d_options o = kl_pool2d_options_default(2);
            if (cfg == 1) o.kernel[0] = o.kernel[1] = 3, o.stride[0] = 1, o.padding[1] = 1;
            if (cfg == 2) o.kernel[0] = 3, o.dilation[1] = 2, o.stride[1] = 1, o.ceil_mode = true;
            if (cfg == 3) o.stride[0] = o.stride[1] = 3, o.ceil_mode = true;
            /* values in {-2, ..., 2}: many ties */
            static const int64_t shape[4] = {2, 3, 7, 8}, shape4[4] = {3, 5, 9, 11};
            int nd = cfg == 3 ? 3 : 4;
            kl_tensor *x = kl_round(kl_mul_scalar(kl_randn(nd, (cfg == 4 ? shape4 : shape) + 4 - nd, t), 1.5));
            if (cfg == 1 || cfg == 4)
                x = kl_where(kl_gt_scalar(kl_rand(4, kl_shape(x), t), 0.9), kl_full(KL_SHAPE(1), NAN, t), x);
            if (cfg == 4)
                x = kl_where(kl_lt_scalar(kl_rand(4, kl_shape(x), t), 0.1), kl_full(KL_SHAPE(1), -INFINITY, t), x);
            assert_int_equal(kl_set_requires_grad(x, true), 0);
            kl_tensor *y = kl_max_pool2d(x, &o);
            if (cfg == 0 || cfg == 4) {
                const int64_t *xs = kl_shape(x);
                int64_t OH = xs[2] / 2, OW = xs[3] / 2;
                kl_tensor *blocks = kl_reshape(kl_narrow(kl_narrow(kl_detach(x), 2, 0, 2 * OH), 3, 0, 2 * OW), 6,
                                               (int64_t[]){xs[0], xs[1], OH, 2, OW, 2});
                assert_int_equal(kl_allclose(y, kl_amax(blocks, KL_DIMS(3, 5), false), 0, 0, true), 1);
            }
            kl_tensor *gy = kl_randn(kl_ndim(y), kl_shape(y), t);
            if (cfg == 4) gy = kl_where(kl_gt_scalar(kl_rand(kl_ndim(y), kl_shape(y), t), 0.8), kl_full(KL_SHAPE(1), -0.0, t), gy);
            kl_tensor *l = kl_sum(kl_mul(y, gy), KL_ALL_DIMS, false);
            kl_backward_options bo = kl_backward_options_default();
            bo.retain_graph = true;
            kl_tensor *fused, *formula;
            assert_int_equal(kl_autograd_grad(1, &l, NULL, 1, &x, &fused, &bo), 0);
            bo.create_graph = true;
            assert_int_equal(kl_autograd_grad(1, &l, NULL, 1, &x, &formula, &bo), 0);
            assert_int_equal(kl_allclose(fused, formula, 0, 0, true), 1);
            kl_tensor *one = kl_ones(KL_SHAPE(1), t); /* and the signs of zeros */
            assert_int_equal(kl_allclose(kl_copysign(one, fused), kl_copysign(one, formula), 0, 0, false), 1);
            assert_true(kl_item(kl_sum(kl_abs(fused), KL_ALL_DIMS, false)) > 0);
            kl_scope_end();
        }
}

/* conv2d's weight gradient by its definition, in double: dw[o, c, i, j] =
 * sum over n, oh, ow of g[n, o, oh, ow] * x[n, group's c, oh*sh - ph + i*dh,
 * ow*sw - pw + j*dw] (0 outside x). x and g contiguous [N, C, H, W] and
 * [N, O, OH, OW]. */
static kl_tensor *conv_weight_grad_ref(kl_tensor *x, kl_tensor *g, const int64_t *k, const kl_conv2d_options *o) {
    x = kl_contiguous(kl_to_dtype(x, KL_F64)), g = kl_contiguous(kl_to_dtype(g, KL_F64));
    const int64_t *xs = kl_shape(x), *gs = kl_shape(g);
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = gs[1], OH = gs[2], OW = gs[3];
    int64_t G = o->groups, Cg = C / G, Og = O / G;
    kl_tensor *dw = kl_zeros(KL_SHAPE(O, Cg, k[0], k[1]), KL_F64);
    const double *xp = kl_data_ptr(x), *gp = kl_data_ptr(g);
    double *d = kl_data_ptr(dw);
    for (int64_t oc = 0; oc < O; oc++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t i = 0; i < k[0]; i++)
                for (int64_t j = 0; j < k[1]; j++) {
                    double s = 0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t oh = 0; oh < OH; oh++)
                            for (int64_t ow = 0; ow < OW; ow++) {
                                int64_t ih = oh * o->stride[0] - o->padding[0] + i * o->dilation[0],
                                        iw = ow * o->stride[1] - o->padding[1] + j * o->dilation[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                s += gp[((n * O + oc) * OH + oh) * OW + ow] *
                                     xp[((n * C + oc / Og * Cg + c) * H + ih) * W + iw];
                            }
                    d[((oc * Cg + c) * k[0] + i) * k[1] + j] = s;
                }
    return dw;
}

/* A conv2d shape for the gradient-kernel tests: input, weight, stride,
 * padding, dilation, groups. */
typedef struct conv_case {
    int64_t x[4], w[4], st[2], pad[2], dil[2], groups;
} conv_case;

/* conv2d of random x and w for case c (x 3-D when nd is 3), and the gradient
 * of sum(y * g) for a random g with respect to x (wrt_x) or w, through
 * autograd, i.e. the CPU kernel under test; x4, g4 and grad4 are batched. */
typedef struct conv_grad_run {
    kl_tensor *x4, *w, *g4, *grad4;
    kl_conv2d_options o;
} conv_grad_run;

static conv_grad_run conv_grad_of_case(const conv_case *c, kl_dtype t, int nd, bool wrt_x) {
    conv_grad_run r = {.o = {.stride = {c->st[0], c->st[1]}, .padding = {c->pad[0], c->pad[1]},
                             .dilation = {c->dil[0], c->dil[1]}, .groups = c->groups}};
    kl_tensor *x = kl_randn(nd, c->x + 4 - nd, t), *w = kl_randn(4, c->w, t), *wrt = wrt_x ? x : w;
    assert_int_equal(kl_set_requires_grad(wrt, true), 0);
    kl_tensor *y = kl_conv2d(x, w, NULL, &r.o);
    assert_non_null(y);
    kl_tensor *g = kl_randn(kl_ndim(y), kl_shape(y), t);
    kl_tensor *l = kl_sum(kl_mul(y, g), KL_ALL_DIMS, false), *grad;
    assert_int_equal(kl_autograd_grad(1, &l, NULL, 1, &wrt, &grad, NULL), 0);
    kt_assert_shape(grad, kl_ndim(wrt), kl_shape(wrt));
    r.x4 = nd == 4 ? x : kl_unsqueeze(x, 0), r.g4 = nd == 4 ? g : kl_unsqueeze(g, 0), r.w = w;
    r.grad4 = nd == 4 || !wrt_x ? grad : kl_unsqueeze(grad, 0);
    return r;
}

/* Asserts got == ref (f64) to tol relative to the largest |ref| (long sums
 * in f32) and returns that scale. */
static double assert_near_definition(kl_tensor *got, kl_tensor *ref, double tol, size_t i, int dt) {
    double scale = kl_item(kl_amax(kl_abs(ref), KL_ALL_DIMS, false));
    int ok = kl_allclose(kl_to_dtype(got, KL_F64), ref, tol, tol * scale, false);
    if (ok != 1)
        print_error("case %zu, dtype %d: kernel differs from the definition by %g (|ref| up to %g)\n", i, dt,
                    kl_item(kl_amax(kl_abs(kl_sub(kl_to_dtype(got, KL_F64), ref)), KL_ALL_DIMS, false)), scale);
    assert_int_equal(ok, 1);
    assert_true(scale > 0);
    return scale;
}

/* conv2d's weight gradient from the CPU kernel conv2d_weight_grad (im2col
 * with the real kernel, one GEMM per chunk of samples) against its
 * definition (conv_weight_grad_ref) and against the op's decomposition (the
 * formula other devices run: conv2d with batch and channels swapped), to
 * rounding: strides, padding, dilation, groups, rows the kernel never
 * reaches, 1x1, one input channel (conv1's shape), 3-D input, f32 and f64;
 * and a batch large enough for several chunks of samples. */
static void conv2d_weight_grad_kernel(void **s) {
    (void)s;
    static const conv_case cases[] = {
        {{4, 3, 9, 8}, {5, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{2, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{3, 4, 9, 10}, {6, 2, 3, 2}, {2, 3}, {1, 2}, {2, 1}, 2},
        {{2, 2, 8, 7}, {4, 2, 2, 3}, {3, 2}, {0, 1}, {1, 2}, 1}, /* last rows never reached */
        {{2, 3, 4, 5}, {2, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{1, 3, 7, 7}, {3, 1, 2, 3}, {2, 2}, {1, 2}, {2, 2}, 3},
        {{200, 8, 12, 12}, {16, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}, /* > 16 MiB of columns: chunks */
    };
    kl_manual_seed(12);
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            kl_scope_begin();
            int nd = i == 4 && dt ? 3 : 4; /* one unbatched case */
            conv_grad_run r = conv_grad_of_case(&cases[i], dt ? KL_F64 : KL_F32, nd, false);
            kl_tensor *ref = conv_weight_grad_ref(r.x4, r.g4, cases[i].w + 2, &r.o);
            double tol = dt ? 1e-12 : 4e-6, scale = assert_near_definition(r.grad4, ref, tol, i, dt);
            /* the decomposition (the formula) */
            if (cases[i].groups == 1) {
                kl_conv2d_options f = {.stride = {r.o.dilation[0], r.o.dilation[1]},
                                       .padding = {r.o.padding[0], r.o.padding[1]},
                                       .dilation = {r.o.stride[0], r.o.stride[1]}, .groups = 1};
                kl_tensor *d = kl_conv2d(kl_transpose(r.x4, 0, 1), kl_transpose(r.g4, 0, 1), NULL, &f);
                d = kl_transpose(kl_narrow(kl_narrow(d, 2, 0, cases[i].w[2]), 3, 0, cases[i].w[3]), 0, 1);
                assert_int_equal(kl_allclose(kl_to_dtype(d, KL_F64), ref, tol, tol * scale, false), 1);
            }
            kl_scope_end();
        }
}

/* conv2d's input gradient by its definition, in double: dx[n, c, ih, iw] =
 * sum over o in c's group, i, j of g[n, o, oh, ow] * w[o, c - group start,
 * i, j] where ih = oh*sh - ph + i*dh, iw = ow*sw - pw + j*dw. g contiguous
 * [N, O, OH, OW]. */
static kl_tensor *conv_input_grad_ref(kl_tensor *g, kl_tensor *w, const int64_t *hw, const kl_conv2d_options *o) {
    g = kl_contiguous(kl_to_dtype(g, KL_F64)), w = kl_contiguous(kl_to_dtype(w, KL_F64));
    const int64_t *gs = kl_shape(g), *ws = kl_shape(w);
    int64_t N = gs[0], O = gs[1], OH = gs[2], OW = gs[3], G = o->groups, Cg = ws[1], C = Cg * G, Og = O / G;
    kl_tensor *dx = kl_zeros(KL_SHAPE(N, C, hw[0], hw[1]), KL_F64);
    const double *gp = kl_data_ptr(g), *wp = kl_data_ptr(w);
    double *d = kl_data_ptr(dx);
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++)
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t i = 0; i < ws[2]; i++)
                    for (int64_t j = 0; j < ws[3]; j++)
                        for (int64_t oh = 0; oh < OH; oh++)
                            for (int64_t ow = 0; ow < OW; ow++) {
                                int64_t ih = oh * o->stride[0] - o->padding[0] + i * o->dilation[0],
                                        iw = ow * o->stride[1] - o->padding[1] + j * o->dilation[1];
                                if (ih < 0 || ih >= hw[0] || iw < 0 || iw >= hw[1]) continue;
                                d[((n * C + oc / Og * Cg + c) * hw[0] + ih) * hw[1] + iw] +=
                                    gp[((n * O + oc) * OH + oh) * OW + ow] * wp[((oc * Cg + c) * ws[2] + i) * ws[3] + j];
                            }
    return dx;
}

/* conv2d's input gradient from the CPU kernel conv2d_input_grad (one GEMM
 * w^T g per chunk of samples, then col2im) against its definition and
 * against the op's decomposition (conv_transpose2d: what other devices and
 * double backward run), to rounding: strides with rows and columns no window
 * reaches, padding, dilation, groups, 1x1, the fashion CNN's conv2 shape,
 * outputs wide enough for the per-sample path, a batch large enough for
 * several chunks, 3-D input, f32 and f64; and the op's shape rule. */
static void conv2d_input_grad_kernel(void **s) {
    (void)s;
    static const conv_case cases[] = {
        {{4, 3, 9, 8}, {5, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{3, 32, 13, 13}, {64, 32, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1}, /* conv2 of examples/fashion */
        {{3, 4, 9, 10}, {6, 2, 3, 2}, {2, 3}, {1, 2}, {2, 1}, 2},
        {{2, 2, 8, 7}, {4, 2, 2, 3}, {3, 2}, {0, 1}, {1, 2}, 1}, /* last rows never reached */
        {{2, 3, 4, 5}, {2, 3, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
        {{1, 3, 7, 7}, {3, 1, 2, 3}, {2, 2}, {1, 2}, {2, 2}, 3},
        {{2, 3, 40, 36}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},   /* P = 1440: one sample per GEMM */
        {{300, 8, 12, 12}, {16, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1}, /* > 16 MiB of columns: chunks */
    };
    kl_manual_seed(13);
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            kl_scope_begin();
            int nd = i == 4 && dt ? 3 : 4; /* one unbatched case */
            conv_grad_run r = conv_grad_of_case(&cases[i], dt ? KL_F64 : KL_F32, nd, true);
            kl_tensor *ref = conv_input_grad_ref(r.g4, r.w, cases[i].x + 2, &r.o);
            double tol = dt ? 1e-12 : 4e-6, scale = assert_near_definition(r.grad4, ref, tol, i, dt);
            /* the decomposition, called as the dispatcher calls it on devices without the kernel */
            kl_tensor *in[2] = {kl_contiguous(r.g4), r.w};
            ke_call c = {.op = KE_OP_conv2d_input_grad, .nin = 2, .in = in};
            int64_t list[8] = {r.o.stride[0],   r.o.stride[1],   r.o.padding[0], r.o.padding[1],
                               r.o.dilation[0], r.o.dilation[1], cases[i].x[2],  cases[i].x[3]};
            assert_int_equal(ke_set_list(&c, 8, list), 0);
            ke_attr_set_conv2d_input_grad_groups(&c.a, r.o.groups);
            assert_int_equal(ke_ops[KE_OP_conv2d_input_grad].decomp(&c), 0);
            assert_int_equal(kl_allclose(kl_to_dtype(c.out[0], KL_F64), ref, tol, tol * scale, false), 1);
            kl_scope_end();
        }
    /* the shape rule: g must be conv2d's output for the input size */
    kl_tensor *in[2] = {kl_zeros(KL_SHAPE(2, 4, 5, 5), KL_F32), kl_zeros(KL_SHAPE(4, 3, 3, 3), KL_F32)};
    ke_call c = {.op = KE_OP_conv2d_input_grad, .nin = 2, .in = in};
    assert_int_equal(ke_set_list(&c, 8, (int64_t[]){1, 1, 0, 0, 1, 1, 8, 7}), 0);
    ke_attr_set_conv2d_input_grad_groups(&c.a, 1);
    assert_null(ke_call1(&c));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv2d_input_grad: gradient [2,4,5,5] float32 cpu does not have conv2d's output "
                                  "shape [2,4,6,5] for input [2,3,8,7]");
    in[1] = kl_zeros(KL_SHAPE(4, 3, 3, 3), KL_F64);
    assert_null(ke_call1(&c));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_conv2d_input_grad: gradient [2,4,5,5] float32 cpu and weight [4,3,3,3] float64 cpu "
                                  "must have one dtype");
}

/* relu's derivative is the internal op threshold_backward(g, y): g where y
 * > threshold, else 0, a NaN y passing g (PyTorch's threshold_backward),
 * against that definition for a threshold of 0 (relu's) and 0.5, f32 and f64,
 * a broadcast y; and relu's gradient is what the two-pass
 * masked_fill(g, y <= 0, 0) gave, bit for bit. */
static kl_tensor *threshold_backward(kl_tensor *g, kl_tensor *y, double t) {
    kl_tensor *in[2] = {g, y};
    ke_call c = {.op = KE_OP_threshold_backward, .nin = 2, .in = in};
    ke_attr_set_threshold_backward_threshold(&c.a, t);
    return ke_call1(&c);
}

static void threshold_backward_op(void **s) {
    (void)s;
    static const double yv[8] = {-1, -0.0, 0, 0.25, 0.5, 0.75, NAN, INFINITY}, gv[8] = {1, 2, -3, 4, -5, 6, 7, -8};
    for (int dt = 0; dt < 2; dt++)
        for (int k = 0; k < 2; k++) {
            kl_scope_begin();
            kl_dtype t = dt ? KL_F64 : KL_F32;
            double th = k ? 0.5 : 0;
            kl_tensor *y = kl_to_dtype(kl_from_data(yv, KL_SHAPE(8), KL_F64), t);
            kl_tensor *g = kl_to_dtype(kl_from_data(gv, KL_SHAPE(8), KL_F64), t);
            kl_tensor *r = threshold_backward(g, y, th);
            assert_non_null(r);
            assert_int_equal(kl_dtype_of(r), t);
            kl_tensor *want = kl_to_dtype(kl_from_data((const double[]){0, 0, 0, k ? 0 : 4, k ? 0 : -5, 6, 7, -8}, KL_SHAPE(8),
                                                       KL_F64), t);
            assert_int_equal(kl_allclose(r, want, 0, 0, false), 1);
            /* y broadcast over g's rows */
            kl_tensor *g2 = kl_reshape(kl_arange(1, 17, 1, t), KL_SHAPE(2, 8));
            kl_tensor *r2 = threshold_backward(g2, y, th);
            kt_assert_shape(r2, KL_SHAPE(2, 8));
            assert_int_equal(kl_allclose(r2, kl_masked_fill(g2, kl_le_scalar(y, th), 0.0), 0, 0, false), 1);
            kl_scope_end();
        }
    /* relu's gradient, against the formula it replaced */
    kl_manual_seed(4);
    kl_tensor *x = kl_where(kl_gt_scalar(kl_rand(KL_SHAPE(5, 7), KL_F32), 0.9), kl_full(KL_SHAPE(1), NAN, KL_F32),
                            kl_randn(KL_SHAPE(5, 7), KL_F32));
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    kl_tensor *y = kl_relu(x), *w = kl_randn(KL_SHAPE(5, 7), KL_F32), *dx;
    kl_tensor *l = kl_sum(kl_mul(y, w), KL_ALL_DIMS, false);
    assert_int_equal(kl_autograd_grad(1, &l, NULL, 1, &x, &dx, NULL), 0);
    assert_int_equal(kl_allclose(dx, kl_masked_fill(w, kl_le_scalar(kl_detach(y), 0.0), 0.0), 0, 0, true), 1);
}

static void conv2d_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_ones(KL_SHAPE(1, 2, 5, 5), KL_F32), *w = kl_ones(KL_SHAPE(4, 3, 3, 3), KL_F32);
    assert_null(kl_conv2d(x, w, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv2d: weight [4,3,3,3] with groups = 1 expects input with 3 channels, "
                                  "got [1,2,5,5] float32 cpu");
    assert_null(kl_conv2d(kl_ones(KL_SHAPE(1, 3, 2, 2), KL_F32), w, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv2d: padded input 2x2 is smaller than the dilated kernel 3x3");
    kl_conv2d_options o = kl_conv2d_options_default();
    o.groups = 3;
    assert_null(kl_conv2d(kl_ones(KL_SHAPE(1, 9, 5, 5), KL_F32), w, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_conv2d: out channels (4) must be divisible by groups (3)");
    o = kl_conv2d_options_default();
    o.stride[1] = 0;
    assert_null(kl_conv2d(x, w, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "stride (1, 0) and dilation (1, 1) must be positive");
    assert_null(kl_conv2d(kl_ones(KL_SHAPE(1, 3, 5, 5), KL_F32), w, kl_ones(KL_SHAPE(3), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv2d: bias [3] float32 cpu must have shape [4]");
    assert_null(kl_conv2d(kl_ones(KL_SHAPE(3, 5), KL_F32), w, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input");
    assert_null(kl_conv2d(kl_ones(KL_SHAPE(1, 3, 5, 5), KL_F64), w, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_DTYPE,
                    "kl_conv2d: input [1,3,5,5] float64 cpu and weight [4,3,3,3] float32 cpu must have one dtype");
}

static void pool2d_values(void **s) {
    (void)s;
    kl_tensor *y = kl_remainder_scalar(kl_mul_scalar(ar(KL_SHAPE(1, 2, 5, 6)), 7), 11);
    kl_pool2d_options o = kl_pool2d_options_default(2);
    assert_int_equal(o.stride[1], 2);
    assert_true(o.count_include_pad && !o.ceil_mode);
    kl_tensor *r = kl_max_pool2d(kl_select(y, 0, 0), &o);
    kt_assert_shape(r, KL_SHAPE(2, 2, 3));
    KT_VALUES(r, 0, 9, 10, 6, 7, 10, 9, 10, 9, 7, 8, 9, 10);
    KT_VALUES(kl_avg_pool2d(kl_to_dtype(y, KL_I64), &o), 0, 5, 5, 3, 4, 7, 4, 6, 3, 4, 5, 5, 5); /* truncates */
    o.kernel[1] = 3, o.padding[0] = o.padding[1] = 1, o.ceil_mode = true;
    r = kl_max_pool2d(y, &o);
    kt_assert_shape(r, KL_SHAPE(1, 2, 3, 4));
    KT_VALUES(r, 0, 7, 10, 10, 2, 9, 10, 9, 9, 10, 10, 9, 7, 8, 8, 7, 3, 10, 9, 10, 10, 6, 9, 10, 8);
    KT_VALUES(kl_avg_pool2d(y, &o), 1e-6, 1.16666663, 3.33333325, 3, 0.5, 4, 5.5, 4.83333349, 2.25, 3.16666675,
              5.16666651, 4.5, 3, 1.5, 2, 1.66666663, 0.75, 4.66666651, 4.66666651, 5.83333349, 2.75, 2, 4.33333349,
              5.5, 3.5);
    o.count_include_pad = false;
    KT_VALUES(kl_avg_pool2d(y, &o), 1e-6, 3.5, 6.66666651, 6, 2, 6, 5.5, 4.83333349, 4.5, 4.75, 5.16666651, 4.5, 6,
              4.5, 4, 3.33333325, 3, 7, 4.66666651, 5.83333349, 5.5, 3, 4.33333349, 5.5, 7);
    o = kl_pool2d_options_default(3);
    o.stride[0] = o.stride[1] = 1, o.padding[0] = o.padding[1] = 1, o.dilation[0] = o.dilation[1] = 2;
    KT_VALUES(kl_max_pool2d(y, &o), 0, 8, 9, 8, 8, 10, 10, 10, 10, 8, 9, 8, 8, 9, 10, 9, 9, 8, 10, 10, 10, 9, 10, 9, 9);
    /* NaN wins in max pooling; bf16 runs through f32 */
    o = kl_pool2d_options_default(2);
    KT_VALUES(kl_max_pool2d(TF(KL_SHAPE(1, 2, 2), 1, NAN, 3, 2), &o), 0, NAN);
    r = kl_avg_pool2d(kl_to_dtype(y, KL_BF16), &o);
    assert_int_equal(kl_dtype_of(r), KL_BF16);
    KT_VALUES(r, 0, 5.25, 5.5, 3, 4, 7, 4.5, 6.25, 3.75, 4, 5, 5.25, 5.5);
}

static void pool2d_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_ones(KL_SHAPE(1, 1, 4, 4), KL_F32);
    kl_pool2d_options o = kl_pool2d_options_default(3);
    o.padding[0] = o.padding[1] = 2;
    assert_null(kl_max_pool2d(x, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_max_pool2d: padding (2, 2) should be at most half of the kernel size (3, 3)");
    o = kl_pool2d_options_default(5);
    assert_null(kl_avg_pool2d(x, &o));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_avg_pool2d: output size 0x0 is too small for input [1,1,4,4] float32 cpu");
    o = kl_pool2d_options_default(2);
    o.dilation[0] = 2;
    assert_null(kl_avg_pool2d(x, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_avg_pool2d: dilation must be 1, got (2, 1)");
    o = kl_pool2d_options_default(0);
    assert_null(kl_max_pool2d(x, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kernel (0, 0), stride (0, 0)");
    assert_null(kl_max_pool2d(x, NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_max_pool2d: options pointer is NULL");
    o = kl_pool2d_options_default(2);
    assert_null(kl_max_pool2d(kl_ones(KL_SHAPE(4, 4), KL_F32), &o));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got [4,4] float32 cpu");
    assert_null(kl_max_pool2d(kl_ones(KL_SHAPE(1, 4, 4), KL_BOOL), &o));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_max_pool2d: expects numeric (non-bool) tensors");
}

/* ---- issue 16's layers ------------------------------------------------------------------ */

/* Training updates the running buffers in place (the unbiased variance) and
 * returns the batch-normalized x; eval uses the buffers. Values against torch
 * are in the fixtures; here the update rule by hand, autograd staying out of
 * the buffers, and a failed call leaving them alone. */
static void batch_norm_running_buffers(void **s) {
    (void)s;
    /* channel 0: 1, 2, 3, 6 (mean 3, biased var 3.5, unbiased 14/3); channel 1: all 5 */
    kl_tensor *x = kl_from_data((float[]){1, 5, 2, 5, 3, 5, 6, 5}, KL_SHAPE(4, 2), KL_F32);
    kl_tensor *rm = kl_zeros(KL_SHAPE(2), KL_F32), *rv = kl_ones(KL_SHAPE(2), KL_F32);
    kl_tensor *w = kl_clone(kl_ones(KL_SHAPE(2), KL_F32));
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    assert_int_equal(kl_set_requires_grad(w, true), 0);
    kl_tensor *y = kl_batch_norm(x, rm, rv, w, NULL, true, 0.25, 1e-5);
    assert_non_null(y);
    kt_assert_values(rm, (double[]){0.75, 1.25}, 2, 1e-6);
    kt_assert_values(rv, (double[]){0.75 + 0.25 * 14.0 / 3, 0.75}, 2, 1e-6);
    double r = 1 / sqrt(3.5);
    kt_assert_values(y, (double[]){-2 * r, 0, -r, 0, 0, 0, 3 * r, 0}, 8, 1e-5); /* (eps 1e-5) */
    assert_true(kl_requires_grad(y));
    assert_false(kl_requires_grad(rm));
    assert_false(kl_requires_grad(rv));
    assert_int_equal(kl_backward(kl_sum(y, KL_ALL_DIMS, false), NULL, NULL), 0);
    /* eval: (x - rm) / sqrt(rv + eps) */
    kl_tensor *ye = kl_batch_norm(kl_detach(x), rm, rv, NULL, NULL, false, 0.25, 0);
    double sv0 = sqrt(0.75 + 0.25 * 14.0 / 3), sv1 = sqrt(0.75);
    kt_assert_values(ye, (double[]){0.25 / sv0, 3.75 / sv1, 1.25 / sv0, 3.75 / sv1, 2.25 / sv0, 3.75 / sv1, 5.25 / sv0, 3.75 / sv1},
                     8, 1e-6);
    kt_assert_values(rm, (double[]){0.75, 1.25}, 2, 1e-6); /* untouched by eval */
    /* a failed call (bad weight) leaves the buffers alone */
    assert_null(kl_batch_norm(x, rm, rv, kl_ones(KL_SHAPE(3), KL_F32), NULL, true, 0.25, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_batch_norm: weight [3] float32 cpu must have shape [2] (the input's channels)");
    kt_assert_values(rm, (double[]){0.75, 1.25}, 2, 1e-6);
    /* 4-D: statistics over N, H, W per channel */
    kl_tensor *x4 = kl_reshape(kl_arange(0, 16, 1, KL_F64), KL_SHAPE(2, 2, 2, 2));
    kl_tensor *rm4 = kl_zeros(KL_SHAPE(2), KL_F64), *rv4 = kl_zeros(KL_SHAPE(2), KL_F64);
    assert_non_null(kl_batch_norm(x4, rm4, rv4, NULL, NULL, true, 1, 1e-5));
    kt_assert_values(rm4, (double[]){5.5, 9.5}, 2, 1e-12); /* {0..3, 8..11}, {4..7, 12..15} */
    kt_assert_values(rv4, (double[]){138.0 / 7, 138.0 / 7}, 2, 1e-12); /* unbiased: 2 (5.5^2 + 4.5^2 + 3.5^2 + 2.5^2) / 7 */
}

/* The fused CPU batch_norm (forward kernel, and batch_norm_backward for
 * first-order gradients) against the same math written with kl_ ops and
 * differentiated by autograd, f32 and f64, 2-, 3- and 4-D, training and
 * eval, with and without weight and bias; and the formula its derivative
 * uses under create_graph against the fused kernel. */
static kl_tensor *bn_by_ops(kl_tensor *x, kl_tensor *rm, kl_tensor *rv, kl_tensor *w, kl_tensor *b, bool training,
                            double eps) {
    int nd = kl_ndim(x);
    int64_t dims[4] = {0, 2, 3}, cs[3] = {kl_shape(x)[1], 1, 1};
    kl_tensor *mean = training ? kl_mean(x, nd - 1, dims, true) : kl_reshape(rm, nd - 1, cs);
    kl_tensor *xc = kl_sub(x, mean);
    kl_tensor *var = training ? kl_mean(kl_mul(xc, xc), nd - 1, dims, true) : kl_reshape(rv, nd - 1, cs);
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(var, eps)));
    if (w) y = kl_mul(y, kl_reshape(w, nd - 1, cs));
    if (b) y = kl_add(y, kl_reshape(b, nd - 1, cs));
    return y;
}

static void batch_norm_fused_matches_ops(void **s) {
    (void)s;
    kl_manual_seed(8);
    static const int64_t shapes[3][4] = {{6, 3}, {7, 2, 9}, {5, 4, 6, 3}};
    for (int dt = 0; dt < 2; dt++)
        for (int sh = 0; sh < 3; sh++)
            for (int mode = 0; mode < 4; mode++) { /* training +w+b, training, eval +w+b, eval +w */
                kl_scope_begin();
                kl_dtype t = dt ? KL_F64 : KL_F32;
                double tol = dt ? 1e-10 : 2e-5;
                int nd = sh + 2;
                int64_t C = shapes[sh][1];
                bool training = mode < 2;
                /* an offset mean, so the statistics' shift matters */
                kl_tensor *x = kl_add_scalar(kl_mul_scalar(kl_randn(nd, shapes[sh], t), 2), 30);
                kl_tensor *r = kl_randn(nd, shapes[sh], t);
                kl_tensor *w = mode != 1 ? kl_add_scalar(kl_rand(KL_SHAPE(C), t), 0.5) : NULL;
                kl_tensor *b = mode == 0 || mode == 2 ? kl_randn(KL_SHAPE(C), t) : NULL;
                kl_tensor *rm = kl_add_scalar(kl_randn(KL_SHAPE(C), t), 30), *rv = kl_add_scalar(kl_rand(KL_SHAPE(C), t), 1);
                kl_tensor *leaves[3] = {x, w, b}, *ref[3] = {0}, *fused[3] = {0}, *formula[3] = {0};
                int nl = 0;
                kl_tensor *req[3];
                for (int i = 0; i < 3; i++)
                    if (leaves[i]) {
                        assert_int_equal(kl_set_requires_grad(leaves[i], true), 0);
                        req[nl++] = leaves[i];
                    }
                kl_tensor *y = kl_batch_norm(x, training ? NULL : rm, training ? NULL : rv, w, b, training, 0.1, 1e-5);
                kl_tensor *ye = bn_by_ops(x, rm, rv, w, b, training, 1e-5);
                assert_int_equal(kl_allclose(y, ye, tol, tol, false), 1);
                kl_tensor *ly = kl_sum(kl_mul(y, r), KL_ALL_DIMS, false), *le = kl_sum(kl_mul(ye, r), KL_ALL_DIMS, false);
                kl_backward_options cg = kl_backward_options_default();
                cg.retain_graph = true;
                assert_int_equal(kl_autograd_grad(1, &le, NULL, nl, req, ref, NULL), 0);
                assert_int_equal(kl_autograd_grad(1, &ly, NULL, nl, req, fused, &cg), 0);
                cg.create_graph = true;
                assert_int_equal(kl_autograd_grad(1, &ly, NULL, nl, req, formula, &cg), 0);
                for (int i = 0; i < nl; i++) {
                    assert_int_equal(kl_allclose(fused[i], ref[i], tol, tol * 10, false), 1);
                    assert_int_equal(kl_allclose(formula[i], ref[i], tol, tol * 10, false), 1);
                }
                kl_scope_end();
            }
}

/* layer_norm's backward (the fused layer_norm_backward kernel for first-order
 * gradients) against the same math written with kl_ ops and differentiated
 * by autograd, f32 and f64, over 1 and 2 normalized dims, with and without
 * weight and bias, with rows not a multiple of the kernel's 64-row blocks
 * and with no leading dims at all; the formula its derivative uses under
 * create_graph against it; and dweight the same bits at 1 and 2 threads. */
static kl_tensor *ln_by_ops(kl_tensor *x, int nd, kl_tensor *w, kl_tensor *b, double eps) {
    int64_t dims[2] = {-nd, -1};
    if (nd == 2) dims[1] = -1, dims[0] = -2;
    kl_tensor *xc = kl_sub(x, kl_mean(x, nd, dims, true));
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(kl_mean(kl_mul(xc, xc), nd, dims, true), eps)));
    if (w) y = kl_mul(y, w);
    if (b) y = kl_add(y, b);
    return y;
}

static void layer_norm_fused_backward_matches_ops(void **s) {
    (void)s;
    kl_manual_seed(9);
    static const int64_t shapes[4][3] = {{6, 5}, {3, 70, 9}, {130, 4, 3}, {11}};
    static const int ndims[4] = {2, 3, 3, 1}, nds[4] = {1, 1, 2, 1};
    for (int dt = 0; dt < 2; dt++)
        for (int sh = 0; sh < 4; sh++)
            for (int mode = 0; mode < 3; mode++) { /* +w+b, +w, neither */
                kl_scope_begin();
                kl_dtype t = dt ? KL_F64 : KL_F32;
                double tol = dt ? 1e-10 : 2e-5;
                int nd = nds[sh], xd = ndims[sh];
                const int64_t *ns = shapes[sh] + xd - nd;
                /* an offset mean, so the statistics' shift matters */
                kl_tensor *x = kl_add_scalar(kl_mul_scalar(kl_randn(xd, shapes[sh], t), 2), 30);
                kl_tensor *r = kl_randn(xd, shapes[sh], t);
                kl_tensor *w = mode < 2 ? kl_add_scalar(kl_rand(nd, ns, t), 0.5) : NULL;
                kl_tensor *b = mode == 0 ? kl_randn(nd, ns, t) : NULL;
                kl_tensor *leaves[3] = {x, w, b}, *ref[3] = {0}, *fused[3] = {0}, *formula[3] = {0};
                kl_tensor *req[3];
                int nl = 0;
                for (int i = 0; i < 3; i++)
                    if (leaves[i]) {
                        assert_int_equal(kl_set_requires_grad(leaves[i], true), 0);
                        req[nl++] = leaves[i];
                    }
                kl_tensor *y = kl_layer_norm(x, nd, w, b, 1e-5), *ye = ln_by_ops(x, nd, w, b, 1e-5);
                assert_int_equal(kl_allclose(y, ye, tol, tol, false), 1);
                kl_tensor *ly = kl_sum(kl_mul(y, r), KL_ALL_DIMS, false), *le = kl_sum(kl_mul(ye, r), KL_ALL_DIMS, false);
                kl_backward_options cg = kl_backward_options_default();
                cg.retain_graph = true;
                assert_int_equal(kl_autograd_grad(1, &le, NULL, nl, req, ref, NULL), 0);
                assert_int_equal(kl_autograd_grad(1, &ly, NULL, nl, req, fused, &cg), 0);
                cg.create_graph = true;
                assert_int_equal(kl_autograd_grad(1, &ly, NULL, nl, req, formula, &cg), 0);
                for (int i = 0; i < nl; i++) {
                    assert_int_equal(kl_ndim(fused[i]), kl_ndim(req[i]));
                    assert_int_equal(kl_allclose(fused[i], ref[i], tol, tol * 10, false), 1);
                    assert_int_equal(kl_allclose(formula[i], ref[i], tol, tol * 10, false), 1);
                }
                kl_scope_end();
            }
    /* dweight, dbias: the 64-row blocks' sums added in block order, whatever the threads */
    int threads = kl_get_num_threads();
    kl_scope_begin();
    kl_tensor *x = kl_randn(KL_SHAPE(300, 48), KL_F32), *w = kl_rand(KL_SHAPE(48), KL_F32),
              *b = kl_randn(KL_SHAPE(48), KL_F32), *r = kl_randn(KL_SHAPE(300, 48), KL_F32);
    kl_tensor *req[3] = {x, w, b}, *g1[3] = {0}, *g2[3] = {0};
    for (int i = 0; i < 3; i++) assert_int_equal(kl_set_requires_grad(req[i], true), 0);
    for (int k = 0; k < 2; k++) {
        kl_set_num_threads(k + 1);
        kl_tensor *l = kl_sum(kl_mul(kl_layer_norm(x, 1, w, b, 1e-5), r), KL_ALL_DIMS, false);
        assert_int_equal(kl_autograd_grad(1, &l, NULL, 3, req, k ? g2 : g1, NULL), 0);
    }
    kl_set_num_threads(threads);
    for (int i = 0; i < 3; i++) assert_int_equal(kl_equal(g1[i], g2[i]), 1);
    kl_scope_end();
}

/* batch_norm_stats (internal: kl_batch_norm's running buffers take its
 * outputs; called by name here): the per-channel mean and unbiased variance
 * against kl_mean and kl_var, f32 and f64, 2- to 4-D, with a mean far from 0
 * (the kernel's shifted sums must not cancel) and planes longer than a row
 * fold's chunk; a NaN stays in its channel; f16 computes through f32; a 1-D
 * input is refused. */
static void batch_norm_stats_matches_mean_var(void **s) {
    (void)s;
    kl_manual_seed(12);
    static const int64_t shapes[4][4] = {{6, 3}, {7, 2, 9}, {5, 4, 6, 3}, {3, 2, 70, 40}};
    static const int nds[4] = {2, 3, 4, 4};
    int64_t dims[3] = {0, 2, 3};
    for (int dt = 0; dt < 2; dt++)
        for (int sh = 0; sh < 4; sh++) {
            kl_scope_begin();
            kl_dtype t = dt ? KL_F64 : KL_F32;
            double tol = dt ? 1e-10 : 1e-5;
            int nd = nds[sh];
            kl_tensor *x = kl_add_scalar(kl_mul_scalar(kl_randn(nd, shapes[sh], t), 2), 300), *o[2];
            assert_int_equal(kl_op_call("batch_norm_stats", &x, 1, NULL, o, 2), 0);
            assert_int_equal(kl_dtype_of(o[0]), t);
            assert_int_equal(kl_ndim(o[1]), 1);
            assert_int_equal(kl_size(o[1], 0), shapes[sh][1]);
            assert_int_equal(kl_allclose(o[0], kl_mean(x, nd - 1, dims, false), tol, tol, false), 1);
            assert_int_equal(kl_allclose(o[1], kl_var(x, nd - 1, dims, 1, false), tol, tol, false), 1);
            kl_scope_end();
        }
    kl_scope_begin();
    float v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, NAN, 12}; /* [2, 2, 3]: the NaN is in channel 1 */
    kl_tensor *x = kl_from_data(v, KL_SHAPE(2, 2, 3), KL_F32), *o[2];
    assert_int_equal(kl_op_call("batch_norm_stats", &x, 1, NULL, o, 2), 0);
    kt_assert_values(o[0], (double[]){5, NAN}, 2, 1e-6); /* channel 0: 1, 2, 3, 7, 8, 9 */
    kt_assert_values(o[1], (double[]){58 / 5.0, NAN}, 2, 1e-6); /* deviations 4, 3, 2 twice */
    kl_tensor *h = kl_to_dtype(kl_add_scalar(kl_randn(KL_SHAPE(8, 3, 5), KL_F32), 4), KL_F16);
    assert_int_equal(kl_op_call("batch_norm_stats", &h, 1, NULL, o, 2), 0);
    assert_int_equal(kl_dtype_of(o[1]), KL_F16);
    kl_tensor *hf = kl_to_dtype(h, KL_F32);
    assert_int_equal(kl_allclose(kl_to_dtype(o[0], KL_F32), kl_mean(hf, 2, (int64_t[]){0, 2}, false), 1e-3, 1e-3, false), 1);
    assert_int_equal(kl_allclose(kl_to_dtype(o[1], KL_F32), kl_var(hf, 2, (int64_t[]){0, 2}, 1, false), 1e-3, 1e-3, false), 1);
    kl_tensor *one = kl_ones(KL_SHAPE(4), KL_F32);
    assert_int_equal(kl_op_call("batch_norm_stats", &one, 1, NULL, o, 2), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "batch_norm_stats: expects an input [N, C, ...] with at least 2 dims, got");
    kl_scope_end();
}

/* conv2d_weight_grad's direct path (few taps, stride 1, no padding or
 * dilation: conv.c) against the formula, conv2d over x and g with batch and
 * channels swapped, in f64: the fashion CNN's first layer, three channels
 * with a non-square kernel, rows longer than its 16 lanes, a 1x1 kernel;
 * f32 and f64. A case over 32 taps takes the GEMM path: the same check. */
static void conv2d_weight_grad_direct_matches_formula(void **s) {
    (void)s;
    kl_manual_seed(21);
    static const int64_t cases[5][7] = {/* N, C, H, W, O, kh, kw */
                                        {8, 1, 28, 28, 32, 3, 3},
                                        {3, 3, 9, 7, 5, 3, 2},
                                        {2, 2, 5, 40, 4, 1, 3},
                                        {2, 3, 4, 5, 3, 1, 1},
                                        {2, 4, 6, 6, 3, 3, 3}};
    for (int dt = 0; dt < 2; dt++)
        for (int i = 0; i < 5; i++) {
            kl_scope_begin();
            const int64_t *k = cases[i];
            kl_dtype t = dt ? KL_F64 : KL_F32;
            int64_t oh = k[2] - k[5] + 1, ow = k[3] - k[6] + 1;
            kl_tensor *in[2] = {kl_randn(KL_SHAPE(k[0], k[1], k[2], k[3]), t), kl_randn(KL_SHAPE(k[0], k[4], oh, ow), t)};
            char attrs[160], msg[64];
            snprintf(attrs, sizeof attrs,
                     "stride=[1,1], padding=[0,0], dilation=[1,1], kernel_size=[%lld,%lld], groups=1",
                     (long long)k[5], (long long)k[6]);
            kl_tensor *dw;
            assert_int_equal(kl_op_call("conv2d_weight_grad", in, 2, attrs, &dw, 1), 0);
            kl_tensor *ref = kl_transpose(kl_conv2d(kl_transpose(kl_to_dtype(in[0], KL_F64), 0, 1),
                                                    kl_transpose(kl_to_dtype(in[1], KL_F64), 0, 1), NULL, NULL),
                                          0, 1);
            kt_assert_shape(dw, 4, (int64_t[]){k[4], k[1], k[5], k[6]});
            assert_int_equal(kl_dtype_of(dw), t);
            snprintf(msg, sizeof msg, "case %d, %s", i, dt ? "f64" : "f32");
            if (kl_allclose(kl_to_dtype(dw, KL_F64), ref, dt ? 1e-10 : 1e-4, dt ? 1e-10 : 1e-4, false) != 1) {
                print_error("%s: the weight gradient differs from the formula\n", msg);
                fail();
            }
            kl_scope_end();
        }
}

static void batch_norm_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_ones(KL_SHAPE(4, 3), KL_F32), *c = kl_zeros(KL_SHAPE(3), KL_F32);
    assert_null(kl_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_batch_norm: eval mode (training = false) needs running_mean and running_var");
    assert_null(kl_batch_norm(x, c, NULL, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "running_mean and running_var must be given together");
    kl_tensor *g = kl_clone(c);
    assert_int_equal(kl_set_requires_grad(g, true), 0);
    assert_null(kl_batch_norm(x, g, c, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "they must not require grad");
    assert_null(kl_batch_norm(x, kl_zeros(KL_SHAPE(4), KL_F32), c, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_batch_norm: running_mean [4] float32 cpu must have shape [3]");
    assert_null(kl_batch_norm(x, c, kl_zeros(KL_SHAPE(3), KL_F64), NULL, NULL, false, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_batch_norm: running_var [3] float64 cpu does not match the input's dtype float32");
    assert_null(kl_batch_norm(kl_ones(KL_SHAPE(1, 3), KL_F32), NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "expected more than 1 value per channel when training, got input [1,3]");
    assert_null(kl_batch_norm(kl_ones(KL_SHAPE(3), KL_F32), NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_batch_norm: expects an input [N, C, ...] with at least 2 dims, got [3]");
    assert_null(kl_batch_norm(kl_ones(KL_SHAPE(4, 3), KL_I64), NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_batch_norm");
    assert_null(kl_batch_norm(NULL, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
    kl_clear_error();
    /* group_norm */
    assert_null(kl_group_norm(kl_ones(KL_SHAPE(2, 6, 2), KL_F32), 4, NULL, NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_group_norm: num_groups (4) must be positive and divide the channels of input "
                                "[2,6,2] float32 cpu");
    assert_null(kl_group_norm(kl_ones(KL_SHAPE(2, 6, 2), KL_F32), 0, NULL, NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "num_groups (0) must be positive");
    assert_null(kl_group_norm(kl_ones(KL_SHAPE(2, 6, 2), KL_F32), 3, NULL, kl_ones(KL_SHAPE(2), KL_F32), 1e-5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_group_norm: bias [2] float32 cpu must have shape [6]");
}

/* Each plane is kept whole (scaled by 1/(1-p)) or zeroed whole, about p of
 * them zeroed; the same seed gives the same planes; eval is a view. */
static void dropout2d_planes(void **s) {
    (void)s;
    kl_manual_seed(3);
    kl_tensor *x = kl_add_scalar(kl_rand(KL_SHAPE(40, 50, 3, 2), KL_F32), 1);
    kl_tensor *y = kl_dropout2d(x, 0.3, true);
    assert_non_null(y);
    int64_t dropped = 0;
    for (int64_t pl = 0; pl < 2000; pl++) {
        double f = kt_get(y, pl * 6) / kt_get(x, pl * 6);
        assert_true(f == 0 || fabs(f - 1 / 0.7) < 1e-5);
        for (int64_t j = 1; j < 6; j++) assert_true(fabs(kt_get(y, pl * 6 + j) - f * kt_get(x, pl * 6 + j)) < 1e-5);
        dropped += f == 0;
    }
    assert_true(dropped > 2000 * 0.3 - 4 * sqrt(2000 * 0.21) && dropped < 2000 * 0.3 + 4 * sqrt(2000 * 0.21));
    kl_manual_seed(3);
    kl_rand(KL_SHAPE(40, 50, 3, 2), KL_F32);
    assert_int_equal(kl_equal(kl_dropout2d(x, 0.3, true), y), 1);
    /* f64 and 3-D [N, C, L]: planes are [N, C] */
    kl_tensor *x3 = kl_ones(KL_SHAPE(30, 20, 5), KL_F64), *y3 = kl_dropout2d(x3, 0.5, true);
    for (int64_t pl = 0; pl < 600; pl++)
        for (int64_t j = 1; j < 5; j++) assert_true(kt_get(y3, pl * 5 + j) == kt_get(y3, pl * 5));
    kl_tensor *ye = kl_dropout2d(x, 0.3, false);
    assert_int_equal(kl_equal(ye, x), 1);
    assert_null(kl_dropout2d(kl_ones(KL_SHAPE(4, 5), KL_F32), 0.5, true));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_dropout2d: expects a 3-D [N,C,L] or 4-D [N,C,H,W] input, got [4,5]");
    assert_null(kl_dropout2d(x, 1.5, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_dropout2d: probability has to be between 0 and 1, got 1.5");
    assert_null(kl_dropout2d(kl_ones(KL_SHAPE(2, 2, 2), KL_I32), 0.5, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_dropout2d");
}

/* conv_transpose2d is the adjoint of conv2d: <conv2d(x, w), g> = <x, conv_transpose2d(g, w)>
 * for every option set; plus the errors of conv1d, conv_transpose2d and adaptive_avg_pool2d. */
static void conv_transpose2d_is_conv2d_adjoint(void **s) {
    (void)s;
    kl_manual_seed(5);
    static const struct {
        int64_t x[4], w[4], st[2], pad[2], dil[2], groups;
    } cases[] = {{{2, 4, 7, 6}, {6, 2, 3, 2}, {2, 1}, {1, 0}, {1, 2}, 2}, {{1, 3, 8, 8}, {2, 3, 3, 3}, {3, 3}, {2, 1}, {1, 1}, 1}};
    for (int i = 0; i < 2; i++) {
        kl_tensor *x = kl_randn(4, cases[i].x, KL_F64), *w = kl_randn(4, cases[i].w, KL_F64);
        kl_conv2d_options o = {{cases[i].st[0], cases[i].st[1]}, {cases[i].pad[0], cases[i].pad[1]},
                               {cases[i].dil[0], cases[i].dil[1]}, cases[i].groups};
        kl_tensor *y = kl_conv2d(x, w, NULL, &o);
        kl_tensor *g = kl_randn_like(y);
        kl_conv_transpose2d_options t = kl_conv_transpose2d_options_default();
        for (int d = 0; d < 2; d++) {
            t.stride[d] = o.stride[d], t.padding[d] = o.padding[d], t.dilation[d] = o.dilation[d];
            t.output_padding[d] = cases[i].x[2 + d] - ((kl_shape(y)[2 + d] - 1) * o.stride[d] - 2 * o.padding[d] +
                                                       o.dilation[d] * (cases[i].w[2 + d] - 1) + 1);
        }
        t.groups = o.groups;
        kl_tensor *xt = kl_conv_transpose2d(g, w, NULL, &t);
        kt_assert_shape(xt, 4, cases[i].x);
        double a = kl_item(kl_sum(kl_mul(y, g), KL_ALL_DIMS, false)), b = kl_item(kl_sum(kl_mul(x, xt), KL_ALL_DIMS, false));
        assert_true(fabs(a - b) < 1e-9 * (1 + fabs(a)));
    }
    kl_tensor *x = kl_ones(KL_SHAPE(1, 4, 3, 3), KL_F32), *w = kl_ones(KL_SHAPE(4, 2, 3, 3), KL_F32);
    kl_conv_transpose2d_options t = kl_conv_transpose2d_options_default();
    t.output_padding[0] = 1;
    assert_null(kl_conv_transpose2d(x, w, NULL, &t));
    KT_EXPECT_ERROR(KL_ERR_ARG, "output_padding (1, 0) non-negative and smaller than either stride or dilation");
    t = kl_conv_transpose2d_options_default();
    t.groups = 3;
    assert_null(kl_conv_transpose2d(x, w, NULL, &t));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv_transpose2d: weight [4,2,3,3] float32 cpu with groups = 3 expects an input "
                                  "whose 4 channels are divisible by groups");
    assert_null(kl_conv_transpose2d(x, w, kl_ones(KL_SHAPE(4), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv_transpose2d: bias [4] float32 cpu must have shape [2]");
    t = kl_conv_transpose2d_options_default();
    t.padding[0] = t.padding[1] = 3;
    assert_null(kl_conv_transpose2d(x, w, NULL, &t));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "output size -1 along dim 2 is not positive");
    t = kl_conv_transpose2d_options_default();
    t.stride[0] = INT64_MAX / 2;
    assert_null(kl_conv_transpose2d(x, w, NULL, &t));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv_transpose2d: output size of input [1,4,3,3] float32 cpu overflows");
    /* conv1d */
    kl_tensor *x1 = kl_ones(KL_SHAPE(2, 3, 5), KL_F32);
    assert_null(kl_conv1d(x1, kl_ones(KL_SHAPE(4, 2, 3), KL_F32), NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv1d: weight [4,2,3] float32 cpu with groups = 1 expects out channels "
                                  "divisible by groups and an input with 2 channels, got [2,3,5] float32 cpu");
    assert_null(kl_conv1d(x1, kl_ones(KL_SHAPE(4, 3, 6), KL_F32), NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv1d: padded input length is smaller than the dilated kernel");
    kl_conv1d_options o1 = kl_conv1d_options_default();
    o1.dilation = INT64_MAX / 2;
    assert_null(kl_conv1d(x1, kl_ones(KL_SHAPE(4, 3, 3), KL_F32), NULL, &o1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv1d: padded input length is smaller than the dilated kernel");
    assert_null(kl_conv1d(kl_ones(KL_SHAPE(2, 3, 5, 1), KL_F32), kl_ones(KL_SHAPE(4, 3, 3), KL_F32), NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_conv1d: expects a 2-D [C,L] or 3-D [N,C,L] input, got [2,3,5,1]");
    o1 = kl_conv1d_options_default();
    o1.stride = 0;
    assert_null(kl_conv1d(x1, kl_ones(KL_SHAPE(4, 3, 3), KL_F32), NULL, &o1));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_conv1d: stride (0), dilation (1) and groups (1) must be positive");
    /* adaptive_avg_pool2d */
    assert_null(kl_adaptive_avg_pool2d(kl_ones(KL_SHAPE(3, 4), KL_F32), 2, 2));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_adaptive_avg_pool2d: expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got [3,4]");
    assert_null(kl_adaptive_avg_pool2d(x, -1, 2));
    KT_EXPECT_ERROR(KL_ERR_ARG, "output size (-1, 2) must be non-negative");
    assert_null(kl_adaptive_avg_pool2d(x, INT64_MAX / 2, 2));
    KT_EXPECT_ERROR(KL_ERR_ARG, "must be non-negative and fit input");
    assert_null(kl_adaptive_avg_pool2d(kl_ones(KL_SHAPE(1, 2, 0, 3), KL_F32), 1, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "expects non-empty channel and spatial dims");
    assert_null(kl_adaptive_avg_pool2d(kl_ones(KL_SHAPE(1, 2, 3, 3), KL_I64), 1, 1));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_adaptive_avg_pool2d");
    /* PyTorch's windows for 5 -> 3: [0, 2), [1, 4), [3, 5) */
    kl_tensor *r = kl_adaptive_avg_pool2d(kl_reshape(kl_arange(0, 5, 1, KL_F32), KL_SHAPE(1, 1, 5)), 1, 3);
    kt_assert_values(r, (double[]){0.5, 2, 3.5}, 3, 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(conv2d_values),
        KT_TEST(conv2d_batched_columns),
        KT_TEST(max_pool2d_fused_backward),
        KT_TEST(conv2d_weight_grad_kernel),
        KT_TEST(conv2d_input_grad_kernel),
        KT_TEST(threshold_backward_op),
        KT_TEST(conv2d_errors),
        KT_TEST(pool2d_values),
        KT_TEST(pool2d_errors),
        KT_TEST(batch_norm_running_buffers),
        KT_TEST(batch_norm_errors),
        KT_TEST(batch_norm_stats_matches_mean_var),
        KT_TEST(conv2d_weight_grad_direct_matches_formula),
        KT_TEST(batch_norm_fused_matches_ops),
        KT_TEST(layer_norm_fused_backward_matches_ops),
        KT_TEST(dropout2d_planes),
        KT_TEST(conv_transpose2d_is_conv2d_adjoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
