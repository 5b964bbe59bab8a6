/*
 * test_vmath.c - accuracy and special-value tests for src/eager/vmath.h.
 *
 * For every ke_v* function: evaluate a dense set of inputs (a strided sweep of
 * all 2^32 float bit patterns with pseudo-random low bits, so every sign and
 * binade and "ugly" mantissas are covered; a uniform sweep over the range
 * where the function is not saturated; special values; and for sin/cos/tan
 * the floats nearest to k*pi/2, where range reduction is hardest), compare
 * with the libm double-precision function (or a double formula) and compute
 * the max error in ulps of the float nearest to the reference.  A table is
 * printed and the bounds from the header's contract are asserted.
 *
 * Evaluation goes through apply_<name>() loops over arrays (no function
 * pointer inside the loop, fixed-size inner blocks with restrict pointers) so
 * that the compiler's vectorized path is the one being tested; the table of
 * cases only holds pointers to these whole-array loops.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

/* Inner trip count is a compile-time constant (and a multiple of every
 * vector width) so even GCC's -O2 "very cheap" vectorizer can take it. */
#define BLOCK 4096

#define KE_APPLY(name)                                                        \
    static void apply_##name(const float *restrict x, float *restrict y,      \
                             size_t n)                                        \
    {                                                                         \
        for (size_t b = 0; b < n; b += BLOCK)                                 \
            for (size_t i = 0; i < BLOCK; i++)                                \
                y[b + i] = ke_v##name##f(x[b + i]);                           \
    }

KE_APPLY(exp)
KE_APPLY(exp2)
KE_APPLY(expm1)
KE_APPLY(log)
KE_APPLY(log2)
KE_APPLY(log1p)
KE_APPLY(tanh)
KE_APPLY(sigmoid)
KE_APPLY(erf)
KE_APPLY(sin)
KE_APPLY(cos)
KE_APPLY(tan)
KE_APPLY(gelu_tanh)
KE_APPLY(gelu_erf)
KE_APPLY(silu)
KE_APPLY(softplus)
KE_APPLY(rsqrt)
KE_APPLY(sinh)
KE_APPLY(cosh)
KE_APPLY(asin)
KE_APPLY(acos)
KE_APPLY(atan)
KE_APPLY(asinh)
KE_APPLY(acosh)
KE_APPLY(atanh)
KE_APPLY(log10)
KE_APPLY(logit)
KE_APPLY(mish)
/* selu: the elu kernel with selu's coefficients rounded to float, as PyTorch */
static inline float ke_vseluf(float x)
{
    return ke_veluf(x, (float)KE__SELU_ALPHA * (float)KE__SELU_SCALE, (float)KE__SELU_SCALE, 1.0f);
}
KE_APPLY(selu)

/* ---------------------------------------------------------------------- */
/* Double-precision references.  Where the float function documents a     */
/* limit instead of PyTorch's NaN (silu/gelu at -inf) the reference does   */
/* the same.  Sigmoid forms avoid 1 + tanh cancellation so the reference   */
/* itself stays accurate in the tails.                                     */
/* ---------------------------------------------------------------------- */
static double ref_sigmoid_d(double z)
{
    return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
}
static double ref_exp(double x) { return exp(x); }
static double ref_exp2(double x) { return exp2(x); }
static double ref_expm1(double x) { return expm1(x); }
static double ref_log(double x) { return log(x); }
static double ref_log2(double x) { return log2(x); }
static double ref_log1p(double x) { return log1p(x); }
static double ref_tanh(double x) { return tanh(x); }
static double ref_sigmoid(double x) { return ref_sigmoid_d(x); }
static double ref_erf(double x) { return erf(x); }
static double ref_sin(double x) { return sin(x); }
static double ref_cos(double x) { return cos(x); }
static double ref_tan(double x) { return tan(x); }
static double ref_gelu_tanh(double x)
{
    if (isinf(x)) return x > 0 ? x : -0.0;
    double z = 2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x * ref_sigmoid_d(z);
}
static double ref_gelu_erf(double x)
{
    if (isinf(x)) return x > 0 ? x : -0.0;
    return 0.5 * x * erfc(-x / sqrt(2.0));
}
static double ref_silu(double x)
{
    if (isinf(x)) return x > 0 ? x : -0.0;
    return x * ref_sigmoid_d(x);
}
static double ref_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }
static double ref_rsqrt(double x) { return 1.0 / sqrt(x); }
static double ref_sinh(double x) { return sinh(x); }
static double ref_cosh(double x) { return cosh(x); }
static double ref_asin(double x) { return asin(x); }
static double ref_acos(double x) { return acos(x); }
static double ref_atan(double x) { return atan(x); }
static double ref_asinh(double x) { return asinh(x); }
static double ref_acosh(double x) { return acosh(x); }
static double ref_atanh(double x) { return atanh(x); }
static double ref_log10(double x) { return log10(x); }
/* logit: log1p form near 1/2 so the reference keeps relative accuracy */
static double ref_logit(double x) { return x < 0.25 || x > 0.75 ? log(x / (1.0 - x)) : log1p((2.0 * x - 1.0) / (1.0 - x)); }
static double ref_mish(double x)
{
    if (isinf(x)) return x > 0 ? x : -0.0;
    double t = exp(x);
    return x > 20 ? x : x * (t * (t + 2.0)) / (t * (t + 2.0) + 2.0);
}
/* the coefficients as the float kernel has them (rounded to float) */
static double ref_selu(double x)
{
    double nc = (double)((float)KE__SELU_ALPHA * (float)KE__SELU_SCALE), pc = (double)(float)KE__SELU_SCALE;
    return x <= 0 ? expm1(x) * nc : x * pc;
}

/* Error of y in ulps of the float nearest to ref (ulp of a subnormal or zero
 * result is 2^-149).  NaN/inf must match exactly; an overflow to inf counts as
 * 2^128 so "inf instead of FLT_MAX" is measured, not infinite. */
