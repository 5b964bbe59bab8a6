/*
 * aot.c — differentiable compiled functions: a compiled forward graph, a
 * compiled backward graph, and one autograd node per call.
 *
 * When fn is called in grad mode with inputs (or captured tensors) that
 * require grad, the joint function is traced: fn runs on stand-ins made
 * leaves requiring grad (captured tensors requiring grad become extra inputs,
 * tr_subst), then kl_autograd_grad of fn's differentiable outputs with
 * respect to them, with the output gradients as further inputs. Our
 * derivatives are kl_ ops, so the backward is recorded like the forward.
 * The joint graph is split where fn returned: the nodes before are the
 * forward, the rest the backward. What the backward reads from the forward is
 * recomputed there or saved (the rule below); the forward graph returns fn's
 * outputs and the saved values, the backward graph takes the saved values,
 * the inputs it reads and the output gradients and returns the gradients.
 * Both run through the usual passes, fusion and backends.
 *
 * Partition rule: a value the backward reads is recomputed in the backward
 * when it is made by an elementwise or view op (pure: not in place, not
 * random) whose inputs are, recursively, such values, inputs of fn, captured
 * tensors, constants, or values saved anyway; anything else (matmul, conv,
 * reductions, composites, library calls) is saved. Values are decided in
 * definition order, so an elementwise chain on a saved matmul output is
 * recomputed from it. Recomputed nodes fuse with the backward's kernels.
 *
 * At a call the forward graph runs (no grad), and the outputs become results
 * of one AG_OP_CUSTOM node whose backward runs the backward graph on the
 * saved tensors. create_graph through it replays the joint graph op by op on
 * the original inputs, so every op is recorded and double backward is
 * eager's (logged under KL_LOG=recompile).
 *
 * KL_COMPILE_CHECK keeps both graphs as split (before the passes): a compile
 * of either that fails, a forward whose outputs differ from fn's (compile.c
 * checks those) and a backward whose gradients differ from its graph run op
 * by op (checked at each backward here) get a repro bundle of that graph,
 * minified as a plain function of its inputs (the backward's: the inputs it
 * reads, the saved values, the output gradients).
 */
#include "trace.h"

#include "aot.h"
#include "autograd.h"
#include "log.h"

#include <stdlib.h>

int tr_aot_recompute = 1;

enum { B_FN_INPUT, B_SAVED, B_GOUT };

struct tr_aot {
    _Atomic int32_t refcount;
    ir_graph *bw;             /* inputs: b_kind/b_idx; outputs: the gradients used */
    ir_graph *joint;          /* for create_graph: run op by op */
    char *name;
    int n_in, n_out, nparams;
    kl_tensor **params;       /* strong: captured tensors requiring grad */
    int *param_refs;          /* references the entry's graphs and this struct hold on each */
    int nwrt;                 /* node inputs: fn inputs requiring grad, then params */
    int32_t *wrt;             /* per node input: fn input index, or n_in + param index */
    int32_t *grad_out;        /* per node input: backward output index, -1: zero */
    int ndiff;                /* node outputs: fn outputs that require grad */
    int32_t *diff_out;        /* per node output: fn output index */
    int nsaved;
    int nb_in;
    uint8_t *b_kind;          /* per backward input: B_FN_INPUT / B_SAVED / B_GOUT */
    int32_t *b_idx;           /* fn input, saved or node-output index */
    int64_t saved_bytes, bw_launches;
    _Atomic int64_t backward_calls, replays;
    ir_graph *fw_traced, *bw_traced; /* KL_COMPILE_CHECK: the graphs as split, else NULL */
    kl_compile_options check;        /* ... and the options to compile their pieces with */
};

static void aot_decref(tr_aot *a) {
    if (!a || atomic_fetch_sub(&a->refcount, 1) != 1) return;
    ir_graph_free(a->bw);
    ir_graph_free(a->joint);
    ir_graph_free(a->fw_traced);
    ir_graph_free(a->bw_traced);
    for (int k = 0; k < a->nparams; k++) ke_tensor_decref(a->params[k]);
    free(a->params);
    free(a->param_refs);
    free(a->wrt);
    free(a->grad_out);
    free(a->diff_out);
    free(a->b_kind);
    free(a->b_idx);
    free(a->name);
    free(a);
}

void tr_aot_release(tr_aot *a) {
    aot_decref(a);
}

/* ---- the joint function ---------------------------------------------------------------- */

typedef struct joint_ctx {
    kl_traceable fn;
    void *user;
    int n_in, n_out, nparams;
    const uint8_t *in_rg;     /* fn inputs requiring grad */
    int32_t split;            /* nodes recorded when fn returned */
    int ndiff, nwrt;
    int32_t *diff_out;        /* [n_out] */
    uint8_t *grad_used;       /* [nwrt] */
} joint_ctx;

/* in: fn's inputs, the params, one gradient per fn output. out: fn's
 * outputs, then one gradient per node input (the input itself where none). */
