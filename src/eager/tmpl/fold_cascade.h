/* tmpl/fold_cascade.h — the cascade of row_fold.h for one accumulator type
 * and MERGE; a template, included once per instance (no include guard), and
 * also by tmpl/row_fold.h.
 * Define before including (#undef'd at the end, with everything this defines):
 *   RF_FN(s)        the instance's function names, e.g. SUM_##s##_f32
 *   RF_A            accumulator type (at most KE_FOLD_ACC_MAX bytes)
 *   RF_INIT         the initial value
 *   RF_MERGE(a, b)  a followed by b (b covers later positions)
 * Defines RF_FN(push)(c, v): chunk value v (after all earlier ones) joins the
 * cascade c; RF_FN(drain)(a, c): MERGE(a, the cascade's value). */
#include <string.h>

_Static_assert(sizeof(RF_A) <= KE_FOLD_ACC_MAX, "accumulator too large for the fold cascade");

static inline void RF_FN(push)(ke_fold_casc *c, RF_A v) {
    for (int l = 0;; l++) {
        if (c->cnt[l] == 0) {
            memcpy(c->lv[l], &v, sizeof v);
            c->cnt[l] = 1;
            return;
        }
        RF_A u;
        memcpy(&u, c->lv[l], sizeof u);
        u = RF_MERGE(u, v);
        memcpy(c->lv[l], &u, sizeof u);
        if (l == KE_FOLD_LEVELS - 1 || ++c->cnt[l] < KE_FOLD_FAN) return;
        v = u;
        c->cnt[l] = 0;
    }
}

static inline RF_A RF_FN(drain)(RF_A a, const ke_fold_casc *c) {
    RF_A r = RF_INIT;
    for (int l = KE_FOLD_LEVELS - 1; l >= 0; l--)
        if (c->cnt[l]) {
            RF_A u;
            memcpy(&u, c->lv[l], sizeof u);
            r = RF_MERGE(r, u);
        }
    return RF_MERGE(a, r);
}

#ifndef RF_KEEP_PARAMS /* tmpl/row_fold.h undefines them itself */
#undef RF_FN
#undef RF_A
#undef RF_INIT
#undef RF_MERGE
#endif
