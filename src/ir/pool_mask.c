/*
 * pool_mask.c — relu's gradient mask moved before max pooling's gradient,
 * onto the pooled gradient (a CNN's conv -> relu -> max_pool backward):
 *
 *   gr = max_pool2d_backward(gp, r); gb = threshold_backward(gr, r)
 *     -> u = threshold_backward(gp, p); gb = max_pool2d_backward(u, r)
 *
 * where p = max_pool2d(r) with the same attributes is in the graph (the
 * forward). Exact, bit for bit: max_pool2d_backward puts g at each window's
 * maximum and +0 everywhere else, and a window's maximum *is* p's element,
 * so keeping g where r > t at those places is keeping it where p > t before
 * the scatter (a NaN maximum passes in both; a place that is the maximum of
 * several overlapping windows has one value, so all their g pass or none
 * do, summed in the same order; masked places stay +0). For 2x2 pooling the
 * mask then reads and writes 4x fewer elements, and fuses with the op that
 * made gp.
 *
 * The forward stays as traced: relu after the pool is not bitwise relu
 * before it (a window (-1, -0) pools to +0 after relu, to -0 before it).
 * Matched only where the values involved are not written in place and gr
 * (whose shape becomes p's) has no other use.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static int contiguous(const ir_value *v) {
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != want) return 0;
        want *= v->shape[d];
    }
    return v->offset == 0;
}

/* The max_pool2d node before node `before` that pools r with attributes a, or -1. */
static int32_t find_pool(const ir_graph *g, int32_t before, int32_t r, const ke_attrs *a, kl_device dev) {
    for (int32_t k = 0; k < before; k++) {
        const ir_node *n = &g->nodes[k];
        if (!n->dead && !n->inplace && n->op == KE_OP_max_pool2d && n->in[0] == r && n->device.type == dev.type &&
            n->device.index == dev.index && ir_attrs_equal(&n->a, a))
            return k;
    }
    return -1;
}

int ir_pass_pool_mask(ir_graph *g) {
    uint8_t *written = ir_written_mask(g);
    int32_t *uses = malloc(sizeof *uses * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!written || !uses) {
        free(written), free(uses);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    ir_count_uses(g, uses);
    int changed = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node *pb = &g->nodes[k];
        if (pb->dead || pb->inplace || pb->op != KE_OP_max_pool2d_backward) continue;
        int32_t gp = pb->in[0], r = pb->in[1], gr = pb->out[0];
        if (uses[gr] != 1 || ir_is_output(g, gr) || g->values[gr].base != gr || written[g->values[gr].base] ||
            written[g->values[r].base] || written[g->values[gp].base])
            continue;
        int32_t t = -1; /* gr's one user */
        for (int32_t j = k + 1; j < g->nnodes && t < 0; j++) {
            const ir_node *n = &g->nodes[j];
            for (int i = 0; i < n->nin && !n->dead; i++)
                if (n->in[i] == gr) t = j;
        }
        if (t < 0) continue;
        ir_node *tb = &g->nodes[t];
        if (tb->inplace || tb->op != KE_OP_threshold_backward || tb->in[0] != gr || tb->in[1] != r ||
            tb->device.type != pb->device.type || tb->device.index != pb->device.index)
            continue;
        int32_t pool = find_pool(g, k, r, &pb->a, pb->device);
        if (pool < 0) continue;
        int32_t p = g->nodes[pool].out[0];
        const ir_value *pv = &g->values[p], *gpv = &g->values[gp];
        if (written[pv->base] || !contiguous(pv) || !contiguous(gpv) || pv->dtype != gpv->dtype) continue;
        /* pb becomes the mask over the pooled gradient, tb the scatter */
        ir_node was = *pb;
        pb->op = KE_OP_threshold_backward, pb->a = tb->a, pb->compute = tb->compute, pb->loc = tb->loc;
        pb->in[1] = p;
        tb->op = KE_OP_max_pool2d_backward, tb->a = was.a, tb->compute = was.compute, tb->loc = was.loc;
        ir_value *u = &g->values[gr];
        u->ndim = pv->ndim, u->offset = 0;
        memcpy(u->shape, pv->shape, sizeof u->shape);
        memcpy(u->stride, pv->stride, sizeof u->stride);
        changed++;
    }
    free(written), free(uses);
    return changed;
}
