/*
 * fuse.c — the fusion pass: groups of fusible nodes become IR_OP_KERNEL nodes
 * running one kernel each, lowered to kernel IR by lower.c. The pass stops
 * there: the passes after it (writeback, plan) still change the graph, and
 * the trace layer compiles the kernels with a registered backend afterwards
 * (src/trace/compile.c).
 *
 * Groups grow in execution order. A fusible node joins the groups of the
 * producers it reads (merging them) when
 *  - every group's domain (its output shape) broadcasts to the node's shape;
 *    a group whose domain grows must have no value used outside the merged
 *    group, so every value a kernel writes has the kernel's domain shape;
 *  - no node outside the merged group reads one of its values before the
 *    joining node: the kernel runs where its last member was, so each value
 *    it writes must be read only after that point.
 * Otherwise it joins the subset of those groups it can (mergeable_subset),
 * or starts a group of its own. Groups of one node stay
 * ordinary nodes (nothing to fuse); values read outside a group, or returned,
 * become the kernel's outputs (at most KE_MAX_OUT, else the group stays
 * unfused); everything else lives only inside the kernel. An elementwise
 * group reading more than IR_KERNEL_MAX_IN values is split into several
 * kernels along its members (fuse_group). Views, matmuls and
 * other ops stay graph nodes: a view's result reaches a kernel as a strided
 * (or broadcast, stride 0) input buffer.
 */
#include "kernel.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

typedef struct fuse_state {
    ir_graph *g;
    int32_t *grp;       /* per node: group id (-1: none) */
    int32_t *gsize;     /* per group id: members */
    uint8_t *gndim;     /* per group id: domain */
    uint8_t *grow;      /* per group id: a row group (has a reduction over the domain's last dim) */
    int64_t (*gshape)[KL_MAX_DIMS];
    int32_t *ustart, *users; /* consumers of each value (CSR) */
    uint8_t *is_out;    /* value returned by the graph */
    int32_t *cand;      /* scratch: candidate groups */
    int32_t *writes;    /* writes[k]: in-place writes among nodes [0, k) */
} fuse_state;

static int32_t producer_group(const fuse_state *s, int32_t v) {
    const ir_value *val = &s->g->values[v];
    return val->kind == IR_VAL_NODE ? s->grp[val->node] : -1;
}

static int in_merge(const fuse_state *s, int32_t node, int ncand, int32_t k) {
    if (node == k) return 1;
    for (int c = 0; c < ncand; c++)
        if (s->grp[node] == s->cand[c]) return 1;
    return 0;
}

/* 1 if (ndim, shape) broadcasts to (sndim, sshape); *same says it is equal. */
static int broadcasts(int ndim, const int64_t *shape, int sndim, const int64_t *sshape, int *same) {
    *same = ndim == sndim;
    if (ndim > sndim) return 0;
    for (int d = 0; d < ndim; d++) {
        int64_t a = shape[d], b = sshape[d + sndim - ndim];
        if (a != b) *same = 0;
        if (a != b && a != 1) return 0;
    }
    return 1;
}

/* 1 if (ndim, shape) is one row of the row domain (tndim, tshape): equal
 * but for a last dim of 1. Such a group's values are row values of a row
 * kernel over that domain, which it stores (one element per row) like its
 * own reductions. */
static int row_shaped(int ndim, const int64_t *shape, int tndim, const int64_t *tshape) {
    if (ndim != tndim || ndim == 0 || shape[ndim - 1] != 1) return 0;
    return !memcmp(shape, tshape, sizeof(int64_t) * (size_t)(ndim - 1));
}

/* Can node k join the candidate groups, over domain (tndim, tshape) (a row
 * domain if trow)? If not and why is not NULL, why says which rule refused
 * (fusion notes, kl_fn_explain). */
