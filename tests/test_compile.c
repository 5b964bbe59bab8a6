/*
 * test_compile.c — kl_compile: tracing into graph IR, guards and the cache,
 * recompiles and their reasons, eager fallbacks (trace breaks, the recompile
 * limit, KL_COMPILE=0), captured tensors read at every call, in-place writes
 * to inputs, random ops, autograd through a compiled call, compiled training
 * steps through composite ops (attention, layer_norm, cross_entropy, conv2d),
 * KL_COMPILE_CHECK, the IR text form, and bad arguments.
 */
#include "harness.h"
#include "nn_util.h"

#include "ir.h"

#include <stdlib.h>

static const kl_compile_options *mode(kl_compile_mode m) {
    static kl_compile_options o;
    o = kl_compile_options_default();
    o.mode = m;
    return &o;
}

/* y = exp(relu(x * w + 1)) - x: a 5-op chain */
static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub(kl_exp(kl_relu(kl_add_scalar(kl_mul(in[0], in[1]), 1))), in[0]);
    return out[0] ? 0 : -1;
}

static kl_tensor *seq(int64_t n, double scale) {
    return kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F32), (double)n / 2), scale);
}

static void assert_same(kl_tensor *a, kl_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(kl_equal(a, b), 1);
}

static void traces_once_and_hits_the_cache(void **state) {
    (void)state;
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        kl_fn *f = kl_compile(chain, NULL, mode((kl_compile_mode)m));
        kl_tensor *x = seq(12, 0.25), *w = seq(12, -0.5);
        kl_tensor *in[2] = {x, w}, *y = NULL, *ref = NULL;
        assert_int_equal(chain(NULL, in, 2, &ref, 1), 0);
        for (int call = 0; call < 3; call++) {
            assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
            assert_same(y, ref);
        }
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.calls, 3);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.cache_hits, 2);
        assert_int_equal(st.recompiles, 0);
        assert_int_equal(st.eager_calls, 0);
        assert_int_equal(st.kernels, m == KL_COMPILE_FUSE ? 1 : 5); /* FUSE: one fused kernel */
        assert_string_equal(st.last_reason, "first call");
        kl_fn_release(f);
    }
}

static void graph_text_is_stable(void **state) {
    (void)state;
    kl_fn *f = kl_compile(chain, NULL, mode(KL_COMPILE_TRACE_ONLY));
    kl_tensor *in[2] = {kl_ones(KL_SHAPE(2, 3), KL_F32), kl_ones(KL_SHAPE(3), KL_F32)}, *y;
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    char buf[2048];
    assert_true(kl_fn_graph_text(f, buf, sizeof buf) > 0);
    assert_string_equal(buf,
                        "graph(%0: f32[2,3], %1: f32[3]) {\n"
                        "  %2: f32[2,3] = mul(%0, %1)\n"
                        "  %3: i64[]{wrapped} = scalar(value=1)\n"
                        "  %4: f32[2,3] = add(%2, %3)\n"
                        "  %5: f32[2,3] = relu(%4)\n"
                        "  %6: f32[2,3] = exp(%5)\n"
                        "  %7: f32[2,3] = sub(%6, %0)\n"
                        "  return (%7)\n"
                        "}\n");
    kl_fn_release(f);
}

static void recompiles_name_the_guard(void **state) {
    (void)state;
    kl_fn *f = kl_compile(chain, NULL, NULL);
    kl_tensor *a = seq(6, 1), *y;
    kl_tensor *in[2] = {a, a};
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    kl_tensor *b = kl_reshape(seq(6, 1), KL_SHAPE(2, 3));
    kl_tensor *in2[2] = {b, b};
    assert_int_equal(kl_fn_call(f, in2, 2, &y, 1), 0);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.recompiles, 1);
    assert_non_null(strstr(st.last_reason, "input 1 changed from [6] float32 to [2,3] float32 cpu"));
    /* a strided input is a new signature too */
    kl_tensor *t = kl_transpose(kl_reshape(seq(6, 1), KL_SHAPE(3, 2)), 0, 1);
    kl_tensor *in3[2] = {t, t};
    assert_int_equal(kl_fn_call(f, in3, 2, &y, 1), 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 3);
    assert_non_null(strstr(st.last_reason, "(strided)"));
    /* grad mode is guarded */
    kl_no_grad_begin();
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    kl_no_grad_end();
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 4);
    assert_string_equal(st.last_reason, "grad mode changed to off");
    kl_fn_release(f);
}

static void recompile_limit_falls_back(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.recompile_limit = 2;
    o.name = "limited";
    kl_fn *f = kl_compile(chain, NULL, &o);
    for (int n = 1; n <= 4; n++) {
        kl_tensor *x = seq(n, 1), *y, *ref;
        kl_tensor *in[2] = {x, x};
        assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
        assert_int_equal(chain(NULL, in, 2, &ref, 1), 0);
        assert_same(y, ref);
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.eager_calls, 2);
    assert_non_null(strstr(st.last_reason, "recompile limit reached"));
    kl_fn_release(f);
}

/* Data-dependent: scale by the first element's value. */
static int data_dependent(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    double s = kl_item(kl_select(in[0], 0, 0));
    out[0] = kl_mul_scalar(in[0], s);
    return out[0] ? 0 : -1;
}

static void data_dependent_op_runs_eagerly(void **state) {
    (void)state;
    kl_fn *f = kl_compile(data_dependent, NULL, NULL);
    for (int call = 0; call < 2; call++) {
        kl_tensor *x = kl_add_scalar(seq(4, 1), 3 + call), *y;
        assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
        kl_tensor *ref;
        assert_int_equal(data_dependent(NULL, &x, 1, &ref, 1), 0);
        assert_same(y, ref);
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.eager_calls, 2);
    assert_non_null(strstr(st.last_reason, "trace break: kl_item needs the data of traced value"));
    kl_fn_release(f);
}

/* A tensor captured from outside: read at every call, never baked in. */
static int with_captured(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    out[0] = kl_add(in[0], (kl_tensor *)u);
    return out[0] ? 0 : -1;
}

static void captured_tensors_are_read_each_call(void **state) {
    (void)state;
    kl_tensor *bias = kl_ones(KL_SHAPE(3), KL_F32);
    kl_fn *f = kl_compile(with_captured, bias, NULL);
    kl_tensor *x = kl_zeros(KL_SHAPE(3), KL_F32), *y;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    kt_assert_values(y, (double[]){1, 1, 1}, 3, 0);
    kl_fill_inplace(bias, 5);
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    kt_assert_values(y, (double[]){5, 5, 5}, 3, 0);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    kl_fn_release(f);
}

