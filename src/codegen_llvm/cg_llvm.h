/*
 * cg_llvm.h — the LLVM backend of kernel IR, as the rest of the library sees
 * it: a registered ir_backend (src/init.c registers it) plus what tests ask.
 */
#ifndef CG_LLVM_H
#define CG_LLVM_H

#include "kernel.h"

/* The backend "llvm" for KL_CPU kernels, priority 10 (the CPU default when
 * built). Kernels it cannot take run on the interpreter (one KL_LOG=codegen
 * line); the strict compile fails instead (NULL + a Kiln error), for tests. */
extern const ir_backend cg_llvm_backend;
void *cg_llvm_compile_strict(const ir_kernel *k);
int cg_llvm_is_compiled(const void *handle); /* 1 if the handle runs LLVM code */
int64_t cg_llvm_fallbacks(void);             /* kernels handed to the interpreter so far */
int64_t cg_llvm_compiles(void);              /* objects LLVM generated so far (cache hits and shared code not counted) */
/* Tests: the most compiles that ran at once (compile slots in use) since the last
 * reset; reset != 0 starts a new count from those running now. */
int cg_llvm_peak_compiles(int reset);
/* Test-only: the next n kernels LLVM would compile fail as if LLVM had
 * refused them (KL_ERR_INTERNAL inside the backend), cached or not; 0 ends it. */
void cg_llvm_fail_next(int n);
/* Test-only: while on != 0, every LLVM compile (not a cache hit or code loaded already)
 * waits before it starts: a slow compile, to test the interpreter tier's switch. */
void cg_llvm_hold_compiles(int on);
int cg_llvm_held_compiles(void); /* compiles waiting in that hold now (their keys claimed) */

#endif /* CG_LLVM_H */
