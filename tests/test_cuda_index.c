/*
 * test_cuda_index.c — the indexing ops on CUDA tensors (cn_index.c): gather,
 * take_along_dim, index_select, embedding, scatter_add (out of place and in
 * place), scatter_reduce (every reduction, with and without self, and its
 * derivative in f64), one_hot, each against CPU eager on the same values, byte for byte
 * (they move elements; scatter_add adds in the CPU's order): every dtype,
 * every dim, int32 and int64 indices where taken, non-contiguous inputs and
 * indices, random shapes; bad indices (the CPU's error, naming op, value,
 * dim and size; an in-place target left untouched), mixed devices. Then the
 * losses built on them: nll_loss and cross_entropy with class weights and
 * ignore_index, forward and kl_backward, against the CPU.
 * Runs on the emulated device in CI (cuda_index_emu); without a device
 * every test skips with the reason.
 */
#include "harness.h"

#include "cuda_harness.h"

static const char *OP = "cuda_index_test";

static int ncases;

/* want (CPU) and got (CUDA) hold the same bytes; with nan_equal, NaNs made by
 * arithmetic only need to be NaN (cuda_harness.h, kt_first_difference). */
static void same_as(kl_tensor *want, kl_tensor *got, int nan_equal, const char *what) {
    if (!want) print_error("%s on the CPU: %s\n", what, kl_last_error());
    assert_non_null(want);
    if (!got) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    kl_tensor *w = kl_contiguous(want), *g = host(got);
    if (!kt_same_layout(w, g)) {
        print_error("%s: CUDA's result (%s) differs from the CPU's (%s) in shape or dtype\n", what,
                    kl_dtype_name(kl_dtype_of(g)), kl_dtype_name(kl_dtype_of(w)));
        fail();
    }
    const int64_t at = kt_first_difference(w, g, nan_equal);
    if (at >= 0) {
        char a[512], b[512];
        kl_format(w, a, sizeof a);
        kl_format(g, b, sizeof b);
        print_error("%s (%s): CUDA differs from the CPU at element %lld: cpu %.17g cuda %.17g\ncpu  %s\ncuda %s\n",
                    what, kl_dtype_name(kl_dtype_of(w)), (long long)at, kt_get(w, at), kt_get(g, at), a, b);
        fail();
    }
    ncases++;
}
static void same(kl_tensor *want, kl_tensor *got, const char *what) { same_as(want, got, 0, what); }
static void same_nan(kl_tensor *want, kl_tensor *got, const char *what) { same_as(want, got, 1, what); }

static kl_tensor *dev(kl_tensor *t) {
    kl_tensor *d = kl_to_device(t, CUDA0);
    assert_non_null(d);
    return d;
}

/* Values of dtype dt (signs, fractions; 0/1 for bool). */
static kl_tensor *values(int ndim, const int64_t *shape, kl_dtype dt) {
    kl_tensor *x = kl_mul_scalar(kl_randn(ndim, shape, KL_F64), 20);
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0);
    if (dt == KL_U8) x = kl_abs(x);
    return kl_to_dtype(x, dt);
}

/* Random indices in [0, hi) of the shape, as dtype it. */
static kl_tensor *indices(int ndim, const int64_t *shape, int64_t hi, kl_dtype it) {
    return kl_randint(0, hi, ndim, shape, it);
}

/* gather and take_along_dim: every dtype and dim, index smaller than the
 * input outside the dim, transposed input and index views. */
