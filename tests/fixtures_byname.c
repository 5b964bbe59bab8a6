/*
 * fixtures_byname.c — the fixture cases replayed op by op through kl_op_call.
 */
#include "fixtures.h"

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
void fixtures_replay_by_name(void **s) {
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
