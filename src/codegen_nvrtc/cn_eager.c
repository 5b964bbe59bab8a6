/*
 * cn_eager.c — eager elementwise ops on CUDA tensors from the code path of
 * compiled kernels: each call becomes the one-op kernel IR the fuse pass
 * would make for that op alone (a LOAD per input, the OP, a STORE), which
 * the nvrtc backend turns into CUDA C (cn_emit.c: the eager formula itself,
 * compiled for the device), loads and launches. So an eager CUDA op and a
 * compiled one give the same bits, and both the CPU's.
 *
 * The kernel is generated in its run-time-shape form (cn_emit_kernel_dyn):
 * shape and strides are a kernel parameter, only the layout class (flat, or
 * strided of a given rank) is in the source. So the module cache (by
 * source) keys a call by (op, dtypes, compute dtype, attributes, broadcast
 * bits, layout class): a new shape of a class already seen is a lookup.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "ew.h"

#include <string.h>

int ku_cuda_ew(ke_call *c) {
    kl_tensor *out = c->out[0];
    const ke_ew_impl *impl = ke_ops[c->op].impl;
    if (!impl || c->nin > 4 || c->nout != 1)
        return ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    const int nd = out->ndim;
    const int64_t n = ke_numel(nd, out->shape);
    if (n == 0) return 0;
    ir_kbuf bufs[5];
    memset(bufs, 0, sizeof bufs);
    ir_kernel k = {.ninputs = c->nin, .noutputs = 1, .bufs = bufs, .ndim = (uint8_t)nd, .device = c->device};
    memcpy(k.shape, out->shape, sizeof(int64_t) * (size_t)nd);
    ir_kstmt st[7];
    memset(st, 0, sizeof st);
    ir_kstmt *opst = &st[c->nin];
    *opst = (ir_kstmt){.kind = IR_K_OP, .dtype = out->dtype, .compute = (uint8_t)c->compute, .op = c->op, .buf = -1,
                       .nargs = c->nin, .a = c->a};
    for (int b = 0; b <= c->nin; b++) {
        const kl_tensor *t = b < c->nin ? c->in[b] : out;
        ir_kbuf *kb = &bufs[b];
        kb->dtype = t->dtype;
        kb->ndim = t->ndim;
        kb->output = b == c->nin;
        memcpy(kb->shape, t->shape, sizeof(int64_t) * t->ndim);
        memcpy(kb->stride, t->stride, sizeof(int64_t) * t->ndim);
        ke_broadcast_strides(t, nd, out->shape, kb->index);
        kb->contig_inner = nd > 0 && kb->index[nd - 1] == 1;
        if (b == c->nin) break;
        st[b] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = t->dtype, .buf = b, .op = -1};
        opst->args[b] = b;
        /* as eager hands the loop a one-element operand (and as lowering records it) */
        if (((impl->bcast_ok >> b) & 1) && ke_numel(t->ndim, t->shape) == 1 && n > 1) opst->bcast |= (uint8_t)(1u << b);
    }
    st[c->nin + 1] = (ir_kstmt){.kind = IR_K_STORE, .dtype = out->dtype, .buf = c->nin, .op = -1, .nargs = 1,
                                .args = {c->nin}};
    k.stmts = st;
    k.nstmts = c->nin + 2;
    return cn_run_once(&k, ke_opname(c), c->in, c->out);
}
