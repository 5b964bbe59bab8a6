/*
 * d_ew.c — derivative formulas of the elementwise family (named by the rows
 * of ops_unary.def, ops_binary.def, ops_ew_other.def, ops_create.def):
 * unary and binary math, where/clamp/lerp/masked_fill, tril/triu,
 * clone/to_dtype/copy.
 *
 * Each mirrors PyTorch 1.13's derivatives.yaml, including its conventions
 * where the function has a kink (relu at 0 -> 0, abs at 0 -> 0, maximum and
 * minimum ties split half-half, clamp passes at its bounds, pow at base 0 /
 * exponent 0). Formulas are written with differentiable kl_ ops only, so the
 * same formula runs on any backend and double backward differentiates it.
 * Broadcast gradients are left at the output's shape: the engine sums them
 * to each input's shape and casts them to its dtype.
 */
#include "autograd.h"

#include <math.h>

/* Stores one input's gradient; NULL means a kl_ op failed (error recorded). */
static int put(ag_ctx *c, int i, kl_tensor *t) {
    c->gin[i] = t;
    return t ? 0 : -1;
}

/* f16/bf16 values entering a multi-step formula are widened to f32 so the
 * gradient rounds once, as PyTorch's fused backward kernels do; the engine
 * casts the result back to the input's dtype. */
static kl_tensor *wide(kl_tensor *t) {
    if (!t) return NULL;
    kl_dtype d = kl_dtype_of(t);
    return d == KL_F16 || d == KL_BF16 ? kl_to_dtype(t, KL_F32) : t;
}

/* ---- unary ------------------------------------------------------------------------ */

/* gin[0] = expr, over g (the output's gradient), x (the saved input) and y
 * (the saved output); the row's save mask says which of x, y is non-NULL. */
#define UNARY(op, expr)                                               \
    int ag_d_##op(ag_ctx *c) {                                        \
        kl_tensor *g = c->gout[0], *x = c->in[0], *y = c->out[0];     \
        (void)g, (void)x, (void)y;                                    \
        return c->need[0] ? put(c, 0, (expr)) : 0;                    \
    }

#define LN2 0.69314718055994530942
#define TWO_OVER_SQRTPI 1.12837916709551257390  /* d erf(x)/dx = this * exp(-x^2) */
#define INV_SQRT_2PI 0.39894228040143267794    /* standard normal pdf at 0 */
#define SQRT_2_OVER_PI 0.79788456080286535588  /* gelu_tanh's inner scale */
#define GELU_KAPPA 0.044715

UNARY(neg, kl_neg(g))
/* sign(0) = 0: abs passes nothing at 0, as PyTorch's sgn */
UNARY(abs, kl_mul(g, kl_sign(x)))
UNARY(exp, kl_mul(g, y))
UNARY(exp2, kl_mul(g, kl_mul_scalar(y, LN2)))
UNARY(expm1, kl_mul(g, kl_add_scalar(y, 1.0)))
UNARY(log, kl_div(g, x))
UNARY(log2, kl_div(g, kl_mul_scalar(x, LN2)))
UNARY(log1p, kl_div(g, kl_add_scalar(x, 1.0)))
UNARY(sqrt, kl_div(g, kl_mul_scalar(y, 2.0)))
UNARY(rsqrt, kl_mul(g, kl_mul_scalar(kl_pow_scalar(y, 3.0), -0.5)))
/* PyTorch computes square as pow(x, 2): 2 x^1 */
UNARY(square, kl_mul(g, kl_mul_scalar(x, 2.0)))
UNARY(reciprocal, kl_mul(kl_neg(g), kl_mul(y, y)))
UNARY(sin, kl_mul(g, kl_cos(x)))
UNARY(cos, kl_mul(g, kl_neg(kl_sin(x))))
UNARY(tan, kl_mul(g, kl_add_scalar(kl_square(wide(y)), 1.0)))
UNARY(tanh, kl_mul(g, kl_rsub_scalar(kl_square(wide(y)), 1.0)))
UNARY(sigmoid, kl_mul(g, kl_mul(kl_rsub_scalar(wide(y), 1.0), wide(y))))
/* threshold_backward(g, result, 0): zero where result <= 0, so NaN passes;
 * one pass (ops_ew_other.def) */