/* An SGD step on its inputs, in place: w -= 0.5 * g. Returns w. */
static int sgd(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub_inplace(in[0], kl_mul_scalar(in[1], 0.5));
    return out[0] ? 0 : -1;
}

static void inplace_writes_reach_the_inputs(void **state) {
    (void)state;
    kl_fn *f = kl_compile(sgd, NULL, NULL);
    kl_tensor *w = kl_clone(kl_ones(KL_SHAPE(4), KL_F32)), *g = seq(4, 1), *y;
    kl_tensor *in[2] = {w, g};
    for (int call = 0; call < 2; call++) assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_ptr_equal(y, w);
    kt_assert_values(w, (double[]){3, 2, 1, 0}, 4, 0); /* 1 - 2 * 0.5 * (-2, -1, 0, 1) */
    kl_fn_release(f);
}

static int noisy(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_add(in[0], kl_rand(KL_SHAPE(4), KL_F32));
    out[1] = kl_dropout(in[0], 0.5, true);
    return out[0] && out[1] ? 0 : -1;
}

static void random_ops_draw_fresh_numbers(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(4), KL_F32), *y[2], *e[2];
    kl_fn *f = kl_compile(noisy, NULL, NULL);
    for (int call = 0; call < 3; call++) {
        /* the same numbers as an eager run from the same generator state */
        kl_manual_seed(100 + call);
        assert_int_equal(kl_fn_call(f, &x, 1, y, 2), 0);
        kl_manual_seed(100 + call);
        assert_int_equal(noisy(NULL, &x, 1, e, 2), 0);
        assert_same(y[0], e[0]);
        assert_same(y[1], e[1]);
    }
    kl_tensor *first = y[0];
    assert_int_equal(kl_fn_call(f, &x, 1, y, 2), 0);
    assert_int_equal(kl_equal(first, y[0]), 0);
    kl_fn_release(f);
}

static void gradients_flow_through_compiled_calls(void **state) {
    (void)state;
    kl_fn *f = kl_compile(chain, NULL, NULL);
    kl_tensor *x = kl_clone(seq(6, 0.3)), *w = kl_clone(seq(6, 0.2));
    kl_set_requires_grad(x, true);
    kl_set_requires_grad(w, true);
    kl_tensor *in[2] = {x, w}, *y;
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_true(kl_requires_grad(y));
    assert_int_equal(kl_backward(kl_sum(y, KL_ALL_DIMS, false), NULL, NULL), 0);
    kl_tensor *gx = kl_clone(kl_grad(x)), *gw = kl_clone(kl_grad(w));
    kl_zero_grad(x);
    kl_zero_grad(w);
    kl_tensor *ref;
    assert_int_equal(chain(NULL, in, 2, &ref, 1), 0);
    assert_int_equal(kl_backward(kl_sum(ref, KL_ALL_DIMS, false), NULL, NULL), 0);
    assert_same(gx, kl_grad(x));
    assert_same(gw, kl_grad(w));
    kl_fn_release(f);
}

/* A whole training step in one traced function: in = {x, y, w1, b1, w2, b2}
 * (parameters passed without requires_grad, so the call fuses); the step
 * makes its own leaves, takes their gradients through dropout, and updates
 * the parameters in place (SGD). out = {loss}. */
static int sgd_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p[4], *g[4];
    for (int i = 0; i < 4; i++) {
        p[i] = kl_detach(in[2 + i]);
        if (!p[i] || kl_set_requires_grad(p[i], true) < 0) return -1;
    }
    kl_tensor *h = kl_dropout(kl_gelu(kl_linear(in[0], p[0], p[1])), 0.25, true);
    kl_tensor *loss = kl_cross_entropy(kl_linear(h, p[2], p[3]), in[1], KL_REDUCE_MEAN, 0);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 4, p, g, NULL) < 0) return -1;
    kl_no_grad_begin();
    for (int i = 0; i < 4; i++)
        if (!kl_sub_inplace(in[2 + i], kl_mul_scalar(g[i], 0.5))) {
            kl_no_grad_end();
            return -1;
        }
    kl_no_grad_end();
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

static void training_steps_compile_whole(void **state) {
    (void)state;
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        kl_manual_seed(7);
        kl_tensor *x = kl_randn(KL_SHAPE(16, 12), KL_F32), *y = kl_randint(0, 5, KL_SHAPE(16), KL_I64);
        kl_tensor *pc[4] = {kl_mul_scalar(kl_randn(KL_SHAPE(20, 12), KL_F32), 0.3), kl_zeros(KL_SHAPE(20), KL_F32),
                            kl_mul_scalar(kl_randn(KL_SHAPE(5, 20), KL_F32), 0.3), kl_zeros(KL_SHAPE(5), KL_F32)};
        kl_tensor *pe[4];
        for (int i = 0; i < 4; i++) pe[i] = kl_clone(pc[i]);
        kl_fn *f = kl_compile(sgd_step, NULL, mode((kl_compile_mode)m));
        for (int step = 0; step < 4; step++) {
            kl_tensor *lc, *le;
            kl_manual_seed(1000 + step); /* the same dropout masks in both */
            assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, y, pc[0], pc[1], pc[2], pc[3]}, 6, &lc, 1), 0);
            kl_manual_seed(1000 + step);
            assert_int_equal(sgd_step(NULL, (kl_tensor *[]){x, y, pe[0], pe[1], pe[2], pe[3]}, 6, &le, 1), 0);
            assert_int_equal(kl_allclose(lc, le, 1e-5, 1e-6, false), 1);
            for (int i = 0; i < 4; i++) assert_int_equal(kl_allclose(pc[i], pe[i], 1e-5, 1e-6, false), 1);
        }
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.eager_calls, 0);
        kl_fn_release(f);
    }
}

/* dropout's backward regenerates its forward's mask from the forward's
 * reservation: in a compiled call both must draw the same numbers. */
static int dropout_grad(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = kl_detach(in[0]);
    if (!p || kl_set_requires_grad(p, true) < 0) return -1;
    kl_tensor *y = kl_dropout(kl_exp(p), 0.5, true);
    out[1] = kl_detach(y);
    return kl_autograd_grad(1, (kl_tensor *[]){kl_sum(y, KL_ALL_DIMS, false)}, NULL, 1, &p, out, NULL);
}

