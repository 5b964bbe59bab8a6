/*
 * grad_nn.c — gradchecks of the linalg and nn families (formulas in
 * src/autograd/d_nn.c): every op over several shapes and layouts, matmul's
 * 1-D and broadcast-batch cases, every loss reduction with label smoothing
 * and ignored targets, conv2d and pooling over strides, padding, dilation,
 * groups and ceil_mode; gradgradchecks for the products, softmax, the norms,
 * the losses and conv2d; and exact values for PyTorch's conventions (max
 * pooling's ties and NaNs, ignored targets, dropout's mask).
 */
#include "grad_harness.h"

/* ---- helpers ---------------------------------------------------------------------- */

/* An input in [-1, 1) (layout applied to its last two dims, or last dim). */
static kl_tensor *in_(int ndim, const int64_t *shape, enum kt_layout layout) {
    return kt_input(ndim, shape, layout, -1, 1);
}
#define IN(layout, ...) in_(KL_SHAPE(__VA_ARGS__), (layout))
#define SCALAR() kt_input(0, NULL, KT_CONTIG, -1, 1)

static kl_tensor *i64_(int ndim, const int64_t *shape, const int64_t *v) {
    kl_tensor *t = kl_from_data(v, ndim, shape, KL_I64);
    assert_non_null(t);
    return t;
}

/* Asserts t (any layout) holds vals to tol. */
static void expect_values(kl_tensor *t, const double *vals, int64_t n, double tol) {
    assert_non_null(t);
    assert_int_equal(kl_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double v = kt_get(t, i);
        if (isnan(vals[i]) && isnan(v)) continue;
        if (!(fabs(v - vals[i]) <= tol)) fail_msg("element %lld: got %.17g, expected %.17g", (long long)i, v, vals[i]);
    }
}

/* The gradient of sum(out * w) w.r.t. x, for exact-value checks. */
static kl_tensor *grad_of(kl_tensor *out, kl_tensor *w, kl_tensor *x) {
    kl_tensor *g = NULL;
    assert_int_equal(kl_autograd_grad(1, &out, &w, 1, &x, &g, NULL), 0);
    return g;
}

/* ---- matrix products ----------------------------------------------------------------- */

static kl_tensor *f_matmul(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_matmul(in[0], in[1]);
}
static kl_tensor *f_mm(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_mm(in[0], in[1]);
}
static kl_tensor *f_bmm(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_bmm(in[0], in[1]);
}

typedef struct shape_pair {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
} shape_pair;

static void grad_matmul(void **state) {
    (void)state;
    kl_manual_seed(1);
    static const shape_pair cases[] = {
        {1, {3}, 1, {3}},                  /* dot */
        {1, {3}, 2, {3, 4}},               /* vector @ matrix */
        {2, {4, 3}, 1, {3}},               /* matrix @ vector */
        {2, {2, 3}, 2, {3, 4}},            /* mm */
        {3, {2, 3, 4}, 2, {4, 2}},         /* batched @ matrix (folded weight gradient) */
        {2, {3, 4}, 3, {2, 4, 2}},         /* matrix @ batched */
        {1, {3}, 3, {2, 3, 4}},            /* vector @ batched */
        {3, {2, 4, 3}, 1, {3}},            /* batched @ vector */
        {4, {2, 1, 3, 4}, 3, {3, 4, 2}},   /* broadcast batch dims */
        {3, {1, 3, 4}, 3, {2, 4, 2}},      /* size-1 batch dim broadcast */
        {2, {3, 0}, 2, {0, 2}},            /* empty inner dim */
    };
    static const enum kt_layout layouts[] = {KT_CONTIG, KT_TRANSPOSED, KT_STRIDED};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int l = 0; l < 3; l++) {
            kl_scope_begin();
            const shape_pair *p = &cases[i];
            kl_tensor *in[2] = {in_(p->na, p->a, layouts[l]), in_(p->nb, p->b, layouts[(l + 1) % 3])};
            KT_GRADCHECK(f_matmul, NULL, 2, in);
            kl_scope_end();
        }
    /* second order on the shapes with distinct rules */
    static const int second[] = {0, 1, 2, 4, 5, 8};
    for (size_t i = 0; i < sizeof second / sizeof second[0]; i++) {
        kl_scope_begin();
        const shape_pair *p = &cases[second[i]];
        kl_tensor *in[2] = {in_(p->na, p->a, KT_TRANSPOSED), in_(p->nb, p->b, KT_CONTIG)};
        KT_GRADGRADCHECK(f_matmul, NULL, 2, in);
        kl_scope_end();
    }
}

/* Only one operand requiring grad: the other gradient is not computed. */
static void grad_matmul_one_side(void **state) {
    (void)state;
    kl_manual_seed(2);
    kl_tensor *in[2] = {IN(KT_CONTIG, 2, 3, 4), kl_detach(IN(KT_CONTIG, 4, 5))};
    KT_GRADCHECK(f_matmul, NULL, 2, in);
    kl_tensor *in2[2] = {kl_detach(IN(KT_CONTIG, 2, 3, 4)), IN(KT_STRIDED, 4, 5)};
    KT_GRADCHECK(f_matmul, NULL, 2, in2);
}

/* A column-major operand (k^T in q @ k^T, W^T in x @ W^T) gets its gradient
 * column-major, so the tensor behind the transpose receives a contiguous one
 * (no copy when a reshape or select backward follows); values by gradcheck. */
static void grad_matmul_layout(void **state) {
    (void)state;
    kl_manual_seed(5);
    kl_tensor *q = IN(KT_CONTIG, 2, 3, 4, 5), *k = IN(KT_CONTIG, 2, 3, 6, 5);
    kl_tensor *x = IN(KT_CONTIG, 2, 4, 5), *w = IN(KT_CONTIG, 3, 5);
    kl_tensor *at = IN(KT_CONTIG, 2, 3, 6, 4), *b = IN(KT_CONTIG, 2, 3, 6, 5);
    /* the column-major operands themselves (views), whose gradients the formula makes */
    kl_tensor *kt = kl_transpose(k, -2, -1), *wt = kl_t(w), *a = kl_transpose(at, -2, -1);
    kl_tensor *y[3] = {kl_sum(kl_matmul(q, kt), 0, NULL, false),  /* column-major b, batched */
                       kl_sum(kl_matmul(x, wt), 0, NULL, false),  /* column-major b, folded weight */
                       kl_sum(kl_matmul(a, b), 0, NULL, false)};  /* column-major a */
    kl_tensor *views[3] = {kt, wt, a}, *g[3] = {0};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kl_autograd_grad(1, &y[i], NULL, 1, &views[i], &g[i], NULL), 0);
        assert_false(kl_is_contiguous(g[i]));
        assert_true(kl_is_contiguous(kl_transpose(g[i], -2, -1)));
    }
    static const shape_pair cases[] = {{4, {2, 3, 4, 6}, 4, {2, 3, 6, 5}}, {3, {2, 4, 5}, 2, {5, 3}}};
    for (int i = 0; i < 2; i++) {
        kl_tensor *in[2] = {in_(cases[i].na, cases[i].a, i ? KT_CONTIG : KT_TRANSPOSED),
                            in_(cases[i].nb, cases[i].b, KT_TRANSPOSED)};
        KT_GRADCHECK(f_matmul, NULL, 2, in);
        KT_GRADGRADCHECK(f_matmul, NULL, 2, in);
    }
}

