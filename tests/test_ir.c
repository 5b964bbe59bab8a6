/*
 * test_ir.c — the graph passes, each alone on a traced graph (golden IR text
 * after the pass), and compiled (NO_FUSE) against eager: bitwise, since
 * every rewrite of cse, fold, simplify, pool_mask and functionalize is exact and the
 * same kernels run. Decomposition (FUSE graphs only) is compared with a
 * tolerance: its primitives round differently from the fused CPU kernels.
 */
#include "harness.h"

#include "ir.h"
#include "trace.h"

#include <math.h>
#include <stdlib.h>

typedef int (*pass_fn)(ir_graph *g);

static char golden[4096];

/* Traces fn on in, runs pass once (expecting `changes`), verifies, and
 * leaves the text in golden. */
static const char *after_pass(kl_traceable fn, kl_tensor **in, int n_in, int n_out, pass_fn pass, int changes) {
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(fn, NULL, in, n_in, n_out, &broke, why, sizeof why);
    assert_non_null(g);
    assert_int_equal(pass(g), changes);
    assert_int_equal(ir_verify(g, "test"), 0);
    char *s = ir_to_string(g);
    assert_non_null(s);
    snprintf(golden, sizeof golden, "%s", s);
    free(s);
    ir_graph_free(g);
    return golden;
}

/* Equal element by element, NaN matching NaN and -0 only -0. */
static int bitwise_equal(kl_tensor *a, kl_tensor *b) {
    if (kl_dtype_of(a) != kl_dtype_of(b) || kl_ndim(a) != kl_ndim(b) ||
        memcmp(kl_shape(a), kl_shape(b), sizeof(int64_t) * (size_t)kl_ndim(a)))
        return 0;
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double x = kt_get(a, i), y = kt_get(b, i);
        if (isnan(x) ? !isnan(y) : x != y || signbit(x) != signbit(y)) return 0;
    }
    return 1;
}

/* fn compiled (NO_FUSE) against fn run eagerly, each on its own copies of
 * the inputs: outputs and the inputs' final values agree bitwise. Returns
 * the compiled graph's launch count. */
static int64_t same_as_eager(kl_traceable fn, kl_tensor **in, int n_in, int n_out) {
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(fn, NULL, &o);
    kl_tensor *ci[8], *ei[8], *co[8], *eo[8];
    for (int call = 0; call < 2; call++) {
        for (int i = 0; i < n_in; i++) {
            ci[i] = kl_clone(in[i]);
            ei[i] = kl_clone(in[i]);
        }
        kl_manual_seed(7 + call);
        assert_int_equal(kl_fn_call(f, ci, n_in, co, n_out), 0);
        kl_manual_seed(7 + call);
        assert_int_equal(fn(NULL, ei, n_in, eo, n_out), 0);
        for (int j = 0; j < n_out; j++) {
            assert_true(bitwise_equal(co[j], eo[j]));
            for (int i = 0; i < n_in; i++) /* an input returned is still the caller's tensor */
                assert_int_equal(co[j] == ci[i], eo[j] == ei[i]);
        }
        for (int i = 0; i < n_in; i++) assert_true(bitwise_equal(ci[i], ei[i]));
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    kl_fn_release(f);
    return st.kernels;
}

static kl_tensor *seq(int64_t n, double scale) {
    return kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F32), (double)n / 2), scale);
}

/* ---- pool_mask ----------------------------------------------------------------------- */

/* in = {x [1,1,H,W], g (the pooled shape)}; out = {max_pool2d(relu(x)), its gradient for
 * g}. u: the pool's options (NULL: 2x2). */
static int pool_relu_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    kl_pool2d_options o = u ? *(const kl_pool2d_options *)u : kl_pool2d_options_default(2);
    kl_tensor *x = kl_detach(in[0]);
    if (!x || kl_set_requires_grad(x, true) < 0) return -1;
    out[0] = kl_max_pool2d(kl_relu(x), &o);
    if (!out[0] || kl_autograd_grad(1, &out[0], &in[1], 1, &x, &out[1], NULL) < 0) return -1;
    out[0] = kl_detach(out[0]);
    return out[0] ? 0 : -1;
}

/* relu's mask moves onto the pooled gradient, bit for bit: ties, an
 * all-negative window, -0 against -1 (relu then pool gives +0), NaN, and a
 * -0 gradient; overlapping windows with padding too. */
