/*
 * cn_reduce.c — eager reductions on CUDA tensors (sum, mean, prod, amax,
 * amin, all, any; any dims, keepdim, every dtype the CPU takes) as the row
 * kernels compiled code generates (cn_emit.c: one block per output element,
 * the rd_formulas.h fold over the row, warp shuffles then shared memory);
 * var, std, logsumexp and norm composed of them; softmax, log_softmax,
 * layer_norm and rms_norm as one fused row kernel each (sections below).
 *
 * A reduction over a set of dims is a row reduction of the input seen as
 * [rows, len]: kept dims first, reduced dims last, both in order. When each
 * group of dims collapses into one stride (a contiguous tensor reduced over
 * its trailing dims, or over its leading ones, or any view where that holds)
 * the kernel reads the input in place with those two strides; otherwise one
 * copy kernel (the eager elementwise identity, cn_eager.c) first makes the
 * permuted input contiguous on the device.
 *
 * The kernel is in run-time-shape form (cn_emit_row_dyn): rows, len and the
 * strides are parameters, so one module per (op, input dtype, compute dtype,
 * output dtype) serves every shape (cn_eager_fn's cache).
 *
 * Floats: the fold is a tree (per-thread strided partials, then a warp and a
 * block tree), not the CPU's cascade, so sums, means and products differ from
 * eager CPU in the last bits (docs/GPU.md gives the tolerance); integers,
 * bool, amax and amin are exact.
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "kernels_reduce.h"

#include <math.h>
#include <string.h>

/* The reductions a row kernel folds in one pass (cn_emit.c's rd_table). */
static int row_foldable(int op) {
    return op == KE_OP_sum || op == KE_OP_mean || op == KE_OP_prod || op == KE_OP_amax || op == KE_OP_amin ||
           op == KE_OP_all || op == KE_OP_any;
}
/* The two-pass reductions and the norms: compositions of the above and of
 * elementwise ops on the device (composite() below). */
static int composed(int op) {
    return op == KE_OP_var || op == KE_OP_std || op == KE_OP_logsumexp || op == KE_OP_norm;
}

int ku_cuda_reduce_supported(int op) { return row_foldable(op) || composed(op); }

/* var, std, logsumexp and norm as the CPU's formulas written with eager ops
 * on the device, in the compute dtype (f16/bf16 and integers computed in
 * float as the CPU does, rounded once at the end): var = sum((x - mean)^2) /
 * max(n - correction, 0) (the CPU's two passes), std its square root;
 * logsumexp = log(sum(exp(x - m))) + m with m the max, 0 where infinite;
 * norm by p: 2 sqrt(sum(x*x)), 1 sum(|x|), inf amax(|x|), -inf amin(|x|), 0
 * the count of non-zeros, else sum(|x|^p)^(1/p). Each piece is one of this
 * file's or cn_eager.c's kernels (a few launches instead of one fused row
 * kernel); results within the floats' tolerance of the CPU. */
