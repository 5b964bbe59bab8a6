/*
 * cg.h — internals of the LLVM backend of kernel IR (cg_ prefix).
 *
 *   cg_llvm.c     the ir_backend: compile (key, caches, LLVM pipeline) and run
 *   cg_emit.c     kernel IR -> one LLVM function calling the eager loops
 *   cg_jit.c      target machine, optimization, object emission, ORC LLJIT
 *   cg_bitcode.cpp  copies the needed eager functions out of the bitcode
 *   cg_symtab.c   op -> name of its impl table in the bitcode
 *
 * Kernels compile concurrently: each compile takes a slot (cg_slot_acquire),
 * an LLVMContext of its own with the eager bitcode loaded into it once,
 * lazily, and a target machine; the slots outlive the compiles (one per
 * thread at most). cg_lock guards the slots, the loaded code list and
 * loading into the one JIT, which only ever sees object files, so it needs
 * no context of ours.
 */
#ifndef CG_H
#define CG_H

#include "cg_llvm.h"

#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

/* The compiled kernel's entry: runs items [begin, end) of the outer range.
 * bases[b] is buffer b's element [0..0]; bases[nbufs] a scratch area of
 * cg_plan.scratch bytes (row kernels). Returns 0, or (op << 32 | err) for
 * an error an eager loop raised (KE_EW_INT_DIV_ZERO). */
typedef int64_t (*cg_entry)(int64_t begin, int64_t end, char *const *bases);

#define CG_MAX_BUFS 16

/* How the domain is walked, fixed at compile time (strides are constants):
 * the domain coalesced like interp does at run time. `flat` kernels range
 * over elements of a 1-d domain; others over rows (all dims but the last),
 * each row an inner loop over the last dim. */
typedef struct cg_plan {
    int nb, nd, flat;
    int64_t shape[KL_MAX_DIMS];
    int64_t stride[CG_MAX_BUFS][KL_MAX_DIMS];
    int64_t items;    /* length of the outer range */
    int64_t per_item; /* elements per item */
    int64_t scratch;  /* bytes of scratch per thread */
} cg_plan;

void cg_plan_make(cg_plan *p, const ir_kernel *k);

/* cg_jit.c. cg_jit_init, cg_jit_disable, cg_jit_add and cg_jit_remove need
 * cg_lock held; cg_ctx, cg_master, cg_master_layout and cg_jit_optimize_emit
 * a slot acquired by this thread. */
void cg_lock(void);
void cg_unlock(void);
int cg_lock_held(void);               /* 1 if this thread holds cg_lock */
int cg_jit_init(void);                /* the JIT and target: 0 or -1 with a Kiln error */
void cg_jit_disable(const char *why); /* after an LLVM fatal error: compiles fall back */
void cg_jit_register_shutdown(void);  /* registers the exit handler (once): before any background compile */
void cg_arm_exit_gate(void);          /* on the main thread: compiles stop before exit's handlers (once) */
/* Takes a free compile slot for this thread (making one, up to the thread
 * count; else waits for one), initializing the JIT first. 0 or -1. */
int cg_slot_acquire(void);
void cg_slot_release(void);
/* After LLVM threw out of a compile (cg_guard): the slot is dropped and leaked. */
void cg_slot_abandon(void);
LLVMContextRef cg_ctx(void);
LLVMModuleRef cg_master(void); /* the eager bitcode (lazy), in this thread's slot */
LLVMTargetDataRef cg_master_layout(void);
const char *cg_cpu_name(void);
const char *cg_cpu_features(void);
/* Optimizes m (O2 with vectorizers), dumping to dbg_prefix (or NULL) the IR
 * before/after and the assembly; emits an object (malloc'd) into *obj.
 * ms[0], ms[1]: wall time spent optimizing and generating code; ms[2], ms[3]:
 * the same as this thread's CPU time (what a loaded machine does not inflate). */
int cg_jit_optimize_emit(LLVMModuleRef m, const char *name, const char *dbg_prefix, void **obj, size_t *size,
                         int *ninstr_before, int *ninstr_after, double ms[4]);
double cg_thread_cpu_ms(void); /* this thread's CPU time, ms */
/* Adds an object to the JIT under a new resource tracker and looks up sym. */
int cg_jit_add(const void *obj, size_t size, const char *sym, void **rt, void **fn);
void cg_jit_remove(void *rt);

/* cg_bitcode.cpp: a new module (same context) holding definitions of roots
 * and everything they reference; NULL and *err (malloc'd) on failure. */
LLVMModuleRef cg_bc_extract(LLVMModuleRef master, LLVMValueRef *roots, int n, char **err);

/* cg_bitcode.cpp: llvm.loop.parallel_accesses over acc[0..n) on the loop
 * whose latch branch is latch. */
void cg_mark_parallel(LLVMValueRef latch, LLVMValueRef *acc, int n);

/* cg_symtab.c: "ke_ew_add" for KE_OP_add, NULL if the row has no impl. */
const char *cg_impl_symbol(int op);

/* cg_emit.c: builds module *out with function `name` (cg_entry) for k.
 * 0, or -1 with a Kiln error (KL_ERR_UNSUPPORTED for what it cannot take). */
int cg_emit_kernel(const ir_kernel *k, const cg_plan *p, const char *name, LLVMModuleRef *out);

/* LLVM's bad-alloc and fatal-error handlers, installed once before LLVM is
 * first used: they throw, and cg_guard catches (cg_bitcode.cpp). */
void cg_install_error_handlers(void);
/* Runs fn(arg); 0, or 1 if LLVM ran out of memory (std::bad_alloc, its
 * bad-alloc handler), 2 on an LLVM fatal error; why gets the reason. What the
 * unwound frames held is leaked, and after a fatal error LLVM's state is not
 * trusted again. */
int cg_guard(void (*fn)(void *), void *arg, char *why, size_t cap);

#endif /* CG_H */
