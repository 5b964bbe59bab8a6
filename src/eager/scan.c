/*
 * scan.c — cumulative sums and products along one dim (rows cumsum and
 * cumprod in ops_reduce.def). Integer and bool inputs give int64, wrapping
 * on overflow; floats accumulate in double, as PyTorch's CPU kernels do,
 * and round to their own dtype.
 *
 * Scanning the innermost dim, each line is one serial chain over chunks
 * converted to the accumulator type. Scanning an outer dim, tiles of up to
 * SC_TILE inner elements advance together one step of the dim at a time,
 * vectorized across the tile. Inputs of any strides are gathered into the
 * chunk buffers; the output is contiguous.
 */
#include "kernels_reduce.h"
#include "threadpool.h"

#define SC_TILE 1024
#define SC_GRAIN 32768

typedef struct sc_impl {
    void (*init)(void *acc, int64_t n);
    /* buf[i] becomes the running result; *carry is the running value */
    void (*line)(void *carry, void *buf, int64_t n);
    /* buf[j] becomes acc[j] op buf[j], as does acc[j] */
    void (*tile)(void *acc, void *buf, int64_t n);
    kl_dtype adt; /* accumulator dtype (int64 values held as uint64_t) */
} sc_impl;

#define SC_LOOPS(name, A, OP, ID)                                           \
    static void name##_init(void *acc_, int64_t n) {                        \
        A *acc = acc_;                                                      \
        for (int64_t j = 0; j < n; j++) acc[j] = (A)(ID);                   \
    }                                                                       \
    static void name##_line(void *carry_, void *buf_, int64_t n) {          \
        A *restrict buf = buf_;                                             \
        A c = *(A *)carry_;                                                 \
        for (int64_t i = 0; i < n; i++) {                                   \
            c = c OP buf[i];                                                \
            buf[i] = c;                                                     \
        }                                                                   \
        *(A *)carry_ = c;                                                   \
    }                                                                       \
    static void name##_tile(void *acc_, void *buf_, int64_t n) {            \
        A *restrict acc = acc_, *restrict buf = buf_;                       \
        for (int64_t j = 0; j < n; j++) {                                   \
            acc[j] = acc[j] OP buf[j];                                      \
            buf[j] = acc[j];                                                \
        }                                                                   \
    }
SC_LOOPS(sum_f64, double, +, 0)
SC_LOOPS(prod_f64, double, *, 1)
SC_LOOPS(sum_i64, uint64_t, +, 0)
SC_LOOPS(prod_i64, uint64_t, *, 1)

static const sc_impl sc_impls[2][2] = {
    {{sum_f64_init, sum_f64_line, sum_f64_tile, KL_F64}, {sum_i64_init, sum_i64_line, sum_i64_tile, KL_I64}},
    {{prod_f64_init, prod_f64_line, prod_f64_tile, KL_F64}, {prod_i64_init, prod_i64_line, prod_i64_tile, KL_I64}},
};

typedef struct sc_plan {
    const sc_impl *f;
    const char *x;
    kl_dtype xdt, odt;
    char *o;
    int no, ni;                                 /* outer / inner dims of x (coalesced) */
    int64_t osz[KL_MAX_DIMS], ost[KL_MAX_DIMS];
    int64_t isz[KL_MAX_DIMS], ist[KL_MAX_DIMS];
    int64_t len, step;                          /* the scanned dim: size and input stride */
    int64_t inner, ntiles;                      /* inner elements per line; tiles of them */
} sc_plan;

/* Input element offset of position pos over n dims. */
static int64_t sc_offset(int n, const int64_t *size, const int64_t *stride, int64_t pos) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += pos % size[d] * stride[d];
        pos /= size[d];
    }
    return off;
}

/* Drops size-1 dims and merges contiguous neighbours; returns the count. */
static int sc_coalesce(int n, const int64_t *size, const int64_t *stride, int64_t *osize, int64_t *ostride) {
    int m = 0;
    for (int d = 0; d < n; d++) {
        if (size[d] == 1) continue;
        if (m > 0 && ostride[m - 1] == stride[d] * size[d]) {
            osize[m - 1] *= size[d];
            ostride[m - 1] = stride[d];
            continue;
        }
        osize[m] = size[d];
        ostride[m++] = stride[d];
    }
    return m;
}

/* Inner elements [k0, k0 + n) at input offset base, converted into buf. */
static void sc_gather(const sc_plan *p, int64_t base, int64_t k0, int64_t n, void *buf) {
    size_t xes = ke_dtypes[p->xdt].size, aes = ke_dtypes[p->f->adt].size;
    if (p->ni == 0) { /* one inner element */
        ke_convert(buf, p->f->adt, p->x + base * (int64_t)xes, p->xdt, n);
        return;
    }
    const int last = p->ni - 1;
    const int64_t lsz = p->isz[last], lst = p->ist[last];
    for (int64_t k = k0; k < k0 + n;) {
        int64_t run = lsz - k % lsz;
        if (run > k0 + n - k) run = k0 + n - k;
        int64_t off = base + sc_offset(p->ni, p->isz, p->ist, k);
        ke_convert_strided((char *)buf + (k - k0) * (int64_t)aes, p->f->adt, 1, p->x + off * (int64_t)xes, p->xdt,
                           lst, run);
        k += run;
    }
}

