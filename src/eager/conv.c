/*
 * conv.c — conv2d, max_pool2d and avg_pool2d (rows in ops_nn.def) and their
 * option defaults.
 *
 * conv2d lowers each sample and group to one GEMM: im2col lays the receptive
 * fields out as a [C/groups * kh * kw, OH * OW] matrix (skipped for 1x1
 * stride-1 unpadded kernels, where the input already is that matrix) and
 * ke_gemm multiplies the group's [O/groups, C/groups * kh * kw] weights by
 * it. Small products run in parallel over (sample, group) pairs; large ones
 * run one after another with im2col split over the pool and OpenBLAS
 * threading the GEMM, except when the output is small (<= 1024 positions):
 * then chunks of samples share one wider GEMM (conv_batched). Shapes,
 * padding rules and output sizes follow PyTorch.
 */
#include "alloc.h"
#include "kernels_nn.h"
#include "rd_formulas.h"
#include "row_fold.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>

kl_conv2d_options kl_conv2d_options_default(void) {
    return (kl_conv2d_options){.stride = {1, 1}, .padding = {0, 0}, .dilation = {1, 1}, .groups = 1};
}

kl_pool2d_options kl_pool2d_options_default(int64_t k) {
    return (kl_pool2d_options){.kernel = {k, k}, .stride = {k, k}, .padding = {0, 0}, .dilation = {1, 1},
                               .ceil_mode = false, .count_include_pad = true};
}


/* ---- conv2d --------------------------------------------------------------------------- */

typedef struct conv_geom {
    int64_t N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, G, Cg, Og, Kc, P;
} conv_geom;

static void conv_geom_of(const ke_call *c, const kl_tensor *x, const kl_tensor *w, int64_t oh, int64_t ow,
                         conv_geom *g) {
    int b = x->ndim == 4;
    g->N = b ? x->shape[0] : 1;
    g->C = x->shape[b], g->H = x->shape[b + 1], g->W = x->shape[b + 2];
    g->O = w->shape[0], g->kh = w->shape[2], g->kw = w->shape[3];
    const int64_t *st = ke_attr_conv2d_stride(&c->a), *pad = ke_attr_conv2d_padding(&c->a),
                  *dil = ke_attr_conv2d_dilation(&c->a);
    g->sh = st[0], g->sw = st[1], g->ph = pad[0], g->pw = pad[1];
    g->dh = dil[0], g->dw = dil[1], g->G = ke_attr_conv2d_groups(&c->a);
    g->Cg = g->C / g->G, g->Og = g->O / g->G, g->Kc = g->Cg * g->kh * g->kw;
    g->OH = oh, g->OW = ow, g->P = oh * ow;
}

int ke_infer_conv2d(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int has_bias = ke_attr_conv2d_has_bias(&c->a);
    if (c->nin != 2 + has_bias) return ke_err(KL_ERR_ARG, op, "bias flag and the %d inputs disagree", c->nin);
    const kl_tensor *x = c->in[0], *w = c->in[1], *bias = has_bias ? c->in[2] : NULL;
    for (int i = 1; i < c->nin; i++)
        if (c->in[i]->dtype != x->dtype)
            return ke_err(KL_ERR_DTYPE, op, "input %s and %s %s must have one dtype", ke_fmt_tensor(b1, sizeof b1, x),
                          i == 1 ? "weight" : "bias", ke_fmt_tensor(b2, sizeof b2, c->in[i]));
    if (x->dtype == KL_BOOL) return ke_err(KL_ERR_DTYPE, op, "not implemented for bool tensors");
    const int64_t *st = ke_attr_conv2d_stride(&c->a), *pad = ke_attr_conv2d_padding(&c->a),
                  *dil = ke_attr_conv2d_dilation(&c->a), groups = ke_attr_conv2d_groups(&c->a);
    if (c->a.nlist != 6) return ke_err(KL_ERR_INTERNAL, op, "expected 6 option values");
    if (st[0] < 1 || st[1] < 1 || pad[0] < 0 || pad[1] < 0 || dil[0] < 1 || dil[1] < 1 || groups < 1)
        return ke_err(KL_ERR_ARG, op,
                      "stride (%lld, %lld) and dilation (%lld, %lld) must be positive, padding (%lld, %lld) "
                      "non-negative and groups (%lld) positive",
                      (long long)st[0], (long long)st[1], (long long)dil[0], (long long)dil[1], (long long)pad[0],
                      (long long)pad[1], (long long)groups);
    if (x->ndim != 3 && x->ndim != 4)
        return ke_err(KL_ERR_SHAPE, op, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    if (w->ndim != 4 || w->shape[2] < 1 || w->shape[3] < 1)
        return ke_err(KL_ERR_SHAPE, op, "expects a 4-D weight [O,C/groups,kh,kw] with a non-empty kernel, got %s",
                      ke_fmt_tensor(b1, sizeof b1, w));
    int b = x->ndim == 4;
    int64_t C = x->shape[b], O = w->shape[0];
    if (O % groups)
        return ke_err(KL_ERR_ARG, op, "out channels (%lld) must be divisible by groups (%lld)", (long long)O,
                      (long long)groups);
    int64_t wc;
    if (ke_mul_ov(w->shape[1], groups, &wc))
        return ke_err(KL_ERR_OVERFLOW, op, "weight %s with groups = %lld: the input channel count overflows",
                      ke_fmt_shape(b2, sizeof b2, w->ndim, w->shape), (long long)groups);
    if (C != wc)
        return ke_err(KL_ERR_SHAPE, op, "weight %s with groups = %lld expects input with %lld channels, got %s",
                      ke_fmt_shape(b2, sizeof b2, w->ndim, w->shape), (long long)groups, (long long)wc,
                      ke_fmt_tensor(b1, sizeof b1, x));
    if (bias && (bias->ndim != 1 || bias->shape[0] != O))
        return ke_err(KL_ERR_SHAPE, op, "bias %s must have shape [%lld]", ke_fmt_tensor(b1, sizeof b1, bias),
                      (long long)O);
    int64_t o[2], in[2], k[2];
    for (int d = 0; d < 2; d++)
        if (ke_mul_ov(2, pad[d], &in[d]) || ke_add_ov(in[d], x->shape[b + 1 + d], &in[d]) ||
            ke_mul_ov(dil[d], w->shape[2 + d] - 1, &k[d]) || ke_add_ov(k[d], 1, &k[d]))
            return ke_err(KL_ERR_OVERFLOW, op, "padding %lld or dilation %lld of spatial dim %d overflows",
                          (long long)pad[d], (long long)dil[d], d);
    for (int d = 0; d < 2; d++) {
        if (k[d] > in[d])
            return ke_err(KL_ERR_SHAPE, op,
                          "padded input %lldx%lld is smaller than the dilated kernel %lldx%lld (input %s)",
                          (long long)in[0], (long long)in[1], (long long)k[0], (long long)k[1],
                          ke_fmt_tensor(b1, sizeof b1, x));
        o[d] = (in[d] - k[d]) / st[d] + 1;
    }
    out->ndim = 0;
    if (b) out->shape[out->ndim++] = x->shape[0];
    out->shape[out->ndim++] = O;
    out->shape[out->ndim++] = o[0];
    out->shape[out->ndim++] = o[1];
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    return 1;
}

/* Rows [r0, r1) of the im2col matrix of one sample's group: row r (ld
 * elements apart) is (channel, ki, kj); column (oh, ow) holds x[ch, oh*sh -
 * ph + ki*dh, ow*sw - pw + kj*dw], 0 in the padding. Only bits move, so one
 * copy per element size serves every dtype. A row of a segment per oh, each
 * OW elements: when OW is shorter than a vector (stride 1; conv2 of the
 * fashion CNN: 11), a segment is copied as one whole vector of
 * KE_IM2COL_B(T) elements whenever that stays inside the sample's row and
 * x's plane, its tail overwritten by the next segment: one load and store
 * instead of a scalar loop too short to vectorize. */
#define KE_IM2COL_B(T) ((int64_t)(64 / sizeof(T)))
#define KE_IM2COL(T, sfx)                                                                                 \
    static void im2col_##sfx(const conv_geom *g, const T *x, T *col, int64_t ld, int64_t r0, int64_t r1) { \
        const int short_rows = g->sw == 1 && g->OW < KE_IM2COL_B(T);                                       \
        for (int64_t r = r0; r < r1; r++) {                                                                \
            int64_t kj = r % g->kw, ki = (r / g->kw) % g->kh, ch = r / (g->kw * g->kh);                    \
            const T *xp = x + ch * g->H * g->W;                                                            \
            int64_t off = kj * g->dw - g->pw;                                                              \
            int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;                                        \
            int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->sw + 1;                            \
            if (hi > g->OW) hi = g->OW;                                                                    \
            if (lo > hi) lo = hi;                                                                          \
            for (int64_t oh = 0; oh < g->OH; oh++) {                                                       \
                T *restrict row = col + r * ld + oh * g->OW;                                               \
                int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                              \
                if (ih < 0 || ih >= g->H) {                                                                \
                    for (int64_t ow = 0; ow < g->OW; ow++) row[ow] = 0;                                    \
                    continue;                                                                              \
                }                                                                                          \
                const T *restrict xr = xp + ih * g->W;                                                     \
                if (short_rows && lo == 0 && hi == g->OW && (oh * g->OW + KE_IM2COL_B(T) <= g->P) &&         \
                    ih * g->W + off + KE_IM2COL_B(T) <= g->H * g->W) {                                     \
                    /* a whole vector: its tail lands in the next segment, which is written next */         \
                    for (int64_t j = 0; j < KE_IM2COL_B(T); j++) row[j] = xr[off + j];                     \
                    continue;                                                                              \
                }                                                                                          \
                for (int64_t ow = 0; ow < lo; ow++) row[ow] = 0;                                           \
                if (g->sw == 1)                                                                            \
                    for (int64_t ow = lo; ow < hi; ow++) row[ow] = xr[ow + off];                           \
                else                                                                                       \
                    for (int64_t ow = lo; ow < hi; ow++) row[ow] = xr[ow * g->sw + off];                   \
                for (int64_t ow = hi; ow < g->OW; ow++) row[ow] = 0;                                       \
            }                                                                                              \
        }                                                                                                  \
    }
