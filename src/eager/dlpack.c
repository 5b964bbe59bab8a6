/*
 * dlpack.c — zero-copy exchange with other frameworks through DLPack's
 * DLManagedTensor (Debian's dlpack.h, DLPACK_VERSION 60 = v0.6).
 *
 * Export (kl_to_dlpack): one malloc'ed block holds the DLManagedTensor and
 * its shape/strides arrays, and a reference to the tensor's storage; the
 * deleter frees the block and drops that reference. It touches no scope or
 * thread-local state, so any thread may call it at any time, even after
 * the exporting scope closed. Like torch, data points at element [0,...,0]
 * and byte_offset is 0.
 *
 * Import (kl_from_dlpack): kl_from_blob over data + byte_offset, whose
 * deleter calls the managed tensor's deleter when the last Kiln reference
 * goes. On failure nothing is taken over: the caller still owns m.
 *
 * Devices: kDLCPU and kDLCUDA (device_id = the CUDA index). A CUDA export's
 * data is the device address; a CUDA import is a KE_ALLOC_BLOB storage on
 * that device: the producer's memory, freed by its deleter, never by the
 * caching allocator.
 *
 * dtypes: v0.6 has no bool code, so bool exports as uint8 (8 bits), the
 * values 0/1 — torch 1.13 refuses bool outright. On import, code 6
 * (kDLBool in DLPack >= 0.8) with 8 bits is read as bool.
 */
#include "core.h"

#include <dlpack/dlpack.h>
#include <stdlib.h>

#define KE_DL_BOOL 6 /* kDLBool, DLPack 0.8 */

static const struct {
    uint8_t code, bits;
    kl_dtype dt;
} dl_types[] = {
    {kDLFloat, 32, KL_F32}, {kDLFloat, 64, KL_F64}, {kDLFloat, 16, KL_F16}, {kDLBfloat, 16, KL_BF16},
    {kDLInt, 32, KL_I32},   {kDLInt, 64, KL_I64},   {kDLUInt, 8, KL_U8},    {KE_DL_BOOL, 8, KL_BOOL},
};

/* ---- export -------------------------------------------------------------------- */

typedef struct dl_export {
    DLManagedTensor m;
    ke_storage *storage;
    int64_t shape[KL_MAX_DIMS];
    int64_t strides[KL_MAX_DIMS];
} dl_export;

static void dl_export_delete(DLManagedTensor *m) {
    if (!m) return;
    dl_export *x = m->manager_ctx;
    ke_storage_decref(x->storage);
    free(x);
}

DLManagedTensor *kl_to_dlpack(kl_tensor *t) {
    if (ke_check_tensor(t, "to_dlpack", 1) || ke_check_data(t, "to_dlpack")) return NULL;
    kl_device dev = t->storage->device;
    if (dev.type == KL_META) {
        char desc[256];
        ke_err(KL_ERR_DEVICE, "to_dlpack", "only CPU and CUDA tensors can be exported, got %s",
               ke_fmt_tensor(desc, sizeof desc, t));
        return NULL;
    }
    dl_export *x = calloc(1, sizeof *x);
    if (!x) {
        ke_err(KL_ERR_OOM, "to_dlpack", "out of memory");
        return NULL;
    }
    kl_dtype dt = (kl_dtype)t->dtype;
    for (int d = 0; d < t->ndim; d++) {
        x->shape[d] = t->shape[d];
        x->strides[d] = t->stride[d];
    }
    x->storage = t->storage;
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    DLTensor *dl = &x->m.dl_tensor;
    dl->data = ke_data(t);
    dl->device = dev.type == KL_CUDA ? (DLDevice){kDLCUDA, dev.index} : (DLDevice){kDLCPU, 0};
    dl->ndim = t->ndim;
    for (size_t k = 0; k < sizeof dl_types / sizeof dl_types[0]; k++)
        if (dl_types[k].dt == dt) dl->dtype = (DLDataType){dl_types[k].code, dl_types[k].bits, 1};
    if (dt == KL_BOOL) dl->dtype = (DLDataType){kDLUInt, 8, 1}; /* see top */
    dl->shape = x->shape;
    dl->strides = x->strides;
    dl->byte_offset = 0;
    x->m.manager_ctx = x;
    x->m.deleter = dl_export_delete;
    return &x->m;
}

/* ---- import -------------------------------------------------------------------- */

static void dl_import_delete(void *data, void *ctx) {
    DLManagedTensor *m = ctx;
    if (m->deleter) m->deleter(m);
}

