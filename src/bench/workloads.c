/*
 * workloads.c — shared/WORKLOADS.md's standard workloads, written with
 * primitive ops as that file asks (bench/torch_workloads.py is their PyTorch
 * twin: keep the two in step).
 */
#include "workloads.h"

#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNUSED_ARGS (void)u, (void)n_in, (void)n_out

/* y = tanh(sigmoid(x*2 + 1) * x) */
static int chain5(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *x = in[0];
    out[0] = kl_tanh(kl_mul(kl_sigmoid(kl_add_scalar(kl_mul_scalar(x, 2), 1)), x));
    return out[0] ? 0 : -1;
}

/* y = 0.5*x*(1 + tanh(0.7978845608*(x + 0.044715*x*x*x))), Python's evaluation order */
static int gelu(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *x = in[0];
    kl_tensor *x3 = kl_mul(kl_mul(kl_mul_scalar(x, 0.044715), x), x);
    kl_tensor *t = kl_tanh(kl_mul_scalar(kl_add(x, x3), 0.7978845608));
    out[0] = kl_mul(kl_mul_scalar(x, 0.5), kl_add_scalar(t, 1));
    return out[0] ? 0 : -1;
}

static kl_tensor *softmax_rows(kl_tensor *x) {
    kl_tensor *e = kl_exp(kl_sub(x, kl_amax(x, KL_DIMS(-1), true)));
    return kl_div(e, kl_sum(e, KL_DIMS(-1), true));
}

static int softmax(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    out[0] = softmax_rows(in[0]);
    return out[0] ? 0 : -1;
}

static kl_tensor *layernorm_rows(kl_tensor *x, kl_tensor *w, kl_tensor *b) {
    kl_tensor *d = kl_sub(x, kl_mean(x, KL_DIMS(-1), true));
    kl_tensor *v = kl_mean(kl_mul(d, d), KL_DIMS(-1), true);
    return kl_add(kl_mul(kl_mul(d, kl_rsqrt(kl_add_scalar(v, 1e-5))), w), b);
}

static int layernorm(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    out[0] = layernorm_rows(in[0], in[1], in[2]);
    return out[0] ? 0 : -1;
}

/* mean cross-entropy: log_softmax from primitives, gather, negate, mean */
static int xent(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *x = in[0];
    kl_tensor *s = kl_sub(x, kl_amax(x, KL_DIMS(-1), true));
    kl_tensor *ls = kl_sub(s, kl_log(kl_sum(kl_exp(s), KL_DIMS(-1), true)));
    kl_tensor *picked = kl_gather(ls, 1, kl_unsqueeze(in[1], 1));
    out[0] = kl_neg(kl_mean(picked, 0, NULL, false));
    return out[0] ? 0 : -1;
}

static kl_tensor *mlp_fwd(kl_tensor *x, kl_tensor *w1, kl_tensor *b1, kl_tensor *w2, kl_tensor *b2) {
    kl_tensor *h = kl_gelu(kl_add(kl_matmul(x, w1), b1));
    return kl_add(kl_matmul(h, w2), b2);
}

/* h = gelu(x@W1 + b1); y = h@W2 + b2 */
static int mlp(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    out[0] = mlp_fwd(in[0], in[1], in[2], in[3], in[4]);
    return out[0] ? 0 : -1;
}

/* Detached copies of the parameters that require grad: the step's leaves. */
static int leaves(kl_tensor *const *params, int n, kl_tensor **p) {
    for (int i = 0; i < n; i++) {
        p[i] = kl_detach(params[i]);
        if (!p[i] || kl_set_requires_grad(p[i], true) < 0) return -1;
    }
    return 0;
}

/* out[0] = loss (detached), out[1..] = the gradients of the n leaves */
static int loss_and_grads(kl_tensor *loss, kl_tensor **p, int n, kl_tensor **out) {
    if (!loss || kl_autograd_grad(1, &loss, NULL, n, p, out + 1, NULL) < 0) return -1;
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

/* mlp, mse loss to a target; in = x, target, W1, b1, W2, b2 */
static int mlp_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *p[4];
    if (leaves(in + 2, 4, p)) return -1;
    kl_tensor *loss = kl_mse_loss(mlp_fwd(in[0], p[0], p[1], p[2], p[3]), in[1], KL_REDUCE_MEAN);
    return loss_and_grads(loss, p, 4, out);
}

