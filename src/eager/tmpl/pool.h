/* tmpl/pool.h — max and average 2-d pooling of one plane per task for one
 * dtype (conv.c): a template, included once per dtype. Define before including
 * (#undef'd at the end): PL_T the element type, PL_A the average's
 * accumulator, PL_SFX the suffix, PL_LOWEST the max's start, PL_ISNAN(v) and
 * PL_ADD(sum, v). Max: NaN wins, padding never counts. Avg: PyTorch's divisor
 * (the window clipped to the padded input when count_include_pad, else to the
 * input); integer averages truncate toward zero as in C++. */
#include "tmpl.h"

#define PL_FN(name) KE_TCAT3(name, _, PL_SFX)

static void PL_FN(maxpool)(void *ctx, int64_t p0, int64_t p1) {
    const pool_ctx *p = ctx;
    for (int64_t pl = p0; pl < p1; pl++) {
        const PL_T *x = (const PL_T *)p->x + pl * p->H * p->W;
        PL_T *y = (PL_T *)p->y + pl * p->OH * p->OW;
        for (int64_t oh = 0; oh < p->OH; oh++)
            for (int64_t ow = 0; ow < p->OW; ow++) {
                PL_T m = PL_LOWEST;
                for (int64_t i = 0; i < p->kh; i++) {
                    int64_t ih = oh * p->sh - p->ph + i * p->dh;
                    if (ih < 0 || ih >= p->H) continue;
                    for (int64_t j = 0; j < p->kw; j++) {
                        int64_t iw = ow * p->sw - p->pw + j * p->dw;
                        if (iw < 0 || iw >= p->W) continue;
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
                int64_t he = hs + p->kh < p->H + p->ph ? hs + p->kh : p->H + p->ph;
                int64_t we = ws + p->kw < p->W + p->pw ? ws + p->kw : p->W + p->pw;
                int64_t pool = (he - hs) * (we - ws);
                hs = hs < 0 ? 0 : hs, ws = ws < 0 ? 0 : ws;
                he = he > p->H ? p->H : he, we = we > p->W ? p->W : we;
                if (hs >= he || ws >= we) {
                    y[oh * p->OW + ow] = 0;
                    continue;
                }
                PL_A sum = 0;
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) sum = PL_ADD(sum, x[ih * p->W + iw]);
                PL_A div = (PL_A)(p->count_include_pad ? pool : (he - hs) * (we - ws));
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
