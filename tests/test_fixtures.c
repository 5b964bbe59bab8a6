/*
 * test_fixtures.c — every op of the table against PyTorch 1.13 reference values.
 *
 * tests/fixtures/gen_fixtures.py writes .npy inputs/outputs and a manifest
 * (tests/fixtures/manifest.txt, format documented at the top of the script):
 *
 *     NAME OP [in=SPEC,...] [out=SPEC,...] [KEY=VALUE ...]
 *
 * A SPEC is FILE[:MOD...]; modifiers apply in order after kl_load_npy:
 *   :bf16      input: kl_to_dtype(KL_BF16); output: Kiln must return bfloat16
 *   :T         kl_transpose(-1, -2)          (non-contiguous input)
 *   :S2        kl_slice(-1, 0, end, 2)       (strided input)
 *   :E=AxBxC   kl_expand to AxBxC            (0-stride broadcast input)
 * '-' is a NULL tensor argument. Special keys: tol, error=1 (Kiln must fail),
 * novalues=1 (shape and dtype only), ref (informational).
 *
 * Gradients: a case of a differentiable op with f32/f64 inputs also has
 *     gw=FILE|-,...     per output: the weight W of loss = sum(out * W)
 *                       ('-' for integer outputs, which are not weighted)
 *     grad=FILE|-,...   per input: torch's d loss / d stored input ('-': none)
 * The gradient pass loads each input with a grad spec, marks the loaded
 * (stored) tensor requires_grad BEFORE its :T/:S2/:E modifiers (so the view
 * ops' derivatives run too), clones the first input of an _inplace op (an
 * in-place write on a leaf is refused, as in torch), runs the op, backwards
 * the sum over floating outputs of sum(out * W), and compares kl_grad of each
 * stored tensor (compared as zeros where no gradient arrived). Optional key
 * gtol=T overrides the per-dtype gradient tolerance.
 *
 * The op table below is the only per-op code: it maps each manifest OP (a
 * public function name without kl_) to the op-table row it exercises and a
 * small runner that reads the attributes and calls the kl_ function.
 *
 * By name (fixtures_replay_by_name, at the end of the file): every call a case makes
 * is replayed through kl_op_call from its attribute text (the IR printer's), bitwise,
 * for every row of the op table; each case's traced graph is replayed node by node by
 * name; each row is called again with extreme attribute values (results or clean errors).
 *
 * Every case runs in its own scope; a failing case prints its name, op, the
 * first mismatching element and both values, and the run goes on, so one run
 * lists every failure. Environment: KT_FIXTURES_DIR (where manifest.txt
 * lives), KT_FIXTURE_FILTER (run only cases whose name or op contains it),
 * KT_FIXTURE_VERBOSE=1 (print every case).
 */
#include "harness.h"

#include "autograd.h"
#include "dispatch.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#define FX_MAX_IN 8
#define FX_MAX_OUT 16
#define FX_MAX_ATTR 16

typedef struct fx_case {
    int line;
    char *name, *op;
    int nin, nout, nattr;
    char *in[FX_MAX_IN];
    char *out[FX_MAX_OUT];
    char *key[FX_MAX_ATTR], *val[FX_MAX_ATTR];
    bool error, novalues;
    int ngw, ngrad;               /* gradient keys; 0 when the case has none */
    char *gw[FX_MAX_OUT];
    char *grad[FX_MAX_IN];
} fx_case;

typedef struct fx_manifest {
    char *text;       /* the file, tokens point into it */
    fx_case *cases;
    int n;
} fx_manifest;

typedef struct fx_op fx_op;

/* What a runner sees: the case, its built inputs, where its outputs go. */
typedef struct fx_ctx {
    const fx_case *c;
    const fx_op *op;
    kl_tensor *in[FX_MAX_IN];
    int nin;
    kl_tensor *out[FX_MAX_OUT];
    int nout;
    char bad[256];    /* malformed case or broken contract (not a Kiln error) */
} fx_ctx;

typedef int (*fx_run_fn)(fx_ctx *cx);

/* The public function a generic runner calls. */
typedef union fx_fp {
    kl_tensor *(*u)(kl_tensor *);
    kl_tensor *(*b)(kl_tensor *, kl_tensor *);
    kl_tensor *(*bs)(kl_tensor *, double);
    kl_tensor *(*red)(kl_tensor *, int, const int64_t *, bool);
    kl_tensor *(*var)(kl_tensor *, int, const int64_t *, double, bool);
    kl_tensor *(*arg)(kl_tensor *, int, bool);
    int (*mdim)(kl_tensor *, int, bool, kl_tensor **, kl_tensor **);
    kl_tensor *(*scan)(kl_tensor *, int);
    kl_tensor *(*tri)(kl_tensor *, int64_t);
    kl_tensor *(*sm)(kl_tensor *, int);
    kl_tensor *(*pool)(kl_tensor *, const kl_pool2d_options *);
    kl_tensor *(*loss)(kl_tensor *, kl_tensor *, kl_reduction);
    kl_tensor *(*join)(int, kl_tensor *const *, int);
    kl_tensor *(*shape)(kl_tensor *, int, const int64_t *);
    kl_tensor *(*dt)(int, const int64_t *, kl_dtype);
    kl_tensor *(*like)(const kl_tensor *);
} fx_fp;

struct fx_op {
    const char *name;   /* manifest OP: the public function without kl_ */
    const char *row;    /* the op-table row it exercises */
    fx_run_fn run;
    fx_fp fp;
};

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

static const fx_op fx_ops[] = {
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
static const struct {
    const char *row, *why;
} fx_allowlist[] = {
    {"empty", "uninitialized memory: its cases check shape and dtype only (novalues)"},
    {"rand", "random values: cases check shape and dtype only; statistics are in test_philox"},
    {"randn", "random values: cases check shape and dtype only; statistics are in test_philox"},
    {"max_pool2d_indices", "internal op of max_pool2d's derivative: checked through its gradients (grad_nn.c)"},
    {"max_pool2d_backward", "internal op of max_pool2d's derivative: checked through its gradients (grad_nn.c, "
                            "test_nn.c)"},
    {"batch_norm_backward", "internal op of batch_norm's derivative: checked through its gradients (grad_nn.c, "
                            "test_nn.c)"},
    {"batch_norm_stats", "internal op of kl_batch_norm's running-buffer update: checked against kl_mean and kl_var "
                         "(test_nn.c) and through the running buffers' torch values (test_nn.c, test_fashion.c)"},
    {"conv2d_weight_grad", "internal op of conv2d's derivative: checked through conv2d's gradients (the conv2d "
                           "fixtures' torch gradients, grad_nn.c, test_nn.c)"},
    {"conv2d_input_grad", "internal op of conv2d's derivative: checked through conv2d's gradients (the conv2d "
                          "fixtures' torch gradients, grad_nn.c, test_nn.c)"},
    {"threshold_backward", "internal op of relu's derivative: checked through relu's gradients (the relu fixtures' "
                           "torch gradients are torch's threshold_backward; grad_ew.c, test_ew.c)"},
};

static const fx_op *fx_find_op(const char *name) {
    for (size_t i = 0; i < sizeof fx_ops / sizeof fx_ops[0]; i++)
        if (!strcmp(fx_ops[i].name, name)) return &fx_ops[i];
    return NULL;
}

static int fx_row_index(const char *row) {
    for (int i = 0; i < KE_OP_COUNT; i++)
        if (!strcmp(ke_ops[i].name, row)) return i;
    return -1;
}

/* ---- the manifest ----------------------------------------------------------------------------- */

static const char *fx_dir(void) {
    static char dir[PATH_MAX];
    char probe[PATH_MAX + 32];
    const char *env = getenv("KT_FIXTURES_DIR");
    if (env) return env;
    const char *rel[] = {"tests/fixtures", "../tests/fixtures", "../../tests/fixtures"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(probe, sizeof probe, "%s/manifest.txt", rel[i]);
        if (access(probe, R_OK) == 0) return rel[i];
    }
    /* meson runs tests from the build dir; the binary is build/tests/test_fixtures */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(dir, sizeof dir, "%.*s/../../tests/fixtures", (int)(sizeof dir - 32), exe);
        snprintf(probe, sizeof probe, "%s/manifest.txt", dir);
        if (access(probe, R_OK) == 0) return dir;
    }
    return NULL;
}

