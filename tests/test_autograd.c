/*
 * test_autograd.c — the engine: requires_grad and leaves, accumulation,
 * retain_graph, create_graph, kl_autograd_grad, grad mode, the in-place and
 * view rules, saved-tensor version checks, anomaly mode, DOT export, memory
 * over a training loop and very deep graphs. Per-op derivatives are in the
 * gradcheck suite (test_grad).
 */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

static kl_tensor *leaf(int n, const double *v, kl_dtype dt) {
    kl_tensor *t = kl_from_data(v, 1, (int64_t[]){n}, KL_F64);
    t = kl_to_dtype(t, dt);
    t = kl_clone(t);
    assert_int_equal(kl_set_requires_grad(t, true), 0);
    return t;
}

static void expect_values(const kl_tensor *t, const double *v, int64_t n, double tol) {
    assert_non_null(t);
    kt_assert_values(t, v, n, tol);
}

static void requires_grad_rules(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(3), KL_F32);
    assert_false(kl_requires_grad(x));
    assert_true(kl_is_leaf(x));
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    assert_true(kl_requires_grad(x));
    kl_tensor *y = kl_mul_scalar(x, 2);
    assert_true(kl_requires_grad(y));
    assert_false(kl_is_leaf(y));
    assert_int_equal(kl_set_requires_grad(y, true), 0); /* a no-op on a non-leaf */
    assert_int_equal(kl_set_requires_grad(y, false), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "not a leaf (it was produced by kl_mul)");
    kl_tensor *i = kl_ones(KL_SHAPE(3), KL_I64);
    assert_int_equal(kl_set_requires_grad(i, true), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "only floating tensors can require grad");
    /* Non-differentiable results never require grad. */
    assert_false(kl_requires_grad(kl_gt_scalar(x, 0)));
    kl_tensor *am = kl_argmax(x, 0, false);
    assert_false(kl_requires_grad(am));
    kl_tensor *cmp = kl_sum(kl_to_dtype(kl_gt_scalar(x, 0), KL_F32), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(cmp, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
    assert_int_equal(kl_backward(kl_to_dtype(am, KL_F32), NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
    assert_int_equal(kl_backward(am, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "is the result of kl_argmax, which is not differentiable");
    assert_int_equal(kl_set_requires_grad(NULL, true), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "set_requires_grad");
}

static void simple_backward_and_accumulation(void **state) {
    (void)state;
    kl_tensor *x = leaf(3, (double[]){1, 2, 3}, KL_F32);
    /* y = sum(x*x + 3x): dy/dx = 2x + 3 */
    kl_tensor *y = kl_sum(kl_add(kl_mul(x, x), kl_mul_scalar(x, 3)), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    expect_values(kl_grad(x), (double[]){5, 7, 9}, 3, 0);
    assert_int_equal(kl_dtype_of(kl_grad(x)), KL_F32);
    /* A second graph accumulates into the same grad. */
    kl_tensor *z = kl_sum(kl_mul_scalar(x, 10), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(z, NULL, NULL), 0);
    expect_values(kl_grad(x), (double[]){15, 17, 19}, 3, 0);
    assert_int_equal(kl_zero_grad(x), 0);
    assert_null(kl_grad(x));
}

static void broadcast_and_dtype(void **state) {
    (void)state;
    kl_tensor *a = kl_clone(kl_ones(KL_SHAPE(2, 3), KL_F32));
    kl_tensor *b = leaf(3, (double[]){1, 2, 3}, KL_F64);
    kl_set_requires_grad(a, true);
    kl_tensor *y = kl_sum(kl_mul(a, b), KL_ALL_DIMS, false); /* f64 result */
    assert_int_equal(kl_dtype_of(y), KL_F64);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    kt_assert_shape(kl_grad(b), 1, (int64_t[]){3});
    expect_values(kl_grad(b), (double[]){2, 2, 2}, 3, 0);
    kt_assert_shape(kl_grad(a), 2, (int64_t[]){2, 3});
    assert_int_equal(kl_dtype_of(kl_grad(a)), KL_F32);
    expect_values(kl_grad(a), (double[]){1, 2, 3, 1, 2, 3}, 6, 0);
}

static void non_scalar_needs_grad_output(void **state) {
    (void)state;
    kl_tensor *x = leaf(3, (double[]){1, 2, 3}, KL_F32);
    kl_tensor *y = kl_mul_scalar(x, 2);
    assert_int_equal(kl_backward(y, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "has more than one element");
    kl_tensor *go = kl_from_data((float[]){1, 10, 100}, 1, (int64_t[]){3}, KL_F32);
    assert_int_equal(kl_backward(y, go, NULL), 0);
    expect_values(kl_grad(x), (double[]){2, 20, 200}, 3, 0);
    kl_tensor *bad = kl_ones(KL_SHAPE(4), KL_F32);
    assert_int_equal(kl_backward(y, bad, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "does not match output 1");
    kl_tensor *c = kl_ones(KL_SHAPE(1), KL_F32);
    assert_int_equal(kl_backward(c, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
}

static void retain_graph(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F64);
    kl_tensor *y = kl_sum(kl_exp(x), KL_ALL_DIMS, false);
    kl_backward_options o = kl_backward_options_default();
    o.retain_graph = true;
    assert_int_equal(kl_backward(y, NULL, &o), 0);
    assert_int_equal(kl_backward(y, NULL, NULL), 0); /* frees the saved tensors */
    expect_values(kl_grad(x), (double[]){2 * exp(1.0), 2 * exp(2.0)}, 2, 1e-12);
    assert_int_equal(kl_backward(y, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "backward through the node of kl_exp a second time");
}

static void double_backward(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){2, -1}, KL_F64);
    kl_tensor *y = kl_sum(kl_mul(kl_mul(x, x), x), KL_ALL_DIMS, false); /* sum x^3 */
    kl_tensor *g = NULL;
    kl_backward_options o = kl_backward_options_default();
    o.create_graph = true;
    assert_int_equal(kl_autograd_grad(1, &y, NULL, 1, &x, &g, &o), 0);
    expect_values(g, (double[]){12, 3}, 2, 1e-12); /* 3x^2 */
    assert_true(kl_requires_grad(g));
    assert_null(kl_grad(x)); /* autograd_grad leaves grad alone */
    kl_tensor *g2 = NULL;
    kl_tensor *s = kl_sum(g, KL_ALL_DIMS, false);
    assert_int_equal(kl_autograd_grad(1, &s, NULL, 1, &x, &g2, NULL), 0);
    expect_values(g2, (double[]){12, -6}, 2, 1e-12); /* 6x */
    /* Through a saved output: d2/dx2 exp(x) = exp(x). */
    kl_tensor *e = kl_sum(kl_exp(x), KL_ALL_DIMS, false);
    assert_int_equal(kl_autograd_grad(1, &e, NULL, 1, &x, &g, &o), 0);
    s = kl_sum(g, KL_ALL_DIMS, false);
    assert_int_equal(kl_autograd_grad(1, &s, NULL, 1, &x, &g2, NULL), 0);
    expect_values(g2, (double[]){exp(2.0), exp(-1.0)}, 2, 1e-12);
}

static void autograd_grad_targets(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F64);
    kl_tensor *w = leaf(2, (double[]){3, 4}, KL_F64);
    kl_tensor *unused = leaf(2, (double[]){0, 0}, KL_F64);
    kl_tensor *h = kl_mul(x, w); /* a non-leaf target */
    kl_tensor *y = kl_sum(kl_mul(h, h), KL_ALL_DIMS, false);
    kl_tensor *in[3] = {h, x, unused}, *g[3];
    assert_int_equal(kl_autograd_grad(1, &y, NULL, 3, in, g, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "input 3");
    kl_backward_options o = kl_backward_options_default();
    o.allow_unused = true;
    assert_int_equal(kl_autograd_grad(1, &y, NULL, 3, in, g, &o), 0);
    expect_values(g[0], (double[]){6, 16}, 2, 0);      /* 2h */
    expect_values(g[1], (double[]){18, 64}, 2, 0);     /* 2h w */
    assert_null(g[2]);
    kl_tensor *notreq = kl_ones(KL_SHAPE(2), KL_F64);
    assert_int_equal(kl_autograd_grad(1, &y, NULL, 1, &notreq, g, &o), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
}

static void grad_mode(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F32);
    assert_true(kl_is_grad_enabled());
    kl_no_grad_begin();
    assert_false(kl_is_grad_enabled());
    kl_tensor *y = kl_mul_scalar(x, 2);
    assert_false(kl_requires_grad(y));
    kl_enable_grad_begin();
    assert_true(kl_requires_grad(kl_mul_scalar(x, 2)));
    kl_enable_grad_end();
    assert_false(kl_is_grad_enabled());
    /* Parameter updates in place are fine without grad. */
    assert_non_null(kl_sub_scalar_inplace(x, 1));
    kl_no_grad_end();
    assert_true(kl_is_grad_enabled());
    kl_no_grad_end();
    KT_EXPECT_ERROR(KL_ERR_STATE, "no matching begin");
    kl_tensor *d = kl_detach(kl_mul_scalar(x, 2));
    assert_false(kl_requires_grad(d));
    assert_true(kl_is_leaf(d));
}

static void inplace_rules(void **state) {
    (void)state;
    kl_tensor *x = leaf(3, (double[]){0.5, 1, 2}, KL_F64);
    /* A leaf that requires grad cannot be written in grad mode. */
    assert_null(kl_exp_inplace(x));
    KT_EXPECT_ERROR(KL_ERR_STATE, "in-place write into a leaf that requires grad");
    /* A non-leaf can: the gradient goes through the in-place node. */
    kl_tensor *a = kl_mul_scalar(x, 2);
    assert_ptr_equal(kl_exp_inplace(a), a);
    kl_tensor *y = kl_sum(a, KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    double want[3];
    for (int i = 0; i < 3; i++) want[i] = 2 * exp(2 * (double[]){0.5, 1, 2}[i]);
    expect_values(kl_grad(x), want, 3, 1e-12);
    /* In place with a saved self: mul_inplace needs the old value for the other input. */
    kl_zero_grad(x);
    kl_tensor *w = leaf(3, (double[]){3, 4, 5}, KL_F64);
    kl_tensor *b = kl_mul_scalar(x, 1);
    kl_mul_inplace(b, w);
    assert_int_equal(kl_backward(kl_sum(b, KL_ALL_DIMS, false), NULL, NULL), 0);
    expect_values(kl_grad(w), (double[]){0.5, 1, 2}, 3, 0);
    expect_values(kl_grad(x), (double[]){3, 4, 5}, 3, 0);
    /* A recorded view cannot be written in place. */
    kl_tensor *c = kl_mul_scalar(x, 1);
    kl_tensor *v = kl_slice(c, 0, 0, 2, 1);
    assert_null(kl_mul_scalar_inplace(v, 2));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "in-place write into a view");
    /* A plain tensor with aliases cannot start requiring grad in place. */
    kl_tensor *buf = kl_zeros(KL_SHAPE(3), KL_F64);
    kl_tensor *alias = kl_slice(buf, 0, 0, 1, 1);
    assert_non_null(alias);
    assert_null(kl_add_inplace(buf, x));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "whose storage other tensors share");
    kl_tensor *fresh = kl_zeros(KL_SHAPE(3), KL_F64);
    assert_non_null(kl_add_inplace(fresh, x));
    assert_true(kl_requires_grad(fresh));
}

static void saved_tensor_modified(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F64);
    kl_tensor *a = kl_mul_scalar(x, 1);
    kl_tensor *y = kl_sum(kl_mul(a, a), KL_ALL_DIMS, false); /* saves a */
    kl_mul_scalar_inplace(a, 2);
    assert_int_equal(kl_backward(y, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "of kl_mul ([2] float64 cpu), saved for its backward, was modified afterwards "
                                  "by the in-place kl_mul_inplace");
    /* A view whose base was written after it was made is stale. */
    kl_tensor *b = kl_mul_scalar(x, 1);
    kl_tensor *v = kl_slice(b, 0, 0, 1, 1);
    kl_add_scalar_inplace(b, 1);
    assert_null(kl_mul_scalar(v, 2));
    KT_EXPECT_ERROR(KL_ERR_STATE, "is a view whose storage was modified by kl_add_inplace");
}

static void retain_grad_non_leaf(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F64);
    kl_tensor *h = kl_mul_scalar(x, 3);
    assert_int_equal(kl_retain_grad(h), 0);
    kl_tensor *y = kl_sum(kl_mul(h, h), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    expect_values(kl_grad(h), (double[]){6, 12}, 2, 0);
    expect_values(kl_grad(x), (double[]){18, 36}, 2, 0);
    kl_tensor *n = kl_ones(KL_SHAPE(1), KL_F64);
    assert_int_equal(kl_retain_grad(n), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
}

static void anomaly_names_forward_op(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){0, 1}, KL_F64);
    kl_tensor *y = kl_sum(kl_sqrt(x), KL_ALL_DIMS, false); /* d sqrt at 0 = inf */
    kl_set_anomaly(true);
    assert_true(kl_anomaly_enabled());
    int rc = kl_backward(y, NULL, NULL);
    kl_set_anomaly(false);
    assert_int_equal(rc, -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "the backward of kl_sqrt");
    /* Without anomaly mode the inf just flows into grad. */
    kl_tensor *z = kl_sum(kl_sqrt(x), KL_ALL_DIMS, false);
    assert_int_equal(kl_backward(z, NULL, NULL), 0);
    assert_true(isinf(kt_get(kl_grad(x), 0)));
}

static void dot_export(void **state) {
    (void)state;
    kl_tensor *x = leaf(2, (double[]){1, 2}, KL_F32);
    kl_tensor *y = kl_sum(kl_exp(kl_mul(x, x)), KL_ALL_DIMS, false);
    char path[] = "/tmp/kiln_dot_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kl_autograd_dot(y, path), 0);
    FILE *f = fopen(path, "r");
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    remove(path);
    assert_non_null(strstr(buf, "digraph autograd"));
    assert_non_null(strstr(buf, "kl_exp backward"));
    assert_non_null(strstr(buf, "kl_mul backward"));
    assert_non_null(strstr(buf, "kl_sum backward"));
    assert_non_null(strstr(buf, "saved output 1"));
    assert_non_null(strstr(buf, "leaf\\n[2]"));
    assert_int_equal(kl_autograd_dot(y, "/nonexistent-dir/x.dot"), -1);
    KT_EXPECT_ERROR(KL_ERR_IO, "cannot write");
}

/* Many steps of a small regression keep the live tensor count flat. */
static void training_loop_memory(void **state) {
    (void)state;
    kl_manual_seed(3);
    kl_tensor *w = kl_retain(kl_mul_scalar(kl_randn(KL_SHAPE(8, 4), KL_F32), 0.1));
    kl_set_requires_grad(w, true);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(32, 8), KL_F32));
    kl_tensor *target = kl_retain(kl_matmul(x, kl_ones(KL_SHAPE(8, 4), KL_F32)));
    int64_t live_after_first = 0;
    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < 200; step++) {
        kl_scope_begin();
        kl_tensor *loss = kl_mse_loss(kl_matmul(x, w), target, KL_REDUCE_MEAN);
        if (step == 0) first_loss = kl_item(loss);
        last_loss = kl_item(loss);
        assert_int_equal(kl_backward(loss, NULL, NULL), 0);
        kl_no_grad_begin();
        kl_sub_inplace(w, kl_mul_scalar(kl_grad(w), 0.05));
        kl_no_grad_end();
        kl_zero_grad(w);
        kl_scope_end();
        if (step == 0) live_after_first = kl_live_tensors();
        assert_int_equal(kl_live_tensors(), live_after_first);
    }
    assert_true(last_loss < 0.01 * first_loss);
    kl_release(w);
    kl_release(x);
    kl_release(target);
}

/* A chain of 200k nodes: backward and teardown must not recurse per node. */
static void deep_graph(void **state) {
    (void)state;
    kl_tensor *x = leaf(1, (double[]){1}, KL_F64);
    kl_scope_begin();
    kl_tensor *y = x;
    for (int i = 0; i < 200000; i++) {
        kl_tensor *next = kl_mul_scalar(y, 1.0);
        if (y != x) kl_release(y);
        y = next;
    }
    assert_int_equal(kl_backward(kl_sum(y, KL_ALL_DIMS, false), NULL, NULL), 0);
    kl_scope_end();
    expect_values(kl_grad(x), (double[]){1}, 1, 0);
}

static kl_tensor *half_detached(void *u, int n, kl_tensor *const *in) {
    (void)u;
    (void)n;
    return kl_mul(in[0], kl_detach(in[0])); /* analytic x, numerical 2x */
}
static kl_tensor *cube(void *u, int n, kl_tensor *const *in) {
    (void)u;
    (void)n;
    return kl_mul(kl_mul(in[0], in[0]), in[1]);
}

static void gradcheck_can_fail(void **state) {
    (void)state;
    kl_tensor *x = leaf(3, (double[]){0.5, 1, 2}, KL_F64);
    kl_tensor *w = leaf(3, (double[]){1, -1, 2}, KL_F64);
    kl_gradcheck_options o = kl_gradcheck_options_default();
    o.quiet = true;
    assert_int_equal(kl_gradcheck(half_detached, NULL, 1, &x, &o), 0);
    KT_EXPECT_ERROR(KL_ERR_ARG, "Jacobian mismatch for input 1");
    kl_tensor *in[2] = {x, w};
    assert_int_equal(kl_gradcheck(cube, NULL, 2, in, &o), 1);
    assert_int_equal(kl_gradgradcheck(cube, NULL, 2, in, &o), 1);
    kl_tensor *f = leaf(3, (double[]){0.5, 1, 2}, KL_F32);
    assert_int_equal(kl_gradcheck(cube, NULL, 1, &f, &o), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "must be float64");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(requires_grad_rules),
        KT_TEST(simple_backward_and_accumulation),
        KT_TEST(broadcast_and_dtype),
        KT_TEST(non_scalar_needs_grad_output),
        KT_TEST(retain_graph),
        KT_TEST(double_backward),
        KT_TEST(autograd_grad_targets),
        KT_TEST(grad_mode),
        KT_TEST(inplace_rules),
        KT_TEST(saved_tensor_modified),
        KT_TEST(retain_grad_non_leaf),
        KT_TEST(anomaly_names_forward_op),
        KT_TEST(dot_export),
        KT_TEST(training_loop_memory),
        KT_TEST(deep_graph),
        KT_TEST(gradcheck_can_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
