/*
 * cn_scan.c — cumsum and cumprod on CUDA tensors, over any dim.
 *
 * The CPU's rules (src/eager/scan.c): floats accumulate in double and round
 * to their own dtype; integers and bool give int64, wrapping. The input is
 * seen as [outer, len, inner] (len the scanned dim); each line (o, i) is a
 * row of len elements at stride xsk, the output contiguous.
 *
 * Two kernels in one program, by row length:
 *   - kl_scan_seq: a thread per line, the CPU's sequential chain (bit for
 *     bit the CPU's result), for lines of up to CN_SCAN_SEQ elements;
 *   - kl_scan_blk: a block per line (grid-stride over lines); the line in
 *     tiles of blockDim elements: an inclusive warp scan by shuffles, the
 *     warps' totals scanned by the first warp through shared memory, then
 *     the carry of the tiles before. A tree, not the chain: float results
 *     differ from the CPU's in the last bits of the double accumulator
 *     (after rounding to f32 almost never); integers are exact.
 * Input dtypes other than f32 / f64 / int64 are cast on the device first
 * (f16 / bf16 to f64, integers and bool to int64: exact), and f16 / bf16
 * results are written as f64 and cast once, so no value is rounded twice.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lines up to this long are scanned by one thread each (exact); longer ones by a block. */
#define CN_SCAN_SEQ 64

