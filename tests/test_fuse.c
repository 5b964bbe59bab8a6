/*
 * test_fuse.c — fusion, the kernel IR and its interpreter: kernel counts of
 * the standard workloads in FUSE mode, fused results against eager (bitwise
 * for elementwise kernels, which run eager's own loops in eager's dtypes;
 * within a documented tolerance for row reductions), non-contiguous and
 * broadcast inputs, dtypes, 0-dim and empty shapes, the kernel text form,
 * and that TRACE_ONLY / NO_FUSE and autograd-recording calls do not fuse.
 */
#include "harness.h"

#include "kernel.h"
#include "trace.h"
#include "workloads.h"

#include <math.h>
#include <stdlib.h>

static const kl_compile_options *mode(kl_compile_mode m) {
    static kl_compile_options o;
    o = kl_compile_options_default();
    o.mode = m;
    return &o;
}

/* The standard workloads (gelu's tanh form, softmax and layer norm from
 * primitives, the mlp) as the library defines them for kiln-bench
 * (src/bench/workloads.c): the counts asserted here are of what is measured. */
#define WL(id) (kw_find(#id)->fn)

static kl_tensor *seq(int64_t n, double scale, kl_dtype dt) {
    return kl_to_dtype(kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F64), (double)n / 2), scale), dt);
}

/* Compiles fn in mode m, calls it twice on in[], compares every output with
 * eager (tol 0: bitwise, else relative+absolute on f64 copies) and returns
 * the kernel count. */
static int64_t run_and_compare(kl_traceable fn, kl_compile_mode m, kl_tensor **in, int n_in, int n_out, double tol) {
    kl_tensor *ref[4] = {0}, *got[4] = {0};
    assert_int_equal(fn(NULL, in, n_in, ref, n_out), 0);
    kl_fn *f = kl_compile(fn, NULL, mode(m));
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(f, in, n_in, got, n_out), 0);
        for (int j = 0; j < n_out; j++) {
            assert_non_null(got[j]);
            assert_int_equal(got[j]->dtype, ref[j]->dtype);
            assert_int_equal(got[j]->ndim, ref[j]->ndim);
            assert_memory_equal(got[j]->shape, ref[j]->shape, sizeof(int64_t) * ref[j]->ndim);
            if (tol == 0) {
                /* exactly equal, NaN where eager has NaN */
                assert_int_equal(kl_allclose(got[j], ref[j], 0, 0, true), 1);
            } else {
                assert_int_equal(kl_allclose(kl_to_dtype(got[j], KL_F64), kl_to_dtype(ref[j], KL_F64), tol, tol, true), 1);
            }
        }
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    kl_fn_release(f);
    return st.kernels;
}

/* ---- elementwise ------------------------------------------------------------------- */

/* y = exp(relu(x * w + 1)) - x: a 5-op chain */
static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub(kl_exp(kl_relu(kl_add_scalar(kl_mul(in[0], in[1]), 1))), in[0]);
    return out[0] ? 0 : -1;
}

static void chain_is_one_kernel(void **state) {
    (void)state;
    kl_tensor *in[2] = {seq(12, 0.25, KL_F32), seq(12, -0.5, KL_F32)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, in, 2, 1, 0), 1);
    assert_int_equal(run_and_compare(chain, KL_COMPILE_NO_FUSE, in, 2, 1, 0), 5);
    assert_int_equal(run_and_compare(chain, KL_COMPILE_TRACE_ONLY, in, 2, 1, 0), 5);
}

static void chain_broadcast_strided_dtypes(void **state) {
    (void)state;
    /* x [4,3] transposed (strided), w [3] broadcast over rows */
    kl_tensor *x = kl_transpose(kl_reshape(seq(12, 0.25, KL_F32), KL_SHAPE(3, 4)), 0, 1);
    kl_tensor *in[2] = {x, seq(3, -0.5, KL_F32)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, in, 2, 1, 0), 1);
    /* f64, and i32 x with an f64 w (promotion inside the kernel) */
    kl_tensor *d[2] = {seq(6, 0.5, KL_F64), seq(6, 0.125, KL_F64)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, d, 2, 1, 0), 1);
    kl_tensor *m[2] = {seq(6, 1, KL_I32), seq(6, 0.125, KL_F32)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, m, 2, 1, 0), 1);
    /* 0-dim and empty */
    kl_tensor *z[2] = {kl_scalar_tensor(0.5, KL_F32), kl_scalar_tensor(-2, KL_F32)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, z, 2, 1, 0), 1);
    kl_tensor *e[2] = {kl_zeros(KL_SHAPE(0, 3), KL_F32), kl_ones(KL_SHAPE(3), KL_F32)};
    assert_int_equal(run_and_compare(chain, KL_COMPILE_FUSE, e, 2, 1, 0), 1);
}

/* Counts nodes of the cached graph's text: "kernel(" and "matmul(" lines. */
static int count_in_graph(kl_fn *f, const char *what) {
    static char buf[16384];
    assert_true(kl_fn_graph_text(f, buf, sizeof buf) > 0);
    int n = 0;
    for (const char *p = buf; (p = strstr(p, what)); p++) n++;
    return n;
}

static int gelu_op(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_gelu(in[0]);
    return out[0] ? 0 : -1;
}

/* a = exp(x) * 2 is read by a matmul before a * b: that group cannot take the
 * product, but b's group can, so the product and the final add join it */
static int partial_merge(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *a = kl_mul_scalar(kl_exp(in[0]), 2);
    kl_tensor *m = kl_matmul(a, in[1]);
    kl_tensor *b = kl_add_scalar(kl_sin(in[2]), 1);
    out[0] = kl_add(kl_mul(a, b), m);
    return out[0] ? 0 : -1;
}

