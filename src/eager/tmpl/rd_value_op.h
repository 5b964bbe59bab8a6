/* tmpl/rd_value_op.h — one ke_rd_kernel (reduce_ops.c) that folds into one
 * accumulator value: a template, included once per reduction and loop dtype
 * (by tmpl/rd_types.h). Define before including (#undef'd at the end):
 *   RK_OP               the formula prefix (SUM, MEAN, VAR...: OP_INIT, OP_STEP,
 *                       OP_MERGE, OP_FIN, OP_AUX in reduce_ops.c); kept defined
 *   RK_SFX              the dtype suffix of the names (f32...)
 *   RK_T, RK_A, RK_R    input, accumulator and result types
 *   RK_VDT              the result's dtype
 * Defines the static kernel OP_k_SFX (e.g. SUM_k_f32). The row fold is
 * tmpl/row_fold.h's. */
#define RV_FN(s) RK_CAT3(RK_OP, _##s##_, RK_SFX)
#define RV_INIT RK_CAT(RK_OP, _INIT)(RK_A)
#define RV_STEP(a, x) RK_CAT(RK_OP, _STEP)(RK_A, a, x)
#define RV_MERGE(a, b) RK_CAT(RK_OP, _MERGE)(RK_A, a, b)
#define RV_FIN(a) RK_CAT(RK_OP, _FIN)(RK_A, a)
#define RV_AUX RK_CAT(RK_OP, _AUX)

#define RF_FN(s) RV_FN(s)
#define RF_A RK_A
#define RF_V RK_T
#define RF_INIT RV_INIT
#define RF_STEP(a, v) RV_STEP(a, v)
#define RF_MERGE(a, b) RV_MERGE(a, b)
#define RF_X(i) x[i]
#define RF_PARAMS , const RK_T *restrict x, const RK_A aux, const double p
#define RF_ARGS , x, aux, p
#define RF_UNUSED ((void)aux, (void)p)
#include "row_fold.h"

static void RV_FN(init)(void *acc_, int64_t n) {
    RK_A *acc = acc_;
    for (int64_t j = 0; j < n; j++) acc[j] = RV_INIT;
}

static void RV_FN(row)(void *acc_, const void *x_, int64_t n, int64_t i0, const void *aux_, const ke_attrs *at) {
    const RK_A aux = RV_AUX ? *(const RK_A *)aux_ : (RK_A)0;
    (void)i0;
    *(RK_A *)acc_ = RV_FN(fold)(*(RK_A *)acc_, n, x_, aux, ke_attr_reduce_param(at));
}

static void RV_FN(cols)(void *acc_, const void *x_, int64_t n, int64_t m, int64_t xs, int64_t i0, const void *aux_,
                        const ke_attrs *at) {
    RK_A *restrict acc = acc_;
    const RK_A *restrict auxv = aux_;
    const double p = ke_attr_reduce_param(at);
    (void)i0, (void)p, (void)auxv;
    for (int64_t r = 0; r < m; r++) {
        const RK_T *restrict x = (const RK_T *)x_ + r * xs;
        for (int64_t j = 0; j < n; j++) {
            const RK_A aux = RV_AUX ? auxv[j] : (RK_A)0;
            (void)aux;
            acc[j] = RV_STEP(acc[j], x[j]);
        }
    }
}

static void RV_FN(merge)(void *a_, const void *b_, int64_t n) {
    RK_A *restrict a = a_;
    const RK_A *restrict b = b_;
    for (int64_t j = 0; j < n; j++) a[j] = RV_MERGE(a[j], b[j]);
}

static void RV_FN(fin)(void *v_, int64_t *idx, const void *acc_, int64_t n, int64_t cnt, const void *aux_,
                       const ke_attrs *at) {
    RK_R *restrict v = v_;
    const RK_A *restrict acc = acc_;
    const RK_A *restrict auxv = aux_;
    const double p = ke_attr_reduce_param(at);
    (void)idx, (void)cnt, (void)p, (void)auxv;
    for (int64_t j = 0; j < n; j++) {
        const RK_A aux = RV_AUX ? auxv[j] : (RK_A)0;
        (void)aux;
        v[j] = (RK_R)(RV_FIN(acc[j]));
    }
}

static void RV_FN(cpush)(ke_fold_casc *c, const void *v) { RV_FN(push)(c, *(const RK_A *)v); }
static void RV_FN(cdrain)(void *acc, const ke_fold_casc *c) { *(RK_A *)acc = RV_FN(drain)(*(RK_A *)acc, c); }

static const ke_rd_kernel RV_FN(k) = {RV_FN(init), RV_FN(row),  RV_FN(cols),   RV_FN(merge),
                                      RV_FN(fin),  RV_FN(cpush), RV_FN(cdrain), sizeof(RK_A), RK_VDT};

#undef RV_FN
#undef RV_INIT
#undef RV_STEP
#undef RV_MERGE
#undef RV_FIN
#undef RV_AUX
#undef RK_SFX
#undef RK_T
#undef RK_A
#undef RK_R
#undef RK_VDT
