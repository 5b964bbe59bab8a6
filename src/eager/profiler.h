/*
 * profiler.h — the profiler's recording core (profiler.c): one ring buffer
 * of events shared by every thread, written lock-free, read when recording
 * stops. Eager ops are recorded by the dispatcher (ke_observed_dispatch);
 * the trace layer records compiled calls, kernels, traces and compiles
 * through ke_prof_complete / ke_prof_instant.
 */
#ifndef KE_PROFILER_H
#define KE_PROFILER_H

#include "dispatch.h"

#include <stdatomic.h>

#define KE_PROF_NAME 64
#define KE_PROF_ARGS 400

/* Event categories (the "cat" field of the Chrome trace). */
typedef enum ke_prof_cat {
    KE_PROF_OP,        /* an eager op through the dispatcher */
    KE_PROF_CALL,      /* a kl_fn_call */
    KE_PROF_KERNEL,    /* a fused kernel inside a compiled call */
    KE_PROF_LIBRARY,   /* a library call (matmul, conv, ...) inside a compiled call */
    KE_PROF_TRACE,     /* tracing a new signature */
    KE_PROF_COMPILE,   /* passes and kernel code generation */
    KE_PROF_CACHE,     /* a guard-cache hit (instant) */
    KE_PROF_RECOMPILE, /* a retrace, with its reason (instant) */
    KE_PROF_FALLBACK,  /* an eager fallback, with its reason (instant) */
    KE_PROF_NCAT
} ke_prof_cat;

extern _Atomic int ke_prof_on;
static inline int ke_prof_active(void) { return atomic_load_explicit(&ke_prof_on, memory_order_relaxed); }
/* Monotonic nanoseconds. */
int64_t ke_prof_now(void);
/* Records a complete event [t0, t1) ns. args: the body of a JSON object
 * ("\"k\": v, ..."; NULL for none), already escaped (ke_prof_json_str). */
void ke_prof_complete(ke_prof_cat cat, const char *name, int64_t t0, int64_t t1, int64_t bytes, const char *args);
/* Records an instant event now. */
void ke_prof_instant(ke_prof_cat cat, const char *name, const char *args);
/* Appends s to buf (at *used, capacity cap) as a JSON string, quotes included. */
void ke_prof_json_str(char *buf, size_t cap, size_t *used, const char *s);

/* The dispatcher's slow path while something watches (log.h, ke_observe). */
int ke_observed_dispatch(ke_call *c);
/* The dispatcher without the watch. */
int ke_dispatch_unobserved(ke_call *c);

#endif /* KE_PROFILER_H */
