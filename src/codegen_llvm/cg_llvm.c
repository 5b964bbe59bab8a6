/*
 * cg_llvm.c — the LLVM backend of kernel IR (cg_llvm_backend, name "llvm").
 *
 * compile: key = SHA-256 of the kernel (every field that decides its code),
 * the host CPU name and features, the LLVM and Kiln versions and the eager
 * bitcode itself. A kernel already loaded in this process with that key is
 * shared (refcounted: graphs are cloned and recompiled per signature); else
 * the disk cache (diskcache.h) may hold its object; else cg_emit builds the
 * module, cg_jit optimizes and emits it, and the object is stored. Objects
 * go into the one LLJIT under one resource tracker per key, removed when
 * the last kernel using it is freed.
 *
 * A kernel LLVM cannot take (an op without a loop in the bitcode, a failed
 * verification) is not an error of the call: the handle runs it with the
 * interpreter, with one KL_LOG=codegen line. cg_llvm_compile_strict is the
 * same compile without that fallback (tests).
 *
 * run: the host side. Tensors must match the compiled buffers (dtype,
 * shape); the strides were compiled in as constants, so a call whose
 * strides differ runs through the interpreter (never wrong). The outer
 * range is split over the eager thread pool (ke_parallel_for; small
 * kernels run on the calling thread); the JIT'd code never calls back.
 */
#include "cg.h"

#include "ew.h"
#include "log.h"
#include "diskcache.h"
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <time.h>

#define GRAIN 32768         /* elements per thread, at least (as interp) */
#define CG_FORMAT "kiln-cg-4" /* the object layout; 2: own pass pipeline; 3: outer size out of the key; 4: tails folded */

extern const unsigned char cg_bitcode_sha256[32]; /* computed at build time (embed_bitcode.py) */
extern const char cg_generator_digest[];          /* of the code generator's sources, likewise */

/* Code loaded in the JIT, shared by the kernels with its key. */
typedef struct cg_code {
    ke_cache_key key;
    void *rt;
    cg_entry fn;
    int refs;
    struct cg_code *next;
} cg_code;

static cg_code *codes; /* under cg_lock */

/* Keys being compiled now, one entry per compiling thread (its own, thread-local, so
 * that guarded() can take it out after LLVM threw through get_code's frame). A graph
 * often holds identical kernels (the digits step's GELU backward for both hidden
 * layers, a graph specialised per size): compiled in parallel, each was compiled by two
 * threads at once and one result thrown away (2 of 8 compiles of the digits step). A
 * thread whose key is in flight waits for it instead, then shares the loaded code. */
typedef struct inflight {
    ke_cache_key key;
    struct inflight *next;
    int on; /* linked */
} inflight;
static pthread_mutex_t inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inflight_cv = PTHREAD_COND_INITIALIZER;
static inflight *inflights;
static _Thread_local inflight tl_inflight;

static int inflight_has(const ke_cache_key *key) {
    for (inflight *f = inflights; f; f = f->next)
        if (!memcmp(f->key.b, key->b, sizeof key->b)) return 1;
    return 0;
}
/* Waits while another thread compiles key, then claims it for this thread. 1 if it waited. */
static void inflight_register_fork(void);
static int inflight_claim(const ke_cache_key *key) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, inflight_register_fork);
    int waited = 0;
    pthread_mutex_lock(&inflight_mu);
    while (inflight_has(key)) {
        waited = 1;
        pthread_cond_wait(&inflight_cv, &inflight_mu);
    }
    tl_inflight.key = *key;
    tl_inflight.next = inflights;
    tl_inflight.on = 1;
    inflights = &tl_inflight;
    pthread_mutex_unlock(&inflight_mu);
    return waited;
}
/* This thread's claim is over (compiled and loaded, or failed): wakes the waiters. */
static void inflight_done(void) {
    pthread_mutex_lock(&inflight_mu);
    if (tl_inflight.on) {
        for (inflight **pp = &inflights; *pp; pp = &(*pp)->next)
            if (*pp == &tl_inflight) {
                *pp = tl_inflight.next;
                break;
            }
        tl_inflight.on = 0;
        pthread_cond_broadcast(&inflight_cv);
    }
    pthread_mutex_unlock(&inflight_mu);
}
/* fork: the child has only the forking thread; the claims of the others are gone with
 * them (left linked, a compile of such a key in the child waited for them forever). No
 * prepare handler taking inflight_mu: a pool thread claims a key inside a parallel region,
 * whose lock the pool's own prepare handler takes (TSan: lock-order inversion); the child
 * rebuilds the list from its own claim, so a list another thread was changing is dropped. */
