/*
 * fixtures_ops.c — the fixture test's runner table: the only per-op code. Each
 * manifest OP (a public function name without kl_) maps to the op-table row it
 * exercises and a small runner that reads the case's attributes and calls the
 * kl_ function; the rows torch cannot check by value are listed with a reason.
 */
#include "fixtures.h"

#include <stdlib.h>

/* ---- attributes ----------------------------------------------------------------------------- */

static const char *fx_attr(fx_ctx *cx, const char *key) {
    for (int i = 0; i < cx->c->nattr; i++)
        if (!strcmp(cx->c->key[i], key)) return cx->c->val[i];
    if (!cx->bad[0]) snprintf(cx->bad, sizeof cx->bad, "missing attribute '%s'", key);
    return NULL;
}

static int64_t fx_i(fx_ctx *cx, const char *key) {
    const char *v = fx_attr(cx, key);
    return v ? strtoll(v, NULL, 10) : 0;
}

static double fx_f(fx_ctx *cx, const char *key) {
    const char *v = fx_attr(cx, key);
    return v ? strtod(v, NULL) : 0;
}

static bool fx_b(fx_ctx *cx, const char *key) { return fx_i(cx, key) != 0; }

/* Integer list "1,2,3" (empty: no elements) into buf; returns the count. */
static int fx_list(fx_ctx *cx, const char *key, int64_t *buf, int max) {
    const char *v = fx_attr(cx, key);
    int n = 0;
    while (v && *v) {
        char *end;
        int64_t x = strtoll(v, &end, 10);
        if (end == v || n == max) {
            snprintf(cx->bad, sizeof cx->bad, "bad list '%s' for '%s'", v, key);
            return 0;
        }
        buf[n++] = x;
        v = *end == ',' ? end + 1 : end;
    }
    return n;
}

static const char *const fx_dtnames[KL_NUM_DTYPES] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"};

static kl_dtype fx_dtype_named(const char *s) {
    for (int d = 0; d < KL_NUM_DTYPES; d++)
        if (!strcmp(s, fx_dtnames[d])) return (kl_dtype)d;
    return KL_NUM_DTYPES;
}

static kl_dtype fx_dt(fx_ctx *cx, const char *key) {
    const char *v = fx_attr(cx, key);
    kl_dtype d = v ? fx_dtype_named(v) : KL_NUM_DTYPES;
    if (v && d == KL_NUM_DTYPES) snprintf(cx->bad, sizeof cx->bad, "unknown dtype '%s'", v);
    return d;
}

static int fx_dim(fx_ctx *cx, const char *key) {
    const char *v = fx_attr(cx, key);
    return v && !strcmp(v, "none") ? KL_DIM_NONE : (int)fx_i(cx, key);
}

static kl_reduction fx_red(fx_ctx *cx) {
    const char *v = fx_attr(cx, "red");
    if (v && !strcmp(v, "none")) return KL_REDUCE_NONE;
    if (v && !strcmp(v, "sum")) return KL_REDUCE_SUM;
    return KL_REDUCE_MEAN;
}

/* ---- runners ------------------------------------------------------------------------------- */

#define IN(k) (cx->in[k])

static int fx_out1(fx_ctx *cx, kl_tensor *t) {
    cx->out[0] = t;
    cx->nout = 1;
    return t ? 0 : -1;
}

/* In-place ops must return their first argument itself. */
static int fx_out_inplace(fx_ctx *cx, kl_tensor *t) {
    if (t && t != IN(0)) snprintf(cx->bad, sizeof cx->bad, "in-place op returned a tensor other than its input");
    return fx_out1(cx, t);
}

static int run_u(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.u(IN(0))); }
static int run_u_ip(fx_ctx *cx) { return fx_out_inplace(cx, cx->op->fp.u(IN(0))); }
static int run_b(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.b(IN(0), IN(1))); }
static int run_b_ip(fx_ctx *cx) { return fx_out_inplace(cx, cx->op->fp.b(IN(0), IN(1))); }
static int run_bs(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.bs(IN(0), fx_f(cx, "s"))); }
static int run_bs_ip(fx_ctx *cx) { return fx_out_inplace(cx, cx->op->fp.bs(IN(0), fx_f(cx, "s"))); }