static void gather_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(41);
    ncases = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        kl_scope_begin();
        kl_tensor *x = values(KL_SHAPE(4, 5, 6), (kl_dtype)d), *gx = dev(x);
        for (int dim = 0; dim < 3; dim++) {
            int64_t ish[3] = {3, 5, 2};
            ish[dim] = 7;
            kl_tensor *ix = indices(3, ish, kl_shape(x)[dim], KL_I64), *gix = dev(ix);
            same(kl_gather(x, dim, ix), kl_gather(gx, dim, gix), "gather");
            /* a transposed input (dims 0 and 2 swapped: [6, 5, 4]) and a transposed index */
            kl_tensor *xt = kl_transpose(x, 0, 2), *gxt = kl_transpose(gx, 0, 2);
            int64_t jsh[3] = {2, 5, 3};
            jsh[2 - dim] = 7;
            kl_tensor *ic = indices(3, jsh, kl_shape(xt)[dim], KL_I64);
            same(kl_gather(xt, dim, kl_transpose(ic, 0, 2)), kl_gather(gxt, dim, kl_transpose(dev(ic), 0, 2)),
                 "gather of views");
        }
        kl_tensor *ta = indices(KL_SHAPE(4, 5, 1), 6, KL_I64);
        same(kl_take_along_dim(x, ta, 2), kl_take_along_dim(gx, dev(ta), 2), "take_along_dim");
        kl_tensor *tf = indices(KL_SHAPE(9), 120, KL_I64);
        same(kl_take_along_dim(x, tf, KL_DIM_NONE), kl_take_along_dim(gx, dev(tf), KL_DIM_NONE),
             "take_along_dim flattened");
        kl_scope_end();
    }
    kl_tensor *x0 = kl_scalar_tensor(3.5, KL_F32), *i0 = kl_scalar_tensor(0, KL_I64);
    same(kl_gather(x0, 0, i0), kl_gather(dev(x0), 0, dev(i0)), "gather 0-dim");
    kl_tensor *xe = kl_randn(KL_SHAPE(3, 4), KL_F32), *ie = kl_zeros(KL_SHAPE(3, 0), KL_I64);
    same(kl_gather(xe, 1, ie), kl_gather(dev(xe), 1, dev(ie)), "gather, empty index");
    print_message("%d gather cases equal to the CPU\n", ncases);
}

/* index_select and embedding: every dtype and dim, int32 and int64
 * indices, strided indices and inputs, 0-dim input. */
static void select_and_embedding_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(42);
    ncases = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        kl_scope_begin();
        kl_tensor *x = values(KL_SHAPE(5, 3, 7), (kl_dtype)d), *gx = dev(x);
        kl_tensor *xt = kl_permute(x, 3, (int64_t[]){2, 0, 1}), *gxt = kl_permute(gx, 3, (int64_t[]){2, 0, 1});
        for (int dim = -1; dim < 3; dim++)
            for (int it = 0; it < 2; it++) {
                const kl_dtype idt = it ? KL_I32 : KL_I64;
                kl_tensor *ix = indices(KL_SHAPE(11), kl_shape(x)[dim < 0 ? 2 : dim], idt);
                same(kl_index_select(x, dim, ix), kl_index_select(gx, dim, dev(ix)), "index_select");
                kl_tensor *iy = indices(KL_SHAPE(16), kl_shape(xt)[dim < 0 ? 2 : dim], idt);
                kl_tensor *sv = kl_slice(iy, 0, 1, 16, 3), *gsv = kl_slice(dev(iy), 0, 1, 16, 3);
                same(kl_index_select(xt, dim, sv), kl_index_select(gxt, dim, gsv), "index_select of views");
            }
        /* embedding: weight [num, dim], indices of rank 0..3 */
        kl_tensor *w = values(KL_SHAPE(10, 6), (kl_dtype)d), *gw = dev(w);
        kl_tensor *i2 = indices(KL_SHAPE(4, 3), 10, d & 1 ? KL_I32 : KL_I64);
        same(kl_embedding(w, i2), kl_embedding(gw, dev(i2)), "embedding");
        same(kl_embedding(kl_transpose(kl_contiguous(kl_transpose(w, 0, 1)), 0, 1), kl_transpose(i2, 0, 1)),
             kl_embedding(kl_transpose(dev(kl_contiguous(kl_transpose(w, 0, 1))), 0, 1), kl_transpose(dev(i2), 0, 1)),
             "embedding of views");
        kl_tensor *i0 = kl_scalar_tensor(7, KL_I64), *i3 = indices(KL_SHAPE(2, 2, 3), 10, KL_I64);
        same(kl_embedding(w, i0), kl_embedding(gw, dev(i0)), "embedding, 0-dim index");
        same(kl_embedding(w, i3), kl_embedding(gw, dev(i3)), "embedding, 3-D indices");
        kl_scope_end();
    }
    kl_tensor *x0 = kl_scalar_tensor(-2, KL_I32), *i0 = kl_zeros(KL_SHAPE(1), KL_I64);
    same(kl_index_select(x0, 0, i0), kl_index_select(dev(x0), 0, dev(i0)), "index_select 0-dim");
    kl_tensor *xe = kl_randn(KL_SHAPE(4, 3), KL_F32), *ie = kl_zeros(KL_SHAPE(0), KL_I64);
    same(kl_index_select(xe, 0, ie), kl_index_select(dev(xe), 0, dev(ie)), "index_select, empty index");
    print_message("%d index_select / embedding cases equal to the CPU\n", ncases);
}

