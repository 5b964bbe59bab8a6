/* kernels_ew_device.h — the CUDA device build of the elementwise formulas.
 * NVRTC is handed this file under the name "kernels_ew.h", so the
 * `#include "kernels_ew.h"` of ew_unary.c, ew_binary.c and ew_other.c lands
 * here when src/codegen_nvrtc compiles those very files into a kernel: one
 * definition of the math on CPU and GPU. KE_DEVICE hides the host-only code
 * of the files (shape rules, wrappers, tril/triu); the loop shells become
 * per-element __device__ functions named as the CPU loops, taking
 * the operands (their compute dtype; uint8 for bool operands), then the
 * broadcast bits, the attributes and the error word:
 *     float neg_f32(float x, unsigned bc, const ke_attrs *a, int *err);
 * The impl tables (KE_EW_IMPL) are dropped: the code generator finds a
 * loop's name on the host (ke_ew_loop_name_of). The program defines
 * KL_MAX_DIMS before including this (the generator writes the host's). */
#ifndef KE_KERNELS_EW_H
#define KE_KERNELS_EW_H
#define KE_DEVICE 1

#include <stdint.h>

typedef int kl_dtype; /* the enums the attribute getters return */
typedef int kl_reduction;
typedef int kl_device_type;

#include "attr_access.h"
#include "ew_gen.h"

/* err codes a formula may raise (ew.h) */
enum { KE_EW_OK, KE_EW_INT_DIV_ZERO };

/* One per-element function: PARAMS are the operands, PRE declarations
 * (attribute-derived constants the CPU loop hoists), EXPR the result. */
#define KE_EW_DEVICE_FN(fname, TO, PARAMS, PRE, EXPR)                                         \
    static __device__ __forceinline__ TO fname(KE_EW_UNPAREN_ PARAMS, unsigned bc, const ke_attrs *a, \
                                               int *err) {                                    \
        (void)bc, (void)a, (void)err;                                                         \
        PRE                                                                                   \
        return (TO)(EXPR);                                                                    \
    }
#define KE_EW_UNPAREN_(...) __VA_ARGS__
#define KE_EW_UNARY(fname, T, TO, EXPR) KE_EW_DEVICE_FN(fname, TO, (T x), , EXPR)
#define KE_EW_BINARY(fname, T, TO, EXPR) KE_EW_DEVICE_FN(fname, TO, (T x, T y), , EXPR)
#define KE_EW_TERNARY(fname, T, TO, EXPR) KE_EW_DEVICE_FN(fname, TO, (T x, T y, T z), , EXPR)
#define KE_EW_IMPL(name, ...)
#define KE_EW_NAME(fname)

#endif /* KE_KERNELS_EW_H */