/* creation */
static int run_shape_dt(fx_ctx *cx) {
    int64_t s[KE_MAX_LIST];
    int n = fx_list(cx, "shape", s, KE_MAX_LIST);
    return fx_out1(cx, cx->op->fp.dt(n, s, fx_dt(cx, "dtype")));
}
static int run_full(fx_ctx *cx) {
    int64_t s[KE_MAX_LIST];
    int n = fx_list(cx, "shape", s, KE_MAX_LIST);
    return fx_out1(cx, kl_full(n, s, fx_f(cx, "value"), fx_dt(cx, "dtype")));
}
static int run_scalar_tensor(fx_ctx *cx) { return fx_out1(cx, kl_scalar_tensor(fx_f(cx, "value"), fx_dt(cx, "dtype"))); }
static int run_like(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.like(IN(0))); }
static int run_full_like(fx_ctx *cx) { return fx_out1(cx, kl_full_like(IN(0), fx_f(cx, "value"))); }
static int run_arange(fx_ctx *cx) {
    return fx_out1(cx, kl_arange(fx_f(cx, "start"), fx_f(cx, "end"), fx_f(cx, "step"), fx_dt(cx, "dtype")));
}
static int run_linspace(fx_ctx *cx) {
    return fx_out1(cx, kl_linspace(fx_f(cx, "start"), fx_f(cx, "end"), fx_i(cx, "steps"), fx_dt(cx, "dtype")));
}
static int run_eye(fx_ctx *cx) { return fx_out1(cx, kl_eye(fx_i(cx, "n"), fx_i(cx, "m"), fx_dt(cx, "dtype"))); }
static int run_randint(fx_ctx *cx) {
    int64_t s[KE_MAX_LIST];
    int n = fx_list(cx, "shape", s, KE_MAX_LIST);
    return fx_out1(cx, kl_randint(fx_i(cx, "low"), fx_i(cx, "high"), n, s, fx_dt(cx, "dtype")));
}
static int run_to_dtype(fx_ctx *cx) { return fx_out1(cx, kl_to_dtype(IN(0), fx_dt(cx, "dtype"))); }
static int run_to_device(fx_ctx *cx) { return fx_out1(cx, kl_to_device(IN(0), KL_DEVICE_CPU)); }
static int run_fill_inplace(fx_ctx *cx) { return fx_out_inplace(cx, kl_fill_inplace(IN(0), fx_f(cx, "value"))); }

/* views */
static int run_shape(fx_ctx *cx) {
    int64_t s[KE_MAX_LIST];
    int n = fx_list(cx, cx->op->fp.shape == kl_permute ? "dims" : "shape", s, KE_MAX_LIST);
    return fx_out1(cx, cx->op->fp.shape(IN(0), n, s));
}
static int run_transpose(fx_ctx *cx) {
    return fx_out1(cx, kl_transpose(IN(0), (int)fx_i(cx, "dim0"), (int)fx_i(cx, "dim1")));
}
static int run_squeeze(fx_ctx *cx) { return fx_out1(cx, kl_squeeze(IN(0), (int)fx_i(cx, "dim"))); }
static int run_unsqueeze(fx_ctx *cx) { return fx_out1(cx, kl_unsqueeze(IN(0), (int)fx_i(cx, "dim"))); }
static int run_flatten(fx_ctx *cx) {
    return fx_out1(cx, kl_flatten(IN(0), (int)fx_i(cx, "start"), (int)fx_i(cx, "end")));
}
static int run_slice(fx_ctx *cx) {
    return fx_out1(cx, kl_slice(IN(0), (int)fx_i(cx, "dim"), fx_i(cx, "start"), fx_i(cx, "end"), fx_i(cx, "step")));
}
static int run_narrow(fx_ctx *cx) {
    return fx_out1(cx, kl_narrow(IN(0), (int)fx_i(cx, "dim"), fx_i(cx, "start"), fx_i(cx, "length")));
}
static int run_select(fx_ctx *cx) { return fx_out1(cx, kl_select(IN(0), (int)fx_i(cx, "dim"), fx_i(cx, "index"))); }
static int run_as_strided(fx_ctx *cx) {
    int64_t s[KE_MAX_LIST], st[KE_MAX_LIST];
    int n = fx_list(cx, "shape", s, KE_MAX_LIST), m = fx_list(cx, "strides", st, KE_MAX_LIST);
    if (n != m) snprintf(cx->bad, sizeof cx->bad, "shape and strides differ in length");
    return fx_out1(cx, kl_as_strided(IN(0), n, s, st, fx_i(cx, "offset")));
}

/* elementwise, other */
static int run_where(fx_ctx *cx) { return fx_out1(cx, kl_where(IN(0), IN(1), IN(2))); }
static int run_clamp(fx_ctx *cx) { return fx_out1(cx, kl_clamp(IN(0), fx_f(cx, "lo"), fx_f(cx, "hi"))); }
static int run_clamp_ip(fx_ctx *cx) { return fx_out_inplace(cx, kl_clamp_inplace(IN(0), fx_f(cx, "lo"), fx_f(cx, "hi"))); }
static int run_lerp(fx_ctx *cx) { return fx_out1(cx, kl_lerp(IN(0), IN(1), IN(2))); }
static int run_lerp_s(fx_ctx *cx) { return fx_out1(cx, kl_lerp_scalar(IN(0), IN(1), fx_f(cx, "w"))); }
static int run_lerp_s_ip(fx_ctx *cx) { return fx_out_inplace(cx, kl_lerp_scalar_inplace(IN(0), IN(1), fx_f(cx, "w"))); }
static int run_masked_fill(fx_ctx *cx) { return fx_out1(cx, kl_masked_fill(IN(0), IN(1), fx_f(cx, "value"))); }
static int run_masked_fill_ip(fx_ctx *cx) {
    return fx_out_inplace(cx, kl_masked_fill_inplace(IN(0), IN(1), fx_f(cx, "value")));
}
static int run_tri(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.tri(IN(0), fx_i(cx, "k"))); }

