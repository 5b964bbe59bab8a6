/*
 * cublas_emu.c — the emulated cuBLAS (KL_CUDA_EMULATE=1): the entry points
 * of ku_cublas.h as host functions over OpenBLAS, reading and writing the
 * emulated device's memory (host memory) at once, in order, as the emulated
 * streams run all work.
 *
 * The point is to catch on a machine without a GPU what a GPU run would
 * show: every argument is checked as cuBLAS checks it (CUBLAS_STATUS_
 * INVALID_VALUE for a bad operation, negative size or a leading dimension
 * below max(1, rows)), unsupported type combinations give NOT_SUPPORTED, and
 * every matrix a call would touch (its columns at lda, every batch at its
 * stride) must lie inside one live device allocation — a wrong transposition
 * or leading dimension that a GPU would turn into an illegal address (or
 * silently wrong numbers) fails here with EXECUTION_FAILED and a detail.
 *
 * Arithmetic: column-major exactly as cuBLAS defines it, through
 * cblas_?gemm(CblasColMajor, ...). f16/bf16 (cublasGemmEx with f32 compute)
 * convert to f32, multiply in f32 and round once to the storage type. With
 * the TF32 math mode an f32 GEMM rounds its inputs to TF32 (10 mantissa
 * bits, to nearest even) first, as the tensor cores see them. When beta is
 * 0, C is not read (NaNs in it do not survive), as cuBLAS documents.
 */
#include "ku_cublas.h"

#include "core.h"
#include "kernels_nn.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#define HANDLE_MAGIC 0x43424c48u

struct cublasContext {
    uint32_t magic;
    CUstream stream;
    int mode;
};

/* This thread's last failure detail, shown by GetStatusString for that
 * status only (as cuda_emu.c does for driver errors). */
static _Thread_local const char *tl_detail;
static _Thread_local cublasStatus_t tl_detail_status;

static cublasStatus_t fail(cublasStatus_t s, const char *why) {
    tl_detail = why;
    tl_detail_status = s;
    return s;
}

static int handle_ok(cublasHandle_t h) { return h && h->magic == HANDLE_MAGIC; }

static cublasStatus_t e_GetProperty(int type, int *value) {
    if (!value) return fail(CUBLAS_STATUS_INVALID_VALUE, "value is NULL");
    /* The ABI ku_cublas.h declares: cuBLAS 13.0's. */
    switch (type) {
    case KU_CUBLAS_MAJOR: *value = 13; return CUBLAS_STATUS_SUCCESS;
    case KU_CUBLAS_MINOR: *value = 0; return CUBLAS_STATUS_SUCCESS;
    case KU_CUBLAS_PATCH: *value = 0; return CUBLAS_STATUS_SUCCESS;
    default: return fail(CUBLAS_STATUS_INVALID_VALUE, "unknown library property");
    }
}

