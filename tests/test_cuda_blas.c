/*
 * test_cuda_blas.c — ku_gemm (src/codegen_nvrtc/cuda_gemm.c) on device
 * memory against a plain C reference, for f32, f64, f16 and bf16: every
 * combination of row-major / transposed (column-major) / padded operands,
 * batches with broadcast (stride 0) operands, k = 0, m or n = 0, alpha and
 * beta (beta = 0 must not read C), odd sizes, the TF32 switch, errors, and
 * threads sharing the device's handle. In CI this runs on the emulated
 * cuBLAS (the _emu run); with a GPU the same checks run against cuBLAS.
 *
 * Tolerances: the reference is computed in double from the stored (already
 * rounded) inputs. |got - ref| <= u_out * |ref| + 2 k u_acc (|alpha| sum|a b|
 * + |beta c|), u_out the unit roundoff of the output type (2^-53, 2^-24,
 * f16 2^-11, bf16 2^-8), u_acc that of the accumulator (f64 2^-53, else f32
 * 2^-24): a classical dot-product error bound plus the output's rounding.
 * TF32 inputs add 2 * 2^-11 relative per product.
 */
#include "harness.h"

#include <pthread.h>

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/ku_cublas.h"
#include "../src/eager/core.h"
#include "../src/eager/dispatch.h"

static const char *OP = "cuda_blas_test";

static int setup(void **state) {
    kt_setup(state);
    kl_cuda_set_allow_tf32(false);
    return 0;
}
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, kt_teardown)

/* ---- host values in each storage type ----------------------------------- */

static size_t esize(kl_dtype dt) { return ke_dtypes[dt].size; }

static void put(void *buf, kl_dtype dt, size_t i, double v) {
    switch (dt) {
    case KL_F64: ((double *)buf)[i] = v; break;
    case KL_F32: ((float *)buf)[i] = (float)v; break;
    case KL_F16: ((uint16_t *)buf)[i] = ke_f32_to_f16((float)v); break;
    default: ((uint16_t *)buf)[i] = ke_f32_to_bf16((float)v); break;
    }
}
static double get(const void *buf, kl_dtype dt, size_t i) {
    switch (dt) {
    case KL_F64: return ((const double *)buf)[i];
    case KL_F32: return ((const float *)buf)[i];
    case KL_F16: return ke_f16_to_f32(((const uint16_t *)buf)[i]);
    default: return ke_bf16_to_f32(((const uint16_t *)buf)[i]);
    }
}

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 4503599627370496.0 - 1.0;
}

/* ---- device buffers --------------------------------------------------------- */

static CUdeviceptr upload(const void *h, size_t bytes) {
    CUdeviceptr p = ku_malloc(OP, 0, bytes, NULL);
    if (!p) print_error("ku_malloc: %s\n", kl_last_error());
    assert_true(p != 0);
    assert_int_equal(KU_CALL(OP, ku_driver_get(OP), MemcpyHtoD, p, h, bytes), 0);
    return p;
}
static void download(void *h, CUdeviceptr p, size_t bytes) {
    assert_int_equal(KU_CALL(OP, ku_driver_get(OP), StreamSynchronize, ku_current_stream(0)), 0);
    if (!bytes) return; /* an empty tensor's address is no allocation */
    assert_int_equal(KU_CALL(OP, ku_driver_get(OP), MemcpyDtoH, h, p, bytes), 0);
}

/* One row-major operand (rows x cols per batch) in a host buffer laid out
 * as asked: transposed (column-major: rs = 1), with `pad` unused elements
 * after each stored line, batch matrices apart (or one, broadcast). */
typedef struct mat {
    int64_t rows, cols, rs, cs, bs, nb; /* nb: matrices stored */
    size_t n;                           /* elements in the buffer */
    void *h;
    CUdeviceptr d;
} mat;

