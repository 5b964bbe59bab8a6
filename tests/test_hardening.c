/*
 * test_hardening.c — regression tests for issue 17's defects: each was found
 * by using the library as a careless or hostile user would (huge attribute
 * values, mismatched counts, threads, file system oddities), crashed, hung or
 * gave a wrong answer, and must now give a clean error or the right result.
 */
#include "harness.h"

#include "alloc.h"
#include <dlpack/dlpack.h>
#include "kiln/nn.h"

#ifdef KL_HAVE_LLVM
#include "cg_llvm.h"
#endif
#include "diskcache.h"
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <stdlib.h>

/* Compiled at the first call, the interpreter tier off (on by default with two threads):
 * this suite looks at what that compile does (LLVM compiles, the disk cache, dumps). */
static kl_fn *compile_now(kl_traceable fn, void *u) {
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1;
    return kl_compile(fn, u, &o);
}

/* ---- 1: view rules' size arithmetic ----------------------------------------- */

static void huge_slice_step(void **s) {
    (void)s;
    kl_tensor *x = kl_arange(0, 6, 1, KL_F32);
    x = kl_view(x, 2, (int64_t[]){2, 3});
    /* step INT64_MAX over 2 rows takes row 0 only ((end-start+step-1)/step overflowed to -1) */
    kl_tensor *v = kl_slice(x, 0, 0, 2, INT64_MAX);
    kt_assert_shape(v, 2, (int64_t[]){1, 3});
    KT_VALUES(v, 0, 0, 1, 2);
    kl_tensor *c = kl_cat(2, (kl_tensor *[]){v, x}, 0);
    kt_assert_shape(c, 2, (int64_t[]){3, 3});
    KT_VALUES(c, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5);
    /* extremes of start/end and step on the other dim too */
    kt_assert_shape(kl_slice(x, 1, INT64_MIN, INT64_MAX, INT64_MAX), 2, (int64_t[]){2, 1});
    kt_assert_shape(kl_slice(x, 1, INT64_MAX, INT64_MIN, 1), 2, (int64_t[]){2, 0});
    kl_tensor *w = kl_slice(x, 1, 1, INT64_MAX, INT64_MAX - 1);
    kt_assert_shape(w, 2, (int64_t[]){2, 1});
    KT_VALUES(w, 0, 1, 4);
    /* v's stride (3 * INT64_MAX) overflowed, harmless for one row; an
     * expanded dim's stride 0 times any step is 0 */
    kl_tensor *e = kl_expand(kl_ones(KL_SHAPE(1, 3), KL_F32), 2, (int64_t[]){5, 3});
    kt_assert_shape(kl_slice(e, 0, 0, 5, INT64_MAX / 2), 2, (int64_t[]){1, 3});
    kt_assert_shape(kl_slice(e, 0, 0, 5, 2), 2, (int64_t[]){3, 3});
    KT_NO_ERROR();
}

static void as_strided_extreme_strides(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(8), KL_F32);
    /* (shape-1)*stride overflows int64: the bounds check must not wrap around */
    assert_null(kl_as_strided(x, 1, (int64_t[]){3}, (int64_t[]){INT64_MAX}, 0));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 2, (int64_t[]){3, 3}, (int64_t[]){INT64_MAX / 2, INT64_MAX / 2}, 0));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 1, (int64_t[]){3}, (int64_t[]){INT64_MIN}, 7));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 1, (int64_t[]){2}, (int64_t[]){1}, INT64_MAX));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    kl_tensor *one = kl_as_strided(x, 1, (int64_t[]){1}, (int64_t[]){INT64_MAX}, 7);
    kt_assert_shape(one, 1, (int64_t[]){1});
    /* slicing past its only element: start * stride overflows, the result is empty */
    kt_assert_shape(kl_slice(one, 0, 1, 2, 1), 1, (int64_t[]){0});
    kt_assert_shape(kl_slice(one, 0, 0, 1, 3), 1, (int64_t[]){1});
    KT_NO_ERROR();
}

/* ---- 2: kl_fn_call's counts ------------------------------------------------- */

static int two_out(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user;
    (void)n_in;
    for (int j = 0; j < n_out; j++) out[j] = kl_mul_scalar(in[0], j + 2);
    return 0;
}

static void fn_call_counts(void **s) {
    (void)s;
    kl_fn *f = compile_now(two_out, NULL);
    kl_tensor *x = kl_ones(KL_SHAPE(3), KL_F32);
    kl_tensor *o2[2] = {0}, *o1[1] = {0}, *o3[3] = {0};
    assert_int_equal(kl_fn_call(f, &x, 1, o2, 2), 0);
    KT_VALUES(o2[0], 0, 2, 2, 2);
    KT_VALUES(o2[1], 0, 3, 3, 3);
    /* fewer outputs than traced: the cached graph wrote past o1 (a stack overflow) */
    o1[0] = x;
    assert_int_equal(kl_fn_call(f, &x, 1, o1, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "takes 1 inputs and 2 outputs");
    assert_null(o1[0]);
    /* none: outputs[0] was still written */
    assert_int_equal(kl_fn_call(f, &x, 1, o1, 0), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "got n_in 1 and n_out 0");
    /* more: returned 0 with NULLs */
    assert_int_equal(kl_fn_call(f, &x, 1, o3, 3), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "got n_in 1 and n_out 3");
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, x}, 2, o2, 2), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "got n_in 2 and n_out 2");
    /* the right counts still work and hit the cache */
    assert_int_equal(kl_fn_call(f, &x, 1, o2, 2), 0);
    KT_VALUES(o2[1], 0, 3, 3, 3);
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 1);
    kl_fn_release(f);
}

/* ---- 3: scopes of exited threads ---------------------------------------------- */

typedef struct th_arg {
    kl_tensor *root, *kept; /* made in the thread's root scope; kept also retained */
    int nested;             /* scopes left open at exit */
} th_arg;

static void *make_and_exit(void *p) {
    th_arg *a = p;
    a->root = kl_ones(KL_SHAPE(4), KL_F32);
    a->kept = kl_retain(kl_add_scalar(a->root, 1));
    for (int i = 0; i < a->nested; i++) {
        kl_scope_begin();
        kl_exp(kl_full(KL_SHAPE(3, 3), (double)i, KL_F64));
    }
    return NULL;
}

static void *release_it(void *p) {
    kl_release(p); /* already released by its thread's exit */
    int ok = kl_last_status() == KL_ERR_FREED;
    kl_clear_error();
    return (void *)(intptr_t)ok;
}

static void *churn(void *p) {
    int k = (int)(intptr_t)p;
    kl_tensor *t = kl_arange(0, 16 + k, 1, KL_F32); /* new sizes: the storages are not the headers' inline data */
    kl_sum(kl_mul(t, t), KL_DIMS(0), false);
    if (k % 3 == 0) kl_scope_begin(); /* left open */
    kl_relu(kl_neg(t));
    if (k % 2) kl_release(t);
    return NULL;
}

static void thread_exit_releases_scopes(void **s) {
    (void)s;
    int64_t base_t = kl_live_tensors(), base_s = kl_live_storages();
    th_arg a = {.nested = 3};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, make_and_exit, &a), 0);
    pthread_join(th, NULL);
    /* the thread's scopes closed at its exit; the retained tensor survives */
    assert_int_equal(kl_live_tensors(), base_t + 1);
    KT_VALUES(a.kept, 0, 2, 2, 2, 2);
    /* a stale pointer from the exited thread is a clean error on a new
     * thread, which reuses the exited one's thread-local block (was a SEGV) */
    void *ok = NULL;
    assert_int_equal(pthread_create(&th, NULL, release_it, a.root), 0);
    pthread_join(th, &ok);
    assert_true(ok != NULL);
    kl_release(a.kept); /* any thread can give back a retained reference */
    KT_NO_ERROR();
    /* many short-lived threads leak nothing (LeakSanitizer checks the headers'
     * chunks and scope arrays at exit in the ASan build) */
    for (int round = 0; round < 10; round++) {
        pthread_t ths[10];
        for (int i = 0; i < 10; i++) assert_int_equal(pthread_create(&ths[i], NULL, churn, (void *)(intptr_t)(round * 10 + i)), 0);
        for (int i = 0; i < 10; i++) pthread_join(ths[i], NULL);
    }
    assert_int_equal(kl_live_tensors(), base_t);
    assert_int_equal(kl_live_storages(), base_s);
}

