/*
 * test_cuda_conv.c — conv2d (im2col + cuBLAS, cn_conv.c), max_pool2d and
 * avg_pool2d on CUDA tensors against the CPU: conv2d with stride, padding,
 * dilation, groups, bias, unbatched input, a transposed (non-contiguous)
 * input, f32 / f64 / f16 / bf16 (within the GEMM tolerance: 1e-5 f32, 1e-12
 * f64, 1e-2 f16 / bf16 relative to the sum of |terms|), conv1d and
 * conv_transpose2d (written with conv2d), conv2d's gradients by kl_backward
 * (input, weight, bias), an integer conv2d refused clearly; pooling bitwise
 * (every dtype, padding, dilation, ceil_mode, count_include_pad, NaN) and
 * avg_pool2d's gradient. The NVRTC compile of each program runs in the suite
 * without the emulator. Runs on the emulated device in CI (cuda_conv_emu).
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"

#include <math.h>
#include <string.h>

static const char *OP = "cuda_conv_test";

static double tol_of(kl_dtype d) {
    return d == KL_F64 ? 1e-12 : d == KL_F32 ? 1e-5 : 2e-2;
}

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    kl_conv2d_options opt;
    int bias, batched;
} conv_case;

static const conv_case cases[] = {
    {2, 3, 7, 6, 4, 3, 3, {{1, 1}, {0, 0}, {1, 1}, 1}, 1, 1},
    {2, 4, 9, 8, 6, 3, 2, {{2, 1}, {1, 2}, {1, 1}, 2}, 1, 1},
    {1, 2, 10, 9, 3, 3, 3, {{1, 2}, {2, 1}, {2, 3}, 1}, 0, 1},
    {3, 6, 5, 5, 6, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 3}, 1, 1}, /* 1x1, depthwise-like groups */
    {1, 2, 6, 7, 4, 2, 3, {{3, 2}, {1, 1}, {2, 1}, 2}, 1, 0}, /* unbatched */
};

static void conv2d_forward(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    kl_manual_seed(31);
    int n = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t d = 0; d < 4; d++) {
            const conv_case *k = &cases[i];
            kl_scope_begin();
            kl_tensor *x = k->batched ? kl_randn(KL_SHAPE(k->n, k->c, k->h, k->w), KL_F64)
                                      : kl_randn(KL_SHAPE(k->c, k->h, k->w), KL_F64);
            kl_tensor *w = kl_randn(KL_SHAPE(k->o, k->c / k->opt.groups, k->kh, k->kw), KL_F64);
            kl_tensor *b = k->bias ? kl_randn(KL_SHAPE(k->o), KL_F64) : NULL;
            x = kl_to_dtype(x, dts[d]), w = kl_to_dtype(w, dts[d]);
            if (b) b = kl_to_dtype(b, dts[d]);
            kl_tensor *gx = kl_to_device(x, CUDA0), *gw = kl_to_device(w, CUDA0), *gb = b ? kl_to_device(b, CUDA0) : NULL;
            char what[96];
            snprintf(what, sizeof what, "conv2d case %zu %s", i, kl_dtype_name(dts[d]));
            compare(kl_conv2d(x, w, b, &k->opt), kl_conv2d(gx, gw, gb, &k->opt), tol_of(dts[d]), what);
            n++;
            kl_scope_end();
        }
    /* a non-contiguous input (a transposed view) */
    kl_tensor *x = kl_transpose(kl_randn(KL_SHAPE(2, 3, 6, 5), KL_F32), 2, 3), *w = kl_randn(KL_SHAPE(4, 3, 2, 2), KL_F32);
    kl_conv2d_options o = kl_conv2d_options_default();
    compare(kl_conv2d(x, w, NULL, &o), kl_conv2d(kl_to_device(x, CUDA0), kl_to_device(w, CUDA0), NULL, &o), 1e-5,
            "conv2d of a transposed view");
    /* conv1d and conv_transpose2d: conv2d in other shapes */
    kl_tensor *x1 = kl_randn(KL_SHAPE(2, 4, 11), KL_F32), *w1 = kl_randn(KL_SHAPE(6, 2, 3), KL_F32);
    kl_conv1d_options o1 = {.stride = 2, .padding = 1, .dilation = 2, .groups = 2};
    compare(kl_conv1d(x1, w1, NULL, &o1), kl_conv1d(kl_to_device(x1, CUDA0), kl_to_device(w1, CUDA0), NULL, &o1), 1e-5,
            "conv1d");
    kl_tensor *xt = kl_randn(KL_SHAPE(2, 4, 5, 4), KL_F32), *wt = kl_randn(KL_SHAPE(4, 3, 3, 2), KL_F32);
    kl_conv_transpose2d_options ot = kl_conv_transpose2d_options_default();
    ot.stride[0] = 2, ot.padding[1] = 1, ot.output_padding[0] = 1;
    kl_tensor *gct = kl_conv_transpose2d(kl_to_device(xt, CUDA0), kl_to_device(wt, CUDA0), NULL, &ot);
    compare(kl_conv_transpose2d(xt, wt, NULL, &ot), gct, 1e-5, "conv_transpose2d");
    /* integers: cuBLAS has no integer GEMM */
    kl_tensor *xi = kl_to_device(kl_ones(KL_SHAPE(1, 1, 3, 3), KL_I32), CUDA0);
    assert_null(kl_conv2d(xi, xi, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "cuBLAS has no integer GEMM");
    print_message("%d conv2d cases within tolerance of the CPU\n", n);
}

