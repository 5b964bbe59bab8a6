/*
 * test_cuda_reduce.c — eager reductions on CUDA tensors (cn_reduce.c: a
 * row kernel over the input seen as [kept, reduced], after one device copy
 * when the dims do not collapse). Every reduction row of the table that has
 * a CUDA kernel is dispatched, for every dtype, over several dim sets with
 * and without keepdim, once on the CPU and once on cuda:0 with the same
 * values:
 *   - integers, bool, amax, amin: equal to the CPU;
 *   - floating sum / mean / prod (and var, std, logsumexp, norm, composed
 *     of those and elementwise ops on the device): within rtol = atol = 1e-5 (f32), 1e-12
 *     (f64), one unit of the last place (f16: 2^-10, bf16: 2^-7): the GPU
 *     folds as a tree (per-thread partials, warp shuffles, the block's
 *     warps), the CPU as a cascade, so the rounding order differs.
 * The rows without a CUDA kernel fail with the dispatcher's clear error.
 * Runs on the emulated device in CI (cuda_reduce_emu); without a device
 * every test skips with the reason.
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"
#include "../src/eager/dispatch.h"

static const char *OP = "cuda_reduce_test";


/* Values of dtype dt; near 1 for prod (no overflow in 60 factors). */
static kl_tensor *sample(int ndim, const int64_t *shape, kl_dtype dt, int op) {
    kl_tensor *x = kl_randn(ndim, shape, KL_F64);
    if (op == KE_OP_prod) x = kl_add_scalar(kl_mul_scalar(x, kl_dtype_is_floating(dt) ? 0.2 : 0.6), 1.0);
    else x = kl_mul_scalar(x, 2.0);
    if (dt == KL_BOOL) return kl_gt_scalar(x, op == KE_OP_all ? -1.5 : 1.5);
    if (dt == KL_U8) return kl_to_dtype(kl_abs(kl_mul_scalar(x, op == KE_OP_prod ? 1 : 20)), dt);
    if (!kl_dtype_is_floating(dt)) return kl_to_dtype(kl_mul_scalar(x, op == KE_OP_prod ? 1 : 20), dt);
    return kl_to_dtype(x, dt);
}

static double tol_of(kl_dtype d) {
    switch (d) {
    case KL_F64: return 1e-12;
    case KL_F16: return 1.0 / 1024;
    case KL_BF16: return 1.0 / 128;
    default: return 1e-5;
    }
}

static int ncases, nskipped;
static double g_f0; /* attribute f[0]: var's correction, norm's p */

/* op over dims[0..nd) (nd < 0: no list, every dim) of x (a CPU tensor) and
 * of gx (the same values on cuda:0, any layout). */