static void nodes_join_the_groups_they_can(void **state) {
    (void)state;
    kl_tensor *in[3] = {kl_reshape(seq(16, 0.1, KL_F32), KL_SHAPE(4, 4)), kl_reshape(seq(16, 0.2, KL_F32), KL_SHAPE(4, 4)),
                        kl_reshape(seq(16, 0.3, KL_F32), KL_SHAPE(4, 4))};
    /* the matmul and 2 kernels (3 kernels when the product starts a group of its own) */
    assert_int_equal(run_and_compare(partial_merge, KL_COMPILE_FUSE, in, 3, 1, 0), 3);
}

static void gelu_is_one_kernel(void **state) {
    (void)state;
    kl_tensor *in[1] = {kl_reshape(seq(24, 0.3, KL_F32), KL_SHAPE(4, 6))};
    assert_int_equal(run_and_compare(WL(gelu), KL_COMPILE_FUSE, in, 1, 1, 0), 1);
    assert_true(run_and_compare(WL(gelu), KL_COMPILE_NO_FUSE, in, 1, 1, 0) >= 8);
    assert_int_equal(run_and_compare(gelu_op, KL_COMPILE_FUSE, in, 1, 1, 0), 1);
}

static int softmax_op(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}

static int layer_norm_op(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    return out[0] ? 0 : -1;
}

static void row_kernels(void **state) {
    (void)state;
    /* f32 row reductions are summed in one pass (eager cascades): 1e-5 */
    kl_tensor *x = kl_reshape(seq(35, 0.37, KL_F32), KL_SHAPE(5, 7));
    kl_tensor *in[1] = {x};
    assert_int_equal(run_and_compare(WL(softmax), KL_COMPILE_FUSE, in, 1, 1, 1e-5), 1);
    assert_int_equal(run_and_compare(WL(softmax), KL_COMPILE_NO_FUSE, in, 1, 1, 0), 5);
    assert_int_equal(run_and_compare(softmax_op, KL_COMPILE_FUSE, in, 1, 1, 1e-5), 1);
    kl_tensor *xt[1] = {kl_transpose(kl_reshape(seq(35, 0.37, KL_F64), KL_SHAPE(7, 5)), 0, 1)};
    assert_int_equal(run_and_compare(WL(softmax), KL_COMPILE_FUSE, xt, 1, 1, 1e-12), 1);
    kl_tensor *ln[3] = {x, seq(7, 0.5, KL_F32), seq(7, -0.25, KL_F32)};
    assert_int_equal(run_and_compare(WL(layernorm), KL_COMPILE_FUSE, ln, 3, 1, 1e-5), 1);
    assert_int_equal(run_and_compare(layer_norm_op, KL_COMPILE_FUSE, ln, 3, 1, 1e-5), 1);
    /* rows of zero length, and no rows */
    kl_tensor *e1[1] = {kl_zeros(KL_SHAPE(3, 0), KL_F32)}, *e2[1] = {kl_zeros(KL_SHAPE(0, 4), KL_F32)};
    assert_int_equal(run_and_compare(WL(softmax), KL_COMPILE_FUSE, e2, 1, 1, 1e-5), 1);
    (void)e1; /* amax over an empty dim is an error in eager: nothing to fuse */
}

static int mlp_linear(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_linear(kl_gelu(kl_linear(in[0], in[1], in[2])), in[3], in[4]);
    return out[0] ? 0 : -1;
}

static void mlp_is_two_matmuls_and_two_kernels(void **state) {
    (void)state;
    kl_tensor *in[5] = {kl_reshape(seq(12, 0.1, KL_F32), KL_SHAPE(3, 4)), kl_reshape(seq(20, 0.05, KL_F32), KL_SHAPE(4, 5)),
                        seq(5, 0.2, KL_F32), kl_reshape(seq(10, -0.07, KL_F32), KL_SHAPE(5, 2)), seq(2, 0.3, KL_F32)};
    int64_t launches = run_and_compare(WL(mlp), KL_COMPILE_FUSE, in, 5, 1, 0);
    assert_true(launches <= 4);
    kl_fn *f = kl_compile(WL(mlp), NULL, mode(KL_COMPILE_FUSE));
    kl_tensor *y;
    assert_int_equal(kl_fn_call(f, in, 5, &y, 1), 0);
    assert_int_equal(count_in_graph(f, "= matmul("), 2);
    assert_int_equal(count_in_graph(f, "= kernel("), 1); /* bias + GELU; the last bias add is one op */
    kl_fn_release(f);
    /* kl_linear decomposes into transpose + matmul + add: the same */
    kl_tensor *lin[5] = {in[0], kl_transpose(in[1], 0, 1), in[2], kl_transpose(in[3], 0, 1), in[4]};
    assert_true(run_and_compare(mlp_linear, KL_COMPILE_FUSE, lin, 5, 1, 0) <= 4);
    f = kl_compile(mlp_linear, NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, lin, 5, &y, 1), 0);
    assert_int_equal(count_in_graph(f, "= matmul("), 2);
    assert_int_equal(count_in_graph(f, "= kernel("), 1);
    kl_fn_release(f);
}

/* AdamW over one parameter: param, m, v updated in place from grad */
static int adamw(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, bc1 = 1 - 0.9, bc2 = 1 - 0.999;
    kl_mul_scalar_inplace(p, 1 - lr * wd);
    kl_add_inplace(kl_mul_scalar_inplace(m, b1), kl_mul_scalar(g, 1 - b1));
    kl_add_inplace(kl_mul_scalar_inplace(v, b2), kl_mul_scalar(kl_mul(g, g), 1 - b2));
    kl_tensor *den = kl_add_scalar(kl_sqrt(kl_div_scalar(v, bc2)), eps);
    out[0] = kl_sub_inplace(p, kl_mul_scalar(kl_div(m, den), lr / bc1));
    return out[0] ? 0 : -1;
}

