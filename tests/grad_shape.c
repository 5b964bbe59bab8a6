/*
 * grad_shape.c — gradchecks of the shape family (ops_view.def,
 * ops_reduce.def, ops_index.def): views,
 * reductions and scans, joining and indexing (plus clone, to_dtype and copy,
 * whose rows are the ew family's). Every op runs over several shapes and the
 * three input layouts of kt_input; reductions over one, several and all
 * dims, negative dims, keepdim both ways. Conventions at kinks and zeros (ties of amax,
 * max_dim's index, prod and cumprod with zeros, norm at zero) are checked
 * against values from PyTorch 1.13.
 */
#include "grad_harness.h"

#include "autograd.h"

static const enum kt_layout kt_layouts[] = {KT_CONTIG, KT_TRANSPOSED, KT_STRIDED};
#define NLAYOUTS 3

/* Gradcheck (second: and gradgradcheck) of fn on one kt_input in a scope of its own. */
static void check1_(kl_grad_fn fn, void *user, int nd, const int64_t *shape, enum kt_layout layout, double lo,
                    double hi, int second, const char *what, int line) {
    kl_scope_begin();
    kl_tensor *x = kt_input(nd, shape, layout, lo, hi);
    kt_gradcheck_(fn, user, 1, &x, second, what, __FILE__, line);
    kl_scope_end();
}
#define CHECK1(fn, user, nd, shape, layout, second) \
    check1_((fn), (user), (nd), (shape), (layout), -1, 1, (second), #fn, __LINE__)
#define CHECK1R(fn, user, nd, shape, layout, lo, hi, second) \
    check1_((fn), (user), (nd), (shape), (layout), (lo), (hi), (second), #fn, __LINE__)

/* An f64 leaf holding vals, requiring grad. */
static kl_tensor *leaf(int nd, const int64_t *shape, const double *vals) {
    kl_tensor *t = kl_from_data(vals, nd, shape, KL_F64);
    assert_non_null(t);
    assert_int_equal(kl_set_requires_grad(t, true), 0);
    return t;
}
#define LEAF(nd, shape, ...) leaf((nd), (shape), (const double[]){__VA_ARGS__})
#define F64(nd, shape, ...) kl_from_data((const double[]){__VA_ARGS__}, (nd), (shape), KL_F64)

/* d(y . gout)/dx (gout NULL: ones for a one-element y). */
static kl_tensor *grad_of(kl_tensor *y, kl_tensor *gout, kl_tensor *x) {
    kl_tensor *g = NULL;
    kl_backward_options o = kl_backward_options_default();
    o.allow_unused = true;
    int rc = kl_autograd_grad(1, &y, gout ? &gout : NULL, 1, &x, &g, &o);
    if (rc != 0) print_error("kl_autograd_grad failed: %s\n", kl_last_error());
    assert_int_equal(rc, 0);
    return g;
}

/* ---- views ------------------------------------------------------------------------------ */

typedef struct shape_arg {
    int n;
    int64_t v[KL_MAX_DIMS];
} shape_arg;

static kl_tensor *f_view(void *u, int n, kl_tensor *const *in) {
    (void)n;
    shape_arg *a = u;
    return kl_view(in[0], a->n, a->v);
}
static kl_tensor *f_reshape(void *u, int n, kl_tensor *const *in) {
    (void)n;
    shape_arg *a = u;
    return kl_reshape(in[0], a->n, a->v);
}
static kl_tensor *f_permute(void *u, int n, kl_tensor *const *in) {
    (void)n;
    shape_arg *a = u;
    return kl_permute(in[0], a->n, a->v);
}
static kl_tensor *f_expand(void *u, int n, kl_tensor *const *in) {
    (void)n;
    shape_arg *a = u;
    return kl_expand(in[0], a->n, a->v);
}

static void grad_view_reshape(void **state) {
    (void)state;
    kl_manual_seed(1);
    int64_t s[] = {2, 3, 4};
    shape_arg v1 = {2, {6, 4}}, v2 = {1, {24}}, v3 = {3, {4, -1, 2}}, v4 = {4, {1, 2, 12, 1}};
    CHECK1(f_view, &v1, 3, s, KT_CONTIG, 0);
    CHECK1(f_view, &v2, 3, s, KT_CONTIG, 0);
    CHECK1(f_view, &v3, 3, s, KT_CONTIG, 0);
    CHECK1(f_view, &v4, 3, s, KT_CONTIG, 1);
    /* strided inputs: reshape copies, then views */
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_reshape, &v1, 3, s, kt_layouts[l], 0);
        CHECK1(f_reshape, &v3, 3, s, kt_layouts[l], 0);
    }
    shape_arg v0 = {0, {0}}, v11 = {2, {1, 1}};
    CHECK1(f_view, &v0, 2, ((int64_t[]){1, 1}), KT_CONTIG, 0); /* to 0-dim */
    CHECK1(f_view, &v11, 0, NULL, KT_CONTIG, 0);             /* from 0-dim */
}

static void grad_permute_transpose(void **state) {
    (void)state;
    kl_manual_seed(2);
    int64_t s[] = {2, 3, 4};
    shape_arg p1 = {3, {2, 0, 1}}, p2 = {3, {-1, -3, 1}}, p3 = {3, {0, 1, 2}};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_permute, &p1, 3, s, kt_layouts[l], l == 0);
        CHECK1(f_permute, &p2, 3, s, kt_layouts[l], 0);
    }
    CHECK1(f_permute, &p3, 3, s, KT_CONTIG, 0);
    shape_arg p0 = {0, {0}};
    CHECK1(f_permute, &p0, 0, NULL, KT_CONTIG, 0);
}

typedef struct two_ints {
    int64_t a, b;
} two_ints;
static kl_tensor *f_transpose(void *u, int n, kl_tensor *const *in) {
    (void)n;
    two_ints *t = u;
    return kl_transpose(in[0], (int)t->a, (int)t->b);
}
static kl_tensor *f_t(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_t(in[0]);
}

static void grad_transpose(void **state) {
    (void)state;
    kl_manual_seed(3);
    int64_t s[] = {2, 3, 4};
    two_ints t1 = {0, 2}, t2 = {-1, 0}, t3 = {1, 1};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_transpose, &t1, 3, s, kt_layouts[l], l == 1);
        CHECK1(f_transpose, &t2, 3, s, kt_layouts[l], 0);
    }
    CHECK1(f_transpose, &t3, 3, s, KT_CONTIG, 0);
    CHECK1(f_t, NULL, 2, ((int64_t[]){3, 2}), KT_TRANSPOSED, 0);
}

static void grad_expand(void **state) {
    (void)state;
    kl_manual_seed(4);
    shape_arg e1 = {3, {2, 3, 4}}, e2 = {2, {5, -1}}, e3 = {2, {2, 2}}, e4 = {3, {2, -1, 3}};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_expand, &e1, 2, ((int64_t[]){3, 1}), kt_layouts[l], l == 0);
        CHECK1(f_expand, &e4, 2, ((int64_t[]){3, 1}), kt_layouts[l], 0);
    }
    CHECK1(f_expand, &e2, 1, ((int64_t[]){3}), KT_CONTIG, 0);
    CHECK1(f_expand, &e3, 0, NULL, KT_CONTIG, 1);
    CHECK1(f_expand, &e1, 3, ((int64_t[]){1, 3, 1}), KT_STRIDED, 1);
}

