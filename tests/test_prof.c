/*
 * test_prof.c — seeing inside: KL_LOG categories and levels through a log
 * callback, and the profiler (Chrome trace contents checked by
 * tests/check_prof_trace.py, the ring buffer's cap, the summary table,
 * events from several threads).
 */
#include "harness.h"

#include <pthread.h>

/* ---- a log callback that keeps every line ----------------------------------------------- */

typedef struct log_lines {
    char text[1 << 16];
    size_t used;
    int n;
} log_lines;

static void collect(void *user, const char *category, kl_log_level level, const char *message) {
    log_lines *l = user;
    const char *lv = level == KL_LOG_DEBUG ? "debug" : level == KL_LOG_INFO ? "info" : "warn";
    int w = snprintf(l->text + l->used, sizeof l->text - l->used, "<%s:%s> %s\n", category, lv, message);
    if (w > 0) l->used += (size_t)w;
    if (l->used >= sizeof l->text) l->used = sizeof l->text - 1;
    l->n++;
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s++) n++;
    return n;
}

/* gelu(x + x): one kernel. */
static int gelu2(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_gelu(kl_add(in[0], in[0]));
    return out[0] ? 0 : -1;
}

/* Reads a value while tracing: a trace break, so the signature runs eagerly. */
static int reads_item(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    double s = kl_item(kl_sum(in[0], 0, NULL, false));
    out[0] = kl_mul_scalar(in[0], s);
    return out[0] ? 0 : -1;
}

static void call1(kl_fn *f, kl_tensor *x) {
    kl_tensor *y = NULL;
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    kl_release(y);
}

static void log_categories_reach_the_callback(void **state) {
    (void)state;
    static log_lines l;
    memset(&l, 0, sizeof l);
    kl_set_log_callback(collect, &l);
    assert_int_equal(kl_set_log("guards,graph,fusion,recompile,fallback,+cache,trace"), 0);
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.name = "gelu2";
    kl_fn *f = kl_compile(gelu2, NULL, &o);
    o.name = "reads_item";
    kl_fn *g = kl_compile(reads_item, NULL, &o);
    kl_tensor *a = kl_ones(KL_SHAPE(4), KL_F32), *b = kl_ones(KL_SHAPE(2, 3), KL_F32);
    call1(f, a);
    call1(f, a); /* a guard-cache hit */
    call1(f, b); /* recompiles */
    call1(g, a); /* falls back */
    kl_fn_release(f);
    kl_fn_release(g);
    kl_set_log_callback(NULL, NULL);
    const char *t = l.text;
    assert_int_equal(count(t, "<guards:info> gelu2: entry 0 guards:\ngrad mode on\ninput 1: f32[4], contiguous, cpu\n"), 1);
    assert_int_equal(count(t, "<guards:info> gelu2: entry 1 guards:\ngrad mode on\ninput 1: f32[2,3], contiguous, cpu"), 1);
    assert_int_equal(count(t, "<trace:info> gelu2: traced entry 0 (first call): 2 nodes in "), 1);
    assert_int_equal(count(t, "<graph:info> gelu2: entry 0 after the passes (first call):\n"), 1);
    assert_non_null(strstr(t, "= kernel("));
    assert_int_equal(count(t, "<cache:debug> gelu2: guard cache hit, entry 0"), 1);
    assert_int_equal(count(t, "<recompile:info> gelu2: retracing: input 1 changed from [4] float32 to [2,3] float32 cpu"), 1);
    assert_int_equal(count(t, "<fallback:info> reads_item: entry 0 runs eagerly: trace break: "), 1);
    assert_int_equal(count(t, "<fusion:info> gelu2: kernel 0 = add, gelu"), 2);
    assert_int_equal(count(t, "<dispatch:"), 0); /* not asked for */
    assert_int_equal(count(t, "as traced"), 0); /* the traced graph is trace's debug level */

    /* levels: "+all,-dispatch" logs debug lines everywhere but dispatch */
    memset(&l, 0, sizeof l);
    kl_set_log_callback(collect, &l);
    assert_int_equal(kl_set_log("+all,-dispatch"), 0);
    f = kl_compile(gelu2, NULL, &o);
    call1(f, a);
    kl_release(kl_add(a, a));
    kl_fn_release(f);
    assert_int_equal(count(l.text, "<trace:debug> reads_item: as traced:\n"), 1);
    assert_int_equal(count(l.text, "<graph:debug> after fuse:\n"), 1);
    assert_int_equal(count(l.text, "<trace:info> reads_item: as traced"), 0);
    assert_int_equal(count(l.text, "<dispatch:"), 0);
    /* dispatch: one line per eager op, with its inputs and result */
    assert_int_equal(kl_set_log("dispatch"), 0);
    memset(&l, 0, sizeof l);
    kl_release(kl_add(a, a));
    kl_release(kl_mul_scalar(b, 2.5));
    assert_string_equal(l.text, "<dispatch:info> add(f32[4], f32[4]) -> f32[4] on cpu\n"
                                "<dispatch:info> mul(f32[2,3], f64(scalar)) -> f32[2,3] on cpu\n");
    /* a bad spec changes nothing and names the category */
    assert_int_equal(kl_set_log("fusion,bogus"), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown category \"bogus\"");
    memset(&l, 0, sizeof l);
    kl_release(kl_add(a, a));
    assert_int_equal(l.n, 1);
    /* the default: warnings only, so a recompile-limit warning still comes through */
    assert_int_equal(kl_set_log(NULL), 0);
    memset(&l, 0, sizeof l);
    o.recompile_limit = 1;
    o.name = "limited";
    f = kl_compile(gelu2, NULL, &o);
    call1(f, a);
    call1(f, b);
    call1(f, b);
    kl_fn_release(f);
    kl_set_log_callback(NULL, NULL);
    assert_int_equal(l.n, 1);
    assert_non_null(strstr(l.text, "<recompile:warn> limited: recompile limit (1) reached (input 1 changed"));
    kl_release(a);
    kl_release(b);
}