/* digits MLP 64 -> 256 -> 256 -> 10 (nn.Linear layout), GELU, cross-entropy;
 * in = x, labels, fc1.w, fc1.b, fc2.w, fc2.b, fc3.w, fc3.b */
static int digits_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *p[6];
    if (leaves(in + 2, 6, p)) return -1;
    kl_tensor *h = in[0];
    for (int l = 0; l < 2; l++) h = kl_gelu(kl_linear(h, p[2 * l], p[2 * l + 1]));
    kl_tensor *loss = kl_cross_entropy(kl_linear(h, p[4], p[5]), in[1], KL_REDUCE_MEAN, 0);
    return loss_and_grads(loss, p, 6, out);
}

/* one AdamW step at t = KW_ADAM_T, in place over p, m, v (in[0], in[2], in[3]) */
static int adamw(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    const double bc1 = 1 - pow(KW_ADAM_B1, KW_ADAM_T), bc2 = 1 - pow(KW_ADAM_B2, KW_ADAM_T);
    kl_mul_scalar_inplace(p, 1 - KW_ADAM_LR * KW_ADAM_WD);
    kl_add_inplace(kl_mul_scalar_inplace(m, KW_ADAM_B1), kl_mul_scalar(g, 1 - KW_ADAM_B1));
    kl_add_inplace(kl_mul_scalar_inplace(v, KW_ADAM_B2), kl_mul_scalar(kl_mul(g, g), 1 - KW_ADAM_B2));
    kl_tensor *den = kl_add_scalar(kl_sqrt(kl_div_scalar(v, bc2)), KW_ADAM_EPS);
    out[0] = kl_sub_inplace(p, kl_mul_scalar(kl_div(m, den), KW_ADAM_LR / bc1));
    return out[0] ? 0 : -1;
}

/* x [B,T,C], 8 heads: qkv = x@Wqkv; causal softmax(q k^T / sqrt(D)) v;
 * o = .@Wo; y = layernorm(x + o). in = x, Wqkv [C,3C], Wo [C,C], ln.w, ln.b,
 * mask [T,T] (true above the diagonal: the future a position may not see). */
static int attention(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    UNUSED_ARGS;
    kl_tensor *x = in[0];
    if (kl_ndim(x) != 3) return -1;
    const int64_t B = kl_shape(x)[0], T = kl_shape(x)[1], C = kl_shape(x)[2], H = 8, D = C / H;
    kl_tensor *qkv = kl_reshape(kl_matmul(x, in[1]), KL_SHAPE(B, T, 3, H, D));
    qkv = kl_permute(qkv, 5, (int64_t[]){2, 0, 3, 1, 4}); /* [3, B, H, T, D] */
    kl_tensor *q = kl_select(qkv, 0, 0), *k = kl_select(qkv, 0, 1), *v = kl_select(qkv, 0, 2);
    kl_tensor *s = kl_mul_scalar(kl_matmul(q, kl_transpose(k, -2, -1)), 1 / sqrt((double)D));
    kl_tensor *pr = softmax_rows(kl_masked_fill(s, in[5], -INFINITY));
    kl_tensor *o = kl_reshape(kl_permute(kl_matmul(pr, v), 4, (int64_t[]){0, 2, 1, 3}), KL_SHAPE(B, T, C));
    out[0] = layernorm_rows(kl_add(x, kl_matmul(o, in[2])), in[3], in[4]);
    return out[0] ? 0 : -1;
}

static const kw_def defs[] = {
    {"chain5", "y = tanh(sigmoid(x*2 + 1) * x)", chain5, 1, 1, 0, false, false},
    {"gelu", "y = 0.5*x*(1 + tanh(0.7978845608*(x + 0.044715*x^3)))", gelu, 1, 1, 0, false, false},
    {"softmax", "exp(x - amax(x)) / sum(.) over the last dim", softmax, 1, 1, 0, false, false},
    {"layernorm", "(x - mean) * rsqrt(var + 1e-5) * w + b over the last dim", layernorm, 3, 1, 0, false, false},
    {"xent", "mean cross-entropy via log_softmax + gather", xent, 2, 1, 0, false, false},
    {"mlp", "gelu(x@W1 + b1)@W2 + b2", mlp, 5, 1, 0, true, false},
    {"mlp_step", "mlp + mse loss, backward, AdamW", mlp_step, 6, 5, 4, true, false},
    {"digits_step", "digits MLP 64-256-256-10, cross-entropy, backward, AdamW", digits_step, 8, 7, 6, false, false},
    {"adamw", "one AdamW step in place over p, g, m, v", adamw, 4, 1, 0, false, true},
    {"attention", "8-head causal self-attention + residual + layernorm", attention, 6, 1, 0, true, false},
};
enum { NDEFS = sizeof defs / sizeof defs[0] };

