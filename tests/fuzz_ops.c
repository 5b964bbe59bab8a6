/*
 * fuzz_ops.c — fuzzes the op API. The input bytes decode into a short
 * program: up to four input tensors (dtype, small shape, maybe a strided
 * view), then up to 16 ops on a pool of tensors, each with attribute values
 * drawn mostly from their extremes (0, negative, INT64/INT32 limits, huge
 * steps, kernel sizes and dilations). Checked for every op: no sanitizer
 * report, no hang (libFuzzer's -timeout), a result or a clean error (NULL
 * and a non-empty kl_last_error with a status), nothing leaked when the
 * scope closes. When the first byte asks for it, the same program is
 * compiled twice (FUSE mode, backends "llvm" and "interp"). An op that fails
 * while tracing though it ran eagerly is a finding (unless the trace broke:
 * the call then runs eagerly and must give eager's results); where the same ops
 * failed in both runs, the compiled call must succeed (or fail with
 * KL_ERR_OOM) and each result equal the eager one (within the dtype's
 * tolerance; NaN equals NaN).
 *
 * Plain build: replays tests/fuzz/ops/ (the `fuzz_ops` test); libFuzzer:
 * scripts/kiln.sh fuzz. Random ops are left out (a compiled call draws new
 * numbers), and so are results over 2^22 elements (kept out of the pool so a
 * program stays fast; the op that made one was still checked).
 */
#include "fuzz_replay.h"

#include <math.h>
#include <stdbool.h>

#include "kiln.h"

#define MAX_POOL 12
#define MAX_OPS 16
#define MAX_IN 4
#define MAX_ELEMS (1 << 22)

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_ops: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* ---- the byte reader: past the end every read is 0 ------------------------ */

typedef struct rd {
    const uint8_t *p;
    size_t n, at;
} rd;

static unsigned u8(rd *r) { return r->at < r->n ? r->p[r->at++] : 0; }

/* A size-like attribute: mostly small, often an extreme. */
static int64_t attr(rd *r) {
    static const int64_t extremes[] = {
        0,          -1,         -2,          INT64_MAX,  INT64_MIN,         INT64_MAX - 1, INT64_MIN + 1,
        INT32_MAX,  INT32_MIN,  1ll << 31,   1ll << 32,  (1ll << 62),       -(1ll << 62),  1ll << 40,
        UINT32_MAX, 1ll << 20,  -(1ll << 31), 65536,     INT64_MAX / 2 + 1, 1000003,       -1000003,
    };
    unsigned b = u8(r);
    if (b < 160) return (int64_t)(b % 9) - 2; /* -2..6 */
    if (b < 224) return extremes[(b - 160) % (sizeof extremes / sizeof extremes[0])];
    int64_t v = 0;
    for (int i = 0; i < 8; i++) v = (int64_t)((uint64_t)v << 8 | u8(r));
    return v;
}

static int dim_attr(rd *r) {
    int64_t v = attr(r);
    return v > INT32_MAX || v < INT32_MIN ? (int)(v >> 32) : (int)v;
}

static double dbl(rd *r) {
    static const double vals[] = {0, 1, -1, 0.5, 2, -3.5, 1e-8, 1e30, -1e30, INFINITY, -INFINITY, NAN, 1e308, 4.9e-324};
    unsigned b = u8(r);
    return b < 200 ? vals[b % (sizeof vals / sizeof vals[0])] : (double)attr(r);
}

static kl_dtype dtype(rd *r) {
    static const kl_dtype dts[] = {KL_F32, KL_F32, KL_F32, KL_F64, KL_F64, KL_I32, KL_I64, KL_BOOL, KL_F16, KL_BF16, KL_U8};
    return dts[u8(r) % (sizeof dts / sizeof dts[0])];
}

/* ---- the program ---------------------------------------------------------- */