static kl_tensor *threshold_backward(kl_tensor *g, kl_tensor *y, double threshold) {
    ke_attrs a = {0};
    ke_attr_set_threshold_backward_threshold(&a, threshold);
    return ag_call(KE_OP_threshold_backward, 2, (kl_tensor *[]){g, y}, &a);
}
UNARY(relu, threshold_backward(g, y, 0.0))
UNARY(erf, kl_mul(g, kl_mul_scalar(kl_exp(kl_neg(kl_square(wide(x)))), TWO_OVER_SQRTPI)))

/* Piecewise constant: PyTorch's gradient is zeros (not an error). */
#define ZERO(op) UNARY(op, ag_zeros(&c->in_meta[0]))
ZERO(sign)
ZERO(floor)
ZERO(ceil)
ZERO(round)
ZERO(trunc)

/* gelu(x) = x Phi(x): g (Phi(x) + x phi(x)) */
int ag_d_gelu(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = wide(c->in[0]);
    kl_tensor *cdf = kl_mul_scalar(kl_add_scalar(kl_erf(kl_mul_scalar(x, M_SQRT1_2)), 1.0), 0.5);
    kl_tensor *pdf = kl_mul_scalar(kl_exp(kl_mul_scalar(kl_square(x), -0.5)), INV_SQRT_2PI);
    return put(c, 0, kl_mul(c->gout[0], kl_add(cdf, kl_mul(x, pdf))));
}

/* gelu_tanh(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + kappa x^3):
 * g ((1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 kappa x^2)), t = tanh(u) */
int ag_d_gelu_tanh(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = wide(c->in[0]);
    kl_tensor *x2 = kl_square(x);
    kl_tensor *t = kl_tanh(kl_mul_scalar(kl_add(x, kl_mul_scalar(kl_mul(x2, x), GELU_KAPPA)), SQRT_2_OVER_PI));
    kl_tensor *left = kl_mul_scalar(kl_add_scalar(t, 1.0), 0.5);
    kl_tensor *du = kl_mul_scalar(kl_add_scalar(kl_mul_scalar(x2, 3.0 * GELU_KAPPA), 1.0), SQRT_2_OVER_PI);
    kl_tensor *right = kl_mul(kl_mul(kl_mul_scalar(x, 0.5), kl_rsub_scalar(kl_square(t), 1.0)), du);
    return put(c, 0, kl_mul(c->gout[0], kl_add(left, right)));
}

/* silu(x) = x s(x): g s (1 + x (1 - s)) */
int ag_d_silu(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = wide(c->in[0]);
    kl_tensor *s = kl_sigmoid(x);
    kl_tensor *d = kl_mul(s, kl_add_scalar(kl_mul(x, kl_rsub_scalar(s, 1.0)), 1.0));
    return put(c, 0, kl_mul(c->gout[0], d));
}

/* softplus (beta 1, threshold 20, fixed in the kernel): g above the
 * threshold, else g sigmoid(x) — PyTorch's z/(z+1) with z = exp(x), written
 * without exp's overflow so double backward stays finite for large x. */
int ag_d_softplus(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *g = c->gout[0], *x = c->in[0];
    kl_tensor *soft = kl_mul(g, kl_sigmoid(wide(x)));
    return put(c, 0, kl_where(kl_gt_scalar(x, 20.0), g, soft));
}

/* ---- issue 12's unary ops (derivatives.yaml of PyTorch 1.13) ---------------------- */

#define LN10 2.30258509299404568402
#define SELU_ALPHA 1.6732632423543772848170429916717
#define SELU_SCALE 1.0507009873554804934193349852946

