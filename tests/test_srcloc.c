/*
 * test_srcloc.c — source locations (-DKL_TRACK_SOURCE, kiln.h "Source
 * locations"): this file is compiled with the define, srcloc_off.c without.
 * The caller's lines must reach the IR text, kl_fn_explain's kernels, error
 * messages (nested calls name the innermost line), autograd anomaly reports
 * and the profiler's op events; untracked calls carry none, and nothing is
 * left behind once a tracked call returns.
 */
#ifndef KL_TRACK_SOURCE
#error "test_srcloc.c is the tracked half: compile it with -DKL_TRACK_SOURCE"
#endif
#include "harness.h"

#ifndef kl_add
#error "KL_TRACK_SOURCE did not define the op macros"
#endif

void kt_untracked_error(char *buf, size_t cap);
kl_tensor *kt_untracked_neg(kl_tensor *x);

static int add_line, gelu_line, mul_line;

/* gelu(x + x) * 2, each op on its own line: add and gelu fuse into one kernel. */
static int fused(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    add_line = __LINE__ + 1;
    kl_tensor *s = kl_add(in[0], in[0]);
    gelu_line = __LINE__ + 1;
    kl_tensor *g = kl_gelu(s);
    mul_line = __LINE__ + 1;
    out[0] = kl_mul_scalar(g, 2.0);
    return out[0] ? 0 : -1;
}

static char *explain_text(kl_fn *f) {
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    assert_non_null(o);
    assert_int_equal(kl_fn_explain(f, o), 0);
    fclose(o);
    return buf;
}

static void explain_names_the_lines(void **state) {
    (void)state;
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(4, 8), KL_F32));
    kl_fn *f = kl_compile(fused, NULL, NULL);
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    char *text = explain_text(f), want[256];
    snprintf(want, sizeof want, "test_srcloc.c:%d add, :%d gelu, :%d mul", add_line, gelu_line, mul_line);
    if (!strstr(text, want)) print_error("no \"%s\" in:\n%s\n", want, text);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "kernel 0 = "));
    free(text);
    kl_fn_release(f);
    kl_release(x);
}

static void ir_text_carries_the_lines(void **state) {
    (void)state;
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(3), KL_F32));
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(fused, NULL, &o);
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    char text[4096], want[3][128];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    snprintf(want[0], sizeof want[0], "= add(%%0, %%0)  @ ");
    snprintf(want[1], sizeof want[1], "test_srcloc.c:%d\n", gelu_line);
    snprintf(want[2], sizeof want[2], "test_srcloc.c:%d\n", mul_line);
    for (int i = 0; i < 3; i++) {
        if (!strstr(text, want[i])) print_error("no \"%s\" in:\n%s\n", want[i], text);
        assert_non_null(strstr(text, want[i]));
    }
    kl_fn_release(f);
    kl_release(x);
}

static void errors_name_the_line(void **state) {
    (void)state;
    kl_tensor *a = kl_zeros(KL_SHAPE(2), KL_F32), *b = kl_zeros(KL_SHAPE(3), KL_F32);
    char want[128];
    int line = __LINE__ + 1;
    assert_null(kl_add(a, b));
    snprintf(want, sizeof want, "test_srcloc.c:%d", line);
    const char *msg = kl_last_error();
    assert_non_null(strstr(msg, "kl_add: "));
    /* the location closes the message */
    size_t n = strlen(msg), w = strlen(want);
    assert_true(n > w && !strcmp(msg + n - w, want));
    assert_non_null(strstr(msg, " at "));
    kl_clear_error();

    /* nested calls: the failing inner one's line, and the outer one's afterwards */
    int outer = __LINE__ + 1;
    kl_tensor *r = kl_sum(
        kl_mul(a, b), KL_ALL_DIMS, false);
    assert_null(r);
    snprintf(want, sizeof want, "kl_mul: ");
    assert_non_null(strstr(kl_last_error(), want));
    snprintf(want, sizeof want, "test_srcloc.c:%d", outer + 1);
    assert_non_null(strstr(kl_last_error(), want));
    kl_clear_error();

    /* an untracked file's call, right after tracked ones: no location */
    char buf[1024];
    kt_untracked_error(buf, sizeof buf);
    assert_non_null(strstr(buf, "kl_add: "));
    assert_null(strstr(buf, "test_srcloc.c"));
    assert_null(strstr(buf, " at "));
}