static void pool_mask_moves_relus_mask(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_from_data((const float[]){1, 1, -1, -2, 0, 1, -3, -0.0f, 2, NAN, -0.0f, -1, 2, 0.5f, -1, 5},
                                     KL_SHAPE(1, 1, 4, 4), KL_F32),
                        kl_from_data((const float[]){3, -0.0f, 2, -4}, KL_SHAPE(1, 1, 2, 2), KL_F32)};
    assert_string_equal(after_pass(pool_relu_fn, in, 2, 2, ir_pass_pool_mask, 1),
        "graph(%0: f32[1,1,4,4], %1: f32[1,1,2,2]) {\n"
        "  %2: f32[1,1,4,4] = alias(%0)\n"
        "  %3: f32[1,1,4,4] = relu(%2)\n"
        "  %4: f32[1,1,2,2] = max_pool2d(%3, kernel_size=[2,2], stride=[2,2], padding=[0,0], dilation=[1,1])\n"
        "  %5: f32[1,1,2,2] = threshold_backward(%1, %4)\n"
        "  %6: f32[1,1,4,4] = max_pool2d_backward(%5, %3, kernel_size=[2,2], stride=[2,2], padding=[0,0], "
        "dilation=[1,1])\n"
        "  %7: f32[1,1,4,4] = alias(%6)\n"
        "  %8: f32[1,1,2,2] = alias(%4)\n"
        "  return (%8, %7)\n"
        "}\n");
    same_as_eager(pool_relu_fn, in, 2, 2);
    kl_pool2d_options o = kl_pool2d_options_default(3);
    o.stride[0] = o.stride[1] = 1, o.padding[0] = o.padding[1] = 1;
    kl_tensor *in3[2] = {in[0], kl_randn(KL_SHAPE(1, 1, 4, 4), KL_F32)};
    kl_compile_options co = kl_compile_options_default();
    co.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(pool_relu_fn, &o, &co);
    kl_tensor *c[2], *e[2];
    assert_int_equal(kl_fn_call(f, in3, 2, c, 2), 0);
    assert_int_equal(pool_relu_fn(&o, in3, 2, e, 2), 0);
    for (int j = 0; j < 2; j++) assert_true(bitwise_equal(c[j], e[j]));
    kl_fn_release(f);
}

/* ---- cse ----------------------------------------------------------------------------- */

static int cse_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *a = kl_add(kl_exp(x), kl_exp(x));                                     /* merged */
    kl_tensor *b = kl_sub(kl_sum(x, KL_DIMS(0), true), kl_sum(x, KL_DIMS(1), true)); /* attrs differ */
    kl_tensor *c = kl_add(kl_full(KL_SHAPE(3), 0.0, KL_F32), kl_full(KL_SHAPE(3), -0.0, KL_F32)); /* -0 != 0 */
    kl_tensor *r = kl_add(kl_rand(KL_SHAPE(3), KL_F32), kl_rand(KL_SHAPE(3), KL_F32)); /* two draws */
    kl_tensor *s = kl_add(kl_mul_scalar(x, 2), kl_mul_scalar(x, 2)); /* the scalars, then the muls */
    out[0] = kl_add(kl_add(kl_add(kl_add(a, b), c), r), s);
    return out[0] ? 0 : -1;
}

/* a write between two equal reads: they differ */
static int cse_write_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *a = kl_exp(in[0]);
    kl_add_scalar_inplace(in[0], 1);
    out[0] = kl_sub(kl_exp(in[0]), a);
    out[1] = kl_exp(in[1]); /* an output keeps its own tensor */
    out[2] = kl_exp(in[1]);
    return out[0] ? 0 : -1;
}

