/*
 * index.c — indexing ops (rows in ops_index.def): index_select, gather,
 * scatter_add (out of place and in place), take_along_dim and embedding,
 * with their public wrappers.
 *
 * Shape rules check shapes and dtypes only (they also run on Meta tensors);
 * index values are checked by the CPU kernels, all of them before anything
 * is written, so a bad index is a KL_ERR_INDEX and never an out-of-bounds
 * access or a half-updated in-place tensor. As PyTorch's CPU kernels, these
 * ops take no negative indices. Data moves go through the row walker of
 * join.c, generic over element size; only scatter_add does arithmetic.
 */
#include "kernels_index.h"

#include "alloc.h"
#include "dtype_conv.h"
#include "index_add.h"

#include <math.h>
#include "threadpool.h"

/* Size and stride of dim d, with a 0-dim tensor seen as [1] (PyTorch's
 * ensure_nonempty_size: scalars index like 1-element vectors here). */
static int64_t size_ne(const kl_tensor *t, int d) { return t->ndim ? t->shape[d] : 1; }
static int64_t stride_ne(const kl_tensor *t, int d) { return t->ndim ? t->stride[d] : 0; }
static int ndim_ne(const kl_tensor *t) { return t->ndim ? t->ndim : 1; }

static int is_index_dtype(kl_dtype d, int int32_ok) { return d == KL_I64 || (int32_ok && d == KL_I32); }

static int bad_index_dtype(const char *op, const char *what, const kl_tensor *t, int int32_ok) {
    char b[256];
    return ke_err(KL_ERR_DTYPE, op, "%s must be int64%s, got %s", what, int32_ok ? " or int32" : "",
                  ke_fmt_tensor(b, sizeof b, t));
}

/* ---- index values ---------------------------------------------------------------- */

/* A contiguous int64 copy of an int32/int64 index tensor (its own data when
 * already contiguous int64); *owned is what index_free takes, or NULL. */
static const int64_t *index_values(const kl_tensor *index, int64_t **owned, const char *op) {
    *owned = NULL;
    if (index->dtype == KL_I64 && ke_is_contig(index)) return (const int64_t *)ke_data(index);
    int64_t n = ke_numel(index->ndim, index->shape), cs[KL_MAX_DIMS];
    int64_t *buf = ke_cpu_alloc((size_t)n * sizeof(int64_t));
    if (!buf) {
        ke_err(KL_ERR_OOM, op, "out of memory for %lld index values", (long long)n);
        return NULL;
    }
    ke_contiguous_strides(index->ndim, index->shape, cs);
    if (n) ke_copy_nd(index->ndim, index->shape, (char *)buf, KL_I64, cs, ke_data(index), (kl_dtype)index->dtype,
                      index->stride);
    *owned = buf;
    return buf;
}

static void index_free(int64_t *owned, int64_t n) {
    if (owned) ke_cpu_free(owned, (size_t)n * sizeof(int64_t));
}

/* 0 <= idx[i] < size, or KL_ERR_INDEX naming op, the first bad value, dim and size. */
static int index_check(const char *op, const int64_t *idx, int64_t n, int64_t size, int dim) {
    /* branch-free first pass (vectorizes); the slow search only on failure */
    unsigned bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)idx[i] >= (uint64_t)size;
    if (!bad) return 0;
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= size) return ke_index_range_error(op, idx[i], dim, size);
    return 0;
}

int ke_index_range_error(const char *op, int64_t v, int dim, int64_t size) {
    return ke_err(KL_ERR_INDEX, op, "index %lld is out of range for dim %d with size %lld%s", (long long)v, dim,
                  (long long)size, v < 0 && v >= -size ? " (negative indices are not accepted)" : "");
}

/* ---- the select kernel (index_select, embedding) --------------------------------------
 * out[..., j, ...] = x[..., idx[j], ...] along dim d; out contiguous. */

typedef struct select_job {
    char *o;
    const char *x;
    const int64_t *idx;
    int64_t es, xd, xl; /* element size, x's strides along d and along the last dim */
    int d, last;
} select_job;

static void select_row(void *ctx, const int64_t *coord, const int64_t *off, int64_t n) {
    const select_job *j = ctx;
    char *o = j->o + off[0] * j->es;
    const char *x = j->x + off[1] * j->es;
    const int64_t xd = j->xd, xl = j->xl;
    if (j->d == j->last) { /* the run walks the index itself */
        const int64_t *ix = j->idx + coord[j->d];
        KE_BY_SIZE(j->es, {
            T *restrict O = (T *)o;
            const T *restrict X = (const T *)x;
            for (int64_t i = 0; i < n; i++) O[i] = X[ix[i] * xd];
        });
        return;
    }
    x += j->idx[coord[j->d]] * xd * j->es;
    if (xl == 1) {
        memcpy(o, x, (size_t)(n * j->es));
        return;
    }
    KE_BY_SIZE(j->es, {
        T *restrict O = (T *)o;
        const T *restrict X = (const T *)x;
        for (int64_t i = 0; i < n; i++) O[i] = X[i * xl];
    });
}

