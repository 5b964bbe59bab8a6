/*
 * d_shape.c — derivative formulas of the shape family: views, reductions and
 * scans, joining and indexing (named by the rows of ops_view.def,
 * ops_reduce.def and ops_index.def), after PyTorch 1.13's derivatives.yaml.
 *
 * Everything is written with differentiable kl_ ops and never reads tensor
 * data, so a formula runs on any backend, traces, and is recorded again
 * under create_graph. Choices that depend on values (prod and cumprod with
 * zeros, ties of amax) are made with masks, not with branches on data.
 * Constants (zeros, index ranges) are made on the input's device.
 */
#include "autograd.h"

#include <math.h>
#include <stdlib.h>

/* ---- helpers ---------------------------------------------------------------------------- */

static int wrap(int64_t d, int nd) { return nd == 0 ? 0 : (int)(d < 0 ? d + nd : d); }

static int64_t numel_of(const ag_tmeta *m) { return ke_numel(m->ndim, m->shape); }

static kl_tensor *full_on(int nd, const int64_t *shape, double v, kl_dtype dt, kl_device dev) {
    ke_call c = {.op = KE_OP_full, .nin = 0, .device = dev};
    ke_attr_set_full_value(&c.a, v);
    ke_attr_set_dtype(&c.a, dt);
    if (ke_set_list(&c, nd, shape)) return NULL;
    return ke_call1(&c);
}

/* int64 range start, start+step, ... (end excluded). */
static kl_tensor *range_on(int64_t start, int64_t end, int64_t step, kl_device dev) {
    ke_call c = {.op = KE_OP_arange, .nin = 0, .device = dev};
    ke_attr_set_arange_start(&c.a, (double)start);
    ke_attr_set_arange_end(&c.a, (double)end);
    ke_attr_set_arange_step(&c.a, (double)step);
    ke_attr_set_dtype(&c.a, KL_I64);
    return ke_call1(&c);
}

/* Zeros shaped like m with g's dtype (scatter targets must match the source). */
static kl_tensor *zeros_for(const ag_tmeta *m, const kl_tensor *g) {
    return full_on(m->ndim, m->shape, 0, kl_dtype_of(g), m->device);
}

/* x reversed along d. */
static kl_tensor *flip(kl_tensor *x, int d, kl_device dev) {
    int64_t n = kl_size(x, d);
    return kl_index_select(x, d, range_on(n - 1, -1, -1, dev));
}

/* Sum from position i to the end along d (flip, cumsum, flip: exact, unlike total - cumsum). */
static kl_tensor *rev_cumsum(kl_tensor *x, int d, kl_device dev) { return flip(kl_cumsum(flip(x, d, dev), d), d, dev); }

/* x padded (negative: cropped) by (l, r) along d. */
static kl_tensor *pad_dim(kl_tensor *x, int d, int64_t l, int64_t r) {
    int nd = kl_ndim(x), i = nd - 1 - d;
    int64_t p[2 * KL_MAX_DIMS] = {0};
    if (nd < 0) return NULL;
    p[2 * i] = l, p[2 * i + 1] = r;
    return kl_pad(x, 2 * (i + 1), p, 0);
}

/* Reduced dims as a bit mask: the list (empty: every dim), wrapped. */
static uint32_t rd_mask(const ke_attrs *a, int nd) {
    if (nd == 0) return 0;
    int n = ke_attr_dims_len(a);
    if (n == 0) return (1u << nd) - 1;
    uint32_t m = 0;
    for (int i = 0; i < n; i++) m |= 1u << wrap(ke_attr_dims(a)[i], nd);
    return m;
}

static int mask_dims(uint32_t mask, int nd, int64_t *dims) {
    int n = 0;
    for (int d = 0; d < nd; d++)
        if (mask >> d & 1) dims[n++] = d;
    return n;
}

/* Elements reduced into each output element. */
static int64_t reduced_count(const ag_tmeta *m, uint32_t mask) {
    int64_t n = 1;
    for (int d = 0; d < m->ndim; d++)
        if (mask >> d & 1) n *= m->shape[d];
    return n;
}

/* A reduction's output (or its gradient) with the reduced dims back as size 1. */
static kl_tensor *restore(kl_tensor *g, const ag_tmeta *m, uint32_t mask) {
    int64_t s[KL_MAX_DIMS] = {0};
    for (int d = 0; d < m->ndim; d++) s[d] = mask >> d & 1 ? 1 : m->shape[d];
    return kl_reshape(g, m->ndim, s);
}

static kl_tensor *expand_to(kl_tensor *g, const ag_tmeta *m) { return kl_expand(g, m->ndim, m->shape); }

