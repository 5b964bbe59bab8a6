/*
 * functionalize.c — in-place ops become pure ops. Tracing records x.add_(y)
 * as a node whose output is a new version of x's storage; here each such
 * write becomes a pure node (its output a fresh value), and where the storage
 * is a graph input or a captured tensor the caller can see, one copy_back at
 * the end of the graph writes the last version into it. Graph outputs that
 * were the written input (eager returns the input tensor itself) name the
 * input again, so the caller still gets its own tensor, updated.
 *
 * A storage is rewritten only when every write to it is safe to make pure:
 *  - every in-place op on it is elementwise, and its pure form has the
 *    input's dtype and shape (x.add_(f64 y) on f32 x computes in f64, rounds
 *    once: kept in place rather than reproduced by add + to_dtype);
 *  - no view of it is taken or read after the first write (a view read
 *    afterwards must see the new data; before it, the storage still holds
 *    the old data, so views read then are safe); writes go to the whole
 *    storage, never through a view;
 *  - no node reads an older version after a write (the tracer's stand-ins
 *    always carry the latest version, so this holds without views).
 * Otherwise all writes to that storage stay in place (copy_ and fill_, which
 * are `copy` nodes, always do), and the executor runs them as recorded.
 */
#include "ir.h"

#include <stdlib.h>

/* A stand-in for value id to run the op's shape rule on: wrapped scalars are
 * real (rules may read them, as in eager), the rest meta. Scope-owned. */
static kl_tensor *stand_in(const ir_graph *g, int32_t id) {
    const ir_value *v = &g->values[id];
    const ir_node *s = v->kind == IR_VAL_NODE ? &g->nodes[v->node] : NULL;
    kl_tensor *t;
    if (s && s->op == IR_OP_SCALAR && ir_attr_scalar_wrapped(&s->a)) {
        t = ke_wrap_scalar(ir_attr_scalar_value(&s->a));
    } else {
        ke_storage *st = ke_storage_new(0, KL_DEVICE_META, "compile");
        if (!st) return NULL;
        t = ke_tensor_wrap(st, (kl_dtype)v->dtype, v->ndim, v->shape, v->stride, 0);
        ke_storage_decref(st);
    }
    if (t) ke_scope_adopt(t);
    return t;
}

/* 1 if node n's pure form yields in[0]'s dtype and shape. */
static int pure_form_matches(const ir_graph *g, const ir_node *n) {
    if (n->op >= KE_OP_COUNT || ke_ops[n->op].kind != KE_KIND_EW || !ke_ops[n->op].infer || n->nin > 8) return 0;
    kl_tensor *in[8];
    ke_outspec spec[KE_MAX_OUT];
    int ok = 0;
    kl_scope_begin();
    int i = 0;
    for (; i < n->nin; i++)
        if (!(in[i] = stand_in(g, n->in[i]))) break;
    if (i == n->nin) {
        ke_call c = {.op = n->op, .nin = n->nin, .in = in, .device = n->device, .a = n->a};
        const ir_value *x = &g->values[n->in[0]];
        ok = ke_ops[n->op].infer(&c, spec) == 1 && spec[0].dtype == x->dtype && spec[0].ndim == x->ndim &&
             memcmp(spec[0].shape, x->shape, sizeof(int64_t) * x->ndim) == 0;
    }
    kl_scope_end();
    kl_clear_error();
    return ok;
}

static int user_visible(const ir_graph *g, int32_t b) {
    const ir_value *v = &g->values[b];
    if (v->kind == IR_VAL_INPUT) return 1;
    const ir_node *n = &g->nodes[v->node];
    return n->op == IR_OP_CAPTURED && !ir_attr_captured_constant(&n->a);
}

static int eligible(const ir_graph *g, int32_t b) {
    const ir_value *bv = &g->values[b];
    if (bv->kind == IR_VAL_NODE) {
        const ir_node *d = &g->nodes[bv->node];
        if (d->op == IR_OP_CAPTURED ? ir_attr_captured_constant(&d->a) : d->op >= KE_OP_COUNT || ke_ops[d->op].kind == KE_KIND_VIEW)
            return 0;
    }
    int32_t cur = b;
    int wrote = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        int writes = n->inplace && g->values[n->in[0]].base == b;
        if (writes && n->in[0] != cur) return 0; /* a write through a view: partial */
        for (int i = 0; i < n->nin; i++) {
            int32_t id = n->in[i];
            if (g->values[id].base != b) continue;
            if (n->op == IR_OP_COPY_BACK) return 0;
            if (id == cur && !(n->op < KE_OP_COUNT && ke_ops[n->op].kind == KE_KIND_VIEW)) continue;
            /* A view taken, or read, before the first write sees the data
             * as it was, which the input still holds until the copy_back at
             * the end (a training step reads its weights through an alias,
             * then updates them): only afterwards would it need the write. */
            if (wrote) return 0;
        }
        if (writes) {
            if (!pure_form_matches(g, n)) return 0;
            cur = n->out[0];
            wrote = 1;
        }
    }
    for (int32_t i = 0; i < g->noutputs; i++)
        if (g->values[g->outputs[i]].base == b && g->outputs[i] != cur) return 0;
    return 1;
}

static void make_pure(ir_graph *g, ir_node *n) {
    ir_value *v = &g->values[n->out[0]];
    n->inplace = 0;
    v->base = v->id;
    v->offset = 0;
    int64_t s = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        v->stride[d] = s;
        s *= v->shape[d];
    }
}

int ir_pass_functionalize(ir_graph *g) {
    int32_t nv = g->nvalues;
    uint8_t *written = malloc((size_t)(nv ? nv : 1));
    if (!written) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    memset(written, 0, (size_t)nv);
    for (int32_t k = 0; k < g->nnodes; k++)
        if (!g->nodes[k].dead && g->nodes[k].inplace) written[g->values[g->nodes[k].in[0]].base] = 1;
    int changed = 0;
    for (int32_t b = 0; b < nv; b++) {
        if (!written[b] || !eligible(g, b)) continue;
        /* the writes form a chain of versions: follow it (making a node
         * pure changes its output's base, so bases cannot be re-read) */
        int32_t last = b;
        for (int32_t k = 0; k < g->nnodes; k++) {
            ir_node *n = &g->nodes[k];
            if (n->dead || !n->inplace || n->in[0] != last) continue;
            make_pure(g, n);
            last = n->out[0];
            changed++;
        }
        if (!user_visible(g, b)) continue;
        int32_t in[2] = {b, last};
        if (ir_add_node(g, IR_OP_COPY_BACK, 0, 2, in, 0, NULL, NULL, g->values[b].device, -1) < 0) {
            free(written);
            return -1;
        }
        for (int32_t i = 0; i < g->noutputs; i++)
            if (g->outputs[i] == last) g->outputs[i] = b;
    }
    free(written);
    return changed;
}
