/*
 * simplify.c — algebraic simplification, each rule exact (bitwise what eager
 * computes):
 *   x*1, 1*x, x/1, x-(+0)     -> x      (floats: x-(+0) keeps -0 and NaN)
 *   x+0, 0+x                 -> x      (integer and bool results only:
 *                                       for floats -0 + 0 is +0)
 *   neg(neg x)               -> x      (also exact for wrapping integers)
 *   a view chain that ends where it started (transpose of a transpose,
 *   permutes composing to identity, squeeze(unsqueeze x), alias, a view to
 *   the same shape, ...)     -> the value it started from
 *   view(<contiguous view chain of contiguous x>)      -> view(x)
 *   expand(expand x)         -> expand(x)
 * x*0 is not 0 (NaN, inf, -0). A rule applies only where the result has
 * exactly x's dtype, shape, strides and offset: where promotion or
 * broadcasting changes them the op stays (no to_dtype/expand is substituted).
 * Replacing a value by another needs both storages free of in-place writes
 * (a later write into x would otherwise show through; views included: after
 * a write, the graph names only the newest version of a storage, which dce
 * relies on), and the caller never
 * gets x in place of a distinct result tensor, so graph outputs stay.
 */
#include "ir.h"

#include <math.h>
#include <stdlib.h>

/* The scalar node defining id, or NULL. */
static const ir_node *scalar_of(const ir_graph *g, int32_t id) {
    const ir_value *v = &g->values[id];
    if (v->kind != IR_VAL_NODE || g->nodes[v->node].op != IR_OP_SCALAR) return NULL;
    return &g->nodes[v->node];
}

static int is_value(const ir_graph *g, int32_t id, double want, int positive_zero) {
    const ir_node *s = scalar_of(g, id);
    if (!s || ir_attr_scalar_value(&s->a) != want) return 0;
    /* a wrapped -0 becomes the integer 0 at run time; an unwrapped one stays -0 */
    return !positive_zero || !signbit(ir_attr_scalar_value(&s->a)) || ir_attr_scalar_wrapped(&s->a);
}

static int is_view(const ir_graph *g, int32_t id, int op) {
    const ir_value *v = &g->values[id];
    if (v->kind != IR_VAL_NODE) return 0;
    const ir_node *n = &g->nodes[v->node];
    return n->op < KE_OP_COUNT && ke_ops[n->op].kind == KE_KIND_VIEW && !n->dead && (op < 0 || n->op == op);
}

static int contiguous(const ir_value *v) {
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != want) return 0;
        want *= v->shape[d];
    }
    return 1;
}

static int64_t numel(const ir_value *v) {
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

/* The value r can be replaced by, or -1. */
static int32_t identity_of(const ir_graph *g, const ir_node *n, const uint8_t *written) {
    const ir_value *r = &g->values[n->out[0]];
    if (n->op >= KE_OP_COUNT || n->nout != 1 || n->inplace) return -1;
    const ke_op_info *o = &ke_ops[n->op];
    if (o->kind == KE_KIND_VIEW) {
        /* Same storage, same layout: the same elements. But a write through
         * r would then name an older version of x's storage, which later
         * passes (dce) take as unobservable: views of written storage stay. */
        if (written[r->base]) return -1;
        for (int32_t a = n->in[0];; a = g->nodes[g->values[a].node].in[0]) {
            if (ir_same_layout(r, &g->values[a])) return a;
            if (!is_view(g, a, -1)) return -1;
        }
    }
    int32_t x = -1;
    kl_dtype dt = (kl_dtype)r->dtype;
    int integral = !(dt == KL_F32 || dt == KL_F64 || dt == KL_F16 || dt == KL_BF16);
    switch (n->op) {
    case KE_OP_mul:
        x = is_value(g, n->in[1], 1, 0) ? n->in[0] : is_value(g, n->in[0], 1, 0) ? n->in[1] : -1;
        break;
    case KE_OP_div:
        x = is_value(g, n->in[1], 1, 0) ? n->in[0] : -1;
        break;
    case KE_OP_sub:
        x = is_value(g, n->in[1], 0, 1) ? n->in[0] : -1;
        break;
    case KE_OP_add:
        if (integral) x = is_value(g, n->in[1], 0, 0) ? n->in[0] : is_value(g, n->in[0], 0, 0) ? n->in[1] : -1;
        break;
    case KE_OP_neg: {
        const ir_value *y = &g->values[n->in[0]];
        if (y->kind == IR_VAL_NODE && g->nodes[y->node].op == KE_OP_neg && !g->nodes[y->node].inplace)
            x = g->nodes[y->node].in[0];
        break;
    }
    default:
        break;
    }
    if (x < 0 || !ir_same_layout(r, &g->values[x])) return -1;
    if (written[r->base] || written[g->values[x].base]) return -1;
    return x;
}

/* view(view chain) and expand(expand): rewires node n to the chain's start. */
static int collapse(ir_graph *g, ir_node *n) {
    const ir_value *r = &g->values[n->out[0]];
    int32_t from = -1;
    if (n->op == KE_OP_view) {
        for (int32_t a = n->in[0]; is_view(g, a, -1);) {
            const ir_value *av = &g->values[a];
            int32_t up = g->nodes[av->node].in[0];
            const ir_value *uv = &g->values[up];
            if (!contiguous(av) || !contiguous(uv) || numel(av) != numel(uv) || av->offset != uv->offset) break;
            from = a = up;
        }
    } else if (n->op == KE_OP_expand && is_view(g, n->in[0], KE_OP_expand)) {
        from = g->nodes[g->values[n->in[0]].node].in[0];
    }
    if (from < 0) return 0;
    n->in[0] = from;
    n->a.nlist = r->ndim;
    memcpy(n->a.list, r->shape, sizeof(int64_t) * r->ndim);
    return 1;
}

int ir_pass_simplify(ir_graph *g) {
    uint8_t *written = ir_written_mask(g);
    if (!written) return -1;
    int changed = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node *n = &g->nodes[k];
        if (n->dead || n->op >= KE_OP_COUNT || n->nout != 1 || n->inplace) continue;
        if (ke_ops[n->op].kind == KE_KIND_VIEW) changed += collapse(g, n);
        if (ir_is_output(g, n->out[0]) || ir_node_has_effect(g, n)) continue;
        int32_t x = identity_of(g, n, written);
        if (x < 0) continue;
        ir_replace_uses(g, n->out[0], x);
        n->dead = 1;
        changed++;
    }
    free(written);
    if (changed && ir_graph_compact(g)) return -1;
    return changed;
}
