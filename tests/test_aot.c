/*
 * test_aot.c — differentiable compiled functions (src/trace/aot.c): the
 * forward compiled from fn, the backward traced from it and compiled, one
 * autograd node per call, backward from eager code.
 *
 * Models (digits MLP, a small CNN, an attention block, random elementwise
 * networks) train side by side eagerly and compiled for many SGD steps from
 * equal parameters: losses and gradients agree at every step within
 * rtol 1e-4, atol 1e-5 (f32; fused row kernels and the composites'
 * decompositions sum in other orders than eager's kernels, so equality is
 * not bitwise; elementwise kernels are). The op-by-op fallback is not taken
 * (kl_fn_stats.opbyop_grad_calls), kernel counts show both graphs fused,
 * replacing a captured parameter recompiles, create_graph replays op by op,
 * and the documented fallbacks give eager's gradients.
 */
#include "harness.h"

#include <stdlib.h>

extern int tr_aot_recompute; /* src/trace/aot.h: 0 saves instead of recomputing */

#define RTOL 1e-4
#define ATOL 1e-5

static const kl_compile_options *mode(kl_compile_mode m) {
    static kl_compile_options o;
    o = kl_compile_options_default();
    o.mode = m;
    return &o;
}

static kl_tensor *leaf(kl_tensor *t) {
    kl_tensor *l = kl_detach(kl_clone(t));
    assert_non_null(l);
    assert_int_equal(kl_set_requires_grad(l, true), 0);
    return l;
}

static void assert_close(const char *what, int step, kl_tensor *c, kl_tensor *e) {
    assert_non_null(c);
    assert_non_null(e);
    int ok = kl_allclose(c, e, RTOL, ATOL, false);
    if (ok != 1) {
        print_error("%s differs from eager at step %d\n", what, step);
        kl_print(c);
        kl_print(e);
    }
    assert_int_equal(ok, 1);
}

/* ---- models: params captured through the user pointer ---------------------------------- */

typedef struct model {
    int kind, np;
    kl_tensor *p[6];
} model;

enum { MLP, CNN, ATTN };

static kl_tensor *model_loss(const model *m, kl_tensor *const *p, kl_tensor *const *in) {
    switch (m->kind) {
    case MLP: /* digits: linear / relu / linear / cross_entropy */
        return kl_cross_entropy(kl_linear(kl_relu(kl_linear(in[0], p[0], p[1])), p[2], p[3]), in[1], KL_REDUCE_MEAN,
                                0);
    case CNN: { /* conv2d / relu / max_pool / linear / cross_entropy */
        kl_conv2d_options o = kl_conv2d_options_default();
        o.padding[0] = o.padding[1] = 1;
        kl_pool2d_options po = kl_pool2d_options_default(2);
        kl_tensor *h = kl_max_pool2d(kl_relu(kl_conv2d(in[0], p[0], p[1], &o)), &po);
        return kl_cross_entropy(kl_linear(kl_flatten(h, 1, -1), p[2], p[3]), in[1], KL_REDUCE_MEAN, 0);
    }
    default: /* attention block: layer_norm(q) attends over k, v; weighted sum */
        return kl_sum(kl_mul(kl_scaled_dot_product_attention(kl_layer_norm(in[0], 1, p[0], p[1], 1e-5), in[1], in[2],
                                                             NULL, true, 0),
                             in[3]),
                      KL_ALL_DIMS, false);
    }
}

static int model_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const model *m = u;
    out[0] = model_loss(m, m->p, in);
    return out[0] ? 0 : -1;
}

/* The whole step (loss and gradients in one graph), for kernel counts. */
static int model_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const model *m = u;
    kl_tensor *p[6];
    for (int i = 0; i < m->np; i++) {
        p[i] = kl_detach(m->p[i]);
        if (!p[i] || kl_set_requires_grad(p[i], true)) return -1;
    }
    kl_tensor *loss = model_loss(m, p, in);
    if (!loss || kl_autograd_grad(1, &loss, NULL, m->np, p, out, NULL)) return -1;
    out[m->np] = loss;
    return 0;
}

