/*
 * dispatch.c — the dispatcher: key sets, per-key handlers, redispatch, and the
 * generic backend step (shape rule -> allocation -> kernel) that every
 * backend shares. Also the small helpers the public wrappers use.
 */
#include "dispatch.h"
#include "log.h"
#include "profiler.h"

#include <stddef.h>
#include <stdlib.h>

static int backend_handler(ke_call *c);

static ke_handler_fn handlers[KE_NUM_KEYS] = {
    [KE_KEY_CPU] = backend_handler,
    [KE_KEY_CUDA] = backend_handler,
    [KE_KEY_META] = backend_handler,
};

/* Kernels of backends other than CPU/Meta, registered at load time. */
static ke_kernel_fn device_kernels[KE_NUM_KEYS][KE_OP_COUNT];

ke_hooks ke_hook;

void ke_install_hooks(const ke_hooks *h) {
    for (int k = 0; k < KE_NUM_KEYS; k++) {
        if (KE_KS(k) & KE_BACKEND_KEYS) {
            KE_ASSERT(!h->handler[k]); /* the backends' handler is eager's own */
            continue;
        }
        handlers[k] = h->handler[k];
    }
    ke_hook = *h;
}

void ke_register_kernel(ke_key backend, int op, ke_kernel_fn fn) {
    KE_ASSERT(backend == KE_KEY_CUDA && (unsigned)op < KE_OP_COUNT);
    device_kernels[backend][op] = fn;
}

int ke_has_kernel(ke_key backend, int op) {
    return (unsigned)backend < KE_NUM_KEYS && (unsigned)op < KE_OP_COUNT && device_kernels[backend][op] != NULL;
}

static inline int highest_key(ke_keyset ks) { return 31 - __builtin_clz(ks); }

/* Computes the key set of c's inputs; -1 (error recorded) on a bad input. */
static int call_keys(ke_call *c, ke_keyset *out) {
    ke_keyset ks = 0;
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = c->in[i];
        if (KE_UNLIKELY(!t || t->magic != KE_MAGIC_LIVE)) return ke_check_tensor(t, ke_opname(c), i + 1);
        /* A wrapped C scalar lives on the CPU but must not pull a CUDA or Meta
         * computation onto the CPU. */
        ks |= (t->flags & KE_TF_WRAPPED) ? (t->keys & ~KE_BACKEND_KEYS) : t->keys;
    }
    if (!(ks & KE_BACKEND_KEYS)) ks |= ke_device_key(c->nin ? c->in[0]->storage->device : c->device);
    *out = ks;
    return 0;
}

/* mask: the keys still allowed (a redispatch removes its own and higher ones
 * after the include set is applied, or an included key would recurse). */
static inline __attribute__((always_inline)) int run_keys(ke_call *c, ke_keyset ks, ke_keyset mask) {
    ke_tls *tls = &ke_tls_state;
    ks = (ks | tls->include) & ~tls->exclude & mask;
    if (!(ks & KE_BACKEND_KEYS)) return ke_err(KL_ERR_INTERNAL, ke_opname(c), "no backend key to dispatch to");
    int k = highest_key(ks);
    ke_handler_fn h = handlers[k];
    if (!h) return ke_err(KL_ERR_INTERNAL, ke_opname(c), "no handler for dispatch key %d", k);
    return h(c);
}

/* Inlined whole into ke_dispatch and the wrappers' ke_call1: a call to it
 * from there cost the 1-element kl_add 19 instructions (bench/RESULTS.md). */
static inline __attribute__((always_inline)) int dispatch_body(ke_call *c) {
    const ke_op_info *op = &ke_ops[c->op];
    ke_keyset ks = 0;
    if (call_keys(c, &ks)) return -1;
    /* Implicit composites decompose above every key, as PyTorch's
     * CompositeImplicitAutograd: autograd and tracing see their pieces. */
    if (op->flags & KE_F_IMPLICIT) return op->decomp(c);
    if (c->nin == 0 && !(ks & ~KE_BACKEND_KEYS)) {
        /* creation ops: the target device decides the backend */
        ks = ke_device_key(c->device);
    }
    return run_keys(c, ks, ~(ke_keyset)0);
}

int ke_dispatch(ke_call *c) {
    /* the profiler's and KL_LOG=dispatch's one branch (log.h) */
    if (KE_UNLIKELY(atomic_load_explicit(&ke_observe, memory_order_relaxed))) return ke_observed_dispatch(c);
    return dispatch_body(c);
}

int ke_dispatch_unobserved(ke_call *c) { return dispatch_body(c); }

int ke_redispatch(ke_call *c, ke_key below) {
    ke_keyset ks = 0;
    if (call_keys(c, &ks)) return -1;
    if (c->nin == 0) ks = ke_device_key(c->device);
    return run_keys(c, ks, KE_KS(below) - 1); /* keys strictly lower than `below` */
}

