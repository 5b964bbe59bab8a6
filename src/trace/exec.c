/*
 * exec.c — runs a graph on real tensors, node by node through the
 * dispatcher (so autograd records when inputs require grad, and every
 * backend works). This is the executor of TRACE_ONLY and NO_FUSE modes; fused
 * kernels plug in here as nodes of their own.
 */
#include "trace.h"

#include "kernel.h"

#include <stdlib.h>

int64_t tr_count_launches(const ir_graph *g) {
    int64_t n = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *nd = &g->nodes[k];
        if (nd->dead || (nd->op >= KE_OP_COUNT && nd->op != IR_OP_KERNEL) ||
            (nd->op < KE_OP_COUNT && ke_ops[nd->op].kind == KE_KIND_VIEW))
            continue;
        n++;
    }
    return n;
}

/* A fused kernel: fresh contiguous outputs, then the backend. */
static int run_kernel(const ir_graph *g, const ir_node *n, kl_tensor **vals) {
    const ir_kernel *k = g->kernels[n->a.i[0]];
    kl_tensor *in[16], *out[KE_MAX_OUT];
    if (n->nin > 16) return ke_err(KL_ERR_UNSUPPORTED, "fn_call", "a kernel with %d inputs", n->nin);
    for (int i = 0; i < n->nin; i++) in[i] = vals[n->in[i]];
    for (int j = 0; j < n->nout; j++) {
        const ir_kbuf *b = &k->bufs[k->ninputs + j];
        out[j] = ke_tensor_new((kl_dtype)b->dtype, b->ndim, b->shape, KL_DEVICE_CPU, "fn_call");
        if (!out[j]) return -1;
        ke_scope_adopt(out[j]);
        vals[n->out[j]] = out[j];
    }
    return ir_kernel_run(k, in, out);
}

static int run_node(const ir_graph *g, const ir_node *n, kl_tensor **vals) {
    if (n->op == IR_OP_KERNEL) return run_kernel(g, n, vals);
    if (n->op == IR_OP_SCALAR) {
        kl_tensor *t = n->a.i[0] ? ke_wrap_scalar(n->a.f[0])
                                 : kl_scalar_tensor(n->a.f[0], (kl_dtype)n->a.i[KE_ATTR_DTYPE]);
        if (!t) return -1;
        if (n->a.i[0]) ke_scope_adopt(t);
        vals[n->out[0]] = t;
        return 0;
    }
    if (n->op == IR_OP_CAPTURED) {
        vals[n->out[0]] = g->captured[n->a.i[0]];
        return 0;
    }
    if (n->op == IR_OP_COPY_BACK) return kl_copy_inplace(vals[n->in[0]], vals[n->in[1]]) ? 0 : -1;
    kl_tensor *inl[8];
    kl_tensor **in = n->nin <= 8 ? inl : malloc(sizeof *in * (size_t)n->nin);
    if (!in) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int i = 0; i < n->nin; i++) in[i] = vals[n->in[i]];
    ke_call c = {.op = n->op, .inplace = n->inplace, .nin = n->nin, .in = in, .device = n->device};
    c.a = n->a;
    int rc = (ke_ops[n->op].flags & KE_F_RANDOM) ? ke_random_reserve(&c) : 0;
    if (!rc) rc = ke_dispatch(&c);
    if (!rc && c.nout != n->nout)
        rc = ke_err(KL_ERR_INTERNAL, "fn_call", "kl_%s gave %d outputs, the graph expects %d", ke_ops[n->op].name,
                    c.nout, n->nout);
    for (int j = 0; !rc && j < n->nout; j++) vals[n->out[j]] = c.out[j];
    if (in != inl) free(in);
    return rc;
}

static int is_first(kl_tensor *const *outs, int32_t j) {
    for (int32_t i = 0; i < j; i++)
        if (outs[i] == outs[j]) return 0;
    return 1;
}

int tr_run_graph(const ir_graph *g, kl_tensor *const *inputs, kl_tensor **outputs) {
    kl_tensor **vals = calloc((size_t)g->nvalues + 1, sizeof *vals);
    if (!vals) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int32_t i = 0; i < g->ninputs; i++) vals[g->inputs[i]] = inputs[i];
    kl_scope_begin();
    int rc = 0;
    for (int32_t k = 0; k < g->nnodes && !rc; k++)
        if (!g->nodes[k].dead) rc = run_node(g, &g->nodes[k], vals);
    /* Results made here outlive the scope: hold them, close it, then hand
     * each distinct one to the caller's scope. Inputs and captured tensors are
     * returned as they are. */
    for (int32_t j = 0; !rc && j < g->noutputs; j++) {
        outputs[j] = vals[g->outputs[j]];
        if (is_first(outputs, j)) ke_tensor_incref(outputs[j]);
    }
    kl_scope_end();
    for (int32_t j = 0; !rc && j < g->noutputs; j++) {
        kl_tensor *t = outputs[j];
        if (!is_first(outputs, j)) continue;
        if (t->scope == NULL && atomic_load(&t->refcount) == 1)
            ke_scope_adopt(t); /* our reference becomes the caller scope's */
        else
            ke_tensor_decref(t);
    }
    if (rc)
        for (int32_t j = 0; j < g->noutputs; j++) outputs[j] = NULL;
    free(vals);
    return rc;
}
