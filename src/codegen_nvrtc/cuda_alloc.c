/*
 * cuda_alloc.c — the caching device allocator, after PyTorch's
 * CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp), and the current
 * stream of each thread.
 *
 * cuMemAlloc/cuMemFree synchronize the device and cost tens of microseconds,
 * so freed blocks are kept and handed out again:
 * - sizes are rounded up to 512 B; requests <= 1 MiB come from the small pool,
 *   carved out of 2 MiB segments; larger ones from the large pool, whose
 *   segments are 20 MiB for requests < 10 MiB and the request rounded up to
 *   2 MiB otherwise;
 * - a request takes the smallest free block of its pool and stream that fits
 *   (best fit) and splits it when the rest is worth keeping (>= 512 B in the
 *   small pool, > 1 MiB in the large one, as PyTorch);
 * - a freed block merges with free neighbours of its segment;
 * - blocks are cached per stream: work queued on that stream is ordered, so
 *   a block freed there can be reused there at once. A block also used on
 *   other streams (ku_record_stream) returns to the cache only when events
 *   recorded on those streams at free time have completed;
 * - when cuMemAlloc runs out of memory, every cached segment not in use is
 *   freed (after waiting for its events) and the call retried once.
 * One mutex guards all of it: the critical sections are short and the
 * driver calls inside are the rare path.
 */
#include "cuda_api.h"

#include "core.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define KU_MIN_BLOCK ((size_t)512)
#define KU_SMALL_SIZE ((size_t)1 << 20)     /* largest request of the small pool */
#define KU_SMALL_BUFFER ((size_t)2 << 20)   /* small pool segment */
#define KU_LARGE_BUFFER ((size_t)20 << 20)  /* segment for requests < KU_MIN_LARGE_ALLOC */
#define KU_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define KU_ROUND_LARGE ((size_t)2 << 20)

typedef struct ku_block {
    CUdeviceptr ptr;
    size_t size;
    CUstream stream; /* the stream it was allocated on */
    int dev;
    int pool;        /* 0 small, 1 large */
    int allocated;
    int event_count; /* events still to complete before it is free again */
    struct ku_block *prev, *next; /* neighbours in the same segment */
    struct ku_block *hnext;       /* chain of the live-block hash */
    CUstream *uses;               /* other streams that used it */
    int nuses, capuses;
} ku_block;

/* Free blocks ordered by (stream, size, ptr): the first entry >= (s, n, 0)
 * is the best fit on stream s. */
typedef struct ku_pool {
    ku_block **v;
    int n, cap;
} ku_pool;

typedef struct ku_pending {
    CUevent ev;
    ku_block *b;
} ku_pending;

typedef struct ku_devstate {
    ku_pool pools[2];
    ku_pending *pend;
    int npend, cappend;
    CUevent *spare; /* completed events, reused */
    int nspare, capspare;
    kl_cuda_mem_stats st;
} ku_devstate;

#define KU_HASH_BUCKETS 16384
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ku_devstate g_dev[KU_MAX_DEVICES];
static ku_block *g_live[KU_HASH_BUCKETS];

static _Thread_local CUstream tl_stream[KU_MAX_DEVICES];

/* Block records are recycled (g_mu held): a split and the merge that undoes
 * it happen on every small-pool hit, and malloc/free were a third of its cost. */
static ku_block *g_spare_blocks;

static ku_block *new_block(void) {
    ku_block *b = g_spare_blocks;
    if (!b) return calloc(1, sizeof *b);
    g_spare_blocks = b->hnext;
    memset(b, 0, sizeof *b);
    return b;
}

static void drop_block(ku_block *b) {
    free(b->uses);
    b->uses = NULL;
    b->hnext = g_spare_blocks;
    g_spare_blocks = b;
}

CUstream ku_current_stream(int dev) { return dev >= 0 && dev < KU_MAX_DEVICES ? tl_stream[dev] : NULL; }

void ku_set_current_stream(int dev, CUstream s) {
    if (dev >= 0 && dev < KU_MAX_DEVICES) tl_stream[dev] = s;
}

/* ---- Small containers ------------------------------------------------------------ */

static int grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *nv = realloc(*v, (size_t)nc * elem);
    if (!nv) return -1;
    *v = nv;
    *cap = nc;
    return 0;
}

static int key_less(CUstream s1, size_t n1, CUdeviceptr p1, CUstream s2, size_t n2, CUdeviceptr p2) {
    if (s1 != s2) return (uintptr_t)s1 < (uintptr_t)s2;
    if (n1 != n2) return n1 < n2;
    return p1 < p2;
}

