/*
 * test_cuda_alloc.c — the caching device allocator (src/codegen_nvrtc/
 * cuda_alloc.c): rounding, small-pool packing, split and coalesce, best fit,
 * per-stream reuse and record_stream, out-of-memory retry, empty_cache,
 * statistics, threads on their own streams, and a random stress run that
 * checks no two live blocks overlap. Runs on the emulated device in CI and on
 * the real driver where there is one; tests that need the emulator's knobs
 * (capacity, held streams) say so and skip on a real GPU.
 */
#include "harness.h"

#include <pthread.h>

#include "cuda_harness.h"

static const char *OP = "cuda_alloc_test";
#define MiB ((size_t)1 << 20)

static kl_cuda_mem_stats stats(void) {
    kl_cuda_mem_stats s;
    assert_int_equal(kl_cuda_memory_stats(0, &s), 0);
    return s;
}

/* Every test starts from an empty cache and must give back all it took. */
static int setup(void **state) {
    kt_setup(state);
    if (kl_cuda_is_available()) {
        ku_set_current_stream(0, NULL);
        kl_cuda_empty_cache(0);
    }
    return 0;
}
static int teardown(void **state) {
    int bad = 0;
    if (kl_cuda_is_available()) {
        kl_cuda_mem_stats s = stats();
        if (s.allocated_bytes != 0) {
            print_error("test left %lld bytes allocated\n", (long long)s.allocated_bytes);
            bad = 1;
        }
        kl_cuda_empty_cache(0);
        s = stats();
        if (s.reserved_bytes != 0 || s.num_segments != 0) {
            print_error("after empty_cache %lld bytes in %lld segments are still reserved\n",
                        (long long)s.reserved_bytes, (long long)s.num_segments);
            bad = 1;
        }
    }
    return kt_teardown(state) || bad ? -1 : 0;
}
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

static CUdeviceptr xmalloc(size_t n, CUstream s) {
    CUdeviceptr p = ku_malloc(OP, 0, n, s);
    if (!p) print_error("ku_malloc(%zu) failed: %s\n", n, kl_last_error());
    assert_true(p != 0);
    return p;
}
static void xfree(CUdeviceptr p) { assert_int_equal(ku_free(OP, p), 0); }

static void test_rounding(void **state) {
    (void)state;
    NEED_CUDA();
    size_t req[] = {1, 511, 512, 513, 1000, 4096, 4097, MiB - 1, MiB, MiB + 1, 3 * MiB + 5};
    size_t want[] = {512, 512, 512, 1024, 1024, 4096, 4608, MiB, MiB, MiB + 512, 3 * MiB + 512};
    for (size_t i = 0; i < sizeof req / sizeof *req; i++) {
        CUdeviceptr p = xmalloc(req[i], NULL);
        assert_int_equal(p % 256, 0); /* what cuMemAlloc guarantees */
        assert_int_equal(ku_block_size(p), want[i]);
        kl_cuda_mem_stats s = stats();
        assert_int_equal(s.allocated_bytes, (int64_t)want[i]);
        xfree(p);
    }
    assert_true(ku_malloc(OP, 0, 0, NULL) == 0);
    KT_NO_ERROR();
}

static void test_small_pool_packing(void **state) {
    (void)state;
    NEED_CUDA();
    /* 4096 blocks of 512 B fill exactly one 2 MiB segment, back to back. */
    enum { N = 4096 };
    CUdeviceptr *p = malloc(N * sizeof *p);
    for (int i = 0; i < N; i++) p[i] = xmalloc(300, NULL);
    for (int i = 1; i < N; i++) assert_true(p[i] == p[0] + (CUdeviceptr)i * 512);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.num_segments, 1);
    assert_int_equal(s.reserved_bytes, (int64_t)(2 * MiB));
    CUdeviceptr extra = xmalloc(1, NULL);
    assert_int_equal(stats().num_segments, 2);
    assert_true(extra < p[0] || extra >= p[0] + 2 * MiB);
    /* 1 MiB is still a small request: a segment holds two of them. */
    xfree(extra);
    for (int i = 0; i < N; i++) xfree(p[i]);
    free(p);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    CUdeviceptr a = xmalloc(MiB, NULL), b = xmalloc(MiB, NULL);
    assert_true(b == a + MiB);
    s = stats();
    assert_int_equal(s.num_segments, 1);
    assert_int_equal(s.reserved_bytes, (int64_t)(2 * MiB));
    xfree(a);
    xfree(b);
}

