/*
 * test_plan.c — memory planning (src/ir/plan.c) and the executor's use of the
 * plan: slot counts and bytes on chains that cannot fuse into one kernel,
 * values that must never share a slot (returned, viewed, written in place),
 * peak live storages during a call with and without the plan, results equal
 * to eager, the plan's text form and its KL_DEBUG_DIR dump.
 */
#include "harness.h"

#include "kernel.h"
#include "trace.h"

#include <dirent.h>
#include <stdlib.h>

static kl_tensor *seq(int64_t n, double scale, kl_dtype dt) {
    return kl_to_dtype(kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F64), (double)n / 2), scale), dt);
}

/* Traces fn on in[] and runs the pipeline (fusing if fuse). */
static ir_graph *optimized(kl_traceable fn, kl_tensor **in, int n_in, int n_out, int fuse) {
    int broke = 0;
    char why[256];
    ir_graph *g = tr_trace(fn, NULL, in, n_in, n_out, &broke, why, sizeof why);
    assert_non_null(g);
    g->fuse = (uint8_t)fuse;
    assert_int_equal(ir_optimize(g), 0);
    assert_int_equal(tr_compile_kernels(g, NULL), 0);
    assert_non_null(g->plan);
    return g;
}

/* Runs g on in[] with peak tracking; compares output 0 with ref bitwise and
 * returns the peak number of storages alive beyond those before the call. */
static int64_t run_peak(const ir_graph *g, kl_tensor **in, kl_tensor *ref) {
    kl_tensor *out[2] = {0};
    tr_track_peak = 1;
    assert_int_equal(tr_run_graph(g, in, out), 0);
    tr_track_peak = 0;
    assert_int_equal(kl_allclose(out[0], ref, 0, 0, true), 1);
    return tr_peak_storages;
}

/* 30 elementwise ops in a chain */
static int chain30(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = in[0];
    for (int i = 0; i < 10; i++) h = kl_tanh(kl_add_scalar(kl_mul_scalar(h, 0.9), 0.1));
    out[0] = h;
    return h ? 0 : -1;
}

/* NO_FUSE: no kernels, so no slots; every intermediate is dropped after its
 * only use, so a call holds a couple of storages at a time, not 30 */
static void no_fuse_chain_drops_intermediates(void **state) {
    (void)state;
    kl_tensor *in[1] = {kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8))}, *ref;
    assert_int_equal(chain30(NULL, in, 1, &ref, 1), 0);
    ir_graph *g = optimized(chain30, in, 1, 1, 0);
    assert_int_equal(g->plan->nslots, 0);
    assert_int_equal(g->plan->drop_start[g->nnodes], g->nvalues - 1 - 1); /* all but the input and output */
    int64_t planned = run_peak(g, in, ref);
    ir_plan_free(g->plan);
    g->plan = NULL;
    int64_t unplanned = run_peak(g, in, ref);
    assert_true(planned <= 3);
    assert_true(unplanned >= 30);
    ir_graph_free(g);
}

/* matmul and a 3-op elementwise kernel, ten times: 10 matmuls + 10 kernels */
static int mm_chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = in[0];
    for (int i = 0; i < 10; i++) h = kl_tanh(kl_add_scalar(kl_mul_scalar(kl_matmul(h, in[1]), 0.5), 0.1));
    out[0] = h;
    return h ? 0 : -1;
}

static void fused_chain_shares_one_slot(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8)), kl_reshape(seq(64, 0.02, KL_F32), KL_SHAPE(8, 8))};
    kl_tensor *ref;
    assert_int_equal(mm_chain(NULL, in, 2, &ref, 1), 0);
    ir_graph *g = optimized(mm_chain, in, 2, 1, 1);
    assert_int_equal(g->nkernels, 10);
    /* kernel i's output lives until matmul i+1 reads it; kernel i+1 writes
     * after that: one slot of 8*8 f32 for the nine kernel outputs not returned */
    assert_int_equal(g->plan->nslots, 1);
    assert_int_equal(g->plan->slot_bytes[0], 256);
    assert_int_equal(g->plan->value_bytes, 9 * 256);
    int64_t planned = run_peak(g, in, ref);
    ir_plan_free(g->plan);
    g->plan = NULL;
    int64_t unplanned = run_peak(g, in, ref);
    assert_true(planned <= 4);
    assert_true(unplanned >= 20);
    ir_graph_free(g);
}

