/*
 * cn_backend.c — the "nvrtc" kernel backend for KL_CUDA (kernel.h): compile
 * generates the kernel's CUDA C and launch configuration (cn_emit.c) and
 * loads it as a module on the kernel's device (ku_module_get: NVRTC -> CUBIN
 * on a GPU, the host compiler on the emulated device), so a source that does
 * not compile fails at kl_compile; run launches it on the calling thread's
 * current stream (ku_launch).
 *
 * kl_compile hands a graph's CUDA kernels over together (compile_group): they
 * become one program, kl_kernel0..N-1, one NVRTC compile and one module. A
 * kernel compiled alone (dynamic shapes) is "kl_kernel" in a program of its
 * own: equal kernels give equal sources, so they share one module.
 *
 * Scalars: a kernel input may be a 0-dim CPU tensor (an IR_OP_SCALAR node, a
 * wrapped C scalar, a 0-dim CPU tensor joining a CUDA op); the generated code
 * reads every buffer through a device pointer, so run copies those values
 * into a small device block first. The same block holds the status word the
 * kernel's formulas report errors in (integer % 0); it is read back, which
 * waits for the kernel, only when the kernel has an op that can raise one.
 */
#include "cn.h"

#include "cuda_api.h"
#include "ew.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CN_NAME "kl_kernel"
/* The scratch block: the status word, then one 16-byte cell per scalar input. */
#define CN_CELL 16

typedef struct cn_handle {
    cn_kernel_src src;
    const ir_kernel *k;
    CUfunction fn;
    int dev;
    int err_stmt;   /* the first statement that can raise an error (integer remainder/fmod), -1: none */
} cn_handle;

/* Statements whose device function can set the error word: the integer
 * loops of remainder and fmod (x % 0), as on the CPU. */
static int first_err_stmt(const ir_kernel *k) {
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_OP && (st->op == KE_OP_remainder || st->op == KE_OP_fmod) &&
            !ke_is_float((kl_dtype)st->compute))
            return s;
    }
    return -1;
}

static void cn_free(void *handle) {
    cn_handle *h = handle;
    if (!h) return;
    cn_kernel_src_free(&h->src);
    free(h);
}

/* KL_DEBUG_DIR: each compiled kernel's CUDA C as cuda_kernel<N>.cu, its IR
 * ops and launch configuration on the first lines, for reading and for
 * compiling by hand (nvcc -cubin -arch=sm_90 --fmad=false). */
static void dump_source(const ir_kernel *k, const cn_kernel_src *src) {
    static _Atomic int seq;
    const char *dir = getenv("KL_DEBUG_DIR");
    if (!dir || !*dir) return;
    mkdir(dir, 0777);
    char path[1024];
    snprintf(path, sizeof path, "%s/cuda_kernel%03d.cu", dir, atomic_fetch_add(&seq, 1));
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "// kernel of %s; grid %u, block %u, shared %u bytes\n", k->ops ? k->ops : "?", src->launch.grid[0],
            src->launch.block[0], src->launch.shmem);
    fputs(src->src, f);
    fclose(f);
}

static void *cn_compile(const ir_kernel *k) {
    const char *op = "compile";
    cn_handle *h = calloc(1, sizeof *h);
    if (!h) {
        ke_err(KL_ERR_OOM, op, "out of memory");
        return NULL;
    }
    h->k = k;
    h->dev = k->device.index;
    h->err_stmt = first_err_stmt(k);
    ku_module *m;
    if (cn_emit_kernel(k, CN_NAME, &h->src)) {
        cn_free(h);
        return NULL;
    }
    dump_source(k, &h->src);
    if (ku_module_get(op, h->src.src, h->dev, &m) ||
        ku_module_function(op, m, CN_NAME, &h->fn)) {
        cn_free(h);
        return NULL;
    }
    return h;
}

/* All kernels of one graph on one device as ONE program (entry points
 * kl_kernel0, kl_kernel1, ...): NVRTC's fixed cost per program (~50 ms of
 * the ~85 ms a kernel took on an H200) is paid once per graph, and the
 * program is one module, one disk-cache entry (keyed by the whole source).
 * Equal kernels of two graphs no longer share a module (each graph's program
 * is its own). */
static int cn_compile_group(ir_kernel *const *ks, int n, void **handles) {
    const char *op = "compile";
    if (n < 1) return 0;
    const ir_kernel **kk = calloc((size_t)n, sizeof *kk);
    char (*names)[24] = calloc((size_t)n, sizeof *names);
    const char **np = calloc((size_t)n, sizeof *np);
    cn_handle **hs = calloc((size_t)n, sizeof *hs);
    char *src = NULL;
    int rc = !kk || !names || !np || !hs ? ke_err(KL_ERR_OOM, op, "out of memory") : 0;
    for (int i = 0; i < n && !rc; i++) {
        kk[i] = ks[i];
        snprintf(names[i], sizeof names[i], CN_NAME "%d", i);
        np[i] = names[i];
        if (!(hs[i] = calloc(1, sizeof **hs))) rc = ke_err(KL_ERR_OOM, op, "out of memory");
        else {
            hs[i]->k = ks[i];
            hs[i]->dev = ks[i]->device.index;
            hs[i]->err_stmt = first_err_stmt(ks[i]);
            cn_launch_of(ks[i], &hs[i]->src.launch);
            strcpy(hs[i]->src.name, names[i]);
            if (hs[i]->dev != hs[0]->dev) rc = ke_err(KL_ERR_INTERNAL, op, "nvrtc backend: a group spans two devices");
        }
    }
    if (!rc) rc = cn_emit_program(kk, np, n, &src);
    ku_module *m = NULL;
    if (!rc) {
        cn_kernel_src whole = {.src = src};
        dump_source(ks[0], &whole);
        rc = ku_module_get(op, src, hs[0]->dev, &m);
    }
    for (int i = 0; i < n && !rc; i++) rc = ku_module_function(op, m, names[i], &hs[i]->fn);
    for (int i = 0; i < n && hs; i++) {
        if (rc) cn_free(hs[i]);
        else handles[i] = hs[i];
    }
    free(src);
    free(kk);
    free(names);
    free(np);
    free(hs);
    return rc ? -1 : 0;
}