/* ---- 4: a compiled function calling itself ------------------------------------------ */

static int calls_itself(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    kl_fn *self = *(kl_fn **)user;
    (void)n_in, (void)n_out;
    kl_tensor *y = NULL;
    if (kl_fn_call(self, in, 1, &y, 1)) return -1; /* deadlocked on self's lock */
    out[0] = y;
    return 0;
}

static void reentrant_call_is_an_error(void **s) {
    (void)s;
    kl_fn *f = NULL;
    f = compile_now(calls_itself, &f);
    kl_tensor *x = kl_ones(KL_SHAPE(2), KL_F32), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "calls itself through kl_fn_call while it is being traced");
    assert_null(y);
    /* nothing was left locked: a second call fails the same way, no hang */
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "cannot be re-entered");
    kl_fn_release(f);
}

/* ---- 5: kl_set_grad's checks ---------------------------------------------------- */

static void set_grad_refuses_self_and_mismatch(void **s) {
    (void)s;
    kl_tensor *w = kl_ones(KL_SHAPE(2, 2), KL_F32);
    kl_set_requires_grad(w, true);
    assert_int_equal(kl_set_grad(w, w), -1); /* backward overwrote the parameter */
    KT_EXPECT_ERROR(KL_ERR_ARG, "cannot be its own gradient");
    assert_int_equal(kl_set_grad(w, kl_view(w, 2, (int64_t[]){2, 2})), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "shares storage with");
    assert_int_equal(kl_set_grad(w, kl_ones(KL_SHAPE(4), KL_F32)), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "in shape");
    assert_int_equal(kl_set_grad(w, kl_ones(KL_SHAPE(2, 2), KL_F64)), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "in dtype");
    kl_tensor *m = kl_to_device(w, KL_DEVICE_META);
    if (m) {
        assert_int_equal(kl_set_grad(w, m), -1);
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "in device");
    }
    KT_NO_ERROR();
    assert_null(kl_grad(w));
    /* a good one is taken, and backward accumulates into it, not into w */
    assert_int_equal(kl_set_grad(w, kl_zeros(KL_SHAPE(2, 2), KL_F32)), 0);
    assert_int_equal(kl_backward(kl_sum(kl_mul_scalar(w, 3), 0, NULL, false), NULL, NULL), 0);
    KT_VALUES(kl_grad(w), 0, 3, 3, 3, 3);
    KT_VALUES(w, 0, 1, 1, 1, 1);
    kl_zero_grad(w);
}

/* ---- 6: KL_COMPILE_CHECK over random ops ------------------------------------------ */

/* rand, randn, randint, dropout, and dropout's backward regenerating its mask */
static int random_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = kl_detach(in[0]);
    if (!p || kl_set_requires_grad(p, true) < 0) return -1;
    kl_tensor *y = kl_dropout(kl_mul(kl_exp(p), kl_randn(KL_SHAPE(16), KL_F32)), 0.5, true);
    out[0] = kl_add(kl_detach(y), kl_rand(KL_SHAPE(16), KL_F32));
    out[1] = kl_randint(0, 1000, KL_SHAPE(16), KL_I64);
    return out[0] && out[1] ? kl_autograd_grad(1, (kl_tensor *[]){kl_sum(y, KL_ALL_DIMS, false)}, NULL, 1, &p, out + 2, NULL) : -1;
}

static void compile_check_replays_random_counters(void **s) {
    (void)s;
    kl_tensor *x = kl_mul_scalar(kl_arange(0, 16, 1, KL_F32), 0.1), *c[3], *e[3];
    for (int m = KL_COMPILE_TRACE_ONLY; m <= KL_COMPILE_FUSE; m++) {
        setenv("KL_COMPILE_CHECK", "1", 1);
        kl_compile_options o = kl_compile_options_default();
        o.interp_tier = -1; /* compiled at the first call */
        o.mode = (kl_compile_mode)m;
        kl_fn *f = kl_compile(random_step, NULL, &o);
        unsetenv("KL_COMPILE_CHECK");
        for (int call = 0; call < 3; call++) {
            /* the check's eager re-run drew new numbers: every call failed */
            kl_manual_seed(50 + call);
            assert_int_equal(kl_fn_call(f, &x, 1, c, 3), 0);
            KT_NO_ERROR();
            kl_tensor *after = kl_rand(KL_SHAPE(4), KL_F32);
            /* the check leaves the generator where the compiled call did,
             * which is where eager leaves it */
            kl_manual_seed(50 + call);
            assert_int_equal(random_step(NULL, &x, 1, e, 3), 0);
            for (int j = 0; j < 3; j++) assert_int_equal(kl_allclose(c[j], e[j], 1e-6, 1e-7, false), 1);
            assert_int_equal(kl_equal(after, kl_rand(KL_SHAPE(4), KL_F32)), 1);
        }
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.eager_calls, 0);
        kl_fn_release(f);
    }
}

/* ---- 7: borrowed options ------------------------------------------------------------ */

static void compile_copies_the_name(void **s) {
    (void)s;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    char *name = strdup("my_step");
    o.name = name;
    kl_fn *f = kl_compile(two_out, NULL, &o);
    memset(name, 'X', strlen(name)); /* a use-after-free under ASan if kept */
    free(name);
    kl_tensor *x = kl_ones(KL_SHAPE(2), KL_F32), *y[3];
    assert_int_equal(kl_fn_call(f, &x, 1, y, 2), 0);
    assert_int_equal(kl_fn_call(f, &x, 1, y, 3), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "my_step takes 1 inputs");
    kl_fn_release(f);
}

/* ---- 8: backward over a captured leaf --------------------------------------------- */

static kl_tensor *captured_w; /* a leaf requiring grad that the functions below capture */

static int backward_into_captured(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *loss = kl_sum(kl_mul(kl_exp(captured_w), in[0]), KL_ALL_DIMS, false);
    if (!loss || kl_backward(loss, NULL, NULL) < 0) return -1;
    out[0] = kl_detach(loss);
    return out[0] ? 0 : -1;
}

static int grad_wrt_captured(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *loss = kl_sum(kl_mul(kl_exp(captured_w), in[0]), KL_ALL_DIMS, false);
    return loss ? kl_autograd_grad(1, &loss, NULL, 1, &captured_w, out, NULL) : -1;
}

/* gradients with respect to the function's own leaf, through the captured w:
 * the graph expresses this (w is a constant of it), so it compiles */
static int grad_wrt_own_leaf(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = kl_detach(in[0]);
    if (!p || kl_set_requires_grad(p, true) < 0) return -1;
    kl_tensor *loss = kl_sum(kl_mul(kl_exp(captured_w), kl_mul(p, p)), KL_ALL_DIMS, false);
    return loss ? kl_autograd_grad(1, &loss, NULL, 1, &p, out, NULL) : -1;
}

static void fn_stats_of(kl_fn *f, int64_t traces, int64_t eager_calls, const char *reason) {
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.traces, traces);
    assert_int_equal(st.eager_calls, eager_calls);
    if (reason) assert_non_null(strstr(st.last_reason, reason));
}

