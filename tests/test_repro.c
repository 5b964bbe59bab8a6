/*
 * test_repro.c — KL_COMPILE_CHECK's minifier and repro bundles (src/trace/repro.c).
 *
 * KL_TEST_BREAK_LOWERING=gelu makes the lowering of gelu wrong (a test-only
 * switch in src/ir/lower.c), so a compiled function with gelu among other
 * ops differs from eager. The check must then shrink the graph to a smaller
 * subgraph that still differs and write its bundle: graph IR, kernel IR,
 * LLVM IR (LLVM builds), the inputs as .npy, replay.c and a README, named in
 * the error. tests/check_repro_replay.py runs this suite with KT_REPRO_DIR
 * set (the bundle is kept there), builds replay.c against an installed
 * library with pkg-config and checks that it reproduces the mismatch.
 */
#include "harness.h"

/* x*2 + 1 -> gelu -> exp - x -> squared: six op nodes, one broken. */
static int chain(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *a = kl_add_scalar(kl_mul_scalar(x, 2.0), 1.0);
    kl_tensor *g = kl_gelu(a);
    kl_tensor *z = kl_sub(kl_exp(g), x);
    out[0] = kl_mul(z, z);
    return out[0] ? 0 : -1;
}

static char *file_text(const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return kt_read_text(path);
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s++) n++;
    return n;
}

static void mismatch_is_minified_into_a_bundle(void **state) {
    (void)state;
    const char *keep = getenv("KT_REPRO_DIR");
    const char *debug = keep && *keep ? keep : kt_tmp_path("debug");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_BREAK_LOWERING", "gelu", 1);
    kl_fn *f = kl_compile(chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_manual_seed(3);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(4, 5), KL_F32)), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    unsetenv("KL_TEST_BREAK_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", kl_last_error());
    assert_int_equal(kl_last_status(), KL_ERR_STATE);
    kl_clear_error();
    print_message("%s\n", msg);
    assert_non_null(strstr(msg, "KL_COMPILE_CHECK: fn: compiled output 1 differs from eager"));
    const char *at = strstr(msg, "; repro bundle: ");
    assert_non_null(at);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", at + strlen("; repro bundle: "));
    assert_non_null(strstr(dir, debug));
    assert_non_null(strstr(dir, "/kiln_repro_"));

    /* smaller than it started: gelu alone still differs */
    char *readme = file_text(dir, "README.txt");
    assert_non_null(readme);
    int before = 0, after = 0;
    const char *p = strstr(readme, "had ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "had %d op nodes; the smallest subgraph that still differs has %d", &before, &after), 2);
    assert_int_equal(before, 6);
    /* a lone op is not fused (it runs as an eager op): gelu and a neighbour */
    assert_true(after >= 1 && after < before);
    assert_int_equal(after, 2);
    free(readme);

    char *graph = file_text(dir, "graph.txt");
    assert_non_null(graph);
    assert_int_equal(count(graph, "= gelu("), 1);
    assert_int_equal(count(graph, "= add("), 1);
    assert_int_equal(count(graph, "exp"), 0);
    free(graph);
    char *explain = file_text(dir, "explain.txt");
    assert_non_null(explain);
    assert_non_null(strstr(explain, "kernel 0 = add, gelu"));
    free(explain);
    char *kernel = file_text(dir, "kernel0.txt");
    assert_non_null(kernel);
    assert_non_null(strstr(kernel, "kernel 0 = add, gelu"));
    assert_non_null(strstr(kernel, " = neg(")); /* the broken rule, as lowered */
    assert_null(strstr(kernel, "gelu("));
    free(kernel);
#ifdef KL_HAVE_LLVM
    char *ll = file_text(dir, "kernel0.ll");
    assert_non_null(ll);
    assert_non_null(strstr(ll, "define"));
    free(ll);
#endif
    /* the input, as the eager run of the whole graph made it: x*2 (add and gelu are left) */
    char path[4200];
    snprintf(path, sizeof path, "%s/in0.npy", dir);
    kl_tensor *in0 = kl_load_npy(path);
    assert_non_null(in0);
    assert_int_equal(kl_allclose(in0, kl_mul_scalar(x, 2.0), 0, 0, false), 1);
    char *src = file_text(dir, "replay.c");
    assert_non_null(src);
    assert_non_null(strstr(src, "= kl_add_scalar(in[0], 1);"));
    assert_non_null(strstr(src, "= kl_gelu(v"));
    free(src);

    /* the same function without the broken rule passes the check */
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_fn *ok = kl_compile(chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    assert_int_equal(kl_fn_call(ok, &x, 1, &y, 1), 0);
    kl_fn_release(ok);
    kl_fn_release(f);
    kl_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(mismatch_is_minified_into_a_bundle),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
