/*
 * fashion_model.c — the CNN of fashion_model.h, its step function and the
 * trainer around it (optimizer, schedule, per-step seeding, save/load).
 */
#include "fashion_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const param_names[FASHION_NPARAMS] = {
    "conv1.weight", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight",
    "bn2.bias",     "fc1.weight", "fc1.bias", "fc2.weight",   "fc2.bias"};
static const char *const buffer_names[FASHION_NBUFFERS] = {"bn1.running_mean", "bn1.running_var",
                                                           "bn2.running_mean", "bn2.running_var"};
enum { CONV1_W, BN1_W, BN1_B, CONV2_W, BN2_W, BN2_B, FC1_W, FC1_B, FC2_W, FC2_B };
enum { FLAT = 64 * 5 * 5, HIDDEN = 128 };
static const double bn_momentum = 0.1, bn_eps = 1e-5;

int fashion_net_init(fashion_net *m) {
    memset(m, 0, sizeof *m);
    if (!(m->params = kl_params_new())) return -1;
    kl_tensor **p = m->p, **b = m->buf;
    kl_scope_begin(); /* the running buffers are born here; the net retains them */
    int rc = -1;
    if (kl_params_add_conv2d(m->params, "conv1", 1, 32, 3, 3, 1, false, &p[CONV1_W], NULL) < 0 ||
        kl_params_add_batch_norm(m->params, "bn1", 32, true, &p[BN1_W], &p[BN1_B], &b[0], &b[1]) < 0 ||
        kl_params_add_conv2d(m->params, "conv2", 32, 64, 3, 3, 1, false, &p[CONV2_W], NULL) < 0 ||
        kl_params_add_batch_norm(m->params, "bn2", 64, true, &p[BN2_W], &p[BN2_B], &b[2], &b[3]) < 0 ||
        kl_params_add_linear(m->params, "fc1", FLAT, HIDDEN, true, &p[FC1_W], &p[FC1_B]) < 0 ||
        kl_params_add_linear(m->params, "fc2", HIDDEN, 10, true, &p[FC2_W], &p[FC2_B]) < 0) {
        memset(m->buf, 0, sizeof m->buf);
    } else {
        for (int i = 0; i < FASHION_NBUFFERS; i++) kl_retain(b[i]);
        rc = 0;
    }
    kl_scope_end();
    if (rc < 0) fashion_net_free(m);
    return rc;
}

void fashion_net_free(fashion_net *m) {
    for (int i = 0; i < FASHION_NBUFFERS; i++)
        if (m->buf[i]) kl_release(m->buf[i]);
    kl_params_free(m->params);
    memset(m, 0, sizeof *m);
}

kl_tensor *fashion_forward(kl_tensor *const *p, kl_tensor *const *buf, kl_tensor *x, double dropout, bool training) {
    kl_pool2d_options pool = kl_pool2d_options_default(2);
    kl_tensor *h = kl_conv2d(x, p[CONV1_W], NULL, NULL);
    h = kl_relu(kl_batch_norm(h, buf[0], buf[1], p[BN1_W], p[BN1_B], training, bn_momentum, bn_eps));
    h = kl_max_pool2d(h, &pool);
    h = kl_conv2d(h, p[CONV2_W], NULL, NULL);
    h = kl_relu(kl_batch_norm(h, buf[2], buf[3], p[BN2_W], p[BN2_B], training, bn_momentum, bn_eps));
    h = kl_max_pool2d(h, &pool);
    if (training && dropout > 0) h = kl_dropout(h, dropout, true);
    h = kl_relu(kl_linear(kl_flatten(h, 1, 3), p[FC1_W], p[FC1_B]));
    return kl_linear(h, p[FC2_W], p[FC2_B]);
}

