/*
 * test_cuda_aot.c — differentiable compiled functions on CUDA tensors
 * (src/trace/aot.c over the nvrtc backend): a compiled forward called in
 * grad mode with CUDA parameters requiring grad runs a compiled forward
 * graph on the device, saves what the backward needs in device memory and
 * records one autograd node, whose backward runs the compiled backward
 * graph on the device; and whole training steps (kl_autograd_grad inside
 * the compiled function, an AdamW update in place) on CUDA; and the
 * documented op-by-op fallback (batch_norm's running buffers, written in
 * place) on the device.
 *
 * Every model trains side by side with the same model eagerly on the CPU
 * from equal parameters: losses and gradients within rtol 1e-4, atol 1e-5
 * at every step (test_aot.c's tolerance: fused row kernels fold in a tree
 * on the device, cuBLAS and OpenBLAS sum in other orders; elementwise
 * kernels are bitwise). Runs on the emulated device in CI
 * (test_cuda_aot_emu); without a device every test skips with the reason.
 */
#include "harness.h"

#include "cuda_harness.h"

static const char *OP = "cuda_aot_test";

#define RTOL 1e-4
#define ATOL 1e-5

/* The emulated device needs a host C++ compiler for its modules. */
static void skip_without_module_compiler(void) {
    if (strstr(kl_last_error(), "no host C++ compiler")) {
        print_message("skipped: %s\n", kl_last_error());
        kl_clear_error();
        skip();
    }
}

static kl_tensor *leaf(kl_tensor *t) {
    kl_tensor *l = kl_detach(kl_clone(t));
    assert_non_null(l);
    assert_int_equal(kl_set_requires_grad(l, true), 0);
    return l;
}

/* c (on CUDA) against e (CPU) within the tolerance above. */
static void assert_close(const char *what, int step, kl_tensor *c, kl_tensor *e) {
    if (!c) print_error("%s at step %d: missing (%s)\n", what, step, kl_last_error());
    assert_non_null(c);
    assert_non_null(e);
    assert_int_equal(kl_device_of(c).type, KL_CUDA);
    kl_tensor *h = host(c);
    int ok = kl_allclose(h, e, RTOL, ATOL, false);
    if (ok != 1) {
        print_error("%s differs from CPU eager at step %d\n", what, step);
        kl_print(h);
        kl_print(e);
    }
    assert_int_equal(ok, 1);
}

/* ---- models ---------------------------------------------------------------------------- */

enum { MLP, ATTN, CNN, NMODELS };
static const char *const model_names[] = {"MLP (layer_norm, cross_entropy)", "attention block (sdpa)",
                                          "CNN (conv2d, batch_norm, max_pool2d)"};

typedef struct model {
    int kind, np;
    kl_tensor *p[6];
} model;

static kl_tensor *model_loss(int kind, kl_tensor *const *p, kl_tensor *const *in) {
    switch (kind) {
    case MLP: { /* linear / gelu / layer_norm / linear / cross_entropy */
        kl_tensor *h = kl_layer_norm(kl_gelu(kl_linear(in[0], p[0], p[1])), 1, p[2], p[3], 1e-5);
        return kl_cross_entropy(kl_linear(h, p[4], p[5]), in[1], KL_REDUCE_MEAN, 0);
    }
    case ATTN: { /* layer_norm(x) projected to q attends causally over k, v; weighted sum */
        kl_tensor *q = kl_linear(kl_layer_norm(in[0], 1, p[0], p[1], 1e-5), p[2], NULL);
        kl_tensor *y = kl_scaled_dot_product_attention(q, in[1], in[2], NULL, true, 0);
        return kl_sum(kl_mul(y, in[3]), KL_ALL_DIMS, false);
    }
    default: { /* conv2d / batch_norm (batch statistics) / relu / max_pool2d / linear / cross_entropy */
        kl_conv2d_options o = kl_conv2d_options_default();
        o.padding[0] = o.padding[1] = 1;
        kl_pool2d_options po = kl_pool2d_options_default(2);
        kl_tensor *c = kl_batch_norm(kl_conv2d(in[0], p[0], NULL, &o), NULL, NULL, p[1], p[2], true, 0.1, 1e-5);
        kl_tensor *h = kl_max_pool2d(kl_relu(c), &po);
        return kl_cross_entropy(kl_linear(kl_flatten(h, 1, -1), p[3], p[4]), in[1], KL_REDUCE_MEAN, 0);
    }
    }
}