static void grad_mm_bmm(void **state) {
    (void)state;
    kl_manual_seed(3);
    kl_tensor *a = IN(KT_TRANSPOSED, 3, 4), *b = IN(KT_STRIDED, 4, 2);
    kl_tensor *in[2] = {a, b};
    KT_GRADGRADCHECK(f_mm, NULL, 2, in);
    kl_tensor *in1[2] = {IN(KT_CONTIG, 1, 5), IN(KT_CONTIG, 5, 1)};
    KT_GRADCHECK(f_mm, NULL, 2, in1);
    kl_tensor *in2[2] = {IN(KT_TRANSPOSED, 2, 3, 4), IN(KT_CONTIG, 2, 4, 3)};
    KT_GRADGRADCHECK(f_bmm, NULL, 2, in2);
    kl_tensor *in3[2] = {IN(KT_STRIDED, 3, 1, 2), IN(KT_TRANSPOSED, 3, 2, 2)};
    KT_GRADCHECK(f_bmm, NULL, 2, in3);
}

typedef struct addmm_args {
    double beta, alpha;
} addmm_args;
static kl_tensor *f_addmm(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const addmm_args *a = u;
    return kl_addmm(in[0], in[1], in[2], a->beta, a->alpha);
}

static void grad_addmm(void **state) {
    (void)state;
    kl_manual_seed(4);
    addmm_args args[] = {{1, 1}, {0.5, -2}, {0, 3}};
    for (int i = 0; i < 3; i++) {
        kl_tensor *in[3] = {IN(KT_CONTIG, 3, 2), IN(KT_TRANSPOSED, 3, 4), IN(KT_STRIDED, 4, 2)};
        KT_GRADCHECK(f_addmm, &args[i], 3, in);
        kl_tensor *row[3] = {IN(KT_STRIDED, 2), IN(KT_CONTIG, 3, 4), IN(KT_CONTIG, 4, 2)};   /* bias [N] */
        KT_GRADCHECK(f_addmm, &args[i], 3, row);
        kl_tensor *col[3] = {IN(KT_CONTIG, 3, 1), IN(KT_CONTIG, 3, 4), IN(KT_TRANSPOSED, 4, 2)}; /* bias [M, 1] */
        KT_GRADCHECK(f_addmm, &args[i], 3, col);
        kl_tensor *s[3] = {SCALAR(), IN(KT_CONTIG, 2, 3), IN(KT_CONTIG, 3, 2)};         /* 0-dim bias */
        KT_GRADCHECK(f_addmm, &args[i], 3, s);
    }
    kl_tensor *in[3] = {IN(KT_CONTIG, 2), IN(KT_TRANSPOSED, 3, 4), IN(KT_CONTIG, 4, 2)};
    KT_GRADGRADCHECK(f_addmm, &args[1], 3, in);
}

static kl_tensor *f_linear(void *u, int n, kl_tensor *const *in) {
    (void)u;
    return kl_linear(in[0], in[1], n > 2 ? in[2] : NULL);
}

static void grad_linear(void **state) {
    (void)state;
    kl_manual_seed(5);
    kl_tensor *a[3] = {IN(KT_CONTIG, 2, 3, 4), IN(KT_CONTIG, 5, 4), IN(KT_CONTIG, 5)};
    KT_GRADGRADCHECK(f_linear, NULL, 3, a);
    kl_tensor *b[2] = {IN(KT_TRANSPOSED, 3, 4), IN(KT_STRIDED, 2, 4)}; /* no bias, non-contiguous */
    KT_GRADGRADCHECK(f_linear, NULL, 2, b);
    kl_tensor *c1[3] = {IN(KT_STRIDED, 4), IN(KT_TRANSPOSED, 3, 4), IN(KT_CONTIG, 3)}; /* 1-D input */
    KT_GRADCHECK(f_linear, NULL, 3, c1);
    kl_tensor *d[3] = {IN(KT_CONTIG, 2, 3, 4), IN(KT_STRIDED, 4), SCALAR()}; /* 1-D weight, 0-dim bias */
    KT_GRADGRADCHECK(f_linear, NULL, 3, d);
    kl_tensor *e[2] = {IN(KT_CONTIG, 4), IN(KT_CONTIG, 4)}; /* 1-D both: a dot */
    KT_GRADCHECK(f_linear, NULL, 2, e);
    kl_tensor *f[3] = {IN(KT_CONTIG, 3, 2, 4), IN(KT_CONTIG, 5, 4), IN(KT_CONTIG, 2, 1)}; /* broadcast bias */
    KT_GRADCHECK(f_linear, NULL, 3, f);
    kl_tensor *z[3] = {IN(KT_CONTIG, 0, 4), IN(KT_CONTIG, 3, 4), IN(KT_CONTIG, 3)}; /* no rows */
    KT_GRADCHECK(f_linear, NULL, 3, z);
}

/* ---- softmax and the norms ----------------------------------------------------------- */

static kl_tensor *f_softmax(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_softmax(in[0], *(const int *)u);
}
static kl_tensor *f_log_softmax(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_log_softmax(in[0], *(const int *)u);
}

static void grad_softmax(void **state) {
    (void)state;
    kl_manual_seed(6);
    static const int dims[] = {0, 1, -1};
    static const enum kt_layout layouts[] = {KT_CONTIG, KT_TRANSPOSED, KT_STRIDED};
    for (int i = 0; i < 3; i++) {
        kl_tensor *x = in_(KL_SHAPE(2, 3, 4), layouts[i]);
        KT_GRADGRADCHECK(f_softmax, (void *)&dims[i], 1, &x);
        KT_GRADGRADCHECK(f_log_softmax, (void *)&dims[i], 1, &x);
    }
    kl_tensor *v = IN(KT_STRIDED, 5);
    KT_GRADCHECK(f_softmax, (void *)&dims[0], 1, &v);
    KT_GRADCHECK(f_log_softmax, (void *)&dims[2], 1, &v);
    kl_tensor *s = SCALAR(); /* 0-dim: softmax is 1, log_softmax 0 */
    KT_GRADCHECK(f_softmax, (void *)&dims[0], 1, &s);
    KT_GRADCHECK(f_log_softmax, (void *)&dims[2], 1, &s);
    kl_tensor *big = kt_input(KL_SHAPE(3, 4), KT_CONTIG, -30, 30); /* far from 0: exp underflows */
    KT_GRADCHECK(f_softmax, (void *)&dims[2], 1, &big);
    KT_GRADCHECK(f_log_softmax, (void *)&dims[2], 1, &big);
}

typedef struct norm_args {
    int nd, has_w, has_b;
} norm_args;
static kl_tensor *f_layer_norm(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const norm_args *a = u;
    return kl_layer_norm(in[0], a->nd, a->has_w ? in[1] : NULL, a->has_b ? in[1 + a->has_w] : NULL, 1e-5);
}
static kl_tensor *f_rms_norm(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const norm_args *a = u;
    return kl_rms_norm(in[0], a->nd, a->has_w ? in[1] : NULL, 1e-6);
}

static void grad_layer_norm(void **state) {
    (void)state;
    kl_manual_seed(7);
    for (int nd = 1; nd <= 2; nd++)
        for (int w = 0; w < 2; w++)
            for (int b = 0; b < 2; b++) {
                kl_scope_begin();
                norm_args a = {nd, w, b};
                kl_tensor *in[3];
                int n = 0;
                in[n++] = IN(nd == 1 ? KT_STRIDED : KT_TRANSPOSED, 2, 3, 4);
                if (w) in[n++] = nd == 1 ? kt_input(KL_SHAPE(4), KT_CONTIG, 0.5, 1.5) : IN(KT_TRANSPOSED, 3, 4);
                if (b) in[n++] = nd == 1 ? IN(KT_STRIDED, 4) : IN(KT_CONTIG, 3, 4);
                KT_GRADGRADCHECK(f_layer_norm, &a, n, in);
                kl_scope_end();
            }
    norm_args a = {1, 1, 1};
    kl_tensor *v[3] = {IN(KT_CONTIG, 5), IN(KT_CONTIG, 5), IN(KT_CONTIG, 5)}; /* one row */
    KT_GRADCHECK(f_layer_norm, &a, 3, v);
    norm_args all = {3, 0, 0};
    kl_tensor *x = IN(KT_CONTIG, 2, 2, 3);
    KT_GRADCHECK(f_layer_norm, &all, 1, &x);
}