double fashion_accuracy(const fashion_net *m, kl_tensor *x, kl_tensor *y, int64_t chunk) {
    int64_t n = kl_size(y, 0), hits = 0;
    if (n <= 0 || chunk < 1) return -1;
    kl_no_grad_begin();
    for (int64_t s = 0; s < n; s += chunk) {
        int64_t len = n - s < chunk ? n - s : chunk;
        kl_scope_begin();
        kl_tensor *logits = fashion_forward(m->p, m->buf, kl_narrow(x, 0, s, len), 0, false);
        kl_tensor *h = kl_sum(kl_eq(kl_argmax(logits, 1, false), kl_narrow(y, 0, s, len)), KL_ALL_DIMS, false);
        double v = h ? kl_item(h) : -1;
        kl_scope_end();
        if (v < 0) {
            hits = -1;
            break;
        }
        hits += (int64_t)v;
    }
    kl_no_grad_end();
    return hits < 0 ? -1 : 100.0 * (double)hits / (double)n;
}

/* The parameters come in detached (no requires_grad), so a compiled call
 * fuses the whole step; the step makes its own leaves and asks autograd for
 * their gradients, which the tracer records too. The training data are
 * captured tensors: read at every call, never copied into the graph. */
int fashion_train_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const fashion_step_ctx *c = user;
    if (n_in != FASHION_STEP_IN || n_out != FASHION_STEP_OUT) return -1;
    kl_tensor *x = kl_index_select(c->xtr, 0, in[0]), *y = kl_index_select(c->ytr, 0, in[0]);
    kl_tensor *p[FASHION_NPARAMS];
    for (int i = 0; i < FASHION_NPARAMS; i++) {
        p[i] = kl_detach(in[1 + i]);
        if (!p[i] || kl_set_requires_grad(p[i], true) < 0) return -1;
    }
    kl_tensor *logits = fashion_forward(p, in + 1 + FASHION_NPARAMS, x, c->dropout, true);
    kl_tensor *loss = kl_cross_entropy(logits, y, KL_REDUCE_MEAN, 0);
    if (!loss || kl_autograd_grad(1, &loss, NULL, FASHION_NPARAMS, p, out + 1, NULL) < 0) return -1;
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

int fashion_trainer_init(fashion_trainer *t, const fashion_config *cfg, kl_tensor *xtr, kl_tensor *ytr) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->ctx = (fashion_step_ctx){.xtr = xtr, .ytr = ytr, .dropout = cfg->dropout};
    kl_manual_seed(cfg->seed);
    if (fashion_net_init(&t->net) < 0) return -1;
    kl_adam_options ao = kl_adamw_options_default();
    ao.lr = cfg->lr;
    ao.weight_decay = cfg->weight_decay;
    if (!(t->opt = kl_optim_adamw(t->net.params, &ao))) goto fail;
    kl_scope_begin();
    for (int i = 0; i < FASHION_NPARAMS; i++) t->in[1 + i] = kl_retain(kl_detach(t->net.p[i]));
    kl_scope_end();
    for (int i = 0; i < FASHION_NPARAMS; i++)
        if (!t->in[1 + i]) goto fail;
    for (int i = 0; i < FASHION_NBUFFERS; i++) t->in[1 + FASHION_NPARAMS + i] = t->net.buf[i];
    if (cfg->compiled) {
        kl_compile_options co = kl_compile_options_default();
        co.name = "fashion_step";
        if (!(t->fn = kl_compile(fashion_train_step, &t->ctx, &co))) goto fail;
    }
    return 0;
fail:
    fashion_trainer_free(t);
    return -1;
}

void fashion_trainer_free(fashion_trainer *t) {
    kl_fn_release(t->fn);
    for (int i = 0; i < FASHION_NPARAMS; i++)
        if (t->in[1 + i]) kl_release(t->in[1 + i]);
    kl_optim_free(t->opt);
    fashion_net_free(&t->net);
    memset(t, 0, sizeof *t);
}

int64_t fashion_trainer_steps(const fashion_trainer *t) { return kl_optim_steps(t->opt); }