static void dropout_backward_reuses_the_mask(void **state) {
    (void)state;
    kl_tensor *x = seq(64, 0.05), *c[2], *e[2];
    kl_fn *f = kl_compile(dropout_grad, NULL, NULL);
    for (int call = 0; call < 3; call++) {
        kl_manual_seed(40 + call);
        assert_int_equal(kl_fn_call(f, &x, 1, c, 2), 0);
        kl_manual_seed(40 + call);
        assert_int_equal(dropout_grad(NULL, &x, 1, e, 2), 0);
        assert_same(c[1], e[1]);
        assert_int_equal(kl_allclose(c[0], e[0], 1e-6, 0, false), 1);
        /* the gradient is zero exactly where the forward dropped */
        assert_int_equal(kl_equal(kl_eq_scalar(c[0], 0), kl_eq_scalar(c[1], 0)), 1);
    }
    char text[8192];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    assert_non_null(strstr(text, "slot=0"));
    kl_fn_release(f);
}

/* ---- compiled training steps through composite ops ------------------------ */

/* The failure of issue 15: sdpa is differentiated through its decomposition,
 * whose pieces autograd records; traced whole, the pieces ran with tracing
 * off and the backward read meta values the graph did not have. */
static int sdpa_grad_q(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *q = kl_detach(in[0]);
    if (!q || kl_set_requires_grad(q, true) < 0) return -1;
    kl_tensor *y = kl_scaled_dot_product_attention(q, in[1], in[2], NULL, false, 0);
    kl_tensor *loss = kl_sum(y, KL_ALL_DIMS, false);
    return kl_autograd_grad(1, &loss, NULL, 1, &q, out, NULL);
}

static void attention_step_of_issue_15_compiles(void **state) {
    (void)state;
    kl_manual_seed(15);
    kl_tensor *in[3] = {kl_randn(KL_SHAPE(1, 2, 4, 8), KL_F32), kl_randn(KL_SHAPE(1, 2, 4, 8), KL_F32),
                        kl_randn(KL_SHAPE(1, 2, 4, 8), KL_F32)};
    kl_tensor *gc, *ge;
    kl_fn *f = kl_compile(sdpa_grad_q, NULL, NULL);
    assert_int_equal(kl_fn_call(f, in, 3, &gc, 1), 0);
    assert_int_equal(sdpa_grad_q(NULL, in, 3, &ge, 1), 0);
    assert_int_equal(kl_allclose(gc, ge, 1e-5, 1e-6, false), 1);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.eager_calls, 0);
    /* the graph holds the pieces, not one sdpa node the backward cannot see into */
    char text[65536];
    int len = kl_fn_graph_text(f, text, sizeof text);
    assert_true(len > 0 && len < (int)sizeof text);
    assert_null(strstr(text, "scaled_dot_product_attention"));
    kl_fn_release(f);
}

/* One case of the table below: inputs in[0..np) are the parameters (made
 * leaves inside the step), the rest data; loss() builds a scalar loss. */
typedef struct train_case {
    const char *name;
    int np, nin;
    kl_tensor *(*loss)(kl_tensor *const *p, kl_tensor *const *in);
} train_case;

/* sum(y * w) rather than sum(y): a gradient that differs per element */
static kl_tensor *weighted(kl_tensor *y, kl_tensor *w) {
    return kl_sum(kl_mul(y, w), KL_ALL_DIMS, false);
}
/* in: q, k, v | w */
static kl_tensor *loss_attn(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_scaled_dot_product_attention(p[0], p[1], p[2], NULL, false, 0), in[3]);
}
static kl_tensor *loss_attn_causal(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_scaled_dot_product_attention(p[0], p[1], p[2], NULL, true, 0.3), in[3]);
}
/* in: q, k, v | w, bool mask (true = keep) */
static kl_tensor *loss_attn_mask(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_scaled_dot_product_attention(p[0], p[1], p[2], in[4], false, 0), in[3]);
}
/* in: q, k, v | w, float mask (added to the scores) */
static kl_tensor *loss_attn_float_mask(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_scaled_dot_product_attention(p[0], p[1], p[2], in[4], false, 0.5), in[3]);
}
/* in: weight, bias | x, w */
static kl_tensor *loss_layer_norm(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_layer_norm(in[2], 1, p[0], p[1], 1e-5), in[3]);
}
/* in: weight, bias | x, target (with an ignored class) */
static kl_tensor *loss_cross_entropy(kl_tensor *const *p, kl_tensor *const *in) {
    return kl_cross_entropy(kl_linear(in[2], p[0], p[1]), in[3], KL_REDUCE_MEAN, 0.1);
}
/* in: weight, bias | x, target (ignore_index 3), class weight */
static kl_tensor *loss_cross_entropy_weighted(kl_tensor *const *p, kl_tensor *const *in) {
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.weight = in[4];
    o.ignore_index = 3;
    o.label_smoothing = 0.2;
    return kl_cross_entropy_ex(kl_linear(in[2], p[0], p[1]), in[3], &o);
}
/* in: weight, bias | x, class probabilities, class weight */
static kl_tensor *loss_cross_entropy_prob(kl_tensor *const *p, kl_tensor *const *in) {
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.weight = in[4];
    o.label_smoothing = 0.1;
    return kl_cross_entropy_ex(kl_linear(in[2], p[0], p[1]), in[3], &o);
}
/* in: a, b | wa, wb: reflect, replicate and circular padding (the gradient
 * scatters back through each mode's index map) */
static kl_tensor *loss_pad_modes(kl_tensor *const *p, kl_tensor *const *in) {
    kl_tensor *a = kl_pad_ex(kl_tanh(p[0]), 4, (const int64_t[]){1, 2, 2, -1}, KL_PAD_REFLECT, 0);
    kl_tensor *b = kl_pad_ex(kl_mul(p[0], p[1]), 4, (const int64_t[]){2, 1, 0, 3}, KL_PAD_CIRCULAR, 0);
    kl_tensor *r = kl_pad_ex(p[1], 4, (const int64_t[]){3, 0, 1, 1}, KL_PAD_REPLICATE, 0);
    return kl_add(kl_add(weighted(a, in[2]), weighted(b, in[3])), kl_sum(kl_mul(r, r), KL_ALL_DIMS, false));
}
/* in: weight, bias | x, w; stride 2, padding 1 */
static kl_tensor *loss_conv2d(kl_tensor *const *p, kl_tensor *const *in) {
    kl_conv2d_options o = kl_conv2d_options_default();
    o.stride[0] = o.stride[1] = 2;
    o.padding[0] = o.padding[1] = 1;
    return weighted(kl_tanh(kl_conv2d(in[2], p[0], p[1], &o)), in[3]);
}
/* in: x, q-proj weight | k, v: layer_norm -> linear -> attention -> cross_entropy,
 * every composite of the table in one step */
