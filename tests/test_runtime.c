/* Tests for the eager runtime: thread pool and caching CPU allocator. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc.h"
#include "threadpool.h"

#define MIB ((size_t)1 << 20)

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- thread pool ------------------------------------------------------- */

#define MAX_CHUNKS 64

typedef struct {
    atomic_int *hits;
    pthread_mutex_t mu;
    int nchunks;
    int64_t begin[MAX_CHUNKS], end[MAX_CHUNKS];
    pthread_t who[MAX_CHUNKS];
    atomic_int bad_region;
} cover_ctx;

static void cover_fn(void *vctx, int64_t b, int64_t e) {
    cover_ctx *c = vctx;
    if (!ke_in_parallel_region())
        atomic_fetch_add(&c->bad_region, 1);
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add_explicit(&c->hits[i], 1, memory_order_relaxed);
    pthread_mutex_lock(&c->mu);
    if (c->nchunks < MAX_CHUNKS) {
        c->begin[c->nchunks] = b;
        c->end[c->nchunks] = e;
        c->who[c->nchunks] = pthread_self();
    }
    c->nchunks++;
    pthread_mutex_unlock(&c->mu);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Runs one parallel_for and checks coverage and the chunking contract;
 * returns the sorted chunk begins in out_begins for determinism checks. */
static int run_cover(int64_t n, int64_t grain, int nt, int64_t *out_begins) {
    cover_ctx c;
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
    c.hits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.hits);
    assert_non_null(c.hits);
    ke_parallel_for(n, grain, cover_fn, &c);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&c.hits[i]), 1);
    assert_int_equal(atomic_load(&c.bad_region), 0);
    assert_int_equal(ke_in_parallel_region(), 0);

    int64_t g = grain < 1 ? 1 : grain;
    if (n <= 0) {
        assert_int_equal(c.nchunks, 0);
    } else if (nt == 1 || n / g < 2) {
        assert_int_equal(c.nchunks, 1);
        assert_int_equal(c.begin[0], 0);
        assert_int_equal(c.end[0], n);
    } else {
        int64_t want = n / g < nt ? n / g : nt;
        assert_int_equal(c.nchunks, want);
        int64_t b[MAX_CHUNKS];
        for (int i = 0; i < c.nchunks; i++) {
            assert_true(c.end[i] > c.begin[i]);
            b[i] = c.begin[i];
            /* Chunk 0 always runs on the caller; the others on whichever
             * thread claims them first. */
            if (c.begin[i] == 0)
                assert_true(pthread_equal(c.who[i], pthread_self()));
        }
        qsort(b, (size_t)c.nchunks, sizeof b[0], cmp_i64);
        for (int i = 1; i < c.nchunks; i++)
            if (n / c.nchunks >= 64)
                assert_int_equal(b[i] % 64, 0);
        if (out_begins)
            memcpy(out_begins, b, sizeof(int64_t) * (size_t)c.nchunks);
    }
    free(c.hits);
    pthread_mutex_destroy(&c.mu);
    return c.nchunks;
}

static void test_default_threads_from_env(void **state) {
    (void)state;
    /* main() sets KL_NUM_THREADS=3 before anything reads it. */
    assert_int_equal(kl_get_num_threads(), 3);
}

static void test_parallel_for_covers(void **state) {
    (void)state;
    static const int64_t ns[] = {0,   1,    2,    3,    63,   64,    65,
                                 127, 128,  129,  200,  255,  256,   1000,
                                 4096, 4097, 10007, 65536, 100003, -5};
    static const int64_t grains[] = {-1, 0, 1, 2, 7, 32, 64, 100, 1000,
                                     5000, 1 << 20};
    for (int nt = 1; nt <= 4; nt++) {
        kl_set_num_threads(nt);
        assert_int_equal(kl_get_num_threads(), nt);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof grains / sizeof grains[0]; j++) {
                int64_t b1[MAX_CHUNKS], b2[MAX_CHUNKS];
                int k1 = run_cover(ns[i], grains[j], nt, b1);
                int k2 = run_cover(ns[i], grains[j], nt, b2);
                assert_int_equal(k1, k2);
                if (k1 > 1)
                    assert_memory_equal(b1, b2, sizeof(int64_t) * (size_t)k1);
            }
        /* Grain exactly at the split threshold, and a large n. */
        run_cover(128, 64, nt, NULL);
        run_cover(127, 64, nt, NULL);
        run_cover(1 << 20, 1, nt, NULL);
    }
}

