/*
 * ew.c — the elementwise engine (see ew.h): broadcasting, dim coalescing,
 * dtype conversion through chunk buffers, and the parallel split.
 */
#include "optable.h" /* declares ke_cpu_ew, checked against its column */

#include "threadpool.h"

#define KE_EW_CHUNK 1024            /* elements per buffered chunk: fits L1 for 5 operands */
#define KE_EW_GRAIN 32768           /* below this, one thread */
#define KE_EW_MAXOPS 5              /* output + 4 inputs */

typedef struct ew_plan {
    int nops;                       /* 1 + inputs; operand 0 is the output */
    int ndim;                       /* coalesced dims (>= 1) */
    int64_t shape[KL_MAX_DIMS];
    int64_t stride[KE_EW_MAXOPS][KL_MAX_DIMS]; /* elements */
    char *base[KE_EW_MAXOPS];
    kl_dtype dtype[KE_EW_MAXOPS];   /* operand dtypes */
    kl_dtype kdtype[KE_EW_MAXOPS];  /* dtypes the loop wants */
    unsigned bcast_ok;
    ke_ew_loop loop;
    const ke_attrs *attrs;
    _Atomic int err;
} ew_plan;

/* Drops size-1 dims and merges dims that are contiguous in every operand. */
static void coalesce(ew_plan *p) {
    int nd = 0;
    for (int d = 0; d < p->ndim; d++) {
        if (p->shape[d] == 1) continue;
        if (nd > 0) {
            int ok = 1;
            for (int k = 0; k < p->nops; k++)
                if (p->stride[k][nd - 1] != p->stride[k][d] * p->shape[d]) ok = 0;
            if (ok) {
                p->shape[nd - 1] *= p->shape[d];
                for (int k = 0; k < p->nops; k++) p->stride[k][nd - 1] = p->stride[k][d];
                continue;
            }
        }
        p->shape[nd] = p->shape[d];
        for (int k = 0; k < p->nops; k++) p->stride[k][nd] = p->stride[k][d];
        nd++;
    }
    if (nd == 0) { /* one element: any stride works; 1 keeps the fast path */
        p->shape[0] = 1;
        for (int k = 0; k < p->nops; k++) p->stride[k][0] = 1;
        nd = 1;
    }
    p->ndim = nd;
}

/* Runs the loop over elements [begin, end) of the row-major iteration space. */
static void ew_range(void *ctx, int64_t begin, int64_t end) {
    ew_plan *p = ctx;
    const int nd = p->ndim, nops = p->nops;
    const int64_t inner = p->shape[nd - 1];
    int64_t idx[KL_MAX_DIMS];
    int64_t rem = begin / inner;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = rem % p->shape[d];
        rem /= p->shape[d];
    }
    int64_t j = begin % inner;
    _Alignas(64) char buf[KE_EW_MAXOPS][KE_EW_CHUNK * 8];
    int err = 0;
    int64_t pos = begin;
    while (pos < end) {
        /* element offsets of this row's start */
        char *row[KE_EW_MAXOPS];
        for (int k = 0; k < nops; k++) {
            int64_t off = 0;
            for (int d = 0; d < nd - 1; d++) off += idx[d] * p->stride[k][d];
            row[k] = p->base[k] + off * (int64_t)ke_dtypes[p->dtype[k]].size;
        }
        int64_t row_end = inner;
        if (row_end - j > end - pos) row_end = j + (end - pos);
        while (j < row_end) {
            int64_t n = row_end - j;
            if (n > KE_EW_CHUNK) n = KE_EW_CHUNK;
            const void *in[KE_EW_MAXOPS];
            unsigned bcast = 0;
            for (int k = 1; k < nops; k++) {
                int64_t s = p->stride[k][nd - 1];
                size_t es = ke_dtypes[p->dtype[k]].size;
                char *src = row[k] + j * s * (int64_t)es;
                unsigned bit = 1u << (k - 1);
                if (p->dtype[k] == p->kdtype[k] && s == 1) {
                    in[k - 1] = src;
                } else if (s == 0 && (p->bcast_ok & bit)) {
                    if (p->dtype[k] == p->kdtype[k]) {
                        in[k - 1] = src;
                    } else {
                        ke_convert(buf[k], p->kdtype[k], src, p->dtype[k], 1);
                        in[k - 1] = buf[k];
                    }
                    bcast |= bit;
                } else {
                    ke_convert_strided(buf[k], p->kdtype[k], 1, src, p->dtype[k], s, n);
                    in[k - 1] = buf[k];
                }
            }
            int64_t so = p->stride[0][nd - 1];
            char *dst = row[0] + j * so * (int64_t)ke_dtypes[p->dtype[0]].size;
            if (p->dtype[0] == p->kdtype[0] && so == 1) {
                p->loop(n, dst, in, bcast, p->attrs, &err);
            } else {
                p->loop(n, buf[0], in, bcast, p->attrs, &err);
                ke_convert_strided(dst, p->dtype[0], so, buf[0], p->kdtype[0], 1, n);
            }
            j += n;
            pos += n;
        }
        /* next row */
        j = 0;
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < p->shape[d]) break;
            idx[d] = 0;
        }
    }
    if (err) {
        int expected = 0;
        atomic_compare_exchange_strong(&p->err, &expected, err);
    }
}

static int ew_error(ke_call *c, int err);
static int ew_run_planned(ke_call *c, const ke_ew_impl *impl, kl_dtype compute, ke_ew_loop loop, int64_t n);