/* x seen with shape (nd, xshape-with-d-replaced) = oshape and strides xstride. */
static void select_run(kl_tensor *o, const kl_tensor *x, int nd, const int64_t *oshape, const int64_t *xstride, int d,
                       const int64_t *idx) {
    ke_rows r = {.nd = nd, .nops = 2};
    ke_contiguous_strides(nd, oshape, r.stride[0]);
    for (int e = 0; e < nd; e++) {
        r.shape[e] = oshape[e];
        r.stride[1][e] = e == d ? 0 : xstride[e];
    }
    select_job j = {ke_data(o), ke_data(x), idx, (int64_t)ke_dtypes[x->dtype].size, xstride[d],
                    d == nd - 1 ? 0 : xstride[nd - 1], d, nd - 1};
    ke_rows_run(&r, KE_ROWS_GRAIN, select_row, &j);
}

/* ---- index_select ---------------------------------------------------------------------- */

int ke_infer_index_select(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *index = c->in[1];
    char b[256];
    if (!is_index_dtype((kl_dtype)index->dtype, 1)) return bad_index_dtype(op, "index", index, 1);
    if (index->ndim > 1)
        return ke_err(KL_ERR_SHAPE, op, "index must be a vector (1-D or 0-dim), got %s", ke_fmt_tensor(b, sizeof b, index));
    int d = ke_wrap_dim(op, ke_attr_index_select_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    if (x->ndim) out->shape[d] = ke_numel(index->ndim, index->shape);
    return 1;
}

int ke_cpu_index_select(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *index = c->in[1];
    kl_tensor *o = c->out[0];
    int d = ke_wrap_dim(op, ke_attr_index_select_dim(&c->a), x->ndim);
    int64_t n = ke_numel(index->ndim, index->shape), *owned;
    if (d < 0) return -1;
    const int64_t *idx = index_values(index, &owned, op);
    if (!idx) return -1;
    int rc = index_check(op, idx, n, size_ne(x, d), d);
    if (rc == 0 && ke_numel(o->ndim, o->shape) > 0) {
        if (x->ndim == 0) /* PyTorch keeps a 0-dim result: the one element */
            memcpy(ke_data(o), ke_data(x), ke_dtypes[x->dtype].size);
        else
            select_run(o, x, o->ndim, o->shape, x->stride, d, idx);
    }
    index_free(owned, n);
    return rc;
}

/* ---- embedding ------------------------------------------------------------------------- */

int ke_infer_embedding(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *w = c->in[0], *ind = c->in[1];
    char b[256];
    if (!is_index_dtype((kl_dtype)ind->dtype, 1)) return bad_index_dtype(op, "indices", ind, 1);
    if (w->ndim != 2)
        return ke_err(KL_ERR_SHAPE, op, "weight must be 2-D [num, dim], got %s", ke_fmt_tensor(b, sizeof b, w));
    if (ind->ndim >= KL_MAX_DIMS)
        return ke_err(KL_ERR_SHAPE, op, "indices %s have %d dims: the result would need more than %d",
                      ke_fmt_tensor(b, sizeof b, ind), ind->ndim, KL_MAX_DIMS);
    out->dtype = (kl_dtype)w->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = ind->ndim + 1;
    memcpy(out->shape, ind->shape, sizeof(int64_t) * ind->ndim);
    out->shape[ind->ndim] = w->shape[1];
    return 1;
}

/* index_select of rows: the output, whatever the indices' shape, is [n, dim]. */
int ke_cpu_embedding(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *w = c->in[0], *ind = c->in[1];
    kl_tensor *o = c->out[0];
    int64_t n = ke_numel(ind->ndim, ind->shape), *owned;
    const int64_t *idx = index_values(ind, &owned, op);
    if (!idx) return -1;
    int rc = index_check(op, idx, n, w->shape[0], 0);
    if (rc == 0) select_run(o, w, 2, (const int64_t[]){n, w->shape[1]}, w->stride, 0, idx);
    index_free(owned, n);
    return rc;
}

/* ---- gather ---------------------------------------------------------------------------- */

const char *ke_gather_name(const ke_call *c) {
    int64_t h = ke_attr_gather_caller(&c->a);
    return h > 0 && h <= KE_OP_COUNT ? ke_ops[h - 1].name : ke_opname(c);
}

int ke_infer_gather(ke_call *c, ke_outspec *out) {
    const char *op = ke_gather_name(c);
    const kl_tensor *x = c->in[0], *index = c->in[1];
    char b1[256], b2[256];
    if (index->dtype != KL_I64) return bad_index_dtype(op, "index", index, 0);
    int d = ke_wrap_dim(op, ke_attr_gather_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    if (ndim_ne(index) != ndim_ne(x))
        return ke_err(KL_ERR_SHAPE, op, "index %s must have as many dims as the input %s",
                      ke_fmt_tensor(b1, sizeof b1, index), ke_fmt_tensor(b2, sizeof b2, x));
    for (int e = 0; e < ndim_ne(x); e++)
        if (e != d && size_ne(index, e) > size_ne(x, e))
            return ke_err(KL_ERR_SHAPE, op, "index %s is larger than the input %s in dim %d (only dim %d may differ)",
                          ke_fmt_tensor(b1, sizeof b1, index), ke_fmt_tensor(b2, sizeof b2, x), e, d);
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = index->ndim;
    memcpy(out->shape, index->shape, sizeof(int64_t) * index->ndim);
    return 1;
}

typedef struct gather_job {
    char *o;
    const char *x;
    const int64_t *idx;
    int64_t es, xd, xl;
} gather_job;

/* out and the index values share one contiguous layout: one offset serves both. */
static void gather_row(void *ctx, const int64_t *coord, const int64_t *off, int64_t n) {
    (void)coord;
    const gather_job *j = ctx;
    const int64_t *ix = j->idx + off[0];
    const int64_t xd = j->xd, xl = j->xl;
    char *o = j->o + off[0] * j->es;
    const char *x = j->x + off[1] * j->es;
    KE_BY_SIZE(j->es, {
        T *restrict O = (T *)o;
        const T *restrict X = (const T *)x;
        for (int64_t i = 0; i < n; i++) O[i] = X[i * xl + ix[i] * xd];
    });
}

int ke_cpu_gather(ke_call *c) {
    const char *op = ke_gather_name(c);
    const kl_tensor *x = c->in[0], *index = c->in[1];
    kl_tensor *o = c->out[0];
    int d = ke_wrap_dim(op, ke_attr_gather_dim(&c->a), x->ndim);
    int64_t n = ke_numel(index->ndim, index->shape), *owned;
    if (d < 0) return -1;
    if (n == 0) return 0;
    const int64_t *idx = index_values(index, &owned, op);
    if (!idx) return -1;
    int rc = index_check(op, idx, n, size_ne(x, d), d);
    if (rc == 0) {
        int nd = ndim_ne(index), last = nd - 1;
        ke_rows r = {.nd = nd, .nops = 2};
        for (int e = 0; e < nd; e++) {
            r.shape[e] = size_ne(index, e);
            r.stride[1][e] = e == d ? 0 : stride_ne(x, e);
        }
        ke_contiguous_strides(nd, r.shape, r.stride[0]);
        gather_job j = {ke_data(o), ke_data(x), idx, (int64_t)ke_dtypes[x->dtype].size, stride_ne(x, d),
                        d == last ? 0 : stride_ne(x, last)};
        ke_rows_run(&r, KE_ROWS_GRAIN, gather_row, &j);
    }
    index_free(owned, n);
    return rc;
}

/* ---- scatter, scatter_add, scatter_reduce --------------------------------------------------- */

/* The three share one shape rule and one kernel; they differ in what an
 * element written to does with what it holds (ke_scatter_kind). */
enum { SC_ASSIGN, SC_SUM, SC_PROD, SC_MEAN, SC_AMAX, SC_AMIN };

static int scatter_dim_attr(const ke_call *c) {
    switch (c->op) {
    case KE_OP_scatter: return (int)ke_attr_scatter_dim(&c->a);
    case KE_OP_scatter_reduce: return (int)ke_attr_scatter_reduce_dim(&c->a);
    default: return (int)ke_attr_scatter_add_dim(&c->a);
    }
}

/* scatter_reduce's kl_scatter_reduction as a kind (-1 if out of range). */
static int scatter_kind(const ke_call *c) {
    if (c->op == KE_OP_scatter) return SC_ASSIGN;
    if (c->op == KE_OP_scatter_add) return SC_SUM;
    switch (ke_attr_scatter_reduce_reduce(&c->a)) {
    case KL_SCATTER_SUM: return SC_SUM;
    case KL_SCATTER_PROD: return SC_PROD;
    case KL_SCATTER_MEAN: return SC_MEAN;
    case KL_SCATTER_AMAX: return SC_AMAX;
    case KL_SCATTER_AMIN: return SC_AMIN;
    default: return -1;
    }
}

static int infer_scatter(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *index = c->in[1], *src = c->in[2];
    char b1[256], b2[256], b3[256];
    int kind = scatter_kind(c);
    if (kind < 0)
        return ke_err(KL_ERR_ARG, op, "reduce %lld is not a kl_scatter_reduction (sum, prod, mean, amax, amin)",
                      (long long)ke_attr_scatter_reduce_reduce(&c->a));
    if (index->dtype != KL_I64) return bad_index_dtype(op, "index", index, 0);
    if (src->dtype != x->dtype)
        return ke_err(KL_ERR_DTYPE, op, "src %s must have the dtype of self %s", ke_fmt_tensor(b1, sizeof b1, src),
                      ke_fmt_tensor(b2, sizeof b2, x));
    if (kind == SC_MEAN && x->dtype == KL_BOOL)
        return ke_err(KL_ERR_DTYPE, op, "reduce mean needs a numeric self, got %s", ke_fmt_tensor(b1, sizeof b1, x));
    int d = ke_wrap_dim(op, scatter_dim_attr(c), x->ndim);
    if (d < 0) return -1;
    /* PyTorch skips the shape checks for an empty index */
    if (ke_numel(index->ndim, index->shape) > 0) {
        ke_fmt_tensor(b1, sizeof b1, index);
        ke_fmt_tensor(b2, sizeof b2, x);
        ke_fmt_tensor(b3, sizeof b3, src);
        if (ndim_ne(index) != ndim_ne(x) || ndim_ne(index) != ndim_ne(src))
            return ke_err(KL_ERR_SHAPE, op, "index %s must have as many dims as self %s and src %s", b1, b2, b3);
        for (int e = 0; e < ndim_ne(x); e++)
            if (size_ne(index, e) > size_ne(src, e) || (e != d && size_ne(index, e) > size_ne(x, e)))
                return ke_err(KL_ERR_SHAPE, op,
                              "index %s is larger in dim %d than src %s or, outside dim %d, than self %s", b1, e, b3, d,
                              b2);
    }
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}
int ke_infer_scatter_add(ke_call *c, ke_outspec *out) { return infer_scatter(c, out); }
int ke_infer_scatter(ke_call *c, ke_outspec *out) { return infer_scatter(c, out); }
int ke_infer_scatter_reduce(ke_call *c, ke_outspec *out) { return infer_scatter(c, out); }

/* One update per kind and dtype, generated: values are loaded into the
 * compute type C (f16/bf16 in f32, rounded back after every update as
 * PyTorch's Half +=), integers wrap, bool adds as OR and multiplies as AND.
 * amax/amin propagate NaN. A run of n updates: element k goes to
 * O[ix[k*is] * os + k*ol] from S[k*ss]; mean's division (by a count of
 * updates, floor division for integers) is div over n contiguous elements. */
typedef void (*scatter_fn)(char *o, int64_t os, int64_t ol, const int64_t *ix, int64_t is, const char *s, int64_t ss,
                           int64_t n);
typedef void (*scatter_div_fn)(char *o, const double *cnt, int64_t n);
#define KE_SC_ONE(name, T, C, LD, ST, UPD)                                                                    \
    static void name(char *o, int64_t os, int64_t ol, const int64_t *ix, int64_t is, const char *s, int64_t ss, \
                     int64_t n) {                                                                             \
        T *O = (T *)o;                                                                                        \
        const T *S = (const T *)s;                                                                            \
        for (int64_t k = 0; k < n; k++) {                                                                     \
            T *p = O + ix[k * is] * os + k * ol;                                                              \
            C a = LD(*p), b = LD(S[k * ss]);                                                                  \
            (void)a;                                                                                          \
            *p = ST(UPD);                                                                                     \
        }                                                                                                     \
    }
/* the five updates and the division of one dtype D (index_add.h's
 * KE_SC_*_D, which the CUDA program pastes too): sfx names them */
#define KE_SC_DTYPE(sfx, T, D)                                                                               \
    KE_SC_ONE(sc_assign_##sfx, T, KE_SC_C_##D, KE_SC_LD_##D, KE_SC_ST_##D, b)                                  \
    KE_SC_ONE(sc_sum_##sfx, T, KE_SC_C_##D, KE_SC_LD_##D, KE_SC_ST_##D, KE_SC_ADD_##D(a, b))                   \
    KE_SC_ONE(sc_prod_##sfx, T, KE_SC_C_##D, KE_SC_LD_##D, KE_SC_ST_##D, KE_SC_MUL_##D(a, b))                  \
    KE_SC_ONE(sc_amax_##sfx, T, KE_SC_C_##D, KE_SC_LD_##D, KE_SC_ST_##D, KE_SC_MAX(a, b))                      \
    KE_SC_ONE(sc_amin_##sfx, T, KE_SC_C_##D, KE_SC_LD_##D, KE_SC_ST_##D, KE_SC_MIN(a, b))                      \
    static void sc_div_##sfx(char *o, const double *cnt, int64_t n) {                                        \
        T *O = (T *)o;                                                                                       \
        for (int64_t k = 0; k < n; k++) {                                                                    \
            KE_SC_C_##D a = KE_SC_LD_##D(O[k]);                                                              \
            O[k] = KE_SC_ST_##D((KE_SC_C_##D)KE_SC_DIV_##D(a, cnt[k]));                                      \
        }                                                                                                    \
    }
KE_SC_DTYPE(f32, float, F32)
KE_SC_DTYPE(f64, double, F64)
KE_SC_DTYPE(f16, uint16_t, F16)
KE_SC_DTYPE(bf16, uint16_t, BF16)
KE_SC_DTYPE(i32, int32_t, I32)
KE_SC_DTYPE(i64, int64_t, I64)
KE_SC_DTYPE(u8, uint8_t, U8)
KE_SC_DTYPE(bool, uint8_t, BOOL) /* mean refused */
#define KE_SC_ROW(k)                                                                                          \
    {[KL_F32] = sc_##k##_f32, [KL_F64] = sc_##k##_f64, [KL_F16] = sc_##k##_f16, [KL_BF16] = sc_##k##_bf16,      \
     [KL_I32] = sc_##k##_i32, [KL_I64] = sc_##k##_i64, [KL_U8] = sc_##k##_u8,   [KL_BOOL] = sc_##k##_bool}
/* mean accumulates as sum */
static const scatter_fn scatter_fns[SC_AMIN + 1][KL_NUM_DTYPES] = {
    [SC_ASSIGN] = KE_SC_ROW(assign), [SC_SUM] = KE_SC_ROW(sum),   [SC_PROD] = KE_SC_ROW(prod),
    [SC_MEAN] = KE_SC_ROW(sum),      [SC_AMAX] = KE_SC_ROW(amax), [SC_AMIN] = KE_SC_ROW(amin),
};
static const scatter_div_fn scatter_div_fns[KL_NUM_DTYPES] = KE_SC_ROW(div);
_Static_assert(KL_NUM_DTYPES == 8, "scatter_fns covers every dtype");

/* The value an element reduced without itself (include_self false) starts
 * from: the identity of the reduction (PyTorch's, lowest/highest for
 * integer amax/amin), written as one element of dt into buf. */
static void scatter_identity(int kind, kl_dtype dt, char *buf) {
    double v = kind == SC_PROD ? 1 : kind == SC_AMAX ? -INFINITY : kind == SC_AMIN ? INFINITY : 0;
    if (!isinf(v) || ke_is_float(dt)) {
        const int64_t one = 1;
        ke_copy_nd(1, &one, buf, dt, &one, (const char *)&v, KL_F64, &one);
        return;
    }
    int lo = v < 0;
    switch (dt) {
    case KL_I32: *(int32_t *)buf = lo ? INT32_MIN : INT32_MAX; break;
    case KL_I64: *(int64_t *)buf = lo ? INT64_MIN : INT64_MAX; break;
    default: *(uint8_t *)buf = lo ? 0 : (dt == KL_BOOL ? 1 : UINT8_MAX); break; /* u8, bool */
    }
}
void ke_scatter_identity(int reduce, kl_dtype dt, char *buf) {
    ke_call c = {.op = KE_OP_scatter_reduce};
    ke_attr_set_scatter_reduce_reduce(&c.a, reduce);
    scatter_identity(scatter_kind(&c), dt, buf);
}

/* The index space is split as [outer dims] x dim d x [run dim]: the run dim
 * is the last dim, or none when d is the last (then runs go along d). A
 * work item is one outer position and one block of the run dim, and does
 * every k along d for it, in order. Items never share an output element,
 * so the updates each element receives come from one thread in index order
 * whatever the thread count or block size: deterministic (scatter's last
 * write wins, as PyTorch's CPU kernel). Walking blocks of the last dim for
 * each k keeps rows of src and index streaming when d is a leading dim
 * (the common scatter over dim 0). */
typedef struct scatter_job {
    scatter_fn fn;
    char *o;
    const int64_t *idx;
    const char *s;
    int64_t es;
    int nd; /* outer dims */
    int64_t shape[KL_MAX_DIMS], st[3][KL_MAX_DIMS]; /* outer sizes; strides of out, index values, src */
    int64_t L, dst[3];                              /* size along d; strides along d */
    int64_t J, jst[3], B, nblk;                     /* run dim size (1 if none), strides, block, blocks */
} scatter_job;

static void scatter_range(void *ctx, int64_t begin, int64_t end) {
    const scatter_job *j = ctx;
    for (int64_t w = begin; w < end; w++) {
        int64_t pos = w / j->nblk, j0 = w % j->nblk * j->B, off[3] = {0, 0, 0};
        for (int e = j->nd - 1; e >= 0; e--) {
            int64_t cd = pos % j->shape[e];
            pos /= j->shape[e];
            for (int k = 0; k < 3; k++) off[k] += cd * j->st[k][e];
        }
        if (j->J == 1) { /* one run along d */
            j->fn(j->o + off[0] * j->es, j->dst[0], 0, j->idx + off[1], j->dst[1], j->s + off[2] * j->es, j->dst[2],
                  j->L);
            continue;
        }
        int64_t n = j->J - j0 < j->B ? j->J - j0 : j->B;
        for (int k = 0; k < 3; k++) off[k] += j0 * j->jst[k];
        for (int64_t k = 0; k < j->L; k++)
            j->fn(j->o + off[0] * j->es, j->dst[0], j->jst[0], j->idx + off[1] + k * j->dst[1], j->jst[1],
                  j->s + (off[2] + k * j->dst[2]) * j->es, j->jst[2], n);
    }
}

static void scatter_run(scatter_job *j, int64_t outer) {
    int64_t per_item = j->L * (j->J < j->B ? j->J : j->B), grain = KE_ROWS_GRAIN / per_item;
    ke_parallel_for(outer * j->nblk, grain > 0 ? grain : 1, scatter_range, j);
}

/* mean: each element of o divided by 1 (include_self) or 0 plus the number
 * of index entries naming it, a count of 0 taken as 1 (PyTorch's). o is
 * contiguous (a new result). */
static int scatter_mean_divide(const char *op, kl_tensor *o, const scatter_job *j, int include_self) {
    int64_t no = ke_numel(o->ndim, o->shape);
    double *cnt = ke_cpu_alloc((size_t)no * sizeof(double));
    if (!cnt) return ke_err(KL_ERR_OOM, op, "out of memory for %lld counts", (long long)no);
    for (int64_t i = 0; i < no; i++) cnt[i] = include_self;
    int64_t outer = 1, coord[KL_MAX_DIMS] = {0};
    for (int e = 0; e < j->nd; e++) outer *= j->shape[e];
    for (int64_t w = 0; w < outer; w++) {
        int64_t oo = 0, io = 0;
        for (int e = 0; e < j->nd; e++) oo += coord[e] * j->st[0][e], io += coord[e] * j->st[1][e];
        for (int64_t k = 0; k < j->L; k++)
            for (int64_t r = 0; r < j->J; r++)
                cnt[oo + j->idx[io + k * j->dst[1] + r * j->jst[1]] * j->dst[0] + r * j->jst[0]] += 1;
        for (int e = j->nd - 1; e >= 0 && ++coord[e] == j->shape[e]; e--) coord[e] = 0;
    }
    for (int64_t i = 0; i < no; i++)
        if (cnt[i] == 0) cnt[i] = 1;
    scatter_div_fns[o->dtype](ke_data(o), cnt, no);
    ke_cpu_free(cnt, (size_t)no * sizeof(double));
    return 0;
}

static int cpu_scatter(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *x = c->in[0], *index = c->in[1], *src = c->in[2];
    kl_tensor *o = c->out[0];
    int d = ke_wrap_dim(op, scatter_dim_attr(c), x->ndim), kind = scatter_kind(c);
    int include_self = c->op != KE_OP_scatter_reduce || ke_attr_scatter_reduce_include_self(&c->a);
    if (d < 0 || kind < 0) return -1;
    int64_t n = ke_numel(index->ndim, index->shape), *owned = NULL;
    const int64_t *idx = NULL;
    /* every index is checked before anything is written (in place included) */
    if (n > 0) {
        if (!(idx = index_values(index, &owned, op))) return -1;
        if (index_check(op, idx, n, size_ne(o, d), d)) {
            index_free(owned, n);
            return -1;
        }
    }
    if (!c->inplace && ke_numel(x->ndim, x->shape) > 0)
        ke_copy_nd(x->ndim, x->shape, ke_data(o), (kl_dtype)o->dtype, o->stride, ke_data(x), (kl_dtype)x->dtype,
                   x->stride);
    int rc = 0;
    if (n > 0) {
        int nd = ndim_ne(index), last = nd - 1;
        int64_t shape[KL_MAX_DIMS], cs[KL_MAX_DIMS];
        for (int e = 0; e < nd; e++) shape[e] = size_ne(index, e);
        ke_contiguous_strides(nd, shape, cs);
        scatter_job j = {.fn = scatter_fns[kind][o->dtype], .o = ke_data(o), .idx = idx, .s = ke_data(src),
                         .es = (int64_t)ke_dtypes[o->dtype].size, .L = shape[d], .J = 1};
        const kl_tensor *ops[3] = {o, NULL, src};
        for (int e = 0; e < nd; e++) {
            int64_t st[3];
            for (int k = 0; k < 3; k++) st[k] = k == 1 ? cs[e] : stride_ne(ops[k], e);
            if (e == d) {
                memcpy(j.dst, st, sizeof st);
            } else if (e == last) {
                j.J = shape[e];
                memcpy(j.jst, st, sizeof st);
            } else {
                j.shape[j.nd] = shape[e];
                for (int k = 0; k < 3; k++) j.st[k][j.nd] = st[k];
                j.nd++;
            }
        }
        /* blocks small enough to feed every thread, big enough to amortize a call */
        int64_t outer = n / (j.L * j.J), want = 4 * (int64_t)kl_get_num_threads();
        j.B = j.J / (want > outer ? (want + outer - 1) / outer : 1);
        j.B = j.B < 16 ? 16 : j.B > 1024 ? 1024 : j.B;
        j.nblk = j.J == 1 ? 1 : (j.J + j.B - 1) / j.B;
        if (!include_self) { /* the elements index names start from the identity: a scatter of it */
            char id[8];
            scatter_identity(kind, (kl_dtype)o->dtype, id);
            scatter_job f = j;
            f.fn = scatter_fns[SC_ASSIGN][o->dtype];
            f.s = id;
            f.dst[2] = f.jst[2] = 0;
            for (int e = 0; e < f.nd; e++) f.st[2][e] = 0;
            scatter_run(&f, outer);
        }
        scatter_run(&j, outer);
        if (kind == SC_MEAN) rc = scatter_mean_divide(op, o, &j, include_self);
    }
    index_free(owned, n);
    return rc;
}
int ke_cpu_scatter_add(ke_call *c) { return cpu_scatter(c); }
int ke_cpu_scatter(ke_call *c) { return cpu_scatter(c); }
int ke_cpu_scatter_reduce(ke_call *c) { return cpu_scatter(c); }

/* ---- take_along_dim (decomposition) ------------------------------------------------------- */

static kl_tensor *gather_as(int op, kl_tensor *x, int dim, kl_tensor *index) {
    kl_tensor *in[2] = {x, index};
    ke_call g = {.op = KE_OP_gather, .nin = 2, .in = in};
    ke_attr_set_gather_dim(&g.a, dim);
    ke_attr_set_gather_caller(&g.a, op + 1);
    return ke_call1(&g);
}

/* t viewed as 1-D (0-dim tensors through unsqueeze, which needs no strides). */
static kl_tensor *flat(kl_tensor *t) {
    return t->ndim == 0 ? kl_unsqueeze(t, 0) : kl_reshape(t, 1, (const int64_t[]){-1});
}

/* As torch: x and index broadcast against each other outside dim (each
 * keeping its own size along dim), then gather. */
int ke_decomp_take_along_dim(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *x = c->in[0], *index = c->in[1];
    char b1[256], b2[256];
    if (index->dtype != KL_I64) return bad_index_dtype(op, "indices", index, 0);
    kl_tensor *y = NULL;
    if (ke_attr_take_along_dim_dim(&c->a) == KL_DIM_NONE) {
        kl_scope_begin();
        y = gather_as(c->op, flat(x), 0, flat(index));
        kl_keep(y);
        kl_scope_end();
    } else {
        if (x->ndim != index->ndim)
            return ke_err(KL_ERR_SHAPE, op, "x %s and indices %s must have the same number of dims",
                          ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, index));
        if (x->ndim == 0)
            return ke_err(KL_ERR_INDEX, op, "dim %lld given for 0-dim tensors (KL_DIM_NONE takes them flattened)",
                          (long long)ke_attr_take_along_dim_dim(&c->a));
        int d = ke_wrap_dim(op, ke_attr_take_along_dim_dim(&c->a), x->ndim);
        if (d < 0) return -1;
        int64_t xs[KL_MAX_DIMS], is[KL_MAX_DIMS];
        for (int e = 0; e < x->ndim; e++) {
            int64_t a = x->shape[e], b = index->shape[e];
            if (e == d) {
                xs[e] = a, is[e] = b;
            } else if (a == b || a == 1 || b == 1) {
                xs[e] = is[e] = a == 1 ? b : a;
            } else {
                return ke_err(KL_ERR_SHAPE, op, "x %s and indices %s cannot broadcast outside dim %d (dim %d: %lld vs %lld)",
                              ke_fmt_tensor(b1, sizeof b1, x), ke_fmt_tensor(b2, sizeof b2, index), d, e, (long long)a,
                              (long long)b);
            }
        }
        kl_scope_begin();
        y = gather_as(c->op, kl_expand(x, x->ndim, xs), d, kl_expand(index, x->ndim, is));
        kl_keep(y);
        kl_scope_end();
    }
    return ke_set_out1(c, y);
}

/* ---- public wrappers ------------------------------------------------------------------------ */

static kl_tensor *index_call(int op, int nin, kl_tensor *a, kl_tensor *b, kl_tensor *s, int64_t dim, int inplace) {
    kl_tensor *in[3] = {a, b, s};
    ke_call c = {.op = op, .inplace = (uint8_t)inplace, .nin = nin, .in = in};
    switch (op) {
    case KE_OP_index_select: ke_attr_set_index_select_dim(&c.a, dim); break;
    case KE_OP_gather: ke_attr_set_gather_dim(&c.a, dim); break;
    case KE_OP_scatter_add: ke_attr_set_scatter_add_dim(&c.a, dim); break;
    case KE_OP_scatter: ke_attr_set_scatter_dim(&c.a, dim); break;
    case KE_OP_take_along_dim: ke_attr_set_take_along_dim_dim(&c.a, dim); break;
    default: break; /* embedding: no attributes */
    }
    return ke_call1(&c);
}

kl_tensor *kl_index_select(kl_tensor *x, int dim, kl_tensor *index) {
    return index_call(KE_OP_index_select, 2, x, index, NULL, dim, 0);
}
kl_tensor *kl_gather(kl_tensor *x, int dim, kl_tensor *index) { return index_call(KE_OP_gather, 2, x, index, NULL, dim, 0); }
kl_tensor *kl_scatter_add(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src) {
    return index_call(KE_OP_scatter_add, 3, x, index, src, dim, 0);
}
kl_tensor *kl_scatter_add_inplace(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src) {
    return index_call(KE_OP_scatter_add, 3, x, index, src, dim, 1);
}
kl_tensor *kl_scatter(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src) {
    return index_call(KE_OP_scatter, 3, x, index, src, dim, 0);
}
/* The value as a 0-dim tensor of x's dtype and device expanded over index:
 * one op row serves both forms. */
kl_tensor *kl_scatter_value(kl_tensor *x, int dim, kl_tensor *index, double value) {
    if (ke_check_tensor(x, "scatter", 1) || ke_check_tensor(index, "scatter", 2)) return NULL;
    kl_scope_begin();
    kl_tensor *v = kl_to_device(kl_scalar_tensor(value, (kl_dtype)x->dtype), kl_device_of(x));
    kl_tensor *y = kl_scatter(x, dim, index, v ? kl_expand(v, index->ndim, index->shape) : NULL);
    kl_keep(y);
    kl_scope_end();
    return y;
}
kl_tensor *kl_scatter_reduce(kl_tensor *x, int dim, kl_tensor *index, kl_tensor *src, kl_scatter_reduction reduce,
                             bool include_self) {
    kl_tensor *in[3] = {x, index, src};
    ke_call c = {.op = KE_OP_scatter_reduce, .nin = 3, .in = in};
    ke_attr_set_scatter_reduce_dim(&c.a, dim);
    ke_attr_set_scatter_reduce_reduce(&c.a, (int64_t)reduce);
    ke_attr_set_scatter_reduce_include_self(&c.a, include_self);
    return ke_call1(&c);
}
kl_tensor *kl_take_along_dim(kl_tensor *x, kl_tensor *index, int dim) {
    return index_call(KE_OP_take_along_dim, 2, x, index, NULL, dim, 0);
}
kl_tensor *kl_embedding(kl_tensor *weight, kl_tensor *indices) {
    return index_call(KE_OP_embedding, 2, weight, indices, NULL, 0, 0);
}
