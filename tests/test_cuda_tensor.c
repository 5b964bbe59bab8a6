/*
 * test_cuda_tensor.c — CUDA tensors in eager (docs/GPU.md, "CUDA tensors"):
 * creation on a CUDA device, kl_to_device in every direction for every
 * dtype and for non-contiguous sources, creation ops equal to the CPU's bit
 * for bit (random ops with the same seed), mixed-device errors naming both,
 * 0-dim CPU tensors joining, ops without a CUDA kernel failing clearly,
 * item / data_ptr / printing / saving, the allocator's statistics returning
 * to the start, injected out-of-memory, DLPack kDLCUDA, autograd through
 * moves, threads. Runs on the emulated device in CI (test_cuda_tensor_emu)
 * and, as is, without a driver: then only the "CUDA not available" errors
 * are checked and the rest skips with the reason.
 */
#include "harness.h"

#include <dlpack/dlpack.h>
#include <pthread.h>

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cuda_api.h"

static const char *OP = "cuda_tensor_test";

static kl_cuda_mem_stats stats(void) {
    kl_cuda_mem_stats s;
    assert_int_equal(kl_cuda_memory_stats(0, &s), 0);
    return s;
}

/* Each test must give back every device byte it took (after its scope). */
static int64_t start_allocated;
static int setup(void **state) {
    if (kl_cuda_is_available()) start_allocated = stats().allocated_bytes;
    return kt_setup(state);
}
static int teardown(void **state) {
    int bad = kt_teardown(state);
    if (kl_cuda_is_available()) {
        kl_cuda_mem_stats s = stats();
        if (s.allocated_bytes != start_allocated) {
            print_error("test left %lld device bytes allocated (start %lld)\n",
                        (long long)(s.allocated_bytes - start_allocated), (long long)start_allocated);
            bad = -1;
        }
    }
    kl_set_default_device(KL_DEVICE_CPU);
    return bad;
}
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)


/* a and b (either device) have the same shape, dtype and bytes. */
static void assert_same_bits(kl_tensor *a, kl_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    kl_tensor *ha = host(a), *hb = host(b);
    assert_int_equal(kl_dtype_of(ha), kl_dtype_of(hb));
    kt_assert_shape(hb, kl_ndim(ha), kl_shape(ha));
    size_t n = (size_t)kl_numel(ha) * kl_dtype_size(kl_dtype_of(ha));
    if (n && memcmp(kl_data_ptr(ha), kl_data_ptr(hb), n)) {
        print_error("bytes differ\n");
        fail();
    }
}

static void assert_on_cuda(const kl_tensor *t) {
    if (!t) print_error("unexpected error: %s\n", kl_last_error());
    assert_non_null(t);
    kl_device d = kl_device_of(t);
    assert_int_equal(d.type, KL_CUDA);
    assert_int_equal(d.index, 0);
}

/* A CPU tensor of dtype dt with varied values (signs, fractions for floats). */
static kl_tensor *sample(int ndim, const int64_t *shape, kl_dtype dt) {
    kl_tensor *x = kl_randn(ndim, shape, KL_F64);
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0.0);
    if (dt == KL_U8) return kl_to_dtype(kl_abs(kl_mul_scalar(x, 50)), dt);
    if (!kl_dtype_is_floating(dt)) return kl_to_dtype(kl_mul_scalar(x, 1000), dt);
    return kl_to_dtype(x, dt);
}

/* ---- without a driver ------------------------------------------------------ */

