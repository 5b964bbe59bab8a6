/*
 * decompose.c — composite nodes (softmax, log_softmax, layer_norm, rms_norm,
 * linear, the losses, sdpa, ...) replaced by the primitives of their
 * decomposition, so that fusion sees reductions and elementwise ops it can
 * group. The decomposition is re-traced (the table's decomp run on meta
 * stand-ins, recorded into a subgraph by the trace layer through the
 * ir_hook.subtrace, installed by src/init.c: layers call downward only) and spliced in place of
 * the node: subgraph inputs become the node's inputs, its outputs keep the
 * node's value ids, everything else gets fresh ids.
 *
 * A node stays composite where the splice could change what eager computes
 * beyond rounding: a wrapped scalar input (its promotion rank would be lost
 * on a meta stand-in), a decomposition that draws random numbers (the
 * composite reserves its counters at run time as one op), captures a tensor,
 * writes into its inputs, returns a view of an input (a later in-place write
 * would reach the input), or breaks the trace. The primitives round
 * differently from the fused CPU kernels: results agree to within a few ulp
 * (see test_ir.c), not bitwise. So the pass runs only on graphs that will be
 * fused (g->fuse: FUSE mode without autograd), the only reason to decompose:
 * TRACE_ONLY and NO_FUSE graphs keep the composite kernels and stay bitwise
 * equal to eager, and autograd keeps recording the composites' own backward.
 * Composites flagged KE_F_KEEP_CPU (the op table says which) stay whole on
 * the CPU even when fused: see decomposable.
 */
#include "ir.h"

#include <stdlib.h>

ir_hooks ir_hook;

void ir_install_hooks(const ir_hooks *h) { ir_hook = *h; }

#define MAX_DECOMPOSED_NODES 100000 /* a guard against a decomposition that never bottoms out */

/* 1 if node n should be decomposed. A composite flagged KE_F_KEEP_CPU on a CPU
 * device stays whole, noted for kl_fn_explain: the eager dispatcher runs its fused
 * CPU kernel there (dispatch.c), which does in one or two passes what the
 * decomposition's kernels and library calls do in several. On other devices it
 * has no such kernel and decomposes like any composite. */
static int decomposable(ir_graph *g, const ir_node *n) {
    if (n->dead || n->inplace || n->op >= KE_OP_COUNT) return 0;
    const ke_op_info *o = &ke_ops[n->op];
    if (o->kind != KE_KIND_COMPOSITE || !o->decomp || (o->flags & (KE_F_IMPLICIT | KE_F_RANDOM))) return 0;
    if ((o->flags & KE_F_KEEP_CPU) && n->device.type == KL_CPU) {
        char sh[160];
        const ir_value *ov = &g->values[n->out[0]];
        ir_note(g, "%s%s: kept whole on cpu (its fused CPU kernel beats its decomposition)", o->name,
                ke_fmt_shape(sh, sizeof sh, ov->ndim, ov->shape));
        return 0;
    }
    for (int i = 0; i < n->nin; i++)
        if (g->values[n->in[i]].wrapped) return 0;
    return 1;
}

/* 1 if sub can replace node n (see the header). */
static int splice_ok(const ir_graph *g, const ir_node *n, const ir_graph *sub) {
    if (sub->ninputs != n->nin || sub->noutputs != n->nout || sub->ncaptured) return 0;
    for (int32_t k = 0; k < sub->nnodes; k++) {
        const ir_node *m = &sub->nodes[k];
        if (m->op == n->op || m->op == IR_OP_CAPTURED || m->op == IR_OP_COPY_BACK) return 0;
        if (m->op < KE_OP_COUNT && (ke_ops[m->op].flags & KE_F_RANDOM)) return 0;
        if (m->inplace && sub->values[sub->values[m->in[0]].base].kind == IR_VAL_INPUT) return 0;
    }
    for (int j = 0; j < n->nout; j++) {
        const ir_value *sv = &sub->values[sub->outputs[j]], *gv = &g->values[n->out[j]];
        if (sv->kind != IR_VAL_NODE || sub->values[sv->base].kind != IR_VAL_NODE) return 0;
        if (sv->dtype != gv->dtype || sv->ndim != gv->ndim || memcmp(sv->shape, gv->shape, sizeof(int64_t) * sv->ndim))
            return 0;
        for (int i = 0; i < j; i++)
            if (sub->outputs[i] == sub->outputs[j]) return 0;
    }
    return 1;
}

