/*
 * cn_argreduce.c — argmax, argmin, max_dim and min_dim on CUDA tensors: a
 * hand-written row kernel (CUDA C below) that carries (value, position)
 * pairs through the block's fold, with the CPU's rules from rd_formulas.h:
 * ARGMAX_BETTER / ARGMIN_BETTER (a NaN beats any number) and, between two
 * equal values (or two NaNs), the first position (tmpl/rd_index_op.h's
 * `take`). So positions and values equal the CPU's exactly, whatever the
 * order the tree folds in.
 *
 * The input is seen as [rows, len] (cn_row_view: reduced dims last, read in
 * place when they collapse, else copied on the device first), values loaded
 * in the CPU loop's dtype (f16/bf16 as f32, bool as uint8) and stored back
 * in the input's dtype, positions as int64 over the reduced dims in order
 * (argmax without a dim: the flattened tensor). One module per (better, input
 * dtype) serves argmax (no values) and max_dim (values and positions).
 *
 * Long rows (cn_row_split) are folded by several blocks each, writing their
 * pair to a temporary; a finishing kernel folds each row's pairs.
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "kernels_reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' parameter block: defined once, stringified into the source. */
#define KA_DIMS_DEF                                                                                        \
    struct kl_argdims {                                                                                    \
        long long rows, len, rs, ls; /* input rows at stride rs, elements at ls */                         \
        long long chunk, nsplit;     /* elements per block and blocks per row (1: not split) */            \
    }
KA_DIMS_DEF;
#define KA_STR_(...) #__VA_ARGS__
#define KA_STR(x) KA_STR_(x)

/* Defined before it: KA_TIN (the input's C type), KA_T (the compared
 * dtype's), KA_LOAD(r), KA_STORE(v) (to the input's dtype), KA_BETTER(a, b). */
