/*
 * test_compile_async.c — compile latency (issue 15 part 3): the kernels of one
 * graph compiled in parallel on the thread pool give the same objects and
 * outputs as a serial compile, and those objects come back from the disk
 * cache; concurrent compiles from several threads; tiered execution
 * (KL_COMPILE_ASYNC / kl_compile_options.async): eager first calls while the
 * kernels compile in the background, then the compiled graph, equal results,
 * release while compiling, calls from several threads, exit while compiling; the
 * interpreter tier (kl_compile_options.interp_tier / KL_COMPILE_INTERP): kernels run on the
 * interpreter until their code is loaded, bitwise equal across the switch, dynamic sizes,
 * code loaded or cached taken at once, the switches, release, fork and exit meanwhile.
 *
 * The binary re-executes itself (/proc/self/exe --child-exit) for the check
 * that exits while a background compile runs.
 */
#include "harness.h"

#include "cg_llvm.h"
#include "kernel.h"
#include "threadpool.h"
#ifdef KL_HAVE_LLVM
#include "../src/eager/diskcache.h"
#endif

#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double kt_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#ifdef KL_HAVE_LLVM

/* h = matmul(tanh(clamp(h, -1, hi_i)), w) for i < n: n kernels whose code differs
 * (clamp's bound is compiled in), the bounds offset by u's salt so no other test
 * process has them cached. in: x [4,8], w [8,8]. */
typedef struct chain_args {
    int n;
    double salt;
} chain_args;
static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const chain_args *a = u;
    kl_tensor *h = in[0];
    for (int i = 0; i < a->n; i++) h = kl_matmul(kl_tanh(kl_clamp(h, -1, 1 + i / 64.0 + a->salt)), in[1]);
    return (out[0] = h) ? 0 : -1;
}

static kl_tensor *seqf(int64_t r, int64_t c, double scale) {
    kl_tensor *t = kl_mul_scalar(kl_arange(0, (double)(r * c), 1, KL_F32), scale);
    return kl_reshape(kl_sin(t), KL_SHAPE(r, c));
}

/* Objects in dir (name -> bytes), at most 64. */
typedef struct objset {
    int n;
    char name[64][80];
    char *data[64];
    size_t size[64];
} objset;

static void objs_read(const char *dir, objset *s) {
    memset(s, 0, sizeof *s);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".o.kc")) continue;
        assert_true(s->n < 64);
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        s->size[s->n] = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        s->data[s->n] = malloc(s->size[s->n] + 1);
        assert_int_equal(fread(s->data[s->n], 1, s->size[s->n], f), s->size[s->n]);
        fclose(f);
        snprintf(s->name[s->n], sizeof s->name[0], "%s", e->d_name);
        s->n++;
    }
    closedir(d);
}

static void objs_remove(const char *dir, const objset *s) {
    for (int i = 0; i < s->n; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, s->name[i]);
        assert_int_equal(unlink(path), 0);
    }
}

static void objs_free(objset *s) {
    for (int i = 0; i < s->n; i++) free(s->data[i]);
}

/* Compiled at the first call (interpreter tier off: on by default with two threads): these
 * tests look at the compile that call makes. */
static kl_fn *compile_now(kl_traceable fn, void *u) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1;
    return kl_compile(fn, u, &o);
}

/* One compile of chain at the pool size given: its output, and the LLVM time it took. */
static kl_tensor *compile_chain(chain_args *a, int threads, kl_tensor *const *in, double *llvm_ms) {
    kl_set_num_threads(threads);
    kl_fn *f = compile_now(chain, a);
    usleep(100000); /* the one-time setup kl_compile started is done: it would count as a compile */
    cg_llvm_peak_compiles(1);
    double l0 = ir_backend_llvm_ms();
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    *llvm_ms = ir_backend_llvm_ms() - l0;
    int peak = cg_llvm_peak_compiles(0);
    /* KL_NUM_THREADS=1 compiles serially; with more, never more compiles at
     * once than threads. (Whether the pool's helper actually took a kernel
     * depends on scheduling: printed, not asserted, so a loaded CI machine
     * cannot fail it.) */
    if (*llvm_ms > 0 && threads == 1) assert_int_equal(peak, 1);
    assert_true(peak <= threads);
    if (threads > 1) print_message("%d threads: at most %d kernels compiled at once\n", threads, peak);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.kernels - st.library_calls, a->n); /* n kernels, n matmuls */
    kl_fn_release(f); /* unloads the kernels: the next compile starts afresh */
    return y;
}

/* The same objects, byte for byte, whether the graph's kernels compile on two
 * threads or one; the outputs equal eager's bitwise; a third compile takes every
 * object from the disk cache (no LLVM time) and gives the same output. */
