/*
 * cn.h — kernel IR -> CUDA C (prefix cn_), and the "nvrtc" backend for KL_CUDA.
 *
 * cn_emit.c writes one readable CUDA C program per kernel (or per batch of
 * kernels, for the tests): the eager elementwise formulas are #included from
 * the very files the CPU compiles (ew_unary.c, ew_binary.c, ew_other.c, served
 * to NVRTC in memory with kernels_ew_device.h as their kernels_ew.h), and each
 * kernel is an `extern "C" __global__` entry followed by KL_EMU_EXPORT(name).
 * docs/GPU.md, "Generating CUDA C", describes the kernel shapes.
 */
#ifndef CN_H
#define CN_H

#include "kernel.h"

/* How a kernel is launched: grid and block dimensions, dynamic shared bytes. */
typedef struct cn_launch {
    unsigned grid[3], block[3];
    unsigned shmem;
} cn_launch;

/* The generated form of one kernel. */
typedef struct cn_kernel_src {
    char *src;          /* the whole CUDA C program (malloc'd, NUL-terminated) */
    char name[48];      /* its entry point */
    cn_launch launch;
    uint8_t index64;    /* index math in 64 bits (a domain or offset past 2^31) */
} cn_kernel_src;

/* Threads per block of elementwise kernels (and of short-row kernels). */
#define CN_BLOCK 128

/* The CUDA C program of kernel k with entry point `name` (letters, digits,
 * '_'), and its launch configuration. 0, or -1 with KL_ERR_UNSUPPORTED naming
 * the statement the generator cannot take (an op with no device function, a
 * reduction other than sum, mean, prod, amax, amin, all, any). */
int cn_emit_kernel(const ir_kernel *k, const char *name, cn_kernel_src *out);
void cn_kernel_src_free(cn_kernel_src *s);

/* One program holding kernels ks[0..n) under names[0..n) (the tests compile
 * many kernels per NVRTC call). *src is malloc'd. 0 or -1. */
int cn_emit_program(const ir_kernel *const *ks, const char *const *names, int n, char **src);

/* Run-time-shape kernels (eager's one-op kernels): the source does not
 * depend on the domain's shape nor on the buffers' strides, which come in
 * the last parameter, a cn_dims by value. Two layout classes: CN_DYN_FLAT
 * (every buffer flat over the domain, or one element: flat index) and
 * CN_DYN_STRIDED (general strided / broadcast, rank baked in). At most
 * CN_DYN_BUFS buffers; elementwise kernels only. */
enum { CN_DYN_FLAT = 1, CN_DYN_STRIDED = 2, CN_DYN_ROW = 3, CN_DYN_BUFS = 8 };
typedef struct cn_dims {
    long long n;                                /* elements of the domain */
    long long shape[KL_MAX_DIMS];               /* the domain */
    long long index[CN_DYN_BUFS][KL_MAX_DIMS];  /* each buffer's strides over it (0: broadcast) */
} cn_dims;
/* k's layout class, 0 if it has no run-time-shape form (row kernels, too many buffers). */
int cn_dyn_class(const ir_kernel *k);
/* The kernel's source with shape and strides as parameters (its layout class
 * baked in), and its launch configuration for k's shape. 0 or -1. */
int cn_emit_kernel_dyn(const ir_kernel *k, const char *name, cn_kernel_src *out);
/* The same, with the inputs in mask byval (bit b: input b, one element for
 * every domain index) taken as kernel parameters by value instead of device
 * pointers: eager's 0-dim CPU operands, so no copy to the device. */
int cn_emit_kernel_dyn_byval(const ir_kernel *k, const char *name, unsigned byval, cn_kernel_src *out);
/* A row kernel of rank 2 ([rows, cnt], eager's reductions) in run-time-shape
 * form: rows, cnt and every buffer's two strides come in the cn_dims
 * (shape[0], shape[1], index[b][0..1]); the inputs in mask byval are scalar
 * parameters by value (cn_emit_kernel_dyn_byval). 0 or -1. */