/* Sum of x over the masked dims, keeping them. */
static kl_tensor *sum_keep(kl_tensor *x, uint32_t mask, int nd) {
    int64_t dims[KL_MAX_DIMS];
    int n = mask_dims(mask, nd, dims);
    return kl_sum(x, n, dims, true);
}

/* Stores t into gin[0]; -1 if an op on the way failed. */
static int set_gin(ag_ctx *c, int i, kl_tensor *t) {
    c->gin[i] = t;
    return t ? 0 : -1;
}

/* ---- views ------------------------------------------------------------------------------- */

int ag_d_view(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    return set_gin(c, 0, kl_reshape(c->gout[0], m->ndim, m->shape));
}
int ag_d_squeeze(ag_ctx *c) { return ag_d_view(c); }
int ag_d_unsqueeze(ag_ctx *c) { return ag_d_view(c); }
int ag_d_alias(ag_ctx *c) { return set_gin(c, 0, c->gout[0]); }

int ag_d_permute(ag_ctx *c) {
    int nd = c->in_meta[0].ndim;
    int64_t inv[KL_MAX_DIMS];
    for (int i = 0; i < nd; i++) inv[wrap(ke_attr_permute_dims(c->a)[i], nd)] = i;
    return set_gin(c, 0, kl_permute(c->gout[0], nd, inv));
}

int ag_d_transpose(ag_ctx *c) {
    return set_gin(c, 0, kl_transpose(c->gout[0], (int)ke_attr_transpose_dim0(c->a), (int)ke_attr_transpose_dim1(c->a)));
}

int ag_d_expand(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    return set_gin(c, 0, ag_sum_to(c->gout[0], m->ndim, m->shape));
}

/* Sizes of the dims before and after d (the input seen as [pre, n, post]). */
static void split_at(const ag_tmeta *m, int d, int64_t *pre, int64_t *post) {
    *pre = *post = 1;
    for (int e = 0; e < m->ndim; e++) {
        if (e < d) *pre *= m->shape[e];
        if (e > d) *post *= m->shape[e];
    }
}

/* The input's gradient is zeros with gout written at start, start+step, ...:
 * each row of gout gets step-1 zero rows after it (pad of a new dim), then
 * the whole is padded (or cropped at the end) to the input's size. */
int ag_d_slice(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0 || numel_of(&c->out_meta[0]) == 0) return 0;
    int d = wrap(ke_attr_slice_dim(c->a), m->ndim);
    int64_t n = m->shape[d], start = ke_attr_slice_start(c->a), step = ke_attr_slice_step(c->a);
    if (start < 0) start = start < -n ? 0 : start + n; /* as the view rule clamps */
    if (start > n) start = n;
    int64_t len = c->out_meta[0].shape[d], pre, post;
    split_at(m, d, &pre, &post);
    kl_tensor *g = kl_reshape(c->gout[0], 3, (int64_t[]){pre, len, post});
    if (step > 1) {
        g = pad_dim(kl_unsqueeze(g, 2), 2, 0, step - 1);
        g = kl_reshape(g, 3, (int64_t[]){pre, len * step, post});
    }
    g = pad_dim(g, 1, start, n - start - len * step);
    return set_gin(c, 0, kl_reshape(g, m->ndim, m->shape));
}

int ag_d_select(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    int d = wrap(ke_attr_select_dim(c->a), m->ndim);
    int64_t n = m->shape[d], i = ke_attr_select_index(c->a), pre, post;
    if (i < 0) i += n;
    split_at(m, d, &pre, &post);
    kl_tensor *g = kl_reshape(c->gout[0], 3, (int64_t[]){pre, 1, post});
    g = pad_dim(g, 1, i, n - i - 1);
    return set_gin(c, 0, kl_reshape(g, m->ndim, m->shape));
}

/* Storage positions (relative to base) of every element of a strided
 * geometry, flattened in row-major order: an int64 vector. */
static kl_tensor *positions(int nd, const int64_t *shape, const int64_t *stride, int64_t off, kl_device dev) {
    kl_tensor *p = full_on(0, NULL, (double)off, KL_I64, dev);
    for (int d = 0; d < nd; d++) {
        int64_t s[KL_MAX_DIMS];
        for (int e = 0; e < nd; e++) s[e] = e == d ? shape[d] : 1;
        kl_tensor *r = kl_mul_scalar(range_on(0, shape[d], 1, dev), (double)stride[d]);
        p = kl_add(p, kl_reshape(r, nd, s));
    }
    return kl_reshape(p, 1, (int64_t[]){ke_numel(nd, shape)});
}

/* Whether two elements of the geometry may share a storage position
 * (PyTorch's maybe-overlapping test: dims by increasing stride, each stride
 * beyond the reach of the smaller ones). */
