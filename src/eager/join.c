/*
 * join.c — joining ops (rows in ops_index.def): cat, stack, split, chunk,
 * repeat and constant pad, their public wrappers, and the strided-copy
 * machinery the index family shares (ke_rows_run, ke_copy_nd; see
 * kernels_index.h). These ops only move elements, so their kernels are one
 * copy routine generic over element size: memcpy where both sides are
 * contiguous along the innermost run, a typed strided loop otherwise, and
 * ke_convert_strided where cat promotes dtypes.
 */
#include "kernels_index.h"

#include "threadpool.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

/* ---- the row walker ------------------------------------------------------- */

/* Drops size-1 dims and merges dims contiguous in every operand. */
static void rows_coalesce(ke_rows *r) {
    int nd = 0;
    for (int d = 0; d < r->nd; d++) {
        if (r->shape[d] == 1) continue;
        if (nd > 0) {
            int ok = 1;
            for (int k = 0; k < r->nops; k++)
                if (r->stride[k][nd - 1] != r->stride[k][d] * r->shape[d]) ok = 0;
            if (ok) {
                r->shape[nd - 1] *= r->shape[d];
                for (int k = 0; k < r->nops; k++) r->stride[k][nd - 1] = r->stride[k][d];
                continue;
            }
        }
        r->shape[nd] = r->shape[d];
        for (int k = 0; k < r->nops; k++) r->stride[k][nd] = r->stride[k][d];
        nd++;
    }
    if (nd == 0) {
        r->shape[0] = 1;
        for (int k = 0; k < r->nops; k++) r->stride[k][0] = 0;
        nd = 1;
    }
    r->nd = nd;
}

typedef struct rows_job {
    const ke_rows *r;
    ke_row_fn fn;
    void *ctx;
} rows_job;

static void rows_range(void *ctx, int64_t begin, int64_t end) {
    const rows_job *j = ctx;
    const ke_rows *r = j->r;
    const int nd = r->nd, nops = r->nops, last = nd - 1;
    const int64_t inner = r->shape[last];
    int64_t coord[KE_ROWS_MAXD], off[KE_ROWS_MAXOPS] = {0};
    int64_t rem = begin;
    for (int d = last; d >= 0; d--) {
        coord[d] = rem % r->shape[d];
        rem /= r->shape[d];
        for (int k = 0; k < nops; k++) off[k] += coord[d] * r->stride[k][d];
    }
    for (int64_t pos = begin; pos < end;) {
        int64_t n = inner - coord[last];
        if (n > end - pos) n = end - pos;
        j->fn(j->ctx, coord, off, n);
        pos += n;
        /* back to the row start, then carry into the outer dims */
        for (int k = 0; k < nops; k++) off[k] -= coord[last] * r->stride[k][last];
        coord[last] = 0;
        for (int d = last - 1; d >= 0; d--) {
            for (int k = 0; k < nops; k++) off[k] += r->stride[k][d];
            if (++coord[d] < r->shape[d]) break;
            for (int k = 0; k < nops; k++) off[k] -= r->shape[d] * r->stride[k][d];
            coord[d] = 0;
        }
    }
}

void ke_rows_run(const ke_rows *r, int64_t grain, ke_row_fn fn, void *ctx) {
    int64_t total = ke_numel(r->nd, r->shape);
    if (total == 0) return;
    rows_job j = {r, fn, ctx};
    ke_parallel_for(total, grain, rows_range, &j);
}

/* ---- the copy ------------------------------------------------------------------ */

typedef struct copy_job {
    char *dst;
    const char *src;
    kl_dtype dt, st;
    int64_t ds, ss; /* last-dim strides */
} copy_job;

