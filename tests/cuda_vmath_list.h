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
#endif
