/*
 * dyn.h — dynamic sizes (dyn.c; docs/COMPILE.md "Dynamic sizes"): one traced and
 * compiled graph serving every value s >= 2 of one size, specialised per size by
 * rewriting its numbers (no retrace, no LLVM work).
 */
#ifndef TR_DYN_H
#define TR_DYN_H

#include "trace.h"

#define TR_DYN_KEEP 16 /* specialised copies kept per entry; more sizes make one per call */

typedef struct tr_dyn tr_dyn;

/* From the template t (every pass run, kernels compiled) at size s0 and the same function
 * traced and passed at the probe sizes s1 and s2 (kernels not compiled): takes t (owned by
 * the result) when every number that differs is a*s + c (or a/s + c for doubles) and the
 * graphs agree otherwise. NULL with why filled (t not taken) where not; NULL with an error
 * recorded (KL_ERR_OOM) on failure. */
tr_dyn *tr_dyn_make(ir_graph *t, int64_t s0, ir_graph *p1, int64_t s1, ir_graph *p2, int64_t s2, char *why,
                    size_t cap);
void tr_dyn_free(tr_dyn *d);
/* The graph for size s: the template, a kept copy, or a new copy with its kernels compiled
 * (cpu as tr_compile_kernels); *transient = 1 when the caller must free it after the call.
 * Not thread-safe: the caller's lock. NULL + error. */
ir_graph *tr_dyn_graph(tr_dyn *d, int64_t s, const ir_backend *cpu, int *transient);
/* A new copy of the template specialised to s, kernels compiled; a kernel whose template
 * kernel is not compiled yet (the interpreter tier: it compiles in the background) runs
 * on the interpreter meanwhile (ir_kernel_interpret_meanwhile). NULL + error. */
ir_graph *tr_dyn_specialise(const tr_dyn *d, int64_t s, const ir_backend *cpu);
/* Compiles the kept copies' kernels left on the interpreter (their template's code is
 * loaded now: no LLVM work). 0, or -1 (those that failed stay interpreted). */
int tr_dyn_compile_pending(tr_dyn *d, const ir_backend *cpu);
int32_t tr_dyn_nsites(const tr_dyn *d);      /* numbers rewritten per size */
int64_t tr_dyn_size(const tr_dyn *d);        /* the template's size */
ir_graph *tr_dyn_template(const tr_dyn *d);
int tr_dyn_ninstances(const tr_dyn *d);      /* copies kept */

#endif /* TR_DYN_H */
