/*
 * meta.c — per-tensor autograd state and the public calls that read or set
 * it (requires_grad, grad, detach), grad mode, anomaly mode.
 *
 * Grad mode is the Autograd key in the thread's exclude set: with grad off
 * the dispatcher never reaches the recording handler, so no-grad code pays
 * nothing. begin/end calls push and pop the previous mode on a small
 * per-thread stack.
 */
#include "autograd.h"

#include <stdlib.h>

_Atomic int ag_anomaly;

ag_meta *ag_meta_get(const kl_tensor *t) { return (ag_meta *)t->autograd; }

ag_meta *ag_meta_ensure(kl_tensor *t) {
    if (t->autograd) return (ag_meta *)t->autograd;
    /* the first metadata of the process: the dispatcher must know the
     * Autograd handler, and tensors how to drop metadata, before any tensor
     * carries the Autograd key */
    kl_init();
    ag_meta *m = calloc(1, sizeof *m);
    if (!m) {
        ke_err(KL_ERR_OOM, "autograd", "out of memory allocating autograd metadata");
        return NULL;
    }
    t->autograd = m;
    return m;
}

void ag_sync_key(kl_tensor *t) {
    if (ag_requires(t))
        t->keys |= (uint8_t)KE_KS(KE_KEY_AUTOGRAD);
    else
        t->keys &= (uint8_t)~KE_KS(KE_KEY_AUTOGRAD);
}

void ag_meta_free(kl_tensor *t) {
    ag_meta *m = (ag_meta *)t->autograd;
    t->autograd = NULL;
    if (!m) return;
    if (m->grad_fn) {
        ag_node *n = m->grad_fn;
        if (m->retains_grad && n->retained) n->retained[m->output_nr] = NULL;
        ag_node_decref(n);
    }
    if (m->grad) ke_tensor_decref(m->grad);
    free(m);
}

/* ---- public: requires_grad, grad, detach ---------------------------------- */

int kl_set_requires_grad(kl_tensor *t, bool requires_grad) {
    if (ke_check_tensor(t, "set_requires_grad", 1)) return -1;
    ag_meta *m = ag_meta_get(t);
    char b[256];
    if (m && m->grad_fn) {
        if (requires_grad) return 0;
        return ke_err(KL_ERR_STATE, "set_requires_grad",
                      "%s is not a leaf (it was produced by kl_%s): only leaves can stop requiring grad; "
                      "use kl_detach",
                      ke_fmt_tensor(b, sizeof b, t), ke_ops[m->grad_fn->op].name);
    }
    if (requires_grad && !ke_is_float((kl_dtype)t->dtype))
        return ke_err(KL_ERR_DTYPE, "set_requires_grad", "only floating tensors can require grad, got %s",
                      ke_fmt_tensor(b, sizeof b, t));
    if (requires_grad && (t->flags & KE_TF_WRAPPED))
        return ke_err(KL_ERR_ARG, "set_requires_grad", "a wrapped C scalar cannot require grad");
    if (!m && !requires_grad) return 0;
    if (!(m = ag_meta_ensure(t))) return -1;
    m->requires_grad = requires_grad;
    ag_sync_key(t);
    return 0;
}

bool kl_requires_grad(const kl_tensor *t) {
    if (ke_check_tensor(t, "requires_grad", 1)) return false;
    return ag_requires(t);
}

bool kl_is_leaf(const kl_tensor *t) {
    if (ke_check_tensor(t, "is_leaf", 1)) return false;
    const ag_meta *m = ag_meta_get(t);
    return !m || !m->grad_fn;
}

kl_tensor *kl_grad(const kl_tensor *t) {
    if (ke_check_tensor(t, "grad", 1)) return NULL;
    const ag_meta *m = ag_meta_get(t);
    return m ? m->grad : NULL;
}