static int can_merge_why(const fuse_state *s, int ncand, int32_t k, int tndim, const int64_t *tshape, int trow,
                         char *why, size_t wcap) {
    const ir_graph *g = s->g;
    char b1[160], b2[160];
#define REFUSE(...) do { if (why) snprintf(why, wcap, __VA_ARGS__); return 0; } while (0)
    for (int c = 0; c < ncand; c++) {
        int32_t G = s->cand[c], same;
        /* a kernel runs on one device (a CUDA node may read a CPU scalar
         * computed by a CPU group, never join it) */
        const kl_device gd = g->nodes[G].device, kd = g->nodes[k].device;
        if (gd.type != kd.type || gd.index != kd.index)
            REFUSE("it runs on %s, the group on %s", ke_device_name(kd), ke_device_name(gd));
        /* a write between the group's first member and k could change what
         * the kernel, running at k, reads */
        if (s->writes[k] != s->writes[G]) REFUSE("an in-place write lies between the group and it");
        if (!broadcasts(s->gndim[G], s->gshape[G], tndim, tshape, &same))
            REFUSE("the group's domain %s does not broadcast to %s", ke_fmt_shape(b1, sizeof b1, s->gndim[G], s->gshape[G]),
                   ke_fmt_shape(b2, sizeof b2, tndim, tshape));
        if (s->grow[G] && !same)
            REFUSE("a row group's domain %s differs from %s (reduction over another axis)",
                   ke_fmt_shape(b1, sizeof b1, s->gndim[G], s->gshape[G]), ke_fmt_shape(b2, sizeof b2, tndim, tshape));
        if (trow && !s->grow[G] && row_shaped(s->gndim[G], s->gshape[G], tndim, tshape)) same = 1;
        for (int32_t m = G; m < k; m++) {
            if (s->grp[m] != G) continue;
            const ir_node *mn = &g->nodes[m];
            for (int j = 0; j < mn->nout; j++) {
                int32_t v = mn->out[j];
                if (!same && s->is_out[v])
                    REFUSE("the group returns %s's result, and joining would grow its domain to %s",
                           ir_op_name(mn->op), ke_fmt_shape(b2, sizeof b2, tndim, tshape));
                for (int32_t u = s->ustart[v]; u < s->ustart[v + 1]; u++) {
                    int32_t user = s->users[u];
                    if (in_merge(s, user, ncand, k)) continue;
                    if (user < k) REFUSE("%s reads the group's %s before it", ir_op_name(g->nodes[user].op), ir_op_name(mn->op));
                    if (!same)
                        REFUSE("%s reads the group's %s, and joining would grow its domain to %s",
                               ir_op_name(g->nodes[user].op), ir_op_name(mn->op), ke_fmt_shape(b2, sizeof b2, tndim, tshape));
                }
            }
        }
    }
#undef REFUSE
    return 1;
}

static int can_merge(const fuse_state *s, int ncand, int32_t k, int tndim, const int64_t *tshape, int trow) {
    return can_merge_why(s, ncand, k, tndim, tshape, trow, NULL, 0);
}

static int build_uses(fuse_state *s) {
    ir_graph *g = s->g;
    int32_t nv = g->nvalues;
    s->ustart = calloc((size_t)nv + 2, sizeof *s->ustart);
    s->is_out = calloc((size_t)nv + 1, 1);
    if (!s->ustart || !s->is_out) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    int32_t total = 0;
    for (int32_t k = 0; k < g->nnodes; k++)
        for (int i = 0; i < g->nodes[k].nin; i++) s->ustart[g->nodes[k].in[i] + 1]++, total++;
    for (int32_t v = 0; v < nv; v++) s->ustart[v + 1] += s->ustart[v];
    s->users = malloc(sizeof *s->users * (size_t)(total + 1));
    int32_t *fill = malloc(sizeof *fill * (size_t)(nv + 1));
    if (!s->users || !fill) {
        free(fill);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    memcpy(fill, s->ustart, sizeof *fill * (size_t)nv);
    for (int32_t k = 0; k < g->nnodes; k++)
        for (int i = 0; i < g->nodes[k].nin; i++) {
            int32_t v = g->nodes[k].in[i];
            /* a node reading a value twice is one user: count it once per read anyway */
            s->users[fill[v]++] = k;
        }
    free(fill);
    for (int32_t i = 0; i < g->noutputs; i++) s->is_out[g->outputs[i]] = 1;
    s->writes = calloc((size_t)g->nnodes + 1, sizeof *s->writes);
    if (!s->writes) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        s->writes[k + 1] = s->writes[k] + (n->inplace || n->op == IR_OP_COPY_BACK);
    }
    return 0;
}

