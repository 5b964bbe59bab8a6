/*
 * lower.c — a fused group of graph nodes -> one kernel (kernel.h), plus the
 * kernel's text form.
 *
 * Each op's compute dtype is what its shape/dtype rule picked in eager when
 * the op was traced (the tracer records it on the node), so the kernel
 * converts exactly where eager converts, with no second inference here.
 * Lowering stops at kernel IR: compiling is the trace layer's step.
 */
#include "kernel.h"

#include "ew.h"
#include "kernels_reduce.h"

#include <stdlib.h>

/* Devices whose kernels have a backend: the CPU and CUDA (src/init.c
 * registers the nvrtc backend). A kernel runs on one device: its node's. */
static int kernel_device(kl_device d) { return d.type == KL_CPU || d.type == KL_CUDA; }

/* 1 if a kernel on device d can read value v: one on d, or on CUDA a 0-dim
 * CPU value (a scalar; the backend hands its value to the device). */
static int readable(const ir_value *v, kl_device d) {
    if (v->device.type == d.type && v->device.index == d.index) return 1;
    return d.type == KL_CUDA && v->device.type == KL_CPU && v->ndim == 0;
}

/* 1 if pow's exponent has more than one element and is broadcast along
 * the innermost dim of the result that is not 1 (eager's coalesced inner dim). */
static int pow_bcast_rows(const ir_graph *g, const ir_node *n) {
    const ir_value *y = &g->values[n->in[1]], *o = &g->values[n->out[0]];
    if (ke_numel(y->ndim, y->shape) <= 1) return 0;
    for (int d = o->ndim - 1; d >= 0; d--) {
        if (o->shape[d] == 1) continue;
        int dy = d - (o->ndim - y->ndim);
        return dy < 0 || y->shape[dy] == 1;
    }
    return 0;
}

int ir_fusible(const ir_graph *g, const ir_node *n) {
    if (n->dead || n->op >= KE_OP_COUNT || n->inplace || !kernel_device(n->device)) return 0;
    const ke_op_info *o = &ke_ops[n->op];
    if (o->kind != KE_KIND_EW || !o->impl || n->nout != 1 || n->nin > 4) return 0;
    for (int i = 0; i < n->nin; i++)
        if (!readable(&g->values[n->in[i]], n->device)) return 0;
    int cd = n->compute;
    if (cd < 0) return 0;
    /* pow's loop takes shortcuts when eager hands it the exponent as one
     * element: always so for a one-element exponent (the kernel does too),
     * and row by row for an exponent broadcast along the innermost dim, which
     * a kernel does not reproduce: that pow stays unfused */
    if (n->op == KE_OP_pow && pow_bcast_rows(g, n)) return 0;
    /* a dtype eager cannot run stays unfused, so it fails the eager way */
    return ((const ke_ew_impl *)o->impl)->loop[cd] != NULL;
}

int ir_row_reducible(const ir_graph *g, const ir_node *n) {
    if (n->dead || n->op >= KE_OP_COUNT || n->inplace || !kernel_device(n->device)) return 0;
    const ke_op_info *o = &ke_ops[n->op];
    if (o->kind != KE_KIND_REDUCE || !o->impl || n->nin != 1 || n->nout != 1) return 0;
    const ir_value *x = &g->values[n->in[0]];
    /* the last dim, kept */
    if (!readable(x, n->device) || x->ndim == 0 || ke_attr_dims_len(&n->a) != 1 || !ke_attr_keepdim(&n->a) ||
        (ke_attr_dims(&n->a)[0] != x->ndim - 1 && ke_attr_dims(&n->a)[0] != -1))
        return 0;
    const ke_rd_op *ro = o->impl;
    if (ro->vout != 0 || ro->iout >= 0) return 0;
    int cd = n->compute;
    if (cd < 0) return 0;
    return ro->k[cd] && (!ro->pre || ro->pre->k[cd]);
}

/* Strides of value v over the domain's dims: v broadcasts right-aligned. */
static void domain_index(const ir_value *v, int ndim, const int64_t *shape, int64_t *index) {
    (void)shape;
    for (int d = 0; d < ndim; d++) {
        int dv = d - (ndim - v->ndim);
        index[d] = (dv < 0 || v->shape[dv] == 1) ? 0 : v->stride[dv];
    }
}

