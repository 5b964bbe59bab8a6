/*
 * kiln/compile.h — compile mode: kl_compile traces a C function once per signature,
 * fuses and compiles it (LLVM on CPU, NVRTC on CUDA); options, statistics,
 * explain text and ahead-of-time bundles.
 * Included by kiln.h; may also be included on its own.
 */
#ifndef KILN_COMPILE_H
#define KILN_COMPILE_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Compile mode                                                              */
/*                                                                          */
/*     static int step(void *user, kl_tensor *const *in, int n_in,           */
/*                     kl_tensor **out, int n_out) {                         */
/*         out[0] = kl_gelu(kl_add(in[0], in[1]));                           */
/*         return out[0] ? 0 : -1;                                           */
/*     }                                                                    */
/*     kl_fn *f = kl_compile(step, NULL, NULL);                              */
/*     kl_tensor *y;                                                         */
/*     kl_fn_call(f, (kl_tensor *[]){a, b}, 2, &y, 1);                       */
/*     kl_fn_release(f);                                                     */
/*                                                                          */
/* The first call with a new input signature (dtype, shape, strides, device, */
/* requires_grad of each input, grad mode) traces fn once with meta tensors  */
/* that carry no data: every op it calls is recorded into a graph, which is  */
/* optimized and cached; later calls with the same signature run the graph.  */
/* So side effects in fn (printf, counters, reading globals) happen only     */
/* while tracing, as in JAX. An op that needs data during tracing (kl_item,  */
/* kl_data_ptr, printing, comparisons) stops the trace: that signature runs  */
/* eagerly from then on, with the reason logged once (KL_LOG=fallback).      */
/* Tensors fn uses that are not inputs are read at every call, never baked   */
/* in. After recompile_limit signatures the function runs eagerly.           */
/* fn may call kl_autograd_grad on a loss it computes from its own leaves,  */
/* so a whole training step (loss and gradients) compiles into one graph;   */
/* a backward reaching a captured tensor that requires grad (kl_backward    */
/* into its .grad, kl_autograd_grad with respect to it) stops the trace as  */
/* kl_item does, and that signature runs eagerly;                           */
/* random ops draw fresh numbers at every call, as eagerly.                 */
/* Called in grad mode with inputs (or captured tensors) requiring grad,    */
/* FUSE mode compiles the forward and a backward traced from it, and each   */
/* call inserts one autograd node: kl_backward from eager code then runs    */
/* the compiled backward (docs/COMPILE.md); create_graph through it replays */
/* the function op by op. Replacing a captured tensor that requires grad    */
/* (and releasing the old one) retraces.                                    */
/* In FUSE mode CPU kernels are compiled with LLVM and cached on disk       */
/* (KL_CACHE_DIR; see README); the first call of a new signature pays the   */
/* trace and compile (tens of ms per kernel; under 1 ms from the cache).    */
/* Environment (read by kl_compile, so it applies to functions compiled     */
/* after it is set): KL_COMPILE=0 runs the function eagerly;                 */
/* KL_COMPILE_CHECK=1 also runs fn eagerly on copies of the inputs and fails */
/* the call (KL_ERR_STATE) if an output differs beyond the dtype's tolerance */
/* (f64 1e-9, f32 1e-4, f16 1e-2, bf16 5e-2 relative+absolute; exact for    */
/* integers and bool); its eager run replays the random counters the       */
/* compiled call drew (the generator is then left where that call left it;  */
/* no other thread may draw random numbers during a checked call). On a     */
/* mismatch it also minifies: the signature's graph as traced is cut down  */
/* (delta debugging over its nodes) to a smallest subgraph that still      */
/* differs, written with its inputs (.npy), graph, kernel and LLVM IR and a */
/* replay.c (builds against the installed library with pkg-config; exit 1: */
/* reproduced) to a folder $KL_DEBUG_DIR/kiln_repro_<pid>_<n> (./ without   */
/* KL_DEBUG_DIR); the error ends "; repro bundle: <folder>" and KL_LOG's    */
/* graph category warns with the node counts (README, "Repro bundles").    */
/* KL_LOG=trace,graph,fusion,recompile,... logs what happens ("Logging").  */
/* ------------------------------------------------------------------------ */

typedef struct kl_fn kl_fn;
/* An eager function: reads n_in inputs, writes n_out outputs (scope-owned
 * results of kl_ ops, or inputs). Returns 0, or -1 with an error recorded. */
typedef int (*kl_traceable)(void *user, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out);

typedef enum kl_compile_mode {
    KL_COMPILE_OFF,        /* call fn eagerly every time */
    KL_COMPILE_TRACE_ONLY, /* trace, then run the recorded graph op by op (no passes) */
    KL_COMPILE_NO_FUSE,    /* trace and optimize, run op by op */
    KL_COMPILE_FUSE        /* trace, optimize and fuse (the default) */
} kl_compile_mode;

