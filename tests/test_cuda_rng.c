/*
 * test_cuda_rng.c — the random ops drawn on the device (cn_rng.c): rand,
 * randn, randint, bernoulli, dropout and dropout2d on cuda:0 give the CPU's
 * bits for the same seed (the kernels compute philox_xf.h, the CPU fills'
 * own per-element math), in every dtype, for sizes that end inside a Philox
 * block, and advance the generator as the CPU does; dropout's mask on CUDA is
 * the CPU's, so its backward (and a training step) gives the CPU's gradients;
 * kl_compile of a function with dropout over CUDA tensors draws the same
 * numbers; multinomial on CUDA draws the CPU's indices (with and without
 * replacement, every floating dtype) and raises its errors. The calls are device kernels, not host fills copied over: with
 * the stream held (emulator) they leave it pending. Runs on the emulated
 * device in CI (cuda_rng_emu); without a device every test skips.
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"
#include "../src/eager/philox.h"

#include <math.h>
#include <string.h>

static const char *OP = "cuda_rng_test";

static void same_bits(kl_tensor *cpu, kl_tensor *cuda, const char *what) {
    if (!cuda) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(cpu);
    assert_non_null(cuda);
    assert_int_equal(kl_device_of(cuda).type, KL_CUDA);
    kl_tensor *a = host(cpu), *b = host(cuda);
    assert_int_equal(kl_dtype_of(a), kl_dtype_of(b));
    kt_assert_shape(b, kl_ndim(a), kl_shape(a));
    size_t es = kl_dtype_size(kl_dtype_of(a));
    const unsigned char *p = kl_data_ptr(a), *q = kl_data_ptr(b);
    for (int64_t i = 0; i < kl_numel(a); i++)
        if (memcmp(p + i * es, q + i * es, es)) {
            print_error("%s: element %lld: cpu %.17g cuda %.17g\n", what, (long long)i, kt_get(a, i), kt_get(b, i));
            fail();
        }
}

typedef kl_tensor *(*make_fn)(int ndim, const int64_t *shape, kl_dtype dt);
static kl_tensor *mk_rand(int nd, const int64_t *s, kl_dtype dt) { return kl_rand(nd, s, dt); }
static kl_tensor *mk_randn(int nd, const int64_t *s, kl_dtype dt) { return kl_randn(nd, s, dt); }
static kl_tensor *mk_randint(int nd, const int64_t *s, kl_dtype dt) { return kl_randint(-7, 1000003, nd, s, dt); }
static kl_tensor *mk_randint_wide(int nd, const int64_t *s, kl_dtype dt) {
    return kl_randint(INT64_MIN / 2, INT64_MAX / 2, nd, s, dt);
}

/* The op on the default device dev, seeded; then one more CPU draw shows
 * the generator moved by the same amount on both devices. */
static kl_tensor *draw(make_fn f, int nd, const int64_t *s, kl_dtype dt, kl_device dev, uint64_t seed,
                       kl_tensor **after) {
    kl_manual_seed(seed);
    kl_set_default_device(dev);
    kl_tensor *t = f(nd, s, dt);
    kl_set_default_device(KL_DEVICE_CPU);
    *after = kl_rand(KL_SHAPE(3), KL_F32);
    return t;
}

