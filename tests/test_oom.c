/*
 * test_oom.c — every heap allocation the library makes (not only tensor
 * storage) failing in turn, over eager ops, a backward pass and compiles.
 *
 * This executable is linked with -Wl,--wrap=malloc,--wrap=calloc,
 * --wrap=realloc (tests/meson.build): every malloc/calloc/realloc call in
 * libkiln.a's objects (the IR, the tracer, the kernel IR, the LLVM backend's
 * C side, autograd's nodes, scope arrays, headers) goes through the wrappers
 * below, which fail exactly the n-th call after they are armed. (Calls from
 * inside shared libraries, LLVM's C++ operator new among them, are not
 * wrapped; tensor storage has its own hook, ke_alloc_fail_after, swept by
 * test_hardening's oom_at_every_allocation.)
 *
 * For each n until the work succeeds: the run gives either the reference
 * answer (the allocation was optional: a cache, a log line) or NULL with
 * KL_ERR_OOM; afterwards no tensor or storage is left alive (and LSan, in the
 * ASan build, finds nothing leaked at exit); and at the end the same work
 * still gives the reference answer.
 */
#include "harness.h"

#include "diskcache.h"
#include "kiln/nn.h"

#include <stdatomic.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static _Atomic long countdown = -1; /* calls left before the failing one; < 0: off */
static _Atomic long fired;          /* failures injected since armed */
static _Atomic long seen;           /* calls since armed */

static int fail_now(void) {
    if (atomic_load_explicit(&countdown, memory_order_relaxed) < 0) return 0;
    atomic_fetch_add(&seen, 1);
    if (atomic_fetch_sub(&countdown, 1) != 0) return 0;
    atomic_fetch_add(&fired, 1);
    return 1;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return fail_now() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }

static void arm(long n) {
    atomic_store(&fired, 0);
    atomic_store(&seen, 0);
    atomic_store(&countdown, n);
}
static void disarm(void) { atomic_store(&countdown, -1); }

/* ---- the work ------------------------------------------------------------------ */

static int step_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    out[0] = kl_softmax(kl_mul(kl_exp(x), kl_add_scalar(kl_tanh(x), 1)), -1);
    out[1] = kl_sum(kl_mul(x, x), KL_DIMS(1), false);
    return out[0] && out[1] ? 0 : -1;
}

static kl_tensor *input(void) {
    return kl_mul_scalar(kl_reshape(kl_arange(0, 48, 1, KL_F32), 2, (int64_t[]){6, 8}), 0.05);
}

/* One result (or NULL) from case `which`. */
static kl_tensor *work(int which) {
    kl_tensor *x = input();
    switch (which) {
    case 0: { /* eager ops that use host memory besides storage: sampling, files */
        kl_manual_seed(7);
        kl_tensor *m = kl_multinomial(kl_softmax(x, -1), 3, false);
        kl_tensor *c = kl_cat(3, (kl_tensor *[]){x, kl_exp(x), kl_to_dtype(m, KL_F32)}, 1);
        const char *npy = kt_tmp_path("oom.npy"), *st = kt_tmp_path("oom.safetensors");
        if (!c || kl_save_npy(npy, c) || kl_save_safetensors(st, 2, (const char *[]){"c", "m"}, (kl_tensor *[]){c, m}, NULL))
            return NULL;
        kl_tensor *a = kl_load_npy(npy);
        kl_safetensors *f = kl_load_safetensors(st);
        kl_tensor *b = f ? kl_clone(kl_safetensors_find(f, "c")) : NULL; /* scope-owned, outlives f */
        kl_safetensors_free(f);
        return kl_add(a, b);
    }
    case 1: { /* backward through an MLP: autograd's nodes, saved tensors, the engine */
        kl_tensor *w = kl_full(KL_SHAPE(8, 3), 0.25, KL_F32), *b = kl_full(KL_SHAPE(3), 0.1, KL_F32);
        if (kl_set_requires_grad(w, true) || kl_set_requires_grad(b, true)) return NULL;
        kl_tensor *loss = kl_mean(kl_sigmoid(kl_add(kl_matmul(kl_tanh(x), w), b)), KL_ALL_DIMS, false);
        if (kl_backward(loss, NULL, NULL)) return NULL;
        if (!kl_grad(w) || !kl_grad(b)) return NULL;
        return kl_cat(2, (kl_tensor *[]){kl_flatten(kl_grad(w), 0, -1), kl_grad(b)}, 0);
    }
    default: { /* compile a new function (trace, passes, kernels) and call it twice */
        kl_compile_options o = kl_compile_options_default();
        o.backend = which == 2 ? "interp" : "llvm";
        kl_fn *f = kl_compile(step_fn, NULL, &o);
        kl_tensor *y[2] = {0};
        int rc = f ? kl_fn_call(f, &x, 1, y, 2) : -1;
        if (rc == 0) rc = kl_fn_call(f, &x, 1, y, 2);
        kl_fn_release(f);
        return rc ? NULL : kl_cat(2, (kl_tensor *[]){kl_flatten(y[0], 0, -1), y[1]}, 0);
    }
    }
}

