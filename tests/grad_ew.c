/*
 * grad_ew.c — gradchecks of the elementwise family (ops_unary.def,
 * ops_binary.def, ops_ew_other.def): every unary and binary op over several
 * shapes and layouts (broadcasting, 0-dim, zero-size, non-contiguous), their _inplace and _scalar forms, second
 * order, and PyTorch 1.13's values at kinks and special points (computed
 * with torch and hardcoded here).
 *
 * Unary and binary ops are table-driven: one CMocka test per op, whose
 * state is the op's row below.
 */
#include "grad_harness.h"

/* A shape and layout for kt_input. */
typedef struct kt_form {
    int ndim;
    int64_t d[4];
    enum kt_layout layout;
} kt_form;

static kl_tensor *input(kt_form f, double lo, double hi) { return kt_input(f.ndim, f.d, f.layout, lo, hi); }

/* Asserts a first (and, if second, second) order gradcheck, naming the op and form. */
static void check(kl_grad_fn fn, void *user, int n, kl_tensor *const *in, int second, const char *op,
                  const char *form, int k) {
    char what[128];
    snprintf(what, sizeof what, "%s (%s %d)", op, form, k);
    kt_gradcheck_(fn, user, n, in, second, what, __FILE__, __LINE__);
}

/* ---- unary ops ------------------------------------------------------------------ */

typedef struct unary_case {
    const char *name;
    kl_tensor *(*f)(kl_tensor *);
    kl_tensor *(*fi)(kl_tensor *);
    double lo, hi;   /* input range: inside the domain, away from kinks */
    int second;      /* gradgradcheck too (not for piecewise-constant ops) */
} unary_case;

static kl_tensor *unary_out(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return ((const unary_case *)user)->f(in[0]);
}
/* In-place on a leaf is an error: apply it to a clone. */
static kl_tensor *unary_inplace(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return ((const unary_case *)user)->fi(kl_clone(in[0]));
}

static const kt_form unary_forms[] = {
    {2, {3, 4}, KT_CONTIG}, {2, {3, 4}, KT_TRANSPOSED}, {3, {2, 3, 5}, KT_STRIDED},
    {0, {0}, KT_CONTIG},    {1, {7}, KT_STRIDED},       {2, {0, 3}, KT_CONTIG},
};

static void unary_test(void **state) {
    unary_case *u = (unary_case *)*state;
    kl_manual_seed(1);
    for (size_t k = 0; k < sizeof unary_forms / sizeof unary_forms[0]; k++) {
        kl_tensor *x = input(unary_forms[k], u->lo, u->hi);
        check(unary_out, u, 1, &x, 0, u->name, "form", (int)k);
    }
    if (u->fi) { /* NULL: no _inplace form (softsign) */
        kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, u->lo, u->hi);
        check(unary_inplace, u, 1, &x, 0, u->name, "inplace", 0);
        kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, u->lo, u->hi);
        check(unary_inplace, u, 1, &x0, 0, u->name, "inplace 0-dim", 0);
    }
    if (u->second) {
        kl_tensor *y = input((kt_form){2, {2, 3}, KT_STRIDED}, u->lo, u->hi);
        check(unary_out, u, 1, &y, 1, u->name, "second", 0);
        if (u->fi) check(unary_inplace, u, 1, &y, 1, u->name, "second inplace", 0);
    }
}

/* Ranges keep away from poles, domain edges and kinks (abs and relu at 0,
 * the rounding ops at integers and halves). */
#define UNARY_CASES(X)                                                 \
    X(neg, -2, 2, 1) X(abs, -2, 2, 1) X(sign, -2, 2, 0)                \
    X(exp, -2, 2, 1) X(exp2, -2, 2, 1) X(expm1, -2, 2, 1)              \
    X(log, 0.5, 3, 1) X(log2, 0.5, 3, 1) X(log1p, -0.5, 2, 1)          \
    X(sqrt, 0.5, 3, 1) X(rsqrt, 0.5, 3, 1) X(square, -2, 2, 1)         \
    X(reciprocal, 0.5, 3, 1) X(sin, -3, 3, 1) X(cos, -3, 3, 1)         \
    X(tan, -1.2, 1.2, 1) X(tanh, -2, 2, 1) X(sigmoid, -3, 3, 1)        \
    X(relu, -2, 2, 1) X(gelu, -3, 3, 1) X(gelu_tanh, -3, 3, 1)         \
    X(silu, -3, 3, 1) X(softplus, -3, 3, 1) X(erf, -2, 2, 1)           \
    X(floor, 0.05, 0.45, 0) X(ceil, 0.05, 0.45, 0)                     \
    X(round, 0.55, 0.95, 0) X(trunc, -0.95, -0.05, 0)                  \
    X(sinh, -2, 2, 1) X(cosh, -2, 2, 1) X(asin, -0.9, 0.9, 1)           \
    X(acos, -0.9, 0.9, 1) X(atan, -3, 3, 1) X(asinh, -3, 3, 1)          \
    X(acosh, 1.2, 3, 1) X(atanh, -0.9, 0.9, 1) X(log10, 0.5, 3, 1)      \
    X(selu, -2, 2, 1) X(hardsigmoid, -2.9, 2.9, 1)                      \
    X(hardswish, -2.9, 2.9, 1) X(mish, -3, 3, 1)

#define UNARY_ROW(op, lo, hi, second) \
    static unary_case unary_##op = {#op, kl_##op, kl_##op##_inplace, lo, hi, second};
UNARY_CASES(UNARY_ROW)

/* softsign has no _inplace form (PyTorch has none) */
static unary_case unary_softsign = {"softsign", kl_softsign, NULL, -2, 2, 1};
/* hardsigmoid and hardswish outside (-3, 3); mish far out on both sides */
static unary_case unary_hardsigmoid_out = {"hardsigmoid", kl_hardsigmoid, kl_hardsigmoid_inplace, 3.1, 5, 1};
static unary_case unary_hardswish_out = {"hardswish", kl_hardswish, kl_hardswish_inplace, -5, -3.1, 1};
static unary_case unary_hardswish_hi = {"hardswish", kl_hardswish, kl_hardswish_inplace, 3.1, 5, 1};
static unary_case unary_mish_far = {"mish", kl_mish, kl_mish_inplace, -30, -10, 1};

