/*
 * tensor.c — tensor headers and storage: allocation (free lists for the
 * headers, the caching allocator for data), reference counts, accessors and
 * the shape helpers everything else uses.
 *
 * Headers come from per-thread free lists and are never returned to malloc:
 * a stale pointer then reads a header whose magic says "dead" (KL_ERR_FREED)
 * instead of unmapped memory, until the header is reused.
 *
 * A fresh tensor (ke_tensor_new: every op output) takes its header and its
 * storage header from one block, so an op pays one free-list pop and one
 * push instead of two each. The block's tensor holds a reference to the
 * block's storage like any header; when it dies it is marked dead at once,
 * and the block goes back to a free list when the storage's last reference
 * (the tensor's, or a view's) is dropped. Blocks are never returned to
 * malloc either, for the same reason as headers.
 */
#include "core.h"

#include "alloc.h"

#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>

_Thread_local ke_tls ke_tls_state = {0, 0, {KL_CPU, 0}};
ke_tls *ke_tls_get(void) { return &ke_tls_state; }

/* Live counts are per-thread (no locked instruction on the per-op path) and
 * summed on request. A header freed on another thread decrements that
 * thread's counter, so only the sum is meaningful. Counter blocks are never
 * freed: a thread's counts outlive it. */
typedef struct live_counts {
    _Atomic int64_t tensors, storages; /* relaxed loads/stores by the owner only */
    struct live_counts *next;
} live_counts;
static live_counts *all_counts;
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local live_counts *tl_counts;

/* Every thread that makes or frees a header passes here first, so the slow
 * path is also where its exit hook (scope.c, then ke_tensor_thread_exit) is armed. */
static live_counts *my_counts(void) {
    if (KE_LIKELY(tl_counts != NULL)) return tl_counts;
    live_counts *c = calloc(1, sizeof *c);
    KE_ASSERT(c); /* a few bytes once per thread */
    pthread_mutex_lock(&counts_lock);
    c->next = all_counts;
    all_counts = c;
    pthread_mutex_unlock(&counts_lock);
    ke_scope_thread_init(); /* its exit hook gives the free lists below back */
    return tl_counts = c;
}

static inline void count_add(_Atomic int64_t *ctr, int64_t d) {
    atomic_store_explicit(ctr, atomic_load_explicit(ctr, memory_order_relaxed) + d, memory_order_relaxed);
}

static int64_t sum_counts(int storages) {
    int64_t n = 0;
    pthread_mutex_lock(&counts_lock);
    for (live_counts *c = all_counts; c; c = c->next)
        n += atomic_load_explicit(storages ? &c->storages : &c->tensors, memory_order_relaxed);
    pthread_mutex_unlock(&counts_lock);
    return n;
}
int64_t kl_live_tensors(void) { return sum_counts(0); }
int64_t kl_live_storages(void) { return sum_counts(1); }

/* ---- free lists ----------------------------------------------------------- */

#define KE_FREELIST_MAX 4096
static _Thread_local kl_tensor *tl_free_tensors;
static _Thread_local ke_storage *tl_free_storages;
static _Thread_local kl_tensor *tl_free_blocks; /* ke_block's tensors, linked through t.next_free */
static _Thread_local int tl_n_free_storages;

/* An exited thread's header and block lists join these (chunks are never
 * freed, so each short-lived thread stranded its own); a thread whose list is
 * empty takes them whole before it carves a new chunk. */
static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER;
static kl_tensor *orphan_tensors, *orphan_blocks;
static _Atomic int have_orphans; /* lets the slow path skip the lock */

static void splice(kl_tensor **into, kl_tensor *list) {
    if (!list) return;
    kl_tensor *tail = list;
    while (tail->next_free) tail = tail->next_free;
    tail->next_free = *into;
    *into = list;
}

/* 1 if this thread's empty lists got the orphans. */
static int adopt_orphans(void) {
    if (!atomic_load_explicit(&have_orphans, memory_order_relaxed)) return 0;
    pthread_mutex_lock(&orphan_lock);
    splice(&tl_free_tensors, orphan_tensors);
    splice(&tl_free_blocks, orphan_blocks);
    orphan_tensors = orphan_blocks = NULL;
    atomic_store_explicit(&have_orphans, 0, memory_order_relaxed);
    pthread_mutex_unlock(&orphan_lock);
    return tl_free_tensors || tl_free_blocks;
}