static void copy_row(void *ctx, const int64_t *coord, const int64_t *off, int64_t n) {
    (void)coord;
    const copy_job *j = ctx;
    const size_t des = ke_dtypes[j->dt].size, ses = ke_dtypes[j->st].size;
    char *d = j->dst + off[0] * (int64_t)des;
    const char *s = j->src + off[1] * (int64_t)ses;
    const int64_t ds = j->ds, ss = j->ss;
    if (j->dt != j->st) {
        ke_convert_strided(d, j->dt, ds, s, j->st, ss, n);
    } else if (ds == 1 && ss == 1) {
        memcpy(d, s, (size_t)n * des);
    } else if (ds == 1 && ss == 0) {
        KE_BY_SIZE(des, {
            T *restrict D = (T *)d;
            const T v = *(const T *)s;
            for (int64_t i = 0; i < n; i++) D[i] = v;
        });
    } else {
        KE_BY_SIZE(des, {
            T *restrict D = (T *)d;
            const T *restrict S = (const T *)s;
            for (int64_t i = 0; i < n; i++) D[i * ds] = S[i * ss];
        });
    }
}

void ke_copy_nd(int nd, const int64_t *shape, char *dst, kl_dtype dt, const int64_t *dstride, const char *src,
                kl_dtype st, const int64_t *sstride) {
    ke_rows r = {.nd = nd, .nops = 2};
    KE_ASSERT(nd >= 0 && nd <= KE_ROWS_MAXD);
    for (int d = 0; d < nd; d++) {
        r.shape[d] = shape[d];
        r.stride[0][d] = dstride[d];
        r.stride[1][d] = sstride[d];
    }
    rows_coalesce(&r);
    copy_job j = {dst, src, dt, st, r.stride[0][r.nd - 1], r.stride[1][r.nd - 1]};
    ke_rows_run(&r, KE_ROWS_GRAIN, copy_row, &j);
}

/* ---- cat ------------------------------------------------------------------------ */

/* PyTorch 1.13 still skips 1-D empty tensors ([0]) whatever the other shapes
 * (they only take part in dtype promotion). */
static int legacy_empty(const kl_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

int ke_infer_cat(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    kl_tensor *const *ts = c->in;
    char b1[200], b2[200];
    if (c->nin <= 0) return ke_err(KL_ERR_ARG, op, "expects a non-empty list of tensors");
    kl_dtype dt = (kl_dtype)ts[0]->dtype;
    int ref = -1;
    for (int i = 0; i < c->nin; i++) {
        if (ts[i]->ndim == 0)
            return ke_err(KL_ERR_SHAPE, op, "a 0-dim tensor (tensor %d) cannot be concatenated", i);
        dt = kl_promote_types(dt, (kl_dtype)ts[i]->dtype);
        if (ref < 0 && !legacy_empty(ts[i])) ref = i;
    }
    out->dtype = dt;
    c->compute = ke_compute_dtype(dt);
    if (ref < 0) { /* every input is a legacy empty */
        out->ndim = 1;
        out->shape[0] = 0;
        return 1;
    }
    const kl_tensor *r = ts[ref];
    int d = ke_wrap_dim(op, ke_attr_cat_dim(&c->a), r->ndim);
    if (d < 0) return -1;
    int64_t total = 0;
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = ts[i];
        if (legacy_empty(t)) continue;
        int same = t->ndim == r->ndim;
        for (int e = 0; same && e < t->ndim; e++)
            if (e != d && t->shape[e] != r->shape[e]) same = 0;
        if (!same) {
            ke_fmt_shape(b1, sizeof b1, r->ndim, r->shape);
            ke_fmt_shape(b2, sizeof b2, t->ndim, t->shape);
            if (t->ndim != r->ndim)
                return ke_err(KL_ERR_SHAPE, op, "tensors must have the same number of dims, got %s (tensor %d) and %s (tensor %d)",
                              b1, ref, b2, i);
            return ke_err(KL_ERR_SHAPE, op, "shapes %s (tensor %d) and %s (tensor %d) must match except in dim %d", b1,
                          ref, b2, i, d);
        }
        if (ke_add_ov(total, t->shape[d], &total))
            return ke_err(KL_ERR_OVERFLOW, op, "the size of dim %d overflows", d);
    }
    out->ndim = r->ndim;
    memcpy(out->shape, r->shape, sizeof(int64_t) * r->ndim);
    out->shape[d] = total;
    return ke_check_shape(op, out->ndim, out->shape, dt) ? -1 : 1;
}

