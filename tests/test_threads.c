/*
 * test_threads.c — what include/kiln.h's THREAD SAFETY section promises, done
 * from many threads (and two processes) at once: eager ops using the pool,
 * one compiled function whose first call races (traced exactly once),
 * forward + backward on separate tensors, scopes closed at thread exit, and a
 * kernel cache folder shared by two processes. Plain runs check the answers;
 * scripts/kiln.sh tsan runs this suite under ThreadSanitizer, which checks
 * that nothing here races.
 *
 * Threads never call cmocka's asserts (they longjmp to the main thread's
 * frame): each records its failures in its argument and the main thread
 * asserts after joining.
 */
#include "harness.h"

#ifdef KL_HAVE_LLVM
#include "diskcache.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

#define NT 6

typedef struct th {
    int k;                  /* which thread */
    void *shared;           /* the test's shared state */
    int failures;           /* counted by the thread, asserted by main */
    char why[160];          /* the first failure */
    kl_tensor *handed;      /* scopes_at_thread_exit: a retained result */
} th;

/* Compiled at the first call, the interpreter tier off (on by default with two threads):
 * this suite looks at what that compile does (LLVM compiles, the disk cache, dumps). */
static kl_fn *compile_now(kl_traceable fn, void *u) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1;
    return kl_compile(fn, u, &o);
}

static void th_fail(th *t, const char *what) {
    if (!t->failures++) snprintf(t->why, sizeof t->why, "thread %d: %s (%s)", t->k, what, kl_last_error());
}

static void run_threads(void *(*fn)(void *), th *a, int n, void *shared) {
    pthread_t ids[NT];
    assert_true(n <= NT);
    for (int i = 0; i < n; i++) {
        a[i] = (th){.k = i, .shared = shared};
        assert_int_equal(pthread_create(&ids[i], NULL, fn, &a[i]), 0);
    }
    for (int i = 0; i < n; i++) pthread_join(ids[i], NULL);
    for (int i = 0; i < n; i++)
        if (a[i].failures) fail_msg("%d failures; first: %s", a[i].failures, a[i].why);
}

/* ---- the pool: parallel ops from many threads ----------------------------------- */

/* Sizes past the pool's grain, so every op below splits into chunks. */
static void *pool_worker(void *p) {
    th *t = p;
    pthread_barrier_t *bar = t->shared;
    pthread_barrier_wait(bar);
    const int64_t n = 1 << 16;
    for (int it = 0; it < 8; it++) {
        kl_scope_begin();
        double c = t->k + 1 + it;
        kl_tensor *x = kl_mul_scalar(kl_arange(0, (double)n, 1, KL_F64), c);
        /* sum c*i = c*n(n-1)/2, exact in f64 */
        kl_tensor *s = kl_sum(x, KL_ALL_DIMS, false);
        if (!s || kt_get(s, 0) != c * (double)n * (double)(n - 1) / 2) th_fail(t, "sum");
        /* exp(log(1 + x)) - x == 1 elementwise (two transcendental passes) */
        kl_tensor *e = kl_sub(kl_exp(kl_log1p(kl_mul_scalar(x, 1e-6))), kl_mul_scalar(x, 1e-6));
        kl_tensor *mx = kl_amax(kl_abs(kl_sub_scalar(e, 1)), KL_ALL_DIMS, false);
        if (!mx || kt_get(mx, 0) > 1e-9) th_fail(t, "exp/log1p");
        /* a matmul (OpenBLAS) of ones: every entry is the inner size */
        kl_tensor *m = kl_matmul(kl_ones(KL_SHAPE(64, 96), KL_F32), kl_full(KL_SHAPE(96, 32), c, KL_F32));
        kl_tensor *mm = kl_amin(m, KL_ALL_DIMS, false), *mM = kl_amax(m, KL_ALL_DIMS, false);
        if (!mm || !mM || kt_get(mm, 0) != 96 * c || kt_get(mM, 0) != 96 * c) th_fail(t, "matmul");
        kl_scope_end();
    }
    kl_clear_error();
    return NULL;
}

static void pool_from_many_threads(void **s) {
    (void)s;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NT);
    th a[NT];
    run_threads(pool_worker, a, NT, &bar);
    pthread_barrier_destroy(&bar);
}

/* ---- one compiled function, many threads ----------------------------------------- */

typedef struct fn_shared {
    kl_fn *f;
    atomic_int traced; /* times fn ran (it runs only while being traced) */
    pthread_barrier_t bar;
    kl_tensor *x[NT];  /* inputs, made by main, read by the threads */
    int same_shape;    /* 1: every thread calls with one signature; 0: one each */
} fn_shared;

static int traced_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    fn_shared *sh = user;
    (void)n_in, (void)n_out;
    atomic_fetch_add(&sh->traced, 1);
    out[0] = kl_add_scalar(kl_mul(kl_tanh(in[0]), kl_exp(in[0])), 1);
    return out[0] ? 0 : -1;
}