static double ulp_err(float y, double ref)
{
    if (isnan(ref)) return isnan(y) ? 0.0 : INFINITY;
    if (isnan(y)) return INFINITY;
    if (isinf(ref)) return (double)y == ref ? 0.0 : INFINITY;
    float fr = (float)ref;
    double u;
    if (isinf(fr)) { /* correctly rounded result is +-inf */
        if (y == fr) return 0.0;
        u = 0x1p104;
    } else {
        int e;
        frexp(fabs((double)fr), &e); /* |fr| in [2^(e-1), 2^e) */
        u = ldexp(1.0, e - 24);
        if (fr == 0.0f || u < 0x1p-149) u = 0x1p-149;
    }
    double yd = isinf(y) ? copysign(0x1p128, (double)y) : (double)y;
    return fabs(yd - ref) / u;
}

/* ---------------------------------------------------------------------- */
/* Input generation                                                       */
/* ---------------------------------------------------------------------- */
typedef struct {
    float *x;
    size_t n, cap;
} vec_t;

static void push(vec_t *v, float x)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1 << 20;
        v->x = realloc(v->x, v->cap * sizeof(float));
        assert_non_null(v->x);
    }
    v->x[v->n++] = x;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t mix(uint32_t h) /* cheap integer hash for low-bit jitter */
{
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    return h ^ (h >> 16);
}

/* Floats worth testing for every function: signed zeros, infinities, NaNs,
 * subnormal and normal boundaries, and the overflow / underflow edges of the
 * exp-like functions. */
static const float k_special[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN,
    0x1p-149f, -0x1p-149f, 0x1p-140f, 0x1.fffffcp-127f, -0x1.fffffcp-127f,
    0x1p-126f, -0x1p-126f, FLT_MIN, FLT_MAX, -FLT_MAX, FLT_EPSILON,
    1.0f, -1.0f, 0.5f, -0.5f, 2.0f, 20.0f, 20.000002f, 19.999998f,
    88.72283f, 88.72284f, 88.7f, 89.0f, 128.0f, 127.99999f, 129.0f,
    -87.33654f, -87.4f, -100.0f, -103.97f, -103.98f, -104.0f, -149.0f,
    -149.5f, -150.0f, -151.0f, -17.3f, -18.0f, -1.0000001f, -0.99999994f,
    9.0f, 9.1f, 3.9f, 3.92f, 4.0f, 10.0f, 14.85f, -14.3f, -14.85f, -15.0f,
    -108.0f, -109.0f, -126.0f, -127.0f, 1e4f, -1e4f, 1e30f, -1e30f,
    0.70710677f, 1.4142135f, 0.70710671f, 1.4142137f, 1e-30f, -1e-30f,
};

/* Whole-float-line sweep: 2^21 bit patterns (stride 2^11) with hashed low
 * bits, keeping those with lo <= x <= hi (NaNs are kept once via specials). */
static void add_bit_sweep(vec_t *v, float lo, float hi)
{
    for (uint32_t i = 0; i < (1u << 21); i++) {
        float x = from_bits((i << 11) | (mix(i) & 0x7ffu));
        if (x >= lo && x <= hi) push(v, x);
    }
}

/* n evenly spaced points in [lo, hi] (the interesting, non-saturated range). */
static void add_linear(vec_t *v, double lo, double hi, size_t n)
{
    for (size_t i = 0; i < n; i++) push(v, (float)(lo + (hi - lo) * (double)i / (double)(n - 1)));
}

/* The floats nearest to +-k*pi/2 and their neighbours, for k = kmin, kmin +
 * step, ... <= kmax: where the reduced argument is smallest, i.e. where a
 * reduction with too few bits of pi/2 loses the most relative accuracy. */
static void add_pio2_multiples(vec_t *v, double kmin, double kmax, double step)
{
    for (double k = kmin; k <= kmax; k += step) {
        for (int sgn = -1; sgn <= 1; sgn += 2) {
            float c = (float)(sgn * k * 1.5707963267948966192);
            uint32_t u;
            memcpy(&u, &c, 4);
            for (int d = -2; d <= 2; d++) push(v, from_bits(u + (uint32_t)d));
        }
    }
}

static void pad_block(vec_t *v)
{
    while (v->n % BLOCK) push(v, 1.0f);
}

/* ---------------------------------------------------------------------- */
/* The accuracy cases                                                     */
/* ---------------------------------------------------------------------- */
typedef void (*apply_fn)(const float *restrict, float *restrict, size_t);

typedef struct {
    const char *name;
    apply_fn apply;
    double (*ref)(double);
    float lo, hi;           /* bit-sweep domain (asserted) */
    double lin_lo, lin_hi;  /* dense uniform sweep */
    double bound;           /* asserted max ulp */
    int pio2;               /* add k*pi/2 neighbourhoods */
} case_t;

