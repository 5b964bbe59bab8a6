/*
 * shape.c — the shape and dtype rules shared by many rows of the op table:
 * PyTorch's result_type, broadcasting, the accept check, and the generic
 * rules for same-shape, broadcast and reduction ops. Backends, the tracer and
 * the IR verifier all call these, so each rule exists once.
 */
#include "dispatch.h"

#include <stdio.h>

/* PyTorch's combine_categories: a higher-priority class of operands (dimensioned
 * tensors over 0-dim tensors over C scalars) keeps its dtype unless a lower one
 * is of a higher category (bool < int < float). */
static int combine(int higher, int lower) {
    if (higher < 0) return lower;
    if (lower < 0) return higher;
    if (ke_is_float((kl_dtype)higher)) return higher;
    if (higher == KL_BOOL || ke_is_float((kl_dtype)lower)) return kl_promote_types((kl_dtype)higher, (kl_dtype)lower);
    return higher;
}

static int promote_opt(int a, kl_dtype b) { return a < 0 ? (int)b : (int)kl_promote_types((kl_dtype)a, b); }

kl_dtype ke_result_type(int n, kl_tensor *const *ts) {
    /* Most calls mix tensors of one dtype: then the tiers cannot matter
     * (a wrapped scalar's dtype only says its category, so it still can). */
    int same = n > 0;
    for (int i = 0; i < n && same; i++)
        same = ts[i]->dtype == ts[0]->dtype && !(ts[i]->flags & KE_TF_WRAPPED);
    if (same) return (kl_dtype)ts[0]->dtype;
    int dim = -1, zero = -1, wrapped = -1;
    for (int i = 0; i < n; i++) {
        const kl_tensor *t = ts[i];
        kl_dtype d = (kl_dtype)t->dtype;
        if (t->flags & KE_TF_WRAPPED)
            wrapped = promote_opt(wrapped, ke_is_float(d) ? kl_get_default_dtype() : d);
        else if (t->ndim == 0)
            zero = promote_opt(zero, d);
        else
            dim = promote_opt(dim, d);
    }
    int r = combine(dim, combine(zero, wrapped));
    return r < 0 ? kl_get_default_dtype() : (kl_dtype)r;
}

static const char *accept_what(int acc) {
    switch (acc) {
    case KE_ACC_NUM: return "numeric (non-bool)";
    case KE_ACC_INTBOOL: return "integer or bool";
    case KE_ACC_FLOAT: return "floating-point";
    case KE_ACC_NOBOOL_SIGN: return "numeric (non-bool)";
    default: return "any";
    }
}

static int accepts(int acc, kl_dtype d) {
    switch (acc) {
    case KE_ACC_NUM:
    case KE_ACC_NOBOOL_SIGN: return d != KL_BOOL;
    case KE_ACC_INTBOOL: return !ke_is_float(d);
    case KE_ACC_FLOAT: return ke_is_float(d);
    default: return 1;
    }
}

int ke_rule_dtype(ke_call *c, kl_dtype *out) {
    const ke_op_info *op = &ke_ops[c->op];
    for (int i = 0; i < c->nin && op->accept != KE_ACC_ALL; i++) {
        kl_dtype d = (kl_dtype)c->in[i]->dtype;
        /* a wrapped scalar's category is checked through the result below */
        if (!(c->in[i]->flags & KE_TF_WRAPPED) && !accepts(op->accept, d)) {
            char b[256];
            return ke_err(KL_ERR_DTYPE, op->name, "expects %s tensors, got %s (argument %d)",
                          accept_what(op->accept), ke_fmt_tensor(b, sizeof b, c->in[i]), i + 1);
        }
    }
    kl_dtype r = c->nin ? ke_result_type(c->nin, c->in) : kl_get_default_dtype();
    if (op->accept == KE_ACC_INTBOOL && ke_is_float(r))
        return ke_err(KL_ERR_DTYPE, op->name, "expects integer or bool operands, got a %s scalar", "float");
    switch (op->dtype_rule) {
    case KE_DT_PROMOTE: *out = r; c->compute = ke_compute_dtype(r); break;
    case KE_DT_FLOAT:
        if (!ke_is_float(r)) r = kl_get_default_dtype();
        *out = r;
        c->compute = ke_compute_dtype(r);
        break;
    case KE_DT_BOOL: *out = KL_BOOL; c->compute = ke_compute_dtype(r); break;
    case KE_DT_I64: *out = KL_I64; c->compute = ke_compute_dtype(c->nin ? (kl_dtype)c->in[0]->dtype : r); break;
    case KE_DT_FIRST: *out = (kl_dtype)c->in[0]->dtype; c->compute = ke_compute_dtype(*out); break;
    case KE_DT_ATTR: {
        kl_dtype d = ke_attr_dtype(&c->a);
        if (!ke_dtype_valid(d)) return ke_err(KL_ERR_DTYPE, op->name, "invalid dtype value %d", (int)d);
        *out = d;
        c->compute = ke_compute_dtype(d);
        break;
    }
    default: return ke_err(KL_ERR_INTERNAL, op->name, "op has a custom dtype rule but uses a shared one");
    }
    return 0;
}

