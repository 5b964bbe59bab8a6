/*
 * nn.c — softmax / log_softmax, layer_norm / rms_norm, dropout and scaled
 * dot-product attention (rows in ops_nn.def).
 *
 * softmax and the norms are composites: their decompositions (written with
 * kl_ ops) define them for autograd and tracing, and their fused CPU kernels
 * make one pass per row while the row sits in cache (max, then the sum of
 * exponentials, then the write; mean and variance, then the normalization),
 * so memory sees one read and one write. Rows are split over the thread
 * pool. A row's max and sums are the row fold of row_fold.h (tmpl/nn_rows.h):
 * lanes of the compute type, so the loops vectorize without -ffast-math, in
 * chunks joined by a cascade, so f32 rounding only ever applies to 32 terms
 * per lane; the same fold, bitwise, as kl_amax / kl_sum and compiled kernels.
 * f16/bf16 compute through f32 temporaries; f64 uses libm.
 */
#include "kernels_nn.h"
#include "philox.h"
#include "rd_formulas.h"
#include "row_fold.h"
#include "threadpool.h"
#include "vmath.h"

#include <math.h>

/* A block of the writing passes: the row fold's lanes (256 bytes). */
#define KE_LANES(T) KE_FOLD_LANES(T)
#define KE_ROW_GRAIN 32768     /* elements per parallel chunk, at least */
#define KE_COL_BLOCK 64        /* columns a non-last-dim softmax handles at once */


/* Prefetches 256 bytes (one block of lanes) of the next row's input and
 * output (either may be NULL) while this row is worked on: a row of a few
 * KB is about a page, and the hardware prefetcher stops at page boundaries,
 * so without this every row would start with misses that no compute
 * overlaps. Called once per block of a compute loop, so the fill buffers
 * never overflow. Always inlined: GCC splits an out-of-line copy off, finds
 * it free of side effects and deletes the calls. */
__attribute__((always_inline)) static inline void prefetch_block(const void *nx, const void *ny, int64_t off) {
    for (int b = 0; b < 256; b += 64) {
        if (nx) __builtin_prefetch((const char *)nx + off + b, 0, 3);
        if (ny) __builtin_prefetch((const char *)ny + off + b, 1, 3);
    }
}

static int64_t grain_for(int64_t per_item) {
    return per_item >= KE_ROW_GRAIN ? 1 : KE_ROW_GRAIN / (per_item ? per_item : 1);
}

/* ---- row primitives, one definition per compute type ----------------------------- */

/* row_max_*, row_sumexp_*, row_sum_*, ke_row_logsumexp_*, ke_row_sum_*, ke_row_max_* */
#define NR_T float
#define NR_SFX f32
#define NR_EXP ke_vexpf
#define NR_LOG ke_vlogf
#include "tmpl/nn_rows.h"
#define NR_T double
#define NR_SFX f64
#define NR_EXP exp
#define NR_LOG log
#include "tmpl/nn_rows.h"

/* ---- softmax / log_softmax ------------------------------------------------------------ */

int ke_infer_softmax(ke_call *c, ke_outspec *out) {
    if (ke_infer_same(c, out) < 0) return -1;
    return ke_wrap_dim(ke_opname(c), ke_attr_softmax_dim(&c->a), c->in[0]->ndim) < 0 ? -1 : 1;
}

typedef struct softmax_ctx {
    const char *x;
    char *y;
    int64_t n, inner, ncb;   /* reduced length, elements after the dim, column blocks */
    int log_;
} softmax_ctx;

/* softmax_row_*, softmax_cols_*, softmax_range_* */
#define SM_T float
#define SM_SFX f32
#define SM_EXP ke_vexpf
#define SM_LOG ke_vlogf
#include "tmpl/softmax_rows.h"
#define SM_T double
#define SM_SFX f64
#define SM_EXP exp
#define SM_LOG log
#include "tmpl/softmax_rows.h"

/* The inputs in the compute dtype ct (in the caller's scope), contiguous
 * unless `views` (kernels that take strides keep an input of dtype ct as it
 * is); 1 if made. */
static int compute_inputs(ke_call *c, kl_dtype ct, kl_tensor **xs, int views) {
    KE_ASSERT(c->nin <= 8);
    for (int i = 0; i < c->nin; i++) {
        xs[i] = views && c->in[i]->dtype == ct ? c->in[i] : kl_to_dtype(c->in[i], ct);
        if (!views && xs[i]) xs[i] = kl_contiguous(xs[i]);
        if (!xs[i]) return 0;
    }
    return 1;
}

/* out itself when it is of dtype ct, else a ct scratch tensor that
 * compute_result converts into out after the kernel. */
static kl_tensor *compute_output(kl_tensor *out, kl_dtype ct) {
    return out->dtype == ct ? out : kl_empty_on(out->ndim, out->shape, ct, KL_DEVICE_CPU);
}

static void compute_result(kl_tensor *out, kl_tensor *y, kl_dtype ct) {
    if (y != out) ke_convert(ke_data(out), (kl_dtype)out->dtype, ke_data(y), ct, ke_numel(out->ndim, out->shape));
}

/* (declared in kernels_nn.h) */
int ke_with_compute_dtype(ke_call *c, ke_compute_fn fn) {
    kl_tensor *out = c->out[0];
    if (ke_numel(out->ndim, out->shape) == 0) return 0;
    kl_dtype ct = c->compute;
    kl_scope_begin();
    kl_tensor *xs[8] = {0}, *y = NULL;
    int rc = compute_inputs(c, ct, xs, 0) && (y = compute_output(out, ct)) ? fn(c, xs, y) : -1;
    if (!rc) compute_result(out, y, ct);
    kl_scope_end();
    return rc;
}

static int with_compute_dtype_outs(ke_call *c, ke_compute_outs_fn fn, int views) {
    kl_dtype ct = c->compute;
    KE_ASSERT(c->nout <= KE_MAX_OUT);
    kl_scope_begin();
    kl_tensor *xs[8] = {0}, *ys[KE_MAX_OUT] = {0};
    int ok = compute_inputs(c, ct, xs, views);
    for (int o = 0; o < c->nout && ok; o++) ok = (ys[o] = compute_output(c->out[o], ct)) != NULL;
    int rc = ok ? fn(c, xs, ys) : -1;
    for (int o = 0; o < c->nout && !rc; o++) compute_result(c->out[o], ys[o], ct);
    kl_scope_end();
    return rc;
}

/* (both declared in kernels_nn.h) */
int ke_with_compute_dtype_outs(ke_call *c, ke_compute_outs_fn fn) { return with_compute_dtype_outs(c, fn, 0); }
int ke_with_compute_dtype_views(ke_call *c, ke_compute_outs_fn fn) { return with_compute_dtype_outs(c, fn, 1); }