static void bounds_fn(void *vctx, int64_t b, int64_t e) {
    cover_ctx *c = vctx;
    pthread_mutex_lock(&c->mu);
    if (c->nchunks < MAX_CHUNKS) {
        c->begin[c->nchunks] = b;
        c->end[c->nchunks] = e;
    }
    c->nchunks++;
    pthread_mutex_unlock(&c->mu);
}

/* Chunk arithmetic must not overflow for n near INT64_MAX. */
static void test_parallel_for_huge_n(void **state) {
    (void)state;
    static const int64_t ns[] = {INT64_MAX, INT64_MAX - 1, ((int64_t)1 << 62) + 12345,
                                 ((int64_t)1 << 40) + 7};
    for (int nt = 2; nt <= 4; nt++) {
        kl_set_num_threads(nt);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            cover_ctx c;
            memset(&c, 0, sizeof c);
            pthread_mutex_init(&c.mu, NULL);
            ke_parallel_for(ns[k], 1000, bounds_fn, &c);
            assert_int_equal(c.nchunks, nt);
            int64_t b[MAX_CHUNKS] = {0}, e[MAX_CHUNKS] = {0};
            for (int i = 0; i < nt; i++) {
                /* sort by begin (tiny n, insertion) */
                int j = i;
                while (j > 0 && b[j - 1] > c.begin[i]) {
                    b[j] = b[j - 1];
                    e[j] = e[j - 1];
                    j--;
                }
                b[j] = c.begin[i];
                e[j] = c.end[i];
            }
            assert_int_equal(b[0], 0);
            assert_int_equal(e[nt - 1], ns[k]);
            for (int i = 0; i < nt; i++) {
                assert_true(e[i] > b[i]);
                if (i > 0) {
                    assert_int_equal(b[i], e[i - 1]);
                    assert_int_equal(b[i] % 64, 0);
                }
            }
            pthread_mutex_destroy(&c.mu);
        }
    }
}

typedef struct {
    atomic_int started;
    int want;
    atomic_int timed_out;
    pthread_mutex_t mu;
    pthread_t who[MAX_CHUNKS];
    int nwho;
} rendezvous;

/* Each chunk waits until all chunks have started, which can only happen if
 * that many threads really run them at once.  (Waiting on sibling chunks is
 * not allowed in real code; it is safe here because nothing else uses the
 * pool, and the timeout turns a hang into a failure.) */
static void rendezvous_fn(void *vctx, int64_t b, int64_t e) {
    (void)b;
    (void)e;
    rendezvous *r = vctx;
    pthread_mutex_lock(&r->mu);
    r->who[r->nwho++] = pthread_self();
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->started, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (atomic_load(&r->started) < r->want) {
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) {
            atomic_store(&r->timed_out, 1);
            return;
        }
    }
}

static void test_parallel_for_uses_all_threads(void **state) {
    (void)state;
    for (int nt = 2; nt <= 4; nt++) {
        kl_set_num_threads(nt);
        for (int rep = 0; rep < 20; rep++) {
            rendezvous r;
            memset(&r, 0, sizeof r);
            pthread_mutex_init(&r.mu, NULL);
            r.want = nt;
            if (rep % 5 == 4)
                sleep_ms(2); /* helpers parked: the wake-up path */
            ke_parallel_for(nt * 64, 64, rendezvous_fn, &r);
            assert_int_equal(atomic_load(&r.timed_out), 0);
            assert_int_equal(r.nwho, nt);
            for (int i = 0; i < nt; i++)
                for (int j = 0; j < i; j++)
                    assert_false(pthread_equal(r.who[i], r.who[j]));
            pthread_mutex_destroy(&r.mu);
        }
    }
}

static atomic_int inner_bad;

static void inner_fn(void *vctx, int64_t b, int64_t e) {
    pthread_t *outer = vctx;
    /* Inline: one chunk covering everything, on the calling thread. */
    if (b != 0 || e != 5000 || !pthread_equal(*outer, pthread_self()) ||
        !ke_in_parallel_region())
        atomic_fetch_add(&inner_bad, 1);
}

