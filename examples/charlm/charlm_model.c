/*
 * charlm_model.c — the character transformer, its training step, evaluation,
 * save/load and sampling (charlm_model.h). Everything goes through Kiln's
 * public API: eager ops and autograd, kl_compile for the step, kiln/nn.h for
 * AdamW, the schedule, clipping and safetensors.
 */
#include "charlm_model.h"

#include "charlm_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds the parameter arrays on the stack (2 + 12 * 32 + 4 tensors). */
enum { CHARLM_MAX_LAYERS = 32, CHARLM_MAX_PARAMS = 2 + CHARLM_PER_LAYER * CHARLM_MAX_LAYERS + 4 };

int charlm_n_params(const charlm_config *cfg) { return 2 + CHARLM_PER_LAYER * cfg->layers + 4; }

static int config_error(const charlm_config *c) {
    if (c->vocab < 1 || c->layers < 1 || c->layers > CHARLM_MAX_LAYERS || c->heads < 1 || c->embed < 1 ||
        c->context < 1 || c->embed % c->heads) {
        fprintf(stderr, "charlm: bad model size: vocab %d, layers %d (1..%d), heads %d, embed %d (a multiple of heads), "
                        "context %d\n",
                c->vocab, c->layers, CHARLM_MAX_LAYERS, c->heads, c->embed, c->context);
        return -1;
    }
    return 0;
}

/* Adds a [rows, cols] (cols 0: [rows]) parameter drawn from N(0, std), or
 * constant value when std is 0. */
static int add_param(kl_params *p, const char *name, int64_t rows, int64_t cols, double std, double value) {
    kl_tensor *t = cols ? kl_empty(KL_SHAPE(rows, cols), KL_F32) : kl_empty(KL_SHAPE(rows), KL_F32);
    if (!t) return -1;
    if (!(std > 0 ? kl_init_normal(t, 0, std) : kl_init_constant(t, value))) return -1;
    return kl_params_add(p, name, t) < 0 ? -1 : 0;
}

kl_params *charlm_params_new(const charlm_config *cfg) {
    if (config_error(cfg) < 0) return NULL;
    kl_params *p = kl_params_new();
    if (!p) return NULL;
    const int64_t C = cfg->embed, V = cfg->vocab;
    const double std = 0.02, resid_std = 0.02 / sqrt(2.0 * cfg->layers);
    kl_scope_begin(); /* the collection keeps its own references */
    int rc = add_param(p, "tok_emb", V, C, std, 0) | add_param(p, "pos_emb", cfg->context, C, std, 0);
    for (int l = 0; l < cfg->layers && !rc; l++) {
        char n[12][48];
        static const char *what[12] = {"ln1.weight",     "ln1.bias",      "attn.qkv.weight", "attn.qkv.bias",
                                       "attn.proj.weight", "attn.proj.bias", "ln2.weight",      "ln2.bias",
                                       "mlp.fc.weight",  "mlp.fc.bias",   "mlp.proj.weight", "mlp.proj.bias"};
        for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "h%d.%s", l, what[i]);
        rc |= add_param(p, n[0], C, 0, 0, 1) | add_param(p, n[1], C, 0, 0, 0);
        rc |= add_param(p, n[2], 3 * C, C, std, 0) | add_param(p, n[3], 3 * C, 0, 0, 0);
        rc |= add_param(p, n[4], C, C, resid_std, 0) | add_param(p, n[5], C, 0, 0, 0);
        rc |= add_param(p, n[6], C, 0, 0, 1) | add_param(p, n[7], C, 0, 0, 0);
        rc |= add_param(p, n[8], 4 * C, C, std, 0) | add_param(p, n[9], 4 * C, 0, 0, 0);
        rc |= add_param(p, n[10], C, 4 * C, resid_std, 0) | add_param(p, n[11], C, 0, 0, 0);
    }
    if (!rc)
        rc = add_param(p, "ln_f.weight", C, 0, 0, 1) | add_param(p, "ln_f.bias", C, 0, 0, 0) |
             add_param(p, "head.weight", V, C, std, 0) | add_param(p, "head.bias", V, 0, 0, 0);
    kl_scope_end();
    if (rc) {
        kl_params_free(p);
        return NULL;
    }
    return p;
}

