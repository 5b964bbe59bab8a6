/*
 * linalg.c — matrix products (rows in ops_linalg.def): PyTorch's matmul shape
 * rules, one batched-GEMM executor, and ke_gemm, the single-matrix product
 * that conv2d shares.
 *
 * Strided operands go to OpenBLAS as they are whenever one orientation fits
 * (row-major with NoTrans, or column-major passed as the transpose with
 * CblasTrans); only an operand that fits neither is copied. A batch whose
 * matrices are small runs its GEMMs in parallel on Kiln's pool (OpenBLAS then
 * runs each one single-threaded); a batch of large ones runs them one after
 * the other and lets OpenBLAS spread each over the cores. Integers use a
 * blocked loop in unsigned arithmetic (wraps as PyTorch's does); f16/bf16
 * compute through f32 copies.
 */
#include "optable.h"
#include "kernels_nn.h"
#include "threadpool.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- BLAS layouts ----------------------------------------------------------- */

/* How a rows x cols matrix with strides (rs, cs) can be handed to BLAS:
 * row-major (trans 0, ld = rs) or as the transpose of a row-major matrix
 * (trans 1, ld = cs). Size-1 dims take any stride. -1 if neither fits. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans, int64_t *ld) {
    int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= c1)) {
        *trans = 0;
        *ld = rows <= 1 ? c1 : rs;
    } else if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= r1)) {
        *trans = 1;
        *ld = cols <= 1 ? r1 : cs;
    } else {
        return -1;
    }
    return *ld <= INT_MAX ? 0 : -1;
}

/* A vector of n elements with stride s as a BLAS increment (0: does not fit). */
static int64_t blas_inc(int64_t n, int64_t s) {
    if (n <= 1) return 1;
    return (s != 0 && s <= INT_MAX && s >= -INT_MAX) ? s : 0;
}

/* Whether A (M x K) / B (K x N) fit the BLAS call ke_gemm makes for this
 * shape: dot (M = N = 1), gemv (M or N = 1) or gemm. */
static int a_fits(int64_t M, int64_t N, int64_t K, int64_t ars, int64_t acs) {
    int t;
    int64_t ld;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return 0;
    if (M == 1) return blas_inc(K, acs) != 0;
    return blas_layout(M, K, ars, acs, &t, &ld) == 0;
}
static int b_fits(int64_t M, int64_t N, int64_t K, int64_t brs, int64_t bcs) {
    int t;
    int64_t ld;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX) return 0;
    if (N == 1) return blas_inc(K, brs) != 0;
    return blas_layout(K, N, brs, bcs, &t, &ld) == 0;
}

void ke_blas_prepare(void) {
    static _Atomic int blas_threads;
    if (ke_in_parallel_region()) return;
    int n = ke_thread_is_serial() ? 1 : kl_get_num_threads();
    if (atomic_exchange_explicit(&blas_threads, n, memory_order_relaxed) != n) openblas_set_num_threads(n);
    ke_pool_quiesce();
}

/* What runs the matmuls: OpenBLAS as the environment left it (its own
 * kernel choice unless OPENBLAS_CORETYPE forces one), which is why a
 * benchmark header should show it. */
const char *kl_config_string(void) {
    static _Thread_local char buf[512];
    const char *core = openblas_get_corename(), *cfg = openblas_get_config(), *forced = getenv("OPENBLAS_CORETYPE");
    snprintf(buf, sizeof buf, "Kiln %s, %d threads; OpenBLAS core %s (%s%s), %d threads; %s", kl_version(),
             kl_get_num_threads(), core ? core : "unknown", forced ? "OPENBLAS_CORETYPE=" : "chosen by OpenBLAS",
             forced ? forced : "", openblas_get_num_threads(), cfg ? cfg : "OpenBLAS config unknown");
    return buf;
}

/* blas_f32, blas_f64: one BLAS call per matrix triple (tmpl/blas_gemm.h) */
#define LB_T float
#define LB_SFX f32
#define LB_DOT cblas_sdot
#define LB_GEMV cblas_sgemv
#define LB_GEMM cblas_sgemm
#include "tmpl/blas_gemm.h"
#define LB_T double
#define LB_SFX f64
#define LB_DOT cblas_ddot
#define LB_GEMV cblas_dgemv
#define LB_GEMM cblas_dgemm
#include "tmpl/blas_gemm.h"

/* ---- the loop kernel (integers; floats whose strides BLAS cannot take) -------
 * C = beta*C, then C += (alpha*A[i,k]) * B[k, j-block] over k-blocks, so a
 * block of B stays in cache across the rows. MUL/ADD wrap for integers. */
