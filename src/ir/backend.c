/*
 * backend.c — the backend registry and the compiled state of a kernel
 * (kernel.h). The IR layer names no backend: backends register here from
 * the composition root (src/init.c), one table for every device, so a
 * second code generator or device adds a row, not a branch in src/ir.
 */
#include "kernel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static const ir_backend *registry[IR_MAX_BACKENDS];
static _Atomic int nregistered; /* entries [0, n) are set before n is published */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int64_t compiles;

int ir_backend_register(const ir_backend *b) {
    if (!b || !b->name || !b->compile || !b->run || !b->free)
        return ke_err(KL_ERR_ARG, "backend_register", "a backend needs a name, compile, run and free");
    int rc = 0;
    pthread_mutex_lock(&registry_lock);
    int n = atomic_load(&nregistered), i = 0;
    while (i < n && registry[i] != b && strcmp(registry[i]->name, b->name)) i++;
    if (i < n && registry[i] != b)
        rc = ke_err(KL_ERR_ARG, "backend_register", "a backend called \"%s\" is already registered", b->name);
    else if (i == n && n == IR_MAX_BACKENDS)
        rc = ke_err(KL_ERR_STATE, "backend_register", "more than %d backends", IR_MAX_BACKENDS);
    else if (i == n) {
        registry[n] = b;
        atomic_store(&nregistered, n + 1);
    }
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

const ir_backend *ir_backend_by_name(const char *name) {
    int n = atomic_load(&nregistered);
    for (int i = 0; name && i < n; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    char have[256] = "";
    for (int i = 0, at = 0; i < n && at < (int)sizeof have; i++)
        at += snprintf(have + at, sizeof have - (size_t)at, "%s%s", i ? ", " : "", registry[i]->name);
    ke_err(KL_ERR_ARG, "compile", "unknown or unavailable backend \"%s\" (registered: %s)", name ? name : "(null)",
           n ? have : "none");
    return NULL;
}

const ir_backend *ir_backend_for_device(kl_device_type t) {
    int n = atomic_load(&nregistered);
    const ir_backend *best = NULL;
    for (int i = 0; i < n; i++)
        if (registry[i]->device == t && (!best || registry[i]->priority > best->priority)) best = registry[i];
    if (!best) ke_err(KL_ERR_UNSUPPORTED, "compile", "no kernel backend registered for %s", ke_device_name((kl_device){.type = t}));
    return best;
}

/* ---- a kernel's compiled form ------------------------------------------------------ */

int ir_kernel_compile(ir_kernel *k, const ir_backend *b) {
    if (k->handle && k->backend == b) return 0;
    if (k->handle && atomic_load(&k->refs) > 1)
        return ke_err(KL_ERR_STATE, "compile", "a kernel shared by copies of a graph is already compiled by %s",
                      k->backend->name);
    if (k->handle) k->backend->free(k->handle);
    k->handle = NULL;
    k->backend = b;
    atomic_fetch_add(&compiles, 1);
    void *h = b->compile(k);
    atomic_store_explicit(&k->handle, h, memory_order_release); /* after backend: see ir_kernel_run */
    return h ? 0 : -1;
}

int ir_kernels_compile(ir_kernel *const *ks, int n, const ir_backend *b) {
    if (!b->compile_group) {
        for (int i = 0; i < n; i++)
            if (ir_kernel_compile(ks[i], b)) return -1;
        return 0;
    }
    ir_kernel **pending = malloc(sizeof *pending * (size_t)(n > 0 ? n : 1));
    void **handles = malloc(sizeof *handles * (size_t)(n > 0 ? n : 1));
    if (!pending || !handles) {
        free(pending);
        free(handles);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    int m = 0, rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        ir_kernel *k = ks[i];
        if (k->handle && k->backend == b) continue;
        int dup = 0; /* a kernel listed twice is compiled once */
        for (int j = 0; j < m; j++) dup |= pending[j] == k;
        if (dup) continue;
        if (k->handle && atomic_load(&k->refs) > 1)
            rc = ke_err(KL_ERR_STATE, "compile", "a kernel shared by copies of a graph is already compiled by %s",
                        k->backend->name);
        pending[m++] = k;
    }
    if (!rc && m == 1) rc = ir_kernel_compile(pending[0], b);
    else if (!rc && m > 1) {
        for (int i = 0; i < m; i++) {
            if (pending[i]->handle) pending[i]->backend->free(pending[i]->handle);
            pending[i]->handle = NULL;
            pending[i]->backend = b;
            handles[i] = NULL;
        }
        atomic_fetch_add(&compiles, m);
        rc = b->compile_group(pending, m, handles);
        for (int i = 0; i < m && !rc; i++) pending[i]->handle = handles[i];
    }
    free(pending);
    free(handles);
    return rc ? -1 : 0;
}

int64_t ir_kernel_compiles(void) { return atomic_load(&compiles); }

static _Thread_local double llvm_ms;
void ir_backend_add_llvm_ms(double ms) { llvm_ms += ms; }
double ir_backend_llvm_ms(void) { return llvm_ms; }

static _Thread_local int64_t interim_runs;
int64_t ir_kernel_interim_runs(void) { return interim_runs; }

int ir_kernel_run(const ir_kernel *k, kl_tensor *const *in, kl_tensor *const *out) {
    /* acquire: pairs with the compile's store of handle, made after backend's */
    void *h = atomic_load_explicit(&k->handle, memory_order_acquire);
    if (h) return k->backend->run(h, in, out);
    if (!k->interim) return ke_err(KL_ERR_INTERNAL, "fn_call", "kernel run before it was compiled");
    interim_runs++;
    return ir_interp_backend.run(k->interim, in, out);
}

int ir_kernel_interpret_meanwhile(ir_kernel *k, const ir_backend *b) {
    if (atomic_load(&k->handle)) return 0;
    void *h = b->load ? b->load(k) : NULL;
    if (h) { /* loaded already or in the disk cache: no compile to wait for */
        k->backend = b;
        atomic_fetch_add(&compiles, 1);
        atomic_store_explicit(&k->handle, h, memory_order_release);
        return 0;
    }
    if (!k->interim && !(k->interim = ir_interp_backend.compile(k))) return -1;
    return 1;
}

ir_kernel *ir_kernel_ref(ir_kernel *k) {
    atomic_fetch_add(&k->refs, 1);
    return k;
}

ir_kernel *ir_kernel_copy(const ir_kernel *k) {
    ir_kernel *c = calloc(1, sizeof *c);
    int nb = k->ninputs + k->noutputs;
    if (c) {
        memcpy(c, k, sizeof *c);
        atomic_store(&c->refs, 1);
        c->backend = NULL;
        c->handle = NULL;
        c->interim = NULL;
        c->bufs = malloc(sizeof *c->bufs * (size_t)(nb ? nb : 1));
        c->stmts = malloc(sizeof *c->stmts * (size_t)(k->nstmts ? k->nstmts : 1));
        c->ops = k->ops ? strdup(k->ops) : NULL;
    }
    if (!c || !c->bufs || !c->stmts || (k->ops && !c->ops)) {
        if (c) free(c->bufs), free(c->stmts), free(c->ops);
        free(c);
        ke_err(KL_ERR_OOM, "compile", "out of memory copying a kernel");
        return NULL;
    }
    memcpy(c->bufs, k->bufs, sizeof *c->bufs * (size_t)nb);
    memcpy(c->stmts, k->stmts, sizeof *c->stmts * (size_t)k->nstmts);
    return c;
}

void ir_kernel_free(ir_kernel *k) {
    if (!k || atomic_fetch_sub(&k->refs, 1) > 1) return;
    if (k->handle) k->backend->free(k->handle);
    if (k->interim) ir_interp_backend.free(k->interim);
    free(k->bufs);
    free(k->stmts);
    free(k->ops);
    free(k);
}
