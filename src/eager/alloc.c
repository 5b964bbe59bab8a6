/* Kiln eager runtime: caching CPU allocator (see alloc.h). */
#define _GNU_SOURCE
#include "alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KE_LIKELY(x) __builtin_expect(!!(x), 1)
#define KE_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* Keeps slow paths out of line so the small-block fast path stays a few
 * instructions with no register spills. */
#define KE_SLOW __attribute__((noinline, cold))

/* ---- counters ----------------------------------------------------------
 * Each thread keeps its own counters, written only by itself with plain
 * relaxed load+store (no locked instruction on the fast path) and summed by
 * ke_cpu_alloc_stats.  A block freed on another thread makes one thread's
 * live count go up and the other's down; only the sum means anything.
 * Counters of exited threads, and of calls made while a thread is exiting,
 * land in ke_global_ctr with real atomic adds. */
enum { KE_LIVE_BLOCKS, KE_LIVE_BYTES, KE_CACHED, KE_CALLS, KE_HITS, KE_NCTR };

typedef struct {
    _Atomic int64_t v[KE_NCTR];
} ke_ctr;

static ke_ctr ke_global_ctr;

/* ---- failure injection ------------------------------------------------- */
static atomic_int ke_fail_armed;
static _Atomic int64_t ke_fail_budget;

void ke_alloc_fail_after(int64_t n) {
    if (n < 0) {
        atomic_store(&ke_fail_armed, 0);
        return;
    }
    atomic_store(&ke_fail_budget, n);
    atomic_store(&ke_fail_armed, 1);
}

int ke_alloc_failing(void) { return atomic_load_explicit(&ke_fail_armed, memory_order_relaxed); }

KE_SLOW static int ke_fail_take(void) {
    int64_t b = atomic_load(&ke_fail_budget);
    do {
        if (b <= 0)
            return 0;
    } while (!atomic_compare_exchange_weak(&ke_fail_budget, &b, b - 1));
    return 1;
}

#if KE_ALLOC_CACHING

/* ---- small blocks: per-thread lists ------------------------------------ */
#define KE_NSMALL 12
static const uint32_t ke_small_size[KE_NSMALL] = {
    64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096};
/* Class index by ceil(nbytes / 64); 0 bytes shares the 64-byte class. */
static const uint8_t ke_small_idx[KE_SMALL_MAX / 64 + 1] = {
    0, 0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10,
    10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11,
    11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11};
/* Blocks kept per list: ~64 KiB, at least 8. */
static const uint16_t ke_small_cap[KE_NSMALL] = {
    1024, 512, 341, 256, 170, 128, 85, 64, 42, 32, 21, 16};

enum { KE_TC_NEW = 0, KE_TC_LIVE = 1, KE_TC_GONE = 2 };

typedef struct ke_tcache {
    void *head[KE_NSMALL]; /* free blocks, linked through their first word */
    uint32_t count[KE_NSMALL];
    int state;
    ke_ctr ctr;
    struct ke_tcache *prev, *next; /* registry, under ke_reg_lock */
} ke_tcache;

static __thread ke_tcache ke_tc;

static pthread_mutex_t ke_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ke_tcache *ke_reg_head;
static pthread_key_t ke_tc_key;
static pthread_once_t ke_once = PTHREAD_ONCE_INIT;
static atomic_int ke_small_on = 1;

/* ---- large blocks: global cache ---------------------------------------- */
/* Classes: 4 steps per power of two above 4 KiB, i.e. 5/4, 6/4, 7/4, 8/4 of
 * 2^e for 2^e < n <= 2^(e+1); at most 25% slack, and with mmap the slack
 * past what the caller touches costs address space, not memory. */
#define KE_LARGE_EMIN 12
#define KE_LARGE_EMAX 39 /* classes reach 2^40 = KE_ALLOC_MAX */
#define KE_NLARGE ((KE_LARGE_EMAX - KE_LARGE_EMIN + 1) * 4)
/* Below this, libc's allocator is fine (it keeps such blocks itself). */
#define KE_MMAP_MIN ((size_t)1 << 20)
#define KE_HUGE ((size_t)2 << 20)
#define KE_DEFAULT_CAP ((size_t)2 << 30)

/* A cached block stores its own bookkeeping in its first bytes. */
typedef struct ke_blk {
    struct ke_blk *cnext, *cprev; /* same class, newest first */
    struct ke_blk *lnext, *lprev; /* all classes, newest first */
    size_t size;
    int cls;
} ke_blk;

