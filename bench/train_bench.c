/*
 * train_bench.c — training step time of the digits MLP (the
 * digits_step workload of shared/WORKLOADS.md): 64 -> 256 -> 256 -> 10,
 * GELU, mean cross-entropy, backward, AdamW (lr 1e-3, wd 1e-2), on random
 * inputs of the digits' shape. bench/torch_train.py is the same step in
 * PyTorch with the same output format; bench/run_train_bench.sh runs both
 * side by side. Method: warm-up, then at least 10 steps and 0.5 s, median and
 * interquartile range of one step (zero_grad + forward + backward + step).
 * Each batch size runs eagerly, then with the forward and backward compiled
 * (one kl_compile'd function giving the loss and the gradients; AdamW eager),
 * then with only the forward compiled (the parameters captured, requiring
 * grad; kl_backward from eager code runs the compiled backward graph of the
 * call's autograd node, docs/COMPILE.md; AdamW eager).
 *
 *   build/bench/train_bench [threads] [batch ...]     (default: 1; 64 256)
 *
 * KB_MODE=eager|compiled|fwd runs that one mode only (and for at least 2 s),
 * so that a profiler attached to the whole process sees one mode's steps:
 * bench/run_train_profile.sh uses it for the GEMM share of each mode.
 */
#include <kiln.h>

#include "bench_util.h"
#include "workloads.h"
#include <kiln/nn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


typedef struct model {
    kl_tensor *w[3], *b[3];
    kl_optim *opt;
    kl_tensor *x, *y;
} model;

/* One training step; its temporaries and graph die with the scope. */
static int step(const model *m) {
    kl_scope_begin();
    kl_tensor *h = m->x;
    for (int l = 0; l < 2; l++) h = kl_gelu(kl_linear(h, m->w[l], m->b[l]));
    kl_tensor *loss = kl_cross_entropy(kl_linear(h, m->w[2], m->b[2]), m->y, KL_REDUCE_MEAN, 0);
    int rc = loss && kl_optim_zero_grad(m->opt) == 0 && kl_backward(loss, NULL, NULL) == 0 &&
                     kl_optim_step(m->opt) == 0
                 ? 0
                 : -1;
    kl_scope_end();
    return rc;
}

/* The same step with its loss and gradients from one kl_compile'd function:
 * WORKLOADS.md's digits_step as src/bench/workloads.c defines it (in: x, y,
 * the six parameters detached; out: loss, the six gradients); AdamW stays
 * eager, as in the digits demo's compiled run. */
static int loss_and_grads(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    return kw_find("digits_step")->fn(u, in, n_in, out, n_out);
}

/* The forward alone (in: x, y; the parameters captured through u). */
static int forward_loss(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const model *m = u;
    kl_tensor *h = in[0];
    for (int l = 0; l < 2; l++) h = kl_gelu(kl_linear(h, m->w[l], m->b[l]));
    out[0] = kl_cross_entropy(kl_linear(h, m->w[2], m->b[2]), in[1], KL_REDUCE_MEAN, 0);
    return out[0] ? 0 : -1;
}

static int step_forward_compiled(const model *m, kl_fn *fwd) {
    kl_scope_begin();
    kl_tensor *in[2] = {m->x, m->y}, *loss = NULL;
    int rc = kl_optim_zero_grad(m->opt) == 0 && kl_fn_call(fwd, in, 2, &loss, 1) == 0 &&
                     kl_backward(loss, NULL, NULL) == 0 && kl_optim_step(m->opt) == 0
                 ? 0
                 : -1;
    kl_scope_end();
    return rc;
}

