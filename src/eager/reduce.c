/*
 * reduce.c — the reduction engine that runs every reduction row
 * (formulas in reduce_ops.c), and kl_allclose / kl_equal.
 *
 * A reduction is a kernel (ke_rd_kernel: init, row, cols, merge, fin for one
 * loop dtype) run over an input layout. The planner drops size-1 dims, sorts
 * the kept and the reduced dims by input stride and merges dims that stay
 * contiguous, then picks
 *   row mode     the input's innermost dim is reduced: each output folds
 *                runs of it (a matrix's rows, a whole tensor);
 *   column mode  the input's innermost dim is kept: segments of up to
 *                RK_SEG outputs fold one input row at a time, vectorized
 *                across the outputs (a sum over dim 0).
 * Runs that are strided, broadcast (stride 0) or of a dtype the loops do not
 * read (f16, bf16 -> f32) are first converted into small contiguous
 * buffers, so any layout goes through the same two loops.
 *
 * Precision: no accumulator folds more than 32 elements serially: a row()
 * call folds RK_CHUNK elements in 64 lanes (row_fold.h), a column partial
 * RK_RB rows; partial results then join a cascade of fan-in RK_FAN (rows:
 * the row fold's own, so a contiguous row folds bitwise as row() on it whole
 * and as compiled kernels fold it). The rounding error
 * bound of an f32 sum grows like about 32 + 8*log8(n) additions instead of
 * n (typical errors like the square root of that): a serial f32 sum of 2^24
 * values of 0.1 stalls at 2^21 (-87%); this one is off by 3e-7 relative.
 *
 * Parallelism: with many outputs, threads split the outputs; with few
 * outputs and a long reduction, the reduced positions are cut into a fixed
 * number of slices whose accumulators merge pairwise. Both cuts depend only
 * on the shapes, never on the thread count, so results are bitwise the same
 * on any number of threads.
 */
#include "kernels_reduce.h"
#include "threadpool.h"

#include <math.h>
#include <stdlib.h>

#define RK_CHUNK KE_FOLD_CHUNK /* elements per row() call: row_fold.h's chunk */
#define RK_SEG 1024      /* outputs per segment: column mode reads 4 KB of each f32 row */
#define RK_RB 32         /* rows a column-mode partial folds before joining the cascade */
#define RK_FAN KE_FOLD_FAN /* cascade fan-in (column mode; rows: row_fold.h) */
#define RK_LEVELS KE_FOLD_LEVELS /* cascade depth: above 8^12 partials the top level folds serially */
#define RK_CASC_BYTES 32768 /* stack for a column cascade: fewer levels for wide accumulators */
#define RK_SHORT 16      /* an inner dim this short is a poor innermost loop */
#define RK_GRAIN 32768   /* input elements below which one thread works */
#define RK_SLICE 65536   /* reduced positions per slice when the reduction itself is split */
#define RK_MAX_SLICES 64
#define RK_SPLIT_OUT 16  /* split the reduction itself when there are fewer outputs */

/* ---- the engine ----------------------------------------------------------------- */

typedef struct rk_plan {
    const ke_rd_kernel *k;
    const ke_attrs *attrs;
    const char *x;                /* input element [0,...,0] */
    kl_dtype xdt, ldt;            /* input dtype; dtype the loops read */
    int nk, nr;                   /* kept and reduced dims, outermost first (>= 1 each) */
    int rows;                     /* row mode (else column mode) */
    int64_t ksz[KL_MAX_DIMS], kst[KL_MAX_DIMS], kos[KL_MAX_DIMS]; /* size, input and output strides */
    int64_t rsz[KL_MAX_DIMS], rst[KL_MAX_DIMS];
    int64_t nout, rtot;           /* outputs; reduced positions per output */
    const char *aux;              /* first-pass values in output order, or NULL */
    size_t auxsz;
    char *vdst;                   /* values, output order (contiguous), or NULL */
    kl_dtype vdt;
    int64_t *idst;                /* positions, output order, or NULL */
    int64_t slice;                /* split reductions: positions per slice */
    char *partial;                /* split reductions: accumulators per slice, output order */
} rk_plan;

