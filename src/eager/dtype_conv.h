/* dtype_conv.h — conversions between dtypes, element by element: f16/bf16
 * <-> f32 and the casting rules of ke_convert (dtype.c), written once for
 * the CPU and for CUDA device code (src/codegen_nvrtc serves this header to
 * NVRTC and its generated kernels cast with the same macros). Plain C that
 * C++ accepts; needs <stdint.h> and <string.h> (memcpy) only. */
#ifndef KE_DTYPE_CONV_H
#define KE_DTYPE_CONV_H

#include <stdint.h>
#include <string.h>

/* f16/bf16 <-> f32 conversion (round to nearest even, NaN preserved). */
/* Exact: the 15 magnitude bits shifted into f32 position and scaled by
 * 2^112 rebias the exponent (subnormal halves become normal floats); inf/NaN
 * keep an all-ones exponent. Inline and branch-light, as f16 loops call it
 * per element. */
static inline float ke_f16_to_f32(uint16_t h) {
    uint32_t em = h & 0x7fffu, u = em << 13;
    float f;
    memcpy(&f, &u, 4);
    f *= 0x1p112f;
    memcpy(&u, &f, 4);
    if (em >= 0x7c00u) u = (em << 13) | 0x7f800000u;
    u |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, 4);
    return f;
}
static inline float ke_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t ke_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline uint16_t ke_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
    if (abs < 0x38800000u) { /* result is subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;
        uint32_t e = abs >> 23, m = (abs & 0x7fffff) | 0x800000;
        /* value = m * 2^(e-150) and the half subnormal unit is 2^-24 */
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = abs - 0x38000000u; /* rebias 127 -> 15 */
    uint32_t q = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

/* A float as an integer element: NaN -> 0, out of range -> INT64_MIN (what
 * x86's conversion gives, without C's undefined behaviour); then wrapped to
 * the narrower integer types through uint64. */
static inline int64_t ke_f2i(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18 || v < -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

/* The casting rules, per element: KE_CV_LOAD_<S>(raw) is the value of a
 * stored element of dtype S (f16/bf16 as float, bool as 0/1), and
 * KE_CV_STORE_<D>(v, isf) the element of dtype D that stores value v (isf:
 * v came from a floating dtype, so integers take ke_f2i). */
#define KE_CV_LOAD_F32(r) (r)
#define KE_CV_LOAD_F64(r) (r)
#define KE_CV_LOAD_F16(r) ke_f16_to_f32(r)
#define KE_CV_LOAD_BF16(r) ke_bf16_to_f32(r)
#define KE_CV_LOAD_I32(r) (r)
#define KE_CV_LOAD_I64(r) (r)
#define KE_CV_LOAD_U8(r) (r)
#define KE_CV_LOAD_BOOL(r) ((r) != 0)

#define KE_CV_STORE_F32(v, isf) ((float)(v))
#define KE_CV_STORE_F64(v, isf) ((double)(v))
#define KE_CV_STORE_F16(v, isf) ke_f32_to_f16((float)(v))
#define KE_CV_STORE_BF16(v, isf) ke_f32_to_bf16((float)(v))
#define KE_CV_STORE_I32(v, isf) ((int32_t)(uint32_t)(uint64_t)((isf) ? ke_f2i((double)(v)) : (int64_t)(v)))
#define KE_CV_STORE_I64(v, isf) ((int64_t)((isf) ? ke_f2i((double)(v)) : (int64_t)(v)))
#define KE_CV_STORE_U8(v, isf) ((uint8_t)(uint64_t)((isf) ? ke_f2i((double)(v)) : (int64_t)(v)))
#define KE_CV_STORE_BOOL(v, isf) ((uint8_t)((v) != 0))

#endif /* KE_DTYPE_CONV_H */
