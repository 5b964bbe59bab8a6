/*
 * nn_backward.c — internal ops that only the nn derivatives call (rows at the
 * end of ops_nn.def); the formulas themselves live in src/autograd/d_nn.c.
 *
 * max_pool2d_indices: for every max_pool2d window, the flat index
 * (ih * W + iw within its plane) of the element the window's maximum came
 * from, as PyTorch's return_indices gives it: the first maximum in window
 * order; a NaN always takes over (so the last NaN); a window of only -inf
 * points at its first in-range element. max_pool2d's derivative scatters the
 * output gradient to these positions. A window with no in-range element at
 * all (possible with dilation and padding; its output is -inf whatever x is)
 * gets H * W, one past the plane, so the scatter can drop it.
 */
#include "kernels_nn.h"
#include "threadpool.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct pidx_ctx {
    const char *x, *g; /* g: max_pool2d_backward's output gradient */
    int64_t *y;        /* max_pool2d_indices' output */
    char *gx;          /* max_pool2d_backward's output */
    int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
} pidx_ctx;

/* First in-range tap of a window starting at `start` with step `dil`, and
 * the end (exclusive) of its taps clipped to the input. */
static void window_span(int64_t start, int64_t k, int64_t dil, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t end = start + (k - 1) * dil + 1;
    *hi = end < n ? end : n;
    *lo = start >= 0 ? start : start + (-start + dil - 1) / dil * dil;
}

/* The flat index of window (oh, ow)'s maximum in its plane x (see the header). */
#define KE_POOL_ARGMAX(T, sfx)                                                                         \
    static inline int64_t pool_argmax_##sfx(const pidx_ctx *p, const T *x, int64_t oh, int64_t ow) {  \
        int64_t ih0, ih1, iw0, iw1;                                                                    \
        window_span(oh * p->sh - p->ph, p->kh, p->dh, p->H, &ih0, &ih1);                               \
        window_span(ow * p->sw - p->pw, p->kw, p->dw, p->W, &iw0, &iw1);                               \
        if (ih0 >= ih1 || iw0 >= iw1) return p->H * p->W;                                              \
        int64_t best = ih0 * p->W + iw0;                                                               \
        T m = -INFINITY;                                                                               \
        for (int64_t ih = ih0; ih < ih1; ih += p->dh)                                                  \
            for (int64_t iw = iw0; iw < iw1; iw += p->dw) {                                            \
                T v = x[ih * p->W + iw];                                                               \
                if (v > m || isnan(v)) m = v, best = ih * p->W + iw;                                   \
            }                                                                                          \
        return best;                                                                                   \
    }                                                                                                  \
    static void pidx_##sfx(void *ctx, int64_t p0, int64_t p1) {                                        \
        const pidx_ctx *p = ctx;                                                                       \
        for (int64_t pl = p0; pl < p1; pl++) {                                                         \
            const T *x = (const T *)p->x + pl * p->H * p->W;                                           \
            int64_t *y = p->y + pl * p->OH * p->OW;                                                    \
            for (int64_t oh = 0; oh < p->OH; oh++)                                                     \
                for (int64_t ow = 0; ow < p->OW; ow++) y[oh * p->OW + ow] = pool_argmax_##sfx(p, x, oh, ow); \
        }                                                                                              \
    }                                                                                                  \
    /* Disjoint 2x2 windows inside x (ke_pool_2x2): each element of x is in at most one window, so   \
     * gx is written once, g at the window's maximum (pool_argmax's choice; g + 0 as the zeroed    \
     * plane plus g would give: -0 becomes +0) and 0 at the others;                                   \
     * the rows and columns past the last window are zeroed. Vectorizes. */                           \
    static void pbwd2x2_##sfx(const pidx_ctx *p, const T *x, const T *g, T *gx) {                      \
        for (int64_t oh = 0; oh < p->OH; oh++) {                                                       \
            const T *restrict r0 = x + 2 * oh * p->W, *restrict r1 = r0 + p->W;                        \
            const T *restrict gr = g + oh * p->OW;                                                     \
            T *restrict d0 = gx + 2 * oh * p->W, *restrict d1 = d0 + p->W;                             \
            for (int64_t ow = 0; ow < p->OW; ow++) {                                                   \
                T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1], m = a, gv = gr[ow] + (T)0; \
                int k = 0;                                                                             \
                k = b > m || isnan(b) ? 1 : k, m = k == 1 ? b : m;                                     \
                k = c > m || isnan(c) ? 2 : k, m = k == 2 ? c : m;                                     \
                k = d > m || isnan(d) ? 3 : k;                                                         \
                d0[2 * ow] = k == 0 ? gv : 0, d0[2 * ow + 1] = k == 1 ? gv : 0;                        \
                d1[2 * ow] = k == 2 ? gv : 0, d1[2 * ow + 1] = k == 3 ? gv : 0;                        \
            }                                                                                          \
            for (int64_t iw = 2 * p->OW; iw < p->W; iw++) d0[iw] = d1[iw] = 0;                         \
        }                                                                                              \
        if (2 * p->OH < p->H) memset(gx + 2 * p->OH * p->W, 0, sizeof(T) * (size_t)((p->H - 2 * p->OH) * p->W)); \
    }                                                                                                  \
    /* max_pool2d_backward: each plane of gx zeroed, then every window's g added at its maximum. */   \
    static void pbwd_##sfx(void *ctx, int64_t p0, int64_t p1) {                                        \
        const pidx_ctx *p = ctx;                                                                       \
        int fast = ke_pool_2x2(p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->H, p->W, p->OH, p->OW); \
        if (fast && sizeof(T) == sizeof(float)) { /* f32: explicit vectors (pool2x2.c) */             \
            ke_maxpool2x2_backward_f32((const float *)p->x + p0 * p->H * p->W,                        \
                                       (const float *)p->g + p0 * p->OH * p->OW,                       \
                                       (float *)p->gx + p0 * p->H * p->W, p1 - p0, p->H, p->W, p->OH, p->OW); \
            return;                                                                                    \
        }                                                                                              \
        for (int64_t pl = p0; pl < p1; pl++) {                                                         \
            const T *x = (const T *)p->x + pl * p->H * p->W, *g = (const T *)p->g + pl * p->OH * p->OW; \
            T *gx = (T *)p->gx + pl * p->H * p->W;                                                     \
            if (fast) {                                                                                \
                pbwd2x2_##sfx(p, x, g, gx);                                                            \
                continue;                                                                              \
            }                                                                                          \
            memset(gx, 0, sizeof(T) * (size_t)(p->H * p->W));                                          \
            for (int64_t oh = 0; oh < p->OH; oh++)                                                     \
                for (int64_t ow = 0; ow < p->OW; ow++) {                                               \
                    int64_t best = pool_argmax_##sfx(p, x, oh, ow);                                    \
                    if (best < p->H * p->W) gx[best] += g[oh * p->OW + ow];                            \
                }                                                                                      \
        }                                                                                              \
    }
