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

/* Where a test's bundle goes: $KT_REPRO_DIR/<name> (kept for check_repro_replay.py), else a
 * scratch folder. */
static const char *bundle_base(const char *name) {
    static char buf[4096];
    const char *keep = getenv("KT_REPRO_DIR");
    if (!keep || !*keep) return kt_tmp_path(name);
    snprintf(buf, sizeof buf, "%s/%s", keep, name);
    return buf;
}

/* The folder named at the end of msg ("; repro bundle: DIR"). */
static void bundle_of(const char *msg, const char *debug, char *dir, size_t cap) {
    const char *at = strstr(msg, "; repro bundle: ");
    assert_non_null(at);
    snprintf(dir, cap, "%s", at + strlen("; repro bundle: "));
    assert_non_null(strstr(dir, debug));
    assert_non_null(strstr(dir, "/kiln_repro_"));
}

static void mismatch_is_minified_into_a_bundle(void **state) {
    (void)state;
    const char *debug = bundle_base("mismatch");
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
    char dir[4096];
    bundle_of(msg, debug, dir, sizeof dir);

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

/* Op nodes of a graph's text: its node lines, constants left out. */
static int op_nodes(const char *graph) {
    int n = 0;
    for (const char *l = strstr(graph, "\n  %"); l; l = strstr(l + 1, "\n  %")) {
        const char *eq = strstr(l, " = ");
        n += eq && strncmp(eq, " = scalar(", 10) != 0;
    }
    return n;
}

/* A compile that fails (KL_TEST_FAIL_LOWERING=gelu: lowering a fused group holding gelu
 * fails): without the check the call fails with the lowering's error, as before; with it
 * the same error names a bundle of the smallest subgraph whose compile still fails so. */
static void failed_compile_is_minified_into_a_bundle(void **state) {
    (void)state;
    setenv("KL_TEST_FAIL_LOWERING", "gelu", 1);
    kl_manual_seed(5);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(3, 7), KL_F32)), *y = NULL;
    kl_fn *plain = kl_compile(chain, NULL, NULL);
    assert_int_equal(kl_fn_call(plain, &x, 1, &y, 1), -1);
    assert_int_equal(kl_last_status(), KL_ERR_UNSUPPORTED);
    char plain_msg[2048];
    snprintf(plain_msg, sizeof plain_msg, "%s", kl_last_error());
    kl_clear_error();
    assert_non_null(strstr(plain_msg, "kl_compile: lowering a fused kl_gelu failed"));
    assert_null(strstr(plain_msg, "repro bundle"));
    kl_fn_release(plain);

    const char *debug = bundle_base("fail");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_fn *f = kl_compile(chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    unsetenv("KL_TEST_FAIL_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    assert_int_equal(kl_last_status(), KL_ERR_UNSUPPORTED);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", kl_last_error());
    kl_clear_error();
    print_message("%s\n", msg);
    /* the same error, word for word, with the bundle after it */
    assert_int_equal(strncmp(msg, plain_msg, strlen(plain_msg)), 0);
    char dir[4096];
    bundle_of(msg, debug, dir, sizeof dir);

    char *readme = file_text(dir, "README.txt");
    assert_non_null(readme);
    int before = 0, after = 0;
    const char *p = strstr(readme, "had ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "had %d op nodes; the smallest subgraph that still fails to compile the same way has %d",
                            &before, &after), 2);
    assert_int_equal(before, 6);
    assert_int_equal(after, 2); /* gelu and a neighbour: a lone op is not fused, so not lowered */
    assert_null(strstr(readme, "incomplete"));
    free(readme);
    char *graph = file_text(dir, "graph.txt");
    assert_non_null(graph);
    print_message("%s", graph);
    assert_int_equal(op_nodes(graph), 2);
    assert_int_equal(count(graph, "= gelu("), 1);
    free(graph);
    char *explain = file_text(dir, "explain.txt");
    assert_non_null(explain);
    assert_non_null(strstr(explain, "fails in the passes"));
    assert_non_null(strstr(explain, "lowering a fused kl_gelu failed"));
    free(explain);
    char path[4200];
    snprintf(path, sizeof path, "%s/kernel0.txt", dir); /* the one group did not lower */
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/in0.npy", dir);
    kl_tensor *in0 = kl_load_npy(path);
    assert_non_null(in0);
    assert_int_equal(kl_ndim(in0), 2);
    char *src = file_text(dir, "replay.c");
    assert_non_null(src);
    assert_non_null(strstr(src, "= kl_gelu("));
    assert_null(strstr(src, "TODO"));
    free(src);

    /* without the switch the same function compiles and passes the check */
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_fn *ok = kl_compile(chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    assert_int_equal(kl_fn_call(ok, &x, 1, &y, 1), 0);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(ok, &st), 0);
    assert_true(st.kernels >= 1);
    kl_fn_release(ok);
    kl_fn_release(f);
    kl_release(x);
}