static pthread_mutex_t ke_lc_lock = PTHREAD_MUTEX_INITIALIZER;
/* Mirror of ke_lc_bytes that stats can read without the lock. */
static _Atomic int64_t ke_large_cached;
static ke_blk *ke_lc_head[KE_NLARGE];
static ke_blk *ke_lru_newest, *ke_lru_oldest;
static size_t ke_lc_bytes;
static size_t ke_cap = KE_DEFAULT_CAP;

static void ke_cnt(ke_tcache *tc, int which, int64_t d) {
    if (KE_LIKELY(tc != NULL)) {
        _Atomic int64_t *c = &tc->ctr.v[which];
        atomic_store_explicit(
            c, atomic_load_explicit(c, memory_order_relaxed) + d,
            memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&ke_global_ctr.v[which], d,
                                  memory_order_relaxed);
    }
}

static size_t ke_parse_bytes(const char *s, int *ok) {
    char *end;
    *ok = 0;
    if (!s || !*s || *s == '-')
        return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end != '\0' || (shift && v > (~0ull >> shift)))
        return 0;
    *ok = 1;
    return (size_t)(v << shift);
}

static void ke_release_large(void *p, size_t size) {
    if (size < KE_MMAP_MIN)
        free(p);
    else
        munmap(p, size);
}

static void ke_release_list(ke_blk *b) {
    while (b) {
        ke_blk *next = b->lnext;
        ke_release_large(b, b->size);
        b = next;
    }
}

static void ke_lc_unlink(ke_blk *b) {
    if (b->cprev)
        b->cprev->cnext = b->cnext;
    else
        ke_lc_head[b->cls] = b->cnext;
    if (b->cnext)
        b->cnext->cprev = b->cprev;
    if (b->lprev)
        b->lprev->lnext = b->lnext;
    else
        ke_lru_newest = b->lnext;
    if (b->lnext)
        b->lnext->lprev = b->lprev;
    else
        ke_lru_oldest = b->lprev;
    ke_lc_bytes -= b->size;
    atomic_store_explicit(&ke_large_cached, (int64_t)ke_lc_bytes,
                          memory_order_relaxed);
}

/* Drops oldest blocks until at most `limit` bytes stay; returns them as an
 * lnext-linked list so the caller can unmap after unlocking (munmap of big
 * blocks is slow, and other threads should not wait on it). */
static ke_blk *ke_lc_trim_locked(size_t limit) {
    ke_blk *out = NULL;
    while (ke_lc_bytes > limit && ke_lru_oldest) {
        ke_blk *b = ke_lru_oldest;
        ke_lc_unlink(b);
        b->lnext = out;
        out = b;
    }
    return out;
}

static void ke_atfork_prepare(void) {
    pthread_mutex_lock(&ke_reg_lock);
    pthread_mutex_lock(&ke_lc_lock);
}

static void ke_atfork_parent(void) {
    pthread_mutex_unlock(&ke_lc_lock);
    pthread_mutex_unlock(&ke_reg_lock);
}

static void ke_atfork_child(void) {
    /* Only the forking thread survives.  Fold the others' counters into the
     * global ones (their blocks still exist in the child) and drop them from
     * the registry, since glibc may reuse their TLS for new threads.  Their
     * small lists are abandoned. */
    for (ke_tcache *t = ke_reg_head; t;) {
        ke_tcache *next = t->next;
        if (t != &ke_tc) {
            for (int i = 0; i < KE_NCTR; i++)
                if (i != KE_CACHED)
                    atomic_fetch_add(&ke_global_ctr.v[i],
                                     atomic_load(&t->ctr.v[i]));
        }
        t = next;
    }
    ke_reg_head = ke_tc.state == KE_TC_LIVE ? &ke_tc : NULL;
    ke_tc.prev = ke_tc.next = NULL;
    pthread_mutex_unlock(&ke_lc_lock);
    pthread_mutex_unlock(&ke_reg_lock);
}

static void ke_flush_small(ke_tcache *tc) {
    for (int c = 0; c < KE_NSMALL; c++) {
        void *p = tc->head[c];
        while (p) {
            void *next = *(void **)p;
            free(p);
            p = next;
        }
        tc->head[c] = NULL;
        ke_cnt(tc, KE_CACHED, -(int64_t)tc->count[c] * ke_small_size[c]);
        tc->count[c] = 0;
    }
}