static void test_split_and_coalesce(void **state) {
    (void)state;
    NEED_CUDA();
    kl_cuda_mem_stats s0 = stats();
    /* A 4 MiB request gets a 20 MiB segment, split: the rest serves the next. */
    CUdeviceptr a = xmalloc(4 * MiB, NULL);
    assert_int_equal(stats().reserved_bytes, (int64_t)(20 * MiB));
    CUdeviceptr b = xmalloc(3 * MiB, NULL);
    CUdeviceptr c = xmalloc(5 * MiB, NULL);
    assert_true(b == a + 4 * MiB);
    assert_true(c == b + 3 * MiB);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.num_segments, 1);
    assert_int_equal(s.num_device_allocs - s0.num_device_allocs, 1);
    assert_int_equal(s.cache_hits - s0.cache_hits, 2);
    /* Free the middle, then its neighbours: all three merge with the tail. */
    xfree(b);
    xfree(a);
    xfree(c);
    /* The whole segment is one free block again: a 19.5 MiB request takes it
     * without splitting (a 0.5 MiB rest is not worth a block in the large pool). */
    CUdeviceptr d = xmalloc(19 * MiB + MiB / 2, NULL);
    assert_true(d == a);
    assert_int_equal(ku_block_size(d), 20 * MiB);
    s = stats();
    assert_int_equal(s.num_device_allocs - s0.num_device_allocs, 1);
    assert_int_equal(s.allocated_bytes, (int64_t)(20 * MiB));
    xfree(d);
    /* Small pool: split down to 512 B, merged back. */
    CUdeviceptr x = xmalloc(1000, NULL), y = xmalloc(1000, NULL), z = xmalloc(1000, NULL);
    assert_true(y == x + 1024 && z == y + 1024);
    xfree(x);
    xfree(z);
    xfree(y);
    CUdeviceptr w = xmalloc(2 * MiB - 512, NULL); /* > 1 MiB: large pool, its own segment */
    CUdeviceptr v = xmalloc(MiB, NULL);           /* small pool: the merged 2 MiB block */
    assert_true(v == x);
    xfree(w);
    xfree(v);
}

static void test_best_fit(void **state) {
    (void)state;
    NEED_CUDA();
    /* Three segments of their own sizes (>= 10 MiB rounds to 2 MiB). */
    CUdeviceptr a = xmalloc(12 * MiB, NULL), b = xmalloc(16 * MiB, NULL), c = xmalloc(14 * MiB, NULL);
    assert_int_equal(stats().num_segments, 3);
    xfree(a);
    xfree(b);
    xfree(c);
    kl_cuda_mem_stats s0 = stats();
    CUdeviceptr p = xmalloc(13 * MiB, NULL); /* fits 14 and 16: takes 14 */
    assert_true(p == c);
    assert_int_equal(ku_block_size(p), 14 * MiB); /* rest 1 MiB: not split */
    CUdeviceptr q = xmalloc(11 * MiB, NULL);      /* fits 12 and 16: takes 12 */
    assert_true(q == a);
    CUdeviceptr r = xmalloc(10 * MiB, NULL); /* only 16 is left: split, 6 MiB stays free */
    assert_true(r == b);
    assert_int_equal(ku_block_size(r), 10 * MiB);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.num_device_allocs, s0.num_device_allocs);
    assert_int_equal(s.cache_hits - s0.cache_hits, 3);
    CUdeviceptr t = xmalloc(6 * MiB, NULL);
    assert_true(t == b + 10 * MiB);
    assert_int_equal(stats().num_device_allocs, s0.num_device_allocs);
    xfree(p);
    xfree(q);
    xfree(r);
    xfree(t);
}