static void make_model(int kind, model *m) {
    kl_manual_seed(11 + kind);
    m->kind = kind;
    switch (kind) {
    case MLP:
        m->np = 4;
        m->p[0] = kl_mul_scalar(kl_randn(KL_SHAPE(32, 64), KL_F32), 0.15);
        m->p[1] = kl_mul_scalar(kl_randn(KL_SHAPE(32), KL_F32), 0.1);
        m->p[2] = kl_mul_scalar(kl_randn(KL_SHAPE(10, 32), KL_F32), 0.2);
        m->p[3] = kl_mul_scalar(kl_randn(KL_SHAPE(10), KL_F32), 0.1);
        break;
    case CNN:
        m->np = 4;
        m->p[0] = kl_mul_scalar(kl_randn(KL_SHAPE(4, 1, 3, 3), KL_F32), 0.3);
        m->p[1] = kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1);
        m->p[2] = kl_mul_scalar(kl_randn(KL_SHAPE(10, 64), KL_F32), 0.1);
        m->p[3] = kl_mul_scalar(kl_randn(KL_SHAPE(10), KL_F32), 0.1);
        break;
    default:
        m->np = 2;
        m->p[0] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(8), KL_F32), 0.1), 1);
        m->p[1] = kl_mul_scalar(kl_randn(KL_SHAPE(8), KL_F32), 0.1);
        break;
    }
    for (int i = 0; i < m->np; i++) m->p[i] = leaf(m->p[i]);
}

/* Inputs of step s; in[0] is a non-leaf requiring grad for ATTN (its
 * gradient flows on into xl's graph: *xl receives it). */
static int make_inputs(int kind, int s, kl_tensor **in, kl_tensor **xl) {
    kl_manual_seed(1000 + s);
    *xl = NULL;
    switch (kind) {
    case MLP:
        in[0] = kl_randn(KL_SHAPE(16, 64), KL_F32);
        in[1] = kl_randint(0, 10, KL_SHAPE(16), KL_I64);
        return 2;
    case CNN:
        in[0] = kl_randn(KL_SHAPE(4, 1, 8, 8), KL_F32);
        in[1] = kl_randint(0, 10, KL_SHAPE(4), KL_I64);
        return 2;
    default:
        *xl = leaf(kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32));
        in[0] = kl_mul_scalar(*xl, 1.5);
        in[1] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[2] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        return 4;
    }
}

static void sgd(model *m, double lr) {
    kl_no_grad_begin();
    for (int i = 0; i < m->np; i++) {
        assert_non_null(kl_sub_inplace(m->p[i], kl_mul_scalar(kl_grad(m->p[i]), lr)));
        assert_int_equal(kl_zero_grad(m->p[i]), 0);
    }
    kl_no_grad_end();
}

