/*
 * dce.c — dead-code elimination: a node whose outputs nobody reads goes,
 * unless it has an effect of its own.
 */
#include "ir.h"

#include <stdlib.h>

int ir_node_has_effect(const ir_graph *g, const ir_node *n) {
    if (n->op == IR_OP_COPY_BACK) return 1;
    if (n->op < KE_OP_COUNT && (ke_ops[n->op].flags & KE_F_RANDOM)) return 1;
    if (n->inplace && n->nin > 0) {
        /* a write into storage the caller can see */
        const ir_value *base = &g->values[g->values[n->in[0]].base];
        if (base->kind == IR_VAL_INPUT) return 1;
        if (base->kind == IR_VAL_NODE && g->nodes[base->node].op == IR_OP_CAPTURED) return 1;
        /* a view of the storage taken before the write reads the new data */
        for (int32_t i = 0; i < g->nvalues; i++) {
            const ir_value *v = &g->values[i];
            if (v->base == base->id && v->kind == IR_VAL_NODE && !g->nodes[v->node].dead &&
                g->nodes[v->node].op < KE_OP_COUNT && ke_ops[g->nodes[v->node].op].kind == KE_KIND_VIEW)
                return 1;
        }
    }
    return 0;
}

int ir_pass_dce(ir_graph *g) {
    int32_t *uses = malloc(sizeof *uses * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!uses) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    ir_count_uses(g, uses);
    int removed = 0;
    /* Backwards, so a chain of dead nodes goes in one sweep. */
    for (int32_t k = g->nnodes - 1; k >= 0; k--) {
        ir_node *n = &g->nodes[k];
        if (n->dead || ir_node_has_effect(g, n)) continue;
        int used = 0;
        for (int j = 0; j < n->nout; j++) used |= uses[n->out[j]] > 0;
        if (used) continue;
        n->dead = 1;
        removed++;
        for (int i = 0; i < n->nin; i++) uses[n->in[i]]--;
    }
    free(uses);
    if (removed && ir_graph_compact(g)) return -1;
    return removed;
}
