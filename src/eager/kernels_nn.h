/* kernels_nn.h — the small GEMM interface and row helpers that linalg.c,
 * nn.c, loss.c and conv.c share (what the rows of ops_linalg.def and
 * ops_nn.def name is declared by optable.h). */
#ifndef KE_KERNELS_NN_H
#define KE_KERNELS_NN_H
#include "optable.h"

/* ---- GEMM shared by matmul, linear and conv2d (linalg.c) ------------------
 * C[M,N] = alpha * A[M,K] @ B[K,N] + beta * C for one matrix triple, each
 * operand given by row and column strides in elements (C by ldc, columns
 * contiguous). f32/f64 go to OpenBLAS when the strides allow it (either
 * orientation), else a plain loop; integers use a blocked loop that wraps
 * like PyTorch. beta == 0 never reads C. Half types are not accepted here:
 * callers convert to f32. Safe to call from ke_parallel_for workers. */
void ke_gemm(kl_dtype dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A, int64_t ars,
             int64_t acs, const void *B, int64_t brs, int64_t bcs, double beta, void *C, int64_t ldc);
/* Call once before a top-level (not batch-parallel) run of ke_gemm calls:
 * parks Kiln's spinning helpers and gives OpenBLAS Kiln's thread count. */
void ke_blas_prepare(void);
/* Below this M*N*K OpenBLAS runs a GEMM on one thread, so callers spread
 * independent GEMMs over Kiln's pool instead. */
#define KE_GEMM_SMALL 262144

/* ---- matmul as GEMMs over batches (linalg.c) --------------------------------
 * What the CPU kernel and the CUDA kernel (src/codegen_nvrtc/cuda_matmul.c)
 * share, so matmul's shape rules (1-D operands, broadcast batch dims) are
 * written once: the rows' infer functions check shapes, then
 * ke_mm_plan_build turns (a, b, out) into M, N, K, each operand's row and
 * column strides and its stride over every batch dim of out (0: broadcast).
 * Data pointers are ke_data()'s: host or device addresses alike. */
typedef struct ke_mm_mat {
    const char *p;               /* element [0, ..., 0] */
    int64_t rs, cs;              /* row and column strides of each matrix */
    int64_t bst[KL_MAX_DIMS];    /* strides over the output's batch dims (0: broadcast) */
} ke_mm_mat;

typedef struct ke_mm_plan {
    kl_dtype dt;
    int nb;                      /* batch dims */
    int64_t bshape[KL_MAX_DIMS], nbatch;
    int64_t M, N, K;
    ke_mm_mat A, B;
    char *C;                     /* contiguous [batch..., M, N] */
    double alpha, beta;
} ke_mm_plan;

void ke_mm_plan_build(ke_mm_plan *p, const kl_tensor *a, const kl_tensor *b, const kl_tensor *out, double alpha,
                      double beta);
/* When B is one matrix for every batch and A's batch dims line up with its
 * rows, folds them into M: one large GEMM instead of many. */
void ke_mm_plan_fold(ke_mm_plan *p);

/* Row helpers from nn.c, shared with loss.c: log(sum(exp(x))) computed
 * stably, the plain sum and the max of n contiguous values, each by the row
 * fold (row_fold.h: the sum and max bitwise kl_sum's and kl_amax's). `next`
 * (n values, or NULL) is prefetched meanwhile: the row a caller does next. */
float ke_row_logsumexp_f32(const float *x, int64_t n, const float *next);
double ke_row_logsumexp_f64(const double *x, int64_t n, const double *next);
double ke_row_sum_f32(const float *x, int64_t n);
double ke_row_sum_f64(const double *x, int64_t n);
float ke_row_max_f32(const float *x, int64_t n);
double ke_row_max_f64(const double *x, int64_t n);

/* batch_norm's helpers (nn.c), shared with its derivative's op
 * (nn_backward.c): the dims a channel's statistics cover for x [N, C, ...]
 * (the batch dim and every spatial dim; returns their count), and a [C]
 * tensor reshaped to [C, 1, ...] to broadcast against x. */
int ke_bn_dims(const kl_tensor *x, int64_t *dims);
kl_tensor *ke_per_channel(const kl_tensor *x, kl_tensor *t);

/* 1 if max pooling's windows (kernel, stride, padding, dilation; input H x
 * W, output OH x OW) are the disjoint 2x2 blocks of the input, all inside it:
 * max_pool2d and its backward (conv.c, nn_backward.c) then take their
 * vectorized paths. */
int ke_pool_2x2(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                int64_t H, int64_t W, int64_t OH, int64_t OW);
/* Those windows on `planes` contiguous f32 planes (x: H x W each, y and g:
 * OH x OW, gx: H x W), in explicit vectors (pool2x2.c): max_pool2d's values
 * and max_pool2d_backward's gradient, bit for bit those of the general loops. */
void ke_maxpool2x2_f32(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW);
void ke_maxpool2x2_backward_f32(const float *x, const float *g, float *gx, int64_t planes, int64_t H, int64_t W,
                                int64_t OH, int64_t OW);

/* Runs fn(c, xs, y) with xs = the inputs as contiguous tensors of the compute
 * dtype and y = an output of that dtype: out[0] itself, or an f32 temporary
 * copied into out[0] afterwards (f16/bf16). Shared by nn.c and conv.c. */
typedef int (*ke_compute_fn)(ke_call *c, kl_tensor *const *xs, kl_tensor *y);
int ke_with_compute_dtype(ke_call *c, ke_compute_fn fn);
/* The same for every output of c (ys[0..c->nout)): the kernels with several
 * outputs (batch_norm_stats, batch_norm_backward, layer_norm_backward). */
typedef int (*ke_compute_outs_fn)(ke_call *c, kl_tensor *const *xs, kl_tensor *const *ys);
int ke_with_compute_dtype_outs(ke_call *c, ke_compute_outs_fn fn);
/* The same, but an input already of the compute dtype keeps its strides (the
 * kernel reads views: causal_attention's). */
int ke_with_compute_dtype_views(ke_call *c, ke_compute_outs_fn fn);

/* Scaled dot-product attention as kl_ ops (nn.c): sdpa's decomposition and
 * causal_attention's. ke_causal_attention_fits (attention.c): 1 if
 * kl_scaled_dot_product_attention(q, k, v, NULL, causal = true) can run as
 * the fused causal_attention op (CPU, one float dtype, equal batch dims). */
kl_tensor *ke_sdpa_formula(kl_tensor *q, kl_tensor *k, kl_tensor *v, kl_tensor *mask, bool causal, double scale);
int ke_causal_attention_fits(const kl_tensor *q, const kl_tensor *k, const kl_tensor *v);

#endif