static int joint_fn(void *u, kl_tensor *const *in, int n, kl_tensor **out, int nout) {
    (void)n, (void)nout;
    joint_ctx *j = u;
    /* one block: wrt, grads [n_in + nparams], douts, dg [n_out] */
    size_t nw_max = (size_t)(j->n_in + j->nparams);
    kl_tensor **blk = calloc(2 * nw_max + 2 * (size_t)j->n_out + 1, sizeof *blk);
    if (!blk) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    kl_tensor **wrt = blk, **grads = blk + nw_max, **douts = grads + nw_max, **dg = douts + j->n_out;
    int nw = 0, rc = -1;
    for (int i = 0; i < j->n_in; i++)
        if (j->in_rg[i]) {
            if (kl_set_requires_grad(in[i], true)) goto out;
            wrt[nw++] = in[i];
        }
    for (int k = 0; k < j->nparams; k++) {
        if (kl_set_requires_grad(in[j->n_in + k], true)) goto out;
        wrt[nw++] = in[j->n_in + k];
    }
    if (j->fn(j->user, in, j->n_in, out, j->n_out) || ke_error_pending()) goto out;
    j->split = tr_trace_nnodes();
    j->ndiff = 0;
    for (int o = 0; o < j->n_out; o++) {
        kl_tensor *t = out[o];
        if (!t) {
            ke_err(KL_ERR_NULL_ARG, "fn_call", "the traced function left output %d NULL", o + 1);
            goto out;
        }
        if (!ke_is_float((kl_dtype)t->dtype) || !kl_requires_grad(t)) continue;
        int dup = 0;
        for (int p = 0; p < o && !dup; p++) dup = out[p] == t || (t->trace_id >= 0 && out[p]->trace_id == t->trace_id);
        if (dup) continue;
        j->diff_out[j->ndiff] = o;
        douts[j->ndiff] = t;
        dg[j->ndiff++] = in[j->n_in + j->nparams + o];
    }
    j->nwrt = nw;
    if (j->ndiff > 0) {
        kl_backward_options bo = kl_backward_options_default();
        bo.allow_unused = true;
        if (kl_autograd_grad(j->ndiff, douts, dg, nw, wrt, grads, &bo)) goto out;
    }
    for (int w = 0; w < nw; w++) {
        j->grad_used[w] = grads[w] != NULL;
        out[j->n_out + w] = grads[w] ? grads[w] : wrt[w];
    }
    rc = 0;
out:
    free(blk);
    return rc;
}

/* ---- partition ----------------------------------------------------------------------- */

enum { V_NONE, V_SAVED, V_RECOMP };

typedef struct part {
    const ir_graph *J;
    int32_t split, n_in, nparams;
    uint8_t *state;           /* per J value */
    uint8_t *memo;            /* per J value: cone_ok's answer, 0 unknown, 1 yes, 2 no (a "no"
                                 may turn yes as more is saved: conservative) */
    uint8_t *take;            /* per J node: in the backward graph */
} part;

static int recomputable(const ir_node *n) {
    if (n->op >= KE_OP_COUNT || n->inplace || (ke_ops[n->op].flags & KE_F_RANDOM)) return 0;
    return ke_ops[n->op].kind == KE_KIND_EW || ke_ops[n->op].kind == KE_KIND_VIEW;
}

static int is_const_node(const ir_node *n) {
    return n->op == IR_OP_SCALAR || n->op == IR_OP_CAPTURED;
}

/* 1 if value v is available to the backward without saving it. */
static int cone_ok(part *p, int32_t v, int depth) {
    const ir_value *val = &p->J->values[v];
    if (val->kind == IR_VAL_INPUT || p->state[v] == V_SAVED || p->state[v] == V_RECOMP) return 1;
    const ir_node *n = &p->J->nodes[val->node];
    if (is_const_node(n)) return 1;
    if (p->memo[v]) return p->memo[v] == 1;
    int ok = tr_aot_recompute && depth <= 64 && recomputable(n);
    for (int i = 0; ok && i < n->nin; i++) ok = cone_ok(p, n->in[i], depth + 1);
    p->memo[v] = ok ? 1 : 2;
    return ok;
}

static void take_cone(part *p, int32_t v) {
    const ir_value *val = &p->J->values[v];
    if (val->kind == IR_VAL_INPUT || p->state[v] != V_NONE) return;
    const ir_node *n = &p->J->nodes[val->node];
    for (int j = 0; j < n->nout; j++) p->state[n->out[j]] = V_RECOMP;
    p->take[val->node] = 1;
    for (int i = 0; i < n->nin; i++) take_cone(p, n->in[i]);
}

/* v, read by the backward: recomputed there, or saved. */
static void decide(part *p, int32_t v) {
    const ir_value *val = &p->J->values[v];
    if (val->kind == IR_VAL_INPUT || val->node >= p->split || p->state[v] != V_NONE) return;
    const ir_node *n = &p->J->nodes[val->node];
    if (is_const_node(n) || (recomputable(n) && cone_ok(p, v, 0)))
        take_cone(p, v);
    else
        p->state[v] = V_SAVED;
}

/* ---- building the two graphs --------------------------------------------------------- */

static void copy_meta(ir_value *d, const ir_value *s) {
    d->dtype = s->dtype;
    d->ndim = s->ndim;
    d->wrapped = s->wrapped;
    d->device = s->device;
    d->offset = s->offset;
    memcpy(d->shape, s->shape, sizeof d->shape);
    memcpy(d->stride, s->stride, sizeof d->stride);
}

