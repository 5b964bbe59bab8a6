/*
 * ew_unary.c — inner loops of the unary elementwise ops (rows in
 * ops_unary.def), one formula per op expanded per compute dtype (the public
 * functions come from the rows, wrappers.c). Float math uses vmath.h's
 * vectorizable polynomials for f32 (f16/bf16 compute in f32) and libm for f64.
 */

#include "kernels_ew.h"
#include "vmath.h"

#include <math.h>

/* A float-only op: the f32 formula and the f64 one. */
#define KE_UNARY_MATH(name, F32X, F64X)                 \
    KE_EW_UNARY(name##_f32, float, float, F32X)        \
    KE_EW_UNARY(name##_f64, double, double, F64X)      \
    KE_EW_IMPL(name, .loop = {KE_LOOPS_F(name)})

/* Integer and bool loops shared by the ops that are the identity there
 * (floor, ceil, round, trunc of integers; abs, relu of unsigned). */
#define ID_X(T, U) x
#define ID_F(T) x
KE_GEN_I(KE_EW_UNARY, ident, ID_X)
KE_EW_UNARY(ident_b8, uint8_t, uint8_t, x)
/* clone and to_dtype (ops_create.def): the engine does the casting */
KE_GEN_F(KE_EW_UNARY, ident, ID_F)
KE_EW_IMPL(identity, .loop = {KE_LOOPS_F(ident), KE_LOOPS_I(ident), [KL_BOOL] = ident_u8})

/* ---- sign-aware arithmetic ---------------------------------------------------- */

/* neg and abs wrap on the most negative integer, as PyTorch does. */
#define NEG_F(T) (-x)
#define NEG_I(T, U) ((T)((U)0 - (U)x))
KE_GEN_F(KE_EW_UNARY, neg, NEG_F)
KE_GEN_I(KE_EW_UNARY, neg, NEG_I)
KE_EW_IMPL(neg, .loop = {KE_LOOPS_F(neg), KE_LOOPS_I(neg)})

/* fabs, not a compare, so abs(-0.0) is +0.0 */
KE_EW_UNARY(abs_f32, float, float, fabsf(x))
KE_EW_UNARY(abs_f64, double, double, fabs(x))
#define ABS_I(T, U) (x < 0 ? (T)((U)0 - (U)x) : x)
KE_GEN_SI(KE_EW_UNARY, abs, ABS_I)
KE_EW_IMPL(abs, .loop = {KE_LOOPS_F(abs), KE_LOOPS_SI(abs), [KL_U8] = ident_u8})

/* sign(NaN) is 0 in PyTorch, which the comparisons give for free. */
#define SIGN_X(T) ((T)((x > 0) - (x < 0)))
#define SIGN_I(T, U) SIGN_X(T)
KE_GEN_F(KE_EW_UNARY, sign, SIGN_X)
KE_GEN_SI(KE_EW_UNARY, sign, SIGN_I)
KE_EW_UNARY(sign_u8, uint8_t, uint8_t, x != 0)
KE_EW_IMPL(sign, .loop = {KE_LOOPS_F(sign), KE_LOOPS_I(sign), [KL_BOOL] = ident_b8})

/* square of bool is int64 (ke_infer_square), so there is no bool loop */
#define SQUARE_F(T) (x * x)
#define SQUARE_I(T, U) KE_WRAP_MUL(T, U, x, x)
KE_GEN_F(KE_EW_UNARY, square, SQUARE_F)
KE_GEN_I(KE_EW_UNARY, square, SQUARE_I)
KE_EW_IMPL(square, .loop = {KE_LOOPS_F(square), KE_LOOPS_I(square)})

/* relu keeps -0.0 and NaN as PyTorch's clamp_min(x, 0) does */
#define RELU_X(T) (x < 0 ? (T)0 : x)
#define RELU_I(T, U) RELU_X(T)
KE_GEN_F(KE_EW_UNARY, relu, RELU_X)
KE_GEN_SI(KE_EW_UNARY, relu, RELU_I)
KE_EW_IMPL(relu, .loop = {KE_LOOPS_F(relu), KE_LOOPS_SI(relu), [KL_U8] = ident_u8})

/* ---- math functions ---------------------------------------------------------------- */

KE_UNARY_MATH(exp, ke_vexpf(x), exp(x))
KE_UNARY_MATH(exp2, ke_vexp2f(x), exp2(x))
KE_UNARY_MATH(expm1, ke_vexpm1f(x), expm1(x))
KE_UNARY_MATH(log, ke_vlogf(x), log(x))
KE_UNARY_MATH(log2, ke_vlog2f(x), log2(x))
KE_UNARY_MATH(log1p, ke_vlog1pf(x), log1p(x))
KE_UNARY_MATH(sqrt, sqrtf(x), sqrt(x))
KE_UNARY_MATH(rsqrt, ke_vrsqrtf(x), 1.0 / sqrt(x))
KE_UNARY_MATH(reciprocal, 1.0f / x, 1.0 / x)
/* vmath's trig reduction is exact only below ~8.4e8; beyond it (huge
 * values, as int64 extremes promoted to f32 are) a block falls back to
 * libm in double, whose reduction is exact everywhere. The check is a
 * vectorized OR over the block, so ordinary inputs keep the vector loop. */
#define KE_TRIG_BIG(x) (!(fabsf(x) <= 8.0e8f))
#ifdef KE_DEVICE
/* The device computes per element: a huge value takes libm in double. (So
 * does the LLVM backend, which runs the CPU loop one element at a time.) */
#define KE_TRIG_F32(name, VF, DF) KE_EW_UNARY(name##_f32, float, float, KE_TRIG_BIG(x) ? (float)DF((double)x) : VF(x))
#else
#define KE_TRIG_F32(name, VF, DF)                                                                \
    static void name##_f32(int64_t n, void *o_, const void *const *in, unsigned bc,                \
                           const ke_attrs *a, int *err) {                                          \
        float *restrict o = (float *)o_;                                                           \
        const float *restrict X = (const float *)in[0];                                            \
        (void)bc, (void)a, (void)err;                                                              \
        for (int64_t b = 0; b < n; b += 256) {                                                     \
            int64_t e = b + 256 < n ? b + 256 : n;                                                 \
            int big = 0;                                                                           \
            for (int64_t i = b; i < e; i++) big |= KE_TRIG_BIG(X[i]);                              \
            if (!big)                                                                              \
                for (int64_t i = b; i < e; i++) o[i] = VF(X[i]);                                   \
            else                                                                                   \
                for (int64_t i = b; i < e; i++) o[i] = (float)DF((double)X[i]);                    \
        }                                                                                          \
    }                                                                                              \
    KE_EW_NAME(name##_f32)
#endif
#define KE_TRIG_MATH(name, VF, DF)                                 \
    KE_TRIG_F32(name, VF, DF)                                      \
    KE_EW_UNARY(name##_f64, double, double, DF(x))                 \
    KE_EW_IMPL(name, .loop = {KE_LOOPS_F(name)})
KE_TRIG_MATH(sin, ke_vsinf, sin)
KE_TRIG_MATH(cos, ke_vcosf, cos)
KE_TRIG_MATH(tan, ke_vtanf, tan)
KE_UNARY_MATH(tanh, ke_vtanhf(x), tanh(x))
KE_UNARY_MATH(sigmoid, ke_vsigmoidf(x), 1.0 / (1.0 + exp(-x)))
KE_UNARY_MATH(erf, ke_verff(x), erf(x))
/* gelu is the exact erf form; gelu_tanh PyTorch's approximate='tanh'. Their
 * and silu's PyTorch formulas give NaN at -inf (-inf * 0); vmath gives the
 * limit 0, so the f32 loops select NaN there to match. */
#define NAN_AT_NEG_INF(x, v) ke__self((x) == -INFINITY, NAN, (v)) /* a select, so the loop vectorizes */
KE_UNARY_MATH(gelu, NAN_AT_NEG_INF(x, ke_vgelu_erff(x)), 0.5 * x * (1.0 + erf(x * M_SQRT1_2)))
KE_UNARY_MATH(gelu_tanh, NAN_AT_NEG_INF(x, ke_vgelu_tanhf(x)),
              0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))))