static int adamw_pure(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, bc1 = 1 - 0.9, bc2 = 1 - 0.999;
    p = kl_mul_scalar(p, 1 - lr * wd);
    out[1] = kl_add(kl_mul_scalar(m, b1), kl_mul_scalar(g, 1 - b1));
    out[2] = kl_add(kl_mul_scalar(v, b2), kl_mul_scalar(kl_mul(g, g), 1 - b2));
    kl_tensor *den = kl_add_scalar(kl_sqrt(kl_div_scalar(out[2], bc2)), eps);
    out[0] = kl_sub(p, kl_mul_scalar(kl_div(out[1], den), lr / bc1));
    return out[0] ? 0 : -1;
}

static void adamw_is_one_kernel(void **state) {
    (void)state;
    kl_tensor *in[4] = {seq(8, 0.1, KL_F32), seq(8, -0.2, KL_F32), seq(8, 0.01, KL_F32), kl_abs(seq(8, 0.02, KL_F32))};
    assert_int_equal(run_and_compare(adamw_pure, KL_COMPILE_FUSE, in, 4, 3, 0), 1);
    /* in place: compiled and eager each on their own copies */
    kl_tensor *a[4], *b[4], *ya, *yb;
    for (int i = 0; i < 4; i++) a[i] = kl_clone(in[i]), b[i] = kl_clone(in[i]);
    kl_fn *f = kl_compile(adamw, NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(adamw(NULL, a, 4, &ya, 1), 0);
    assert_int_equal(kl_fn_call(f, b, 4, &yb, 1), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(kl_equal(a[i], b[i]), 1);
    assert_int_equal(kl_equal(ya, yb), 1);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.kernels, 1); /* functionalized: one kernel, then the write-backs */
    kl_fn_release(f);
}

/* where / clamp / casts / comparisons / bool logic with i32 and f64 inputs */
static int mixed(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *i = in[0], *d = in[1], *b = in[2];
    kl_tensor *c = kl_clamp(kl_to_dtype(kl_mul_scalar(i, 3), KL_F32), -4, 5);
    kl_tensor *m = kl_logical_and(kl_gt(d, c), b);
    out[0] = kl_where(m, kl_sqrt(kl_abs(d)), kl_neg(c));
    out[1] = kl_bitwise_xor(kl_add(i, kl_to_dtype(b, KL_I32)), i);
    return out[0] && out[1] ? 0 : -1;
}

static void mixed_dtypes_are_bitwise_equal(void **state) {
    (void)state;
    kl_tensor *in[3] = {kl_reshape(seq(12, 1, KL_I32), KL_SHAPE(3, 4)), seq(4, 0.75, KL_F64),
                        kl_gt(kl_reshape(seq(12, 1, KL_I32), KL_SHAPE(3, 4)), kl_scalar_tensor(0, KL_I32))};
    /* out[0] and out[1] come from two groups: the f64 where chain and the i32 one */
    int64_t n = run_and_compare(mixed, KL_COMPILE_FUSE, in, 3, 2, 0);
    assert_true(n <= 2);
    /* the same with strided inputs */
    kl_tensor *t[3] = {kl_transpose(kl_reshape(seq(12, 1, KL_I32), KL_SHAPE(4, 3)), 0, 1), seq(4, -0.5, KL_F64),
                       kl_expand(kl_gt(seq(4, 1, KL_F32), kl_scalar_tensor(0, KL_F32)), KL_SHAPE(3, 4))};
    assert_true(run_and_compare(mixed, KL_COMPILE_FUSE, t, 3, 2, 0) <= 2);
}

/* y and y*y are both returned: one kernel with two outputs */
static int two_outputs(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sigmoid(kl_add(in[0], in[1]));
    out[1] = kl_mul(out[0], kl_sub_scalar(out[0], 1));
    return out[1] ? 0 : -1;
}

static void one_kernel_many_outputs(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(6, 0.5, KL_F32), KL_SHAPE(2, 3)), seq(3, 0.25, KL_F32)};
    assert_int_equal(run_and_compare(two_outputs, KL_COMPILE_FUSE, in, 2, 2, 0), 1);
}

/* the shortcuts pow takes for a scalar exponent are kept (x*x*x, not powf):
 * remainder(exp(x^3), 1) magnifies any one-ulp difference */
static int pow_chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = kl_pow_scalar(in[0], 3);
    kl_exp_inplace(p);
    out[0] = kl_remainder_scalar(p, 1);
    out[1] = kl_pow(in[0], in[1]); /* exponent broadcast along rows: stays eager's op */
    return out[0] ? 0 : -1;
}

static void pow_shortcuts_match_eager(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_abs(kl_reshape(seq(40, 0.11, KL_F32), KL_SHAPE(5, 8))), kl_reshape(seq(5, 0.5, KL_F32), KL_SHAPE(5, 1))};
    assert_true(run_and_compare(pow_chain, KL_COMPILE_FUSE, in, 2, 2, 0) <= 2);
}

static int int_remainder(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_remainder(kl_add_scalar(in[0], 1), kl_mul_scalar(in[1], 2));
    return out[0] ? 0 : -1;
}

static void integer_division_by_zero_is_an_error(void **state) {
    (void)state;
    kl_tensor *a = seq(4, 1, KL_I32), *z = kl_zeros(KL_SHAPE(4), KL_I32), *y = NULL;
    kl_fn *f = kl_compile(int_remainder, NULL, mode(KL_COMPILE_FUSE));
    /* traced with a divisor without zeros */
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, kl_add_scalar(a, 5)}, 2, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, z}, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    assert_null(y);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.kernels, 1);
    kl_fn_release(f);
}