static int softmax_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    const kl_tensor *x = xs[0];
    int d = ke_wrap_dim(ke_opname(c), ke_attr_softmax_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    softmax_ctx p = {ke_data(x), ke_data(y), x->ndim ? x->shape[d] : 1, 1, 1, c->op == KE_OP_log_softmax};
    int64_t outer = 1;
    for (int i = 0; i < d; i++) outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) p.inner *= x->shape[i];
    int64_t tasks = outer, per = p.n;
    if (p.inner > 1) {
        p.ncb = (p.inner + KE_COL_BLOCK - 1) / KE_COL_BLOCK;
        tasks = outer * p.ncb;
        per = p.n * KE_COL_BLOCK;
    }
    ke_parallel_for(tasks, grain_for(per), x->dtype == KL_F64 ? softmax_range_f64 : softmax_range_f32, &p);
    return 0;
}

int ke_cpu_softmax(ke_call *c) { return ke_with_compute_dtype(c, softmax_compute); }

/* softmax = exp(x - max) / sum(exp(x - max)); log_softmax = (x - max) - log(sum(...)). */
int ke_decomp_softmax(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_softmax(c, &spec) < 0) return -1;
    int64_t d = ke_attr_softmax_dim(&c->a);
    kl_tensor *x = c->in[0];
    kl_scope_begin();
    kl_tensor *z = kl_sub(x, kl_amax(x, 1, &d, true));
    kl_tensor *e = kl_exp(z), *s = kl_sum(e, 1, &d, true);
    kl_tensor *y = c->op == KE_OP_softmax ? kl_div(e, s) : kl_sub(z, kl_log(s));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_tensor *kl_softmax(kl_tensor *x, int dim) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_softmax, .nin = 1, .in = in};
    ke_attr_set_softmax_dim(&c.a, dim);
    return ke_call1(&c);
}

kl_tensor *kl_log_softmax(kl_tensor *x, int dim) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_log_softmax, .nin = 1, .in = in};
    ke_attr_set_softmax_dim(&c.a, dim);
    return ke_call1(&c);
}

/* ---- layer_norm / rms_norm --------------------------------------------------------------- */

/* rms_norm is read through layer_norm's accessors: it has the same
 * attributes in the same slots, less has_bias. */
_Static_assert(KE_ATTR_SAME_SLOT(layer_norm_normalized_ndim, rms_norm_normalized_ndim) &&
                   KE_ATTR_SAME_SLOT(layer_norm_has_weight, rms_norm_has_weight) &&
                   KE_ATTR_SAME_SLOT(layer_norm_eps, rms_norm_eps),
               "rms_norm's attributes are layer_norm's");
/* Inputs: x, then weight if has_weight, then bias if has_bias (layer_norm only). */
static kl_tensor *norm_weight(const ke_call *c, kl_tensor *const *in) {
    return ke_attr_layer_norm_has_weight(&c->a) ? in[1] : NULL;
}
static kl_tensor *norm_bias(const ke_call *c, kl_tensor *const *in) {
    return c->op == KE_OP_layer_norm && ke_attr_layer_norm_has_bias(&c->a)
               ? in[1 + ke_attr_layer_norm_has_weight(&c->a)]
               : NULL;
}

int ke_infer_norm(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    int has_b = c->op == KE_OP_layer_norm && ke_attr_layer_norm_has_bias(&c->a);
    if (c->nin != 1 + ke_attr_layer_norm_has_weight(&c->a) + has_b)
        return ke_err(KL_ERR_ARG, op, "weight/bias flags and the %d inputs disagree", c->nin);
    if (ke_infer_same(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0];
    int64_t nd = ke_attr_layer_norm_normalized_ndim(&c->a);
    char b1[256], b2[200];
    if (nd < 1 || nd > x->ndim)
        return ke_err(KL_ERR_ARG, op, "normalized_ndim %lld is out of range for input %s (1 to %d)", (long long)nd,
                      ke_fmt_tensor(b1, sizeof b1, x), x->ndim);
    const int64_t *nshape = x->shape + (x->ndim - nd);
    kl_tensor *params[2] = {norm_weight(c, c->in), norm_bias(c, c->in)};
    for (int i = 0; i < 2; i++) {
        const kl_tensor *p = params[i];
        if (!p) continue;
        if (p->dtype != x->dtype)
            return ke_err(KL_ERR_DTYPE, op, "%s %s does not match the input's dtype %s", i ? "bias" : "weight",
                          ke_fmt_tensor(b1, sizeof b1, p), ke_dtypes[x->dtype].name);
        if (p->ndim != nd || memcmp(p->shape, nshape, sizeof(int64_t) * (size_t)nd))
            return ke_err(KL_ERR_SHAPE, op, "%s %s does not match the normalized shape %s", i ? "bias" : "weight",
                          ke_fmt_tensor(b1, sizeof b1, p), ke_fmt_shape(b2, sizeof b2, (int)nd, nshape));
    }
    return 1;
}

typedef struct norm_ctx {
    const char *x, *w, *b;
    char *y;
    int64_t n;
    double eps;
    int rms;
} norm_ctx;

/* y = (x - mean) * rstd * w + b; rms_norm: y = x * rstd * w with rstd from
 * mean(x^2). Subtracting first (rather than x * rstd + (-mean * rstd), which
 * the compiler contracts into an FMA) keeps constant rows exactly 0. Stats
 * come from two passes over the row while it is in cache; the writing pass
 * prefetches the next row. */
#define KE_NORM(T, sfx)                                                                                  \
    static void norm_range_##sfx(void *ctx, int64_t r0, int64_t r1) {                                    \
        enum { L = KE_LANES(T) };                                                                        \
        const norm_ctx *p = ctx;                                                                         \
        const int64_t n = p->n;                                                                          \
        const T *restrict w = (const T *)p->w, *restrict b = (const T *)p->b;                            \
        for (int64_t r = r0; r < r1; r++) {                                                              \
            const T *restrict x = (const T *)p->x + r * n;                                               \
            T *restrict y = (T *)p->y + r * n;                                                           \
            int pf = r + 1 < r1 && n * (int64_t)sizeof(T) <= 65536;                                      \
            double mean = p->rms ? 0 : row_sum_##sfx(x, n, 0, 0) / (double)n;                           \
            double var = row_sum_##sfx(x, n, (T)mean, 1) / (double)n;                                    \
            T scale = (T)(1 / sqrt(var + p->eps)), tmean = (T)mean;                                      \
            for (int64_t i0 = 0; i0 < n; i0 += L) {                                                      \
                int64_t i1 = n - i0 < L ? n : i0 + L;                                                    \
                if (pf && i1 == i0 + L) prefetch_block(x + n, y + n, i0 * (int64_t)sizeof(T));           \
                for (int64_t i = i0; i < i1; i++) y[i] = (x[i] - tmean) * scale;                         \
                if (w)                                                                                   \
                    for (int64_t i = i0; i < i1; i++) y[i] *= w[i];                                      \
                if (b)                                                                                   \
                    for (int64_t i = i0; i < i1; i++) y[i] += b[i];                                      \
            }                                                                                            \
        }                                                                                                \
    }
