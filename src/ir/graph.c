/*
 * graph.c — building, copying, compacting and freeing graph IR (see ir.h).
 */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

/* The IR-only ops' attribute descriptors (ir_attrs.def), indexed from KE_OP_COUNT. */
#define KE_A KE_ATTR_DESC
#define IR_ATTRS(OP, op, attrs) static const ke_attr_desc ir_attrs_of_##op[] = {attrs};
#include "ir_attrs.def"
#undef IR_ATTRS
#define IR_ATTRS(OP, op, attrs)                                                                          \
    [IR_OP_##OP - KE_OP_COUNT] = {ir_attrs_of_##op, (int)(sizeof ir_attrs_of_##op / sizeof ir_attrs_of_##op[0])},
static const ke_attr_set ir_attr_sets[IR_OP_END - KE_OP_COUNT] = {
#include "ir_attrs.def"
};
#undef IR_ATTRS
#undef KE_A

const ke_attr_set *ir_op_attrs(int op) {
    static const ke_attr_set none = {NULL, 0};
    if (op >= 0 && op < KE_OP_COUNT) return &ke_op_attrs[op];
    if (op >= KE_OP_COUNT && op < IR_OP_END) return &ir_attr_sets[op - KE_OP_COUNT];
    return &none;
}

static int grow(void **p, int32_t *cap, int32_t want, size_t elem) {
    if (want <= *cap) return 0;
    int32_t c = *cap ? *cap : 16;
    while (c < want) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return ke_err(KL_ERR_OOM, "compile", "out of memory growing the graph");
    *p = q;
    *cap = c;
    return 0;
}

ir_graph *ir_graph_new(void) {
    ir_graph *g = calloc(1, sizeof *g);
    if (!g) ke_err(KL_ERR_OOM, "compile", "out of memory");
    return g;
}

void ir_graph_free(ir_graph *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->nnodes; i++) free(g->nodes[i].in);
    for (int32_t i = 0; i < g->ncaptured; i++) ke_tensor_decref(g->captured[i]);
    free(g->captured);
    ir_free_kernels(g);
    ir_plan_free(g->plan);
    free(g->notes);
    free(g->nodes);
    free(g->values);
    free(g->inputs);
    free(g->outputs);
    free(g);
}

void ir_note(ir_graph *g, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t have = g->notes ? strlen(g->notes) : 0, add = strlen(line);
    char *p = realloc(g->notes, have + add + 2);
    if (!p) return;
    memcpy(p + have, line, add);
    p[have + add] = '\n';
    p[have + add + 1] = 0;
    g->notes = p;
}

static int32_t new_value(ir_graph *g, const kl_tensor *like, ir_value_kind kind, int32_t node, int32_t index) {
    if (grow((void **)&g->values, &g->cap_values, g->nvalues + 1, sizeof *g->values)) return -1;
    ir_value *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    v->id = g->nvalues;
    v->kind = (uint8_t)kind;
    v->node = node;
    v->index = index;
    v->base = v->id;
    if (like) {
        v->dtype = like->dtype;
        v->ndim = like->ndim;
        v->wrapped = (like->flags & KE_TF_WRAPPED) != 0;
        v->device = like->storage->device;
        v->offset = like->offset;
        memcpy(v->shape, like->shape, sizeof(int64_t) * like->ndim);
        memcpy(v->stride, like->stride, sizeof(int64_t) * like->ndim);
    }
    return g->nvalues++;
}

int32_t ir_add_input(ir_graph *g, const kl_tensor *t) {
    int32_t *p = realloc(g->inputs, sizeof *p * (size_t)(g->ninputs + 1));
    if (!p) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    g->inputs = p;
    int32_t id = new_value(g, t, IR_VAL_INPUT, -1, g->ninputs);
    if (id < 0) return -1;
    g->inputs[g->ninputs++] = id;
    return id;
}