static kl_tensor *loss_block(kl_tensor *const *p, kl_tensor *const *in) {
    kl_tensor *h = kl_layer_norm(p[0], 1, NULL, NULL, 1e-5);
    kl_tensor *q = kl_linear(h, p[1], NULL);
    kl_tensor *a = kl_scaled_dot_product_attention(q, in[2], in[3], NULL, true, 0);
    return kl_cross_entropy(kl_reshape(a, KL_SHAPE(-1, 8)), in[4], KL_REDUCE_MEAN, 0);
}

/* issue 16's layers. in: weight, bias | x, w; batch statistics */
static kl_tensor *loss_batch_norm(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_batch_norm(in[2], NULL, NULL, p[0], p[1], true, 0.1, 1e-5), in[3]);
}
/* in: x, weight | running_mean, running_var, w; eval mode */
static kl_tensor *loss_batch_norm_eval(kl_tensor *const *p, kl_tensor *const *in) {
    return weighted(kl_batch_norm(p[0], in[2], in[3], p[1], NULL, false, 0.1, 1e-5), in[4]);
}
/* in: conv_transpose2d weight, group_norm weight | x, w */
static kl_tensor *loss_convt_group_norm(kl_tensor *const *p, kl_tensor *const *in) {
    kl_conv_transpose2d_options o = kl_conv_transpose2d_options_default();
    o.stride[0] = o.stride[1] = 2;
    o.padding[0] = o.padding[1] = 1;
    o.output_padding[0] = o.output_padding[1] = 1;
    return weighted(kl_group_norm(kl_conv_transpose2d(in[2], p[0], NULL, &o), 2, p[1], NULL, 1e-5), in[3]);
}
/* in: conv1d weight, bias | x, w; then adaptive_avg_pool2d */
static kl_tensor *loss_conv1d_pool(kl_tensor *const *p, kl_tensor *const *in) {
    kl_conv1d_options o = kl_conv1d_options_default();
    o.padding = 1, o.dilation = 2;
    kl_tensor *h = kl_unsqueeze(kl_conv1d(in[2], p[0], p[1], &o), 2);
    return weighted(kl_adaptive_avg_pool2d(h, 1, 3), in[3]);
}

/* in: x, prelu weight | w: prelu, then bilinear and nearest resizing */
static kl_tensor *loss_interp_prelu(kl_tensor *const *p, kl_tensor *const *in) {
    kl_interpolate_options o = kl_interpolate_options_default();
    o.size[0] = 7, o.size[1] = 9, o.mode = KL_INTERP_BILINEAR;
    kl_tensor *h = kl_prelu(p[0], p[1]), *a = kl_interpolate(h, &o);
    o.mode = KL_INTERP_NEAREST;
    return weighted(kl_add(a, kl_interpolate(h, &o)), in[2]);
}
/* in: self, src | index, w: scatter and scatter_reduce's reductions */
static kl_tensor *loss_scatter(kl_tensor *const *p, kl_tensor *const *in) {
    kl_tensor *y = kl_scatter(p[0], 0, in[2], p[1]);
    y = kl_add(y, kl_scatter_reduce(p[0], 0, in[2], p[1], KL_SCATTER_AMAX, false));
    y = kl_add(y, kl_scatter_reduce(p[0], 0, in[2], p[1], KL_SCATTER_MEAN, true));
    y = kl_add(y, kl_scatter_reduce(p[0], 0, in[2], p[1], KL_SCATTER_PROD, true));
    return weighted(y, in[3]);
}

/* A training step: out = {the np gradients, the loss}. */
static int case_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const train_case *tc = u;
    kl_tensor *p[4];
    for (int i = 0; i < tc->np; i++) {
        p[i] = kl_detach(in[i]);
        if (!p[i] || kl_set_requires_grad(p[i], true) < 0) return -1;
    }
    kl_tensor *loss = tc->loss(p, in);
    if (!loss || kl_autograd_grad(1, &loss, NULL, tc->np, p, out, NULL) < 0) return -1;
    out[tc->np] = kl_detach(loss);
    return out[tc->np] ? 0 : -1;
}

/* The forward alone: parameters passed requiring grad, backward from eager code. */
static int case_forward(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const train_case *tc = u;
    out[0] = tc->loss(in, in);
    return out[0] ? 0 : -1;
}

