/*
 * cuda_vmath_ref.c — the vmath functions on the CPU as references for the
 * CUDA kernels, built twice by tests/meson.build: with -ffp-contract=off
 * (what NVRTC's -fmad=false computes: bitwise equality is the contract) and
 * with GCC's default -ffp-contract=fast (what the eager build computes).
 * KT_REF_NAME names the entry point of each copy.
 */
#include <stddef.h>

#include "cuda_vmath_list.h"
#include "vmath.h"

void KT_REF_NAME(int fn, const float *x, float *y, size_t n);

void KT_REF_NAME(int fn, const float *x, float *y, size_t n) {
    switch (fn) {
#define KT_REF_CASE_(id, name) \
    case id:                   \
        for (size_t i = 0; i < n; i++) y[i] = ke_v##name##f(x[i]); \
        break;
        KT_VMATH_LIST(KT_REF_CASE_)
#undef KT_REF_CASE_
    default: break;
    }
}