KE_IM2COL(uint8_t, b1)
KE_IM2COL(uint32_t, b4)
KE_IM2COL(uint64_t, b8)

typedef struct conv_ctx {
    conv_geom g;
    kl_dtype dt;
    int64_t es;
    int direct;                /* 1x1, stride 1, no padding: the input is the column matrix */
    const char *x, *w, *b;
    char *y, *col;             /* col: the shared buffer of the sequential path */
    const char *xs;            /* im2col source of the sequential path */
    int64_t n0, nb, grp;       /* batched path: samples [n0, n0 + nb) of group grp */
    _Atomic int oom;
} conv_ctx;

static void im2col(const conv_ctx *p, const char *x, char *col, int64_t ld, int64_t r0, int64_t r1) {
    switch (p->es) {
    case 1: im2col_b1(&p->g, (const uint8_t *)x, (uint8_t *)col, ld, r0, r1); break;
    case 4: im2col_b4(&p->g, (const uint32_t *)x, (uint32_t *)col, ld, r0, r1); break;
    default: im2col_b8(&p->g, (const uint64_t *)x, (uint64_t *)col, ld, r0, r1); break;
    }
}

static void im2col_range(void *ctx, int64_t r0, int64_t r1) {
    const conv_ctx *p = ctx;
    im2col(p, p->xs, p->col, p->g.P, r0, r1);
}

/* Output rows of sample n, group grp start as the bias (GEMM then adds with
 * beta 1), or as 0 when there is nothing to multiply. */
static void fill_bias(const conv_ctx *p, int64_t n, int64_t grp) {
    const conv_geom *g = &p->g;
    for (int64_t o = grp * g->Og; o < (grp + 1) * g->Og; o++) {
        char *row = p->y + (n * g->O + o) * g->P * p->es;
        if (!p->b) {
            memset(row, 0, (size_t)(g->P * p->es));
            continue;
        }
        const char *v = p->b + o * p->es;
        for (int64_t i = 0; i < g->P; i++) memcpy(row + i * p->es, v, (size_t)p->es);
    }
}

/* One sample, one group: y[n, g*Og:(g+1)*Og] (+)= W_g @ columns. */
static void conv_gemm(const conv_ctx *p, int64_t n, int64_t grp, const char *cols) {
    const conv_geom *g = &p->g;
    const char *wg = p->w + grp * g->Og * g->Kc * p->es;
    char *yg = p->y + (n * g->O + grp * g->Og) * g->P * p->es;
    ke_gemm(p->dt, g->Og, g->P, g->Kc, 1, wg, g->Kc, 1, cols, g->P, 1, p->b ? 1 : 0, yg, g->P);
}

static const char *sample_group(const conv_ctx *p, int64_t n, int64_t grp) {
    return p->x + (n * p->g.C + grp * p->g.Cg) * p->g.H * p->g.W * p->es;
}

/* Parallel path: tasks are (sample, group) pairs; each chunk of tasks uses
 * its own column buffer. */
static void conv_task_range(void *ctx, int64_t t0, int64_t t1) {
    conv_ctx *p = ctx;
    const conv_geom *g = &p->g;
    size_t bytes = p->direct ? 0 : (size_t)(g->Kc * g->P * p->es);
    char *col = bytes ? ke_cpu_alloc(bytes) : NULL;
    if (bytes && !col) {
        atomic_store(&p->oom, 1);
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int64_t n = t / g->G, grp = t % g->G;
        const char *xs = sample_group(p, n, grp);
        if (p->b) fill_bias(p, n, grp);
        if (!p->direct) im2col(p, xs, col, g->P, 0, g->Kc);
        conv_gemm(p, n, grp, p->direct ? xs : col);
    }
    ke_cpu_free(col, bytes);
}

/* Batched path. A per-sample GEMM is [Og, Kc] @ [Kc, P]; when P is small
 * (conv2d as its own weight gradient, in conv2d_weight_grad's decomposition,
 * has the kernel's few positions as its output, e.g. [64, 15488] @ [15488, 9])
 * such skinny products run at a
 * fraction of the GEMM's speed. Here nb samples' column matrices sit side by
 * side, [Kc, nb * P], so one GEMM of width nb * P serves them all; its
 * [Og, nb * P] result (started as the bias) is then copied into y's rows. */
#define KE_CONV_BATCH_MAX_P 1024                  /* wider outputs: per-sample GEMMs are efficient */
#define KE_CONV_BATCH_BYTES ((size_t)16 << 20)    /* column-buffer budget per chunk of samples */

/* Items t in [t0, t1) are (sample s = t / Kc, row r = t % Kc) of the chunk. */
static void im2col_batch_range(void *ctx, int64_t t0, int64_t t1) {
    const conv_ctx *p = ctx;
    const conv_geom *g = &p->g;
    while (t0 < t1) {
        int64_t s = t0 / g->Kc, r0 = t0 % g->Kc, r1 = r0 + (t1 - t0);
        if (r1 > g->Kc) r1 = g->Kc;
        im2col(p, sample_group(p, p->n0 + s, p->grp), p->col + s * g->P * p->es, p->nb * g->P, r0, r1);
        t0 += r1 - r0;
    }
}

static int conv_batched(conv_ctx *p, int64_t nb_max) {
    const conv_geom *g = &p->g;
    size_t es = (size_t)p->es, col_bytes = (size_t)(g->Kc * nb_max * g->P) * es,
           tmp_bytes = (size_t)(g->Og * nb_max * g->P) * es;
    char *col = ke_cpu_alloc(col_bytes), *tmp = ke_cpu_alloc(tmp_bytes);
    if (!col || !tmp) {
        ke_cpu_free(col, col_bytes);
        ke_cpu_free(tmp, tmp_bytes);
        return -1;
    }
    p->col = col;
    for (int64_t n0 = 0; n0 < g->N; n0 += nb_max) {
        int64_t nb = g->N - n0 < nb_max ? g->N - n0 : nb_max, ld = nb * g->P;
        for (int64_t grp = 0; grp < g->G; grp++) {
            p->n0 = n0, p->nb = nb, p->grp = grp;
            ke_parallel_for(nb * g->Kc, g->P >= 16384 ? 1 : 16384 / g->P, im2col_batch_range, p);
            for (int64_t o = 0; p->b && o < g->Og; o++) {
                char *row = tmp + (size_t)(o * ld) * es;
                const char *v = p->b + (grp * g->Og + o) * p->es;
                for (int64_t i = 0; i < ld; i++) memcpy(row + (size_t)i * es, v, es);
            }
            if (p->dt == KL_F32 || p->dt == KL_F64) ke_blas_prepare();
            ke_gemm(p->dt, g->Og, ld, g->Kc, 1, p->w + grp * g->Og * g->Kc * p->es, g->Kc, 1, col, ld, 1,
                    p->b ? 1 : 0, tmp, ld);
            for (int64_t s = 0; s < nb; s++)
                for (int64_t o = 0; o < g->Og; o++)
                    memcpy(p->y + ((n0 + s) * g->O + grp * g->Og + o) * g->P * p->es,
                           tmp + (size_t)(o * ld + s * g->P) * es, (size_t)g->P * es);
        }
    }
    ke_cpu_free(col, col_bytes);
    ke_cpu_free(tmp, tmp_bytes);
    return 0;
}

