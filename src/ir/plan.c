/*
 * plan.c — memory planning, the last pass: the liveness of every value a
 * node defines, when the executor may drop it, and which kernel outputs
 * share a buffer (ir.h, ir_plan).
 *
 * A value is live from its defining node to its last use. The executor drops
 * its reference right after that node (so peak memory is what is live, not
 * every intermediate of the call); values the graph returns are kept.
 *
 * Slots are for the outputs of kernel nodes, the only nodes whose outputs the
 * executor allocates itself (dispatcher-run nodes such as matmul allocate
 * their own, and their storage goes back to the caching allocator when
 * dropped). A kernel output gets a slot only if nothing else can hold on to
 * its storage: not returned, no view of it (base == itself and no value has
 * it as base), not written in place, not a kernel output written into an
 * input (writeback.c). Lifetimes are compared as closed intervals of node
 * indices, so a kernel never writes the slot it reads.
 */
#include "kernel.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

void ir_plan_free(ir_plan *p) {
    if (!p) return;
    free(p->slot_bytes);
    free(p->slot_of);
    free(p->last_use);
    free(p->drop_start);
    free(p->drops);
    free(p);
}

static void *dup(const void *src, size_t bytes) {
    void *d = malloc(bytes ? bytes : 1);
    if (d && bytes) memcpy(d, src, bytes);
    return d;
}

ir_plan *ir_plan_clone(const ir_plan *p) {
    ir_plan *c = calloc(1, sizeof *c);
    if (c) {
        *c = *p;
        c->slot_bytes = dup(p->slot_bytes, sizeof(int64_t) * (size_t)p->nslots);
        c->slot_of = dup(p->slot_of, sizeof(int32_t) * (size_t)p->nvalues);
        c->last_use = dup(p->last_use, sizeof(int32_t) * (size_t)p->nvalues);
        c->drop_start = dup(p->drop_start, sizeof(int32_t) * (size_t)(p->nnodes + 1));
        c->drops = dup(p->drops, sizeof(int32_t) * (size_t)p->drop_start[p->nnodes]);
    }
    if (!c || !c->slot_bytes || !c->slot_of || !c->last_use || !c->drop_start || !c->drops) {
        ir_plan_free(c);
        ke_err(KL_ERR_OOM, "compile", "out of memory copying a memory plan");
        return NULL;
    }
    return c;
}

static int64_t value_bytes(const ir_value *v) {
    int64_t n = (int64_t)ke_dtypes[v->dtype].size;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

/* Kernel output j of node n may live in a slot. */
static int slot_candidate(const ir_graph *g, const ir_node *n, int j, const uint8_t *keep) {
    int32_t v = n->out[j];
    if (n->op != IR_OP_KERNEL || keep[v] || g->values[v].base != v) return 0;
    if (j < ir_attr_kernel_write_into_len(&n->a) && ir_attr_kernel_write_into(&n->a)[j] >= 0)
        return 0; /* written into an input */
    return g->values[v].device.type == KL_CPU;
}

/* Liveness: last_use[v] for every value, and keep[v] for values whose
 * storage something beyond their uses can see (returned, viewed, written in
 * place): those are never dropped early nor given slots. */
static void liveness(const ir_graph *g, int32_t *last_use, uint8_t *keep, const uint8_t *written) {
    for (int32_t v = 0; v < g->nvalues; v++) {
        last_use[v] = -1;
        const ir_value *val = &g->values[v];
        if (val->base != v) keep[v] = keep[val->base] = 1;
        if (written[val->base]) keep[v] = 1;
    }
    for (int32_t i = 0; i < g->noutputs; i++) keep[g->outputs[i]] = keep[g->values[g->outputs[i]].base] = 1;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        for (int i = 0; i < n->nin; i++) last_use[n->in[i]] = k;
        for (int j = 0; j < n->nout; j++)
            if (last_use[n->out[j]] < k) last_use[n->out[j]] = k; /* unused: dropped at once */
    }
}

/* Best fit among the slots free at node k (busy[s] < k); else the largest
 * free one, grown; else a new slot. Returns the slot or -1 (OOM). */
static int32_t pick_slot(ir_plan *p, int32_t *busy, int32_t k, int64_t need) {
    int32_t best = -1, largest = -1;
    for (int32_t s = 0; s < p->nslots; s++) {
        if (busy[s] >= k) continue;
        if (p->slot_bytes[s] >= need && (best < 0 || p->slot_bytes[s] < p->slot_bytes[best])) best = s;
        if (largest < 0 || p->slot_bytes[s] > p->slot_bytes[largest]) largest = s;
    }
    if (best < 0 && largest >= 0) {
        p->slot_bytes[largest] = need;
        best = largest;
    }
    if (best < 0) {
        int64_t *sb = realloc(p->slot_bytes, sizeof *sb * (size_t)(p->nslots + 1));
        if (!sb) return -1;
        p->slot_bytes = sb;
        sb[p->nslots] = need;
        best = p->nslots++;
    }
    return best;
}

