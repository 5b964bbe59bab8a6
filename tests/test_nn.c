/*
 * test_nn.c — matrix products, softmax, norms, dropout, losses and attention:
 * values against PyTorch 1.13 (computed once with torch and written here),
 * shape rules, strided operands, error messages, meta shapes, and each
 * composite's decomposition against its fused kernel. Convolution, pooling
 * and the CNN layers are in test_nn_layers.c.
 */
#include "harness.h"

#include "alloc.h"
#include "kernels_nn.h"
#include "nn_util.h"

#include <stdlib.h>
/* ---- matmul ------------------------------------------------------------------------ */

static void matmul_shape_rules(void **s) {
    (void)s;
    kl_tensor *v3 = kl_arange(0, 3, 1, KL_F32), *r;
    r = kl_matmul(v3, kl_add_scalar(v3, 1)); /* 1-D x 1-D: dot, 0-dim */
    kt_assert_shape(r, 0, NULL);
    KT_VALUES(r, 0, 8);
    r = kl_matmul(ar(KL_SHAPE(2, 3)), v3);
    kt_assert_shape(r, KL_SHAPE(2));
    KT_VALUES(r, 0, 5, 14);
    r = kl_matmul(kl_arange(0, 2, 1, KL_F32), ar(KL_SHAPE(2, 3)));
    kt_assert_shape(r, KL_SHAPE(3));
    KT_VALUES(r, 0, 3, 4, 5);
    r = kl_matmul(ar(KL_SHAPE(2, 3)), ar(KL_SHAPE(3, 2)));
    kt_assert_shape(r, KL_SHAPE(2, 2));
    KT_VALUES(r, 0, 10, 13, 28, 40);
    r = kl_matmul(ar(KL_SHAPE(2, 2, 3)), ar(KL_SHAPE(3, 2))); /* batch folds into rows */
    kt_assert_shape(r, KL_SHAPE(2, 2, 2));
    KT_VALUES(r, 0, 10, 13, 28, 40, 46, 67, 64, 94);
    r = kl_matmul(v3, ar(KL_SHAPE(2, 3, 4)));
    kt_assert_shape(r, KL_SHAPE(2, 4));
    KT_VALUES(r, 0, 20, 23, 26, 29, 56, 59, 62, 65);
    r = kl_matmul(ar(KL_SHAPE(2, 3, 4)), kl_arange(0, 4, 1, KL_F32));
    kt_assert_shape(r, KL_SHAPE(2, 3));
    KT_VALUES(r, 0, 14, 38, 62, 86, 110, 134);
    r = kl_matmul(ar(KL_SHAPE(2, 1, 2, 3)), ar(KL_SHAPE(3, 3, 2)));
    kt_assert_shape(r, KL_SHAPE(2, 3, 2, 2));
    KT_VALUES(r, 0, 10, 13, 28, 40, 28, 31, 100, 112, 46, 49, 172, 184, 46, 67, 64, 94, 172, 193, 244, 274, 298,
              319, 424, 454);
    r = kl_bmm(ar(KL_SHAPE(2, 2, 3)), kl_expand(ar(KL_SHAPE(1, 3, 2)), KL_SHAPE(2, 3, 2)));
    KT_VALUES(r, 0, 10, 13, 28, 40, 46, 67, 64, 94);
    /* f64 and empty shapes */
    r = kl_matmul(ar_dt(KL_SHAPE(2, 3), KL_F64), ar_dt(KL_SHAPE(3, 2), KL_F64));
    assert_int_equal(kl_dtype_of(r), KL_F64);
    KT_VALUES(r, 0, 10, 13, 28, 40);
    r = kl_matmul(kl_zeros(KL_SHAPE(2, 0), KL_F32), kl_zeros(KL_SHAPE(0, 3), KL_F32));
    kt_assert_shape(r, KL_SHAPE(2, 3));
    KT_VALUES(r, 0, 0, 0, 0, 0, 0, 0);
    r = kl_matmul(kl_zeros(KL_SHAPE(0, 4, 2), KL_F32), kl_zeros(KL_SHAPE(2, 3), KL_F32));
    kt_assert_shape(r, KL_SHAPE(0, 4, 3));
    KT_NO_ERROR();
}