/* two kernel outputs alive at once: y (read by the last kernel) and z */
static int two_live(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *y = kl_exp(kl_mul_scalar(in[0], 0.5));             /* kernel 1 */
    kl_tensor *s = kl_sum(y, KL_DIMS(0), true);                   /* column sum: extern */
    kl_tensor *z = kl_sin(kl_add(kl_matmul(y, in[1]), s));        /* matmul, kernel 2 */
    kl_tensor *w = kl_matmul(z, in[1]);                           /* z's last use */
    out[0] = kl_add_scalar(kl_mul(kl_add(w, y), s), 1);           /* kernel 3 reads y */
    return out[0] ? 0 : -1;
}

static void overlapping_lifetimes_get_two_slots(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(16, 0.1, KL_F64), KL_SHAPE(4, 4)), kl_reshape(seq(16, 0.05, KL_F64), KL_SHAPE(4, 4))};
    kl_tensor *ref;
    assert_int_equal(two_live(NULL, in, 2, &ref, 1), 0);
    ir_graph *g = optimized(two_live, in, 2, 1, 1);
    assert_int_equal(g->nkernels, 3);
    assert_int_equal(g->plan->nslots, 2);
    assert_int_equal(g->plan->slot_total, 2 * 128);
    run_peak(g, in, ref);
    char *text = ir_print_to_string((int (*)(const void *, FILE *))ir_plan_print, g);
    /* y (%3) lives from kernel 1 to kernel 3; z (%6) between them */
    assert_string_equal(text, "plan: 2 slots, 256 bytes for 256 bytes of kernel outputs\n"
                              "  slot 0: 128 bytes: %3 [1,7]\n"
                              "  slot 1: 128 bytes: %6 [4,5]\n"
                              "  after node 1 drop %2\n"
                              "  after node 4 drop %5\n"
                              "  after node 5 drop %6\n"
                              "  after node 7 drop %3 %4 %7 %8\n");
    free(text);
    ir_graph_free(g);
}

/* kernel outputs that are returned, viewed or written into an input never
 * get a slot */
static int aliased(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *a = kl_exp(kl_mul_scalar(in[0], 0.5));             /* viewed: transposed into the matmul */
    kl_tensor *b = kl_matmul(kl_transpose(a, 0, 1), in[0]);
    out[0] = kl_tanh(kl_add_scalar(b, 1));                        /* returned */
    kl_mul_scalar_inplace(kl_add_scalar_inplace(in[1], 1), 2);   /* written into input 1 */
    out[1] = kl_sin(kl_cos(out[0]));
    return out[1] ? 0 : -1;
}

static void returned_and_viewed_values_get_no_slot(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(16, 0.1, KL_F32), KL_SHAPE(4, 4)), seq(4, 1, KL_F32)};
    kl_tensor *e1 = kl_clone(in[1]), *ref[2];
    assert_int_equal(aliased(NULL, (kl_tensor *[]){in[0], e1}, 2, ref, 2), 0);
    ir_graph *g = optimized(aliased, (kl_tensor *[]){in[0], kl_clone(in[1])}, 2, 2, 1);
    for (int32_t k = 0; k < g->nnodes; k++) {
        const ir_node *n = &g->nodes[k];
        if (n->op != IR_OP_KERNEL) continue;
        for (int j = 0; j < n->nout; j++) assert_int_equal(g->plan->slot_of[n->out[j]], -1);
    }
    assert_int_equal(g->plan->nslots, 0);
    kl_tensor *c1 = kl_clone(in[1]), *out[2];
    assert_int_equal(tr_run_graph(g, (kl_tensor *[]){in[0], c1}, out), 0);
    assert_int_equal(kl_equal(out[0], ref[0]), 1);
    assert_int_equal(kl_equal(out[1], ref[1]), 1);
    assert_int_equal(kl_equal(c1, e1), 1);
    ir_graph_free(g);
}