static int pool_lower(const ku_pool *p, CUstream s, size_t n, CUdeviceptr ptr) {
    int lo = 0, hi = p->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const ku_block *b = p->v[mid];
        if (key_less(b->stream, b->size, b->ptr, s, n, ptr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int pool_insert(ku_pool *p, ku_block *b) {
    if (grow((void **)&p->v, &p->cap, p->n + 1, sizeof *p->v)) return -1;
    int i = pool_lower(p, b->stream, b->size, b->ptr);
    memmove(p->v + i + 1, p->v + i, (size_t)(p->n - i) * sizeof *p->v);
    p->v[i] = b;
    p->n++;
    return 0;
}

static void pool_remove(ku_pool *p, ku_block *b) {
    int i = pool_lower(p, b->stream, b->size, b->ptr);
    KE_ASSERT(i < p->n && p->v[i] == b);
    memmove(p->v + i, p->v + i + 1, (size_t)(p->n - i - 1) * sizeof *p->v);
    p->n--;
}

static size_t hash_ptr(CUdeviceptr p) { return (size_t)((p >> 9) * 0x9E3779B97F4A7C15ull >> 50) % KU_HASH_BUCKETS; }

static void live_insert(ku_block *b) {
    size_t h = hash_ptr(b->ptr);
    b->hnext = g_live[h];
    g_live[h] = b;
}

static ku_block *live_find(CUdeviceptr p, int unlink) {
    for (ku_block **pp = &g_live[hash_ptr(p)]; *pp; pp = &(*pp)->hnext)
        if ((*pp)->ptr == p) {
            ku_block *b = *pp;
            if (unlink) *pp = b->hnext;
            return b;
        }
    return NULL;
}

/* ---- Sizes ------------------------------------------------------------------------ */

static size_t round_size(size_t n) { return n < KU_MIN_BLOCK ? KU_MIN_BLOCK : (n + KU_MIN_BLOCK - 1) / KU_MIN_BLOCK * KU_MIN_BLOCK; }

static size_t segment_size(size_t n) {
    if (n <= KU_SMALL_SIZE) return KU_SMALL_BUFFER;
    if (n < KU_MIN_LARGE_ALLOC) return KU_LARGE_BUFFER;
    return (n + KU_ROUND_LARGE - 1) / KU_ROUND_LARGE * KU_ROUND_LARGE;
}

static int should_split(const ku_block *b, size_t n) {
    size_t rest = b->size - n;
    return b->pool == 0 ? rest >= KU_MIN_BLOCK : rest > KU_SMALL_SIZE;
}

static void fmt_bytes(char *buf, size_t len, double n) {
    const char *u[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (n >= 1024 && i < 4) {
        n /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, len, "%.0f %s", n, u[i]);
    else
        snprintf(buf, len, "%.2f %s", n, u[i]);
}

/* ---- Freeing and events (g_mu held) ------------------------------------------------ */

/* Puts b back in its pool, merged with free neighbours of its segment. */
static void free_block(ku_devstate *ds, ku_block *b) {
    ku_pool *pool = &ds->pools[b->pool];
    ku_block *p = b->prev, *n = b->next;
    if (p && !p->allocated && p->event_count == 0) {
        pool_remove(pool, p);
        b->ptr = p->ptr;
        b->size += p->size;
        b->prev = p->prev;
        if (b->prev) b->prev->next = b;
        drop_block(p);
    }
    if (n && !n->allocated && n->event_count == 0) {
        pool_remove(pool, n);
        b->size += n->size;
        b->next = n->next;
        if (b->next) b->next->prev = b;
        drop_block(n);
    }
    if (pool_insert(pool, b)) {
        /* Cannot grow the pool's array: the block is lost to the cache but
         * stays in its segment (reserved), which only wastes memory. */
    }
}

static void spare_event(ku_devstate *ds, CUevent e, const ku_driver *d) {
    if (grow((void **)&ds->spare, &ds->capspare, ds->nspare + 1, sizeof *ds->spare) == 0)
        ds->spare[ds->nspare++] = e;
    else
        d->EventDestroy(e);
}

/* Returns blocks whose events have completed to the pools; with `wait`,
 * waits for every event first (empty_cache, out-of-memory). */
static void process_events(ku_devstate *ds, const ku_driver *d, int wait) {
    int k = 0;
    for (int i = 0; i < ds->npend; i++) {
        ku_pending pe = ds->pend[i];
        CUresult r = wait ? d->EventSynchronize(pe.ev) : d->EventQuery(pe.ev);
        if (r == CUDA_ERROR_NOT_READY) {
            ds->pend[k++] = pe;
            continue;
        }
        /* Any other answer (success, or an error that will show again on the
         * next real call) ends the wait: never keep a block forever. */
        spare_event(ds, pe.ev, d);
        if (--pe.b->event_count == 0) free_block(ds, pe.b);
    }
    ds->npend = k;
}

/* Frees every cached segment that is wholly free. */
static void release_cached(ku_devstate *ds, const ku_driver *d, int dev) {
    process_events(ds, d, 1);
    for (int pi = 0; pi < 2; pi++) {
        ku_pool *pool = &ds->pools[pi];
        int k = 0;
        for (int i = 0; i < pool->n; i++) {
            ku_block *b = pool->v[i];
            if (b->prev || b->next) {
                pool->v[k++] = b;
                continue;
            }
            d->MemFree(b->ptr);
            ds->st.reserved_bytes -= (int64_t)b->size;
            ds->st.num_segments--;
            ds->st.num_device_frees++;
            drop_block(b);
        }
        pool->n = k;
    }
    for (int i = 0; i < ds->nspare; i++) d->EventDestroy(ds->spare[i]);
    ds->nspare = 0;
}

/* ---- Public-facing entry points ------------------------------------------------------ */

static void note_peaks(kl_cuda_mem_stats *st) {
    if (st->allocated_bytes > st->peak_allocated_bytes) st->peak_allocated_bytes = st->allocated_bytes;
    if (st->reserved_bytes > st->peak_reserved_bytes) st->peak_reserved_bytes = st->reserved_bytes;
}

static CUdeviceptr oom_error(const char *op, const ku_driver *d, ku_devstate *ds, int dev, size_t bytes) {
    size_t fr = 0, tot = 0;
    d->MemGetInfo(&fr, &tot);
    char req[32], total[32], freeb[32], alloc[32], cached[32];
    fmt_bytes(req, sizeof req, (double)bytes);
    fmt_bytes(total, sizeof total, (double)tot);
    fmt_bytes(freeb, sizeof freeb, (double)fr);
    fmt_bytes(alloc, sizeof alloc, (double)ds->st.allocated_bytes);
    fmt_bytes(cached, sizeof cached, (double)(ds->st.reserved_bytes - ds->st.allocated_bytes));
    ds->st.num_ooms++;
    ke_err(KL_ERR_OOM, op,
           "CUDA out of memory. Tried to allocate %s on device %d (%s total capacity, %s free); "
           "%s allocated by Kiln, %s reserved by Kiln but unallocated (cache emptied and retried once)",
           req, dev, total, freeb, alloc, cached);
    return 0;
}

CUdeviceptr ku_malloc(const char *op, int dev, size_t bytes, CUstream stream) {
    if (bytes == 0) return 0;
    if (ku_device_enter(op, dev)) return 0;
    const ku_driver *d = ku_driver_get(op);
    if (bytes > ((size_t)1 << 62)) {
        ke_err(KL_ERR_OOM, op, "CUDA allocation of %zu bytes is larger than any device", bytes);
        return 0;
    }
    size_t size = round_size(bytes);
    int pi = size <= KU_SMALL_SIZE ? 0 : 1;
    pthread_mutex_lock(&g_mu);
    ku_devstate *ds = &g_dev[dev];
    process_events(ds, d, 0);
    ku_pool *pool = &ds->pools[pi];
    ku_block *b = NULL;
    int i = pool_lower(pool, stream, size, 0);
    if (i < pool->n && pool->v[i]->stream == stream) {
        b = pool->v[i];
        pool_remove(pool, b);
        ds->st.cache_hits++;
    } else {
        size_t seg = segment_size(size);
        CUdeviceptr p = 0;
        CUresult r = d->MemAlloc(&p, seg);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            ds->st.num_oom_retries++;
            release_cached(ds, d, dev);
            r = d->MemAlloc(&p, seg);
        }
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            CUdeviceptr z = oom_error(op, d, ds, dev, bytes);
            pthread_mutex_unlock(&g_mu);
            return z;
        }
        if (ku_check(op, "cuMemAlloc", r)) {
            pthread_mutex_unlock(&g_mu);
            return 0;
        }
        b = new_block();
        if (!b) {
            d->MemFree(p);
            pthread_mutex_unlock(&g_mu);
            ke_err(KL_ERR_OOM, op, "out of host memory for the allocator's bookkeeping");
            return 0;
        }
        *b = (ku_block){.ptr = p, .size = seg, .stream = stream, .dev = dev, .pool = pi};
        ds->st.reserved_bytes += (int64_t)seg;
        ds->st.num_segments++;
        ds->st.num_device_allocs++;
    }
    if (should_split(b, size)) {
        ku_block *rest = new_block();
        if (rest) {
            *rest = (ku_block){.ptr = b->ptr + size, .size = b->size - size, .stream = stream, .dev = dev, .pool = pi,
                               .prev = b, .next = b->next};
            if (b->next) b->next->prev = rest;
            b->next = rest;
            b->size = size;
            if (pool_insert(pool, rest)) {
                /* see free_block: the remainder stays in the segment, unused */
            }
        }
    }
    b->allocated = 1;
    live_insert(b);
    ds->st.allocated_bytes += (int64_t)b->size;
    ds->st.num_allocs++;
    note_peaks(&ds->st);
    pthread_mutex_unlock(&g_mu);
    return b->ptr;
}

int ku_free(const char *op, CUdeviceptr p) {
    if (!p) return 0;
    pthread_mutex_lock(&g_mu);
    ku_block *b = live_find(p, 1);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        return ke_err(KL_ERR_ARG, op, "0x%" PRIx64 " is not a live CUDA block of Kiln's allocator", (uint64_t)p);
    }
    const ku_driver *d = ku_driver_get(op); /* loaded: b exists */
    ku_devstate *ds = &g_dev[b->dev];
    b->allocated = 0;
    ds->st.allocated_bytes -= (int64_t)b->size;
    ds->st.num_frees++;
    int rc = 0;
    if (b->nuses) {
        /* Freeing runs on the caller's thread, whose current context may be
         * another device's: events must be made on the block's device. */
        pthread_mutex_unlock(&g_mu);
        rc = ku_device_enter(op, b->dev);
        pthread_mutex_lock(&g_mu);
        for (int i = 0; i < b->nuses && rc == 0; i++) {
            CUevent e = NULL;
            if (ds->nspare)
                e = ds->spare[--ds->nspare];
            else if (KU_CALL(op, d, EventCreate, &e, CU_EVENT_DISABLE_TIMING))
                rc = -1;
            if (rc == 0 && KU_CALL(op, d, EventRecord, e, b->uses[i])) {
                d->EventDestroy(e);
                rc = -1;
            }
            if (rc == 0 && grow((void **)&ds->pend, &ds->cappend, ds->npend + 1, sizeof *ds->pend)) {
                d->EventSynchronize(e);
                spare_event(ds, e, d);
                continue;
            }
            if (rc == 0) {
                ds->pend[ds->npend++] = (ku_pending){e, b};
                b->event_count++;
            }
        }
        if (rc) {
            /* No event could guard the block: wait for the streams instead. */
            for (int i = 0; i < b->nuses; i++) d->StreamSynchronize(b->uses[i]);
        }
        b->nuses = 0;
    }
    if (b->event_count == 0) free_block(ds, b);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int ku_record_stream(const char *op, CUdeviceptr p, CUstream stream) {
    pthread_mutex_lock(&g_mu);
    ku_block *b = live_find(p, 0);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        return ke_err(KL_ERR_ARG, op, "0x%" PRIx64 " is not a live CUDA block of Kiln's allocator", (uint64_t)p);
    }
    int rc = 0;
    if (stream != b->stream) {
        int seen = 0;
        for (int i = 0; i < b->nuses; i++) seen |= b->uses[i] == stream;
        if (!seen) {
            if (grow((void **)&b->uses, &b->capuses, b->nuses + 1, sizeof *b->uses))
                rc = ke_err(KL_ERR_OOM, op, "out of host memory recording a stream use");
            else
                b->uses[b->nuses++] = stream;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

size_t ku_block_size(CUdeviceptr p) {
    pthread_mutex_lock(&g_mu);
    ku_block *b = live_find(p, 0);
    size_t n = b ? b->size : 0;
    pthread_mutex_unlock(&g_mu);
    return n;
}

static int check_dev(const char *op, int dev) {
    if (!ku_driver_get(op)) return -1;
    int n = ku_device_count();
    if (dev < 0 || dev >= n) return ke_err(KL_ERR_DEVICE, op, "CUDA device %d does not exist (%d device%s)", dev, n, n == 1 ? "" : "s");
    return 0;
}

int kl_cuda_empty_cache(int dev) {
    const char *op = "cuda_empty_cache";
    if (ku_device_enter(op, dev)) return -1;
    pthread_mutex_lock(&g_mu);
    release_cached(&g_dev[dev], ku_driver_get(op), dev);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int kl_cuda_memory_stats(int dev, kl_cuda_mem_stats *out) {
    const char *op = "cuda_memory_stats";
    if (!out) return ke_err(KL_ERR_NULL_ARG, op, "out is NULL");
    if (check_dev(op, dev)) return -1;
    pthread_mutex_lock(&g_mu);
    *out = g_dev[dev].st;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int kl_cuda_reset_peak_memory_stats(int dev) {
    const char *op = "cuda_reset_peak_memory_stats";
    if (check_dev(op, dev)) return -1;
    pthread_mutex_lock(&g_mu);
    g_dev[dev].st.peak_allocated_bytes = g_dev[dev].st.allocated_bytes;
    g_dev[dev].st.peak_reserved_bytes = g_dev[dev].st.reserved_bytes;
    pthread_mutex_unlock(&g_mu);
    return 0;
}