static case_t k_cases[] = { /* non-const: handed to cmocka as test state */
    {"exp", apply_exp, ref_exp, -INFINITY, INFINITY, -104, 89, 2, 0},
    {"exp2", apply_exp2, ref_exp2, -INFINITY, INFINITY, -151, 129, 2, 0},
    {"expm1", apply_expm1, ref_expm1, -INFINITY, INFINITY, -18, 89, 3, 0},
    {"log", apply_log, ref_log, -INFINITY, INFINITY, 0, 4, 2, 0},
    {"log2", apply_log2, ref_log2, -INFINITY, INFINITY, 0, 4, 2, 0},
    {"log1p", apply_log1p, ref_log1p, -INFINITY, INFINITY, -1, 4, 3, 0},
    {"tanh", apply_tanh, ref_tanh, -INFINITY, INFINITY, -10, 10, 4, 0},
    {"sigmoid", apply_sigmoid, ref_sigmoid, -INFINITY, INFINITY, -110, 20, 4, 0},
    {"erf", apply_erf, ref_erf, -INFINITY, INFINITY, -4.5, 4.5, 4, 0},
    {"sin", apply_sin, ref_sin, -1e4f, 1e4f, -1e4, 1e4, 4, 1},
    {"cos", apply_cos, ref_cos, -1e4f, 1e4f, -1e4, 1e4, 4, 1},
    {"tan", apply_tan, ref_tan, -1e4f, 1e4f, -1e4, 1e4, 6, 1},
    {"gelu_tanh", apply_gelu_tanh, ref_gelu_tanh, -INFINITY, INFINITY, -12, 12, 4, 0},
    {"gelu_erf", apply_gelu_erf, ref_gelu_erf, -INFINITY, INFINITY, -15, 15, 4, 0},
    {"silu", apply_silu, ref_silu, -INFINITY, INFINITY, -110, 30, 4, 0},
    {"softplus", apply_softplus, ref_softplus, -INFINITY, INFINITY, -110, 25, 3, 0},
    {"rsqrt", apply_rsqrt, ref_rsqrt, -INFINITY, INFINITY, 0, 4, 1, 0},
    {"sinh", apply_sinh, ref_sinh, -INFINITY, INFINITY, -90, 90, 3, 0},
    {"cosh", apply_cosh, ref_cosh, -INFINITY, INFINITY, -90, 90, 2, 0},
    {"asin", apply_asin, ref_asin, -INFINITY, INFINITY, -1, 1, 1, 0},
    {"acos", apply_acos, ref_acos, -INFINITY, INFINITY, -1, 1, 1, 0},
    {"atan", apply_atan, ref_atan, -INFINITY, INFINITY, -10, 10, 1, 0},
    {"asinh", apply_asinh, ref_asinh, -INFINITY, INFINITY, -10, 10, 3, 0},
    {"acosh", apply_acosh, ref_acosh, -INFINITY, INFINITY, 1, 10, 3, 0},
    {"atanh", apply_atanh, ref_atanh, -INFINITY, INFINITY, -1, 1, 3, 0},
    {"log10", apply_log10, ref_log10, -INFINITY, INFINITY, 0, 4, 1, 0},
    {"logit", apply_logit, ref_logit, -INFINITY, INFINITY, 0, 1, 3, 0},
    {"mish", apply_mish, ref_mish, -INFINITY, INFINITY, -110, 30, 2, 0},
    {"selu", apply_selu, ref_selu, -INFINITY, INFINITY, -20, 5, 2, 0},
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])
_Static_assert(N_CASES == 29, "keep main()'s UT() list in sync with k_cases");

static double g_maxulp[N_CASES];
static size_t g_points[N_CASES];

/* One accuracy case; the case_t comes in as the test's initial state. */
static void test_ulp(void **state)
{
    const case_t *c = *state;
    size_t idx = (size_t)(c - k_cases);
    vec_t v = {0};
    for (size_t i = 0; i < sizeof k_special / sizeof k_special[0]; i++) {
        float s = k_special[i]; /* finite specials only inside the asserted domain */
        if (!isfinite(s) || (s >= c->lo && s <= c->hi)) push(&v, s);
    }
    add_bit_sweep(&v, c->lo, c->hi);
    add_linear(&v, c->lin_lo, c->lin_hi, 1u << 20);
    if (c->pio2) add_pio2_multiples(&v, 1, 6366, 1); /* 6366 * pi/2 < 1e4 */
    pad_block(&v);

    float *y = malloc(v.n * sizeof(float));
    assert_non_null(y);
    c->apply(v.x, y, v.n);

    double worst = 0.0;
    float worst_x = 0.0f, worst_y = 0.0f;
    for (size_t i = 0; i < v.n; i++) {
        double e = ulp_err(y[i], c->ref((double)v.x[i]));
        if (!(e <= worst)) { /* also catches NaN errors */
            worst = e;
            worst_x = v.x[i];
            worst_y = y[i];
        }
    }
    g_maxulp[idx] = worst;
    g_points[idx] = v.n;
    print_message("%-10s %9zu pts  max %6.3f ulp  (bound %.0f)  at x=%a -> %a, ref %a\n",
                  c->name, v.n, worst, c->bound, (double)worst_x, (double)worst_y,
                  c->ref((double)worst_x));
    free(y);
    free(v.x);
    assert_true(worst <= c->bound);
}

/* sin/cos/tan beyond the contract range: reduction is still exact up to
 * |x| ~ 8.4e8 (documented in vmath.h), so check that claim too. */
static void test_trig_large(void **state)
{
    (void)state;
    vec_t v = {0};
    add_bit_sweep(&v, 1e4f, 8.4e8f);
    add_bit_sweep(&v, -8.4e8f, -1e4f);
    add_pio2_multiples(&v, 6367, 5.3e8, 5297); /* 5.3e8 * pi/2 < 8.4e8 */
    pad_block(&v);
    float *y = malloc(v.n * sizeof(float));
    assert_non_null(y);
    static const struct {
        const char *n;
        apply_fn f;
        double (*r)(double);
        double b;
    } t[] = {{"sin", apply_sin, ref_sin, 4}, {"cos", apply_cos, ref_cos, 4},
             {"tan", apply_tan, ref_tan, 6}};
    for (size_t k = 0; k < 3; k++) {
        t[k].f(v.x, y, v.n);
        double worst = 0.0;
        for (size_t i = 0; i < v.n; i++) {
            double e = ulp_err(y[i], t[k].r((double)v.x[i]));
            if (!(e <= worst)) worst = e;
        }
        print_message("%-10s %9zu pts  max %6.3f ulp  on 1e4 < |x| <= 8.4e8\n", t[k].n, v.n, worst);
        assert_true(worst <= t[k].b);
    }
    /* Far beyond: no accuracy promise, but results must stay in [-1, 1]. */
    float big[BLOCK], out[BLOCK];
    for (size_t i = 0; i < BLOCK; i++) big[i] = from_bits(0x4f000000u + (uint32_t)i * 0x7f3a1u);
    for (int k = 0; k < 2; k++) {
        (k ? apply_cos : apply_sin)(big, out, BLOCK);
        for (size_t i = 0; i < BLOCK; i++)
            assert_true(isfinite(big[i]) ? fabsf(out[i]) <= 1.0f : isnan(out[i]));
    }
    free(y);
    free(v.x);
}