/* ---- the profiler ----------------------------------------------------------------------- */

static void check_trace(const char *path, const char *scenario, const char *extra) {
    char cmd[1400];
    const char *py = getenv("KT_PYTHON"), *dir = getenv("KT_TESTS_DIR");
    assert_non_null(py);
    assert_non_null(dir);
    snprintf(cmd, sizeof cmd, "%s %s/check_prof_trace.py %s %s %s", py, dir, path, scenario, extra ? extra : "");
    assert_int_equal(system(cmd), 0);
}

static void profiler_states(void **state) {
    (void)state;
    assert_int_equal(kl_profiler_stop(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "not recording");
    assert_int_equal(kl_profiler_start(&(kl_profiler_options){.max_events = -1}), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "max_events");
    assert_int_equal(kl_profiler_start(NULL), 0);
    assert_int_equal(kl_profiler_start(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_STATE, "already recording");
    assert_int_equal(kl_profiler_stop("/nonexistent-dir/trace.json"), -1);
    KT_EXPECT_ERROR(KL_ERR_IO, "/nonexistent-dir/trace.json");
    assert_int_equal(kl_profiler_summary(NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "stream");
}

static void eager_ops_in_the_trace(void **state) {
    (void)state;
    kl_tensor *a = kl_ones(KL_SHAPE(2, 3), KL_F32), *w = kl_ones(KL_SHAPE(3, 4), KL_F32);
    kl_tensor *dummy = kl_add(a, a); /* before start: not recorded */
    assert_int_equal(kl_profiler_start(NULL), 0);
    kl_tensor *b = kl_add(a, a);
    kl_tensor *c = kl_add(b, a);
    kl_tensor *m = kl_matmul(c, w);
    kl_mul_scalar_inplace(b, 2.5);
    const char *path = kt_tmp_path("eager.json");
    assert_int_equal(kl_profiler_stop(path), 0);
    kl_release(kl_add(a, a)); /* after stop: not recorded */
    check_trace(path, "eager", NULL);
    kl_release(dummy), kl_release(a), kl_release(w), kl_release(b), kl_release(c), kl_release(m);
}

/* matmul -> add bias -> gelu -> matmul: two library calls and one kernel. */
static int mlp(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_matmul(kl_gelu(kl_add(kl_matmul(in[0], in[1]), in[2])), in[3]);
    return out[0] ? 0 : -1;
}

static void compiled_calls_in_the_trace(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.name = "mlp";
    kl_fn *f = kl_compile(mlp, NULL, &o);
    o.name = "brk";
    kl_fn *g = kl_compile(reads_item, NULL, &o);
    kl_tensor *x = kl_ones(KL_SHAPE(4, 8), KL_F32), *x5 = kl_ones(KL_SHAPE(5, 8), KL_F32);
    kl_tensor *w1 = kl_ones(KL_SHAPE(8, 16), KL_F32), *b = kl_ones(KL_SHAPE(16), KL_F32);
    kl_tensor *w2 = kl_ones(KL_SHAPE(16, 4), KL_F32);
    assert_int_equal(kl_profiler_start(NULL), 0);
    kl_tensor *y = NULL;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kl_fn_call(f, (kl_tensor *[]){i < 2 ? x : x5, w1, b, w2}, 4, &y, 1), 0);
        kl_release(y);
    }
    call1(g, x);
    const char *path = kt_tmp_path("compiled.json");
    assert_int_equal(kl_profiler_stop(path), 0);
    check_trace(path, "compiled", NULL);
    kl_fn_release(f);
    kl_fn_release(g);
    kl_release(x), kl_release(x5), kl_release(w1), kl_release(b), kl_release(w2);
}

static void ring_keeps_the_newest(void **state) {
    (void)state;
    kl_tensor *a = kl_ones(KL_SHAPE(7), KL_F32);
    assert_int_equal(kl_profiler_start(&(kl_profiler_options){.max_events = 16}), 0);
    for (int i = 0; i < 100; i++) kl_release(kl_add(a, a));
    const char *path = kt_tmp_path("cap.json");
    assert_int_equal(kl_profiler_stop(path), 0);
    check_trace(path, "cap", "16");
    char *text = NULL;
    size_t n = 0;
    FILE *s = open_memstream(&text, &n);
    assert_int_equal(kl_profiler_summary(s), 0);
    fclose(s);
    assert_non_null(strstr(text, "kiln profiler: 16 events over "));
    assert_non_null(strstr(text, " (84 dropped; ring of 16)\n"));
    free(text);
    kl_release(a);
}

/* The summary: one row per (name, category), sorted by total time, with
 * calls, bytes and self time (a compiled call's self time excludes its
 * kernels and library calls). */
static double parse_time(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (!strncmp(end, "ms", 2)) return v * 1e6;
    if (!strncmp(end, "us", 2)) return v * 1e3;
    if (!strncmp(end, "s", 1)) return v * 1e9;
    fail_msg("bad time %s", s);
    return 0;
}

static void summary_table(void **state) {
    (void)state;
    kl_tensor *a = kl_ones(KL_SHAPE(256, 256), KL_F32);
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.name = "gelu2";
    kl_fn *f = kl_compile(gelu2, NULL, &o);
    call1(f, a); /* traced and compiled before the session */
    assert_int_equal(kl_profiler_start(NULL), 0);
    for (int i = 0; i < 3; i++) kl_release(kl_add(a, a));
    for (int i = 0; i < 2; i++) kl_release(kl_exp(a));
    for (int i = 0; i < 4; i++) call1(f, a);
    assert_int_equal(kl_profiler_stop(NULL), 0);
    char *text = NULL;
    size_t n = 0;
    FILE *s = open_memstream(&text, &n);
    assert_int_equal(kl_profiler_summary(s), 0);
    fclose(s);
    /* header, rule, column names, rule, rows, rule, total */
    char *lines[32];
    int nl = 0;
    for (char *p = strtok(text, "\n"); p && nl < 32; p = strtok(NULL, "\n")) lines[nl++] = p;
    assert_int_equal(nl, 4 + 5 + 2);
    assert_non_null(strstr(lines[0], "kiln profiler: 17 events over "));
    assert_non_null(strstr(lines[2], "Name"));
    assert_non_null(strstr(lines[2], "Self time"));
    assert_non_null(strstr(lines[2], "Total time"));
    assert_non_null(strstr(lines[2], "Calls"));
    assert_non_null(strstr(lines[nl - 1], "Self time total: "));
    double prev = 1e300;
    int seen = 0;
    for (int r = 4; r < 4 + 5; r++) {
        char name[64], cat[32], selfp[16], self[32], totp[16], tot[32], avg[32];
        long long calls, bytes;
        assert_true(strlen(lines[r]) > 37);
        memcpy(name, lines[r], 36); /* the name column is 36 wide and may hold spaces */
        name[36] = 0;
        for (int e = 35; e >= 0 && name[e] == ' '; e--) name[e] = 0;
        assert_int_equal(sscanf(lines[r] + 37, "%31s %15s %31s %15s %31s %31s %lld %lld", cat, selfp, self, totp,
                                tot, avg, &calls, &bytes), 8);
        double t = parse_time(tot);
        assert_true(t <= prev); /* sorted by total time */
        prev = t;
        assert_true(parse_time(self) <= t + 1);
        if (!strcmp(name, "add")) seen |= 1, assert_int_equal(calls, 3), assert_string_equal(cat, "op"),
                                      assert_int_equal(bytes, 3 * 256 * 256 * 4);
        if (!strcmp(name, "exp")) seen |= 2, assert_int_equal(calls, 2), assert_int_equal(bytes, 2 * 256 * 256 * 4);
        if (!strcmp(name, "gelu2")) {
            seen |= 4;
            assert_string_equal(cat, "compiled_call");
            assert_int_equal(calls, 4);
            assert_true(parse_time(self) < t); /* the kernel is its child */
        }
        if (!strcmp(name, "kernel 0")) seen |= 8, assert_string_equal(cat, "kernel"), assert_int_equal(calls, 4),
                                         assert_int_equal(bytes, 4 * 256 * 256 * 4);
        if (!strcmp(name, "cache hit")) seen |= 16, assert_int_equal(calls, 4), assert_string_equal(cat, "cache");
    }
    assert_int_equal(seen, 31);
    free(text);
    kl_fn_release(f);
    kl_release(a);
}

static void *adder(void *p) {
    kl_tensor *a = p;
    for (int i = 0; i < 200; i++) kl_release(kl_add(a, a));
    return NULL;
}

static void events_from_several_threads(void **state) {
    (void)state;
    kl_tensor *a = kl_retain(kl_ones(KL_SHAPE(3), KL_F32));
    assert_int_equal(kl_profiler_start(NULL), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, adder, a), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    const char *path = kt_tmp_path("threads.json");
    assert_int_equal(kl_profiler_stop(path), 0);
    char *json = kt_read_text(path);
    assert_non_null(json);
    assert_int_equal(count(json, "\"name\": \"add\", \"cat\": \"op\""), 800);
    assert_int_equal(count(json, "\"name\": \"thread_name\""), 4);
    free(json);
    kl_release(a);
    kl_release(a);
}

/* ---- kl_fn_explain ------------------------------------------------------------------------ */

/* h = gelu(x @ w + b); returns h * sum(h over the batch) and h's row max:
 * a library call, a kernel, a reduction over the first axis (no row
 * kernel) and a row kernel. */
static int small_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *h = kl_gelu(kl_add(kl_matmul(in[0], in[1]), in[2]));
    out[0] = kl_mul(h, kl_sum(h, KL_DIMS(0), true));
    out[1] = kl_amax(kl_exp(h), KL_DIMS(-1), true);
    return out[0] && out[1] ? 0 : -1;
}

