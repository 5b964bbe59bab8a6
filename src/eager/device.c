/*
 * device.c — eager kernels for device tensors (CUDA) that only move bytes:
 * creation ops, clone, copy (also across devices: kl_to_device is empty_on +
 * copy), bernoulli. They reach device memory only through the movers the
 * device registered (ke_device_ops, core.h); this file reads no device byte
 * from the CPU directly.
 *
 * First implementation, on purpose: what is not a plain copy or byte fill
 * runs the op's CPU kernel on a host mirror and copies the result over
 * ("staged"). Random ops therefore give the CPU's numbers for the same seed
 * (the Philox stream is the CPU's), as the issue requires. Device kernels
 * (the kernel-IR backend for CUDA) replace the staged paths op by op: a later
 * ke_register_kernel for the same op wins.
 */
#include "dispatch.h"

#include <stdlib.h>

static inline int on_device(const kl_tensor *t) {
    return t->storage->device.type != KL_CPU && t->storage->device.type != KL_META;
}
static inline const ke_device_ops *ops_of(const kl_tensor *t) {
    return ke_device_ops_of(t->storage->device.type);
}

/* The elements [*lo, *hi) of t's storage its view can touch (in elements). */
static void view_span(const kl_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    if (ke_numel(t->ndim, t->shape) == 0) {
        *lo = *hi = t->offset;
        return;
    }
    for (int d = 0; d < t->ndim; d++) {
        int64_t e = (t->shape[d] - 1) * t->stride[d];
        if (e < 0) a += e;
        else b += e;
    }
    *lo = a;
    *hi = b + 1;
}

/* A CPU tensor with t's shape, strides and values: the span of t's storage
 * the view covers, copied to the host. Not scope-owned (caller decrefs). */
static kl_tensor *host_mirror(const kl_tensor *t, const char *op) {
    int64_t lo, hi;
    view_span(t, &lo, &hi);
    size_t es = ke_dtypes[t->dtype].size, n = (size_t)(hi - lo) * es;
    ke_storage *s = ke_storage_new(n, KL_DEVICE_CPU, op);
    if (!s) return NULL;
    const char *src = (const char *)t->storage->data + lo * (int64_t)es;
    if (n && ops_of(t)->copy_d2h(op, t->storage->device.index, s->data, src, n)) {
        ke_storage_decref(s);
        return NULL;
    }
    kl_tensor *m = ke_tensor_wrap(s, (kl_dtype)t->dtype, t->ndim, t->shape, t->stride, t->offset - lo);
    ke_storage_decref(s); /* the header holds it now */
    if (!m) ke_err(KL_ERR_OOM, op, "out of memory for a host mirror");
    return m;
}

/* Writes mirror m (made by host_mirror(t)) back over t's span. */
static int from_mirror(kl_tensor *t, const kl_tensor *m, const char *op) {
    int64_t lo, hi;
    view_span(t, &lo, &hi);
    size_t es = ke_dtypes[t->dtype].size, n = (size_t)(hi - lo) * es;
    char *dst = (char *)t->storage->data + lo * (int64_t)es;
    const char *src = (const char *)m->storage->data + (m->offset - (t->offset - lo)) * (int64_t)es;
    return n ? ops_of(t)->copy_h2d(op, t->storage->device.index, dst, src, n) : 0;
}

/* Runs the op's CPU kernel on host mirrors of the device inputs and copies
 * the outputs back. In place: the mirror of in[0] is the output, written back
 * over in[0]'s span (elements between the view's own ones go back unchanged). */
static int staged(ke_call *c) {
    const char *op = ke_opname(c);
    if (!ke_ops[c->op].cpu) return ke_err(KL_ERR_UNSUPPORTED, op, "no CPU kernel to stage a device op through");
    kl_tensor *min[8] = {0};
    if (c->nin > 8) return ke_err(KL_ERR_INTERNAL, op, "too many inputs to stage");
    ke_call h = *c;
    int rc = -1, nmade = 0;
    for (int i = 0; i < c->nin; i++) {
        kl_tensor *t = c->in[i];
        if (on_device(t)) {
            if (!(min[i] = host_mirror(t, op))) goto out;
        } else {
            min[i] = t;
            ke_tensor_incref(t);
        }
        min[i]->flags = t->flags;
    }
    h.in = min;
    h.device = KL_DEVICE_CPU;
    for (int j = 0; j < c->nout; j++) {
        if (c->inplace && j == 0) {
            h.out[0] = min[0];
        } else {
            kl_tensor *o = c->out[j];
            h.out[j] = ke_tensor_new((kl_dtype)o->dtype, o->ndim, o->shape, KL_DEVICE_CPU, op);
            if (!h.out[j]) goto out;
        }
        nmade = j + 1;
    }
    if (ke_ops[c->op].cpu(&h)) goto out;
    for (int j = 0; j < c->nout; j++) {
        kl_tensor *o = c->out[j];
        if (!on_device(o)) continue; /* an in-place CPU destination was written directly */
        if (from_mirror(o, h.out[j], op)) goto out;
    }
    rc = 0;
out:
    for (int j = 0; j < nmade; j++)
        if (!(c->inplace && j == 0)) ke_tensor_decref(h.out[j]);
    for (int i = 0; i < c->nin; i++)
        if (min[i]) ke_tensor_decref(min[i]);
    return rc;
}