UNARY(sinh, kl_mul(g, kl_cosh(x)))
UNARY(cosh, kl_mul(g, kl_sinh(x)))
/* (1 - x^2)^(-1/2), written as PyTorch's (-x * x + 1).rsqrt() */
UNARY(asin, kl_mul(g, kl_rsqrt(kl_rsub_scalar(kl_square(wide(x)), 1.0))))
UNARY(acos, kl_mul(g, kl_neg(kl_rsqrt(kl_rsub_scalar(kl_square(wide(x)), 1.0)))))
UNARY(atan, kl_div(g, kl_add_scalar(kl_square(wide(x)), 1.0)))
UNARY(asinh, kl_mul(g, kl_rsqrt(kl_add_scalar(kl_square(wide(x)), 1.0))))
UNARY(acosh, kl_mul(g, kl_rsqrt(kl_sub_scalar(kl_square(wide(x)), 1.0))))
UNARY(atanh, kl_div(g, kl_rsub_scalar(kl_square(wide(x)), 1.0)))
UNARY(log10, kl_div(g, kl_mul_scalar(x, LN10)))

/* logit: f0 = eps. g / (x (1 - x)) inside [eps, 1 - eps] (bounds included)
 * and 0 outside; with no eps (< 0), inside [0, 1] and NaN outside, as
 * PyTorch's infinitely_differentiable_logit_backward. */
int ag_d_logit(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = wide(c->in[0]);
    double eps = ke_attr_logit_eps(c->a), lo = eps >= 0 ? eps : 0, hi = eps >= 0 ? 1 - eps : 1;
    kl_tensor *d = kl_div(c->gout[0], kl_mul(x, kl_rsub_scalar(x, 1.0)));
    kl_tensor *out = kl_logical_not(kl_logical_and(kl_ge_scalar(x, lo), kl_le_scalar(x, hi)));
    return put(c, 0, kl_masked_fill(d, out, eps >= 0 ? 0.0 : NAN));
}

/* leaky_relu: f0 = negative_slope; leaky_relu_backward: x > 0 ? g : g * slope */
UNARY(leaky_relu, kl_where(kl_gt_scalar(x, 0.0), g, kl_mul_scalar(g, ke_attr_leaky_relu_negative_slope(c->a))))

/* elu_backward with is_result false: x <= 0 (or NaN) ? g * ic * nc * exp(x * ic) : g * pc.
 * exp sees min(x, 0): where's untaken branch would otherwise overflow to inf
 * for large x and double backward would meet 0 * inf. */
static int elu_grad(ag_ctx *c, double nc, double pc, double ic) {
    if (!c->need[0]) return 0;
    kl_tensor *g = c->gout[0], *x = wide(c->in[0]);
    kl_tensor *e = kl_exp(kl_mul_scalar(kl_clamp(x, -INFINITY, 0.0), ic));
    kl_tensor *neg = kl_mul(g, kl_mul_scalar(e, ic * nc));
    kl_tensor *pos = pc == 1.0 ? g : kl_mul_scalar(g, pc);
    /* x > 0 picks pos, so NaN takes the exp branch and stays NaN (PyTorch's
     * vectorized elu_backward) */
    return put(c, 0, kl_where(kl_gt_scalar(x, 0.0), pos, neg));
}
int ag_d_elu(ag_ctx *c) { return elu_grad(c, ke_attr_elu_alpha(c->a), 1.0, 1.0); }
int ag_d_selu(ag_ctx *c) { return elu_grad(c, SELU_ALPHA * SELU_SCALE, SELU_SCALE, 1.0); }
int ag_d_celu(ag_ctx *c) { return elu_grad(c, ke_attr_celu_alpha(c->a), 1.0, 1.0 / ke_attr_celu_alpha(c->a)); }

/* softsign = x / (|x| + 1) is a composite in PyTorch; its autograd gives
 * g (1/d - |x|/d^2), d = |x| + 1, which is NaN at +-inf (not 0): kept so. */
int ag_d_softsign(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *ax = kl_abs(wide(c->in[0]));
    kl_tensor *d = kl_add_scalar(ax, 1.0);
    return put(c, 0, kl_mul(c->gout[0], kl_sub(kl_reciprocal(d), kl_div(ax, kl_square(d)))));
}

/* hardtanh: f0, f1 = bounds; hardtanh_backward passes strictly inside them
 * (NaN gets 0, as its vectorized loop gives) */