KE_NORM(float, f32)
KE_NORM(double, f64)

static int norm_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    const kl_tensor *x = xs[0], *w = norm_weight(c, xs), *b = norm_bias(c, xs);
    int64_t n = 1;
    for (int d = x->ndim - (int)ke_attr_layer_norm_normalized_ndim(&c->a); d < x->ndim; d++) n *= x->shape[d];
    norm_ctx p = {ke_data(x), w ? ke_data(w) : NULL, b ? ke_data(b) : NULL, ke_data(y), n, ke_attr_layer_norm_eps(&c->a),
                  c->op == KE_OP_rms_norm};
    int64_t rows = ke_numel(x->ndim, x->shape) / n;
    ke_parallel_for(rows, grain_for(n), x->dtype == KL_F64 ? norm_range_f64 : norm_range_f32, &p);
    return 0;
}

int ke_cpu_layer_norm(ke_call *c) { return ke_with_compute_dtype(c, norm_compute); }
int ke_cpu_rms_norm(ke_call *c) { return ke_with_compute_dtype(c, norm_compute); }

/* The last normalized_ndim dims, as a dim list. */
static int norm_dims(const ke_call *c, int64_t *dims) {
    int nd = (int)ke_attr_layer_norm_normalized_ndim(&c->a);
    for (int i = 0; i < nd; i++) dims[i] = -nd + i;
    return nd;
}

int ke_decomp_layer_norm(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_norm(c, &spec) < 0) return -1;
    int64_t dims[KL_MAX_DIMS];
    int nd = norm_dims(c, dims);
    kl_tensor *x = c->in[0], *w = norm_weight(c, c->in), *b = norm_bias(c, c->in);
    kl_scope_begin();
    kl_tensor *xc = kl_sub(x, kl_mean(x, nd, dims, true));
    kl_tensor *var = kl_mean(kl_mul(xc, xc), nd, dims, true);
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(var, ke_attr_layer_norm_eps(&c->a))));
    if (w) y = kl_mul(y, w);
    if (b) y = kl_add(y, b);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

int ke_decomp_rms_norm(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_norm(c, &spec) < 0) return -1;
    int64_t dims[KL_MAX_DIMS];
    int nd = norm_dims(c, dims);
    kl_tensor *x = c->in[0], *w = norm_weight(c, c->in);
    kl_scope_begin();
    kl_tensor *ms = kl_mean(kl_mul(x, x), nd, dims, true);
    kl_tensor *y = kl_mul(x, kl_rsqrt(kl_add_scalar(ms, ke_attr_rms_norm_eps(&c->a))));
    if (w) y = kl_mul(y, w);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

static kl_tensor *norm_call(int op, kl_tensor *x, int normalized_ndim, kl_tensor *weight, kl_tensor *bias,
                            double eps) {
    kl_tensor *in[3] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    if (weight) in[c.nin++] = weight;
    if (bias) in[c.nin++] = bias;
    ke_attr_set_layer_norm_normalized_ndim(&c.a, normalized_ndim);
    ke_attr_set_layer_norm_has_weight(&c.a, weight != NULL);
    ke_attr_set_layer_norm_has_bias(&c.a, bias != NULL);
    ke_attr_set_layer_norm_eps(&c.a, eps);
    return ke_call1(&c);
}

kl_tensor *kl_layer_norm(kl_tensor *x, int normalized_ndim, kl_tensor *weight, kl_tensor *bias, double eps) {
    return norm_call(KE_OP_layer_norm, x, normalized_ndim, weight, bias, eps);
}

kl_tensor *kl_rms_norm(kl_tensor *x, int normalized_ndim, kl_tensor *weight, double eps) {
    return norm_call(KE_OP_rms_norm, x, normalized_ndim, weight, NULL, eps);
}

/* ---- dropout ---------------------------------------------------------------------------------- */

/* out = x * (u < 1 - p ? 1 / (1 - p) : 0) with u uniform from the Philox
 * stream kl_bernoulli uses for this dtype, so element i's fate depends only
 * on (seed, offset, i). A dropped NaN stays NaN, as x * 0 in PyTorch. */
typedef struct dropout_ctx {
    const char *x;
    char *y;
    kl_dtype dt;
    uint64_t seed, offset;
    double p;
} dropout_ctx;

#define KE_DROPOUT_CHUNK 1024
#define KE_DROPOUT(T, sfx, UNIFORM)                                                                           \
    static void dropout_chunk_##sfx(const dropout_ctx *p, const T *restrict x, T *restrict y, int64_t b,       \
                                    int64_t e) {                                                              \
        _Alignas(64) T u[KE_DROPOUT_CHUNK];                                                                   \
        UNIFORM(p->seed, p->offset, u - b, b, e, 0, 1);                                                       \
        const T q = (T)(1 - p->p), scale = p->p < 1 ? (T)1 / q : 0;                                           \
        for (int64_t i = 0; i < e - b; i++) y[i] = x[i] * (u[i] < q ? scale : (T)0);                          \
    }
KE_DROPOUT(float, f32, ke_philox_uniform_f32)
KE_DROPOUT(double, f64, ke_philox_uniform_f64)

static void dropout_range(void *ctx, int64_t begin, int64_t end) {
    const dropout_ctx *p = ctx;
    size_t es = ke_dtypes[p->dt].size;
    _Alignas(64) float xb[KE_DROPOUT_CHUNK], yb[KE_DROPOUT_CHUNK];
    for (int64_t b = begin; b < end; b += KE_DROPOUT_CHUNK) {
        int64_t e = end - b < KE_DROPOUT_CHUNK ? end : b + KE_DROPOUT_CHUNK;
        const char *x = p->x + b * (int64_t)es;
        char *y = p->y + b * (int64_t)es;
        if (p->dt == KL_F64) {
            dropout_chunk_f64(p, (const double *)x, (double *)y, b, e);
        } else if (p->dt == KL_F32) {
            dropout_chunk_f32(p, (const float *)x, (float *)y, b, e);
        } else {
            ke_convert(xb, KL_F32, x, p->dt, e - b);
            dropout_chunk_f32(p, xb, yb, b, e);
            ke_convert(y, p->dt, yb, KL_F32, e - b);
        }
    }
}

int ke_cpu_dropout(ke_call *c) {
    kl_tensor *out = c->out[0];
    kl_scope_begin();
    kl_tensor *x = kl_contiguous(c->in[0]);
    if (x) {
        dropout_ctx p = {ke_data(x), ke_data(out), (kl_dtype)out->dtype, (uint64_t)ke_attr_seed(&c->a),
                         (uint64_t)ke_attr_offset(&c->a), ke_attr_dropout_p(&c->a)};
        ke_parallel_for(ke_numel(out->ndim, out->shape), 1 << 16, dropout_range, &p);
    }
    kl_scope_end();
    return x ? 0 : -1;
}

