/*
 * kernel.h — the loop-level kernel IR (prefix ir_k) and the backend interface.
 *
 * Fusion (fuse.c) groups graph nodes; lowering (lower.c) turns each group
 * into one ir_kernel, the single form the interpreter (interp.c) and the
 * code generators read. A kernel is a loop nest over an iteration domain
 * (the group's output shape) and a list of scalar statements in SSA form:
 * statement k defines value k.
 *
 *   LOAD  buf          the element of input buffer `buf` at the current
 *                      domain index: offset = sum_d idx[d] * buf.index[d]
 *                      (index[] are the buffer's strides broadcast into the
 *                      domain: 0 on broadcast dims; views of graph values are
 *                      already strides, so they need no statements)
 *   OP    op(args)     one elementwise op of the op table (KE_KIND_EW) with
 *                      its node's attributes: operands are converted to the
 *                      op's compute dtype, the op's eager loop runs, and the
 *                      result is converted to `dtype` — exactly what eager
 *                      does, so a fused elementwise kernel is bitwise equal
 *                      to the eager ops it replaces
 *   REDUCE op(arg)     (row kernels) folds arg over the last domain dim with
 *                      reduction op `op` (sum, mean, amax, amin, prod); the
 *                      result is a row value, read back broadcast over the row
 *   STORE buf, arg     writes arg at the current index of output buffer `buf`
 *                      (outputs are contiguous, shaped like the domain, or
 *                      like the domain with the last dim 1 for row values)
 *
 * Lowering stops at kernel IR: the fuse pass makes kernels, and the trace
 * layer (src/trace/compile.c) compiles them with a registered backend after
 * the last pass.
 *
 * Hints for code generators: `row` kernels loop over rows (dims 0..ndim-2,
 * the parallel outer loop) and then over the last dim (the reduction axis);
 * elementwise kernels are one flat parallel loop. buf.contig_inner marks
 * accesses that are unit-stride (vectorizable) along the last domain dim.
 */
#ifndef IR_KERNEL_H
#define IR_KERNEL_H

#include "ir.h"

#define IR_KERNEL_MAX_IN 12   /* inputs of one kernel (outputs: KE_MAX_OUT) */

typedef enum ir_kstmt_kind { IR_K_LOAD, IR_K_OP, IR_K_REDUCE, IR_K_STORE } ir_kstmt_kind;

typedef struct ir_kbuf {
    uint8_t dtype, ndim;
    uint8_t output;                /* written by the kernel (else read) */
    uint8_t contig_inner;          /* index[last domain dim] == 1 */
    uint8_t row;                   /* output of a row value (last dim 1) */
    int64_t shape[KL_MAX_DIMS];    /* the buffer's own shape and strides (elements) */
    int64_t stride[KL_MAX_DIMS];
    int64_t index[KL_MAX_DIMS];    /* strides over the kernel's domain dims (0: broadcast) */
} ir_kbuf;

typedef struct ir_kstmt {
    uint8_t kind;                  /* ir_kstmt_kind */
    uint8_t dtype;                 /* dtype of the value defined (STORE: of the buffer) */
    uint8_t compute;               /* OP: the dtype the op computes in */
    uint8_t row;                   /* a row value (one per row, after a REDUCE) */
    uint8_t bcast;                 /* OP: operands eager hands the loop as one element (bit
                                      per operand: one-element operands of a larger result;
                                      pow's shortcuts for a scalar exponent depend on it) */
    int32_t op;                    /* OP / REDUCE: ke_op */
    int32_t buf;                   /* LOAD / STORE: buffer */
    int32_t nargs;
    int32_t args[4];               /* operand statements */
    ke_attrs a;                    /* OP / REDUCE: the node's attributes */
} ir_kstmt;

