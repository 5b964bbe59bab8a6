/*
 * cublas.c — cuBLAS found at run time (dlopen of libcublas.so.13, .12, then
 * the unversioned name), loaded at first use only: the library is ~500 MB
 * and loading it costs 50-230 ms. On the emulated device (KL_CUDA_EMULATE=1)
 * the same table is filled by cublas_emu.c instead, and libcublas is never
 * loaded.
 *
 * Handles: one per device, created at its first GEMM and kept for the
 * process, guarded by a mutex per device held from cublasSetStream to the
 * GEMM's return. A cuBLAS call only enqueues work, so the lock is held for
 * microseconds; PyTorch keeps a pool of handles per thread instead, which
 * avoids even that: worth it once many host threads issue GEMMs at once.
 * The handle is bound to the caller's stream and the current TF32 setting at
 * every call.
 */
#include "ku_cublas.h"

#include "core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

static ku_cublas_table cb;
static const ku_cublas_table *cb_table;
static char cb_reason[512];
static pthread_once_t cb_once = PTHREAD_ONCE_INIT;

static void cb_load(void) {
    /* The emulated driver goes with the emulated cuBLAS: a real cuBLAS
     * cannot read the emulator's host "device" memory. */
    if (kl_cuda_is_available() && ku_driver_get("cuBLAS")->emulated) {
        cb_table = ku_cublas_emu_table();
        return;
    }
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *h = ku_dlopen_first("cuBLAS", names, sizeof names / sizeof *names, cb_reason, sizeof cb_reason);
    if (!h) return;
#define KU_CB_LOAD_(name, sym, params) \
    if (ku_dlsym_into(h, "cuBLAS", sym, (void **)&cb.name, cb_reason, sizeof cb_reason)) return;
    KU_CUBLAS_FUNCS(KU_CB_LOAD_)
#undef KU_CB_LOAD_
    *(void **)&cb.GetStatusName = dlsym(h, "cublasGetStatusName");
    *(void **)&cb.GetStatusString = dlsym(h, "cublasGetStatusString");
    cb_table = &cb;
}

const ku_cublas_table *ku_cublas_get(const char *op) {
    pthread_once(&cb_once, cb_load);
    if (!cb_table) ke_err(KL_ERR_UNSUPPORTED, op, "%s", cb_reason);
    return cb_table;
}

int ku_cublas_available(const char *op) { return ku_cublas_get(op) != NULL; }

int ku_cublas_version(void) {
    pthread_once(&cb_once, cb_load);
    const ku_cublas_table *t = cb_table;
    int ma = 0, mi = 0, pa = 0;
    if (!t || t->GetProperty(KU_CUBLAS_MAJOR, &ma) || t->GetProperty(KU_CUBLAS_MINOR, &mi) ||
        t->GetProperty(KU_CUBLAS_PATCH, &pa))
        return -1;
    return ma * 10000 + mi * 100 + pa;
}

/* ---- Status codes ------------------------------------------------------ */

const char *ku_cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_<unknown>";
    }
}

int ku_cublas_check(const char *op, const char *call, cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    const ku_cublas_table *t = cb_table;
    const char *name = t && t->GetStatusName ? t->GetStatusName(s) : ku_cublas_status_name(s);
    const char *text = t && t->GetStatusString ? t->GetStatusString(s) : "";
    return ke_err(s == CUBLAS_STATUS_ALLOC_FAILED ? KL_ERR_OOM : KL_ERR_DEVICE, op, "%s failed: %s%s%s", call,
                  name ? name : "?", text && text[0] ? ": " : "", text ? text : "");
}

/* ---- TF32 switch --------------------------------------------------------- */

static atomic_bool allow_tf32; /* off, as PyTorch since 1.12 */

void kl_cuda_set_allow_tf32(bool on) { atomic_store(&allow_tf32, on); }
bool kl_cuda_get_allow_tf32(void) { return atomic_load(&allow_tf32); }

/* TF32 off: CUBLAS_DEFAULT_MATH (what PyTorch uses), not PEDANTIC: the
 * default mode already keeps f32 GEMMs in f32 arithmetic since CUDA 11, and
 * PEDANTIC would also bar the tensor cores from the f16/bf16 GEMMs. Either
 * way reductions stay in the f32 accumulator (DISALLOW_REDUCED_PRECISION_
 * REDUCTION): the emulated cuBLAS accumulates in f32, and a split-K sum
 * rounded to f16 between steps would be a second, silent loss. */
static int math_mode(void) {
    return (atomic_load(&allow_tf32) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
           CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
}

/* ---- Handles --------------------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    cublasHandle_t h;
    int mode; /* its math mode, -1 before the first set */
} handles[KU_MAX_DEVICES];
static pthread_once_t handles_once = PTHREAD_ONCE_INIT;

static void handles_init(void) {
    for (int i = 0; i < KU_MAX_DEVICES; i++) {
        pthread_mutex_init(&handles[i].mu, NULL);
        handles[i].mode = -1;
    }
}

cublasHandle_t ku_cublas_acquire(const char *op, int dev, CUstream stream, const ku_cublas_table **table) {
    /* The device first: without one, loading libcublas would cost 50-230 ms for nothing. */
    if (ku_device_enter(op, dev)) return NULL;
    const ku_cublas_table *t = ku_cublas_get(op);
    if (!t) return NULL;
    pthread_once(&handles_once, handles_init);
    pthread_mutex_lock(&handles[dev].mu);
    if (!handles[dev].h) {
        cublasHandle_t h = NULL;
        if (ku_cublas_check(op, "cublasCreate_v2", t->Create(&h))) goto fail;
        handles[dev].h = h;
        handles[dev].mode = -1;
    }
    /* Every time, as PyTorch does: a stream destroyed and another created at
     * the same address would fool a cached comparison. */
    if (ku_cublas_check(op, "cublasSetStream_v2", t->SetStream(handles[dev].h, stream))) goto fail;
    int mode = math_mode();
    if (handles[dev].mode != mode) {
        if (ku_cublas_check(op, "cublasSetMathMode", t->SetMathMode(handles[dev].h, mode))) goto fail;
        handles[dev].mode = mode;
    }
    *table = t;
    return handles[dev].h;
fail:
    pthread_mutex_unlock(&handles[dev].mu);
    return NULL;
}

void ku_cublas_release(int dev) { pthread_mutex_unlock(&handles[dev].mu); }