static int add_stmt(ir_kernel *k, int *cap, const ir_kstmt *s) {
    if (k->nstmts == *cap) {
        int c = *cap ? *cap * 2 : 16;
        ir_kstmt *p = realloc(k->stmts, sizeof *p * (size_t)c);
        if (!p) return ke_err(KL_ERR_OOM, "compile", "out of memory lowering a kernel");
        k->stmts = p;
        *cap = c;
    }
    k->stmts[k->nstmts] = *s;
    return k->nstmts++;
}

/* Tests only: KL_TEST_BREAK_LOWERING=<op> lowers that elementwise op wrongly (a unary one as neg,
 * a binary one as sub, sub as add), so that KL_COMPILE_CHECK and its minifier have a
 * mismatch to find (tests/test_repro.c). Read at each lowering: compile time only. */
static int broken_op(int op, int nin) {
    const char *e = getenv("KL_TEST_BREAK_LOWERING");
    if (!e || strcmp(e, ke_ops[op].name) != 0 || ke_ops[op].kind != KE_KIND_EW) return op;
    if (nin == 1) return KE_OP_neg;
    return op == KE_OP_sub ? KE_OP_add : KE_OP_sub;
}

/* Tests only: KL_TEST_FAIL_LOWERING=<op> makes lowering a fused group holding that op fail
 * (KL_ERR_UNSUPPORTED, as a backend refusing a kernel would), so that KL_COMPILE_CHECK's
 * minifier has a failing compile to shrink (tests/test_repro.c). */
static int failed_op(const ir_graph *g, const int32_t *members, int n) {
    const char *e = getenv("KL_TEST_FAIL_LOWERING");
    for (int m = 0; e && m < n; m++)
        if (g->nodes[members[m]].op < KE_OP_COUNT && !strcmp(e, ke_ops[g->nodes[members[m]].op].name))
            return ke_err(KL_ERR_UNSUPPORTED, "compile", "lowering a fused kl_%s failed (KL_TEST_FAIL_LOWERING, a "
                          "test-only switch)", e);
    return 0;
}

ir_kernel *ir_lower_group(const ir_graph *g, const int32_t *members, int n, int ndim, const int64_t *shape,
                          const int32_t *in, int ninputs, const int32_t *out, int noutputs) {
    if (failed_op(g, members, n)) return NULL;
    ir_kernel *k = calloc(1, sizeof *k);
    int32_t *map = malloc(sizeof *map * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!k || !map || !(k->bufs = calloc((size_t)(ninputs + noutputs) + 1, sizeof *k->bufs))) {
        free(map);
        ir_kernel_free(k);
        ke_err(KL_ERR_OOM, "compile", "out of memory lowering a kernel");
        return NULL;
    }
    for (int32_t i = 0; i < g->nvalues; i++) map[i] = -1;
    k->refs = 1;
    k->device = g->nodes[members[0]].device;
    k->ninputs = ninputs;
    k->noutputs = noutputs;
    k->ndim = (uint8_t)ndim;
    memcpy(k->shape, shape, sizeof(int64_t) * (size_t)ndim);
    int cap = 0, rc = 0;
    for (int i = 0; i < ninputs + noutputs; i++) {
        const ir_value *v = &g->values[i < ninputs ? in[i] : out[i - ninputs]];
        ir_kbuf *b = &k->bufs[i];
        b->dtype = v->dtype;
        b->ndim = v->ndim;
        b->output = i >= ninputs;
        memcpy(b->shape, v->shape, sizeof(int64_t) * v->ndim);
        if (b->output) ke_contiguous_strides(v->ndim, v->shape, b->stride);
        else memcpy(b->stride, v->stride, sizeof(int64_t) * v->ndim);
        ir_value tmp = *v;
        memcpy(tmp.stride, b->stride, sizeof tmp.stride);
        domain_index(&tmp, ndim, shape, b->index);
        b->contig_inner = ndim > 0 && b->index[ndim - 1] == 1;
    }
    for (int m = 0; m < n; m++) k->row |= ke_ops[g->nodes[members[m]].op].kind == KE_KIND_REDUCE;
    /* one load per input; in a row kernel, an input constant along the row
     * is a row value (so an empty row still has it) */
    for (int i = 0; i < ninputs && rc >= 0; i++) {
        ir_kstmt s = {.kind = IR_K_LOAD, .dtype = k->bufs[i].dtype, .buf = i, .op = -1};
        s.row = k->row && k->bufs[i].index[ndim - 1] == 0;
        rc = map[in[i]] = add_stmt(k, &cap, &s);
    }
    for (int m = 0; m < n && rc >= 0; m++) {
        const ir_node *nd = &g->nodes[members[m]];
        /* a value is per row when every operand is (row kernels) */
        int red = ke_ops[nd->op].kind == KE_KIND_REDUCE;
        ir_kstmt s = {.kind = red ? IR_K_REDUCE : IR_K_OP, .op = red ? nd->op : broken_op(nd->op, nd->nin),
                      .nargs = nd->nin, .buf = -1, .row = nd->nin > 0};
        s.dtype = g->values[nd->out[0]].dtype;
        s.a = nd->a;
        int cd = nd->compute;
        if (cd < 0) rc = ke_err(KL_ERR_INTERNAL, "compile", "fused kl_%s has no compute dtype", ke_ops[nd->op].name);
        s.compute = (uint8_t)(cd < 0 ? 0 : cd);
        for (int i = 0; i < nd->nin && rc >= 0; i++) {
            s.args[i] = map[nd->in[i]];
            if (s.args[i] < 0) rc = ke_err(KL_ERR_INTERNAL, "compile", "fused group reads value %d it lacks",
                                           nd->in[i]);
            else s.row &= k->stmts[s.args[i]].row;
        }
        if (red) s.row = 1;
        if (!red) {
            const ke_ew_impl *impl = ke_ops[nd->op].impl;
            const ir_value *ov = &g->values[nd->out[0]];
            for (int i = 0; i < nd->nin; i++) {
                const ir_value *iv = &g->values[nd->in[i]];
                if (((impl->bcast_ok >> i) & 1) && ke_numel(iv->ndim, iv->shape) == 1 && ke_numel(ov->ndim, ov->shape) > 1)
                    s.bcast |= (uint8_t)(1u << i);
            }
        }
        if (rc >= 0) rc = map[nd->out[0]] = add_stmt(k, &cap, &s);
    }
    for (int j = 0; j < noutputs && rc >= 0; j++) {
        ir_kstmt s = {.kind = IR_K_STORE, .dtype = k->bufs[ninputs + j].dtype, .buf = ninputs + j, .op = -1,
                      .nargs = 1, .args = {map[out[j]]}};
        if (s.args[0] < 0) rc = ke_err(KL_ERR_INTERNAL, "compile", "fused group does not define value %d", out[j]);
        else rc = add_stmt(k, &cap, &s);
    }
    free(map);
    if (rc < 0) {
        ir_kernel_free(k);
        return NULL;
    }
    return k;
}

