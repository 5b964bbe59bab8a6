/*
 * cuda_vmath_list.h — the vmath f32 functions the CUDA tests compile for the
 * GPU and compare bit for bit with the CPU: X(index, name of ke_v<name>f).
 * One list for the CPU references (cuda_vmath_ref.c) and the kernel source
 * (test_cuda_nvrtc.c).
 */
#ifndef KT_CUDA_VMATH_LIST_H
#define KT_CUDA_VMATH_LIST_H
#define KT_VMATH_LIST(X) \
    X(0, exp)            \
    X(1, exp2)           \
    X(2, expm1)          \
    X(3, log)            \
    X(4, log2)           \
    X(5, log1p)          \
    X(6, tanh)           \
    X(7, sigmoid)        \
    X(8, silu)           \
    X(9, gelu_tanh)      \
    X(10, erf)           \
    X(11, gelu_erf)      \
    X(12, softplus)      \
    X(13, rsqrt)         \
    X(14, sin)           \
    X(15, cos)           \
    X(16, tan)
#define KT_VMATH_COUNT 17

/* The list above and the other one-argument f32 functions (issue 12's): what
 * the CPU references are built for (test_vmath_ref.c holds eager and compiled
 * kernels to them). The GPU kernel keeps the list above. */
#define KT_VMATH_LIST_CPU(X) \
    KT_VMATH_LIST(X)         \
    X(17, sinh)              \
    X(18, cosh)              \
    X(19, asin)              \
    X(20, acos)              \
    X(21, atan)              \
    X(22, asinh)             \
    X(23, acosh)             \
    X(24, atanh)             \
    X(25, log10)             \
    X(26, logit)             \
    X(27, mish)
#define KT_VMATH_COUNT_CPU 28

/* The two-argument f32 functions, ke_v<name>f(a, b) as the eager op
 * <name>(a, b) computes it with tensor operands (pow: the general path, not
 * the scalar-exponent shortcuts; atan2(a, b) is atan2f(y = a, x = b)). */
#define KT_VMATH_LIST2(X) \
    X(0, pow)             \
    X(1, atan2)           \
    X(2, hypot)
#define KT_VMATH_COUNT2 3
#endif
