/*
 * loss.c — losses (rows in ops_nn.def): cross_entropy and nll_loss over int64
 * class indices, with PyTorch's ignore_index (-100: such targets add 0 and
 * leave the mean's denominator) and label smoothing; mse_loss and
 * binary_cross_entropy_with_logits.
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

/* input [C] with target [], [N, C] with [N], or [N, C, d1...] with [N, d1...]. */
int ke_infer_class_loss(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *t = c->in[1];
    char b1[256], b2[256], b3[200];
    if (check_reduction(c)) return -1;
    if (!ke_is_float((kl_dtype)x->dtype))
        return ke_err(KL_ERR_DTYPE, op, "expects a floating-point input, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    if (t->dtype != KL_I64)
        return ke_err(KL_ERR_DTYPE, op, "target must hold int64 class indices, got %s",
                      ke_fmt_tensor(b1, sizeof b1, t));
    if (x->ndim == 0)
        return ke_err(KL_ERR_SHAPE, op, "input must have a class dim, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    int64_t want[KL_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (d != class_dim(x)) want[nd++] = x->shape[d];
    if (t->ndim != nd || memcmp(t->shape, want, sizeof(int64_t) * (size_t)nd))
        return ke_err(KL_ERR_SHAPE, op, "target %s does not match input %s (expected target shape %s)",
                      ke_fmt_shape(b1, sizeof b1, t->ndim, t->shape), ke_fmt_tensor(b2, sizeof b2, x),
                      ke_fmt_shape(b3, sizeof b3, nd, want));
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

/* Writes per-row losses (double, ignored rows 0) to out per the reduction;
 * the mean divides by the rows not ignored (0/0 = NaN if there are none). */
static void reduce_rows(ke_call *c, const double *loss, const int64_t *t, int64_t m) {
    kl_tensor *out = c->out[0];
    if (ke_attr_reduction(&c->a) == KL_REDUCE_NONE) {
        ke_convert(ke_data(out), (kl_dtype)out->dtype, loss, KL_F64, m);
        return;
    }
    double sum = 0;
    int64_t count = 0;
    int64_t ig = ke_attr_cross_entropy_ignore_index(&c->a);
    for (int64_t i = 0; i < m; i++) {
        sum += loss[i];
        count += t[i] != ig;
    }
    ke_store_f64(ke_data(out), (kl_dtype)out->dtype, 0,
                 ke_attr_reduction(&c->a) == KL_REDUCE_MEAN ? sum / (double)count : sum);
}

typedef struct ce_ctx {
    const char *x;
    const int64_t *t;
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

int ke_cpu_cross_entropy(ke_call *c) {
    kl_tensor *x = c->in[0];
    int rc = -1;
    kl_scope_begin();
    /* class dim last: [N, C, d...] -> [N, d..., C], rows of C contiguous */
    kl_tensor *xl = x;
    if (x->ndim > 2) {
        int64_t perm[KL_MAX_DIMS];
        int n = 0;
        perm[n++] = 0;
        for (int d = 2; d < x->ndim; d++) perm[n++] = d;
        perm[n++] = 1;
        xl = kl_permute(x, n, perm);
    }
    kl_tensor *xc = kl_contiguous(kl_to_dtype(xl, c->compute)), *tc = kl_contiguous(c->in[1]);
    int64_t C = x->shape[class_dim(x)], m = ke_numel(c->in[1]->ndim, c->in[1]->shape);
    kl_tensor *loss = kl_empty_on(1, &m, KL_F64, KL_DEVICE_CPU);
    if (xc && tc && loss && !check_targets(c, (const int64_t *)ke_data(tc), m, C)) {
        ce_ctx p = {ke_data(xc), (const int64_t *)ke_data(tc), (double *)ke_data(loss), C,
                    ke_attr_cross_entropy_ignore_index(&c->a), ke_attr_cross_entropy_label_smoothing(&c->a)};
        int64_t per = C > 0 ? C : 1;
        ke_parallel_for(m, per >= 32768 ? 1 : 32768 / per, xc->dtype == KL_F64 ? ce_range_f64 : ce_range_f32, &p);
        reduce_rows(c, p.loss, p.t, m);
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
    kl_scope_begin();
    kl_tensor *tc = kl_contiguous(c->in[1]);
    int64_t cd = class_dim(x), m = ke_numel(c->in[1]->ndim, c->in[1]->shape);
    kl_tensor *loss = kl_empty_on(1, &m, KL_F64, KL_DEVICE_CPU);
    if (tc && loss && !check_targets(c, (const int64_t *)ke_data(tc), m, x->shape[cd])) {
        const int64_t *t = (const int64_t *)ke_data(tc);
        double *l = (double *)ke_data(loss);
        for (int64_t i = 0; i < m; i++) {
            int64_t off = row_offset(x, i) + t[i] * x->stride[cd];
            l[i] = t[i] == ke_attr_nll_loss_ignore_index(&c->a) ? 0 : -ke_load_f64(ke_data(x), (kl_dtype)x->dtype, off);
        }
        reduce_rows(c, l, t, m);
        rc = 0;
    }
    kl_scope_end();
    return rc;
}

/* Reduces a per-row loss (already 0 where ignored) like nll_loss. */
static kl_tensor *reduce_loss(int red, kl_tensor *loss, kl_tensor *valid) {
    if (red == KL_REDUCE_NONE) return loss;
    kl_tensor *s = kl_sum(loss, KL_ALL_DIMS, false);
    return red == KL_REDUCE_SUM ? s : kl_div(s, kl_sum(valid, KL_ALL_DIMS, false));
}

/* -logp[t] per row (0 where ignored) and the mask of rows not ignored. */
static kl_tensor *picked_nll(ke_call *c, kl_tensor *logp, kl_tensor **valid) {
    kl_tensor *t = c->in[1];
    int cd = class_dim(logp);
    kl_tensor *ign = kl_eq_scalar(t, (double)ke_attr_cross_entropy_ignore_index(&c->a));
    kl_tensor *idx = kl_unsqueeze(kl_masked_fill(t, ign, 0), cd);
    kl_tensor *nll = kl_neg(kl_squeeze(kl_gather(logp, cd, idx), cd));
    *valid = kl_logical_not(ign);
    return kl_where(*valid, nll, kl_full(0, NULL, 0, (kl_dtype)logp->dtype));
}

int ke_decomp_nll_loss(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_class_loss(c, &spec) < 0) return -1;
    kl_scope_begin();
    kl_tensor *valid = NULL, *nll = picked_nll(c, c->in[0], &valid);
    kl_tensor *y = nll ? reduce_loss(ke_attr_reduction(&c->a), nll, valid) : NULL;
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
 * NaN here, never a plausible number. */
static kl_tensor *ce_row_loss(ke_call *c, kl_tensor *x) {
    kl_tensor *t = c->in[1];
    int cd = class_dim(x);
    int64_t C = x->shape[cd];
    kl_dtype dt = (kl_dtype)x->dtype;
    double ls = ke_attr_cross_entropy_label_smoothing(&c->a);
    if (x->ndim > 2) { /* [N, C, d...] -> [N, d..., C] */
        int64_t perm[KL_MAX_DIMS];
        int n = 0;
        perm[n++] = 0;
        for (int d = 2; d < x->ndim; d++) perm[n++] = d;
        perm[n++] = 1;
        x = kl_permute(x, n, perm);
    }
    kl_tensor *tl = kl_unsqueeze(t, t->ndim); /* [..., 1]: one target per row */
    kl_tensor *sh = kl_sub(x, kl_amax(x, KL_DIMS(-1), true));
    kl_tensor *lse = kl_log(kl_sum(kl_exp(sh), KL_DIMS(-1), true)); /* of the shifted row */
    /* the class ids on the target's device (a CUDA target: no mixed-device compare) */
    kl_tensor *hit = kl_eq(kl_to_device(kl_arange(0, (double)C, 1, KL_I64), kl_device_of(t)), tl);
    kl_tensor *zero = kl_full(0, NULL, 0, dt);
    kl_tensor *loss = kl_sub(lse, kl_sum(kl_where(hit, sh, zero), KL_DIMS(-1), true));
    if (ls > 0) {
        kl_tensor *smooth = kl_sub(kl_mul_scalar(lse, (double)C), kl_sum(sh, KL_DIMS(-1), true));
        loss = kl_add(kl_mul_scalar(loss, 1 - ls), kl_mul_scalar(smooth, ls / (double)C));
    }
    kl_tensor *valid = kl_ne_scalar(tl, (double)ke_attr_cross_entropy_ignore_index(&c->a));
    kl_tensor *in_range = kl_logical_and(kl_ge_scalar(tl, 0), kl_lt_scalar(tl, (double)C));
    loss = kl_where(valid, loss, zero);
    return kl_where(kl_logical_or(in_range, kl_logical_not(valid)), loss, kl_full(0, NULL, NAN, dt));
}

int ke_decomp_cross_entropy(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_class_loss(c, &spec) < 0) return -1;
    kl_tensor *t = c->in[1];
    int red = ke_attr_reduction(&c->a);
    int64_t m = ke_numel(t->ndim, t->shape);
    kl_scope_begin();
    kl_tensor *loss = ce_row_loss(c, c->in[0]), *y;
    if (red == KL_REDUCE_NONE) {
        y = kl_reshape(loss, t->ndim, t->shape);
    } else {
        /* the rows as one row: a last-dim reduction like every other */
        kl_tensor *s = kl_sum(kl_reshape(loss, KL_SHAPE(1, m)), KL_DIMS(-1), true);
        if (red == KL_REDUCE_MEAN) {
            kl_tensor *valid = kl_ne_scalar(kl_reshape(t, KL_SHAPE(1, m)), (double)ke_attr_cross_entropy_ignore_index(&c->a));
            s = kl_div(s, kl_sum(valid, KL_DIMS(-1), true));
        }
        y = kl_reshape(s, 0, NULL);
    }
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

static kl_tensor *class_loss_call(int op, kl_tensor *x, kl_tensor *target, kl_reduction red, double ls) {
    kl_tensor *in[2] = {x, target};
    ke_call c = {.op = op, .nin = 2, .in = in};
    ke_attr_set_reduction(&c.a, red);
    ke_attr_set_cross_entropy_ignore_index(&c.a, KE_IGNORE_INDEX);
    if (op == KE_OP_cross_entropy) ke_attr_set_cross_entropy_label_smoothing(&c.a, ls);
    return ke_call1(&c);
}

kl_tensor *kl_cross_entropy(kl_tensor *logits, kl_tensor *target, kl_reduction red, double label_smoothing) {
    return class_loss_call(KE_OP_cross_entropy, logits, target, red, label_smoothing);
}

kl_tensor *kl_nll_loss(kl_tensor *logp, kl_tensor *target, kl_reduction red) {
    return class_loss_call(KE_OP_nll_loss, logp, target, red, 0);
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