static int32_t add_input_like(ir_graph *g, const ir_value *like) {
    int32_t id = ir_add_input(g, NULL);
    if (id >= 0) copy_meta(&g->values[id], like);
    return id;
}

/* Appends J's node n to g, its inputs mapped through map. */
static int copy_node(ir_graph *g, const ir_graph *J, const ir_node *n, int32_t *map) {
    if (n->op == IR_OP_CAPTURED) {
        int32_t id = ir_add_captured(g, J->captured[ir_attr_captured_index(&n->a)]);
        if (id < 0) return -1;
        map[n->out[0]] = id;
        return 0;
    }
    int32_t inl[16] = {0}, *in = n->nin <= 16 ? inl : malloc(sizeof *in * (size_t)n->nin);
    if (!in) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    for (int i = 0; i < n->nin; i++) {
        in[i] = map[n->in[i]];
        KE_ASSERT(in[i] >= 0);
    }
    int32_t k = ir_add_node(g, n->op, n->inplace, n->nin, in, n->nout, NULL, &n->a, n->device, n->compute);
    if (in != inl) free(in);
    if (k < 0) return -1;
    g->nodes[k].loc = n->loc;
    for (int j = 0; j < n->nout; j++) {
        int32_t id = g->nodes[k].out[j];
        copy_meta(&g->values[id], &J->values[n->out[j]]);
        map[n->out[j]] = id;
    }
    return 0;
}

static int64_t value_bytes(const ir_value *v) {
    return ke_numel(v->ndim, v->shape) * (int64_t)ke_dtypes[v->dtype].size;
}

static int count_refs(const ir_graph *g, const kl_tensor *t) {
    int n = 0;
    for (int32_t i = 0; g && i < g->ncaptured; i++) n += g->captured[i] == t;
    return n;
}

/* Whether forward node k is the copy of a move between devices (kl_to_device
 * is empty_on + copy_: sdpa's causal mask and cross_entropy's class ids made
 * on the host for a CUDA call): a copy_ into a fresh `empty` that nothing
 * else reads. No value anyone sees changes, so it is as pure as the move. */
static int is_move_copy(const ir_graph *J, int32_t split, int32_t k) {
    const ir_node *n = &J->nodes[k];
    if (n->op != KE_OP_copy || n->nin != 2) return 0;
    const ir_value *d = &J->values[n->in[0]];
    if (d->kind != IR_VAL_NODE || d->base != n->in[0] || J->nodes[d->node].op != KE_OP_empty) return 0;
    for (int32_t m = 0; m < J->nnodes; m++)
        for (int i = 0; i < J->nodes[m].nin; i++)
            if (J->nodes[m].in[i] == n->in[0] && m != k) return 0;
    for (int o = 0; o < J->noutputs; o++)
        if (J->outputs[o] == n->in[0]) return 0;
    return k < split;
}

/* Why a joint graph cannot be split (NULL: it can). */
static const char *unsupported(const ir_graph *J, int32_t split, int n_out, int n_in, int nparams, char *why,
                               size_t cap) {
    for (int32_t k = 0; k < split; k++)
        if (J->nodes[k].inplace && !is_move_copy(J, split, k)) {
            snprintf(why, cap, "fn writes in place (kl_%s_inplace)", ir_op_name(J->nodes[k].op));
            return why;
        }
    for (int o = 0; o < n_out; o++) {
        const ir_value *v = &J->values[J->outputs[o]];
        const ir_value *b = &J->values[v->base];
        if (b->kind == IR_VAL_INPUT || J->nodes[b->node].op == IR_OP_CAPTURED) {
            (void)nparams;
            snprintf(why, cap, "output %d is %s or a view of one (its history must stay that tensor's)", o + 1,
                     b->kind == IR_VAL_INPUT && b->index < n_in ? "an input" : "a captured tensor");
            return why;
        }
    }
    for (int32_t k = split; k < J->nnodes; k++) {
        const ir_node *n = &J->nodes[k];
        if (!n->inplace) continue;
        const ir_value *b = &J->values[J->values[n->in[0]].base];
        if (b->kind == IR_VAL_INPUT || b->node < split) {
            snprintf(why, cap, "the backward writes a forward value in place (kl_%s_inplace)", ir_op_name(n->op));
            return why;
        }
    }
    return NULL;
}

/* KL_COMPILE_CHECK: the backward graph's compile failed (the error pending): its bundle, from
 * inputs made by running the forward as split op by op, and ones as the output gradients. */
static void failed_backward(const tr_aot *a, kl_tensor *const *inputs) {
    ke_error_stash found;
    ke_error_set_aside(&found);
    const ir_graph *F = a->fw_traced;
    kl_scope_begin();
    kl_no_grad_begin();
    kl_tensor **fo = calloc((size_t)F->noutputs + 1, sizeof *fo), **bin = calloc((size_t)a->nb_in + 1, sizeof *bin);
    int rc = fo && bin ? tr_run_graph(F, inputs, fo) : -1;
    for (int k = 0; !rc && k < a->nb_in; k++) {
        bin[k] = a->b_kind[k] == B_FN_INPUT ? inputs[a->b_idx[k]]
                 : a->b_kind[k] == B_SAVED  ? fo[a->n_out + a->b_idx[k]]
                                            : kl_ones_like(fo[a->diff_out[a->b_idx[k]]]);
        rc = !bin[k];
    }
    if (rc) { /* no inputs for the minifier: the error says so */
        char tail[700];
        snprintf(tail, sizeof tail, " (no repro bundle: the forward did not run: %.600s)", kl_last_error());
        kl_clear_error();
        strncat(found.msg, tail, sizeof found.msg - strlen(found.msg) - 1);
    }
    ke_error_put_back(&found);
    if (!rc) tr_repro_error(a->bw_traced, bin, a->nb_in, &a->check, found.code);
    kl_no_grad_end();
    kl_scope_end();
    free(fo);
    free(bin);
}