enum {
    OP_UNARY, OP_BINARY, OP_TO_DTYPE, OP_SLICE, OP_NARROW, OP_SELECT, OP_RESHAPE, OP_VIEW, OP_PERMUTE,
    OP_TRANSPOSE, OP_EXPAND, OP_SQUEEZE, OP_UNSQUEEZE, OP_FLATTEN, OP_AS_STRIDED, OP_REDUCE, OP_ARGMAX,
    OP_VAR, OP_NORM, OP_CUMSUM, OP_CAT, OP_STACK, OP_SPLIT, OP_CHUNK, OP_REPEAT, OP_PAD, OP_INDEX_SELECT,
    OP_GATHER, OP_EMBEDDING, OP_MASKED_FILL, OP_TRIL, OP_CLAMP, OP_MATMUL, OP_LINEAR, OP_SOFTMAX,
    OP_LAYER_NORM, OP_CONV2D, OP_POOL2D, OP_LOSS, OP_ARANGE, OP_LINSPACE, OP_EYE, OP_FULL, OP_WHERE,
    OP_COUNT
};

typedef struct op {
    int kind;
    int sub;        /* which unary/binary/reduce/... */
    int a, b, c;    /* operand slots in the pool (taken modulo its size) */
    int n;          /* count of the list attribute */
    int64_t v[8];   /* list attribute (shape, dims, pads, options) */
    int d0, d1;     /* dims */
    double x, y, z; /* float attributes */
    kl_dtype dt;
    bool flag;
} op;

typedef struct program {
    int n_in, n_ops;
    kl_dtype in_dt[MAX_IN];
    int in_nd[MAX_IN];
    int64_t in_shape[MAX_IN][4];
    int in_view[MAX_IN]; /* 0 contiguous, 1 transposed, 2 every other element of the last dim */
    op ops[MAX_OPS];
} program;

static void decode(rd *r, program *p) {
    memset(p, 0, sizeof *p);
    p->n_in = 1 + (int)(u8(r) % MAX_IN);
    for (int i = 0; i < p->n_in; i++) {
        p->in_dt[i] = dtype(r);
        p->in_nd[i] = (int)(u8(r) % 5);
        for (int d = 0; d < p->in_nd[i]; d++) p->in_shape[i][d] = (int64_t)(u8(r) % 6);
        p->in_view[i] = (int)(u8(r) % 3);
    }
    p->n_ops = 1 + (int)(u8(r) % MAX_OPS);
    for (int k = 0; k < p->n_ops; k++) {
        op *o = &p->ops[k];
        o->kind = (int)(u8(r) % OP_COUNT);
        o->sub = (int)u8(r);
        o->a = (int)u8(r);
        o->b = (int)u8(r);
        o->c = (int)u8(r);
        o->n = (int)(u8(r) % 9) - 1; /* -1..7 */
        for (int i = 0; i < 8; i++) o->v[i] = attr(r);
        o->d0 = dim_attr(r);
        o->d1 = dim_attr(r);
        o->x = dbl(r);
        o->y = dbl(r);
        o->z = dbl(r);
        o->dt = dtype(r);
        o->flag = u8(r) & 1;
        if (r->at >= r->n) {
            p->n_ops = k + 1;
            break;
        }
    }
}

static kl_tensor *make_input(const program *p, int i) {
    const int64_t *sh = p->in_shape[i];
    int nd = p->in_nd[i];
    int64_t full[4];
    memcpy(full, sh, sizeof full);
    if (p->in_view[i] == 2 && nd > 0) full[nd - 1] = sh[nd - 1] * 2;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= full[d];
    /* values -3..3 in halves: exact in every float dtype, no overflow in sums */
    kl_tensor *t = kl_remainder_scalar(kl_arange(0, (double)n, 1, KL_F64), 7);
    t = kl_mul_scalar(kl_sub_scalar(t, 3), 0.5);
    t = kl_to_dtype(kl_reshape(t, nd, full), p->in_dt[i]);
    if (p->in_view[i] == 1 && nd >= 2) t = kl_contiguous(kl_transpose(t, 0, nd - 1)), t = kl_transpose(t, 0, nd - 1);
    if (p->in_view[i] == 2 && nd > 0) t = kl_slice(t, nd - 1, 0, full[nd - 1], 2);
    if (!t) finding("making an input failed", kl_last_error());
    return t;
}