/* scatter_add: every dtype and dim, duplicate indices (adds in the CPU's
 * order: bitwise, f16/bf16 rounded after each add), src larger than the
 * index, out of place from a view and in place; one_hot. */
static void scatter_add_and_one_hot_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(43);
    ncases = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        kl_scope_begin();
        kl_tensor *x = values(KL_SHAPE(4, 6, 5), (kl_dtype)d), *gx = dev(x);
        for (int dim = 0; dim < 3; dim++) {
            int64_t ish[3] = {3, 4, 5}, ssh[3] = {4, 5, 6};
            ish[dim] = 9; /* more entries than the dim: duplicates */
            ssh[dim] = 10;
            kl_tensor *ix = indices(3, ish, kl_shape(x)[dim], KL_I64), *src = values(3, ssh, (kl_dtype)d);
            kl_tensor *gix = dev(ix), *gsrc = dev(src);
            same(kl_scatter_add(x, dim, ix, src), kl_scatter_add(gx, dim, gix, gsrc), "scatter_add");
            kl_tensor *xt = kl_transpose(kl_contiguous(kl_transpose(x, 0, 1)), 0, 1);
            kl_tensor *gxt = kl_transpose(dev(kl_contiguous(kl_transpose(x, 0, 1))), 0, 1);
            same(kl_scatter_add(xt, dim, ix, src), kl_scatter_add(gxt, dim, gix, gsrc), "scatter_add of a view");
            kl_tensor *xc = kl_clone(x), *gxc = kl_clone(gx);
            assert_non_null(kl_scatter_add_inplace(xc, dim, ix, src));
            assert_non_null(kl_scatter_add_inplace(gxc, dim, gix, gsrc));
            same(xc, gxc, "scatter_add in place");
        }
        kl_scope_end();
    }
    for (int k = 0; k < 3; k++) {
        kl_tensor *c = indices(KL_SHAPE(3, 4), 5 + k, KL_I64);
        same(kl_one_hot(c, 5 + k), kl_one_hot(dev(c), 5 + k), "one_hot");
        same(kl_one_hot(kl_transpose(c, 0, 1), 8), kl_one_hot(kl_transpose(dev(c), 0, 1), 8), "one_hot of a view");
    }
    kl_tensor *c0 = kl_scalar_tensor(2, KL_I64);
    same(kl_one_hot(c0, 3), kl_one_hot(dev(c0), 3), "one_hot 0-dim");
    same(kl_one_hot(kl_zeros(KL_SHAPE(0), KL_I64), 4), kl_one_hot(dev(kl_zeros(KL_SHAPE(0), KL_I64)), 4), "one_hot empty");
    print_message("%d scatter_add / one_hot cases equal to the CPU\n", ncases);
}

/* Bad indices: the CPU's error on both devices (op, value, dim, size), no
 * write (an in-place target keeps its values); mixed devices. */
