/*
 * charlm_model.h — the charlm demo's model: a GPT-style character
 * transformer (token + learned position embeddings; per layer pre-LayerNorm,
 * causal multi-head attention through kl_scaled_dot_product_attention, a
 * residual, pre-LayerNorm, a 4x GELU MLP, a residual; a final LayerNorm and
 * an untied output layer), its training step (eager or kl_compile'd: forward,
 * loss and gradients in one traced function; AdamW with warm-up + cosine
 * learning rate and gradient clipping, eager), evaluation, save/load with the
 * optimizer state, and sampling with temperature and top-k. Shared by
 * examples/charlm/charlm.c and tests/test_charlm.c.
 */
#ifndef CHARLM_MODEL_H
#define CHARLM_MODEL_H

#include <kiln.h>
#include <kiln/nn.h>

typedef struct charlm_config {
    int vocab, layers, heads, embed, context;
    /* attention with an explicit [T, T] bool causal mask instead of causal = true: the
     * same numbers by sdpa's decomposition rather than the fused causal kernel (A/B timing) */
    bool mask_attention;
} charlm_config;

/* Parameters per layer, in the order of charlm_params's names. */
enum { CHARLM_PER_LAYER = 12 };

/* Number of parameter tensors: tok, pos, 12 per layer, ln_f weight and bias, head weight and bias. */
int charlm_n_params(const charlm_config *cfg);

/* A new parameter collection for cfg, initialised as GPT-2 / nanoGPT do:
 * embeddings and linear weights N(0, 0.02) (the two residual projections of
 * each layer N(0, 0.02 / sqrt(2 layers))), biases 0, LayerNorm weight 1 and
 * bias 0, from Kiln's default generator. Names: "tok_emb", "pos_emb",
 * "h<l>.ln1.weight" ... "h<l>.mlp.proj.bias", "ln_f.weight", "ln_f.bias",
 * "head.weight", "head.bias". NULL on a bad config (embed not divisible by
 * heads, a size < 1) or error. */
kl_params *charlm_params_new(const charlm_config *cfg);

/* Logits [B, T, vocab] for token ids idx [B, T] (int64, T <= context), from
 * the parameters p in charlm_params_new's order (any tensors of those shapes:
 * the model's own, or leaves a traced step made). Scope-owned. */
kl_tensor *charlm_forward(const charlm_config *cfg, kl_tensor *const *p, kl_tensor *idx);

/* Mean cross-entropy of logits for idx against targets [B, T]. */
kl_tensor *charlm_loss(const charlm_config *cfg, kl_tensor *const *p, kl_tensor *idx, kl_tensor *targets);

/* The training schedule and optimizer settings. */
typedef struct charlm_train_options {
    double lr, min_lr;     /* peak and final learning rate */
    int64_t warmup, total; /* linear warm-up steps, then cosine to min_lr at step total */
    double weight_decay;   /* AdamW's decoupled decay, on every parameter */
    double beta2;
    double clip;           /* max global gradient norm (kl_clip_grad_norm), 0 = none */
    bool compiled;         /* loss and gradients by a kl_compile'd step, else eagerly */
    bool forward_only;     /* with compiled: kl_compile the loss only (the parameters captured,
                              requiring grad: compiled forward and backward graphs behind one
                              autograd node) and call kl_backward from eager code */
} charlm_train_options;

/* A model with its optimizer: what a training run (or a test) steps. */
typedef struct charlm_trainer {
    charlm_config cfg;
    charlm_train_options opt;
    kl_params *params;
    kl_optim *optim;
    kl_fn *fn;              /* the compiled step (or loss), or NULL for eager */
    int n_params;
    kl_tensor **param;      /* borrowed from params */
    kl_tensor **detached;   /* own references: the step's inputs, sharing the parameters' storage */
} charlm_trainer;

/* A fresh model (parameters drawn from Kiln's generator as it stands) and
 * AdamW. Returns 0 or -1 (Kiln's error recorded). */
int charlm_trainer_init(charlm_trainer *t, const charlm_config *cfg, const charlm_train_options *opt);
void charlm_trainer_free(charlm_trainer *t);

/* Steps taken (the optimizer's count: resumes with a loaded state). */
int64_t charlm_trainer_steps(const charlm_trainer *t);

/* One training step on a batch: x, y [batch, context] token ids (row-major
 * C arrays); learning rate from the schedule at the current step; loss and
 * gradients (compiled or eager), clipping, AdamW. *loss gets the batch's mean
 * loss (nats per character) and *grad_norm (may be NULL) the norm before
 * clipping. Returns 0 or -1. */
int charlm_trainer_step(charlm_trainer *t, const int64_t *x, const int64_t *y, int batch, double *loss,
                        double *grad_norm);

/* Mean loss over n windows of text (a fixed set: windows drawn from seed),
 * in batches of batch, under no-grad. NaN on error. */
double charlm_eval(const charlm_trainer *t, const int64_t *text, int64_t n_text, int windows, int batch,
                   uint64_t seed);

/* Parameters to path, optimizer state (moments, step count, lr) to
 * "<path>.optim"; load reads both back into t (shapes must match). 0 or -1. */
int charlm_save(const charlm_trainer *t, const char *path);
int charlm_load(charlm_trainer *t, const char *path);

/* Generates n tokens after prompt (n_prompt >= 1 ids) into out: each from
 * the last position's logits over the last <= context tokens, divided by
 * temperature (> 0), restricted to the top_k most likely (kl_topk; 0 = all)
 * and drawn by kl_multinomial from Kiln's default generator. Returns 0 or -1. */
int charlm_sample(const charlm_trainer *t, const int64_t *prompt, int n_prompt, int n, double temperature,
                  int top_k, int64_t *out);

#endif