typedef struct dim_arg {
    int64_t dim;
} dim_arg;
static kl_tensor *f_squeeze(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_squeeze(in[0], (int)((dim_arg *)u)->dim);
}
static kl_tensor *f_squeeze_all(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_squeeze_all(in[0]);
}
static kl_tensor *f_unsqueeze(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_unsqueeze(in[0], (int)((dim_arg *)u)->dim);
}
static kl_tensor *f_flatten(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_flatten(in[0], 1, -1);
}

static void grad_squeeze_unsqueeze(void **state) {
    (void)state;
    kl_manual_seed(5);
    int64_t s[] = {2, 1, 3};
    dim_arg d1 = {1}, dm2 = {-2}, d0 = {0}, dm1 = {-1}, d2 = {2};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_squeeze, &d1, 3, s, kt_layouts[l], 0);
        CHECK1(f_squeeze, &dm2, 3, s, kt_layouts[l], 0);
        CHECK1(f_squeeze, &d0, 3, s, kt_layouts[l], 0); /* size 2: unchanged */
        CHECK1(f_squeeze_all, NULL, 3, s, kt_layouts[l], 0);
        CHECK1(f_unsqueeze, &d0, 3, s, kt_layouts[l], 0);
        CHECK1(f_unsqueeze, &dm1, 3, s, kt_layouts[l], 0);
        CHECK1(f_unsqueeze, &d2, 3, s, kt_layouts[l], l == 2);
        CHECK1(f_flatten, NULL, 3, s, kt_layouts[l], 0);
    }
    CHECK1(f_unsqueeze, &d0, 0, NULL, KT_CONTIG, 0);
    CHECK1(f_squeeze, &d0, 0, NULL, KT_CONTIG, 0);
}

typedef struct slice_arg {
    int64_t dim, start, end, step;
} slice_arg;
static kl_tensor *f_slice(void *u, int n, kl_tensor *const *in) {
    (void)n;
    slice_arg *a = u;
    return kl_slice(in[0], (int)a->dim, a->start, a->end, a->step);
}
static kl_tensor *f_narrow(void *u, int n, kl_tensor *const *in) {
    (void)n;
    slice_arg *a = u;
    return kl_narrow(in[0], (int)a->dim, a->start, a->end);
}
/* A slice of a slice (the inner view's gradient feeds the outer one's). */
static kl_tensor *f_slice2(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_slice(kl_slice(in[0], 1, 1, INT64_MAX, 2), 0, -4, -1, 2);
}

static void grad_slice(void **state) {
    (void)state;
    kl_manual_seed(6);
    int64_t s[] = {5, 7};
    slice_arg cases[] = {
        {0, 0, INT64_MAX, 1}, {1, 1, 4, 1},  {1, 1, 6, 2},      {0, -3, INT64_MAX, 2},
        {-1, 0, 7, 3},        {1, 2, 7, 4},  {0, 4, 5, 10},     {1, -100, 100, 3},
        {0, 2, 2, 1} /* empty */,            {1, 9, 12, 1} /* past the end */,
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_slice, &cases[i], 2, s, kt_layouts[l], i == 2 || i == 4);
    slice_arg nar = {1, 2, 3, 0};
    CHECK1(f_narrow, &nar, 2, s, KT_TRANSPOSED, 0);
    CHECK1(f_slice2, NULL, 2, s, KT_STRIDED, 1);
    slice_arg s3 = {1, 0, 3, 2};
    CHECK1(f_slice, &s3, 3, ((int64_t[]){2, 3, 2}), KT_TRANSPOSED, 0);
}

static kl_tensor *f_select(void *u, int n, kl_tensor *const *in) {
    (void)n;
    two_ints *a = u;
    return kl_select(in[0], (int)a->a, a->b);
}

static void grad_select(void **state) {
    (void)state;
    kl_manual_seed(7);
    int64_t s[] = {3, 4, 2};
    two_ints cases[] = {{0, 2}, {-1, -1}, {1, 0}, {1, 3}, {-2, -4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_select, &cases[i], 3, s, kt_layouts[l], i == 1);
    two_ints v = {0, 1};
    CHECK1(f_select, &v, 1, ((int64_t[]){3}), KT_STRIDED, 1); /* to 0-dim */
}

typedef struct strided_arg {
    int nd;
    int64_t shape[4], stride[4], offset;
} strided_arg;
static kl_tensor *f_as_strided(void *u, int n, kl_tensor *const *in) {
    (void)n;
    strided_arg *a = u;
    return kl_as_strided(in[0], a->nd, a->shape, a->stride, a->offset);
}
/* as_strided relative to the storage of a strided input (KT_STRIDED: every other element). */
static kl_tensor *f_as_strided_sq(void *u, int n, kl_tensor *const *in) {
    return kl_mul(f_as_strided(u, n, in), f_as_strided(u, n, in));
}

static void grad_as_strided(void **state) {
    (void)state;
    kl_manual_seed(8);
    int64_t s[] = {3, 4};
    strided_arg plain = {2, {2, 2}, {1, 2}, 1};
    strided_arg overlap = {2, {3, 3}, {1, 1}, 1};     /* output elements share positions: they sum */
    strided_arg zero = {3, {2, 2, 3}, {0, 4, 1}, 0};  /* a stride-0 output dim */
    strided_arg scalar = {0, {0}, {0}, 5};
    strided_arg empty = {2, {0, 3}, {1, 1}, 0};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_as_strided, &plain, 2, s, kt_layouts[l], l == 0);
        CHECK1(f_as_strided, &overlap, 2, s, kt_layouts[l], 0);
        CHECK1(f_as_strided, &zero, 2, s, kt_layouts[l], 0);
        CHECK1(f_as_strided, &scalar, 2, s, kt_layouts[l], 0);
        CHECK1(f_as_strided, &empty, 2, s, kt_layouts[l], 0);
        CHECK1(f_as_strided_sq, &overlap, 2, s, kt_layouts[l], l == 2);
    }
}

/* Values from torch 1.13: as_strided over an expanded input (positions read
 * by several input elements split their gradient), over a transposed input,
 * and an output reading positions several times. */
static void as_strided_exact(void **state) {
    (void)state;
    kl_tensor *a = LEAF(1, ((int64_t[]){2}), 1, 2);
    kl_tensor *b = kl_expand(a, 2, (int64_t[]){3, 2});
    kl_tensor *y = kl_as_strided(b, 1, (int64_t[]){2}, (int64_t[]){1}, 0);
    KT_VALUES(grad_of(y, F64(1, ((int64_t[]){2}), 1, 10), a), 1e-12, 1, 10);

    kl_tensor *x = LEAF(1, ((int64_t[]){6}), 1, 2, 3, 4, 5, 6);
    y = kl_as_strided(x, 2, (int64_t[]){3, 3}, (int64_t[]){1, 1}, 1);
    kl_tensor *g = F64(2, ((int64_t[]){3, 3}), 0, 1, 2, 3, 4, 5, 6, 7, 8);
    KT_VALUES(grad_of(y, g, x), 1e-12, 0, 0, 4, 12, 12, 8);

    kl_tensor *m = LEAF(2, ((int64_t[]){2, 3}), 1, 2, 3, 4, 5, 6);
    y = kl_as_strided(kl_t(m), 2, (int64_t[]){2, 2}, (int64_t[]){2, 1}, 1);
    KT_VALUES(grad_of(y, F64(2, ((int64_t[]){2, 2}), 1, 2, 3, 4), m), 1e-12, 0, 1, 2, 3, 4, 0);
}