KE_UNARY_MATH(silu, NAN_AT_NEG_INF(x, ke_vsiluf(x)), x / (1.0 + exp(-x)))
/* beta 1, threshold 20: above it softplus(x) is x to working precision */
KE_UNARY_MATH(softplus, ke_vsoftplusf(x), x > 20.0 ? x : log1p(exp(x)))

/* ---- issue 12's math functions and activations ------------------------------------ */

/* clamp(x, lo, hi) as PyTorch's: max first, then min (lo > hi gives hi); NaN passes */
#define HARDTANH(T, x, lo, hi) ((((x) < (lo) ? (lo) : (x)) > (hi)) ? (hi) : ((x) < (lo) ? (lo) : (x)))

KE_UNARY_MATH(sinh, ke_vsinhf(x), sinh(x))
KE_UNARY_MATH(cosh, ke_vcoshf(x), cosh(x))
KE_UNARY_MATH(asin, ke_vasinf(x), asin(x))
KE_UNARY_MATH(acos, ke_vacosf(x), acos(x))
KE_UNARY_MATH(atan, ke_vatanf(x), atan(x))
KE_UNARY_MATH(asinh, ke_vasinhf(x), asinh(x))
KE_UNARY_MATH(acosh, ke_vacoshf(x), acosh(x))
KE_UNARY_MATH(atanh, ke_vatanhf(x), atanh(x))
KE_UNARY_MATH(log10, ke_vlog10f(x), log10(x))