static void fills_match_the_cpu(void **st) {
    (void)st;
    NEED_CUDA();
    static const struct {
        make_fn f;
        const char *name;
        kl_dtype dts[4];
        int ndt;
    } ops[] = {
        {mk_rand, "rand", {KL_F32, KL_F64, KL_F16, KL_BF16}, 4},
        {mk_randn, "randn", {KL_F32, KL_F64, KL_F16, KL_BF16}, 4},
        {mk_randint, "randint", {KL_I64, KL_I32, KL_F32, KL_U8}, 4},
        {mk_randint_wide, "randint wide", {KL_I64}, 1},
    };
    /* sizes ending inside a block (4 f32 / 2 f64 elements per block), several grid strides */
    static const int64_t sizes[] = {1, 2, 3, 5, 7, 130, 4097};
    int ncases = 0;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (int d = 0; d < ops[o].ndt; d++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                kl_scope_begin();
                char what[96];
                snprintf(what, sizeof what, "%s %s [%lld]", ops[o].name, kl_dtype_name(ops[o].dts[d]),
                         (long long)sizes[z]);
                kl_tensor *ca, *ga;
                kl_tensor *c = draw(ops[o].f, 1, &sizes[z], ops[o].dts[d], KL_DEVICE_CPU, 1000 + z, &ca);
                kl_tensor *g = draw(ops[o].f, 1, &sizes[z], ops[o].dts[d], CUDA0, 1000 + z, &ga);
                same_bits(c, g, what);
                same_bits(ca, kl_to_device(ga, CUDA0), "the next draw");
                ncases++;
                kl_scope_end();
            }
    /* a 3-D shape, a second draw from the same seed (the offset moved on) */
    kl_manual_seed(9);
    kl_tensor *c1 = kl_randn(KL_SHAPE(2, 3, 5), KL_F32), *c2 = kl_rand(KL_SHAPE(2, 3, 5), KL_F64);
    kl_manual_seed(9);
    kl_set_default_device(CUDA0);
    kl_tensor *g1 = kl_randn(KL_SHAPE(2, 3, 5), KL_F32), *g2 = kl_rand(KL_SHAPE(2, 3, 5), KL_F64);
    kl_set_default_device(KL_DEVICE_CPU);
    same_bits(c1, g1, "randn [2,3,5]");
    same_bits(c2, g2, "rand [2,3,5] after it");
    /* *_like follow the argument's device */
    kl_tensor *gx = kl_to_device(c1, CUDA0);
    kl_manual_seed(10);
    kl_tensor *cl = kl_randn_like(c1);
    kl_manual_seed(10);
    same_bits(cl, kl_randn_like(gx), "randn_like");
    /* empty */
    kl_set_default_device(CUDA0);
    kl_tensor *e = kl_rand(KL_SHAPE(0, 3), KL_F32);
    kl_set_default_device(KL_DEVICE_CPU);
    assert_non_null(e);
    assert_int_equal(kl_numel(e), 0);
    print_message("%d fills bit-equal to the CPU\n", ncases);
}

static void bernoulli_matches_the_cpu(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    for (size_t d = 0; d < 4; d++) {
        kl_scope_begin();
        kl_tensor *p = kl_to_dtype(kl_rand(KL_SHAPE(7, 9), KL_F64), dts[d]);
        kl_tensor *gp = kl_to_device(p, CUDA0);
        kl_manual_seed(77);
        kl_tensor *c = kl_bernoulli(p);
        kl_manual_seed(77);
        same_bits(c, kl_bernoulli(gp), "bernoulli");
        /* a transposed view of the probabilities */
        kl_manual_seed(78);
        c = kl_bernoulli(kl_transpose(p, 0, 1));
        kl_manual_seed(78);
        same_bits(c, kl_bernoulli(kl_transpose(gp, 0, 1)), "bernoulli of a transposed view");
        kl_scope_end();
    }
    /* probabilities outside [0, 1]: the CPU's error */
    kl_tensor *bad = kl_to_device(kl_from_data((float[]){0.5f, 1.5f, 0.2f}, 1, (int64_t[]){3}, KL_F32), CUDA0);
    assert_null(kl_bernoulli(bad));
    KT_EXPECT_ERROR(KL_ERR_ARG, "probabilities must be in [0, 1]");
    kl_tensor *nan = kl_to_device(kl_from_data((float[]){NAN}, 1, (int64_t[]){1}, KL_F32), CUDA0);
    assert_null(kl_bernoulli(nan));
    KT_EXPECT_ERROR(KL_ERR_ARG, "probabilities must be in [0, 1]");
}