static void cse_merges_only_equal_pure_nodes(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(seq(6, 0.5), KL_SHAPE(2, 3));
    kl_manual_seed(1);
    assert_string_equal(after_pass(cse_fn, &x, 1, 1, ir_pass_cse, 3),
        "graph(%0: f32[2,3]) {\n"
        "  %1: f32[2,3] = exp(%0)\n"
        "  %2: f32[2,3] = add(%1, %1)\n"
        "  %3: f32[2,1] = sum(%0, dims=[1], keepdim=true)\n"
        "  %4: f32[1,3] = sum(%0, dims=[0], keepdim=true)\n"
        "  %5: f32[2,3] = sub(%4, %3)\n"
        "  %6: f32[3] = full(shape=[3], value=-0, dtype=f32)\n"
        "  %7: f32[3] = full(shape=[3], value=0, dtype=f32)\n"
        "  %8: f32[3] = add(%7, %6)\n"
        "  %9: f32[3] = rand(shape=[3], slot=0, dtype=f32)\n"
        "  %10: f32[3] = rand(shape=[3], slot=1, dtype=f32)\n"
        "  %11: f32[3] = add(%10, %9)\n"
        "  %12: i64[]{wrapped} = scalar(value=2)\n"
        "  %13: f32[2,3] = mul(%0, %12)\n"
        "  %14: f32[2,3] = add(%13, %13)\n"
        "  %15: f32[2,3] = add(%2, %5)\n"
        "  %16: f32[2,3] = add(%15, %8)\n"
        "  %17: f32[2,3] = add(%16, %11)\n"
        "  %18: f32[2,3] = add(%17, %14)\n"
        "  return (%18)\n"
        "}\n");
    same_as_eager(cse_fn, &x, 1, 1);
    kl_tensor *in[2] = {seq(3, 1), seq(3, 2)};
    /* the in-place add keeps both exps; functionalized (as in the pipeline),
     * the second exp reads a new value and still differs */
    assert_string_equal(after_pass(cse_write_fn, in, 2, 3, ir_pass_cse, 0),
        "graph(%0: f32[3], %1: f32[3]) {\n"
        "  %2: f32[3] = exp(%0)\n"
        "  %3: i64[]{wrapped} = scalar(value=1)\n"
        "  %4: f32[3] = add_(%0, %3)\n"
        "  %5: f32[3] = exp(%4)\n"
        "  %6: f32[3] = sub(%5, %2)\n"
        "  %7: f32[3] = exp(%1)\n"
        "  %8: f32[3] = exp(%1)\n"
        "  return (%6, %7, %8)\n"
        "}\n");
    same_as_eager(cse_write_fn, in, 2, 3);
}

/* ---- fold ---------------------------------------------------------------------------- */

static int fold_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *c = kl_mul(kl_full(KL_SHAPE(3), 2, KL_F32), kl_arange(0, 3, 1, KL_F32)); /* a tensor constant */
    kl_tensor *s = kl_mul_scalar(kl_scalar_tensor(1.5, KL_F64), 2);                    /* a 0-dim one: 3 */
    kl_tensor *w = kl_full(KL_SHAPE(3), 1, KL_F32);
    kl_add_inplace(w, x);                                                  /* written: stays */
    kl_tensor *r = kl_mul(kl_rand(KL_SHAPE(3), KL_F32), kl_scalar_tensor(2, KL_F32)); /* random: stays */
    out[0] = kl_add(kl_add(kl_mul(kl_add(x, c), s), w), r);
    out[1] = kl_arange(0, 3, 1, KL_I64); /* the caller gets it: stays (it could write into it) */
    out[2] = kl_add(kl_div_scalar(kl_eye(3, 3, KL_F32), 0), in[0]); /* inf and nan, as eager computes them */
    return out[0] ? 0 : -1;
}

static void fold_computes_constants_once(void **state) {
    (void)state;
    kl_tensor *x = seq(3, 1);
    kl_manual_seed(1);
    assert_string_equal(after_pass(fold_fn, &x, 1, 3, ir_pass_fold, 8),
        "graph(%0: f32[3]) {\n"
        "  %1: f32[3] = captured(index=0, constant=true)\n"
        "  %2: f32[3] = captured(index=1, constant=true)\n"
        "  %3: f32[3] = captured(index=2, constant=true)\n"
        "  %4: f64[] = scalar(value=1.5)\n"
        "  %5: i64[]{wrapped} = scalar(value=2)\n"
        "  %6: f64[] = scalar(value=3)\n"
        "  %7: f32[3] = full(shape=[3], value=1, dtype=f32)\n"
        "  %8: f32[3] = add_(%7, %0)\n"
        "  %9: f32[] = scalar(value=2)\n"
        "  %10: f32[3] = rand(shape=[3], slot=0, dtype=f32)\n"
        "  %11: f32[3] = mul(%10, %9)\n"
        "  %12: f32[3] = add(%0, %3)\n"
        "  %13: f32[3] = mul(%12, %6)\n"
        "  %14: f32[3] = add(%13, %8)\n"
        "  %15: f32[3] = add(%14, %11)\n"
        "  %16: i64[3] = arange(start=0, end=3, dtype=i64)\n"
        "  %17: f32[3,3] = captured(index=3, constant=true)\n"
        "  %18: i64[]{wrapped} = scalar(value=0)\n"
        "  %19: f32[3,3] = captured(index=4, constant=true)\n"
        "  %20: f32[3,3] = add(%19, %0)\n"
        "  return (%15, %16, %20)\n"
        "}\n");
    same_as_eager(fold_fn, &x, 1, 3);
}