static void bad_indices_fail_clearly(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(44);
    kl_tensor *x = kl_randn(KL_SHAPE(4, 5), KL_F32), *gx = dev(x);
    kl_tensor *bad = kl_from_data((int64_t[]){0, 1, 2, 3, 9, 4}, KL_SHAPE(2, 3), KL_I64);
    kl_tensor *neg = kl_from_data((int64_t[]){0, -2, 1}, KL_SHAPE(3), KL_I64);
    assert_null(kl_gather(gx, 1, dev(bad)));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_gather: index 9 is out of range for dim 1 with size 5");
    kl_tensor *bad4 = kl_from_data((int64_t[]){0, 1, 2, 3, 9, 4, 0, 0, 0, 1, 1, 1}, KL_SHAPE(4, 3), KL_I64);
    assert_null(kl_take_along_dim(gx, dev(bad4), 1));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_take_along_dim: index 9 is out of range for dim 1 with size 5");
    assert_null(kl_index_select(gx, 0, dev(neg)));
    KT_EXPECT_ERROR(KL_ERR_INDEX,
                    "kl_index_select: index -2 is out of range for dim 0 with size 4 (negative indices are not accepted)");
    assert_null(kl_index_select(gx, 1, dev(kl_to_dtype(kl_reshape(bad, KL_SHAPE(6)), KL_I32))));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_index_select: index 9 is out of range for dim 1 with size 5");
    assert_null(kl_embedding(gx, dev(bad)));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_embedding: index 9 is out of range for dim 0 with size 4");
    assert_null(kl_embedding(x, bad));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_embedding: index 9 is out of range for dim 0 with size 4");
    assert_null(kl_one_hot(dev(bad), 9));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_one_hot: class value 9 is out of range [0, 9) (num_classes = 9)");
    /* in place: the error comes before any write */
    kl_tensor *gt = kl_clone(gx), *src = dev(kl_ones(KL_SHAPE(2, 3), KL_F32));
    assert_null(kl_scatter_add_inplace(gt, 1, dev(bad), src));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter_add: index 9 is out of range for dim 1 with size 5");
    same(x, gt, "in-place target after a bad index");
    /* the same errors as the CPU's */
    assert_null(kl_gather(x, 1, bad));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_gather: index 9 is out of range for dim 1 with size 5");
    /* mixed devices: named both */
    assert_null(kl_gather(gx, 1, kl_zeros(KL_SHAPE(4, 2), KL_I64)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
    assert_null(kl_index_select(x, 0, dev(kl_zeros(KL_SHAPE(2), KL_I64))));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuda:0");
    assert_null(kl_scatter_add(gx, 0, dev(kl_zeros(KL_SHAPE(1, 5), KL_I64)), kl_ones(KL_SHAPE(1, 5), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
}

static void close_to(kl_tensor *want, kl_tensor *got, double tol, const char *what) {
    if (!got) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    if (kl_allclose(host(got), want, tol, tol, true) != 1) {
        char a[512], b[512];
        kl_format(want, a, sizeof a);
        kl_format(host(got), b, sizeof b);
        print_error("%s: CUDA differs from the CPU\ncpu  %s\ncuda %s\n", what, a, b);
        fail();
    }
}

/* x with NaNs at a few places (floating dtypes only). */
static kl_tensor *with_nans(kl_tensor *x) {
    const kl_dtype dt = kl_dtype_of(x);
    if (dt != KL_F32 && dt != KL_F64 && dt != KL_F16 && dt != KL_BF16) return x;
    kl_tensor *m = kl_eq_scalar(kl_remainder_scalar(kl_arange(0, (double)kl_numel(x), 1, KL_I64), 7), 3);
    return kl_masked_fill(x, kl_reshape(m, kl_ndim(x), kl_shape(x)), NAN);
}

/* scatter_reduce: every reduction with and without self, every dtype the CPU
 * takes (mean: not bool), every dim, repeated targets, src larger than
 * index, NaNs for amax / amin, integer products that wrap, a transposed self
 * and src, an empty index, 0-dim tensors; byte for byte but a NaN's bits
 * (x86 keeps the operand's payload, a GPU gives the canonical NaN). */
static void scatter_reduce_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(47);
    ncases = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        kl_scope_begin();
        kl_tensor *x = values(KL_SHAPE(4, 6, 5), (kl_dtype)d);
        if (d == KL_I32 || d == KL_I64 || d == KL_U8) x = kl_add_scalar(x, 1); /* products that are not all 0 */
        kl_tensor *gx = dev(x);
        for (int dim = 0; dim < 3; dim++) {
            int64_t ish[3] = {3, 4, 5}, ssh[3] = {4, 5, 6};
            ish[dim] = 9; /* more entries than the dim: duplicates */
            ssh[dim] = 10;
            kl_tensor *ix = indices(3, ish, kl_shape(x)[dim], KL_I64), *src = with_nans(values(3, ssh, (kl_dtype)d));
            kl_tensor *gix = dev(ix), *gsrc = dev(src);
            for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++)
                for (int inc = 0; inc < 2; inc++) {
                    if (r == KL_SCATTER_MEAN && d == KL_BOOL) continue;
                    same_nan(kl_scatter_reduce(x, dim, ix, src, (kl_scatter_reduction)r, inc),
                             kl_scatter_reduce(gx, dim, gix, gsrc, (kl_scatter_reduction)r, inc), "scatter_reduce");
                }
            /* self and src as transposed views */
            kl_tensor *xt = kl_transpose(kl_contiguous(kl_transpose(x, 0, 2)), 0, 2);
            kl_tensor *gxt = kl_transpose(dev(kl_contiguous(kl_transpose(x, 0, 2))), 0, 2);
            kl_tensor *st = kl_transpose(kl_contiguous(kl_transpose(src, 1, 2)), 1, 2);
            kl_tensor *gst = kl_transpose(dev(kl_contiguous(kl_transpose(src, 1, 2))), 1, 2);
            for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++) {
                if (r == KL_SCATTER_MEAN && d == KL_BOOL) continue;
                same_nan(kl_scatter_reduce(xt, dim, ix, st, (kl_scatter_reduction)r, r % 2),
                         kl_scatter_reduce(gxt, dim, gix, gst, (kl_scatter_reduction)r, r % 2), "scatter_reduce of views");
            }
        }
        /* an empty index leaves self; 0-dim self, index and src */
        kl_tensor *e = kl_zeros(KL_SHAPE(0, 6, 5), KL_I64);
        same(kl_scatter_reduce(x, 0, e, x, KL_SCATTER_PROD, false), kl_scatter_reduce(gx, 0, dev(e), gx, KL_SCATTER_PROD, false),
             "scatter_reduce with an empty index"); /* a copy of self: its NaNs' bits too */
        kl_tensor *x0 = kl_reshape(kl_narrow(kl_flatten(x, 0, -1), 0, 0, 1), 0, NULL);
        kl_tensor *s0 = kl_reshape(kl_narrow(kl_flatten(x, 0, -1), 0, 1, 1), 0, NULL), *i0 = kl_scalar_tensor(0, KL_I64);
        for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++) {
            if (r == KL_SCATTER_MEAN && d == KL_BOOL) continue;
            same_nan(kl_scatter_reduce(x0, 0, i0, s0, (kl_scatter_reduction)r, false),
                     kl_scatter_reduce(dev(x0), 0, dev(i0), dev(s0), (kl_scatter_reduction)r, false), "scatter_reduce 0-dim");
        }
        kl_scope_end();
    }
    print_message("%d scatter_reduce cases equal to the CPU\n", ncases);
}