static int model_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const model *m = u;
    out[0] = model_loss(m->kind, m->p, in);
    return out[0] ? 0 : -1;
}

/* The parameters' values (CPU), from the model's seed. */
static int model_params(int kind, kl_tensor **p) {
    kl_manual_seed(31 + kind);
    switch (kind) {
    case MLP:
        p[0] = kl_mul_scalar(kl_randn(KL_SHAPE(16, 12), KL_F32), 0.3);
        p[1] = kl_mul_scalar(kl_randn(KL_SHAPE(16), KL_F32), 0.1);
        p[2] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(16), KL_F32), 0.1), 1);
        p[3] = kl_mul_scalar(kl_randn(KL_SHAPE(16), KL_F32), 0.1);
        p[4] = kl_mul_scalar(kl_randn(KL_SHAPE(5, 16), KL_F32), 0.3);
        p[5] = kl_mul_scalar(kl_randn(KL_SHAPE(5), KL_F32), 0.1);
        return 6;
    case ATTN:
        p[0] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(8), KL_F32), 0.1), 1);
        p[1] = kl_mul_scalar(kl_randn(KL_SHAPE(8), KL_F32), 0.1);
        p[2] = kl_mul_scalar(kl_randn(KL_SHAPE(8, 8), KL_F32), 0.35);
        return 3;
    default:
        /* no conv bias: batch_norm cancels it (its gradient is rounding noise, which Adam would amplify) */
        p[0] = kl_mul_scalar(kl_randn(KL_SHAPE(4, 1, 3, 3), KL_F32), 0.3);
        p[1] = kl_add_scalar(kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1), 1);
        p[2] = kl_mul_scalar(kl_randn(KL_SHAPE(4), KL_F32), 0.1);
        p[3] = kl_mul_scalar(kl_randn(KL_SHAPE(5, 64), KL_F32), 0.1);
        p[4] = kl_mul_scalar(kl_randn(KL_SHAPE(5), KL_F32), 0.1);
        return 5;
    }
}

/* A model's parameters as leaves on dev. */
static void make_model(int kind, kl_device dev, model *m) {
    kl_tensor *p[6];
    m->kind = kind;
    m->np = model_params(kind, p);
    for (int i = 0; i < m->np; i++) m->p[i] = leaf(kl_to_device(p[i], dev));
}

/* The inputs of step s on dev; for ATTN in[0] is a non-leaf requiring grad
 * (1.5 * *xl: its gradient flows on into the leaf *xl's). */
static int make_inputs(int kind, int s, kl_device dev, kl_tensor **in, kl_tensor **xl) {
    kl_manual_seed(2000 + s);
    *xl = NULL;
    int n;
    switch (kind) {
    case MLP:
        in[0] = kl_randn(KL_SHAPE(8, 12), KL_F32);
        in[1] = kl_randint(0, 5, KL_SHAPE(8), KL_I64);
        n = 2;
        break;
    case ATTN:
        in[0] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[1] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[2] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 2, 6, 8), KL_F32);
        n = 4;
        break;
    default:
        in[0] = kl_randn(KL_SHAPE(4, 1, 8, 8), KL_F32);
        in[1] = kl_randint(0, 5, KL_SHAPE(4), KL_I64);
        n = 2;
        break;
    }
    for (int i = 0; i < n; i++) in[i] = kl_to_device(in[i], dev);
    if (kind == ATTN) {
        *xl = leaf(in[0]);
        in[0] = kl_mul_scalar(*xl, 1.5);
    }
    return n;
}