static int run_as(void *handle, const char *op, kl_tensor *const *in, kl_tensor *const *out) {
    cn_handle *h = handle;
    const ir_kernel *k = h->k;
    const int nb = k->ninputs + k->noutputs;
    void *ptrs[IR_KERNEL_MAX_IN + KE_MAX_OUT + 1], *args[IR_KERNEL_MAX_IN + KE_MAX_OUT + 2];
    int scalar_of[IR_KERNEL_MAX_IN], nscalars = 0;
    for (int b = 0; b < nb; b++) {
        kl_tensor *t = b < k->ninputs ? in[b] : out[b - k->ninputs];
        kl_device d = t->storage->device;
        int host_scalar = b < k->ninputs && d.type == KL_CPU && t->ndim == 0;
        if (t->dtype != k->bufs[b].dtype || t->ndim != k->bufs[b].ndim ||
            memcmp(t->shape, k->bufs[b].shape, sizeof(int64_t) * t->ndim) ||
            (!host_scalar && (d.type != KL_CUDA || d.index != h->dev)))
            return ke_err(KL_ERR_INTERNAL, op, "nvrtc backend: buffer %d (%s on %s) does not match the kernel", b,
                          ke_dtypes[t->dtype].name, ke_device_name(d));
        if (b < k->ninputs) scalar_of[b] = host_scalar ? nscalars++ : -1;
        ptrs[b] = ke_data(t);
    }
    if (ku_device_enter(op, h->dev)) return -1;
    const ku_driver *d = ku_driver_get(op);
    if (!d) return -1;
    CUstream s = ku_current_stream(h->dev);
    CUdeviceptr scratch = 0;
    if (nscalars || h->err_stmt >= 0) {
        /* status word (zeroed) and the scalars, one copy up */
        unsigned char host[CN_CELL * (IR_KERNEL_MAX_IN + 1)];
        size_t bytes = (size_t)CN_CELL * (size_t)(nscalars + 1);
        memset(host, 0, bytes);
        for (int b = 0; b < k->ninputs; b++)
            if (scalar_of[b] >= 0) memcpy(host + CN_CELL * (scalar_of[b] + 1), ke_data(in[b]), ke_dtypes[in[b]->dtype].size);
        if (!(scratch = ku_malloc(op, h->dev, bytes, s))) return -1;
        if (KU_CALL(op, d, MemcpyHtoDAsync, scratch, host, bytes, s) || KU_CALL(op, d, StreamSynchronize, s)) {
            ku_free(op, scratch);
            return -1;
        }
        for (int b = 0; b < k->ninputs; b++)
            if (scalar_of[b] >= 0) ptrs[b] = (void *)(uintptr_t)(scratch + CN_CELL * (CUdeviceptr)(scalar_of[b] + 1));
    }
    ptrs[nb] = h->err_stmt >= 0 ? (void *)(uintptr_t)scratch : NULL;
    for (int b = 0; b <= nb; b++) args[b] = &ptrs[b];
    int rc = ku_launch(op, h->fn, h->src.launch.grid, h->src.launch.block, h->src.launch.shmem, s, args);
    if (!rc && h->err_stmt >= 0) {
        int status = 0;
        rc = KU_CALL(op, d, MemcpyDtoHAsync, &status, scratch, sizeof status, s) || KU_CALL(op, d, StreamSynchronize, s);
        if (!rc && status == KE_EW_INT_DIV_ZERO)
            rc = ke_err(KL_ERR_ARG, ke_ops[k->stmts[h->err_stmt].op].name, "integer division by zero");
        else if (!rc && status)
            rc = ke_err(KL_ERR_INTERNAL, ke_ops[k->stmts[h->err_stmt].op].name, "elementwise loop failed");
    }
    /* stream-ordered: the block is reused only by work queued after the kernel */
    if (scratch) ku_free(op, scratch);
    return rc ? -1 : 0;
}

static int cn_run(void *handle, kl_tensor *const *in, kl_tensor *const *out) {
    return run_as(handle, "fn_call", in, out);
}

const ir_backend cn_nvrtc_backend = {
    .name = "nvrtc",
    .device = KL_CUDA,
    .priority = 10,
    .compile = cn_compile,
    .run = cn_run,
    .free = cn_free,
    .compile_group = cn_compile_group,
};
