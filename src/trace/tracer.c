/*
 * tracer.c — the Trace dispatch key: while a function is traced, every op it
 * calls reaches this handler (the key is in the thread's include set), which
 * runs the op on meta tensors (shapes and dtypes only) and records it as a
 * graph node. Each traced tensor carries its value id in trace_id.
 *
 * What fn touches besides its inputs:
 *  - a wrapped C scalar (kl_add_scalar's 2) becomes a scalar constant;
 *  - any other real tensor is captured: the graph holds a reference and reads
 *    its data at every call (never a baked copy), and writes to it in place;
 *  - an accessor that needs data (kl_item, kl_data_ptr, printing values,
 *    comparisons) breaks the trace: the eager layer calls our data hook,
 *    which records why; the caller then runs that signature eagerly.
 */
#include "trace.h"

#include "autograd.h"
#include "log.h"
#include "philox.h"

#include <stdlib.h>

typedef struct tr_session {
    ir_graph *g;
    kl_device target;            /* the device creation ops mean (the default before tracing) */
    int broke;
    char why[256];
    /* the first captured tensor requiring grad an op read in grad mode */
    const kl_tensor *grad_cap;
    /* real tensors already captured: pointer -> current value id */
    kl_tensor **cap_t;
    int32_t *cap_id;
    int ncap, capcap;
    /* random reservations made while tracing (seed, offset), by slot */
    ke_generator gen0;           /* the generator when tracing began */
    ke_generator *rsv;
    int nrsv, rsvcap;
    /* the storage of every recorded output, with its value id */
    ke_storage **ost;
    int32_t *oid;
    int nost, ostcap;
    /* real tensors traced as inputs (tr_subst): the stand-ins of inputs
     * [subst->first, subst->first + subst->n) */
    const tr_subst *subst;
    kl_tensor **meta_in;
} tr_session;

static _Thread_local tr_session *cur;

kl_device tr_device_hook(const kl_tensor *t) {
    tr_session *s = cur;
    if (s && t->trace_id >= 0 && t->trace_id < s->g->nvalues) return s->g->values[t->trace_id].device;
    return t->storage->device;
}

int tr_data_hook(const kl_tensor *t, const char *op) {
    tr_session *s = cur;
    if (s && !s->broke) {
        s->broke = 1;
        if (t->trace_id >= 0)
            snprintf(s->why, sizeof s->why, "kl_%s needs the data of traced value %%%lld", op, (long long)t->trace_id);
        else
            snprintf(s->why, sizeof s->why, "kl_%s reads a tensor's data while tracing (it would be baked in)", op);
    }
    return ke_err(KL_ERR_UNSUPPORTED, op, "needs tensor data, which a traced function does not have");
}

/* A captured tensor is a constant of the graph (IR_OP_CAPTURED), without the
 * autograd history eager gives it: the trace's stand-in does not require
 * grad, so a loss computed from it has no path to it. Eagerly, kl_backward
 * accumulates into its .grad; the graph cannot, so that breaks the trace. */
int tr_backward_hook(const char *op, int accumulate, int create_graph, int n_in, kl_tensor *const *inputs) {
    tr_session *s = cur;
    if (!s) return 0;
    if (!s->broke) {
        char b[128];
        for (int i = 0; i < n_in && !s->broke; i++)
            if (inputs[i] && inputs[i]->trace_id < 0 && inputs[i]->storage->device.type != KL_META) {
                s->broke = 1;
                snprintf(s->why, sizeof s->why,
                         "kl_%s with respect to a captured tensor (input %d, %s), which the graph holds as a constant",
                         op, i + 1, ke_fmt_tensor(b, sizeof b, inputs[i]));
            }
        if (!s->broke && s->grad_cap && (accumulate || create_graph)) {
            s->broke = 1;
            snprintf(s->why, sizeof s->why,
                     "kl_%s%s over a captured tensor requiring grad (%s), which the graph holds as a constant",
                     op, accumulate ? "" : " with create_graph", ke_fmt_tensor(b, sizeof b, s->grad_cap));
        }
        if (!s->broke) return 0;
    }
    return ke_err(KL_ERR_UNSUPPORTED, op, "cannot be traced here: %s", s->why);
}

