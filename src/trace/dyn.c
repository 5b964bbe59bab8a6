/*
 * dyn.c — dynamic sizes: one compiled graph for every value of a batch size
 * (docs/COMPILE.md "Dynamic sizes").
 *
 * A size becomes symbolic by comparison, not by symbolic shape rules: the
 * function is traced and run through every pass at the size it was called with
 * (the template, whose kernels are compiled) and at two probe sizes. The three
 * final graphs must be the same graph but for numbers; every number that
 * differs must be an affine function a*s + c of the size s (integers: shapes,
 * strides, offsets, attributes such as a reshape's or a random op's shape,
 * kernel domains and buffers; doubles: the same, or a/s + c, the 1/N of a mean
 * over the batch), fitted on two sizes and checked on the third. Anything else
 * (a graph whose structure depends on the size, a constant folded from the
 * size's data, a number that fits neither form) leaves the entry static, with
 * the reason.
 *
 * A call at another size s gets a specialised copy of the template: its
 * numbers rewritten from the fits, its kernels private copies with their
 * domains rewritten, the memory plan's slot sizes recomputed from the values
 * they hold (a slot's size is a maximum, not an affine function). Compiling
 * those kernels costs no LLVM work: a kernel's code does not depend on its
 * outermost size (cg_llvm.c's key leaves it out), so the backend finds the
 * template's code already loaded. Copies are kept per size (up to
 * TR_DYN_KEEP; beyond that a call makes one and frees it after).
 */
#include "dyn.h"

#include "log.h"

#include <math.h>
#include <stdlib.h>

/* One number of a graph, in the order walk() visits them. */
typedef struct site {
    int32_t ord;     /* index among the walk's numbers of its kind */
    uint8_t dbl;     /* a double (else an int64) */
    uint8_t recip;   /* a / s + c (else a * s + c) */
    double a, c;     /* doubles */
    int64_t ia, ic;  /* ints */
} site;

struct tr_dyn {
    int64_t s0;                /* the template's size */
    ir_graph *t;               /* the template (owned) */
    site *sites;
    int32_t nsites;
    ir_graph *inst[TR_DYN_KEEP];
    int64_t inst_s[TR_DYN_KEEP];
    int ninst;
};

/* What walk() collects: the numbers that may depend on the size (pointers, so a copy can be
 * rewritten) and those that may not (values: the structure). */
typedef struct walk_out {
    int64_t **ints;
    double **dbls;
    int64_t *fix;
    int32_t nints, ndbls, nfix, cap_ints, cap_dbls, cap_fix;
    int oom;
} walk_out;

static void *grow(void *p, int32_t *cap, size_t elem) {
    int32_t c = *cap ? *cap * 2 : 256;
    void *q = realloc(p, elem * (size_t)c);
    if (q) *cap = c;
    return q;
}
static void w_int(walk_out *w, int64_t *p) {
    if (w->nints == w->cap_ints) {
        void *q = grow(w->ints, &w->cap_ints, sizeof *w->ints);
        if (!q) { w->oom = 1; return; }
        w->ints = q;
    }
    w->ints[w->nints++] = p;
}
static void w_dbl(walk_out *w, double *p) {
    if (w->ndbls == w->cap_dbls) {
        void *q = grow(w->dbls, &w->cap_dbls, sizeof *w->dbls);
        if (!q) { w->oom = 1; return; }
        w->dbls = q;
    }
    w->dbls[w->ndbls++] = p;
}
static void w_fix(walk_out *w, int64_t v) {
    if (w->nfix == w->cap_fix) {
        void *q = grow(w->fix, &w->cap_fix, sizeof *w->fix);
        if (!q) { w->oom = 1; return; }
        w->fix = q;
    }
    w->fix[w->nfix++] = v;
}

