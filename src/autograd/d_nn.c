/*
 * d_nn.c — derivative formulas of the linalg and nn families (named by the
 * rows of ops_linalg.def and ops_nn.def), after PyTorch 1.13's derivatives.yaml.
 *
 * Every formula is written with kl_ ops, so it runs on any backend and is
 * itself recorded under create_graph: double backward goes through the ops a
 * formula uses (conv2d's input and weight gradients are the internal
 * composites conv2d_input_grad and conv2d_weight_grad, whose decompositions
 * are conv2d;
 * max_pool2d's a scatter_add whose own derivative is a gather). Formulas leave a gradient with its
 * broadcast shape where that is natural; the engine sums it down to the
 * input's shape. Composites get formulas rather than their decompositions
 * where the decomposition would save much more (softmax, the norms, the
 * losses): they save x (or y) and recompute the row statistics.
 */
#include "autograd.h"

#include <stdlib.h>

/* ---- small helpers ---------------------------------------------------------------- */

static int64_t numel_of(const ag_tmeta *m) {
    int64_t n = 1;
    for (int d = 0; d < m->ndim; d++) n *= m->shape[d];
    return n;
}

/* A 0-dim zero of dtype dt on dev (the "else" of a masked gradient). */
static kl_tensor *zero_scalar(kl_dtype dt, kl_device dev) {
    return kl_to_device(kl_scalar_tensor(0, dt), dev);
}

/* The output gradient of a mean/sum/none-reduced elementwise loss spread
 * back over the n elements the loss reduced. */
static kl_tensor *spread_reduction(const ag_ctx *c, kl_tensor *g, int64_t n) {
    return ke_attr_reduction(c->a) == KL_REDUCE_MEAN ? kl_div_scalar(g, (double)n) : g;
}

/* ---- matrix products ----------------------------------------------------------------- */

/* Whether t's last two dims are laid out column-major (a transposed view of
 * a row-major matrix, as k^T in attention or W^T in x @ W^T). */
static int col_major(const kl_tensor *t) {
    const int64_t *s = kl_shape(t), *st = kl_stride(t);
    int n = kl_ndim(t);
    return s && st && n >= 2 && s[n - 1] > 1 && s[n - 2] > 1 && st[n - 2] == 1 && st[n - 1] != 1;
}

/* torch.matmul's cases: 1-D operands gain a dim (a in front, b behind) and
 * lose it again, batch dims broadcast. Each gradient is the product with
 * the other operand's transpose, summed over the dims the operand was
 * broadcast along; a matrix b under a batched a (x @ W) gets one folded
 * product instead of a batch of them and a sum. A column-major operand
 * gets its gradient column-major too, as the transpose of the transposed
 * product (same GEMM, other BLAS flags): the transpose backward that
 * follows then hands on a contiguous gradient (k of q @ k^T) instead of one
 * a later reshape must copy. */
int ag_d_matmul(ag_ctx *c) {
    kl_tensor *a = c->in[0], *b = c->in[1], *g = c->gout[0];
    const ag_tmeta *am = &c->in_meta[0], *bm = &c->in_meta[1];
    if (am->ndim == 1 && bm->ndim == 1) {
        if (c->need[0] && !(c->gin[0] = kl_mul(g, b))) return -1;
        if (c->need[1] && !(c->gin[1] = kl_mul(g, a))) return -1;
        return 0;
    }
    if (c->need[0]) {
        kl_tensor *ga;
        if (am->ndim == 1) /* g [..., N]: ga[k] = sum b[..., k, n] g[..., n] */
            ga = kl_squeeze(kl_matmul(b, kl_unsqueeze(g, -1)), -1);
        else if (bm->ndim == 1) /* g [..., M]: ga = g outer b */
            ga = kl_mul(kl_unsqueeze(g, -1), b);
        else if (col_major(a) && am->ndim >= bm->ndim)
            ga = kl_transpose(kl_matmul(b, kl_transpose(g, -2, -1)), -2, -1);
        else
            ga = kl_matmul(g, kl_transpose(b, -2, -1));
        c->gin[0] = ag_sum_to(ga, am->ndim, am->shape);
        if (!c->gin[0]) return -1;
    }
    if (c->need[1]) {
        kl_tensor *gb;
        int64_t K = am->shape[am->ndim - 1], rows = 1;
        for (int d = 0; d < am->ndim - 1; d++) rows *= am->shape[d];
        if (am->ndim == 1) { /* gb = a outer g */
            gb = kl_mul(kl_unsqueeze(a, -1), kl_unsqueeze(g, -2));
        } else if (bm->ndim == 1) { /* gb[k] = sum a[..., m, k] g[..., m], folded over rows */
            gb = kl_matmul(kl_reshape(g, 1, &rows), kl_reshape(a, 2, (int64_t[]){rows, K}));
        } else if (bm->ndim == 2) { /* folded: [rows, K]^T @ [rows, N] */
            int64_t N = bm->shape[1];
            kl_tensor *a2 = kl_reshape(a, 2, (int64_t[]){rows, K}), *g2 = kl_reshape(g, 2, (int64_t[]){rows, N});
            gb = col_major(b) ? kl_t(kl_mm(kl_t(g2), a2)) : kl_mm(kl_t(a2), g2);
        } else if (col_major(b) && bm->ndim >= am->ndim) {
            gb = kl_transpose(kl_matmul(kl_transpose(g, -2, -1), a), -2, -1);
        } else {
            gb = kl_matmul(kl_transpose(a, -2, -1), g);
        }
        c->gin[1] = ag_sum_to(gb, bm->ndim, bm->shape);
        if (!c->gin[1]) return -1;
    }
    return 0;
}