static void grad_rms_norm(void **state) {
    (void)state;
    kl_manual_seed(8);
    for (int nd = 1; nd <= 2; nd++)
        for (int w = 0; w < 2; w++) {
            kl_scope_begin();
            norm_args a = {nd, w, 0};
            kl_tensor *in[2] = {IN(w ? KT_TRANSPOSED : KT_STRIDED, 3, 2, 4),
                                nd == 1 ? IN(KT_CONTIG, 4) : IN(KT_STRIDED, 2, 4)};
            KT_GRADGRADCHECK(f_rms_norm, &a, 1 + w, in);
            kl_scope_end();
        }
}

/* ---- dropout ------------------------------------------------------------------------- */

/* Reseeded at each call so that every evaluation draws the same mask. */
static kl_tensor *f_dropout(void *u, int n, kl_tensor *const *in) {
    (void)n;
    kl_manual_seed(11);
    return kl_dropout(in[0], *(const double *)u, true);
}

static void grad_dropout(void **state) {
    (void)state;
    kl_manual_seed(9);
    double p = 0.4, one = 1;
    kl_tensor *x = kt_input(KL_SHAPE(4, 6), KT_TRANSPOSED, 0.5, 1.5); /* nonzero everywhere */
    KT_GRADGRADCHECK(f_dropout, &p, 1, &x);
    KT_GRADCHECK(f_dropout, &one, 1, &x); /* everything dropped */
    /* the gradient is the mask scaled by 1/(1-p): exactly out / x */
    kl_tensor *y = kl_dropout(x, p, true);
    kl_tensor *g = grad_of(y, kl_ones_like(y), x);
    assert_int_equal(kl_allclose(g, kl_div(y, x), 1e-13, 0, false), 1);
    int64_t kept = 0;
    for (int64_t i = 0; i < 24; i++) {
        double v = kt_get(g, i);
        assert_true(v == 0 || fabs(v - 1 / (1 - p)) < 1e-15);
        kept += v != 0;
    }
    assert_true(kept > 0 && kept < 24);
    /* f32: the mask comes from the f32 stream, and gradients stay f32 */
    kl_tensor *x32 = kl_add_scalar(kl_rand(KL_SHAPE(100), KL_F32), 0.5);
    kl_set_requires_grad(x32, true);
    kl_tensor *y32 = kl_dropout(x32, 0.3, true);
    kl_tensor *g32 = grad_of(y32, kl_ones_like(y32), x32);
    assert_int_equal(kl_dtype_of(g32), KL_F32);
    assert_int_equal(kl_allclose(g32, kl_div(y32, x32), 1e-6, 0, false), 1);
}

/* ---- losses -------------------------------------------------------------------------- */

typedef struct loss_args {
    kl_tensor *target;
    kl_reduction red;
    double ls;
} loss_args;
static kl_tensor *f_cross_entropy(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const loss_args *a = u;
    return kl_cross_entropy(in[0], a->target, a->red, a->ls);
}
static kl_tensor *f_nll_loss(void *u, int n, kl_tensor *const *in) {
    (void)n;
    const loss_args *a = u;
    return kl_nll_loss(in[0], a->target, a->red);
}
static kl_tensor *f_mse_loss(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_mse_loss(in[0], in[1], ((const loss_args *)u)->red);
}
static kl_tensor *f_bce_logits(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_binary_cross_entropy_with_logits(in[0], in[1], ((const loss_args *)u)->red);
}

static const kl_reduction reductions[] = {KL_REDUCE_NONE, KL_REDUCE_MEAN, KL_REDUCE_SUM};

/* Class losses over [N, C] (with an ignored row), [C], [N, C, d1, d2]. */
static void class_loss_cases(kl_grad_fn fn, int with_ls) {
    kl_tensor *t2 = i64_(KL_SHAPE(4), (const int64_t[]){2, -100, 0, 1});
    kl_tensor *t0 = i64_(0, NULL, (const int64_t[]){1});
    kl_tensor *t4 = i64_(KL_SHAPE(2, 2, 3), (const int64_t[]){0, 2, 1, -100, 1, 1, 2, 0, 0, 1, -100, 2});
    static const double smooth[] = {0, 0.25};
    for (int r = 0; r < 3; r++)
        for (int s = 0; s < 1 + with_ls; s++) {
            kl_scope_begin();
            loss_args a = {t2, reductions[r], smooth[s]};
            kl_tensor *x = IN(r == 1 ? KT_TRANSPOSED : KT_CONTIG, 4, 3);
            if (r == 1)
                KT_GRADGRADCHECK(fn, &a, 1, &x);
            else
                KT_GRADCHECK(fn, &a, 1, &x);
            a.target = t0;
            kl_tensor *v = IN(KT_STRIDED, 3);
            KT_GRADCHECK(fn, &a, 1, &v);
            a.target = t4;
            kl_tensor *im = IN(KT_TRANSPOSED, 2, 3, 2, 3);
            KT_GRADCHECK(fn, &a, 1, &im);
            kl_scope_end();
        }
}

static void grad_cross_entropy(void **state) {
    (void)state;
    kl_manual_seed(10);
    class_loss_cases(f_cross_entropy, 1);
    /* PyTorch's values: mean over the rows not ignored, label smoothing 0.2 */
    double xv[12] = {0.1, -0.4, 0.9, 1.2, 0.3, -0.5, 0.0, 0.7, -1.1, -0.3, 0.2, 0.5};
    kl_tensor *x = kl_from_data(xv, KL_SHAPE(4, 3), KL_F64);
    kl_set_requires_grad(x, true);
    kl_tensor *t = i64_(KL_SHAPE(4), (const int64_t[]){2, -100, 0, 1});
    kl_tensor *l = kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0.2);
    kl_tensor *g = grad_of(l, kl_ones_like(l), x);
    static const double want[12] = {0.06476293075856092,  0.030536940000416523, -0.0952998707589774, 0, 0, 0,
                                    -0.18928601921080598, 0.17835332626384617,  0.010932692946959807,
                                    0.04616419601119755,  -0.1761387465204546,  0.12997455050925702};
    expect_values(g, want, 12, 1e-14);
    /* every target ignored: the mean is NaN, the gradient exactly 0 (PyTorch) */
    kl_tensor *ti = i64_(KL_SHAPE(4), (const int64_t[]){-100, -100, -100, -100});
    for (int s = 0; s < 2; s++) {
        kl_tensor *li = kl_cross_entropy(x, ti, KL_REDUCE_MEAN, s * 0.1);
        assert_true(isnan(kl_item(li)));
        kl_tensor *gi = grad_of(li, kl_ones_like(li), x);
        for (int64_t i = 0; i < 12; i++) assert_true(kt_get(gi, i) == 0);
    }
}

static void grad_nll_loss(void **state) {
    (void)state;
    kl_manual_seed(12);
    class_loss_cases(f_nll_loss, 0);
    kl_tensor *x = IN(KT_CONTIG, 2, 3);
    kl_tensor *ti = i64_(KL_SHAPE(2), (const int64_t[]){-100, -100});
    kl_tensor *li = kl_nll_loss(x, ti, KL_REDUCE_MEAN);
    assert_true(isnan(kl_item(li)));
    kl_tensor *gi = grad_of(li, kl_ones_like(li), x);
    for (int64_t i = 0; i < 6; i++) assert_true(kt_get(gi, i) == 0);
    /* sum: -1 at each target */
    kl_tensor *t = i64_(KL_SHAPE(2), (const int64_t[]){2, -100});
    kl_tensor *ls = kl_nll_loss(x, t, KL_REDUCE_SUM);
    static const double want[6] = {0, 0, -1, 0, 0, 0};
    expect_values(grad_of(ls, kl_ones_like(ls), x), want, 6, 0);
}