/* Eager and compiled models from equal parameters, trained side by side. */
static void train_side_by_side(int kind, int steps) {
    model me, mc;
    make_model(kind, &me);
    make_model(kind, &mc);
    kl_fn *f = kl_compile(model_fn, &mc, mode(KL_COMPILE_FUSE));
    for (int s = 0; s < steps; s++) {
        kl_scope_begin();
        kl_tensor *in[4], *xe, *xc, *le, *lc;
        int n = make_inputs(kind, s, in, &xe);
        assert_int_equal(model_fn(&me, in, n, &le, 1), 0);
        assert_int_equal(kl_backward(le, NULL, NULL), 0);
        make_inputs(kind, s, in, &xc);
        int rc = kl_fn_call(f, in, n, &lc, 1);
        if (rc) print_error("%s\n", kl_last_error());
        assert_int_equal(rc, 0);
        assert_true(kl_requires_grad(lc));
        assert_int_equal(kl_backward(lc, NULL, NULL), 0);
        assert_close("loss", s, lc, le);
        for (int i = 0; i < me.np; i++) assert_close("parameter gradient", s, kl_grad(mc.p[i]), kl_grad(me.p[i]));
        if (xe) assert_close("gradient of a non-leaf input's leaf", s, kl_grad(xc), kl_grad(xe));
        sgd(&me, 0.1);
        sgd(&mc, 0.1);
        kl_scope_end();
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.aot_calls, steps);
    assert_int_equal(st.opbyop_grad_calls, 0);
    assert_int_equal(st.backward_calls, steps);
    assert_int_equal(st.eager_calls, 0);
    assert_string_equal(st.grad_fallback, "");
    assert_true(st.saved_bytes > 0);

    /* fused: fewer launches than ops (MLP, CNN). The op counts are the NO_FUSE whole
     * step's (composites count one op there; the forward alone, then the
     * rest: the backward) */
    kl_tensor *in[4], *xl, *lo, *outs[7];
    int n = make_inputs(kind, 0, in, &xl);
    kl_fn *fo = kl_compile(model_fn, &mc, mode(KL_COMPILE_NO_FUSE));
    kl_no_grad_begin();
    assert_int_equal(kl_fn_call(fo, in, n, &lo, 1), 0);
    kl_no_grad_end();
    kl_fn *fs = kl_compile(model_step, &mc, mode(KL_COMPILE_NO_FUSE));
    assert_int_equal(kl_fn_call(fs, in, n, outs, mc.np + 1), 0);
    kl_fn_stats so, ss;
    kl_fn_get_stats(fo, &so);
    kl_fn_get_stats(fs, &ss);
    print_message("model %d: forward %lld kernels (%lld ops), backward %lld kernels (%lld ops), saved %lld bytes\n",
                  kind, (long long)st.kernels, (long long)so.kernels, (long long)st.backward_kernels,
                  (long long)(ss.kernels - so.kernels), (long long)st.saved_bytes);
    if (kind == ATTN) {
        /* causal attention is one fused CPU op each way (causal_attention and its
         * backward, kept whole), so the block has nothing left to fuse: no more
         * launches than ops */
        assert_true(st.kernels + st.backward_kernels <= ss.kernels);
        assert_true(st.backward_kernels <= ss.kernels - so.kernels);
    } else {
        assert_true(st.kernels + st.backward_kernels < ss.kernels);
        assert_true(st.backward_kernels < ss.kernels - so.kernels);
    }
    kl_fn_release(fo);
    kl_fn_release(fs);
    kl_fn_release(f);
}

static void mlp_trains_like_eager(void **state) {
    (void)state;
    train_side_by_side(MLP, 25);
}

static void cnn_trains_like_eager(void **state) {
    (void)state;
    train_side_by_side(CNN, 15);
}

static void attention_block_trains_like_eager(void **state) {
    (void)state;
    train_side_by_side(ATTN, 15);
}

/* ---- random elementwise networks --------------------------------------------------------- */

typedef struct prog {
    int n;
    int op[12], a[12], b[12];
    kl_tensor *w; /* captured, requires grad */
} prog;

enum { P_TANH, P_SIGMOID, P_SIN, P_RELU, P_NEG, P_HALF, P_SQUARE, P_ADD, P_SUB, P_MUL, P_NOPS };

static kl_tensor *apply(int op, kl_tensor *a, kl_tensor *b) {
    switch (op) {
    case P_TANH: return kl_tanh(a);
    case P_SIGMOID: return kl_sigmoid(a);
    case P_SIN: return kl_sin(a);
    case P_RELU: return kl_relu(a);
    case P_NEG: return kl_neg(a);
    case P_HALF: return kl_mul_scalar(a, 0.5);
    case P_SQUARE: return kl_tanh(kl_mul(a, a));
    case P_ADD: return kl_add(a, b);
    case P_SUB: return kl_sub(a, b);
    default: return kl_mul(a, b);
    }
}

/* in: x [4,5] (requires grad), c [4,1]; w [5] captured. Two outputs: the
 * last value and a middle one. */
static int prog_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const prog *p = u;
    kl_tensor *v[16] = {in[0], p->w, in[1]};
    for (int i = 0; i < p->n; i++) v[3 + i] = apply(p->op[i], v[p->a[i]], v[p->b[i]]);
    out[0] = v[2 + p->n];
    out[1] = v[3 + p->n / 2];
    return out[0] && out[1] ? 0 : -1;
}