/* logit: f0 = eps; PyTorch clamps x to [eps, 1 - eps] (bounds in the compute
 * dtype; max then min, so eps > 1/2 gives 1 - eps) when eps >= 0 and treats a
 * negative eps as None. NaN passes. */
#define LOGIT_EPS ke_attr_logit_eps(a)
#define LOGIT_CLAMP(T, x) (LOGIT_EPS >= 0 ? HARDTANH(T, x, (T)LOGIT_EPS, (T)1 - (T)LOGIT_EPS) : (x))
KE_UNARY_MATH(logit, ke_vlogitf(LOGIT_CLAMP(float, x)), log(LOGIT_CLAMP(double, x) / (1.0 - LOGIT_CLAMP(double, x))))

/* leaky_relu: f0 = negative_slope (PyTorch: x > 0 ? x : x * slope) */
#define LEAKY_SLOPE ke_attr_leaky_relu_negative_slope(a)
KE_UNARY_MATH(leaky_relu, x > 0 ? x : x * (float)LEAKY_SLOPE, x > 0 ? x : x * LEAKY_SLOPE)

/* PyTorch's elu kernel, x <= 0 ? expm1(x * ic) * nc : x * pc, with its
 * coefficients: elu (f0 = alpha) nc = alpha; selu nc = alpha * scale and
 * pc = scale (each rounded to the compute dtype first); celu (f0 = alpha)
 * nc = alpha, ic = 1/alpha computed in double. */
#define ELU_D(x, nc, pc, ic) ((x) <= 0 ? expm1((x) * (ic)) * (nc) : (x) * (pc))
#define ELU_ALPHA ke_attr_elu_alpha(a)
KE_UNARY_MATH(elu, ke_veluf(x, (float)ELU_ALPHA, 1.0f, 1.0f), ELU_D(x, ELU_ALPHA, 1.0, 1.0))
KE_UNARY_MATH(selu, ke_veluf(x, (float)KE__SELU_ALPHA * (float)KE__SELU_SCALE, (float)KE__SELU_SCALE, 1.0f),
              ELU_D(x, KE__SELU_ALPHA * KE__SELU_SCALE, KE__SELU_SCALE, 1.0))
#define CELU_ALPHA ke_attr_celu_alpha(a)
KE_UNARY_MATH(celu, ke_veluf(x, (float)CELU_ALPHA, 1.0f, (float)(1.0 / CELU_ALPHA)), ELU_D(x, CELU_ALPHA, 1.0, 1.0 / CELU_ALPHA))