static void ke_tcache_dtor(void *arg) {
    ke_tcache *tc = arg;
    ke_flush_small(tc);
    pthread_mutex_lock(&ke_reg_lock);
    for (int i = 0; i < KE_NCTR; i++)
        atomic_fetch_add(&ke_global_ctr.v[i], atomic_load(&tc->ctr.v[i]));
    if (tc->prev)
        tc->prev->next = tc->next;
    else
        ke_reg_head = tc->next;
    if (tc->next)
        tc->next->prev = tc->prev;
    /* Later frees from this thread's remaining destructors bypass the
     * lists, which nobody would release any more. */
    tc->state = KE_TC_GONE;
    pthread_mutex_unlock(&ke_reg_lock);
}

static void ke_global_init(void) {
    const char *env = getenv("KL_CPU_CACHE_MAX");
    int ok;
    size_t v = ke_parse_bytes(env, &ok);
    if (ok) {
        ke_cap = v;
        atomic_store(&ke_small_on, v > 0);
    }
    pthread_key_create(&ke_tc_key, ke_tcache_dtor);
    pthread_atfork(ke_atfork_prepare, ke_atfork_parent, ke_atfork_child);
}

KE_SLOW static ke_tcache *ke_tc_init(void) {
    ke_tcache *tc = &ke_tc;
    if (tc->state == KE_TC_GONE)
        return NULL;
    pthread_once(&ke_once, ke_global_init);
    /* Without the key's destructor the lists would leak at thread exit. */
    if (pthread_setspecific(ke_tc_key, tc) != 0) {
        tc->state = KE_TC_GONE;
        return NULL;
    }
    pthread_mutex_lock(&ke_reg_lock);
    tc->prev = NULL;
    tc->next = ke_reg_head;
    if (ke_reg_head)
        ke_reg_head->prev = tc;
    ke_reg_head = tc;
    tc->state = KE_TC_LIVE;
    pthread_mutex_unlock(&ke_reg_lock);
    return tc;
}

static inline ke_tcache *ke_tc_get(void) {
    if (KE_LIKELY(ke_tc.state == KE_TC_LIVE))
        return &ke_tc;
    return ke_tc_init();
}

static void ke_large_class(size_t n, size_t *size, int *cls) {
    int e = 63 - __builtin_clzll((unsigned long long)(n - 1));
    int sh = e - 2;
    size_t m = (n + ((size_t)1 << sh) - 1) >> sh; /* 5..8 */
    *size = m << sh;
    *cls = (e - KE_LARGE_EMIN) * 4 + (int)(m - 5);
}

