/*
 * cn_join.c — the data-movement ops on CUDA tensors whose output element
 * reads one input element found by per-dim index arithmetic: cat (so stack
 * and roll, their decompositions), pad (constant, reflect, replicate,
 * circular), flip, repeat, and tril / triu (the identity map with the
 * elements outside the triangle filled with zero bytes).
 *
 * One kernel, kl_remap, per element size (elements move as bits, so the
 * result equals the CPU's byte for byte): for output position (c_0..c_n-1)
 * each dim maps its coordinate to a source coordinate by its mode — the
 * identity, flip (s - 1 - c), repeat (c mod s), constant pad (c - l, outside
 * [0, s): the fill value) or pad's other modes through ke_pad_source, the
 * CPU's own function pasted in as text (kernels_index.h) — and the element
 * is x[sum j_k * xs_k], written at sum c_k * os_k. The whole map travels in
 * the kernel's parameter block (kl_remapdims, by value): no tables, no
 * synchronize. cat launches it once per input into its slice of the output
 * (an input of another dtype is cast on the device first, ke_convert's
 * rule through cn_copy_into, as the CPU's ke_copy_nd converts).
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "dtype_conv.h"
#include "kernels_index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernel's parameter block: defined once, stringified into the source. */
#define JN_DIMS_DEF                                                                                     \
    struct kl_remapdims {                                                                               \
        long long n;                /* output elements */                                               \
        long long shape[8], os[8];  /* the output's shape and strides */                                \
        long long size[8], xs[8];   /* the source's size and stride of each dim */                      \
        long long l[8], r[8];       /* pads (pad modes) */                                              \
        unsigned long long fill;    /* constant pad's value, as the element's bits */                   \
        long long diag;             /* tril / triu: the diagonal */                                     \
        int mode[8];                /* JN_ID, JN_REFLECT.. (kl_pad_mode), JN_CONST, JN_FLIP, JN_REPEAT */ \
        int nd, tri;                /* rank; 1 tril, 2 triu over the last two dims (0 outside: zeros) */ \
    }
JN_DIMS_DEF;
_Static_assert(KL_MAX_DIMS == 8, "kl_remapdims holds KL_MAX_DIMS dims");
enum { JN_ID = 0, JN_CONST = 4, JN_FLIP = 5, JN_REPEAT = 6 }; /* 1..3: kl_pad_mode's reflect, replicate, circular */
#define JN_STR_(...) #__VA_ARGS__
#define JN_STR(x) JN_STR_(x)

static const char jn_template[] =
    "extern \"C\" __global__ void kl_remap(T *__restrict__ out, const T *__restrict__ x, kl_remapdims d) {\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < d.n;\n"
    "         i += (long long)gridDim.x * blockDim.x) {\n"
    "        long long q = i, o = 0, s = 0, row = 0, col = 0;\n"
    "        int fill = 0;\n"
    "        for (int k = d.nd - 1; k >= 0; k--) {\n"
    "            const long long c = q % d.shape[k];\n"
    "            q /= d.shape[k];\n"
    "            if (k == d.nd - 1) col = c;\n"
    "            if (k == d.nd - 2) row = c;\n"
    "            o += c * d.os[k];\n"
    "            const int m = d.mode[k];\n"
    "            long long j = c;\n"
    "            if (m == 4) {\n"
    "                j = c - d.l[k];\n"
    "                if (j < 0 || j >= d.size[k]) fill = 1;\n"
    "            } else if (m == 5) {\n"
    "                j = d.size[k] - 1 - c;\n"
    "            } else if (m == 6) {\n"
    "                j = c % d.size[k];\n"
    "            } else if (m != 0) {\n"
    "                j = ke_pad_source(m, c, d.size[k], d.l[k], d.r[k]);\n"
    "            }\n"
    "            s += j * d.xs[k];\n"
    "        }\n"
    "        if (d.tri == 1 ? col > row + d.diag : d.tri == 2 ? col < row + d.diag : 0) fill = 1;\n"
    "        out[o] = fill ? (T)d.fill : x[s];\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_remap)\n";

char *cn_join_source(int elem_size) {
    static const char *const bits[9] = {[1] = "uint8_t", [2] = "uint16_t", [4] = "uint32_t", [8] = "unsigned long long"};
    const char *fmt = "//kiln remap kernel\n#include \"kiln_cuda.h\"\n\ntypedef %s kl_remapdims;\n#define T %s\n%s\n\n%s";
    const char *dims = JN_STR(JN_DIMS_DEF), *pad = JN_STR(KE_PAD_SOURCE_DEF(static __device__ __forceinline__));
    size_t n = strlen(fmt) + strlen(dims) + strlen(pad) + sizeof jn_template + 64;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, dims, bits[elem_size], pad, jn_template);
    return s;
}

static int jn_generate(void *ctx, cn_kernel_src *src) {
    memset(src, 0, sizeof *src);
    if (!(src->src = cn_join_source(*(const int *)ctx)))
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, "kl_remap");
    return 0;
}

/* Launches kl_remap (elements of es bytes) over d: out and x are device addresses. */
static int jn_launch(const ke_call *c, int es, void *out, const void *x, struct kl_remapdims *d) {
    const char *op = ke_opname(c);
    const int dev = c->device.index;
    if (d->n == 0) return 0;
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 13; /* the remap kernel */
    key.dev = dev;
    key.dt[0] = (uint8_t)es;
    CUfunction fn;
    if (cn_eager_fn(op, &key, jn_generate, &es, &fn) || ku_device_enter(op, dev)) return -1;
    const int64_t blocks = (d->n + CN_BLOCK - 1) / CN_BLOCK;
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                   block[3] = {d->n < CN_BLOCK ? (unsigned)(d->n + 31) / 32 * 32 : CN_BLOCK, 1, 1};
    void *po = out, *px = (void *)x, *args[] = {&po, &px, d};
    return ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
}