/* Causal self-attention of one layer: [B, T, C] -> [B, T, C]. q, k and v
 * come from the three row blocks of the one qkv weight [3C, C] (and bias),
 * each by its own GEMM into its own [B, T, C]; the heads are views
 * ([B, H, T, D]), not copies. One [B, T, 3C] GEMM split by select would be
 * the same numbers, but its backward assembles the three gradients with
 * three zero-padded [3, B, H, T, D] copies, their sum and a permuting copy
 * (~30 bytes per element of qkv); here the pieces of the weight's gradient
 * are small. The causal attention of such head views runs on the CPU as
 * one fused op in the [B, T, H, D] layout (seq_major, src/eager/attention.c),
 * so neither its output nor q, k and v's gradients need a copy back. */
static kl_tensor *attention(const charlm_config *cfg, kl_tensor *const *w, kl_tensor *h) {
    const int64_t *s = kl_shape(h);
    if (!s) return NULL;
    const int64_t B = s[0], T = s[1], C = cfg->embed, H = cfg->heads, D = C / H;
    kl_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        kl_tensor *y = kl_linear(h, kl_narrow(w[0], 0, i * C, C), kl_narrow(w[1], 0, i * C, C));
        qkv[i] = kl_transpose(kl_view(y, KL_SHAPE(B, T, H, D)), 1, 2);
    }
    kl_tensor *mask = NULL;
    if (cfg->mask_attention)
        mask = kl_ge(kl_unsqueeze(kl_arange(0, (double)T, 1, KL_I64), 1), kl_unsqueeze(kl_arange(0, (double)T, 1, KL_I64), 0));
    kl_tensor *a = kl_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], mask, !mask, 0);
    a = kl_reshape(kl_transpose(a, 1, 2), KL_SHAPE(B, T, C));
    return kl_linear(a, w[2], w[3]);
}

kl_tensor *charlm_forward(const charlm_config *cfg, kl_tensor *const *p, kl_tensor *idx) {
    const int64_t *s = kl_shape(idx);
    if (!s) return NULL;
    kl_tensor *pos = kl_arange(0, (double)s[1], 1, KL_I64);
    kl_tensor *x = kl_add(kl_embedding(p[0], idx), kl_embedding(p[1], pos));
    for (int l = 0; l < cfg->layers; l++) {
        kl_tensor *const *w = p + 2 + CHARLM_PER_LAYER * l;
        x = kl_add(x, attention(cfg, w + 2, kl_layer_norm(x, 1, w[0], w[1], 1e-5)));
        kl_tensor *h = kl_layer_norm(x, 1, w[6], w[7], 1e-5);
        x = kl_add(x, kl_linear(kl_gelu(kl_linear(h, w[8], w[9])), w[10], w[11]));
    }
    kl_tensor *const *f = p + 2 + CHARLM_PER_LAYER * cfg->layers;
    return kl_linear(kl_layer_norm(x, 1, f[0], f[1], 1e-5), f[2], f[3]);
}

kl_tensor *charlm_loss(const charlm_config *cfg, kl_tensor *const *p, kl_tensor *idx, kl_tensor *targets) {
    kl_tensor *logits = charlm_forward(cfg, p, idx);
    return kl_cross_entropy(kl_reshape(logits, KL_SHAPE(-1, cfg->vocab)), kl_reshape(targets, KL_SHAPE(-1)),
                            KL_REDUCE_MEAN, 0);
}

/* One step's loss and gradients as a function kl_compile can trace:
 * in = {x, y, every parameter (detached)}, out = {loss, every gradient}. The
 * parameters come in without requires_grad, so a compiled call fuses; the
 * step makes its own leaves and asks autograd for their gradients, which the
 * tracer records too: forward, loss and backward become one graph. */