int ag_d_mm(ag_ctx *c) {
    kl_tensor *a = c->in[0], *b = c->in[1], *g = c->gout[0];
    if (c->need[0] && !(c->gin[0] = kl_mm(g, kl_t(b)))) return -1;
    if (c->need[1] && !(c->gin[1] = kl_mm(kl_t(a), g))) return -1;
    return 0;
}

int ag_d_bmm(ag_ctx *c) {
    kl_tensor *a = c->in[0], *b = c->in[1], *g = c->gout[0];
    if (c->need[0] && !(c->gin[0] = kl_bmm(g, kl_transpose(b, 1, 2)))) return -1;
    if (c->need[1] && !(c->gin[1] = kl_bmm(kl_transpose(a, 1, 2), g))) return -1;
    return 0;
}

/* out = beta * bias + alpha * a @ b. beta = 0 still multiplies (a NaN in g
 * stays NaN), as PyTorch's maybe_multiply does. */
int ag_d_addmm(ag_ctx *c) {
    kl_tensor *a = c->in[1], *b = c->in[2], *g = c->gout[0];
    double beta = ke_attr_addmm_beta(c->a), alpha = ke_attr_addmm_alpha(c->a);
    if (c->need[0] && !(c->gin[0] = beta == 1 ? g : kl_mul_scalar(g, beta))) return -1;
    kl_tensor *ga = alpha == 1 ? g : kl_mul_scalar(g, alpha);
    if (c->need[1] && !(c->gin[1] = kl_mm(ga, kl_t(b)))) return -1;
    if (c->need[2] && !(c->gin[2] = kl_mm(kl_t(a), ga))) return -1;
    return 0;
}

/* y = x @ w^T (+ bias), w [out, in] or [in]. The weight's gradient folds
 * x's batch dims into one product, g^T @ x over all rows. */
int ag_d_linear(ag_ctx *c) {
    kl_tensor *x = c->in[0], *w = c->in[1], *g = c->gout[0];
    const ag_tmeta *xm = &c->in_meta[0], *wm = &c->in_meta[1];
    int64_t in = xm->shape[xm->ndim - 1], rows = 1;
    for (int d = 0; d < xm->ndim - 1; d++) rows *= xm->shape[d];
    if (wm->ndim == 2) {
        int64_t out = wm->shape[0];
        if (c->need[0] && !(c->gin[0] = kl_matmul(g, w))) return -1;
        if (c->need[1] && !(c->gin[1] = kl_mm(kl_t(kl_reshape(g, 2, (int64_t[]){rows, out})),
                                              kl_reshape(x, 2, (int64_t[]){rows, in}))))
            return -1;
    } else {
        if (c->need[0] && !(c->gin[0] = kl_mul(kl_unsqueeze(g, -1), w))) return -1;
        if (c->need[1] &&
            !(c->gin[1] = kl_matmul(kl_reshape(g, 1, &rows), kl_reshape(x, 2, (int64_t[]){rows, in}))))
            return -1;
    }
    if (c->nin == 3 && c->need[2]) c->gin[2] = g;
    return 0;
}

/* ---- softmax and the norms ----------------------------------------------------------- */

/* From the saved output y: softmax' = y * (g - sum(g * y)); log_softmax' =
 * g - exp(y) * sum(g). The saved y carries the node back under create_graph,
 * so the second derivative flows through it to x. */
