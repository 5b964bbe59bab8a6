/*
 * cn_backend.c — the "nvrtc" kernel backend for KL_CUDA (kernel.h): compile
 * generates the kernel's CUDA C and launch configuration (cn_emit.c); the
 * source is what KL_DEBUG_DIR-style dumps and the tests read.
 *
 * Not here yet: turning the source into a module and launching it. That
 * goes through the module API of the emulator work (ku_module_get,
 * ku_module_function, ku_launch: docs/GPU.md), which this branch does not
 * have; until it is wired in, run fails with KL_ERR_UNSUPPORTED saying so.
 * No kernel reaches this backend today either: lowering fuses CPU nodes only.
 */
#include "cn.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct cn_handle {
    cn_kernel_src src;
    const ir_kernel *k;
} cn_handle;

static void *cn_compile(const ir_kernel *k) {
    static atomic_int seq;
    cn_handle *h = calloc(1, sizeof *h);
    if (!h) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    char name[32];
    snprintf(name, sizeof name, "kl_kernel_%d", atomic_fetch_add(&seq, 1));
    if (cn_emit_kernel(k, name, &h->src)) {
        free(h);
        return NULL;
    }
    h->k = k;
    return h;
}

static int cn_run(void *handle, kl_tensor *const *in, kl_tensor *const *out) {
    cn_handle *h = handle;
    (void)in, (void)out;
    return ke_err(KL_ERR_UNSUPPORTED, "compile",
                  "nvrtc backend: launching %s needs the CUDA module API (ku_module_get / ku_launch), not in this build yet",
                  h->src.name);
}

static void cn_free(void *handle) {
    cn_handle *h = handle;
    if (!h) return;
    cn_kernel_src_free(&h->src);
    free(h);
}

const ir_backend cn_nvrtc_backend = {
    .name = "nvrtc",
    .device = KL_CUDA,
    .priority = 10,
    .compile = cn_compile,
    .run = cn_run,
    .free = cn_free,
};
