/*
 * cuda_gemm.c — ku_gemm: row-major, strided, batched GEMM on cuBLAS's
 * column-major API without copies.
 *
 * cuBLAS sees memory column-major. A row-major view X (r x c, strides rs,
 * cs) is column-major storage of X when rs == 1 (ld = cs) and of X^T when
 * cs == 1 (ld = rs), so each operand becomes op N or op T on the same
 * memory. The output cannot be transposed in cuBLAS: when C is column-major
 * we compute C = A B directly; when it is row-major (the usual case) we
 * compute C^T = B^T A^T, i.e. swap the operands and m with n. Batches go to
 * the strided-batched entry points, where a stride of 0 repeats one matrix.
 */
#include "ku_cublas.h"

#include "core.h"

#include <limits.h>

/* ld for X (r x c, strides rs, cs) read as column-major storage without
 * transposition, or -1 if it is not: its columns must be contiguous (rs == 1,
 * or a single row) and ld = cs must be at least max(1, r), as cuBLAS asks. A
 * single column may take any ld >= r. */
static int64_t ld_as_stored(int64_t r, int64_t c, int64_t rs, int64_t cs) {
    int64_t need = r > 1 ? r : 1;
    if (r > 1 && rs != 1) return -1;
    int64_t ld = c <= 1 ? need : cs;
    return ld >= need ? ld : -1;
}

typedef struct operand {
    CUdeviceptr ptr;
    int op;         /* CUBLAS_OP_N or CUBLAS_OP_T */
    int64_t ld, bs;
} operand;

/* Operand X (r x c, strides rs, cs) of the column-major product: as stored
 * (N), or its transpose stored (T); -1 when neither fits. */
static int as_operand(ku_matrix x, int64_t r, int64_t c, int64_t rs, int64_t cs, operand *o) {
    o->ptr = x.ptr;
    o->bs = x.bs;
    if (r == 0 || c == 0) { /* never read (k == 0): any valid ld */
        o->op = CUBLAS_OP_N;
        o->ld = r > 1 ? r : 1;
        return 0;
    }
    if ((o->ld = ld_as_stored(r, c, rs, cs)) >= 0) o->op = CUBLAS_OP_N;
    else if ((o->ld = ld_as_stored(c, r, cs, rs)) >= 0) o->op = CUBLAS_OP_T;
    else return -1;
    return 0;
}

int ku_gemm_operand_ok(int64_t r, int64_t c, int64_t rs, int64_t cs) {
    operand o;
    return as_operand((ku_matrix){0, rs, cs, 0}, r, c, rs, cs, &o) == 0;
}

static int too_big(int64_t v) { return v > INT_MAX; }