/* ---- simplify ------------------------------------------------------------------------ */

static int simplify_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0], *i = in[1];
    kl_tensor *a = kl_sub_scalar(kl_div_scalar(kl_mul_scalar(x, 1), 1), 0); /* x */
    kl_tensor *b = kl_neg(kl_neg(a));                                       /* x */
    kl_tensor *t = kl_transpose(kl_transpose(b, 0, 1), 1, 0);               /* x */
    kl_tensor *q = kl_squeeze(kl_unsqueeze(t, 0), 0);                       /* x */
    kl_tensor *v = kl_view(kl_view(q, KL_SHAPE(3, 2)), KL_SHAPE(1, 6));     /* view(x) */
    kl_tensor *e = kl_expand(kl_expand(v, KL_SHAPE(4, 6)), KL_SHAPE(2, 4, 6)); /* expand(view(x)) */
    kl_tensor *keep = kl_add(kl_add_scalar(x, 0), kl_mul_scalar(x, 0));    /* -0 + 0, nan * 0: kept */
    out[0] = kl_add(e, kl_view(kl_add(q, keep), KL_SHAPE(6)));
    out[1] = kl_add(kl_add_scalar(i, 0), kl_mul(i, kl_scalar_tensor(1, KL_F32))); /* i32 + 0 goes; * 1.0f promotes */
    out[2] = kl_neg(kl_neg(x));                                   /* an output: the outer neg stays */
    return out[0] ? 0 : -1;
}

static void simplify_removes_identities(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(6, 0.5), KL_SHAPE(2, 3)), kl_to_dtype(seq(3, 1), KL_I32)};
    assert_string_equal(after_pass(simplify_fn, in, 2, 3, ir_pass_simplify, 9),
        "graph(%0: f32[2,3], %1: i32[3]) {\n"
        "  %2: i64[]{wrapped} = scalar(value=1)\n"
        "  %3: i64[]{wrapped} = scalar(value=1)\n"
        "  %4: i64[]{wrapped} = scalar(value=0)\n"
        "  %5: f32[2,3] = neg(%0)\n"
        "  %6: f32[3,2]{strides=1,3} = transpose(%0, dim0=0, dim1=1)\n"
        "  %7: f32[1,2,3] = unsqueeze(%0, dim=0)\n"
        "  %8: f32[3,2] = view(%0, shape=[3,2])\n"
        "  %9: f32[1,6] = view(%0, shape=[1,6])\n"
        "  %10: f32[4,6]{strides=0,1} = expand(%9, shape=[4,6])\n"
        "  %11: f32[2,4,6]{strides=0,0,1} = expand(%9, shape=[2,4,6])\n"
        "  %12: i64[]{wrapped} = scalar(value=0)\n"
        "  %13: f32[2,3] = mul(%0, %12)\n"
        "  %14: i64[]{wrapped} = scalar(value=0)\n"
        "  %15: f32[2,3] = add(%0, %14)\n"
        "  %16: f32[2,3] = add(%15, %13)\n"
        "  %17: f32[2,3] = add(%0, %16)\n"
        "  %18: f32[6] = view(%17, shape=[6])\n"
        "  %19: f32[2,4,6] = add(%11, %18)\n"
        "  %20: f32[] = full(shape=[], value=1, dtype=f32)\n"
        "  %21: f32[3] = mul(%1, %20)\n"
        "  %22: i64[]{wrapped} = scalar(value=0)\n"
        "  %23: f32[3] = add(%1, %21)\n"
        "  %24: f32[2,3] = neg(%0)\n"
        "  %25: f32[2,3] = neg(%24)\n"
        "  return (%19, %23, %25)\n"
        "}\n");
    same_as_eager(simplify_fn, in, 2, 3);
    /* -0, nan and inf flow through exactly */
    kl_tensor *odd[2] = {kl_reshape(kl_div(seq(6, 1), kl_full(KL_SHAPE(6), -0.0, KL_F32)), KL_SHAPE(2, 3)),
                         kl_to_dtype(seq(3, 1), KL_I32)};
    same_as_eager(simplify_fn, odd, 2, 3);
}