typedef struct gemm_loop_args {
    int64_t M, N, K, ars, acs, brs, bcs, ldc;
    const void *A, *B;
    void *C;
    double alpha, beta;
} gemm_loop_args;

/* A double alpha/beta as an integer, as PyTorch casts scalars for integer
 * tensors (truncation; NaN and out-of-range values saturate instead of UB). */
static int64_t scalar_to_i64(double v) {
    if (!(v == v)) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

/* loop_*: the plain GEMM loop (tmpl/gemm_loop.h) */
#define KE_CAST_F(v) (v)
#define LG_T float
#define LG_U float
#define LG_SFX f32
#define LG_CAST KE_CAST_F
#include "tmpl/gemm_loop.h"
#define LG_T double
#define LG_U double
#define LG_SFX f64
#define LG_CAST KE_CAST_F
#include "tmpl/gemm_loop.h"
#define LG_T int32_t
#define LG_U uint32_t
#define LG_SFX i32
#define LG_CAST scalar_to_i64
#include "tmpl/gemm_loop.h"
#define LG_T int64_t
#define LG_U uint64_t
#define LG_SFX i64
#define LG_CAST scalar_to_i64
#include "tmpl/gemm_loop.h"
#define LG_T uint8_t
#define LG_U uint32_t
#define LG_SFX u8
#define LG_CAST scalar_to_i64
#include "tmpl/gemm_loop.h"

static const ke_range_fn gemm_loops[KL_NUM_DTYPES] = {
    [KL_F32] = loop_f32, [KL_F64] = loop_f64, [KL_I32] = loop_i32, [KL_I64] = loop_i64, [KL_U8] = loop_u8,
};

void ke_gemm(kl_dtype dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A, int64_t ars,
             int64_t acs, const void *B, int64_t brs, int64_t bcs, double beta, void *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    KE_ASSERT(gemm_loops[dt] != NULL);
    if (K > 0 && dt == KL_F32 &&
        blas_f32(M, N, K, (float)alpha, A, ars, acs, B, brs, bcs, (float)beta, C, ldc) == 0)
        return;
    if (K > 0 && dt == KL_F64 && blas_f64(M, N, K, alpha, A, ars, acs, B, brs, bcs, beta, C, ldc) == 0) return;
    gemm_loop_args g = {M, N, K, ars, acs, brs, bcs, ldc, A, B, C, alpha, beta};
    int64_t per_row = (N > 0 ? N : 1) * (K > 0 ? K : 1);
    ke_parallel_for(M, per_row >= 32768 ? 1 : 32768 / per_row, gemm_loops[dt], &g);
}

/* ---- shape rules -------------------------------------------------------------------- */

/* Matrix products do not promote: every operand must have a's dtype. */
static int check_dtypes(ke_call *c) {
    kl_dtype d = (kl_dtype)c->in[0]->dtype;
    char b1[256], b2[256];
    for (int i = 1; i < c->nin; i++)
        if (c->in[i]->dtype != d)
            return ke_err(KL_ERR_DTYPE, ke_opname(c),
                          "expected operands of one dtype, got %s (argument 1) and %s (argument %d)",
                          ke_fmt_tensor(b1, sizeof b1, c->in[0]), ke_fmt_tensor(b2, sizeof b2, c->in[i]), i + 1);
    if (d == KL_BOOL)
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for bool operands (%s)",
                      ke_fmt_tensor(b1, sizeof b1, c->in[0]));
    c->compute = ke_compute_dtype(d);
    return 0;
}

/* Output shape of a @ b under torch.matmul's rules: 1-D operands gain and
 * lose a dim, batch dims broadcast. mm and bmm restrict the ranks. */