int ke_cpu_cat(ke_call *c) {
    kl_tensor *o = c->out[0];
    if (ke_numel(o->ndim, o->shape) == 0) return 0;
    int d = ke_wrap_dim(ke_opname(c), ke_attr_cat_dim(&c->a), o->ndim);
    if (d < 0) return -1;
    const int64_t es = (int64_t)ke_dtypes[o->dtype].size;
    int64_t at = 0;
    for (int i = 0; i < c->nin; i++) {
        const kl_tensor *t = c->in[i];
        if (legacy_empty(t)) continue;
        if (ke_numel(t->ndim, t->shape))
            ke_copy_nd(t->ndim, t->shape, ke_data(o) + at * o->stride[d] * es, (kl_dtype)o->dtype, o->stride,
                       ke_data(t), (kl_dtype)t->dtype, t->stride);
        at += t->shape[d];
    }
    return 0;
}

/* ---- stack, split, chunk (decompositions) ------------------------------------------ */


/* cat of unsqueezed views: the cat kernel copies strided inputs directly, and
 * autograd and tracing need no rule of their own. */
int ke_decomp_stack(ke_call *c) {
    const char *op = ke_opname(c);
    int n = c->nin;
    if (n <= 0) return ke_err(KL_ERR_ARG, op, "expects a non-empty list of tensors");
    const kl_tensor *r = c->in[0];
    for (int i = 1; i < n; i++) {
        const kl_tensor *t = c->in[i];
        if (t->ndim != r->ndim || memcmp(t->shape, r->shape, sizeof(int64_t) * r->ndim)) {
            char b1[200], b2[200];
            return ke_err(KL_ERR_SHAPE, op, "expects tensors of one shape, got %s (tensor 0) and %s (tensor %d)",
                          ke_fmt_shape(b1, sizeof b1, r->ndim, r->shape), ke_fmt_shape(b2, sizeof b2, t->ndim, t->shape),
                          i);
        }
    }
    if (r->ndim >= KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, op, "stacking tensors of %d dims would need more than %d dims", r->ndim,
                      KL_MAX_DIMS);
    int d = ke_wrap_dim(op, ke_attr_stack_dim(&c->a), r->ndim + 1);
    if (d < 0) return -1;
    kl_tensor **u = malloc(sizeof *u * (size_t)n);
    if (!u) return ke_err(KL_ERR_OOM, op, "out of memory for %d tensor pointers", n);
    kl_scope_begin();
    kl_tensor *y = NULL;
    int i = 0;
    for (; i < n; i++)
        if (!(u[i] = kl_unsqueeze(c->in[i], d))) break;
    if (i == n) y = kl_cat(n, u, d);
    kl_keep(y);
    kl_scope_end();
    free(u);
    return ke_set_out1(c, y);
}

/* chunk is read through split's accessors where they share code. */
_Static_assert(KE_ATTR_SAME_SLOT(split_dim, chunk_dim) && KE_ATTR_SAME_SLOT(split_first, chunk_first) &&
                   KE_ATTR_SAME_SLOT(split_count, chunk_count) && KE_ATTR_SAME_SLOT(split_total, chunk_total),
               "chunk's piece window is split's");

/* Emits pieces first .. first+count-1 of `total` narrows of x along d, piece
 * k at k*step with length step (the last one: what is left), and reports
 * total in the total attribute (see split's row, ops_index.def). */
