/* Kiln eager runtime: caching CPU allocator for tensor storage.
 *
 * Why cache: eager ops allocate an output per call.  glibc hands blocks of
 * 32 MiB and up back to the kernel on free, so without reuse every op on a
 * 2^24-float tensor pays ~1.9 us of page faulting per 4 KiB it writes.
 *
 *  - Sizes <= KE_SMALL_MAX come from per-thread free lists, one per size
 *    class, with no lock and no atomic read-modify-write on the fast path.
 *    A block freed on another thread joins that thread's list.  Each list
 *    holds at most ~64 KiB; the excess goes back to libc.
 *  - Larger sizes are rounded up to a class (4 steps per power of two) and
 *    freed blocks wait in one global, mutex-protected cache keyed by class.
 *    Classes of 1 MiB and up are mmap'ed (2 MiB-aligned with
 *    MADV_HUGEPAGE from 2 MiB up, so first touch faults per 2 MiB rather
 *    than per 4 KiB).  The cache holds at most KL_CPU_CACHE_MAX bytes
 *    (default 2 GiB; 0 disables all caching, small lists included); past
 *    that the least recently freed blocks are released first.
 *  - Built with AddressSanitizer, every call goes straight to
 *    posix_memalign/free at the exact size, so use-after-free and overflows
 *    past the requested size are reported.  KE_ALLOC_CACHING tells which
 *    build this is.
 */
#ifndef KILN_EAGER_ALLOC_H
#define KILN_EAGER_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifndef KL_API
#define KL_API __attribute__((visibility("default")))
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KE_ALLOC_CACHING 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KE_ALLOC_CACHING 0
#endif
#endif
#if !defined(KE_ALLOC_CACHING) && defined(KE_ALLOC_NO_CACHE)
#define KE_ALLOC_CACHING 0 /* e.g. for valgrind runs */
#endif
#ifndef KE_ALLOC_CACHING
#define KE_ALLOC_CACHING 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KE_ALLOC_ALIGN 64
#define KE_SMALL_MAX 4096
#define KE_ALLOC_MAX ((size_t)1 << 40)

/* 64-byte-aligned block of at least nbytes, or NULL on failure (never
 * aborts; nbytes > KE_ALLOC_MAX always fails).  nbytes == 0 yields a unique, freeable, non-NULL pointer that
 * must not be dereferenced; free it like any other.  Contents are
 * uninitialised (a reused block holds old data). */
void *ke_cpu_alloc(size_t nbytes);

/* nbytes must equal the value given to ke_cpu_alloc: it picks the size
 * class, so no per-block header is needed.  p == NULL is a no-op.  Any
 * thread may free a block. */
void ke_cpu_free(void *p, size_t nbytes);

typedef struct {
    int64_t live_blocks;  /* allocated, not yet freed */
    int64_t live_bytes;   /* sum of the nbytes requested for those */
    int64_t cached_bytes; /* class bytes parked in caches: all threads' small
                             lists plus the large cache */
    int64_t alloc_calls;  /* successful ke_cpu_alloc calls, ever */
    int64_t cache_hits;   /* of those, served from a cache */
} ke_alloc_stats;

/* Sums exact per-thread counters.  Exact when no other thread allocates or
 * frees during the call; otherwise each field is some recent value. */
ke_alloc_stats ke_cpu_alloc_stats(void);

/* Test hook, process-wide: after n more successful allocations (any
 * thread), every ke_cpu_alloc returns NULL until called with n < 0. */
void ke_alloc_fail_after(int64_t n);
/* 1 while failure injection is armed (callers with an allocation-free fast
 * path take the allocator instead, so injected failures stay reachable). */
int ke_alloc_failing(void);

/* Changes the cache cap at run time (the initial value comes from
 * KL_CPU_CACHE_MAX) and trims the large cache down to it at once.  0 turns
 * caching off for later frees; blocks already in small lists stay until
 * their thread exits or calls kl_empty_cache. */
void ke_cpu_cache_set_limit(size_t bytes);
size_t ke_cpu_cache_limit(void);

/* public: declared in kiln.h too */

/* Returns cached blocks to the system: the whole large cache, and the
 * small-block lists of the calling thread only (other threads' lists are
 * private to them and are released when those threads exit). */
KL_API void kl_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_EAGER_ALLOC_H */
