/*
 * optable.h — declarations of everything the op table's rows name: shape
 * rules, kernels, view rules, decompositions and per-dtype impls, generated
 * from optable.def so no hand-written list repeats the table. A definition
 * whose type differs from its column's (ke_infer_fn, ke_kernel_fn, ...) is a
 * compile error in the file that defines it.
 */
#ifndef KE_OPTABLE_H
#define KE_OPTABLE_H
#include "ew.h"

/* Function types of the table's columns (dispatch.h has the pointer types). */
typedef int ke_infer_sig(ke_call *c, ke_outspec *out);
typedef int ke_kernel_sig(ke_call *c);
struct ke_rd_op;

#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_COL_DECL(ke_infer_sig, infer_)                                                                       \
    KE_COL_DECL(ke_kernel_sig, cpu_)                                                                        \
    KE_COL_DECL(ke_kernel_sig, view_)                                                                       \
    KE_COL_DECL(ke_kernel_sig, decomp_)                                                                     \
    KE_IMPL_DECL(impl_)
#include "optable.def"
#undef KE_OP

#endif /* KE_OPTABLE_H */
