/* tmpl/pool.h — max and average 2-d pooling of one plane per task for one
 * dtype (conv.c): a template, included once per dtype. Define before including
 * (#undef'd at the end): PL_T the element type, PL_A the average's
 * accumulator, PL_SFX the suffix, PL_LOWEST the max's start, PL_ISNAN(v) and
 * PL_ADD(sum, v); optionally PL_2X2(x, y, planes, p), disjoint 2x2 max
 * pooling (ke_pool_2x2) of a task's run of planes in place of the loops here.
 * Max: NaN wins, padding never counts. Avg: PyTorch's divisor (the window
 * clipped to the padded input when count_include_pad, else to the input);
 * integer averages truncate toward zero as in C++. */
#include "tmpl.h"

#define PL_FN(name) KE_TCAT3(name, _, PL_SFX)

#ifndef PL_2X2
/* Disjoint 2x2 windows inside the input (kernel 2, stride 2, no padding,
 * dilation 1: the CNNs' pool): the same taps in the same order as the
 * general loop below, written so that the compiler vectorizes the row. */
static void PL_FN(maxpool2x2)(const pool_ctx *p, const PL_T *x, PL_T *y) {
    for (int64_t oh = 0; oh < p->OH; oh++) {
        const PL_T *restrict r0 = x + 2 * oh * p->W, *restrict r1 = r0 + p->W;
        PL_T *restrict yr = y + oh * p->OW;
        for (int64_t ow = 0; ow < p->OW; ow++) {
            PL_T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1], m = a;
            m = b > m || PL_ISNAN(b) ? b : m;
            m = c > m || PL_ISNAN(c) ? c : m;
            m = d > m || PL_ISNAN(d) ? d : m;
            yr[ow] = m;
        }
    }
}
#endif

static void PL_FN(maxpool)(void *ctx, int64_t p0, int64_t p1) {
    const pool_ctx *p = ctx;
#ifdef PL_2X2
    if (ke_pool_2x2(p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->H, p->W, p->OH, p->OW)) {
        PL_2X2((const PL_T *)p->x + p0 * p->H * p->W, (PL_T *)p->y + p0 * p->OH * p->OW, p1 - p0, p);
        return;
    }
#endif
    for (int64_t pl = p0; pl < p1; pl++) {
        const PL_T *x = (const PL_T *)p->x + pl * p->H * p->W;
        PL_T *y = (PL_T *)p->y + pl * p->OH * p->OW;
#ifndef PL_2X2
        if (ke_pool_2x2(p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, p->dh, p->dw, p->H, p->W, p->OH, p->OW)) {
            PL_FN(maxpool2x2)(p, x, y);
            continue;
        }
#endif
        for (int64_t oh = 0; oh < p->OH; oh++)
            for (int64_t ow = 0; ow < p->OW; ow++) {
                PL_T m = PL_LOWEST;
                /* only the taps inside the input: a kernel of 2^62 must not loop 2^62 times */
                int64_t hb = oh * p->sh - p->ph, wb = ow * p->sw - p->pw;
                int64_t i0 = pl_first_tap(hb, p->dh), i1 = pl_end_tap(hb, p->dh, p->H, p->kh);
                int64_t j0 = pl_first_tap(wb, p->dw), j1 = pl_end_tap(wb, p->dw, p->W, p->kw);
                for (int64_t i = i0; i < i1; i++) {
                    int64_t ih = hb + i * p->dh;
                    for (int64_t j = j0; j < j1; j++) {
                        int64_t iw = wb + j * p->dw;
                        PL_T v = x[ih * p->W + iw];
                        if (v > m || PL_ISNAN(v)) m = v;
                    }
                }
                y[oh * p->OW + ow] = m;
            }
    }
}
static void PL_FN(avgpool)(void *ctx, int64_t p0, int64_t p1) {
    const pool_ctx *p = ctx;
    for (int64_t pl = p0; pl < p1; pl++) {
        const PL_T *x = (const PL_T *)p->x + pl * p->H * p->W;
        PL_T *y = (PL_T *)p->y + pl * p->OH * p->OW;
        for (int64_t oh = 0; oh < p->OH; oh++)
            for (int64_t ow = 0; ow < p->OW; ow++) {
                int64_t hs = oh * p->sh - p->ph, ws = ow * p->sw - p->pw;
                /* kh < H + ph - hs, not hs + kh < ...: a huge kernel must not overflow */
                int64_t he = p->kh < p->H + p->ph - hs ? hs + p->kh : p->H + p->ph;
                int64_t we = p->kw < p->W + p->pw - ws ? ws + p->kw : p->W + p->pw;
                double pool = (double)(he - hs) * (double)(we - ws); /* may pass 2^63 */
                hs = hs < 0 ? 0 : hs, ws = ws < 0 ? 0 : ws;
                he = he > p->H ? p->H : he, we = we > p->W ? p->W : we;
                if (hs >= he || ws >= we) {
                    y[oh * p->OW + ow] = 0;
                    continue;
                }
                PL_A sum = 0;
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) sum = PL_ADD(sum, x[ih * p->W + iw]);
                if (p->count_include_pad && pool > 0x1p62) {
                    y[oh * p->OW + ow] = (PL_T)((double)sum / pool); /* |result| < 1: 0 for integers */
                    continue;
                }
                PL_A div = (PL_A)(p->count_include_pad ? (int64_t)pool : (he - hs) * (we - ws));
                y[oh * p->OW + ow] = (PL_T)(sum / div);
            }
    }
}

#undef PL_FN
#undef PL_T
#undef PL_A
#undef PL_SFX
#undef PL_LOWEST
#undef PL_ISNAN
#undef PL_ADD
#undef PL_2X2