/* kl_backward through conv2d (input, weight and bias gradients; the input's
 * is conv_transpose2d, so kl_pad and kl_index_select on CUDA) gives the
 * CPU's gradients within 1e-4. */
static void conv2d_backward(void **st) {
    (void)st;
    NEED_CUDA();
    kl_manual_seed(32);
    for (size_t i = 0; i < 3; i++) {
        const conv_case *k = &cases[i];
        kl_tensor *x0 = kl_randn(KL_SHAPE(k->n, k->c, k->h, k->w), KL_F32);
        kl_tensor *w0 = kl_randn(KL_SHAPE(k->o, k->c / k->opt.groups, k->kh, k->kw), KL_F32);
        kl_tensor *b0 = kl_randn(KL_SHAPE(k->o), KL_F32);
        kl_tensor *g[2][3];
        for (int dev = 0; dev < 2; dev++) {
            kl_device dv = dev ? CUDA0 : KL_DEVICE_CPU;
            kl_tensor *p[3] = {kl_to_device(kl_clone(x0), dv), kl_to_device(kl_clone(w0), dv),
                               kl_to_device(kl_clone(b0), dv)};
            for (int j = 0; j < 3; j++) assert_int_equal(kl_set_requires_grad(p[j], true), 0);
            kl_tensor *y = kl_conv2d(p[0], p[1], p[2], &k->opt);
            kl_tensor *loss = kl_sum(kl_mul(y, y), 0, NULL, false);
            if (!loss) print_error("forward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
            assert_non_null(loss);
            int rc = kl_backward(loss, NULL, NULL);
            if (rc) print_error("backward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
            assert_int_equal(rc, 0);
            for (int j = 0; j < 3; j++) g[dev][j] = kl_grad(p[j]);
        }
        compare(g[0][0], g[1][0], 1e-4, "conv2d input gradient");
        compare(g[0][1], g[1][1], 1e-4, "conv2d weight gradient");
        compare(g[0][2], g[1][2], 1e-4, "conv2d bias gradient");
    }
}

static void pooling(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16, KL_I32, KL_I64, KL_U8};
    kl_pool2d_options os[4];
    os[0] = kl_pool2d_options_default(2);
    os[1] = kl_pool2d_options_default(3);
    os[1].stride[0] = 2, os[1].stride[1] = 1, os[1].padding[0] = 1, os[1].padding[1] = 1, os[1].ceil_mode = true;
    os[2] = os[1];
    os[2].count_include_pad = false;
    os[3] = kl_pool2d_options_default(2);
    os[3].dilation[0] = 2; /* max only */
    kl_manual_seed(33);
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (int k = 0; k < 4; k++) {
            kl_scope_begin();
            kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(2, 3, 7, 8), KL_F64), kl_dtype_is_floating(dts[d]) ? 1 : 30);
            if (dts[d] == KL_U8) x = kl_abs(x);
            x = kl_to_dtype(x, dts[d]);
            kl_tensor *gx = kl_to_device(x, CUDA0);
            char what[96];
            snprintf(what, sizeof what, "max_pool2d %s options %d", kl_dtype_name(dts[d]), k);
            compare(kl_max_pool2d(x, &os[k]), kl_max_pool2d(gx, &os[k]), 0, what);
            if (k < 3) {
                snprintf(what, sizeof what, "avg_pool2d %s options %d", kl_dtype_name(dts[d]), k);
                compare(kl_avg_pool2d(x, &os[k]), kl_avg_pool2d(gx, &os[k]), 0, what);
                /* unbatched, transposed */
                kl_tensor *xt = kl_transpose(kl_select(x, 0, 1), 1, 2), *gt = kl_transpose(kl_select(gx, 0, 1), 1, 2);
                snprintf(what, sizeof what, "avg_pool2d 3-D view %s options %d", kl_dtype_name(dts[d]), k);
                compare(kl_avg_pool2d(xt, &os[k]), kl_avg_pool2d(gt, &os[k]), 0, what);
            }
            kl_scope_end();
        }
    /* NaN wins the max */
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)i;
    v[5] = NAN;
    kl_tensor *x = kl_from_data(v, 4, (int64_t[]){1, 1, 4, 4}, KL_F32);
    compare(kl_max_pool2d(x, &os[0]), kl_max_pool2d(kl_to_device(x, CUDA0), &os[0]), 0, "max_pool2d with a NaN");
    /* adaptive_avg_pool2d (windows of uneven sizes), and its gradient (matmuls) */
    static const kl_dtype fdts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    for (int d = 0; d < 4; d++) {
        kl_tensor *xa = kl_to_dtype(kl_randn(KL_SHAPE(2, 3, 7, 9), KL_F64), fdts[d]);
        kl_tensor *gxa = kl_to_device(xa, CUDA0);
        compare(kl_adaptive_avg_pool2d(xa, 3, 4), kl_adaptive_avg_pool2d(gxa, 3, 4), 0, "adaptive_avg_pool2d");
        compare(kl_adaptive_avg_pool2d(kl_select(xa, 0, 1), 5, 2), kl_adaptive_avg_pool2d(kl_select(gxa, 0, 1), 5, 2),
                0, "adaptive_avg_pool2d 3-D");
    }
    {
        kl_tensor *xa = kl_randn(KL_SHAPE(2, 3, 7, 9), KL_F32), *ga[2];
        for (int dev = 0; dev < 2; dev++) {
            kl_tensor *p = kl_to_device(kl_clone(xa), dev ? CUDA0 : KL_DEVICE_CPU);
            assert_int_equal(kl_set_requires_grad(p, true), 0);
            kl_tensor *y = kl_adaptive_avg_pool2d(p, 3, 4);
            int rc = kl_backward(kl_sum(kl_mul(y, y), 0, NULL, false), NULL, NULL);
            if (rc) print_error("adaptive_avg_pool2d backward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
            assert_int_equal(rc, 0);
            ga[dev] = kl_grad(p);
        }
        compare(ga[0], ga[1], 1e-5, "adaptive_avg_pool2d gradient");
    }
    /* avg_pool2d's gradient (a transposed convolution of ones) */
    kl_tensor *x0 = kl_randn(KL_SHAPE(2, 2, 7, 6), KL_F32), *gr[2];
    for (int dev = 0; dev < 2; dev++) {
        kl_tensor *p = kl_to_device(kl_clone(x0), dev ? CUDA0 : KL_DEVICE_CPU);
        assert_int_equal(kl_set_requires_grad(p, true), 0);
        kl_tensor *y = kl_avg_pool2d(p, &os[1]);
        kl_tensor *loss = kl_sum(kl_mul(y, y), 0, NULL, false);
        assert_non_null(loss);
        int rc = kl_backward(loss, NULL, NULL);
        if (rc) print_error("avg_pool2d backward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
        assert_int_equal(rc, 0);
        gr[dev] = kl_grad(p);
    }
    compare(gr[0], gr[1], 1e-5, "avg_pool2d gradient");
}

/* Every conv / pool program compiles with NVRTC for sm_80 and sm_90 without spilling. */
static void nvrtc_compiles(void **st) {
    (void)st;
    NEED_NVRTC_ONLY();
    static const struct {
        int pool;
        kl_dtype dt;
    } ps[] = {{0, KL_F32}, {0, KL_F64}, {0, KL_F16}, {1, KL_F32}, {1, KL_F64},
              {1, KL_I32}, {1, KL_I64}, {1, KL_U8}};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        cn_kernel_src src;
        assert_int_equal(cn_conv_program(ps[i].pool, ps[i].dt, &src), 0);
        kt_nvrtc_compiles(OP, src.src, "conv.cu");
        cn_kernel_src_free(&src);
    }
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(conv2d_forward),
        KT_TEST(conv2d_backward),
        KT_TEST(pooling),
        KT_TEST(nvrtc_compiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
