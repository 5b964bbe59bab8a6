/*
 * cn_index.c — the indexing ops on CUDA tensors: gather (so take_along_dim),
 * index_select, embedding, scatter_add (out of place and in place), scatter
 * and one_hot, as hand-written CUDA C (below) compiled at first use, one
 * program per (dtype, index dtype) holding every kernel.
 *
 * Index values are checked on the device before anything is written (the
 * CPU's rule, so an in-place scatter_add is never half done): kl_idx_check
 * records the first bad position of the index tensor (atomicMin over its
 * flat order), the call reads it back (a stream synchronize, as x % 0 does)
 * and raises the CPU's error with the value (ke_index_range_error: op,
 * value, dim, size), never a wild read or write. So these calls wait for
 * the device, like the CPU kernels that check first.
 *
 * scatter (assignment) is scatter_add's partition with each entry written
 * in order: the last write to an element wins, as on the CPU.
 *
 * gather, index_select and embedding are one kernel, kl_select: out[i] =
 * x[xoff(i) + ix[ioff(i)] * xd] over the output's domain, each buffer with
 * its strides over it (x's 0 along the indexed dim, the index's 0 where it
 * broadcasts), moving elements as bits. scatter_add gives each thread one
 * position outside the scattered dim and has it add the index entries along
 * that dim in order (the CPU kernel's partition): no two threads share an
 * output element, so the result is deterministic and equal to the CPU's bit
 * for bit, with index_add.h's per-dtype add (f16/bf16 rounded after each).
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "dtype_conv.h"
#include "index_add.h"
#include "kernels_index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' parameter block: defined once, stringified into the source. */
#define KI_DIMS_DEF                                                                                     \
    struct kl_idxdims {                                                                                 \
        long long n;        /* work items */                                                            \
        long long shape[8]; /* the domain (nd dims) */                                                  \
        long long st[3][8]; /* the three buffers' strides over it, in elements */                       \
        long long size, xd; /* the indexed dim's size; the indexed buffer's stride along it */          \
        long long len, dst[3]; /* scatter: entries along the dim, the three buffers' strides along it */ \
        int nd;                                                                                         \
    }
KI_DIMS_DEF;
_Static_assert(KL_MAX_DIMS == 8, "kl_idxdims holds KL_MAX_DIMS dims");
#define KI_STR_(...) #__VA_ARGS__
#define KI_STR(x) KI_STR_(x)

/* Defined before it: KI_B (the element as bits), KI_V (its value type),
 * KI_IT (the index type), KI_ADD(a, b) (index_add.h's add for the dtype). */
static const char ki_template[] =
    "/* the three buffers' offsets of domain index i; returns its last coordinate */\n"
    "static __device__ __forceinline__ long long kl_offs(const kl_idxdims &d, long long i, long long *o) {\n"
    "    long long last = 0;\n"
    "    o[0] = o[1] = o[2] = 0;\n"
    "    for (int k = d.nd - 1; k >= 0; k--) {\n"
    "        const long long q = i % d.shape[k];\n"
    "        i /= d.shape[k];\n"
    "        if (k == d.nd - 1) last = q;\n"
    "        o[0] += q * d.st[0][k];\n"
    "        o[1] += q * d.st[1][k];\n"
    "        o[2] += q * d.st[2][k];\n"
    "    }\n"
    "    return last;\n"
    "}\n"
    "#define KL_LOOP(i) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < d.n; \\\n"
    "                        i += (long long)gridDim.x * blockDim.x)\n"
    "\n"
    "/* the first (flat) position of ix whose value is outside [0, size), into *bad */\n"
    "extern \"C\" __global__ void kl_idx_check(const KI_IT *__restrict__ ix, unsigned long long *bad, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        if ((unsigned long long)(long long)ix[o[0]] >= (unsigned long long)d.size) atomicMin(bad, (unsigned long long)i);\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_idx_check)\n"
    "\n"
    "/* gather, index_select, embedding: out[i] = x[xoff + ix[ioff] * xd] */\n"
    "extern \"C\" __global__ void kl_select(KI_B *__restrict__ out, const KI_B *__restrict__ x,\n"
    "                                      const KI_IT *__restrict__ ix, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        out[o[0]] = x[o[1] + (long long)ix[o[2]] * d.xd];\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_select)\n"
    "\n"
    "/* scatter_add: item i (a position outside the dim) adds its len entries in order */\n"
    "extern \"C\" __global__ void kl_scatter(KI_V *__restrict__ out, const KI_IT *__restrict__ ix,\n"
    "                                       const KI_V *__restrict__ src, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        for (long long k = 0; k < d.len; k++) {\n"
    "            KI_V *p = out + o[0] + (long long)ix[o[1] + k * d.dst[1]] * d.dst[0];\n"
    "            const KI_V a = *p, b = src[o[2] + k * d.dst[2]];\n"
    "            *p = (KI_V)(KI_ADD(a, b));\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scatter)\n"
    "/* scatter: as kl_scatter, each entry written in order (the last write wins, as the CPU) */\n"
    "extern \"C\" __global__ void kl_scatter_set(KI_V *__restrict__ out, const KI_IT *__restrict__ ix,\n"
    "                                           const KI_V *__restrict__ src, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        for (long long k = 0; k < d.len; k++)\n"
    "            out[o[0] + (long long)ix[o[1] + k * d.dst[1]] * d.dst[0]] = src[o[2] + k * d.dst[2]];\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scatter_set)\n"
    "\n"
    "/* one_hot: out[..., c] = ix[...] == c */\n"
    "extern \"C\" __global__ void kl_one_hot(long long *__restrict__ out, const KI_IT *__restrict__ ix, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        const long long c = kl_offs(d, i, o);\n"
    "        out[o[0]] = (long long)ix[o[1]] == c;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_one_hot)\n";