void ke_tensor_thread_exit(void) {
    pthread_mutex_lock(&orphan_lock);
    splice(&orphan_tensors, tl_free_tensors);
    splice(&orphan_blocks, tl_free_blocks);
    if (orphan_tensors || orphan_blocks) atomic_store_explicit(&have_orphans, 1, memory_order_relaxed);
    pthread_mutex_unlock(&orphan_lock);
    tl_free_tensors = tl_free_blocks = NULL;
    /* storage headers are single allocations: back to malloc */
    while (tl_free_storages) {
        ke_storage *s = tl_free_storages;
        tl_free_storages = s->next_free;
        free(s);
    }
    tl_n_free_storages = 0;
}

static kl_tensor *header_alloc(void) {
    kl_tensor *t = tl_free_tensors;
    if (!t && adopt_orphans()) t = tl_free_tensors;
    if (t) {
        tl_free_tensors = t->next_free;
    } else {
        /* Headers are carved from chunks that are never freed (see top). */
        enum { CHUNK = 64 };
        kl_tensor *chunk = calloc(CHUNK, sizeof *chunk);
        if (!chunk) return NULL;
        for (int i = 1; i < CHUNK; i++) {
            chunk[i].magic = KE_MAGIC_DEAD;
            chunk[i].next_free = tl_free_tensors;
            tl_free_tensors = &chunk[i];
        }
        t = &chunk[0];
    }
    count_add(&my_counts()->tensors, 1);
    return t;
}

static void header_free(kl_tensor *t) {
    t->magic = KE_MAGIC_DEAD;
    count_add(&my_counts()->tensors, -1);
    /* Never freed (see top): a header freed on another thread joins that
     * thread's list, so chunks circulate between threads. */
    t->next_free = tl_free_tensors;
    tl_free_tensors = t;
}

static ke_storage *storage_header_alloc(void) {
    ke_storage *s = tl_free_storages;
    if (s) {
        tl_free_storages = s->next_free;
        tl_n_free_storages--;
    } else {
        s = aligned_alloc(64, sizeof *s); /* sizeof is a multiple of 64: inline_data is aligned */
        if (!s) return NULL;
    }
    count_add(&my_counts()->storages, 1);
    return s;
}

static void storage_header_free(ke_storage *s) {
    count_add(&my_counts()->storages, -1);
    if (tl_n_free_storages < KE_FREELIST_MAX) {
        s->next_free = tl_free_storages;
        tl_free_storages = s;
        tl_n_free_storages++;
    } else {
        free(s);
    }
}

/* A tensor header and its storage header in one allocation (see top). The
 * storage comes first: its inline data must be 64-byte aligned. */
typedef struct ke_block {
    ke_storage s;
    kl_tensor t;
} ke_block;

static ke_block *block_of(const kl_tensor *t) {
    return (ke_block *)((char *)t - offsetof(ke_block, t));
}
/* 1 if t is the tensor of a block whose storage it still uses. */
static inline int in_own_block(const kl_tensor *t) {
    return (const char *)t->storage + offsetof(ke_block, t) == (const char *)t;
}

static ke_block *block_alloc(void) {
    kl_tensor *t = tl_free_blocks;
    if (!t && adopt_orphans()) t = tl_free_blocks;
    if (t) {
        tl_free_blocks = t->next_free;
    } else {
        /* chunks are never freed (see top) */
        enum { CHUNK = 16 };
        ke_block *chunk = aligned_alloc(_Alignof(ke_block), CHUNK * sizeof *chunk);
        if (!chunk) return NULL;
        for (int i = 1; i < CHUNK; i++) {
            chunk[i].t.magic = KE_MAGIC_DEAD;
            chunk[i].t.next_free = tl_free_blocks;
            tl_free_blocks = &chunk[i].t;
        }
        t = &chunk[0].t;
    }
    live_counts *c = my_counts();
    count_add(&c->tensors, 1);
    count_add(&c->storages, 1);
    return block_of(t);
}

/* The block's tensor is already dead (or never lived) and its storage has no
 * reference left. A block freed on another thread joins that thread's list. */