static void test_stream_reuse(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    CUstream s1, s2;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s1, CU_STREAM_NON_BLOCKING), 0);
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s2, CU_STREAM_NON_BLOCKING), 0);
    CUdeviceptr p = xmalloc(5000, s1);
    xfree(p);
    /* Freed on s1: another stream does not get it. */
    CUdeviceptr q = xmalloc(5000, s2);
    assert_true(q != p);
    assert_true(q < p || q >= p + 2 * MiB);
    /* s1 does, at once (its own later work is ordered after the free). */
    CUdeviceptr r = xmalloc(5000, s1);
    assert_true(r == p);
    xfree(q);
    xfree(r);
    /* The thread's current stream is per device and per thread. */
    assert_true(ku_current_stream(0) == NULL);
    ku_set_current_stream(0, s2);
    assert_true(ku_current_stream(0) == s2);
    CUdeviceptr u = xmalloc(5000, ku_current_stream(0));
    assert_true(u == q);
    xfree(u);
    ku_set_current_stream(0, NULL);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, s1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, s2), 0);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s2), 0);
}

static void test_record_stream(void **state) {
    (void)state;
    NEED_EMULATOR();
    const ku_driver *d = ku_driver_get(OP);
    CUstream s1, s2, s3;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s1, 0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s2, 0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s3, 0), 0);
    CUdeviceptr p = xmalloc(3 * MiB, s1);
    assert_int_equal(ku_record_stream(OP, p, s2), 0);
    assert_int_equal(ku_record_stream(OP, p, s2), 0); /* twice is once */
    assert_int_equal(ku_record_stream(OP, p, s3), 0);
    assert_int_equal(ku_record_stream(OP, p, s1), 0); /* its own stream: nothing to do */
    ku_emu_hold_stream(s2, 1); /* work on s2 still running */
    xfree(p);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.allocated_bytes, 0);
    /* Not reusable until s2's event completes (s3's completed at once). */
    CUdeviceptr q = xmalloc(3 * MiB, s1);
    assert_true(q != p);
    ku_emu_hold_stream(s2, 0);
    CUdeviceptr r = xmalloc(3 * MiB, s1);
    assert_true(r == p);
    xfree(q);
    xfree(r);
    /* empty_cache waits for pending events (synchronizing the held stream). */
    p = xmalloc(3 * MiB, s1);
    assert_int_equal(ku_record_stream(OP, p, s2), 0);
    ku_emu_hold_stream(s2, 1);
    xfree(p);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    assert_int_equal(stats().reserved_bytes, 0);
    assert_int_equal(d->StreamQuery(s2), CUDA_SUCCESS);
    /* Bad pointers are errors, not crashes. */
    assert_int_equal(ku_record_stream(OP, 12345, s2), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "is not a live CUDA block");
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s2), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s3), 0);
}

static void test_record_stream_real(void **state) {
    (void)state;
    NEED_CUDA();
    /* Without holding a stream: the event on s2 completes once s2 is idle. */
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    CUstream s1, s2;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s1, CU_STREAM_NON_BLOCKING), 0);
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s2, CU_STREAM_NON_BLOCKING), 0);
    CUdeviceptr p = xmalloc(64 * MiB, s1);
    CUdeviceptr src = xmalloc(64 * MiB, s2);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoDAsync, p, src, 64 * MiB, s2), 0);
    assert_int_equal(ku_record_stream(OP, p, s2), 0);
    xfree(p);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, s2), 0);
    CUdeviceptr r = xmalloc(64 * MiB, s1);
    assert_true(r == p);
    xfree(r);
    xfree(src);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s2), 0);
}