static void *fn_worker(void *p) {
    th *t = p;
    fn_shared *sh = t->shared;
    kl_tensor *x = sh->x[t->k];
    pthread_barrier_wait(&sh->bar);
    for (int it = 0; it < 4; it++) {
        kl_scope_begin();
        kl_tensor *y = NULL;
        if (kl_fn_call(sh->f, &x, 1, &y, 1)) th_fail(t, "kl_fn_call");
        kl_tensor *ref = kl_add_scalar(kl_mul(kl_tanh(x), kl_exp(x)), 1);
        if (!y || kl_allclose(y, ref, 1e-5, 1e-6, false) != 1) th_fail(t, "compiled result differs from eager");
        kl_scope_end();
    }
    kl_clear_error();
    return NULL;
}

static void fn_race(fn_shared *sh, int same_shape) {
    sh->same_shape = same_shape;
    for (int i = 0; i < NT; i++) {
        int64_t n = same_shape ? 40 : 8 + i;
        sh->x[i] = kl_retain(kl_mul_scalar(kl_arange(-(double)n / 2, (double)n / 2, 1, KL_F32), 0.1 * (i + 1)));
    }
    pthread_barrier_init(&sh->bar, NULL, NT);
    th a[NT];
    run_threads(fn_worker, a, NT, sh);
    pthread_barrier_destroy(&sh->bar);
    for (int i = 0; i < NT; i++) kl_release(sh->x[i]);
}

/* The first call races: every thread calls at once, one traces, the others
 * wait for its graph; fn itself runs exactly once per signature. */
static void one_fn_many_threads_traces_once(void **s) {
    (void)s;
    fn_shared sh = {0};
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.name = "threads";
    o.recompile_limit = 2 * NT;
    o.auto_dynamic = 0; /* one entry per signature, not one dynamic entry for the sizes */
    sh.f = kl_compile(traced_fn, &sh, &o);
    assert_non_null(sh.f);
    fn_race(&sh, 1);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(sh.f, &st), 0);
    assert_int_equal(atomic_load(&sh.traced), 1);
    assert_int_equal(st.traces, 1);
    assert_int_equal(st.calls, 4 * NT);
    assert_int_equal(st.cache_hits, 4 * NT - 1);
    assert_int_equal(st.eager_calls, 0);
    /* one new signature per thread, all at once: each traced once */
    fn_race(&sh, 0);
    assert_int_equal(kl_fn_get_stats(sh.f, &st), 0);
    assert_int_equal(atomic_load(&sh.traced), 1 + NT);
    assert_int_equal(st.traces, 1 + NT);
    assert_int_equal(st.calls, 8 * NT);
    kl_fn_release(sh.f);
}

/* ---- forward and backward on separate tensors -------------------------------- */

/* A small MLP step on thread k's own parameters; returns w's gradient. */
static kl_tensor *grad_step(int k) {
    kl_tensor *x = kl_mul_scalar(kl_reshape(kl_arange(0, 48, 1, KL_F32), 2, (int64_t[]){6, 8}), 0.02 * (k + 1));
    kl_tensor *w = kl_full(KL_SHAPE(8, 5), 0.1 + 0.05 * k, KL_F32);
    kl_tensor *b = kl_full(KL_SHAPE(5), -0.2, KL_F32);
    if (kl_set_requires_grad(w, true) || kl_set_requires_grad(b, true)) return NULL;
    kl_tensor *h = kl_tanh(kl_add(kl_matmul(x, w), b));
    kl_tensor *loss = kl_mean(kl_mul(h, kl_sigmoid(h)), KL_ALL_DIMS, false);
    if (kl_backward(loss, NULL, NULL)) return NULL;
    if (!kl_grad(w) || !kl_grad(b)) return NULL;
    return kl_cat(2, (kl_tensor *[]){kl_flatten(kl_grad(w), 0, -1), kl_grad(b)}, 0);
}

static void *grad_worker(void *p) {
    th *t = p;
    kl_tensor **refs = t->shared;
    for (int it = 0; it < 6; it++) {
        kl_scope_begin();
        kl_tensor *g = grad_step(t->k);
        if (!g || kl_allclose(g, refs[t->k], 1e-5, 1e-7, false) != 1) th_fail(t, "gradient differs");
        kl_scope_end();
    }
    kl_clear_error();
    return NULL;
}

static void eager_and_backward_concurrently(void **s) {
    (void)s;
    kl_tensor *refs[NT];
    for (int k = 0; k < NT; k++) { /* one at a time first: the reference */
        kl_scope_begin();
        refs[k] = kl_retain(grad_step(k));
        kl_scope_end();
        assert_non_null(refs[k]);
    }
    th a[NT];
    run_threads(grad_worker, a, NT, refs);
    for (int k = 0; k < NT; k++) kl_release(refs[k]);
}

/* ---- scopes at thread exit ------------------------------------------------------- */

