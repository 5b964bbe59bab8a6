/* tmpl/row_fold.h — the row fold of row_fold.h as C: a template, included
 * once per formula and accumulator type (no include guard). Eager reductions
 * (tmpl/rd_value_op.h) and nn.c's softmax / layer_norm rows are instances;
 * cg_emit.c emits the same steps in LLVM IR (and calls this cascade).
 * Define before including (#undef'd at the end):
 *   RF_FN(s)        the instance's function names, e.g. SUM_##s##_f32
 *   RF_A, RF_V      accumulator type; operand type
 *   RF_INIT         the initial value
 *   RF_STEP(a, v)   a with operand v folded in
 *   RF_MERGE(a, b)  a followed by b (b covers later positions)
 *   RF_X(i)         operand element i, computed from the parameters below
 *   RF_PARAMS       the instance's own parameters, with a leading comma
 *   RF_ARGS         their names, with a leading comma
 *   RF_UNUSED       a statement: (void) casts of parameters some formula ignores
 * optional:
 *   RF_SAVE(i, v)   a statement run once per operand element (softmax stores exp)
 *   RF_BLOCK(i)     a statement run before each whole block (prefetching)
 * Defines RF_FN(lanes)(a, i0, i1, ...): chunk [i0, i1) folded into a;
 * RF_FN(push), RF_FN(drain): the cascade (tmpl/fold_cascade.h);
 * RF_FN(fold)(a, n, ...): the row [0, n) folded into a. */
#ifndef RF_SAVE
#define RF_SAVE(i, v) ((void)0)
#endif
#ifndef RF_BLOCK
#define RF_BLOCK(i) ((void)0)
#endif

static inline RF_A RF_FN(lanes)(RF_A a, int64_t i0, int64_t i1 RF_PARAMS) {
    enum { L = KE_FOLD_LANES(RF_A) };
    int64_t i = i0;
    RF_UNUSED;
    if (i1 - i0 >= L) { /* short runs skip the lanes */
        RF_A l[L];
        for (int j = 0; j < L; j++) l[j] = RF_INIT;
        for (; i + L <= i1; i += L) {
            RF_BLOCK(i);
            for (int j = 0; j < L; j++) {
                RF_V v = RF_X(i + j);
                RF_SAVE(i + j, v);
                l[j] = RF_STEP(l[j], v);
            }
        }
        for (int w = L / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) l[j] = RF_MERGE(l[j], l[j + w]);
        a = RF_MERGE(a, l[0]);
    }
    if (i < i1) { /* the tail: operands computed by a loop that vectorizes, folded in order */
        RF_V t[L];
        const int m = (int)(i1 - i);
        for (int j = 0; j < m; j++) {
            t[j] = RF_X(i + j);
            RF_SAVE(i + j, t[j]);
        }
        for (int j = 0; j < m; j++) a = RF_STEP(a, t[j]);
    }
    return a;
}

#define RF_KEEP_PARAMS
#include "fold_cascade.h"
#undef RF_KEEP_PARAMS

static inline RF_A RF_FN(fold)(RF_A a, int64_t n RF_PARAMS) {
    if (n <= KE_FOLD_CHUNK) return RF_FN(lanes)(a, 0, n RF_ARGS);
    ke_fold_casc c;
    memset(c.cnt, 0, sizeof c.cnt);
    for (int64_t i0 = 0; i0 < n; i0 += KE_FOLD_CHUNK)
        RF_FN(push)(&c, RF_FN(lanes)(RF_INIT, i0, n - i0 < KE_FOLD_CHUNK ? n : i0 + KE_FOLD_CHUNK RF_ARGS));
    return RF_FN(drain)(a, &c);
}

#undef RF_FN
#undef RF_A
#undef RF_V
#undef RF_INIT
#undef RF_STEP
#undef RF_MERGE
#undef RF_X
#undef RF_PARAMS
#undef RF_ARGS
#undef RF_UNUSED
#undef RF_SAVE
#undef RF_BLOCK