static void sgd(model *m, double lr) {
    kl_no_grad_begin();
    for (int i = 0; i < m->np; i++) {
        assert_non_null(kl_sub_inplace(m->p[i], kl_mul_scalar(kl_grad(m->p[i]), lr)));
        assert_int_equal(kl_zero_grad(m->p[i]), 0);
    }
    kl_no_grad_end();
}

/* ---- compiled forwards, backward from eager code ----------------------------------------- */

/* A CPU eager model and a CUDA compiled one from equal parameters, trained
 * side by side with SGD: the CUDA call is one aot call (compiled forward and
 * backward, no op-by-op fallback), and the values it saves live in device
 * memory: the device bytes allocated grow by at least saved_bytes over the
 * forward call and are given back once the step's tensors are. */
static void train_side_by_side(int kind, int steps) {
    model me, mc;
    make_model(kind, KL_DEVICE_CPU, &me);
    make_model(kind, CUDA0, &mc);
    kl_fn *f = kl_compile(model_fn, &mc, NULL);
    assert_non_null(f);
    for (int s = 0; s < steps; s++) {
        kl_scope_begin();
        kl_tensor *in[4], *xe, *xc, *le, *lc;
        int n = make_inputs(kind, s, KL_DEVICE_CPU, in, &xe);
        assert_int_equal(model_fn(&me, in, n, &le, 1), 0);
        assert_int_equal(kl_backward(le, NULL, NULL), 0);
        make_inputs(kind, s, CUDA0, in, &xc);
        kl_cuda_mem_stats m0, m1, m2;
        assert_int_equal(kl_cuda_memory_stats(0, &m0), 0);
        int rc = kl_fn_call(f, in, n, &lc, 1);
        if (rc) {
            skip_without_module_compiler();
            print_error("%s: %s\n", model_names[kind], kl_last_error());
        }
        assert_int_equal(rc, 0);
        assert_true(kl_requires_grad(lc));
        assert_int_equal(kl_cuda_memory_stats(0, &m1), 0);
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        if (st.aot_calls != s + 1)
            print_error("%s: not an aot call (%s; op by op: %s)\n", model_names[kind], st.last_reason, st.grad_fallback);
        assert_int_equal(st.aot_calls, s + 1);
        assert_true(st.saved_bytes > 0);
        assert_true(m1.allocated_bytes - m0.allocated_bytes >= st.saved_bytes);
        rc = kl_backward(lc, NULL, NULL);
        if (rc) print_error("%s backward: %s\n", model_names[kind], kl_last_error());
        assert_int_equal(rc, 0);
        assert_close("loss", s, lc, le);
        for (int i = 0; i < me.np; i++) assert_close("parameter gradient", s, kl_grad(mc.p[i]), kl_grad(me.p[i]));
        if (xe) assert_close("gradient of a non-leaf input's leaf", s, kl_grad(xc), kl_grad(xe));
        sgd(&me, 0.1);
        sgd(&mc, 0.1);
        kl_scope_end();
        /* the saved values went with the node (after the first call, which may
         * leave constants of the graph on the device) */
        assert_int_equal(kl_cuda_memory_stats(0, &m2), 0);
        if (s > 0) assert_true(m2.allocated_bytes <= m0.allocated_bytes);
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    print_message("%s: forward %lld launches, backward %lld, %lld bytes saved on the device per call\n",
                  model_names[kind], (long long)st.kernels, (long long)st.backward_kernels, (long long)st.saved_bytes);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.aot_calls, steps);
    assert_int_equal(st.opbyop_grad_calls, 0);
    assert_int_equal(st.backward_calls, steps);
    assert_int_equal(st.eager_calls, 0);
    assert_string_equal(st.grad_fallback, "");
    kl_fn_release(f);
}

static void mlp_trains_like_cpu_eager(void **s) {
    (void)s;
    NEED_CUDA();
    train_side_by_side(MLP, 5);
}

