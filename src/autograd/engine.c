/*
 * engine.c — the backward pass: kl_backward and kl_autograd_grad.
 *
 * One pass: find every node reachable from the roots (iterative DFS, so deep
 * graphs do not overflow the stack), count each node's incoming edges, then
 * run nodes whose gradients are complete, newest first (a max-heap on the
 * creation sequence, as PyTorch orders its ready queue: it frees the most
 * recent activations first). A node's formula runs in its own scope; the
 * gradients it passes on are held by the receiving node's buffer until that
 * node runs. Without retain_graph a node's saved tensors are freed right after
 * it runs, so memory falls as the pass goes.
 *
 * kl_autograd_grad runs only the nodes on a path to a requested input and
 * captures the gradient arriving there instead of accumulating into grad.
 *
 * Node scratch fields (run, deps, needed, buf) belong to the pass holding the
 * engine lock: one backward pass at a time in the process.
 */
#include "autograd.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t run_counter;

typedef struct pass {
    int64_t id;
    int create_graph, retain_graph, capture, allow_unused;
    const char *who;
    kl_tensor *const *inputs;
    ag_node **nodes; /* post-order: children before parents */
    int n, cap;
    ag_node **heap;  /* ready nodes, max-heap on seq */
    int nh;
    /* capture mode: per requested input, the node and slot to read */
    int n_in;
    ag_edge *targets;
    kl_tensor **captured;
} pass;

enum { NEED_TARGET = 1, NEED_RUN = 2 };

static int grow(void **p, int *cap, int want, size_t elem) {
    if (want <= *cap) return 0;
    int c = *cap ? *cap : 64;
    while (c < want) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return ke_err(KL_ERR_OOM, "backward", "out of memory");
    *p = q;
    *cap = c;
    return 0;
}

/* ---- discovery ------------------------------------------------------------------ */

static int visit_init(pass *ps, ag_node *n) {
    n->run = ps->id;
    n->deps = 0;
    n->needed = ps->capture ? 0 : NEED_RUN;
    n->buf = calloc((size_t)n->nout, sizeof *n->buf);
    if (!n->buf) return ke_err(KL_ERR_OOM, "backward", "out of memory");
    return 0;
}

/* Iterative post-order DFS from the roots into ps->nodes. */
static int discover(pass *ps, int nroots, const ag_edge *roots) {
    typedef struct { ag_node *n; int next; } frame;
    frame *st = NULL;
    int sn = 0, scap = 0, hcap = 0;
    for (int r = 0; r < nroots; r++) {
        ag_node *root = roots[r].fn;
        if (root->run == ps->id) continue;
        /* the slot first: a node whose buf is allocated is always on the
         * stack or in ps->nodes, where a failure frees it */
        if (grow((void **)&st, &scap, sn + 1, sizeof *st)) goto fail;
        if (visit_init(ps, root)) goto fail;
        st[sn++] = (frame){root, 0};
        while (sn > 0) {
            frame *f = &st[sn - 1];
            if (f->next < f->n->nin) {
                ag_node *c = f->n->next[f->next++].fn;
                if (!c || c->run == ps->id) continue;
                if (grow((void **)&st, &scap, sn + 1, sizeof *st)) goto fail;
                if (visit_init(ps, c)) goto fail;
                st[sn++] = (frame){c, 0};
                continue;
            }
            if (grow((void **)&ps->nodes, &ps->cap, ps->n + 1, sizeof *ps->nodes)) goto fail;
            ps->nodes[ps->n++] = f->n;
            sn--;
        }
    }
    free(st);
    /* One slot per node is the most the heap can hold. */
    if (grow((void **)&ps->heap, &hcap, ps->n + 1, sizeof *ps->heap)) return -1;
    return 0;
fail:
    /* nodes still on the stack are not in ps->nodes: pass_cleanup misses them
     * (their bufs leaked when an allocation failed mid-discovery: test_oom) */
    for (int i = 0; i < sn; i++) {
        free(st[i].n->buf);
        st[i].n->buf = NULL;
        st[i].n->run = 0;
    }
    free(st);
    return -1;
}