/* A cascade of partial results (each n accumulators): level l merges up to
 * RK_FAN partials before passing them up, so no accumulator sees a long
 * serial chain. Higher levels hold earlier positions. */
typedef struct rk_casc {
    const ke_rd_kernel *k;
    int64_t n;
    size_t bytes;
    int nlev;
    int cnt[RK_LEVELS];
    char *lv; /* nlev x n accumulators */
} rk_casc;

/* lv holds cap bytes; the top level that fits folds serially. */
static void rk_casc_init(rk_casc *c, const ke_rd_kernel *k, int64_t n, char *lv, size_t cap) {
    c->k = k;
    c->n = n;
    c->bytes = (size_t)n * k->asize;
    c->lv = lv;
    c->nlev = (int)(cap / c->bytes < RK_LEVELS ? cap / c->bytes : RK_LEVELS);
    KE_ASSERT(c->nlev >= 1);
    memset(c->cnt, 0, sizeof c->cnt);
}

/* Adds the partial v (clobbered), which covers positions after all earlier ones. */
static void rk_casc_push(rk_casc *c, char *v) {
    for (int l = 0;; l++) {
        char *lv = c->lv + (size_t)l * c->bytes;
        if (c->cnt[l] == 0) {
            memcpy(lv, v, c->bytes);
            c->cnt[l] = 1;
            return;
        }
        c->k->merge(lv, v, c->n);
        if (l == c->nlev - 1 || ++c->cnt[l] < RK_FAN) return;
        memcpy(v, lv, c->bytes);
        c->cnt[l] = 0;
    }
}

static void rk_casc_finish(rk_casc *c, char *out) {
    c->k->init(out, c->n);
    for (int l = c->nlev - 1; l >= 0; l--)
        if (c->cnt[l]) c->k->merge(out, c->lv + (size_t)l * c->bytes, c->n);
}

/* Multi-index of linear position pos over n dims; returns its offset. */
static int64_t rk_decode(int n, const int64_t *size, const int64_t *stride, int64_t pos, int64_t *idx) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        idx[d] = size[d] ? pos % size[d] : 0;
        pos = size[d] ? pos / size[d] : 0;
        off += idx[d] * stride[d];
    }
    return off;
}

/* Steps idx to the next position; returns the updated offset. */
static inline int64_t rk_next(int n, const int64_t *size, const int64_t *stride, int64_t *idx, int64_t off) {
    for (int d = n - 1; d >= 0; d--) {
        off += stride[d];
        if (++idx[d] < size[d]) return off;
        off -= size[d] * stride[d];
        idx[d] = 0;
    }
    return off;
}

/* n input elements from element offset off, step st, as a contiguous array
 * of the loop dtype: the input itself when it is one, else buf. */
static const void *rk_load(const rk_plan *p, int64_t off, int64_t st, int64_t n, void *buf) {
    const char *src = p->x + off * (int64_t)ke_dtypes[p->xdt].size;
    if (st == 1 && p->xdt == p->ldt) return src;
    ke_convert_strided(buf, p->ldt, 1, src, p->xdt, st, n);
    return buf;
}

/* The first-pass values of n outputs at output offset off, step st. */
static const void *rk_aux(const rk_plan *p, int64_t off, int64_t st, int64_t n, char *buf) {
    if (!p->aux) return NULL;
    const char *a = p->aux + off * (int64_t)p->auxsz;
    if (st == 1) return a;
    for (int64_t j = 0; j < n; j++) memcpy(buf + j * (int64_t)p->auxsz, a + j * st * (int64_t)p->auxsz, p->auxsz);
    return buf;
}

/* Row mode: folds reduced positions [r0, r1) of the output whose first
 * element is at input offset base into acc. */