/* ---- the backend step --------------------------------------------------- */

/* A 0-dim CPU tensor may join a computation on a device (PyTorch's rule),
 * except as the destination of an in-place op. */
static inline int joins(const ke_call *c, int i) {
    const kl_tensor *t = c->in[i];
    return t->ndim == 0 && t->storage->device.type == KL_CPU && !(c->inplace && i == 0);
}

/* All tensor inputs must live on one device; wrapped scalars always join,
 * 0-dim CPU tensors join a CUDA computation (in either position), and copy
 * may cross between the CPU and CUDA devices (it is how kl_to_device moves
 * data; the CUDA side's kernel runs it). */
static int check_devices(ke_call *c) {
    /* the common case first (every op pays for this): all on in[0]'s device */
    if (KE_LIKELY(c->nin > 0 && !(c->in[0]->flags & KE_TF_WRAPPED))) {
        kl_device d0 = c->in[0]->storage->device;
        int i = 1;
        while (i < c->nin && c->in[i]->storage->device.type == d0.type && c->in[i]->storage->device.index == d0.index)
            i++;
        if (KE_LIKELY(i == c->nin)) {
            c->device = d0;
            return 0;
        }
    }
    int lead = -1;
    for (int i = 0; i < c->nin && lead < 0; i++)
        if (!(c->in[i]->flags & KE_TF_WRAPPED) && !joins(c, i)) lead = i;
    for (int i = 0; i < c->nin && lead < 0; i++)
        if (!(c->in[i]->flags & KE_TF_WRAPPED)) lead = i;
    if (lead < 0) return 0;
    kl_device dev = c->in[lead]->storage->device;
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = c->in[i];
        kl_device d = t->storage->device;
        if ((t->flags & KE_TF_WRAPPED) || (d.type == dev.type && d.index == dev.index)) continue;
        if (dev.type == KL_CUDA && joins(c, i)) continue;
        if (c->op == KE_OP_copy && d.type != KL_META && dev.type != KL_META) {
            if (dev.type != KL_CUDA) dev = d; /* CPU <-> CUDA: the CUDA kernel runs it */
            continue;
        }
        int i1 = lead < i ? lead : i, i2 = lead < i ? i : lead;
        char b1[256], b2[256];
        return ke_err(KL_ERR_DEVICE, ke_opname(c),
                      "expected all tensors on one device, got %s (argument %d) and %s (argument %d)",
                      ke_fmt_tensor(b1, sizeof b1, c->in[i1]), i1 + 1, ke_fmt_tensor(b2, sizeof b2, c->in[i2]),
                      i2 + 1);
    }
    c->device = dev;
    return 0;
}

static int check_inplace(ke_call *c, const ke_outspec *spec) {
    kl_tensor *self = c->in[0];
    char b1[256], b2[200];
    if (self->flags & KE_TF_WRAPPED) return ke_err(KL_ERR_ARG, ke_opname(c), "cannot write into a scalar");
    if (spec->ndim != self->ndim || memcmp(spec->shape, self->shape, sizeof(int64_t) * (size_t)spec->ndim))
        return ke_err(KL_ERR_SHAPE, ke_opname(c),
                      "in-place output %s cannot hold the broadcast result of shape %s",
                      ke_fmt_tensor(b1, sizeof b1, self), ke_fmt_shape(b2, sizeof b2, spec->ndim, spec->shape));
    kl_dtype want = spec->dtype, have = (kl_dtype)self->dtype;
    /* PyTorch's can_cast: no float -> integral, no non-bool -> bool. */
    if (!(ke_ops[c->op].flags & KE_F_ANYCAST) && ((ke_is_float(want) && !ke_is_float(have)) ||
        (ke_dtypes[want].cat != KE_CAT_BOOL && have == KL_BOOL)))
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "result type %s can't be cast to the in-place output %s",
                      ke_dtypes[want].name, ke_fmt_tensor(b1, sizeof b1, self));
    /* Writing into a tensor that overlaps itself (an expanded view) would race. */
    for (int d = 0; d < self->ndim; d++)
        if (self->stride[d] == 0 && self->shape[d] > 1)
            return ke_err(KL_ERR_ARG, ke_opname(c),
                          "in-place write into %s, which has broadcast (stride 0) dims: clone it first",
                          ke_fmt_tensor(b1, sizeof b1, self));
    return 0;
}