int32_t ir_add_node(ir_graph *g, int op, int inplace, int nin, const int32_t *in, int nout,
                    kl_tensor *const *out_like, const ke_attrs *a, kl_device device, int compute) {
    KE_ASSERT(nout >= 0 && nout <= KE_MAX_OUT);
    if (grow((void **)&g->nodes, &g->cap_nodes, g->nnodes + 1, sizeof *g->nodes)) return -1;
    int32_t *ins = nin ? malloc(sizeof *ins * (size_t)nin) : NULL;
    if (nin && !ins) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    int32_t k = g->nnodes;
    ir_node *n = &g->nodes[k];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->inplace = (uint8_t)inplace;
    n->compute = (int8_t)compute;
    n->nin = nin;
    n->in = ins;
    if (nin) memcpy(ins, in, sizeof *ins * (size_t)nin);
    n->device = device;
    if (a) n->a = *a;
    g->nnodes++;
    for (int j = 0; j < nout; j++) {
        int32_t id = new_value(g, out_like ? out_like[j] : NULL, IR_VAL_NODE, k, j);
        if (id < 0) return -1;
        g->nodes[k].out[j] = id;
        g->nodes[k].nout = j + 1;
        ir_value *v = &g->values[id];
        v->device = device; /* the real device: traced results themselves are meta */
        /* A view or an in-place result shares its (first) input's storage. */
        if (op < KE_OP_COUNT && nin > 0 && (ke_ops[op].kind == KE_KIND_VIEW || (inplace && j == 0)))
            v->base = g->values[in[0]].base;
    }
    return k;
}

int32_t ir_add_scalar(ir_graph *g, double v, kl_dtype dt, int wrapped, kl_device device) {
    ke_attrs a = {0};
    ir_attr_set_scalar_value(&a, v);
    ir_attr_set_scalar_wrapped(&a, wrapped);
    ir_attr_set_scalar_dtype(&a, dt);
    int32_t k = ir_add_node(g, IR_OP_SCALAR, 0, 0, NULL, 1, NULL, &a, device, -1);
    if (k < 0) return -1;
    ir_value *val = &g->values[g->nodes[k].out[0]];
    val->dtype = (uint8_t)dt;
    val->ndim = 0;
    val->wrapped = (uint8_t)wrapped;
    val->device = device;
    return val->id;
}

int32_t ir_add_captured(ir_graph *g, kl_tensor *t) {
    kl_tensor **p = realloc(g->captured, sizeof *p * (size_t)(g->ncaptured + 1));
    if (!p) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    g->captured = p;
    ke_tensor_incref(t);
    g->captured[g->ncaptured] = t;
    ke_attrs a = {0};
    ir_attr_set_captured_index(&a, g->ncaptured++);
    kl_tensor *like[1] = {t};
    int32_t k = ir_add_node(g, IR_OP_CAPTURED, 0, 0, NULL, 1, like, &a, t->storage->device, -1);
    return k < 0 ? -1 : g->nodes[k].out[0];
}

int ir_set_outputs(ir_graph *g, int n, const int32_t *ids) {
    int32_t *p = realloc(g->outputs, sizeof *p * (size_t)(n ? n : 1));
    if (!p) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    g->outputs = p;
    memcpy(p, ids, sizeof *p * (size_t)n);
    g->noutputs = n;
    return 0;
}

void ir_count_uses(const ir_graph *g, int32_t *uses) {
    memset(uses, 0, sizeof *uses * (size_t)g->nvalues);
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int i = 0; i < n->nin; i++) uses[n->in[i]]++;
    }
    for (int32_t i = 0; i < g->noutputs; i++) uses[g->outputs[i]]++;
}

