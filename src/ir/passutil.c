/*
 * passutil.c — small queries and rewrites the graph passes share (see ir.h):
 * which storages are written, exact attribute and layout equality, replacing
 * the uses of a value.
 */
#include "ir.h"

#include <stdlib.h>

uint8_t *ir_written_mask(const ir_graph *g) {
    uint8_t *written = calloc((size_t)(g->nvalues ? g->nvalues : 1), 1);
    if (!written) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead || n->nin == 0) continue;
        if (n->inplace || n->op == IR_OP_COPY_BACK) written[g->values[n->in[0]].base] = 1;
    }
    return written;
}

int ir_is_output(const ir_graph *g, int32_t id) {
    for (int32_t i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == id) return 1;
    return 0;
}

int ir_attrs_equal(const ke_attrs *a, const ke_attrs *b) {
    if (memcmp(a->f, b->f, sizeof a->f) || memcmp(a->i, b->i, sizeof a->i) || a->nlist != b->nlist) return 0;
    return a->nlist <= 0 || memcmp(a->list, b->list, sizeof a->list[0] * (size_t)a->nlist) == 0;
}

int ir_same_layout(const ir_value *a, const ir_value *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->wrapped != b->wrapped || a->offset != b->offset ||
        a->device.type != b->device.type || a->device.index != b->device.index)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] != 1 && a->stride[d] != b->stride[d])) return 0;
    return 1;
}

void ir_replace_uses(ir_graph *g, int32_t from, int32_t to) {
    const ir_value *v = &g->values[from];
    int32_t first = v->kind == IR_VAL_NODE ? v->node + 1 : 0;
    for (int32_t k = first; k < g->nnodes; k++) {
        ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] == from) n->in[i] = to;
    }
    for (int32_t i = 0; i < g->noutputs; i++)
        if (g->outputs[i] == from) g->outputs[i] = to;
    /* views of `from` now view `to`'s storage */
    int32_t base = g->values[to].base;
    for (int32_t i = 0; i < g->nvalues; i++)
        if (g->values[i].base == from) g->values[i].base = base;
}

int ir_is_const(const ir_graph *g, int32_t id) {
    const ir_value *v = &g->values[id];
    if (v->kind != IR_VAL_NODE) return 0;
    const ir_node *n = &g->nodes[v->node];
    return n->op == IR_OP_SCALAR || (n->op == IR_OP_CAPTURED && ir_attr_captured_constant(&n->a));
}

void ir_alias_input(ir_graph *g, int32_t i, int32_t j) {
    int32_t from = g->inputs[i], to = g->values[g->inputs[j]].base;
    for (int32_t v = 0; v < g->nvalues; v++)
        if (g->values[v].base == from) g->values[v].base = to;
}