/* Splits "a,b,c" in place into up to max pointers; returns the count (-1 if more). */
static int fx_split_commas(char *s, char **out, int max) {
    int n = 0;
    for (char *tok = s; tok;) {
        char *comma = strchr(tok, ',');
        if (comma) *comma = 0;
        if (n == max) return -1;
        out[n++] = tok;
        tok = comma ? comma + 1 : NULL;
    }
    return n;
}

static bool fx_parse_line(char *line, int lineno, fx_case *c) {
    memset(c, 0, sizeof *c);
    c->line = lineno;
    char *save = NULL;
    c->name = strtok_r(line, " \t\r", &save);
    c->op = strtok_r(NULL, " \t\r", &save);
    if (!c->name || !c->op) return false;
    for (char *tok; (tok = strtok_r(NULL, " \t\r", &save));) {
        char *eq = strchr(tok, '=');
        if (!eq) return false;
        *eq = 0;
        char *v = eq + 1;
        if (!strcmp(tok, "in")) {
            if ((c->nin = fx_split_commas(v, c->in, FX_MAX_IN)) < 0) return false;
        } else if (!strcmp(tok, "out")) {
            if ((c->nout = fx_split_commas(v, c->out, FX_MAX_OUT)) < 0) return false;
        } else if (!strcmp(tok, "gw")) {
            if ((c->ngw = fx_split_commas(v, c->gw, FX_MAX_OUT)) < 0) return false;
        } else if (!strcmp(tok, "grad")) {
            if ((c->ngrad = fx_split_commas(v, c->grad, FX_MAX_IN)) < 0) return false;
        } else {
            if (c->nattr == FX_MAX_ATTR) return false;
            c->key[c->nattr] = tok;
            c->val[c->nattr++] = v;
            if (!strcmp(tok, "error")) c->error = atoi(v) != 0;
            if (!strcmp(tok, "novalues")) c->novalues = atoi(v) != 0;
        }
    }
    return true;
}

