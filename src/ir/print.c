/*
 * print.c — the stable text form of a graph (golden tests, KL_DEBUG_DIR) and
 * its Graphviz DOT.
 *
 *     graph(%0: f32[4,8], %1: f32[8]) {
 *       %2: f32[4,8] = add(%0, %1)
 *       %3: f32[4,8] = exp_(%2)            (in place: a trailing _)
 *       %4: f32[] = scalar(value=2)
 *       %5: f32[4,1] = sum(%3, dims=[1], keepdim=true)
 *       return (%3)
 *     }
 *
 * Strides are printed only where a value is not contiguous. Attributes follow
 * the inputs by name (the attrs column of optable.def, ir_attrs.def), in
 * declaration order, except where they hold their declared default; floats in
 * the shortest form that reads back exactly (src/eager/attr_text.c writes them,
 * and kl_op_call reads the same text back).
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static void print_type(FILE *f, const ir_value *v) {
    fprintf(f, "%s[", ke_dtypes[v->dtype].short_name);
    for (int d = 0; d < v->ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)v->shape[d]);
    fputc(']', f);
    int64_t want = 1;
    int contig = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != want) contig = 0;
        want *= v->shape[d];
    }
    if (!contig) {
        fputs("{strides=", f);
        for (int d = 0; d < v->ndim; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)v->stride[d]);
        fputc('}', f);
    }
    if (v->device.type != KL_CPU) fprintf(f, "@%s", ke_device_name(v->device));
    if (v->wrapped) fputs("{wrapped}", f);
}

/* The node's declared attributes as name=value after its inputs (src/eager/attr_text.c,
 * the text kl_op_call reads back). */
static void print_attrs(FILE *f, const ir_node *n) {
    ke_attrs_print(f, ir_op_attrs(n->op), n->op < KE_OP_COUNT && (ke_ops[n->op].flags & KE_F_RANDOM), &n->a,
                   n->nin == 0 ? "" : ", ");
}

int ir_print(const ir_graph *g, FILE *f) {
    fputs("graph(", f);
    for (int32_t i = 0; i < g->ninputs; i++) {
        const ir_value *v = &g->values[g->inputs[i]];
        fprintf(f, "%s%%%d: ", i ? ", " : "", v->id);
        print_type(f, v);
    }
    fputs(") {\n", f);
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        fputs("  ", f);
        for (int j = 0; j < n->nout; j++) {
            const ir_value *v = &g->values[n->out[j]];
            fprintf(f, "%s%%%d: ", j ? ", " : "", v->id);
            print_type(f, v);
        }
        fprintf(f, "%s%s%s(", n->nout ? " = " : "", ir_op_name(n->op), n->inplace ? "_" : "");
        for (int i = 0; i < n->nin; i++) fprintf(f, "%s%%%d", i ? ", " : "", n->in[i]);
        print_attrs(f, n);
        fputs(")", f);
        if (n->loc.file) fprintf(f, "  @ %s:%d", n->loc.file, n->loc.line);
        fputs("\n", f);
    }
    fputs("  return (", f);
    for (int32_t i = 0; i < g->noutputs; i++) fprintf(f, "%s%%%d", i ? ", " : "", g->outputs[i]);
    fputs(")\n}\n", f);
    return ferror(f) ? ke_err(KL_ERR_IO, "compile", "error writing a graph") : 0;
}

char *ir_print_to_string(int (*print)(const void *obj, FILE *f), const void *obj) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    int rc = print(obj, f);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int print_graph(const void *g, FILE *f) { return ir_print(g, f); }
char *ir_to_string(const ir_graph *g) { return ir_print_to_string(print_graph, g); }

int ir_print_dot(const ir_graph *g, FILE *f) {
    fputs("digraph ir {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n", f);
    for (int32_t i = 0; i < g->ninputs; i++)
        fprintf(f, "  v%d [shape=ellipse, style=filled, fillcolor=lightblue, label=\"input %d\"];\n", g->inputs[i], i);
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        fprintf(f, "  n%d [shape=box, label=\"%s%s\"];\n", k, ir_op_name(n->op), n->inplace ? "_" : "");
        for (int i = 0; i < n->nin; i++) {
            const ir_value *v = &g->values[n->in[i]];
            if (v->kind == IR_VAL_INPUT)
                fprintf(f, "  v%d -> n%d;\n", v->id, k);
            else
                fprintf(f, "  n%d -> n%d [label=\"%%%d\"];\n", v->node, k, v->id);
        }
    }
    for (int32_t i = 0; i < g->noutputs; i++) {
        const ir_value *v = &g->values[g->outputs[i]];
        fprintf(f, "  out%d [shape=ellipse, style=filled, fillcolor=darkolivegreen1, label=\"output %d\"];\n", i, i);
        if (v->kind == IR_VAL_INPUT)
            fprintf(f, "  v%d -> out%d;\n", v->id, i);
        else
            fprintf(f, "  n%d -> out%d;\n", v->node, i);
    }
    fputs("}\n", f);
    return ferror(f) ? ke_err(KL_ERR_IO, "compile", "error writing a graph") : 0;
}