static kl_tensor *f_contiguous(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_contiguous(in[0]);
}

static void grad_alias(void **state) {
    (void)state;
    kl_manual_seed(9);
    int64_t s[] = {2, 3};
    /* contiguous input: kl_contiguous is an alias; otherwise a clone */
    for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_contiguous, NULL, 2, s, kt_layouts[l], l == 0);
    CHECK1(f_t, NULL, 1, ((int64_t[]){3}), KT_CONTIG, 1); /* t of 1-D: alias */
}

/* ---- reductions ----------------------------------------------------------------------------- */

typedef struct rd_arg {
    int n;
    int64_t dims[KL_MAX_DIMS];
    bool keep;
    double f; /* correction or p */
} rd_arg;

#define RD_FN(name, call)                                        \
    static kl_tensor *f_##name(void *u, int n, kl_tensor *const *in) { \
        (void)n;                                                 \
        const rd_arg *a = u;                                     \
        kl_tensor *x = in[0];                                    \
        return call;                                             \
    }
RD_FN(sum, kl_sum(x, a->n, a->dims, a->keep))
RD_FN(mean, kl_mean(x, a->n, a->dims, a->keep))
RD_FN(prod, kl_prod(x, a->n, a->dims, a->keep))
RD_FN(amax, kl_amax(x, a->n, a->dims, a->keep))
RD_FN(amin, kl_amin(x, a->n, a->dims, a->keep))
RD_FN(var, kl_var(x, a->n, a->dims, a->f, a->keep))
RD_FN(std, kl_std(x, a->n, a->dims, a->f, a->keep))
RD_FN(logsumexp, kl_logsumexp(x, a->n, a->dims, a->keep))
RD_FN(norm, kl_norm(x, a->f, a->n, a->dims, a->keep))

/* Dim lists over a [2, 3, 4] input: one dim, negative, several, all (listed and empty). */
static const rd_arg rd_cases[] = {
    {0, {0}, false, 0},       {1, {1}, false, 0},  {1, {-1}, true, 0}, {2, {0, 2}, false, 0},
    {2, {-1, -3}, true, 0},   {3, {2, 0, 1}, false, 0}, {0, {0}, true, 0},  {1, {0}, true, 0},
};
#define NRD ((int)(sizeof rd_cases / sizeof rd_cases[0]))

/* Runs fn over every dim case and layout on [2, 3, 4], and on 0-dim and 1-D
 * inputs; gradgradcheck on a few when second. */
static void rd_sweep(kl_grad_fn fn, const char *what, double f, double lo, double hi, int second, int scalar) {
    int64_t s[] = {2, 3, 4};
    for (int i = 0; i < NRD; i++) {
        rd_arg a = rd_cases[i];
        a.f = f;
        for (int l = 0; l < NLAYOUTS; l++)
            check1_(fn, &a, 3, s, kt_layouts[l], lo, hi, second && (i == 2 || i == 5) && l == 1, what, __LINE__);
    }
    rd_arg all = {0, {0}, false, f}, d0 = {1, {0}, true, f}, dm1 = {1, {-1}, false, f};
    if (scalar) {
        check1_(fn, &all, 0, NULL, KT_CONTIG, lo, hi, 0, what, __LINE__);
        check1_(fn, &dm1, 0, NULL, KT_CONTIG, lo, hi, 0, what, __LINE__);
    }
    check1_(fn, &d0, 1, (int64_t[]){5}, KT_STRIDED, lo, hi, second, what, __LINE__);
}
#define RD_SWEEP(fn, f, lo, hi, second) rd_sweep((fn), #fn, (f), (lo), (hi), (second), 1)

static void grad_sum_mean(void **state) {
    (void)state;
    kl_manual_seed(10);
    RD_SWEEP(f_sum, 0, -1, 1, 1);
    RD_SWEEP(f_mean, 0, -1, 1, 1);
}

static void grad_prod(void **state) {
    (void)state;
    kl_manual_seed(11);
    RD_SWEEP(f_prod, 0, 0.5, 1.5, 1);
}

/* prod is a polynomial: gradcheck holds at zeros too (one zero per group and two). */
static void grad_prod_zeros(void **state) {
    (void)state;
    int64_t s[] = {3, 4};
    kl_tensor *x = LEAF(2, s, 2, 0, 3, 1.5, /**/ 0, 0.5, 0, 2, /**/ 1.2, -0.7, 0.9, 1.1);
    rd_arg cases[] = {{1, {1}, false, 0}, {1, {0}, true, 0}, {0, {0}, false, 0}, {2, {0, 1}, true, 0}};
    for (int i = 0; i < 4; i++) KT_GRADGRADCHECK(f_prod, &cases[i], 1, &x);
    kl_tensor *one = LEAF(1, ((int64_t[]){4}), 2, 0, 3, 4), *two = LEAF(1, ((int64_t[]){4}), 2, 0, 3, 0);
    KT_VALUES(grad_of(kl_prod(one, 0, NULL, false), NULL, one), 0, 0, 24, 0, 0);
    KT_VALUES(grad_of(kl_prod(two, 0, NULL, false), NULL, two), 0, 0, 0, 0, 0);
}

static void grad_amax_amin(void **state) {
    (void)state;
    kl_manual_seed(12);
    RD_SWEEP(f_amax, 0, -1, 1, 1);
    RD_SWEEP(f_amin, 0, -1, 1, 0);
}

/* torch 1.13: amax/amin split the gradient evenly among ties. */
static void amax_ties_split(void **state) {
    (void)state;
    kl_tensor *x = LEAF(1, ((int64_t[]){4}), 1, 3, 3, 2);
    KT_VALUES(grad_of(kl_amax(x, 0, NULL, false), NULL, x), 1e-15, 0, 0.5, 0.5, 0);
    int64_t s[] = {2, 3};
    kl_tensor *m = LEAF(2, s, 1, 3, 3, 2, 2, 0);
    kl_tensor *g = F64(1, ((int64_t[]){2}), 1, 2);
    KT_VALUES(grad_of(kl_amax(m, 1, (int64_t[]){1}, false), g, m), 1e-15, 0, 0.5, 0.5, 1, 1, 0);
    KT_VALUES(grad_of(kl_amin(m, 1, (int64_t[]){-1}, false), g, m), 1e-15, 1, 0, 0, 0, 0, 2);
    kl_tensor *t = LEAF(2, s, 5, 5, 5, 5, 5, 5);
    KT_VALUES(grad_of(kl_amin(t, 0, NULL, true), kl_ones(2, (int64_t[]){1, 1}, KL_F64), t), 1e-15, 1.0 / 6,
              1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6);
}