int tr_aot_build(const tr_aot_spec *sp, ir_graph **fw_out, tr_aot **aot_out, char *why, size_t why_cap) {
    *fw_out = NULL;
    *aot_out = NULL;
    *why = 0;
    int n_in = sp->n_in, n_out = sp->n_out, np = sp->nparams;
    int nj_in = n_in + np + n_out;
    int rc = -1;
    ir_graph *J = NULL, *F = NULL, *B = NULL;
    tr_aot *a = NULL;
    part p = {0};
    int32_t *fmap = NULL, *bmap = NULL, *fouts = NULL, *bouts = NULL;
    kl_tensor **jin = calloc((size_t)nj_in + 1, sizeof *jin);
    uint8_t *in_rg = calloc((size_t)n_in + 1, 1);
    joint_ctx jc = {.fn = sp->fn, .user = sp->user, .n_in = n_in, .n_out = n_out, .nparams = np, .in_rg = in_rg};
    jc.diff_out = calloc((size_t)n_out + 1, sizeof *jc.diff_out);
    jc.grad_used = calloc((size_t)(n_in + np) + 1, 1);
    kl_scope_begin();
    if (!jin || !in_rg || !jc.diff_out || !jc.grad_used) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    int nwrt = 0;
    for (int i = 0; i < n_in; i++) {
        jin[i] = sp->inputs[i];
        in_rg[i] = (uint8_t)kl_requires_grad(sp->inputs[i]);
        nwrt += in_rg[i];
    }
    for (int k = 0; k < np; k++) jin[n_in + k] = sp->params[k];
    nwrt += np;
    /* placeholders shaped like fn's outputs, on their devices (only their layout is traced) */
    for (int o = 0; o < n_out; o++) {
        const ir_value *v = &sp->g0->values[sp->g0->outputs[o]];
        if (!(jin[n_in + np + o] = ke_tensor_new((kl_dtype)v->dtype, v->ndim, v->shape, v->device, "compile")))
            goto out;
        ke_scope_adopt(jin[n_in + np + o]);
    }
    tr_subst subst = {.n = np, .first = n_in, .real = sp->params};
    int broke = 0;
    char reason[256] = "";
    J = tr_trace_ex(joint_fn, &jc, jin, nj_in, n_out + nwrt, &subst, &broke, reason, sizeof reason);
    if (!J) {
        if (broke) snprintf(why, why_cap, "the joint trace broke: %s", reason);
        else snprintf(why, why_cap, "the joint trace failed: %s", kl_last_error());
        kl_clear_error();
        rc = 0;
        goto out;
    }
    if (unsupported(J, jc.split, n_out, n_in, np, why, why_cap)) {
        rc = 0;
        goto out;
    }
    /* decide what the backward recomputes and what the forward saves */
    p = (part){.J = J, .split = jc.split, .n_in = n_in, .nparams = np};
    p.state = calloc((size_t)J->nvalues + 1, 1);
    p.memo = calloc((size_t)J->nvalues + 1, 1);
    p.take = calloc((size_t)J->nnodes + 1, 1);
    fmap = malloc(sizeof *fmap * ((size_t)J->nvalues + 1));
    bmap = malloc(sizeof *bmap * ((size_t)J->nvalues + 1));
    if (!p.state || !p.memo || !p.take || !fmap || !bmap) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    for (int32_t v = 0; v < J->nvalues; v++) fmap[v] = bmap[v] = -1;
    for (int32_t k = jc.split; k < J->nnodes; k++) p.take[k] = 1;
    /* values read by the backward, in definition order */
    uint8_t *read = calloc((size_t)J->nvalues + 1, 1);
    if (!read) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    for (int32_t k = jc.split; k < J->nnodes; k++)
        for (int i = 0; i < J->nodes[k].nin; i++) read[J->nodes[k].in[i]] = 1;
    for (int w = 0; w < jc.nwrt; w++)
        if (jc.grad_used[w]) read[J->outputs[n_out + w]] = 1;
    for (int32_t v = 0; v < J->nvalues; v++)
        if (read[v]) decide(&p, v);
    free(read);

    /* the forward: fn's inputs, params captured; returns fn's outputs and the saved values */
    if (!(F = ir_graph_new()) || !(B = ir_graph_new())) goto out;
    for (int i = 0; i < n_in; i++)
        if ((fmap[J->inputs[i]] = ir_add_input(F, sp->inputs[i])) < 0) goto out;
    for (int k = 0; k < np; k++)
        if ((fmap[J->inputs[n_in + k]] = ir_add_captured(F, sp->params[k])) < 0) goto out;
    for (int32_t k = 0; k < jc.split; k++)
        if (copy_node(F, J, &J->nodes[k], fmap)) goto out;
    int nsaved = 0;
    for (int32_t v = 0; v < J->nvalues; v++) nsaved += p.state[v] == V_SAVED;
    fouts = malloc(sizeof *fouts * (size_t)(n_out + nsaved + 1));
    if (!fouts) goto out;
    for (int o = 0; o < n_out; o++) fouts[o] = fmap[J->outputs[o]];
    int64_t saved_bytes = 0;
    for (int32_t v = 0, s = 0; v < J->nvalues; v++)
        if (p.state[v] == V_SAVED) {
            fouts[n_out + s++] = fmap[v];
            saved_bytes += value_bytes(&J->values[v]);
        }
    if (ir_set_outputs(F, n_out + nsaved, fouts) || ir_verify(F, "the forward split")) goto out;

    /* the backward: fn inputs it reads, the saved values, the output gradients */
    a = calloc(1, sizeof *a);
    if (!a) goto out;
    atomic_init(&a->refcount, 1);
    a->n_in = n_in, a->n_out = n_out, a->nparams = np, a->nsaved = nsaved, a->nwrt = jc.nwrt, a->ndiff = jc.ndiff;
    a->saved_bytes = saved_bytes;
    a->name = strdup(sp->name);
    a->params = calloc((size_t)np + 1, sizeof *a->params);
    a->param_refs = calloc((size_t)np + 1, sizeof *a->param_refs);
    a->wrt = calloc((size_t)jc.nwrt + 1, sizeof *a->wrt);
    a->grad_out = calloc((size_t)jc.nwrt + 1, sizeof *a->grad_out);
    a->diff_out = calloc((size_t)jc.ndiff + 1, sizeof *a->diff_out);
    a->b_kind = calloc((size_t)J->nvalues + 1, 1);
    a->b_idx = calloc((size_t)J->nvalues + 1, sizeof *a->b_idx);
    bouts = calloc((size_t)jc.nwrt + 1, sizeof *bouts);
    if (!a->name || !a->params || !a->param_refs || !a->wrt || !a->grad_out || !a->diff_out || !a->b_kind ||
        !a->b_idx || !bouts) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    for (int k = 0; k < np; k++) {
        a->params[k] = sp->params[k];
        ke_tensor_incref(sp->params[k]);
    }
    for (int i = 0, w = 0; i < n_in; i++)
        if (in_rg[i]) a->wrt[w++] = i;
    for (int k = 0; k < np; k++) a->wrt[jc.nwrt - np + k] = n_in + k;
    memcpy(a->diff_out, jc.diff_out, sizeof *a->diff_out * (size_t)jc.ndiff);
    /* which J inputs the taken nodes read */
    uint8_t *jin_read = calloc((size_t)nj_in + 1, 1);
    if (!jin_read) goto out;
    for (int32_t k = 0; k < J->nnodes; k++)
        if (p.take[k])
            for (int i = 0; i < J->nodes[k].nin; i++) {
                const ir_value *v = &J->values[J->nodes[k].in[i]];
                if (v->kind == IR_VAL_INPUT) jin_read[v->index] = 1;
            }
    for (int w = 0; w < jc.nwrt; w++) {
        const ir_value *v = &J->values[J->outputs[n_out + w]];
        if (jc.grad_used[w] && v->kind == IR_VAL_INPUT) jin_read[v->index] = 1;
    }
    int nb = 0;
    for (int i = 0; i < n_in; i++)
        if (jin_read[i]) {
            if ((bmap[J->inputs[i]] = add_input_like(B, &J->values[J->inputs[i]])) < 0) goto out_read;
            a->b_kind[nb] = B_FN_INPUT;
            a->b_idx[nb++] = i;
        }
    for (int32_t v = 0, s = 0; v < J->nvalues; v++)
        if (p.state[v] == V_SAVED) {
            if ((bmap[v] = add_input_like(B, &J->values[v])) < 0) goto out_read;
            a->b_kind[nb] = B_SAVED;
            a->b_idx[nb++] = s++;
        }
    for (int d = 0; d < jc.ndiff; d++) {
        int32_t v = J->inputs[n_in + np + jc.diff_out[d]];
        if ((bmap[v] = add_input_like(B, &J->values[v])) < 0) goto out_read;
        a->b_kind[nb] = B_GOUT;
        a->b_idx[nb++] = d;
    }
    a->nb_in = nb;
    for (int k = 0; k < np; k++)
        if (jin_read[n_in + k] && (bmap[J->inputs[n_in + k]] = ir_add_captured(B, sp->params[k])) < 0) goto out_read;
    free(jin_read);
    jin_read = NULL;
    for (int32_t k = 0; k < J->nnodes; k++)
        if (p.take[k] && copy_node(B, J, &J->nodes[k], bmap)) goto out;
    int nbo = 0;
    for (int w = 0; w < jc.nwrt; w++) {
        a->grad_out[w] = -1;
        if (!jc.grad_used[w]) continue;
        a->grad_out[w] = nbo;
        bouts[nbo++] = bmap[J->outputs[n_out + w]];
    }
    if (ir_set_outputs(B, nbo, bouts) || ir_verify(B, "the backward split")) goto out;
    F->fuse = B->fuse = sp->fuse;
    for (int i = 0; i < n_in; i++)
        if (sp->alias[i] >= 0) ir_alias_input(F, i, sp->alias[i]);
    if (sp->check) {
        a->check = *sp->check;
        a->check.name = a->name;
        if (!(a->fw_traced = ir_graph_clone(F)) || !(a->bw_traced = ir_graph_clone(B))) goto out;
    }
    if (ir_optimize(F) || tr_compile_kernels(F, sp->cpu)) {
        if (sp->check) tr_repro_error(a->fw_traced, sp->inputs, n_in, &a->check, kl_last_status());
        goto out;
    }
    if (ir_optimize(B) || tr_compile_kernels(B, sp->cpu)) {
        if (sp->check) failed_backward(a, sp->inputs);
        goto out;
    }
    a->bw_launches = tr_count_launches(B, NULL);
    a->bw = B;
    a->joint = J;
    B = J = NULL;
    for (int k = 0; k < np; k++)
        a->param_refs[k] = 1 + count_refs(F, a->params[k]) + count_refs(a->bw, a->params[k]) +
                           count_refs(a->joint, a->params[k]);
    if (ke_log_on(KE_LOG_GRAPH)) {
        char *t1 = ir_to_string(F), *t2 = ir_to_string(a->bw);
        if (t1 && t2) ke_log(KE_LOG_GRAPH, "%s: compiled forward:\n%s\ncompiled backward:\n%s", sp->name, t1, t2);
        free(t1);
        free(t2);
    }
    *fw_out = F;
    *aot_out = a;
    F = NULL;
    a = NULL;
    rc = 0;
    goto out;
out_read:
    free(jin_read);
out:
    kl_scope_end();
    ir_graph_free(J);
    ir_graph_free(F);
    ir_graph_free(B);
    aot_decref(a);
    free(p.state);
    free(p.memo);
    free(p.take);
    free(fmap);
    free(bmap);
    free(fouts);
    free(bouts);
    free(jin);
    free(in_rg);
    free(jc.diff_out);
    free(jc.grad_used);
    return rc;
}