/* index_add.h's add of each dtype, as text for the device */
static const char *const ki_add[KL_NUM_DTYPES] = {
    [KL_F32] = KI_STR(KE_SADD_F32(a, b)), [KL_F64] = KI_STR(KE_SADD_F64(a, b)),
    [KL_F16] = KI_STR(KE_SADD_F16(a, b)), [KL_BF16] = KI_STR(KE_SADD_BF16(a, b)),
    [KL_I32] = KI_STR(KE_SADD_I32(a, b)), [KL_I64] = KI_STR(KE_SADD_I64(a, b)),
    [KL_U8] = KI_STR(KE_SADD_U8(a, b)),   [KL_BOOL] = KI_STR(KE_SADD_BOOL(a, b)),
};

typedef struct ki_gen {
    kl_dtype dt, it; /* element and index dtypes */
    const char *entry;
} ki_gen;

char *cn_index_source(kl_dtype dt, kl_dtype it) {
    static const char *const bits[9] = {[1] = "uint8_t", [2] = "uint16_t", [4] = "uint32_t", [8] = "uint64_t"};
    const char *fmt = "#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n\ntypedef %s kl_idxdims;\n"
                      "#define KI_B %s\n#define KI_V %s\n#define KI_IT %s\n#define KI_ADD(a, b) %s\n\n%s";
    const char *dims = KI_STR(KI_DIMS_DEF);
    size_t n = strlen(fmt) + strlen(dims) + sizeof ki_template + 256;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, dims, bits[ke_dtypes[dt].size], cn_ctype(dt), cn_ctype(it), ki_add[dt], ki_template);
    return s;
}

static int ki_generate(void *ctx, cn_kernel_src *src) {
    const ki_gen *g = ctx;
    memset(src, 0, sizeof *src);
    if (!(src->src = cn_index_source(g->dt, g->it)))
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, "%s", g->entry);
    return 0;
}

/* Entry point `entry` of the program of (dt, it), through the eager cache. */
static int ki_function(const char *op, int dev, kl_dtype dt, kl_dtype it, int which, const char *entry,
                       CUfunction *fn) {
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 6; /* an indexing kernel */
    key.op = which;
    key.dev = dev;
    key.dt[0] = (uint8_t)dt;
    key.dt[1] = (uint8_t)it;
    ki_gen g = {dt, it, entry};
    return cn_eager_fn(op, &key, ki_generate, &g, fn);
}
enum { KI_CHECK, KI_SELECT, KI_SCATTER, KI_ONE_HOT, KI_SCATTER_SET };
static const char *const ki_entry[] = {"kl_idx_check", "kl_select", "kl_scatter", "kl_one_hot", "kl_scatter_set"};

/* Launches kernel `which` of (dt, it) over d.n items, grid-stride. */
static int ki_launch(const char *op, int dev, kl_dtype dt, kl_dtype it, int which, void **args, int64_t n) {
    CUfunction fn;
    if (ki_function(op, dev, dt, it, which, ki_entry[which], &fn) || ku_device_enter(op, dev)) return -1;
    const int64_t blocks = (n + CN_BLOCK - 1) / CN_BLOCK;
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                   block[3] = {n < CN_BLOCK ? (unsigned)(n + 31) / 32 * 32 : CN_BLOCK, 1, 1};
    return ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
}

/* Size and stride of dim e, a 0-dim tensor seen as [1] (as index.c). */
static int64_t size_ne(const kl_tensor *t, int e) { return t->ndim ? t->shape[e] : 1; }
static int64_t stride_ne(const kl_tensor *t, int e) { return t->ndim ? t->stride[e] : 0; }