typedef struct kl_compile_options {
    kl_compile_mode mode;
    int recompile_limit;   /* signatures traced before falling back to eager (default 8) */
    const char *name;      /* for logs and dumps (default "fn") */
    const char *backend;   /* CPU kernels of FUSE mode: a registered backend's name, "llvm" (the
                              default when built with LLVM) or "interp" (the reference
                              interpreter); NULL = $KL_CPU_BACKEND if set, else the default */
    /* Dynamic sizes (docs/COMPILE.md "Dynamic sizes"): bit i marks dim 0 of input i (i < 64) as
     * one batch size s shared by every marked input. The first call then traces and compiles
     * a graph that serves every s >= 2 without another trace or LLVM compile; calls whose
     * marked dims disagree, or s = 0 or 1, take (or trace) entries of their own. A function
     * that cannot be made dynamic stays static, with the reason in KL_LOG=recompile and
     * kl_fn_explain. Marking runs fn three times while tracing (two probe sizes). 0: none. */
    uint64_t dynamic_dims;
    /* Automatic dynamic (1 in kl_compile_options_default): a retrace whose only failed guards
     * are input dims that all went from one size to another (both >= 2) traces those dims as
     * dynamic, so later sizes reuse that entry. */
    int auto_dynamic;
    /* Tiered execution (docs/COMPILE.md "Compile latency"), 0 in kl_compile_options_default:
     * 1 = a new signature is traced and optimized at once, its kernels compile on a background
     * thread, and its calls run fn eagerly until they are ready, then the compiled graph (a
     * new size's dynamic entry too). Off by default: which calls run eagerly depends on timing.
     * $KL_COMPILE_ASYNC=1 / 0 turns it on / off for every function, whatever this says. */
    int async;
    /* Interpreter tier (docs/COMPILE.md "Interpreter tier"): with it a new signature's kernels
     * compile in the background and each runs on the reference interpreter until its code is
     * loaded (bitwise the same results: calls never wait for LLVM, and stay repeatable).
     * 0 = the default: on when kl_get_num_threads() >= 2 as the signature is traced, off with one
     * thread (the background compile would share the only core) and under $KL_COMPILE_CHECK;
     * 1 = on, -1 = off (a first call then compiles its kernels before it returns); async = 1
     * takes precedence. $KL_COMPILE_INTERP=1 / 0 turns it on / off for every function, whatever
     * this says. kl_fn_wait_compiled waits for the code (before timing calls, say). */
    int interp_tier;
} kl_compile_options;
KL_API kl_compile_options kl_compile_options_default(void);

/* A compiled wrapper of fn (opts NULL = defaults; copied, name included, so
 * they may be freed after the call). user is passed to fn. */
KL_API kl_fn *kl_compile(kl_traceable fn, void *user, const kl_compile_options *opts);
/* Calls the compiled function: outputs[0..n_out) receive scope-owned results
 * (or the input itself where fn returns an input). n_in and n_out are fixed
 * by the first call; other counts later are KL_ERR_ARG naming both. Returns
 * 0, or -1 with an error recorded (bad arguments, fn's own errors, a failed
 * check; KL_ERR_STATE when fn calls kl_fn_call on f itself while f traces
 * it, which used to deadlock). An error already pending when it is called does not change the
 * result (it is set aside and stays the recorded one: first error wins). */
KL_API int kl_fn_call(kl_fn *f, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out);
KL_API void kl_fn_release(kl_fn *f);
/* Waits until no kernels of f compile in the background (tiered execution, the interpreter
 * tier); the next call of such a signature runs compiled. Returns 0, or -1 (NULL f). */
KL_API int kl_fn_wait_compiled(kl_fn *f);

typedef struct kl_fn_stats {
    int64_t calls;            /* kl_fn_call calls */
    int64_t traces;           /* signatures traced (successfully or not) */
    int64_t cache_hits;       /* calls served by a cached graph */
    int64_t recompiles;       /* traces after the first */
    int64_t eager_calls;      /* calls run eagerly (mode off, trace break, limit) */
    int64_t graph_ops;        /* ops in the graphs cached now */
    int64_t kernels;          /* kernels (or op launches) per call, summed over cached graphs */
    int64_t library_calls;    /* of those, the ops run through the dispatcher (eager kernels,
                                 BLAS) rather than as a compiled kernel */
    double compile_ms;        /* total time spent tracing and optimizing */
    char last_reason[256];    /* why the last trace happened or fell back */
    /* Differentiable calls (grad mode, an input or captured tensor requiring grad; FUSE mode): */
    int64_t aot_calls;        /* ran the compiled forward and recorded one autograd node */
    int64_t opbyop_grad_calls; /* ran their graph op by op so autograd records each op (the fallback) */
    int64_t backward_kernels; /* launches of the compiled backward graphs, summed over cached graphs */
    int64_t backward_calls;   /* compiled backward graphs run by backward passes */
    int64_t double_backward_replays; /* create_graph through a compiled node: replayed op by op */
    int64_t saved_bytes;      /* bytes of the values the last aot call saved for backward (inputs and
                                 captured tensors, held by reference, not counted) */
    char grad_fallback[256];  /* why the last differentiable signature runs op by op ("" if none) */
    int64_t dynamic_entries;  /* cache entries serving every size of a dynamic dim */
    int64_t specialisations;  /* graphs of dynamic entries specialised to a new size (no trace or
                                 LLVM compile: their numbers rewritten, kernels' code shared) */
    int64_t async_eager_calls; /* calls run eagerly while their kernels compiled in the background */
    int64_t interp_calls;     /* calls that ran kernels on the interpreter tier (not compiled yet) */
} kl_fn_stats;
/* Fills *out with f's counters. Returns 0 or -1. */
KL_API int kl_fn_get_stats(const kl_fn *f, kl_fn_stats *out);
/* Writes the graph cached for the most recent signature as text (the IR's
 * stable form) into buf (snprintf semantics). Returns the full length or -1. */
KL_API int kl_fn_graph_text(const kl_fn *f, char *buf, size_t cap);
/* Explains f to stream: per cache entry, why it was traced, its guards,
 * compile time per phase (trace, passes, codegen and LLVM's share of it), the
 * graph after the passes, which ops fused into which kernel, why fusion
 * stopped where it did, the memory plan's peak; then every recompile with
 * its reason. Returns 0, or -1 (NULL argument; KL_ERR_IO on a write error). */
KL_API int kl_fn_explain(const kl_fn *f, FILE *stream);

#ifdef __cplusplus
}
#endif
#endif /* KILN_COMPILE_H */