/* kl_cross_entropy_ex / kl_nll_loss_ex: in[0] = x, then (probabilities) the
 * target and the weight when they are gradchecked too. */
typedef struct ce_ex_args {
    kl_tensor *target, *weight; /* used when not among the inputs */
    kl_cross_entropy_options o;
    int nll;
} ce_ex_args;
static kl_tensor *f_class_loss_ex(void *u, int n, kl_tensor *const *in) {
    const ce_ex_args *a = u;
    kl_cross_entropy_options o = a->o;
    o.weight = n > 2 ? in[2] : a->weight;
    kl_tensor *t = n > 1 ? in[1] : a->target;
    return a->nll ? kl_nll_loss_ex(in[0], t, &o) : kl_cross_entropy_ex(in[0], t, &o);
}

/* Every combination of reduction, weight, ignore_index (the default and a
 * class) and label smoothing over [N, C] (one row ignored), [C] and
 * [N, C, d1, d2]; probabilities with and without weight and smoothing, with
 * the target and weight gradchecked too. */
static void grad_class_loss_options(void **state) {
    (void)state;
    kl_manual_seed(14);
    kl_tensor *w = kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F64), 0.5);
    kl_tensor *t2 = i64_(KL_SHAPE(4), (const int64_t[]){2, 1, 0, 1});
    kl_tensor *t0 = i64_(0, NULL, (const int64_t[]){2});
    kl_tensor *t4 = i64_(KL_SHAPE(2, 2, 3), (const int64_t[]){0, 2, 1, 1, 1, 1, 2, 0, 0, 1, 1, 2});
    static const double smooth[] = {0, 0.25};
    static const int64_t ignore[] = {-100, 1};
    for (int nll = 0; nll < 2; nll++)
        for (int r = 0; r < 3; r++)
            for (int hw = 0; hw < 2; hw++)
                for (int ig = 0; ig < 2; ig++)
                    for (int s = 0; s < 2 - nll; s++) {
                        kl_scope_begin();
                        ce_ex_args a = {t2, hw ? w : NULL, kl_cross_entropy_options_default(), nll};
                        a.o.reduction = reductions[r];
                        a.o.ignore_index = ignore[ig];
                        a.o.label_smoothing = smooth[s];
                        kl_tensor *x = IN(r == 1 ? KT_TRANSPOSED : KT_CONTIG, 4, 3);
                        if (r == 1 && hw)
                            KT_GRADGRADCHECK(f_class_loss_ex, &a, 1, &x);
                        else
                            KT_GRADCHECK(f_class_loss_ex, &a, 1, &x);
                        a.target = t0;
                        kl_tensor *v = IN(KT_STRIDED, 3);
                        KT_GRADCHECK(f_class_loss_ex, &a, 1, &v);
                        a.target = t4;
                        kl_tensor *im = IN(KT_TRANSPOSED, 2, 3, 2, 3);
                        KT_GRADCHECK(f_class_loss_ex, &a, 1, &im);
                        kl_scope_end();
                    }
    for (int r = 0; r < 3; r++)
        for (int hw = 0; hw < 2; hw++)
            for (int s = 0; s < 2; s++) {
                kl_scope_begin();
                ce_ex_args a = {NULL, NULL, kl_cross_entropy_options_default(), 0};
                a.o.reduction = reductions[r];
                a.o.label_smoothing = smooth[s];
                kl_tensor *in2[3] = {IN(KT_CONTIG, 4, 3), kt_input(KL_SHAPE(4, 3), KT_TRANSPOSED, 0, 1),
                                     kt_input(KL_SHAPE(3), KT_CONTIG, 0.5, 1.5)};
                if (r == 1)
                    KT_GRADGRADCHECK(f_class_loss_ex, &a, 2 + hw, in2);
                else
                    KT_GRADCHECK(f_class_loss_ex, &a, 2 + hw, in2);
                kl_tensor *in4[3] = {IN(KT_TRANSPOSED, 2, 3, 2, 2), kt_input(KL_SHAPE(2, 3, 2, 2), KT_CONTIG, 0, 1),
                                     kt_input(KL_SHAPE(3), KT_STRIDED, 0.5, 1.5)};
                KT_GRADCHECK(f_class_loss_ex, &a, 2 + hw, in4);
                kl_tensor *in1[3] = {IN(KT_CONTIG, 3), kt_input(KL_SHAPE(3), KT_CONTIG, 0, 1),
                                     kt_input(KL_SHAPE(3), KT_CONTIG, 0.5, 1.5)};
                KT_GRADCHECK(f_class_loss_ex, &a, 2 + hw, in1);
                kl_scope_end();
            }
    /* a weight that requires grad with class indices: backward refuses (PyTorch has no formula) */
    for (int nll = 0; nll < 2; nll++) {
        kl_tensor *x = IN(KT_CONTIG, 4, 3), *wg = kt_input(KL_SHAPE(3), KT_CONTIG, 0.5, 1.5);
        kl_cross_entropy_options o = kl_cross_entropy_options_default();
        o.weight = wg;
        kl_tensor *l = nll ? kl_nll_loss_ex(x, t2, &o) : kl_cross_entropy_ex(x, t2, &o);
        assert_non_null(l);
        assert_int_equal(kl_backward(l, NULL, NULL), -1);
        KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, nll ? "kl_nll_loss: is not differentiable with respect to weight"
                                                : "kl_cross_entropy: is not differentiable with respect to weight");
    }
}

static void grad_mse_loss(void **state) {
    (void)state;
    kl_manual_seed(13);
    for (int r = 0; r < 3; r++) {
        kl_scope_begin();
        loss_args a = {NULL, reductions[r], 0};
        kl_tensor *in[2] = {IN(KT_TRANSPOSED, 3, 4), IN(KT_STRIDED, 3, 4)};
        KT_GRADGRADCHECK(f_mse_loss, &a, 2, in);
        kl_tensor *bc[2] = {IN(KT_CONTIG, 2, 1, 4), IN(KT_CONTIG, 3, 1)}; /* broadcast operands */
        KT_GRADGRADCHECK(f_mse_loss, &a, 2, bc);
        kl_tensor *s[2] = {SCALAR(), IN(KT_CONTIG, 3)};
        KT_GRADCHECK(f_mse_loss, &a, 2, s);
        kl_scope_end();
    }
}

static void grad_bce_logits(void **state) {
    (void)state;
    kl_manual_seed(14);
    for (int r = 0; r < 3; r++) {
        kl_scope_begin();
        loss_args a = {NULL, reductions[r], 0};
        kl_tensor *in[2] = {kt_input(KL_SHAPE(3, 4), KT_TRANSPOSED, -4, 4), kt_input(KL_SHAPE(3, 4), KT_STRIDED, 0, 1)};
        KT_GRADGRADCHECK(f_bce_logits, &a, 2, in);
        kl_tensor *s[2] = {SCALAR(), kt_input(0, NULL, KT_CONTIG, 0, 1)};
        KT_GRADCHECK(f_bce_logits, &a, 2, s);
        kl_scope_end();
    }
}

/* ---- convolution and pooling ---------------------------------------------------------- */

typedef struct conv_case {
    int nx;
    int64_t x[4], w[4];
    kl_conv2d_options o;
    int bias;
} conv_case;
static kl_tensor *f_conv2d(void *u, int n, kl_tensor *const *in) {
    const conv_case *c = u;
    return kl_conv2d(in[0], in[1], n > 2 ? in[2] : NULL, &c->o);
}
#define CONV_OPTS(sh, sw, ph, pw, dh, dw, g) {{sh, sw}, {ph, pw}, {dh, dw}, g}

