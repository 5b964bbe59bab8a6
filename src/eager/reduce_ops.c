/*
 * reduce_ops.c — the reductions of ops_reduce.def as formulas for the
 * engine in reduce.c (sum, mean, prod, amax/amin, max_dim/min_dim,
 * argmax/argmin, var/std, logsumexp, norm, all/any), their shape and dtype
 * rule (PyTorch 1.13's result dtypes and empty-reduction errors) and the
 * public wrappers.
 *
 * Each op's formulas are written once as macros and expanded per loop dtype
 * by the templates tmpl/rd_value_op.h (one accumulator value, folded by
 * tmpl/row_fold.h, the row fold everything shares: row_fold.h) or
 * tmpl/rd_index_op.h (best value and its position) into a ke_rd_kernel. Float sums accumulate in their own type
 * (f16/bf16 are read as f32), var/std in double as PyTorch's CPU kernels,
 * integer sums and products in uint64_t (wrapping, returned as int64).
 */
#include "kernels_reduce.h"
#include "rd_formulas.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

/* ---- kernels -------------------------------------------------------------------
 * Each reduction's formulas expanded per loop dtype by the templates
 * tmpl/rd_value_op.h (one accumulator value; its row fold is tmpl/row_fold.h)
 * and tmpl/rd_index_op.h (best value and position); tmpl/rd_types.h lists the
 * loop dtypes of each kind. */
#define RK_CAT_(a, b) a##b
#define RK_CAT(a, b) RK_CAT_(a, b)
#define RK_CAT3_(a, b, c) a##b##c
#define RK_CAT3(a, b, c) RK_CAT3_(a, b, c)

#define RK_OP SUM
#define RK_KIND RK_KIND_SUM
#include "tmpl/rd_types.h"
#define RK_OP PROD
#define RK_KIND RK_KIND_SUM
#include "tmpl/rd_types.h"
#define RK_OP MEAN
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP MEAN /* var's first pass */
#define RK_KIND RK_KIND_MEAN_F32D
#include "tmpl/rd_types.h"
#define RK_OP AMAX
#define RK_KIND RK_KIND_SAME
#include "tmpl/rd_types.h"
#define RK_OP AMIN
#define RK_KIND RK_KIND_SAME
#include "tmpl/rd_types.h"
#define RK_OP ALL
#define RK_KIND RK_KIND_BOOL
#include "tmpl/rd_types.h"
#define RK_OP ANY
#define RK_KIND RK_KIND_BOOL
#include "tmpl/rd_types.h"
#define RK_OP VAR
#define RK_KIND RK_KIND_DOUBLE
#include "tmpl/rd_types.h"
#define RK_OP STD
#define RK_KIND RK_KIND_DOUBLE
#include "tmpl/rd_types.h"
#define RK_OP LSE
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRM2
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRM1
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRMI
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRMNI
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRM0
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP NRMP
#define RK_KIND RK_KIND_FLOAT
#include "tmpl/rd_types.h"
#define RK_OP ARGMAX
#define RK_KIND RK_KIND_INDEX
#include "tmpl/rd_types.h"
#define RK_OP ARGMIN
#define RK_KIND RK_KIND_INDEX
#include "tmpl/rd_types.h"

