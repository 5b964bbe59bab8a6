/*
 * ew_binary.c — inner loops of the binary elementwise ops (rows in
 * ops_binary.def), one formula per op expanded per compute dtype. The public
 * tensor, in-place and C-scalar forms come from the rows (wrappers.c); the
 * scalar-first forms rsub/rdiv are written here.
 *
 * Every loop takes the (contiguous, contiguous), (contiguous, scalar),
 * (scalar, contiguous) forms of KE_EW_BINARY (bcast_ok = 3): a C scalar
 * reaches the loop as one element, never as an expanded buffer.
 */
#include "kernels_ew.h"
#include "vmath.h"

#include <math.h>

#define KE_BINARY_IMPL(name, ...) \
    KE_EW_IMPL(name, .loop = {__VA_ARGS__}, .bcast_ok = 3)
#define KE_BINARY_IMPL_B(name, ...) \
    KE_EW_IMPL(name, .loop = {__VA_ARGS__}, .bcast_ok = 3, .out_bool = 1)

/* ---- arithmetic ----------------------------------------------------------------- */

/* Integer add/sub/mul wrap (unsigned arithmetic, no UB); bool add is or,
 * bool mul is and, as in PyTorch. */
#define ADD_F(T) (x + y)
#define ADD_I(T, U) KE_WRAP_ADD(T, U, x, y)
KE_GEN_F(KE_EW_BINARY, add, ADD_F)
KE_GEN_I(KE_EW_BINARY, add, ADD_I)
KE_EW_BINARY(add_b8, uint8_t, uint8_t, x | y)
KE_BINARY_IMPL(add, KE_LOOPS_ALL(add))

#define SUB_F(T) (x - y)
#define SUB_I(T, U) KE_WRAP_SUB(T, U, x, y)
KE_GEN_F(KE_EW_BINARY, sub, SUB_F)
KE_GEN_I(KE_EW_BINARY, sub, SUB_I)
KE_BINARY_IMPL(sub, KE_LOOPS_F(sub), KE_LOOPS_I(sub))

#define MUL_F(T) (x * y)
#define MUL_I(T, U) KE_WRAP_MUL(T, U, x, y)
KE_GEN_F(KE_EW_BINARY, mul, MUL_F)
KE_GEN_I(KE_EW_BINARY, mul, MUL_I)
KE_EW_BINARY(mul_b8, uint8_t, uint8_t, x & y)
KE_BINARY_IMPL(mul, KE_LOOPS_ALL(mul))

/* true division: the FLOAT rule sends integers here as floats */
#define DIV_F(T) (x / y)
KE_GEN_F(KE_EW_BINARY, div, DIV_F)
KE_BINARY_IMPL(div, KE_LOOPS_F(div))

/* ---- remainder: Python's sign convention (the result takes the divisor's sign) -- */

static inline float rem_float(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline double rem_double(double a, double b) {
    double m = fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
KE_EW_BINARY(remainder_f32, float, float, rem_float(x, y))
KE_EW_BINARY(remainder_f64, double, double, rem_double(x, y))

/* Integer % 0 raises; INT_MIN % -1 overflows in C, and is 0. */
#define KE_DEF_IREM(T)                                             \
    static inline T irem_##T(T a, T b, int *err) {                 \
        if (b == 0) {                                              \
            *err = KE_EW_INT_DIV_ZERO;                             \
            return 0;                                              \
        }                                                          \
        if (b == -1) return 0;                                     \
        T r = (T)(a % b);                                          \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r; \
    }
KE_DEF_IREM(int32_t)
KE_DEF_IREM(int64_t)
static inline uint8_t irem_uint8_t(uint8_t a, uint8_t b, int *err) {
    if (b == 0) {
        *err = KE_EW_INT_DIV_ZERO;
        return 0;
    }
    return (uint8_t)(a % b);
}
#define REM_I(T, U) irem_##T(x, y, err)
KE_GEN_I(KE_EW_BINARY, remainder, REM_I)
KE_BINARY_IMPL(remainder, KE_LOOPS_F(remainder), KE_LOOPS_I(remainder))

/* ---- pow ------------------------------------------------------------------------- */

/* Integer powers by squaring, wrapping. A negative exponent gives what
 * PyTorch's tensor ** tensor gives (1 for base 1, +-1 for base -1, else 0);
 * a negative C-scalar exponent is refused earlier, in ke_infer_pow. */
#define KE_DEF_IPOW(T, U)                                                    \
    static inline T ipow_##T(T a, T b) {                                     \
        if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;     \
        U r = 1, base = (U)a;                                                \
        for (uint64_t e = (uint64_t)b; e; e >>= 1) {                         \
            if (e & 1) r *= base;                                            \
            base *= base;                                                    \
        }                                                                    \
        return (T)r;                                                         \
    }