KE_POOL_ARGMAX(float, f32)
KE_POOL_ARGMAX(double, f64)

/* Fills p from x and out (the pooled shape) and max_pool2d's attributes;
 * returns the planes and sets *grain for the pool. */
static int64_t pool_setup(const ke_call *c, const kl_tensor *x, const kl_tensor *out, pidx_ctx *p, int64_t *grain) {
    int b = x->ndim == 4;
    /* the internal ops have max_pool2d's attributes */
    const int64_t *k = ke_attr_max_pool2d_kernel_size(&c->a), *s = ke_attr_max_pool2d_stride(&c->a),
                  *pad = ke_attr_max_pool2d_padding(&c->a), *dil = ke_attr_max_pool2d_dilation(&c->a);
    *p = (pidx_ctx){.x = ke_data(x), .H = x->shape[b + 1], .W = x->shape[b + 2], .OH = out->shape[b + 1],
                    .OW = out->shape[b + 2], .kh = k[0], .kw = k[1], .sh = s[0], .sw = s[1], .ph = pad[0], .pw = pad[1],
                    .dh = dil[0], .dw = dil[1]};
    int64_t per;
    if (ke_mul_ov(p->OH * p->OW, p->kh, &per) || ke_mul_ov(per, p->kw, &per)) per = INT64_MAX; /* huge kernels */
    *grain = per >= 16384 ? 1 : 16384 / (per ? per : 1);
    return (b ? x->shape[0] : 1) * x->shape[b];
}

int ke_cpu_max_pool2d_indices(ke_call *c) {
    kl_tensor *out = c->out[0];
    if (ke_numel(out->ndim, out->shape) == 0) return 0;
    kl_scope_begin();
    /* f16/bf16 compare exactly in f32 */
    kl_tensor *x = kl_contiguous(kl_to_dtype(c->in[0], c->compute));
    if (x) {
        pidx_ctx p;
        int64_t grain, planes = pool_setup(c, x, out, &p, &grain);
        p.y = (int64_t *)ke_data(out);
        ke_parallel_for(planes, grain, x->dtype == KL_F64 ? pidx_f64 : pidx_f32, &p);
    }
    kl_scope_end();
    return x ? 0 : -1;
}