static void no_cuda_errors(void **s) {
    (void)s;
    if (kl_cuda_is_available()) {
        print_message("skipped: CUDA is available here (this test checks the errors without it)\n");
        skip();
    }
    kl_tensor *a = kl_ones(KL_SHAPE(2), KL_F32);
    assert_null(kl_to_device(a, CUDA0));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_to_device: CUDA not available: ");
    assert_null(kl_empty_on(KL_SHAPE(2), KL_F32, kl_cuda_device(0)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_empty: CUDA not available: ");
    kl_set_default_device(CUDA0);
    assert_null(kl_zeros(KL_SHAPE(2), KL_F32));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_full: CUDA not available: ");
    assert_null(kl_randn(KL_SHAPE(2), KL_F32));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_randn: CUDA not available: ");
    assert_null(kl_arange(0, 4, 1, KL_I64));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_arange: CUDA not available: ");
    kl_set_default_device(KL_DEVICE_CPU);
    assert_int_equal(kl_device_of(kl_zeros(KL_SHAPE(2), KL_F32)).type, KL_CPU);
}

/* ---- moving ------------------------------------------------------------------ */

static void round_trip_every_dtype(void **s) {
    (void)s;
    NEED_CUDA();
    static const struct {
        int ndim;
        int64_t shape[3];
    } shapes[] = {{2, {2, 3}}, {1, {0}}, {3, {3, 0, 2}}, {0, {0}}, {1, {257}}, {3, {4, 5, 33}}};
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            kl_scope_begin();
            kl_tensor *x = sample(shapes[k].ndim, shapes[k].shape, (kl_dtype)dt);
            kl_tensor *g = kl_to_device(x, CUDA0);
            assert_on_cuda(g);
            assert_int_equal(kl_dtype_of(g), dt);
            kt_assert_shape(g, shapes[k].ndim, shapes[k].shape);
            assert_true(kl_is_contiguous(g));
            assert_int_equal(kl_shares_storage(g, x), 0);
            /* same device: an alias (PyTorch's .to returns self) */
            kl_tensor *g2 = kl_to_device(g, CUDA0);
            assert_int_equal(kl_shares_storage(g, g2), 1);
            kl_tensor *back = kl_to_device(g, KL_DEVICE_CPU);
            assert_int_equal(kl_device_of(back).type, KL_CPU);
            assert_same_bits(x, back);
            /* clone and contiguous on the device */
            kl_tensor *c = kl_clone(g);
            assert_on_cuda(c);
            assert_int_equal(kl_shares_storage(c, g), 0);
            assert_same_bits(x, c);
            assert_int_equal(kl_shares_storage(kl_contiguous(g), g), 1);
            kl_scope_end();
        }
    }
}

static void non_contiguous_sources(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(3);
    kl_tensor *x = sample(KL_SHAPE(6, 5, 4), KL_F32);
    kl_tensor *gx = kl_to_device(x, CUDA0);
    /* the same views of the CPU and of the CUDA tensor */
    kl_tensor *cpu_views[6], *cuda_views[6];
    kl_tensor *src[2] = {x, gx};
    for (int k = 0; k < 2; k++) {
        kl_tensor **v = k ? cuda_views : cpu_views;
        v[0] = kl_transpose(src[k], 0, 2);
        v[1] = kl_slice(src[k], 1, 1, 5, 2);
        v[2] = kl_expand(kl_select(src[k], 2, 3), KL_SHAPE(3, 6, 5));
        v[3] = kl_narrow(kl_transpose(src[k], 0, 1), 2, 1, 2);
        v[4] = kl_select(kl_select(src[k], 0, 5), 1, 2); /* 1-dim with an offset */
        v[5] = kl_slice(kl_select(src[k], 1, 4), 0, 2, 2, 1); /* empty */
    }
    for (int i = 0; i < 6; i++) {
        assert_false(i < 4 && kl_is_contiguous(cpu_views[i]));
        /* CPU view -> CUDA (made contiguous on the host side) */
        kl_tensor *up = kl_to_device(cpu_views[i], CUDA0);
        assert_on_cuda(up);
        assert_true(kl_is_contiguous(up));
        assert_same_bits(kl_contiguous(cpu_views[i]), up);
        /* CUDA view -> CPU, and clone / contiguous of a CUDA view */
        assert_same_bits(kl_contiguous(cpu_views[i]), kl_to_device(cuda_views[i], KL_DEVICE_CPU));
        int64_t n0[KU_N_COUNT], n1[KU_N_COUNT];
        ku_counts(n0);
        kl_tensor *c = kl_contiguous(cuda_views[i]);
        ku_counts(n1);
        /* on the device (a copy or the identity kernel), never through the host */
        assert_int_equal(n1[KU_N_D2H] - n0[KU_N_D2H], 0);
        assert_int_equal(n1[KU_N_H2D] - n0[KU_N_H2D], 0);
        assert_on_cuda(c);
        assert_true(kl_is_contiguous(c));
        assert_same_bits(kl_contiguous(cpu_views[i]), c);
        assert_same_bits(kl_clone(cpu_views[i]), kl_clone(cuda_views[i]));
    }
    /* the source is untouched by all that */
    assert_same_bits(x, gx);
    /* clone of a strided CUDA tensor in every dtype: the CPU's bytes */
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        kl_tensor *xd = kl_transpose(sample(KL_SHAPE(3, 4, 5), (kl_dtype)d), 0, 2);
        kl_tensor *gd = kl_transpose(kl_to_device(kl_transpose(xd, 0, 2), CUDA0), 0, 2);
        assert_false(kl_is_contiguous(gd));
        assert_same_bits(kl_clone(xd), kl_clone(gd));
    }
}

