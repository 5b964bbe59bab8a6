/*
 * fashion_model.h — the Fashion-MNIST CNN of issue 16 and its training loop's
 * pieces, shared by the demo (fashion.c) and its test (tests/test_fashion.c):
 *
 *   x [N,1,28,28] -> conv 1->32 3x3 -> batch_norm -> relu -> max_pool 2
 *                 -> conv 32->64 3x3 -> batch_norm -> relu -> max_pool 2
 *                 -> dropout -> flatten [N,1600] -> linear 1600->128 -> relu
 *                 -> linear 128->10 (logits)
 *
 * PyTorch's default initialisation (nn.Conv2d, nn.BatchNorm2d, nn.Linear;
 * convolutions without bias: the batch norm right after each removes it),
 * AdamW with a cosine learning-rate decay over the whole run, cross-entropy.
 *
 * A training step is one function (fashion_train_step) that computes the
 * loss and every gradient, and updates the batch-norm running statistics in
 * place; the trainer calls it eagerly or through kl_compile (forward,
 * dropout, backward and the running-stat update traced into one graph,
 * the in-place writes functionalized and written back at each call). The
 * optimizer step is eager in both.
 */
#ifndef FASHION_MODEL_H
#define FASHION_MODEL_H

#include <kiln.h>
#include <kiln/nn.h>

#include <stdbool.h>
#include <stdint.h>

enum {
    FASHION_NPARAMS = 10,  /* conv1.w bn1.w bn1.b conv2.w bn2.w bn2.b fc1.w fc1.b fc2.w fc2.b */
    FASHION_NBUFFERS = 4,  /* bn1.running_mean bn1.running_var bn2.running_mean bn2.running_var */
    FASHION_STEP_IN = 1 + FASHION_NPARAMS + FASHION_NBUFFERS, /* batch indices, params, buffers */
    FASHION_STEP_OUT = 1 + FASHION_NPARAMS                    /* loss, gradients */
};

typedef struct fashion_net {
    kl_params *params;                         /* the FASHION_NPARAMS parameters, in the order above */
    kl_tensor *p[FASHION_NPARAMS];             /* borrowed from params */
    kl_tensor *buf[FASHION_NBUFFERS];          /* running statistics (retained: the net owns them) */
} fashion_net;

/* A fresh net with PyTorch's default init drawn from the current generator
 * (kl_manual_seed first for a reproducible one). 0 or -1 (Kiln error set). */
int fashion_net_init(fashion_net *m);
void fashion_net_free(fashion_net *m);

/* Logits [N,10] of x [N,1,28,28]. training: batch statistics (running ones
 * updated in place) and dropout p; otherwise running statistics, no dropout.
 * p and buf may be other tensors than m's (the step's detached leaves). */
kl_tensor *fashion_forward(kl_tensor *const *p, kl_tensor *const *buf, kl_tensor *x, double dropout, bool training);

/* Test accuracy in percent over x [N,1,28,28] / y [N] in eval mode, in chunks
 * of `chunk` images (bounds the activations' memory). -1 on error. */
double fashion_accuracy(const fashion_net *m, kl_tensor *x, kl_tensor *y, int64_t chunk);

typedef struct fashion_config {
    double lr, weight_decay, dropout;
    int64_t total_steps; /* length of the cosine decay (from lr to 0) */
    uint64_t seed;       /* init and, with the step number, every step's dropout masks */
    bool compiled;
} fashion_config;

/* What a step reads beyond its inputs: the training images and labels. */
typedef struct fashion_step_ctx {
    kl_tensor *xtr, *ytr; /* [N,1,28,28] f32, [N] i64 */
    double dropout;
} fashion_step_ctx;

/* One step's loss and gradients as a traceable function: in = {batch
 * indices [B] i64, the 10 parameters (detached), the 4 running buffers},
 * out = {loss, the 10 gradients}. Writes the running buffers in place. */
int fashion_train_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out);

typedef struct fashion_trainer {
    fashion_net net;
    fashion_config cfg;
    fashion_step_ctx ctx;
    kl_optim *opt;
    kl_fn *fn;                     /* NULL in eager mode */
    kl_tensor *in[FASHION_STEP_IN]; /* in[1..]: detached views of the parameters and the buffers (retained) */
} fashion_trainer;

/* A fresh net and AdamW optimizer (seeded from cfg->seed) training on xtr/ytr
 * (borrowed: they must outlive the trainer). 0 or -1. */
int fashion_trainer_init(fashion_trainer *t, const fashion_config *cfg, kl_tensor *xtr, kl_tensor *ytr);
void fashion_trainer_free(fashion_trainer *t);
/* Optimizer steps taken so far (the next step's number). */
int64_t fashion_trainer_steps(const fashion_trainer *t);
/* One step on the training images at the bs indices idx: sets the cosine
 * learning rate for step fashion_trainer_steps(t), seeds the generator from
 * (seed, step) so the step's dropout masks do not depend on what ran before
 * (a resumed run draws what an uninterrupted one would), runs the step
 * eagerly or compiled, then AdamW. *loss: the batch's mean loss. 0 or -1. */
int fashion_trainer_step(fashion_trainer *t, const int64_t *idx, int64_t bs, double *loss);
/* Saves the parameters and running statistics to path and the optimizer
 * state (moments, step counts, lr) to path + ".optim"; load reads both back
 * into an initialised trainer of the same shape. 0 or -1 (Kiln error set). */
int fashion_trainer_save(const fashion_trainer *t, const char *path);
int fashion_trainer_load(fashion_trainer *t, const char *path);

#endif