KE_DEF_IPOW(int32_t, uint32_t)
KE_DEF_IPOW(int64_t, uint64_t)
static inline uint8_t ipow_uint8_t(uint8_t a, uint8_t b) {
    uint32_t r = 1, base = a;
    for (unsigned e = b; e; e >>= 1) {
        if (e & 1) r *= base;
        base *= base;
    }
    return (uint8_t)r;
}
#define POW_I(T, U) ipow_##T(x, y)
KE_GEN_I(KE_EW_BINARY, pow, POW_I)

/* Float pow: vmath's ke_vpowf for f32 (the same bits on every device; f64
 * keeps libm). A one-element exponent takes the shortcuts of PyTorch's
 * pow(Tensor, Scalar) (x*x for 2, sqrt for 0.5, ...), which are faster and
 * give its results at the edges (sqrt(-inf) is NaN, pow's +inf). */
KE_EW_BINARY(pow_any_f32, float, float, ke_vpowf(x, y))
KE_EW_BINARY(pow_any_f64, double, double, pow(x, y))
/* The shortcuts: (exponent, formula of x) pairs, written once for the CPU
 * loop (one branch per exponent, outside the loop) and the device function
 * (a select chain per element). */
#define KE_POW_SHORTCUTS(X, T, SQRT)      \
    X(2, x * x)                           \
    X(0.5, SQRT(x))                       \
    X(3, x * x * x)                       \
    X(-0.5, (T)1 / SQRT(x))               \
    X(-1, (T)1 / x)                       \
    X(-2, (T)1 / (x * x))
#ifdef KE_DEVICE
#define KE_POW_SEL_(e, f) y == (e) ? (f) :
#define KE_POW_FLOAT(fname, T, SQRT) \
    KE_EW_BINARY(fname, T, T, bc != 2 ? fname##_gen(x, y, bc, a, err) : (KE_POW_SHORTCUTS(KE_POW_SEL_, T, SQRT) fname##_gen(x, y, bc, a, err)))
#else
#define KE_POW_CASE_(e, f)                        \
    else if (y == (e)) {                          \
        for (int64_t i = 0; i < n; i++) {         \
            __typeof__(X[0]) x = X[i];            \
            o[i] = (f);                           \
        }                                         \
    }
#define KE_POW_FLOAT(fname, T, SQRT)                                                                    \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,       \
                      int *err) {                                                                     \
        if (bc != 2) {                                                                                \
            fname##_gen(n, o_, in, bc, a, err);                                                       \
            return;                                                                                   \
        }                                                                                             \
        T *restrict o = (T *)o_;                                                                      \
        const T *restrict X = (const T *)in[0];                                                       \
        const T y = *(const T *)in[1];                                                                \
        if (0) {                                                                                      \
        }                                                                                             \
        KE_POW_SHORTCUTS(KE_POW_CASE_, T, SQRT)                                                       \
        else {                                                                                        \
            fname##_gen(n, o_, in, bc, a, err);                                                       \
        }                                                                                             \
    }                                                                                                 \
    KE_EW_NAME(fname)
#endif
#define pow_f32_gen pow_any_f32
#define pow_f64_gen pow_any_f64
KE_POW_FLOAT(pow_f32, float, sqrtf)
KE_POW_FLOAT(pow_f64, double, sqrt)
KE_BINARY_IMPL(pow, KE_LOOPS_F(pow), KE_LOOPS_I(pow))