/* ---------------------------------------------------------------------- */
/* Exact special values (through the same array loops)                    */
/* ---------------------------------------------------------------------- */
static float eval1(apply_fn f, float x)
{
    static float in[BLOCK], out[BLOCK];
    for (size_t i = 0; i < BLOCK; i++) in[i] = x;
    f(in, out, BLOCK);
    return out[BLOCK - 1];
}

#define IS_PZERO(v) ((v) == 0.0f && !signbit(v))
#define IS_NZERO(v) ((v) == 0.0f && signbit(v))

static void test_special_values(void **state)
{
    (void)state;
    const float inf = INFINITY;
    /* exp family */
    assert_true(isnan(eval1(apply_exp, NAN)));
    assert_true(eval1(apply_exp, inf) == inf);
    assert_true(IS_PZERO(eval1(apply_exp, -inf)));
    assert_true(eval1(apply_exp, 88.72284f) == inf);     /* just past overflow */
    assert_true(isfinite(eval1(apply_exp, 88.72283f)));  /* just below */
    assert_true(eval1(apply_exp, 88.72283f) > 3.4e38f);
    assert_true(IS_PZERO(eval1(apply_exp, -104.0f)));   /* below 2^-150 */
    assert_true(eval1(apply_exp, -103.0f) > 0.0f);       /* gradual underflow */
    assert_true(eval1(apply_exp, -103.2789f) == 0x1p-149f);
    assert_true(eval1(apply_exp, 0.0f) == 1.0f);
    assert_true(eval1(apply_exp2, 3.0f) == 8.0f);
    assert_true(eval1(apply_exp2, -149.0f) == 0x1p-149f);
    assert_true(eval1(apply_exp2, 128.0f) == inf);
    assert_true(IS_PZERO(eval1(apply_exp2, -inf)));
    assert_true(isnan(eval1(apply_exp2, NAN)));
    assert_true(IS_NZERO(eval1(apply_expm1, -0.0f)));
    assert_true(eval1(apply_expm1, -inf) == -1.0f);
    assert_true(eval1(apply_expm1, inf) == inf);
    assert_true(eval1(apply_expm1, 0x1p-140f) == 0x1p-140f);
    assert_true(isnan(eval1(apply_expm1, NAN)));
    /* log family */
    assert_true(eval1(apply_log, 0.0f) == -inf);
    assert_true(eval1(apply_log, -0.0f) == -inf);
    assert_true(isnan(eval1(apply_log, -1.0f)));
    assert_true(isnan(eval1(apply_log, -inf)));
    assert_true(isnan(eval1(apply_log, NAN)));
    assert_true(eval1(apply_log, inf) == inf);
    assert_true(IS_PZERO(eval1(apply_log, 1.0f)));
    assert_true(fabsf(eval1(apply_log, 0x1p-149f) - (float)(-149 * 0.69314718055994531)) <= 1e-5f);
    assert_true(eval1(apply_log2, 0x1p-149f) == -149.0f);
    assert_true(eval1(apply_log2, 1024.0f) == 10.0f);
    assert_true(eval1(apply_log2, 0.0f) == -inf);
    assert_true(isnan(eval1(apply_log2, -2.0f)));
    assert_true(eval1(apply_log2, inf) == inf);
    assert_true(eval1(apply_log1p, -1.0f) == -inf);
    assert_true(isnan(eval1(apply_log1p, -1.5f)));
    assert_true(IS_NZERO(eval1(apply_log1p, -0.0f)));
    assert_true(eval1(apply_log1p, inf) == inf);
    assert_true(eval1(apply_log1p, 0x1p-149f) == 0x1p-149f);
    assert_true(isnan(eval1(apply_log1p, NAN)));
    /* tanh / sigmoid / erf */
    assert_true(eval1(apply_tanh, inf) == 1.0f);
    assert_true(eval1(apply_tanh, -inf) == -1.0f);
    assert_true(IS_NZERO(eval1(apply_tanh, -0.0f)));
    assert_true(eval1(apply_tanh, -0x1p-149f) == -0x1p-149f);
    assert_true(isnan(eval1(apply_tanh, NAN)));
    assert_true(IS_PZERO(eval1(apply_sigmoid, -inf)));
    assert_true(eval1(apply_sigmoid, inf) == 1.0f);
    assert_true(eval1(apply_sigmoid, 0.0f) == 0.5f);
    assert_true(eval1(apply_sigmoid, -100.0f) > 0.0f);
    assert_true(isnan(eval1(apply_sigmoid, NAN)));
    assert_true(eval1(apply_erf, inf) == 1.0f);
    assert_true(eval1(apply_erf, -inf) == -1.0f);
    assert_true(IS_NZERO(eval1(apply_erf, -0.0f)));
    assert_true(isnan(eval1(apply_erf, NAN)));
    /* trig */
    assert_true(isnan(eval1(apply_sin, inf)));
    assert_true(isnan(eval1(apply_sin, -inf)));
    assert_true(isnan(eval1(apply_cos, inf)));
    assert_true(isnan(eval1(apply_tan, -inf)));
    assert_true(isnan(eval1(apply_sin, NAN)));
    assert_true(IS_NZERO(eval1(apply_sin, -0.0f)));
    assert_true(IS_NZERO(eval1(apply_tan, -0.0f)));
    assert_true(eval1(apply_cos, 0.0f) == 1.0f);
    assert_true(eval1(apply_sin, 0x1p-149f) == 0x1p-149f);
    /* activations */
    assert_true(eval1(apply_gelu_tanh, inf) == inf);
    assert_true(IS_NZERO(eval1(apply_gelu_tanh, -inf)));
    assert_true(IS_NZERO(eval1(apply_gelu_tanh, -0.0f)));
    assert_true(isnan(eval1(apply_gelu_tanh, NAN)));
    assert_true(eval1(apply_gelu_erf, inf) == inf);
    assert_true(IS_NZERO(eval1(apply_gelu_erf, -inf)));
    assert_true(IS_NZERO(eval1(apply_gelu_erf, -0.0f)));
    assert_true(isnan(eval1(apply_gelu_erf, NAN)));
    assert_true(eval1(apply_silu, inf) == inf);
    assert_true(IS_NZERO(eval1(apply_silu, -inf)));
    assert_true(IS_NZERO(eval1(apply_silu, -1e30f)));
    assert_true(eval1(apply_silu, 1e30f) == 1e30f);
    assert_true(isnan(eval1(apply_silu, NAN)));
    assert_true(eval1(apply_softplus, 21.0f) == 21.0f); /* threshold */
    assert_true(eval1(apply_softplus, inf) == inf);
    assert_true(IS_PZERO(eval1(apply_softplus, -inf)));
    assert_true(isnan(eval1(apply_softplus, NAN)));
    /* rsqrt */
    assert_true(eval1(apply_rsqrt, 0.0f) == inf);
    assert_true(eval1(apply_rsqrt, -0.0f) == -inf);
    assert_true(isnan(eval1(apply_rsqrt, -1.0f)));
    assert_true(IS_PZERO(eval1(apply_rsqrt, inf)));
    assert_true(isnan(eval1(apply_rsqrt, NAN)));
    assert_true(eval1(apply_rsqrt, 4.0f) == 0.5f);
    assert_true(eval1(apply_rsqrt, 0x1p-148f) == 0x1p74f);
    /* hyperbolic */
    assert_true(IS_NZERO(eval1(apply_sinh, -0.0f)));
    assert_true(eval1(apply_sinh, inf) == inf);
    assert_true(eval1(apply_sinh, -inf) == -inf);
    assert_true(eval1(apply_sinh, 89.5f) == inf);            /* sinh overflows past 89.4 */
    assert_true(isfinite(eval1(apply_sinh, 89.3f)));
    assert_true(eval1(apply_sinh, 0x1p-149f) == 0x1p-149f);
    assert_true(isnan(eval1(apply_sinh, NAN)));
    assert_true(eval1(apply_cosh, 0.0f) == 1.0f);
    assert_true(eval1(apply_cosh, -inf) == inf);
    assert_true(isfinite(eval1(apply_cosh, -89.3f)));
    assert_true(isnan(eval1(apply_cosh, NAN)));
    /* inverse trig */
    assert_true(IS_NZERO(eval1(apply_asin, -0.0f)));
    assert_true(eval1(apply_asin, 1.0f) == (float)M_PI_2);
    assert_true(eval1(apply_asin, -1.0f) == -(float)M_PI_2);
    assert_true(isnan(eval1(apply_asin, 1.0000001f)));
    assert_true(isnan(eval1(apply_asin, -inf)));
    assert_true(eval1(apply_asin, 0x1p-149f) == 0x1p-149f);
    assert_true(IS_PZERO(eval1(apply_acos, 1.0f)));
    assert_true(eval1(apply_acos, -1.0f) == (float)M_PI);
    assert_true(eval1(apply_acos, 0.0f) == (float)M_PI_2);
    assert_true(isnan(eval1(apply_acos, -1.0000001f)));
    assert_true(isnan(eval1(apply_acos, NAN)));
    assert_true(eval1(apply_atan, inf) == (float)M_PI_2);
    assert_true(eval1(apply_atan, -inf) == -(float)M_PI_2);
    assert_true(IS_NZERO(eval1(apply_atan, -0.0f)));
    assert_true(eval1(apply_atan, 1.0f) == (float)M_PI_4);
    assert_true(isnan(eval1(apply_atan, NAN)));
    /* inverse hyperbolic: PyTorch's edges (acosh(<1) NaN, atanh(+-1) +-inf) */
    assert_true(IS_NZERO(eval1(apply_asinh, -0.0f)));
    assert_true(eval1(apply_asinh, -inf) == -inf);
    assert_true(fabsf(eval1(apply_asinh, FLT_MAX) - 89.4159851f) <= 1e-5f);
    assert_true(isnan(eval1(apply_asinh, NAN)));
    assert_true(IS_PZERO(eval1(apply_acosh, 1.0f)));
    assert_true(isnan(eval1(apply_acosh, 0.5f)));
    assert_true(isnan(eval1(apply_acosh, -inf)));
    assert_true(eval1(apply_acosh, inf) == inf);
    assert_true(fabsf(eval1(apply_acosh, FLT_MAX) - 89.4159851f) <= 1e-5f);
    assert_true(eval1(apply_atanh, 1.0f) == inf);
    assert_true(eval1(apply_atanh, -1.0f) == -inf);
    assert_true(isnan(eval1(apply_atanh, 1.5f)));
    assert_true(IS_NZERO(eval1(apply_atanh, -0.0f)));
    assert_true(eval1(apply_atanh, 0x1p-149f) == 0x1p-149f);
    /* log10, logit */
    assert_true(eval1(apply_log10, 1000.0f) == 3.0f);
    assert_true(eval1(apply_log10, 1e-30f) == -30.0f);
    assert_true(eval1(apply_log10, 0.0f) == -inf);
    assert_true(isnan(eval1(apply_log10, -1.0f)));
    assert_true(eval1(apply_log10, inf) == inf);
    assert_true(eval1(apply_logit, 0.0f) == -inf);
    assert_true(eval1(apply_logit, -0.0f) == -inf);
    assert_true(eval1(apply_logit, 1.0f) == inf);
    assert_true(IS_PZERO(eval1(apply_logit, 0.5f)));
    assert_true(isnan(eval1(apply_logit, -0.5f)));
    assert_true(isnan(eval1(apply_logit, 1.5f)));
    assert_true(isnan(eval1(apply_logit, NAN)));
    /* mish, selu */
    assert_true(eval1(apply_mish, inf) == inf);
    assert_true(IS_NZERO(eval1(apply_mish, -inf)));
    assert_true(IS_NZERO(eval1(apply_mish, -0.0f)));
    assert_true(eval1(apply_mish, 25.0f) == 25.0f);
    assert_true(eval1(apply_mish, -100.0f) < 0.0f);   /* gradual underflow, as PyTorch */
    assert_true(isnan(eval1(apply_mish, NAN)));
    assert_true(eval1(apply_selu, -inf) == -(float)KE__SELU_ALPHA * (float)KE__SELU_SCALE);
    assert_true(IS_NZERO(eval1(apply_selu, -0.0f)));
    assert_true(eval1(apply_selu, inf) == inf);
    assert_true(isnan(eval1(apply_selu, NAN)));
}

