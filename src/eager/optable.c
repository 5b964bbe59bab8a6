/*
 * optable.c — expands optable.def into the op table (ke_ops): the eager
 * columns of every row. The derivative columns are the autograd layer's
 * (derivatives.c), the wrapper column wrappers.c's.
 */
#include "optable.h"

#include <math.h>

const ke_op_info ke_ops[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
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

/* The attribute descriptors: one array per row with an attribute list, then
 * the table (AS(other) rows point at other's array). */
#define KE_A KE_ATTR_TUPLE
#define KE_ATTR_DESC_EACH(p, name, type, slot, def) KE_ATTR_DESC(name, type, slot, def)
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_PP_CAT(KE_ATTRCOL_ARRAY_, KE_ATTRCOL_KIND(__VA_ARGS__))(name_, __VA_ARGS__)
#define KE_ATTRCOL_ARRAY_NONE(op, ...)
#define KE_ATTRCOL_ARRAY_AS(op, ...)
#define KE_ATTRCOL_ARRAY_LIST(op, ...) \
    static const ke_attr_desc ke_attrs_of_##op[] = {KE_ATTR_EACH(KE_ATTR_DESC_EACH, ~ __VA_ARGS__)};
#include "optable.def"
#undef KE_OP
#define KE_ATTRS_SET(op) {ke_attrs_of_##op, (int)(sizeof ke_attrs_of_##op / sizeof ke_attrs_of_##op[0])}
#define KE_ATTRS_SET_OF(op) KE_ATTRS_SET(op) /* expands op first */
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_PP_CAT(KE_ATTRCOL_SET_, KE_ATTRCOL_KIND(__VA_ARGS__))(name_, __VA_ARGS__)
#define KE_ATTRCOL_SET_NONE(op, ...)
#define KE_ATTRCOL_SET_AS(op, ...) [KE_OP_##op] = KE_ATTRS_SET_OF(KE_ATTRCOL_OTHER(__VA_ARGS__)),
#define KE_ATTRCOL_SET_LIST(op, ...) [KE_OP_##op] = KE_ATTRS_SET(op),
const ke_attr_set ke_op_attrs[KE_OP_COUNT] = {
#include "optable.def"
};
#undef KE_OP
#undef KE_A
#undef KE_ATTR_DESC_EACH
#undef KE_ATTRCOL_ARRAY_NONE
#undef KE_ATTRCOL_ARRAY_AS
#undef KE_ATTRCOL_ARRAY_LIST
#undef KE_ATTRCOL_SET_NONE
#undef KE_ATTRCOL_SET_AS
#undef KE_ATTRCOL_SET_LIST
#undef KE_ATTRS_SET
#undef KE_ATTRS_SET_OF

/* A generated _inplace function needs the dispatcher's in-place support. */
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    _Static_assert(!KE_FORM_IP_##wrap_ || ((flags_) & KE_F_INPLACE),                                          \
                   "row " #name_ ": form " #wrap_ " makes kl_" #name_ "_inplace but the row lacks KE_F_INPLACE");     \
    _Static_assert(!((flags_) & KE_F_KEEP_CPU) || (KE_KIND_##kind_ == KE_KIND_COMPOSITE && KE_COL_HAS(cpu_)),   \
                   "row " #name_ ": KE_F_KEEP_CPU needs a composite with a CPU kernel");
#include "optable.def"
#undef KE_OP