/* ---- max_pool2d_backward ---------------------------------------------------------------------
 * Inputs g (the pooled shape), x; max_pool2d's attributes; output gx (x's
 * shape). A composite: the decomposition is the formula (max_pool2d_indices,
 * then a scatter_add of g into the planes of x, one spare column per plane
 * catching windows that saw no element of x); the CPU kernel does the same
 * in one pass per plane (f16/bf16 through f32). Autograd differentiates it
 * through the decomposition (double backward). */
int ke_infer_max_pool2d_backward(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    const kl_tensor *g = c->in[0], *x = c->in[1];
    ke_call fwd = *c; /* max_pool2d's shape rule (its messages name max_pool2d) */
    kl_tensor *xin[1] = {c->in[1]};
    fwd.op = KE_OP_max_pool2d, fwd.in = xin, fwd.nin = 1;
    ke_outspec pooled;
    if (ke_infer_pool2d(&fwd, &pooled) < 0) return -1;
    if (g->dtype != x->dtype)
        return ke_err(KL_ERR_DTYPE, op, "gradient %s and input %s must have one dtype", ke_fmt_tensor(b1, sizeof b1, g),
                      ke_fmt_tensor(b2, sizeof b2, x));
    if (g->ndim != pooled.ndim || memcmp(g->shape, pooled.shape, sizeof(int64_t) * (size_t)g->ndim))
        return ke_err(KL_ERR_SHAPE, op, "gradient %s does not have the pooled shape of input %s",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, x));
    out[0].dtype = (kl_dtype)x->dtype;
    out[0].ndim = x->ndim;
    memcpy(out[0].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    c->compute = ke_compute_dtype((kl_dtype)x->dtype);
    return 1;
}

static int pbwd_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    pidx_ctx p;
    int64_t grain, planes = pool_setup(c, xs[1], xs[0], &p, &grain);
    p.g = ke_data(xs[0]), p.gx = ke_data(y);
    ke_parallel_for(planes, grain, xs[1]->dtype == KL_F64 ? pbwd_f64 : pbwd_f32, &p);
    return 0;
}

int ke_cpu_max_pool2d_backward(ke_call *c) { return ke_with_compute_dtype(c, pbwd_compute); }

int ke_decomp_max_pool2d_backward(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_max_pool2d_backward(c, &spec) < 0) return -1;
    kl_tensor *g = c->in[0], *x = c->in[1];
    int b = x->ndim == 4;
    int64_t HW = x->shape[b + 1] * x->shape[b + 2], OHW = g->shape[b + 1] * g->shape[b + 2];
    int64_t planes = (b ? x->shape[0] : 1) * x->shape[b];
    kl_scope_begin();
    ke_call ic = {.op = KE_OP_max_pool2d_indices, .nin = 1, .in = &x, .a = c->a};
    kl_tensor *idx = ke_call1(&ic);
    kl_tensor *buf = kl_zero_inplace(kl_empty_on(2, (int64_t[]){planes, HW + 1}, (kl_dtype)g->dtype, kl_device_of(x)));
    kl_tensor *gx = kl_scatter_add(buf, 1, kl_reshape(idx, 2, (int64_t[]){planes, OHW}),
                                   kl_reshape(g, 2, (int64_t[]){planes, OHW}));
    gx = kl_contiguous(kl_reshape(kl_narrow(gx, 1, 0, HW), x->ndim, x->shape));
    kl_keep(gx);
    kl_scope_end();
    return ke_set_out1(c, gx);
}

/* ---- batch_norm_backward ---------------------------------------------------------------------
 * Inputs g, x[, running_mean, running_var (eval)][, weight], batch_norm's
 * attributes; outputs dx (x's shape), dweight and dbias ([C]). Per channel,
 * over its M = N * S elements, with xh = (x - mean) * rstd:
 *   training  dx = rstd * w * (g - sum(g) / M - xh * sum(g * xh) / M)
 *   eval      dx = rstd * w * g        (mean, var: the running buffers)
 *   dweight = sum(g * xh), dbias = sum(g).
 * A composite: the decomposition writes this with kl_ ops (other devices,
 * compiled kernels, and double backward, which goes through it); the CPU
 * kernel (f16/bf16 through f32) recomputes the statistics in the same pass
 * that sums g and g * x: per plane, while it sits in cache, the sums of
 * x - K, (x - K)^2, g and g * (x - K) (K the channel's first element, so the
 * variance does not cancel when |mean| >> std), each folded in lanes of the
 * compute type (bnb_<name> below: vectorized), the planes joined in double.
 * Then one pass writes dx. */
