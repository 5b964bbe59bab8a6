/*
 * record.c — the Autograd dispatch key's handler: runs the op below itself
 * and, when an input requires grad, records a backward node with the edges,
 * metadata and saved tensors its derivative formula needs.
 *
 * In-place rules (the checks here are what keep a gradient from ever being
 * silently wrong; docs/AUTOGRAD.md explains them against PyTorch's):
 *  - a leaf that requires grad cannot be written in place in grad mode;
 *  - a recorded view cannot be written in place (PyTorch rebases the base's
 *    history through CopySlices; Kiln asks for a clone), nor can a tensor that
 *    does not require grad yet shares its storage with another header, when
 *    the write would make it require grad (its aliases would not know);
 *  - a recorded view whose storage was written after the view was made
 *    (through its base or another alias) cannot be used by a recorded op: its
 *    history no longer describes its values.
 */
#include "autograd.h"

#include <stdlib.h>

_Atomic int64_t ag_stat_backward[KE_OP_COUNT];
_Atomic int64_t ag_stat_double[KE_OP_COUNT];

static int check_inplace(ke_call *c) {
    kl_tensor *self = c->in[0];
    ag_meta *m = ag_meta_get(self);
    char b[256];
    const char *name = ke_opname(c);
    if (m && m->requires_grad && !m->grad_fn)
        return ke_err(KL_ERR_STATE, name,
                      "in-place write into a leaf that requires grad (%s); update parameters inside "
                      "kl_no_grad_begin/end, or clone the tensor first",
                      ke_fmt_tensor(b, sizeof b, self));
    if (m && m->is_view)
        return ke_err(KL_ERR_UNSUPPORTED, name,
                      "in-place write into a view (%s) of a tensor that requires grad: Kiln does not rebase "
                      "the base's history; clone the view, or write into the base",
                      ke_fmt_tensor(b, sizeof b, self));
    if (!(m && m->requires_grad) && atomic_load(&self->storage->refcount) > 1)
        return ke_err(KL_ERR_UNSUPPORTED, name,
                      "in-place write of a value that requires grad into %s, whose storage other tensors "
                      "share: their history would not see it; write into a fresh tensor",
                      ke_fmt_tensor(b, sizeof b, self));
    return 0;
}

static int check_view_fresh(ke_call *c, int i) {
    const kl_tensor *t = c->in[i];
    const ag_meta *m = ag_meta_get(t);
    if (!m || !m->is_view) return 0;
    int64_t v = atomic_load_explicit(&t->storage->version, memory_order_relaxed);
    if (v == m->view_version) return 0;
    char b[256];
    int w = t->storage->last_write_op;
    return ke_err(KL_ERR_STATE, ke_opname(c),
                  "input %d (%s) is a view whose storage was modified by kl_%s_inplace after the view was "
                  "made: its recorded history is stale; make the view again after the write",
                  i + 1, ke_fmt_tensor(b, sizeof b, t), w >= 0 ? ke_ops[w].name : "?");
}

static void save(ag_saved *s, kl_tensor *t, int is_output) {
    s->t = t;
    s->version = atomic_load_explicit(&t->storage->version, memory_order_relaxed);
    s->is_output = (uint8_t)is_output;
}

int ag_records_pieces(const ke_call *c) {
    if (!ag_derivs[c->op].decomp || !ag_grad_enabled()) return 0;
    for (int i = 0; i < c->nin; i++)
        if (ag_requires(c->in[i])) return 1;
    return 0;
}

