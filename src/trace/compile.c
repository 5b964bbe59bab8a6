/*
 * compile.c — kl_compile: the compiled-function object, its guards and cache,
 * eager fallbacks, KL_COMPILE / KL_COMPILE_CHECK, and statistics.
 *
 * A cache entry is keyed by a guard: per input dtype, shape, device,
 * requires_grad and either "contiguous" or the exact strides; plus grad mode.
 * The mode and options are fixed per kl_fn, so they need no guard. A miss
 * traces (up to recompile_limit signatures, then eager with one warning); a
 * trace that breaks on a data-dependent op marks its signature eager.
 *
 * This is also where kernels meet a backend: after the last pass, every
 * kernel of the graph is compiled by the backend chosen for its device from
 * the registry (kernel.h): the options' or $KL_CPU_BACKEND's CPU backend by
 * name, else each device's default.
 */
#include "trace.h"
#include "aot.h"
#include "dyn.h"
#include "kernel.h"

#include "log.h"
#include "profiler.h"
#include "philox.h"
#include "threadpool.h"

#include <math.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

typedef struct tr_guard {
    uint8_t dtype, ndim, requires_grad, contig;
    kl_device device;
    int64_t shape[KL_MAX_DIMS];
    int64_t stride[KL_MAX_DIMS];
    int32_t alias;            /* the first earlier input sharing this one's storage, or -1: a
                                 functionalized graph assumes the same sharing */
    uint8_t dynmask;          /* bit d: dim d is the entry's dynamic size s (equal in every input
                                 that has such a dim, s >= 2; shape[d] holds the traced size) */
} tr_guard;

typedef struct tr_entry {
    tr_guard *in;
    uint8_t grad_mode;
    uint8_t eager;            /* the trace broke: run this signature eagerly */
    ir_graph *g;              /* with aot: the compiled forward */
    tr_aot *aot;              /* differentiable: forward + backward graphs, one autograd node per call */
    uint8_t *cap_rg;          /* per captured tensor of g: required grad at the trace (grad mode on) */
    int32_t ncap;
    double ms[4];             /* compile time per phase: trace, passes, codegen, of which LLVM (kl_fn_explain) */
    char *why;                /* why it was traced: "first call" or the guard that failed */
    char *broke;              /* the trace break, if any */
    tr_dyn *dyn;              /* dynamic: g is its template, specialised per size (dyn.c) */
    char *static_why;         /* dynamic sizes were asked for and refused: why */
    ir_graph *traced;         /* KL_COMPILE_CHECK: g as traced, before the passes (the minifier's) */
    struct tr_async *job;     /* tiered: g's kernels compiling in the background (calls run eagerly) */
    char *async_why;          /* the background compile failed: the signature runs eagerly, this is why */
} tr_entry;

struct kl_fn {
    kl_traceable fn;
    void *user;
    kl_compile_options o;
    int n_in, n_out;          /* fixed by the first call: cached graphs write n_out outputs */
    tr_entry *entries;        /* [o.recompile_limit] */
    int nentries;
    int warned_limit;
    int last;                 /* entry of the most recent call */
    uint8_t env_eager;        /* KL_COMPILE=0 when the function was compiled */
    uint8_t env_check;        /* KL_COMPILE_CHECK=1 when the function was compiled */
    uint8_t async;            /* tiered execution: options.async, or $KL_COMPILE_ASYNC when set */
    int8_t interp;            /* interpreter tier: 1 on, 0 off, -1 the default (off: interp_tier_on) */
    const ir_backend *cpu;    /* CPU kernels' backend (options or $KL_CPU_BACKEND); NULL: the default */
    pthread_mutex_t lock;
    kl_fn_stats st;
};

kl_compile_options kl_compile_options_default(void) {
    return (kl_compile_options){.mode = KL_COMPILE_FUSE, .recompile_limit = 8, .name = "fn", .auto_dynamic = 1};
}

static int env_flag(const char *name, int dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    return strcmp(e, "0") != 0;
}