typedef struct bnb_ctx {
    const char *g, *x, *rm, *rv, *w;
    char *dx, *dw, *db;
    int64_t N, C, S;
    double eps;
} bnb_ctx;

enum { KE_BNB_LANES = 16, KE_BNB_BLOCK = 1024 };

/* bnb_<name>_<sfx>(g, x, n, K): the sum over a plane of one of the four
 * terms below, folded in lanes of the compute type over blocks of at most
 * KE_BNB_BLOCK elements (64 terms a lane; one accumulator per loop, so it
 * vectorizes), the blocks' lanes and the tail joined in double. The four
 * run one after another over a plane that stays in cache. */
#define KE_BNB_FOLD(T, sfx, name, TERM)                                                                    \
    static double bnb_##name##_##sfx(const T *restrict g, const T *restrict x, int64_t n, T K) {           \
        double r = 0;                                                                                      \
        for (int64_t i0 = 0; i0 < n; i0 += KE_BNB_BLOCK) {                                                 \
            int64_t i1 = n - i0 < KE_BNB_BLOCK ? n : i0 + KE_BNB_BLOCK, i = i0;                            \
            T l[KE_BNB_LANES];                                                                             \
            for (int j = 0; j < KE_BNB_LANES; j++) l[j] = 0;                                               \
            for (; i + KE_BNB_LANES <= i1; i += KE_BNB_LANES)                                              \
                for (int j = 0; j < KE_BNB_LANES; j++) l[j] += TERM(i + j);                                \
            for (int j = 0; j < KE_BNB_LANES; j++) r += (double)l[j];                                      \
            for (; i < i1; i++) r += (double)(TERM(i));                                                    \
        }                                                                                                  \
        return r;                                                                                          \
    }
#define KE_BNB_X(i) (x[i] - K)
#define KE_BNB_XX(i) ((x[i] - K) * (x[i] - K))
#define KE_BNB_G(i) (g[i])
#define KE_BNB_GX(i) (g[i] * (x[i] - K))
#define KE_BNB_FOLDS(T, sfx)                                                                               \
    KE_BNB_FOLD(T, sfx, x, KE_BNB_X)                                                                       \
    KE_BNB_FOLD(T, sfx, xx, KE_BNB_XX)                                                                     \
    KE_BNB_FOLD(T, sfx, g, KE_BNB_G)                                                                       \
    KE_BNB_FOLD(T, sfx, gx, KE_BNB_GX)
KE_BNB_FOLDS(float, f32)
KE_BNB_FOLDS(double, f64)

#define KE_BN_BWD(T, sfx)                                                                                   \
    static void bnb_range_##sfx(void *ctx, int64_t c0, int64_t c1) {                                        \
        const bnb_ctx *p = ctx;                                                                             \
        const int64_t N = p->N, C = p->C, S = p->S, M = N * S;                                              \
        for (int64_t ch = c0; ch < c1; ch++) {                                                              \
            const T *g = (const T *)p->g + ch * S, *x = (const T *)p->x + ch * S;                           \
            const T K = p->rm ? ((const T *)p->rm)[ch] : x[0];                                              \
            double Sx = 0, Sxx = 0, Sg = 0, Sgx = 0;                                                        \
            for (int64_t n = 0; n < N; n++) {                                                               \
                const T *gr = g + n * C * S, *xr = x + n * C * S;                                           \
                if (!p->rm) /* training: the batch's statistics */                                          \
                    Sx += bnb_x_##sfx(gr, xr, S, K), Sxx += bnb_xx_##sfx(gr, xr, S, K);                     \
                Sg += bnb_g_##sfx(gr, xr, S, K), Sgx += bnb_gx_##sfx(gr, xr, S, K);                         \
            }                                                                                               \
            double mean, rstd, sgxh; /* sgxh = sum(g * xh) */                                               \
            if (p->rm) {                                                                                    \
                mean = (double)K;                                                                           \
                rstd = 1 / sqrt((double)((T)((const T *)p->rv)[ch] + (T)p->eps));                           \
            } else {                                                                                        \
                double dm = Sx / (double)M, var = Sxx / (double)M - dm * dm;                                \
                mean = K + dm;                                                                              \
                rstd = 1 / sqrt((var > 0 ? var : 0) + p->eps);                                              \
                Sgx -= dm * Sg; /* sum(g * (x - mean)) */                                                   \
            }                                                                                               \
            sgxh = Sgx * rstd;                                                                              \
            const double wv = p->w ? ((const T *)p->w)[ch] : 1;                                             \
            ((T *)p->dw)[ch] = (T)sgxh;                                                                     \
            ((T *)p->db)[ch] = (T)Sg;                                                                       \
            const T a = (T)(rstd * wv), mg = p->rm ? 0 : (T)(Sg / (double)M),                               \
                    bx = p->rm ? 0 : (T)(rstd * sgxh / (double)M), tm = (T)mean;                            \
            for (int64_t n = 0; n < N; n++) {                                                               \
                const T *restrict gr = g + n * C * S, *restrict xr = x + n * C * S;                         \
                T *restrict dr = (T *)p->dx + ch * S + n * C * S;                                           \
                if (p->rm)                                                                                  \
                    for (int64_t i = 0; i < S; i++) dr[i] = a * gr[i];                                      \
                else                                                                                        \
                    for (int64_t i = 0; i < S; i++) dr[i] = a * (gr[i] - mg - (xr[i] - tm) * bx);           \
            }                                                                                               \
        }                                                                                                   \
    }
