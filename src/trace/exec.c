/*
 * exec.c — runs a graph on real tensors, node by node through the
 * dispatcher (so autograd records when inputs require grad, and every
 * backend works). This is the executor of TRACE_ONLY and NO_FUSE modes; fused
 * kernels plug in here as nodes of their own.
 *
 * With a memory plan (plan.c) each value is dropped right after its last use
 * and kernel outputs with a slot are views over the slot's buffer, allocated
 * once per call. Two checks keep that safe whatever a node returns: a value
 * is dropped only if its tensor is one this call made (in the call's scope,
 * and not one of its node's inputs handed back), and a slot is reused only
 * if no tensor of its previous tenant is still alive (else the output gets
 * fresh storage). Slots are not used while autograd records: saved tensors
 * must keep their values.
 */
#include "trace.h"

#include "alloc.h"
#include "kernel.h"
#include "profiler.h"

#include <stdlib.h>

int tr_track_peak;
int64_t tr_peak_storages, tr_peak_bytes;

/* Tests: storages and CPU bytes alive beyond those at the call's start. */
static void track_peak(int64_t live0, int64_t bytes0) {
    int64_t n = kl_live_storages() - live0, b = ke_cpu_alloc_stats().live_bytes - bytes0;
    if (n > tr_peak_storages) tr_peak_storages = n;
    if (b > tr_peak_bytes) tr_peak_bytes = b;
}

/* One call's planned memory. */
typedef struct exec_mem {
    const ir_plan *p;              /* NULL: every value lives to the end of the call */
    int use_slots;
    ke_storage **slots;            /* [p->nslots]: allocated at first use */
    uint8_t *owned;                /* per value: its tensor was made by this call, may be dropped */
    struct ke_scope *scope;        /* the call's scope (of the first tensor the call made) */
    uint8_t small[256];            /* owned, for small graphs */
} exec_mem;

/* Kernel output v in its slot: *t is a view over the slot's buffer, or NULL
 * where v has no slot (or the slot is still held). 0 or -1. */
static int slot_tensor(exec_mem *m, int32_t v, const ir_kbuf *b, kl_tensor **t) {
    *t = NULL;
    int32_t s = m->use_slots ? m->p->slot_of[v] : -1;
    if (s < 0) return 0;
    ke_storage *st = m->slots[s];
    if (st && atomic_load(&st->refcount) != 1) return 0; /* a previous tenant is still alive */
    if (!st && !(st = m->slots[s] = ke_storage_new((size_t)m->p->slot_bytes[s], KL_DEVICE_CPU, "fn_call")))
        return -1;
    int64_t stride[KL_MAX_DIMS];
    ke_contiguous_strides(b->ndim, b->shape, stride);
    if (!(*t = ke_tensor_wrap(st, (kl_dtype)b->dtype, b->ndim, b->shape, stride, 0))) return -1;
    ke_scope_adopt(*t);
    return 0;
}

int64_t tr_count_launches(const ir_graph *g, int64_t *dispatched) {
    int64_t n = 0, d = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *nd = &g->nodes[k];
        if (nd->dead || (nd->op >= KE_OP_COUNT && nd->op != IR_OP_KERNEL) ||
            (nd->op < KE_OP_COUNT && ke_ops[nd->op].kind == KE_KIND_VIEW))
            continue;
        n++;
        d += nd->op < KE_OP_COUNT;
    }
    if (dispatched) *dispatched = d;
    return n;
}

/* A fused kernel: fresh contiguous outputs, or the input an output is
 * written into (write_into, writeback.c), then the backend. */