static void test_oom_retry_emulated(void **state) {
    (void)state;
    NEED_EMULATOR();
    const ku_driver *d = ku_driver_get(OP);
    CUstream s;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s, 0), 0);
    ku_emu_set_capacity(64 * MiB);
    kl_cuda_mem_stats s0 = stats();
    CUdeviceptr a = xmalloc(40 * MiB, NULL);
    xfree(a); /* cached on the default stream */
    assert_int_equal(stats().reserved_bytes, (int64_t)(40 * MiB));
    /* On another stream the cached block does not fit the request; the device
     * has 24 MiB left: out of memory, cache freed, retried, success. */
    CUdeviceptr b = xmalloc(30 * MiB, s);
    kl_cuda_mem_stats s1 = stats();
    assert_int_equal(s1.num_oom_retries - s0.num_oom_retries, 1);
    assert_int_equal(s1.reserved_bytes, (int64_t)(30 * MiB));
    assert_int_equal(s1.num_ooms, s0.num_ooms);
    /* Now a request that cannot fit even after the retry. */
    assert_true(ku_malloc(OP, 0, 50 * MiB, s) == 0);
    KT_EXPECT_ERROR(KL_ERR_OOM, "kl_cuda_alloc_test: CUDA out of memory. Tried to allocate 50.00 MiB on device 0 "
                                "(64.00 MiB total capacity, 34.00 MiB free); 30.00 MiB allocated by Kiln, 0 bytes "
                                "reserved by Kiln but unallocated");
    kl_cuda_mem_stats s2 = stats();
    assert_int_equal(s2.num_ooms - s0.num_ooms, 1);
    assert_int_equal(s2.num_oom_retries - s0.num_oom_retries, 2);
    assert_int_equal(s2.allocated_bytes, (int64_t)(30 * MiB));
    /* A cached segment is freed before giving up, so the message shows none. */
    CUdeviceptr c = xmalloc(MiB, s); /* a small-pool segment of 2 MiB, then cached */
    xfree(c);
    assert_true(ku_malloc(OP, 0, 40 * MiB, s) == 0);
    KT_EXPECT_ERROR(KL_ERR_OOM, "30.00 MiB allocated by Kiln, 0 bytes reserved");
    xfree(b);
    ku_emu_set_capacity((size_t)1 << 30);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s), 0);
}

static void test_oom_real_or_emulated(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    size_t fr = 0, tot = 0;
    assert_int_equal(KU_CALL(OP, d, MemGetInfo, &fr, &tot), 0);
    kl_cuda_mem_stats s0 = stats();
    assert_true(ku_malloc(OP, 0, 2 * tot, NULL) == 0);
    KT_EXPECT_ERROR(KL_ERR_OOM, "CUDA out of memory. Tried to allocate");
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.num_oom_retries - s0.num_oom_retries, 1);
    assert_int_equal(s.num_ooms - s0.num_ooms, 1);
    assert_true(ku_malloc(OP, 0, SIZE_MAX, NULL) == 0);
    KT_EXPECT_ERROR(KL_ERR_OOM, "larger than any device");
    /* The allocator still works afterwards. */
    CUdeviceptr p = xmalloc(1000, NULL);
    xfree(p);
}

static void test_empty_cache_and_stats(void **state) {
    (void)state;
    NEED_CUDA();
    kl_cuda_mem_stats s0 = stats();
    assert_int_equal(s0.allocated_bytes, 0);
    assert_int_equal(s0.reserved_bytes, 0);
    CUdeviceptr a = xmalloc(100, NULL), b = xmalloc(30 * MiB, NULL);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.allocated_bytes, (int64_t)(512 + 30 * MiB));
    assert_int_equal(s.reserved_bytes, (int64_t)(2 * MiB + 30 * MiB));
    assert_int_equal(s.num_segments, 2);
    assert_int_equal(s.num_allocs - s0.num_allocs, 2);
    xfree(b);
    s = stats();
    assert_int_equal(s.allocated_bytes, 512);
    assert_int_equal(s.peak_allocated_bytes >= (int64_t)(512 + 30 * MiB), 1);
    assert_int_equal(s.num_frees - s0.num_frees, 1);
    assert_int_equal(kl_cuda_reset_peak_memory_stats(0), 0);
    s = stats();
    assert_int_equal(s.peak_allocated_bytes, 512);
    assert_int_equal(s.peak_reserved_bytes, (int64_t)(32 * MiB));
    /* empty_cache frees the unused 30 MiB segment, keeps the one in use. */
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    s = stats();
    assert_int_equal(s.reserved_bytes, (int64_t)(2 * MiB));
    assert_int_equal(s.num_segments, 1);
    assert_int_equal(s.num_device_frees - s0.num_device_frees, 1);
    if (kt_cuda_emulated(OP)) assert_int_equal(ku_emu_used(), 2 * MiB);
    xfree(a);
    /* Errors: bad pointers, double frees, bad device. */
    assert_int_equal(ku_free(OP, a), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "is not a live CUDA block of Kiln's allocator");
    assert_int_equal(ku_free(OP, 0), 0);
    KT_NO_ERROR();
    assert_true(ku_malloc(OP, kl_cuda_device_count(), 10, NULL) == 0);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "does not exist");
    assert_int_equal(kl_cuda_empty_cache(-2), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "does not exist");
}