static int conv_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    conv_ctx p = {.dt = (kl_dtype)y->dtype, .es = (int64_t)ke_dtypes[y->dtype].size, .x = ke_data(xs[0]),
                  .w = ke_data(xs[1]), .b = ke_attr_conv2d_has_bias(&c->a) ? ke_data(xs[2]) : NULL, .y = ke_data(y)};
    conv_geom_of(c, xs[0], xs[1], y->shape[y->ndim - 2], y->shape[y->ndim - 1], &p.g);
    const conv_geom *g = &p.g;
    atomic_init(&p.oom, 0);
    p.direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
    int64_t tasks = g->N * g->G;
    if (g->Kc == 0) { /* no input channels: the output is the bias (or 0) */
        for (int64_t t = 0; t < tasks; t++) fill_bias(&p, t / g->G, t % g->G);
        return 0;
    }
    double work = (double)g->Og * (double)g->P * (double)g->Kc; /* per task */
    size_t per_sample = (size_t)(g->Kc * g->P * p.es);
    if (!p.direct && g->N > 1 && work >= KE_GEMM_SMALL && g->P <= KE_CONV_BATCH_MAX_P) {
        int64_t nb = (int64_t)(KE_CONV_BATCH_BYTES / per_sample);
        if (conv_batched(&p, nb < 1 ? 1 : nb > g->N ? g->N : nb) < 0)
            return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for the column buffers");
    } else if (tasks > 1 && work < KE_GEMM_SMALL) {
        ke_parallel_for(tasks, (int64_t)(KE_GEMM_SMALL / work) + 1, conv_task_range, &p);
    } else {
        size_t bytes = p.direct ? 0 : (size_t)(g->Kc * g->P * p.es);
        p.col = bytes ? ke_cpu_alloc(bytes) : NULL;
        if (bytes && !p.col)
            return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for a %zu-byte column buffer", bytes);
        for (int64_t t = 0; t < tasks; t++) {
            int64_t n = t / g->G, grp = t % g->G;
            p.xs = sample_group(&p, n, grp);
            if (p.b) fill_bias(&p, n, grp);
            if (!p.direct) {
                int64_t per = g->P ? g->P : 1;
                ke_parallel_for(g->Kc, per >= 16384 ? 1 : 16384 / per, im2col_range, &p);
            }
            if (p.dt == KL_F32 || p.dt == KL_F64) ke_blas_prepare();
            conv_gemm(&p, n, grp, p.direct ? p.xs : p.col);
        }
        ke_cpu_free(p.col, bytes);
    }
    if (atomic_load(&p.oom)) return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for a column buffer");
    return 0;
}

int ke_cpu_conv2d(ke_call *c) { return ke_with_compute_dtype(c, conv_compute); }

kl_tensor *kl_conv2d(kl_tensor *x, kl_tensor *w, kl_tensor *bias, const kl_conv2d_options *opts) {
    kl_conv2d_options o = opts ? *opts : kl_conv2d_options_default();
    kl_tensor *in[3] = {x, w, bias};
    ke_call c = {.op = KE_OP_conv2d, .nin = bias ? 3 : 2, .in = in};
    int64_t list[6] = {o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]};
    ke_set_list(&c, 6, list);
    ke_attr_set_conv2d_groups(&c.a, o.groups);
    ke_attr_set_conv2d_has_bias(&c.a, bias != NULL);
    return ke_call1(&c);
}

/* ---- conv2d_weight_grad ----------------------------------------------------------------
 * dw[O, C/G, kh, kw] of conv2d from x [N, C, H, W] and the output gradient g
 * [N, O, OH, OW] (autograd's conv2d derivative; the row in ops_nn.def). Per
 * group: dw_g[Og, Kc] = g_g[Og, N*P] @ cols[Kc, N*P]^T, where cols is x's
 * im2col with the real kernel (rows kh*kw taps long per channel, as the
 * forward's) and g's samples sit side by side: one GEMM of depth nb*P per
 * chunk of nb samples (chunks accumulate with beta 1), rather than conv2d
 * with x and g transposed, whose "kernel" is g's whole OH x OW plane and whose
 * im2col rows are kh elements long. */

static void convw_geom_of(const ke_call *c, const kl_tensor *x, const kl_tensor *g, conv_geom *q) {
    const int64_t *st = ke_attr_conv2d_weight_grad_stride(&c->a), *pad = ke_attr_conv2d_weight_grad_padding(&c->a),
                  *dil = ke_attr_conv2d_weight_grad_dilation(&c->a), *k = ke_attr_conv2d_weight_grad_kernel_size(&c->a);
    q->N = x->shape[0], q->C = x->shape[1], q->H = x->shape[2], q->W = x->shape[3];
    q->O = g->shape[1], q->OH = g->shape[2], q->OW = g->shape[3], q->P = q->OH * q->OW;
    q->kh = k[0], q->kw = k[1], q->sh = st[0], q->sw = st[1], q->ph = pad[0], q->pw = pad[1];
    q->dh = dil[0], q->dw = dil[1], q->G = ke_attr_conv2d_weight_grad_groups(&c->a);
    q->Cg = q->C / q->G, q->Og = q->O / q->G, q->Kc = q->Cg * q->kh * q->kw;
}

int ke_infer_conv2d_weight_grad(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256], b3[256];
    const kl_tensor *x = c->in[0], *g = c->in[1];
    if (c->a.nlist != 8) return ke_err(KL_ERR_INTERNAL, op, "expected 8 option values");
    if (g->dtype != x->dtype)
        return ke_err(KL_ERR_DTYPE, op, "input %s and gradient %s must have one dtype", ke_fmt_tensor(b1, sizeof b1, x),
                      ke_fmt_tensor(b2, sizeof b2, g));
    if (x->ndim != 4 || g->ndim != 4 || g->shape[0] != x->shape[0])
        return ke_err(KL_ERR_SHAPE, op, "expects a 4-D input [N,C,H,W] and gradient [N,O,OH,OW], got %s and %s",
                      ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, g));
    const int64_t *k = ke_attr_conv2d_weight_grad_kernel_size(&c->a), groups = ke_attr_conv2d_weight_grad_groups(&c->a);
    if (k[0] < 1 || k[1] < 1 || groups < 1 || x->shape[1] % groups || g->shape[1] % groups)
        return ke_err(KL_ERR_ARG, op,
                      "kernel %lldx%lld and groups %lld must be positive, groups dividing channels %lld and %lld",
                      (long long)k[0], (long long)k[1], (long long)groups, (long long)x->shape[1],
                      (long long)g->shape[1]);
    /* g must have the shape conv2d gives x with such a kernel (its rule checks the
     * rest; w stands in for the weight: its shape and dtype only are read) */
    kl_tensor w = {.ndim = 4, .dtype = x->dtype, .shape = {g->shape[1], x->shape[1] / groups, k[0], k[1]}};
    kl_tensor *fin[2] = {c->in[0], &w};
    ke_call fwd = {.op = KE_OP_conv2d, .nin = 2, .in = fin};
    const int64_t *st = ke_attr_conv2d_weight_grad_stride(&c->a), *pad = ke_attr_conv2d_weight_grad_padding(&c->a),
                  *dil = ke_attr_conv2d_weight_grad_dilation(&c->a);
    int64_t list[6] = {st[0], st[1], pad[0], pad[1], dil[0], dil[1]};
    if (ke_set_list(&fwd, 6, list)) return -1;
    ke_attr_set_conv2d_groups(&fwd.a, groups);
    ke_outspec y;
    if (ke_infer_conv2d(&fwd, &y) < 0) return -1;
    if (memcmp(y.shape, g->shape, sizeof(int64_t) * 4))
        return ke_err(KL_ERR_SHAPE, op, "gradient %s does not have conv2d's output shape %s for input %s",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_shape(b2, sizeof b2, 4, y.shape),
                      ke_fmt_tensor(b3, sizeof b3, x));
    out[0].dtype = (kl_dtype)x->dtype;
    out[0].ndim = 4;
    memcpy(out[0].shape, w.shape, sizeof(int64_t) * 4);
    c->compute = ke_compute_dtype(out[0].dtype);
    return 1;
}

/* g's planes [n0, n0 + nb) of group grp side by side: buf[o, s * P + p] */
static void gather_g(const conv_ctx *p, const char *g, char *buf) {
    const conv_geom *q = &p->g;
    size_t row = (size_t)(q->P * p->es);
    for (int64_t o = 0; o < q->Og; o++)
        for (int64_t s = 0; s < p->nb; s++)
            memcpy(buf + (size_t)(o * p->nb * q->P + s * q->P) * (size_t)p->es,
                   g + (size_t)(((p->n0 + s) * q->O + p->grp * q->Og + o) * q->P) * (size_t)p->es, row);
}

/* ---- the direct weight gradient of a conv over few taps ----
 * When Kc = C/G * kh * kw is small (a first layer over 1-3 channels: 9 or 27
 * taps), groups 1, stride 1, no padding or dilation, the GEMM above is
 * skinny ([Og, N*P] x [N*P, Kc]) and costs a copy of all of g (gather_g) and
 * an im2col besides. Directly: with g's rows widened to x's width W (zeros
 * past OW), output position (oh, ow) reads x at flat index (oh + ki) * W + ow
 * + kj, so
 *   dw[o, c, ki, kj] = sum_n  gw[n, o] . x[n, c] shifted by ki * W + kj,
 * one dot product of (OH - 1) * W + OW contiguous elements per (n, o, tap),
 * which never leaves x's plane (in cache, as the widened plane is, for all
 * of a sample's taps). A dot product folds into 16 lanes of x's type (the
 * row fold's shape: it vectorizes), which then join the tap's lanes in
 * double over the samples. Output channels are split over the pool. */
#define KE_CONVW_DIRECT_KC 32 /* at most this many taps: beyond, the GEMM's reuse wins */

static int convw_direct_ok(const conv_geom *q) {
    return q->G == 1 && q->Kc <= KE_CONVW_DIRECT_KC && q->sh == 1 && q->sw == 1 && q->dh == 1 && q->dw == 1 &&
           q->ph == 0 && q->pw == 0 && q->OH >= 1 && q->OW >= 1;
}

typedef struct convwd_ctx {
    conv_geom g;
    const char *x, *gy;
    char *dw;
    _Atomic int oom;
} convwd_ctx;

enum { KE_CONVW_LANES = 16 };