static const conv_case conv_cases[] = {
    {4, {2, 3, 5, 6}, {4, 3, 3, 2}, CONV_OPTS(1, 1, 0, 0, 1, 1, 1), 1},  /* plain */
    {4, {1, 2, 7, 6}, {3, 2, 3, 3}, CONV_OPTS(2, 2, 1, 1, 1, 1, 1), 0},  /* stride 2, padding */
    {4, {2, 2, 8, 7}, {2, 2, 2, 3}, CONV_OPTS(2, 3, 1, 0, 2, 1, 1), 1},  /* mixed stride/dilation */
    {4, {1, 4, 5, 5}, {6, 2, 2, 2}, CONV_OPTS(1, 1, 1, 1, 1, 1, 2), 1},  /* groups */
    {3, {2, 6, 5}, {3, 2, 2, 2}, CONV_OPTS(2, 1, 0, 1, 1, 1, 1), 1},     /* unbatched */
    {4, {2, 3, 3, 4}, {2, 3, 1, 1}, CONV_OPTS(1, 1, 0, 0, 1, 1, 1), 0},  /* 1x1: the direct path */
    {4, {1, 2, 3, 2}, {2, 2, 1, 2}, CONV_OPTS(1, 2, 3, 2, 1, 1, 1), 1},  /* padding beyond the kernel */
    {4, {1, 3, 7, 7}, {3, 1, 2, 3}, CONV_OPTS(2, 2, 1, 2, 2, 2, 3), 0},  /* depthwise, dilated, strided */
    {4, {2, 4, 6, 5}, {4, 2, 3, 2}, CONV_OPTS(3, 2, 2, 1, 1, 2, 2), 1},  /* groups with stride 3 */
    {4, {3, 1, 6, 19}, {3, 1, 3, 3}, CONV_OPTS(1, 1, 0, 0, 1, 1, 1), 1}, /* one channel: the direct weight gradient */
};

static void grad_conv2d(void **state) {
    (void)state;
    kl_manual_seed(15);
    static const enum kt_layout layouts[] = {KT_CONTIG, KT_TRANSPOSED, KT_STRIDED};
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        kl_scope_begin();
        const conv_case *c = &conv_cases[i];
        kl_tensor *in[3] = {in_(c->nx, c->x, layouts[i % 3]), in_(4, c->w, layouts[(i + 1) % 3]),
                            IN(KT_CONTIG, c->w[0])};
        KT_GRADCHECK(f_conv2d, (void *)c, 2 + c->bias, in);
        kl_scope_end();
    }
    /* second order: gradients of the gradients are conv2d's again */
    for (size_t i = 1; i < 4; i += 2) {
        kl_scope_begin();
        const conv_case *c = &conv_cases[i];
        kl_tensor *in[3] = {in_(c->nx, c->x, KT_CONTIG), in_(4, c->w, KT_CONTIG), IN(KT_CONTIG, c->w[0])};
        KT_GRADGRADCHECK(f_conv2d, (void *)c, 2 + c->bias, in);
        kl_scope_end();
    }
    /* no input channels: the output is the bias */
    conv_case e = {4, {2, 0, 3, 3}, {2, 0, 2, 2}, CONV_OPTS(1, 1, 0, 0, 1, 1, 1), 1};
    kl_tensor *in[3] = {IN(KT_CONTIG, 2, 0, 3, 3), IN(KT_CONTIG, 2, 0, 2, 2), IN(KT_CONTIG, 2)};
    KT_GRADCHECK(f_conv2d, &e, 3, in);
}

static kl_tensor *f_max_pool2d(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_max_pool2d(in[0], u);
}
static kl_tensor *f_avg_pool2d(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_avg_pool2d(in[0], u);
}

typedef struct pool_case {
    int nx;
    int64_t x[4];
    kl_pool2d_options o;
} pool_case;
#define POOL_OPTS(kh, kw, sh, sw, ph, pw, dh, dw, ceil, cip) {{kh, kw}, {sh, sw}, {ph, pw}, {dh, dw}, ceil, cip}

static const pool_case pool_cases[] = {
    {4, {2, 2, 4, 6}, POOL_OPTS(2, 2, 2, 2, 0, 0, 1, 1, false, true)},  /* plain */
    {4, {1, 2, 5, 5}, POOL_OPTS(3, 3, 2, 2, 1, 1, 1, 1, false, true)},  /* padding, counted */
    {4, {1, 2, 5, 5}, POOL_OPTS(3, 3, 2, 2, 1, 1, 1, 1, false, false)}, /* padding, not counted */
    {3, {2, 5, 6}, POOL_OPTS(2, 3, 2, 2, 1, 1, 1, 1, true, true)},      /* ceil_mode, unbatched */
    {3, {2, 5, 6}, POOL_OPTS(2, 3, 2, 2, 1, 1, 1, 1, true, false)},
    {4, {1, 1, 6, 5}, POOL_OPTS(3, 2, 1, 1, 1, 0, 1, 1, false, true)},  /* overlapping windows */
    {4, {2, 1, 4, 4}, POOL_OPTS(4, 4, 4, 4, 0, 0, 1, 1, false, true)},  /* global */
    {4, {1, 2, 6, 18}, POOL_OPTS(2, 2, 2, 2, 0, 0, 1, 1, false, true)}, /* 2x2 rows of 9: a block, then a row's end */
    {4, {2, 1, 5, 7}, POOL_OPTS(2, 2, 2, 2, 0, 0, 1, 1, false, true)},  /* 2x2, odd sizes */
};

static void grad_pool2d(void **state) {
    (void)state;
    kl_manual_seed(16);
    static const enum kt_layout layouts[] = {KT_CONTIG, KT_TRANSPOSED, KT_STRIDED};
    for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) {
        kl_scope_begin();
        const pool_case *p = &pool_cases[i];
        kl_tensor *x = in_(p->nx, p->x, layouts[i % 3]);
        KT_GRADCHECK(f_max_pool2d, (void *)&p->o, 1, &x);
        KT_GRADCHECK(f_avg_pool2d, (void *)&p->o, 1, &x);
        kl_scope_end();
    }
    /* an empty plane: windows only see padding (outputs -inf / 0), no gradient */
    kl_pool2d_options pe = POOL_OPTS(2, 2, 1, 1, 1, 1, 1, 1, false, true);
    kl_tensor *xe = IN(KT_CONTIG, 1, 2, 0, 3);
    KT_GRADCHECK(f_max_pool2d, &pe, 1, &xe);
    KT_GRADCHECK(f_avg_pool2d, &pe, 1, &xe);
    /* dilated max pooling */
    kl_pool2d_options d = POOL_OPTS(2, 3, 1, 2, 1, 1, 2, 2, true, true);
    kl_tensor *x = IN(KT_TRANSPOSED, 1, 2, 6, 7);
    KT_GRADCHECK(f_max_pool2d, &d, 1, &x);
    /* second order: avg pooling's gradient is linear in g (a convolution),
     * max pooling's a scatter whose own gradient is a gather */
    kl_tensor *y = IN(KT_CONTIG, 1, 2, 5, 5);
    KT_GRADGRADCHECK(f_avg_pool2d, (void *)&pool_cases[2].o, 1, &y);
    KT_GRADGRADCHECK(f_max_pool2d, (void *)&pool_cases[1].o, 1, &y);
}

/* PyTorch's choices: the first maximum of a window gets the gradient, a NaN
 * takes over from anything before it (so the last NaN), and a window that
 * sees no element of x (dilation past the padding) sends nothing back. */
