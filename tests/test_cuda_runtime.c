/*
 * test_cuda_runtime.c — the CUDA driver table: found or cleanly missing,
 * errors that name the call, copies, memset, pinned memory, streams and
 * events. Meson runs it twice: without KL_CUDA_EMULATE (here: no driver, so
 * every call must fail with "CUDA not available: <reason>"; on a GPU machine:
 * the real driver) and with KL_CUDA_EMULATE=1 (the emulated device).
 */
#include "harness.h"

#include "cuda_harness.h"

static const char *OP = "cuda_test";

static void test_available_or_clean_errors(void **state) {
    (void)state;
    if (kl_cuda_is_available()) {
        assert_true(kl_cuda_device_count() >= 1);
        assert_string_equal(kl_cuda_unavailable_reason(), "");
        char name[256];
        assert_int_equal(kl_cuda_device_name(0, name, sizeof name), 0);
        assert_true(strlen(name) > 0);
        int cc = kl_cuda_compute_capability(0);
        assert_true(cc >= 50);
        print_message("device 0: %s, sm_%d%s\n", name, cc, kt_cuda_emulated(OP) ? " (emulated)" : "");
        assert_int_equal(kl_cuda_synchronize(0), 0);
        KT_NO_ERROR();
        return;
    }
    /* No driver: every entry point fails, saying why, and nothing crashes. */
    const char *why = kl_cuda_unavailable_reason();
    assert_true(strlen(why) > 0);
    print_message("CUDA not available here: %s\n", why);
    assert_int_equal(kl_cuda_device_count(), 0);
    KT_NO_ERROR();
    assert_int_equal(kl_cuda_synchronize(0), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_cuda_synchronize: CUDA not available: ");
    assert_int_equal(kl_cuda_synchronize(0), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, why);
    kl_cuda_mem_stats st;
    assert_int_equal(kl_cuda_memory_stats(0, &st), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available");
    assert_int_equal(kl_cuda_empty_cache(0), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available");
    assert_int_equal(kl_cuda_compute_capability(0), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available");
    char name[64];
    assert_int_equal(kl_cuda_device_name(0, name, sizeof name), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available");
    assert_true(ku_malloc("cuda_test", 0, 100, NULL) == 0);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_cuda_test: CUDA not available");
}

static void test_bad_device_and_args(void **state) {
    (void)state;
    NEED_CUDA();
    int n = kl_cuda_device_count();
    assert_int_equal(kl_cuda_synchronize(n), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "does not exist");
    assert_int_equal(kl_cuda_synchronize(-1), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA device -1 does not exist");
    assert_int_equal(kl_cuda_device_name(0, NULL, 10), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_cuda_device_name");
    assert_int_equal(kl_cuda_memory_stats(0, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_cuda_memory_stats");
    kl_cuda_mem_stats st;
    assert_int_equal(kl_cuda_memory_stats(n + 3, &st), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "does not exist");
}

static void test_error_names_the_call(void **state) {
    (void)state;
    NEED_CUDA();
    assert_int_equal(ku_check(OP, "cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY), -1);
    KT_EXPECT_ERROR(KL_ERR_OOM, "kl_cuda_test: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory");
    assert_int_equal(ku_check(OP, "cuStreamQuery", CUDA_ERROR_INVALID_HANDLE), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuStreamQuery failed: CUDA_ERROR_INVALID_HANDLE: ");
    assert_int_equal(ku_check(OP, "cuInit", CUDA_SUCCESS), 0);
    KT_NO_ERROR();
    /* A code the driver does not know still gives a message, not a crash. */
    assert_int_equal(ku_check(OP, "cuFoo", 123456), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuFoo failed: ");
}

static void test_copies_and_memset(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    enum { N = 100003 };
    uint8_t *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) h[i] = (uint8_t)(i * 7 + 3);
    CUdeviceptr a = ku_malloc(OP, 0, N, NULL), b = ku_malloc(OP, 0, N, NULL);
    assert_true(a && b);
    assert_int_equal(a % 256, 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyHtoD, a, h, N), 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoD, b, a, N), 0);
    memset(back, 0, N);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoH, back, b, N), 0);
    assert_memory_equal(back, h, N);
    assert_int_equal(KU_CALL(OP, d, MemsetD8, b + 10, 0x5A, 1000), 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoH, back, b, N), 0);
    for (int i = 0; i < N; i++) assert_int_equal(back[i], i >= 10 && i < 1010 ? 0x5A : h[i]);
    assert_int_equal(ku_free(OP, a), 0);
    assert_int_equal(ku_free(OP, b), 0);
    assert_int_equal(kl_cuda_empty_cache(0), 0); /* compute-sanitizer's leak check sees no segment left */
    free(h);
    free(back);
    KT_NO_ERROR();
}

static void test_async_pinned_stream_events(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    size_t n = (size_t)4 << 20;
    void *pin = NULL, *pin2 = NULL;
    assert_int_equal(KU_CALL(OP, d, MemHostAlloc, &pin, n, CU_MEMHOSTALLOC_PORTABLE), 0);
    assert_int_equal(KU_CALL(OP, d, MemHostAlloc, &pin2, n, 0), 0);
    for (size_t i = 0; i < n; i++) ((uint8_t *)pin)[i] = (uint8_t)(i ^ (i >> 9));
    CUstream s;
    CUevent e0, e1;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s, CU_STREAM_NON_BLOCKING), 0);
    assert_int_equal(KU_CALL(OP, d, EventCreate, &e0, CU_EVENT_DEFAULT), 0);
    assert_int_equal(KU_CALL(OP, d, EventCreate, &e1, CU_EVENT_DEFAULT), 0);
    CUdeviceptr a = ku_malloc(OP, 0, n, s), b = ku_malloc(OP, 0, n, s);
    assert_true(a && b);
    assert_int_equal(KU_CALL(OP, d, EventRecord, e0, s), 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyHtoDAsync, a, pin, n, s), 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoDAsync, b, a, n, s), 0);
    assert_int_equal(KU_CALL(OP, d, MemsetD8Async, a, 0, n, s), 0);
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoHAsync, pin2, b, n, s), 0);
    assert_int_equal(KU_CALL(OP, d, EventRecord, e1, s), 0);
    assert_int_equal(KU_CALL(OP, d, EventSynchronize, e1), 0);
    assert_int_equal(KU_CALL(OP, d, EventQuery, e1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamQuery, s), 0);
    assert_memory_equal(pin2, pin, n);
    float ms = -1;
    assert_int_equal(KU_CALL(OP, d, EventElapsedTime, &ms, e0, e1), 0);
    assert_true(ms >= 0);
    /* A stream can wait for an event of another (here: the default stream). */
    assert_int_equal(KU_CALL(OP, d, StreamWaitEvent, NULL, e1, 0), 0);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, s), 0);
    assert_int_equal(ku_free(OP, a), 0);
    assert_int_equal(ku_free(OP, b), 0);
    assert_int_equal(kl_cuda_empty_cache(0), 0);
    assert_int_equal(KU_CALL(OP, d, EventDestroy, e0), 0);
    assert_int_equal(KU_CALL(OP, d, EventDestroy, e1), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s), 0);
    assert_int_equal(KU_CALL(OP, d, MemFreeHost, pin), 0);
    assert_int_equal(KU_CALL(OP, d, MemFreeHost, pin2), 0);
    size_t fr = 0, tot = 0;
    assert_int_equal(KU_CALL(OP, d, MemGetInfo, &fr, &tot), 0);
    assert_true(tot > 0 && fr <= tot);
    KT_NO_ERROR();
}