/* softsign(x) = x / (|x| + 1), PyTorch's composite (integers compute as floats) */
KE_UNARY_MATH(softsign, x / (fabsf(x) + 1.0f), x / (fabs(x) + 1.0))

/* hardsigmoid = min(max(x + 3, 0), 6) / 6, hardswish = x * min(max(x + 3, 0), 6) / 6 as
 * PyTorch writes them; the clamps keep NaN (ke__minf/ke__maxf style). */
#define RELU6_3(T, x) (((x) + 3 < 0 ? (T)0 : (x) + 3) > 6 ? (T)6 : ((x) + 3 < 0 ? (T)0 : (x) + 3))
KE_UNARY_MATH(hardsigmoid, ke__minf(ke__maxf(x + 3.0f, 0.0f), 6.0f) / 6.0f, RELU6_3(double, x) / 6)
KE_UNARY_MATH(hardswish, x * ke__minf(ke__maxf(x + 3.0f, 0.0f), 6.0f) / 6.0f, x * RELU6_3(double, x) / 6)
/* mish: PyTorch's x * tanh(log1p(exp(x))) is NaN at -inf; vmath gives the limit */
KE_UNARY_MATH(mish, NAN_AT_NEG_INF(x, ke_vmishf(x)), x * tanh(log1p(exp(x))))

/* hardtanh: f0 = min_val, f1 = max_val; clamp's order (max first, then min,
 * so min > max gives max everywhere), NaN passes. Integer inputs take the
 * bounds truncated and saturated to their range (PyTorch converts them so;
 * ke_infer_hardtanh refuses negative bounds for uint8). */
static inline int64_t ht_bound(double v, int64_t lo, int64_t hi) {
    return v != v ? 0 : v <= (double)lo ? lo : v >= (double)hi ? hi : (int64_t)v;
}
#define HT_MIN ke_attr_hardtanh_min_val(a)
#define HT_MAX ke_attr_hardtanh_max_val(a)
#define HT_F(T) HARDTANH(T, x, (T)HT_MIN, (T)HT_MAX)
#define HT_I(T, U, MIN, MAX) \
    HARDTANH(T, x, (T)ht_bound(HT_MIN, MIN, MAX), (T)ht_bound(HT_MAX, MIN, MAX))
#define HT_I32(T, U) HT_I(T, U, INT32_MIN, INT32_MAX)
#define HT_I64(T, U) HT_I(T, U, INT64_MIN, INT64_MAX)
#define HT_U8(T, U) HT_I(T, U, 0, 255)
KE_GEN_F(KE_EW_UNARY, hardtanh, HT_F)
KE_EW_UNARY(hardtanh_i32, int32_t, int32_t, HT_I32(int32_t, uint32_t))
KE_EW_UNARY(hardtanh_i64, int64_t, int64_t, HT_I64(int64_t, uint64_t))
KE_EW_UNARY(hardtanh_u8, uint8_t, uint8_t, HT_U8(uint8_t, uint32_t))
KE_EW_IMPL(hardtanh, .loop = {KE_LOOPS_F(hardtanh), KE_LOOPS_I(hardtanh)})

/* ---- rounding: the identity on integers ------------------------------------------- */