/* The domain node k would give a group: an elementwise node's output shape
 * (or the domain of a row group it reads, which its shape must fit); a
 * reduction's input shape. -1 if k cannot join its candidates at all. */
static int target_domain(const fuse_state *s, int ncand, int32_t k, int red, int64_t *shape, uint8_t *row) {
    const ir_graph *g = s->g;
    const ir_node *n = &g->nodes[k];
    const ir_value *v = &g->values[red ? n->in[0] : n->out[0]];
    int ndim = v->ndim, same;
    memcpy(shape, v->shape, sizeof(int64_t) * ndim);
    *row = (uint8_t)red;
    if (red) return ndim;
    for (int c = 0; c < ncand; c++) {
        int32_t G = s->cand[c];
        if (!s->grow[G]) continue;
        if (*row && (s->gndim[G] != ndim || memcmp(s->gshape[G], shape, sizeof(int64_t) * ndim))) return -1;
        if (!*row && !broadcasts(v->ndim, v->shape, s->gndim[G], s->gshape[G], &same)) return -1;
        ndim = s->gndim[G];
        memcpy(shape, s->gshape[G], sizeof(int64_t) * ndim);
        *row = 1;
    }
    return ndim;
}

/* When node k cannot join all its producers' groups, it still joins those it
 * can: keep the candidates that could merge one by one, and if together they
 * still cannot, the first of them. (GELU's backward reads the forward's
 * group and the incoming gradient's; joining just one of them saves a
 * kernel.) Returns the new candidate count; shape/row/ndim describe it. */
static int mergeable_subset(fuse_state *s, int ncand, int32_t k, int red, int64_t *shape, uint8_t *row,
                            int *ndim) {
    int32_t all[16];
    if (ncand > 16) return 0;
    memcpy(all, s->cand, sizeof(int32_t) * (size_t)ncand);
    int keep = 0;
    for (int c = 0; c < ncand; c++) {
        s->cand[0] = all[c];
        int nd = target_domain(s, 1, k, red, shape, row);
        if (nd >= 0 && can_merge(s, 1, k, nd, shape, *row)) all[keep++] = all[c];
    }
    memcpy(s->cand, all, sizeof(int32_t) * (size_t)keep);
    if (keep == 0) return 0;
    *ndim = target_domain(s, keep, k, red, shape, row);
    if (keep > 1 && (*ndim < 0 || !can_merge(s, keep, k, *ndim, shape, *row))) keep = 1;
    if (keep == 1) *ndim = target_domain(s, 1, k, red, shape, row);
    return keep;
}

/* Why node n, neither fusible nor a row reduction, stays a graph node (a
 * fusion note); NULL for nodes nobody would expect in a kernel. */