typedef struct ir_kernel {
    int32_t ninputs, noutputs;     /* bufs[0..ninputs) read, then noutputs written */
    ir_kbuf *bufs;
    int32_t nstmts;
    ir_kstmt *stmts;
    uint8_t ndim;
    uint8_t row;                   /* a row kernel: the last dim is reduced */
    int64_t shape[KL_MAX_DIMS];    /* the iteration domain */
    kl_device device;              /* where it runs: its nodes' device (picks the backend) */
    _Atomic int32_t refs;          /* graphs sharing it (ir_kernel_ref; 1 when lowered) */
    const struct ir_backend *backend; /* what compiled it (ir_kernel_compile); NULL: not compiled */
    void *_Atomic handle;          /* the backend's compiled form (owned); stored after backend, so
                                      a run on another thread that sees it sees backend too */
    void *interim;                 /* tier 0 of a tiered compile (ir_kernel_interpret_meanwhile): the
                                      interpreter's handle, run while handle is NULL (owned) */
    char *ops;                     /* the ops fused into it, "add, gelu" (fuse.c; owned, may be NULL):
                                      profiler events, kl_fn_explain */
} ir_kernel;

/* ---- backends ------------------------------------------------------------------- */
/* A backend runs kernels of one device. compile returns a handle (NULL with
 * an error recorded on failure; it may keep pointers into k, which lives as
 * long as the handle); run reads in[0..ninputs) and writes out[0..noutputs),
 * tensors it is given shaped as the kernel's buffers (outputs contiguous and
 * allocated by the caller); free releases a handle.
 *
 * The IR layer knows no backend by name: each registers itself into the
 * registry below from the library's composition root (src/init.c), and the
 * trace layer's kl_compile picks one per kernel after every pass has run. */
typedef struct ir_backend {
    const char *name;              /* unique ("interp", ...): $KL_CPU_BACKEND, kl_compile_options.backend */
    kl_device_type device;         /* the device whose kernels it runs */
    int priority;                  /* the default of its device: the highest registered */
    void *(*compile)(const ir_kernel *k);
    int (*run)(void *handle, kl_tensor *const *in, kl_tensor *const *out);
    void (*free)(void *handle);
    /* Optional: writes the code it generates for k, in its own text form (LLVM IR),
     * to path (KL_COMPILE_CHECK's repro bundles). 0 or -1. */
    int (*dump)(const ir_kernel *k, const char *path);
    /* 1: compile may run on several threads at once and is slow enough to be worth it
     * (tr_compile_kernels spreads such kernels over the thread pool). */
    int concurrent;
    /* Optional: starts the backend's one-time setup off the caller's thread (kl_compile
     * calls it, so the first compile finds it done or waits for it). Idempotent. */
    void (*prepare)(void);
    /* Optional: compiles ks[0..n) (n >= 2, none compiled yet) together, so a fixed
     * cost per compiler invocation is paid once (NVRTC: one program for a graph's
     * kernels); handles[i] gets ks[i]'s handle, which run and free take as compile's.
     * 0, or -1 with no handle set (ir_kernels_compile then fails the group). */
    int (*compile_group)(ir_kernel *const *ks, int n, void **handles);
    /* Optional: k's handle (as compile's) when it costs no compile: its code is loaded in
     * this process already, or in the disk cache. NULL with no error recorded otherwise
     * (the interpreter tier then runs k until a compile in the background is done). */
    void *(*load)(const ir_kernel *k);
} ir_backend;

#define IR_MAX_BACKENDS 8

/* Adds b to the registry (thread-safe; b must outlive the library). Registering
 * the same backend twice is a no-op. 0, or -1 with KL_ERR_ARG (another backend
 * has the name) or KL_ERR_STATE (the table is full). */
int ir_backend_register(const ir_backend *b);
/* LLVM's share of compile time (optimization and machine code), added by a
 * backend that uses LLVM; the running total of this thread, in ms
 * (kl_fn_explain's per-phase compile time). */
void ir_backend_add_llvm_ms(double ms);
double ir_backend_llvm_ms(void);
/* The registered backend called name; NULL + KL_ERR_ARG listing those registered. */
const ir_backend *ir_backend_by_name(const char *name);
/* The default backend for device type t (highest priority); NULL + KL_ERR_UNSUPPORTED. */
const ir_backend *ir_backend_for_device(kl_device_type t);

