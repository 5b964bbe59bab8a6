/*
 * cn_sort.c — sort and topk on CUDA tensors (argsort decomposes into sort):
 * a bitonic sort of each row in shared memory, one block per row.
 *
 * The CPU sorts stably with NaN after every number (src/eager/sort.c,
 * tmpl/sort_rows.h); a sorting network is not stable, so it sorts
 * (key, position) pairs under the total order the stable sort produces:
 * a before b when a's key is strictly before b's (descending: strictly
 * after; NaN largest, NaNs tie, -0 ties +0), and on a tie when a's position
 * is smaller. That order has one sorted arrangement, so the values and
 * indices equal the CPU's byte for byte (values are copied from the input
 * element itself, NaN payloads and -0 kept). Keys compare in the CPU's key
 * type (f16 / bf16 as f32, bool as uint8).
 *
 * A row is padded to a power of two L with positions past its end, which
 * sort after everything; keys and positions take L * (key size + 4) bytes of
 * dynamic shared memory, so rows of up to CN_SORT_MAX_ROW (4096) elements
 * are one block's — 48 KiB with 8-byte keys, the most a block may ask
 * without opting in. A longer row is sorted in passes under the same total
 * order: its tiles of 4096 sorted by blocks in shared memory (kl_sort_tiles),
 * then merge passes in global memory (kl_sort_merge) doubling the sorted
 * runs, each pair placed by its rank in its own run plus a binary search in
 * the other (the order is total, so the places are a permutation), the last
 * pass writing the values and indices. topk is the first k of the row
 * sorted descending (largest) or ascending, as on the CPU (sorted = false
 * gives them sorted too). docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SO_DIMS_DEF                                                                                   \
    struct kl_sortdims {                                                                              \
        long long rows, n, k;              /* rows; the sorted dim's length; elements kept */         \
        long long tile;                    /* long rows: positions a block sorts (a power of two) */  \
        long long shape[8], xst[8], ost[8]; /* x's shape and strides, the outputs' strides */        \
        long long xs, os;                  /* strides along the sorted dim */                         \
        int L, nd, d, desc;                /* padded row length; rank; the sorted dim; descending */  \
    }
SO_DIMS_DEF;
_Static_assert(KL_MAX_DIMS == 8, "kl_sortdims holds KL_MAX_DIMS dims");
#define SO_STR_(...) #__VA_ARGS__
#define SO_STR(x) SO_STR_(x)

/* Defined before it: T (the element's storage type), K (its key type),
 * KEY(v), ISNAN(k). */