static int may_overlap(int nd, const int64_t *shape, const int64_t *stride) {
    int idx[KL_MAX_DIMS], n = 0;
    for (int d = 0; d < nd; d++)
        if (shape[d] > 1) idx[n++] = d;
    for (int i = 1; i < n; i++) /* insertion sort by |stride| */
        for (int j = i; j > 0 && llabs(stride[idx[j]]) < llabs(stride[idx[j - 1]]); j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
    int64_t reach = 0;
    for (int i = 0; i < n; i++) {
        int64_t s = llabs(stride[idx[i]]);
        if (s <= reach) return 1;
        reach += (shape[idx[i]] - 1) * s;
    }
    return 0;
}

static void extent(int nd, const int64_t *shape, const int64_t *stride, int64_t off, int64_t *lo, int64_t *hi) {
    *lo = *hi = off;
    for (int d = 0; d < nd; d++) {
        if (stride[d] < 0) *lo += (shape[d] - 1) * stride[d];
        else *hi += (shape[d] - 1) * stride[d];
    }
}

/* PyTorch's as_strided_backward: gout is added into a buffer over the
 * storage positions the output reads (overlapping ones sum), then the input's
 * gradient reads its own positions from it. An input whose elements share
 * positions splits each position's gradient evenly among them. */
int ag_d_as_strided(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    int ond = (int)ke_attr_as_strided_ndim(c->a);
    const int64_t *oshape = ke_attr_as_strided_size_stride(c->a), *ostride = oshape + ond;
    if (numel_of(m) == 0 || ke_numel(ond, oshape) == 0) return 0;
    kl_tensor *x = c->in[0], *g = c->gout[0];
    const int64_t *istride = kl_stride(x);
    int64_t ioff = kl_storage_offset(x), ooff = ke_attr_as_strided_offset(c->a);
    int64_t ilo, ihi, olo, ohi;
    extent(m->ndim, m->shape, istride, ioff, &ilo, &ihi);
    extent(ond, oshape, ostride, ooff, &olo, &ohi);
    int64_t base = ilo < olo ? ilo : olo, top = ihi > ohi ? ihi : ohi, n = top - base + 1;
    kl_tensor *opos = positions(ond, oshape, ostride, ooff - base, m->device);
    kl_tensor *ipos = positions(m->ndim, m->shape, istride, ioff - base, m->device);
    kl_tensor *buf = full_on(1, &n, 0, kl_dtype_of(g), m->device);
    buf = kl_scatter_add(buf, 0, opos, kl_reshape(g, 1, (int64_t[]){ke_numel(ond, oshape)}));
    if (may_overlap(m->ndim, m->shape, istride)) {
        int64_t ni = numel_of(m);
        kl_tensor *cnt = full_on(1, &n, 0, kl_dtype_of(g), m->device);
        cnt = kl_scatter_add(cnt, 0, ipos, full_on(1, &ni, 1, kl_dtype_of(g), m->device));
        buf = kl_div(buf, kl_clamp(cnt, 1, INFINITY)); /* positions the input does not read stay 0 */
    }
    return set_gin(c, 0, kl_reshape(kl_index_select(buf, 0, ipos), m->ndim, m->shape));
}

/* ---- reductions ---------------------------------------------------------------------------- */

int ag_d_sum(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    return set_gin(c, 0, expand_to(restore(c->gout[0], m, rd_mask(c->a, m->ndim)), m));
}

int ag_d_mean(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    kl_tensor *g = kl_div_scalar(restore(c->gout[0], m, mask), (double)reduced_count(m, mask));
    return set_gin(c, 0, expand_to(g, m));
}

/* Each element's gradient is the product of the others in its group. With
 * the group laid out as the rows of a [P, K] matrix, that is the exclusive
 * prefix product times the exclusive suffix product (PyTorch's
 * prod_safe_zeros_backward): exact with any number of zeros, and its own
 * derivative (through cumprod) is exact too. */
int ag_d_prod(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    int nd = m->ndim;
    uint32_t mask = rd_mask(c->a, nd);
    int64_t k = reduced_count(m, mask), p = numel_of(m) / k;
    kl_tensor *g = restore(c->gout[0], m, mask);
    if (k == 1) return set_gin(c, 0, expand_to(g, m));
    int64_t perm[KL_MAX_DIMS], inv[KL_MAX_DIMS], pshape[KL_MAX_DIMS];
    int np = 0;
    for (int pass = 0; pass < 2; pass++) /* kept dims first, then the reduced ones */
        for (int d = 0; d < nd; d++)
            if ((mask >> d & 1) == (uint32_t)pass) perm[np++] = d;
    for (int i = 0; i < nd; i++) inv[perm[i]] = i, pshape[i] = m->shape[perm[i]];
    kl_device dev = m->device;
    kl_tensor *x = kl_reshape(kl_permute(c->in[0], nd, perm), 2, (int64_t[]){p, k});
    kl_tensor *ones = full_on(2, (int64_t[]){p, 1}, 1, kl_dtype_of(c->in[0]), dev);
    kl_tensor *pre = kl_cumprod(kl_cat(2, (kl_tensor *[]){ones, kl_slice(x, 1, 0, k - 1, 1)}, 1), 1);
    kl_tensor *rx = flip(x, 1, dev);
    kl_tensor *suf = flip(kl_cumprod(kl_cat(2, (kl_tensor *[]){ones, kl_slice(rx, 1, 0, k - 1, 1)}, 1), 1), 1, dev);
    kl_tensor *q = kl_mul(kl_reshape(g, 2, (int64_t[]){p, 1}), kl_mul(pre, suf));
    return set_gin(c, 0, kl_permute(kl_reshape(q, nd, pshape), nd, inv));
}

/* amax/amin: the gradient splits evenly among the elements equal to the result. */
int ag_d_amax_amin(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    kl_tensor *hit = kl_eq(c->in[0], restore(c->out[0], m, mask));
    kl_tensor *g = kl_div(restore(c->gout[0], m, mask), sum_keep(hit, mask, m->ndim));
    return set_gin(c, 0, kl_mul(g, hit));
}

/* max_dim/min_dim: the whole gradient goes to the returned index. */
int ag_d_minmax_dim(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    kl_tensor *g = c->gout[0], *idx = c->out[1];
    if (numel_of(m) == 0) return 0;
    if (m->ndim == 0) return set_gin(c, 0, g);
    int d = wrap(ke_attr_max_dim_dim(c->a)[0], m->ndim); /* min_dim has max_dim's attributes */
    if (!ke_attr_keepdim(c->a)) g = kl_unsqueeze(g, d), idx = kl_unsqueeze(idx, d);
    return set_gin(c, 0, kl_scatter_add(zeros_for(m, g), d, idx, g));
}

/* sort and topk: the gradient of each kept value goes back to its index
 * (indices within a row are distinct, so the adds never meet). */
static int sorted_backward(ag_ctx *c, int64_t dim) {
    const ag_tmeta *m = &c->in_meta[0];
    kl_tensor *g = c->gout[0];
    if (numel_of(m) == 0) return 0;
    if (m->ndim == 0) return set_gin(c, 0, kl_reshape(g, 0, NULL));
    return set_gin(c, 0, kl_scatter_add(zeros_for(m, g), wrap(dim, m->ndim), c->out[1], g));
}
int ag_d_sort(ag_ctx *c) { return sorted_backward(c, ke_attr_sort_dim(c->a)); }
int ag_d_topk(ag_ctx *c) { return sorted_backward(c, ke_attr_topk_dim(c->a)); }

/* flip is its own inverse. */
int ag_d_flip(ag_ctx *c) {
    return set_gin(c, 0, kl_flip(c->gout[0], ke_attr_flip_dims_len(c->a), ke_attr_flip_dims(c->a)));
}

/* var: 2 / (N - correction) * g * (x - mean), with N the reduced count. */
static kl_tensor *var_backward(kl_tensor *g, kl_tensor *x, const ag_tmeta *m, uint32_t mask, double correction) {
    int64_t dims[KL_MAX_DIMS];
    int n = mask_dims(mask, m->ndim, dims);
    double dof = (double)reduced_count(m, mask) - correction;
    kl_tensor *centered = kl_sub(x, kl_mean(x, n, dims, true));
    return kl_mul(kl_mul_scalar(g, 2.0 / dof), centered);
}

int ag_d_var(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    return set_gin(c, 0, var_backward(restore(c->gout[0], m, mask), c->in[0], m, mask, ke_attr_var_correction(c->a)));
}

/* std: var's gradient scaled by 1 / (2 std), zero where std is zero (PyTorch). */
int ag_d_std(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    kl_tensor *s = restore(c->out[0], m, mask);
    kl_tensor *g = kl_div(restore(c->gout[0], m, mask), kl_mul_scalar(s, 2));
    g = kl_masked_fill(g, kl_eq_scalar(s, 0), 0);
    return set_gin(c, 0, var_backward(g, c->in[0], m, mask, ke_attr_var_correction(c->a)) /* std has var's attributes */);
}

/* logsumexp: g * softmax = g * exp(x - result). */
int ag_d_logsumexp(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    kl_tensor *w = kl_exp(kl_sub(c->in[0], restore(c->out[0], m, mask)));
    return set_gin(c, 0, kl_mul(restore(c->gout[0], m, mask), w));
}

/* PyTorch's norm_backward, case by case in p; zero where the norm is zero
 * (p >= 1) or the element is zero (p < 1); p = 0 has a zero gradient. */
int ag_d_norm(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    double p = ke_attr_norm_p(c->a);
    if (numel_of(m) == 0 || p == 0) return 0;
    uint32_t mask = rd_mask(c->a, m->ndim);
    kl_tensor *x = c->in[0], *g = restore(c->gout[0], m, mask), *nrm = restore(c->out[0], m, mask), *r;
    if (p == 1) {
        r = kl_mul(kl_sign(x), g);
    } else if (p == 2) {
        r = kl_mul(g, kl_masked_fill(kl_div(x, nrm), kl_eq_scalar(nrm, 0), 0));
    } else if (isinf(p)) { /* amax/amin of |x|, NaNs counted as hits */
        kl_tensor *ax = kl_abs(x);
        kl_tensor *hit = kl_logical_or(kl_eq(ax, nrm), kl_isnan(ax));
        r = kl_mul(kl_sign(x), kl_mul(kl_div(g, sum_keep(hit, mask, m->ndim)), hit));
    } else if (p < 1) {
        kl_tensor *sx = kl_masked_fill(kl_mul(kl_sign(x), kl_pow_scalar(kl_abs(x), p - 1)), kl_eq_scalar(x, 0), 0);
        r = kl_mul(kl_mul(sx, g), kl_pow_scalar(nrm, 1 - p));
    } else {
        kl_tensor *sx = p < 2 ? kl_mul(kl_sign(x), kl_pow_scalar(kl_abs(x), p - 1))
                              : kl_mul(x, kl_pow_scalar(kl_abs(x), p - 2));
        kl_tensor *scale = kl_masked_fill(kl_div(g, kl_pow_scalar(nrm, p - 1)), kl_eq_scalar(nrm, 0), 0);
        r = kl_mul(sx, scale);
    }
    return set_gin(c, 0, r);
}

/* ---- scans ---------------------------------------------------------------------------------- */

int ag_d_cumsum(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    if (m->ndim == 0) return set_gin(c, 0, c->gout[0]);
    return set_gin(c, 0, rev_cumsum(c->gout[0], wrap(ke_attr_cumsum_dim(c->a), m->ndim), m->device));
}

/* Under create_graph, the O(n^2) form that is exact to every order (as
 * PyTorch does): with d moved last, t[..., i, k] = x_k for k > i, else 1;
 * its cumprod along k is prod_{i<j<=k} x_j, kept where k >= i; then
 * dx_i = (prod_{j<i} x_j) * sum_k that * g_k. */
static kl_tensor *cumprod_backward_n2(kl_tensor *x, kl_tensor *g, int d, kl_device dev) {
    int nd = kl_ndim(x);
    int64_t n = kl_size(x, d), sq[KL_MAX_DIMS + 1];
    kl_tensor *xt = kl_transpose(x, d, nd - 1), *gt = kl_transpose(g, d, nd - 1);
    const int64_t *s = kl_shape(xt);
    if (!s) return NULL;
    memcpy(sq, s, sizeof(int64_t) * nd);
    sq[nd] = n; /* [..., n(i), n(k)] */
    kl_tensor *i = kl_reshape(range_on(0, n, 1, dev), 2, (int64_t[]){n, 1});
    kl_tensor *k = kl_reshape(range_on(0, n, 1, dev), 2, (int64_t[]){1, n});
    kl_tensor *t = kl_masked_fill(kl_expand(kl_unsqueeze(xt, nd - 1), nd + 1, sq), kl_le(k, i), 1);
    kl_tensor *span = kl_masked_fill(kl_cumprod(t, nd), kl_lt(k, i), 0);
    kl_tensor *h = kl_sum(kl_mul(span, kl_unsqueeze(gt, nd - 1)), 1, (int64_t[]){nd}, false);
    int64_t one[KL_MAX_DIMS];
    memcpy(one, s, sizeof(int64_t) * nd);
    one[nd - 1] = 1;
    kl_tensor *ones = full_on(nd, one, 1, kl_dtype_of(x), dev);
    kl_tensor *excl = kl_cumprod(kl_cat(2, (kl_tensor *[]){ones, kl_slice(xt, nd - 1, 0, n - 1, 1)}, nd - 1), nd - 1);
    return kl_transpose(kl_mul(excl, h), d, nd - 1);
}

/* dx_i = sum_{k>=i} g_k prod_{j<=k, j!=i} x_j. Before the first zero of a
 * line that is rev_cumsum(g*y)_i / x_i (PyTorch's zero-free formula); at the
 * first zero z it is rev_cumsum(g*y')_z with y' the cumprod of x with x_z
 * set to 1; after z every term holds the zero x_z. The three cases are
 * selected by masks, so no data is read here. Exact at first order; its own
 * derivative treats the masks as constants, which misses the dependence of
 * the positions after a zero on that zero: create_graph takes the O(n^2)
 * form instead. */
int ag_d_cumprod(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    kl_tensor *x = c->in[0], *g = c->gout[0];
    if (m->ndim == 0) return set_gin(c, 0, g);
    int d = wrap(ke_attr_cumsum_dim(c->a), m->ndim); /* cumprod has cumsum's attributes */
    if (m->shape[d] == 1) return set_gin(c, 0, g);
    kl_device dev = m->device;
    if (ag_grad_enabled()) return set_gin(c, 0, cumprod_backward_n2(x, g, d, dev));
    kl_tensor *zero = kl_eq_scalar(x, 0);
    kl_tensor *nzero = kl_cumsum(zero, d); /* zeros up to and including i */
    kl_tensor *before = kl_eq_scalar(nzero, 0);
    kl_tensor *first = kl_logical_and(zero, kl_eq_scalar(nzero, 1));
    kl_tensor *a = kl_div(rev_cumsum(kl_mul(g, c->out[0]), d, dev), kl_masked_fill(x, kl_logical_not(before), 1));
    kl_tensor *y1 = kl_cumprod(kl_masked_fill(x, first, 1), d);
    kl_tensor *b = kl_masked_fill(rev_cumsum(kl_mul(g, y1), d, dev), kl_logical_not(first), 0);
    return set_gin(c, 0, kl_where(before, a, b));
}

/* ---- joining and indexing --------------------------------------------------------------------- */

/* 1-D empty inputs were skipped by cat (PyTorch 1.13's legacy rule). */
static int legacy_empty(const ag_tmeta *m) { return m->ndim == 1 && m->shape[0] == 0; }

int ag_d_cat(ag_ctx *c) {
    int ref = -1;
    for (int i = 0; i < c->nin && ref < 0; i++)
        if (!legacy_empty(&c->in_meta[i])) ref = i;
    if (ref < 0) return 0;
    int d = wrap(ke_attr_cat_dim(c->a), c->in_meta[ref].ndim);
    int64_t at = 0;
    for (int i = 0; i < c->nin; i++) {
        const ag_tmeta *m = &c->in_meta[i];
        if (legacy_empty(m)) continue;
        int64_t len = m->shape[d];
        if (c->need[i] && numel_of(m) && set_gin(c, i, kl_slice(c->gout[0], d, at, at + len, 1))) return -1;
        at += len;
    }
    return 0;
}

/* Output dim d is (copy, position) = (repeats[d], size[d]): viewed as
 * [before, copies, size, after] one dim at a time, summed over the copies. */
int ag_d_repeat(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0 || numel_of(&c->out_meta[0]) == 0) return 0;
    int nrep = ke_attr_repeat_repeats_len(c->a), off = nrep - m->ndim;
    int64_t cur[KL_MAX_DIMS];
    memcpy(cur, c->out_meta[0].shape, sizeof(int64_t) * nrep);
    kl_tensor *g = c->gout[0];
    for (int d = 0; d < nrep; d++) {
        int64_t r = ke_attr_repeat_repeats(c->a)[d], s = d >= off ? m->shape[d - off] : 1, before = 1, after = 1;
        if (r == 1) continue;
        for (int e = 0; e < nrep; e++) {
            if (e < d) before *= cur[e];
            if (e > d) after *= cur[e];
        }
        g = kl_sum(kl_reshape(g, 4, (int64_t[]){before, r, s, after}), 1, (int64_t[]){1}, false);
        cur[d] = s;
    }
    return set_gin(c, 0, kl_reshape(g, m->ndim, m->shape));
}