static void inflight_fork_child(void) {
    inflights = tl_inflight.on ? &tl_inflight : NULL;
    tl_inflight.next = NULL;
    pthread_mutex_init(&inflight_mu, NULL);
    pthread_cond_init(&inflight_cv, NULL);
}
static void inflight_register_fork(void) {
    pthread_atfork(NULL, NULL, inflight_fork_child);
}
static _Atomic int64_t fallbacks, compiles;

int64_t cg_llvm_fallbacks(void) { return atomic_load(&fallbacks); }
int64_t cg_llvm_compiles(void) { return atomic_load(&compiles); }

static _Atomic int fail_next; /* cg_llvm_fail_next: a test's forced failures left */
void cg_llvm_fail_next(int n) { atomic_store(&fail_next, n > 0 ? n : 0); }
static _Atomic int hold, held; /* cg_llvm_hold_compiles; compiles waiting in it */
void cg_llvm_hold_compiles(int on) { atomic_store(&hold, on != 0); }
int cg_llvm_held_compiles(void) { return atomic_load(&held); }

typedef struct cg_handle {
    const ir_kernel *k;
    cg_plan plan;
    cg_code *code;          /* NULL: runs on the interpreter */
    _Atomic(void *) interp; /* interpreter handle (fallback; calls with other strides) */
} cg_handle;

/* ---- plan -------------------------------------------------------------------------- */

/* The domain coalesced as interp.c's coalesce does at run time, from the
 * compiled strides: size-1 dims dropped, dims contiguous in every buffer
 * merged; a row kernel keeps its last dim apart. */
void cg_plan_make(cg_plan *p, const ir_kernel *k) {
    memset(p, 0, sizeof *p);
    p->nb = k->ninputs + k->noutputs;
    int nd = 0, keep_last = k->row;
    for (int d = 0; d < k->ndim; d++) {
        int last = keep_last && d == k->ndim - 1;
        int64_t sh = k->shape[d];
        if (sh == 1 && !last) continue;
        if (nd > 0 && !last) {
            int ok = 1;
            for (int b = 0; b < p->nb; b++)
                if (p->stride[b][nd - 1] != k->bufs[b].index[d] * sh) ok = 0;
            if (ok) {
                p->shape[nd - 1] *= sh;
                for (int b = 0; b < p->nb; b++) p->stride[b][nd - 1] = k->bufs[b].index[d];
                continue;
            }
        }
        p->shape[nd] = sh;
        for (int b = 0; b < p->nb; b++) p->stride[b][nd] = k->bufs[b].index[d];
        nd++;
    }
    if (nd == 0) {
        p->shape[0] = 1;
        nd = 1;
    }
    p->nd = nd;
    int64_t inner = p->shape[nd - 1], outer = ke_numel(nd - 1, p->shape);
    p->flat = !k->row && nd == 1;
    p->items = p->flat ? inner : outer;
    p->per_item = p->flat ? 1 : (inner > 0 ? inner : 1);
    for (int s = 0; s < k->nstmts; s++)
        if (k->stmts[s].kind == IR_K_REDUCE) p->scratch += 8 * (inner > 0 ? inner : 1); /* a row per REDUCE */
}

/* ---- key --------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *s, const void *v, size_t n) {
    if (s->n + n > s->cap) {
        size_t cap = (s->cap + n) * 2;
        char *q = realloc(s->p, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->p = q;
        s->cap = cap;
    }
    memcpy(s->p + s->n, v, n);
    s->n += n;
}
#define PUT(s, x) put(s, &(x), sizeof(x))

/* Every field that decides the code, field by field (structs have padding). */
/* ir_kernel_outer_free: the emitted code does not depend on the domain's outermost size,
 * since cg_plan_make never drops it or merges it into an earlier dim, cg_emit reads plan
 * shapes only past the first, and the outer range (items) is the run's argument. Kernels
 * differing only there share their code: the same kernel of a graph specialised to another
 * batch size (src/trace/dyn.c) is compiled once. */