static int child_needed(const pass *ps, const ag_node *c) {
    return c && c->run == ps->id && c->needed != 0;
}

/* capture mode: a node runs if a child is needed; post-order makes one sweep enough. */
static void mark_needed(pass *ps) {
    if (!ps->capture) return;
    for (int i = 0; i < ps->n_in; i++)
        if (ps->targets[i].fn && ps->targets[i].fn->run == ps->id) ps->targets[i].fn->needed |= NEED_TARGET;
    for (int k = 0; k < ps->n; k++) {
        ag_node *n = ps->nodes[k];
        if (n->op == AG_OP_ACCUMULATE) continue; /* captured, never run */
        for (int i = 0; i < n->nin; i++)
            if (child_needed(ps, n->next[i].fn)) n->needed |= NEED_RUN;
    }
}

static void count_deps(pass *ps) {
    for (int k = 0; k < ps->n; k++) {
        ag_node *n = ps->nodes[k];
        if (!(n->needed & NEED_RUN)) continue;
        for (int i = 0; i < n->nin; i++)
            if (child_needed(ps, n->next[i].fn)) n->next[i].fn->deps++;
    }
}

/* ---- ready heap ---------------------------------------------------------------------- */

static void heap_push(pass *ps, ag_node *n) {
    int i = ps->nh++;
    ps->heap[i] = n;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (ps->heap[p]->seq >= ps->heap[i]->seq) break;
        ag_node *t = ps->heap[p];
        ps->heap[p] = ps->heap[i];
        ps->heap[i] = t;
        i = p;
    }
}

static ag_node *heap_pop(pass *ps) {
    ag_node *top = ps->heap[0];
    ps->heap[0] = ps->heap[--ps->nh];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < ps->nh && ps->heap[l]->seq > ps->heap[m]->seq) m = l;
        if (r < ps->nh && ps->heap[r]->seq > ps->heap[m]->seq) m = r;
        if (m == i) break;
        ag_node *t = ps->heap[m];
        ps->heap[m] = ps->heap[i];
        ps->heap[i] = t;
        i = m;
    }
    return top;
}

/* ---- gradients in flight --------------------------------------------------------------- */

/* Adds g into node n's buffer slot k (the buffer holds an internal reference). */
static int deliver(ag_node *n, int k, kl_tensor *g) {
    kl_tensor *old = n->buf[k];
    kl_tensor *v = old ? kl_add(old, g) : g;
    if (!v) return -1;
    ke_tensor_incref(v);
    n->buf[k] = v;
    if (old) ke_tensor_decref(old);
    return 0;
}

static int anomaly_check(const ag_node *n, int i, kl_tensor *g) {
    int prev = ag_set_grad_mode(0);
    double ok = kl_item(kl_all(kl_isfinite(g), KL_ALL_DIMS, false));
    ag_set_grad_mode(prev);
    if (ok == 1.0) return 0;
    if (isnan(ok)) return -1;
    char b[256], at[300] = "";
    if (n->loc.file) snprintf(at, sizeof at, ", called at %s:%d", n->loc.file, n->loc.line);
    return ke_err(KL_ERR_ARG, "backward",
                  "anomaly: the backward of kl_%s (forward op #%lld%s) produced NaN or Inf in the gradient of "
                  "its input %d (%s)",
                  n->op == AG_OP_CUSTOM ? n->custom->name : ke_ops[n->op].name, (long long)n->seq, at, i + 1,
                  ke_fmt_tensor(b, sizeof b, g));
}