int fashion_trainer_step(fashion_trainer *t, const int64_t *idx, int64_t bs, double *loss) {
    int64_t step = fashion_trainer_steps(t);
    if (kl_optim_set_lr(t->opt, kl_lr_cosine_warmup(step, t->cfg.lr, 0, t->cfg.total_steps, 0)) < 0) return -1;
    uint64_t s = t->cfg.seed ^ (0x9e3779b97f4a7c15u * (uint64_t)(step + 1));
    kl_manual_seed(s ^ (s >> 29));
    kl_scope_begin(); /* the step's tensors and gradients-in-flight */
    kl_tensor *out[FASHION_STEP_OUT] = {0};
    int rc = -1;
    t->in[0] = kl_from_data(idx, KL_SHAPE(bs), KL_I64);
    if (t->in[0] && (t->fn ? kl_fn_call(t->fn, t->in, FASHION_STEP_IN, out, FASHION_STEP_OUT)
                           : fashion_train_step(&t->ctx, t->in, FASHION_STEP_IN, out, FASHION_STEP_OUT)) == 0) {
        int bad = 0;
        for (int i = 0; i < FASHION_NPARAMS && !bad; i++) bad = kl_set_grad(t->net.p[i], out[1 + i]) < 0;
        if (!bad && kl_optim_step(t->opt) == 0) {
            *loss = kl_item(out[0]);
            rc = 0;
        }
    }
    t->in[0] = NULL;
    kl_scope_end();
    return rc;
}

int fashion_trainer_save(const fashion_trainer *t, const char *path) {
    const char *names[FASHION_NPARAMS + FASHION_NBUFFERS];
    kl_tensor *ts[FASHION_NPARAMS + FASHION_NBUFFERS];
    for (int i = 0; i < FASHION_NPARAMS; i++) names[i] = param_names[i], ts[i] = t->net.p[i];
    for (int i = 0; i < FASHION_NBUFFERS; i++)
        names[FASHION_NPARAMS + i] = buffer_names[i], ts[FASHION_NPARAMS + i] = t->net.buf[i];
    static const char *const meta[] = {"kiln.model", "fashion_cnn", NULL};
    if (kl_save_safetensors(path, FASHION_NPARAMS + FASHION_NBUFFERS, names, ts, meta) < 0) return -1;
    size_t len = strlen(path) + sizeof ".optim";
    char *opath = malloc(len);
    if (!opath) return -1;
    snprintf(opath, len, "%s.optim", path);
    int rc = kl_optim_save_safetensors(t->opt, t->net.params, opath);
    free(opath);
    return rc;
}

/* Copies every named tensor of f into dst after checking all of them (same
 * shape and dtype): nothing changes unless the whole file fits. */
static int load_into(const kl_safetensors *f, const char *path, int n, const char *const *names, kl_tensor *const *dst) {
    kl_tensor *src[FASHION_NPARAMS + FASHION_NBUFFERS];
    for (int i = 0; i < n; i++) {
        src[i] = kl_safetensors_find(f, names[i]);
        bool same = src[i] && kl_dtype_of(src[i]) == kl_dtype_of(dst[i]) && kl_ndim(src[i]) == kl_ndim(dst[i]);
        for (int d = 0; same && d < kl_ndim(dst[i]); d++) same = kl_size(src[i], d) == kl_size(dst[i], d);
        if (!same) {
            fprintf(stderr, "fashion: %s: tensor %s is %s\n", path, names[i],
                    src[i] ? "not of the model's shape and dtype" : "missing");
            return -1;
        }
    }
    kl_no_grad_begin();
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = kl_copy_inplace(dst[i], src[i]) ? 0 : -1;
    kl_no_grad_end();
    return rc;
}

int fashion_trainer_load(fashion_trainer *t, const char *path) {
    kl_safetensors *f = kl_load_safetensors(path);
    if (!f) return -1;
    int rc = -1;
    if (kl_safetensors_count(f) != FASHION_NPARAMS + FASHION_NBUFFERS)
        fprintf(stderr, "fashion: %s holds %d tensors, not the model's %d\n", path, kl_safetensors_count(f),
                FASHION_NPARAMS + FASHION_NBUFFERS);
    else if (load_into(f, path, FASHION_NPARAMS, param_names, t->net.p) == 0 &&
             load_into(f, path, FASHION_NBUFFERS, buffer_names, t->net.buf) == 0)
        rc = 0;
    kl_safetensors_free(f);
    if (rc < 0) return -1;
    size_t len = strlen(path) + sizeof ".optim";
    char *opath = malloc(len);
    if (!opath) return -1;
    snprintf(opath, len, "%s.optim", path);
    rc = kl_optim_load_safetensors(t->opt, t->net.params, opath);
    free(opath);
    return rc;
}
