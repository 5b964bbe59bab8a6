/*
 * test_compile_dyn.c — dynamic sizes (docs/COMPILE.md "Dynamic sizes"): a
 * function traced once with its batch dim dynamic serves sizes it was never
 * traced at, equal to eager; exactly one trace and no LLVM work for new
 * sizes; sizes 0 and 1 and inputs whose batch dims disagree take entries of
 * their own (never a wrong answer); automatic dynamic after a retrace; graphs
 * that cannot be dynamic stay static with the reason.
 *
 * Random programs: chains of ops over a batch [B, w] input x and integer
 * targets y [B] — elementwise (with rows [B,1], broadcast vectors [w] and
 * scalars), row reductions, means and sums over the batch (a division by B),
 * matmul with captured weights (B is matmul's M), softmax, flatten and
 * reshape back (B*w in a view's attributes), a transpose reduced over B (a
 * row kernel whose row is B), cross_entropy with mean — traced at 256 and
 * called at 17, 5, 33, 2, 100 and 256 again in every compile mode.
 * KT_DYN_PROGRAMS=N sets how many (default 60), KT_DYN_SEED=S runs one.
 */
#include "harness.h"

#include "kernel.h"

#include <stdlib.h>

/* ---- random programs ---------------------------------------------------------------- */

enum cls { C_BW, C_B1, C_W, C_S };               /* [B,w], [B,1], [w], [] */
enum pop { P_UN, P_BIN, P_BIN_ROW, P_BIN_VEC, P_BIN_SCALAR, P_ROWRED, P_BATCHMEAN, P_SOFTMAX, P_MATMUL,
           P_FLATTEN, P_TSUM, P_CE, P_SUMALL, P_ROWUN, P_VECUN };

typedef struct instr {
    int op, a, b, k;  /* operands (value numbers), k: which unary / binary / reduction / weight */
} instr;

#define MAXV 40
typedef struct program {
    int n, C;
    instr ins[MAXV];
    int cls[MAXV], w[MAXV];
    kl_tensor *weights[8];  /* captured: matrices [w, w2] and vectors [w] */
    int nweights;
    int scalar_out;         /* a scalar value to return beside the last [B,w] one (-1: the sum) */
    int last_bw;
} program;

static kl_tensor *un(int k, kl_tensor *x) {
    switch (k % 6) {
    case 0: return kl_tanh(x);
    case 1: return kl_sigmoid(x);
    case 2: return kl_relu(x);
    case 3: return kl_neg(x);
    case 4: return kl_gelu(x);
    default: return kl_mul_scalar(x, 0.5);
    }
}

static kl_tensor *bin(int k, kl_tensor *a, kl_tensor *b) {
    switch (k % 4) {
    case 0: return kl_add(a, b);
    case 1: return kl_mul(a, b);
    case 2: return kl_sub(a, b);
    default: return kl_maximum(a, b);
    }
}