static void grad_max_pool2d_conventions(void **state) {
    (void)state;
    double v[16] = {1, 1, 2, 2, 1, 1, 2, 0, 3, 3, NAN, NAN, 3, 3, 0, 1};
    kl_tensor *x = kl_from_data(v, KL_SHAPE(1, 4, 4), KL_F64);
    kl_set_requires_grad(x, true);
    kl_pool2d_options o = POOL_OPTS(2, 2, 1, 1, 0, 0, 1, 1, false, true);
    kl_tensor *y = kl_max_pool2d(x, &o);
    kl_tensor *g = grad_of(y, kl_reshape(kl_arange(1, 10, 1, KL_F64), KL_SHAPE(1, 3, 3)), x);
    static const double want[16] = {1, 0, 5, 0, 0, 0, 0, 0, 11, 0, 13, 15, 0, 0, 0, 0};
    expect_values(g, want, 16, 0);
    /* f32 picks the same positions */
    kl_tensor *x32 = kl_to_dtype(kl_detach(x), KL_F32);
    kl_set_requires_grad(x32, true);
    kl_tensor *y32 = kl_max_pool2d(x32, &o);
    expect_values(grad_of(y32, kl_reshape(kl_arange(1, 10, 1, KL_F32), KL_SHAPE(1, 3, 3)), x32), want, 16, 0);
    /* -inf everywhere: the first in-range element of each window */
    kl_tensor *ninf = kl_full(KL_SHAPE(1, 3, 3), -INFINITY, KL_F64);
    kl_set_requires_grad(ninf, true);
    kl_pool2d_options p = POOL_OPTS(2, 2, 2, 2, 1, 1, 1, 1, false, true);
    kl_tensor *yn = kl_max_pool2d(ninf, &p); /* rows {0}, {1, 2} by cols {0}, {1, 2} */
    static const double want_n[9] = {1, 2, 0, 3, 4, 0, 0, 0, 0};
    expect_values(grad_of(yn, kl_reshape(kl_arange(1, 5, 1, KL_F64), KL_SHAPE(1, 2, 2)), ninf), want_n, 9, 0);
    /* k 2, padding 1, dilation 3 on 2x2: the one window's taps are -1 and 2 */
    kl_tensor *z = kl_from_data((const double[]){1, 2, 3, 4}, KL_SHAPE(1, 2, 2), KL_F64);
    kl_set_requires_grad(z, true);
    kl_pool2d_options e = POOL_OPTS(2, 2, 1, 1, 1, 1, 3, 3, false, true);
    kl_tensor *ye = kl_max_pool2d(z, &e);
    assert_int_equal(kl_numel(ye), 1);
    assert_true(isinf(kt_get(ye, 0)) && kt_get(ye, 0) < 0);
    static const double zero[4] = {0, 0, 0, 0};
    expect_values(grad_of(ye, kl_ones_like(ye), z), zero, 4, 0);
}

/* avg pooling's divisors, against PyTorch: ceil_mode with and without the
 * padding counted. */
static void grad_avg_pool2d_divisors(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(1, 1, 3, 3), KL_F64);
    kl_set_requires_grad(x, true);
    kl_pool2d_options o = POOL_OPTS(2, 2, 2, 2, 1, 1, 1, 1, true, false);
    kl_tensor *y = kl_avg_pool2d(x, &o); /* windows of 1, 2 / 2, 4 elements */
    kl_tensor *g = grad_of(y, kl_ones_like(y), x);
    static const double want[9] = {1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.5, 0.25, 0.25};
    expect_values(g, want, 9, 1e-15);
    o.count_include_pad = true;
    y = kl_avg_pool2d(x, &o);
    g = grad_of(y, kl_ones_like(y), x);
    static const double want_c[9] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    expect_values(g, want_c, 9, 1e-15);
}

/* ---- attention ------------------------------------------------------------------------ */

typedef struct sdpa_args {
    kl_tensor *mask; /* bool mask, or NULL (a float mask is an input) */
    bool causal;
    double scale;
} sdpa_args;
static kl_tensor *f_sdpa(void *u, int n, kl_tensor *const *in) {
    const sdpa_args *a = u;
    return kl_scaled_dot_product_attention(in[0], in[1], in[2], n > 3 ? in[3] : a->mask, a->causal, a->scale);
}

static void grad_sdpa(void **state) {
    (void)state;
    kl_manual_seed(17);
    sdpa_args plain = {NULL, false, 0};
    kl_tensor *a[3] = {IN(KT_CONTIG, 2, 3, 4), IN(KT_TRANSPOSED, 2, 5, 4), IN(KT_STRIDED, 2, 5, 3)};
    KT_GRADCHECK(f_sdpa, &plain, 3, a);
    sdpa_args causal = {NULL, true, 0.7};
    kl_tensor *b[3] = {IN(KT_CONTIG, 4, 3), IN(KT_CONTIG, 4, 3), IN(KT_CONTIG, 4, 2)};
    KT_GRADGRADCHECK(f_sdpa, &causal, 3, b);
    /* causal_attention's query blocks (32 rows): L and S past one block and not multiples
     * of it, L < S and L > S, the q/k/v views of a [B, T, H, D] layout */
    kl_tensor *e[3] = {IN(KT_TRANSPOSED, 2, 37, 3), IN(KT_STRIDED, 2, 40, 3), IN(KT_CONTIG, 2, 40, 2)};
    KT_GRADCHECK(f_sdpa, &causal, 3, e);
    kl_tensor *f[3] = {IN(KT_CONTIG, 41, 2), IN(KT_TRANSPOSED, 35, 2), IN(KT_CONTIG, 35, 3)};
    KT_GRADCHECK(f_sdpa, &causal, 3, f);
    kl_tensor *h[3] = {IN(KT_CONTIG, 33, 2), IN(KT_CONTIG, 33, 2), IN(KT_CONTIG, 33, 2)};
    KT_GRADGRADCHECK(f_sdpa, &causal, 3, h);
    uint8_t keep[15] = {1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0};
    kl_tensor *m = kl_from_data(keep, KL_SHAPE(3, 5), KL_BOOL);
    sdpa_args masked = {m, false, 0};
    kl_tensor *c3[3] = {IN(KT_CONTIG, 2, 1, 3, 4), IN(KT_CONTIG, 3, 5, 4), IN(KT_CONTIG, 1, 5, 2)}; /* broadcast */
    KT_GRADCHECK(f_sdpa, &masked, 3, c3);
    kl_tensor *d[4] = {IN(KT_CONTIG, 3, 4), IN(KT_CONTIG, 5, 4), IN(KT_CONTIG, 5, 2), IN(KT_STRIDED, 3, 5)};
    KT_GRADCHECK(f_sdpa, &plain, 4, d); /* float mask: it gets a gradient too */
}

/* ---- other dtypes ---------------------------------------------------------------------- */

/* Gradients of sum(fn(inputs)) in dt against the same in f64. */
static void expect_dtype_grads(kl_grad_fn fn, void *user, int n, kl_tensor *const *in64, kl_dtype dt, double tol) {
    kl_tensor *in[4], *g64[4], *g[4];
    for (int i = 0; i < n; i++) {
        in[i] = kl_to_dtype(kl_detach(in64[i]), dt);
        kl_set_requires_grad(in[i], true);
    }
    kl_tensor *y64 = fn(user, n, in64), *y = fn(user, n, in);
    kl_tensor *w64 = kl_ones_like(y64), *w = kl_ones_like(y);
    assert_int_equal(kl_autograd_grad(1, &y64, &w64, n, in64, g64, NULL), 0);
    assert_int_equal(kl_autograd_grad(1, &y, &w, n, in, g, NULL), 0);
    for (int i = 0; i < n; i++) {
        assert_int_equal(kl_dtype_of(g[i]), dt);
        if (kl_allclose(kl_to_dtype(g[i], KL_F64), g64[i], tol, tol, false) != 1)
            fail_msg("gradient of input %d differs in %s", i, kl_dtype_name(dt));
    }
}