int kl_set_grad(kl_tensor *t, kl_tensor *g) {
    if (ke_check_tensor(t, "set_grad", 1)) return -1;
    char b1[256], b2[256];
    if (g) {
        if (ke_check_tensor(g, "set_grad", 2)) return -1;
        /* backward accumulates into the gradient in place: the tensor itself
         * (PyTorch: "can't assign Variable as its own grad") or a view of it
         * would have its values overwritten */
        if (g->storage == t->storage)
            return ke_err(KL_ERR_ARG, "set_grad", "gradient %s %s tensor %s: a tensor cannot be its own gradient",
                          ke_fmt_tensor(b1, sizeof b1, g), g == t ? "is" : "shares storage with",
                          ke_fmt_tensor(b2, sizeof b2, t));
        kl_status code = g->dtype != t->dtype ? KL_ERR_DTYPE
                         : (ke_device_of(g).type != ke_device_of(t).type ||
                            ke_device_of(g).index != ke_device_of(t).index) ? KL_ERR_DEVICE
                         : (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * t->ndim)) ? KL_ERR_SHAPE
                                                                                                        : KL_OK;
        if (code != KL_OK)
            return ke_err(code, "set_grad", "gradient %s does not match tensor %s in %s",
                          ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, t),
                          code == KL_ERR_DTYPE ? "dtype" : code == KL_ERR_DEVICE ? "device" : "shape");
    }
    ag_meta *m = ag_meta_get(t);
    if (!m && !g) return 0;
    if (!m && !(m = ag_meta_ensure(t))) return -1;
    if (g) ke_tensor_incref(g);
    if (m->grad) ke_tensor_decref(m->grad);
    m->grad = g;
    return 0;
}

int kl_zero_grad(kl_tensor *t) { return kl_set_grad(t, NULL); }

int kl_retain_grad(kl_tensor *t) {
    if (ke_check_tensor(t, "retain_grad", 1)) return -1;
    ag_meta *m = ag_meta_get(t);
    char b[256];
    if (!m || !m->requires_grad)
        return ke_err(KL_ERR_STATE, "retain_grad", "%s does not require grad", ke_fmt_tensor(b, sizeof b, t));
    if (!m->grad_fn || m->retains_grad) return 0; /* leaves keep their grad anyway */
    ag_node *n = m->grad_fn;
    if (!n->retained) {
        n->retained = calloc((size_t)n->nout, sizeof *n->retained);
        if (!n->retained) return ke_err(KL_ERR_OOM, "retain_grad", "out of memory");
    }
    n->retained[m->output_nr] = t;
    m->retains_grad = 1;
    return 0;
}

kl_tensor *kl_detach(kl_tensor *t) {
    if (ke_check_tensor(t, "detach", 1)) return NULL;
    int prev = ag_set_grad_mode(0);
    kl_tensor *r = ke_unary(KE_OP_alias, t, 0);
    ag_set_grad_mode(prev);
    return r;
}

/* ---- grad mode ---------------------------------------------------------------- */

#define AG_MODE_STACK 64
static _Thread_local struct {
    int depth;
    uint64_t saved; /* bit i: grad mode before push i */
} mode_stack;

int ag_set_grad_mode(int enabled) {
    int prev = ag_grad_enabled();
    if (enabled)
        ke_tls_state.exclude &= ~KE_KS(KE_KEY_AUTOGRAD);
    else
        ke_tls_state.exclude |= KE_KS(KE_KEY_AUTOGRAD);
    return prev;
}

static void mode_push(int enabled, const char *who) {
    if (mode_stack.depth >= AG_MODE_STACK) {
        ke_err(KL_ERR_STATE, who, "grad mode nested deeper than %d", AG_MODE_STACK);
        return;
    }
    int prev = ag_set_grad_mode(enabled);
    if (prev)
        mode_stack.saved |= 1ull << mode_stack.depth;
    else
        mode_stack.saved &= ~(1ull << mode_stack.depth);
    mode_stack.depth++;
}

static void mode_pop(const char *who) {
    if (mode_stack.depth == 0) {
        ke_err(KL_ERR_STATE, who, "no matching begin on this thread");
        return;
    }
    mode_stack.depth--;
    ag_set_grad_mode((int)((mode_stack.saved >> mode_stack.depth) & 1));
}

void kl_no_grad_begin(void) { mode_push(0, "no_grad_begin"); }
void kl_no_grad_end(void) { mode_pop("no_grad_end"); }
void kl_enable_grad_begin(void) { mode_push(1, "enable_grad_begin"); }
void kl_enable_grad_end(void) { mode_pop("enable_grad_end"); }
bool kl_is_grad_enabled(void) { return ag_grad_enabled(); }

/* ---- anomaly mode ----------------------------------------------------------- */

/* Both call kl_init first, so $KL_ANOMALY (read there) never overrides a
 * choice made in code. */
void kl_set_anomaly(bool on) {
    kl_init();
    atomic_store(&ag_anomaly, on ? 1 : 0);
}
bool kl_anomaly_enabled(void) {
    kl_init();
    return atomic_load(&ag_anomaly) != 0;
}

void ag_anomaly_from_env(void) {
    const char *e = getenv("KL_ANOMALY");
    if (e && *e && strcmp(e, "0") != 0) atomic_store(&ag_anomaly, 1); /* not kl_set_anomaly: this runs inside kl_init */
}