/* softplus past its threshold (20), where it is the identity */
static unary_case unary_softplus_big = {"softplus", kl_softplus, kl_softplus_inplace, 15, 30, 1};
/* the rounding ops on negative inputs and across integers */
static unary_case unary_floor_neg = {"floor", kl_floor, kl_floor_inplace, -2.9, -2.1, 0};
static unary_case unary_ceil_neg = {"ceil", kl_ceil, kl_ceil_inplace, -2.9, -2.1, 0};
static unary_case unary_round_neg = {"round", kl_round, kl_round_inplace, -1.45, -0.55, 0};

/* ---- binary ops ------------------------------------------------------------------- */

typedef struct binary_case {
    const char *name;
    kl_tensor *(*f)(kl_tensor *, kl_tensor *);
    kl_tensor *(*fi)(kl_tensor *, kl_tensor *);
    kl_tensor *(*fs)(kl_tensor *, double);
    kl_tensor *(*fsi)(kl_tensor *, double);
    double alo, ahi, blo, bhi;   /* ranges of the two operands */
    double s;                    /* the C scalar of the _scalar forms */
} binary_case;

static kl_tensor *binary_out(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return ((const binary_case *)user)->f(in[0], in[1]);
}
static kl_tensor *binary_inplace(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return ((const binary_case *)user)->fi(kl_clone(in[0]), in[1]);
}
static kl_tensor *binary_scalar(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const binary_case *b = (const binary_case *)user;
    return b->fs(in[0], b->s);
}
static kl_tensor *binary_scalar_inplace(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const binary_case *b = (const binary_case *)user;
    return b->fsi(kl_clone(in[0]), b->s);
}

/* (a, b) pairs: equal shapes, b broadcast, both broadcast, a broadcast, 0-dim, zero-size. */
static const kt_form binary_forms[][2] = {
    {{2, {3, 4}, KT_CONTIG}, {2, {3, 4}, KT_TRANSPOSED}},
    {{2, {3, 4}, KT_STRIDED}, {1, {4}, KT_CONTIG}},
    {{3, {2, 1, 3}, KT_CONTIG}, {2, {4, 1}, KT_STRIDED}},
    {{1, {4}, KT_CONTIG}, {2, {3, 4}, KT_TRANSPOSED}},
    {{0, {0}, KT_CONTIG}, {1, {3}, KT_CONTIG}},
    {{2, {2, 3}, KT_TRANSPOSED}, {0, {0}, KT_CONTIG}},
    {{0, {0}, KT_CONTIG}, {0, {0}, KT_CONTIG}},
    {{2, {0, 3}, KT_CONTIG}, {1, {3}, KT_CONTIG}},
};
/* In place: a already has the result's shape. */
static const kt_form binary_inplace_forms[][2] = {
    {{2, {3, 4}, KT_TRANSPOSED}, {1, {4}, KT_CONTIG}},
    {{3, {2, 4, 3}, KT_CONTIG}, {2, {4, 1}, KT_STRIDED}},
    {{1, {3}, KT_STRIDED}, {0, {0}, KT_CONTIG}},
};

static void binary_test(void **state) {
    binary_case *b = (binary_case *)*state;
    kl_manual_seed(2);
    for (size_t k = 0; k < sizeof binary_forms / sizeof binary_forms[0]; k++) {
        kl_tensor *in[2] = {input(binary_forms[k][0], b->alo, b->ahi), input(binary_forms[k][1], b->blo, b->bhi)};
        check(binary_out, b, 2, in, 0, b->name, "form", (int)k);
    }
    for (size_t k = 0; k < sizeof binary_inplace_forms / sizeof binary_inplace_forms[0]; k++) {
        kl_tensor *in[2] = {input(binary_inplace_forms[k][0], b->alo, b->ahi),
                            input(binary_inplace_forms[k][1], b->blo, b->bhi)};
        check(binary_inplace, b, 2, in, 0, b->name, "inplace", (int)k);
    }
    /* only one operand requiring grad */
    kl_tensor *a1 = input((kt_form){2, {3, 4}, KT_CONTIG}, b->alo, b->ahi);
    kl_tensor *b1 = kl_detach(input((kt_form){1, {4}, KT_STRIDED}, b->blo, b->bhi));
    check(binary_out, b, 2, (kl_tensor *[]){a1, b1}, 0, b->name, "a only", 0);
    check(binary_out, b, 2, (kl_tensor *[]){kl_detach(a1), input((kt_form){1, {4}, KT_CONTIG}, b->blo, b->bhi)},
          0, b->name, "b only", 0);
    /* C-scalar forms (the scalar is a wrapped 0-dim tensor needing no grad) */
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, b->alo, b->ahi);
    kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, b->alo, b->ahi);
    check(binary_scalar, b, 1, &x, 0, b->name, "scalar", 0);
    check(binary_scalar, b, 1, &x0, 0, b->name, "scalar 0-dim", 0);
    check(binary_scalar_inplace, b, 1, &x, 0, b->name, "scalar inplace", 0);
    /* second order */
    kl_tensor *in[2] = {input((kt_form){2, {3, 4}, KT_CONTIG}, b->alo, b->ahi),
                        input((kt_form){1, {4}, KT_STRIDED}, b->blo, b->bhi)};
    check(binary_out, b, 2, in, 1, b->name, "second", 0);
    check(binary_inplace, b, 2, in, 1, b->name, "second inplace", 0);
    check(binary_scalar, b, 1, in, 1, b->name, "second scalar", 0);
}

/* Ranges: divisors and bases away from 0; remainder away from its jumps
 * (a/b an integer) only by chance of the fixed seed, as its jumps are dense. */
#define BINARY_CASES(X)                        \
    X(add, -2, 2, -2, 2, 2.5)                  \
    X(sub, -2, 2, -2, 2, -1.5)                 \
    X(mul, -2, 2, -2, 2, 3)                    \
    X(div, -2, 2, 0.5, 2, 2.5)                 \
    X(remainder, -4, 4, 1, 2, 1.5)             \
    X(pow, 0.5, 2, -2, 2, 2.5)                 \
    X(maximum, -2, 2, -2, 2, 0.3)              \
    X(minimum, -2, 2, -2, 2, 0.3)              \
    X(atan2, -2, 2, -2, 2, 0.7)                \
    X(fmod, -4, 4, 1, 2, 1.5)                  \
    X(hypot, -2, 2, -2, 2, 0.7)                \
    X(copysign, -2, 2, -2, 2, -1.5)            \
    X(xlogy, -2, 2, 0.5, 3, 2.5)

