/*
 * sort.c — sort, topk and argsort (rows in ops_index.def), with their public
 * wrappers.
 *
 * Both kernels sort every row along dim stably (ties keep their input order,
 * whatever `stable` says: results are deterministic), with NaN after every
 * number as PyTorch orders it; topk keeps the first k of the row sorted
 * descending (largest) or ascending. So topk's values are always PyTorch's,
 * and among equal values its indices come in ascending order (PyTorch's CPU
 * topk leaves that order unspecified). The merge sort is one template per
 * dtype (tmpl/sort_rows.h); rows are split over the pool.
 */
#include "alloc.h"
#include "optable.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SORT_GRAIN 16384 /* elements per pool task */

/* A row's elements: x at stride xs, out (values v, indices ix) at stride os. */
typedef struct sort_job {
    const char *x;
    char *v;
    int64_t *ix;
    int64_t n, k, xs, os; /* row length, kept elements, strides along dim */
    int nd, d, desc;
    int64_t shape[KL_MAX_DIMS], xstride[KL_MAX_DIMS], ostride[KL_MAX_DIMS];
    atomic_int oom;
} sort_job;

/* Element offsets of row r in x and in the (contiguous) outputs. */
static void sort_row_offsets(const sort_job *j, int64_t r, int64_t *xo, int64_t *oo) {
    int64_t a = 0, b = 0;
    for (int e = j->nd - 1; e >= 0; e--) {
        if (e == j->d) continue;
        int64_t c = r % j->shape[e];
        r /= j->shape[e];
        a += c * j->xstride[e];
        b += c * j->ostride[e];
    }
    *xo = a;
    *oo = b;
}

#define SO_NONAN(k) 0
#define SO_ID(v) (v)
#define SO_T float
#define SO_K float
#define SO_KEY SO_ID
#define SO_ISNAN isnan
#define SO_SFX f32
#include "tmpl/sort_rows.h"
#define SO_T double
#define SO_K double
#define SO_KEY SO_ID
#define SO_ISNAN isnan
#define SO_SFX f64
#include "tmpl/sort_rows.h"
#define SO_T uint16_t
#define SO_K float
#define SO_KEY ke_f16_to_f32
#define SO_ISNAN isnan
#define SO_SFX f16
#include "tmpl/sort_rows.h"
#define SO_T uint16_t
#define SO_K float
#define SO_KEY ke_bf16_to_f32
#define SO_ISNAN isnan
#define SO_SFX bf16
#include "tmpl/sort_rows.h"
#define SO_T int32_t
#define SO_K int32_t
#define SO_KEY SO_ID
#define SO_ISNAN SO_NONAN
#define SO_SFX i32
#include "tmpl/sort_rows.h"
#define SO_T int64_t
#define SO_K int64_t
#define SO_KEY SO_ID
#define SO_ISNAN SO_NONAN
#define SO_SFX i64
#include "tmpl/sort_rows.h"
#define SO_T uint8_t
#define SO_K uint8_t
#define SO_KEY SO_ID
#define SO_ISNAN SO_NONAN
#define SO_SFX u8
#include "tmpl/sort_rows.h"

/* bool is stored as 0/1 bytes: it sorts as uint8 */
static const ke_range_fn sort_fns[KL_NUM_DTYPES] = {
    [KL_F32] = sort_rows_f32, [KL_F64] = sort_rows_f64, [KL_F16] = sort_rows_f16, [KL_BF16] = sort_rows_bf16,
    [KL_I32] = sort_rows_i32, [KL_I64] = sort_rows_i64, [KL_U8] = sort_rows_u8,   [KL_BOOL] = sort_rows_u8,
};
_Static_assert(KL_NUM_DTYPES == 8, "sort_fns covers every dtype");

/* ---- shape rules ------------------------------------------------------------------------- */

/* values (x's dtype) and int64 indices of x's shape with dim d of size k. */
static int sort_specs(ke_call *c, ke_outspec *out, int d, int64_t k) {
    const kl_tensor *x = c->in[0];
    for (int o = 0; o < 2; o++) {
        out[o].dtype = o ? KL_I64 : (kl_dtype)x->dtype;
        out[o].ndim = x->ndim;
        memcpy(out[o].shape, x->shape, sizeof(int64_t) * x->ndim);
        if (x->ndim) out[o].shape[d] = k;
    }
    c->compute = ke_compute_dtype((kl_dtype)x->dtype);
    return 2;
}