static int run_program(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const program *p = user;
    kl_tensor *v[MAXV];
    v[0] = in[0];
    v[1] = in[1]; /* targets: read only by cross_entropy */
    for (int i = 2; i < p->n; i++) {
        const instr *s = &p->ins[i];
        kl_tensor *a = v[s->a], *b = s->b >= 0 ? v[s->b] : NULL;
        switch (s->op) {
        case P_UN: case P_ROWUN: case P_VECUN: v[i] = un(s->k, a); break;
        case P_BIN: case P_BIN_ROW: case P_BIN_SCALAR: v[i] = bin(s->k, a, b); break;
        case P_BIN_VEC: v[i] = bin(s->k, a, p->weights[s->b]); break;
        case P_ROWRED:
            v[i] = s->k % 3 == 0 ? kl_sum(a, KL_DIMS(1), true)
                 : s->k % 3 == 1 ? kl_mean(a, KL_DIMS(1), true) : kl_amax(a, KL_DIMS(1), true);
            break;
        case P_BATCHMEAN: v[i] = kl_mean(a, KL_DIMS(0), false); break;
        case P_SOFTMAX: v[i] = kl_softmax(a, -1); break;
        case P_MATMUL: v[i] = kl_matmul(a, p->weights[s->b]); break;
        case P_FLATTEN: {
            const int64_t *sh = kl_shape(a);
            int64_t flat[1] = {sh[0] * sh[1]}, back[2] = {sh[0], sh[1]};
            v[i] = kl_reshape(kl_mul_scalar(kl_reshape(a, 1, flat), 2.0), 2, back);
            break;
        }
        case P_TSUM: v[i] = kl_sum(kl_transpose(a, 0, 1), KL_DIMS(1), false); break;
        case P_CE: v[i] = kl_cross_entropy(a, v[1], KL_REDUCE_MEAN, 0); break;
        case P_SUMALL: v[i] = kl_sum(a, KL_ALL_DIMS, false); break;
        }
        if (!v[i]) return -1;
    }
    out[0] = v[p->last_bw];
    out[1] = p->scalar_out >= 0 ? v[p->scalar_out] : kl_sum(v[p->n - 1], KL_ALL_DIMS, false);
    return out[1] ? 0 : -1;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A value of class c (and width w when c is C_BW or C_W), or -1. */
static int pick(const program *p, uint64_t *r, int c, int w) {
    int cand[MAXV], n = 0;
    for (int i = 0; i < p->n; i++)
        if (i != 1 && p->cls[i] == c && (w < 0 || p->w[i] == w)) cand[n++] = i;
    return n ? cand[rng_next(r) % (uint64_t)n] : -1;
}

static int add_weight(program *p, int ndim, int64_t r, int64_t c) {
    p->weights[p->nweights] = ndim == 1 ? kl_randn(KL_SHAPE(r), KL_F32) : kl_randn(KL_SHAPE(r, c), KL_F32);
    return p->nweights++;
}

static void make_program(program *p, uint64_t seed) {
    memset(p, 0, sizeof *p);
    uint64_t r = seed * 0x9E3779B97F4A7C15u + 1;
    p->C = 2 + (int)(rng_next(&r) % 7);
    p->cls[0] = C_BW, p->w[0] = p->C;
    p->cls[1] = -1;
    p->n = 2;
    p->scalar_out = -1;
    int len = 4 + (int)(rng_next(&r) % 12);
    while (p->n < len + 2 && p->n < MAXV) {
        instr s = {.op = (int)(rng_next(&r) % 15), .b = -1, .k = (int)(rng_next(&r) % 12)};
        int c = C_BW, w = -1;
        s.a = pick(p, &r, C_BW, -1);
        int wa = p->w[s.a];
        switch (s.op) {
        case P_UN: case P_SOFTMAX: case P_FLATTEN: w = wa; break;
        case P_BIN: s.b = pick(p, &r, C_BW, wa); w = wa; break;
        case P_BIN_ROW:
            if ((s.b = pick(p, &r, C_B1, -1)) < 0) continue;
            if (rng_next(&r) % 2) s.a ^= s.b, s.b ^= s.a, s.a ^= s.b; /* [B,1] op [B,w] */
            w = wa;
            break;
        case P_BIN_VEC:
            if (p->nweights == 8) continue;
            s.b = add_weight(p, 1, wa, 0);
            w = wa;
            break;
        case P_BIN_SCALAR:
            if ((s.b = pick(p, &r, C_S, -1)) < 0 && (s.b = pick(p, &r, C_W, wa)) < 0) continue;
            w = wa;
            break;
        case P_ROWRED: c = C_B1; break;
        case P_BATCHMEAN: c = C_W, w = wa; break;
        case P_TSUM: c = C_W, w = wa; break;
        case P_MATMUL:
            if (p->nweights == 8) continue;
            w = 1 + (int)(rng_next(&r) % 9);
            s.b = add_weight(p, 2, wa, w);
            break;
        case P_CE:
            if (wa != p->C) continue;
            c = C_S;
            break;
        case P_SUMALL: c = C_S; break;
        case P_ROWUN:
            if ((s.a = pick(p, &r, C_B1, -1)) < 0) continue;
            c = C_B1;
            break;
        case P_VECUN:
            if ((s.a = pick(p, &r, C_W, -1)) < 0) continue;
            c = C_W, w = p->w[s.a];
            break;
        }
        p->ins[p->n] = s;
        p->cls[p->n] = c;
        p->w[p->n] = w;
        p->n++;
    }
    p->last_bw = pick(p, &r, C_BW, -1);
    for (int i = p->n - 1; i >= 2; i--)
        if (p->cls[i] == C_BW) {
            p->last_bw = i;
            break;
        }
    for (int i = p->n - 1; i >= 2; i--)
        if (p->cls[i] == C_S) {
            p->scalar_out = i;
            break;
        }
}


static int close_enough(kl_tensor *a, kl_tensor *b) {
    if (kl_ndim(a) != kl_ndim(b)) return 0;
    int r = kl_allclose(a, b, 1e-4, 1e-4, true);
    return r == 1;
}

static const int64_t sizes[] = {256, 17, 5, 33, 2, 100, 256, 17};
#define NSIZES ((int)(sizeof sizes / sizeof sizes[0]))

/* Inputs of program p at batch size b: x [b, C] in [-2, 2), targets y [b] in [0, C). */
static void inputs_at(const program *p, int64_t b, kl_tensor **in) {
    in[0] = kl_sub_scalar(kl_mul_scalar(kl_rand(KL_SHAPE(b, p->C), KL_F32), 4.0), 2.0);
    in[1] = kl_randint(0, p->C, KL_SHAPE(b), KL_I64);
}

static int run_one(uint64_t seed, kl_compile_mode mode, const char *backend, int *refused) {
    program p;
    kl_scope_begin(); /* the weights */
    make_program(&p, seed);
    kl_compile_options o = kl_compile_options_default();
    o.mode = mode;
    o.backend = backend;
    o.dynamic_dims = 3; /* x and y: dim 0 */
    kl_fn *f = kl_compile(run_program, &p, &o);
    assert_non_null(f);
    int bad = 0;
    for (int k = 0; k < NSIZES && !bad; k++) {
        kl_scope_begin();
        kl_tensor *in[2], *got[2] = {0}, *want[2] = {0};
        inputs_at(&p, sizes[k], in);
        if (kl_fn_call(f, in, 2, got, 2) || run_program(&p, in, 2, want, 2)) {
            print_error("seed %llu mode %d size %lld: %s\n", (unsigned long long)seed, (int)mode, (long long)sizes[k],
                        kl_last_error());
            bad = 1;
        }
        for (int j = 0; j < 2 && !bad; j++)
            if (!close_enough(got[j], want[j])) {
                print_error("seed %llu mode %d size %lld: output %d differs from eager\n", (unsigned long long)seed,
                            (int)mode, (long long)sizes[k], j);
                bad = 1;
            }
        kl_scope_end();
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    if (!bad && st.dynamic_entries == 1 && st.traces != 1) {
        print_error("seed %llu: a dynamic entry, yet %lld traces\n", (unsigned long long)seed, (long long)st.traces);
        bad = 1;
    }
    if (!bad && st.dynamic_entries == 0) {
        ++*refused;
        if (getenv("KT_DYN_VERBOSE")) kl_fn_explain(f, stderr);
    }
    kl_fn_release(f);
    kl_scope_end();
    return bad;
}

static void random_programs_at_untraced_sizes(void **state) {
    (void)state;
    int n = getenv("KT_DYN_PROGRAMS") ? atoi(getenv("KT_DYN_PROGRAMS")) : 60;
    uint64_t first = 1;
    if (getenv("KT_DYN_SEED")) first = strtoull(getenv("KT_DYN_SEED"), NULL, 10), n = 1;
    int fails = 0, refused = 0, runs = 0;
    kl_manual_seed(7);
    for (uint64_t s = first; s < first + (uint64_t)n; s++) {
        static const kl_compile_mode modes[] = {KL_COMPILE_FUSE, KL_COMPILE_NO_FUSE, KL_COMPILE_TRACE_ONLY};
        fails += run_one(s, KL_COMPILE_FUSE, NULL, &refused), runs++;
        fails += run_one(s, modes[s % 3], s % 2 ? "interp" : NULL, &refused), runs++;
    }
    if (refused) print_message("%d of %d compiled programs stayed static\n", refused, runs);
    assert_int_equal(fails, 0);
    /* Every program of this generator keeps its batch dim affine: none may stay static. */
    assert_int_equal(refused, 0);
    KT_NO_ERROR();
}

/* ---- one compile for many sizes -------------------------------------------------------- */

/* A digits-like step: rows picked from captured data by an index batch, an MLP with dropout,
 * cross_entropy (mean over the batch), gradients by autograd inside the function. */
typedef struct step_ctx {
    kl_tensor *data, *labels;
} step_ctx;

static int train_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const step_ctx *c = user;
    kl_tensor *x = kl_index_select(c->data, 0, in[0]), *y = kl_index_select(c->labels, 0, in[0]);
    kl_tensor *w1 = kl_detach(in[1]), *w2 = kl_detach(in[2]);
    if (!w1 || !w2 || kl_set_requires_grad(w1, true) < 0 || kl_set_requires_grad(w2, true) < 0) return -1;
    kl_tensor *h = kl_dropout(kl_gelu(kl_matmul(x, w1)), 0.1, true);
    kl_tensor *loss = kl_cross_entropy(kl_matmul(h, w2), y, KL_REDUCE_MEAN, 0);
    kl_tensor *p[2] = {w1, w2};
    if (!loss || kl_autograd_grad(1, &loss, NULL, 2, p, out + 1, NULL) < 0) return -1;
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

static void training_step_compiles_once(void **state) {
    (void)state;
    step_ctx c = {kl_randn(KL_SHAPE(300, 16), KL_F32), kl_randint(0, 10, KL_SHAPE(300), KL_I64)};
    kl_tensor *w1 = kl_mul_scalar(kl_randn(KL_SHAPE(16, 32), KL_F32), 0.3);
    kl_tensor *w2 = kl_mul_scalar(kl_randn(KL_SHAPE(32, 10), KL_F32), 0.3);
    kl_compile_options o = kl_compile_options_default();
    o.dynamic_dims = 1; /* the index batch */
    kl_fn *f = kl_compile(train_step, &c, &o);
    double llvm_after_first = 0;
    static const int64_t bs[] = {256, 17, 256, 17, 64, 3, 255};
    for (int k = 0; k < 7; k++) {
        kl_scope_begin();
        kl_tensor *in[3] = {kl_randint(0, 300, KL_SHAPE(bs[k]), KL_I64), w1, w2}, *got[3], *want[3];
        kl_manual_seed(100 + (uint64_t)k);
        assert_int_equal(kl_fn_call(f, in, 3, got, 3), 0);
        kl_manual_seed(100 + (uint64_t)k); /* the same dropout masks */
        assert_int_equal(train_step(&c, in, 3, want, 3), 0);
        for (int j = 0; j < 3; j++) assert_true(kl_allclose(got[j], want[j], 1e-4, 1e-5, false) == 1);
        kl_scope_end();
        if (k == 0) llvm_after_first = ir_backend_llvm_ms();
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.recompiles, 0);
    assert_int_equal(st.dynamic_entries, 1);
    assert_int_equal(st.specialisations, 4); /* 17, 64, 3 and 255; 256 is the template */
    assert_int_equal(st.cache_hits, 6);
    /* New sizes cost LLVM nothing: every kernel's code was made at the first call. */
    assert_true(ir_backend_llvm_ms() == llvm_after_first);
    kl_fn_release(f);
}

/* ---- guards ---------------------------------------------------------------------------- */

static int row_plus(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user;
    out[0] = kl_add(kl_sum(kl_relu(in[0]), KL_DIMS(1), false), in[1]);
    return out[0] ? 0 : -1;
}

static void check_row_plus(kl_fn *f, int64_t bx, int64_t by, int expect_ok) {
    kl_scope_begin();
    kl_tensor *in[2] = {kl_randn(KL_SHAPE(bx, 64), KL_F32), kl_randn(KL_SHAPE(by), KL_F32)}, *got = NULL, *want = NULL;
    int rc = kl_fn_call(f, in, 2, &got, 1);
    if (!expect_ok) {
        assert_int_equal(rc, -1);
        KT_EXPECT_ERROR(KL_ERR_SHAPE, "");
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(row_plus(NULL, in, 2, &want, 1), 0);
        assert_true(kl_allclose(got, want, 1e-5, 1e-5, false) == 1);
    }
    kl_scope_end();
}

static void related_batch_dims_are_guarded(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.dynamic_dims = 3;
    kl_fn *f = kl_compile(row_plus, NULL, &o);
    kl_fn_stats st;
    check_row_plus(f, 8, 8, 1);
    check_row_plus(f, 9, 9, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    /* y [1] broadcasts eagerly: the dynamic entry (y's dim 0 is s) must not serve it */
    check_row_plus(f, 8, 1, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_non_null(strstr(st.last_reason, "input 2 dim 0 is 1"));
    /* disagreeing batch dims: a retrace, and fn's own error, never a wrong answer */
    check_row_plus(f, 8, 7, 0);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 3);
    check_row_plus(f, 40, 40, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 3);
    kl_fn_release(f);
}

static void sizes_0_and_1_are_specialised(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.dynamic_dims = 3;
    kl_fn *f = kl_compile(row_plus, NULL, &o);
    kl_fn_stats st;
    check_row_plus(f, 6, 6, 1);
    check_row_plus(f, 1, 1, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_non_null(strstr(st.last_reason, "0 and 1 are specialised"));
    check_row_plus(f, 0, 0, 1);
    check_row_plus(f, 1, 1, 1);
    check_row_plus(f, 0, 0, 1);
    check_row_plus(f, 12, 12, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 3); /* 6 (dynamic), 1 and 0 (static) */
    assert_int_equal(st.dynamic_entries, 1);
    kl_fn_release(f);
}

/* ---- automatic dynamic ----------------------------------------------------------------- */

static void automatic_dynamic_after_one_retrace(void **state) {
    (void)state;
    kl_fn *f = kl_compile(row_plus, NULL, NULL);
    kl_fn_stats st;
    check_row_plus(f, 8, 8, 1);
    check_row_plus(f, 12, 12, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.dynamic_entries, 1);
    assert_non_null(strstr(st.last_reason, "automatic dynamic"));
    for (int64_t b = 20; b < 30; b += 3) check_row_plus(f, b, b, 1);
    check_row_plus(f, 8, 8, 1);
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    /* automatic dynamic off: every size retraces, as before */
    kl_compile_options o = kl_compile_options_default();
    o.auto_dynamic = 0;
    kl_fn *g = kl_compile(row_plus, NULL, &o);
    check_row_plus(g, 8, 8, 1);
    check_row_plus(g, 12, 12, 1);
    check_row_plus(g, 13, 13, 1);
    kl_fn_get_stats(g, &st);
    assert_int_equal(st.traces, 3);
    assert_int_equal(st.dynamic_entries, 0);
    kl_fn_release(f);
    kl_fn_release(g);
}

/* ---- refused: the graph depends on the size ------------------------------------------ */

static int size_branch(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user;
    out[0] = kl_shape(in[0])[0] > 100 ? kl_relu(in[0]) : kl_tanh(in[0]);
    return out[0] ? 0 : -1;
}

static void size_dependent_graph_stays_static(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.dynamic_dims = 1;
    kl_fn *f = kl_compile(size_branch, NULL, &o);
    for (int k = 0; k < 3; k++) {
        static const int64_t b[] = {200, 50, 60};
        kl_scope_begin();
        kl_tensor *x = kl_randn(KL_SHAPE(b[k], 4), KL_F32), *got, *want;
        assert_int_equal(kl_fn_call(f, &x, 1, &got, 1), 0);
        assert_int_equal(size_branch(NULL, &x, 1, &want, 1), 0);
        assert_true(kl_equal(got, want) == 1);
        kl_scope_end();
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    /* traced at 200 with probes 201 and 3: relu vs tanh, so static; then 50 is dynamic (probes
     * 51 and 3 agree) and serves 60 */
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.dynamic_entries, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_int_equal(kl_fn_explain(f, m), 0);
    fclose(m);
    assert_non_null(strstr(buf, "static: dynamic sizes refused: the graph's structure depends on the size"));
    assert_non_null(strstr(buf, "dynamic: serves every size s >= 2"));
    assert_non_null(strstr(buf, "input 1: f32[s,4]"));
    free(buf);
    kl_fn_release(f);
}

/* KL_COMPILE_CHECK=1 re-runs fn eagerly after each compiled call: specialised sizes agree. */
static void check_mode_at_specialised_sizes(void **state) {
    (void)state;
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_compile_options o = kl_compile_options_default();
    o.dynamic_dims = 3;
    kl_fn *f = kl_compile(row_plus, NULL, &o);
    unsetenv("KL_COMPILE_CHECK");
    for (int64_t b = 2; b < 40; b += 7) check_row_plus(f, b, b, 1);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.specialisations, 5);
    kl_fn_release(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(random_programs_at_untraced_sizes),
        KT_TEST(training_step_compiles_once),
        KT_TEST(related_batch_dims_are_guarded),
        KT_TEST(sizes_0_and_1_are_specialised),
        KT_TEST(automatic_dynamic_after_one_retrace),
        KT_TEST(size_dependent_graph_stays_static),
        KT_TEST(check_mode_at_specialised_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