#define BINARY_ROW(op, alo, ahi, blo, bhi, s)                                                       \
    static binary_case binary_##op = {#op, kl_##op, kl_##op##_inplace, kl_##op##_scalar,            \
                                      kl_##op##_scalar_inplace, alo, ahi, blo, bhi, s};
BINARY_CASES(BINARY_ROW)

/* remainder by negative divisors; pow by a negative fractional scalar */
static binary_case binary_remainder_neg = {"remainder", kl_remainder, kl_remainder_inplace,
                                           kl_remainder_scalar, kl_remainder_scalar_inplace,
                                           -4, 4, -2, -1, -1.5};
static binary_case binary_fmod_neg = {"fmod", kl_fmod, kl_fmod_inplace, kl_fmod_scalar, kl_fmod_scalar_inplace,
                                      -4, 4, -2, -1, -1.5};
static binary_case binary_copysign_pos = {"copysign", kl_copysign, kl_copysign_inplace, kl_copysign_scalar,
                                          kl_copysign_scalar_inplace, -2, 2, -2, 2, 0.5};
static binary_case binary_pow_neg = {"pow", kl_pow, kl_pow_inplace, kl_pow_scalar, kl_pow_scalar_inplace,
                                     0.5, 2, -2, 2, -1.5};

/* s - x and s / x: the scalar is input 0 */
static kl_tensor *rsub_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_rsub_scalar(in[0], 1.5);
}
static kl_tensor *rdiv_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_rdiv_scalar(in[0], -2.5);
}

static void reversed_scalar_forms(void **state) {
    (void)state;
    kl_manual_seed(3);
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, 0.5, 2);
    kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, 0.5, 2);
    KT_GRADGRADCHECK(rsub_fn, NULL, 1, &x);
    KT_GRADGRADCHECK(rsub_fn, NULL, 1, &x0);
    KT_GRADGRADCHECK(rdiv_fn, NULL, 1, &x);
    KT_GRADGRADCHECK(rdiv_fn, NULL, 1, &x0);
}

/* pow by exponent tensors that need no grad: integer (int64) and float */
static kl_tensor *pow_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_pow(in[0], (kl_tensor *)user);
}
static kl_tensor *pow_scalar_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_pow_scalar(in[0], *(const double *)user);
}

static void pow_exponent_forms(void **state) {
    (void)state;
    kl_manual_seed(4);
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_STRIDED}, 0.5, 2);
    kl_tensor *ei = kl_from_data((const int64_t[]){-2, 0, 1, 3}, 1, (const int64_t[]){4}, KL_I64);
    KT_GRADGRADCHECK(pow_fn, ei, 1, &x);
    kl_tensor *ef = kl_from_data((const double[]){-0.5, 0, 1.5, 2}, 1, (const int64_t[]){4}, KL_F64);
    KT_GRADGRADCHECK(pow_fn, ef, 1, &x);
    /* a 0-dim base to a [3, 4] exponent, both requiring grad */
    kl_tensor *in[2] = {input((kt_form){0, {0}, KT_CONTIG}, 0.5, 2), input((kt_form){2, {3, 4}, KT_CONTIG}, -2, 2)};
    KT_GRADGRADCHECK(binary_out, &binary_pow, 2, in);
    /* scalar exponents: 0 (zero gradient), integral (a wrapped int64),
     * fractional, negative */
    static const double es[] = {0, 1, 2, 0.5, -1, -1.5, 3};
    for (size_t k = 0; k < sizeof es / sizeof es[0]; k++) KT_GRADGRADCHECK(pow_scalar_fn, (void *)&es[k], 1, &x);
    /* negative bases to integral exponents (tensor and scalar) */
    kl_tensor *xn = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -2, -0.5);
    KT_GRADGRADCHECK(pow_fn, ei, 1, &xn);
    for (size_t k = 0; k < 3; k++) KT_GRADGRADCHECK(pow_scalar_fn, (void *)&es[k], 1, &xn);
    KT_GRADGRADCHECK(pow_scalar_fn, (void *)&es[4], 1, &xn);
    KT_GRADGRADCHECK(pow_scalar_fn, (void *)&es[6], 1, &xn);
}

/* ---- where, clamp, lerp, masked_fill, tril, triu ---------------------------------------- */

static kl_tensor *where_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_where(in[0], in[1], in[2]);
}

/* A random bool tensor (not requiring grad). */
static kl_tensor *bool_mask(int ndim, const int64_t *shape) {
    return kl_lt_scalar(kl_rand(ndim, shape, KL_F64), 0.5);
}

static void where_grad(void **state) {
    (void)state;
    kl_manual_seed(5);
    kl_tensor *c1 = bool_mask(2, (const int64_t[]){3, 4});
    KT_GRADGRADCHECK(where_fn, NULL, 3,
                     ((kl_tensor *[]){c1, input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1),
                                      input((kt_form){2, {3, 4}, KT_STRIDED}, -1, 1)}));
    /* broadcasting: cond [3, 4], a [4], b [3, 1] */
    KT_GRADGRADCHECK(where_fn, NULL, 3,
                     ((kl_tensor *[]){c1, input((kt_form){1, {4}, KT_CONTIG}, -1, 1),
                                      input((kt_form){2, {3, 1}, KT_CONTIG}, -1, 1)}));
    /* cond broadcast: 0-dim and [2, 1, 4] against a [3, 4], b 0-dim */
    KT_GRADCHECK(where_fn, NULL, 3,
                 ((kl_tensor *[]){kl_gt_scalar(kl_ones(0, NULL, KL_F32), 0), input((kt_form){2, {3, 4}, KT_CONTIG}, -1, 1),
                                  input((kt_form){0, {0}, KT_CONTIG}, -1, 1)}));
    KT_GRADCHECK(where_fn, NULL, 3,
                 ((kl_tensor *[]){bool_mask(3, (const int64_t[]){2, 1, 4}), input((kt_form){2, {3, 4}, KT_CONTIG}, -1, 1),
                                  input((kt_form){0, {0}, KT_CONTIG}, -1, 1)}));
    /* only b requiring grad */
    KT_GRADCHECK(where_fn, NULL, 3,
                 ((kl_tensor *[]){c1, kl_zeros(1, (const int64_t[]){4}, KL_F64),
                                  input((kt_form){2, {3, 4}, KT_CONTIG}, -1, 1)}));
}

