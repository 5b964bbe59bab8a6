/*
 * verify.c — the graph verifier: SSA order, value descriptions, arities,
 * compute dtypes.
 * Runs after every pass in debug builds and in the tests.
 */
#include "ir.h"

#include <stdlib.h>

#define BAD(...) ke_err(KL_ERR_INTERNAL, "compile", "invalid graph after %s: " __VA_ARGS__)

int ir_verify(const ir_graph *g, const char *after) {
    if (!after) after = "tracing";
    uint8_t *defined = calloc((size_t)(g->nvalues ? g->nvalues : 1), 1);
    if (!defined) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    int rc = 0;
    for (int32_t i = 0; i < g->nvalues && !rc; i++) {
        const ir_value *v = &g->values[i];
        if (v->id != i) rc = BAD("value %d has id %d", after, i, v->id);
        else if (v->dtype >= KL_NUM_DTYPES || v->ndim > KL_MAX_DIMS) rc = BAD("value %d has a bad dtype or rank", after, i);
        else if (v->base < 0 || v->base >= g->nvalues) rc = BAD("value %d has a bad base %d", after, i, v->base);
    }
    for (int32_t i = 0; i < g->ninputs && !rc; i++) {
        int32_t id = g->inputs[i];
        if (id < 0 || id >= g->nvalues || g->values[id].kind != IR_VAL_INPUT || g->values[id].index != i)
            rc = BAD("input %d is not an input value", after, i);
        else defined[id] = 1;
    }
    for (int32_t k = 0; k < g->nnodes && !rc; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        if (n->op < 0 || n->op >= IR_OP_END) {
            rc = BAD("node %d has op %d", after, k, n->op);
            break;
        }
        if (n->op < KE_OP_COUNT) {
            const ke_op_info *o = &ke_ops[n->op];
            if ((o->nin >= 0 && n->nin != o->nin && o->kind != KE_KIND_COMPOSITE && o->kind != KE_KIND_OTHER) ||
                n->nout < 1 || (o->nout >= 0 && n->nout != o->nout))
                rc = BAD("node %d (%s) has %d inputs and %d outputs", after, k, o->name, n->nin, n->nout);
            if (n->inplace && !(o->flags & KE_F_INPLACE) && n->op != KE_OP_copy)
                rc = BAD("node %d (%s) is in place but the op has no in-place form", after, k, o->name);
            /* lowering reads it instead of running the shape rule again */
            if ((o->kind == KE_KIND_EW || o->kind == KE_KIND_REDUCE) && (n->compute < 0 || n->compute >= KL_NUM_DTYPES))
                rc = BAD("node %d (%s) has no compute dtype", after, k, o->name);
        } else if (n->compute != -1) {
            rc = BAD("node %d (%s) is not an op of the table but has a compute dtype", after, k, ir_op_name(n->op));
        }
        for (int i = 0; i < n->nin && !rc; i++) {
            int32_t id = n->in[i];
            if (id < 0 || id >= g->nvalues || !defined[id])
                rc = BAD("node %d (%s) reads value %d before it is defined", after, k, ir_op_name(n->op), id);
        }
        for (int j = 0; j < n->nout && !rc; j++) {
            int32_t id = n->out[j];
            if (id < 0 || id >= g->nvalues || defined[id] || g->values[id].kind != IR_VAL_NODE ||
                g->values[id].node != k || g->values[id].index != j)
                rc = BAD("node %d (%s) output %d (value %d) is defined twice or mislabelled", after, k,
                         ir_op_name(n->op), j, id);
            else defined[id] = 1;
        }
    }
    for (int32_t i = 0; i < g->noutputs && !rc; i++) {
        int32_t id = g->outputs[i];
        if (id < 0 || id >= g->nvalues || !defined[id]) rc = BAD("output %d names undefined value %d", after, i, id);
    }
    free(defined);
    return rc;
}