/* reductions */
static int run_red(fx_ctx *cx) {
    int64_t d[KE_MAX_LIST];
    int n = fx_list(cx, "dims", d, KE_MAX_LIST);
    return fx_out1(cx, cx->op->fp.red(IN(0), n, d, fx_b(cx, "keepdim")));
}
static int run_var(fx_ctx *cx) {
    int64_t d[KE_MAX_LIST];
    int n = fx_list(cx, "dims", d, KE_MAX_LIST);
    return fx_out1(cx, cx->op->fp.var(IN(0), n, d, fx_f(cx, "correction"), fx_b(cx, "keepdim")));
}
static int run_norm(fx_ctx *cx) {
    int64_t d[KE_MAX_LIST];
    int n = fx_list(cx, "dims", d, KE_MAX_LIST);
    return fx_out1(cx, kl_norm(IN(0), fx_f(cx, "p"), n, d, fx_b(cx, "keepdim")));
}
static int run_arg(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.arg(IN(0), fx_dim(cx, "dim"), fx_b(cx, "keepdim"))); }
static int run_mdim(fx_ctx *cx) {
    kl_tensor *v = NULL, *i = NULL;
    int r = cx->op->fp.mdim(IN(0), (int)fx_i(cx, "dim"), fx_b(cx, "keepdim"), &v, &i);
    cx->out[0] = v;
    cx->out[1] = i;
    cx->nout = 2;
    if (r == 0 && (!v || !i)) snprintf(cx->bad, sizeof cx->bad, "returned 0 without both outputs");
    return r == 0 ? 0 : -1;
}
static int fx_out2(fx_ctx *cx, int r, kl_tensor *v, kl_tensor *i) {
    cx->out[0] = v;
    cx->out[1] = i;
    cx->nout = 2;
    if (r == 0 && (!v || !i)) snprintf(cx->bad, sizeof cx->bad, "returned 0 without both outputs");
    return r == 0 ? 0 : -1;
}
static int run_sort(fx_ctx *cx) {
    kl_tensor *v = NULL, *i = NULL;
    int r = kl_sort(IN(0), (int)fx_i(cx, "dim"), fx_b(cx, "descending"), true, &v, &i);
    return fx_out2(cx, r, v, i);
}
static int run_argsort(fx_ctx *cx) {
    return fx_out1(cx, kl_argsort(IN(0), (int)fx_i(cx, "dim"), fx_b(cx, "descending"), true));
}
static int run_topk(fx_ctx *cx) {
    kl_tensor *v = NULL, *i = NULL;
    int r = kl_topk(IN(0), fx_i(cx, "k"), (int)fx_i(cx, "dim"), fx_b(cx, "largest"), true, &v, &i);
    return fx_out2(cx, r, v, i);
}
static int run_flip(fx_ctx *cx) {
    int64_t d[KE_MAX_LIST];
    int n = fx_list(cx, "dims", d, KE_MAX_LIST);
    return fx_out1(cx, kl_flip(IN(0), n, d));
}
static int run_roll(fx_ctx *cx) { /* no dims: the flattened tensor */
    int64_t s[KE_MAX_LIST], d[KE_MAX_LIST];
    int n = fx_list(cx, "shifts", s, KE_MAX_LIST), nd = fx_list(cx, "dims", d, KE_MAX_LIST);
    if (nd && nd != n) snprintf(cx->bad, sizeof cx->bad, "shifts and dims differ in length");
    return fx_out1(cx, kl_roll(IN(0), n, s, nd ? d : NULL));
}
static int run_one_hot(fx_ctx *cx) { return fx_out1(cx, kl_one_hot(IN(0), fx_i(cx, "num_classes"))); }
static int run_multinomial(fx_ctx *cx) {
    return fx_out1(cx, kl_multinomial(IN(0), fx_i(cx, "num_samples"), fx_b(cx, "replacement")));
}
static int run_baddbmm(fx_ctx *cx) {
    return fx_out1(cx, kl_baddbmm(IN(0), IN(1), IN(2), fx_f(cx, "beta"), fx_f(cx, "alpha")));
}
static int run_einsum(fx_ctx *cx) { /* the manifest writes the equation's spaces as '_' */
    const char *v = fx_attr(cx, "eq");
    char eq[256] = "";
    for (int k = 0; v && v[k] && k < 255; k++) eq[k] = v[k] == '_' ? ' ' : v[k], eq[k + 1] = 0;
    return fx_out1(cx, kl_einsum(eq, cx->nin, cx->in));
}
static int run_scan(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.scan(IN(0), (int)fx_i(cx, "dim"))); }