static int matmul_shape(const char *op, int opid, const kl_tensor *a, const kl_tensor *b, int *ndim, int64_t *shape) {
    char b1[200], b2[200];
    ke_fmt_shape(b1, sizeof b1, a->ndim, a->shape);
    ke_fmt_shape(b2, sizeof b2, b->ndim, b->shape);
    if (opid == KE_OP_mm && (a->ndim != 2 || b->ndim != 2))
        return ke_err(KL_ERR_SHAPE, op, "expects 2-D tensors, got shapes %s and %s", b1, b2);
    if (opid == KE_OP_bmm && (a->ndim != 3 || b->ndim != 3))
        return ke_err(KL_ERR_SHAPE, op, "expects 3-D tensors, got shapes %s and %s", b1, b2);
    if (a->ndim == 0 || b->ndim == 0)
        return ke_err(KL_ERR_SHAPE, op, "both arguments need at least 1 dim, got shapes %s and %s", b1, b2);
    int64_t K = a->shape[a->ndim - 1], Kb = b->shape[b->ndim == 1 ? 0 : b->ndim - 2];
    if (K != Kb)
        return ke_err(KL_ERR_SHAPE, op, "shapes %s and %s cannot be multiplied (%lld != %lld)", b1, b2, (long long)K,
                      (long long)Kb);
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
    int nd = na > nb ? na : nb;
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - na), db = d - (nd - nb);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && (opid == KE_OP_bmm || (sa != 1 && sb != 1)))
            return ke_err(KL_ERR_SHAPE, op, "batch dims of shapes %s and %s %s", b1, b2,
                          opid == KE_OP_bmm ? "differ" : "cannot broadcast");
        shape[d] = sa == 1 ? sb : sa;
    }
    if (a->ndim >= 2) shape[nd++] = a->shape[a->ndim - 2];
    if (b->ndim >= 2) shape[nd++] = b->shape[b->ndim - 1];
    *ndim = nd;
    return 0;
}

int ke_infer_matmul(ke_call *c, ke_outspec *out) {
    if (check_dtypes(c) ||
        matmul_shape(ke_opname(c), c->op, c->in[0], c->in[1], &out->ndim, out->shape))
        return -1;
    out->dtype = (kl_dtype)c->in[0]->dtype;
    return 1;
}

/* A bias must broadcast to the product's shape (it is never the larger one). */
static int check_bias(ke_call *c, const kl_tensor *bias, const ke_outspec *out) {
    int bad = bias->ndim > out->ndim;
    for (int d = 0; d < bias->ndim && !bad; d++) {
        int64_t s = bias->shape[bias->ndim - 1 - d], o = out->shape[out->ndim - 1 - d];
        bad = s != o && s != 1;
    }
    if (!bad) return 0;
    char b1[256], b2[200];
    return ke_err(KL_ERR_SHAPE, ke_opname(c), "bias %s does not broadcast to the product's shape %s",
                  ke_fmt_tensor(b1, sizeof b1, bias), ke_fmt_shape(b2, sizeof b2, out->ndim, out->shape));
}

/* addmm(bias, a, b): a and b are matrices. */
int ke_infer_addmm(ke_call *c, ke_outspec *out) {
    if (check_dtypes(c) || matmul_shape(ke_opname(c), KE_OP_mm, c->in[1], c->in[2], &out->ndim, out->shape) ||
        check_bias(c, c->in[0], out))
        return -1;
    out->dtype = (kl_dtype)c->in[0]->dtype;
    return 1;
}

/* linear(x, w[, bias]) = x @ w^T (+ bias); w is [out, in] (or [in]). */
int ke_infer_linear(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0], *w = c->in[1];
    char b1[256];
    if (c->nin != 2 + ke_attr_linear_has_bias(&c->a))
        return ke_err(KL_ERR_ARG, ke_opname(c), "bias flag and the %d inputs disagree", c->nin);
    if (check_dtypes(c)) return -1;
    if (w->ndim != 1 && w->ndim != 2)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "weight must have 1 or 2 dims, got %s",
                      ke_fmt_tensor(b1, sizeof b1, w));
    if (x->ndim == 0)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "input must have at least 1 dim, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    int64_t in = x->shape[x->ndim - 1], win = w->shape[w->ndim - 1];
    if (in != win) {
        char b2[200];
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "input %s and weight %s cannot be multiplied (%lld != %lld)",
                      ke_fmt_shape(b1, sizeof b1, x->ndim, x->shape), ke_fmt_shape(b2, sizeof b2, w->ndim, w->shape),
                      (long long)in, (long long)win);
    }
    out->ndim = 0;
    for (int d = 0; d < x->ndim - 1; d++) out->shape[out->ndim++] = x->shape[d];
    if (w->ndim == 2) out->shape[out->ndim++] = w->shape[0];
    out->dtype = (kl_dtype)x->dtype;
    if (ke_attr_linear_has_bias(&c->a) && check_bias(c, c->in[2], out)) return -1;
    return 1;
}

/* ---- the batched executor --------------------------------------------------------- */

