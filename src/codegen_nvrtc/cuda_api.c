/*
 * cuda_api.c — finds the CUDA driver at run time (dlopen of libcuda.so.1, or
 * the emulated one with KL_CUDA_EMULATE=1), turns CUresults into Kiln errors,
 * keeps one primary context per device, and the public kl_cuda_* queries.
 * Never linked against libcuda: the same libkiln runs with and without it.
 */
#include "cuda_api.h"

#include "core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ku_driver g_real;
static const ku_driver *g_drv;      /* NULL: not available, g_reason says why */
static char g_reason[512];
static int g_ndev;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

/* Name and text of a driver error; the emulated table answers for itself. */
static void err_text(const ku_driver *d, CUresult r, const char **name, const char **str) {
    *name = *str = NULL;
    if (d && d->GetErrorName) d->GetErrorName(r, name);
    if (d && d->GetErrorString) d->GetErrorString(r, str);
    if (!*name) *name = "CUDA_ERROR_UNKNOWN";
    if (!*str) *str = "unrecognized error code";
}

static void load_real(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_reason, sizeof g_reason, "%s", e ? e : "dlopen(libcuda.so.1) failed");
        return;
    }
#define KU_LOAD_(name, sym, params)                                                          \
    *(void **)&g_real.name = dlsym(h, sym);                                                  \
    if (!g_real.name && !strcmp(sym, "cuEventElapsedTime_v2")) /* drivers before 12.8 */   \
        *(void **)&g_real.name = dlsym(h, "cuEventElapsedTime");                             \
    if (!g_real.name) {                                                                      \
        snprintf(g_reason, sizeof g_reason, "libcuda.so.1 has no symbol %s (driver too old)", sym); \
        dlclose(h);                                                                          \
        return;                                                                              \
    }
    KU_DRIVER_FUNCS(KU_LOAD_)
#undef KU_LOAD_
    g_real.emulated = 0;
    /* The library handle stays open for the life of the process, as the
     * function pointers into it do. */
    CUresult r = g_real.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *n, *s;
        err_text(&g_real, r, &n, &s);
        snprintf(g_reason, sizeof g_reason, "cuInit failed: %s: %s", n, s);
        return;
    }
    int count = 0;
    r = g_real.DeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count <= 0) {
        const char *n, *s;
        err_text(&g_real, r, &n, &s);
        snprintf(g_reason, sizeof g_reason, "no CUDA device (cuDeviceGetCount: %d devices, %s)", count, n);
        return;
    }
    g_ndev = count < KU_MAX_DEVICES ? count : KU_MAX_DEVICES;
    g_drv = &g_real;
}

static void load_once(void) {
    if (env_flag("KL_CUDA_EMULATE")) {
        const ku_driver *e = ku_emu_driver();
        int count = 0;
        e->Init(0);
        e->DeviceGetCount(&count);
        g_ndev = count;
        g_drv = e;
        return;
    }
    load_real();
}

const ku_driver *ku_driver_get(const char *op) {
    pthread_once(&g_once, load_once);
    if (!g_drv) ke_err(KL_ERR_DEVICE, op, "CUDA not available: %s", g_reason);
    return g_drv;
}

int ku_check(const char *op, const char *call, CUresult r) {
    if (r == CUDA_SUCCESS) return 0;
    const char *n, *s;
    err_text(g_drv, r, &n, &s);
    return ke_err(r == CUDA_ERROR_OUT_OF_MEMORY ? KL_ERR_OOM : KL_ERR_DEVICE, op, "%s failed: %s: %s", call, n, s);
}

int ku_device_count(void) {
    pthread_once(&g_once, load_once);
    return g_drv ? g_ndev : 0;
}

/* Primary contexts are retained once and kept: releasing them would free
 * every allocation of the process on that device. */
static CUcontext g_ctx[KU_MAX_DEVICES];
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local CUcontext tl_ctx;

int ku_device_enter(const char *op, int dev) {
    const ku_driver *d = ku_driver_get(op);
    if (!d) return -1;
    if (dev < 0 || dev >= g_ndev)
        return ke_err(KL_ERR_DEVICE, op, "CUDA device %d does not exist (%d device%s)", dev, g_ndev,
                      g_ndev == 1 ? "" : "s");
    /* Fast path, every allocation takes it: this thread already made the
     * device's context current (contexts are published once, never changed). */
    CUcontext c = __atomic_load_n(&g_ctx[dev], __ATOMIC_ACQUIRE);
    if (c && tl_ctx == c) return 0;
    pthread_mutex_lock(&g_ctx_mu);
    c = g_ctx[dev];
    if (!c) {
        CUdevice cd;
        if (KU_CALL(op, d, DeviceGet, &cd, dev) || KU_CALL(op, d, DevicePrimaryCtxRetain, &c, cd)) {
            pthread_mutex_unlock(&g_ctx_mu);
            return -1;
        }
        __atomic_store_n(&g_ctx[dev], c, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_ctx_mu);
    if (tl_ctx == c) return 0;
    if (KU_CALL(op, d, CtxSetCurrent, c)) return -1;
    tl_ctx = c;
    return 0;
}

/* ---- Public API -------------------------------------------------------- */

bool kl_cuda_is_available(void) {
    pthread_once(&g_once, load_once);
    return g_drv != NULL;
}

int kl_cuda_device_count(void) { return ku_device_count(); }

const char *kl_cuda_unavailable_reason(void) {
    pthread_once(&g_once, load_once);
    return g_drv ? "" : g_reason;
}

int kl_cuda_device_name(int dev, char *buf, size_t len) {
    const char *op = "cuda_device_name";
    if (!buf || len == 0) return ke_err(KL_ERR_NULL_ARG, op, "buf is NULL or len is 0");
    if (ku_device_enter(op, dev)) return -1;
    const ku_driver *d = g_drv;
    CUdevice cd;
    if (KU_CALL(op, d, DeviceGet, &cd, dev)) return -1;
    return KU_CALL(op, d, DeviceGetName, buf, (int)(len > 4096 ? 4096 : len), cd);
}

int kl_cuda_compute_capability(int dev) {
    const char *op = "cuda_compute_capability";
    if (ku_device_enter(op, dev)) return -1;
    const ku_driver *d = g_drv;
    CUdevice cd;
    int maj = 0, min = 0;
    if (KU_CALL(op, d, DeviceGet, &cd, dev) ||
        KU_CALL(op, d, DeviceGetAttribute, &maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cd) ||
        KU_CALL(op, d, DeviceGetAttribute, &min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cd))
        return -1;
    return maj * 10 + min;
}

int kl_cuda_synchronize(int dev) {
    const char *op = "cuda_synchronize";
    if (ku_device_enter(op, dev)) return -1;
    return KU_CALL(op, g_drv, CtxSynchronize);
}

void *ku_dlopen_first(const char *what, const char *const *names, size_t n, char *reason, size_t cap) {
    char first[256] = "";
    for (size_t i = 0; i < n; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        const char *e = dlerror();
        if (!first[0]) snprintf(first, sizeof first, "%s", e ? e : names[i]);
    }
    snprintf(reason, cap, "%s not available: %s", what, first);
    return NULL;
}

int ku_dlsym_into(void *h, const char *what, const char *sym, void **slot, char *reason, size_t cap) {
    *slot = dlsym(h, sym);
    if (*slot) return 0;
    snprintf(reason, cap, "%s not available: no symbol %s", what, sym);
    return -1;
}