typedef struct pool {
    kl_tensor *t[MAX_POOL];
    int n, next;
} pool;

static kl_tensor *pick(pool *pl, int slot) { return pl->n ? pl->t[slot % pl->n] : NULL; }

static void push(pool *pl, kl_tensor *t) {
    if (kl_numel(t) > MAX_ELEMS) return;
    if (pl->n < MAX_POOL) pl->t[pl->n++] = t;
    else pl->t[pl->next++ % MAX_POOL] = t;
}

static kl_tensor *unary(int which, kl_tensor *x) {
    switch (which % 8) {
    case 0: return kl_neg(x);
    case 1: return kl_exp(x);
    case 2: return kl_sqrt(x);
    case 3: return kl_tanh(x);
    case 4: return kl_relu(x);
    case 5: return kl_abs(x);
    case 6: return kl_clone(x);
    default: return kl_contiguous(x);
    }
}

static kl_tensor *binary(int which, kl_tensor *a, kl_tensor *b) {
    switch (which % 11) {
    case 0: return kl_add(a, b);
    case 1: return kl_sub(a, b);
    case 2: return kl_mul(a, b);
    case 3: return kl_div(a, b);
    case 4: return kl_remainder(a, b);
    case 5: return kl_pow(a, b);
    case 6: return kl_fmod(a, b);
    case 7: return kl_bitwise_and(a, b);
    case 8: return kl_maximum(a, b);
    case 9: return kl_gt(a, b);
    default: return kl_mse_loss(a, b, KL_REDUCE_MEAN);
    }
}

static int listn(const op *o) { return o->n < 0 ? 0 : o->n; }

