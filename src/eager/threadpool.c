/* Kiln eager runtime: intra-op thread pool (see threadpool.h). */
#define _GNU_SOURCE
#include "threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* How long a helper keeps polling for the next task, and how long the
 * caller polls for helpers to finish, before sleeping on a futex.  Eager
 * code issues ops back to back, so the next dispatch usually lands well
 * inside this window; a futex wake-up costs ~50 us on the target VMs, which
 * is what this spin buys back. */
#ifndef KE_POOL_SPIN_NS
#define KE_POOL_SPIN_NS 80000
#endif
static _Atomic uint64_t ke_spin_ns = KE_POOL_SPIN_NS;

/* Polling first uses only the pause instruction; after this long it also
 * yields now and then, so that if the machine is oversubscribed the thread
 * we are waiting for can get the core. */
#define KE_POOL_YIELD_AFTER_NS 10000

#define KE_MAX_THREADS 1024

/* Chunks at least this long get interior boundaries rounded to a multiple
 * of it, so no two threads write the same cache line and vector loops start
 * aligned relative to the base. */
#define KE_CHUNK_ALIGN 64

typedef struct {
    /* Everything a dispatch touches lives in one cache line, so starting a
     * helper and hearing back from it costs few line transfers.
     *
     * claim packs (gen:32 | nchunks:16 | next chunk:16).  A thread owns a
     * chunk only by advancing claim with a CAS that also matches gen, so a
     * helper that wakes late for an old task changes nothing and never reads
     * the task.  The task fields are plain: they are written before the
     * release increment of gen and rewritten only after every claimed chunk
     * has been reported through done (release), so claimants read them
     * race-free. */
    _Alignas(64) atomic_uint gen;
    atomic_int quiesced;
    _Atomic uint64_t claim;
    atomic_uint done; /* chunks finished by helpers, ever; only grows */
    atomic_int join_waiting;
    ke_range_fn fn;
    void *ctx;
    int64_t n;

    _Alignas(64) atomic_int sleepers;

    /* Atomic because a helper that found no chunk to claim may still be
     * reading it when the pool is stopped. */
    atomic_int shutdown;
    unsigned start_gen;
    pthread_t *threads;
    int nworkers; /* helpers running */
    int wanted;   /* helpers asked for; more than nworkers if creation failed */
} ke_pool;

static ke_pool P;

/* Serialises use of the pool.  User threads take it with trylock and fall
 * back to running inline, so two user threads never wait on each other. */
static pthread_mutex_t ke_pool_lock = PTHREAD_MUTEX_INITIALIZER;

static atomic_int ke_nthreads;     /* 0 until first read */
static atomic_int ke_live_workers; /* diagnostics only */

static __thread int ke_tls_in_parallel;
static __thread int ke_tls_is_worker;
static __thread int ke_tls_serial; /* ke_thread_serial */

static void ke_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static uint64_t ke_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ke_futex_wait(atomic_uint *addr, unsigned expected) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL,
            NULL, 0);
}

static void ke_futex_wake(atomic_uint *addr, int count) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, count, NULL,
            NULL, 0);
}

/* Polls until (*addr == val) == until_equal, giving up after the spin
 * budget or, when stop_on_quiesce, as soon as ke_pool_quiesce was called.
 * Returns 1 if the condition was met.  The clock is read only every 64
 * polls to keep the poll loop tight. */
static int ke_spin(atomic_uint *addr, unsigned val, int until_equal,
                   int stop_on_quiesce) {
    uint64_t start = 0, budget = atomic_load_explicit(&ke_spin_ns,
                                                    memory_order_relaxed);
    int yielding = 0;
    for (unsigned it = 1;; it++) {
        if ((atomic_load_explicit(addr, memory_order_acquire) == val) ==
            until_equal)
            return 1;
        if (stop_on_quiesce &&
            atomic_load_explicit(&P.quiesced, memory_order_relaxed))
            return 0;
        if ((it & 63) == 0) {
            uint64_t now = ke_now_ns();
            if (start == 0)
                start = now;
            else if (now - start > budget)
                return 0;
            else if (now - start > KE_POOL_YIELD_AFTER_NS)
                yielding = 1;
            if (yielding)
                sched_yield();
        }
        ke_cpu_relax();
    }
}