int cn_emit_row_dyn(const ir_kernel *k, const char *name, unsigned byval, cn_kernel_src *out);
/* The cn_dims a run-time-shape kernel of k is launched with. */
void cn_dims_of(const ir_kernel *k, cn_dims *d);

/* The C type holding a value of dtype d in generated CUDA C (f16/bf16: their
 * bits as uint16_t), and the suffix of dtype_conv.h's KE_CV_LOAD_ /
 * KE_CV_STORE_ macros for d ("F32", "BF16", ...). */
const char *cn_ctype(int d);
const char *cn_cvname(int d);
/* kl_shfl_xor(v, m) for every accumulator type (uint8_t through 8 bytes):
 * the text row kernels put after their #includes. */
extern const char cn_prelude_row[];

/* The launch configuration of k (what cn_emit_kernel reports). */
void cn_launch_of(const ir_kernel *k, cn_launch *l);

/* The device function of elementwise op `op` computing in dtype `compute`:
 * its name (the CPU loop's, e.g. "neg_f32") and the eager file that defines
 * it ("ew_unary.c"), or NULL + KL_ERR_UNSUPPORTED. */
const char *cn_device_fn(int op, kl_dtype compute, const char **file);

/* The backend (cn_backend.c), registered by src/init.c. */
extern const ir_backend cn_nvrtc_backend;

/* Eager CUDA kernels' function cache (cn_eager.c). A key holds what the
 * generated source depends on and nothing else; it is hashed and compared as
 * bytes, so memset it to 0 before filling it. kind says whose key it is
 * (elementwise, reduction, ...). */
typedef struct cn_ekey {
    int32_t op, dev;
    uint8_t kind, nin, cls, rank;       /* rank: 0 for the flat class (one source serves every rank) */
    uint8_t bcast, one, byval, compute; /* bit b: input b broadcast / one element / a host scalar by value */
    uint8_t dt[IR_KERNEL_MAX_IN + 1];   /* inputs', then the output's dtype */
    ke_attrs a;                         /* the attributes the source bakes in (zero when none) */
} cn_ekey;
struct CUfunc_st;
typedef int (*cn_gen_fn)(void *ctx, cn_kernel_src *src);
/* The loaded function cached under key: a lock-free lookup; on a miss
 * gen(ctx) generates the source (its entry point src->name), loaded through
 * the module cache, and the first insert of a key wins. 0 or -1. */
int cn_eager_fn(const char *op, const cn_ekey *key, cn_gen_fn gen, void *ctx, struct CUfunc_st **fn);

/* The eager CUDA kernel of every elementwise op (cn_eager.c): the op's
 * one-op kernel, cached by cn_eager_fn, launched with the tensors' shape and
 * strides. Registered by src/init.c. */
struct ke_call;
int ku_cuda_ew(struct ke_call *c);
/* clone on CUDA tensors: a device-to-device copy when both sides are
 * contiguous in one dtype, else the identity kernel (no host round trip).
 * Registered by src/init.c. */
int ku_cuda_clone(struct ke_call *c);
/* The eager CUDA kernel of the reductions (cn_reduce.c): sum, mean, prod,
 * amax, amin, all, any over any dims as a row kernel; registered by src/init.c. */
int ku_cuda_reduce(struct ke_call *c);
/* 1 if ku_cuda_reduce runs op. */
int ku_cuda_reduce_supported(int op);
/* An input seen as [rows, len] (cn_reduce.c): the reduced dims last, each
 * group collapsed into one stride. */
typedef struct cn_rows {
    kl_tensor *src;     /* the input itself, or a contiguous permuted device copy */
    int64_t rows, len;  /* rows: the kept dims' elements; len: the reduced ones' */
    int64_t rs, ls;     /* src's strides between rows and along a row */
} cn_rows;
/* x (c's input, on c's device) over the dims in mask as cn_rows: read in
 * place when the kept and the reduced dims each collapse into one stride,
 * else a device copy with the reduced dims last (in the caller's scope).
 * 0 or -1. */