static bool fx_load_manifest(fx_manifest *m) {
    memset(m, 0, sizeof *m);
    const char *dir = fx_dir();
    if (!dir) {
        print_error("cannot find tests/fixtures/manifest.txt (set KT_FIXTURES_DIR)\n");
        return false;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    m->text = kt_read_text(path);
    if (!m->text) {
        print_error("cannot read %s\n", path);
        return false;
    }
    int cap = 1;
    for (const char *p = m->text; *p; p++) cap += *p == '\n';
    m->cases = calloc((size_t)cap, sizeof *m->cases);
    int lineno = 0;
    for (char *line = m->text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        if (*line && *line != '#') {
            if (!fx_parse_line(line, lineno, &m->cases[m->n])) {
                print_error("manifest.txt:%d: malformed line\n", lineno);
                return false;
            }
            m->n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    return m->n > 0;
}

static void fx_free_manifest(fx_manifest *m) {
    free(m->cases);
    free(m->text);
}

/* ---- building inputs -------------------------------------------------------------------------- */

/* "file:mod:mod" -> a tensor; its dtype for outputs goes to *want (bf16 marks).
 * With leaf, the loaded tensor is marked requires_grad before the modifiers
 * and returned there (the tensor whose gradient is compared). */
static kl_tensor *fx_build_leaf(const char *spec, kl_dtype *want, kl_tensor **leaf, char *err, size_t cap) {
    char buf[512], path[PATH_MAX + 600];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL, *file = strtok_r(buf, ":", &save);
    snprintf(path, sizeof path, "%s/npy/%s", fx_dir(), file);
    kl_tensor *t = kl_load_npy(path);
    if (!t) {
        snprintf(err, cap, "cannot load %s: %s", file, kl_last_error());
        return NULL;
    }
    if (want) *want = kl_dtype_of(t);
    if (leaf) {
        if (kl_set_requires_grad(t, true) != 0) {
            snprintf(err, cap, "cannot make %s a leaf: %s", file, kl_last_error());
            return NULL;
        }
        *leaf = t;
    }
    for (char *mod; t && (mod = strtok_r(NULL, ":", &save));) {
        if (!strcmp(mod, "bf16")) {
            if (want) *want = KL_BF16;
            else t = kl_to_dtype(t, KL_BF16);
        } else if (!strcmp(mod, "T")) {
            t = kl_transpose(t, -1, -2);
        } else if (!strcmp(mod, "S2")) {
            t = kl_slice(t, -1, 0, INT64_MAX, 2);
        } else if (!strncmp(mod, "E=", 2)) {
            int64_t shape[KL_MAX_DIMS];
            int n = 0;
            for (char *p = mod + 2; *p && n < KL_MAX_DIMS;) {
                char *end;
                shape[n++] = strtoll(p, &end, 10);
                p = *end == 'x' ? end + 1 : end;
            }
            t = kl_expand(t, n, shape);
        } else {
            snprintf(err, cap, "unknown modifier ':%s'", mod);
            return NULL;
        }
    }
    if (!t) snprintf(err, cap, "building %s failed: %s", spec, kl_last_error());
    return t;
}

static kl_tensor *fx_build(const char *spec, kl_dtype *want, char *err, size_t cap) {
    return fx_build_leaf(spec, want, NULL, err, cap);
}

/* ---- comparing -------------------------------------------------------------------------------- */

static double fx_half(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Element i (row-major over the logical shape) read straight from memory,
 * so comparisons do not depend on Kiln's own conversion kernels. */
static void fx_elem(const kl_tensor *t, int64_t i, double *f, int64_t *n) {
    int nd = kl_ndim(t);
    const int64_t *shape = kl_shape(t), *stride = kl_stride(t);
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    const char *p = (const char *)kl_data_ptr(t) + off * (int64_t)kl_dtype_size(kl_dtype_of(t));
    *n = 0;
    *f = 0;
    switch (kl_dtype_of(t)) {
    case KL_F32: { float v; memcpy(&v, p, 4); *f = v; break; }
    case KL_F64: memcpy(f, p, 8); break;
    case KL_F16: { uint16_t h; memcpy(&h, p, 2); *f = fx_half(h); break; }
    case KL_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        uint32_t u = (uint32_t)h << 16;
        float v;
        memcpy(&v, &u, 4);
        *f = v;
        break;
    }
    case KL_I32: { int32_t v; memcpy(&v, p, 4); *n = v; break; }
    case KL_I64: memcpy(n, p, 8); break;
    case KL_U8: case KL_BOOL: *n = *(const uint8_t *)p; break;
    default: break;
    }
}

static double fx_default_tol(kl_dtype d) {
    switch (d) {
    case KL_F32: return 1e-5;
    case KL_F64: return 1e-12;
    case KL_F16: return 1e-3;
    case KL_BF16: return 1e-2;
    default: return 0;
    }
}

static void fx_fmt_shape(char *buf, size_t cap, const kl_tensor *t) {
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < kl_ndim(t) && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ",%lld" : "%lld", (long long)kl_shape(t)[d]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
}

static void fx_fmt_index(char *buf, size_t cap, const kl_tensor *t, int64_t i) {
    int nd = kl_ndim(t);
    int64_t idx[KL_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = i % kl_shape(t)[d];
        i /= kl_shape(t)[d];
    }
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < nd && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ",%lld" : "%lld", (long long)idx[d]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
}

/* 0 if got matches want (shape, dtype want_dt, values), else 1 and a message. */
static int fx_compare(kl_tensor *got, kl_tensor *want, kl_dtype want_dt, double tol, bool values, char *msg,
                      size_t cap) {
    char s1[128], s2[128];
    fx_fmt_shape(s1, sizeof s1, got);
    fx_fmt_shape(s2, sizeof s2, want);
    if (strcmp(s1, s2)) return snprintf(msg, cap, "shape %s, torch %s", s1, s2), 1;
    if (kl_dtype_of(got) != want_dt)
        return snprintf(msg, cap, "dtype %s, torch %s", kl_dtype_name(kl_dtype_of(got)), kl_dtype_name(want_dt)), 1;
    if (!values) return 0;
    bool fl = kl_dtype_is_floating(want_dt);
    int64_t n = kl_numel(want), bad = 0, first = -1;
    double gf = 0, wf = 0;
    int64_t gi = 0, wi = 0;
    for (int64_t i = 0; i < n; i++) {
        double a, b;
        int64_t x, y;
        fx_elem(got, i, &a, &x);
        fx_elem(want, i, &b, &y);
        bool ok;
        if (!fl) ok = x == y;
        else if (isnan(b)) ok = isnan(a);
        else if (isinf(b)) ok = a == b;
        else ok = isfinite(a) && fabs(a - b) <= tol * (1 + fabs(b));
        if (!ok && bad++ == 0) first = i, gf = a, wf = b, gi = x, wi = y;
    }
    if (!bad) return 0;
    fx_fmt_index(s1, sizeof s1, want, first);
    if (fl)
        snprintf(msg, cap, "%lld of %lld differ; first at %s: got %.9g, torch %.9g (tol %g)", (long long)bad,
                 (long long)n, s1, gf, wf, tol);
    else
        snprintf(msg, cap, "%lld of %lld differ; first at %s: got %lld, torch %lld", (long long)bad, (long long)n, s1,
                 (long long)gi, (long long)wi);
    return 1;
}

/* ---- running a case ---------------------------------------------------------------------------- */

static const char *volatile fx_current = "(none)";
static struct sigaction fx_old[NSIG];

/* Names the case that crashed, then hands the signal to whoever had it (CMocka). */
static void fx_on_signal(int sig) {
    static const char pre[] = "\nfixture crashed in case ";
    if (write(2, pre, sizeof pre - 1) < 0 || write(2, fx_current, strlen(fx_current)) < 0 || write(2, "\n", 1) < 0) {
    }
    sigaction(sig, &fx_old[sig], NULL);
    if (fx_old[sig].sa_handler != SIG_DFL && fx_old[sig].sa_handler != SIG_IGN)
        fx_old[sig].sa_handler(sig);
    else
        raise(sig);
}

static void fx_catch_signals(bool on) {
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        if (on) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = fx_on_signal;
            sa.sa_flags = SA_NODEFER;
            sigaction(sigs[i], &sa, &fx_old[sigs[i]]);
        } else {
            sigaction(sigs[i], &fx_old[sigs[i]], NULL);
        }
    }
}

static double fx_case_tol(const fx_case *c, kl_dtype d) {
    for (int i = 0; i < c->nattr; i++)
        if (!strcmp(c->key[i], "tol")) return strtod(c->val[i], NULL);
    return fx_default_tol(d);
}

#define FX_FAIL(...)                                                                \
    do {                                                                            \
        char m_[768];                                                               \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                       \
        print_message("FAIL %s (%s, manifest line %d): %s\n", c->name, c->op, c->line, m_); \
        ok = false;                                                                 \
    } while (0)

/* Runs one case in its own scope; true if it passed. */
static bool fx_run_case(const fx_case *c) {
    bool ok = true;
    fx_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.c = c;
    cx.op = fx_find_op(c->op);
    fx_current = c->name;
    if (!cx.op) {
        FX_FAIL("no runner for op '%s' in test_fixtures.c", c->op);
        return ok;
    }
    kl_clear_error();
    kl_scope_begin();
    char err[512] = "";
    cx.nin = c->nin;
    for (int i = 0; i < c->nin && ok; i++) {
        if (!strcmp(c->in[i], "-")) continue;
        cx.in[i] = fx_build(c->in[i], NULL, err, sizeof err);
        if (!cx.in[i]) FX_FAIL("input %d: %s", i, err);
    }
    if (ok) {
        kl_clear_error();
        int r = cx.op->run(&cx);
        kl_status st = kl_last_status();
        if (cx.bad[0]) {
            FX_FAIL("%s", cx.bad);
        } else if (c->error) {
            if (r == 0)
                FX_FAIL("torch raises (see the manifest comment above the case) but Kiln returned a result");
            else if (st == KL_OK)
                FX_FAIL("failed without recording an error");
        } else if (r != 0) {
            FX_FAIL("Kiln error: %s: %s", kl_status_name(st), kl_last_error());
        } else if (st != KL_OK) {
            FX_FAIL("succeeded but left an error pending: %s", kl_last_error());
        } else if (cx.nout != c->nout) {
            FX_FAIL("%d outputs, torch %d", cx.nout, c->nout);
        } else {
            for (int k = 0; k < c->nout; k++) {
                kl_dtype want_dt;
                kl_tensor *want = fx_build(c->out[k], &want_dt, err, sizeof err);
                char msg[512];
                if (!want)
                    FX_FAIL("output %d: %s", k, err);
                else if (!cx.out[k])
                    FX_FAIL("output %d is NULL", k);
                else if (fx_compare(cx.out[k], want, want_dt, fx_case_tol(c, want_dt), !c->novalues, msg, sizeof msg))
                    FX_FAIL("output %d: %s", k, msg);
            }
        }
    }
    kl_clear_error();
    kl_scope_end();
    fx_current = "(none)";
    return ok;
}

static bool fx_selected(const fx_case *c, const char *filter) {
    return !filter || strstr(c->name, filter) || !strcmp(c->op, filter);
}

/* ---- gradients ---------------------------------------------------------------------------------- */

/* Gradients come from a longer chain of roundings than values (the backward
 * formula after the forward, in either library's own order): f32 is looser.
 * A gradient is as precise as the least precise dtype it went through: its
 * own, or a floating output's (an f64 input added to an f32 tensor gets an
 * f64 gradient summed in f32). */
static double fx_grad_tol(const fx_case *c, kl_dtype d, kl_tensor *const *out, int nout) {
    for (int i = 0; i < c->nattr; i++)
        if (!strcmp(c->key[i], "gtol")) return strtod(c->val[i], NULL);
    bool f32 = d != KL_F64;
    for (int k = 0; k < nout; k++)
        if (out[k] && kl_dtype_of(out[k]) == KL_F32) f32 = true;
    return f32 ? 1e-4 : 1e-10;
}

static bool fx_is_inplace(const fx_case *c) {
    size_t n = strlen(c->op), k = strlen("_inplace");
    return n > k && !strcmp(c->op + n - k, "_inplace");
}

/* The gradient pass of one case (see the top of the file); true if it passed. */
static bool fx_grad_case(const fx_case *c) {
    bool ok = true;
    fx_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.c = c;
    cx.op = fx_find_op(c->op);
    fx_current = c->name;
    if (!cx.op) {
        FX_FAIL("no runner for op '%s' in test_fixtures.c", c->op);
        return ok;
    }
    if (c->ngrad != c->nin || c->ngw != c->nout) {
        FX_FAIL("grad= needs one spec per input and gw= one per output");
        return ok;
    }
    kl_clear_error();
    kl_scope_begin();
    char err[512] = "";
    kl_tensor *leaf[FX_MAX_IN] = {0};
    cx.nin = c->nin;
    for (int i = 0; i < c->nin && ok; i++) {
        if (!strcmp(c->in[i], "-")) continue;
        bool g = strcmp(c->grad[i], "-") != 0;
        cx.in[i] = fx_build_leaf(c->in[i], NULL, g ? &leaf[i] : NULL, err, sizeof err);
        if (!cx.in[i]) FX_FAIL("input %d: %s", i, err);
    }
    if (ok && fx_is_inplace(c) && cx.in[0] && !(cx.in[0] = kl_clone(cx.in[0])))
        FX_FAIL("cloning input 0: %s", kl_last_error());
    kl_tensor *loss = NULL;
    if (ok) {
        kl_clear_error();
        int r = cx.op->run(&cx);
        if (cx.bad[0])
            FX_FAIL("%s", cx.bad);
        else if (r != 0)
            FX_FAIL("forward with requires_grad inputs: %s: %s", kl_status_name(kl_last_status()), kl_last_error());
        else if (cx.nout != c->nout)
            FX_FAIL("%d outputs, torch %d", cx.nout, c->nout);
    }
    for (int k = 0; ok && k < c->nout; k++) {
        if (!strcmp(c->gw[k], "-")) continue;
        kl_tensor *w = fx_build(c->gw[k], NULL, err, sizeof err);
        if (!w) {
            FX_FAIL("weight %d: %s", k, err);
        } else if (!cx.out[k] || !kl_requires_grad(cx.out[k])) {
            FX_FAIL("output %d does not require grad (torch's does)", k);
        } else {
            kl_tensor *term = kl_sum(kl_mul(cx.out[k], w), 0, NULL, false);
            loss = loss && term ? kl_add(loss, term) : term;
            if (!loss) FX_FAIL("loss over output %d: %s", k, kl_last_error());
        }
    }
    if (ok && !loss) FX_FAIL("no floating output to weight");
    if (ok && kl_backward(loss, NULL, NULL) != 0)
        FX_FAIL("backward: %s: %s", kl_status_name(kl_last_status()), kl_last_error());
    bool ran = ok;  /* (every input's gradient is compared, not just up to the first mismatch) */
    for (int i = 0; ran && i < c->nin; i++) {
        if (!leaf[i]) continue;
        kl_dtype want_dt;
        kl_tensor *want = fx_build(c->grad[i], &want_dt, err, sizeof err);
        if (!want) {
            FX_FAIL("gradient %d: %s", i, err);
            continue;
        }
        kl_tensor *got = kl_grad(leaf[i]);
        bool none = !got;
        if (none) got = kl_zeros_like(leaf[i]);
        char msg[512];
        if (fx_compare(got, want, want_dt, fx_grad_tol(c, want_dt, cx.out, cx.nout), true, msg, sizeof msg))
            FX_FAIL("gradient of input %d%s: %s", i, none ? " (none arrived: compared as zeros)" : "", msg);
    }
    kl_clear_error();
    kl_scope_end();
    fx_current = "(none)";
    return ok;
}

/* ---- tests -------------------------------------------------------------------------------------- */

/* Replays a case that succeeded on the CPU with every input moved to the Meta
 * device (and Meta as the default device for creation ops): the op must give
 * outputs of the same shapes and dtypes without touching data, since the
 * tracer will run every op this way. */
/* one_hot with num_classes -1 takes its shape from the data: it has no meta form. */
static bool fx_shape_from_data(const fx_case *c) {
    if (strcmp(c->op, "one_hot")) return false;
    for (int i = 0; i < c->nattr; i++)
        if (!strcmp(c->key[i], "num_classes")) return !strcmp(c->val[i], "-1");
    return false;
}

static bool fx_meta_case(const fx_case *c) {
    bool ok = true;
    if (c->error || !strcmp(c->op, "to_device") || fx_shape_from_data(c)) return ok;
    fx_ctx cx, mx;
    memset(&cx, 0, sizeof cx);
    cx.c = c;
    cx.op = fx_find_op(c->op);
    fx_current = c->name;
    if (!cx.op) return ok;
    kl_clear_error();
    kl_scope_begin();
    char err[512] = "";
    cx.nin = c->nin;
    for (int i = 0; i < c->nin && ok; i++) {
        if (!strcmp(c->in[i], "-")) continue;
        cx.in[i] = fx_build(c->in[i], NULL, err, sizeof err);
        if (!cx.in[i]) FX_FAIL("input %d: %s", i, err);
    }
    mx = cx;
    for (int i = 0; i < c->nin && ok; i++)
        if (cx.in[i]) mx.in[i] = kl_to_device(cx.in[i], KL_DEVICE_META);
    if (ok && cx.op->run(&cx) == 0) {
        kl_device prev = kl_get_default_device();
        kl_set_default_device(KL_DEVICE_META);
        memset(mx.out, 0, sizeof mx.out);
        mx.nout = 0;
        int r = mx.op->run(&mx);
        kl_set_default_device(prev);
        if (r != 0) {
            FX_FAIL("on meta: %s: %s", kl_status_name(kl_last_status()), kl_last_error());
        } else {
            for (int k = 0; k < cx.nout && ok; k++) {
                kl_tensor *a = cx.out[k], *b = mx.out[k];
                if (!b || kl_device_of(b).type != KL_META || kl_dtype_of(a) != kl_dtype_of(b) ||
                    kl_ndim(a) != kl_ndim(b) || memcmp(kl_shape(a), kl_shape(b), sizeof(int64_t) * kl_ndim(a)))
                    FX_FAIL("output %d on meta differs in device, dtype or shape", k);
            }
        }
    }
    kl_clear_error();
    kl_scope_end();
    fx_current = "(none)";
    return ok;
}

/* Runs `run` over the manifest's cases (those with gradient keys only if
 * grads_only), honouring KT_FIXTURE_FILTER / KT_FIXTURE_VERBOSE; fails the
 * test if any case failed, after running them all. */
static void fx_run_all(const char *what, bool grads_only, bool catch_signals, bool (*run)(const fx_case *)) {
    fx_manifest m;
    if (!fx_load_manifest(&m)) {
        fx_free_manifest(&m);
        fail();
    }
    const char *filter = getenv("KT_FIXTURE_FILTER");
    const char *verbose = getenv("KT_FIXTURE_VERBOSE");
    int count = 0, failed = 0;
    if (catch_signals) fx_catch_signals(true);
    for (int i = 0; i < m.n; i++) {
        if ((grads_only && !m.cases[i].ngrad) || !fx_selected(&m.cases[i], filter)) continue;
        if (verbose && *verbose == '1') print_message("%s: %s\n", what, m.cases[i].name);
        count++;
        failed += !run(&m.cases[i]);
    }
    if (catch_signals) fx_catch_signals(false);
    print_message("%s: %d cases run, %d failed\n", what, count, failed);
    fx_free_manifest(&m);
    assert_int_equal(failed, 0);
}

static void fixtures_run_on_meta(void **s) {
    (void)s;
    fx_run_all("fixtures on meta", false, false, fx_meta_case);
}

static void fixtures_match_torch(void **s) {
    (void)s;
    fx_run_all("fixtures", false, true, fx_run_case);
}

/* Gradients of every case with grad keys against torch's (the second pass:
 * the values are checked by fixtures_match_torch). */
static void fixtures_gradients_match_torch(void **s) {
    (void)s;
    fx_run_all("gradients", true, true, fx_grad_case);
}

/* Rows with a derivative that torch cannot give a reference for. Every other
 * row with a derivative (or a decomposition) in ag_derivs must have at least
 * one case whose gradients are compared. */
static const struct {
    const char *row, *why;
} fx_grad_allowlist[] = {
    {"batch_norm_backward", "internal op of batch_norm's derivative (no torch counterpart to call): its own "
                            "derivative, through its decomposition, is what grad_nn.c's gradgradcheck of "
                            "batch_norm checks"},
    {"max_pool2d_backward", "internal op of max_pool2d's derivative (no torch counterpart to call): its own "
                            "derivative, through its decomposition, is what grad_nn.c's gradgradcheck of "
                            "max_pool2d checks"},
    {"conv2d_weight_grad", "internal op of conv2d's derivative (no torch counterpart to call): its own "
                           "derivative, through its decomposition, is what grad_nn.c's gradgradcheck of conv2d "
                           "checks"},
    {"conv2d_input_grad", "internal op of conv2d's derivative (no torch counterpart to call): its own "
                          "derivative, through its decomposition, is what grad_nn.c's gradgradcheck of conv2d "
                          "checks"},
    {"threshold_backward", "internal op of relu's derivative (no public function to call): its own derivative "
                           "is what grad_ew.c's gradgradcheck of relu checks"},
};

/* Every differentiable row has a gradient-checked case unless allowlisted. */
static void fixtures_cover_every_derivative(void **s) {
    (void)s;
    fx_manifest m;
    if (!fx_load_manifest(&m)) {
        fx_free_manifest(&m);
        fail();
    }
    int covered[KE_OP_COUNT] = {0}, bad = 0;
    for (int i = 0; i < m.n; i++) {
        const fx_op *op = fx_find_op(m.cases[i].op);
        int row = op ? fx_row_index(op->row) : -1;
        if (row >= 0 && m.cases[i].ngrad) covered[row]++;
    }
    int rows = 0;
    for (int r = 0; r < KE_OP_COUNT; r++) {
        bool diff = ag_derivs[r].fn || ag_derivs[r].decomp;
        const char *why = NULL;
        for (size_t a = 0; a < sizeof fx_grad_allowlist / sizeof fx_grad_allowlist[0]; a++)
            if (!strcmp(fx_grad_allowlist[a].row, ke_ops[r].name)) why = fx_grad_allowlist[a].why;
        rows += diff;
        if (diff && !covered[r] && !why) {
            print_message("op '%s' has a derivative but no gradient-checked fixture case\n", ke_ops[r].name);
            bad++;
        } else if (covered[r] && why) {
            print_message("op '%s' is in fx_grad_allowlist but has %d gradient cases: drop it\n", ke_ops[r].name,
                          covered[r]);
            bad++;
        } else if (covered[r] && !diff && !(ke_ops[r].flags & KE_F_IMPLICIT)) {
            /* (implicit rows decompose before autograd: their pieces' derivatives run) */
            print_message("op '%s' has gradient cases but no derivative in ag_derivs\n", ke_ops[r].name);
            bad++;
        }
    }
    print_message("derivatives: %d rows, gradient fixtures cover every one not allowlisted: %s\n", rows,
                  bad ? "no" : "yes");
    fx_free_manifest(&m);
    assert_int_equal(bad, 0);
}

/* Every op-table row has a value-checked case unless allowlisted (with a reason). */
static void fixtures_cover_every_op(void **s) {
    (void)s;
    fx_manifest m;
    if (!fx_load_manifest(&m)) {
        fx_free_manifest(&m);
        fail();
    }
    int covered[KE_OP_COUNT] = {0}, any[KE_OP_COUNT] = {0}, bad = 0;
    for (int i = 0; i < m.n; i++) {
        const fx_op *op = fx_find_op(m.cases[i].op);
        int row = op ? fx_row_index(op->row) : -1;
        if (row < 0) {
            print_message("case %s: op '%s' has no runner or row\n", m.cases[i].name, m.cases[i].op);
            bad++;
            continue;
        }
        any[row]++;
        if (!m.cases[i].error && !m.cases[i].novalues) covered[row]++;
    }
    for (int r = 0; r < KE_OP_COUNT; r++) {
        const char *why = NULL;
        for (size_t a = 0; a < sizeof fx_allowlist / sizeof fx_allowlist[0]; a++)
            if (!strcmp(fx_allowlist[a].row, ke_ops[r].name)) why = fx_allowlist[a].why;
        if (!covered[r] && !why) {
            print_message("op '%s' has no value-checked fixture case (%d cases in all)\n", ke_ops[r].name, any[r]);
            bad++;
        } else if (covered[r] && why) {
            print_message("op '%s' is allowlisted but has %d value-checked cases: drop it from fx_allowlist\n",
                          ke_ops[r].name, covered[r]);
            bad++;
        }
    }
    for (size_t a = 0; a < sizeof fx_allowlist / sizeof fx_allowlist[0]; a++)
        if (fx_row_index(fx_allowlist[a].row) < 0) {
            print_message("allowlisted op '%s' is not in the op table\n", fx_allowlist[a].row);
            bad++;
        }
    fx_free_manifest(&m);
    assert_int_equal(bad, 0);
}

/* The runner table names real rows and has no duplicate names. */
static void fixtures_runner_table_is_consistent(void **s) {
    (void)s;
    size_t n = sizeof fx_ops / sizeof fx_ops[0];
    for (size_t i = 0; i < n; i++) {
        if (fx_row_index(fx_ops[i].row) < 0) fail_msg("runner '%s' names unknown row '%s'", fx_ops[i].name, fx_ops[i].row);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(fx_ops[i].name, fx_ops[j].name)) fail_msg("runner '%s' listed twice", fx_ops[i].name);
    }
}