/* ---- functionalize ------------------------------------------------------------------- */

/* momentum SGD on its inputs: m = 0.9 m + g; p -= 0.1 m */
static int sgd_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = in[0], *g = in[1], *m = in[2];
    kl_add_inplace(kl_mul_scalar_inplace(m, 0.9), g);
    kl_sub_inplace(p, kl_mul_scalar(m, 0.1));
    kl_tensor *t = kl_mul_scalar(g, 2);
    kl_exp_inplace(t); /* an intermediate: pure, no write-back */
    out[0] = p;
    out[1] = t;
    return 0;
}

/* writes that stay in place */
static int kept_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_add_scalar_inplace(kl_slice(in[0], 0, 0, 2, 1), 1); /* through a view */
    kl_add_inplace(in[1], in[2]);                          /* f32 += f64: computes in f64 */
    kl_fill_inplace(in[2], 3);                             /* copy_ */
    out[0] = kl_mul(in[0], in[1]);
    return 0;
}

static void functionalize_makes_writes_pure(void **state) {
    (void)state;
    kl_tensor *in[3] = {seq(4, 1), seq(4, 0.5), seq(4, 0.25)};
    assert_string_equal(after_pass(sgd_fn, in, 3, 2, ir_pass_functionalize, 4),
        "graph(%0: f32[4], %1: f32[4], %2: f32[4]) {\n"
        "  %3: f64[]{wrapped} = scalar(value=0.9)\n"
        "  %4: f32[4] = mul(%2, %3)\n"
        "  %5: f32[4] = add(%4, %1)\n"
        "  %6: f64[]{wrapped} = scalar(value=0.1)\n"
        "  %7: f32[4] = mul(%5, %6)\n"
        "  %8: f32[4] = sub(%0, %7)\n"
        "  %9: i64[]{wrapped} = scalar(value=2)\n"
        "  %10: f32[4] = mul(%1, %9)\n"
        "  %11: f32[4] = exp(%10)\n"
        "  copy_back(%0, %8)\n"
        "  copy_back(%2, %5)\n"
        "  return (%0, %11)\n"
        "}\n");
    same_as_eager(sgd_fn, in, 3, 2);
    kl_tensor *k[3] = {seq(4, 1), seq(4, 0.5), kl_to_dtype(seq(4, 0.3), KL_F64)};
    assert_string_equal(after_pass(kept_fn, k, 3, 1, ir_pass_functionalize, 0),
        "graph(%0: f32[4], %1: f32[4], %2: f64[4]) {\n"
        "  %3: f32[2] = slice(%0, dim=0, start=0, end=2)\n"
        "  %4: i64[]{wrapped} = scalar(value=1)\n"
        "  %5: f32[2] = add_(%3, %4)\n"
        "  %6: f32[4] = add_(%1, %2)\n"
        "  %7: f64[]{wrapped} = scalar(value=3)\n"
        "  %8: f64[4] = copy_(%2, %7)\n"
        "  %9: f32[4] = mul(%0, %6)\n"
        "  return (%9)\n"
        "}\n");
    same_as_eager(kept_fn, k, 3, 1);
}

static void functionalize_guards_input_aliasing(void **state) {
    (void)state;
    /* functionalized, the graph reads m and p as separate storages: passing
     * one tensor as both is a new signature, traced with the sharing */
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(sgd_fn, NULL, &o);
    kl_tensor *p = kl_clone(seq(4, 1)), *g = seq(4, 0.5), *m = kl_clone(seq(4, 0.25)), *out[2];
    kl_tensor *in[3] = {p, g, m};
    assert_int_equal(kl_fn_call(f, in, 3, out, 2), 0);
    kl_tensor *ref = kl_clone(p), *eo[2];
    kl_tensor *shared[3] = {p, g, p}, *eshared[3] = {ref, g, ref};
    assert_int_equal(kl_fn_call(f, shared, 3, out, 2), 0);
    assert_int_equal(sgd_fn(NULL, eshared, 3, eo, 2), 0);
    assert_true(bitwise_equal(p, ref));
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_string_equal(st.last_reason, "input 3 now shares storage with input 1");
    kl_fn_release(f);
}

/* a write through a view of an intermediate, read back through the base */
static int view_write_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *t = kl_exp(in[0]);
    kl_add_scalar_inplace(kl_slice(t, 0, 0, 2, 1), 1);
    out[0] = kl_mul_scalar(t, 2);
    return 0;
}