static void rk_row_reduce(const rk_plan *p, int64_t base, int64_t r0, int64_t r1, const void *aux, char *acc) {
    const ke_rd_kernel *k = p->k;
    const int ni = p->nr - 1;
    const int64_t isz = p->rsz[ni], ist = p->rst[ni];
    _Alignas(64) char buf[RK_CHUNK * 8];
    int64_t idx[KL_MAX_DIMS];
    k->init(acc, 1);
    if (r1 <= r0) return;
    int64_t off = base + rk_decode(p->nr, p->rsz, p->rst, r0, idx);
    if (r1 - r0 <= RK_CHUNK && idx[ni] + (r1 - r0) <= isz) { /* one short run */
        k->row(acc, rk_load(p, off, ist, r1 - r0, buf), r1 - r0, r0, aux, p->attrs);
        return;
    }
    /* chunk values join the row fold's own cascade (the kernel's, from
     * tmpl/fold_cascade.h): a contiguous row folds bitwise as row() on the
     * whole row, and as compiled kernels fold it */
    _Alignas(16) char tmp[KE_RD_ACC_MAX];
    ke_fold_casc cs;
    memset(cs.cnt, 0, sizeof cs.cnt);
    for (int64_t r = r0; r < r1;) {
        int64_t n = isz - idx[ni];
        if (n > r1 - r) n = r1 - r;
        if (n > RK_CHUNK) n = RK_CHUNK;
        k->init(tmp, 1);
        k->row(tmp, rk_load(p, off, ist, n, buf), n, r, aux, p->attrs);
        k->push(&cs, tmp);
        r += n;
        idx[ni] += n - 1;
        off = rk_next(p->nr, p->rsz, p->rst, idx, off + (n - 1) * ist);
    }
    k->drain(acc, &cs);
}

/* Column mode: folds reduced positions [r0, r1) of n outputs, whose first
 * elements are at input offset base, step kst, into acc[0..n). */
static void rk_col_reduce(const rk_plan *p, int64_t base, int64_t kst, int64_t n, int64_t r0, int64_t r1,
                          const void *aux, char *acc) {
    const ke_rd_kernel *k = p->k;
    _Alignas(64) char buf[RK_SEG * 8];
    _Alignas(16) char tmp[RK_SEG * KE_RD_ACC_MAX];
    _Alignas(16) char lv[RK_CASC_BYTES];
    int64_t idx[KL_MAX_DIMS];
    rk_casc cs;
    int rows = 0;
    const int ni = p->nr - 1;
    /* rows the loop can read in place go RK_RB at a time */
    const int direct = kst == 1 && p->xdt == p->ldt;
    const size_t xes = ke_dtypes[p->xdt].size;
    rk_casc_init(&cs, k, n, lv, sizeof lv);
    k->init(tmp, n);
    int64_t off = base + (r1 > r0 ? rk_decode(p->nr, p->rsz, p->rst, r0, idx) : 0);
    for (int64_t r = r0; r < r1;) {
        int64_t m = 1;
        if (direct) {
            m = RK_RB - rows;
            if (m > p->rsz[ni] - idx[ni]) m = p->rsz[ni] - idx[ni];
            if (m > r1 - r) m = r1 - r;
            k->cols(tmp, p->x + off * (int64_t)xes, n, m, p->rst[ni], r, aux, p->attrs);
        } else {
            k->cols(tmp, rk_load(p, off, kst, n, buf), n, 1, 0, r, aux, p->attrs);
        }
        r += m;
        rows += (int)m;
        if (rows == RK_RB) {
            rk_casc_push(&cs, tmp);
            k->init(tmp, n);
            rows = 0;
        }
        idx[ni] += m - 1;
        off = rk_next(p->nr, p->rsz, p->rst, idx, off + (m - 1) * p->rst[ni]);
    }
    if (rows) rk_casc_push(&cs, tmp);
    rk_casc_finish(&cs, acc);
}

/* Finalizes n accumulators of outputs at output offset off, step st, into
 * the destinations, or stores the accumulators into partial. */