int cn_row_view(const struct ke_call *c, kl_tensor *x, uint32_t mask, cn_rows *v);
/* Row kernels that read an input in more than one pass (softmax: max, sum,
 * write; the norms) hold that input's values of the row in registers, read
 * from global memory once: up to `kr` values a thread (cn_row_cache), so
 * rows of up to kr * CN_ROW_MAX_THREADS elements; a longer row runs the
 * passes over global memory (the kernel checks cnt <= kr * blockDim.x). Row
 * kernels carry __launch_bounds__(CN_ROW_MAX_THREADS). */
#define CN_ROW_MAX_THREADS 512
#define CN_ROW_KR_MAX 8     /* values a thread caches when they take at most 2 registers */
#define CN_ROW_PER_THREAD 8  /* values a thread aims at when picking the block size */
#define CN_STR_(x) #x
#define CN_STR(x) CN_STR_(x)
/* The cache depth kr of row kernel k (0: none, no input read twice or the
 * values would take too many registers: 8 for <= 2 words a value-set, 4
 * for <= 4, 2 for <= 8); cached[s] (k->nstmts entries, may be NULL) marks
 * the LOADs held in registers. */
int cn_row_cache(const ir_kernel *k, uint8_t *cached);
/* Threads per block of a row kernel over rows of len elements whose cache
 * depth is kr: with a cache that the row fits, about CN_ROW_PER_THREAD
 * values a thread (whole warps, 32..CN_ROW_MAX_THREADS); else one warp for
 * short rows (each idle thread is a fiber on the emulator), 128, 256 from 2048. */
unsigned cn_row_threads(int64_t len, int kr);
/* Rows longer than this many elements are split across blocks (two passes:
 * partials, then a finishing kernel), each block taking `chunk` elements;
 * by default 65536 and 16384. The tests lower them to exercise the split on
 * the emulator. Not thread-safe: set before launching work. */
void cn_set_row_split(int64_t threshold, int64_t chunk);
/* How many blocks a row of len elements is split into (1: not split), and
 * the elements each takes. */
int64_t cn_row_split(int64_t len, int64_t *chunk);

/* dst = src (same shape, any strides, on c's device), cast to dst's dtype
 * where it differs: the eager identity kernel (clone's formula, the device's
 * ke_convert) through ku_cuda_ew (cn_reduce.c). 0 or -1. */
int cn_copy_into(const struct ke_call *c, kl_tensor *src, kl_tensor *dst);

/* The indexing ops on CUDA tensors (cn_index.c): gather (and so
 * take_along_dim), index_select, embedding, scatter_add (in place too),
 * one_hot; ku_cuda_scatter_add also runs scatter and scatter_reduce; indices
 * checked on the device first, a bad one raising the CPU's error. Registered
 * by src/init.c. */
int ku_cuda_gather(struct ke_call *c);
int ku_cuda_index_select(struct ke_call *c);
int ku_cuda_embedding(struct ke_call *c);
int ku_cuda_scatter_add(struct ke_call *c);
int ku_cuda_one_hot(struct ke_call *c);

/* argmax, argmin, max_dim and min_dim on CUDA tensors (cn_argreduce.c): a row
 * kernel carrying (value, position) pairs; registered by src/init.c. */
int ku_cuda_argreduce(struct ke_call *c);
/* The CUDA C programs these kernels run (malloc'd, NULL when out of memory),
 * for the NVRTC suite: the arg reduction of op (argmax-like or argmin-like)
 * over input dtype in compared in cd; the indexing kernels of element dtype
 * dt with index dtype it. */
char *cn_argreduce_source(int op, kl_dtype in, kl_dtype cd);
char *cn_index_source(kl_dtype dt, kl_dtype it);

/* The eager CUDA kernel of softmax and log_softmax (cn_reduce.c): one fused
 * row kernel; registered by src/init.c. */
int ku_cuda_softmax(struct ke_call *c);
/* The eager fused row kernel of op (softmax, log_softmax, layer_norm,
 * rms_norm) over dt with or without a weight / bias, for the tests: with
 * src, its program (0 or -1); without, its cache depth (cn_row_cache; the
 * launches assume CN_ROW_KR_MAX), -1 for another op. */