static int emit_pieces(ke_call *c, kl_tensor *x, int d, int64_t step, int64_t total) {
    const char *op = ke_opname(c);
    if (total > INT_MAX) return ke_err(KL_ERR_OVERFLOW, op, "%lld pieces are more than an int counts", (long long)total);
    int64_t first = ke_attr_split_first(&c->a), lim = ke_attr_split_count(&c->a), size = x->shape[d];
    if (first < 0 || lim < 0 || lim > KE_MAX_OUT)
        /* reachable from kl_op_call's attribute text, so the caller's mistake, not ours */
        return ke_err(KL_ERR_ARG, op, "piece window first=%lld count=%lld: first must be >= 0 and count in 0..%d",
                      (long long)first, (long long)lim, KE_MAX_OUT);
    int k = 0;
    for (; k < lim && first + k < total; k++) {
        int64_t i = first + k, start = i * step, len = i < total - 1 ? step : size - start;
        if (!(c->out[k] = kl_narrow(x, d, start, len))) return -1;
    }
    c->nout = k;
    ke_attr_set_split_total(&c->a, total);
    return 0;
}

static int split_dim(ke_call *c, const kl_tensor *x) {
    if (x->ndim == 0) return ke_err(KL_ERR_SHAPE, ke_opname(c), "expects a tensor with at least 1 dim, got a 0-dim one");
    return ke_wrap_dim(ke_opname(c), ke_attr_split_dim(&c->a), x->ndim);
}

int ke_decomp_split(ke_call *c) {
    kl_tensor *x = c->in[0];
    int64_t ss = ke_attr_split_split_size(&c->a);
    int d = split_dim(c, x);
    if (d < 0) return -1;
    int64_t size = x->shape[d];
    if (ss < 0) return ke_err(KL_ERR_ARG, ke_opname(c), "split_size must be non-negative, got %lld", (long long)ss);
    if (ss == 0 && size != 0)
        return ke_err(KL_ERR_ARG, ke_opname(c), "split_size 0 needs dim %d to have size 0, not %lld", d,
                      (long long)size);
    /* one piece at least, even when split_size exceeds the size (PyTorch) */
    int64_t total = ss == 0 ? 1 : size / ss + (size % ss != 0);
    return emit_pieces(c, x, d, ss, total > 0 ? total : 1);
}

int ke_decomp_chunk(ke_call *c) {
    kl_tensor *x = c->in[0];
    int64_t chunks = ke_attr_chunk_chunks(&c->a);
    int d = split_dim(c, x);
    if (d < 0) return -1;
    if (chunks <= 0) return ke_err(KL_ERR_ARG, ke_opname(c), "chunks must be positive, got %lld", (long long)chunks);
    int64_t size = x->shape[d], step = size / chunks + (size % chunks != 0);
    /* an empty dim still gives `chunks` empty pieces, as torch.chunk */
    if (size == 0) return emit_pieces(c, x, d, 0, chunks);
    return emit_pieces(c, x, d, step, size / step + (size % step != 0));
}

/* ---- repeat --------------------------------------------------------------------- */

int ke_infer_repeat(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    int nrep = ke_attr_repeat_repeats_len(&c->a), off = nrep - x->ndim;
    const int64_t *rep = ke_attr_repeat_repeats(&c->a);
    char b1[200], b2[256];
    if (nrep < x->ndim)
        return ke_err(KL_ERR_SHAPE, op, "%d repeats for %s: give at least one per dim", nrep,
                      ke_fmt_tensor(b2, sizeof b2, x));
    if (nrep > KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, op, "%d repeats would give more than %d dims", nrep, KL_MAX_DIMS);
    for (int d = 0; d < nrep; d++) {
        int64_t r = rep[d], s = d >= off ? x->shape[d - off] : 1;
        if (r < 0)
            return ke_err(KL_ERR_ARG, op, "repeats %s has a negative count", ke_fmt_shape(b1, sizeof b1, nrep, rep));
        if (ke_mul_ov(s, r, &out->shape[d]))
            return ke_err(KL_ERR_OVERFLOW, op, "repeating %s by %s overflows", ke_fmt_tensor(b2, sizeof b2, x),
                          ke_fmt_shape(b1, sizeof b1, nrep, rep));
    }
    out->ndim = nrep;
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    return ke_check_shape(op, nrep, out->shape, out->dtype) ? -1 : 1;
}

