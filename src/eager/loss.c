/*
 * loss.c — losses (rows in ops_nn.def): cross_entropy and nll_loss over int64
 * class indices, with PyTorch's ignore_index (-100 by default: such targets
 * add 0 and leave the mean's denominator), class weights (the mean divides by
 * the weights of the rows not ignored) and label smoothing, and cross_entropy
 * over class probabilities; mse_loss and binary_cross_entropy_with_logits.
 *
 * All are composites whose decompositions use kl_ ops (log_softmax, gather,
 * where, sum, ...). cross_entropy has a fused kernel (one log-sum-exp pass
 * per row, no log-probability tensor) and nll_loss a gather loop; both check
 * every target first so a bad class index is an error naming it, never a
 * stray read. Sums over rows run in double, in row order (deterministic).
 */
#include "kernels_nn.h"
#include "threadpool.h"

#include <math.h>

#define KE_IGNORE_INDEX (-100)


/* nll_loss is read through cross_entropy's accessors (same slots). */
_Static_assert(KE_ATTR_SAME_SLOT(cross_entropy_ignore_index, nll_loss_ignore_index),
               "nll_loss's ignore_index is cross_entropy's");
_Static_assert(KE_ATTR_SAME_SLOT(cross_entropy_has_weight, nll_loss_has_weight),
               "nll_loss's has_weight is cross_entropy's");

static int check_reduction(ke_call *c) {
    int64_t r = ke_attr_reduction(&c->a);
    if (r != KL_REDUCE_NONE && r != KL_REDUCE_MEAN && r != KL_REDUCE_SUM)
        return ke_err(KL_ERR_ARG, ke_opname(c), "invalid reduction %lld (expected KL_REDUCE_NONE, MEAN or SUM)",
                      (long long)r);
    return 0;
}

/* The class dim of the input: 0 for unbatched [C], else 1 ([N, C, d...]). */
static int class_dim(const kl_tensor *x) { return x->ndim == 1 ? 0 : 1; }

/* ---- cross_entropy / nll_loss ------------------------------------------------------------ */

/* Inputs x, target[, weight] (has_weight). A floating target holds class
 * probabilities (cross_entropy only, PyTorch's rule: the input's shape). */
static bool has_weight(const ke_call *c) { return ke_attr_cross_entropy_has_weight(&c->a); }
static bool prob_target(const ke_call *c) { return ke_is_float((kl_dtype)c->in[1]->dtype); }

/* input [C] with target [], [N, C] with [N], or [N, C, d1...] with [N, d1...];
 * probabilities: target of the input's shape; weight [C]. */
