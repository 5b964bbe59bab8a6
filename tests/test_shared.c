/*
 * test_shared.c — the shared library, through the exported API only: the
 * layers are joined the same way as in the static archive (kl_init from the
 * entry points, no load-time constructors), so autograd, tracing, the
 * decomposition hook and every registered kernel backend work from a plain
 * dynamic link.
 */
#include "harness.h"

static int fused(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    /* softmax decomposes (the subtrace hook), then fuses into a row kernel */
    out[0] = kl_softmax(kl_mul_scalar(kl_exp(kl_add(in[0], in[1])), 0.5), -1);
    return out[0] ? 0 : -1;
}

static void compile_on_every_backend(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4)), kl_full(KL_SHAPE(4), 0.25, KL_F32)};
    kl_tensor *ref = NULL;
    assert_int_equal(fused(NULL, in, 2, &ref, 1), 0);
    const char *names[] = {"interp", "llvm"};
    for (int b = 0; b < 2; b++) {
        kl_compile_options o = kl_compile_options_default();
        o.backend = names[b];
        kl_fn *f = kl_compile(fused, NULL, &o);
        if (!f) { /* built without LLVM: the name is refused, clearly */
            assert_int_equal(b, 1);
            KT_EXPECT_ERROR(KL_ERR_ARG, "unknown or unavailable backend \"llvm\"");
            continue;
        }
        kl_tensor *y = NULL;
        for (int call = 0; call < 2; call++) assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.kernels, 1);
        assert_int_equal(st.cache_hits, 1);
        assert_int_equal(kl_allclose(y, ref, 1e-6, 1e-6, true), 1);
        kl_fn_release(f);
    }
}

static void autograd_through_the_hooks(void **state) {
    (void)state;
    kl_tensor *x = kl_full(KL_SHAPE(3), 2, KL_F32);
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    kl_tensor *y = kl_sum(kl_mul(x, kl_exp(x)), 0, NULL, false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    double g = (1 + 2) * exp(2.0); /* d/dx x e^x = (1 + x) e^x */
    KT_VALUES(kl_grad(x), 1e-5, g, g, g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(compile_on_every_backend),
        KT_TEST(autograd_through_the_hooks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
