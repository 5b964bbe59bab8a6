/*
 * kiln/profiler.h — seeing what runs: log categories (KL_LOG) and the profiler
 * (Chrome trace JSON and a summary table).
 * Included by kiln.h; may also be included on its own.
 */
#ifndef KILN_PROFILER_H
#define KILN_PROFILER_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Logging (KL_LOG)                                                          */
/*                                                                          */
/* Categories: dispatch (every eager op), trace, graph (after the passes),  */
/* fusion (which ops fused into which kernel, why fusion stopped), codegen, */
/* cache, recompile, fallback (eager fallbacks), guards; "all" names every  */
/* one. A comma list sets levels as TORCH_LOGS does: "name" logs the        */
/* category at info, "+name" at debug (more detail: the traced graph, the   */
/* graph after each pass, guard-cache hits), "-name" silences it (even its  */
/* warnings); unnamed categories log warnings only. Examples:               */
/* KL_LOG=fusion,recompile   KL_LOG=+all   KL_LOG=all,-dispatch.            */
/* Lines go to stderr as "[kiln:category] message", or to the callback.     */
/* ------------------------------------------------------------------------ */

typedef enum kl_log_level { KL_LOG_OFF, KL_LOG_WARN, KL_LOG_INFO, KL_LOG_DEBUG } kl_log_level;
/* Receives one log line (no trailing newline); called with a lock held, so
 * lines from several threads arrive one at a time; Kiln's own logging from
 * inside the callback is dropped. */
typedef void (*kl_log_fn)(void *user, const char *category, kl_log_level level, const char *message);
/* Sends log lines to fn (NULL: back to stderr). */
KL_API void kl_set_log_callback(kl_log_fn fn, void *user);
/* Replaces $KL_LOG's settings with spec (same syntax; NULL or "" = warnings
 * only). Returns 0, or -1 (KL_ERR_ARG naming the unknown category; nothing
 * changes). */
KL_API int kl_set_log(const char *spec);

/* ------------------------------------------------------------------------ */
/* Profiler                                                                  */
/*                                                                          */
/*     kl_profiler_start(NULL);                                              */
/*     ... eager ops, kl_fn_call ...                                        */
/*     kl_profiler_stop("trace.json");   (chrome://tracing or Perfetto)     */
/*     kl_profiler_summary(stdout);      (table sorted by total time)       */
/*                                                                          */
/* Records eager ops (name, input shapes and dtypes, device, duration,      */
/* bytes of fresh outputs), compiled-function calls with each kernel and    */
/* library call inside them, traces, compiles (passes, codegen), guard-     */
/* cache hits, recompiles and fallbacks with their reason, from every       */
/* thread, into one ring buffer of max_events events (default 32768, 512    */
/* bytes each: 16 MiB); when it is full the oldest events are overwritten   */
/* and counted as dropped. Off, it costs the dispatcher one predictable     */
/* branch per op. Ops on meta tensors (while tracing) are not recorded.    */
/* ------------------------------------------------------------------------ */

typedef struct kl_profiler_options {
    int64_t max_events;    /* ring buffer capacity in events (0 = default, 32768) */
} kl_profiler_options;
/* Starts recording (opts NULL = defaults). Returns 0, or -1: KL_ERR_STATE if
 * already recording, KL_ERR_ARG for a negative or huge max_events (> 2^24),
 * KL_ERR_OOM. */
KL_API int kl_profiler_start(const kl_profiler_options *opts);
/* Stops recording; keeps the events for kl_profiler_summary and, if path is
 * not NULL, writes them as Chrome trace JSON there. Returns 0, or -1
 * (KL_ERR_STATE if not recording, KL_ERR_IO if the file cannot be written:
 * the events are kept anyway). */
KL_API int kl_profiler_stop(const char *path);
/* Prints the events of the last stopped session, grouped by name and
 * category, sorted by total time: self and total time, average, calls,
 * bytes. Returns 0, or -1 (KL_ERR_STATE: no session stopped yet). */
KL_API int kl_profiler_summary(FILE *stream);

#ifdef __cplusplus
}
#endif
#endif /* KILN_PROFILER_H */
