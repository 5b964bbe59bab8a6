/*
 * ku_cublas.h — the slice of cuBLAS's ABI that Kiln calls, declared by hand
 * (values as in cublas_api.h and library_types.h of CUDA 12/13: no toolkit
 * header at build time), and the function table that either libcublas
 * (cublas.c) or the emulated cuBLAS over OpenBLAS (cublas_emu.c) fills.
 * Private to src/codegen_nvrtc; the rest of Kiln calls ku_gemm (cuda_api.h).
 */
#ifndef KILN_KU_CUBLAS_H
#define KILN_KU_CUBLAS_H

#include "cuda_api.h"

typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
};
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };              /* cublasOperation_t */
enum { KU_CUBLAS_MAJOR = 0, KU_CUBLAS_MINOR = 1, KU_CUBLAS_PATCH = 2 };  /* libraryPropertyType */
enum {                                                                   /* cublasMath_t */
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};
enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 }; /* cudaDataType */
enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_PEDANTIC = 69, CUBLAS_COMPUTE_64F = 70 }; /* cublasComputeType_t */
enum { CUBLAS_GEMM_DEFAULT = -1 };                                       /* cublasGemmAlgo_t */

/* X(field, exported symbol, params): the entry points, by the names
 * cublas_api.h's macros map to (_v2 where there is one). Scalars (alpha,
 * beta) are host pointers: Kiln never changes the handle's pointer mode. */
#define KU_CUBLAS_FUNCS(X)                                                                        \
    X(GetProperty, "cublasGetProperty", (int type, int *value))                                   \
    X(Create, "cublasCreate_v2", (cublasHandle_t * h))                                            \
    X(Destroy, "cublasDestroy_v2", (cublasHandle_t h))                                            \
    X(SetStream, "cublasSetStream_v2", (cublasHandle_t h, CUstream s))                            \
    X(SetMathMode, "cublasSetMathMode", (cublasHandle_t h, int mode))                             \
    X(Sgemm, "cublasSgemm_v2",                                                                    \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, \
       int lda, const float *B, int ldb, const float *beta, float *C, int ldc))                   \
    X(Dgemm, "cublasDgemm_v2",                                                                    \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const double *alpha,                \
       const double *A, int lda, const double *B, int ldb, const double *beta, double *C, int ldc)) \
    X(SgemmStridedBatched, "cublasSgemmStridedBatched",                                           \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const float *A, \
       int lda, long long sa, const float *B, int ldb, long long sb, const float *beta, float *C, \
       int ldc, long long sc, int batch))                                                         \
    X(DgemmStridedBatched, "cublasDgemmStridedBatched",                                           \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const double *alpha,                \
       const double *A, int lda, long long sa, const double *B, int ldb, long long sb,            \
       const double *beta, double *C, int ldc, long long sc, int batch))                          \
    X(GemmEx, "cublasGemmEx",                                                                     \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,   \
       int atype, int lda, const void *B, int btype, int ldb, const void *beta, void *C,          \
       int ctype, int ldc, int compute, int algo))                                                \
    X(GemmStridedBatchedEx, "cublasGemmStridedBatchedEx",                                         \
      (cublasHandle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *A,   \
       int atype, int lda, long long sa, const void *B, int btype, int ldb, long long sb,         \
       const void *beta, void *C, int ctype, int ldc, long long sc, int batch, int compute,      \
       int algo))

typedef struct ku_cublas_table {
#define KU_CB_FIELD_(name, sym, params) cublasStatus_t(*name) params;
    KU_CUBLAS_FUNCS(KU_CB_FIELD_)
#undef KU_CB_FIELD_
    /* cublasGetStatusName / cublasGetStatusString (cuBLAS 11.4.2+); NULL
     * when absent, then the status is named from the table in cublas.c. */
    const char *(*GetStatusName)(cublasStatus_t s);
    const char *(*GetStatusString)(cublasStatus_t s);
    int emulated;
} ku_cublas_table;

/* The table in use (libcublas or the emulated one, loaded at the first
 * call); NULL and "cuBLAS not available: <reason>" recorded when there is none. */
const ku_cublas_table *ku_cublas_get(const char *op);
/* "CUBLAS_STATUS_..." for a status code (what cublasGetStatusName says). */
const char *ku_cublas_status_name(cublasStatus_t s);
/* 0 for success, else records "<call> failed: <CUBLAS_STATUS_NAME>: <text>"
 * (KL_ERR_OOM for ALLOC_FAILED, else KL_ERR_DEVICE) and returns -1. */
int ku_cublas_check(const char *op, const char *call, cublasStatus_t s);
/* Device dev's handle, its context current on this thread, bound to `stream`
 * and the TF32 setting, locked for the caller until ku_cublas_release(dev);
 * NULL and an error (nothing locked) on failure. *table is the table to call. */
cublasHandle_t ku_cublas_acquire(const char *op, int dev, CUstream stream, const ku_cublas_table **table);
void ku_cublas_release(int dev);

/* The emulated cuBLAS (cublas_emu.c): host functions over OpenBLAS reading
 * and writing the emulated device's memory. */
const ku_cublas_table *ku_cublas_emu_table(void);

#endif