static const char so_template[] =
    "static __device__ __forceinline__ int kl_lt(K a, K b) { return a < b || (ISNAN(b) && !ISNAN(a)); }\n"
    "/* (a, ia) before (b, ib) in the stable sort's order; positions from lim on (padding) last */\n"
    "static __device__ __forceinline__ int kl_before(K a, int ia, K b, int ib, int lim, int desc) {\n"
    "    if (ia >= lim) return 0;\n"
    "    if (ib >= lim) return 1;\n"
    "    if (desc ? kl_lt(b, a) : kl_lt(a, b)) return 1;\n"
    "    if (desc ? kl_lt(a, b) : kl_lt(b, a)) return 0;\n"
    "    return ia < ib;\n"
    "}\n"
    "/* x's and the outputs' offsets of row r (every dim but d) */\n"
    "static __device__ __forceinline__ void kl_row_offs(const kl_sortdims &d, long long r, long long *xo, long long *oo) {\n"
    "    *xo = *oo = 0;\n"
    "    for (int e = d.nd - 1; e >= 0; e--) {\n"
    "        if (e == d.d) continue;\n"
    "        const long long c = r % d.shape[e];\n"
    "        r /= d.shape[e];\n"
    "        *xo += c * d.xst[e];\n"
    "        *oo += c * d.ost[e];\n"
    "    }\n"
    "}\n"
    "/* the block's bitonic network over the L pairs in shared memory (every thread calls it) */\n"
    "static __device__ __forceinline__ void kl_bitonic(K *key, int *id, int L, int lim, int desc) {\n"
    "    for (int k = 2; k <= L; k <<= 1) {\n"
    "        for (int j = k >> 1; j > 0; j >>= 1) {\n"
    "            for (int t = threadIdx.x; t < L / 2; t += blockDim.x) {\n"
    "                const int a = t / j * 2 * j + t % j, b = a + j;\n"
    "                /* a run of the ascending half keeps a before b, of the other half after */\n"
    "                const int swap = (a & k) == 0 ? kl_before(key[b], id[b], key[a], id[a], lim, desc)\n"
    "                                              : kl_before(key[a], id[a], key[b], id[b], lim, desc);\n"
    "                if (swap) {\n"
    "                    const K tk = key[a];\n"
    "                    const int ti = id[a];\n"
    "                    key[a] = key[b], id[a] = id[b];\n"
    "                    key[b] = tk, id[b] = ti;\n"
    "                }\n"
    "            }\n"
    "            __syncthreads();\n"
    "        }\n"
    "    }\n"
    "}\n"
    "/* a row of up to one block's L positions, sorted in shared memory; the first k written */\n"
    "extern \"C\" __global__ void kl_sort(const T *__restrict__ x, T *__restrict__ v, long long *__restrict__ ix,\n"
    "                                    kl_sortdims d) {\n"
    "    KL_DYN_SHARED(K, key);\n"
    "    int *id = (int *)(key + d.L);\n"
    "    const int n = (int)d.n;\n"
    "    for (long long r = blockIdx.x; r < d.rows; r += gridDim.x) {\n"
    "        long long xo, oo;\n"
    "        kl_row_offs(d, r, &xo, &oo);\n"
    "        for (int p = threadIdx.x; p < d.L; p += blockDim.x) {\n"
    "            if (p < n) key[p] = KEY(x[xo + p * d.xs]);\n"
    "            id[p] = p;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        kl_bitonic(key, id, d.L, n, d.desc);\n"
    "        for (int p = threadIdx.x; p < d.k; p += blockDim.x) {\n"
    "            const int s = id[p];\n"
    "            v[oo + p * d.os] = x[xo + s * d.xs];\n"
    "            ix[oo + p * d.os] = s;\n"
    "        }\n"
    "        __syncthreads(); /* the next row reuses the shared arrays */\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_sort)\n"
    "\n"
    "/* long rows, pass 1: block b sorts tile b % tiles (d.tile positions) of row b / tiles in shared\n"
    " * memory into ko / io (rows of n pairs: the key and the position in the row) */\n"
    "extern \"C\" __global__ void kl_sort_tiles(const T *__restrict__ x, K *__restrict__ ko, int *__restrict__ io,\n"
    "                                          kl_sortdims d) {\n"
    "    KL_DYN_SHARED(K, key);\n"
    "    int *id = (int *)(key + d.L);\n"
    "    const long long tiles = (d.n + d.tile - 1) / d.tile;\n"
    "    for (long long b = blockIdx.x; b < d.rows * tiles; b += gridDim.x) {\n"
    "        const long long r = b / tiles, base = b % tiles * d.tile;\n"
    "        const int len = (int)(d.n - base < d.tile ? d.n - base : d.tile);\n"
    "        long long xo, oo;\n"
    "        kl_row_offs(d, r, &xo, &oo);\n"
    "        for (int p = threadIdx.x; p < d.L; p += blockDim.x) {\n"
    "            if (p < len) key[p] = KEY(x[xo + (base + p) * d.xs]);\n"
    "            id[p] = (int)base + p;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        kl_bitonic(key, id, d.L, (int)base + len, d.desc);\n"
    "        for (int p = threadIdx.x; p < len; p += blockDim.x) {\n"
    "            ko[r * d.n + base + p] = key[p];\n"
    "            io[r * d.n + base + p] = id[p];\n"
    "        }\n"
    "        __syncthreads(); /* the next tile reuses the shared arrays */\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_sort_tiles)\n"
    "\n"
    "/* long rows, each further pass: the sorted runs of w pairs of each row merged by twos. A pair's\n"
    " * place in the merged run is its place in its own run plus how many pairs of the other run come\n"
    " * before it (a binary search: the order is total, positions break ties), so a thread per pair\n"
    " * and no synchronization. The last pass (fin) writes the first k places as values and indices. */\n"
    "extern \"C\" __global__ void kl_sort_merge(const K *__restrict__ ki, const int *__restrict__ ii,\n"
    "                                          K *__restrict__ ko, int *__restrict__ io, const T *__restrict__ x,\n"
    "                                          T *__restrict__ v, long long *__restrict__ ix, kl_sortdims d,\n"
    "                                          long long w, int fin) {\n"
    "    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < d.rows * d.n;\n"
    "         e += (long long)gridDim.x * blockDim.x) {\n"
    "        const long long r = e / d.n, p = e % d.n, left = p / w % 2 == 0;\n"
    "        const long long base = p / w * w - (left ? 0 : w);\n"
    "        const long long mid = base + w < d.n ? base + w : d.n, end = base + 2 * w < d.n ? base + 2 * w : d.n;\n"
    "        const K *kr = ki + r * d.n;\n"
    "        const int *ir = ii + r * d.n;\n"
    "        const K a = kr[p];\n"
    "        const int ia = ir[p];\n"
    "        /* the other run: [mid, end) for a pair of the left run, [base, mid) for one of the right */\n"
    "        long long lo = left ? mid : base, hi = left ? end : mid;\n"
    "        const long long first = lo;\n"
    "        while (lo < hi) {\n"
    "            const long long m = lo + (hi - lo) / 2;\n"
    "            if (kl_before(kr[m], ir[m], a, ia, 0x7fffffff, d.desc)) lo = m + 1;\n"
    "            else hi = m;\n"
    "        }\n"
    "        const long long q = (left ? p - base : p - mid) + (lo - first); /* the place in the merged run */\n"
    "        if (!fin) {\n"
    "            ko[r * d.n + base + q] = a;\n"
    "            io[r * d.n + base + q] = ia;\n"
    "        } else if (base + q < d.k) {\n"
    "            long long xo, oo;\n"
    "            kl_row_offs(d, r, &xo, &oo);\n"
    "            v[oo + (base + q) * d.os] = x[xo + ia * d.xs];\n"
    "            ix[oo + (base + q) * d.os] = ia;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_sort_merge)\n";