/* joining and indexing */
static int run_join(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.join(cx->nin, cx->in, (int)fx_i(cx, "dim"))); }
static int run_pieces(fx_ctx *cx) {
    bool split = !strcmp(cx->op->name, "split");
    int dim = (int)fx_i(cx, "dim");
    int n = split ? kl_split(IN(0), fx_i(cx, "size"), dim, cx->out, FX_MAX_OUT)
                  : kl_chunk(IN(0), (int)fx_i(cx, "chunks"), dim, cx->out, FX_MAX_OUT);
    if (n < 0) return -1;
    if (n > FX_MAX_OUT) snprintf(cx->bad, sizeof cx->bad, "%d pieces: more than the test keeps", n);
    cx->nout = n;
    return 0;
}
static int run_repeat(fx_ctx *cx) {
    int64_t r[KE_MAX_LIST];
    int n = fx_list(cx, "repeats", r, KE_MAX_LIST);
    return fx_out1(cx, kl_repeat(IN(0), n, r));
}
static int run_pad(fx_ctx *cx) {
    int64_t p[KE_MAX_LIST];
    int n = fx_list(cx, "pad", p, KE_MAX_LIST);
    return fx_out1(cx, kl_pad(IN(0), n, p, fx_f(cx, "value")));
}
static int run_pad_ex(fx_ctx *cx) {
    int64_t p[KE_MAX_LIST];
    int n = fx_list(cx, "pad", p, KE_MAX_LIST);
    return fx_out1(cx, kl_pad_ex(IN(0), n, p, (kl_pad_mode)fx_i(cx, "mode"), fx_f(cx, "value")));
}
static int run_index_select(fx_ctx *cx) { return fx_out1(cx, kl_index_select(IN(0), (int)fx_i(cx, "dim"), IN(1))); }
static int run_gather(fx_ctx *cx) { return fx_out1(cx, kl_gather(IN(0), (int)fx_i(cx, "dim"), IN(1))); }
static int run_scatter_add(fx_ctx *cx) { return fx_out1(cx, kl_scatter_add(IN(0), (int)fx_i(cx, "dim"), IN(1), IN(2))); }
static int run_scatter_add_ip(fx_ctx *cx) {
    return fx_out_inplace(cx, kl_scatter_add_inplace(IN(0), (int)fx_i(cx, "dim"), IN(1), IN(2)));
}
static int run_scatter(fx_ctx *cx) { return fx_out1(cx, kl_scatter(IN(0), (int)fx_i(cx, "dim"), IN(1), IN(2))); }
static int run_scatter_value(fx_ctx *cx) {
    return fx_out1(cx, kl_scatter_value(IN(0), (int)fx_i(cx, "dim"), IN(1), fx_f(cx, "value")));
}
/* reduce: kl_scatter_reduction's value */
static int run_scatter_reduce(fx_ctx *cx) {
    return fx_out1(cx, kl_scatter_reduce(IN(0), (int)fx_i(cx, "dim"), IN(1), IN(2),
                                         (kl_scatter_reduction)fx_i(cx, "reduce"), fx_b(cx, "include_self")));
}
static int run_take_along_dim(fx_ctx *cx) { return fx_out1(cx, kl_take_along_dim(IN(0), IN(1), fx_dim(cx, "dim"))); }

/* linear algebra */
static int run_addmm(fx_ctx *cx) {
    return fx_out1(cx, kl_addmm(IN(0), IN(1), IN(2), fx_f(cx, "beta"), fx_f(cx, "alpha")));
}
static int run_linear(fx_ctx *cx) { return fx_out1(cx, kl_linear(IN(0), IN(1), cx->nin > 2 ? IN(2) : NULL)); }

/* neural-network ops */
static int run_softmax(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.sm(IN(0), (int)fx_i(cx, "dim"))); }
static int run_layer_norm(fx_ctx *cx) {
    return fx_out1(cx, kl_layer_norm(IN(0), (int)fx_i(cx, "normalized_ndim"), IN(1), IN(2), fx_f(cx, "eps")));
}
static int run_rms_norm(fx_ctx *cx) {
    return fx_out1(cx, kl_rms_norm(IN(0), (int)fx_i(cx, "normalized_ndim"), IN(1), fx_f(cx, "eps")));
}
static int run_dropout(fx_ctx *cx) { return fx_out1(cx, kl_dropout(IN(0), fx_f(cx, "p"), fx_b(cx, "training"))); }
static int run_cross_entropy(fx_ctx *cx) {
    return fx_out1(cx, kl_cross_entropy(IN(0), IN(1), fx_red(cx), fx_f(cx, "ls")));
}
/* cross_entropy_ex / nll_loss_ex: inputs x, target, weight ('-': none) */
static kl_cross_entropy_options fx_class_loss_options(fx_ctx *cx) {
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.reduction = fx_red(cx);
    o.ignore_index = fx_i(cx, "ignore");
    o.weight = cx->nin > 2 ? IN(2) : NULL;
    return o;
}
static int run_cross_entropy_ex(fx_ctx *cx) {
    kl_cross_entropy_options o = fx_class_loss_options(cx);
    o.label_smoothing = fx_f(cx, "ls");
    return fx_out1(cx, kl_cross_entropy_ex(IN(0), IN(1), &o));
}
static int run_nll_loss_ex(fx_ctx *cx) {
    kl_cross_entropy_options o = fx_class_loss_options(cx);
    return fx_out1(cx, kl_nll_loss_ex(IN(0), IN(1), &o));
}
static int run_loss(fx_ctx *cx) { return fx_out1(cx, cx->op->fp.loss(IN(0), IN(1), fx_red(cx))); }
static void fx_pair(fx_ctx *cx, const char *key, int64_t v[2]) {
    if (fx_list(cx, key, v, 2) != 2 && !cx->bad[0]) snprintf(cx->bad, sizeof cx->bad, "'%s' needs 2 values", key);
}
static int run_conv2d(fx_ctx *cx) {
    kl_conv2d_options o = kl_conv2d_options_default();
    fx_pair(cx, "stride", o.stride);
    fx_pair(cx, "padding", o.padding);
    fx_pair(cx, "dilation", o.dilation);
    o.groups = fx_i(cx, "groups");
    return fx_out1(cx, kl_conv2d(IN(0), IN(1), IN(2), &o));
}
/* batch_norm: inputs x, running_mean, running_var, weight, bias ('-' for
 * none). The buffers are buffers: detached copies (torch's are clones too),
 * returned after a training call as outputs 1 and 2. */
