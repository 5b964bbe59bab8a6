/*
 * test_cuda_compile.c — kl_compile of functions over CUDA tensors: the fused
 * kernels are generated as CUDA C (cn_emit.c), loaded by the nvrtc backend
 * (ku_module_get) and launched (ku_launch); unfused ops (matmul) dispatch to
 * the eager CUDA kernels. Each function is compiled twice, once called with
 * CPU tensors and once with the same values on cuda:0, and the results
 * compared: bitwise for elementwise chains (same formulas, no contraction),
 * within 1e-5 relative for row reductions (a tree fold on the device, the
 * CPU's cascade on the host) and matmul (cuBLAS vs the CPU's BLAS). Both
 * graphs must have the same kernel count. Runs on the emulated device in CI
 * (test_cuda_compile_emu); without a device every test skips with the reason.
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"
#include "../src/codegen_nvrtc/cuda_api.h"

static const char *OP = "cuda_compile_test";



/* The emulated device needs a host C++ compiler for its modules. */
static void skip_without_module_compiler(void) {
    if (strstr(kl_last_error(), "no host C++ compiler")) {
        print_message("skipped: %s\n", kl_last_error());
        kl_clear_error();
        skip();
    }
}

/* 0 where the two graphs may differ: a move between devices is a node on
 * CUDA and an alias on the CPU, and only CPU constants fold. */
static int same_kernel_count = 1;

/* Compiles fn twice, calls one with in[] (CPU) and the other with in[]
 * moved to cuda:0, twice each; compares the outputs (tol 0: bitwise, NaN
 * where the CPU has NaN) and the kernel counts. Returns the kernel count. */
static int64_t cpu_vs_cuda(kl_traceable fn, kl_tensor **in, int n_in, int n_out, double tol) {
    kl_tensor *ref[4] = {0}, *got[4] = {0}, *din[8];
    for (int i = 0; i < n_in; i++) {
        din[i] = kl_to_device(in[i], CUDA0);
        assert_non_null(din[i]);
    }
    kl_fn *fc = kl_compile(fn, NULL, NULL), *fg = kl_compile(fn, NULL, NULL);
    assert_non_null(fc);
    assert_non_null(fg);
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(fc, in, n_in, ref, n_out), 0);
        int rc = kl_fn_call(fg, din, n_in, got, n_out);
        if (rc) {
            skip_without_module_compiler();
            print_error("CUDA call: %s\n", kl_last_error());
        }
        assert_int_equal(rc, 0);
        for (int j = 0; j < n_out; j++) {
            assert_non_null(got[j]);
            assert_int_equal(kl_device_of(got[j]).type, KL_CUDA);
            kl_tensor *h = host(got[j]);
            assert_int_equal(kl_dtype_of(h), kl_dtype_of(ref[j]));
            kt_assert_shape(h, kl_ndim(ref[j]), kl_shape(ref[j]));
            int ok = tol == 0 ? kl_allclose(h, ref[j], 0, 0, true)
                              : kl_allclose(kl_to_dtype(h, KL_F64), kl_to_dtype(ref[j], KL_F64), tol, tol, true);
            if (ok != 1) {
                for (int64_t i = 0; i < kl_numel(h); i++)
                    if (kt_get(h, i) != kt_get(ref[j], i)) {
                        print_error("output %d element %lld: cuda %.9g cpu %.9g\n", j, (long long)i, kt_get(h, i),
                                    kt_get(ref[j], i));
                        break;
                    }
            }
            assert_int_equal(ok, 1);
        }
    }
    kl_fn_stats sc, sg;
    assert_int_equal(kl_fn_get_stats(fc, &sc), 0);
    assert_int_equal(kl_fn_get_stats(fg, &sg), 0);
    assert_int_equal(sg.eager_calls, 0);
    if (same_kernel_count) assert_int_equal(sg.kernels, sc.kernels);
    kl_fn_release(fc);
    kl_fn_release(fg);
    return sg.kernels;
}

/* ---- functions ---------------------------------------------------------------------- */