static const char *case_name[] = {"eager", "backward", "compile (interp)", "compile (llvm)"};

static void sweep(int which, long stride) {
    int64_t live = kl_live_tensors(), storages = kl_live_storages();
    kl_scope_begin();
    kl_tensor *ref = kl_retain(work(which));
    kl_scope_end();
    assert_non_null(ref);
    long ooms = 0, survived = 0, n = 0;
    for (;; n += n < 64 ? 1 : stride) {
        kl_scope_begin();
        arm(n);
        kl_tensor *r = work(which);
        long did_fail = atomic_load(&fired);
        disarm();
        if (r) {
            if (kl_allclose(r, ref, 1e-5, 1e-6, false) != 1)
                fail_msg("%s, allocation %ld failed: a wrong answer", case_name[which], n);
            survived += did_fail > 0;
        } else {
            if (kl_last_status() != KL_ERR_OOM)
                fail_msg("%s, allocation %ld failed: expected KL_ERR_OOM, got %s: %s", case_name[which], n,
                         kl_status_name(kl_last_status()), kl_last_error());
            if (!did_fail) fail_msg("%s: failed with no allocation failing: %s", case_name[which], kl_last_error());
            ooms++;
        }
        kl_clear_error();
        kl_scope_end();
        if (kl_live_tensors() != live + 1 || kl_live_storages() != storages + 1)
            fail_msg("%s, allocation %ld failed: %lld tensors and %lld storages left alive", case_name[which], n,
                     (long long)(kl_live_tensors() - live - 1), (long long)(kl_live_storages() - storages - 1));
        if (!did_fail) break; /* past the last allocation: the work ran whole */
        assert_true(n < 200000);
    }
    assert_true(ooms > 0);
    print_message("oom sweep (every allocation): %s: %ld calls, %ld failures gave KL_ERR_OOM, %ld were survived\n",
                  case_name[which], n, ooms, survived);
    /* still usable: the same work, the same answer */
    kl_scope_begin();
    assert_int_equal(kl_allclose(work(which), ref, 1e-5, 1e-6, false), 1);
    kl_scope_end();
    kl_release(ref);
    assert_int_equal(kl_live_tensors(), live);
}

static void eager_ops_fail_every_allocation(void **s) {
    (void)s;
    sweep(0, 1);
}
static void backward_fails_every_allocation(void **s) {
    (void)s;
    sweep(1, 1);
}
static void compile_interp_fails_every_allocation(void **s) {
    (void)s;
    sweep(2, 1);
}
static void compile_llvm_fails_every_allocation(void **s) {
    (void)s;
#ifdef KL_HAVE_LLVM
    /* no disk cache: every run emits, optimizes and JITs its kernels */
    const char *e = getenv("KL_CACHE_DIR");
    char old[1024];
    snprintf(old, sizeof old, "%s", e ? e : "off");
    setenv("KL_CACHE_DIR", "off", 1);
    ke_cache_reset();
    sweep(3, 1);
    setenv("KL_CACHE_DIR", old, 1);
    ke_cache_reset();
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(eager_ops_fail_every_allocation),
        KT_TEST(backward_fails_every_allocation),
        KT_TEST(compile_interp_fails_every_allocation),
        KT_TEST(compile_llvm_fails_every_allocation),
    };
    int r = cmocka_run_group_tests_name("oom", tests, NULL, NULL);
    kt_tmp_cleanup();
    return r;
}
