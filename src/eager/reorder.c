/*
 * reorder.c — flip, roll and one_hot (rows in ops_index.def), with their
 * public wrappers.
 *
 * flip is one strided copy (ke_copy_nd) that reads x backwards along the
 * flipped dims; roll decomposes into narrow + cat per rolled dim, so autograd
 * and tracing see only those. one_hot writes int64 rows of zeros with a 1 at
 * each class index; its kernel checks every index before the first write.
 */
#include "kernels_index.h"

#include <math.h>
#include <stdlib.h>

/* ---- flip ----------------------------------------------------------------------------------- */

/* The flipped dims as a mask; -1 on a bad or repeated dim. */
static int flip_mask(ke_call *c, int ndim, uint32_t *mask) {
    const char *op = ke_opname(c);
    const int64_t *dims = ke_attr_flip_dims(&c->a);
    uint32_t m = 0;
    for (int i = 0; i < ke_attr_flip_dims_len(&c->a); i++) {
        int d = ke_wrap_dim(op, dims[i], ndim);
        if (d < 0) return -1;
        if (ndim == 0) continue;
        if (m & (1u << d)) return ke_err(KL_ERR_ARG, op, "dim %d appears more than once in the dim list", d);
        m |= 1u << d;
    }
    *mask = m;
    return 0;
}

int ke_infer_flip(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    uint32_t m;
    if (flip_mask(c, x->ndim, &m)) return -1;
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

int ke_cpu_flip(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    uint32_t m = 0;
    if (flip_mask(c, x->ndim, &m)) return -1;
    size_t es = ke_dtypes[x->dtype].size;
    if (ke_numel(x->ndim, x->shape) == 0) return 0;
    if (x->ndim == 0) {
        memcpy(ke_data(o), ke_data(x), es);
        return 0;
    }
    int64_t ss[KL_MAX_DIMS], first = 0; /* the source starts at the last element of each flipped dim */
    for (int d = 0; d < x->ndim; d++) {
        int f = (m >> d) & 1;
        ss[d] = f ? -x->stride[d] : x->stride[d];
        if (f) first += (x->shape[d] - 1) * x->stride[d];
    }
    ke_copy_nd(x->ndim, x->shape, ke_data(o), (kl_dtype)o->dtype, o->stride, ke_data(x) + first * (int64_t)es,
               (kl_dtype)x->dtype, ss);
    return 0;
}

/* ---- roll (decomposition) ------------------------------------------------------------------- */

/* x rolled by s along d: the last s elements move to the front. */
static kl_tensor *roll1(kl_tensor *x, int64_t shift, int d) {
    int64_t n = x->shape[d], s = n ? ((shift % n) + n) % n : 0;
    if (s == 0) return x;
    kl_tensor *parts[2] = {kl_narrow(x, d, n - s, s), kl_narrow(x, d, 0, n - s)};
    return kl_cat(2, parts, d);
}

int ke_decomp_roll(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0];
    const int64_t *l = ke_attr_roll_shifts_dims(&c->a);
    int nl = ke_attr_roll_shifts_dims_len(&c->a);
    int64_t nd = ke_attr_roll_ndims(&c->a);
    if (nd == 0 && nl != 1)
        return ke_err(KL_ERR_ARG, op, "without dims, shifts must have one element (the flattened tensor), got %d", nl);
    if (nd != 0 && (nd < 0 || nd > KE_MAX_LIST / 2 || nl != 2 * nd))
        return ke_err(KL_ERR_ARG, op, "shifts and dims must have the same length (%lld dims)", (long long)nd);
    for (int i = 0; i < nd; i++)
        if (ke_wrap_dim(op, l[nd + i], x->ndim) < 0) return -1;
    kl_scope_begin();
    kl_tensor *y;
    if (nd == 0) {
        y = kl_reshape(roll1(kl_reshape(x, 1, (const int64_t[]){-1}), l[0], 0), x->ndim, x->shape);
    } else {
        y = x;
        for (int i = 0; i < nd && y; i++)
            y = x->ndim ? roll1(y, l[i], ke_wrap_dim(op, l[nd + i], x->ndim)) : y;
    }
    if (y == x) y = kl_clone(x); /* a new tensor, never the input itself */
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* ---- one_hot -------------------------------------------------------------------------------- */

int ke_infer_one_hot(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    char b[256];
    int64_t nc = ke_attr_one_hot_num_classes(&c->a);
    if (x->dtype != KL_I64)
        return ke_err(KL_ERR_DTYPE, op, "class indices must be int64, got %s", ke_fmt_tensor(b, sizeof b, x));
    if (nc < 0)
        return ke_err(KL_ERR_ARG, op,
                      "num_classes = %lld: -1 (infer from the data) is resolved by kl_one_hot on CPU data, "
                      "not on %s", (long long)nc, ke_fmt_tensor(b, sizeof b, x));
    if (x->ndim >= KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, op, "%s has %d dims: the result would need more than %d",
                      ke_fmt_tensor(b, sizeof b, x), x->ndim, KL_MAX_DIMS);
    out->dtype = KL_I64;
    c->compute = KL_I64;
    out->ndim = x->ndim + 1;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    out->shape[x->ndim] = nc;
    if (ke_check_shape(op, out->ndim, out->shape, KL_I64)) return -1;
    return 1;
}

int ke_one_hot_range_error(const char *op, int64_t v, int64_t nc) {
    return ke_err(KL_ERR_INDEX, op, "class value %lld is out of range [0, %lld) (num_classes = %lld)", (long long)v,
                  (long long)nc, (long long)nc);
}

int ke_cpu_one_hot(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    int64_t n = ke_numel(x->ndim, x->shape), nc = ke_attr_one_hot_num_classes(&c->a);
    if (n == 0) return 0;
    int64_t *idx = malloc(sizeof *idx * (size_t)n), cs[KL_MAX_DIMS];
    if (!idx) return ke_err(KL_ERR_OOM, op, "out of memory for %lld indices", (long long)n);
    ke_contiguous_strides(x->ndim, x->shape, cs);
    if (x->ndim)
        ke_copy_nd(x->ndim, x->shape, (char *)idx, KL_I64, cs, ke_data(x), KL_I64, x->stride);
    else
        idx[0] = *(const int64_t *)ke_data(x);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= nc) {
            int64_t v = idx[i];
            free(idx);
            return ke_one_hot_range_error(op, v, nc);
        }
    int64_t *y = (int64_t *)ke_data(o);
    memset(y, 0, sizeof *y * (size_t)(n * nc));
    for (int64_t i = 0; i < n; i++) y[i * nc + idx[i]] = 1;
    free(idx);
    return 0;
}