static void block_free(ke_block *b) {
    b->t.magic = KE_MAGIC_DEAD;
    b->t.next_free = tl_free_blocks;
    tl_free_blocks = &b->t;
}

/* ---- storage ---------------------------------------------------------------- */

static const ke_device_ops *_Atomic device_ops[3];

void ke_register_device(kl_device_type type, const ke_device_ops *ops) {
    KE_ASSERT((unsigned)type < 3 && type != KL_CPU && type != KL_META);
    atomic_store_explicit(&device_ops[type], ops, memory_order_release);
}

const ke_device_ops *ke_device_ops_of(kl_device_type type) {
    if ((unsigned)type >= 3) return NULL;
    const ke_device_ops *o = atomic_load_explicit(&device_ops[type], memory_order_acquire);
    if (!o && type == KL_CUDA) {
        /* The composition root registers CUDA: eager reaches it through the
         * public entry point (once; cheap after the first call). */
        kl_init();
        o = atomic_load_explicit(&device_ops[type], memory_order_acquire);
    }
    return o;
}

int ke_device_available(kl_device_type type) {
    return type == KL_CPU || type == KL_META || ke_device_ops_of(type) != NULL;
}

static void storage_init(ke_storage *s, void *data, size_t nbytes, kl_device dev, ke_alloc_kind kind) {
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->last_write_op = -1;
    s->alloc = (uint8_t)kind;
    s->in_block = 0;
    s->device = dev;
    s->data = data;
    s->nbytes = nbytes;
    s->deleter = NULL;
    s->deleter_ctx = NULL;
    s->next_free = NULL;
}

/* Gives the fresh header s nbytes of data on dev (inline when small). Returns
 * 0, or -1 with an error recorded (s is left for the caller to free). Inlined:
 * every op output passes here. */
static inline __attribute__((always_inline)) int storage_fill(ke_storage *s, size_t nbytes, kl_device dev, const char *op) {
    void *data = NULL;
    ke_alloc_kind kind = KE_ALLOC_NONE;
    if (dev.type == KL_CPU && nbytes <= KE_INLINE_BYTES && !ke_alloc_failing()) {
        storage_init(s, s->inline_data, nbytes, dev, KE_ALLOC_INLINE);
        return 0;
    } else if (dev.type == KL_CPU) {
        data = ke_cpu_alloc(nbytes);
        kind = KE_ALLOC_CPU;
    } else if (dev.type == KL_CUDA) {
        const ke_device_ops *o = ke_device_ops_of(KL_CUDA);
        if (!o) return ke_err(KL_ERR_DEVICE, op, "CUDA not available: no CUDA backend in this build");
        if (o->alloc(op, dev.index, nbytes, &data)) return -1;
        storage_init(s, data, nbytes, dev, KE_ALLOC_DEVICE);
        return 0;
    } else {
        storage_init(s, NULL, nbytes, dev, KE_ALLOC_NONE);
        return 0;
    }
    if (!data)
        return ke_err(KL_ERR_OOM, op, "out of memory allocating %zu bytes on %s", nbytes, ke_device_name(dev));
    storage_init(s, data, nbytes, dev, kind);
    return 0;
}

ke_storage *ke_storage_new(size_t nbytes, kl_device dev, const char *op) {
    ke_storage *s = storage_header_alloc();
    if (!s) {
        ke_err(KL_ERR_OOM, op, "out of memory allocating a storage header");
        return NULL;
    }
    if (storage_fill(s, nbytes, dev, op)) {
        storage_header_free(s);
        return NULL;
    }
    return s;
}

ke_storage *ke_storage_blob(void *data, size_t nbytes, void (*deleter)(void *, void *), void *ctx) {
    return ke_storage_blob_on(data, nbytes, KL_DEVICE_CPU, deleter, ctx);
}

ke_storage *ke_storage_blob_on(void *data, size_t nbytes, kl_device dev, void (*deleter)(void *, void *),
                               void *ctx) {
    ke_storage *s = storage_header_alloc();
    if (!s) return NULL;
    storage_init(s, data, nbytes, dev, KE_ALLOC_BLOB);
    s->deleter = deleter;
    s->deleter_ctx = ctx;
    return s;
}

/* Drops one reference; 1 if it was the last. A count of 1 seen with acquire
 * means this caller holds the only reference, so no other thread can touch
 * the count any more: no locked instruction on the common path. */
