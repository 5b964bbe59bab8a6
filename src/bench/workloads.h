/*
 * workloads.h — the standard workloads of shared/WORKLOADS.md, defined once:
 * kiln-bench times them, the fusion tests assert their kernel counts, and
 * bench/torch_workloads.py writes the same definitions for PyTorch.
 *
 * A workload is a kl_traceable written with primitive ops. A case is one
 * workload at one size with its inputs (randn with a fixed seed, never zeros)
 * and, for the training steps, its parameters and AdamW optimizer: the
 * traceable computes the loss and the gradients, and kw_case_run then sets
 * the gradients and steps the optimizer eagerly (the same in every mode).
 */
#ifndef KW_WORKLOADS_H
#define KW_WORKLOADS_H

#include "kiln.h"

enum { KW_MAX_IN = 10, KW_MAX_OUT = 8 };

/* The adamw workload's hyperparameters (step t = KW_ADAM_T), for hand-fused
 * references that must compute the same update. */
#define KW_ADAM_LR 1e-3
#define KW_ADAM_B1 0.9
#define KW_ADAM_B2 0.999
#define KW_ADAM_EPS 1e-8
#define KW_ADAM_WD 1e-2
#define KW_ADAM_T 10

typedef enum kw_size { KW_SMALL, KW_MEDIUM, KW_LARGE, KW_NUM_SIZES } kw_size;

typedef struct kw_def {
    const char *id;        /* "chain5", ... as in WORKLOADS.md */
    const char *summary;   /* one line: the definition */
    kl_traceable fn;       /* the workload, primitive ops */
    int n_in, n_out;
    int n_params;          /* training steps: inputs [n_in - n_params, n_in) are parameters */
    bool matmul_heavy;     /* rated in GFLOP/s against sgemm rather than GB/s against STREAM */
    bool in_place;         /* writes its inputs (adamw) */
} kw_def;

typedef struct kw_case {
    const kw_def *def;
    kw_size size;
    char size_name[32];    /* "1048576", "256x4096", "b256", ... */
    bool standard;         /* the size WORKLOADS.md gives */
    kl_tensor *in[KW_MAX_IN]; /* owned (retained) */
    double floor_bytes;    /* WORKLOADS.md's floor; 0 where it gives none */
    double flops;          /* matmul FLOPs per call; 0 for memory-bound workloads */
    kl_params *params;     /* training steps only */
    kl_optim *opt;
} kw_case;

/* Number of workloads and workload i (in WORKLOADS.md's order). */
int kw_count(void);
const kw_def *kw_at(int i);
/* The workload called id, or NULL and KL_ERR_ARG listing the known ones. */
const kw_def *kw_find(const char *id);
/* "small" / "medium" / "large" and back (-1 and KL_ERR_ARG for another name). */
const char *kw_size_name(kw_size s);
int kw_size_parse(const char *name);
/* A case of workload id at size s, inputs drawn after kl_manual_seed(seed).
 * NULL and an error on a bad id or size. Free with kw_case_free. */
kw_case *kw_case_new(const char *id, kw_size s, uint64_t seed);
/* The same on device dev: the inputs (and a training step's parameters) are
 * drawn on the CPU, then copied, so every device gets the same values. */
kw_case *kw_case_new_on(const char *id, kw_size s, uint64_t seed, kl_device dev);
void kw_case_free(kw_case *c);
/* One call: f (compiled from c->def->fn; NULL runs it eagerly), then for a
 * training step the optimizer update. outs (n_out entries, may be NULL)
 * receive scope-owned outputs. Returns 0 or -1. */
int kw_case_run(kw_case *c, kl_fn *f, kl_tensor **outs);
/* kl_compile of the case's workload in mode m (named after the workload). */
kl_fn *kw_case_compile(const kw_case *c, kl_compile_mode m);
/* Runs the workload once eagerly and once through f, on copies of the inputs,
 * and compares every output and written input (rtol 1e-3, atol 1e-4).
 * Returns 1 if they agree, 0 if not (with *what naming the first
 * difference, if what is not NULL), -1 on error. */
int kw_case_check(kw_case *c, kl_fn *f, char *what, size_t cap);

#endif /* KW_WORKLOADS_H */