int ag_d_softmax(ag_ctx *c) {
    int64_t d = ke_attr_softmax_dim(c->a);
    kl_tensor *y = c->out[0], *g = c->gout[0];
    c->gin[0] = kl_mul(y, kl_sub(g, kl_sum(kl_mul(g, y), 1, &d, true)));
    return c->gin[0] ? 0 : -1;
}

int ag_d_log_softmax(ag_ctx *c) {
    int64_t d = ke_attr_softmax_dim(c->a); /* log_softmax has softmax's attributes */
    kl_tensor *y = c->out[0], *g = c->gout[0];
    c->gin[0] = kl_sub(g, kl_mul(kl_exp(y), kl_sum(g, 1, &d, true)));
    return c->gin[0] ? 0 : -1;
}

/* rms_norm over the last nd dims; the statistics are recomputed from the
 * saved x. With xh = x * rstd and gh = g * weight:
 *   dx = rstd * (gh - xh * mean(gh * xh))
 *   dweight = g * xh (summed over the leading dims).
 * (layer_norm's formula is layer_norm_backward's decomposition, nn_backward.c.) */
int ag_d_rms_norm(ag_ctx *c) {
    kl_tensor *x = c->in[0], *g = c->gout[0];
    /* rms_norm's attributes are layer_norm's, less has_bias (nn.c asserts the slots) */
    int nd = (int)ke_attr_layer_norm_normalized_ndim(c->a), has_w = ke_attr_layer_norm_has_weight(c->a);
    int64_t dims[KL_MAX_DIMS];
    for (int i = 0; i < nd; i++) dims[i] = i - nd;
    kl_tensor *rstd = kl_rsqrt(kl_add_scalar(kl_mean(kl_mul(x, x), nd, dims, true), ke_attr_layer_norm_eps(c->a)));
    kl_tensor *xh = kl_mul(x, rstd);
    if (has_w && c->need[1] && !(c->gin[1] = kl_mul(g, xh))) return -1;
    if (c->need[0]) {
        kl_tensor *gh = has_w ? kl_mul(g, c->in[1]) : g;
        kl_tensor *r = kl_sub(gh, kl_mul(xh, kl_mean(kl_mul(gh, xh), nd, dims, true)));
        if (!(c->gin[0] = kl_mul(r, rstd))) return -1;
    }
    return 0;
}

/* layer_norm: layer_norm_backward (an internal composite like
 * batch_norm_backward: its decomposition is the formula with kl_ ops, its
 * CPU kernel two passes per row) gives dx, dweight and dbias at once. */
int ag_d_layer_norm(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0];
    int has_w = ke_attr_layer_norm_has_weight(c->a), has_b = ke_attr_layer_norm_has_bias(c->a);
    kl_tensor *in[3] = {c->gout[0], c->in[0], has_w ? c->in[1] : NULL};
    if (kl_dtype_of(in[0]) != (kl_dtype)xm->dtype) in[0] = kl_to_dtype(in[0], (kl_dtype)xm->dtype);
    if (!in[0]) return -1;
    ke_call call = {.op = KE_OP_layer_norm_backward, .nin = 2 + has_w, .in = in, .device = xm->device, .a = *c->a};
    if (ke_dispatch(&call)) return -1;
    if (c->need[0]) c->gin[0] = call.out[0];
    if (has_w && c->need[1]) c->gin[1] = call.out[1];
    if (has_b && c->need[1 + has_w]) c->gin[1 + has_w] = call.out[2];
    return 0;
}

/* causal_attention: causal_attention_backward (an internal composite: its
 * decomposition is the formula, its CPU kernel recomputes the probabilities
 * in query blocks) gives dq, dk and dv at once from the saved q, k, v. */
int ag_d_causal_attention(ag_ctx *c) {
    const ag_tmeta *qm = &c->in_meta[0];
    kl_tensor *in[4] = {c->gout[0], c->in[0], c->in[1], c->in[2]};
    if (kl_dtype_of(in[0]) != (kl_dtype)qm->dtype) in[0] = kl_to_dtype(in[0], (kl_dtype)qm->dtype);
    if (!in[0]) return -1;
    ke_call call = {.op = KE_OP_causal_attention_backward, .nin = 4, .in = in, .device = qm->device, .a = *c->a};
    if (ke_dispatch(&call)) return -1;
    for (int i = 0; i < 3; i++)
        if (c->need[i]) c->gin[i] = call.out[i];
    return 0;
}

/* batch_norm: inputs x[, running_mean, running_var (eval)][, weight][, bias].
 * batch_norm_backward (an internal composite: its decomposition is the
 * formula, its CPU kernel fused) gives dx, dweight and dbias at once; the
 * running buffers never require grad. */