static void dce_keeps_writes_seen_through_views(void **state) {
    (void)state;
    kl_tensor *x = seq(4, 1);
    assert_string_equal(after_pass(view_write_fn, &x, 1, 1, ir_pass_dce, 0),
        "graph(%0: f32[4]) {\n"
        "  %1: f32[4] = exp(%0)\n"
        "  %2: f32[2] = slice(%1, dim=0, start=0, end=2)\n"
        "  %3: i64[]{wrapped} = scalar(value=1)\n"
        "  %4: f32[2] = add_(%2, %3)\n"
        "  %5: i64[]{wrapped} = scalar(value=2)\n"
        "  %6: f32[4] = mul(%1, %5)\n"
        "  return (%6)\n"
        "}\n");
    same_as_eager(view_write_fn, &x, 1, 1);
}

/* ---- decompose ----------------------------------------------------------------------- */

static int softmax_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}

static int composites_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0], *w = in[1], *b = in[2], *W = in[3], *t = in[4];
    out[0] = kl_softmax(x, 0);
    out[1] = kl_log_softmax(x, 1);
    out[2] = kl_layer_norm(x, 1, w, b, 1e-5);
    out[3] = kl_linear(x, W, NULL);
    out[4] = kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0.1);
    out[5] = kl_rms_norm(x, 1, w, 1e-6);
    out[6] = kl_mse_loss(out[3], kl_exp(out[3]), KL_REDUCE_SUM);
    out[7] = kl_binary_cross_entropy_with_logits(x, kl_sigmoid(x), KL_REDUCE_NONE);
    return 0;
}

/* The largest |a - b| / (1 + |b|) over the elements. */
static double max_err(kl_tensor *a, kl_tensor *b) {
    assert_int_equal(kl_dtype_of(a), kl_dtype_of(b));
    assert_int_equal(kl_numel(a), kl_numel(b));
    double m = 0;
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double x = kt_get(a, i), y = kt_get(b, i);
        if (isnan(x) && isnan(y)) continue;
        double e = fabs(x - y) / (1 + fabs(y));
        m = e > m || isnan(e) ? e : m;
    }
    return m;
}

/* The pass decomposes only graphs that will be fused. */
static int decompose_for_fusion(ir_graph *g) {
    g->fuse = 1;
    return ir_pass_decompose(g);
}

static void decompose_splices_primitives(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(seq(8, 0.5), KL_SHAPE(2, 4));
    assert_string_equal(after_pass(softmax_fn, &x, 1, 1, decompose_for_fusion, 1),
        "graph(%0: f32[2,4]) {\n"
        "  %1: f32[2,1] = amax(%0, dims=[-1], keepdim=true)\n"
        "  %2: f32[2,4] = sub(%0, %1)\n"
        "  %3: f32[2,4] = exp(%2)\n"
        "  %4: f32[2,1] = sum(%3, dims=[-1], keepdim=true)\n"
        "  %5: f32[2,4] = div(%3, %4)\n"
        "  return (%5)\n"
        "}\n");
    /* every composite goes; compiled (NO_FUSE) agrees with eager's fused CPU
     * kernels to a few f32 ulp (the decompositions round differently) */
    kl_tensor *in[5] = {kl_reshape(seq(32, 0.37), KL_SHAPE(4, 8)), kl_add_scalar(seq(8, 0.1), 1), seq(8, 0.05),
                        kl_reshape(seq(40, 0.02), KL_SHAPE(5, 8)), kl_to_dtype(seq(4, 1), KL_I64)};
    in[4] = kl_add_scalar(in[4], 2); /* classes 0..3 */
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(composites_fn, NULL, in, 5, 8, &broke, why, sizeof why);
    assert_non_null(g);
    assert_int_equal(ir_pass_decompose(g), 0); /* not a graph to fuse: composites stay */
    assert_true(decompose_for_fusion(g) >= 8);
    assert_int_equal(ir_verify(g, "decompose"), 0);
    if (getenv("KT_DUMP")) ir_print(g, stderr);
    for (int32_t k = 0; k < g->nnodes; k++)
        if (g->nodes[k].op < KE_OP_COUNT && ke_ops[g->nodes[k].op].kind == KE_KIND_COMPOSITE) {
            print_error("still composite: %s\n", ir_op_name(g->nodes[k].op));
            fail();
        }
    /* the primitives, run node by node, against eager's fused CPU kernels:
     * a few f32 ulp apart (the decompositions round differently) */
    kl_tensor *co[8], *eo[8];
    assert_int_equal(tr_run_graph(g, in, co), 0);
    ir_graph_free(g);
    assert_int_equal(composites_fn(NULL, in, 5, eo, 8), 0);
    double worst = 0;
    for (int j = 0; j < 8; j++) {
        double e = max_err(co[j], eo[j]);
        if (getenv("KT_VERBOSE")) print_message("output %d: max relative error %.3g\n", j, e);
        worst = e > worst ? e : worst;
    }
    assert_true(worst < 1e-6); /* f32: measured 6.3e-8 (rms_norm), 0 elsewhere */
}