static int run_batch_norm(fx_ctx *cx) {
    bool training = fx_b(cx, "training");
    kl_tensor *rm = IN(1) ? kl_detach(kl_clone(IN(1))) : NULL, *rv = IN(2) ? kl_detach(kl_clone(IN(2))) : NULL;
    kl_tensor *y = kl_batch_norm(IN(0), rm, rv, IN(3), IN(4), training, fx_f(cx, "momentum"), fx_f(cx, "eps"));
    if (!training || !rm) return fx_out1(cx, y);
    cx->out[0] = y, cx->out[1] = rm, cx->out[2] = rv;
    cx->nout = 3;
    return y ? 0 : -1;
}
static int run_group_norm(fx_ctx *cx) {
    return fx_out1(cx, kl_group_norm(IN(0), fx_i(cx, "num_groups"), IN(1), IN(2), fx_f(cx, "eps")));
}
/* interpolate: size (list, or absent) or scale_h[/scale_w]; mode a kl_interp_mode */
static int run_interpolate(fx_ctx *cx) {
    kl_interpolate_options o = kl_interpolate_options_default();
    for (int i = 0; i < cx->c->nattr; i++) {
        if (!strcmp(cx->c->key[i], "size")) fx_list(cx, "size", o.size, 2);
        if (!strcmp(cx->c->key[i], "scale_h")) o.scale_factor[0] = fx_f(cx, "scale_h");
        if (!strcmp(cx->c->key[i], "scale_w")) o.scale_factor[1] = fx_f(cx, "scale_w");
    }
    o.mode = (kl_interp_mode)fx_i(cx, "mode");
    o.align_corners = fx_b(cx, "align_corners");
    return fx_out1(cx, kl_interpolate(IN(0), &o));
}
static int run_conv1d(fx_ctx *cx) {
    kl_conv1d_options o = {fx_i(cx, "stride"), fx_i(cx, "padding"), fx_i(cx, "dilation"), fx_i(cx, "groups")};
    return fx_out1(cx, kl_conv1d(IN(0), IN(1), IN(2), &o));
}
static int run_conv_transpose2d(fx_ctx *cx) {
    kl_conv_transpose2d_options o = kl_conv_transpose2d_options_default();
    fx_pair(cx, "stride", o.stride);
    fx_pair(cx, "padding", o.padding);
    fx_pair(cx, "output_padding", o.output_padding);
    fx_pair(cx, "dilation", o.dilation);
    o.groups = fx_i(cx, "groups");
    return fx_out1(cx, kl_conv_transpose2d(IN(0), IN(1), IN(2), &o));
}
static int run_adaptive_avg_pool2d(fx_ctx *cx) {
    int64_t o[2];
    fx_pair(cx, "output_size", o);
    return fx_out1(cx, kl_adaptive_avg_pool2d(IN(0), o[0], o[1]));
}
static int run_dropout2d(fx_ctx *cx) { return fx_out1(cx, kl_dropout2d(IN(0), fx_f(cx, "p"), fx_b(cx, "training"))); }
static int run_pool(fx_ctx *cx) {
    kl_pool2d_options o = kl_pool2d_options_default(1);
    fx_pair(cx, "kernel", o.kernel);
    fx_pair(cx, "stride", o.stride);
    fx_pair(cx, "padding", o.padding);
    fx_pair(cx, "dilation", o.dilation);
    o.ceil_mode = fx_b(cx, "ceil_mode");
    o.count_include_pad = fx_b(cx, "count_include_pad");
    return fx_out1(cx, cx->op->fp.pool(IN(0), &o));
}
static int run_sdpa(fx_ctx *cx) {
    return fx_out1(cx, kl_scaled_dot_product_attention(IN(0), IN(1), IN(2), IN(3), fx_b(cx, "causal"),
                                                       fx_f(cx, "scale")));
}

/* ---- the op table ----------------------------------------------------------------------------- */

/* The unary ops with attributes (forms UNARY_F1_IP / UNARY_F2_IP): one
 * double (logit eps, leaky_relu slope, elu/celu alpha) or two (hardtanh
 * bounds), each read from the case under its own key, so their entries are
 * written by hand as clamp's. */
