/*
 * cse.c — common-subexpression elimination: a node that computes exactly
 * what an earlier node computes (same op, attributes compared slot by slot,
 * inputs, device) reuses the earlier node's outputs.
 *
 * Only pure nodes take part: not in place, no random draw (two draws differ),
 * no effect, no uninitialized `empty`. Values over a storage that is written
 * in place anywhere in the graph are left alone: the two reads could see
 * different data. A node whose output the caller receives keeps its own
 * tensor (eager returns distinct tensors, which the caller may write).
 */
#include "ir.h"

#include <stdlib.h>

static int eligible(const ir_graph *g, const ir_node *n, const uint8_t *written) {
    if (n->dead || n->inplace || (n->op >= KE_OP_COUNT && n->op != IR_OP_SCALAR)) return 0;
    if (n->op < KE_OP_COUNT && ((ke_ops[n->op].flags & KE_F_RANDOM) || n->op == KE_OP_empty)) return 0;
    if (ir_node_has_effect(g, n)) return 0;
    for (int i = 0; i < n->nin; i++)
        if (written[g->values[n->in[i]].base]) return 0;
    for (int j = 0; j < n->nout; j++)
        if (written[g->values[n->out[j]].base]) return 0;
    return 1;
}

static int same_node(const ir_graph *g, const ir_node *a, const ir_node *b) {
    if (a->op != b->op || a->nin != b->nin || a->nout != b->nout || a->device.type != b->device.type ||
        a->device.index != b->device.index || !ir_attrs_equal(&a->a, &b->a))
        return 0;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return 0;
    for (int j = 0; j < a->nout; j++)
        if (!ir_same_layout(&g->values[a->out[j]], &g->values[b->out[j]])) return 0;
    return 1;
}

int ir_pass_cse(ir_graph *g) {
    uint8_t *written = ir_written_mask(g);
    if (!written) return -1;
    int changed = 0;
    /* Quadratic in the worst case, but only nodes of the same op and first
     * input are compared in full, and traced graphs are small. */
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node *n = &g->nodes[k];
        if (!eligible(g, n, written)) continue;
        int out = 0;
        for (int j = 0; j < n->nout; j++) out |= ir_is_output(g, n->out[j]);
        if (out) continue;
        for (int32_t e = 0; e < k; e++) {
            const ir_node *m = &g->nodes[e];
            if (m->op != n->op || (n->nin && m->nin && m->in[0] != n->in[0])) continue;
            if (!eligible(g, m, written) || !same_node(g, m, n)) continue;
            for (int j = 0; j < n->nout; j++) ir_replace_uses(g, n->out[j], m->out[j]);
            n->dead = 1;
            changed++;
            break;
        }
    }
    free(written);
    if (changed && ir_graph_compact(g)) return -1;
    return changed;
}