static void one_case(int op, kl_tensor *x, kl_tensor *gx, const int64_t *dims, int nd, int keep) {
    kl_scope_begin();
    kl_tensor *cin[1] = {x}, *gin[1] = {gx};
    ke_call c = {.op = op, .nin = 1, .in = cin, .device = KL_DEVICE_CPU};
    c.a.nlist = nd < 0 ? 0 : nd;
    for (int i = 0; i < nd; i++) c.a.list[i] = dims[i];
    c.a.i[KE_ATTR_KEEPDIM] = keep;
    c.a.f[0] = g_f0;
    ke_call g = c;
    g.in = gin;
    g.device = CUDA0;
    if (ke_dispatch(&c)) { /* a combination eager refuses: nothing to compare */
        kl_clear_error();
        nskipped++;
        kl_scope_end();
        return;
    }
    int rc = ke_dispatch(&g);
    if (rc) print_error("kl_%s of %s on CUDA: %s\n", ke_ops[op].name, ke_dtypes[x->dtype].name, kl_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(kl_device_of(g.out[0]).type, KL_CUDA);
    kl_tensor *want = host(c.out[0]), *got = host(g.out[0]);
    kl_dtype od = kl_dtype_of(want);
    assert_int_equal(kl_dtype_of(got), od);
    assert_int_equal(kl_ndim(got), kl_ndim(want));
    for (int d = 0; d < kl_ndim(want); d++) assert_int_equal(kl_shape(got)[d], kl_shape(want)[d]);
    int exact = !kl_dtype_is_floating(od) || op == KE_OP_amax || op == KE_OP_amin;
    int ok = exact ? kl_equal(got, want) == 1 : kl_allclose(got, want, tol_of(od), tol_of(od), true) == 1;
    if (!ok) {
        char a[512], b[512];
        kl_format(want, a, sizeof a);
        kl_format(got, b, sizeof b);
        print_error("kl_%s of %s over %d dims (keepdim %d): CUDA differs from the CPU\ncpu  %s\ncuda %s\n",
                    ke_ops[op].name, ke_dtypes[x->dtype].name, nd, keep, a, b);
        fail();
    }
    ncases++;
    kl_scope_end();
}

static const int64_t SHAPE[3] = {3, 4, 5};

/* Every reduction with a CUDA kernel, every dtype, dim sets that collapse
 * (trailing, leading, all) and that do not ({0, 2}: copied first), keepdim
 * or not, on a contiguous input and on a transposed view. */
static void every_reduction_every_dtype(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(31);
    ncases = nskipped = 0;
    static const struct {
        int nd;
        int64_t d[3];
    } sets[] = {{-1, {0}}, {1, {2}}, {1, {0}}, {1, {1}}, {2, {0, 2}}, {2, {-1, 1}}, {3, {0, 1, 2}}};
    int nops = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        if (ke_ops[op].kind != KE_KIND_REDUCE || !ku_cuda_reduce_supported(op)) continue;
        nops++;
        for (int d = 0; d < KL_NUM_DTYPES; d++) {
            kl_scope_begin();
            kl_tensor *x = sample(3, SHAPE, (kl_dtype)d, op), *gx = kl_to_device(x, CUDA0);
            kl_tensor *xt = kl_permute(x, 3, (int64_t[]){2, 0, 1});
            kl_tensor *gxt = kl_permute(gx, 3, (int64_t[]){2, 0, 1});
            assert_non_null(gx);
            assert_non_null(gxt);
            for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
                for (int keep = 0; keep < 2; keep++) {
                    one_case(op, x, gx, sets[i].d, sets[i].nd, keep);
                    if (keep == 0) one_case(op, xt, gxt, sets[i].d, sets[i].nd, keep);
                }
            kl_scope_end();
        }
    }
    print_message("%d reductions: %d cases like the CPU, %d refused by eager on the CPU too\n", nops, ncases, nskipped);
    assert_int_equal(nops, 11);
    assert_true(ncases > 500);
}

/* Shapes beyond the sweep: a 0-dim tensor, a long row (256-thread blocks,
 * many elements per thread), rows longer than a warp but short, a reduced
 * dim of length 0 (sum: zeros), no rows at all, a sliced (offset) view. */