/* Each output dim d is viewed as two, (copy, position) = (repeats[d],
 * size[d]), with the source broadcast (stride 0) along the copies: one
 * strided copy of up to 16 dims, coalesced to memcpys of whole tiles. */
int ke_cpu_repeat(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    if (ke_numel(o->ndim, o->shape) == 0) return 0;
    int off = o->ndim - x->ndim, nd = 0;
    int64_t shape[KE_ROWS_MAXD], ds[KE_ROWS_MAXD], ss[KE_ROWS_MAXD];
    for (int d = 0; d < o->ndim; d++) {
        int64_t s = d >= off ? x->shape[d - off] : 1, xs = d >= off ? x->stride[d - off] : 0;
        shape[nd] = ke_attr_repeat_repeats(&c->a)[d], ds[nd] = s * o->stride[d], ss[nd++] = 0;
        shape[nd] = s, ds[nd] = o->stride[d], ss[nd++] = xs;
    }
    ke_copy_nd(nd, shape, ke_data(o), (kl_dtype)o->dtype, ds, ke_data(x), (kl_dtype)x->dtype, ss);
    return 0;
}

/* ---- pad ------------------------------------------------------------------------- */

void ke_pad_pads(const ke_call *c, int ndim, int d, int64_t *l, int64_t *r) {
    int i = ndim - 1 - d;
    *l = *r = 0;
    const int64_t *pad = ke_attr_pad_pad(&c->a);
    if (2 * i + 1 < ke_attr_pad_pad_len(&c->a)) *l = pad[2 * i], *r = pad[2 * i + 1];
}

static int any_positive_pad(const ke_call *c) {
    for (int i = 0; i < ke_attr_pad_pad_len(&c->a); i++)
        if (ke_attr_pad_pad(&c->a)[i] > 0) return 1;
    return 0;
}

static const char *const pad_mode_names[] = {"constant", "reflect", "replicate", "circular"};

/* F.pad's rules for reflect, replicate and circular (torch 1.13): 1 to 3
 * padded dims after 1 (reflect, replicate: optional) batch and 1 channel
 * dim; padded dims non-empty (for reflect and replicate every dim but the
 * batch too); reflect pads below the size (one reflection),
 * circular pads at most the size of the (cropped) dim (one wrap); every
 * padded dim keeps at least one element. */
static int check_pad_mode(ke_call *c, const kl_tensor *x) {
    const char *op = ke_opname(c);
    int64_t mode = ke_attr_pad_mode(&c->a);
    int np = ke_attr_pad_pad_len(&c->a), nd = x->ndim, k = np / 2;
    char b[256];
    if (mode < KL_PAD_CONSTANT || mode > KL_PAD_CIRCULAR)
        return ke_err(KL_ERR_ARG, op, "invalid mode %lld (expected KL_PAD_CONSTANT, REFLECT, REPLICATE or CIRCULAR)",
                      (long long)mode);
    if (mode == KL_PAD_CONSTANT) return 0;
    const char *mn = pad_mode_names[mode];
    if (k < 1 || k > 3)
        return ke_err(KL_ERR_ARG, op, "%s padding pads 1, 2 or 3 dims, got %d pad values", mn, np);
    if (mode == KL_PAD_CIRCULAR ? nd != k + 2 : nd != k + 1 && nd != k + 2)
        return ke_err(KL_ERR_SHAPE, op, "%s padding of %d dims needs a %s%dD input, got %s", mn, k,
                      mode == KL_PAD_CIRCULAR ? "" : "batched or unbatched ", mode == KL_PAD_CIRCULAR ? k + 2 : k + 1,
                      ke_fmt_tensor(b, sizeof b, x));
    /* torch's reflection / replication kernels allow an empty batch, no other empty dim */
    for (int d = nd == k + 2 ? 1 : 0; d < nd - k && mode != KL_PAD_CIRCULAR; d++)
        if (x->shape[d] == 0)
            return ke_err(KL_ERR_SHAPE, op, "%s padding needs non-empty dims besides the batch, got %s", mn,
                          ke_fmt_tensor(b, sizeof b, x));
    for (int d = nd - k; d < nd; d++) {
        int64_t l, r, s = x->shape[d];
        ke_pad_pads(c, nd, d, &l, &r);
        int64_t core = s - (l < 0 ? -l : 0) - (r < 0 ? -r : 0);
        if (s == 0 || s + l + r < 1 || (mode == KL_PAD_CIRCULAR && core < 1))
            return ke_err(KL_ERR_SHAPE, op, "%s padding (%lld, %lld) of dim %d of %s leaves no element to copy", mn,
                          (long long)l, (long long)r, d, ke_fmt_tensor(b, sizeof b, x));
        if (mode == KL_PAD_REFLECT && (l >= s || r >= s))
            return ke_err(KL_ERR_ARG, op, "reflect padding (%lld, %lld) must be below the size of dim %d of %s", (long long)l,
                          (long long)r, d, ke_fmt_tensor(b, sizeof b, x));
        if (mode == KL_PAD_CIRCULAR && (l > core || r > core))
            return ke_err(KL_ERR_ARG, op, "circular padding (%lld, %lld) wraps around dim %d of %s more than once",
                          (long long)l, (long long)r, d, ke_fmt_tensor(b, sizeof b, x));
    }
    return 0;
}