static int64_t ke_chunk_bound(int64_t n, int nchunks, int i) {
    if (i <= 0)
        return 0;
    if (i >= nchunks)
        return n;
    /* floor(n*i/nchunks) without the overflow of n*i (r*i < 2^20). */
    int64_t q = n / nchunks, r = n % nchunks;
    int64_t b = q * i + r * i / nchunks;
    /* Exact bounds are >= n/nchunks >= 64 apart, so rounding each to the
     * nearest multiple of 64 keeps every chunk non-empty and in order. */
    if (n / nchunks >= KE_CHUNK_ALIGN)
        b = (b + KE_CHUNK_ALIGN / 2) & ~(int64_t)(KE_CHUNK_ALIGN - 1);
    return b;
}

static uint64_t ke_claim_word(unsigned gen, int nchunks, int next) {
    return (uint64_t)gen << 32 | (uint64_t)nchunks << 16 | (uint64_t)next;
}

static void ke_run_chunk(int nchunks, int idx) {
    P.fn(P.ctx, ke_chunk_bound(P.n, nchunks, idx),
         ke_chunk_bound(P.n, nchunks, idx + 1));
}

/* Claims and runs chunks of task g until none are left; returns how many
 * this thread ran. */
static int ke_claim_and_run(unsigned g) {
    int ran = 0;
    uint64_t w = atomic_load_explicit(&P.claim, memory_order_acquire);
    for (;;) {
        int nchunks = (int)(w >> 16 & 0xffff), next = (int)(w & 0xffff);
        if ((unsigned)(w >> 32) != g || next >= nchunks)
            return ran;
        if (atomic_compare_exchange_weak_explicit(&P.claim, &w, w + 1,
                                                  memory_order_acquire,
                                                  memory_order_acquire)) {
            ke_run_chunk(nchunks, next);
            ran++;
            w = atomic_load_explicit(&P.claim, memory_order_acquire);
        }
    }
}

static unsigned ke_worker_wait(unsigned seen) {
    if (ke_spin(&P.gen, seen, 0, 1))
        return atomic_load_explicit(&P.gen, memory_order_acquire);
    for (;;) {
        /* sleepers is raised before gen is re-read; the dispatcher bumps gen
         * before reading sleepers.  Both seq_cst, so either it sees us and
         * wakes us, or we see its new gen (here or inside FUTEX_WAIT). */
        atomic_fetch_add(&P.sleepers, 1);
        if (atomic_load(&P.gen) == seen)
            ke_futex_wait(&P.gen, seen);
        atomic_fetch_sub(&P.sleepers, 1);
        unsigned g = atomic_load_explicit(&P.gen, memory_order_acquire);
        if (g != seen)
            return g;
    }
}

static void *ke_worker_main(void *arg) {
    ke_tls_is_worker = 1;
    ke_tls_in_parallel = 1;
    (void)arg;
    unsigned seen = P.start_gen;
    for (;;) {
        seen = ke_worker_wait(seen);
        if (atomic_load_explicit(&P.shutdown, memory_order_relaxed))
            return NULL;
        int ran = ke_claim_and_run(seen);
        if (ran == 0)
            continue;
        /* Same seq_cst pairing as sleepers/gen, for the caller's join. */
        atomic_fetch_add(&P.done, (unsigned)ran);
        if (atomic_load(&P.join_waiting))
            ke_futex_wake(&P.done, 1);
    }
}

static void ke_pool_stop_locked(void) {
    P.wanted = 0;
    if (P.nworkers == 0)
        return;
    atomic_store_explicit(&P.shutdown, 1, memory_order_relaxed);
    atomic_fetch_add(&P.gen, 1);
    ke_futex_wake(&P.gen, INT_MAX);
    for (int i = 0; i < P.nworkers; i++)
        pthread_join(P.threads[i], NULL);
    free(P.threads);
    P.threads = NULL;
    P.nworkers = 0;
    atomic_store(&P.shutdown, 0);
    atomic_store(&P.sleepers, 0);
    atomic_store(&ke_live_workers, 0);
}