static void attention_block_trains_like_cpu_eager(void **s) {
    (void)s;
    NEED_CUDA();
    train_side_by_side(ATTN, 4);
}

static void cnn_trains_like_cpu_eager(void **s) {
    (void)s;
    NEED_CUDA();
    train_side_by_side(CNN, 4);
}

/* batch_norm with running buffers writes them in place: the documented
 * fallback runs the graph op by op (still on the device, autograd recording
 * each op), with the CPU's gradients and buffers. */
typedef struct bn_ctx {
    kl_tensor *w, *b, *rm, *rv;
} bn_ctx;

static int bn_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const bn_ctx *c = u;
    kl_tensor *y = kl_batch_norm(in[0], c->rm, c->rv, c->w, c->b, true, 0.1, 1e-5);
    out[0] = kl_sum(kl_mul(kl_tanh(y), in[1]), KL_ALL_DIMS, false);
    return out[0] ? 0 : -1;
}

static void batch_norm_buffers_run_op_by_op(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(5);
    kl_tensor *x = kl_randn(KL_SHAPE(4, 3, 5, 5), KL_F32), *g = kl_randn(KL_SHAPE(4, 3, 5, 5), KL_F32);
    kl_tensor *w = kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5), *b = kl_randn(KL_SHAPE(3), KL_F32);
    bn_ctx c[2];
    for (int d = 0; d < 2; d++) {
        kl_device dev = d ? CUDA0 : KL_DEVICE_CPU;
        c[d] = (bn_ctx){leaf(kl_to_device(w, dev)), leaf(kl_to_device(b, dev)),
                        kl_to_device(kl_zeros(KL_SHAPE(3), KL_F32), dev), kl_to_device(kl_ones(KL_SHAPE(3), KL_F32), dev)};
    }
    kl_fn *f = kl_compile(bn_fn, &c[1], NULL);
    kl_tensor *dx = kl_to_device(x, CUDA0), *dg = kl_to_device(g, CUDA0);
    for (int step = 0; step < 2; step++) {
        kl_tensor *le = NULL, *lc = NULL;
        assert_int_equal(bn_fn(&c[0], (kl_tensor *[]){x, g}, 2, &le, 1), 0);
        assert_int_equal(kl_backward(le, NULL, NULL), 0);
        int rc = kl_fn_call(f, (kl_tensor *[]){dx, dg}, 2, &lc, 1);
        if (rc) skip_without_module_compiler();
        assert_int_equal(rc, 0);
        assert_int_equal(kl_backward(lc, NULL, NULL), 0);
        assert_close("loss", step, lc, le);
        assert_close("weight gradient", step, kl_grad(c[1].w), kl_grad(c[0].w));
        assert_close("bias gradient", step, kl_grad(c[1].b), kl_grad(c[0].b));
        assert_close("running mean", step, c[1].rm, c[0].rm);
        assert_close("running var", step, c[1].rv, c[0].rv);
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.aot_calls, 0);
    assert_int_equal(st.opbyop_grad_calls, 2);
    assert_non_null(strstr(st.grad_fallback, "fn writes in place"));
    kl_fn_release(f);
}

/* ---- whole training steps ---------------------------------------------------------------- */

/* One step as one compiled function: in = {inputs..., parameters (no grad),
 * first moments, second moments, lr / bc1 and 1 / bc2 (0-dim CPU tensors, so
 * the bias corrections change without a retrace)}; the gradients come from
 * kl_autograd_grad inside, then AdamW (weight decay 0.01) updates the
 * parameters and moments in place; out = {loss}. */
typedef struct step_ctx {
    int kind, nin, np;
} step_ctx;

