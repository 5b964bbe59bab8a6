/*
 * core.h — the eager layer's internal data structures: tensors, storage,
 * dtype helpers, errors and scopes. Every file of src/eager includes it;
 * higher layers (autograd, trace, ir, codegen) include it too, but eager
 * never includes theirs.
 */
#ifndef KE_CORE_H
#define KE_CORE_H

#include "kiln.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define KE_ASSERT(cond)                                                              \
    do {                                                                             \
        if (!(cond)) ke_assert_fail(#cond, __FILE__, __LINE__);                      \
    } while (0)
_Noreturn void ke_assert_fail(const char *what, const char *file, int line);

#define KE_LIKELY(x) __builtin_expect(!!(x), 1)
#define KE_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- dtypes ------------------------------------------------------------- */

typedef enum ke_category { KE_CAT_BOOL, KE_CAT_INT, KE_CAT_FLOAT } ke_category;

typedef struct ke_dtype_info {
    const char *name;     /* PyTorch's name: "float32" */
    const char *short_name; /* "f32" */
    uint8_t size;
    ke_category cat;
    char npy_kind;        /* numpy kind letter: f, i, u, b */
} ke_dtype_info;
extern const ke_dtype_info ke_dtypes[KL_NUM_DTYPES];

static inline int ke_dtype_valid(kl_dtype d) { return (unsigned)d < KL_NUM_DTYPES; }
static inline int ke_is_float(kl_dtype d) { return ke_dtypes[d].cat == KE_CAT_FLOAT; }
static inline int ke_is_int(kl_dtype d) { return ke_dtypes[d].cat == KE_CAT_INT; }
/* The dtype a kernel computes in: f16/bf16 compute in f32. */
static inline kl_dtype ke_compute_dtype(kl_dtype d) {
    return (d == KL_F16 || d == KL_BF16) ? KL_F32 : d;
}

/* f16/bf16 <-> f32 conversion and the per-element casting rules (shared
 * with the CUDA device code, which includes the same header). */
#include "dtype_conv.h"

/* PyTorch's checked conversion of a C scalar into dt: KL_ERR_ARG when v
 * cannot be represented without overflow. Returns 0 or -1. */
int ke_check_scalar_cast(const char *op, double v, kl_dtype dt);

/* Reads element i of a typed buffer as double / writes one (tests, printing,
 * slow paths only). Integer writes saturate nothing: C conversion rules after
 * NaN/range checks (NaN -> 0) so UBSan stays quiet. */
double ke_load_f64(const void *p, kl_dtype d, int64_t i);
void ke_store_f64(void *p, kl_dtype d, int64_t i, double v);
int64_t ke_load_i64(const void *p, kl_dtype d, int64_t i);

/* Converts n contiguous elements between dtypes (the one cast routine). */
void ke_convert(void *dst, kl_dtype dd, const void *src, kl_dtype sd, int64_t n);
/* Same, with element strides (0 broadcasts a scalar). */
void ke_convert_strided(void *dst, kl_dtype dd, int64_t dstride, const void *src, kl_dtype sd,
                        int64_t sstride, int64_t n);

/* ---- errors ------------------------------------------------------------- */

/* Records an error for op (e.g. "add" -> "kl_add: ...") unless one is pending.
 * Returns -1 so callers can `return ke_err(...)`. */
int ke_err(kl_status code, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ke_verr(kl_status code, const char *op, const char *fmt, va_list ap);
int ke_error_pending(void);

/* ---- source locations (srcloc.c; -DKL_TRACK_SOURCE in kiln.h) ------------- */

/* A caller's __FILE__ and __LINE__ (file NULL: unknown). The file string is
 * the caller's literal: it lives as long as the caller's program. */
typedef struct ke_loc {
    const char *file;
    int line;
} ke_loc;
/* The location of the innermost tracked public call running on this thread. */
ke_loc ke_loc_now(void);
/* "file:line" into buf; ":line" when file equals prev_file (lists of nodes
 * from one file); "" when l is unknown. Returns buf. */
const char *ke_loc_fmt(char *buf, size_t cap, ke_loc l, const char *prev_file);
/* An entry point that judges a user callback by "did an error get recorded"
 * (kl_fn_call) sets an earlier, stale error aside first and puts it back
 * after (first error wins), so the stale error cannot change its result. */
typedef struct ke_error_stash {
    kl_status code;
    char msg[1024];
} ke_error_stash;
void ke_error_set_aside(ke_error_stash *s);
void ke_error_put_back(const ke_error_stash *s);
/* "[2,3]" into buf (cap >= 8*22). Returns buf. */
char *ke_fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape);
/* "[2,3] float32 cpu" for error messages. */
char *ke_fmt_tensor(char *buf, size_t cap, const kl_tensor *t);
const char *ke_device_name(kl_device d);

/* ---- storage and tensors ------------------------------------------------ */

typedef enum ke_alloc_kind {
    KE_ALLOC_CPU,      /* from the caching allocator */
    KE_ALLOC_BLOB,     /* user memory, optional deleter */
    KE_ALLOC_NONE,     /* meta: no data */
    KE_ALLOC_DEVICE,   /* a device allocator registered by a backend */
    KE_ALLOC_INLINE    /* small CPU data inside the storage header itself */
} ke_alloc_kind;

/* CPU storages this small keep their data in the header: one allocation
 * instead of two for the scalars and tiny tensors that dominate per-op cost. */
#if defined(__SANITIZE_ADDRESS__)
#define KE_INLINE_BYTES 0 /* every byte through the allocator, so ASan sees misuse */
#else
#define KE_INLINE_BYTES 64
#endif

typedef struct ke_storage {
    _Atomic int32_t refcount;
    uint8_t alloc;                 /* ke_alloc_kind */
    uint8_t in_block;              /* shares one allocation with its first tensor (tensor.c) */
    kl_device device;
    void *data;
    size_t nbytes;
    _Atomic int64_t version;       /* bumped by every in-place write */
    int32_t last_write_op;         /* ke_op of the last in-place write, -1 if none
                                      (autograd names it when a saved tensor is stale) */
    void (*deleter)(void *data, void *ctx);
    void *deleter_ctx;
    struct ke_storage *next_free;
    _Alignas(64) unsigned char inline_data[KE_INLINE_BYTES ? KE_INLINE_BYTES : 1];
} ke_storage;

/* Dispatch keys, low to high priority: the highest key present runs. */
typedef enum ke_key {
    KE_KEY_CPU,
    KE_KEY_CUDA,
    KE_KEY_META,
    KE_KEY_AUTOGRAD,
    KE_KEY_TRACE,
    KE_NUM_KEYS
} ke_key;
typedef uint32_t ke_keyset;
#define KE_KS(k) ((ke_keyset)1u << (k))
#define KE_BACKEND_KEYS (KE_KS(KE_KEY_CPU) | KE_KS(KE_KEY_CUDA) | KE_KS(KE_KEY_META))

#define KE_MAGIC_LIVE 0x4b4c6e54u   /* "KLnT" */
#define KE_MAGIC_DEAD 0xdeadbeefu

enum {
    KE_TF_WRAPPED = 1,   /* a C scalar turned into a 0-dim tensor: lowest promotion priority */
};

struct kl_tensor {
    uint32_t magic;
    _Atomic int32_t refcount;      /* all owners: scope slot, user refs, internal holders */
    _Atomic int32_t user_refs;     /* references given out by kl_retain */
    uint8_t dtype;
    uint8_t ndim;
    uint8_t flags;                 /* KE_TF_* */
    uint8_t keys;                  /* dispatch keys this tensor contributes */
    int32_t scope_slot;            /* index in scope->items, -1 if not scope-owned */
    struct ke_scope *scope;
    ke_storage *storage;
    int64_t offset;                /* in elements */
    int64_t shape[KL_MAX_DIMS];
    int64_t stride[KL_MAX_DIMS];
    void *autograd;                /* owned by the autograd layer (hooks below) */
    int64_t trace_id;              /* IR value id while tracing, else -1 */
    struct kl_tensor *next_free;
};

/* What the layers above eager install into it: the one way eager reaches
 * upward, without naming them (eager <- autograd <- ir <- trace). Installed
 * once by the composition root (src/init.c, kl_init) before the first
 * tensor requires grad or the first trace; NULL entries mean "not linked in". */
struct ke_call;
typedef struct ke_hooks {
    /* Dispatch handlers of the non-backend keys (Autograd, Trace); backend
     * keys are eager's own and must stay NULL here. */
    int (*handler[KE_NUM_KEYS])(struct ke_call *c);
    /* A tensor header with autograd metadata dies: drop the metadata. */
    void (*autograd_free)(kl_tensor *t);
    /* Eager code is about to read t's data while a trace is recording
     * (ke_check_data): the tracer turns it into a trace break. */
    int (*trace_data)(const kl_tensor *t, const char *op);
    /* A backward pass (kl_backward: accumulate; kl_autograd_grad: inputs)
     * starts while a trace is recording: the tracer returns 0 if the graph
     * can express it, else breaks the trace, recording why, and returns -1. */
    int (*trace_backward)(const char *op, int accumulate, int create_graph, int n_in, kl_tensor *const *inputs);
    /* The real device of a traced value (a meta tensor with a trace_id while
     * a trace records): what kl_device_of answers, so code that sends a new
     * tensor to another's device (kl_to_device(t, kl_device_of(x))) traces. */
    kl_device (*trace_device)(const kl_tensor *t);
} ke_hooks;
/* The hooks installed (read on the per-op paths; written only by ke_install_hooks). */
extern ke_hooks ke_hook;
/* Installs h, replacing every hook (NULL removes one): its handlers go into
 * the dispatcher's table, everything into ke_hook. Called once by kl_init
 * (tests install stand-ins and put ke_hook back). (dispatch.c) */
void ke_install_hooks(const ke_hooks *h);

/* Checks a tensor argument: NULL (keeps a pending error or records
 * KL_ERR_NULL_ARG) and freed headers. Returns 0 if usable. */
int ke_check_tensor(const kl_tensor *t, const char *op, int argno);
/* t's device; for a traced value while a trace records, its real device
 * (ke_hooks.trace_device) rather than meta. (tensor.c) */
kl_device ke_device_of(const kl_tensor *t);
static inline int ke_alive(const kl_tensor *t) { return t && t->magic == KE_MAGIC_LIVE; }

/* A new tensor header over storage s (takes a reference to s), not in any scope,
 * refcount 1. Returns NULL (KL_ERR_OOM) on failure. */
kl_tensor *ke_tensor_wrap(ke_storage *s, kl_dtype dt, int ndim, const int64_t *shape,
                          const int64_t *stride, int64_t offset);
/* A new contiguous tensor with fresh storage on dev, not in any scope (header
 * and storage header in one allocation). */
kl_tensor *ke_tensor_new(kl_dtype dt, int ndim, const int64_t *shape, kl_device dev, const char *op);
/* A view header of base (same storage, dtype and flags except wrapped). */
kl_tensor *ke_tensor_view(const kl_tensor *base, int ndim, const int64_t *shape,
                          const int64_t *stride, int64_t offset);
/* Drops one reference held internally. */
void ke_tensor_decref(kl_tensor *t);
static inline void ke_tensor_incref(kl_tensor *t) {
    atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
}

ke_storage *ke_storage_new(size_t nbytes, kl_device dev, const char *op);
ke_storage *ke_storage_blob(void *data, size_t nbytes, void (*deleter)(void *, void *), void *ctx);
/* The same over memory of device dev (DLPack import of device memory): the
 * deleter, not the device's allocator, frees it. */
ke_storage *ke_storage_blob_on(void *data, size_t nbytes, kl_device dev, void (*deleter)(void *, void *),
                               void *ctx);
/* kl_from_blob over memory of device dev (for CUDA: device addresses). */
kl_tensor *ke_from_blob_on(void *data, int ndim, const int64_t *shape, const int64_t *strides, kl_dtype dt,
                           kl_device dev, void (*deleter)(void *data, void *ctx), void *ctx);
void ke_storage_decref(ke_storage *s);
static inline void ke_bump_version(kl_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

/* What a device backend (CUDA: src/codegen_nvrtc/cuda_device.c) gives eager
 * to hold and move data; registered by the composition root (src/init.c).
 * Eager never reads or writes device memory itself: every byte crosses
 * through these. Pointers are device addresses; `dev` is the device index.
 * Every function returns 0, or -1 with an error naming op recorded. */
typedef struct ke_device_ops {
    const char *name; /* "CUDA", for messages */
    /* nbytes of device memory into *out (nbytes 0: *out = NULL, but the
     * device is still checked); "CUDA not available: <reason>" without a driver. */
    int (*alloc)(const char *op, int dev, size_t nbytes, void **out);
    void (*free)(void *p, size_t nbytes, int dev);
    /* Copies n bytes; each returns once the host buffer may be reused (h2d)
     * or read (d2h); d2d is ordered before any later work of this thread. */
    int (*copy_h2d)(const char *op, int dev, void *dst, const void *src, size_t n);
    int (*copy_d2h)(const char *op, int dev, void *dst, const void *src, size_t n);
    int (*copy_d2d)(const char *op, int dst_dev, void *dst, int src_dev, const void *src, size_t n);
    int (*memset)(const char *op, int dev, void *dst, int byte, size_t n);
    /* Waits for every copy and kernel queued by this thread on dev. */
    int (*synchronize)(const char *op, int dev);
} ke_device_ops;
/* Registers the data movers of a device type (only KL_CUDA today). */
void ke_register_device(kl_device_type type, const ke_device_ops *ops);
/* The registered ops of a device type, or NULL. The first ask for CUDA
 * calls kl_init() (the composition root registers CUDA there), so a program
 * that never names a CUDA device never joins, loads or pays for it. */
const ke_device_ops *ke_device_ops_of(kl_device_type type);
/* 1 if tensors can be allocated on devices of this type (for CUDA: its
 * movers are registered; whether a driver exists is known at allocation). */
int ke_device_available(kl_device_type type);

/* In integers: an empty tensor's storage (from DLPack, say) may hold NULL,
 * and NULL + 0 is undefined behaviour in C (UBSan's pointer-overflow). */
static inline char *ke_data(const kl_tensor *t) {
    return (char *)((uintptr_t)t->storage->data + (uintptr_t)(t->offset * (int64_t)ke_dtypes[t->dtype].size));
}
static inline int64_t ke_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}
static inline int ke_same_shape(int ndim, const int64_t *a, const int64_t *b) {
    for (int i = 0; i < ndim; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}
/* Contiguous strides for shape (size-1 and size-0 dims count as 1). */
static inline void ke_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}
/* 1 if t's elements are laid out row-major without gaps (size-1 dims may
 * have any stride). Inline: the small-op path asks it per operand. */
static inline int ke_is_contig(const kl_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0) return 1;
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}
/* The checked size arithmetic of every shape rule: *r = a * b (a + b);
 * returns 1, *r unspecified, when the exact result does not fit in int64. */