/* d's domain: nd dims of shape; buffer 0 contiguous over it; n its elements. */
static void ki_domain(struct kl_idxdims *d, int nd, const int64_t *shape) {
    memset(d, 0, sizeof *d);
    d->nd = nd ? nd : 1;
    d->n = 1;
    for (int e = d->nd - 1; e >= 0; e--) {
        d->shape[e] = nd ? shape[e] : 1;
        d->st[0][e] = d->n;
        d->n *= d->shape[e];
    }
}

/* Every value of ix (int32 / int64, any layout, on the device) lies in [0,
 * size), or the error naming op (one_hot's wording when one_hot), the first
 * bad value, dim and size. Reads a word back: waits for the stream. The
 * check kernel is the one in the program of (dt, ix's dtype) the op uses. */
static int check_indices(const ke_call *c, const char *op, kl_dtype dt, const kl_tensor *ix, int64_t size, int dim,
                         int one_hot) {
    const int dev = c->device.index;
    struct kl_idxdims d;
    ki_domain(&d, ix->ndim, ix->shape);
    if (d.n == 0) return 0;
    for (int e = 0; e < d.nd; e++) d.st[0][e] = stride_ne(ix, e);
    d.size = size;
    const ku_driver *drv = ku_driver_get(op);
    if (!drv || ku_device_enter(op, dev)) return -1;
    CUstream s = ku_current_stream(dev);
    CUdeviceptr bad = ku_malloc(op, dev, sizeof(uint64_t), s);
    if (!bad) return -1;
    uint64_t first = 0;
    void *pix = ke_data(ix), *pbad = (void *)(uintptr_t)bad, *args[] = {&pix, &pbad, &d};
    int rc = KU_CALL(op, drv, MemsetD8Async, bad, 0xFF, sizeof(uint64_t), s) ||
             ki_launch(op, dev, dt, (kl_dtype)ix->dtype, KI_CHECK, args, d.n) ||
             KU_CALL(op, drv, MemcpyDtoHAsync, &first, bad, sizeof first, s) || KU_CALL(op, drv, StreamSynchronize, s);
    ku_free(op, bad);
    if (rc) return -1;
    if (first == UINT64_MAX) return 0;
    /* the bad value itself, from its place in ix */
    int64_t off = 0, pos = (int64_t)first, v = 0;
    for (int e = d.nd - 1; e >= 0; e--) {
        off += pos % d.shape[e] * stride_ne(ix, e);
        pos /= d.shape[e];
    }
    const size_t es = ke_dtypes[ix->dtype].size;
    int32_t v32 = 0;
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)ke_data(ix) + (CUdeviceptr)(off * (int64_t)es);
    if (KU_CALL(op, drv, MemcpyDtoH, es == 4 ? (void *)&v32 : (void *)&v, at, es)) return -1;
    if (es == 4) v = v32;
    return one_hot ? ke_one_hot_range_error(op, v, size) : ke_index_range_error(op, v, dim, size);
}

/* out[i] = x[xoff(i) + ix[ioff(i)] * d->xd] over d's domain (d->st: out, x, ix). */
static int run_select(const ke_call *c, const char *op, kl_tensor *out, const kl_tensor *x, const kl_tensor *ix,
                      struct kl_idxdims *d) {
    if (d->n == 0) return 0;
    void *po = ke_data(out), *px = ke_data(x), *pi = ke_data(ix), *args[] = {&po, &px, &pi, d};
    return ki_launch(op, c->device.index, (kl_dtype)x->dtype, (kl_dtype)ix->dtype, KI_SELECT, args, d->n);
}

int ku_cuda_gather(ke_call *c) {
    const char *op = ke_gather_name(c);
    const kl_tensor *x = c->in[0], *ix = c->in[1];
    const int dim = ke_wrap_dim(op, ke_attr_gather_dim(&c->a), x->ndim);
    if (dim < 0) return -1;
    if (ke_numel(ix->ndim, ix->shape) == 0) return 0;
    if (check_indices(c, op, (kl_dtype)x->dtype, ix, size_ne(x, dim), dim, 0)) return -1;
    struct kl_idxdims d;
    ki_domain(&d, ix->ndim, ix->shape); /* out has the index's shape, contiguous */
    for (int e = 0; e < d.nd; e++) {
        d.st[1][e] = e == dim ? 0 : stride_ne(x, e);
        d.st[2][e] = stride_ne(ix, e);
    }
    d.xd = stride_ne(x, dim);
    return run_select(c, op, c->out[0], x, ix, &d);
}