kl_fn *kl_compile(kl_traceable fn, void *user, const kl_compile_options *opts) {
    if (!fn) {
        ke_err(KL_ERR_NULL_ARG, "compile", "fn is NULL");
        return NULL;
    }
    kl_compile_options o = opts ? *opts : kl_compile_options_default();
    if ((unsigned)o.mode > KL_COMPILE_FUSE) {
        ke_err(KL_ERR_ARG, "compile", "unknown mode %d", (int)o.mode);
        return NULL;
    }
    if (o.recompile_limit < 1 || o.recompile_limit > 1024) {
        ke_err(KL_ERR_ARG, "compile", "recompile_limit must be in [1, 1024], got %d", o.recompile_limit);
        return NULL;
    }
    if (!o.name) o.name = "fn";
    kl_init(); /* the backend registry */
    const ir_backend *cpu = NULL;
    const char *want = o.backend ? o.backend : getenv("KL_CPU_BACKEND");
    if (want && *want) {
        if (!(cpu = ir_backend_by_name(want))) return NULL;
        if (cpu->device != KL_CPU) {
            ke_err(KL_ERR_ARG, "compile", "backend \"%s\" does not run CPU kernels", want);
            return NULL;
        }
        if (o.backend) o.backend = cpu->name; /* kept as the backend's own (static) name */
    }
    if (o.mode == KL_COMPILE_FUSE) { /* the backend's one-time setup overlaps the first trace */
        ke_error_stash st;
        ke_error_set_aside(&st);
        const ir_backend *b = cpu ? cpu : ir_backend_for_device(KL_CPU);
        if (b && b->prepare) b->prepare();
        kl_clear_error();
        ke_error_put_back(&st);
    }
    kl_fn *f = calloc(1, sizeof *f);
    if (f) f->entries = calloc((size_t)o.recompile_limit, sizeof *f->entries);
    /* the options are borrowed: the caller may free its name right after */
    char *name = f ? strdup(o.name) : NULL;
    if (!f || !f->entries || !name) {
        free(name);
        if (f) free(f->entries);
        free(f);
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    f->fn = fn;
    f->user = user;
    f->o = o;
    f->o.name = name;
    f->cpu = cpu;
    f->n_in = f->n_out = -1;
    f->last = -1;
    /* Read here, not per call: getenv was a visible share of a cache hit. */
    f->env_eager = !env_flag("KL_COMPILE", 1);
    f->env_check = (uint8_t)env_flag("KL_COMPILE_CHECK", 0) && !tr_in_repro;
    f->async = (uint8_t)env_flag("KL_COMPILE_ASYNC", o.async != 0);
    f->interp = (int8_t)env_flag("KL_COMPILE_INTERP", o.interp_tier > 0 ? 1 : o.interp_tier < 0 ? 0 : -1);
    pthread_mutex_init(&f->lock, NULL);
    return f;
}

typedef struct tr_async tr_async;
static void async_cancel(tr_async *j);

void kl_fn_release(kl_fn *f) {
    if (!f) return;
    for (int i = 0; i < f->nentries; i++) {
        if (f->entries[i].job) async_cancel(f->entries[i].job); /* before its graph goes */
        free(f->entries[i].async_why);
        free(f->entries[i].in);
        free(f->entries[i].why);
        free(f->entries[i].broke);
        free(f->entries[i].cap_rg);
        free(f->entries[i].static_why);
        if (f->entries[i].dyn) tr_dyn_free(f->entries[i].dyn); /* owns g */
        else ir_graph_free(f->entries[i].g);
        ir_graph_free(f->entries[i].traced);
        tr_aot_release(f->entries[i].aot);
    }
    free(f->entries);
    free((char *)f->o.name);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* ---- guards ------------------------------------------------------------------------ */

static void guard_of(const kl_tensor *t, tr_guard *gd) {
    memset(gd, 0, sizeof *gd);
    gd->dtype = t->dtype;
    gd->ndim = t->ndim;
    gd->device = t->storage->device;
    gd->requires_grad = (t->keys & KE_KS(KE_KEY_AUTOGRAD)) != 0;
    gd->contig = (uint8_t)ke_is_contig(t);
    memcpy(gd->shape, t->shape, sizeof(int64_t) * t->ndim);
    if (!gd->contig) memcpy(gd->stride, t->stride, sizeof(int64_t) * t->ndim);
}

/* alias[i] = the first earlier input sharing input i's storage, or -1, for
 * all n inputs at once: a pairwise scan per input and entry made the guard
 * check quadratic in the number of inputs (16 inputs: 180-191 ns a call, 138
 * with the table; bench/compile_bench). Open addressing over the storage
 * pointers, in a table of at least 2n slots (on the stack up to 128 inputs). */
#define TR_ALIAS_STACK 64
static int aliases_of(kl_tensor *const *in, int n, int32_t *alias) {
    if (n <= 8) { /* pairwise is cheaper than clearing a table */
        for (int i = 0; i < n; i++) {
            alias[i] = -1;
            for (int j = 0; j < i && alias[i] < 0; j++)
                if (in[j]->storage == in[i]->storage) alias[i] = j;
        }
        return 0;
    }
    int cap = 16;
    while (cap < 2 * n) cap *= 2;
    int32_t stack_tab[4 * TR_ALIAS_STACK], *tab = stack_tab;
    if (cap > 4 * TR_ALIAS_STACK && !(tab = malloc(sizeof *tab * (size_t)cap)))
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int s = 0; s < cap; s++) tab[s] = -1;
    for (int i = 0; i < n; i++) {
        const void *st = in[i]->storage;
        uint64_t h = (uint64_t)(uintptr_t)st * 0x9E3779B97F4A7C15u;
        size_t s = (size_t)(h >> 40) & (size_t)(cap - 1);
        while (tab[s] >= 0 && in[tab[s]]->storage != st) s = (s + 1) & (size_t)(cap - 1);
        alias[i] = tab[s];
        if (tab[s] < 0) tab[s] = i;
    }
    if (tab != stack_tab) free(tab);
    return 0;
}

/* 1 if t's shape (ndim already equal) is not what gd's dynamic dims admit: the traced
 * shape, with the dynamic dims equal to *s (the first one seen sets it) and s >= 2. Out of
 * line: static entries' guards only test gd->dynmask. */
__attribute__((noinline)) static int dyn_shape_differs(const tr_guard *gd, const kl_tensor *t, int64_t *s) {
    for (int d = 0; d < t->ndim; d++) {
        if (!(gd->dynmask >> d & 1)) {
            if (gd->shape[d] != t->shape[d]) return 1;
            continue;
        }
        if (*s < 0) *s = t->shape[d];
        if (t->shape[d] != *s || *s < 2) return 1;
    }
    return 0;
}

/* The first guard that fails, described into why; 0 if e matches. */
static int guard_check(const tr_entry *e, kl_tensor *const *in, const int32_t *alias, int n, int grad_mode, char *why,
                       size_t cap) {
    if (e->grad_mode != grad_mode) {
        if (why) snprintf(why, cap, "grad mode changed to %s", grad_mode ? "on" : "off");
        return 1;
    }
    int64_t s = -1;
    for (int i = 0; i < n; i++) {
        const tr_guard *gd = &e->in[i];
        const kl_tensor *t = in[i];
        int bad = gd->dtype != t->dtype || gd->ndim != t->ndim || gd->device.type != t->storage->device.type ||
                  gd->device.index != t->storage->device.index ||
                  gd->requires_grad != ((t->keys & KE_KS(KE_KEY_AUTOGRAD)) != 0) ||
                  (gd->dynmask ? dyn_shape_differs(gd, t, &s) : memcmp(gd->shape, t->shape, sizeof(int64_t) * t->ndim) != 0);
        if (!bad) bad = gd->contig ? !ke_is_contig(t) : memcmp(gd->stride, t->stride, sizeof(int64_t) * t->ndim) != 0;
        if (!bad) {
            int32_t a = alias[i];
            if (a != gd->alias) {
                if (why && a >= 0) snprintf(why, cap, "input %d now shares storage with input %d", i + 1, a + 1);
                else if (why) snprintf(why, cap, "input %d no longer shares storage with input %d", i + 1, gd->alias + 1);
                return 1;
            }
        }
        if (bad && why && gd->dynmask && gd->dtype == t->dtype && gd->ndim == t->ndim) {
            for (int d = 0; d < t->ndim; d++)
                if (gd->dynmask >> d & 1 && (t->shape[d] != s || s < 2)) {
                    if (s < 2)
                        snprintf(why, cap, "input %d dim %d is %lld: the dynamic size serves 2 and more (0 and 1 are "
                                 "specialised)", i + 1, d, (long long)s);
                    else
                        snprintf(why, cap, "input %d dim %d is %lld, not the dynamic size s = %lld of the other inputs",
                                 i + 1, d, (long long)t->shape[d], (long long)s);
                    return 1;
                }
        }
        if (bad) {
            if (why) {
                char b1[200], b2[256];
                snprintf(why, cap, "input %d changed from %s %s%s%s to %s%s%s", i + 1,
                         ke_fmt_shape(b1, sizeof b1, gd->ndim, gd->shape), ke_dtypes[gd->dtype].name,
                         gd->contig ? "" : " (strided)", gd->requires_grad ? " requiring grad" : "",
                         ke_fmt_tensor(b2, sizeof b2, t), ke_is_contig(t) ? "" : " (strided)",
                         (t->keys & KE_KS(KE_KEY_AUTOGRAD)) ? " requiring grad" : "");
            }
            return 1;
        }
    }
    /* What the graph was built for also depends on its captured tensors: one that
     * starts or stops requiring grad changes whether (and what) autograd records. */
    for (int32_t i = 0; grad_mode && e->g && i < e->ncap; i++) {
        const kl_tensor *t = e->g->captured[i];
        if (e->cap_rg[i] != ((t->keys & KE_KS(KE_KEY_AUTOGRAD)) != 0)) {
            char b[200];
            if (why)
                snprintf(why, cap, "captured tensor %s %s requires grad", ke_fmt_tensor(b, sizeof b, t),
                         e->cap_rg[i] ? "no longer" : "now");
            return 1;
        }
    }
    if (e->aot && tr_aot_guard(e->aot, why, cap)) return 1;
    return 0;
}

/* The guards of e, one line each, into a malloc'd string (NULL if out of memory). */
static char *guards_text(const tr_entry *e, int n_in) {
    size_t cap = 128 + (size_t)n_in * 400, used = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    used += (size_t)snprintf(buf + used, cap - used, "grad mode %s\n", e->grad_mode ? "on" : "off");
    for (int i = 0; i < n_in; i++) {
        const tr_guard *gd = &e->in[i];
        char sh[200], st[200] = "contiguous";
        ke_fmt_shape(sh, sizeof sh, gd->ndim, gd->shape);
        if (gd->dynmask) { /* "[s,64]": the dynamic dims by name */
            size_t u = (size_t)snprintf(sh, sizeof sh, "[");
            for (int d = 0; d < gd->ndim && u < sizeof sh; d++)
                u += (gd->dynmask >> d & 1) ? (size_t)snprintf(sh + u, sizeof sh - u, "%ss", d ? "," : "")
                                            : (size_t)snprintf(sh + u, sizeof sh - u, "%s%lld", d ? "," : "",
                                                               (long long)gd->shape[d]);
            if (u < sizeof sh) snprintf(sh + u, sizeof sh - u, "]");
        }
        if (!gd->contig) {
            strcpy(st, "strides ");
            ke_fmt_shape(st + 8, sizeof st - 8, gd->ndim, gd->stride);
        }
        used += (size_t)snprintf(buf + used, cap - used, "input %d: %s%s, %s, %s%s", i + 1, ke_dtypes[gd->dtype].short_name,
                                 sh, st, ke_device_name(gd->device), gd->requires_grad ? ", requires grad" : "");
        if (gd->alias >= 0) used += (size_t)snprintf(buf + used, cap - used, ", shares storage with input %d", gd->alias + 1);
        used += (size_t)snprintf(buf + used, cap - used, "\n");
    }
    if (used && buf[used - 1] == '\n') buf[used - 1] = 0;
    return buf;
}

/* ---- check mode ------------------------------------------------------------------- */

double tr_tolerance(kl_dtype dt) {
    switch (dt) {
    case KL_F64: return 1e-9;
    case KL_F32: return 1e-4;
    case KL_F16: return 1e-2;
    case KL_BF16: return 5e-2;
    default: return 0;
    }
}

int tr_same_values(kl_tensor *a, kl_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim))
        return 0;
    double tol = tr_tolerance((kl_dtype)a->dtype);
    kl_no_grad_begin();
    int r = kl_allclose(kl_to_dtype(a, KL_F64), kl_to_dtype(b, KL_F64), tol, tol, true);
    kl_no_grad_end();
    return r == 1;
}

/* KL_COMPILE_CHECK: fn eagerly on clones of the inputs; outputs and the
 * inputs' final values (in-place writes) must agree with the compiled run. */
static int check_against_eager(kl_fn *f, kl_tensor *const *in, int n_in, kl_tensor *const *before,
                               kl_tensor *const *outs, int n_out) {
    int rc = 0;
    kl_scope_begin();
    kl_tensor **copies = calloc((size_t)n_in + 1, sizeof *copies);
    kl_tensor **eouts = calloc((size_t)n_out + 1, sizeof *eouts);
    if (!copies || !eouts) rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    kl_no_grad_begin();
    for (int i = 0; i < n_in && !rc; i++) rc = !(copies[i] = kl_clone(before[i]));
    kl_no_grad_end();
    if (!rc) rc = f->fn(f->user, copies, n_in, eouts, n_out);
    for (int j = 0; j < n_out && !rc; j++)
        if (!eouts[j] || !tr_same_values(outs[j], eouts[j]))
            rc = ke_err(KL_ERR_STATE, "fn_call",
                        "KL_COMPILE_CHECK: %s: compiled output %d differs from eager beyond the %s tolerance",
                        f->o.name, j + 1, ke_dtypes[outs[j]->dtype].name);
    for (int i = 0; i < n_in && !rc; i++)
        if (!tr_same_values(in[i], copies[i]))
            rc = ke_err(KL_ERR_STATE, "fn_call",
                        "KL_COMPILE_CHECK: %s: input %d after the compiled call differs from eager", f->o.name, i + 1);
    free(copies);
    free(eouts);
    kl_scope_end();
    return rc ? -1 : 0;
}

int tr_fn_dump_kernels(const kl_fn *f, const char *dir) {
    return f->last < 0 || !f->entries[f->last].g ? 0 : tr_dump_kernels(f->entries[f->last].g, dir);
}

/* ---- calls ----------------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int run_eager(kl_fn *f, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    pthread_mutex_lock(&f->lock);
    f->st.eager_calls++;
    pthread_mutex_unlock(&f->lock);
    int rc = f->fn(f->user, in, n_in, out, n_out);
    if (rc == 0 && ke_error_pending()) rc = -1;
    return rc;
}

/* Fused kernels run outside the dispatcher, so autograd would not record
 * them: a graph whose inputs or captured tensors require grad (with grad
 * mode on) runs op by op. */