_Static_assert(KL_PAD_REFLECT == 1 && KL_PAD_REPLICATE == 2 && KL_PAD_CIRCULAR == 3,
               "KE_PAD_SOURCE_DEF numbers the modes as kl_pad_mode");

int ke_infer_pad(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0];
    int np = ke_attr_pad_pad_len(&c->a), nd = x->ndim;
    char b[256];
    if (np % 2) return ke_err(KL_ERR_ARG, op, "needs a (before, after) pair per dim, got %d pad values", np);
    if (np / 2 > nd)
        return ke_err(KL_ERR_SHAPE, op, "%d pad values pad %d dims, but %s has %d", np, np / 2,
                      ke_fmt_tensor(b, sizeof b, x), nd);
    if (check_pad_mode(c, x)) return -1;
    int positive = any_positive_pad(c);
    for (int d = 0; d < nd; d++) {
        int64_t l, r, s = x->shape[d], n;
        ke_pad_pads(c, nd, d, &l, &r);
        /* negative pads crop: each side at most what is left */
        int64_t s1 = l < 0 ? s + l : s;
        if (l < -s || r < -s1)
            return ke_err(KL_ERR_SHAPE, op, "padding (%lld, %lld) crops more than the %lld elements of dim %d",
                          (long long)l, (long long)r, (long long)s, d);
        if (ke_add_ov(s, l, &n) || ke_add_ov(n, r, &n))
            return ke_err(KL_ERR_OVERFLOW, op, "padding (%lld, %lld) of dim %d overflows", (long long)l, (long long)r,
                          d);
        /* PyTorch's constant_pad_nd refuses empty padded dims once anything grows */
        if (positive && n <= 0 && 2 * (nd - 1 - d) < np)
            return ke_err(KL_ERR_SHAPE, op, "dim %d of size %lld padded by (%lld, %lld) would be empty", d,
                          (long long)s, (long long)l, (long long)r);
        out->shape[d] = n;
    }
    out->ndim = nd;
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    if (ke_check_scalar_cast(op, ke_attr_pad_value(&c->a), out->dtype)) return -1;
    return ke_check_shape(op, nd, out->shape, out->dtype) ? -1 : 1;
}

/* Rows of the output along its last dim: dst[k] = src[tab[k]] (element offsets). */
#define KE_PAD_ROW(T)                                                                                  \
    static void pad_row_##T(char *dst, int64_t dstep, const char *src, const int64_t *tab, int64_t n) { \
        for (int64_t k = 0; k < n; k++) ((T *)dst)[k * dstep] = ((const T *)src)[tab[k]];              \
    }