/* ---- public wrappers ------------------------------------------------------------------------ */

kl_tensor *kl_flip(kl_tensor *x, int ndims, const int64_t *dims) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_flip, .nin = 1, .in = in};
    if (ndims < 0 || (ndims > 0 && !dims)) {
        ke_err(KL_ERR_ARG, "flip", "bad dim list (%d dims, %s)", ndims, dims ? "non-NULL" : "NULL");
        return NULL;
    }
    if (ke_set_list(&c, ndims, dims)) return NULL;
    return ke_call1(&c);
}

kl_tensor *kl_roll(kl_tensor *x, int n, const int64_t *shifts, const int64_t *dims) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_roll, .nin = 1, .in = in};
    if (n < 1 || !shifts || (dims && 2 * n > KE_MAX_LIST)) {
        ke_err(KL_ERR_ARG, "roll", "needs 1 to %d shifts (got %d, shifts %s)", KE_MAX_LIST / 2, n,
               shifts ? "non-NULL" : "NULL");
        return NULL;
    }
    int64_t l[KE_MAX_LIST];
    for (int i = 0; i < n && (dims || i == 0); i++) {
        l[i] = shifts[i];
        if (dims) l[n + i] = dims[i];
    }
    if (!dims && n != 1) {
        ke_err(KL_ERR_ARG, "roll", "without dims, shifts must have one element (the flattened tensor), got %d", n);
        return NULL;
    }
    if (ke_set_list(&c, dims ? 2 * n : 1, l)) return NULL;
    ke_attr_set_roll_ndims(&c.a, dims ? n : 0);
    return ke_call1(&c);
}

kl_tensor *kl_one_hot(kl_tensor *x, int64_t num_classes) {
    if (ke_check_tensor(x, "one_hot", 1)) return NULL;
    if (num_classes < -1) {
        ke_err(KL_ERR_ARG, "one_hot", "num_classes must be -1 (infer) or >= 0, got %lld", (long long)num_classes);
        return NULL;
    }
    if (num_classes == -1) { /* the largest class + 1: reads the data (a trace break while tracing) */
        char b[256];
        if (x->dtype != KL_I64) {
            ke_err(KL_ERR_DTYPE, "one_hot", "class indices must be int64, got %s", ke_fmt_tensor(b, sizeof b, x));
            return NULL;
        }
        if (ke_numel(x->ndim, x->shape) == 0) {
            ke_err(KL_ERR_ARG, "one_hot", "cannot infer num_classes from the empty tensor %s",
                   ke_fmt_tensor(b, sizeof b, x));
            return NULL;
        }
        kl_scope_begin();
        kl_tensor *m = kl_amax(x, 0, NULL, false);
        double v = m ? kl_item(m) : NAN; /* NaN: failed, error recorded (a trace break, a meta tensor) */
        kl_scope_end();
        if (isnan(v)) return NULL;
        num_classes = v + 1 > 0 ? (int64_t)v + 1 : 0;
    }
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_one_hot, .nin = 1, .in = in};
    ke_attr_set_one_hot_num_classes(&c.a, num_classes);
    return ke_call1(&c);
}