static int run_kernel(const ir_graph *g, const ir_node *n, kl_tensor **vals, exec_mem *m) {
    const ir_kernel *k = g->kernels[ir_attr_kernel_id(&n->a)];
    kl_tensor *in[16], *out[KE_MAX_OUT];
    if (n->nin > 16) return ke_err(KL_ERR_UNSUPPORTED, "fn_call", "a kernel with %d inputs", n->nin);
    for (int i = 0; i < n->nin; i++) in[i] = vals[n->in[i]];
    for (int j = 0; j < n->nout; j++) {
        const ir_kbuf *b = &k->bufs[k->ninputs + j];
        if (j < ir_attr_kernel_write_into_len(&n->a) && ir_attr_kernel_write_into(&n->a)[j] >= 0) {
            vals[n->out[j]] = out[j] = in[ir_attr_kernel_write_into(&n->a)[j]];
            continue;
        }
        if (slot_tensor(m, n->out[j], b, &out[j])) return -1;
        if (!out[j]) {
            out[j] = ke_tensor_new((kl_dtype)b->dtype, b->ndim, b->shape, k->device, "fn_call");
            if (!out[j]) return -1;
            ke_scope_adopt(out[j]);
        }
        vals[n->out[j]] = out[j];
    }
    if (!ke_prof_active()) return ir_kernel_run(k, in, out);
    int64_t t0 = ke_prof_now();
    int rc = ir_kernel_run(k, in, out);
    int64_t t1 = ke_prof_now(), bytes = 0;
    char name[KE_PROF_NAME], args[KE_PROF_ARGS];
    size_t u = 0;
    int id = (int)ir_attr_kernel_id(&n->a);
    snprintf(name, sizeof name, "kernel %d", id);
    u += (size_t)snprintf(args, sizeof args, "\"kernel\": %d, \"ops\": ", id);
    ke_prof_json_str(args, sizeof args, &u, k->ops ? k->ops : "");
    u += (size_t)snprintf(args + u, sizeof args - u, ", \"backend\": \"%s\", \"shapes\": [", atomic_load(&k->handle) ? k->backend->name : k->interim ? "interp (tier 0)" : "?");
    for (int i = 0; i < n->nin && u < sizeof args; i++) {
        u += (size_t)snprintf(args + u, sizeof args - u, "%s[", i ? ", " : "");
        for (int d = 0; d < in[i]->ndim && u < sizeof args; d++)
            u += (size_t)snprintf(args + u, sizeof args - u, "%s%lld", d ? ", " : "", (long long)in[i]->shape[d]);
        u += (size_t)snprintf(args + u, sizeof args - u, "]");
    }
    if (u < sizeof args) snprintf(args + u, sizeof args - u, "]");
    for (int j = 0; j < n->nout; j++)
        if (out[j] && !(j < ir_attr_kernel_write_into_len(&n->a) && ir_attr_kernel_write_into(&n->a)[j] >= 0))
            bytes += ke_numel(out[j]->ndim, out[j]->shape) * ke_dtypes[out[j]->dtype].size;
    ke_prof_complete(KE_PROF_KERNEL, name, t0, t1, bytes, args);
    return rc;
}

/* One call's random reservations, by slot (ir.h, IR_RANDOM_SLOT). */
typedef struct rand_slots {
    int n, cap;
    int64_t *rsv;                  /* [2 * cap]: seed, offset; seed -1: not reserved yet */
    int64_t small[16];
} rand_slots;

/* Fresh counters for node n's slot at its first use in this call, the same
 * ones for every later node of the slot; fixed reservations stay. */
static int reserve(rand_slots *r, ke_call *c) {
    if (ke_attr_offset(&c->a) != IR_RANDOM_SLOT) return 0;
    int64_t slot = ke_attr_seed(&c->a);
    if (slot >= r->cap) {
        int cap = (int)slot + 8;
        int64_t *p = r->rsv == r->small ? malloc(sizeof *p * 2 * (size_t)cap) : realloc(r->rsv, sizeof *p * 2 * (size_t)cap);
        if (!p) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        if (r->rsv == r->small) memcpy(p, r->small, sizeof r->small);
        for (int i = r->cap; i < cap; i++) p[2 * i] = -1;
        r->rsv = p;
        r->cap = cap;
    }
    if (r->rsv[2 * slot] == -1) {
        if (ke_random_reserve(c)) return -1;
        r->rsv[2 * slot] = ke_attr_seed(&c->a);
        r->rsv[2 * slot + 1] = ke_attr_offset(&c->a);
        return 0;
    }
    ke_attr_set_seed(&c->a, r->rsv[2 * slot]);
    ke_attr_set_offset(&c->a, r->rsv[2 * slot + 1]);
    return 0;
}