static mat mat_make(kl_dtype dt, int64_t rows, int64_t cols, int trans, int pad, int64_t batch, int bcast,
                    double fill_nan) {
    mat x = {rows, cols, 0, 0, 0, bcast ? 1 : batch, 0, NULL, 0};
    int64_t line = trans ? rows : cols, lines = trans ? cols : rows;
    int64_t ld = line + pad;
    x.rs = trans ? 1 : ld;
    x.cs = trans ? ld : 1;
    int64_t per = ld * lines + 3; /* a gap between batch matrices */
    x.bs = bcast ? 0 : per;
    x.n = (size_t)(per * x.nb);
    if (x.n == 0) x.n = 1;
    x.h = malloc(x.n * esize(dt));
    assert_non_null(x.h);
    for (size_t i = 0; i < x.n; i++) put(x.h, dt, i, fill_nan ? NAN : 1e3 + (double)i); /* sentinels */
    for (int64_t b = 0; b < x.nb; b++)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) put(x.h, dt, (size_t)(b * x.bs + i * x.rs + j * x.cs), urand());
    if (bcast) x.bs = 0;
    return x;
}
static size_t at(const mat *x, int64_t b, int64_t i, int64_t j) {
    return (size_t)(b * x->bs + i * x->rs + j * x->cs);
}
static ku_matrix dev_of(mat *x, kl_dtype dt) {
    x->d = upload(x->h, x->n * esize(dt));
    return (ku_matrix){x->d, x->rs, x->cs, x->bs};
}
static void mat_free(mat *x) {
    if (x->d) assert_int_equal(ku_free(OP, x->d), 0);
    free(x->h);
}

static double u_out(kl_dtype dt) {
    return dt == KL_F64 ? 0x1p-53 : dt == KL_F32 ? 0x1p-24 : dt == KL_F16 ? 0x1p-11 : 0x1p-8;
}

typedef struct gcase {
    kl_dtype dt;
    int64_t batch, m, n, k;
    int ta, tb, tc, pad;
    int bca, bcb;
    double alpha, beta;
    int tf32;
} gcase;

/* Runs one case; returns the largest |got - ref| / tolerance (must be <= 1). */
static double run_case(gcase g) {
    kl_dtype dt = g.dt;
    mat a = mat_make(dt, g.m, g.k, g.ta, g.pad, g.batch, g.bca, 0);
    mat b = mat_make(dt, g.k, g.n, g.tb, g.pad, g.batch, g.bcb, 0);
    mat c = mat_make(dt, g.m, g.n, g.tc, g.pad, g.batch, 0, g.beta == 0);
    ku_matrix da = dev_of(&a, dt), db = dev_of(&b, dt), dc = dev_of(&c, dt);
    kl_cuda_set_allow_tf32(g.tf32);
    int rc = ku_gemm(OP, 0, dt, g.batch, g.m, g.n, g.k, g.alpha, da, db, g.beta, dc, ku_current_stream(0));
    kl_cuda_set_allow_tf32(false);
    if (rc) print_error("ku_gemm: %s\n", kl_last_error());
    assert_int_equal(rc, 0);
    void *out = malloc(c.n * esize(dt));
    assert_non_null(out);
    download(out, c.d, c.n * esize(dt));
    double uacc = dt == KL_F64 ? 0x1p-53 : 0x1p-24, worst = 0;
    if (g.tf32) uacc += 2 * 0x1p-11;
    /* every element of C's buffer: inside the matrix the product, outside untouched */
    char *inside = calloc(c.n, 1);
    assert_non_null(inside);
    for (int64_t bb = 0; bb < g.batch; bb++)
        for (int64_t i = 0; i < g.m; i++)
            for (int64_t j = 0; j < g.n; j++) {
                double ref = 0, mag = 0;
                for (int64_t p = 0; p < g.k; p++) {
                    double x = get(a.h, dt, at(&a, bb, i, p)) * get(b.h, dt, at(&b, bb, p, j));
                    ref += x;
                    mag += fabs(x);
                }
                size_t ci = at(&c, bb, i, j);
                double c0 = g.beta == 0 ? 0 : get(c.h, dt, ci);
                ref = g.alpha * ref + g.beta * c0;
                double tol = u_out(dt) * fabs(ref) + 2.0 * (double)(g.k + 1) * uacc * (fabs(g.alpha) * mag + fabs(g.beta * c0));
                if (tol == 0) tol = 1e-300;
                double got = get(out, dt, ci), e = fabs(got - ref) / tol;
                if (!(e <= 1)) {
                    print_error("%s batch %lld (%lld, %lld): got %.17g want %.17g (tol %.3g)\n", ke_dtypes[dt].name,
                                (long long)bb, (long long)i, (long long)j, got, ref, tol);
                    fail();
                }
                if (e > worst) worst = e;
                inside[ci] = 1;
            }
    for (size_t i = 0; i < c.n; i++)
        if (!inside[i] && memcmp((char *)out + i * esize(dt), (char *)c.h + i * esize(dt), esize(dt)) != 0) {
            print_error("%s: C's element %zu outside the matrix was written\n", ke_dtypes[dt].name, i);
            fail();
        }
    free(inside);
    free(out);
    mat_free(&a);
    mat_free(&b);
    mat_free(&c);
    return worst;
}