static void shapes_and_views(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(32);
    ncases = nskipped = 0;
    kl_tensor *x0 = kl_scalar_tensor(1.25, KL_F32);
    one_case(KE_OP_sum, x0, kl_to_device(x0, CUDA0), NULL, -1, 0);
    one_case(KE_OP_amax, x0, kl_to_device(x0, CUDA0), NULL, -1, 0);
    kl_tensor *xl = kl_randn(KL_SHAPE(2, 5000), KL_F32);
    one_case(KE_OP_sum, xl, kl_to_device(xl, CUDA0), (int64_t[]){1}, 1, 0);
    one_case(KE_OP_mean, xl, kl_to_device(xl, CUDA0), (int64_t[]){1}, 1, 1);
    one_case(KE_OP_amin, xl, kl_to_device(xl, CUDA0), NULL, -1, 0);
    one_case(KE_OP_sum, xl, kl_to_device(xl, CUDA0), (int64_t[]){0}, 1, 0);
    kl_tensor *xi = kl_to_dtype(kl_mul_scalar(kl_randn(KL_SHAPE(70, 3), KL_F64), 1000), KL_I64);
    one_case(KE_OP_sum, xi, kl_to_device(xi, CUDA0), (int64_t[]){0}, 1, 0);
    kl_tensor *xe = kl_zeros(KL_SHAPE(3, 0), KL_F32);
    one_case(KE_OP_sum, xe, kl_to_device(xe, CUDA0), (int64_t[]){1}, 1, 0);
    one_case(KE_OP_prod, xe, kl_to_device(xe, CUDA0), (int64_t[]){1}, 1, 1);
    one_case(KE_OP_sum, xe, kl_to_device(xe, CUDA0), (int64_t[]){0}, 1, 0);
    kl_tensor *xs = kl_slice(kl_randn(KL_SHAPE(6, 8), KL_F64), 1, 2, 7, 2), *gs = kl_to_device(xs, CUDA0);
    kl_tensor *gsv = kl_slice(kl_to_device(kl_randn(KL_SHAPE(6, 8), KL_F64), CUDA0), 1, 2, 7, 2);
    one_case(KE_OP_sum, xs, gs, (int64_t[]){1}, 1, 0);
    one_case(KE_OP_amax, host(gsv), gsv, (int64_t[]){0}, 1, 0);
    one_case(KE_OP_prod, host(gsv), gsv, NULL, -1, 1);
    /* var / std with a correction, norms of every kind of p */
    kl_tensor *xv = kl_randn(KL_SHAPE(4, 6), KL_F32), *gv = kl_to_device(xv, CUDA0);
    const double ps[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5};
    for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
        g_f0 = ps[i];
        one_case(KE_OP_norm, xv, gv, (int64_t[]){1}, 1, 0);
        one_case(KE_OP_norm, xv, gv, NULL, -1, 1);
    }
    g_f0 = 1;
    one_case(KE_OP_var, xv, gv, (int64_t[]){0}, 1, 1);
    one_case(KE_OP_std, xv, gv, (int64_t[]){1}, 1, 0);
    g_f0 = 0;
    kl_tensor *xh = kl_to_dtype(kl_mul_scalar(kl_randn(KL_SHAPE(5, 7), KL_F32), 3), KL_F16);
    one_case(KE_OP_logsumexp, xh, kl_to_device(xh, CUDA0), (int64_t[]){0}, 1, 0);
    one_case(KE_OP_var, xh, kl_to_device(xh, CUDA0), (int64_t[]){1}, 1, 0);
    assert_int_equal(nskipped, 0);
    /* the public API */
    kl_tensor *a = kl_randn(KL_SHAPE(4, 6), KL_F32), *ga = kl_to_device(a, CUDA0);
    kl_tensor *r = kl_sum(ga, KL_DIMS(1), false);
    assert_non_null(r);
    assert_int_equal(kl_allclose(host(r), kl_sum(a, KL_DIMS(1), false), 1e-5, 1e-5, false), 1);
    assert_int_equal(kl_equal(host(kl_amax(ga, KL_DIMS(0), true)), kl_amax(a, KL_DIMS(0), true)), 1);
}

/* Every reduction row of the table has a CUDA kernel now; an op without one
 * (a scan) still fails clearly, before touching data. */
static void every_reduction_has_a_kernel(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *ga = kl_to_device(kl_randn(KL_SHAPE(4, 6), KL_F32), CUDA0);
    int n = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        if (ke_ops[op].kind != KE_KIND_REDUCE || ke_ops[op].nin != 1) continue;
        kl_tensor *in[1] = {ga};
        ke_call g = {.op = op, .nin = 1, .in = in, .device = CUDA0};
        g.a.nlist = 1;
        g.a.list[0] = 1;
        g.a.f[0] = 2; /* norm's p */
        int rc = ke_dispatch(&g);
        if (rc) print_error("kl_%s on CUDA: %s\n", ke_ops[op].name, kl_last_error());
        assert_int_equal(rc, 0);
        n++;
    }
    print_message("%d reductions run on CUDA\n", n);
    assert_int_equal(n, 15);
    /* an op without a CUDA kernel fails clearly: every op of the table has one now, so one is
     * unregistered for the check (and registered again) */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_multinomial, NULL);
    kl_tensor *nk = kl_multinomial(kl_abs(ga), 2, true);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_multinomial, ku_cuda_multinomial);
    assert_null(nk);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "kl_multinomial: no CUDA kernel for this op (on cuda:0)");
}

/* Values with many ties, and NaNs in the floats (NaN wins, the first of equals wins). */
static kl_tensor *tie_sample(int ndim, const int64_t *shape, kl_dtype dt, int nans) {
    kl_tensor *x = kl_mul_scalar(kl_round(kl_mul_scalar(kl_randn(ndim, shape, KL_F64), 2)), 0.5);
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0);
    if (dt == KL_U8) x = kl_abs(x);
    if (kl_dtype_is_floating(dt) && nans)
        x = kl_masked_fill(x, kl_gt_scalar(kl_rand(ndim, shape, KL_F64), 0.93), NAN);
    return kl_to_dtype(x, dt);
}