/* pad's source index (pad_source, src/eager/join.c) for output indices
 * 0..n-1, written with kl_ ops from arange (so a traced backward holds no
 * captured constant). */
static kl_tensor *pad_source_index(int mode, int64_t n, int64_t s, int64_t l, int64_t r) {
    kl_tensor *j = kl_arange((double)-l, (double)(n - l), 1, KL_I64); /* i - l */
    if (mode == KL_PAD_REFLECT) /* (s - 1) - |(s - 1) - |j||: one reflection at either end */
        return kl_rsub_scalar(kl_abs(kl_rsub_scalar(kl_abs(j), (double)(s - 1))), (double)(s - 1));
    if (mode == KL_PAD_REPLICATE) return kl_clamp(j, 0, (double)(s - 1));
    int64_t cl = l < 0 ? -l : 0, core = s - cl - (r < 0 ? -r : 0);
    kl_tensor *k = kl_arange((double)-(l > 0 ? l : 0), (double)(n - (l > 0 ? l : 0)), 1, KL_I64);
    return kl_add_scalar(kl_remainder_scalar(k, (double)core), (double)cl);
}

/* reflect / replicate / circular: each padded dim gathered x through
 * that map, so g is scattered back through the same map, one dim at a
 * time (last first), with scatter_add: elements read twice get both. */
