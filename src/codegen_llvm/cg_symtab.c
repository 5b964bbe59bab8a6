/*
 * cg_symtab.c — the C name of each op's impl table (the impl column of
 * optable.def's rows), so the LLVM backend finds the same table in the eager
 * bitcode that the host's ke_ops[op].impl points at.
 */
#include "cg.h"

static const char *const impl_names[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    [KE_OP_##name_] = KE_IMPL_NAME(impl_),
#include "optable.def"
#undef KE_OP
};

const char *cg_impl_symbol(int op) {
    if (op < 0 || op >= KE_OP_COUNT) return NULL;
    return impl_names[op];
}