/* y = exp(relu(x * w + 1)) - x: 5 elementwise ops, one kernel */
static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub(kl_exp(kl_relu(kl_add_scalar(kl_mul(in[0], in[1]), 1))), in[0]);
    return out[0] ? 0 : -1;
}
static int gelu(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_gelu(kl_add(in[0], in[1]));
    return out[0] ? 0 : -1;
}
/* tanh GELU spelled out: 8 ops, one kernel */
static int gelu_tanh_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *inner = kl_mul_scalar(kl_add(x, kl_mul_scalar(kl_mul(kl_mul(x, x), x), 0.044715)), 0.7978845608);
    out[0] = kl_mul(kl_mul_scalar(x, 0.5), kl_add_scalar(kl_tanh(inner), 1));
    return out[0] ? 0 : -1;
}
static int softmax(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}
static int softmax_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *e = kl_exp(kl_sub(x, kl_amax(x, KL_DIMS(-1), true)));
    out[0] = kl_div(e, kl_sum(e, KL_DIMS(-1), true));
    return out[0] ? 0 : -1;
}
/* layer norm from mean and centred second moment (what a row kernel folds) */
static int layer_norm_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *c = kl_sub(x, kl_mean(x, KL_DIMS(-1), true));
    kl_tensor *var = kl_mean(kl_mul(c, c), KL_DIMS(-1), true);
    out[0] = kl_add(kl_mul(kl_div(c, kl_sqrt(kl_add_scalar(var, 1e-5))), in[1]), in[2]);
    return out[0] ? 0 : -1;
}
/* an MLP layer: matmul (cuBLAS) + bias + relu (one kernel) */
static int mlp_layer(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_relu(kl_add(kl_matmul(in[0], in[1]), in[2]));
    return out[0] ? 0 : -1;
}
static int int_rem(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_add_scalar(kl_remainder(kl_mul(in[0], in[0]), in[1]), 1);
    return out[0] ? 0 : -1;
}
/* a 0-dim CPU tensor joining a CUDA function */
static int scale_by(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_exp(kl_mul(in[0], in[1]));
    return out[0] ? 0 : -1;
}

/* ---- tests -------------------------------------------------------------------------- */

/* A class table made on the CPU and sent to the labels' device, as a user
 * (and cross_entropy's derivative) writes it: kl_device_of of a traced
 * value answers its real device, and the move is a node of the graph. */
static int one_hot_by_device_of(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *classes = kl_to_device(kl_arange(0, 5, 1, KL_I64), kl_device_of(in[1]));
    kl_tensor *hit = kl_to_dtype(kl_eq(kl_unsqueeze(in[1], 1), classes), KL_F32);
    kl_tensor *bias = kl_zeros_like(in[0]); /* created on in[0]'s device */
    out[0] = kl_sum(kl_add(kl_mul(hit, in[0]), bias), KL_DIMS(1), false);
    return out[0] ? 0 : -1;
}
/* cross-entropy's gradient inside the compiled function (the digits step's
 * shape): its derivative builds the one-hot table on the logits' device */
static int xent_grad(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *w = kl_detach(in[0]);
    if (!w || kl_set_requires_grad(w, true) < 0) return -1;
    kl_tensor *loss = kl_cross_entropy(kl_mul_scalar(w, 2), in[1], KL_REDUCE_MEAN, 0);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 1, &w, out, NULL) < 0) return -1;
    return 0;
}

/* d/dx of sum(max_pool(relu(batch_norm(x))) * y): batch_norm_backward and
 * max_pool2d_backward, composites the CPU keeps whole (KE_F_KEEP_CPU) */
static int bn_pool_grad(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = kl_detach(in[0]);
    if (!x || kl_set_requires_grad(x, true) < 0) return -1;
    kl_pool2d_options po = kl_pool2d_options_default(2);
    kl_tensor *h = kl_max_pool2d(kl_relu(kl_batch_norm(x, NULL, NULL, in[1], NULL, true, 0.1, 1e-5)), &po);
    kl_tensor *loss = kl_sum(kl_mul(h, in[2]), KL_ALL_DIMS, false);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 1, &x, out, NULL) < 0) return -1;
    return 0;
}

/* The CPU's fused-composite rule is the CPU's: on CUDA the two backward
 * composites decompose into kernels (no CPU kernel to keep), and agree with
 * the CPU graph, which kept them whole. */