kl_tensor *kl_dropout(kl_tensor *x, double p, bool training) {
    if (ke_check_tensor(x, "dropout", 1)) return NULL;
    if (!(p >= 0 && p <= 1)) {
        ke_err(KL_ERR_ARG, "dropout", "probability has to be between 0 and 1, got %g", p);
        return NULL;
    }
    int64_t n = ke_numel(x->ndim, x->shape);
    if (!training || p == 0 || n == 0) return ke_unary(KE_OP_alias, x, 0);
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_dropout, .nin = 1, .in = in};
    ke_attr_set_dropout_p(&c.a, p);
    if (ke_random_reserve(&c)) return NULL;
    return ke_call1(&c);
}

/* ---- scaled dot-product attention ----------------------------------------------------------- */

/* Inputs q [..., L, E], k [..., S, E], v [..., S, Ev], mask (optional):
 * batch dims broadcast as in matmul; the mask broadcasts to [..., L, S]. */
int ke_infer_sdpa(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    if (c->nin != 3 + ke_attr_scaled_dot_product_attention_has_mask(&c->a))
        return ke_err(KL_ERR_ARG, op, "mask flag and the %d inputs disagree", c->nin);
    kl_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2], *mask = ke_attr_scaled_dot_product_attention_has_mask(&c->a) ? c->in[3] : NULL;
    char b1[256], b2[256], b3[256];
    if (!ke_is_float((kl_dtype)q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return ke_err(KL_ERR_DTYPE, op, "q, k and v must share one floating dtype, got %s, %s and %s",
                      ke_fmt_tensor(b1, sizeof b1, q), ke_fmt_tensor(b2, sizeof b2, k),
                      ke_fmt_tensor(b3, sizeof b3, v));
    ke_fmt_shape(b1, sizeof b1, q->ndim, q->shape);
    ke_fmt_shape(b2, sizeof b2, k->ndim, k->shape);
    ke_fmt_shape(b3, sizeof b3, v->ndim, v->shape);
    if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2)
        return ke_err(KL_ERR_SHAPE, op, "q, k and v need at least 2 dims, got %s, %s and %s", b1, b2, b3);
    int64_t L = q->shape[q->ndim - 2], S = k->shape[k->ndim - 2];
    if (q->shape[q->ndim - 1] != k->shape[k->ndim - 1] || v->shape[v->ndim - 2] != S)
        return ke_err(KL_ERR_SHAPE, op, "q %s, k %s and v %s do not fit [..., L, E], [..., S, E], [..., S, Ev]", b1,
                      b2, b3);
    /* batch dims: broadcast of the three prefixes */
    kl_tensor *qkv[3] = {q, k, v};
    int nb = 0;
    int64_t bs[KL_MAX_DIMS];
    for (int i = 0; i < 3; i++)
        if (qkv[i]->ndim - 2 > nb) nb = qkv[i]->ndim - 2;
    for (int d = 0; d < nb; d++) {
        bs[d] = 1;
        for (int i = 0; i < 3; i++) {
            int sd = d - (nb - (qkv[i]->ndim - 2));
            int64_t s = sd >= 0 ? qkv[i]->shape[sd] : 1;
            if (s != 1 && bs[d] != 1 && s != bs[d])
                return ke_err(KL_ERR_SHAPE, op, "batch dims of q %s, k %s and v %s cannot broadcast", b1, b2, b3);
            if (s != 1) bs[d] = s;
        }
    }
    if (mask) {
        if (ke_attr_scaled_dot_product_attention_causal(&c->a))
            return ke_err(KL_ERR_ARG, op, "pass either an explicit mask or causal = true, not both");
        if (mask->dtype != KL_BOOL && mask->dtype != q->dtype)
            return ke_err(KL_ERR_DTYPE, op, "mask must be bool or %s, got %s", ke_dtypes[q->dtype].name,
                          ke_fmt_tensor(b1, sizeof b1, mask));
        int64_t ss[KL_MAX_DIMS];
        memcpy(ss, bs, sizeof(int64_t) * (size_t)nb);
        ss[nb] = L, ss[nb + 1] = S;
        int bad = mask->ndim > nb + 2;
        for (int d = 0; d < mask->ndim && !bad; d++) {
            int64_t m = mask->shape[mask->ndim - 1 - d], o = ss[nb + 1 - d];
            bad = m != o && m != 1;
        }
        if (bad)
            return ke_err(KL_ERR_SHAPE, op, "mask %s does not broadcast to the scores' shape %s",
                          ke_fmt_tensor(b1, sizeof b1, mask), ke_fmt_shape(b2, sizeof b2, nb + 2, ss));
    }
    memcpy(out->shape, bs, sizeof(int64_t) * (size_t)nb);
    out->shape[nb] = L;
    out->shape[nb + 1] = v->shape[v->ndim - 1];
    out->ndim = nb + 2;
    out->dtype = (kl_dtype)q->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    return 1;
}

/* softmax(q k^T * scale, masked) v. A bool mask (or the causal j <= i) keeps
 * where true and puts -inf elsewhere; a float mask is added. (declared in
 * kernels_nn.h: causal_attention's decomposition too) */
kl_tensor *ke_sdpa_formula(kl_tensor *q, kl_tensor *k, kl_tensor *v, kl_tensor *mask, bool causal, double scale) {
    kl_scope_begin();
    kl_tensor *s = kl_mul_scalar(kl_matmul(q, kl_transpose(k, -2, -1)), scale);
    kl_tensor *keep = mask && mask->dtype == KL_BOOL ? mask : NULL;
    if (causal) {
        /* built on the host and moved to q's device (cross_entropy's class ids do the same):
         * a CPU mask would not join a CUDA where() */
        int64_t L = q->shape[q->ndim - 2], S = k->shape[k->ndim - 2];
        keep = kl_to_device(kl_ge(kl_unsqueeze(kl_arange(0, (double)L, 1, KL_I64), 1),
                                  kl_unsqueeze(kl_arange(0, (double)S, 1, KL_I64), 0)),
                            kl_device_of(q));
    }
    if (keep)
        s = kl_where(keep, s, kl_full(0, NULL, -INFINITY, (kl_dtype)q->dtype));
    else if (mask)
        s = kl_add(s, mask);
    kl_tensor *y = kl_matmul(kl_softmax(s, -1), v);
    kl_keep(y);
    kl_scope_end();
    return y;
}