static const kl_dtype dtypes[] = {KL_F32, KL_F64, KL_F16, KL_BF16};

/* NN, NT, TN, TT through transposed views, each with a row- or column-major
 * (transposed) output, tight and padded leading dimensions, odd sizes. */
static void test_layouts(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int tc = 0; tc < 2; tc++)
                    for (int pad = 0; pad < 3; pad += 2) {
                        gcase g = {dtypes[d], 1, 5, 7, 3, ta, tb, tc, pad, 0, 0, 1.5, 0.5, 0};
                        run_case(g);
                        g.m = 13, g.n = 1, g.k = 9; /* a matrix-vector shape */
                        run_case(g);
                        g.m = 1, g.n = 11, g.k = 17;
                        run_case(g);
                    }
}

/* Sizes past cuBLAS's small-matrix paths. */
static void test_larger(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++) {
        gcase g = {dtypes[d], 1, 67, 129, 250, 0, 1, 0, 1, 0, 0, 1.0, 0.0, 0};
        double w = run_case(g);
        print_message("%s 67x129x250: worst error %.3f of the tolerance\n", ke_dtypes[dtypes[d]].name, w);
    }
}

/* Batches: each operand alone and both broadcast (batch stride 0), with
 * transposed views. */
static void test_batched(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++)
        for (int bc = 0; bc < 4; bc++)
            for (int t = 0; t < 2; t++) {
                gcase g = {dtypes[d], 4, 6, 5, 7, t, !t, t, 1, bc & 1, bc >> 1, -0.75, 2.0, 0};
                run_case(g);
            }
}

/* k = 0: C = beta * C (0 when beta is 0, even over NaN); m or n = 0 and
 * batch 0: nothing happens, nothing is read. */
static void test_degenerate(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++) {
        run_case((gcase){dtypes[d], 1, 4, 3, 0, 0, 0, 0, 0, 0, 0, 1.0, 0.5, 0});
        run_case((gcase){dtypes[d], 2, 4, 3, 0, 1, 0, 1, 1, 0, 0, 1.0, 0.0, 0});
        run_case((gcase){dtypes[d], 1, 0, 3, 5, 0, 0, 0, 0, 0, 0, 1.0, 0.5, 0});
        run_case((gcase){dtypes[d], 1, 3, 0, 5, 0, 1, 0, 0, 0, 0, 1.0, 0.5, 0});
        run_case((gcase){dtypes[d], 0, 3, 3, 5, 0, 0, 0, 0, 0, 0, 1.0, 0.5, 0});
        /* 1 x 1 outputs and k = 1 (rank-one update) */
        run_case((gcase){dtypes[d], 1, 1, 1, 9, 1, 1, 0, 2, 0, 0, 2.0, -1.0, 0});
        run_case((gcase){dtypes[d], 3, 5, 6, 1, 0, 1, 1, 0, 0, 1, 1.0, 1.0, 0});
    }
    /* pointers are never touched for an empty problem: 0 is accepted */
    ku_matrix z = {0, 1, 1, 0};
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 0, 4, 4, 1.0, z, z, 0.0, z, NULL), 0);
}

/* alpha and beta: zero alpha keeps beta * C; beta = 0 over a C full of NaN. */
static void test_alpha_beta(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++) {
        run_case((gcase){dtypes[d], 1, 5, 4, 6, 0, 0, 0, 0, 0, 0, 0.0, 3.0, 0});
        run_case((gcase){dtypes[d], 1, 5, 4, 6, 1, 1, 0, 0, 0, 0, -2.0, 0.0, 0});
        run_case((gcase){dtypes[d], 2, 5, 4, 6, 0, 1, 1, 0, 1, 0, 0.5, -0.25, 0});
    }
}

/* TF32: off (the default) keeps f32 accuracy; on, an f32 GEMM may round
 * inputs to 10 mantissa bits. The emulated cuBLAS always does, so there the
 * results must differ; a GPU picks its kernel, so only the bound is checked. */