/* A meta tensor shaped like t, standing for value id. Scope-owned. */
static kl_tensor *stand_in(const kl_tensor *t, int32_t id) {
    ke_storage *st = ke_storage_new(0, KL_DEVICE_META, "compile");
    if (!st) return NULL;
    kl_tensor *m = ke_tensor_wrap(st, (kl_dtype)t->dtype, t->ndim, t->shape, t->stride, 0);
    ke_storage_decref(st);
    if (!m) return NULL;
    m->trace_id = id;
    ke_scope_adopt(m);
    return m;
}

static int32_t captured_id(tr_session *s, kl_tensor *t, kl_tensor **meta) {
    for (int i = 0; i < s->ncap; i++)
        if (s->cap_t[i] == t) return *meta = stand_in(t, s->cap_id[i]), *meta ? s->cap_id[i] : -1;
    if (s->ncap == s->capcap) {
        int c = s->capcap ? 2 * s->capcap : 8;
        kl_tensor **a = realloc(s->cap_t, sizeof *a * (size_t)c);
        if (!a) return ke_err(KL_ERR_OOM, "compile", "out of memory");
        s->cap_t = a;
        int32_t *b = realloc(s->cap_id, sizeof *b * (size_t)c);
        if (!b) return ke_err(KL_ERR_OOM, "compile", "out of memory");
        s->cap_id = b;
        s->capcap = c;
    }
    int32_t id = ir_add_captured(s->g, t);
    if (id < 0) return -1;
    ke_log(KE_LOG_TRACE, "captured %s tensor (not an input): read at every call", ke_dtypes[t->dtype].name);
    s->cap_t[s->ncap] = t;
    s->cap_id[s->ncap++] = id;
    *meta = stand_in(t, id);
    return *meta ? id : -1;
}

/* A random node's reservation made during this trace (the generator's seed,
 * at or past its offset when tracing began) becomes a slot the executor
 * reserves afresh at each call; two nodes with the same reservation share
 * it. Any other reservation was made before tracing and stays fixed. */
static int random_slot(tr_session *s, ke_attrs *a, const ir_value *out) {
    uint64_t seed = (uint64_t)ke_attr_seed(a), off = (uint64_t)ke_attr_offset(a);
    if (seed != s->gen0.seed || off < s->gen0.offset) return 0;
    /* an empty draw reserves nothing, so the next draw starts at the same
     * offset: it is never the same reservation */
    if (ke_numel(out->ndim, out->shape) == 0) off = UINT64_MAX; /* matches no reservation */
    int slot = 0;
    while (slot < s->nrsv && (s->rsv[slot].seed != seed || s->rsv[slot].offset != off)) slot++;
    if (slot == s->nrsv) {
        if (s->nrsv == s->rsvcap) {
            int cap = s->rsvcap ? 2 * s->rsvcap : 8;
            ke_generator *r = realloc(s->rsv, sizeof *r * (size_t)cap);
            if (!r) return ke_err(KL_ERR_OOM, "compile", "out of memory");
            s->rsv = r;
            s->rsvcap = cap;
        }
        s->rsv[s->nrsv++] = (ke_generator){seed, off};
    }
    ke_attr_set_seed(a, slot);
    ke_attr_set_offset(a, IR_RANDOM_SLOT);
    return 0;
}

static int note_output(tr_session *s, kl_tensor *t) {
    if (s->nost == s->ostcap) {
        int cap = s->ostcap ? 2 * s->ostcap : 64;
        ke_storage **a = realloc(s->ost, sizeof *a * (size_t)cap);
        if (!a) return ke_err(KL_ERR_OOM, "compile", "out of memory");
        s->ost = a;
        int32_t *b = realloc(s->oid, sizeof *b * (size_t)cap);
        if (!b) return ke_err(KL_ERR_OOM, "compile", "out of memory");
        s->oid = b;
        s->ostcap = cap;
    }
    s->ost[s->nost] = t->storage;
    s->oid[s->nost++] = (int32_t)t->trace_id;
    return 0;
}