static int run_node(const ir_graph *g, const ir_node *n, kl_tensor **vals, rand_slots *rs, exec_mem *m) {
    if (n->op == IR_OP_KERNEL) return run_kernel(g, n, vals, m);
    if (n->op == IR_OP_SCALAR) {
        int wrapped = ir_attr_scalar_wrapped(&n->a);
        double value = ir_attr_scalar_value(&n->a);
        kl_tensor *t = wrapped ? ke_wrap_scalar(value) : kl_scalar_tensor(value, ir_attr_scalar_dtype(&n->a));
        if (!t) return -1;
        if (wrapped) ke_scope_adopt(t);
        vals[n->out[0]] = t;
        return 0;
    }
    if (n->op == IR_OP_CAPTURED) {
        vals[n->out[0]] = g->captured[ir_attr_captured_index(&n->a)];
        return 0;
    }
    if (n->op == IR_OP_COPY_BACK) return kl_copy_inplace(vals[n->in[0]], vals[n->in[1]]) ? 0 : -1;
    kl_tensor *inl[8];
    kl_tensor **in = n->nin <= 8 ? inl : malloc(sizeof *in * (size_t)n->nin);
    if (!in) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int i = 0; i < n->nin; i++) in[i] = vals[n->in[i]];
    ke_call c = {.op = n->op, .inplace = n->inplace, .nin = n->nin, .in = in, .device = n->device};
    c.a = n->a;
    int rc = (ke_ops[n->op].flags & KE_F_RANDOM) ? reserve(rs, &c) : 0;
    /* a library call (matmul, conv, an op that did not fuse): its eager op
     * event nests inside this one */
    int64_t t0 = ke_prof_active() && ke_ops[n->op].kind != KE_KIND_VIEW ? ke_prof_now() : 0;
    if (!rc) rc = ke_dispatch(&c);
    if (t0) ke_prof_complete(KE_PROF_LIBRARY, ke_ops[n->op].name, t0, ke_prof_now(), 0, NULL);
    if (!rc && c.nout != n->nout)
        rc = ke_err(KL_ERR_INTERNAL, "fn_call", "kl_%s gave %d outputs, the graph expects %d", ke_ops[n->op].name,
                    c.nout, n->nout);
    for (int j = 0; !rc && j < n->nout; j++) vals[n->out[j]] = c.out[j];
    if (in != inl) free(in);
    return rc;
}

/* Which of node n's results this call made: a tensor in the call's scope that
 * is none of the node's inputs (an in-place write, a kernel writing into an
 * input, or a composite returning an input hands that tensor back; then
 * neither value may drop it). */
static void mark_owned(const ir_node *n, kl_tensor **vals, exec_mem *m) {
    if (n->op == IR_OP_CAPTURED) return; /* the graph's tensor, whoever's scope holds it */
    for (int j = 0; j < n->nout; j++) {
        kl_tensor *t = vals[n->out[j]];
        int own = t && t->scope;
        for (int i = 0; i < n->nin; i++)
            if (vals[n->in[i]] == t) own = m->owned[n->in[i]] = 0;
        /* what the dispatcher and kernels make is adopted into the call's scope */
        if (own && !m->scope) m->scope = t->scope;
        m->owned[n->out[j]] = (uint8_t)(own && t->scope == m->scope);
    }
}

/* Drops the values whose last use was node k. */
static void drop_after(const ir_graph *g, int32_t k, kl_tensor **vals, exec_mem *m) {
    const ir_plan *p = m->p;
    for (int32_t i = p->drop_start[k]; i < p->drop_start[k + 1]; i++) {
        int32_t v = p->drops[i];
        if (!m->owned[v] || !vals[v]) continue;
        for (int32_t j = 0; j < g->noutputs; j++) /* never what the caller receives */
            if (vals[g->outputs[j]] == vals[v]) goto keep;
        kl_release(vals[v]);
        vals[v] = NULL;
        m->owned[v] = 0;
    keep:;
    }
}