typedef struct mm_arg {
    int dim;
    bool keep, min;
} mm_arg;
static kl_tensor *f_minmax_dim(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const mm_arg *a = u;
    kl_tensor *v = NULL, *i = NULL;
    int rc = a->min ? kl_min_dim(in[0], a->dim, a->keep, &v, &i) : kl_max_dim(in[0], a->dim, a->keep, &v, &i);
    return rc ? NULL : v;
}

static void grad_max_min_dim(void **state) {
    (void)state;
    kl_manual_seed(13);
    int64_t s[] = {2, 3, 4};
    for (int mn = 0; mn < 2; mn++)
        for (int keep = 0; keep < 2; keep++) {
            int dims[] = {0, 1, -1, -2};
            for (int k = 0; k < 4; k++) {
                mm_arg a = {dims[k], keep, mn};
                for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_minmax_dim, &a, 3, s, kt_layouts[l], k == 2 && l == 0);
            }
            mm_arg z = {0, keep, mn};
            CHECK1(f_minmax_dim, &z, 0, NULL, KT_CONTIG, 0);
            CHECK1(f_minmax_dim, &z, 1, ((int64_t[]){5}), KT_STRIDED, 0);
        }
}

/* torch 1.13: max/min along a dim send the whole gradient to the returned
 * (first) index, ties or not. */
static void max_dim_to_index(void **state) {
    (void)state;
    int64_t s[] = {2, 3};
    kl_tensor *x = LEAF(2, s, 1, 3, 3, 2, 2, 0), *v, *i;
    assert_int_equal(kl_max_dim(x, 1, false, &v, &i), 0);
    KT_VALUES(i, 0, 1, 0);
    KT_VALUES(grad_of(v, F64(1, ((int64_t[]){2}), 1, 2), x), 0, 0, 1, 0, 2, 0, 0);
    kl_tensor *y = LEAF(2, s, 1, 3, 3, 0, 0, 5);
    assert_int_equal(kl_min_dim(y, -1, true, &v, &i), 0);
    KT_VALUES(i, 0, 0, 0);
    KT_VALUES(grad_of(v, F64(2, ((int64_t[]){2, 1}), 1, 2), y), 0, 1, 0, 0, 2, 0, 0);
    /* the indices output takes no gradient: backward through values only */
    assert_false(kl_requires_grad(i));
}

static void grad_var_std(void **state) {
    (void)state;
    kl_manual_seed(14);
    /* one element with correction 1 has no variance (NaN): 0-dim only with correction 0 */
    rd_sweep(f_var, "f_var", 1, -1, 1, 1, 0);
    rd_sweep(f_std, "f_std", 1, -1, 1, 1, 0);
    rd_sweep(f_var, "f_var", 0, -1, 1, 0, 1);
    int64_t s[] = {3, 5};
    double corr[] = {0, 2, 0.5};
    for (int k = 0; k < 3; k++) {
        rd_arg a = {1, {-1}, k == 1, corr[k]}, b = {0, {0}, false, corr[k]};
        for (int l = 0; l < NLAYOUTS; l++) {
            CHECK1(f_var, &a, 2, s, kt_layouts[l], l == 2);
            CHECK1(f_std, &b, 2, s, kt_layouts[l], 0);
        }
    }
}

/* torch 1.13: std's gradient is 0 where std is 0; var with as many
 * corrections as elements divides by zero. */
static void var_std_edges(void **state) {
    (void)state;
    int64_t s[] = {2};
    kl_tensor *x = LEAF(1, s, 1, 1);
    KT_VALUES(grad_of(kl_std(x, 0, NULL, 1, false), NULL, x), 0, 0, 0);
    kl_tensor *y = LEAF(1, s, 1, 2);
    KT_VALUES(grad_of(kl_var(y, 1, (int64_t[]){0}, 2, false), NULL, y), 0, -INFINITY, INFINITY);
    kl_tensor *m = LEAF(2, ((int64_t[]){2, 2}), 1, 2, 3, 4);
    KT_VALUES(grad_of(kl_var(m, 1, (int64_t[]){1}, 0, false), kl_ones(1, s, KL_F64), m), 1e-15, -0.5, 0.5, -0.5, 0.5);
}

static void grad_logsumexp(void **state) {
    (void)state;
    kl_manual_seed(15);
    RD_SWEEP(f_logsumexp, 0, -3, 3, 1);
}

/* Norms with inputs bounded away from 0 in both signs (the kink of |x|). */
static kl_tensor *f_norm_signed(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const rd_arg *a = u;
    kl_tensor *s = kl_sub_scalar(kl_mul_scalar(kl_ge_scalar(kl_detach(in[0]), 0), 2.0), 1.0);
    return kl_norm(kl_add(in[0], kl_mul_scalar(s, 0.3)), a->f, a->n, a->dims, a->keep);
}

static void grad_norm(void **state) {
    (void)state;
    kl_manual_seed(16);
    double ps[] = {2, 1, 3, 1.5, 0.5, INFINITY, -INFINITY, -1, 4};
    for (int k = 0; k < 9; k++) rd_sweep(f_norm_signed, "f_norm_signed", ps[k], -1, 1, ps[k] == 2 || ps[k] == 3, 1);
    /* p = 0 counts non-zeros: a zero gradient */
    rd_arg a = {1, {1}, false, 0};
    CHECK1(f_norm, &a, 2, ((int64_t[]){2, 3}), KT_TRANSPOSED, 0);
}

/* torch 1.13 (linalg.vector_norm) at x = [0, 2, -2, 1], and at x = 0. */
static void norm_exact(void **state) {
    (void)state;
    int64_t s[] = {4};
    struct {
        double p, g[4];
    } cases[] = {
        {0.5, {0, 2.7071067811865475, -2.7071067811865475, 3.8284271247461903}},
        {1, {0, 1, -1, 1}},
        {1.5, {0, 0.7517821014438997, -0.7517821014438997, 0.5315902219056544}},
        {2, {0, 2.0 / 3, -2.0 / 3, 1.0 / 3}},
        {3, {0, 0.6050074330960554, -0.6050074330960554, 0.15125185827401386}},
        {INFINITY, {0, 0.5, -0.5, 0}},
        {-INFINITY, {0, 0, 0, 0}},
        {-1, {0, 0, 0, 0}},
    };
    for (int k = 0; k < 8; k++) {
        kl_tensor *x = LEAF(1, s, 0, 2, -2, 1);
        kl_tensor *g = grad_of(kl_norm(x, cases[k].p, 0, NULL, false), NULL, x);
        kt_assert_values(g, cases[k].g, 4, 1e-10);
    }
    double ps[] = {2, 1.5, 3, 0.5};
    for (int k = 0; k < 4; k++) {
        kl_tensor *z = LEAF(1, ((int64_t[]){2}), 0, 0);
        KT_VALUES(grad_of(kl_norm(z, ps[k], 0, NULL, false), NULL, z), 0, 0, 0);
    }
    kl_tensor *x = LEAF(1, s, 0, 2, -2, 1);
    kl_tensor *g = grad_of(kl_norm(x, 0, 0, NULL, false), NULL, x);
    if (g) KT_VALUES(g, 0, 0, 0, 0, 0); /* PyTorch: None */
}

/* ---- scans -------------------------------------------------------------------------------- */