int ag_d_batch_norm(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0];
    int training = ke_attr_batch_norm_training(c->a), has_w = ke_attr_batch_norm_has_weight(c->a),
        has_b = ke_attr_batch_norm_has_bias(c->a);
    int k = 1, kw = -1, kb = -1;
    kl_tensor *in[5] = {c->gout[0], c->in[0]};
    int n = 2;
    if (kl_dtype_of(in[0]) != (kl_dtype)xm->dtype) in[0] = kl_to_dtype(in[0], (kl_dtype)xm->dtype);
    if (!training) in[n++] = c->in[k++], in[n++] = c->in[k++];
    if (has_w) kw = k, in[n++] = c->in[k++];
    if (has_b) kb = k;
    if (!in[0]) return -1;
    ke_call call = {.op = KE_OP_batch_norm_backward, .nin = n, .in = in, .device = xm->device, .a = *c->a};
    if (ke_dispatch(&call)) return -1;
    if (c->need[0]) c->gin[0] = call.out[0];
    if (kw >= 0 && c->need[kw]) c->gin[kw] = call.out[1];
    if (kb >= 0 && c->need[kb]) c->gin[kb] = call.out[2];
    return 0;
}

/* The same mask on g: the forward op with its recorded seed and offset
 * gives g * mask / (1 - p) exactly (the mask depends on the dtype's Philox
 * stream, so g is brought to the input's dtype first). */
static int dropout_backward(ag_ctx *c, int op) {
    kl_tensor *g = c->gout[0];
    if (kl_dtype_of(g) != (kl_dtype)c->in_meta[0].dtype) g = kl_to_dtype(g, (kl_dtype)c->in_meta[0].dtype);
    c->gin[0] = g ? ag_call(op, 1, &g, c->a) : NULL;
    return c->gin[0] ? 0 : -1;
}

int ag_d_dropout(ag_ctx *c) { return dropout_backward(c, KE_OP_dropout); }
/* dropout2d: the same planes of g (the op with the recorded seed and offset). */
int ag_d_dropout2d(ag_ctx *c) { return dropout_backward(c, KE_OP_dropout2d); }

/* ---- losses ------------------------------------------------------------------------- */

/* Class dim of a class loss's input: 0 for [C], else 1. */
static int class_dim(const ag_ctx *c) { return c->in_meta[0].ndim == 1 ? 0 : 1; }

/* Inputs x, target[, weight] of a class loss. */
static kl_tensor *class_weight(const ag_ctx *c) {
    return ke_attr_cross_entropy_has_weight(c->a) ? c->in[2] : NULL; /* nll_loss's too */
}

/* A [C] tensor shaped to broadcast along the input's class dim. */
static kl_tensor *along_classes(const ag_ctx *c, kl_tensor *v) {
    const ag_tmeta *m = &c->in_meta[0];
    int cd = class_dim(c), n = 0;
    int64_t shape[KL_MAX_DIMS];
    shape[n++] = m->shape[cd];
    for (int d = cd + 1; d < m->ndim; d++) shape[n++] = 1;
    return kl_reshape(v, n, shape);
}

/* Per-row weight (the target's shape) of a class loss's gradient: g spread
 * by the reduction (the mean divides by the sum of the weights of the rows
 * not ignored: their count without class weights), and exactly 0 on ignored
 * rows, which PyTorch never writes even when that sum is 0. *wt gets
 * weight[t] per row (NULL without weights). */
static kl_tensor *class_row_weights(const ag_ctx *c, kl_tensor *t, kl_tensor *g, kl_tensor **wt) {
    kl_dtype dt = (kl_dtype)c->in_meta[0].dtype;
    kl_tensor *valid = kl_ne_scalar(t, (double)ke_attr_cross_entropy_ignore_index(c->a)); /* nll_loss's too */
    kl_tensor *zero = zero_scalar(dt, c->in_meta[0].device), *w = class_weight(c), *r = g;
    *wt = NULL;
    if (w) {
        kl_tensor *tz = kl_masked_fill(t, kl_logical_not(valid), 0);
        *wt = kl_reshape(kl_index_select(w, 0, kl_reshape(tz, KL_SHAPE(-1))), kl_ndim(t), kl_shape(t));
    }
    if (ke_attr_reduction(c->a) == KL_REDUCE_MEAN)
        r = kl_div(g, *wt ? kl_sum(kl_where(valid, *wt, zero), KL_ALL_DIMS, false)
                          : kl_to_dtype(kl_sum(valid, KL_ALL_DIMS, false), dt));
    return kl_where(valid, r, zero);
}

