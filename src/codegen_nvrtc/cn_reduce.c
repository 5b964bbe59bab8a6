/*
 * cn_reduce.c — eager reductions on CUDA tensors (sum, mean, prod, amax,
 * amin, all, any; any dims, keepdim, every dtype the CPU takes) as the row
 * kernels compiled code generates (cn_emit.c: one block per output element,
 * the rd_formulas.h fold over the row, warp shuffles then shared memory).
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

typedef struct rd_gen {
    int op;
    kl_dtype in, compute, out;
    kl_device dev;
} rd_gen;

static int gen_row(void *ctx, cn_kernel_src *src) {
    const rd_gen *g = ctx;
    ir_kbuf bufs[2];
    ir_kstmt st[3];
    memset(bufs, 0, sizeof bufs);
    memset(st, 0, sizeof st);
    /* shape and strides are placeholders: the source takes them at run time */
    ir_kernel k = {.ninputs = 1, .noutputs = 1, .bufs = bufs, .stmts = st, .nstmts = 3, .ndim = 2, .row = 1,
                   .device = g->dev, .shape = {2, 2}};
    bufs[0] = (ir_kbuf){.dtype = g->in, .ndim = 2, .contig_inner = 1, .index = {2, 1}};
    bufs[1] = (ir_kbuf){.dtype = g->out, .ndim = 2, .output = 1, .row = 1, .index = {1, 0}};
    st[0] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = g->in, .buf = 0, .op = -1};
    st[1] = (ir_kstmt){.kind = IR_K_REDUCE, .dtype = g->out, .compute = (uint8_t)g->compute, .row = 1, .op = g->op,
                       .buf = -1, .nargs = 1};
    st[2] = (ir_kstmt){.kind = IR_K_STORE, .dtype = g->out, .buf = 1, .op = -1, .nargs = 1, .args = {1}};
    return cn_emit_row_dyn(&k, "kl_row", src);
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

/* A device copy of the permutation perm of x, contiguous (the elementwise identity). */
static kl_tensor *permuted_copy(const ke_call *c, kl_tensor *x, const int64_t *perm) {
    kl_tensor *v = kl_permute(x, x->ndim, perm);
    kl_tensor *t = v ? kl_empty_on(v->ndim, v->shape, (kl_dtype)x->dtype, c->device) : NULL;
    if (!t) return NULL;
    kl_tensor *in[1] = {v};
    ke_call cc;
    memset(&cc, 0, sizeof cc);
    cc.op = KE_OP_clone;
    cc.nin = 1;
    cc.in = in;
    cc.nout = 1;
    cc.out[0] = t;
    cc.device = c->device;
    cc.compute = ke_compute_dtype((kl_dtype)x->dtype);
    return ku_cuda_ew(&cc) ? NULL : t;
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
    int kept[KL_MAX_DIMS], red[KL_MAX_DIMS], nk = 0, nr = 0;
    int64_t rows = 1, len = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (mask & (1u << d)) {
            red[nr++] = d;
            len *= x->shape[d];
        } else {
            kept[nk++] = d;
            rows *= x->shape[d];
        }
    }
    if (rows == 0) return 0;
    const int dev = c->device.index;
    kl_scope_begin();
    kl_tensor *src = x;
    int64_t rs, ls;
    if (!collapse(x, kept, nk, &rs) || !collapse(x, red, nr, &ls)) {
        int64_t perm[KL_MAX_DIMS];
        for (int i = 0; i < nk; i++) perm[i] = kept[i];
        for (int i = 0; i < nr; i++) perm[nk + i] = red[i];
        if (!(src = permuted_copy(c, x, perm))) {
            kl_scope_end();
            return -1;
        }
        rs = len;
        ls = 1;
    }
    rd_gen g = {c->op, (kl_dtype)x->dtype, c->compute, (kl_dtype)out->dtype, c->device};
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
    if (!rc) rc = ku_device_enter(op, dev);
    if (!rc) {
        cn_dims dims;
        dims.n = rows * len;
        dims.shape[0] = rows;
        dims.shape[1] = len;
        dims.index[0][0] = rs;
        dims.index[0][1] = ls;
        dims.index[1][0] = 1;  /* out: contiguous, its elements in the kept dims' order */
        dims.index[1][1] = 0;
        void *pin = ke_data(src), *pout = ke_data(out), *status = NULL;
        void *args[] = {&pin, &pout, &status, &dims};
        /* one block per row; a short row gets one warp (each idle thread is a fiber on the emulator) */
        const unsigned grid[3] = {(unsigned)(rows > 65535 ? 65535 : rows), 1, 1},
                       block[3] = {len <= 32 ? 32u : len >= 2048 ? 256u : (unsigned)CN_BLOCK, 1, 1};
        rc = ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
    }
    kl_scope_end();
    return rc ? -1 : 0;
}