static const char *unfused_reason(const ir_graph *g, const ir_node *n, char *buf, size_t cap) {
    if (n->dead || n->op >= KE_OP_COUNT) return NULL;
    const ke_op_info *o = &ke_ops[n->op];
    switch (o->kind) {
    case KE_KIND_VIEW: return NULL; /* read by kernels as a strided input */
    case KE_KIND_EXTERN: snprintf(buf, cap, "a library call"); return buf;
    case KE_KIND_COMPOSITE: snprintf(buf, cap, "stays composite (runs its own kernel)"); return buf;
    case KE_KIND_CREATE: snprintf(buf, cap, "a creation op (no fused form)"); return buf;
    case KE_KIND_REDUCE:
        if (n->inplace) break;
        snprintf(buf, cap, "reduction over another axis than the last, or not keepdim: not a row kernel");
        return buf;
    case KE_KIND_EW:
        if (n->inplace) break;
        if (n->device.type != KL_CPU && n->device.type != KL_CUDA) return NULL;
        snprintf(buf, cap, "%s", n->nin > 4 ? "more than 4 inputs" : "no fused form for its dtypes or inputs");
        return buf;
    default: snprintf(buf, cap, "no fused form"); return buf;
    }
    (void)g;
    snprintf(buf, cap, "an in-place write (kept in place by functionalize)");
    return buf;
}

static void form_groups(fuse_state *s) {
    ir_graph *g = s->g;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        int red = 0;
        if (!ir_fusible(g, n) && !(red = ir_row_reducible(g, n))) {
            char why[200], sh[160];
            const ir_value *ov = n->nout ? &g->values[n->out[0]] : NULL;
            if (unfused_reason(g, n, why, sizeof why))
                ir_note(g, "%s%s%s: %s", ir_op_name(n->op), n->inplace ? "_" : "",
                        ov ? ke_fmt_shape(sh, sizeof sh, ov->ndim, ov->shape) : "", why);
            continue;
        }
        int ncand = 0;
        for (int i = 0; i < n->nin; i++) {
            int32_t G = producer_group(s, n->in[i]);
            int dup = G < 0;
            for (int c = 0; c < ncand && !dup; c++) dup = s->cand[c] == G;
            if (!dup) s->cand[ncand++] = G;
        }
        int64_t shape[KL_MAX_DIMS];
        uint8_t row = 0;
        int ndim = ncand > 0 ? target_domain(s, ncand, k, red, shape, &row) : -1;
        int32_t G = k;
        int ncand0 = ncand;
        char why[400] = "";
        if (ncand > 0 && ndim < 0) snprintf(why, sizeof why, "its domain differs from its producers' row group (reduction over another axis)");
        else if (ncand > 0) can_merge_why(s, ncand, k, ndim, shape, row, why, sizeof why);
        if (ncand > 1 && (ndim < 0 || !can_merge(s, ncand, k, ndim, shape, row)))
            ncand = mergeable_subset(s, ncand, k, red, shape, &row, &ndim);
        if (why[0]) {
            char sh[160];
            const ir_value *ov = &g->values[n->out[0]];
            int joins = ndim >= 0 && ncand > 0 && can_merge(s, ncand, k, ndim, shape, row);
            if (joins)
                ir_note(g, "%s%s: joined %d of the %d groups it reads: %s", ir_op_name(n->op),
                        ke_fmt_shape(sh, sizeof sh, ov->ndim, ov->shape), ncand, ncand0, why);
            else
                ir_note(g, "%s%s: starts a kernel of its own, not joining the group%s it reads: %s", ir_op_name(n->op),
                        ke_fmt_shape(sh, sizeof sh, ov->ndim, ov->shape), ncand0 > 1 ? "s" : "", why);
        }
        if (ndim >= 0 && ncand > 0 && can_merge(s, ncand, k, ndim, shape, row)) {
            G = s->cand[0];
            for (int c = 1; c < ncand; c++) G = s->cand[c] < G ? s->cand[c] : G;
            for (int32_t m = 0; m < k; m++)
                if (s->grp[m] >= 0 && in_merge(s, m, ncand, -1)) s->grp[m] = G;
            for (int c = 0; c < ncand; c++)
                if (s->cand[c] != G) s->gsize[G] += s->gsize[s->cand[c]];
        } else {
            ndim = target_domain(s, 0, k, red, shape, &row);
        }
        s->grp[k] = G;
        s->gsize[G]++;
        s->grow[G] = row;
        s->gndim[G] = (uint8_t)ndim;
        memcpy(s->gshape[G], shape, sizeof(int64_t) * ndim);
    }
}