int ke_decomp_sdpa(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_sdpa(c, &spec) < 0) return -1;
    kl_tensor *mask = ke_attr_scaled_dot_product_attention_has_mask(&c->a) ? c->in[3] : NULL;
    return ke_set_out1(c, ke_sdpa_formula(c->in[0], c->in[1], c->in[2], mask,
                                          ke_attr_scaled_dot_product_attention_causal(&c->a),
                                          ke_attr_scaled_dot_product_attention_scale(&c->a)));
}

/* 1 if t's dim -3 (heads) lies inside its dim -2 (sequence) in memory: a head
 * view of a [..., T, H, D] tensor. */
static int seq_major_view(const kl_tensor *t) {
    return t->ndim >= 3 && t->stride[t->ndim - 3] < t->stride[t->ndim - 2];
}

/* causal_attention on q, k, v, run seq_major (on their [..., L, H, E] views,
 * the output transposed back) when all three are head views: the output is
 * then a [..., L, H, Ev] tensor whose transpose back is contiguous, and the
 * gradients come out in their inputs' layout, so neither needs a copy. */
static kl_tensor *causal_attention(kl_tensor *q, kl_tensor *k, kl_tensor *v, double scale) {
    int sm = seq_major_view(q) && seq_major_view(k) && seq_major_view(v);
    kl_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3 && sm; i++) in[i] = kl_transpose(in[i], -3, -2);
    ke_call c = {.op = KE_OP_causal_attention, .nin = 3, .in = in};
    ke_attr_set_causal_attention_scale(&c.a, scale);
    ke_attr_set_causal_attention_seq_major(&c.a, sm);
    kl_tensor *y = ke_call1(&c);
    return y && sm ? kl_transpose(y, -3, -2) : y;
}

kl_tensor *kl_scaled_dot_product_attention(kl_tensor *q, kl_tensor *k, kl_tensor *v, kl_tensor *mask, bool causal,
                                           double scale) {
    kl_tensor *in[4] = {q, k, v, mask};
    ke_call c = {.op = KE_OP_scaled_dot_product_attention, .nin = mask ? 4 : 3, .in = in};
    if (ke_check_tensor(q, "scaled_dot_product_attention", 1)) return NULL;
    if (!(scale > 0)) scale = q->ndim ? 1 / sqrt((double)q->shape[q->ndim - 1]) : 1;
    ke_attr_set_scaled_dot_product_attention_scale(&c.a, scale);
    ke_attr_set_scaled_dot_product_attention_causal(&c.a, causal);
    ke_attr_set_scaled_dot_product_attention_has_mask(&c.a, mask != NULL);
    /* causal without a mask on the CPU: the fused kernels in query blocks (attention.c) */
    if (causal && !mask && ke_check_tensor(k, "scaled_dot_product_attention", 2) == 0 &&
        ke_check_tensor(v, "scaled_dot_product_attention", 3) == 0 && ke_causal_attention_fits(q, k, v))
        return causal_attention(q, k, v, scale);
    return ke_call1(&c);
}

/* ---- batch_norm and group_norm ---------------------------------------------------------------- */

/* A per-channel parameter of x [N, C, ...]: 1-D [C], x's dtype. */
static int check_channel_param(const char *op, const kl_tensor *x, const kl_tensor *t, const char *what) {
    char b1[256];
    int64_t C = x->shape[1];
    if (t->dtype != x->dtype)
        return ke_err(KL_ERR_DTYPE, op, "%s %s does not match the input's dtype %s", what,
                      ke_fmt_tensor(b1, sizeof b1, t), ke_dtypes[x->dtype].name);
    if (t->ndim != 1 || t->shape[0] != C)
        return ke_err(KL_ERR_SHAPE, op, "%s %s must have shape [%lld] (the input's channels)", what,
                      ke_fmt_tensor(b1, sizeof b1, t), (long long)C);
    return 0;
}

static int check_channels_input(const char *op, const kl_tensor *x) {
    char b1[256];
    if (x->ndim < 2)
        return ke_err(KL_ERR_SHAPE, op, "expects an input [N, C, ...] with at least 2 dims, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    return 0;
}

/* Inputs: x[, running_mean, running_var (eval)][, weight][, bias]. */
static void bn_inputs(const ke_call *c, kl_tensor *const *in, kl_tensor **rm, kl_tensor **rv, kl_tensor **w,
                      kl_tensor **b) {
    int k = 1;
    *rm = *rv = NULL;
    if (!ke_attr_batch_norm_training(&c->a)) *rm = in[k++], *rv = in[k++];
    *w = ke_attr_batch_norm_has_weight(&c->a) ? in[k++] : NULL;
    *b = ke_attr_batch_norm_has_bias(&c->a) ? in[k] : NULL;
}

int ke_infer_batch_norm(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    int training = ke_attr_batch_norm_training(&c->a);
    if (c->nin != 1 + 2 * !training + ke_attr_batch_norm_has_weight(&c->a) + ke_attr_batch_norm_has_bias(&c->a))
        return ke_err(KL_ERR_ARG, op, "training/weight/bias flags and the %d inputs disagree", c->nin);
    if (ke_infer_same(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0];
    if (check_channels_input(op, x)) return -1;
    kl_tensor *p[4];
    bn_inputs(c, c->in, &p[0], &p[1], &p[2], &p[3]);
    static const char *const what[4] = {"running_mean", "running_var", "weight", "bias"};
    for (int i = 0; i < 4; i++)
        if (p[i] && check_channel_param(op, x, p[i], what[i])) return -1;
    int64_t n = ke_numel(x->ndim, x->shape), C = x->shape[1];
    char b1[256];
    if (training && C > 0 && n / C == 1)
        return ke_err(KL_ERR_SHAPE, op, "expected more than 1 value per channel when training, got input %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    return 1;
}

/* (declared in kernels_nn.h) */
int ke_bn_dims(const kl_tensor *x, int64_t *dims) {
    int n = 0;
    dims[n++] = 0;
    for (int d = 2; d < x->ndim; d++) dims[n++] = d;
    return n;
}

/* (declared in kernels_nn.h) */
kl_tensor *ke_per_channel(const kl_tensor *x, kl_tensor *t) {
    int64_t shape[KL_MAX_DIMS];
    shape[0] = x->shape[1];
    for (int d = 2; d < x->ndim; d++) shape[d - 1] = 1;
    return kl_reshape(t, x->ndim - 1, shape);
}

/* (x - mean) * rsqrt(var + eps) * weight + bias, the statistics the batch's
 * (biased variance) when training, else the running buffers. */
int ke_decomp_batch_norm(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_batch_norm(c, &spec) < 0) return -1;
    kl_tensor *x = c->in[0], *rm, *rv, *w, *b;
    bn_inputs(c, c->in, &rm, &rv, &w, &b);
    int64_t dims[KL_MAX_DIMS];
    int nd = ke_bn_dims(x, dims);
    kl_scope_begin();
    kl_tensor *xc, *var;
    if (ke_attr_batch_norm_training(&c->a)) {
        xc = kl_sub(x, kl_mean(x, nd, dims, true));
        var = kl_mean(kl_mul(xc, xc), nd, dims, true);
    } else {
        xc = kl_sub(x, ke_per_channel(x, rm));
        var = ke_per_channel(x, rv);
    }
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(var, ke_attr_batch_norm_eps(&c->a))));
    if (w) y = kl_mul(y, ke_per_channel(x, w));
    if (b) y = kl_add(y, ke_per_channel(x, b));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* The fused CPU kernel: per group of channels, the statistics (training:
 * the batch's mean and biased variance from bn_sums below; eval: the running
 * buffers), then one pass writing ((x - mean) * rstd) * weight + bias, the
 * decomposition's order of operations. Channels are split over the pool in
 * groups; within a group both passes visit the planes x[n, c] in memory
 * order. */
typedef struct bn_ctx {
    const char *x, *rm, *rv, *w, *b; /* rm, rv: eval mode's running buffers, else NULL */
    char *y;
    int64_t N, C, S;
    double eps;
} bn_ctx;

enum { KE_BN_GROUP = 64 };

/* For channels [g0, g1) of x [N, C, S] (at most KE_BN_GROUP): s = the sum of
 * x and q = the sum of (x - K)^2, K = the mean of the channel's first plane
 * (a shift that keeps q from cancelling when |mean| >> std). One read of x:
 * each plane folds twice (row_sum) while it sits in cache, the planes in
 * memory order, their sums joined in double. Then, with M = N * S and
 * D = s - M K: mean = s / M and the sum of squared deviations is Q - D^2 / M,
 * what both batch_norm (biased) and batch_norm_stats (unbiased) divide. */
#define KE_BN_SUMS(T, sfx)                                                                               \
    static void bn_sums_##sfx(const T *x, int64_t N, int64_t C, int64_t S, int64_t g0, int64_t g1,        \
                              double *s, double *q, double *K) {                                         \
        for (int64_t ch = g0; ch < g1; ch++) {                                                           \
            s[ch - g0] = q[ch - g0] = 0;                                                                 \
            K[ch - g0] = (T)((double)row_sum_##sfx(x + ch * S, S, 0, 0) / (double)S);                    \
        }                                                                                                \
        for (int64_t n = 0; n < N; n++)                                                                  \
            for (int64_t ch = g0; ch < g1; ch++) {                                                       \
                const T *xr = x + (n * C + ch) * S;                                                      \
                s[ch - g0] += (double)row_sum_##sfx(xr, S, 0, 0);                                        \
                q[ch - g0] += (double)row_sum_##sfx(xr, S, (T)K[ch - g0], 1);                            \
            }                                                                                            \
    }                                                                                                    \
    /* the sum of squared deviations from the mean (>= 0; NaN stays) */                                  \
    static inline double bn_ssd_##sfx(double s, double q, double K, double M) {                          \
        double d = s - M * K, v = q - d * d / M;                                                         \
        return v < 0 ? 0 : v;                                                                            \
    }