/* inputs requiring grad: the forward is one kernel and so is the backward
 * (aot.c), one autograd node per call; elementwise kernels are eager's
 * formulas, so the gradient is bitwise eager's */
static void inputs_requiring_grad_fuse_forward_and_backward(void **state) {
    (void)state;
    kl_tensor *x = kl_clone(seq(6, 0.5, KL_F32)), *w = kl_clone(seq(6, 0.25, KL_F32)), *y;
    kl_set_requires_grad(x, true);
    kl_fn *f = kl_compile(chain, NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, w}, 2, &y, 1), 0);
    assert_true(kl_requires_grad(y));
    assert_int_equal(kl_backward(kl_sum(y, 0, NULL, false), NULL, NULL), 0);
    kl_tensor *g1 = kl_clone(kl_grad(x));
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.kernels, 1);
    assert_int_equal(st.aot_calls, 1);
    assert_int_equal(st.opbyop_grad_calls, 0);
    assert_int_equal(st.backward_calls, 1);
    assert_true(st.backward_kernels >= 1 && st.backward_kernels <= 2);
    /* eager gradient */
    kl_tensor *x2 = kl_clone(seq(6, 0.5, KL_F32)), *y2;
    kl_set_requires_grad(x2, true);
    assert_int_equal(chain(NULL, (kl_tensor *[]){x2, w}, 2, &y2, 1), 0);
    assert_int_equal(kl_backward(kl_sum(y2, 0, NULL, false), NULL, NULL), 0);
    assert_int_equal(kl_equal(g1, kl_grad(x2)), 1);
    /* without grad mode the same function fuses */
    kl_no_grad_begin();
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, w}, 2, &y, 1), 0);
    kl_no_grad_end();
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.kernels, 1 + 1);
    kl_fn_release(f);
}

static void row_kernel_edges(void **state) {
    (void)state;
    /* long f32 rows: one sequential pass against eager's cascade, 1e-5 */
    kl_tensor *x[1] = {kl_reshape(kl_sin(seq(3 * 4096, 0.01, KL_F32)), KL_SHAPE(3, 4096))};
    assert_int_equal(run_and_compare(WL(softmax), KL_COMPILE_FUSE, x, 1, 1, 1e-5), 1);
    kl_tensor *ln[3] = {x[0], seq(4096, 0.001, KL_F32), seq(4096, -0.0005, KL_F32)};
    assert_int_equal(run_and_compare(WL(layernorm), KL_COMPILE_FUSE, ln, 3, 1, 1e-5), 1);
    /* a 3-d input with a broadcast [1,1,5] row weight */
    kl_tensor *ln3[3] = {kl_reshape(seq(30, 0.2, KL_F64), KL_SHAPE(2, 3, 5)), kl_reshape(seq(5, 0.5, KL_F64), KL_SHAPE(1, 1, 5)),
                         seq(5, 0.1, KL_F64)};
    assert_int_equal(run_and_compare(WL(layernorm), KL_COMPILE_FUSE, ln3, 3, 1, 1e-12), 1);
}

/* rows of length 0: sums are 0, their consumers still run once per row */
static int empty_rows(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *s = kl_sum(kl_exp(in[0]), KL_DIMS(-1), true);
    out[0] = kl_add(kl_mul(s, in[1]), in[1]);
    out[1] = kl_sub(in[0], s);
    return out[0] ? 0 : -1;
}

static void empty_rows_still_write_row_values(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_zeros(KL_SHAPE(3, 0), KL_F32), kl_reshape(seq(3, 1, KL_F32), KL_SHAPE(3, 1))};
    assert_int_equal(run_and_compare(empty_rows, KL_COMPILE_FUSE, in, 2, 2, 0), 1);
}

static int32_t node_out(const ir_graph *g, int32_t k) {
    assert_true(k >= 0);
    return g->nodes[k].out[0];
}