UNARY(hardtanh, kl_masked_fill(g, kl_logical_not(kl_logical_and(kl_gt_scalar(x, ke_attr_hardtanh_min_val(c->a)), kl_lt_scalar(x, ke_attr_hardtanh_max_val(c->a)))), 0.0))
/* hardsigmoid_backward: g * (1.0f / 6) (PyTorch's float constant, in every
 * dtype) strictly inside (-3, 3), else 0 (NaN too) */
UNARY(hardsigmoid, kl_masked_fill(kl_mul_scalar(g, (double)(1.0f / 6.0f)),
                                  kl_logical_not(kl_logical_and(kl_gt_scalar(x, -3.0), kl_lt_scalar(x, 3.0))), 0.0))

/* hardswish_backward as PyTorch's vectorized loop (what tensors of more than
 * a few elements get): 0 below -3, g from 3 on (its scalar tail gives
 * 1.5 g at exactly 3), g (x/3 + 1/2) between and for NaN (NaN). */
int ag_d_hardswish(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *g = c->gout[0], *x = c->in[0];
    kl_tensor *mid = kl_mul(g, kl_add_scalar(kl_div_scalar(wide(x), 3.0), 0.5));
    kl_tensor *d = kl_where(kl_ge_scalar(x, 3.0), g, mid);
    return put(c, 0, kl_masked_fill(d, kl_lt_scalar(x, -3.0), 0.0));
}

/* mish_backward: g (t + x s (1 - t^2)), t = tanh(softplus(x)), s = sigmoid(x) */
int ag_d_mish(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = wide(c->in[0]);
    kl_tensor *t = kl_tanh(kl_softplus(x));
    kl_tensor *d = kl_add(t, kl_mul(kl_mul(x, kl_sigmoid(x)), kl_rsub_scalar(kl_square(t), 1.0)));
    return put(c, 0, kl_mul(c->gout[0], d));
}

/* ---- binary --------------------------------------------------------------------------
 * Input 1 (or input 0 of rsub/rdiv) may be a wrapped C scalar: it never
 * requires grad, and it enters the formulas as a 0-dim tensor. */

int ag_d_add(ag_ctx *c) {
    kl_tensor *g = c->gout[0];
    if (c->need[0] && put(c, 0, g)) return -1;
    if (c->need[1] && put(c, 1, g)) return -1;
    return 0;
}

int ag_d_sub(ag_ctx *c) {
    kl_tensor *g = c->gout[0];
    if (c->need[0] && put(c, 0, g)) return -1;
    if (c->need[1] && put(c, 1, kl_neg(g))) return -1;
    return 0;
}

int ag_d_mul(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    if (c->need[0] && put(c, 0, kl_mul(g, b))) return -1;
    if (c->need[1] && put(c, 1, kl_mul(g, a))) return -1;
    return 0;
}

/* d(a/b)/db = -(a/b)/b, as div_tensor_other_backward */
int ag_d_div(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    if (c->need[0] && put(c, 0, kl_div(g, b))) return -1;
    if (c->need[1] && put(c, 1, kl_mul(kl_neg(g), kl_div(kl_div(a, b), b)))) return -1;
    return 0;
}

/* remainder(a, b) = a - b floor_div(a, b): d/db = -floor_div(a, b), with
 * PyTorch's floor division (a - remainder)/b rounded, not floor(a/b), which
 * is off by one where a/b rounds up to an integer; a/b where b is 0. The
 * quotient is piecewise constant (PyTorch's derivative of floor division is
 * zero), so it enters detached: double backward sees a constant. */
int ag_d_remainder(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    if (c->need[0] && put(c, 0, g)) return -1;
    if (c->need[1]) {
        kl_tensor *q = kl_round(kl_div(kl_sub(a, kl_remainder(a, b)), b));
        q = kl_where(kl_eq_scalar(b, 0.0), kl_div(a, b), q);
        /* b = ±inf, a finite of the other sign: a - remainder is inf - inf,
         * PyTorch's floor division gives -1 (test_fixtures' remainder cases) */
        kl_tensor *opp = kl_logical_and(kl_logical_and(kl_isinf(b), kl_isfinite(a)), kl_lt_scalar(kl_mul(a, b), 0.0));
        q = kl_detach(kl_masked_fill(q, opp, -1.0));
        if (put(c, 1, kl_mul(kl_neg(g), q))) return -1;
    }
    return 0;
}