static void outer_fn(void *vctx, int64_t b, int64_t e) {
    atomic_int *count = vctx;
    for (int64_t i = b; i < e; i++) {
        pthread_t self = pthread_self();
        ke_parallel_for(5000, 1, inner_fn, &self);
        atomic_fetch_add(count, 1);
    }
}

static void test_parallel_for_nested(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        kl_set_num_threads(nt);
        atomic_int count = 0;
        atomic_store(&inner_bad, 0);
        assert_int_equal(ke_in_parallel_region(), 0);
        ke_parallel_for(256, 1, outer_fn, &count);
        assert_int_equal(ke_in_parallel_region(), 0);
        assert_int_equal(atomic_load(&count), 256);
        assert_int_equal(atomic_load(&inner_bad), 0);
    }
}

/* ke_thread_serial: the thread's parallel work runs on it alone (one chunk covering
 * everything), other threads' is untouched, and the previous setting comes back. */
static void *serial_other_main(void *varg) {
    pthread_t self = pthread_self();
    atomic_store(&inner_bad, 0);
    ke_parallel_for(5000, 1, inner_fn, &self); /* serial on the main thread: not here */
    *(int *)varg = atomic_load(&inner_bad) > 0;
    return NULL;
}

static void test_thread_serial(void **state) {
    (void)state;
    kl_set_num_threads(2);
    assert_int_equal(ke_thread_is_serial(), 0);
    assert_int_equal(ke_thread_serial(1), 0);
    assert_int_equal(ke_thread_serial(1), 1);
    assert_int_equal(ke_thread_is_serial(), 1);
    pthread_t self = pthread_self();
    atomic_store(&inner_bad, 0);
    ke_parallel_for(5000, 1, inner_fn, &self);
    assert_int_equal(atomic_load(&inner_bad), 0);
    assert_int_equal(ke_in_parallel_region(), 0);
    int parallel_there = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, serial_other_main, &parallel_there), 0);
    pthread_join(t, NULL);
    assert_int_equal(parallel_there, 1); /* split: inner_fn saw a chunk that was not [0, 5000) */
    assert_int_equal(ke_thread_serial(0), 1);
    assert_int_equal(ke_thread_is_serial(), 0);
}

typedef struct {
    int iters;
    int failures;
} caller_arg;

static void sum_fn(void *vctx, int64_t b, int64_t e) {
    atomic_int *hits = vctx;
    for (int64_t i = b; i < e; i++)
        atomic_fetch_add_explicit(&hits[i], 1, memory_order_relaxed);
}

static void *caller_main(void *varg) {
    caller_arg *a = varg;
    enum { N = 3000 };
    atomic_int *hits = calloc(N, sizeof *hits);
    for (int it = 0; it < a->iters; it++) {
        ke_parallel_for(N, 64, sum_fn, hits);
        for (int i = 0; i < N; i++)
            if (atomic_exchange(&hits[i], 0) != 1)
                a->failures++;
    }
    free(hits);
    return NULL;
}

static void test_parallel_for_concurrent_callers(void **state) {
    (void)state;
    for (int nt = 2; nt <= 4; nt += 2) {
        kl_set_num_threads(nt);
        pthread_t th[3];
        caller_arg args[3];
        for (int i = 0; i < 3; i++) {
            args[i] = (caller_arg){.iters = 2000, .failures = 0};
            assert_int_equal(pthread_create(&th[i], NULL, caller_main, &args[i]), 0);
        }
        for (int i = 0; i < 3; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(args[i].failures, 0);
        }
    }
}

static void noop_fn(void *ctx, int64_t b, int64_t e) {
    (void)ctx;
    (void)b;
    (void)e;
}

static int wait_parked(int want, int timeout_ms) {
    for (int t = 0; t < timeout_ms; t++) {
        if (ke_pool_parked_workers() == want)
            return 1;
        sleep_ms(1);
    }
    return ke_pool_parked_workers() == want;
}

