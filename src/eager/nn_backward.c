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

typedef struct pidx_ctx {
    const char *x;
    int64_t *y;
    int64_t H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
} pidx_ctx;

/* First in-range tap of a window starting at `start` with step `dil`, and
 * the end (exclusive) of its taps clipped to the input. */
static void window_span(int64_t start, int64_t k, int64_t dil, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t end = start + (k - 1) * dil + 1;
    *hi = end < n ? end : n;
    *lo = start >= 0 ? start : start + (-start + dil - 1) / dil * dil;
}

#define KE_POOL_INDICES(T, sfx)                                                                        \
    static void pidx_##sfx(void *ctx, int64_t p0, int64_t p1) {                                        \
        const pidx_ctx *p = ctx;                                                                       \
        for (int64_t pl = p0; pl < p1; pl++) {                                                         \
            const T *x = (const T *)p->x + pl * p->H * p->W;                                           \
            int64_t *y = p->y + pl * p->OH * p->OW;                                                    \
            for (int64_t oh = 0; oh < p->OH; oh++) {                                                   \
                int64_t ih0, ih1;                                                                      \
                window_span(oh * p->sh - p->ph, p->kh, p->dh, p->H, &ih0, &ih1);                       \
                for (int64_t ow = 0; ow < p->OW; ow++) {                                               \
                    int64_t iw0, iw1;                                                                  \
                    window_span(ow * p->sw - p->pw, p->kw, p->dw, p->W, &iw0, &iw1);                   \
                    int64_t best = p->H * p->W;                                                        \
                    if (ih0 < ih1 && iw0 < iw1) {                                                      \
                        best = ih0 * p->W + iw0;                                                       \
                        T m = -INFINITY;                                                               \
                        for (int64_t ih = ih0; ih < ih1; ih += p->dh)                                  \
                            for (int64_t iw = iw0; iw < iw1; iw += p->dw) {                            \
                                T v = x[ih * p->W + iw];                                               \
                                if (v > m || isnan(v)) m = v, best = ih * p->W + iw;                   \
                            }                                                                          \
                    }                                                                                  \
                    y[oh * p->OW + ow] = best;                                                         \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }
KE_POOL_INDICES(float, f32)
KE_POOL_INDICES(double, f64)

int ke_cpu_max_pool2d_indices(ke_call *c) {
    kl_tensor *out = c->out[0];
    if (ke_numel(out->ndim, out->shape) == 0) return 0;
    kl_scope_begin();
    /* f16/bf16 compare exactly in f32 */
    kl_tensor *x = kl_contiguous(kl_to_dtype(c->in[0], c->compute));
    if (x) {
        int b = x->ndim == 4;
        /* max_pool2d_indices has max_pool2d's attributes */
        const int64_t *k = ke_attr_max_pool2d_kernel_size(&c->a), *s = ke_attr_max_pool2d_stride(&c->a),
                      *pad = ke_attr_max_pool2d_padding(&c->a), *dil = ke_attr_max_pool2d_dilation(&c->a);
        pidx_ctx p = {ke_data(x), (int64_t *)ke_data(out), x->shape[b + 1], x->shape[b + 2], out->shape[b + 1],
                      out->shape[b + 2], k[0], k[1], s[0], s[1], pad[0], pad[1], dil[0], dil[1]};
        int64_t planes = (b ? x->shape[0] : 1) * x->shape[b], per;
        if (ke_mul_ov(p.OH * p.OW, p.kh, &per) || ke_mul_ov(per, p.kw, &per)) per = INT64_MAX; /* huge kernels */
        ke_parallel_for(planes, per >= 16384 ? 1 : 16384 / (per ? per : 1),
                        x->dtype == KL_F64 ? pidx_f64 : pidx_f32, &p);
    }
    kl_scope_end();
    return x ? 0 : -1;
}
