/*
 * interp.c — interpolate and prelu (rows in ops_nn.def), both implicit
 * composites: their decompositions are what autograd records and what
 * compiled functions trace, so they have no derivative or kernel of their
 * own.
 *
 * interpolate resizes one spatial dim at a time (separable, as PyTorch's
 * kernels are): nearest is an index_select along the dim, linear the
 * weighted sum of two index_selects. Source indices and weights depend only
 * on the sizes; they are computed from an arange with PyTorch 1.13's
 * arithmetic (nearest in float; linear in double, then the input's dtype,
 * f32 for f16/bf16), as ops, so a compiled function computes them in its
 * graph (a tensor made from host data would be a captured constant). The backward of an
 * index_select is scatter_add into zeros: the scatter of the gradient over
 * the source positions that bilinear's backward is, through the table's
 * scatter_add kernel, and differentiable again (gather).
 */
#include "kernels_nn.h"

#include <math.h>

/* ---- interpolate ---------------------------------------------------------------------------- */

/* PyTorch's compute_scales_value: 1 / scale_factor when one was given. */
static double scale_of(double sf, int64_t in, int64_t out) { return sf > 0 ? 1.0 / sf : (double)in / (double)out; }

/* 0, 1, ..., m - 1 as dt on dev: a creation op, so a compiled function
 * computes the indices below in its graph instead of capturing them. */
static kl_tensor *range_on(int64_t m, kl_dtype dt, kl_device dev) {
    ke_call c = {.op = KE_OP_arange, .nin = 0, .device = dev};
    ke_attr_set_arange_start(&c.a, 0);
    ke_attr_set_arange_end(&c.a, (double)m);
    ke_attr_set_arange_step(&c.a, 1);
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}

/* v [m] shaped to broadcast along dim d of an nd-dim tensor. */
static kl_tensor *along(kl_tensor *v, int d, int nd, int64_t m) {
    int64_t s[KL_MAX_DIMS];
    for (int e = 0; e < nd; e++) s[e] = e == d ? m : 1;
    return kl_reshape(v, nd, s);
}

/* x resized along d from n to m elements. */
static kl_tensor *interp_dim(kl_tensor *x, int d, int64_t n, int64_t m, double sf, int mode, bool align) {
    kl_device dev = kl_device_of(x);
    kl_dtype dt = kl_dtype_of(x);
    if (mode == KL_INTERP_NEAREST) {
        /* upsample_nearest's nearest_idx: exact for equal and double sizes, else
         * floor(i * scale) in float */
        float sc = m == 2 * n ? 0.5f : (float)scale_of(sf, n, m);
        kl_tensor *src = kl_floor(kl_mul_scalar(range_on(m, KL_F32, dev), sc));
        return kl_index_select(x, d, kl_to_dtype(kl_clamp(src, 0, (double)(n - 1)), KL_I64));
    }
    /* area_pixel_compute_scale / compute_source_index_and_lambda: the source
     * position in double, then in the input's dtype (f32 for f16/bf16, whose
     * weights are rounded at the end) */
    kl_dtype wt = dt == KL_F64 ? KL_F64 : KL_F32;
    double sc = align ? (m > 1 ? (double)(n - 1) / (double)(m - 1) : 0) : scale_of(sf, n, m);
    if (wt == KL_F32) sc = (float)sc;
    kl_tensor *r = range_on(m, KL_F64, dev);
    kl_tensor *src = align ? kl_mul_scalar(r, sc) : kl_add_scalar(kl_mul_scalar(kl_add_scalar(r, 0.5), sc), -0.5);
    src = kl_clamp(kl_to_dtype(src, wt), 0, INFINITY);
    kl_tensor *base = kl_floor(src);
    kl_tensor *l1 = kl_clamp(kl_sub(src, base), 0, 1), *l0 = kl_rsub_scalar(l1, 1);
    kl_tensor *i0 = kl_to_dtype(base, KL_I64), *i1 = kl_clamp(kl_add_scalar(i0, 1), 0, (double)(n - 1));
    int nd = kl_ndim(x);
    return kl_add(kl_mul(kl_index_select(x, d, i0), along(kl_to_dtype(l0, dt), d, nd, m)),
                  kl_mul(kl_index_select(x, d, i1), along(kl_to_dtype(l1, dt), d, nd, m)));
}