KE_BN_SUMS(float, f32)
KE_BN_SUMS(double, f64)

#define KE_BN_FWD(T, sfx)                                                                                \
    static void bn_range_##sfx(void *ctx, int64_t c0, int64_t c1) {                                      \
        const bn_ctx *p = ctx;                                                                           \
        const int64_t N = p->N, C = p->C, S = p->S;                                                      \
        const double M = (double)(N * S);                                                                \
        for (int64_t g0 = c0; g0 < c1; g0 += KE_BN_GROUP) {                                              \
            const int64_t g1 = c1 - g0 < KE_BN_GROUP ? c1 : g0 + KE_BN_GROUP;                            \
            double s[KE_BN_GROUP], q[KE_BN_GROUP], K[KE_BN_GROUP];                                       \
            T tm[KE_BN_GROUP], rs[KE_BN_GROUP], wv[KE_BN_GROUP], bv[KE_BN_GROUP];                        \
            if (!p->rm) bn_sums_##sfx((const T *)p->x, N, C, S, g0, g1, s, q, K);                        \
            for (int64_t ch = g0; ch < g1; ch++) {                                                       \
                const int64_t k = ch - g0;                                                               \
                T mean, var;                                                                             \
                if (p->rm) {                                                                             \
                    mean = ((const T *)p->rm)[ch], var = ((const T *)p->rv)[ch];                         \
                } else {                                                                                 \
                    mean = (T)(s[k] / M);                                                                \
                    var = (T)(bn_ssd_##sfx(s[k], q[k], K[k], M) / M);                                    \
                }                                                                                        \
                tm[k] = mean, rs[k] = (T)(1 / sqrt((double)(var + (T)p->eps)));                          \
                wv[k] = p->w ? ((const T *)p->w)[ch] : 1, bv[k] = p->b ? ((const T *)p->b)[ch] : 0;      \
            }                                                                                            \
            for (int64_t n = 0; n < N; n++)                                                              \
                for (int64_t ch = g0; ch < g1; ch++) {                                                   \
                    const int64_t k = ch - g0, off = (n * C + ch) * S;                                   \
                    const T *restrict xr = (const T *)p->x + off;                                        \
                    T *restrict yr = (T *)p->y + off;                                                    \
                    const T m = tm[k], r = rs[k], w = wv[k], b = bv[k];                                  \
                    for (int64_t i = 0; i < S; i++) yr[i] = (xr[i] - m) * r * w + b;                     \
                }                                                                                        \
        }                                                                                                \
    }
KE_BN_FWD(float, f32)
KE_BN_FWD(double, f64)

static int bn_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    kl_tensor *x = xs[0], *rm, *rv, *w, *b;
    bn_inputs(c, xs, &rm, &rv, &w, &b);
    bn_ctx p = {ke_data(x), rm ? ke_data(rm) : NULL, rv ? ke_data(rv) : NULL, w ? ke_data(w) : NULL,
                b ? ke_data(b) : NULL, ke_data(y), x->shape[0], x->shape[1], 1, ke_attr_batch_norm_eps(&c->a)};
    for (int d = 2; d < x->ndim; d++) p.S *= x->shape[d];
    ke_parallel_for(p.C, grain_for(p.N * p.S), x->dtype == KL_F64 ? bn_range_f64 : bn_range_f32, &p);
    return 0;
}

int ke_cpu_batch_norm(ke_call *c) { return ke_with_compute_dtype(c, bn_compute); }

/* ---- batch_norm_stats: the batch's per-channel mean and unbiased variance ----
 * (the row in ops_nn.def). The CPU kernel reads x once (bn_sums, in memory
 * order): mean = s / M, var = (Q - D^2 / M) / (M - 1).
 * Before this op the running buffers took kl_mean and kl_var, three more
 * passes over x per batch_norm. */