static void rk_emit(const rk_plan *p, const char *acc, int64_t n, int64_t off, int64_t st, char *partial) {
    const ke_rd_kernel *k = p->k;
    if (partial) {
        for (int64_t j = 0; j < n; j++)
            memcpy(partial + (off + j * st) * k->asize, acc + j * k->asize, k->asize);
        return;
    }
    _Alignas(64) char vbuf[RK_SEG * 8], abuf[RK_SEG * 8];
    int64_t ibuf[RK_SEG];
    k->fin(vbuf, ibuf, acc, n, p->rtot, rk_aux(p, off, st, n, abuf), p->attrs);
    if (p->vdst)
        ke_convert_strided(p->vdst + off * (int64_t)ke_dtypes[p->vdt].size, p->vdt, st, vbuf, (kl_dtype)k->vdt, 1, n);
    if (p->idst)
        for (int64_t j = 0; j < n; j++) p->idst[off + j * st] = ibuf[j];
}

/* Outputs [k0, k1) (in kept-dim iteration order) over reduced positions
 * [r0, r1): results, or accumulators into partial. */
static void rk_block(const rk_plan *p, int64_t k0, int64_t k1, int64_t r0, int64_t r1, char *partial) {
    const ke_rd_kernel *k = p->k;
    const int ki = p->nk - 1;
    const int64_t kst = p->kst[ki], kos = p->kos[ki];
    _Alignas(16) char acc[RK_SEG * KE_RD_ACC_MAX];
    _Alignas(64) char abuf[RK_SEG * 8];
    int64_t idx[KL_MAX_DIMS];
    int64_t ioff = rk_decode(p->nk, p->ksz, p->kst, k0, idx), ooff = 0;
    for (int d = 0; d < p->nk; d++) ooff += idx[d] * p->kos[d];
    for (int64_t kk = k0; kk < k1;) {
        int64_t n = p->ksz[ki] - idx[ki];
        if (n > k1 - kk) n = k1 - kk;
        if (n > RK_SEG) n = RK_SEG;
        if (p->rows) {
            for (int64_t j = 0; j < n; j++)
                rk_row_reduce(p, ioff + j * kst, r0, r1, rk_aux(p, ooff + j * kos, 1, 1, abuf), acc + j * k->asize);
        } else {
            rk_col_reduce(p, ioff, kst, n, r0, r1, rk_aux(p, ooff, kos, n, abuf), acc);
        }
        rk_emit(p, acc, n, ooff, kos, partial);
        kk += n;
        idx[ki] += n;
        ioff += n * kst;
        ooff += n * kos;
        if (idx[ki] == p->ksz[ki]) {
            ioff -= idx[ki] * kst;
            ooff -= idx[ki] * kos;
            idx[ki] = 0;
            for (int d = ki - 1; d >= 0; d--) {
                ioff += p->kst[d];
                ooff += p->kos[d];
                if (++idx[d] < p->ksz[d]) break;
                ioff -= p->ksz[d] * p->kst[d];
                ooff -= p->ksz[d] * p->kos[d];
                idx[d] = 0;
            }
        }
    }
}

static void rk_out_range(void *ctx, int64_t b, int64_t e) {
    const rk_plan *p = ctx;
    rk_block(p, b, e, 0, p->rtot, NULL);
}

static void rk_slice_range(void *ctx, int64_t b, int64_t e) {
    const rk_plan *p = ctx;
    for (int64_t s = b; s < e; s++) {
        int64_t r0 = s * p->slice, r1 = r0 + p->slice < p->rtot ? r0 + p->slice : p->rtot;
        rk_block(p, 0, p->nout, r0, r1, p->partial + s * p->nout * p->k->asize);
    }
}

/* Sorts dims by decreasing |input stride| (stable), carrying the other arrays. */
static void rk_sort(int n, int64_t *size, int64_t *stride, int64_t *ostride) {
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && llabs(stride[j]) > llabs(stride[j - 1]); j--) {
            int64_t t;
            t = size[j], size[j] = size[j - 1], size[j - 1] = t;
            t = stride[j], stride[j] = stride[j - 1], stride[j - 1] = t;
            if (ostride) t = ostride[j], ostride[j] = ostride[j - 1], ostride[j - 1] = t;
        }
    }
}

