/*
 * fold.c — constant folding: a pure node whose inputs are all constants
 * (scalar nodes, folded constant tensors; creation ops have no inputs at all)
 * runs once at compile time, eagerly through the dispatcher on real tensors,
 * so the constant is computed by the very kernel the executor would run
 * (bitwise the same). A 0-dim result becomes a scalar node; any other result
 * becomes a graph-owned constant tensor: an IR_OP_CAPTURED node with
 * constant = 1 reading graph->captured[index].
 *
 * A constant tensor is read-only: nothing is folded whose storage the graph
 * writes in place, or that the caller receives (directly or as a view), since
 * the caller could write into it and change the next call's constant. Random
 * ops, `empty` and nodes larger than FOLD_MAX_NUMEL stay. CPU nodes only.
 */
#include "ir.h"

#include <math.h>
#include <stdlib.h>

#define FOLD_MAX_NUMEL 4096
/* arange may be larger: cross_entropy's decomposition compares the targets with
 * arange(C), and a vocabulary has tens of thousands of classes */
#define FOLD_MAX_ARANGE (1 << 20)

static int64_t numel(const ir_value *v) {
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

static int foldable(const ir_graph *g, const ir_node *n, const uint8_t *written) {
    if (n->dead || n->inplace || n->op >= KE_OP_COUNT || n->nout != 1 || n->device.type != KL_CPU) return 0;
    const ke_op_info *o = &ke_ops[n->op];
    if ((o->flags & (KE_F_RANDOM | KE_F_IMPLICIT)) || n->op == KE_OP_empty || ir_node_has_effect(g, n)) return 0;
    for (int i = 0; i < n->nin; i++)
        if (!ir_is_const(g, n->in[i])) return 0;
    int32_t out = n->out[0];
    const ir_value *v = &g->values[out];
    if (numel(v) > (n->op == KE_OP_arange ? FOLD_MAX_ARANGE : FOLD_MAX_NUMEL) || v->wrapped || written[v->base])
        return 0;
    /* the caller must never receive the constant or a view of it */
    for (int32_t i = 0; i < g->noutputs; i++)
        if (g->values[g->outputs[i]].base == v->base) return 0;
    return 1;
}

static kl_tensor *const_tensor(const ir_graph *g, int32_t id) {
    const ir_node *n = &g->nodes[g->values[id].node];
    if (n->op == IR_OP_CAPTURED) return g->captured[ir_attr_captured_index(&n->a)];
    /* as the executor makes it */
    int wrapped = ir_attr_scalar_wrapped(&n->a);
    double value = ir_attr_scalar_value(&n->a);
    kl_tensor *t = wrapped ? ke_wrap_scalar(value) : kl_scalar_tensor(value, ir_attr_scalar_dtype(&n->a));
    if (t && wrapped) ke_scope_adopt(t);
    return t;
}

/* A 0-dim result that a double holds exactly becomes a scalar node. */
static int as_scalar(const kl_tensor *t, double *v) {
    if (t->ndim != 0 || (t->flags & KE_TF_WRAPPED)) return 0;
    switch (t->dtype) {
    case KL_F64: case KL_F32: case KL_F16: case KL_BF16: case KL_BOOL: case KL_U8: case KL_I32:
        break;
    case KL_I64:
        if (llabs(*(const int64_t *)ke_data(t)) > (1ll << 53)) return 0;
        break;
    default:
        return 0;
    }
    *v = ke_load_f64(ke_data(t), (kl_dtype)t->dtype, 0);
    return 1;
}

/* Runs node k eagerly and turns it into a constant. 1 if folded, 0 if the
 * node is left as it is, -1 on an error that is not the node's own. */
static int fold_node(ir_graph *g, int32_t k) {
    ir_node *n = &g->nodes[k];
    int rc = 0;
    kl_tensor *in[8], *res = NULL;
    if (n->nin > 8) return 0;
    kl_scope_begin();
    kl_no_grad_begin();
    for (int i = 0; i < n->nin && !rc; i++) rc = !(in[i] = const_tensor(g, n->in[i]));
    ke_call c = {.op = n->op, .nin = n->nin, .in = in, .device = n->device, .a = n->a};
    if (!rc) rc = ke_dispatch(&c);
    if (!rc && c.nout == 1) {
        res = c.out[0];
        ke_tensor_incref(res);
    }
    kl_no_grad_end();
    kl_scope_end();
    if (!res) {
        /* the op fails at run time too: leave it to fail there, with its error */
        kl_clear_error();
        return 0;
    }
    ir_value *v = &g->values[n->out[0]];
    if (res->dtype != v->dtype || res->ndim != v->ndim || memcmp(res->shape, v->shape, sizeof(int64_t) * v->ndim)) {
        ke_tensor_decref(res);
        return 0;
    }
    double s;
    ke_attrs a = {0};
    if (as_scalar(res, &s)) {
        ir_attr_set_scalar_value(&a, s);
        ir_attr_set_scalar_dtype(&a, (kl_dtype)res->dtype);
        n->op = IR_OP_SCALAR;
        ke_tensor_decref(res);
    } else {
        kl_tensor **p = realloc(g->captured, sizeof *p * (size_t)(g->ncaptured + 1));
        if (!p) {
            ke_tensor_decref(res);
            return ke_err(KL_ERR_OOM, "compile", "out of memory");
        }
        g->captured = p;
        g->captured[g->ncaptured] = res; /* our reference becomes the graph's */
        ir_attr_set_captured_index(&a, g->ncaptured++);
        ir_attr_set_captured_constant(&a, true);
        n->op = IR_OP_CAPTURED;
        v->offset = res->offset;
        memcpy(v->stride, res->stride, sizeof(int64_t) * res->ndim);
    }
    n->a = a;
    n->compute = -1;
    free(n->in);
    n->in = NULL;
    n->nin = 0;
    v->base = v->id;
    return 1;
}

int ir_pass_fold(ir_graph *g) {
    uint8_t *written = ir_written_mask(g);
    if (!written) return -1;
    int changed = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        if (!foldable(g, &g->nodes[k], written)) continue;
        int r = fold_node(g, k);
        if (r < 0) {
            free(written);
            return -1;
        }
        changed += r;
    }
    free(written);
    /* inputs of folded nodes may now be unused: dce removes them */
    return changed;
}