int ke_infer_batch_norm_stats(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    if (check_channels_input(ke_opname(c), x)) return -1;
    for (int o = 0; o < 2; o++) {
        out[o].dtype = (kl_dtype)x->dtype;
        out[o].ndim = 1;
        out[o].shape[0] = x->shape[1];
    }
    c->compute = ke_compute_dtype((kl_dtype)x->dtype);
    return 2;
}

typedef struct bns_ctx {
    const char *x;
    char *mean, *var;
    int64_t N, C, S;
} bns_ctx;

/* Channels in groups of KE_BN_GROUP, the sums of bn_sums. */
#define KE_BN_STATS(T, sfx)                                                                              \
    static void bns_range_##sfx(void *ctx, int64_t c0, int64_t c1) {                                     \
        const bns_ctx *p = ctx;                                                                          \
        const double M = (double)(p->N * p->S);                                                          \
        for (int64_t g0 = c0; g0 < c1; g0 += KE_BN_GROUP) {                                              \
            const int64_t g1 = c1 - g0 < KE_BN_GROUP ? c1 : g0 + KE_BN_GROUP;                            \
            double s[KE_BN_GROUP], q[KE_BN_GROUP], K[KE_BN_GROUP];                                       \
            bn_sums_##sfx((const T *)p->x, p->N, p->C, p->S, g0, g1, s, q, K);                           \
            for (int64_t ch = g0; ch < g1; ch++) {                                                       \
                ((T *)p->mean)[ch] = (T)(s[ch - g0] / M);                                                \
                ((T *)p->var)[ch] = (T)(bn_ssd_##sfx(s[ch - g0], q[ch - g0], K[ch - g0], M) / (M - 1));  \
            }                                                                                            \
        }                                                                                                \
    }
KE_BN_STATS(float, f32)
KE_BN_STATS(double, f64)

static int bns_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *const *out) {
    const kl_tensor *x = xs[0];
    bns_ctx p = {ke_data(x), ke_data(out[0]), ke_data(out[1]), x->shape[0], x->shape[1], 1};
    for (int d = 2; d < x->ndim; d++) p.S *= x->shape[d];
    int64_t per = p.N * p.S;
    if (per == 0) /* no elements: NaN, as the mean and variance of nothing */
        return kl_fill_inplace(out[0], NAN) && kl_fill_inplace(out[1], NAN) ? 0 : -1;
    ke_parallel_for(p.C, per >= 32768 ? 1 : 32768 / per, c->compute == KL_F64 ? bns_range_f64 : bns_range_f32, &p);
    return 0;
}

int ke_cpu_batch_norm_stats(ke_call *c) { return ke_with_compute_dtype_outs(c, bns_compute); }

int ke_decomp_batch_norm_stats(ke_call *c) {
    ke_outspec spec[2];
    if (ke_infer_batch_norm_stats(c, spec) < 0) return -1;
    kl_tensor *x = c->in[0];
    int64_t dims[KL_MAX_DIMS];
    int nd = ke_bn_dims(x, dims);
    kl_tensor *o[2] = {kl_mean(x, nd, dims, false), kl_var(x, nd, dims, 1, false)};
    if (!o[0] || !o[1]) return -1;
    c->out[0] = o[0], c->out[1] = o[1];
    c->nout = 2;
    return 0;
}

/* The running buffers are updated after the op, with elementwise in-place
 * ops (r = (1 - m) r + m stat, the variance unbiased as PyTorch's) that a
 * trace records and the compiler functionalizes and writes back; the
 * statistics come from one batch_norm_stats call. Autograd is off for the
 * update: it never enters the graph. */
static int bn_update_running(kl_tensor *x, kl_tensor *rm, kl_tensor *rv, double momentum) {
    ke_keyset saved = ke_tls_state.exclude;
    ke_tls_state.exclude |= KE_KS(KE_KEY_AUTOGRAD);
    kl_scope_begin();
    kl_tensor *in[1] = {x};
    ke_call sc = {.op = KE_OP_batch_norm_stats, .nin = 1, .in = in};
    int ok = ke_dispatch(&sc) == 0;
    ok = ok && kl_add_inplace(kl_mul_scalar_inplace(rm, 1 - momentum), kl_mul_scalar(sc.out[0], momentum)) &&
         kl_add_inplace(kl_mul_scalar_inplace(rv, 1 - momentum), kl_mul_scalar(sc.out[1], momentum));
    kl_scope_end();
    ke_tls_state.exclude = saved;
    return ok ? 0 : -1;
}

kl_tensor *kl_batch_norm(kl_tensor *x, kl_tensor *running_mean, kl_tensor *running_var, kl_tensor *weight,
                         kl_tensor *bias, bool training, double momentum, double eps) {
    const char *op = "batch_norm";
    if (ke_check_tensor(x, op, 1)) return NULL;
    if (!running_mean != !running_var) {
        ke_err(KL_ERR_ARG, op, "running_mean and running_var must be given together (both or neither)");
        return NULL;
    }
    if (!training && !running_mean) {
        ke_err(KL_ERR_ARG, op, "eval mode (training = false) needs running_mean and running_var");
        return NULL;
    }
    if (running_mean) {
        if (ke_check_tensor(running_mean, op, 2) || ke_check_tensor(running_var, op, 3)) return NULL;
        if (kl_requires_grad(running_mean) || kl_requires_grad(running_var)) {
            ke_err(KL_ERR_ARG, op, "running_mean and running_var are buffers: they must not require grad");
            return NULL;
        }
        if (training && (check_channels_input(op, x) || check_channel_param(op, x, running_mean, "running_mean") ||
                         check_channel_param(op, x, running_var, "running_var")))
            return NULL;
    }
    kl_tensor *in[5] = {x};
    ke_call c = {.op = KE_OP_batch_norm, .nin = 1, .in = in};
    if (!training) in[c.nin++] = running_mean, in[c.nin++] = running_var;
    if (weight) in[c.nin++] = weight;
    if (bias) in[c.nin++] = bias;
    ke_attr_set_batch_norm_training(&c.a, training);
    ke_attr_set_batch_norm_has_weight(&c.a, weight != NULL);
    ke_attr_set_batch_norm_has_bias(&c.a, bias != NULL);
    ke_attr_set_batch_norm_eps(&c.a, eps);
    kl_tensor *y = ke_call1(&c);
    if (y && training && running_mean && bn_update_running(x, running_mean, running_var, momentum)) {
        kl_release(y);
        return NULL;
    }
    return y;
}

static void gn_inputs(const ke_call *c, kl_tensor *const *in, kl_tensor **w, kl_tensor **b) {
    *w = ke_attr_group_norm_has_weight(&c->a) ? in[1] : NULL;
    *b = ke_attr_group_norm_has_bias(&c->a) ? in[1 + ke_attr_group_norm_has_weight(&c->a)] : NULL;
}