static void cpu_kept_composites_decompose_on_cuda(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(8);
    kl_tensor *in[3] = {kl_randn(KL_SHAPE(2, 3, 4, 4), KL_F32), kl_add_scalar(kl_rand(KL_SHAPE(3), KL_F32), 0.5),
                        kl_randn(KL_SHAPE(2, 3, 2, 2), KL_F32)};
    same_kernel_count = 0;
    assert_true(cpu_vs_cuda(bn_pool_grad, in, 3, 1, 1e-5) >= 1);
    same_kernel_count = 1;
    kl_tensor *din[3], *out = NULL;
    for (int i = 0; i < 3; i++) din[i] = kl_to_device(in[i], CUDA0);
    kl_fn *f = kl_compile(bn_pool_grad, NULL, NULL);
    int rc = kl_fn_call(f, din, 3, &out, 1);
    if (rc) skip_without_module_compiler();
    assert_int_equal(rc, 0);
    static char text[65536];
    assert_true(kl_fn_graph_text(f, text, sizeof text) > 0);
    assert_null(strstr(text, "batch_norm_backward("));
    assert_null(strstr(text, "max_pool2d_backward("));
    kl_fn_release(f);
}

static void device_of_traced_values(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_reshape(seq(20, 0.25, KL_F32), KL_SHAPE(4, 5));
    kl_tensor *t = kl_from_data((int64_t[]){3, 0, 4, 1}, KL_SHAPE(4), KL_I64);
    same_kernel_count = 0;
    assert_true(cpu_vs_cuda(one_hot_by_device_of, (kl_tensor *[]){x, t}, 2, 1, 0) >= 1);
    assert_true(cpu_vs_cuda(xent_grad, (kl_tensor *[]){x, t}, 2, 1, 1e-6) >= 1);
    same_kernel_count = 1;
}

static void elementwise_chains_bitwise(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_reshape(seq(35, 0.37, KL_F32), KL_SHAPE(5, 7)), *w = seq(7, 0.5, KL_F32);
    assert_int_equal(cpu_vs_cuda(chain, (kl_tensor *[]){x, w}, 2, 1, 0), 1);
    /* a transposed f64 input, broadcast operand */
    kl_tensor *xt = kl_transpose(kl_reshape(seq(35, 0.1, KL_F64), KL_SHAPE(7, 5)), 0, 1);
    /* (exp in f64 is each device's libm: a GPU's may differ in the last bits, docs/GPU.md) */
    const double f64_libm = kt_cuda_emulated(OP) ? 0 : 4.5e-16;
    assert_int_equal(cpu_vs_cuda(chain, (kl_tensor *[]){xt, kl_ones(KL_SHAPE(7), KL_F64)}, 2, 1, f64_libm), 1);
    /* f16 and bf16 storage */
    assert_int_equal(cpu_vs_cuda(chain, (kl_tensor *[]){kl_to_dtype(x, KL_F16), kl_to_dtype(w, KL_BF16)}, 2, 1, 0), 1);
    /* long enough for the 16-byte path, with a tail */
    kl_tensor *big = kl_reshape(seq(3 * 1031, 0.003, KL_F32), KL_SHAPE(3, 1031));
    assert_int_equal(cpu_vs_cuda(chain, (kl_tensor *[]){big, big}, 2, 1, 0), 1);
    assert_int_equal(cpu_vs_cuda(gelu, (kl_tensor *[]){x, w}, 2, 1, 0), 1);
    assert_int_equal(cpu_vs_cuda(gelu_tanh_ops, (kl_tensor *[]){x}, 1, 1, 0), 1);
    assert_true(cpu_vs_cuda(kt_two_outputs, (kl_tensor *[]){x, w}, 2, 2, 0) >= 1);
    kl_tensor *two = kl_scalar_tensor(2, KL_F32);
    assert_int_equal(cpu_vs_cuda(scale_by, (kl_tensor *[]){x, two}, 2, 1, 0), 1);
}

static void integers_and_errors(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *a = kl_to_dtype(seq(12, 3, KL_F64), KL_I32), *b = kl_to_dtype(seq(12, -2, KL_F64), KL_I64);
    assert_true(cpu_vs_cuda(kt_int_ops, (kl_tensor *[]){a, b}, 2, 1, 0) >= 1);
    /* x % 0: the CPU's error, from the device's status word */
    kl_tensor *z = kl_to_dtype(seq(6, 1, KL_F64), KL_I32); /* -3 .. 2: one zero */
    kl_tensor *x = kl_to_dtype(seq(6, 5, KL_F64), KL_I32);
    kl_fn *f = kl_compile(int_rem, NULL, NULL);
    kl_tensor *out = NULL;
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){x, z}, 2, &out, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    kl_fn *g = kl_compile(int_rem, NULL, NULL);
    int rc = kl_fn_call(g, (kl_tensor *[]){kl_to_device(x, CUDA0), kl_to_device(z, CUDA0)}, 2, &out, 1);
    if (rc) skip_without_module_compiler();
    assert_int_equal(rc, -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    /* and without a zero it runs, equal to the CPU */
    kl_tensor *nz = kl_add_scalar(kl_abs(z), 1);
    assert_int_equal(cpu_vs_cuda(int_rem, (kl_tensor *[]){x, nz}, 2, 1, 0), 1);
    kl_fn_release(f);
    kl_fn_release(g);
}

