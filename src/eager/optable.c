/*
 * optable.c — expands optable.def into the op table (ke_ops). The family
 * headers declare what the rows name.
 */
#include "dispatch.h"
#include "kernels_core.h"
#include "kernels_ew.h"
#include "kernels_index.h"
#include "kernels_nn.h"
#include "kernels_reduce.h"

const ke_op_info ke_ops[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_)               \
    [KE_OP_##name_] = {.name = #name_,                                                                        \
                       .kind = KE_KIND_##kind_,                                                               \
                       .nin = nin_,                                                                           \
                       .nout = nout_,                                                                         \
                       .flags = flags_,                                                                       \
                       .dtype_rule = KE_DT_##dt_,                                                             \
                       .accept = KE_ACC_##acc_,                                                               \
                       .infer = infer_,                                                                       \
                       .cpu = cpu_,                                                                           \
                       .view = view_,                                                                         \
                       .decomp = decomp_,                                                                     \
                       .impl = impl_},
#include "optable.def"
#undef KE_OP
};
_Static_assert(sizeof ke_ops / sizeof ke_ops[0] == KE_OP_COUNT, "op table length");