static int nargs;

/* op (argmax, argmin, max_dim, min_dim) of x over dim (KL_DIM_NONE: argmax of
 * the flattened tensor) on the CPU and of gx (the same values on cuda:0, any
 * layout) on CUDA: positions and values to the byte. */
static void arg_case(int op, kl_tensor *x, kl_tensor *gx, int dim, int keep) {
    kl_scope_begin();
    kl_tensor *cin[1] = {x}, *gin[1] = {gx};
    ke_call c = {.op = op, .nin = 1, .in = cin, .device = KL_DEVICE_CPU};
    c.a.nlist = dim == KL_DIM_NONE ? 0 : 1;
    c.a.list[0] = dim;
    c.a.i[KE_ATTR_KEEPDIM] = keep;
    ke_call g = c;
    g.in = gin;
    g.device = CUDA0;
    int want = ke_dispatch(&c);
    if (want) kl_clear_error();
    int rc = ke_dispatch(&g);
    if (rc && !want) print_error("kl_%s of %s on CUDA: %s\n", ke_ops[op].name, ke_dtypes[x->dtype].name, kl_last_error());
    assert_int_equal(rc, want);
    if (rc) {
        kl_clear_error();
        kl_scope_end();
        return;
    }
    for (int o = 0; o < ke_ops[op].nout; o++) {
        assert_int_equal(kl_device_of(g.out[o]).type, KL_CUDA);
        if (!same_bytes(host(c.out[o]), host(g.out[o]))) {
            char a[512], b[512];
            kl_format(x, a, sizeof a);
            print_error("input %s\n", a);
            kl_format(host(c.out[o]), a, sizeof a);
            kl_format(host(g.out[o]), b, sizeof b);
            print_error("kl_%s of %s over dim %d (keepdim %d), output %d: CUDA differs from the CPU\ncpu  %s\ncuda %s\n",
                        ke_ops[op].name, ke_dtypes[x->dtype].name, dim, keep, o, a, b);
            fail();
        }
    }
    nargs++;
    kl_scope_end();
}

static const int ARG_OPS[4] = {KE_OP_argmax, KE_OP_argmin, KE_OP_max_dim, KE_OP_min_dim};

/* argmax, argmin, max_dim, min_dim: every dtype, every dim (and none),
 * keepdim or not, contiguous and permuted views, ties and NaNs. */