static void row_reductions_within_tolerance(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(3);
    kl_tensor *x = kl_randn(KL_SHAPE(6, 37), KL_F32);
    assert_int_equal(cpu_vs_cuda(softmax_ops, (kl_tensor *[]){x}, 1, 1, 1e-5), 1);
    assert_int_equal(cpu_vs_cuda(softmax, (kl_tensor *[]){x}, 1, 1, 1e-5), 1);
    /* long rows: 256 threads a row */
    kl_tensor *l = kl_randn(KL_SHAPE(3, 2500), KL_F32);
    assert_int_equal(cpu_vs_cuda(softmax, (kl_tensor *[]){l}, 1, 1, 1e-5), 1);
    kl_tensor *w = kl_randn(KL_SHAPE(37), KL_F32), *b = kl_randn(KL_SHAPE(37), KL_F32);
    assert_true(cpu_vs_cuda(layer_norm_ops, (kl_tensor *[]){x, w, b}, 3, 1, 1e-5) >= 1);
    /* rows held in registers (up to CN_ROW_KR_MAX * CN_ROW_MAX_THREADS) and one past that */
    const int64_t lim = (int64_t)CN_ROW_KR_MAX * CN_ROW_MAX_THREADS;
    for (int64_t len = lim; len <= lim + 1; len++) {
        kl_tensor *xl = kl_randn(KL_SHAPE(2, len), KL_F32);
        kl_tensor *wl = kl_randn(KL_SHAPE(len), KL_F32), *bl = kl_randn(KL_SHAPE(len), KL_F32);
        assert_int_equal(cpu_vs_cuda(softmax_ops, (kl_tensor *[]){xl}, 1, 1, 1e-5), 1);
        assert_true(cpu_vs_cuda(layer_norm_ops, (kl_tensor *[]){xl, wl, bl}, 3, 1, 1e-5) >= 1);
    }
}

/* The data-movement ops with CUDA kernels of their own (cn_join.c,
 * cn_index.c's scatter, cn_sort.c, cn_conv.c's pooling) are graph nodes
 * under kl_compile, between fused elementwise kernels. */
static int joins(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = kl_add_scalar(kl_mul_scalar(in[0], 2), 1); /* a kernel first */
    kl_tensor *a = kl_cat(2, (kl_tensor *[]){x, kl_flip(x, 1, (int64_t[]){1})}, 0);
    kl_tensor *b = kl_pad_ex(a, 2, (int64_t[]){1, 2}, KL_PAD_REFLECT, 0);
    kl_tensor *c = kl_pad(kl_repeat(b, 2, (int64_t[]){1, 2}), 4, (int64_t[]){0, 1, 2, 0}, -3.5);
    kl_tensor *d = kl_roll(kl_tril(c, 1), 1, (int64_t[]){3}, (int64_t[]){1});
    out[0] = kl_sub_scalar(kl_stack(2, (kl_tensor *[]){d, kl_triu(d, -2)}, 1), 0.5);
    return out[0] ? 0 : -1;
}
static int scatter_sort(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = kl_exp(kl_mul_scalar(in[0], 0.5)), *vals = NULL, *idx = NULL, *tv = NULL, *ti = NULL;
    kl_tensor *s = kl_scatter(x, 1, in[1], kl_neg(in[2]));
    if (kl_sort(s, 1, true, true, &vals, &idx) || kl_topk(s, 3, 0, false, true, &tv, &ti)) return -1;
    out[0] = kl_add_scalar(vals, 1);
    out[1] = idx;
    out[2] = kl_mul(tv, tv);
    out[3] = ti;
    return 0;
}
static int pooling(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_pool2d_options o = kl_pool2d_options_default(2);
    o.padding[0] = o.padding[1] = 1;
    out[0] = kl_relu(kl_max_pool2d(kl_sub_scalar(in[0], 0.25), &o));
    return out[0] ? 0 : -1;
}

/* fn eagerly on CUDA tensors equals fn eagerly on the CPU, byte for byte,
 * and cpu_vs_cuda (compiled on both) holds too: compiled CUDA, compiled
 * CPU and eager on both devices give the same bytes. */