#define KE_CONVW_DIRECT(T, sfx)                                                                          \
    static void convwd_range_##sfx(void *ctx, int64_t o0, int64_t o1) {                                  \
        enum { L = KE_CONVW_LANES };                                                                     \
        convwd_ctx *p = ctx;                                                                             \
        const conv_geom *q = &p->g;                                                                      \
        const int64_t W = q->W, len = (q->OH - 1) * W + q->OW, taps = q->kh * q->kw, Kc = q->Kc;         \
        const int64_t nw = (o1 - o0) * Kc * L;                                                           \
        size_t bytes = sizeof(double) * (size_t)(nw + Kc) + sizeof(T) * (size_t)(q->OH * W);             \
        char *buf = ke_cpu_alloc(bytes);                                                                 \
        if (!buf) {                                                                                      \
            atomic_store(&p->oom, 1);                                                                    \
            return;                                                                                      \
        }                                                                                                \
        double *acc = (double *)buf;  /* [o1 - o0][Kc][L]: the lanes, joined over the samples */         \
        int64_t *off = (int64_t *)(acc + nw); /* [Kc]: tap t's shift into x[n] */                        \
        T *restrict gw = (T *)(off + Kc); /* g's plane widened to W columns */                           \
        memset(acc, 0, sizeof(double) * (size_t)nw);                                                     \
        for (int64_t t = 0; t < Kc; t++) off[t] = ((t / taps) * q->H + (t / q->kw) % q->kh) * W + t % q->kw; \
        for (int64_t oh = 0; oh < q->OH; oh++)                                                           \
            for (int64_t ow = q->OW; ow < W; ow++) gw[oh * W + ow] = 0;                                  \
        for (int64_t n = 0; n < q->N; n++) {                                                             \
            const T *xn = (const T *)p->x + n * q->C * q->H * W;                                         \
            for (int64_t o = o0; o < o1; o++) {                                                          \
                const T *gp = (const T *)p->gy + (n * q->O + o) * q->P;                                  \
                double *ao = acc + (o - o0) * Kc * L;                                                    \
                for (int64_t oh = 0; oh < q->OH; oh++) /* short rows: a loop, not memcpy calls */        \
                    for (int64_t ow = 0; ow < q->OW; ow++) gw[oh * W + ow] = gp[oh * q->OW + ow];         \
                for (int64_t t = 0; t < Kc; t++) {                                                       \
                    const T *restrict xs = xn + off[t];                                                  \
                    T l[L];                                                                              \
                    for (int j = 0; j < L; j++) l[j] = 0;                                                \
                    int64_t i = 0;                                                                       \
                    for (; i + L <= len; i += L)                                                         \
                        for (int j = 0; j < L; j++) l[j] += gw[i + j] * xs[i + j];                       \
                    double *at = ao + t * L;                                                             \
                    for (; i < len; i++) at[0] += (double)gw[i] * (double)xs[i]; /* the tail */          \
                    for (int j = 0; j < L; j++) at[j] += (double)l[j];                                   \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (int64_t o = o0; o < o1; o++)                                                                \
            for (int64_t t = 0; t < Kc; t++) {                                                           \
                const double *a = acc + ((o - o0) * Kc + t) * L;                                         \
                double v = 0;                                                                            \
                for (int j = 0; j < L; j++) v += a[j];                                                   \
                ((T *)p->dw)[o * Kc + t] = (T)v;                                                         \
            }                                                                                            \
        ke_cpu_free(buf, bytes);                                                                         \
    }
KE_CONVW_DIRECT(float, f32)
KE_CONVW_DIRECT(double, f64)

static int convw_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    conv_ctx p = {.dt = (kl_dtype)y->dtype, .es = (int64_t)ke_dtypes[y->dtype].size, .x = ke_data(xs[0])};
    convw_geom_of(c, xs[0], xs[1], &p.g);
    const conv_geom *q = &p.g;
    const char *g = ke_data(xs[1]);
    char *dw = ke_data(y);
    size_t es = (size_t)p.es;
    if (q->N * q->P == 0 || q->Kc == 0) {
        memset(dw, 0, (size_t)(q->O * q->Kc) * es);
        return 0;
    }
    if (convw_direct_ok(q) && (p.dt == KL_F32 || p.dt == KL_F64)) {
        convwd_ctx d = {.g = *q, .x = p.x, .gy = g, .dw = dw};
        atomic_init(&d.oom, 0);
        int64_t per = q->N * q->Kc * q->OH * q->W; /* multiply-adds per output channel */
        ke_parallel_for(q->O, per >= 65536 ? 1 : 65536 / per, p.dt == KL_F64 ? convwd_range_f64 : convwd_range_f32, &d);
        return atomic_load(&d.oom) ? ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for a widened gradient plane") : 0;
    }
    size_t per_sample = (size_t)((q->Kc + q->Og) * q->P) * es;
    int64_t nb_max = (int64_t)(KE_CONV_BATCH_BYTES / per_sample);
    nb_max = nb_max < 1 ? 1 : nb_max > q->N ? q->N : nb_max;
    size_t col_bytes = (size_t)(q->Kc * nb_max * q->P) * es, g_bytes = (size_t)(q->Og * nb_max * q->P) * es;
    char *col = ke_cpu_alloc(col_bytes), *gb = ke_cpu_alloc(g_bytes);
    if (!col || !gb) {
        ke_cpu_free(col, col_bytes);
        ke_cpu_free(gb, g_bytes);
        return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for the column buffers");
    }
    p.col = col;
    for (int64_t n0 = 0; n0 < q->N; n0 += nb_max) {
        int64_t nb = q->N - n0 < nb_max ? q->N - n0 : nb_max, ld = nb * q->P;
        for (int64_t grp = 0; grp < q->G; grp++) {
            p.n0 = n0, p.nb = nb, p.grp = grp;
            ke_parallel_for(nb * q->Kc, q->P >= 16384 ? 1 : 16384 / q->P, im2col_batch_range, &p);
            gather_g(&p, g, gb);
            if (p.dt == KL_F32 || p.dt == KL_F64) ke_blas_prepare();
            /* dw_g[Og, Kc] (+)= gb[Og, ld] @ col[Kc, ld]^T */
            ke_gemm(p.dt, q->Og, q->Kc, ld, 1, gb, ld, 1, col, 1, ld, n0 ? 1 : 0,
                    dw + (size_t)(grp * q->Og * q->Kc) * es, q->Kc);
        }
    }
    ke_cpu_free(col, col_bytes);
    ke_cpu_free(gb, g_bytes);
    return 0;
}

int ke_cpu_conv2d_weight_grad(ke_call *c) { return ke_with_compute_dtype(c, convw_compute); }

/* The formula: a convolution with batch and channels of x swapping roles (x
 * as [C/G, G*N, H, W], g as the kernel [G*Og, N, OH, OW]), stride and
 * dilation swapped; the result [C/G, O, kh', kw'] is cut to the kernel (kh' >
 * kh when the last rows of x were never reached). */
int ke_decomp_conv2d_weight_grad(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_conv2d_weight_grad(c, &spec) < 0) return -1;
    conv_geom q;
    convw_geom_of(c, c->in[0], c->in[1], &q);
    kl_tensor *x = c->in[0], *g = c->in[1], *xi, *gi;
    kl_scope_begin();
    if (q.G == 1) {
        xi = kl_transpose(x, 0, 1);
        gi = kl_transpose(g, 0, 1);
    } else {
        kl_tensor *x5 = kl_reshape(x, 5, (int64_t[]){q.N, q.G, q.Cg, q.H, q.W});
        kl_tensor *g5 = kl_reshape(g, 5, (int64_t[]){q.N, q.G, q.Og, q.OH, q.OW});
        xi = kl_reshape(kl_permute(x5, 5, (int64_t[]){2, 1, 0, 3, 4}), 4, (int64_t[]){q.Cg, q.G * q.N, q.H, q.W});
        gi = kl_reshape(kl_permute(g5, 5, (int64_t[]){1, 2, 0, 3, 4}), 4, (int64_t[]){q.G * q.Og, q.N, q.OH, q.OW});
    }
    kl_conv2d_options o = {.stride = {q.dh, q.dw}, .padding = {q.ph, q.pw}, .dilation = {q.sh, q.sw}, .groups = q.G};
    kl_tensor *r = kl_conv2d(xi, gi, NULL, &o);
    r = kl_contiguous(kl_transpose(kl_narrow(kl_narrow(r, 2, 0, q.kh), 3, 0, q.kw), 0, 1));
    kl_keep(r);
    kl_scope_end();
    return r ? ke_set_out1(c, r) : -1;
}

/* ---- conv2d_input_grad -----------------------------------------------------------------
 * dx[N, C, H, W] of conv2d from the output gradient g [N, O, OH, OW] and the
 * weight w [O, C/G, kh, kw] (autograd's conv2d derivative; the row in
 * ops_nn.def). Per group, the columns cols[Kc, P] = w_g^T [Kc, Og] @ g_g
 * [Og, P] are what each output position's gradient sends back to its
 * receptive field, and col2im adds them into dx: one GEMM of depth Og, the
 * adjoint of the forward's im2col + GEMM. Samples with small outputs (P <=
 * KE_CONV_BATCH_MAX_P) sit side by side as in the forward: one GEMM of width
 * nb*P per chunk. The decomposition (conv_transpose2d: conv2d over g with
 * zeros inserted between its elements, padded, and the kernel flipped) does
 * about (kh*kw)x the multiply-adds per output element when g is padded by
 * k - 1, and an im2col of the padded gradient besides. */