/* grad += g for a leaf (or a non-leaf that retains its grad). */
static int accumulate(pass *ps, kl_tensor *t, kl_tensor *g) {
    ag_meta *m = ag_meta_get(t);
    if (!m) return ke_err(KL_ERR_INTERNAL, "backward", "accumulating into a tensor without metadata");
    kl_tensor *cur = m->grad, *v;
    if (ps->create_graph) {
        v = cur ? kl_add(cur, g) : g;
    } else if (!cur) {
        int prev = ag_set_grad_mode(0);
        v = kl_clone(g); /* g may alias a saved tensor or the caller's grad_output */
        ag_set_grad_mode(prev);
    } else if (ag_meta_get(cur) && ag_meta_get(cur)->grad_fn) {
        int prev = ag_set_grad_mode(0);
        v = kl_add(cur, g); /* a grad with history (an earlier create_graph pass) stays intact */
        ag_set_grad_mode(prev);
    } else {
        int prev = ag_set_grad_mode(0);
        v = kl_add_inplace(cur, g);
        ag_set_grad_mode(prev);
        return v ? 0 : -1;
    }
    if (!v) return -1;
    ke_tensor_incref(v);
    m->grad = v;
    if (cur) ke_tensor_decref(cur);
    return 0;
}

static void capture_at(pass *ps, ag_node *n) {
    if (!(n->needed & NEED_TARGET)) return;
    for (int i = 0; i < ps->n_in; i++) {
        if (ps->targets[i].fn != n) continue;
        kl_tensor *g = n->buf[ps->targets[i].output_nr];
        if (!g || ps->captured[i]) continue;
        ke_tensor_incref(g);
        ps->captured[i] = g;
    }
}

/* Runs one node's derivative and passes its input gradients on. */
static int run_node(pass *ps, ag_node *n) {
    if (n->retained && !ps->capture)
        for (int k = 0; k < n->nout; k++)
            if (n->retained[k] && n->buf[k] && accumulate(ps, n->retained[k], n->buf[k])) return -1;
    if (n->op == AG_OP_ACCUMULATE) return n->buf[0] ? accumulate(ps, n->leaf, n->buf[0]) : 0;
    static const ag_deriv custom_deriv = {0};
    const ag_deriv *d = n->op == AG_OP_CUSTOM ? &custom_deriv : &ag_derivs[n->op];
    KE_ASSERT(d->fn != NULL || n->op == AG_OP_CUSTOM);
    /* One block for the per-input arrays (variadic ops have many inputs). */
    size_t nin = (size_t)n->nin;
    void *blk = calloc(1, nin * (2 * sizeof(kl_tensor *) + 1) + 1);
    if (!blk) return ke_err(KL_ERR_OOM, "backward", "out of memory");
    kl_tensor **ins = blk, **gin = ins + nin;
    uint8_t *need = (uint8_t *)(gin + nin);
    kl_tensor *gout[KE_MAX_OUT] = {0}, *outs[KE_MAX_OUT] = {0};
    int rc = -1, any = 0;
    for (int i = 0; i < n->nin; i++) any |= need[i] = (uint8_t)child_needed(ps, n->next[i].fn);
    if (!any) {
        rc = 0;
        goto out;
    }
    for (int k = 0; k < n->nout; k++) {
        gout[k] = n->buf[k];
        if (!gout[k] && ke_is_float((kl_dtype)n->out_meta[k].dtype) && !(gout[k] = ag_zeros(&n->out_meta[k])))
            goto out;
    }
    for (int i = 0; i < n->nin; i++)
        if ((d->save & AG_IN(i)) && !(ins[i] = ag_saved_unpack(n, &n->saved_in[i], i, ps->create_graph)))
            goto out;
    for (int k = 0; k < n->nout; k++)
        if ((d->save & AG_OUT(k)) && !(outs[k] = ag_saved_unpack(n, &n->saved_out[k], k, ps->create_graph)))
            goto out;
    if (n->op == AG_OP_CUSTOM) {
        if (n->released) {
            ke_err(KL_ERR_STATE, "backward",
                   "trying to backward through the node of %s a second time: its saved tensors were freed by "
                   "the first backward (pass retain_graph to keep them)",
                   n->custom->name);
            goto out;
        }
        if (n->custom->backward(n->custom_ctx, ps->create_graph, n->nout, gout, n->nin, need, gin)) {
            if (!ke_error_pending())
                ke_err(KL_ERR_INTERNAL, "backward", "the backward of %s failed without an error", n->custom->name);
            goto out;
        }
        goto deliver_grads;
    }
    ag_ctx c = {
        .op = n->op, .inplace = n->inplace, .a = &n->a, .nin = n->nin, .nout = n->nout,
        .in_meta = n->in_meta, .out_meta = n->out_meta, .in = ins, .out = outs, .gout = gout,
        .need = need, .gin = gin,
    };
    atomic_fetch_add_explicit(&ag_stat_backward[n->op], 1, memory_order_relaxed);
    if (ps->create_graph) atomic_fetch_add_explicit(&ag_stat_double[n->op], 1, memory_order_relaxed);
    if (d->fn(&c)) {
        if (!ke_error_pending())
            ke_err(KL_ERR_INTERNAL, "backward", "the derivative of kl_%s failed without an error", ke_ops[n->op].name);
        goto out;
    }
deliver_grads:
    for (int i = 0; i < n->nin; i++) {
        kl_tensor *g = gin[i];
        if (!need[i] || !g) continue;
        const ag_tmeta *m = &n->in_meta[i];
        if (!(g = ag_sum_to(g, m->ndim, m->shape))) goto out;
        if (g->dtype != m->dtype && !(g = kl_to_dtype(g, (kl_dtype)m->dtype))) goto out;
        /* copy may cross devices (kl_to_device): the gradient goes back to the source's */
        kl_device gd = ke_device_of(g); /* while tracing, its real device, as m->device */
        if ((gd.type != m->device.type || gd.index != m->device.index) && !(g = kl_to_device(g, m->device))) goto out;
        if (atomic_load_explicit(&ag_anomaly, memory_order_relaxed) && anomaly_check(n, i, g)) goto out;
        if (deliver(n->next[i].fn, n->next[i].output_nr, g)) goto out;
    }
    rc = 0;
out:
    free(blk);
    return rc;
}