/* ---- guards -------------------------------------------------------------------------- */

int tr_aot_guard(const tr_aot *a, char *why, size_t cap) {
    for (int k = 0; k < a->nparams; k++) {
        const kl_tensor *t = a->params[k];
        if (!kl_requires_grad(t)) {
            if (why) snprintf(why, cap, "captured tensor %d (%s) no longer requires grad", k + 1,
                              ke_dtypes[t->dtype].name);
            return 1;
        }
        if (atomic_load(&t->refcount) <= a->param_refs[k]) {
            char b[128];
            if (why)
                snprintf(why, cap,
                         "captured tensor %d (%s) requiring grad is no longer referenced outside the compiled "
                         "function (replaced?)",
                         k + 1, ke_fmt_tensor(b, sizeof b, t));
            return 1;
        }
    }
    return 0;
}

const ir_graph *tr_aot_fw_traced(const tr_aot *a) {
    return a->fw_traced;
}
int64_t tr_aot_saved_bytes(const tr_aot *a) {
    return a->saved_bytes;
}
int64_t tr_aot_backward_launches(const tr_aot *a) {
    return a->bw_launches;
}
int64_t tr_aot_backward_calls(const tr_aot *a) {
    return atomic_load(&a->backward_calls);
}
int64_t tr_aot_replays(const tr_aot *a) {
    return atomic_load(&a->replays);
}