static int pad_mode_backward(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    int mode = (int)ke_attr_pad_mode(c->a), nd = m->ndim, np = ke_attr_pad_pad_len(c->a);
    const int64_t *pad = ke_attr_pad_pad(c->a);
    kl_tensor *g = c->gout[0];
    for (int k = 0; k < np / 2; k++) {
        int d = nd - 1 - k;
        int64_t l = pad[2 * k], r = pad[2 * k + 1], s = m->shape[d];
        const int64_t *gs = kl_shape(g);
        if (!gs) return -1;
        int64_t n = gs[d], shape[KL_MAX_DIMS], ish[KL_MAX_DIMS];
        kl_tensor *idx = kl_to_device(pad_source_index(mode, n, s, l, r), m->device);
        for (int e = 0; e < nd; e++) shape[e] = e == d ? s : gs[e], ish[e] = e == d ? n : 1;
        kl_tensor *z = kl_zero_inplace(kl_empty_on(nd, shape, kl_dtype_of(g), m->device));
        g = kl_scatter_add(z, d, kl_expand(kl_reshape(idx, nd, ish), nd, gs), g);
    }
    return set_gin(c, 0, g);
}

/* pad: constant mode's gradient is the same pad negated, which crops the
 * padding off (and pads back what was cropped). */