static cublasStatus_t e_Create(cublasHandle_t *h) {
    if (!h) return fail(CUBLAS_STATUS_INVALID_VALUE, "handle pointer is NULL");
    struct cublasContext *c = calloc(1, sizeof *c);
    if (!c) return fail(CUBLAS_STATUS_ALLOC_FAILED, "out of host memory");
    c->magic = HANDLE_MAGIC;
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t e_Destroy(cublasHandle_t h) {
    if (!handle_ok(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "not a live handle");
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t e_SetStream(cublasHandle_t h, CUstream s) {
    if (!handle_ok(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "not a live handle");
    if (!ku_emu_stream_ok(s)) return fail(CUBLAS_STATUS_INVALID_VALUE, "not a live stream");
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t e_SetMathMode(cublasHandle_t h, int mode) {
    if (!handle_ok(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "not a live handle");
    int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != 0 && base != 1 && base != 2 && base != 3 && base != 4 && base != 8)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "unknown math mode");
    h->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- The one GEMM every entry point comes down to ------------------------ */

static size_t type_size(int t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

static int op_ok(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

/* Whether every element a batched matrix operand (rows x cols stored
 * column-major at ld, `batch` of them `stride` elements apart) lies in one
 * live allocation. */
static int operand_ok(const void *p, size_t es, int rows, int cols, int ld, long long stride, int batch) {
    if (rows == 0 || cols == 0 || batch == 0) return 1;
    long long span = (long long)(cols - 1) * ld + rows; /* elements of one matrix */
    long long lo = 0, hi = span;
    long long last = (long long)(batch - 1) * stride;
    if (last < 0) lo = last;
    else hi += last;
    uintptr_t base = (uintptr_t)p;
    if (lo < 0 && (uintptr_t)(-lo) * es > base) return 0;
    return ku_emu_range_ok((CUdeviceptr)(base + (uintptr_t)(lo * (long long)es)), (size_t)(hi - lo) * es);
}

/* x rounded to TF32 (1 + 8 + 10 bits), to nearest even; inf and NaN kept. */
static float to_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

static float load_f32(const void *p, int t, size_t i) {
    switch (t) {
    case CUDA_R_16F: return ke_f16_to_f32(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return ke_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* A column-major rows x cols matrix at ld as a dense f32 one (ld = rows). */
static float *dense_f32(const void *p, int t, int rows, int cols, int ld, int tf32) {
    size_t count = (size_t)rows * (size_t)cols;
    float *d = malloc((count ? count : 1) * sizeof *d);
    if (!d) return NULL;
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            float v = load_f32(p, t, (size_t)j * ld + i);
            d[(size_t)j * rows + i] = tf32 ? to_tf32(v) : v;
        }
    return d;
}

static CBLAS_TRANSPOSE cblas_op(int op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

/* One matrix triple in f32 through dense copies: f16/bf16 storage, or f32
 * under TF32. -1 when out of host memory. */
static int gemm_converted(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda, const void *B,
                          int ldb, float beta, void *C, int ldc, int t, int tf32) {
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    float *a = dense_f32(A, t, ar, ac, lda, tf32), *b = dense_f32(B, t, br, bc, ldb, tf32);
    size_t mn = (size_t)m * (size_t)n;
    float *c = beta != 0 ? dense_f32(C, t, m, n, ldc, 0) : calloc(mn ? mn : 1, sizeof(float));
    int rc = -1;
    if (a && b && c) {
        if (k > 0)
            cblas_sgemm(CblasColMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, a, ar ? ar : 1, b, br ? br : 1,
                        beta, c, m ? m : 1);
        else
            for (size_t i = 0; i < mn; i++) c[i] *= beta;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float v = c[(size_t)j * m + i];
                size_t at = (size_t)j * ldc + i;
                if (t == CUDA_R_16F) ((uint16_t *)C)[at] = ke_f32_to_f16(v);
                else if (t == CUDA_R_16BF) ((uint16_t *)C)[at] = ke_f32_to_bf16(v);
                else ((float *)C)[at] = v;
            }
        rc = 0;
    }
    free(a);
    free(b);
    free(c);
    return rc;
}

/* C = beta * C for k == 0 (BLAS libraries differ on k == 0; cuBLAS scales),
 * and zeroes C when beta == 0 (C is not read then). */
#define SCALE_C_(T)                                                                 \
    static void scale_##T(T *C, int m, int n, int ldc, T beta) {                    \
        for (int j = 0; j < n; j++)                                                 \
            for (int i = 0; i < m; i++) {                                           \
                T *c = C + (size_t)j * ldc + i;                                     \
                *c = beta == 0 ? 0 : beta * *c;                                     \
            }                                                                       \
    }
SCALE_C_(float)
SCALE_C_(double)
#undef SCALE_C_

static cublasStatus_t gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,
                           int at, int lda, long long sa, const void *B, int bt, int ldb, long long sb,
                           const void *beta, void *C, int ct, int ldc, long long sc, int batch, int compute) {
    if (!handle_ok(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "not a live handle");
    if (!op_ok(ta) || !op_ok(tb)) return fail(CUBLAS_STATUS_INVALID_VALUE, "transa or transb is not N, T or C");
    if (m < 0 || n < 0 || k < 0 || batch < 0) return fail(CUBLAS_STATUS_INVALID_VALUE, "m, n, k or batchCount < 0");
    int ar = ta == CUBLAS_OP_N ? m : k, br = tb == CUBLAS_OP_N ? k : n;
    if (lda < (ar > 1 ? ar : 1)) return fail(CUBLAS_STATUS_INVALID_VALUE, "lda < max(1, rows of A as stored)");
    if (ldb < (br > 1 ? br : 1)) return fail(CUBLAS_STATUS_INVALID_VALUE, "ldb < max(1, rows of B as stored)");
    if (ldc < (m > 1 ? m : 1)) return fail(CUBLAS_STATUS_INVALID_VALUE, "ldc < max(1, m)");
    int t = at;
    int f64 = t == CUDA_R_64F;
    if (at != bt || at != ct || !type_size(t) ||
        (f64 ? compute != CUBLAS_COMPUTE_64F : compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "emulated cuBLAS: A, B, C must share one of f32, f64, f16, bf16 with f32 (f64) compute");
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is NULL");
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    size_t es = type_size(t);
    int ac = ta == CUBLAS_OP_N ? k : m, bc = tb == CUBLAS_OP_N ? n : k;
    if (!operand_ok(C, es, m, n, ldc, sc, batch))
        return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                    "emulated cuBLAS: C (m x n at ldc, batch stride) is not inside one live device allocation");
    if (k > 0 && !operand_ok(A, es, ar, ac, lda, sa, batch))
        return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                    "emulated cuBLAS: A (as stored, at lda, batch stride) is not inside one live device allocation");
    if (k > 0 && !operand_ok(B, es, br, bc, ldb, sb, batch))
        return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                    "emulated cuBLAS: B (as stored, at ldb, batch stride) is not inside one live device allocation");
    int tf32 = t == CUDA_R_32F && (h->mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH && compute == CUBLAS_COMPUTE_32F;
    ke_blas_prepare();
    for (int b = 0; b < batch; b++) {
        const char *a = (const char *)A + (long long)b * sa * (long long)es;
        const char *bp = (const char *)B + (long long)b * sb * (long long)es;
        char *c = (char *)C + (long long)b * sc * (long long)es;
        if (f64) {
            double al = *(const double *)alpha, be = *(const double *)beta;
            if (be == 0 || k == 0) scale_double((double *)c, m, n, ldc, be);
            if (k > 0)
                cblas_dgemm(CblasColMajor, cblas_op(ta), cblas_op(tb), m, n, k, al, (const double *)a, lda,
                            (const double *)bp, ldb, be, (double *)c, ldc);
        } else if (t == CUDA_R_32F && !tf32) {
            float al = *(const float *)alpha, be = *(const float *)beta;
            if (be == 0 || k == 0) scale_float((float *)c, m, n, ldc, be);
            if (k > 0)
                cblas_sgemm(CblasColMajor, cblas_op(ta), cblas_op(tb), m, n, k, al, (const float *)a, lda,
                            (const float *)bp, ldb, be, (float *)c, ldc);
        } else if (gemm_converted(ta, tb, m, n, k, *(const float *)alpha, a, lda, bp, ldb, *(const float *)beta, c,
                                  ldc, t, tf32)) {
            return fail(CUBLAS_STATUS_ALLOC_FAILED, "emulated cuBLAS: out of host memory for the f32 copies");
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t e_Sgemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta, float *C, int ldc) {
    return gemm(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0,
                1, CUBLAS_COMPUTE_32F);
}
static cublasStatus_t e_Dgemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, const double *alpha,
                              const double *A, int lda, const double *B, int ldb, const double *beta, double *C,
                              int ldc) {
    return gemm(h, ta, tb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B, CUDA_R_64F, ldb, 0, beta, C, CUDA_R_64F, ldc, 0,
                1, CUBLAS_COMPUTE_64F);
}
static cublasStatus_t e_SgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k,
                                            const float *alpha, const float *A, int lda, long long sa,
                                            const float *B, int ldb, long long sb, const float *beta, float *C,
                                            int ldc, long long sc, int batch) {
    return gemm(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F, ldb, sb, beta, C, CUDA_R_32F, ldc,
                sc, batch, CUBLAS_COMPUTE_32F);
}
static cublasStatus_t e_DgemmStridedBatched(cublasHandle_t h, int ta, int tb, int m, int n, int k,
                                            const double *alpha, const double *A, int lda, long long sa,
                                            const double *B, int ldb, long long sb, const double *beta, double *C,
                                            int ldc, long long sc, int batch) {
    return gemm(h, ta, tb, m, n, k, alpha, A, CUDA_R_64F, lda, sa, B, CUDA_R_64F, ldb, sb, beta, C, CUDA_R_64F, ldc,
                sc, batch, CUBLAS_COMPUTE_64F);
}
static cublasStatus_t e_GemmEx(cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha,
                               const void *A, int at, int lda, const void *B, int bt, int ldb, const void *beta,
                               void *C, int ct, int ldc, int compute, int algo) {
    if (algo != CUBLAS_GEMM_DEFAULT && (algo < 0 || algo > 115))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "unknown GEMM algorithm");
    return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute);
}
static cublasStatus_t e_GemmStridedBatchedEx(cublasHandle_t h, int ta, int tb, int m, int n, int k,
                                             const void *alpha, const void *A, int at, int lda, long long sa,
                                             const void *B, int bt, int ldb, long long sb, const void *beta, void *C,
                                             int ct, int ldc, long long sc, int batch, int compute, int algo) {
    if (algo != CUBLAS_GEMM_DEFAULT && (algo < 0 || algo > 115))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "unknown GEMM algorithm");
    return gemm(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute);
}

static const char *e_GetStatusName(cublasStatus_t s) { return ku_cublas_status_name(s); }

static const char *e_GetStatusString(cublasStatus_t s) {
    if (s == tl_detail_status && tl_detail) return tl_detail;
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

static const ku_cublas_table emu = {
#define KU_CB_EMU_(name, sym, params) .name = e_##name,
    KU_CUBLAS_FUNCS(KU_CB_EMU_)
#undef KU_CB_EMU_
        .GetStatusName = e_GetStatusName,
    .GetStatusString = e_GetStatusString,
    .emulated = 1,
};

const ku_cublas_table *ku_cublas_emu_table(void) { return &emu; }