typedef struct bounds {
    double lo, hi;
} bounds;
static kl_tensor *clamp_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const bounds *b = (const bounds *)user;
    return kl_clamp(in[0], b->lo, b->hi);
}
static kl_tensor *clamp_inplace_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const bounds *b = (const bounds *)user;
    return kl_clamp_inplace(kl_clone(in[0]), b->lo, b->hi);
}

static void clamp_grad(void **state) {
    (void)state;
    kl_manual_seed(6);
    static const bounds bs[] = {{-0.5, 0.5}, {-0.5, INFINITY}, {-INFINITY, 0.5}, {-INFINITY, INFINITY}, {1, -1}};
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++) {
        kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1);
        kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, -1, 1);
        KT_GRADGRADCHECK(clamp_fn, (void *)&bs[k], 1, &x);
        KT_GRADGRADCHECK(clamp_inplace_fn, (void *)&bs[k], 1, &x);
        KT_GRADCHECK(clamp_fn, (void *)&bs[k], 1, &x0);
    }
}

static kl_tensor *lerp_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_lerp(in[0], in[1], in[2]);
}
static kl_tensor *lerp_scalar_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_lerp_scalar(in[0], in[1], *(const double *)user);
}
static kl_tensor *lerp_scalar_inplace_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_lerp_scalar_inplace(kl_clone(in[0]), in[1], *(const double *)user);
}

static void lerp_grad(void **state) {
    (void)state;
    kl_manual_seed(7);
    /* weights on both sides of 0.5 (the kernel's two formulas) and outside [0, 1] */
    KT_GRADGRADCHECK(lerp_fn, NULL, 3,
                     ((kl_tensor *[]){input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1),
                                      input((kt_form){2, {3, 4}, KT_STRIDED}, -1, 1),
                                      input((kt_form){2, {3, 4}, KT_CONTIG}, -0.5, 1.5)}));
    KT_GRADGRADCHECK(lerp_fn, NULL, 3,
                     ((kl_tensor *[]){input((kt_form){2, {3, 4}, KT_CONTIG}, -1, 1), input((kt_form){1, {4}, KT_CONTIG}, -1, 1),
                                      input((kt_form){2, {3, 1}, KT_CONTIG}, 0, 1)}));
    KT_GRADCHECK(lerp_fn, NULL, 3,
                 ((kl_tensor *[]){input((kt_form){3, {2, 1, 3}, KT_CONTIG}, -1, 1), input((kt_form){2, {4, 1}, KT_STRIDED}, -1, 1),
                                  input((kt_form){0, {0}, KT_CONTIG}, 0, 1)}));
    static const double ws[] = {0.25, 0.75, -0.5, 1.5};
    for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) {
        kl_tensor *in[2] = {input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1), input((kt_form){1, {4}, KT_STRIDED}, -1, 1)};
        KT_GRADGRADCHECK(lerp_scalar_fn, (void *)&ws[k], 2, in);
        KT_GRADGRADCHECK(lerp_scalar_inplace_fn, (void *)&ws[k], 2, in);
        kl_tensor *in0[2] = {input((kt_form){0, {0}, KT_CONTIG}, -1, 1), input((kt_form){2, {2, 3}, KT_CONTIG}, -1, 1)};
        KT_GRADCHECK(lerp_scalar_fn, (void *)&ws[k], 2, in0);
    }
}

static kl_tensor *masked_fill_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_masked_fill(in[0], (kl_tensor *)user, 2.5);
}
static kl_tensor *masked_fill_inplace_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_masked_fill_inplace(kl_clone(in[0]), (kl_tensor *)user, -1);
}

static void masked_fill_grad(void **state) {
    (void)state;
    kl_manual_seed(8);
    kl_tensor *m34 = bool_mask(2, (const int64_t[]){3, 4}), *m4 = bool_mask(1, (const int64_t[]){4});
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1);
    KT_GRADGRADCHECK(masked_fill_fn, m34, 1, &x);
    KT_GRADGRADCHECK(masked_fill_fn, m4, 1, &x);
    KT_GRADGRADCHECK(masked_fill_inplace_fn, m34, 1, &x);
    KT_GRADGRADCHECK(masked_fill_inplace_fn, m4, 1, &x);
    /* the mask grows x: the gradient sums back over the new dim */
    kl_tensor *x4 = input((kt_form){1, {4}, KT_STRIDED}, -1, 1);
    KT_GRADCHECK(masked_fill_fn, m34, 1, &x4);
    kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, -1, 1);
    KT_GRADCHECK(masked_fill_fn, m4, 1, &x0);
}

static kl_tensor *tril_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_tril(in[0], *(const int64_t *)user);
}
static kl_tensor *triu_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    return kl_triu(in[0], *(const int64_t *)user);
}

static void tril_triu_grad(void **state) {
    (void)state;
    kl_manual_seed(9);
    static const int64_t ks[] = {0, 1, -1, 5, -5};
    static const kt_form forms[] = {
        {2, {4, 5}, KT_CONTIG}, {2, {5, 4}, KT_TRANSPOSED}, {3, {2, 3, 4}, KT_STRIDED}, {2, {0, 3}, KT_CONTIG}};
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++)
        for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
            kl_tensor *x = input(forms[f], -1, 1);
            KT_GRADCHECK(tril_fn, (void *)&ks[k], 1, &x);
            KT_GRADCHECK(triu_fn, (void *)&ks[k], 1, &x);
        }
    kl_tensor *x = input((kt_form){2, {3, 3}, KT_TRANSPOSED}, -1, 1);
    KT_GRADGRADCHECK(tril_fn, (void *)&ks[0], 1, &x);
    KT_GRADGRADCHECK(triu_fn, (void *)&ks[1], 1, &x);
}

/* ---- issue 12's unary ops with attributes ------------------------------------------------ */