static void backward_over_captured_leaf_runs_eagerly(void **s) {
    (void)s;
    captured_w = kl_mul_scalar(kl_arange(0, 4, 1, KL_F32), 0.25);
    kl_set_requires_grad(captured_w, true);
    kl_tensor *x = kl_add_scalar(kl_arange(0, 4, 1, KL_F32), 1), *y;
    /* d/dw sum(exp(w) * x) = exp(w) * x, accumulated over calls */
    double want[4];
    for (int i = 0; i < 4; i++) want[i] = exp(0.25 * i) * (i + 1);
    kl_fn *f = compile_now(backward_into_captured, NULL);
    for (int call = 1; call <= 2; call++) {
        assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0); /* was: "does not require grad" */
        KT_NO_ERROR();
        double acc[4];
        for (int i = 0; i < 4; i++) acc[i] = call * want[i];
        kt_assert_values(kl_grad(captured_w), acc, 4, 1e-5);
    }
    fn_stats_of(f, 1, 2, "trace break: kl_backward over a captured tensor requiring grad ([4] float32 cpu)");
    kl_fn_release(f);
    kl_zero_grad(captured_w);

    /* kl_autograd_grad with respect to the captured tensor: eager too */
    kl_tensor *g = NULL;
    f = compile_now(grad_wrt_captured, NULL);
    assert_int_equal(kl_fn_call(f, &x, 1, &g, 1), 0);
    kt_assert_values(g, want, 4, 1e-5);
    fn_stats_of(f, 1, 1, "kl_autograd_grad with respect to a captured tensor (input 1");
    kl_fn_release(f);
    assert_null(kl_grad(captured_w));

    /* what the graph can express still compiles, and agrees with eager */
    kl_tensor *e = NULL;
    f = compile_now(grad_wrt_own_leaf, NULL);
    assert_int_equal(kl_fn_call(f, &x, 1, &g, 1), 0);
    assert_int_equal(grad_wrt_own_leaf(NULL, &x, 1, &e, 1), 0);
    for (int i = 0; i < 4; i++) want[i] = 2 * exp(0.25 * i) * (i + 1);
    kt_assert_values(g, want, 4, 1e-5);
    kt_assert_values(e, want, 4, 1e-5);
    fn_stats_of(f, 1, 0, NULL);
    kl_fn_release(f);

    /* a loss that truly needs no grad is still the error eager gives */
    kl_set_requires_grad(captured_w, false);
    f = compile_now(backward_into_captured, NULL);
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "does not require grad");
    kl_fn_release(f);
    KT_NO_ERROR();
}

/* ---- 9: compiling under memory pressure ---------------------------------------------- */

/* ASan and TSan both reserve terabytes of address space */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HARD_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HARD_UNDER_ASAN 1
#endif
#endif

#if !defined(HARD_UNDER_ASAN) && defined(KL_HAVE_LLVM) /* the test below needs LLVM */
static int pressure_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_tanh(kl_mul_scalar(kl_add_scalar(in[0], 0.5), 3));
    return out[0] ? 0 : -1;
}

/* Compiles and runs pressure_fn on n elements; 0 right, 1 a clean KL_ERR_OOM, 3 wrong. */
static int pressure_call(int64_t n) {
    kl_fn *f = compile_now(pressure_fn, NULL);
    kl_tensor *x = f ? kl_full(KL_SHAPE(n), 0.25, KL_F32) : NULL, *y = NULL;
    int rc = x ? kl_fn_call(f, &x, 1, &y, 1) : -1;
    int r = 0;
    if (rc == 0) {
        const float *p = kl_data_ptr(y);
        for (int64_t i = 0; i < n && !r; i++) r = fabs(p[i] - tanh(2.25)) > 1e-6 ? 3 : 0;
    } else {
        r = kl_last_status() == KL_ERR_OOM ? 1 : 3;
        if (r == 3) fprintf(stderr, "pressure: %s\n", kl_last_error());
    }
    kl_clear_error();
    kl_fn_release(f);
    return r;
}

/* In a forked child: address space limited to what it uses plus headroom,
 * a compile (no disk cache: LLVM must run); then the limit is lifted and a
 * compile of a new kernel must work. Exit 0: ran; 1: a clean KL_ERR_OOM;
 * 2: LLVM failed and the interpreter took the kernel; 3+: wrong. */
static int pressure_child(size_t headroom, int64_t n) {
    setenv("KL_CACHE_DIR", "off", 1);
    long pages = 0;
    FILE *fp = fopen("/proc/self/statm", "r");
    if (!fp || fscanf(fp, "%ld", &pages) != 1) return 4;
    fclose(fp);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl)) return 5;
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + headroom;
    if (setrlimit(RLIMIT_AS, &rl)) return 6;
    int64_t fb0 = cg_llvm_fallbacks();
    int r = pressure_call(n);
    int fell_back = cg_llvm_fallbacks() != fb0;
    rl.rlim_cur = old;
    if (setrlimit(RLIMIT_AS, &rl)) return 7;
    int again = pressure_call(n + 1); /* a new kernel: LLVM (or its fallback) still works */
    if (r == 3 || again != 0) return 3 + (again != 0) * 5;
    return r == 0 && fell_back ? 2 : r;
}
#endif

static void compile_under_memory_pressure_survives(void **s) {
    (void)s;
#if defined(HARD_UNDER_ASAN) || !defined(KL_HAVE_LLVM)
    skip(); /* the sanitizer's reservations: RLIMIT_AS stops it starting */
#else
    int seen[10] = {0};
    for (int i = 0; i < 12; i++) {
        size_t headroom = i == 0 ? 0 : ((size_t)1 << (i + 17)); /* 0, 256 KiB .. 256 MiB */
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) exit(pressure_child(headroom, 1000 + 7 * i)); /* exit: the JIT's shutdown runs too */
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        /* was: abort from "LLVM ERROR: out of memory" or an uncaught std::bad_alloc */
        if (!WIFEXITED(st)) fail_msg("headroom %zu: the child died of signal %d", headroom, WTERMSIG(st));
        int code = WEXITSTATUS(st);
        if (code > 2) fail_msg("headroom %zu: the child exited %d", headroom, code);
        seen[code]++;
    }
    /* the limits span "nothing compiles" to "everything does" */
    assert_true(seen[0] > 0);
    assert_true(seen[1] + seen[2] > 0);
    print_message("memory pressure: %d ran, %d clean OOM, %d LLVM fallbacks\n", seen[0], seen[1], seen[2]);
#endif
}

/* ---- 11: saving over links and special files -------------------------------------- */

static int save_both(const char *path, kl_tensor *t, int which) {
    if (which == 0) return kl_save_npy(path, t);
    return kl_save_safetensors(path, 1, (const char *[]){"t"}, &t, NULL);
}

static kl_tensor *load_back(const char *path, int which) {
    if (which == 0) return kl_load_npy(path);
    kl_safetensors *st = kl_load_safetensors(path);
    kl_tensor *t = kl_clone(kl_safetensors_find(st, "t")); /* scope-owned, outlives st */
    kl_safetensors_free(st);
    return t;
}