/* storage type, key type, key of an element, NaN test, key bytes */
static void so_types(kl_dtype dt, const char **t, const char **k, const char **key, const char **isnan_, int *ks) {
    *key = "(v)";
    *isnan_ = "0";
    *ks = (int)ke_dtypes[dt].size;
    switch (dt) {
    case KL_F32: *t = *k = "float", *isnan_ = "((v) != (v))"; break;
    case KL_F64: *t = *k = "double", *isnan_ = "((v) != (v))"; break;
    case KL_F16: *t = "uint16_t", *k = "float", *key = "ke_f16_to_f32(v)", *isnan_ = "((v) != (v))", *ks = 4; break;
    case KL_BF16: *t = "uint16_t", *k = "float", *key = "ke_bf16_to_f32(v)", *isnan_ = "((v) != (v))", *ks = 4; break;
    case KL_I32: *t = *k = "int32_t"; break;
    case KL_I64: *t = *k = "long long"; break;
    default: *t = *k = "uint8_t"; break; /* u8, bool (0 / 1 bytes) */
    }
}

char *cn_sort_source(kl_dtype dt) {
    const char *t, *k, *key, *isn;
    int ks;
    so_types(dt, &t, &k, &key, &isn, &ks);
    const char *fmt = "//kiln sort kernel\n#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n\ntypedef %s kl_sortdims;\n"
                      "#define T %s\n#define K %s\n#define KEY(v) %s\n#define ISNAN(v) %s\n\n%s";
    const char *dims = SO_STR(SO_DIMS_DEF);
    size_t n = strlen(fmt) + strlen(dims) + sizeof so_template + 256;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, dims, t, k, key, isn, so_template);
    return s;
}

typedef struct so_gen {
    kl_dtype dt;
    const char *entry;
} so_gen;

static int so_generate(void *ctx, cn_kernel_src *src) {
    const so_gen *g = ctx;
    memset(src, 0, sizeof *src);
    if (!(src->src = cn_sort_source(g->dt))) return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, "%s", g->entry);
    return 0;
}

enum { SO_ROW, SO_TILES, SO_MERGE };
static const char *const so_entry[] = {"kl_sort", "kl_sort_tiles", "kl_sort_merge"};

/* Entry `which` of dt's program, launched on grid x block with `shared` dynamic bytes. */
static int so_launch(const char *op, int dev, kl_dtype dt, int which, int64_t blocks, unsigned threads,
                     unsigned shared, void **args) {
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 14; /* the sort kernels */
    key.op = which;
    key.dev = dev;
    key.dt[0] = (uint8_t)dt;
    so_gen g = {dt, so_entry[which]};
    CUfunction fn;
    if (cn_eager_fn(op, &key, so_generate, &g, &fn) || ku_device_enter(op, dev)) return -1;
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1}, block[3] = {threads, 1, 1};
    return ku_launch(op, fn, grid, block, shared, ku_current_stream(dev), args);
}

static int64_t so_tile = CN_SORT_MAX_ROW;
void cn_set_sort_tile(int64_t tile) { so_tile = tile >= 8 && tile <= CN_SORT_MAX_ROW ? tile : CN_SORT_MAX_ROW; }

/* threads for a bitonic network over L pairs: one per compared pair up to 256
 * (each idle thread is a fiber on the emulator) */
static unsigned so_threads(int L) { return L / 2 < 32 ? 32 : L / 2 > 256 ? 256 : (unsigned)L / 2; }

