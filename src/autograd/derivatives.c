/*
 * derivatives.c — builds ag_derivs, the derivative table indexed by ke_op,
 * from the `save` and `deriv` columns of the op table's rows (optable.def).
 * Formulas live in d_*.c, one file per op family; autograd.h declares them
 * from the same rows.
 */
#include "autograd.h"

/* deriv is a formula, `decomp` (through the op's decomposition) or `none`
 * (not differentiable or implicit: the slot stays empty). */
#define AG_ENTRY_NAME(op, save_, fn_) [KE_OP_##op] = {.fn = fn_, .save = (save_)},
#define AG_ENTRY_DECOMP(op, save_, fn_) [KE_OP_##op] = {.decomp = 1},
#define AG_ENTRY_NONE(op, save_, fn_)

const ag_deriv ag_derivs[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_PP_CAT(AG_ENTRY_, KE_COL_TAG(deriv_))(name_, save_, deriv_)
#include "optable.def"
#undef KE_OP
};
_Static_assert(sizeof ag_derivs / sizeof ag_derivs[0] == KE_OP_COUNT, "one derivative slot per op");