int ke_broadcast_shapes(const char *op, int n, kl_tensor *const *ts, int *ndim, int64_t *shape) {
    int nd = 0, same = 1;
    for (int i = 1; i < n && same; i++)
        same = ts[i]->ndim == ts[0]->ndim && !memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * ts[0]->ndim);
    if (same && n > 0) {
        *ndim = ts[0]->ndim;
        memcpy(shape, ts[0]->shape, sizeof(int64_t) * ts[0]->ndim);
        return 0;
    }
    for (int i = 0; i < n; i++)
        if (ts[i]->ndim > nd) nd = ts[i]->ndim;
    for (int d = 0; d < nd; d++) shape[d] = 1;
    for (int i = 0; i < n; i++) {
        const kl_tensor *t = ts[i];
        int off = nd - t->ndim;
        for (int d = 0; d < t->ndim; d++) {
            int64_t s = t->shape[d], *o = &shape[off + d];
            if (s == *o || s == 1) continue;
            if (*o == 1) {
                *o = s;
                continue;
            }
            /* name every operand's shape, as "[2,3] and [4]" */
            char msg[600];
            size_t m = 0;
            msg[0] = 0;
            for (int j = 0; j < n && m < sizeof msg; j++) {
                char b[200];
                m += (size_t)snprintf(msg + m, sizeof msg - m, "%s%s", j == 0 ? "" : (j == n - 1 ? " and " : ", "),
                                      ke_fmt_shape(b, sizeof b, ts[j]->ndim, ts[j]->shape));
            }
            return ke_err(KL_ERR_SHAPE, op, "shapes %s cannot broadcast", msg);
        }
    }
    *ndim = nd;
    return 0;
}

void ke_broadcast_strides(const kl_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    int off = ndim - t->ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - off;
        stride[d] = (sd < 0 || (t->shape[sd] == 1 && shape[d] != 1)) ? 0 : t->stride[sd];
    }
}

int ke_infer_same(ke_call *c, ke_outspec *out) {
    if (ke_rule_dtype(c, &out->dtype)) return -1;
    const kl_tensor *x = c->in[0];
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

int ke_infer_broadcast(ke_call *c, ke_outspec *out) {
    if (ke_broadcast_shapes(ke_opname(c), c->nin, c->in, &out->ndim, out->shape)) return -1;
    if (ke_rule_dtype(c, &out->dtype)) return -1;
    return 1;
}

int ke_reduce_mask(ke_call *c, int ndim, uint32_t *mask) {
    uint32_t m = 0;
    int n = ke_attr_dims_len(&c->a);
    const int64_t *dims = ke_attr_dims(&c->a);
    if (n == 0) {
        m = ndim ? (1u << ndim) - 1 : 0;
    } else {
        for (int i = 0; i < n; i++) {
            int d = ke_wrap_dim(ke_opname(c), dims[i], ndim);
            if (d < 0) return -1;
            if (ndim == 0) continue;
            if (m & (1u << d))
                return ke_err(KL_ERR_ARG, ke_opname(c), "dim %d appears more than once in the dim list", d);
            m |= 1u << d;
        }
    }
    *mask = m;
    return 0;
}

int ke_infer_reduce(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    uint32_t mask;
    if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
    if (ke_ops[c->op].dtype_rule != KE_DT_CUSTOM && ke_rule_dtype(c, &out->dtype)) return -1;
    int keep = ke_attr_keepdim(&c->a), nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (mask & (1u << d)) {
            if (keep) out->shape[nd++] = 1;
        } else {
            out->shape[nd++] = x->shape[d];
        }
    }
    out->ndim = nd;
    return 1;
}
