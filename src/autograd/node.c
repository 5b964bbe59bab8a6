/*
 * node.c — backward nodes: allocation, refcounting (iterative, so a graph of a
 * million chained ops does not overflow the stack when it dies), edges to
 * leaves' accumulate nodes, and saved tensors with their version checks.
 */
#include "autograd.h"

#include <stdlib.h>

static _Atomic int64_t next_seq;

ag_node *ag_node_new(int op, int nin, int nout) {
    size_t sz = sizeof(ag_node) + (size_t)nin * (sizeof(ag_edge) + sizeof(ag_tmeta) + sizeof(ag_saved)) +
                (size_t)nout * (sizeof(ag_tmeta) + sizeof(ag_saved));
    ag_node *n = calloc(1, sz);
    if (!n) {
        ke_err(KL_ERR_OOM, "autograd", "out of memory allocating a backward node");
        return NULL;
    }
    atomic_init(&n->refcount, 1);
    n->op = op;
    n->nin = nin;
    n->nout = nout;
    n->seq = atomic_fetch_add_explicit(&next_seq, 1, memory_order_relaxed);
    n->loc = ke_loc_now();
    char *p = (char *)(n + 1);
    n->saved_in = (ag_saved *)p;
    p += (size_t)nin * sizeof(ag_saved);
    n->saved_out = (ag_saved *)p;
    p += (size_t)nout * sizeof(ag_saved);
    n->next = (ag_edge *)p;
    p += (size_t)nin * sizeof(ag_edge);
    n->in_meta = (ag_tmeta *)p;
    p += (size_t)nin * sizeof(ag_tmeta);
    n->out_meta = (ag_tmeta *)p;
    return n;
}

void ag_saved_release(ag_node *n) {
    for (int i = 0; i < n->nin; i++)
        if (n->saved_in[i].t) {
            kl_tensor *t = n->saved_in[i].t;
            n->saved_in[i].t = NULL;
            ke_tensor_decref(t);
        }
    for (int i = 0; i < n->nout; i++)
        if (n->saved_out[i].t) {
            kl_tensor *t = n->saved_out[i].t;
            n->saved_out[i].t = NULL;
            ke_tensor_decref(t);
        }
    if (n->custom && n->custom->release_saved && !n->released) n->custom->release_saved(n->custom_ctx);
    n->released = 1;
}

/* Frees one node whose count reached zero; nodes it releases in turn are
 * queued on `pending` rather than freed recursively. */
static _Thread_local struct {
    ag_node **items; /* small, or a heap array while a long chain drains */
    ag_node *small[64];
    int n, cap, draining;
} pending;

static void node_destroy(ag_node *n) {
    for (int i = 0; i < n->nin; i++)
        if (n->next[i].fn) ag_node_decref(n->next[i].fn);
    ag_saved_release(n);
    if (n->leaf) {
        ag_meta *m = ag_meta_get(n->leaf);
        if (m && m->acc == n) m->acc = NULL;
        ke_tensor_decref(n->leaf);
    }
    if (n->retained)
        for (int i = 0; i < n->nout; i++)
            if (n->retained[i]) {
                ag_meta *m = ag_meta_get(n->retained[i]);
                if (m) m->retains_grad = 0;
            }
    free(n->retained);
    if (n->custom && n->custom->release) n->custom->release(n->custom_ctx);
    free(n);
}

void ag_node_decref(ag_node *n) {
    if (atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) != 1) return;
    if (!pending.items) {
        pending.items = pending.small;
        pending.cap = (int)(sizeof pending.small / sizeof pending.small[0]);
    }
    if (pending.n == pending.cap) {
        int cap = 2 * pending.cap;
        ag_node **p = pending.items == pending.small ? malloc((size_t)cap * sizeof *p)
                                                     : realloc(pending.items, (size_t)cap * sizeof *p);
        if (!p) {
            node_destroy(n); /* out of memory: fall back to recursion */
            return;
        }
        if (pending.items == pending.small) memcpy(p, pending.small, sizeof pending.small);
        pending.items = p;
        pending.cap = cap;
    }
    pending.items[pending.n++] = n;
    if (pending.draining) return;
    pending.draining = 1;
    while (pending.n > 0) node_destroy(pending.items[--pending.n]);
    pending.draining = 0;
    /* A heap array is given back once drained: a thread-local one would leak
     * at thread exit (LSan, test_threads' backward threads). */
    if (pending.items != pending.small) {
        free(pending.items);
        pending.items = pending.small;
        pending.cap = (int)(sizeof pending.small / sizeof pending.small[0]);
    }
}