typedef struct attr_case {
    kl_tensor *(*f)(kl_tensor *, double);
    kl_tensor *(*fi)(kl_tensor *, double);
    double p;
} attr_case;
static kl_tensor *attr_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const attr_case *a = (const attr_case *)user;
    return a->f(in[0], a->p);
}
static kl_tensor *attr_inplace_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const attr_case *a = (const attr_case *)user;
    return a->fi(kl_clone(in[0]), a->p);
}
/* First and second order, out of place and in place, over a few layouts. */
static void attr_check(const attr_case *a, double lo, double hi) {
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, lo, hi);
    kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, lo, hi);
    kl_tensor *xs = input((kt_form){3, {2, 3, 5}, KT_STRIDED}, lo, hi);
    KT_GRADGRADCHECK(attr_fn, (void *)a, 1, &x);
    KT_GRADGRADCHECK(attr_inplace_fn, (void *)a, 1, &x);
    KT_GRADCHECK(attr_fn, (void *)a, 1, &x0);
    KT_GRADCHECK(attr_inplace_fn, (void *)a, 1, &x0);
    KT_GRADCHECK(attr_fn, (void *)a, 1, &xs);
}

static void logit_grad(void **state) {
    (void)state;
    kl_manual_seed(11);
    /* no eps (negative), and eps clamping part of the range (zero gradient there) */
    attr_check(&(attr_case){kl_logit, kl_logit_inplace, -1}, 0.05, 0.95);
    attr_check(&(attr_case){kl_logit, kl_logit_inplace, 0.2}, 0.25, 0.75);
    attr_check(&(attr_case){kl_logit, kl_logit_inplace, 0.2}, 0.02, 0.18);
    attr_check(&(attr_case){kl_logit, kl_logit_inplace, 0.2}, 0.82, 0.98);
}

static void elu_family_grad(void **state) {
    (void)state;
    kl_manual_seed(12);
    static const double slopes[] = {0.01, 0.2, -0.5, 1.5};
    for (size_t k = 0; k < sizeof slopes / sizeof slopes[0]; k++)
        attr_check(&(attr_case){kl_leaky_relu, kl_leaky_relu_inplace, slopes[k]}, -2, 2);
    static const double alphas[] = {1.0, 0.5, 2.5, -1.0};
    for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
        attr_check(&(attr_case){kl_elu, kl_elu_inplace, alphas[k]}, -2, 2);
        attr_check(&(attr_case){kl_celu, kl_celu_inplace, alphas[k]}, -2, 2);
    }
    /* far positive: the untaken exp branch must not leak inf or NaN */
    attr_check(&(attr_case){kl_elu, kl_elu_inplace, 1.0}, 700, 800);
}

typedef struct ht_bounds {
    double lo, hi;
} ht_bounds;
static kl_tensor *hardtanh_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const ht_bounds *b = (const ht_bounds *)user;
    return kl_hardtanh(in[0], b->lo, b->hi);
}
static kl_tensor *hardtanh_inplace_fn(void *user, int n, kl_tensor *const *in) {
    (void)n;
    const ht_bounds *b = (const ht_bounds *)user;
    return kl_hardtanh_inplace(kl_clone(in[0]), b->lo, b->hi);
}

static void hardtanh_grad(void **state) {
    (void)state;
    kl_manual_seed(13);
    static const ht_bounds bs[] = {{-1, 1}, {-0.5, 0.25}, {0, 6}, {1, -1}};
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++) {
        kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -2, 2);
        kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, -2, 2);
        KT_GRADGRADCHECK(hardtanh_fn, (void *)&bs[k], 1, &x);
        KT_GRADGRADCHECK(hardtanh_inplace_fn, (void *)&bs[k], 1, &x);
        KT_GRADCHECK(hardtanh_fn, (void *)&bs[k], 1, &x0);
    }
}

/* ---- clone, to_dtype, copy --------------------------------------------------------------- */

static kl_tensor *clone_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_mul(kl_clone(in[0]), in[0]);
}
/* through f32 and back: exact enough with an eps that f32 represents */
static kl_tensor *to_dtype_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_to_dtype(kl_mul_scalar(kl_to_dtype(in[0], KL_F32), 3), KL_F64);
}
/* copy(clone(dst), src) squared, plus dst: dst reaches the output only
 * through the add (its overwritten value gets zero), src broadcasts. */
static kl_tensor *copy_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    kl_tensor *d = kl_copy_inplace(kl_clone(in[0]), in[1]);
    return kl_add(kl_mul(d, d), in[0]);
}
static kl_tensor *fill_fn(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    return kl_mul(kl_fill_inplace(kl_clone(in[0]), 2.0), in[0]);
}

static void copies_grad(void **state) {
    (void)state;
    kl_manual_seed(10);
    kl_tensor *x = input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1);
    kl_tensor *x0 = input((kt_form){0, {0}, KT_CONTIG}, -1, 1);
    KT_GRADGRADCHECK(clone_fn, NULL, 1, &x);
    KT_GRADCHECK(clone_fn, NULL, 1, &x0);
    kl_gradcheck_options o = kl_gradcheck_options_default();
    o.eps = 1.0 / 64;
    assert_int_equal(kl_gradcheck(to_dtype_fn, NULL, 1, &x, &o), 1);
    assert_int_equal(kl_gradcheck(to_dtype_fn, NULL, 1, &x0, &o), 1);
    KT_GRADGRADCHECK(copy_fn, NULL, 2,
                     ((kl_tensor *[]){input((kt_form){2, {3, 4}, KT_STRIDED}, -1, 1),
                                      input((kt_form){1, {4}, KT_CONTIG}, -1, 1)}));
    KT_GRADGRADCHECK(copy_fn, NULL, 2,
                     ((kl_tensor *[]){input((kt_form){2, {3, 4}, KT_CONTIG}, -1, 1),
                                      input((kt_form){2, {3, 4}, KT_TRANSPOSED}, -1, 1)}));
    KT_GRADCHECK(copy_fn, NULL, 2,
                 ((kl_tensor *[]){input((kt_form){1, {3}, KT_CONTIG}, -1, 1), input((kt_form){0, {0}, KT_CONTIG}, -1, 1)}));
    KT_GRADCHECK(fill_fn, NULL, 1, &x);
}