typedef kl_tensor *(*fx_attr1_fn)(kl_tensor *, double);
static int fx_attr1(fx_ctx *cx, fx_attr1_fn f, const char *key, int ip) {
    kl_tensor *t = f(IN(0), fx_f(cx, key));
    return ip ? fx_out_inplace(cx, t) : fx_out1(cx, t);
}
static int run_logit(fx_ctx *cx) { return fx_attr1(cx, kl_logit, "eps", 0); }
static int run_logit_ip(fx_ctx *cx) { return fx_attr1(cx, kl_logit_inplace, "eps", 1); }
static int run_leaky_relu(fx_ctx *cx) { return fx_attr1(cx, kl_leaky_relu, "slope", 0); }
static int run_leaky_relu_ip(fx_ctx *cx) { return fx_attr1(cx, kl_leaky_relu_inplace, "slope", 1); }
static int run_elu(fx_ctx *cx) { return fx_attr1(cx, kl_elu, "alpha", 0); }
static int run_elu_ip(fx_ctx *cx) { return fx_attr1(cx, kl_elu_inplace, "alpha", 1); }
static int run_celu(fx_ctx *cx) { return fx_attr1(cx, kl_celu, "alpha", 0); }
static int run_celu_ip(fx_ctx *cx) { return fx_attr1(cx, kl_celu_inplace, "alpha", 1); }
static int run_hardtanh(fx_ctx *cx) { return fx_out1(cx, kl_hardtanh(IN(0), fx_f(cx, "lo"), fx_f(cx, "hi"))); }
static int run_hardtanh_ip(fx_ctx *cx) {
    return fx_out_inplace(cx, kl_hardtanh_inplace(IN(0), fx_f(cx, "lo"), fx_f(cx, "hi")));
}

/* The public functions generated from the rows' wrap column (wrappers.c):
 * one case list per generated function, from the same rows. Forms with
 * attributes (clamp, logit, ...) have their own entries below. */