static void compiled_and_eager_bitwise(kl_traceable fn, kl_tensor **in, int n_in, int n_out) {
    kl_scope_begin();
    kl_tensor *din[8], *ref[4] = {0}, *got[4] = {0};
    for (int i = 0; i < n_in; i++) din[i] = kl_to_device(in[i], CUDA0);
    assert_int_equal(fn(NULL, in, n_in, ref, n_out), 0);
    int rc = fn(NULL, din, n_in, got, n_out);
    if (rc) print_error("eager on CUDA: %s\n", kl_last_error());
    assert_int_equal(rc, 0);
    for (int j = 0; j < n_out; j++) assert_int_equal(kl_allclose(host(got[j]), ref[j], 0, 0, true), 1);
    kl_scope_end();
    assert_true(cpu_vs_cuda(fn, in, n_in, n_out, 0) >= 2);
}

static void data_movement_ops_compiled(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(8);
    kl_tensor *x = kl_randn(KL_SHAPE(4, 6), KL_F32);
    compiled_and_eager_bitwise(joins, (kl_tensor *[]){x}, 1, 1);
    /* scatter's index: a permutation per row (no duplicates: the last write is the same everywhere) */
    kl_tensor *idx = kl_from_data((int64_t[]){5, 0, 3, 1, 2, 4, 0, 1, 2, 3, 4, 5}, KL_SHAPE(4, 3), KL_I64);
    kl_tensor *src = kl_randn(KL_SHAPE(4, 3), KL_F32);
    compiled_and_eager_bitwise(scatter_sort, (kl_tensor *[]){x, idx, src}, 3, 4);
    kl_tensor *img = kl_randn(KL_SHAPE(2, 3, 7, 6), KL_F32);
    compiled_and_eager_bitwise(pooling, (kl_tensor *[]){img}, 1, 1);
}

/* ---- every op family, one op at a time ------------------------------------------------ */

/* The inputs every one-op function reads (ops_inputs): x [4,6] f32; a gather
 * index [4,2]; an index_select / embedding index [3]; a scatter source
 * [4,2] (gather and scatter: row 1 names one element twice, the last write
 * wins on both devices); class weights [6]; class targets [4] (one of them 1,
 * the ignored class of nll); x rounded to halves [4,6] (ties for argmax and sort); an
 * image [2,3,5,5] and a conv2d weight [4,3,3,3]. */
enum { OPS_IN = 9 };
static void ops_inputs(kl_tensor **in) {
    kl_manual_seed(21);
    in[0] = kl_randn(KL_SHAPE(4, 6), KL_F32);
    in[1] = kl_from_data((int64_t[]){0, 5, 1, 1, 2, 3, 4, 0}, KL_SHAPE(4, 2), KL_I64);
    in[2] = kl_from_data((int64_t[]){3, 0, 2}, KL_SHAPE(3), KL_I64);
    in[3] = kl_randn(KL_SHAPE(4, 2), KL_F32);
    in[4] = kl_add_scalar(kl_rand(KL_SHAPE(6), KL_F32), 0.5);
    in[5] = kl_from_data((int64_t[]){1, 5, 0, 3}, KL_SHAPE(4), KL_I64);
    in[6] = kl_mul_scalar(kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(4, 6), KL_F32), 2)), 0.5);
    in[7] = kl_randn(KL_SHAPE(2, 3, 5, 5), KL_F32);
    in[8] = kl_mul_scalar(kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32), 0.3);
}