/* ---- the pipeline -------------------------------------------------------------------- */

static void pipeline_matches_eager(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(seq(6, 0.5), KL_SHAPE(2, 3));
    same_as_eager(cse_fn, &x, 1, 1);
    kl_tensor *y = seq(3, 1);
    same_as_eager(fold_fn, &y, 1, 3);
    /* the optimizer step: pure ops and write-backs; nothing left in place */
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(sgd_fn, NULL, &o);
    kl_tensor *in[3] = {seq(4, 1), seq(4, 0.5), seq(4, 0.25)}, *out[2];
    assert_int_equal(kl_fn_call(f, in, 3, out, 2), 0);
    assert_ptr_equal(out[0], in[0]);
    char buf[4096];
    assert_true(kl_fn_graph_text(f, buf, sizeof buf) > 0);
    assert_string_equal(buf,
        "graph(%0: f32[4], %1: f32[4], %2: f32[4]) {\n"
        "  %3: f64[]{wrapped} = scalar(value=0.9)\n"
        "  %4: f32[4] = mul(%2, %3)\n"
        "  %5: f32[4] = add(%4, %1)\n"
        "  %6: f64[]{wrapped} = scalar(value=0.1)\n"
        "  %7: f32[4] = mul(%5, %6)\n"
        "  %8: f32[4] = sub(%0, %7)\n"
        "  %9: i64[]{wrapped} = scalar(value=2)\n"
        "  %10: f32[4] = mul(%1, %9)\n"
        "  %11: f32[4] = exp(%10)\n"
        "  copy_back(%0, %8)\n"
        "  copy_back(%2, %5)\n"
        "  return (%0, %11)\n"
        "}\n");
    kl_fn_release(f);
}

/* ---- plan (plan.c) alone: liveness on a traced graph without kernels ---- */
static int plan_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *a = kl_exp(in[0]);
    kl_tensor *b = kl_neg(kl_transpose(a, 0, 1));
    kl_add_inplace(in[1], b);
    out[0] = kl_mul_scalar(b, 2);
    return out[0] ? 0 : -1;
}

/* ---- the text form of attributes ------------------------------------------------------ */

static int no_pass(ir_graph *g) {
    (void)g;
    return 0;
}

/* one op per attribute type: lists in parts, bools, floats, reductions,
 * defaults left out (clamp's -inf, pooling's count_include_pad, slice's step) */
static int attrs_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_conv2d_options co = kl_conv2d_options_default();
    co.padding[0] = co.padding[1] = 1;
    co.groups = 2;
    kl_tensor *y = kl_conv2d(in[0], in[1], NULL, &co);
    kl_pool2d_options po = kl_pool2d_options_default(2);
    po.ceil_mode = true;
    y = kl_max_pool2d(y, &po);
    y = kl_layer_norm(y, 2, NULL, NULL, 1e-5);
    y = kl_softmax(kl_clamp(y, -INFINITY, 0.5), -1);
    kl_tensor *v = kl_var(y, KL_DIMS(2, 3), 1, false);
    kl_tensor *l = kl_cross_entropy(kl_squeeze(v, 0), in[2], KL_REDUCE_SUM, 0.25);
    out[0] = kl_add(kl_cumsum(kl_slice(y, 3, 0, 1, 1), 2), l);
    return out[0] ? 0 : -1;
}