static void convi_geom_of(const ke_call *c, const kl_tensor *g, const kl_tensor *w, conv_geom *q) {
    const int64_t *st = ke_attr_conv2d_input_grad_stride(&c->a), *pad = ke_attr_conv2d_input_grad_padding(&c->a),
                  *dil = ke_attr_conv2d_input_grad_dilation(&c->a), *hw = ke_attr_conv2d_input_grad_input_size(&c->a);
    q->G = ke_attr_conv2d_input_grad_groups(&c->a);
    q->N = g->shape[0], q->O = g->shape[1], q->OH = g->shape[2], q->OW = g->shape[3], q->P = q->OH * q->OW;
    q->C = w->shape[1] * q->G, q->H = hw[0], q->W = hw[1], q->kh = w->shape[2], q->kw = w->shape[3];
    q->sh = st[0], q->sw = st[1], q->ph = pad[0], q->pw = pad[1], q->dh = dil[0], q->dw = dil[1];
    q->Cg = q->C / q->G, q->Og = q->O / q->G, q->Kc = q->Cg * q->kh * q->kw;
}

int ke_infer_conv2d_input_grad(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256], b3[256];
    const kl_tensor *g = c->in[0], *w = c->in[1];
    if (c->a.nlist != 8) return ke_err(KL_ERR_INTERNAL, op, "expected 8 option values");
    if (g->dtype != w->dtype)
        return ke_err(KL_ERR_DTYPE, op, "gradient %s and weight %s must have one dtype", ke_fmt_tensor(b1, sizeof b1, g),
                      ke_fmt_tensor(b2, sizeof b2, w));
    const int64_t *hw = ke_attr_conv2d_input_grad_input_size(&c->a), groups = ke_attr_conv2d_input_grad_groups(&c->a);
    int64_t C;
    if (g->ndim != 4 || w->ndim != 4 || g->shape[1] != w->shape[0] || groups < 1 ||
        ke_mul_ov(w->shape[1], groups, &C) || hw[0] < 0 || hw[1] < 0)
        return ke_err(KL_ERR_SHAPE, op,
                      "expects a 4-D gradient [N,O,OH,OW], a 4-D weight [O,C/groups,kh,kw], groups >= 1 and a "
                      "non-negative input size, got %s, %s, groups %lld, input size %lldx%lld",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, w), (long long)groups,
                      (long long)hw[0], (long long)hw[1]);
    /* g must have the shape conv2d gives an [N, C, H, W] input with this
     * weight (its rule checks the rest; x stands in: shape and dtype only) */
    kl_tensor x = {.ndim = 4, .dtype = g->dtype, .shape = {g->shape[0], C, hw[0], hw[1]}};
    kl_tensor *fin[2] = {&x, c->in[1]};
    ke_call fwd = {.op = KE_OP_conv2d, .nin = 2, .in = fin};
    const int64_t *st = ke_attr_conv2d_input_grad_stride(&c->a), *pad = ke_attr_conv2d_input_grad_padding(&c->a),
                  *dil = ke_attr_conv2d_input_grad_dilation(&c->a);
    int64_t list[6] = {st[0], st[1], pad[0], pad[1], dil[0], dil[1]};
    if (ke_set_list(&fwd, 6, list)) return -1;
    ke_attr_set_conv2d_groups(&fwd.a, groups);
    ke_outspec y;
    if (ke_infer_conv2d(&fwd, &y) < 0) return -1;
    if (memcmp(y.shape, g->shape, sizeof(int64_t) * 4))
        return ke_err(KL_ERR_SHAPE, op, "gradient %s does not have conv2d's output shape %s for input %s",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_shape(b2, sizeof b2, 4, y.shape),
                      ke_fmt_shape(b3, sizeof b3, 4, x.shape));
    out[0].dtype = (kl_dtype)g->dtype;
    out[0].ndim = 4;
    memcpy(out[0].shape, x.shape, sizeof(int64_t) * 4);
    c->compute = ke_compute_dtype(out[0].dtype);
    return 1;
}

/* Adds rows [r0, r1) of one sample's group columns (row r, ld elements apart:
 * (channel, ki, kj), as im2col lays them out) into its planes dx: the
 * adjoint of im2col, skipping the padding. */
#define KE_COL2IM(T, sfx)                                                                                 \
    static void col2im_##sfx(const conv_geom *g, const T *col, int64_t ld, T *dx, int64_t r0, int64_t r1) { \
        for (int64_t r = r0; r < r1; r++) {                                                                \
            int64_t kj = r % g->kw, ki = (r / g->kw) % g->kh, ch = r / (g->kw * g->kh);                    \
            T *xp = dx + ch * g->H * g->W;                                                                 \
            int64_t off = kj * g->dw - g->pw;                                                              \
            int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;                                        \
            int64_t hi = g->W - 1 - off < 0 ? 0 : (g->W - 1 - off) / g->sw + 1;                            \
            if (hi > g->OW) hi = g->OW;                                                                    \
            if (lo > hi) lo = hi;                                                                          \
            for (int64_t oh = 0; oh < g->OH; oh++) {                                                       \
                int64_t ih = oh * g->sh - g->ph + ki * g->dh;                                              \
                if (ih < 0 || ih >= g->H) continue;                                                        \
                const T *restrict row = col + r * ld + oh * g->OW;                                         \
                T *restrict xr = xp + ih * g->W;                                                           \
                if (g->sw == 1)                                                                            \
                    for (int64_t ow = lo; ow < hi; ow++) xr[ow + off] += row[ow];                          \
                else                                                                                       \
                    for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sw + off] += row[ow];                  \
            }                                                                                              \
        }                                                                                                  \
    }
KE_COL2IM(float, f32)
KE_COL2IM(double, f64)

typedef struct convi_ctx {
    conv_geom g;
    kl_dtype dt;
    int64_t es, n0, ld, grp;
    const char *col;
    char *dx;
} convi_ctx;

/* Items t in [t0, t1) are (sample s = t / Cg, channel ch = t % Cg) of the
 * chunk: a channel's kh*kw rows land in its own plane, so items never share
 * an element of dx. */
static void col2im_range(void *ctx, int64_t t0, int64_t t1) {
    const convi_ctx *p = ctx;
    const conv_geom *q = &p->g;
    int64_t taps = q->kh * q->kw;
    for (int64_t t = t0; t < t1; t++) {
        int64_t s = t / q->Cg, ch = t % q->Cg;
        size_t plane = (size_t)(((p->n0 + s) * q->C + p->grp * q->Cg) * q->H * q->W);
        if (p->dt == KL_F64)
            col2im_f64(q, (const double *)p->col + s * q->P, p->ld, (double *)p->dx + plane, ch * taps, (ch + 1) * taps);
        else
            col2im_f32(q, (const float *)p->col + s * q->P, p->ld, (float *)p->dx + plane, ch * taps, (ch + 1) * taps);
    }
}

static int convi_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    convi_ctx p = {.dt = (kl_dtype)y->dtype, .es = (int64_t)ke_dtypes[y->dtype].size, .dx = ke_data(y)};
    convi_geom_of(c, xs[0], xs[1], &p.g);
    const conv_geom *q = &p.g;
    const char *g = ke_data(xs[0]), *w = ke_data(xs[1]);
    size_t es = (size_t)p.es;
    memset(p.dx, 0, (size_t)(q->N * q->C * q->H * q->W) * es);
    if (q->N * q->P == 0 || q->Kc == 0 || q->Og == 0) return 0;
    /* a chunk of nb samples: g's planes side by side when P is small (as the
     * forward's batched path), else one sample at a time read in place */
    int64_t nb_max = 1;
    if (q->P <= KE_CONV_BATCH_MAX_P) {
        nb_max = (int64_t)(KE_CONV_BATCH_BYTES / ((size_t)((q->Kc + q->Og) * q->P) * es));
        nb_max = nb_max < 1 ? 1 : nb_max > q->N ? q->N : nb_max;
    }
    size_t col_bytes = (size_t)(q->Kc * nb_max * q->P) * es, g_bytes = nb_max > 1 ? (size_t)(q->Og * nb_max * q->P) * es : 0;
    char *col = ke_cpu_alloc(col_bytes), *gb = g_bytes ? ke_cpu_alloc(g_bytes) : NULL;
    if (!col || (g_bytes && !gb)) {
        ke_cpu_free(col, col_bytes);
        ke_cpu_free(gb, g_bytes);
        return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for the column buffers");
    }
    conv_ctx gather = {.g = *q, .es = p.es};
    p.col = col;
    int64_t per = q->kh * q->kw * q->P; /* elements one item adds */
    for (int64_t n0 = 0; n0 < q->N; n0 += nb_max) {
        int64_t nb = q->N - n0 < nb_max ? q->N - n0 : nb_max, ld = nb * q->P;
        for (int64_t grp = 0; grp < q->G; grp++) {
            const char *src = g + (size_t)((n0 * q->O + grp * q->Og) * q->P) * es;
            if (nb > 1) {
                gather.n0 = n0, gather.nb = nb, gather.grp = grp;
                gather_g(&gather, g, gb);
                src = gb;
            }
            if (p.dt == KL_F32 || p.dt == KL_F64) ke_blas_prepare();
            /* cols[Kc, ld] = w_g^T [Kc, Og] @ src [Og, ld] */
            ke_gemm(p.dt, q->Kc, ld, q->Og, 1, w + (size_t)(grp * q->Og * q->Kc) * es, 1, q->Kc, src, ld, 1, 0, col, ld);
            p.n0 = n0, p.ld = ld, p.grp = grp;
            ke_parallel_for(nb * q->Cg, per >= 16384 ? 1 : 16384 / per, col2im_range, &p);
        }
    }
    ke_cpu_free(col, col_bytes);
    ke_cpu_free(gb, g_bytes);
    return 0;
}