KE_PAD_ROW(uint8_t)
KE_PAD_ROW(uint16_t)
KE_PAD_ROW(uint32_t)
KE_PAD_ROW(uint64_t)

/* reflect / replicate / circular: a gather moving elements by size (any
 * dtype), through one table of source offsets per dim. */
static int pad_gather(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    int nd = o->ndim, mode = (int)ke_attr_pad_mode(&c->a);
    int64_t n = ke_numel(nd, o->shape), tot = 0;
    if (n == 0) return 0;
    for (int d = 0; d < nd; d++) tot += o->shape[d];
    int64_t *tab = malloc(sizeof(int64_t) * (size_t)tot), *t[KL_MAX_DIMS];
    if (!tab) return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for %lld offsets", (long long)tot);
    for (int d = 0, at = 0; d < nd; at += (int)o->shape[d], d++) {
        int64_t l, r;
        ke_pad_pads(c, nd, d, &l, &r);
        t[d] = tab + at;
        for (int64_t i = 0; i < o->shape[d]; i++)
            t[d][i] = (l || r ? ke_pad_source(mode, i, x->shape[d], l, r) : i) * x->stride[d];
    }
    const size_t es = ke_dtypes[o->dtype].size;
    void (*row)(char *, int64_t, const char *, const int64_t *, int64_t) =
        es == 1 ? pad_row_uint8_t : es == 2 ? pad_row_uint16_t : es == 4 ? pad_row_uint32_t : pad_row_uint64_t;
    int64_t idx[KL_MAX_DIMS] = {0}, inner = o->shape[nd - 1];
    for (int64_t done = 0; done < n; done += inner) {
        int64_t src = 0, dst = 0;
        for (int d = 0; d < nd - 1; d++) src += t[d][idx[d]], dst += idx[d] * o->stride[d];
        row(ke_data(o) + dst * (int64_t)es, o->stride[nd - 1], ke_data(x) + src * (int64_t)es, t[nd - 1], inner);
        for (int d = nd - 2; d >= 0 && ++idx[d] == o->shape[d]; d--) idx[d] = 0;
    }
    free(tab);
    return 0;
}

/* Constant: fills the output when anything grows, then copies the (cropped)
 * input into its place. */
int ke_cpu_pad(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *o = c->out[0];
    const int nd = x->ndim;
    const int64_t es = (int64_t)ke_dtypes[o->dtype].size;
    if (ke_attr_pad_mode(&c->a) != KL_PAD_CONSTANT) return pad_gather(c);
    if (ke_numel(o->ndim, o->shape) == 0) return 0;
    if (any_positive_pad(c)) {
        _Alignas(8) char val[8];
        int64_t zero[KL_MAX_DIMS] = {0};
        ke_store_f64(val, (kl_dtype)o->dtype, 0, ke_attr_pad_value(&c->a));
        ke_copy_nd(o->ndim, o->shape, ke_data(o), (kl_dtype)o->dtype, o->stride, val, (kl_dtype)o->dtype, zero);
    }
    int64_t shape[KL_MAX_DIMS], xoff = 0, ooff = 0;
    for (int d = 0; d < nd; d++) {
        int64_t l, r;
        ke_pad_pads(c, nd, d, &l, &r);
        int64_t xs = l < 0 ? -l : 0;
        shape[d] = x->shape[d] - xs - (r < 0 ? -r : 0);
        xoff += xs * x->stride[d];
        ooff += (l > 0 ? l : 0) * o->stride[d];
    }
    if (ke_numel(nd, shape) > 0)
        ke_copy_nd(nd, shape, ke_data(o) + ooff * es, (kl_dtype)o->dtype, o->stride, ke_data(x) + xoff * es,
                   (kl_dtype)x->dtype, x->stride);
    return 0;
}

/* ---- public wrappers ------------------------------------------------------------- */