/* The reference interpreter (interp.c): runs any kernel on CPU tensors. It
 * is a backend like any other (registered by src/init.c), and the one other
 * backends hand kernels to that they cannot take. */
extern const ir_backend ir_interp_backend;

/* ---- kernels ---------------------------------------------------------------------- */
/* Compiles k with backend b (its handle and backend); a kernel already
 * compiled by b is left as it is. A kernel shared by several graphs (clones)
 * is compiled once, for all of them: another backend is refused (KL_ERR_STATE).
 * 0 or -1. */
int ir_kernel_compile(ir_kernel *k, const ir_backend *b);
/* Compiles ks[0..n) with b as ir_kernel_compile does each, those not yet
 * compiled by b together through b's compile_group when it has one and
 * there are two or more (each counts as one compile). 0 or -1. */
int ir_kernels_compile(ir_kernel *const *ks, int n, const ir_backend *b);
/* Backend compiles made so far by ir_kernel_compile, over the process (tests
 * check that copying a graph compiles nothing). */
int64_t ir_kernel_compiles(void);
/* Runs a kernel: its compiled handle once one is published, else its interim
 * interpreter (tier 0); neither is KL_ERR_INTERNAL. No lock: safe while another
 * thread compiles k. 0 or -1. */
int ir_kernel_run(const ir_kernel *k, kl_tensor *const *in, kl_tensor *const *out);
/* Tiered compile, tier 0 (docs/COMPILE.md "Interpreter tier"): if b can give k's handle
 * without compiling (ir_backend.load), k gets it; else k runs on the interpreter, bitwise
 * what its compiled code computes (docs/CODEGEN.md), until a later ir_kernel_compile
 * (on any thread) publishes the handle. 1 if k still needs that compile, 0 if not,
 * -1 on error. */
int ir_kernel_interpret_meanwhile(ir_kernel *k, const ir_backend *b);
/* Kernel runs on the interpreter tier (a kernel whose compile was not done yet) made
 * by this thread so far (kl_fn_stats.interp_calls counts the calls with any). */
int64_t ir_kernel_interim_runs(void);
/* A kernel is immutable once its graph's passes are done: copies of a graph
 * share it (ref adds a reference, free drops one and frees the last). */
ir_kernel *ir_kernel_ref(ir_kernel *k);
void ir_kernel_free(ir_kernel *k);
/* 1 if k's code need not depend on its domain's outermost size: at least 2 (size-1 dims
 * coalesce away) and not the reduced dim of a row kernel. Backends may share code between
 * kernels that differ only there (the LLVM backend leaves it out of its key), so a graph
 * specialised to another batch size (src/trace/dyn.c) compiles such kernels for free. */
static inline int ir_kernel_outer_free(const ir_kernel *k) {
    return k->ndim >= 1 && k->shape[0] >= 2 && !(k->row && k->ndim == 1);
}
/* A private, not yet compiled copy of k (one reference): a graph specialised to another
 * size (src/trace/dyn.c) rewrites its sizes. NULL + KL_ERR_OOM. */
ir_kernel *ir_kernel_copy(const ir_kernel *k);
/* The text form of a kernel (KL_DEBUG_DIR dumps, tests). */
int ir_kernel_print(const ir_kernel *k, FILE *f);
char *ir_kernel_to_string(const ir_kernel *k);

/* Lowers the group of nodes members[0..n) of g (in execution order) into a
 * kernel over domain (ndim, shape): in[] are the external values it reads
 * (ninputs of them), out[] the values it must write (noutputs). NULL on
 * error. (lower.c) */
ir_kernel *ir_lower_group(const ir_graph *g, const int32_t *members, int n, int ndim, const int64_t *shape,
                          const int32_t *in, int ninputs, const int32_t *out, int noutputs);

/* 1 if node n is an elementwise op a kernel can run. */
int ir_fusible(const ir_graph *g, const ir_node *n);
/* 1 if node n is a reduction over the last dim (kept) a row kernel can run. */
int ir_row_reducible(const ir_graph *g, const ir_node *n);

#endif /* IR_KERNEL_H */
