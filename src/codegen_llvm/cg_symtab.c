/*
 * cg_symtab.c — the C name of each op's impl table (optable.def's last
 * column), so the LLVM backend finds the same table in the eager bitcode
 * that the host's ke_ops[op].impl points at.
 */
#include "cg.h"

static const char *const impl_names[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_) \
    [KE_OP_##name_] = #impl_,
#include "optable.def"
#undef KE_OP
};

const char *cg_impl_symbol(int op) {
    if (op < 0 || op >= KE_OP_COUNT) return NULL;
    const char *s = impl_names[op];
    while (*s == '&' || *s == ' ' || *s == '(') s++;
    if (!strncmp(s, "NULL", 4) || !*s) return NULL;
    return s;
}