static void grad_nn_other_dtypes(void **state) {
    (void)state;
    kl_manual_seed(18);
    static const kl_dtype dts[] = {KL_F32, KL_BF16};
    static const double tols[] = {1e-4, 5e-2};
    for (int k = 0; k < 2; k++) {
        kl_scope_begin();
        kl_dtype dt = dts[k];
        double tol = tols[k];
        kl_tensor *mm[2] = {IN(KT_CONTIG, 2, 3, 4), IN(KT_TRANSPOSED, 4, 5)};
        expect_dtype_grads(f_matmul, NULL, 2, mm, dt, tol);
        kl_tensor *lin[3] = {IN(KT_CONTIG, 3, 4), IN(KT_CONTIG, 2, 4), IN(KT_CONTIG, 2)};
        expect_dtype_grads(f_linear, NULL, 3, lin, dt, tol);
        int dim = -1;
        kl_tensor *x = IN(KT_CONTIG, 3, 5);
        expect_dtype_grads(f_log_softmax, &dim, 1, &x, dt, tol);
        norm_args na = {1, 1, 1};
        kl_tensor *ln[3] = {IN(KT_CONTIG, 3, 5), IN(KT_CONTIG, 5), IN(KT_CONTIG, 5)};
        expect_dtype_grads(f_layer_norm, &na, 3, ln, dt, tol);
        loss_args ce = {i64_(KL_SHAPE(3), (const int64_t[]){4, -100, 0}), KL_REDUCE_MEAN, 0.1};
        expect_dtype_grads(f_cross_entropy, &ce, 1, &x, dt, tol);
        const conv_case *cc = &conv_cases[8];
        kl_tensor *cv[3] = {in_(cc->nx, cc->x, KT_CONTIG), in_(4, cc->w, KT_CONTIG), IN(KT_CONTIG, cc->w[0])};
        expect_dtype_grads(f_conv2d, (void *)cc, 3, cv, dt, tol);
        const pool_case *pc = &pool_cases[4];
        kl_tensor *px = in_(pc->nx, pc->x, KT_CONTIG);
        expect_dtype_grads(f_max_pool2d, (void *)&pc->o, 1, &px, dt, tol);
        expect_dtype_grads(f_avg_pool2d, (void *)&pc->o, 1, &px, dt, tol);
        kl_scope_end();
    }
}

/* ---- issue 16's layers ------------------------------------------------------------------ */

/* batch_norm: inputs x[, weight][, bias]; the running buffers (f64 [C], no
 * grad) live in the args. Training with buffers updates them at every call,
 * outside autograd, which must leave the gradients alone. */
typedef struct bn_args {
    bool training;
    int w, b;
    kl_tensor *rm, *rv;
} bn_args;
static kl_tensor *f_batch_norm(void *u, int n, kl_tensor *const *in) {
    const bn_args *a = u;
    (void)n;
    kl_tensor *w = a->w ? in[1] : NULL, *b = a->b ? in[1 + a->w] : NULL;
    return kl_batch_norm(in[0], a->rm, a->rv, w, b, a->training, 0.1, 1e-5);
}

static void grad_batch_norm(void **state) {
    (void)state;
    kl_manual_seed(21);
    static const int64_t shapes[3][4] = {{3, 2, 0, 0}, {2, 3, 4, 0}, {2, 2, 3, 2}};
    for (int s = 0; s < 3; s++)
        for (int mode = 0; mode < 3; mode++) { /* training, training with buffers, eval */
            kl_scope_begin();
            int nd = s + 2;
            int64_t C = shapes[s][1];
            bn_args a = {mode < 2, (s + mode) % 2 == 0 || mode == 2, s != 1, NULL, NULL};
            if (mode > 0) {
                a.rm = kt_input(KL_SHAPE(C), KT_CONTIG, -1, 1);
                a.rv = kt_input(KL_SHAPE(C), KT_CONTIG, 0.5, 2);
                kl_set_requires_grad(a.rm, false);
                kl_set_requires_grad(a.rv, false);
            }
            kl_tensor *in[3];
            int n = 0;
            in[n++] = in_(nd, shapes[s], s == 1 ? KT_TRANSPOSED : KT_CONTIG);
            if (a.w) in[n++] = kt_input(KL_SHAPE(C), KT_CONTIG, 0.5, 1.5);
            if (a.b) in[n++] = IN(KT_CONTIG, C);
            KT_GRADGRADCHECK(f_batch_norm, &a, n, in);
            kl_scope_end();
        }
}

typedef struct gn_args {
    int64_t groups;
    int w, b;
} gn_args;
static kl_tensor *f_group_norm(void *u, int n, kl_tensor *const *in) {
    const gn_args *a = u;
    (void)n;
    return kl_group_norm(in[0], a->groups, a->w ? in[1] : NULL, a->b ? in[1 + a->w] : NULL, 1e-5);
}