static int outer_size_free(const ir_kernel *k) { return ir_kernel_outer_free(k); }

static void serialize(sbuf *s, const ir_kernel *k) {
    PUT(s, k->ninputs), PUT(s, k->noutputs), PUT(s, k->nstmts), PUT(s, k->ndim), PUT(s, k->row);
    int free0 = outer_size_free(k);
    const int64_t any = -2; /* stands for "outer size >= 2" */
    for (int d = 0; d < k->ndim; d++) {
        int64_t v = d == 0 && free0 ? any : k->shape[d];
        PUT(s, v);
    }
    for (int b = 0; b < k->ninputs + k->noutputs; b++) {
        const ir_kbuf *f = &k->bufs[b];
        PUT(s, f->dtype), PUT(s, f->ndim), PUT(s, f->output), PUT(s, f->row);
        for (int d = 0; d < f->ndim; d++) {
            int64_t v = d == 0 && free0 && f->ndim == k->ndim && f->shape[0] == k->shape[0] ? any : f->shape[d];
            PUT(s, v);
        }
        put(s, f->index, sizeof(int64_t) * k->ndim);
    }
    for (int i = 0; i < k->nstmts; i++) {
        const ir_kstmt *st = &k->stmts[i];
        PUT(s, st->kind), PUT(s, st->dtype), PUT(s, st->compute), PUT(s, st->row), PUT(s, st->bcast);
        PUT(s, st->op), PUT(s, st->buf), PUT(s, st->nargs);
        put(s, st->args, sizeof(int32_t) * 4);
        put(s, st->a.f, sizeof st->a.f);
        put(s, st->a.i, sizeof st->a.i);
        PUT(s, st->a.nlist);
        if (st->a.nlist > 0 && st->a.nlist <= KE_MAX_LIST) put(s, st->a.list, sizeof(int64_t) * st->a.nlist);
    }
}

static void kernel_key(ke_cache_key *key, const ir_kernel *k, sbuf *s) {
    const char *cpu = cg_cpu_name(), *feat = cg_cpu_features();
    char llvm_ver[32];
    unsigned maj = 0, min = 0, pat = 0;
    LLVMGetVersion(&maj, &min, &pat);
    snprintf(llvm_ver, sizeof llvm_ver, "%u.%u.%u", maj, min, pat);
    const void *parts[] = {CG_FORMAT,         s->p, cpu, feat, llvm_ver, KL_VERSION_STRING, cg_bitcode_sha256,
                           cg_generator_digest};
    size_t sizes[] = {strlen(CG_FORMAT), s->n, strlen(cpu), strlen(feat), strlen(llvm_ver),
                      strlen(KL_VERSION_STRING), sizeof cg_bitcode_sha256, strlen(cg_generator_digest)};
    ke_cache_key_of(key, 8, parts, sizes);
}

/* ---- compile ----------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char *debug_prefix(char *buf, size_t cap, const ir_kernel *k, const char *hex) {
    static _Atomic int seq;
    const char *dir = getenv("KL_DEBUG_DIR");
    if (!dir || !*dir) return NULL;
    mkdir(dir, 0777);
    snprintf(buf, cap, "%s/codegen%03d_%.16s", dir, atomic_fetch_add(&seq, 1), hex);
    char path[1200];
    snprintf(path, sizeof path, "%s.kernel.txt", buf);
    FILE *f = fopen(path, "w");
    if (f) {
        ir_kernel_print(k, f);
        fclose(f);
    }
    return buf;
}

/* The code loaded with key, or NULL. Called with cg_lock held. */
static cg_code *find_code(const ke_cache_key *key) {
    for (cg_code *c = codes; c; c = c->next)
        if (!memcmp(c->key.b, key->b, sizeof key->b)) return c;
    return NULL;
}

/* Loads obj into the JIT as the code of key, unless another thread loaded that
 * key meanwhile (compiles run concurrently): then that code is shared. Takes
 * cg_lock. NULL with a Kiln error if the JIT refuses it. */