/* one_hot(t) along the class dim, in the input's dtype and shape. */
static kl_tensor *class_one_hot(const ag_ctx *c, kl_tensor *t) {
    const ag_tmeta *m = &c->in_meta[0];
    kl_tensor *classes = along_classes(c, kl_to_device(kl_arange(0, (double)m->shape[class_dim(c)], 1, KL_I64), m->device));
    return kl_to_dtype(kl_eq(kl_unsqueeze(t, class_dim(c)), classes), (kl_dtype)m->dtype);
}

/* PyTorch 1.13 has no derivative of nll_loss for its weight. */
static int no_weight_grad(const ag_ctx *c) {
    if (c->nin > 2 && c->need[2])
        return ke_err(KL_ERR_UNSUPPORTED, ke_ops[c->op].name,
                      "is not differentiable with respect to weight with class-index targets (as in PyTorch 1.13)");
    return 0;
}

/* Probability targets: row loss sum_c w[c] q[c] (lse - x[c]), q = p (1 - ls) + ls / C, so
 * dx = (softmax(x) sum_c w q - w q) gr, dp = -(1 - ls) w log_softmax(x) gr,
 * dw = -sum over rows of q log_softmax(x) gr; gr = g (spread over the rows for a mean). */
static int ce_prob_backward(ag_ctx *c) {
    kl_tensor *x = c->in[0], *p = c->in[1], *w = class_weight(c), *g = c->gout[0];
    const ag_tmeta *m = &c->in_meta[0];
    int cd = class_dim(c);
    int64_t C = m->shape[cd], rows = numel_of(m) / (C > 0 ? C : 1);
    double ls = ke_attr_cross_entropy_label_smoothing(c->a);
    int red = ke_attr_reduction(c->a);
    kl_tensor *gr = red == KL_REDUCE_NONE ? kl_unsqueeze(g, cd)
                  : red == KL_REDUCE_MEAN ? kl_div_scalar(g, C == 0 ? 0.0 : (double)rows) : g;
    kl_tensor *wb = w ? along_classes(c, w) : NULL;
    kl_tensor *q = ls > 0 ? kl_add_scalar(kl_mul_scalar(p, 1 - ls), ls / (double)C) : p;
    kl_tensor *wq = wb ? kl_mul(q, wb) : q;
    kl_tensor *logp = (c->need[1] || (w && c->need[2])) ? kl_log_softmax(x, cd) : NULL;
    if (c->need[0]) {
        kl_tensor *d = kl_sub(kl_mul(kl_softmax(x, cd), kl_sum(wq, KL_DIMS(cd), true)), wq);
        if (!(c->gin[0] = kl_mul(d, gr))) return -1;
    }
    if (c->need[1]) {
        kl_tensor *d = kl_mul(wb ? kl_mul(logp, wb) : logp, kl_mul_scalar(gr, -(1 - ls)));
        if (!(c->gin[1] = d)) return -1;
    }
    if (w && c->need[2]) {
        int64_t dims[KL_MAX_DIMS];
        int n = 0;
        for (int d = 0; d < m->ndim; d++)
            if (d != cd) dims[n++] = d;
        kl_tensor *e = kl_neg(kl_mul(kl_mul(q, logp), gr));
        if (!(c->gin[2] = n ? kl_sum(e, n, dims, false) : e)) return -1;
    }
    return 0;
}

/* Row loss (1 - ls) w[t] (lse - x[t]) + ls / C sum_c w[c] (lse - x[c]) (w = 1
 * without weights), so dx = (softmax(x) ((1 - ls) w[t] + ls / C sum w)
 * - (1 - ls) w[t] one_hot(t) - ls / C w) * row weight. */
int ag_d_cross_entropy(ag_ctx *c) {
    if (ke_is_float((kl_dtype)c->in_meta[1].dtype)) return ce_prob_backward(c);
    if (no_weight_grad(c)) return -1;
    if (!c->need[0]) return 0;
    kl_tensor *x = c->in[0], *t = c->in[1], *g = c->gout[0], *w = class_weight(c), *wt;
    int cd = class_dim(c);
    double ls = ke_attr_cross_entropy_label_smoothing(c->a), C = (double)c->in_meta[0].shape[cd];
    kl_tensor *oh = class_one_hot(c, t);
    kl_tensor *rw = kl_unsqueeze(class_row_weights(c, t, g, &wt), cd);
    kl_tensor *d;
    if (!w) {
        d = kl_sub(kl_softmax(x, cd), ls > 0 ? kl_mul_scalar(oh, 1 - ls) : oh);
        if (ls > 0) d = kl_sub_scalar(d, ls / C);
    } else {
        kl_tensor *wtc = kl_mul_scalar(kl_unsqueeze(wt, cd), 1 - ls);
        kl_tensor *s = ls > 0 ? kl_add(wtc, kl_mul_scalar(kl_sum(w, KL_ALL_DIMS, false), ls / C)) : wtc;
        d = kl_sub(kl_mul(kl_softmax(x, cd), s), kl_mul(oh, wtc));
        if (ls > 0) d = kl_sub(d, kl_mul_scalar(along_classes(c, w), ls / C));
    }
    c->gin[0] = kl_mul(d, rw);
    return c->gin[0] ? 0 : -1;
}