static void save_writes_through_links_refuses_special(void **s) {
    (void)s;
    kl_tensor *t = kl_arange(0, 4, 1, KL_F32);
    for (int which = 0; which < 2; which++) {
        char real[600], link[600], fifo[600], dangling[600], dev[600];
        snprintf(real, sizeof real, "%s", kt_tmp_path(which ? "real.st" : "real.npy"));
        snprintf(link, sizeof link, "%s", kt_tmp_path(which ? "link.st" : "link.npy"));
        snprintf(fifo, sizeof fifo, "%s", kt_tmp_path(which ? "fifo.st" : "fifo.npy"));
        snprintf(dangling, sizeof dangling, "%s", kt_tmp_path(which ? "dangling.st" : "dangling.npy"));
        snprintf(dev, sizeof dev, "%s", kt_tmp_path(which ? "dev.st" : "dev.npy"));
        /* a link: the file it names gets the data, the link stays a link */
        FILE *fp = fopen(real, "w");
        fputs("old", fp);
        fclose(fp);
        assert_int_equal(symlink(real, link), 0);
        assert_int_equal(save_both(link, t, which), 0);
        struct stat st;
        assert_int_equal(lstat(link, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
        KT_VALUES(load_back(real, which), 0, 0, 1, 2, 3);
        /* a FIFO is refused and left in place (it was replaced) */
        assert_int_equal(mkfifo(fifo, 0644), 0);
        assert_true(save_both(fifo, t, which) < 0);
        KT_EXPECT_ERROR(KL_ERR_IO, "is a FIFO: a save replaces only a regular file");
        assert_int_equal(lstat(fifo, &st), 0);
        assert_true(S_ISFIFO(st.st_mode));
        /* a link to a FIFO too, and a dangling link (as cp refuses it) */
        assert_int_equal(unlink(link), 0);
        assert_int_equal(symlink(fifo, link), 0);
        assert_true(save_both(link, t, which) < 0);
        KT_EXPECT_ERROR(KL_ERR_IO, "is a FIFO");
        assert_int_equal(symlink(kt_tmp_path("nowhere"), dangling), 0);
        assert_true(save_both(dangling, t, which) < 0);
        KT_EXPECT_ERROR(KL_ERR_IO, "not writing through a dangling symbolic link");
        assert_int_equal(lstat(dangling, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
        /* a character device node (root only: /dev/null's numbers) */
        if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0) {
            assert_true(save_both(dev, t, which) < 0);
            KT_EXPECT_ERROR(KL_ERR_IO, "is a character device");
            assert_int_equal(lstat(dev, &st), 0);
            assert_true(S_ISCHR(st.st_mode));
        }
        /* a directory */
        assert_true(save_both(kt_tmp_path(""), t, which) < 0);
        kl_clear_error();
        unlink(real), unlink(link), unlink(fifo), unlink(dangling), unlink(dev);
    }
}

/* ---- 12: a stale error ------------------------------------------------------------- */

static int add_one(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(in[0], 1);
    return out[0] ? 0 : -1;
}

static void stale_error_changes_nothing(void **s) {
    (void)s;
    kl_fn *f = compile_now(add_one, NULL);
    kl_tensor *a = kl_ones(KL_SHAPE(3), KL_F32), *b = kl_ones(KL_SHAPE(2, 2), KL_F64), *y = NULL;
    assert_int_equal(kl_fn_call(f, &a, 1, &y, 1), 0); /* one cached signature */
    assert_null(kl_add(NULL, a));                     /* a failure the caller ignores */
    assert_int_equal(kl_last_status(), KL_ERR_NULL_ARG);
    /* a cached signature and a new one behave alike (the new one failed) */
    assert_int_equal(kl_fn_call(f, &a, 1, &y, 1), 0);
    KT_VALUES(y, 0, 2, 2, 2);
    y = NULL;
    assert_int_equal(kl_fn_call(f, &b, 1, &y, 1), 0);
    KT_VALUES(y, 0, 2, 2, 2, 2);
    /* the first error is still the one recorded */
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_add");
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    kl_fn_release(f);
}

/* ---- fuzz_ops: conv and pool output sizes ------------------------------------ */

/* Output sizes of conv2d and the pools were computed with unchecked int64
 * arithmetic: a huge padding, dilation, kernel or group count overflowed
 * (undefined behaviour), and an output whose per-dim sizes fit but whose
 * element count did not reached the allocator as a wrapped byte count. Each
 * is now KL_ERR_OVERFLOW (ke_mul_ov/ke_add_ov in the rules, and every
 * result's shape checked where it is allocated). */
static void conv_pool_size_overflow(void **s) {
    (void)s;
    kl_tensor *x = kl_ones(KL_SHAPE(1, 1, 4, 4), KL_F32), *w = kl_ones(KL_SHAPE(1, 1, 2, 2), KL_F32);
    kl_conv2d_options o = kl_conv2d_options_default();
    o.padding[0] = INT64_MAX / 2;
    assert_null(kl_conv2d(x, w, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "kl_conv2d: padding 4611686018427387903 or dilation 1 of spatial dim 0 overflows");
    o = kl_conv2d_options_default();
    o.dilation[1] = INT64_MAX;
    assert_null(kl_conv2d(x, w, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "of spatial dim 1 overflows");
    o = kl_conv2d_options_default();
    o.groups = INT64_MAX;
    assert_null(kl_conv2d(x, kl_ones(KL_SHAPE(0, 2, 1, 1), KL_F32), NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "the input channel count overflows");
    /* each output dim fits (2^61 + 3), their product does not */
    o = kl_conv2d_options_default();
    o.padding[0] = o.padding[1] = 1ll << 60;
    assert_null(kl_conv2d(x, w, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "too many elements");
    /* the library still works */
    KT_VALUES(kl_conv2d(x, w, NULL, NULL), 0, 4, 4, 4, 4, 4, 4, 4, 4, 4);

    kl_pool2d_options p = kl_pool2d_options_default(2);
    p.kernel[0] = INT64_MAX;
    p.dilation[0] = 2;
    assert_null(kl_max_pool2d(x, &p));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "kl_max_pool2d: kernel (9223372036854775807, 2)");
    p = kl_pool2d_options_default(2);
    p.kernel[1] = INT64_MAX;
    p.padding[1] = INT64_MAX / 2;
    assert_null(kl_avg_pool2d(x, &p));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "overflow");
    p = kl_pool2d_options_default(2);
    p.kernel[0] = p.kernel[1] = 1ll << 62;
    p.padding[0] = p.padding[1] = 1ll << 61;
    p.stride[0] = p.stride[1] = 1;
    p.ceil_mode = true;
    /* a valid 5x5 output whose windows hold all 16 inputs: the kernels loop
     * over the taps inside the input, not over 2^62 (this hung) */
    kl_tensor *m = kl_max_pool2d(x, &p);
    kt_assert_shape(m, 4, (int64_t[]){1, 1, 5, 5});
    assert_int_equal(kl_item(kl_sum(m, KL_ALL_DIMS, false)), 25);
    p.count_include_pad = false;
    kl_tensor *a = kl_avg_pool2d(x, &p);
    kt_assert_shape(a, 4, (int64_t[]){1, 1, 5, 5});
    assert_int_equal(kl_item(kl_sum(a, KL_ALL_DIMS, false)), 25);
    /* counting the padding, the divisor passes 2^63: the mean is ~0, not garbage */
    p.count_include_pad = true;
    a = kl_avg_pool2d(x, &p);
    assert_true(fabs(kl_item(kl_sum(a, KL_ALL_DIMS, false))) < 1e-9);
    p = kl_pool2d_options_default(2);
    KT_VALUES(kl_max_pool2d(x, &p), 0, 1, 1, 1, 1);
}

/* ---- limits: scope nesting ---------------------------------------------------- */

/* Past 1023 nested scopes kl_scope_begin aborted the process; now it is
 * KL_ERR_STATE, the extra levels share the innermost scope, begin/end stay
 * balanced and nothing leaks. */
static void scope_nesting_limit_is_an_error(void **s) {
    (void)s;
    int64_t live = kl_live_tensors();
    int base = kl_scope_depth();
    for (int i = 0; i < 1100; i++) {
        kl_scope_begin();
        if (i == 1022 - base) assert_int_equal(kl_last_status(), KL_OK);
        kl_ones(KL_SHAPE(2), KL_F32);
    }
    KT_EXPECT_ERROR(KL_ERR_STATE, "kl_scope_begin: more than 1023 nested scopes on this thread");
    assert_int_equal(kl_scope_depth(), base + 1100);
    assert_int_equal(kl_live_tensors(), live + 1100);
    for (int i = 0; i < 1100; i++) kl_scope_end();
    assert_int_equal(kl_scope_depth(), base);
    assert_int_equal(kl_live_tensors(), live);
    assert_int_equal(kl_last_status(), KL_OK);
    /* and scopes work as before */
    kl_scope_begin();
    kl_ones(KL_SHAPE(2), KL_F32);
    kl_scope_end();
    assert_int_equal(kl_live_tensors(), live);
}

/* ---- fault injection: every tensor allocation failing in turn -------------- */

/* Representative work: eager ops (matmul, softmax, reductions, joins, index,
 * conv, pool), a backward pass, and a compile of a new function (trace,
 * passes, LLVM) then its calls. Each returns one result tensor or NULL. */
static int oom_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_softmax(kl_mul(kl_exp(in[0]), kl_add_scalar(in[0], 1)), -1);
    return out[0] ? 0 : -1;
}

static kl_tensor *oom_case(int which) {
    kl_tensor *x = kl_reshape(kl_arange(0, 48, 1, KL_F32), 2, (int64_t[]){6, 8});
    x = kl_mul_scalar(x, 0.05);
    switch (which) {
    case 0: { /* eager chain */
        kl_tensor *w = kl_ones(KL_SHAPE(8, 3), KL_F32);
        kl_tensor *y = kl_softmax(kl_matmul(x, w), -1);
        kl_tensor *c = kl_cat(2, (kl_tensor *[]){y, kl_cumsum(y, 0)}, 1);
        kl_tensor *idx = kl_arange(0, 3, 1, KL_I64);
        return kl_sum(kl_index_select(c, 0, idx), 1, (int64_t[]){0}, false);
    }
    case 1: { /* conv + pool */
        kl_tensor *im = kl_reshape(x, 4, (int64_t[]){1, 1, 6, 8});
        kl_tensor *w = kl_full(KL_SHAPE(2, 1, 3, 3), 0.5, KL_F32);
        kl_pool2d_options po = kl_pool2d_options_default(2);
        return kl_flatten(kl_max_pool2d(kl_relu(kl_conv2d(im, w, NULL, NULL)), &po), 0, -1);
    }
    case 2: { /* backward */
        kl_tensor *w = kl_full(KL_SHAPE(8, 3), 0.25, KL_F32);
        if (kl_set_requires_grad(w, true)) return NULL;
        kl_tensor *loss = kl_sum(kl_tanh(kl_matmul(x, w)), KL_ALL_DIMS, false);
        if (kl_backward(loss, NULL, NULL)) return NULL;
        return kl_grad(w) ? kl_clone(kl_grad(w)) : NULL;
    }
    default: { /* compile a new function and call it twice */
        kl_fn *f = compile_now(oom_step, NULL);
        kl_tensor *y = NULL;
        int rc = f ? kl_fn_call(f, &x, 1, &y, 1) : -1;
        if (rc == 0) rc = kl_fn_call(f, &x, 1, &y, 1);
        kl_fn_release(f);
        return rc ? NULL : y;
    }
    }
}

static void oom_at_every_allocation(void **s) {
    (void)s;
    int64_t live = kl_live_tensors(), storages = kl_live_storages();
    for (int which = 0; which < 4; which++) {
        kl_scope_begin();
        kl_tensor *ref = kl_retain(oom_case(which));
        kl_scope_end();
        assert_non_null(ref);
        int n = 0, ooms = 0;
        for (;; n++) {
            kl_scope_begin();
            ke_alloc_fail_after(n);
            kl_tensor *r = oom_case(which);
            ke_alloc_fail_after(-1);
            if (r) {
                assert_int_equal(kl_allclose(r, ref, 1e-5, 1e-6, false), 1);
                kl_scope_end();
                break;
            }
            if (kl_last_status() != KL_ERR_OOM)
                fail_msg("case %d, allocation %d: expected KL_ERR_OOM, got %s: %s", which, n,
                         kl_status_name(kl_last_status()), kl_last_error());
            ooms++;
            kl_clear_error();
            kl_scope_end();
            if (kl_live_tensors() != live + 1 || kl_live_storages() != storages + 1)
                fail_msg("case %d, allocation %d failed: %lld tensors and %lld storages left alive", which, n,
                         (long long)(kl_live_tensors() - live - 1), (long long)(kl_live_storages() - storages - 1));
            assert_true(n < 500);
        }
        assert_true(ooms > 0); /* the sweep did reach the allocator */
        print_message("oom sweep: case %d: %d allocations failed in turn, each a clean KL_ERR_OOM\n", which, ooms);
        /* the library is still usable: the same work gives the same answer */
        kl_scope_begin();
        assert_int_equal(kl_allclose(oom_case(which), ref, 1e-5, 1e-6, false), 1);
        kl_scope_end();
        kl_release(ref);
        assert_int_equal(kl_live_tensors(), live);
    }
}

/* ---- limits: the header's LIMITS section, each one ----------------------------- */

static void limits_dims_and_sizes(void **s) {
    (void)s;
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, eight[8] = {1, 1, 1, 1, 1, 1, 1, 2};
    kt_assert_shape(kl_zeros(8, eight, KL_F32), 8, eight);
    assert_null(kl_zeros(9, nine, KL_F32));
    assert_int_not_equal(kl_last_status(), KL_OK);
    kl_clear_error();
    assert_null(kl_reshape(kl_ones(KL_SHAPE(1), KL_F32), 9, nine));
    assert_int_not_equal(kl_last_status(), KL_OK);
    kl_clear_error();
    /* element count times 16 must fit in int64 */
    assert_null(kl_empty(KL_SHAPE((int64_t)1 << 30, (int64_t)1 << 30), KL_F32));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "");
    assert_null(kl_zeros(KL_SHAPE(-1, 2), KL_F32));
    assert_int_not_equal(kl_last_status(), KL_OK);
    kl_clear_error();
    /* an empty tensor reshaped to huge dims beside a 0: its strides would overflow (fuzz_ops) */
    kl_tensor *e = kl_zeros(KL_SHAPE(0), KL_F32);
    assert_null(kl_reshape(e, KL_SHAPE(0, 7607190503311287298LL, 30)));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "kl_reshape: shape [0,7607190503311287298,30] is too large");
    kt_assert_shape(kl_reshape(e, KL_SHAPE(0, (int64_t)1 << 40, 4)), 3, (int64_t[]){0, (int64_t)1 << 40, 4});
}

static int limit_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_exp(in[0]);
    return out[0] ? 0 : -1;
}

static void limits_recompile(void **s) {
    (void)s;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.recompile_limit = 0;
    assert_null(kl_compile(limit_fn, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "recompile_limit must be in [1, 1024], got 0");
    o.recompile_limit = 1025;
    assert_null(kl_compile(limit_fn, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "recompile_limit must be in [1, 1024], got 1025");
    o.recompile_limit = 2;
    kl_fn *f = kl_compile(limit_fn, NULL, &o);
    assert_non_null(f);
    for (int n = 1; n <= 4; n++) { /* four signatures: two traced, two eager */
        kl_tensor *x = kl_full(1, (int64_t[]){n}, 0.5, KL_F32), *y = NULL;
        assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
        assert_int_equal(kl_allclose(y, kl_exp(x), 1e-6, 1e-7, false), 1);
    }
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    assert_int_equal(st.traces, 2);
    assert_int_equal(st.eager_calls, 2);
    kl_fn_release(f);
    KT_NO_ERROR();
}

static void limits_print_options(void **s) {
    (void)s;
    char buf[512];
    kl_tensor *t = kl_full(KL_SHAPE(1), 1.0 / 3, KL_F64);
    kl_set_print_options(1000000, -1, -1, -1); /* past the range: 64 digits */
    assert_true(kl_format(t, buf, sizeof buf) > 0);
    const char *dot = strchr(buf, '.');
    assert_non_null(dot);
    size_t digits = strspn(dot + 1, "0123456789");
    assert_int_equal(digits, 64);
    kl_set_print_options(2, -1, -1, -1);
    kl_set_print_options(-1, -1, 0, 0); /* below the minimums: kept */
    assert_true(kl_format(t, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "0.33"));
    assert_null(strstr(buf, "0.333"));
    kl_set_print_options(4, 1000, 3, 80); /* the defaults */
    assert_true(kl_format(t, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "0.3333"));
    KT_NO_ERROR();
}

/* A mapped .npy shows a later in-place rewrite of the file, and truncation is
 * SIGBUS; kl_load_npy_copy sees neither. */
static void bus_exit(int sig) {
    (void)sig;
    _exit(42);
}

static int read_in_child(const kl_tensor *t) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa = {.sa_handler = bus_exit};
        sigaction(SIGBUS, &sa, NULL);
        volatile float sum = 0;
        const float *p = kl_data_ptr((kl_tensor *)t);
        for (int i = 0; i < 1024; i++) sum += p[i];
        _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

static void limits_mapped_npy(void **s) {
    (void)s;
    const char *path = kt_tmp_path("mapped.npy");
    assert_int_equal(kl_save_npy(path, kl_arange(0, 1024, 1, KL_F32)), 0);
    kl_tensor *mapped = kl_load_npy(path), *copied = kl_load_npy_copy(path);
    assert_non_null(mapped);
    assert_non_null(copied);
    assert_null(kl_load_npy_copy(kt_tmp_path("missing.npy")));
    KT_EXPECT_ERROR(KL_ERR_IO, "load_npy_copy");
    /* another writer rewrites the data in place: the mapping shows it */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    float v = -5;
    assert_int_equal(pwrite(fd, &v, sizeof v, sb.st_size - 1024 * 4), (ssize_t)sizeof v);
    close(fd);
    assert_true(kt_get(mapped, 0) == -5);
    assert_true(kt_get(copied, 0) == 0);
    /* truncated: touching the mapping is SIGBUS; the copy is unaffected */
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(read_in_child(mapped), 42);
    assert_int_equal(read_in_child(copied), 0);
    assert_true(kt_get(copied, 1023) == 1023);
    KT_NO_ERROR();
}

/* ---- fault injection: the kernel cache and LLVM ----------------------------------- */

#ifdef KL_HAVE_LLVM
/* A function whose kernels no other test compiles (the constant differs). */
static int cache_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    double c = *(const double *)user;
    (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(kl_mul(kl_sin(in[0]), kl_exp(kl_mul_scalar(in[0], c))), c);
    return out[0] ? 0 : -1;
}

/* Compiles, calls and checks against eager; 0 if the answer is right. */
static int cache_round(double c) {
    kl_scope_begin();
    kl_tensor *x = kl_mul_scalar(kl_arange(0, 37, 1, KL_F32), 0.1), *y = NULL, *r = NULL;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.backend = "llvm";
    kl_fn *f = kl_compile(cache_step, &c, &o);
    int rc = f ? kl_fn_call(f, &x, 1, &y, 1) : -1;
    cache_step(&c, &x, 1, &r, 1);
    if (!rc) rc = kl_allclose(y, r, 1e-5, 1e-6, false) == 1 ? 0 : -2;
    kl_fn_release(f);
    kl_scope_end();
    return rc;
}

static char saved_cache_env[1024];
static void use_cache_dir(const char *dir) {
    if (!saved_cache_env[0]) {
        const char *e = getenv("KL_CACHE_DIR");
        snprintf(saved_cache_env, sizeof saved_cache_env, "%s", e ? e : "off");
    }
    setenv("KL_CACHE_DIR", dir ? dir : saved_cache_env, 1);
    ke_cache_reset();
}

static int count_entries(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name), ls = strlen(suffix);
        if (e->d_name[0] != '.' && l >= ls && !strcmp(e->d_name + l - ls, suffix)) n++;
    }
    if (d) closedir(d);
    return n;
}
#endif

static void forced_llvm_failure_falls_back(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    use_cache_dir("off");
    int64_t fb = cg_llvm_fallbacks();
    cg_llvm_fail_next(1000);
    assert_int_equal(cache_round(0.125), 0); /* the interpreter ran what LLVM refused */
    cg_llvm_fail_next(0);
    KT_NO_ERROR();
    assert_true(cg_llvm_fallbacks() > fb);
    /* and LLVM compiles again afterwards */
    fb = cg_llvm_fallbacks();
    assert_int_equal(cache_round(0.125), 0);
    assert_int_equal(cg_llvm_fallbacks(), fb);
    use_cache_dir(NULL);
#else
    skip();
#endif
}

static void corrupt_cache_entries_recompile(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    const char *dir = kt_tmp_path("kc-corrupt");
    use_cache_dir(dir);
    ke_cache_stats a, b;
    ke_cache_get_stats(&a);
    assert_int_equal(cache_round(0.25), 0);
    ke_cache_get_stats(&b);
    int n = count_entries(dir, KE_CACHE_OBJ);
    assert_true(n > 0);
    assert_int_equal(b.stores - a.stores, n);
    /* damage every entry: truncate the first, flip a payload byte of the rest */
    DIR *d = opendir(dir);
    struct dirent *e;
    int k = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        if (k++ == 0) {
            assert_int_equal(truncate(p, sb.st_size / 2), 0);
        } else {
            int fd = open(p, O_RDWR);
            uint8_t byte;
            assert_int_equal(pread(fd, &byte, 1, sb.st_size - 3), 1);
            byte ^= 0x5a;
            assert_int_equal(pwrite(fd, &byte, 1, sb.st_size - 3), 1);
            close(fd);
        }
    }
    closedir(d);
    /* a transparent recompile: right answer, bad entries counted and rewritten */
    ke_cache_get_stats(&a);
    assert_int_equal(cache_round(0.25), 0);
    ke_cache_get_stats(&b);
    assert_int_equal(b.corrupt - a.corrupt, n);
    assert_int_equal(b.stores - a.stores, n);
    /* and now every kernel is a hit */
    ke_cache_get_stats(&a);
    assert_int_equal(cache_round(0.25), 0);
    ke_cache_get_stats(&b);
    assert_int_equal(b.hits - a.hits, n);
    assert_int_equal(b.misses - a.misses, 0);
    use_cache_dir(NULL);
    KT_NO_ERROR();
#else
    skip();
#endif
}