/* Merges neighbouring dims that are contiguous in the input (and output). */
static int rk_coalesce(int n, int64_t *size, int64_t *stride, int64_t *ostride) {
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (m > 0 && stride[m - 1] == stride[d] * size[d] && (!ostride || ostride[m - 1] == ostride[d] * size[d])) {
            size[m - 1] *= size[d];
            stride[m - 1] = stride[d];
            if (ostride) ostride[m - 1] = ostride[d];
            continue;
        }
        size[m] = size[d];
        stride[m] = stride[d];
        if (ostride) ostride[m] = ostride[d];
        m++;
    }
    return m;
}

static void rk_plan_init(rk_plan *p, const kl_tensor *x, uint32_t mask, kl_dtype ldt, int ordered,
                         const ke_attrs *a) {
    memset(p, 0, sizeof *p);
    p->attrs = a;
    p->x = ke_data(x);
    p->ldt = ldt;
    /* bool bytes are 0/1: the u8 loops read them as they are */
    p->xdt = (x->dtype == KL_BOOL && ldt == KL_U8) ? KL_U8 : (kl_dtype)x->dtype;
    int64_t os[KL_MAX_DIMS], nout = 1, rtot = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
        if (mask >> d & 1) {
            rtot *= x->shape[d];
        } else {
            os[d] = nout;
            nout *= x->shape[d];
        }
    }
    p->nout = nout;
    p->rtot = rtot;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] == 1) continue;
        if (mask >> d & 1) {
            p->rsz[p->nr] = x->shape[d];
            p->rst[p->nr++] = x->stride[d];
        } else {
            p->ksz[p->nk] = x->shape[d];
            p->kst[p->nk] = x->stride[d];
            p->kos[p->nk++] = os[d];
        }
    }
    if (rtot == 0) { /* nothing to fold: one empty reduced dim */
        p->nr = 1;
        p->rsz[0] = 0;
        p->rst[0] = 0;
    }
    rk_sort(p->nk, p->ksz, p->kst, p->kos);
    /* positions must count in the logical order for index-reporting ops */
    if (!ordered) rk_sort(p->nr, p->rsz, p->rst, NULL);
    p->nk = rk_coalesce(p->nk, p->ksz, p->kst, p->kos);
    p->nr = rk_coalesce(p->nr, p->rsz, p->rst, NULL);
    if (p->nk == 0) {
        p->nk = 1;
        p->ksz[0] = 1;
        p->kst[0] = p->kos[0] = 0;
    }
    if (p->nr == 0) {
        p->nr = 1;
        p->rsz[0] = 1;
        p->rst[0] = 0;
    }
    /* the dim with the smaller input stride is the inner loop, unless it is
     * short and the other one long: [N,4] folds 4-long rows as columns */
    int64_t rs = llabs(p->rst[p->nr - 1]), ks = llabs(p->kst[p->nk - 1]);
    int64_t rl = p->rsz[p->nr - 1], kl = p->ksz[p->nk - 1];
    p->rows = rl > 1 && (rs == 1 || (ks != 1 && rs != 0 && (ks == 0 || rs < ks)));
    if (p->rows && rl < RK_SHORT && kl >= RK_SHORT) p->rows = 0;
    else if (!p->rows && rl >= RK_SHORT && kl < RK_SHORT && !(ks == 1 && p->xdt == p->ldt)) p->rows = 1;
}