/* Every slot, whatever the op names it (like ir_attrs_equal: the whole record, not one attribute). */
static void walk_attrs(walk_out *w, ke_attrs *a) {
    double *f = a->f;
    int64_t *in = a->i;
    for (size_t i = 0; i < sizeof a->f / sizeof *f; i++) w_dbl(w, f + i);
    for (size_t i = 0; i < sizeof a->i / sizeof *in; i++) w_int(w, in + i);
    w_fix(w, a->nlist);
    for (int i = 0; i < a->nlist && i < KE_MAX_LIST; i++) w_int(w, &a->list[i]);
}

/* Every number of g, in one fixed order. Folded constants are compared apart (same_consts). */
static void walk(walk_out *w, ir_graph *g) {
    w_fix(w, g->nvalues), w_fix(w, g->nnodes), w_fix(w, g->ninputs), w_fix(w, g->noutputs);
    w_fix(w, g->ncaptured), w_fix(w, g->nkernels), w_fix(w, g->fuse), w_fix(w, g->plan != NULL);
    for (int32_t i = 0; i < g->ninputs; i++) w_fix(w, g->inputs[i]);
    for (int32_t i = 0; i < g->noutputs; i++) w_fix(w, g->outputs[i]);
    for (int32_t i = 0; i < g->nvalues; i++) {
        ir_value *v = &g->values[i];
        w_fix(w, v->kind), w_fix(w, v->dtype), w_fix(w, v->ndim), w_fix(w, v->wrapped);
        w_fix(w, v->device.type), w_fix(w, v->device.index), w_fix(w, v->node), w_fix(w, v->index), w_fix(w, v->base);
        for (int d = 0; d < v->ndim; d++) w_int(w, &v->shape[d]), w_int(w, &v->stride[d]);
        w_int(w, &v->offset);
    }
    for (int32_t k = 0; k < g->nnodes; k++) {
        ir_node *n = &g->nodes[k];
        w_fix(w, n->op), w_fix(w, n->inplace), w_fix(w, n->dead), w_fix(w, n->compute), w_fix(w, n->nin);
        w_fix(w, n->nout), w_fix(w, n->device.type), w_fix(w, n->device.index);
        for (int i = 0; i < n->nin; i++) w_fix(w, n->in[i]);
        for (int j = 0; j < n->nout; j++) w_fix(w, n->out[j]);
        walk_attrs(w, &n->a);
    }
    for (int32_t k = 0; k < g->nkernels; k++) {
        ir_kernel *kn = g->kernels[k];
        w_fix(w, kn->ninputs), w_fix(w, kn->noutputs), w_fix(w, kn->nstmts), w_fix(w, kn->ndim), w_fix(w, kn->row);
        w_fix(w, kn->device.type), w_fix(w, kn->device.index);
        for (int d = 0; d < kn->ndim; d++) w_int(w, &kn->shape[d]);
        for (int b = 0; b < kn->ninputs + kn->noutputs; b++) {
            ir_kbuf *f = &kn->bufs[b];
            w_fix(w, f->dtype), w_fix(w, f->ndim), w_fix(w, f->output), w_fix(w, f->contig_inner), w_fix(w, f->row);
            for (int d = 0; d < f->ndim; d++) w_int(w, &f->shape[d]), w_int(w, &f->stride[d]);
            for (int d = 0; d < kn->ndim; d++) w_int(w, &f->index[d]);
        }
        for (int s = 0; s < kn->nstmts; s++) {
            ir_kstmt *st = &kn->stmts[s];
            w_fix(w, st->kind), w_fix(w, st->dtype), w_fix(w, st->compute), w_fix(w, st->row), w_fix(w, st->bcast);
            w_fix(w, st->op), w_fix(w, st->buf), w_fix(w, st->nargs);
            for (int i = 0; i < st->nargs && i < 4; i++) w_fix(w, st->args[i]);
            if (st->kind == IR_K_OP || st->kind == IR_K_REDUCE) walk_attrs(w, &st->a);
        }
    }
    if (g->plan) { /* slot sizes are recomputed for each size (respecialise_plan) */
        ir_plan *p = g->plan;
        w_fix(w, p->nvalues), w_fix(w, p->nnodes), w_fix(w, p->nslots);
        for (int32_t v = 0; v < p->nvalues; v++) w_fix(w, p->slot_of[v]), w_fix(w, p->last_use[v]);
        for (int32_t k = 0; k <= p->nnodes; k++) w_fix(w, p->drop_start[k]);
        for (int32_t i = 0; i < p->drop_start[p->nnodes]; i++) w_fix(w, p->drops[i]);
    }
}