static inline int ke_mul_ov(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }
static inline int ke_add_ov(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }
/* Checks a shape: dims >= 0, ndim <= 8, numel * elsize fits in int64. */
int ke_check_shape(const char *op, int ndim, const int64_t *shape, kl_dtype dt);
/* Wraps a negative dim; records KL_ERR_INDEX and returns -1 if out of range.
 * ndim 0 accepts dim 0 and -1 as PyTorch does. */
int ke_wrap_dim(const char *op, int64_t dim, int ndim);
static inline ke_keyset ke_device_key(kl_device d) {
    switch (d.type) {
    case KL_CUDA: return KE_KS(KE_KEY_CUDA);
    case KL_META: return KE_KS(KE_KEY_META);
    default: return KE_KS(KE_KEY_CPU);
    }
}

/* A wrapped C scalar (0-dim, KE_TF_WRAPPED): integral values become i64,
 * others f64 — the dtype only says the category; promotion rules decide. */
kl_tensor *ke_wrap_scalar(double v);

/* ---- scopes -------------------------------------------------------------- */

typedef struct ke_scope {
    kl_tensor **items;
    int32_t n, cap;
    int32_t live;       /* non-NULL items */
} ke_scope;

/* Puts a fresh tensor (refcount 1, not scope-owned) into the current scope. */
void ke_scope_adopt(kl_tensor *t);
/* Arms this thread's exit hook (once per thread): at exit its scopes close,
 * innermost first, then ke_tensor_thread_exit gives its free lists back. */