static int needs_autograd(const ir_graph *g, kl_tensor *const *in, int n_in, int grad_mode) {
    if (!grad_mode) return 0;
    for (int i = 0; i < n_in; i++)
        if (in[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) return 1;
    for (int i = 0; i < g->ncaptured; i++)
        if (g->captured[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) return 1;
    return 0;
}

/* Kernels of backends that compile concurrently, spread over the thread pool:
 * each thread claims the next kernel (one slow kernel does not hold up a
 * fixed share of the others); the first error stops the rest and is handed to
 * the calling thread; the LLVM time the helpers spent joins the caller's. */
typedef struct par_compile {
    ir_graph *g;
    const ir_backend *cpu;
    const _Atomic int *cancel; /* set: stop before the next kernel (tiered compile of a released function) */
    const int32_t *order;      /* the kernels to claim, in claim order (compile_order) */
    int32_t n;
    _Atomic int32_t next;
    _Atomic int failed;
    pthread_mutex_t mu; /* err, llvm_ms */
    ke_error_stash err;
    double llvm_ms;
} par_compile;

static const ir_backend *backend_of(const ir_kernel *k, const ir_backend *cpu) {
    return k->device.type == KL_CPU && cpu ? cpu : ir_backend_for_device(k->device.type);
}

static void par_compile_range(void *ctx, int64_t begin, int64_t end) {
    (void)begin, (void)end; /* one range per thread; kernels are claimed one by one */
    par_compile *p = ctx;
    double l0 = ir_backend_llvm_ms();
    for (;;) {
        int32_t at = atomic_fetch_add(&p->next, 1);
        if (at >= p->n || atomic_load(&p->failed)) break;
        int32_t i = p->order[at];
        if (p->cancel && atomic_load(p->cancel)) {
            pthread_mutex_lock(&p->mu);
            if (!atomic_exchange(&p->failed, 1)) {
                ke_err(KL_ERR_STATE, "compile", "the background compile was cancelled");
                ke_error_set_aside(&p->err);
            }
            pthread_mutex_unlock(&p->mu);
            break;
        }
        ir_kernel *k = p->g->kernels[i];
        const ir_backend *b = backend_of(k, p->cpu);
        if (ir_kernel_compile(k, b)) {
            pthread_mutex_lock(&p->mu);
            if (!atomic_exchange(&p->failed, 1)) ke_error_set_aside(&p->err);
            pthread_mutex_unlock(&p->mu);
            kl_clear_error();
            break;
        }
    }
    pthread_mutex_lock(&p->mu);
    p->llvm_ms += ir_backend_llvm_ms() - l0;
    pthread_mutex_unlock(&p->mu);
}

/* The kernels whose backend compiles groups (NVRTC: one program for all of a
 * graph's CUDA kernels, so its fixed cost per program is paid once), one
 * group per backend and device. */
static int compile_groups(ir_graph *g, const ir_backend *cpu) {
    ir_kernel **ks = malloc(sizeof *ks * (size_t)g->nkernels);
    uint8_t *done = calloc((size_t)g->nkernels, 1);
    int rc = !ks || !done ? ke_err(KL_ERR_OOM, "compile", "out of memory") : 0;
    for (int32_t i = 0; i < g->nkernels && !rc; i++) {
        const ir_backend *b = backend_of(g->kernels[i], cpu);
        if (done[i] || b->concurrent || !b->compile_group) continue;
        int n = 0;
        for (int32_t j = i; j < g->nkernels; j++) {
            ir_kernel *k = g->kernels[j];
            if (done[j] || backend_of(k, cpu) != b || k->device.type != g->kernels[i]->device.type ||
                k->device.index != g->kernels[i]->device.index)
                continue;
            done[j] = 1;
            ks[n++] = k;
        }
        rc = ir_kernels_compile(ks, n, b);
    }
    free(ks);
    free(done);
    return rc ? -1 : 0;
}

/* A kernel's compile cost, roughly (for the claim order): its statements, a row kernel's
 * counted twice (several loops per row, each vectorized on its own). */
static int64_t compile_cost(const ir_kernel *k) { return (int64_t)k->nstmts * (k->row ? 2 : 1); }

typedef struct order_item {
    int32_t i;
    int32_t dup;   /* the same kernel as an earlier one (compiles once; the copy waits or shares) */
    int32_t twins; /* copies of it later in the graph */
    int64_t cost;
} order_item;
static int order_cmp(const void *a_, const void *b_) {
    const order_item *a = a_, *b = b_;
    if (a->dup != b->dup) return a->dup - b->dup;
    if (!a->twins != !b->twins) return b->twins ? 1 : -1;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    return a->i - b->i;
}

/* The order in which the threads claim g's n concurrent kernels (ids[0..n)): the most
 * expensive first, so that the last one to finish is a small one (with 6 kernels on 2
 * threads, the order decided how long the second thread sat idle); but a kernel that
 * is the same as an earlier one (printed alike: the digits step's GELU backward of both
 * hidden layers) last, and the one it copies before the others, so that the copy finds
 * its code loaded (claimed at once, the two would run side by side and one thread wait
 * for the other: the LLVM backend compiles a key once). Returns a malloc'd array, or
 * NULL (then graph order). */
static int32_t *compile_order(const ir_graph *g, const int32_t *ids, int32_t n) {
    order_item *it = malloc(sizeof *it * (size_t)n);
    char **txt = calloc((size_t)n, sizeof *txt);
    int32_t *order = malloc(sizeof *order * (size_t)n);
    if (!it || !txt || !order) {
        free(it), free(txt), free(order);
        return NULL;
    }
    for (int32_t a = 0; a < n; a++) {
        const ir_kernel *k = g->kernels[ids[a]];
        it[a] = (order_item){.i = ids[a], .cost = compile_cost(k)};
        txt[a] = ir_kernel_to_string(k);
        for (int32_t b = 0; b < a && txt[a]; b++)
            if (!it[b].dup && txt[b] && !strcmp(txt[a], txt[b])) {
                it[a].dup = 1;
                it[b].twins++;
                break;
            }
    }
    kl_clear_error(); /* a kernel that could not be printed is just not matched */
    qsort(it, (size_t)n, sizeof *it, order_cmp);
    for (int32_t a = 0; a < n; a++) {
        order[a] = it[a].i;
        free(txt[a]);
    }
    free(it);
    free(txt);
    return order;
}

/* Whether a new entry of f runs its kernels on the interpreter until they are compiled:
 * options / $KL_COMPILE_INTERP, else the default (docs/COMPILE.md "Interpreter tier"): on
 * with two threads or more; with one the background compile would only get what the calls
 * leave of the one core, and a loop of calls would run interpreted for many times the
 * compile's time. The thread count is read when the signature is traced. Off under
 * KL_COMPILE_CHECK. */
static int interp_tier_on(const kl_fn *f) {
    if (f->interp >= 0) return f->interp;
    /* KL_COMPILE_CHECK and its minifier judge the compiled code: interpreted kernels would
     * hide the mismatch they look for */
    return kl_get_num_threads() >= 2 && !f->env_check && !tr_in_repro;
}

/* Interpreter tier: each concurrent-backend kernel of g gets its code at once if that costs no
 * compile (loaded already, disk cache), else runs on the interpreter until the background
 * compile publishes its handle. 1 if some kernel waits for a compile, 0 if none, -1 on error. */
static int interpret_meanwhile(ir_graph *g, const ir_backend *cpu) {
    int pending = 0;
    for (int32_t i = 0; i < g->nkernels; i++) {
        int r = ir_kernel_interpret_meanwhile(g->kernels[i], backend_of(g->kernels[i], cpu));
        if (r < 0) return -1;
        pending |= r;
    }
    return pending;
}

/* spare: threads left to the callers (tiered compiles leave one, so a call running eagerly
 * meanwhile keeps a core: with two threads a background compile on both made an eager
 * digits step wait ~100 ms for OpenBLAS's starved helper). */
static int compile_kernels(ir_graph *g, const ir_backend *cpu, const _Atomic int *cancel, int spare) {
    kl_init(); /* the backend registry */
    int nconc = 0, ngroup = 0;
    for (int32_t i = 0; i < g->nkernels; i++) {
        ir_kernel *k = g->kernels[i];
        const ir_backend *b = backend_of(k, cpu);
        if (!b) return -1;
        if (b->concurrent && !k->handle) nconc++;
        else if (b->compile_group) ngroup++; /* below, with the other kernels of its backend */
        else if (ir_kernel_compile(k, b)) return -1;
    }
    if (ngroup && compile_groups(g, cpu)) return -1;
    if (!nconc) return 0;
    int threads = kl_get_num_threads() - spare;
    int32_t *ids = malloc(sizeof *ids * (size_t)nconc);
    if (!ids) return ke_err(KL_ERR_OOM, "compile", "out of memory");
    int32_t n = 0;
    for (int32_t i = 0; i < g->nkernels; i++) {
        const ir_backend *b = backend_of(g->kernels[i], cpu);
        if (b->concurrent && !g->kernels[i]->handle) ids[n++] = i;
    }
    int32_t *order = threads > 1 && n > 1 ? compile_order(g, ids, n) : NULL;
    par_compile p = {.g = g, .cpu = cpu, .cancel = cancel, .order = order ? order : ids, .n = n};
    pthread_mutex_init(&p.mu, NULL);
    double l0 = ir_backend_llvm_ms();
    /* n = threads, grain 1: one range per thread (inline, i.e. serial, with one
     * thread, inside a parallel region or while another thread uses the pool) */
    if (threads > 1 && nconc > 1) ke_parallel_for(threads < nconc ? threads : nconc, 1, par_compile_range, &p);
    else par_compile_range(&p, 0, 1);
    pthread_mutex_destroy(&p.mu);
    free(order);
    free(ids);
    /* the caller's own share is in its running total already */
    ir_backend_add_llvm_ms(p.llvm_ms - (ir_backend_llvm_ms() - l0));
    if (atomic_load(&p.failed)) {
        ke_error_put_back(&p.err);
        return -1;
    }
    return 0;
}

int tr_compile_kernels(ir_graph *g, const ir_backend *cpu) { return compile_kernels(g, cpu, NULL, 0); }

/* ---- tiered execution (KL_COMPILE_ASYNC) -------------------------------------------------
 * A new signature's kernels compile on a detached thread of their own while its calls run
 * fn eagerly; the first call that finds them done switches the entry to the compiled graph
 * (async_finish). A job is never freed under its thread: the thread's last touch of it is
 * the state change, made under jobs_mu, and whoever frees it waits for that under jobs_mu.
 * kl_fn_release cancels (the compile stops before its next kernel) and waits; at exit every
 * job is cancelled and waited for by a handler registered after the LLVM backend's own
 * (kl_compile's prepare registers that first), so it runs before the JIT goes. */
struct tr_async {
    ir_graph *g;
    const ir_backend *cpu;
    int interp;        /* the interpreter tier: calls run g meanwhile (its kernels interpreted) */
    int forked;        /* this is a forked child: the compiling thread stayed in the parent */
    _Atomic int state; /* 0 compiling, 1 compiled, -1 failed or cancelled */
    _Atomic int cancel;
    double ms, llvm_ms; /* the compile's wall time, and LLVM's share summed over its threads */
    ke_error_stash err;
    struct tr_async *prev, *next; /* live jobs, under jobs_mu */
};

static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static tr_async *jobs;

static void *async_main(void *p) {
    tr_async *j = p;
    /* the calls running eagerly meanwhile keep the cores: a compile at the same priority
     * took half of them (with two threads the first eager digits step took 23 ms, not 0.7) */
    ke_thread_background();
    double t0 = now_ms(), l0 = ir_backend_llvm_ms();
    int rc = compile_kernels(j->g, j->cpu, &j->cancel, 1);
    j->ms = now_ms() - t0;
    j->llvm_ms = ir_backend_llvm_ms() - l0;
    if (rc) ke_error_set_aside(&j->err);
    pthread_mutex_lock(&jobs_mu);
    atomic_store(&j->state, rc ? -1 : 1);
    pthread_cond_broadcast(&jobs_cv);
    pthread_mutex_unlock(&jobs_mu); /* j is not touched after this */
    kl_clear_error();
    return NULL;
}

static void jobs_at_exit(void) {
    pthread_mutex_lock(&jobs_mu);
    for (tr_async *j = jobs; j; j = j->next) atomic_store(&j->cancel, 1);
    for (;;) {
        int busy = 0;
        for (tr_async *j = jobs; j; j = j->next) busy |= atomic_load(&j->state) == 0;
        if (!busy) break;
        pthread_cond_wait(&jobs_cv, &jobs_mu);
    }
    pthread_mutex_unlock(&jobs_mu);
}
/* fork: the compiling threads stay in the parent; in the child their jobs are over (failed:
 * an interpreter-tier entry keeps interpreting the kernels not compiled yet, an eager-tier
 * one runs eagerly), so neither its calls nor its exit wait for them. */
static void jobs_fork_prepare(void) { pthread_mutex_lock(&jobs_mu); }
static void jobs_fork_parent(void) { pthread_mutex_unlock(&jobs_mu); }
static void jobs_fork_child(void) {
    for (tr_async *j = jobs; j; j = j->next)
        if (atomic_load(&j->state) == 0) {
            j->forked = 1;
            atomic_store(&j->state, -1);
        }
    pthread_mutex_init(&jobs_mu, NULL);
    pthread_cond_init(&jobs_cv, NULL);
}
static void register_jobs_at_exit(void) {
    atexit(jobs_at_exit);
    pthread_atfork(jobs_fork_prepare, jobs_fork_parent, jobs_fork_child);
}

/* Waits for j's thread to be done with it and unlinks it; its state. */
static int async_wait(tr_async *j) {
    pthread_mutex_lock(&jobs_mu);
    while (atomic_load(&j->state) == 0) pthread_cond_wait(&jobs_cv, &jobs_mu);
    if (j->prev) j->prev->next = j->next;
    else jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    pthread_mutex_unlock(&jobs_mu);
    return atomic_load(&j->state);
}

static void async_cancel(tr_async *j) {
    atomic_store(&j->cancel, 1);
    async_wait(j);
    free(j);
}

/* Starts compiling g's kernels in the background for entry e. 0; -1 if no thread could
 * be started (the caller compiles at once). */
static int async_start(tr_entry *e, ir_graph *g, const ir_backend *cpu, int interp) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_jobs_at_exit);
    tr_async *j = calloc(1, sizeof *j);
    if (!j) return -1;
    j->g = g;
    j->cpu = cpu;
    j->interp = interp;
    pthread_mutex_lock(&jobs_mu);
    j->next = jobs;
    if (jobs) jobs->prev = j;
    jobs = j;
    pthread_mutex_unlock(&jobs_mu);
    pthread_attr_t at;
    pthread_t t;
    int bad = pthread_attr_init(&at) || pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) ||
              pthread_create(&t, &at, async_main, j);
    pthread_attr_destroy(&at);
    if (bad) {
        pthread_mutex_lock(&jobs_mu);
        atomic_store(&j->state, -1);
        pthread_mutex_unlock(&jobs_mu);
        async_wait(j);
        free(j);
        return -1;
    }
    e->job = j;
    return 0;
}