static void random_elementwise_networks(void **state) {
    (void)state;
    srand(5);
    for (int t = 0; t < 40; t++) {
        kl_scope_begin();
        prog pe = {.n = 3 + rand() % 9}, pc;
        for (int i = 0; i < pe.n; i++) {
            pe.op[i] = rand() % P_NOPS;
            pe.a[i] = rand() % (3 + i);
            pe.b[i] = rand() % (3 + i);
            if (i == pe.n - 1) pe.a[i] = 2 + i; /* the chain ends in the previous value */
        }
        kl_manual_seed(t);
        kl_tensor *w0 = kl_randn(KL_SHAPE(5), KL_F32);
        kl_tensor *x0 = kl_randn(KL_SHAPE(4, 5), KL_F32), *c = kl_randn(KL_SHAPE(4, 1), KL_F32);
        kl_tensor *r0 = kl_randn(KL_SHAPE(4, 5), KL_F32), *r1 = kl_randn(KL_SHAPE(4, 5), KL_F32);
        pc = pe;
        pe.w = leaf(w0);
        pc.w = leaf(w0);
        kl_fn *f = kl_compile(prog_fn, &pc, mode(KL_COMPILE_FUSE));
        for (int step = 0; step < 3; step++) {
            kl_tensor *xe = leaf(x0), *xc = leaf(x0), *oe[2], *oc[2];
            assert_int_equal(prog_fn(&pe, (kl_tensor *[]){xe, c}, 2, oe, 2), 0);
            int rc = kl_fn_call(f, (kl_tensor *[]){xc, c}, 2, oc, 2);
            if (rc) print_error("network %d: %s\n", t, kl_last_error());
            assert_int_equal(rc, 0);
            for (int k = 0; k < 2; k++) assert_close("output", t, oc[k], oe[k]);
            /* both outputs differentiated (the same one twice when they coincide) */
            kl_tensor *le = kl_add(kl_sum(kl_mul(oe[0], r0), KL_ALL_DIMS, false), kl_sum(kl_mul(oe[1], r1), KL_ALL_DIMS, false));
            kl_tensor *lc = kl_add(kl_sum(kl_mul(oc[0], r0), KL_ALL_DIMS, false), kl_sum(kl_mul(oc[1], r1), KL_ALL_DIMS, false));
            if (!kl_requires_grad(le)) { /* the network dropped x and w (relu(neg(...)) still keeps them) */
                assert_false(kl_requires_grad(lc));
                continue;
            }
            assert_int_equal(kl_backward(le, NULL, NULL), 0);
            assert_int_equal(kl_backward(lc, NULL, NULL), 0);
            if (kl_grad(xe)) assert_close("x gradient", t, kl_grad(xc), kl_grad(xe));
            else assert_null(kl_grad(xc));
            if (kl_grad(pe.w)) assert_close("w gradient", t, kl_grad(pc.w), kl_grad(pe.w));
            else assert_null(kl_grad(pc.w));
            kl_zero_grad(pe.w);
            kl_zero_grad(pc.w);
        }
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        assert_int_equal(st.opbyop_grad_calls, 0);
        assert_int_equal(st.aot_calls, 3);
        assert_int_equal(st.traces, 1);
        if (st.kernels > 3) print_error("network %d: %lld kernels\n", t, (long long)st.kernels);
        assert_true(st.kernels <= 3);
        kl_fn_release(f);
        kl_scope_end();
    }
}

/* ---- guards, fallbacks and special cases ------------------------------------------------- */

