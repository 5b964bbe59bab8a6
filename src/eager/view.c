/*
 * view.c — view ops (rows in ops_view.def) and their public wrappers. A view
 * rule computes shape, strides and offset and makes a header over the same
 * storage; it runs unchanged on every backend (Meta included). Composite
 * views (reshape, flatten, narrow, ...) decompose into the primitive ones.
 */
#include "optable.h" /* declares this file's view rules and decompositions */

#include <limits.h>
#include <stdio.h>

static int make_view(ke_call *c, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset) {
    kl_tensor *t = ke_tensor_view(c->in[0], ndim, shape, stride, offset);
    if (!t) return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory allocating a view header");
    c->out[0] = t;
    c->nout = 1;
    ke_scope_adopt(t);
    return 0;
}

/* Strides for viewing x as `shape` without copying, or -1 if impossible
 * (PyTorch's computeStride: split/merge dims only within contiguous chunks). */
static int view_strides(const kl_tensor *x, int ndim, const int64_t *shape, int64_t *stride) {
    int64_t numel = ke_numel(x->ndim, x->shape);
    if (numel == 0 || x->ndim == 0) { /* no element, or one: any strides work */
        ke_contiguous_strides(ndim, shape, stride);
        return 0;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = x->ndim ? x->stride[x->ndim - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = x->ndim - 1; tensor_d >= 0; tensor_d--) {
        tensor_numel *= x->shape[tensor_d];
        if (tensor_d == 0 || (x->shape[tensor_d - 1] != 1 &&
                              x->stride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return -1;
            if (tensor_d > 0) {
                chunk_base_stride = x->stride[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if (view_d != -1) return -1;
    return 0;
}

/* Resolves one -1 in shape against numel; checks the element count. */
static int infer_size(const char *op, const kl_tensor *x, int ndim, int64_t *shape) {
    int64_t numel = ke_numel(x->ndim, x->shape), known = 1, span = 1; /* span: the product without the 0s */
    int neg = -1;
    char b1[200], b2[256];
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (neg >= 0) return ke_err(KL_ERR_SHAPE, op, "only one dimension can be -1 in %s",
                                        ke_fmt_shape(b1, sizeof b1, ndim, shape));
            neg = i;
        } else if (shape[i] < 0) {
            return ke_err(KL_ERR_SHAPE, op, "invalid shape %s", ke_fmt_shape(b1, sizeof b1, ndim, shape));
        } else {
            /* checked without the 0s too: an empty result's strides are products of its other dims */
            if (shape[i] && span > INT64_MAX / shape[i])
                return ke_err(KL_ERR_OVERFLOW, op, "shape %s is too large", ke_fmt_shape(b1, sizeof b1, ndim, shape));
            known *= shape[i];
            if (shape[i]) span *= shape[i];
        }
    }
    if (neg >= 0) {
        if (known == 0 || numel % known)
            return ke_err(KL_ERR_SHAPE, op, "shape %s is invalid for input %s", ke_fmt_shape(b1, sizeof b1, ndim, shape),
                          ke_fmt_tensor(b2, sizeof b2, x));
        shape[neg] = numel / known;
    } else if (known != numel) {
        return ke_err(KL_ERR_SHAPE, op, "shape %s is invalid for input %s", ke_fmt_shape(b1, sizeof b1, ndim, shape),
                      ke_fmt_tensor(b2, sizeof b2, x));
    }
    return 0;
}

int ke_view_view(ke_call *c) {
    const kl_tensor *x = c->in[0];
    int nd = ke_attr_view_shape_len(&c->a);
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    if (nd > KL_MAX_DIMS) return ke_err(KL_ERR_SHAPE, ke_opname(c), "%d dims requested; at most %d", nd, KL_MAX_DIMS);
    memcpy(shape, ke_attr_view_shape(&c->a), sizeof(int64_t) * nd);
    if (infer_size(ke_opname(c), x, nd, shape)) return -1;
    if (view_strides(x, nd, shape, stride)) {
        char b1[200], b2[256];
        return ke_err(KL_ERR_SHAPE, ke_opname(c),
                      "cannot view %s (strides incompatible) as %s: use kl_reshape, which copies",
                      ke_fmt_tensor(b2, sizeof b2, x), ke_fmt_shape(b1, sizeof b1, nd, shape));
    }
    return make_view(c, nd, shape, stride, x->offset);
}

int ke_view_permute(ke_call *c) {
    const kl_tensor *x = c->in[0];
    const int64_t *dims = ke_attr_permute_dims(&c->a);
    if (ke_attr_permute_dims_len(&c->a) != x->ndim)
        return ke_err(KL_ERR_ARG, ke_opname(c), "got %d dims for a tensor with %d dims",
                      ke_attr_permute_dims_len(&c->a), x->ndim);
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    unsigned seen = 0;
    for (int i = 0; i < x->ndim; i++) {
        int d = ke_wrap_dim(ke_opname(c), dims[i], x->ndim);
        if (d < 0) return -1;
        if (seen & (1u << d)) return ke_err(KL_ERR_ARG, ke_opname(c), "dim %d repeated in the permutation", d);
        seen |= 1u << d;
        shape[i] = x->shape[d];
        stride[i] = x->stride[d];
    }
    return make_view(c, x->ndim, shape, stride, x->offset);
}

int ke_view_transpose(ke_call *c) {
    const kl_tensor *x = c->in[0];
    int d0 = ke_wrap_dim(ke_opname(c), ke_attr_transpose_dim0(&c->a), x->ndim), d1;
    if (d0 < 0 || (d1 = ke_wrap_dim(ke_opname(c), ke_attr_transpose_dim1(&c->a), x->ndim)) < 0) return -1;
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(stride, x->stride, sizeof stride);
    if (x->ndim) {
        shape[d0] = x->shape[d1], shape[d1] = x->shape[d0];
        stride[d0] = x->stride[d1], stride[d1] = x->stride[d0];
    }
    return make_view(c, x->ndim, shape, stride, x->offset);
}

int ke_view_expand(ke_call *c) {
    const kl_tensor *x = c->in[0];
    int nd = ke_attr_expand_shape_len(&c->a);
    const int64_t *to = ke_attr_expand_shape(&c->a);
    char b1[200], b2[256];
    if (nd < x->ndim || nd > KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "cannot expand %s to %s", ke_fmt_tensor(b2, sizeof b2, x),
                      ke_fmt_shape(b1, sizeof b1, nd, to));
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    int off = nd - x->ndim;
    for (int d = 0; d < nd; d++) {
        int64_t want = to[d];
        int sd = d - off;
        if (sd < 0) {
            if (want < 0)
                return ke_err(KL_ERR_SHAPE, ke_opname(c), "-1 is not allowed for a new leading dim in %s",
                              ke_fmt_shape(b1, sizeof b1, nd, to));
            shape[d] = want;
            stride[d] = 0;
        } else if (want == -1 || want == x->shape[sd]) {
            shape[d] = x->shape[sd];
            stride[d] = x->stride[sd];
        } else if (x->shape[sd] == 1 && want >= 0) {
            shape[d] = want;
            stride[d] = 0;
        } else {
            return ke_err(KL_ERR_SHAPE, ke_opname(c),
                          "cannot expand %s to %s: dim %d has size %lld, not 1", ke_fmt_tensor(b2, sizeof b2, x),
                          ke_fmt_shape(b1, sizeof b1, nd, to), sd, (long long)x->shape[sd]);
        }
    }
    if (ke_check_shape(ke_opname(c), nd, shape, (kl_dtype)x->dtype)) return -1;
    return make_view(c, nd, shape, stride, x->offset);
}

int ke_view_squeeze(ke_call *c) {
    const kl_tensor *x = c->in[0];
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    int nd = 0, all = ke_attr_squeeze_all(&c->a), dim = -1;
    if (!all && (dim = ke_wrap_dim(ke_opname(c), ke_attr_squeeze_dim(&c->a), x->ndim)) < 0) return -1;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] == 1 && (all || d == dim)) continue;
        shape[nd] = x->shape[d];
        stride[nd++] = x->stride[d];
    }
    return make_view(c, nd, shape, stride, x->offset);
}

int ke_view_unsqueeze(ke_call *c) {
    const kl_tensor *x = c->in[0];
    if (x->ndim >= KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "cannot add a dim to a tensor with %d dims", x->ndim);
    int d = ke_wrap_dim(ke_opname(c), ke_attr_unsqueeze_dim(&c->a), x->ndim + 1);
    if (d < 0) return -1;
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    for (int i = 0, j = 0; i <= x->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            stride[i] = j < x->ndim ? x->stride[j] * x->shape[j] : 1;
        } else {
            shape[i] = x->shape[j];
            stride[i] = x->stride[j];
            j++;
        }
    }
    return make_view(c, x->ndim + 1, shape, stride, x->offset);
}