static void parallel_compile_equals_serial(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("par_cache");
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
    chain_args a = {12, (double)(getpid() % 1000) / 1e4};
    kl_tensor *in[2] = {seqf(4, 8, 0.37), kl_mul_scalar(seqf(8, 8, 0.11), 0.5)};
    kl_tensor *want = NULL;
    assert_int_equal(chain(&a, in, 2, &want, 1), 0);
    double ms_par, ms_ser, ms_cached;
    kl_tensor *y_par = compile_chain(&a, 2, in, &ms_par);
    assert_int_equal(kl_equal(y_par, want), 1);
    objset par, ser;
    objs_read(dir, &par);
    assert_int_equal(par.n, a.n);
    assert_true(ms_par > 0);
    objs_remove(dir, &par);
    kl_tensor *y_ser = compile_chain(&a, 1, in, &ms_ser);
    assert_int_equal(kl_equal(y_ser, want), 1);
    objs_read(dir, &ser);
    assert_int_equal(ser.n, par.n);
    for (int i = 0; i < par.n; i++) {
        int j = 0;
        while (j < ser.n && strcmp(ser.name[j], par.name[i])) j++;
        assert_true(j < ser.n);
        assert_int_equal(ser.size[j], par.size[i]);
        assert_memory_equal(ser.data[j], par.data[i], par.size[i]);
    }
    ke_cache_stats s0, s1;
    ke_cache_get_stats(&s0);
    kl_tensor *y_cached = compile_chain(&a, 2, in, &ms_cached);
    ke_cache_get_stats(&s1);
    assert_int_equal(s1.hits - s0.hits, a.n);
    assert_int_equal(s1.stores, s0.stores);
    assert_true(ms_cached == 0);
    assert_int_equal(kl_equal(y_cached, want), 1);
    objs_free(&par);
    objs_free(&ser);
    kl_set_num_threads(2);
    setenv("KL_CACHE_DIR", "off", 1);
    ke_cache_reset();
}

/* h = matmul(tanh(clamp(h, -1, 1 + salt)), w), n times: n identical kernels. */
static int same_chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const chain_args *a = u;
    kl_tensor *h = in[0];
    for (int i = 0; i < a->n; i++) h = kl_matmul(kl_tanh(kl_clamp(h, -1, 1 + a->salt)), in[1]);
    return (out[0] = h) ? 0 : -1;
}

/* A graph holding the same kernel several times compiles it once, also on two threads
 * (a thread whose kernel another thread is compiling waits for it instead of compiling
 * it too: the claim order puts copies last, and the LLVM backend compiles a key once). */
static void identical_kernels_compile_once(void **state) {
    (void)state;
    kl_tensor *in[2] = {seqf(4, 8, 0.29), kl_mul_scalar(seqf(8, 8, 0.13), 0.5)};
    for (int rep = 0; rep < 4; rep++) {
        chain_args a = {8, (double)(getpid() % 1000) / 1e4 + rep / 7.0 + 0.01};
        kl_tensor *want = NULL, *y = NULL;
        assert_int_equal(same_chain(&a, in, 2, &want, 1), 0);
        kl_set_num_threads(2);
        kl_fn *f = compile_now(same_chain, &a);
        int64_t c0 = cg_llvm_compiles();
        assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
        assert_int_equal(cg_llvm_compiles() - c0, 1);
        assert_int_equal(kl_equal(y, want), 1);
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.kernels - st.library_calls, a.n);
        kl_fn_release(f);
    }
}

/* Kernels LLVM refuses inside a parallel compile (cg_llvm_fail_next, on whichever
 * thread claims them) run on the interpreter; the call still equals eager. */
static void parallel_compile_failures_fall_back(void **state) {
    (void)state;
    kl_set_num_threads(2);
    chain_args a = {8, 0.5 + (double)(getpid() % 1000) / 1e4};
    kl_tensor *in[2] = {seqf(4, 8, 0.29), kl_mul_scalar(seqf(8, 8, 0.13), 0.5)};
    kl_tensor *want = NULL;
    assert_int_equal(chain(&a, in, 2, &want, 1), 0);
    int64_t fb0 = cg_llvm_fallbacks();
    cg_llvm_fail_next(3);
    kl_fn *f = compile_now(chain, &a);
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    cg_llvm_fail_next(0);
    assert_int_equal(cg_llvm_fallbacks() - fb0, 3);
    assert_int_equal(kl_equal(y, want), 1);
    kl_fn_release(f);
}

/* Four threads compile (and call) functions at once, two of them the same kernels:
 * the compile slots are shared out, code loaded by one thread is shared, nothing
 * is defined twice in the JIT, and every result equals eager. */
typedef struct worker {
    chain_args a;
    int ok;
} worker;
static void *compile_worker(void *p) {
    worker *w = p;
    kl_scope_begin();
    kl_tensor *in[2] = {seqf(4, 8, 0.21), kl_mul_scalar(seqf(8, 8, 0.17), 0.5)};
    kl_tensor *want = NULL, *y = NULL;
    w->ok = chain(&w->a, in, 2, &want, 1) == 0;
    for (int r = 0; r < 3 && w->ok; r++) {
        kl_fn *f = compile_now(chain, &w->a);
        w->ok = kl_fn_call(f, in, 2, &y, 1) == 0 && kl_equal(y, want) == 1;
        kl_fn_release(f);
    }
    kl_scope_end();
    return NULL;
}