int kw_count(void) { return NDEFS; }

const kw_def *kw_at(int i) { return i >= 0 && i < NDEFS ? &defs[i] : NULL; }

const kw_def *kw_find(const char *id) {
    for (int i = 0; id && i < NDEFS; i++)
        if (!strcmp(defs[i].id, id)) return &defs[i];
    char known[256] = "";
    for (int i = 0; i < NDEFS; i++) snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", defs[i].id);
    ke_err(KL_ERR_ARG, "bench", "unknown workload \"%s\" (known: %s)", id ? id : "(null)", known);
    return NULL;
}

static const char *size_names[KW_NUM_SIZES] = {"small", "medium", "large"};

const char *kw_size_name(kw_size s) { return s >= 0 && s < KW_NUM_SIZES ? size_names[s] : "invalid"; }

int kw_size_parse(const char *name) {
    for (int i = 0; name && i < KW_NUM_SIZES; i++)
        if (!strcmp(size_names[i], name)) return i;
    return ke_err(KL_ERR_ARG, "bench", "unknown size \"%s\" (small, medium, large)", name ? name : "(null)");
}

/* ---- cases ------------------------------------------------------------------------ */

static kl_tensor *randn(int ndim, const int64_t *shape, double scale) {
    kl_tensor *t = kl_randn(ndim, shape, KL_F32);
    return scale == 1 ? t : kl_mul_scalar(t, scale);
}
#define RANDN(scale, ...) randn(KL_SHAPE(__VA_ARGS__), (scale))

static int set_in(kw_case *c, int i, kl_tensor *t) {
    if (!t) return -1;
    c->in[i] = kl_retain(t);
    return 0;
}

/* The size table: small is for tests and quick looks (not a WORKLOADS.md
 * size, except chain5/gelu's 2^16); medium and large are WORKLOADS.md's. */