int ku_cuda_index_select(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *ix = c->in[1];
    kl_tensor *out = c->out[0];
    const int dim = ke_wrap_dim(op, ke_attr_index_select_dim(&c->a), x->ndim);
    if (dim < 0) return -1;
    if (check_indices(c, op, (kl_dtype)x->dtype, ix, size_ne(x, dim), dim, 0)) return -1;
    if (x->ndim == 0) { /* PyTorch keeps a 0-dim result: the one element */
        const ku_driver *drv = ku_driver_get(op);
        return !drv || ku_device_enter(op, c->device.index) ||
                       KU_CALL(op, drv, MemcpyDtoDAsync, (CUdeviceptr)(uintptr_t)ke_data(out),
                               (CUdeviceptr)(uintptr_t)ke_data(x), ke_dtypes[x->dtype].size,
                               ku_current_stream(c->device.index))
                   ? -1
                   : 0;
    }
    struct kl_idxdims d;
    ki_domain(&d, out->ndim, out->shape);
    for (int e = 0; e < d.nd; e++) {
        d.st[1][e] = e == dim ? 0 : x->stride[e];
        d.st[2][e] = e == dim ? stride_ne(ix, 0) : 0;
    }
    d.xd = x->stride[dim];
    return run_select(c, op, out, x, ix, &d);
}

int ku_cuda_embedding(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *w = c->in[0], *ix = c->in[1];
    if (check_indices(c, op, (kl_dtype)w->dtype, ix, w->shape[0], 0, 0)) return -1;
    struct kl_idxdims d;
    kl_tensor *out = c->out[0]; /* [indices' shape..., dim] */
    ki_domain(&d, out->ndim, out->shape);
    const int last = out->ndim - 1;
    for (int e = 0; e < last; e++) d.st[2][e] = ix->stride[e];
    d.st[1][last] = w->stride[1];
    d.xd = w->stride[0];
    return run_select(c, op, out, w, ix, &d);
}

/* scatter_add and scatter (assignment): one thread per position outside dim */
int ku_cuda_scatter_add(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *ix = c->in[1], *src = c->in[2];
    kl_tensor *out = c->out[0];
    const int set = c->op == KE_OP_scatter;
    if (c->op != KE_OP_scatter_add && !set)
        return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    const int dim = ke_wrap_dim(op, set ? ke_attr_scatter_dim(&c->a) : ke_attr_scatter_add_dim(&c->a), x->ndim);
    if (dim < 0) return -1;
    const int64_t n = ke_numel(ix->ndim, ix->shape);
    /* every index is checked before anything is written (in place included) */
    if (n > 0 && check_indices(c, op, (kl_dtype)out->dtype, ix, size_ne(out, dim), dim, 0)) return -1;
    if (!c->inplace && ke_numel(x->ndim, x->shape) > 0 && cn_copy_into(c, (kl_tensor *)x, out)) return -1;
    if (n == 0) return 0;
    struct kl_idxdims d;
    int64_t shape[KL_MAX_DIMS];
    const int nd = ix->ndim ? ix->ndim : 1;
    for (int e = 0; e < nd; e++) shape[e] = e == dim ? 1 : size_ne(ix, e);
    ki_domain(&d, nd, shape); /* the items: every position outside dim */
    const kl_tensor *bufs[3] = {out, ix, src};
    for (int k = 0; k < 3; k++) {
        for (int e = 0; e < nd; e++) d.st[k][e] = e == dim ? 0 : stride_ne(bufs[k], e);
        d.dst[k] = stride_ne(bufs[k], dim);
    }
    d.len = size_ne(ix, dim);
    void *po = ke_data(out), *pi = ke_data(ix), *ps = ke_data(src), *args[] = {&po, &pi, &ps, &d};
    return ki_launch(op, c->device.index, (kl_dtype)out->dtype, KL_I64, set ? KI_SCATTER_SET : KI_SCATTER, args, d.n);
}

int ku_cuda_one_hot(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *ix = c->in[0];
    kl_tensor *out = c->out[0];
    const int64_t nc = ke_attr_one_hot_num_classes(&c->a);
    if (ke_numel(ix->ndim, ix->shape) == 0) return 0;
    if (check_indices(c, op, KL_I64, ix, nc, 0, 1)) return -1;
    struct kl_idxdims d;
    ki_domain(&d, out->ndim, out->shape); /* [indices' shape..., nc] */
    for (int e = 0; e < out->ndim - 1; e++) d.st[1][e] = ix->stride[e];
    if (d.n == 0) return 0;
    void *po = ke_data(out), *pi = ke_data(ix), *args[] = {&po, &pi, &d};
    return ki_launch(op, c->device.index, KL_I64, KL_I64, KI_ONE_HOT, args, d.n);
}
