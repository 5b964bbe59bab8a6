/* Kiln eager runtime: intra-op thread pool.
 *
 * One process-wide pool.  The thread that calls ke_parallel_for acts as
 * worker 0, so a pool configured for N threads owns N-1 helper threads.
 * Helpers are started on first parallel use, spin briefly after each task
 * (dispatch to a hot helper is sub-microsecond, while waking a parked one
 * costs tens of microseconds), then park on a futex.  ke_pool_quiesce
 * parks them at once.
 */
#ifndef KILN_EAGER_THREADPOOL_H
#define KILN_EAGER_THREADPOOL_H

#include <stdint.h>

#ifndef KL_API
#define KL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*ke_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) and returns when every chunk has finished.
 *
 * Parallel only if n >= 2*grain (grain < 1 counts as 1), more than one
 * thread is configured, the caller is not already inside a parallel region,
 * and no other user thread is using the pool at that moment.  Otherwise fn
 * runs once, inline, as fn(ctx, 0, n).  n <= 0 does nothing.
 *
 * When parallel, [0, n) is cut into min(threads, n / grain) contiguous
 * non-empty chunks.  Interior boundaries are multiples of 64 whenever
 * chunks are at least 64 long.  The cut depends only on (n, grain,
 * threads) -- threads being kl_get_num_threads() unless helpers could not
 * be created -- so it is repeatable; which thread runs which chunk is not,
 * except that the caller always runs the chunk starting at 0.  Helpers and
 * the caller claim the remaining chunks first come, first served, so a
 * parked or preempted helper never holds up a chunk it has not started.
 * fn must give the same result for the inline single-chunk case, and must
 * not wait for other chunks of the same call (they may run after it, on
 * this very thread).
 *
 * fn runs with ke_in_parallel_region() == 1; a ke_parallel_for issued from
 * inside fn runs inline.  kl_set_num_threads called inside fn applies from
 * the next top-level call. */
void ke_parallel_for(int64_t n, int64_t grain, ke_range_fn fn, void *ctx);

/* Tells spinning helpers to park now instead of finishing their spin.
 * Call right before handing the cores to another pool (OpenBLAS) so two
 * pools don't fight over 2 cores.  Cheap; does not wait for them to park
 * (a helper notices within a few hundred nanoseconds).  The next
 * ke_parallel_for wakes them again at the usual wake-up cost. */
void ke_pool_quiesce(void);

/* 1 while the calling thread runs inside fn of a ke_parallel_for (inline or
 * pooled), or is a pool helper; else 0. */
int ke_in_parallel_region(void);

/* Diagnostics for tests: helper threads running, and how many of them are
 * parked in the kernel right now (the rest are spinning or busy). */
int ke_pool_live_workers(void);
int ke_pool_parked_workers(void);

/* How long idle helpers (and a caller waiting for helpers) poll before
 * sleeping; us < 0 restores the built-in default (KE_POOL_SPIN_NS, 80 us).
 * Longer trades CPU burnt while idle for fewer ~50 us wake-ups. */
void ke_pool_set_spin_us(int64_t us);

/* Lowers the calling thread's scheduling priority for good (Linux: nice +10,
 * this thread only; elsewhere nothing): for a thread doing background work
 * (a tiered compile, the JIT's setup) while the caller's threads run calls,
 * so that those are not slowed down by sharing the cores with it. */
void ke_thread_background(void);

/* Makes the calling thread's parallel work run on it alone (on != 0): its
 * ke_parallel_for runs inline and its BLAS calls (ke_blas_prepare) ask
 * OpenBLAS for one thread. For calls that run while a background compile holds
 * the other cores: a helper they handed work to waited for a core, and
 * OpenBLAS's caller spins (sched_yield) until its helper has run. Returns the
 * previous setting, for restoring it. */
int ke_thread_serial(int on);
int ke_thread_is_serial(void);

/* public: declared in kiln.h too */

/* Threads used by ke_parallel_for, caller included.  Defaults to
 * KL_NUM_THREADS when it holds an integer >= 1, else the number of CPUs the
 * process may run on (affinity mask), else the number of online CPUs. */
KL_API int kl_get_num_threads(void);

/* n < 1 is taken as 1; values above 1024 are clamped to 1024.  Helpers of
 * the old size are joined here (or, when called from inside a parallel
 * region, at the next top-level ke_parallel_for) and new ones start lazily.
 * Do not call it while another thread is inside ke_parallel_for.  If that
 * happens anyway it stays safe: this call waits for that one to finish, and
 * which thread count that one used is unspecified. */
KL_API void kl_set_num_threads(int n);

#ifdef __cplusplus
}
#endif

#endif /* KILN_EAGER_THREADPOOL_H */