static int add_kernel(ir_graph *g, ir_kernel *kn) {
    ir_kernel **p = realloc(g->kernels, sizeof *p * (size_t)(g->nkernels + 1));
    if (!p) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    g->kernels = p;
    g->kernels[g->nkernels] = kn;
    return g->nkernels++;
}

/* A kernel writes values shaped like its domain, or in a row kernel like a
 * row of it (the last dim 1). */
static int storable(const fuse_state *s, int32_t G, const ir_value *v) {
    int nd = s->gndim[G];
    if (v->ndim != nd) return 0;
    for (int d = 0; d < nd; d++)
        if (v->shape[d] != s->gshape[G][d] && !(s->grow[G] && d == nd - 1 && v->shape[d] == 1)) return 0;
    return 1;
}

/* The part members[lo..hi) of group G (a run of its members in execution
 * order): the values it reads from outside the part into in[] (*nin), and
 * the values it defines that something outside the part reads, or the graph
 * returns, into out[] (*nout, at most KE_MAX_OUT). Returns 1 if one kernel
 * can run the part, 0 if not (too many inputs or outputs, or an output not
 * shaped like the domain). */
static int part_io(const fuse_state *s, int32_t G, const int32_t *members, int lo, int hi, int32_t *in, int *nin,
                   int32_t *out, int *nout) {
    const ir_graph *g = s->g;
    int32_t first = members[lo], last = members[hi - 1];
    int ok = 1;
    *nin = *nout = 0;
#define INSIDE(node) ((node) >= first && (node) <= last && s->grp[node] == G)
    for (int m = lo; m < hi; m++) {
        const ir_node *nd = &g->nodes[members[m]];
        for (int i = 0; i < nd->nin; i++) {
            int32_t v = nd->in[i];
            const ir_value *val = &g->values[v];
            int inside = val->kind == IR_VAL_NODE && INSIDE(val->node), dup = 0;
            for (int j = 0; j < *nin && !dup; j++) dup = in[j] == v;
            if (!inside && !dup) in[(*nin)++] = v;
        }
        int32_t v = nd->out[0];
        int escapes = s->is_out[v];
        for (int32_t u = s->ustart[v]; u < s->ustart[v + 1] && !escapes; u++) escapes = !INSIDE(s->users[u]);
        if (!escapes) continue;
        if (*nout == KE_MAX_OUT || !storable(s, G, &g->values[v])) ok = 0;
        else out[(*nout)++] = v;
    }
#undef INSIDE
    return ok && *nin <= IR_KERNEL_MAX_IN;
}

/* "add, mul, gelu": the ops of n nodes (malloc'd; NULL if out of memory).
 * Nodes that carry the user's line (-DKL_TRACK_SOURCE) are named with it,
 * the file said once per run of one file: "mlp.c:41 add, :42 gelu". */
static char *members_text(const ir_graph *g, const int32_t *m, int n) {
    size_t cap = 16, used = 0;
    for (int i = 0; i < n; i++) {
        const ir_node *nd = &g->nodes[m[i]];
        cap += strlen(ir_op_name(nd->op)) + 2 + (nd->loc.file ? strlen(nd->loc.file) + 16 : 0);
    }
    char *t = malloc(cap);
    if (!t) return NULL;
    t[0] = 0;
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const ir_node *nd = &g->nodes[m[i]];
        char at[400];
        ke_loc_fmt(at, sizeof at, nd->loc, prev);
        if (nd->loc.file) prev = nd->loc.file;
        used += (size_t)snprintf(t + used, cap - used, "%s%s%s%s", i ? ", " : "", at, at[0] ? " " : "", ir_op_name(nd->op));
    }
    return t;
}

/* Replaces members[lo..hi) of group G by one kernel node at the part's last
 * member. 0, or -1 on error. */