/* Casts: the gradient comes back in the input's dtype. */
static void casts_return_the_input_dtype(void **state) {
    (void)state;
    kl_tensor *x = kl_from_data((const double[]){1.5, -2}, 1, (const int64_t[]){2}, KL_F64);
    kl_set_requires_grad(x, true);
    kl_tensor *y = kl_to_dtype(x, KL_F32);
    assert_true(kl_requires_grad(y));
    kl_tensor *go = kl_from_data((const float[]){3, 4}, 1, (const int64_t[]){2}, KL_F32);
    assert_int_equal(kl_backward(y, go, NULL), 0);
    assert_int_equal(kl_dtype_of(kl_grad(x)), KL_F64);
    KT_VALUES(kl_grad(x), 0, 3, 4);
    /* to an integer dtype: no gradient flows (as in PyTorch) */
    assert_false(kl_requires_grad(kl_to_dtype(x, KL_I64)));
    /* copy from f64 into an f32 tensor that did not require grad */
    kl_tensor *d = kl_zeros(2, (const int64_t[]){3, 2}, KL_F32);
    assert_non_null(kl_copy_inplace(d, x));
    assert_true(kl_requires_grad(d));
    assert_int_equal(kl_backward(kl_sum(d, KL_ALL_DIMS, false), NULL, NULL), 0);
    assert_int_equal(kl_dtype_of(kl_grad(x)), KL_F64);
    KT_VALUES(kl_grad(x), 0, 6, 7);
}

/* ---- PyTorch's values at kinks and special points ------------------------------------------ */

/* An f64 leaf requiring grad from n values. */
static kl_tensor *leaf(int64_t n, const double *v) {
    kl_tensor *t = kl_from_data(v, 1, &n, KL_F64);
    kl_set_requires_grad(t, true);
    return t;
}
#define LEAF(...) leaf(sizeof((double[]){__VA_ARGS__}) / sizeof(double), (const double[]){__VA_ARGS__})

/* Gradient of sum(y) with respect to x, computed with kl_backward. */
static kl_tensor *grad_of_sum(kl_tensor *y, kl_tensor *x) {
    assert_non_null(y);
    assert_int_equal(kl_backward(kl_sum(y, KL_ALL_DIMS, false), NULL, NULL), 0);
    assert_non_null(kl_grad(x));
    return kl_grad(x);
}