/* ---- maximum, minimum, atan2 ------------------------------------------------------- */

/* NaN wins. On ties (-0.0 vs 0.0) the second operand, as PyTorch's
 * vectorized loops (max_ps) give; its scalar tail gives the first. */
#define MAX_X(T, U) ((x > y || x != x) ? x : y)
#define MIN_X(T, U) ((x < y || x != x) ? x : y)
#define MAX_F(T) MAX_X(T, T)
#define MIN_F(T) MIN_X(T, T)
KE_GEN_F(KE_EW_BINARY, maximum, MAX_F)
KE_GEN_I(KE_EW_BINARY, maximum, MAX_X)
KE_EW_BINARY(maximum_b8, uint8_t, uint8_t, x | y)
KE_BINARY_IMPL(maximum, KE_LOOPS_ALL(maximum))
KE_GEN_F(KE_EW_BINARY, minimum, MIN_F)
KE_GEN_I(KE_EW_BINARY, minimum, MIN_X)
KE_EW_BINARY(minimum_b8, uint8_t, uint8_t, x & y)
KE_BINARY_IMPL(minimum, KE_LOOPS_ALL(minimum))

KE_EW_BINARY(atan2_f32, float, float, ke_vatan2f(x, y))
KE_EW_BINARY(atan2_f64, double, double, atan2(x, y))
KE_BINARY_IMPL(atan2, KE_LOOPS_F(atan2))

/* ---- fmod, hypot, copysign, xlogy (issue 12) ------------------------------------------ */

/* C's fmod: truncated, the result takes the dividend's sign (exact in
 * floats). Integer % 0 raises as remainder does (PyTorch: ZeroDivisionError);
 * INT_MIN % -1 is 0. */
KE_EW_BINARY(fmod_f32, float, float, fmodf(x, y))
KE_EW_BINARY(fmod_f64, double, double, fmod(x, y))
#define KE_DEF_IFMOD(T)                                    \
    static inline T ifmod_##T(T a, T b, int *err) {        \
        if (b == 0) {                                      \
            *err = KE_EW_INT_DIV_ZERO;                     \
            return 0;                                      \
        }                                                  \
        return b == -1 ? 0 : (T)(a % b);                   \
    }
KE_DEF_IFMOD(int32_t)
KE_DEF_IFMOD(int64_t)
static inline uint8_t ifmod_uint8_t(uint8_t a, uint8_t b, int *err) {
    if (b == 0) {
        *err = KE_EW_INT_DIV_ZERO;
        return 0;
    }
    return (uint8_t)(a % b);
}
#define FMOD_I(T, U) ifmod_##T(x, y, err)
KE_GEN_I(KE_EW_BINARY, fmod, FMOD_I)
KE_BINARY_IMPL(fmod, KE_LOOPS_F(fmod), KE_LOOPS_I(fmod))

/* Float loops only: PyTorch has no integer hypot (promoted integer operands
 * fail in the shape rule's loop check). */
KE_EW_BINARY(hypot_f32, float, float, ke_vhypotf(x, y))
KE_EW_BINARY(hypot_f64, double, double, hypot(x, y))
KE_BINARY_IMPL(hypot, KE_LOOPS_F(hypot))

/* The sign bit of y, NaN's included (copysign(1, -NaN) = -1, as PyTorch). */
KE_EW_BINARY(copysign_f32, float, float, ke__asf((ke__asu(x) & 0x7fffffffu) | ke__signbit(y)))
KE_EW_BINARY(copysign_f64, double, double, copysign(x, y))
KE_BINARY_IMPL(copysign, KE_LOOPS_F(copysign))

/* x * log(y), +0 where x == 0 unless y is NaN (PyTorch's xlogy). */
KE_EW_BINARY(xlogy_f32, float, float, ke__self((x == 0.0f) & (y == y), 0.0f, x * ke_vlogf(y)))
KE_EW_BINARY(xlogy_f64, double, double, y != y ? y : x == 0 ? 0.0 : x * log(y))
KE_BINARY_IMPL(xlogy, KE_LOOPS_F(xlogy))