static void walk_free(walk_out *w) {
    free(w->ints);
    free(w->dbls);
    free(w->fix);
}

/* Captured tensors: the same tensors, except folded constants, which must hold the same values. */
static int same_consts(const ir_graph *a, const ir_graph *b, char *why, size_t cap) {
    for (int32_t k = 0; k < a->nnodes; k++) {
        const ir_node *n = &a->nodes[k];
        if (n->op != IR_OP_CAPTURED || n->dead) continue;
        int32_t i = (int32_t)ir_attr_captured_index(&n->a);
        if (i >= a->ncaptured || i >= b->ncaptured) return 0;
        kl_tensor *x = a->captured[i], *y = b->captured[i];
        if (!ir_attr_captured_constant(&n->a)) {
            if (x != y) {
                snprintf(why, cap, "captured tensor %d differs between sizes", (int)i);
                return 0;
            }
            continue;
        }
        int eq = x->dtype == y->dtype && kl_equal(x, y) == 1;
        kl_clear_error();
        if (!eq) {
            snprintf(why, cap, "a constant folded at compile time depends on the size");
            return 0;
        }
    }
    return 1;
}

static int fit_int(int64_t s0, int64_t v0, int64_t s1, int64_t v1, int64_t s2, int64_t v2, site *st) {
    if ((v1 - v0) % (s1 - s0)) return 0;
    st->ia = (v1 - v0) / (s1 - s0);
    st->ic = v0 - st->ia * s0;
    return st->ia * s2 + st->ic == v2;
}

static double eval_dbl(const site *st, int64_t s) { return st->recip ? st->a / (double)s + st->c : st->a * (double)s + st->c; }

static double snap(double x) {
    double r = nearbyint(x);
    return fabs(x - r) <= 1e-9 * fmax(1.0, fabs(x)) ? r : x;
}

/* A double fitted exactly: the form must give back the three traced values bit for bit. */
static int fit_dbl(const int64_t *s, const double *v, site *st) {
    for (int recip = 0; recip < 2; recip++) {
        double x0 = recip ? 1.0 / (double)s[0] : (double)s[0], x1 = recip ? 1.0 / (double)s[1] : (double)s[1];
        st->recip = (uint8_t)recip;
        st->a = snap((v[1] - v[0]) / (x1 - x0));
        st->c = snap(v[0] - st->a * x0);
        int ok = 1;
        for (int i = 0; i < 3; i++) ok &= memcmp(&(double){eval_dbl(st, s[i])}, &v[i], sizeof(double)) == 0;
        if (ok) return 1;
    }
    return 0;
}