/* hypot over a grid of magnitudes (every pairing of binades and signs,
 * subnormals included) against sqrt in long double, plus C99's special cases. */
static void test_hypot(void **state)
{
    (void)state;
    enum { N = 1 << 11 };
    static float xs[N], ys[N * BLOCK / N], out[BLOCK];
    for (uint32_t i = 0; i < N; i++) xs[i] = from_bits((i << 21) | (mix(i) & 0x1fffffu));
    double worst = 0.0;
    for (uint32_t j = 0; j < N; j += 7) {
        float yv[BLOCK], xv[BLOCK];
        for (uint32_t i = 0; i < BLOCK; i++) {
            xv[i] = xs[(i * 13u + j) % N];
            yv[i] = xs[(i + j * 3u) % N];
        }
        for (size_t i = 0; i < BLOCK; i++) out[i] = ke_vhypotf(xv[i], yv[i]);
        for (size_t i = 0; i < BLOCK; i++) {
            if (isnan(xv[i]) || isnan(yv[i]) || isinf(xv[i]) || isinf(yv[i])) continue;
            long double xl = xv[i], yl = yv[i];
            double e = ulp_err(out[i], (double)sqrtl(xl * xl + yl * yl));
            if (!(e <= worst)) worst = e;
        }
    }
    (void)ys;
    print_message("%-10s max %6.3f ulp  (bound 1)\n", "hypot", worst);
    assert_true(worst <= 1.0);
    assert_true(ke_vhypotf(INFINITY, NAN) == INFINITY);
    assert_true(ke_vhypotf(NAN, -INFINITY) == INFINITY);
    assert_true(isnan(ke_vhypotf(NAN, 1.0f)));
    assert_true(ke_vhypotf(3.0f, -4.0f) == 5.0f);
    assert_true(IS_PZERO(ke_vhypotf(-0.0f, -0.0f)));
    assert_true(ke_vhypotf(FLT_MAX, FLT_MAX) == INFINITY);
    assert_true(ke_vhypotf(0x1p-149f, 0.0f) == 0x1p-149f);
}