static const char scan_src[] =
    "extern \"C\" __global__ void kl_scan_seq(const TI *__restrict__ x, TO *__restrict__ out, long long lines,\n"
    "                                         long long len, long long inner, long long xso, long long xsi,\n"
    "                                         long long xsk) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < lines; r += step) {\n"
    "        const long long o = r / inner, in = r % inner;\n"
    "        const TI *xr = x + o * xso + in * xsi;\n"
    "        TO *orow = out + o * len * inner + in;\n"
    "        TA c = (TA)ID;\n"
    "        for (long long k = 0; k < len; k++) {\n"
    "            c = c OP (TA)xr[k * xsk];\n"
    "            orow[k * inner] = (TO)c;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_scan_seq)\n"
    "extern \"C\" __global__ void kl_scan_blk(const TI *__restrict__ x, TO *__restrict__ out, long long lines,\n"
    "                                         long long len, long long inner, long long xso, long long xsi,\n"
    "                                         long long xsk) {\n"
    "    __shared__ TA tot[32];\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "    for (long long r = blockIdx.x; r < lines; r += gridDim.x) {\n"
    "        const long long o = r / inner, in = r % inner;\n"
    "        const TI *xr = x + o * xso + in * xsi;\n"
    "        TO *orow = out + o * len * inner + in;\n"
    "        TA carry = (TA)ID;\n"
    "        for (long long base = 0; base < len; base += blockDim.x) {\n"
    "            const long long k = base + threadIdx.x;\n"
    "            TA v = k < len ? (TA)xr[k * xsk] : (TA)ID;\n"
    "            for (int d = 1; d < 32; d <<= 1) {\n"
    "                const TA n = __shfl_up_sync(0xffffffffu, v, d);\n"
    "                if (lane >= d) v = n OP v;\n"
    "            }\n"
    "            if (lane == 31) tot[warp] = v;\n"
    "            __syncthreads();\n"
    "            if (warp == 0) {\n"
    "                TA w = lane < nw ? tot[lane] : (TA)ID;\n"
    "                for (int d = 1; d < 32; d <<= 1) {\n"
    "                    const TA n = __shfl_up_sync(0xffffffffu, w, d);\n"
    "                    if (lane >= d) w = n OP w;\n"
    "                }\n"
    "                if (lane < nw) tot[lane] = w;\n"
    "            }\n"
    "            __syncthreads();\n"
    "            const TA before = warp ? tot[warp - 1] : (TA)ID;\n"
    "            if (k < len) orow[k * inner] = (TO)(carry OP (before OP v));\n"
    "            const TA next = carry OP tot[nw - 1];\n"
    "            __syncthreads(); /* tot is rewritten by the next tile */\n"
    "            carry = next;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_scan_blk)\n";

typedef struct scan_gen {
    int prod, blk; /* blk: the entry point is kl_scan_blk (else kl_scan_seq); one program holds both */
    kl_dtype t; /* the kernel's element type: f32, f64 or i64 (in and out alike) */
} scan_gen;

static int gen_scan(void *ctx, cn_kernel_src *src) {
    const scan_gen *g = ctx;
    const char *T = g->t == KL_F32 ? "float" : g->t == KL_F64 ? "double" : "long long";
    const char *A = g->t == KL_I64 ? "unsigned long long" : "double"; /* wraps, as the CPU's uint64_t */
    const size_t cap = sizeof scan_src + 512;
    char *s = malloc(cap);
    if (!s) return ke_err(KL_ERR_OOM, "scan", "out of memory for a kernel source");
    int len = snprintf(s, cap,
                       "//kiln scan kernel\n#include \"kiln_cuda.h\"\n"
                       "#define TI %s\n#define TO %s\n#define TA %s\n#define OP %s\n#define ID %s\n%s",
                       T, T, A, g->prod ? "*" : "+", g->prod ? "1" : "0", scan_src);
    if (len < 0 || (size_t)len >= cap) {
        free(s);
        return ke_err(KL_ERR_INTERNAL, "scan", "kernel source too long");
    }
    memset(src, 0, sizeof *src);
    src->src = s;
    strcpy(src->name, g->blk ? "kl_scan_blk" : "kl_scan_seq");
    return 0;
}

int cn_scan_program(int prod, kl_dtype t, cn_kernel_src *src) {
    scan_gen g = {prod, 0, t};
    return gen_scan(&g, src);
}

/* Whether dims [a, b) of t read as one dim of stride *st (sizes 1 aside). */
static int collapse(const kl_tensor *t, int a, int b, int64_t *st) {
    int64_t want = 0;
    int any = 0;
    *st = 0;
    for (int d = b - 1; d >= a; d--) {
        if (t->shape[d] == 1) continue;
        if (!any) {
            *st = t->stride[d];
            want = t->stride[d] * t->shape[d];
            any = 1;
        } else if (t->stride[d] != want) {
            return 0;
        } else {
            want *= t->shape[d];
        }
    }
    return 1;
}

int ku_cuda_scan(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *out = c->out[0];
    const int nd = x->ndim;
    const int d = nd ? ke_wrap_dim(op, ke_attr_cumsum_dim(&c->a), nd) : 0;
    if (d < 0) return -1;
    const int64_t n = ke_numel(nd, x->shape);
    if (n == 0) return 0;
    const int64_t len = nd ? x->shape[d] : 1, inner = nd ? ke_numel(nd - d - 1, x->shape + d + 1) : 1,
                  lines = n / len;
    const int isf = ke_is_float((kl_dtype)x->dtype);
    /* the kernel's type: f32 and f64 as they are, f16 / bf16 through f64, integers and bool as int64 */
    const kl_dtype t = !isf ? KL_I64 : x->dtype == KL_F32 ? KL_F32 : KL_F64;
    const int dev = c->device.index;
    kl_scope_begin();
    int rc = 0;
    kl_tensor *src = x, *dst = out;
    int64_t xso = 0, xsi = 0, xsk = nd ? x->stride[d] : 0;
    if (x->dtype != t || !(collapse(x, 0, d, &xso) && collapse(x, d + 1, nd, &xsi))) {
        if (!(src = kl_empty_on(nd, x->shape, t, c->device)) || cn_copy_into(c, x, src)) rc = -1;
        xsk = inner, xsi = 1, xso = len * inner;
    }
    if (!rc && (out->dtype != t || !cn_is_contiguous(out)))
        if (!(dst = kl_empty_on(nd, x->shape, t, c->device))) rc = -1;
    const int seq = len <= CN_SCAN_SEQ;
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 11; /* a scan */
    key.op = c->op;
    key.dev = dev;
    key.nin = 1;
    key.dt[0] = (uint8_t)t;
    key.rank = (uint8_t)!seq; /* which of the program's two kernels (one module: the same source) */
    scan_gen g = {c->op == KE_OP_cumprod, !seq, t};
    CUfunction fn = NULL;
    if (!rc) rc = cn_eager_fn(op, &key, gen_scan, &g, &fn);
    if (!rc) rc = ku_device_enter(op, dev);
    if (!rc) {
        void *px = ke_data(src), *po = ke_data(dst);
        long long a[6] = {lines, len, inner, xso, xsi, xsk};
        void *args[] = {&px, &po, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5]};
        unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
        if (seq) {
            const int64_t blocks = (lines + CN_BLOCK - 1) / CN_BLOCK;
            grid[0] = (unsigned)(blocks > 65535 ? 65535 : blocks);
            block[0] = lines < CN_BLOCK ? (unsigned)(lines + 31) / 32 * 32 : CN_BLOCK;
        } else {
            grid[0] = (unsigned)(lines > 65535 ? 65535 : lines);
            block[0] = len >= 2048 ? 256u : (unsigned)CN_BLOCK;
        }
        rc = ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
    }
    if (!rc && dst != out) rc = cn_copy_into(c, dst, out);
    kl_scope_end();
    return rc ? -1 : 0;
}
