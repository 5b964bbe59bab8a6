/* ew_gen.h — what the elementwise formulas of ew_unary.c, ew_binary.c and
 * ew_other.c use besides the loop shells, shared by the CPU build
 * (kernels_ew.h) and the CUDA device build (kernels_ew_device.h, which NVRTC
 * sees under the name kernels_ew.h): one definition of the math on both.
 * Plain C that C++ (NVRTC) also accepts. */
#ifndef KE_EW_GEN_H
#define KE_EW_GEN_H

#include "dtype_conv.h"

#include <stdint.h>

/* ---- loop generators over dtype groups ------------------------------------
 * GEN is KE_EW_UNARY or KE_EW_BINARY (ew.h on the CPU: a loop; the device
 * header: a per-element __device__ function). A float formula FX(T) and an
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

/* Designated initializers of ke_ew_impl.loop for the loops above (used only
 * inside KE_EW_IMPL, which the device build drops: C++ has no array
 * designators). */
#define KE_LOOPS_F(name) [KL_F32] = name##_f32, [KL_F64] = name##_f64
#define KE_LOOPS_SI(name) [KL_I32] = name##_i32, [KL_I64] = name##_i64
#define KE_LOOPS_I(name) KE_LOOPS_SI(name), [KL_U8] = name##_u8
#define KE_LOOPS_B(name) [KL_BOOL] = name##_b8
#define KE_LOOPS_ALL(name) KE_LOOPS_F(name), KE_LOOPS_I(name), KE_LOOPS_B(name)

/* Integer arithmetic that wraps like PyTorch's (and stays defined for UBSan). */
#define KE_WRAP_ADD(T, U, x, y) ((T)((U)(x) + (U)(y)))
#define KE_WRAP_SUB(T, U, x, y) ((T)((U)(x) - (U)(y)))
#define KE_WRAP_MUL(T, U, x, y) ((T)((U)(x) * (U)(y)))

/* A double attribute as an integer element: NaN -> 0, out of range wraps
 * through int64 (the rule of ke_convert: dtype_conv.h). */
#define ke_ew_f2i ke_f2i

#endif /* KE_EW_GEN_H */
