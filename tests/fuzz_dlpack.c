/*
 * fuzz_dlpack.c — fuzzes DLPack import (kl_from_dlpack) with a crafted
 * DLManagedTensor: device, dtype (code, bits, lanes), ndim, shape, strides
 * (or none), byte_offset and data pointer all come from the input, sizes
 * mostly at their extremes. Checked: no sanitizer report; a failure is a
 * clean error that leaves the managed tensor to the caller (its deleter not
 * called); a success has the shape asked for, and when the memory it
 * describes lies inside the producer's buffer every element is read (a
 * contiguous copy and a sum; past 2^22 elements, which stride-0 dims make of
 * a small buffer, only its corners: reading 10^9 elements took minutes, a
 * fuzz-ci timeout); the deleter runs exactly once, when the last
 * Kiln reference goes. A description reaching outside the buffer is the
 * producer's lie, which DLPack cannot detect: such a tensor is imported and
 * released without touching its data. Plain build: replays
 * tests/fuzz/dlpack/; libFuzzer: scripts/kiln.sh fuzz.
 */
#include "fuzz_replay.h"

#include <dlpack/dlpack.h>

#include "kiln.h"

#define MAX_READ (1 << 22) /* elements read in full; past it, the corners */

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_dlpack: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:max_allocation_size_mb=256"; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

typedef struct rd {
    const uint8_t *p;
    size_t n, at;
} rd;
static unsigned u8(rd *r) { return r->at < r->n ? r->p[r->at++] : 0; }
static int64_t i64(rd *r) {
    static const int64_t ex[] = {0, 1, 2, 3, 4, -1, INT64_MAX, INT64_MIN, 1ll << 31, 1ll << 32, 1ll << 59, 1ll << 62,
                                 INT32_MAX, 7, 8, 64};
    unsigned b = u8(r);
    if (b < 200) return ex[b % (sizeof ex / sizeof ex[0])];
    int64_t v = 0;
    for (int i = 0; i < 8; i++) v = (int64_t)((uint64_t)v << 8 | u8(r));
    return v;
}

static int deletes;
static void deleter(DLManagedTensor *m) {
    (void)m;
    deletes++;
}

enum { BUF = 4096 };
static _Alignas(64) uint8_t buffer[BUF];