/* ---- Threads and stress ------------------------------------------------------------ */

typedef struct lcg {
    uint64_t s;
} lcg;
static uint32_t rnd(lcg *g) {
    g->s = g->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g->s >> 33);
}

/* Fills block p with a byte, later checks it is still there: blocks handed
 * out twice, or overlapping, show up as a changed byte. */
static int fill(const ku_driver *d, CUdeviceptr p, size_t n, uint8_t v, CUstream s) {
    return KU_CALL(OP, d, MemsetD8Async, p, v, n, s);
}
static int check(const ku_driver *d, CUdeviceptr p, size_t n, uint8_t v, CUstream s) {
    uint8_t buf[3];
    size_t at[3] = {0, n / 2, n - 1};
    for (int i = 0; i < 3; i++)
        if (KU_CALL(OP, d, MemcpyDtoHAsync, &buf[i], p + at[i], 1, s)) return -1;
    if (KU_CALL(OP, d, StreamSynchronize, s)) return -1;
    return buf[0] == v && buf[1] == v && buf[2] == v ? 0 : -2;
}

typedef struct worker {
    int id, iters, errors;
    char msg[256];
} worker;

static void *thread_main(void *arg) {
    worker *w = arg;
    const ku_driver *d = ku_driver_get(OP);
    lcg g = {(uint64_t)w->id * 7919 + 1};
    if (ku_device_enter(OP, 0)) goto fail;
    CUstream s;
    if (KU_CALL(OP, d, StreamCreate, &s, CU_STREAM_NON_BLOCKING)) goto fail;
    ku_set_current_stream(0, s);
    enum { LIVE = 16 };
    CUdeviceptr live[LIVE] = {0};
    size_t sz[LIVE] = {0};
    for (int it = 0; it < w->iters; it++) {
        int k = (int)(rnd(&g) % LIVE);
        uint8_t tag = (uint8_t)(w->id * 16 + k);
        if (live[k]) {
            int c = check(d, live[k], sz[k], tag, s);
            if (c) {
                if (c == -2) snprintf(w->msg, sizeof w->msg, "thread %d: block %d was overwritten", w->id, k);
                goto fail;
            }
            if (ku_free(OP, live[k])) goto fail;
            live[k] = 0;
        } else {
            sz[k] = rnd(&g) % 8 ? 1 + rnd(&g) % 200000 : MiB + rnd(&g) % (6 * MiB);
            live[k] = ku_malloc(OP, 0, sz[k], ku_current_stream(0));
            if (!live[k] || fill(d, live[k], sz[k], tag, s)) goto fail;
        }
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k] && ku_free(OP, live[k])) goto fail;
    if (KU_CALL(OP, d, StreamSynchronize, s)) goto fail;
    /* Blocks cached on this stream stay in the cache: empty_cache (teardown)
     * frees them; the stream handle may go now. */
    ku_set_current_stream(0, NULL);
    if (KU_CALL(OP, d, StreamDestroy, s)) goto fail;
    return NULL;
fail:
    w->errors++;
    if (!w->msg[0]) snprintf(w->msg, sizeof w->msg, "thread %d: %s", w->id, kl_last_error());
    kl_clear_error();
    return NULL;
}

