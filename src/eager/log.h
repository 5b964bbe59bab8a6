/*
 * log.h — KL_LOG: categories with levels, in the style of TORCH_LOGS, written
 * as one line per event ("[kiln:category] message") to stderr or to the
 * callback the program installed (kl_set_log_callback). The syntax is in
 * kiln.h ("Logging") and the README.
 */
#ifndef KE_LOG_H
#define KE_LOG_H

#include "kiln.h"

typedef enum ke_log_cat {
    KE_LOG_DISPATCH,  /* every eager op the dispatcher runs (name, inputs, result) */
    KE_LOG_TRACE,     /* traces: what was traced and why; +trace: the graph as traced */
    KE_LOG_GRAPH,     /* the graph after the passes (+graph: after each pass) */
    KE_LOG_FUSION,    /* which ops fused into which kernel, and why fusion stopped */
    KE_LOG_CODEGEN,   /* kernel compiles (LLVM): statements, instructions, ms */
    KE_LOG_CACHE,     /* the on-disk kernel cache; +cache: guard-cache hits */
    KE_LOG_RECOMPILE, /* retraces with the guard that failed; the recompile limit */
    KE_LOG_FALLBACK,  /* eager fallbacks: trace breaks, the interpreter instead of LLVM */
    KE_LOG_GUARDS,    /* the guards of each new cache entry */
    KE_LOG_NCAT
} ke_log_cat;

/* Each category's level (kl_log_level; 0 = off), filled from $KL_LOG at the
 * first ke_log_on / ke_log_init, or by kl_set_log. */
extern _Atomic unsigned char ke_log_levels[KE_LOG_NCAT];
/* Reads $KL_LOG once (idempotent, thread-safe). */
void ke_log_init(void);
const char *ke_log_cat_name(ke_log_cat cat);

/* 1 if cat logs messages of level lv (KL_LOG_INFO for ke_log). */
int ke_log_at(ke_log_cat cat, kl_log_level lv);
static inline int ke_log_on(ke_log_cat cat) { return ke_log_at(cat, KL_LOG_INFO); }
/* Writes the line if cat is on at lv. */
void ke_logl(ke_log_cat cat, kl_log_level lv, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define ke_log(cat, ...) ke_logl(cat, KL_LOG_INFO, __VA_ARGS__)

/* The dispatcher's one test for "someone is watching" (the profiler records,
 * or KL_LOG=dispatch): nonzero sends every ke_dispatch through ke_observed_dispatch.
 * Starts at 1 so the first op reads $KL_LOG; then 0 unless a watcher is on. */
extern _Atomic int ke_observe;
void ke_observe_update(void);

#endif /* KE_LOG_H */