static int composite(ke_call *c) {
    kl_tensor *x = c->in[0], *out = c->out[0];
    const int nd = ke_attr_dims_len(&c->a), keep = ke_attr_keepdim(&c->a);
    const int64_t *dims = ke_attr_dims(&c->a);
    uint32_t mask;
    if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
    int64_t len = 1;
    for (int d = 0; d < x->ndim; d++)
        if (mask & (1u << d)) len *= x->shape[d];
    const kl_dtype cd = ke_is_float(c->compute) ? c->compute : (kl_dtype)out->dtype;
    kl_scope_begin();
    kl_tensor *xc = x->dtype == cd ? x : kl_to_dtype(x, cd), *r = NULL;
    if (!xc) goto done;
    switch (c->op) {
    case KE_OP_var:
    case KE_OP_std: {
        kl_tensor *dev = kl_sub(xc, kl_mean(xc, nd, dims, true));
        double div = (double)len - ke_attr_var_correction(&c->a);
        r = kl_div_scalar(kl_sum(kl_mul(dev, dev), nd, dims, keep), div > 0 ? div : 0);
        if (c->op == KE_OP_std) r = kl_sqrt(r);
        break;
    }
    case KE_OP_logsumexp: {
        kl_tensor *m = kl_amax(xc, nd, dims, true);
        kl_tensor *zero = kl_scalar_tensor(0, cd);
        m = kl_where(kl_isinf(m), zero, m);
        r = kl_add(kl_log(kl_sum(kl_exp(kl_sub(xc, m)), nd, dims, true)), m);
        break;
    }
    default: { /* norm */
        const double p = ke_attr_norm_p(&c->a);
        kl_tensor *a = kl_abs(xc);
        if (p == 2) r = kl_sqrt(kl_sum(kl_mul(xc, xc), nd, dims, keep));
        else if (p == 1) r = kl_sum(a, nd, dims, keep);
        else if (isinf(p)) r = p > 0 ? kl_amax(a, nd, dims, keep) : kl_amin(a, nd, dims, keep);
        else if (p == 0) r = kl_sum(kl_to_dtype(kl_ne_scalar(xc, 0), cd), nd, dims, keep);
        else r = kl_pow_scalar(kl_sum(kl_pow_scalar(a, p), nd, dims, keep), 1 / p);
        break;
    }
    }
    /* into out: its shape (keepdim or not: the same elements in the same order) and dtype */
    if (r) r = kl_reshape(r, out->ndim, out->shape);
    if (r && r->dtype != out->dtype) r = kl_to_dtype(r, (kl_dtype)out->dtype);
    if (r && !kl_copy_inplace(out, r)) r = NULL;
done:
    kl_scope_end();
    return r ? 0 : -1;
}

/* What one of this file's generated row kernels depends on (its cn_ekey
 * holds the same): the op, the input, compute and output dtypes, the device. */
typedef struct row_gen {
    int op;
    kl_dtype in, cd, out;
    kl_device dev;
    int *kr_out; /* set: only report the kernel's cache depth (cn_fused_row_cache), emit nothing */
} row_gen;

/* The cache depth the fused softmax and norm kernels have (cn_row_cache):
 * each holds one input, x, in registers (<= 2 words a value), so the
 * largest; the launches pick their block size by it without building the
 * kernel, and test_cuda_reduce checks it against cn_fused_row_cache. */
#define CN_FUSED_KR CN_ROW_KR_MAX

/* Emits k, or (probe) reports its cache depth. */
static int emit_or_probe(const row_gen *g, const ir_kernel *k, unsigned byval, cn_kernel_src *src) {
    if (g->kr_out) {
        *g->kr_out = cn_row_cache(k, NULL);
        return 0;
    }
    return cn_emit_row_dyn(k, "kl_row", byval, src);
}

/* k as a rank-2 row kernel over [rows, len] on g's device: bufs[0] the input
 * (g->in) read along the row, bufs[nin] the output (g->out), one value per row
 * (per_row) or one per element; shape and strides are placeholders, the
 * run-time-shape source takes them at launch. Zeroes bufs[0..nin] and st[0..nst). */
static void row_kernel(ir_kernel *k, ir_kbuf *bufs, int nin, ir_kstmt *st, int nst, const row_gen *g, int per_row) {
    memset(bufs, 0, sizeof *bufs * (size_t)(nin + 1));
    memset(st, 0, sizeof *st * (size_t)nst);
    *k = (ir_kernel){.ninputs = nin, .noutputs = 1, .bufs = bufs, .stmts = st, .ndim = 2, .row = 1,
                     .device = g->dev, .shape = {2, 2}};
    bufs[0] = (ir_kbuf){.dtype = g->in, .ndim = 2, .contig_inner = 1, .index = {2, 1}};
    bufs[nin] = per_row ? (ir_kbuf){.dtype = g->out, .ndim = 2, .output = 1, .row = 1, .index = {1, 0}}
                        : (ir_kbuf){.dtype = g->out, .ndim = 2, .output = 1, .contig_inner = 1, .index = {2, 1}};
}