static void copy_across_devices(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_reshape(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4));
    kl_tensor *g = kl_zeros_like(kl_to_device(x, CUDA0));
    /* CPU -> CUDA, converting the dtype and broadcasting */
    assert_non_null(kl_copy_inplace(g, kl_to_device(x, CUDA0)));
    assert_same_bits(x, g);
    kl_tensor *row = kl_arange(10, 14, 1, KL_F64);
    assert_non_null(kl_copy_inplace(g, row));
    assert_same_bits(kl_expand(kl_to_dtype(row, KL_F32), KL_SHAPE(3, 4)), g);
    /* into a CUDA view (written back over its span only) */
    kl_tensor *col = kl_select(g, 1, 2);
    assert_non_null(kl_copy_inplace(col, kl_full(KL_SHAPE(3), -5, KL_I32)));
    KT_VALUES(host(g), 0, 10, 11, -5, 13, 10, 11, -5, 13, 10, 11, -5, 13);
    /* CUDA -> CPU destination (contiguous and a view) */
    kl_tensor *h = kl_zeros(KL_SHAPE(3, 4), KL_F32);
    assert_non_null(kl_copy_inplace(h, g));
    KT_VALUES(h, 0, 10, 11, -5, 13, 10, 11, -5, 13, 10, 11, -5, 13);
    kl_tensor *ht = kl_zeros(KL_SHAPE(4, 3), KL_F64);
    assert_non_null(kl_copy_inplace(kl_transpose(ht, 0, 1), g));
    KT_VALUES(ht, 0, 10, 10, 10, 11, 11, 11, -5, -5, -5, 13, 13, 13);
    /* fill of a CUDA tensor (a wrapped scalar joins) */
    assert_non_null(kl_fill_inplace(g, 2.5));
    KT_VALUES(host(g), 0, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5);
    assert_non_null(kl_zero_inplace(kl_slice(g, 1, 0, 4, 3)));
    KT_VALUES(host(g), 0, 0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0);
    /* a copy bumps the destination's version, as on the CPU */
    int64_t v = kl_version_of(g);
    assert_non_null(kl_copy_inplace(g, h));
    assert_int_equal(kl_version_of(g), v + 1);
}

/* ---- creation ---------------------------------------------------------------- */