static void attributes_print_by_name(void **state) {
    (void)state;
    kl_tensor *in[3] = {kl_rand(KL_SHAPE(1, 2, 4, 4), KL_F32), kl_rand(KL_SHAPE(2, 1, 3, 3), KL_F32),
                        kl_zeros(KL_SHAPE(1), KL_I64)};
    kl_tensor *v = kl_reshape(in[2], 0, NULL);
    in[2] = v;
    assert_string_equal(after_pass(attrs_fn, in, 3, 1, no_pass, 0),
        "graph(%0: f32[1,2,4,4], %1: f32[2,1,3,3], %2: i64[]) {\n"
        "  %3: f32[1,2,4,4] = conv2d(%0, %1, stride=[1,1], padding=[1,1], dilation=[1,1], groups=2, "
        "has_bias=false)\n"
        "  %4: f32[1,2,2,2] = max_pool2d(%3, kernel_size=[2,2], stride=[2,2], padding=[0,0], dilation=[1,1], "
        "ceil_mode=true)\n"
        "  %5: f32[1,2,2,2] = layer_norm(%4, normalized_ndim=2, has_weight=false, has_bias=false, eps=1e-05)\n"
        "  %6: f32[1,2,2,2] = clamp(%5, max=0.5)\n"
        "  %7: f32[1,2,2,2] = softmax(%6, dim=-1)\n"
        "  %8: f32[1,2] = var(%7, dims=[2,3], correction=1)\n"
        "  %9: f32[2] = squeeze(%8, dim=0)\n"
        "  %10: f32[] = cross_entropy(%9, %2, reduction=sum, label_smoothing=0.25)\n"
        "  %11: f32[1,2,2,1]{strides=8,4,2,1} = slice(%7, dim=3, start=0, end=1)\n"
        "  %12: f32[1,2,2,1] = cumsum(%11, dim=2)\n"
        "  %13: f32[1,2,2,1] = add(%12, %10)\n"
        "  return (%13)\n"
        "}\n");
}

static void plan_alone(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(6, 0.5), KL_SHAPE(2, 3)), kl_zeros(KL_SHAPE(3, 2), KL_F32)};
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(plan_fn, NULL, in, 2, 1, &broke, why, sizeof why);
    assert_non_null(g);
    assert_int_equal(ir_pass_plan(g), 0); /* no kernels: no slots */
    char *s = ir_to_string(g);
    assert_string_equal(s, "graph(%0: f32[2,3], %1: f32[3,2]) {\n"
                           "  %2: f32[2,3] = exp(%0)\n"
                           "  %3: f32[3,2]{strides=1,3} = transpose(%2, dim0=0, dim1=1)\n"
                           "  %4: f32[3,2] = neg(%3)\n"
                           "  %5: f32[3,2] = add_(%1, %4)\n"
                           "  %6: i64[]{wrapped} = scalar(value=2)\n"
                           "  %7: f32[3,2] = mul(%4, %6)\n"
                           "  return (%7)\n"
                           "}\n");
    free(s);
    /* each value dropped after its last use (the in-place result at once), the output kept */
    s = ir_print_to_string((int (*)(const void *, FILE *))ir_plan_print, g);
    assert_string_equal(s, "plan: 0 slots, 0 bytes for 0 bytes of kernel outputs\n"
                           "  after node 1 drop %2\n"
                           "  after node 2 drop %3\n"
                           "  after node 3 drop %5\n"
                           "  after node 5 drop %4 %6\n");
    free(s);
    /* a copy has its own plan; running it drops nothing the caller sees */
    ir_graph *c = ir_graph_clone(g);
    ir_graph_free(g);
    kl_tensor *y, *y1 = kl_clone(in[1]);
    assert_int_equal(tr_run_graph(c, (kl_tensor *[]){in[0], y1}, &y), 0);
    kl_tensor *e1 = kl_clone(in[1]), *ey;
    assert_int_equal(plan_fn(NULL, (kl_tensor *[]){in[0], e1}, 2, &ey, 1), 0);
    assert_true(bitwise_equal(y, ey));
    assert_true(bitwise_equal(y1, e1));
    ir_graph_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(cse_merges_only_equal_pure_nodes),
        KT_TEST(fold_computes_constants_once),
        KT_TEST(simplify_removes_identities),
        KT_TEST(functionalize_makes_writes_pure),
        KT_TEST(functionalize_guards_input_aliasing),
        KT_TEST(dce_keeps_writes_seen_through_views),
        KT_TEST(decompose_splices_primitives),
        KT_TEST(pipeline_matches_eager),
        KT_TEST(plan_alone),
        KT_TEST(pool_mask_moves_relus_mask),
        KT_TEST(attributes_print_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