static int gen_row(void *ctx, cn_kernel_src *src) {
    const row_gen *g = ctx;
    ir_kernel k;
    ir_kbuf bufs[2];
    ir_kstmt st[3];
    row_kernel(&k, bufs, 1, st, 3, g, 1);
    k.nstmts = 3;
    st[0] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = 0, .op = -1};
    st[1] = (ir_kstmt){.kind = IR_K_REDUCE, .dtype = g->out, .compute = (uint8_t)g->cd, .row = 1, .op = g->op,
                       .buf = -1, .nargs = 1};
    st[2] = (ir_kstmt){.kind = IR_K_STORE, .dtype = g->out, .buf = 1, .op = -1, .nargs = 1, .args = {1}};
    return cn_emit_row_dyn(&k, "kl_row", 0, src);
}

/* Whether dims ds[0..n) of t (in order) read as one dim of stride *st. */
static int collapse(const kl_tensor *t, const int *ds, int n, int64_t *st) {
    int64_t want = 0;
    int any = 0;
    *st = 0;
    for (int i = n - 1; i >= 0; i--) {
        int d = ds[i];
        if (t->shape[d] == 1) continue;
        if (!any) {
            *st = t->stride[d];
            want = t->stride[d] * t->shape[d];
            any = 1;
        } else {
            if (t->stride[d] != want) return 0;
            want *= t->shape[d];
        }
    }
    return 1;
}

int cn_copy_into(const ke_call *c, kl_tensor *src, kl_tensor *dst) {
    kl_tensor *in[1] = {src};
    ke_call cc;
    memset(&cc, 0, sizeof cc);
    cc.op = KE_OP_clone;
    cc.nin = 1;
    cc.in = in;
    cc.nout = 1;
    cc.out[0] = dst;
    cc.device = c->device;
    cc.compute = ke_compute_dtype((kl_dtype)src->dtype);
    return ku_cuda_ew(&cc);
}

/* A device copy of the permutation perm of x, contiguous. */
static kl_tensor *permuted_copy(const ke_call *c, kl_tensor *x, const int64_t *perm) {
    kl_tensor *v = kl_permute(x, x->ndim, perm);
    kl_tensor *t = v ? kl_empty_on(v->ndim, v->shape, (kl_dtype)x->dtype, c->device) : NULL;
    return t && !cn_copy_into(c, v, t) ? t : NULL;
}

/* Launches row kernel fn with args over [rows, len]: one block per row; a
 * short row gets one warp (each idle thread is a fiber on the emulator). */
/* Long rows: past g_split_at elements a row is folded by several blocks of
 * about g_split_chunk elements each (a block per row would leave most of a
 * GPU idle for a few long rows), then a finishing kernel. */
static int64_t g_split_at = 65536, g_split_chunk = 16384;

void cn_set_row_split(int64_t threshold, int64_t chunk) {
    g_split_at = threshold > 0 ? threshold : 65536;
    g_split_chunk = chunk > 0 ? chunk : 16384;
}

int64_t cn_row_split(int64_t len, int64_t *chunk) {
    if (len <= g_split_at) {
        *chunk = len;
        return 1;
    }
    const int64_t n = (len + g_split_chunk - 1) / g_split_chunk;
    *chunk = (len + n - 1) / n; /* balanced: every block but the last takes chunk */
    return (len + *chunk - 1) / *chunk;
}

static int launch_row_grid(const char *op, int dev, CUfunction fn, void **args, int64_t rows, int64_t len, int kr) {
    const unsigned grid[3] = {(unsigned)(rows > 65535 ? 65535 : rows), 1, 1}, block[3] = {cn_row_threads(len, kr), 1, 1};
    return ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
}

/* Launches row kernel fn over [rows, len]: input rows at stride rs, elements at
 * ls; output likewise (ors, ols; ols 0: one value per row). */
static int launch_rows(const char *op, int dev, CUfunction fn, void *pin, int64_t rs, int64_t ls, void *pout,
                       int64_t ors, int64_t ols, int64_t rows, int64_t len, int kr) {
    if (ku_device_enter(op, dev)) return -1;
    cn_dims dims;
    dims.n = rows * len;
    dims.shape[0] = rows;
    dims.shape[1] = len;
    dims.index[0][0] = rs;
    dims.index[0][1] = ls;
    dims.index[1][0] = ors;
    dims.index[1][1] = ols;
    void *status = NULL, *args[] = {&pin, &pout, &status, &dims};
    return launch_row_grid(op, dev, fn, args, rows, len, kr);
}