int ke_decomp_interpolate(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0];
    char b[256];
    int mode = (int)ke_attr_interpolate_mode(&c->a), ns = ke_attr_interpolate_size_len(&c->a);
    bool align = ke_attr_interpolate_align_corners(&c->a);
    const int64_t *size = ke_attr_interpolate_size(&c->a);
    double sf[2] = {ke_attr_interpolate_scale_h(&c->a), ke_attr_interpolate_scale_w(&c->a)};
    if (mode < KL_INTERP_NEAREST || mode > KL_INTERP_BILINEAR)
        return ke_err(KL_ERR_ARG, op, "mode %d is not a kl_interp_mode (nearest, linear, bilinear)", mode);
    int want = mode == KL_INTERP_LINEAR ? 3 : mode == KL_INTERP_BILINEAR ? 4 : x->ndim;
    if ((x->ndim != 3 && x->ndim != 4) || x->ndim != want)
        return ke_err(KL_ERR_SHAPE, op, "%s input must be %s, got %s",
                      mode == KL_INTERP_NEAREST ? "nearest" : mode == KL_INTERP_LINEAR ? "linear" : "bilinear",
                      mode == KL_INTERP_NEAREST ? "3-D [N, C, L] or 4-D [N, C, H, W]"
                      : want == 3             ? "3-D [N, C, L]"
                                              : "4-D [N, C, H, W]",
                      ke_fmt_tensor(b, sizeof b, x));
    if (ns != x->ndim - 2)
        return ke_err(KL_ERR_ARG, op, "%d output sizes for %d spatial dims of %s", ns, x->ndim - 2,
                      ke_fmt_tensor(b, sizeof b, x));
    if (mode == KL_INTERP_NEAREST && align)
        return ke_err(KL_ERR_ARG, op, "align_corners can only be set with the interpolating modes (linear, bilinear)");
    if (mode != KL_INTERP_NEAREST && !ke_is_float((kl_dtype)x->dtype))
        return ke_err(KL_ERR_DTYPE, op, "linear modes need a floating input, got %s", ke_fmt_tensor(b, sizeof b, x));
    for (int k = 0; k < ns; k++) {
        int64_t n = x->shape[2 + k];
        if (size[k] <= 0 || n <= 0)
            return ke_err(KL_ERR_SHAPE, op, "input %s and output sizes must be positive, got output size %lld in dim %d",
                          ke_fmt_tensor(b, sizeof b, x), (long long)size[k], 2 + k);
    }
    kl_scope_begin();
    kl_tensor *y = x;
    for (int k = ns - 1; k >= 0 && y; k--) {
        int64_t n = x->shape[2 + k], m = size[k];
        if (m != n) /* equal sizes copy, in every mode (PyTorch's special case) */
            y = interp_dim(y, 2 + k, n, m, sf[k], mode, align);
    }
    if (y == x) y = kl_clone(x); /* a new tensor, never the input itself */
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_interpolate_options kl_interpolate_options_default(void) {
    return (kl_interpolate_options){.size = {0, 0}, .scale_factor = {0, 0}, .mode = KL_INTERP_NEAREST,
                                    .align_corners = false};
}

/* Output sizes resolved here (size, or floor(in * scale_factor) as
 * F.interpolate) so the row's attributes give the shape without data. */
kl_tensor *kl_interpolate(kl_tensor *x, const kl_interpolate_options *opts) {
    const char *op = "interpolate";
    kl_interpolate_options o = opts ? *opts : kl_interpolate_options_default();
    if (ke_check_tensor(x, op, 1)) return NULL;
    int ns = x->ndim - 2;
    if (ns < 1 || ns > 2) {
        char b[256];
        ke_err(KL_ERR_SHAPE, op, "input must be 3-D [N, C, L] or 4-D [N, C, H, W], got %s",
               ke_fmt_tensor(b, sizeof b, x));
        return NULL;
    }
    int has_size = o.size[0] > 0 || (ns == 2 && o.size[1] > 0), has_scale = o.scale_factor[0] > 0 ||
                                                                            (ns == 2 && o.scale_factor[1] > 0);
    if (has_size == has_scale) {
        ke_err(KL_ERR_ARG, op, "exactly one of size and scale_factor must be given (size %lld x %lld, scale_factor "
               "%g x %g)", (long long)o.size[0], (long long)o.size[1], o.scale_factor[0], o.scale_factor[1]);
        return NULL;
    }
    int64_t size[2] = {0, 0};
    double sf[2] = {0, 0};
    for (int k = 0; k < ns; k++) {
        if (has_scale) {
            if (!(o.scale_factor[k] > 0) || !isfinite(o.scale_factor[k])) {
                ke_err(KL_ERR_ARG, op, "scale_factor[%d] = %g must be positive and finite", k, o.scale_factor[k]);
                return NULL;
            }
            sf[k] = o.scale_factor[k];
            size[k] = (int64_t)floor((double)x->shape[2 + k] * sf[k]);
        } else {
            size[k] = o.size[k];
        }
    }
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_interpolate, .nin = 1, .in = in};
    if (ke_set_list(&c, ns, size)) return NULL;
    ke_attr_set_interpolate_scale_h(&c.a, sf[0]);
    ke_attr_set_interpolate_scale_w(&c.a, sf[1]);
    ke_attr_set_interpolate_mode(&c.a, o.mode);
    ke_attr_set_interpolate_align_corners(&c.a, o.align_corners);
    return ke_call1(&c);
}

/* ---- prelu ------------------------------------------------------------------------------------ */

/* where(x > 0, x, weight * x), weight broadcast along dim 1 (PyTorch's
 * channel dim; a 1-D or 0-dim x has one channel). */
int ke_decomp_prelu(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *w = c->in[1];
    char b1[256], b2[256];
    if (!ke_is_float((kl_dtype)x->dtype) || w->dtype != x->dtype)
        return ke_err(KL_ERR_DTYPE, op, "x %s and weight %s must be floating with one dtype",
                      ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, w));
    if (w->ndim > 1)
        return ke_err(KL_ERR_SHAPE, op, "weight must be a scalar or 1-D, got %s", ke_fmt_tensor(b1, sizeof b1, w));
    int64_t nw = ke_numel(w->ndim, w->shape), ch = x->ndim >= 2 ? x->shape[1] : 1;
    if (nw != 1 && nw != ch)
        return ke_err(KL_ERR_SHAPE, op, "weight %s must have 1 or %lld (x %s's channels) elements",
                      ke_fmt_tensor(b1, sizeof b1, w), (long long)ch, ke_fmt_tensor(b2, sizeof b2, x));
    int64_t s[KL_MAX_DIMS];
    int nd = nw == 1 ? 0 : x->ndim - 1;
    for (int e = 0; e < nd; e++) s[e] = e == 0 ? ch : 1;
    kl_scope_begin();
    kl_tensor *y = kl_where(kl_gt_scalar(x, 0), x, kl_mul(kl_reshape(w, nd, s), x));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

kl_tensor *kl_prelu(kl_tensor *x, kl_tensor *weight) {
    kl_tensor *in[2] = {x, weight};
    ke_call c = {.op = KE_OP_prelu, .nin = 2, .in = in};
    return ke_call1(&c);
}