/* One op; NULL with an error recorded, or its result (a list op returns its first piece). */
static kl_tensor *run_op(const op *o, pool *pl) {
    kl_tensor *a = pick(pl, o->a), *b = pick(pl, o->b), *c = pick(pl, o->c);
    int n = listn(o);
    const int64_t *v = o->v;
    switch (o->kind) {
    case OP_UNARY: return unary(o->sub, a);
    case OP_BINARY: return binary(o->sub, a, b);
    case OP_TO_DTYPE: return kl_to_dtype(a, o->dt);
    case OP_SLICE: return kl_slice(a, o->d0, v[0], v[1], v[2]);
    case OP_NARROW: return kl_narrow(a, o->d0, v[0], v[1]);
    case OP_SELECT: return kl_select(a, o->d0, v[0]);
    case OP_RESHAPE: return kl_reshape(a, o->n, o->n < 0 ? NULL : v);
    case OP_VIEW: return kl_view(a, o->n, o->n < 0 ? NULL : v);
    case OP_PERMUTE: return kl_permute(a, n, v);
    case OP_TRANSPOSE: return kl_transpose(a, o->d0, o->d1);
    case OP_EXPAND: return kl_expand(a, n, v);
    case OP_SQUEEZE: return kl_squeeze(a, o->d0);
    case OP_UNSQUEEZE: return kl_unsqueeze(a, o->d0);
    case OP_FLATTEN: return kl_flatten(a, o->d0, o->d1);
    case OP_AS_STRIDED: {
        int k = n > 4 ? 4 : n;
        return kl_as_strided(a, k, v, v + 4, o->flag ? v[7] : 0);
    }
    case OP_REDUCE: {
        int k = n > 4 ? 4 : n;
        switch (o->sub % 5) {
        case 0: return kl_sum(a, k, v, o->flag);
        case 1: return kl_mean(a, k, v, o->flag);
        case 2: return kl_prod(a, k, v, o->flag);
        case 3: return kl_amax(a, k, v, o->flag);
        default: return kl_logsumexp(a, k, v, o->flag);
        }
    }
    case OP_ARGMAX: return kl_argmax(a, o->d0, o->flag);
    case OP_VAR: return (o->sub & 1 ? kl_var : kl_std)(a, n > 4 ? 4 : n, v, o->x, o->flag);
    case OP_NORM: return kl_norm(a, o->x, n > 4 ? 4 : n, v, o->flag);
    case OP_CUMSUM: return (o->sub & 1 ? kl_cumsum : kl_cumprod)(a, o->d0);
    case OP_CAT:
    case OP_STACK: {
        kl_tensor *ts[3] = {a, b, c};
        int k = o->n < 0 ? 0 : 1 + o->n % 3;
        return o->kind == OP_CAT ? kl_cat(k, ts, o->d0) : kl_stack(k, ts, o->d0);
    }
    case OP_SPLIT:
    case OP_CHUNK: {
        kl_tensor *out[8] = {0};
        int got = o->kind == OP_SPLIT ? kl_split(a, v[0], o->d0, out, 8) : kl_chunk(a, (int)v[0], o->d0, out, 8);
        if (got < 0) return NULL;
        /* The count is every piece there is (kiln.h), which may exceed
         * max_out: only the first min(got, 8) were made. Asking for none must
         * count the same. */
        int made = got < 8 ? got : 8;
        for (int i = 1; i < made; i++)
            if (!out[i]) finding("kl_split/kl_chunk left a NULL piece", NULL);
        int counted = o->kind == OP_SPLIT ? kl_split(a, v[0], o->d0, NULL, 0) : kl_chunk(a, (int)v[0], o->d0, NULL, 0);
        if (counted != got) finding("kl_split/kl_chunk counted differently with max_out 0", NULL);
        if (got == 0) return a; /* nothing to add; not an error */
        return out[0];
    }
    case OP_REPEAT: return kl_repeat(a, n, v);
    case OP_PAD: return kl_pad(a, n, v, o->x);
    case OP_INDEX_SELECT: return kl_index_select(a, o->d0, kl_to_dtype(b, KL_I64));
    case OP_GATHER: return kl_gather(a, o->d0, kl_to_dtype(b, KL_I64));
    case OP_EMBEDDING: return kl_embedding(a, kl_to_dtype(b, KL_I64));
    case OP_MASKED_FILL: return kl_masked_fill(a, kl_gt_scalar(b, 0), o->x);
    case OP_TRIL: return (o->sub & 1 ? kl_tril : kl_triu)(a, v[0]);
    case OP_CLAMP: return kl_clamp(a, o->x, o->y);
    case OP_MATMUL:
        switch (o->sub % 3) {
        case 0: return kl_matmul(a, b);
        case 1: return kl_mm(a, b);
        default: return kl_bmm(a, b);
        }
    case OP_LINEAR: return kl_linear(a, b, o->flag ? c : NULL);
    case OP_SOFTMAX: return (o->sub & 1 ? kl_softmax : kl_log_softmax)(a, o->d0);
    case OP_LAYER_NORM: return kl_layer_norm(a, o->d0, o->flag ? b : NULL, o->sub & 1 ? c : NULL, o->x);
    case OP_CONV2D: {
        kl_conv2d_options co = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, v[6]};
        return kl_conv2d(a, b, o->flag ? c : NULL, o->sub & 1 ? &co : NULL);
    }
    case OP_POOL2D: {
        kl_pool2d_options po = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, {v[6], v[7]}, o->flag, o->sub & 2};
        return (o->sub & 1 ? kl_max_pool2d : kl_avg_pool2d)(a, &po);
    }
    case OP_LOSS:
        switch (o->sub % 3) {
        case 0: return kl_cross_entropy(a, kl_to_dtype(b, KL_I64), (kl_reduction)(o->d1 & 3), o->x);
        case 1: return kl_nll_loss(a, kl_to_dtype(b, KL_I64), (kl_reduction)(o->d1 & 3));
        default: return kl_binary_cross_entropy_with_logits(a, b, (kl_reduction)(o->d1 & 3));
        }
    case OP_ARANGE: return kl_arange(o->x, o->y, o->z, o->dt);
    case OP_LINSPACE: return kl_linspace(o->x, o->y, v[0], o->dt);
    case OP_EYE: return kl_eye(v[0], v[1], o->dt);
    case OP_FULL: return kl_full(o->n < 0 ? 0 : (n > 4 ? 4 : n), v, o->x, o->dt);
    default: return kl_where(kl_gt_scalar(a, 0), b, c);
    }
}