int cn_row_view(const ke_call *c, kl_tensor *x, uint32_t mask, cn_rows *v) {
    int kept[KL_MAX_DIMS], red[KL_MAX_DIMS], nk = 0, nr = 0;
    v->rows = v->len = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (mask & (1u << d)) {
            red[nr++] = d;
            v->len *= x->shape[d];
        } else {
            kept[nk++] = d;
            v->rows *= x->shape[d];
        }
    }
    v->src = x;
    v->rs = v->ls = 0;
    if (v->rows == 0 || v->len == 0 || (collapse(x, kept, nk, &v->rs) && collapse(x, red, nr, &v->ls))) return 0;
    int64_t perm[KL_MAX_DIMS];
    for (int i = 0; i < nk; i++) perm[i] = kept[i];
    for (int i = 0; i < nr; i++) perm[nk + i] = red[i];
    if (!(v->src = permuted_copy(c, x, perm))) return -1;
    v->rs = v->len;
    v->ls = 1;
    return 0;
}

int ku_cuda_reduce(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *out = c->out[0];
    if (!ku_cuda_reduce_supported(c->op) || c->nout != 1)
        return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    if (composed(c->op)) return composite(c);
    const ke_rd_op *ro = ke_ops[c->op].impl;
    if (!ro || !ro->k[c->compute]) {
        char b[256];
        return ke_err(KL_ERR_DTYPE, op, "not implemented for %s", ke_fmt_tensor(b, sizeof b, x));
    }
    uint32_t mask;
    if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
    const int dev = c->device.index;
    kl_scope_begin();
    cn_rows v;
    if (cn_row_view(c, x, mask, &v)) {
        kl_scope_end();
        return -1;
    }
    if (v.rows == 0) {
        kl_scope_end();
        return 0;
    }
    row_gen g = {c->op, (kl_dtype)x->dtype, c->compute, (kl_dtype)out->dtype, c->device, NULL};
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 2; /* a row reduction */
    key.op = c->op;
    key.dev = dev;
    key.nin = 1;
    key.cls = CN_DYN_ROW;
    key.compute = (uint8_t)c->compute;
    key.dt[0] = (uint8_t)x->dtype;
    key.dt[1] = (uint8_t)out->dtype;
    CUfunction fn = NULL;
    int rc = cn_eager_fn(op, &key, gen_row, &g, &fn);
    /* out: contiguous, its elements in the kept dims' order, one per row */
    if (!rc) rc = launch_rows(op, dev, fn, ke_data(v.src), v.rs, v.ls, ke_data(out), 1, 0, v.rows, v.len, 0);
    kl_scope_end();
    return rc ? -1 : 0;
}

/* ---- softmax, log_softmax: one fused row kernel -------------------------------------
 * What compiled code generates for softmax's decomposition, in the compute
 * dtype (f32 for f16/bf16, as the CPU kernel): per row m = amax(x), s =
 * sum(exp(x - m)), then exp(x - m) / s (softmax) or (x - m) - log(s)
 * (log_softmax, log(s) once per row). The softmax dim is the row: read in
 * place when the other dims collapse into one stride, else the input is
 * copied with the dim last first; likewise the output is written in place or
 * through a contiguous temporary copied back. */
static int gen_softmax(void *ctx, cn_kernel_src *src) {
    const row_gen *g = ctx;
    ir_kernel k;
    ir_kbuf bufs[2];
    ir_kstmt st[8];
    row_kernel(&k, bufs, 1, st, 8, g, 0);
    const uint8_t cd = (uint8_t)g->cd;
    int n = 0;
    st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = 0, .op = -1};                       /* v0 x */
    st[n++] = (ir_kstmt){.kind = IR_K_REDUCE, .dtype = cd, .compute = cd, .row = 1, .op = KE_OP_amax, .buf = -1,
                         .nargs = 1, .args = {0}};                                                    /* v1 m */
    st[n++] = (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .op = KE_OP_sub, .buf = -1, .nargs = 2,
                         .args = {0, 1}};                                                             /* v2 x - m */
    st[n++] = (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .op = KE_OP_exp, .buf = -1, .nargs = 1,
                         .args = {2}};                                                                /* v3 */
    st[n++] = (ir_kstmt){.kind = IR_K_REDUCE, .dtype = cd, .compute = cd, .row = 1, .op = KE_OP_sum, .buf = -1,
                         .nargs = 1, .args = {3}};                                                    /* v4 s */
    if (g->op == KE_OP_softmax) {
        st[n++] = (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .op = KE_OP_div, .buf = -1, .nargs = 2,
                             .args = {3, 4}};
    } else {
        st[n++] = (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .row = 1, .op = KE_OP_log, .buf = -1,
                             .nargs = 1, .args = {4}};                                                /* v5 log s */
        st[n++] = (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .op = KE_OP_sub, .buf = -1, .nargs = 2,
                             .args = {2, 5}};
    }
    const int last = n - 1;
    st[n] = (ir_kstmt){.kind = IR_K_STORE, .dtype = g->out, .buf = 1, .op = -1, .nargs = 1, .args = {last}};
    k.nstmts = n + 1;
    return emit_or_probe(g, &k, 0, src);
}

