/*
 * cn_index.c — the indexing ops on CUDA tensors: gather (so take_along_dim),
 * index_select, embedding, scatter_add (out of place and in place), scatter,
 * scatter_reduce (sum, prod, mean, amax, amin, with or without self) and
 * one_hot, as hand-written CUDA C (below) compiled at first use, one program
 * per (dtype, index dtype) holding every kernel.
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
 * for bit, with index_add.h's per-dtype updates (f16/bf16 rounded after
 * each), the text the CPU's scatter kernels compile. scatter_reduce is the
 * same walk with prod / amax / amin updates (mean: sum, then a division by
 * the counts).
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
 * KI_IT (the index type), KI_C, KI_LD, KI_ST, KI_ADD, KI_MUL, KI_DIV (index_add.h's
 * update macros of the dtype, ki_dt). */
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
    "/* scatter_reduce without self: v written where an entry points (before the entries are reduced) */\n"
    "extern \"C\" __global__ void kl_scatter_fill(KI_V *__restrict__ out, const KI_IT *__restrict__ ix, KI_V v,\n"
    "                                            kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        for (long long k = 0; k < d.len; k++) out[o[0] + (long long)ix[o[1] + k * d.dst[1]] * d.dst[0]] = v;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scatter_fill)\n"
    "/* scatter_reduce mean: how many entries point at each element of out (cnt: out's layout, zeroed) */\n"
    "extern \"C\" __global__ void kl_scatter_count(long long *__restrict__ cnt, const KI_IT *__restrict__ ix,\n"
    "                                             kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        for (long long k = 0; k < d.len; k++) cnt[o[0] + (long long)ix[o[1] + k * d.dst[1]] * d.dst[0]] += 1;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scatter_count)\n"
    "/* scatter_reduce mean: each of the d.n elements of out (contiguous) divided by its count plus self\n"
    " * (d.size: 1 with self), a count of 0 taken as 1 */\n"
    "extern \"C\" __global__ void kl_scatter_div(KI_V *__restrict__ out, const long long *__restrict__ cnt,\n"
    "                                           kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        const long long c = cnt[i] + d.size;\n"
    "        const double n = (double)(c == 0 ? 1 : c);\n"
    "        const KI_C a = KI_LD(out[i]);\n"
    "        out[i] = (KI_V)(KI_ST((KI_C)(KI_DIV(a, n))));\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scatter_div)\n"
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

/* scatter_add and scatter_reduce: item i (a position outside the dim) applies
 * its len entries in order, each an update UPD of the element a and the entry
 * b (the CPU's KE_SC_ONE); %s: the kernel's name twice, around UPD */
static const char ki_reduce_kernel[] =
    "extern \"C\" __global__ void %s(KI_V *__restrict__ out, const KI_IT *__restrict__ ix,\n"
    "                                 const KI_V *__restrict__ src, kl_idxdims d) {\n"
    "    KL_LOOP(i) {\n"
    "        long long o[3];\n"
    "        kl_offs(d, i, o);\n"
    "        for (long long k = 0; k < d.len; k++) {\n"
    "            KI_V *p = out + o[0] + (long long)ix[o[1] + k * d.dst[1]] * d.dst[0];\n"
    "            const KI_C a = KI_LD(*p), b = KI_LD(src[o[2] + k * d.dst[2]]);\n"
    "            *p = (KI_V)(KI_ST((KI_C)(%s)));\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(%s)\n";
/* the update kernels: scatter_add's and scatter_reduce's sum and mean, prod, amax, amin */
static const char *const ki_reduce_name[4] = {"kl_scatter", "kl_scatter_prod", "kl_scatter_amax", "kl_scatter_amin"};
static const char *const ki_reduce_upd[4] = {"KI_ADD(a, b)", "KI_MUL(a, b)", KI_STR(KE_SC_MAX(a, b)),
                                             KI_STR(KE_SC_MIN(a, b))};

/* index_add.h's per-dtype macros as text for the device: the compute type,
 * load, store, add, multiply, divide by a count */