static void replacing_a_captured_parameter_recompiles(void **state) {
    (void)state;
    model m;
    make_model(MLP, &m);
    kl_fn *f = kl_compile(model_fn, &m, mode(KL_COMPILE_FUSE));
    kl_tensor *in[4], *xl, *l;
    int n = make_inputs(MLP, 0, in, &xl);
    assert_int_equal(kl_fn_call(f, in, n, &l, 1), 0);
    assert_int_equal(kl_backward(l, NULL, NULL), 0);
    kl_release(l); /* its node, and the accumulators holding the parameters, die */
    assert_int_equal(kl_fn_call(f, in, n, &l, 1), 0);
    kl_release(l);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    /* a new W2: fn now reads another tensor; the old one is held only by the graphs */
    kl_tensor *old = m.p[2];
    kl_no_grad_begin(); /* (a recorded op on old would keep it alive) */
    m.p[2] = leaf(kl_mul_scalar(old, 2));
    kl_no_grad_end();
    kl_release(old);
    assert_int_equal(kl_fn_call(f, in, n, &l, 1), 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_non_null(strstr(st.last_reason, "captured tensor 3"));
    assert_non_null(strstr(st.last_reason, "no longer referenced outside the compiled function (replaced?)"));
    for (int i = 0; i < m.np; i++) kl_zero_grad(m.p[i]);
    assert_int_equal(kl_backward(l, NULL, NULL), 0);
    kl_tensor *le;
    /* the gradient reaches the new parameter, equal to eager's */
    kl_tensor *g = kl_clone(kl_grad(m.p[3]));
    for (int i = 0; i < m.np; i++) kl_zero_grad(m.p[i]);
    assert_int_equal(model_fn(&m, in, n, &le, 1), 0);
    assert_int_equal(kl_backward(le, NULL, NULL), 0);
    assert_close("bias gradient after the replacement", 0, g, kl_grad(m.p[3]));
    /* a parameter that stops requiring grad: recompiled too */
    kl_set_requires_grad(m.p[0], false);
    assert_int_equal(kl_fn_call(f, in, n, &l, 1), 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 3);
    assert_non_null(strstr(st.last_reason, "no longer requires grad"));
    kl_fn_release(f);
}

/* y = tanh(x * w)^2: create_graph through the compiled node replays it op by
 * op, so the double gradient is eager's */
static int sq_tanh(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    kl_tensor *t = kl_tanh(kl_mul(in[0], (kl_tensor *)u));
    out[0] = kl_sum(kl_mul(t, t), KL_ALL_DIMS, false);
    return out[0] ? 0 : -1;
}

static void create_graph_replays_op_by_op(void **state) {
    (void)state;
    kl_manual_seed(3);
    kl_tensor *x0 = kl_randn(KL_SHAPE(3, 4), KL_F32), *w0 = kl_randn(KL_SHAPE(4), KL_F32);
    kl_tensor *xe = leaf(x0), *xc = leaf(x0), *we = leaf(w0), *wc = leaf(w0), *ye, *yc, *ge, *gc;
    kl_fn *f = kl_compile(sq_tanh, wc, mode(KL_COMPILE_FUSE));
    assert_int_equal(sq_tanh(we, &xe, 1, &ye, 1), 0);
    assert_int_equal(kl_fn_call(f, &xc, 1, &yc, 1), 0);
    kl_backward_options o = kl_backward_options_default();
    o.create_graph = true;
    assert_int_equal(kl_autograd_grad(1, &ye, NULL, 1, &xe, &ge, &o), 0);
    assert_int_equal(kl_autograd_grad(1, &yc, NULL, 1, &xc, &gc, &o), 0);
    assert_close("first gradient", 0, gc, ge);
    assert_true(kl_requires_grad(gc));
    assert_int_equal(kl_backward(kl_sum(kl_mul(ge, ge), KL_ALL_DIMS, false), NULL, NULL), 0);
    assert_int_equal(kl_backward(kl_sum(kl_mul(gc, gc), KL_ALL_DIMS, false), NULL, NULL), 0);
    assert_close("double gradient (x)", 0, kl_grad(xc), kl_grad(xe));
    assert_close("double gradient (w)", 0, kl_grad(wc), kl_grad(we));
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.aot_calls, 1);
    assert_int_equal(st.double_backward_replays, 1);
    assert_int_equal(st.backward_calls, 0);
    kl_fn_release(f);
}

/* dropout: the backward graph re-derives the forward's mask from the same
 * reservation, and every call draws a new one, as eagerly */
static int drop(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *y = kl_dropout(kl_mul(in[0], in[1]), 0.5, true);
    out[0] = kl_sum(kl_mul(y, y), KL_ALL_DIMS, false);
    return out[0] ? 0 : -1;
}

static void dropout_backward_uses_the_forward_mask(void **state) {
    (void)state;
    kl_manual_seed(4);
    kl_tensor *x0 = kl_randn(KL_SHAPE(64), KL_F32), *w = kl_randn(KL_SHAPE(64), KL_F32);
    kl_fn *f = kl_compile(drop, NULL, mode(KL_COMPILE_FUSE));
    for (int call = 0; call < 3; call++) {
        kl_tensor *xe = leaf(x0), *xc = leaf(x0), *ye, *yc;
        kl_manual_seed(50 + call);
        assert_int_equal(drop(NULL, (kl_tensor *[]){xe, w}, 2, &ye, 1), 0);
        kl_manual_seed(50 + call);
        assert_int_equal(kl_fn_call(f, (kl_tensor *[]){xc, w}, 2, &yc, 1), 0);
        kl_manual_seed(999); /* draws between forward and backward change nothing */
        kl_tensor *noise = kl_rand(KL_SHAPE(8), KL_F32);
        (void)noise;
        assert_int_equal(kl_backward(ye, NULL, NULL), 0);
        assert_int_equal(kl_backward(yc, NULL, NULL), 0);
        assert_close("loss", call, yc, ye);
        assert_close("x gradient", call, kl_grad(xc), kl_grad(xe));
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.aot_calls, 3);
    assert_int_equal(st.opbyop_grad_calls, 0);
    kl_fn_release(f);
}

