/* tmpl/blas_gemm.h — one BLAS call per matrix triple for one float type
 * (linalg.c): a template, included once per type. Define before including
 * (#undef'd at the end): LB_T the type, LB_SFX its suffix, LB_DOT, LB_GEMV,
 * LB_GEMM its cblas routines. Returns -1 if the strides do not fit. beta == 0
 * must not read C, which BLAS's gemm honours but gemv may not (it scales y),
 * so y is cleared first there. */
#include "tmpl.h"

#define LB_FN(name) KE_TCAT3(name, _, LB_SFX)

static int LB_FN(blas)(int64_t M, int64_t N, int64_t K, LB_T alpha, const LB_T *A, int64_t ars, int64_t acs,
                       const LB_T *B, int64_t brs, int64_t bcs, LB_T beta, LB_T *C, int64_t ldc) {
    int ta = 0, tb = 0;
    int64_t lda = 1, ldb = 1;
    if (!a_fits(M, N, K, ars, acs) || !b_fits(M, N, K, brs, bcs) || ldc > INT_MAX || ldc < (N > 1 ? N : 1)) return -1;
    if (M == 1 && N == 1) {
        LB_T d = LB_DOT((int)K, A, (int)blas_inc(K, acs), B, (int)blas_inc(K, brs));
        C[0] = beta == 0 ? alpha * d : alpha * d + beta * C[0];
    } else if (N == 1) {
        if (beta == 0)
            for (int64_t i = 0; i < M; i++) C[i * ldc] = 0;
        blas_layout(M, K, ars, acs, &ta, &lda);
        if (!ta)
            LB_GEMV(CblasRowMajor, CblasNoTrans, (int)M, (int)K, alpha, A, (int)lda, B, (int)blas_inc(K, brs), beta, C,
                    (int)ldc);
        else
            LB_GEMV(CblasRowMajor, CblasTrans, (int)K, (int)M, alpha, A, (int)lda, B, (int)blas_inc(K, brs), beta, C,
                    (int)ldc);
    } else if (M == 1) {
        if (beta == 0)
            for (int64_t j = 0; j < N; j++) C[j] = 0;
        blas_layout(K, N, brs, bcs, &tb, &ldb);
        if (!tb)
            LB_GEMV(CblasRowMajor, CblasTrans, (int)K, (int)N, alpha, B, (int)ldb, A, (int)blas_inc(K, acs), beta, C,
                    1);
        else
            LB_GEMV(CblasRowMajor, CblasNoTrans, (int)N, (int)K, alpha, B, (int)ldb, A, (int)blas_inc(K, acs), beta, C,
                    1);
    } else {
        blas_layout(M, K, ars, acs, &ta, &lda);
        blas_layout(K, N, brs, bcs, &tb, &ldb);
        LB_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    }
    return 0;
}

#undef LB_FN
#undef LB_T
#undef LB_SFX
#undef LB_DOT
#undef LB_GEMV
#undef LB_GEMM
