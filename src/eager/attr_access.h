/* attr_access.h — ke_attrs (attribute slots), the conventional slots, and
 * the named accessors ke_attr_<op>_<name>(a) generated from the attrs column
 * of the op table (attrs.h is the generator). Included by dispatch.h, and by
 * the CUDA device build of the elementwise formulas (kernels_ew_device.h),
 * so both read attributes through the same generated accessors. Needs
 * KL_MAX_DIMS, <stdint.h> and the kl_dtype / kl_reduction / kl_device_type
 * types (kiln.h on the host). */
#ifndef KE_ATTR_ACCESS_H
#define KE_ATTR_ACCESS_H

#define KE_MAX_LIST (2 * KL_MAX_DIMS)

/* Attributes: scalars f[], integers i[], one integer list. Which slot holds
 * which named attribute of an op is declared in its row's attrs column; read them
 * through the accessors generated below, never by index. */
typedef struct ke_attrs {
    double f[4];
    int64_t i[6];
    int32_t nlist;
    int64_t list[KE_MAX_LIST];
} ke_attrs;
/* Conventional slots shared by many ops (ke_attr_keepdim, ke_attr_dtype, ...). */
#define KE_ATTR_KEEPDIM 0   /* i[0] for reductions */
#define KE_ATTR_DTYPE 5     /* i[5] for creation ops and KE_DT_ATTR */
#define KE_ATTR_SEED 0      /* i[0] of random ops (KE_F_RANDOM) */
#define KE_ATTR_OFFSET 1    /* i[1] of random ops */
/* offset == KE_RANDOM_SLOT: seed names a compiled graph's per-call random slot (the
 * executor reserves fresh counters for it at each call), not a fixed reservation. */
#define KE_RANDOM_SLOT (-1)

#include "attrs.h"

/* ke_attr_<op>_<name>(a) / ke_attr_set_<op>_<name>(a, v) for every declared
 * attribute, and ke_attr_<name> for the common ones. */
#include "oprows.h"
#define KE_A KE_ATTR_TUPLE
#define KE_OP(name, kind, nin, nout, flags, dt, acc, infer, cpu, view, decomp, impl, wrap, save, deriv, ...) \
    KE_PP_CAT(KE_ATTRCOL_ACC_, KE_ATTRCOL_KIND(__VA_ARGS__))(name, __VA_ARGS__)
#define KE_ATTRCOL_ACC_NONE(op, ...)
#define KE_ATTRCOL_ACC_AS(op, ...) /* AS(other): other's accessors */
#define KE_ATTRCOL_ACC_LIST(op, ...) KE_ATTR_ACCESSORS(ke, op, __VA_ARGS__)
#define KE_ATTRS_COMMON(attrs) KE_ATTR_COMMON_ACCESSORS(ke, attrs)
#include "optable.def"
#undef KE_A
#undef KE_OP
#undef KE_ATTRCOL_ACC_NONE
#undef KE_ATTRCOL_ACC_AS
#undef KE_ATTRCOL_ACC_LIST
#undef KE_ATTRS_COMMON

#endif /* KE_ATTR_ACCESS_H */