/* A meta tensor without a value id: an alias autograd made of a recorded
 * output while the op ran (the output got its id only afterwards), which it
 * hands back to a derivative. It is that value if it has its geometry; any
 * other meta tensor did not come from this trace. */
static int32_t alias_id(const tr_session *s, kl_tensor *t, const char *op) {
    for (int i = s->nost - 1; i >= 0; i--) {
        if (s->ost[i] != t->storage) continue;
        const ir_value *v = &s->g->values[s->oid[i]];
        if (v->ndim == t->ndim && v->offset == t->offset && !memcmp(v->shape, t->shape, sizeof(int64_t) * t->ndim) &&
            !memcmp(v->stride, t->stride, sizeof(int64_t) * t->ndim)) {
            t->trace_id = s->oid[i];
            return s->oid[i];
        }
    }
    char b[128];
    return ke_err(KL_ERR_ARG, op, "got %s, a meta tensor that is not a value of the function being traced",
                  ke_fmt_tensor(b, sizeof b, t));
}

static int subst_of(const tr_session *s, const kl_tensor *t) {
    if (!s->subst) return -1;
    for (int k = 0; k < s->subst->n; k++)
        if (s->subst->real[k] == t) return k;
    return -1;
}

int32_t tr_trace_nnodes(void) {
    return cur ? cur->g->nnodes : -1;
}

/* 1 if value v shares the storage of a graph input or a captured tensor. */
static int as_strided_over_caller_storage(const tr_session *s, int32_t v) {
    const ir_value *b = &s->g->values[s->g->values[v].base];
    return b->kind == IR_VAL_INPUT || (b->kind == IR_VAL_NODE && s->g->nodes[b->node].op == IR_OP_CAPTURED);
}