static pthread_once_t ke_atfork_once = PTHREAD_ONCE_INIT;
static int ke_fork_held_lock;

static void ke_atfork_prepare(void) {
    /* A helper (or fn) that forks runs while the pool lock is held by the
     * dispatcher that waits for it; taking the lock there would deadlock. */
    ke_fork_held_lock = !ke_tls_in_parallel;
    if (ke_fork_held_lock)
        pthread_mutex_lock(&ke_pool_lock);
}

static void ke_atfork_parent(void) {
    if (ke_fork_held_lock)
        pthread_mutex_unlock(&ke_pool_lock);
}

static void ke_atfork_child(void) {
    /* Helpers do not survive fork; forget them so the child starts its own
     * on first use.  Their pthread_t handles are meaningless here. */
    pthread_mutex_init(&ke_pool_lock, NULL);
    free(P.threads);
    P.threads = NULL;
    P.nworkers = 0;
    P.wanted = 0;
    atomic_store(&P.shutdown, 0);
    atomic_store(&P.sleepers, 0);
    atomic_store(&P.done, 0);
    atomic_store(&P.join_waiting, 0);
    atomic_store(&ke_live_workers, 0);
}

static void ke_register_atfork(void) {
    pthread_atfork(ke_atfork_prepare, ke_atfork_parent, ke_atfork_child);
}

static void ke_pool_start_locked(int want) {
    pthread_once(&ke_atfork_once, ke_register_atfork);
    P.wanted = want;
    P.threads = calloc((size_t)want, sizeof *P.threads);
    if (!P.threads)
        return;
    P.start_gen = atomic_load(&P.gen);
    /* Helpers inherit a fully blocked mask, so process-directed signals keep
     * going to user threads that expect them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int made = 0;
    for (; made < want; made++) {
        if (pthread_create(&P.threads[made], NULL, ke_worker_main, NULL) != 0)
            break;
        pthread_setname_np(P.threads[made], "kiln-worker");
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* Running short-handed beats failing: the chunk count follows the
     * helpers actually started. */
    P.nworkers = made;
    atomic_store(&ke_live_workers, made);
    if (made == 0) {
        free(P.threads);
        P.threads = NULL;
    }
}

static void ke_run_inline(int64_t n, ke_range_fn fn, void *ctx) {
    int prev = ke_tls_in_parallel;
    ke_tls_in_parallel = 1;
    fn(ctx, 0, n);
    ke_tls_in_parallel = prev;
}

void ke_parallel_for(int64_t n, int64_t grain, ke_range_fn fn, void *ctx) {
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (ke_tls_in_parallel || ke_tls_serial || n / grain < 2) {
        ke_run_inline(n, fn, ctx);
        return;
    }
    int nt = kl_get_num_threads();
    if (nt <= 1 || pthread_mutex_trylock(&ke_pool_lock) != 0) {
        ke_run_inline(n, fn, ctx);
        return;
    }
    if (P.wanted != nt - 1) {
        ke_pool_stop_locked();
        ke_pool_start_locked(nt - 1);
    }
    if (P.nworkers == 0) {
        pthread_mutex_unlock(&ke_pool_lock);
        ke_run_inline(n, fn, ctx);
        return;
    }

    int64_t maxc = n / grain;
    int nchunks = maxc < P.nworkers + 1 ? (int)maxc : P.nworkers + 1;
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    unsigned base = atomic_load_explicit(&P.done, memory_order_relaxed);
    unsigned g = atomic_load_explicit(&P.gen, memory_order_relaxed) + 1;
    /* Chunk 0 is the caller's from the start: it needs no CAS, and a cold
     * pool cannot delay the first chunk. */
    atomic_store_explicit(&P.claim, ke_claim_word(g, nchunks, 1),
                          memory_order_relaxed);
    if (atomic_load_explicit(&P.quiesced, memory_order_relaxed))
        atomic_store_explicit(&P.quiesced, 0, memory_order_relaxed);
    atomic_store(&P.gen, g);
    if (atomic_load(&P.sleepers) > 0)
        ke_futex_wake(&P.gen, nchunks - 1);

    /* The caller also takes whatever chunks helpers have not claimed yet,
     * so parked helpers (a ~50 us wake-up) or a preempted one delay the
     * call only by the chunks they actually started. */
    ke_tls_in_parallel = 1;
    ke_run_chunk(nchunks, 0);
    int mine = 1 + ke_claim_and_run(g);
    ke_tls_in_parallel = 0;

    unsigned target = base + (unsigned)(nchunks - mine);
    if (target != base && !ke_spin(&P.done, target, 1, 0)) {
        atomic_store(&P.join_waiting, 1);
        unsigned cur;
        while ((cur = atomic_load(&P.done)) != target)
            ke_futex_wait(&P.done, cur);
        atomic_store(&P.join_waiting, 0);
    }
    pthread_mutex_unlock(&ke_pool_lock);
}