/* Row loss -w[t] x[t]: dx = -one_hot(t) w[t] * row weight. */
int ag_d_nll_loss(ag_ctx *c) {
    if (no_weight_grad(c)) return -1;
    if (!c->need[0]) return 0;
    kl_tensor *t = c->in[1], *g = c->gout[0], *wt;
    kl_tensor *rw = kl_neg(class_row_weights(c, t, g, &wt));
    if (wt) rw = kl_mul(rw, wt);
    c->gin[0] = kl_mul(class_one_hot(c, t), kl_unsqueeze(rw, class_dim(c)));
    return c->gin[0] ? 0 : -1;
}

/* Elements a pair loss reduces: its operands' broadcast shape. */
static int64_t pair_numel(const ag_ctx *c) {
    const ag_tmeta *a = &c->in_meta[0], *b = &c->in_meta[1];
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        n *= sa == 1 ? sb : sa;
    }
    return n;
}

/* (a - b)^2: da = 2 (a - b) g, db = -da. */
int ag_d_mse_loss(ag_ctx *c) {
    kl_tensor *g = spread_reduction(c, c->gout[0], pair_numel(c));
    kl_tensor *da = kl_mul(kl_sub(c->in[0], c->in[1]), kl_mul_scalar(g, 2));
    if (c->need[0] && !(c->gin[0] = da)) return -1;
    if (c->need[1] && !(c->gin[1] = kl_neg(da))) return -1;
    return 0;
}

/* (1 - y) x + log(1 + exp(-x)): dx = (sigmoid(x) - y) g, dy = -x g. */
int ag_d_binary_cross_entropy_with_logits(ag_ctx *c) {
    kl_tensor *x = c->in[0], *y = c->in[1];
    kl_tensor *g = spread_reduction(c, c->gout[0], pair_numel(c));
    if (c->need[0] && !(c->gin[0] = kl_mul(kl_sub(kl_sigmoid(x), y), g))) return -1;
    if (c->need[1] && !(c->gin[1] = kl_neg(kl_mul(x, g)))) return -1;
    return 0;
}

/* ---- convolution and pooling ---------------------------------------------------------- */

typedef struct conv_params {
    int64_t st[2], pad[2], dil[2], groups;
} conv_params;

/* dL/dx of conv2d for g [N, O, OH, OW] and w [O, C/G, kh, kw] (x [N, C, H, W]):
 * the internal composite conv2d_input_grad (ops_nn.def; its decomposition is
 * the formula, the transposed convolution; its CPU kernel one GEMM + col2im
 * per chunk of samples). avg_pool2d's ceil_mode windows may end past the
 * input: the gradient is then taken for the input those windows span and
 * cropped to H x W. */
static kl_tensor *conv_input_grad(kl_tensor *g, kl_tensor *w, const conv_params *cp, const int64_t *in_hw) {
    const int64_t *gs = kl_shape(g), *ws = kl_shape(w);
    if (!gs || !ws) return NULL;
    ke_call call = {.op = KE_OP_conv2d_input_grad};
    int64_t span[2];
    int crop = 0;
    for (int d = 0; d < 2; d++) {
        span[d] = (gs[2 + d] - 1) * cp->st[d] - 2 * cp->pad[d] + cp->dil[d] * (ws[2 + d] - 1) + 1;
        if (span[d] > in_hw[d]) crop = 1;
        else span[d] = in_hw[d];
    }
    int64_t list[8] = {cp->st[0], cp->st[1], cp->pad[0], cp->pad[1], cp->dil[0], cp->dil[1], span[0], span[1]};
    if (ke_set_list(&call, 8, list)) return NULL;
    ke_attr_set_conv2d_input_grad_groups(&call.a, cp->groups);
    kl_tensor *in[2] = {g, w};
    if (kl_dtype_of(g) != kl_dtype_of(w) && !(in[0] = kl_to_dtype(g, kl_dtype_of(w)))) return NULL;
    kl_tensor *r = ag_call(KE_OP_conv2d_input_grad, 2, in, &call.a);
    if (crop) r = kl_narrow(kl_narrow(r, 2, 0, in_hw[0]), 3, 0, in_hw[1]);
    return r;
}