int ke_view_slice(ke_call *c) {
    const kl_tensor *x = c->in[0];
    if (x->ndim == 0) return ke_err(KL_ERR_INDEX, ke_opname(c), "cannot slice a 0-dim tensor");
    int d = ke_wrap_dim(ke_opname(c), ke_attr_slice_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    int64_t n = x->shape[d], start = ke_attr_slice_start(&c->a), end = ke_attr_slice_end(&c->a),
            step = ke_attr_slice_step(&c->a);
    if (step <= 0) return ke_err(KL_ERR_ARG, ke_opname(c), "step must be positive, got %lld", (long long)step);
    /* Python semantics: negative indices count from the end; clamp to [0, n]. */
    if (start < 0) start = start < -n ? 0 : start + n;
    if (end < 0) end = end < -n ? 0 : end + n;
    if (start > n) start = n;
    if (end > n) end = n;
    if (end < start) end = start;
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    memcpy(stride, x->stride, sizeof stride);
    /* ceil((end - start) / step) without forming end - start + step - 1,
     * which overflows for a huge step */
    shape[d] = end == start ? 0 : (end - start - 1) / step + 1;
    /* a step that overflows the stride takes at most one element, whose
     * stride is never used */
    if (ke_mul_ov(x->stride[d], step, &stride[d])) {
        if (shape[d] > 1) return ke_err(KL_ERR_OVERFLOW, ke_opname(c), "stride %lld times step %lld overflows",
                                        (long long)x->stride[d], (long long)step);
        stride[d] = x->stride[d];
    }
    int64_t offset;
    if (ke_mul_ov(start, x->stride[d], &offset) || ke_add_ov(offset, x->offset, &offset)) {
        /* only start == n of a 1-element dim with an as_strided stride gets here: empty */
        if (shape[d]) return ke_err(KL_ERR_OVERFLOW, ke_opname(c), "offset of element %lld overflows", (long long)start);
        offset = x->offset;
    }
    return make_view(c, x->ndim, shape, stride, offset);
}

int ke_view_select(ke_call *c) {
    const kl_tensor *x = c->in[0];
    if (x->ndim == 0) return ke_err(KL_ERR_INDEX, ke_opname(c), "cannot select from a 0-dim tensor");
    int d = ke_wrap_dim(ke_opname(c), ke_attr_select_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    int64_t n = x->shape[d], i = ke_attr_select_index(&c->a);
    if (i < -n || i >= n) {
        char b[256];
        return ke_err(KL_ERR_INDEX, ke_opname(c), "index %lld out of range for dim %d of %s", (long long)i, d,
                      ke_fmt_tensor(b, sizeof b, x));
    }
    if (i < 0) i += n;
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    for (int s = 0, o = 0; s < x->ndim; s++) {
        if (s == d) continue;
        shape[o] = x->shape[s];
        stride[o++] = x->stride[s];
    }
    return make_view(c, x->ndim - 1, shape, stride, x->offset + i * x->stride[d]);
}

int ke_view_as_strided(ke_call *c) {
    const kl_tensor *x = c->in[0];
    int nd = (int)ke_attr_as_strided_ndim(&c->a);
    int64_t offset = ke_attr_as_strided_offset(&c->a);
    if (nd < 0 || nd > KL_MAX_DIMS || ke_attr_as_strided_size_stride_len(&c->a) != 2 * nd)
        return ke_err(KL_ERR_ARG, ke_opname(c), "bad dims count %d", nd);
    const int64_t *shape = ke_attr_as_strided_size_stride(&c->a), *stride = shape + nd;
    if (ke_check_shape(ke_opname(c), nd, shape, (kl_dtype)x->dtype)) return -1;
    if (offset < 0) return ke_err(KL_ERR_ARG, ke_opname(c), "negative storage offset %lld", (long long)offset);
    /* The furthest element must lie inside the storage: never read out of bounds. */
    int64_t lo = offset, hi = offset, span;
    int empty = 0, over = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 0) empty = 1;
        over |= ke_mul_ov(shape[d] ? shape[d] - 1 : 0, stride[d], &span) ||
                ke_add_ov(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
    }
    int64_t cap = (int64_t)(x->storage->nbytes / ke_dtypes[x->dtype].size);
    if (!empty && (over || lo < 0 || hi >= cap)) {
        char b[200];
        return ke_err(KL_ERR_INDEX, ke_opname(c),
                      "view of shape %s with offset %lld reaches outside a storage of %lld elements",
                      ke_fmt_shape(b, sizeof b, nd, shape), (long long)offset, (long long)cap);
    }
    return make_view(c, nd, shape, stride, offset);
}

int ke_view_alias(ke_call *c) {
    const kl_tensor *x = c->in[0];
    return make_view(c, x->ndim, x->shape, x->stride, x->offset);
}

/* ---- composite views ---------------------------------------------------- */


int ke_decomp_reshape(ke_call *c) {
    kl_tensor *x = c->in[0];
    int nd = ke_attr_reshape_shape_len(&c->a);
    int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
    if (nd > KL_MAX_DIMS) return ke_err(KL_ERR_SHAPE, ke_opname(c), "%d dims requested; at most %d", nd, KL_MAX_DIMS);
    memcpy(shape, ke_attr_reshape_shape(&c->a), sizeof(int64_t) * nd);
    if (infer_size(ke_opname(c), x, nd, shape)) return -1;
    if (view_strides(x, nd, shape, stride) == 0) return ke_set_out1(c, kl_view(x, nd, shape));
    kl_scope_begin();
    kl_tensor *y = kl_view(kl_clone(x), nd, shape);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

int ke_decomp_flatten(ke_call *c) {
    kl_tensor *x = c->in[0];
    if (x->ndim == 0) return ke_set_out1(c, kl_reshape(x, 1, (int64_t[]){1}));
    int s = ke_wrap_dim(ke_opname(c), ke_attr_flatten_start_dim(&c->a), x->ndim), e;
    if (s < 0 || (e = ke_wrap_dim(ke_opname(c), ke_attr_flatten_end_dim(&c->a), x->ndim)) < 0) return -1;
    if (s > e) return ke_err(KL_ERR_ARG, ke_opname(c), "start_dim %d comes after end_dim %d", s, e);
    int64_t shape[KL_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < s; d++) shape[nd++] = x->shape[d];
    int64_t m = 1;
    for (int d = s; d <= e; d++) m *= x->shape[d];
    shape[nd++] = m;
    for (int d = e + 1; d < x->ndim; d++) shape[nd++] = x->shape[d];
    return ke_set_out1(c, kl_reshape(x, nd, shape));
}

int ke_decomp_narrow(ke_call *c) {
    kl_tensor *x = c->in[0];
    if (x->ndim == 0) return ke_err(KL_ERR_INDEX, ke_opname(c), "cannot narrow a 0-dim tensor");
    int d = ke_wrap_dim(ke_opname(c), ke_attr_narrow_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    int64_t start = ke_attr_narrow_start(&c->a), len = ke_attr_narrow_length(&c->a), n = x->shape[d];
    if (start < 0) start += n;
    if (start < 0 || len < 0 || start > n || len > n - start)
        return ke_err(KL_ERR_INDEX, ke_opname(c), "start %lld and length %lld out of range for dim %d of size %lld",
                      (long long)ke_attr_narrow_start(&c->a), (long long)len, d, (long long)n);
    return ke_set_out1(c, kl_slice(x, d, start, start + len, 1));
}

int ke_decomp_t(ke_call *c) {
    kl_tensor *x = c->in[0];
    if (x->ndim > 2) {
        char b[256];
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "expects a tensor with at most 2 dims, got %s",
                      ke_fmt_tensor(b, sizeof b, x));
    }
    if (x->ndim < 2) return ke_set_out1(c, ke_unary(KE_OP_alias, x, 0));
    return ke_set_out1(c, kl_transpose(x, 0, 1));
}

int ke_decomp_squeeze_all(ke_call *c) {
    kl_tensor *in[1] = {c->in[0]};
    ke_call s = {.op = KE_OP_squeeze, .nin = 1, .in = in};
    ke_attr_set_squeeze_all(&s.a, true);
    return ke_set_out1(c, ke_call1(&s));
}

int ke_decomp_contiguous(ke_call *c) {
    kl_tensor *x = c->in[0];
    return ke_set_out1(c, ke_is_contig(x) ? ke_unary(KE_OP_alias, x, 0) : kl_clone(x));
}

/* ---- public wrappers ------------------------------------------------------ */

static kl_tensor *list_call(int op, kl_tensor *x, int n, const int64_t *v) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    if (ke_check_tensor(x, ke_ops[op].name, 1) || ke_set_list(&c, n, v)) return NULL;
    return ke_call1(&c);
}

/* One-input call of op on x; the wrappers set its attributes by name. */
#define VIEW_CALL(c, op_, x)                                                                                  \
    kl_tensor *in_[1] = {x};                                                                                  \
    ke_call c = {.op = op_, .nin = 1, .in = in_}

kl_tensor *kl_view(kl_tensor *t, int ndim, const int64_t *shape) { return list_call(KE_OP_view, t, ndim, shape); }
kl_tensor *kl_reshape(kl_tensor *t, int ndim, const int64_t *shape) {
    return list_call(KE_OP_reshape, t, ndim, shape);
}
kl_tensor *kl_permute(kl_tensor *t, int ndim, const int64_t *dims) {
    return list_call(KE_OP_permute, t, ndim, dims);
}
kl_tensor *kl_expand(kl_tensor *t, int ndim, const int64_t *shape) {
    return list_call(KE_OP_expand, t, ndim, shape);
}
kl_tensor *kl_broadcast_to(kl_tensor *t, int ndim, const int64_t *shape) { return kl_expand(t, ndim, shape); }
kl_tensor *kl_transpose(kl_tensor *t, int dim0, int dim1) {
    VIEW_CALL(c, KE_OP_transpose, t);
    ke_attr_set_transpose_dim0(&c.a, dim0);
    ke_attr_set_transpose_dim1(&c.a, dim1);
    return ke_call1(&c);
}
kl_tensor *kl_t(kl_tensor *t) { return ke_unary(KE_OP_t, t, 0); }
kl_tensor *kl_squeeze(kl_tensor *t, int dim) {
    VIEW_CALL(c, KE_OP_squeeze, t);
    ke_attr_set_squeeze_dim(&c.a, dim);
    return ke_call1(&c);
}
kl_tensor *kl_squeeze_all(kl_tensor *t) { return ke_unary(KE_OP_squeeze_all, t, 0); }
kl_tensor *kl_unsqueeze(kl_tensor *t, int dim) {
    VIEW_CALL(c, KE_OP_unsqueeze, t);
    ke_attr_set_unsqueeze_dim(&c.a, dim);
    return ke_call1(&c);
}
kl_tensor *kl_flatten(kl_tensor *t, int start_dim, int end_dim) {
    VIEW_CALL(c, KE_OP_flatten, t);
    ke_attr_set_flatten_start_dim(&c.a, start_dim);
    ke_attr_set_flatten_end_dim(&c.a, end_dim);
    return ke_call1(&c);
}
kl_tensor *kl_slice(kl_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    VIEW_CALL(c, KE_OP_slice, t);
    ke_attr_set_slice_dim(&c.a, dim);
    ke_attr_set_slice_start(&c.a, start);
    ke_attr_set_slice_end(&c.a, end);
    ke_attr_set_slice_step(&c.a, step);
    return ke_call1(&c);
}
kl_tensor *kl_narrow(kl_tensor *t, int dim, int64_t start, int64_t length) {
    VIEW_CALL(c, KE_OP_narrow, t);
    ke_attr_set_narrow_dim(&c.a, dim);
    ke_attr_set_narrow_start(&c.a, start);
    ke_attr_set_narrow_length(&c.a, length);
    return ke_call1(&c);
}
kl_tensor *kl_select(kl_tensor *t, int dim, int64_t index) {
    VIEW_CALL(c, KE_OP_select, t);
    ke_attr_set_select_dim(&c.a, dim);
    ke_attr_set_select_index(&c.a, index);
    return ke_call1(&c);
}
kl_tensor *kl_contiguous(kl_tensor *t) { return ke_unary(KE_OP_contiguous, t, 0); }

kl_tensor *kl_as_strided(kl_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset) {
    kl_tensor *in[1] = {t};
    ke_call c = {.op = KE_OP_as_strided, .nin = 1, .in = in};
    if (ndim < 0 || ndim > KL_MAX_DIMS) {
        ke_err(KL_ERR_SHAPE, "as_strided", "%d dims requested; at most %d", ndim, KL_MAX_DIMS);
        return NULL;
    }
    if (ndim > 0 && (!shape || !strides)) {
        ke_err(KL_ERR_NULL_ARG, "as_strided", "shape or strides pointer is NULL");
        return NULL;
    }
    ke_attr_set_as_strided_ndim(&c.a, ndim);
    ke_attr_set_as_strided_offset(&c.a, offset);
    c.a.nlist = 2 * ndim;
    for (int i = 0; i < ndim; i++) {
        c.a.list[i] = shape[i];
        c.a.list[ndim + i] = strides[i];
    }
    return ke_call1(&c);
}