/* Replaces node k by sub's nodes. Returns the number of nodes spliced in, or -1. */
static int splice(ir_graph *g, int32_t k, const ir_graph *sub) {
    const ir_node *n = &g->nodes[k];
    kl_device dev = n->device;
    int32_t total = g->nnodes - 1 + sub->nnodes;
    int32_t *map = malloc(sizeof *map * (size_t)(sub->nvalues ? sub->nvalues : 1));
    ir_node *nodes = malloc(sizeof *nodes * (size_t)(total ? total : 1));
    int32_t grow = g->nvalues + sub->nvalues;
    ir_value *vals = realloc(g->values, sizeof *vals * (size_t)(grow ? grow : 1));
    if (vals) g->values = vals, g->cap_values = grow > g->cap_values ? grow : g->cap_values;
    if (!map || !nodes || !vals) {
        free(map);
        free(nodes);
        return ke_err(KL_ERR_OOM, "compile", "out of memory decomposing a node");
    }
    for (int32_t i = 0; i < sub->nvalues; i++) map[i] = -1;
    for (int32_t i = 0; i < sub->ninputs; i++) map[sub->inputs[i]] = n->in[i];
    for (int32_t j = 0; j < sub->noutputs; j++) map[sub->outputs[j]] = n->out[j];
    memcpy(nodes, g->nodes, sizeof *nodes * (size_t)k);
    int32_t at = k;
    int rc = 0;
    for (int32_t s = 0; s < sub->nnodes && !rc; s++, at++) {
        const ir_node *m = &sub->nodes[s];
        ir_node *d = &nodes[at];
        *d = *m;
        d->device = dev;
        d->loc = n->loc; /* the pieces stand for the user's call */
        d->in = m->nin ? malloc(sizeof(int32_t) * (size_t)m->nin) : NULL;
        if (m->nin && !d->in) {
            rc = ke_err(KL_ERR_OOM, "compile", "out of memory decomposing a node");
            break;
        }
        for (int i = 0; i < m->nin; i++) d->in[i] = map[m->in[i]];
        for (int j = 0; j < m->nout; j++) {
            const ir_value *sv = &sub->values[m->out[j]];
            int32_t id = map[m->out[j]];
            if (id < 0) id = map[m->out[j]] = g->nvalues++;
            ir_value *v = &g->values[id];
            *v = *sv;
            v->id = id;
            v->node = at; /* fixed below for the nodes after */
            v->device = sv->wrapped ? sv->device : dev;
            v->base = sv->base == m->out[j] ? id : g->values[map[sv->base]].base;
            d->out[j] = id;
        }
    }
    if (rc) {
        for (int32_t i = k; i < at; i++) free(nodes[i].in);
        free(map);
        free(nodes);
        return -1;
    }
    free(g->nodes[k].in);
    memcpy(nodes + at, g->nodes + k + 1, sizeof *nodes * (size_t)(g->nnodes - k - 1));
    free(g->nodes);
    g->nodes = nodes;
    g->nnodes = g->cap_nodes = total;
    for (int32_t i = at; i < total; i++)
        for (int j = 0; j < nodes[i].nout; j++) g->values[nodes[i].out[j]].node = i;
    /* views of an output that is now itself a view share its storage */
    for (int32_t j = 0; j < sub->noutputs; j++) {
        int32_t o = map[sub->outputs[j]], b = g->values[o].base;
        if (b == o) continue;
        for (int32_t i = 0; i < g->nvalues; i++)
            if (g->values[i].base == o) g->values[i].base = b;
    }
    free(map);
    return sub->nnodes;
}

int ir_pass_decompose(ir_graph *g) {
    if (!ir_hook.subtrace || !g->fuse) return 0;
    int changed = 0, spliced = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        if (!decomposable(g, &g->nodes[k])) continue;
        ir_graph *sub = ir_hook.subtrace(g, &g->nodes[k]);
        if (!sub) {
            if (ke_error_pending()) return -1;
            continue;
        }
        int r = splice_ok(g, &g->nodes[k], sub) && spliced < MAX_DECOMPOSED_NODES ? splice(g, k, sub) : 0;
        ir_graph_free(sub);
        if (r < 0) return -1;
        if (r == 0) continue;
        spliced += r;
        changed++;
        k--; /* the spliced nodes may be composite themselves */
    }
    /* renumbers the values in execution order */
    if (changed && ir_graph_compact(g)) return -1;
    return changed;
}
