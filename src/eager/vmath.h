/*
 * vmath.h - branch-free, auto-vectorizable float math for Kiln's eager kernels.
 *
 * Each function is an always-inline float -> float routine made only of
 * arithmetic, comparisons feeding bit-mask selects, and bit reinterpretation
 * through memcpy: no libm calls, no tables, no branches, no `?:` (pow's
 * loop over the 6 bits of an exponent has a constant trip count and is
 * unrolled).  That lets GCC 12 and Clang vectorize a plain loop such as
 *
 *     for (size_t i = 0; i < n; i++) y[i] = ke_vexpf(x[i]);
 *
 * (AVX-512/AVX2/SSE2), under default flags: -fmath-errno and -ftrapping-math
 * included.  libm's expf/sqrtf cannot be vectorized that way (errno).
 *
 * Build requirements: IEEE float/double, round-to-nearest, and no
 * -ffast-math / -fassociative-math / -ffinite-math-only (the code relies on
 * (a + C) - C rounding, exact Cody-Waite subtractions, NaN compares, signed
 * zeros).
 *
 * Fused multiply-adds are explicit (docs/CODEGEN.md, "FP contraction"): Kiln
 * compiles this file with -ffp-contract=off everywhere (GCC for eager, clang
 * for the kernels' bitcode) and NVRTC with -fmad=false, so a product is fused
 * with an addition only where the source says KE__FMA / KE__FMAD.  Those are
 * one fma where the target has the instruction (__FMA__; NVRTC is given
 * __FMA__ exactly when the CPU build has it) and a rounded multiply and add
 * elsewhere, so every device evaluates the same expression: the same bits on
 * CPU, compiled CPU and CUDA.  Every multiply-add that is not exact is
 * written with them (a product and its addition in plain C would be fused by
 * some compiler settings and not others: tests/test_vmath_ref.c checks a
 * -ffp-contract=fast build against the -ffp-contract=off one).  FMA and
 * non-FMA builds may differ in the last bit; both meet the bounds below, and
 * every step that must be exact is exact either way.  Where the target has
 * FMA, erf/gelu_erf also use it for exact products and residuals (elsewhere:
 * Dekker's product, same results).
 *
 * Accuracy, asserted by tests/test_vmath.c over dense sweeps: exp, exp2, log,
 * log2 <= 2 ulp; expm1, log1p <= 3; tanh, sigmoid, erf <= 4; sin, cos <= 4
 * and tan <= 6 for |x| <= 1e4 (measured the same up to 8.4e8, see
 * ke__trig_reduce); gelu_tanh, gelu_erf, silu <= 4; softplus <= 3; rsqrt
 * <= 1 (0.5 measured).  Added for issue 12 (bound asserted / max measured):
 * sinh <= 3 (2.02), cosh <= 2 (1.42), asin, acos, atan <= 1 (0.50), asinh,
 * acosh, atanh <= 3 (1.62, 1.74, 1.72), log10 <= 1 (0.86), logit <= 3
 * (1.73), mish <= 2 (1.72), elu with selu's coefficients <= 2 (1.41),
 * hypot <= 1 (0.50).  Added for one definition of the math on every device
 * (docs/GPU.md): pow <= 1 (0.50: correctly rounded on every sampled pair,
 * halfway cases included), atan2 <= 1 (0.50).  Subnormal inputs work as
 * ordinary numbers; subnormal results come from gradual underflow with one
 * final rounding (not FTZ).
 *
 * Coefficients were derived for this file with a weighted Remez exchange
 * (mpmath, 50 digits) on the stated intervals, then rounded to float; where it
 * helped, one coefficient at a time with the rest re-fitted after each
 * rounding (pow's double polynomials: mpmath's chebyfit).  A quoted "fit
 * error" is the max error of the rounded polynomial,
 * before float evaluation error.
 *
 * Public functions are ke_v<name>f; ke__* are internal helpers.
 */
#ifndef KILN_EAGER_VMATH_H
#define KILN_EAGER_VMATH_H

#include <stdint.h>
#include <string.h>

/* Force inlining: a call left in the loop body blocks vectorization, and
 * GCC's -O2 size heuristics do decline the larger functions (gelu_erf). */
#if defined(__GNUC__)
#define KE__VINLINE static inline __attribute__((always_inline))
#else
#define KE__VINLINE static inline
#endif

/* a*b + c: one fused multiply-add (one rounding) where the target has FMA,
 * a multiply and an add (two roundings) elsewhere; see the header comment.
 * __builtin_fmaf only where the instruction exists (GCC would otherwise call
 * libm's fmaf and the loop would stay scalar). */
#if defined(__FMA__)
#define KE__HAVE_FMA 1
#define KE__FMA(a, b, c) __builtin_fmaf(a, b, c)
#define KE__FMAD(a, b, c) __builtin_fma(a, b, c)
#else
#define KE__HAVE_FMA 0
#define KE__FMA(a, b, c) ((a) * (b) + (c))
#define KE__FMAD(a, b, c) ((a) * (b) + (c))
#endif