KE_BN_BWD(float, f32)
KE_BN_BWD(double, f64)

/* g, x[, running_mean, running_var][, weight]: the count batch_norm's flags imply. */
static int bnb_layout(const ke_call *c, int *k_w) {
    int k = 2 + 2 * !ke_attr_batch_norm_training(&c->a);
    *k_w = ke_attr_batch_norm_has_weight(&c->a) ? k : -1;
    return k + ke_attr_batch_norm_has_weight(&c->a);
}

int ke_infer_batch_norm_backward(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int kw;
    if (c->nin != bnb_layout(c, &kw)) return ke_err(KL_ERR_ARG, op, "training/weight flags and the %d inputs disagree", c->nin);
    const kl_tensor *g = c->in[0], *x = c->in[1];
    if (x->ndim < 2 || g->ndim != x->ndim || memcmp(g->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return ke_err(KL_ERR_SHAPE, op, "expects a gradient %s of the input's shape %s (at least 2 dims)",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, x));
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = c->in[i];
        if (t->dtype != x->dtype || (i >= 2 && (t->ndim != 1 || t->shape[0] != x->shape[1])))
            return ke_err(t->dtype != x->dtype ? KL_ERR_DTYPE : KL_ERR_SHAPE, op, "input %d %s must be %s%s", i,
                          ke_fmt_tensor(b1, sizeof b1, t), i >= 2 ? "a [C] vector of " : "", ke_dtypes[x->dtype].name);
    }
    for (int o = 0; o < 3; o++) {
        out[o].dtype = (kl_dtype)x->dtype;
        out[o].ndim = o ? 1 : x->ndim;
        memcpy(out[o].shape, o ? x->shape + 1 : x->shape, sizeof(int64_t) * (size_t)out[o].ndim);
    }
    c->compute = ke_compute_dtype((kl_dtype)x->dtype);
    return 3;
}

static int bnb_compute(ke_call *c, kl_tensor *const *in, kl_tensor *const *out) {
    int kw, training = ke_attr_batch_norm_training(&c->a);
    bnb_layout(c, &kw);
    kl_dtype ct = c->compute;
    const kl_tensor *x = in[1];
    bnb_ctx p = {ke_data(in[0]), ke_data(x), training ? NULL : ke_data(in[2]), training ? NULL : ke_data(in[3]),
                 kw >= 0 ? ke_data(in[kw]) : NULL, ke_data(out[0]), ke_data(out[1]), ke_data(out[2]),
                 x->shape[0], x->shape[1], 1, ke_attr_batch_norm_eps(&c->a)};
    for (int d = 2; d < x->ndim; d++) p.S *= x->shape[d];
    int64_t per = p.N * p.S;
    if (per == 0) { /* no elements: zero sums, empty dx */
        memset(ke_data(out[1]), 0, (size_t)p.C * ke_dtypes[ct].size);
        memset(ke_data(out[2]), 0, (size_t)p.C * ke_dtypes[ct].size);
    } else {
        ke_parallel_for(p.C, per >= 32768 ? 1 : 32768 / per, ct == KL_F64 ? bnb_range_f64 : bnb_range_f32, &p);
    }
    return 0;
}