static void test_emulated_device(void **state) {
    (void)state;
    NEED_CUDA();
    if (!kt_cuda_emulated(OP)) {
        print_message("skipped: the real driver is in use (KL_CUDA_EMULATE is not set)\n");
        skip();
    }
    const ku_driver *d = ku_driver_get(OP);
    char name[64];
    assert_int_equal(kl_cuda_device_name(0, name, sizeof name), 0);
    assert_string_equal(name, "Kiln emulated device");
    assert_int_equal(kl_cuda_compute_capability(0), 90);
    int v = 0;
    assert_int_equal(KU_CALL(OP, d, DeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0), 0);
    assert_int_equal(v, 32);
    assert_int_equal(KU_CALL(OP, d, DeviceGetAttribute, &v, 12345, 0), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuDeviceGetAttribute failed: CUDA_ERROR_INVALID_VALUE");

    /* Fresh device memory is poisoned, not zero. */
    CUdeviceptr p = 0;
    assert_int_equal(KU_CALL(OP, d, MemAlloc, &p, 1000), 0);
    uint8_t buf[1000];
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoH, buf, p, 1000), 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(buf[i], 0xA5);
    /* Copies outside an allocation fail and say so. */
    assert_int_equal(KU_CALL(OP, d, MemcpyDtoH, buf, p + 1, 1000), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuMemcpyDtoH failed: CUDA_ERROR_INVALID_VALUE: invalid argument (emulated device: the device range is not inside one live allocation)");
    assert_int_equal(KU_CALL(OP, d, MemsetD8, p + 999, 0, 2), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuMemsetD8 failed");
    assert_int_equal(KU_CALL(OP, d, MemFree, p), 0);
    /* After the free the range is gone. */
    assert_int_equal(KU_CALL(OP, d, MemcpyHtoD, p, buf, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuMemcpyHtoD failed: CUDA_ERROR_INVALID_VALUE");
    assert_int_equal(KU_CALL(OP, d, MemFree, p), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuMemFree failed: CUDA_ERROR_INVALID_VALUE");
    /* A failure nobody asked about does not decorate a later, different error. */
    assert_int_equal(d->MemcpyHtoD(p, buf, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(ku_check(OP, "cuStreamQuery", CUDA_ERROR_INVALID_HANDLE), -1);
    if (strstr(kl_last_error(), "emulated device")) fail_msg("stale detail in: %s", kl_last_error());
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuStreamQuery failed: CUDA_ERROR_INVALID_HANDLE: invalid resource handle");

    /* A held stream keeps its events pending until released or synchronized. */
    CUstream s;
    CUevent e;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s, 0), 0);
    assert_int_equal(KU_CALL(OP, d, EventCreate, &e, 0), 0);
    assert_int_equal(KU_CALL(OP, d, EventQuery, e), 0); /* never recorded: complete, as CUDA says */
    ku_emu_hold_stream(s, 1);
    assert_int_equal(KU_CALL(OP, d, EventRecord, e, s), 0);
    assert_int_equal(d->EventQuery(e), CUDA_ERROR_NOT_READY);
    assert_int_equal(d->StreamQuery(s), CUDA_ERROR_NOT_READY);
    ku_emu_hold_stream(s, 0);
    assert_int_equal(d->EventQuery(e), CUDA_SUCCESS);
    ku_emu_hold_stream(s, 1);
    assert_int_equal(KU_CALL(OP, d, EventRecord, e, s), 0);
    assert_int_equal(d->EventQuery(e), CUDA_ERROR_NOT_READY);
    assert_int_equal(KU_CALL(OP, d, StreamSynchronize, s), 0);
    assert_int_equal(d->EventQuery(e), CUDA_SUCCESS);
    assert_int_equal(KU_CALL(OP, d, EventDestroy, e), 0);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s), 0);
    KT_NO_ERROR();
}

static void test_modules(void **state) {
    (void)state;
    NEED_CUDA();
    const ku_driver *d = ku_driver_get(OP);
    assert_int_equal(ku_device_enter(OP, 0), 0);
    CUmodule m = NULL;
    static const char junk[64] = "not a cubin";
    assert_int_equal(KU_CALL(OP, d, ModuleLoadData, &m, junk), -1);
    if (kt_cuda_emulated(OP))
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE: device kernel image is "
                                       "invalid (emulated device: the image is not Kiln CUDA C source");
    else
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuModuleLoadData failed: CUDA_ERROR_");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(test_available_or_clean_errors),
        KT_TEST(test_bad_device_and_args),
        KT_TEST(test_error_names_the_call),
        KT_TEST(test_copies_and_memset),
        KT_TEST(test_async_pinned_stream_events),
        KT_TEST(test_emulated_device),
        KT_TEST(test_modules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