/* "1.234 ms" -> "# ms": timings change from run to run. */
static void mask_ms(char *t) {
    char *w = t;
    for (char *r = t; *r;) {
        char *e = r;
        while ((*e >= '0' && *e <= '9') || *e == '.') e++;
        if (e > r && !strncmp(e, " ms", 3) && (r == t || r[-1] == ' ')) {
            *w++ = '#';
            r = e;
        } else {
            *w++ = *r++;
        }
    }
    *w = 0;
}

static const char explain_golden[] =
    "small: mode fuse, 2 cache entries (limit 8); 3 calls, 1 cache hits, 0 eager calls\n"
    "\n"
    "entry 0 (first call)\n"
    "  guards:\n"
    "    grad mode on\n"
    "    input 1: f32[4,8], contiguous, cpu\n"
    "    input 2: f32[8,16], contiguous, cpu\n"
    "    input 3: f32[16], contiguous, cpu\n"
    "  compile time: trace # ms, passes # ms, codegen # ms (LLVM # ms)\n"
    "  graph after the passes:\n"
    "    graph(%0: f32[4,8], %1: f32[8,16], %2: f32[16]) {\n"
    "      %3: f32[4,16] = matmul(%0, %1)\n"
    "      %4: f32[4,16] = kernel(%3, %2, id=0)\n"
    "      %5: f32[1,16] = sum(%4, dims=[0], keepdim=true)\n"
    "      %6: f32[4,16] = mul(%4, %5)\n"
    "      %7: f32[4,1] = kernel(%4, id=1)\n"
    "      return (%6, %7)\n"
    "    }\n"
    "  kernels:\n"
    "    kernel 0 = add, gelu (domain [4,16], 2 inputs, 1 outputs, llvm)\n"
    "    kernel 1 = exp, amax (row kernel over [4,16], 1 inputs, 1 outputs, llvm)\n"
    "  not fused:\n"
    "    matmul[4,16]: a library call\n"
    "    sum[1,16]: reduction over another axis than the last, or not keepdim: not a row kernel\n"
    "    mul[4,16]: starts a kernel of its own, not joining the group it reads: sum reads the group's gelu before it\n"
    "    exp[4,16]: starts a kernel of its own, not joining the group it reads: sum reads the group's gelu before it\n"
    "  memory plan: peak 576 bytes of intermediates alive at once; 1 slots, 256 bytes for 256 bytes of kernel outputs\n"
    "  launches per call: 5\n"
    "\n"
    "entry 1 (input 1 changed from [4,8] float32 to [6,8] float32 cpu)\n"
    "  guards:\n"
    "    grad mode on\n"
    "    input 1: f32[6,8], contiguous, cpu\n"
    "    input 2: f32[8,16], contiguous, cpu\n"
    "    input 3: f32[16], contiguous, cpu\n"
    "  compile time: trace # ms, passes # ms, codegen # ms (LLVM # ms)\n"
    "  graph after the passes:\n"
    "    graph(%0: f32[6,8], %1: f32[8,16], %2: f32[16]) {\n"
    "      %3: f32[6,16] = matmul(%0, %1)\n"
    "      %4: f32[6,16] = kernel(%3, %2, id=0)\n"
    "      %5: f32[1,16] = sum(%4, dims=[0], keepdim=true)\n"
    "      %6: f32[6,16] = mul(%4, %5)\n"
    "      %7: f32[6,1] = kernel(%4, id=1)\n"
    "      return (%6, %7)\n"
    "    }\n"
    "  kernels:\n"
    "    kernel 0 = add, gelu (domain [6,16], 2 inputs, 1 outputs, llvm)\n"
    "    kernel 1 = exp, amax (row kernel over [6,16], 1 inputs, 1 outputs, llvm)\n"
    "  not fused:\n"
    "    matmul[6,16]: a library call\n"
    "    sum[1,16]: reduction over another axis than the last, or not keepdim: not a row kernel\n"
    "    mul[6,16]: starts a kernel of its own, not joining the group it reads: sum reads the group's gelu before it\n"
    "    exp[6,16]: starts a kernel of its own, not joining the group it reads: sum reads the group's gelu before it\n"
    "  memory plan: peak 832 bytes of intermediates alive at once; 1 slots, 384 bytes for 384 bytes of kernel outputs\n"
    "  launches per call: 5\n"
    "\n"
    "recompiles: 1\n"
    "  entry 1: input 1 changed from [4,8] float32 to [6,8] float32 cpu\n";

