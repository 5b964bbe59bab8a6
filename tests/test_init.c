/*
 * test_init.c — the composition root (src/init.c): nothing runs at load
 * time (no constructors, so static and shared links behave the same); the
 * first entry point that needs the layers above eager installs their hooks,
 * once, from any number of threads; $KL_ANOMALY is read then and never
 * overrides a choice made in code. Its own process: the first test sees the
 * library before anything initialized it.
 */
#include "harness.h"

#include "autograd.h"
#include "cuda_device.h"
#include "kernel.h"
#include "trace.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

static void nothing_runs_at_load_time(void **state) {
    (void)state;
    /* eager ops need no upper layer, and install nothing */
    kl_tensor *a = kl_add(kl_ones(KL_SHAPE(3), KL_F32), kl_ones(KL_SHAPE(3), KL_F32));
    KT_VALUES(a, 0, 2, 2, 2);
    /* nor do moves that name no CUDA device: CUDA joins at its first request
     * only, and the driver is not loaded (checked where one is installed) */
    assert_int_equal(kl_device_of(kl_to_device(a, KL_DEVICE_CPU)).type, KL_CPU);
    assert_int_equal(kl_device_of(kl_to_device(a, KL_DEVICE_META)).type, KL_META);
    assert_int_equal(kl_device_of(kl_clone(kl_to_device(a, KL_DEVICE_CPU))).type, KL_CPU);
    assert_null(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD));
    assert_null(ke_hook.autograd_free);
    assert_null(ke_hook.trace_data);
    assert_null(ke_hook.trace_backward);
    assert_null(ke_hook.handler[KE_KEY_AUTOGRAD]);
    assert_null(ke_hook.handler[KE_KEY_TRACE]);
    assert_null(ir_hook.subtrace);
    assert_null(ir_backend_for_device(KL_CPU));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "no kernel backend registered for cpu");
}

/* $KL_ANOMALY (set by main before anything ran) is read by the first
 * initialization: asking for anomaly mode initializes. */
static void anomaly_env_read_at_init(void **state) {
    (void)state;
    assert_true(kl_anomaly_enabled());
    assert_non_null(ke_hook.handler[KE_KEY_AUTOGRAD]);
    kl_set_anomaly(false);
    kl_init(); /* again: nothing re-reads the environment */
    assert_false(kl_anomaly_enabled());
}

static void *init_thread(void *u) {
    (void)u;
    kl_init();
    return NULL;
}

/* After kl_init, from several threads at once: every hook is in. */
static void hooks_installed_once(void **state) {
    (void)state;
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, init_thread, NULL), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    assert_ptr_equal(ke_hook.handler[KE_KEY_AUTOGRAD], ag_record_handler);
    assert_ptr_equal(ke_hook.handler[KE_KEY_TRACE], tr_trace_handler);
    assert_ptr_equal(ke_hook.autograd_free, ag_meta_free);
    assert_ptr_equal(ke_hook.trace_data, tr_data_hook);
    assert_ptr_equal(ke_hook.trace_backward, tr_backward_hook);
    assert_ptr_equal(ir_hook.subtrace, tr_subtrace);
    assert_ptr_equal(ke_device_ops_of(KL_CUDA), &ku_cuda_device_ops); /* registered; nothing loaded */
    assert_ptr_equal(ir_backend_by_name("interp"), &ir_interp_backend);
    assert_non_null(ir_backend_for_device(KL_CPU));
    /* and they work: a gradient, through the recording handler */
    kl_tensor *x = kl_ones(KL_SHAPE(2), KL_F32);
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    kl_tensor *y = kl_sum(kl_mul(x, x), 0, NULL, false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    KT_VALUES(kl_grad(x), 0, 2, 2);
}

int main(void) {
    setenv("KL_ANOMALY", "1", 1);
    const struct CMUnitTest tests[] = {
        KT_TEST(nothing_runs_at_load_time),
        KT_TEST(anomaly_env_read_at_init),
        KT_TEST(hooks_installed_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