static void argreduce_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(35);
    nargs = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++)
        for (int nans = 0; nans < 2; nans++) {
            if (nans && !kl_dtype_is_floating((kl_dtype)d)) continue;
            kl_scope_begin();
            kl_tensor *x = tie_sample(KL_SHAPE(4, 5, 37), (kl_dtype)d, nans), *gx = kl_to_device(x, CUDA0);
            kl_tensor *xt = kl_permute(x, 3, (int64_t[]){2, 0, 1}), *gxt = kl_permute(gx, 3, (int64_t[]){2, 0, 1});
            for (int k = 0; k < 4; k++)
                for (int dim = -1; dim < 3; dim++) {
                    if (dim == -1 && (ARG_OPS[k] == KE_OP_max_dim || ARG_OPS[k] == KE_OP_min_dim)) continue;
                    const int dd = dim < 0 ? KL_DIM_NONE : dim;
                    arg_case(ARG_OPS[k], x, gx, dd, 0);
                    arg_case(ARG_OPS[k], x, gx, dd, 1);
                    arg_case(ARG_OPS[k], xt, gxt, dd, d & 1);
                }
            kl_scope_end();
        }
    /* a 0-dim tensor, a sliced (offset, strided) view, all NaN, one long row of equal values */
    kl_tensor *x0 = kl_scalar_tensor(2.5, KL_F32);
    arg_case(KE_OP_argmax, x0, kl_to_device(x0, CUDA0), KL_DIM_NONE, 0);
    arg_case(KE_OP_max_dim, x0, kl_to_device(x0, CUDA0), 0, 1);
    kl_tensor *gb = kl_to_device(tie_sample(KL_SHAPE(9, 40), KL_F64, 1), CUDA0);
    kl_tensor *gs = kl_slice(gb, 1, 3, 37, 3);
    arg_case(KE_OP_min_dim, host(gs), gs, 1, 0);
    arg_case(KE_OP_argmax, host(gs), gs, 0, 1);
    kl_tensor *xn = kl_full(KL_SHAPE(3, 70), NAN, KL_F32);
    arg_case(KE_OP_argmin, xn, kl_to_device(xn, CUDA0), 1, 0);
    kl_tensor *xe = kl_full(KL_SHAPE(2, 3000), 7, KL_I32);
    arg_case(KE_OP_max_dim, xe, kl_to_device(xe, CUDA0), 1, 0);
    print_message("%d argmax / argmin / max_dim / min_dim cases equal to the CPU\n", nargs);
    assert_true(nargs > 450);
    /* the public API */
    kl_tensor *a = tie_sample(KL_SHAPE(6, 33), KL_F32, 1), *ga = kl_to_device(a, CUDA0);
    kl_tensor *gi = kl_argmax(ga, 1, false);
    assert_non_null(gi);
    assert_int_equal(kl_device_of(gi).type, KL_CUDA);
    assert_int_equal(kl_equal(host(gi), kl_argmax(a, 1, false)), 1);
    assert_int_equal(kl_equal(host(kl_argmin(ga, KL_DIM_NONE, false)), kl_argmin(a, KL_DIM_NONE, false)), 1);
    kl_tensor *v = NULL, *i = NULL, *cv = NULL, *ci = NULL;
    assert_int_equal(kl_min_dim(ga, 0, true, &v, &i), 0);
    assert_int_equal(kl_min_dim(a, 0, true, &cv, &ci), 0);
    assert_true(same_bytes(host(v), cv));
    assert_true(same_bytes(host(i), ci));
    /* errors as on the CPU: bool argmax, an empty reduced dim */
    assert_null(kl_argmax(kl_to_device(kl_gt_scalar(a, 0), CUDA0), 0, false));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "not implemented for bool input");
    assert_null(kl_argmax(kl_to_device(kl_zeros(KL_SHAPE(3, 0), KL_F32), CUDA0), 1, false));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "expected reduction dim 1 to have non-zero size");
}

/* Long rows: split over several blocks (partials, then a finishing kernel),
 * with the split threshold lowered so the emulator runs it in moments, and
 * one row past the default threshold (65536). */
static void long_rows_split(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(36);
    nargs = 0;
    int64_t chunk;
    cn_set_row_split(1000, 300);
    assert_int_equal(cn_row_split(1000, &chunk), 1);
    assert_int_equal(cn_row_split(5001, &chunk), 17);
    assert_int_equal(chunk, 295);
    const kl_dtype dts[] = {KL_F32, KL_F16, KL_I64, KL_U8};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        kl_tensor *x = tie_sample(KL_SHAPE(3, 5001), dts[k], 1), *gx = kl_to_device(x, CUDA0);
        for (int o = 0; o < 4; o++) {
            arg_case(ARG_OPS[o], x, gx, 1, 0);
            arg_case(ARG_OPS[o], kl_transpose(x, 0, 1), kl_transpose(gx, 0, 1), 0, 1);
        }
        arg_case(KE_OP_argmax, x, gx, KL_DIM_NONE, 0);
    }
    kl_tensor *xn = kl_full(KL_SHAPE(2, 4000), NAN, KL_F64);
    arg_case(KE_OP_argmax, xn, kl_to_device(xn, CUDA0), 1, 0);
    cn_set_row_split(0, 0); /* the defaults */
    assert_int_equal(cn_row_split(65536, &chunk), 1);
    kl_tensor *xl = tie_sample(KL_SHAPE(100000), KL_F32, 0), *gl = kl_to_device(xl, CUDA0);
    assert_int_equal(cn_row_split(100000, &chunk), 7);
    arg_case(KE_OP_argmax, xl, gl, KL_DIM_NONE, 0);
    arg_case(KE_OP_min_dim, xl, gl, 0, 1);
    print_message("%d long-row cases equal to the CPU\n", nargs);
}