int ke_ew_run(ke_call *c, const ke_ew_impl *impl, kl_dtype compute) {
    kl_tensor *out = c->out[0];
    ke_ew_loop loop = impl->loop[compute];
    if (!loop) {
        char b[256];
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for %s (input %s)", ke_dtypes[compute].name,
                      ke_fmt_tensor(b, sizeof b, c->in[0]));
    }
    int64_t n = ke_numel(out->ndim, out->shape);
    if (n == 0) return 0;
    KE_ASSERT(c->nin + 1 <= KE_EW_MAXOPS);
    /* The common small case first: a fresh contiguous output and inputs that
     * are contiguous with its shape (or single broadcast elements) in the
     * loop's dtype. Checking this is cheaper than planning, which matters
     * for the per-op overhead of small tensors. */
    kl_dtype okd = impl->out_bool ? KL_BOOL : compute;
    if (n < KE_EW_GRAIN && out->dtype == okd && ke_is_contig(out)) {
        const void *in[KE_EW_MAXOPS];
        unsigned bcast = 0;
        int ok = 1;
        for (int k = 0; k < c->nin && ok; k++) {
            const kl_tensor *t = c->in[k];
            kl_dtype want = (impl->bool_in >> k) & 1 ? KL_BOOL : compute;
            in[k] = ke_data(t);
            if (t->dtype != want) {
                ok = 0;
            } else if (t->ndim == out->ndim && ke_same_shape(t->ndim, t->shape, out->shape) && ke_is_contig(t)) {
                continue; /* element for element */
            } else if (ke_numel(t->ndim, t->shape) == 1) {
                if (n == 1) continue;
                if (impl->bcast_ok & (1u << k)) bcast |= 1u << k;
                else ok = 0;
            } else {
                ok = 0;
            }
        }
        if (ok) {
            int err = 0;
            loop(n, ke_data(out), in, bcast, &c->a, &err);
            return err ? ew_error(c, err) : 0;
        }
    }
    return ew_run_planned(c, impl, compute, loop, n);
}

/* Everything else: plan (broadcast strides, coalesced dims), then one flat
 * run or the buffered, parallel walk. Out of line so the small case above
 * does not pay for this frame. */
__attribute__((noinline)) static int ew_run_planned(ke_call *c, const ke_ew_impl *impl, kl_dtype compute,
                                                    ke_ew_loop loop, int64_t n) {
    kl_tensor *out = c->out[0];
    ew_plan p;
    p.nops = c->nin + 1;
    p.ndim = out->ndim;
    p.bcast_ok = impl->bcast_ok;
    p.loop = loop;
    p.attrs = &c->a;
    atomic_init(&p.err, 0);
    memcpy(p.shape, out->shape, sizeof(int64_t) * out->ndim);
    memcpy(p.stride[0], out->stride, sizeof(int64_t) * out->ndim);
    p.base[0] = ke_data(out);
    p.dtype[0] = (kl_dtype)out->dtype;
    p.kdtype[0] = impl->out_bool ? KL_BOOL : compute;
    for (int k = 0; k < c->nin; k++) {
        const kl_tensor *t = c->in[k];
        ke_broadcast_strides(t, out->ndim, out->shape, p.stride[k + 1]);
        p.base[k + 1] = ke_data(t);
        p.dtype[k + 1] = (kl_dtype)t->dtype;
        p.kdtype[k + 1] = (impl->bool_in >> k) & 1 ? KL_BOOL : compute;
    }
    coalesce(&p);
    /* The fast path: one flat run, every operand contiguous or a broadcast
     * element already in the loop's dtype — no buffers, no index math. */
    int flat = p.ndim == 1 && p.stride[0][0] == 1 && p.dtype[0] == p.kdtype[0];
    unsigned bcast = 0;
    for (int k = 1; flat && k < p.nops; k++) {
        int64_t s = p.stride[k][0];
        if (p.dtype[k] != p.kdtype[k]) flat = 0;
        else if (s == 0 && (impl->bcast_ok & (1u << (k - 1)))) bcast |= 1u << (k - 1);
        else if (s != 1) flat = 0;
    }
    if (flat && n < KE_EW_GRAIN) {
        const void *in[KE_EW_MAXOPS];
        for (int k = 1; k < p.nops; k++) in[k - 1] = p.base[k];
        int err = 0;
        loop(n, p.base[0], in, bcast, &c->a, &err);
        atomic_store(&p.err, err);
    } else {
        ke_parallel_for(n, KE_EW_GRAIN, ew_range, &p);
    }
    return ew_error(c, atomic_load(&p.err));
}

static int ew_error(ke_call *c, int err) {
    switch (err) {
    case KE_EW_OK: return 0;
    case KE_EW_INT_DIV_ZERO: return ke_err(KL_ERR_ARG, ke_opname(c), "integer division by zero");
    default: return ke_err(KL_ERR_INTERNAL, ke_opname(c), "elementwise loop failed");
    }
}

int ke_cpu_ew(ke_call *c) { return ke_ew_run(c, (const ke_ew_impl *)ke_ops[c->op].impl, c->compute); }

/* ---- loop names (ew.h) ------------------------------------------------------------ */

/* The linker collects every KE_EW_NAME entry between these two symbols. */
extern const ke_ew_loop_name __start_ke_ew_names[], __stop_ke_ew_names[];

const ke_ew_loop_name *ke_ew_loop_name_of(ke_ew_loop f) {
    for (const ke_ew_loop_name *e = __start_ke_ew_names; e < __stop_ke_ew_names; e++)
        if (e->loop == f) return e;
    return NULL;
}