/* gelu -> sum over the last dim (a row kernel): the smallest mismatch holds the sum, whose
 * public kl_sum is written by hand (the op table's wrap column is none): replay.c calls it by
 * name, kl_op_call("sum", ..., "dims=[-1], keepdim=true", ...). */
static int gelu_rowsum(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_sum(kl_gelu(in[0]), 1, (const int64_t[]){-1}, true);
    return out[0] ? 0 : -1;
}

static void node_without_typed_form_replays_by_name(void **state) {
    (void)state;
    const char *debug = bundle_base("rowsum");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_BREAK_LOWERING", "gelu", 1);
    kl_fn *f = kl_compile(gelu_rowsum, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_manual_seed(9);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(4, 6), KL_F32)), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    unsetenv("KL_TEST_BREAK_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", kl_last_error());
    kl_clear_error();
    print_message("%s\n", msg);
    char dir[4096];
    bundle_of(msg, debug, dir, sizeof dir);
    char *readme = file_text(dir, "README.txt");
    assert_non_null(readme);
    assert_null(strstr(readme, "incomplete"));
    assert_null(strstr(readme, "TODO"));
    free(readme);
    char *src = file_text(dir, "replay.c");
    assert_non_null(src);
    print_message("%s", src);
    assert_non_null(strstr(src, "= kl_gelu(in[0]);"));
    /* the graph's line above the call, then the call with the node's attribute text */
    assert_non_null(strstr(src, "    /* %"));
    assert_non_null(strstr(src, "= sum(%"));
    assert_non_null(strstr(src, "if (kl_op_call(\"sum\", (kl_tensor *[]){v"));
    assert_non_null(strstr(src, "}, 1, \"dims=[-1], keepdim=true\", o"));
    assert_null(strstr(src, "TODO"));
    assert_null(strstr(src, "REPLAY_INCOMPLETE"));
    free(src);
    char *explain = file_text(dir, "explain.txt");
    assert_non_null(explain);
    assert_non_null(strstr(explain, "gelu"));
    assert_non_null(strstr(explain, "sum"));
    free(explain);
    kl_fn_release(f);
    kl_release(x);
}

/* gelu -> masked_fill (an elementwise op without a typed form: kl_masked_fill is written by
 * hand), the mask made from a matmul: the minified bundle holds gelu and masked_fill. */
static int gelu_masked(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *h = kl_matmul(in[0], in[1]);
    out[0] = kl_masked_fill(kl_gelu(h), kl_gt_scalar(h, 0.1), 2.0);
    return out[0] ? 0 : -1;
}

/* Every kind of node the placeholders used to stand for: a matmul, views (transpose,
 * unsqueeze, squeeze), a creation op (full), a wrapped scalar operand of where, a reduction
 * with two outputs (max_dim), other reductions (mean, sum), to_dtype, an in-place node
 * (relu_). KL_TEST_REPRO_NO_MINIFY=1 keeps the whole graph in the bundle. */