static void close_to(kl_tensor *want, kl_tensor *got, double tol, const char *what) {
    if (!got) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    if (kl_allclose(host(got), want, tol, tol, false) != 1) {
        char a[512], b[512];
        kl_format(want, a, sizeof a);
        kl_format(host(got), b, sizeof b);
        print_error("%s: CUDA differs from the CPU\ncpu  %s\ncuda %s\n", what, a, b);
        fail();
    }
}

/* softmax, log_softmax, layer_norm and rms_norm on CUDA tensors (one fused
 * row kernel each), cross_entropy (its decomposition: amax / sum row
 * kernels and elementwise ones), within 1e-5 of the CPU's kernels (f32; the
 * 16-bit types within a few units of their last place). */
static void norms_and_softmax(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(33);
    kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(6, 10), KL_F32), 2), *gx = kl_to_device(x, CUDA0);
    kl_tensor *w = kl_randn(KL_SHAPE(10), KL_F32), *b = kl_randn(KL_SHAPE(10), KL_F32);
    kl_tensor *gw = kl_to_device(w, CUDA0), *gb = kl_to_device(b, CUDA0);
    close_to(kl_softmax(x, -1), kl_softmax(gx, -1), 1e-5, "softmax dim -1");
    close_to(kl_softmax(x, 0), kl_softmax(gx, 0), 1e-5, "softmax dim 0");
    close_to(kl_log_softmax(x, -1), kl_log_softmax(gx, -1), 1e-5, "log_softmax");
    /* the fused kernel (ku_cuda_softmax): every float dtype, the dim in the
     * middle (input copied, output through a temporary), a transposed view
     * read in place, a long row, a 0-dim tensor */
    const kl_dtype fd[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    kl_tensor *x3 = kl_mul_scalar(kl_randn(KL_SHAPE(3, 7, 4), KL_F32), 3);
    for (int i = 0; i < 4; i++) {
        kl_tensor *xd = kl_to_dtype(x3, fd[i]), *gd = kl_to_device(xd, CUDA0);
        double tol = fd[i] == KL_F64 ? 1e-12 : fd[i] == KL_F16 ? 1.0 / 512 : fd[i] == KL_BF16 ? 1.0 / 64 : 1e-5;
        for (int dim = -1; dim < 3; dim++) {
            close_to(kl_softmax(xd, dim), kl_softmax(gd, dim), tol, "softmax (3-D)");
            close_to(kl_log_softmax(xd, dim), kl_log_softmax(gd, dim), tol * 4, "log_softmax (3-D)");
        }
    }
    close_to(kl_softmax(kl_transpose(x, 0, 1), 1), kl_softmax(kl_transpose(gx, 0, 1), 1), 1e-5, "softmax of a view");
    kl_tensor *xl = kl_randn(KL_SHAPE(2, 3000), KL_F32);
    close_to(kl_log_softmax(xl, 1), kl_log_softmax(kl_to_device(xl, CUDA0), 1), 1e-5, "log_softmax long rows");
    /* the fused norms (ku_cuda_norm): every float dtype, weight / bias or not,
     * several normalized dims, a transposed input (copied first) */
    kl_tensor *w3 = kl_randn(KL_SHAPE(4), KL_F32), *b3 = kl_randn(KL_SHAPE(4), KL_F32);
    for (int i = 0; i < 4; i++) {
        kl_tensor *xd = kl_to_dtype(x3, fd[i]), *gd = kl_to_device(xd, CUDA0);
        kl_tensor *wd = kl_to_dtype(w3, fd[i]), *bd = kl_to_dtype(b3, fd[i]);
        kl_tensor *gwd = kl_to_device(wd, CUDA0), *gbd = kl_to_device(bd, CUDA0);
        double tol = fd[i] == KL_F64 ? 1e-12 : fd[i] == KL_F16 ? 1.0 / 256 : fd[i] == KL_BF16 ? 1.0 / 32 : 1e-5;
        close_to(kl_layer_norm(xd, 1, wd, bd, 1e-5), kl_layer_norm(gd, 1, gwd, gbd, 1e-5), tol, "layer_norm w b");
        close_to(kl_layer_norm(xd, 1, wd, NULL, 1e-5), kl_layer_norm(gd, 1, gwd, NULL, 1e-5), tol, "layer_norm w");
        close_to(kl_layer_norm(xd, 2, NULL, NULL, 1e-3), kl_layer_norm(gd, 2, NULL, NULL, 1e-3), tol, "layer_norm 2");
        close_to(kl_rms_norm(xd, 1, wd, 1e-6), kl_rms_norm(gd, 1, gwd, 1e-6), tol, "rms_norm w");
        close_to(kl_rms_norm(xd, 3, NULL, 1e-6), kl_rms_norm(gd, 3, NULL, 1e-6), tol, "rms_norm 3 dims");
    }
    kl_tensor *xt = kl_transpose(x, 0, 1), *gxt = kl_transpose(gx, 0, 1);
    kl_tensor *w6 = kl_randn(KL_SHAPE(6), KL_F32), *gw6 = kl_to_device(w6, CUDA0);
    close_to(kl_layer_norm(xt, 1, w6, NULL, 1e-5), kl_layer_norm(gxt, 1, gw6, NULL, 1e-5), 1e-5, "layer_norm of a view");
    close_to(kl_rms_norm(xt, 1, NULL, 1e-6), kl_rms_norm(gxt, 1, NULL, 1e-6), 1e-5, "rms_norm of a view");
    kl_tensor *x0 = kl_scalar_tensor(0.5, KL_F32);
    close_to(kl_softmax(x0, 0), kl_softmax(kl_to_device(x0, CUDA0), 0), 0, "softmax 0-dim");
    close_to(kl_layer_norm(x, 1, w, b, 1e-5), kl_layer_norm(gx, 1, gw, gb, 1e-5), 1e-5, "layer_norm");
    close_to(kl_layer_norm(x, 2, NULL, NULL, 1e-5), kl_layer_norm(gx, 2, NULL, NULL, 1e-5), 1e-5, "layer_norm 2 dims");
    close_to(kl_rms_norm(x, 1, w, 1e-6), kl_rms_norm(gx, 1, gw, 1e-6), 1e-5, "rms_norm");
    kl_tensor *t = kl_to_dtype(kl_mul_scalar(kl_rand(KL_SHAPE(6), KL_F32), 9.99), KL_I64);
    close_to(kl_cross_entropy(x, t, KL_REDUCE_MEAN, 0.0), kl_cross_entropy(gx, kl_to_device(t, CUDA0), KL_REDUCE_MEAN, 0.0),
             1e-5, "cross_entropy");
    /* nll_loss: through gather on the device (cn_index.c; more in test_cuda_index) */
    close_to(kl_nll_loss(kl_log_softmax(x, -1), t, KL_REDUCE_MEAN),
             kl_nll_loss(kl_log_softmax(gx, -1), kl_to_device(t, CUDA0), KL_REDUCE_MEAN), 1e-5, "nll_loss");
}

