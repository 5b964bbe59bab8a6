/* tmpl/rd_index_op.h — one ke_rd_kernel (reduce_ops.c) that finds the best
 * value and its first position (max_dim, argmax...): a template, included once
 * per reduction and loop dtype (by tmpl/rd_types.h). Define before including
 * (#undef'd at the end):
 *   RK_OP        ARGMAX or ARGMIN (OP_BETTER in reduce_ops.c); kept defined
 *   RK_SFX       the dtype suffix of the names (f32...)
 *   RK_T         the value type;  RK_VDT its dtype
 * The accumulator is the best value and its position (i < 0: nothing seen
 * yet). row finds the best value with a lane fold, then its first position;
 * rows longer than a chunk join tmpl/fold_cascade.h's cascade. */
#define RI_FN(s) RK_CAT3(RK_OP, _##s##_, RK_SFX)
#define RI_ACC RI_FN(acc)
#define RI_BETTER(a, b) RK_CAT(RK_OP, _BETTER)(a, b)

typedef struct RI_ACC {
    RK_T v;
    int64_t i;
} RI_ACC;

static inline void RI_FN(take)(RI_ACC *a, RK_T v, int64_t i) {
    if (a->i < 0 || RI_BETTER(v, a->v) || (RK_SAME(v, a->v) && i < a->i)) {
        a->v = v;
        a->i = i;
    }
}

static inline RI_ACC RI_FN(join)(RI_ACC a, RI_ACC b) {
    if (b.i >= 0) RI_FN(take)(&a, b.v, b.i);
    return a;
}

#define RF_FN(s) RI_FN(s)
#define RF_A RI_ACC
#define RF_INIT ((RI_ACC){0, -1})
#define RF_MERGE(a, b) RI_FN(join)(a, b)
#include "fold_cascade.h"

static void RI_FN(init)(void *acc_, int64_t n) {
    RI_ACC *acc = acc_;
    for (int64_t j = 0; j < n; j++) acc[j] = (RI_ACC){0, -1};
}

static void RI_FN(row)(void *acc_, const void *x_, int64_t n, int64_t i0, const void *aux_, const ke_attrs *at) {
    enum { L = KE_FOLD_LANES(RK_T) > 64 ? 64 : KE_FOLD_LANES(RK_T) };
    const RK_T *restrict x = x_;
    RK_T best;
    int64_t i = 1;
    (void)aux_, (void)at;
    if (n <= 0) return;
    best = x[0];
    if (n >= L) {
        RK_T l[L];
        for (int j = 0; j < L; j++) l[j] = x[j];
        for (i = L; i + L <= n; i += L)
            for (int j = 0; j < L; j++) l[j] = RI_BETTER(x[i + j], l[j]) ? x[i + j] : l[j];
        for (int w = L / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) l[j] = RI_BETTER(l[j + w], l[j]) ? l[j + w] : l[j];
        best = l[0];
    }
    for (; i < n; i++) best = RI_BETTER(x[i], best) ? x[i] : best;
    for (i = 0; i + L <= n; i += L) { /* skip blocks without it, vectorized */
        int hit = 0;
        for (int j = 0; j < L; j++) hit |= RK_SAME(x[i + j], best);
        if (hit) break;
    }
    for (; i < n - 1 && !RK_SAME(x[i], best); i++) {
    }
    RI_FN(take)(acc_, best, i0 + i);
}

static void RI_FN(cols)(void *acc_, const void *x_, int64_t n, int64_t m, int64_t xs, int64_t i0, const void *aux_,
                        const ke_attrs *at) {
    RI_ACC *restrict acc = acc_;
    (void)aux_, (void)at;
    for (int64_t r = 0; r < m; r++) {
        const RK_T *restrict x = (const RK_T *)x_ + r * xs;
        for (int64_t j = 0; j < n; j++)
            if (acc[j].i < 0 || RI_BETTER(x[j], acc[j].v)) acc[j] = (RI_ACC){x[j], i0 + r};
    }
}

static void RI_FN(merge)(void *a_, const void *b_, int64_t n) {
    RI_ACC *a = a_;
    const RI_ACC *b = b_;
    for (int64_t j = 0; j < n; j++) a[j] = RI_FN(join)(a[j], b[j]);
}

static void RI_FN(fin)(void *v_, int64_t *idx, const void *acc_, int64_t n, int64_t cnt, const void *aux_,
                       const ke_attrs *at) {
    RK_T *v = v_;
    const RI_ACC *acc = acc_;
    (void)cnt, (void)aux_, (void)at;
    for (int64_t j = 0; j < n; j++) {
        v[j] = acc[j].v;
        idx[j] = acc[j].i;
    }
}

static void RI_FN(cpush)(ke_fold_casc *c, const void *v) { RI_FN(push)(c, *(const RI_ACC *)v); }
static void RI_FN(cdrain)(void *acc, const ke_fold_casc *c) { *(RI_ACC *)acc = RI_FN(drain)(*(RI_ACC *)acc, c); }

_Static_assert(sizeof(RI_ACC) <= KE_RD_ACC_MAX, "accumulator size");
static const ke_rd_kernel RI_FN(k) = {RI_FN(init), RI_FN(row),   RI_FN(cols),   RI_FN(merge),   RI_FN(fin),
                                      RI_FN(cpush), RI_FN(cdrain), sizeof(RI_ACC), RK_VDT};

#undef RI_FN
#undef RI_ACC
#undef RI_BETTER
#undef RK_SFX
#undef RK_T
#undef RK_VDT