/* dL/dw of conv2d: the internal composite conv2d_weight_grad (ops_nn.def; its
 * decomposition is the formula, a conv2d with batch and channels swapped;
 * its CPU kernel one im2col + GEMM per chunk of samples). */
static kl_tensor *conv_weight_grad(kl_tensor *x, kl_tensor *g, const conv_params *cp, const ag_tmeta *wm) {
    ke_call call = {.op = KE_OP_conv2d_weight_grad};
    int64_t list[8] = {cp->st[0], cp->st[1], cp->pad[0], cp->pad[1], cp->dil[0], cp->dil[1], wm->shape[2], wm->shape[3]};
    if (ke_set_list(&call, 8, list)) return NULL;
    ke_attr_set_conv2d_weight_grad_groups(&call.a, cp->groups);
    kl_tensor *in[2] = {x, g};
    if (kl_dtype_of(g) != kl_dtype_of(x) && !(in[1] = kl_to_dtype(g, kl_dtype_of(x)))) return NULL;
    return ag_call(KE_OP_conv2d_weight_grad, 2, in, &call.a);
}

int ag_d_conv2d(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0], *wm = &c->in_meta[1];
    kl_tensor *g = c->gout[0];
    int batched = xm->ndim == 4;
    const int64_t *st = ke_attr_conv2d_stride(c->a), *pad = ke_attr_conv2d_padding(c->a),
                  *dil = ke_attr_conv2d_dilation(c->a);
    conv_params cp = {{st[0], st[1]}, {pad[0], pad[1]}, {dil[0], dil[1]}, ke_attr_conv2d_groups(c->a)};
    if (ke_attr_conv2d_has_bias(c->a) && c->need[2]) {
        c->gin[2] = batched ? kl_sum(g, KL_DIMS(0, 2, 3), false) : kl_sum(g, KL_DIMS(1, 2), false);
        if (!c->gin[2]) return -1;
    }
    /* an empty x or g: the other gradients are all zero (or empty) */
    if (numel_of(xm) == 0 || numel_of(&c->out_meta[0]) == 0) return 0;
    if (!batched) g = kl_unsqueeze(g, 0);
    if (c->need[0]) {
        kl_tensor *gx = conv_input_grad(g, c->in[1], &cp, xm->shape + batched + 1);
        c->gin[0] = batched ? gx : kl_squeeze(gx, 0);
        if (!c->gin[0]) return -1;
    }
    if (c->need[1]) {
        kl_tensor *x = batched ? c->in[0] : kl_unsqueeze(c->in[0], 0);
        if (!(c->gin[1] = conv_weight_grad(x, g, &cp, wm))) return -1;
    }
    return 0;
}

/* The gradient goes to each window's maximum (PyTorch's choice among ties
 * and NaNs): max_pool2d_backward, an internal composite whose decomposition
 * scatters g by max_pool2d_indices (double backward goes through it) and
 * whose CPU kernel does it in one pass per plane. */
int ag_d_max_pool2d(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0];
    int b = xm->ndim == 4;
    int64_t planes = (b ? xm->shape[0] : 1) * xm->shape[b];
    if (planes == 0 || xm->shape[b + 1] * xm->shape[b + 2] == 0) return 0;
    kl_tensor *in[2] = {c->gout[0], c->in[0]};
    if (kl_dtype_of(in[0]) != (kl_dtype)xm->dtype) in[0] = kl_to_dtype(in[0], (kl_dtype)xm->dtype);
    c->gin[0] = in[0] ? ag_call(KE_OP_max_pool2d_backward, 2, in, c->a) : NULL;
    return c->gin[0] ? 0 : -1;
}

/* 1 / divisor of the windows along one axis (0 for a window that misses
 * the input): the forward divides by a product of one factor per axis. */
static kl_tensor *pool_inverse_divisors(int64_t out, int64_t in, int64_t k, int64_t s, int64_t p, int cip,
                                        kl_dtype dt, kl_device dev) {
    double *v = malloc(sizeof(double) * (size_t)(out > 0 ? out : 1));
    if (!v) {
        ke_err(KL_ERR_OOM, "avg_pool2d", "out of memory for %lld window divisors", (long long)out);
        return NULL;
    }
    for (int64_t o = 0; o < out; o++) {
        int64_t hs = o * s - p, he = hs + k < in + p ? hs + k : in + p, pool = he - hs;
        int64_t cs = hs < 0 ? 0 : hs, ce = he > in ? in : he;
        v[o] = cs >= ce ? 0 : 1.0 / (double)(cip ? pool : ce - cs);
    }
    kl_tensor *t = kl_from_data(v, 1, &out, KL_F64);
    free(v);
    return kl_to_device(kl_to_dtype(t, dt), dev);
}