int ku_cuda_softmax(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *out = c->out[0];
    const int nd = x->ndim;
    const int d = nd ? ke_wrap_dim(op, ke_attr_softmax_dim(&c->a), nd) : 0;
    if (d < 0) return -1;
    const int64_t n = ke_numel(nd, x->shape), len = nd ? x->shape[d] : 1;
    if (n == 0) return 0;
    const int64_t rows = n / len;
    int kept[KL_MAX_DIMS], nk = 0;
    int64_t perm[KL_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        if (i != d) kept[nk++] = i;
    for (int i = 0; i < nk; i++) perm[i] = kept[i];
    if (nd) perm[nk] = d;
    const int dev = c->device.index;
    kl_scope_begin();
    kl_tensor *src = x, *dst = out, *tmp = NULL;
    int64_t rs, ls = nd ? x->stride[d] : 0, ors, ols = nd ? out->stride[d] : 0;
    int rc = 0;
    if (!collapse(x, kept, nk, &rs)) {
        if (!(src = permuted_copy(c, x, perm))) rc = -1;
        rs = len;
        ls = 1;
    }
    if (!rc && !collapse(out, kept, nk, &ors)) {
        kl_tensor *pv = kl_permute(out, nd, perm);
        if (!pv || !(dst = tmp = kl_empty_on(pv->ndim, pv->shape, (kl_dtype)out->dtype, c->device))) rc = -1;
        ors = len;
        ols = 1;
    }
    row_gen g = {c->op, (kl_dtype)x->dtype, ke_compute_dtype((kl_dtype)x->dtype), (kl_dtype)out->dtype, c->device, NULL};
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 3; /* a fused softmax row */
    key.op = c->op;
    key.dev = dev;
    key.nin = 1;
    key.cls = CN_DYN_ROW;
    key.compute = (uint8_t)g.cd;
    key.dt[0] = (uint8_t)x->dtype;
    key.dt[1] = (uint8_t)out->dtype;
    CUfunction fn = NULL;
    if (!rc) rc = cn_eager_fn(op, &key, gen_softmax, &g, &fn);
    if (!rc) rc = launch_rows(op, dev, fn, ke_data(src), rs, ls, ke_data(dst), ors, ols, rows, len, CN_FUSED_KR);
    /* the temporary's rows back into out's layout */
    if (!rc && tmp) rc = cn_copy_into(c, tmp, kl_permute(out, nd, perm));
    kl_scope_end();
    return rc ? -1 : 0;
}

/* ---- layer_norm, rms_norm: one fused row kernel --------------------------------------
 * The CPU kernel's formulas in the compute dtype (f32 for f16/bf16), per row
 * of the normalized dims: layer_norm mean m, d = x - m, v = mean(d * d),
 * d * rsqrt(v + eps) [* w] [+ b]; rms_norm x * rsqrt(mean(x * x) + eps) [* w].
 * eps is a kernel parameter by value; weight and bias are read along the row
 * (row stride 0). Inputs whose dims do not collapse into [rows, len] are made
 * contiguous on the device first. */
typedef struct nm_gen {
    row_gen r;
    int has_w, has_b;
} nm_gen;

static int gen_norm(void *ctx, cn_kernel_src *src) {
    const nm_gen *ng = ctx;
    const row_gen *g = &ng->r;
    ir_kernel k;
    ir_kbuf bufs[5];
    ir_kstmt st[16];
    const int nin = 2 + ng->has_w + ng->has_b, beps = nin - 1, bw = 1, bb = 1 + ng->has_w;
    row_kernel(&k, bufs, nin, st, 16, g, 0);
    if (ng->has_w) bufs[bw] = (ir_kbuf){.dtype = g->in, .ndim = 2, .contig_inner = 1, .index = {0, 1}};
    if (ng->has_b) bufs[bb] = (ir_kbuf){.dtype = g->in, .ndim = 2, .contig_inner = 1, .index = {0, 1}};
    bufs[beps] = (ir_kbuf){.dtype = g->cd, .ndim = 0};
    const uint8_t cd = (uint8_t)g->cd;
#define NM_OP(o, r, ...) (ir_kstmt){.kind = IR_K_OP, .dtype = cd, .compute = cd, .row = r, .op = KE_OP_##o, .buf = -1, \
                                    .nargs = sizeof((int32_t[]){__VA_ARGS__}) / 4, .args = {__VA_ARGS__}}
#define NM_MEAN(a) (ir_kstmt){.kind = IR_K_REDUCE, .dtype = cd, .compute = cd, .row = 1, .op = KE_OP_mean, .buf = -1, \
                              .nargs = 1, .args = {a}}
    int n = 0, y;
    st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = 0, .op = -1};        /* v0 x */
    if (g->op == KE_OP_layer_norm) {
        st[n++] = NM_MEAN(0);                                                            /* v1 m */
        st[n++] = NM_OP(sub, 0, 0, 1);                                                   /* v2 d */
        st[n++] = NM_OP(mul, 0, 2, 2);                                                   /* v3 */
        st[n++] = NM_MEAN(3);                                                            /* v4 v */
        st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = cd, .row = 1, .buf = beps, .op = -1}; /* v5 eps */
        st[n++] = NM_OP(add, 1, 4, 5);                                                   /* v6 */
        st[n++] = NM_OP(rsqrt, 1, 6);                                                    /* v7 */
        st[n++] = NM_OP(mul, 0, 2, 7);                                                   /* v8 */
        y = 8;
    } else {
        st[n++] = NM_OP(mul, 0, 0, 0);                                                   /* v1 */
        st[n++] = NM_MEAN(1);                                                            /* v2 */
        st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = cd, .row = 1, .buf = beps, .op = -1}; /* v3 eps */
        st[n++] = NM_OP(add, 1, 2, 3);                                                   /* v4 */
        st[n++] = NM_OP(rsqrt, 1, 4);                                                    /* v5 */
        st[n++] = NM_OP(mul, 0, 0, 5);                                                   /* v6 */
        y = 6;
    }
    if (ng->has_w) {
        st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = bw, .op = -1};
        st[n] = NM_OP(mul, 0, y, n - 1);
        y = n++;
    }
    if (ng->has_b) {
        st[n++] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = bb, .op = -1};
        st[n] = NM_OP(add, 0, y, n - 1);
        y = n++;
    }