/* value, mode: pad's fill value and kl_pad_mode (repeat has none) */
static kl_tensor *list_call(int op, kl_tensor *x, int n, const int64_t *v, double value, int mode) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    if (ke_check_tensor(x, ke_ops[op].name, 1) || ke_set_list(&c, n, v)) return NULL;
    if (op == KE_OP_pad) {
        ke_attr_set_pad_value(&c.a, value);
        ke_attr_set_pad_mode(&c.a, mode);
    }
    return ke_call1(&c);
}

static kl_tensor *join_call(int op, int n, kl_tensor *const *ts, int dim) {
    ke_call c = {.op = op, .nin = n, .in = ts};
    if (n <= 0) {
        ke_err(KL_ERR_ARG, ke_opname(&c), "expects a non-empty list of tensors, got %d", n);
        return NULL;
    }
    if (!ts) {
        ke_err(KL_ERR_NULL_ARG, ke_opname(&c), "tensor list pointer is NULL");
        return NULL;
    }
    if (op == KE_OP_cat)
        ke_attr_set_cat_dim(&c.a, dim);
    else
        ke_attr_set_stack_dim(&c.a, dim);
    return ke_call1(&c);
}

kl_tensor *kl_cat(int n, kl_tensor *const *ts, int dim) { return join_call(KE_OP_cat, n, ts, dim); }
kl_tensor *kl_stack(int n, kl_tensor *const *ts, int dim) { return join_call(KE_OP_stack, n, ts, dim); }

kl_tensor *kl_repeat(kl_tensor *x, int nrep, const int64_t *repeats) {
    return list_call(KE_OP_repeat, x, nrep, repeats, 0, 0);
}

kl_tensor *kl_pad(kl_tensor *x, int npad, const int64_t *pad, double value) {
    return list_call(KE_OP_pad, x, npad, pad, value, KL_PAD_CONSTANT);
}

kl_tensor *kl_pad_ex(kl_tensor *x, int npad, const int64_t *pad, kl_pad_mode mode, double value) {
    return list_call(KE_OP_pad, x, npad, pad, value, mode);
}

/* Pieces come out KE_MAX_OUT at a time (a call's output slots); only the
 * pieces that fit in out are made. Returns the total count. */
/* p0: split_size (split) or chunks (chunk). */
static int pieces_call(int op, kl_tensor *x, int64_t p0, int dim, kl_tensor **out, int max_out) {
    const char *name = ke_ops[op].name;
    if (ke_check_tensor(x, name, 1)) return -1;
    if (max_out < 0) return ke_err(KL_ERR_ARG, name, "max_out must be non-negative, got %d", max_out);
    if (max_out > 0 && !out) return ke_err(KL_ERR_NULL_ARG, name, "output array is NULL for %d pieces", max_out);
    int64_t first = 0, total;
    do {
        kl_tensor *in[1] = {x};
        ke_call c = {.op = op, .nin = 1, .in = in};
        if (op == KE_OP_split)
            ke_attr_set_split_split_size(&c.a, p0);
        else
            ke_attr_set_chunk_chunks(&c.a, p0);
        ke_attr_set_split_dim(&c.a, dim);
        ke_attr_set_split_first(&c.a, first);
        ke_attr_set_split_count(&c.a, max_out - first < KE_MAX_OUT ? max_out - first : KE_MAX_OUT);
        if (ke_dispatch(&c)) return -1;
        total = ke_attr_split_total(&c.a);
        for (int k = 0; k < c.nout; k++) out[first + k] = c.out[k];
        if (c.nout == 0) break;
        first += c.nout;
    } while (first < total && first < max_out);
    return (int)total;
}

int kl_split(kl_tensor *x, int64_t split_size, int dim, kl_tensor **out, int max_out) {
    return pieces_call(KE_OP_split, x, split_size, dim, out, max_out);
}

int kl_chunk(kl_tensor *x, int chunks, int dim, kl_tensor **out, int max_out) {
    return pieces_call(KE_OP_chunk, x, chunks, dim, out, max_out);
}