int ag_record_handler(ke_call *c) {
    const ke_op_info *op = &ke_ops[c->op];
    int any = 0;
    for (int i = 0; i < c->nin; i++) any |= ag_requires(c->in[i]);
    if (!any) return ke_redispatch(c, KE_KEY_AUTOGRAD);
    if (op->flags & KE_F_NONDIFF) {
        if (c->inplace && ag_requires(c->in[0]))
            return ke_err(KL_ERR_UNSUPPORTED, ke_opname(c),
                          "in-place write of a non-differentiable result into a tensor that requires grad");
        if (ke_redispatch(c, KE_KEY_AUTOGRAD)) return -1;
        /* Remembered so a backward from these outputs can say why it fails. */
        for (int j = c->inplace ? 1 : 0; j < c->nout; j++) {
            ag_meta *m = ag_meta_ensure(c->out[j]);
            if (m) m->nondiff_op = (int16_t)(1 + c->op);
        }
        return 0;
    }
    const ag_deriv *d = &ag_derivs[c->op];
    if (d->decomp) {
        atomic_fetch_add_explicit(&ag_stat_backward[c->op], 1, memory_order_relaxed);
        return op->decomp(c);
    }
    if (!d->fn) return ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "has no derivative");
    for (int i = 0; i < c->nin; i++)
        if (check_view_fresh(c, i)) return -1;

    kl_tensor *pre = NULL; /* in[0]'s value before an in-place write, if saved */
    if (c->inplace) {
        if (check_inplace(c)) return -1;
        if (d->save & AG_IN(0)) {
            pre = kl_clone(c->in[0]); /* recorded: double backward reaches in[0]'s history */
            if (!pre) return -1;
            ke_tensor_incref(pre);
        }
    }
    /* Variadic outputs belong to implicit composites, never recorded. */
    ag_node *n = ag_node_new(c->op, c->nin, op->nout);
    if (!n) {
        if (pre) ke_tensor_decref(pre);
        return -1;
    }
    n->inplace = c->inplace;
    n->a = c->a;
    for (int i = 0; i < c->nin; i++) {
        ag_tmeta_of(c->in[i], &n->in_meta[i]);
        if (ag_edge_of(c->in[i], &n->next[i])) goto fail;
    }
    for (int i = 0; i < c->nin; i++) {
        if (!(d->save & AG_IN(i))) continue;
        kl_tensor *t = c->in[i];
        if (c->inplace && t == c->in[0]) {
            ke_tensor_incref(pre);
            save(&n->saved_in[i], pre, 0);
        } else {
            ke_tensor_incref(t);
            save(&n->saved_in[i], t, 0);
        }
    }
    if (pre) {
        ke_tensor_decref(pre);
        pre = NULL;
    }
    if (ke_redispatch(c, KE_KEY_AUTOGRAD)) goto fail;
    KE_ASSERT(c->nout == op->nout);
    for (int j = 0; j < c->nout; j++) {
        kl_tensor *o = c->out[j];
        ag_tmeta_of(o, &n->out_meta[j]);
        if (d->save & AG_OUT(j)) {
            kl_tensor *a = ke_tensor_view(o, o->ndim, o->shape, o->stride, o->offset);
            if (!a) goto fail_outputs;
            save(&n->saved_out[j], a, 1);
        }
    }
    for (int j = 0; j < c->nout; j++) {
        kl_tensor *o = c->out[j];
        if (!ke_is_float((kl_dtype)o->dtype)) continue;
        ag_meta *m = ag_meta_ensure(o);
        if (!m) goto fail_outputs;
        if (m->grad_fn) {
            /* an in-place write: o's history now ends at this node */
            if (m->retains_grad && m->grad_fn->retained) m->grad_fn->retained[m->output_nr] = NULL;
            m->retains_grad = 0;
            ag_node_decref(m->grad_fn);
        }
        m->requires_grad = 1;
        m->grad_fn = n;
        m->output_nr = j;
        ag_node_incref(n);
        if (op->kind == KE_KIND_VIEW) {
            m->is_view = 1;
            m->view_version = atomic_load_explicit(&o->storage->version, memory_order_relaxed);
        }
        ag_sync_key(o);
    }
    ag_node_decref(n); /* the outputs hold it now */
    return 0;

fail_outputs:
    /* The op ran but its history could not be recorded: give the outputs back. */
    for (int j = c->inplace ? 1 : 0; j < c->nout; j++) kl_release(c->out[j]);
fail:
    if (pre) ke_tensor_decref(pre);
    ag_node_decref(n);
    return -1;
}