/* ---- every op by name: kl_op_call replays what a call recorded -------------------------------- */

/* Each case's op (and, for a case with gradient keys, its backward's ops) is recorded as the
 * dispatcher sees it: every outermost ke_call, through ke_observed_dispatch (wrapped at link
 * time, tests/meson.build), which the dispatcher takes while ke_observe is set. A call's
 * attributes are then printed as a graph prints a node's (ke_attrs_to_string, the IR's own
 * printer), parsed back by kl_op_call with copies of the call's inputs, and its results must
 * equal the recorded ones bitwise. Every row of the op table must be replayed so at least once:
 * a new op whose attributes do not round-trip through the text fails here. The same cases are
 * also traced (tr_trace) and the graph replayed node by node through kl_op_call, as a repro
 * bundle's replay.c does, against the eager results. */

#include "log.h"
#include "trace.h"

#include <stdatomic.h>


typedef struct fx_rec {
    int op, inplace, nin, nout;
    ke_attrs a;
    kl_tensor *in[8];          /* the call's inputs; for an in-place call, input 0 before the call */
    kl_tensor *out[KE_MAX_OUT]; /* its results */
} fx_rec;

static struct {
    int on, depth, calls;
    const fx_case *c;           /* the case (for messages) */
    bool ok;
    int *replayed;              /* per row: calls replayed */
    bool only_new;              /* record only rows not replayed yet, at any depth */
} fx_spy;