static void concurrent_compiles_from_threads(void **state) {
    (void)state;
    double salt = 0.25 + (double)(getpid() % 1000) / 1e4;
    worker w[4] = {{{6, salt}, 0}, {{6, salt}, 0}, {{5, salt + 0.1}, 0}, {{7, salt + 0.2}, 0}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, compile_worker, &w[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) assert_true(w[i].ok);
}

/* ---- tiered execution ------------------------------------------------------------------ */

static kl_fn *compile_async(kl_traceable fn, void *u) {
    kl_compile_options o = kl_compile_options_default();
    o.async = 1;
    o.name = "tiered";
    return kl_compile(fn, u, &o);
}

/* A row kernel (softmax, decomposed and fused) besides elementwise ones: compiled it
 * equals eager within the row kernels' documented 1e-5, elementwise ones bitwise. */
static _Thread_local int mixed_ran_serial; /* mixed ran with ke_thread_serial on (a tiered eager call) */
static int mixed(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const chain_args *a = u;
    mixed_ran_serial |= ke_thread_is_serial();
    kl_tensor *h = kl_softmax(kl_mul_scalar(in[0], 1.5 + a->salt), -1);
    out[0] = kl_matmul(kl_tanh(kl_clamp(h, -1, 0.75 + a->salt)), in[1]);
    out[1] = kl_sigmoid(kl_add_scalar(in[0], a->salt));
    return out[0] && out[1] ? 0 : -1;
}

/* The first calls run eagerly (counted in async_eager_calls) and equal eager bitwise; once
 * the kernels are compiled the calls run them: cache hits, not eager calls, LLVM kernels in
 * kl_fn_explain, results equal eager within tolerance (row kernel) or bitwise. */
static void async_first_calls_eager_then_compiled(void **state) {
    (void)state;
    kl_set_num_threads(2);
    chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.01};
    kl_tensor *in[2] = {seqf(4, 8, 0.41), kl_mul_scalar(seqf(8, 8, 0.07), 0.5)};
    kl_tensor *want[2], *y[2];
    assert_int_equal(mixed(&a, in, 2, want, 2), 0);
    kl_fn *f = compile_async(mixed, &a);
    assert_int_equal(kl_fn_call(f, in, 2, y, 2), 0);
    assert_int_equal(kl_equal(y[0], want[0]), 1);
    assert_int_equal(kl_equal(y[1], want[1]), 1);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    assert_true(st.async_eager_calls >= 1);
    assert_int_equal(st.eager_calls, st.async_eager_calls);
    assert_int_equal(kl_fn_wait_compiled(f), 0);
    kl_fn_get_stats(f, &st);
    int64_t eager0 = st.async_eager_calls, hits0 = st.cache_hits;
    for (int r = 0; r < 3; r++) {
        assert_int_equal(kl_fn_call(f, in, 2, y, 2), 0);
        assert_int_equal(kl_allclose(y[0], want[0], 1e-5, 1e-6, false), 1);
        assert_int_equal(kl_equal(y[1], want[1]), 1);
    }
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.async_eager_calls, eager0);
    assert_int_equal(st.cache_hits, hits0 + 3);
    assert_int_equal(st.traces, 1);
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    assert_int_equal(kl_fn_explain(f, m), 0);
    fclose(m);
    assert_non_null(strstr(buf, "llvm)"));
    assert_null(strstr(buf, "compiling in the background"));
    free(buf);
    assert_int_equal(kl_fn_wait_compiled(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "NULL");
    kl_fn_release(f);
}

/* A second batch size makes a dynamic entry (automatic dynamic): tiered too. Its first
 * calls run eagerly while the template's kernels compile, then it runs compiled, at that
 * size and, specialised, at a third one (no trace); results equal eager (the row kernel
 * within 1e-5). Released while the dynamic entry compiles: cancelled, nothing used after
 * it is freed. The template's kernels are the static entry's (the same code, loaded already
 * once that is compiled), so its compile took 0.1 ms and once (under TSan) was over before
 * its first call looked at it: the static entry's compile is held in LLVM (its keys
 * claimed) until both first calls are over, and the template's waits for those keys. */
