/*
 * writeback.c — kernels write functionalized updates straight into the
 * caller's tensors.
 *
 * Functionalization turns `p -= lr * g` into a pure node and a copy_back of
 * its result into p at the end of the graph; fusion then computes the result
 * in a kernel, and the copy_back would read it and write p again: for an
 * optimizer step over p, m and v that is three more passes over memory than
 * the update itself needs. Here an elementwise kernel whose output j is
 * copied back into a tensor b it reads instead writes output j into b itself
 * (the kernel node's write_into[j] names the input position of b; -1 elsewhere),
 * and the copy_back goes. That is safe when
 *  - the kernel is elementwise (no row passes) and reads b at exactly the
 *    element it writes (the same index over the domain, same dtype), and
 *    reads no other view of b's storage: each element is read before it is
 *    written, by the same iteration;
 *  - b is contiguous and shaped like the domain (outputs are contiguous);
 *  - nothing after the kernel reads b's storage (the copy_back ran last, so
 *    every reader saw the old data), and the result has no other use.
 */
#include "kernel.h"

#include <stdlib.h>

static int contiguous(const ir_value *v) {
    int64_t s = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != s) return 0;
        s *= v->shape[d];
    }
    return 1;
}

/* The input position of b in kernel node kn if output j may be written
 * into it, else -1. */
static int target_input(const ir_graph *g, const ir_node *kn, int j, int32_t b) {
    const ir_kernel *k = g->kernels[ir_attr_kernel_id(&kn->a)];
    const ir_value *bv = &g->values[b], *v = &g->values[kn->out[j]];
    if (k->row || bv->dtype != v->dtype || bv->ndim != v->ndim || !contiguous(bv) ||
        memcmp(bv->shape, v->shape, sizeof(int64_t) * v->ndim))
        return -1;
    const ir_kbuf *ob = &k->bufs[k->ninputs + j];
    int pos = -1;
    for (int i = 0; i < kn->nin; i++) {
        if (g->values[kn->in[i]].base != bv->base) continue;
        const ir_kbuf *ib = &k->bufs[i];
        if (kn->in[i] != b || ib->dtype != ob->dtype || memcmp(ib->index, ob->index, sizeof(int64_t) * k->ndim))
            return -1;
        pos = i;
    }
    return pos;
}

/* 1 if a live node after `after`, other than skip, reads a value over base. */
static int read_later(const ir_graph *g, int32_t after, int32_t skip, int32_t base) {
    for (int32_t k = after + 1; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead || k == skip) continue;
        for (int i = 0; i < n->nin; i++)
            if (g->values[n->in[i]].base == base) return 1;
    }
    return 0;
}

int ir_pass_writeback(ir_graph *g) {
    if (!g->fuse) return 0;
    int32_t *uses = malloc(sizeof *uses * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!uses) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    ir_count_uses(g, uses);
    int changed = 0;
    for (int32_t c = 0; c < g->nnodes; c++) {
        ir_node *cb = &g->nodes[c];
        if (cb->dead || cb->op != IR_OP_COPY_BACK) continue;
        int32_t b = cb->in[0], v = cb->in[1];
        const ir_value *vv = &g->values[v];
        if (vv->kind != IR_VAL_NODE || uses[v] != 1) continue;
        ir_node *kn = &g->nodes[vv->node];
        if (kn->op != IR_OP_KERNEL) continue;
        int j = vv->index;
        int pos = target_input(g, kn, j, b);
        if (pos < 0 || read_later(g, vv->node, c, g->values[b].base)) continue;
        if (kn->a.nlist == 0) {
            kn->a.nlist = kn->nout;
            for (int o = 0; o < kn->nout; o++) kn->a.list[o] = -1;
        }
        kn->a.list[j] = pos;
        cb->dead = 1;
        changed++;
    }
    free(uses);
    if (changed && ir_graph_compact(g)) return -1;
    return changed;
}
