/*
 * trace.h — the compile layer's internals (prefix tr_): tracing a C function
 * through the dispatcher into graph IR (tracer.c), running a graph on real
 * tensors (exec.c), and the compiled-function object with its guards and
 * cache (compile.c).
 */
#ifndef TR_TRACE_H
#define TR_TRACE_H

#include "kernel.h"

/* Traces fn on meta stand-ins of inputs. Returns the graph, or NULL with
 * either an error recorded (fn failed: *broke = 0) or a trace break (an op
 * needed data: *broke = 1, reason in why, no error left pending). */
ir_graph *tr_trace(kl_traceable fn, void *user, kl_tensor *const *inputs, int n_in, int n_out, int *broke,
                   char *why, size_t why_cap);

/* Real tensors fn reads that are traced as inputs instead of being captured:
 * real[k] is graph input first + k (the caller passes it there too), so a
 * compiled function's parameters can be differentiated (aot.c). */
typedef struct tr_subst {
    int n, first;
    kl_tensor *const *real;
} tr_subst;
ir_graph *tr_trace_ex(kl_traceable fn, void *user, kl_tensor *const *inputs, int n_in, int n_out,
                      const tr_subst *subst, int *broke, char *why, size_t why_cap);
/* Nodes recorded so far by this thread's trace (-1: not tracing). */
int32_t tr_trace_nnodes(void);

/* Random reservations of one call, by slot (ir.h, IR_RANDOM_SLOT): seed and
 * offset per slot, seed -1 where none was made. tr_run_graph_rs starts from
 * *rs (NULL: none) and leaves the call's reservations there, so a second
 * graph (a compiled backward) draws what the first drew. */
typedef struct tr_rand {
    int n;
    int64_t *rsv;  /* [2n], malloc'd */
} tr_rand;
int tr_run_graph_rs(const ir_graph *g, kl_tensor *const *inputs, kl_tensor **outputs, tr_rand *rs);

/* Runs g on real inputs: outputs[i] receive scope-owned results (or the
 * input / captured tensor itself). Returns 0 or -1. */
int tr_run_graph(const ir_graph *g, kl_tensor *const *inputs, kl_tensor **outputs);

/* Tests: while tr_track_peak is set, tr_run_graph records the most storages (and CPU
 * bytes) alive during its last call beyond those alive when it began. */
extern int tr_track_peak;
extern int64_t tr_peak_storages, tr_peak_bytes;

/* Op launches a graph makes per call (nodes other than views, constants and
 * captured reads); *dispatched (if not NULL) gets those that are ops run
 * through the dispatcher rather than compiled kernels. */
int64_t tr_count_launches(const ir_graph *g, int64_t *dispatched);

/* Compiles every kernel of g (after the last pass): CPU kernels with cpu
 * (NULL: the default CPU backend), others with their device's default
 * backend from the registry (kernel.h). 0 or -1. (compile.c) */
int tr_compile_kernels(ir_graph *g, const ir_backend *cpu);
/* Hooks src/init.c installs into the layers below: the Trace key's dispatch
 * handler (records one op, tracer.c), the data-access hook that turns a data
 * read while tracing into a trace break (tracer.c), and the decomposition
 * pass's subgraph tracer (ir_hooks.subtrace, subtrace.c). */
int tr_trace_handler(ke_call *c);
int tr_data_hook(const kl_tensor *t, const char *op);
/* ke_hooks.trace_device: a traced value's real device. */
kl_device tr_device_hook(const kl_tensor *t);
/* ke_hooks.trace_backward: a backward pass while tracing. It breaks the trace
 * when gradients would reach a captured tensor requiring grad that fn used in
 * grad mode (kl_backward accumulating into its .grad, kl_autograd_grad with
 * respect to it or with create_graph): the graph holds such a tensor as a
 * constant, so the signature runs eagerly. */
int tr_backward_hook(const char *op, int accumulate, int create_graph, int n_in, kl_tensor *const *inputs);
ir_graph *tr_subtrace(const ir_graph *g, const ir_node *n);

/* ---- KL_COMPILE_CHECK (compile.c) and its minifier (repro.c) ---------------------------- */
/* KL_COMPILE_CHECK's tolerance for dtype d (relative and absolute). */
double tr_tolerance(kl_dtype d);
/* 1 if a and b have one dtype and shape and agree within tr_tolerance (NaN equals NaN). */
int tr_same_values(kl_tensor *a, kl_tensor *b);
/* Writes each kernel of g to dir: kernel IR as kernel<N>.txt and, where its backend can
 * (ir_backend.dump, a compiled kernel), the generated code as kernel<N>.ll. 0 or -1. (repro.c) */
int tr_dump_kernels(const ir_graph *g, const char *dir);
/* tr_dump_kernels of f's most recent graph (none: nothing written). 0 or -1. */
int tr_fn_dump_kernels(const kl_fn *f, const char *dir);
/* Nonzero while this thread minifies: functions compiled meanwhile skip KL_COMPILE_CHECK. */
extern _Thread_local int tr_in_repro;
/* KL_COMPILE_CHECK found that f's compiled call differs from eager (fail_code 0), or that its
 * compile failed with status fail_code (what: the error's message): shrinks traced (the
 * signature's graph as traced; inputs: the call's inputs before it ran) to a smallest
 * subgraph that still differs, or whose compile still fails with the same status and message
 * up to its first digit, compiled with o, and writes a repro bundle whose folder is put in
 * dir (repro.c says what it holds). 0, or -1 with an error recorded. */
int tr_repro(const ir_graph *traced, kl_tensor *const *inputs, int n_in, const kl_compile_options *o, const char *what,
             int fail_code, char *dir, size_t dir_cap);

/* The error pending (a mismatch KL_COMPILE_CHECK found, or a failed compile: fail_code is its
 * status) gets the bundle of tr_repro(traced, ...) at its end, "; repro bundle: DIR", or why
 * there is none, " (no repro bundle: ...)"; the random generator is left as it was. -1. */
int tr_repro_error(const ir_graph *traced, kl_tensor *const *inputs, int n_in, const kl_compile_options *o,
                   int fail_code);

#endif /* TR_TRACE_H */