static int step_compiled(const model *m, kl_fn *fn, kl_tensor *const *detached) {
    kl_scope_begin();
    kl_tensor *in[8] = {m->x, m->y}, *out[7] = {0};
    for (int i = 0; i < 6; i++) in[2 + i] = detached[i];
    int rc = kl_fn_call(fn, in, 8, out, 7);
    for (int l = 0; l < 3 && rc == 0; l++)
        rc = kl_set_grad(m->w[l], out[1 + 2 * l]) || kl_set_grad(m->b[l], out[2 + 2 * l]) ? -1 : 0;
    if (rc == 0) rc = kl_optim_step(m->opt);
    kl_scope_end();
    return rc;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    kl_set_num_threads(threads);
    const char *km = getenv("KB_MODE");
    int only = -1;
    static const char *mode_keys[3] = {"eager", "compiled", "fwd"};
    for (int k = 0; km && k < 3; k++)
        if (!strcmp(km, mode_keys[k])) only = k;
    if (km && only < 0) {
        fprintf(stderr, "train_bench: KB_MODE=%s: expected eager, compiled or fwd\n", km);
        return 2;
    }
    const double min_time = only >= 0 ? 2.0 : 0.5;
    printf("train_bench: %d threads, Kiln %s%s%s\n", kl_get_num_threads(), kl_version(), km ? ", KB_MODE=" : "",
           km ? km : "");
    static const int64_t sizes[4] = {64, 256, 256, 10};
    static const char *names[3] = {"fc1", "fc2", "fc3"};
    int nb = argc > 2 ? argc - 2 : 2;
    for (int bi = 0; bi < nb; bi++) {
        int64_t batch = argc > 2 ? atoll(argv[bi + 2]) : (bi ? 256 : 64);
        kl_manual_seed(0);
        kl_scope_begin();
        model m = {0};
        kl_params *p = kl_params_new();
        for (int l = 0; l < 3; l++)
            kl_params_add_linear(p, names[l], sizes[l], sizes[l + 1], true, &m.w[l], &m.b[l]);
        kl_adam_options o = kl_adamw_options_default();
        o.lr = 1e-3;
        o.weight_decay = 1e-2;
        m.opt = kl_optim_adamw(p, &o);
        m.x = kl_randn(KL_SHAPE(batch, 64), KL_F32);
        m.y = kl_randint(0, 10, KL_SHAPE(batch), KL_I64);
        kl_tensor *detached[6];
        for (int l = 0; l < 3; l++) detached[2 * l] = kl_detach(m.w[l]), detached[2 * l + 1] = kl_detach(m.b[l]);
        kl_fn *fn = kl_compile(loss_and_grads, NULL, NULL);
        kl_fn *fwd = kl_compile(forward_loss, &m, NULL);
        enum { MAXR = 100000 };
        static double t[MAXR];
        int rc = m.opt && m.x && m.y && fn && fwd ? 0 : -1;
        /* eager, compiled whole step, compiled forward (first calls trace and compile) */
        static const char *mode_names[3] = {"digits_step", "digits_step_compiled", "digits_step_compiled_fwd"};
        for (int mode = 0; mode < 3 && rc == 0; mode++) {
            if (only >= 0 && mode != only) continue;
            int n = 0;
            for (int w = 0; w < 3 && rc == 0; w++)
                rc = mode == 1 ? step_compiled(&m, fn, detached) : mode == 2 ? step_forward_compiled(&m, fwd) : step(&m);
            /* no timed call runs interpreted (the interpreter tier, on by default with two threads) */
            if (rc == 0) rc = kl_fn_wait_compiled(mode == 2 ? fwd : fn);
            double start = kb_now_s();
            while (rc == 0 && n < MAXR && (n < 10 || kb_now_s() - start < min_time)) {
                double s = kb_now_s();
                rc = mode == 1 ? step_compiled(&m, fn, detached) : mode == 2 ? step_forward_compiled(&m, fwd) : step(&m);
                t[n++] = kb_now_s() - s;
            }
            if (rc) break;
            kb_stats st = kb_summarize(t, n);
            printf("%s batch %4lld  %8.3f ms  [%8.3f, %8.3f]\n", mode_names[mode], (long long)batch, st.median * 1e3,
                   st.q1 * 1e3, st.q3 * 1e3);
        }
        if (rc == 0 && (only < 0 || only == 2)) { /* the forward-only mode took the compiled path, not op by op */
            kl_fn_stats fs;
            kl_fn_get_stats(fwd, &fs);
            printf("  compiled forward: %lld + %lld backward kernels, %lld aot calls, %lld op-by-op, saved %lld bytes%s%s\n",
                   (long long)fs.kernels, (long long)fs.backward_kernels, (long long)fs.aot_calls,
                   (long long)fs.opbyop_grad_calls, (long long)fs.saved_bytes, fs.grad_fallback[0] ? ": " : "",
                   fs.grad_fallback);
        }
        if (rc) fprintf(stderr, "train_bench: %s\n", kl_last_error());
        kl_fn_release(fn);
        kl_fn_release(fwd);
        kl_optim_free(m.opt);
        kl_params_free(p);
        kl_scope_end();
        if (rc) return 1;
    }
    return 0;
}