static int needs_autograd(const ir_graph *g, kl_tensor *const *inputs) {
    if (!kl_is_grad_enabled()) return 0;
    for (int32_t i = 0; i < g->ninputs; i++)
        if (inputs[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) return 1;
    for (int32_t i = 0; i < g->ncaptured; i++)
        if (g->captured[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) return 1;
    return 0;
}

static int mem_begin(const ir_graph *g, kl_tensor *const *inputs, exec_mem *m) {
    memset(m, 0, sizeof *m);
    const ir_plan *p = g->plan;
    if (!p || p->nnodes != g->nnodes || p->nvalues != g->nvalues) return 0;
    m->owned = g->nvalues <= (int32_t)sizeof m->small ? m->small : calloc((size_t)g->nvalues, 1);
    m->use_slots = p->nslots > 0 && !needs_autograd(g, inputs);
    m->slots = m->use_slots ? calloc((size_t)p->nslots, sizeof *m->slots) : NULL;
    if (!m->owned || (m->use_slots && !m->slots)) {
        if (m->owned != m->small) free(m->owned);
        free(m->slots);
        memset(m, 0, sizeof *m);
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    }
    m->p = p;
    return 0;
}

/* After the call's scope closed: no view of a slot is left. */
static void mem_end(exec_mem *m) {
    if (m->slots)
        for (int32_t s = 0; s < m->p->nslots; s++)
            if (m->slots[s]) ke_storage_decref(m->slots[s]);
    free(m->slots);
    if (m->owned != m->small) free(m->owned);
}

static int is_first(kl_tensor *const *outs, int32_t j) {
    for (int32_t i = 0; i < j; i++)
        if (outs[i] == outs[j]) return 0;
    return 1;
}

int tr_run_graph(const ir_graph *g, kl_tensor *const *inputs, kl_tensor **outputs) {
    return tr_run_graph_rs(g, inputs, outputs, NULL);
}

int tr_run_graph_rs(const ir_graph *g, kl_tensor *const *inputs, kl_tensor **outputs, tr_rand *io) {
    kl_tensor **vals = calloc((size_t)g->nvalues + 1, sizeof *vals);
    if (!vals) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int32_t i = 0; i < g->ninputs; i++) vals[g->inputs[i]] = inputs[i];
    rand_slots rs = {.cap = 8};
    rs.rsv = rs.small;
    for (int i = 0; i < 8; i++) rs.small[2 * i] = -1;
    int rc = 0;
    if (io && io->n > rs.cap) {
        if (!(rs.rsv = malloc(sizeof *rs.rsv * 2 * (size_t)io->n))) rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        else rs.cap = io->n;
    }
    if (io && io->n && !rc) memcpy(rs.rsv, io->rsv, sizeof *rs.rsv * 2 * (size_t)io->n);
    kl_scope_begin();
    exec_mem m;
    if (!rc) rc = mem_begin(g, inputs, &m);
    else memset(&m, 0, sizeof m);
    int64_t live0 = tr_track_peak ? kl_live_storages() : 0, bytes0 = tr_track_peak ? ke_cpu_alloc_stats().live_bytes : 0;
    if (tr_track_peak) tr_peak_storages = tr_peak_bytes = 0;
    for (int32_t k = 0; k < g->nnodes && !rc; k++) {
        if (g->nodes[k].dead) continue;
        rc = run_node(g, &g->nodes[k], vals, &rs, &m);
        if (!rc && m.p) {
            mark_owned(&g->nodes[k], vals, &m);
            drop_after(g, k, vals, &m);
        }
        if (tr_track_peak) track_peak(live0, bytes0);
    }
    if (io && !rc) { /* the reservations go back to the caller */
        int64_t *p = realloc(io->rsv, sizeof *p * 2 * (size_t)rs.cap);
        if (!p) rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        else {
            memcpy(p, rs.rsv, sizeof *p * 2 * (size_t)rs.cap);
            io->rsv = p;
            io->n = rs.cap;
        }
    }
    if (rs.rsv != rs.small) free(rs.rsv);
    /* Results made here outlive the scope: hold them, close it, then hand
     * each distinct one to the caller's scope. Inputs and captured tensors are
     * returned as they are. */
    for (int32_t j = 0; !rc && j < g->noutputs; j++) {
        outputs[j] = vals[g->outputs[j]];
        if (is_first(outputs, j)) ke_tensor_incref(outputs[j]);
    }
    kl_scope_end();
    mem_end(&m);
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