static void full_or_unusable_cache_dir(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    /* full: every write past 100 bytes fails (EFBIG, as ENOSPC would) */
    const char *dir = kt_tmp_path("kc-full");
    use_cache_dir(dir);
    ke_cache_stats a, b;
    ke_cache_get_stats(&a);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {100, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = cache_round(0.375);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    assert_int_equal(rc, 0);
    ke_cache_get_stats(&b);
    assert_true(b.store_failures > a.store_failures);
    /* nothing half-written is left behind: no entry, no temporary file */
    DIR *d = opendir(dir);
    int files = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) files++;
    if (d) closedir(d);
    assert_int_equal(files, 0);
    /* unusable: a regular file where the folder should be */
    const char *file = kt_tmp_path("kc-file");
    FILE *fp = fopen(file, "w");
    assert_non_null(fp);
    fclose(fp);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/cache", file);
    use_cache_dir(sub);
    assert_int_equal(cache_round(0.375), 0);
    use_cache_dir(NULL);
    KT_NO_ERROR();
#else
    skip();
#endif
}

/* Every name in dir (entries and temporaries alike). */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

#ifdef KL_HAVE_LLVM
/* Kernels that differ with k (k tanh applications: a new kernel IR, so a new
 * cache key; a constant alone does not change the key). */
