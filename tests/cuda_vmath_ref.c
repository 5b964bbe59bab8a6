/*
 * cuda_vmath_ref.c — the vmath functions compiled apart from the library as
 * references, built several times by tests/meson.build: with
 * -ffp-contract=off (what the library and NVRTC's -fmad=false compute:
 * bitwise equality with it is the contract for eager, compiled and CUDA
 * kernels) and with -ffp-contract=fast (GCC's GNU default), each for the
 * library's instruction set and, on x86, with FMA (-mfma).
 * KT_REF_NAME names the entry points of each copy.
 */
#include <stddef.h>

#include "cuda_vmath_list.h"
#include "vmath.h"

#define KT_CAT_(a, b) a##b
#define KT_CAT(a, b) KT_CAT_(a, b)

void KT_REF_NAME(int fn, const float *x, float *y, size_t n);
void KT_CAT(KT_REF_NAME, _lerp)(const float *a, const float *b, const float *w, float *y, size_t n);
void KT_CAT(KT_REF_NAME, _2)(int fn, const float *a, const float *b, float *y, size_t n);

/* A formula outside vmath with multiply-adds that a contracting build would
 * fuse: PyTorch's lerp, as the eager f32 loop computes it (ew_other.c). */
void KT_CAT(KT_REF_NAME, _lerp)(const float *a, const float *b, const float *w, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = w[i] < 0.5f ? a[i] + w[i] * (b[i] - a[i]) : b[i] - (b[i] - a[i]) * (1.0f - w[i]);
}

void KT_REF_NAME(int fn, const float *x, float *y, size_t n) {
    switch (fn) {
#define KT_REF_CASE_(id, name) \
    case id:                   \
        for (size_t i = 0; i < n; i++) y[i] = ke_v##name##f(x[i]); \
        break;
        KT_VMATH_LIST_CPU(KT_REF_CASE_)
#undef KT_REF_CASE_
    default: break;
    }
}

/* The two-argument functions (KT_VMATH_LIST2). */
void KT_CAT(KT_REF_NAME, _2)(int fn, const float *a, const float *b, float *y, size_t n) {
    switch (fn) {
#define KT_REF_CASE2_(id, name) \
    case id:                    \
        for (size_t i = 0; i < n; i++) y[i] = ke_v##name##f(a[i], b[i]); \
        break;
        KT_VMATH_LIST2(KT_REF_CASE2_)
#undef KT_REF_CASE2_
    default: break;
    }
}