static void make_case_inputs(int c, kl_tensor **in) {
    kl_manual_seed(100 + c);
    switch (c) {
    case 0: case 1: case 2: case 3: {
        int64_t l = c == 0 ? 5 : 6; /* a non-causal case with L != S */
        in[0] = kl_randn(KL_SHAPE(2, 2, l, 8), KL_F32);
        in[1] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[2] = kl_randn(KL_SHAPE(2, 2, 6, 4), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 2, l, 4), KL_F32);
        if (c == 2) in[4] = kl_gt_scalar(kl_rand(KL_SHAPE(l, 6), KL_F32), 0.3);
        if (c == 3) in[4] = kl_mul_scalar(kl_randn(KL_SHAPE(2, 1, l, 6), KL_F32), 0.5);
        if (c == 2) /* every row keeps at least one key (an all-false row is NaN, as in PyTorch) */
            in[4] = kl_logical_or(in[4], kl_eye(l, 6, KL_BOOL));
        break;
    }
    case 4:
        in[0] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(10), KL_F32), 0.1), 1);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(10), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(3, 4, 10), KL_F32);
        in[3] = kl_randn(KL_SHAPE(3, 4, 10), KL_F32);
        break;
    case 5:
        in[0] = kl_mul_scalar(kl_randn(KL_SHAPE(5, 12), KL_F32), 0.3);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(5), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(16, 12), KL_F32);
        in[3] = kl_from_data((int64_t[]){0, 4, 2, -100, 1, 3, 3, 0, 2, 4, 1, -100, 0, 2, 4, 1}, KL_SHAPE(16), KL_I64);
        break;
    case 6:
        in[0] = kl_mul_scalar(kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32), 0.3);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(2, 3, 7, 7), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 4, 4, 4), KL_F32);
        break;
    case 8:
        in[0] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(3), KL_F32), 0.1), 1);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(3), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(4, 3, 5, 5), KL_F32);
        in[3] = kl_randn(KL_SHAPE(4, 3, 5, 5), KL_F32);
        break;
    case 9:
        in[0] = kl_randn(KL_SHAPE(4, 3, 2, 2), KL_F32);
        in[1] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(3), KL_F32), 0.1), 1);
        in[2] = kl_randn(KL_SHAPE(3), KL_F32);
        in[3] = kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5);
        in[4] = kl_randn(KL_SHAPE(4, 3, 2, 2), KL_F32);
        break;
    case 10:
        in[0] = kl_mul_scalar(kl_randn(KL_SHAPE(3, 4, 3, 3), KL_F32), 0.3);
        in[1] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1), 1);
        in[2] = kl_randn(KL_SHAPE(2, 3, 4, 4), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 4, 8, 8), KL_F32);
        break;
    case 11:
        in[0] = kl_mul_scalar(kl_randn(KL_SHAPE(4, 3, 3), KL_F32), 0.3);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(2, 3, 10), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 4, 1, 3), KL_F32);
        break;
    case 12: case 13:
        in[0] = kl_mul_scalar(kl_randn(KL_SHAPE(5, 12), KL_F32), 0.3);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(5), KL_F32), 0.1);
        in[2] = kl_randn(KL_SHAPE(16, 12), KL_F32);
        in[3] = c == 12 ? kl_from_data((int64_t[]){0, 4, 2, 3, 1, 3, 3, 0, 2, 4, 1, 3, 0, 2, 4, 1}, KL_SHAPE(16), KL_I64)
                       : kl_softmax(kl_randn(KL_SHAPE(16, 5), KL_F32), 1);
        in[4] = kl_add_scalar(kl_rand(KL_SHAPE(5), KL_F32), 0.5);
        break;
    case 14:
        in[0] = kl_randn(KL_SHAPE(2, 3, 4, 5), KL_F32);
        in[1] = kl_randn(KL_SHAPE(2, 3, 4, 5), KL_F32);
        in[2] = kl_randn(KL_SHAPE(2, 3, 5, 8), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 3, 7, 8), KL_F32);
        break;
    case 15:
        in[0] = kl_randn(KL_SHAPE(2, 3, 5, 4), KL_F32);
        in[1] = kl_mul_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5);
        in[2] = kl_randn(KL_SHAPE(2, 3, 7, 9), KL_F32);
        break;
    case 16:
        in[0] = kl_add_scalar(kl_rand(KL_SHAPE(4, 6), KL_F32), 0.5);
        in[1] = kl_add_scalar(kl_rand(KL_SHAPE(5, 6), KL_F32), 0.5);
        in[2] = kl_randint(0, 4, KL_SHAPE(5, 6), KL_I64);
        in[3] = kl_randn(KL_SHAPE(4, 6), KL_F32);
        break;
    default:
        in[0] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[1] = kl_mul_scalar(kl_randn(KL_SHAPE(8, 8), KL_F32), 0.3);
        in[2] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[4] = kl_randint(0, 8, KL_SHAPE(24), KL_I64);
        break;
    }
}

static const train_case train_cases[] = {
    {"attention", 3, 4, loss_attn},
    {"attention causal", 3, 4, loss_attn_causal},
    {"attention bool mask", 3, 5, loss_attn_mask},
    {"attention float mask", 3, 5, loss_attn_float_mask},
    {"layer_norm", 2, 4, loss_layer_norm},
    {"cross_entropy", 2, 4, loss_cross_entropy},
    {"conv2d", 2, 4, loss_conv2d},
    {"attention block", 2, 5, loss_block},
    {"batch_norm", 2, 4, loss_batch_norm},
    {"batch_norm eval", 2, 5, loss_batch_norm_eval},
    {"conv_transpose2d group_norm", 2, 4, loss_convt_group_norm},
    {"conv1d adaptive_avg_pool2d", 2, 4, loss_conv1d_pool},
    {"cross_entropy weighted", 2, 5, loss_cross_entropy_weighted},
    {"cross_entropy probabilities", 2, 5, loss_cross_entropy_prob},
    {"pad modes", 2, 4, loss_pad_modes},
    {"interpolate prelu", 2, 3, loss_interp_prelu},
    {"scatter scatter_reduce", 2, 4, loss_scatter},
};
#define N_TRAIN_CASES ((int)(sizeof train_cases / sizeof train_cases[0]))

/* Compiled gradients against the eager step's. TRACE_ONLY runs the traced
 * ops one by one with eager's kernels: bitwise equal. NO_FUSE and FUSE run
 * decomposed composites and fused kernels (other summation orders): within
 * rtol 1e-4, atol 1e-5. */
static void assert_grads_match(kl_compile_mode m, const char *name, int n, kl_tensor **c, kl_tensor **e) {
    for (int i = 0; i < n; i++) {
        int ok = m == KL_COMPILE_TRACE_ONLY ? kl_equal(c[i], e[i]) : kl_allclose(c[i], e[i], 1e-4, 1e-5, false);
        if (ok != 1) print_error("%s, mode %d: output %d differs from eager\n", name, (int)m, i);
        assert_int_equal(ok, 1);
    }
}

static void compiled_training_steps_with_composites(void **state) {
    (void)state;
    for (int c = 0; c < N_TRAIN_CASES; c++) {
        const train_case *tc = &train_cases[c];
        kl_tensor *in[5];
        make_case_inputs(c, in);
        kl_tensor *e[5];
        assert_int_equal(case_step((void *)tc, in, tc->nin, e, tc->np + 1), 0);
        for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
            kl_fn *f = kl_compile(case_step, (void *)tc, mode((kl_compile_mode)m));
            for (int call = 0; call < 2; call++) { /* the trace, then the cache */
                kl_tensor *g[5];
                int rc = kl_fn_call(f, in, tc->nin, g, tc->np + 1);
                if (rc) print_error("%s, mode %d: %s\n", tc->name, m, kl_last_error());
                assert_int_equal(rc, 0);
                assert_grads_match((kl_compile_mode)m, tc->name, tc->np + 1, g, e);
            }
            kl_fn_stats st;
            assert_int_equal(kl_fn_get_stats(f, &st), 0);
            assert_int_equal(st.traces, 1);
            assert_int_equal(st.eager_calls, 0);
            kl_fn_release(f);
        }
    }
}

/* A training step through batch_norm in training mode: in = {x, weight,
 * bias, running_mean, running_var}; out = {d loss / d weight, loss}. The
 * running buffers are written in place by kl_batch_norm. */