/* ---- comparisons and logical ops: bool out, operands in the promoted dtype ------- */

#define KE_COMPARE(name, X)                    \
    KE_GEN_ALL_B(KE_EW_BINARY, name, X)        \
    KE_BINARY_IMPL_B(name, KE_LOOPS_ALL(name))
#define EQ_X(T, U) (x == y)
#define NE_X(T, U) (x != y)
#define LT_X(T, U) (x < y)
#define LE_X(T, U) (x <= y)
#define GT_X(T, U) (x > y)
#define GE_X(T, U) (x >= y)
#define LAND_X(T, U) ((x != 0) & (y != 0))
#define LOR_X(T, U) ((x != 0) | (y != 0))
#define LXOR_X(T, U) ((x != 0) ^ (y != 0))
KE_COMPARE(eq, EQ_X)
KE_COMPARE(ne, NE_X)
KE_COMPARE(lt, LT_X)
KE_COMPARE(le, LE_X)
KE_COMPARE(gt, GT_X)
KE_COMPARE(ge, GE_X)
KE_COMPARE(logical_and, LAND_X)
KE_COMPARE(logical_or, LOR_X)
KE_COMPARE(logical_xor, LXOR_X)

/* ---- bitwise: integers and bool ----------------------------------------------------- */

#define KE_BITWISE(name, OP)                                   \
    KE_GEN_I(KE_EW_BINARY, name, OP)                           \
    KE_EW_BINARY(name##_b8, uint8_t, uint8_t, OP(uint8_t, unsigned)) \
    KE_BINARY_IMPL(name, KE_LOOPS_I(name), KE_LOOPS_B(name))
#define BAND_I(T, U) ((T)(x & y))
#define BOR_I(T, U) ((T)(x | y))
#define BXOR_I(T, U) ((T)(x ^ y))
KE_BITWISE(bitwise_and, BAND_I)
KE_BITWISE(bitwise_or, BOR_I)
KE_BITWISE(bitwise_xor, BXOR_I)

#ifndef KE_DEVICE /* the rest is host code (KE_DEVICE: kernels_ew_device.h) */

/* ---- shape rule of pow -------------------------------------------------------------- */

/* PyTorch refuses an integer tensor to a negative integer C-scalar power
 * (tensor exponents compute, see ipow). The wrapped scalar is host memory
 * on every device, so reading it here is safe even for Meta inputs. */
int ke_infer_pow(ke_call *c, ke_outspec *out) {
    if (ke_infer_ew_bcast(c, out) < 0) return -1;
    const kl_tensor *e = c->in[1];
    if (!ke_is_float(out->dtype) && (e->flags & KE_TF_WRAPPED) && e->dtype == KL_I64 &&
        *(const int64_t *)ke_data(e) < 0)
        return ke_err(KL_ERR_ARG, ke_opname(c), "integers to negative integer powers are not allowed (exponent %lld)",
                      (long long)*(const int64_t *)ke_data(e));
    return 1;
}

/* ---- public functions written by hand (the others come from the rows, wrappers.c) ---- */

/* s op a: the scalar as the first operand of sub / div (PyTorch's rsub and
 * reciprocal-style division); promotion is the same in either order. */
static kl_tensor *scalar_first(int op, kl_tensor *a, double s) {
    if (ke_check_tensor(a, ke_ops[op].name, 1)) return NULL;
    kl_tensor *w = ke_wrap_scalar(s);
    if (!w) return NULL;
    kl_tensor *r = ke_binary(op, w, a, 0);
    ke_tensor_decref(w);
    return r;
}
kl_tensor *kl_rsub_scalar(kl_tensor *a, double s) { return scalar_first(KE_OP_sub, a, s); }
kl_tensor *kl_rdiv_scalar(kl_tensor *a, double s) { return scalar_first(KE_OP_div, a, s); }

#endif /* !KE_DEVICE */