int ke_cpu_conv2d_input_grad(ke_call *c) { return ke_with_compute_dtype(c, convi_compute); }

/* The formula: conv_transpose2d with the output padding that gives back H x W
 * (rows and columns no window reached get 0). */
int ke_decomp_conv2d_input_grad(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_conv2d_input_grad(c, &spec) < 0) return -1;
    conv_geom q;
    convi_geom_of(c, c->in[0], c->in[1], &q);
    kl_conv_transpose2d_options o = kl_conv_transpose2d_options_default();
    int64_t in[2] = {q.H, q.W}, out[2] = {q.OH, q.OW}, st[2] = {q.sh, q.sw}, pad[2] = {q.ph, q.pw},
            dil[2] = {q.dh, q.dw}, k[2] = {q.kh, q.kw};
    for (int d = 0; d < 2; d++) {
        o.stride[d] = st[d], o.padding[d] = pad[d], o.dilation[d] = dil[d];
        o.output_padding[d] = in[d] - ((out[d] - 1) * st[d] - 2 * pad[d] + dil[d] * (k[d] - 1) + 1);
    }
    o.groups = q.G;
    kl_tensor *r = kl_conv_transpose2d(c->in[0], c->in[1], NULL, &o);
    return r ? ke_set_out1(c, r) : -1;
}

/* ---- pooling ------------------------------------------------------------------------------ */

/* PyTorch's pooling_output_shape: floor or ceil division, and with ceil_mode
 * the last window must start inside the input or its left padding. */
static int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, int ceil_mode, int *ov) {
    /* in, pad >= 0, pad <= k / 2, k, s, d >= 1 (checked by the caller) */
    int64_t padded, span, num;
    if (ke_mul_ov(2, pad, &padded) || ke_add_ov(padded, in, &padded) || ke_mul_ov(d, k - 1, &span) ||
        ke_add_ov(padded - 1 - span, ceil_mode ? s - 1 : 0, &num)) {
        *ov = 1;
        return 0;
    }
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + pad) o--; /* (o - 1) * s <= num < padded: no overflow */
    return o;
}

/* avg_pool2d and max_pool2d_indices have max_pool2d's attributes
 * (AS(max_pool2d) in their rows), read through its accessors. */
int ke_infer_pool2d(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256];
    if (ke_infer_same(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0];
    const int64_t *k = ke_attr_max_pool2d_kernel_size(&c->a), *s = ke_attr_max_pool2d_stride(&c->a),
                  *pad = ke_attr_max_pool2d_padding(&c->a), *dil = ke_attr_max_pool2d_dilation(&c->a);
    if (c->a.nlist != 8) return ke_err(KL_ERR_INTERNAL, op, "expected 8 option values");
    if (k[0] < 1 || k[1] < 1 || s[0] < 1 || s[1] < 1 || dil[0] < 1 || dil[1] < 1 || pad[0] < 0 || pad[1] < 0)
        return ke_err(KL_ERR_ARG, op,
                      "kernel (%lld, %lld), stride (%lld, %lld) and dilation (%lld, %lld) must be positive and "
                      "padding (%lld, %lld) non-negative",
                      (long long)k[0], (long long)k[1], (long long)s[0], (long long)s[1], (long long)dil[0],
                      (long long)dil[1], (long long)pad[0], (long long)pad[1]);
    if (c->op == KE_OP_avg_pool2d && (dil[0] != 1 || dil[1] != 1))
        return ke_err(KL_ERR_ARG, op, "dilation must be 1, got (%lld, %lld)", (long long)dil[0], (long long)dil[1]);
    if (pad[0] > k[0] / 2 || pad[1] > k[1] / 2)
        return ke_err(KL_ERR_ARG, op, "padding (%lld, %lld) should be at most half of the kernel size (%lld, %lld)",
                      (long long)pad[0], (long long)pad[1], (long long)k[0], (long long)k[1]);
    if (x->ndim != 3 && x->ndim != 4)
        return ke_err(KL_ERR_SHAPE, op, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    int b = x->ndim == 4;
    int64_t o[2];
    int ov = 0;
    for (int d = 0; d < 2; d++)
        o[d] = pool_out(x->shape[b + 1 + d], k[d], pad[d], s[d], dil[d], ke_attr_max_pool2d_ceil_mode(&c->a), &ov);
    if (ov)
        return ke_err(KL_ERR_OVERFLOW, op, "kernel (%lld, %lld), padding (%lld, %lld) and dilation (%lld, %lld) overflow",
                      (long long)k[0], (long long)k[1], (long long)pad[0], (long long)pad[1], (long long)dil[0],
                      (long long)dil[1]);
    if (x->shape[b] == 0 || o[0] < 1 || o[1] < 1)
        return ke_err(KL_ERR_SHAPE, op, "output size %lldx%lld is too small for input %s", (long long)o[0],
                      (long long)o[1], ke_fmt_tensor(b1, sizeof b1, x));
    out->shape[b + 1] = o[0];
    out->shape[b + 2] = o[1];
    return 1;
}

/* Taps i in [first, end) of a window starting at base with dilation d are the
 * ones inside [0, n) (and below k); the kernels loop over those only. */
static inline int64_t pl_first_tap(int64_t base, int64_t d) { return base >= 0 ? 0 : (-base - 1) / d + 1; }
static inline int64_t pl_end_tap(int64_t base, int64_t d, int64_t n, int64_t k) {
    if (base > n - 1) return 0;
    int64_t e = (n - 1 - base) / d + 1;
    return e < k ? e : k;
}

int ke_pool_2x2(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
             int64_t H, int64_t W, int64_t OH, int64_t OW) {
    return kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 && dw == 1 && 2 * OH <= H &&
           2 * OW <= W;
}

typedef struct pool_ctx {
    const char *x;
    char *y;
    int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;
} pool_ctx;

/* maxpool_*, avgpool_*: one plane per task (tmpl/pool.h) */
#define KE_FADD(s, v) ((s) + (v))
#define KE_IADD(s, v) ((int64_t)((uint64_t)(s) + (uint64_t)(int64_t)(v)))
#define KE_NONAN(v) 0
#define PL_T float
#define PL_A float
#define PL_SFX f32
#define PL_2X2(x, y, planes, p) ke_maxpool2x2_f32(x, y, planes, (p)->H, (p)->W, (p)->OH, (p)->OW)
#define PL_LOWEST -INFINITY
#define PL_ISNAN isnan
#define PL_ADD KE_FADD
#include "tmpl/pool.h"
#define PL_T double
#define PL_A double
#define PL_SFX f64
#define PL_LOWEST -INFINITY
#define PL_ISNAN isnan
#define PL_ADD KE_FADD
#include "tmpl/pool.h"
#define PL_T int32_t
#define PL_A int64_t
#define PL_SFX i32
#define PL_LOWEST INT32_MIN
#define PL_ISNAN KE_NONAN
#define PL_ADD KE_IADD
#include "tmpl/pool.h"
#define PL_T int64_t
#define PL_A int64_t
#define PL_SFX i64
#define PL_LOWEST INT64_MIN
#define PL_ISNAN KE_NONAN
#define PL_ADD KE_IADD
#include "tmpl/pool.h"
#define PL_T uint8_t
#define PL_A int64_t
#define PL_SFX u8
#define PL_LOWEST 0
#define PL_ISNAN KE_NONAN
#define PL_ADD KE_IADD
#include "tmpl/pool.h"

static const ke_range_fn max_pools[KL_NUM_DTYPES] = {[KL_F32] = maxpool_f32, [KL_F64] = maxpool_f64,
                                                     [KL_I32] = maxpool_i32, [KL_I64] = maxpool_i64,
                                                     [KL_U8] = maxpool_u8};
static const ke_range_fn avg_pools[KL_NUM_DTYPES] = {[KL_F32] = avgpool_f32, [KL_F64] = avgpool_f64,
                                                     [KL_I32] = avgpool_i32, [KL_I64] = avgpool_i64,
                                                     [KL_U8] = avgpool_u8};

static int pool_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    const kl_tensor *x = xs[0];
    int b = x->ndim == 4;
    const int64_t *k = ke_attr_max_pool2d_kernel_size(&c->a), *s = ke_attr_max_pool2d_stride(&c->a),
                  *pad = ke_attr_max_pool2d_padding(&c->a), *dil = ke_attr_max_pool2d_dilation(&c->a);
    pool_ctx p = {ke_data(x), ke_data(y), x->shape[b + 1], x->shape[b + 2], y->shape[b + 1], y->shape[b + 2],
                  k[0], k[1], s[0], s[1], pad[0], pad[1], dil[0], dil[1],
                  ke_attr_max_pool2d_count_include_pad(&c->a)};
    int64_t planes = (b ? x->shape[0] : 1) * x->shape[b], per;
    if (ke_mul_ov(p.OH * p.OW, p.kh, &per) || ke_mul_ov(per, p.kw, &per)) per = INT64_MAX; /* huge kernels */
    const ke_range_fn *fns = c->op == KE_OP_max_pool2d ? max_pools : avg_pools;
    ke_parallel_for(planes, per >= 16384 ? 1 : 16384 / (per ? per : 1), fns[x->dtype], &p);
    return 0;
}