static int train_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const charlm_trainer *t = user;
    kl_tensor *p[CHARLM_MAX_PARAMS];
    (void)n_in, (void)n_out;
    for (int i = 0; i < t->n_params; i++) {
        p[i] = kl_detach(in[2 + i]);
        if (!p[i] || kl_set_requires_grad(p[i], true) < 0) return -1;
    }
    kl_tensor *loss = charlm_loss(&t->cfg, p, in[0], in[1]);
    if (!loss || kl_autograd_grad(1, &loss, NULL, t->n_params, p, out + 1, NULL) < 0) return -1;
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

/* The loss alone, for opt.forward_only: in = {x, y}, out = {loss}; the
 * parameters are captured tensors that require grad, so a compiled call
 * records one autograd node whose backward is compiled too. */
static int loss_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const charlm_trainer *t = user;
    (void)n_in, (void)n_out;
    out[0] = charlm_loss(&t->cfg, t->param, in[0], in[1]);
    return out[0] ? 0 : -1;
}

int charlm_trainer_init(charlm_trainer *t, const charlm_config *cfg, const charlm_train_options *opt) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    t->opt = *opt;
    if (!(t->params = charlm_params_new(cfg))) return -1;
    t->n_params = kl_params_count(t->params);
    t->param = calloc((size_t)t->n_params, sizeof *t->param);
    t->detached = calloc((size_t)t->n_params, sizeof *t->detached);
    if (!t->param || !t->detached) {
        charlm_trainer_free(t);
        return -1;
    }
    kl_scope_begin();
    for (int i = 0; i < t->n_params; i++) {
        t->param[i] = kl_params_get(t->params, i);
        t->detached[i] = kl_retain(kl_detach(t->param[i]));
    }
    kl_scope_end();
    kl_adam_options ao = kl_adamw_options_default();
    ao.lr = opt->lr;
    ao.weight_decay = opt->weight_decay;
    ao.beta2 = opt->beta2;
    if (!t->detached[t->n_params - 1] || !(t->optim = kl_optim_adamw(t->params, &ao))) {
        charlm_trainer_free(t);
        return -1;
    }
    if (opt->compiled) {
        kl_compile_options co = kl_compile_options_default();
        co.name = opt->forward_only ? "charlm_loss" : "charlm_step";
        if (!(t->fn = kl_compile(opt->forward_only ? loss_fn : train_step, t, &co))) {
            charlm_trainer_free(t);
            return -1;
        }
    }
    return 0;
}

void charlm_trainer_free(charlm_trainer *t) {
    kl_fn_release(t->fn);
    kl_optim_free(t->optim);
    for (int i = 0; t->detached && i < t->n_params; i++)
        if (t->detached[i]) kl_release(t->detached[i]);
    free(t->detached);
    free(t->param);
    kl_params_free(t->params);
    memset(t, 0, sizeof *t);
}

int64_t charlm_trainer_steps(const charlm_trainer *t) { return kl_optim_steps(t->optim); }

int charlm_trainer_step(charlm_trainer *t, const int64_t *x, const int64_t *y, int batch, double *loss,
                        double *grad_norm) {
    const int np = t->n_params, T = t->cfg.context;
    const charlm_train_options *o = &t->opt;
    int64_t step = charlm_trainer_steps(t);
    double lr = step < o->total ? kl_lr_cosine_warmup(step, o->lr, o->warmup, o->total, o->min_lr) : o->min_lr;
    if (kl_optim_set_lr(t->optim, lr) < 0) return -1;
    kl_tensor *in[2 + CHARLM_MAX_PARAMS], *out[1 + CHARLM_MAX_PARAMS] = {0};
    kl_scope_begin(); /* the step's tensors; the gradients live on in the parameters */
    in[0] = kl_from_data(x, KL_SHAPE(batch, T), KL_I64);
    in[1] = kl_from_data(y, KL_SHAPE(batch, T), KL_I64);
    for (int i = 0; i < np; i++) in[2 + i] = t->detached[i];
    int bad = !in[0] || !in[1];
    if (!bad && t->fn && o->forward_only) {
        bad = kl_optim_zero_grad(t->optim) < 0 || kl_fn_call(t->fn, in, 2, out, 1) < 0 ||
              kl_backward(out[0], NULL, NULL) < 0;
    } else if (!bad) {
        bad = (t->fn ? kl_fn_call(t->fn, in, 2 + np, out, 1 + np) : train_step(t, in, 2 + np, out, 1 + np)) < 0;
        for (int i = 0; i < np && !bad; i++) bad = kl_set_grad(t->param[i], out[1 + i]) < 0;
    }
    double norm = 0;
    /* A NaN norm is either an error or NaN gradients: the run has diverged either way. */
    if (!bad && o->clip > 0 && (bad = isnan(norm = kl_clip_grad_norm(t->params, o->clip, 2))) && !*kl_last_error())
        fprintf(stderr, "charlm: step %lld: the gradients' norm is NaN (training diverged)\n", (long long)step);
    if (!bad) bad = kl_optim_step(t->optim) < 0;
    if (!bad) *loss = kl_item(out[0]);
    if (grad_norm) *grad_norm = norm;
    kl_scope_end();
    return bad ? -1 : 0;
}