/* pow(x, e): d/dx = e x^(e-1), zero where e == 0 (x^-1 would make 0 * inf
 * at x = 0); d/de = result log(x), zero where x == 0 and e >= 0. The same
 * formula serves pow_scalar, whose e is a wrapped scalar. */
int ag_d_pow(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *x = c->in[0], *e = c->in[1], *y = c->out[0];
    if (c->need[0]) {
        kl_tensor *d = kl_mul(e, kl_pow(x, kl_sub_scalar(e, 1.0)));
        if (put(c, 0, kl_masked_fill(kl_mul(g, d), kl_eq_scalar(e, 0.0), 0.0))) return -1;
    }
    if (c->need[1]) {
        kl_tensor *zero = kl_logical_and(kl_eq_scalar(x, 0.0), kl_ge_scalar(e, 0.0));
        if (put(c, 1, kl_mul(g, kl_masked_fill(kl_mul(y, kl_log(x)), zero, 0.0)))) return -1;
    }
    return 0;
}

/* Ties split the gradient half-half; where a comparison is false both ways
 * (NaN) both inputs get all of it, as in PyTorch. `lose(a, b)` is where
 * input 0 loses; input 1 loses at lose(b, a). */
static int minmax(ag_ctx *c, kl_tensor *(*lose)(kl_tensor *, kl_tensor *)) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    kl_tensor *half = kl_where(kl_eq(a, b), kl_mul_scalar(g, 0.5), g);
    if (c->need[0] && put(c, 0, kl_masked_fill(half, lose(a, b), 0.0))) return -1;
    if (c->need[1] && put(c, 1, kl_masked_fill(half, lose(b, a), 0.0))) return -1;
    return half ? 0 : -1;
}
int ag_d_maximum(ag_ctx *c) { return minmax(c, kl_lt); }
int ag_d_minimum(ag_ctx *c) { return minmax(c, kl_gt); }

int ag_d_atan2(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    kl_tensor *r = kl_reciprocal(kl_add(kl_mul(a, a), kl_mul(b, b)));
    if (c->need[0] && put(c, 0, kl_mul(kl_mul(g, b), r))) return -1;
    if (c->need[1] && put(c, 1, kl_mul(kl_mul(g, kl_neg(a)), r))) return -1;
    return r ? 0 : -1;
}

/* fmod(a, b) = a - b trunc(a / b): d/db = -trunc(a / b), piecewise constant
 * (detached, as for remainder). */
int ag_d_fmod(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    if (c->need[0] && put(c, 0, g)) return -1;
    if (c->need[1] && put(c, 1, kl_mul(kl_neg(g), kl_detach(kl_trunc(kl_div(a, b)))))) return -1;
    return 0;
}

/* hypot: g a / result, g b / result */
int ag_d_hypot(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1], *y = c->out[0];
    if (c->need[0] && put(c, 0, kl_div(kl_mul(g, a), y))) return -1;
    if (c->need[1] && put(c, 1, kl_div(kl_mul(g, b), y))) return -1;
    return 0;
}

/* copysign_tensor_self_backward: g * result / a, 0 where a == 0; b gets zeros */
int ag_d_copysign(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *y = c->out[0];
    if (c->need[0] && put(c, 0, kl_mul(g, kl_masked_fill(kl_div(y, a), kl_eq_scalar(a, 0.0), 0.0)))) return -1;
    if (c->need[1] && put(c, 1, ag_zeros(&c->in_meta[1]))) return -1;
    return 0;
}

/* xlogy: d/da = g log(b), 0 where a == 0 and b <= 0 (PyTorch 1.13's
 * other.log().masked_fill((self == 0) & (other <= 0), 0)); d/db = g a / b. */