static void *exit_worker(void *p) {
    th *t = p;
    kl_tensor *r = kl_full(KL_SHAPE(3), t->k, KL_F32); /* in the root scope */
    t->handed = kl_retain(kl_add_scalar(r, 1));
    for (int i = 0; i <= t->k % 3; i++) { /* left open */
        kl_scope_begin();
        kl_exp(kl_ones(KL_SHAPE(2, 2), KL_F64));
    }
    return NULL;
}

static void scopes_at_thread_exit(void **s) {
    (void)s;
    int64_t base = kl_live_tensors(), storages = kl_live_storages();
    for (int round = 0; round < 5; round++) {
        th a[NT];
        run_threads(exit_worker, a, NT, NULL);
        /* every exited thread's scopes closed; only the handed tensors live */
        assert_int_equal(kl_live_tensors(), base + NT);
        for (int k = 0; k < NT; k++) {
            KT_VALUES(a[k].handed, 0, k + 1, k + 1, k + 1);
            kl_release(a[k].handed); /* given back on another thread */
        }
        assert_int_equal(kl_live_tensors(), base);
        assert_int_equal(kl_live_storages(), storages);
    }
}

/* ---- two processes sharing the kernel cache folder ---------------------------------- */

#ifdef KL_HAVE_LLVM
static int cache_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    out[0] = kl_softmax(kl_mul(kl_sin(x), kl_add_scalar(kl_sqrt(kl_abs(x)), 0.5)), -1);
    out[1] = kl_sum(kl_mul(kl_cos(x), x), KL_DIMS(1), false);
    return out[0] && out[1] ? 0 : -1;
}

/* The child: compile, call, compare with eager; with want_hits, every kernel
 * must have come from the folder the other processes filled. Exit status 0
 * when all is well. */
static int cache_child(int want_hits) {
    kl_scope_begin();
    kl_tensor *x = kl_mul_scalar(kl_reshape(kl_arange(0, 35, 1, KL_F32), 2, (int64_t[]){5, 7}), 0.37);
    kl_fn *f = compile_now(cache_fn, NULL);
    kl_tensor *y[2] = {0}, *r[2];
    int bad = !f || kl_fn_call(f, &x, 1, y, 2) != 0;
    cache_fn(NULL, &x, 1, r, 2);
    bad |= !y[0] || !y[1] || kl_allclose(y[0], r[0], 1e-5, 1e-6, false) != 1 ||
           kl_allclose(y[1], r[1], 1e-5, 1e-6, false) != 1;
    kl_fn_release(f);
    kl_scope_end();
    ke_cache_stats st;
    ke_cache_get_stats(&st);
    if (bad) fprintf(stderr, "cache child: wrong result: %s\n", kl_last_error());
    if (st.corrupt) bad = 1, fprintf(stderr, "cache child: %lld corrupt entries\n", (long long)st.corrupt);
    if (want_hits && (st.hits == 0 || st.misses != 0))
        bad = 1, fprintf(stderr, "cache child: %lld hits, %lld misses\n", (long long)st.hits, (long long)st.misses);
    if (!want_hits && st.hits + st.misses == 0) bad = 1, fprintf(stderr, "cache child: the cache was not used\n");
    return bad;
}

static char self_exe[4096];

static void run_children(const char *dir, int n, const char *mode) {
    extern char **environ;
    char cache_env[4200];
    snprintf(cache_env, sizeof cache_env, "KL_CACHE_DIR=%s", dir);
    int ne = 0;
    while (environ[ne]) ne++;
    char **env = calloc((size_t)ne + 2, sizeof *env);
    assert_non_null(env);
    int j = 0;
    for (int i = 0; i < ne; i++)
        if (strncmp(environ[i], "KL_CACHE_DIR=", 13)) env[j++] = environ[i];
    env[j++] = cache_env;
    pid_t pids[4];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            execve(self_exe, (char *[]){self_exe, "--cache-child", (char *)mode, NULL}, env);
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("cache child %d (%s) failed: status %#x", i, mode, status);
    }
    free(env);
}
#endif

static void two_processes_share_the_cache(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    const char *dir = kt_tmp_path("shared-cache");
    /* both compile and store the same kernels at once into an empty folder */
    run_children(dir, 2, "fill");
    /* then both load them at once: every kernel a hit, none corrupt */
    run_children(dir, 2, "hits");
#else
    skip();
#endif
}

int main(int argc, char **argv) {
#ifdef KL_HAVE_LLVM
    if (argc == 3 && !strcmp(argv[1], "--cache-child")) return cache_child(!strcmp(argv[2], "hits"));
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0) self_exe[n] = 0;
#else
    (void)argc, (void)argv;
#endif
    const struct CMUnitTest tests[] = {
        KT_TEST(pool_from_many_threads),
        KT_TEST(one_fn_many_threads_traces_once),
        KT_TEST(eager_and_backward_concurrently),
        KT_TEST(scopes_at_thread_exit),
        KT_TEST(two_processes_share_the_cache),
    };
    int r = cmocka_run_group_tests_name("threads", tests, NULL, NULL);
    kt_tmp_cleanup();
    return r;
}
