/*
 * test_optim.c — the nn helpers above autograd: initialiser statistics and
 * fans, kl_params semantics, SGD / Adam / AdamW against torch.optim 1.13
 * (tests/gen_optim_cases.py), small training loops, and safetensors files:
 * round trips, files made with torch (tests/gen_safetensors.py), malformed
 * files with their messages and a truncate/corrupt-every-byte loop.
 */
#include "harness.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------- */

static kl_tensor *from_f64(const double *v, int ndim, const int64_t *shape, kl_dtype dt) {
    return kl_to_dtype(kl_from_data(v, ndim, shape, KL_F64), dt);
}

/* mean and (population) std of a float tensor, and its min / max. */
static void stats(kl_tensor *t, double *mean, double *std, double *lo, double *hi) {
    kl_scope_begin();
    kl_tensor *d = kl_to_dtype(t, KL_F64);
    *mean = kl_item(kl_mean(d, KL_ALL_DIMS, false));
    *std = kl_item(kl_std(d, KL_ALL_DIMS, 0, false));
    *lo = kl_item(kl_amin(d, KL_ALL_DIMS, false));
    *hi = kl_item(kl_amax(d, KL_ALL_DIMS, false));
    kl_scope_end();
}

#define ASSERT_NEAR(x, want, tol)                                                          \
    do {                                                                                   \
        double x_ = (x), w_ = (want);                                                      \
        if (!(fabs(x_ - w_) <= (tol))) {                                                   \
            print_error("%s = %.9g, expected %.9g (tol %g)\n", #x, x_, w_, (double)(tol)); \
            fail();                                                                        \
        }                                                                                  \
    } while (0)


/* tests/data/safetensors, found from the npy directory meson passes. */
static const char *st_path(const char *name) {
    static char buf[1024];
    const char *npy = getenv("KT_NPY_DIR");
    if (npy) snprintf(buf, sizeof buf, "%s/../safetensors/%s", npy, name);
    else snprintf(buf, sizeof buf, "tests/data/safetensors/%s", name);
    return buf;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* ---- initialisers ------------------------------------------------------------- */

static void init_fans_and_gains(void **s) {
    (void)s;
    int64_t fi = 0, fo = 0;
    kl_tensor *w = kl_empty(KL_SHAPE(3, 4), KL_F32);
    assert_int_equal(kl_init_calculate_fans(w, &fi, &fo), 0);
    assert_int_equal(fi, 4);
    assert_int_equal(fo, 3);
    kl_tensor *conv = kl_empty(KL_SHAPE(8, 4, 3, 3), KL_F32);
    assert_int_equal(kl_init_calculate_fans(conv, &fi, NULL), 0);
    assert_int_equal(kl_init_calculate_fans(conv, NULL, &fo), 0);
    assert_int_equal(fi, 36);
    assert_int_equal(fo, 72);
    assert_int_equal(kl_init_calculate_fans(kl_empty(KL_SHAPE(5), KL_F32), &fi, &fo), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "fewer than 2 dimensions");
    assert_null(kl_init_xavier_uniform(kl_empty(KL_SHAPE(5), KL_F32), 1.0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_init_calculate_fans");

    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_LINEAR, 0), 1.0, 0);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_CONV2D, 0), 1.0, 0);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_SIGMOID, 0), 1.0, 0);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_TANH, 0), 5.0 / 3, 1e-15);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_RELU, 0), sqrt(2.0), 1e-15);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_LEAKY_RELU, 0.01), sqrt(2.0 / 1.0001), 1e-15);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_LEAKY_RELU, sqrt(5.0)), sqrt(1.0 / 3), 1e-15);
    ASSERT_NEAR(kl_init_calculate_gain(KL_NONLIN_SELU, 0), 0.75, 0);
    assert_true(isnan(kl_init_calculate_gain((kl_nonlinearity)99, 0)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown nonlinearity 99");
}

static void init_uniform_normal_stats(void **s) {
    (void)s;
    kl_manual_seed(1);
    double m, sd, lo, hi;
    kl_tensor *t = kl_empty(KL_SHAPE(400, 500), KL_F32);
    assert_ptr_equal(kl_init_uniform(t, -2, 3), t);
    stats(t, &m, &sd, &lo, &hi);
    ASSERT_NEAR(m, 0.5, 0.01);
    ASSERT_NEAR(sd, 5 / sqrt(12.0), 0.01);
    assert_true(lo >= -2 && hi <= 3 && lo < -1.99 && hi > 2.99);

    assert_ptr_equal(kl_init_normal(t, 1.0, 2.0), t);
    stats(t, &m, &sd, &lo, &hi);
    ASSERT_NEAR(m, 1.0, 0.02);
    ASSERT_NEAR(sd, 2.0, 0.02);

    kl_tensor *d = kl_empty(KL_SHAPE(100000), KL_F64);
    kl_init_normal(d, -3, 0.5);
    stats(d, &m, &sd, &lo, &hi);
    ASSERT_NEAR(m, -3, 0.01);
    ASSERT_NEAR(sd, 0.5, 0.01);

    /* half precision tensors fill too */
    kl_tensor *h = kl_empty(KL_SHAPE(1000, 100), KL_BF16);
    kl_init_uniform(h, 0, 1);
    stats(h, &m, &sd, &lo, &hi);
    ASSERT_NEAR(m, 0.5, 0.01);
    assert_true(lo >= 0 && hi <= 1);

    /* same seed, same values */
    kl_tensor *a = kl_empty(KL_SHAPE(7, 5), KL_F32), *b = kl_empty(KL_SHAPE(7, 5), KL_F32);
    kl_manual_seed(42);
    kl_init_kaiming_normal(a, 0, KL_FAN_IN, KL_NONLIN_RELU);
    kl_manual_seed(42);
    kl_init_kaiming_normal(b, 0, KL_FAN_IN, KL_NONLIN_RELU);
    assert_int_equal(kl_equal(a, b), 1);
    KT_NO_ERROR();
}

static void init_constants(void **s) {
    (void)s;
    kl_tensor *t = kl_empty(KL_SHAPE(2, 2), KL_F16);
    kl_init_constant(t, 0.5);
    KT_VALUES(t, 0, 0.5, 0.5, 0.5, 0.5);
    kl_init_ones(t);
    KT_VALUES(t, 0, 1, 1, 1, 1);
    kl_init_zeros(t);
    KT_VALUES(t, 0, 0, 0, 0, 0);
    /* errors: integer tensors, bad ranges, NULL */
    kl_tensor *i = kl_zeros(KL_SHAPE(3), KL_I64);
    assert_null(kl_init_ones(i));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_init_ones: needs a floating tensor, got int64");
    assert_null(kl_init_kaiming_uniform(i, 0, KL_FAN_IN, KL_NONLIN_RELU));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_init_kaiming_uniform");
    assert_null(kl_init_uniform(t, 1, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_init_uniform: expects a <= b, got a=1, b=0");
    assert_null(kl_init_normal(t, 0, -1));
    KT_EXPECT_ERROR(KL_ERR_ARG, "expects std >= 0");
    assert_null(kl_init_kaiming_uniform(kl_empty(KL_SHAPE(2, 2), KL_F32), 0, (kl_fan_mode)7, KL_NONLIN_RELU));
    KT_EXPECT_ERROR(KL_ERR_ARG, "mode 7");
    assert_null(kl_init_kaiming_uniform(kl_empty(KL_SHAPE(2, 2), KL_F32), 0, KL_FAN_IN, (kl_nonlinearity)50));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown nonlinearity");
    assert_null(kl_init_zeros(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_init_zeros");
    /* a pending error is kept: the NULL from a failed op passes through */
    assert_null(kl_init_zeros(kl_add(kl_ones(KL_SHAPE(2), KL_F32), kl_ones(KL_SHAPE(3), KL_F32))));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_add");
    /* zero-element tensors are left alone */
    kl_tensor *e = kl_empty(KL_SHAPE(0, 4), KL_F32);
    assert_ptr_equal(kl_init_kaiming_uniform(e, 0, KL_FAN_OUT, KL_NONLIN_RELU), e);
    assert_ptr_equal(kl_init_xavier_normal(e, 1), e);
    assert_ptr_equal(kl_init_uniform(e, 0, 1), e);
}

static void init_xavier_kaiming_stats(void **s) {
    (void)s;
    kl_manual_seed(7);
    double m, sd, lo, hi;
    kl_tensor *w = kl_empty(KL_SHAPE(256, 512), KL_F32);
    double a = 2.0 * sqrt(6.0 / 768);
    kl_init_xavier_uniform(w, 2.0);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(lo >= -a && hi <= a && hi > 0.99 * a);
    ASSERT_NEAR(sd, a / sqrt(3.0), 0.01 * a);
    ASSERT_NEAR(m, 0, 0.01 * a);

    kl_init_xavier_normal(w, 1.0);
    stats(w, &m, &sd, &lo, &hi);
    ASSERT_NEAR(sd, sqrt(2.0 / 768), 0.01 * sqrt(2.0 / 768));

    /* conv weights: fan_in = 16*3*3 */
    kl_tensor *c = kl_empty(KL_SHAPE(64, 16, 3, 3), KL_F64);
    kl_init_kaiming_uniform(c, 0, KL_FAN_IN, KL_NONLIN_RELU);
    double bound = sqrt(3.0) * sqrt(2.0) / sqrt(144.0);
    stats(c, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound && hi > 0.99 * bound);
    ASSERT_NEAR(sd, bound / sqrt(3.0), 0.02 * bound);

    kl_init_kaiming_normal(c, 0.2, KL_FAN_OUT, KL_NONLIN_LEAKY_RELU);
    stats(c, &m, &sd, &lo, &hi);
    double want = sqrt(2.0 / 1.04) / sqrt(64.0 * 9);
    ASSERT_NEAR(sd, want, 0.02 * want);
    ASSERT_NEAR(m, 0, 0.02 * want);

    kl_init_kaiming_uniform(w, 0, KL_FAN_IN, KL_NONLIN_TANH);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(hi <= sqrt(3.0) * (5.0 / 3) / sqrt(512.0));

    /* a non-contiguous target is filled through its view */
    kl_tensor *base = kl_full(KL_SHAPE(6, 4), NAN, KL_F32);
    kl_tensor *v = kl_t(base);
    assert_ptr_equal(kl_init_uniform(v, 0, 1), v);
    assert_int_equal(kl_item_int(kl_all(kl_isfinite(base), KL_ALL_DIMS, false)), 1);
}

static void init_on_parameters_records_nothing(void **s) {
    (void)s;
    kl_tensor *w = kl_zeros(KL_SHAPE(4, 3), KL_F32);
    kl_set_requires_grad(w, true);
    int64_t v0 = kl_version_of(w);
    assert_ptr_equal(kl_init_xavier_uniform(w, 1), w);
    assert_ptr_equal(kl_init_zeros(w), w);
    assert_ptr_equal(kl_init_kaiming_normal(w, 0, KL_FAN_IN, KL_NONLIN_RELU), w);
    KT_NO_ERROR();
    assert_true(kl_is_leaf(w));
    assert_true(kl_requires_grad(w));
    assert_true(kl_version_of(w) > v0);
    assert_true(kl_is_grad_enabled());
    /* still a usable parameter */
    kl_tensor *loss = kl_sum(kl_mul(w, w), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(loss, NULL, NULL), 0);
    assert_non_null(kl_grad(w));
}

/* ---- kl_params ------------------------------------------------------------------ */

static void params_collection(void **s) {
    (void)s;
    kl_params *p = kl_params_new();
    assert_int_equal(kl_params_count(p), 0);
    assert_int_equal(kl_params_numel(p), 0);
    kl_scope_begin();
    kl_tensor *a = kl_ones(KL_SHAPE(2, 3), KL_F32), *b = kl_zeros(KL_SHAPE(4), KL_F64);
    assert_int_equal(kl_params_add(p, "layer.a", a), 0);
    assert_int_equal(kl_params_add(p, "b", b), 1);
    kl_scope_end(); /* the collection keeps them */
    assert_int_equal(kl_params_count(p), 2);
    assert_int_equal(kl_params_numel(p), 10);
    kl_tensor *ga = kl_params_get(p, 0);
    assert_ptr_equal(ga, a);
    assert_true(kl_requires_grad(ga));
    assert_string_equal(kl_params_name(p, 1), "b");
    assert_ptr_equal(kl_params_find(p, "b"), b);
    assert_int_equal(kl_params_index(p, "layer.a"), 0);
    assert_null(kl_params_find(p, "nope"));
    assert_int_equal(kl_params_index(p, "nope"), -1);
    KT_NO_ERROR();

    /* errors */
    assert_int_equal(kl_params_add(p, "b", kl_ones(KL_SHAPE(1), KL_F32)), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_params_add: a parameter named 'b' is already in the collection");
    assert_int_equal(kl_params_add(p, "again", a), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "already in the collection as 'layer.a'");
    assert_int_equal(kl_params_add(p, "i", kl_zeros(KL_SHAPE(2), KL_I32)), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "parameter 'i' must be floating, got [2] int32");
    assert_int_equal(kl_params_add(p, "", kl_ones(KL_SHAPE(1), KL_F32)), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "non-empty name");
    assert_int_equal(kl_params_add(p, NULL, kl_ones(KL_SHAPE(1), KL_F32)), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "non-empty name");
    kl_tensor *nonleaf = kl_mul_scalar(a, 2);
    assert_int_equal(kl_params_add(p, "nonleaf", nonleaf), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "parameter 'nonleaf' is not a leaf");
    assert_int_equal(kl_params_add(p, "x", NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_params_add");
    assert_int_equal(kl_params_add(NULL, "x", a), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_params_add: the parameter collection is NULL");
    assert_null(kl_params_get(p, 2));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_params_get: index 2 out of range for 2 parameters");
    assert_null(kl_params_name(p, -1));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_params_name: index -1");
    assert_int_equal(kl_params_numel(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_params_numel");
    assert_int_equal(kl_params_count(NULL), 0);
    assert_int_equal(kl_params_count(p), 2);

    /* zero_grad drops gradients */
    kl_tensor *loss = kl_sum(kl_mul(a, a), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(loss, NULL, NULL), 0);
    assert_non_null(kl_grad(a));
    assert_int_equal(kl_params_zero_grad(p), 0);
    assert_null(kl_grad(a));
    kl_params_free(p);
    kl_params_free(NULL);
}

/* nn.Conv*d's and nn.BatchNorm*d's default init: U(+-1/sqrt(fan_in)) for
 * weight and bias, fan_in = weight dim 1 x kernel elements (ConvTranspose2d:
 * out/groups); batch norm weight 1, bias 0, buffers 0 and 1 outside p. */
static void params_conv_and_batch_norm_layers(void **s) {
    (void)s;
    kl_manual_seed(4);
    kl_params *p = kl_params_new();
    kl_tensor *w, *b;
    double m, sd, lo, hi;
    assert_int_equal(kl_params_add_conv2d(p, "conv1", 8, 32, 3, 3, 2, true, &w, &b), 0);
    kt_assert_shape(w, 4, (const int64_t[]){32, 4, 3, 3});
    kt_assert_shape(b, 1, (const int64_t[]){32});
    double bound = 1 / sqrt(4 * 9.0);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound && hi > 0.95 * bound);
    ASSERT_NEAR(sd, bound / sqrt(3.0), 0.05 * bound);
    stats(b, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound && hi > 0.5 * bound);
    assert_string_equal(kl_params_name(p, 1), "conv1.bias");
    assert_int_equal(kl_params_add_conv1d(p, "c1d", 6, 4, 5, 1, false, &w, &b), 0);
    kt_assert_shape(w, 3, (const int64_t[]){4, 6, 5});
    assert_null(b);
    bound = 1 / sqrt(30.0);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound);
    assert_int_equal(kl_params_add_conv_transpose2d(p, "up", 16, 6, 4, 4, 2, true, &w, &b), 0);
    kt_assert_shape(w, 4, (const int64_t[]){16, 3, 4, 4});
    kt_assert_shape(b, 1, (const int64_t[]){6});
    bound = 1 / sqrt(3 * 16.0);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound && hi > 0.9 * bound);
    stats(b, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound);
    assert_int_equal(kl_params_add_conv2d(p, "bad", 6, 4, 3, 3, 4, true, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_params_add_conv2d: in_channels (6) and out_channels (4) must be positive and "
                                "divisible by groups (4)");
    assert_int_equal(kl_params_add_conv1d(p, "bad", 6, 4, 0, 1, true, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kernel size 0 must be positive");
    assert_int_equal(kl_params_add_conv2d(p, "conv1", 8, 32, 3, 3, 1, true, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "a parameter named 'conv1.weight' is already in the collection");
    int n = kl_params_count(p);
    assert_int_equal(n, 5);

    kl_tensor *rm, *rv;
    assert_int_equal(kl_params_add_batch_norm(p, "bn1", 32, true, &w, &b, &rm, &rv), 0);
    assert_int_equal(kl_item(kl_amin(w, KL_ALL_DIMS, false)), 1);
    assert_int_equal(kl_item(kl_amax(kl_abs(b), KL_ALL_DIMS, false)), 0);
    assert_int_equal(kl_item(kl_amax(kl_abs(rm), KL_ALL_DIMS, false)), 0);
    assert_int_equal(kl_item(kl_amin(rv, KL_ALL_DIMS, false)), 1);
    assert_int_equal(kl_item(kl_amax(rv, KL_ALL_DIMS, false)), 1);
    assert_true(kl_requires_grad(w) && kl_requires_grad(b));
    assert_false(kl_requires_grad(rm) || kl_requires_grad(rv));
    assert_int_equal(kl_params_count(p), n + 2); /* the buffers are not parameters */
    assert_string_equal(kl_params_name(p, n), "bn1.weight");
    /* they feed kl_batch_norm directly */
    kl_tensor *y = kl_batch_norm(kl_randn(KL_SHAPE(4, 32, 2, 2), KL_F32), rm, rv, w, b, true, 0.1, 1e-5);
    assert_non_null(y);
    assert_true(kl_item(kl_amax(kl_abs(rm), KL_ALL_DIMS, false)) > 0);
    assert_int_equal(kl_params_add_batch_norm(p, "bn2", 8, false, &w, &b, &rm, NULL), 0);
    assert_null(w);
    assert_null(b);
    kt_assert_shape(rm, 1, (const int64_t[]){8});
    assert_int_equal(kl_params_count(p), n + 2);
    assert_int_equal(kl_params_add_batch_norm(p, "bn1", 8, true, &w, &b, &rm, &rv), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "a parameter named 'bn1.weight' is already in the collection");
    assert_null(rm);
    assert_int_equal(kl_params_add_batch_norm(p, "bn3", 0, true, NULL, NULL, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_params_add_batch_norm: num_features (0) must be positive");
    kl_tensor *pw;
    int np = kl_params_count(p);
    assert_int_equal(kl_params_add_prelu(p, "act", 32, 0.25, &pw), 0);
    kt_assert_shape(pw, 1, (const int64_t[]){32});
    assert_true(kl_item(kl_amin(pw, KL_ALL_DIMS, false)) == 0.25 && kl_item(kl_amax(pw, KL_ALL_DIMS, false)) == 0.25);
    assert_true(kl_requires_grad(pw));
    assert_string_equal(kl_params_name(p, np), "act.weight");
    assert_non_null(kl_prelu(kl_randn(KL_SHAPE(2, 32, 3), KL_F32), pw));
    assert_int_equal(kl_params_add_prelu(p, "act", 1, 0.25, &pw), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "a parameter named 'act.weight' is already in the collection");
    assert_null(pw);
    assert_int_equal(kl_params_add_prelu(p, "act2", 0, 0.25, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_params_add_prelu: num_parameters (0) must be positive");
    kl_params_free(p);
}

static void params_linear_layer(void **s) {
    (void)s;
    kl_manual_seed(3);
    kl_params *p = kl_params_new();
    kl_tensor *w, *b;
    assert_int_equal(kl_params_add_linear(p, "fc1", 64, 256, true, &w, &b), 0);
    kt_assert_shape(w, 2, (const int64_t[]){256, 64});
    kt_assert_shape(b, 1, (const int64_t[]){256});
    assert_int_equal(kl_dtype_of(w), KL_F32);
    assert_string_equal(kl_params_name(p, 0), "fc1.weight");
    assert_string_equal(kl_params_name(p, 1), "fc1.bias");
    double m, sd, lo, hi, bound = 1 / sqrt(64.0);
    stats(w, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound && hi > 0.98 * bound);
    ASSERT_NEAR(sd, bound / sqrt(3.0), 0.03 * bound);
    stats(b, &m, &sd, &lo, &hi);
    assert_true(lo >= -bound && hi <= bound);
    assert_true(kl_requires_grad(w) && kl_requires_grad(b));

    /* no bias, another dtype, no prefix */
    kl_set_default_dtype(KL_F64);
    kl_tensor *w2, *b2 = (kl_tensor *)1;
    assert_int_equal(kl_params_add_linear(p, NULL, 3, 2, false, &w2, &b2), 0);
    kl_set_default_dtype(KL_F32);
    assert_null(b2);
    assert_int_equal(kl_dtype_of(w2), KL_F64);
    assert_string_equal(kl_params_name(p, 2), "weight");
    assert_int_equal(kl_params_count(p), 3);

    /* a clash adds nothing */
    assert_int_equal(kl_params_add_linear(p, "fc1", 2, 2, true, &w2, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_params_add_linear: a parameter named 'fc1.weight' is already");
    assert_null(w2);
    assert_int_equal(kl_params_add_linear(p, "x", -1, 2, true, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "in_features (-1) and out_features (2) must be >= 0");
    assert_int_equal(kl_params_count(p), 3);
    assert_int_equal(kl_params_numel(p), 64 * 256 + 256 + 6);
    kl_params_free(p);
}

/* ---- optimizers against torch.optim --------------------------------------------------- */

enum { KT_SGD, KT_ADAM, KT_ADAMW };
typedef struct kt_optim_case {
    const char *name;
    int kind;
    kl_dtype dt;
    double momentum, dampening, weight_decay;
    int nesterov;
    double beta1, beta2, eps;
    int amsgrad, maximize;
    double lr[5];
    int p1_none[5];
    double p0[6], p1[3];
    double g0[5][6], g1[5][3], e0[5][6], e1[5][3];
} kt_optim_case;

static const kt_optim_case kt_optim_cases[] = {
#include "data/optim_cases.inc"
};

static kl_optim *make_optim(const kt_optim_case *c, kl_params *p) {
    if (c->kind == KT_SGD) {
        kl_sgd_options o = kl_sgd_options_default();
        o.lr = c->lr[0], o.momentum = c->momentum, o.dampening = c->dampening;
        o.weight_decay = c->weight_decay, o.nesterov = c->nesterov, o.maximize = c->maximize;
        return kl_optim_sgd(p, &o);
    }
    kl_adam_options o = c->kind == KT_ADAM ? kl_adam_options_default() : kl_adamw_options_default();
    o.lr = c->lr[0], o.beta1 = c->beta1, o.beta2 = c->beta2, o.eps = c->eps;
    o.weight_decay = c->weight_decay, o.amsgrad = c->amsgrad, o.maximize = c->maximize;
    return c->kind == KT_ADAM ? kl_optim_adam(p, &o) : kl_optim_adamw(p, &o);
}

static void optim_matches_torch(void **s) {
    (void)s;
    for (size_t ci = 0; ci < sizeof kt_optim_cases / sizeof kt_optim_cases[0]; ci++) {
        const kt_optim_case *c = &kt_optim_cases[ci];
        double tol = c->dt == KL_F64 ? 1e-13 : 3e-6;
        kl_scope_begin();
        kl_params *p = kl_params_new();
        kl_tensor *p0 = kl_clone(from_f64(c->p0, KL_SHAPE(2, 3), c->dt));
        kl_tensor *p1 = kl_clone(from_f64(c->p1, KL_SHAPE(3), c->dt));
        kl_params_add(p, "p0", p0);
        kl_params_add(p, "p1", p1);
        kl_optim *o = make_optim(c, p);
        assert_non_null(o);
        for (int k = 0; k < 5; k++) {
            kl_scope_begin();
            assert_int_equal(kl_optim_set_lr(o, c->lr[k]), 0);
            kl_set_grad(p0, from_f64(c->g0[k], KL_SHAPE(2, 3), c->dt));
            if (c->p1_none[k]) kl_zero_grad(p1);
            else kl_set_grad(p1, from_f64(c->g1[k], KL_SHAPE(3), c->dt));
            if (kl_optim_step(o) != 0) {
                print_error("%s step %d: %s\n", c->name, k, kl_last_error());
                fail();
            }
            kl_scope_end();
            kt_assert_values(p0, c->e0[k], 6, tol);
            kt_assert_values(p1, c->e1[k], 3, tol);
        }
        assert_int_equal(kl_optim_steps(o), 5);
        assert_true(kl_is_leaf(p0) && kl_requires_grad(p0));
        kl_optim_free(o);
        kl_params_free(p);
        kl_scope_end();
    }
}

/* The one-pass CPU Adam/AdamW (src/nn/optim.c) against the composed kl_ ops
 * it replaces, bit for bit: parameter A is contiguous (one pass), B holds the
 * same values as a transposed view (not contiguous: the composed ops). The
 * profiler shows that A really took the one pass. Sizes above two chunks of
 * the thread pool's grain, so the pass is split. */
static void adam_one_pass_equals_composed(void **s) {
    (void)s;
    static const kl_dtype dts[2] = {KL_F32, KL_F64};
    for (int kind = 0; kind < 2; kind++)
        for (int di = 0; di < 2; di++)
            for (int variant = 0; variant < 4; variant++) {
                bool maximize = variant & 1;
                double wd = variant & 2 ? 0.1 : 0;
                kl_scope_begin();
                kl_manual_seed(40 + (uint64_t)variant);
                kl_tensor *a = kl_to_dtype(kl_randn(KL_SHAPE(130, 257), KL_F64), dts[di]);
                kl_tensor *b = kl_transpose(kl_contiguous(kl_transpose(a, 0, 1)), 0, 1);
                assert_false(kl_is_contiguous(b));
                kl_params *pa = kl_params_new(), *pb = kl_params_new();
                kl_params_add(pa, "w", a);
                kl_params_add(pb, "w", b);
                kl_adam_options o = kind ? kl_adamw_options_default() : kl_adam_options_default();
                o.weight_decay = wd, o.maximize = maximize, o.lr = 1e-2;
                kl_optim *oa = kind ? kl_optim_adamw(pa, &o) : kl_optim_adam(pa, &o);
                kl_optim *ob = kind ? kl_optim_adamw(pb, &o) : kl_optim_adam(pb, &o);
                assert_non_null(oa);
                assert_non_null(ob);
                for (int k = 0; k < 4; k++) {
                    kl_scope_begin();
                    kl_tensor *g = kl_to_dtype(kl_randn(KL_SHAPE(130, 257), KL_F64), dts[di]);
                    kl_set_grad(a, g);
                    kl_set_grad(b, kl_transpose(kl_contiguous(kl_transpose(g, 0, 1)), 0, 1));
                    assert_int_equal(kl_optim_set_lr(oa, 1e-2 / (k + 1)), 0);
                    assert_int_equal(kl_optim_set_lr(ob, 1e-2 / (k + 1)), 0);
                    if (k == 3) assert_int_equal(kl_profiler_start(NULL), 0);
                    assert_int_equal(kl_optim_step(oa), 0);
                    if (k == 3) assert_int_equal(kl_profiler_stop(NULL), 0);
                    assert_int_equal(kl_optim_step(ob), 0);
                    kl_scope_end();
                    if (kl_equal(a, b) != 1) {
                        print_error("%s %s maximize %d wd %g: step %d differs from the composed ops\n",
                                    kind ? "adamw" : "adam", kl_dtype_name(dts[di]), maximize, wd, k);
                        fail();
                    }
                }
                char *buf = NULL;
                size_t len = 0;
                FILE *m = open_memstream(&buf, &len);
                assert_int_equal(kl_profiler_summary(m), 0);
                fclose(m);
                assert_non_null(strstr(buf, "(one pass)"));
                free(buf);
                kl_optim_free(oa), kl_optim_free(ob);
                kl_params_free(pa), kl_params_free(pb);
                kl_scope_end();
            }
}

static void optim_options_and_errors(void **s) {
    (void)s;
    kl_sgd_options so = kl_sgd_options_default();
    ASSERT_NEAR(so.lr, 0.01, 0);
    assert_true(so.momentum == 0 && !so.nesterov && so.weight_decay == 0);
    kl_adam_options ao = kl_adam_options_default(), wo = kl_adamw_options_default();
    assert_true(ao.lr == 1e-3 && ao.beta1 == 0.9 && ao.beta2 == 0.999 && ao.eps == 1e-8 && ao.weight_decay == 0);
    assert_true(wo.weight_decay == 1e-2 && !wo.amsgrad);

    kl_params *p = kl_params_new();
    assert_null(kl_optim_sgd(p, NULL));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_optim_sgd: optimizer got an empty parameter list");
    kl_params_add(p, "w", kl_ones(KL_SHAPE(2), KL_F32));
    assert_null(kl_optim_adam(NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_optim_adam: the parameter collection is NULL");

    so.lr = -1;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_optim_sgd: invalid learning rate: -1");
    so = kl_sgd_options_default(), so.momentum = -0.5;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid momentum value: -0.5");
    so = kl_sgd_options_default(), so.weight_decay = -1;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid weight_decay value");
    so = kl_sgd_options_default(), so.nesterov = true;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "nesterov momentum requires a momentum and zero dampening");
    so.momentum = 0.9, so.dampening = 0.1;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "nesterov momentum requires");
    so.dampening = NAN, so.nesterov = false;
    assert_null(kl_optim_sgd(p, &so));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid dampening");

    ao.lr = NAN;
    assert_null(kl_optim_adam(p, &ao));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_optim_adam: invalid learning rate: nan");
    ao = kl_adam_options_default(), ao.eps = -1e-8;
    assert_null(kl_optim_adamw(p, &ao));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_optim_adamw: invalid epsilon value");
    ao = kl_adam_options_default(), ao.beta1 = 1.0;
    assert_null(kl_optim_adam(p, &ao));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid beta parameter at index 0: 1");
    ao = kl_adam_options_default(), ao.beta2 = -0.1;
    assert_null(kl_optim_adam(p, &ao));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid beta parameter at index 1: -0.1");
    ao = kl_adam_options_default(), ao.weight_decay = -2;
    assert_null(kl_optim_adam(p, &ao));
    KT_EXPECT_ERROR(KL_ERR_ARG, "invalid weight_decay value: -2");

    kl_optim *o = kl_optim_adamw(p, NULL);
    assert_non_null(o);
    ASSERT_NEAR(kl_optim_get_lr(o), 1e-3, 0);
    assert_int_equal(kl_optim_set_lr(o, 0.5), 0);
    ASSERT_NEAR(kl_optim_get_lr(o), 0.5, 0);
    assert_int_equal(kl_optim_set_lr(o, -0.5), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_optim_set_lr: invalid learning rate: -0.5");
    assert_true(isnan(kl_optim_get_lr(NULL)));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_optim_get_lr");
    assert_int_equal(kl_optim_step(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_optim_step: the optimizer is NULL");
    assert_int_equal(kl_optim_steps(NULL), -1);

    /* no grads: nothing moves, not even by decoupled weight decay */
    kl_tensor *w = kl_params_get(p, 0);
    assert_int_equal(kl_optim_step(o), 0);
    KT_VALUES(w, 0, 1, 1);
    /* a pending error (a failed forward) stops the step */
    kl_set_grad(w, kl_ones(KL_SHAPE(2), KL_F32));
    assert_null(kl_add(w, kl_ones(KL_SHAPE(3), KL_F32)));
    assert_int_equal(kl_optim_step(o), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_add");
    KT_VALUES(w, 0, 1, 1);
    assert_int_equal(kl_optim_step(o), 0);
    assert_true(kt_get(w, 0) < 1);
    assert_int_equal(kl_optim_zero_grad(o), 0);
    assert_null(kl_grad(w));
    /* the optimizer keeps its parameters: the collection may go first */
    kl_params_free(p);
    kl_set_grad(w, kl_ones(KL_SHAPE(2), KL_F32));
    assert_int_equal(kl_optim_step(o), 0);
    assert_int_equal(kl_optim_steps(o), 3);
    kl_optim_free(o);
    kl_optim_free(NULL);
}

/* y = x @ w_true^T + b_true, fitted by a linear layer. Returns the final loss. */
static double fit_linear(kl_optim *(*make)(const kl_params *), int steps, int64_t *live_mid, int64_t *live_end) {
    kl_manual_seed(11);
    kl_tensor *x = kl_randn(KL_SHAPE(64, 3), KL_F32);
    kl_tensor *wt = kl_from_data((const float[]){1.5f, -2.0f, 0.5f}, KL_SHAPE(1, 3), KL_F32);
    kl_tensor *y = kl_add_scalar(kl_matmul(x, kl_t(wt)), 0.3);
    kl_params *p = kl_params_new();
    kl_tensor *w, *b;
    assert_int_equal(kl_params_add_linear(p, "lin", 3, 1, true, &w, &b), 0);
    kl_optim *o = make(p);
    assert_non_null(o);
    double loss_v = NAN;
    for (int i = 0; i < steps; i++) {
        kl_scope_begin();
        kl_tensor *loss = kl_mse_loss(kl_linear(x, w, b), y, KL_REDUCE_MEAN);
        kl_optim_zero_grad(o);
        assert_int_equal(kl_backward(loss, NULL, NULL), 0);
        assert_int_equal(kl_optim_step(o), 0);
        loss_v = kl_item(loss);
        kl_scope_end();
        if (i == steps / 2) *live_mid = kl_live_tensors();
    }
    *live_end = kl_live_tensors();
    KT_NO_ERROR();
    ASSERT_NEAR(kt_get(w, 0), 1.5, 1e-2);
    ASSERT_NEAR(kt_get(w, 1), -2.0, 1e-2);
    ASSERT_NEAR(kt_get(b, 0), 0.3, 1e-2);
    kl_optim_free(o);
    kl_params_free(p);
    return loss_v;
}

static kl_optim *make_sgd(const kl_params *p) {
    kl_sgd_options o = kl_sgd_options_default();
    o.lr = 0.05, o.momentum = 0.9, o.nesterov = true;
    return kl_optim_sgd(p, &o);
}
static kl_optim *make_adam(const kl_params *p) {
    kl_adam_options o = kl_adam_options_default();
    o.lr = 0.05;
    return kl_optim_adam(p, &o);
}
static kl_optim *make_adamw(const kl_params *p) {
    kl_adam_options o = kl_adamw_options_default();
    o.lr = 0.05, o.weight_decay = 1e-4, o.amsgrad = true;
    return kl_optim_adamw(p, &o);
}

static void training_loops_converge(void **s) {
    (void)s;
    kl_optim *(*makers[])(const kl_params *) = {make_sgd, make_adam, make_adamw};
    for (int k = 0; k < 3; k++) {
        int64_t mid = -1, end = -2;
        kl_scope_begin();
        double loss = fit_linear(makers[k], 400, &mid, &end);
        kl_scope_end();
        if (!(loss < 1e-4)) {
            print_error("optimizer %d: final loss %g\n", k, loss);
            fail();
        }
        assert_int_equal(mid, end); /* steady memory: no growth across steps */
    }
}

/* ---- training helpers: clipping, schedules, resuming ----------------------------------- */

/* torch.nn.utils.clip_grad_norm_ on grads a [2,3], b [2] and a parameter with none. */
static void clip_grad_norm_matches_torch(void **s) {
    (void)s;
    static const double ga[6] = {1, -2, 3, 0.5, 4, -1}, gb[2] = {-3, 2};
    static const struct {
        double type, max, total, scale;
    } cases[] = {
        {2, 1, 6.652067184448242, 0.15032918751239777},
        {INFINITY, 2, 4, 0.49999988079071045},
        {1, 100, 16.5, 1},
        {3, 0.5, 5.144138813018799, 0.09719797968864441},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kl_scope_begin();
        kl_params *p = kl_params_new();
        kl_tensor *a = kl_zeros(KL_SHAPE(2, 3), KL_F32), *b = kl_zeros(KL_SHAPE(2), KL_F32);
        kl_params_add(p, "a", a);
        kl_params_add(p, "b", b);
        kl_params_add(p, "c", kl_zeros(KL_SHAPE(1), KL_F32));
        kl_tensor *loss = kl_add(kl_sum(kl_mul(a, from_f64(ga, KL_SHAPE(2, 3), KL_F32)), KL_ALL_DIMS, false),
                                 kl_sum(kl_mul(b, from_f64(gb, KL_SHAPE(2), KL_F32)), KL_ALL_DIMS, false));
        assert_int_equal(kl_backward(loss, NULL, NULL), 0);
        ASSERT_NEAR(kl_clip_grad_norm(p, cases[k].max, cases[k].type), cases[k].total, 1e-5 * cases[k].total);
        double want[6];
        for (int i = 0; i < 6; i++) want[i] = ga[i] * cases[k].scale;
        kt_assert_values(kl_grad(a), want, 6, 1e-6);
        for (int i = 0; i < 2; i++) want[i] = gb[i] * cases[k].scale;
        kt_assert_values(kl_grad(b), want, 2, 1e-6);
        kl_params_free(p);
        kl_scope_end();
    }
    kl_params *p = kl_params_new();
    kl_params_add(p, "a", kl_zeros(KL_SHAPE(2), KL_F32));
    assert_true(kl_clip_grad_norm(p, 1, 2) == 0); /* no gradients: 0 */
    assert_true(isnan(kl_clip_grad_norm(p, -1, 2)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_clip_grad_norm: max_norm must be >= 0, got -1");
    assert_true(isnan(kl_clip_grad_norm(p, 1, 0)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "norm_type must be > 0");
    assert_true(isnan(kl_clip_grad_norm(NULL, 1, 2)));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_clip_grad_norm: the parameter collection is NULL");
    kl_params_free(p);
}

/* CosineAnnealingLR(T_max 7, eta_min 0.01) and StepLR(3, 0.5) from torch 1.13,
 * behind a warm-up of 0 and of 3 steps. */
static void lr_schedules(void **s) {
    (void)s;
    static const double cosine[8] = {0.1, 0.09554359905560886, 0.08305704108364301, 0.06501344202803415,
                                     0.04498655797196586, 0.026942958916356993, 0.014456400944391143, 0.01};
    for (int i = 0; i < 8; i++) ASSERT_NEAR(kl_lr_cosine_warmup(i, 0.1, 0, 7, 0.01), cosine[i], 1e-15);
    ASSERT_NEAR(kl_lr_cosine_warmup(20, 0.1, 0, 7, 0.01), 0.01, 0); /* annealed: stays at min_lr */
    for (int i = 0; i < 3; i++) ASSERT_NEAR(kl_lr_cosine_warmup(i, 0.1, 3, 10, 0.01), 0.1 * (i + 1) / 3, 1e-15);
    for (int i = 0; i < 8; i++) ASSERT_NEAR(kl_lr_cosine_warmup(i + 3, 0.1, 3, 10, 0.01), cosine[i], 1e-15);
    static const double step[8] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025};
    for (int i = 0; i < 8; i++) ASSERT_NEAR(kl_lr_step(i, 0.1, 3, 0.5), step[i], 0);
    assert_true(isnan(kl_lr_cosine_warmup(0, 0.1, 5, 4, 0)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_lr_cosine_warmup: needs 0 <= step, 0 <= warmup <= total");
    assert_true(isnan(kl_lr_step(0, 0.1, 0, 0.5)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_lr_step: needs step >= 0 and step_size >= 1");
}

/* A two-layer model, its data, and training steps with clipping and a
 * cosine schedule read from the optimizer's step count. */
typedef struct resume_model {
    kl_params *p;
    kl_optim *o;
} resume_model;

static resume_model resume_new(int kind) {
    resume_model m = {kl_params_new(), NULL};
    kl_manual_seed(77);
    kl_params_add_linear(m.p, "fc1", 5, 8, true, NULL, NULL);
    kl_params_add_linear(m.p, "fc2", 8, 3, true, NULL, NULL);
    if (kind == 0) {
        kl_sgd_options o = kl_sgd_options_default();
        o.momentum = 0.9, o.nesterov = true, o.weight_decay = 1e-3;
        m.o = kl_optim_sgd(m.p, &o);
    } else {
        kl_adam_options o = kind == 1 ? kl_adam_options_default() : kl_adamw_options_default();
        o.amsgrad = kind == 1;
        m.o = kind == 1 ? kl_optim_adam(m.p, &o) : kl_optim_adamw(m.p, &o);
    }
    return m;
}

static void resume_steps(resume_model *m, int n) {
    kl_manual_seed(5);
    kl_tensor *x = kl_randn(KL_SHAPE(16, 5), KL_F32);
    kl_tensor *y = kl_randint(0, 3, KL_SHAPE(16), KL_I64);
    for (int i = 0; i < n; i++) {
        kl_scope_begin();
        kl_optim_set_lr(m->o, kl_lr_cosine_warmup(kl_optim_steps(m->o), 0.05, 3, 12, 1e-3));
        kl_tensor *h = kl_relu(kl_linear(x, kl_params_get(m->p, 0), kl_params_get(m->p, 1)));
        kl_tensor *loss = kl_cross_entropy(kl_linear(h, kl_params_get(m->p, 2), kl_params_get(m->p, 3)), y,
                                           KL_REDUCE_MEAN, 0.1);
        kl_optim_zero_grad(m->o);
        assert_int_equal(kl_backward(loss, NULL, NULL), 0);
        assert_false(isnan(kl_clip_grad_norm(m->p, 0.5, 2)));
        assert_int_equal(kl_optim_step(m->o), 0);
        kl_scope_end();
    }
}

static void resume_free(resume_model *m) {
    kl_optim_free(m->o);
    kl_params_free(m->p);
}

/* N steps, save, load into a fresh model and optimizer, M more steps: bit for
 * bit the N + M uninterrupted steps, for SGD (momentum), Adam (amsgrad), AdamW. */
static void optim_state_resumes_training(void **s) {
    (void)s;
    const char *pp = kt_tmp_path("resume.params.safetensors"), *po = kt_tmp_path("resume.optim.safetensors");
    for (int kind = 0; kind < 3; kind++) {
        kl_scope_begin();
        resume_model full = resume_new(kind), first = resume_new(kind), second = resume_new(kind);
        resume_steps(&full, 9);
        resume_steps(&first, 4);
        assert_int_equal(kl_params_save_safetensors(first.p, pp), 0);
        assert_int_equal(kl_optim_save_safetensors(first.o, first.p, po), 0);
        assert_int_equal(kl_params_load_safetensors(second.p, pp, true), 4);
        assert_int_equal(kl_optim_load_safetensors(second.o, second.p, po), 0);
        assert_int_equal(kl_optim_steps(second.o), 4);
        assert_true(kl_optim_get_lr(second.o) == kl_optim_get_lr(first.o));
        resume_steps(&second, 5);
        for (int i = 0; i < 4; i++) assert_int_equal(kl_equal(kl_params_get(full.p, i), kl_params_get(second.p, i)), 1);
        /* and the state files agree: saving both gives the same tensors */
        resume_free(&first);
        resume_free(&second);
        resume_free(&full);
        kl_scope_end();
    }
    /* errors: another kind, no metadata, shapes that differ; nothing is changed */
    kl_scope_begin();
    resume_model a = resume_new(2), b = resume_new(0);
    resume_steps(&a, 2);
    assert_int_equal(kl_optim_save_safetensors(a.o, a.p, po), 0);
    assert_int_equal(kl_optim_load_safetensors(b.o, b.p, po), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "holds adamw state, but the optimizer is sgd");
    assert_int_equal(kl_optim_steps(b.o), 0);
    assert_int_equal(kl_optim_load_safetensors(b.o, b.p, pp), -1);
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "no optimizer metadata");
    kl_params *q = kl_params_new();
    kl_params_add_linear(q, "fc1", 5, 7, true, NULL, NULL);
    kl_params_add_linear(q, "fc2", 7, 3, true, NULL, NULL);
    kl_optim *oq = kl_optim_adamw(q, NULL);
    assert_int_equal(kl_optim_load_safetensors(oq, q, po), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "'fc1.weight.exp_avg' is [8,5] float32 cpu but the parameter is [7,5] float32 cpu");
    assert_int_equal(kl_optim_steps(oq), 0);
    assert_int_equal(kl_optim_load_safetensors(oq, a.p, po), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "parameter 0 of the optimizer is not parameter 0 of the collection");
    kl_optim_free(oq);
    kl_params_free(q);
    resume_free(&a);
    resume_free(&b);
    kl_scope_end();
}

/* ---- safetensors: round trips and files from torch ------------------------------------- */

static void safetensors_round_trip(void **s) {
    (void)s;
    kl_tensor *base = kl_arange(0, 6, 1, KL_F32);
    kl_tensor *ts[] = {
        kl_t(kl_reshape(base, KL_SHAPE(3, 2))),                     /* non-contiguous */
        kl_scalar_tensor(-2.25, KL_F64),
        kl_to_dtype(kl_linspace(-1, 1, 5, KL_F32), KL_F16),
        kl_to_dtype(kl_linspace(-3, 3, 4, KL_F32), KL_BF16),
        kl_from_data((const int32_t[]){INT32_MIN, -1, 7}, KL_SHAPE(3), KL_I32),
        kl_from_data((const int64_t[]){INT64_MAX, INT64_MIN}, KL_SHAPE(2, 1), KL_I64),
        kl_from_data((const uint8_t[]){0, 255, 3}, KL_SHAPE(3), KL_U8),
        kl_gt_scalar(kl_arange(0, 5, 1, KL_F32), 2),
        kl_empty(KL_SHAPE(0, 2), KL_F32),
        kl_ones(KL_SHAPE(2, 2), KL_F32),
    };
    kl_set_requires_grad(ts[9], true);
    const char *names[] = {"w.T", "scalar", "h", "bf", "i32", "i64", "u8", "mask", "empty",
                           "caf\xc3\xa9 \"q\"\n"};
    const char *meta[] = {"format", "pt", "note", "line\nbreak \"q\" \\", NULL};
    const char *path = kt_tmp_path("rt.safetensors");
    assert_int_equal(kl_save_safetensors(path, 10, names, ts, meta), 0);
    assert_int_equal(kl_save_safetensors(path, 10, names, ts, meta), 0); /* overwrite */
    assert_true(kl_is_leaf(ts[9]));

    kl_safetensors *f = kl_load_safetensors(path);
    assert_non_null(f);
    assert_int_equal(kl_safetensors_count(f), 10);
    for (int i = 0; i < 10; i++) {
        kl_tensor *t = kl_safetensors_find(f, names[i]);
        assert_non_null(t);
        assert_int_equal(kl_dtype_of(t), kl_dtype_of(ts[i]));
        assert_int_equal(kl_equal(t, ts[i]), 1);
        assert_false(kl_requires_grad(t));
    }
    /* file order: the reference writer's (I64 first, BOOL last) */
    assert_string_equal(kl_safetensors_name(f, 0), "i64");
    assert_string_equal(kl_safetensors_name(f, 9), "mask");
    assert_int_equal(kl_safetensors_metadata_count(f), 2);
    assert_string_equal(kl_safetensors_metadata_key(f, 0), "format");
    assert_string_equal(kl_safetensors_metadata(f, "note"), "line\nbreak \"q\" \\");
    assert_null(kl_safetensors_metadata(f, "nope"));
    assert_null(kl_safetensors_metadata_key(f, 2));
    assert_null(kl_safetensors_find(f, "nope"));
    assert_null(kl_safetensors_get(f, 10));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_safetensors_get: index 10 out of range for 10 tensors");
    assert_null(kl_safetensors_name(f, -1));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_safetensors_name");
    /* a tensor the caller retains outlives the handle */
    kl_tensor *keep = kl_retain(kl_safetensors_find(f, "i32"));
    kl_safetensors_free(f);
    KT_VALUES(keep, 0, INT32_MIN, -1, 7);
    kl_release(keep);

    /* layout: 8-byte header length, header padded to 8, data; no temp files left */
    size_t len;
    unsigned char *buf = read_file(path, &len);
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--) hn = hn << 8 | buf[k];
    assert_int_equal(hn % 8, 0);
    assert_memory_equal(buf + 8, "{\"__metadata__\":{\"format\":\"pt\",", 31);
    assert_int_equal(len, 8 + hn + 6 * 4 + 8 + 5 * 2 + 4 * 2 + 3 * 4 + 2 * 8 + 3 + 5 + 0 + 4 * 4);
    free(buf);
    DIR *d = opendir(kt_tmp_dir);
    struct dirent *e;
    int leftovers = 0;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) leftovers++;
    closedir(d);
    assert_int_equal(leftovers, 0);

    /* nothing at all */
    assert_int_equal(kl_save_safetensors(kt_tmp_path("none.safetensors"), 0, NULL, NULL, NULL), 0);
    f = kl_load_safetensors(kt_tmp_path("none.safetensors"));
    assert_non_null(f);
    assert_int_equal(kl_safetensors_count(f), 0);
    kl_safetensors_free(f);
    buf = read_file(kt_tmp_path("none.safetensors"), &len);
    assert_int_equal(len, 16);
    assert_memory_equal(buf, "\x08\0\0\0\0\0\0\0{}      ", 16);
    free(buf);
}

static void safetensors_save_errors(void **s) {
    (void)s;
    kl_tensor *a = kl_ones(KL_SHAPE(2), KL_F32), *b = kl_ones(KL_SHAPE(2), KL_F64);
    kl_tensor *ts[] = {a, b};
    const char *p = kt_tmp_path("bad.safetensors");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "x"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_save_safetensors: duplicate tensor name 'x'");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "__metadata__"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "\"__metadata__\" is reserved");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", ""}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "tensor 1 has an empty or NULL name");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){NULL, "y"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "tensor 0 has an empty or NULL name");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "\xff"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "tensor 1's name is not valid UTF-8");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "y"}, ts, (const char *[]){"k", NULL}), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "metadata key 'k' has no value");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "y"}, ts,
                                         (const char *[]){"k", "1", "k", "2", NULL}), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "duplicate metadata key 'k'");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "y"}, ts, (const char *[]){"k", "\xc3", NULL}),
                     -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "metadata entry 0 is not valid UTF-8");
    assert_int_equal(kl_save_safetensors(p, 2, (const char *[]){"x", "y"}, (kl_tensor *[]){a, NULL}, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_save_safetensors");
    assert_int_equal(kl_save_safetensors(NULL, 1, (const char *[]){"x"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "path is NULL");
    assert_int_equal(kl_save_safetensors(p, -1, NULL, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "n must be >= 0, got -1");
    assert_int_equal(kl_save_safetensors(p, 1, NULL, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "names or tensors is NULL");
    assert_int_equal(kl_save_safetensors("/nonexistent-dir/x.safetensors", 1, (const char *[]){"x"}, ts, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_IO, "/nonexistent-dir/x.safetensors: cannot create a temporary file");
    assert_int_equal(access(p, F_OK), -1); /* nothing written by the failures */
    /* reading: missing files and directories are I/O errors */
    assert_null(kl_load_safetensors(kt_tmp_path("missing.safetensors")));
    KT_EXPECT_ERROR(KL_ERR_IO, "cannot open");
    assert_null(kl_load_safetensors(kt_tmp_dir));
    KT_EXPECT_ERROR(KL_ERR_IO, "is a directory");
    assert_null(kl_load_safetensors(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_load_safetensors: path is NULL");
    assert_null(kl_load_safetensors_buffer(NULL, 3));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "buffer is NULL");
}

typedef struct kt_st_expect {
    const char *name;
    kl_dtype dt;
    int ndim;
    int64_t shape[KL_MAX_DIMS];
    int64_t numel;
    const double *vals;
    const int64_t *i64;
} kt_st_expect;
#include "data/safetensors/expected.inc"
#define KT_ST_N ((int)(sizeof kt_st_mixed / sizeof kt_st_mixed[0]))

static void check_mixed(const kl_safetensors *f) {
    assert_int_equal(kl_safetensors_count(f), KT_ST_N);
    for (int i = 0; i < KT_ST_N; i++) {
        const kt_st_expect *x = &kt_st_mixed[i];
        kl_tensor *t = kl_safetensors_find(f, x->name);
        if (!t) {
            print_error("tensor '%s' missing\n", x->name);
            fail();
        }
        assert_int_equal(kl_dtype_of(t), x->dt);
        kt_assert_shape(t, x->ndim, x->shape);
        if (x->dt == KL_I64) {
            for (int64_t k = 0; k < x->numel; k++) assert_true(((const int64_t *)kl_data_ptr(t))[k] == x->i64[k]);
        } else {
            kt_assert_values(t, x->vals, x->numel, 0);
        }
    }
}

static void safetensors_from_torch(void **s) {
    (void)s;
    kl_safetensors *f = kl_load_safetensors(st_path("torch_mixed.safetensors"));
    assert_non_null(f);
    check_mixed(f);
    assert_string_equal(kl_safetensors_metadata(f, "format"), "pt");
    assert_true(signbit(kt_get(kl_safetensors_find(f, "odd \"name\"\\\xc3\xbc\t"), 0))); /* -0.0 kept */
    kl_safetensors_free(f);

    /* an older layout: data not in the reference order, keys sorted by name */
    f = kl_load_safetensors(st_path("torch_unordered.safetensors"));
    assert_non_null(f);
    check_mixed(f);
    assert_int_equal(kl_safetensors_metadata_count(f), 0);
    kl_safetensors_free(f);

    /* writing the same tensors gives the reference layout byte for byte */
    kl_tensor *ts[KT_ST_N];
    const char *names[KT_ST_N];
    for (int i = 0; i < KT_ST_N; i++) {
        const kt_st_expect *x = &kt_st_mixed[i];
        names[i] = x->name;
        ts[i] = x->dt == KL_I64 ? kl_from_data(x->i64, x->ndim, x->shape, KL_I64)
                                : from_f64(x->vals, x->ndim, x->shape, x->dt);
    }
    const char *out = kt_tmp_path("mixed.safetensors");
    assert_int_equal(kl_save_safetensors(out, KT_ST_N, names, ts, (const char *[]){"format", "pt", NULL}), 0);
    size_t la, lb;
    unsigned char *a = read_file(out, &la), *b = read_file(st_path("torch_mixed.safetensors"), &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
}

static void safetensors_params(void **s) {
    (void)s;
    const char *path = st_path("torch_linear.safetensors");
    kl_params *p = kl_params_new();
    kl_tensor *w, *b;
    kl_params_add_linear(p, "fc", 4, 3, true, &w, &b);
    assert_int_equal(kl_params_load_safetensors(p, path, true), 2);
    assert_true(kl_is_leaf(w) && kl_requires_grad(w));
    kl_tensor *x = from_f64(kt_st_linear_x, KL_SHAPE(2, 4), KL_F32);
    kt_assert_values(kl_linear(x, w, b), kt_st_linear_y, 6, 1e-6);

    /* save / load through a fresh collection */
    const char *mine = kt_tmp_path("params.safetensors");
    assert_int_equal(kl_params_save_safetensors(p, mine), 0);
    kl_params *q = kl_params_new();
    kl_tensor *w2, *b2;
    kl_params_add_linear(q, "fc", 4, 3, true, &w2, &b2);
    assert_int_equal(kl_params_load_safetensors(q, mine, true), 2);
    assert_int_equal(kl_equal(w, w2), 1);
    assert_int_equal(kl_equal(b, b2), 1);

    /* strictness, and nothing written when a check fails */
    kl_init_zeros(w2);
    kl_params_add(q, "extra", kl_ones(KL_SHAPE(1), KL_F32));
    assert_int_equal(kl_params_load_safetensors(q, mine, true), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "params.safetensors: missing parameter 'extra'");
    KT_VALUES(kl_sum(kl_abs(w2), KL_ALL_DIMS, false), 0, 0);
    assert_int_equal(kl_params_load_safetensors(q, mine, false), 2);
    assert_int_equal(kl_equal(w, w2), 1);
    kl_params_free(q);

    q = kl_params_new();
    kl_params_add_linear(q, "fc", 4, 3, false, NULL, NULL);
    assert_int_equal(kl_params_load_safetensors(q, mine, true), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "unexpected tensor 'fc.bias' (no parameter has that name)");
    assert_int_equal(kl_params_load_safetensors(q, mine, false), 1);
    kl_params_free(q);

    q = kl_params_new();
    kl_params_add_linear(q, "fc", 3, 4, true, NULL, NULL);
    assert_int_equal(kl_params_load_safetensors(q, mine, false), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "parameter 'fc.bias' is [4] float32 cpu but the file's tensor is [3] float32 cpu");
    kl_params_free(q);

    q = kl_params_new();
    kl_set_default_dtype(KL_F64);
    kl_params_add_linear(q, "fc", 4, 3, true, NULL, NULL);
    kl_set_default_dtype(KL_F32);
    assert_int_equal(kl_params_load_safetensors(q, mine, true), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "parameter 'fc.bias' is [3] float64 cpu but the file's tensor is [3] float32");
    assert_int_equal(kl_params_load_safetensors(q, kt_tmp_path("missing.safetensors"), true), -1);
    KT_EXPECT_ERROR(KL_ERR_IO, "kl_load_safetensors");
    assert_int_equal(kl_params_load_safetensors(NULL, mine, true), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_params_load_safetensors");
    assert_int_equal(kl_params_save_safetensors(NULL, mine), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_params_save_safetensors");
    kl_params_free(q);
    kl_params_free(p);
}

/* ---- safetensors: malformed files ---------------------------------------------------- */

/* A file image: 8-byte length of json, json, dlen zero bytes. */
static unsigned char *mkfile(const char *json, size_t dlen, size_t *len) {
    size_t hn = strlen(json);
    unsigned char *b = calloc(1, 8 + hn + dlen + 1);
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hn >> (8 * k));
    memcpy(b + 8, json, hn);
    *len = 8 + hn + dlen;
    return b;
}

typedef struct bad_case {
    const char *json;
    size_t dlen;
    kl_status code;
    const char *needle;
} bad_case;

#define T1(shape, offs) "{\"a\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static const bad_case bad_cases[] = {
    {"", 0, KL_ERR_FORMAT, "bad JSON header: expected '{' to open the header, found the end of the header"},
    {"[]", 0, KL_ERR_FORMAT, "bad JSON header at byte 0: expected '{' to open the header, found '['"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, KL_ERR_FORMAT,
     "expected ',' or '}' between tensors, found the end"},
    {"{\"a\" {}}", 0, KL_ERR_FORMAT, "bad JSON header at byte 5: expected ':' after a key, found '{'"},
    {"{\"a\":5}", 0, KL_ERR_FORMAT, "expected '{' to open a tensor's description, found '5'"},
    {"{\"\xff\":5}", 0, KL_ERR_FORMAT, "header is not valid UTF-8 (byte 2)"},
    {"{\"\xed\xa0\x80\":5}", 0, KL_ERR_FORMAT, "not valid UTF-8"},
    {"{\"a\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KL_ERR_FORMAT,
     "tensor 'a' has an unknown dtype \"F128\""},
    {"{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, KL_ERR_UNSUPPORTED,
     "tensor 'a' has dtype I16, which Kiln does not support"},
    {T1("[2]", "[8,0]"), 8, KL_ERR_FORMAT, "tensor 'a': data_offsets [8, 0] are reversed"},
    {T1("[4]", "[0,16]"), 8, KL_ERR_FORMAT, "tensor 'a': data_offsets [0, 16] run past the data (8 bytes)"},
    {T1("[3]", "[0,8]"), 8, KL_ERR_FORMAT, "data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"},
    {T1("[2]", "[0,8]"), 12, KL_ERR_FORMAT, "the tensors cover 8 bytes but the data section has 12"},
    {T1("[2]", "[4,12]"), 12, KL_ERR_FORMAT, "tensor 'a' starts at byte 4 of the data but the tensors before it end at 0"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, KL_ERR_FORMAT,
     "tensor 'b' starts at byte 8 of the data but the tensors before it end at 4"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, KL_ERR_FORMAT,
     "tensor 'b' starts at byte 4 of the data but the tensors before it end at 8"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, KL_ERR_FORMAT, "duplicate tensor name 'a'"},
    {"{\"__metadata__\":{\"k\":\"v\"},\"__metadata__\":{}}", 0, KL_ERR_FORMAT, "duplicate \"__metadata__\""},
    {"{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, KL_ERR_FORMAT, "duplicate metadata key 'k'"},
    {"{\"__metadata__\":{\"k\":1}}", 0, KL_ERR_FORMAT, "metadata values must be strings, found '1'"},
    {T1("[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, KL_ERR_UNSUPPORTED, "tensor 'a' has more than 8 dimensions"},
    {T1("[99999999999999999999]", "[0,4]"), 4, KL_ERR_FORMAT, "a shape dimension at byte 29 is too large"},
    {T1("[-1]", "[0,4]"), 4, KL_ERR_FORMAT, "a shape dimension must be a non-negative integer, found '-'"},
    {T1("[2.0]", "[0,8]"), 8, KL_ERR_FORMAT, "a shape dimension must be a non-negative integer"},
    {T1("[02]", "[0,8]"), 8, KL_ERR_FORMAT, "a shape dimension must be a non-negative integer"},
    {T1("[2]", "[0,8,9]"), 8, KL_ERR_FORMAT, "expected ']' after the two data_offsets, found ','"},
    {T1("[2]", "[0]"), 8, KL_ERR_FORMAT, "expected ',' in data_offsets (two offsets)"},
    {T1("[4611686018427387904,4]", "[0,4]"), 4, KL_ERR_FORMAT,
     "tensor 'a': shape [4611686018427387904,4] of F32 overflows"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, KL_ERR_FORMAT, "tensor 'a' lacks \"data_offsets\""},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KL_ERR_FORMAT,
     "tensor 'a' has a duplicate key"},
    {T1("[2]", "[0,8]") " x", 8, KL_ERR_FORMAT, "expected the end of the header (only space padding may follow)"},
    {"{\"a\\u0000b\":{}}", 0, KL_ERR_UNSUPPORTED, "contains a NUL character"},
    {"{\"\\ud800\":{}}", 0, KL_ERR_FORMAT, "unpaired UTF-16 surrogate"},
    {"{\"\\udc00x\":{}}", 0, KL_ERR_FORMAT, "unpaired UTF-16 surrogate"},
    {"{\"\\u12\":{}}", 0, KL_ERR_FORMAT, "bad \\u escape"},
    {"{\"a\\x\":{}}", 0, KL_ERR_FORMAT, "bad escape in a string, found 'x'"},
    {"{\"a\nb\":{}}", 0, KL_ERR_FORMAT, "control character in a string, found byte 0x0a"},
    {"{\"a", 0, KL_ERR_FORMAT, "unterminated string"},
    {"{\"a\\", 0, KL_ERR_FORMAT, "unterminated string"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":[1,-2.5e3,tru]}}", 4, KL_ERR_FORMAT,
     "expected a JSON value"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":01}}", 4, KL_ERR_FORMAT, "bad number"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1.}}", 4, KL_ERR_FORMAT, "bad number"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":[1 2]}}", 4, KL_ERR_FORMAT,
     "expected ',' or ']'"},
    {"{\"a\":{\"dtype\":5,\"shape\":[],\"data_offsets\":[0,4]}}", 4, KL_ERR_FORMAT, "expected a string, found '5'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, KL_ERR_FORMAT,
     "expected '[' to open a shape, found '2'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2 3],\"data_offsets\":[0,8]}}", 8, KL_ERR_FORMAT,
     "expected ',' or ']' in a shape, found '3'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":null}}", 8, KL_ERR_FORMAT,
     "expected '[' to open data_offsets, found 'n'"},
    {"{\"a\":{\"dtype\":\"F32\" \"shape\":[2]}}", 8, KL_ERR_FORMAT,
     "expected ',' or '}' in a tensor's description, found '\"'"},
    {"{\"__metadata__\":[]}", 0, KL_ERR_FORMAT, "expected '{' to open __metadata__, found '['"},
    {"{\"__metadata__\":{\"k\":\"v\" \"l\":\"w\"}}", 0, KL_ERR_FORMAT, "expected ',' or '}' in __metadata__"},
    {"{\"__metadata__\":{\"k\" \"v\"}}", 0, KL_ERR_FORMAT, "expected ':' after a key, found '\"'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":{\"k\" 1}}}", 4, KL_ERR_FORMAT,
     "expected ':' after a key, found '1'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":{\"k\":1 \"l\":2}}}", 4,
     KL_ERR_FORMAT, "expected ',' or '}', found '\"'"},
};

static void safetensors_malformed(void **s) {
    (void)s;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        size_t len;
        unsigned char *b = mkfile(bad_cases[i].json, bad_cases[i].dlen, &len);
        kl_safetensors *f = kl_load_safetensors_buffer(b, len);
        if (f || kl_last_status() != bad_cases[i].code || !strstr(kl_last_error(), bad_cases[i].needle)) {
            print_error("case %zu (%s): got %s \"%s\", expected %s \"%s\"\n", i, bad_cases[i].json,
                        kl_status_name(kl_last_status()), kl_last_error(), kl_status_name(bad_cases[i].code),
                        bad_cases[i].needle);
            fail();
        }
        kl_clear_error();
        free(b);
    }
    /* nesting in an ignored field is bounded */
    char deep[400];
    strcpy(deep, "{\"a\":{\"x\":");
    for (int k = 0; k < 100; k++) strcat(deep, "[");
    strcat(deep, "}}");
    size_t len;
    unsigned char *b = mkfile(deep, 0, &len);
    assert_null(kl_load_safetensors_buffer(b, len));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "values nested too deeply");
    free(b);
    /* length field problems */
    assert_null(kl_load_safetensors_buffer("\x01\0\0\0\0", 5));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "kl_load_safetensors_buffer: buffer: 5 bytes: too short for the 8-byte header length");
    assert_null(kl_load_safetensors_buffer("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "header length 18446744073709551615 exceeds the 100000000-byte limit");
    assert_null(kl_load_safetensors_buffer("\x10\0\0\0\0\0\0\0{}", 10));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "header length 16 runs past the end of the file (2 bytes after the length)");
    /* the file loader names the file */
    const char *path = kt_tmp_path("bad_file.safetensors");
    FILE *fp = fopen(path, "wb");
    fwrite("\x02\0\0\0\0\0\0\0{x", 1, 10, fp);
    fclose(fp);
    assert_null(kl_load_safetensors(path));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "bad_file.safetensors: bad JSON header at byte 1: expected a string, found 'x'");
    fp = fopen(path, "wb");
    fclose(fp);
    assert_null(kl_load_safetensors(path));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "0 bytes: too short");
}

static void safetensors_valid_oddities(void **s) {
    (void)s;
    /* whitespace, unknown fields, null metadata, escapes, zero-size tensors sharing an offset */
    const char *json =
        " {\n \"__metadata__\" : null ,\t\"z\":{\"data_offsets\":[0,0],\"shape\":[0,5],\"dtype\":\"F64\"},"
        "\"\\u00e9\\ud83d\\ude00\\/\":{\"dtype\":\"U8\",\"extra\":{\"k\":[1,-2.5e3,true,false,null,\"s\",{}]},"
        "\"shape\":[2],\"data_offsets\":[0,2]},\"b\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[2,3]}}   ";
    size_t len;
    unsigned char *b = mkfile(json, 3, &len);
    b[len - 3] = 7, b[len - 2] = 9, b[len - 1] = 2; /* a bool byte of 2 reads as true */
    kl_safetensors *f = kl_load_safetensors_buffer(b, len);
    free(b);
    if (!f) print_error("%s\n", kl_last_error());
    assert_non_null(f);
    assert_int_equal(kl_safetensors_count(f), 3);
    assert_int_equal(kl_safetensors_metadata_count(f), 0);
    assert_string_equal(kl_safetensors_name(f, 0), "z"); /* offsets [0,0] come first */
    kl_tensor *u = kl_safetensors_find(f, "\xc3\xa9\xf0\x9f\x98\x80/");
    assert_non_null(u);
    KT_VALUES(u, 0, 7, 9);
    kl_tensor *t = kl_safetensors_find(f, "b");
    assert_int_equal(kl_ndim(t), 0);
    assert_int_equal(((const uint8_t *)kl_data_ptr(t))[0], 1);
    kt_assert_shape(kl_safetensors_find(f, "z"), 2, (const int64_t[]){0, 5});
    kl_safetensors_free(f);
    /* an empty header is a valid, empty file */
    b = mkfile("{}", 0, &len);
    f = kl_load_safetensors_buffer(b, len);
    assert_non_null(f);
    assert_int_equal(kl_safetensors_count(f), 0);
    kl_safetensors_free(f);
    free(b);
}

/* Every truncation and many corruptions of a valid file: errors, never a crash
 * (run under ASan). Corruptions that keep the file valid load normally. */
static void safetensors_fuzz(void **s) {
    (void)s;
    size_t len;
    unsigned char *good = read_file(st_path("torch_mixed.safetensors"), &len);
    unsigned char *b = malloc(len);
    for (size_t n = 0; n < len; n++) {
        memcpy(b, good, n);
        kl_safetensors *f = kl_load_safetensors_buffer(b, n);
        assert_null(f);
        assert_int_equal(kl_last_status(), KL_ERR_FORMAT);
        kl_clear_error();
    }
    static const unsigned char muts[] = {0x01, 0x20, 0x80, 0xff};
    static const unsigned char chars[] = {'"', '{', '}', '[', ']', ',', ':', '\\', '0', '9', ' ', 0};
    int ok = 0, bad = 0;
    for (size_t i = 0; i < len; i++) {
        for (size_t m = 0; m < sizeof muts + sizeof chars; m++) {
            memcpy(b, good, len);
            if (m < sizeof muts) b[i] ^= muts[m];
            else b[i] = chars[m - sizeof muts];
            kl_safetensors *f = kl_load_safetensors_buffer(b, len);
            if (f) {
                ok++;
                kl_safetensors_free(f);
            } else {
                bad++;
                kl_status st = kl_last_status();
                if (st != KL_ERR_FORMAT && st != KL_ERR_UNSUPPORTED) {
                    print_error("byte %zu mutation %zu: %s %s\n", i, m, kl_status_name(st), kl_last_error());
                    fail();
                }
                kl_clear_error();
            }
        }
    }
    /* random multi-byte mutations */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int it = 0; it < 20000; it++) {
        memcpy(b, good, len);
        int k = 1 + it % 4;
        for (int j = 0; j < k; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t pos = (size_t)(x % len);
            b[pos] = (x >> 32) & 1 ? chars[(x >> 40) % sizeof chars] : (unsigned char)(x >> 48);
        }
        size_t n = it % 7 == 0 ? (size_t)(x >> 20) % len : len;
        kl_safetensors *f = kl_load_safetensors_buffer(b, n);
        if (f) kl_safetensors_free(f);
        else kl_clear_error();
    }
    assert_true(ok > 0 && bad > 0);
    free(b);
    free(good);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(init_fans_and_gains),
        KT_TEST(init_uniform_normal_stats),
        KT_TEST(init_constants),
        KT_TEST(init_xavier_kaiming_stats),
        KT_TEST(init_on_parameters_records_nothing),
        KT_TEST(params_collection),
        KT_TEST(params_linear_layer),
        KT_TEST(params_conv_and_batch_norm_layers),
        KT_TEST(optim_matches_torch),
        KT_TEST(adam_one_pass_equals_composed),
        KT_TEST(optim_options_and_errors),
        KT_TEST(training_loops_converge),
        KT_TEST(clip_grad_norm_matches_torch),
        KT_TEST(lr_schedules),
        KT_TEST(optim_state_resumes_training),
        KT_TEST(safetensors_round_trip),
        KT_TEST(safetensors_save_errors),
        KT_TEST(safetensors_from_torch),
        KT_TEST(safetensors_params),
        KT_TEST(safetensors_malformed),
        KT_TEST(safetensors_valid_oddities),
        KT_TEST(safetensors_fuzz),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