static void test_threads_own_streams(void **state) {
    (void)state;
    NEED_CUDA();
    enum { NT = 8 };
    pthread_t th[NT];
    worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){.id = i, .iters = 1000};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &w[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        if (w[i].errors) print_error("%s\n", w[i].msg);
        errors += w[i].errors;
    }
    assert_int_equal(errors, 0);
    kl_cuda_mem_stats s = stats();
    assert_int_equal(s.allocated_bytes, 0);
    assert_true(s.cache_hits > 0);
    print_message("8 threads x 1000 steps: %lld allocations, %lld cache hits, %lld cuMemAlloc, peak reserved %.1f MiB\n",
                  (long long)s.num_allocs, (long long)s.cache_hits, (long long)s.num_device_allocs,
                  s.peak_reserved_bytes / 1048576.0);
}

static void test_stress(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    CUstream st[2];
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &st[0], CU_STREAM_NON_BLOCKING), 0);
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &st[1], CU_STREAM_NON_BLOCKING), 0);
    enum { LIVE = 512, STEPS = 8000 };
    CUdeviceptr *live = calloc(LIVE, sizeof *live);
    size_t *sz = calloc(LIVE, sizeof *sz);
    int *sid = calloc(LIVE, sizeof *sid);
    lcg g = {12345};
    int64_t live_bytes = 0;
    for (int it = 0; it < STEPS; it++) {
        int k = (int)(rnd(&g) % LIVE);
        uint8_t tag = (uint8_t)(k * 31 + 7);
        if (live[k]) {
            assert_int_equal(check(d, live[k], sz[k], tag, st[sid[k]]), 0);
            if (rnd(&g) % 5 == 0) assert_int_equal(ku_record_stream(OP, live[k], st[!sid[k]]), 0);
            live_bytes -= (int64_t)ku_block_size(live[k]);
            xfree(live[k]);
            live[k] = 0;
        } else {
            uint32_t r = rnd(&g) % 100;
            sz[k] = r < 70 ? 1 + rnd(&g) % 8192 : r < 95 ? 8192 + rnd(&g) % (2 * MiB) : 2 * MiB + rnd(&g) % (24 * MiB);
            sid[k] = (int)(rnd(&g) % 2);
            live[k] = xmalloc(sz[k], st[sid[k]]);
            assert_true(ku_block_size(live[k]) >= sz[k]);
            live_bytes += (int64_t)ku_block_size(live[k]);
            assert_int_equal(fill(d, live[k], sz[k], tag, st[sid[k]]), 0);
        }
        if (it % 1000 == 0) assert_int_equal(stats().allocated_bytes, live_bytes);
        if (it % 2999 == 2998) assert_int_equal(kl_cuda_empty_cache(0), 0);
    }
    /* No two live blocks overlap. */
    for (int i = 0; i < LIVE; i++)
        for (int j = 0; j < LIVE; j++)
            if (i != j && live[i] && live[j])
                assert_false(live[i] < live[j] + ku_block_size(live[j]) && live[j] < live[i] + ku_block_size(live[i]));
    for (int k = 0; k < LIVE; k++)
        if (live[k]) {
            assert_int_equal(check(d, live[k], sz[k], (uint8_t)(k * 31 + 7), st[sid[k]]), 0);
            xfree(live[k]);
        }
    kl_cuda_mem_stats s = stats();
    print_message("stress: %lld allocations, %lld cache hits, %lld cuMemAlloc, peak allocated %.1f MiB, peak reserved %.1f MiB\n",
                  (long long)s.num_allocs, (long long)s.cache_hits, (long long)s.num_device_allocs,
                  s.peak_allocated_bytes / 1048576.0, s.peak_reserved_bytes / 1048576.0);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, st[0]), 0);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, st[1]), 0);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, st[0]), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, st[1]), 0);
    free(live);
    free(sz);
    free(sid);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_rounding),
        T(test_small_pool_packing),
        T(test_split_and_coalesce),
        T(test_best_fit),
        T(test_stream_reuse),
        T(test_record_stream),
        T(test_record_stream_real),
        T(test_oom_retry_emulated),
        T(test_oom_real_or_emulated),
        T(test_empty_cache_and_stats),
        T(test_threads_own_streams),
        T(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