static void test_tf32(void **state) {
    (void)state;
    NEED_CUDA();
    assert_false(kl_cuda_get_allow_tf32());
    kl_cuda_set_allow_tf32(true);
    assert_true(kl_cuda_get_allow_tf32());
    kl_cuda_set_allow_tf32(false);
    gcase g = {KL_F32, 1, 32, 32, 64, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0};
    double off = run_case(g);
    g.tf32 = 1;
    double on = run_case(g); /* checked against the looser TF32 bound */
    print_message("TF32 off: worst %.3g of the f32 bound; on: %.3g of the TF32 bound\n", off, on);
    if (kt_cuda_emulated(OP)) {
        /* the same numbers with TF32 on, measured against the f32 bound, fail it */
        gcase f = g;
        mat a = mat_make(KL_F32, 32, 64, 0, 0, 1, 0, 0), b = mat_make(KL_F32, 64, 32, 0, 0, 1, 0, 0),
            c = mat_make(KL_F32, 32, 32, 0, 0, 1, 0, 1);
        ku_matrix da = dev_of(&a, KL_F32), db = dev_of(&b, KL_F32), dc = dev_of(&c, KL_F32);
        float r_off[32 * 32], r_on[32 * 32];
        assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 32, 32, 64, 1.0, da, db, 0.0, dc, NULL), 0);
        download(r_off, dc.ptr, sizeof r_off);
        kl_cuda_set_allow_tf32(true);
        assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 32, 32, 64, 1.0, da, db, 0.0, dc, NULL), 0);
        kl_cuda_set_allow_tf32(false);
        download(r_on, dc.ptr, sizeof r_on);
        int differ = 0;
        for (int i = 0; i < 32 * 32; i++) differ += r_off[i] != r_on[i];
        assert_true(differ > 512);
        (void)f;
        mat_free(&a);
        mat_free(&b);
        mat_free(&c);
    }
}

/* Bad arguments: clear errors, nothing launched. */
static void test_errors(void **state) {
    (void)state;
    NEED_CUDA();
    mat a = mat_make(KL_F32, 4, 4, 0, 0, 1, 0, 0);
    ku_matrix d = dev_of(&a, KL_F32);
    assert_int_equal(ku_gemm(OP, 0, KL_I32, 1, 2, 2, 2, 1.0, d, d, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "cuBLAS GEMM takes float32, float64, float16 or bfloat16, got int32");
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, -1, 2, 2, 1.0, d, d, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "GEMM sizes must be >= 0 (batch 1, m -1");
    /* every other element: no unit stride */
    ku_matrix s = {d.ptr, 4, 2, 0};
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 2, 2, 2, 1.0, s, d, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "GEMM operand A [2, 2] with strides (4, 2) has no unit stride");
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 2, 2, 2, 1.0, d, s, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "GEMM operand B [2, 2] with strides (4, 2)");
    /* rows overlapping each other (row stride 1 < 2 columns, column stride 1) */
    ku_matrix o = {d.ptr, 1, 1, 0};
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 2, 2, 2, 1.0, d, o, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "GEMM operand B");
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 2, 2, 2, 1.0, d, d, 0.0, s, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "GEMM output [2, 2] with strides (4, 2) has no unit stride");
    ku_matrix c0 = {d.ptr, 2, 1, 0};
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 3, 2, 2, 2, 1.0, d, d, 0.0, c0, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "output batch stride is 0 for 3 batches");
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, (int64_t)1 << 31, 1, 1, 1.0, d, d, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "exceed cuBLAS's 32-bit int");
    assert_int_equal(ku_gemm(OP, 7, KL_F32, 1, 2, 2, 2, 1.0, d, d, 0.0, d, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA device 7 does not exist");
    if (kt_cuda_emulated(OP)) {
        /* The emulated cuBLAS catches what a GPU would fault on: B read past
         * the end of its device allocation (the caching allocator's 2 MiB
         * segment: within it, as on a GPU, nothing faults). B is cuBLAS's A
         * here: a row-major C is computed as C^T = B^T A^T. */
        ku_matrix big = {d.ptr, (int64_t)1 << 20, 1, 0};
        mat c = mat_make(KL_F32, 4, 8, 0, 0, 1, 0, 0);
        ku_matrix dc = dev_of(&c, KL_F32);
        assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 4, 8, 4, 1.0, d, big, 0.0, dc, NULL), -1);
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "cublasSgemm_v2 failed: CUBLAS_STATUS_EXECUTION_FAILED: emulated cuBLAS: A");
        /* a batch stride walking off the end */
        ku_matrix far = {d.ptr, 4, 1, (int64_t)1 << 20};
        assert_int_equal(ku_gemm(OP, 0, KL_F32, 2, 4, 4, 4, 1.0, far, d, 0.0, (ku_matrix){dc.ptr, 4, 1, 16}, NULL), -1);
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "cublasSgemmStridedBatched failed: CUBLAS_STATUS_EXECUTION_FAILED");
        mat_free(&c);
    }
    mat_free(&a);
}

