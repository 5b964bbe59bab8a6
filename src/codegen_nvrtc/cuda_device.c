/*
 * cuda_device.c — the CUDA device as eager sees it (ke_device_ops, core.h):
 * memory from the caching allocator, copies and fills on this thread's
 * current stream. Registered by the composition root (src/init.c); nothing
 * here runs, and no driver is loaded, until a CUDA tensor is asked for.
 *
 * Host-visible synchrony: a copy to the host returns once the bytes are
 * there; a copy from the host returns once the host buffer may be reused
 * (pageable memory: the driver gives no earlier guarantee), so both end in
 * a stream synchronize. Device-to-device copies and fills are queued on the
 * current stream, ordered before whatever this thread queues next there.
 */
#include "cuda_api.h"
#include "cuda_device.h"

#include "core.h"

static int dev_alloc(const char *op, int dev, size_t n, void **out) {
    *out = NULL;
    if (ku_device_enter(op, dev)) return -1;
    if (!n) return 0;
    CUdeviceptr p = ku_malloc(op, dev, n, ku_current_stream(dev));
    if (!p) return -1;
    *out = (void *)(uintptr_t)p;
    return 0;
}

/* A block the allocator does not know is a bug in Kiln: stop on it rather
 * than leave an error pending for an unrelated op. */
static void dev_free(void *p, size_t n, int dev) {
    (void)n, (void)dev;
    KE_ASSERT(ku_free("free", (CUdeviceptr)(uintptr_t)p) == 0);
}

static inline CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static int copy_h2d(const char *op, int dev, void *dst, const void *src, size_t n) {
    if (!n) return 0;
    if (ku_device_enter(op, dev)) return -1;
    const ku_driver *d = ku_driver_get(op);
    CUstream s = ku_current_stream(dev);
    ku_count(KU_N_H2D);
    if (KU_CALL(op, d, MemcpyHtoDAsync, dptr(dst), src, n, s)) return -1;
    return KU_CALL(op, d, StreamSynchronize, s);
}

static int copy_d2h(const char *op, int dev, void *dst, const void *src, size_t n) {
    if (!n) return 0;
    if (ku_device_enter(op, dev)) return -1;
    const ku_driver *d = ku_driver_get(op);
    CUstream s = ku_current_stream(dev);
    ku_count(KU_N_D2H);
    if (KU_CALL(op, d, MemcpyDtoHAsync, dst, dptr(src), n, s)) return -1;
    return KU_CALL(op, d, StreamSynchronize, s);
}

/* Across devices (unified addressing makes it one driver copy): the source's
 * queued work is waited for first, and the copy itself before returning, so
 * neither block can be reused under it by its own device's stream. */
static int copy_d2d(const char *op, int ddev, void *dst, int sdev, const void *src, size_t n) {
    if (!n) return 0;
    const ku_driver *d = ku_driver_get(op);
    if (!d) return -1;
    if (sdev != ddev &&
        (ku_device_enter(op, sdev) || KU_CALL(op, d, StreamSynchronize, ku_current_stream(sdev))))
        return -1;
    if (ku_device_enter(op, ddev)) return -1;
    CUstream s = ku_current_stream(ddev);
    ku_count(KU_N_D2D);
    if (KU_CALL(op, d, MemcpyDtoDAsync, dptr(dst), dptr(src), n, s)) return -1;
    return sdev != ddev ? KU_CALL(op, d, StreamSynchronize, s) : 0;
}

static int dev_memset(const char *op, int dev, void *dst, int byte, size_t n) {
    if (!n) return 0;
    if (ku_device_enter(op, dev)) return -1;
    ku_count(KU_N_MEMSET);
    return KU_CALL(op, ku_driver_get(op), MemsetD8Async, dptr(dst), (unsigned char)byte, n, ku_current_stream(dev));
}

static int dev_sync(const char *op, int dev) {
    if (ku_device_enter(op, dev)) return -1;
    return KU_CALL(op, ku_driver_get(op), StreamSynchronize, ku_current_stream(dev));
}

const ke_device_ops ku_cuda_device_ops = {
    .name = "CUDA",
    .alloc = dev_alloc,
    .free = dev_free,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .copy_d2d = copy_d2d,
    .memset = dev_memset,
    .synchronize = dev_sync,
};

kl_device kl_cuda_device(int index) { return (kl_device){KL_CUDA, index}; }
