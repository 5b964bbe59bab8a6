/*
 * init.c — parameter initialisers with torch.nn.init's formulas (gains, fans,
 * bounds). Values come from Kiln's Philox generator through kl_rand_like /
 * kl_randn_like, are shaped with kl_ ops and copied into the tensor under
 * no-grad, so initialising a leaf that requires grad records nothing.
 */
#include "core.h"

#include <math.h>

static int check_float(const kl_tensor *t, const char *op) {
    if (ke_check_tensor(t, op, 1)) return -1;
    if (!ke_is_float((kl_dtype)t->dtype))
        return ke_err(KL_ERR_DTYPE, op, "needs a floating tensor, got %s", ke_dtypes[t->dtype].name);
    return 0;
}

/* torch.nn.init.calculate_gain, one row per kl_nonlinearity; NAN marks the
 * one gain that depends on its parameter (leaky_relu). */
static const double nonlin_gain[] = {
    [KL_NONLIN_LINEAR]           = 1.0,
    [KL_NONLIN_SIGMOID]          = 1.0,
    [KL_NONLIN_TANH]             = 5.0 / 3.0,
    [KL_NONLIN_RELU]             = 1.4142135623730951, /* sqrt(2) */
    [KL_NONLIN_LEAKY_RELU]       = NAN,                /* sqrt(2 / (1 + slope^2)) */
    [KL_NONLIN_SELU]             = 3.0 / 4.0,
    [KL_NONLIN_CONV1D]           = 1.0,
    [KL_NONLIN_CONV2D]           = 1.0,
    [KL_NONLIN_CONV3D]           = 1.0,
    [KL_NONLIN_CONV_TRANSPOSE1D] = 1.0,
    [KL_NONLIN_CONV_TRANSPOSE2D] = 1.0,
    [KL_NONLIN_CONV_TRANSPOSE3D] = 1.0,
};
_Static_assert(sizeof nonlin_gain / sizeof nonlin_gain[0] == KL_NUM_NONLINS, "one gain per nonlinearity");

double kl_init_calculate_gain(kl_nonlinearity nl, double param) {
    if ((unsigned)nl >= KL_NUM_NONLINS) {
        ke_err(KL_ERR_ARG, "init_calculate_gain", "unknown nonlinearity %d", (int)nl);
        return NAN;
    }
    if (nl == KL_NONLIN_LEAKY_RELU) return sqrt(2.0 / (1.0 + param * param));
    return nonlin_gain[nl];
}

int kl_init_calculate_fans(const kl_tensor *t, int64_t *fan_in, int64_t *fan_out) {
    if (ke_check_tensor(t, "init_calculate_fans", 1)) return -1;
    if (t->ndim < 2)
        return ke_err(KL_ERR_SHAPE, "init_calculate_fans",
                      "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions "
                      "(got %d)", t->ndim);
    int64_t receptive = 1;
    for (int d = 2; d < t->ndim; d++) receptive *= t->shape[d];
    if (fan_in) *fan_in = t->shape[1] * receptive;
    if (fan_out) *fan_out = t->shape[0] * receptive;
    return 0;
}

/* t <- scale * r + shift, where r = kl_rand_like(t) (normal: kl_randn_like). */
static kl_tensor *fill_random(kl_tensor *t, bool normal, double scale, double shift) {
    if (ke_numel(t->ndim, t->shape) == 0) return t;
    kl_no_grad_begin();
    kl_scope_begin();
    kl_tensor *r = normal ? kl_randn_like(t) : kl_rand_like(t);
    kl_mul_scalar_inplace(r, scale);
    kl_add_scalar_inplace(r, shift);
    kl_tensor *res = r ? kl_copy_inplace(t, r) : NULL;
    kl_scope_end();
    kl_no_grad_end();
    return res;
}

kl_tensor *kl_init_uniform(kl_tensor *t, double a, double b) {
    if (check_float(t, "init_uniform")) return NULL;
    if (!(a <= b)) {
        ke_err(KL_ERR_ARG, "init_uniform", "expects a <= b, got a=%g, b=%g", a, b);
        return NULL;
    }
    return fill_random(t, false, b - a, a);
}

kl_tensor *kl_init_normal(kl_tensor *t, double mean, double std) {
    if (check_float(t, "init_normal")) return NULL;
    if (!(std >= 0)) {
        ke_err(KL_ERR_ARG, "init_normal", "expects std >= 0, got %g", std);
        return NULL;
    }
    return fill_random(t, true, std, mean);
}

kl_tensor *kl_init_constant(kl_tensor *t, double value) {
    if (check_float(t, "init_constant")) return NULL;
    kl_no_grad_begin();
    kl_tensor *res = kl_fill_inplace(t, value);
    kl_no_grad_end();
    return res;
}

kl_tensor *kl_init_zeros(kl_tensor *t) {
    if (check_float(t, "init_zeros")) return NULL;
    return kl_init_constant(t, 0.0);
}

kl_tensor *kl_init_ones(kl_tensor *t) {
    if (check_float(t, "init_ones")) return NULL;
    return kl_init_constant(t, 1.0);
}

static kl_tensor *xavier(kl_tensor *t, double gain, bool normal, const char *op) {
    if (check_float(t, op)) return NULL;
    int64_t fi, fo;
    if (kl_init_calculate_fans(t, &fi, &fo)) return NULL;
    if (fi + fo == 0) return t; /* no elements: nothing to draw */
    double std = gain * sqrt(2.0 / (double)(fi + fo));
    if (normal) return fill_random(t, true, std, 0.0);
    double a = sqrt(3.0) * std;
    return fill_random(t, false, 2 * a, -a);
}

kl_tensor *kl_init_xavier_uniform(kl_tensor *t, double gain) {
    return xavier(t, gain, false, "init_xavier_uniform");
}

kl_tensor *kl_init_xavier_normal(kl_tensor *t, double gain) {
    return xavier(t, gain, true, "init_xavier_normal");
}

static kl_tensor *kaiming(kl_tensor *t, double a, kl_fan_mode mode, kl_nonlinearity nl, bool normal,
                          const char *op) {
    if (check_float(t, op)) return NULL;
    if (mode != KL_FAN_IN && mode != KL_FAN_OUT) {
        ke_err(KL_ERR_ARG, op, "mode %d is not KL_FAN_IN or KL_FAN_OUT", (int)mode);
        return NULL;
    }
    int64_t fi, fo;
    if (kl_init_calculate_fans(t, &fi, &fo)) return NULL;
    /* PyTorch warns and returns for zero-element tensors (a fan may be 0). */
    if (ke_numel(t->ndim, t->shape) == 0) return t;
    double gain = kl_init_calculate_gain(nl, a);
    if (isnan(gain)) return NULL;
    double std = gain / sqrt((double)(mode == KL_FAN_IN ? fi : fo));
    if (normal) return fill_random(t, true, std, 0.0);
    double bound = sqrt(3.0) * std;
    return fill_random(t, false, 2 * bound, -bound);
}

kl_tensor *kl_init_kaiming_uniform(kl_tensor *t, double a, kl_fan_mode mode, kl_nonlinearity nl) {
    return kaiming(t, a, mode, nl, false, "init_kaiming_uniform");
}

kl_tensor *kl_init_kaiming_normal(kl_tensor *t, double a, kl_fan_mode mode, kl_nonlinearity nl) {
    return kaiming(t, a, mode, nl, true, "init_kaiming_normal");
}