/* with inputs requiring grad the graph runs op by op and drops nothing that
 * backward needs: gradients equal eager's */
static void drops_keep_autograd_working(void **state) {
    (void)state;
    kl_tensor *x = kl_clone(kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8))), *y;
    kl_set_requires_grad(x, true);
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_NO_FUSE;
    kl_fn *f = kl_compile(chain30, NULL, &o);
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    assert_int_equal(kl_backward(kl_sum(y, 0, NULL, false), NULL, NULL), 0);
    kl_tensor *g1 = kl_clone(kl_grad(x));
    kl_tensor *x2 = kl_clone(kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8))), *y2;
    kl_set_requires_grad(x2, true);
    assert_int_equal(chain30(NULL, &x2, 1, &y2, 1), 0);
    assert_int_equal(kl_backward(kl_sum(y2, 0, NULL, false), NULL, NULL), 0);
    assert_int_equal(kl_equal(g1, kl_grad(x2)), 1);
    kl_fn_release(f);
}

/* a compiled function called many times: slots are per call, results stay
 * the caller's */
static void repeated_calls_keep_their_results(void **state) {
    (void)state;
    kl_tensor *in[2] = {kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8)), kl_reshape(seq(64, 0.02, KL_F32), KL_SHAPE(8, 8))};
    kl_tensor *ref, *got[5];
    assert_int_equal(mm_chain(NULL, in, 2, &ref, 1), 0);
    kl_fn *f = kl_compile(mm_chain, NULL, NULL);
    for (int i = 0; i < 5; i++) assert_int_equal(kl_fn_call(f, in, 2, &got[i], 1), 0);
    for (int i = 0; i < 5; i++) assert_int_equal(kl_allclose(got[i], ref, 0, 0, true), 1);
    kl_fn_release(f);
}

/* ---- the standard workloads: plan numbers, and peak bytes with and without the plan ---- */

static int wl_mlp(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_linear(kl_gelu(kl_linear(in[0], in[1], in[2])), in[3], in[4]);
    return out[0] ? 0 : -1;
}

static int wl_softmax(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}

static int wl_layer_norm(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    return out[0] ? 0 : -1;
}

static int wl_adamw(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    kl_mul_scalar_inplace(p, 1 - 1e-2 * 0.01);
    kl_add_inplace(kl_mul_scalar_inplace(m, 0.9), kl_mul_scalar(g, 0.1));
    kl_add_inplace(kl_mul_scalar_inplace(v, 0.999), kl_mul_scalar(kl_mul(g, g), 0.001));
    kl_tensor *den = kl_add_scalar(kl_sqrt(kl_div_scalar(v, 0.001)), 1e-8);
    out[0] = kl_sub_inplace(p, kl_mul_scalar(kl_div(m, den), 1e-2 / 0.1));
    return out[0] ? 0 : -1;
}

typedef struct workload {
    const char *name;
    kl_traceable fn;
    int nin;
    int64_t fuse_slots;        /* slots in FUSE mode */
} workload;

/* Peak bytes of one call of g on copies of in[] (in-place workloads write them). */
static int64_t peak_bytes(const ir_graph *g, kl_tensor **in, int n) {
    kl_tensor *c[5], *out[1];
    for (int i = 0; i < n; i++) c[i] = kl_clone(in[i]);
    tr_track_peak = 1;
    assert_int_equal(tr_run_graph(g, c, out), 0);
    tr_track_peak = 0;
    return tr_peak_bytes;
}