/* d over t's shape (a 0-dim tensor as [1]), every dim the identity onto src. */
static void jn_domain(struct kl_remapdims *d, const kl_tensor *t, const kl_tensor *src) {
    memset(d, 0, sizeof *d);
    d->nd = t->ndim ? t->ndim : 1;
    d->n = 1;
    for (int e = 0; e < d->nd; e++) {
        d->shape[e] = t->ndim ? t->shape[e] : 1;
        d->os[e] = t->ndim ? t->stride[e] : 0;
        d->size[e] = src->ndim ? src->shape[e] : 1;
        d->xs[e] = src->ndim ? src->stride[e] : 0;
        d->n *= d->shape[e];
    }
}

int ku_cuda_flip(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    struct kl_remapdims d;
    jn_domain(&d, o, x);
    const int64_t *dims = ke_attr_flip_dims(&c->a);
    for (int i = 0; i < ke_attr_flip_dims_len(&c->a) && x->ndim; i++) {
        const int e = ke_wrap_dim(op, dims[i], x->ndim);
        if (e < 0) return -1;
        d.mode[e] = JN_FLIP;
    }
    return jn_launch(c, (int)ke_dtypes[x->dtype].size, ke_data(o), ke_data(x), &d);
}

int ku_cuda_pad(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    const int mode = (int)ke_attr_pad_mode(&c->a), nd = x->ndim;
    struct kl_remapdims d;
    jn_domain(&d, o, x);
    for (int e = 0; e < nd; e++) {
        int64_t l, r;
        ke_pad_pads(c, nd, e, &l, &r);
        d.l[e] = l, d.r[e] = r;
        /* constant: every dim shifts by its before-pad (and fills outside); others map only padded dims, as the CPU */
        d.mode[e] = mode == KL_PAD_CONSTANT ? JN_CONST : (l || r) ? mode : JN_ID;
    }
    if (mode == KL_PAD_CONSTANT) {
        _Alignas(8) char val[8] = {0};
        ke_store_f64(val, (kl_dtype)o->dtype, 0, ke_attr_pad_value(&c->a));
        uint64_t bits = 0;
        memcpy(&bits, val, ke_dtypes[o->dtype].size); /* little-endian: the element's bits, zero-extended */
        d.fill = bits;
    }
    return jn_launch(c, (int)ke_dtypes[x->dtype].size, ke_data(o), ke_data(x), &d);
}

/* Output dim e reads source dim e - off (the leading new dims: one element). */
int ku_cuda_repeat(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    struct kl_remapdims d;
    memset(&d, 0, sizeof d);
    const int off = o->ndim - x->ndim;
    d.nd = o->ndim ? o->ndim : 1;
    d.n = 1;
    for (int e = 0; e < d.nd; e++) {
        d.shape[e] = o->ndim ? o->shape[e] : 1;
        d.os[e] = o->ndim ? o->stride[e] : 0;
        d.size[e] = e >= off && x->ndim ? x->shape[e - off] : 1;
        d.xs[e] = e >= off && x->ndim ? x->stride[e - off] : 0;
        d.mode[e] = JN_REPEAT;
        d.n *= d.shape[e];
    }
    return jn_launch(c, (int)ke_dtypes[x->dtype].size, ke_data(o), ke_data(x), &d);
}

/* tril / triu: the elements on the kept side of the diagonal, zero bytes (0 in every dtype) elsewhere */
int ku_cuda_tri(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    struct kl_remapdims d;
    jn_domain(&d, o, x);
    d.tri = c->op == KE_OP_triu ? 2 : 1;
    /* triu has tril's attributes; beyond +-(R + C) every diagonal gives the same result (the CPU's clamp) */
    const int64_t R = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1, C = x->ndim >= 1 ? x->shape[x->ndim - 1] : 1;
    const int64_t k = ke_attr_tril_diagonal(&c->a);
    d.diag = k < -(R + C) ? -(R + C) : k > R + C ? R + C : k;
    return jn_launch(c, (int)ke_dtypes[x->dtype].size, ke_data(o), ke_data(x), &d);
}

/* PyTorch 1.13 skips 1-D empty inputs whatever the other shapes (join.c). */
static int legacy_empty(const kl_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

int ku_cuda_cat(ke_call *c) {
    kl_tensor *o = c->out[0];
    if (ke_numel(o->ndim, o->shape) == 0) return 0;
    const int dim = ke_wrap_dim(ke_opname(c), ke_attr_cat_dim(&c->a), o->ndim);
    if (dim < 0) return -1;
    const int es = (int)ke_dtypes[o->dtype].size;
    int64_t at = 0;
    int rc = 0;
    kl_scope_begin();
    for (int i = 0; i < c->nin && !rc; i++) {
        kl_tensor *t = c->in[i];
        if (legacy_empty(t)) continue;
        if (ke_numel(t->ndim, t->shape)) {
            /* another dtype: converted on the device first (ke_convert's rule, as ke_copy_nd) */
            kl_tensor *s = t->dtype == o->dtype ? t : cn_as_contiguous(c, t, (kl_dtype)o->dtype);
            struct kl_remapdims d;
            if (!s) {
                rc = -1;
                break;
            }
            jn_domain(&d, s, s);
            for (int e = 0; e < d.nd; e++) d.os[e] = o->stride[e];
            rc = jn_launch(c, es, ke_data(o) + at * o->stride[dim] * es, ke_data(s), &d);
        }
        at += t->shape[dim];
    }
    kl_scope_end();
    return rc ? -1 : 0;
}