static int mixed(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *h = kl_transpose(kl_matmul(in[0], in[1]), 0, 1);            /* [5,4] */
    kl_tensor *g = kl_gelu(kl_add(h, kl_full(KL_SHAPE(5, 1), 0.25, KL_F32)));
    kl_tensor *w = kl_where(kl_gt_scalar(g, 0.0), g, kl_wrapped_scalar(-0.5));
    kl_tensor *v = NULL, *i = NULL;
    if (kl_max_dim(w, 1, true, &v, &i)) return -1;
    kl_tensor *m = kl_sum(kl_mul(g, kl_unsqueeze(kl_mean(g, 1, (int64_t[]){1}, false), 1)), 1, (int64_t[]){0}, false);
    out[0] = kl_add(kl_squeeze(v, 1), kl_to_dtype(kl_squeeze(i, 1), KL_F32));
    out[1] = kl_relu_inplace(kl_clone(m));
    return out[0] && out[1] ? 0 : -1;
}

/* Runs fn on inputs with KL_TEST_BREAK_LOWERING=gelu and KL_COMPILE_CHECK; returns replay.c of
 * the bundle named in the error (malloc'd), its folder in dir. */
static char *broken_bundle(kl_traceable fn, const char *name, kl_tensor **in, int n_in, int n_out, char *dir,
                           size_t cap) {
    const char *debug = bundle_base(name);
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_BREAK_LOWERING", "gelu", 1);
    kl_fn *f = kl_compile(fn, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_tensor *y[4] = {NULL};
    assert_int_equal(kl_fn_call(f, in, n_in, y, n_out), -1);
    unsetenv("KL_TEST_BREAK_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", kl_last_error());
    kl_clear_error();
    print_message("%s\n", msg);
    bundle_of(msg, debug, dir, cap);
    kl_fn_release(f);
    char *src = file_text(dir, "replay.c");
    assert_non_null(src);
    assert_null(strstr(src, "TODO"));
    assert_null(strstr(src, "REPLAY_INCOMPLETE"));
    return src;
}

static void masked_fill_replays_by_name(void **state) {
    (void)state;
    kl_manual_seed(21);
    kl_tensor *in[2] = {kl_randn(KL_SHAPE(4, 6), KL_F32), kl_randn(KL_SHAPE(6, 5), KL_F32)};
    char dir[4096];
    char *src = broken_bundle(gelu_masked, "masked", in, 2, 1, dir, sizeof dir);
    assert_non_null(strstr(src, "= kl_gelu(in[0]);"));
    assert_non_null(strstr(src, "if (kl_op_call(\"masked_fill\", (kl_tensor *[]){v"));
    assert_non_null(strstr(src, ", in[1]}, 2, \"value=2\", o"));
    assert_null(strstr(src, "matmul")); /* cut: the mask is an input */
    free(src);
}

static void whole_graph_replays_by_name(void **state) {
    (void)state;
    kl_manual_seed(22);
    kl_tensor *in[2] = {kl_randn(KL_SHAPE(4, 6), KL_F32), kl_randn(KL_SHAPE(6, 5), KL_F32)};
    char dir[4096];
    setenv("KL_TEST_REPRO_NO_MINIFY", "1", 1);
    char *src = broken_bundle(mixed, "whole", in, 2, 2, dir, sizeof dir);
    unsetenv("KL_TEST_REPRO_NO_MINIFY");
    print_message("%s", src);
    static const char *const calls[] = {
        "kl_op_call(\"matmul\", (kl_tensor *[]){in[0], in[1]}, 2, \"\", o",
        "kl_op_call(\"transpose\", (kl_tensor *[]){v",
        "}, 1, \"dim0=0, dim1=1\", o",
        "kl_op_call(\"full\", NULL, 0, \"shape=[5,1], value=0.25, dtype=f32\", o",
        "kl_op_call(\"where\", (kl_tensor *[]){v",
        ", kl_wrapped_scalar(-0.5)}, 3, \"\", o",
        "kl_op_call(\"max_dim\", (kl_tensor *[]){v",
        "}, 1, \"dim=[1], keepdim=true\", o",
        "kl_op_call(\"mean\", (kl_tensor *[]){v",
        "kl_op_call(\"unsqueeze\", (kl_tensor *[]){v",
        "kl_op_call(\"squeeze\", (kl_tensor *[]){v",
        "kl_op_call(\"to_dtype\", (kl_tensor *[]){v",
        "}, 1, \"dtype=f32\", o",
        "kl_op_call(\"clone\", (kl_tensor *[]){v",
        "= kl_relu_inplace(v",
        "= kl_gelu(v",
    };
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++)
        if (!strstr(src, calls[k])) fail_msg("replay.c lacks %s", calls[k]);
    /* two outputs of one call */
    const char *md = strstr(src, "kl_op_call(\"max_dim\"");
    assert_non_null(md);
    int o = -1;
    assert_int_equal(sscanf(strstr(md, "keepdim=true\", o") + strlen("keepdim=true\", o"), "%d", &o), 1);
    char want[64];
    snprintf(want, sizeof want, " = o%d[1];", o);
    assert_non_null(strstr(md, want));
    char *readme = file_text(dir, "README.txt");
    assert_non_null(readme);
    int before = 0, after = 0;
    const char *p = strstr(readme, "had ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "had %d op nodes; the smallest subgraph that still differs has %d", &before, &after), 2);
    assert_int_equal(before, after); /* not minified */
    free(readme);
    free(src);
}

/* x*3 + 1 -> sin: the forward has no cos; its backward, g*cos(x*3 + 1)*3 (the elementwise
 * chain recomputed there), does. Compiled in grad mode: a forward graph and a backward graph. */
static int sin_chain(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_sin(kl_add_scalar(kl_mul_scalar(in[0], 3.0), 1.0));
    return out[0] ? 0 : -1;
}

static kl_tensor *grad_leaf(int64_t rows, int64_t cols, uint64_t seed) {
    kl_manual_seed(seed);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(rows, cols), KL_F32));
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    return x;
}