static kl_tensor *f_cumsum(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_cumsum(in[0], (int)((dim_arg *)u)->dim);
}
static kl_tensor *f_cumprod(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_cumprod(in[0], (int)((dim_arg *)u)->dim);
}

static void grad_cumsum_cumprod(void **state) {
    (void)state;
    kl_manual_seed(17);
    int64_t s[] = {3, 4, 2};
    dim_arg dims[] = {{0}, {1}, {-1}, {-2}};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < NLAYOUTS; l++) {
            CHECK1(f_cumsum, &dims[k], 3, s, kt_layouts[l], k == 1 && l == 1);
            CHECK1R(f_cumprod, &dims[k], 3, s, kt_layouts[l], 0.5, 1.5, k == 1 && l == 2);
            CHECK1R(f_cumprod, &dims[k], 3, s, kt_layouts[l], -1.5, -0.5, 0);
        }
    dim_arg d0 = {0};
    CHECK1(f_cumsum, &d0, 0, NULL, KT_CONTIG, 0);
    CHECK1(f_cumprod, &d0, 0, NULL, KT_CONTIG, 0);
    CHECK1(f_cumprod, &d0, 1, ((int64_t[]){1}), KT_CONTIG, 1);
    CHECK1(f_cumsum, &d0, 1, ((int64_t[]){6}), KT_STRIDED, 1);
}

/* cumprod is a polynomial: gradcheck holds at zeros (first zero, later
 * zeros, a zero first); gradgradcheck needs the create_graph form. */
static void grad_cumprod_zeros(void **state) {
    (void)state;
    int64_t s[] = {3, 5};
    kl_tensor *x = LEAF(2, s, 2, 0, 3, 0, 5, /**/ 0, 1.5, -0.5, 2, 0.7, /**/ 1.1, 0.9, -1.2, 0, 0.8);
    dim_arg d1 = {1}, d0 = {0};
    KT_GRADGRADCHECK(f_cumprod, &d1, 1, &x);
    KT_GRADGRADCHECK(f_cumprod, &d0, 1, &x);
    /* torch 1.13 */
    kl_tensor *a = LEAF(1, ((int64_t[]){5}), 2, 0, 3, 0, 5);
    KT_VALUES(grad_of(kl_cumprod(a, 0), F64(1, ((int64_t[]){5}), 1, 2, 3, 4, 5), a), 0, 1, 22, 0, 0, 0);
    kl_tensor *b = LEAF(1, ((int64_t[]){3}), 0, 2, 3);
    KT_VALUES(grad_of(kl_cumprod(b, -1), F64(1, ((int64_t[]){3}), 1, 2, 3), b), 0, 23, 0, 0);
}

/* ---- joining and indexing ---------------------------------------------------------------------- */

typedef struct cat_arg {
    int dim;
} cat_arg;
static kl_tensor *f_cat(void *u, int n, kl_tensor *const *in) { return kl_cat(n, in, ((cat_arg *)u)->dim); }
static kl_tensor *f_stack(void *u, int n, kl_tensor *const *in) { return kl_stack(n, in, ((cat_arg *)u)->dim); }

static void grad_cat(void **state) {
    (void)state;
    kl_manual_seed(18);
    for (int l = 0; l < NLAYOUTS; l++) {
        kl_scope_begin();
        kl_tensor *in[3] = {kt_input(2, (int64_t[]){2, 3}, kt_layouts[l], -1, 1),
                            kt_input(2, (int64_t[]){2, 1}, kt_layouts[(l + 1) % 3], -1, 1),
                            kt_input(2, (int64_t[]){2, 4}, kt_layouts[(l + 2) % 3], -1, 1)};
        cat_arg d1 = {1}, dm1 = {-1};
        KT_GRADGRADCHECK(f_cat, &d1, 3, in);
        KT_GRADCHECK(f_cat, &dm1, 3, in);
        kl_tensor *rows[2] = {kt_input(2, (int64_t[]){1, 3}, kt_layouts[l], -1, 1),
                              kt_input(2, (int64_t[]){3, 3}, kt_layouts[l], -1, 1)};
        cat_arg d0 = {0};
        KT_GRADCHECK(f_cat, &d0, 2, rows);
        kl_scope_end();
    }
    /* a legacy 1-D empty tensor is skipped, a zero-size piece gets an empty gradient */
    kl_tensor *in[4] = {kt_input(2, (int64_t[]){2, 2}, KT_CONTIG, -1, 1),
                        kt_input(1, (int64_t[]){0}, KT_CONTIG, -1, 1),
                        kt_input(2, (int64_t[]){2, 0}, KT_CONTIG, -1, 1),
                        kt_input(2, (int64_t[]){2, 3}, KT_STRIDED, -1, 1)};
    cat_arg d1 = {1};
    KT_GRADCHECK(f_cat, &d1, 4, in);
    kl_tensor *y = kl_cat(4, in, 1);
    kl_tensor *g = grad_of(kl_sum(y, 0, NULL, false), NULL, in[1]);
    if (g) kt_assert_shape(g, 1, (int64_t[]){0});
    /* stack decomposes into unsqueeze + cat */
    kl_tensor *st[2] = {kt_input(2, (int64_t[]){2, 3}, KT_TRANSPOSED, -1, 1),
                        kt_input(2, (int64_t[]){2, 3}, KT_CONTIG, -1, 1)};
    cat_arg s1 = {1};
    KT_GRADGRADCHECK(f_stack, &s1, 2, st);
}

static kl_tensor *f_repeat(void *u, int n, kl_tensor *const *in) {
    (void)n;
    shape_arg *a = u;
    return kl_repeat(in[0], a->n, a->v);
}

static void grad_repeat(void **state) {
    (void)state;
    kl_manual_seed(19);
    int64_t s[] = {2, 3};
    shape_arg cases[] = {{2, {2, 1}}, {2, {1, 3}}, {3, {2, 2, 2}}, {2, {1, 1}}, {4, {2, 1, 3, 2}}, {2, {0, 2}}};
    for (int k = 0; k < 6; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_repeat, &cases[k], 2, s, kt_layouts[l], k == 2 && l == 1);
    shape_arg r1 = {1, {3}}, r0 = {2, {2, 3}};
    CHECK1(f_repeat, &r1, 1, ((int64_t[]){4}), KT_STRIDED, 0);
    CHECK1(f_repeat, &r0, 0, NULL, KT_CONTIG, 0);
}

typedef struct pad_arg {
    int n;
    int64_t p[8];
    double v;
} pad_arg;
static kl_tensor *f_pad(void *u, int n, kl_tensor *const *in) {
    (void)n;
    pad_arg *a = u;
    return kl_pad(in[0], a->n, a->p, a->v);
}

static void grad_pad(void **state) {
    (void)state;
    kl_manual_seed(20);
    int64_t s[] = {3, 4};
    pad_arg cases[] = {{2, {1, 2}, 0},        {4, {1, 1, 2, 0}, 1.5}, {2, {-1, 1}, 0},
                       {4, {0, -2, 1, -1}, 0}, {4, {2, -3, -1, 0}, -2}, {0, {0}, 0}};
    for (int k = 0; k < 6; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_pad, &cases[k], 2, s, kt_layouts[l], (k == 1 || k == 3) && l == 0);
}