void ke_scope_thread_init(void);
void ke_tensor_thread_exit(void);

/* ---- thread-local state -------------------------------------------------- */

typedef struct ke_tls {
    ke_keyset include;        /* keys forced on (Trace while tracing) */
    ke_keyset exclude;        /* keys masked off (below autograd, no-grad) */
    kl_device default_device;
} ke_tls;
ke_tls *ke_tls_get(void);
extern _Thread_local ke_tls ke_tls_state;

/* Accessors that read data (item, data_ptr, printing values, comparisons,
 * saving) call this first. While a function is traced, no data may be read:
 * traced tensors have none, and a value read from a captured tensor would be
 * baked into the graph. The trace layer's hook turns the call into a trace
 * break, recording why. */
static inline int ke_check_data(const kl_tensor *t, const char *op) {
    if (KE_UNLIKELY((ke_tls_state.include & ~ke_tls_state.exclude) & KE_KS(KE_KEY_TRACE)) && ke_hook.trace_data)
        return ke_hook.trace_data(t, op);
    return 0;
}

/* Backward passes call this first: during a trace, one the graph cannot
 * express (gradients accumulating into a captured tensor's .grad) becomes a
 * trace break, and the signature runs eagerly, as for ke_check_data. */
static inline int ke_check_backward(const char *op, int accumulate, int create_graph, int n_in,
                                    kl_tensor *const *inputs) {
    if (KE_UNLIKELY((ke_tls_state.include & ~ke_tls_state.exclude) & KE_KS(KE_KEY_TRACE)) && ke_hook.trace_backward)
        return ke_hook.trace_backward(op, accumulate, create_graph, n_in, inputs);
    return 0;
}

#endif /* KE_CORE_H */
