/*
 * optable.c — expands optable.def into the op table (ke_ops): the eager
 * columns of every row. The derivative columns are the autograd layer's
 * (derivatives.c), the wrapper column wrappers.c's.
 */
#include "optable.h"

#include <math.h>

const ke_op_info ke_ops[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_)                                                                                       \
    [KE_OP_##name_] = {.name = #name_,                                                                        \
                       .kind = KE_KIND_##kind_,                                                               \
                       .nin = nin_,                                                                           \
                       .nout = nout_,                                                                         \
                       .flags = flags_,                                                                       \
                       .dtype_rule = KE_DT_##dt_,                                                             \
                       .accept = KE_ACC_##acc_,                                                               \
                       .infer = KE_COL_FN(infer_),                                                            \
                       .cpu = KE_COL_FN(cpu_),                                                                \
                       .view = KE_COL_FN(view_),                                                              \
                       .decomp = KE_COL_FN(decomp_),                                                          \
                       .impl = KE_IMPL_PTR(impl_)},
#include "optable.def"
#undef KE_OP
};
_Static_assert(sizeof ke_ops / sizeof ke_ops[0] == KE_OP_COUNT, "op table length");

/* The attribute descriptors: one array per op line, then the table. */
#define KE_A KE_ATTR_DESC
#define KE_ATTRS(op, attrs) static const ke_attr_desc ke_attrs_of_##op[] = {attrs};
#define KE_ATTRS_AS(op, other)
#define KE_ATTRS_COMMON(attrs)
#include "ops_attrs.def"
#undef KE_ATTRS
#undef KE_ATTRS_AS
#define KE_ATTRS_SET(op) {ke_attrs_of_##op, (int)(sizeof ke_attrs_of_##op / sizeof ke_attrs_of_##op[0])}
#define KE_ATTRS(op, attrs) [KE_OP_##op] = KE_ATTRS_SET(op),
#define KE_ATTRS_AS(op, other) [KE_OP_##op] = KE_ATTRS_SET(other),
const ke_attr_set ke_op_attrs[KE_OP_COUNT] = {
#include "ops_attrs.def"
};
#undef KE_A
#undef KE_ATTRS
#undef KE_ATTRS_AS
#undef KE_ATTRS_COMMON
#undef KE_ATTRS_SET

/* A generated _inplace function needs the dispatcher's in-place support. */
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_)                                                                                       \
    _Static_assert(!KE_FORM_IP_##wrap_ || ((flags_) & KE_F_INPLACE),                                          \
                   "row " #name_ ": form " #wrap_ " makes kl_" #name_ "_inplace but the row lacks KE_F_INPLACE");
#include "optable.def"
#undef KE_OP