static bool fx_replay_rec(const fx_case *c, const fx_rec *r, int *replayed);

/* ---- kl_op_call with extreme attributes ------------------------------------------------------ */

/* The first recorded call of each row (fx_spy's), kept to call it again with other attributes. */
typedef struct fx_first {
    int have, nin;
    ke_attrs a;
    kl_tensor *in[8];
} fx_first;
static fx_first fx_firsts[KE_OP_COUNT];

/* Each outermost call, replayed by name right after it ran (its inputs as they were then). */
int __real_ke_observed_dispatch(ke_call *c);
int __wrap_ke_observed_dispatch(ke_call *c) {
    fx_spy.depth++;
    /* the outermost calls; in only_new mode also nested ones (a decomposition's pieces) */
    if (!fx_spy.on || (fx_spy.depth > 1 && !fx_spy.only_new) || c->nin > 8 ||
        (fx_spy.only_new && fx_spy.replayed[c->op])) {
        int rc = __real_ke_observed_dispatch(c);
        fx_spy.depth--;
        return rc;
    }
    fx_rec r;
    memset(&r, 0, sizeof r);
    r.op = c->op, r.inplace = c->inplace, r.nin = c->nin, r.a = c->a;
    kl_no_grad_begin(); /* (the clone belongs to the case's scope) */
    for (int i = 0; i < c->nin; i++) r.in[i] = c->inplace && i == 0 ? kl_clone(c->in[i]) : c->in[i];
    kl_no_grad_end();
    int rc = __real_ke_observed_dispatch(c);
    if (rc == 0) {
        r.nout = c->nout;
        for (int j = 0; j < c->nout && j < KE_MAX_OUT; j++) r.out[j] = c->out[j];
        fx_spy.calls++;
        fx_spy.on = 0; /* the replay's own calls are not recorded */
        fx_spy.ok &= fx_replay_rec(fx_spy.c, &r, fx_spy.replayed);
        fx_first *first = &fx_firsts[r.op];
        if (!first->have && !r.inplace) { /* kept for fixtures_replay_by_name's extremes */
            first->have = 1, first->nin = r.nin, first->a = r.a;
            kl_no_grad_begin();
            for (int i = 0; i < r.nin; i++) first->in[i] = kl_retain(kl_detach(r.in[i]));
            kl_no_grad_end();
        }
        fx_spy.on = 1;
    }
    fx_spy.depth--;
    return rc;
}