static void async_dynamic_retrace_tiered(void **state) {
    (void)state;
    kl_set_num_threads(2);
    for (int rel = 0; rel < 2; rel++) {
        chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.05 + rel * 0.001};
        kl_tensor *w = kl_mul_scalar(seqf(8, 8, 0.07), 0.5);
        kl_fn *f = compile_async(mixed, &a);
        const int64_t rows[3] = {4, 6, 9};
        kl_tensor *in[3][2], *want[3][2], *y[2];
        for (int b = 0; b < 3; b++) {
            in[b][0] = seqf(rows[b], 8, 0.37 + 0.01 * b), in[b][1] = w;
            assert_int_equal(mixed(&a, in[b], 2, want[b], 2), 0);
        }
        kl_fn_stats st0, st;
        cg_llvm_hold_compiles(1);
        for (int b = 0; b < 2; b++) { /* new entries: traced, run eagerly (bitwise eager), on
                                       * the calling thread alone (the compile has the other core) */
            kl_fn_get_stats(f, &st0);
            mixed_ran_serial = 0;
            int rc = kl_fn_call(f, in[b], 2, y, 2);
            kl_fn_get_stats(f, &st);
            if (rc || st.traces != st0.traces + 1 || st.async_eager_calls != st0.async_eager_calls + 1)
                cg_llvm_hold_compiles(0); /* the failure is reported, not a hang at release */
            assert_int_equal(rc, 0);
            assert_int_equal(st.traces, st0.traces + 1);
            assert_int_equal(st.async_eager_calls, st0.async_eager_calls + 1);
            assert_int_equal(mixed_ran_serial, 1);
            assert_int_equal(ke_thread_is_serial(), 0);
            assert_int_equal(kl_equal(y[0], want[b][0]), 1);
            assert_int_equal(kl_equal(y[1], want[b][1]), 1);
        }
        cg_llvm_hold_compiles(0);
        kl_fn_get_stats(f, &st);
        assert_int_equal(st.dynamic_entries, 1);
        if (rel) { /* released while the dynamic entry compiles */
            kl_fn_release(f);
            continue;
        }
        assert_int_equal(kl_fn_wait_compiled(f), 0);
        for (int b = 0; b < 3; b++) { /* compiled: no trace, no eager call */
            kl_fn_get_stats(f, &st0);
            assert_int_equal(kl_fn_call(f, in[b], 2, y, 2), 0);
            kl_fn_get_stats(f, &st);
            assert_int_equal(st.traces, st0.traces);
            assert_int_equal(st.async_eager_calls, st0.async_eager_calls);
            assert_int_equal(st.eager_calls, st0.eager_calls);
            if (b == 2) assert_int_equal(st.specialisations, st0.specialisations + 1);
            assert_int_equal(kl_allclose(y[0], want[b][0], 1e-5, 1e-6, false), 1);
            assert_int_equal(kl_equal(y[1], want[b][1]), 1);
        }
        kl_fn_get_stats(f, &st);
        assert_int_equal(st.traces, 2);
        kl_fn_release(f);
    }
}

/* $KL_COMPILE_ASYNC overrides the option both ways. */
static void async_env_overrides_option(void **state) {
    (void)state;
    chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.02};
    kl_tensor *in[2] = {seqf(4, 8, 0.43), kl_mul_scalar(seqf(8, 8, 0.05), 0.5)};
    kl_tensor *y[2];
    setenv("KL_COMPILE_ASYNC", "0", 1);
    kl_fn *f = compile_async(mixed, &a); /* option on, environment off: compiles at once */
    assert_int_equal(kl_fn_call(f, in, 2, y, 2), 0);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.async_eager_calls, 0);
    assert_int_equal(st.eager_calls, 0);
    kl_fn_release(f);
    a.salt += 0.005;
    setenv("KL_COMPILE_ASYNC", "1", 1);
    f = kl_compile(mixed, &a, NULL); /* default options, environment on */
    assert_int_equal(kl_fn_call(f, in, 2, y, 2), 0);
    kl_fn_get_stats(f, &st);
    assert_true(st.async_eager_calls >= 1);
    unsetenv("KL_COMPILE_ASYNC");
    kl_fn_release(f);
}

/* Released while its kernels compile: the compile is cancelled and waited for (ASan
 * sees no use of the freed graph), quickly (not all 40 kernels compile). */
static void release_while_compiling(void **state) {
    (void)state;
    for (int r = 0; r < 3; r++) {
        chain_args a = {40, (double)(getpid() % 1000) / 1e4 + 0.03 + r * 0.001};
        kl_tensor *in[2] = {seqf(4, 8, 0.31), kl_mul_scalar(seqf(8, 8, 0.09), 0.5)};
        kl_tensor *want = NULL, *y = NULL;
        assert_int_equal(chain(&a, in, 2, &want, 1), 0);
        kl_fn *f = compile_async(chain, &a);
        assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
        assert_int_equal(kl_equal(y, want), 1);
        if (r == 1) usleep(20000); /* let some kernels compile */
        kl_fn_release(f);
    }
}

/* Several threads call one tiered function while its kernels compile and after: every
 * result equals eager; one trace; eager calls first, then compiled ones. */