/* 1 if every kernel of g goes to a backend that compiles concurrently (LLVM): the others
 * (CUDA's) are not made to compile off the calling thread. */
static int async_eligible(const ir_graph *g, const ir_backend *cpu) {
    if (!g->nkernels) return 0;
    for (int32_t i = 0; i < g->nkernels; i++) {
        const ir_backend *b = backend_of(g->kernels[i], cpu);
        if (!b || !b->concurrent) {
            kl_clear_error();
            return 0;
        }
    }
    return 1;
}

/* The background compile of e is over (under f->lock): the entry runs compiled from now
 * on, or (the compile failed) eagerly, or with the interpreter tier on the interpreter for
 * the kernels left (the same bits). */
static void async_finish(kl_fn *f, tr_entry *e) {
    tr_async *j = e->job;
    int ok = async_wait(j) == 1;
    e->job = NULL;
    e->ms[2] += j->ms;
    e->ms[3] += j->llvm_ms;
    if (j->forked) snprintf(j->err.msg, sizeof j->err.msg, "the process forked while they compiled");
    if (ok && e->dyn && tr_dyn_compile_pending(e->dyn, f->cpu)) {
        ke_log(KE_LOG_FALLBACK, "%s: a size's kernels stay on the interpreter: %s", f->o.name, kl_last_error());
        kl_clear_error();
    }
    if (ok) {
        ke_log(KE_LOG_CACHE, "%s: kernels compiled in the background in %.2f ms: calls run compiled", f->o.name, j->ms);
    } else if (j->interp) {
        free(e->async_why);
        e->async_why = strdup(j->err.msg);
        snprintf(f->st.last_reason, sizeof f->st.last_reason, "background compile failed: %.200s", j->err.msg);
        ke_log(KE_LOG_FALLBACK, "%s: the background compile failed, kernels not compiled stay on the interpreter: %s",
               f->o.name, j->err.msg);
    } else {
        char why[1100];
        snprintf(why, sizeof why, "%s", j->err.msg);
        e->eager = 1;
        e->async_why = strdup(why);
        snprintf(f->st.last_reason, sizeof f->st.last_reason, "background compile failed: %.200s", why);
        ke_log(KE_LOG_FALLBACK, "%s: the background compile failed, the signature runs eagerly: %s", f->o.name, why);
    }
    free(j);
}