static void dropout_matches_the_cpu(void **st) {
    (void)st;
    NEED_CUDA();
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    static const double ps[] = {0.3, 0.9, 1.0};
    for (size_t d = 0; d < 4; d++)
        for (size_t k = 0; k < 3; k++) {
            kl_scope_begin();
            char what[96];
            kl_tensor *x = kl_to_dtype(kl_randn(KL_SHAPE(5, 6, 7), KL_F64), dts[d]);
            kl_tensor *gx = kl_to_device(x, CUDA0);
            snprintf(what, sizeof what, "dropout %s p=%g", kl_dtype_name(dts[d]), ps[k]);
            kl_manual_seed(5 + k);
            kl_tensor *c = kl_dropout(x, ps[k], true);
            kl_manual_seed(5 + k);
            same_bits(c, kl_dropout(gx, ps[k], true), what);
            snprintf(what, sizeof what, "dropout of a transposed view %s p=%g", kl_dtype_name(dts[d]), ps[k]);
            kl_manual_seed(6);
            c = kl_dropout(kl_transpose(x, 0, 2), ps[k], true);
            kl_manual_seed(6);
            same_bits(c, kl_dropout(kl_transpose(gx, 0, 2), ps[k], true), what);
            snprintf(what, sizeof what, "dropout2d 4-D %s p=%g", kl_dtype_name(dts[d]), ps[k]);
            kl_tensor *x4 = kl_reshape(x, 4, (int64_t[]){5, 3, 2, 7}), *g4 = kl_to_device(x4, CUDA0);
            kl_manual_seed(8);
            c = kl_dropout2d(x4, ps[k], true);
            kl_manual_seed(8);
            same_bits(c, kl_dropout2d(g4, ps[k], true), what);
            snprintf(what, sizeof what, "dropout2d 3-D %s p=%g", kl_dtype_name(dts[d]), ps[k]);
            kl_manual_seed(9);
            c = kl_dropout2d(x, ps[k], true);
            kl_manual_seed(9);
            same_bits(c, kl_dropout2d(gx, ps[k], true), what);
            kl_scope_end();
        }
    /* a longer tensor (several grid strides of blocks) */
    kl_tensor *x = kl_randn(KL_SHAPE(40000), KL_F32);
    kl_manual_seed(11);
    kl_tensor *c = kl_dropout(x, 0.5, true);
    kl_manual_seed(11);
    same_bits(c, kl_dropout(kl_to_device(x, CUDA0), 0.5, true), "dropout [40000]");
}

/* A training step with dropout: the gradients on CUDA are the CPU's (the
 * backward redraws the forward's mask from its recorded seed and offset). */