#undef NM_OP
#undef NM_MEAN
    st[n] = (ir_kstmt){.kind = IR_K_STORE, .dtype = g->out, .buf = nin, .op = -1, .nargs = 1, .args = {y}};
    k.nstmts = n + 1;
    return emit_or_probe(g, &k, 1u << beps, src);
}

int ku_cuda_norm(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *out = c->out[0];
    const int has_w = (int)ke_attr_layer_norm_has_weight(&c->a);
    const int has_b = c->op == KE_OP_layer_norm && ke_attr_layer_norm_has_bias(&c->a);
    const int nn = (int)ke_attr_layer_norm_normalized_ndim(&c->a), nd = x->ndim;
    if (nn < 1 || nn > nd || c->nin != 1 + has_w + has_b)
        return ke_err(KL_ERR_INTERNAL, op, "normalized_ndim / weight / bias do not match the inputs");
    const int64_t n = ke_numel(nd, x->shape), len = ke_numel(nn, x->shape + (nd - nn));
    if (n == 0) return 0;
    const int64_t rows = n / len;
    int lead[KL_MAX_DIMS], tail[KL_MAX_DIMS];
    for (int i = 0; i < nd - nn; i++) lead[i] = i;
    for (int i = 0; i < nn; i++) tail[i] = nd - nn + i;
    const int dev = c->device.index;
    const kl_dtype cd = ke_compute_dtype((kl_dtype)x->dtype);
    kl_scope_begin();
    int rc = 0;
    /* x, weight, bias as [rows, len] with one stride each way (else a contiguous copy) */
    kl_tensor *in[3];
    int64_t rs[3], ls[3];
    for (int i = 0; i < 1 + has_w + has_b && !rc; i++) {
        kl_tensor *t = c->in[i];
        int nl = i ? 0 : nd - nn; /* weight and bias are the normalized shape itself */
        const int *tl = i ? (const int[KL_MAX_DIMS]){0, 1, 2, 3, 4, 5, 6, 7} : tail;
        in[i] = t;
        if (!(collapse(t, lead, nl, &rs[i]) && collapse(t, tl, nn, &ls[i]))) {
            kl_tensor *cp = kl_empty_on(t->ndim, t->shape, (kl_dtype)t->dtype, c->device);
            if (!cp || cn_copy_into(c, t, cp)) rc = -1;
            in[i] = cp;
            rs[i] = len;
            ls[i] = 1;
        }
        if (i) rs[i] = 0;
    }
    nm_gen g = {{c->op, (kl_dtype)x->dtype, cd, (kl_dtype)out->dtype, c->device, NULL}, has_w, has_b};
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 4; /* a fused norm row */
    key.op = c->op;
    key.dev = dev;
    key.nin = (uint8_t)(1 + has_w + has_b);
    key.bcast = (uint8_t)(has_w | has_b << 1);
    key.cls = CN_DYN_ROW;
    key.compute = (uint8_t)cd;
    key.dt[0] = (uint8_t)x->dtype;
    key.dt[1] = (uint8_t)out->dtype;
    CUfunction fn = NULL;
    if (!rc) rc = cn_eager_fn(op, &key, gen_norm, &g, &fn);
    if (!rc) rc = ku_device_enter(op, dev);
    if (!rc) {
        const int nin = 2 + has_w + has_b;
        cn_dims dims;
        dims.n = n;
        dims.shape[0] = rows;
        dims.shape[1] = len;
        void *ptrs[5], *args[8];
        double eps64 = ke_attr_layer_norm_eps(&c->a);
        float eps32 = (float)eps64;
        for (int i = 0; i < nin - 1; i++) {
            ptrs[i] = ke_data(in[i]);
            args[i] = &ptrs[i];
            dims.index[i][0] = rs[i];
            dims.index[i][1] = ls[i];
        }
        args[nin - 1] = cd == KL_F64 ? (void *)&eps64 : (void *)&eps32; /* by value */
        dims.index[nin - 1][0] = dims.index[nin - 1][1] = 0;
        ptrs[nin] = ke_data(out);
        args[nin] = &ptrs[nin];
        dims.index[nin][0] = len; /* out: contiguous */
        dims.index[nin][1] = 1;
        void *status = NULL;
        args[nin + 1] = &status;
        args[nin + 2] = &dims;
        rc = launch_row_grid(op, dev, fn, args, rows, len, CN_FUSED_KR);
    }
    kl_scope_end();
    return rc ? -1 : 0;
}

int cn_fused_row_program(int op, kl_dtype dt, int has_w, int has_b, cn_kernel_src *src) {
    int kr = -1;
    const kl_dtype cd = ke_compute_dtype(dt);
    nm_gen g = {{op, dt, cd, dt, KL_DEVICE_CPU, src ? NULL : &kr}, has_w, has_b && op == KE_OP_layer_norm};
    int rc;
    if (op == KE_OP_softmax || op == KE_OP_log_softmax) rc = gen_softmax(&g.r, src);
    else if (op == KE_OP_layer_norm || op == KE_OP_rms_norm) rc = gen_norm(&g, src);
    else return ke_err(KL_ERR_ARG, "cn_fused_row_program", "not a fused row op");
    return rc ? -1 : src ? 0 : kr;
}