static int bn_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *w = kl_detach(in[1]);
    if (!w || kl_set_requires_grad(w, true) < 0) return -1;
    kl_tensor *y = kl_batch_norm(in[0], in[3], in[4], w, in[2], true, 0.2, 1e-5);
    kl_tensor *loss = kl_sum(kl_mul(kl_relu(y), y), KL_ALL_DIMS, false);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 1, &w, out, NULL) < 0) return -1;
    out[1] = kl_detach(loss);
    return out[1] ? 0 : -1;
}

/* The running buffers after N compiled calls equal eager's after N steps:
 * the in-place update is functionalized and written back into the caller's
 * tensors at every call (and not replaced by other tensors). */
static void batch_norm_buffers_are_written_back(void **state) {
    (void)state;
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        kl_manual_seed(77);
        kl_tensor *xs[4];
        for (int i = 0; i < 4; i++) xs[i] = kl_add_scalar(kl_randn(KL_SHAPE(6, 3, 4, 4), KL_F32), i);
        kl_tensor *w = kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5), *b = kl_randn(KL_SHAPE(3), KL_F32);
        kl_tensor *rmc = kl_zeros(KL_SHAPE(3), KL_F32), *rvc = kl_ones(KL_SHAPE(3), KL_F32);
        kl_tensor *rme = kl_zeros(KL_SHAPE(3), KL_F32), *rve = kl_ones(KL_SHAPE(3), KL_F32);
        kl_fn *f = kl_compile(bn_step, NULL, mode((kl_compile_mode)m));
        for (int step = 0; step < 4; step++) {
            kl_tensor *c[2], *e[2];
            assert_int_equal(kl_fn_call(f, (kl_tensor *[]){xs[step], w, b, rmc, rvc}, 5, c, 2), 0);
            assert_int_equal(bn_step(NULL, (kl_tensor *[]){xs[step], w, b, rme, rve}, 5, e, 2), 0);
            assert_grads_match((kl_compile_mode)m, "batch_norm step", 2, c, e);
            assert_int_equal(kl_allclose(rmc, rme, 1e-5, 1e-6, false), 1);
            assert_int_equal(kl_allclose(rvc, rve, 1e-5, 1e-6, false), 1);
        }
        /* after 4 steps with means near 0, 1, 2, 3: (1 - 0.8^4) of the way, roughly */
        assert_true(kl_item(kl_amax(rmc, KL_ALL_DIMS, false)) > 0.5);
        assert_true(kl_item(kl_amax(kl_abs(kl_sub_scalar(rvc, 1)), KL_ALL_DIMS, false)) < 0.5);
        assert_false(kl_requires_grad(rmc));
        if (m == KL_COMPILE_FUSE) { /* the statistics: one batch_norm_stats kept whole, no mean / var pass */
            static char text[65536];
            assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
            assert_non_null(strstr(text, "= batch_norm_stats("));
            assert_null(strstr(text, "= var("));
        }
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.eager_calls, 0);
        kl_fn_release(f);
    }
}

/* In FUSE mode on the CPU the composites flagged KE_F_KEEP_CPU
 * (batch_norm_backward, max_pool2d_backward) stay whole, run their fused
 * kernels as library calls, and kl_fn_explain says why; the gradients agree
 * with eager (the same kernels: within rounding of the fused neighbours). */
static void cpu_fused_composites_stay_whole(void **state) {
    (void)state;
    kl_manual_seed(91);
    kl_tensor *in[4] = {kl_randn(KL_SHAPE(4, 3, 6, 6), KL_F32), kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5),
                        kl_randn(KL_SHAPE(3), KL_F32), kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32)};
    kl_tensor *e[3], *c[3];
    assert_int_equal(kt_bn_relu_pool_step(NULL, in, 4, e, 3), 0);
    kl_fn *f = kl_compile(kt_bn_relu_pool_step, NULL, mode(KL_COMPILE_FUSE));
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(f, in, 4, c, 3), 0);
        assert_grads_match(KL_COMPILE_FUSE, "bn pool step", 3, c, e);
    }
    static char text[65536];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    assert_non_null(strstr(text, "= batch_norm_backward("));
    assert_non_null(strstr(text, "= max_pool2d_backward("));
    assert_null(strstr(text, "max_pool2d_indices(")); /* the decomposition's argmax */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    assert_int_equal(kl_fn_explain(f, m), 0);
    fclose(m);
    assert_non_null(strstr(buf, "batch_norm_backward[4,3,6,6]: kept whole on cpu"));
    assert_non_null(strstr(buf, "max_pool2d_backward[4,3,6,6]: kept whole on cpu"));
    free(buf);
    kl_fn_release(f);
}

/* conv -> relu -> max_pool step: in = {x, w, y}; out = {dL/dx, dL/dw, loss}.
 * Its backward calls the internal composites conv2d_input_grad and
 * conv2d_weight_grad and relu's threshold_backward. */
static int conv_relu_pool_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p[2] = {kl_detach(in[0]), kl_detach(in[1])};
    if (!p[0] || !p[1] || kl_set_requires_grad(p[0], true) < 0 || kl_set_requires_grad(p[1], true) < 0) return -1;
    kl_pool2d_options po = kl_pool2d_options_default(2);
    kl_conv2d_options co = kl_conv2d_options_default();
    co.padding[0] = co.padding[1] = 1;
    kl_tensor *h = kl_max_pool2d(kl_relu(kl_conv2d(p[0], p[1], NULL, &co)), &po);
    kl_tensor *loss = kl_sum(kl_mul(h, in[2]), KL_ALL_DIMS, false);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 2, p, out, NULL) < 0) return -1;
    out[2] = kl_detach(loss);
    return out[2] ? 0 : -1;
}

/* conv2d's two gradients stay whole in FUSE graphs on the CPU too (GEMM +
 * col2im, im2col + GEMM, not conv_transpose2d's flipped-kernel conv2d over a
 * padded gradient), and agree with eager. */
static void cpu_conv_gradients_stay_whole(void **state) {
    (void)state;
    kl_manual_seed(92);
    kl_tensor *in[3] = {kl_randn(KL_SHAPE(4, 3, 9, 8), KL_F32), kl_randn(KL_SHAPE(5, 3, 3, 3), KL_F32),
                        kl_randn(KL_SHAPE(4, 5, 4, 4), KL_F32)};
    kl_tensor *e[3], *c[3];
    assert_int_equal(conv_relu_pool_step(NULL, in, 3, e, 3), 0);
    kl_fn *f = kl_compile(conv_relu_pool_step, NULL, mode(KL_COMPILE_FUSE));
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(f, in, 3, c, 3), 0);
        assert_grads_match(KL_COMPILE_FUSE, "conv relu pool step", 3, c, e);
    }
    static char text[65536];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    assert_non_null(strstr(text, "= conv2d_input_grad("));
    assert_non_null(strstr(text, "= conv2d_weight_grad("));
    assert_null(strstr(text, "index_select(")); /* conv_transpose2d's kernel flip */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    assert_int_equal(kl_fn_explain(f, m), 0);
    fclose(m);
    assert_non_null(strstr(buf, "conv2d_input_grad[4,3,9,8]: kept whole on cpu"));
    free(buf);
    kl_fn_release(f);
}