/* ---- running it ----------------------------------------------------------- */

typedef struct run_ctx {
    const program *p;
    int failures;    /* ops that failed (each with a clean error) */
    uint32_t failed; /* which: bit k for ops[k] */
    bool tracing;    /* inside a compiled function */
} run_ctx;

#define N_OUT 2

/* The program as a kl_traceable: inputs fill the pool, each op's result joins
 * it, the last two results (or inputs) are the outputs. A failed op must leave
 * a clean error; the program then goes on without its result. */
static int run_program(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    run_ctx *cx = user;
    pool pl = {{0}, 0, 0};
    for (int i = 0; i < n_in; i++) push(&pl, in[i]);
    kl_tensor *last[N_OUT] = {in[0], in[n_in - 1]};
    for (int k = 0; k < cx->p->n_ops; k++) {
        kl_tensor *r = run_op(&cx->p->ops[k], &pl);
        if (!r) {
            if (kl_last_status() == KL_OK) finding("an op returned NULL without an error", NULL);
            if (!kl_last_error()[0]) finding("an op failed with an empty message", NULL);
            if (strncmp(kl_last_error(), "kl_", 3) != 0) finding("an error message does not name its op", kl_last_error());
            if (getenv("KT_FUZZ_VERBOSE"))
                fprintf(stderr, "fuzz_ops: op %d failed%s: %s\n", k, cx->tracing ? " while tracing" : "", kl_last_error());
            cx->failures++;
            cx->failed |= 1u << k;
            kl_clear_error();
            continue;
        }
        if (kl_last_status() != KL_OK) finding("an op succeeded but left an error recorded", kl_last_error());
        if (kl_ndim(r) < 0) finding("a result has no valid shape", NULL);
        for (int d = 0; d < kl_ndim(r); d++)
            if (kl_size(r, d) < 0) finding("a result has a negative size", NULL);
        if (kl_numel(r) < 0) finding("a result has a negative element count", NULL);
        push(&pl, r);
        if (kl_numel(r) > MAX_ELEMS) continue; /* a huge broadcast view: comparing it would take minutes */
        last[0] = last[1];
        last[1] = r;
    }
    for (int i = 0; i < n_out; i++) out[i] = last[i];
    return 0;
}

static double tolerance(kl_dtype dt) {
    switch (dt) {
    case KL_F64: return 1e-9;
    case KL_F32: return 1e-4;
    case KL_F16: return 1e-2;
    case KL_BF16: return 5e-2;
    default: return 0;
    }
}

/* Compiled (FUSE, with `backend`) against eager results `ref`; `eager_failed`
 * says which ops failed eagerly. */