static void dropout_training_step(void **st) {
    (void)st;
    NEED_CUDA();
    kl_manual_seed(3);
    kl_tensor *x0 = kl_randn(KL_SHAPE(6, 5), KL_F32), *w0 = kl_randn(KL_SHAPE(5, 4), KL_F32);
    kl_tensor *gw[2], *gx[2], *loss[2];
    for (int dev = 0; dev < 2; dev++) {
        kl_device d = dev ? CUDA0 : KL_DEVICE_CPU;
        kl_tensor *x = kl_to_device(kl_clone(x0), d), *w = kl_to_device(kl_clone(w0), d);
        assert_int_equal(kl_set_requires_grad(x, true), 0);
        assert_int_equal(kl_set_requires_grad(w, true), 0);
        kl_manual_seed(21);
        kl_tensor *h = kl_dropout(kl_tanh(kl_matmul(x, w)), 0.4, true);
        h = kl_dropout(kl_mul(h, h), 0.25, true);
        loss[dev] = kl_sum(h, 0, NULL, false);
        if (!loss[dev]) print_error("forward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
        assert_non_null(loss[dev]);
        int rc = kl_backward(loss[dev], NULL, NULL);
        if (rc) print_error("backward on %s: %s\n", dev ? "cuda" : "cpu", kl_last_error());
        assert_int_equal(rc, 0);
        gw[dev] = kl_grad(w);
        gx[dev] = kl_grad(x);
        assert_non_null(gw[dev]);
        assert_non_null(gx[dev]);
    }
    /* the masks are equal, so the dropped gradient elements are exactly zero on both */
    kl_tensor *hx = host(gx[1]);
    for (int64_t i = 0; i < kl_numel(hx); i++) assert_true((kt_get(hx, i) == 0) == (kt_get(gx[0], i) == 0));
    assert_int_equal(kl_allclose(host(gw[1]), gw[0], 1e-5, 1e-5, false), 1);
    assert_int_equal(kl_allclose(hx, gx[0], 1e-5, 1e-5, false), 1);
    assert_int_equal(kl_allclose(host(loss[1]), loss[0], 1e-5, 1e-5, false), 1);
}

/* dropout inside kl_compile over CUDA tensors draws the CPU's numbers */
static int drop_fn(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_mul_scalar(kl_dropout(kl_exp(in[0]), 0.5, true), 2);
    return out[0] ? 0 : -1;
}

static void compiled_dropout(void **st) {
    (void)st;
    NEED_CUDA();
    kl_tensor *x = kl_randn(KL_SHAPE(9, 13), KL_F32), *gx = kl_to_device(x, CUDA0);
    kl_fn *fc = kl_compile(drop_fn, NULL, NULL), *fg = kl_compile(drop_fn, NULL, NULL);
    assert_non_null(fc);
    assert_non_null(fg);
    for (int call = 0; call < 3; call++) {
        kl_tensor *ref = NULL, *got = NULL;
        kl_manual_seed(40 + call);
        assert_int_equal(kl_fn_call(fc, &x, 1, &ref, 1), 0);
        kl_manual_seed(40 + call);
        int rc = kl_fn_call(fg, &gx, 1, &got, 1);
        if (rc) print_error("compiled call on CUDA: %s\n", kl_last_error());
        assert_int_equal(rc, 0);
        same_bits(ref, got, "compiled dropout");
        /* and eager's */
        kl_manual_seed(40 + call);
        same_bits(drop_fn(NULL, &x, 1, &ref, 1) ? NULL : ref, got, "compiled dropout against eager");
    }
    kl_fn_release(fc);
    kl_fn_release(fg);
}

/* The draws are device kernels: with the current stream held (the
 * emulator's knob), rand / randn / dropout leave it pending; a host fill
 * copied to the device would have synchronized it. */
static void drawn_on_the_device(void **st) {
    (void)st;
    NEED_EMULATOR();
    const ku_driver *d = ku_driver_get(OP);
    assert_non_null(d);
    kl_tensor *gx = kl_to_device(kl_randn(KL_SHAPE(4, 8), KL_F32), CUDA0);
    assert_non_null(gx);
    /* warm: modules loaded, and output blocks cached for the held stream */
    kl_set_default_device(CUDA0);
    assert_non_null(kl_rand(KL_SHAPE(4, 8), KL_F32));
    assert_non_null(kl_randn(KL_SHAPE(4, 8), KL_F32));
    kl_set_default_device(KL_DEVICE_CPU);
    assert_non_null(kl_dropout(gx, 0.5, true));
    CUstream s;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &s, 0), 0);
    CUstream old = ku_current_stream(0);
    ku_set_current_stream(0, s);
    ku_emu_hold_stream(s, 1);
    kl_manual_seed(1);
    kl_set_default_device(CUDA0);
    kl_tensor *r = kl_rand(KL_SHAPE(4, 8), KL_F32), *n = kl_randn(KL_SHAPE(4, 8), KL_F32);
    kl_set_default_device(KL_DEVICE_CPU);
    kl_tensor *y = kl_dropout(gx, 0.5, true);
    assert_non_null(r);
    assert_non_null(n);
    assert_non_null(y);
    assert_int_equal(d->StreamQuery(s), CUDA_ERROR_NOT_READY);
    ku_emu_hold_stream(s, 0);
    kl_manual_seed(1);
    same_bits(kl_rand(KL_SHAPE(4, 8), KL_F32), r, "rand on a held stream");
    same_bits(kl_randn(KL_SHAPE(4, 8), KL_F32), n, "randn on a held stream");
    same_bits(kl_dropout(host(gx), 0.5, true), y, "dropout on a held stream");
    ku_set_current_stream(0, old);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, s), 0);
}