/* scatter_reduce's errors on CUDA tensors are the CPU's: a bad index (self
 * untouched), a bad reduction, int32 indices, mean of bool, mixed devices. */
static void scatter_reduce_errors(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *x = kl_randn(KL_SHAPE(3, 4), KL_F32), *gx = dev(x);
    kl_tensor *bad = dev(kl_from_data((int64_t[]){0, 1, 5, 2}, KL_SHAPE(1, 4), KL_I64));
    kl_tensor *ok = dev(kl_from_data((int64_t[]){0, 1, 2, 2}, KL_SHAPE(1, 4), KL_I64));
    kl_tensor *src = dev(kl_ones(KL_SHAPE(1, 4), KL_F32));
    assert_null(kl_scatter_reduce(gx, 0, bad, src, KL_SCATTER_AMAX, false));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter_reduce: index 5 is out of range for dim 0 with size 3");
    same(x, gx, "self after a bad index");
    assert_null(kl_scatter_reduce(gx, 0, ok, src, (kl_scatter_reduction)9, true));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_scatter_reduce: reduce 9 is not a kl_scatter_reduction");
    assert_null(kl_scatter_reduce(gx, 0, kl_to_dtype(ok, KL_I32), src, KL_SCATTER_SUM, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter_reduce: index must be int64");
    assert_null(kl_scatter_reduce(dev(kl_zeros(KL_SHAPE(3, 4), KL_BOOL)), 0, ok, dev(kl_ones(KL_SHAPE(1, 4), KL_BOOL)),
                                  KL_SCATTER_MEAN, true));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter_reduce: reduce mean needs a numeric self");
    assert_null(kl_scatter_reduce(gx, 0, ok, kl_ones(KL_SHAPE(1, 4), KL_F32), KL_SCATTER_SUM, true));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
}

/* scatter_reduce's derivative on CUDA tensors (gathers, scatter_adds, masks
 * and scatter_reduce itself, all on the device): every reduction with and
 * without self, repeated targets and ties for amax / amin, zeros for prod,
 * in f64 against the CPU's gradients within 1e-12. */
static void scatter_reduce_backward_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(48);
    kl_tensor *x = kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(4, 5), KL_F64), 2)); /* ties */
    kl_tensor *src = kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(6, 5), KL_F64), 2));
    kl_tensor *ix = indices(KL_SHAPE(6, 5), 4, KL_I64);
    kl_tensor *w = kl_cos(kl_arange(0, 20, 1, KL_F64));
    for (int r = KL_SCATTER_SUM; r <= KL_SCATTER_AMIN; r++)
        for (int inc = 0; inc < 2; inc++) {
            kl_tensor *g[2][2];
            for (int on = 0; on < 2; on++) {
                kl_tensor *px = kl_detach(on ? dev(x) : x), *ps = kl_detach(on ? dev(src) : src);
                kl_set_requires_grad(px, true);
                kl_set_requires_grad(ps, true);
                kl_tensor *y = kl_scatter_reduce(px, 0, on ? dev(ix) : ix, ps, (kl_scatter_reduction)r, inc);
                if (!y) print_error("reduce %d on %s: %s\n", r, on ? "cuda" : "cpu", kl_last_error());
                assert_non_null(y);
                kl_tensor *wd = kl_reshape(on ? dev(w) : w, KL_SHAPE(4, 5));
                int rc = kl_backward(kl_sum(kl_mul(kl_mul(y, y), wd), 0, NULL, false), NULL, NULL);
                if (rc) print_error("reduce %d backward on %s: %s\n", r, on ? "cuda" : "cpu", kl_last_error());
                assert_int_equal(rc, 0);
                g[on][0] = kl_grad(px), g[on][1] = kl_grad(ps);
                assert_non_null(g[on][0]);
                assert_non_null(g[on][1]);
            }
            close_to(g[0][0], g[1][0], 1e-12, "scatter_reduce's gradient of self");
            close_to(g[0][1], g[1][1], 1e-12, "scatter_reduce's gradient of src");
        }
}