int ke_backend_run(ke_call *c) {
    const ke_op_info *op = &ke_ops[c->op];
    if (check_devices(c)) return -1;
    if (op->kind == KE_KIND_VIEW) return op->view(c);
    ke_outspec spec[KE_MAX_OUT];
    int nout = ke_infer_cached(c, spec);
    if (nout < 0) return -1;
    c->nout = nout;
    ke_kernel_fn k = NULL;
    if (c->device.type == KL_CPU) {
        k = op->cpu;
    } else if (c->device.type == KL_CUDA) {
        /* first: the first CUDA call joins the CUDA backend (kl_init), which registers its kernels */
        if (!ke_device_available(KL_CUDA))
            return ke_err(KL_ERR_DEVICE, ke_opname(c), "CUDA not available: no CUDA backend in this build");
        k = device_kernels[KE_KEY_CUDA][c->op];
        if (!k)
            return ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "no CUDA kernel for this op (on %s); move the tensors to "
                          "the CPU with kl_to_device", ke_device_name(c->device));
    }
    if (c->inplace) {
        if (check_inplace(c, &spec[0])) return -1;
        c->out[0] = c->in[0];
    }
    for (int i = c->inplace ? 1 : 0; i < nout; i++) {
        c->out[i] = ke_tensor_new(spec[i].dtype, spec[i].ndim, spec[i].shape, c->device, ke_opname(c));
        if (!c->out[i]) {
            for (int j = c->inplace ? 1 : 0; j < i; j++) ke_tensor_decref(c->out[j]);
            return -1;
        }
    }
    int rc = 0;
    if (c->device.type != KL_META) {
        if (k) {
            rc = k(c);
        } else {
            rc = ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "no %s kernel for this op", ke_device_name(c->device));
        }
    }
    if (rc) {
        for (int j = c->inplace ? 1 : 0; j < nout; j++) ke_tensor_decref(c->out[j]);
        return -1;
    }
    if (c->inplace) {
        ke_bump_version(c->in[0]);
        c->in[0]->storage->last_write_op = c->op;
    }
    for (int j = c->inplace ? 1 : 0; j < nout; j++) ke_scope_adopt(c->out[j]);
    return 0;
}

static int backend_handler(ke_call *c) {
    const ke_op_info *op = &ke_ops[c->op];
    /* A composite runs its fast kernel where the backend has one (and its
     * shape rule on Meta); elsewhere its decomposition, whose ops dispatch
     * normally below the keys already handled. */
    if (op->kind == KE_KIND_COMPOSITE) {
        kl_device_type dt = c->nin ? c->in[0]->storage->device.type : c->device.type;
        int direct = dt == KL_META ? op->infer != NULL
                     : dt == KL_CUDA ? device_kernels[KE_KEY_CUDA][c->op] != NULL
                                     : op->cpu != NULL;
        if (!direct) {
            if (!op->decomp) return ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "no kernel and no decomposition");
            return op->decomp(c);
        }
    }
    return ke_backend_run(c);
}

/* ---- wrapper helpers -------------------------------------------------------- */

static inline __attribute__((always_inline)) kl_tensor *call1_body(ke_call *c) {
    if (KE_UNLIKELY(atomic_load_explicit(&ke_observe, memory_order_relaxed))) {
        if (ke_observed_dispatch(c)) return NULL;
    } else if (dispatch_body(c)) {
        return NULL;
    }
    return c->out[0];
}

kl_tensor *ke_call1(ke_call *c) { return call1_body(c); }

/* A call with no attributes. Only the attribute slots that can be read are
 * cleared (the list is read only up to nlist): zeroing the whole record is a
 * visible share of a small op's cost. */
static inline void call_init(ke_call *c, int op, int inplace, int nin, kl_tensor *const *in) {
    c->op = op;
    c->inplace = (uint8_t)inplace;
    c->nin = nin;
    c->in = in;
    c->nout = 0;
    c->device = KL_DEVICE_CPU;
    c->compute = KL_F32;
    memset(&c->a, 0, offsetof(ke_attrs, list));
}

kl_tensor *ke_unary(int op, kl_tensor *x, int inplace) {
    kl_tensor *in[1] = {x};
    ke_call c;
    call_init(&c, op, inplace, 1, in);
    return call1_body(&c);
}

kl_tensor *ke_binary(int op, kl_tensor *a, kl_tensor *b, int inplace) {
    kl_tensor *in[2] = {a, b};
    ke_call c;
    call_init(&c, op, inplace, 2, in);
    return call1_body(&c);
}

kl_tensor *ke_binary_scalar(int op, kl_tensor *a, double s, int inplace) {
    if (ke_check_tensor(a, ke_ops[op].name, 1)) return NULL;
    kl_tensor *w = ke_wrap_scalar(s);
    if (!w) return NULL;
    kl_tensor *r = ke_binary(op, a, w, inplace);
    ke_tensor_decref(w);
    return r;
}

int ke_set_list(ke_call *c, int n, const int64_t *v) {
    if (n < 0 || n > KE_MAX_LIST) return ke_err(KL_ERR_ARG, ke_opname(c), "list of %d values is too long", n);
    if (n > 0 && !v) return ke_err(KL_ERR_NULL_ARG, ke_opname(c), "list pointer is NULL for %d values", n);
    c->a.nlist = n;
    for (int i = 0; i < n; i++) c->a.list[i] = v[i];
    return 0;
}