static int make_inputs(kw_case *c) {
    const char *id = c->def->id;
    kw_size s = c->size;
    int rc = 0;
    if (!strcmp(id, "chain5") || !strcmp(id, "gelu") || !strcmp(id, "adamw")) {
        int adam = !strcmp(id, "adamw");
        int64_t n = adam ? (s == KW_SMALL ? 1 << 16 : s == KW_MEDIUM ? 1 << 20 : 10000000)
                         : (s == KW_SMALL ? 1 << 16 : s == KW_MEDIUM ? 1 << 20 : 1 << 24);
        c->standard = !adam || s == KW_LARGE;
        snprintf(c->size_name, sizeof c->size_name, "%lld", (long long)n);
        rc |= set_in(c, 0, RANDN(1, n));
        if (adam) {
            rc |= set_in(c, 1, RANDN(1, n));
            rc |= set_in(c, 2, RANDN(0.1, n));
            rc |= set_in(c, 3, kl_mul_scalar(kl_abs(kl_randn(KL_SHAPE(n), KL_F32)), 0.01));
        }
        c->floor_bytes = (adam ? 28.0 : 8.0) * (double)n;
    } else if (!strcmp(id, "softmax") || !strcmp(id, "layernorm")) {
        int64_t R = s == KW_SMALL ? 64 : s == KW_MEDIUM ? 256 : 4096, C = s == KW_SMALL ? 256 : s == KW_MEDIUM ? 4096 : 1024;
        c->standard = s != KW_SMALL;
        snprintf(c->size_name, sizeof c->size_name, "%lldx%lld", (long long)R, (long long)C);
        rc |= set_in(c, 0, RANDN(1, R, C));
        c->floor_bytes = 8.0 * (double)R * (double)C;
        if (!strcmp(id, "layernorm")) {
            rc |= set_in(c, 1, RANDN(1, C));
            rc |= set_in(c, 2, RANDN(1, C));
            c->floor_bytes += 8.0 * (double)C;
        }
    } else if (!strcmp(id, "xent")) {
        int64_t B = s == KW_SMALL ? 256 : 4096, C = s == KW_SMALL ? 100 : 1000;
        c->standard = s != KW_SMALL;
        snprintf(c->size_name, sizeof c->size_name, "%lldx%lld", (long long)B, (long long)C);
        rc |= set_in(c, 0, RANDN(1, B, C));
        rc |= set_in(c, 1, kl_randint(0, C, KL_SHAPE(B), KL_I64));
        c->floor_bytes = 4.0 * (double)B * (double)C + 8.0 * (double)B + 4;
    } else if (!strcmp(id, "mlp") || !strcmp(id, "mlp_step")) {
        int step = !strcmp(id, "mlp_step");
        int64_t M = s == KW_SMALL ? 32 : 256, K = s == KW_SMALL ? 128 : 1024, H = 4 * K, N = K;
        c->standard = s != KW_SMALL;
        snprintf(c->size_name, sizeof c->size_name, "%lldx%lld", (long long)M, (long long)K);
        int o = step ? 2 : 1; /* the parameters' first input */
        rc |= set_in(c, 0, RANDN(1, M, K));
        if (step) rc |= set_in(c, 1, RANDN(1, M, N));
        /* weights scaled like nn.Linear's init so the GELU sees O(1) inputs */
        rc |= set_in(c, o, RANDN(1 / sqrt((double)K), K, H));
        rc |= set_in(c, o + 1, RANDN(0.1, H));
        rc |= set_in(c, o + 2, RANDN(1 / sqrt((double)H), H, N));
        rc |= set_in(c, o + 3, RANDN(0.1, N));
        c->flops = (2.0 * M * K * H + 2.0 * M * H * N) * (step ? 3 : 1);
    } else if (!strcmp(id, "digits_step")) {
        int64_t B = s == KW_SMALL ? 32 : 256;
        static const int64_t dims[4] = {64, 256, 256, 10};
        c->standard = s != KW_SMALL;
        snprintf(c->size_name, sizeof c->size_name, "b%lld", (long long)B);
        rc |= set_in(c, 0, RANDN(1, B, 64));
        rc |= set_in(c, 1, kl_randint(0, 10, KL_SHAPE(B), KL_I64));
        for (int l = 0; l < 3; l++) {
            double k = 1 / sqrt((double)dims[l]);
            rc |= set_in(c, 2 + 2 * l, RANDN(k, dims[l + 1], dims[l]));
            rc |= set_in(c, 3 + 2 * l, RANDN(k, dims[l + 1]));
        }
    } else if (!strcmp(id, "attention")) {
        int64_t B = s == KW_SMALL ? 2 : 8, T = s == KW_SMALL ? 32 : 256, C = s == KW_SMALL ? 64 : 512, H = 8, D = C / H;
        c->standard = s != KW_SMALL;
        snprintf(c->size_name, sizeof c->size_name, "%lldx%lldx%lld", (long long)B, (long long)T, (long long)C);
        rc |= set_in(c, 0, RANDN(1, B, T, C));
        rc |= set_in(c, 1, RANDN(1 / sqrt((double)C), C, 3 * C));
        rc |= set_in(c, 2, RANDN(1 / sqrt((double)C), C, C));
        rc |= set_in(c, 3, RANDN(1, C));
        rc |= set_in(c, 4, RANDN(0.1, C));
        rc |= set_in(c, 5, kl_triu(kl_ones(KL_SHAPE(T, T), KL_BOOL), 1));
        c->flops = 2.0 * B * T * C * 3 * C + 2 * 2.0 * B * H * T * T * D + 2.0 * B * T * C * C;
    }
    return rc ? -1 : 0;
}

/* Training steps: parameters in a kl_params (requiring grad) with AdamW;
 * the workload's inputs are detached aliases, as a compiled step takes them. */
static int make_optimizer(kw_case *c) {
    const kw_def *d = c->def;
    c->params = kl_params_new();
    if (!c->params) return -1;
    for (int i = d->n_in - d->n_params; i < d->n_in; i++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        kl_tensor *p = c->in[i];
        if (kl_params_add(c->params, name, p) < 0) return -1;
        c->in[i] = kl_retain(kl_detach(p));
        kl_release(p);
        if (!c->in[i]) return -1;
    }
    kl_adam_options o = kl_adamw_options_default();
    o.lr = KW_ADAM_LR;
    o.weight_decay = KW_ADAM_WD;
    c->opt = kl_optim_adamw(c->params, &o);
    return c->opt ? 0 : -1;
}

/* Moves the inputs to dev (the same values: drawn on the CPU, then copied). */
static int to_device(kw_case *c, kl_device dev) {
    for (int i = 0; i < c->def->n_in; i++) {
        kl_tensor *t = kl_to_device(c->in[i], dev);
        if (!t) return -1;
        t = kl_retain(t);
        kl_release(c->in[i]);
        c->in[i] = t;
    }
    return 0;
}