typedef kl_tensor *(*maker)(void);
static kl_tensor *mk_zeros(void) { return kl_zeros(KL_SHAPE(3, 5), KL_F32); }
static kl_tensor *mk_ones(void) { return kl_ones(KL_SHAPE(7), KL_BF16); }
static kl_tensor *mk_full(void) { return kl_full(KL_SHAPE(2, 2, 3), 3.25, KL_F64); }
static kl_tensor *mk_full_m1(void) { return kl_full(KL_SHAPE(9), -1, KL_I32); }
static kl_tensor *mk_full_true(void) { return kl_full(KL_SHAPE(4), 1, KL_BOOL); }
static kl_tensor *mk_full_f16(void) { return kl_full(KL_SHAPE(5), -0.0, KL_F16); }
static kl_tensor *mk_scalar(void) { return kl_scalar_tensor(6.5, KL_F32); }
static kl_tensor *mk_empty0(void) { return kl_zeros(KL_SHAPE(0, 4), KL_F32); }
static kl_tensor *mk_arange(void) { return kl_arange(-3, 7.5, 0.5, KL_F32); }
static kl_tensor *mk_arange_i(void) { return kl_arange(0, 100, 3, KL_I64); }
static kl_tensor *mk_linspace(void) { return kl_linspace(-1, 2, 17, KL_F64); }
static kl_tensor *mk_eye(void) { return kl_eye(4, 6, KL_U8); }
static kl_tensor *mk_rand(void) { return kl_rand(KL_SHAPE(33, 7), KL_F32); }
static kl_tensor *mk_randn(void) { return kl_randn(KL_SHAPE(1001), KL_F64); }
static kl_tensor *mk_randn_h(void) { return kl_randn(KL_SHAPE(64), KL_F16); }
static kl_tensor *mk_randint(void) { return kl_randint(-5, 50, KL_SHAPE(5, 9), KL_I32); }
/* Each maker runs on the default device: CPU, then CUDA with the same seed. */
static void creation_ops_equal_cpu_bitwise(void **s) {
    (void)s;
    NEED_CUDA();
    static const struct {
        const char *name;
        maker fn;
    } makers[] = {
        {"zeros", mk_zeros},     {"ones bf16", mk_ones},     {"full f64", mk_full},   {"full -1 i32", mk_full_m1},
        {"full bool", mk_full_true}, {"full -0 f16", mk_full_f16}, {"scalar", mk_scalar}, {"zeros [0,4]", mk_empty0},
        {"arange", mk_arange},   {"arange i64", mk_arange_i}, {"linspace", mk_linspace}, {"eye u8", mk_eye},
        {"rand", mk_rand},       {"randn f64", mk_randn},    {"randn f16", mk_randn_h}, {"randint", mk_randint},
    };
    for (size_t k = 0; k < sizeof makers / sizeof makers[0]; k++) {
        kl_manual_seed(11);
        kl_tensor *c = makers[k].fn();
        kl_set_default_device(CUDA0);
        kl_manual_seed(11);
        kl_tensor *g = makers[k].fn();
        kl_set_default_device(KL_DEVICE_CPU);
        print_message("%s\n", makers[k].name);
        assert_on_cuda(g);
        assert_same_bits(c, g);
    }
    /* *_like follow their argument's device */
    kl_tensor *g = kl_empty_on(KL_SHAPE(2, 3), KL_F32, CUDA0);
    assert_on_cuda(g);
    assert_on_cuda(kl_empty_like(g));
    assert_same_bits(kl_zeros(KL_SHAPE(2, 3), KL_F32), kl_zeros_like(g));
    assert_same_bits(kl_ones(KL_SHAPE(2, 3), KL_F32), kl_ones_like(g));
    assert_same_bits(kl_full(KL_SHAPE(2, 3), 0.1, KL_F32), kl_full_like(g, 0.1));
    kl_manual_seed(5);
    kl_tensor *cr = kl_rand(KL_SHAPE(2, 3), KL_F32), *cn = kl_randn(KL_SHAPE(2, 3), KL_F32);
    kl_manual_seed(5);
    kl_tensor *gr = kl_rand_like(g), *gn = kl_randn_like(g);
    assert_on_cuda(gr);
    assert_on_cuda(gn);
    assert_same_bits(cr, gr);
    assert_same_bits(cn, gn);
    /* bernoulli of CUDA probabilities: the CPU's draws */
    kl_tensor *p = kl_rand(KL_SHAPE(300), KL_F32);
    kl_tensor *gp = kl_to_device(p, CUDA0);
    kl_manual_seed(9);
    kl_tensor *cb = kl_bernoulli(p);
    kl_manual_seed(9);
    kl_tensor *gb = kl_bernoulli(gp);
    assert_on_cuda(gb);
    assert_same_bits(cb, gb);
    /* a bad device index names it (the emulator has one device) */
    assert_null(kl_empty_on(KL_SHAPE(2), KL_F32, kl_cuda_device(kl_cuda_device_count())));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "does not exist");
    assert_null(kl_to_device(p, kl_cuda_device(-1)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_to_device: CUDA device -1 does not exist");
}

/* ---- devices in ops ----------------------------------------------------------- */

static void mixed_device_errors_name_both(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *c = kl_ones(KL_SHAPE(2, 3), KL_F32);
    kl_tensor *g = kl_to_device(c, CUDA0);
    assert_null(kl_add(g, c));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_add: expected all tensors on one device, got [2,3] float32 cuda:0 "
                                   "(argument 1) and [2,3] float32 cpu (argument 2)");
    assert_null(kl_mul(c, g));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_mul: expected all tensors on one device, got [2,3] float32 cpu "
                                   "(argument 1) and [2,3] float32 cuda:0 (argument 2)");
    assert_null(kl_where(kl_gt_scalar(c, 0.0), g, g));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "got [2,3] bool cpu (argument 1) and [2,3] float32 cuda:0 (argument 2)");
    /* a 1-element CPU tensor with dims does not join (only 0-dim ones do) */
    assert_null(kl_add(g, kl_ones(KL_SHAPE(1), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "[1] float32 cpu (argument 2)");
    /* a 0-dim CUDA tensor does not join a CPU op */
    assert_null(kl_add(c, kl_to_device(kl_scalar_tensor(1, KL_F32), CUDA0)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "[] float32 cuda:0 (argument 2)");
    /* in place: the destination decides; a 0-dim CPU destination does not join */
    kl_tensor *c0 = kl_scalar_tensor(1, KL_F32);
    assert_null(kl_add_inplace(c0, kl_to_device(c0, CUDA0)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
}

/* An op's CUDA result equals the CPU's, or, without a CUDA kernel, fails
 * naming the op and the device, having touched no device byte from the CPU.
 * (Which ops have kernels grows as the CUDA backend does.) */
static void check_op(const char *name, kl_tensor *cpu, kl_tensor *cuda, double tol) {
    if (!cuda) {
        /* a composite (softmax) fails in the first piece without a kernel (amax) */
        char needle[96];
        snprintf(needle, sizeof needle, "kl_%s: no CUDA kernel for this op (on cuda:0)", name);
        if (!strcmp(name, "softmax") && !strncmp(kl_last_error(), "kl_amax:", 8)) needle[0] = 0;
        KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, needle[0] ? needle : "no CUDA kernel for this op (on cuda:0)");
        return;
    }
    assert_non_null(cpu);
    assert_on_cuda(cuda);
    kl_tensor *h = host(cuda), *hc = host(cpu);
    kt_assert_shape(h, kl_ndim(hc), kl_shape(hc));
    for (int64_t i = 0; i < kl_numel(hc); i++) {
        double a = kt_get(hc, i), b = kt_get(h, i);
        if (!(a == b || (isnan(a) && isnan(b)) || fabs(a - b) <= tol * (1 + fabs(a)))) {
            print_error("%s: element %lld: cpu %.9g cuda %.9g\n", name, (long long)i, a, b);
            fail();
        }
    }
}

static void ops_without_kernels_fail_clearly(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(1);
    kl_tensor *a = kl_randn(KL_SHAPE(4, 5), KL_F32), *b = kl_randn(KL_SHAPE(5, 3), KL_F32);
    kl_tensor *ga = kl_to_device(a, CUDA0), *gb = kl_to_device(b, CUDA0);
    kl_tensor *idx = kl_from_data((int64_t[]){3, 0, 1}, KL_SHAPE(3), KL_I64);
    check_op("exp", kl_exp(a), kl_exp(ga), 0);
    check_op("add", kl_add(a, a), kl_add(ga, ga), 0);
    check_op("mul", kl_mul_scalar(a, 3), kl_mul_scalar(ga, 3), 0);
    check_op("to_dtype", kl_to_dtype(a, KL_F64), kl_to_dtype(ga, KL_F64), 0);
    check_op("sum", kl_sum(a, KL_DIMS(1), false), kl_sum(ga, KL_DIMS(1), false), 1e-6);
    check_op("cumsum", kl_cumsum(a, 1), kl_cumsum(ga, 1), 1e-6);
    check_op("matmul", kl_matmul(a, b), kl_matmul(ga, gb), 1e-5);
    check_op("index_select", kl_index_select(a, 0, idx), kl_index_select(ga, 0, kl_to_device(idx, CUDA0)), 0);
    check_op("softmax", kl_softmax(a, 1), kl_softmax(ga, 1), 1e-6);
    /* a 0-dim CPU tensor joins a CUDA op, in either position */
    kl_tensor *two = kl_scalar_tensor(2, KL_F32);
    check_op("mul", kl_mul(a, two), kl_mul(ga, two), 0);
    check_op("mul", kl_mul(two, a), kl_mul(two, ga), 0);
    /* views need no kernel: they work on CUDA tensors */
    kl_tensor *v = kl_reshape(kl_transpose(ga, 0, 1), KL_SHAPE(20));
    assert_on_cuda(v);
    assert_same_bits(kl_reshape(kl_transpose(a, 0, 1), KL_SHAPE(20)), v);
}

/* The matmul family runs on CUDA (cuBLAS, or the emulated cuBLAS over
 * OpenBLAS): the public ops through the dispatcher, equal to the CPU within
 * f32 GEMM rounding (different summation orders). */
static void matmul_family_on_cuda(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(7);
    kl_tensor *a = kl_randn(KL_SHAPE(4, 5), KL_F32), *b = kl_randn(KL_SHAPE(5, 3), KL_F32);
    kl_tensor *x3 = kl_randn(KL_SHAPE(2, 4, 5), KL_F32), *y3 = kl_randn(KL_SHAPE(2, 5, 3), KL_F32);
    kl_tensor *w = kl_randn(KL_SHAPE(3, 5), KL_F32), *bias = kl_randn(KL_SHAPE(3), KL_F32);
    kl_tensor *ga = kl_to_device(a, CUDA0), *gb = kl_to_device(b, CUDA0), *gx3 = kl_to_device(x3, CUDA0);
    kl_tensor *gy3 = kl_to_device(y3, CUDA0), *gw = kl_to_device(w, CUDA0), *gbias = kl_to_device(bias, CUDA0);
    kl_tensor *r;
    assert_non_null(r = kl_matmul(ga, gb));
    check_op("matmul", kl_matmul(a, b), r, 1e-5);
    assert_non_null(r = kl_matmul(gx3, gb));
    check_op("matmul", kl_matmul(x3, b), r, 1e-5);
    assert_non_null(r = kl_mm(ga, gb));
    check_op("mm", kl_mm(a, b), r, 1e-5);
    assert_non_null(r = kl_bmm(gx3, gy3));
    check_op("bmm", kl_bmm(x3, y3), r, 1e-5);
    /* transposed views are read in place */
    assert_non_null(r = kl_mm(kl_transpose(gb, 0, 1), kl_transpose(ga, 0, 1)));
    check_op("mm", kl_mm(kl_transpose(b, 0, 1), kl_transpose(a, 0, 1)), r, 1e-5);
    assert_non_null(r = kl_addmm(gbias, ga, gb, 0.5, 2.0));
    check_op("addmm", kl_addmm(bias, a, b, 0.5, 2.0), r, 1e-5);
    assert_non_null(r = kl_linear(gx3, gw, gbias));
    check_op("linear", kl_linear(x3, w, bias), r, 1e-5);
    assert_non_null(r = kl_linear(ga, gw, NULL));
    check_op("linear", kl_linear(a, w, NULL), r, 1e-5);
    /* f64 and bf16 too */
    kl_tensor *a64 = kl_to_dtype(a, KL_F64), *b64 = kl_to_dtype(b, KL_F64);
    assert_non_null(r = kl_matmul(kl_to_device(a64, CUDA0), kl_to_device(b64, CUDA0)));
    check_op("matmul", kl_matmul(a64, b64), r, 1e-12);
    kl_tensor *ah = kl_to_dtype(a, KL_BF16), *bh = kl_to_dtype(b, KL_BF16);
    assert_non_null(r = kl_matmul(kl_to_device(ah, CUDA0), kl_to_device(bh, CUDA0)));
    check_op("matmul", kl_matmul(ah, bh), r, 1.6e-2);
    /* bad shapes: the CPU's error, before any GEMM */
    assert_null(kl_mm(ga, ga));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_mm");
    /* integers: cuBLAS has none, a clear error */
    kl_tensor *gi = kl_to_device(kl_ones(KL_SHAPE(2, 2), KL_I32), CUDA0);
    assert_null(kl_matmul(gi, gi));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "cuBLAS has no int32 GEMM");
}

static void item_data_ptr_print_save(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_to_device(kl_from_data((double[]){1.5, -2.25, 7}, KL_SHAPE(3), KL_F64), CUDA0);
    assert_true(kl_item(kl_select(x, 0, 1)) == -2.25);
    kl_tensor *i = kl_to_device(kl_from_data((int64_t[]){9007199254740993LL}, KL_SHAPE(1), KL_I64), CUDA0);
    assert_true(kl_item_int(i) == 9007199254740993LL);
    assert_true(isnan(kl_item(x)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_item: needs a tensor with one element, got [3] float64 cuda:0");
    /* data_ptr: the device address of element [0...], offsets included */
    char *p = kl_data_ptr(x);
    assert_non_null(p);
    assert_ptr_equal(kl_data_ptr(kl_select(x, 0, 2)), p + 16);
    /* printing moves the values to the host */
    char buf[256];
    assert_true(kl_format(x, buf, sizeof buf) > 0);
    assert_string_equal(buf, "tensor([ 1.5000, -2.2500,  7.0000], device='cuda:0', dtype=float64)");
    assert_true(kl_format(kl_empty_on(KL_SHAPE(0), KL_F32, CUDA0), buf, sizeof buf) > 0);
    assert_string_equal(buf, "tensor([], device='cuda:0')");
    /* npy through the host */
    const char *path = kt_tmp_path("cuda.npy");
    kl_tensor *y = kl_transpose(kl_to_device(kl_reshape(kl_arange(0, 6, 1, KL_BF16), KL_SHAPE(2, 3)), CUDA0), 0, 1);
    assert_int_equal(kl_save_npy(path, y), 0);
    kl_tensor *back = kl_load_npy(path);
    assert_non_null(back);
    KT_VALUES(back, 0, 0, 3, 1, 4, 2, 5);
    /* safetensors through the host */
    const char *st = kt_tmp_path("cuda.safetensors");
    assert_int_equal(kl_save_safetensors(st, 2, (const char *[]){"y", "x"}, (kl_tensor *[]){y, x}, NULL), 0);
    kl_safetensors *f = kl_load_safetensors(st);
    assert_non_null(f);
    assert_same_bits(kl_contiguous(y), kl_safetensors_find(f, "y"));
    assert_same_bits(x, kl_safetensors_find(f, "x"));
    kl_safetensors_free(f);
}

/* ---- memory ------------------------------------------------------------------ */

static void allocator_statistics_move_and_return(void **s) {
    (void)s;
    NEED_CUDA();
    kl_cuda_mem_stats s0 = stats();
    kl_scope_begin();
    kl_tensor *a = kl_empty_on(KL_SHAPE(1000), KL_F32, CUDA0);
    assert_on_cuda(a);
    kl_cuda_mem_stats s1 = stats();
    assert_int_equal(s1.allocated_bytes - s0.allocated_bytes, 4096); /* 4000 rounded to 512 B */
    assert_int_equal(s1.num_allocs - s0.num_allocs, 1);
    kl_tensor *v = kl_transpose(kl_reshape(a, KL_SHAPE(10, 100)), 0, 1); /* views take no memory */
    assert_int_equal(stats().allocated_bytes, s1.allocated_bytes);
    kl_tensor *b = kl_contiguous(v);
    assert_on_cuda(b);
    assert_int_equal(stats().allocated_bytes - s1.allocated_bytes, 4096);
    kl_tensor *z = kl_empty_on(KL_SHAPE(0), KL_F32, CUDA0); /* no device memory at all */
    assert_on_cuda(z);
    assert_null(kl_data_ptr(z));
    assert_int_equal(stats().allocated_bytes - s1.allocated_bytes, 4096);
    kl_scope_end();
    kl_cuda_mem_stats s2 = stats();
    assert_int_equal(s2.allocated_bytes, s0.allocated_bytes);
    assert_int_equal(s2.num_frees - s0.num_frees, 2);
    /* a freed block comes back from the cache */
    kl_tensor *c = kl_empty_on(KL_SHAPE(1000), KL_F32, CUDA0);
    assert_on_cuda(c);
    assert_true(stats().cache_hits > s2.cache_hits);
}

static void out_of_memory_then_usable(void **s) {
    (void)s;
    NEED_EMULATOR();
    kl_cuda_empty_cache(0);
    ku_emu_set_capacity(ku_emu_used() + ((size_t)4 << 20));
    kl_tensor *big = kl_empty_on(KL_SHAPE(64, 1024, 1024), KL_F32, CUDA0);
    assert_null(big);
    KT_EXPECT_ERROR(KL_ERR_OOM, "kl_empty: CUDA out of memory. Tried to allocate 256.00 MiB on device 0");
    kl_tensor *h = kl_zeros(KL_SHAPE(2, 1024, 1024), KL_F32);
    assert_null(kl_to_device(h, CUDA0));
    KT_EXPECT_ERROR(KL_ERR_OOM, "CUDA out of memory");
    kl_set_default_device(CUDA0);
    assert_null(kl_randn(KL_SHAPE(2, 1024, 1024), KL_F32));
    KT_EXPECT_ERROR(KL_ERR_OOM, "kl_randn: CUDA out of memory");
    kl_set_default_device(KL_DEVICE_CPU);
    /* small ones still fit; and with the capacity back, everything works */
    kl_tensor *small = kl_to_device(kl_ones(KL_SHAPE(100), KL_F32), CUDA0);
    assert_on_cuda(small);
    ku_emu_set_capacity((size_t)1 << 30);
    kl_tensor *g = kl_to_device(h, CUDA0);
    assert_on_cuda(g);
    assert_same_bits(h, g);
    assert_true(stats().num_ooms >= 3);
}

/* ---- DLPack ------------------------------------------------------------------- */

static int foreign_deleted;
static void foreign_delete(DLManagedTensor *m) {
    ku_free(OP, (CUdeviceptr)(uintptr_t)m->dl_tensor.data);
    foreign_deleted++;
    free(m);
}

static void dlpack_kdlcuda_round_trip(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_reshape(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4));
    kl_tensor *g = kl_transpose(kl_to_device(x, CUDA0), 0, 1);
    DLManagedTensor *m = kl_to_dlpack(kl_slice(g, 0, 1, 4, 1));
    assert_non_null(m);
    assert_int_equal(m->dl_tensor.device.device_type, kDLCUDA);
    assert_int_equal(m->dl_tensor.device.device_id, 0);
    assert_ptr_equal(m->dl_tensor.data, (char *)kl_data_ptr(g) + 4); /* row 1 of the transpose */
    assert_int_equal(m->dl_tensor.strides[0], 1);
    assert_int_equal(m->dl_tensor.strides[1], 4);
    /* import: the same device memory, zero-copy */
    kl_tensor *y = kl_from_dlpack(m);
    assert_on_cuda(y);
    assert_ptr_equal(kl_data_ptr(y), (char *)kl_data_ptr(g) + 4);
    assert_same_bits(kl_slice(kl_transpose(x, 0, 1), 0, 1, 4, 1), y);
    assert_non_null(kl_fill_inplace(y, -1)); /* writes through to g's storage */
    KT_VALUES(host(kl_select(g, 1, 2)), 0, 8, -1, -1, -1);

    /* memory that is not the allocator's: freed by the producer's deleter only */
    kl_cuda_mem_stats s0 = stats();
    CUdeviceptr p = ku_malloc(OP, 0, 24, ku_current_stream(0));
    assert_true(p != 0);
    DLManagedTensor *f = calloc(1, sizeof *f);
    static int64_t shape[1] = {6};
    f->dl_tensor = (DLTensor){.data = (void *)(uintptr_t)p, .device = {kDLCUDA, 0}, .ndim = 1,
                              .dtype = {kDLFloat, 32, 1}, .shape = shape};
    f->deleter = foreign_delete;
    foreign_deleted = 0;
    kl_scope_begin();
    kl_tensor *t = kl_from_dlpack(f);
    assert_on_cuda(t);
    assert_non_null(kl_copy_inplace(t, kl_arange(0, 6, 1, KL_F32)));
    KT_VALUES(host(kl_mul_scalar(host(t), 2)), 0, 0, 2, 4, 6, 8, 10);
    kl_scope_end();
    assert_int_equal(foreign_deleted, 1);
    assert_int_equal(stats().allocated_bytes, s0.allocated_bytes);
    /* a bad device id fails, and the caller keeps the managed tensor */
    DLManagedTensor bad = {.dl_tensor = {.data = NULL, .device = {kDLCUDA, 7}, .ndim = 1, .dtype = {kDLFloat, 32, 1},
                                         .shape = shape}};
    assert_null(kl_from_dlpack(&bad));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_from_dlpack: CUDA device 7 does not exist");
}

/* ---- autograd ------------------------------------------------------------------ */

static kl_tensor *via_cuda(void *user, int n, kl_tensor *const *in) {
    (void)user, (void)n;
    kl_tensor *g = kl_to_device(in[0], CUDA0);
    kl_tensor *back = kl_to_device(kl_transpose(g, 0, 1), KL_DEVICE_CPU);
    return kl_mul(back, kl_transpose(in[0], 0, 1));
}

static void autograd_through_moves(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(2);
    kl_tensor *x = kl_randn(KL_SHAPE(3, 4), KL_F64);
    kl_set_requires_grad(x, true);
    kl_tensor *g = kl_to_device(x, CUDA0);
    assert_true(kl_requires_grad(g));
    kl_tensor *y = kl_sum(kl_mul_scalar(kl_to_device(g, KL_DEVICE_CPU), 3), KL_DIMS(0, 1), false);
    assert_int_equal(kl_backward(y, NULL, NULL), 0);
    assert_non_null(kl_grad(x));
    assert_int_equal(kl_device_of(kl_grad(x)).type, KL_CPU);
    KT_VALUES(kl_grad(x), 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3);
    kl_gradcheck_options o = kl_gradcheck_options_default();
    kl_tensor *in[1] = {x};
    assert_int_equal(kl_gradcheck(via_cuda, NULL, 1, in, &o), 1);
}

/* ---- threads --------------------------------------------------------------------- */

static void *thread_body(void *arg) {
    intptr_t k = (intptr_t)arg;
    int ok = 1;
    kl_scope_begin();
    for (int it = 0; it < 50 && ok; it++) {
        int64_t n = 1 + (k * 131 + it * 17) % 3000;
        kl_tensor *x = kl_arange((double)k, (double)k + (double)n, 1, KL_F64);
        kl_tensor *g = kl_to_device(x, CUDA0);
        kl_tensor *c = kl_clone(kl_slice(g, 0, 0, n, 2));
        kl_tensor *h = kl_to_device(c, KL_DEVICE_CPU);
        if (!h || kl_numel(h) != (n + 1) / 2) ok = 0;
        for (int64_t i = 0; ok && i < kl_numel(h); i++)
            if (((const double *)kl_data_ptr(h))[i] != (double)k + 2.0 * (double)i) ok = 0;
        kl_scope_end();
        kl_scope_begin();
    }
    kl_scope_end();
    return (void *)(intptr_t)ok;
}

static void threads_make_cuda_tensors(void **s) {
    (void)s;
    NEED_CUDA();
    pthread_t th[6];
    for (intptr_t k = 0; k < 6; k++) assert_int_equal(pthread_create(&th[k], NULL, thread_body, (void *)k), 0);
    for (int k = 0; k < 6; k++) {
        void *r;
        pthread_join(th[k], &r);
        assert_int_equal((intptr_t)r, 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        T(no_cuda_errors),
        T(round_trip_every_dtype),
        T(non_contiguous_sources),
        T(copy_across_devices),
        T(creation_ops_equal_cpu_bitwise),
        T(mixed_device_errors_name_both),
        T(ops_without_kernels_fail_clearly),
        T(matmul_family_on_cuda),
        T(item_data_ptr_print_save),
        T(allocator_statistics_move_and_return),
        T(out_of_memory_then_usable),
        T(dlpack_kdlcuda_round_trip),
        T(autograd_through_moves),
        T(threads_make_cuda_tensors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
