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
 * The runner table (fixtures_ops.c) is the only per-op code: it maps each
 * manifest OP (a public function name without kl_) to the op-table row it
 * exercises and a small runner that reads the attributes and calls the kl_
 * function. fixtures_io.c reads the manifest, builds inputs and compares.
 *
 * By name (fixtures_replay_by_name, fixtures_byname.c): every call a case makes
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
#include "fixtures.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- running a case ---------------------------------------------------------------------------- */

const char *volatile fx_current = "(none)";
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

/* Runs one case in its own scope; true if it passed. */
bool fx_run_case(const fx_case *c) {
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

bool fx_is_inplace(const fx_case *c) {
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
bool fx_shape_from_data(const fx_case *c) {
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
void fx_run_all(const char *what, bool grads_only, bool catch_signals, bool (*run)(const fx_case *)) {
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

void fixtures_run_on_meta(void **s) {
    (void)s;
    fx_run_all("fixtures on meta", false, false, fx_meta_case);
}

void fixtures_match_torch(void **s) {
    (void)s;
    fx_run_all("fixtures", false, true, fx_run_case);
}

/* Gradients of every case with grad keys against torch's (the second pass:
 * the values are checked by fixtures_match_torch). */
void fixtures_gradients_match_torch(void **s) {
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
    {"causal_attention", "internal op (no torch counterpart to call by name): the causal "
                         "scaled_dot_product_attention cases' gradients against torch's run through it"},
    {"causal_attention_backward", "internal op of causal_attention's derivative (no torch counterpart to call): "
                                  "its own derivative, through its decomposition, is what grad_nn.c's "
                                  "gradgradcheck of causal sdpa checks"},
    {"layer_norm_backward", "internal op of layer_norm's derivative (no torch counterpart to call): its own "
                            "derivative, through its decomposition, is what grad_nn.c's gradgradcheck of "
                            "layer_norm checks"},
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
void fixtures_cover_every_derivative(void **s) {
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
void fixtures_cover_every_op(void **s) {
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
        for (size_t a = 0; a < fx_nallow; a++)
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
    for (size_t a = 0; a < fx_nallow; a++)
        if (fx_row_index(fx_allowlist[a].row) < 0) {
            print_message("allowlisted op '%s' is not in the op table\n", fx_allowlist[a].row);
            bad++;
        }
    fx_free_manifest(&m);
    assert_int_equal(bad, 0);
}

/* The runner table names real rows and has no duplicate names. */
void fixtures_runner_table_is_consistent(void **s) {
    (void)s;
    size_t n = fx_nops;
    for (size_t i = 0; i < n; i++) {
        if (fx_row_index(fx_ops[i].row) < 0) fail_msg("runner '%s' names unknown row '%s'", fx_ops[i].name, fx_ops[i].row);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(fx_ops[i].name, fx_ops[j].name)) fail_msg("runner '%s' listed twice", fx_ops[i].name);
    }
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