static void pass_cleanup(pass *ps) {
    for (int k = 0; k < ps->n; k++) {
        ag_node *n = ps->nodes[k];
        if (n->buf) {
            for (int j = 0; j < n->nout; j++)
                if (n->buf[j]) ke_tensor_decref(n->buf[j]);
            free(n->buf);
            n->buf = NULL;
        }
        n->run = 0;
    }
    free(ps->nodes);
    free(ps->heap);
}

/* The pass over roots (edges with gradients already checked). */
static int execute(pass *ps, int nroots, const ag_edge *roots, kl_tensor *const *root_grads) {
    if (discover(ps, nroots, roots)) return -1;
    /* An unreachable input is an error before anything runs (and frees). */
    for (int i = 0; ps->capture && !ps->allow_unused && i < ps->n_in; i++)
        if (!ps->targets[i].fn || ps->targets[i].fn->run != ps->id) {
            char b[256];
            return ke_err(KL_ERR_STATE, ps->who,
                          "input %d (%s) was not used to compute the outputs (pass allow_unused to get NULL)",
                          i + 1, ke_fmt_tensor(b, sizeof b, ps->inputs[i]));
        }
    mark_needed(ps);
    count_deps(ps);
    for (int r = 0; r < nroots; r++)
        if (deliver(roots[r].fn, roots[r].output_nr, root_grads[r])) return -1;
    for (int r = 0; r < nroots; r++) {
        ag_node *n = roots[r].fn;
        if (n->deps == 0 && n->needed) {
            n->deps = -1; /* queued */
            heap_push(ps, n);
        }
    }
    while (ps->nh > 0) {
        ag_node *n = heap_pop(ps);
        if (ps->capture) capture_at(ps, n);
        if (n->needed & NEED_RUN) {
            kl_scope_begin();
            int rc = run_node(ps, n);
            kl_scope_end();
            if (rc) return -1;
            for (int i = 0; i < n->nin; i++) {
                ag_node *c = n->next[i].fn;
                if (child_needed(ps, c) && --c->deps == 0) heap_push(ps, c);
            }
        }
        for (int j = 0; j < n->nout; j++)
            if (n->buf[j]) {
                ke_tensor_decref(n->buf[j]);
                n->buf[j] = NULL;
            }
        if (!ps->retain_graph && n->op != AG_OP_ACCUMULATE && (n->needed & NEED_RUN)) ag_saved_release(n);
    }
    /* Reached, but every path contributed zero: the gradient is zeros. */
    for (int i = 0; ps->capture && i < ps->n_in; i++)
        if (!ps->captured[i] && ps->targets[i].fn && ps->targets[i].fn->run == ps->id) {
            ag_tmeta m;
            ag_tmeta_of(ps->inputs[i], &m);
            kl_tensor *z = ag_zeros(&m);
            if (!z) return -1;
            ke_tensor_incref(z);
            ps->captured[i] = z;
        }
    return 0;
}