/* ---------------------------------------------------------------------- */
/* pow and atan2: two-argument sweeps                                     */
/* ---------------------------------------------------------------------- */
#define KE_APPLY2(name)                                                                        \
    static void apply2_##name(const float *restrict x, const float *restrict y, float *restrict r, \
                              size_t n)                                                        \
    {                                                                                          \
        for (size_t b = 0; b < n; b += BLOCK)                                                  \
            for (size_t i = 0; i < BLOCK; i++) r[b + i] = ke_v##name##f(x[b + i], y[b + i]);   \
    }
KE_APPLY2(pow)
KE_APPLY2(atan2)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rng64(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static double rng_unit(void) { return (double)(rng64() >> 11) * 0x1p-53; } /* [0, 1) */

typedef double (*ref2_t)(double, double);
static double ref_pow2(double x, double y) { return pow(x, y); }
static double ref_atan2(double y, double x) { return atan2(y, x); }

/* Runs f over the n pairs (a multiple of BLOCK), measures each result in
 * ulps against the double reference, prints a histogram and the count of
 * results that are not the reference rounded to float; returns the max. */
static double sweep2(const char *name, void (*f)(const float *, const float *, float *, size_t), ref2_t ref,
                     const float *x, const float *y, size_t n)
{
    float *r = malloc(n * sizeof *r);
    assert_non_null(r);
    f(x, y, r, n);
    static const double edge[] = {0.5, 0.5001, 0.501, 0.6, 1.0};
    size_t hist[6] = {0}, misrounded = 0;
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = ref((double)x[i], (double)y[i]);
        double e = ulp_err(r[i], d);
        int k = 0;
        while (k < 5 && e > edge[k]) k++;
        hist[k]++;
        misrounded += !(r[i] == (float)d || (isnan(r[i]) && isnan(d)));
        if (e > worst) worst = e, wi = i;
    }
    print_message("%-6s %zu pairs, ulp error histogram: <=0.5: %zu, (0.5, 0.5001]: %zu, (0.5001, 0.501]: %zu, "
                  "(0.501, 0.6]: %zu, (0.6, 1]: %zu, >1: %zu; not the correctly rounded float: %zu; max %.4f at "
                  "(%a, %a)\n",
                  name, n, hist[0], hist[1], hist[2], hist[3], hist[4], hist[5], misrounded, worst, (double)x[wi],
                  (double)y[wi]);
    free(r);
    assert_true(misrounded <= n >> 12); /* "nearly always correctly rounded" */
    return worst;
}

/* Every pair of the values, bitwise (NaN: any NaN) against the double
 * reference rounded to float: the special cases of C99 Annex F, which
 * glibc's double pow and atan2 implement, signed zeros included. */
static size_t special_pairs(const char *name, float (*f)(float, float), ref2_t ref, const float *v, size_t nv)
{
    size_t bad = 0;
    for (size_t i = 0; i < nv; i++)
        for (size_t j = 0; j < nv; j++) {
            float got = f(v[i], v[j]), want = (float)ref((double)v[i], (double)v[j]);
            uint32_t gb, wb;
            memcpy(&gb, &got, 4);
            memcpy(&wb, &want, 4);
            if (gb == wb || (isnan(got) && isnan(want))) continue;
            if (bad++ < 10)
                print_message("%s(%a, %a) = %a, expected %a\n", name, (double)v[i], (double)v[j], (double)got,
                              (double)want);
        }
    return bad;
}

static const float k_pow_special[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 3.0f, -3.0f, 2.5f, -2.5f,
    0x1p-149f, -0x1p-149f, 0x1p-126f, -0x1p-126f, FLT_MAX, -FLT_MAX, 0x1.fffffep-1f, -0x1.fffffep-1f, 0x1.000002p0f,
    -0x1.000002p0f, 0x1.fffffep22f, -0x1.fffffep22f /* x.5 */, 0x1.fffffcp22f, 0x1.fffffep23f /* odd */,
    -0x1.fffffep23f, 0x1p23f, 0x1.000002p23f /* odd */, 0x1p24f /* even */, -0x1.000002p24f /* even */, 1e10f,
    -1e10f, 127.0f, -127.0f, 128.0f, -149.0f, -150.0f, -149.5f, 0.1f, -0.1f, 10.0f, -10.0f, 4097.0f, 1.5f,
    103041.0f, 321.0f};