/* Highest byte the description reaches + 1, or -1 if it overflows or is negative. */
static int64_t extent(const DLTensor *dl, int64_t esize) {
    int64_t off = (int64_t)dl->byte_offset, last = 0;
    if (off < 0) return -1;
    for (int d = 0; d < dl->ndim; d++)
        if (dl->shape[d] == 0) return 0;
    int64_t contig = 1;
    for (int d = dl->ndim - 1; d >= 0; d--) {
        int64_t st = dl->strides ? dl->strides[d] : contig, t;
        if (st < 0 || __builtin_mul_overflow(dl->shape[d] - 1, st, &t) || __builtin_add_overflow(last, t, &last) ||
            __builtin_mul_overflow(contig, dl->shape[d], &contig))
            return -1;
    }
    int64_t bytes;
    if (__builtin_mul_overflow(last + 1, esize, &bytes) || __builtin_add_overflow(bytes, off, &bytes)) return -1;
    return bytes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size, 0};
    int64_t shape[16], strides[16];
    DLManagedTensor m;
    memset(&m, 0, sizeof m);
    DLTensor *dl = &m.dl_tensor;
    unsigned dev = u8(&r);
    dl->device.device_type = dev < 200 ? kDLCPU : (DLDeviceType)(dev % 16);
    dl->device.device_id = (int32_t)(u8(&r) < 250 ? 0 : (int32_t)i64(&r));
    unsigned nd = u8(&r);
    dl->ndim = nd < 240 ? (int32_t)(nd % 6) : (int32_t)(int64_t)i64(&r);
    unsigned code = u8(&r);
    dl->dtype.code = (uint8_t)(code % 6);
    static const uint8_t bits[] = {8, 16, 32, 64, 1, 128, 0, 12};
    dl->dtype.bits = bits[u8(&r) % 8];
    dl->dtype.lanes = (uint16_t)(u8(&r) < 250 ? 1 : u8(&r));
    for (int d = 0; d < 16; d++) {
        unsigned b = u8(&r);
        shape[d] = b < 128 ? (int64_t)(b % 5) : i64(&r);
    }
    bool with_strides = u8(&r) & 1;
    for (int d = 0; d < 16; d++) {
        unsigned b = u8(&r);
        strides[d] = b < 128 ? (int64_t)(b % 9) : i64(&r);
    }
    unsigned ptr = u8(&r);
    dl->shape = (ptr & 0xC0) == 0xC0 ? NULL : shape;
    dl->strides = with_strides ? strides : NULL;
    dl->data = (ptr & 0x30) == 0x30 ? NULL : buffer + ((ptr & 0x0F) == 0x0F ? 1 : 0);
    unsigned bo = u8(&r);
    dl->byte_offset = bo < 128 ? (uint64_t)(bo % 8) * 8 : (uint64_t)i64(&r);
    m.deleter = u8(&r) & 1 ? deleter : NULL;
    for (size_t i = 0; i < BUF; i++) buffer[i] = (uint8_t)(i * 37 + 11);

    deletes = 0;
    kl_clear_error();
    kl_scope_begin();
    kl_tensor *t = kl_from_dlpack(&m);
    if (!t) {
        if (kl_last_status() == KL_OK || !kl_last_error()[0]) finding("NULL without an error", NULL);
        if (deletes) finding("a failed import called the deleter (the caller still owns the tensor)", NULL);
        kl_clear_error();
    } else {
        if (kl_ndim(t) != dl->ndim) finding("imported ndim differs", NULL);
        for (int d = 0; d < dl->ndim; d++)
            if (kl_size(t, d) != dl->shape[d]) finding("imported shape differs", NULL);
        int64_t esize = (int64_t)kl_dtype_size(kl_dtype_of(t));
        int64_t ext = dl->data ? extent(dl, esize) : 0;
        if (ext >= 0 && ext <= (dl->data == buffer ? BUF : BUF - 1)) {
            kl_tensor *rt = t;
            if (kl_numel(t) > MAX_READ) {
                /* the first and last index of every dim: 2^ndim elements that
                 * include the lowest and the highest address the tensor reaches */
                int tnd = kl_ndim(t);
                int64_t cs[KL_MAX_DIMS], cst[KL_MAX_DIMS];
                for (int d = 0; d < tnd; d++) {
                    int64_t n = kl_size(t, d);
                    cs[d] = n < 2 ? n : 2;
                    cst[d] = n > 2 ? (n - 1) * kl_stride(t)[d] : kl_stride(t)[d];
                }
                rt = kl_as_strided(t, tnd, cs, cst, kl_storage_offset(t));
                if (!rt) finding("the corners of an in-bounds import are not a view", kl_last_error());
            }
            kl_tensor *c = kl_contiguous(rt);
            kl_tensor *s = kl_sum(kl_to_dtype(rt, KL_F64), KL_ALL_DIMS, false);
            /* stride-0 dims make a huge tensor of a small buffer: its copy may fail, but only as OOM */
            if ((!c || !s) && kl_last_status() != KL_ERR_OOM) finding("an in-bounds import cannot be read", kl_last_error());
            kl_clear_error();
        }
        if (deletes) finding("the deleter ran while Kiln still held the tensor", NULL);
    }
    kl_scope_end();
    if (t && m.deleter && deletes != 1) finding("the deleter did not run exactly once", NULL);
    kl_clear_error();
    if (kl_live_tensors() != 0 || kl_live_storages() != 0) finding("leaked a tensor or storage", NULL);
    return 0;
}