static int plan_slots(const ir_graph *g, ir_plan *p, const uint8_t *keep) {
    int32_t *busy = malloc(sizeof *busy * (size_t)(g->nvalues + 1)); /* per slot: last node using it */
    if (!busy) return -1;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        for (int j = 0; j < n->nout; j++) {
            int32_t v = n->out[j];
            if (!slot_candidate(g, n, j, keep)) continue;
            int64_t need = value_bytes(&g->values[v]);
            int32_t s = pick_slot(p, busy, k, need);
            if (s < 0) {
                free(busy);
                return -1;
            }
            busy[s] = p->last_use[v];
            p->slot_of[v] = s;
            p->value_bytes += need;
        }
    }
    for (int32_t s = 0; s < p->nslots; s++) p->slot_total += p->slot_bytes[s];
    free(busy);
    return 0;
}

static int plan_drops(const ir_graph *g, ir_plan *p, const uint8_t *keep) {
    int32_t *fill = calloc((size_t)g->nnodes + 1, sizeof *fill);
    if (!fill) return -1;
    int32_t total = 0;
    for (int32_t v = 0; v < g->nvalues; v++) {
        const ir_value *val = &g->values[v];
        /* a value over a kept storage is dropped too: only its header goes */
        if (val->kind != IR_VAL_NODE || ir_is_output(g, v) || p->last_use[v] < 0) continue;
        int op = g->nodes[val->node].op;
        if (op == IR_OP_CAPTURED) continue; /* the graph's own reference */
        p->drop_start[p->last_use[v] + 1]++;
        total++;
    }
    (void)keep;
    for (int32_t k = 0; k < g->nnodes; k++) p->drop_start[k + 1] += p->drop_start[k];
    p->drops = malloc(sizeof *p->drops * (size_t)(total + 1));
    if (!p->drops) {
        free(fill);
        return -1;
    }
    memcpy(fill, p->drop_start, sizeof *fill * (size_t)g->nnodes);
    for (int32_t v = 0; v < g->nvalues; v++) {
        const ir_value *val = &g->values[v];
        if (val->kind != IR_VAL_NODE || ir_is_output(g, v) || p->last_use[v] < 0) continue;
        if (g->nodes[val->node].op == IR_OP_CAPTURED) continue;
        p->drops[fill[p->last_use[v]]++] = v;
    }
    free(fill);
    return 0;
}

/* KL_DEBUG_DIR: the plan of each planned graph. */
static void dump_plan(const ir_graph *g) {
    static _Atomic int seq;
    const char *dir = getenv("KL_DEBUG_DIR");
    if (!dir || !*dir) return;
    mkdir(dir, 0777);
    char path[1024];
    snprintf(path, sizeof path, "%s/plan%03d.txt", dir, atomic_fetch_add(&seq, 1));
    FILE *f = fopen(path, "w");
    if (!f) return;
    ir_plan_print(g, f);
    fclose(f);
}

int ir_pass_plan(ir_graph *g) {
    ir_plan_free(g->plan);
    g->plan = NULL;
    ir_plan *p = calloc(1, sizeof *p);
    uint8_t *written = ir_written_mask(g);
    uint8_t *keep = calloc((size_t)g->nvalues + 1, 1);
    int rc = 0;
    if (p) {
        p->nvalues = g->nvalues;
        p->nnodes = g->nnodes;
        p->slot_of = malloc(sizeof *p->slot_of * (size_t)(g->nvalues + 1));
        p->last_use = malloc(sizeof *p->last_use * (size_t)(g->nvalues + 1));
        p->drop_start = calloc((size_t)g->nnodes + 2, sizeof *p->drop_start);
    }
    if (!p || !written || !keep || !p->slot_of || !p->last_use || !p->drop_start) {
        rc = -1;
    } else {
        for (int32_t v = 0; v < g->nvalues; v++) p->slot_of[v] = -1;
        liveness(g, p->last_use, keep, written);
        rc = plan_slots(g, p, keep) || plan_drops(g, p, keep) ? -1 : 0;
    }
    free(written);
    free(keep);
    if (rc) {
        ir_plan_free(p);
        return ke_err(KL_ERR_OOM, "compile", "out of memory planning memory");
    }
    g->plan = p;
    dump_plan(g);
    return p->nslots;
}

int ir_plan_print(const ir_graph *g, FILE *f) {
    const ir_plan *p = g->plan;
    if (!p) {
        fputs("no plan\n", f);
        return 0;
    }
    fprintf(f, "plan: %d slots, %lld bytes for %lld bytes of kernel outputs\n", p->nslots,
            (long long)p->slot_total, (long long)p->value_bytes);
    for (int32_t s = 0; s < p->nslots; s++) {
        fprintf(f, "  slot %d: %lld bytes:", s, (long long)p->slot_bytes[s]);
        for (int32_t v = 0; v < p->nvalues; v++)
            if (p->slot_of[v] == s)
                fprintf(f, " %%%d [%d,%d]", v, g->values[v].node, p->last_use[v]);
        fputc('\n', f);
    }
    for (int32_t k = 0; k < p->nnodes; k++) {
        if (p->drop_start[k] == p->drop_start[k + 1]) continue;
        fprintf(f, "  after node %d drop", k);
        for (int32_t i = p->drop_start[k]; i < p->drop_start[k + 1]; i++) fprintf(f, " %%%d", p->drops[i]);
        fputc('\n', f);
    }
    return ferror(f) ? ke_err(KL_ERR_IO, "compile", "error writing a memory plan") : 0;
}