int tr_trace_handler(ke_call *c) {
    tr_session *s = cur;
    if (!s) return ke_err(KL_ERR_INTERNAL, ke_opname(c), "trace key without a trace session");
    /* A composite that autograd differentiates through its decomposition
     * records the pieces, and their backward reads the pieces' values. Were
     * the op recorded whole here, the pieces would run below this key and
     * those values would be missing from the graph: trace the pieces instead
     * (each is then recorded by both layers), as for an implicit composite. */
    if (ke_ops[c->op].decomp && ag_records_pieces(c)) return ke_ops[c->op].decomp(c);
    int nin = c->nin, rc = -1;
    int32_t *ids = malloc(sizeof *ids * (size_t)(nin + 1));
    kl_tensor **sub = malloc(sizeof *sub * (size_t)(nin + 1));
    kl_tensor *real0 = nin ? c->in[0] : NULL;
    if (!ids || !sub) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    for (int i = 0; i < nin; i++) {
        kl_tensor *t = c->in[i];
        sub[i] = t;
        if (t->trace_id >= 0) {
            ids[i] = (int32_t)t->trace_id;
        } else if (t->flags & KE_TF_WRAPPED) {
            double v = ke_load_f64(ke_data(t), (kl_dtype)t->dtype, 0);
            if ((ids[i] = ir_add_scalar(s->g, v, (kl_dtype)t->dtype, 1, KL_DEVICE_CPU)) < 0) goto out;
        } else if (t->storage->device.type == KL_META) {
            if ((ids[i] = alias_id(s, t, ke_opname(c))) < 0) goto out;
        } else if (subst_of(s, t) >= 0) {
            int k = s->subst->first + subst_of(s, t);
            sub[i] = s->meta_in[k];
            ids[i] = (int32_t)sub[i]->trace_id;
        } else if ((ids[i] = captured_id(s, t, &sub[i])) < 0) {
            goto out;
        } else if (!s->grad_cap && (t->keys & KE_KS(KE_KEY_AUTOGRAD)) && kl_is_grad_enabled()) {
            s->grad_cap = t;
        }
    }
    if (c->op == KE_OP_as_strided && as_strided_over_caller_storage(s, ids[0])) {
        /* kl_as_strided addresses its input's whole storage (the offset counts
         * from its start; the bounds are its size). For a function input or a
         * captured tensor that storage is the caller's: its size and the
         * input's offset vary from call to call and no guard covers them, and
         * the stand-in has none (every non-empty view was refused, issue 17's
         * fuzz_ops). Run this signature eagerly instead. Over a storage the
         * graph made, as_strided traces like any view. */
        if (!s->broke)
            snprintf(s->why, sizeof s->why, "kl_as_strided over the storage of %s (value %%%d), which the caller owns",
                     s->g->values[s->g->values[ids[0]].base].kind == IR_VAL_INPUT ? "an input" : "a captured tensor",
                     (int)ids[0]);
        s->broke = 1;
        ke_err(KL_ERR_UNSUPPORTED, ke_opname(c), "cannot be traced here: %s", s->why);
        goto out;
    }
    ke_call sc = *c;
    sc.in = sub;
    /* Below this key the op runs on meta: a creation op asked for a real
     * device (kl_empty_on(t, cuda), a derivative's zeros on its input's
     * device) and a move to one make meta tensors; the node keeps the
     * real device (below) and the call's attributes. */
    kl_device asked = c->device;
    if (nin == 0 && asked.type != KL_META) sc.device = KL_DEVICE_META;
    if (c->op == KE_OP_to_device) ke_attr_set_to_device_device(&sc.a, KL_META), ke_attr_set_to_device_index(&sc.a, 0);
    /* Composite ops are recorded whole (a pass decomposes them later): their
     * pieces must not be recorded again while the op runs on meta. */
    ke_keyset saved = ke_tls_state.exclude;
    ke_tls_state.exclude |= KE_KS(KE_KEY_TRACE);
    int r = ke_redispatch(&sc, KE_KEY_TRACE);
    ke_tls_state.exclude = saved;
    if (r) goto out;
    /* The real device: the first tensor input's (wrapped scalars follow), or
     * the default device for creation ops. */
    kl_device dev = nin == 0 && asked.type != KL_META ? asked : s->target;
    for (int i = nin - 1; i >= 0; i--)
        if (!s->g->values[ids[i]].wrapped) dev = s->g->values[ids[i]].device;
    /* kl_to_device's result lives where it was sent (a class index table
     * made on the CPU and sent to the labels' device, as cross_entropy's
     * derivative does) */
    if (c->op == KE_OP_to_device)
        dev = (kl_device){ke_attr_to_device_device(&c->a), (int)ke_attr_to_device_index(&c->a)};
    /* The compute dtype the shape rule chose, kept for lowering (which would
     * otherwise run the rule again): only elementwise ops and reductions are
     * fused, and their rule always runs, on meta too. */
    int kind = ke_ops[c->op].kind;
    int compute = kind == KE_KIND_EW || kind == KE_KIND_REDUCE ? (int)sc.compute : -1;
    int32_t k = ir_add_node(s->g, c->op, c->inplace, nin, ids, sc.nout, sc.out, &c->a, dev, compute);
    if (k >= 0) s->g->nodes[k].loc = ke_loc_now();
    if (k < 0 || ((ke_ops[c->op].flags & KE_F_RANDOM) && random_slot(s, &s->g->nodes[k].a, &s->g->values[s->g->nodes[k].out[0]]))) goto out;
    c->nout = sc.nout;
    for (int j = 0; j < sc.nout; j++) {
        c->out[j] = sc.out[j];
        c->out[j]->trace_id = s->g->nodes[k].out[j];
        if (note_output(s, c->out[j])) goto out;
    }
    if (c->inplace && real0 && real0->trace_id < 0 && !(real0->flags & KE_TF_WRAPPED))
        for (int i = 0; i < s->ncap; i++)
            if (s->cap_t[i] == real0) s->cap_id[i] = s->g->nodes[k].out[0];
    rc = 0;
out:
    free(ids);
    free(sub);
    return rc;
}

