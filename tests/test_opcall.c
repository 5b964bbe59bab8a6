/*
 * test_opcall.c — kl_op_call (src/eager/opcall.c, attr_text.c): an op by its
 * table name with its attributes as the text a graph prints. Every op's
 * round trip against its own call is test_fixtures.c's fixtures_replay_by_name
 * (all rows, bitwise); here: the error paths, in-place forms, random ops'
 * seed and offset, wrapped scalars, the default device of creation ops,
 * autograd and tracing through it.
 */
#include "harness.h"

static kl_tensor *sample(void) {
    static const float v[] = {1, -2, 3, 0.5f, -1, 4};
    return kl_from_data(v, KL_SHAPE(2, 3), KL_F32);
}

static void same(kl_tensor *a, kl_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(kl_dtype_of(a), kl_dtype_of(b));
    assert_int_equal(kl_ndim(a), kl_ndim(b));
    assert_memory_equal(kl_shape(a), kl_shape(b), sizeof(int64_t) * (size_t)kl_ndim(a));
    assert_int_equal(kl_equal(a, b), 1);
}

static void calls_ops_of_every_kind(void **state) {
    (void)state;
    kl_tensor *x = sample(), *y = NULL, *two[2] = {NULL, NULL};
    /* a reduction */
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[1], keepdim=true", &y, 1), 0);
    same(y, kl_sum(x, 1, (int64_t[]){1}, true));
    /* attributes in any order, spaces around them, defaults left out */
    assert_int_equal(kl_op_call("sum", &x, 1, "  keepdim = true ,dims=[ 1 ] ", &y, 1), 0);
    same(y, kl_sum(x, 1, (int64_t[]){1}, true));
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[]", &y, 1), 0);
    same(y, kl_sum(x, 0, NULL, false));
    /* a view: shares x's storage */
    assert_int_equal(kl_op_call("transpose", &x, 1, "dim0=0, dim1=1", &y, 1), 0);
    same(y, kl_transpose(x, 0, 1));
    assert_int_equal(kl_shares_storage(y, x), 1);
    /* matmul */
    kl_tensor *ab[2] = {x, kl_transpose(x, 0, 1)};
    assert_int_equal(kl_op_call("matmul", ab, 2, NULL, &y, 1), 0);
    same(y, kl_matmul(ab[0], ab[1]));
    /* two outputs */
    assert_int_equal(kl_op_call("max_dim", &x, 1, "dim=[1]", two, 2), 0);
    kl_tensor *v = NULL, *i = NULL;
    assert_int_equal(kl_max_dim(x, 1, false, &v, &i), 0);
    same(two[0], v);
    same(two[1], i);
    /* a composite with float and reduction attributes */
    kl_tensor *t = kl_from_data((int64_t[]){2, 0}, KL_SHAPE(2), KL_I64), *xt[2] = {x, t};
    assert_int_equal(kl_op_call("cross_entropy", xt, 2, "reduction=sum, label_smoothing=0.1", &y, 1), 0);
    kl_cross_entropy_options o = kl_cross_entropy_options_default();
    o.reduction = KL_REDUCE_SUM;
    o.label_smoothing = 0.1;
    same(y, kl_cross_entropy_ex(x, t, &o));
    /* creation: shape, value, dtype */
    assert_int_equal(kl_op_call("full", NULL, 0, "shape=[2,2], value=-inf, dtype=f64", &y, 1), 0);
    same(y, kl_full(KL_SHAPE(2, 2), -INFINITY, KL_F64));
    assert_int_equal(kl_op_call("arange", NULL, 0, "start=0, end=5, dtype=i64", &y, 1), 0); /* step: 1 */
    same(y, kl_arange(0, 5, 1, KL_I64));
    /* an implicit composite (never a graph node, callable all the same) */
    assert_int_equal(kl_op_call("reshape", &x, 1, "shape=[3,-1]", &y, 1), 0);
    same(y, kl_reshape(x, KL_SHAPE(3, -1)));
    /* variadic */
    kl_tensor *xx[2] = {x, x};
    assert_int_equal(kl_op_call("cat", xx, 2, "dim=1", &y, 1), 0);
    same(y, kl_cat(2, xx, 1));
}