/* cuBLAS's own argument checks, straight through the table: the emulated
 * cuBLAS must answer as the real one does. */
static void test_cublas_statuses(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_cublas_table *t;
    cublasHandle_t h = ku_cublas_acquire(OP, 0, NULL, &t);
    if (!h) {
        print_message("skipped: %s\n", kl_last_error());
        kl_clear_error();
        skip();
    }
    mat a = mat_make(KL_F32, 8, 8, 0, 0, 1, 0, 0);
    ku_matrix d = dev_of(&a, KL_F32);
    float *p = (float *)(uintptr_t)d.ptr, one = 1, zero = 0;
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, p, 2, p, 2, &zero, p + 32, 2), 0);
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 2, &one, p, 3, p, 2, &zero, p + 32, 4),
                     CUBLAS_STATUS_INVALID_VALUE); /* lda < m */
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 2, 2, 4, &one, p, 3, p, 4, &zero, p + 32, 2),
                     CUBLAS_STATUS_INVALID_VALUE); /* lda < k for op T */
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 2, 4, 2, &one, p, 2, p, 3, &zero, p + 32, 2),
                     CUBLAS_STATUS_INVALID_VALUE); /* ldb < n for op T */
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 2, &one, p, 4, p, 2, &zero, p + 32, 3),
                     CUBLAS_STATUS_INVALID_VALUE); /* ldc < m */
    assert_int_equal(t->Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 2, &one, p, 2, p, 2, &zero, p + 32, 2),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(t->Sgemm(h, 7, CUBLAS_OP_N, 2, 2, 2, &one, p, 2, p, 2, &zero, p + 32, 2),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(t->SgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, p, 2, 4, p, 2, 4, &zero,
                                            p + 32, 2, 4, -1),
                     CUBLAS_STATUS_INVALID_VALUE);
    /* f16 inputs with an f64 compute type: no such GEMM */
    assert_int_equal(t->GemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, p, CUDA_R_16F, 2, p, CUDA_R_16F, 2, &zero,
                               p + 32, CUDA_R_16F, 2, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    ku_cublas_release(0);
    assert_int_equal(ku_cublas_check(OP, "cublasSgemm_v2", CUBLAS_STATUS_INVALID_VALUE), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cublasSgemm_v2 failed: CUBLAS_STATUS_INVALID_VALUE");
    assert_int_equal(ku_cublas_check(OP, "cublasCreate_v2", CUBLAS_STATUS_ALLOC_FAILED), -1);
    KT_EXPECT_ERROR(KL_ERR_OOM, "cublasCreate_v2 failed: CUBLAS_STATUS_ALLOC_FAILED");
    mat_free(&a);
}

/* Streams: the handle follows each call's stream; threads on their own
 * streams share the device's handle through its lock. */
typedef struct thread_arg {
    CUstream s;
    int fails;
} thread_arg;

static void *gemm_thread(void *p) {
    thread_arg *ta = p;
    ku_set_current_stream(0, ta->s);
    float ha[16], hc[16], want[16];
    for (int i = 0; i < 16; i++) ha[i] = (float)(i % 5) - 2;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            float s = 0;
            for (int k = 0; k < 4; k++) s += ha[i * 4 + k] * ha[k * 4 + j];
            want[i * 4 + j] = s;
        }
    const ku_driver *d = ku_driver_get(OP);
    for (int it = 0; it < 25; it++) {
        CUdeviceptr a = ku_malloc(OP, 0, sizeof ha, ta->s), c = ku_malloc(OP, 0, sizeof hc, ta->s);
        ku_matrix ma = {a, 4, 1, 0}, mc = {c, 4, 1, 0};
        if (!a || !c || d->MemcpyHtoD(a, ha, sizeof ha) ||
            ku_gemm(OP, 0, KL_F32, 1, 4, 4, 4, 1.0, ma, ma, 0.0, mc, ta->s) || d->StreamSynchronize(ta->s) ||
            d->MemcpyDtoH(hc, c, sizeof hc) || memcmp(hc, want, sizeof hc) != 0)
            ta->fails++;
        ku_free(OP, a);
        ku_free(OP, c);
    }
    ku_set_current_stream(0, NULL);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    enum { NT = 4 };
    pthread_t th[NT];
    thread_arg args[NT];
    for (int i = 0; i < NT; i++) {
        args[i].fails = 0;
        assert_int_equal(KU_CALL(OP, d, StreamCreate, &args[i].s, CU_STREAM_NON_BLOCKING), 0);
        assert_int_equal(pthread_create(&th[i], NULL, gemm_thread, &args[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].fails, 0);
    }
    assert_int_equal(kl_cuda_synchronize(0), 0);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    for (int i = 0; i < NT; i++) assert_int_equal(KU_CALL(OP, d, StreamDestroy, args[i].s), 0);
}

/* Without a device every GEMM fails with the reason, before loading cuBLAS. */
static void test_unavailable(void **state) {
    (void)state;
    if (kl_cuda_is_available()) skip();
    ku_matrix z = {0, 2, 1, 0};
    assert_int_equal(ku_gemm(OP, 0, KL_F32, 1, 2, 2, 2, 1.0, z, z, 0.0, z, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available: ");
}

/* ---- The eager kernels (cuda_matmul.c) on CUDA tensors ----------------------
 * Called as the dispatcher would, after infer, on tensors of the CUDA device
 * kl_init registers. */

/* A fresh contiguous CUDA tensor in the current scope (kl_empty_on would
 * dispatch to a CUDA creation kernel, which comes with CUDA tensors). */
static kl_tensor *cuda_empty(kl_dtype dt, int ndim, const int64_t *shape) {
    kl_tensor *t = ke_tensor_new(dt, ndim, shape, CUDA0, OP);
    if (!t) print_error("%s\n", kl_last_error());
    assert_non_null(t);
    ke_scope_adopt(t);
    return t;
}

/* x's contiguous values in a new CUDA tensor. */
static kl_tensor *to_cuda(kl_tensor *x) {
    kl_tensor *d = cuda_empty((kl_dtype)x->dtype, x->ndim, x->shape);
    if (!d) print_error("%s\n", kl_last_error());
    assert_non_null(d);
    size_t bytes = (size_t)ke_numel(x->ndim, x->shape) * esize((kl_dtype)x->dtype);
    if (bytes)
        assert_int_equal(KU_CALL(OP, ku_driver_get(OP), MemcpyHtoD, (CUdeviceptr)(uintptr_t)ke_data(d), ke_data(x), bytes), 0);
    return d;
}

/* Runs kernel fn on (a, b) (CPU tensors, copied to CUDA as contiguous
 * tensors and viewed by `view` on both devices) and compares with the CPU
 * op on the same views. */
typedef kl_tensor *(*view_fn)(kl_tensor *);
static kl_tensor *no_view(kl_tensor *t) { return t; }
static kl_tensor *swap_last(kl_tensor *t) { return kl_transpose(t, -1, -2); }

static void eager_case(int op, kl_dtype dt, int na, const int64_t *sa, view_fn va, int nb, const int64_t *sb,
                       view_fn vb) {
    kl_scope_begin();
    kl_tensor *a = kl_randn(na, sa, dt), *b = kl_randn(nb, sb, dt);
    assert_non_null(a);
    assert_non_null(b);
    kl_tensor *ad = va(to_cuda(a)), *bd = vb(to_cuda(b));
    a = va(a), b = vb(b);
    assert_non_null(ad);
    assert_non_null(bd);
    kl_tensor *ref = op == KE_OP_linear ? kl_linear(a, b, NULL) : op == KE_OP_bmm ? kl_bmm(a, b) : kl_matmul(a, b);
    if (!ref) print_error("reference: %s\n", kl_last_error());
    assert_non_null(ref);
    kl_tensor *out = cuda_empty(dt, ref->ndim, ref->shape);
    assert_non_null(out);
    kl_tensor *in[2] = {ad, bd};
    ke_call k = {.op = op, .nin = 2, .in = in, .nout = 1, .device = CUDA0, .compute = dt};
    k.out[0] = out;
    int rc = op == KE_OP_linear ? ku_cuda_linear(&k) : ku_cuda_matmul(&k);
    if (rc) print_error("%s\n", kl_last_error());
    assert_int_equal(rc, 0);
    int64_t n = ke_numel(ref->ndim, ref->shape);
    void *got = malloc((size_t)(n ? n : 1) * esize(dt));
    assert_non_null(got);
    download(got, (CUdeviceptr)(uintptr_t)ke_data(out), (size_t)n * esize(dt));
    kl_tensor *r64 = kl_contiguous(kl_to_dtype(ref, KL_F64));
    const double *want = (const double *)ke_data(r64);
    int64_t K = sa[na - 1];
    double tol = dt == KL_F64 ? 1e-12 : dt == KL_F32 ? 1e-5 : dt == KL_F16 ? 2e-3 : 1.6e-2;
    for (int64_t i = 0; i < n; i++) {
        double g = get(got, dt, (size_t)i);
        if (!(fabs(g - want[i]) <= tol * (sqrt((double)K) * 3 + fabs(want[i])))) {
            print_error("%s element %lld: got %.9g want %.9g\n", ke_dtypes[dt].name, (long long)i, g, want[i]);
            fail();
        }
    }
    free(got);
    kl_scope_end();
}

static void test_eager_kernels(void **state) {
    (void)state;
    NEED_CUDA();
    for (int d = 0; d < 4; d++) {
        kl_dtype dt = dtypes[d];
        /* x [2,3,4,5] @ W [5,6]: B broadcast, batches folded into one GEMM */
        eager_case(KE_OP_matmul, dt, 4, (int64_t[]){2, 3, 4, 5}, no_view, 2, (int64_t[]){5, 6}, no_view);
        /* both broadcast over two batch dims: an outer loop of strided-batched calls */
        eager_case(KE_OP_matmul, dt, 4, (int64_t[]){3, 1, 4, 5}, no_view, 3, (int64_t[]){2, 5, 6}, no_view);
        /* transposed views of both (col-major operands, no copy) */
        eager_case(KE_OP_matmul, dt, 3, (int64_t[]){2, 5, 4}, swap_last, 3, (int64_t[]){2, 6, 5}, swap_last);
        /* 1-D operands */
        eager_case(KE_OP_matmul, dt, 1, (int64_t[]){5}, no_view, 3, (int64_t[]){2, 5, 6}, no_view);
        eager_case(KE_OP_matmul, dt, 2, (int64_t[]){4, 5}, no_view, 1, (int64_t[]){5}, no_view);
        eager_case(KE_OP_matmul, dt, 1, (int64_t[]){7}, no_view, 1, (int64_t[]){7}, no_view);
        eager_case(KE_OP_bmm, dt, 3, (int64_t[]){3, 4, 5}, no_view, 3, (int64_t[]){3, 2, 5}, swap_last);
        /* linear: x @ w^T with w read transposed in place */
        eager_case(KE_OP_linear, dt, 3, (int64_t[]){2, 3, 5}, no_view, 2, (int64_t[]){6, 5}, no_view);
        /* empty batch and k = 0 */
        eager_case(KE_OP_matmul, dt, 3, (int64_t[]){0, 4, 5}, no_view, 2, (int64_t[]){5, 6}, no_view);
    }
    /* integers: no cuBLAS GEMM, a clear error */
    kl_scope_begin();
    kl_tensor *ai = cuda_empty(KL_I32, 2, (int64_t[]){2, 2}), *in[2] = {ai, ai};
    ke_call k = {.op = KE_OP_matmul, .nin = 2, .in = in, .nout = 1, .device = CUDA0, .compute = KL_I32};
    k.out[0] = cuda_empty(KL_I32, 2, (int64_t[]){2, 2});
    assert_int_equal(ku_cuda_matmul(&k), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "on CUDA takes floating tensors (cuBLAS has no int32 GEMM)");
    kl_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_unavailable), T(test_layouts),  T(test_larger),          T(test_batched), T(test_degenerate),
        T(test_alpha_beta),  T(test_tf32),     T(test_errors),          T(test_cublas_statuses),
        T(test_threads),     T(test_eager_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