static int emit_kernel(fuse_state *s, int32_t G, const int32_t *members, int lo, int hi, int32_t *in) {
    ir_graph *g = s->g;
    int32_t out[KE_MAX_OUT];
    int nin, nout, rc = 0;
    if (!part_io(s, G, members, lo, hi, in, &nin, out, &nout))
        return ke_err(KL_ERR_INTERNAL, "compile", "a fused part changed between planning and lowering");
    ir_kernel *kn = ir_lower_group(g, members + lo, hi - lo, s->gndim[G], s->gshape[G], in, nin, out, nout);
    if (!kn) rc = -1;
    if (kn) kn->ops = members_text(g, members + lo, hi - lo);
    int32_t idx = rc == 0 ? add_kernel(g, kn) : -1;
    if (idx < 0) {
        ir_kernel_free(kn);
        return -1;
    }
    int32_t last = members[hi - 1];
    ir_node *kn_node = &g->nodes[last];
    int32_t *nin_arr = realloc(kn_node->in, sizeof *nin_arr * (size_t)(nin ? nin : 1));
    if (!nin_arr) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    for (int m = lo; m < hi - 1; m++) g->nodes[members[m]].dead = 1;
    memcpy(nin_arr, in, sizeof *in * (size_t)nin);
    kn_node->in = nin_arr;
    kn_node->nin = nin;
    kn_node->op = IR_OP_KERNEL;
    kn_node->inplace = 0;
    kn_node->compute = -1;
    kn_node->loc = (ke_loc){NULL, 0}; /* its members' lines are in kn->ops */
    memset(&kn_node->a, 0, sizeof kn_node->a);
    ir_attr_set_kernel_id(&kn_node->a, idx);
    kn_node->nout = nout;
    for (int j = 0; j < nout; j++) {
        kn_node->out[j] = out[j];
        g->values[out[j]].node = last;
        g->values[out[j]].index = j;
    }
    return 0;
}

/* Replaces group G's members by kernel nodes. A group reading more than
 * IR_KERNEL_MAX_IN values is split along its members, in execution order:
 * each part takes members while its inputs fit, and the values one part
 * hands the next are materialized (written by one kernel, read by the next).
 * Only elementwise groups split (a row group's values are not all shaped
 * like its domain). Returns the number of kernels made (0: the group stays
 * as it is), or -1 on error. */
static int fuse_group(fuse_state *s, int32_t G) {
    ir_graph *g = s->g;
    int32_t *members = malloc(sizeof *members * (size_t)s->gsize[G]);
    int32_t *ends = malloc(sizeof *ends * (size_t)s->gsize[G]);
    int32_t *in = malloc(sizeof *in * (size_t)(4 * s->gsize[G] + 1));
    int n = 0, nparts = 0, rc = 0, nin, nout;
    int32_t out[KE_MAX_OUT];
    if (!members || !ends || !in) {
        rc = ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto done;
    }
    for (int32_t k = 0; k < g->nnodes; k++)
        if (s->grp[k] == G) members[n++] = k;
    char *ops = members_text(g, members, n);
    int whole = part_io(s, G, members, 0, n, in, &nin, out, &nout), nin_all = nin;
    if (whole) {
        ends[nparts++] = n;
    } else if (nin > IR_KERNEL_MAX_IN && s->grow[G]) {
        ir_note(g, "row group over %d inputs (at most %d): stays unfused: %s", nin, IR_KERNEL_MAX_IN, ops ? ops : "");
    } else if (nin <= IR_KERNEL_MAX_IN) {
        ir_note(g, "group with more than %d outputs, or an output not shaped like its domain: stays unfused: %s",
                KE_MAX_OUT, ops ? ops : "");
    } else if (nin > IR_KERNEL_MAX_IN && !s->grow[G]) {
        for (int lo = 0; lo < n;) {
            int hi = lo + 1; /* one member reads at most 4 values */
            while (hi < n) {
                part_io(s, G, members, lo, hi + 1, in, &nin, out, &nout);
                if (nin > IR_KERNEL_MAX_IN) break;
                hi++;
            }
            ends[nparts++] = hi;
            lo = hi;
        }
        for (int p = 0, lo = 0; p < nparts; lo = ends[p++])
            if (ends[p] - lo > 1 && !part_io(s, G, members, lo, ends[p], in, &nin, out, &nout)) nparts = 0;
    }
    if (nparts > 1) ir_note(g, "group over %d inputs (at most %d per kernel) split into %d parts: %s", nin_all, IR_KERNEL_MAX_IN, nparts, ops ? ops : "");
    free(ops);
    for (int p = 0, lo = 0; p < nparts && rc >= 0; lo = ends[p++]) {
        if (ends[p] - lo < 2) continue; /* one node: nothing to fuse */
        if (emit_kernel(s, G, members, lo, ends[p], in)) rc = -1;
        else rc++;
    }
done:
    free(members);
    free(ends);
    free(in);
    return rc;
}