kl_tensor *kl_from_dlpack(DLManagedTensor *m) {
    const char *op = "from_dlpack";
    if (!m) {
        ke_err(KL_ERR_NULL_ARG, op, "managed tensor is NULL");
        return NULL;
    }
    const DLTensor *dl = &m->dl_tensor;
    kl_device dev = KL_DEVICE_CPU;
    if (dl->device.device_type == kDLCUDA) {
        /* The device must exist here (its index checked, the driver loaded):
         * Kiln will queue copies and kernels on it. */
        const ke_device_ops *o = ke_device_ops_of(KL_CUDA);
        void *none;
        if (!o) {
            ke_err(KL_ERR_DEVICE, op, "CUDA not available: no CUDA backend in this build");
            return NULL;
        }
        if (o->alloc(op, dl->device.device_id, 0, &none)) return NULL;
        dev = (kl_device){KL_CUDA, dl->device.device_id};
    } else if (dl->device.device_type != kDLCPU) {
        ke_err(KL_ERR_DEVICE, op, "only CPU (kDLCPU) and CUDA (kDLCUDA) tensors can be imported, got device type %d",
               (int)dl->device.device_type);
        return NULL;
    }
    if (dl->dtype.lanes != 1) {
        ke_err(KL_ERR_DTYPE, op, "vector dtypes (lanes %u) are not supported", (unsigned)dl->dtype.lanes);
        return NULL;
    }
    int dt = -1;
    for (size_t k = 0; k < sizeof dl_types / sizeof dl_types[0]; k++)
        if (dl_types[k].code == dl->dtype.code && dl_types[k].bits == dl->dtype.bits) dt = dl_types[k].dt;
    if (dt < 0) {
        ke_err(KL_ERR_DTYPE, op, "unsupported dtype (code %u, %u bits)%s", (unsigned)dl->dtype.code,
               (unsigned)dl->dtype.bits, dl->dtype.code == kDLComplex ? ": complex is not supported" : "");
        return NULL;
    }
    if (dl->ndim < 0 || dl->ndim > KL_MAX_DIMS) {
        ke_err(KL_ERR_SHAPE, op, "%d dims; Kiln supports at most %d", dl->ndim, KL_MAX_DIMS);
        return NULL;
    }
    if (dl->ndim > 0 && !dl->shape) {
        ke_err(KL_ERR_NULL_ARG, op, "shape pointer is NULL for %d dims", dl->ndim);
        return NULL;
    }
    if (ke_check_shape(op, dl->ndim, dl->shape, (kl_dtype)dt)) return NULL;
    int64_t numel = ke_numel(dl->ndim, dl->shape);
    if (dl->strides) {
        int64_t span = 0, step;
        for (int d = 0; d < dl->ndim; d++) {
            if (dl->strides[d] < 0) {
                ke_err(KL_ERR_UNSUPPORTED, op, "negative stride %lld in dim %d is not supported",
                       (long long)dl->strides[d], d);
                return NULL;
            }
            if (numel && (__builtin_mul_overflow(dl->shape[d] - 1, dl->strides[d], &step) ||
                          __builtin_add_overflow(span, step, &span) || span > INT64_MAX / 16)) {
                ke_err(KL_ERR_OVERFLOW, op, "strides span more than 2^59 elements");
                return NULL;
            }
        }
    }
    if (numel > 0 && !dl->data) {
        ke_err(KL_ERR_NULL_ARG, op, "data pointer is NULL");
        return NULL;
    }
    /* byte_offset on a NULL pointer (empty tensors) would be undefined; one
     * past the address space wrapped around (fuzz_dlpack). */
    if (dl->data && dl->byte_offset > (uint64_t)(UINTPTR_MAX - (uintptr_t)dl->data)) {
        ke_err(KL_ERR_OVERFLOW, op, "data %p + byte_offset %llu overflows the address space", dl->data,
               (unsigned long long)dl->byte_offset);
        return NULL;
    }
    char *data = dl->data ? (char *)((uintptr_t)dl->data + (uintptr_t)dl->byte_offset) : NULL;
    if ((uintptr_t)data % ke_dtypes[dt].size) {
        ke_err(KL_ERR_ARG, op, "data + byte_offset (%p) is not aligned for %s", (void *)data, ke_dtypes[dt].name);
        return NULL;
    }
    return ke_from_blob_on(data, dl->ndim, dl->shape, dl->strides, (kl_dtype)dt, dev, dl_import_delete, m);
}