int kl_fn_wait_compiled(kl_fn *f) {
    if (!f) return ke_err(KL_ERR_NULL_ARG, "fn_wait_compiled", "the compiled function is NULL");
    pthread_mutex_lock(&f->lock);
    for (int i = 0; i < f->nentries; i++)
        if (f->entries[i].job) async_finish(f, &f->entries[i]);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

/* The functions this thread is tracing now, innermost first (a list through
 * add_entry's frames): fn calling kl_fn_call on a function it is being
 * traced for would wait for the lock its own trace holds. */
typedef struct tracing_frame {
    const kl_fn *f;
    struct tracing_frame *up;
} tracing_frame;
static _Thread_local tracing_frame *tl_tracing;

static int being_traced_here(const kl_fn *f) {
    for (const tracing_frame *t = tl_tracing; t; t = t->up)
        if (t->f == f) return 1;
    return 0;
}

/* An instant event naming f and the reason. */
static void prof_reason(ke_prof_cat cat, const char *name, const kl_fn *f, const char *reason) {
    char args[KE_PROF_ARGS];
    size_t u = 0;
    u += (size_t)snprintf(args, sizeof args, "\"fn\": ");
    ke_prof_json_str(args, sizeof args, &u, f->o.name);
    u += (size_t)snprintf(args + u, sizeof args - u, ", \"reason\": ");
    ke_prof_json_str(args, sizeof args, &u, reason);
    ke_prof_instant(cat, name, args);
}

/* A signature differentiated in grad mode: replaces *g (fn's forward-only
 * trace) by the compiled forward and sets e->aot, or leaves both alone where
 * the function cannot be split (logged; it then runs op by op). 0 or -1. */
static int make_aot(kl_fn *f, tr_entry *e, ir_graph **g, kl_tensor *const *in, const int32_t *alias, int n_in,
                    int n_out) {
    kl_tensor **params = calloc((size_t)(*g)->ncaptured + 1, sizeof *params);
    if (!params) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    int np = 0;
    for (int32_t i = 0; i < (*g)->ncaptured; i++)
        if ((*g)->captured[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) params[np++] = (*g)->captured[i];
    tr_aot_spec sp = {.fn = f->fn, .user = f->user, .name = f->o.name, .inputs = in, .alias = alias, .n_in = n_in,
                      .n_out = n_out, .g0 = *g, .params = params, .nparams = np, .fuse = 1, .cpu = f->cpu,
                      .check = f->env_check ? &f->o : NULL};
    ir_graph *fw = NULL;
    char why[256];
    int rc = tr_aot_build(&sp, &fw, &e->aot, why, sizeof why);
    free(params);
    if (rc) return -1;
    if (!fw) {
        snprintf(f->st.grad_fallback, sizeof f->st.grad_fallback, "%s", why);
        ke_log(KE_LOG_RECOMPILE, "%s: runs op by op so that autograd records (no compiled backward): %s", f->o.name, why);
        return 0;
    }
    ir_graph_free(*g);
    *g = fw;
    return 0;
}

/* fn traced (and run through the passes, kernels not compiled) with the dynamic dims of
 * its inputs at size s: a probe of make_dynamic. NULL with why filled (no error left). */
static ir_graph *probe(kl_fn *f, const tr_entry *e, kl_tensor *const *in, int n_in, int n_out, const uint8_t *dynmask,
                       int64_t s, int fuse, char *why, size_t cap) {
    kl_tensor **pin = calloc((size_t)n_in + 1, sizeof *pin);
    uint8_t *mine = calloc((size_t)n_in + 1, 1);
    ir_graph *g = NULL;
    int ok = pin && mine;
    for (int i = 0; i < n_in && ok; i++) {
        if (!dynmask[i]) {
            pin[i] = in[i];
            continue;
        }
        int64_t shape[KL_MAX_DIMS], stride[KL_MAX_DIMS];
        for (int d = 0; d < in[i]->ndim; d++) shape[d] = (dynmask[i] >> d & 1) ? s : in[i]->shape[d];
        ke_contiguous_strides(in[i]->ndim, shape, stride);
        /* on the input's device (nodes compute where their inputs live; fusion wants CPU) but
         * holding nothing: tracing reads shapes only */
        ke_storage *st = ke_storage_new(0, in[i]->storage->device, "compile");
        pin[i] = st ? ke_tensor_wrap(st, (kl_dtype)in[i]->dtype, in[i]->ndim, shape, stride, 0) : NULL;
        if (st) ke_storage_decref(st);
        ok = mine[i] = pin[i] != NULL;
    }
    int broke = 0;
    char reason[256] = "";
    if (ok) g = tr_trace(f->fn, f->user, pin, n_in, n_out, &broke, reason, sizeof reason);
    if (!ok) snprintf(why, cap, "out of memory");
    else if (!g && broke) snprintf(why, cap, "traced at size %lld it breaks: %s", (long long)s, reason);
    else if (!g) snprintf(why, cap, "traced at size %lld it fails: %s", (long long)s, kl_last_error());
    if (g) {
        g->fuse = (uint8_t)fuse;
        for (int i = 0; i < n_in; i++)
            if (e->in[i].alias >= 0) ir_alias_input(g, i, e->in[i].alias);
        if (f->o.mode != KL_COMPILE_TRACE_ONLY && ir_optimize(g)) {
            snprintf(why, cap, "at size %lld the passes fail: %s", (long long)s, kl_last_error());
            ir_graph_free(g);
            g = NULL;
        }
    }
    if (!g) kl_clear_error();
    for (int i = 0; i < n_in && pin; i++)
        if (mine && mine[i]) ke_tensor_decref(pin[i]);
    free(pin);
    free(mine);
    return g;
}

/* Makes entry e (static graph g, traced at the inputs' sizes) serve every size of the dims
 * dynmask marks, or says in why why not (e->dyn stays NULL). 0, or -1 on an error. */
static int make_dynamic(kl_fn *f, tr_entry *e, ir_graph *g, kl_tensor *const *in, int n_in, int n_out,
                        const uint8_t *dynmask, char *why, size_t cap) {
    int64_t s0 = -1;
    for (int i = 0; i < n_in; i++) {
        if (!dynmask[i]) continue;
        if (!e->in[i].contig) return snprintf(why, cap, "input %d is not contiguous", i + 1), 0;
        for (int j = 0; j < n_in; j++)
            if ((j != i && e->in[j].alias == i) || (j == i && e->in[i].alias >= 0))
                return snprintf(why, cap, "input %d shares its storage with another input", i + 1), 0;
        for (int d = 0; d < in[i]->ndim; d++)
            if (dynmask[i] >> d & 1) {
                if (s0 < 0) s0 = in[i]->shape[d];
                if (in[i]->shape[d] != s0)
                    return snprintf(why, cap, "input %d dim %d is %lld, not %lld as the other dynamic dims", i + 1, d,
                                    (long long)in[i]->shape[d], (long long)s0), 0;
            }
    }
    if (s0 < 0) return snprintf(why, cap, "no marked input has the marked dim"), 0;
    if (s0 < 2) return snprintf(why, cap, "the size is %lld (0 and 1 are specialised)", (long long)s0), 0;
    int64_t s1 = s0 + 1, s2 = s0 >= 8 ? 3 : s0 + 5;
    ir_graph *p1 = probe(f, e, in, n_in, n_out, dynmask, s1, g->fuse, why, cap);
    ir_graph *p2 = p1 ? probe(f, e, in, n_in, n_out, dynmask, s2, g->fuse, why, cap) : NULL;
    if (p1 && p2) e->dyn = tr_dyn_make(g, s0, p1, s1, p2, s2, why, cap);
    ir_graph_free(p1);
    ir_graph_free(p2);
    if (!e->dyn && ke_error_pending()) return -1;
    if (e->dyn)
        for (int i = 0; i < n_in; i++) e->in[i].dynmask = dynmask[i];
    return 0;
}

/* Traces a new signature into entry e (under f->lock); dynmask (NULL: none) marks the
 * input dims to trace as one dynamic size. */
static int add_entry(kl_fn *f, kl_tensor *const *in, const int32_t *alias, int n_in, int n_out, int grad_mode,
                     const char *why, const uint8_t *dynmask) {
    tr_entry *e = &f->entries[f->nentries];
    memset(e, 0, sizeof *e);
    e->in = calloc((size_t)n_in + 1, sizeof *e->in);
    if (!e->in) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int i = 0; i < n_in; i++) {
        guard_of(in[i], &e->in[i]);
        e->in[i].alias = alias[i];
    }
    e->grad_mode = (uint8_t)grad_mode;
    if (ke_log_on(KE_LOG_GUARDS)) {
        char *text = guards_text(e, n_in);
        if (text) ke_log(KE_LOG_GUARDS, "%s: entry %d guards:\n%s", f->o.name, f->nentries, text);
        free(text);
    }
    double t0 = now_ms();
    int broke = 0, tiered = 0, interim = 0;
    char reason[256] = "";
    tracing_frame frame = {f, tl_tracing};
    tl_tracing = &frame;
    int prof = ke_prof_active();
    int64_t p0 = prof ? ke_prof_now() : 0;
    ir_graph *g = tr_trace(f->fn, f->user, in, n_in, n_out, &broke, reason, sizeof reason);
    int grad = g && needs_autograd(g, in, n_in, grad_mode);
    if (grad && f->o.mode == KL_COMPILE_FUSE && make_aot(f, e, &g, in, alias, n_in, n_out)) {
        ir_graph_free(g);
        g = NULL;
    }
    tl_tracing = frame.up;
    double t1 = now_ms();
    e->ms[0] = t1 - t0;
    e->why = strdup(why);
    if (prof) {
        char args[KE_PROF_ARGS];
        size_t u = 0;
        u += (size_t)snprintf(args, sizeof args, "\"fn\": ");
        ke_prof_json_str(args, sizeof args, &u, f->o.name);
        u += (size_t)snprintf(args + u, sizeof args - u, ", \"entry\": %d, \"why\": ", f->nentries);
        ke_prof_json_str(args, sizeof args, &u, why);
        ke_prof_complete(KE_PROF_TRACE, "trace", p0, ke_prof_now(), 0, args);
    }
    if (g) {
        ke_log(KE_LOG_TRACE, "%s: traced entry %d (%s): %d nodes in %.3f ms", f->o.name, f->nentries, why, g->nnodes,
               now_ms() - t0);
        if (ke_log_at(KE_LOG_TRACE, KL_LOG_DEBUG)) {
            char *text = ir_to_string(g);
            if (text) ke_logl(KE_LOG_TRACE, KL_LOG_DEBUG, "%s: as traced:\n%s", f->o.name, text);
            free(text);
        }
    }
    if (g && !e->aot) {
        g->fuse = f->o.mode == KL_COMPILE_FUSE && !grad;
        for (int i = 0; i < n_in; i++) /* inputs sharing storage: writes through one reach both */
            if (e->in[i].alias >= 0) ir_alias_input(g, i, e->in[i].alias);
    }
    if (g && !e->aot && f->env_check && !(e->traced = ir_graph_clone(g))) kl_clear_error(); /* no minifier then */
    if (g && !e->aot && f->o.mode != KL_COMPILE_TRACE_ONLY) {
        int64_t q0 = prof ? ke_prof_now() : 0;
        int bad = ir_optimize(g) != 0;
        double t2 = now_ms();
        e->ms[1] = t2 - t1;
        int64_t q1 = prof ? ke_prof_now() : 0;
        if (prof) ke_prof_complete(KE_PROF_COMPILE, "passes", q0, q1, 0, NULL);
        double llvm0 = ir_backend_llvm_ms();
        /* tiered: the kernels compile in the background, started below once the entry is
         * complete (a dynamic entry's probes and fits read the template's kernels, not their
         * code, so they run meanwhile) */
        tiered = !bad && f->async && async_eligible(g, f->cpu);
        if (!bad && !tiered && interp_tier_on(f) && async_eligible(g, f->cpu)) {
            int r = interpret_meanwhile(g, f->cpu);
            if (r < 0) kl_clear_error(); /* compiled at once below (and fails there if it must) */
            tiered = interim = r > 0;
        }
        if (!bad && !tiered) bad = tr_compile_kernels(g, f->cpu) != 0;
        e->ms[2] = now_ms() - t2;
        e->ms[3] = ir_backend_llvm_ms() - llvm0;
        if (prof && g->nkernels) {
            char args[64];
            snprintf(args, sizeof args, "\"kernels\": %d", (int)g->nkernels);
            ke_prof_complete(KE_PROF_COMPILE, "codegen", q1, ke_prof_now(), 0, args);
        }
        if (bad) {
            ir_graph_free(g);
            g = NULL;
            if (e->traced) tr_repro_error(e->traced, in, n_in, &f->o, kl_last_status()); /* names the bundle */
        }
    }
    int want_dyn = 0;
    for (int i = 0; dynmask && i < n_in; i++) want_dyn |= dynmask[i] != 0;
    if (g && want_dyn) {
        char no[320] = "";
        double td = now_ms();
        if (e->aot || grad) snprintf(no, sizeof no, "inputs or captured tensors require grad in grad mode");
        else if (make_dynamic(f, e, g, in, n_in, n_out, dynmask, no, sizeof no)) {
            ir_graph_free(g);
            g = NULL;
        }
        e->ms[0] += now_ms() - td;
        if (g && e->dyn) {
            f->st.dynamic_entries++;
            ke_log(KE_LOG_GUARDS, "%s: entry %d serves every size s >= 2 of its dynamic dims (traced at %lld): %d "
                   "numbers rewritten per size", f->o.name, f->nentries, (long long)tr_dyn_size(e->dyn),
                   (int)tr_dyn_nsites(e->dyn));
        } else if (g) {
            e->static_why = strdup(no);
            ke_log(KE_LOG_RECOMPILE, "%s: entry %d stays static (dynamic sizes refused): %s", f->o.name, f->nentries, no);
            ke_log(KE_LOG_GUARDS, "%s: entry %d stays static (dynamic sizes refused): %s", f->o.name, f->nentries, no);
        }
    }
    if (g && grad_mode) {
        e->ncap = g->ncaptured;
        if (!(e->cap_rg = calloc((size_t)g->ncaptured + 1, 1))) {
            if (e->dyn) tr_dyn_free(e->dyn); /* owns g */
            else ir_graph_free(g);
            e->dyn = NULL;
            g = NULL;
            ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        }
        for (int32_t i = 0; g && i < g->ncaptured; i++)
            e->cap_rg[i] = (g->captured[i]->keys & KE_KS(KE_KEY_AUTOGRAD)) != 0;
    }
    if (g && tiered) { /* g: the template of a dynamic entry, or the static graph */
        if (!async_start(e, g, f->cpu, interim)) {
            ke_log(KE_LOG_CACHE, "%s: entry %d: %d kernels compile in the background; calls run %s meanwhile",
                   f->o.name, f->nentries, (int)g->nkernels, interim ? "them on the interpreter" : "eagerly");
        } else { /* no thread: compiled at once */
            double t2 = now_ms(), llvm0 = ir_backend_llvm_ms();
            int bad = tr_compile_kernels(g, f->cpu) != 0;
            e->ms[2] += now_ms() - t2;
            e->ms[3] += ir_backend_llvm_ms() - llvm0;
            if (bad) {
                if (e->dyn) tr_dyn_free(e->dyn); /* owns g */
                else ir_graph_free(g);
                e->dyn = NULL;
                g = NULL;
            }
        }
    }
    f->st.compile_ms += now_ms() - t0;
    f->st.traces++;
    if (f->nentries > 0) f->st.recompiles++;
    snprintf(f->st.last_reason, sizeof f->st.last_reason, "%s", why);
    if (!g && !broke) {
        free(e->in);
        free(e->why);
        free(e->static_why);
        e->static_why = NULL;
        e->why = NULL;
        tr_aot_release(e->aot);
        e->aot = NULL;
        ir_graph_free(e->traced);
        e->traced = NULL;
        return -1;
    }
    if (broke) {
        e->eager = 1;
        e->broke = strdup(reason);
        snprintf(f->st.last_reason, sizeof f->st.last_reason, "trace break: %s", reason);
        if (prof) prof_reason(KE_PROF_FALLBACK, "fallback", f, f->st.last_reason);
        ke_log(KE_LOG_FALLBACK, "%s: entry %d runs eagerly: trace break: %s", f->o.name, f->nentries, reason);
    } else {
        e->g = g;
        f->st.graph_ops += g->nnodes;
        int64_t dispatched;
        f->st.kernels += tr_count_launches(g, &dispatched);
        f->st.library_calls += dispatched;
        if (e->aot) f->st.backward_kernels += tr_aot_backward_launches(e->aot);
        if (ke_log_on(KE_LOG_FUSION))
            for (int32_t k = 0; k < g->nkernels; k++)
                ke_log(KE_LOG_FUSION, "%s: kernel %d = %s", f->o.name, (int)k, g->kernels[k]->ops ? g->kernels[k]->ops : "?");
        if (g->notes && ke_log_on(KE_LOG_FUSION))
            for (const char *l = g->notes; *l;) {
                const char *nl = strchr(l, '\n');
                int len = nl ? (int)(nl - l) : (int)strlen(l);
                ke_log(KE_LOG_FUSION, "%s: not fused: %.*s", f->o.name, len, l);
                l += len + (nl ? 1 : 0);
            }
        if (ke_log_on(KE_LOG_GRAPH)) {
            char *text = ir_to_string(g);
            if (text) ke_log(KE_LOG_GRAPH, "%s: entry %d after the passes (%s):\n%s", f->o.name, f->nentries, why, text);
            free(text);
        }
    }
    f->last = f->nentries++;
    return 0;
}

/* Which input dims a new entry traces as dynamic (dynmask[n_in], zeroed by the caller):
 * those the options mark, or (automatic dynamic) the dims in which the inputs differ from a
 * static entry's when nothing else differs and all went from one size to one other, both
 * >= 2. 1 if any dim is marked. */
static int dynamic_dims_for(const kl_fn *f, kl_tensor *const *in, const int32_t *alias, int n_in, int grad_mode,
                            uint8_t *dynmask) {
    if (f->o.dynamic_dims) {
        int any = 0;
        for (int i = 0; i < n_in && i < 64; i++)
            if (f->o.dynamic_dims >> i & 1 && in[i]->ndim > 0) dynmask[i] = 1, any = 1;
        return any;
    }
    if (!f->o.auto_dynamic) return 0;
    for (int k = f->nentries - 1; k >= 0; k--) {
        const tr_entry *e = &f->entries[k];
        if (e->eager || e->aot || e->dyn || e->grad_mode != grad_mode) continue;
        int64_t from = -1, to = -1;
        int ok = 1, any = 0;
        for (int i = 0; i < n_in && ok; i++) {
            const tr_guard *gd = &e->in[i];
            const kl_tensor *t = in[i];
            dynmask[i] = 0;
            ok = gd->dtype == t->dtype && gd->ndim == t->ndim && gd->device.type == t->storage->device.type &&
                 gd->device.index == t->storage->device.index &&
                 gd->requires_grad == ((t->keys & KE_KS(KE_KEY_AUTOGRAD)) != 0) && gd->alias == alias[i];
            for (int d = 0; ok && d < t->ndim; d++) {
                if (gd->shape[d] == t->shape[d]) continue;
                if (from < 0) from = gd->shape[d], to = t->shape[d];
                ok = gd->contig && ke_is_contig(t) && gd->shape[d] == from && t->shape[d] == to && d < 8;
                if (ok) dynmask[i] |= (uint8_t)(1u << d), any = 1;
            }
            if (ok && !dynmask[i] && !gd->contig) ok = !memcmp(gd->stride, t->stride, sizeof(int64_t) * t->ndim);
            else if (ok && !dynmask[i]) ok = ke_is_contig(t);
        }
        if (ok && any && from >= 2 && to >= 2) return 1;
    }
    memset(dynmask, 0, (size_t)n_in);
    return 0;
}

/* The rest of kl_fn_call, given the inputs' storage sharing. */
static int call_entry(kl_fn *f, kl_tensor *const *inputs, const int32_t *alias, int n_in, kl_tensor **outputs,
                      int n_out) {
    int grad_mode = kl_is_grad_enabled();
    pthread_mutex_lock(&f->lock);
    tr_entry *hit = NULL;
    for (int i = 0; i < f->nentries && !hit; i++)
        if (!guard_check(&f->entries[i], inputs, alias, n_in, grad_mode, NULL, 0)) hit = &f->entries[i], f->last = i;
    if (!hit) {
        char why[320] = "first call";
        if (f->nentries > 0)
            guard_check(&f->entries[f->nentries - 1], inputs, alias, n_in, grad_mode, why, sizeof why);
        if (f->nentries >= f->o.recompile_limit) {
            if (!f->warned_limit) {
                f->warned_limit = 1;
                ke_logl(KE_LOG_RECOMPILE, KL_LOG_WARN, "%s: recompile limit (%d) reached (%s); new signatures run eagerly",
                        f->o.name, f->o.recompile_limit, why);
            }
            ke_log(KE_LOG_FALLBACK, "%s: runs eagerly: recompile limit (%d) reached", f->o.name, f->o.recompile_limit);
            if (ke_prof_active()) prof_reason(KE_PROF_FALLBACK, "fallback", f, f->st.last_reason);
            snprintf(f->st.last_reason, sizeof f->st.last_reason, "recompile limit reached: %s", why);
            pthread_mutex_unlock(&f->lock);
            return run_eager(f, inputs, n_in, outputs, n_out);
        }
        if (f->nentries > 0) {
            ke_log(KE_LOG_RECOMPILE, "%s: retracing: %s", f->o.name, why);
            if (ke_prof_active()) prof_reason(KE_PROF_RECOMPILE, "recompile", f, why);
        }
        uint8_t dm_stack[64], *dynmask = n_in <= 64 ? dm_stack : calloc((size_t)n_in, 1);
        if (!dynmask) {
            pthread_mutex_unlock(&f->lock);
            return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        }
        memset(dynmask, 0, (size_t)n_in);
        int dyn = f->o.mode != KL_COMPILE_OFF && dynamic_dims_for(f, inputs, alias, n_in, grad_mode, dynmask);
        if (dyn && !f->o.dynamic_dims && f->nentries > 0) {
            size_t u = strlen(why);
            snprintf(why + u, sizeof why - u, " (automatic dynamic: traced with that size dynamic)");
            ke_log(KE_LOG_RECOMPILE, "%s: automatic dynamic: the new entry traces the changed dims as dynamic", f->o.name);
        }
        int bad = add_entry(f, inputs, alias, n_in, n_out, grad_mode, why, dyn ? dynmask : NULL);
        if (dynmask != dm_stack) free(dynmask);
        if (bad) {
            pthread_mutex_unlock(&f->lock);
            return -1;
        }
        hit = &f->entries[f->nentries - 1];
    } else {
        f->st.cache_hits++;
        ke_logl(KE_LOG_CACHE, KL_LOG_DEBUG, "%s: guard cache hit, entry %d", f->o.name, f->last);
        if (ke_prof_active()) {
            char args[KE_PROF_ARGS];
            size_t u = 0;
            u += (size_t)snprintf(args, sizeof args, "\"fn\": ");
            ke_prof_json_str(args, sizeof args, &u, f->o.name);
            snprintf(args + u, sizeof args - u, ", \"entry\": %d", f->last);
            ke_prof_instant(KE_PROF_CACHE, "cache hit", args);
        }
    }
    /* tiered: while the kernels compile the call runs eagerly (before a dynamic entry is
     * specialised: its copies' kernels would compile on this thread) */
    int tier0 = 0, interp_pending = 0;
    if (hit->job) {
        if (atomic_load(&hit->job->state) != 0) async_finish(f, hit);
        else if (!hit->job->interp) tier0 = 1, f->st.async_eager_calls++;
        else interp_pending = 1;
    }
    if (hit->eager || tier0) {
        pthread_mutex_unlock(&f->lock);
        /* the compile holds the other threads' cores (docs/COMPILE.md "Tiered execution") */
        int serial = tier0 ? ke_thread_serial(1) : 0;
        int rc = run_eager(f, inputs, n_in, outputs, n_out);
        if (tier0) ke_thread_serial(serial);
        return rc;
    }
    ir_graph *g = hit->g;
    int transient = 0;
    if (hit->dyn) { /* the graph for this call's size */
        int64_t s = -1;
        for (int i = 0; i < n_in && s < 0; i++)
            for (int d = 0; d < inputs[i]->ndim && s < 0; d++)
                if (hit->in[i].dynmask >> d & 1) s = inputs[i]->shape[d];
        int nb = tr_dyn_ninstances(hit->dyn);
        g = tr_dyn_graph(hit->dyn, s, f->cpu, &transient); /* tier 0 while the template compiles */
        if (transient || tr_dyn_ninstances(hit->dyn) != nb) {
            f->st.specialisations++;
            ke_log(KE_LOG_CACHE, "%s: entry %d specialised to size %lld", f->o.name, f->last, (long long)s);
        }
        if (!g) {
            pthread_mutex_unlock(&f->lock);
            return -1;
        }
    }
    pthread_mutex_unlock(&f->lock);

    int check = f->env_check;
    kl_tensor **before = NULL;
    if (check) {
        /* the inputs' values before the call, for the eager run */
        before = calloc((size_t)n_in + 1, sizeof *before);
        if (!before) {
            if (transient) ir_graph_free(g);
            return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
        }
        kl_no_grad_begin();
        for (int i = 0; i < n_in; i++) before[i] = kl_clone(inputs[i]);
        kl_no_grad_end();
    }
    /* The eager re-run must draw the numbers the compiled call drew: the
     * executor reserves each random node's counters in trace order, as eager
     * does, so the re-run starts from the generator state the compiled call
     * started from; afterwards the generator is where the compiled call left
     * it, as if the check had not run. */
    ke_generator gen0 = check ? ke_generator_get_state(ke_default_generator()) : (ke_generator){0, 0};
    int rc;
    /* kernels still on the interpreter: the compile holds the other cores, as for tier0 */
    int serial = interp_pending ? ke_thread_serial(1) : 0;
    if (hit->aot) {
        rc = tr_aot_call(hit->aot, hit->g, inputs, outputs);
        pthread_mutex_lock(&f->lock);
        f->st.aot_calls++;
        f->st.saved_bytes = tr_aot_saved_bytes(hit->aot);
        pthread_mutex_unlock(&f->lock);
    } else {
        if (needs_autograd(hit->g, inputs, n_in, grad_mode)) {
            pthread_mutex_lock(&f->lock);
            f->st.opbyop_grad_calls++;
            pthread_mutex_unlock(&f->lock);
        }
        int64_t r0 = ir_kernel_interim_runs();
        rc = tr_run_graph(g, inputs, outputs);
        if (ir_kernel_interim_runs() != r0) {
            pthread_mutex_lock(&f->lock);
            f->st.interp_calls++;
            pthread_mutex_unlock(&f->lock);
        }
    }
    if (interp_pending) ke_thread_serial(serial);
    if (transient) ir_graph_free(g);
    if (!rc && check) {
        ke_generator gen1 = ke_generator_get_state(ke_default_generator());
        ke_generator_set_state(ke_default_generator(), gen0);
        rc = check_against_eager(f, inputs, n_in, before, outputs, n_out);
        ke_generator_set_state(ke_default_generator(), gen1);
        /* the minifier replays the graph as traced, at its traced sizes: a dynamic entry
         * called at another size reports the mismatch without a bundle */
        const ir_graph *traced = hit->aot ? tr_aot_fw_traced(hit->aot) : hit->traced;
        if (rc && traced && kl_last_status() == KL_ERR_STATE && (!hit->dyn || g == hit->g))
            rc = tr_repro_error(traced, before, n_in, &f->o, 0);
    }
    if (before)
        for (int i = 0; i < n_in; i++)
            if (before[i]) kl_release(before[i]);
    free(before);
    return rc;
}

static int fn_call(kl_fn *f, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out);

/* fn's success is judged by whether it recorded an error, so an error left
 * pending from before the call (say a failed kl_add(NULL, a)) made every new
 * signature fail while cached ones ran: it is set aside for the call and put
 * back after it (first error wins; the return value is this call's). */
int kl_fn_call(kl_fn *f, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out) {
    ke_error_stash stale;
    ke_error_set_aside(&stale);
    int64_t p0 = ke_prof_active() ? ke_prof_now() : 0;
    int rc = fn_call(f, inputs, n_in, outputs, n_out);
    if (p0 && ke_prof_active() && f) {
        char args[KE_PROF_ARGS];
        snprintf(args, sizeof args, "\"entry\": %d, \"ok\": %s", f->last, rc ? "false" : "true");
        ke_prof_complete(KE_PROF_CALL, f->o.name, p0, ke_prof_now(), 0, args);
    }
    ke_error_put_back(&stale);
    return rc;
}

static int fn_call(kl_fn *f, kl_tensor *const *inputs, int n_in, kl_tensor **outputs, int n_out) {
    if (!f) return ke_err(KL_ERR_NULL_ARG, "fn_call", "the compiled function is NULL");
    if (being_traced_here(f))
        return ke_err(KL_ERR_STATE, "fn_call",
                      "%s calls itself through kl_fn_call while it is being traced: a compiled function "
                      "cannot be re-entered (call the eager function instead)",
                      f->o.name);
    if (n_in < 0 || n_out < 0 || (n_in && !inputs) || (n_out && !outputs))
        return ke_err(KL_ERR_NULL_ARG, "fn_call", "%s: inputs or outputs array is NULL", f->o.name);
    for (int j = 0; j < n_out; j++) outputs[j] = NULL;
    for (int i = 0; i < n_in; i++)
        if (ke_check_tensor(inputs[i], "fn_call", i + 1)) return -1;
    pthread_mutex_lock(&f->lock);
    f->st.calls++;
    if (f->n_in < 0) f->n_in = n_in, f->n_out = n_out;
    int expect_in = f->n_in, expect_out = f->n_out;
    pthread_mutex_unlock(&f->lock);
    if (n_in != expect_in || n_out != expect_out)
        return ke_err(KL_ERR_ARG, "fn_call",
                      "%s takes %d inputs and %d outputs (the counts of its first call, which it was traced with), "
                      "got n_in %d and n_out %d",
                      f->o.name, expect_in, expect_out, n_in, n_out);
    if (f->o.mode == KL_COMPILE_OFF || f->env_eager) return run_eager(f, inputs, n_in, outputs, n_out);
    int32_t alias_stack[TR_ALIAS_STACK], *alias = alias_stack;
    if (n_in > TR_ALIAS_STACK && !(alias = malloc(sizeof *alias * (size_t)n_in)))
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    if (aliases_of(inputs, n_in, alias)) {
        if (alias != alias_stack) free(alias);
        return -1;
    }
    int rc = call_entry(f, inputs, alias, n_in, outputs, n_out);
    if (alias != alias_stack) free(alias);
    return rc;
}

int kl_fn_get_stats(const kl_fn *f, kl_fn_stats *out) {
    if (!f || !out) return ke_err(KL_ERR_NULL_ARG, "fn_get_stats", "argument is NULL");
    pthread_mutex_lock((pthread_mutex_t *)&f->lock);
    *out = f->st;
    for (int i = 0; i < f->nentries; i++)
        if (f->entries[i].aot) {
            out->backward_calls += tr_aot_backward_calls(f->entries[i].aot);
            out->double_backward_replays += tr_aot_replays(f->entries[i].aot);
        }
    pthread_mutex_unlock((pthread_mutex_t *)&f->lock);
    return 0;
}

int kl_fn_graph_text(const kl_fn *f, char *buf, size_t cap) {
    if (!f) return ke_err(KL_ERR_NULL_ARG, "fn_graph_text", "the compiled function is NULL");
    if (f->last < 0 || !f->entries[f->last].g)
        return ke_err(KL_ERR_STATE, "fn_graph_text", "%s has no graph for its last signature", f->o.name);
    char *text = ir_to_string(f->entries[f->last].g);
    if (!text) return -1;
    int n = (int)strlen(text);
    if (buf && cap) snprintf(buf, cap, "%s", text);
    free(text);
    return n;
}

/* ---- kl_fn_explain ----------------------------------------------------------------------- */

/* Bytes of intermediates alive at once at the worst point of a call, by the
 * plan's liveness: each value a node defines (not a view) counts from its node
 * until it is dropped. */
static int64_t plan_peak(const ir_graph *g) {
    const ir_plan *p = g->plan;
    if (!p || p->nnodes != g->nnodes || p->nvalues != g->nvalues) return -1;
    int64_t live = 0, peak = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int j = 0; j < n->nout; j++) {
            const ir_value *v = &g->values[n->out[j]];
            if (v->base == v->id && !(n->inplace && j == 0))
                live += ke_numel(v->ndim, v->shape) * ke_dtypes[v->dtype].size;
        }
        if (live > peak) peak = live;
        for (int32_t i = p->drop_start[k]; i < p->drop_start[k + 1]; i++) {
            const ir_value *v = &g->values[p->drops[i]];
            if (v->kind == IR_VAL_NODE && v->base == v->id)
                live -= ke_numel(v->ndim, v->shape) * ke_dtypes[v->dtype].size;
        }
    }
    return peak;
}