static void fx_spy_start(const fx_case *c, int *replayed, bool only_new) {
    fx_spy.c = c;
    fx_spy.ok = true;
    fx_spy.replayed = replayed;
    fx_spy.only_new = only_new;
    fx_spy.on = 1;
    atomic_store(&ke_observe, 1); /* the dispatcher's slow path, where the spy sits */
}

static bool fx_spy_stop(void) {
    fx_spy.on = 0;
    ke_observe_update();
    return fx_spy.ok;
}

/* got and want: same dtype, shape and bytes (values: false compares dtype and shape only). */
static bool fx_bitwise(kl_tensor *got, kl_tensor *want, bool values, char *msg, size_t cap) {
    if (!got || !want) return snprintf(msg, cap, "missing tensor"), false;
    if (kl_dtype_of(got) != kl_dtype_of(want) || kl_ndim(got) != kl_ndim(want) ||
        memcmp(kl_shape(got), kl_shape(want), sizeof(int64_t) * (size_t)kl_ndim(got))) {
        snprintf(msg, cap, "dtype or shape differ (%s vs %s)", kl_dtype_name(kl_dtype_of(got)),
                 kl_dtype_name(kl_dtype_of(want)));
        return false;
    }
    if (!values || kl_numel(got) == 0) return true;
    kl_tensor *a = kl_contiguous(got), *b = kl_contiguous(want);
    if (!a || !b || memcmp(kl_data_ptr(a), kl_data_ptr(b), (size_t)kl_numel(a) * kl_dtype_size(kl_dtype_of(a)))) {
        snprintf(msg, cap, "values differ");
        return false;
    }
    return true;
}