/* Validates outputs and their gradients; fills roots and root_grads (scope-owned). */
static int prepare_roots(const char *who, int n_out, kl_tensor *const *outputs, kl_tensor *const *grad_outputs,
                         ag_edge *roots, kl_tensor **root_grads) {
    char b1[256], b2[256];
    for (int r = 0; r < n_out; r++) {
        kl_tensor *o = outputs[r];
        if (ke_check_tensor(o, who, r + 1)) return -1;
        const ag_meta *om = ag_meta_get(o);
        if (om && om->nondiff_op)
            return ke_err(KL_ERR_STATE, who, "output %d (%s) is the result of kl_%s, which is not differentiable",
                          r + 1, ke_fmt_tensor(b1, sizeof b1, o), ke_ops[om->nondiff_op - 1].name);
        if (!ag_requires(o))
            return ke_err(KL_ERR_STATE, who,
                          "output %d (%s) does not require grad: no input of its computation requires grad, "
                          "or it was computed in no-grad mode",
                          r + 1, ke_fmt_tensor(b1, sizeof b1, o));
        kl_tensor *g = grad_outputs ? grad_outputs[r] : NULL;
        if (!g) {
            if (ke_numel(o->ndim, o->shape) != 1)
                return ke_err(KL_ERR_SHAPE, who,
                              "output %d (%s) has more than one element: pass its gradient explicitly", r + 1,
                              ke_fmt_tensor(b1, sizeof b1, o));
            ag_tmeta m;
            ag_tmeta_of(o, &m);
            if (!(g = ag_zeros(&m)) || !kl_fill_inplace(g, 1.0)) return -1;
        } else {
            if (ke_check_tensor(g, who, n_out + r + 1)) return -1;
            if (g->ndim != o->ndim || memcmp(g->shape, o->shape, sizeof(int64_t) * o->ndim) ||
                ke_device_of(g).type != ke_device_of(o).type)
                return ke_err(KL_ERR_SHAPE, who, "gradient %s does not match output %d (%s)",
                              ke_fmt_tensor(b1, sizeof b1, g), r + 1, ke_fmt_tensor(b2, sizeof b2, o));
            if (!ke_is_float((kl_dtype)g->dtype))
                return ke_err(KL_ERR_DTYPE, who, "gradient %s is not floating", ke_fmt_tensor(b1, sizeof b1, g));
            if (g->dtype != o->dtype && !(g = kl_to_dtype(g, (kl_dtype)o->dtype))) return -1;
        }
        root_grads[r] = g;
        if (ag_edge_of(o, &roots[r])) return -1;
    }
    return 0;
}

