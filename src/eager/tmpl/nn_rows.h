/* tmpl/nn_rows.h — nn.c's row primitives for one compute type: a template,
 * included once per type. Every fold is an instance of tmpl/row_fold.h with
 * the formulas of rd_formulas.h, so a row's max and sums here are bitwise
 * kl_amax's and kl_sum's (and a compiled kernel's) over the same row; the one
 * exception is softmax's shift (row_max_quiet, a plain max: see there).
 * Define before including (#undef'd at the end):
 *   NR_T    the compute type (float, double);  NR_SFX its suffix (f32, f64)
 *   NR_EXP, NR_LOG  its exp and log
 * nx / ny: the next row's input and output to prefetch (NULL: none). */
#include "tmpl.h"
#define NR_FN(name) KE_TCAT3(name, _, NR_SFX)

/* the max: AMAX's fold */
#define RF_FN(s) KE_TCAT3(rmax_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT AMAX_INIT(NR_T)
#define RF_STEP(a, v) AMAX_STEP(NR_T, a, v)
#define RF_MERGE(a, b) AMAX_MERGE(NR_T, a, b)
#define RF_X(i) x[i]
#define RF_PARAMS , const NR_T *restrict x
#define RF_ARGS , x
#define RF_UNUSED ((void)0)
#include "row_fold.h"

/* softmax's shift: the same fold with a plain `>` max, which vectorizes to one
 * max instruction per vector where AMAX's NaN-propagating select takes three.
 * A NaN in the row is skipped here but still reaches every output through
 * exp(NaN - mx) in the sum, so softmax's result is the same (PyTorch: a row
 * with a NaN is all NaN). */
#define RF_FN(s) KE_TCAT3(rmaxq_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT AMAX_INIT(NR_T)
#define RF_STEP(a, v) ((v) > (a) ? (v) : (a))
#define RF_MERGE(a, b) RF_STEP(a, b)
#define RF_X(i) x[i]
#define RF_PARAMS , const NR_T *restrict x
#define RF_ARGS , x
#define RF_UNUSED ((void)0)
#include "row_fold.h"

/* the sum of x: SUM's fold */
#define RF_FN(s) KE_TCAT3(rsum_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT SUM_INIT(NR_T)
#define RF_STEP(a, v) SUM_STEP(NR_T, a, v)
#define RF_MERGE(a, b) SUM_MERGE(NR_T, a, b)
#define RF_X(i) x[i]
#define RF_PARAMS , const NR_T *restrict x
#define RF_ARGS , x
#define RF_UNUSED ((void)0)
#include "row_fold.h"

/* the sum of (x - shift)^2: SUM's fold of that operand */
#define RF_FN(s) KE_TCAT3(rsq_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT SUM_INIT(NR_T)
#define RF_STEP(a, v) SUM_STEP(NR_T, a, v)
#define RF_MERGE(a, b) SUM_MERGE(NR_T, a, b)
#define RF_X(i) ((x[i] - shift) * (x[i] - shift))
#define RF_PARAMS , const NR_T *restrict x, const NR_T shift
#define RF_ARGS , x, shift
#define RF_UNUSED ((void)0)
#include "row_fold.h"

/* the sum of exp(x - mx), the exponentials kept in y */
#define RF_FN(s) KE_TCAT3(rexpy_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT SUM_INIT(NR_T)
#define RF_STEP(a, v) SUM_STEP(NR_T, a, v)
#define RF_MERGE(a, b) SUM_MERGE(NR_T, a, b)
#define RF_X(i) NR_EXP(x[i] - mx)
#define RF_SAVE(i, v) (y[i] = (v))
#define RF_BLOCK(i) prefetch_block(nx, ny, (i) * (int64_t)sizeof(NR_T))
#define RF_PARAMS , const NR_T *restrict x, NR_T *restrict y, const NR_T mx, const NR_T *nx, const NR_T *ny
#define RF_ARGS , x, y, mx, nx, ny
#define RF_UNUSED ((void)0)
#include "row_fold.h"

/* the sum of exp(x - mx) alone */
#define RF_FN(s) KE_TCAT3(rexp_##s, _, NR_SFX)
#define RF_A NR_T
#define RF_V NR_T
#define RF_INIT SUM_INIT(NR_T)
#define RF_STEP(a, v) SUM_STEP(NR_T, a, v)
#define RF_MERGE(a, b) SUM_MERGE(NR_T, a, b)
#define RF_X(i) NR_EXP(x[i] - mx)
#define RF_BLOCK(i) prefetch_block(nx, NULL, (i) * (int64_t)sizeof(NR_T))
#define RF_PARAMS , const NR_T *restrict x, const NR_T mx, const NR_T *nx
#define RF_ARGS , x, mx, nx
#define RF_UNUSED ((void)0)
#include "row_fold.h"

static NR_T NR_FN(row_max)(const NR_T *restrict x, int64_t n) {
    return KE_TCAT3(rmax_fold, _, NR_SFX)(AMAX_INIT(NR_T), n, x);
}

static NR_T NR_FN(row_max_quiet)(const NR_T *restrict x, int64_t n) {
    return KE_TCAT3(rmaxq_fold, _, NR_SFX)(AMAX_INIT(NR_T), n, x);
}

/* sum of exp(x - mx); the exponentials also go to y when y != NULL */
static NR_T NR_FN(row_sumexp)(const NR_T *restrict x, NR_T *restrict y, int64_t n, NR_T mx, const NR_T *nx,
                              const NR_T *ny) {
    if (y) return KE_TCAT3(rexpy_fold, _, NR_SFX)(SUM_INIT(NR_T), n, x, y, mx, nx, ny);
    return KE_TCAT3(rexp_fold, _, NR_SFX)(SUM_INIT(NR_T), n, x, mx, nx);
}

/* sum of (x - shift)^2, or of x when sq is 0 */
static NR_T NR_FN(row_sum)(const NR_T *restrict x, int64_t n, NR_T shift, int sq) {
    if (sq) return KE_TCAT3(rsq_fold, _, NR_SFX)(SUM_INIT(NR_T), n, x, shift);
    return KE_TCAT3(rsum_fold, _, NR_SFX)(SUM_INIT(NR_T), n, x);
}

NR_T NR_FN(ke_row_logsumexp)(const NR_T *x, int64_t n, const NR_T *next) {
    NR_T mx = NR_FN(row_max)(x, n);
    return mx + (NR_T)NR_LOG(NR_FN(row_sumexp)(x, NULL, n, mx, next, NULL));
}

double NR_FN(ke_row_sum)(const NR_T *x, int64_t n) { return NR_FN(row_sum)(x, n, 0, 0); }
NR_T NR_FN(ke_row_max)(const NR_T *x, int64_t n) { return NR_FN(row_max)(x, n); }

#undef NR_FN
#undef NR_T
#undef NR_SFX
#undef NR_EXP
#undef NR_LOG