static void check_compiled(const program *p, kl_tensor *const *in, kl_tensor *const *ref, uint32_t eager_failed,
                           const char *backend) {
    run_ctx cx = {p, 0, 0, true};
    kl_compile_options opts = kl_compile_options_default();
    opts.mode = KL_COMPILE_FUSE;
    opts.backend = backend;
    opts.name = "fuzz_ops";
    kl_fn *f = kl_compile(run_program, &cx, &opts);
    if (!f) finding("kl_compile failed", kl_last_error());
    kl_tensor *out[N_OUT] = {0};
    int rc = kl_fn_call(f, in, p->n_in, out, N_OUT);
    /* Meta tensors cannot see data: an op that failed eagerly on its values
     * (an index out of range) traces fine, and from there on the traced
     * program works on other operands than the eager one did. So the first
     * op that failed in one run and not the other decides: failing only
     * while tracing is a finding; failing only eagerly ends the comparison.
     * Equal failure counts are not enough (tests/fuzz/ops/
     * crash-embedding-index-from-floats: eager failed ops 0, 2, 3; the trace,
     * whose op 0 ran, failed 2, 3, 4 and kept op 0's kl_embedding with an
     * index of -1 in the graph, so the call failed as eager op 0 had). */
    kl_fn_stats st;
    if (kl_fn_get_stats(f, &st) != 0) finding("kl_fn_get_stats failed", kl_last_error());
    bool eagerly = st.eager_calls > 0; /* the trace broke (kl_as_strided over an input): the call ran eagerly */
    if (getenv("KT_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_ops: %s: failed while tracing 0x%x, eagerly 0x%x; call %s%s\n", backend, cx.failed,
                eager_failed, rc ? kl_last_error() : "ran", eagerly ? " eagerly" : "");
    uint32_t differ = cx.failed ^ eager_failed;
    if (differ && !eagerly) {
        if (cx.failed & differ & -differ) finding("an op failed while tracing though it ran eagerly", backend);
        kl_clear_error();
        kl_fn_release(f);
        return;
    }
    if (rc != 0) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s (backend %s)", kl_last_error(), backend);
        /* An allocation failure is a clean error, not a disagreement;
         * anything else failed in the compiled program on data that every
         * eager op accepted. */
        if (kl_last_status() != KL_ERR_OOM) finding("the compiled program failed where eager ran", msg);
        kl_clear_error();
        kl_fn_release(f);
        return;
    }
    for (int i = 0; i < N_OUT; i++) {
        if (kl_dtype_of(out[i]) != kl_dtype_of(ref[i])) finding("compiled and eager dtypes differ", backend);
        double tol = tolerance(kl_dtype_of(ref[i]));
        kl_tensor *a = kl_to_dtype(out[i], KL_F64), *b = kl_to_dtype(ref[i], KL_F64);
        int same = kl_allclose(a, b, tol, tol, true);
        if (same != 1) {
            char sa[600], sb[600];
            kl_set_print_options(6, 16, 3, 100);
            kl_format(out[i], sa, sizeof sa);
            kl_format(ref[i], sb, sizeof sb);
            fprintf(stderr, "output %d, backend %s:\ncompiled %s\neager    %s\n", i, backend, sa, sb);
            finding("compiled and eager results differ", kl_last_error());
        }
    }
    kl_fn_release(f);
}

/* Under ASan, an allocation past 256 MiB fails (NULL) instead of aborting
 * the run: a program may legitimately ask for a huge tensor, and the library
 * must then report KL_ERR_OOM. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:max_allocation_size_mb=256"; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* programs are many and different: keep compiled kernels out of any disk cache */
    setenv("KL_CACHE_DIR", "off", 1);
    setenv("KL_NUM_THREADS", "1", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    rd r = {data, size, 1};
    bool compile = data[0] & 1;
    program p;
    decode(&r, &p);
    kl_clear_error();
    kl_scope_begin();
    kl_tensor *in[MAX_IN];
    for (int i = 0; i < p.n_in; i++) in[i] = make_input(&p, i);
    run_ctx cx = {&p, 0, 0, false};
    kl_tensor *ref[N_OUT];
    kl_scope_begin();
    run_program(&cx, in, p.n_in, ref, N_OUT);
    for (int i = 0; i < N_OUT; i++) kl_retain(ref[i]); /* past the scope that made them */
    kl_scope_end();
    if (getenv("KT_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_ops: %d inputs, %d ops, %d failed (0x%x)%s\n", p.n_in, p.n_ops, cx.failures, cx.failed,
                compile ? ", compiled twice" : "");
    if (compile) {
        check_compiled(&p, in, ref, cx.failed, "llvm");
        check_compiled(&p, in, ref, cx.failed, "interp");
    }
    for (int i = 0; i < N_OUT; i++) kl_release(ref[i]);
    kl_scope_end();
    kl_clear_error();
    if (kl_live_tensors() != 0 || kl_live_storages() != 0) finding("a tensor or storage outlived its scope", NULL);
    return 0;
}