/* nll_loss and cross_entropy with class weights and ignore_index, every
 * reduction, forward against the CPU (1e-5). */
static void losses_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(45);
    kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(7, 5), KL_F32), 2), *gx = dev(x);
    kl_tensor *t = kl_from_data((int64_t[]){0, 4, -100, 2, 2, 1, 3}, KL_SHAPE(7), KL_I64), *gt = dev(t);
    kl_tensor *w = kl_add_scalar(kl_rand(KL_SHAPE(5), KL_F32), 0.5), *gw = dev(w);
    kl_tensor *lp = kl_log_softmax(x, 1), *glp = kl_log_softmax(gx, 1);
    const kl_reduction reds[] = {KL_REDUCE_NONE, KL_REDUCE_MEAN, KL_REDUCE_SUM};
    for (int r = 0; r < 3; r++)
        for (int weighted = 0; weighted < 2; weighted++) {
            kl_cross_entropy_options o = kl_cross_entropy_options_default(), go = o;
            o.reduction = go.reduction = reds[r];
            o.weight = weighted ? w : NULL;
            go.weight = weighted ? gw : NULL;
            close_to(kl_nll_loss_ex(lp, t, &o), kl_nll_loss_ex(glp, gt, &go), 1e-5, "nll_loss");
            close_to(kl_cross_entropy_ex(x, t, &o), kl_cross_entropy_ex(gx, gt, &go), 1e-5, "cross_entropy");
            o.ignore_index = go.ignore_index = 2;
            kl_tensor *t2 = kl_where(kl_eq_scalar(t, -100), kl_zeros(KL_SHAPE(7), KL_I64), t);
            close_to(kl_nll_loss_ex(lp, t2, &o), kl_nll_loss_ex(glp, dev(t2), &go), 1e-5, "nll_loss ignore 2");
            close_to(kl_cross_entropy_ex(x, t2, &o), kl_cross_entropy_ex(gx, dev(t2), &go), 1e-5,
                     "cross_entropy ignore 2");
        }
    /* class dim 1 of a [N, C, d] input */
    kl_tensor *x3 = kl_randn(KL_SHAPE(3, 5, 4), KL_F32), *t3 = indices(KL_SHAPE(3, 4), 5, KL_I64);
    close_to(kl_nll_loss(kl_log_softmax(x3, 1), t3, KL_REDUCE_MEAN),
             kl_nll_loss(kl_log_softmax(dev(x3), 1), dev(t3), KL_REDUCE_MEAN), 1e-5, "nll_loss [N, C, d]");
    /* a target out of range: the CPU's error */
    kl_tensor *tb = kl_from_data((int64_t[]){0, 1, 2, 3, 4, 5, 0}, KL_SHAPE(7), KL_I64);
    assert_null(kl_nll_loss(glp, dev(tb), KL_REDUCE_MEAN));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "is out of range");
}

