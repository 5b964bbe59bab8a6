/*
 * kiln.h — Kiln, a tensor library in C: PyTorch's way of working, without Python.
 *
 * TUTORIAL
 *
 * Tensors. A kl_tensor is an opaque, refcounted view (dtype, shape, strides,
 * offset) over refcounted storage on one device. Views (kl_reshape, kl_permute,
 * kl_slice, ...) share storage and never copy.
 *
 * Ownership: scopes. Every tensor an op returns belongs to the innermost open
 * scope of the calling thread. There is always an implicit root scope.
 *
 *     kl_scope_begin();
 *     kl_tensor *y = kl_add(kl_mul(a, b), c);   // the temporary a*b is owned too
 *     kl_keep(y);                               // move y to the enclosing scope
 *     kl_scope_end();                           // frees a*b; y survives
 *
 * Arguments are always borrowed: no function steals a reference. kl_retain
 * gives the caller its own reference (for long-lived tensors such as
 * parameters); kl_release gives it back. Scopes close in strict LIFO order.
 * Scopes are per thread; when a thread exits, its open scopes and its root
 * scope close (innermost first), releasing what they own: to hand a tensor
 * to another thread that outlives its maker, kl_retain it (the reference can
 * be given back with kl_release on any thread).
 *
 * Errors. An op that fails returns NULL (or a negative status) and records a
 * thread-local error: a code and a message naming the op, shapes, dtypes and
 * devices. An op given NULL returns NULL and keeps the first error, so a chain
 * needs one check at its end:
 *
 *     kl_tensor *z = kl_softmax(kl_matmul(x, w), -1);
 *     if (!z) fprintf(stderr, "%s\n", kl_last_error());
 *     kl_clear_error();
 *
 * Set KL_ABORT_ON_ERROR=1 to abort() at the failing call (for gdb).
 *
 * A worked example:
 *
 *     kl_manual_seed(0);
 *     kl_tensor *x = kl_randn(KL_SHAPE(4, 3), KL_F32);
 *     kl_tensor *w = kl_ones(KL_SHAPE(3, 2), KL_F32);
 *     kl_tensor *y = kl_relu(kl_matmul(x, w));
 *     kl_print(kl_sum(y, KL_DIMS(-1), false));
 *
 * Conventions. Shapes and dim lists are passed as (count, pointer); the
 * KL_SHAPE / KL_DIMS macros build both from a literal list (C only: they use
 * compound literals). Negative dims count from the end as in PyTorch.
 * `_inplace` ops write into their first argument, bump its version counter and
 * return that same pointer (no new reference), or NULL on error.
 *
 * Undetectable misuse (documented, not checked): using a tensor pointer after
 * its last reference is gone is reported as KL_ERR_FREED while the header has
 * not been reused; once the header is handed to a new tensor, the old pointer
 * silently names the new tensor. Writing through kl_data_ptr of a tensor
 * that autograd saved, or of a borrowed blob after its owner freed it, is not
 * detected. Tensors may be passed between threads but not used by two
 * threads at once while one of them writes.
 *
 * THREAD SAFETY
 *
 * Kiln is serialized where it must be and free elsewhere (SQLite's
 * "multi-thread" mode, with the exceptions below made safe). Checked by
 * tests/test_threads.c under ThreadSanitizer (scripts/kiln.sh tsan).
 *  - Tensors: any number of threads may read one tensor at once (ops on it,
 *    kl_retain/kl_release: refcounts are atomic). A thread that writes a
 *    tensor (an _inplace op, kl_copy_, kl_data_ptr stores, an optimizer step)
 *    must be the only one using it, or any view of its storage, meanwhile.
 *  - Per thread: scopes, the error record, grad mode, the default device.
 *    When a thread exits, its open scopes and its root scope close
 *    (innermost first); a tensor it kl_retain'ed survives and may be
 *    kl_release'd by any thread. Scopes are never shared: closing a scope
 *    opened on another thread aborts (a bug).
 *  - Compiled functions: one kl_fn may be called from many threads at once.
 *    The first call of a new signature traces under the function's lock;
 *    callers racing on it wait and then run the one cached graph (fn is
 *    traced exactly once per signature). kl_fn_release only when no call is
 *    running.
 *  - Autograd: forward ops recording history may run on many threads on
 *    separate tensors; backward passes (kl_backward, kl_autograd_grad) take
 *    one process-wide lock: one backward at a time, the others wait. Two
 *    threads must not backward through the same graph or accumulate into the
 *    same leaf's grad concurrently with reading it.
 *  - Process-wide settings (kl_set_num_threads, kl_set_print_options,
 *    kl_set_default_dtype, kl_manual_seed, KL_LOG): set them before
 *    starting threads; kl_set_num_threads must not run while another thread
 *    runs ops. Random ops may run on many threads; each draw reserves its own
 *    counters under a lock, so the numbers a thread gets depend on the order
 *    of the draws.
 *  - The kernel cache folder (KL_CACHE_DIR) may be shared by any number of
 *    processes and threads: entries are written atomically and checked
 *    when read.
 *
 * LIMITS
 *
 *  - Dims: at most KL_MAX_DIMS (8); a shape's element count times 16 must fit
 *    in int64 (KL_ERR_OVERFLOW).
 *  - Scope nesting: 1023 scopes per thread above the root; one more
 *    kl_scope_begin is KL_ERR_STATE and shares the innermost scope (each
 *    begin still takes its end).
 *  - Compiled functions: recompile_limit in [1, 1024] (default 8) signatures
 *    are traced; later new signatures run eagerly.
 *  - Print options: precision in [0, 64] (larger values print 64 digits),
 *    threshold >= 0, edgeitems >= 1, linewidth >= 1; a value below its
 *    minimum keeps the setting.
 *  - Memory-mapped .npy: kl_load_npy maps the file copy-on-write, so writing
 *    to the tensor never changes the file, but a later rewrite of the file
 *    in place by another process may show through and truncating it raises
 *    SIGBUS on access (as with any mmap). kl_load_npy_copy reads the file
 *    into memory instead (no mapping is kept).
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KL_API
#  if defined(KL_BUILDING_LIBRARY)
#    define KL_API __attribute__((visibility("default")))
#  else
#    define KL_API
#  endif
#endif

/* ------------------------------------------------------------------------ */
/* Basic types                                                              */
/* ------------------------------------------------------------------------ */

#define KL_MAX_DIMS 8

typedef struct kl_tensor kl_tensor;

/* Element types. Enums only grow at the end. f16/bf16 compute in f32 on CPU. */
typedef enum kl_dtype {
    KL_F32,
    KL_F64,
    KL_F16,
    KL_BF16,
    KL_I32,
    KL_I64,
    KL_U8,
    KL_BOOL,
    KL_NUM_DTYPES
} kl_dtype;

typedef enum kl_device_type {
    KL_CPU,
    KL_CUDA,
    KL_META      /* shapes and dtypes only, no data: used for tracing */
} kl_device_type;

typedef struct kl_device {
    kl_device_type type;
    int index;
} kl_device;

#define KL_DEVICE_CPU  ((kl_device){KL_CPU, 0})
#define KL_DEVICE_META ((kl_device){KL_META, 0})

/* Builds "count, array" from a literal list: kl_zeros(KL_SHAPE(2, 3), KL_F32). */
#define KL_SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
#define KL_DIMS(...) KL_SHAPE(__VA_ARGS__)
/* No dims: reduce over all of them. */
#define KL_ALL_DIMS 0, NULL