static void kinks_follow_pytorch(void **state) {
    (void)state;
    kl_tensor *x = LEAF(0, -0.0, NAN, 1, -1);
    KT_VALUES(grad_of_sum(kl_relu(x), x), 0, 0, 0, 1, 1, 0);
    x = LEAF(0, -0.0, NAN, 1, -1);
    KT_VALUES(grad_of_sum(kl_abs(x), x), 0, 0, 0, 0, 1, -1);
    /* relu in place: the saved output is the written tensor */
    x = LEAF(0, -0.0, NAN, 1, -1);
    KT_VALUES(grad_of_sum(kl_relu_inplace(kl_clone(x)), x), 0, 0, 0, 1, 1, 0);

    kl_tensor *a = LEAF(1, 2, NAN, 1, NAN), *b = LEAF(1, 1, 1, NAN, NAN);
    kl_tensor *m = kl_maximum(a, b);
    assert_int_equal(kl_backward(kl_sum(m, KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 0.5, 1, 1, 1, 1);
    KT_VALUES(kl_grad(b), 0, 0.5, 0, 1, 1, 1);
    a = LEAF(1, 2, NAN, 1, NAN), b = LEAF(1, 1, 1, NAN, NAN);
    assert_int_equal(kl_backward(kl_sum(kl_minimum(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 0.5, 0, 1, 1, 1);
    KT_VALUES(kl_grad(b), 0, 0.5, 1, 1, 1, 1);
    /* a 0-dim maximum against [3] ties with one element */
    kl_tensor *s = kl_from_data((const double[]){1}, 0, NULL, KL_F64);
    kl_set_requires_grad(s, true);
    b = LEAF(1, 0, 2);
    assert_int_equal(kl_backward(kl_sum(kl_maximum(s, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(s), 0, 1.5);
    KT_VALUES(kl_grad(b), 0, 0.5, 0, 1);

    x = LEAF(-1, 1, 0, 2, -2, NAN);
    KT_VALUES(grad_of_sum(kl_clamp(x, -1, 1), x), 0, 1, 1, 1, 0, 0, 0);
    x = LEAF(-1, 1, 0, 2, -2, NAN);
    KT_VALUES(grad_of_sum(kl_clamp(x, -1, INFINITY), x), 0, 1, 1, 1, 1, 0, 0);
    x = LEAF(-1, 1, 0, 2, -2, NAN);
    KT_VALUES(grad_of_sum(kl_clamp_inplace(kl_clone(x), -1, 1), x), 0, 1, 1, 1, 0, 0, 0);

    x = LEAF(0.5, 0);
    KT_VALUES(grad_of_sum(kl_sign(x), x), 0, 0, 0);
    x = LEAF(0.5, 1, -1.5);
    KT_VALUES(grad_of_sum(kl_floor(x), x), 0, 0, 0, 0);
    x = LEAF(0.5, 1, -1.5);
    KT_VALUES(grad_of_sum(kl_round_inplace(kl_clone(x)), x), 0, 0, 0, 0);
}

static void special_points_follow_pytorch(void **state) {
    (void)state;
    /* pow at base 0 / exponent 0 */
    kl_tensor *a = LEAF(0, 0, 0, 2, -1, 0), *b = LEAF(0, 1, 2, 0, 2, -1);
    assert_int_equal(kl_backward(kl_sum(kl_pow(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 0, 1, 0, 0, -2, -INFINITY);
    KT_VALUES(kl_grad(b), 1e-15, 0, 0, 0, 0.69314718055994531, NAN, -INFINITY);
    kl_tensor *x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_pow_scalar(x, 0), x), 0, 0, 0);
    x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_pow_scalar(x, 2), x), 0, 0, 2);
    x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_pow_scalar(x, 0.5), x), 0, INFINITY, 0.5);
    x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_pow_scalar(x, -1), x), 0, -INFINITY, -1);
    x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_sqrt(x), x), 0, INFINITY, 0.5);
    x = LEAF(0, 1);
    KT_VALUES(grad_of_sum(kl_log(x), x), 0, INFINITY, 1);
    x = LEAF(0, 4);
    KT_VALUES(grad_of_sum(kl_rsqrt(x), x), 0, -INFINITY, -0.0625);
    x = LEAF(0, 4);
    KT_VALUES(grad_of_sum(kl_reciprocal(x), x), 0, -INFINITY, -0.0625);

    /* remainder: PyTorch's floor division (1 // 0.1 is 9, not 10); b = 0 */
    a = LEAF(1, 5, -5, 5.5, 1), b = LEAF(0.1, 3, 3, -2, 0);
    assert_int_equal(kl_backward(kl_sum(kl_remainder(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 1, 1, 1, 1, 1);
    KT_VALUES(kl_grad(b), 0, -9, -1, 2, 3, -INFINITY);
    a = LEAF(0, 1), b = LEAF(0, 1);
    assert_int_equal(kl_backward(kl_sum(kl_atan2(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, NAN, 0.5);
    KT_VALUES(kl_grad(b), 0, NAN, -0.5);

    x = LEAF(25, 20, 19, -30, 0);
    KT_VALUES(grad_of_sum(kl_softplus(x), x), 1e-14, 1, 0.9999999979388464, 0.9999999943972036, 9.3576229688393e-14,
              0.5);
    x = LEAF(0, 1, -INFINITY);
    KT_VALUES(grad_of_sum(kl_silu(x), x), 1e-15, 0.5, 0.9276705118714869, NAN);
    x = LEAF(0, 1, -1);
    KT_VALUES(grad_of_sum(kl_gelu(x), x), 1e-15, 0.5, 1.0833154705876864, -0.08331547058768635);
    x = LEAF(0, 1, -1);
    KT_VALUES(grad_of_sum(kl_gelu_tanh(x), x), 1e-15, 0.5, 1.0829640838457826, -0.08296408384578252);

    /* where, lerp, masked_fill, tril: exact */
    a = LEAF(1, 2, 3), b = LEAF(4);
    kl_tensor *cond = kl_from_data((const uint8_t[]){1, 0, 1}, 1, (const int64_t[]){3}, KL_BOOL);
    assert_int_equal(kl_backward(kl_sum(kl_where(cond, a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 1, 0, 1);
    KT_VALUES(kl_grad(b), 0, 1);
    a = LEAF(1, 2), b = LEAF(3, 5);
    kl_tensor *w = LEAF(0.25, 0.75);
    assert_int_equal(kl_backward(kl_sum(kl_lerp(a, b, w), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 0.75, 0.25);
    KT_VALUES(kl_grad(b), 0, 0.25, 0.75);
    KT_VALUES(kl_grad(w), 0, 2, 3);
    x = LEAF(1, 2);
    kl_tensor *mask = kl_from_data((const uint8_t[]){1, 0, 0, 0}, 2, (const int64_t[]){2, 2}, KL_BOOL);
    KT_VALUES(grad_of_sum(kl_masked_fill(x, mask, 5), x), 0, 1, 2);
    kl_tensor *t = kl_from_data((const double[]){1, 2, 3, 4, 5, 6}, 2, (const int64_t[]){2, 3}, KL_F64);
    kl_set_requires_grad(t, true);
    KT_VALUES(grad_of_sum(kl_tril(t, -1), t), 0, 0, 0, 0, 1, 0, 0);
}

/* PyTorch 1.13's gradients at the kinks, bounds and poles of issue 12's ops
 * (computed with torch in f64 and hardcoded). */
static void new_ops_special_points(void **state) {
    (void)state;
    kl_tensor *x = LEAF(-1, 1, 0.5, -2);
    KT_VALUES(grad_of_sum(kl_hardtanh(x, -1, 1), x), 0, 0, 0, 1, 0);
    x = LEAF(-3, 3, 0, 4);
    KT_VALUES(grad_of_sum(kl_hardsigmoid(x), x), 0, 0, 0, 0.1666666716337204, 0);
    /* at 3 PyTorch's vectorized loop gives g, its scalar tail 1.5 g: Kiln follows the former */
    x = LEAF(-3, 3, 0, 4, -4, NAN);
    KT_VALUES(grad_of_sum(kl_hardswish(x), x), 0, -0.5, 1, 0.5, 1, 0, NAN);
    x = LEAF(0, -1, 1, NAN);
    KT_VALUES(grad_of_sum(kl_elu(x, 0.5), x), 1e-15, 0.5, 0.18393972058572117, 1, NAN);
    x = LEAF(-1, 1, NAN);
    KT_VALUES(grad_of_sum(kl_hardtanh(x, -1, 1), x), 0, 0, 0, 0);
    x = LEAF(0, 1, -2, INFINITY, NAN);
    KT_VALUES(grad_of_sum(kl_softsign(x), x), 1e-15, 1, 0.25, 0.1111111111111111, NAN, NAN);
    x = LEAF(0, -1, 1);
    KT_VALUES(grad_of_sum(kl_leaky_relu(x, 0.1), x), 0, 0.1, 0.1, 1);
    x = LEAF(0, -1, 1);
    KT_VALUES(grad_of_sum(kl_elu(x, 0.5), x), 1e-15, 0.5, 0.18393972058572117, 1);
    x = LEAF(0, -1, 1);
    KT_VALUES(grad_of_sum(kl_selu(x), x), 1e-15, 1.7580993408473766, 0.646768603034814, 1.0507009873554805);
    x = LEAF(0, -1, 1);
    KT_VALUES(grad_of_sum(kl_celu(x, 2), x), 1e-15, 1, 0.6065306597126334, 1);
    x = LEAF(0, 1, 0.5, -1, 2);
    KT_VALUES(grad_of_sum(kl_logit(x, -1), x), 0, INFINITY, INFINITY, 4, NAN, NAN);
    x = LEAF(0.2, 0.8, 0.1, 0.9, 0.5);
    KT_VALUES(grad_of_sum(kl_logit(x, 0.2), x), 1e-15, 6.25, 6.25, 0, 0, 4);
    x = LEAF(0, 1, -1, 25);
    KT_VALUES(grad_of_sum(kl_mish(x), x), 1e-15, 0.6, 1.0490362200997922, 0.059216755877395014, 1);
    x = LEAF(0, 1, -2);
    KT_VALUES(grad_of_sum(kl_softsign(x), x), 1e-15, 1, 0.25, 0.1111111111111111);
    x = LEAF(1, -1, 0);
    KT_VALUES(grad_of_sum(kl_asin(x), x), 0, INFINITY, INFINITY, 1);
    x = LEAF(1, 2);
    KT_VALUES(grad_of_sum(kl_acosh(x), x), 1e-15, INFINITY, 0.5773502691896258);
    x = LEAF(1, 0.5);
    KT_VALUES(grad_of_sum(kl_atanh(x), x), 1e-15, INFINITY, 1.3333333333333333);

    kl_tensor *a = LEAF(0, 0, 2, 1), *b = LEAF(0, 2, 0, NAN);
    assert_int_equal(kl_backward(kl_sum(kl_xlogy(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 1e-15, 0, 0.6931471805599453, -INFINITY, NAN);
    KT_VALUES(kl_grad(b), 0, NAN, 0, INFINITY, NAN);
    a = LEAF(0, -2, 3), b = LEAF(1, 1, -0.0);
    assert_int_equal(kl_backward(kl_sum(kl_copysign(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 0, -1, -1);
    KT_VALUES(kl_grad(b), 0, 0, 0, 0);
    a = LEAF(1, 5, -5, 5.5, 1), b = LEAF(0.1, 3, 3, -2, 0);
    assert_int_equal(kl_backward(kl_sum(kl_fmod(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 0, 1, 1, 1, 1, 1);
    KT_VALUES(kl_grad(b), 0, -10, -1, 1, 2, -INFINITY);
    a = LEAF(0, 3), b = LEAF(0, 4);
    assert_int_equal(kl_backward(kl_sum(kl_hypot(a, b), KL_ALL_DIMS, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(a), 1e-15, NAN, 0.6);
    KT_VALUES(kl_grad(b), 1e-15, NAN, 0.8);
}

/* Gradients stay in the input's dtype; f16 activations compute their
 * gradient in f32 and round once (values from torch in f64). */
static void low_precision_gradients(void **state) {
    (void)state;
    kl_tensor *x = kl_to_dtype(kl_from_data((const double[]){-1, 0.5, 2}, 1, (const int64_t[]){3}, KL_F64), KL_F16);
    kl_set_requires_grad(x, true);
    kl_tensor *g = grad_of_sum(kl_gelu(x), x);
    assert_int_equal(kl_dtype_of(g), KL_F16);
    KT_VALUES(g, 1e-3, -0.08331547058768635, 0.8674951246561629, 1.085231801078197);
    kl_tensor *y = kl_to_dtype(kl_from_data((const double[]){-1, 0.5, 2}, 1, (const int64_t[]){3}, KL_F64), KL_BF16);
    kl_set_requires_grad(y, true);
    g = grad_of_sum(kl_mul(kl_tanh(y), kl_from_data((const float[]){1, 2, 3}, 1, (const int64_t[]){3}, KL_F32)), y);
    assert_int_equal(kl_dtype_of(g), KL_BF16);
    KT_VALUES(g, 1e-2, 0.41997434161402614, 1.5728954659318548, 0.2119524745594933);
}

/* add hands the same gradient to both inputs: accumulating into one leaf's
 * grad must not change the other's. */
static void shared_gradients_do_not_alias(void **state) {
    (void)state;
    kl_tensor *a = LEAF(1, 2), *b = LEAF(3, 4);
    kl_tensor *loss = kl_sum(kl_add(a, b), KL_ALL_DIMS, false);
    kl_backward_options o = kl_backward_options_default();
    o.retain_graph = true;
    assert_int_equal(kl_backward(loss, NULL, &o), 0);
    assert_int_equal(kl_backward(loss, NULL, &o), 0);
    KT_VALUES(kl_grad(a), 0, 2, 2);
    KT_VALUES(kl_grad(b), 0, 2, 2);
    kl_tensor *x = LEAF(1, 2);
    KT_VALUES(grad_of_sum(kl_add(x, x), x), 0, 2, 2);
}

/* ---- the test list --------------------------------------------------------------------------- */

#define KT_CASE(test, st) \
    {.name = #st, .test_func = test, .setup_func = kt_setup, .teardown_func = kt_teardown, .initial_state = &st}
#define UNARY_ENTRY(op, lo, hi, second) KT_CASE(unary_test, unary_##op),
#define BINARY_ENTRY(op, alo, ahi, blo, bhi, s) KT_CASE(binary_test, binary_##op),

const struct CMUnitTest kt_grad_ew_tests[] = {
    UNARY_CASES(UNARY_ENTRY)
    KT_CASE(unary_test, unary_softplus_big),
    KT_CASE(unary_test, unary_floor_neg),
    KT_CASE(unary_test, unary_ceil_neg),
    KT_CASE(unary_test, unary_round_neg),
    BINARY_CASES(BINARY_ENTRY)
    KT_CASE(binary_test, binary_remainder_neg),
    KT_CASE(binary_test, binary_pow_neg),
    KT_CASE(unary_test, unary_softsign),
    KT_CASE(unary_test, unary_hardsigmoid_out),
    KT_CASE(unary_test, unary_hardswish_out),
    KT_CASE(unary_test, unary_hardswish_hi),
    KT_CASE(unary_test, unary_mish_far),
    KT_CASE(binary_test, binary_fmod_neg),
    KT_CASE(binary_test, binary_copysign_pos),
    KT_TEST(logit_grad),
    KT_TEST(elu_family_grad),
    KT_TEST(hardtanh_grad),
    KT_TEST(new_ops_special_points),
    KT_TEST(reversed_scalar_forms),
    KT_TEST(pow_exponent_forms),
    KT_TEST(where_grad),
    KT_TEST(clamp_grad),
    KT_TEST(lerp_grad),
    KT_TEST(masked_fill_grad),
    KT_TEST(tril_triu_grad),
    KT_TEST(copies_grad),
    KT_TEST(casts_return_the_input_dtype),
    KT_TEST(kinks_follow_pytorch),
    KT_TEST(special_points_follow_pytorch),
    KT_TEST(low_precision_gradients),
    KT_TEST(shared_gradients_do_not_alias),
};
const size_t kt_grad_ew_count = sizeof kt_grad_ew_tests / sizeof kt_grad_ew_tests[0];