/* kl_op_call of recorded call r, from its attribute text; true if it gave r's results. */
static bool fx_replay_rec(const fx_case *c, const fx_rec *r, int *replayed) {
    bool ok = true;
    const ke_attr_set *set = &ke_op_attrs[r->op];
    int random = (ke_ops[r->op].flags & KE_F_RANDOM) != 0;
    char *text = ke_attrs_to_string(set, random, &r->a);
    assert_non_null(text);
    /* the text parses back to the same attributes: printed again, it is the same text */
    ke_attrs back;
    char name[64];
    snprintf(name, sizeof name, "%s%s", ke_ops[r->op].name, r->inplace ? "_" : "");
    if (ke_attrs_parse(set, random, text, &back, "op_call", name) < 0) {
        FX_FAIL("kl_%s: its attribute text \"%s\" does not parse: %s", name, text, kl_last_error());
    } else {
        char *again = ke_attrs_to_string(set, random, &back);
        assert_non_null(again);
        if (strcmp(again, text)) FX_FAIL("kl_%s: \"%s\" reads back as \"%s\"", name, text, again);
        free(again);
    }
    kl_clear_error();
    kl_scope_begin();
    kl_tensor *in[8], *out[KE_MAX_OUT] = {0};
    for (int i = 0; i < r->nin; i++) in[i] = r->inplace && i == 0 ? kl_clone(r->in[i]) : r->in[i];
    if (ok && kl_op_call(name, in, r->nin, text, out, r->nout) != 0) {
        FX_FAIL("kl_op_call(\"%s\", %d inputs, \"%s\"): %s", name, r->nin, text, kl_last_error());
    } else if (ok) {
        /* empty's values are whatever the memory held */
        bool values = r->op != KE_OP_empty;
        for (int j = 0; j < r->nout && ok; j++) {
            char msg[256];
            if (!fx_bitwise(out[j], r->out[j], values, msg, sizeof msg))
                FX_FAIL("kl_op_call(\"%s\", \"%s\") output %d: %s", name, text, j, msg);
        }
        if (ok && r->inplace && out[0] != in[0]) FX_FAIL("kl_op_call(\"%s\") did not write into its input", name);
    }
    if (ok) replayed[r->op]++;
    kl_clear_error();
    kl_scope_end();
    free(text);
    return ok;
}

/* kl_op_call of row op on first's inputs with attribute d set to each of some extreme values:
 * a result, or an error with a message; never a crash (the ASan suites run it too). Returns
 * the calls made. */
static int fx_extremes(int op, const fx_first *f) {
    static const int64_t ints[] = {-1, 0, 2, -(1ll << 40), 1ll << 40, INT64_MAX, INT64_MIN, 7};
    static const double floats[] = {-1, 0, 1e300, -1e300, INFINITY, -INFINITY, NAN, 0.5};
    const ke_attr_set *set = &ke_op_attrs[op];
    int random = (ke_ops[op].flags & KE_F_RANDOM) != 0, calls = 0;
    char name[64];
    snprintf(name, sizeof name, "%s", ke_ops[op].name);
    for (int k = 0; k < set->n; k++) {
        const ke_attr_desc *d = &set->attr[k];
        for (int v = 0; v < 8; v++) {
            ke_attrs a = f->a;
            switch ((ke_attr_type)d->type) {
            case KE_AT_FLOAT: ke_attr_set_float_at(&a, d, floats[v]); break;
            case KE_AT_LIST:
            case KE_AT_LIST2: {
                int n = d->type == KE_AT_LIST2 ? 2 : v % 4 == 3 ? KE_MAX_LIST - d->slot : v % 3;
                if (d->slot + n > KE_MAX_LIST) continue;
                for (int e = 0; e < n; e++) a.list[d->slot + e] = ints[(v + e) % 8];
                if (d->type == KE_AT_LIST) a.nlist = d->slot + n;
                else if (a.nlist < d->slot + 2) a.nlist = d->slot + 2;
                break;
            }
            case KE_AT_DTYPE: ke_attr_set_int_at(&a, d, v % KL_NUM_DTYPES); break;
            case KE_AT_BOOL: ke_attr_set_int_at(&a, d, v & 1); break;
            case KE_AT_REDUCTION: ke_attr_set_int_at(&a, d, v % 3); break;
            case KE_AT_DEVICE: ke_attr_set_int_at(&a, d, v & 1 ? KL_META : KL_CPU); break; /* no CUDA here */
            default: ke_attr_set_int_at(&a, d, ints[v]); break;
            }
            char *text = ke_attrs_to_string(set, random, &a);
            assert_non_null(text);
            kl_scope_begin();
            kl_tensor *in[8], *out[KE_MAX_OUT];
            for (int i = 0; i < f->nin; i++) in[i] = kl_clone(f->in[i]);
            int nout = ke_ops[op].nout >= 0 ? ke_ops[op].nout : 1;
            int rc = kl_op_call(name, in, f->nin, text, out, nout);
            if (rc != 0 && (kl_last_status() == KL_OK || !kl_last_error()[0]))
                fail_msg("kl_op_call(\"%s\", \"%s\") failed without an error", name, text);
            kl_clear_error();
            kl_scope_end();
            free(text);
            calls++;
        }
    }
    return calls;
}

/* The case's runner as a traceable function: inputs in, outputs out. */
static int fx_traced(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    fx_ctx *cx = user;
    for (int i = 0; i < n_in; i++) cx->in[i] = in[i];
    memset(cx->out, 0, sizeof cx->out);
    cx->nout = 0;
    int r = cx->op->run(cx);
    for (int j = 0; j < n_out; j++) out[j] = j < cx->nout ? cx->out[j] : NULL;
    return r;
}

/* The case traced into a graph and the graph replayed node by node with kl_op_call (a random
 * node's per-call slot reserved afresh, as a compiled call does: the same numbers as the eager
 * run from the same seed), against the eager results. Cases whose trace breaks are skipped. */