int ke_cpu_batch_norm_backward(ke_call *c) { return ke_with_compute_dtype_outs(c, bnb_compute); }

int ke_decomp_batch_norm_backward(ke_call *c) {
    ke_outspec spec[3];
    if (ke_infer_batch_norm_backward(c, spec) < 0) return -1;
    int kw, training = ke_attr_batch_norm_training(&c->a);
    bnb_layout(c, &kw);
    kl_tensor *g = c->in[0], *x = c->in[1], *w = kw >= 0 ? c->in[kw] : NULL;
    int64_t dims[KL_MAX_DIMS];
    int nd = ke_bn_dims(x, dims);
    double eps = ke_attr_batch_norm_eps(&c->a);
    kl_scope_begin();
    kl_tensor *xc, *rstd;
    if (training) {
        xc = kl_sub(x, kl_mean(x, nd, dims, true));
        rstd = kl_rsqrt(kl_add_scalar(kl_mean(kl_mul(xc, xc), nd, dims, true), eps));
    } else {
        xc = kl_sub(x, ke_per_channel(x, c->in[2]));
        rstd = kl_rsqrt(kl_add_scalar(ke_per_channel(x, c->in[3]), eps));
    }
    kl_tensor *xh = kl_mul(xc, rstd);
    kl_tensor *gh = w ? kl_mul(g, ke_per_channel(x, w)) : g, *r = gh;
    if (training)
        r = kl_sub(kl_sub(gh, kl_mean(gh, nd, dims, true)), kl_mul(xh, kl_mean(kl_mul(gh, xh), nd, dims, true)));
    kl_tensor *o[3] = {kl_mul(r, rstd), kl_sum(kl_mul(g, xh), nd, dims, false), kl_sum(g, nd, dims, false)};
    int ok = o[0] && o[1] && o[2];
    for (int i = 0; i < 3 && ok; i++) kl_keep(o[i]);
    kl_scope_end();
    if (!ok) return -1;
    for (int i = 0; i < 3; i++) c->out[i] = o[i];
    c->nout = 3;
    return 0;
}

/* ---- layer_norm_backward ---------------------------------------------------------------------
 * Inputs g, x[, weight], layer_norm's attributes; outputs dx (x's shape),
 * dweight and dbias (the normalized shape: the last normalized_ndim dims).
 * Per row of n elements, with xh = (x - mean) * rstd and gh = g * weight:
 *   dx = rstd * (gh - mean(gh) - xh * mean(gh * xh))
 *   dweight = sum over the rows of g * xh, dbias = sum over the rows of g.
 * A composite: the decomposition is this formula with kl_ ops (compiled
 * graphs fuse it; other devices; double backward). The CPU kernel replaces
 * the ~10 full-size passes of the composed formula with one pass that sums
 * x - K, (x - K)^2, gh and gh * (x - K) in f64 (K the row's first element,
 * as batch_norm_backward), and one that writes dx and adds g * xh and g to
 * the row block's column sums. Rows go in fixed blocks of KE_LNB_ROWS
 * whatever the thread count, and the blocks' sums are added in block order
 * afterwards, so dweight and dbias do not depend on the threads. */
typedef struct lnb_ctx {
    const char *g, *x, *w;
    char *dx;
    double *part; /* [blocks][2][n]: each block's sums of g * xh and of g */
    int64_t rows, n;
    double eps;
} lnb_ctx;

enum { KE_LNB_LANES = 8, KE_LNB_ROWS = 64 };