int ku_gemm(const char *op, int dev, int dtype, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
            ku_matrix a, ku_matrix b, double beta, ku_matrix c, CUstream stream) {
    kl_dtype dt = (kl_dtype)dtype;
    if (dt != KL_F32 && dt != KL_F64 && dt != KL_F16 && dt != KL_BF16)
        return ke_err(KL_ERR_DTYPE, op, "cuBLAS GEMM takes float32, float64, float16 or bfloat16, got %s",
                      ke_dtype_valid(dt) ? ke_dtypes[dt].name : "an invalid dtype");
    if (batch < 0 || m < 0 || n < 0 || k < 0)
        return ke_err(KL_ERR_SHAPE, op, "GEMM sizes must be >= 0 (batch %lld, m %lld, n %lld, k %lld)",
                      (long long)batch, (long long)m, (long long)n, (long long)k);
    if (batch == 0 || m == 0 || n == 0) return 0;
    if (batch > 1 && c.bs == 0)
        return ke_err(KL_ERR_SHAPE, op, "GEMM output batch stride is 0 for %lld batches (they would overwrite each other)",
                      (long long)batch);
    /* D, the column-major output cuBLAS writes: C itself, or C^T. */
    int64_t ldc = ld_as_stored(m, n, c.rs, c.cs);
    int swap = ldc < 0;
    if (swap) ldc = ld_as_stored(n, m, c.cs, c.rs);
    if (ldc < 0)
        return ke_err(KL_ERR_UNSUPPORTED, op,
                      "GEMM output [%lld, %lld] with strides (%lld, %lld) has no unit stride cuBLAS can write "
                      "through: compute into a contiguous tensor and copy",
                      (long long)m, (long long)n, (long long)c.rs, (long long)c.cs);
    operand p, q; /* D = op(p) op(q) */
    int64_t M = swap ? n : m, N = swap ? m : n;
    int bad_p = swap ? as_operand(b, n, k, b.cs, b.rs, &p) : as_operand(a, m, k, a.rs, a.cs, &p);
    int bad_q = swap ? as_operand(a, k, m, a.cs, a.rs, &q) : as_operand(b, k, n, b.rs, b.cs, &q);
    if (bad_p || bad_q) {
        int a_bad = swap ? bad_q : bad_p;
        ku_matrix x = a_bad ? a : b;
        return ke_err(KL_ERR_UNSUPPORTED, op,
                      "GEMM operand %s [%lld, %lld] with strides (%lld, %lld) has no unit stride (or overlaps "
                      "itself): make it contiguous first",
                      a_bad ? "A" : "B", (long long)(a_bad ? m : k), (long long)(a_bad ? k : n), (long long)x.rs,
                      (long long)x.cs);
    }
    if (too_big(M) || too_big(N) || too_big(k) || too_big(p.ld) || too_big(q.ld) || too_big(ldc) || too_big(batch))
        return ke_err(KL_ERR_SHAPE, op,
                      "GEMM sizes or leading dimensions exceed cuBLAS's 32-bit int (batch %lld, m %lld, n %lld, k %lld)",
                      (long long)batch, (long long)m, (long long)n, (long long)k);

    const ku_cublas_table *t;
    cublasHandle_t h = ku_cublas_acquire(op, dev, stream, &t);
    if (!h) return -1;
    ku_count(KU_N_GEMM);
    if (batch > 1) ku_count(KU_N_GEMM_BATCHED);
    int im = (int)M, in = (int)N, ik = (int)k, lp = (int)p.ld, lq = (int)q.ld, lc = (int)ldc, nb = (int)batch;
    void *P = (void *)(uintptr_t)p.ptr, *Q = (void *)(uintptr_t)q.ptr, *C = (void *)(uintptr_t)c.ptr;
    float af = (float)alpha, bf = (float)beta;
    cublasStatus_t s;
    const char *call;
    if (dt == KL_F64) {
        if (batch == 1) {
            call = "cublasDgemm_v2";
            s = t->Dgemm(h, p.op, q.op, im, in, ik, &alpha, P, lp, Q, lq, &beta, C, lc);
        } else {
            call = "cublasDgemmStridedBatched";
            s = t->DgemmStridedBatched(h, p.op, q.op, im, in, ik, &alpha, P, lp, p.bs, Q, lq, q.bs, &beta, C, lc,
                                       c.bs, nb);
        }
    } else if (dt == KL_F32) {
        if (batch == 1) {
            call = "cublasSgemm_v2";
            s = t->Sgemm(h, p.op, q.op, im, in, ik, &af, P, lp, Q, lq, &bf, C, lc);
        } else {
            call = "cublasSgemmStridedBatched";
            s = t->SgemmStridedBatched(h, p.op, q.op, im, in, ik, &af, P, lp, p.bs, Q, lq, q.bs, &bf, C, lc, c.bs,
                                       nb);
        }
    } else {
        int ty = dt == KL_F16 ? CUDA_R_16F : CUDA_R_16BF;
        if (batch == 1) {
            call = "cublasGemmEx";
            s = t->GemmEx(h, p.op, q.op, im, in, ik, &af, P, ty, lp, Q, ty, lq, &bf, C, ty, lc, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
        } else {
            call = "cublasGemmStridedBatchedEx";
            s = t->GemmStridedBatchedEx(h, p.op, q.op, im, in, ik, &af, P, ty, lp, p.bs, Q, ty, lq, q.bs, &bf, C, ty,
                                        lc, c.bs, nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
    }
    ku_cublas_release(dev);
    return ku_cublas_check(op, call, s);
}