static int chain_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    int k = *(const int *)user;
    (void)n_in, (void)n_out;
    kl_tensor *y = kl_mul_scalar(in[0], 0.5);
    for (int i = 0; i < k; i++) y = kl_tanh(kl_add_scalar(y, 0.25));
    out[0] = y;
    return out[0] ? 0 : -1;
}

/* Compiles chain_step(k), calls it and checks against eager; 0 if right. */
static int chain_round(int k) {
    kl_scope_begin();
    kl_tensor *x = kl_mul_scalar(kl_arange(0, 29, 1, KL_F32), 0.1), *y = NULL, *r = NULL;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.backend = "llvm";
    kl_fn *f = kl_compile(chain_step, &k, &o);
    int rc = f ? kl_fn_call(f, &x, 1, &y, 1) : -1;
    chain_step(&k, &x, 1, &r, 1);
    if (!rc) rc = kl_allclose(y, r, 1e-5, 1e-6, false) == 1 ? 0 : -2;
    kl_fn_release(f);
    kl_scope_end();
    return rc;
}

typedef struct cache_lines {
    int stores_off, disabled;
} cache_lines;

static void count_cache_lines(void *user, const char *category, kl_log_level level, const char *message) {
    cache_lines *c = user;
    (void)level;
    if (strcmp(category, "cache") != 0) return;
    if (strstr(message, "stores off")) c->stores_off++;
    if (strstr(message, "disabled")) c->disabled++;
}
#endif

/* A read-only or full cache folder, injected (the tests run as root, for whom
 * permission bits stop nothing, and mounting a small or read-only file
 * system needs privileges a container may lack): ke_write_fail_inject makes
 * every write fail as such a folder would, EROFS/EACCES when the temporary is
 * created, ENOSPC/EDQUOT after part of the entry is written. A folder already
 * holding this function's kernels serves them (hits), the first new store
 * fails, stores stop with one log line and the cache is not disabled;
 * compiles keep giving the right answer; nothing is left half-written; the
 * next "process" (ke_cache_reset) with the folder writable again stores and
 * then loads the new kernels. The CUDA runtime's CUBINs go through the same
 * ke_cache_store, so this covers them too. */