static const char ka_template[] =
    "/* v, i is taken over bv, bi if better, or equal and earlier (i < 0: none) */\n"
    "static __device__ __forceinline__ void kl_take(KA_T &bv, long long &bi, KA_T v, long long i) {\n"
    "    if (i >= 0 && (bi < 0 || KA_BETTER(v, bv) || (RK_SAME(v, bv) && i < bi))) {\n"
    "        bv = v;\n"
    "        bi = i;\n"
    "    }\n"
    "}\n"
    "/* the warp's pairs folded by shuffles; every lane gets it */\n"
    "static __device__ __forceinline__ void kl_warp_fold(KA_T &bv, long long &bi) {\n"
    "    for (int m = 16; m > 0; m >>= 1) {\n"
    "        const KA_T ov = kl_shfl_xor(bv, m);\n"
    "        const long long oi = __shfl_xor_sync(0xffffffffu, bi, m);\n"
    "        kl_take(bv, bi, ov, oi);\n"
    "    }\n"
    "}\n"
    "/* the block's pairs folded: the warps', then theirs through shared memory; every thread gets it */\n"
    "static __device__ __forceinline__ void kl_fold(KA_T &bv, long long &bi, KA_T *sv, long long *si) {\n"
    "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;\n"
    "    kl_warp_fold(bv, bi);\n"
    "    if (lane == 0) {\n"
    "        sv[warp] = bv;\n"
    "        si[warp] = bi;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if (warp == 0) {\n"
    "        bi = lane < nwarps ? si[lane] : -1;\n"
    "        if (lane < nwarps) bv = sv[lane];\n"
    "        kl_warp_fold(bv, bi);\n"
    "        if (lane == 0) {\n"
    "            sv[0] = bv;\n"
    "            si[0] = bi;\n"
    "        }\n"
    "    }\n"
    "    __syncthreads();\n"
    "    bv = sv[0];\n"
    "    bi = si[0];\n"
    "    __syncthreads(); /* sv, si are read before the next row reuses them */\n"
    "}\n"
    "\n"
    "/* block b folds part b % nsplit of row b / nsplit: its pair to val / idx (not\n"
    " * split; val may be null) or to the temporaries pv / pi (split) */\n"
    "extern \"C\" __global__ void kl_argrow(const KA_TIN *__restrict__ x, KA_TIN *__restrict__ val,\n"
    "                                      long long *__restrict__ idx, KA_T *__restrict__ pv,\n"
    "                                      long long *__restrict__ pi, kl_argdims d) {\n"
    "    __shared__ KA_T sv[32];\n"
    "    __shared__ long long si[32];\n"
    "    for (long long b = blockIdx.x; b < d.rows * d.nsplit; b += gridDim.x) {\n"
    "        const long long row = b / d.nsplit, j0 = b % d.nsplit * d.chunk;\n"
    "        const long long j1 = j0 + d.chunk < d.len ? j0 + d.chunk : d.len;\n"
    "        const KA_TIN *xr = x + row * d.rs;\n"
    "        KA_T bv = (KA_T)0;\n"
    "        long long bi = -1;\n"
    "        /* a thread's positions grow: only a better value replaces (the first of equals stays) */\n"
    "        for (long long j = j0 + threadIdx.x; j < j1; j += blockDim.x) {\n"
    "            const KA_T v = KA_LOAD(xr[j * d.ls]);\n"
    "            if (bi < 0 || KA_BETTER(v, bv)) {\n"
    "                bv = v;\n"
    "                bi = j;\n"
    "            }\n"
    "        }\n"
    "        kl_fold(bv, bi, sv, si);\n"
    "        if (threadIdx.x == 0) {\n"
    "            if (d.nsplit > 1) {\n"
    "                pv[b] = bv;\n"
    "                pi[b] = bi;\n"
    "            } else {\n"
    "                if (val) val[row] = KA_STORE(bv);\n"
    "                idx[row] = bi;\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_argrow)\n"
    "\n"
    "/* the nsplit pairs of each row (a split fold's partials) folded into one */\n"
    "extern \"C\" __global__ void kl_argfin(const KA_T *__restrict__ pv, const long long *__restrict__ pi,\n"
    "                                      KA_TIN *__restrict__ val, long long *__restrict__ idx, kl_argdims d) {\n"
    "    __shared__ KA_T sv[32];\n"
    "    __shared__ long long si[32];\n"
    "    for (long long row = blockIdx.x; row < d.rows; row += gridDim.x) {\n"
    "        KA_T bv = (KA_T)0;\n"
    "        long long bi = -1;\n"
    "        for (long long j = threadIdx.x; j < d.nsplit; j += blockDim.x)\n"
    "            kl_take(bv, bi, pv[row * d.nsplit + j], pi[row * d.nsplit + j]);\n"
    "        kl_fold(bv, bi, sv, si);\n"
    "        if (threadIdx.x == 0) {\n"
    "            if (val) val[row] = KA_STORE(bv);\n"
    "            idx[row] = bi;\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(kl_argfin)\n";

typedef struct ka_gen {
    int better; /* KE_OP_argmax or KE_OP_argmin */
    kl_dtype in, cd;
    int fin; /* the entry point: kl_argrow (0) or kl_argfin (1) */
} ka_gen;

/* The program of one (better, input dtype): both kernels. */
static char *ka_source(const ka_gen *g) {
    const char *fmt = "#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n#include \"rd_formulas.h\"\n\n%s"
                      "typedef %s kl_argdims;\n"
                      "#define KA_TIN %s\n#define KA_T %s\n#define KA_LOAD(r) KE_CV_LOAD_%s(r)\n"
                      "#define KA_STORE(v) KE_CV_STORE_%s(v, %d)\n#define KA_BETTER(a, b) %s_BETTER(a, b)\n\n%s";
    const char *dims = KA_STR(KA_DIMS_DEF), *better = g->better == KE_OP_argmax ? "ARGMAX" : "ARGMIN";
    size_t n = strlen(fmt) + strlen(cn_prelude_row) + strlen(dims) + sizeof ka_template + 256;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, fmt, cn_prelude_row, dims, cn_ctype(g->in), cn_ctype(g->cd), cn_cvname(g->in),
                 cn_cvname(g->in), ke_is_float(g->cd), better, ka_template);
    return s;
}