int ag_d_xlogy(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1];
    if (c->need[0]) {
        kl_tensor *zero = kl_logical_and(kl_eq_scalar(a, 0.0), kl_le_scalar(b, 0.0));
        /* b in g's dtype: the log of a wrapped scalar would be the default float */
        kl_tensor *lb = kl_log(kl_to_dtype(b, kl_dtype_of(g)));
        if (put(c, 0, kl_mul(g, kl_masked_fill(lb, zero, 0.0)))) return -1;
    }
    if (c->need[1] && put(c, 1, kl_div(kl_mul(g, a), b))) return -1;
    return 0;
}

/* ---- other elementwise ---------------------------------------------------------------- */

/* where(cond, a, b): cond (input 0, bool) has no gradient */
int ag_d_where(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *cond = c->in[0];
    if (c->need[1] && put(c, 1, kl_masked_fill(g, kl_logical_not(cond), 0.0))) return -1;
    if (c->need[2] && put(c, 2, kl_masked_fill(g, cond, 0.0))) return -1;
    return 0;
}

/* Passes where lo <= x <= hi (bounds included). An absent bound is +-inf,
 * which every x but NaN satisfies: NaN gets zero, as in PyTorch whichever
 * bounds are given. */
int ag_d_clamp(ag_ctx *c) {
    if (!c->need[0]) return 0;
    kl_tensor *x = c->in[0];
    kl_tensor *in = kl_logical_and(kl_ge_scalar(x, ke_attr_clamp_min(c->a)), kl_le_scalar(x, ke_attr_clamp_max(c->a)));
    return put(c, 0, kl_masked_fill(c->gout[0], kl_logical_not(in), 0.0));
}

/* lerp(a, b, w) = a + w (b - a) */
int ag_d_lerp(ag_ctx *c) {
    kl_tensor *g = c->gout[0], *a = c->in[0], *b = c->in[1], *w = c->in[2];
    if (c->need[0] && put(c, 0, kl_mul(g, kl_rsub_scalar(w, 1.0)))) return -1;
    if (c->need[1] && put(c, 1, kl_mul(g, w))) return -1;
    if (c->need[2] && put(c, 2, kl_mul(g, kl_sub(b, a)))) return -1;
    return 0;
}

int ag_d_lerp_scalar(ag_ctx *c) {
    kl_tensor *g = c->gout[0];
    double w = ke_attr_lerp_scalar_weight(c->a);
    if (c->need[0] && put(c, 0, kl_mul_scalar(g, 1.0 - w))) return -1;
    if (c->need[1] && put(c, 1, kl_mul_scalar(g, w))) return -1;
    return 0;
}

/* threshold_backward(g, y) is linear in g (the same mask again: relu's
 * double backward) and piecewise constant in y (PyTorch: zeros). */
int ag_d_threshold_backward(ag_ctx *c) {
    if (c->need[0] && put(c, 0, threshold_backward(c->gout[0], c->in[1], ke_attr_threshold_backward_threshold(c->a))))
        return -1;
    if (c->need[1] && put(c, 1, ag_zeros(&c->in_meta[1]))) return -1;
    return 0;
}

/* masked_fill(x, mask): filled places take nothing from x */
int ag_d_masked_fill(ag_ctx *c) {
    return c->need[0] ? put(c, 0, kl_masked_fill(c->gout[0], c->in[1], 0.0)) : 0;
}

/* tril / triu keep their diagonal offset (triu has tril's attributes) */
UNARY(tril, kl_tril(g, ke_attr_tril_diagonal(c->a)))
UNARY(triu, kl_triu(g, ke_attr_tril_diagonal(c->a)))

/* ---- copies ----------------------------------------------------------------------------- */

UNARY(clone, g)
/* The engine casts the gradient back to the input's dtype. An integer
 * result has no gradient (gout NULL): nothing flows back. */
int ag_d_to_dtype(ag_ctx *c) {
    return c->need[0] && c->gout[0] ? put(c, 0, c->gout[0]) : 0;
}

/* copy(dst, src) overwrites dst: dst's old value gets no gradient (NULL);
 * src gets the output's, summed over broadcast dims and cast by the engine. */
int ag_d_copy(ag_ctx *c) {
    return c->need[1] && c->gout[0] ? put(c, 1, c->gout[0]) : 0;
}
