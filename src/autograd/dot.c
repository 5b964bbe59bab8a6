/*
 * dot.c — kl_autograd_dot: the backward graph reachable from a tensor as
 * Graphviz DOT, like torchviz: one box per node (forward op, output shapes),
 * saved tensors as ellipses hanging off their node, leaves in blue.
 */
#include "autograd.h"

#include <stdio.h>
#include <stdlib.h>

static void dot_node(FILE *f, const ag_node *n) {
    char b[256];
    if (n->op == AG_OP_ACCUMULATE) {
        fprintf(f, "  n%p [shape=box, style=filled, fillcolor=lightblue, label=\"leaf\\n%s\"];\n", (const void *)n,
                ke_fmt_shape(b, sizeof b, n->out_meta[0].ndim, n->out_meta[0].shape));
        return;
    }
    if (n->op == AG_OP_CUSTOM)
        fprintf(f, "  n%p [shape=box, label=\"%s backward", (const void *)n, n->custom->name);
    else
        fprintf(f, "  n%p [shape=box, label=\"kl_%s%s backward", (const void *)n, ke_ops[n->op].name,
                n->inplace ? "_inplace" : "");
    for (int k = 0; k < n->nout; k++)
        fprintf(f, "\\n%s %s", ke_fmt_shape(b, sizeof b, n->out_meta[k].ndim, n->out_meta[k].shape),
                ke_dtypes[n->out_meta[k].dtype].name);
    fprintf(f, "\"];\n");
    for (int i = 0; i < n->nin + n->nout; i++) {
        const ag_saved *s = i < n->nin ? &n->saved_in[i] : &n->saved_out[i - n->nin];
        if (!s->t) continue;
        fprintf(f, "  s%p_%d [shape=ellipse, style=filled, fillcolor=orange, label=\"saved %s %d\\n%s\"];\n",
                (const void *)n, i, s->is_output ? "output" : "input", i < n->nin ? i + 1 : i - n->nin + 1,
                ke_fmt_shape(b, sizeof b, s->t->ndim, s->t->shape));
        fprintf(f, "  s%p_%d -> n%p [style=dashed];\n", (const void *)n, i, (const void *)n);
    }
}

int kl_autograd_dot(const kl_tensor *t, const char *path) {
    if (ke_check_tensor(t, "autograd_dot", 1)) return -1;
    if (!path) return ke_err(KL_ERR_NULL_ARG, "autograd_dot", "path is NULL");
    const ag_meta *m = ag_meta_get(t);
    FILE *f = fopen(path, "w");
    if (!f) return ke_err(KL_ERR_IO, "autograd_dot", "cannot write '%s'", path);
    char b[256];
    fprintf(f, "digraph autograd {\n  rankdir=BT;\n  node [fontname=\"monospace\"];\n");
    fprintf(f, "  out [shape=box, style=filled, fillcolor=darkolivegreen1, label=\"output\\n%s %s\"];\n",
            ke_fmt_shape(b, sizeof b, t->ndim, t->shape), ke_dtypes[t->dtype].name);
    ag_node *root = m ? (m->grad_fn ? m->grad_fn : m->acc) : NULL;
    int rc = 0;
    if (root) {
        fprintf(f, "  n%p -> out;\n", (void *)root);
        /* Iterative walk; a node is printed once (linear scan of the seen list
         * is fine for graphs one looks at). */
        ag_node **stack = NULL, **seen = NULL;
        int sn = 0, nseen = 0, cap = 0, scap = 0;
        stack = malloc(sizeof *stack * 16);
        scap = 16;
        if (!stack) rc = ke_err(KL_ERR_OOM, "autograd_dot", "out of memory");
        if (!rc) stack[sn++] = root;
        while (!rc && sn > 0) {
            ag_node *n = stack[--sn];
            int dup = 0;
            for (int i = 0; i < nseen && !dup; i++) dup = seen[i] == n;
            if (dup) continue;
            if (nseen == cap) {
                cap = cap ? 2 * cap : 16;
                ag_node **p = realloc(seen, sizeof *p * (size_t)cap);
                if (!p) {
                    rc = ke_err(KL_ERR_OOM, "autograd_dot", "out of memory");
                    break;
                }
                seen = p;
            }
            seen[nseen++] = n;
            dot_node(f, n);
            for (int i = 0; i < n->nin; i++) {
                ag_node *c = n->next[i].fn;
                if (!c) continue;
                fprintf(f, "  n%p -> n%p;\n", (void *)c, (void *)n);
                if (sn == scap) {
                    scap *= 2;
                    ag_node **p = realloc(stack, sizeof *p * (size_t)scap);
                    if (!p) {
                        rc = ke_err(KL_ERR_OOM, "autograd_dot", "out of memory");
                        break;
                    }
                    stack = p;
                }
                stack[sn++] = c;
            }
        }
        free(stack);
        free(seen);
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0 && !rc) rc = ke_err(KL_ERR_IO, "autograd_dot", "error writing '%s'", path);
    return rc;
}