/* ---- calls and the autograd node --------------------------------------------------------- */

typedef struct held {
    kl_tensor *t;             /* strong */
    int64_t version;
} held;

typedef struct call_ctx {
    tr_aot *a;                /* strong */
    held *in;                 /* [n_in] fn's inputs (for the backward and a replay) */
    held *saved;              /* [nsaved] history-free aliases of the saved values */
    int64_t *param_version;   /* [nparams] */
    tr_rand rs;               /* the forward's random reservations */
    int released;
} call_ctx;

static void ctx_release_saved(void *p) {
    call_ctx *c = p;
    if (c->released) return;
    c->released = 1;
    for (int i = 0; i < c->a->n_in; i++)
        if (c->in[i].t) ke_tensor_decref(c->in[i].t);
    for (int s = 0; s < c->a->nsaved; s++)
        if (c->saved[s].t) ke_tensor_decref(c->saved[s].t);
}

static void ctx_release(void *p) {
    call_ctx *c = p;
    ctx_release_saved(c);
    free(c->in);
    free(c->saved);
    free(c->param_version);
    free(c->rs.rsv);
    aot_decref(c->a);
    free(c);
}

static int64_t version_of(const kl_tensor *t) {
    return atomic_load_explicit(&t->storage->version, memory_order_relaxed);
}

static int check_held(const call_ctx *c, const held *h, const char *what, int index) {
    if (version_of(h->t) == h->version) return 0;
    char b[128];
    return ke_err(KL_ERR_STATE, "backward",
                  "%s %d of compiled %s (%s), saved for its backward, was modified afterwards by an in-place op "
                  "(version %lld, saved at version %lld): clone it before modifying it",
                  what, index + 1, c->a->name, ke_fmt_tensor(b, sizeof b, h->t), (long long)version_of(h->t),
                  (long long)h->version);
}