typedef struct caller {
    kl_fn *f;
    chain_args *a;
    int ok;
} caller;
static void *call_worker(void *p) {
    caller *c = p;
    kl_scope_begin();
    kl_tensor *in[2] = {seqf(4, 8, 0.23), kl_mul_scalar(seqf(8, 8, 0.19), 0.5)};
    kl_tensor *want[2], *y[2];
    c->ok = mixed(c->a, in, 2, want, 2) == 0;
    /* until calls ran compiled (the switch happens while the threads call), 20 s at most */
    double t0 = kt_now_s();
    for (int r = 0; c->ok && kt_now_s() - t0 < 20; r++) {
        kl_scope_begin();
        c->ok = kl_fn_call(c->f, in, 2, y, 2) == 0 && kl_allclose(y[0], want[0], 1e-5, 1e-6, false) == 1 &&
                kl_equal(y[1], want[1]) == 1;
        kl_scope_end();
        kl_fn_stats st;
        kl_fn_get_stats(c->f, &st);
        if (r >= 40 && st.cache_hits - st.async_eager_calls >= 40) break;
    }
    kl_scope_end();
    return NULL;
}

static void calls_from_threads_while_compiling(void **state) {
    (void)state;
    chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.04};
    kl_fn *f = compile_async(mixed, &a);
    caller c[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (caller){f, &a, 0};
        assert_int_equal(pthread_create(&t[i], NULL, call_worker, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) assert_true(c[i].ok);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_true(st.calls >= 160);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.cache_hits, st.calls - 1);
    assert_int_equal(st.eager_calls, st.async_eager_calls);
    assert_true(st.async_eager_calls >= 1);                  /* the first call at least */
    assert_true(st.cache_hits - st.async_eager_calls >= 40); /* and then compiled ones */
    kl_fn_release(f);
}

/* ---- the interpreter tier --------------------------------------------------------------- */

static kl_fn *compile_interp(kl_traceable fn, void *u, int tier) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = tier;
    o.name = "interp-tier";
    return kl_compile(fn, u, &o);
}

/* Wider kernels than mixed's (vector loops, tails, rows over a fold chunk): a softmax row
 * kernel, a sum row kernel, and an elementwise chain. in: x [rows, 2100]. */
static int wide(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const chain_args *a = u;
    kl_tensor *x = in[0];
    out[0] = kl_softmax(kl_mul_scalar(x, 1.3 + a->salt), -1);
    out[1] = kl_sum(kl_exp(kl_mul_scalar(x, 0.5)), 1, (int64_t[]){-1}, true);
    out[2] = kl_add(kl_gelu(x), kl_mul(kl_sigmoid(kl_add_scalar(x, a->salt)), x));
    return out[0] && out[1] && out[2] ? 0 : -1;
}

static int64_t interp_calls(const kl_fn *f) {
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    return st.interp_calls;
}

static int explain_has(const kl_fn *f, const char *needle) {
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    assert_int_equal(kl_fn_explain(f, m), 0);
    fclose(m);
    int has = strstr(buf, needle) != NULL;
    free(buf);
    return has;
}

/* With LLVM held back, calls run every kernel on the interpreter (interp_calls counts
 * them; nothing runs eagerly); once the code is loaded they run it. The outputs of the
 * calls before and after the switch are bitwise equal (row kernels included: the
 * interpreter folds as the LLVM code does), elementwise ones bitwise eager's too. */
static void interp_tier_bitwise_across_switch(void **state) {
    (void)state;
    kl_set_num_threads(2);
    chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.07};
    for (int rows = 3; rows <= 64; rows += 61) {
        a.salt += 0.001;
        kl_tensor *x = kl_mul_scalar(seqf(rows, 2100, 0.013), 3.0);
        kl_tensor *want[3], *y0[3], *y[3];
        assert_int_equal(wide(&a, &x, 1, want, 3), 0);
        kl_fn *f = compile_interp(wide, &a, 1);
        cg_llvm_hold_compiles(1);
        int64_t c0 = cg_llvm_compiles();
        for (int r = 0; r < 3; r++) {
            assert_int_equal(kl_fn_call(f, &x, 1, r ? y : y0, 3), 0);
            assert_int_equal(interp_calls(f), r + 1);
        }
        for (int i = 0; i < 3; i++) assert_int_equal(kl_equal(y[i], y0[i]), 1);
        assert_int_equal(cg_llvm_compiles(), c0); /* all three calls interpreted */
        assert_true(explain_has(f, "interp (tier 0)"));
        assert_true(explain_has(f, "until its code is loaded"));
        cg_llvm_hold_compiles(0);
        assert_int_equal(kl_fn_wait_compiled(f), 0);
        assert_true(cg_llvm_compiles() > c0);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(kl_fn_call(f, &x, 1, y, 3), 0);
            for (int i = 0; i < 3; i++) assert_int_equal(kl_equal(y[i], y0[i]), 1);
        }
        assert_int_equal(interp_calls(f), 3);
        assert_false(explain_has(f, "interp (tier 0)"));
        assert_true(explain_has(f, "llvm)"));
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        assert_int_equal(st.eager_calls, 0);
        assert_int_equal(st.async_eager_calls, 0);
        assert_int_equal(st.traces, 1);
        assert_int_equal(kl_allclose(y0[0], want[0], 1e-5, 1e-6, false), 1);
        assert_int_equal(kl_allclose(y0[1], want[1], 1e-5, 1e-6, false), 1);
        assert_int_equal(kl_equal(y0[2], want[2]), 1);
        kl_fn_release(f);
    }
}