static void indent(FILE *o, const char *text, const char *pre) {
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        int len = e ? (int)(e - l) : (int)strlen(l);
        if (len) fprintf(o, "%s%.*s\n", pre, len, l);
        l += len + (e ? 1 : 0);
    }
}

static const char *mode_name(kl_compile_mode m) {
    switch (m) {
    case KL_COMPILE_OFF: return "off";
    case KL_COMPILE_TRACE_ONLY: return "trace only";
    case KL_COMPILE_NO_FUSE: return "no fuse";
    default: return "fuse";
    }
}

int kl_fn_explain(const kl_fn *f, FILE *o) {
    if (!f || !o) return ke_err(KL_ERR_NULL_ARG, "fn_explain", "%s is NULL", f ? "stream" : "the compiled function");
    kl_fn *m = (kl_fn *)f;
    pthread_mutex_lock(&m->lock);
    fprintf(o, "%s: mode %s, %d cache entr%s (limit %d); %lld calls, %lld cache hits, %lld eager calls\n", f->o.name,
            mode_name(f->o.mode), f->nentries, f->nentries == 1 ? "y" : "ies", f->o.recompile_limit,
            (long long)f->st.calls, (long long)f->st.cache_hits, (long long)f->st.eager_calls);
    for (int i = 0; i < f->nentries; i++) {
        const tr_entry *e = &f->entries[i];
        fprintf(o, "\nentry %d (%s)\n", i, e->why ? e->why : "?");
        char *gt = guards_text(e, f->n_in);
        fprintf(o, "  guards:\n");
        if (gt) indent(o, gt, "    ");
        free(gt);
        fprintf(o, "  compile time: trace %.3f ms, passes %.3f ms, codegen %.3f ms (LLVM %.3f ms)\n", e->ms[0], e->ms[1],
                e->ms[2], e->ms[3]);
        if (e->eager && e->async_why) {
            fprintf(o, "  runs eagerly: its kernels failed to compile in the background: %s\n", e->async_why);
            continue;
        }
        if (e->eager) {
            fprintf(o, "  runs eagerly: trace break: %s\n", e->broke ? e->broke : "?");
            continue;
        }
        if (e->job && atomic_load(&e->job->state) == 0 && !e->job->interp) {
            fprintf(o, "  kernels compiling in the background (calls run eagerly until they are ready)\n");
            continue;
        }
        if (e->job && atomic_load(&e->job->state) == 0)
            fprintf(o, "  kernels compiling in the background (calls run each on the interpreter until its code is "
                       "loaded)\n");
        else if (e->async_why)
            fprintf(o, "  kernels not compiled run on the interpreter: the background compile failed: %s\n",
                    e->async_why);
        if (e->dyn)
            fprintf(o, "  dynamic: serves every size s >= 2 of the dims marked s (traced at %lld; %d numbers rewritten "
                       "per size; %d sizes specialised and kept)\n",
                    (long long)tr_dyn_size(e->dyn), (int)tr_dyn_nsites(e->dyn), tr_dyn_ninstances(e->dyn));
        else if (e->static_why)
            fprintf(o, "  static: dynamic sizes refused: %s\n", e->static_why);
        const ir_graph *g = e->g;
        char *text = ir_to_string(g);
        fprintf(o, "  graph after the passes:\n");
        if (text) indent(o, text, "    ");
        free(text);
        if (g->nkernels) fprintf(o, "  kernels:\n");
        for (int32_t k = 0; k < g->nkernels; k++) {
            const ir_kernel *kn = g->kernels[k];
            char sh[160];
            fprintf(o, "    kernel %d = %s (%s%s, %d inputs, %d outputs, %s)\n", (int)k, kn->ops ? kn->ops : "?",
                    kn->row ? "row kernel over " : "domain ", ke_fmt_shape(sh, sizeof sh, kn->ndim, kn->shape),
                    (int)kn->ninputs, (int)kn->noutputs,
                    atomic_load(&kn->handle) ? kn->backend->name : kn->interim ? "interp (tier 0)" : "not compiled");
        }
        if (g->notes) {
            fprintf(o, "  not fused:\n");
            indent(o, g->notes, "    ");
        }
        int64_t peak = plan_peak(g);
        if (g->plan)
            fprintf(o, "  memory plan: peak %lld bytes of intermediates alive at once; %d slots, %lld bytes for %lld bytes "
                       "of kernel outputs\n",
                    (long long)peak, (int)g->plan->nslots, (long long)g->plan->slot_total, (long long)g->plan->value_bytes);
        fprintf(o, "  launches per call: %lld\n", (long long)tr_count_launches(g, NULL));
    }
    int nre = 0;
    for (int i = 1; i < f->nentries; i++) nre++;
    fprintf(o, "\nrecompiles: %d\n", nre);
    for (int i = 1; i < f->nentries; i++) fprintf(o, "  entry %d: %s\n", i, f->entries[i].why ? f->entries[i].why : "?");
    if (f->warned_limit) fprintf(o, "  then: recompile limit (%d) reached: new signatures run eagerly\n", f->o.recompile_limit);
    pthread_mutex_unlock(&m->lock);
    return ferror(o) ? ke_err(KL_ERR_IO, "fn_explain", "cannot write to the stream") : 0;
}
