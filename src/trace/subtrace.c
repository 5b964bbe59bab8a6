/*
 * subtrace.c — the trace layer's service to the IR's decomposition pass:
 * traces one composite node's decomposition (ke_ops[op].decomp, run on meta
 * stand-ins of the node's inputs) into a subgraph, through the ordinary
 * tracer. src/init.c installs it as ir_hook.subtrace, so src/ir never calls
 * up into this layer.
 */
#include "trace.h"

#include "log.h"

#include <stdlib.h>

static int run_decomp(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const ir_node *n = u;
    ke_call c = {.op = n->op, .nin = n_in, .in = in, .device = KL_DEVICE_META, .a = n->a};
    if (ke_ops[n->op].decomp(&c)) return -1;
    if (c.nout != n_out) return ke_err(KL_ERR_INTERNAL, ke_opname(&c), "the decomposition gave %d outputs", c.nout);
    for (int j = 0; j < n_out; j++) out[j] = c.out[j];
    return 0;
}

ir_graph *tr_subtrace(const ir_graph *g, const ir_node *n) {
    kl_tensor *in[16];
    if (n->nin > 16) return NULL;
    ir_graph *sub = NULL;
    kl_scope_begin();
    int i = 0;
    for (; i < n->nin; i++) {
        const ir_value *v = &g->values[n->in[i]];
        ke_storage *st = ke_storage_new(0, KL_DEVICE_META, "compile");
        if (!st) break;
        in[i] = ke_tensor_wrap(st, (kl_dtype)v->dtype, v->ndim, v->shape, v->stride, 0);
        ke_storage_decref(st);
        if (!in[i]) break;
        ke_scope_adopt(in[i]);
    }
    if (i == n->nin) {
        int broke = 0;
        char why[256];
        sub = tr_trace(run_decomp, (void *)n, in, n->nin, n->nout, &broke, why, sizeof why);
    }
    kl_scope_end();
    /* a decomposition that cannot be traced leaves the node composite */
    if (!sub) {
        ke_log(KE_LOG_TRACE, "kl_%s stays composite: its decomposition does not trace (%s)", ke_ops[n->op].name,
               kl_last_status() != KL_OK ? kl_last_error() : "it needs data");
        kl_clear_error();
    }
    return sub;
}