static void explain_a_small_function(void **state) {
    (void)state;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.name = "small";
    o.auto_dynamic = 0; /* the golden shows a static recompile (test_compile_dyn covers dynamic entries' text) */
    kl_fn *f = kl_compile(small_fn, NULL, &o);
    kl_tensor *x = kl_ones(KL_SHAPE(4, 8), KL_F32), *x6 = kl_ones(KL_SHAPE(6, 8), KL_F32);
    kl_tensor *w = kl_ones(KL_SHAPE(8, 16), KL_F32), *b = kl_ones(KL_SHAPE(16), KL_F32);
    kl_tensor *y[2];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kl_fn_call(f, (kl_tensor *[]){i < 2 ? x : x6, w, b}, 3, y, 2), 0);
        kl_release(y[0]), kl_release(y[1]);
    }
    char *text = NULL;
    size_t n = 0;
    FILE *s = open_memstream(&text, &n);
    assert_int_equal(kl_fn_explain(f, s), 0);
    fclose(s);
    mask_ms(text);
    assert_string_equal(text, explain_golden);
    free(text);
    assert_int_equal(kl_fn_explain(NULL, stdout), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "compiled function");
    kl_fn_release(f);
    kl_release(x), kl_release(x6), kl_release(w), kl_release(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(log_categories_reach_the_callback),
        KT_TEST(profiler_states),
        KT_TEST(eager_ops_in_the_trace),
        KT_TEST(compiled_calls_in_the_trace),
        KT_TEST(ring_keeps_the_newest),
        KT_TEST(summary_table),
        KT_TEST(events_from_several_threads),
        KT_TEST(explain_a_small_function),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