kw_case *kw_case_new(const char *id, kw_size s, uint64_t seed) { return kw_case_new_on(id, s, seed, KL_DEVICE_CPU); }

kw_case *kw_case_new_on(const char *id, kw_size s, uint64_t seed, kl_device dev) {
    const kw_def *d = kw_find(id);
    if (!d) return NULL;
    if (s < 0 || s >= KW_NUM_SIZES) {
        ke_err(KL_ERR_ARG, "bench", "invalid size %d", (int)s);
        return NULL;
    }
    kw_case *c = calloc(1, sizeof *c);
    if (!c) {
        ke_err(KL_ERR_OOM, "bench", "out of memory");
        return NULL;
    }
    c->def = d, c->size = s;
    kl_manual_seed(seed);
    kl_scope_begin(); /* the temporaries of input creation */
    int rc = make_inputs(c);
    if (rc == 0 && dev.type != KL_CPU) rc = to_device(c, dev);
    kl_scope_end();
    if (rc == 0 && d->n_params) rc = make_optimizer(c);
    if (rc) {
        kw_case_free(c);
        return NULL;
    }
    return c;
}

void kw_case_free(kw_case *c) {
    if (!c) return;
    for (int i = 0; i < KW_MAX_IN; i++)
        if (c->in[i]) kl_release(c->in[i]);
    kl_optim_free(c->opt);
    kl_params_free(c->params);
    free(c);
}

int kw_case_run(kw_case *c, kl_fn *f, kl_tensor **outs) {
    const kw_def *d = c->def;
    kl_tensor *o[KW_MAX_OUT] = {0};
    int rc = f ? kl_fn_call(f, c->in, d->n_in, o, d->n_out) : d->fn(NULL, c->in, d->n_in, o, d->n_out);
    if (rc == 0 && d->n_params) {
        for (int i = 0; i < d->n_params && rc == 0; i++)
            rc = kl_set_grad(kl_params_get(c->params, i), o[1 + i]) ? -1 : 0;
        if (rc == 0) rc = kl_optim_step(c->opt);
    }
    if (outs)
        for (int i = 0; i < d->n_out; i++) outs[i] = o[i];
    return rc;
}

kl_fn *kw_case_compile(const kw_case *c, kl_compile_mode m) {
    kl_compile_options o = kl_compile_options_default();
    o.mode = m;
    o.name = c->def->id;
    /* the compile and the compiled code are measured: no interpreted first calls (the
     * interpreter tier, on by default with two threads; KL_COMPILE_INTERP=1 still turns it on) */
    o.interp_tier = -1;
    return kl_compile(c->def->fn, NULL, &o);
}

static int close_enough(kl_tensor *a, kl_tensor *b) {
    a = kl_to_device(a, KL_DEVICE_CPU), b = kl_to_device(b, KL_DEVICE_CPU);
    if (!a || !b) return -1;
    if (kl_dtype_is_floating(kl_dtype_of(a))) return kl_allclose(a, b, 1e-3, 1e-4, true);
    return kl_equal(a, b);
}

int kw_case_check(kw_case *c, kl_fn *f, char *what, size_t cap) {
    const kw_def *d = c->def;
    kl_scope_begin();
    kl_tensor *a[KW_MAX_IN], *b[KW_MAX_IN], *ya[KW_MAX_OUT] = {0}, *yb[KW_MAX_OUT] = {0};
    int rc = 1;
    for (int i = 0; i < d->n_in; i++)
        if (!(a[i] = kl_clone(c->in[i])) || !(b[i] = kl_clone(c->in[i]))) rc = -1;
    if (rc == 1 && d->fn(NULL, a, d->n_in, ya, d->n_out) != 0) rc = -1;
    if (rc == 1 && kl_fn_call(f, b, d->n_in, yb, d->n_out) != 0) rc = -1;
    for (int i = 0; i < d->n_out && rc == 1; i++) {
        int ok = close_enough(yb[i], ya[i]);
        if (ok < 0) rc = -1;
        else if (!ok) {
            rc = 0;
            if (what) snprintf(what, cap, "output %d differs", i);
        }
    }
    for (int i = 0; i < d->n_in && rc == 1; i++) {
        int ok = close_enough(b[i], a[i]);
        if (ok < 0) rc = -1;
        else if (!ok) {
            rc = 0;
            if (what) snprintf(what, cap, "input %d differs after the call", i);
        }
    }
    kl_scope_end();
    return rc;
}
