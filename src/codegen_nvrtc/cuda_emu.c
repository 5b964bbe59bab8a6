/*
 * cuda_emu.c — the emulated CUDA driver (KL_CUDA_EMULATE=1): the same
 * function table as libcuda, filled with host code, so the runtime above it
 * (allocator, streams, events, copies) runs in CI where there is no GPU.
 *
 * Device memory is host memory with a capacity (out-of-memory can be
 * injected), fresh blocks are filled with 0xA5 and freed ones with 0xDD before
 * they go back to malloc (reads of uninitialized or freed device memory show
 * up as garbage, and under ASan as errors). Every copy and memset checks that
 * its device range lies inside one live allocation. Work runs at once, in
 * order; a stream can be "held" (ku_emu_hold_stream) so that events recorded
 * on it stay incomplete until it is released or synchronized. Modules and
 * launches are cuda_emu_module.c's (CUDA C compiled for the host, one fiber
 * per CUDA thread; docs/GPU.md).
 */
#include "cuda_emu.h"

#include <stdarg.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EMU_ALIGN 512 /* what cuMemAlloc gives in practice (256 is the documented minimum) */

typedef struct emu_alloc {
    uintptr_t base;
    size_t size;
} emu_alloc;

struct CUevent_st;
struct CUstream_st {
    uint32_t magic;
    int held;
    struct CUevent_st **pending; /* events recorded while held */
    int npending, cap;
};
struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    int recorded;
    int complete;
    struct CUstream_st *on; /* the held stream it waits for, if any */
    double t_ms;            /* when it completed */
};

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x4556544eu

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static emu_alloc *allocs;
static int nallocs, cap_allocs;
static size_t used, capacity;
static int capacity_set;
static struct CUctx_st { int dummy; } the_ctx;
/* Extra words for this thread's last failure, shown by cuGetErrorString for
 * that code only (a stale detail must not decorate another error). Big
 * enough for a compiler's first errors; Kiln's message keeps the first 1 KB. */
static _Thread_local char tl_detail[1024];
static _Thread_local int tl_has_detail;
static _Thread_local CUresult tl_detail_code;

CUresult ku_emu_fail(CUresult r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_detail, sizeof tl_detail, fmt, ap);
    va_end(ap);
    tl_has_detail = 1;
    tl_detail_code = r;
    return r;
}

static CUresult fail(CUresult r, const char *why) { return ku_emu_fail(r, "%s", why); }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void init_capacity(void) {
    if (capacity_set) return;
    const char *v = getenv("KL_CUDA_EMULATE_MEM");
    char *end;
    unsigned long long c = v ? strtoull(v, &end, 10) : 0;
    capacity = c > 0 ? (size_t)c : (size_t)1 << 30;
    capacity_set = 1;
}

void ku_emu_set_capacity(size_t bytes) {
    pthread_mutex_lock(&mu);
    capacity = bytes;
    capacity_set = 1;
    pthread_mutex_unlock(&mu);
}

size_t ku_emu_used(void) {
    pthread_mutex_lock(&mu);
    size_t u = used;
    pthread_mutex_unlock(&mu);
    return u;
}

/* Index of the allocation holding [p, p+n), -1 if none (lock held). */
static int find_range(CUdeviceptr p, size_t n) {
    for (int i = 0; i < nallocs; i++)
        if (p >= allocs[i].base && p - allocs[i].base <= allocs[i].size && n <= allocs[i].size - (p - allocs[i].base))
            return i;
    return -1;
}

static CUresult check_range(CUdeviceptr p, size_t n) {
    pthread_mutex_lock(&mu);
    int i = find_range(p, n);
    pthread_mutex_unlock(&mu);
    return i < 0 ? fail(CUDA_ERROR_INVALID_VALUE, "the device range is not inside one live allocation") : CUDA_SUCCESS;
}

int ku_emu_stream_ok(CUstream s) { return !s || s->magic == STREAM_MAGIC; }