/* Rows longer than a tile: tiles sorted in shared memory, then merge passes
 * in global memory through two scratch buffers of (key, position) pairs. */
static int sort_long(const char *op, int dev, kl_dtype dt, int ks, struct kl_sortdims *d, void *px, void *pv,
                     void *pi) {
    const ku_driver *drv = ku_driver_get(op);
    if (!drv || ku_device_enter(op, dev)) return -1;
    CUstream s = ku_current_stream(dev);
    const size_t pairs = (size_t)(d->rows * d->n);
    CUdeviceptr buf[4] = {0, 0, 0, 0}; /* keys and positions, twice */
    int rc = 0;
    for (int b = 0; b < 4 && !rc; b++)
        if (!(buf[b] = ku_malloc(op, dev, pairs * (size_t)(b % 2 ? 4 : ks), s))) rc = -1;
    d->tile = so_tile;
    d->L = 8;
    while (d->L < d->tile) d->L *= 2;
    void *k0 = (void *)(uintptr_t)buf[0], *i0 = (void *)(uintptr_t)buf[1], *k1 = (void *)(uintptr_t)buf[2],
         *i1 = (void *)(uintptr_t)buf[3];
    if (!rc) {
        void *args[] = {&px, &k0, &i0, d};
        const int64_t tiles = (d->n + d->tile - 1) / d->tile;
        rc = so_launch(op, dev, dt, SO_TILES, d->rows * tiles, so_threads(d->L), (unsigned)(d->L * (ks + 4)), args);
    }
    for (long long w = d->tile; !rc && w < d->n; w *= 2) {
        int fin = 2 * w >= d->n;
        void *args[] = {&k0, &i0, &k1, &i1, &px, &pv, &pi, d, &w, &fin};
        rc = so_launch(op, dev, dt, SO_MERGE, ((int64_t)pairs + CN_BLOCK - 1) / CN_BLOCK, CN_BLOCK, 0, args);
        void *t = k0;
        k0 = k1, k1 = t, t = i0, i0 = i1, i1 = t;
    }
    for (int b = 0; b < 4; b++)
        if (buf[b]) ku_free(op, buf[b]);
    return rc ? -1 : 0;
}

int ku_cuda_sort(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    kl_tensor *v = c->out[0], *ix = c->out[1];
    const int topk = c->op == KE_OP_topk;
    const int dim = ke_wrap_dim(op, topk ? ke_attr_topk_dim(&c->a) : ke_attr_sort_dim(&c->a), x->ndim);
    if (dim < 0) return -1;
    const int64_t n = x->ndim ? x->shape[dim] : 1, total = ke_numel(x->ndim, x->shape);
    const int64_t k = topk ? ke_attr_topk_k(&c->a) : n;
    if (total == 0 || k == 0) return 0;
    if (n > INT32_MAX) { /* positions are 32-bit on the device */
        char b[256];
        return ke_err(KL_ERR_UNSUPPORTED, op, "rows of %lld elements (dim %d of %s) are longer than the 2^31 - 1 "
                      "a CUDA sort indexes; move the tensor to the CPU with kl_to_device",
                      (long long)n, dim, ke_fmt_tensor(b, sizeof b, x));
    }
    struct kl_sortdims d;
    memset(&d, 0, sizeof d);
    d.rows = total / n, d.n = n, d.k = k;
    d.nd = x->ndim, d.d = dim;
    d.desc = topk ? (int)ke_attr_topk_largest(&c->a) : (int)ke_attr_sort_descending(&c->a);
    for (int e = 0; e < x->ndim; e++) d.shape[e] = x->shape[e], d.xst[e] = x->stride[e], d.ost[e] = v->stride[e];
    d.xs = x->ndim ? x->stride[dim] : 0;
    d.os = x->ndim ? v->stride[dim] : 0;
    const char *t_, *k_, *key_, *isn_;
    int ks;
    so_types((kl_dtype)x->dtype, &t_, &k_, &key_, &isn_, &ks);
    const int dev = c->device.index;
    const kl_dtype dt = (kl_dtype)x->dtype;
    void *px = ke_data(x), *pv = ke_data(v), *pi = ke_data(ix);
    if (n > so_tile) return sort_long(op, dev, dt, ks, &d, px, pv, pi);
    d.L = 8; /* at least 8: the positions after L keys stay 4-byte aligned for every key size */
    while (d.L < n) d.L *= 2;
    void *args[] = {&px, &pv, &pi, &d};
    return so_launch(op, dev, dt, SO_ROW, d.rows, so_threads(d.L), (unsigned)(d.L * (ks + 4)), args);
}