static void print_dims(FILE *f, int n, const int64_t *v) {
    fputc('[', f);
    for (int d = 0; d < n; d++) fprintf(f, "%s%lld", d ? "," : "", (long long)v[d]);
    fputc(']', f);
}

int ir_kernel_print(const ir_kernel *k, FILE *f) {
    fprintf(f, "kernel%s ", k->row ? " row" : "");
    print_dims(f, k->ndim, k->shape);
    fputs(" {\n", f);
    for (int i = 0; i < k->ninputs + k->noutputs; i++) {
        const ir_kbuf *b = &k->bufs[i];
        fprintf(f, "  %s%d: %s", b->output ? "out" : "in", b->output ? i - k->ninputs : i, ke_dtypes[b->dtype].name);
        print_dims(f, b->ndim, b->shape);
        fputs(" index", f);
        print_dims(f, k->ndim, b->index);
        if (b->contig_inner) fputs(" contig", f);
        fputc('\n', f);
    }
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        switch (st->kind) {
        case IR_K_LOAD: fprintf(f, "  v%d: %s = load in%d\n", s, ke_dtypes[st->dtype].name, st->buf); break;
        case IR_K_STORE:
            fprintf(f, "  store out%d, v%d\n", st->buf - k->ninputs, st->args[0]);
            break;
        default:
            fprintf(f, "  v%d: %s%s = %s%s(", s, ke_dtypes[st->dtype].name, st->row ? " row" : "",
                    st->kind == IR_K_REDUCE ? "reduce_" : "", ke_ops[st->op].name);
            for (int i = 0; i < st->nargs; i++) fprintf(f, "%sv%d", i ? ", " : "", st->args[i]);
            fprintf(f, ")");
            if (st->kind == IR_K_OP && st->compute != st->dtype) fprintf(f, " in %s", ke_dtypes[st->compute].name);
            fputc('\n', f);
        }
    }
    fputs("}\n", f);
    return ferror(f) ? ke_err(KL_ERR_IO, "compile", "error writing a kernel") : 0;
}

static int print_kernel(const void *k, FILE *f) { return ir_kernel_print(k, f); }
char *ir_kernel_to_string(const ir_kernel *k) { return ir_print_to_string(print_kernel, k); }