/* A trailing _ is the in-place form, as the graph prints it. */
static void inplace_form_writes_into_input_0(void **state) {
    (void)state;
    kl_tensor *x = sample(), *want = kl_exp(x), *y = NULL;
    assert_int_equal(kl_op_call("exp_", &x, 1, "", &y, 1), 0);
    assert_ptr_equal(y, x);
    same(x, want);
    kl_tensor *dst = kl_zeros(KL_SHAPE(2, 3), KL_F64), *ds[2] = {dst, sample()};
    assert_int_equal(kl_op_call("copy_", ds, 2, NULL, &y, 1), 0);
    assert_ptr_equal(y, dst);
    same(dst, kl_to_dtype(sample(), KL_F64));
    assert_int_equal(kl_op_call("sum_", &x, 1, "dims=[]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum_: kl_sum has no in-place form");
}

/* seed and offset draw exactly those numbers; left out, fresh ones as the public function draws. */
static void random_ops_draw_the_recorded_numbers(void **state) {
    (void)state;
    kl_manual_seed(5);
    kl_tensor *want = kl_randn(KL_SHAPE(3, 4), KL_F32), *y = NULL, *z = NULL;
    kl_manual_seed(5);
    assert_int_equal(kl_op_call("randn", NULL, 0, "shape=[3,4], dtype=f32", &y, 1), 0);
    same(y, want);
    /* the same seed and offset twice: the same numbers, whatever the generator did since */
    assert_int_equal(kl_op_call("rand", NULL, 0, "shape=[100], seed=9, offset=40, dtype=f64", &y, 1), 0);
    kl_manual_seed(1234);
    assert_int_equal(kl_op_call("rand", NULL, 0, "offset=40, dtype=f64, seed=9, shape=[100]", &z, 1), 0);
    same(y, z);
    assert_int_equal(kl_op_call("rand", NULL, 0, "shape=[100], seed=9, offset=44, dtype=f64", &z, 1), 0);
    assert_int_equal(kl_equal(y, z), 0);
    /* an op with inputs: dropout */
    kl_tensor *x = kl_ones(KL_SHAPE(64), KL_F32), *d1 = NULL, *d2 = NULL;
    assert_int_equal(kl_op_call("dropout", &x, 1, "p=0.5, seed=3, offset=0", &d1, 1), 0);
    assert_int_equal(kl_op_call("dropout", &x, 1, "p=0.5, seed=3, offset=0", &d2, 1), 0);
    same(d1, d2);
    /* a compiled graph's slot is not a reservation */
    assert_int_equal(kl_op_call("randn", NULL, 0, "shape=[2], slot=0, dtype=f32", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: randn: slot=0 names a compiled graph's per-call random slot");
    assert_int_equal(kl_op_call("randn", NULL, 0, "shape=[2], seed=1, dtype=f32", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: randn: attribute offset is missing");
    assert_null(y);
}

/* A wrapped scalar promotes as kl_add_scalar's operand; a 0-dim tensor of f64 does not. */
static void wrapped_scalars_promote_as_c_scalars(void **state) {
    (void)state;
    kl_tensor *x = kl_scalar_tensor(1.5, KL_F32), *y = NULL;
    kl_tensor *w[2] = {x, kl_wrapped_scalar(0.25)}, *d[2] = {x, kl_scalar_tensor(0.25, KL_F64)};
    assert_int_equal(kl_dtype_of(w[1]), KL_F64);
    assert_int_equal(kl_dtype_of(kl_wrapped_scalar(3)), KL_I64);
    assert_int_equal(kl_op_call("add", w, 2, NULL, &y, 1), 0);
    same(y, kl_add_scalar(x, 0.25));
    assert_int_equal(kl_dtype_of(y), KL_F32);
    assert_int_equal(kl_op_call("add", d, 2, NULL, &y, 1), 0);
    assert_int_equal(kl_dtype_of(y), KL_F64); /* two 0-dim tensors: plain promotion */
}

/* Ops without inputs run on the thread's default device. */
static void creation_runs_on_the_default_device(void **state) {
    (void)state;
    kl_tensor *y = NULL;
    kl_set_default_device(KL_DEVICE_META);
    int rc = kl_op_call("empty", NULL, 0, "shape=[5,7], dtype=bf16", &y, 1);
    kl_set_default_device(KL_DEVICE_CPU);
    assert_int_equal(rc, 0);
    assert_int_equal(kl_device_of(y).type, KL_META);
    assert_int_equal(kl_dtype_of(y), KL_BF16);
    assert_int_equal(kl_op_call("eye", NULL, 0, "n=3, dtype=f32", &y, 1), 0); /* m: -1 (square) */
    assert_int_equal(kl_device_of(y).type, KL_CPU);
    same(y, kl_eye(3, -1, KL_F32));
}

/* The call runs through the dispatcher: autograd records it. */
static void autograd_records_it(void **state) {
    (void)state;
    kl_tensor *x = kl_retain(sample()), *y = NULL;
    assert_int_equal(kl_set_requires_grad(x, true), 0);
    assert_int_equal(kl_op_call("logsumexp", &x, 1, "dims=[1]", &y, 1), 0);
    assert_true(kl_requires_grad(y));
    assert_int_equal(kl_backward(kl_sum(y, 0, NULL, false), NULL, NULL), 0);
    kl_tensor *want = kl_softmax(kl_detach(x), 1);
    assert_int_equal(kl_allclose(kl_grad(x), want, 1e-6, 1e-6, false), 1);
    kl_release(x);
}

/* ... and tracing traces it: a compiled function calling ops by name equals eager. */
static int by_name(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    kl_tensor *s = NULL, *e = NULL, *two[2] = {in[0], NULL};
    if (kl_op_call("exp", in, 1, NULL, &e, 1) || kl_op_call("sum", &e, 1, "dims=[-1], keepdim=true", &s, 1)) return -1;
    two[0] = e, two[1] = s;
    return kl_op_call("div", two, 2, "", out, 1);
}

static void compiled_functions_trace_it(void **state) {
    (void)state;
    kl_manual_seed(2);
    kl_tensor *x = kl_randn(KL_SHAPE(4, 6), KL_F32), *y = NULL, *want = NULL;
    assert_int_equal(by_name(NULL, &x, 1, &want, 1), 0);
    kl_fn *f = kl_compile(by_name, NULL, NULL);
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, &x, 1, &y, 1), 0);
    assert_int_equal(kl_allclose(y, want, 1e-5, 1e-6, false), 1);
    assert_int_equal(kl_allclose(y, kl_softmax(x, -1), 1e-5, 1e-6, false), 1);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.traces, 1);
    kl_fn_release(f);
}

static void bad_calls_are_named(void **state) {
    (void)state;
    kl_tensor *x = sample(), *y = sample(), *two[2] = {NULL, NULL};
    kl_tensor *xy[2] = {x, y};
    assert_int_equal(kl_op_call("summ", &x, 1, "dims=[1]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: unknown op 'summ' (did you mean 'sum'?)");
    assert_null(y);
    assert_int_equal(kl_op_call("frobnicate", &x, 1, NULL, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: unknown op 'frobnicate' (the op table's names");
    assert_int_equal(kl_op_call("scalar", NULL, 0, "value=1", &y, 1), -1); /* a graph IR node, not an op */
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: unknown op 'scalar'");
    /* counts */
    assert_int_equal(kl_op_call("exp", xy, 2, NULL, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: exp takes 1 input, got 2");
    assert_int_equal(kl_op_call("full", &x, 1, "shape=[1], value=0, dtype=f32", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: full takes 0 inputs, got 1");
    assert_int_equal(kl_op_call("max_dim", &x, 1, "dim=[0]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: max_dim makes 2 outputs, got room for 1");
    assert_int_equal(kl_op_call("exp", &x, 1, NULL, two, 2), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: exp makes 1 output, got room for 2");
    assert_int_equal(kl_op_call("cat", NULL, 0, "dim=0", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: cat takes 1 input or more, got 0");
    assert_int_equal(kl_op_call("split", &x, 1, "split_size=1, dim=1, count=4", two, 2), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: split made 3 outputs, got room for 2");
    assert_null(two[0]);
    kl_tensor *six[6];
    assert_int_equal(kl_op_call("split", &x, 1, "split_size=1, dim=1, count=6", six, 6), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: split makes at most 4 outputs per call");
    /* attributes */
    assert_int_equal(kl_op_call("sum", &x, 1, "dim=[1]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: unknown attribute 'dim' (in \"dim=[1]\"; its attributes: dims, keepdim)");
    assert_int_equal(kl_op_call("sum", &x, 1, "keepdim=true", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: attribute dims is missing (in \"keepdim=true\"; it has no default");
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[1], keepdim=yes", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: attribute keepdim: 'yes' is not a bool (true or false)");
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[1,x]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: attribute dims: '[1,x]' is not a list of integers");
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=1", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: attribute dims: '1' is not a list like [1,2]");
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[1], dims=[0]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: attribute dims given twice");
    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[1] keepdim=true", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: expected ',' between attributes at 'keepdim=true'");
    assert_int_equal(kl_op_call("sum", &x, 1, "[1]", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: sum: expected name=value, got '[1]'");
    assert_int_equal(kl_op_call("transpose", &x, 1, "dim0=0, dim1=99999999999999999999", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: transpose: attribute dim1: '99999999999999999999' is not an integer");
    assert_int_equal(kl_op_call("full", NULL, 0, "shape=[2], value=1, dtype=f128", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: full: attribute dtype: 'f128' is not a dtype");
    assert_int_equal(kl_op_call("full", NULL, 0, "shape=[2], value=one, dtype=f32", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: full: attribute value: 'one' is not a number");
    assert_int_equal(kl_op_call("mse_loss", xy, 2, "reduction=avg", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: mse_loss: attribute reduction: 'avg' is not a reduction (none, mean, sum)");
    assert_int_equal(kl_op_call("conv2d", xy, 2, "stride=[1], padding=[0,0], dilation=[1,1], has_bias=false", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: conv2d: attribute stride: '[1]' is not a pair like [1,2]");
    assert_int_equal(kl_op_call("exp", &x, 1, "alpha=1", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_op_call: exp: unknown attribute 'alpha' (in \"alpha=1\"; its attributes: none)");
    /* the op's own checks, as its kl_ function reports them: an input count its flags do not give */
    assert_int_equal(kl_op_call("layer_norm", &x, 1, "normalized_ndim=1, has_weight=true, has_bias=false, eps=1e-5",
                                &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_layer_norm: weight/bias flags and the 1 inputs disagree");
    assert_int_equal(kl_op_call("linear", xy, 2, "has_bias=true", &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_linear: bias flag and the 2 inputs disagree");

    assert_int_equal(kl_op_call("sum", &x, 1, "dims=[5]", &y, 1), -1);
    assert_int_equal(kl_last_status(), KL_ERR_INDEX);
    assert_non_null(strstr(kl_last_error(), "kl_sum"));
    kl_clear_error();
    /* NULLs */
    assert_int_equal(kl_op_call(NULL, &x, 1, NULL, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_op_call: op name is NULL");
    assert_int_equal(kl_op_call("exp", NULL, 1, NULL, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_op_call: exp: inputs NULL, n_inputs 1");
    assert_int_equal(kl_op_call("exp", &x, 1, NULL, NULL, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_op_call: exp: no room for outputs");
    kl_tensor *none = NULL;
    assert_int_equal(kl_op_call("exp", &none, 1, NULL, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_exp: tensor argument 1 is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(calls_ops_of_every_kind),
        KT_TEST(inplace_form_writes_into_input_0),
        KT_TEST(random_ops_draw_the_recorded_numbers),
        KT_TEST(wrapped_scalars_promote_as_c_scalars),
        KT_TEST(creation_runs_on_the_default_device),
        KT_TEST(autograd_records_it),
        KT_TEST(compiled_functions_trace_it),
        KT_TEST(bad_calls_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