static inline int drop_ref(_Atomic int32_t *rc) {
    if (atomic_load_explicit(rc, memory_order_acquire) == 1) return 1;
    return atomic_fetch_sub_explicit(rc, 1, memory_order_acq_rel) == 1;
}

/* Frees what s's data lives in; s has no reference left. */
static inline void storage_release_data(ke_storage *s) {
    switch (s->alloc) {
    case KE_ALLOC_CPU: ke_cpu_free(s->data, s->nbytes); break;
    case KE_ALLOC_BLOB:
        if (s->deleter) s->deleter(s->data, s->deleter_ctx);
        break;
    case KE_ALLOC_DEVICE: device_ops[s->device.type]->free(s->data, s->nbytes, s->device.index); break;
    default: break;
    }
}

void ke_storage_decref(ke_storage *s) {
    if (!drop_ref(&s->refcount)) return;
    storage_release_data(s);
    if (s->in_block) {
        count_add(&my_counts()->storages, -1);
        block_free((ke_block *)s);
    } else {
        storage_header_free(s);
    }
}

/* ---- headers ------------------------------------------------------------------ */

/* A live header over s, refcount 1, in no scope (s's reference is the caller's
 * business). stride NULL: contiguous. */
static void header_init(kl_tensor *t, ke_storage *s, kl_dtype dt, int ndim, const int64_t *shape,
                        const int64_t *stride, int64_t offset) {
    t->magic = KE_MAGIC_LIVE;
    atomic_init(&t->refcount, 1);
    atomic_init(&t->user_refs, 0);
    t->dtype = (uint8_t)dt;
    t->ndim = (uint8_t)ndim;
    t->flags = 0;
    t->keys = (uint8_t)ke_device_key(s->device);
    t->scope_slot = -1;
    t->scope = NULL;
    t->storage = s;
    t->offset = offset;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    if (stride)
        for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
    else
        ke_contiguous_strides(ndim, shape, t->stride);
    t->autograd = NULL;
    t->trace_id = -1;
    t->next_free = NULL;
}

kl_tensor *ke_tensor_wrap(ke_storage *s, kl_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *stride, int64_t offset) {
    kl_tensor *t = header_alloc();
    if (!t) return NULL;
    header_init(t, s, dt, ndim, shape, stride, offset);
    atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
    return t;
}

kl_tensor *ke_tensor_new(kl_dtype dt, int ndim, const int64_t *shape, kl_device dev, const char *op) {
    /* Every op's result comes through here: whatever its shape rule computed,
     * a size that overflows is an error before anything is allocated. */
    if (KE_UNLIKELY(ke_check_shape(op, ndim, shape, dt))) return NULL;
    size_t nbytes = (size_t)ke_numel(ndim, shape) * ke_dtypes[dt].size;
    ke_block *b = block_alloc();
    if (!b) {
        ke_err(KL_ERR_OOM, op, "out of memory allocating a tensor header");
        return NULL;
    }
    if (storage_fill(&b->s, nbytes, dev, op)) {
        live_counts *c = my_counts();
        count_add(&c->tensors, -1);
        count_add(&c->storages, -1);
        block_free(b);
        return NULL;
    }
    b->s.in_block = 1;
    header_init(&b->t, &b->s, dt, ndim, shape, NULL, 0); /* the header takes the storage's only reference */
    return &b->t;
}

kl_tensor *ke_tensor_view(const kl_tensor *base, int ndim, const int64_t *shape, const int64_t *stride,
                          int64_t offset) {
    kl_tensor *t = ke_tensor_wrap(base->storage, (kl_dtype)base->dtype, ndim, shape, stride, offset);
    if (!t) return NULL;
    t->keys = base->keys & ~KE_KS(KE_KEY_AUTOGRAD);
    return t;
}

void ke_tensor_decref(kl_tensor *t) {
    if (!drop_ref(&t->refcount)) return;
    if (t->autograd && ke_hook.autograd_free) ke_hook.autograd_free(t);
    if (in_own_block(t)) {
        /* dead now; the block is freed with its storage: here, when no view
         * shares it (the usual case, done in one step), else by the last view */
        ke_storage *s = t->storage;
        t->magic = KE_MAGIC_DEAD;
        live_counts *c = my_counts();
        count_add(&c->tensors, -1);
        if (drop_ref(&s->refcount)) {
            storage_release_data(s);
            count_add(&c->storages, -1);
            block_free((ke_block *)s);
        }
        return;
    }
    ke_storage_decref(t->storage);
    header_free(t);
}