char *cn_argreduce_source(int op, kl_dtype in, kl_dtype cd) {
    const ka_gen g = {op == KE_OP_argmax || op == KE_OP_max_dim ? KE_OP_argmax : KE_OP_argmin, in, cd, 0};
    return ka_source(&g);
}

static int ka_generate(void *ctx, cn_kernel_src *src) {
    const ka_gen *g = ctx;
    memset(src, 0, sizeof *src);
    if (!(src->src = ka_source(g))) return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, g->fin ? "kl_argfin" : "kl_argrow");
    return 0;
}

/* The kernel of g (both entry points are one program: one module), through the eager cache. */
static int ka_function(const char *op, const ke_call *c, ka_gen g, int fin, CUfunction *fn) {
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 5; /* an arg reduction */
    key.op = g.better;
    key.dev = c->device.index;
    key.nin = 1;
    key.cls = (uint8_t)(1 + fin);
    key.compute = (uint8_t)g.cd;
    key.dt[0] = (uint8_t)g.in;
    g.fin = fin;
    return cn_eager_fn(op, &key, ka_generate, &g, fn);
}

int ku_cuda_argreduce(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0];
    const ke_rd_op *ro = ke_ops[c->op].impl;
    if (!ro || !ro->k[c->compute]) {
        char b[256];
        return ke_err(KL_ERR_DTYPE, op, "not implemented for %s", ke_fmt_tensor(b, sizeof b, x));
    }
    kl_tensor *val = ro->vout >= 0 ? c->out[ro->vout] : NULL, *idx = c->out[ro->iout];
    uint32_t mask;
    if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
    const int dev = c->device.index;
    const ka_gen g = {c->op == KE_OP_argmax || c->op == KE_OP_max_dim ? KE_OP_argmax : KE_OP_argmin,
                      (kl_dtype)x->dtype, c->compute, 0};
    kl_scope_begin();
    cn_rows v;
    int rc = cn_row_view(c, x, mask, &v);
    if (rc || v.rows == 0) goto done;
    struct kl_argdims d = {v.rows, v.len, v.rs, v.ls, 0, 0};
    int64_t chunk;
    d.nsplit = cn_row_split(v.len, &chunk);
    d.chunk = chunk;
    CUfunction fn, fin = NULL;
    if ((rc = ka_function(op, c, g, 0, &fn)) || (d.nsplit > 1 && (rc = ka_function(op, c, g, 1, &fin)))) goto done;
    kl_tensor *pv = NULL, *pi = NULL;
    if (d.nsplit > 1) {
        const int64_t np = d.rows * d.nsplit;
        pv = kl_empty_on(1, &np, (kl_dtype)g.cd, c->device);
        pi = kl_empty_on(1, &np, KL_I64, c->device);
        if (!pv || !pi) {
            rc = -1;
            goto done;
        }
    }
    if ((rc = ku_device_enter(op, dev))) goto done;
    void *px = ke_data(v.src), *pval = val ? ke_data(val) : NULL, *pidx = ke_data(idx);
    void *ppv = pv ? ke_data(pv) : NULL, *ppi = pi ? ke_data(pi) : NULL;
    void *args[] = {&px, &pval, &pidx, &ppv, &ppi, &d};
    const int64_t blocks = d.rows * d.nsplit;
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                   block[3] = {cn_row_threads(d.chunk, 0), 1, 1};
    CUstream s = ku_current_stream(dev);
    rc = ku_launch(op, fn, grid, block, 0, s, args);
    if (!rc && fin) {
        void *fargs[] = {&ppv, &ppi, &pval, &pidx, &d};
        const unsigned fgrid[3] = {(unsigned)(d.rows > 65535 ? 65535 : d.rows), 1, 1},
                       fblock[3] = {cn_row_threads(d.nsplit, 0), 1, 1};
        rc = ku_launch(op, fin, fgrid, fblock, 0, s, fargs);
    }
done:
    kl_scope_end();
    return rc ? -1 : 0;
}