static void test_quiesce(void **state) {
    (void)state;
    kl_set_num_threads(3);
    /* Long spin, so parking can only come from quiesce. */
    ke_pool_set_spin_us(20 * 1000 * 1000);
    ke_parallel_for(1 << 12, 1, noop_fn, NULL);
    assert_int_equal(ke_pool_live_workers(), 2);
    /* Waited for, not slept: on a loaded machine a woken helper may take a while to be scheduled. */
    assert_true(wait_parked(0, 2000));
    ke_pool_quiesce();
    assert_true(wait_parked(2, 2000));
    /* Parked helpers still take work, and spin again afterwards. */
    run_cover(10000, 1, 3, NULL);
    assert_true(wait_parked(0, 2000));
    ke_pool_quiesce();
    assert_true(wait_parked(2, 2000));

    /* With a short spin they park on their own. */
    ke_pool_set_spin_us(50);
    run_cover(10000, 1, 3, NULL);
    assert_true(wait_parked(2, 2000));
    ke_pool_set_spin_us(-1);
    run_cover(10000, 1, 3, NULL);
}

static void set_threads_inside_fn(void *ctx, int64_t b, int64_t e) {
    (void)ctx;
    (void)e;
    if (b == 0)
        kl_set_num_threads(2);
}

static void test_set_num_threads(void **state) {
    (void)state;
    kl_set_num_threads(0);
    assert_int_equal(kl_get_num_threads(), 1);
    kl_set_num_threads(-7);
    assert_int_equal(kl_get_num_threads(), 1);
    assert_int_equal(ke_pool_live_workers(), 0);
    run_cover(1000, 1, 1, NULL);
    assert_int_equal(ke_pool_live_workers(), 0);

    kl_set_num_threads(4);
    run_cover(1000, 1, 4, NULL);
    assert_int_equal(ke_pool_live_workers(), 3);
    kl_set_num_threads(2);
    assert_int_equal(ke_pool_live_workers(), 0); /* joined; restarts lazily */
    run_cover(1000, 1, 2, NULL);
    assert_int_equal(ke_pool_live_workers(), 1);

    kl_set_num_threads(100000);
    assert_int_equal(kl_get_num_threads(), 1024);

    /* From inside a region: no deadlock, takes effect on the next call. */
    kl_set_num_threads(4);
    ke_parallel_for(1000, 1, set_threads_inside_fn, NULL);
    assert_int_equal(kl_get_num_threads(), 2);
    run_cover(1000, 1, 2, NULL);
    assert_int_equal(ke_pool_live_workers(), 1);
    kl_set_num_threads(2);
}

/* A forked child has no helpers; the pool and allocator must notice and
 * work normally there rather than wait on threads that do not exist. */
static int child_checks(void) {
    enum { N = 20000 };
    atomic_int *hits = calloc(N, sizeof *hits);
    if (!hits)
        return 1;
    for (int rep = 0; rep < 50; rep++) {
        ke_parallel_for(N, 64, sum_fn, hits);
        for (int i = 0; i < N; i++)
            if (atomic_exchange(&hits[i], 0) != 1)
                return 2;
    }
    free(hits);
    if (ke_pool_live_workers() != kl_get_num_threads() - 1)
        return 3;
    ke_alloc_stats s0 = ke_cpu_alloc_stats();
    void *a = ke_cpu_alloc(100), *b = ke_cpu_alloc(3 * MIB);
    if (!a || !b)
        return 4;
    ke_cpu_free(a, 100);
    ke_cpu_free(b, 3 * MIB);
    ke_alloc_stats s1 = ke_cpu_alloc_stats();
    if (s1.live_blocks != s0.live_blocks)
        return 5;
    return 0;
}

static void *alloc_idle_main(void *arg) {
    void *p = ke_cpu_alloc(300);
    ke_cpu_free(p, 300);
    pthread_barrier_wait(arg); /* registered and alive at fork time */
    pthread_barrier_wait(arg);
    return NULL;
}

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif

static void test_fork(void **state) {
    (void)state;
#ifdef TEST_UNDER_TSAN
    skip(); /* TSan refuses to start threads after a multi-threaded fork */
#endif
    kl_set_num_threads(3);
    run_cover(10000, 1, 3, NULL);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, alloc_idle_main, &bar), 0);
    pthread_barrier_wait(&bar);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_checks());
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    pthread_barrier_wait(&bar);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    run_cover(10000, 1, 3, NULL); /* parent's pool unaffected */
}

/* ---- allocator --------------------------------------------------------- */

static ke_alloc_stats stats(void) { return ke_cpu_alloc_stats(); }