/* the kernel IR of softmax, lowered from a traced graph */
static void softmax_kernel_text(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(2, 3), KL_F32), *y;
    kl_fn *f = kl_compile(WL(softmax), NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    char buf[1024];
    assert_true(kl_fn_graph_text(f, buf, sizeof buf) > 0);
    assert_string_equal(buf, "graph(%0: f32[2,3]) {\n"
                             "  %1: f32[2,3] = kernel(%0, id=0)\n"
                             "  return (%1)\n"
                             "}\n");
    kl_fn_release(f);
    /* the kernel itself, from the graph the pipeline makes */
    ir_graph *g = ir_graph_new();
    int32_t in = ir_add_input(g, x);
    kl_tensor *like[1] = {kl_empty(KL_SHAPE(2, 1), KL_F32)};
    ke_attrs a = {0};
    a.i[0] = 1;
    a.nlist = 1;
    a.list[0] = 1;
    int32_t mx = node_out(g, ir_add_node(g, KE_OP_amax, 0, 1, &in, 1, like, &a, KL_DEVICE_CPU, KL_F32));
    kl_tensor *full[1] = {x};
    int32_t d = node_out(g, ir_add_node(g, KE_OP_sub, 0, 2, (int32_t[]){in, mx}, 1, full, NULL, KL_DEVICE_CPU, KL_F32));
    int32_t e = node_out(g, ir_add_node(g, KE_OP_exp, 0, 1, &d, 1, full, NULL, KL_DEVICE_CPU, KL_F32));
    int32_t s = node_out(g, ir_add_node(g, KE_OP_sum, 0, 1, &e, 1, like, &a, KL_DEVICE_CPU, KL_F32));
    int32_t o = node_out(g, ir_add_node(g, KE_OP_div, 0, 2, (int32_t[]){e, s}, 1, full, NULL, KL_DEVICE_CPU, KL_F32));
    assert_int_equal(ir_set_outputs(g, 1, &o), 0);
    g->fuse = 1;
    assert_int_equal(ir_pass_fuse(g), 1);
    assert_int_equal(ir_verify(g, "fuse"), 0);
    assert_int_equal(g->nkernels, 1);
    char *text = ir_kernel_to_string(g->kernels[0]);
    assert_string_equal(text, "kernel row [2,3] {\n"
                              "  in0: float32[2,3] index[3,1] contig\n"
                              "  out0: float32[2,3] index[3,1] contig\n"
                              "  v0: float32 = load in0\n"
                              "  v1: float32 row = reduce_amax(v0)\n"
                              "  v2: float32 = sub(v0, v1)\n"
                              "  v3: float32 = exp(v2)\n"
                              "  v4: float32 row = reduce_sum(v3)\n"
                              "  v5: float32 = div(v3, v4)\n"
                              "  store out0, v5\n"
                              "}\n");
    free(text);
    /* fusion lowers and stops; the trace layer compiles after the last pass */
    assert_null(g->kernels[0]->handle);
    int64_t compiles = ir_kernel_compiles();
    assert_int_equal(tr_compile_kernels(g, NULL), 0);
    assert_int_equal(ir_kernel_compiles(), compiles + 1);
    /* a copy of the graph shares the compiled kernel (nothing is compiled
     * again, even when asked) and runs the same after the original is gone */
    ir_graph *c = ir_graph_clone(g);
    assert_non_null(c);
    assert_int_equal(c->nkernels, 1);
    assert_ptr_equal(c->kernels[0], g->kernels[0]);
    assert_int_equal(tr_compile_kernels(c, NULL), 0);
    assert_int_equal(ir_kernel_compiles(), compiles + 1);
    /* a shared kernel keeps its backend */
    const ir_backend *other = c->kernels[0]->backend == &ir_interp_backend ? ir_backend_by_name("llvm") : &ir_interp_backend;
    if (other) {
        assert_int_equal(ir_kernel_compile(c->kernels[0], other), -1);
        KT_EXPECT_ERROR(KL_ERR_STATE, "a kernel shared by copies of a graph is already compiled by");
    }
    kl_clear_error();
    kl_tensor *x2 = kl_reshape(seq(6, 0.3, KL_F32), KL_SHAPE(2, 3)), *r1, *r2;
    assert_int_equal(tr_run_graph(g, &x2, &r1), 0);
    ir_graph_free(g);
    assert_int_equal(tr_run_graph(c, &x2, &r2), 0);
    ir_graph_free(c);
    assert_int_equal(kl_equal(r1, r2), 1);
    assert_int_equal(kl_allclose(r1, kl_softmax(x2, -1), 1e-6, 1e-6, true), 1);
}

/* The tracer records each op's compute dtype (what lowering converts to),
 * and the verifier insists on it where lowering reads it. */
static int mixed_dtypes(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sum(kl_exp(kl_add(in[0], in[1])), 1, (int64_t[]){-1}, true);
    return out[0] ? 0 : -1;
}

static void compute_dtype_recorded(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_to_dtype(seq(6, 1, KL_F32), KL_I32), kl_to_dtype(seq(6, 1, KL_F32), KL_F16)};
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(mixed_dtypes, NULL, in, 2, 1, &broke, why, sizeof why);
    assert_non_null(g);
    /* i32 + f16 is f16 computed in f32; exp the same; the sum of f16 in f32 */
    assert_int_equal(g->nnodes, 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(g->values[g->nodes[k].out[0]].dtype, KL_F16);
        assert_int_equal(g->nodes[k].compute, KL_F32);
    }
    assert_int_equal(ir_verify(g, "test"), 0);
    g->nodes[1].compute = -1;
    assert_int_equal(ir_verify(g, "test"), -1);
    KT_EXPECT_ERROR(KL_ERR_INTERNAL, "invalid graph after test: node 1 (exp) has no compute dtype");
    ir_graph_free(g);
}

static void interpreter_backend_interface(void **state) {
    (void)state;
    const ir_backend *b = &ir_interp_backend;
    assert_string_equal(b->name, "interp");
    /* y = x + x over [4], run directly through the interface */
    ir_kernel k = {.ninputs = 1, .noutputs = 1, .ndim = 1, .shape = {4}};
    ir_kbuf bufs[2] = {{.dtype = KL_F64, .ndim = 1, .shape = {4}, .stride = {1}, .index = {1}},
                       {.dtype = KL_F64, .ndim = 1, .output = 1, .shape = {4}, .stride = {1}, .index = {1}}};
    ir_kstmt st[3] = {{.kind = IR_K_LOAD, .dtype = KL_F64, .buf = 0},
                      {.kind = IR_K_OP, .dtype = KL_F64, .compute = KL_F64, .op = KE_OP_add, .nargs = 2, .args = {0, 0}},
                      {.kind = IR_K_STORE, .dtype = KL_F64, .buf = 1, .nargs = 1, .args = {1}}};
    k.bufs = bufs;
    k.stmts = st;
    k.nstmts = 3;
    void *h = b->compile(&k);
    assert_non_null(h);
    kl_tensor *x = seq(4, 0.5, KL_F64), *y = kl_empty(KL_SHAPE(4), KL_F64);
    assert_int_equal(b->run(h, &x, &y), 0);
    KT_VALUES(y, 0, -2, -1, 0, 1);
    b->free(h);
    /* what the interpreter cannot run is refused when compiled */
    st[1].op = KE_OP_matmul;
    assert_null(b->compile(&k));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "interpreter: kl_matmul in float64 is not an elementwise loop");
}