static void test_pow(void **state)
{
    (void)state;
    const size_t q = (size_t)1 << 20, n = 5 * q;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)rng64();
        float xi;
        memcpy(&xi, &b, 4);
        double u = 2.0 * rng_unit() - 1.0;
        if (i < q) { /* any finite x > 0, y so that y log2 x covers [-160, 160]: every result binade */
            b &= 0x7fffffffu;
            if (b >= 0x7f800000u) b -= 0x00800000u;
            memcpy(&xi, &b, 4);
            double l = fabs(log2((double)xi));
            x[i] = xi;
            y[i] = (float)(u * (l > 0 ? 160.0 / l : 1e6));
        } else if (i < 2 * q) { /* any x, integer y in [-64, 64]: signs of negative bases */
            x[i] = xi;
            y[i] = (float)((int)(rng64() % 129u) - 64);
        } else if (i < 3 * q) { /* x within 2^-12 of 1, large y: log near 1 */
            x[i] = (float)(1.0 + u * 0x1p-12);
            y[i] = (float)(ldexp(2.0 * rng_unit() - 1.0, (int)(rng64() % 40u)));
        } else if (i < 4 * q) { /* x in +[2^-8, 2^8), y in +-[2^-8, 2^5): the common range */
            x[i] = (float)ldexp(1.0 + rng_unit(), (int)(rng64() % 16u) - 8);
            y[i] = (float)ldexp(u, (int)(rng64() % 13u) - 7);
        } else { /* bit patterns for both */
            x[i] = xi;
            b = (uint32_t)rng64();
            memcpy(&y[i], &b, 4);
        }
    }
    double worst = sweep2("pow", apply2_pow, ref_pow2, x, y, n);
    assert_true(worst <= 1.0);
    free(x);
    free(y);

    size_t nv = sizeof k_pow_special / sizeof *k_pow_special;
    assert_int_equal(special_pairs("pow", ke_vpowf, ref_pow2, k_pow_special, nv), 0);
    /* C99 Annex F, spelled out */
    float inf = INFINITY;
    assert_true(ke_vpowf(NAN, 0.0f) == 1.0f && ke_vpowf(NAN, -0.0f) == 1.0f);
    assert_true(ke_vpowf(1.0f, NAN) == 1.0f && ke_vpowf(1.0f, -inf) == 1.0f);
    assert_true(ke_vpowf(-1.0f, inf) == 1.0f && ke_vpowf(-1.0f, -inf) == 1.0f);
    assert_true(isnan(ke_vpowf(-1.0f, NAN)) && isnan(ke_vpowf(NAN, 1.0f)) && isnan(ke_vpowf(2.0f, NAN)));
    assert_true(isnan(ke_vpowf(-8.0f, 1.0f / 3.0f)) && isnan(ke_vpowf(-FLT_MAX, 0.5f)));
    assert_true(ke_vpowf(-2.0f, 3.0f) == -8.0f && ke_vpowf(-2.0f, 2.0f) == 4.0f && ke_vpowf(-2.0f, -1.0f) == -0.5f);
    assert_true(IS_NZERO(ke_vpowf(-0.0f, 3.0f)) && IS_PZERO(ke_vpowf(-0.0f, 2.0f)) && IS_PZERO(ke_vpowf(-0.0f, 0.5f)));
    assert_true(ke_vpowf(-0.0f, -3.0f) == -inf && ke_vpowf(-0.0f, -2.0f) == inf && ke_vpowf(0.0f, -inf) == inf);
    assert_true(IS_PZERO(ke_vpowf(0.0f, inf)) && ke_vpowf(-0.0f, -0.5f) == inf);
    assert_true(ke_vpowf(-inf, 3.0f) == -inf && ke_vpowf(-inf, 2.0f) == inf && IS_NZERO(ke_vpowf(-inf, -3.0f)));
    assert_true(IS_PZERO(ke_vpowf(-inf, -2.5f)) && ke_vpowf(-inf, 0.5f) == inf && IS_PZERO(ke_vpowf(inf, -1.0f)));
    assert_true(IS_PZERO(ke_vpowf(0.5f, inf)) && ke_vpowf(0.5f, -inf) == inf && ke_vpowf(-2.0f, inf) == inf);
    assert_true(IS_PZERO(ke_vpowf(-2.0f, -inf)));
    assert_true(ke_vpowf(-3.0f, 0x1.fffffep23f) == -inf && ke_vpowf(-3.0f, 0x1p24f) == inf); /* odd, even */
    assert_true(ke_vpowf(FLT_MAX, 2.0f) == inf && ke_vpowf(-FLT_MAX, 3.0f) == -inf);
    assert_true(IS_PZERO(ke_vpowf(0x1p-100f, 2.0f)) && IS_NZERO(ke_vpowf(-0x1p-100f, 3.0f)));
    /* subnormal results, exact powers, exact integers */
    assert_true(ke_vpowf(2.0f, -149.0f) == 0x1p-149f && IS_PZERO(ke_vpowf(2.0f, -150.0f)));
    assert_true(ke_vpowf(2.0f, -149.5f) == 0x1p-149f && IS_PZERO(ke_vpowf(0x1p-75f, 2.0f)));
    assert_true(ke_vpowf(2.0f, 127.0f) == 0x1p127f && ke_vpowf(2.0f, 128.0f) == inf);
    assert_true(ke_vpowf(3.0f, 5.0f) == 243.0f && ke_vpowf(10.0f, 7.0f) == 1e7f && ke_vpowf(4.0f, 0.5f) == 2.0f);
    assert_true(ke_vpowf(0x1p-149f, 1.0f) == 0x1p-149f && ke_vpowf(0x1p-149f, 0.5f) == 0x1.6a09e6p-75f);
    /* exact results halfway between two floats round to even (glibc's powf
     * gives the odd neighbour of all three) */
    assert_true(ke_vpowf(4097.0f, 2.0f) == 0x1.002p+24f && ke_vpowf(-149.5f, 3.0f) == -0x1.97e194p+21f);
    assert_true(ke_vpowf(103041.0f, 1.5f) == 0x1.f8b3cp+24f && ke_vpowf(0x1.001p-40f, 2.0f) == 0x1.002p-80f);
}