typedef struct pad_mode_arg {
    int n;
    int64_t p[6];
    kl_pad_mode mode;
} pad_mode_arg;
static kl_tensor *f_pad_mode(void *u, int n, kl_tensor *const *in) {
    (void)n;
    pad_mode_arg *a = u;
    return kl_pad_ex(in[0], a->n, a->p, a->mode, 0);
}

/* reflect, replicate and circular over 1, 2 and 3 padded dims (batched and
 * not), with negative pads and pads that read an element several times. */
static void grad_pad_modes(void **state) {
    (void)state;
    kl_manual_seed(21);
    static const kl_pad_mode modes[] = {KL_PAD_REFLECT, KL_PAD_REPLICATE, KL_PAD_CIRCULAR};
    for (int m = 0; m < 3; m++) {
        pad_mode_arg a1 = {2, {2, 3}, modes[m]}, a1n = {2, {-1, 3}, modes[m]};
        pad_mode_arg a2 = {4, {1, 2, 2, -1}, modes[m]}, a3 = {6, {1, 0, 0, 2, 1, 1}, modes[m]};
        int64_t s3[] = {2, 3, 4}, s4[] = {1, 2, 3, 4}, s5[] = {1, 1, 2, 3, 3};
        for (int l = 0; l < NLAYOUTS; l++) {
            CHECK1(f_pad_mode, &a1, 3, s3, kt_layouts[l], l == 0);
            CHECK1(f_pad_mode, &a1n, 3, s3, kt_layouts[l], 0);
            CHECK1(f_pad_mode, &a2, 4, s4, kt_layouts[l], l == 1);
            CHECK1(f_pad_mode, &a3, 5, s5, kt_layouts[l], 0);
        }
        if (modes[m] != KL_PAD_CIRCULAR) { /* unbatched */
            int64_t s2[] = {3, 4};
            CHECK1(f_pad_mode, &a1, 2, s2, KT_CONTIG, 0);
        }
    }
}

typedef struct index_arg {
    int dim;
    kl_tensor *index;
} index_arg;
static kl_tensor *f_index_select(void *u, int n, kl_tensor *const *in) {
    (void)n;
    index_arg *a = u;
    return kl_index_select(in[0], a->dim, a->index);
}
static kl_tensor *f_gather(void *u, int n, kl_tensor *const *in) {
    (void)n;
    index_arg *a = u;
    return kl_gather(in[0], a->dim, a->index);
}
static kl_tensor *f_take_along_dim(void *u, int n, kl_tensor *const *in) {
    (void)n;
    index_arg *a = u;
    return kl_take_along_dim(in[0], a->index, a->dim);
}

static kl_tensor *i64(int nd, const int64_t *shape, const int64_t *v) { return kl_from_data(v, nd, shape, KL_I64); }
#define I64(nd, shape, ...) i64((nd), (shape), (const int64_t[]){__VA_ARGS__})

static void grad_index_select(void **state) {
    (void)state;
    kl_manual_seed(21);
    int64_t s[] = {4, 3};
    kl_tensor *rep = I64(1, ((int64_t[]){5}), 3, 0, 3, 1, 3); /* repeats accumulate */
    kl_tensor *i32 = kl_to_dtype(I64(1, ((int64_t[]){2}), 2, 2), KL_I32);
    index_arg cases[] = {{0, rep}, {-1, I64(1, ((int64_t[]){4}), 2, 0, 0, 1)}, {1, i32}, {0, I64(1, ((int64_t[]){0}))},
                         {0, I64(0, NULL, 2)}};
    for (int k = 0; k < 5; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_index_select, &cases[k], 2, s, kt_layouts[l], k == 0 && l == 1);
    index_arg sc = {0, I64(1, ((int64_t[]){2}), 0, 0)};
    CHECK1(f_index_select, &sc, 0, NULL, KT_CONTIG, 0);
}

static void grad_gather(void **state) {
    (void)state;
    kl_manual_seed(22);
    int64_t s[] = {3, 4};
    index_arg cases[] = {
        {1, I64(2, ((int64_t[]){3, 2}), 3, 3, 0, 1, 2, 0)},
        {0, I64(2, ((int64_t[]){2, 4}), 2, 0, 0, 1, 1, 1, 2, 2)},
        {-1, I64(2, ((int64_t[]){2, 5}), 0, 1, 2, 3, 3, 1, 1, 1, 0, 2)}, /* smaller outside dim, longer along it */
        {1, I64(2, ((int64_t[]){3, 0}))},
    };
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_gather, &cases[k], 2, s, kt_layouts[l], k < 2 && l == k);
    index_arg tad = {0, I64(2, ((int64_t[]){1, 4}), 2, 0, 1, 2)};
    CHECK1(f_take_along_dim, &tad, 2, s, KT_TRANSPOSED, 1);
}

typedef struct scatter_arg {
    int dim;
    kl_tensor *index;
    bool inplace;
} scatter_arg;
static kl_tensor *f_scatter_add(void *u, int n, kl_tensor *const *in) {
    (void)n;
    scatter_arg *a = u;
    if (!a->inplace) return kl_scatter_add(in[0], a->dim, a->index, in[1]);
    return kl_scatter_add_inplace(kl_clone(in[0]), a->dim, a->index, in[1]);
}

static void grad_scatter_add(void **state) {
    (void)state;
    kl_manual_seed(23);
    kl_tensor *idx = I64(2, ((int64_t[]){2, 3}), 2, 0, 2, 1, 2, 0); /* repeated targets */
    for (int inplace = 0; inplace < 2; inplace++)
        for (int l = 0; l < NLAYOUTS; l++) {
            kl_scope_begin();
            kl_tensor *in[2] = {kt_input(2, (int64_t[]){3, 4}, kt_layouts[l], -1, 1),
                                kt_input(2, (int64_t[]){2, 3}, kt_layouts[(l + 1) % 3], -1, 1)};
            scatter_arg a = {0, idx, inplace};
            if (l == 0) KT_GRADGRADCHECK(f_scatter_add, &a, 2, in);
            else KT_GRADCHECK(f_scatter_add, &a, 2, in);
            /* src larger than index: the part index does not reach gets zero */
            kl_tensor *big[2] = {in[0], kt_input(2, (int64_t[]){3, 5}, kt_layouts[l], -1, 1)};
            scatter_arg b = {-1, I64(2, ((int64_t[]){2, 2}), 3, 3, 0, 1), inplace};
            KT_GRADCHECK(f_scatter_add, &b, 2, big);
            kl_scope_end();
        }
}

/* scatter (src written, and the value form), scatter_reduce in every
 * reduction with and without self; repeated targets, src larger than index. */
typedef struct scatter_r_arg {
    int dim, reduce; /* reduce -1: kl_scatter, -2: kl_scatter_value */
    bool include_self;
    kl_tensor *index;
} scatter_r_arg;
static kl_tensor *f_scatter_r(void *u, int n, kl_tensor *const *in) {
    const scatter_r_arg *a = u;
    if (a->reduce == -2) return kl_scatter_value(in[0], a->dim, a->index, 0.5);
    if (a->reduce == -1) return kl_scatter(in[0], a->dim, a->index, in[n - 1]);
    return kl_scatter_reduce(in[0], a->dim, a->index, in[1], (kl_scatter_reduction)a->reduce, a->include_self);
}