double charlm_eval(const charlm_trainer *t, const int64_t *text, int64_t n_text, int windows, int batch,
                   uint64_t seed) {
    const int T = t->cfg.context;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)batch * T), *y = malloc(sizeof(int64_t) * (size_t)batch * T);
    double sum = 0;
    int done = 0;
    kl_no_grad_begin();
    while (x && y && done < windows) {
        int b = windows - done < batch ? windows - done : batch;
        charlm_windows(text, n_text, b, T, &seed, x, y);
        kl_scope_begin();
        kl_tensor *loss = charlm_loss(&t->cfg, t->param, kl_from_data(x, KL_SHAPE(b, T), KL_I64),
                                      kl_from_data(y, KL_SHAPE(b, T), KL_I64));
        double v = loss ? kl_item(loss) : NAN;
        kl_scope_end();
        if (isnan(v)) break;
        sum += v * b;
        done += b;
    }
    kl_no_grad_end();
    free(x), free(y);
    return done == windows ? sum / windows : NAN;
}

int charlm_save(const charlm_trainer *t, const char *path) {
    char optim_path[4096];
    snprintf(optim_path, sizeof optim_path, "%s.optim", path);
    if (kl_params_save_safetensors(t->params, path) < 0) return -1;
    return kl_optim_save_safetensors(t->optim, t->params, optim_path);
}

int charlm_load(charlm_trainer *t, const char *path) {
    char optim_path[4096];
    snprintf(optim_path, sizeof optim_path, "%s.optim", path);
    if (kl_params_load_safetensors(t->params, path, true) < 0) return -1;
    return kl_optim_load_safetensors(t->optim, t->params, optim_path);
}

int charlm_sample(const charlm_trainer *t, const int64_t *prompt, int n_prompt, int n, double temperature,
                  int top_k, int64_t *out) {
    const int T = t->cfg.context;
    int64_t *seq = malloc(sizeof(int64_t) * (size_t)(n_prompt + n));
    if (!seq) return -1;
    memcpy(seq, prompt, sizeof(int64_t) * (size_t)n_prompt);
    int len = n_prompt, rc = 0;
    kl_no_grad_begin();
    for (int i = 0; i < n && !rc; i++) {
        int ctx = len < T ? len : T;
        kl_scope_begin();
        kl_tensor *logits = charlm_forward(&t->cfg, t->param, kl_from_data(seq + len - ctx, KL_SHAPE(1, ctx), KL_I64));
        kl_tensor *last = kl_div_scalar(kl_select(kl_select(logits, 0, 0), 0, ctx - 1), temperature);
        kl_tensor *choice = NULL;
        if (top_k > 0 && top_k < t->cfg.vocab) {
            kl_tensor *values = NULL, *indices = NULL;
            if (last && kl_topk(last, top_k, 0, true, true, &values, &indices) == 0)
                choice = kl_index_select(indices, 0, kl_multinomial(kl_softmax(values, 0), 1, true));
        } else {
            choice = kl_multinomial(kl_softmax(last, 0), 1, true);
        }
        if (choice) seq[len++] = kl_item_int(choice);
        else rc = -1;
        kl_scope_end();
    }
    kl_no_grad_end();
    if (!rc) memcpy(out, seq + n_prompt, sizeof(int64_t) * (size_t)n);
    free(seq);
    return rc;
}
