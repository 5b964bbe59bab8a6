/*
 * ew_unary.c — inner loops of the unary elementwise ops (rows in
 * ops_unary.def), one formula per op expanded per compute dtype, and their
 * public wrappers. Float math uses vmath.h's vectorizable polynomials for
 * f32 and libm for f64.
 */
#include "kernels_ew.h"
#include "vmath.h"

#include <math.h>

/* neg: wraps for integers like PyTorch */
KE_EW_UNARY(neg_f32, float, float, -x)
KE_EW_UNARY(neg_f64, double, double, -x)
KE_EW_UNARY(neg_i32, int32_t, int32_t, (int32_t)(0u - (uint32_t)x))
KE_EW_UNARY(neg_i64, int64_t, int64_t, (int64_t)(0ull - (uint64_t)x))
KE_EW_UNARY(neg_u8, uint8_t, uint8_t, (uint8_t)(0u - x))
const ke_ew_impl ke_ew_neg = {.loop = {[KL_F32] = neg_f32, [KL_F64] = neg_f64, [KL_I32] = neg_i32,
                                       [KL_I64] = neg_i64, [KL_U8] = neg_u8}};

KE_EW_UNARY(exp_f32, float, float, ke_vexpf(x))
KE_EW_UNARY(exp_f64, double, double, exp(x))
const ke_ew_impl ke_ew_exp = {.loop = {[KL_F32] = exp_f32, [KL_F64] = exp_f64}};

kl_tensor *kl_neg(kl_tensor *x) { return ke_unary(KE_OP_neg, x, 0); }
kl_tensor *kl_neg_inplace(kl_tensor *x) { return ke_unary(KE_OP_neg, x, 1); }
kl_tensor *kl_exp(kl_tensor *x) { return ke_unary(KE_OP_exp, x, 0); }
kl_tensor *kl_exp_inplace(kl_tensor *x) { return ke_unary(KE_OP_exp, x, 1); }