int ke_check_tensor(const kl_tensor *t, const char *op, int argno) {
    if (KE_LIKELY(t && t->magic == KE_MAGIC_LIVE)) return 0;
    if (!t) {
        /* A NULL from an earlier failed op keeps that op's error. */
        if (!ke_error_pending()) ke_err(KL_ERR_NULL_ARG, op, "tensor argument %d is NULL", argno);
        return -1;
    }
    return ke_err(KL_ERR_FREED, op, "tensor argument %d was released (use after free)", argno);
}

/* ---- shape helpers ---------------------------------------------------------------- */

int ke_check_shape(const char *op, int ndim, const int64_t *shape, kl_dtype dt) {
    if (ndim < 0 || ndim > KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, op, "%d dims requested; Kiln supports at most %d", ndim, KL_MAX_DIMS);
    if (ndim > 0 && !shape) return ke_err(KL_ERR_NULL_ARG, op, "shape pointer is NULL for %d dims", ndim);
    if (!ke_dtype_valid(dt)) return ke_err(KL_ERR_DTYPE, op, "invalid dtype value %d", (int)dt);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            char b[200];
            return ke_err(KL_ERR_SHAPE, op, "negative dimension %lld in shape %s", (long long)shape[i],
                          ke_fmt_shape(b, sizeof b, ndim, shape));
        }
        /* nonzero dims only (numpy's rule): strides multiply them even when
         * another dim makes the tensor empty */
        if (shape[i] == 0) continue;
        if (ke_mul_ov(n, shape[i], &n) || n > INT64_MAX / 16) {
            char b[200];
            return ke_err(KL_ERR_OVERFLOW, op, "shape %s has too many elements",
                          ke_fmt_shape(b, sizeof b, ndim, shape));
        }
    }
    return 0;
}

int ke_wrap_dim(const char *op, int64_t dim, int ndim) {
    int64_t n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n)
        return ke_err(KL_ERR_INDEX, op, "dim %lld out of range for a tensor with %d dims (expected %lld to %lld)",
                      (long long)dim, ndim, (long long)-n, (long long)(n - 1));
    return (int)(dim < 0 ? dim + n : dim);
}

/* ---- accessors -------------------------------------------------------------------- */

#define ACCESS_CHECK(t, op, bad)                   \
    do {                                           \
        if (ke_check_tensor(t, op, 1)) return bad; \
    } while (0)

int kl_ndim(const kl_tensor *t) {
    ACCESS_CHECK(t, "ndim", -1);
    return t->ndim;
}
const int64_t *kl_shape(const kl_tensor *t) {
    ACCESS_CHECK(t, "shape", NULL);
    return t->shape;
}
const int64_t *kl_stride(const kl_tensor *t) {
    ACCESS_CHECK(t, "stride", NULL);
    return t->stride;
}
int64_t kl_size(const kl_tensor *t, int dim) {
    ACCESS_CHECK(t, "size", -1);
    int d = ke_wrap_dim("size", dim, t->ndim);
    if (d < 0) return -1;
    return t->ndim ? t->shape[d] : 1;
}
int64_t kl_numel(const kl_tensor *t) {
    ACCESS_CHECK(t, "numel", -1);
    return ke_numel(t->ndim, t->shape);
}
int64_t kl_storage_offset(const kl_tensor *t) {
    ACCESS_CHECK(t, "storage_offset", -1);
    return t->offset;
}
kl_dtype kl_dtype_of(const kl_tensor *t) {
    ACCESS_CHECK(t, "dtype_of", KL_NUM_DTYPES);
    return (kl_dtype)t->dtype;
}
kl_device ke_device_of(const kl_tensor *t) {
    kl_device d = t->storage->device;
    if (d.type == KL_META && t->trace_id >= 0 && ke_hook.trace_device) return ke_hook.trace_device(t);
    return d;
}
kl_device kl_device_of(const kl_tensor *t) {
    ACCESS_CHECK(t, "device_of", KL_DEVICE_CPU);
    return ke_device_of(t);
}
bool kl_is_contiguous(const kl_tensor *t) {
    ACCESS_CHECK(t, "is_contiguous", false);
    return ke_is_contig(t);
}
int64_t kl_version_of(const kl_tensor *t) {
    ACCESS_CHECK(t, "version_of", -1);
    return atomic_load(&t->storage->version);
}
void *kl_data_ptr(const kl_tensor *t) {
    ACCESS_CHECK(t, "data_ptr", NULL);
    if (ke_check_data(t, "data_ptr")) return NULL;
    if (t->storage->device.type == KL_META) {
        char b[256];
        ke_err(KL_ERR_DEVICE, "data_ptr", "tensor %s has no data (move it with kl_to_device)",
               ke_fmt_tensor(b, sizeof b, t));
        return NULL;
    }
    return ke_data(t); /* on CUDA: the device address, as PyTorch's data_ptr (kiln.h) */
}
int kl_shares_storage(const kl_tensor *t, const kl_tensor *u) {
    if (ke_check_tensor(t, "shares_storage", 1) || ke_check_tensor(u, "shares_storage", 2)) return -1;
    return t->storage == u->storage;
}