static void grad_scatter_reduce(void **state) {
    (void)state;
    kl_manual_seed(25);
    kl_tensor *uniq = I64(2, ((int64_t[]){2, 3}), 2, 0, 1, 1, 2, 0);   /* no element written twice */
    kl_tensor *rep = I64(2, ((int64_t[]){3, 3}), 2, 0, 2, 1, 2, 0, 2, 1, 1); /* repeated targets */
    for (int l = 0; l < NLAYOUTS; l++) {
        kl_scope_begin();
        kl_tensor *in[2] = {kt_input(2, (int64_t[]){3, 4}, kt_layouts[l], 0.5, 2),
                            kt_input(2, (int64_t[]){3, 3}, kt_layouts[(l + 1) % 3], 0.5, 2)};
        scatter_r_arg sa = {0, -1, true, uniq};
        if (l == 0) KT_GRADGRADCHECK(f_scatter_r, &sa, 2, in);
        else KT_GRADCHECK(f_scatter_r, &sa, 2, in);
        scatter_r_arg sv = {0, -2, true, uniq};
        KT_GRADCHECK(f_scatter_r, &sv, 1, in);
        for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++)
            for (int inc = 0; inc < 2; inc++) {
                scatter_r_arg a = {0, r, inc, rep};
                if (l == 0) KT_GRADGRADCHECK(f_scatter_r, &a, 2, in);
                else KT_GRADCHECK(f_scatter_r, &a, 2, in);
            }
        /* src larger than index along dim -1 */
        kl_tensor *big[2] = {in[0], kt_input(2, (int64_t[]){3, 5}, kt_layouts[l], 0.5, 2)};
        scatter_r_arg b = {-1, KL_SCATTER_MEAN, false, I64(2, ((int64_t[]){2, 2}), 3, 3, 0, 1)};
        KT_GRADCHECK(f_scatter_r, &b, 2, big);
        b.reduce = KL_SCATTER_PROD;
        KT_GRADCHECK(f_scatter_r, &b, 2, big);
        kl_scope_end();
    }
}

typedef struct emb_arg {
    kl_tensor *indices;
} emb_arg;
static kl_tensor *f_embedding(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_embedding(in[0], ((emb_arg *)u)->indices);
}

static void grad_embedding(void **state) {
    (void)state;
    kl_manual_seed(24);
    int64_t s[] = {5, 3};
    emb_arg cases[] = {{I64(2, ((int64_t[]){2, 3}), 4, 0, 4, 1, 1, 3)},
                       {kl_to_dtype(I64(1, ((int64_t[]){4}), 2, 2, 0, 4), KL_I32)},
                       {I64(0, NULL, 3)},
                       {I64(1, ((int64_t[]){0}))}};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_embedding, &cases[k], 2, s, kt_layouts[l], k == 0 && l == 2);
    /* rows add up: row 4 used twice, row 2 never */
    kl_tensor *w = LEAF(2, ((int64_t[]){5, 1}), 0, 0, 0, 0, 0);
    kl_tensor *y = kl_embedding(w, I64(1, ((int64_t[]){3}), 4, 0, 4));
    KT_VALUES(grad_of(y, F64(2, ((int64_t[]){3, 1}), 1, 10, 100), w), 0, 10, 0, 0, 0, 101);
}

/* ---- copies (rows in ops_create.def; checked here as well) ------------------------------- */

static kl_tensor *f_clone(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_clone(in[0]);
}
static kl_tensor *f_copy(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_copy_inplace(kl_mul_scalar(in[0], 2), in[1]);
}

static void grad_copies(void **state) {
    (void)state;
    kl_manual_seed(25);
    int64_t s[] = {3, 4};
    for (int l = 0; l < NLAYOUTS; l++) {
        CHECK1(f_clone, NULL, 2, s, kt_layouts[l], l == 0);
        kl_scope_begin();
        kl_tensor *in[2] = {kt_input(2, s, kt_layouts[l], -1, 1), kt_input(1, (int64_t[]){4}, KT_STRIDED, -1, 1)};
        KT_GRADGRADCHECK(f_copy, NULL, 2, in); /* src broadcast over dst's rows */
        kl_scope_end();
    }
    /* to_dtype: the gradient comes back in the input's dtype */
    kl_tensor *x = LEAF(1, ((int64_t[]){3}), 1, 2, 3);
    kl_tensor *y = kl_to_dtype(x, KL_F32);
    kl_tensor *g = grad_of(y, kl_from_data((const float[]){1, 2, 4}, 1, (int64_t[]){3}, KL_F32), x);
    assert_int_equal(kl_dtype_of(g), KL_F64);
    KT_VALUES(g, 0, 1, 2, 4);
    /* copy into a float32 tensor: src's gradient is f64, dst's old value gets none */
    kl_tensor *dst = kl_zeros(1, (int64_t[]){3}, KL_F32);
    kl_tensor *src = LEAF(1, ((int64_t[]){3}), 1, 2, 3);
    kl_tensor *out = kl_copy_inplace(dst, src);
    g = grad_of(kl_sum(out, 0, NULL, false), NULL, src);
    assert_int_equal(kl_dtype_of(g), KL_F64);
    KT_VALUES(g, 0, 1, 1, 1);
}

/* ---- sorting and reordering (issue 16) ----------------------------------------------------- */

typedef struct sort_arg {
    int dim;
    bool flag; /* descending / largest */
    int64_t k;
    int mode;  /* 0 sort values, 1 topk values, 2 flip, 3 roll, 4 roll flattened */
    int n;
    int64_t v[4], w[4];
} sort_arg;
static kl_tensor *f_sorting(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const sort_arg *a = u;
    kl_tensor *v = NULL, *i = NULL;
    switch (a->mode) {
    case 0: return kl_sort(in[0], a->dim, a->flag, true, &v, &i) ? NULL : v;
    case 1: return kl_topk(in[0], a->k, a->dim, a->flag, true, &v, &i) ? NULL : v;
    case 2: return kl_flip(in[0], a->n, a->v);
    case 3: return kl_roll(in[0], a->n, a->v, a->w);
    default: return kl_roll(in[0], 1, a->v, NULL);
    }
}

static void grad_sort_topk(void **state) {
    (void)state;
    kl_manual_seed(41);
    int64_t s[] = {3, 4, 5};
    for (int l = 0; l < NLAYOUTS; l++) {
        sort_arg a = {.dim = l - 1, .flag = l == 1, .mode = 0}; /* random values: no ties */
        CHECK1(f_sorting, &a, 3, s, kt_layouts[l], l == 0);
        sort_arg t = {.dim = l == 2 ? 0 : -1, .flag = l != 1, .k = l + 1, .mode = 1};
        CHECK1(f_sorting, &t, 3, s, kt_layouts[l], l == 0);
    }
    sort_arg z = {.dim = 0, .mode = 0}, zk = {.dim = 0, .k = 1, .flag = true, .mode = 1},
             k0 = {.dim = 1, .k = 0, .mode = 1};
    CHECK1(f_sorting, &z, 0, NULL, KT_CONTIG, 0);
    CHECK1(f_sorting, &zk, 0, NULL, KT_CONTIG, 0);
    CHECK1(f_sorting, &k0, 3, s, KT_CONTIG, 0);
    CHECK1(f_sorting, &z, 2, ((int64_t[]){0, 3}), KT_CONTIG, 0);
    /* ties: the gradient follows the returned (stable) indices */
    kl_tensor *x = LEAF(1, ((int64_t[]){4}), 2, 1, 2, 1), *v, *i;
    assert_int_equal(kl_topk(x, 2, 0, true, true, &v, &i), 0);
    KT_VALUES(i, 0, 0, 2);
    KT_VALUES(grad_of(v, F64(1, ((int64_t[]){2}), 10, 20), x), 0, 10, 0, 20, 0);
}