/* Training on CUDA with cross_entropy (class weights, ignore_index) and an
 * embedding: kl_backward gives the CPU's gradients within 1e-4. */
static void training_backward_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(46);
    kl_tensor *tok = indices(KL_SHAPE(8), 11, KL_I64);
    kl_tensor *t = kl_from_data((int64_t[]){1, 0, 3, -1, 2, 2, 3, 0}, KL_SHAPE(8), KL_I64);
    kl_tensor *p0[5] = {kl_randn(KL_SHAPE(11, 6), KL_F32), kl_mul_scalar(kl_randn(KL_SHAPE(6, 16), KL_F32), 0.5),
                        kl_randn(KL_SHAPE(16), KL_F32), kl_mul_scalar(kl_randn(KL_SHAPE(16, 4), KL_F32), 0.5),
                        kl_randn(KL_SHAPE(4), KL_F32)};
    kl_tensor *w = kl_add_scalar(kl_rand(KL_SHAPE(4), KL_F32), 0.5);
    kl_tensor *grads[2][5];
    for (int on = 0; on < 2; on++) {
        kl_device d = on ? CUDA0 : KL_DEVICE_CPU;
        kl_tensor *p[5];
        for (int i = 0; i < 5; i++) {
            p[i] = kl_to_device(kl_clone(p0[i]), d);
            assert_non_null(p[i]);
            assert_int_equal(kl_set_requires_grad(p[i], true), 0);
        }
        kl_tensor *h = kl_tanh(kl_add(kl_matmul(kl_embedding(p[0], kl_to_device(tok, d)), p[1]), p[2]));
        kl_tensor *logits = kl_add(kl_matmul(h, p[3]), p[4]);
        kl_cross_entropy_options o = kl_cross_entropy_options_default();
        o.weight = kl_to_device(w, d);
        o.ignore_index = -1;
        kl_tensor *td = kl_to_device(t, d);
        kl_tensor *loss = kl_add(kl_cross_entropy_ex(logits, td, &o),
                                 kl_nll_loss_ex(kl_log_softmax(logits, 1), td, &o));
        if (!loss) print_error("forward on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
        assert_non_null(loss);
        int rc = kl_backward(loss, NULL, NULL);
        if (rc) print_error("backward on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
        assert_int_equal(rc, 0);
        for (int i = 0; i < 5; i++) {
            grads[on][i] = kl_grad(p[i]);
            assert_non_null(grads[on][i]);
            assert_int_equal(kl_device_of(grads[on][i]).type, on ? KL_CUDA : KL_CPU);
        }
    }
    for (int i = 0; i < 5; i++) close_to(grads[0][i], grads[1][i], 1e-4, "gradient");
    /* gather's and scatter_add's own derivatives on CUDA, gradchecked in f64 */
    kl_tensor *x = dev(kl_randn(KL_SHAPE(3, 4), KL_F64)), *ix = dev(indices(KL_SHAPE(3, 6), 4, KL_I64));
    kl_set_requires_grad(x, true);
    kl_tensor *g = kl_gather(x, 1, ix);
    assert_int_equal(kl_backward(kl_sum(kl_mul(g, g), 0, NULL, false), NULL, NULL), 0);
    kl_tensor *hx = kl_detach(host(x));
    kl_set_requires_grad(hx, true);
    kl_tensor *hg = kl_gather(hx, 1, host(ix));
    assert_int_equal(kl_backward(kl_sum(kl_mul(hg, hg), 0, NULL, false), NULL, NULL), 0);
    close_to(kl_grad(hx), kl_grad(x), 1e-12, "gather's gradient");
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(gather_like_cpu),
        KT_TEST(select_and_embedding_like_cpu),
        KT_TEST(scatter_add_and_one_hot_like_cpu),
        KT_TEST(scatter_reduce_like_cpu),
        KT_TEST(scatter_reduce_errors),
        KT_TEST(scatter_reduce_backward_like_cpu),
        KT_TEST(bad_indices_fail_clearly),
        KT_TEST(losses_like_cpu),
        KT_TEST(training_backward_like_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