int ke_infer_class_loss(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256], b3[200];
    bool hw = has_weight(c);
    if (c->nin != 2 + hw)
        return ke_err(KL_ERR_ARG, op, "expects %d inputs (input, target%s), got %d", 2 + hw, hw ? ", weight" : "",
                      c->nin);
    const kl_tensor *x = c->in[0], *t = c->in[1];
    if (check_reduction(c)) return -1;
    if (!ke_is_float((kl_dtype)x->dtype))
        return ke_err(KL_ERR_DTYPE, op, "expects a floating-point input, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    if (x->ndim == 0)
        return ke_err(KL_ERR_SHAPE, op, "input must have a class dim, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    int64_t C = x->shape[class_dim(x)];
    if (hw) {
        const kl_tensor *w = c->in[2];
        if (w->ndim != 1 || w->shape[0] != C)
            return ke_err(KL_ERR_SHAPE, op, "weight %s must hold one value per class (%lld classes in input %s)",
                          ke_fmt_tensor(b1, sizeof b1, w), (long long)C, ke_fmt_tensor(b2, sizeof b2, x));
        if (w->dtype != x->dtype)
            return ke_err(KL_ERR_DTYPE, op, "weight %s must have the input's dtype (input %s)",
                          ke_fmt_tensor(b1, sizeof b1, w), ke_fmt_tensor(b2, sizeof b2, x));
    }
    int64_t want[KL_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != class_dim(x)) want[nd++] = x->shape[d];
    if (c->op == KE_OP_cross_entropy && prob_target(c)) {
        if (t->dtype != x->dtype || t->ndim != x->ndim || memcmp(t->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
            return ke_err(KL_ERR_SHAPE, op, "probability target %s must have the input's shape and dtype (input %s)",
                          ke_fmt_tensor(b1, sizeof b1, t), ke_fmt_tensor(b2, sizeof b2, x));
        if (ke_attr_cross_entropy_ignore_index(&c->a) >= 0)
            return ke_err(KL_ERR_ARG, op, "ignore_index %lld is not supported for probability targets (PyTorch's rule)",
                          (long long)ke_attr_cross_entropy_ignore_index(&c->a));
    } else {
        if (t->dtype != KL_I64)
            return ke_err(KL_ERR_DTYPE, op, "target must hold int64 class indices, got %s",
                          ke_fmt_tensor(b1, sizeof b1, t));
        if (t->ndim != nd || memcmp(t->shape, want, sizeof(int64_t) * (size_t)nd))
            return ke_err(KL_ERR_SHAPE, op, "target %s does not match input %s (expected target shape %s)",
                          ke_fmt_shape(b1, sizeof b1, t->ndim, t->shape), ke_fmt_tensor(b2, sizeof b2, x),
                          ke_fmt_shape(b3, sizeof b3, nd, want));
    }
    double ls = ke_attr_cross_entropy_label_smoothing(&c->a);
    if (c->op == KE_OP_cross_entropy && !(ls >= 0 && ls <= 1))
        return ke_err(KL_ERR_ARG, op, "label_smoothing must be between 0 and 1, got %g", ls);
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = ke_attr_reduction(&c->a) == KL_REDUCE_NONE ? nd : 0;
    memcpy(out->shape, want, sizeof(int64_t) * (size_t)out->ndim);
    return 1;
}

static int check_targets(ke_call *c, const int64_t *t, int64_t m, int64_t nclass) {
    int64_t ig = ke_attr_cross_entropy_ignore_index(&c->a);
    for (int64_t i = 0; i < m; i++)
        if (t[i] != ig && (t[i] < 0 || t[i] >= nclass))
            return ke_err(KL_ERR_INDEX, ke_opname(c), "target %lld is out of bounds for %lld classes (element %lld)",
                          (long long)t[i], (long long)nclass, (long long)i);
    return 0;
}

/* Writes per-row losses (double, ignored rows 0) to out per the reduction.
 * The mean divides by the sum of the rows' weights: weight[t] of the rows not
 * ignored with class indices (1 each without weights: their count), 1 per row
 * with probabilities (t NULL); 0/0 = NaN if there are none, as PyTorch. */
static void reduce_rows(ke_call *c, const double *loss, const int64_t *t, const double *w, int64_t m) {
    kl_tensor *out = c->out[0];
    if (ke_attr_reduction(&c->a) == KL_REDUCE_NONE) {
        ke_convert(ke_data(out), (kl_dtype)out->dtype, loss, KL_F64, m);
        return;
    }
    double sum = 0, den = 0;
    int64_t ig = ke_attr_cross_entropy_ignore_index(&c->a);
    for (int64_t i = 0; i < m; i++) {
        sum += loss[i];
        den += !t ? 1 : t[i] == ig ? 0 : w ? w[t[i]] : 1;
    }
    ke_store_f64(ke_data(out), (kl_dtype)out->dtype, 0, ke_attr_reduction(&c->a) == KL_REDUCE_MEAN ? sum / den : sum);
}

typedef struct ce_ctx {
    const char *x, *p;  /* rows of C logits / target probabilities (NULL: class indices), compute dtype */
    const int64_t *t;   /* class indices, or NULL */
    const double *w;    /* class weights, or NULL */
    double *loss;
    int64_t C, ignore;
    double ls;
} ce_ctx;

/* loss = (1 - ls) * (lse - x[t]) + ls / C * (C * lse - sum(x)), lse the row's
 * log-sum-exp: PyTorch's nll of log_softmax plus its smoothing term. */
#define KE_CE_RANGE(T, sfx)                                                                          \
    static void ce_range_##sfx(void *ctx, int64_t r0, int64_t r1) {                                   \
        const ce_ctx *p = ctx;                                                                        \
        for (int64_t r = r0; r < r1; r++) {                                                           \
            const T *x = (const T *)p->x + r * p->C;                                                  \
            int64_t t = p->t[r];                                                                      \
            if (t == p->ignore) {                                                                     \
                p->loss[r] = 0;                                                                       \
                continue;                                                                             \
            }                                                                                         \
            const T *next = r + 1 < r1 && p->C * (int64_t)sizeof(T) <= 65536 ? x + p->C : NULL;       \
            double lse = ke_row_logsumexp_##sfx(x, p->C, next), l = lse - (double)x[t];               \
            if (p->ls > 0)                                                                            \
                l = (1 - p->ls) * l + p->ls / (double)p->C * ((double)p->C * lse - ke_row_sum_##sfx(x, p->C)); \
            p->loss[r] = l;                                                                           \
        }                                                                                             \
    }
KE_CE_RANGE(float, f32)
KE_CE_RANGE(double, f64)

/* With class weights w or probabilities q (smoothed: q (1 - ls) + ls / C):
 * sum_c w[c] q[c] (lse - x[c]); with weighted class indices
 * (1 - ls) w[t] (lse - x[t]) + ls / C * sum_c w[c] (lse - x[c]) (PyTorch's
 * weighted nll plus its weighted smoothing term). */
#define KE_CE_WRANGE(T, sfx)                                                                         \
    static void ce_wrange_##sfx(void *ctx, int64_t r0, int64_t r1) {                                  \
        const ce_ctx *p = ctx;                                                                        \
        int64_t C = p->C;                                                                             \
        double ls = p->ls;                                                                            \
        for (int64_t r = r0; r < r1; r++) {                                                           \
            const T *x = (const T *)p->x + r * C;                                                     \
            if (p->t && p->t[r] == p->ignore) {                                                       \
                p->loss[r] = 0;                                                                       \
                continue;                                                                             \
            }                                                                                         \
            double lse = ke_row_logsumexp_##sfx(x, C, NULL), l = 0;                                   \
            if (p->p) {                                                                               \
                const T *q = (const T *)p->p + r * C;                                                 \
                for (int64_t k = 0; k < C; k++)                                                       \
                    l += (p->w ? p->w[k] : 1) * ((double)q[k] * (1 - ls) + ls / (double)C) * (lse - (double)x[k]); \
            } else {                                                                                  \
                int64_t t = p->t[r];                                                                  \
                l = (1 - ls) * p->w[t] * (lse - (double)x[t]);                                        \
                if (ls > 0) {                                                                         \
                    double s = 0;                                                                     \
                    for (int64_t k = 0; k < C; k++) s += p->w[k] * (lse - (double)x[k]);              \
                    l += ls / (double)C * s;                                                          \
                }                                                                                     \
            }                                                                                         \
            p->loss[r] = l;                                                                           \
        }                                                                                             \
    }
KE_CE_WRANGE(float, f32)
KE_CE_WRANGE(double, f64)

/* [N, C, d...] -> [N, d..., C] (rows of C), a view; x itself for 1 or 2 dims. */
static kl_tensor *class_last(kl_tensor *x) {
    if (x->ndim <= 2) return x;
    int64_t perm[KL_MAX_DIMS];
    int n = 0;
    perm[n++] = 0;
    for (int d = 2; d < x->ndim; d++) perm[n++] = d;
    perm[n++] = 1;
    return kl_permute(x, n, perm);
}

/* Rows of a class loss: the input's elements outside the class dim. */
static int64_t class_rows(const kl_tensor *x) {
    int64_t m = 1;
    for (int d = 0; d < x->ndim; d++)
        if (d != class_dim(x)) m *= x->shape[d];
    return m;
}

/* The class weights as a contiguous double array (NULL without). */
static const double *weights_f64(ke_call *c, bool *failed) {
    if (!has_weight(c)) return NULL;
    kl_tensor *w = kl_contiguous(kl_to_dtype(c->in[2], KL_F64));
    *failed = !w;
    return w ? (const double *)ke_data(w) : NULL;
}

int ke_cpu_cross_entropy(ke_call *c) {
    kl_tensor *x = c->in[0];
    int rc = -1;
    bool prob = prob_target(c), failed = false;
    kl_scope_begin();
    kl_tensor *xc = kl_contiguous(kl_to_dtype(class_last(x), c->compute));
    kl_tensor *tc = prob ? kl_contiguous(kl_to_dtype(class_last(c->in[1]), c->compute)) : kl_contiguous(c->in[1]);
    const double *w = weights_f64(c, &failed);
    int64_t C = x->shape[class_dim(x)], m = class_rows(x);
    kl_tensor *loss = kl_empty_on(1, &m, KL_F64, KL_DEVICE_CPU);
    if (xc && tc && loss && !failed && (prob || !check_targets(c, (const int64_t *)ke_data(tc), m, C))) {
        ce_ctx p = {ke_data(xc), prob ? ke_data(tc) : NULL, prob ? NULL : (const int64_t *)ke_data(tc), w,
                    (double *)ke_data(loss), C, ke_attr_cross_entropy_ignore_index(&c->a),
                    ke_attr_cross_entropy_label_smoothing(&c->a)};
        int64_t per = C > 0 ? C : 1;
        bool plain = !prob && !w;
        ke_parallel_for(m, per >= 32768 ? 1 : 32768 / per,
                        xc->dtype == KL_F64 ? (plain ? ce_range_f64 : ce_wrange_f64)
                                            : (plain ? ce_range_f32 : ce_wrange_f32), &p);
        reduce_rows(c, p.loss, p.t, w, m);
        /* PyTorch: the mean over probabilities of no classes is NaN (its 0 / 0) */
        if (prob && C == 0 && ke_attr_reduction(&c->a) == KL_REDUCE_MEAN)
            ke_store_f64(ke_data(c->out[0]), (kl_dtype)c->out[0]->dtype, 0, NAN);
        rc = 0;
    }
    kl_scope_end();
    return rc;
}

/* Element offset of row i's class-0 entry: i runs over the target's shape,
 * which is the input's shape without the class dim. */
static int64_t row_offset(const kl_tensor *x, int64_t i) {
    int64_t off = 0;
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (d == class_dim(x)) continue;
        off += (i % x->shape[d]) * x->stride[d];
        i /= x->shape[d];
    }
    return off;
}

int ke_cpu_nll_loss(ke_call *c) {
    kl_tensor *x = c->in[0];
    int rc = -1;
    bool failed = false;
    kl_scope_begin();
    kl_tensor *tc = kl_contiguous(c->in[1]);
    const double *w = weights_f64(c, &failed);
    int64_t cd = class_dim(x), m = ke_numel(c->in[1]->ndim, c->in[1]->shape);
    kl_tensor *loss = kl_empty_on(1, &m, KL_F64, KL_DEVICE_CPU);
    if (tc && loss && !failed && !check_targets(c, (const int64_t *)ke_data(tc), m, x->shape[cd])) {
        const int64_t *t = (const int64_t *)ke_data(tc);
        double *l = (double *)ke_data(loss);
        for (int64_t i = 0; i < m; i++) {
            int64_t off = row_offset(x, i) + t[i] * x->stride[cd];
            l[i] = t[i] == ke_attr_nll_loss_ignore_index(&c->a)
                       ? 0
                       : -(w ? w[t[i]] : 1) * ke_load_f64(ke_data(x), (kl_dtype)x->dtype, off);
        }
        reduce_rows(c, l, t, w, m);
        rc = 0;
    }
    kl_scope_end();
    return rc;
}

/* Reduces a per-row loss (already 0 where ignored) like nll_loss: the mean
 * divides by the sum of den (the rows' weights, 0 where ignored). */
static kl_tensor *reduce_loss(int red, kl_tensor *loss, kl_tensor *den) {
    if (red == KL_REDUCE_NONE) return loss;
    kl_tensor *s = kl_sum(loss, KL_ALL_DIMS, false);
    return red == KL_REDUCE_SUM ? s : kl_div(s, kl_sum(den, KL_ALL_DIMS, false));
}

/* weight[t] per row (t's shape), t with ignored entries already replaced by 0. */
static kl_tensor *picked_weight(kl_tensor *w, kl_tensor *t) {
    kl_tensor *flat = kl_reshape(t, KL_SHAPE(-1));
    return kl_reshape(kl_index_select(w, 0, flat), t->ndim, t->shape);
}

/* -w[t] logp[t] per row (0 where ignored) and the rows' weights for a mean
 * (weight[t], or 1, where not ignored; else 0). */
static kl_tensor *picked_nll(ke_call *c, kl_tensor *logp, kl_tensor **den) {
    kl_tensor *t = c->in[1];
    int cd = class_dim(logp);
    kl_dtype dt = (kl_dtype)logp->dtype;
    kl_tensor *ign = kl_eq_scalar(t, (double)ke_attr_cross_entropy_ignore_index(&c->a));
    kl_tensor *tz = kl_masked_fill(t, ign, 0), *zero = kl_full(0, NULL, 0, dt);
    kl_tensor *nll = kl_neg(kl_squeeze(kl_gather(logp, cd, kl_unsqueeze(tz, cd)), cd));
    kl_tensor *valid = kl_logical_not(ign);
    if (has_weight(c)) {
        kl_tensor *wt = picked_weight(c->in[2], tz);
        nll = kl_mul(nll, wt);
        *den = kl_where(valid, wt, zero);
    } else {
        *den = valid;
    }
    return kl_where(valid, nll, zero);
}

int ke_decomp_nll_loss(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_class_loss(c, &spec) < 0) return -1;
    kl_scope_begin();
    kl_tensor *den = NULL, *nll = picked_nll(c, c->in[0], &den);
    kl_tensor *y = nll ? reduce_loss(ke_attr_reduction(&c->a), nll, den) : NULL;
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* The decomposition (compile mode's, and devices without a kernel) is written
 * as two row passes, which fusion turns into two kernels: per row of the
 * logits (class dim moved last) the shifted log-sum-exp minus the target's
 * shifted logit, picked by a row sum over a one-hot mask
 * (arange(C) == target) instead of a gather, with the smoothing term from the
 * same row; then one reduction over the [1, rows] vector of row losses, with
 * the count of rows not ignored beside it. The CPU kernel reports an
 * out-of-range target as an error; a kernel cannot, so such a row's loss is
 * NaN here, never a plausible number. Class weights are picked by the same
 * one-hot mask (*den gets the row's weight for the mean); probabilities
 * weigh every class's shifted -log-softmax in the same row pass. */
static kl_tensor *ce_row_loss(ke_call *c, kl_tensor *x, kl_tensor **den) {
    kl_tensor *t = c->in[1], *w = has_weight(c) ? c->in[2] : NULL;
    int64_t C = x->shape[class_dim(x)];
    kl_dtype dt = (kl_dtype)x->dtype;
    double ls = ke_attr_cross_entropy_label_smoothing(&c->a);
    x = class_last(x);
    kl_tensor *sh = kl_sub(x, kl_amax(x, KL_DIMS(-1), true));
    kl_tensor *lse = kl_log(kl_sum(kl_exp(sh), KL_DIMS(-1), true)); /* of the shifted row */
    kl_tensor *zero = kl_full(0, NULL, 0, dt);
    *den = NULL;
    if (prob_target(c)) {
        kl_tensor *q = class_last(t);
        if (ls > 0) q = kl_add_scalar(kl_mul_scalar(q, 1 - ls), ls / (double)C);
        if (w) q = kl_mul(q, w);
        return kl_sum(kl_mul(q, kl_sub(lse, sh)), KL_DIMS(-1), true);
    }
    kl_tensor *tl = kl_unsqueeze(t, t->ndim); /* [..., 1]: one target per row */
    /* the class ids on the target's device (a CUDA target: no mixed-device compare) */
    kl_tensor *hit = kl_eq(kl_to_device(kl_arange(0, (double)C, 1, KL_I64), kl_device_of(t)), tl);
    kl_tensor *loss = kl_sub(lse, kl_sum(kl_where(hit, sh, zero), KL_DIMS(-1), true));
    kl_tensor *wt = w ? kl_sum(kl_where(hit, w, zero), KL_DIMS(-1), true) : NULL;
    if (wt) loss = kl_mul(loss, wt);
    if (ls > 0) {
        kl_tensor *smooth = w ? kl_sum(kl_mul(w, kl_sub(lse, sh)), KL_DIMS(-1), true)
                              : kl_sub(kl_mul_scalar(lse, (double)C), kl_sum(sh, KL_DIMS(-1), true));
        loss = kl_add(kl_mul_scalar(loss, 1 - ls), kl_mul_scalar(smooth, ls / (double)C));
    }
    kl_tensor *valid = kl_ne_scalar(tl, (double)ke_attr_cross_entropy_ignore_index(&c->a));
    kl_tensor *in_range = kl_logical_and(kl_ge_scalar(tl, 0), kl_lt_scalar(tl, (double)C));
    loss = kl_where(valid, loss, zero);
    if (wt) *den = kl_where(valid, wt, zero);
    return kl_where(kl_logical_or(in_range, kl_logical_not(valid)), loss, kl_full(0, NULL, NAN, dt));
}

int ke_decomp_cross_entropy(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_class_loss(c, &spec) < 0) return -1;
    kl_tensor *t = c->in[1];
    int red = ke_attr_reduction(&c->a);
    int64_t C = c->in[0]->shape[class_dim(c->in[0])], m = class_rows(c->in[0]);
    kl_scope_begin();
    kl_tensor *den = NULL, *loss = ce_row_loss(c, c->in[0], &den), *y;
    if (red == KL_REDUCE_NONE) {
        y = kl_reshape(loss, spec.ndim, spec.shape);
    } else {
        /* the rows as one row: a last-dim reduction like every other */
        kl_tensor *s = kl_sum(kl_reshape(loss, KL_SHAPE(1, m)), KL_DIMS(-1), true);
        if (red == KL_REDUCE_MEAN) {
            if (prob_target(c))
                s = kl_div_scalar(s, C == 0 ? 0.0 : (double)m); /* PyTorch: NaN without classes */
            else if (den)
                s = kl_div(s, kl_sum(kl_reshape(den, KL_SHAPE(1, m)), KL_DIMS(-1), true));
            else {
                kl_tensor *valid = kl_ne_scalar(kl_reshape(t, KL_SHAPE(1, m)), (double)ke_attr_cross_entropy_ignore_index(&c->a));
                s = kl_div(s, kl_sum(valid, KL_DIMS(-1), true));
            }
        }
        y = kl_reshape(s, 0, NULL);
    }
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

static kl_tensor *class_loss_call(int op, kl_tensor *x, kl_tensor *target, const kl_cross_entropy_options *o) {
    kl_tensor *in[3] = {x, target, o->weight};
    ke_call c = {.op = op, .nin = o->weight ? 3 : 2, .in = in};
    ke_attr_set_reduction(&c.a, o->reduction);
    ke_attr_set_cross_entropy_ignore_index(&c.a, o->ignore_index);
    ke_attr_set_cross_entropy_has_weight(&c.a, o->weight != NULL);
    if (op == KE_OP_cross_entropy) ke_attr_set_cross_entropy_label_smoothing(&c.a, o->label_smoothing);
    return ke_call1(&c);
}

kl_cross_entropy_options kl_cross_entropy_options_default(void) {
    return (kl_cross_entropy_options){.reduction = KL_REDUCE_MEAN, .ignore_index = KE_IGNORE_INDEX,
                                      .label_smoothing = 0, .weight = NULL};
}

kl_tensor *kl_cross_entropy(kl_tensor *logits, kl_tensor *target, kl_reduction red, double label_smoothing) {
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.reduction = red;
    o.label_smoothing = label_smoothing;
    return class_loss_call(KE_OP_cross_entropy, logits, target, &o);
}

kl_tensor *kl_cross_entropy_ex(kl_tensor *logits, kl_tensor *target, const kl_cross_entropy_options *opts) {
    kl_cross_entropy_options o = opts ? *opts : kl_cross_entropy_options_default();
    return class_loss_call(KE_OP_cross_entropy, logits, target, &o);
}

kl_tensor *kl_nll_loss(kl_tensor *logp, kl_tensor *target, kl_reduction red) {
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.reduction = red;
    return class_loss_call(KE_OP_nll_loss, logp, target, &o);
}

kl_tensor *kl_nll_loss_ex(kl_tensor *logp, kl_tensor *target, const kl_cross_entropy_options *opts) {
    kl_cross_entropy_options o = opts ? *opts : kl_cross_entropy_options_default();
    if (o.label_smoothing != 0) {
        ke_err(KL_ERR_ARG, "nll_loss", "has no label smoothing (got %g; use kl_cross_entropy_ex)", o.label_smoothing);
        return NULL;
    }
    return class_loss_call(KE_OP_nll_loss, logp, target, &o);
}

/* ---- mse_loss / binary_cross_entropy_with_logits -------------------------------------------------- */

/* mse_loss broadcasts its operands (PyTorch warns but allows it);
 * binary_cross_entropy_with_logits wants equal shapes, as PyTorch does. */
int ke_infer_pair_loss(ke_call *c, ke_outspec *out) {
    if (check_reduction(c) || ke_infer_broadcast(c, out) < 0) return -1;
    const kl_tensor *x = c->in[0], *y = c->in[1];
    if (c->op == KE_OP_binary_cross_entropy_with_logits &&
        (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * x->ndim))) {
        char b1[200], b2[200];
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "target shape %s must equal the input's shape %s",
                      ke_fmt_shape(b1, sizeof b1, y->ndim, y->shape), ke_fmt_shape(b2, sizeof b2, x->ndim, x->shape));
    }
    if (ke_attr_reduction(&c->a) != KL_REDUCE_NONE) out->ndim = 0;
    return 1;
}

static kl_tensor *reduce_pair(int red, kl_tensor *l) {
    if (red == KL_REDUCE_MEAN) return kl_mean(l, KL_ALL_DIMS, false);
    if (red == KL_REDUCE_SUM) return kl_sum(l, KL_ALL_DIMS, false);
    return l;
}

int ke_decomp_mse_loss(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_pair_loss(c, &spec) < 0) return -1;
    kl_scope_begin();
    kl_tensor *d = kl_sub(c->in[0], c->in[1]);
    kl_tensor *y = reduce_pair(ke_attr_reduction(&c->a), kl_mul(d, d));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* PyTorch 1.13's form, m = max(-x, 0): (1 - y) x + m + log(exp(-m) + exp(-x - m)).
 * It never exponentiates a large positive, and it gives PyTorch's results at
 * x = ±inf too (inf and NaN), which max(x,0) - x y + log1p(exp(-|x|)) does not. */
int ke_decomp_bce_logits(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_pair_loss(c, &spec) < 0) return -1;
    kl_tensor *x = c->in[0], *t = c->in[1];
    kl_scope_begin();
    kl_tensor *m = kl_relu(kl_neg(x));
    kl_tensor *l = kl_add(kl_add(kl_mul(kl_rsub_scalar(t, 1), x), m),
                          kl_log(kl_add(kl_exp(kl_neg(m)), kl_exp(kl_sub(kl_neg(x), m)))));
    kl_tensor *y = reduce_pair(ke_attr_reduction(&c->a), l);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

static kl_tensor *pair_loss_call(int op, kl_tensor *a, kl_tensor *b, kl_reduction red) {
    kl_tensor *in[2] = {a, b};
    ke_call c = {.op = op, .nin = 2, .in = in};
    ke_attr_set_reduction(&c.a, red);
    return ke_call1(&c);
}

kl_tensor *kl_mse_loss(kl_tensor *a, kl_tensor *b, kl_reduction red) {
    return pair_loss_call(KE_OP_mse_loss, a, b, red);
}

kl_tensor *kl_binary_cross_entropy_with_logits(kl_tensor *x, kl_tensor *y, kl_reduction red) {
    return pair_loss_call(KE_OP_binary_cross_entropy_with_logits, x, y, red);
}
