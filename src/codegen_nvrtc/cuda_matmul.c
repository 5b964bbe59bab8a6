/*
 * cuda_matmul.c — the eager CUDA kernels of matmul, mm, bmm, addmm and
 * linear (signature ke_kernel_fn): the rows' infer functions have checked
 * shapes and dtypes and the dispatcher has made out (contiguous, on the
 * operands' device); ke_mm_plan_build (linalg.c) turns the operands into
 * GEMMs exactly as the CPU kernel does (1-D operands, broadcast batch dims),
 * and each GEMM goes to cuBLAS through ku_gemm with the operands' own
 * strides: transposed views cost no copy. Only an operand with no unit
 * stride is made contiguous first (kl_contiguous, on its device).
 *
 * Registered for KE_KEY_CUDA by the composition root (src/init.c).
 */
#include "cuda_api.h"

#include "core.h"
#include "kernels_nn.h"

/* out = alpha * a @ b + beta * out on device dev, all of out's dtype. */
static int mm_exec(const char *op, int dev, kl_tensor *a, kl_tensor *b, kl_tensor *out, double alpha, double beta,
                   int copied) {
    ke_mm_plan p;
    ke_mm_plan_build(&p, a, b, out, alpha, beta);
    if (p.nbatch == 0 || p.M == 0 || p.N == 0) return 0;
    int ca = !ku_gemm_operand_ok(p.M, p.K, p.A.rs, p.A.cs), cb = !ku_gemm_operand_ok(p.K, p.N, p.B.rs, p.B.cs);
    if ((ca || cb) && !copied) {
        kl_scope_begin();
        kl_tensor *a2 = ca ? kl_contiguous(a) : a, *b2 = cb ? kl_contiguous(b) : b;
        int rc = (a2 && b2) ? mm_exec(op, dev, a2, b2, out, alpha, beta, 1) : -1;
        kl_scope_end();
        return rc;
    }
    ke_mm_plan_fold(&p);
    /* The innermost batch dim is one strided-batched call (a stride of 0
     * repeats a broadcast matrix); outer batch dims loop. */
    int64_t inner = p.nb ? p.bshape[p.nb - 1] : 1, outer = p.nbatch / inner;
    int64_t es = (int64_t)ke_dtypes[p.dt].size, mn = p.M * p.N;
    CUstream s = ku_current_stream(dev);
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, oa = 0, ob = 0;
        for (int d = p.nb - 2; d >= 0; d--) {
            int64_t i = rem % p.bshape[d];
            rem /= p.bshape[d];
            oa += i * p.A.bst[d];
            ob += i * p.B.bst[d];
        }
        ku_matrix A = {(CUdeviceptr)(uintptr_t)(p.A.p + oa * es), p.A.rs, p.A.cs, p.nb ? p.A.bst[p.nb - 1] : 0};
        ku_matrix B = {(CUdeviceptr)(uintptr_t)(p.B.p + ob * es), p.B.rs, p.B.cs, p.nb ? p.B.bst[p.nb - 1] : 0};
        ku_matrix C = {(CUdeviceptr)(uintptr_t)(p.C + o * inner * mn * es), p.N, 1, mn};
        if (ku_gemm(op, dev, p.dt, inner, p.M, p.N, p.K, alpha, A, B, beta, C, s)) return -1;
    }
    return 0;
}

/* out = alpha * a @ b + beta * bias (bias broadcast into out first; not
 * read when NULL or beta == 0). f16/bf16 stay as stored: cuBLAS multiplies
 * them with f32 accumulation. */
static int mm_run(ke_call *c, kl_tensor *a, kl_tensor *b, kl_tensor *bias, double alpha, double beta) {
    const char *op = ke_opname(c);
    kl_tensor *out = c->out[0];
    if (ke_numel(out->ndim, out->shape) == 0) return 0;
    kl_dtype dt = (kl_dtype)out->dtype;
    if (dt != KL_F32 && dt != KL_F64 && dt != KL_F16 && dt != KL_BF16)
        return ke_err(KL_ERR_DTYPE, op, "on CUDA takes floating tensors (cuBLAS has no %s GEMM)", ke_dtypes[dt].name);
    kl_device dev = kl_device_of(out);
    if (dev.type != KL_CUDA) return ke_err(KL_ERR_DEVICE, op, "CUDA kernel called for a %s tensor", ke_device_name(dev));
    if (bias && beta != 0) {
        if (!kl_copy_inplace(out, bias)) return -1;
    } else {
        beta = 0;
    }
    return mm_exec(op, dev.index, a, b, out, alpha, beta, 0);
}

int ku_cuda_matmul(ke_call *c) { return mm_run(c, c->in[0], c->in[1], NULL, 1, 0); }

int ku_cuda_addmm(ke_call *c) {
    return mm_run(c, c->in[1], c->in[2], c->in[0], ke_attr_addmm_alpha(&c->a), ke_attr_addmm_beta(&c->a));
}

int ku_cuda_linear(ke_call *c) {
    kl_scope_begin();
    kl_tensor *wt = kl_t(c->in[1]); /* a view: cuBLAS reads it transposed */
    int rc = wt ? mm_run(c, c->in[0], wt, ke_attr_linear_has_bias(&c->a) ? c->in[2] : NULL, 1, 1) : -1;
    kl_scope_end();
    return rc;
}