int ag_d_pad(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    if (numel_of(m) == 0) return 0;
    if (ke_attr_pad_mode(c->a) != KL_PAD_CONSTANT) return pad_mode_backward(c);
    int64_t neg[KE_MAX_LIST];
    int np = ke_attr_pad_pad_len(c->a);
    for (int i = 0; i < np; i++) neg[i] = -ke_attr_pad_pad(c->a)[i];
    return set_gin(c, 0, kl_pad(c->gout[0], np, neg, 0));
}

int ag_d_index_select(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0], *om = &c->out_meta[0];
    kl_tensor *g = c->gout[0];
    if (numel_of(m) == 0 || numel_of(om) == 0) return 0;
    if (m->ndim == 0) return set_gin(c, 0, g);
    int d = wrap(ke_attr_index_select_dim(c->a), m->ndim);
    int64_t s[KL_MAX_DIMS];
    for (int e = 0; e < m->ndim; e++) s[e] = e == d ? om->shape[d] : 1;
    kl_tensor *idx = kl_expand(kl_reshape(kl_to_dtype(c->in[1], KL_I64), m->ndim, s), om->ndim, om->shape);
    return set_gin(c, 0, kl_scatter_add(zeros_for(m, g), d, idx, g));
}

int ag_d_gather(ag_ctx *c) {
    const ag_tmeta *m = &c->in_meta[0];
    kl_tensor *g = c->gout[0];
    if (numel_of(m) == 0 || numel_of(&c->in_meta[1]) == 0) return 0;
    return set_gin(c, 0, kl_scatter_add(zeros_for(m, g), (int)ke_attr_gather_dim(c->a), c->in[1], g));
}