int ke_infer_sort(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    int d = ke_wrap_dim(ke_opname(c), ke_attr_sort_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    return sort_specs(c, out, d, x->ndim ? x->shape[d] : 1);
}

int ke_infer_topk(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    int d = ke_wrap_dim(ke_opname(c), ke_attr_topk_dim(&c->a), x->ndim);
    if (d < 0) return -1;
    int64_t k = ke_attr_topk_k(&c->a), n = x->ndim ? x->shape[d] : 1;
    if (k < 0 || k > n) {
        char b[256];
        return ke_err(KL_ERR_ARG, ke_opname(c), "k = %lld is out of range for dim %d of size %lld of %s", (long long)k,
                      d, (long long)n, ke_fmt_tensor(b, sizeof b, x));
    }
    return sort_specs(c, out, d, k);
}

/* ---- kernels ----------------------------------------------------------------------------- */

static int sort_run(ke_call *c, int d, int64_t k, int desc) {
    const kl_tensor *x = c->in[0];
    kl_tensor *v = c->out[0], *ix = c->out[1];
    int64_t n = x->ndim ? x->shape[d] : 1, total = ke_numel(x->ndim, x->shape);
    if (total == 0 || k == 0) return 0;
    sort_job j = {.x = ke_data(x), .v = ke_data(v), .ix = (int64_t *)ke_data(ix), .n = n, .k = k,
                  .nd = x->ndim, .d = d, .desc = desc};
    if (x->ndim) {
        j.xs = x->stride[d];
        memcpy(j.shape, x->shape, sizeof(int64_t) * x->ndim);
        memcpy(j.xstride, x->stride, sizeof(int64_t) * x->ndim);
        ke_contiguous_strides(v->ndim, v->shape, j.ostride);
        j.os = j.ostride[d];
    }
    atomic_init(&j.oom, 0);
    int64_t rows = total / n, grain = SORT_GRAIN / n;
    ke_parallel_for(rows, grain > 0 ? grain : 1, sort_fns[x->dtype], &j);
    if (atomic_load(&j.oom))
        return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for a sort buffer of %lld elements", (long long)n);
    return 0;
}

int ke_cpu_sort(ke_call *c) {
    int d = ke_wrap_dim(ke_opname(c), ke_attr_sort_dim(&c->a), c->in[0]->ndim);
    if (d < 0) return -1;
    int64_t n = c->in[0]->ndim ? c->in[0]->shape[d] : 1;
    return sort_run(c, d, n, (int)ke_attr_sort_descending(&c->a));
}

/* sorted = false leaves the order to the implementation: Kiln's is sorted. */
int ke_cpu_topk(ke_call *c) {
    int d = ke_wrap_dim(ke_opname(c), ke_attr_topk_dim(&c->a), c->in[0]->ndim);
    if (d < 0) return -1;
    return sort_run(c, d, ke_attr_topk_k(&c->a), (int)ke_attr_topk_largest(&c->a));
}

/* ---- argsort (decomposition) ------------------------------------------------------------- */

static int sort_call(kl_tensor *x, int dim, bool descending, kl_tensor **values, kl_tensor **indices) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_sort, .nin = 1, .in = in};
    ke_attr_set_sort_dim(&c.a, dim);
    ke_attr_set_sort_descending(&c.a, descending);
    if (ke_dispatch(&c)) return -1;
    *values = c.out[0];
    *indices = c.out[1];
    return 0;
}

int ke_decomp_argsort(ke_call *c) {
    kl_tensor *v, *i;
    if (sort_call(c->in[0], (int)ke_attr_argsort_dim(&c->a), ke_attr_argsort_descending(&c->a), &v, &i)) return -1;
    kl_release(v);
    return ke_set_out1(c, i);
}

/* ---- public wrappers --------------------------------------------------------------------- */

static int pair_out(const char *op, kl_tensor **values, kl_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!values || !indices) return ke_err(KL_ERR_NULL_ARG, op, "values and indices must not be NULL");
    return 0;
}

int kl_sort(kl_tensor *x, int dim, bool descending, bool stable, kl_tensor **values, kl_tensor **indices) {
    (void)stable; /* every sort is stable */
    if (pair_out("sort", values, indices)) return -1;
    return sort_call(x, dim, descending, values, indices);
}

kl_tensor *kl_argsort(kl_tensor *x, int dim, bool descending, bool stable) {
    (void)stable;
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_argsort, .nin = 1, .in = in};
    ke_attr_set_argsort_dim(&c.a, dim);
    ke_attr_set_argsort_descending(&c.a, descending);
    return ke_call1(&c);
}

int kl_topk(kl_tensor *x, int64_t k, int dim, bool largest, bool sorted, kl_tensor **values, kl_tensor **indices) {
    if (pair_out("topk", values, indices)) return -1;
    kl_tensor *in[1] = {x};
    ke_call c = {.op = KE_OP_topk, .nin = 1, .in = in};
    ke_attr_set_topk_k(&c.a, k);
    ke_attr_set_topk_dim(&c.a, dim);
    ke_attr_set_topk_largest(&c.a, largest);
    ke_attr_set_topk_sorted(&c.a, sorted);
    if (ke_dispatch(&c)) return -1;
    *values = c.out[0];
    *indices = c.out[1];
    return 0;
}