int cn_fused_row_program(int op, kl_dtype dt, int has_w, int has_b, cn_kernel_src *src);
/* The eager CUDA kernel of layer_norm and rms_norm (cn_reduce.c): one fused
 * row kernel; registered by src/init.c. */
int ku_cuda_norm(struct ke_call *c);
/* The eager CUDA kernel of the random ops (cn_rng.c): rand, randn, randint,
 * bernoulli, dropout, dropout2d drawn on the device from the CPU's Philox
 * stream; registered by src/init.c. */
int ku_cuda_rng(struct ke_call *c);
/* The random kernel's program (entry kl_rng) for a mode and a Philox kind
 * (ke_philox_kind): what ku_cuda_rng loads; the tests compile each with NVRTC. */
enum { CN_RNG_FILL, CN_RNG_DROPOUT, CN_RNG_BERNOULLI };
int cn_rng_program(int mode, int kind, cn_kernel_src *src);
/* Helpers of the hand-written eager kernels (cn_rng.c): whether t is
 * contiguous (dims of size 1 aside); t as a contiguous tensor of dtype dt in
 * the current scope (t itself when it is one; casts with cn_copy_into).
 * 1 / 0, NULL on error. */
struct kl_tensor;
int cn_is_contiguous(const struct kl_tensor *t);
struct kl_tensor *cn_as_contiguous(const struct ke_call *c, struct kl_tensor *t, kl_dtype dt);
/* The eager CUDA kernel of cumsum and cumprod (cn_scan.c); registered by src/init.c. */
int ku_cuda_scan(struct ke_call *c);
/* The scan program (kl_scan_seq and kl_scan_blk) for element type t (f32,
 * f64 or i64); prod: cumprod, else cumsum. The tests compile it with NVRTC. */
int cn_scan_program(int prod, kl_dtype t, cn_kernel_src *src);
/* The eager CUDA kernels of conv2d (im2col + cuBLAS) and of max_pool2d /
 * avg_pool2d / adaptive_avg_pool2d (cn_conv.c); registered by src/init.c. */
int ku_cuda_conv2d(struct ke_call *c);
int ku_cuda_pool2d(struct ke_call *c);
/* The conv program (pool 0: im2col and bias rows, by element size) or the
 * pool program (pool 1: max and avg, by dtype) for dt; the tests compile them. */
int cn_conv_program(int pool, kl_dtype dt, cn_kernel_src *src);

/* The data-movement ops whose elements move by per-dim index arithmetic
 * (cn_join.c): cat (so stack and roll), pad (every mode), flip, repeat,
 * tril / triu;
 * one kernel per element size, bitwise the CPU's. Registered by src/init.c.
 * cn_join_source: its program for elements of elem_size bytes (the tests
 * compile it with NVRTC). */
int ku_cuda_cat(struct ke_call *c);
int ku_cuda_pad(struct ke_call *c);
int ku_cuda_flip(struct ke_call *c);
int ku_cuda_repeat(struct ke_call *c);
int ku_cuda_tri(struct ke_call *c); /* tril, triu */
char *cn_join_source(int elem_size);
/* sort and topk (so argsort) on CUDA tensors (cn_sort.c): a bitonic sort of
 * (key, position) pairs per row in shared memory, equal to the CPU's stable
 * sort byte for byte; rows longer than CN_SORT_MAX_ROW are sorted in tiles of
 * that length, then merged in global memory under the same order.
 * cn_sort_source: the program for dtype dt. cn_set_sort_tile: the tile length
 * (8 .. CN_SORT_MAX_ROW; anything else restores the default), for tests that
 * run the multi-pass path on short rows. */
#define CN_SORT_MAX_ROW 4096
int ku_cuda_sort(struct ke_call *c);
char *cn_sort_source(kl_dtype dt);
void cn_set_sort_tile(int64_t tile);
/* multinomial on CUDA tensors (cn_multinomial.c): the CPU's per-row algorithm
 * and Philox uniforms, so the same seed draws the CPU's indices; the CPU's
 * errors. cn_multinomial_source: the program for probabilities of dtype dt. */
int ku_cuda_multinomial(struct ke_call *c);
char *cn_multinomial_source(kl_dtype dt);

#endif /* CN_H */