int ke_infer_group_norm(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    if (c->nin != 1 + ke_attr_group_norm_has_weight(&c->a) + ke_attr_group_norm_has_bias(&c->a))
        return ke_err(KL_ERR_ARG, op, "weight/bias flags and the %d inputs disagree", c->nin);
    if (ke_infer_same(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0];
    if (check_channels_input(op, x)) return -1;
    int64_t G = ke_attr_group_norm_num_groups(&c->a), C = x->shape[1];
    char b1[256];
    if (G < 1 || C % G)
        return ke_err(KL_ERR_ARG, op, "num_groups (%lld) must be positive and divide the channels of input %s",
                      (long long)G, ke_fmt_tensor(b1, sizeof b1, x));
    kl_tensor *w, *b;
    gn_inputs(c, c->in, &w, &b);
    if ((w && check_channel_param(op, x, w, "weight")) || (b && check_channel_param(op, x, b, "bias"))) return -1;
    return 1;
}

/* layer_norm over each group's [C / G, ...] elements, then the per-channel
 * affine: its fused kernel and derivative serve group_norm. */
int ke_decomp_group_norm(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_group_norm(c, &spec) < 0) return -1;
    kl_tensor *x = c->in[0], *w, *b;
    gn_inputs(c, c->in, &w, &b);
    int64_t N = x->shape[0], G = ke_attr_group_norm_num_groups(&c->a), per = x->shape[1] / G;
    for (int d = 2; d < x->ndim; d++) per *= x->shape[d]; /* fits: a factor of numel */
    kl_scope_begin();
    kl_tensor *y = kl_layer_norm(kl_reshape(x, 3, (int64_t[]){N, G, per}), 1, NULL, NULL, ke_attr_group_norm_eps(&c->a));
    y = kl_reshape(y, x->ndim, x->shape);
    if (w) y = kl_mul(y, ke_per_channel(x, w));
    if (b) y = kl_add(y, ke_per_channel(x, b));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_tensor *kl_group_norm(kl_tensor *x, int64_t num_groups, kl_tensor *weight, kl_tensor *bias, double eps) {
    kl_tensor *in[3] = {x};
    ke_call c = {.op = KE_OP_group_norm, .nin = 1, .in = in};
    if (weight) in[c.nin++] = weight;
    if (bias) in[c.nin++] = bias;
    ke_attr_set_group_norm_num_groups(&c.a, num_groups);
    ke_attr_set_group_norm_has_weight(&c.a, weight != NULL);
    ke_attr_set_group_norm_has_bias(&c.a, bias != NULL);
    ke_attr_set_group_norm_eps(&c.a, eps);
    return ke_call1(&c);
}

/* ---- dropout2d --------------------------------------------------------------------------------- */

/* dropout2d has dropout's attributes (AS(dropout) in its row). One uniform
 * per plane (the leading two dims, [N, C] of [N, C, H, W] and, as PyTorch
 * 1.13 reads a 3-D input, [N, C] of [N, C, L]) from the Philox stream
 * dropout uses: plane i's fate depends only on (seed, offset, i). */
int ke_infer_dropout2d(ke_call *c, ke_outspec *out) {
    char b1[256];
    if (ke_infer_same(c, out) < 0) return -1;
    if (c->in[0]->ndim != 3 && c->in[0]->ndim != 4)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "expects a 3-D [N,C,L] or 4-D [N,C,H,W] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, c->in[0]));
    return 1;
}

typedef struct dropout2d_ctx {
    const char *x;
    char *y;
    int64_t plane;
    uint64_t seed, offset;
    double p;
} dropout2d_ctx;

#define KE_DROPOUT2D(T, sfx, UNIFORM)                                                                         \
    static void dropout2d_##sfx(void *ctx, int64_t p0, int64_t p1) {                                          \
        const dropout2d_ctx *p = ctx;                                                                         \
        const T q = (T)(1 - p->p), scale = p->p < 1 ? (T)1 / q : 0;                                           \
        _Alignas(64) T u[KE_DROPOUT_CHUNK];                                                                   \
        for (int64_t b = p0; b < p1; b += KE_DROPOUT_CHUNK) {                                                 \
            int64_t e = p1 - b < KE_DROPOUT_CHUNK ? p1 : b + KE_DROPOUT_CHUNK;                                \
            UNIFORM(p->seed, p->offset, u - b, b, e, 0, 1);                                                   \
            for (int64_t i = b; i < e; i++) {                                                                 \
                const T *restrict x = (const T *)p->x + i * p->plane;                                         \
                T *restrict y = (T *)p->y + i * p->plane;                                                     \
                const T m = u[i - b] < q ? scale : (T)0;                                                      \
                for (int64_t j = 0; j < p->plane; j++) y[j] = x[j] * m;                                       \
            }                                                                                                 \
        }                                                                                                     \
    }
KE_DROPOUT2D(float, f32, ke_philox_uniform_f32)
KE_DROPOUT2D(double, f64, ke_philox_uniform_f64)

static int dropout2d_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    const kl_tensor *x = xs[0];
    int64_t planes = x->shape[0] * x->shape[1], n = ke_numel(x->ndim, x->shape);
    dropout2d_ctx p = {ke_data(x), ke_data(y), planes ? n / planes : 0, (uint64_t)ke_attr_seed(&c->a),
                       (uint64_t)ke_attr_offset(&c->a), ke_attr_dropout_p(&c->a)};
    if (planes == 0) return 0;
    ke_parallel_for(planes, p.plane >= 16384 ? 1 : 16384 / (p.plane ? p.plane : 1),
                    y->dtype == KL_F64 ? dropout2d_f64 : dropout2d_f32, &p);
    return 0;
}

int ke_cpu_dropout2d(ke_call *c) { return ke_with_compute_dtype(c, dropout2d_compute); }

kl_tensor *kl_dropout2d(kl_tensor *x, double p, bool training) {
    char b1[256];
    if (ke_check_tensor(x, "dropout2d", 1)) return NULL;
    if (!(p >= 0 && p <= 1)) {
        ke_err(KL_ERR_ARG, "dropout2d", "probability has to be between 0 and 1, got %g", p);
        return NULL;
    }
    if (x->ndim != 3 && x->ndim != 4) {
        ke_err(KL_ERR_SHAPE, "dropout2d", "expects a 3-D [N,C,L] or 4-D [N,C,H,W] input, got %s",
               ke_fmt_tensor(b1, sizeof b1, x));
        return NULL;
    }
    int64_t n = ke_numel(x->ndim, x->shape);
    if (!training || p == 0 || n == 0) return ke_unary(KE_OP_alias, x, 0);
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_dropout2d, .nin = 1, .in = in};
    ke_attr_set_dropout_p(&c.a, p);
    if (ke_random_reserve(&c)) return NULL;
    return ke_call1(&c);
}