static int item_check(const kl_tensor *t, const char *op) {
    if (ke_check_tensor(t, op, 1) || ke_check_data(t, op)) return -1;
    char b[256];
    if (ke_numel(t->ndim, t->shape) != 1)
        return ke_err(KL_ERR_SHAPE, op, "needs a tensor with one element, got %s", ke_fmt_tensor(b, sizeof b, t));
    if (t->storage->device.type == KL_META)
        return ke_err(KL_ERR_DEVICE, op, "tensor %s has no data (move it with kl_to_device)",
                      ke_fmt_tensor(b, sizeof b, t));
    return 0;
}
/* The one element's bytes: read in place on the CPU, copied from a device
 * (waits for the work queued before it). NULL with an error recorded. */
static const void *item_bytes(const kl_tensor *t, const char *op, uint64_t *buf) {
    if (t->storage->device.type == KL_CPU) return ke_data(t);
    const ke_device_ops *o = ke_device_ops_of(t->storage->device.type);
    if (!o || o->copy_d2h(op, t->storage->device.index, buf, ke_data(t), ke_dtypes[t->dtype].size)) return NULL;
    return buf;
}
double kl_item(const kl_tensor *t) {
    uint64_t buf;
    const void *p;
    if (item_check(t, "item") || !(p = item_bytes(t, "item", &buf))) return NAN;
    return ke_load_f64(p, (kl_dtype)t->dtype, 0);
}
int64_t kl_item_int(const kl_tensor *t) {
    uint64_t buf;
    const void *p;
    if (item_check(t, "item_int")) return 0;
    if (ke_is_float((kl_dtype)t->dtype)) {
        char b[256];
        ke_err(KL_ERR_DTYPE, "item_int", "needs an integer or bool tensor, got %s", ke_fmt_tensor(b, sizeof b, t));
        return 0;
    }
    if (!(p = item_bytes(t, "item_int", &buf))) return 0;
    return ke_load_i64(p, (kl_dtype)t->dtype, 0);
}

kl_tensor *ke_wrap_scalar(double v) {
    int integral = isfinite(v) && v == trunc(v) && fabs(v) < 9.007199254740992e15;
    kl_dtype dt = integral ? KL_I64 : KL_F64;
    kl_tensor *t = ke_tensor_new(dt, 0, NULL, KL_DEVICE_CPU, "scalar");
    if (!t) return NULL;
    if (integral)
        *(int64_t *)t->storage->data = (int64_t)v;
    else
        *(double *)t->storage->data = v;
    t->flags |= KE_TF_WRAPPED;
    return t;
}

/* ---- defaults ------------------------------------------------------------------------ */

static kl_dtype default_dtype = KL_F32;
void kl_set_default_device(kl_device d) { ke_tls_state.default_device = d; }
kl_device kl_get_default_device(void) { return ke_tls_state.default_device; }
void kl_set_default_dtype(kl_dtype dt) {
    if (ke_dtype_valid(dt) && ke_is_float(dt)) default_dtype = dt;
}
kl_dtype kl_get_default_dtype(void) { return default_dtype; }

const char *kl_version(void) { return KL_VERSION_STRING; }