static void *ke_sys_large(size_t size) {
    if (size < KE_MMAP_MIN)
        return aligned_alloc(KE_ALLOC_ALIGN, size);
    int prot = PROT_READ | PROT_WRITE, fl = MAP_PRIVATE | MAP_ANONYMOUS;
    if (size >= KE_HUGE) {
        /* Over-map, then cut to a 2 MiB-aligned range so huge pages can
         * back all of it. */
        char *raw = mmap(NULL, size + KE_HUGE, prot, fl, -1, 0);
        if (raw != MAP_FAILED) {
            uintptr_t a = ((uintptr_t)raw + KE_HUGE - 1) & ~(uintptr_t)(KE_HUGE - 1);
            char *al = (char *)a;
            size_t head = (size_t)(al - raw), tail = KE_HUGE - head;
            if (head)
                munmap(raw, head);
            if (tail)
                munmap(al + size, tail);
            madvise(al, size, MADV_HUGEPAGE);
            return al;
        }
    }
    void *p = mmap(NULL, size, prot, fl, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void ke_empty_large(void) {
    pthread_mutex_lock(&ke_lc_lock);
    ke_blk *out = ke_lc_trim_locked(0);
    pthread_mutex_unlock(&ke_lc_lock);
    ke_release_list(out);
}

KE_SLOW static void *ke_alloc_large(size_t n) {
    ke_tcache *tc = ke_tc_get();
    size_t size;
    int cls;
    ke_large_class(n, &size, &cls);
    void *p = NULL;
    pthread_mutex_lock(&ke_lc_lock);
    ke_blk *b = ke_lc_head[cls];
    if (b)
        ke_lc_unlink(b);
    pthread_mutex_unlock(&ke_lc_lock);
    if (b) {
        p = b;
        ke_cnt(tc, KE_HITS, 1);
    } else {
        p = ke_sys_large(size);
        if (!p) {
            /* Cached blocks of other classes may be what stands between us
             * and the memory limit. */
            ke_empty_large();
            p = ke_sys_large(size);
            if (!p)
                return NULL;
        }
    }
    ke_cnt(tc, KE_LIVE_BLOCKS, 1);
    ke_cnt(tc, KE_LIVE_BYTES, (int64_t)n);
    ke_cnt(tc, KE_CALLS, 1);
    return p;
}

KE_SLOW static void ke_free_large(void *p, size_t n) {
    ke_tcache *tc = ke_tc_get();
    ke_cnt(tc, KE_LIVE_BLOCKS, -1);
    ke_cnt(tc, KE_LIVE_BYTES, -(int64_t)n);
    size_t size;
    int cls;
    ke_large_class(n, &size, &cls);
    pthread_mutex_lock(&ke_lc_lock);
    if (size > ke_cap) {
        pthread_mutex_unlock(&ke_lc_lock);
        ke_release_large(p, size);
        return;
    }
    ke_blk *b = p;
    b->size = size;
    b->cls = cls;
    b->cprev = NULL;
    b->cnext = ke_lc_head[cls];
    if (b->cnext)
        b->cnext->cprev = b;
    ke_lc_head[cls] = b;
    b->lprev = NULL;
    b->lnext = ke_lru_newest;
    if (b->lnext)
        b->lnext->lprev = b;
    else
        ke_lru_oldest = b;
    ke_lru_newest = b;
    ke_lc_bytes += size;
    atomic_store_explicit(&ke_large_cached, (int64_t)ke_lc_bytes,
                          memory_order_relaxed);
    ke_blk *out = ke_lc_trim_locked(ke_cap);
    pthread_mutex_unlock(&ke_lc_lock);
    ke_release_list(out);
}

KE_SLOW static void *ke_alloc_small_slow(ke_tcache *tc, size_t n) {
    void *p = aligned_alloc(KE_ALLOC_ALIGN, ke_small_size[ke_small_idx[(n + 63) >> 6]]);
    if (!p) {
        ke_empty_large();
        if (tc)
            ke_flush_small(tc);
        p = aligned_alloc(KE_ALLOC_ALIGN, ke_small_size[ke_small_idx[(n + 63) >> 6]]);
        if (!p)
            return NULL;
    }
    ke_cnt(tc, KE_LIVE_BLOCKS, 1);
    ke_cnt(tc, KE_LIVE_BYTES, (int64_t)n);
    ke_cnt(tc, KE_CALLS, 1);
    return p;
}

static inline void *ke_alloc_impl(size_t n) {
    if (KE_UNLIKELY(n > KE_SMALL_MAX))
        return ke_alloc_large(n);
    ke_tcache *tc = ke_tc_get();
    unsigned c = ke_small_idx[(n + 63) >> 6];
    void *p;
    if (KE_UNLIKELY(!tc) || KE_UNLIKELY(!(p = tc->head[c])))
        return ke_alloc_small_slow(tc, n);
    tc->head[c] = *(void **)p;
    tc->count[c]--;
    ke_cnt(tc, KE_CACHED, -(int64_t)ke_small_size[c]);
    ke_cnt(tc, KE_HITS, 1);
    ke_cnt(tc, KE_LIVE_BLOCKS, 1);
    ke_cnt(tc, KE_LIVE_BYTES, (int64_t)n);
    ke_cnt(tc, KE_CALLS, 1);
    return p;
}

void ke_cpu_free(void *p, size_t n) {
    if (!p)
        return;
    if (KE_UNLIKELY(n > KE_SMALL_MAX)) {
        ke_free_large(p, n);
        return;
    }
    ke_tcache *tc = ke_tc_get();
    ke_cnt(tc, KE_LIVE_BLOCKS, -1);
    ke_cnt(tc, KE_LIVE_BYTES, -(int64_t)n);
    unsigned c = ke_small_idx[(n + 63) >> 6];
    if (KE_UNLIKELY(!tc) || tc->count[c] >= ke_small_cap[c] ||
        !atomic_load_explicit(&ke_small_on, memory_order_relaxed)) {
        free(p);
        return;
    }
    *(void **)p = tc->head[c];
    tc->head[c] = p;
    tc->count[c]++;
    ke_cnt(tc, KE_CACHED, ke_small_size[c]);
}

ke_alloc_stats ke_cpu_alloc_stats(void) {
    int64_t v[KE_NCTR];
    pthread_once(&ke_once, ke_global_init);
    pthread_mutex_lock(&ke_reg_lock);
    for (int i = 0; i < KE_NCTR; i++)
        v[i] = atomic_load(&ke_global_ctr.v[i]);
    for (ke_tcache *t = ke_reg_head; t; t = t->next)
        for (int i = 0; i < KE_NCTR; i++)
            v[i] += atomic_load_explicit(&t->ctr.v[i], memory_order_relaxed);
    pthread_mutex_unlock(&ke_reg_lock);
    v[KE_CACHED] += atomic_load(&ke_large_cached);
    return (ke_alloc_stats){v[KE_LIVE_BLOCKS], v[KE_LIVE_BYTES], v[KE_CACHED],
                            v[KE_CALLS], v[KE_HITS]};
}

void ke_cpu_cache_set_limit(size_t bytes) {
    pthread_once(&ke_once, ke_global_init);
    pthread_mutex_lock(&ke_lc_lock);
    ke_cap = bytes;
    atomic_store(&ke_small_on, bytes > 0);
    ke_blk *out = ke_lc_trim_locked(bytes);
    pthread_mutex_unlock(&ke_lc_lock);
    ke_release_list(out);
}

size_t ke_cpu_cache_limit(void) {
    pthread_once(&ke_once, ke_global_init);
    pthread_mutex_lock(&ke_lc_lock);
    size_t v = ke_cap;
    pthread_mutex_unlock(&ke_lc_lock);
    return v;
}

void kl_empty_cache(void) {
    ke_tcache *tc = ke_tc_get();
    if (tc)
        ke_flush_small(tc);
    ke_empty_large();
}

#else /* !KE_ALLOC_CACHING: sanitizer build, every call hits libc */

static inline void *ke_alloc_impl(size_t n) {
    void *p;
    /* Exact size, so ASan flags any access past what was asked for. */
    if (posix_memalign(&p, KE_ALLOC_ALIGN, n ? n : 1) != 0)
        return NULL;
    atomic_fetch_add(&ke_global_ctr.v[KE_LIVE_BLOCKS], 1);
    atomic_fetch_add(&ke_global_ctr.v[KE_LIVE_BYTES], (int64_t)n);
    atomic_fetch_add(&ke_global_ctr.v[KE_CALLS], 1);
    return p;
}

void ke_cpu_free(void *p, size_t n) {
    if (!p)
        return;
    atomic_fetch_sub(&ke_global_ctr.v[KE_LIVE_BLOCKS], 1);
    atomic_fetch_sub(&ke_global_ctr.v[KE_LIVE_BYTES], (int64_t)n);
    free(p);
}

ke_alloc_stats ke_cpu_alloc_stats(void) {
    return (ke_alloc_stats){atomic_load(&ke_global_ctr.v[KE_LIVE_BLOCKS]),
                            atomic_load(&ke_global_ctr.v[KE_LIVE_BYTES]),
                            0, atomic_load(&ke_global_ctr.v[KE_CALLS]), 0};
}

static atomic_size_t ke_cap_bypass;
void ke_cpu_cache_set_limit(size_t bytes) { atomic_store(&ke_cap_bypass, bytes); }
size_t ke_cpu_cache_limit(void) { return atomic_load(&ke_cap_bypass); }
void kl_empty_cache(void) {}

#endif /* KE_ALLOC_CACHING */

void *ke_cpu_alloc(size_t n) {
    /* Refused up front: ASan would abort rather than return NULL, and the
     * class table ends here. */
    if (KE_UNLIKELY(n > KE_ALLOC_MAX))
        return NULL;
    int took = 0;
    if (KE_UNLIKELY(atomic_load_explicit(&ke_fail_armed, memory_order_relaxed))) {
        if (!ke_fail_take())
            return NULL;
        took = 1;
    }
    void *p = ke_alloc_impl(n);
    /* A real failure should not use up the injected budget. */
    if (KE_UNLIKELY(!p) && took)
        atomic_fetch_add(&ke_fail_budget, 1);
    return p;
}