#define KI_DT(D)                                                                                                  \
    "#define KI_C " KI_STR(KE_SC_C_##D) "\n#define KI_LD(v) " KI_STR(KE_SC_LD_##D(v)) "\n#define KI_ST(v) "       \
        KI_STR(KE_SC_ST_##D(v)) "\n#define KI_ADD(a, b) " KI_STR(KE_SC_ADD_##D(a, b)) "\n#define KI_MUL(a, b) " \
            KI_STR(KE_SC_MUL_##D(a, b)) "\n#define KI_DIV(a, n) " KI_STR(KE_SC_DIV_##D(a, n)) "\n"
static const char *const ki_dt[KL_NUM_DTYPES] = {
    [KL_F32] = KI_DT(F32), [KL_F64] = KI_DT(F64), [KL_F16] = KI_DT(F16), [KL_BF16] = KI_DT(BF16),
    [KL_I32] = KI_DT(I32), [KL_I64] = KI_DT(I64), [KL_U8] = KI_DT(U8),   [KL_BOOL] = KI_DT(BOOL),
};

typedef struct ki_gen {
    kl_dtype dt, it; /* element and index dtypes */
    const char *entry;
} ki_gen;

char *cn_index_source(kl_dtype dt, kl_dtype it) {
    static const char *const bits[9] = {[1] = "uint8_t", [2] = "uint16_t", [4] = "uint32_t", [8] = "uint64_t"};
    const char *fmt = "#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n\ntypedef %s kl_idxdims;\n"
                      "#define KI_B %s\n#define KI_V %s\n#define KI_IT %s\n%s\n%s";
    const char *dims = KI_STR(KI_DIMS_DEF);
    size_t n = strlen(fmt) + strlen(dims) + strlen(ki_dt[dt]) + sizeof ki_template + 4 * (sizeof ki_reduce_kernel + 64) + 256;
    char *s = malloc(n);
    if (!s) return NULL;
    size_t len = (size_t)snprintf(s, n, fmt, dims, bits[ke_dtypes[dt].size], cn_ctype(dt), cn_ctype(it), ki_dt[dt],
                                  ki_template);
    for (int k = 0; k < 4 && len < n; k++)
        len += (size_t)snprintf(s + len, n - len, ki_reduce_kernel, ki_reduce_name[k], ki_reduce_upd[k],
                                ki_reduce_name[k]);
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
enum {
    KI_CHECK, KI_SELECT, KI_ONE_HOT, KI_SCATTER_SET, KI_SCATTER_FILL, KI_SCATTER_COUNT, KI_SCATTER_DIV,
    KI_SCATTER /* + 0..3: ki_reduce_name's order */
};
static const char *const ki_entry[] = {"kl_idx_check",    "kl_select",        "kl_one_hot",     "kl_scatter_set",
                                       "kl_scatter_fill", "kl_scatter_count", "kl_scatter_div", "kl_scatter",
                                       "kl_scatter_prod", "kl_scatter_amax",  "kl_scatter_amin"};

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

/* scatter_add, scatter (assignment) and scatter_reduce: one thread per
 * position outside dim, applying its entries in order (the CPU's partition
 * and order, so the bits are the CPU's). scatter_reduce without self first
 * writes the reduction's identity where an entry points (the CPU's scatter of
 * it); mean sums, then divides every element by its count (plus one with
 * self; 0 taken as 1), as the CPU's scatter_mean_divide. */
int ku_cuda_scatter_add(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *ix = c->in[1], *src = c->in[2];
    kl_tensor *out = c->out[0];
    int which = KI_SCATTER, self = 1, mean = 0, dim_attr;
    int64_t reduce = KL_SCATTER_SUM;
    switch (c->op) {
    case KE_OP_scatter: which = KI_SCATTER_SET, dim_attr = (int)ke_attr_scatter_dim(&c->a); break;
    case KE_OP_scatter_add: dim_attr = (int)ke_attr_scatter_add_dim(&c->a); break;
    case KE_OP_scatter_reduce:
        dim_attr = (int)ke_attr_scatter_reduce_dim(&c->a);
        self = (int)ke_attr_scatter_reduce_include_self(&c->a);
        switch (reduce = ke_attr_scatter_reduce_reduce(&c->a)) {
        case KL_SCATTER_SUM: break;
        case KL_SCATTER_MEAN: mean = 1; break;
        case KL_SCATTER_PROD: which = KI_SCATTER + 1; break;
        case KL_SCATTER_AMAX: which = KI_SCATTER + 2; break;
        case KL_SCATTER_AMIN: which = KI_SCATTER + 3; break;
        default: return ke_err(KL_ERR_ARG, op, "reduce %lld is not a kl_scatter_reduction", (long long)reduce);
        }
        break;
    default: return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    }
    const int dim = ke_wrap_dim(op, dim_attr, x->ndim);
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
    const int dev = c->device.index;
    const kl_dtype dt = (kl_dtype)out->dtype;
    void *po = ke_data(out), *pi = ke_data(ix), *ps = ke_data(src);
    if (!self) {
        uint64_t id = 0; /* the identity's bits, passed by value as one element */
        ke_scatter_identity((int)reduce, dt, (char *)&id);
        uint8_t v1;
        uint16_t v2;
        uint32_t v4;
        void *pv = &id;
        switch (ke_dtypes[dt].size) {
        case 1: memcpy(&v1, &id, 1), pv = &v1; break;
        case 2: memcpy(&v2, &id, 2), pv = &v2; break;
        case 4: memcpy(&v4, &id, 4), pv = &v4; break;
        default: break;
        }
        void *args[] = {&po, &pi, pv, &d};
        if (ki_launch(op, dev, dt, KL_I64, KI_SCATTER_FILL, args, d.n)) return -1;
    }
    void *args[] = {&po, &pi, &ps, &d};
    if (ki_launch(op, dev, dt, KL_I64, which, args, d.n)) return -1;
    if (!mean) return 0;
    /* the counts, in out's (contiguous: a new result) layout */
    const int64_t no = ke_numel(out->ndim, out->shape);
    if (!cn_is_contiguous(out))
        return ke_err(KL_ERR_INTERNAL, op, "scatter_reduce mean expects a contiguous result");
    const ku_driver *drv = ku_driver_get(op);
    if (!drv || ku_device_enter(op, dev)) return -1;
    CUstream s = ku_current_stream(dev);
    CUdeviceptr cnt = ku_malloc(op, dev, (size_t)no * sizeof(int64_t), s);
    if (!cnt) return -1;
    void *pc = (void *)(uintptr_t)cnt, *cargs[] = {&pc, &pi, &d};
    int rc = KU_CALL(op, drv, MemsetD8Async, cnt, 0, (size_t)no * sizeof(int64_t), s) ||
             ki_launch(op, dev, dt, KL_I64, KI_SCATTER_COUNT, cargs, d.n);
    if (!rc) {
        struct kl_idxdims e;
        ki_domain(&e, 1, &no);
        e.size = self;
        void *dargs[] = {&po, &pc, &e};
        rc = ki_launch(op, dev, dt, KL_I64, KI_SCATTER_DIV, dargs, no);
    }
    ku_free(op, cnt);
    return rc ? -1 : 0;
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