static void test_alloc_alignment(void **state) {
    (void)state;
    ke_alloc_stats s0 = stats();
    static const size_t sizes[] = {0,      1,       7,        63,      64,
                                   65,     100,     1000,     4095,    4096,
                                   4097,   5000,    65536,    100000,  MIB - 1,
                                   MIB,    MIB + 1, 2 * MIB,  3 * MIB + 5,
                                   9 * MIB, 64 * MIB};
    void *ps[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ps[i] = ke_cpu_alloc(sizes[i]);
        assert_non_null(ps[i]);
        assert_int_equal((uintptr_t)ps[i] % 64, 0);
        memset(ps[i], 0xab, sizes[i]);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t j = 0; j < i; j++)
            assert_ptr_not_equal(ps[i], ps[j]);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        ke_cpu_free(ps[i], sizes[i]);
    /* Every small size, written in full, to catch a class table mistake
     * (under ASan this checks the exact bound). */
    for (size_t n = 0; n <= KE_SMALL_MAX; n++) {
        unsigned char *p = ke_cpu_alloc(n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, (int)n, n);
        ke_cpu_free(p, n);
    }
    ke_cpu_free(NULL, 123);
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.live_blocks, s0.live_blocks);
    assert_int_equal(s1.live_bytes, s0.live_bytes);
}

static void test_alloc_zero_and_huge(void **state) {
    (void)state;
    ke_alloc_stats s0 = stats();
    void *a = ke_cpu_alloc(0), *b = ke_cpu_alloc(0);
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    assert_int_equal(stats().live_blocks, s0.live_blocks + 2);
    ke_cpu_free(a, 0);
    ke_cpu_free(b, 0);
    assert_null(ke_cpu_alloc(SIZE_MAX));
    assert_null(ke_cpu_alloc(KE_ALLOC_MAX + 1));
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.live_blocks, s0.live_blocks);
    assert_int_equal(s1.alloc_calls, s0.alloc_calls + 2);
}

static void test_alloc_reuse(void **state) {
    (void)state;
    static const size_t sizes[] = {4, 1000, 4096, 10000, 300000, 3 * MIB,
                                   64 * MIB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        void *p = ke_cpu_alloc(n);
        assert_non_null(p);
        memset(p, 1, n);
        ke_cpu_free(p, n);
        ke_alloc_stats s0 = stats();
        void *q = ke_cpu_alloc(n);
        assert_non_null(q);
        ke_alloc_stats s1 = stats();
        assert_int_equal(s1.alloc_calls, s0.alloc_calls + 1);
        if (KE_ALLOC_CACHING) {
            assert_ptr_equal(q, p);
            assert_int_equal(s1.cache_hits, s0.cache_hits + 1);
            assert_true(s1.cached_bytes < s0.cached_bytes);
            /* Same class, different request: still a hit. */
            ke_cpu_free(q, n);
            q = ke_cpu_alloc(n - 1);
            assert_ptr_equal(q, p);
            ke_cpu_free(q, n - 1);
        } else {
            assert_int_equal(s1.cache_hits, 0);
            ke_cpu_free(q, n);
        }
    }
}

static void test_alloc_stats_exact(void **state) {
    (void)state;
    ke_alloc_stats s0 = stats();
    enum { K = 300 };
    void *ps[K];
    size_t ns[K];
    int64_t bytes = 0;
    unsigned seed = 12345;
    for (int i = 0; i < K; i++) {
        seed = seed * 1103515245u + 12345u;
        ns[i] = (i % 10 == 0) ? (seed >> 8) % (4 * MIB) : (seed >> 8) % 5000;
        ps[i] = ke_cpu_alloc(ns[i]);
        assert_non_null(ps[i]);
        bytes += (int64_t)ns[i];
    }
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.live_blocks, s0.live_blocks + K);
    assert_int_equal(s1.live_bytes, s0.live_bytes + bytes);
    assert_int_equal(s1.alloc_calls, s0.alloc_calls + K);
    for (int i = K - 1; i >= 0; i--)
        ke_cpu_free(ps[i], ns[i]);
    ke_alloc_stats s2 = stats();
    assert_int_equal(s2.live_blocks, s0.live_blocks);
    assert_int_equal(s2.live_bytes, s0.live_bytes);
    assert_true(s2.cache_hits >= s0.cache_hits);
}