/* The fused row kernels hold the row in registers up to CN_ROW_KR_MAX *
 * CN_ROW_MAX_THREADS elements and run strided passes past that; the block
 * size follows the row length (cn_row_threads). Rows of lengths around
 * every threshold (a warp, CN_BLOCK, the cache limit and one past it), in
 * every float dtype, within the tolerances above of the CPU kernels. */
static void row_lengths_around_thresholds(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(35);
    const int64_t limit = (int64_t)CN_ROW_KR_MAX * CN_ROW_MAX_THREADS;
    const int64_t lens[] = {1, 31, 32, 33, 127, 128, 129, 1000, 2048, limit, limit + 1};
    const kl_dtype fd[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    int n = 0;
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        const int64_t len = lens[i];
        kl_scope_begin();
        kl_tensor *x0 = kl_mul_scalar(kl_randn(KL_SHAPE(3, len), KL_F32), 3);
        kl_tensor *w0 = kl_randn(KL_SHAPE(len), KL_F32), *b0 = kl_randn(KL_SHAPE(len), KL_F32);
        for (int d = 0; d < 4; d++) {
            kl_tensor *x = kl_to_dtype(x0, fd[d]), *w = kl_to_dtype(w0, fd[d]), *b = kl_to_dtype(b0, fd[d]);
            kl_tensor *gx = kl_to_device(x, CUDA0), *gw = kl_to_device(w, CUDA0), *gb = kl_to_device(b, CUDA0);
            const double sm = fd[d] == KL_F64 ? 1e-12 : fd[d] == KL_F16 ? 1.0 / 512 : fd[d] == KL_BF16 ? 1.0 / 64 : 1e-5;
            const double nm = fd[d] == KL_F64 ? 1e-12 : fd[d] == KL_F16 ? 1.0 / 256 : fd[d] == KL_BF16 ? 1.0 / 32 : 1e-5;
            char what[96];
            snprintf(what, sizeof what, "softmax [3, %lld] %s", (long long)len, ke_dtypes[fd[d]].name);
            close_to(kl_softmax(x, 1), kl_softmax(gx, 1), sm, what);
            snprintf(what, sizeof what, "log_softmax [3, %lld] %s", (long long)len, ke_dtypes[fd[d]].name);
            close_to(kl_log_softmax(x, 1), kl_log_softmax(gx, 1), sm * 4, what);
            snprintf(what, sizeof what, "layer_norm [3, %lld] %s", (long long)len, ke_dtypes[fd[d]].name);
            close_to(kl_layer_norm(x, 1, w, b, 1e-5), kl_layer_norm(gx, 1, gw, gb, 1e-5), nm, what);
            snprintf(what, sizeof what, "rms_norm [3, %lld] %s", (long long)len, ke_dtypes[fd[d]].name);
            close_to(kl_rms_norm(x, 1, w, 1e-6), kl_rms_norm(gx, 1, gw, 1e-6), nm, what);
            n += 4;
        }
        kl_scope_end();
    }
    print_message("%d row-length cases within tolerance (cache limit %lld elements)\n", n, (long long)limit);
}