void ke_mm_plan_build(ke_mm_plan *p, const kl_tensor *a, const kl_tensor *b, const kl_tensor *out, double alpha,
                       double beta) {
    memset(p, 0, sizeof *p);
    p->dt = (kl_dtype)out->dtype;
    p->alpha = alpha;
    p->beta = beta;
    p->C = ke_data(out);
    p->A.p = ke_data(a);
    p->B.p = ke_data(b);
    if (a->ndim == 1) {
        p->M = 1, p->K = a->shape[0], p->A.cs = a->stride[0];
    } else {
        p->M = a->shape[a->ndim - 2], p->K = a->shape[a->ndim - 1];
        p->A.rs = a->stride[a->ndim - 2], p->A.cs = a->stride[a->ndim - 1];
    }
    if (b->ndim == 1) {
        p->N = 1, p->B.rs = b->stride[0];
    } else {
        p->N = b->shape[b->ndim - 1];
        p->B.rs = b->stride[b->ndim - 2], p->B.cs = b->stride[b->ndim - 1];
    }
    p->nb = out->ndim - (a->ndim >= 2) - (b->ndim >= 2);
    p->nbatch = 1;
    for (int d = 0; d < p->nb; d++) {
        p->bshape[d] = out->shape[d];
        p->nbatch *= out->shape[d];
        int da = d - (p->nb - (a->ndim - 2)), db = d - (p->nb - (b->ndim - 2));
        p->A.bst[d] = (a->ndim > 2 && da >= 0 && a->shape[da] != 1) ? a->stride[da] : 0;
        p->B.bst[d] = (b->ndim > 2 && db >= 0 && b->shape[db] != 1) ? b->stride[db] : 0;
    }
}

/* When B is the same matrix for every batch, A's batch dims fold into its
 * rows if their strides line up: one large GEMM instead of many (x @ W with
 * x [B, T, in] is one [B*T, in] product). */
void ke_mm_plan_fold(ke_mm_plan *p) {
    if (p->nb == 0 || p->nbatch <= 1 || p->M * p->nbatch > INT_MAX) return;
    for (int d = 0; d < p->nb; d++)
        if (p->B.bst[d] != 0) return;
    if (!(p->A.cs == 1 || p->K == 1)) return;
    int64_t size = p->M, stride = p->A.rs;
    for (int d = p->nb - 1; d >= 0; d--) {
        int64_t s = p->bshape[d], st = p->A.bst[d];
        if (s == 1) continue;
        if (size == 1) {
            size = s, stride = st;
            continue;
        }
        if (st != stride * size) return;
        size *= s;
    }
    ke_mm_plan q = *p;
    q.M = size, q.A.rs = stride, q.nb = 0, q.nbatch = 1;
    if (ke_is_float(p->dt)) { /* f16/bf16 come from the CUDA kernel (cuBLAS takes them as stored) */
        if (!a_fits(q.M, q.N, q.K, q.A.rs, q.A.cs)) return;
    }
    *p = q;
}

static void mm_range(void *ctx, int64_t b0, int64_t b1) {
    const ke_mm_plan *p = ctx;
    int64_t es = (int64_t)ke_dtypes[p->dt].size;
    for (int64_t b = b0; b < b1; b++) {
        int64_t rem = b, oa = 0, ob = 0;
        for (int d = p->nb - 1; d >= 0; d--) {
            int64_t i = rem % p->bshape[d];
            rem /= p->bshape[d];
            oa += i * p->A.bst[d];
            ob += i * p->B.bst[d];
        }
        ke_gemm(p->dt, p->M, p->N, p->K, p->alpha, p->A.p + oa * es, p->A.rs, p->A.cs, p->B.p + ob * es, p->B.rs,
                p->B.cs, p->beta, p->C + b * p->M * p->N * es, p->N);
    }
}

/* out = alpha * a @ b + beta * out, all of one compute dtype. An operand
 * BLAS cannot take in either orientation is copied to contiguous first. */