static void test_alloc_cap_trim(void **state) {
    (void)state;
    if (!KE_ALLOC_CACHING)
        skip();
    size_t old = ke_cpu_cache_limit();
    kl_empty_cache();
    assert_int_equal(stats().cached_bytes, 0);

    ke_cpu_cache_set_limit(3 * MIB);
    void *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = ke_cpu_alloc(MIB); /* a class of exactly 1 MiB */
        assert_non_null(p[i]);
        memset(p[i], i, MIB);
    }
    for (int i = 0; i < 4; i++)
        ke_cpu_free(p[i], MIB);
    /* The oldest (p[0]) was dropped to stay at the cap. */
    assert_int_equal(stats().cached_bytes, (int64_t)(3 * MIB));
    void *q[3];
    for (int i = 0; i < 3; i++) {
        q[i] = ke_cpu_alloc(MIB);
        assert_ptr_equal(q[i], p[3 - i]); /* newest first */
    }
    assert_int_equal(stats().cached_bytes, 0);
    for (int i = 0; i < 3; i++)
        ke_cpu_free(q[i], MIB);

    /* A block bigger than the whole cap is never cached. */
    void *big = ke_cpu_alloc(4 * MIB);
    assert_non_null(big);
    ke_cpu_free(big, 4 * MIB);
    assert_int_equal(stats().cached_bytes, (int64_t)(3 * MIB));

    /* Lowering the cap trims at once. */
    ke_cpu_cache_set_limit(MIB);
    assert_int_equal(stats().cached_bytes, (int64_t)MIB);

    /* 0 disables caching, small lists included. */
    ke_cpu_cache_set_limit(0);
    assert_int_equal(stats().cached_bytes, 0);
    ke_alloc_stats s0 = stats();
    for (int i = 0; i < 10; i++) {
        void *a = ke_cpu_alloc(100), *b = ke_cpu_alloc(2 * MIB);
        assert_non_null(a);
        assert_non_null(b);
        ke_cpu_free(a, 100);
        ke_cpu_free(b, 2 * MIB);
    }
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.cache_hits, s0.cache_hits);
    assert_int_equal(s1.cached_bytes, 0);
    ke_cpu_cache_set_limit(old);
}

static void test_alloc_fail_injection(void **state) {
    (void)state;
    ke_alloc_stats s0 = stats();
    ke_alloc_fail_after(3);
    void *a = ke_cpu_alloc(10), *b = ke_cpu_alloc(100000), *c = ke_cpu_alloc(0);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_null(ke_cpu_alloc(10));
    assert_null(ke_cpu_alloc(8 * MIB));
    assert_null(ke_cpu_alloc(0));
    ke_cpu_free(a, 10); /* frees do not re-arm anything */
    assert_null(ke_cpu_alloc(10));
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.alloc_calls, s0.alloc_calls + 3);
    assert_int_equal(s1.live_blocks, s0.live_blocks + 2);
    ke_alloc_fail_after(-1);
    a = ke_cpu_alloc(10);
    assert_non_null(a);
    ke_alloc_fail_after(0);
    assert_null(ke_cpu_alloc(1));
    ke_alloc_fail_after(-1);
    ke_cpu_free(a, 10);
    ke_cpu_free(b, 100000);
    ke_cpu_free(c, 0);
    assert_int_equal(stats().live_blocks, s0.live_blocks);
}

static void test_empty_cache(void **state) {
    (void)state;
    void *a = ke_cpu_alloc(200), *b = ke_cpu_alloc(5 * MIB), *c = ke_cpu_alloc(50000);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    ke_cpu_free(a, 200);
    ke_cpu_free(b, 5 * MIB);
    ke_cpu_free(c, 50000);
    if (KE_ALLOC_CACHING)
        assert_true(stats().cached_bytes > 0);
    kl_empty_cache();
    assert_int_equal(stats().cached_bytes, 0);
    ke_alloc_stats s0 = stats();
    a = ke_cpu_alloc(200);
    assert_int_equal(stats().cache_hits, s0.cache_hits); /* nothing left */
    ke_cpu_free(a, 200);
    kl_empty_cache();
}

enum { XN = 500 };
typedef struct {
    void *ps[XN];
    size_t ns[XN];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;
} handoff;