#define RK_ALL5(OP) \
    {[KL_F32] = &OP##_k_f32, [KL_F64] = &OP##_k_f64, [KL_I32] = &OP##_k_i32, [KL_I64] = &OP##_k_i64, [KL_U8] = &OP##_k_u8}
#define RK_FLOAT2(OP) {[KL_F32] = &OP##_k_f32, [KL_F64] = &OP##_k_f64}

const ke_rd_op ke_rd_sum = {.k = RK_ALL5(SUM), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_prod = {.k = RK_ALL5(PROD), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_mean = {.k = RK_FLOAT2(MEAN), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_amax = {.k = RK_ALL5(AMAX), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_amin = {.k = RK_ALL5(AMIN), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_all = {.k = RK_ALL5(ALL), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_any = {.k = RK_ALL5(ANY), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_max_dim = {.k = RK_ALL5(ARGMAX), .ordered = 1, .vout = 0, .iout = 1};
const ke_rd_op ke_rd_min_dim = {.k = RK_ALL5(ARGMIN), .ordered = 1, .vout = 0, .iout = 1};
const ke_rd_op ke_rd_argmax = {.k = RK_ALL5(ARGMAX), .ordered = 1, .vout = -1, .iout = 0};
const ke_rd_op ke_rd_argmin = {.k = RK_ALL5(ARGMIN), .ordered = 1, .vout = -1, .iout = 0};
static const ke_rd_op rk_var_mean = {.k = {[KL_F32] = &MEAN_k_f32d, [KL_F64] = &MEAN_k_f64}, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_var = {.k = RK_FLOAT2(VAR), .pre = &rk_var_mean, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_std = {.k = RK_FLOAT2(STD), .pre = &rk_var_mean, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_logsumexp = {
    .k = RK_FLOAT2(LSE), .pre = &ke_rd_amax, .pre_inf_to_zero = 1, .vout = 0, .iout = -1};
static const ke_rd_op rk_norm2 = {.k = RK_FLOAT2(NRM2), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm1 = {.k = RK_FLOAT2(NRM1), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm_inf = {.k = RK_FLOAT2(NRMI), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm_ninf = {.k = RK_FLOAT2(NRMNI), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm0 = {.k = RK_FLOAT2(NRM0), .vout = 0, .iout = -1};
static const ke_rd_op rk_normp = {.k = RK_FLOAT2(NRMP), .vout = 0, .iout = -1};

const ke_rd_op *ke_rd_norm_op(double p) {
    if (p == 2) return &rk_norm2;
    if (p == 1) return &rk_norm1;
    if (p == 0) return &rk_norm0;
    if (p == INFINITY) return &rk_norm_inf;
    if (p == -INFINITY) return &rk_norm_ninf;
    return &rk_normp;
}

/* ---- shape and dtype rule ---------------------------------------------------------- */

/* The dtype the loops read: f16/bf16 as f32, bool as u8. */
static kl_dtype rk_loop_dtype(kl_dtype d) { return d == KL_BOOL ? KL_U8 : ke_compute_dtype(d); }

int ke_infer_rd(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    kl_dtype xd = (kl_dtype)x->dtype, od = xd;
    int op = c->op, float_only = 0, no_identity = 0;
    char b[256];
    switch (op) {
    case KE_OP_sum:
    case KE_OP_prod: od = ke_is_float(xd) ? xd : KL_I64; break;
    case KE_OP_mean:
    case KE_OP_var:
    case KE_OP_std:
    case KE_OP_norm:
        if (!ke_is_float(xd))
            return ke_err(KL_ERR_DTYPE, ke_opname(c), "expects a floating-point input, got %s",
                          ke_fmt_tensor(b, sizeof b, x));
        float_only = 1;
        no_identity = op == KE_OP_norm && (ke_attr_norm_p(&c->a) < 0 || ke_attr_norm_p(&c->a) == INFINITY);
        break;
    case KE_OP_logsumexp: /* integers promote, as torch.logsumexp does */
        od = ke_is_float(xd) ? xd : kl_get_default_dtype();
        float_only = 1;
        break;
    case KE_OP_argmax:
    case KE_OP_argmin:
        if (xd == KL_BOOL)
            return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for bool input %s", ke_fmt_tensor(b, sizeof b, x));
        od = KL_I64;
        no_identity = 1;
        break;
    case KE_OP_all:
    case KE_OP_any: od = xd == KL_U8 ? KL_U8 : KL_BOOL; break; /* uint8 stays uint8, as in PyTorch */
    default: no_identity = 1; break;                          /* amax, amin, max_dim, min_dim */
    }
    if (ke_infer_reduce(c, out) < 0) return -1;
    out->dtype = od;
    c->compute = float_only ? ke_compute_dtype(od) : rk_loop_dtype(xd);
    if (no_identity) {
        /* max, min and the inf and negative norms have no value for an empty reduction */
        uint32_t mask;
        if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
        int64_t numel = ke_numel(x->ndim, x->shape);
        if (ke_attr_dims_len(&c->a) == 0 && numel == 0)
            return op == KE_OP_norm
                       ? ke_err(KL_ERR_SHAPE, ke_opname(c),
                                "cannot compute the %g norm of an empty tensor %s: the operation has no identity",
                                ke_attr_norm_p(&c->a), ke_fmt_tensor(b, sizeof b, x))
                       : ke_err(KL_ERR_SHAPE, ke_opname(c),
                                "expected a reduction dim to be specified for an input with 0 elements %s",
                                ke_fmt_tensor(b, sizeof b, x));
        for (int d = 0; d < x->ndim; d++)
            if ((mask >> d & 1) && x->shape[d] == 0)
                return op == KE_OP_norm
                           ? ke_err(KL_ERR_SHAPE, ke_opname(c),
                                    "cannot compute the %g norm over dim %d of %s, which is empty: the "
                                    "operation has no identity",
                                    ke_attr_norm_p(&c->a), d, ke_fmt_tensor(b, sizeof b, x))
                           : ke_err(KL_ERR_SHAPE, ke_opname(c),
                                    "expected reduction dim %d to have non-zero size, input %s", d,
                                    ke_fmt_tensor(b, sizeof b, x));
    }
    if (ke_ops[op].nout == 2) {
        out[1] = out[0];
        out[1].dtype = KL_I64;
    }
    return ke_ops[op].nout;
}

/* ---- public wrappers ------------------------------------------------------------------ */

/* param: var's and std's correction, norm's p; 0 for the others. The
 * reduction loops read it as the common reduce_param. */
_Static_assert(KE_ATTR_SAME_SLOT(var_correction, reduce_param) &&
                   KE_ATTR_SAME_SLOT(norm_p, reduce_param),
               "the reduction loops' scalar");
static kl_tensor *rk_reduce(int op, kl_tensor *x, int ndims, const int64_t *dims, bool keepdim, double param) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    if (ke_check_tensor(x, ke_ops[op].name, 1) || ke_set_list(&c, ndims, dims)) return NULL;
    ke_attr_set_keepdim(&c.a, keepdim);
    ke_attr_set_reduce_param(&c.a, param);
    return ke_call1(&c);
}

kl_tensor *kl_sum(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_sum, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_mean(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_mean, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_prod(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_prod, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_amax(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_amax, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_amin(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_amin, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_var(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return rk_reduce(KE_OP_var, x, ndims, dims, keepdim, correction);
}
kl_tensor *kl_std(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return rk_reduce(KE_OP_std, x, ndims, dims, keepdim, correction);
}
kl_tensor *kl_logsumexp(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_logsumexp, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_norm(kl_tensor *x, double p, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_norm, x, ndims, dims, keepdim, p);
}
kl_tensor *kl_all(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_all, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_any(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_any, x, ndims, dims, keepdim, 0);
}

kl_tensor *kl_argmax(kl_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return rk_reduce(KE_OP_argmax, x, dim == KL_DIM_NONE ? 0 : 1, &d, keepdim, 0);
}
kl_tensor *kl_argmin(kl_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return rk_reduce(KE_OP_argmin, x, dim == KL_DIM_NONE ? 0 : 1, &d, keepdim, 0);
}

static int rk_minmax_dim(int op, kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!values || !indices) return ke_err(KL_ERR_NULL_ARG, ke_ops[op].name, "values and indices must not be NULL");
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    int64_t d = dim;
    ke_set_list(&c, 1, &d);
    ke_attr_set_keepdim(&c.a, keepdim);
    if (ke_dispatch(&c)) return -1;
    *values = c.out[0];
    *indices = c.out[1];
    return 0;
}

int kl_max_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    return rk_minmax_dim(KE_OP_max_dim, x, dim, keepdim, values, indices);
}
int kl_min_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    return rk_minmax_dim(KE_OP_min_dim, x, dim, keepdim, values, indices);
}