/* An MLP (matmul, bias, tanh, layer_norm, softmax, cross_entropy) on CUDA
 * tensors: kl_backward gives the CPU's gradients within 1e-4. */
static void mlp_backward(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(34);
    kl_tensor *x = kl_randn(KL_SHAPE(8, 5), KL_F32);
    kl_tensor *t = kl_to_dtype(kl_mul_scalar(kl_rand(KL_SHAPE(8), KL_F32), 3.99), KL_I64);
    kl_tensor *p0[4] = {kl_mul_scalar(kl_randn(KL_SHAPE(5, 16), KL_F32), 0.5), kl_randn(KL_SHAPE(16), KL_F32),
                        kl_mul_scalar(kl_randn(KL_SHAPE(16, 4), KL_F32), 0.5), kl_randn(KL_SHAPE(4), KL_F32)};
    kl_tensor *grads[2][4];
    for (int dev = 0; dev < 2; dev++) {
        kl_device d = dev ? CUDA0 : KL_DEVICE_CPU;
        kl_tensor *p[4];
        for (int i = 0; i < 4; i++) {
            p[i] = kl_to_device(kl_clone(p0[i]), d);
            assert_non_null(p[i]);
            assert_int_equal(kl_set_requires_grad(p[i], true), 0);
        }
        kl_tensor *xd = kl_to_device(x, d), *td = kl_to_device(t, d);
        kl_tensor *h = kl_tanh(kl_add(kl_matmul(xd, p[0]), p[1]));
        h = kl_layer_norm(h, 1, NULL, NULL, 1e-5);
        kl_tensor *logits = kl_add(kl_matmul(h, p[2]), p[3]);
        kl_tensor *loss = kl_add(kl_cross_entropy(logits, td, KL_REDUCE_MEAN, 0.0),
                                 kl_mean(kl_mul(kl_softmax(logits, -1), logits), 0, NULL, false));
        if (!loss) print_error("forward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
        assert_non_null(loss);
        int rc = kl_backward(loss, NULL, NULL);
        if (rc) print_error("backward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
        assert_int_equal(rc, 0);
        for (int i = 0; i < 4; i++) {
            grads[dev][i] = kl_grad(p[i]);
            assert_non_null(grads[dev][i]);
            assert_int_equal(kl_device_of(grads[dev][i]).type, dev ? KL_CUDA : KL_CPU);
        }
    }
    for (int i = 0; i < 4; i++) close_to(grads[0][i], grads[1][i], 1e-4, "gradient");
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(shapes_and_views),
        KT_TEST(every_reduction_every_dtype),
        KT_TEST(every_reduction_has_a_kernel),
        KT_TEST(argreduce_like_cpu),
        KT_TEST(long_rows_split),
        KT_TEST(norms_and_softmax),
        KT_TEST(row_lengths_around_thresholds),
        KT_TEST(mlp_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