static void *producer_main(void *varg) {
    handoff *h = varg;
    for (int i = 0; i < XN; i++) {
        h->ns[i] = (size_t)(i * 37) % (i % 7 == 0 ? 200000 : 3000);
        h->ps[i] = ke_cpu_alloc(h->ns[i]);
        if (h->ps[i])
            memset(h->ps[i], 5, h->ns[i]);
    }
    pthread_mutex_lock(&h->mu);
    h->ready = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void *consumer_main(void *varg) {
    handoff *h = varg;
    pthread_mutex_lock(&h->mu);
    while (!h->ready)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < XN; i++)
        ke_cpu_free(h->ps[i], h->ns[i]);
    /* Reuse from this thread's list, then leave some cached at exit so the
     * thread-exit flush is exercised. */
    for (int i = 0; i < XN; i++) {
        void *p = ke_cpu_alloc(h->ns[i]);
        ke_cpu_free(p, h->ns[i]);
    }
    return NULL;
}

static void test_cross_thread_free(void **state) {
    (void)state;
    kl_empty_cache();
    ke_alloc_stats s0 = stats();
    handoff *h = calloc(1, sizeof *h);
    assert_non_null(h);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    pthread_t pt, ct;
    assert_int_equal(pthread_create(&ct, NULL, consumer_main, h), 0);
    assert_int_equal(pthread_create(&pt, NULL, producer_main, h), 0);
    pthread_join(pt, NULL);
    pthread_join(ct, NULL);
    for (int i = 0; i < XN; i++)
        assert_non_null(h->ps[i]);
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.live_blocks, s0.live_blocks);
    assert_int_equal(s1.live_bytes, s0.live_bytes);
    assert_int_equal(s1.alloc_calls, s0.alloc_calls + 2 * XN);
    if (KE_ALLOC_CACHING)
        assert_true(s1.cache_hits - s0.cache_hits >= XN / 2);
    /* Both threads exited, so only the large cache may hold bytes. */
    kl_empty_cache();
    assert_int_equal(stats().cached_bytes, 0);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static void *stress_main(void *varg) {
    unsigned seed = (unsigned)(uintptr_t)varg;
    enum { SLOTS = 64 };
    void *ps[SLOTS] = {0};
    size_t ns[SLOTS] = {0};
    for (int it = 0; it < 20000; it++) {
        seed = seed * 1664525u + 1013904223u;
        int s = (int)((seed >> 10) % SLOTS);
        if (ps[s]) {
            if (ns[s] && ((unsigned char *)ps[s])[ns[s] - 1] != (unsigned char)s)
                return (void *)1;
            ke_cpu_free(ps[s], ns[s]);
            ps[s] = NULL;
        } else {
            ns[s] = (seed >> 16) % 16 == 0 ? (seed >> 4) % (600 * 1024)
                                          : (seed >> 4) % 4097;
            ps[s] = ke_cpu_alloc(ns[s]);
            if (!ps[s])
                return (void *)1;
            memset(ps[s], s, ns[s]);
        }
    }
    for (int s = 0; s < SLOTS; s++)
        ke_cpu_free(ps[s], ns[s]);
    return NULL;
}

static void test_alloc_threads_stress(void **state) {
    (void)state;
    ke_alloc_stats s0 = stats();
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, stress_main,
                                        (void *)(uintptr_t)(i * 7919 + 1)),
                         0);
    for (int i = 0; i < 3; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    ke_alloc_stats s1 = stats();
    assert_int_equal(s1.live_blocks, s0.live_blocks);
    assert_int_equal(s1.live_bytes, s0.live_bytes);
}

int main(void) {
    setenv("KL_NUM_THREADS", "3", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_threads_from_env),
        cmocka_unit_test(test_parallel_for_covers),
        cmocka_unit_test(test_parallel_for_huge_n),
        cmocka_unit_test(test_parallel_for_uses_all_threads),
        cmocka_unit_test(test_parallel_for_nested),
        cmocka_unit_test(test_parallel_for_concurrent_callers),
        cmocka_unit_test(test_thread_serial),
        cmocka_unit_test(test_quiesce),
        cmocka_unit_test(test_set_num_threads),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_alloc_alignment),
        cmocka_unit_test(test_alloc_zero_and_huge),
        cmocka_unit_test(test_alloc_reuse),
        cmocka_unit_test(test_alloc_stats_exact),
        cmocka_unit_test(test_alloc_cap_trim),
        cmocka_unit_test(test_alloc_fail_injection),
        cmocka_unit_test(test_empty_cache),
        cmocka_unit_test(test_cross_thread_free),
        cmocka_unit_test(test_alloc_threads_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