#define KE_UNARY_ROUNDING(name, F32X, F64X)                                            \
    KE_EW_UNARY(name##_f32, float, float, F32X)                                       \
    KE_EW_UNARY(name##_f64, double, double, F64X)                                     \
    KE_EW_IMPL(name, .loop = {KE_LOOPS_F(name), KE_LOOPS_I(ident)})
KE_UNARY_ROUNDING(floor, floorf(x), floor(x))
KE_UNARY_ROUNDING(ceil, ceilf(x), ceil(x))
/* rint rounds half to even in the default rounding mode, as torch.round */
KE_UNARY_ROUNDING(round, rintf(x), rint(x))
KE_UNARY_ROUNDING(trunc, truncf(x), trunc(x))

/* ---- bool results --------------------------------------------------------------------- */

#define NOT_X(T, U) (x == 0)
KE_GEN_ALL_B(KE_EW_UNARY, logical_not, NOT_X)
KE_EW_IMPL(logical_not, .loop = {KE_LOOPS_ALL(logical_not)}, .out_bool = 1)

/* Integers are never NaN or infinite: one constant loop serves every
 * integer dtype (bool included) of the three predicates. (It reads its
 * input as bytes, which stays within any dtype's n elements.) */
KE_EW_UNARY(false_any, uint8_t, uint8_t, ((void)x, 0))
KE_EW_UNARY(true_any, uint8_t, uint8_t, ((void)x, 1))
#define KE_LOOPS_INTCONST(fn) [KL_I32] = fn, [KL_I64] = fn, [KL_U8] = fn, [KL_BOOL] = fn
KE_EW_UNARY(isnan_f32, float, uint8_t, x != x)
KE_EW_UNARY(isnan_f64, double, uint8_t, x != x)
KE_EW_UNARY(isinf_f32, float, uint8_t, fabsf(x) == INFINITY)
KE_EW_UNARY(isinf_f64, double, uint8_t, fabs(x) == INFINITY)
KE_EW_UNARY(isfinite_f32, float, uint8_t, fabsf(x) < INFINITY)
KE_EW_UNARY(isfinite_f64, double, uint8_t, fabs(x) < INFINITY)
KE_EW_IMPL(isnan, .loop = {KE_LOOPS_F(isnan), KE_LOOPS_INTCONST(false_any)}, .out_bool = 1)
KE_EW_IMPL(isinf, .loop = {KE_LOOPS_F(isinf), KE_LOOPS_INTCONST(false_any)}, .out_bool = 1)
KE_EW_IMPL(isfinite, .loop = {KE_LOOPS_F(isfinite), KE_LOOPS_INTCONST(true_any)}, .out_bool = 1)

#define BNOT_I(T, U) ((T)~(U)x)
KE_GEN_I(KE_EW_UNARY, bitwise_not, BNOT_I)
KE_EW_UNARY(bitwise_not_b8, uint8_t, uint8_t, !x)
KE_EW_IMPL(bitwise_not, .loop = {KE_LOOPS_I(bitwise_not), KE_LOOPS_B(bitwise_not)})

#ifndef KE_DEVICE /* the rest is host code (KE_DEVICE: kernels_ew_device.h) */

/* ---- shape rules ---------------------------------------------------------------------- */

/* square is pow(x, 2): bool squares to int64 as PyTorch's promotion of a
 * bool tensor with an integer scalar gives. */
int ke_infer_square(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    kl_dtype d = (kl_dtype)x->dtype;
    if (d == KL_BOOL) d = KL_I64;
    out->dtype = d;
    c->compute = ke_compute_dtype(d);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

/* hardtanh keeps integer dtypes; uint8 cannot take negative limits and bool
 * is refused, as in PyTorch. */
int ke_infer_hardtanh(ke_call *c, ke_outspec *out) {
    /* the bounds as integers (truncated), as PyTorch checks them */
    const double lo = ke_attr_hardtanh_min_val(&c->a), hi = ke_attr_hardtanh_max_val(&c->a);
    if (c->in[0]->dtype == KL_U8 && (trunc(lo) < 0 || trunc(hi) < 0))
        return ke_err(KL_ERR_ARG, ke_opname(c), "cannot do hardtanh on an unsigned type with negative limits (%g, %g)",
                      lo, hi);
    return ke_infer_ew_same(c, out);
}

/* celu divides by alpha: PyTorch raises "ZeroDivisionError: alpha cannot be 0". */
int ke_infer_celu(ke_call *c, ke_outspec *out) {
    if (ke_attr_celu_alpha(&c->a) == 0) return ke_err(KL_ERR_ARG, ke_opname(c), "alpha cannot be 0 for CELU (ZeroDivisionError)");
    return ke_infer_ew_same(c, out);
}

#endif /* !KE_DEVICE */