static int dropout2d_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_dropout2d(kl_exp(in[0]), 0.5, true);
    return out[0] ? 0 : -1;
}

static void dropout2d_compiled_matches_eager(void **state) {
    (void)state;
    kl_tensor *x = kl_reshape(seq(96, 0.01), KL_SHAPE(4, 6, 2, 2)), *c, *e;
    kl_fn *f = kl_compile(dropout2d_fn, NULL, NULL);
    for (int call = 0; call < 3; call++) {
        kl_manual_seed(60 + call);
        assert_int_equal(kl_fn_call(f, &x, 1, &c, 1), 0);
        kl_manual_seed(60 + call);
        assert_int_equal(dropout2d_fn(NULL, &x, 1, &e, 1), 0);
        assert_int_equal(kl_allclose(c, e, 1e-6, 0, false), 1);
    }
    kl_fn_release(f);
}

/* The other way of compiling training: the compiled forward is called on
 * parameters that require grad and the backward runs from eager code. */
static void compiled_forwards_with_composites_differentiate(void **state) {
    (void)state;
    for (int c = 0; c < N_TRAIN_CASES; c++) {
        const train_case *tc = &train_cases[c];
        kl_tensor *in[5], *ge[5], *gc[5], *le, *lc;
        make_case_inputs(c, in);
        for (int i = 0; i < tc->np; i++) assert_int_equal(kl_set_requires_grad(in[i], true), 0);
        assert_int_equal(case_forward((void *)tc, in, tc->nin, &le, 1), 0);
        assert_int_equal(kl_autograd_grad(1, &le, NULL, tc->np, in, ge, NULL), 0);
        for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
            kl_fn *f = kl_compile(case_forward, (void *)tc, mode((kl_compile_mode)m));
            int rc = kl_fn_call(f, in, tc->nin, &lc, 1);
            if (rc) print_error("%s, mode %d: %s\n", tc->name, m, kl_last_error());
            assert_int_equal(rc, 0);
            assert_true(kl_requires_grad(lc));
            assert_int_equal(kl_autograd_grad(1, &lc, NULL, tc->np, in, gc, NULL), 0);
            gc[tc->np] = lc;
            ge[tc->np] = le;
            assert_grads_match((kl_compile_mode)m, tc->name, tc->np + 1, gc, ge);
            kl_fn_release(f);
        }
    }
}

/* x <- x * 0.5 + y (kernel writes x itself); z <- z + z^T (reads another
 * view of z: the copy stays) */
static int updates(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_add_inplace(kl_mul_scalar_inplace(in[0], 0.5), in[1]);
    kl_tensor *zt = kl_clone(kl_transpose(in[2], 0, 1));
    out[0] = kl_exp_inplace(kl_add_inplace(in[2], kl_mul_scalar(zt, 2)));
    return out[0] ? 0 : -1;
}

static void kernels_write_updates_in_place(void **state) {
    (void)state;
    kl_tensor *a[3] = {seq(12, 0.1), seq(12, -0.3), kl_reshape(seq(9, 0.2), KL_SHAPE(3, 3))}, *b[3], *ya, *yb;
    for (int i = 0; i < 3; i++) b[i] = kl_clone(a[i]);
    kl_fn *f = kl_compile(updates, NULL, mode(KL_COMPILE_FUSE));
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(f, a, 3, &ya, 1), 0);
        assert_int_equal(updates(NULL, b, 3, &yb, 1), 0);
        for (int i = 0; i < 3; i++) assert_same(a[i], b[i]);
        assert_true(ya == a[2]);
    }
    char text[4096];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    /* x's update is written by its kernel (output 0 into input 0); z's
     * kernel reads z transposed (the clone fuses away), so writing z while
     * reading it would be wrong: its copy stays */
    assert_null(strstr(text, "copy_back(%0"));
    assert_non_null(strstr(text, "write_into=[0]"));
    assert_non_null(strstr(text, "copy_back(%2"));
    kl_fn_release(f);
}

static int counter;
static int side_effect(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(in[0], counter++);
    return out[0] ? 0 : -1;
}

static void compile_check_catches_baked_side_effects(void **state) {
    (void)state;
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_fn *f = kl_compile(chain, NULL, NULL);
    kl_tensor *x = seq(5, 1), *y;
    kl_tensor *in[2] = {x, x};
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    kl_fn_release(f);
    counter = 0;
    kl_fn *g = kl_compile(side_effect, NULL, NULL);
    /* the trace bakes counter = 0; the check's eager run sees 1, 2, ... */
    int rc = kl_fn_call(g, &x, 1, &y, 1);
    unsetenv("KL_COMPILE_CHECK");
    assert_int_equal(rc, -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "KL_COMPILE_CHECK: fn: compiled output 1 differs from eager");
    kl_fn_release(g);
}

static void compile_env_off_runs_eagerly(void **state) {
    (void)state;
    setenv("KL_COMPILE", "0", 1);
    kl_fn *f = kl_compile(chain, NULL, NULL);
    kl_tensor *x = seq(5, 1), *y;
    kl_tensor *in[2] = {x, x};
    int rc = kl_fn_call(f, in, 2, &y, 1);
    unsetenv("KL_COMPILE");
    assert_int_equal(rc, 0);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 0);
    assert_int_equal(st.eager_calls, 1);
    kl_fn_release(f);
    kl_fn *off = kl_compile(chain, NULL, mode(KL_COMPILE_OFF));
    assert_int_equal(kl_fn_call(off, in, 2, &y, 1), 0);
    kl_fn_get_stats(off, &st);
    assert_int_equal(st.traces, 0);
    kl_fn_release(off);
}

static int identity_and_dup(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *s = kl_sum(in[0], KL_ALL_DIMS, false);
    out[0] = in[0];
    out[1] = s;
    out[2] = s;
    out[3] = kl_reshape(in[0], KL_SHAPE(-1));
    return 0;
}

