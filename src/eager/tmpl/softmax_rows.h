/* tmpl/softmax_rows.h — softmax / log_softmax over rows and column blocks for
 * one compute type (nn.c): a template, included once per type. Define before
 * including (#undef'd at the end): SM_T the type, SM_SFX its suffix (f32, f64),
 * SM_EXP and SM_LOG its exp and log. Rows (inner == 1) are contiguous;
 * otherwise a task is a block of up to KE_COL_BLOCK columns (256 bytes of f32)
 * of one [n, inner] slab, handled lane-wise in three passes; the first
 * prefetches 16 rows ahead since its strided reads defeat the hardware
 * prefetcher, the others find the block in L2. The row max and sums are
 * tmpl/nn_rows.h's (the row fold). */
#include "tmpl.h"

#define SM_FN(name) KE_TCAT3(name, _, SM_SFX)

static void SM_FN(softmax_row)(const SM_T *restrict x, SM_T *restrict y, int64_t n, int log_, const SM_T *nx,
                               const SM_T *ny) {
    SM_T mx = SM_FN(row_max_quiet)(x, n);
    if (!log_) {
        SM_T inv = (SM_T)1 / (SM_T)SM_FN(row_sumexp)(x, y, n, mx, nx, ny);
        for (int64_t i = 0; i < n; i++) y[i] *= inv;
    } else {
        SM_T ls = (SM_T)SM_LOG((SM_T)SM_FN(row_sumexp)(x, NULL, n, mx, nx, ny));
        for (int64_t i = 0; i < n; i++) y[i] = x[i] - mx - ls;
    }
}
static void SM_FN(softmax_cols)(const SM_T *x, SM_T *y, int64_t n, int64_t inner, int64_t w, int log_) {
    SM_T m[KE_COL_BLOCK], s[KE_COL_BLOCK];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t k = 0; k < n; k++) {
        const SM_T *restrict r = x + k * inner;
        if (k + 16 < n) prefetch_block(r + 16 * inner, NULL, 0);
        for (int64_t j = 0; j < w; j++) m[j] = r[j] > m[j] ? r[j] : m[j];
    }
    for (int64_t k = 0; k < n; k++) {
        const SM_T *restrict r = x + k * inner;
        SM_T *restrict o = y + k * inner;
        if (!log_)
            for (int64_t j = 0; j < w; j++) s[j] += o[j] = SM_EXP(r[j] - m[j]);
        else
            for (int64_t j = 0; j < w; j++) s[j] += SM_EXP(r[j] - m[j]);
    }
    for (int64_t j = 0; j < w; j++) s[j] = log_ ? (SM_T)SM_LOG(s[j]) : (SM_T)1 / s[j];
    for (int64_t k = 0; k < n; k++) {
        const SM_T *restrict r = x + k * inner;
        SM_T *restrict o = y + k * inner;
        if (!log_)
            for (int64_t j = 0; j < w; j++) o[j] *= s[j];
        else
            for (int64_t j = 0; j < w; j++) o[j] = r[j] - m[j] - s[j];
    }
}
static void SM_FN(softmax_range)(void *ctx, int64_t t0, int64_t t1) {
    const softmax_ctx *p = ctx;
    const SM_T *x = (const SM_T *)p->x;
    SM_T *y = (SM_T *)p->y;
    const int64_t n = p->n;
    for (int64_t t = t0; t < t1; t++) {
        if (p->inner == 1) {
            int pf = t + 1 < t1 && n * (int64_t)sizeof(SM_T) <= 65536;
            SM_FN(softmax_row)
            (x + t * n, y + t * n, n, p->log_, pf ? x + (t + 1) * n : NULL, pf ? y + (t + 1) * n : NULL);
        } else {
            int64_t o = t / p->ncb, c0 = (t % p->ncb) * KE_COL_BLOCK;
            int64_t w = p->inner - c0 < KE_COL_BLOCK ? p->inner - c0 : KE_COL_BLOCK;
            int64_t base = o * n * p->inner + c0;
            SM_FN(softmax_cols)(x + base, y + base, n, p->inner, w, p->log_);
        }
    }
}

#undef SM_FN
#undef SM_T
#undef SM_SFX
#undef SM_EXP
#undef SM_LOG