static cg_code *install(const ke_cache_key *key, const void *obj, size_t size, const char *sym, int *shared) {
    cg_lock();
    cg_code *c = find_code(key);
    if (c) {
        c->refs++;
        *shared = 1;
        cg_unlock();
        return c;
    }
    *shared = 0;
    if (!(c = calloc(1, sizeof *c))) {
        cg_unlock();
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    c->key = *key;
    if (cg_jit_add(obj, size, sym, &c->rt, (void **)&c->fn)) {
        cg_unlock();
        free(c);
        return NULL;
    }
    c->refs = 1;
    c->next = codes;
    codes = c;
    cg_unlock();
    return c;
}

static cg_code *compile_claimed(const ir_kernel *k, const cg_plan *plan, const ke_cache_key *keyp, const char *hex,
                                const char *sym, double t0, double c0);

/* k's key, its hex form and its symbol's name. 0, or -1 (out of memory). */
static int key_of(const ir_kernel *k, ke_cache_key *key, char hex[65], char sym[40]) {
    sbuf s = {0};
    serialize(&s, k);
    if (s.oom) {
        free(s.p);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    kernel_key(key, k, &s);
    free(s.p);
    ke_cache_key_hex(key, hex);
    snprintf(sym, 40, "kiln_k_%.24s", hex);
    return 0;
}

/* Finds or makes the code of k. Called without cg_lock: the LLVM work runs in
 * this thread's compile slot, concurrently with other threads' compiles. */
static cg_code *get_code(const ir_kernel *k, const cg_plan *plan) {
    double t0 = now_ms(), c0 = cg_thread_cpu_ms();
    cg_lock();
    int bad = cg_jit_init();
    cg_unlock();
    if (bad) return NULL;
    for (int left = atomic_load(&fail_next); left > 0;)
        if (atomic_compare_exchange_weak(&fail_next, &left, left - 1)) {
            ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: forced compile failure (cg_llvm_fail_next)");
            return NULL;
        }
    ke_cache_key key;
    char hex[65], sym[40];
    if (key_of(k, &key, hex, sym)) return NULL;
    cg_lock();
    cg_code *c = find_code(&key);
    if (c) c->refs++;
    cg_unlock();
    int waited = 0;
    if (!c && (waited = inflight_claim(&key))) { /* another thread compiled it meanwhile (or failed: this one tries) */
        cg_lock();
        if ((c = find_code(&key))) c->refs++;
        cg_unlock();
        if (c) inflight_done();
    }
    if (c) {
        ke_log(KE_LOG_CODEGEN, "kernel %.16s: %d statements, %s (%.3f ms)", hex, k->nstmts,
               waited ? "compiled by another thread while this one waited" : "loaded already", now_ms() - t0);
        return c;
    }
    c = compile_claimed(k, plan, &key, hex, sym, t0, c0);
    inflight_done();
    return c;
}

/* get_code's compile of a key this thread has claimed (inflight_claim). */
static cg_code *compile_claimed(const ir_kernel *k, const cg_plan *plan, const ke_cache_key *keyp, const char *hex,
                                const char *sym, double t0, double c0) {
    ke_cache_key key = *keyp;
    cg_code *c = NULL;
    void *obj = NULL;
    size_t size = 0;
    int n0 = 0, n1 = 0, shared = 0;
    double ms[5] = {0, 0, 0, 0, 0}; /* optimize, codegen (wall, then CPU), IR */
    if (ke_cache_load(KE_CACHE_OBJ, &key, &obj, &size)) {
        c = install(&key, obj, size, sym, &shared);
        free(obj);
        obj = NULL;
        if (c) {
            ke_log(KE_LOG_CODEGEN, "kernel %.16s: %d statements, %s in %.2f ms, %zu-byte object", hex, k->nstmts,
                   shared ? "loaded by another thread meanwhile" : "cache hit", now_ms() - t0, size);
            return c;
        }
        /* a valid entry the JIT refuses: compile afresh */
        ke_log(KE_LOG_CODEGEN, "kernel %.16s: cached object refused, compiling", hex);
        kl_clear_error();
    }
    if (atomic_load(&hold)) { /* its key claimed: a test may fork now */
        atomic_fetch_add(&held, 1);
        while (atomic_load(&hold)) usleep(1000);
        atomic_fetch_sub(&held, 1);
    }
    if (cg_slot_acquire()) return NULL;
    char pbuf[1100];
    const char *dbg = debug_prefix(pbuf, sizeof pbuf, k, hex);
    LLVMModuleRef m = NULL;
    double t1 = now_ms();
    int rc = cg_emit_kernel(k, plan, sym, &m);
    ms[4] = now_ms() - t1;
    if (!rc) {
        rc = cg_jit_optimize_emit(m, sym, dbg, &obj, &size, &n0, &n1, ms);
        ir_backend_add_llvm_ms(ms[0] + ms[1]);
        if (!rc) atomic_fetch_add(&compiles, 1);
        LLVMDisposeModule(m);
    }
    cg_slot_release();
    if (!rc) {
        ke_cache_store(KE_CACHE_OBJ, &key, obj, size);
        c = install(&key, obj, size, sym, &shared);
    }
    free(obj);
    if (!c) return NULL;
    ke_log(KE_LOG_CODEGEN,
           "kernel %.16s: %d statements, %d -> %d LLVM instructions, %s in %.2f ms (IR %.2f, optimize %.2f, "
           "codegen %.2f; thread CPU %.2f: optimize %.2f, codegen %.2f), %zu-byte object",
           hex, k->nstmts, n0, n1,
           shared ? "compiled (another thread loaded it meanwhile)" : ke_cache_dir() ? "cache miss, compiled" : "compiled",
           now_ms() - t0, ms[4], ms[0], ms[1], cg_thread_cpu_ms() - c0, ms[2], ms[3], size);
    return c;
}

typedef struct get_code_args {
    const ir_kernel *k;
    const cg_plan *plan;
    cg_code *code;
} get_code_args;
static void get_code_guarded(void *p) {
    get_code_args *a = p;
    a->code = get_code(a->k, a->plan);
}

static void put_code(cg_code *c) {
    if (--c->refs > 0) return;
    for (cg_code **pp = &codes; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    cg_jit_remove(c->rt);
    free(c);
}

/* cg_guard, then what the frames LLVM's throw unwound did not do: release this thread's
 * slot (leaked) and cg_lock; after a fatal error, LLVM is off for the process. */
static int guarded(void (*fn)(void *), void *arg, char *why, size_t cap) {
    int g = cg_guard(fn, arg, why, cap);
    if (g) {
        inflight_done(); /* the unwound get_code did not */
        cg_slot_abandon();
        if (!cg_lock_held()) cg_lock();
        if (g == 2) cg_jit_disable(why);
        cg_unlock();
    }
    return g;
}

static void *compile(const ir_kernel *k, int strict) {
    if (k->ninputs + k->noutputs > CG_MAX_BUFS) {
        ke_err(KL_ERR_UNSUPPORTED, "compile", "llvm backend: a kernel with more than %d buffers", CG_MAX_BUFS);
        if (strict) return NULL;
    }
    cg_handle *h = calloc(1, sizeof *h);
    if (!h) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    h->k = k;
    if (k->ninputs + k->noutputs <= CG_MAX_BUFS) {
        cg_plan_make(&h->plan, k);
        get_code_args a = {k, &h->plan, NULL};
        char why[256];
        int g = guarded(get_code_guarded, &a, why, sizeof why);
        h->code = a.code;
        if (g)
            ke_err(g == 1 ? KL_ERR_OOM : KL_ERR_INTERNAL, "compile", "llvm backend: %s while compiling a kernel%s",
                   g == 1 ? "out of memory" : why, g == 1 ? "" : " (LLVM is disabled from now on)");
    }
    if (!h->code) {
        if (strict) {
            free(h);
            return NULL;
        }
        /* the interpreter takes what LLVM could not */
        atomic_fetch_add(&fallbacks, 1);
        ke_log(KE_LOG_FALLBACK, "falling back to the interpreter: %s", kl_last_error());
        kl_clear_error();
        void *ih = ir_interp_backend.compile(k);
        if (!ih) {
            free(h);
            return NULL;
        }
        atomic_store(&h->interp, ih);
    }
    return h;
}

/* ir_backend.load: k's code without compiling it: loaded already (shared), or the disk
 * cache's object. Keys being compiled by another thread are not waited for. */
typedef struct load_args {
    const ir_kernel *k;
    cg_code *code;
} load_args;
static void load_guarded(void *p) {
    load_args *a = p;
    double t0 = now_ms();
    cg_lock();
    int bad = cg_jit_init();
    cg_unlock();
    ke_cache_key key;
    char hex[65], sym[40];
    if (bad || key_of(a->k, &key, hex, sym)) return;
    cg_lock();
    if ((a->code = find_code(&key))) a->code->refs++;
    cg_unlock();
    void *obj = NULL;
    size_t size = 0;
    int shared = 0, cached = 0;
    if (!a->code && ke_cache_load(KE_CACHE_OBJ, &key, &obj, &size)) {
        a->code = install(&key, obj, size, sym, &shared);
        cached = !shared;
        free(obj);
    }
    if (a->code)
        ke_log(KE_LOG_CODEGEN, "kernel %.16s: %d statements, %s (%.3f ms)", hex, a->k->nstmts,
               cached ? "cache hit" : "loaded already", now_ms() - t0);
}
static void *cg_load(const ir_kernel *k) {
    if (k->ninputs + k->noutputs > CG_MAX_BUFS) return NULL;
    cg_handle *h = calloc(1, sizeof *h);
    if (!h) {
        kl_clear_error();
        return NULL;
    }
    h->k = k;
    cg_plan_make(&h->plan, k);
    load_args a = {k, NULL};
    char why[256];
    if (guarded(load_guarded, &a, why, sizeof why) || !a.code) {
        free(h); /* the compile in the background meets the failure again and reports it */
        kl_clear_error();
        return NULL;
    }
    h->code = a.code;
    return h;
}

static void *cg_compile(const ir_kernel *k) { return compile(k, 0); }
void *cg_llvm_compile_strict(const ir_kernel *k) { return compile(k, 1); }
int cg_llvm_is_compiled(const void *h) { return h && ((const cg_handle *)h)->code != NULL; }

static void cg_free(void *hp) {
    cg_handle *h = hp;
    if (!h) return;
    if (h->code) {
        cg_lock();
        put_code(h->code);
        cg_unlock();
    }
    void *ih = atomic_load(&h->interp);
    if (ih) ir_interp_backend.free(ih);
    free(h);
}

/* ---- run --------------------------------------------------------------------------- */

typedef struct cg_job {
    cg_entry fn;
    char *base[CG_MAX_BUFS + 1];
    int nb;
    int64_t scratch;
    _Atomic int64_t code;
    _Atomic int oom;
} cg_job;

static void run_range(void *ctx, int64_t begin, int64_t end) {
    cg_job *j = ctx;
    char *base[CG_MAX_BUFS + 1];
    _Alignas(64) char local[16384];
    memcpy(base, j->base, sizeof base);
    char *heap = NULL;
    if (j->scratch > (int64_t)sizeof local) {
        heap = malloc((size_t)j->scratch);
        if (!heap) {
            atomic_store(&j->oom, 1);
            return;
        }
        base[j->nb] = heap;
    } else {
        base[j->nb] = local;
    }
    int64_t rc = j->fn(begin, end, base);
    if (rc) {
        int64_t expected = 0;
        atomic_compare_exchange_strong(&j->code, &expected, rc);
    }
    free(heap);
}

static int run_interp(cg_handle *h, kl_tensor *const *in, kl_tensor *const *out) {
    void *ih = atomic_load(&h->interp);
    if (!ih) {
        ih = ir_interp_backend.compile(h->k);
        if (!ih) return -1;
        void *expected = NULL;
        if (!atomic_compare_exchange_strong(&h->interp, &expected, ih)) {
            ir_interp_backend.free(ih);
            ih = expected;
        }
    }
    return ir_interp_backend.run(ih, in, out);
}

static int cg_run(void *hp, kl_tensor *const *in, kl_tensor *const *out) {
    cg_handle *h = hp;
    const ir_kernel *k = h->k;
    if (!h->code) return run_interp(h, in, out);
    cg_job j = {.fn = h->code->fn, .nb = h->plan.nb, .scratch = h->plan.scratch};
    int64_t total = ke_numel(k->ndim, k->shape);
    for (int b = 0; b < j.nb; b++) {
        kl_tensor *t = b < k->ninputs ? in[b] : out[b - k->ninputs];
        const ir_kbuf *kb = &k->bufs[b];
        if (t->dtype != kb->dtype || t->ndim != kb->ndim || memcmp(t->shape, kb->shape, sizeof(int64_t) * t->ndim) ||
            t->storage->device.type != KL_CPU)
            return ke_err(KL_ERR_INTERNAL, "fn_call", "llvm backend: buffer %d does not match the kernel", b);
        int64_t st[KL_MAX_DIMS];
        ke_broadcast_strides(t, k->ndim, k->shape, st);
        for (int d = 0; d < k->ndim; d++)
            if (k->shape[d] != 1 && st[d] != kb->index[d] && total > 0) {
                ke_log(KE_LOG_FALLBACK, "buffer %d has strides the kernel was not compiled for: interpreting", b);
                return run_interp(h, in, out);
            }
        j.base[b] = ke_data(t);
    }
    if (!k->row && total == 0) return 0;
    if (h->plan.items <= 0) return 0;
    int64_t grain = GRAIN / h->plan.per_item > 0 ? GRAIN / h->plan.per_item : 1;
    ke_parallel_for(h->plan.items, grain, run_range, &j);
    if (atomic_load(&j.oom)) return ke_err(KL_ERR_OOM, "fn_call", "out of memory running a kernel");
    int64_t code = atomic_load(&j.code);
    if (code) {
        int err = (int)(code & 0xffffffff), op = (int)(code >> 32);
        const char *name = op >= 0 && op < KE_OP_COUNT ? ke_ops[op].name : "fn_call";
        if (err == KE_EW_INT_DIV_ZERO) return ke_err(KL_ERR_ARG, name, "integer division by zero");
        return ke_err(KL_ERR_INTERNAL, name, "elementwise loop failed");
    }
    return 0;
}

/* ir_backend.dump: k's module as emitted, before LLVM optimizes it. */
static int cg_dump(const ir_kernel *k, const char *path) {
    if (k->ninputs + k->noutputs > CG_MAX_BUFS)
        return ke_err(KL_ERR_UNSUPPORTED, "compile", "llvm backend: a kernel with more than %d buffers", CG_MAX_BUFS);
    cg_plan plan;
    cg_plan_make(&plan, k);
    int rc = cg_slot_acquire();
    LLVMModuleRef m = NULL;
    if (!rc) rc = cg_emit_kernel(k, &plan, "kiln_kernel", &m);
    if (!rc) {
        char *msg = NULL;
        if (LLVMPrintModuleToFile(m, path, &msg))
            rc = ke_err(KL_ERR_IO, "compile", "cannot write %s: %s", path, msg ? msg : "");
        if (msg) LLVMDisposeMessage(msg);
        LLVMDisposeModule(m);
    }
    cg_slot_release();
    return rc;
}

/* ---- one-time setup off the critical path ---------------------------------------------- */

/* kl_compile calls this: a thread creates the JIT and the first compile slot
 * (context, eager bitcode, target machine: ~7 ms) while the caller traces and
 * runs the passes; the first compile waits on cg_lock or takes the slot. The
 * thread is joined at exit (a handler registered after the JIT's own, so it
 * runs before it). KL_LLVM_PREPARE=0 leaves the setup to the first compile. */
static pthread_t prep_thread;
static void prep_work(void *u) {
    (void)u;
    if (!cg_slot_acquire()) cg_slot_release();
}
static void *prep_main(void *u) {
    (void)u;
    ke_thread_background(); /* a tiered first call runs eagerly meanwhile: it keeps the cores */
    char why[256];
    guarded(prep_work, NULL, why, sizeof why);
    kl_clear_error(); /* a failure stays in the backend's state; the first compile reports it */
    return NULL;
}
static pid_t prep_pid; /* a forked child has no prepare thread to join */
static void prep_join(void) {
    if (getpid() == prep_pid) pthread_join(prep_thread, NULL);
}
static void prep_start(void) {
    cg_jit_register_shutdown(); /* first: background compiles' exit handlers come after it */
    cg_arm_exit_gate();
    const char *e = getenv("KL_LLVM_PREPARE");
    if (e && !strcmp(e, "0")) return;
    prep_pid = getpid();
    if (!pthread_create(&prep_thread, NULL, prep_main, NULL)) atexit(prep_join);
}
static void cg_prepare(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, prep_start);
}

const ir_backend cg_llvm_backend = {
    .name = "llvm",
    .device = KL_CPU,
    .priority = 10,
    .compile = cg_compile,
    .run = cg_run,
    .free = cg_free,
    .dump = cg_dump,
    .concurrent = 1,
    .prepare = cg_prepare,
    .load = cg_load,
};