/* an input written in place: documented fallback, op by op, eager's gradient */
static int writes_input(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    if (!kl_mul_scalar_inplace(in[1], 2)) return -1;
    out[0] = kl_sum(kl_mul(in[0], in[1]), KL_ALL_DIMS, false);
    return out[0] ? 0 : -1;
}

/* returns its input: documented fallback */
static int returns_input(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = in[0];
    out[1] = kl_sum(kl_exp(in[0]), KL_ALL_DIMS, false);
    return out[1] ? 0 : -1;
}

static void fallbacks_give_eager_gradients(void **state) {
    (void)state;
    kl_tensor *x0 = kl_randn(KL_SHAPE(6), KL_F32), *c0 = kl_randn(KL_SHAPE(6), KL_F32);
    kl_tensor *xe = leaf(x0), *xc = leaf(x0), *ce = kl_clone(c0), *cc = kl_clone(c0), *ye = NULL, *yc[2];
    kl_fn *f = kl_compile(writes_input, NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(writes_input(NULL, (kl_tensor *[]){xe, ce}, 2, &ye, 1), 0);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){xc, cc}, 2, yc, 1), 0);
    assert_close("input written in place", 0, cc, ce);
    assert_int_equal(kl_backward(ye, NULL, NULL), 0);
    assert_int_equal(kl_backward(yc[0], NULL, NULL), 0);
    assert_close("x gradient", 0, kl_grad(xc), kl_grad(xe));
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.opbyop_grad_calls, 1);
    assert_int_equal(st.aot_calls, 0);
    if (!strstr(st.grad_fallback, "writes in place (kl_mul_inplace)")) print_error("%s\n", st.grad_fallback);
    assert_non_null(strstr(st.grad_fallback, "writes in place (kl_mul_inplace)"));
    kl_fn_release(f);

    f = kl_compile(returns_input, NULL, mode(KL_COMPILE_FUSE));
    kl_tensor *x2 = leaf(x0);
    assert_int_equal(kl_fn_call(f, &x2, 1, yc, 2), 0);
    assert_true(yc[0] == x2);
    assert_int_equal(kl_backward(yc[1], NULL, NULL), 0);
    assert_close("x gradient", 0, kl_grad(x2), kl_exp(x0));
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.opbyop_grad_calls, 1);
    assert_non_null(strstr(st.grad_fallback, "output 1 is an input"));
    kl_fn_release(f);
}

/* an integer output beside the loss; one input passed twice */
static int with_argmax(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = kl_tanh(kl_mul(in[0], in[1]));
    out[0] = kl_sum(kl_mul(h, h), KL_ALL_DIMS, false);
    out[1] = kl_argmax(h, 0, false);
    return out[0] && out[1] ? 0 : -1;
}

static void integer_outputs_and_repeated_inputs(void **state) {
    (void)state;
    kl_tensor *x0 = kl_randn(KL_SHAPE(7), KL_F32);
    kl_tensor *xe = leaf(x0), *xc = leaf(x0), *ye[2], *yc[2];
    kl_fn *f = kl_compile(with_argmax, NULL, mode(KL_COMPILE_FUSE));
    assert_int_equal(with_argmax(NULL, (kl_tensor *[]){xe, xe}, 2, ye, 2), 0);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){xc, xc}, 2, yc, 2), 0);
    assert_int_equal(kl_equal(yc[1], ye[1]), 1);
    assert_false(kl_requires_grad(yc[1]));
    assert_int_equal(kl_backward(ye[0], NULL, NULL), 0);
    assert_int_equal(kl_backward(yc[0], NULL, NULL), 0);
    assert_close("gradient of an input used twice", 0, kl_grad(xc), kl_grad(xe));
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.aot_calls, 1);
    /* a second backward through the node: the saved values are gone, as eagerly */
    assert_int_equal(kl_backward(yc[0], NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "a second time");
    kl_fn_release(f);
}