/* KL_DEBUG_DIR: the kernels of each fused graph, in kernel IR text. */
static void dump_kernels(const ir_graph *g) {
    static _Atomic int seq;
    const char *dir = getenv("KL_DEBUG_DIR");
    if (!dir || !*dir || !g->nkernels) return;
    mkdir(dir, 0777);
    char path[1024];
    snprintf(path, sizeof path, "%s/kernels%03d.txt", dir, atomic_fetch_add(&seq, 1));
    FILE *f = fopen(path, "w");
    if (!f) return;
    for (int32_t i = 0; i < g->nkernels; i++) {
        fprintf(f, "# kernel %d\n", i);
        ir_kernel_print(g->kernels[i], f);
    }
    fclose(f);
}

int ir_pass_fuse(ir_graph *g) {
    if (!g->fuse || g->nnodes == 0) return 0;
    fuse_state s = {.g = g};
    int32_t N = g->nnodes;
    s.grp = malloc(sizeof *s.grp * (size_t)N);
    s.gsize = calloc((size_t)N, sizeof *s.gsize);
    s.gndim = calloc((size_t)N, 1);
    s.grow = calloc((size_t)N, 1);
    s.gshape = calloc((size_t)N, sizeof *s.gshape);
    s.cand = malloc(sizeof *s.cand * 8);
    int rc = (!s.grp || !s.gsize || !s.gndim || !s.grow || !s.gshape || !s.cand) ? ke_err(KL_ERR_OOM, "compile", "out of memory")
                                                                      : build_uses(&s);
    int made = 0;
    if (!rc) {
        for (int32_t k = 0; k < N; k++) s.grp[k] = -1;
        form_groups(&s);
        for (int32_t G = 0; G < N && rc >= 0; G++) {
            if (s.gsize[G] < 2 || s.grp[G] != G) continue;
            rc = fuse_group(&s, G);
            if (rc > 0) made += rc;
        }
    }
    free(s.grp);
    free(s.gsize);
    free(s.gndim);
    free(s.grow);
    free(s.gshape);
    free(s.cand);
    free(s.ustart);
    free(s.users);
    free(s.is_out);
    free(s.writes);
    if (rc < 0) return -1;
    if (made && ir_graph_compact(g)) return -1;
    dump_kernels(g);
    return made;
}

void ir_free_kernels(ir_graph *g) {
    for (int32_t i = 0; i < g->nkernels; i++) ir_kernel_free(g->kernels[i]);
    free(g->kernels);
    g->kernels = NULL;
    g->nkernels = 0;
}

int ir_clone_kernels(ir_graph *dst, const ir_graph *src) {
    if (!src->nkernels) return 0;
    dst->kernels = calloc((size_t)src->nkernels, sizeof *dst->kernels);
    if (!dst->kernels) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    dst->nkernels = src->nkernels;
    for (int32_t i = 0; i < src->nkernels; i++) dst->kernels[i] = ir_kernel_ref(src->kernels[i]);
    return 0;
}