static void anomaly_names_the_forward_line(void **state) {
    (void)state;
    kl_set_anomaly(true);
    kl_tensor *x = kl_zeros(KL_SHAPE(3), KL_F32);
    kl_set_requires_grad(x, true);
    int fwd = __LINE__ + 1;
    kl_tensor *y = kl_sqrt(x); /* d sqrt(x) at 0 is inf */
    kl_tensor *loss = kl_sum(y, KL_ALL_DIMS, false);
    int bwd = __LINE__ + 1;
    assert_int_equal(kl_backward(loss, NULL, NULL), -1);
    char want[128];
    snprintf(want, sizeof want, "anomaly: the backward of kl_sqrt (forward op #");
    assert_non_null(strstr(kl_last_error(), want));
    snprintf(want, sizeof want, "called at ");
    assert_non_null(strstr(kl_last_error(), want));
    snprintf(want, sizeof want, "test_srcloc.c:%d)", fwd);
    if (!strstr(kl_last_error(), want)) print_error("no \"%s\" in %s\n", want, kl_last_error());
    assert_non_null(strstr(kl_last_error(), want));
    snprintf(want, sizeof want, "test_srcloc.c:%d", bwd); /* where backward was called: the message's end */
    assert_non_null(strstr(kl_last_error(), want));
    kl_clear_error();
    kl_set_anomaly(false);
}

static void profiler_events_hold_the_line(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(4), KL_F32);
    assert_int_equal(kl_profiler_start(NULL), 0);
    int line = __LINE__ + 1;
    kl_tensor *y = kl_exp(x);
    kl_tensor *z = kt_untracked_neg(y);
    const char *path = kt_tmp_path("srcloc_trace.json");
    assert_int_equal(kl_profiler_stop(path), 0);
    assert_non_null(z);
    char *text = kt_read_text(path), want[160];
    assert_non_null(text);
    /* the exp event holds this line; the untracked neg's holds none */
    char *ev = strstr(text, "\"name\": \"exp\"");
    assert_non_null(ev);
    char *end = strchr(ev, '\n');
    snprintf(want, sizeof want, "test_srcloc.c:%d\"", line);
    assert_non_null(strstr(ev, "\"loc\": \""));
    assert_true(strstr(ev, want) && strstr(ev, want) < end);
    ev = strstr(text, "\"name\": \"neg\"");
    assert_non_null(ev);
    end = strchr(ev, '\n');
    assert_true(!strstr(ev, "\"loc\"") || strstr(ev, "\"loc\"") > end);
    free(text);
}

/* Composites and nn helpers: the ops they run inside report the caller's line. */
static void composite_pieces_report_the_caller(void **state) {
    (void)state;
    kl_tensor *x = kl_ones(KL_SHAPE(2, 3), KL_F32), *w = kl_ones(KL_SHAPE(4, 3), KL_F32), *b = kl_ones(KL_SHAPE(5), KL_F32);
    int line = __LINE__ + 1;
    assert_null(kl_linear(x, w, b)); /* the bias does not broadcast: the failing piece is inside kl_linear */
    char want[128];
    snprintf(want, sizeof want, "test_srcloc.c:%d", line);
    if (!strstr(kl_last_error(), want)) print_error("no \"%s\" in %s\n", want, kl_last_error());
    assert_non_null(strstr(kl_last_error(), want));
    kl_clear_error();
    /* int-returning ops are tracked too */
    kl_tensor *parts[2];
    line = __LINE__ + 1;
    assert_int_equal(kl_split(x, 2, 5, parts, 2), -1);
    snprintf(want, sizeof want, "test_srcloc.c:%d", line);
    assert_non_null(strstr(kl_last_error(), want));
    kl_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(explain_names_the_lines),
        KT_TEST(ir_text_carries_the_lines),
        KT_TEST(errors_name_the_line),
        KT_TEST(anomaly_names_the_forward_line),
        KT_TEST(profiler_events_hold_the_line),
        KT_TEST(composite_pieces_report_the_caller),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
