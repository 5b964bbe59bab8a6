/* kernels_ew.h — what the rows of ops_unary.def, ops_binary.def and
 * ops_ew_other.def name (ew_unary.c, ew_binary.c, ew_other.c), and the
 * macros those files share to expand one formula over dtype groups. */
#ifndef KE_KERNELS_EW_H
#define KE_KERNELS_EW_H
#include "ew.h"

/* ---- unary (ew_unary.c) ---- */
extern const ke_ew_impl ke_ew_neg, ke_ew_abs, ke_ew_sign, ke_ew_exp, ke_ew_exp2, ke_ew_expm1, ke_ew_log,
    ke_ew_log2, ke_ew_log1p, ke_ew_sqrt, ke_ew_rsqrt, ke_ew_square, ke_ew_reciprocal, ke_ew_sin, ke_ew_cos,
    ke_ew_tan, ke_ew_tanh, ke_ew_sigmoid, ke_ew_relu, ke_ew_gelu, ke_ew_gelu_tanh, ke_ew_silu, ke_ew_softplus,
    ke_ew_erf, ke_ew_floor, ke_ew_ceil, ke_ew_round, ke_ew_trunc, ke_ew_logical_not, ke_ew_isnan, ke_ew_isinf,
    ke_ew_isfinite, ke_ew_bitwise_not;
extern const ke_ew_impl ke_ew_sinh, ke_ew_cosh, ke_ew_asin, ke_ew_acos, ke_ew_atan, ke_ew_asinh, ke_ew_acosh,
    ke_ew_atanh, ke_ew_log10, ke_ew_logit, ke_ew_leaky_relu, ke_ew_elu, ke_ew_selu, ke_ew_celu, ke_ew_softsign,
    ke_ew_hardtanh, ke_ew_hardsigmoid, ke_ew_hardswish, ke_ew_mish;
int ke_infer_square(ke_call *c, ke_outspec *out);
int ke_infer_hardtanh(ke_call *c, ke_outspec *out);
int ke_infer_celu(ke_call *c, ke_outspec *out);

/* ---- binary (ew_binary.c) ---- */
extern const ke_ew_impl ke_ew_add, ke_ew_sub, ke_ew_mul, ke_ew_div, ke_ew_remainder, ke_ew_pow, ke_ew_maximum,
    ke_ew_minimum, ke_ew_atan2, ke_ew_eq, ke_ew_ne, ke_ew_lt, ke_ew_le, ke_ew_gt, ke_ew_ge, ke_ew_logical_and,
    ke_ew_logical_or, ke_ew_logical_xor, ke_ew_bitwise_and, ke_ew_bitwise_or, ke_ew_bitwise_xor;
extern const ke_ew_impl ke_ew_fmod, ke_ew_hypot, ke_ew_copysign, ke_ew_xlogy;
int ke_infer_pow(ke_call *c, ke_outspec *out);

/* ---- other (ew_other.c) ---- */
extern const ke_ew_impl ke_ew_where, ke_ew_clamp, ke_ew_lerp, ke_ew_lerp_scalar, ke_ew_masked_fill;
/* The shared same-shape / broadcast rules, then a check that the row's impl
 * has a loop for the compute dtype, so an unsupported dtype fails in the
 * shape rule (also on Meta tensors), not in the kernel. */
int ke_infer_ew_same(ke_call *c, ke_outspec *out);
int ke_infer_ew_bcast(ke_call *c, ke_outspec *out);
int ke_infer_where(ke_call *c, ke_outspec *out);
int ke_infer_clamp(ke_call *c, ke_outspec *out);
int ke_infer_lerp(ke_call *c, ke_outspec *out);
int ke_infer_masked_fill(ke_call *c, ke_outspec *out);
int ke_infer_tri(ke_call *c, ke_outspec *out);
int ke_cpu_tril(ke_call *c);
int ke_cpu_triu(ke_call *c);

/* ---- loop generators over dtype groups ------------------------------------
 * GEN is KE_EW_UNARY or KE_EW_BINARY (ew.h). A float formula FX(T) and an
 * integer formula IX(T, U) are function-like macros of the element type T
 * (and U, an unsigned type at least as wide, for arithmetic that must wrap).
 * Loops are named <name>_f32, _f64, _i32, _i64, _u8, _b8 (bool as uint8 0/1). */
#define KE_GEN_F(GEN, name, FX)                  \
    GEN(name##_f32, float, float, FX(float))     \
    GEN(name##_f64, double, double, FX(double))
#define KE_GEN_SI(GEN, name, IX)                                  \
    GEN(name##_i32, int32_t, int32_t, IX(int32_t, uint32_t))     \
    GEN(name##_i64, int64_t, int64_t, IX(int64_t, uint64_t))
#define KE_GEN_I(GEN, name, IX) \
    KE_GEN_SI(GEN, name, IX)    \
    GEN(name##_u8, uint8_t, uint8_t, IX(uint8_t, uint32_t))
/* Same, writing bool (uint8) results: comparisons and predicates. */
#define KE_GEN_ALL_B(GEN, name, X)                              \
    GEN(name##_f32, float, uint8_t, X(float, float))            \
    GEN(name##_f64, double, uint8_t, X(double, double))         \
    GEN(name##_i32, int32_t, uint8_t, X(int32_t, uint32_t))     \
    GEN(name##_i64, int64_t, uint8_t, X(int64_t, uint64_t))     \
    GEN(name##_u8, uint8_t, uint8_t, X(uint8_t, uint32_t))      \
    GEN(name##_b8, uint8_t, uint8_t, X(uint8_t, uint32_t))

/* Designated initializers of ke_ew_impl.loop for the loops above. */
#define KE_LOOPS_F(name) [KL_F32] = name##_f32, [KL_F64] = name##_f64
#define KE_LOOPS_SI(name) [KL_I32] = name##_i32, [KL_I64] = name##_i64
#define KE_LOOPS_I(name) KE_LOOPS_SI(name), [KL_U8] = name##_u8
#define KE_LOOPS_B(name) [KL_BOOL] = name##_b8
#define KE_LOOPS_ALL(name) KE_LOOPS_F(name), KE_LOOPS_I(name), KE_LOOPS_B(name)

/* A double attribute as an integer element: NaN -> 0, out of range wraps
 * through int64 (the rule of ke_convert, without C's undefined cases). */
static inline int64_t ke_ew_f2i(double v) {
    if (v != v || v >= 9.2233720368547758e18 || v < -9.2233720368547758e18) return v != v ? 0 : INT64_MIN;
    return (int64_t)v;
}

#endif