static int whole_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const step_ctx *c = u;
    kl_tensor *const *w = in + c->nin, *const *m = w + c->np, *const *v = m + c->np;
    kl_tensor *s1 = v[c->np], *s2 = v[c->np + 1], *p[6], *g[6];
    for (int i = 0; i < c->np; i++) {
        p[i] = kl_detach(w[i]);
        if (!p[i] || kl_set_requires_grad(p[i], true)) return -1;
    }
    kl_tensor *loss = model_loss(c->kind, p, in);
    if (!loss || kl_autograd_grad(1, &loss, NULL, c->np, p, g, NULL)) return -1;
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    for (int i = 0; i < c->np; i++) {
        kl_mul_scalar_inplace(w[i], 1 - lr * wd);
        kl_add_inplace(kl_mul_scalar_inplace(m[i], b1), kl_mul_scalar(g[i], 1 - b1));
        kl_add_inplace(kl_mul_scalar_inplace(v[i], b2), kl_mul_scalar(kl_mul(g[i], g[i]), 1 - b2));
        kl_tensor *den = kl_add_scalar(kl_sqrt(kl_mul(v[i], s2)), eps);
        if (!kl_sub_inplace(w[i], kl_mul(kl_div(m[i], den), s1))) return -1;
    }
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

/* The whole step compiled on CUDA against the same function run eagerly on
 * the CPU, for several steps: losses, parameters and moments within the
 * tolerance, one trace, no eager call. */
static void whole_step_side_by_side(int kind, int steps) {
    kl_tensor *p0[6];
    step_ctx c = {.kind = kind, .np = model_params(kind, p0)};
    kl_tensor *state[2][18]; /* [device][parameters, m, v] */
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < c.np; i++) {
            kl_device dev = d ? CUDA0 : KL_DEVICE_CPU;
            state[d][i] = kl_to_device(kl_clone(p0[i]), dev);
            state[d][c.np + i] = kl_zeros_like(state[d][i]);
            state[d][2 * c.np + i] = kl_zeros_like(state[d][i]);
        }
    kl_fn *f = kl_compile(whole_step, &c, NULL);
    assert_non_null(f);
    for (int s = 0; s < steps; s++) {
        kl_scope_begin();
        const double bc1 = 1 - pow(0.9, s + 1), bc2 = 1 - pow(0.999, s + 1);
        kl_tensor *args[2][32], *loss[2], *xl;
        for (int d = 0; d < 2; d++) {
            c.nin = make_inputs(kind, s, d ? CUDA0 : KL_DEVICE_CPU, args[d], &xl);
            if (xl) args[d][0] = kl_detach(args[d][0]); /* plain inputs here */
            memcpy(args[d] + c.nin, state[d], sizeof(kl_tensor *) * (size_t)(3 * c.np));
            args[d][c.nin + 3 * c.np] = kl_scalar_tensor(1e-2 / bc1, KL_F32);
            args[d][c.nin + 3 * c.np + 1] = kl_scalar_tensor(1 / bc2, KL_F32);
        }
        const int n = c.nin + 3 * c.np + 2;
        assert_int_equal(whole_step(&c, args[0], n, &loss[0], 1), 0);
        int rc = kl_fn_call(f, args[1], n, &loss[1], 1);
        if (rc) {
            skip_without_module_compiler();
            print_error("%s whole step: %s\n", model_names[kind], kl_last_error());
        }
        assert_int_equal(rc, 0);
        assert_close("loss", s, loss[1], loss[0]);
        for (int i = 0; i < 3 * c.np; i++) assert_close("parameter or moment", s, state[1][i], state[0][i]);
        kl_scope_end();
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    print_message("%s whole step with AdamW: %lld launches (%lld library calls)\n", model_names[kind],
                  (long long)st.kernels, (long long)st.library_calls);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.eager_calls, 0);
    kl_fn_release(f);
}

static void whole_steps_with_adamw(void **s) {
    (void)s;
    NEED_CUDA();
    for (int kind = 0; kind < NMODELS; kind++) whole_step_side_by_side(kind, 3);
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(mlp_trains_like_cpu_eager),
        KT_TEST(attention_block_trains_like_cpu_eager),
        KT_TEST(cnn_trains_like_cpu_eager),
        KT_TEST(batch_norm_buffers_run_op_by_op),
        KT_TEST(whole_steps_with_adamw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