/* Scans along the innermost dim: lines [b, e). */
static void sc_lines(void *ctx, int64_t b, int64_t e) {
    const sc_plan *p = ctx;
    size_t xes = ke_dtypes[p->xdt].size, oes = ke_dtypes[p->odt].size;
    _Alignas(64) char buf[SC_TILE * 8], carry[8];
    for (int64_t line = b; line < e; line++) {
        int64_t xoff = sc_offset(p->no, p->osz, p->ost, line);
        p->f->init(carry, 1);
        for (int64_t r = 0; r < p->len; r += SC_TILE) {
            int64_t n = p->len - r < SC_TILE ? p->len - r : SC_TILE;
            ke_convert_strided(buf, p->f->adt, 1, p->x + (xoff + r * p->step) * (int64_t)xes, p->xdt, p->step, n);
            p->f->line(carry, buf, n);
            ke_convert(p->o + (line * p->len + r) * (int64_t)oes, p->odt, buf, p->f->adt, n);
        }
    }
}

/* Scans along an outer dim: units [b, e), each a tile of one outer index. */
static void sc_tiles(void *ctx, int64_t b, int64_t e) {
    const sc_plan *p = ctx;
    size_t oes = ke_dtypes[p->odt].size;
    _Alignas(64) char buf[SC_TILE * 8], acc[SC_TILE * 8];
    for (int64_t u = b; u < e; u++) {
        int64_t line = u / p->ntiles, k0 = u % p->ntiles * SC_TILE;
        int64_t n = p->inner - k0 < SC_TILE ? p->inner - k0 : SC_TILE;
        int64_t xoff = sc_offset(p->no, p->osz, p->ost, line);
        p->f->init(acc, n);
        for (int64_t r = 0; r < p->len; r++) {
            sc_gather(p, xoff + r * p->step, k0, n, buf);
            p->f->tile(acc, buf, n);
            ke_convert(p->o + ((line * p->len + r) * p->inner + k0) * (int64_t)oes, p->odt, buf, p->f->adt, n);
        }
    }
}

int ke_infer_scan(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    if (ke_wrap_dim(ke_opname(c), ke_attr_cumsum_dim(&c->a), x->ndim) < 0) return -1;
    kl_dtype xd = (kl_dtype)x->dtype;
    out->dtype = ke_is_float(xd) ? xd : KL_I64;
    c->compute = ke_is_float(xd) ? KL_F64 : KL_I64;
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

int ke_cpu_scan(ke_call *c) {
    const kl_tensor *x = c->in[0];
    kl_tensor *out = c->out[0];
    int d = ke_wrap_dim(ke_opname(c), ke_attr_cumsum_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    int64_t numel = ke_numel(x->ndim, x->shape);
    if (numel == 0) return 0;
    sc_plan p;
    memset(&p, 0, sizeof p);
    p.f = &sc_impls[c->op == KE_OP_cumprod][!ke_is_float((kl_dtype)x->dtype)];
    p.x = ke_data(x);
    p.xdt = (kl_dtype)x->dtype;
    p.o = ke_data(out);
    p.odt = (kl_dtype)out->dtype;
    p.len = x->ndim ? x->shape[d] : 1;
    p.step = x->ndim ? x->stride[d] : 0;
    p.no = sc_coalesce(d, x->shape, x->stride, p.osz, p.ost);
    p.ni = x->ndim ? sc_coalesce(x->ndim - d - 1, x->shape + d + 1, x->stride + d + 1, p.isz, p.ist) : 0;
    p.inner = ke_numel(p.ni, p.isz);
    int64_t lines = numel / (p.len * p.inner);
    if (p.inner == 1) {
        int64_t grain = SC_GRAIN / p.len;
        ke_parallel_for(lines, grain > 0 ? grain : 1, sc_lines, &p);
    } else {
        p.ntiles = (p.inner + SC_TILE - 1) / SC_TILE;
        int64_t per = p.len * (p.inner < SC_TILE ? p.inner : SC_TILE), grain = SC_GRAIN / per;
        ke_parallel_for(lines * p.ntiles, grain > 0 ? grain : 1, sc_tiles, &p);
    }
    return 0;
}

static kl_tensor *sc_call(int op, kl_tensor *x, int dim) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    ke_attr_set_cumsum_dim(&c.a, dim);
    return ke_call1(&c);
}

kl_tensor *kl_cumsum(kl_tensor *x, int dim) { return sc_call(KE_OP_cumsum, x, dim); }
kl_tensor *kl_cumprod(kl_tensor *x, int dim) { return sc_call(KE_OP_cumprod, x, dim); }