typedef enum kl_reduction { KL_REDUCE_NONE, KL_REDUCE_MEAN, KL_REDUCE_SUM } kl_reduction;

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* Status codes: one table gives names and descriptions (libuv's map). */
#define KL_STATUS_MAP(X)                                                   \
    X(OK,          0, "no error")                                         \
    X(NULL_ARG,   -1, "a NULL tensor or pointer argument")                \
    X(SHAPE,      -2, "incompatible or invalid shapes")                   \
    X(DTYPE,      -3, "unsupported or incompatible dtypes")               \
    X(DEVICE,     -4, "tensors on different or unsupported devices")      \
    X(INDEX,      -5, "dimension or index out of range")                  \
    X(ARG,        -6, "invalid argument value")                           \
    X(OOM,        -7, "out of memory")                                    \
    X(FREED,      -8, "use of a released tensor")                         \
    X(STATE,      -9, "invalid call for the current state")               \
    X(IO,        -10, "file input/output failed")                         \
    X(FORMAT,    -11, "malformed file or buffer")                         \
    X(UNSUPPORTED,-12, "operation not supported for these arguments")     \
    X(OVERFLOW,  -13, "size computation overflows")                       \
    X(INTERNAL,  -14, "internal error")

typedef enum kl_status {
#define KL_STATUS_ENUM_(name, code, desc) KL_ERR_##name = (code),
    KL_STATUS_MAP(KL_STATUS_ENUM_)
#undef KL_STATUS_ENUM_
} kl_status;
#define KL_OK KL_ERR_OK

/* Code of the first error recorded on this thread since the last clear, or KL_OK. */
KL_API kl_status kl_last_status(void);
/* Message of that error ("" if none), e.g. "kl_add: shapes [2,3] and [4] cannot broadcast".
 * The pointer stays valid until the next kl_clear_error on this thread. */
KL_API const char *kl_last_error(void);
/* Clears this thread's error record. */
KL_API void kl_clear_error(void);
/* "KL_ERR_SHAPE" etc.; "KL_ERR_UNKNOWN" for values outside the table. */
KL_API const char *kl_status_name(kl_status s);
/* The table's one-line description of a status. */
KL_API const char *kl_status_string(kl_status s);

/* Source locations. Compile your own files with -DKL_TRACK_SOURCE (before
 * including kiln.h) and every public op call records its caller's
 * __FILE__:__LINE__: kiln/srcloc.h, generated from this header, defines one
 * function-like macro per op, kl_add(...) becoming
 * kl__loc_end((kl__loc(__FILE__, __LINE__), kl_add(...))). The location then
 * shows in error messages (kl_last_error ends "at file:line"), on the nodes of
 * traced graphs (the IR text, "@ file:line"), in kl_fn_explain's kernels
 * ("kernel 0 = mlp.c:41 add, :42 gelu"), in autograd anomaly reports (the
 * failing node's forward line) and in the profiler's op events (args "loc").
 * Without the define nothing changes: the library itself is the same build
 * either way and its op path never looks at locations. Files with and without
 * the define mix freely; ops called from inside a tracked call (a composite's
 * pieces, the user function of a kl_fn_call) report the innermost tracked line.
 * The macros take the op names, so &kl_add still names the function; a file
 * that #undefs one gets the plain call. The three functions below are the
 * macros' runtime, not for direct use: kl__loc pushes a location on this
 * thread's stack, kl__loc_end / kl__loc_end_int pop it and return r. */
KL_API void kl__loc(const char *file, int line);
KL_API kl_tensor *kl__loc_end(kl_tensor *r);
KL_API int kl__loc_end_int(int r);

/* ------------------------------------------------------------------------ */
/* Version, threads, memory                                                 */
/* ------------------------------------------------------------------------ */

/* "MAJOR.MINOR.PATCH" of the library actually linked. */
KL_API const char *kl_version(void);
/* One line describing the build and what runs it, for benchmark headers:
 * the version, Kiln's thread count, the OpenBLAS kernel in use
 * (openblas_get_corename; whether OPENBLAS_CORETYPE forced it), OpenBLAS's
 * thread count (set to Kiln's at each matmul) and its build config. The
 * string belongs to the calling thread and lives until its next call. */
KL_API const char *kl_config_string(void);
/* Joins the library's layers (autograd, tracing, kernel backends) once,
 * thread-safely; every entry point that needs them calls it, so calling it
 * yourself is never required. */
KL_API void kl_init(void);
/* Threads used by Kiln's own pool (default: $KL_NUM_THREADS or the CPU count). */
KL_API int kl_get_num_threads(void);
/* Sets the pool size (n < 1 means 1). Not while another thread runs Kiln ops. */
KL_API void kl_set_num_threads(int n);
/* Returns cached free blocks of the CPU caching allocator to the system. */
KL_API void kl_empty_cache(void);
/* Live tensor headers and storages in the process (leak checks in tests). */
KL_API int64_t kl_live_tensors(void);
KL_API int64_t kl_live_storages(void);

/* ------------------------------------------------------------------------ */
/* Ownership                                                                */
/* ------------------------------------------------------------------------ */

/* Opens a scope on this thread (later results belong to it); past 1023 levels KL_ERR_STATE (docs/HARDENING.md). */
KL_API void kl_scope_begin(void);
/* Closes the innermost scope, releasing what it owns. Aborts (a bug) if no
 * scope is open or a scope opened on another thread is closed here. */
KL_API void kl_scope_end(void);
/* (A thread's exit closes its open scopes and root scope: see the tutorial.)
 * Number of open scopes above the implicit root on this thread. */
KL_API int kl_scope_depth(void);
/* Moves t from the scope that owns it to the scope enclosing that one; in the
 * root scope (or not scope-owned) it does nothing. Returns t (NULL passes through). */
KL_API kl_tensor *kl_keep(kl_tensor *t);
/* Gives the caller its own reference to t, independent of scopes. Returns t. */
KL_API kl_tensor *kl_retain(kl_tensor *t);
/* Drops a reference the caller owns: one from kl_retain first; otherwise the
 * owning scope's, which frees t early. KL_ERR_STATE if the caller owns none. */
KL_API void kl_release(kl_tensor *t);

/* ------------------------------------------------------------------------ */
/* dtypes and devices                                                       */
/* ------------------------------------------------------------------------ */

/* Bytes per element (0 for an invalid dtype). */
KL_API size_t kl_dtype_size(kl_dtype dt);
/* "float32", "int64", ... as PyTorch names them; "invalid" otherwise. */
KL_API const char *kl_dtype_name(kl_dtype dt);
KL_API bool kl_dtype_is_floating(kl_dtype dt);
/* The dtype PyTorch's type promotion gives a op(a, b) of two dimensioned tensors. */
KL_API kl_dtype kl_promote_types(kl_dtype a, kl_dtype b);
/* The device creation ops use on this thread (default CPU). */
KL_API void kl_set_default_device(kl_device d);
KL_API kl_device kl_get_default_device(void);
/* The dtype creation ops use when a float is asked for without one (KL_F32). */
KL_API void kl_set_default_dtype(kl_dtype dt);
KL_API kl_dtype kl_get_default_dtype(void);

/* ------------------------------------------------------------------------ */
/* Accessors (borrowed tensor, no allocation)                                */
/* ------------------------------------------------------------------------ */

KL_API int kl_ndim(const kl_tensor *t);                  /* -1 on NULL/freed */
KL_API const int64_t *kl_shape(const kl_tensor *t);      /* NULL on NULL/freed */
KL_API const int64_t *kl_stride(const kl_tensor *t);     /* in elements */
KL_API int64_t kl_size(const kl_tensor *t, int dim);     /* -1 and KL_ERR_INDEX if bad dim */
KL_API int64_t kl_numel(const kl_tensor *t);             /* -1 on NULL */
KL_API int64_t kl_storage_offset(const kl_tensor *t);
KL_API kl_dtype kl_dtype_of(const kl_tensor *t);         /* KL_NUM_DTYPES on NULL */
KL_API kl_device kl_device_of(const kl_tensor *t);
KL_API bool kl_is_contiguous(const kl_tensor *t);
/* Version counter of t's storage: bumped by every in-place write. */
KL_API int64_t kl_version_of(const kl_tensor *t);
/* Pointer to element [0,...,0]. On CUDA it is the device address (as
 * PyTorch's data_ptr): pass it to CUDA code, never dereference it on the host.
 * NULL and an error for meta tensors. */
KL_API void *kl_data_ptr(const kl_tensor *t);
/* The value of a one-element tensor as double (a CUDA tensor's is copied to
 * the host, waiting for the work queued before it); NaN and an error otherwise. */
KL_API double kl_item(const kl_tensor *t);
/* The value of a one-element integer/bool tensor, exact; 0 and an error otherwise. */
KL_API int64_t kl_item_int(const kl_tensor *t);
/* 1 if t and u share storage, 0 if not, -1 on error. */
KL_API int kl_shares_storage(const kl_tensor *t, const kl_tensor *u);

/* ------------------------------------------------------------------------ */
/* Creation (on the default device; results owned by the current scope)      */
/* ------------------------------------------------------------------------ */

KL_API kl_tensor *kl_empty(int ndim, const int64_t *shape, kl_dtype dt);
KL_API kl_tensor *kl_empty_on(int ndim, const int64_t *shape, kl_dtype dt, kl_device dev);
KL_API kl_tensor *kl_zeros(int ndim, const int64_t *shape, kl_dtype dt);
KL_API kl_tensor *kl_ones(int ndim, const int64_t *shape, kl_dtype dt);
KL_API kl_tensor *kl_full(int ndim, const int64_t *shape, double value, kl_dtype dt);
/* 0-dim tensor holding value. */
KL_API kl_tensor *kl_scalar_tensor(double value, kl_dtype dt);
/* [start, end) by step, as torch.arange (length ceil((end-start)/step)). */
KL_API kl_tensor *kl_arange(double start, double end, double step, kl_dtype dt);
/* steps evenly spaced values from start to end inclusive. */
KL_API kl_tensor *kl_linspace(double start, double end, int64_t steps, kl_dtype dt);
/* n x m identity (m < 0 means m = n). */
KL_API kl_tensor *kl_eye(int64_t n, int64_t m, kl_dtype dt);
KL_API kl_tensor *kl_empty_like(const kl_tensor *t);
KL_API kl_tensor *kl_zeros_like(const kl_tensor *t);
KL_API kl_tensor *kl_ones_like(const kl_tensor *t);
KL_API kl_tensor *kl_full_like(const kl_tensor *t, double value);
KL_API kl_tensor *kl_rand_like(const kl_tensor *t);
KL_API kl_tensor *kl_randn_like(const kl_tensor *t);
/* Copies numel(shape) contiguous elements of dtype dt from data. */
KL_API kl_tensor *kl_from_data(const void *data, int ndim, const int64_t *shape, kl_dtype dt);
/* Borrows user memory (CPU): no copy. strides NULL means contiguous. When the
 * last reference goes, deleter(data, ctx) is called if not NULL. The memory
 * must stay valid and suitably aligned for dt until then. */
KL_API kl_tensor *kl_from_blob(void *data, int ndim, const int64_t *shape, const int64_t *strides,
                               kl_dtype dt, void (*deleter)(void *data, void *ctx), void *ctx);
/* A new contiguous tensor with t's values. */
KL_API kl_tensor *kl_clone(kl_tensor *t);
/* t's values in contiguous layout: a new view of t if already contiguous. */
KL_API kl_tensor *kl_contiguous(kl_tensor *t);
/* t converted to dt (a new view of t if already dt). */
KL_API kl_tensor *kl_to_dtype(kl_tensor *t, kl_dtype dt);
/* t on dev (a new view of t if already there, as PyTorch's .to). Any
 * direction between the CPU and CUDA devices (docs/GPU.md), differentiable;
 * a CUDA device's first use loads the driver ("CUDA not available: <reason>"
 * and KL_ERR_DEVICE without one). */
KL_API kl_tensor *kl_to_device(kl_tensor *t, kl_device dev);
/* Copies src into dst (broadcasting src, converting dtype); dst and src may
 * be on different devices (CPU and CUDA). Returns dst. */
KL_API kl_tensor *kl_copy_inplace(kl_tensor *dst, kl_tensor *src);
/* Sets every element of t to value. Returns t. */
KL_API kl_tensor *kl_fill_inplace(kl_tensor *t, double value);
KL_API kl_tensor *kl_zero_inplace(kl_tensor *t);

/* ------------------------------------------------------------------------ */
/* Random (Philox 4x32-10: same seed, same numbers on any thread count)      */
/* ------------------------------------------------------------------------ */

/* Seeds the default generator and resets its offset. */
KL_API void kl_manual_seed(uint64_t seed);
KL_API uint64_t kl_initial_seed(void);
/* Uniform in [0, 1). */
KL_API kl_tensor *kl_rand(int ndim, const int64_t *shape, kl_dtype dt);
/* Standard normal. */
KL_API kl_tensor *kl_randn(int ndim, const int64_t *shape, kl_dtype dt);
/* Uniform integers in [low, high). */
KL_API kl_tensor *kl_randint(int64_t low, int64_t high, int ndim, const int64_t *shape, kl_dtype dt);
/* 1 with probability p[i], else 0; same dtype as p (floating). */
KL_API kl_tensor *kl_bernoulli(kl_tensor *p);
/* int64 category indices drawn from each row of probs ([n] or [rows, n],
 * floating, non-negative, unnormalized): [num_samples] or [rows, num_samples].
 * Without replacement the indices of a row are distinct and num_samples may
 * not exceed its non-zero categories. Zero-probability categories are never
 * drawn. Reproducible from kl_manual_seed. KL_ERR_ARG for negative, NaN or
 * infinite probabilities, an all-zero row, num_samples <= 0. */
KL_API kl_tensor *kl_multinomial(kl_tensor *probs, int64_t num_samples, bool replacement);

/* ------------------------------------------------------------------------ */
/* Views (share storage with their input, never copy)                        */
/* ------------------------------------------------------------------------ */

/* View if strides allow, else a copy. One dim may be -1. */
KL_API kl_tensor *kl_reshape(kl_tensor *t, int ndim, const int64_t *shape);
/* Always a view; KL_ERR_SHAPE if t's strides do not allow it. */
KL_API kl_tensor *kl_view(kl_tensor *t, int ndim, const int64_t *shape);
KL_API kl_tensor *kl_permute(kl_tensor *t, int ndim, const int64_t *dims);
KL_API kl_tensor *kl_transpose(kl_tensor *t, int dim0, int dim1);
/* Transpose of a tensor with at most 2 dims. */
KL_API kl_tensor *kl_t(kl_tensor *t);
/* Broadcast view; -1 keeps a dim. */
KL_API kl_tensor *kl_expand(kl_tensor *t, int ndim, const int64_t *shape);
KL_API kl_tensor *kl_broadcast_to(kl_tensor *t, int ndim, const int64_t *shape);
/* Removes dim if it has size 1 (else a view of t unchanged). */
KL_API kl_tensor *kl_squeeze(kl_tensor *t, int dim);
/* Removes every size-1 dim. */
KL_API kl_tensor *kl_squeeze_all(kl_tensor *t);
KL_API kl_tensor *kl_unsqueeze(kl_tensor *t, int dim);
KL_API kl_tensor *kl_flatten(kl_tensor *t, int start_dim, int end_dim);
/* t[start:end:step] along dim, Python slice semantics (clamped; INT64_MAX = to the end). step > 0. */
KL_API kl_tensor *kl_slice(kl_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
KL_API kl_tensor *kl_narrow(kl_tensor *t, int dim, int64_t start, int64_t length);
/* Removes dim by taking index (negative counts from the end). */
KL_API kl_tensor *kl_select(kl_tensor *t, int dim, int64_t index);
/* A new view of t with a given shape, strides and offset (elements, from the
 * start of t's storage); it must lie inside that storage. Inside a compiled
 * function, over an input or captured tensor (or a view of one), it is a
 * trace break: that signature runs eagerly (the caller's storage is not part
 * of the graph). */
KL_API kl_tensor *kl_as_strided(kl_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                                int64_t offset);

/* ------------------------------------------------------------------------ */
/* Elementwise, unary: kl_<op>(x) returns a new tensor of x's shape;        */
/* kl_<op>_inplace(x) writes into x and returns x (the result dtype must be */
/* castable to x's, PyTorch's can_cast, else KL_ERR_DTYPE). Dtype rules:    */
/*   same      the result has x's dtype;                                    */
/*   float     integers and bool compute in the default float dtype (f32),  */
/*             f16/bf16 compute in f32 and round once;                      */
/*   float-only  floating x only, else KL_ERR_DTYPE.                        */
/* A dtype an op refuses is KL_ERR_DTYPE naming the op and x; NULL x gives  */
/* NULL and keeps the first error. Activations with parameters (logit,      */
/* leaky_relu, elu, celu, hardtanh) take them as doubles after x, in both   */
/* forms. Every function here is generated from its op table row            */
/* (src/eager/ops_unary.def).                                               */
/* ------------------------------------------------------------------------ */

/* -x; same dtype, integers wrap (the most negative value stays itself); bool refused. */
KL_API kl_tensor *kl_neg(kl_tensor *x);
KL_API kl_tensor *kl_neg_inplace(kl_tensor *x);
/* |x|; same dtype, abs(-0.0) = +0.0, integers wrap at the most negative value; bool refused. */
KL_API kl_tensor *kl_abs(kl_tensor *x);
KL_API kl_tensor *kl_abs_inplace(kl_tensor *x);
/* -1, 0 or 1 by the sign of x (sign(NaN) = 0, bool unchanged); same dtype. */
KL_API kl_tensor *kl_sign(kl_tensor *x);
KL_API kl_tensor *kl_sign_inplace(kl_tensor *x);
/* e^x; float rule. */
KL_API kl_tensor *kl_exp(kl_tensor *x);
KL_API kl_tensor *kl_exp_inplace(kl_tensor *x);
/* 2^x; float rule. */
KL_API kl_tensor *kl_exp2(kl_tensor *x);
KL_API kl_tensor *kl_exp2_inplace(kl_tensor *x);
/* e^x - 1, accurate near 0; float rule. */
KL_API kl_tensor *kl_expm1(kl_tensor *x);
KL_API kl_tensor *kl_expm1_inplace(kl_tensor *x);
/* Natural log (NaN below 0, -inf at 0); float rule. */
KL_API kl_tensor *kl_log(kl_tensor *x);
KL_API kl_tensor *kl_log_inplace(kl_tensor *x);
/* Base-2 log; float rule. */
KL_API kl_tensor *kl_log2(kl_tensor *x);
KL_API kl_tensor *kl_log2_inplace(kl_tensor *x);
/* log(1 + x), accurate near 0; float rule. */
KL_API kl_tensor *kl_log1p(kl_tensor *x);
KL_API kl_tensor *kl_log1p_inplace(kl_tensor *x);
/* Square root (NaN below 0); float rule. */
KL_API kl_tensor *kl_sqrt(kl_tensor *x);
KL_API kl_tensor *kl_sqrt_inplace(kl_tensor *x);
/* 1 / sqrt(x); float rule. */
KL_API kl_tensor *kl_rsqrt(kl_tensor *x);
KL_API kl_tensor *kl_rsqrt_inplace(kl_tensor *x);
/* x * x; same dtype (integers wrap), except bool, which squares to int64 as pow(x, 2). */
KL_API kl_tensor *kl_square(kl_tensor *x);
KL_API kl_tensor *kl_square_inplace(kl_tensor *x);
/* 1 / x (inf at 0); float rule. */
KL_API kl_tensor *kl_reciprocal(kl_tensor *x);
KL_API kl_tensor *kl_reciprocal_inplace(kl_tensor *x);
/* sin(x), radians; float rule. */
KL_API kl_tensor *kl_sin(kl_tensor *x);
KL_API kl_tensor *kl_sin_inplace(kl_tensor *x);
/* cos(x), radians; float rule. */
KL_API kl_tensor *kl_cos(kl_tensor *x);
KL_API kl_tensor *kl_cos_inplace(kl_tensor *x);
/* tan(x), radians; float rule. */
KL_API kl_tensor *kl_tan(kl_tensor *x);
KL_API kl_tensor *kl_tan_inplace(kl_tensor *x);
/* Hyperbolic tangent; float rule. */
KL_API kl_tensor *kl_tanh(kl_tensor *x);
KL_API kl_tensor *kl_tanh_inplace(kl_tensor *x);
/* 1 / (1 + e^-x); float rule. */
KL_API kl_tensor *kl_sigmoid(kl_tensor *x);
KL_API kl_tensor *kl_sigmoid_inplace(kl_tensor *x);
/* max(x, 0), keeping -0.0 and NaN; same dtype (the identity on uint8); bool refused. */
KL_API kl_tensor *kl_relu(kl_tensor *x);
KL_API kl_tensor *kl_relu_inplace(kl_tensor *x);
/* x * Phi(x), the exact erf form of GELU; float-only. */
KL_API kl_tensor *kl_gelu(kl_tensor *x);
KL_API kl_tensor *kl_gelu_inplace(kl_tensor *x);
/* GELU's tanh approximation (PyTorch's approximate='tanh'); float-only. */
KL_API kl_tensor *kl_gelu_tanh(kl_tensor *x);
KL_API kl_tensor *kl_gelu_tanh_inplace(kl_tensor *x);
/* x * sigmoid(x) (SiLU, swish); float-only. */
KL_API kl_tensor *kl_silu(kl_tensor *x);
KL_API kl_tensor *kl_silu_inplace(kl_tensor *x);
/* log(1 + e^x) with beta 1, and x itself above 20 (PyTorch's threshold); float-only. */
KL_API kl_tensor *kl_softplus(kl_tensor *x);
KL_API kl_tensor *kl_softplus_inplace(kl_tensor *x);
/* The error function; float rule. */
KL_API kl_tensor *kl_erf(kl_tensor *x);
KL_API kl_tensor *kl_erf_inplace(kl_tensor *x);
/* Round toward -inf; same dtype (the identity on integers); bool refused. */
KL_API kl_tensor *kl_floor(kl_tensor *x);
KL_API kl_tensor *kl_floor_inplace(kl_tensor *x);
/* Round toward +inf; same dtype (the identity on integers); bool refused. */
KL_API kl_tensor *kl_ceil(kl_tensor *x);
KL_API kl_tensor *kl_ceil_inplace(kl_tensor *x);
/* Round to nearest, halves to even (torch.round); same dtype (identity on integers); bool refused. */
KL_API kl_tensor *kl_round(kl_tensor *x);
KL_API kl_tensor *kl_round_inplace(kl_tensor *x);
/* Round toward 0; same dtype (the identity on integers); bool refused. */
KL_API kl_tensor *kl_trunc(kl_tensor *x);
KL_API kl_tensor *kl_trunc_inplace(kl_tensor *x);
/* x == 0, as bool (in place: 0/1 in x's dtype); any dtype. */
KL_API kl_tensor *kl_logical_not(kl_tensor *x);
KL_API kl_tensor *kl_logical_not_inplace(kl_tensor *x);
/* ~x for integers, !x for bool; same dtype; floating x refused. */
KL_API kl_tensor *kl_bitwise_not(kl_tensor *x);
KL_API kl_tensor *kl_bitwise_not_inplace(kl_tensor *x);
/* Hyperbolic sine, float rule. */
KL_API kl_tensor *kl_sinh(kl_tensor *x);
KL_API kl_tensor *kl_sinh_inplace(kl_tensor *x);
/* Hyperbolic cosine, float rule. */
KL_API kl_tensor *kl_cosh(kl_tensor *x);
KL_API kl_tensor *kl_cosh_inplace(kl_tensor *x);
/* Arc sine in [-pi/2, pi/2], float rule; NaN outside [-1, 1]. */
KL_API kl_tensor *kl_asin(kl_tensor *x);
KL_API kl_tensor *kl_asin_inplace(kl_tensor *x);
/* Arc cosine in [0, pi], float rule; NaN outside [-1, 1]. */
KL_API kl_tensor *kl_acos(kl_tensor *x);
KL_API kl_tensor *kl_acos_inplace(kl_tensor *x);
/* Arc tangent in (-pi/2, pi/2), float rule. */
KL_API kl_tensor *kl_atan(kl_tensor *x);
KL_API kl_tensor *kl_atan_inplace(kl_tensor *x);
/* Inverse hyperbolic sine, float rule. */
KL_API kl_tensor *kl_asinh(kl_tensor *x);
KL_API kl_tensor *kl_asinh_inplace(kl_tensor *x);
/* Inverse hyperbolic cosine, float rule; NaN below 1. */
KL_API kl_tensor *kl_acosh(kl_tensor *x);
KL_API kl_tensor *kl_acosh_inplace(kl_tensor *x);
/* Inverse hyperbolic tangent, float rule; +-inf at +-1, NaN beyond. */
KL_API kl_tensor *kl_atanh(kl_tensor *x);
KL_API kl_tensor *kl_atanh_inplace(kl_tensor *x);
/* Base-10 logarithm, float rule; -inf at 0, NaN below. */
KL_API kl_tensor *kl_log10(kl_tensor *x);
KL_API kl_tensor *kl_log10_inplace(kl_tensor *x);
/* log(x / (1 - x)), float rule; with eps >= 0, x is first clamped to
 * [eps, 1 - eps]; a negative eps means none (PyTorch's eps=None). */
KL_API kl_tensor *kl_logit(kl_tensor *x, double eps);
KL_API kl_tensor *kl_logit_inplace(kl_tensor *x, double eps);
/* x > 0 ? x : negative_slope * x (PyTorch's default slope is 0.01), float-only. */
KL_API kl_tensor *kl_leaky_relu(kl_tensor *x, double negative_slope);
KL_API kl_tensor *kl_leaky_relu_inplace(kl_tensor *x, double negative_slope);
/* x > 0 ? x : alpha * (exp(x) - 1) (default alpha 1), float-only. */
KL_API kl_tensor *kl_elu(kl_tensor *x, double alpha);
KL_API kl_tensor *kl_elu_inplace(kl_tensor *x, double alpha);
/* scale * elu(x, alpha) with PyTorch's fixed alpha 1.6733 and scale 1.0507, float-only. */
KL_API kl_tensor *kl_selu(kl_tensor *x);
KL_API kl_tensor *kl_selu_inplace(kl_tensor *x);
/* x > 0 ? x : alpha * (exp(x / alpha) - 1) (default alpha 1), float-only;
 * alpha 0 is KL_ERR_ARG (PyTorch's ZeroDivisionError). */
KL_API kl_tensor *kl_celu(kl_tensor *x, double alpha);
KL_API kl_tensor *kl_celu_inplace(kl_tensor *x, double alpha);
/* x / (1 + |x|), float rule (bool refused); no _inplace, as PyTorch. */
KL_API kl_tensor *kl_softsign(kl_tensor *x);
/* min(max(x, min_val), max_val) (defaults -1, 1); keeps integer dtypes
 * (bounds truncated), refuses bool, and uint8 with a negative bound. */
KL_API kl_tensor *kl_hardtanh(kl_tensor *x, double min_val, double max_val);
KL_API kl_tensor *kl_hardtanh_inplace(kl_tensor *x, double min_val, double max_val);
/* min(max(x + 3, 0), 6) / 6, float-only. */
KL_API kl_tensor *kl_hardsigmoid(kl_tensor *x);
KL_API kl_tensor *kl_hardsigmoid_inplace(kl_tensor *x);
/* x * hardsigmoid(x), float-only. */
KL_API kl_tensor *kl_hardswish(kl_tensor *x);
KL_API kl_tensor *kl_hardswish_inplace(kl_tensor *x);
/* x * tanh(softplus(x)), float-only (NaN at -inf, as PyTorch). */
KL_API kl_tensor *kl_mish(kl_tensor *x);
KL_API kl_tensor *kl_mish_inplace(kl_tensor *x);
/* Predicates: a new bool tensor, no _inplace (as in PyTorch); integers are never NaN or infinite. */
/* x != x. */
KL_API kl_tensor *kl_isnan(kl_tensor *x);
/* |x| == inf. */
KL_API kl_tensor *kl_isinf(kl_tensor *x);
/* Neither NaN nor infinite. */
KL_API kl_tensor *kl_isfinite(kl_tensor *x);

/* ------------------------------------------------------------------------ */
/* Elementwise, binary, with broadcasting and PyTorch type promotion. Each  */
/* op has four forms, generated from its op table row (ops_binary.def):     */
/* kl_<op>(a, b) returns a new tensor of the broadcast shape;               */
/* kl_<op>_inplace(a, b) writes into a, which must have the broadcast shape */
/* (else KL_ERR_SHAPE) and a dtype the result can be cast to (else          */
/* KL_ERR_DTYPE), and returns a; kl_<op>_scalar(a, s) and                   */
/* kl_<op>_scalar_inplace(a, s) take b as the C double s.                   */
/* A scalar counts as an integer if it has an integral value, else as a     */
/* float, and never widens a tensor's dtype within its category (f32 + 2.5  */
/* stays f32; i32 + 2 stays i32; i32 + 2.5 becomes the default float        */
/* dtype).                                                                  */
/* Dtype rules: promote = PyTorch's result_type of a and b (dimensioned     */
/* tensors > 0-dim tensors > scalars); float = promote, then integers and   */
/* bool to the default float dtype; bool = compared in the promoted dtype,  */
/* bool result. Shapes that do not broadcast: KL_ERR_SHAPE; a refused       */
/* dtype: KL_ERR_DTYPE; different devices: KL_ERR_DEVICE; each naming the   */
/* op, the shapes and the dtypes. f16/bf16 compute in f32.                  */
/* ------------------------------------------------------------------------ */

/* a + b; promote; integers wrap, bool + bool is logical or. */
KL_API kl_tensor *kl_add(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_add_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_add_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_add_scalar_inplace(kl_tensor *a, double s);
/* a - b; promote; integers wrap; a bool operand refused (as PyTorch). */
KL_API kl_tensor *kl_sub(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_sub_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_sub_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_sub_scalar_inplace(kl_tensor *a, double s);
/* a * b; promote; integers wrap, bool * bool is logical and. */
KL_API kl_tensor *kl_mul(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_mul_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_mul_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_mul_scalar_inplace(kl_tensor *a, double s);
/* a / b, true division (integers divide as floats: 1 / 2 = 0.5); float rule. */
KL_API kl_tensor *kl_div(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_div_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_div_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_div_scalar_inplace(kl_tensor *a, double s);
/* a mod b with the sign of the divisor b (Python's %, torch.remainder); promote;
 * integer division by zero is KL_ERR_ARG; bool with bool refused. */
KL_API kl_tensor *kl_remainder(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_remainder_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_remainder_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_remainder_scalar_inplace(kl_tensor *a, double s);
/* a ^ b; promote; integers by repeated squaring (wrapping); a negative integer
 * tensor exponent gives 1 for base 1, +-1 for base -1, else 0, but a negative
 * integer C scalar exponent of an integer tensor is KL_ERR_ARG (as PyTorch);
 * bool with bool refused. */
KL_API kl_tensor *kl_pow(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_pow_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_pow_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_pow_scalar_inplace(kl_tensor *a, double s);
/* The larger of a and b; promote; NaN wins; of -0.0 and +0.0 the second operand. */
KL_API kl_tensor *kl_maximum(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_maximum_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_maximum_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_maximum_scalar_inplace(kl_tensor *a, double s);
/* The smaller of a and b; promote; NaN wins; of -0.0 and +0.0 the second operand. */
KL_API kl_tensor *kl_minimum(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_minimum_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_minimum_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_minimum_scalar_inplace(kl_tensor *a, double s);
/* atan(a / b) in the quadrant of (b, a), radians; float rule. */
KL_API kl_tensor *kl_atan2(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_atan2_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_atan2_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_atan2_scalar_inplace(kl_tensor *a, double s);
/* a - trunc(a / b) * b: the sign of a (C's fmod); integers stay integers and
 * an integer division by zero is KL_ERR_ARG (PyTorch's ZeroDivisionError). */
KL_API kl_tensor *kl_fmod(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_fmod_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_fmod_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_fmod_scalar_inplace(kl_tensor *a, double s);
/* sqrt(a^2 + b^2) without overflow; +inf if either is infinite (even with a
 * NaN); floating operands only (integer promotion is KL_ERR_DTYPE, as PyTorch). */
KL_API kl_tensor *kl_hypot(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_hypot_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_hypot_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_hypot_scalar_inplace(kl_tensor *a, double s);
/* |a| with the sign bit of b (-0.0 and NaN signs count); float rule. */
KL_API kl_tensor *kl_copysign(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_copysign_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_copysign_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_copysign_scalar_inplace(kl_tensor *a, double s);
/* a * log(b), 0 where a == 0 unless b is NaN; float rule. */
KL_API kl_tensor *kl_xlogy(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_xlogy_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_xlogy_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_xlogy_scalar_inplace(kl_tensor *a, double s);
/* a == b; bool rule (in place: 0/1 in a's dtype). Not differentiable. */
KL_API kl_tensor *kl_eq(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_eq_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_eq_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_eq_scalar_inplace(kl_tensor *a, double s);
/* a != b; bool rule (NaN != NaN is true). */
KL_API kl_tensor *kl_ne(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_ne_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_ne_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_ne_scalar_inplace(kl_tensor *a, double s);
/* a < b; bool rule. */
KL_API kl_tensor *kl_lt(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_lt_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_lt_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_lt_scalar_inplace(kl_tensor *a, double s);
/* a <= b; bool rule. */
KL_API kl_tensor *kl_le(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_le_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_le_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_le_scalar_inplace(kl_tensor *a, double s);
/* a > b; bool rule. */
KL_API kl_tensor *kl_gt(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_gt_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_gt_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_gt_scalar_inplace(kl_tensor *a, double s);
/* a >= b; bool rule. */
KL_API kl_tensor *kl_ge(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_ge_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_ge_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_ge_scalar_inplace(kl_tensor *a, double s);
/* (a != 0) and (b != 0); bool rule, any dtypes. */
KL_API kl_tensor *kl_logical_and(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_and_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_and_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_logical_and_scalar_inplace(kl_tensor *a, double s);
/* (a != 0) or (b != 0); bool rule, any dtypes. */
KL_API kl_tensor *kl_logical_or(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_or_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_or_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_logical_or_scalar_inplace(kl_tensor *a, double s);
/* (a != 0) xor (b != 0); bool rule, any dtypes. */
KL_API kl_tensor *kl_logical_xor(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_xor_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_logical_xor_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_logical_xor_scalar_inplace(kl_tensor *a, double s);
/* a & b; promote; integers and bool only (a float operand or scalar: KL_ERR_DTYPE). */
KL_API kl_tensor *kl_bitwise_and(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_and_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_and_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_bitwise_and_scalar_inplace(kl_tensor *a, double s);
/* a | b; promote; integers and bool only. */
KL_API kl_tensor *kl_bitwise_or(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_or_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_or_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_bitwise_or_scalar_inplace(kl_tensor *a, double s);
/* a ^ b (exclusive or); promote; integers and bool only. */
KL_API kl_tensor *kl_bitwise_xor(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_xor_inplace(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bitwise_xor_scalar(kl_tensor *a, double s);
KL_API kl_tensor *kl_bitwise_xor_scalar_inplace(kl_tensor *a, double s);

/* Scalar first, written by hand (ew_binary.c): */
/* s - a (PyTorch's rsub); the promotion of kl_sub. */
KL_API kl_tensor *kl_rsub_scalar(kl_tensor *a, double s);
/* s / a, true division; the float rule of kl_div. */
KL_API kl_tensor *kl_rdiv_scalar(kl_tensor *a, double s);

/* ------------------------------------------------------------------------ */
/* Elementwise, other                                                        */
/* ------------------------------------------------------------------------ */

/* cond ? a : b, broadcast; cond must be bool. */
KL_API kl_tensor *kl_where(kl_tensor *cond, kl_tensor *a, kl_tensor *b);
/* min(max(x, lo), hi); pass -INFINITY / INFINITY for no bound. */
KL_API kl_tensor *kl_clamp(kl_tensor *x, double lo, double hi);
KL_API kl_tensor *kl_clamp_inplace(kl_tensor *x, double lo, double hi);
/* a + w * (b - a), w a tensor (broadcast) or a scalar. */
KL_API kl_tensor *kl_lerp(kl_tensor *a, kl_tensor *b, kl_tensor *w);
KL_API kl_tensor *kl_lerp_scalar(kl_tensor *a, kl_tensor *b, double w);
KL_API kl_tensor *kl_lerp_scalar_inplace(kl_tensor *a, kl_tensor *b, double w);
/* x with value where mask (bool, broadcast to x) is true. */
KL_API kl_tensor *kl_masked_fill(kl_tensor *x, kl_tensor *mask, double value);
KL_API kl_tensor *kl_masked_fill_inplace(kl_tensor *x, kl_tensor *mask, double value);
/* Lower / upper triangle of the last two dims (diagonal offset k). */
KL_API kl_tensor *kl_tril(kl_tensor *x, int64_t k);
KL_API kl_tensor *kl_triu(kl_tensor *x, int64_t k);

/* ------------------------------------------------------------------------ */
/* Reductions. dims: (ndims, dims); ndims == 0 reduces over all dims.        */
/* ------------------------------------------------------------------------ */

KL_API kl_tensor *kl_sum(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_mean(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_prod(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_amax(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_amin(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* Values and int64 indices of the max/min along dim (first occurrence; NaN wins).
 * Returns 0 and sets *values, *indices (both scope-owned), or -1. */
KL_API int kl_max_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices);
KL_API int kl_min_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices);
/* Pass KL_DIM_NONE as dim to reduce over the flattened tensor. */
#define KL_DIM_NONE (-0x7fff)
KL_API kl_tensor *kl_argmax(kl_tensor *x, int dim, bool keepdim);
KL_API kl_tensor *kl_argmin(kl_tensor *x, int dim, bool keepdim);
/* Variance / standard deviation with Bessel-style correction (1 = unbiased). */
KL_API kl_tensor *kl_var(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim);
KL_API kl_tensor *kl_std(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim);
KL_API kl_tensor *kl_logsumexp(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
/* p-norm (p = INFINITY: max |x|; p = 0: count of non-zeros). */
KL_API kl_tensor *kl_norm(kl_tensor *x, double p, int ndims, const int64_t *dims, bool keepdim);
/* bool results (uint8 for uint8 input, as in PyTorch 1.13). */
KL_API kl_tensor *kl_all(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_any(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim);
KL_API kl_tensor *kl_cumsum(kl_tensor *x, int dim);
KL_API kl_tensor *kl_cumprod(kl_tensor *x, int dim);

/* ------------------------------------------------------------------------ */
/* Joining and indexing                                                      */
/* ------------------------------------------------------------------------ */

KL_API kl_tensor *kl_cat(int n, kl_tensor *const *ts, int dim);
KL_API kl_tensor *kl_stack(int n, kl_tensor *const *ts, int dim);
/* Views of pieces of split_size along dim (the last may be smaller). Writes
 * up to max_out pointers to out and returns how many pieces there are, or -1. */
KL_API int kl_split(kl_tensor *x, int64_t split_size, int dim, kl_tensor **out, int max_out);
/* Views: at most `chunks` pieces as torch.chunk (fewer when the size does not
 * allow). Writes up to max_out pointers to out and returns how many pieces
 * there are, or -1. */
KL_API int kl_chunk(kl_tensor *x, int chunks, int dim, kl_tensor **out, int max_out);
/* Tiles x: repeats[i] copies along dim i (nrep >= ndim). */
KL_API kl_tensor *kl_repeat(kl_tensor *x, int nrep, const int64_t *repeats);
/* Constant padding, F.pad order: (left, right) of the last dim first. */
KL_API kl_tensor *kl_pad(kl_tensor *x, int npad, const int64_t *pad, double value);
/* F.pad's modes. Enums only grow at the end. */
typedef enum kl_pad_mode { KL_PAD_CONSTANT, KL_PAD_REFLECT, KL_PAD_REPLICATE, KL_PAD_CIRCULAR } kl_pad_mode;
/* F.pad(x, pad, mode, value) as torch 1.13 (value: constant mode only).
 * reflect / replicate pad 1, 2 or 3 trailing dims of an input with one more
 * (unbatched) or two more dims; circular needs both batch and channel dims.
 * Padded dims must be non-empty; reflect pads below the dim's size, circular
 * at most its size; negative pads crop. Any dtype. */
KL_API kl_tensor *kl_pad_ex(kl_tensor *x, int npad, const int64_t *pad, kl_pad_mode mode, double value);
/* index: 1-D int64/int32. */
KL_API kl_tensor *kl_index_select(kl_tensor *x, int dim, kl_tensor *index);
KL_API kl_tensor *kl_gather(kl_tensor *x, int dim, kl_tensor *index);
/* x with src added at index along dim (out of place / in place into x). */
KL_API kl_tensor *kl_scatter_add(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src);
KL_API kl_tensor *kl_scatter_add_inplace(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src);
/* x with src's elements written at index along dim: out[.., index[i,j,..], ..]
 * = src[i,j,..] for dim's position (index int64, values in [0, size); when
 * two entries name one element the last in index order wins). */
KL_API kl_tensor *kl_scatter(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src);
/* kl_scatter with every written element equal to value. */
KL_API kl_tensor *kl_scatter_value(kl_tensor *x, int dim, kl_tensor *index, double value);
/* torch.scatter_reduce's reductions. Enums only grow at the end. */
typedef enum kl_scatter_reduction {
    KL_SCATTER_SUM,
    KL_SCATTER_PROD,
    KL_SCATTER_MEAN, /* integers: floor division by the count */
    KL_SCATTER_AMAX, /* NaN propagates */
    KL_SCATTER_AMIN
} kl_scatter_reduction;
/* x with src reduced into the elements index names along dim, as PyTorch
 * 1.13's scatter_reduce: include_self false reduces those elements without
 * x's value (mean divides by the entries only; elements no entry names keep
 * x's value). */
KL_API kl_tensor *kl_scatter_reduce(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src,
                                    kl_scatter_reduction reduce, bool include_self);
/* x and index (int64) broadcast outside dim, then gather; dim = KL_DIM_NONE
 * takes both flattened. Index values must lie in [0, size) as for gather. */
KL_API kl_tensor *kl_take_along_dim(kl_tensor *x, kl_tensor *index, int dim);
/* Rows of weight [num, dim] selected by integer indices of any shape. */
KL_API kl_tensor *kl_embedding(kl_tensor *weight, kl_tensor *indices);

/* ------------------------------------------------------------------------ */
/* Sorting and reordering                                                    */
/* ------------------------------------------------------------------------ */

/* Values and int64 indices of x sorted along dim. Every sort is stable (ties
 * keep their order; `stable` is accepted for PyTorch's signature and changes
 * nothing); NaN sorts as the largest value. Returns 0 and sets *values,
 * *indices (scope-owned), or -1. */
KL_API int kl_sort(kl_tensor *x, int dim, bool descending, bool stable, kl_tensor **values, kl_tensor **indices);
/* The indices of kl_sort (int64). */
KL_API kl_tensor *kl_argsort(kl_tensor *x, int dim, bool descending, bool stable);
/* The k largest (or smallest) values along dim and their int64 indices, in
 * sorted order (also when sorted is false); equal values come in index order.
 * KL_ERR_ARG when k < 0 or k > the dim's size. Returns 0 or -1 as kl_sort. */
KL_API int kl_topk(kl_tensor *x, int64_t k, int dim, bool largest, bool sorted, kl_tensor **values,
                   kl_tensor **indices);
/* x reversed along each of dims (a copy). */
KL_API kl_tensor *kl_flip(kl_tensor *x, int ndims, const int64_t *dims);
/* x rolled by shifts[i] along dims[i] (elements pushed past the end come back
 * at the front); dims NULL rolls the flattened tensor by shifts[0] (n == 1). */
KL_API kl_tensor *kl_roll(kl_tensor *x, int n, const int64_t *shifts, const int64_t *dims);
/* int64 [..., num_classes] one-hot rows for int64 class indices x;
 * num_classes -1 takes max(x) + 1 (reads the data: a trace break while
 * tracing). KL_ERR_INDEX for an index outside [0, num_classes). */
KL_API kl_tensor *kl_one_hot(kl_tensor *x, int64_t num_classes);

/* ------------------------------------------------------------------------ */
/* Linear algebra (OpenBLAS on CPU)                                          */
/* ------------------------------------------------------------------------ */

/* torch.matmul: 1-D, 2-D and batched with broadcasting of batch dims. */
KL_API kl_tensor *kl_matmul(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_mm(kl_tensor *a, kl_tensor *b);
KL_API kl_tensor *kl_bmm(kl_tensor *a, kl_tensor *b);
/* beta * bias + alpha * (a @ b). */
KL_API kl_tensor *kl_addmm(kl_tensor *bias, kl_tensor *a, kl_tensor *b, double beta, double alpha);
/* x @ w^T + bias (bias may be NULL). */
KL_API kl_tensor *kl_linear(kl_tensor *x, kl_tensor *w, kl_tensor *bias);
/* a[i] * b[j] for 1-D a and b (promoted dtype). */
KL_API kl_tensor *kl_outer(kl_tensor *a, kl_tensor *b);
/* beta * self + alpha * bmm(batch1, batch2) in the batches' dtype (self is
 * converted; integer products truncate beta and alpha to integers, as
 * PyTorch); self broadcasts to the product's [b, n, p]; beta 0 ignores
 * self's values. */
KL_API kl_tensor *kl_baddbmm(kl_tensor *self, kl_tensor *batch1, kl_tensor *batch2, double beta, double alpha);
/* torch.einsum for one operand (permutations, sums over dropped subscripts,
 * the 2-D trace "ii->" and diagonal "ii->i") and two operands whose
 * contraction is one bmm ("bij,bjk->bik", "i,j->ij", "bhqd,bhkd->bhqk", ...;
 * no repeated subscripts within an operand, no ellipsis, equal sizes per
 * subscript). Anything else: NULL and KL_ERR_ARG naming the equation. */
KL_API kl_tensor *kl_einsum(const char *equation, int n, kl_tensor *const *operands);

/* ------------------------------------------------------------------------ */
/* Neural network ops                                                        */
/* ------------------------------------------------------------------------ */

KL_API kl_tensor *kl_softmax(kl_tensor *x, int dim);
KL_API kl_tensor *kl_log_softmax(kl_tensor *x, int dim);
/* Normalizes over the last normalized_ndim dims; weight/bias (shape of those
 * dims) may be NULL. */
KL_API kl_tensor *kl_layer_norm(kl_tensor *x, int normalized_ndim, kl_tensor *weight, kl_tensor *bias,
                                double eps);
KL_API kl_tensor *kl_rms_norm(kl_tensor *x, int normalized_ndim, kl_tensor *weight, double eps);
/* Zeroes with probability p and scales by 1/(1-p) when training; else a view of x. */
KL_API kl_tensor *kl_dropout(kl_tensor *x, double p, bool training);
/* logits [N, C] (or [C], or [N, C, d...]), target int64 class indices [N]
 * (or [], [N, d...]); ignore_index -100 as PyTorch. */
KL_API kl_tensor *kl_cross_entropy(kl_tensor *logits, kl_tensor *target, kl_reduction red,
                                   double label_smoothing);
KL_API kl_tensor *kl_nll_loss(kl_tensor *logp, kl_tensor *target, kl_reduction red);

/* F.cross_entropy / F.nll_loss's keyword arguments. */
typedef struct kl_cross_entropy_options {
    kl_reduction reduction;   /* KL_REDUCE_MEAN */
    int64_t ignore_index;     /* -100: targets equal to it add 0 and leave the mean's denominator */
    double label_smoothing;   /* 0, in [0, 1]; cross_entropy only */
    kl_tensor *weight;        /* NULL, or [C] of the input's dtype: class weights (borrowed) */
} kl_cross_entropy_options;
KL_API kl_cross_entropy_options kl_cross_entropy_options_default(void);
/* cross_entropy with options (NULL = defaults), as PyTorch 1.13: with weight,
 * a row counts weight[target] and the mean divides by the sum of the weights
 * of the rows not ignored. A floating target of the input's shape and dtype
 * holds class probabilities (ignore_index must then be negative): row loss
 * -sum_c weight[c] q[c] log_softmax(x)[c], q = target (1 - ls) + ls / C, and
 * the mean divides by the number of rows. Gradients flow to logits, to
 * probability targets, and to weight with probability targets only (class
 * indices with a weight that requires grad fail in backward, as in PyTorch). */
KL_API kl_tensor *kl_cross_entropy_ex(kl_tensor *logits, kl_tensor *target,
                                      const kl_cross_entropy_options *opts);
/* nll_loss with options (NULL = defaults): class indices only, no label
 * smoothing (KL_ERR_ARG); weights as kl_cross_entropy_ex. */
KL_API kl_tensor *kl_nll_loss_ex(kl_tensor *logp, kl_tensor *target, const kl_cross_entropy_options *opts);
KL_API kl_tensor *kl_mse_loss(kl_tensor *a, kl_tensor *b, kl_reduction red);
KL_API kl_tensor *kl_binary_cross_entropy_with_logits(kl_tensor *x, kl_tensor *y, kl_reduction red);

typedef struct kl_conv2d_options {
    int64_t stride[2], padding[2], dilation[2], groups;
} kl_conv2d_options;
KL_API kl_conv2d_options kl_conv2d_options_default(void);
/* x [N,C,H,W], w [O,C/groups,kh,kw], bias [O] or NULL; opts NULL = defaults. */
KL_API kl_tensor *kl_conv2d(kl_tensor *x, kl_tensor *w, kl_tensor *bias, const kl_conv2d_options *opts);

typedef struct kl_pool2d_options {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    bool ceil_mode, count_include_pad;
} kl_pool2d_options;
/* kernel k x k, stride = kernel, no padding, count_include_pad = true. */
KL_API kl_pool2d_options kl_pool2d_options_default(int64_t k);
KL_API kl_tensor *kl_max_pool2d(kl_tensor *x, const kl_pool2d_options *opts);
KL_API kl_tensor *kl_avg_pool2d(kl_tensor *x, const kl_pool2d_options *opts);
/* y = (x - mean) / sqrt(var + eps) * weight + bias per channel of x [N, C, ...]
 * (2-D to 8-D); weight/bias [C] or NULL. training: the batch's statistics
 * (biased variance), and running_mean/running_var [C] (both or both NULL;
 * never requiring grad) are updated in place to (1 - momentum) r + momentum
 * stat with the unbiased variance, outside autograd (and written back by
 * compiled calls); momentum None (cumulative average) is not offered. Eval:
 * the running buffers are the statistics (required). */
KL_API kl_tensor *kl_batch_norm(kl_tensor *x, kl_tensor *running_mean, kl_tensor *running_var, kl_tensor *weight,
                                kl_tensor *bias, bool training, double momentum, double eps);
/* Normalizes x [N, C, ...] over each of num_groups channel groups (C divisible
 * by it) and its spatial dims; weight/bias [C] or NULL. */
KL_API kl_tensor *kl_group_norm(kl_tensor *x, int64_t num_groups, kl_tensor *weight, kl_tensor *bias, double eps);
/* Averages x [N,C,H,W] (or [C,H,W]) over out_h x out_w windows: output o of n
 * covers [floor(o in / n), ceil((o + 1) in / n)), as PyTorch. Floating x. */
KL_API kl_tensor *kl_adaptive_avg_pool2d(kl_tensor *x, int64_t out_h, int64_t out_w);
/* Zeroes whole planes x[n, c] with probability p and scales the others by
 * 1/(1-p) when training (x [N,C,H,W], or [N,C,L] as PyTorch 1.13); else a view of x. */
KL_API kl_tensor *kl_dropout2d(kl_tensor *x, double p, bool training);

typedef struct kl_conv1d_options {
    int64_t stride, padding, dilation, groups;
} kl_conv1d_options;
/* stride 1, padding 0, dilation 1, groups 1. */
KL_API kl_conv1d_options kl_conv1d_options_default(void);
/* x [N,C,L] or [C,L], w [O,C/groups,k], bias [O] or NULL; opts NULL = defaults.
 * Runs as conv2d over a height of 1. */
KL_API kl_tensor *kl_conv1d(kl_tensor *x, kl_tensor *w, kl_tensor *bias, const kl_conv1d_options *opts);

typedef struct kl_conv_transpose2d_options {
    int64_t stride[2], padding[2], output_padding[2], dilation[2], groups;
} kl_conv_transpose2d_options;
/* stride 1, padding 0, output_padding 0, dilation 1, groups 1. */
KL_API kl_conv_transpose2d_options kl_conv_transpose2d_options_default(void);
/* x [N,C_in,H,W] or [C_in,H,W], w [C_in,C_out/groups,kh,kw], bias [C_out] or
 * NULL: the gradient of conv2d with respect to its input; output size
 * (H - 1) stride - 2 padding + dilation (kh - 1) + output_padding + 1. */
KL_API kl_tensor *kl_conv_transpose2d(kl_tensor *x, kl_tensor *w, kl_tensor *bias,
                                      const kl_conv_transpose2d_options *opts);
/* F.interpolate's modes. Enums only grow at the end. */
typedef enum kl_interp_mode { KL_INTERP_NEAREST, KL_INTERP_LINEAR, KL_INTERP_BILINEAR } kl_interp_mode;
typedef struct kl_interpolate_options {
    int64_t size[2];        /* output [L] or [H, W]; 0: from scale_factor */
    double scale_factor[2]; /* per spatial dim; 0: from size (exactly one of the two) */
    kl_interp_mode mode;
    bool align_corners; /* linear modes only */
} kl_interpolate_options;
/* No size, no scale factor (one must be set), nearest, align_corners false. */
KL_API kl_interpolate_options kl_interpolate_options_default(void);
/* F.interpolate as PyTorch 1.13 (recompute_scale_factor unset): x [N, C, L]
 * (nearest, linear) or [N, C, H, W] (nearest, bilinear); output sizes size,
 * or floor(in * scale_factor) with source positions from 1 / scale_factor.
 * Linear modes need floating x; nearest takes any dtype. */
KL_API kl_tensor *kl_interpolate(kl_tensor *x, const kl_interpolate_options *opts);
/* max(0, x) + weight * min(0, x), weight (0-dim or 1-D, x's dtype) of 1 or
 * C = x's dim 1 elements (1-D and 0-dim x have one channel). */
KL_API kl_tensor *kl_prelu(kl_tensor *x, kl_tensor *weight);
/* softmax(q k^T * scale + mask) v; q [...,L,E], k [...,S,E], v [...,S,Ev];
 * mask bool (true = keep) or float (added) or NULL; scale <= 0 means 1/sqrt(E). */
KL_API kl_tensor *kl_scaled_dot_product_attention(kl_tensor *q, kl_tensor *k, kl_tensor *v,
                                                  kl_tensor *mask, bool causal, double scale);

/* ------------------------------------------------------------------------ */
/* Autograd (reverse mode)                                                   */
/*                                                                          */
/*     kl_set_requires_grad(w, true);            // w: a leaf parameter      */
/*     kl_tensor *loss = kl_mse_loss(kl_matmul(x, w), y, KL_REDUCE_MEAN);    */
/*     kl_backward(loss, NULL, NULL);            // accumulates into grad(w) */
/*     kl_tensor *g = kl_grad(w);                                            */
/*                                                                          */
/* An op records a backward node when grad mode is on and one of its inputs  */
/* requires grad; its floating outputs then require grad too. The graph     */
/* lives as long as the tensors that refer to it (scopes free it).          */
/* In-place ops on tensors in the graph are recorded; the rules, and where   */
/* Kiln refuses what PyTorch allows, are in docs/AUTOGRAD.md:                */
/*  - an in-place op on a leaf that requires grad is an error (as PyTorch);  */
/*  - an in-place op on a view of a tensor in the graph is an error (PyTorch */
/*    would rebase the base's history; Kiln asks you to clone instead);      */
/*  - a tensor saved for backward and modified in place afterwards makes    */
/*    the backward fail, naming the op that saved it and the op that wrote.  */
/* ------------------------------------------------------------------------ */

/* Marks a leaf as requiring grad (or not). Floating dtypes only; a non-leaf
 * cannot be changed (KL_ERR_STATE). Returns 0 or -1. */
KL_API int kl_set_requires_grad(kl_tensor *t, bool requires_grad);
/* true if t requires grad (a leaf marked so, or the result of a recorded op). */
KL_API bool kl_requires_grad(const kl_tensor *t);
/* true unless t was produced by a recorded op. */
KL_API bool kl_is_leaf(const kl_tensor *t);
/* The gradient accumulated into t by kl_backward, or NULL if none. Borrowed:
 * owned by t, valid until kl_zero_grad / kl_set_grad on t or t's release
 * (accumulation writes into it in place unless create_graph is set). */
KL_API kl_tensor *kl_grad(const kl_tensor *t);
/* Replaces t's gradient (NULL clears it); g must match t's shape
 * (KL_ERR_SHAPE), dtype (KL_ERR_DTYPE) and device (KL_ERR_DEVICE), and be
 * neither t nor a view of t's storage (KL_ERR_ARG: backward accumulates into
 * it in place). Returns 0 or -1. */
KL_API int kl_set_grad(kl_tensor *t, kl_tensor *g);
/* Drops t's gradient (PyTorch's zero_grad(set_to_none=True)). Returns 0 or -1. */
KL_API int kl_zero_grad(kl_tensor *t);
/* A non-leaf keeps its gradient in kl_grad after backward. Returns 0 or -1. */
KL_API int kl_retain_grad(kl_tensor *t);
/* A new tensor sharing t's storage with no history (requires_grad false). */
KL_API kl_tensor *kl_detach(kl_tensor *t);

/* Grad mode is per thread and nests: begin pushes, end pops (LIFO, checked:
 * an end without a begin is KL_ERR_STATE). Ops in no-grad mode record nothing. */
KL_API void kl_no_grad_begin(void);
KL_API void kl_no_grad_end(void);
KL_API void kl_enable_grad_begin(void);
KL_API void kl_enable_grad_end(void);
KL_API bool kl_is_grad_enabled(void);

typedef struct kl_backward_options {
    bool retain_graph;   /* keep saved tensors for another backward */
    bool create_graph;   /* record the backward itself (double backward) */
    bool allow_unused;   /* kl_autograd_grad: unreachable inputs give NULL, not an error */
} kl_backward_options;
KL_API kl_backward_options kl_backward_options_default(void);
/* Accumulates d(out)/d(leaf) into every reachable leaf's grad. grad_output
 * NULL means ones for a one-element out (required otherwise); opts NULL =
 * defaults. Without retain_graph, saved tensors are freed as the pass goes and
 * a second backward through the same nodes is KL_ERR_STATE. Returns 0 or -1. */
KL_API int kl_backward(kl_tensor *out, kl_tensor *grad_output, const kl_backward_options *opts);
/* Gradients of outputs with respect to inputs, without touching any grad
 * field. grad_outputs may be NULL (ones for one-element outputs) or hold NULL
 * entries. grads[i] is scope-owned (NULL for an unused input with
 * allow_unused). Returns 0 or -1. */
KL_API int kl_autograd_grad(int n_out, kl_tensor *const *outputs, kl_tensor *const *grad_outputs,
                            int n_in, kl_tensor *const *inputs, kl_tensor **grads,
                            const kl_backward_options *opts);

/* Anomaly mode (also KL_ANOMALY=1): a NaN or Inf produced by a backward node
 * fails the backward naming the forward op that created the node. */
KL_API void kl_set_anomaly(bool on);
KL_API bool kl_anomaly_enabled(void);
/* Writes t's backward graph as Graphviz DOT (ops, shapes, saved tensors,
 * leaves). Returns 0 or -1 (KL_ERR_IO). */
KL_API int kl_autograd_dot(const kl_tensor *t, const char *path);

/* gradcheck: fn maps n inputs to one output tensor (scope-owned). */
typedef kl_tensor *(*kl_grad_fn)(void *user, int n, kl_tensor *const *inputs);
typedef struct kl_gradcheck_options {
    double eps, atol, rtol;   /* PyTorch's defaults: 1e-6, 1e-5, 1e-3 */
    bool quiet;               /* do not print the mismatching Jacobian entry */
} kl_gradcheck_options;
KL_API kl_gradcheck_options kl_gradcheck_options_default(void);
/* Compares the analytic gradient of fn with central finite differences for
 * every input that requires grad (which must be float64 and must not
 * overlap itself). Inputs are perturbed in place and restored. Returns 1 if
 * they agree, 0 if not (kl_last_error says where, as KL_ERR_ARG), -1 on an
 * error in fn or backward. */
KL_API int kl_gradcheck(kl_grad_fn fn, void *user, int n, kl_tensor *const *inputs,
                        const kl_gradcheck_options *opts);
/* The same for the gradient of fn (second order), with a fixed random
 * grad_output: checks that backward itself is differentiable. */
KL_API int kl_gradgradcheck(kl_grad_fn fn, void *user, int n, kl_tensor *const *inputs,
                            const kl_gradcheck_options *opts);

/* ------------------------------------------------------------------------ */
/* Calling an op by name                                                     */
/*                                                                          */
/* Every op of Kiln's op table, by the name a graph prints for its node     */
/* (KL_LOG=graph, graph.txt of a repro bundle, kl_fn_explain), with its     */
/* attributes as the same text ("dims=[1], keepdim=true"):                   */
/*                                                                          */
/*     kl_tensor *y;                                                        */
/*     kl_op_call("sum", &x, 1, "dims=[1], keepdim=true", &y, 1);            */
/*                                                                          */
/* The call runs through the dispatcher as a graph node run op by op does,  */
/* so autograd records it, tracing traces it and it runs on the inputs'     */
/* device. Meant for tools and bindings (one entry point for every op) and  */
/* for repro bundles' replay.c; the typed kl_ functions read better in C.   */
/* Attributes, in any order, comma-separated name=value: integers; bools    */
/* true/false; floats as C reads them (inf, nan); dtypes f32 f64 f16 bf16   */
/* i32 i64 u8 bool; reductions none/mean/sum; devices cpu/cuda/meta; lists  */
/* [1,2]. One left out takes its default; one without a default must be     */
/* given. Random ops (rand, randn, randint, bernoulli, dropout, dropout2d,  */
/* multinomial) draw the numbers of seed= and offset= (as a graph records   */
/* them), or fresh ones from the default generator when both are left out   */
/* (traced by kl_compile, a seed= and offset= the default generator could   */
/* still reach, its own seed at or past its offset, count as a fresh draw   */
/* at each call, as the tracer takes any reservation made while tracing).   */
/* Ops without inputs (creation) run on the thread's default device.        */
/* ------------------------------------------------------------------------ */

/* Runs op (its table name; a trailing _ is the in-place form, as the graph
 * prints it: "exp_" writes into inputs[0]) on n_inputs tensors with the
 * attributes in attrs (NULL or "": none), storing its n_outputs results in
 * outputs (owned by the current scope, as any op's). Returns 0, or -1 with
 * the outputs NULL and the error recorded: KL_ERR_ARG for an unknown op
 * (naming the nearest name), an op without an in-place form, a wrong number
 * of inputs or outputs, an attribute unknown, repeated, malformed or
 * missing (naming it and the text); KL_ERR_NULL_ARG for NULL arrays or
 * tensors; then the op's own errors as its kl_ function reports them. */
KL_API int kl_op_call(const char *op, kl_tensor *const *inputs, int n_inputs, const char *attrs,
                      kl_tensor **outputs, int n_outputs);
/* A C scalar as a 0-dim tensor that takes part in type promotion and device
 * placement as the scalar operand of kl_add_scalar does (PyTorch's wrapped
 * number: int64 when value is integral, else float64; f32 + it stays f32,
 * and it joins a computation on any device). What a graph prints as
 * i64[]{wrapped} or f64[]{wrapped}. Owned by the current scope; NULL on OOM. */
KL_API kl_tensor *kl_wrapped_scalar(double value);

/* ------------------------------------------------------------------------ */
/* Compile mode                                                              */
/*                                                                          */
/*     static int step(void *user, kl_tensor *const *in, int n_in,           */
/*                     kl_tensor **out, int n_out) {                         */
/*         out[0] = kl_gelu(kl_add(in[0], in[1]));                           */
/*         return out[0] ? 0 : -1;                                           */
/*     }                                                                    */
/*     kl_fn *f = kl_compile(step, NULL, NULL);                              */
/*     kl_tensor *y;                                                         */
/*     kl_fn_call(f, (kl_tensor *[]){a, b}, 2, &y, 1);                       */
/*     kl_fn_release(f);                                                     */
/*                                                                          */
/* The first call with a new input signature (dtype, shape, strides, device, */
/* requires_grad of each input, grad mode) traces fn once with meta tensors  */
/* that carry no data: every op it calls is recorded into a graph, which is  */
/* optimized and cached; later calls with the same signature run the graph.  */
/* So side effects in fn (printf, counters, reading globals) happen only     */
/* while tracing, as in JAX. An op that needs data during tracing (kl_item,  */
/* kl_data_ptr, printing, comparisons) stops the trace: that signature runs  */
/* eagerly from then on, with the reason logged once (KL_LOG=fallback).      */
/* Tensors fn uses that are not inputs are read at every call, never baked   */
/* in. After recompile_limit signatures the function runs eagerly.           */
/* fn may call kl_autograd_grad on a loss it computes from its own leaves,  */
/* so a whole training step (loss and gradients) compiles into one graph;   */
/* a backward reaching a captured tensor that requires grad (kl_backward    */
/* into its .grad, kl_autograd_grad with respect to it) stops the trace as  */
/* kl_item does, and that signature runs eagerly;                           */
/* random ops draw fresh numbers at every call, as eagerly.                 */
/* Called in grad mode with inputs (or captured tensors) requiring grad,    */
/* FUSE mode compiles the forward and a backward traced from it, and each   */
/* call inserts one autograd node: kl_backward from eager code then runs    */
/* the compiled backward (docs/COMPILE.md); create_graph through it replays */
/* the function op by op. Replacing a captured tensor that requires grad    */
/* (and releasing the old one) retraces.                                    */
/* In FUSE mode CPU kernels are compiled with LLVM and cached on disk       */
/* (KL_CACHE_DIR; see README); the first call of a new signature pays the   */
/* trace and compile (tens of ms per kernel; under 1 ms from the cache).    */
/* Environment (read by kl_compile, so it applies to functions compiled     */
/* after it is set): KL_COMPILE=0 runs the function eagerly;                 */
/* KL_COMPILE_CHECK=1 also runs fn eagerly on copies of the inputs and fails */
/* the call (KL_ERR_STATE) if an output differs beyond the dtype's tolerance */
/* (f64 1e-9, f32 1e-4, f16 1e-2, bf16 5e-2 relative+absolute; exact for    */
/* integers and bool); its eager run replays the random counters the       */
/* compiled call drew (the generator is then left where that call left it;  */
/* no other thread may draw random numbers during a checked call). On a     */
/* mismatch it also minifies: the signature's graph as traced is cut down  */
/* (delta debugging over its nodes) to a smallest subgraph that still      */
/* differs, written with its inputs (.npy), graph, kernel and LLVM IR and a */
/* replay.c (builds against the installed library with pkg-config; exit 1: */
/* reproduced) to a folder $KL_DEBUG_DIR/kiln_repro_<pid>_<n> (./ without   */
/* KL_DEBUG_DIR); the error ends "; repro bundle: <folder>" and KL_LOG's    */
/* graph category warns with the node counts (README, "Repro bundles").    */
/* KL_LOG=trace,graph,fusion,recompile,... logs what happens ("Logging").  */
/* ------------------------------------------------------------------------ */

typedef struct kl_fn kl_fn;
/* An eager function: reads n_in inputs, writes n_out outputs (scope-owned
 * results of kl_ ops, or inputs). Returns 0, or -1 with an error recorded. */
typedef int (*kl_traceable)(void *user, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out);

typedef enum kl_compile_mode {
    KL_COMPILE_OFF,        /* call fn eagerly every time */
    KL_COMPILE_TRACE_ONLY, /* trace, then run the recorded graph op by op (no passes) */
    KL_COMPILE_NO_FUSE,    /* trace and optimize, run op by op */
    KL_COMPILE_FUSE        /* trace, optimize and fuse (the default) */
} kl_compile_mode;

typedef struct kl_compile_options {
    kl_compile_mode mode;
    int recompile_limit;   /* signatures traced before falling back to eager (default 8) */
    const char *name;      /* for logs and dumps (default "fn") */
    const char *backend;   /* CPU kernels of FUSE mode: a registered backend's name, "llvm" (the
                              default when built with LLVM) or "interp" (the reference
                              interpreter); NULL = $KL_CPU_BACKEND if set, else the default */
    /* Dynamic sizes (docs/COMPILE.md "Dynamic sizes"): bit i marks dim 0 of input i (i < 64) as
     * one batch size s shared by every marked input. The first call then traces and compiles
     * a graph that serves every s >= 2 without another trace or LLVM compile; calls whose
     * marked dims disagree, or s = 0 or 1, take (or trace) entries of their own. A function
     * that cannot be made dynamic stays static, with the reason in KL_LOG=recompile and
     * kl_fn_explain. Marking runs fn three times while tracing (two probe sizes). 0: none. */
    uint64_t dynamic_dims;
    /* Automatic dynamic (1 in kl_compile_options_default): a retrace whose only failed guards
     * are input dims that all went from one size to another (both >= 2) traces those dims as
     * dynamic, so later sizes reuse that entry. */
    int auto_dynamic;
    /* Tiered execution (docs/COMPILE.md "Compile latency"), 0 in kl_compile_options_default:
     * 1 = a new signature is traced and optimized at once, its kernels compile on a background
     * thread, and its calls run fn eagerly until they are ready, then the compiled graph (a
     * new size's dynamic entry too). Off by default: which calls run eagerly depends on timing.
     * $KL_COMPILE_ASYNC=1 / 0 turns it on / off for every function, whatever this says. */
    int async;
    /* Interpreter tier (docs/COMPILE.md "Interpreter tier"): with it a new signature's kernels
     * compile in the background and each runs on the reference interpreter until its code is
     * loaded (bitwise the same results: calls never wait for LLVM, and stay repeatable).
     * 0 = the default: on when kl_get_num_threads() >= 2 as the signature is traced, off with one
     * thread (the background compile would share the only core) and under $KL_COMPILE_CHECK;
     * 1 = on, -1 = off (a first call then compiles its kernels before it returns); async = 1
     * takes precedence. $KL_COMPILE_INTERP=1 / 0 turns it on / off for every function, whatever
     * this says. kl_fn_wait_compiled waits for the code (before timing calls, say). */
    int interp_tier;
} kl_compile_options;
KL_API kl_compile_options kl_compile_options_default(void);

/* A compiled wrapper of fn (opts NULL = defaults; copied, name included, so
 * they may be freed after the call). user is passed to fn. */
KL_API kl_fn *kl_compile(kl_traceable fn, void *user, const kl_compile_options *opts);
/* Calls the compiled function: outputs[0..n_out) receive scope-owned results
 * (or the input itself where fn returns an input). n_in and n_out are fixed
 * by the first call; other counts later are KL_ERR_ARG naming both. Returns
 * 0, or -1 with an error recorded (bad arguments, fn's own errors, a failed
 * check; KL_ERR_STATE when fn calls kl_fn_call on f itself while f traces
 * it, which used to deadlock). An error already pending when it is called does not change the
 * result (it is set aside and stays the recorded one: first error wins). */
KL_API int kl_fn_call(kl_fn *f, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out);
KL_API void kl_fn_release(kl_fn *f);
/* Waits until no kernels of f compile in the background (tiered execution, the interpreter
 * tier); the next call of such a signature runs compiled. Returns 0, or -1 (NULL f). */
KL_API int kl_fn_wait_compiled(kl_fn *f);

typedef struct kl_fn_stats {
    int64_t calls;            /* kl_fn_call calls */
    int64_t traces;           /* signatures traced (successfully or not) */
    int64_t cache_hits;       /* calls served by a cached graph */
    int64_t recompiles;       /* traces after the first */
    int64_t eager_calls;      /* calls run eagerly (mode off, trace break, limit) */
    int64_t graph_ops;        /* ops in the graphs cached now */
    int64_t kernels;          /* kernels (or op launches) per call, summed over cached graphs */
    int64_t library_calls;    /* of those, the ops run through the dispatcher (eager kernels,
                                 BLAS) rather than as a compiled kernel */
    double compile_ms;        /* total time spent tracing and optimizing */
    char last_reason[256];    /* why the last trace happened or fell back */
    /* Differentiable calls (grad mode, an input or captured tensor requiring grad; FUSE mode): */
    int64_t aot_calls;        /* ran the compiled forward and recorded one autograd node */
    int64_t opbyop_grad_calls; /* ran their graph op by op so autograd records each op (the fallback) */
    int64_t backward_kernels; /* launches of the compiled backward graphs, summed over cached graphs */
    int64_t backward_calls;   /* compiled backward graphs run by backward passes */
    int64_t double_backward_replays; /* create_graph through a compiled node: replayed op by op */
    int64_t saved_bytes;      /* bytes of the values the last aot call saved for backward (inputs and
                                 captured tensors, held by reference, not counted) */
    char grad_fallback[256];  /* why the last differentiable signature runs op by op ("" if none) */
    int64_t dynamic_entries;  /* cache entries serving every size of a dynamic dim */
    int64_t specialisations;  /* graphs of dynamic entries specialised to a new size (no trace or
                                 LLVM compile: their numbers rewritten, kernels' code shared) */
    int64_t async_eager_calls; /* calls run eagerly while their kernels compiled in the background */
    int64_t interp_calls;     /* calls that ran kernels on the interpreter tier (not compiled yet) */
} kl_fn_stats;
/* Fills *out with f's counters. Returns 0 or -1. */
KL_API int kl_fn_get_stats(const kl_fn *f, kl_fn_stats *out);
/* Writes the graph cached for the most recent signature as text (the IR's
 * stable form) into buf (snprintf semantics). Returns the full length or -1. */
KL_API int kl_fn_graph_text(const kl_fn *f, char *buf, size_t cap);
/* Explains f to stream: per cache entry, why it was traced, its guards,
 * compile time per phase (trace, passes, codegen and LLVM's share of it), the
 * graph after the passes, which ops fused into which kernel, why fusion
 * stopped where it did, the memory plan's peak; then every recompile with
 * its reason. Returns 0, or -1 (NULL argument; KL_ERR_IO on a write error). */
KL_API int kl_fn_explain(const kl_fn *f, FILE *stream);

/* ------------------------------------------------------------------------ */
/* Logging (KL_LOG)                                                          */
/*                                                                          */
/* Categories: dispatch (every eager op), trace, graph (after the passes),  */
/* fusion (which ops fused into which kernel, why fusion stopped), codegen, */
/* cache, recompile, fallback (eager fallbacks), guards; "all" names every  */
/* one. A comma list sets levels as TORCH_LOGS does: "name" logs the        */
/* category at info, "+name" at debug (more detail: the traced graph, the   */
/* graph after each pass, guard-cache hits), "-name" silences it (even its  */
/* warnings); unnamed categories log warnings only. Examples:               */
/* KL_LOG=fusion,recompile   KL_LOG=+all   KL_LOG=all,-dispatch.            */
/* Lines go to stderr as "[kiln:category] message", or to the callback.     */
/* ------------------------------------------------------------------------ */

typedef enum kl_log_level { KL_LOG_OFF, KL_LOG_WARN, KL_LOG_INFO, KL_LOG_DEBUG } kl_log_level;
/* Receives one log line (no trailing newline); called with a lock held, so
 * lines from several threads arrive one at a time; Kiln's own logging from
 * inside the callback is dropped. */
typedef void (*kl_log_fn)(void *user, const char *category, kl_log_level level, const char *message);
/* Sends log lines to fn (NULL: back to stderr). */
KL_API void kl_set_log_callback(kl_log_fn fn, void *user);
/* Replaces $KL_LOG's settings with spec (same syntax; NULL or "" = warnings
 * only). Returns 0, or -1 (KL_ERR_ARG naming the unknown category; nothing
 * changes). */
KL_API int kl_set_log(const char *spec);

/* ------------------------------------------------------------------------ */
/* Profiler                                                                  */
/*                                                                          */
/*     kl_profiler_start(NULL);                                              */
/*     ... eager ops, kl_fn_call ...                                        */
/*     kl_profiler_stop("trace.json");   (chrome://tracing or Perfetto)     */
/*     kl_profiler_summary(stdout);      (table sorted by total time)       */
/*                                                                          */
/* Records eager ops (name, input shapes and dtypes, device, duration,      */
/* bytes of fresh outputs), compiled-function calls with each kernel and    */
/* library call inside them, traces, compiles (passes, codegen), guard-     */
/* cache hits, recompiles and fallbacks with their reason, from every       */
/* thread, into one ring buffer of max_events events (default 32768, 512    */
/* bytes each: 16 MiB); when it is full the oldest events are overwritten   */
/* and counted as dropped. Off, it costs the dispatcher one predictable     */
/* branch per op. Ops on meta tensors (while tracing) are not recorded.    */
/* ------------------------------------------------------------------------ */

typedef struct kl_profiler_options {
    int64_t max_events;    /* ring buffer capacity in events (0 = default, 32768) */
} kl_profiler_options;
/* Starts recording (opts NULL = defaults). Returns 0, or -1: KL_ERR_STATE if
 * already recording, KL_ERR_ARG for a negative or huge max_events (> 2^24),
 * KL_ERR_OOM. */
KL_API int kl_profiler_start(const kl_profiler_options *opts);
/* Stops recording; keeps the events for kl_profiler_summary and, if path is
 * not NULL, writes them as Chrome trace JSON there. Returns 0, or -1
 * (KL_ERR_STATE if not recording, KL_ERR_IO if the file cannot be written:
 * the events are kept anyway). */
KL_API int kl_profiler_stop(const char *path);
/* Prints the events of the last stopped session, grouped by name and
 * category, sorted by total time: self and total time, average, calls,
 * bytes. Returns 0, or -1 (KL_ERR_STATE: no session stopped yet). */
KL_API int kl_profiler_summary(FILE *stream);

/* ------------------------------------------------------------------------ */
/* Benchmarking (like torch.utils.benchmark's Timer and Compare)             */
/*                                                                          */
/*     static int step(void *user) {                                         */
/*         return kl_fn_call(user, in, 1, &y, 1);                            */
/*     }                                                                    */
/*     kl_bench_options o = kl_bench_options_default();                      */
/*     o.label = "chain5"; o.sub_label = "2^20"; o.description = "FUSE";     */
/*     kl_bench_result r[2];                                                 */
/*     kl_bench(step, f, &o, &r[0]);                                         */
/*     kl_bench_print_row(&r[0], stdout);                                    */
/*     kl_bench_compare(r, 2, stdout);                                       */
/*                                                                          */
/* Each call of the callable runs inside its own scope (its temporaries are */
/* freed between calls, as in a training loop). Warm-up calls run first and */
/* are not timed; then calls are timed one by one until both min_runs and   */
/* min_time_s are reached (or max_runs). The thread count is pinned to      */
/* opts.threads (0: the current count) for the run and restored after it.   */
/* ------------------------------------------------------------------------ */

/* The timed callable: returns 0, or -1 with an error recorded (which stops the run). */
typedef int (*kl_bench_callable)(void *user);
/* A clock in seconds (tests inject a fake one; NULL = CLOCK_MONOTONIC). */
typedef double (*kl_bench_clock)(void *clock_user);

typedef struct kl_bench_options {
    const char *label;       /* what is measured ("softmax"): kl_bench_compare's table */
    const char *sub_label;   /* a row of that table ("256x4096") */
    const char *description; /* a column of that table ("FUSE") */
    int warmup;              /* untimed calls first (default 3) */
    int min_runs;            /* at least this many timed calls (default 10) */
    int max_runs;            /* at most this many (default 100000) */
    double min_time_s;       /* and at least this much timed time (default 0.5 s) */
    int threads;             /* kl_set_num_threads during the run; 0 = keep the current count */
    kl_bench_clock clock;    /* NULL: CLOCK_MONOTONIC */
    void *clock_user;
} kl_bench_options;
KL_API kl_bench_options kl_bench_options_default(void);

typedef struct kl_bench_result {
    char label[64], sub_label[64], description[64];
    int runs;                   /* timed calls */
    int threads;                /* the pinned thread count */
    double median_s, q1_s, q3_s; /* quartiles of the per-call times (linear interpolation, as numpy) */
    double iqr_s;               /* q3 - q1 */
    double mean_s, min_s, total_s;
    bool noisy;                 /* iqr_s > 10% of median_s */
    char warning[96];           /* "IQR 12.3% of the median: noisy measurement", or "" */
} kl_bench_result;

/* Times fn(user) as the options say; fills *out. Returns 0, or -1: KL_ERR_ARG
 * (NULL fn/out, min_runs < 1, max_runs < min_runs, min_time_s < 0 or NaN,
 * warmup < 0, threads < 0) or the callable's own error. */
KL_API int kl_bench(kl_bench_callable fn, void *user, const kl_bench_options *opts, kl_bench_result *out);
/* kl_bench of kl_fn_call(f, inputs, n_in, outputs, n_out), each call's outputs
 * dropped with its scope: a compiled function in the mode it was compiled in
 * (kl_compile_options.mode; KL_COMPILE_OFF times it eagerly through the same
 * entry). The first call of a new signature traces and compiles: warmup >= 1
 * keeps that out of the timings. KL_ERR_ARG on NULL f, n_in or n_out outside
 * [0, 64]; otherwise as kl_bench. */
KL_API int kl_bench_fn(kl_fn *f, kl_tensor *const *inputs, int n_in, int n_out, const kl_bench_options *opts,
                       kl_bench_result *out);
/* Median and quartiles of t[0..n) by linear interpolation (sorts t in place;
 * n >= 1). What kl_bench reports: exposed so other timings summarize alike. */
KL_API void kl_bench_quartiles(double *t, int n, double *q1, double *median, double *q3);
/* Prints one result as one line: label, sub-label, description, median, IQR
 * (and its % of the median), runs, threads, the warning if any. */
KL_API void kl_bench_print_row(const kl_bench_result *r, FILE *stream);
/* Prints rows grouped like torch.utils.benchmark.Compare: one table per label
 * (first-seen order), a row per sub_label, a column per description, each
 * cell the median in one unit per table and marked "!" when noisy. Returns 0,
 * or -1 (KL_ERR_ARG) on NULL rows with n > 0 or a NULL stream. */
KL_API int kl_bench_compare(const kl_bench_result *rows, int n, FILE *stream);

/* ------------------------------------------------------------------------ */
/* Comparison helpers, printing, files                                       */
/* ------------------------------------------------------------------------ */

/* 1 if same shape and |a-b| <= atol + rtol*|b| everywhere (NaNs equal if
 * equal_nan), 0 if not, -1 on error. */
KL_API int kl_allclose(kl_tensor *a, kl_tensor *b, double rtol, double atol, bool equal_nan);
/* 1 if same shape and equal values, 0 if not, -1 on error. */
KL_API int kl_equal(kl_tensor *a, kl_tensor *b);

/* PyTorch-style repr into buf (snprintf semantics: returns the full length, or -1). */
KL_API int kl_format(const kl_tensor *t, char *buf, size_t cap);
/* Prints the repr and a newline to stdout. */
KL_API void kl_print(const kl_tensor *t);
/* precision digits, summarize above threshold elements with edgeitems per side.
 * Process-wide; a value below its minimum (e.g. -1) keeps that setting. */
KL_API void kl_set_print_options(int precision, int64_t threshold, int edgeitems, int linewidth);

/* .npy (v1-v3, every dtype above, C or Fortran order). kl_load_npy maps the
 * file copy-on-write (zero-copy) when it can; a Fortran-order file loads as a
 * column-major view. Bad files: NULL and KL_ERR_FORMAT (KL_ERR_IO if unreadable).
 * kl_save_npy writes C order atomically; bfloat16 is saved as float32.
 * Saving to a path (here and kl_save_safetensors): a symbolic link is written
 * through like cp (the file it names is replaced atomically; a dangling link
 * is refused), and only a regular file is ever replaced: a FIFO, device node,
 * socket or directory at the path is KL_ERR_IO and stays as it was. */
KL_API kl_tensor *kl_load_npy(const char *path);
/* As kl_load_npy, but always reads the data into memory owned by the tensor:
 * nothing stays mapped, so later changes to the file never show through. */
KL_API kl_tensor *kl_load_npy_copy(const char *path);
KL_API kl_tensor *kl_load_npy_buffer(const void *buf, size_t len);
/* Returns 0 or a negative status. */
KL_API int kl_save_npy(const char *path, const kl_tensor *t);

/* DLPack (dlpack.h's DLManagedTensor), zero-copy both ways. kl_to_dlpack's
 * result holds a reference to t until its deleter is called. kl_from_dlpack
 * takes over the managed tensor (calls its deleter when the result dies);
 * on failure the caller keeps it. CPU (kDLCPU) and CUDA (kDLCUDA, device id =
 * CUDA index) tensors; an imported CUDA tensor's memory stays the producer's
 * (freed by its deleter, never by Kiln's allocator). bool exports as uint8. */
struct DLManagedTensor;
KL_API struct DLManagedTensor *kl_to_dlpack(kl_tensor *t);
KL_API kl_tensor *kl_from_dlpack(struct DLManagedTensor *m);

/* nn helpers: initialisers, parameter collections, optimizers, safetensors. */
#include "kiln/nn.h"
/* CUDA runtime: availability, devices, synchronize, allocator statistics. */
#include "kiln/cuda.h"

#ifdef __cplusplus
}
#endif

/* -DKL_TRACK_SOURCE: every op records its caller's line (see "Source locations"). Last, so
 * that no declaration above is expanded by a macro. */
#ifdef KL_TRACK_SOURCE
#include "kiln/srcloc.h"
#endif
#endif /* KILN_H */
