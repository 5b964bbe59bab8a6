/*
 * cublas.c — cuBLAS found at run time (dlopen of libcublas.so.13, .12, then
 * the unversioned name), loaded at first use only: the library is ~500 MB
 * and loading it costs 50-230 ms. This slice loads it and reads its version;
 * matmul through it comes with CUDA tensors (issue 13).
 */
#include "cuda_api.h"

#include "core.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

typedef int cublasStatus_t;
enum { KU_CUBLAS_MAJOR = 0, KU_CUBLAS_MINOR = 1, KU_CUBLAS_PATCH = 2 }; /* libraryPropertyType */

/* X(name, params): entry points by their exported (_v2 where cublas_api.h
 * maps to one) names. */
#define KU_CUBLAS_FUNCS(X)                                                            \
    X(cublasGetProperty, "cublasGetProperty", (int type, int *value))                 \
    X(cublasCreate, "cublasCreate_v2", (cublasHandle_t * h))                          \
    X(cublasDestroy, "cublasDestroy_v2", (cublasHandle_t h))                          \
    X(cublasSetStream, "cublasSetStream_v2", (cublasHandle_t h, CUstream s))          \
    X(cublasSetMathMode, "cublasSetMathMode", (cublasHandle_t h, int mode))

static struct {
#define KU_CB_FIELD_(name, sym, params) cublasStatus_t(*name) params;
    KU_CUBLAS_FUNCS(KU_CB_FIELD_)
#undef KU_CB_FIELD_
} cb;

static int cb_ok;
static char cb_reason[512];
static pthread_once_t cb_once = PTHREAD_ONCE_INIT;

static void cb_load(void) {
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *h = ku_dlopen_first("cuBLAS", names, sizeof names / sizeof *names, cb_reason, sizeof cb_reason);
    if (!h) return;
#define KU_CB_LOAD_(name, sym, params) \
    if (ku_dlsym_into(h, "cuBLAS", sym, (void **)&cb.name, cb_reason, sizeof cb_reason)) return;
    KU_CUBLAS_FUNCS(KU_CB_LOAD_)
#undef KU_CB_LOAD_
    cb_ok = 1;
}

int ku_cublas_available(const char *op) {
    pthread_once(&cb_once, cb_load);
    if (!cb_ok) ke_err(KL_ERR_UNSUPPORTED, op, "%s", cb_reason);
    return cb_ok;
}

int ku_cublas_version(void) {
    pthread_once(&cb_once, cb_load);
    int ma = 0, mi = 0, pa = 0;
    if (!cb_ok || cb.cublasGetProperty(KU_CUBLAS_MAJOR, &ma) || cb.cublasGetProperty(KU_CUBLAS_MINOR, &mi) ||
        cb.cublasGetProperty(KU_CUBLAS_PATCH, &pa))
        return -1;
    return ma * 10000 + mi * 100 + pa;
}