/* a saved input modified before the backward: an error, as eagerly */
static void modified_saved_input_is_an_error(void **state) {
    (void)state;
    kl_tensor *x = leaf(kl_randn(KL_SHAPE(5), KL_F32)), *c = kl_randn(KL_SHAPE(5), KL_F32), *y;
    kl_fn *f = kl_compile(with_argmax, NULL, mode(KL_COMPILE_FUSE));
    kl_tensor *y2[2];
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, c}, 2, y2, 2), 0);
    y = y2[0];
    assert_non_null(kl_add_scalar_inplace(c, 1));
    assert_int_equal(kl_backward(y, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "input 2 of compiled fn");
    kl_fn_release(f);
}

/* h = x @ w, then an elementwise tail reading h three ways: with the rule
 * only h is saved (the tail is recomputed in the backward, fused with it);
 * saving everything also keeps tanh(h) and sigmoid(h). The digits MLP saves
 * relu(x W1^T + b1) and the logits either way (the relu's input is no saved
 * value), as PyTorch eager does. */
static int mm_tail(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    kl_tensor *h = kl_matmul(in[0], (kl_tensor *)u);
    out[0] = kl_sum(kl_add(kl_mul(kl_tanh(h), kl_sigmoid(h)), kl_mul(h, h)), KL_ALL_DIMS, false);
    return out[0] ? 0 : -1;
}

static void recompute_saves_memory(void **state) {
    (void)state;
    int64_t bytes[2], mlp[2];
    kl_tensor *w = leaf(kl_randn(KL_SHAPE(8, 16), KL_F32)), *x = kl_randn(KL_SHAPE(4, 8), KL_F32);
    for (int r = 0; r < 2; r++) {
        tr_aot_recompute = r;
        kl_fn *f = kl_compile(mm_tail, w, mode(KL_COMPILE_FUSE));
        kl_tensor *l, *le;
        assert_int_equal(kl_fn_call(f, &x, 1, &l, 1), 0);
        assert_int_equal(kl_backward(l, NULL, NULL), 0);
        kl_tensor *g = kl_clone(kl_grad(w));
        kl_zero_grad(w);
        assert_int_equal(mm_tail(w, &x, 1, &le, 1), 0);
        assert_int_equal(kl_backward(le, NULL, NULL), 0);
        assert_close("gradient", r, g, kl_grad(w));
        kl_zero_grad(w);
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        bytes[r] = st.saved_bytes;
        kl_fn_release(f);
        model m;
        make_model(MLP, &m);
        f = kl_compile(model_fn, &m, mode(KL_COMPILE_FUSE));
        kl_tensor *in[4], *xl;
        int n = make_inputs(MLP, 0, in, &xl);
        assert_int_equal(kl_fn_call(f, in, n, &l, 1), 0);
        kl_fn_get_stats(f, &st);
        mlp[r] = st.saved_bytes;
        kl_fn_release(f);
    }
    tr_aot_recompute = 1;
    print_message("matmul + elementwise tail [4,16]: saved %lld bytes with the rule, %lld saving everything\n",
                  (long long)bytes[1], (long long)bytes[0]);
    print_message("digits MLP [16,64]->32->10: saved %lld bytes with the rule, %lld saving everything\n",
                  (long long)mlp[1], (long long)mlp[0]);
    assert_int_equal(bytes[1], 4 * 16 * 4);
    assert_int_equal(bytes[0], 3 * 4 * 16 * 4);
    assert_int_equal(mlp[1], (16 * 32 + 16 * 10) * 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(mlp_trains_like_eager),
        KT_TEST(cnn_trains_like_eager),
        KT_TEST(attention_block_trains_like_eager),
        KT_TEST(random_elementwise_networks),
        KT_TEST(replacing_a_captured_parameter_recompiles),
        KT_TEST(create_graph_replays_op_by_op),
        KT_TEST(dropout_backward_uses_the_forward_mask),
        KT_TEST(fallbacks_give_eager_gradients),
        KT_TEST(integer_outputs_and_repeated_inputs),
        KT_TEST(modified_saved_input_is_an_error),
        KT_TEST(recompute_saves_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