tr_dyn *tr_dyn_make(ir_graph *t, int64_t s0, ir_graph *p1, int64_t s1, ir_graph *p2, int64_t s2, char *why,
                    size_t cap) {
    walk_out w[3] = {{0}};
    ir_graph *gs[3] = {t, p1, p2};
    int64_t sz[3] = {s0, s1, s2};
    tr_dyn *d = NULL;
    site *sites = NULL;
    int32_t n = 0, ncap = 0;
    for (int i = 0; i < 3; i++) walk(&w[i], gs[i]);
    if (w[0].oom || w[1].oom || w[2].oom) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    for (int i = 1; i < 3; i++)
        if (w[i].nfix != w[0].nfix || memcmp(w[i].fix, w[0].fix, sizeof(int64_t) * (size_t)w[0].nfix) ||
            w[i].nints != w[0].nints || w[i].ndbls != w[0].ndbls) {
            if (ke_log_at(KE_LOG_GUARDS, KL_LOG_DEBUG)) { /* where: for whoever extends the walk */
                int32_t m = w[i].nfix < w[0].nfix ? w[i].nfix : w[0].nfix, k = 0;
                while (k < m && w[i].fix[k] == w[0].fix[k]) k++;
                ke_logl(KE_LOG_GUARDS, KL_LOG_DEBUG, "dynamic: structural number %d of %d differs (%lld vs %lld)", (int)k,
                        (int)m, k < m ? (long long)w[0].fix[k] : -1LL, k < m ? (long long)w[i].fix[k] : -1LL);
            }
            snprintf(why, cap, "the graph's structure depends on the size (traced at %lld and %lld, the graphs differ)",
                     (long long)s0, (long long)sz[i]);
            goto out;
        }
    if (!same_consts(t, p1, why, cap) || !same_consts(t, p2, why, cap)) goto out;
    for (int32_t k = 0; k < w[0].nints + w[0].ndbls; k++) {
        int dbl = k >= w[0].nints;
        int32_t ord = dbl ? k - w[0].nints : k;
        site st = {.ord = ord, .dbl = (uint8_t)dbl};
        if (!dbl) {
            int64_t v0 = *w[0].ints[ord], v1 = *w[1].ints[ord], v2 = *w[2].ints[ord];
            if (v0 == v1 && v1 == v2) continue;
            if (!fit_int(s0, v0, s1, v1, s2, v2, &st)) {
                snprintf(why, cap, "a size of the graph is not affine in the dynamic size (%lld, %lld, %lld at %lld, %lld, %lld)",
                         (long long)v0, (long long)v1, (long long)v2, (long long)s0, (long long)s1, (long long)s2);
                goto out;
            }
        } else {
            double v[3] = {*w[0].dbls[ord], *w[1].dbls[ord], *w[2].dbls[ord]};
            if (!memcmp(&v[0], &v[1], sizeof(double)) && !memcmp(&v[1], &v[2], sizeof(double))) continue;
            if (!fit_dbl(sz, v, &st)) {
                snprintf(why, cap, "a constant of the graph depends on the size in another way than a*s+c or a/s+c (%g, %g, %g)",
                         v[0], v[1], v[2]);
                goto out;
            }
        }
        if (n == ncap) {
            site *q = grow(sites, &ncap, sizeof *sites);
            if (!q) {
                ke_err(KL_ERR_OOM, "compile", "out of memory");
                goto out;
            }
            sites = q;
        }
        sites[n++] = st;
    }
    if (!(d = calloc(1, sizeof *d))) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        goto out;
    }
    d->s0 = s0;
    d->t = t;
    d->sites = sites;
    d->nsites = n;
    sites = NULL;
out:
    free(sites);
    for (int i = 0; i < 3; i++) walk_free(&w[i]);
    return d;
}

int32_t tr_dyn_nsites(const tr_dyn *d) { return d->nsites; }
int64_t tr_dyn_size(const tr_dyn *d) { return d->s0; }
ir_graph *tr_dyn_template(const tr_dyn *d) { return d->t; }
int tr_dyn_ninstances(const tr_dyn *d) { return d->ninst; }

void tr_dyn_free(tr_dyn *d) {
    if (!d) return;
    for (int i = 0; i < d->ninst; i++) ir_graph_free(d->inst[i]);
    ir_graph_free(d->t);
    free(d->sites);
    free(d);
}

/* A slot holds the largest value assigned to it. */
static void respecialise_plan(ir_graph *g) {
    ir_plan *p = g->plan;
    if (!p) return;
    for (int32_t s = 0; s < p->nslots; s++) p->slot_bytes[s] = 0;
    p->value_bytes = p->slot_total = 0;
    for (int32_t v = 0; v < p->nvalues && v < g->nvalues; v++) {
        int32_t s = p->slot_of[v];
        if (s < 0) continue;
        const ir_value *x = &g->values[v];
        int64_t b = ke_numel(x->ndim, x->shape) * (int64_t)ke_dtypes[x->dtype].size;
        p->value_bytes += b;
        if (b > p->slot_bytes[s]) p->slot_bytes[s] = b;
    }
    for (int32_t s = 0; s < p->nslots; s++) p->slot_total += p->slot_bytes[s];
}