/* ---- kernels ------------------------------------------------------------------ */

static int dev_empty(ke_call *c) {
    (void)c;
    return 0;
}

/* A value whose bytes are all alike (0, -1, true, ...) is a memset; the rest
 * is filled on the host and copied. */
static int dev_full(ke_call *c) {
    kl_tensor *o = c->out[0];
    size_t es = ke_dtypes[o->dtype].size, n = (size_t)ke_numel(o->ndim, o->shape) * es;
    unsigned char val[8];
    ke_store_f64(val, (kl_dtype)o->dtype, 0, ke_attr_full_value(&c->a));
    for (size_t b = 1; b < es; b++)
        if (val[b] != val[0]) return staged(c);
    return n ? ops_of(o)->memset(ke_opname(c), o->storage->device.index, ke_data(o), val[0], n) : 0;
}

/* Same dtype, same shape, both contiguous: one copy of the bytes, whichever
 * side the two live on. Returns 1 when it does not apply. */
static int flat_copy(const char *op, kl_tensor *dst, const kl_tensor *src) {
    if (dst->dtype != src->dtype || dst->ndim != src->ndim || !ke_same_shape(dst->ndim, dst->shape, src->shape) ||
        !ke_is_contig(dst) || !ke_is_contig(src))
        return 1;
    size_t n = (size_t)ke_numel(dst->ndim, dst->shape) * ke_dtypes[dst->dtype].size;
    if (!n) return 0;
    int dd = on_device(dst), sd = on_device(src);
    if (dd && sd)
        return ops_of(dst)->copy_d2d(op, dst->storage->device.index, ke_data(dst), src->storage->device.index,
                                     ke_data(src), n);
    if (dd) return ops_of(dst)->copy_h2d(op, dst->storage->device.index, ke_data(dst), ke_data(src), n);
    if (sd) return ops_of(src)->copy_d2h(op, src->storage->device.index, ke_data(dst), ke_data(src), n);
    memcpy(ke_data(dst), ke_data(src), n);
    return 0;
}

static int dev_clone(ke_call *c) {
    int r = flat_copy(ke_opname(c), c->out[0], c->in[0]);
    return r == 1 ? staged(c) : r;
}

/* copy(dst, src), either side on the host or a device (the dispatcher lets
 * copy cross devices: it is how tensors move). A non-contiguous CPU source is
 * made contiguous on the host first, then copied over in one piece. */
static int dev_copy(ke_call *c) {
    kl_tensor *dst = c->in[0], *src = c->in[1];
    const char *op = ke_opname(c);
    int r = flat_copy(op, dst, src);
    if (r != 1) return r;
    if (on_device(dst) && !on_device(src) && ke_is_contig(dst) && dst->dtype == src->dtype && src->ndim == dst->ndim &&
        ke_same_shape(dst->ndim, dst->shape, src->shape)) {
        kl_scope_begin();
        kl_tensor *s = kl_contiguous(src);
        r = s ? flat_copy(op, dst, s) : -1;
        kl_scope_end();
        if (r != 1) return r;
    }
    return staged(c);
}

void ke_register_device_kernels(void) {
    static const int create_staged[] = {KE_OP_arange, KE_OP_linspace, KE_OP_eye,      KE_OP_rand,
                                        KE_OP_randn,  KE_OP_randint,  KE_OP_bernoulli};
    for (size_t i = 0; i < sizeof create_staged / sizeof create_staged[0]; i++)
        ke_register_kernel(KE_KEY_CUDA, create_staged[i], staged);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_empty, dev_empty);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_full, dev_full);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_clone, dev_clone);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_copy, dev_copy);
}
