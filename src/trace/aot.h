/*
 * aot.h — differentiable compiled functions (aot.c): the forward and
 * backward graphs of a signature whose inputs or captured tensors require
 * grad, and the one autograd node each call inserts.
 */
#ifndef TR_AOT_H
#define TR_AOT_H

#include "kernel.h"

typedef struct tr_aot tr_aot;

/* What tr_aot_build needs: fn, the call's inputs, the forward-only trace g0
 * (for fn's output layouts), the captured tensors requiring grad (params) and
 * how to compile. */
typedef struct tr_aot_spec {
    kl_traceable fn;
    void *user;
    const char *name;
    kl_tensor *const *inputs;
    const int32_t *alias;     /* per input: the earlier input sharing its storage, or -1 */
    int n_in, n_out;
    const ir_graph *g0;
    kl_tensor *const *params;
    int nparams;
    int fuse;
    const ir_backend *cpu;
    /* KL_COMPILE_CHECK (NULL: off): the function's options. Both graphs are kept as split
     * (before the passes), a failed compile of either names a repro bundle of it, and each
     * backward is checked against that graph run op by op (tr_aot_fw_traced). */
    const kl_compile_options *check;
} tr_aot_spec;

/* Traces the joint forward+backward, splits it and compiles both graphs:
 * *fw (inputs: fn's; outputs: fn's, then the saved values) and *aot. Where
 * the function cannot be split (why says so) both are NULL and 0 is returned:
 * the caller runs the graph op by op. -1 on an error. */
int tr_aot_build(const tr_aot_spec *sp, ir_graph **fw, tr_aot **aot, char *why, size_t why_cap);
void tr_aot_release(tr_aot *a);
/* Runs fw, then records one autograd node for the call whose backward runs
 * the compiled backward graph. outputs as tr_run_graph's. 0 or -1. */
int tr_aot_call(tr_aot *a, const ir_graph *fw, kl_tensor *const *inputs, kl_tensor **outputs);
/* 1 (why filled) if a captured tensor it differentiates no longer requires
 * grad, or is referenced only by the compiled function (the caller replaced
 * it: fn would read another tensor now). */
int tr_aot_guard(const tr_aot *a, char *why, size_t cap);
/* KL_COMPILE_CHECK: the forward graph as split, before the passes (NULL when the check is off). */
const ir_graph *tr_aot_fw_traced(const tr_aot *a);
int64_t tr_aot_saved_bytes(const tr_aot *a);
int64_t tr_aot_backward_launches(const tr_aot *a);
int64_t tr_aot_backward_calls(const tr_aot *a);
int64_t tr_aot_replays(const tr_aot *a);

/* Tests: 0 saves every value the backward reads instead of recomputing
 * elementwise chains (to measure the rule). */
extern int tr_aot_recompute;

#endif /* TR_AOT_H */