/* The bundle named in the error pending: README's counts (before > after >= 1), graph.txt
 * holding op; returns the error's text in msg. */
static void check_aot_bundle(const char *debug, const char *op, char *msg, size_t cap, char *dir, size_t dir_cap) {
    snprintf(msg, cap, "%s", kl_last_error());
    kl_clear_error();
    print_message("%s\n", msg);
    bundle_of(msg, debug, dir, dir_cap);
    char *readme = file_text(dir, "README.txt");
    assert_non_null(readme);
    int before = 0, after = 0;
    const char *p = strstr(readme, "had ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "had %d op nodes", &before), 1);
    const char *h = strstr(p, " has ");
    assert_non_null(h);
    assert_int_equal(sscanf(h, " has %d", &after), 1);
    assert_true(after >= 1 && after < before);
    free(readme);
    char *graph = file_text(dir, "graph.txt");
    assert_non_null(graph);
    char needle[64];
    snprintf(needle, sizeof needle, "= %s(", op);
    assert_int_equal(count(graph, needle), 1);
    assert_int_equal(op_nodes(graph), after);
    free(graph);
    char *src = file_text(dir, "replay.c");
    assert_non_null(src);
    assert_null(strstr(src, "TODO"));
    free(src);
}

/* A broken rule only the backward graph uses: the forward passes the check, the backward's
 * gradients differ from its graph run op by op, and kl_backward's error names a bundle of
 * the backward graph minified as a function of its inputs. */
static void aot_backward_mismatch_is_minified(void **state) {
    (void)state;
    const char *debug = bundle_base("aot_bw");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_BREAK_LOWERING", "cos", 1);
    kl_fn *f = kl_compile(sin_chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_tensor *x = grad_leaf(4, 5, 11), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.aot_calls, 1);
    assert_int_equal(kl_backward(kl_sum(y, 0, NULL, false), NULL, NULL), -1);
    unsetenv("KL_TEST_BREAK_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    assert_int_equal(kl_last_status(), KL_ERR_STATE);
    char msg[2048], dir[4096];
    check_aot_bundle(debug, "cos", msg, sizeof msg, dir, sizeof dir);
    assert_non_null(strstr(msg, "KL_COMPILE_CHECK: fn: compiled backward's output 1 differs from eager"));
    kl_fn_release(f);
    kl_release(x);
}

/* A broken rule of the forward graph: the call's check finds it and minifies the forward graph. */
static void aot_forward_mismatch_is_minified(void **state) {
    (void)state;
    const char *debug = bundle_base("aot_fw");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_BREAK_LOWERING", "sin", 1);
    kl_fn *f = kl_compile(sin_chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_tensor *x = grad_leaf(4, 5, 12), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    unsetenv("KL_TEST_BREAK_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    assert_int_equal(kl_last_status(), KL_ERR_STATE);
    char msg[2048], dir[4096];
    check_aot_bundle(debug, "sin", msg, sizeof msg, dir, sizeof dir);
    assert_non_null(strstr(msg, "KL_COMPILE_CHECK: fn: compiled output 1 differs from eager"));
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.aot_calls, 1);
    kl_fn_release(f);
    kl_release(x);
}

/* The backward graph's compile fails: the call fails as without the check, naming a bundle of
 * the backward graph whose inputs come from the forward run op by op. */
static void aot_failed_backward_compile_is_minified(void **state) {
    (void)state;
    const char *debug = bundle_base("aot_fail");
    setenv("KL_DEBUG_DIR", debug, 1);
    setenv("KL_COMPILE_CHECK", "1", 1);
    setenv("KL_TEST_FAIL_LOWERING", "cos", 1);
    kl_fn *f = kl_compile(sin_chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    kl_tensor *x = grad_leaf(3, 4, 13), *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), -1);
    unsetenv("KL_TEST_FAIL_LOWERING");
    unsetenv("KL_DEBUG_DIR");
    assert_int_equal(kl_last_status(), KL_ERR_UNSUPPORTED);
    char msg[2048], dir[4096];
    check_aot_bundle(debug, "cos", msg, sizeof msg, dir, sizeof dir);
    assert_non_null(strstr(msg, "kl_compile: lowering a fused kl_cos failed"));
    char *explain = file_text(dir, "explain.txt");
    assert_non_null(explain);
    assert_non_null(strstr(explain, "lowering a fused kl_cos failed"));
    free(explain);
    /* without the switch: compiled forward and backward, and the check passes on both */
    setenv("KL_COMPILE_CHECK", "1", 1);
    kl_fn *ok = kl_compile(sin_chain, NULL, NULL);
    unsetenv("KL_COMPILE_CHECK");
    assert_int_equal(kl_fn_call(ok, &x, 1, &y, 1), 0);
    assert_int_equal(kl_backward(kl_sum(y, 0, NULL, false), NULL, NULL), 0);
    kl_tensor *want = kl_mul_scalar(kl_cos(kl_add_scalar(kl_mul_scalar(kl_detach(x), 3.0), 1.0)), 3.0);
    assert_int_equal(kl_allclose(kl_grad(x), want, 1e-5, 1e-6, false), 1);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(ok, &st), 0);
    assert_int_equal(st.aot_calls, 1);
    assert_int_equal(st.backward_calls, 1);
    kl_fn_release(ok);
    kl_fn_release(f);
    kl_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(mismatch_is_minified_into_a_bundle),
        KT_TEST(failed_compile_is_minified_into_a_bundle),
        KT_TEST(node_without_typed_form_replays_by_name),
        KT_TEST(masked_fill_replays_by_name),
        KT_TEST(whole_graph_replays_by_name),
        KT_TEST(aot_backward_mismatch_is_minified),
        KT_TEST(aot_forward_mismatch_is_minified),
        KT_TEST(aot_failed_backward_compile_is_minified),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