#define FX_UNARY(n) {#n, #n, run_u, {.u = kl_##n}},
#define FX_UNARY_IP(n) FX_UNARY(n) {#n "_inplace", #n, run_u_ip, {.u = kl_##n##_inplace}},
#define FX_BINARY(n)                                                      \
    {#n, #n, run_b, {.b = kl_##n}},                                       \
    {#n "_inplace", #n, run_b_ip, {.b = kl_##n##_inplace}},               \
    {#n "_scalar", #n, run_bs, {.bs = kl_##n##_scalar}},                  \
    {#n "_scalar_inplace", #n, run_bs_ip, {.bs = kl_##n##_scalar_inplace}},
#define FX_none(n)
#define FX_UNARY_F1_IP(n)
#define FX_UNARY_F2_IP(n)

const fx_op fx_ops[] = {
    /* creation and conversion: several public functions share one row */
    {"empty", "empty", run_shape_dt, {.dt = kl_empty}},
    {"empty_like", "empty", run_like, {.like = kl_empty_like}},
    {"zeros", "full", run_shape_dt, {.dt = kl_zeros}},
    {"ones", "full", run_shape_dt, {.dt = kl_ones}},
    {"full", "full", run_full, {0}},
    {"scalar_tensor", "full", run_scalar_tensor, {0}},
    {"zeros_like", "full", run_like, {.like = kl_zeros_like}},
    {"ones_like", "full", run_like, {.like = kl_ones_like}},
    {"full_like", "full", run_full_like, {0}},
    {"arange", "arange", run_arange, {0}},
    {"linspace", "linspace", run_linspace, {0}},
    {"eye", "eye", run_eye, {0}},
    {"rand", "rand", run_shape_dt, {.dt = kl_rand}},
    {"randn", "randn", run_shape_dt, {.dt = kl_randn}},
    {"randint", "randint", run_randint, {0}},
    {"bernoulli", "bernoulli", run_u, {.u = kl_bernoulli}},
    {"clone", "clone", run_u, {.u = kl_clone}},
    {"to_dtype", "to_dtype", run_to_dtype, {0}},
    {"alias", "alias", run_to_dtype, {0}},          /* kl_to_dtype to the same dtype */
    {"copy_inplace", "copy", run_b_ip, {.b = kl_copy_inplace}},
    {"fill_inplace", "copy", run_fill_inplace, {0}},
    {"zero_inplace", "copy", run_u_ip, {.u = kl_zero_inplace}},
    {"to_device", "to_device", run_to_device, {0}},
    /* views */
    {"view", "view", run_shape, {.shape = kl_view}},
    {"reshape", "reshape", run_shape, {.shape = kl_reshape}},
    {"permute", "permute", run_shape, {.shape = kl_permute}},
    {"expand", "expand", run_shape, {.shape = kl_expand}},
    {"broadcast_to", "expand", run_shape, {.shape = kl_broadcast_to}},
    {"transpose", "transpose", run_transpose, {0}},
    {"t", "t", run_u, {.u = kl_t}},
    {"squeeze", "squeeze", run_squeeze, {0}},
    {"squeeze_all", "squeeze_all", run_u, {.u = kl_squeeze_all}},
    {"unsqueeze", "unsqueeze", run_unsqueeze, {0}},
    {"flatten", "flatten", run_flatten, {0}},
    {"slice", "slice", run_slice, {0}},
    {"narrow", "narrow", run_narrow, {0}},
    {"select", "select", run_select, {0}},
    {"as_strided", "as_strided", run_as_strided, {0}},
    {"contiguous", "contiguous", run_u, {.u = kl_contiguous}},
    /* elementwise */
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    FX_##wrap_(name_)
#include "optable.def"
#undef KE_OP
    {"rsub_scalar", "sub", run_bs, {.bs = kl_rsub_scalar}},
    {"rdiv_scalar", "div", run_bs, {.bs = kl_rdiv_scalar}},
    {"where", "where", run_where, {0}},
    {"logit", "logit", run_logit, {0}},
    {"logit_inplace", "logit", run_logit_ip, {0}},
    {"leaky_relu", "leaky_relu", run_leaky_relu, {0}},
    {"leaky_relu_inplace", "leaky_relu", run_leaky_relu_ip, {0}},
    {"elu", "elu", run_elu, {0}},
    {"elu_inplace", "elu", run_elu_ip, {0}},
    {"celu", "celu", run_celu, {0}},
    {"celu_inplace", "celu", run_celu_ip, {0}},
    {"hardtanh", "hardtanh", run_hardtanh, {0}},
    {"hardtanh_inplace", "hardtanh", run_hardtanh_ip, {0}},
    {"clamp", "clamp", run_clamp, {0}},
    {"clamp_inplace", "clamp", run_clamp_ip, {0}},
    {"lerp", "lerp", run_lerp, {0}},
    {"lerp_scalar", "lerp_scalar", run_lerp_s, {0}},
    {"lerp_scalar_inplace", "lerp_scalar", run_lerp_s_ip, {0}},
    {"masked_fill", "masked_fill", run_masked_fill, {0}},
    {"masked_fill_inplace", "masked_fill", run_masked_fill_ip, {0}},
    {"tril", "tril", run_tri, {.tri = kl_tril}},
    {"triu", "triu", run_tri, {.tri = kl_triu}},
    /* reductions and scans */
    {"sum", "sum", run_red, {.red = kl_sum}},
    {"mean", "mean", run_red, {.red = kl_mean}},
    {"prod", "prod", run_red, {.red = kl_prod}},
    {"amax", "amax", run_red, {.red = kl_amax}},
    {"amin", "amin", run_red, {.red = kl_amin}},
    {"logsumexp", "logsumexp", run_red, {.red = kl_logsumexp}},
    {"all", "all", run_red, {.red = kl_all}},
    {"any", "any", run_red, {.red = kl_any}},
    {"var", "var", run_var, {.var = kl_var}},
    {"std", "std", run_var, {.var = kl_std}},
    {"norm", "norm", run_norm, {0}},
    {"argmax", "argmax", run_arg, {.arg = kl_argmax}},
    {"argmin", "argmin", run_arg, {.arg = kl_argmin}},
    {"max_dim", "max_dim", run_mdim, {.mdim = kl_max_dim}},
    {"min_dim", "min_dim", run_mdim, {.mdim = kl_min_dim}},
    {"cumsum", "cumsum", run_scan, {.scan = kl_cumsum}},
    {"cumprod", "cumprod", run_scan, {.scan = kl_cumprod}},
    /* joining and indexing */
    {"cat", "cat", run_join, {.join = kl_cat}},
    {"stack", "stack", run_join, {.join = kl_stack}},
    {"split", "split", run_pieces, {0}},
    {"chunk", "chunk", run_pieces, {0}},
    {"repeat", "repeat", run_repeat, {0}},
    {"pad", "pad", run_pad, {0}},
    {"pad_ex", "pad", run_pad_ex, {0}},
    {"index_select", "index_select", run_index_select, {0}},
    {"gather", "gather", run_gather, {0}},
    {"scatter_add", "scatter_add", run_scatter_add, {0}},
    {"scatter_add_inplace", "scatter_add", run_scatter_add_ip, {0}},
    {"scatter", "scatter", run_scatter, {0}},
    {"scatter_value", "scatter", run_scatter_value, {0}},
    {"scatter_reduce", "scatter_reduce", run_scatter_reduce, {0}},
    {"take_along_dim", "take_along_dim", run_take_along_dim, {0}},
    {"embedding", "embedding", run_b, {.b = kl_embedding}},
    /* sorting and reordering */
    {"sort", "sort", run_sort, {0}},
    {"argsort", "argsort", run_argsort, {0}},
    {"topk", "topk", run_topk, {0}},
    {"flip", "flip", run_flip, {0}},
    {"roll", "roll", run_roll, {0}},
    {"one_hot", "one_hot", run_one_hot, {0}},
    {"multinomial", "multinomial", run_multinomial, {0}},     /* one non-zero category per row */
    /* linear algebra */
    {"matmul", "matmul", run_b, {.b = kl_matmul}},
    {"mm", "mm", run_b, {.b = kl_mm}},
    {"bmm", "bmm", run_b, {.b = kl_bmm}},
    {"addmm", "addmm", run_addmm, {0}},
    {"linear", "linear", run_linear, {0}},
    {"outer", "outer", run_b, {.b = kl_outer}},
    {"baddbmm", "baddbmm", run_baddbmm, {0}},
    {"einsum", "einsum", run_einsum, {0}},
    /* neural-network ops */
    {"softmax", "softmax", run_softmax, {.sm = kl_softmax}},
    {"log_softmax", "log_softmax", run_softmax, {.sm = kl_log_softmax}},
    {"layer_norm", "layer_norm", run_layer_norm, {0}},
    {"rms_norm", "rms_norm", run_rms_norm, {0}},
    {"dropout", "dropout", run_dropout, {0}},       /* training with p > 0 */
    {"dropout_eval", "alias", run_dropout, {0}},    /* eval or p == 0: a view of x */
    {"cross_entropy", "cross_entropy", run_cross_entropy, {0}},
    {"cross_entropy_ex", "cross_entropy", run_cross_entropy_ex, {0}},
    {"nll_loss", "nll_loss", run_loss, {.loss = kl_nll_loss}},
    {"nll_loss_ex", "nll_loss", run_nll_loss_ex, {0}},
    {"mse_loss", "mse_loss", run_loss, {.loss = kl_mse_loss}},
    {"binary_cross_entropy_with_logits", "binary_cross_entropy_with_logits", run_loss,
     {.loss = kl_binary_cross_entropy_with_logits}},
    {"conv2d", "conv2d", run_conv2d, {0}},
    {"max_pool2d", "max_pool2d", run_pool, {.pool = kl_max_pool2d}},
    {"avg_pool2d", "avg_pool2d", run_pool, {.pool = kl_avg_pool2d}},
    {"batch_norm", "batch_norm", run_batch_norm, {0}},
    {"group_norm", "group_norm", run_group_norm, {0}},
    {"conv1d", "conv1d", run_conv1d, {0}},
    {"conv_transpose2d", "conv_transpose2d", run_conv_transpose2d, {0}},
    {"adaptive_avg_pool2d", "adaptive_avg_pool2d", run_adaptive_avg_pool2d, {0}},
    {"dropout2d", "dropout2d", run_dropout2d, {0}},       /* training with p > 0 */
    {"interpolate", "interpolate", run_interpolate, {0}},
    {"prelu", "prelu", run_b, {.b = kl_prelu}},
    {"dropout2d_eval", "alias", run_dropout2d, {0}},      /* eval or p == 0: a view of x */
    {"scaled_dot_product_attention", "scaled_dot_product_attention", run_sdpa, {0}},
};

/* Rows that cannot be checked against torch by value. Every other row of
 * ke_ops must have at least one case whose values are compared. */
const fx_allow fx_allowlist[] = {
    {"empty", "uninitialized memory: its cases check shape and dtype only (novalues)"},
    {"rand", "random values: cases check shape and dtype only; statistics are in test_philox"},
    {"randn", "random values: cases check shape and dtype only; statistics are in test_philox"},
    {"max_pool2d_indices", "internal op of max_pool2d's derivative: checked through its gradients (grad_nn.c)"},
    {"max_pool2d_backward", "internal op of max_pool2d's derivative: checked through its gradients (grad_nn.c, "
                            "test_nn.c)"},
    {"batch_norm_backward", "internal op of batch_norm's derivative: checked through its gradients (grad_nn.c, "
                            "test_nn.c)"},
    {"causal_attention", "internal op that causal scaled_dot_product_attention runs on the CPU: checked through "
                         "the causal scaled_dot_product_attention fixtures (values and torch's gradients), "
                         "grad_nn.c, test_attention.c"},
    {"causal_attention_backward", "internal op of causal_attention's derivative: checked through the causal "
                                  "scaled_dot_product_attention fixtures' torch gradients, grad_nn.c, "
                                  "test_attention.c"},
    {"layer_norm_backward", "internal op of layer_norm's derivative: checked through layer_norm's gradients (the "
                            "layer_norm fixtures' torch gradients, grad_nn.c, test_nn.c)"},
    {"batch_norm_stats", "internal op of kl_batch_norm's running-buffer update: checked against kl_mean and kl_var "
                         "(test_nn.c) and through the running buffers' torch values (test_nn.c, test_fashion.c)"},
    {"conv2d_weight_grad", "internal op of conv2d's derivative: checked through conv2d's gradients (the conv2d "
                           "fixtures' torch gradients, grad_nn.c, test_nn.c)"},
    {"conv2d_input_grad", "internal op of conv2d's derivative: checked through conv2d's gradients (the conv2d "
                          "fixtures' torch gradients, grad_nn.c, test_nn.c)"},
    {"threshold_backward", "internal op of relu's derivative: checked through relu's gradients (the relu fixtures' "
                           "torch gradients are torch's threshold_backward; grad_ew.c, test_ew.c)"},
};

const size_t fx_nops = sizeof fx_ops / sizeof fx_ops[0];
const size_t fx_nallow = sizeof fx_allowlist / sizeof fx_allowlist[0];

const fx_op *fx_find_op(const char *name) {
    for (size_t i = 0; i < fx_nops; i++)
        if (!strcmp(fx_ops[i].name, name)) return &fx_ops[i];
    return NULL;
}

int fx_row_index(const char *row) {
    for (int i = 0; i < KE_OP_COUNT; i++)
        if (!strcmp(ke_ops[i].name, row)) return i;
    return -1;
}