static void grad_flip_roll(void **state) {
    (void)state;
    kl_manual_seed(42);
    int64_t s[] = {3, 4, 5};
    sort_arg f[] = {{.mode = 2, .n = 1, .v = {0}}, {.mode = 2, .n = 2, .v = {-1, 1}}, {.mode = 2, .n = 0},
                    {.mode = 3, .n = 1, .v = {2}, .w = {1}}, {.mode = 3, .n = 2, .v = {-1, 7}, .w = {0, 2}},
                    {.mode = 4, .v = {5}}};
    for (int k = 0; k < 6; k++)
        for (int l = 0; l < NLAYOUTS; l++) CHECK1(f_sorting, &f[k], 3, s, kt_layouts[l], l == 0 && k < 2);
    CHECK1(f_sorting, &f[0], 0, NULL, KT_CONTIG, 0);
}

static kl_tensor *f_outer(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_outer(in[0], in[1]);
}
static kl_tensor *f_baddbmm(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const double *ba = u;
    return kl_baddbmm(in[0], in[1], in[2], ba[0], ba[1]);
}
static kl_tensor *f_einsum(void *u, int n, kl_tensor *const *in) { return kl_einsum(u, n, in); }

static void grad_outer_baddbmm_einsum(void **state) {
    (void)state;
    kl_manual_seed(43);
    kl_scope_begin();
    kl_tensor *a = kt_input(1, (int64_t[]){3}, KT_STRIDED, -1, 1), *b = kt_input(1, (int64_t[]){4}, KT_CONTIG, -1, 1);
    KT_GRADGRADCHECK(f_outer, NULL, 2, ((kl_tensor *[]){a, b}));
    kl_tensor *s = kt_input(3, (int64_t[]){2, 3, 4}, KT_TRANSPOSED, -1, 1),
              *s1 = kt_input(2, (int64_t[]){1, 4}, KT_CONTIG, -1, 1),
              *b1 = kt_input(3, (int64_t[]){2, 3, 5}, KT_STRIDED, -1, 1),
              *b2 = kt_input(3, (int64_t[]){2, 5, 4}, KT_TRANSPOSED, -1, 1);
    double ba[][2] = {{1, 1}, {0.5, -2}, {0, 1.5}};
    for (int k = 0; k < 3; k++) KT_GRADCHECK(f_baddbmm, ba[k], 3, ((kl_tensor *[]){k == 1 ? s1 : s, b1, b2}));
    KT_GRADGRADCHECK(f_baddbmm, ba[1], 3, ((kl_tensor *[]){s, b1, b2}));
    kl_tensor *q = kt_input(4, (int64_t[]){2, 2, 3, 4}, KT_CONTIG, -1, 1),
              *kk = kt_input(4, (int64_t[]){2, 2, 5, 4}, KT_TRANSPOSED, -1, 1);
    KT_GRADGRADCHECK(f_einsum, "bhqd,bhkd->bhqk", 2, ((kl_tensor *[]){q, kk}));
    KT_GRADCHECK(f_einsum, "bxy,byz->bz", 2, ((kl_tensor *[]){b1, b2}));
    KT_GRADCHECK(f_einsum, "ijk,ikl->lij", 2, ((kl_tensor *[]){b1, b2}));
    KT_GRADCHECK(f_einsum, "i,j", 2, ((kl_tensor *[]){a, b}));
    kl_tensor *m = kt_input(2, (int64_t[]){4, 4}, KT_TRANSPOSED, -1, 1);
    KT_GRADCHECK(f_einsum, "ii->", 1, &m);
    KT_GRADCHECK(f_einsum, "ii->i", 1, &m);
    KT_GRADCHECK(f_einsum, "ijk->ki", 1, &b1);
    kl_scope_end();
}

/* The gradgradchecks above really differentiated these formulas (runs last). */
static void double_backward_ran(void **state) {
    (void)state;
    static const int ops[] = {KE_OP_sum,    KE_OP_mean,       KE_OP_amax,    KE_OP_var,    KE_OP_std,
                              KE_OP_logsumexp, KE_OP_norm,    KE_OP_prod,    KE_OP_cumsum, KE_OP_cumprod,
                              KE_OP_expand, KE_OP_permute,    KE_OP_transpose, KE_OP_slice, KE_OP_select,
                              KE_OP_as_strided, KE_OP_view,   KE_OP_cat,     KE_OP_gather, KE_OP_index_select,
                              KE_OP_scatter_add, KE_OP_embedding, KE_OP_repeat, KE_OP_pad, KE_OP_max_dim,
                              KE_OP_alias};
    int missing = 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (atomic_load(&ag_stat_double[ops[i]]) == 0) {
            print_error("kl_%s was never differentiated twice\n", ke_ops[ops[i]].name);
            missing++;
        }
    assert_int_equal(missing, 0);
}

const struct CMUnitTest kt_grad_shape_tests[] = {
    KT_TEST(grad_view_reshape),
    KT_TEST(grad_permute_transpose),
    KT_TEST(grad_transpose),
    KT_TEST(grad_expand),
    KT_TEST(grad_squeeze_unsqueeze),
    KT_TEST(grad_slice),
    KT_TEST(grad_select),
    KT_TEST(grad_as_strided),
    KT_TEST(as_strided_exact),
    KT_TEST(grad_alias),
    KT_TEST(grad_sum_mean),
    KT_TEST(grad_prod),
    KT_TEST(grad_prod_zeros),
    KT_TEST(grad_amax_amin),
    KT_TEST(amax_ties_split),
    KT_TEST(grad_max_min_dim),
    KT_TEST(max_dim_to_index),
    KT_TEST(grad_var_std),
    KT_TEST(var_std_edges),
    KT_TEST(grad_logsumexp),
    KT_TEST(grad_norm),
    KT_TEST(norm_exact),
    KT_TEST(grad_cumsum_cumprod),
    KT_TEST(grad_cumprod_zeros),
    KT_TEST(grad_cat),
    KT_TEST(grad_repeat),
    KT_TEST(grad_pad),
    KT_TEST(grad_pad_modes),
    KT_TEST(grad_index_select),
    KT_TEST(grad_gather),
    KT_TEST(grad_scatter_add),
    KT_TEST(grad_scatter_reduce),
    KT_TEST(grad_embedding),
    KT_TEST(grad_copies),
    KT_TEST(grad_sort_topk),
    KT_TEST(grad_flip_roll),
    KT_TEST(grad_outer_baddbmm_einsum),
    KT_TEST(double_backward_ran),
};
const size_t kt_grad_shape_count = sizeof kt_grad_shape_tests / sizeof kt_grad_shape_tests[0];