ir_graph *ir_graph_clone(const ir_graph *g) {
    ir_graph *c = ir_graph_new();
    if (!c) return NULL;
    c->values = malloc(sizeof *c->values * (size_t)(g->nvalues ? g->nvalues : 1));
    c->nodes = malloc(sizeof *c->nodes * (size_t)(g->nnodes ? g->nnodes : 1));
    c->inputs = malloc(sizeof *c->inputs * (size_t)(g->ninputs ? g->ninputs : 1));
    c->outputs = malloc(sizeof *c->outputs * (size_t)(g->noutputs ? g->noutputs : 1));
    c->captured = malloc(sizeof *c->captured * (size_t)(g->ncaptured ? g->ncaptured : 1));
    if (!c->values || !c->nodes || !c->inputs || !c->outputs || !c->captured) goto oom;
    memcpy(c->values, g->values, sizeof *c->values * (size_t)g->nvalues);
    c->nvalues = c->cap_values = g->nvalues;
    memcpy(c->inputs, g->inputs, sizeof *c->inputs * (size_t)g->ninputs);
    c->ninputs = g->ninputs;
    memcpy(c->outputs, g->outputs, sizeof *c->outputs * (size_t)g->noutputs);
    c->noutputs = g->noutputs;
    for (int32_t i = 0; i < g->ncaptured; i++) {
        c->captured[i] = g->captured[i];
        ke_tensor_incref(g->captured[i]);
    }
    c->ncaptured = g->ncaptured;
    for (int32_t k = 0; k < g->nnodes; k++) {
        c->nodes[k] = g->nodes[k];
        c->nodes[k].in = NULL;
        c->nnodes = k + 1;
        if (g->nodes[k].nin) {
            c->nodes[k].in = malloc(sizeof(int32_t) * (size_t)g->nodes[k].nin);
            if (!c->nodes[k].in) goto oom;
            memcpy(c->nodes[k].in, g->nodes[k].in, sizeof(int32_t) * (size_t)g->nodes[k].nin);
        }
    }
    c->cap_nodes = g->nnodes;
    c->fuse = g->fuse;
    if (g->notes && !(c->notes = strdup(g->notes))) goto oom;
    if (ir_clone_kernels(c, g) || (g->plan && !(c->plan = ir_plan_clone(g->plan)))) {
        ir_graph_free(c);
        return NULL;
    }
    return c;
oom:
    ir_graph_free(c);
    ke_err(KL_ERR_OOM, "compile", "out of memory copying a graph");
    return NULL;
}

int ir_graph_compact(ir_graph *g) {
    ir_plan_free(g->plan); /* value and node numbers change */
    g->plan = NULL;
    int32_t *map = malloc(sizeof *map * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!map) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    for (int32_t i = 0; i < g->nvalues; i++) map[i] = -1;
    /* Keep inputs, then live nodes' outputs, in order. */
    int32_t nv = 0, nn = 0;
    ir_value *vals = g->values;
    for (int32_t i = 0; i < g->ninputs; i++) map[g->inputs[i]] = nv++;
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int j = 0; j < n->nout; j++) map[n->out[j]] = nv++;
    }
    ir_value *nvals = malloc(sizeof *nvals * (size_t)(nv ? nv : 1));
    if (!nvals) {
        free(map);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    for (int32_t i = 0; i < g->nvalues; i++) {
        if (map[i] < 0) continue;
        ir_value v = vals[i];
        v.id = map[i];
        v.base = map[v.base] >= 0 ? map[v.base] : v.id;
        nvals[map[i]] = v;
    }
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node n = g->nodes[k];
        if (n.dead) {
            free(n.in);
            continue;
        }
        for (int i = 0; i < n.nin; i++) n.in[i] = map[n.in[i]];
        for (int j = 0; j < n.nout; j++) {
            n.out[j] = map[n.out[j]];
            nvals[n.out[j]].node = nn;
        }
        g->nodes[nn++] = n;
    }
    for (int32_t i = 0; i < g->ninputs; i++) g->inputs[i] = map[g->inputs[i]];
    for (int32_t i = 0; i < g->noutputs; i++) g->outputs[i] = map[g->outputs[i]];
    free(vals);
    free(map);
    g->values = nvals;
    g->nvalues = g->cap_values = nv;
    g->nnodes = nn;
    return 0;
}