static bool fx_replay_graph(const fx_case *c, int *graphs) {
    bool ok = true;
    char err[512] = "";
    kl_tensor *in[FX_MAX_IN] = {0}, *eager[FX_MAX_OUT] = {0}, *got[FX_MAX_OUT] = {0};
    fx_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.c = c;
    cx.op = fx_find_op(c->op);
    cx.nin = c->nin;
    for (int i = 0; i < c->nin; i++) {
        if (!(in[i] = fx_build(c->in[i], NULL, err, sizeof err))) return true; /* fx_run_case says it */
        cx.in[i] = kl_clone(in[i]);
    }
    kl_manual_seed(77);
    if (cx.op->run(&cx) != 0 || cx.bad[0]) {
        kl_clear_error();
        return true; /* the value pass reports it */
    }
    int nout = cx.nout;
    for (int j = 0; j < nout; j++) eager[j] = cx.out[j];
    int broke = 0;
    char why[256];
    kl_manual_seed(77);
    ir_graph *g = tr_trace(fx_traced, &cx, in, c->nin, nout, &broke, why, sizeof why);
    if (!g) {
        if (!broke) FX_FAIL("tracing failed: %s", kl_last_error());
        kl_clear_error();
        return ok;
    }
    kl_manual_seed(77);
    kl_tensor **vals = calloc((size_t)g->nvalues + 1, sizeof *vals);
    assert_non_null(vals);
    for (int i = 0; i < g->ninputs; i++) vals[g->inputs[i]] = kl_clone(in[i]);
    for (int32_t k = 0; k < g->nnodes && ok; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->op == IR_OP_SCALAR) {
            double v = ir_attr_scalar_value(&n->a);
            vals[n->out[0]] = ir_attr_scalar_wrapped(&n->a) ? kl_wrapped_scalar(v)
                                                           : kl_scalar_tensor(v, ir_attr_scalar_dtype(&n->a));
            continue;
        }
        if (n->op == IR_OP_CAPTURED) {
            vals[n->out[0]] = g->captured[ir_attr_captured_index(&n->a)];
            continue;
        }
        assert_true(n->op < KE_OP_COUNT);
        kl_tensor *nin[16], *nout_t[KE_MAX_OUT] = {0};
        assert_true(n->nin <= 16);
        for (int i = 0; i < n->nin; i++) nin[i] = vals[n->in[i]];
        ke_call rc = {.op = n->op, .nin = n->nin, .in = nin};
        rc.a = n->a;
        if ((ke_ops[n->op].flags & KE_F_RANDOM) && ke_attr_offset(&rc.a) == IR_RANDOM_SLOT)
            assert_int_equal(ke_random_reserve(&rc), 0);
        char *text = ke_attrs_to_string(&ke_op_attrs[n->op], (ke_ops[n->op].flags & KE_F_RANDOM) != 0, &rc.a);
        char name[64];
        snprintf(name, sizeof name, "%s%s", ke_ops[n->op].name, n->inplace ? "_" : "");
        if (kl_op_call(name, nin, n->nin, text, nout_t, n->nout) != 0)
            FX_FAIL("graph node %d: kl_op_call(\"%s\", \"%s\"): %s", (int)k, name, text, kl_last_error());
        for (int j = 0; j < n->nout && ok; j++) vals[n->out[j]] = nout_t[j];
        free(text);
    }
    for (int j = 0; j < g->noutputs && ok; j++) {
        got[j] = vals[g->outputs[j]];
        char msg[256];
        if (!fx_bitwise(got[j], eager[j], strcmp(cx.op->row, "empty") != 0, msg, sizeof msg))
            FX_FAIL("graph replayed by name: output %d: %s", j, msg);
    }
    if (ok) (*graphs)++;
    free(vals);
    ir_graph_free(g);
    kl_clear_error();
    return ok;
}

static int fx_byname_replayed[KE_OP_COUNT];
static int fx_byname_graphs;

/* One case: its calls recorded and replayed by name, then its graph. */
static bool fx_byname_case(const fx_case *c) {
    bool ok = true;
    if (c->error || fx_shape_from_data(c)) return ok;
    fx_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.c = c;
    cx.op = fx_find_op(c->op);
    fx_current = c->name;
    if (!cx.op) return ok;
    kl_clear_error();
    kl_scope_begin();
    char err[512] = "";
    kl_tensor *leaf[FX_MAX_IN] = {0};
    cx.nin = c->nin;
    for (int i = 0; i < c->nin && ok; i++) {
        if (!strcmp(c->in[i], "-")) continue;
        bool g = c->ngrad && strcmp(c->grad[i], "-") != 0;
        cx.in[i] = fx_build_leaf(c->in[i], NULL, g ? &leaf[i] : NULL, err, sizeof err);
        if (!cx.in[i]) FX_FAIL("input %d: %s", i, err);
    }
    if (ok && c->ngrad && fx_is_inplace(c) && cx.in[0]) cx.in[0] = kl_clone(cx.in[0]);
    kl_manual_seed(77);
    fx_spy_start(c, fx_byname_replayed, false);
    int r = ok ? cx.op->run(&cx) : -1;
    ok &= fx_spy_stop();
    if (r == 0 && !cx.bad[0]) {
        /* the backward's ops (derivatives call ops of their own: max_pool2d_backward, ...), those
         * no call replayed yet */
        kl_tensor *loss = NULL;
        for (int k = 0; c->ngrad && k < c->nout && k < cx.nout; k++) {
            if (!strcmp(c->gw[k], "-") || !cx.out[k] || !kl_requires_grad(cx.out[k])) continue;
            kl_tensor *w = fx_build(c->gw[k], NULL, err, sizeof err);
            kl_tensor *term = w ? kl_sum(kl_mul(cx.out[k], w), 0, NULL, false) : NULL;
            loss = loss && term ? kl_add(loss, term) : term;
        }
        if (loss) {
            /* create_graph: the internal composites (max_pool2d_backward, ...) then run their
             * decompositions, whose pieces (max_pool2d_indices) are recorded too */
            kl_backward_options bo = kl_backward_options_default();
            bo.create_graph = true;
            bo.allow_unused = true;
            kl_tensor *leaves[FX_MAX_IN], *grads[FX_MAX_IN];
            int nl = 0;
            for (int i = 0; i < c->nin; i++)
                if (leaf[i]) leaves[nl++] = leaf[i];
            fx_spy_start(c, fx_byname_replayed, true);
            /* (kl_autograd_grad: a leaf's grad holding a graph that saved the leaf is a cycle) */
            if (nl) kl_autograd_grad(1, &loss, NULL, nl, leaves, grads, &bo);
            ok &= fx_spy_stop();
        }
    }
    kl_clear_error();
    kl_scope_end();
    /* the graph of the case, replayed by name */
    if (ok) {
        kl_scope_begin();
        kl_no_grad_begin();
        ok = fx_replay_graph(c, &fx_byname_graphs);
        kl_no_grad_end();
        kl_clear_error();
        kl_scope_end();
    }
    fx_current = "(none)";
    return ok;
}

/* Every op of the table, called by name from its attribute text, gives what its own call gave;
 * every row is replayed so at least once. */
static void fixtures_replay_by_name(void **s) {
    (void)s;
    memset(fx_byname_replayed, 0, sizeof fx_byname_replayed);
    fx_byname_graphs = 0;
    fx_run_all("by name", false, false, fx_byname_case);
    if (getenv("KT_FIXTURE_FILTER")) return;
    int missing = 0;
    for (int r = 0; r < KE_OP_COUNT; r++)
        if (!fx_byname_replayed[r]) {
            print_message("op '%s': no recorded call of it was replayed by kl_op_call\n", ke_ops[r].name);
            missing++;
        }
    print_message("by name: every op of the table replayed (%d rows), %d case graphs replayed node by node\n",
                  KE_OP_COUNT - missing, fx_byname_graphs);
    /* each row again with each attribute at extreme values: results or clean errors */
    int calls = 0;
    for (int r = 0; r < KE_OP_COUNT; r++)
        if (fx_firsts[r].have) calls += fx_extremes(r, &fx_firsts[r]);
    print_message("by name: %d calls with extreme attribute values, none crashed\n", calls);
    for (int r = 0; r < KE_OP_COUNT; r++) {
        for (int i = 0; i < fx_firsts[r].nin; i++) kl_release(fx_firsts[r].in[i]);
        memset(&fx_firsts[r], 0, sizeof fx_firsts[r]);
    }
    assert_int_equal(missing, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(fixtures_runner_table_is_consistent),
        KT_TEST(fixtures_cover_every_op),
        KT_TEST(fixtures_match_torch),
        KT_TEST(fixtures_run_on_meta),
        KT_TEST(fixtures_cover_every_derivative),
        KT_TEST(fixtures_gradients_match_torch),
        KT_TEST(fixtures_replay_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