static int rk_run(ke_call *c, rk_plan *p) {
    const ke_rd_kernel *k = p->k;
    if (p->nout == 0) return 0;
    if (p->nout < RK_SPLIT_OUT && p->rtot >= 2 * RK_SLICE) {
        int64_t ns = p->rtot / RK_SLICE;
        if (ns > RK_MAX_SLICES) ns = RK_MAX_SLICES;
        int64_t len = (p->rtot + ns - 1) / ns;
        p->slice = (len + RK_CHUNK - 1) / RK_CHUNK * RK_CHUNK;
        ns = (p->rtot + p->slice - 1) / p->slice;
        size_t stride = (size_t)p->nout * k->asize;
        p->partial = malloc(stride * (size_t)ns);
        if (!p->partial) return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for partial results");
        ke_parallel_for(ns, 1, rk_slice_range, p);
        for (int64_t w = 1; w < ns; w *= 2)
            for (int64_t s = 0; s + w < ns; s += 2 * w)
                k->merge(p->partial + s * stride, p->partial + (s + w) * stride, p->nout);
        char *part = p->partial;
        p->partial = NULL;
        for (int64_t j = 0; j < p->nout; j += RK_SEG)
            rk_emit(p, part + j * k->asize, p->nout - j < RK_SEG ? p->nout - j : RK_SEG, j, 1, NULL);
        free(part);
        return 0;
    }
    int64_t grain = RK_GRAIN / (p->rtot > 0 ? p->rtot : 1);
    ke_parallel_for(p->nout, grain > 0 ? grain : 1, rk_out_range, p);
    return 0;
}

static void rk_inf_to_zero(void *v, kl_dtype dt, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        if (dt == KL_F32 && isinf(((float *)v)[j])) ((float *)v)[j] = 0;
        if (dt == KL_F64 && isinf(((double *)v)[j])) ((double *)v)[j] = 0;
    }
}

int ke_cpu_reduce(ke_call *c) {
    const ke_rd_op *op = c->op == KE_OP_norm ? ke_rd_norm_op(ke_attr_norm_p(&c->a)) : (const ke_rd_op *)ke_ops[c->op].impl;
    const kl_tensor *x = c->in[0];
    kl_dtype ldt = c->compute;
    uint32_t mask;
    if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
    if (!op->k[ldt] || (op->pre && !op->pre->k[ldt])) {
        char b[256];
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for %s", ke_fmt_tensor(b, sizeof b, x));
    }
    rk_plan p;
    rk_plan_init(&p, x, mask, ldt, op->ordered, &c->a);
    char *aux = NULL;
    if (op->pre && p.nout > 0) {
        const ke_rd_kernel *pk = op->pre->k[ldt];
        p.k = pk;
        p.vdt = (kl_dtype)pk->vdt;
        p.auxsz = ke_dtypes[p.vdt].size;
        aux = malloc((size_t)p.nout * p.auxsz);
        if (!aux) return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for %lld first-pass values", (long long)p.nout);
        p.vdst = aux;
        if (rk_run(c, &p)) {
            free(aux);
            return -1;
        }
        if (op->pre_inf_to_zero) rk_inf_to_zero(aux, p.vdt, p.nout);
        p.aux = aux;
    }
    p.k = op->k[ldt];
    p.vdst = op->vout >= 0 ? ke_data(c->out[op->vout]) : NULL;
    p.vdt = op->vout >= 0 ? (kl_dtype)c->out[op->vout]->dtype : KL_F32;
    p.idst = op->iout >= 0 ? (int64_t *)ke_data(c->out[op->iout]) : NULL;
    int rc = rk_run(c, &p);
    free(aux);
    return rc;
}


/* ---- kl_allclose, kl_equal -------------------------------------------------------------
 * Plain loops over the broadcast shape, a row at a time through buffers of
 * the compare dtype (f32 for f32/f16/bf16, f64, or int64 for integers and
 * bool); they stop at the first mismatch. */

typedef struct rk_cmp {
    kl_dtype via;    /* values are first converted to this dtype (equal: the promoted one) */
    kl_dtype dt;     /* then compared in this one */
    int close;       /* allclose (else equal) */
    int equal_nan;
    double rtol, atol;
} rk_cmp;

/* isclose as PyTorch: equal, or both NaN (equal_nan), or a finite
 * |x - y| <= atol + |rtol * y|, computed in the compare type. */