static void outputs_may_be_inputs_views_or_repeated(void **state) {
    (void)state;
    kl_fn *f = kl_compile(identity_and_dup, NULL, NULL);
    kl_tensor *x = kl_reshape(seq(4, 1), KL_SHAPE(2, 2)), *y[4];
    for (int call = 0; call < 2; call++) {
        kl_scope_begin();
        assert_int_equal(kl_fn_call(f, &x, 1, y, 4), 0);
        assert_ptr_equal(y[0], x);
        assert_ptr_equal(y[1], y[2]);
        assert_true(kl_item(y[1]) == -2);
        assert_int_equal(kl_shares_storage(y[3], x), 1);
        kl_scope_end();
    }
    kl_fn_release(f);
}

static void bad_arguments(void **state) {
    (void)state;
    assert_null(kl_compile(NULL, NULL, NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "fn is NULL");
    kl_compile_options o = kl_compile_options_default();
    o.recompile_limit = 0;
    assert_null(kl_compile(chain, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "recompile_limit");
    kl_fn *f = kl_compile(chain, NULL, NULL);
    kl_tensor *x = seq(3, 1), *y;
    kl_tensor *in[2] = {x, x};
    assert_int_equal(kl_fn_call(NULL, in, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "compiled function is NULL");
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, in, 1, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "fn takes 2 inputs");
    kl_tensor *bad[2] = {x, NULL};
    assert_int_equal(kl_fn_call(f, bad, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "tensor argument 2 is NULL");
    /* fn's own error on a new signature: reported, nothing cached */
    kl_tensor *z = kl_ones(KL_SHAPE(4), KL_F32);
    kl_tensor *mism[2] = {x, z};
    assert_int_equal(kl_fn_call(f, mism, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "cannot broadcast");
    /* a device the inputs do not share: the same clear error as eager */
    kl_tensor *m = kl_empty_on(KL_SHAPE(3), KL_F32, KL_DEVICE_META);
    kl_tensor *dev[2] = {x, m};
    assert_int_equal(kl_fn_call(f, dev, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
    kl_fn_release(f);
    assert_int_equal(kl_fn_graph_text(NULL, NULL, 0), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "fn_graph_text");
}

static void dce_keeps_effects(void **state) {
    (void)state;
    /* unused ops vanish from the optimized graph; in-place writes to inputs
     * stay, functionalized: a pure op and a write-back into the input */
    kl_fn *f = kl_compile(sgd, NULL, mode(KL_COMPILE_NO_FUSE));
    kl_tensor *w = kl_clone(kl_ones(KL_SHAPE(2), KL_F32)), *g = kl_ones(KL_SHAPE(2), KL_F32), *y;
    kl_tensor *in[2] = {w, g};
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    char buf[1024];
    kl_fn_graph_text(f, buf, sizeof buf);
    assert_null(strstr(buf, "sub_("));
    assert_non_null(strstr(buf, "= sub(%0, "));
    assert_non_null(strstr(buf, "copy_back(%0, "));
    kl_fn_release(f);
}

/* the sum of all inputs, written in place into the last one */
static int sum_into_last(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_out;
    kl_tensor *acc = in[0];
    for (int i = 1; i < n_in - 1; i++) acc = kl_add(acc, in[i]);
    out[0] = kl_add_inplace(in[n_in - 1], acc);
    return out[0] ? 0 : -1;
}

/* n inputs; each call gives the same tensors except that the last input is,
 * or is not, input 37 (or 5) */
static void sharing_is_guarded(int n) {
    kl_fn *f = kl_compile(sum_into_last, NULL, mode(KL_COMPILE_NO_FUSE));
    kl_tensor *in[150], *ein[150], *y;
    int k = n > 40 ? 36 : 4;
    for (int i = 0; i < n; i++) in[i] = kl_full(KL_SHAPE(3), i + 1, KL_F32);
    assert_int_equal(kl_fn_call(f, in, n, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, in, n, &y, 1), 0);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.cache_hits, 1);
    /* the last input is now input k: a new signature, and the write lands in both */
    kl_tensor *last = in[n - 1], *shared = kl_clone(in[k]);
    in[n - 1] = in[k] = shared;
    for (int i = 0; i < n; i++) ein[i] = in[i];
    ein[k] = ein[n - 1] = kl_clone(shared);
    assert_int_equal(kl_fn_call(f, in, n, &y, 1), 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    char want[80];
    snprintf(want, sizeof want, "input %d now shares storage with input %d", n, k + 1);
    assert_string_equal(st.last_reason, want);
    assert_int_equal(sum_into_last(NULL, ein, n, &y, 1), 0);
    assert_same(shared, ein[k]);
    /* and back: the first signature hits again */
    in[n - 1] = last;
    assert_int_equal(kl_fn_call(f, in, n, &y, 1), 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.cache_hits, 2);
    kl_fn_release(f);
}

static void input_sharing_is_guarded_for_many_inputs(void **state) {
    (void)state;
    sharing_is_guarded(12);  /* past the pairwise scan: the table on the stack */
    sharing_is_guarded(150); /* past the on-stack limits: both on the heap */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(traces_once_and_hits_the_cache),
        KT_TEST(graph_text_is_stable),
        KT_TEST(recompiles_name_the_guard),
        KT_TEST(recompile_limit_falls_back),
        KT_TEST(data_dependent_op_runs_eagerly),
        KT_TEST(captured_tensors_are_read_each_call),
        KT_TEST(inplace_writes_reach_the_inputs),
        KT_TEST(random_ops_draw_fresh_numbers),
        KT_TEST(gradients_flow_through_compiled_calls),
        KT_TEST(training_steps_compile_whole),
        KT_TEST(dropout_backward_reuses_the_mask),
        KT_TEST(attention_step_of_issue_15_compiles),
        KT_TEST(compiled_training_steps_with_composites),
        KT_TEST(compiled_forwards_with_composites_differentiate),
        KT_TEST(batch_norm_buffers_are_written_back),
        KT_TEST(cpu_fused_composites_stay_whole),
        KT_TEST(cpu_conv_gradients_stay_whole),
        KT_TEST(dropout2d_compiled_matches_eager),
        KT_TEST(kernels_write_updates_in_place),
        KT_TEST(compile_check_catches_baked_side_effects),
        KT_TEST(compile_env_off_runs_eagerly),
        KT_TEST(outputs_may_be_inputs_views_or_repeated),
        KT_TEST(bad_arguments),
        KT_TEST(dce_keeps_effects),
        KT_TEST(input_sharing_is_guarded_for_many_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