/* multinomial(probs, ns, repl) on the CPU and on CUDA with the same seed:
 * the same indices, byte for byte, and the generator moved alike. */
static void multinomial_same(kl_tensor *probs, int64_t ns, bool repl, const char *what) {
    kl_tensor *got[2], *after[2];
    for (int on = 0; on < 2; on++) {
        kl_manual_seed(1234);
        got[on] = kl_multinomial(on ? kl_to_device(probs, CUDA0) : probs, ns, repl);
        if (!got[on]) print_error("%s on %s: %s\n", what, on ? "cuda" : "cpu", kl_last_error());
        assert_non_null(got[on]);
        after[on] = kl_rand(KL_SHAPE(3), KL_F32);
    }
    same_bits(got[0], got[1], what);
    same_bits(after[0], kl_to_device(after[1], CUDA0), "the next draw after multinomial");
}

/* multinomial on CUDA draws the CPU's indices for the same seed: every
 * floating dtype, with and without replacement, 1-D and 2-D, zero
 * probabilities, unnormalized rows, a transposed (non-contiguous) view, all
 * categories drawn without replacement, odd sample counts (uniforms ending
 * inside a Philox block), a row of 0 rows, 5000 categories (the long-row
 * sort); then the CPU's errors. */
static void multinomial_matches_the_cpu(void **st) {
    (void)st;
    NEED_CUDA();
    kl_manual_seed(61);
    const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    for (int k = 0; k < 4; k++) {
        kl_scope_begin();
        kl_tensor *p = kl_to_dtype(kl_mul(kl_rand(KL_SHAPE(5, 37), KL_F64), kl_gt_scalar(kl_randn(KL_SHAPE(5, 37), KL_F64), -1)),
                                   dts[k]);
        multinomial_same(p, 1, true, "multinomial 1 sample");
        multinomial_same(p, 9, true, "multinomial with replacement");
        multinomial_same(p, 9, false, "multinomial without replacement");
        multinomial_same(kl_select(p, 0, 2), 7, true, "multinomial 1-D with replacement");
        multinomial_same(kl_select(p, 0, 3), 7, false, "multinomial 1-D without replacement");
        kl_tensor *t = kl_transpose(kl_add_scalar(kl_rand(KL_SHAPE(40, 3), dts[k]), 0.01), 0, 1); /* [3, 40] view */
        multinomial_same(t, 40, false, "multinomial of a view, every category");
        multinomial_same(t, 333, true, "multinomial of a view with replacement");
        /* one category carrying almost everything, many with tiny weights */
        kl_tensor *skew = kl_to_dtype(kl_pow_scalar(kl_rand(KL_SHAPE(2, 100), KL_F64), 8), dts[k]);
        multinomial_same(skew, 50, false, "multinomial of skewed rows");
        multinomial_same(skew, 1001, true, "multinomial of skewed rows with replacement");
        multinomial_same(kl_ones(KL_SHAPE(0, 4), dts[k]), 2, true, "multinomial of no rows");
        kl_scope_end();
    }
    /* more categories than a block sorts: the keys go through the long-row sort */
    kl_tensor *big = kl_rand(KL_SHAPE(2, 5000), KL_F32);
    multinomial_same(big, 30, false, "multinomial of 5000 categories without replacement");
    multinomial_same(big, 30, true, "multinomial of 5000 categories with replacement");
    /* the errors: the CPU's, first bad row first, nothing drawn */
    kl_tensor *bad = kl_to_device(kl_from_data((float[]){0.2f, 0.3f, 0.5f, 0.2f, -0.1f, 0.5f, 0, 0, 0}, KL_SHAPE(3, 3),
                                               KL_F32), CUDA0);
    assert_null(kl_multinomial(bad, 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 1: probability 1 is -0.1 (must be finite and >= 0)");
    kl_tensor *nan = kl_to_device(kl_from_data((double[]){0.5, 0.5, 0.5, NAN}, KL_SHAPE(2, 2), KL_F64), CUDA0);
    assert_null(kl_multinomial(nan, 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 1: probability 1 is nan");
    assert_null(kl_multinomial(kl_to_device(kl_from_data((float[]){INFINITY, 0.5f}, KL_SHAPE(2), KL_F32), CUDA0), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 0: probability 0 is inf");
    assert_null(kl_multinomial(kl_to_device(kl_zeros(KL_SHAPE(2, 3), KL_F16), CUDA0), 1, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 0: the probabilities sum to 0");
    kl_tensor *few = kl_to_device(kl_from_data((float[]){0.2f, 0.1f, 0.5f, 0.2f, 0, 0.5f}, KL_SHAPE(2, 3), KL_F32), CUDA0);
    assert_null(kl_multinomial(few, 3, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: row 1: only 2 categories have non-zero probability, too few for 3 samples");
    assert_null(kl_multinomial(few, 4, false));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_multinomial: cannot draw 4 samples from 3 categories without replacement");
    assert_null(kl_multinomial(few, 0, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "num_samples must be positive");
    assert_null(kl_multinomial(kl_to_device(kl_ones(KL_SHAPE(3), KL_I64), CUDA0), 1, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_multinomial: expects floating-point tensors");
    assert_null(kl_multinomial(kl_to_device(kl_ones(KL_SHAPE(2, 2, 2), KL_F32), CUDA0), 1, true));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "probabilities must be 1-D or 2-D");
}

/* Every program the random kernels use compiles with NVRTC for sm_80 and
 * sm_90 without spilling (no device needed: the run without the emulator). */
static void nvrtc_compiles_every_variant(void **st) {
    (void)st;
    NEED_NVRTC_ONLY();
    static const int variants[][2] = {
        {CN_RNG_FILL, KE_PHILOX_UNIFORM_F32}, {CN_RNG_FILL, KE_PHILOX_UNIFORM_F64},
        {CN_RNG_FILL, KE_PHILOX_NORMAL_F32},  {CN_RNG_FILL, KE_PHILOX_NORMAL_F64},
        {CN_RNG_FILL, KE_PHILOX_RANDINT_I64}, {CN_RNG_DROPOUT, KE_PHILOX_UNIFORM_F32},
        {CN_RNG_DROPOUT, KE_PHILOX_UNIFORM_F64}, {CN_RNG_BERNOULLI, KE_PHILOX_UNIFORM_F32},
        {CN_RNG_BERNOULLI, KE_PHILOX_UNIFORM_F64},
    };
    int maxreg = 0;
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        cn_kernel_src src;
        assert_int_equal(cn_rng_program(variants[v][0], variants[v][1], &src), 0);
        int r = kt_nvrtc_compiles(OP, src.src, "rng.cu");
        if (r > maxreg) maxreg = r;
        cn_kernel_src_free(&src);
    }
    const kl_dtype mdt[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    for (int k = 0; k < 4; k++) {
        char *src = cn_multinomial_source(mdt[k]);
        assert_non_null(src);
        int r = kt_nvrtc_compiles(OP, src, "multinomial.cu");
        if (r > maxreg) maxreg = r;
        free(src);
    }
    print_message("9 random and 4 multinomial programs compiled for sm_80 and sm_90: no spills, at most %d registers\n",
                  maxreg);
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(fills_match_the_cpu),
        KT_TEST(bernoulli_matches_the_cpu),
        KT_TEST(dropout_matches_the_cpu),
        KT_TEST(dropout_training_step),
        KT_TEST(compiled_dropout),
        KT_TEST(drawn_on_the_device),
        KT_TEST(multinomial_matches_the_cpu),
        KT_TEST(nvrtc_compiles_every_variant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