static void cache_dir_read_only_or_full(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    static const struct {
        int err, at_write;
        const char *name;
        int k; /* chain lengths k, k + 1, k + 2: kernels no other test compiles */
    } cases[] = {{EROFS, 0, "kc-rofs", 11}, {EACCES, 0, "kc-acces", 14}, {ENOSPC, 1, "kc-nospc", 17}, {EDQUOT, 1, "kc-dquot", 20}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s", kt_tmp_path(cases[i].name));
        int c = cases[i].k, c_new = c + 1, c_newer = c + 2;
        ke_cache_stats a, b;
        /* a good run fills the folder with the kernels of c */
        use_cache_dir(dir);
        ke_cache_get_stats(&a);
        assert_int_equal(chain_round(c), 0);
        ke_cache_get_stats(&b);
        int n = count_entries(dir, KE_CACHE_OBJ);
        assert_true(n >= 1);
        assert_int_equal(b.stores - a.stores, n);
        /* a later process: the folder refuses writes */
        use_cache_dir(dir);
        cache_lines lines = {0, 0};
        kl_set_log_callback(count_cache_lines, &lines);
        assert_int_equal(kl_set_log("cache"), 0);
        ke_cache_get_stats(&a);
        ke_write_fail_inject(cases[i].err, cases[i].at_write);
        int rc_old = chain_round(c), rc_new = chain_round(c_new), rc_newer = chain_round(c_newer);
        ke_write_fail_inject(0, 0);
        kl_set_log_callback(NULL, NULL);
        kl_set_log(getenv("KL_LOG"));
        kl_clear_error();
        assert_int_equal(rc_old, 0);
        assert_int_equal(rc_new, 0);
        assert_int_equal(rc_newer, 0);
        ke_cache_get_stats(&b);
        assert_int_equal(b.hits - a.hits, n);           /* what it holds still loads */
        assert_int_equal(b.store_failures - a.store_failures, 1); /* then stores stopped */
        assert_int_equal(b.stores - a.stores, 0);
        assert_int_equal(lines.stores_off, 1);
        assert_int_equal(lines.disabled, 0);
        assert_non_null(ke_cache_dir());
        assert_int_equal(count_files(dir), n); /* no new entry, no temporary */
        /* writable again: new kernels are stored, then hit */
        use_cache_dir(dir);
        ke_cache_get_stats(&a);
        assert_int_equal(chain_round(c_new), 0);
        ke_cache_get_stats(&b);
        assert_true(b.stores - a.stores >= 1);
        assert_int_equal(b.store_failures - a.store_failures, 0);
        int m = count_entries(dir, KE_CACHE_OBJ);
        assert_int_equal(m, n + (int)(b.stores - a.stores));
        ke_cache_get_stats(&a);
        assert_int_equal(chain_round(c_new), 0);
        ke_cache_get_stats(&b);
        assert_int_equal(b.hits - a.hits, m - n);
        assert_int_equal(count_files(dir), m);
    }
    use_cache_dir(NULL);
    KT_NO_ERROR();
#else
    skip();
#endif
}

/* Saving into a full or read-only folder: a clean KL_ERR_IO naming the path
 * and the reason, the file already at the path untouched, no temporary left.
 * The full disk is real here (RLIMIT_FSIZE: writes past 64 bytes fail with
 * EFBIG) and injected (ENOSPC after part of the file is written); the
 * read-only folder is injected (root writes through permission bits). */
static void save_into_full_or_read_only_dir(void **s) {
    (void)s;
    for (int which = 0; which < 2; which++) {
        char dir[600], path[700];
        snprintf(dir, sizeof dir, "%s", kt_tmp_path(which ? "full-st" : "full-npy"));
        assert_int_equal(mkdir(dir, 0755), 0);
        snprintf(path, sizeof path, "%s/%s", dir, which ? "w.safetensors" : "w.npy");
        kl_scope_begin();
        kl_tensor *old = kl_arange(0, 3, 1, KL_F32), *big = kl_ones(1, (int64_t[]){1000}, KL_F32);
        assert_int_equal(save_both(path, old, which), 0);
        struct stat before, after;
        assert_int_equal(stat(path, &before), 0);
        for (int how = 0; how < 3; how++) {
            int rc;
            if (how == 0) {
                struct rlimit lim, small;
                getrlimit(RLIMIT_FSIZE, &lim);
                small = (struct rlimit){64, lim.rlim_max};
                signal(SIGXFSZ, SIG_IGN);
                assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
                rc = save_both(path, big, which);
                setrlimit(RLIMIT_FSIZE, &lim);
                signal(SIGXFSZ, SIG_DFL);
                assert_true(rc < 0);
                KT_EXPECT_ERROR(KL_ERR_IO, "write failed: File too large");
            } else {
                ke_write_fail_inject(how == 1 ? ENOSPC : EROFS, how == 1);
                rc = save_both(path, big, which);
                ke_write_fail_inject(0, 0);
                assert_true(rc < 0);
                if (!strstr(kl_last_error(), path)) fail_msg("the error does not name the path: %s", kl_last_error());
                if (how == 1) KT_EXPECT_ERROR(KL_ERR_IO, "write failed: No space left on device");
                else KT_EXPECT_ERROR(KL_ERR_IO, "cannot create a temporary file beside it: Read-only file system");
            }
            /* the old file is the same file with the same bytes, and nothing else is there */
            assert_int_equal(stat(path, &after), 0);
            assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
            KT_VALUES(load_back(path, which), 0, 0, 1, 2);
            assert_int_equal(count_files(dir), 1);
        }
        /* and with room again the save replaces it */
        assert_int_equal(save_both(path, big, which), 0);
        assert_true(kl_item(kl_sum(load_back(path, which), 0, NULL, false)) == 1000);
        assert_int_equal(count_files(dir), 1);
        kl_scope_end();
    }
    KT_NO_ERROR();
}

/* ---- fuzz_ops: indices made from floats, eager against compiled -------------------- */

/* The indices come from a float expression (x * 2 - 0.5 cast to int64), which
 * FUSE mode compiles into one kernel with the cast. */
static int float_index_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *idx = kl_to_dtype(kl_sub_scalar(kl_mul_scalar(in[0], 2), 0.5), KL_I64);
    out[0] = kl_embedding(in[1], idx);
    out[1] = kl_index_select(in[1], 0, idx);
    return out[0] && out[1] ? 0 : -1;
}

/* fuzz_ops' compiled program failed with an index error where "eager ran"
 * (tests/fuzz/ops/crash-embedding-index-from-floats). The cause was the
 * harness: eager failed the program's kl_embedding on an index of -1, the
 * trace (meta tensors, no values) kept it, and the two runs' failure counts
 * matched by chance. The library's side is this: a float-made index
 * truncates toward zero in eager and compiled code alike (-0.9 is 0, -1.1 is
 * -1), in range both run with equal answers, out of range both fail with
 * the same KL_ERR_INDEX, and the function works again afterwards. */
