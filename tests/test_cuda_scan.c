/*
 * test_cuda_scan.c — cumsum and cumprod on CUDA tensors (cn_scan.c) against
 * the CPU: every dtype the CPU takes, every dim of a 3-D tensor, views
 * (transposed, sliced), 0-dim and empty tensors, short lines (one thread per
 * line: the CPU's chain, bit for bit) and long ones (a block per line, tiles
 * with carries: integers exact, floats within 1e-12 relative for f64 and
 * bitwise-close — rtol 1e-6 — after rounding to f32, one unit of the last
 * place for f16 / bf16). The NVRTC compile of each program runs in the suite
 * without the emulator. Runs on the emulated device in CI (cuda_scan_emu).
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"

#include <math.h>
#include <string.h>

static const char *OP = "cuda_scan_test";

static double tol_of(kl_dtype d) {
    switch (d) {
    case KL_F64: return 1e-12;
    case KL_F32: return 1e-6;
    case KL_F16: return 1.0 / 1024;
    case KL_BF16: return 1.0 / 128;
    default: return 0;
    }
}

static kl_tensor *sample(int nd, const int64_t *shape, kl_dtype dt, int prod) {
    kl_tensor *x = kl_randn(nd, shape, KL_F64);
    /* near 1 for products (no overflow along 300 factors), integers in a small range */
    if (prod) x = kl_add_scalar(kl_mul_scalar(x, kl_dtype_is_floating(dt) ? 0.05 : 0.6), 1.0);
    else if (!kl_dtype_is_floating(dt)) x = kl_mul_scalar(x, 20);
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0.5);
    if (dt == KL_U8) return kl_to_dtype(kl_abs(x), dt);
    return kl_to_dtype(x, dt);
}

static void every_dtype_every_dim(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16, KL_I64, KL_I32, KL_U8, KL_BOOL};
    kl_manual_seed(12);
    int ncases = 0;
    for (int prod = 0; prod < 2; prod++)
        for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
            kl_scope_begin();
            kl_tensor *x = sample(KL_SHAPE(3, 5, 7), dts[t], prod), *gx = kl_to_device(x, CUDA0);
            for (int d = -3; d < 3; d++) {
                char what[96];
                snprintf(what, sizeof what, "%s %s dim %d", prod ? "cumprod" : "cumsum", kl_dtype_name(dts[t]), d);
                /* short lines: the CPU's chain, bitwise */
                compare(prod ? kl_cumprod(x, d) : kl_cumsum(x, d), prod ? kl_cumprod(gx, d) : kl_cumsum(gx, d), 0,
                        what);
                /* a transposed view */
                kl_tensor *xt = kl_transpose(x, 0, 2), *gt = kl_transpose(gx, 0, 2);
                snprintf(what, sizeof what, "%s %s transposed dim %d", prod ? "cumprod" : "cumsum",
                         kl_dtype_name(dts[t]), d);
                compare(prod ? kl_cumprod(xt, d) : kl_cumsum(xt, d), prod ? kl_cumprod(gt, d) : kl_cumsum(gt, d), 0,
                        what);
                ncases += 2;
            }
            kl_scope_end();
        }
    print_message("%d short-line cases bit-equal to the CPU\n", ncases);
}

/* Lines longer than one thread's share: a block per line, tiles of 128 or
 * 256 elements with carries across tiles. */
static void long_lines(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16, KL_I64, KL_I32, KL_BOOL};
    kl_manual_seed(13);
    for (int prod = 0; prod < 2; prod++)
        for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
            kl_scope_begin();
            char what[96];
            /* 300: three tiles of 128; 2500: tiles of 256 with a partial last one */
            kl_tensor *x = sample(KL_SHAPE(2, 300), dts[t], prod), *gx = kl_to_device(x, CUDA0);
            snprintf(what, sizeof what, "%s %s [2,300]", prod ? "cumprod" : "cumsum", kl_dtype_name(dts[t]));
            compare(prod ? kl_cumprod(x, 1) : kl_cumsum(x, 1), prod ? kl_cumprod(gx, 1) : kl_cumsum(gx, 1),
                    tol_of(dts[t]), what);
            /* the scanned dim first: the lines are strided */
            kl_tensor *y = sample(KL_SHAPE(2500, 2), dts[t], 0), *gy = kl_to_device(y, CUDA0);
            if (!prod) {
                snprintf(what, sizeof what, "cumsum %s [2500,2] dim 0", kl_dtype_name(dts[t]));
                compare(kl_cumsum(y, 0), kl_cumsum(gy, 0), tol_of(dts[t]) * 10, what);
            }
            kl_scope_end();
        }
}

static void edge_cases(void **st) {
    (void)st;
    NEED_CUDA();
    kl_tensor *s = kl_scalar_tensor(2.5, KL_F32), *gs = kl_to_device(s, CUDA0);
    compare(kl_cumsum(s, 0), kl_cumsum(gs, 0), 0, "cumsum of a 0-dim tensor");
    compare(kl_cumprod(s, -1), kl_cumprod(gs, -1), 0, "cumprod of a 0-dim tensor");
    kl_tensor *e = kl_to_device(kl_zeros(KL_SHAPE(0, 4), KL_F32), CUDA0);
    kl_tensor *r = kl_cumsum(e, 1);
    assert_non_null(r);
    assert_int_equal(kl_numel(r), 0);
    /* a sliced view with an offset, scanned along its inner dim */
    kl_tensor *x = kl_randn(KL_SHAPE(6, 10), KL_F64), *gx = kl_to_device(x, CUDA0);
    compare(kl_cumsum(kl_slice(x, 1, 2, 9, 2), 1), kl_cumsum(kl_slice(gx, 1, 2, 9, 2), 1), 0, "cumsum of a slice");
    /* integer wrap-around as on the CPU (int64) */
    kl_tensor *big = kl_full(KL_SHAPE(3), 4611686018427387904.0, KL_I64);
    compare(kl_cumsum(big, 0), kl_cumsum(kl_to_device(big, CUDA0), 0), 0, "int64 cumsum wrapping");
    /* a bad dim: the CPU's error */
    assert_null(kl_cumsum(gx, 2));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "dim 2 out of range");
}

/* Every scan program compiles with NVRTC for sm_80 and sm_90 without spilling. */
static void nvrtc_compiles(void **st) {
    (void)st;
    NEED_NVRTC_ONLY();
    static const kl_dtype ts[] = {KL_F32, KL_F64, KL_I64};
    for (int prod = 0; prod < 2; prod++)
        for (int t = 0; t < 3; t++) {
            cn_kernel_src src;
            assert_int_equal(cn_scan_program(prod, ts[t], &src), 0);
            kt_nvrtc_compiles(OP, src.src, "scan.cu");
            cn_kernel_src_free(&src);
        }
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(every_dtype_every_dim),
        KT_TEST(long_lines),
        KT_TEST(edge_cases),
        KT_TEST(nvrtc_compiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
