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
 * run — 48 KiB with 8-byte keys, the most a block may ask without opting
 * in. A longer row is refused with KL_ERR_UNSUPPORTED naming its length
 * (no multi-pass merge yet). topk is the first k of the row sorted
 * descending (largest) or ascending, as on the CPU (sorted = false gives
 * them sorted too). docs/GPU.md, "What runs on CUDA".
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
    "/* (a, ia) before (b, ib) in the stable sort's order; positions past the row last */\n"
    "static __device__ __forceinline__ int kl_before(K a, int ia, K b, int ib, int n, int desc) {\n"
    "    if (ia >= n) return 0;\n"
    "    if (ib >= n) return 1;\n"
    "    if (desc ? kl_lt(b, a) : kl_lt(a, b)) return 1;\n"
    "    if (desc ? kl_lt(a, b) : kl_lt(b, a)) return 0;\n"
    "    return ia < ib;\n"
    "}\n"
    "extern \"C\" __global__ void kl_sort(const T *__restrict__ x, T *__restrict__ v, long long *__restrict__ ix,\n"
    "                                    kl_sortdims d) {\n"
    "    KL_DYN_SHARED(K, key);\n"
    "    int *id = (int *)(key + d.L);\n"
    "    const int n = (int)d.n;\n"
    "    for (long long r = blockIdx.x; r < d.rows; r += gridDim.x) {\n"
    "        long long xo = 0, oo = 0, q = r;\n"
    "        for (int e = d.nd - 1; e >= 0; e--) {\n"
    "            if (e == d.d) continue;\n"
    "            const long long c = q % d.shape[e];\n"
    "            q /= d.shape[e];\n"
    "            xo += c * d.xst[e];\n"
    "            oo += c * d.ost[e];\n"
    "        }\n"
    "        for (int p = threadIdx.x; p < d.L; p += blockDim.x) {\n"
    "            if (p < n) key[p] = KEY(x[xo + p * d.xs]);\n"
    "            id[p] = p;\n"
    "        }\n"
    "        __syncthreads();\n"
    "        for (int k = 2; k <= d.L; k <<= 1) {\n"
    "            for (int j = k >> 1; j > 0; j >>= 1) {\n"
    "                for (int t = threadIdx.x; t < d.L / 2; t += blockDim.x) {\n"
    "                    const int a = t / j * 2 * j + t % j, b = a + j;\n"
    "                    /* a run of the ascending half keeps a before b, of the other half after */\n"
    "                    const int swap = (a & k) == 0 ? kl_before(key[b], id[b], key[a], id[a], n, d.desc)\n"
    "                                                  : kl_before(key[a], id[a], key[b], id[b], n, d.desc);\n"
    "                    if (swap) {\n"
    "                        const K tk = key[a];\n"
    "                        const int ti = id[a];\n"
    "                        key[a] = key[b], id[a] = id[b];\n"
    "                        key[b] = tk, id[b] = ti;\n"
    "                    }\n"
    "                }\n"
    "                __syncthreads();\n"
    "            }\n"
    "        }\n"
    "        for (int p = threadIdx.x; p < d.k; p += blockDim.x) {\n"
    "            const int s = id[p];\n"
    "            v[oo + p * d.os] = x[xo + s * d.xs];\n"
    "            ix[oo + p * d.os] = s;\n"
    "        }\n"
    "        __syncthreads(); /* the next row reuses the shared arrays */\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_sort)\n";

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

static int so_generate(void *ctx, cn_kernel_src *src) {
    memset(src, 0, sizeof *src);
    if (!(src->src = cn_sort_source(*(const kl_dtype *)ctx)))
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, "kl_sort");
    return 0;
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
    if (n > CN_SORT_MAX_ROW) {
        char b[256];
        return ke_err(KL_ERR_UNSUPPORTED, op,
                      "rows of %lld elements (dim %d of %s) are longer than the %d a CUDA block sorts in shared "
                      "memory; move the tensor to the CPU with kl_to_device",
                      (long long)n, dim, ke_fmt_tensor(b, sizeof b, x), CN_SORT_MAX_ROW);
    }
    struct kl_sortdims d;
    memset(&d, 0, sizeof d);
    d.rows = total / n, d.n = n, d.k = k;
    d.nd = x->ndim, d.d = dim;
    d.desc = topk ? (int)ke_attr_topk_largest(&c->a) : (int)ke_attr_sort_descending(&c->a);
    for (int e = 0; e < x->ndim; e++) d.shape[e] = x->shape[e], d.xst[e] = x->stride[e], d.ost[e] = v->stride[e];
    d.xs = x->ndim ? x->stride[dim] : 0;
    d.os = x->ndim ? v->stride[dim] : 0;
    d.L = 8; /* at least 8: the positions after L keys stay 4-byte aligned for every key size */
    while (d.L < n) d.L *= 2;
    const char *t_, *k_, *key_, *isn_;
    int ks;
    so_types((kl_dtype)x->dtype, &t_, &k_, &key_, &isn_, &ks);
    const int dev = c->device.index;
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 14; /* the sort kernel */
    key.dev = dev;
    key.dt[0] = (uint8_t)x->dtype;
    kl_dtype dt = (kl_dtype)x->dtype;
    CUfunction fn;
    if (cn_eager_fn(op, &key, so_generate, &dt, &fn) || ku_device_enter(op, dev)) return -1;
    /* a thread per compared pair up to 256 (each idle thread is a fiber on the emulator) */
    const unsigned threads = d.L / 2 < 32 ? 32 : d.L / 2 > 256 ? 256 : (unsigned)d.L / 2;
    const unsigned grid[3] = {(unsigned)(d.rows > 65535 ? 65535 : d.rows), 1, 1}, block[3] = {threads, 1, 1};
    void *px = ke_data(x), *pv = ke_data(v), *pi = ke_data(ix), *args[] = {&px, &pv, &pi, &d};
    return ku_launch(op, fn, grid, block, (unsigned)(d.L * (ks + 4)), ku_current_stream(dev), args);
}
