/*
 * derivatives.c — builds ag_derivs, the derivative table indexed by ke_op,
 * from derivatives.def. Formulas live in d_*.c, one file per op family.
 */
#include "autograd.h"

#define AG_DERIV(op, save, fn) int fn(ag_ctx *c);
#define AG_DECOMP(op)
#include "derivatives.def"
#undef AG_DERIV
#undef AG_DECOMP

/* A second row for one op would silently win: make it an error. */
#pragma GCC diagnostic error "-Woverride-init"
const ag_deriv ag_derivs[KE_OP_COUNT] = {
#define AG_DERIV(op, save_, fn_) [KE_OP_##op] = {.fn = fn_, .save = (save_)},
#define AG_DECOMP(op) [KE_OP_##op] = {.decomp = 1},
#include "derivatives.def"
#undef AG_DERIV
#undef AG_DECOMP
};
_Static_assert(sizeof ag_derivs / sizeof ag_derivs[0] == KE_OP_COUNT, "one derivative slot per op");