static void matmul_errors(void **s) {
    (void)s;
    kl_tensor *a = kl_ones(KL_SHAPE(2, 3), KL_F32), *b = kl_ones(KL_SHAPE(4, 5), KL_F32);
    assert_null(kl_matmul(a, b));
    assert_string_equal(kl_last_error(), "kl_matmul: shapes [2,3] and [4,5] cannot be multiplied (3 != 4)");
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "cannot be multiplied");
    assert_null(kl_matmul(kl_ones(KL_SHAPE(3), KL_F32), kl_ones(KL_SHAPE(4), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_matmul: shapes [3] and [4] cannot be multiplied (3 != 4)");
    assert_null(kl_matmul(kl_scalar_tensor(1, KL_F32), a));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_matmul: both arguments need at least 1 dim, got shapes [] and [2,3]");
    assert_null(kl_matmul(kl_ones(KL_SHAPE(2, 2, 3), KL_F32), kl_ones(KL_SHAPE(3, 3, 2), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_matmul: batch dims of shapes [2,2,3] and [3,3,2] cannot broadcast");
    assert_null(kl_matmul(a, kl_ones(KL_SHAPE(3, 2), KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_matmul: expected operands of one dtype, got [2,3] float32 cpu (argument 1) "
                                  "and [3,2] float64 cpu (argument 2)");
    assert_null(kl_matmul(kl_ones(KL_SHAPE(2, 2), KL_BOOL), kl_ones(KL_SHAPE(2, 2), KL_BOOL)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_matmul: not implemented for bool operands");
    assert_null(kl_mm(kl_ones(KL_SHAPE(3), KL_F32), a));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_mm: expects 2-D tensors, got shapes [3] and [2,3]");
    assert_null(kl_mm(a, b));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_mm: shapes [2,3] and [4,5] cannot be multiplied (3 != 4)");
    assert_null(kl_bmm(kl_ones(KL_SHAPE(2, 3, 4), KL_F32), kl_ones(KL_SHAPE(3, 4, 2), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_bmm: batch dims of shapes [2,3,4] and [3,4,2] differ");
    assert_null(kl_bmm(a, a));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_bmm: expects 3-D tensors");
    assert_null(kl_matmul(NULL, a));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_matmul: tensor argument 1 is NULL");
    assert_null(kl_addmm(kl_ones(KL_SHAPE(3), KL_F32), a, kl_ones(KL_SHAPE(3, 2), KL_F32), 1, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_addmm: bias [3] float32 cpu does not broadcast to the product's shape [2,2]");
    assert_null(kl_linear(a, kl_ones(KL_SHAPE(4, 5), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_linear: input [2,3] and weight [4,5] cannot be multiplied (3 != 5)");
    assert_null(kl_linear(a, kl_ones(KL_SHAPE(1, 4, 3), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_linear: weight must have 1 or 2 dims");
    assert_null(kl_linear(kl_scalar_tensor(1, KL_F32), kl_ones(KL_SHAPE(3), KL_F32), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_linear: input must have at least 1 dim");
    assert_null(kl_linear(a, kl_ones(KL_SHAPE(4, 3), KL_F32), kl_ones(KL_SHAPE(4), KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_linear: expected operands of one dtype");
}

/* Transposed and strided operands go to BLAS without copies where one
 * orientation fits; only the output is allocated. */
static void matmul_strided_operands(void **s) {
    (void)s;
    kl_tensor *a = ar(KL_SHAPE(2, 3)), *bt = kl_t(ar(KL_SHAPE(4, 3)));
    KT_VALUES(kl_mm(a, bt), 0, 5, 14, 23, 32, 14, 50, 86, 122);
    KT_VALUES(kl_mm(kl_t(ar(KL_SHAPE(3, 2))), ar(KL_SHAPE(3, 4))), 0, 40, 46, 52, 58, 52, 61, 70, 79);
    /* outputs large enough to come from the allocator (tiny ones live in the
     * tensor header): a transposed operand costs no allocation but the output */
    kl_manual_seed(4);
    kl_tensor *x = kl_randn(KL_SHAPE(16, 24), KL_F32), *y = kl_randn(KL_SHAPE(20, 24), KL_F32);
    kl_tensor *yt = kl_t(y), *ytc = kl_contiguous(yt), *xt = kl_t(kl_contiguous(kl_t(x)));
    assert_non_null(kl_mm(x, yt)); /* the first call may set up per-thread state */
    ke_alloc_stats before = ke_cpu_alloc_stats();
    kl_tensor *r = kl_mm(x, yt);
    ke_alloc_stats after = ke_cpu_alloc_stats();
    assert_int_equal(after.alloc_calls - before.alloc_calls, 1);
    assert_int_equal(kl_allclose(r, kl_mm(x, ytc), 1e-6, 1e-6, false), 1);
    before = ke_cpu_alloc_stats();
    r = kl_mm(xt, yt); /* both operands column-major */
    after = ke_cpu_alloc_stats();
    assert_int_equal(after.alloc_calls - before.alloc_calls, 1);
    assert_int_equal(kl_allclose(r, kl_mm(x, ytc), 1e-6, 1e-6, false), 1);
    /* a column stride of 2 fits neither orientation: copied, same values */
    r = kl_mm(kl_slice(ar(KL_SHAPE(2, 6)), 1, 0, INT64_MAX, 2), ar(KL_SHAPE(3, 2)));
    KT_VALUES(r, 0, 20, 26, 56, 80);
    /* a vector with stride 2 goes to gemv as is */
    r = kl_matmul(ar(KL_SHAPE(2, 3)), kl_slice(kl_arange(0, 6, 1, KL_F32), 0, 0, INT64_MAX, 2));
    KT_VALUES(r, 0, 10, 28);
    /* transposed batches: permuted 3-D operands */
    kl_tensor *p = kl_transpose(ar(KL_SHAPE(2, 3, 2)), 1, 2); /* [2,2,3], column-major matrices */
    r = kl_matmul(p, kl_transpose(ar(KL_SHAPE(2, 2, 3)), 1, 2));
    kl_tensor *ref = kl_matmul(kl_contiguous(p), kl_contiguous(kl_transpose(ar(KL_SHAPE(2, 2, 3)), 1, 2)));
    assert_int_equal(kl_allclose(r, ref, 0, 0, false), 1);
}

/* Reference product in double for the larger cases. */
static void naive_mm(const kl_tensor *a, const kl_tensor *b, double *out, int64_t M, int64_t K, int64_t N) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) acc += kt_get(a, i * K + k) * kt_get(b, k * N + j);
            out[i * N + j] = acc;
        }
}

static void matmul_large_and_batched(void **s) {
    (void)s;
    kl_manual_seed(3);
    kl_tensor *a = kl_randn(KL_SHAPE(70, 80), KL_F32), *b = kl_randn(KL_SHAPE(80, 90), KL_F32);
    double *ref = malloc(sizeof(double) * 70 * 90);
    naive_mm(a, b, ref, 70, 80, 90);
    kt_assert_values(kl_matmul(a, b), ref, 70 * 90, 1e-4);
    /* many small matrices: the batch runs in parallel */
    kl_tensor *x = kl_randn(KL_SHAPE(16, 5, 7), KL_F32), *y = kl_randn(KL_SHAPE(16, 7, 6), KL_F32);
    kl_tensor *r = kl_matmul(x, y);
    for (int64_t bi = 0; bi < 16; bi++) {
        naive_mm(kl_select(x, 0, bi), kl_select(y, 0, bi), ref, 5, 7, 6);
        kt_assert_values(kl_select(r, 0, bi), ref, 30, 1e-5);
    }
    free(ref);
}

/* ke_gemm's loop, for strides no BLAS call can take (conv2d and matmul never
 * pass such; this is the safety net), with alpha and beta. */
static void gemm_loop_fallback(void **s) {
    (void)s;
    float A[40], B[40], C[6], R[6];
    for (int i = 0; i < 40; i++) A[i] = (float)(i % 7) - 3, B[i] = (float)(i % 5) - 2;
    for (int i = 0; i < 6; i++) C[i] = R[i] = (float)i;
    /* A is 3x4 with strides (2, 3), B 4x2 with strides (3, 2): both overlap-free, neither fits BLAS */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            double acc = 0;
            for (int k = 0; k < 4; k++) acc += (double)A[i * 2 + k * 3] * B[k * 3 + j * 2];
            R[i * 2 + j] = (float)(2 * acc + 0.5 * R[i * 2 + j]);
        }
    ke_gemm(KL_F32, 3, 2, 4, 2, A, 2, 3, B, 3, 2, 0.5, C, 2);
    for (int i = 0; i < 6; i++) assert_float_equal(C[i], R[i], 1e-5);
    ke_gemm(KL_F32, 3, 2, 4, 1, A, 2, 3, B, 3, 2, 0, C, 2); /* beta 0 ignores NaN in C */
    C[0] = NAN;
    ke_gemm(KL_F32, 3, 2, 4, 1, A, 2, 3, B, 3, 2, 0, C, 2);
    assert_false(isnan(C[0]));
    ke_gemm(KL_F32, 3, 2, 0, 1, A, 2, 3, B, 3, 2, 0, C, 2); /* K = 0: C = 0 */
    for (int i = 0; i < 6; i++) assert_float_equal(C[i], 0, 0);
}

static void matmul_integer_and_half(void **s) {
    (void)s;
    kl_tensor *r;
    r = kl_matmul(kl_from_data((const uint8_t[]){200, 3, 4, 5}, KL_SHAPE(2, 2), KL_U8),
                  kl_from_data((const uint8_t[]){2, 1, 1, 7}, KL_SHAPE(2, 2), KL_U8));
    assert_int_equal(kl_dtype_of(r), KL_U8);
    KT_VALUES(r, 0, 147, 221, 13, 39); /* wraps mod 256 as PyTorch */
    r = kl_matmul(kl_from_data((const int32_t[]){2147483647, 2, 1, 1}, KL_SHAPE(2, 2), KL_I32),
                  kl_from_data((const int32_t[]){2, 0, 1, 3}, KL_SHAPE(2, 2), KL_I32));
    KT_VALUES(r, 0, 0, 6, 3, 3);
    r = kl_matmul(TI64(KL_SHAPE(1, 2), 4611686018427387904LL, 3), TI64(KL_SHAPE(2, 1), 4, 5));
    assert_int_equal(kl_item_int(r), 15);
    /* strided integer operands need no copy: the loop takes any strides */
    r = kl_matmul(kl_t(ar_dt(KL_SHAPE(3, 2), KL_I64)), ar_dt(KL_SHAPE(3, 4), KL_I64));
    KT_VALUES(r, 0, 40, 46, 52, 58, 52, 61, 70, 79);
    r = kl_matmul(kl_div_scalar(ar_dt(KL_SHAPE(2, 3), KL_BF16), 4), kl_div_scalar(ar_dt(KL_SHAPE(3, 2), KL_BF16), 4));
    assert_int_equal(kl_dtype_of(r), KL_BF16);
    KT_VALUES(r, 0, 0.625, 0.8125, 1.75, 2.5);
    r = kl_matmul(ar_dt(KL_SHAPE(2, 3), KL_F16), ar_dt(KL_SHAPE(3, 2), KL_F16));
    assert_int_equal(kl_dtype_of(r), KL_F16);
    KT_VALUES(r, 0, 10, 13, 28, 40);
}

static void addmm_and_linear(void **s) {
    (void)s;
    kl_tensor *r = kl_addmm(TF(KL_SHAPE(2), 1, 2), ar(KL_SHAPE(2, 3)), ar(KL_SHAPE(3, 2)), 0.5, 2);
    KT_VALUES(r, 0, 20.5, 27, 56.5, 81);
    /* beta = 0 never reads the bias: NaN does not propagate */
    r = kl_addmm(TF(KL_SHAPE(1), NAN), ar(KL_SHAPE(2, 3)), ar(KL_SHAPE(3, 2)), 0, 1);
    KT_VALUES(r, 0, 10, 13, 28, 40);
    r = kl_addmm(TI64(KL_SHAPE(2), 1, 2), ar_dt(KL_SHAPE(2, 3), KL_I64), ar_dt(KL_SHAPE(3, 2), KL_I64), 3, 2);
    KT_VALUES(r, 0, 23, 32, 59, 86);
    r = kl_linear(ar(KL_SHAPE(2, 2, 3)), ar(KL_SHAPE(4, 3)), TF(KL_SHAPE(4), 1, 2, 3, 4));
    kt_assert_shape(r, KL_SHAPE(2, 2, 4));
    KT_VALUES(r, 0, 6, 16, 26, 36, 15, 52, 89, 126, 24, 88, 152, 216, 33, 124, 215, 306);
    r = kl_linear(kl_arange(0, 3, 1, KL_F32), ar(KL_SHAPE(4, 3)), NULL);
    kt_assert_shape(r, KL_SHAPE(4));
    KT_VALUES(r, 0, 5, 14, 23, 32);
    /* the decomposition gives the same values */
    kl_tensor *x = ar(KL_SHAPE(2, 2, 3)), *w = ar(KL_SHAPE(4, 3)), *bias = TF(KL_SHAPE(4), 1, 2, 3, 4);
    kl_tensor *in[3] = {x, w, bias};
    ke_call c = {.op = KE_OP_linear, .nin = 3, .in = in};
    c.a.i[0] = 1;
    assert_int_equal(ke_decomp_linear(&c), 0);
    assert_int_equal(kl_allclose(c.out[0], kl_linear(x, w, bias), 1e-6, 0, false), 1);
}

/* ---- decompositions ------------------------------------------------------------------ */

/* Runs op's decomposition on (in, attrs) and compares it with `fast`. */
static void check_decomp(int op, int nin, kl_tensor **in, const ke_attrs *a, kl_tensor *fast, double tol) {
    ke_call c = {.op = op, .nin = nin, .in = in, .a = *a};
    assert_non_null(fast);
    if (ke_ops[op].decomp(&c) != 0) {
        print_error("decomposition of %s failed: %s\n", ke_ops[op].name, kl_last_error());
        fail();
    }
    if (kl_allclose(c.out[0], fast, tol, tol, true) != 1) {
        print_error("decomposition of %s differs from its kernel\n", ke_ops[op].name);
        fail();
    }
}

/* ---- softmax ------------------------------------------------------------------------- */

static void softmax_values(void **s) {
    (void)s;
    /* large values (stability), a -inf entry, an all -inf row (NaN as PyTorch) */
    kl_tensor *x = TF(KL_SHAPE(4, 3), 1, 2, 3, 1000, 1001, 1002, -INFINITY, 0, 1, -INFINITY, -INFINITY, -INFINITY);
    KT_VALUES(kl_softmax(x, 1), 1e-6, 0.0900305733, 0.244728476, 0.665240943, 0.0900305733, 0.244728476,
              0.665240943, 0, 0.268941432, 0.731058598, NAN, NAN, NAN);
    KT_VALUES(kl_log_softmax(x, -1), 1e-6, -2.40760589, -1.40760589, -0.407605946, -2.40760589, -1.40760589,
              -0.407605946, -INFINITY, -1.31326163, -0.313261658, NAN, NAN, NAN);
    KT_VALUES(kl_softmax(TF(KL_SHAPE(3), 1, NAN, 2), 0), 0, NAN, NAN, NAN);
    KT_VALUES(kl_softmax(kl_scalar_tensor(3, KL_F32), 0), 0, 1);
    /* long rows take the lane fold (plain max): a NaN anywhere, or at the tail,
     * still makes the whole row NaN, in f32 and f64, softmax and log_softmax */
    static const int64_t lens[] = {64, 1000, 1024, 4097};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
        for (int dt = 0; dt < 2; dt++)
            for (int at = 0; at < 2; at++) {
                int64_t n = lens[k], pos = at ? n - 1 : n / 3;
                kl_tensor *r = kl_randn(KL_SHAPE(2, n), dt ? KL_F64 : KL_F32);
                kl_tensor *col = kl_narrow(kl_narrow(r, 0, 1, 1), 1, pos, 1);
                kl_fill_inplace(col, NAN);
                for (int lg = 0; lg < 2; lg++) {
                    kl_tensor *y = lg ? kl_log_softmax(r, -1) : kl_softmax(r, -1);
                    assert_non_null(y);
                    kl_tensor *nan = kl_isnan(y);
                    /* row 0 has no NaN, row 1 is NaN everywhere */
                    assert_int_equal(kl_item_int(kl_sum(kl_narrow(nan, 0, 0, 1), KL_ALL_DIMS, false)), 0);
                    assert_int_equal(kl_item_int(kl_sum(kl_narrow(nan, 0, 1, 1), KL_ALL_DIMS, false)), n);
                }
            }
    /* dims other than the last */
    kl_tensor *y = kl_div_scalar(ar(KL_SHAPE(3, 4)), 3);
    KT_VALUES(kl_softmax(y, 0), 1e-6, 0.0521224663, 0.0521224663, 0.0521224737, 0.0521224663, 0.197735339,
              0.197735339, 0.197735339, 0.19773531, 0.750142217, 0.750142217, 0.750142157, 0.750142217);
    KT_VALUES(kl_log_softmax(y, 0), 1e-6, -2.95415926, -2.95415926, -2.95415902, -2.95415926, -1.62082577,
              -1.62082577, -1.62082577, -1.62082601, -0.287492454, -0.287492454, -0.287492543, -0.287492454);
    kl_tensor *z = kl_div_scalar(ar(KL_SHAPE(2, 3, 4)), 5);
    KT_VALUES(kl_softmax(z, 1), 1e-6, 0.122270718, 0.122270718, 0.122270711, 0.122270718, 0.272118479,
              0.272118479, 0.272118479, 0.272118449, 0.605610847, 0.605610788, 0.605610788, 0.605610847,
              0.122270718, 0.122270718, 0.122270711, 0.122270718, 0.272118479, 0.272118539, 0.272118449,
              0.272118479, 0.605610788, 0.605610788, 0.605610847, 0.605610788);
    KT_VALUES(kl_log_softmax(z, -2), 1e-6, -2.10151768, -2.10151768, -2.10151768, -2.10151768, -1.30151772,
              -1.30151772, -1.30151772, -1.30151772, -0.501517713, -0.501517773, -0.501517773, -0.501517713,
              -2.10151768, -2.10151768, -2.10151768, -2.10151768, -1.30151772, -1.30151749, -1.30151784,
              -1.30151772, -0.501517773, -0.501517773, -0.501517653, -0.501517773);
    /* a non-contiguous input, f64 and bf16 */
    kl_tensor *zt = kl_transpose(z, 1, 2); /* [2,4,3]: softmax over the old dim 1 */
    assert_int_equal(kl_allclose(kl_softmax(zt, 2), kl_transpose(kl_softmax(z, 1), 1, 2), 1e-6, 0, false), 1);
    kl_tensor *r = kl_softmax(kl_to_dtype(x, KL_F64), 1);
    assert_int_equal(kl_dtype_of(r), KL_F64);
    KT_VALUES(r, 1e-12, 0.090030573170380462, 0.24472847105479764, 0.66524095577481771, 0.090030573170380462,
              0.24472847105479764, 0.66524095577481771, 0, 0.2689414213699951, 0.7310585786300049, NAN, NAN, NAN);
    r = kl_softmax(kl_to_dtype(y, KL_BF16), 1);
    assert_int_equal(kl_dtype_of(r), KL_BF16);
    assert_int_equal(kl_allclose(kl_to_dtype(r, KL_F32), kl_softmax(y, 1), 1e-2, 1e-2, false), 1);
    /* empty */
    kt_assert_shape(kl_softmax(kl_zeros(KL_SHAPE(0, 3), KL_F32), 1), KL_SHAPE(0, 3));
    kt_assert_shape(kl_log_softmax(kl_zeros(KL_SHAPE(2, 0), KL_F32), 1), KL_SHAPE(2, 0));
}

static void softmax_errors_and_decomp(void **s) {
    (void)s;
    assert_null(kl_softmax(kl_ones(KL_SHAPE(2), KL_I64), 0));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_softmax: expects floating-point tensors, got [2] int64 cpu (argument 1)");
    assert_null(kl_log_softmax(kl_ones(KL_SHAPE(2, 3), KL_F32), 2));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_log_softmax: dim 2 out of range");
    kl_manual_seed(11);
    kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(5, 70, 33), KL_F32), 4);
    ke_attrs a = {0};
    for (int d = -3; d < 3; d++) {
        kl_tensor *in[1] = {x};
        a.i[0] = d;
        check_decomp(KE_OP_softmax, 1, in, &a, kl_softmax(x, d), 1e-5);
        check_decomp(KE_OP_log_softmax, 1, in, &a, kl_log_softmax(x, d), 1e-5);
    }
    kl_tensor *in[1] = {TF(KL_SHAPE(2, 3), 1, 2, 3, -INFINITY, -INFINITY, -INFINITY)};
    a.i[0] = 1;
    check_decomp(KE_OP_softmax, 1, in, &a, kl_softmax(in[0], 1), 1e-6);
    check_decomp(KE_OP_log_softmax, 1, in, &a, kl_log_softmax(in[0], 1), 1e-6);
}

/* ---- norms ---------------------------------------------------------------------------- */

static void layer_norm_values(void **s) {
    (void)s;
    kl_tensor *x = TF(KL_SHAPE(2, 4), 1, 2, 4, 8, 0, -1, 3, 2);
    kl_tensor *w = TF(KL_SHAPE(4), 1, 2, 0.5, -1), *b = TF(KL_SHAPE(4), 0, 1, 2, 3);
    KT_VALUES(kl_layer_norm(x, 1, NULL, NULL, 1e-5), 1e-5, -1.02575457, -0.652752936, 0.0932503939, 1.58525705,
              -0.632454276, -1.26490855, 1.26490855, 0.632454276);
    KT_VALUES(kl_layer_norm(x, 1, w, b, 1e-5), 1e-5, -1.02575457, -0.305505872, 2.04662514, 1.41474295,
              -0.632454276, -1.5298171, 2.6324544, 2.3675456);
    KT_VALUES(kl_layer_norm(x, 1, w, NULL, 1e-5), 1e-5, -1.02575457, -1.30550587, 0.0466251969, -1.58525705,
              -0.632454276, -2.5298171, 0.632454276, -0.632454276);
    KT_VALUES(kl_layer_norm(x, 1, NULL, b, 1e-5), 1e-5, -1.02575457, 0.347247064, 2.09325027, 4.58525705,
              -0.632454276, -0.264908552, 3.26490855, 3.6324544);
    KT_VALUES(kl_layer_norm(kl_reshape(x, KL_SHAPE(1, 2, 4)), 2, NULL, NULL, 1e-3), 1e-5, -0.529811978,
              -0.144494176, 0.626141489, 2.16741276, -0.91512984, -1.3004477, 0.240823656, -0.144494176);
    KT_VALUES(kl_rms_norm(x, 1, NULL, 1e-6), 1e-5, 0.216930464, 0.433860928, 0.867721856, 1.73544371, 0,
              -0.534522414, 1.60356724, 1.06904483);
    KT_VALUES(kl_rms_norm(x, 1, w, 1e-6), 1e-5, 0.216930464, 0.867721856, 0.433860928, -1.73544371, 0,
              -1.06904483, 0.801783621, -1.06904483);
    /* non-contiguous input, f64, bf16 */
    kl_tensor *xt = kl_t(kl_contiguous(kl_t(x)));
    assert_int_equal(kl_allclose(kl_layer_norm(xt, 1, w, b, 1e-5), kl_layer_norm(x, 1, w, b, 1e-5), 0, 0, false), 1);
    kl_tensor *r = kl_layer_norm(kl_to_dtype(x, KL_F64), 1, kl_to_dtype(w, KL_F64), kl_to_dtype(b, KL_F64), 1e-5);
    KT_VALUES(r, 1e-7, -1.02575457, -0.305505872, 2.04662514, 1.41474295, -0.632454276, -1.5298171, 2.6324544,
              2.3675456);
    r = kl_layer_norm(kl_to_dtype(x, KL_BF16), 1, NULL, NULL, 1e-5);
    assert_int_equal(kl_dtype_of(r), KL_BF16);
    KT_VALUES(r, 1e-2, -1.02575457, -0.652752936, 0.0932503939, 1.58525705, -0.632454276, -1.26490855, 1.26490855,
              0.632454276);
}

static void norm_errors_and_decomp(void **s) {
    (void)s;
    kl_tensor *x = kl_ones(KL_SHAPE(2, 4), KL_F32);
    assert_null(kl_layer_norm(x, 3, NULL, NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG,
                    "kl_layer_norm: normalized_ndim 3 is out of range for input [2,4] float32 cpu (1 to 2)");
    assert_null(kl_layer_norm(x, 0, NULL, NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "normalized_ndim 0 is out of range");
    assert_null(kl_layer_norm(x, 1, kl_ones(KL_SHAPE(3), KL_F32), NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_layer_norm: weight [3] float32 cpu does not match the normalized shape [4]");
    assert_null(kl_layer_norm(x, 1, NULL, kl_ones(KL_SHAPE(4), KL_F64), 1e-5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_layer_norm: bias [4] float64 cpu does not match the input's dtype float32");
    assert_null(kl_rms_norm(kl_ones(KL_SHAPE(4), KL_I32), 1, NULL, 1e-5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_rms_norm: expects floating-point tensors");
    kl_manual_seed(5);
    kl_tensor *y = kl_add_scalar(kl_randn(KL_SHAPE(6, 3, 50), KL_F32), 3);
    kl_tensor *w = kl_randn(KL_SHAPE(3, 50), KL_F32), *b = kl_randn(KL_SHAPE(3, 50), KL_F32);
    ke_attrs a = {0};
    a.i[0] = 2, a.i[1] = 1, a.i[2] = 1, a.f[0] = 1e-5;
    kl_tensor *in3[3] = {y, w, b};
    check_decomp(KE_OP_layer_norm, 3, in3, &a, kl_layer_norm(y, 2, w, b, 1e-5), 1e-4);
    a.i[1] = 0;
    kl_tensor *in2[2] = {y, b};
    check_decomp(KE_OP_layer_norm, 2, in2, &a, kl_layer_norm(y, 2, NULL, b, 1e-5), 1e-4);
    a.i[0] = 1, a.i[1] = 1, a.i[2] = 0;
    kl_tensor *w1 = kl_select(w, 0, 0), *inr[2] = {y, w1};
    check_decomp(KE_OP_rms_norm, 2, inr, &a, kl_rms_norm(y, 1, w1, 1e-5), 1e-4);
}

/* ---- dropout -------------------------------------------------------------------------- */

static void dropout_semantics(void **s) {
    (void)s;
    int64_t n = 200000;
    kl_tensor *x = kl_ones(1, &n, KL_F32);
    kl_manual_seed(7);
    kl_tensor *y1 = kl_dropout(x, 0.3, true);
    int64_t zeros = 0;
    const float *p = kl_data_ptr(y1);
    for (int64_t i = 0; i < n; i++) {
        if (p[i] == 0) zeros++;
        else assert_float_equal(p[i], 1 / 0.7f, 1e-6);
    }
    assert_true(fabs((double)zeros / (double)n - 0.3) < 0.01);
    /* same seed, same mask, whatever the thread count */
    kl_manual_seed(7);
    int threads = kl_get_num_threads();
    kl_set_num_threads(1);
    kl_tensor *y2 = kl_dropout(x, 0.3, true);
    kl_set_num_threads(threads);
    assert_int_equal(kl_equal(y1, y2), 1);
    assert_int_equal(kl_equal(y1, kl_dropout(x, 0.3, true)), 0); /* the generator moved on */
    /* the mask follows logical element order, whatever the input's layout */
    kl_tensor *m = kl_randn(KL_SHAPE(30, 40), KL_F32);
    kl_manual_seed(9);
    kl_tensor *d1 = kl_dropout(kl_t(m), 0.5, true);
    kl_manual_seed(9);
    kl_tensor *d2 = kl_dropout(kl_contiguous(kl_t(m)), 0.5, true);
    assert_int_equal(kl_equal(d1, d2), 1);
    /* eval mode and p = 0 give views; p = 1 zeros (NaN * 0 stays NaN, as PyTorch) */
    assert_int_equal(kl_shares_storage(kl_dropout(x, 0.5, false), x), 1);
    assert_int_equal(kl_shares_storage(kl_dropout(x, 0, true), x), 1);
    assert_int_equal(kl_shares_storage(kl_dropout(kl_ones(KL_SHAPE(3), KL_I64), 0.5, false), x), 0);
    KT_VALUES(kl_dropout(TF(KL_SHAPE(3), 1, NAN, -2), 1, true), 0, 0, NAN, 0);
    /* f64 and bf16 */
    kl_tensor *r = kl_dropout(kl_ones(KL_SHAPE(1000), KL_F64), 0.5, true);
    for (int64_t i = 0; i < 1000; i++) assert_true(kt_get(r, i) == 0 || kt_get(r, i) == 2);
    r = kl_dropout(kl_ones(KL_SHAPE(1000), KL_BF16), 0.5, true);
    assert_int_equal(kl_dtype_of(r), KL_BF16);
    for (int64_t i = 0; i < 1000; i++) assert_true(kt_get(r, i) == 0 || kt_get(r, i) == 2);
    /* errors */
    assert_null(kl_dropout(x, 1.5, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_dropout: probability has to be between 0 and 1, got 1.5");
    assert_null(kl_dropout(x, -0.1, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "got -0.1");
    assert_null(kl_dropout(kl_ones(KL_SHAPE(3), KL_I64), 0.5, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_dropout: expects floating-point tensors");
    assert_null(kl_dropout(NULL, 0.5, true));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_dropout: tensor argument 1 is NULL");
}

/* ---- attention ------------------------------------------------------------------------- */

static void sdpa_values(void **s) {
    (void)s;
    kl_tensor *q = kl_div_scalar(ar(KL_SHAPE(2, 3, 4)), 10);
    kl_tensor *k = kl_div_scalar(kl_remainder_scalar(ar(KL_SHAPE(2, 5, 4)), 7), 5);
    kl_tensor *v = kl_div_scalar(ar(KL_SHAPE(2, 5, 2)), 4);
    KT_VALUES(kl_scaled_dot_product_attention(q, k, v, NULL, false, 0), 1e-5, 1.01699555, 1.26699567, 1.06458616,
              1.31458616, 1.10277689, 1.35277689, 3.44707441, 3.69707417, 3.41691589, 3.66691613, 3.38435507,
              3.63435531);
    kl_tensor *causal = kl_scaled_dot_product_attention(q, k, v, NULL, true, 0);
    KT_VALUES(causal, 1e-5, 0, 0.25, 0.29814136, 0.54814136, 0.550475597, 0.800475597, 2.5, 2.75, 2.92145252,
              3.17145252, 2.97750282, 3.22750282);
    KT_VALUES(kl_scaled_dot_product_attention(q, k, v, NULL, false, 0.3), 1e-5, 1.00996029, 1.25996029, 1.03958428,
              1.28958416, 1.0658201, 1.3158201, 3.48005223, 3.73005223, 3.46723175, 3.71723175, 3.45243502,
              3.70243478);
    /* causal equals an explicit lower-triangular bool mask, and its float form */
    kl_tensor *keep = kl_tril(kl_ones(KL_SHAPE(3, 5), KL_BOOL), 0);
    assert_int_equal(kl_allclose(kl_scaled_dot_product_attention(q, k, v, keep, false, 0), causal, 1e-6, 0, false), 1);
    kl_tensor *fmask = kl_where(keep, kl_zeros(KL_SHAPE(1), KL_F32), kl_full(KL_SHAPE(1), -INFINITY, KL_F32));
    assert_int_equal(kl_allclose(kl_scaled_dot_product_attention(q, k, v, fmask, false, 0), causal, 1e-6, 0, false), 1);
    /* broadcast batch dims: [2,1,3,4] queries against [3,5,4] keys */
    kl_tensor *r = kl_scaled_dot_product_attention(kl_unsqueeze(q, 1), kl_expand(kl_select(k, 0, 0), KL_SHAPE(3, 5, 4)),
                                                   kl_select(v, 0, 0), NULL, false, 0);
    kt_assert_shape(r, KL_SHAPE(2, 3, 3, 2));
    /* errors */
    assert_null(kl_scaled_dot_product_attention(q, k, v, keep, true, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "pass either an explicit mask or causal = true, not both");
    assert_null(kl_scaled_dot_product_attention(q, kl_ones(KL_SHAPE(2, 5, 3), KL_F32), v, NULL, false, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_scaled_dot_product_attention: q [2,3,4], k [2,5,3] and v [2,5,2] do not fit");
    assert_null(kl_scaled_dot_product_attention(q, k, v, kl_ones(KL_SHAPE(4, 5), KL_BOOL), false, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "mask [4,5] bool cpu does not broadcast to the scores' shape [2,3,5]");
    assert_null(kl_scaled_dot_product_attention(q, k, v, kl_ones(KL_SHAPE(3, 5), KL_I64), false, 0));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "mask must be bool or float32");
    assert_null(kl_scaled_dot_product_attention(q, k, kl_to_dtype(v, KL_F64), NULL, false, 0));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "must share one floating dtype");
}

/* ---- losses ------------------------------------------------------------------------------ */

static void cross_entropy_values(void **s) {
    (void)s;
    kl_tensor *x = TF(KL_SHAPE(3, 4), 1, 2, 3, 0.5, 0, -1, 4, 2, 3, 3, 3, 3);
    kl_tensor *t = TI64(KL_SHAPE(3), 2, -100, 0); /* the second row is ignored */
    kl_tensor *r = kl_cross_entropy(x, t, KL_REDUCE_NONE, 0);
    kt_assert_shape(r, KL_SHAPE(3));
    KT_VALUES(r, 1e-6, 0.460773498, 0, 1.38629436);
    KT_VALUES(kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0), 1e-6, 0.923533916); /* divides by 2 rows */
    KT_VALUES(kl_cross_entropy(x, t, KL_REDUCE_SUM, 0), 1e-6, 1.84706783);
    KT_VALUES(kl_cross_entropy(x, t, KL_REDUCE_NONE, 0.2), 1e-6, 0.735773504, 0, 1.38629436);
    KT_VALUES(kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0.2), 1e-6, 1.06103396);
    KT_VALUES(kl_cross_entropy(x, t, KL_REDUCE_SUM, 0.2), 1e-6, 2.12206793);
    KT_VALUES(kl_nll_loss(x, t, KL_REDUCE_NONE), 0, -3, 0, -3);
    KT_VALUES(kl_nll_loss(x, t, KL_REDUCE_MEAN), 0, -3);
    KT_VALUES(kl_nll_loss(x, t, KL_REDUCE_SUM), 0, -6);
    KT_VALUES(kl_cross_entropy(x, TI64(KL_SHAPE(3), -100, -100, -100), KL_REDUCE_MEAN, 0), 0, NAN);
    /* unbatched [C] with a 0-dim target */
    r = kl_cross_entropy(TF(KL_SHAPE(3), 1, 2, 3), kl_scalar_tensor(1, KL_I64), KL_REDUCE_MEAN, 0.1);
    kt_assert_shape(r, 0, NULL);
    KT_VALUES(r, 1e-6, 1.40760589);
    /* [N, C, d] with target [N, d], a non-contiguous input and f64 */
    kl_tensor *xk = kl_div_scalar(kl_remainder_scalar(ar(KL_SHAPE(2, 3, 4)), 5), 2);
    kl_tensor *tk = TI64(KL_SHAPE(2, 4), 0, 1, 2, -100, 2, 2, 1, 0);
    KT_VALUES(kl_cross_entropy(xk, tk, KL_REDUCE_NONE, 0), 1e-6, 2.55495691, 2.30635571, 1.68026972, 0, 1.68026972,
              1.68026972, 1.18026972, 2.55495691);
    KT_VALUES(kl_cross_entropy(xk, tk, KL_REDUCE_MEAN, 0.3), 1e-6, 1.74819267);
    KT_VALUES(kl_nll_loss(xk, tk, KL_REDUCE_MEAN), 1e-6, -0.285714298);
    kl_tensor *xt = kl_t(kl_contiguous(kl_t(x)));
    KT_VALUES(kl_cross_entropy(xt, t, KL_REDUCE_SUM, 0.2), 1e-6, 2.12206793);
    r = kl_cross_entropy(kl_to_dtype(x, KL_F64), t, KL_REDUCE_MEAN, 0.2);
    assert_int_equal(kl_dtype_of(r), KL_F64);
    KT_VALUES(r, 1e-7, 1.06103396);
}

static void loss_errors_and_decomp(void **s) {
    (void)s;
    kl_tensor *x = TF(KL_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    assert_null(kl_cross_entropy(x, TI64(KL_SHAPE(2), 0, 5), KL_REDUCE_MEAN, 0));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_cross_entropy: target 5 is out of bounds for 3 classes (element 1)");
    assert_null(kl_nll_loss(x, TI64(KL_SHAPE(2), -1, 0), KL_REDUCE_NONE));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_nll_loss: target -1 is out of bounds for 3 classes (element 0)");
    assert_null(kl_cross_entropy(x, kl_from_data((const int32_t[]){0, 1}, KL_SHAPE(2), KL_I32), KL_REDUCE_MEAN, 0));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_cross_entropy: target must hold int64 class indices, got [2] int32 cpu");
    assert_null(kl_cross_entropy(x, TI64(KL_SHAPE(3), 0, 1, 2), KL_REDUCE_MEAN, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cross_entropy: target [3] does not match input [2,3] float32 cpu "
                                  "(expected target shape [2])");
    assert_null(kl_cross_entropy(x, TI64(KL_SHAPE(2), 0, 1), KL_REDUCE_MEAN, 1.5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "label_smoothing must be between 0 and 1, got 1.5");
    assert_null(kl_cross_entropy(x, TI64(KL_SHAPE(2), 0, 1), (kl_reduction)7, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_cross_entropy: invalid reduction 7");
    assert_null(kl_nll_loss(TI64(KL_SHAPE(2), 0, 1), TI64(KL_SHAPE(2), 0, 1), KL_REDUCE_MEAN));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_nll_loss: expects a floating-point input");
    assert_null(kl_cross_entropy(kl_scalar_tensor(1, KL_F32), kl_scalar_tensor(0, KL_I64), KL_REDUCE_MEAN, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "input must have a class dim");
    assert_null(kl_mse_loss(x, kl_ones(KL_SHAPE(4), KL_F32), KL_REDUCE_MEAN));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_mse_loss: shapes [2,3] and [4] cannot broadcast");
    assert_null(kl_mse_loss(TI64(KL_SHAPE(1), 1), TI64(KL_SHAPE(1), 1), KL_REDUCE_MEAN));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_mse_loss: expects floating-point tensors");
    assert_null(kl_binary_cross_entropy_with_logits(x, kl_ones(KL_SHAPE(3), KL_F32), KL_REDUCE_MEAN));
    KT_EXPECT_ERROR(KL_ERR_SHAPE,
                    "kl_binary_cross_entropy_with_logits: target shape [3] must equal the input's shape [2,3]");
    /* decompositions against the fused kernels */
    kl_tensor *xk = kl_div_scalar(kl_remainder_scalar(ar(KL_SHAPE(2, 3, 4)), 5), 2);
    kl_tensor *tk = TI64(KL_SHAPE(2, 4), 0, 1, 2, -100, 2, 2, 1, 0);
    kl_tensor *in[2] = {xk, tk};
    for (int red = 0; red < 3; red++) {
        for (int sm = 0; sm < 2; sm++) {
            ke_attrs a = {0};
            a.i[0] = red, a.i[1] = -100, a.f[0] = sm * 0.25;
            check_decomp(KE_OP_cross_entropy, 2, in, &a, kl_cross_entropy(xk, tk, (kl_reduction)red, sm * 0.25), 1e-5);
        }
        ke_attrs a = {0};
        a.i[0] = red, a.i[1] = -100;
        check_decomp(KE_OP_nll_loss, 2, in, &a, kl_nll_loss(xk, tk, (kl_reduction)red), 1e-6);
    }
}

/* kl_cross_entropy_ex / kl_nll_loss_ex: errors, and every decomposition
 * (compile mode's) against the fused kernels with weights, a settable
 * ignore_index and probabilities (values against PyTorch: test_fixtures). */
static void class_loss_options(void **s) {
    (void)s;
    kl_tensor *x = TF(KL_SHAPE(2, 3), 1, 2, 3, 4, 5, 6), *t = TI64(KL_SHAPE(2), 0, 2);
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    assert_int_equal(o.reduction, KL_REDUCE_MEAN);
    assert_int_equal(o.ignore_index, -100);
    assert_null(o.weight);
    /* NULL options are the defaults */
    assert_int_equal(kl_equal(kl_cross_entropy_ex(x, t, NULL), kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0)), 1);
    assert_int_equal(kl_equal(kl_nll_loss_ex(x, t, NULL), kl_nll_loss(x, t, KL_REDUCE_MEAN)), 1);
    /* weights: 2 * (lse - 1) + 3 * (lse' - 6) over 2 + 3 */
    o.weight = TF(KL_SHAPE(3), 2, 1, 3);
    KT_VALUES(kl_cross_entropy_ex(x, t, &o), 1e-6, (2 * 2.40760596 + 3 * 0.40760596) / 5);
    KT_VALUES(kl_nll_loss_ex(x, t, &o), 1e-6, -(2 * 1 + 3 * 6) / 5.0);
    o.ignore_index = 2; /* the second row leaves the sum and the denominator */
    KT_VALUES(kl_nll_loss_ex(x, t, &o), 1e-6, -1);
    assert_null(kl_cross_entropy_ex(x, t, &(kl_cross_entropy_options){.weight = TF(KL_SHAPE(2), 1, 1)}));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cross_entropy: weight [2] float32 cpu must hold one value per class "
                                  "(3 classes in input [2,3] float32 cpu)");
    assert_null(kl_nll_loss_ex(x, t, &(kl_cross_entropy_options){.weight = kl_ones(KL_SHAPE(3), KL_F64)}));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_nll_loss: weight [3] float64 cpu must have the input's dtype");
    assert_null(kl_nll_loss_ex(x, t, &(kl_cross_entropy_options){.label_smoothing = 0.1}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_nll_loss: has no label smoothing");
    /* probabilities: the input's shape and dtype (torch would promote f64), a negative ignore_index */
    kl_tensor *p = TF(KL_SHAPE(2, 3), 0.2, 0.3, 0.5, 1, 0, 0);
    assert_null(kl_cross_entropy_ex(x, kl_to_dtype(p, KL_F64), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cross_entropy: probability target [2,3] float64 cpu must have the input's "
                                  "shape and dtype (input [2,3] float32 cpu)");
    assert_null(kl_cross_entropy_ex(x, kl_reshape(p, KL_SHAPE(3, 2)), NULL));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "probability target [3,2] float32 cpu must have the input's shape");
    assert_null(kl_cross_entropy_ex(x, p, &(kl_cross_entropy_options){.ignore_index = 0}));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_cross_entropy: ignore_index 0 is not supported for probability targets");
    assert_null(kl_nll_loss_ex(x, p, NULL));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_nll_loss: target must hold int64 class indices, got [2,3] float32 cpu");
    /* one-hot probabilities equal class indices */
    kl_tensor *oh = TF(KL_SHAPE(2, 3), 1, 0, 0, 0, 0, 1);
    o = kl_cross_entropy_options_default();
    o.weight = TF(KL_SHAPE(3), 2, 1, 3);
    o.reduction = KL_REDUCE_NONE;
    assert_int_equal(kl_allclose(kl_cross_entropy_ex(x, oh, &o), kl_cross_entropy_ex(x, t, &o), 1e-6, 1e-6, false), 1);
    /* decompositions against the fused kernels */
    kl_tensor *xk = kl_div_scalar(kl_remainder_scalar(ar(KL_SHAPE(2, 3, 4)), 5), 2);
    kl_tensor *tk = TI64(KL_SHAPE(2, 4), 0, 1, 2, 1, 2, 2, 1, 0);
    kl_tensor *pk = kl_softmax(kl_cos(ar(KL_SHAPE(2, 3, 4))), 1);
    kl_tensor *wk = TF(KL_SHAPE(3), 0.5, 2, 1.5);
    for (int red = 0; red < 3; red++)
        for (int hw = 0; hw < 2; hw++)
            for (int sm = 0; sm < 2; sm++)
                for (int prob = 0; prob < 2; prob++) {
                    kl_tensor *in[3] = {xk, prob ? pk : tk, wk};
                    o = kl_cross_entropy_options_default();
                    o.reduction = (kl_reduction)red;
                    o.weight = hw ? wk : NULL;
                    o.ignore_index = prob ? -100 : 1;
                    o.label_smoothing = sm * 0.25;
                    ke_attrs a = {0};
                    ke_attr_set_reduction(&a, red);
                    ke_attr_set_cross_entropy_ignore_index(&a, o.ignore_index);
                    ke_attr_set_cross_entropy_label_smoothing(&a, o.label_smoothing);
                    ke_attr_set_cross_entropy_has_weight(&a, hw);
                    check_decomp(KE_OP_cross_entropy, 2 + hw, in, &a, kl_cross_entropy_ex(xk, in[1], &o), 1e-5);
                    if (prob || sm) continue;
                    check_decomp(KE_OP_nll_loss, 2 + hw, in, &a, kl_nll_loss_ex(xk, tk, &o), 1e-6);
                }
}

static void mse_and_bce_values(void **s) {
    (void)s;
    kl_tensor *a = TF(KL_SHAPE(2, 3), 1, 2, 3, 4, 5, 6), *b = TF(KL_SHAPE(3), 0.5, 2, 4);
    kl_tensor *r = kl_mse_loss(a, b, KL_REDUCE_NONE);
    kt_assert_shape(r, KL_SHAPE(2, 3));
    KT_VALUES(r, 1e-6, 0.25, 0, 1, 12.25, 9, 4);
    KT_VALUES(kl_mse_loss(a, b, KL_REDUCE_MEAN), 1e-6, 4.41666651);
    KT_VALUES(kl_mse_loss(a, b, KL_REDUCE_SUM), 1e-6, 26.5);
    r = kl_mse_loss(a, kl_to_dtype(b, KL_F64), KL_REDUCE_SUM); /* promotes as PyTorch */
    assert_int_equal(kl_dtype_of(r), KL_F64);
    kl_tensor *x = TF(KL_SHAPE(5), -100, -2, 0, 3, 50), *y = TF(KL_SHAPE(5), 0, 1, 0.5, 1, 0);
    KT_VALUES(kl_binary_cross_entropy_with_logits(x, y, KL_REDUCE_NONE), 1e-6, 0, 2.12692809, 0.693147182,
              0.0485873297, 50);
    KT_VALUES(kl_binary_cross_entropy_with_logits(x, y, KL_REDUCE_MEAN), 1e-6, 10.5737324);
    KT_VALUES(kl_binary_cross_entropy_with_logits(x, y, KL_REDUCE_SUM), 1e-6, 52.86866);
}

/* ---- meta tensors: shape rules only ------------------------------------------------------- */

static kl_tensor *meta(int nd, const int64_t *shape, kl_dtype dt) { return kl_empty_on(nd, shape, dt, KL_DEVICE_META); }

static void meta_shapes(void **s) {
    (void)s;
    kl_tensor *x = meta(KL_SHAPE(2, 5, 3), KL_F32), *r;
    r = kl_matmul(x, meta(KL_SHAPE(3, 4), KL_F32));
    kt_assert_shape(r, KL_SHAPE(2, 5, 4));
    assert_int_equal(kl_device_of(r).type, KL_META);
    kt_assert_shape(kl_linear(x, meta(KL_SHAPE(6, 3), KL_F32), meta(KL_SHAPE(6), KL_F32)), KL_SHAPE(2, 5, 6));
    kl_tensor *m23 = meta(KL_SHAPE(2, 3), KL_F32), *m34 = meta(KL_SHAPE(3, 4), KL_F32);
    kt_assert_shape(kl_addmm(meta(KL_SHAPE(1), KL_F32), m23, m34, 1, 1), KL_SHAPE(2, 4));
    kt_assert_shape(kl_softmax(x, 1), KL_SHAPE(2, 5, 3));
    kt_assert_shape(kl_layer_norm(x, 2, NULL, meta(KL_SHAPE(5, 3), KL_F32), 1e-5), KL_SHAPE(2, 5, 3));
    kt_assert_shape(kl_dropout(x, 0.5, true), KL_SHAPE(2, 5, 3));
    kt_assert_shape(kl_cross_entropy(x, meta(KL_SHAPE(2, 3), KL_I64), KL_REDUCE_NONE, 0), KL_SHAPE(2, 3));
    kt_assert_shape(kl_nll_loss(x, meta(KL_SHAPE(2, 3), KL_I64), KL_REDUCE_MEAN), 0, NULL);
    kt_assert_shape(kl_mse_loss(x, meta(KL_SHAPE(3), KL_F32), KL_REDUCE_NONE), KL_SHAPE(2, 5, 3));
    kt_assert_shape(kl_binary_cross_entropy_with_logits(x, x, KL_REDUCE_SUM), 0, NULL);
    kl_conv2d_options o = kl_conv2d_options_default();
    o.padding[0] = 1;
    kt_assert_shape(kl_conv2d(meta(KL_SHAPE(2, 4, 7, 7), KL_F32), meta(KL_SHAPE(6, 4, 3, 3), KL_F32), NULL, &o),
                    KL_SHAPE(2, 6, 7, 5));
    kl_pool2d_options po = kl_pool2d_options_default(2);
    po.ceil_mode = true;
    kt_assert_shape(kl_max_pool2d(meta(KL_SHAPE(3, 7, 7), KL_F32), &po), KL_SHAPE(3, 4, 4));
    kt_assert_shape(kl_scaled_dot_product_attention(meta(KL_SHAPE(2, 4, 8), KL_F32), meta(KL_SHAPE(2, 6, 8), KL_F32),
                                                    meta(KL_SHAPE(2, 6, 5), KL_F32), NULL, true, 0),
                    KL_SHAPE(2, 4, 5));
    assert_null(kl_matmul(x, meta(KL_SHAPE(4, 4), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_matmul: shapes [2,5,3] and [4,4] cannot be multiplied (3 != 4)");
}

/* The same results on one thread and on several (chunking never changes a value). */
static void thread_count_invariance(void **s) {
    (void)s;
    kl_manual_seed(21);
    kl_tensor *x = kl_randn(KL_SHAPE(64, 300), KL_F32), *w = kl_randn(KL_SHAPE(300), KL_F32);
    kl_tensor *a = kl_randn(KL_SHAPE(24, 9, 10), KL_F32), *b = kl_randn(KL_SHAPE(24, 10, 7), KL_F32);
    kl_tensor *img = kl_randn(KL_SHAPE(6, 3, 9, 9), KL_F32), *k = kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32);
    kl_tensor *t = kl_randint(0, 300, KL_SHAPE(64), KL_I64);
    kl_tensor *r1[6], *r4[6];
    int threads = kl_get_num_threads();
    for (int pass = 0; pass < 2; pass++) {
        kl_set_num_threads(pass ? 4 : 1);
        kl_tensor **r = pass ? r4 : r1;
        r[0] = kl_softmax(x, 0);
        r[1] = kl_log_softmax(x, 1);
        r[2] = kl_layer_norm(x, 1, w, w, 1e-5);
        r[3] = kl_matmul(a, b);
        r[4] = kl_conv2d(img, k, NULL, NULL);
        r[5] = kl_cross_entropy(x, t, KL_REDUCE_SUM, 0.1);
    }
    kl_set_num_threads(threads);
    for (int i = 0; i < 6; i++) assert_int_equal(kl_equal(r1[i], r4[i]), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(matmul_shape_rules),
        KT_TEST(matmul_errors),
        KT_TEST(matmul_strided_operands),
        KT_TEST(matmul_large_and_batched),
        KT_TEST(gemm_loop_fallback),
        KT_TEST(matmul_integer_and_half),
        KT_TEST(addmm_and_linear),
        KT_TEST(softmax_values),
        KT_TEST(softmax_errors_and_decomp),
        KT_TEST(layer_norm_values),
        KT_TEST(norm_errors_and_decomp),
        KT_TEST(dropout_semantics),
        KT_TEST(sdpa_values),
        KT_TEST(cross_entropy_values),
        KT_TEST(loss_errors_and_decomp),
        KT_TEST(class_loss_options),
        KT_TEST(mse_and_bce_values),
        KT_TEST(meta_shapes),
        KT_TEST(thread_count_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