/* Calls whose kernels still run on the interpreter run on the calling thread alone, as
 * the tiered eager fallback does (the compile holds the other core: OpenBLAS's caller
 * spun for a starved helper, 8-12 ms first calls instead of 2): the dispatcher's log
 * callback, called from inside the graph's library call (the matmul), sees the thread
 * serial then, and not once the code is loaded; the setting is restored after the call. */
static int serial_seen, dispatch_lines;
static void serial_probe(void *u, const char *category, kl_log_level level, const char *message) {
    (void)u, (void)level, (void)message;
    if (strcmp(category, "dispatch")) return;
    dispatch_lines++;
    serial_seen |= ke_thread_is_serial();
}
static int mm_relu(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_relu(kl_add_scalar(kl_matmul(in[0], in[1]), 0.5));
    return out[0] ? 0 : -1;
}
static void interp_tier_calls_run_serial(void **state) {
    (void)state;
    kl_set_num_threads(2);
    kl_tensor *in[2] = {seqf(64, 96, 0.01), seqf(96, 80, 0.02)}, *y;
    kl_fn *f = compile_interp(mm_relu, NULL, 1);
    assert_int_equal(kl_set_log("+dispatch"), 0);
    kl_set_log_callback(serial_probe, NULL);
    cg_llvm_hold_compiles(1);
    for (int r = 0; r < 2; r++) {
        serial_seen = dispatch_lines = 0;
        assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
        assert_int_equal(interp_calls(f), r + 1);
        assert_true(dispatch_lines > 0);
        assert_int_equal(serial_seen, 1);
        assert_int_equal(ke_thread_is_serial(), 0);
    }
    cg_llvm_hold_compiles(0);
    assert_int_equal(kl_fn_wait_compiled(f), 0);
    serial_seen = dispatch_lines = 0;
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_int_equal(interp_calls(f), 2);
    assert_true(dispatch_lines > 0);
    assert_int_equal(serial_seen, 0);
    kl_set_log_callback(NULL, NULL);
    assert_int_equal(kl_set_log(NULL), 0);
    kl_fn_release(f);
}

/* A dynamic entry (automatic dynamic) is tiered too: its template and a size specialised
 * while the template compiles run on the interpreter, then compiled (the copy's kernels
 * when the template's are: tr_dyn_compile_pending), bitwise the same. */
static void interp_tier_dynamic_sizes(void **state) {
    (void)state;
    kl_set_num_threads(2);
    chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.08};
    kl_tensor *w = kl_mul_scalar(seqf(8, 8, 0.07), 0.5);
    kl_fn *f = compile_interp(mixed, &a, 1);
    const int64_t rows[3] = {4, 6, 9};
    kl_tensor *in[3][2], *y0[3][2], *y[2];
    for (int b = 0; b < 3; b++) {
        in[b][0] = seqf(rows[b], 8, 0.37 + 0.01 * b);
        in[b][1] = w;
    }
    cg_llvm_hold_compiles(1);
    for (int b = 0; b < 3; b++) { /* 4: static entry; 6: the dynamic entry's template; 9: a copy */
        assert_int_equal(kl_fn_call(f, in[b], 2, y0[b], 2), 0);
        assert_int_equal(interp_calls(f), b + 1);
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.dynamic_entries, 1);
    assert_int_equal(st.traces, 2);
    cg_llvm_hold_compiles(0);
    assert_int_equal(kl_fn_wait_compiled(f), 0);
    int64_t n0 = interp_calls(f);
    for (int b = 0; b < 3; b++) {
        kl_tensor *want[2];
        assert_int_equal(kl_fn_call(f, in[b], 2, y, 2), 0);
        assert_int_equal(kl_equal(y[0], y0[b][0]), 1);
        assert_int_equal(kl_equal(y[1], y0[b][1]), 1);
        assert_int_equal(mixed(&a, in[b], 2, want, 2), 0);
        assert_int_equal(kl_allclose(y[0], want[0], 1e-5, 1e-6, false), 1);
        assert_int_equal(kl_equal(y[1], want[1]), 1);
    }
    assert_int_equal(interp_calls(f), n0); /* all compiled now, the copy at 9 too */
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.eager_calls, 0);
    kl_fn_release(f);
}

/* Kernels whose code costs no compile run it from the first call: code loaded in this
 * process already (a second function with the same kernels), or the disk cache's
 * objects (after the first function is released), even while LLVM is held back. */