/* create_graph: the joint graph op by op on the original inputs, recorded. */
static int replay(call_ctx *c, int nout, kl_tensor *const *gout, kl_tensor **gin) {
    tr_aot *a = c->a;
    ke_log(KE_LOG_RECOMPILE, "%s: create_graph through the compiled call: its forward and backward are replayed op by op",
           a->name);
    atomic_fetch_add(&a->replays, 1);
    int nj = a->n_in + a->nparams + a->n_out, njo = a->n_out + a->nwrt;
    kl_tensor **jin = calloc((size_t)nj + 1, sizeof *jin), **jout = calloc((size_t)njo + 1, sizeof *jout);
    int rc = -1;
    if (!jin || !jout) {
        ke_err(KL_ERR_OOM, "backward", "out of memory");
        goto out;
    }
    for (int i = 0; i < a->n_in; i++) jin[i] = c->in[i].t;
    for (int k = 0; k < a->nparams; k++) jin[a->n_in + k] = a->params[k];
    for (int o = 0; o < a->n_out; o++) jin[a->n_in + a->nparams + o] = NULL;
    for (int d = 0; d < nout; d++) jin[a->n_in + a->nparams + a->diff_out[d]] = gout[d];
    for (int o = 0; o < a->n_out; o++) /* never read: outputs that are not differentiated */
        if (!jin[a->n_in + a->nparams + o]) jin[a->n_in + a->nparams + o] = c->in[0].t ? c->in[0].t : a->params[0];
    tr_rand rs = {0};
    if (c->rs.n) {
        rs.n = c->rs.n;
        if (!(rs.rsv = malloc(sizeof *rs.rsv * 2 * (size_t)rs.n))) {
            ke_err(KL_ERR_OOM, "backward", "out of memory");
            goto out;
        }
        memcpy(rs.rsv, c->rs.rsv, sizeof *rs.rsv * 2 * (size_t)rs.n);
    }
    rc = tr_run_graph_rs(a->joint, jin, jout, &rs);
    free(rs.rsv);
    for (int w = 0; !rc && w < a->nwrt; w++) gin[w] = a->grad_out[w] >= 0 ? jout[a->n_out + w] : NULL;
out:
    free(jin);
    free(jout);
    return rc;
}

/* KL_COMPILE_CHECK: the backward graph as split, run op by op on the same inputs (drawing what
 * the compiled run drew), must give the compiled gradients; a mismatch names a bundle. */
static int check_backward(const tr_aot *a, kl_tensor *const *bin, kl_tensor *const *bout, tr_rand *rs) {
    const ir_graph *B = a->bw_traced;
    kl_tensor **eout = calloc((size_t)B->noutputs + 1, sizeof *eout);
    if (!eout) return ke_err(KL_ERR_OOM, "backward", "out of memory");
    kl_scope_begin();
    kl_no_grad_begin();
    int rc = tr_run_graph_rs(B, bin, eout, rs);
    for (int32_t j = 0; !rc && j < B->noutputs; j++)
        if (!tr_same_values(bout[j], eout[j]))
            rc = ke_err(KL_ERR_STATE, "backward",
                        "KL_COMPILE_CHECK: %s: compiled backward's output %d differs from eager beyond the %s tolerance",
                        a->name, (int)j + 1, ke_dtypes[bout[j]->dtype].name);
    kl_no_grad_end();
    kl_scope_end();
    free(eout);
    if (rc && kl_last_status() == KL_ERR_STATE && !strncmp(kl_last_error(), "kl_backward: KL_COMPILE_CHECK", 29))
        tr_repro_error(B, bin, a->nb_in, &a->check, 0);
    return rc;
}