static void standard_workloads(void **state) {
    (void)state;
    kl_tensor *mlp[5] = {kl_randn(KL_SHAPE(64, 256), KL_F32), kl_randn(KL_SHAPE(1024, 256), KL_F32),
                         kl_randn(KL_SHAPE(1024), KL_F32), kl_randn(KL_SHAPE(256, 1024), KL_F32), kl_randn(KL_SHAPE(256), KL_F32)};
    kl_tensor *x = kl_randn(KL_SHAPE(64, 1024), KL_F32);
    kl_tensor *ln[3] = {x, kl_randn(KL_SHAPE(1024), KL_F32), kl_randn(KL_SHAPE(1024), KL_F32)};
    kl_tensor *aw[4] = {kl_randn(KL_SHAPE(1 << 16), KL_F32), kl_randn(KL_SHAPE(1 << 16), KL_F32),
                        kl_randn(KL_SHAPE(1 << 16), KL_F32), kl_abs(kl_randn(KL_SHAPE(1 << 16), KL_F32))};
    const workload wl[] = {{"mlp", wl_mlp, 5, 1}, {"softmax", wl_softmax, 1, 0}, {"layer_norm", wl_layer_norm, 3, 0},
                           {"adamw", wl_adamw, 4, 0}};
    kl_tensor **ins[] = {mlp, &x, ln, aw};
    for (size_t w = 0; w < sizeof wl / sizeof wl[0]; w++) {
        for (int fuse = 0; fuse <= 1; fuse++) {
            kl_tensor *c[5];
            for (int i = 0; i < wl[w].nin; i++) c[i] = kl_clone(ins[w][i]);
            ir_graph *g = optimized(wl[w].fn, c, wl[w].nin, 1, fuse);
            assert_int_equal(g->plan->nslots, fuse ? wl[w].fuse_slots : 0);
            int64_t with = peak_bytes(g, ins[w], wl[w].nin);
            ir_plan *p = g->plan;
            g->plan = NULL;
            int64_t without = peak_bytes(g, ins[w], wl[w].nin);
            g->plan = p;
            print_message("%-10s %-7s %2d nodes, %d slots (%lld bytes for %lld), peak %lld bytes (%lld without the plan)\n",
                          wl[w].name, fuse ? "FUSE" : "NO_FUSE", g->nnodes, p->nslots, (long long)p->slot_total,
                          (long long)p->value_bytes, (long long)with, (long long)without);
            assert_true(with <= without);
            ir_graph_free(g);
        }
    }
}

static void debug_dir_gets_the_plan(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("plandbg");
    setenv("KL_DEBUG_DIR", dir, 1);
    kl_tensor *in[2] = {kl_reshape(seq(64, 0.1, KL_F32), KL_SHAPE(8, 8)), kl_reshape(seq(64, 0.02, KL_F32), KL_SHAPE(8, 8))};
    kl_tensor *y;
    kl_fn *f = kl_compile(mm_chain, NULL, NULL);
    assert_int_equal(kl_fn_call(f, in, 2, &y, 1), 0);
    kl_fn_release(f);
    unsetenv("KL_DEBUG_DIR");
    DIR *d = opendir(dir);
    assert_non_null(d);
    int plans = 0;
    struct dirent *e;
    char path[700];
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!strncmp(e->d_name, "plan", 4)) {
            FILE *fp = fopen(path, "r");
            char line[128] = "";
            assert_non_null(fgets(line, sizeof line, fp));
            assert_string_equal(line, "plan: 1 slots, 256 bytes for 2304 bytes of kernel outputs\n");
            fclose(fp);
            plans++;
        }
        if (e->d_name[0] != '.') unlink(path);
    }
    closedir(d);
    rmdir(dir);
    assert_int_equal(plans, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(no_fuse_chain_drops_intermediates),
        KT_TEST(fused_chain_shares_one_slot),
        KT_TEST(overlapping_lifetimes_get_two_slots),
        KT_TEST(returned_and_viewed_values_get_no_slot),
        KT_TEST(drops_keep_autograd_working),
        KT_TEST(repeated_calls_keep_their_results),
        KT_TEST(standard_workloads),
        KT_TEST(debug_dir_gets_the_plan),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