int ke_cpu_max_pool2d(ke_call *c) { return ke_with_compute_dtype(c, pool_compute); }
int ke_cpu_avg_pool2d(ke_call *c) { return ke_with_compute_dtype(c, pool_compute); }

static kl_tensor *pool_call(int op, kl_tensor *x, const kl_pool2d_options *o) {
    if (!o) {
        ke_err(KL_ERR_NULL_ARG, ke_ops[op].name, "options pointer is NULL (use kl_pool2d_options_default)");
        return NULL;
    }
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    int64_t list[8] = {o->kernel[0], o->kernel[1], o->stride[0],   o->stride[1],
                       o->padding[0], o->padding[1], o->dilation[0], o->dilation[1]};
    ke_set_list(&c, 8, list);
    ke_attr_set_max_pool2d_ceil_mode(&c.a, o->ceil_mode);
    ke_attr_set_max_pool2d_count_include_pad(&c.a, o->count_include_pad);
    return ke_call1(&c);
}

kl_tensor *kl_max_pool2d(kl_tensor *x, const kl_pool2d_options *opts) { return pool_call(KE_OP_max_pool2d, x, opts); }
kl_tensor *kl_avg_pool2d(kl_tensor *x, const kl_pool2d_options *opts) { return pool_call(KE_OP_avg_pool2d, x, opts); }

/* ---- conv1d and conv_transpose2d: conv2d in other shapes ------------------------------------ */

kl_conv1d_options kl_conv1d_options_default(void) {
    return (kl_conv1d_options){.stride = 1, .padding = 0, .dilation = 1, .groups = 1};
}

kl_conv_transpose2d_options kl_conv_transpose2d_options_default(void) {
    return (kl_conv_transpose2d_options){
        .stride = {1, 1}, .padding = {0, 0}, .output_padding = {0, 0}, .dilation = {1, 1}, .groups = 1};
}

/* x [N, C, L] (or [C, L]) is x [N, C, 1, L] and w [O, C/G, k] is w [O, C/G,
 * 1, k]: one conv2d, so its kernel, derivative and compiled form serve
 * conv1d unchanged. The checks here name conv1d's own shapes; conv2d's rule
 * then has nothing left to refuse. */
int ke_decomp_conv1d(ke_call *c) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int hb = ke_attr_conv1d_has_bias(&c->a);
    if (c->nin != 2 + hb) return ke_err(KL_ERR_ARG, op, "bias flag and the %d inputs disagree", c->nin);
    kl_tensor *x = c->in[0], *w = c->in[1], *bias = hb ? c->in[2] : NULL;
    int64_t s = ke_attr_conv1d_stride(&c->a), p = ke_attr_conv1d_padding(&c->a), d = ke_attr_conv1d_dilation(&c->a),
            g = ke_attr_conv1d_groups(&c->a);
    if (s < 1 || p < 0 || d < 1 || g < 1)
        return ke_err(KL_ERR_ARG, op,
                      "stride (%lld), dilation (%lld) and groups (%lld) must be positive and padding (%lld) "
                      "non-negative",
                      (long long)s, (long long)d, (long long)g, (long long)p);
    if (x->ndim != 2 && x->ndim != 3)
        return ke_err(KL_ERR_SHAPE, op, "expects a 2-D [C,L] or 3-D [N,C,L] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    if (w->ndim != 3 || w->shape[2] < 1)
        return ke_err(KL_ERR_SHAPE, op, "expects a 3-D weight [O,C/groups,k] with a non-empty kernel, got %s",
                      ke_fmt_tensor(b1, sizeof b1, w));
    int64_t C = x->shape[x->ndim - 2], L = x->shape[x->ndim - 1], span, padded, wc = 0;
    int wc_ov = ke_mul_ov(w->shape[1], g, &wc); /* (groups comes from the caller) */
    if (w->shape[0] % g || wc_ov || C != wc)
        return ke_err(KL_ERR_SHAPE, op,
                      "weight %s with groups = %lld expects out channels divisible by groups and an input with "
                      "%s%lld channels, got %s",
                      ke_fmt_tensor(b2, sizeof b2, w), (long long)g, wc_ov ? "more than " : "",
                      (long long)(wc_ov ? INT64_MAX : wc), ke_fmt_tensor(b1, sizeof b1, x));
    if (ke_mul_ov(d, w->shape[2] - 1, &span) || ke_add_ov(span, 1, &span) || ke_mul_ov(p, 2, &padded) ||
        ke_add_ov(padded, L, &padded) || span > padded)
        return ke_err(KL_ERR_SHAPE, op, "padded input length is smaller than the dilated kernel (input %s, weight %s)",
                      ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, w));
    kl_conv2d_options o = {.stride = {1, s}, .padding = {0, p}, .dilation = {1, d}, .groups = g};
    kl_scope_begin();
    kl_tensor *y = kl_squeeze(kl_conv2d(kl_unsqueeze(x, -2), kl_unsqueeze(w, 2), bias, &o), -2);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_tensor *kl_conv1d(kl_tensor *x, kl_tensor *w, kl_tensor *bias, const kl_conv1d_options *opts) {
    kl_conv1d_options o = opts ? *opts : kl_conv1d_options_default();
    kl_tensor *in[3] = {x, w, bias};
    ke_call c = {.op = KE_OP_conv1d, .nin = bias ? 3 : 2, .in = in};
    ke_attr_set_conv1d_stride(&c.a, o.stride);
    ke_attr_set_conv1d_padding(&c.a, o.padding);
    ke_attr_set_conv1d_dilation(&c.a, o.dilation);
    ke_attr_set_conv1d_groups(&c.a, o.groups);
    ke_attr_set_conv1d_has_bias(&c.a, bias != NULL);
    return ke_call1(&c);
}

/* conv_transpose2d(x, w) is the gradient of conv2d(., w) with respect to its
 * input, for an output of the size
 *   (H - 1) s - 2 p + d (k - 1) + output_padding + 1,
 * written as a conv2d: x gets s - 1 zeros after each element (zero
 * insertion: pad an extra unit dim and fold it in), then pads (negative ones
 * crop) so that
 *   y[oh] = sum_ki x[(oh + p - ki d) / s] w[ki]
 * becomes a stride-1 correlation with the flipped, in/out-swapped kernel at
 * dilation d: lo = d (k - 1) - p in front and whatever makes the length
 * OH + d (k - 1) behind. conv2d's derivative (d_nn.c) calls this. */