/* A stand-in for a second device's code generator: counts what it is given. */
static int fake_compiles;
static void *fake_compile(const ir_kernel *k) {
    (void)k;
    fake_compiles++;
    return &fake_compiles;
}
static int fake_run(void *h, kl_tensor *const *in, kl_tensor *const *out) {
    (void)h, (void)in, (void)out;
    return 0;
}
static void fake_free(void *h) { (void)h; }

/* Backends are found by name and by device in one registry the IR layer
 * knows nothing else about; a kernel goes to its device's backend. */
static void backend_registry(void **state) {
    (void)state;
    kl_init();
    assert_ptr_equal(ir_backend_by_name("interp"), &ir_interp_backend);
    const ir_backend *cpu = ir_backend_for_device(KL_CPU);
    assert_non_null(cpu);
    assert_true(cpu->priority >= ir_interp_backend.priority);
    assert_null(ir_backend_by_name("nope"));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown or unavailable backend \"nope\" (registered: interp");
    /* CUDA's default is the NVRTC code generator (src/codegen_nvrtc) */
    assert_ptr_equal(ir_backend_for_device(KL_CUDA), ir_backend_by_name("nvrtc"));
    /* the same backend twice is a no-op; another one under a taken name is refused */
    assert_int_equal(ir_backend_register(&ir_interp_backend), 0);
    static const ir_backend impostor = {.name = "interp", .device = KL_CPU, .compile = fake_compile, .run = fake_run,
                                        .free = fake_free};
    assert_int_equal(ir_backend_register(&impostor), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "a backend called \"interp\" is already registered");
    assert_int_equal(ir_backend_register(&(ir_backend){.name = "half"}), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "a backend needs a name, compile, run and free");
    /* a second device plugs in by registering; its kernels go to it */
    static const ir_backend fake_cuda = {.name = "fake_cuda", .device = KL_CUDA, .priority = 1000,
                                         .compile = fake_compile, .run = fake_run, .free = fake_free};
    assert_int_equal(ir_backend_register(&fake_cuda), 0);
    assert_ptr_equal(ir_backend_for_device(KL_CUDA), &fake_cuda);
    kl_tensor *x = kl_ones(KL_SHAPE(2, 3), KL_F32);
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(WL(softmax), NULL, &x, 1, 1, &broke, why, sizeof why);
    assert_non_null(g);
    g->fuse = 1;
    assert_int_equal(ir_optimize(g), 0);
    assert_int_equal(g->nkernels, 1);
    g->kernels[0]->device = (kl_device){KL_CUDA, 0};
    assert_int_equal(tr_compile_kernels(g, &ir_interp_backend), 0);
    assert_int_equal(fake_compiles, 1);
    assert_ptr_equal(g->kernels[0]->backend, &fake_cuda);
    ir_graph_free(g);
    /* kl_compile picks CPU backends by name: not another device's, not an unknown one */
    kl_compile_options o = kl_compile_options_default();
    o.backend = "fake_cuda";
    assert_null(kl_compile(WL(softmax), NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "backend \"fake_cuda\" does not run CPU kernels");
    setenv("KL_CPU_BACKEND", "nope", 1);
    assert_null(kl_compile(WL(softmax), NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown or unavailable backend \"nope\"");
    setenv("KL_CPU_BACKEND", "interp", 1);
    kl_fn *f = kl_compile(WL(softmax), NULL, NULL);
    unsetenv("KL_CPU_BACKEND");
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    assert_int_equal(kl_allclose(y, kl_softmax(x, -1), 1e-6, 1e-6, true), 1);
    kl_fn_release(f);
}

static void debug_dir_gets_the_kernels(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("dbg");
    setenv("KL_DEBUG_DIR", dir, 1);
    kl_tensor *in[2] = {seq(4, 1, KL_F32), seq(4, 2, KL_F32)};
    run_and_compare(chain, KL_COMPILE_FUSE, in, 2, 1, 0);
    unsetenv("KL_DEBUG_DIR");
    DIR *d = opendir(dir);
    assert_non_null(d);
    int kernels = 0;
    struct dirent *e;
    char path[700];
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!strncmp(e->d_name, "kernels", 7)) {
            FILE *f = fopen(path, "r");
            char line[128] = "";
            assert_non_null(fgets(line, sizeof line, f));
            assert_string_equal(line, "# kernel 0\n");
            fclose(f);
            kernels++;
        }
        if (e->d_name[0] != '.') unlink(path);
    }
    closedir(d);
    rmdir(dir);
    assert_int_equal(kernels, 1);
}

/* a sum of n inputs */
static int many_inputs(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_out;
    kl_tensor *acc = in[0];
    for (int i = 1; i < n_in; i++) acc = kl_add(acc, in[i]);
    out[0] = acc;
    return acc ? 0 : -1;
}

/* more inputs than one kernel takes (IR_KERNEL_MAX_IN = 12): the group is
 * split along the chain, the partial sum materialized between the kernels */