ir_graph *tr_trace(kl_traceable fn, void *user, kl_tensor *const *inputs, int n_in, int n_out, int *broke,
                   char *why, size_t why_cap) {
    return tr_trace_ex(fn, user, inputs, n_in, n_out, NULL, broke, why, why_cap);
}

ir_graph *tr_trace_ex(kl_traceable fn, void *user, kl_tensor *const *inputs, int n_in, int n_out,
                      const tr_subst *subst, int *broke, char *why, size_t why_cap) {
    *broke = 0;
    kl_init(); /* the Trace key's handler and the data hook */
    tr_session s = {.target = ke_tls_state.default_device, .subst = subst};
    if (!(s.g = ir_graph_new())) return NULL;
    kl_tensor **meta_in = calloc((size_t)n_in + 1, sizeof *meta_in);
    kl_tensor **outs = calloc((size_t)n_out + 1, sizeof *outs);
    if (!meta_in || !outs) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        free(meta_in);
        free(outs);
        ir_graph_free(s.g);
        return NULL;
    }
    tr_session *prev = cur;
    cur = &s;
    ke_keyset inc = ke_tls_state.include;
    kl_device dev = ke_tls_state.default_device;
    ke_generator gen = ke_generator_get_state(ke_default_generator());
    s.gen0 = gen;
    kl_scope_begin();
    s.meta_in = meta_in;
    int rc = 0;
    for (int i = 0; i < n_in && !rc; i++) {
        int32_t id = ir_add_input(s.g, inputs[i]);
        rc = id < 0 || !(meta_in[i] = stand_in(inputs[i], id));
    }
    if (!rc) {
        ke_tls_state.include |= KE_KS(KE_KEY_TRACE);
        ke_tls_state.default_device = KL_DEVICE_META;
        rc = fn(user, meta_in, n_in, outs, n_out);
        ke_tls_state.include = inc;
        ke_tls_state.default_device = dev;
        if (!s.broke && !rc && ke_error_pending()) rc = -1; /* fn ignored an error */
    }
    int32_t *ids = NULL;
    if (!rc && !s.broke) {
        ids = calloc((size_t)n_out + 1, sizeof *ids);
        if (!ids) rc = ke_err(KL_ERR_OOM, "compile", "out of memory");
        for (int j = 0; j < n_out && !rc; j++) {
            kl_tensor *o = outs[j];
            kl_tensor *m = NULL;
            if (!o) rc = ke_err(KL_ERR_NULL_ARG, "fn_call", "the traced function left output %d NULL", j + 1);
            else if (o->trace_id >= 0) ids[j] = (int32_t)o->trace_id;
            else if ((ids[j] = captured_id(&s, o, &m)) < 0) rc = -1;
        }
        if (!rc) rc = ir_set_outputs(s.g, n_out, ids);
        if (!rc) rc = ir_verify(s.g, "tracing");
    }
    kl_scope_end();
    ke_generator_set_state(ke_default_generator(), gen);
    cur = prev;
    free(ids);
    free(meta_in);
    free(outs);
    free(s.cap_t);
    free(s.cap_id);
    free(s.rsv);
    free(s.ost);
    free(s.oid);
    if (s.broke) {
        *broke = 1;
        snprintf(why, why_cap, "%s", s.why);
        kl_clear_error();
        ir_graph_free(s.g);
        return NULL;
    }
    if (rc) {
        if (!ke_error_pending()) ke_err(KL_ERR_INTERNAL, "fn_call", "the traced function failed without an error");
        ir_graph_free(s.g);
        return NULL;
    }
    return s.g;
}