#define RK_CLOSE_LOOP(sfx, T)                                                               \
    static int rk_close_##sfx(const rk_cmp *m, const T *a, const T *b, int64_t n) {         \
        const T rtol = (T)m->rtol, atol = (T)m->atol;                                       \
        int ok = 1;                                                                         \
        for (int64_t j = 0; j < n; j++) {                                                   \
            T x = a[j], y = b[j], err = RK_FABS(x - y);                                     \
            ok &= x == y || (m->equal_nan && x != x && y != y) ||                           \
                  (isfinite(err) && err <= atol + RK_FABS(rtol * y));                       \
        }                                                                                   \
        return ok;                                                                          \
    }
#define RK_FABS(v) _Generic((v), float: fabsf, default: fabs)(v)
RK_CLOSE_LOOP(f32, float)
RK_CLOSE_LOOP(f64, double)

/* integers: exact |x - y| (no overflow), tolerance in double */
static int rk_close_i64(const rk_cmp *m, const int64_t *a, const int64_t *b, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        int64_t x = a[j], y = b[j];
        if (x == y) continue;
        uint64_t d = x > y ? (uint64_t)x - (uint64_t)y : (uint64_t)y - (uint64_t)x;
        if (!((double)d <= m->atol + fabs(m->rtol * (double)y))) return 0;
    }
    return 1;
}

#define RK_EQUAL_LOOP(sfx, T)                                                               \
    static int rk_equal_##sfx(const T *a, const T *b, int64_t n) {                          \
        int ok = 1;                                                                         \
        for (int64_t j = 0; j < n; j++) ok &= a[j] == b[j];                                 \
        return ok;                                                                          \
    }
RK_EQUAL_LOOP(f32, float)
RK_EQUAL_LOOP(f64, double)
RK_EQUAL_LOOP(i64, int64_t)

static int rk_cmp_chunk(const rk_cmp *m, const void *a, const void *b, int64_t n) {
    switch (m->dt) {
    case KL_F32: return m->close ? rk_close_f32(m, a, b, n) : rk_equal_f32(a, b, n);
    case KL_F64: return m->close ? rk_close_f64(m, a, b, n) : rk_equal_f64(a, b, n);
    default: return m->close ? rk_close_i64(m, a, b, n) : rk_equal_i64(a, b, n);
    }
}

/* n elements of t from element offset off, step st, as m->dt in buf. */
static void rk_cmp_load(const rk_cmp *m, const kl_tensor *t, int64_t off, int64_t st, int64_t n, char *buf,
                        char *tmp) {
    const char *src = ke_data(t) + off * (int64_t)ke_dtypes[t->dtype].size;
    if (m->via != m->dt && m->via != t->dtype) { /* round through the promoted dtype first */
        ke_convert_strided(tmp, m->via, 1, src, (kl_dtype)t->dtype, st, n);
        ke_convert(buf, m->dt, tmp, m->via, n);
    } else {
        ke_convert_strided(buf, m->dt, 1, src, (kl_dtype)t->dtype, st, n);
    }
}

/* 1 if every broadcast pair of a and b (CPU) passes m, else 0. */
static int rk_cmp_all(const rk_cmp *m, const kl_tensor *a, const kl_tensor *b, int nd, const int64_t *shape) {
    enum { CH = 1024 };
    int64_t sa[KL_MAX_DIMS], sb[KL_MAX_DIMS], idx[KL_MAX_DIMS] = {0};
    int64_t n = ke_numel(nd, shape);
    if (n == 0) return 1;
    ke_broadcast_strides(a, nd, shape, sa);
    ke_broadcast_strides(b, nd, shape, sb);
    int64_t inner = nd ? shape[nd - 1] : 1, ia = nd ? sa[nd - 1] : 0, ib = nd ? sb[nd - 1] : 0;
    int64_t oa = 0, ob = 0;
    _Alignas(64) char ba[CH * 8], bb[CH * 8], tmp[CH * 8];
    for (int64_t row = 0; row < n / inner; row++) {
        for (int64_t j = 0; j < inner; j += CH) {
            int64_t len = inner - j < CH ? inner - j : CH;
            rk_cmp_load(m, a, oa + j * ia, ia, len, ba, tmp);
            rk_cmp_load(m, b, ob + j * ib, ib, len, bb, tmp);
            if (!rk_cmp_chunk(m, ba, bb, len)) return 0;
        }
        for (int d = nd - 2; d >= 0; d--) {
            oa += sa[d];
            ob += sb[d];
            if (++idx[d] < shape[d]) break;
            oa -= shape[d] * sa[d];
            ob -= shape[d] * sb[d];
            idx[d] = 0;
        }
    }
    return 1;
}