int ke_decomp_conv_transpose2d(ke_call *c) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int hb = ke_attr_conv_transpose2d_has_bias(&c->a);
    if (c->nin != 2 + hb) return ke_err(KL_ERR_ARG, op, "bias flag and the %d inputs disagree", c->nin);
    if (c->a.nlist != 8) return ke_err(KL_ERR_INTERNAL, op, "expected 8 option values");
    kl_tensor *x = c->in[0], *w = c->in[1], *bias = hb ? c->in[2] : NULL;
    const int64_t *st = ke_attr_conv_transpose2d_stride(&c->a), *pad = ke_attr_conv_transpose2d_padding(&c->a),
                  *op_ = ke_attr_conv_transpose2d_output_padding(&c->a), *dil = ke_attr_conv_transpose2d_dilation(&c->a);
    int64_t G = ke_attr_conv_transpose2d_groups(&c->a);
    for (int d = 0; d < 2; d++)
        if (st[d] < 1 || dil[d] < 1 || pad[d] < 0 || op_[d] < 0 || G < 1 ||
            (op_[d] >= st[d] && op_[d] >= dil[d]))
            return ke_err(KL_ERR_ARG, op,
                          "stride (%lld, %lld), dilation (%lld, %lld) and groups (%lld) must be positive, padding "
                          "(%lld, %lld) non-negative and output_padding (%lld, %lld) non-negative and smaller than "
                          "either stride or dilation",
                          (long long)st[0], (long long)st[1], (long long)dil[0], (long long)dil[1], (long long)G,
                          (long long)pad[0], (long long)pad[1], (long long)op_[0], (long long)op_[1]);
    if (x->ndim != 3 && x->ndim != 4)
        return ke_err(KL_ERR_SHAPE, op, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    if (w->ndim != 4 || w->shape[2] < 1 || w->shape[3] < 1)
        return ke_err(KL_ERR_SHAPE, op,
                      "expects a 4-D weight [C_in,C_out/groups,kh,kw] with a non-empty kernel, got %s",
                      ke_fmt_tensor(b1, sizeof b1, w));
    int b = x->ndim == 4;
    int64_t Cin = x->shape[b], Cg = w->shape[1], Og = Cin / G, kh = w->shape[2], kw = w->shape[3], k[2] = {kh, kw};
    if (Cin % G || w->shape[0] != Cin)
        return ke_err(KL_ERR_SHAPE, op,
                      "weight %s with groups = %lld expects an input whose %lld channels are divisible by groups, got %s",
                      ke_fmt_tensor(b2, sizeof b2, w), (long long)G, (long long)w->shape[0],
                      ke_fmt_tensor(b1, sizeof b1, x));
    int64_t Cout;
    if (ke_mul_ov(Cg, G, &Cout))
        return ke_err(KL_ERR_SHAPE, op, "output channels of weight %s times groups overflow",
                      ke_fmt_tensor(b2, sizeof b2, w));
    if (bias && (bias->ndim != 1 || bias->shape[0] != Cout))
        return ke_err(KL_ERR_SHAPE, op, "bias %s must have shape [%lld]", ke_fmt_tensor(b1, sizeof b1, bias),
                      (long long)Cout);
    int64_t in[2] = {x->shape[b + 1], x->shape[b + 2]}, out[2], len[2], lo[2], hi[2];
    for (int d = 0; d < 2; d++) {
        /* out = (in - 1) s - 2 p + d (k - 1) + op + 1, checked */
        int64_t t, u;
        if (in[d] < 1 || ke_mul_ov(in[d] - 1, st[d], &t) || ke_mul_ov(dil[d], k[d] - 1, &u) || ke_add_ov(t, u, &t) ||
            ke_add_ov(t, op_[d] + 1, &t) || ke_mul_ov(in[d], st[d], &len[d]))
            return ke_err(KL_ERR_SHAPE, op, "output size of input %s overflows or the input is empty",
                          ke_fmt_tensor(b1, sizeof b1, x));
        out[d] = t - 2 * pad[d];
        if (out[d] < 1)
            return ke_err(KL_ERR_SHAPE, op, "output size %lld along dim %d is not positive (input %s, weight %s)",
                          (long long)out[d], d + 2, ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, w));
        lo[d] = u - pad[d];
        hi[d] = out[d] + u - lo[d] - len[d];
    }
    kl_scope_begin();
    kl_device dev = kl_device_of(x);
    kl_tensor *g = b ? x : kl_unsqueeze(x, 0);
    int64_t N = b ? x->shape[0] : 1;
    /* weight [G*Og, Cg, kh, kw] -> [G*Cg, Og, kh, kw], flipped */
    kl_tensor *wt = G == 1 ? kl_transpose(w, 0, 1)
                           : kl_reshape(kl_transpose(kl_reshape(w, 5, (int64_t[]){G, Og, Cg, kh, kw}), 1, 2), 4,
                                        (int64_t[]){G * Cg, Og, kh, kw});
    if (kh > 1) wt = kl_index_select(wt, 2, kl_to_device(kl_arange((double)(kh - 1), -1, -1, KL_I64), dev));
    if (kw > 1) wt = kl_index_select(wt, 3, kl_to_device(kl_arange((double)(kw - 1), -1, -1, KL_I64), dev));
    if (st[1] > 1)
        g = kl_reshape(kl_pad(kl_unsqueeze(g, 4), 2, (int64_t[]){0, st[1] - 1}, 0), 4,
                       (int64_t[]){N, Cin, in[0], len[1]});
    if (st[0] > 1)
        g = kl_reshape(kl_pad(kl_unsqueeze(g, 3), 4, (int64_t[]){0, 0, 0, st[0] - 1}, 0), 4,
                       (int64_t[]){N, Cin, len[0], len[1]});
    kl_conv2d_options o = kl_conv2d_options_default();
    o.dilation[0] = dil[0], o.dilation[1] = dil[1], o.groups = G;
    if (lo[0] == hi[0] && lo[1] == hi[1] && lo[0] >= 0 && lo[1] >= 0)
        o.padding[0] = lo[0], o.padding[1] = lo[1];
    else
        g = kl_pad(g, 4, (int64_t[]){lo[1], hi[1], lo[0], hi[0]}, 0);
    kl_tensor *y = kl_conv2d(g, wt, bias, &o);
    if (!b) y = kl_squeeze(y, 0);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_tensor *kl_conv_transpose2d(kl_tensor *x, kl_tensor *w, kl_tensor *bias, const kl_conv_transpose2d_options *opts) {
    kl_conv_transpose2d_options o = opts ? *opts : kl_conv_transpose2d_options_default();
    kl_tensor *in[3] = {x, w, bias};
    ke_call c = {.op = KE_OP_conv_transpose2d, .nin = bias ? 3 : 2, .in = in};
    int64_t list[8] = {o.stride[0],         o.stride[1],         o.padding[0],  o.padding[1],
                       o.output_padding[0], o.output_padding[1], o.dilation[0], o.dilation[1]};
    ke_set_list(&c, 8, list);
    ke_attr_set_conv_transpose2d_groups(&c.a, o.groups);
    ke_attr_set_conv_transpose2d_has_bias(&c.a, bias != NULL);
    return ke_call1(&c);
}

/* ---- adaptive_avg_pool2d ------------------------------------------------------------------- */

/* PyTorch's windows: output o of n over an input of length in covers
 * [floor(o in / n), ceil((o + 1) in / n)). */
static int64_t adaptive_start(int64_t o, int64_t n, int64_t in) { return (o * in) / n; }
static int64_t adaptive_end(int64_t o, int64_t n, int64_t in) { return ((o + 1) * in + n - 1) / n; }

int ke_infer_adaptive_avg_pool2d(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256];
    if (ke_infer_same(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0];
    const int64_t *os = ke_attr_adaptive_avg_pool2d_output_size(&c->a);
    if (c->a.nlist != 2) return ke_err(KL_ERR_INTERNAL, op, "expected 2 option values");
    if (x->ndim != 3 && x->ndim != 4)
        return ke_err(KL_ERR_SHAPE, op, "expects a 3-D [C,H,W] or 4-D [N,C,H,W] input, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    int b = x->ndim == 4;
    if (x->shape[b] == 0 || x->shape[b + 1] == 0 || x->shape[b + 2] == 0)
        return ke_err(KL_ERR_SHAPE, op, "expects non-empty channel and spatial dims, got %s",
                      ke_fmt_tensor(b1, sizeof b1, x));
    /* o * in must not overflow in the window formula */
    int64_t t;
    if (os[0] < 0 || os[1] < 0 || os[0] == INT64_MAX || os[1] == INT64_MAX ||
        ke_mul_ov(os[0] + 1, x->shape[b + 1], &t) || ke_mul_ov(os[1] + 1, x->shape[b + 2], &t))
        return ke_err(KL_ERR_ARG, op, "output size (%lld, %lld) must be non-negative and fit input %s",
                      (long long)os[0], (long long)os[1], ke_fmt_tensor(b1, sizeof b1, x));
    out->shape[b + 1] = os[0];
    out->shape[b + 2] = os[1];
    return 1;
}

typedef struct adaptive_ctx {
    const char *x;
    char *y;
    int64_t H, W, OH, OW;
} adaptive_ctx;

/* One plane per index: each output is its window's sum (in double) over the
 * window's size, as PyTorch's kernel computes it. */
#define KE_ADAPTIVE(T, sfx)                                                                               \
    static void adaptive_##sfx(void *ctx, int64_t p0, int64_t p1) {                                       \
        const adaptive_ctx *p = ctx;                                                                      \
        for (int64_t pl = p0; pl < p1; pl++) {                                                            \
            const T *x = (const T *)p->x + pl * p->H * p->W;                                              \
            T *y = (T *)p->y + pl * p->OH * p->OW;                                                        \
            for (int64_t oh = 0; oh < p->OH; oh++) {                                                      \
                int64_t hs = adaptive_start(oh, p->OH, p->H), he = adaptive_end(oh, p->OH, p->H);         \
                for (int64_t ow = 0; ow < p->OW; ow++) {                                                  \
                    int64_t ws = adaptive_start(ow, p->OW, p->W), we = adaptive_end(ow, p->OW, p->W);     \
                    double s = 0;                                                                         \
                    for (int64_t ih = hs; ih < he; ih++)                                                  \
                        for (int64_t iw = ws; iw < we; iw++) s += x[ih * p->W + iw];                      \
                    y[oh * p->OW + ow] = (T)(s / (double)((he - hs) * (we - ws)));                        \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
    }
KE_ADAPTIVE(float, f32)
KE_ADAPTIVE(double, f64)

static int adaptive_compute(ke_call *c, kl_tensor *const *xs, kl_tensor *y) {
    const kl_tensor *x = xs[0];
    int b = x->ndim == 4;
    adaptive_ctx p = {ke_data(x), ke_data(y), x->shape[b + 1], x->shape[b + 2], y->shape[b + 1], y->shape[b + 2]};
    int64_t planes = (b ? x->shape[0] : 1) * x->shape[b], per = p.H * p.W + p.OH * p.OW;
    if (p.OH * p.OW == 0) return 0;
    (void)c;
    ke_parallel_for(planes, per >= 16384 ? 1 : 16384 / per, y->dtype == KL_F64 ? adaptive_f64 : adaptive_f32, &p);
    return 0;
}

int ke_cpu_adaptive_avg_pool2d(ke_call *c) { return ke_with_compute_dtype(c, adaptive_compute); }

kl_tensor *kl_adaptive_avg_pool2d(kl_tensor *x, int64_t out_h, int64_t out_w) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_adaptive_avg_pool2d, .nin = 1, .in = in};
    ke_set_list(&c, 2, (int64_t[]){out_h, out_w});
    return ke_call1(&c);
}