static void grad_group_norm(void **state) {
    (void)state;
    kl_manual_seed(22);
    static const struct {
        int nd;
        int64_t x[4], groups;
        int w, b;
    } cases[] = {{4, {2, 4, 3, 2}, 2, 1, 1}, {3, {2, 6, 3}, 3, 0, 0}, {2, {3, 4}, 2, 1, 0}, {4, {1, 3, 2, 2}, 1, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kl_scope_begin();
        gn_args a = {cases[i].groups, cases[i].w, cases[i].b};
        kl_tensor *in[3];
        int n = 0;
        in[n++] = in_(cases[i].nd, cases[i].x, i % 2 ? KT_TRANSPOSED : KT_CONTIG);
        if (a.w) in[n++] = kt_input(KL_SHAPE(cases[i].x[1]), KT_CONTIG, 0.5, 1.5);
        if (a.b) in[n++] = IN(KT_CONTIG, cases[i].x[1]);
        KT_GRADGRADCHECK(f_group_norm, &a, n, in);
        kl_scope_end();
    }
}

static kl_tensor *f_adaptive(void *u, int n, kl_tensor *const *in) {
    const int64_t *o = u;
    (void)n;
    return kl_adaptive_avg_pool2d(in[0], o[0], o[1]);
}

static void grad_adaptive_avg_pool2d(void **state) {
    (void)state;
    kl_manual_seed(23);
    static const struct {
        int nd;
        int64_t x[4], o[2];
    } cases[] = {{4, {2, 2, 7, 5}, {3, 2}}, {3, {2, 4, 4}, {2, 2}}, {4, {1, 2, 3, 3}, {5, 4}}, {4, {1, 1, 5, 6}, {1, 1}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kl_scope_begin();
        kl_tensor *x = in_(cases[i].nd, cases[i].x, i % 2 ? KT_STRIDED : KT_CONTIG);
        KT_GRADGRADCHECK(f_adaptive, (void *)cases[i].o, 1, &x);
        kl_scope_end();
    }
}

static kl_tensor *f_interpolate(void *u, int n, kl_tensor *const *in) {
    (void)n;
    return kl_interpolate(in[0], u);
}

/* nearest, linear and bilinear, up and down, sizes and scale factors. */
static void grad_interpolate(void **state) {
    (void)state;
    kl_manual_seed(26);
    static const struct {
        int nd;
        int64_t x[4], size[2];
        double sf[2];
        kl_interp_mode mode;
        bool align;
    } cases[] = {{4, {1, 2, 3, 4}, {5, 7}, {0, 0}, KL_INTERP_BILINEAR, false},
                 {4, {1, 2, 5, 4}, {3, 6}, {0, 0}, KL_INTERP_BILINEAR, true},
                 {4, {2, 1, 4, 3}, {0, 0}, {1.5, 0.6}, KL_INTERP_BILINEAR, false},
                 {3, {2, 2, 5}, {8, 0}, {0, 0}, KL_INTERP_LINEAR, true},
                 {3, {1, 3, 6}, {0, 0}, {0.5, 0}, KL_INTERP_LINEAR, false},
                 {4, {1, 2, 3, 3}, {5, 2}, {0, 0}, KL_INTERP_NEAREST, false},
                 {3, {2, 2, 4}, {0, 0}, {1.7, 0}, KL_INTERP_NEAREST, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kl_scope_begin();
        kl_interpolate_options o = kl_interpolate_options_default();
        o.size[0] = cases[i].size[0], o.size[1] = cases[i].size[1];
        o.scale_factor[0] = cases[i].sf[0], o.scale_factor[1] = cases[i].sf[1];
        o.mode = cases[i].mode, o.align_corners = cases[i].align;
        kl_tensor *x = in_(cases[i].nd, cases[i].x, i % 2 ? KT_STRIDED : KT_CONTIG);
        KT_GRADGRADCHECK(f_interpolate, &o, 1, &x);
        kl_scope_end();
    }
}

static kl_tensor *f_prelu(void *u, int n, kl_tensor *const *in) {
    (void)u, (void)n;
    return kl_prelu(in[0], in[1]);
}

static void grad_prelu(void **state) {
    (void)state;
    kl_manual_seed(27);
    static const struct {
        int nd;
        int64_t x[4], nw;
    } cases[] = {{4, {2, 3, 2, 2}, 3}, {4, {2, 3, 2, 2}, 1}, {2, {4, 3}, 3}, {1, {5}, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kl_scope_begin();
        kl_tensor *in[2] = {in_(cases[i].nd, cases[i].x, i % 2 ? KT_TRANSPOSED : KT_CONTIG),
                            kt_input(KL_SHAPE(cases[i].nw), KT_CONTIG, -0.5, 0.5)};
        KT_GRADGRADCHECK(f_prelu, NULL, 2, in);
        kl_scope_end();
    }
}

/* Reseeded at each call so that every evaluation draws the same planes. */
static kl_tensor *f_dropout2d(void *u, int n, kl_tensor *const *in) {
    (void)n;
    kl_manual_seed(12);
    return kl_dropout2d(in[0], *(const double *)u, true);
}

static void grad_dropout2d(void **state) {
    (void)state;
    kl_manual_seed(24);
    double p = 0.5, one = 1;
    kl_tensor *x = kt_input(KL_SHAPE(3, 4, 2, 3), KT_CONTIG, 0.5, 1.5); /* nonzero everywhere */
    KT_GRADGRADCHECK(f_dropout2d, &p, 1, &x);
    KT_GRADCHECK(f_dropout2d, &one, 1, &x);
    /* the gradient is each plane's mask, 0 or 1/(1-p) over the whole plane */
    kl_tensor *y = kl_dropout2d(x, p, true);
    kl_tensor *g = grad_of(y, kl_ones_like(y), x);
    int kept = 0;
    for (int64_t pl = 0; pl < 12; pl++) {
        double v0 = kt_get(g, pl * 6);
        assert_true(v0 == 0 || v0 == 2);
        for (int64_t j = 1; j < 6; j++) assert_true(kt_get(g, pl * 6 + j) == v0);
        kept += v0 != 0;
    }
    assert_true(kept > 0 && kept < 12);
}

typedef struct conv1d_case {
    int nx;
    int64_t x[3], w[3];
    kl_conv1d_options o;
    int bias;
} conv1d_case;
static kl_tensor *f_conv1d(void *u, int n, kl_tensor *const *in) {
    const conv1d_case *c = u;
    return kl_conv1d(in[0], in[1], n > 2 ? in[2] : NULL, &c->o);
}

typedef struct convt_case {
    int nx;
    int64_t x[4], w[4];
    kl_conv_transpose2d_options o;
    int bias;
} convt_case;
static kl_tensor *f_conv_transpose2d(void *u, int n, kl_tensor *const *in) {
    const convt_case *c = u;
    return kl_conv_transpose2d(in[0], in[1], n > 2 ? in[2] : NULL, &c->o);
}

/* conv1d and conv_transpose2d are implicit (conv2d underneath): these check
 * that the pieces they record differentiate to the right thing. */
static void grad_conv1d_transpose2d(void **state) {
    (void)state;
    kl_manual_seed(25);
    static const conv1d_case c1[] = {
        {3, {2, 3, 7}, {4, 3, 3}, {1, 0, 1, 1}, 1},
        {3, {1, 4, 9}, {6, 2, 2}, {2, 1, 2, 2}, 0},
        {2, {3, 6}, {2, 3, 3}, {1, 2, 1, 1}, 1},
    };
    for (size_t i = 0; i < sizeof c1 / sizeof c1[0]; i++) {
        kl_scope_begin();
        kl_tensor *in[3] = {in_(c1[i].nx, c1[i].x, i % 2 ? KT_TRANSPOSED : KT_CONTIG), in_(3, c1[i].w, KT_CONTIG),
                            IN(KT_CONTIG, c1[i].w[0])};
        KT_GRADGRADCHECK(f_conv1d, (void *)&c1[i], 2 + c1[i].bias, in);
        kl_scope_end();
    }
    static const convt_case ct[] = {
        {4, {2, 3, 3, 4}, {3, 2, 3, 2}, {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1}, 1},
        {4, {1, 4, 3, 3}, {4, 3, 2, 3}, {{2, 2}, {1, 1}, {1, 1}, {1, 1}, 2}, 0},
        {4, {1, 2, 3, 2}, {2, 2, 3, 3}, {{2, 3}, {1, 0}, {1, 2}, {1, 1}, 1}, 1},
        {3, {2, 3, 3}, {2, 1, 2, 2}, {{1, 1}, {1, 1}, {1, 0}, {2, 2}, 1}, 1},
    };
    for (size_t i = 0; i < sizeof ct / sizeof ct[0]; i++) {
        kl_scope_begin();
        kl_tensor *in[3] = {in_(ct[i].nx, ct[i].x, i % 2 ? KT_STRIDED : KT_CONTIG), in_(4, ct[i].w, KT_CONTIG),
                            IN(KT_CONTIG, ct[i].w[1] * ct[i].o.groups)};
        KT_GRADGRADCHECK(f_conv_transpose2d, (void *)&ct[i], 2 + ct[i].bias, in);
        kl_scope_end();
    }
}

const struct CMUnitTest kt_grad_nn_tests[] = {
    KT_TEST(grad_matmul),
    KT_TEST(grad_matmul_one_side),
    KT_TEST(grad_matmul_layout),
    KT_TEST(grad_mm_bmm),
    KT_TEST(grad_addmm),
    KT_TEST(grad_linear),
    KT_TEST(grad_softmax),
    KT_TEST(grad_layer_norm),
    KT_TEST(grad_rms_norm),
    KT_TEST(grad_dropout),
    KT_TEST(grad_cross_entropy),
    KT_TEST(grad_nll_loss),
    KT_TEST(grad_class_loss_options),
    KT_TEST(grad_mse_loss),
    KT_TEST(grad_bce_logits),
    KT_TEST(grad_conv2d),
    KT_TEST(grad_pool2d),
    KT_TEST(grad_max_pool2d_conventions),
    KT_TEST(grad_avg_pool2d_divisors),
    KT_TEST(grad_sdpa),
    KT_TEST(grad_nn_other_dtypes),
    KT_TEST(grad_batch_norm),
    KT_TEST(grad_group_norm),
    KT_TEST(grad_adaptive_avg_pool2d),
    KT_TEST(grad_interpolate),
    KT_TEST(grad_prelu),
    KT_TEST(grad_dropout2d),
    KT_TEST(grad_conv1d_transpose2d),
};
const size_t kt_grad_nn_count = sizeof kt_grad_nn_tests / sizeof kt_grad_nn_tests[0];