/* Runs the comparison on CPU copies when the tensors live elsewhere. */
static int rk_compare(const char *op, const rk_cmp *m, kl_tensor *a, kl_tensor *b, int nd, const int64_t *shape) {
    kl_device da = a->storage->device, db = b->storage->device;
    char b1[256], b2[256];
    if (da.type != db.type || da.index != db.index)
        return ke_err(KL_ERR_DEVICE, op, "expected both tensors on one device, got %s and %s",
                      ke_fmt_tensor(b1, sizeof b1, a), ke_fmt_tensor(b2, sizeof b2, b));
    if (da.type == KL_META)
        return ke_err(KL_ERR_DEVICE, op, "meta tensors hold no values to compare (%s and %s)",
                      ke_fmt_tensor(b1, sizeof b1, a), ke_fmt_tensor(b2, sizeof b2, b));
    if (da.type == KL_CPU) return rk_cmp_all(m, a, b, nd, shape);
    kl_scope_begin();
    kl_tensor *ca = kl_to_device(a, KL_DEVICE_CPU), *cb = ca ? kl_to_device(b, KL_DEVICE_CPU) : NULL;
    int r = cb ? rk_cmp_all(m, ca, cb, nd, shape) : -1;
    kl_scope_end();
    return r;
}

/* The dtype values are compared in. */
static kl_dtype rk_cmp_dtype(kl_dtype d) { return ke_is_float(d) ? ke_compute_dtype(d) : KL_I64; }

int kl_allclose(kl_tensor *a, kl_tensor *b, double rtol, double atol, bool equal_nan) {
    const char *op = "allclose";
    char b1[256], b2[256];
    if (ke_check_tensor(a, op, 1) || ke_check_tensor(b, op, 2) || ke_check_data(a, op) || ke_check_data(b, op))
        return -1;
    if (a->dtype != b->dtype)
        return ke_err(KL_ERR_DTYPE, op, "dtypes must match, got %s and %s", ke_fmt_tensor(b1, sizeof b1, a),
                      ke_fmt_tensor(b2, sizeof b2, b));
    if (!(rtol >= 0)) return ke_err(KL_ERR_ARG, op, "rtol must be greater than or equal to zero, but got %g", rtol);
    if (!(atol >= 0)) return ke_err(KL_ERR_ARG, op, "atol must be greater than or equal to zero, but got %g", atol);
    int nd;
    int64_t shape[KL_MAX_DIMS];
    kl_tensor *pair[2] = {a, b};
    if (ke_broadcast_shapes(op, 2, pair, &nd, shape)) return -1;
    kl_dtype dt = rk_cmp_dtype((kl_dtype)a->dtype);
    rk_cmp m = {.via = dt, .dt = dt, .close = 1, .equal_nan = equal_nan, .rtol = rtol, .atol = atol};
    return rk_compare(op, &m, a, b, nd, shape);
}

int kl_equal(kl_tensor *a, kl_tensor *b) {
    const char *op = "equal";
    if (ke_check_tensor(a, op, 1) || ke_check_tensor(b, op, 2) || ke_check_data(a, op) || ke_check_data(b, op))
        return -1;
    if (a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim)) return 0;
    /* values compare after PyTorch's promotion: int64 2^62+1 equals float32 2^62 */
    kl_dtype pt = kl_promote_types((kl_dtype)a->dtype, (kl_dtype)b->dtype);
    rk_cmp m = {.via = pt, .dt = rk_cmp_dtype(pt)};
    return rk_compare(op, &m, a, b, a->ndim, a->shape);
}