/* an elementwise kernel in front of the op, so the op reads a kernel's output */
static kl_tensor *pre(kl_tensor *x) { return kl_add_scalar(kl_mul_scalar(x, 1.5), 0.25); }
#define OPFN(name, body)                                                                             \
    static int name(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {       \
        (void)u, (void)n_in, (void)n_out;                                                        \
        kl_tensor *h = pre(in[0]), *hr = kl_mul_scalar(in[6], 2);                                \
        (void)h, (void)hr;                                                                       \
        body;                                                                                    \
        for (int i = 0; i < n_out; i++)                                                          \
            if (!out[i]) return -1;                                                              \
        return 0;                                                                                \
    }
#define D1(d) 1, (int64_t[]){d}
/* the two-pass reductions over the last dim, kept: one fused row kernel with their neighbours */
OPFN(op_var_row, out[0] = kl_div(kl_sub(h, kl_mean(h, D1(-1), true)), kl_sqrt(kl_add_scalar(kl_var(h, D1(-1), 1, true), 1e-5))))
OPFN(op_std_row, out[0] = kl_mul_scalar(kl_std(h, D1(1), 0, true), 2); out[1] = kl_var(kl_exp(h), D1(-1), 2, true))
OPFN(op_lse_row, out[0] = kl_sub(h, kl_logsumexp(h, D1(-1), true)))
/* ... over other dims: graph nodes running the eager CUDA reductions */
OPFN(op_var_dims, out[0] = kl_var(h, D1(0), 1, false); out[1] = kl_std(h, 0, NULL, 1, false);
     out[2] = kl_logsumexp(h, D1(0), false))
OPFN(op_norms, out[0] = kl_norm(h, 2, D1(-1), true); out[1] = kl_norm(h, 1, D1(0), false);
     out[2] = kl_norm(h, INFINITY, 0, NULL, false); out[3] = kl_norm(h, 3, D1(-1), false))
OPFN(op_argmax, out[0] = kl_argmax(hr, 1, false); out[1] = kl_argmin(hr, KL_DIM_NONE, false);
     out[2] = kl_argmax(hr, 0, true))
OPFN(op_max_dim, if (kl_max_dim(hr, 1, true, &out[0], &out[1]) || kl_min_dim(hr, 0, false, &out[2], &out[3])) return -1;
     out[0] = kl_add_scalar(out[0], 1))
OPFN(op_gather, out[0] = kl_gather(h, 1, in[1]); out[1] = kl_take_along_dim(h, in[1], 1);
     out[2] = kl_mul_scalar(kl_gather(h, 1, in[1]), 3))
OPFN(op_index_select, out[0] = kl_index_select(h, 1, in[2]); out[1] = kl_embedding(h, in[2]);
     out[2] = kl_index_select(h, 0, in[2]))
OPFN(op_scatter, out[0] = kl_scatter_add(h, 1, in[1], in[3]);
     kl_tensor *c = kl_clone(h); out[1] = kl_scatter_add_inplace(c, 1, in[1], kl_exp(in[3]));
     out[2] = kl_scatter(h, 1, in[1], in[3]))
OPFN(op_one_hot, out[0] = kl_one_hot(in[5], 6); out[1] = kl_mul(kl_to_dtype(kl_one_hot(in[5], 6), KL_F32), h))
OPFN(op_losses, kl_cross_entropy_options o = kl_cross_entropy_options_default(); o.weight = in[4];
     out[0] = kl_cross_entropy_ex(h, in[5], &o); o.ignore_index = 1; o.reduction = KL_REDUCE_SUM;
     out[1] = kl_nll_loss_ex(kl_log_softmax(h, 1), in[5], &o); o.reduction = KL_REDUCE_NONE;
     out[2] = kl_cross_entropy_ex(h, in[5], &o))
OPFN(op_joins, out[0] = kl_cat(2, (kl_tensor *[]){h, hr}, 0); out[1] = kl_stack(2, (kl_tensor *[]){h, hr}, 1);
     out[2] = kl_roll(h, 1, (int64_t[]){2}, (int64_t[]){1}); out[3] = kl_repeat(h, 2, (int64_t[]){2, 1}))
OPFN(op_pads, out[0] = kl_pad(h, 2, (int64_t[]){1, 2}, -1.5);
     out[1] = kl_pad_ex(kl_unsqueeze(h, 0), 2, (int64_t[]){2, 1}, KL_PAD_REFLECT, 0);
     out[2] = kl_flip(h, 2, (int64_t[]){0, 1}); out[3] = kl_add(kl_tril(h, 1), kl_triu(hr, -1)))
OPFN(op_sorts, if (kl_sort(hr, 1, true, true, &out[0], &out[1]) || kl_topk(hr, 3, 0, false, true, &out[2], &out[3])) return -1;
     out[4] = kl_argsort(h, 0, false, true))
OPFN(op_scans, out[0] = kl_cumsum(h, 1); out[1] = kl_cumprod(kl_mul_scalar(h, 0.5), 0))
OPFN(op_conv_pool, kl_conv2d_options co = kl_conv2d_options_default(); co.padding[0] = co.padding[1] = 1;
     kl_pool2d_options po = kl_pool2d_options_default(2);
     kl_tensor *c = kl_relu(kl_conv2d(pre(in[7]), in[8], NULL, &co));
     out[0] = kl_max_pool2d(c, &po); out[1] = kl_avg_pool2d(c, &po))

/* One row per op family (docs/GPU.md "What runs on CUDA", compile column).
 * fuse_tol: FUSE mode against eager CUDA (0: bitwise); TRACE_ONLY and
 * NO_FUSE run every node through the dispatcher, so they give eager CUDA's
 * bits. fuse_kernels: launches of the FUSE graph when pinned (> 0), with no
 * library call among them: the op became part of a generated kernel. */
static const struct op_case {
    const char *name;
    kl_traceable fn;
    int n_out;
    double fuse_tol;
    int fuse_kernels;
} op_cases[] = {
    {"var (row kernel)", op_var_row, 1, 1e-5, 1},
    {"std (row kernel)", op_std_row, 2, 1e-5, 1},
    {"logsumexp (row kernel)", op_lse_row, 1, 1e-5, 1},
    {"var, std, logsumexp over other dims", op_var_dims, 3, 0, 0},
    {"norm", op_norms, 4, 0, 0},
    {"argmax, argmin", op_argmax, 3, 0, 0},
    {"max_dim, min_dim", op_max_dim, 4, 0, 0},
    {"gather, take_along_dim", op_gather, 3, 0, 0},
    {"index_select, embedding", op_index_select, 3, 0, 0},
    {"scatter_add, scatter", op_scatter, 3, 0, 0},
    {"one_hot", op_one_hot, 2, 0, 0},
    {"cross_entropy, nll_loss with class weights", op_losses, 3, 1e-5, 0},
    {"cat, stack, roll, repeat", op_joins, 4, 0, 0},
    {"pad, flip, tril, triu", op_pads, 4, 0, 0},
    {"sort, topk, argsort", op_sorts, 5, 0, 0},
    {"cumsum, cumprod", op_scans, 2, 0, 0},
    {"conv2d, max_pool2d, avg_pool2d", op_conv_pool, 2, 0, 0},
};

/* got (CUDA) against want (CUDA or CPU): tol 0 the same bytes (NaN where NaN), else within tol relative. */
static void expect_equal(const char *what, const char *mode, int j, kl_tensor *got, kl_tensor *want, double tol) {
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    kl_tensor *h = host(got), *w = host(want);
    assert_int_equal(kl_dtype_of(h), kl_dtype_of(w));
    kt_assert_shape(h, kl_ndim(w), kl_shape(w));
    int ok = tol == 0 ? kl_allclose(h, w, 0, 0, true) : kl_allclose(kl_to_dtype(h, KL_F64), kl_to_dtype(w, KL_F64), tol, tol, true);
    if (ok != 1)
        for (int64_t i = 0; i < kl_numel(h); i++)
            if (kt_get(h, i) != kt_get(w, i)) {
                print_error("%s, %s, output %d element %lld: compiled %.9g, eager %.9g\n", what, mode, j, (long long)i,
                            kt_get(h, i), kt_get(w, i));
                break;
            }
    assert_int_equal(ok, 1);
}

static void every_op_family_compiles(void **s) {
    (void)s;
    NEED_CUDA();
    static const kl_compile_mode modes[] = {KL_COMPILE_TRACE_ONLY, KL_COMPILE_NO_FUSE, KL_COMPILE_FUSE};
    static const char *const mode_names[] = {"TRACE_ONLY", "NO_FUSE", "FUSE"};
    for (size_t c = 0; c < sizeof op_cases / sizeof *op_cases; c++) {
        const struct op_case *oc = &op_cases[c];
        kl_scope_begin();
        kl_tensor *in[OPS_IN], *din[OPS_IN], *ref[6] = {0}, *cpu[6] = {0};
        ops_inputs(in);
        for (int i = 0; i < OPS_IN; i++) din[i] = kl_to_device(in[i], CUDA0);
        int rc = oc->fn(NULL, din, OPS_IN, ref, oc->n_out);
        if (rc) print_error("%s eagerly on CUDA: %s\n", oc->name, kl_last_error());
        assert_int_equal(rc, 0);
        /* eager CUDA against eager CPU, loosely: the reference itself is sound */
        assert_int_equal(oc->fn(NULL, in, OPS_IN, cpu, oc->n_out), 0);
        for (int j = 0; j < oc->n_out; j++) expect_equal(oc->name, "eager CPU", j, ref[j], cpu[j], 1e-5);
        for (int m = 0; m < 3; m++) {
            kl_compile_options o = kl_compile_options_default();
            o.mode = modes[m];
            kl_fn *f = kl_compile(oc->fn, NULL, &o);
            assert_non_null(f);
            for (int call = 0; call < 2; call++) {
                kl_tensor *got[6] = {0};
                rc = kl_fn_call(f, din, OPS_IN, got, oc->n_out);
                if (rc) {
                    skip_without_module_compiler();
                    print_error("%s, %s: %s\n", oc->name, mode_names[m], kl_last_error());
                }
                assert_int_equal(rc, 0);
                for (int j = 0; j < oc->n_out; j++)
                    expect_equal(oc->name, mode_names[m], j, got[j], ref[j], modes[m] == KL_COMPILE_FUSE ? oc->fuse_tol : 0);
            }
            kl_fn_stats st;
            assert_int_equal(kl_fn_get_stats(f, &st), 0);
            assert_int_equal(st.traces, 1);
            assert_int_equal(st.eager_calls, 0);
            if (modes[m] == KL_COMPILE_FUSE && oc->fuse_kernels) {
                assert_int_equal(st.kernels, oc->fuse_kernels);
                assert_int_equal(st.library_calls, 0);
            }
            print_message("%-44s %-10s %lld launches, %lld library calls\n", oc->name, mode_names[m],
                          (long long)st.kernels, (long long)st.library_calls);
            kl_fn_release(f);
        }
        kl_scope_end();
    }
}

/* exp + 0.25 (a kernel), matmul (cuBLAS), a row kernel (softmax spelled out), an
 * elementwise tail: three CUDA kernels around a graph node */
static int three_kernels(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = kl_matmul(kl_add_scalar(kl_exp(in[0]), 0.25), in[1]);
    kl_tensor *e = kl_exp(kl_sub(h, kl_amax(h, KL_DIMS(-1), true)));
    out[0] = kl_add_scalar(kl_mul_scalar(kl_div(e, kl_sum(e, KL_DIMS(-1), true)), 3), 1);
    return out[0] ? 0 : -1;
}

/* A compiled function's CUDA kernels are one program (cn_compile_group):
 * kl_compile loads one module for all of them, and they run as the CPU's. */
static void one_program_per_function(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(7);
    /* shapes no other test uses, so no module is in the process's cache yet */
    kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(7, 13), KL_F32), 0.3), *w = kl_randn(KL_SHAPE(13, 19), KL_F32);
    kl_tensor *gx = kl_to_device(x, CUDA0), *gw = kl_to_device(w, CUDA0);
    const int64_t before = ku_module_loads();
    kl_fn *f = kl_compile(three_kernels, NULL, NULL);
    assert_non_null(f);
    kl_tensor *got = NULL, *ref = NULL;
    int rc = kl_fn_call(f, (kl_tensor *[]){gx, gw}, 2, &got, 1);
    if (rc) {
        skip_without_module_compiler();
        print_error("CUDA call: %s\n", kl_last_error());
    }
    assert_int_equal(rc, 0);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    print_message("%lld kernels, %lld module(s) built\n", (long long)st.kernels, (long long)(ku_module_loads() - before));
    assert_true(st.kernels >= 3);
    assert_int_equal(ku_module_loads() - before, 1);
    assert_int_equal(three_kernels(NULL, (kl_tensor *[]){x, w}, 2, &ref, 1), 0);
    assert_int_equal(kl_allclose(host(got), ref, 1e-5, 1e-5, false), 1);
    kl_fn_release(f);
    /* the same function compiled again: the same program, no new module */
    f = kl_compile(three_kernels, NULL, NULL);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){gx, gw}, 2, &got, 1), 0);
    assert_int_equal(ku_module_loads() - before, 1);
    kl_fn_release(f);
}

static void mlp_layer_matmul_bias_relu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(5);
    kl_tensor *x = kl_randn(KL_SHAPE(8, 16), KL_F32), *w = kl_randn(KL_SHAPE(16, 12), KL_F32);
    kl_tensor *b = kl_randn(KL_SHAPE(12), KL_F32);
    /* the matmul, and one kernel for bias + relu */
    assert_int_equal(cpu_vs_cuda(mlp_layer, (kl_tensor *[]){x, w, b}, 3, 1, 1e-5), 2);
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(elementwise_chains_bitwise),
        KT_TEST(device_of_traced_values),
        KT_TEST(integers_and_errors),
        KT_TEST(row_reductions_within_tolerance),
        KT_TEST(mlp_layer_matmul_bias_relu),
        KT_TEST(one_program_per_function),
        KT_TEST(data_movement_ops_compiled),
        KT_TEST(cpu_kept_composites_decompose_on_cuda),
        KT_TEST(every_op_family_compiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