static void interp_tier_loads_at_once(void **state) {
    (void)state;
    kl_set_num_threads(2);
    const char *dir = kt_tmp_path("interp_cache");
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
    chain_args a = {3, (double)(getpid() % 1000) / 1e4 + 0.09};
    kl_tensor *in[2] = {seqf(4, 8, 0.29), kl_mul_scalar(seqf(8, 8, 0.13), 0.5)}, *y0, *y;
    kl_fn *f = compile_interp(chain, &a, 1);
    assert_int_equal(kl_fn_call(f, in, 2, &y0, 1), 0);
    assert_int_equal(kl_fn_wait_compiled(f), 0);
    cg_llvm_hold_compiles(1);
    kl_fn *g = compile_interp(chain, &a, 1); /* loaded already */
    assert_int_equal(kl_fn_call(g, in, 2, &y, 1), 0);
    assert_int_equal(interp_calls(g), 0);
    assert_int_equal(kl_equal(y, y0), 1);
    kl_fn_release(g);
    kl_fn_release(f); /* the code is unloaded: the next function finds the disk cache */
    int64_t c0 = cg_llvm_compiles();
    f = compile_interp(chain, &a, 1);
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_int_equal(interp_calls(f), 0);
    assert_int_equal(cg_llvm_compiles(), c0);
    assert_int_equal(kl_equal(y, y0), 1);
    assert_true(explain_has(f, "llvm)"));
    cg_llvm_hold_compiles(0);
    kl_fn_release(f);
    setenv("KL_CACHE_DIR", "off", 1);
    ke_cache_reset();
}

/* The default (off, with one thread or two); the option and $KL_COMPILE_INTERP turn it
 * on or off; async (the eager tier) takes precedence. */