/* r (index-shaped) padded with zeros to src's shape: src elements beyond
 * index take no part in a scatter. */
static kl_tensor *pad_to_src(ag_ctx *c, kl_tensor *r) {
    const ag_tmeta *im = &c->in_meta[1], *sm = &c->in_meta[2];
    if (im->ndim != sm->ndim) return r; /* 0-dim vs [1]: same elements */
    int64_t pad[2 * KL_MAX_DIMS];
    int np = 0, grow = 0;
    for (int d = sm->ndim - 1; d >= 0; d--) {
        pad[np++] = 0;
        pad[np++] = sm->shape[d] - im->shape[d];
        grow |= sm->shape[d] != im->shape[d];
    }
    return grow ? kl_pad(r, np, pad, 0) : r;
}

/* scatter_add(x, index, src): x's gradient passes through; src's is gout
 * gathered at index, zero where src reaches beyond index. */
int ag_d_scatter_add(ag_ctx *c) {
    kl_tensor *g = c->gout[0];
    if (c->need[0] && set_gin(c, 0, g)) return -1;
    if (!c->need[2] || numel_of(&c->in_meta[1]) == 0) return 0;
    return set_gin(c, 2, pad_to_src(c, kl_gather(g, (int)ke_attr_scatter_add_dim(c->a), c->in[1])));
}

/* scatter(x, index, src): the elements src overwrote get no gradient in x;
 * src's is scatter_add's. */
int ag_d_scatter(ag_ctx *c) {
    kl_tensor *g = c->gout[0];
    int d = (int)ke_attr_scatter_dim(c->a), empty = numel_of(&c->in_meta[1]) == 0;
    if (c->need[0] && set_gin(c, 0, empty ? g : kl_scatter_value(g, d, c->in[1], 0))) return -1;
    if (!c->need[2] || empty) return 0;
    return set_gin(c, 2, pad_to_src(c, kl_gather(g, d, c->in[1])));
}