static CUresult check_stream(CUstream s) {
    return s && s->magic != STREAM_MAGIC ? fail(CUDA_ERROR_INVALID_HANDLE, "not a live stream") : CUDA_SUCCESS;
}

/* ---- Device and context ---------------------------------------------------- */

static CUresult e_Init(unsigned flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
static CUresult e_DriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult e_DeviceGetCount(int *c) { *c = 1; return CUDA_SUCCESS; }
static CUresult e_DeviceGet(CUdevice *d, int i) {
    if (i != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
static CUresult e_DeviceGetAttribute(int *v, int attr, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) { /* an H100 SXM's numbers, compute capability 9.0 */
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 48 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 * 1024 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 * 1024; break;
    default: return fail(CUDA_ERROR_INVALID_VALUE, "attribute not emulated");
    }
    return CUDA_SUCCESS;
}
static CUresult e_DeviceGetName(char *name, int len, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", "Kiln emulated device");
    return CUDA_SUCCESS;
}
static CUresult e_DeviceTotalMem(size_t *b, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    init_capacity();
    *b = capacity;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult e_DevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *c = &the_ctx;
    return CUDA_SUCCESS;
}
static CUresult e_CtxSetCurrent(CUcontext c) { return c == &the_ctx || !c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

/* ---- Memory --------------------------------------------------------------- */

static CUresult e_MemAlloc(CUdeviceptr *p, size_t n) {
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t r = (n + EMU_ALIGN - 1) / EMU_ALIGN * EMU_ALIGN;
    pthread_mutex_lock(&mu);
    init_capacity();
    if (r < n || r > capacity - (used < capacity ? used : capacity) || used >= capacity) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (nallocs == cap_allocs) {
        int nc = cap_allocs ? 2 * cap_allocs : 64;
        emu_alloc *na = realloc(allocs, (size_t)nc * sizeof *na);
        if (!na) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        allocs = na;
        cap_allocs = nc;
    }
    void *m = aligned_alloc(EMU_ALIGN, r);
    if (!m) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    allocs[nallocs++] = (emu_alloc){(uintptr_t)m, n};
    used += r;
    pthread_mutex_unlock(&mu);
    memset(m, 0xA5, n);
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static CUresult e_MemFree(CUdeviceptr p) {
    pthread_mutex_lock(&mu);
    int i;
    for (i = 0; i < nallocs && allocs[i].base != p; i++) {}
    if (i == nallocs) {
        pthread_mutex_unlock(&mu);
        return fail(CUDA_ERROR_INVALID_VALUE, "not the start of a live allocation");
    }
    size_t n = allocs[i].size;
    allocs[i] = allocs[--nallocs];
    used -= (n + EMU_ALIGN - 1) / EMU_ALIGN * EMU_ALIGN;
    pthread_mutex_unlock(&mu);
    memset((void *)(uintptr_t)p, 0xDD, n);
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}

static CUresult e_MemGetInfo(size_t *f, size_t *t) {
    pthread_mutex_lock(&mu);
    init_capacity();
    *t = capacity;
    *f = used < capacity ? capacity - used : 0;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult e_MemcpyHtoD(CUdeviceptr d, const void *s, size_t n) {
    if (n && !s) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_range(d, n);
    if (r == CUDA_SUCCESS && n) memcpy((void *)(uintptr_t)d, s, n);
    return r;
}
static CUresult e_MemcpyDtoH(void *d, CUdeviceptr s, size_t n) {
    if (n && !d) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_range(s, n);
    if (r == CUDA_SUCCESS && n) memcpy(d, (const void *)(uintptr_t)s, n);
    return r;
}
static CUresult e_MemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) {
    CUresult r = check_range(d, n);
    if (r == CUDA_SUCCESS) r = check_range(s, n);
    if (r == CUDA_SUCCESS && n) memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
    return r;
}
static CUresult e_MemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    CUresult r = check_stream(st);
    return r ? r : e_MemcpyHtoD(d, s, n);
}
static CUresult e_MemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) {
    CUresult r = check_stream(st);
    return r ? r : e_MemcpyDtoH(d, s, n);
}
static CUresult e_MemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    CUresult r = check_stream(st);
    return r ? r : e_MemcpyDtoD(d, s, n);
}
static CUresult e_MemsetD8(CUdeviceptr d, unsigned char v, size_t n) {
    CUresult r = check_range(d, n);
    if (r == CUDA_SUCCESS && n) memset((void *)(uintptr_t)d, v, n);
    return r;
}
static CUresult e_MemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
    CUresult r = check_stream(st);
    return r ? r : e_MemsetD8(d, v, n);
}
/* Pinned memory is ordinary host memory here. */
static CUresult e_MemHostAlloc(void **p, size_t n, unsigned flags) {
    if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
    *p = aligned_alloc(EMU_ALIGN, (n + EMU_ALIGN - 1) / EMU_ALIGN * EMU_ALIGN);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult e_MemFreeHost(void *p) {
    free(p);
    return CUDA_SUCCESS;
}

/* ---- Streams and events ------------------------------------------------------ */

static void complete_event(struct CUevent_st *e) {
    e->complete = 1;
    e->on = NULL;
    e->t_ms = now_ms();
}

/* Completes every event waiting for s (lock held). */
static void release_stream(struct CUstream_st *s) {
    for (int i = 0; i < s->npending; i++) complete_event(s->pending[i]);
    s->npending = 0;
    s->held = 0;
}

void ku_emu_hold_stream(CUstream s, int hold) {
    if (!s || s->magic != STREAM_MAGIC) return;
    pthread_mutex_lock(&mu);
    if (hold)
        s->held = 1;
    else
        release_stream(s);
    pthread_mutex_unlock(&mu);
}

static CUresult e_StreamCreate(CUstream *s, unsigned flags) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->magic = STREAM_MAGIC;
    *s = n;
    return CUDA_SUCCESS;
}
static CUresult e_StreamDestroy(CUstream s) {
    if (!s || s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    release_stream(s); /* as on a GPU: queued work still completes */
    s->magic = 0;
    pthread_mutex_unlock(&mu);
    free(s->pending);
    free(s);
    return CUDA_SUCCESS;
}
static CUresult e_StreamSynchronize(CUstream s) {
    CUresult r = check_stream(s);
    if (r || !s) return r;
    ku_emu_hold_stream(s, 0);
    return CUDA_SUCCESS;
}
static CUresult e_StreamQuery(CUstream s) {
    CUresult r = check_stream(s);
    if (r || !s) return r;
    pthread_mutex_lock(&mu);
    int held = s->held;
    pthread_mutex_unlock(&mu);
    return held ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult e_StreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    CUresult r = check_stream(s);
    if (r) return r;
    return e && e->magic == EVENT_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
static CUresult e_EventCreate(CUevent *e, unsigned flags) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *n = calloc(1, sizeof *n);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->magic = EVENT_MAGIC;
    n->flags = flags;
    *e = n;
    return CUDA_SUCCESS;
}
/* Removes e from the held stream it waits on (lock held). */
static void unlink_event(struct CUevent_st *e) {
    struct CUstream_st *s = e->on;
    if (!s) return;
    for (int i = 0; i < s->npending; i++)
        if (s->pending[i] == e) {
            s->pending[i] = s->pending[--s->npending];
            break;
        }
    e->on = NULL;
}
static CUresult e_EventRecord(CUevent e, CUstream s) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = check_stream(s);
    if (r) return r;
    pthread_mutex_lock(&mu);
    unlink_event(e);
    e->recorded = 1;
    if (s && s->held) {
        if (s->npending == s->cap) {
            int nc = s->cap ? 2 * s->cap : 8;
            struct CUevent_st **np = realloc(s->pending, (size_t)nc * sizeof *np);
            if (!np) {
                pthread_mutex_unlock(&mu);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            s->pending = np;
            s->cap = nc;
        }
        s->pending[s->npending++] = e;
        e->on = s;
        e->complete = 0;
    } else {
        complete_event(e);
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult e_EventQuery(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    int done = !e->recorded || e->complete;
    pthread_mutex_unlock(&mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
/* Waiting for an event runs the held work it waits for (nothing else would). */
static CUresult e_EventSynchronize(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    if (e->on) release_stream(e->on);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
static CUresult e_EventElapsedTime(float *ms, CUevent a, CUevent b) {
    if (!ms || !a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    int ready = a->recorded && b->recorded && a->complete && b->complete;
    double d = b->t_ms - a->t_ms;
    pthread_mutex_unlock(&mu);
    if (!ready) return CUDA_ERROR_NOT_READY;
    *ms = (float)d;
    return CUDA_SUCCESS;
}
static CUresult e_EventDestroy(CUevent e) {
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mu);
    unlink_event(e);
    e->magic = 0;
    pthread_mutex_unlock(&mu);
    free(e);
    return CUDA_SUCCESS;
}
/* Every stream runs at once except held ones: the context waits for those. */
static CUresult e_CtxSynchronize(void) { return CUDA_SUCCESS; }

/* ---- Modules and launches: cuda_emu_module.c ----------------------------------- */

static CUresult e_ModuleLoadData(CUmodule *m, const void *image) { return ku_emu_module_load(m, image); }
static CUresult e_ModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    return ku_emu_module_get_function(f, m, name);
}
static CUresult e_ModuleUnload(CUmodule m) { return ku_emu_module_unload(m); }
static CUresult e_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    return ku_emu_launch(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

/* ---- Errors ----------------------------------------------------------------- */

#define EMU_ERRORS(X)                                                          \
    X(CUDA_SUCCESS, "no error")                                                \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                            \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                               \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                      \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")              \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                     \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")              \
    X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found") \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                    \
    X(CUDA_ERROR_INVALID_SOURCE, "device kernel source is invalid")            \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                    \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                          \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                  \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                     \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

static CUresult e_GetErrorName(CUresult r, const char **name) {
    switch (r) {
#define EMU_NAME_(code, text) \
    case code:                \
        *name = #code;        \
        return CUDA_SUCCESS;
        EMU_ERRORS(EMU_NAME_)
#undef EMU_NAME_
    }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* The generic text, then what the failing call of this thread added. */
static CUresult e_GetErrorString(CUresult r, const char **str) {
    static _Thread_local char buf[1200];
    const char *base = NULL;
    switch (r) {
#define EMU_TEXT_(code, text) \
    case code:                \
        base = text;          \
        break;
        EMU_ERRORS(EMU_TEXT_)
#undef EMU_TEXT_
    }
    if (!base) {
        *str = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (tl_has_detail && tl_detail_code == r) {
        snprintf(buf, sizeof buf, "%s (emulated device: %s)", base, tl_detail);
        tl_has_detail = 0;
        *str = buf;
    } else {
        *str = base;
    }
    return CUDA_SUCCESS;
}

static const ku_driver emu = {
#define EMU_FIELD_(name, sym, params) .name = e_##name,
    KU_DRIVER_FUNCS(EMU_FIELD_)
#undef EMU_FIELD_
    .emulated = 1,
};

const ku_driver *ku_emu_driver(void) { return &emu; }

/* ---- For the emulated cuBLAS (cublas_emu.c) -------------------------------- */

int ku_emu_range_ok(CUdeviceptr p, size_t n) {
    pthread_mutex_lock(&mu);
    int i = find_range(p, n);
    pthread_mutex_unlock(&mu);
    return i >= 0;
}