static void compiled_indices_from_floats_match_eager(void **s) {
    (void)s;
    const char *backends[] = {"interp",
#ifdef KL_HAVE_LLVM
                              "llvm"
#endif
    };
    const float w_data[] = {1, 2, 3, 4, 5, 6};
    const float good[] = {-0.2f, 0.2f, 0.7f, 1.2f, 1.7f}; /* -0.9 -0.1 0.9 1.9 2.9 -> 0 0 0 1 2 */
    const float bad[] = {0.2f, -0.3f};                    /* -0.1 -1.1 -> 0 -1 */
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        kl_scope_begin();
        kl_tensor *w = kl_from_data(w_data, 2, (int64_t[]){3, 2}, KL_F32);
        kl_tensor *xg = kl_from_data(good, 1, (int64_t[]){5}, KL_F32);
        kl_tensor *xb = kl_from_data(bad, 1, (int64_t[]){2}, KL_F32);
        kl_compile_options o = kl_compile_options_default();
        o.interp_tier = -1; /* compiled at the first call */
        o.mode = KL_COMPILE_FUSE;
        o.backend = backends[b];
        kl_fn *f = kl_compile(float_index_step, NULL, &o);
        assert_non_null(f);
        for (int round = 0; round < 2; round++) {
            kl_tensor *in[2] = {xg, w}, *out[2] = {0}, *ref[2] = {0};
            assert_int_equal(kl_fn_call(f, in, 2, out, 2), 0);
            assert_int_equal(float_index_step(NULL, in, 2, ref, 2), 0);
            for (int i = 0; i < 2; i++) {
                KT_VALUES(out[i], 0, 1, 2, 1, 2, 1, 2, 3, 4, 5, 6);
                assert_int_equal(kl_equal(out[i], ref[i]), 1);
            }
            /* out of range: eager and compiled fail alike */
            in[0] = xb;
            assert_int_equal(float_index_step(NULL, in, 2, ref, 2), -1);
            char eager_msg[512];
            snprintf(eager_msg, sizeof eager_msg, "%s", kl_last_error());
            KT_EXPECT_ERROR(KL_ERR_INDEX, "index -1 is out of range");
            assert_int_not_equal(kl_fn_call(f, in, 2, out, 2), 0);
            if (strcmp(kl_last_error(), eager_msg) != 0)
                fail_msg("backend %s: compiled \"%s\", eager \"%s\"", backends[b], kl_last_error(), eager_msg);
            KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_embedding: index -1 is out of range");
        }
        kl_fn_release(f);
        kl_scope_end();
    }
    KT_NO_ERROR();
}

/* ---- fuzz_ops: kl_as_strided inside a compiled function ------------------------- */

/* out[0]: as_strided over the input itself (offset 1 counts from the start of
 * the caller's storage); out[1]: over a value the graph made. */
static int strided_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(kl_as_strided(in[0], 2, (int64_t[]){2, 2}, (int64_t[]){1, 2}, 1), 1);
    out[1] = kl_as_strided(kl_mul_scalar(in[0], 2), 2, (int64_t[]){2, 2}, (int64_t[]){2, 1}, 1);
    return out[0] && out[1] ? 0 : -1;
}

static int intermediate_strided_step(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(kl_as_strided(kl_mul_scalar(in[0], 2), 2, (int64_t[]){2, 2}, (int64_t[]){2, 1}, 1), 1);
    return out[0] ? 0 : -1;
}

/* fuzz_ops found kl_as_strided failing while tracing where it ran eagerly
 * ("view of shape [] with offset 0 reaches outside a storage of 0 elements"):
 * the trace's stand-in for an input has no storage, and the caller's storage
 * (its size, the input's offset in it) is nothing the graph or its guards
 * know. Over an input (here a view at offset 2 of a larger tensor) the trace
 * now breaks with a reason and the signature runs eagerly, with eager's
 * answer; over a value the graph made it still compiles. */
static void as_strided_in_compiled_function(void **s) {
    (void)s;
    kl_scope_begin();
    kl_tensor *base = kl_arange(0, 8, 1, KL_F32);
    kl_tensor *x = kl_narrow(base, 0, 2, 5); /* 2..6, storage offset 2 */
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.mode = KL_COMPILE_FUSE;
    kl_fn *f = kl_compile(strided_step, NULL, &o);
    assert_non_null(f);
    for (int call = 0; call < 2; call++) {
        kl_tensor *out[2] = {0}, *ref[2] = {0};
        assert_int_equal(kl_fn_call(f, &x, 1, out, 2), 0);
        assert_int_equal(strided_step(NULL, &x, 1, ref, 2), 0);
        KT_VALUES(out[0], 0, 2, 4, 3, 5); /* storage elements 1, 3, 2, 4, plus 1 */
        KT_VALUES(out[1], 0, 6, 8, 10, 12);
        for (int i = 0; i < 2; i++) assert_int_equal(kl_equal(out[i], ref[i]), 1);
    }
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.eager_calls, 2);
    assert_non_null(strstr(st.last_reason, "kl_as_strided over the storage of an input"));
    kl_fn_release(f);
    /* over a value the graph made: compiled, no eager call */
    f = kl_compile(intermediate_strided_step, NULL, &o);
    kl_tensor *y = NULL, *r = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    assert_int_equal(intermediate_strided_step(NULL, &x, 1, &r, 1), 0);
    KT_VALUES(y, 0, 7, 9, 11, 13);
    assert_int_equal(kl_equal(y, r), 1);
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.eager_calls, 0);
    kl_fn_release(f);
    kl_scope_end();
    KT_NO_ERROR();
}

/* ---- fuzz_dlpack: a byte offset past the address space ---------------------- */

static int dl_deletes;
static void dl_count_delete(DLManagedTensor *m) {
    (void)m;
    dl_deletes++;
}

/* data + byte_offset wrapped around the address space (UBSan: pointer
 * overflow; the tensor then pointed below its buffer). */
/* fuzz_dlpack (UBSan, kiln.sh fuzz's first run): an empty tensor whose data
 * pointer is NULL made ke_data compute NULL + 0 (undefined behaviour, which
 * UBSan reports in the ASan build); it now imports as an empty tensor. */
static void dlpack_empty_null_data(void **s) {
    (void)s;
    int64_t shape[2] = {0, 3};
    DLManagedTensor m = {.dl_tensor = {.data = NULL, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1},
                                       .shape = shape, .strides = NULL, .byte_offset = 0},
                         .deleter = dl_count_delete};
    dl_deletes = 0;
    kl_tensor *t = kl_from_dlpack(&m);
    assert_non_null(t);
    assert_int_equal(kl_numel(t), 0);
    kl_tensor *c = kl_contiguous(kl_add_scalar(t, 1));
    assert_non_null(c);
    assert_int_equal(kl_numel(c), 0);
    kl_release(c);
    kl_release(t);
    assert_int_equal(dl_deletes, 1);
    KT_NO_ERROR();
}

static void dlpack_byte_offset_overflow(void **s) {
    (void)s;
    static float buf[4];
    int64_t shape[1] = {1};
    DLManagedTensor m = {.dl_tensor = {.data = buf, .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1},
                                       .shape = shape, .strides = NULL, .byte_offset = UINT64_MAX},
                         .deleter = dl_count_delete};
    dl_deletes = 0;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "overflows the address space");
    assert_int_equal(dl_deletes, 0); /* the caller keeps it */
    m.dl_tensor.byte_offset = 2 * sizeof(float);
    kl_tensor *t = kl_from_dlpack(&m);
    assert_non_null(t);
    buf[2] = 7;
    KT_VALUES(t, 0, 7);
    kl_release(t);
    assert_int_equal(dl_deletes, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(huge_slice_step),
        KT_TEST(as_strided_extreme_strides),
        KT_TEST(fn_call_counts),
        KT_TEST(thread_exit_releases_scopes),
        KT_TEST(reentrant_call_is_an_error),
        KT_TEST(set_grad_refuses_self_and_mismatch),
        KT_TEST(compile_check_replays_random_counters),
        KT_TEST(compile_copies_the_name),
        KT_TEST(backward_over_captured_leaf_runs_eagerly),
        KT_TEST(compile_under_memory_pressure_survives),
        KT_TEST(save_writes_through_links_refuses_special),
        KT_TEST(stale_error_changes_nothing),
        KT_TEST(conv_pool_size_overflow),
        KT_TEST(scope_nesting_limit_is_an_error),
        KT_TEST(oom_at_every_allocation),
        KT_TEST(compiled_indices_from_floats_match_eager),
        KT_TEST(as_strided_in_compiled_function),
        KT_TEST(dlpack_byte_offset_overflow),
        KT_TEST(dlpack_empty_null_data),
        KT_TEST(limits_dims_and_sizes),
        KT_TEST(limits_recompile),
        KT_TEST(limits_print_options),
        KT_TEST(limits_mapped_npy),
        KT_TEST(forced_llvm_failure_falls_back),
        KT_TEST(corrupt_cache_entries_recompile),
        KT_TEST(full_or_unusable_cache_dir),
        KT_TEST(cache_dir_read_only_or_full),
        KT_TEST(save_into_full_or_read_only_dir),
    };
    int r = cmocka_run_group_tests_name("hardening", tests, NULL, NULL);
    kt_tmp_cleanup();
    return r;
}