static int backward_common(const char *who, int n_out, kl_tensor *const *outputs, kl_tensor *const *grad_outputs,
                           int n_in, kl_tensor *const *inputs, kl_tensor **grads, const kl_backward_options *opts) {
    kl_backward_options o = opts ? *opts : kl_backward_options_default();
    if (n_out < 1 || !outputs) return ke_err(KL_ERR_ARG, who, "no outputs given");
    if (n_in < 0 || (n_in > 0 && (!inputs || !grads))) return ke_err(KL_ERR_NULL_ARG, who, "inputs or grads is NULL");
    for (int i = 0; i < n_in; i++) grads[i] = NULL;
    if (ke_check_backward(who, n_in == 0, o.create_graph, n_in, inputs)) return -1;
    ag_edge *roots = calloc((size_t)n_out, sizeof *roots);
    kl_tensor **root_grads = calloc((size_t)n_out, sizeof *root_grads);
    ag_edge *targets = n_in ? calloc((size_t)n_in, sizeof *targets) : NULL;
    kl_tensor **captured = n_in ? calloc((size_t)n_in, sizeof *captured) : NULL;
    int rc = -1;
    if (!roots || !root_grads || (n_in && (!targets || !captured))) {
        ke_err(KL_ERR_OOM, who, "out of memory");
        goto out_free;
    }
    int prev_mode = ag_set_grad_mode(0);
    kl_scope_begin();
    if (prepare_roots(who, n_out, outputs, grad_outputs, roots, root_grads)) goto out_scope;
    for (int i = 0; i < n_in; i++) {
        char b[256];
        if (ke_check_tensor(inputs[i], who, n_out + i + 1)) goto out_scope;
        if (!ag_requires(inputs[i])) {
            ke_err(KL_ERR_STATE, who, "input %d (%s) does not require grad", i + 1,
                   ke_fmt_tensor(b, sizeof b, inputs[i]));
            goto out_scope;
        }
        ag_meta *m = ag_meta_get(inputs[i]);
        targets[i] = m->grad_fn ? (ag_edge){m->grad_fn, m->output_nr} : (ag_edge){m->acc, 0};
    }
    ag_set_grad_mode(o.create_graph);
    pthread_mutex_lock(&engine_lock);
    pass ps = {.id = ++run_counter, .create_graph = o.create_graph, .retain_graph = o.retain_graph || o.create_graph,
               .capture = n_in > 0, .allow_unused = o.allow_unused, .who = who, .inputs = inputs, .n_in = n_in,
               .targets = targets, .captured = captured};
    rc = execute(&ps, n_out, roots, root_grads);
    pass_cleanup(&ps);
    pthread_mutex_unlock(&engine_lock);
out_scope:
    for (int r = 0; r < n_out; r++)
        if (roots[r].fn) ag_node_decref(roots[r].fn);
    kl_scope_end();
    /* Captured gradients reach the caller's scope as aliases (recorded under
     * create_graph, so their history stays). */
    ag_set_grad_mode(o.create_graph);
    for (int i = 0; i < n_in; i++) {
        kl_tensor *g = captured[i];
        if (rc == 0 && g) {
            grads[i] = ke_unary(KE_OP_alias, g, 0);
            if (!grads[i]) rc = -1;
        } else if (rc == 0 && !o.allow_unused) {
            char b[256];
            rc = ke_err(KL_ERR_STATE, who,
                        "input %d (%s) was not used to compute the outputs (pass allow_unused to get NULL)",
                        i + 1, ke_fmt_tensor(b, sizeof b, inputs[i]));
        }
        if (g) ke_tensor_decref(g);
    }
    if (rc)
        for (int i = 0; i < n_in; i++)
            if (grads[i]) {
                kl_release(grads[i]);
                grads[i] = NULL;
            }
    ag_set_grad_mode(prev_mode);
out_free:
    free(roots);
    free(root_grads);
    free(targets);
    free(captured);
    return rc;
}

kl_backward_options kl_backward_options_default(void) {
    return (kl_backward_options){.retain_graph = false, .create_graph = false, .allow_unused = false};
}

int kl_backward(kl_tensor *out, kl_tensor *grad_output, const kl_backward_options *opts) {
    if (ke_check_tensor(out, "backward", 1)) return -1;
    kl_tensor *const gos[1] = {grad_output};
    return backward_common("backward", 1, &out, grad_output ? gos : NULL, 0, NULL, NULL, opts);
}

int kl_autograd_grad(int n_out, kl_tensor *const *outputs, kl_tensor *const *grad_outputs, int n_in,
                     kl_tensor *const *inputs, kl_tensor **grads, const kl_backward_options *opts) {
    if (n_in < 1) return ke_err(KL_ERR_ARG, "autograd_grad", "no inputs given");
    return backward_common("autograd_grad", n_out, outputs, grad_outputs, n_in, inputs, grads, opts);
}
