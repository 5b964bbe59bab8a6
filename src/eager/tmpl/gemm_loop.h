/* tmpl/gemm_loop.h — the plain GEMM loop for one dtype (linalg.c): a
 * template, included once per dtype. Define before including (#undef'd at
 * the end): LG_T the element type, LG_U the unsigned type integer products
 * wrap in, LG_SFX the suffix, LG_CAST(v) alpha / beta as LG_T. */
#include "tmpl.h"

#define LG_FN(name) KE_TCAT3(name, _, LG_SFX)

static void LG_FN(loop)(void *ctx, int64_t i0, int64_t i1) {
    const gemm_loop_args *g = ctx;
    enum { NB = 256, KB = 64 };
    const LG_T *A = g->A, *B = g->B;
    LG_T *C = g->C;
    const LG_U alpha = (LG_U)LG_CAST(g->alpha), beta = (LG_U)LG_CAST(g->beta);
    for (int64_t i = i0; i < i1; i++) {
        LG_T *c = C + i * g->ldc;
        if (g->beta == 0)
            for (int64_t j = 0; j < g->N; j++) c[j] = 0;
        else if (g->beta != 1)
            for (int64_t j = 0; j < g->N; j++) c[j] = (LG_T)((LG_U)c[j] * beta);
    }
    for (int64_t j0 = 0; j0 < g->N; j0 += NB) {
        int64_t nj = g->N - j0 < NB ? g->N - j0 : NB;
        for (int64_t k0 = 0; k0 < g->K; k0 += KB) {
            int64_t k1 = g->K - k0 < KB ? g->K : k0 + KB;
            for (int64_t i = i0; i < i1; i++) {
                LG_T *restrict c = C + i * g->ldc + j0;
                for (int64_t k = k0; k < k1; k++) {
                    const LG_U a = (LG_U)A[i * g->ars + k * g->acs] * alpha;
                    const LG_T *restrict b = B + k * g->brs + j0 * g->bcs;
                    if (g->bcs == 1)
                        for (int64_t j = 0; j < nj; j++) c[j] = (LG_T)((LG_U)c[j] + a * (LG_U)b[j]);
                    else
                        for (int64_t j = 0; j < nj; j++) c[j] = (LG_T)((LG_U)c[j] + a * (LG_U)b[j * g->bcs]);
                }
            }
        }
    }
}

#undef LG_FN
#undef LG_T
#undef LG_U
#undef LG_SFX
#undef LG_CAST