/* scatter_reduce: PyTorch 1.13's scatter_reduce_backward, written with kl_
 * ops on src narrowed to index's shape (torch fails on a larger src; here
 * the rest of src gets zeros). prod treats zeros with masks (an element's
 * product without one zero factor); amax/amin share the gradient evenly
 * among the values equal to the result. */
int ag_d_scatter_reduce(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *x = c->in[0], *idx = c->in[1], *src = c->in[2], *res = c->out[0];
    const ag_tmeta *im = &c->in_meta[1];
    int d = wrap(ke_attr_scatter_reduce_dim(c->a), c->in_meta[0].ndim);
    int red = (int)ke_attr_scatter_reduce_reduce(c->a), inc = ke_attr_scatter_reduce_include_self(c->a);
    if (numel_of(im) == 0) return c->need[0] ? set_gin(c, 0, g) : 0;
    if (im->ndim == c->in_meta[2].ndim)
        for (int e = 0; e < im->ndim && src; e++)
            if (im->shape[e] != c->in_meta[2].shape[e]) src = kl_narrow(src, e, 0, im->shape[e]);
    kl_dtype dt = kl_dtype_of(g);
    kl_tensor *gs = NULL, *gsrc = NULL;
    switch (red) {
    case KL_SCATTER_SUM:
        gs = g;
        gsrc = kl_gather(g, d, idx);
        break;
    case KL_SCATTER_MEAN: {
        kl_tensor *n = kl_scatter_add(kl_full_like(g, inc ? 1 : 0), d, idx, kl_ones_like(src));
        n = kl_masked_fill(n, kl_eq_scalar(n, 0), 1);
        gs = kl_div(g, n);
        gsrc = kl_div(kl_gather(g, d, idx), kl_gather(n, d, idx));
        break;
    }
    case KL_SCATTER_AMAX:
    case KL_SCATTER_AMIN: {
        kl_tensor *self_is = kl_to_dtype(kl_eq(x, res), dt);
        kl_tensor *src_is = kl_to_dtype(kl_eq(src, kl_gather(res, d, idx)), dt);
        kl_tensor *share = kl_div(g, kl_scatter_add(self_is, d, idx, src_is));
        gs = kl_mul(self_is, share);
        gsrc = kl_mul(src_is, kl_gather(share, d, idx));
        break;
    }
    case KL_SCATTER_PROD: {
        kl_tensor *mself = kl_masked_fill(x, kl_eq_scalar(x, 0), 1);
        gs = kl_div(kl_mul(g, kl_scatter_reduce(mself, d, idx, src, KL_SCATTER_PROD, inc)), mself);
        kl_tensor *src_zero = kl_eq_scalar(src, 0);
        kl_tensor *nzeros = kl_gather(kl_scatter_add(kl_zeros_like(x), d, idx, kl_to_dtype(src_zero, dt)), d, idx);
        kl_tensor *single = kl_logical_and(src_zero, kl_eq_scalar(nzeros, 1));
        kl_tensor *msrc_res = kl_scatter_reduce(x, d, idx, kl_masked_fill(src, single, 1), KL_SCATTER_PROD, inc);
        gsrc = kl_where(single, kl_gather(kl_mul(g, msrc_res), d, idx),
                        kl_div(kl_gather(kl_mul(g, res), d, idx), kl_masked_fill(src, src_zero, 1)));
        break;
    }
    default: return ke_err(KL_ERR_ARG, "scatter_reduce", "no derivative for reduce %d", red);
    }
    if (!inc && gs) gs = kl_scatter_value(gs, d, idx, 0); /* x's value took no part where index points */
    if (c->need[0] && set_gin(c, 0, gs)) return -1;
    if (c->need[2] && set_gin(c, 2, gsrc ? pad_to_src(c, gsrc) : NULL)) return -1;
    return 0;
}

/* embedding: each gout row is added into the weight row its index names. */
int ag_d_embedding(ag_ctx *c) {
    const ag_tmeta *wm = &c->in_meta[0];
    kl_tensor *g = c->gout[0];
    int64_t n = numel_of(&c->in_meta[1]), dim = wm->shape[1];
    if (n == 0 || numel_of(wm) == 0) return 0;
    kl_tensor *idx = kl_reshape(kl_to_dtype(c->in[1], KL_I64), 2, (int64_t[]){n, 1});
    idx = kl_expand(idx, 2, (int64_t[]){n, dim});
    g = kl_reshape(g, 2, (int64_t[]){n, dim});
    return set_gin(c, 0, kl_scatter_add(zeros_for(wm, g), 0, idx, g));
}

/* clone, to_dtype and copy: formulas live in d_ew.c. */