/* ---- Bit reinterpretation and selects ------------------------------- */
/* memcpy is the portable, UB-free way to pun; it compiles to nothing. */
KE__VINLINE uint32_t ke__asu(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
KE__VINLINE float ke__asf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
KE__VINLINE uint64_t ke__asu64(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
KE__VINLINE double ke__asd(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

KE__VINLINE float ke__absf(float x) { return ke__asf(ke__asu(x) & 0x7fffffffu); }
KE__VINLINE uint32_t ke__signbit(float x) { return ke__asu(x) & 0x80000000u; }
/*
 * Branch-free select: c ? a : b for c in {0, 1} (a comparison result), with
 * a and b both computed.  Why not `?:`: GCC turns it into a branch, sinks
 * the work that feeds only one arm into that branch, and jump threading
 * duplicates code after it; under the default -ftrapping-math the
 * if-converter then refuses to speculate those float operations (they could
 * raise a flag) and the loop stays scalar.  A mask select on the bit patterns
 * has no control flow; GCC emits a blend or vpternlogd.
 */
KE__VINLINE float ke__self(int c, float a, float b)
{
    uint32_t m = 0u - (uint32_t)c;
    return ke__asf((ke__asu(a) & m) | (ke__asu(b) & ~m));
}
KE__VINLINE int32_t ke__seli(int c, int32_t a, int32_t b)
{
    uint32_t m = 0u - (uint32_t)c;
    return (int32_t)(((uint32_t)a & m) | ((uint32_t)b & ~m));
}
/* Clamps that keep NaN (the comparison is false for NaN). */
KE__VINLINE float ke__minf(float x, float hi) { return ke__self(x > hi, hi, x); }
KE__VINLINE float ke__maxf(float x, float lo) { return ke__self(x < lo, lo, x); }

/* Quiet version of a NaN (an integer OR: nothing to trap on). */
KE__VINLINE float ke__qnan(float x) { return ke__asf(ke__asu(x) | 0x00400000u); }

/* +0.0f or -0.0f with the sign of x. */
KE__VINLINE float ke__signed_zero(float x) { return ke__asf(ke__signbit(x)); }

/* 2^k for k in [-126, 127] built directly in the exponent field.  Unsigned
 * arithmetic so that garbage k (from a NaN input, whose result is NaN anyway)
 * can never trigger signed-overflow UB. */
KE__VINLINE float ke__pow2i(int32_t k) { return ke__asf(((uint32_t)k + 127u) << 23); }

/* y * 2^n for n in [-252, 254].  2^n itself may not be a float (n < -126 or
 * n > 127), so scale in two halves.  For results in the subnormal range the
 * first product stays normal and exact and the second one rounds once, giving
 * correctly rounded gradual underflow; overflow yields +-inf naturally.
 * n >> 1 on a negative int is an arithmetic shift in GCC/Clang. */
KE__VINLINE float ke__scale(float y, int32_t n)
{
    int32_t n1 = n >> 1;
    int32_t n2 = n - n1;
    return (y * ke__pow2i(n1)) * ke__pow2i(n2);
}

/* ---- Shared constants ------------------------------------------------ */
/* 1.5 * 2^23: adding it to |v| < 2^22 rounds v to an integer (current
 * rounding mode = nearest) and leaves that integer in the low mantissa bits. */
#define KE__SHIFT 0x1.8p23f
#define KE__LOG2E 0x1.715476p+0f  /* 1/ln 2 */
#define KE__LN2 0x1.62e430p-1f    /* ln 2 rounded to float */
/* Cody-Waite split of ln 2: LN2_HI has 15 significant bits, so n * LN2_HI is
 * exact for |n| < 512; LN2_LO = ln2 - LN2_HI rounded to float.  Together
 * they carry ~43 bits of ln 2, far more than |n| <= 183 needs. */
#define KE__LN2_HI 0x1.62e4p-1f
#define KE__LN2_LO 0x1.7f7d1cp-20f

/* ---- exp family ------------------------------------------------------ */

/* expm1(r) = r + r^2 * Q(r) on |r| <= 0.35 (covers the reduced range
 * |r| <= ln2/2 plus slack).  Q4 minimizes the relative error of expm1(r):
 * fit error 1.5e-8.  exp(r) = 1 + expm1(r) divides that by
 * |exp(r)/expm1(r)| >= 2.4, so it is <= 6e-9 (0.05 ulp) there. */
KE__VINLINE float ke__expm1_poly4(float r)
{
    float q = 0x1.6adb90p-10f;
    q = KE__FMA(q, r, 0x1.123156p-7f);
    q = KE__FMA(q, r, 0x1.555788p-5f);
    q = KE__FMA(q, r, 0x1.5554a4p-3f);
    q = KE__FMA(q, r, 0x1.fffffep-2f);
    return KE__FMA(r * r, q, r);
}

/* Same form, one degree higher, for callers that need expm1 itself with full
 * relative accuracy (expm1, tanh): fit error 2.4e-9 relative. */
KE__VINLINE float ke__expm1_poly5(float r)
{
    float q = 0x1.a0332cp-13f;
    q = KE__FMA(q, r, 0x1.6d78c4p-10f);
    q = KE__FMA(q, r, 0x1.11118ep-7f);
    q = KE__FMA(q, r, 0x1.5554aap-5f);
    q = KE__FMA(q, r, 0x1.555554p-3f);
    q = KE__FMA(q, r, 0x1.000000p-1f);
    return KE__FMA(r * r, q, r);
}

/*
 * exp(hi - mlo) = p * 2^n with p in [0.70, 1.42].  Callers keep hi within
 * [-127, 89] so n lies in [-184, 129] (what ke__scale accepts).
 *
 * Range reduction: n = round((hi - mlo) / ln2), r = hi - n*ln2 - mlo.
 * hi - n*LN2_HI is exact: |result| < 2 and both operands are multiples of the
 * smaller one's last bit, so it fits in 24 bits (and for n = 0 it is just hi).
 * mlo carries low-order bits of the argument when the caller has them in
 * extra precision (erfc, gelu); plain exp passes 0, and x - 0.0f folds away.
 * The remaining rounding in r is about |r| * 2^-24, i.e. <= 0.2 ulp in p.
 */
KE__VINLINE float ke__exp_core(float hi, float mlo, int32_t *n)
{
    float t = KE__FMA(hi - mlo, KE__LOG2E, KE__SHIFT);
    float nf = t - KE__SHIFT;
    /* Integer n from the bits of t: no float->int conversion, so no UB (and
     * no vcvt special cases) when the input is NaN. */
    *n = (int32_t)(ke__asu(t) - ke__asu(KE__SHIFT));
    float r = KE__FMA(-nf, KE__LN2_LO, KE__FMA(-nf, KE__LN2_HI, hi) - mlo);
    return 1.0f + ke__expm1_poly4(r);
}

/*
 * exp(x).  Clamp to [-104, 89] first: exp(-104) < 2^-150 rounds to 0 and
 * exp(89) overflows, so clamping changes no result, keeps |x*log2e| far below
 * 2^22 for the shift trick, and keeps n in ke__scale's range.  Beyond 88.72
 * the final scaling overflows to +inf; below about -87.3 results are
 * subnormal via gradual underflow (correctly rounded up to the ~1 ulp error
 * of p), reaching 0 below -103.97.  NaN survives the clamps (compares are
 * false) and propagates through the arithmetic.
 */
KE__VINLINE float ke_vexpf(float x)
{
    float xc = ke__minf(x, 89.0f);
    xc = ke__maxf(xc, -104.0f);
    int32_t n;
    float p = ke__exp_core(xc, 0.0f, &n);
    return ke__scale(p, n);
}

/*
 * 2^x.  n = round(x) and f = x - n are exact, so the only reduction error is
 * rounding r = f*ln2 (<= 2^-25 * 0.35 absolute, ~0.2 ulp).  Clamp range
 * [-151, 129] is again result-preserving (2^-151 -> 0, 2^129 -> inf).
 */
KE__VINLINE float ke_vexp2f(float x)
{
    float xc = ke__minf(x, 129.0f);
    xc = ke__maxf(xc, -151.0f);
    float t = xc + KE__SHIFT;
    float nf = t - KE__SHIFT;
    int32_t n = (int32_t)(ke__asu(t) - ke__asu(KE__SHIFT));
    float r = (xc - nf) * KE__LN2;
    return ke__scale(1.0f + ke__expm1_poly4(r), n);
}

/*
 * expm1(x) for x already clamped to [-18, 89] (NaN allowed).
 * With x = n*ln2 + r:  expm1(x) = 2^n * expm1(r) + (2^n - 1).
 * Written as 2 * (T*p + (T - 1/2)) with T = 2^(n-1) so that T is a normal
 * float for every n in [-26, 128] (2^128 itself is not a float); the final *2
 * is exact or overflows exactly when expm1(x) does.  For n = 0 the result is
 * just p = expm1(r) with r = x exactly, which keeps full relative accuracy
 * for tiny x where exp(x) - 1 would cancel.
 */
KE__VINLINE float ke__expm1_core(float x)
{
    float t = KE__FMA(x, KE__LOG2E, KE__SHIFT);
    float nf = t - KE__SHIFT;
    int32_t n = (int32_t)(ke__asu(t) - ke__asu(KE__SHIFT));
    float r = KE__FMA(-nf, KE__LN2_LO, KE__FMA(-nf, KE__LN2_HI, x));
    float p = ke__expm1_poly5(r);
    float T = ke__pow2i(n - 1);
    float y = 2.0f * KE__FMA(T, p, T - 0.5f);
    return ke__self(n == 0, p, y);
}

/* expm1(x).  Below -17.33 the exact result rounds to -1, so clamping at -18
 * is harmless and keeps 2^-n representable.  The x == 0 select preserves
 * expm1(-0) = -0 (the polynomial would produce +0). */
KE__VINLINE float ke_vexpm1f(float x)
{
    float xc = ke__minf(x, 89.0f);
    xc = ke__maxf(xc, -18.0f);
    float y = ke__expm1_core(xc);
    return ke__self(x == 0.0f, x, y);
}

/* ---- log family ------------------------------------------------------ */

/*
 * Split finite x > 0 (subnormals included) as x = 2^e * (1 + f) with
 * 1 + f in [sqrt(1/2), sqrt(2)), i.e. f in [-0.293, 0.415].  Centering the
 * mantissa interval on 1 keeps |log1p(f)| <= ln2/2 and makes the two ends
 * symmetric for the s = f/(2+f) variable below.  Subnormals are pre-scaled by
 * 2^23.  Subtracting the bit pattern of sqrt(1/2) makes the exponent field of
 * the difference equal e directly.  f = m - 1 is exact (Sterbenz).  Garbage
 * for x <= 0, inf or NaN; callers fix those with selects.
 */
KE__VINLINE float ke__log_reduce(float x, int32_t *e)
{
    int sub = x < 0x1p-126f;
    float xs = ke__self(sub, x * 0x1p23f, x);
    uint32_t ix = ke__asu(xs);
    int32_t k = (int32_t)(ix - 0x3f3504f3u) >> 23;
    float m = ke__asf(ix - ((uint32_t)k << 23));
    *e = ke__seli(sub, k - 23, k);
    return m - 1.0f;
}

/*
 * log1p(f) - f for f in about [-0.30, 0.43] (the correction term; the caller
 * adds f last so that the large part is never rounded twice).
 *
 * With s = f/(2+f):  log1p(f) = 2*atanh(s) = 2s + s*R,  R = 2s^2/3 + 2s^4/5 + ...
 * and since 2s = f - s*f,  log1p(f) = f - s*(f - R).
 * |s| <= 0.177, so R(z), z = s^2 <= 0.031, needs only a degree-3 polynomial:
 * R = z * P(z), P fitted for absolute error of R: 2.1e-9, which enters the
 * result multiplied by |s|.  The division's rounding error also only reaches
 * the small correction term, not f.
 */
KE__VINLINE float ke__log1p_corr(float f)
{
    float s = f / (2.0f + f);
    float z = s * s;
    float P = 0x1.32c9e4p-2f;
    P = KE__FMA(P, z, 0x1.995694p-2f);
    P = KE__FMA(P, z, 0x1.555582p-1f);
    return -(s * KE__FMA(-z, P, f));
}

/* log(x) = e*ln2 + f + corr.  e*LN2_HI is exact; the small terms are summed
 * first and the two large terms meet in the last addition (one rounding).
 * Special values: log(+-0) = -inf, log(x<0) = NaN, log(inf) = inf, NaN -> NaN. */
KE__VINLINE float ke_vlogf(float x)
{
    int32_t ei;
    float f = ke__log_reduce(x, &ei);
    float e = (float)ei;
    float y = KE__FMA(e, KE__LN2_HI, f + KE__FMA(e, KE__LN2_LO, ke__log1p_corr(f)));
    y = ke__self(x < 0.0f, __builtin_nanf(""), y);
    y = ke__self(x == 0.0f, -__builtin_inff(), y);
    y = ke__self(x == __builtin_inff(), x, y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* 1/ln2 split so that INVLN2_HI (12 significant bits) times the top 12 bits
 * of f is an exact product. */
#define KE__INVLN2_HI 0x1.716p+0f
#define KE__INVLN2_LO (-0x1.7135a8p-13f)

/*
 * log2(x) = e + log1p(f)/ln2.  Multiplying log1p(f) by 1/ln2 in plain float
 * would add up to ~1 ulp, so the big product f/ln2 is formed as
 * fh*INVLN2_HI (exact) + small terms, where fh = f with its low 12 mantissa
 * bits cleared and fl = f - fh (exact).  Exact powers of two give exactly e.
 */
KE__VINLINE float ke_vlog2f(float x)
{
    int32_t ei;
    float f = ke__log_reduce(x, &ei);
    float lo = ke__log1p_corr(f);
    float fh = ke__asf(ke__asu(f) & 0xfffff000u);
    float fl = f - fh;
    float corr = KE__FMA(fl, KE__LOG2E, KE__FMA(lo, KE__LOG2E, fh * KE__INVLN2_LO));
    float y = (float)ei + KE__FMA(fh, KE__INVLN2_HI, corr); /* exact product */
    y = ke__self(x < 0.0f, __builtin_nanf(""), y);
    y = ke__self(x == 0.0f, -__builtin_inff(), y);
    y = ke__self(x == __builtin_inff(), x, y);
    return ke__self(x != x, ke__qnan(x), y);
}

/*
 * log1p(x) for finite x > -1 (no special-value selects; used by softplus too).
 * u = 1 + x is rounded, but its rounding error c is recovered exactly with
 * Fast2Sum (order the operands by magnitude).  With u = 2^e * (1 + f) the
 * exact 1 + x equals 2^e * (1 + f + c*2^-e), so c*2^-e is folded into f
 * before the log1p kernel.  For |x| small (e = 0) this gives f = x exactly,
 * so tiny arguments keep full relative accuracy.  u is never subnormal
 * (u >= 2^-24 when x > -1), and 2^-e is clamped to stay a normal float: for
 * e > 126 the c term is below 2^-126 and irrelevant.
 */
KE__VINLINE float ke__log1p_core(float x)
{
    float u = 1.0f + x;
    float c = ke__self(ke__absf(x) > 1.0f, 1.0f - (u - x), x - (u - 1.0f));
    int32_t ei;
    float f = ke__log_reduce(u, &ei);
    int32_t es = ke__seli(ei > 126, 126, ei);
    f = KE__FMA(c, ke__pow2i(-es), f);
    float e = (float)ei;
    return KE__FMA(e, KE__LN2_HI, f + KE__FMA(e, KE__LN2_LO, ke__log1p_corr(f)));
}

/* log1p(x): log1p(-1) = -inf, x < -1 -> NaN, inf -> inf, NaN -> NaN, and
 * log1p(-0) = -0 via the x == 0 select. */
KE__VINLINE float ke_vlog1pf(float x)
{
    float y = ke__log1p_core(x);
    y = ke__self(x < -1.0f, __builtin_nanf(""), y);
    y = ke__self(x == -1.0f, -__builtin_inff(), y);
    y = ke__self(x == __builtin_inff(), x, y);
    y = ke__self(x == 0.0f, x, y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* ---- tanh, sigmoid and the sigmoid-gated activations ----------------- */

/*
 * tanh(x) = sign(x) * t/(t + 2) with t = expm1(2|x|).  Using expm1 (not exp)
 * keeps relative accuracy for small |x| with no cancellation, so no separate
 * small-argument polynomial is needed: error = expm1's + two roundings.
 * |x| is clamped at 10 (tanh(x) rounds to 1 above 9.01), which also avoids
 * inf/inf.  Odd symmetry is applied by OR-ing the sign bit back in, which
 * gives tanh(-0) = -0, tanh(+-inf) = +-1 and keeps NaN a NaN.
 */
KE__VINLINE float ke_vtanhf(float x)
{
    float a = ke__absf(x);
    a = ke__minf(a, 10.0f);
    float t = ke__expm1_core(2.0f * a);
    float y = t / (t + 2.0f);
    return ke__asf(ke__asu(y) | ke__signbit(x));
}

/*
 * x * sigmoid(z), given v = -|z| = vhi - vmlo (vhi already clamped to
 * >= -126) and zneg = (z < 0).
 *
 * Let E = exp(-|z|) = p * 2^n (always <= 1, so 1 + E never overflows):
 *     z >= 0:  x * sigmoid(z) = x / (1 + E)
 *     z <  0:  x * sigmoid(z) = x * E / (1 + E) = (x * p / (1 + E)) * 2^n
 * In the second form the power of two is applied last, after multiplying by
 * x, so tiny results (e.g. silu(-95) ~ 5e-40) underflow gradually with one
 * rounding instead of multiplying an already-subnormal E by x.
 */
KE__VINLINE float ke__x_sigmoid(float x, float vhi, float vmlo, int zneg)
{
    int32_t n;
    float p = ke__exp_core(vhi, vmlo, &n);
    /* 1 + E only needs E when E > 2^-25; clamping its exponent at -60 keeps
     * E normal, avoiding the slow microcoded subnormal path on x86 for the
     * many inputs whose E would be subnormal (|z| > 87). */
    float d = KE__FMA(p, ke__pow2i(ke__seli(n < -60, -60, n)), 1.0f);
    float num = ke__self(zneg, x * p, x);
    return ke__scale(num / d, ke__seli(zneg, n, 0));
}

/* sigmoid(x) = 1/(1+exp(-x)); sigmoid(-inf) = 0, sigmoid(inf) = 1, NaN -> NaN.
 * Results below 2^-126 are subnormal (gradual underflow), 0 below ~-103.9. */
KE__VINLINE float ke_vsigmoidf(float x)
{
    float v = -ke__absf(x);
    v = ke__maxf(v, -126.0f);
    return ke__x_sigmoid(1.0f, v, 0.0f, x < 0.0f);
}

/* silu(x) = x * sigmoid(x).  Below -126 the exact result is far below 2^-150,
 * so return -0 directly (this also makes silu(-inf) = -0, the limit, where the
 * naive x/(1+exp(-x)) gives NaN). */
KE__VINLINE float ke_vsiluf(float x)
{
    float v = -ke__absf(x);
    v = ke__maxf(v, -126.0f);
    float y = ke__x_sigmoid(x, v, 0.0f, x < 0.0f);
    return ke__self(x < -126.0f, -0.0f, y);
}

/*
 * gelu_tanh(x) = 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715 x^3).
 * Rewritten exactly as x * sigmoid(2u): no 1 + tanh cancellation for x < 0.
 * exp(-|2u|) has condition number |2u| (up to ~126), so 2u is computed in
 * double and handed to the exp kernel as a float hi + lo pair; computing it in
 * float would cost ~|2u| ulp in the negative tail.  For 2u < -126 (x < -10.9)
 * |x| * e^(2u) is far below 2^-150, so the result is -0.
 * gelu_tanh(+inf) = inf; gelu_tanh(-inf) = -0 (the limit; PyTorch gives NaN).
 */
KE__VINLINE float ke_vgelu_tanhf(float x)
{
    double xd = (double)x;
    /* 2 * sqrt(2/pi) = 0x1.9884533d43651p+0 */
    double z = 0x1.9884533d43651p+0 * xd * KE__FMAD(0.044715 * xd, xd, 1.0);
    double v = -ke__asd(ke__asu64(z) & 0x7fffffffffffffffull); /* -|z| */
    float vhi = (float)v;
    float vlo = (float)(v - (double)vhi);
    /* The range test is done on the float: a 64-bit compare feeding a select
     * cannot be vectorized on plain SSE2. z has the sign of x. */
    int far = vhi < -126.0f;
    vlo = ke__self(far, 0.0f, vlo);
    vhi = ke__self(far, -126.0f, vhi);
    float y = ke__x_sigmoid(x, vhi, -vlo, x < 0.0f);
    return ke__self(far & (x < 0.0f), ke__signed_zero(x), y);
}

/* ---- erf and gelu_erf ------------------------------------------------ */

/* erf(a) = a + a*S(a^2) for 0 <= a <= 1; S fitted for relative error of erf:
 * 1.4e-9.  Writing it as a + (small) instead of a*(1.128 + ...) keeps tiny
 * and subnormal arguments exact up to one rounding. */
KE__VINLINE float ke__erf_small(float a)
{
    float z = a * a;
    float S = 0x1.4771fep-14f;
    S = KE__FMA(S, z, -0x1.a3515ep-11f);
    S = KE__FMA(S, z, 0x1.53f224p-8f);
    S = KE__FMA(S, z, -0x1.b7f71ap-6f);
    S = KE__FMA(S, z, 0x1.ce2ce6p-4f);
    S = KE__FMA(S, z, -0x1.81273ep-2f);
    S = KE__FMA(S, z, 0x1.06eba8p-3f);
    return KE__FMA(a, S, a);
}

/*
 * Exact products: a*b = hi + lo exactly (no overflow/underflow assumed).
 * With a fused multiply-add (__FMA__: -mfma, -march=haswell or later,
 * -march=native on such machines) lo is one fma; otherwise Dekker's product
 * with Veltkamp's split (12 + 12 bits; every step exact in round-to-nearest,
 * with or without contraction, since no compiler contracts without an FMA
 * unit).  Both give the same lo: it is the exact rounding error.
 */
KE__VINLINE float ke__split_hi(float a)
{
    float c = 4097.0f * a; /* 2^12 + 1 */
    return c - (c - a);
}
KE__VINLINE float ke__two_prod(float a, float b, float *lo)
{
    float hi = a * b;
#if KE__HAVE_FMA
    *lo = __builtin_fmaf(a, b, -hi);
#else
    float ah = ke__split_hi(a), bh = ke__split_hi(b);
    float al = a - ah, bl = b - bh;
    *lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl;
#endif
    return hi;
}
/* num - q*d exactly, for q = num/d correctly rounded (that residual is a
 * float; no overflow/underflow in the ranges used). */
KE__VINLINE float ke__div_residual(float num, float q, float d)
{
#if KE__HAVE_FMA
    return __builtin_fmaf(-q, d, num);
#else
    float lo;
    float hi = ke__two_prod(q, d, &lo);
    return (num - hi) - lo; /* num - hi is exact (Sterbenz) */
#endif
}

/* Constants of the erfc core: t = KE__ERFC_N / (KE__ERFC_C + b) and
 * s = t - KE__ERFC_T0. */
#define KE__ERFC_C 0x1.dc0000p+1f  /* 3.71875 */
#define KE__ERFC_N 0x1.291684p+1f  /* 2.3210, slightly above 0.125 * (C + 14.849242) */
#define KE__ERFC_T0 0x1.800000p-2f /* 0.375 */

/*
 * erfc(b/sqrt2) = t * (1 + e) * 2^n for b in [0, 14.85] (a = b/sqrt2 in
 * [0, 10.5]),
 * with relative accuracy (gelu_erf needs erfc in its far negative tail, not
 * just 1 - erf).  The caller passes b and -b^2/2 as a float pair e_hi + e_lo
 * (exact, up to underflow for b < 2^-63, which cannot matter in an exp
 * argument).
 *
 *     erfc(b/sqrt2) = t * exp(-b^2/2 + R(t)),   t = N/(C + b) in [0.125, 0.625]
 *
 * The factor t absorbs the ~1/b decay of erfc*exp(b^2/2), leaving
 * R(t) = log(erfc(b/sqrt2) * exp(b^2/2) / t) in [-0.85, 0.48], smooth in t.
 * R is a degree-10 polynomial in s = t - 0.375, |s| <= 0.25 (fit error
 * 4.1e-9 with the float coefficients: 0.07 ulp of erfc).  N and C put t in
 * [0.125, 1), where t - 0.375 is exact (Sterbenz on [0.1875, 0.75], and the
 * difference needs no more bits than t has elsewhere), and s centred: a
 * polynomial in t itself on such a range has coefficients of several
 * hundreds whose Horner roundings cost ~3 ulp.  All in float:
 *
 * - exp(-b^2/2 + R) has condition number b^2/2 (up to 110), so neither the
 *   square nor the sum is rounded: e_hi goes through the Cody-Waite step
 *   e_hi - n*LN2_HI (exact for b >= 0.21, checked over every float b; below,
 *   where n = 1 and |e_hi| < 0.022, it rounds by <= 2^-25), then R and the
 *   small terms are added, each sum rounding at the size of the reduced
 *   argument (|r| <= 0.36, also checked: 2^-26).  t in [0.125, 0.625], the
 *   exact d - C and t - 0.375 were checked over every float b as well.
 * - t = fl(N / d), d = fl(C + b), is off from the exact N/(C + b) by a
 *   relative eps = ((N - t*d) - t*dlo) / N, where dlo = C + b - d (exact:
 *   d - C is exact) and N - t*d is the exact division residual.  A relative
 *   error eps in t shifts log(erfc) by K*eps, K = d log(erfc*e^(b^2/2)) /
 *   d log t = 1 + t R'(t) in [1.24, 2.97]; left alone that would cost up to
 *   3 * 2^-23 relative (3-6 ulp), so K/N (quadratic in s, 2.3% error) times
 *   the residual is added to the exponent: t, as the factor and as R's
 *   argument, then acts as the exact N/(C + b).
 * Returned unrounded as erfc = t * (1 + e) * 2^n (e = expm1(r) in
 * [-0.3, 0.42]) so that callers round once where they combine it.
 */
KE__VINLINE float ke__erfc_core(float b, float e_hi, float e_lo, int32_t *n, float *tp)
{
    float d = KE__ERFC_C + b;
    float dlo = b - (d - KE__ERFC_C);
    float t = KE__ERFC_N / d;
    float res = KE__FMA(-t, dlo, ke__div_residual(KE__ERFC_N, t, d));
    float s = t - KE__ERFC_T0;
    float R = 0x1.a14a6ep+4f;
    R = KE__FMA(R, s, -0x1.2df060p+1f);
    R = KE__FMA(R, s, -0x1.d17d3ap+3f);
    R = KE__FMA(R, s, 0x1.763d68p-1f);
    R = KE__FMA(R, s, 0x1.8aad4ep+2f);
    R = KE__FMA(R, s, 0x1.7658f8p-2f);
    R = KE__FMA(R, s, -0x1.65e768p+1f);
    R = KE__FMA(R, s, -0x1.e7370ep-1f);
    R = KE__FMA(R, s, 0x1.86d6dep+0f);
    R = KE__FMA(R, s, 0x1.5a1318p+1f);
    R = KE__FMA(R, s, -0x1.17b1b0p-2f);
    float K = KE__FMA(KE__FMA(0x1.4b8cb0p-1f, s, 0x1.8cda80p+0f), s, 0x1.bce3a0p-1f); /* K / N */
    /* Reduction as in ke__exp_core, of the argument e_hi + R + small. */
    float z = KE__FMA(e_hi + R, KE__LOG2E, KE__SHIFT);
    float nf = z - KE__SHIFT;
    *n = (int32_t)(ke__asu(z) - ke__asu(KE__SHIFT));
    float small = KE__FMA(-nf, KE__LN2_LO, KE__FMA(K, res, e_lo));
    float r = (KE__FMA(-nf, KE__LN2_HI, e_hi) + R) + small;
    *tp = t;
    return ke__expm1_poly4(r);
}

/*
 * erf(x): |x| < 1 uses the odd polynomial; |x| >= 1 uses 1 - erfc(|x|) with
 * |x| clamped to 4 (erf(x) rounds to 1 beyond 3.92).  Both branches are
 * always evaluated and blended.  erfc gets b = fl(sqrt2 * a) (the rounding
 * moves erfc by ~0.6 * 2^-24 relative, a fraction of an ulp of erf) and
 * -a^2 exactly.  Sign restored by OR: erf(-0) = -0, erf(+-inf) = +-1,
 * NaN -> NaN.
 */
KE__VINLINE float ke_verff(float x)
{
    float a = ke__absf(x);
    float ys = ke__erf_small(a);
    float ac = ke__minf(ke__maxf(a, 1.0f), 4.0f);
    float l;
    float h = ke__two_prod(ac, ac, &l);
    int32_t n;
    float t;
    /* b = fl(sqrt2 * ac), clamped after the product (rounded on its own, not
     * fused into erfc's C + b) */
    float b = ke__minf(ke__maxf(a * 0x1.6a09e6p+0f, 0x1.6a09e6p+0f), 0x1.6a09e6p+2f);
    float e = ke__erfc_core(b, -h, -l, &n, &t);
    /* 1 - erfc: ke__scale's last multiply fused with the subtraction */
    int32_t n1 = n >> 1;
    float yb = KE__FMA(-(KE__FMA(t, e, t) * ke__pow2i(n1)), ke__pow2i(n - n1), 1.0f);
    float y = ke__self(a < 1.0f, ys, yb);
    return ke__asf(ke__asu(y) | ke__signbit(x));
}

/*
 * gelu_erf(x) = 0.5*x*(1 + erf(x/sqrt2)) = 0.5*x*erfc(-x/sqrt2), from one
 * relative-accurate erfc(|x|/sqrt2) = t * (1 + e) * 2^n (no erf polynomial,
 * no branches).  With T = t * 2^k (exact):
 *   x < 0:   0.5*x*erfc = (x*T + x*T*e) * 2^-64,  k = n + 63
 *   x >= 0:  x*(1 - 0.5*erfc) = x*(1 - T) - x*T*e,  k = n - 1
 * each an FMA whose addend x*T*e (|e| <= 0.42) is the only other rounding.
 * erfc gets b = |x| itself and -x^2/2 as an exact float pair (a rounded
 * a = |x|/sqrt2 would cost up to 2a^2 * 2^-24 relative).  For x < 0, x*T is
 * normal (n >= -160) and the last multiply rounds once into the subnormal
 * range (correct gradual underflow).  For x >= 0, n is clamped at -60
 * (0.5*erfc < 2^-61 only matters against 1; no subnormal intermediate);
 * 1 - T is exact where it matters (T in [0.25, 0.5] for small x), and
 * 0.5*erfc <= 0.5 means no real cancellation.  Below x = -14.85 (a > 10.5)
 * the result is < 2^-150: -0, and the factor 2^-64 is dropped there so that
 * no underflowing product is computed (some CPUs take a slow path for
 * those).  gelu_erf(+inf) = inf, gelu_erf(-inf) = -0 (the limit; PyTorch
 * gives NaN), gelu_erf(-0) = -0, NaN -> NaN.
 */
KE__VINLINE float ke_vgelu_erff(float x)
{
    float xc = ke__minf(ke__absf(x), 14.849242f);
    float l;
    float h = ke__two_prod(xc, xc, &l); /* x^2 = h + l; halving is exact */
    int32_t n;
    float t;
    float e = ke__erfc_core(xc, -0.5f * h, -0.5f * l, &n, &t);
    int neg = x < 0.0f;
    int far = x < -14.849242f;
    int32_t k = ke__seli(neg, n + 63, ke__seli(n < -60, -60, n) - 1);
    float T = t * ke__pow2i(k);
    float Ae = (x * T) * e;
    float yn = KE__FMA(x, T, Ae) * ke__self(far, 1.0f, 0x1p-64f);
    float yp = KE__FMA(x, 1.0f - T, -Ae);
    float y = ke__self(neg, yn, yp);
    return ke__self(far, -0.0f, y);
}

/* ---- softplus, rsqrt ------------------------------------------------- */

/* softplus(x) = log1p(exp(x)), and x itself above PyTorch's threshold 20
 * (where log1p(e^x) - x < 2.1e-9 is below half an ulp of x anyway).
 * log1p(t)'s sensitivity to t is t/((1+t)log1p(t)) <= 1, so exp's error is not
 * amplified.  softplus(-inf) = 0, softplus(inf) = inf, NaN -> NaN. */
KE__VINLINE float ke_vsoftplusf(float x)
{
    float xc = ke__minf(x, 20.0f);
    float y = ke__log1p_core(ke_vexpf(xc));
    return ke__self(x > 20.0f, x, y);
}

/*
 * 1/sqrt(x), correctly rounded except in rare near-tie cases (error below
 * 0.5 + 2^-28 ulp).  sqrtf is not used: under the default -fmath-errno GCC keeps a
 * conditional libm call for negative inputs, which blocks vectorization.
 * Instead, in double: the classic bit-trick seed (exponent halving with a
 * tuned magic constant, relative error < 1.8e-3), then three Newton steps
 * y <- y*(1.5 - 0.5*x*y^2), each squaring the relative error:
 * 1.8e-3 -> 4.6e-6 -> 3.2e-11 -> 1.5e-21 (bounded by double rounding).
 * Float subnormals are normal doubles, so they need no special path.
 * rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(x<0) = NaN, rsqrt(inf) = 0.
 */
KE__VINLINE float ke_vrsqrtf(float x)
{
    double d = (double)x;
    double h = 0.5 * d;
    double y = ke__asd(0x5fe6eb50c7b537a9ull - (ke__asu64(d) >> 1));
    y = y * KE__FMAD(-(h * y), y, 1.5);
    y = y * KE__FMAD(-(h * y), y, 1.5);
    y = y * KE__FMAD(-(h * y), y, 1.5);
    float r = (float)y;
    r = ke__self(x < 0.0f, __builtin_nanf(""), r);
    r = ke__self(x == __builtin_inff(), 0.0f, r);
    r = ke__self(x == 0.0f, ke__asf(ke__signbit(x) | 0x7f800000u), r);
    return ke__self(x != x, ke__qnan(x), r);
}

/* ---- sin, cos, tan --------------------------------------------------- */

/*
 * Reduce x to r = x - n*pi/2 in [-pi/4, pi/4] and q = n mod 4.
 *
 * Cody-Waite with a 3-part pi/2, done in double.  A float-only reduction
 * cannot keep relative accuracy near multiples of pi/2: x within 1e4 can lie
 * ~1e-9 from n*pi/2, so pi/2 must be known to ~2^-70 relative, and without a
 * guaranteed FMA the float products n*P would not be exact.  In double:
 * PIO2_1 and PIO2_2 have 24 significant bits each, so for |n| < 2^29 the
 * products n*PIO2_1, n*PIO2_2 are exact and both subtractions are exact
 * (operands within a few binades, result fits 53 bits); PIO2_3 carries the
 * next 53 bits.  Net: pi/2 to ~101 bits, reduced argument essentially exact
 * for |x| < 2^29*pi/2 ~ 8.4e8.
 * Beyond that n*PIO2_1 starts rounding and the absolute error of r grows like
 * |x|*2^-53 (so relative error near zeros of sin/cos grows without bound);
 * past |x| ~ 2^51 the n computation itself is meaningless.  r is clamped to
 * [-pi/4, pi/4] so even then results stay within [-1, 1] (sin, cos).
 * inf and NaN produce NaN through the arithmetic (inf - inf).
 */
#define KE__PIO2_1 0x1.921fb6p+0
#define KE__PIO2_2 (-0x1.777a5cp-25)
#define KE__PIO2_3 (-0x1.ee59d9cceba40p-50)
KE__VINLINE float ke__trig_reduce(float x, uint32_t *q)
{
    double xd = (double)x;
    double t = KE__FMAD(xd, 0x1.45f306dc9c883p-1, 0x1.8p52); /* 2/pi; round to int */
    double nd = t - 0x1.8p52;
    *q = (uint32_t)ke__asu64(t) & 3u;
    double r = KE__FMAD(-nd, KE__PIO2_1, xd);
    r = KE__FMAD(-nd, KE__PIO2_2, r);
    r = KE__FMAD(-nd, KE__PIO2_3, r);
    float rf = (float)r;
    rf = ke__minf(rf, 0x1.921fb6p-1f);
    return ke__maxf(rf, -0x1.921fb6p-1f);
}

/* sin(r) on |r| <= pi/4: r + r^3*S(r^2), relative fit error 4.0e-9. */
KE__VINLINE float ke__sin_poly(float r, float z)
{
    float S = -0x1.9951eap-13f;
    S = KE__FMA(S, z, 0x1.110774p-7f);
    S = KE__FMA(S, z, -0x1.555546p-3f);
    return KE__FMA(r, z * S, r);
}

/* cos(r) on |r| <= pi/4: 1 - z/2 + z^2*C(z), relative fit error 1.2e-10.
 * w = 1 - z/2 is rounded; its rounding error ((1 - w) - z/2, exact) is added
 * back with the small terms, so the final result rounds essentially once. */
KE__VINLINE float ke__cos_poly(float z)
{
    float C = 0x1.99e80cp-16f;
    C = KE__FMA(C, z, -0x1.6c0c28p-10f);
    C = KE__FMA(C, z, 0x1.55554ap-5f);
    float w = KE__FMA(-0.5f, z, 1.0f);
    return w + KE__FMA(z * z, C, KE__FMA(-0.5f, z, 1.0f - w)); /* 0.5 z: exact */
}

/* sin(x) = +-sin(r) or +-cos(r) by quadrant.  sin(-0) = -0 via the x == 0
 * select (r + r*(...) would give +0), sin(+-inf) = NaN. */
KE__VINLINE float ke_vsinf(float x)
{
    uint32_t q;
    float r = ke__trig_reduce(x, &q);
    float z = r * r;
    float s = ke__sin_poly(r, z);
    float c = ke__cos_poly(z);
    float y = ke__self(q & 1u, c, s);
    y = ke__asf(ke__asu(y) ^ ((q & 2u) << 30));
    return ke__self(x == 0.0f, x, y);
}

/* cos(x) = sin(x + pi/2): quadrant q + 1. cos(+-inf) = NaN. */
KE__VINLINE float ke_vcosf(float x)
{
    uint32_t q;
    float r = ke__trig_reduce(x, &q);
    float z = r * r;
    float s = ke__sin_poly(r, z);
    float c = ke__cos_poly(z);
    q = q + 1u;
    float y = ke__self(q & 1u, c, s);
    return ke__asf(ke__asu(y) ^ ((q & 2u) << 30));
}

/* tan(x) = sin(r)/cos(r) for even q, -cos(r)/sin(r) for odd q.  One division
 * of two ~1 ulp quantities; no separate tan polynomial (tan's poles at
 * +-pi/2 make a direct fit on [-pi/4, pi/4] long).  tan(-0) = -0. */
KE__VINLINE float ke_vtanf(float x)
{
    uint32_t q;
    float r = ke__trig_reduce(x, &q);
    float z = r * r;
    float s = ke__sin_poly(r, z);
    float c = ke__cos_poly(z);
    int odd = (int)(q & 1u);
    float y = ke__self(odd, -c, s) / ke__self(odd, s, c);
    return ke__self(x == 0.0f, x, y);
}

/* ==== Added for the 23 new ops (issue 12) ============================== */
/*
 * Several of these work in double internally (as ke_vgelu_tanhf and the trig
 * reduction do): a double holds a float's square exactly and makes the
 * argument transformations (1 - x, (2x - 1)/(1 - x), x + sqrt(x^2 + 1))
 * exact or nearly so, so that the result rounds about once.  Multiply-adds
 * go through KE__FMAD (or their product is exact), as everywhere in this file.
 */
/* c ? a : b for doubles, c a comparison result (see ke__self). */
KE__VINLINE double ke__seld(int c, double a, double b)
{
    uint64_t m = (uint64_t)0 - (uint64_t)(uint32_t)c;
    return ke__asd((ke__asu64(a) & m) | (ke__asu64(b) & ~m));
}

/* 1/sqrt(q) for finite q >= 0 in double, no libm (see ke_vrsqrtf: the same
 * seed and three Newton steps); finite for q = 0. */
KE__VINLINE double ke__rsqrtd(double q)
{
    double h = 0.5 * q;
    double y = ke__asd(0x5fe6eb50c7b537a9ull - (ke__asu64(q) >> 1));
    y = y * KE__FMAD(-(h * y), y, 1.5);
    y = y * KE__FMAD(-(h * y), y, 1.5);
    y = y * KE__FMAD(-(h * y), y, 1.5);
    return y;
}

/* sqrt(q) = q * rsqrt(q) for finite q >= 0; relative error about 2^-52.
 * sqrt(0) = 0 (a finite rsqrt times 0).  c + sqrt(q) is written
 * KE__FMAD(q, ke__rsqrtd(q), c) by its callers. */
KE__VINLINE double ke__sqrtd(double q) { return q * ke__rsqrtd(q); }

/* log1p(u) of a double u > -1 whose float rounding uh stays > -1 and finite:
 * log1p(uh) plus the first-order term of the rounding error ul = u - uh, so
 * rounding u to float costs nothing (log1p's sensitivity to u is <= 1). */
KE__VINLINE float ke__log1p_d(double u)
{
    float uh = (float)u;
    float ul = (float)(u - (double)uh);
    return ke__log1p_core(uh) + ul / (1.0f + uh);
}

/* log(x * 2^k) for finite x > 0: ke_vlogf's formula with the exponent moved
 * by k (exact), for the large-argument forms asinh(x) ~ log(2x). */
KE__VINLINE float ke__log_scaled(float x, int32_t k)
{
    int32_t ei;
    float f = ke__log_reduce(x, &ei);
    float e = (float)(ei + k);
    return KE__FMA(e, KE__LN2_HI, f + KE__FMA(e, KE__LN2_LO, ke__log1p_corr(f)));
}

/* ---- sinh, cosh ------------------------------------------------------ */

/*
 * sinh(|x|): below 1, (t + t/(t+1))/2 with t = expm1(|x|), which keeps full
 * relative accuracy for tiny x; from 1 on, h - 1/(4h) with h = e^|x|/2 taken
 * from the exp kernel as p * 2^(n-1) (exact halving, so it only overflows
 * where sinh does, past 89.4).  |x| is clamped at 90 (sinh(90) overflows).
 * Odd symmetry by OR-ing the sign back: sinh(-0) = -0, sinh(+-inf) = +-inf.
 */
KE__VINLINE float ke_vsinhf(float x)
{
    float a = ke__minf(ke__absf(x), 90.0f);
    float t = ke__expm1_core(ke__minf(a, 1.0f));
    float ys = 0.5f * (t + t / (t + 1.0f));
    int32_t n;
    float p = ke__exp_core(a, 0.0f, &n);
    float h = ke__scale(p, n - 1);
    float yb = h - 0.25f / h;
    float y = ke__self(a < 1.0f, ys, yb);
    return ke__asf(ke__asu(y) | ke__signbit(x));
}

/* cosh(x) = h + 1/(4h), h = e^|x|/2 as in sinh (no cancellation: both terms
 * are positive).  cosh(0) = 1, cosh(+-inf) = inf, NaN -> NaN. */
KE__VINLINE float ke_vcoshf(float x)
{
    float a = ke__minf(ke__absf(x), 90.0f);
    int32_t n;
    float p = ke__exp_core(a, 0.0f, &n);
    float h = ke__scale(p, n - 1);
    return h + 0.25f / h;
}

/* ---- asin, acos, atan ------------------------------------------------ */

/* (asin(sqrt z) - sqrt z) / (z sqrt z) on z in [0, 1/4], in double: a
 * degree-6 Chebyshev fit (numpy, references from mpmath), absolute error
 * 2.3e-10; it enters the result multiplied by z <= 1/4, far below float
 * precision. */
KE__VINLINE double ke__asin_poly(double z)
{
    double p = 0x1.fd4edcd9ca4d8p-6;
    p = KE__FMAD(p, z, 0x1.57c8e06d70cd5p-7);
    p = KE__FMAD(p, z, 0x1.833c5e74e4344p-6);
    p = KE__FMAD(p, z, 0x1.efe176880c6c9p-6);
    p = KE__FMAD(p, z, 0x1.6dc14ce8d886ep-5);
    p = KE__FMAD(p, z, 0x1.33331dd4117b3p-4);
    p = KE__FMAD(p, z, 0x1.5555555c6f3f8p-3);
    return p;
}
#define KE__PIO2D 0x1.921fb54442d18p+0
#define KE__PID 0x1.921fb54442d18p+1

/*
 * asin and acos from one kernel, all in double.  |x| < 1/2: asin(a) =
 * a + a z P(z), z = a^2.  |x| >= 1/2: asin(a) = pi/2 - 2 asin(s), s =
 * sqrt(z), z = (1 - a)/2 exactly (the classic fdlibm reduction), and
 * asin(s) = s + s z P(z) with the same P.  Each candidate is rounded to float
 * once and chosen by a float select.  Outside [-1, 1] NaN.
 */
KE__VINLINE float ke_vasinf(float x)
{
    double ad = (double)ke__absf(x);
    double zs = ad * ad;
    double ys = KE__FMAD(ad, zs * ke__asin_poly(zs), ad);
    double zb = (1.0 - ad) * 0.5;
    double s = ke__sqrtd(ke__seld(zb > 0.0, zb, 0.0));
    double yb = KE__FMAD(-2.0, KE__FMAD(s, zb * ke__asin_poly(zb), s), KE__PIO2D);
    float a = ke__absf(x);
    float y = ke__self(a < 0.5f, (float)ys, (float)yb);
    y = ke__asf(ke__asu(y) | ke__signbit(x));
    y = ke__self(a > 1.0f, __builtin_nanf(""), y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* acos(x): pi/2 - asin(x) for |x| < 1/2; 2 asin(s) for x >= 1/2 and
 * pi - 2 asin(s) for x <= -1/2 (s as in asin). acos(1) = +0, acos(-1) = pi. */
KE__VINLINE float ke_vacosf(float x)
{
    double xd = (double)x;
    double ad = (double)ke__absf(x);
    double zs = xd * xd;
    double ys = KE__PIO2D - KE__FMAD(xd, zs * ke__asin_poly(zs), xd);
    double zb = (1.0 - ad) * 0.5;
    double s = ke__sqrtd(ke__seld(zb > 0.0, zb, 0.0));
    double w = 2.0 * KE__FMAD(s, zb * ke__asin_poly(zb), s);
    float a = ke__absf(x);
    float yb = ke__self(x < 0.0f, (float)(KE__PID - w), (float)w);
    float y = ke__self(a < 0.5f, (float)ys, yb);
    y = ke__self(a > 1.0f, __builtin_nanf(""), y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* (atan(u) - u) / u^3 as a polynomial in z = u^2 on [0, tan^2(pi/8)], in
 * double: degree-6 Chebyshev fit, absolute error 1.8e-11 (times z <= 0.172). */
KE__VINLINE double ke__atan_poly(double z)
{
    double q = -0x1.4b79daede03fap-5;
    q = KE__FMAD(q, z, 0x1.24550a76aebf0p-4);
    q = KE__FMAD(q, z, -0x1.71d75c5d330e4p-4);
    q = KE__FMAD(q, z, 0x1.c6f6dda9c33e2p-4);
    q = KE__FMAD(q, z, -0x1.2491c25f254b6p-3);
    q = KE__FMAD(q, z, 0x1.9999982cd2bf4p-3);
    q = KE__FMAD(q, z, -0x1.55555555046c2p-2);
    return q;
}

/*
 * atan(|x|) = base + atan(u) with, in double (exactly, but for the one
 * division): u = a, base 0 for a <= tan(pi/8); u = (a - 1)/(a + 1), base
 * pi/4 up to tan(3pi/8); u = -1/a, base pi/2 above.  |u| <= tan(pi/8) then.
 * Sign by OR: atan(-0) = -0, atan(+-inf) = +-pi/2 (rounded), NaN -> NaN.
 */
KE__VINLINE float ke_vatanf(float x)
{
    float a = ke__absf(x);
    double ad = (double)a;
    int mid = a > 0x1.a827ap-2f;  /* ~tan(pi/8) */
    int hi = a > 0x1.3504f4p+1f;  /* ~tan(3pi/8) */
    double num = ke__seld(hi, -1.0, ke__seld(mid, ad - 1.0, ad));
    double den = ke__seld(hi, ad, ke__seld(mid, ad + 1.0, 1.0));
    double base = ke__seld(hi, KE__PIO2D, ke__seld(mid, 0.5 * KE__PIO2D, 0.0));
    double u = num / den;
    double z = u * u;
    double y = base + KE__FMAD(u, z * ke__atan_poly(z), u);
    float yf = (float)y;
    yf = ke__asf(ke__asu(yf) | ke__signbit(x));
    return ke__self(x != x, ke__qnan(x), yf);
}

/* ---- asinh, acosh, atanh --------------------------------------------- */

/*
 * asinh(|x|) = log1p(a + a^2/(1 + sqrt(1 + a^2))) with the argument formed in
 * double (a^2 exact, the square root to 2^-52) and handed to log1p as float
 * hi + lo (ke__log1p_d): no cancellation for small a, where the argument is
 * a itself plus a tiny term.  Above 2^28 asinh(a) = log(2a) to 2^-58.
 * Sign by OR: asinh(-0) = -0, asinh(+-inf) = +-inf, NaN -> NaN.
 */
KE__VINLINE float ke_vasinhf(float x)
{
    float a = ke__absf(x);
    float am = ke__minf(a, 0x1p28f);
    double ad = (double)am;
    double q = 1.0 + ad * ad; /* exact */
    double u = ad + ad * ad / KE__FMAD(q, ke__rsqrtd(q), 1.0); /* 1 + sqrt(q) */
    float ys = ke__log1p_d(u);
    float yb = ke__log_scaled(ke__maxf(ke__minf(a, 0x1.fffffep127f), 0x1p28f), 1);
    float y = ke__self(a > 0x1p28f, yb, ys);
    y = ke__self(a == __builtin_inff(), a, y);
    y = ke__asf(ke__asu(y) | ke__signbit(x));
    return ke__self(x != x, ke__qnan(x), y);
}

/* acosh(x) = log1p(t + sqrt(t (t + 2))), t = x - 1 (exact in double), which
 * is accurate near 1 where acosh ~ sqrt(2t); log(2x) above 2^28.  x < 1 ->
 * NaN, acosh(1) = 0, acosh(inf) = inf. */
KE__VINLINE float ke_vacoshf(float x)
{
    float xm = ke__maxf(ke__minf(x, 0x1p28f), 1.0f);
    double t = (double)xm - 1.0;
    double w = t * (t + 2.0);
    double v = KE__FMAD(w, ke__rsqrtd(w), t); /* t + sqrt(w) */
    float ys = ke__log1p_d(v);
    float yb = ke__log_scaled(ke__maxf(ke__minf(x, 0x1.fffffep127f), 0x1p28f), 1);
    float y = ke__self(x > 0x1p28f, yb, ys);
    y = ke__self(x == __builtin_inff(), x, y);
    y = ke__self(x < 1.0f, __builtin_nanf(""), y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* atanh(|x|) = log1p(2a/(1 - a))/2 with the quotient in double (1 - a is
 * exact there).  atanh(+-1) = +-inf, |x| > 1 -> NaN, atanh(-0) = -0. */
KE__VINLINE float ke_vatanhf(float x)
{
    float a = ke__absf(x);
    float am = ke__minf(a, 0x1.fffffep-1f);
    double ad = (double)am;
    float y = 0.5f * ke__log1p_d(2.0 * ad / (1.0 - ad));
    y = ke__self(a == 1.0f, __builtin_inff(), y);
    y = ke__asf(ke__asu(y) | ke__signbit(x));
    y = ke__self(a > 1.0f, __builtin_nanf(""), y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* ---- log10, logit ---------------------------------------------------- */

#define KE__LOG10_2D 0x1.34413509f79ffp-2  /* log10(2) */
#define KE__INVLN10D 0x1.bcb7b1526e50ep-2  /* 1/ln(10) */

/* log10(x) = e log10(2) + (f + corr)/ln10, summed in double from the exact
 * f and the small correction of the log kernel, rounded once.  Exact powers
 * of 10 come out exact.  Special values as log. */
KE__VINLINE float ke_vlog10f(float x)
{
    int32_t ei;
    float f = ke__log_reduce(x, &ei);
    double l = ((double)f + (double)ke__log1p_corr(f)) * KE__INVLN10D;
    float y = (float)KE__FMAD((double)ei, KE__LOG10_2D, l);
    y = ke__self(x < 0.0f, __builtin_nanf(""), y);
    y = ke__self(x == 0.0f, -__builtin_inff(), y);
    y = ke__self(x == __builtin_inff(), x, y);
    return ke__self(x != x, ke__qnan(x), y);
}

/*
 * logit(x) = log(x/(1 - x)).  Below 1/4 the quotient q (in double, 1 - x
 * exact) goes to log as float hi + lo; from 1/4 on, logit = log1p(w) with
 * w = (2x - 1)/(1 - x) in double, which keeps relative accuracy around
 * x = 1/2 where logit crosses 0.  logit(0) = -inf, logit(1) = inf, outside
 * [0, 1] NaN.  (PyTorch's eps clamp is applied by the caller.)
 */
KE__VINLINE float ke_vlogitf(float x)
{
    float xm = ke__maxf(ke__minf(x, 0x1.fffffep-1f), 0x1p-149f);
    double xd = (double)xm;
    double om = 1.0 - xd;
    double q = xd / om;
    float qh = (float)q;
    float ql = (float)(q - (double)qh);
    float ylo = ke_vlogf(qh) + ql / qh;
    float yhi = ke__log1p_d(KE__FMAD(2.0, xd, -1.0) / om);
    float y = ke__self(x < 0.25f, ylo, yhi);
    y = ke__self(x == 0.0f, -__builtin_inff(), y);
    y = ke__self(x == 1.0f, __builtin_inff(), y);
    y = ke__self((x < 0.0f) | (x > 1.0f), __builtin_nanf(""), y);
    return ke__self(x != x, ke__qnan(x), y);
}

/* ---- elu family, mish ------------------------------------------------ */

/* PyTorch's elu kernel: x <= 0 ? expm1(x * ic) * nc : x * pc, with the
 * three coefficients already in float (elu: nc = alpha, pc = ic = 1;
 * selu: nc = alpha*scale, pc = scale; celu: nc = alpha, ic = 1/alpha).
 * Error: expm1's plus two roundings (<= 3 ulp measured for selu). */
KE__VINLINE float ke_veluf(float x, float nc, float pc, float ic)
{
    float xn = ke__minf(ke__maxf(x * ic, -18.0f), 89.0f); /* ic < 0 (celu) makes it positive */
    float e = ke__expm1_core(xn);
    float neg = ke__self(xn == 0.0f, xn, e) * nc; /* expm1(-0) = -0 */
    return ke__self(x <= 0.0f, neg, x * pc);
}
#define KE__SELU_ALPHA 1.6732632423543772848170429916717
#define KE__SELU_SCALE 1.0507009873554804934193349852946

/*
 * mish(x) = x tanh(softplus(x)) = x T(T+2) / (T(T+2) + 2), T = e^x, which
 * has no cancellation anywhere.  T = p * 2^n comes from the float exp kernel
 * (its only sizeable error, and mish's sensitivity to T is <= 1); the ratio
 * and the products are formed in double, where 2^n (n in [-182, 29]) and the
 * subnormal range of float are ordinary numbers, and rounded once.  Above 20
 * mish(x) = x to float precision; below -126 the result is below 2^-150: -0
 * (the limit at -inf; PyTorch's formula gives NaN there).  mish(-0) = -0,
 * NaN -> NaN.
 */
KE__VINLINE float ke_vmishf(float x)
{
    float xc = ke__maxf(ke__minf(x, 20.0f), -126.0f);
    int32_t n;
    float p = ke__exp_core(xc, 0.0f, &n);
    double T = (double)p * ke__asd((uint64_t)(uint32_t)(n + 1023) << 52);
    double q = (T + 2.0) / KE__FMAD(T, T + 2.0, 2.0);
    float y = (float)((double)xc * T * q);
    y = ke__self(x > 20.0f, x, y);
    return ke__self(x < -126.0f, -0.0f, y);
}

/* ---- binary: hypot --------------------------------------------------- */

/* hypot(x, y) = sqrt(x^2 + y^2) in double: both squares are exact there and
 * cannot overflow or underflow, so the only roundings are the sum, the square
 * root (2^-52) and the final one (<= 0.5 ulp + 2^-29).  An infinite operand
 * gives +inf even with a NaN other (C99, PyTorch); otherwise NaN -> NaN. */
KE__VINLINE float ke_vhypotf(float x, float y)
{
    double xd = (double)x, yd = (double)y;
    float r = (float)ke__sqrtd(KE__FMAD(xd, xd, yd * yd)); /* exact products */
    /* | rather than ||: no branch, so the loops calling this vectorize */
    int inf = (int)(ke__absf(x) == __builtin_inff()) | (int)(ke__absf(y) == __builtin_inff());
    return ke__self(inf, __builtin_inff(), r);
}

/* ---- pow ------------------------------------------------------------- */

/*
 * pow(x, y) = 2^(y log2|x|), in double from end to end: log2|x| to about
 * 2^-52 relative, y times it (one rounding), 2^t to 2^-50, then one rounding
 * to float, which also gives the right overflow to inf and gradual
 * underflow (double holds every 2^t the float range needs).  The error
 * before that rounding is at most about 2^-44 relative (|t| <= 150), so the
 * result is the correctly rounded pow except within ~2^-20 ulp of a
 * rounding boundary, and exact halfway cases are recognized (see below):
 * <= 0.5 ulp measured over 5 * 2^20 pairs, none misrounded
 * (tests/test_vmath.c).  No table: the polynomials are long instead (fits
 * by mpmath's chebyfit, errors quoted after rounding the coefficients).
 */

/* log2(a) for finite a > 0 (others give garbage, for the caller's selects):
 * a = m 2^e with m in [sqrt(1/2), sqrt(2)) taken from the bits (subnormal a
 * scaled by 2^23 first), then ln m = 2 atanh(s) = 2s + s z Q(z) with
 * s = (m - 1)/(m + 1) (m - 1 and m + 1 exact in double, one rounded
 * division) and z = s^2 <= 0.0295.  Q: degree 6, relative error of ln m
 * 2^-57.  log2(1) = 0 exactly, so integer powers of 2 stay exact. */
KE__VINLINE double ke__log2_d(float a)
{
    int sub = a < 0x1p-126f;
    float as = ke__self(sub, a * 0x1p23f, a);
    uint32_t t = ke__asu(as) - 0x3f3504f3u; /* bits of sqrt(1/2) rounded */
    int32_t e = ((int32_t)t >> 23) - ke__seli(sub, 23, 0);
    double m = (double)ke__asf(ke__asu(as) - (t & 0xff800000u));
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double q = 0x1.2b5f68a50d903p-3;
    q = KE__FMAD(q, z, 0x1.39fdcceb4bb45p-3);
    q = KE__FMAD(q, z, 0x1.7462b91b8df65p-3);
    q = KE__FMAD(q, z, 0x1.c71c62d5e53e0p-3);
    q = KE__FMAD(q, z, 0x1.2492492dfd86cp-2);
    q = KE__FMAD(q, z, 0x1.9999999995273p-2);
    q = KE__FMAD(q, z, 0x1.5555555555558p-1);
    double lnm = KE__FMAD(s * z, q, 2.0 * s);
    return KE__FMAD(lnm, 0x1.71547652b82fep+0 /* 1/ln 2 */, (double)e);
}

/* 2^t for t in [-200, 200] (NaN: garbage): t = k + r with k = round(t)
 * (|r| <= 1/2, exact), 2^r = 1 + r P(r) with P of degree 9 (relative error
 * 2^-50.6; 2^0 = 1 exactly), times 2^k built in the exponent field.  The
 * low bits of t + 1.5*2^52 hold k + 2^51; adding the bias and shifting
 * leaves (k + 1023) << 52 (unsigned arithmetic: no UB for garbage t). */
KE__VINLINE double ke__exp2_d(double t)
{
    double sh = t + 0x1.8p52;
    double k = sh - 0x1.8p52;
    double r = t - k;
    double p = 0x1.e5ea1242d6602p-28;
    p = KE__FMAD(p, r, 0x1.b6573d402f8e6p-24);
    p = KE__FMAD(p, r, 0x1.62bfe45469585p-20);
    p = KE__FMAD(p, r, 0x1.ffcb765d2594fp-17);
    p = KE__FMAD(p, r, 0x1.430913037bab9p-13);
    p = KE__FMAD(p, r, 0x1.5d87fe9096e32p-10);
    p = KE__FMAD(p, r, 0x1.3b2ab6fba3856p-7);
    p = KE__FMAD(p, r, 0x1.c6b08d70440f2p-5);
    p = KE__FMAD(p, r, 0x1.ebfbdff82c590p-3);
    p = KE__FMAD(p, r, 0x1.62e42fefa39f7p-1);
    double scale = ke__asd((ke__asu64(sh) + 1023u) << 52);
    return KE__FMAD(r, p, 1.0) * scale;
}

/*
 * pow as C99 Annex F (and PyTorch) define it, special cases by selects after
 * the general path: pow(x, +-0) = 1 even for NaN x and pow(1, y) = 1 even
 * for NaN y; pow(-1, +-inf) = 1; otherwise NaN in, NaN out; a finite x < 0
 * to a finite non-integer y is NaN; an odd integer y keeps the sign of x
 * (-0 and -inf too); +-0 and +-inf bases give 0 or inf by the sign of y;
 * y = +-inf gives 0 or inf by |x| < 1 (t clamped to +-200 gets there).
 * Integer y: |y| < 2^23 is one if y + 2^23 is exact; odd below 2^24 if y/2
 * is not an integer; from 2^24 on every float is even.
 */
KE__VINLINE float ke_vpowf(float x, float y)
{
    float ax = ke__absf(x), ay = ke__absf(y);
    double t = (double)y * ke__log2_d(ax);
    t = ke__seld(t > 200.0, 200.0, ke__seld(t < -200.0, -200.0, t));
    double rd = ke__exp2_d(t);
    /* An exact result halfway between two floats (x^y with 25 significant
     * bits: 4097^2, 321^3, 103041^1.5) must round to even, but rd is only
     * within ~2^-44 of it and may lie on either side.  Such a result needs
     * y > 0 and 2y an integer k <= 32 (x = m 2^e with m odd > 1: m^k has at
     * most 50 bits), so for those y: mid = rd rounded to 25 bits (from the
     * bits: integer arithmetic, nothing to contract), and if mid^2 equals
     * |x|^k (both exact in double then; |x|^k by squaring, selects for the
     * bits of k) rd is replaced by mid, whose conversion breaks the tie by
     * the rule.  Results in the subnormal range are left as they are. */
    float k2 = 2.0f * ay;
    int half = (y > 0.0f) & (k2 <= 32.0f) & (((k2 + 0x1p23f) - 0x1p23f) == k2);
    uint32_t kb = ke__asu(k2 + 0x1p23f) - ke__asu(0x1p23f);
    double b = (double)ax, pk = 1.0;
    for (int j = 0; j < 6; j++) {
        pk = ke__seld((int)((kb >> j) & 1u), pk * b, pk);
        b = b * b;
    }
    double mid = ke__asd((ke__asu64(rd) + (1ull << 27)) & ~((1ull << 28) - 1u));
    rd = ke__seld(half & (pk == mid * mid) & (rd >= 0x1p-126), mid, rd);
    float r = (float)rd;
    float h = 0.5f * ay;
    int yint = (ay >= 0x1p23f) | (((ay + 0x1p23f) - 0x1p23f) == ay);
    int yodd = yint & (ay < 0x1p24f) & (((h + 0x1p23f) - 0x1p23f) != h);
    int zero_inf = (ax == 0.0f) | (ax == __builtin_inff());
    r = ke__self(zero_inf, ke__self((ax == 0.0f) == (y < 0.0f), __builtin_inff(), 0.0f), r);
    r = ke__asf(ke__asu(r) | (ke__signbit(x) & (0u - (uint32_t)yodd)));
    r = ke__self((x < 0.0f) & (ax < __builtin_inff()) & !yint, __builtin_nanf(""), r);
    r = ke__self((x != x) | (y != y), x + y, r);
    return ke__self((y == 0.0f) | (x == 1.0f) | ((ax == 1.0f) & (ay == __builtin_inff())), 1.0f, r);
}

/* ---- atan2 ----------------------------------------------------------- */

/*
 * atan2(y, x) in double, rounded once: u = min(|x|, |y|) / max(|x|, |y|)
 * (one rounding; the quotient of two floats never leaves double's normal
 * range), atan(u) on [0, 1] as in ke_vatanf (base pi/4 and (u - 1)/(u + 1)
 * above tan(pi/8)), then pi/2 - that when |y| > |x|, pi - that when x is
 * negative (-0 and -inf included), and y's sign by OR.  0/0 is taken as
 * u = 0 and inf/inf as u = 1, which gives C99's table: atan2(+-0, -0) =
 * +-pi, atan2(+-0, +0) = +-0, atan2(+-inf, -inf) = +-3pi/4, atan2(+-y,
 * -inf) = +-pi, atan2(+-inf, x) = +-pi/2, ...  NaN -> NaN.
 */
KE__VINLINE float ke_vatan2f(float y, float x)
{
    float ay = ke__absf(y), ax = ke__absf(x);
    int swap = ay > ax;
    double num = (double)ke__self(swap, ax, ay), den = (double)ke__self(swap, ay, ax);
    double u = num / den;
    u = ke__seld(den == 0.0, 0.0, ke__seld(num == (double)__builtin_inff(), 1.0, u));
    int mid = u > 0x1.a827999fcef32p-2; /* tan(pi/8) */
    double v = ke__seld(mid, (u - 1.0) / (u + 1.0), u);
    double z = v * v;
    double a = ke__seld(mid, 0.5 * KE__PIO2D, 0.0) + KE__FMAD(v, z * ke__atan_poly(z), v);
    a = ke__seld(swap, KE__PIO2D - a, a);
    a = ke__seld(ke__signbit(x) != 0u, KE__PID - a, a);
    float r = ke__asf(ke__asu((float)a) | ke__signbit(y));
    return ke__self((x != x) | (y != y), x + y, r);
}

#endif /* KILN_EAGER_VMATH_H */