static int mm_exec(kl_tensor *a, kl_tensor *b, kl_tensor *out, double alpha, double beta, int copied) {
    ke_mm_plan p;
    ke_mm_plan_build(&p, a, b, out, alpha, beta);
    if (p.nbatch == 0 || p.M == 0 || p.N == 0) return 0;
    int is_float = p.dt == KL_F32 || p.dt == KL_F64;
    if (is_float && !copied) {
        int ca = !a_fits(p.M, p.N, p.K, p.A.rs, p.A.cs), cb = !b_fits(p.M, p.N, p.K, p.B.rs, p.B.cs);
        if (ca || cb) {
            kl_scope_begin();
            kl_tensor *a2 = ca ? kl_contiguous(a) : a, *b2 = cb ? kl_contiguous(b) : b;
            int rc = (a2 && b2) ? mm_exec(a2, b2, out, alpha, beta, 1) : -1;
            kl_scope_end();
            return rc;
        }
    }
    ke_mm_plan_fold(&p);
    double work = (double)p.M * (double)p.N * (double)(p.K > 0 ? p.K : 1);
    if (p.nbatch > 1 && work < KE_GEMM_SMALL) {
        ke_parallel_for(p.nbatch, (int64_t)(KE_GEMM_SMALL / work), mm_range, &p);
    } else {
        if (is_float) ke_blas_prepare();
        mm_range(&p, 0, p.nbatch);
    }
    return 0;
}

/* out = alpha * a @ b + beta * bias (bias broadcast; not read when NULL or
 * beta == 0). Half types run through f32 temporaries. */
static int mm_run(ke_call *c, kl_tensor *a, kl_tensor *b, kl_tensor *bias, double alpha, double beta) {
    kl_tensor *out = c->out[0];
    int64_t n = ke_numel(out->ndim, out->shape);
    if (n == 0) return 0;
    if ((kl_dtype)out->dtype != c->compute) {
        kl_scope_begin();
        kl_tensor *a32 = kl_to_dtype(a, c->compute), *b32 = kl_to_dtype(b, c->compute);
        kl_tensor *bias32 = bias ? kl_to_dtype(bias, c->compute) : NULL;
        kl_tensor *o32 = kl_empty_on(out->ndim, out->shape, c->compute, KL_DEVICE_CPU);
        int rc = -1;
        if (a32 && b32 && o32 && (!bias || bias32)) {
            ke_call k = *c;
            k.out[0] = o32;
            rc = mm_run(&k, a32, b32, bias32, alpha, beta);
        }
        if (!rc) ke_convert(ke_data(out), (kl_dtype)out->dtype, ke_data(o32), c->compute, n);
        kl_scope_end();
        return rc;
    }
    if (bias && beta != 0) {
        kl_tensor *in[1] = {bias};
        ke_call k = {.op = c->op, .nin = 1, .in = in};
        k.out[0] = out;
        if (ke_ew_run(&k, &ke_ew_identity, c->compute)) return -1;
    } else {
        beta = 0;
    }
    return mm_exec(a, b, out, alpha, beta, 0);
}

int ke_cpu_matmul(ke_call *c) { return mm_run(c, c->in[0], c->in[1], NULL, 1, 0); }

int ke_cpu_addmm(ke_call *c) {
    return mm_run(c, c->in[1], c->in[2], c->in[0], ke_attr_addmm_alpha(&c->a), ke_attr_addmm_beta(&c->a));
}

int ke_cpu_linear(ke_call *c) {
    kl_scope_begin();
    kl_tensor *wt = kl_t(c->in[1]);
    int rc = wt ? mm_run(c, c->in[0], wt, ke_attr_linear_has_bias(&c->a) ? c->in[2] : NULL, 1, 1) : -1;
    kl_scope_end();
    return rc;
}

int ke_decomp_linear(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_linear(c, &spec) < 0) return -1;
    kl_scope_begin();
    kl_tensor *y = kl_matmul(c->in[0], kl_t(c->in[1]));
    if (ke_attr_linear_has_bias(&c->a)) y = kl_add(y, c->in[2]);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* ---- public wrappers ------------------------------------------------------------------- */

kl_tensor *kl_matmul(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_matmul, a, b, 0); }
kl_tensor *kl_mm(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_mm, a, b, 0); }
kl_tensor *kl_bmm(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_bmm, a, b, 0); }

kl_tensor *kl_addmm(kl_tensor *bias, kl_tensor *a, kl_tensor *b, double beta, double alpha) {
    kl_tensor *in[3] = {bias, a, b};
    ke_call c = {.op = KE_OP_addmm, .nin = 3, .in = in};
    ke_attr_set_addmm_beta(&c.a, beta);
    ke_attr_set_addmm_alpha(&c.a, alpha);
    return ke_call1(&c);
}

kl_tensor *kl_linear(kl_tensor *x, kl_tensor *w, kl_tensor *bias) {
    kl_tensor *in[3] = {x, w, bias};
    ke_call c = {.op = KE_OP_linear, .nin = bias ? 3 : 2, .in = in};
    ke_attr_set_linear_has_bias(&c.a, bias != NULL);
    return ke_call1(&c);
}