void ke_pool_quiesce(void) {
    if (!atomic_load_explicit(&P.quiesced, memory_order_relaxed))
        atomic_store_explicit(&P.quiesced, 1, memory_order_relaxed);
}

int ke_in_parallel_region(void) { return ke_tls_in_parallel; }

int ke_thread_serial(int on) {
    int prev = ke_tls_serial;
    ke_tls_serial = on != 0;
    return prev;
}
int ke_thread_is_serial(void) { return ke_tls_serial; }

int ke_pool_live_workers(void) { return atomic_load(&ke_live_workers); }

int ke_pool_parked_workers(void) { return atomic_load(&P.sleepers); }

void ke_pool_set_spin_us(int64_t us) {
    atomic_store(&ke_spin_ns, us < 0 ? (uint64_t)KE_POOL_SPIN_NS
                                     : (uint64_t)us * 1000u);
}

static int ke_default_threads(void) {
    const char *env = getenv("KL_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (*end == '\0' && v >= 1)
            return v > KE_MAX_THREADS ? KE_MAX_THREADS : (int)v;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c >= 1)
            return c > KE_MAX_THREADS ? KE_MAX_THREADS : c;
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 1)
        return 1;
    return c > KE_MAX_THREADS ? KE_MAX_THREADS : (int)c;
}

int kl_get_num_threads(void) {
    int v = atomic_load_explicit(&ke_nthreads, memory_order_relaxed);
    if (v > 0)
        return v;
    int expected = 0;
    atomic_compare_exchange_strong(&ke_nthreads, &expected,
                                   ke_default_threads());
    return atomic_load(&ke_nthreads);
}

void kl_set_num_threads(int n) {
    if (n < 1)
        n = 1;
    if (n > KE_MAX_THREADS)
        n = KE_MAX_THREADS;
    atomic_store(&ke_nthreads, n);
    /* Inside a region the lock may be ours (held by the dispatcher waiting
     * for this very call to return); ke_parallel_for resizes lazily. */
    if (ke_tls_in_parallel)
        return;
    pthread_mutex_lock(&ke_pool_lock);
    if (P.wanted != 0 && P.wanted != n - 1)
        ke_pool_stop_locked();
    pthread_mutex_unlock(&ke_pool_lock);
}

/* Joining helpers at exit keeps leak checkers and thread sanitizers quiet.
 * Skipped when exit() comes from a helper or while another thread is in a
 * parallel_for: the helpers then simply die with the process. */
__attribute__((destructor)) static void ke_pool_atexit(void) {
    if (ke_tls_is_worker || ke_tls_in_parallel)
        return;
    if (pthread_mutex_trylock(&ke_pool_lock) != 0)
        return;
    ke_pool_stop_locked();
    pthread_mutex_unlock(&ke_pool_lock);
}

void ke_thread_background(void) {
#ifdef __linux__
    /* per thread on Linux: PRIO_PROCESS with a thread id; raising niceness needs no privilege */
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && cur < 10)
        setpriority(PRIO_PROCESS, tid, 10);
#endif
}