void ag_tmeta_of(const kl_tensor *t, ag_tmeta *m) {
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    m->device = ke_device_of(t); /* while tracing, the traced value's real device */
    memcpy(m->shape, t->shape, sizeof(int64_t) * t->ndim);
}

int ag_edge_of(kl_tensor *t, ag_edge *e) {
    e->fn = NULL;
    e->output_nr = 0;
    ag_meta *m = ag_meta_get(t);
    if (!m || !m->requires_grad) return 0;
    if (m->grad_fn) {
        e->fn = m->grad_fn;
        e->output_nr = m->output_nr;
        ag_node_incref(e->fn);
        return 0;
    }
    if (m->acc) {
        e->fn = m->acc;
        ag_node_incref(e->fn);
        return 0;
    }
    ag_node *acc = ag_node_new(AG_OP_ACCUMULATE, 0, 1);
    if (!acc) return -1;
    acc->leaf = t;
    ke_tensor_incref(t);
    ag_tmeta_of(t, &acc->out_meta[0]);
    m->acc = acc; /* weak: cleared when acc dies */
    e->fn = acc;  /* the edge takes acc's first reference */
    return 0;
}

/* ---- saved tensors ---------------------------------------------------------------- */

kl_tensor *ag_saved_unpack(ag_node *n, ag_saved *s, int index, int grad_on) {
    const char *name = ke_ops[n->op].name;
    if (!s->t) {
        if (n->released)
            ke_err(KL_ERR_STATE, "backward",
                   "trying to backward through the node of kl_%s a second time: its saved tensors were "
                   "freed by the first backward (pass retain_graph to keep them)",
                   name);
        else
            ke_err(KL_ERR_INTERNAL, "backward", "kl_%s: a tensor its derivative needs was not saved", name);
        return NULL;
    }
    int64_t v = atomic_load_explicit(&s->t->storage->version, memory_order_relaxed);
    if (v != s->version) {
        char b[256];
        int w = s->t->storage->last_write_op;
        ke_err(KL_ERR_STATE, "backward",
               "%s %d of kl_%s (%s), saved for its backward, was modified afterwards by the in-place "
               "kl_%s_inplace (version %lld, saved at version %lld): clone it before modifying it",
               s->is_output ? "output" : "input", index + 1, name, ke_fmt_tensor(b, sizeof b, s->t),
               w >= 0 ? ke_ops[w].name : "?", (long long)v, (long long)s->version);
        return NULL;
    }
    if (!s->is_output || !grad_on) return s->t;
    /* Double backward through a saved output: an alias whose history is this
     * node, like the output the user holds. */
    kl_tensor *a = ke_tensor_view(s->t, s->t->ndim, s->t->shape, s->t->stride, s->t->offset);
    if (!a) return NULL;
    ag_meta *m = ag_meta_ensure(a);
    if (!m) {
        ke_tensor_decref(a);
        return NULL;
    }
    m->requires_grad = 1;
    m->grad_fn = n;
    m->output_nr = index;
    ag_node_incref(n);
    ag_sync_key(a);
    ke_scope_adopt(a);
    return a;
}

/* ---- custom nodes ------------------------------------------------------------------ */

int ag_record_custom(const ag_custom *cb, void *ctx, int nin, kl_tensor *const *inputs, int nout,
                     kl_tensor *const *outputs) {
    ag_node *n = ag_node_new(AG_OP_CUSTOM, nin, nout);
    if (!n) {
        if (cb->release) cb->release(ctx);
        return -1;
    }
    n->custom = cb;
    n->custom_ctx = ctx;
    for (int i = 0; i < nin; i++) {
        ag_tmeta_of(inputs[i], &n->in_meta[i]);
        if (ag_edge_of(inputs[i], &n->next[i])) goto fail;
    }
    for (int j = 0; j < nout; j++) {
        kl_tensor *o = outputs[j];
        ag_tmeta_of(o, &n->out_meta[j]);
        if (!ke_is_float((kl_dtype)o->dtype)) continue;
        ag_meta *m = ag_meta_ensure(o);
        if (!m) goto fail;
        KE_ASSERT(!m->grad_fn && !m->requires_grad);
        m->requires_grad = 1;
        m->grad_fn = n;
        m->output_nr = j;
        ag_node_incref(n);
        ag_sync_key(o);
    }
    ag_node_decref(n); /* the outputs hold it now */
    return 0;
fail:
    ag_node_decref(n);
    return -1;
}