#define KE_LN_BWD(T, sfx)                                                                                   \
    static void lnb_range_##sfx(void *ctx, int64_t b0, int64_t b1) {                                        \
        const lnb_ctx *p = ctx;                                                                             \
        const int64_t n = p->n;                                                                             \
        const T *restrict w = (const T *)p->w;                                                              \
        for (int64_t blk = b0; blk < b1; blk++) {                                                           \
            double *restrict pw = p->part + blk * 2 * n, *restrict pb = pw + n;                             \
            for (int64_t i = 0; i < 2 * n; i++) pw[i] = 0;                                                  \
            int64_t r1 = (blk + 1) * KE_LNB_ROWS < p->rows ? (blk + 1) * KE_LNB_ROWS : p->rows;             \
            for (int64_t r = blk * KE_LNB_ROWS; r < r1; r++) {                                              \
                const T *restrict g = (const T *)p->g + r * n, *restrict x = (const T *)p->x + r * n;       \
                T *restrict dx = (T *)p->dx + r * n;                                                        \
                const double K = (double)x[0];                                                              \
                double sx[KE_LNB_LANES] = {0}, sxx[KE_LNB_LANES] = {0}, sg[KE_LNB_LANES] = {0},             \
                       sgx[KE_LNB_LANES] = {0};                                                             \
                int64_t i = 0;                                                                              \
                for (; i + KE_LNB_LANES <= n; i += KE_LNB_LANES)                                            \
                    for (int l = 0; l < KE_LNB_LANES; l++) {                                                \
                        double d = (double)x[i + l] - K, gv = w ? (double)(g[i + l] * w[i + l]) : g[i + l]; \
                        sx[l] += d, sxx[l] += d * d, sg[l] += gv, sgx[l] += gv * d;                         \
                    }                                                                                       \
                for (; i < n; i++) {                                                                        \
                    double d = (double)x[i] - K, gv = w ? (double)(g[i] * w[i]) : g[i];                     \
                    sx[0] += d, sxx[0] += d * d, sg[0] += gv, sgx[0] += gv * d;                             \
                }                                                                                           \
                double Sx = 0, Sxx = 0, Sg = 0, Sgx = 0;                                                    \
                for (int l = 0; l < KE_LNB_LANES; l++) Sx += sx[l], Sxx += sxx[l], Sg += sg[l], Sgx += sgx[l]; \
                double dm = Sx / (double)n, var = Sxx / (double)n - dm * dm;                                \
                double rstd = 1 / sqrt((var > 0 ? var : 0) + p->eps);                                       \
                /* mean(gh * xh) = rstd * sum(gh * (x - mean)) / n */                                       \
                double mghxh = (Sgx - dm * Sg) * rstd / (double)n;                                          \
                const T a = (T)rstd, mg = (T)(Sg / (double)n), bx = (T)mghxh, tm = (T)(K + dm);             \
                for (i = 0; i < n; i++) {                                                                   \
                    T xh = (x[i] - tm) * a, gh = w ? g[i] * w[i] : g[i];                                    \
                    dx[i] = a * (gh - mg - xh * bx);                                                        \
                    pw[i] += (double)(g[i] * xh);                                                           \
                    pb[i] += (double)g[i];                                                                  \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    }
KE_LN_BWD(float, f32)
KE_LN_BWD(double, f64)

int ke_infer_layer_norm_backward(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int has_w = ke_attr_layer_norm_has_weight(&c->a);
    if (c->nin != 2 + has_w) return ke_err(KL_ERR_ARG, op, "weight flag and the %d inputs disagree", c->nin);
    const kl_tensor *g = c->in[0], *x = c->in[1];
    int64_t nd = ke_attr_layer_norm_normalized_ndim(&c->a);
    if (g->ndim != x->ndim || memcmp(g->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return ke_err(KL_ERR_SHAPE, op, "expects a gradient %s of the input's shape %s",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, x));
    if (nd < 1 || nd > x->ndim)
        return ke_err(KL_ERR_ARG, op, "normalized_ndim %lld is out of range for input %s (1 to %d)", (long long)nd,
                      ke_fmt_tensor(b1, sizeof b1, x), x->ndim);
    if (!ke_is_float((kl_dtype)x->dtype))
        return ke_err(KL_ERR_DTYPE, op, "expects a floating input, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    const int64_t *nshape = x->shape + (x->ndim - nd);
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = c->in[i];
        if (t->dtype != x->dtype)
            return ke_err(KL_ERR_DTYPE, op, "input %d %s must be %s", i, ke_fmt_tensor(b1, sizeof b1, t),
                          ke_dtypes[x->dtype].name);
    }
    if (has_w && (c->in[2]->ndim != nd || memcmp(c->in[2]->shape, nshape, sizeof(int64_t) * (size_t)nd)))
        return ke_err(KL_ERR_SHAPE, op, "weight %s does not match the normalized shape %s",
                      ke_fmt_tensor(b1, sizeof b1, c->in[2]), ke_fmt_shape(b2, sizeof b2, (int)nd, nshape));
    for (int o = 0; o < 3; o++) {
        out[o].dtype = (kl_dtype)x->dtype;
        out[o].ndim = o ? (int)nd : x->ndim;
        memcpy(out[o].shape, o ? nshape : x->shape, sizeof(int64_t) * (size_t)out[o].ndim);
    }
    c->compute = ke_compute_dtype((kl_dtype)x->dtype);
    return 3;
}

static int lnb_compute(ke_call *c, kl_tensor *const *in, kl_tensor *const *out) {
    int has_w = ke_attr_layer_norm_has_weight(&c->a);
    kl_dtype ct = c->compute;
    const kl_tensor *x = in[1];
    int64_t n = ke_numel(out[1]->ndim, out[1]->shape), total = ke_numel(x->ndim, x->shape);
    int64_t rows = n ? total / n : 0, blocks = (rows + KE_LNB_ROWS - 1) / KE_LNB_ROWS;
    double *sums = calloc((size_t)(2 * n > 0 ? 2 * n : 1), sizeof(double));
    double *part = blocks && n ? malloc(sizeof(double) * (size_t)(blocks * 2 * n)) : NULL;
    if (!sums || (!part && blocks && n)) {
        free(sums);
        free(part);
        return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for %lld column sums", (long long)((blocks + 1) * 2 * n));
    }
    lnb_ctx p = {ke_data(in[0]), ke_data(x), has_w ? ke_data(in[2]) : NULL, ke_data(out[0]), part, rows, n,
                 ke_attr_layer_norm_eps(&c->a)};
    if (blocks && n) {
        int64_t per = KE_LNB_ROWS * n;
        ke_parallel_for(blocks, per >= 32768 ? 1 : 32768 / per, ct == KL_F64 ? lnb_range_f64 : lnb_range_f32, &p);
    }
    /* the blocks' sums in block order: the same result at any thread count */
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t i = 0; i < 2 * n; i++) sums[i] += part[b * 2 * n + i];
    for (int o = 1; o < 3; o++) {
        if (ct == KL_F64)
            memcpy(ke_data(out[o]), sums + (o - 1) * n, sizeof(double) * (size_t)n);
        else
            for (int64_t i = 0; i < n; i++) ((float *)ke_data(out[o]))[i] = (float)sums[(o - 1) * n + i];
    }
    free(sums);
    free(part);
    return 0;
}

int ke_cpu_layer_norm_backward(ke_call *c) { return ke_with_compute_dtype_outs(c, lnb_compute); }

/* The formula (as layer_norm's derivative wrote it before this op, term for
 * term, so compiled graphs fuse the same expressions). */
int ke_decomp_layer_norm_backward(ke_call *c) {
    ke_outspec spec[3];
    if (ke_infer_layer_norm_backward(c, spec) < 0) return -1;
    kl_tensor *g = c->in[0], *x = c->in[1], *w = ke_attr_layer_norm_has_weight(&c->a) ? c->in[2] : NULL;
    int nd = (int)ke_attr_layer_norm_normalized_ndim(&c->a), nlead = x->ndim - nd;
    int64_t dims[KL_MAX_DIMS], lead[KL_MAX_DIMS + 1];
    for (int i = 0; i < nd; i++) dims[i] = i - nd;
    for (int i = 0; i <= nlead; i++) lead[i] = i;
    kl_scope_begin();
    kl_tensor *xc = kl_sub(x, kl_mean(x, nd, dims, true));
    kl_tensor *rstd = kl_rsqrt(kl_add_scalar(kl_mean(kl_mul(xc, xc), nd, dims, true), ke_attr_layer_norm_eps(&c->a)));
    kl_tensor *xh = kl_mul(xc, rstd);
    kl_tensor *gh = w ? kl_mul(g, w) : g;
    kl_tensor *r = kl_sub(gh, kl_mul(xh, kl_mean(kl_mul(gh, xh), nd, dims, true)));
    r = kl_sub(r, kl_mean(gh, nd, dims, true));
    /* summed over a new leading dim too, so that no leading dims (x of the
     * normalized shape) is a sum over one dim of size 1, not over all dims */
    kl_tensor *o[3] = {kl_mul(r, rstd), kl_sum(kl_unsqueeze(kl_mul(g, xh), 0), nlead + 1, lead, false),
                       kl_sum(kl_unsqueeze(g, 0), nlead + 1, lead, false)};
    int ok = o[0] && o[1] && o[2];
    for (int i = 0; i < 3 && ok; i++) kl_keep(o[i]);
    kl_scope_end();
    if (!ok) return -1;
    for (int i = 0; i < 3; i++) c->out[i] = o[i];
    c->nout = 3;
    return 0;
}