static const float k_atan2_special[] = {0.0f,   -0.0f,   INFINITY,  -INFINITY,  NAN,       1.0f,      -1.0f,
                                        0.5f,   -2.0f,   0x1p-149f, -0x1p-149f, FLT_MAX,   -FLT_MAX,  0x1p-126f,
                                        3e38f, -1e-30f, 0.41421356f, 2.4142137f, -0.41421356f, 1e20f, -1e20f};

static void test_atan2(void **state)
{
    (void)state;
    const size_t q = (size_t)1 << 20, n = 4 * q;
    float *y = malloc(n * sizeof *y), *x = malloc(n * sizeof *x);
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) {
        uint32_t a = (uint32_t)rng64(), b = (uint32_t)rng64();
        if (i < q) { /* bit patterns */
            memcpy(&y[i], &a, 4);
            memcpy(&x[i], &b, 4);
        } else if (i < 2 * q) { /* both in +-[2^-8, 2^8) */
            y[i] = (float)ldexp(2.0 * rng_unit() - 1.0, (int)(a % 16u) - 7);
            x[i] = (float)ldexp(2.0 * rng_unit() - 1.0, (int)(b % 16u) - 7);
        } else if (i < 3 * q) { /* near the diagonals |y| = |x| and the tan(pi/8) switch */
            double t = (b & 1) ? 1.0 : 0.41421356237309503, s = ldexp(1.0, (int)(a % 200u) - 100);
            x[i] = (float)(((a >> 8) & 1 ? -1.0 : 1.0) * s);
            y[i] = (float)(((a >> 9) & 1 ? -1.0 : 1.0) * s * t * (1.0 + (2.0 * rng_unit() - 1.0) * 0x1p-10));
        } else { /* far apart: results near 0, +-pi/2, +-pi, subnormal */
            y[i] = (float)ldexp(2.0 * rng_unit() - 1.0, (int)(a % 250u) - 125);
            x[i] = (float)ldexp(2.0 * rng_unit() - 1.0, (int)(b % 250u) - 125);
        }
    }
    double worst = sweep2("atan2", apply2_atan2, ref_atan2, y, x, n);
    assert_true(worst <= 1.0);
    free(x);
    free(y);
    size_t nv = sizeof k_atan2_special / sizeof *k_atan2_special;
    assert_int_equal(special_pairs("atan2", ke_vatan2f, ref_atan2, k_atan2_special, nv), 0);
    float pi = 0x1.921fb6p+1f, pio2 = 0x1.921fb6p+0f, inf = INFINITY;
    assert_true(ke_vatan2f(0.0f, -0.0f) == pi && ke_vatan2f(-0.0f, -0.0f) == -pi);
    assert_true(IS_PZERO(ke_vatan2f(0.0f, 0.0f)) && IS_NZERO(ke_vatan2f(-0.0f, 0.0f)));
    assert_true(ke_vatan2f(-0.0f, -1.0f) == -pi && IS_NZERO(ke_vatan2f(-0.0f, 1.0f)));
    assert_true(ke_vatan2f(1.0f, -0.0f) == pio2 && ke_vatan2f(-1.0f, 0.0f) == -pio2);
    assert_true(ke_vatan2f(inf, -inf) == 0x1.2d97c8p+1f && ke_vatan2f(-inf, inf) == -0x1.921fb6p-1f);
    assert_true(ke_vatan2f(1.0f, -inf) == pi && IS_NZERO(ke_vatan2f(-1.0f, inf)) && ke_vatan2f(-inf, 5.0f) == -pio2);
    assert_true(isnan(ke_vatan2f(NAN, 1.0f)) && isnan(ke_vatan2f(inf, NAN)) && ke_vatan2f(0x1p-149f, 1.0f) == 0x1p-149f);
}

/* Group teardown: the summary table (max ulp per function vs its bound). */
static int print_table(void **state)
{
    (void)state;
    print_message("\n  %-10s %10s %9s %7s\n", "function", "points", "max ulp", "bound");
    for (size_t i = 0; i < N_CASES; i++) {
        if (g_points[i] == 0) continue; /* test did not run */
        print_message("  %-10s %10zu %9.3f %7.0f%s\n", k_cases[i].name, g_points[i], g_maxulp[i],
                      k_cases[i].bound, g_maxulp[i] <= k_cases[i].bound ? "" : "  FAIL");
    }
    print_message("  (sin/cos/tan over |x| <= 1e4; see test_trig_large for beyond)\n\n");
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_values),
#define UT(i, nm) {.name = "ulp_" #nm, .test_func = test_ulp, .initial_state = &k_cases[i]}
        UT(0, exp), UT(1, exp2), UT(2, expm1), UT(3, log), UT(4, log2),
        UT(5, log1p), UT(6, tanh), UT(7, sigmoid), UT(8, erf), UT(9, sin),
        UT(10, cos), UT(11, tan), UT(12, gelu_tanh), UT(13, gelu_erf),
        UT(14, silu), UT(15, softplus), UT(16, rsqrt), UT(17, sinh), UT(18, cosh),
        UT(19, asin), UT(20, acos), UT(21, atan), UT(22, asinh), UT(23, acosh), UT(24, atanh),
        UT(25, log10), UT(26, logit), UT(27, mish), UT(28, selu),
#undef UT
        cmocka_unit_test(test_trig_large),
        cmocka_unit_test(test_hypot),
        cmocka_unit_test(test_pow),
        cmocka_unit_test(test_atan2),
    };
    return cmocka_run_group_tests(tests, NULL, print_table);
}