/* 1 if kernels a (the template's) and b (its copy at another size) can share code: they
 * differ at most in the outermost size of the domain and of the buffers shaped like it. */
static int same_code(const ir_kernel *a, const ir_kernel *b) {
    if (!ir_kernel_outer_free(a) || !ir_kernel_outer_free(b)) return 0;
    for (int d = 1; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    for (int i = 0; i < a->ninputs + a->noutputs; i++) {
        const ir_kbuf *x = &a->bufs[i], *y = &b->bufs[i];
        if (memcmp(x->index, y->index, sizeof(int64_t) * a->ndim)) return 0;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d] && !(d == 0 && x->ndim == a->ndim && x->shape[0] == a->shape[0] &&
                                               y->shape[0] == b->shape[0]))
                return 0;
    }
    return 1;
}

ir_graph *tr_dyn_specialise(const tr_dyn *d, int64_t s, const ir_backend *cpu) {
    ir_graph *g = ir_graph_clone(d->t);
    if (!g) return NULL;
    for (int32_t k = 0; k < g->nkernels; k++) { /* private kernels: their sizes change */
        ir_kernel *c = ir_kernel_copy(g->kernels[k]);
        if (!c) {
            ir_graph_free(g);
            return NULL;
        }
        ir_kernel_free(g->kernels[k]);
        g->kernels[k] = c;
    }
    walk_out w = {0};
    walk(&w, g);
    if (w.oom) {
        walk_free(&w);
        ir_graph_free(g);
        ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        return NULL;
    }
    for (int32_t i = 0; i < d->nsites; i++) {
        const site *st = &d->sites[i];
        if (st->dbl) *w.dbls[st->ord] = eval_dbl(st, s);
        else *w.ints[st->ord] = st->ia * s + st->ic;
    }
    walk_free(&w);
    respecialise_plan(g);
    kl_init(); /* the backend registry */
    for (int32_t k = 0; k < g->nkernels; k++) {
        ir_kernel *kn = g->kernels[k];
        const ir_backend *b = kn->device.type == KL_CPU && cpu ? cpu : ir_backend_for_device(kn->device.type);
        /* A kernel whose code depends on the size (its reduced row or strides are the size)
         * would need a fresh backend compile per size: the interpreter runs it instead. */
        if (b && kn->device.type == KL_CPU && !same_code(d->t->kernels[k], kn)) b = &ir_interp_backend;
        int bad = !b;
        if (b && b != &ir_interp_backend && !atomic_load(&d->t->kernels[k]->handle) && d->t->kernels[k]->interim)
            bad = ir_kernel_interpret_meanwhile(kn, b) < 0; /* compiled by tr_dyn_compile_pending */
        else if (b)
            bad = ir_kernel_compile(kn, b) != 0;
        if (bad) {
            ir_graph_free(g);
            return NULL;
        }
    }
    return g;
}

int tr_dyn_compile_pending(tr_dyn *d, const ir_backend *cpu) {
    int rc = 0;
    for (int i = 0; i < d->ninst; i++)
        for (int32_t k = 0; k < d->inst[i]->nkernels; k++) {
            ir_kernel *kn = d->inst[i]->kernels[k];
            if (atomic_load(&kn->handle) || !kn->interim) continue;
            const ir_backend *b = kn->device.type == KL_CPU && cpu ? cpu : ir_backend_for_device(kn->device.type);
            if (!b || ir_kernel_compile(kn, b)) rc = -1;
        }
    return rc;
}

ir_graph *tr_dyn_graph(tr_dyn *d, int64_t s, const ir_backend *cpu, int *transient) {
    *transient = 0;
    if (s == d->s0) return d->t;
    for (int i = 0; i < d->ninst; i++)
        if (d->inst_s[i] == s) return d->inst[i];
    ir_graph *g = tr_dyn_specialise(d, s, cpu);
    if (!g) return NULL;
    if (d->ninst == TR_DYN_KEEP) {
        *transient = 1;
        return g;
    }
    d->inst[d->ninst] = g;
    d->inst_s[d->ninst++] = s;
    return g;
}