/* avg_pool2d is linear: its gradient spreads g / divisor over each window,
 * i.e. the transposed convolution of g / divisor with a kernel of ones (per
 * plane: planes become the batch). */
int ag_d_avg_pool2d(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0], *om = &c->out_meta[0];
    /* avg_pool2d has max_pool2d's attributes */
    int b = xm->ndim == 4, cip = ke_attr_max_pool2d_count_include_pad(c->a);
    const int64_t *k = ke_attr_max_pool2d_kernel_size(c->a), *s = ke_attr_max_pool2d_stride(c->a),
                  *pad = ke_attr_max_pool2d_padding(c->a);
    int64_t H = xm->shape[b + 1], W = xm->shape[b + 2], OH = om->shape[b + 1], OW = om->shape[b + 2];
    int64_t planes = (b ? xm->shape[0] : 1) * xm->shape[b];
    if (planes == 0 || H == 0 || W == 0) return 0;
    kl_tensor *g = c->gout[0];
    kl_dtype dt = kl_dtype_of(g);
    kl_tensor *ih = pool_inverse_divisors(OH, H, k[0], s[0], pad[0], cip, dt, xm->device);
    kl_tensor *iw = pool_inverse_divisors(OW, W, k[1], s[1], pad[1], cip, dt, xm->device);
    g = kl_mul(kl_mul(g, kl_unsqueeze(ih, 1)), iw);
    kl_tensor *ones = kl_fill_inplace(kl_empty_on(4, (int64_t[]){1, 1, k[0], k[1]}, dt, xm->device), 1);
    conv_params cp = {{s[0], s[1]}, {pad[0], pad[1]}, {1, 1}, 1};
    kl_tensor *gx = conv_input_grad(kl_reshape(g, 4, (int64_t[]){planes, 1, OH, OW}), ones, &cp,
                                    (int64_t[]){H, W});
    c->gin[0] = kl_reshape(gx, xm->ndim, xm->shape);
    return c->gin[0] ? 0 : -1;
}

/* adaptive_avg_pool2d is linear and separable: y = A_h x A_w^T per plane,
 * with A [out, in] holding 1 / window length inside each window. So
 * dx = A_h^T g A_w, two matrix products (batched over the planes). */
static kl_tensor *adaptive_matrix(int64_t out, int64_t in, kl_dtype dt, kl_device dev) {
    int64_t n;
    if (ke_mul_ov(out, in, &n) || n > ((int64_t)1 << 40) / (int64_t)sizeof(double)) {
        ke_err(KL_ERR_OOM, "adaptive_avg_pool2d", "window matrix %lldx%lld is too large", (long long)out, (long long)in);
        return NULL;
    }
    double *v = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!v) {
        ke_err(KL_ERR_OOM, "adaptive_avg_pool2d", "out of memory for a %lldx%lld window matrix", (long long)out,
               (long long)in);
        return NULL;
    }
    for (int64_t o = 0; o < out; o++) {
        int64_t s = (o * in) / out, e = ((o + 1) * in + out - 1) / out;
        for (int64_t i = s; i < e; i++) v[o * in + i] = 1.0 / (double)(e - s);
    }
    kl_tensor *t = kl_from_data(v, 2, (int64_t[]){out, in}, KL_F64);
    free(v);
    return kl_to_device(kl_to_dtype(t, dt), dev);
}

int ag_d_adaptive_avg_pool2d(ag_ctx *c) {
    const ag_tmeta *xm = &c->in_meta[0], *om = &c->out_meta[0];
    int b = xm->ndim == 4;
    if (numel_of(xm) == 0 || numel_of(om) == 0) return 0;
    kl_tensor *g = c->gout[0];
    kl_dtype dt = kl_dtype_of(g);
    kl_tensor *ah = adaptive_matrix(om->shape[b + 1], xm->shape[b + 1], dt, xm->device);
    kl_tensor *aw = adaptive_matrix(om->shape[b + 2], xm->shape[b + 2], dt, xm->device);
    c->gin[0] = kl_matmul(kl_matmul(kl_t(ah), g), aw);
    return c->gin[0] ? 0 : -1;
}
