/*
 * ew_binary.c — inner loops of the binary elementwise ops (rows in
 * ops_binary.def), one formula per op expanded per compute dtype, and their
 * public wrappers (tensor, in-place and C-scalar forms).
 */
#include "kernels_ew.h"

#include <math.h>

#define KE_ARITH(name, FEXPR, IOP)                                                    \
    KE_EW_BINARY(name##_f32, float, float, FEXPR)                                     \
    KE_EW_BINARY(name##_f64, double, double, FEXPR)                                   \
    KE_EW_BINARY(name##_i32, int32_t, int32_t, IOP(int32_t, uint32_t, x, y))          \
    KE_EW_BINARY(name##_i64, int64_t, int64_t, IOP(int64_t, uint64_t, x, y))          \
    KE_EW_BINARY(name##_u8, uint8_t, uint8_t, IOP(uint8_t, uint32_t, x, y))
#define KE_ARITH_IMPL(name, BOOLEXPR)                                                 \
    KE_EW_BINARY(name##_b8, uint8_t, uint8_t, BOOLEXPR)                               \
    const ke_ew_impl ke_ew_##name = {.loop = {[KL_F32] = name##_f32, [KL_F64] = name##_f64, \
                                              [KL_I32] = name##_i32, [KL_I64] = name##_i64, \
                                              [KL_U8] = name##_u8, [KL_BOOL] = name##_b8},  \
                                     .bcast_ok = 3};

KE_ARITH(add, x + y, KE_WRAP_ADD)
KE_ARITH_IMPL(add, x | y)
KE_ARITH(mul, x * y, KE_WRAP_MUL)
KE_ARITH_IMPL(mul, x & y)

kl_tensor *kl_add(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_add, a, b, 0); }
kl_tensor *kl_add_inplace(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_add, a, b, 1); }
kl_tensor *kl_add_scalar(kl_tensor *a, double s) { return ke_binary_scalar(KE_OP_add, a, s, 0); }
kl_tensor *kl_add_scalar_inplace(kl_tensor *a, double s) { return ke_binary_scalar(KE_OP_add, a, s, 1); }
kl_tensor *kl_mul(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_mul, a, b, 0); }
kl_tensor *kl_mul_inplace(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_mul, a, b, 1); }
kl_tensor *kl_mul_scalar(kl_tensor *a, double s) { return ke_binary_scalar(KE_OP_mul, a, s, 0); }
kl_tensor *kl_mul_scalar_inplace(kl_tensor *a, double s) { return ke_binary_scalar(KE_OP_mul, a, s, 1); }