static int node_backward(void *p, int create_graph, int nout, kl_tensor *const *gout, int nin, const uint8_t *need,
                         kl_tensor **gin) {
    (void)need;
    call_ctx *c = p;
    tr_aot *a = c->a;
    KE_ASSERT(nin == a->nwrt && nout == a->ndiff);
    for (int i = 0; i < a->n_in; i++)
        if (c->in[i].t && check_held(c, &c->in[i], "input", i)) return -1;
    for (int s = 0; s < a->nsaved; s++)
        if (check_held(c, &c->saved[s], "saved value", s)) return -1;
    for (int k = 0; k < a->nparams; k++)
        if (version_of(a->params[k]) != c->param_version[k]) {
            char b[128];
            return ke_err(KL_ERR_STATE, "backward",
                          "captured tensor %d of compiled %s (%s), read by its backward, was modified afterwards "
                          "by an in-place op: run the backward before updating it",
                          k + 1, a->name, ke_fmt_tensor(b, sizeof b, a->params[k]));
        }
    if (create_graph) return replay(c, nout, gout, gin);
    atomic_fetch_add(&a->backward_calls, 1);
    kl_tensor **bin = calloc((size_t)a->nb_in + 1, sizeof *bin);
    kl_tensor **bout = calloc((size_t)a->nwrt + 1, sizeof *bout);
    int rc = -1;
    if (!bin || !bout) {
        ke_err(KL_ERR_OOM, "backward", "out of memory");
        goto out;
    }
    for (int k = 0; k < a->nb_in; k++)
        bin[k] = a->b_kind[k] == B_FN_INPUT ? c->in[a->b_idx[k]].t
                 : a->b_kind[k] == B_SAVED  ? c->saved[a->b_idx[k]].t
                                            : gout[a->b_idx[k]];
    tr_rand rs = c->rs; /* read only: every slot the backward draws from was reserved by the forward */
    tr_rand mine = {0};
    if (rs.n) {
        mine.n = rs.n;
        if (!(mine.rsv = malloc(sizeof *mine.rsv * 2 * (size_t)rs.n))) {
            ke_err(KL_ERR_OOM, "backward", "out of memory");
            goto out;
        }
        memcpy(mine.rsv, rs.rsv, sizeof *mine.rsv * 2 * (size_t)rs.n);
    }
    rc = tr_run_graph_rs(a->bw, bin, bout, &mine);
    if (!rc && a->bw_traced) {
        if (rs.n) memcpy(mine.rsv, rs.rsv, sizeof *mine.rsv * 2 * (size_t)rs.n);
        rc = check_backward(a, bin, bout, &mine);
    }
    free(mine.rsv);
    for (int w = 0; !rc && w < a->nwrt; w++) gin[w] = a->grad_out[w] >= 0 ? bout[a->grad_out[w]] : NULL;
out:
    free(bin);
    free(bout);
    return rc;
}

static const ag_custom aot_node = {
    .name = "compiled function",
    .backward = node_backward,
    .release_saved = ctx_release_saved,
    .release = ctx_release,
};

static int first_of(kl_tensor *const *outs, int o) {
    for (int p = 0; p < o; p++)
        if (outs[p] == outs[o]) return 0;
    return 1;
}

int tr_aot_call(tr_aot *a, const ir_graph *fw, kl_tensor *const *inputs, kl_tensor **outputs) {
    int n_out = a->n_out, nf = n_out + a->nsaved;
    kl_tensor **fo = calloc((size_t)nf + 1, sizeof *fo);
    call_ctx *c = calloc(1, sizeof *c);
    if (c) {
        c->in = calloc((size_t)a->n_in + 1, sizeof *c->in);
        c->saved = calloc((size_t)a->nsaved + 1, sizeof *c->saved);
        c->param_version = calloc((size_t)a->nparams + 1, sizeof *c->param_version);
    }
    if (!fo || !c || !c->in || !c->saved || !c->param_version) {
        free(fo);
        if (c) {
            free(c->in);
            free(c->saved);
            free(c->param_version);
            free(c);
        }
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    }
    c->a = a;
    atomic_fetch_add(&a->refcount, 1);
    kl_scope_begin();
    kl_no_grad_begin();
    int rc = tr_run_graph_rs(fw, inputs, fo, &c->rs);
    kl_no_grad_end();
    for (int s = 0; !rc && s < a->nsaved; s++) {
        kl_tensor *t = fo[n_out + s];
        /* a separate header: one of fn's outputs gets the node as grad_fn, and the
         * node holding that header would be a cycle */
        if (!(c->saved[s].t = ke_tensor_view(t, t->ndim, t->shape, t->stride, t->offset))) rc = -1;
        else c->saved[s].version = version_of(t);
    }
    for (int i = 0; !rc && i < a->n_in; i++) {
        c->in[i].t = inputs[i];
        ke_tensor_incref(inputs[i]);
        c->in[i].version = version_of(inputs[i]);
    }
    for (int k = 0; k < a->nparams; k++) c->param_version[k] = version_of(a->params[k]);
    /* fn's outputs outlive this scope: hold them, close it, hand each distinct
     * one to the caller's scope (as tr_run_graph does) */
    for (int o = 0; !rc && o < n_out; o++) {
        outputs[o] = fo[o];
        if (first_of(outputs, o)) ke_tensor_incref(fo[o]);
    }
    kl_scope_end();
    for (int o = 0; !rc && o < n_out; o++) {
        kl_tensor *t = outputs[o];
        if (!first_of(outputs, o)) continue;
        if (t->scope == NULL && atomic_load(&t->refcount) == 1)
            ke_scope_adopt(t);
        else
            ke_tensor_decref(t);
    }
    free(fo);
    if (rc) {
        for (int o = 0; o < n_out; o++) outputs[o] = NULL;
        ctx_release(c);
        return -1;
    }
    kl_tensor **wrt = calloc((size_t)a->nwrt + 1, sizeof *wrt), **dout = calloc((size_t)a->ndiff + 1, sizeof *dout);
    if (!wrt || !dout) {
        free(wrt);
        free(dout);
        ctx_release(c);
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    }
    for (int w = 0; w < a->nwrt; w++) wrt[w] = a->wrt[w] < a->n_in ? inputs[a->wrt[w]] : a->params[a->wrt[w] - a->n_in];
    for (int d = 0; d < a->ndiff; d++) dout[d] = outputs[a->diff_out[d]];
    rc = a->ndiff > 0 ? ag_record_custom(&aot_node, c, a->nwrt, wrt, a->ndiff, dout) : (ctx_release(c), 0);
    free(wrt);
    free(dout);
    return rc;
}