static void groups_over_max_inputs_are_split(void **state) {
    (void)state;
    kl_tensor *in[20];
    for (int i = 0; i < 20; i++) in[i] = kl_reshape(seq(15, 0.1 * (i + 1), KL_F32), KL_SHAPE(3, 5));
    assert_int_equal(run_and_compare(many_inputs, KL_COMPILE_FUSE, in, 12, 1, 0), 1);
    assert_int_equal(run_and_compare(many_inputs, KL_COMPILE_FUSE, in, 14, 1, 0), 2);
    assert_int_equal(run_and_compare(many_inputs, KL_COMPILE_FUSE, in, 20, 1, 0), 2);
    kl_fn *f = kl_compile(many_inputs, NULL, mode(KL_COMPILE_FUSE));
    kl_tensor *y;
    assert_int_equal(kl_fn_call(f, in, 20, &y, 1), 0);
    /* in0..in11 (11 adds), then the partial sum and in12..in19 (8 adds) */
    assert_int_equal(count_in_graph(f, "= kernel("), 2);
    kl_fn_release(f);
    /* a broadcast input among them: still bitwise equal */
    in[7] = seq(5, 0.3, KL_F32);
    assert_int_equal(run_and_compare(many_inputs, KL_COMPILE_FUSE, in, 20, 1, 0), 2);
}

/* ---- cross_entropy ------------------------------------------------------------------ */

typedef struct ce_args {
    kl_reduction red;
    double ls;
} ce_args;

static int ce_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const ce_args *a = u;
    out[0] = kl_cross_entropy(in[0], in[1], a->red, a->ls);
    return out[0] ? 0 : -1;
}

/* Compiles cross_entropy(red, ls) in FUSE mode, compares with eager (the
 * CPU kernel) within tol and returns the launches. */
static int64_t ce_compare(kl_tensor *x, kl_tensor *t, kl_reduction red, double ls, double tol) {
    ce_args a = {red, ls};
    kl_tensor *in[2] = {x, t}, *ref = NULL, *got = NULL;
    assert_int_equal(ce_fn(&a, in, 2, &ref, 1), 0);
    kl_fn *f = kl_compile(ce_fn, &a, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, in, 2, &got, 1), 0);
    assert_int_equal(got->ndim, ref->ndim);
    assert_memory_equal(got->shape, ref->shape, sizeof(int64_t) * ref->ndim);
    assert_int_equal(kl_allclose(kl_to_dtype(got, KL_F64), kl_to_dtype(ref, KL_F64), tol, tol, true), 1);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    kl_fn_release(f);
    return st.kernels;
}

static kl_tensor *targets(int n, int64_t classes, int ignored_every) {
    kl_tensor *t = kl_empty(KL_SHAPE(n), KL_I64);
    int64_t *p = kl_data_ptr(t);
    for (int i = 0; i < n; i++) p[i] = ignored_every && i % ignored_every == 1 ? -100 : (i * 7 + 3) % classes;
    return t;
}

static void cross_entropy_is_two_kernels(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(kl_sin(seq(8 * 10, 0.37, KL_F32)), KL_SHAPE(8, 10));
    kl_tensor *xd = kl_to_dtype(x, KL_F64);
    kl_tensor *t = targets(8, 10, 0), *ti = targets(8, 10, 3);
    /* mean: the row kernel (log-sum-exp and the picked logit) and the mean */
    assert_int_equal(ce_compare(x, t, KL_REDUCE_MEAN, 0, 1e-5), 2);
    assert_int_equal(ce_compare(xd, t, KL_REDUCE_MEAN, 0, 1e-12), 2);
    /* ignored rows leave the mean's denominator */
    assert_int_equal(ce_compare(x, ti, KL_REDUCE_MEAN, 0, 1e-5), 2);
    assert_int_equal(ce_compare(xd, ti, KL_REDUCE_MEAN, 0, 1e-12), 2);
    /* label smoothing: the same two kernels */
    assert_int_equal(ce_compare(x, ti, KL_REDUCE_MEAN, 0.1, 1e-5), 2);
    assert_int_equal(ce_compare(xd, ti, KL_REDUCE_MEAN, 0.25, 1e-12), 2);
    /* sum: two; none: the row kernel alone */
    assert_int_equal(ce_compare(x, ti, KL_REDUCE_SUM, 0, 1e-5), 2);
    assert_int_equal(ce_compare(xd, ti, KL_REDUCE_SUM, 0.1, 1e-12), 2);
    assert_int_equal(ce_compare(x, ti, KL_REDUCE_NONE, 0, 1e-5), 1);
    assert_int_equal(ce_compare(xd, ti, KL_REDUCE_NONE, 0.3, 1e-12), 1);
    /* every row ignored: 0/0, NaN as in PyTorch (and eager) */
    kl_tensor *all = kl_full(KL_SHAPE(8), -100, KL_I64);
    assert_int_equal(ce_compare(x, all, KL_REDUCE_MEAN, 0, 1e-5), 2);
    assert_int_equal(isnan(kl_item(kl_cross_entropy(x, all, KL_REDUCE_MEAN, 0))), 1);
    assert_int_equal(ce_compare(x, all, KL_REDUCE_SUM, 0.1, 1e-5), 2);
    /* 1000 classes: arange(1000) folds into a constant */
    kl_tensor *xl = kl_reshape(kl_sin(seq(4 * 1000, 0.013, KL_F32)), KL_SHAPE(4, 1000));
    assert_int_equal(ce_compare(xl, targets(4, 1000, 0), KL_REDUCE_MEAN, 0, 1e-5), 2);
    /* a vocabulary: 32000 classes */
    kl_tensor *xv = kl_reshape(kl_sin(seq(3 * 32000, 0.0013, KL_F32)), KL_SHAPE(3, 32000));
    assert_int_equal(ce_compare(xv, targets(3, 32000, 2), KL_REDUCE_MEAN, 0.1, 1e-5), 2);
    /* strided logits, [N, C, d] and unbatched [C] inputs */
    kl_tensor *xt = kl_transpose(kl_reshape(kl_sin(seq(80, 0.29, KL_F32)), KL_SHAPE(10, 8)), 0, 1);
    assert_int_equal(ce_compare(xt, ti, KL_REDUCE_MEAN, 0, 1e-5), 2);
    kl_tensor *x3 = kl_reshape(kl_sin(seq(2 * 5 * 3, 0.41, KL_F64)), KL_SHAPE(2, 5, 3));
    kl_tensor *t3 = kl_reshape(targets(6, 5, 4), KL_SHAPE(2, 3));
    ce_compare(x3, t3, KL_REDUCE_MEAN, 0.1, 1e-12);
    ce_compare(x3, t3, KL_REDUCE_NONE, 0, 1e-12);
    ce_compare(kl_sin(seq(7, 0.5, KL_F64)), kl_full(0, NULL, 4, KL_I64), KL_REDUCE_MEAN, 0.2, 1e-12);
    /* no rows: the mean of nothing is NaN */
    assert_int_equal(ce_compare(kl_zeros(KL_SHAPE(0, 4), KL_F32), kl_zeros(KL_SHAPE(0), KL_I64), KL_REDUCE_MEAN, 0, 1e-5), 2);
}