static void interp_tier_switches(void **state) {
    (void)state;
    kl_tensor *in[2] = {seqf(4, 8, 0.47), kl_mul_scalar(seqf(8, 8, 0.03), 0.5)}, *y[2];
    /* {threads, option, env (NULL: unset), async, on?} */
    const struct {
        int threads, tier;
        const char *env;
        int async, on;
    } cases[] = {{2, 0, NULL, 0, 1}, {1, 0, NULL, 0, 0}, {2, -1, NULL, 0, 0}, {1, 1, NULL, 0, 1},
                 {2, 1, "0", 0, 0},  {2, -1, "1", 0, 1}, {2, 1, NULL, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        chain_args a = {0, (double)(getpid() % 1000) / 1e4 + 0.1 + 0.001 * (double)c};
        kl_set_num_threads(cases[c].threads);
        if (cases[c].env) setenv("KL_COMPILE_INTERP", cases[c].env, 1);
        kl_compile_options o = kl_compile_options_default();
        o.interp_tier = cases[c].tier;
        o.async = cases[c].async;
        kl_fn *f = kl_compile(mixed, &a, &o);
        unsetenv("KL_COMPILE_INTERP");
        if (cases[c].on) cg_llvm_hold_compiles(1); /* off, a held compile would never return */
        assert_int_equal(kl_fn_call(f, in, 2, y, 2), 0);
        cg_llvm_hold_compiles(0);
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        print_message("case %zu: interp_calls %lld, async_eager_calls %lld\n", c, (long long)st.interp_calls,
                      (long long)st.async_eager_calls);
        assert_int_equal(st.interp_calls, cases[c].on);
        if (cases[c].async) assert_true(st.async_eager_calls >= 1);
        kl_fn_release(f);
    }
    kl_set_num_threads(2);
}

/* Released while its kernels compile in the background (some compiled, some interpreted):
 * the compile is cancelled and waited for, results were bitwise eager's (elementwise). */
static void interp_tier_release_while_compiling(void **state) {
    (void)state;
    kl_set_num_threads(2);
    for (int r = 0; r < 3; r++) {
        chain_args a = {40, (double)(getpid() % 1000) / 1e4 + 0.11 + r * 0.001};
        kl_tensor *in[2] = {seqf(4, 8, 0.31), kl_mul_scalar(seqf(8, 8, 0.09), 0.5)};
        kl_tensor *want = NULL, *y = NULL;
        assert_int_equal(chain(&a, in, 2, &want, 1), 0);
        kl_fn *f = compile_interp(chain, &a, 1);
        for (int c = 0; c <= r; c++) {
            assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
            assert_int_equal(kl_equal(y, want), 1);
            if (r == 2) usleep(20000); /* let some kernels compile: mixed tiers in one call */
        }
        kl_fn_release(f);
    }
}

/* fork while the background compile runs (held): the child's calls keep interpreting, a
 * new function of the same kernels compiles them in the child (the parent's in-flight
 * claims are not waited for), and the child exits; the parent then compiles as usual. */
static void interp_tier_fork_while_compiling(void **state) {
    (void)state;
#ifdef __SANITIZE_THREAD__
    /* TSan dies in a child of a multi-threaded fork that starts a thread (it cannot
     * follow them); the normal and ASan builds run this test */
    skip();
#endif
    kl_set_num_threads(2);
    chain_args a = {2, (double)(getpid() % 1000) / 1e4 + 0.12};
    kl_tensor *in[2] = {seqf(4, 8, 0.21), kl_mul_scalar(seqf(8, 8, 0.17), 0.5)}, *want, *y;
    assert_int_equal(chain(&a, in, 2, &want, 1), 0);
    kl_fn *f = compile_interp(chain, &a, 1);
    cg_llvm_hold_compiles(1);
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    /* until the background thread waits in the hold, its key claimed (it is niced: on a
     * loaded machine that may take a while) */
    for (double t0 = kt_now_s(); !cg_llvm_held_compiles() && kt_now_s() - t0 < 30;) usleep(1000);
    assert_true(cg_llvm_held_compiles() >= 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* one thread: the child starts none (TSan cannot follow threads started after a
         * multi-threaded fork), so g's compile runs here and meets the parent's claim */
        kl_set_num_threads(1);
        cg_llvm_hold_compiles(0);
        int bad = kl_fn_call(f, in, 2, &y, 1) || kl_equal(y, want) != 1 || kl_fn_wait_compiled(f);
        bad |= kl_fn_call(f, in, 2, &y, 1) || kl_equal(y, want) != 1;
        kl_fn *g = compile_interp(chain, &a, -1); /* compiles at once, the same keys */
        bad |= kl_fn_call(g, in, 2, &y, 1) || kl_equal(y, want) != 1;
        kl_fn_release(g);
        kl_fn_release(f);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    pid_t w = waitpid(pid, &status, 0);
    cg_llvm_hold_compiles(0); /* before any assertion: a held compile would hang the exit */
    assert_int_equal(w, pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(kl_fn_wait_compiled(f), 0);
    int64_t n0 = interp_calls(f);
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    assert_int_equal(kl_equal(y, want), 1);
    assert_int_equal(interp_calls(f), n0);
    kl_fn_release(f);
}

/* The process exits (exit() and a return from main) while kernels compile in the
 * background: the handlers cancel and wait; the child exits 0 (under ASan: no error). */
static int child_exit(int via_return, int interp) {
    kl_scope_begin();
    chain_args a = {40, (double)(getpid() % 1000) / 1e4 + 0.06};
    kl_tensor *in[2] = {seqf(4, 8, 0.33), kl_mul_scalar(seqf(8, 8, 0.03), 0.5)}, *y;
    kl_set_num_threads(2);
    kl_fn *f = interp ? compile_interp(chain, &a, 1) : compile_async(chain, &a);
    if (kl_fn_call(f, in, 2, &y, 1)) return 3;
    if (via_return) return 0; /* f and the scope left alive, as a careless program would */
    exit(0);
}

static void exit_while_compiling(void **state) {
    (void)state;
    for (int run = 0; run < 4; run++) { /* exit, return; eager tier, interpreter tier */
        const char *arg[4] = {"--child-exit", "--child-return", "--child-exit-interp", "--child-return-interp"};
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            /* the child leaves f alive on purpose (its compile must be in flight at exit):
             * leak checking is not what it tests; ASan's other checks stay on */
            char opts[1024];
            const char *o = getenv("ASAN_OPTIONS");
            snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", o ? o : "", o && *o ? ":" : "");
            setenv("ASAN_OPTIONS", opts, 1);
            execl("/proc/self/exe", "test_compile_async", arg[run], (char *)NULL);
            _exit(127);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

#endif /* KL_HAVE_LLVM */

int main(int argc, char **argv) {
#ifdef KL_HAVE_LLVM
    setenv("KL_CACHE_DIR", "off", 1);
    if (argc >= 2 && !strcmp(argv[1], "--child-exit")) return child_exit(0, 0);
    if (argc >= 2 && !strcmp(argv[1], "--child-return")) return child_exit(1, 0);
    if (argc >= 2 && !strcmp(argv[1], "--child-exit-interp")) return child_exit(0, 1);
    if (argc >= 2 && !strcmp(argv[1], "--child-return-interp")) return child_exit(1, 1);
    const struct CMUnitTest tests[] = {
        KT_TEST(parallel_compile_equals_serial),
        KT_TEST(parallel_compile_failures_fall_back),
        KT_TEST(identical_kernels_compile_once),
        KT_TEST(concurrent_compiles_from_threads),
        KT_TEST(async_first_calls_eager_then_compiled),
        KT_TEST(async_dynamic_retrace_tiered),
        KT_TEST(async_env_overrides_option),
        KT_TEST(release_while_compiling),
        KT_TEST(calls_from_threads_while_compiling),
        KT_TEST(interp_tier_bitwise_across_switch),
        KT_TEST(interp_tier_calls_run_serial),
        KT_TEST(interp_tier_dynamic_sizes),
        KT_TEST(interp_tier_loads_at_once),
        KT_TEST(interp_tier_switches),
        KT_TEST(interp_tier_release_while_compiling),
        KT_TEST(interp_tier_fork_while_compiling),
        KT_TEST(exit_while_compiling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
#else
    (void)argc, (void)argv;
    printf("LLVM backend not built: nothing to test\n");
    return 0;
#endif
}