/* a class index out of range: eager's kernel fails naming it; a fused kernel
 * cannot fail, so the row's loss is NaN (never a plausible number) */
static void cross_entropy_bad_target_is_nan(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(kl_sin(seq(12, 0.37, KL_F32)), KL_SHAPE(3, 4)), *y;
    kl_tensor *t = targets(3, 4, 0);
    ((int64_t *)kl_data_ptr(t))[1] = 4;
    assert_null(kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_cross_entropy: target 4 is out of bounds for 4 classes (element 1)");
    ce_args a = {KL_REDUCE_NONE, 0};
    kl_fn *f = kl_compile(ce_fn, &a, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, t}, 2, &y, 1), 0);
    const float *p = kl_data_ptr(y);
    assert_false(isnan(p[0]));
    assert_true(isnan(p[1]));
    assert_false(isnan(p[2]));
    kl_fn_release(f);
}

/* with logits requiring grad the forward and backward are compiled (aot.c):
 * the composite's own derivative is traced into the backward graph and
 * fused; loss and gradients within f32 rounding of eager's (the fused row
 * kernels sum in another order) */
static void cross_entropy_gradients_unchanged(void **state) {
    (void)state;
    kl_tensor *x0 = kl_reshape(kl_sin(seq(8 * 6, 0.37, KL_F32)), KL_SHAPE(8, 6)), *t = targets(8, 6, 3);
    kl_tensor *xa = kl_clone(x0), *xb = kl_clone(x0), *ya, *yb;
    kl_set_requires_grad(xa, true);
    kl_set_requires_grad(xb, true);
    ce_args a = {KL_REDUCE_MEAN, 0.1};
    kl_fn *f = kl_compile(ce_fn, &a, mode(KL_COMPILE_FUSE));
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){xa, t}, 2, &ya, 1), 0);
    assert_int_equal(ce_fn(&a, (kl_tensor *[]){xb, t}, 2, &yb, 1), 0);
    assert_int_equal(kl_allclose(ya, yb, 1e-5, 1e-6, false), 1);
    assert_int_equal(kl_backward(ya, NULL, NULL), 0);
    assert_int_equal(kl_backward(yb, NULL, NULL), 0);
    assert_int_equal(kl_allclose(kl_grad(xa), kl_grad(xb), 1e-5, 1e-6, false), 1);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.aot_calls, 1);
    assert_int_equal(st.opbyop_grad_calls, 0);
    kl_fn_release(f);
}

/* y feeds a column sum (not fusible) before its other consumers: the
 * kernel writing y must run before the sum reads it */
static int read_between(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *y = kl_exp(kl_mul_scalar(in[0], 0.5));
    kl_tensor *s = kl_sum(y, KL_DIMS(0), true);
    out[0] = kl_mul(kl_add_scalar(kl_neg(y), 1), s);
    out[1] = kl_sub(kl_tanh(y), in[0]);
    return out[0] ? 0 : -1;
}

static void values_read_between_members_are_written_first(void **state) {
    (void)state;
    kl_tensor *in[1] = {kl_reshape(seq(12, 0.3, KL_F32), KL_SHAPE(4, 3))};
    int64_t n = run_and_compare(read_between, KL_COMPILE_FUSE, in, 1, 2, 0);
    assert_true(n >= 3 && n <= 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(chain_is_one_kernel),
        KT_TEST(chain_broadcast_strided_dtypes),
        KT_TEST(gelu_is_one_kernel),
        KT_TEST(nodes_join_the_groups_they_can),
        KT_TEST(row_kernels),
        KT_TEST(mlp_is_two_matmuls_and_two_kernels),
        KT_TEST(adamw_is_one_kernel),
        KT_TEST(mixed_dtypes_are_bitwise_equal),
        KT_TEST(one_kernel_many_outputs),
        KT_TEST(pow_shortcuts_match_eager),
        KT_TEST(integer_division_by_zero_is_an_error),
        KT_TEST(inputs_requiring_grad_fuse_forward_and_backward),
        KT_TEST(row_kernel_edges),
        KT_TEST(empty_rows_still_write_row_values),
        KT_TEST(softmax_kernel_text),
        KT_TEST(compute_dtype_recorded),
        KT_TEST(interpreter_backend_interface),
        KT_TEST(backend_registry),
        KT_TEST(debug_dir_gets_the_kernels),
        KT_TEST(groups_over_max_inputs_are_split),
        KT_TEST(cross_entropy_is_two_kernels),
        KT_TEST(cross_entropy_bad_target_is_nan),
        KT_TEST(cross_entropy_gradients_unchanged),
        KT_TEST(values_read_between_members_are_written_first),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
