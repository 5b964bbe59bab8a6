/*
 * test_index.c — joining and indexing ops: cat, stack, split, chunk, repeat,
 * pad, index_select, gather, scatter_add, take_along_dim, embedding.
 * Expected values come from PyTorch 1.13; the tests cover dtypes,
 * non-contiguous inputs, empty tensors, Meta shapes, determinism under
 * threads and the error paths with their messages.
 */
#include "harness.h"

#include <stdlib.h>

static const kl_dtype all_dtypes[] = {KL_F32, KL_F64, KL_F16, KL_BF16, KL_I32, KL_I64, KL_U8, KL_BOOL};
#define NDT ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* A dt tensor of the given shape holding vals (converted from double). */
static kl_tensor *mk(kl_dtype dt, int nd, const int64_t *shape, const double *vals) {
    return kl_to_dtype(kl_from_data(vals, nd, shape, KL_F64), dt);
}
static kl_tensor *mki(int nd, const int64_t *shape, const int64_t *vals) {
    return kl_from_data(vals, nd, shape, KL_I64);
}
/* 0, 1, 2, ... as dt, shaped. */
static kl_tensor *seq(kl_dtype dt, int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return kl_reshape(kl_to_dtype(kl_arange(0, (double)n, 1, KL_F64), dt), nd, shape);
}

/* Same shape, dtype and values (NaN equal to NaN). */
static void assert_same(const kl_tensor *a, const kl_tensor *b) {
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(kl_dtype_of(a), kl_dtype_of(b));
    kt_assert_shape(a, kl_ndim(b), kl_shape(b));
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double x = kt_get(a, i), y = kt_get(b, i);
        if (!(x == y || (isnan(x) && isnan(y)))) {
            print_error("element %lld: %g vs %g\n", (long long)i, x, y);
            fail();
        }
    }
}

/* ---- cat ------------------------------------------------------------------------- */

static void cat_values(void **s) {
    (void)s;
    kl_tensor *a = seq(KL_F32, KL_SHAPE(2, 3));
    kl_tensor *b = mk(KL_F32, KL_SHAPE(2, 1), (double[]){10, 11});
    kl_tensor *y = kl_cat(2, (kl_tensor *[]){a, b}, 1);
    kt_assert_shape(y, KL_SHAPE(2, 4));
    KT_VALUES(y, 0, 0, 1, 2, 10, 3, 4, 5, 11);
    kl_tensor *c = mk(KL_F32, KL_SHAPE(1, 3), (double[]){20, 21, 22});
    y = kl_cat(2, (kl_tensor *[]){a, c}, -2);
    kt_assert_shape(y, KL_SHAPE(3, 3));
    KT_VALUES(y, 0, 0, 1, 2, 3, 4, 5, 20, 21, 22);
    /* one input: a copy */
    y = kl_cat(1, (kl_tensor *[]){a}, 0);
    assert_int_equal(kl_shares_storage(y, a), 0);
    KT_VALUES(y, 0, 0, 1, 2, 3, 4, 5);
}

static void cat_noncontiguous(void **s) {
    (void)s;
    kl_tensor *t = seq(KL_F32, KL_SHAPE(3, 4));
    kl_tensor *y = kl_cat(2, (kl_tensor *[]){kl_t(t), kl_t(kl_slice(t, 1, 0, INT64_MAX, 2))}, 0);
    kt_assert_shape(y, KL_SHAPE(6, 3));
    KT_VALUES(y, 0, 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 0, 4, 8, 2, 6, 10);
    y = kl_cat(2, (kl_tensor *[]){kl_t(t), kl_t(kl_slice(t, 0, 1, 3, 1))}, 1);
    kt_assert_shape(y, KL_SHAPE(4, 5));
    KT_VALUES(y, 0, 0, 4, 8, 4, 8, 1, 5, 9, 5, 9, 2, 6, 10, 6, 10, 3, 7, 11, 7, 11);
    /* a broadcast (stride 0) input */
    kl_tensor *e = kl_expand(mk(KL_F32, KL_SHAPE(1, 2), (double[]){7, 8}), KL_SHAPE(3, 2));
    y = kl_cat(2, (kl_tensor *[]){e, kl_slice(t, 1, 0, 2, 1)}, 1);
    KT_VALUES(y, 0, 7, 8, 0, 1, 7, 8, 4, 5, 7, 8, 8, 9);
}

static void cat_promotes(void **s) {
    (void)s;
    kl_tensor *f = mk(KL_F32, KL_SHAPE(2), (double[]){1.5, 2.5});
    kl_tensor *i = mk(KL_I32, KL_SHAPE(1), (double[]){7});
    kl_tensor *y = kl_cat(2, (kl_tensor *[]){i, f}, 0);
    assert_int_equal(kl_dtype_of(y), KL_F32);
    KT_VALUES(y, 0, 7, 1.5, 2.5);
    kl_tensor *u = mk(KL_U8, KL_SHAPE(2), (double[]){200, 3});
    kl_tensor *b = mk(KL_BOOL, KL_SHAPE(1), (double[]){1});
    y = kl_cat(2, (kl_tensor *[]){b, u}, 0);
    assert_int_equal(kl_dtype_of(y), KL_U8);
    KT_VALUES(y, 0, 1, 200, 3);
    y = kl_cat(2, (kl_tensor *[]){i, mk(KL_I64, KL_SHAPE(1), (double[]){-4})}, 0);
    assert_int_equal(kl_dtype_of(y), KL_I64);
    KT_VALUES(y, 0, 7, -4);
    y = kl_cat(2, (kl_tensor *[]){mk(KL_F16, KL_SHAPE(1), (double[]){0.5}), mk(KL_BF16, KL_SHAPE(1), (double[]){3})}, 0);
    assert_int_equal(kl_dtype_of(y), KL_F32);
    KT_VALUES(y, 0, 0.5, 3);
    y = kl_cat(3, (kl_tensor *[]){u, i, b}, 0);
    assert_int_equal(kl_dtype_of(y), KL_I32);
    KT_VALUES(y, 0, 200, 3, 7, 1);
}

static void cat_legacy_empty_and_zero_size(void **s) {
    (void)s;
    kl_tensor *a = seq(KL_F32, KL_SHAPE(2, 3));
    kl_tensor *e = kl_empty(KL_SHAPE(0), KL_F64);
    /* skipped for shapes (even before the first real tensor), not for promotion */
    kl_tensor *y = kl_cat(3, (kl_tensor *[]){e, a, e}, -1);
    kt_assert_shape(y, KL_SHAPE(2, 3));
    assert_int_equal(kl_dtype_of(y), KL_F64);
    KT_VALUES(y, 0, 0, 1, 2, 3, 4, 5);
    y = kl_cat(2, (kl_tensor *[]){e, e}, 5); /* all skipped: [0], dim unchecked */
    kt_assert_shape(y, KL_SHAPE(0));
    y = kl_cat(2, (kl_tensor *[]){kl_empty(KL_SHAPE(0, 3), KL_F32), a}, 0);
    kt_assert_shape(y, KL_SHAPE(2, 3));
    KT_VALUES(y, 0, 0, 1, 2, 3, 4, 5);
    y = kl_cat(2, (kl_tensor *[]){kl_empty(KL_SHAPE(1, 0), KL_F32), kl_empty(KL_SHAPE(2, 0), KL_F32)}, 0);
    kt_assert_shape(y, KL_SHAPE(3, 0));
    /* a 2-D empty tensor is not skipped */
    assert_null(kl_cat(2, (kl_tensor *[]){a, kl_empty(KL_SHAPE(2, 0), KL_F32)}, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cat: shapes [2,3] (tensor 0) and [2,0] (tensor 1) must match except in dim 0");
}

static void cat_errors(void **s) {
    (void)s;
    kl_tensor *a = seq(KL_F32, KL_SHAPE(2, 3));
    assert_null(kl_cat(0, (kl_tensor *[]){a}, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_cat: expects a non-empty list of tensors");
    assert_null(kl_cat(2, NULL, 0));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_cat: tensor list pointer is NULL");
    assert_null(kl_cat(2, (kl_tensor *[]){a, NULL}, 0));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_cat");
    assert_null(kl_cat(2, (kl_tensor *[]){a, kl_ones(KL_SHAPE(3, 3), KL_F32)}, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cat: shapes [2,3] (tensor 0) and [3,3] (tensor 1) must match except in dim 1");
    assert_null(kl_cat(2, (kl_tensor *[]){a, kl_ones(KL_SHAPE(2, 3, 4), KL_F32)}, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cat: tensors must have the same number of dims, got [2,3] (tensor 0) and [2,3,4] (tensor 1)");
    assert_null(kl_cat(2, (kl_tensor *[]){a, kl_scalar_tensor(1, KL_F32)}, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_cat: a 0-dim tensor (tensor 1) cannot be concatenated");
    assert_null(kl_cat(1, (kl_tensor *[]){a}, 2));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_cat: dim 2 out of range");
    assert_null(kl_cat(2, (kl_tensor *[]){a, kl_empty_on(KL_SHAPE(2, 3), KL_F32, KL_DEVICE_META)}, 0));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_cat");
}

/* Big enough for the thread pool; along dim 0 the copies are memcpys. */
static void cat_large(void **s) {
    (void)s;
    kl_set_num_threads(4);
    kl_tensor *a = seq(KL_F32, KL_SHAPE(400, 500)), *b = kl_t(seq(KL_F32, KL_SHAPE(300, 400)));
    kl_tensor *y = kl_cat(2, (kl_tensor *[]){a, b}, 1);
    kt_assert_shape(y, KL_SHAPE(400, 800));
    assert_true(kt_get(y, 0) == 0 && kt_get(y, 499) == 499 && kt_get(y, 500) == 0 && kt_get(y, 501) == 400);
    assert_true(kt_get(y, 399 * 800 + 799) == 299 * 400 + 399);
    y = kl_cat(2, (kl_tensor *[]){a, kl_to_dtype(a, KL_I32)}, 0);
    kt_assert_shape(y, KL_SHAPE(800, 500));
    assert_true(kt_get(y, 400 * 500 - 1) == 400 * 500 - 1 && kt_get(y, 400 * 500 + 1) == 1);
    assert_true(kt_get(y, 800 * 500 - 1) == 400 * 500 - 1);
    kl_set_num_threads(2);
}

/* ---- stack ----------------------------------------------------------------------- */

static void stack_values(void **s) {
    (void)s;
    kl_tensor *a = seq(KL_F32, KL_SHAPE(2, 3)), *b = kl_add_scalar(a, 10);
    kl_tensor *y = kl_stack(2, (kl_tensor *[]){a, b}, 1);
    kt_assert_shape(y, KL_SHAPE(2, 2, 3));
    KT_VALUES(y, 0, 0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15);
    y = kl_stack(2, (kl_tensor *[]){a, kl_t(kl_t(b))}, -1);
    kt_assert_shape(y, KL_SHAPE(2, 3, 2));
    KT_VALUES(y, 0, 0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15);
    y = kl_stack(2, (kl_tensor *[]){kl_scalar_tensor(1, KL_F32), kl_scalar_tensor(2, KL_I64)}, 0);
    kt_assert_shape(y, KL_SHAPE(2));
    assert_int_equal(kl_dtype_of(y), KL_F32);
    KT_VALUES(y, 0, 1, 2);
    y = kl_stack(1, (kl_tensor *[]){kl_empty(KL_SHAPE(0), KL_F32)}, 0);
    kt_assert_shape(y, KL_SHAPE(1, 0));
}

static void stack_errors(void **s) {
    (void)s;
    kl_tensor *a = seq(KL_F32, KL_SHAPE(2, 3));
    assert_null(kl_stack(2, (kl_tensor *[]){a, kl_ones(KL_SHAPE(3, 2), KL_F32)}, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_stack: expects tensors of one shape, got [2,3] (tensor 0) and [3,2] (tensor 1)");
    assert_null(kl_stack(2, (kl_tensor *[]){a, a}, 3));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_stack: dim 3 out of range");
    assert_null(kl_stack(0, (kl_tensor *[]){a}, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_stack: expects a non-empty list");
    kl_tensor *big = kl_ones(8, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 2}, KL_F32);
    assert_null(kl_stack(1, (kl_tensor *[]){big}, 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_stack: stacking tensors of 8 dims");
}

/* ---- split and chunk -------------------------------------------------------------- */

static void assert_sizes(kl_tensor **p, int n, int dim, const int64_t *sizes) {
    for (int i = 0; i < n; i++) assert_int_equal(kl_shape(p[i])[dim], sizes[i]);
}

static void split_pieces(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(10)), *p[16];
    assert_int_equal(kl_split(x, 3, 0, p, 16), 4);
    assert_sizes(p, 4, 0, (int64_t[]){3, 3, 3, 1});
    KT_VALUES(p[3], 0, 9);
    KT_VALUES(p[1], 0, 3, 4, 5);
    assert_int_equal(kl_shares_storage(p[1], x), 1); /* views */
    assert_int_equal(kl_split(x, 20, 0, p, 16), 1);
    assert_sizes(p, 1, 0, (int64_t[]){10});
    /* more pieces than one call's output slots */
    assert_int_equal(kl_split(x, 1, -1, p, 16), 10);
    for (int i = 0; i < 10; i++) KT_VALUES(p[i], 0, i);
    /* max_out smaller than the count: only max_out written, the count returned */
    p[2] = p[3] = NULL;
    assert_int_equal(kl_split(x, 2, 0, p, 2), 5);
    assert_null(p[2]);
    KT_VALUES(p[1], 0, 2, 3);
    assert_int_equal(kl_split(x, 2, 0, NULL, 0), 5);
    /* along dim 1 of a transposed tensor */
    kl_tensor *m = kl_t(seq(KL_F32, KL_SHAPE(3, 2)));
    assert_int_equal(kl_split(m, 2, 1, p, 16), 2);
    KT_VALUES(p[0], 0, 0, 2, 1, 3);
    KT_VALUES(p[1], 0, 4, 5);
    /* empty dims */
    assert_int_equal(kl_split(kl_empty(KL_SHAPE(0), KL_F32), 0, 0, p, 16), 1);
    assert_sizes(p, 1, 0, (int64_t[]){0});
    assert_int_equal(kl_split(kl_empty(KL_SHAPE(2, 0), KL_F32), 3, 1, p, 16), 1);
    kt_assert_shape(p[0], KL_SHAPE(2, 0));
}

static void chunk_pieces(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_I64, KL_SHAPE(10)), *p[32];
    assert_int_equal(kl_chunk(x, 3, 0, p, 32), 3);
    assert_sizes(p, 3, 0, (int64_t[]){4, 4, 2});
    assert_int_equal(kl_chunk(x, 4, 0, p, 32), 4);
    assert_sizes(p, 4, 0, (int64_t[]){3, 3, 3, 1});
    assert_int_equal(kl_chunk(x, 6, 0, p, 32), 5); /* fewer than asked, as torch */
    assert_sizes(p, 5, 0, (int64_t[]){2, 2, 2, 2, 2});
    assert_int_equal(kl_chunk(x, 20, 0, p, 32), 10);
    KT_VALUES(p[9], 0, 9);
    assert_int_equal(kl_chunk(seq(KL_F32, KL_SHAPE(5)), 4, 0, p, 32), 3);
    assert_sizes(p, 3, 0, (int64_t[]){2, 2, 1});
    assert_int_equal(kl_chunk(kl_empty(KL_SHAPE(0), KL_F32), 3, 0, p, 32), 3);
    assert_sizes(p, 3, 0, (int64_t[]){0, 0, 0});
    assert_int_equal(kl_chunk(kl_empty(KL_SHAPE(2, 0), KL_F32), 3, -1, p, 1), 3);
    kt_assert_shape(p[0], KL_SHAPE(2, 0));
    assert_int_equal(kl_chunk(x, 3, 0, p, 1), 3);
    KT_VALUES(p[0], 0, 0, 1, 2, 3);
}

static void split_chunk_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(10)), *p[4];
    assert_int_equal(kl_split(x, 0, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_split: split_size 0 needs dim 0 to have size 0, not 10");
    assert_int_equal(kl_split(x, -1, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_split: split_size must be non-negative, got -1");
    assert_int_equal(kl_split(kl_scalar_tensor(1, KL_F32), 1, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_split: expects a tensor with at least 1 dim");
    assert_int_equal(kl_split(x, 2, 1, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_split: dim 1 out of range");
    assert_int_equal(kl_split(x, 2, 0, NULL, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_split: output array is NULL");
    assert_int_equal(kl_split(x, 2, 0, p, -1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_split: max_out must be non-negative");
    assert_int_equal(kl_chunk(x, 0, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_chunk: chunks must be positive, got 0");
    assert_int_equal(kl_chunk(kl_scalar_tensor(1, KL_F32), 2, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_chunk: expects a tensor with at least 1 dim");
    assert_int_equal(kl_chunk(NULL, 2, 0, p, 4), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_chunk");
}

/* ---- repeat ------------------------------------------------------------------------ */

static void repeat_values(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    kl_tensor *y = kl_repeat(x, KL_SHAPE(2, 1, 2));
    kt_assert_shape(y, KL_SHAPE(2, 2, 6));
    KT_VALUES(y, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5);
    y = kl_repeat(kl_t(x), KL_SHAPE(1, 2));
    kt_assert_shape(y, KL_SHAPE(3, 4));
    KT_VALUES(y, 0, 0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5);
    y = kl_repeat(x, KL_SHAPE(2, 0));
    kt_assert_shape(y, KL_SHAPE(4, 0));
    y = kl_repeat(kl_scalar_tensor(3, KL_F32), 0, NULL);
    kt_assert_shape(y, 0, NULL);
    KT_VALUES(y, 0, 3);
    y = kl_repeat(kl_scalar_tensor(3, KL_F32), KL_SHAPE(2));
    KT_VALUES(y, 0, 3, 3);
    y = kl_repeat(x, 8, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 2});
    kt_assert_shape(y, 8, (int64_t[]){1, 1, 1, 1, 1, 1, 2, 6});
    /* large: tiles copied by the pool */
    kl_set_num_threads(4);
    y = kl_repeat(seq(KL_I32, KL_SHAPE(300, 7)), KL_SHAPE(50, 3));
    kt_assert_shape(y, KL_SHAPE(15000, 21));
    assert_true(kt_get(y, 14999 * 21 + 20) == 299 * 7 + 6 && kt_get(y, 300 * 21 + 8) == 1);
    kl_set_num_threads(2);
}

static void repeat_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    assert_null(kl_repeat(x, KL_SHAPE(2)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_repeat: 1 repeats for [2,3] float32 cpu: give at least one per dim");
    assert_null(kl_repeat(x, KL_SHAPE(-1, 1)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_repeat: repeats [-1,1] has a negative count");
    assert_null(kl_repeat(x, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_repeat: 9 repeats would give more than 8 dims");
    assert_null(kl_repeat(x, KL_SHAPE(INT64_MAX / 2, 1)));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "kl_repeat");
}

/* ---- pad ---------------------------------------------------------------------------- */

static void pad_values(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    kl_tensor *y = kl_pad(x, KL_SHAPE(1, -1), 0);
    kt_assert_shape(y, KL_SHAPE(2, 3));
    KT_VALUES(y, 0, 0, 0, 1, 0, 3, 4);
    y = kl_pad(x, KL_SHAPE(1, 2, -1, 0), 7);
    kt_assert_shape(y, KL_SHAPE(1, 6));
    KT_VALUES(y, 0, 7, 3, 4, 5, 7, 7);
    y = kl_pad(kl_t(x), KL_SHAPE(0, 1, 1, 0), -1);
    kt_assert_shape(y, KL_SHAPE(4, 3));
    KT_VALUES(y, 0, -1, -1, -1, 0, 3, -1, 1, 4, -1, 2, 5, -1);
    /* pure cropping, down to empty */
    y = kl_pad(x, KL_SHAPE(-3, 0), 0);
    kt_assert_shape(y, KL_SHAPE(2, 0));
    y = kl_pad(x, KL_SHAPE(0, 0, -1, -1), 0);
    kt_assert_shape(y, KL_SHAPE(0, 3));
    y = kl_pad(x, 0, NULL, 0);
    assert_int_equal(kl_shares_storage(y, x), 0);
    KT_VALUES(y, 0, 0, 1, 2, 3, 4, 5);
    y = kl_pad(kl_empty(KL_SHAPE(0, 3), KL_F32), KL_SHAPE(1, 0), 1);
    kt_assert_shape(y, KL_SHAPE(0, 4));
    y = kl_pad(kl_empty(KL_SHAPE(0, 3), KL_F32), KL_SHAPE(0, 0, 1, 0), 1);
    KT_VALUES(y, 0, 1, 1, 1);
    /* the value converts as PyTorch's checked cast: truncation, NaN in floats, bool */
    y = kl_pad(kl_to_dtype(x, KL_I32), KL_SHAPE(1, 0), -2.7);
    KT_VALUES(y, 0, -2, 0, 1, 2, -2, 3, 4, 5);
    y = kl_pad(x, KL_SHAPE(1, 0), NAN);
    KT_VALUES(y, 0, NAN, 0, 1, 2, NAN, 3, 4, 5);
    y = kl_pad(kl_to_dtype(x, KL_BOOL), KL_SHAPE(1, 0), 2);
    KT_VALUES(y, 0, 1, 0, 1, 1, 1, 1, 1, 1);
    y = kl_pad(kl_to_dtype(x, KL_F16), KL_SHAPE(0, 1), INFINITY);
    KT_VALUES(y, 0, 0, 1, 2, INFINITY, 3, 4, 5, INFINITY);
}

static void pad_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    assert_null(kl_pad(x, KL_SHAPE(1), 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_pad: needs a (before, after) pair per dim, got 1 pad values");
    assert_null(kl_pad(x, KL_SHAPE(1, 1, 1, 1, 1, 1), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_pad: 6 pad values pad 3 dims, but [2,3] float32 cpu has 2");
    assert_null(kl_pad(x, KL_SHAPE(-2, -2), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_pad: padding (-2, -2) crops more than the 3 elements of dim 1");
    assert_null(kl_pad(x, KL_SHAPE(-4, 4), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_pad: padding (-4, 4) crops more");
    /* PyTorch refuses a padded dim that ends empty once anything grows */
    assert_null(kl_pad(x, KL_SHAPE(-3, 0, 1, 0), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_pad: dim 1 of size 3 padded by (-3, 0) would be empty");
    assert_null(kl_pad(kl_empty(KL_SHAPE(2, 0), KL_F32), KL_SHAPE(0, 0, 1, 0), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_pad: dim 1 of size 0 padded by (0, 0) would be empty");
    /* an integral C scalar wraps into uint8 as PyTorch's integer scalars do */
    assert_non_null(kl_pad(kl_to_dtype(x, KL_U8), KL_SHAPE(1, 0), -1));
    assert_null(kl_pad(kl_to_dtype(x, KL_U8), KL_SHAPE(1, 0), -256));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_pad: value -256 cannot be converted to uint8 without overflow");
    assert_null(kl_pad(kl_to_dtype(x, KL_U8), KL_SHAPE(1, 0), 255.5));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_pad: value 255.5 cannot be converted to uint8");
    assert_null(kl_pad(kl_to_dtype(x, KL_I32), KL_SHAPE(1, 0), NAN));
    KT_EXPECT_ERROR(KL_ERR_ARG, "cannot be converted to int32");
    assert_null(kl_pad(kl_to_dtype(x, KL_F16), KL_SHAPE(1, 0), 1e6));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_pad: value 1e+06 cannot be converted to float16");
    assert_null(kl_pad(x, KL_SHAPE(1, 0), 1e39));
    KT_EXPECT_ERROR(KL_ERR_ARG, "cannot be converted to float32");
    assert_null(kl_pad(x, KL_SHAPE(INT64_MAX, 0), 0));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "kl_pad: padding");
}

/* ---- every dtype through the data-moving ops ------------------------------------------
 * Moving data commutes with casting: op(cast(x)) == cast(op(x)). */

static void every_dtype(void **s) {
    (void)s;
    kl_tensor *base = kl_t(seq(KL_F64, KL_SHAPE(3, 4))); /* [4,3], transposed */
    kl_tensor *idx = mki(KL_SHAPE(2, 3), (int64_t[]){3, 0, 1, 1, 2, 3});
    kl_tensor *idx1 = mki(KL_SHAPE(3), (int64_t[]){2, 0, 2});
    kl_tensor *w = seq(KL_F64, KL_SHAPE(4, 2));
    kl_tensor *sidx = mki(KL_SHAPE(2, 3), (int64_t[]){0, 0, 1, 3, 3, 3});
    for (int k = 0; k < NDT; k++) {
        kl_scope_begin();
        kl_dtype dt = all_dtypes[k];
        kl_tensor *x = kl_t(kl_to_dtype(kl_t(base), dt)); /* transposed too */
#define CHECK_SAME(expr_x, expr_base) assert_same((expr_x), kl_to_dtype((expr_base), dt))
        CHECK_SAME(kl_cat(2, (kl_tensor *[]){x, x}, 1), kl_cat(2, (kl_tensor *[]){base, base}, 1));
        CHECK_SAME(kl_stack(2, (kl_tensor *[]){x, x}, 0), kl_stack(2, (kl_tensor *[]){base, base}, 0));
        CHECK_SAME(kl_repeat(x, KL_SHAPE(2, 1, 3)), kl_repeat(base, KL_SHAPE(2, 1, 3)));
        CHECK_SAME(kl_pad(x, KL_SHAPE(1, -1, 2, 0), 1), kl_pad(base, KL_SHAPE(1, -1, 2, 0), 1));
        CHECK_SAME(kl_index_select(x, 0, idx1), kl_index_select(base, 0, idx1));
        CHECK_SAME(kl_index_select(x, 1, idx1), kl_index_select(base, 1, idx1));
        CHECK_SAME(kl_gather(x, 0, idx), kl_gather(base, 0, idx));
        CHECK_SAME(kl_take_along_dim(x, idx, 0), kl_take_along_dim(base, idx, 0));
        CHECK_SAME(kl_embedding(kl_to_dtype(w, dt), idx), kl_embedding(w, idx));
        kl_tensor *p[4];
        assert_int_equal(kl_split(x, 3, 0, p, 4), 2);
        CHECK_SAME(p[1], kl_slice(base, 0, 3, 4, 1));
        /* scatter_add accumulates in the dtype: compare with the f64 result cast
         * only where no rounding or wrapping happens (small integers) */
        kl_tensor *src = kl_to_dtype(kl_ones(KL_SHAPE(2, 3), KL_F64), dt);
        kl_tensor *y = kl_scatter_add(kl_zeros_like(x), 0, sidx, src);
        if (dt == KL_BOOL)
            assert_same(y, kl_to_dtype(kl_scatter_add(kl_zeros(KL_SHAPE(4, 3), KL_F64), 0, sidx,
                                                      kl_ones(KL_SHAPE(2, 3), KL_F64)), dt));
        else
            KT_VALUES(y, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1);
#undef CHECK_SAME
        kl_scope_end();
    }
}

/* ---- index_select ---------------------------------------------------------------------- */

static void index_select_values(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(3, 4));
    kl_tensor *y = kl_index_select(x, 0, mki(KL_SHAPE(3), (int64_t[]){2, 0, 2}));
    kt_assert_shape(y, KL_SHAPE(3, 4));
    KT_VALUES(y, 0, 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11);
    y = kl_index_select(x, -1, mk(KL_I32, KL_SHAPE(2), (double[]){3, 0}));
    kt_assert_shape(y, KL_SHAPE(3, 2));
    KT_VALUES(y, 0, 3, 0, 7, 4, 11, 8);
    /* transposed x, strided index */
    kl_tensor *ix = kl_slice(mki(KL_SHAPE(4), (int64_t[]){2, 0, 1, 2}), 0, 0, INT64_MAX, 2);
    y = kl_index_select(kl_t(x), 1, ix);
    kt_assert_shape(y, KL_SHAPE(4, 2));
    KT_VALUES(y, 0, 8, 4, 9, 5, 10, 6, 11, 7);
    y = kl_index_select(x, 1, kl_scalar_tensor(1, KL_I64));
    kt_assert_shape(y, KL_SHAPE(3, 1));
    KT_VALUES(y, 0, 1, 5, 9);
    y = kl_index_select(x, 0, kl_empty(KL_SHAPE(0), KL_I64));
    kt_assert_shape(y, KL_SHAPE(0, 4));
    y = kl_index_select(kl_scalar_tensor(5, KL_F32), 0, mki(KL_SHAPE(2), (int64_t[]){0, 0}));
    kt_assert_shape(y, 0, NULL); /* PyTorch keeps 0-dim */
    KT_VALUES(y, 0, 5);
    y = kl_index_select(kl_empty(KL_SHAPE(0, 3), KL_F32), 1, mki(KL_SHAPE(2), (int64_t[]){2, 2}));
    kt_assert_shape(y, KL_SHAPE(0, 2));
    /* large, both layouts */
    kl_set_num_threads(4);
    kl_tensor *big = seq(KL_F32, KL_SHAPE(1000, 100));
    int64_t *bv = malloc(sizeof(int64_t) * 2000);
    for (int i = 0; i < 2000; i++) bv[i] = i * 7 % 1000;
    kl_tensor *bi = kl_from_data(bv, KL_SHAPE(2000), KL_I64);
    free(bv);
    y = kl_index_select(big, 0, bi);
    kt_assert_shape(y, KL_SHAPE(2000, 100));
    assert_true(kt_get(y, 1999 * 100 + 5) == (1999 * 7 % 1000) * 100 + 5);
    y = kl_index_select(kl_t(big), 1, bi);
    kt_assert_shape(y, KL_SHAPE(100, 2000));
    assert_true(kt_get(y, 99 * 2000 + 1999) == (1999 * 7 % 1000) * 100 + 99);
    kl_set_num_threads(2);
}

static void index_select_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(3, 4));
    assert_null(kl_index_select(x, 0, mki(KL_SHAPE(2), (int64_t[]){1, 3})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_index_select: index 3 is out of range for dim 0 with size 3");
    assert_null(kl_index_select(x, 1, mki(KL_SHAPE(1), (int64_t[]){-1})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_index_select: index -1 is out of range for dim 1 with size 4 (negative indices are not accepted)");
    assert_null(kl_index_select(x, 1, mki(KL_SHAPE(1), (int64_t[]){INT64_MIN})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "index -9223372036854775808 is out of range");
    assert_null(kl_index_select(x, 0, mk(KL_F32, KL_SHAPE(1), (double[]){1})));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_index_select: index must be int64 or int32, got [1] float32 cpu");
    assert_null(kl_index_select(x, 0, mk(KL_U8, KL_SHAPE(1), (double[]){1})));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "got [1] uint8 cpu");
    assert_null(kl_index_select(x, 0, mki(KL_SHAPE(1, 1), (int64_t[]){1})));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_index_select: index must be a vector (1-D or 0-dim), got [1,1] int64 cpu");
    assert_null(kl_index_select(x, 2, mki(KL_SHAPE(1), (int64_t[]){1})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_index_select: dim 2 out of range");
    assert_null(kl_index_select(kl_empty(KL_SHAPE(0, 3), KL_F32), 0, mki(KL_SHAPE(1), (int64_t[]){0})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "index 0 is out of range for dim 0 with size 0");
    assert_null(kl_index_select(kl_scalar_tensor(5, KL_F32), 0, mki(KL_SHAPE(1), (int64_t[]){1})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "index 1 is out of range for dim 0 with size 1");
}

/* ---- gather ------------------------------------------------------------------------------- */

static void gather_values(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(3, 4));
    kl_tensor *y = kl_gather(x, 1, mki(KL_SHAPE(2, 3), (int64_t[]){0, 3, 3, 1, 0, 2}));
    kt_assert_shape(y, KL_SHAPE(2, 3));
    KT_VALUES(y, 0, 0, 3, 3, 5, 4, 6);
    /* index larger than x along dim is fine */
    y = kl_gather(x, -2, mki(KL_SHAPE(4, 4), (int64_t[]){2, 1, 0, 0, 0, 0, 1, 2, 1, 1, 1, 1, 2, 2, 2, 2}));
    KT_VALUES(y, 0, 8, 5, 2, 3, 0, 1, 6, 11, 4, 5, 6, 7, 8, 9, 10, 11);
    y = kl_gather(kl_t(x), 0, kl_t(mki(KL_SHAPE(2, 2), (int64_t[]){2, 0, 1, 0})));
    KT_VALUES(y, 0, 2, 5, 0, 4);
    /* broadcast (stride 0) index */
    y = kl_gather(x, 1, kl_expand(mki(KL_SHAPE(1, 1), (int64_t[]){2}), KL_SHAPE(3, 2)));
    KT_VALUES(y, 0, 2, 2, 6, 6, 10, 10);
    /* 0-dim counts as 1-D */
    y = kl_gather(kl_scalar_tensor(5, KL_F32), 0, kl_scalar_tensor(0, KL_I64));
    kt_assert_shape(y, 0, NULL);
    KT_VALUES(y, 0, 5);
    y = kl_gather(kl_scalar_tensor(5, KL_F32), 0, mki(KL_SHAPE(2), (int64_t[]){0, 0}));
    KT_VALUES(y, 0, 5, 5);
    y = kl_gather(mk(KL_F32, KL_SHAPE(1), (double[]){5}), 0, kl_scalar_tensor(0, KL_I64));
    kt_assert_shape(y, 0, NULL);
    y = kl_gather(x, 1, kl_empty(KL_SHAPE(0, 1), KL_I64));
    kt_assert_shape(y, KL_SHAPE(0, 1));
    y = kl_gather(kl_empty(KL_SHAPE(3, 0), KL_F32), 1, kl_empty(KL_SHAPE(3, 0), KL_I64));
    kt_assert_shape(y, KL_SHAPE(3, 0));
}

static void gather_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(3, 4));
    assert_null(kl_gather(x, 1, mki(KL_SHAPE(1, 2), (int64_t[]){0, -1})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_gather: index -1 is out of range for dim 1 with size 4");
    assert_null(kl_gather(x, 1, mki(KL_SHAPE(1, 2), (int64_t[]){0, 4})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_gather: index 4 is out of range for dim 1 with size 4");
    assert_null(kl_gather(x, 1, mk(KL_I32, KL_SHAPE(1, 1), (double[]){0})));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_gather: index must be int64, got [1,1] int32 cpu");
    assert_null(kl_gather(x, 1, mki(KL_SHAPE(2), (int64_t[]){0, 3})));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_gather: index [2] int64 cpu must have as many dims as the input [3,4] float32 cpu");
    assert_null(kl_gather(x, 1, kl_zeros(KL_SHAPE(4, 1), KL_I64)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_gather: index [4,1] int64 cpu is larger than the input [3,4] float32 cpu in dim 0 (only dim 1 may differ)");
    assert_null(kl_gather(kl_empty(KL_SHAPE(3, 0), KL_F32), 1, kl_zeros(KL_SHAPE(3, 2), KL_I64)));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "index 0 is out of range for dim 1 with size 0");
    assert_null(kl_gather(x, 2, kl_zeros(KL_SHAPE(3, 2), KL_I64)));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_gather: dim 2 out of range");
}

/* ---- scatter_add ------------------------------------------------------------------------- */

static void scatter_add_values(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(3, 4), KL_F32);
    kl_tensor *idx = mki(KL_SHAPE(2, 4), (int64_t[]){0, 1, 0, 2, 0, 0, 0, 0});
    kl_tensor *src = kl_reshape(kl_arange(1, 9, 1, KL_F32), KL_SHAPE(2, 4));
    kl_tensor *y = kl_scatter_add(x, 0, idx, src); /* duplicates accumulate */
    KT_VALUES(y, 0, 6, 6, 10, 8, 0, 2, 0, 0, 0, 0, 0, 4);
    KT_VALUES(x, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0); /* out of place */
    y = kl_scatter_add(kl_ones(KL_SHAPE(2, 3), KL_F32), -1, mki(KL_SHAPE(2, 4), (int64_t[]){2, 2, 2, 0, 1, 1, 0, 1}),
                       src);
    KT_VALUES(y, 0, 5, 1, 7, 8, 20, 1);
    /* in place into a transposed view, src sliced */
    kl_tensor *base = kl_zeros(KL_SHAPE(4, 3), KL_F32), *xt = kl_t(base);
    int64_t v0 = kl_version_of(base);
    kl_tensor *src2 = kl_slice(kl_reshape(kl_arange(1, 7, 1, KL_F32), KL_SHAPE(2, 3)), 1, 0, 2, 1);
    assert_ptr_equal(kl_scatter_add_inplace(xt, 1, mki(KL_SHAPE(2, 2), (int64_t[]){3, 3, 0, 1}), src2), xt);
    assert_int_equal(kl_version_of(base), v0 + 1);
    KT_VALUES(xt, 0, 0, 0, 0, 3, 4, 5, 0, 0, 0, 0, 0, 0);
    /* 0-dim and mixed 0-dim / 1-D */
    y = kl_scatter_add(kl_scalar_tensor(1, KL_F32), 0, mki(KL_SHAPE(2), (int64_t[]){0, 0}),
                       mk(KL_F32, KL_SHAPE(2), (double[]){2, 3}));
    kt_assert_shape(y, 0, NULL);
    KT_VALUES(y, 0, 6);
    y = kl_scatter_add(kl_zeros(KL_SHAPE(3), KL_F32), 0, kl_scalar_tensor(2, KL_I64), kl_scalar_tensor(5, KL_F32));
    KT_VALUES(y, 0, 0, 0, 5);
    /* an empty index skips every shape check */
    y = kl_scatter_add(kl_zeros(KL_SHAPE(3), KL_F32), 0, kl_empty(KL_SHAPE(0, 7), KL_I64), kl_scalar_tensor(2, KL_F32));
    KT_VALUES(y, 0, 0, 0, 0);
    /* dtype arithmetic: u8 wraps, bool ORs, f16 rounds each add */
    y = kl_scatter_add(kl_zeros(KL_SHAPE(3), KL_U8), 0, mki(KL_SHAPE(2), (int64_t[]){0, 0}),
                       mk(KL_U8, KL_SHAPE(2), (double[]){200, 100}));
    KT_VALUES(y, 0, 44, 0, 0);
    y = kl_scatter_add(kl_zeros(KL_SHAPE(3), KL_BOOL), 0, mki(KL_SHAPE(2), (int64_t[]){0, 0}),
                       kl_ones(KL_SHAPE(2), KL_BOOL));
    KT_VALUES(y, 0, 1, 0, 0);
    y = kl_scatter_add(kl_full(KL_SHAPE(1), 2048, KL_F16), 0, kl_zeros(KL_SHAPE(3), KL_I64), kl_ones(KL_SHAPE(3), KL_F16));
    KT_VALUES(y, 0, 2048); /* torch: 2048 + 1 rounds back to 2048 each time */
    y = kl_scatter_add(kl_zeros(KL_SHAPE(2), KL_I32), 0, mki(KL_SHAPE(2), (int64_t[]){1, 1}),
                       mk(KL_I32, KL_SHAPE(2), (double[]){2147483647, 1}));
    KT_VALUES(y, 0, 0, -2147483648.0);
}

static void scatter_add_errors(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(3, 4), KL_F32), *src = kl_ones(KL_SHAPE(2, 4), KL_F32);
    /* in place: nothing written when an index is bad */
    assert_null(kl_scatter_add_inplace(x, 0, mki(KL_SHAPE(1, 2), (int64_t[]){1, 3}), src));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter_add: index 3 is out of range for dim 0 with size 3");
    KT_VALUES(x, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    assert_null(kl_scatter_add(x, 0, mki(KL_SHAPE(1, 1), (int64_t[]){-1}), src));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_scatter_add: index -1 is out of range for dim 0 with size 3");
    assert_null(kl_scatter_add(x, 0, mk(KL_I32, KL_SHAPE(1, 1), (double[]){1}), src));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter_add: index must be int64, got [1,1] int32 cpu");
    assert_null(kl_scatter_add(x, 0, mki(KL_SHAPE(1, 1), (int64_t[]){1}), kl_to_dtype(src, KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_scatter_add: src [2,4] float64 cpu must have the dtype of self [3,4] float32 cpu");
    assert_null(kl_scatter_add(x, 0, mki(KL_SHAPE(1), (int64_t[]){1}), src));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_scatter_add: index [1] int64 cpu must have as many dims as self [3,4] float32 cpu and src [2,4] float32 cpu");
    assert_null(kl_scatter_add(x, 0, kl_zeros(KL_SHAPE(3, 1), KL_I64), src));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_scatter_add: index [3,1] int64 cpu is larger in dim 0 than src [2,4] float32 cpu or, outside dim 0, than self [3,4] float32 cpu");
    assert_null(kl_scatter_add(x, 0, kl_zeros(KL_SHAPE(1, 5), KL_I64), kl_ones(KL_SHAPE(1, 5), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "is larger in dim 1");
    assert_null(kl_scatter_add(x, 0, kl_zeros(KL_SHAPE(1, 1), KL_I64), NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_scatter_add");
    kl_tensor *ex = kl_expand(kl_zeros(KL_SHAPE(1), KL_F32), KL_SHAPE(3));
    assert_null(kl_scatter_add_inplace(ex, 0, mki(KL_SHAPE(1), (int64_t[]){0}), kl_ones(KL_SHAPE(1), KL_F32)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "broadcast");
}

/* A middle dim with outer and run dims around it; index and src as
 * non-contiguous views too. */
static void scatter_gather_3d(void **s) {
    (void)s;
    kl_tensor *idx = mki(KL_SHAPE(2, 2, 3), (int64_t[]){0, 2, 2, 1, 2, 0, 2, 2, 2, 0, 0, 1});
    kl_tensor *src = kl_reshape(kl_arange(0, 20, 1, KL_F32), KL_SHAPE(2, 2, 5));
    kl_tensor *y = kl_scatter_add(kl_zeros(KL_SHAPE(2, 3, 4), KL_F32), 1, idx, src);
    KT_VALUES(y, 0, 0, 0, 7, 0, 5, 0, 0, 0, 0, 7, 2, 0, 15, 16, 0, 0, 0, 0, 17, 0, 10, 11, 12, 0);
    kl_tensor *idx_nc = kl_permute(kl_contiguous(kl_permute(idx, KL_DIMS(2, 0, 1))), KL_DIMS(1, 2, 0));
    kl_tensor *src_nc = kl_permute(kl_contiguous(kl_permute(src, KL_DIMS(2, 1, 0))), KL_DIMS(2, 1, 0));
    assert_false(kl_is_contiguous(idx_nc));
    assert_same(kl_scatter_add(kl_zeros(KL_SHAPE(2, 3, 4), KL_F32), -2, idx_nc, src_nc), y);
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3, 4));
    y = kl_gather(x, 1, idx);
    KT_VALUES(y, 0, 0, 9, 10, 4, 9, 2, 20, 21, 22, 12, 13, 18);
    assert_same(kl_gather(kl_contiguous(x), 1, idx_nc), y);
}

/* Accumulation order is index order per output element, whatever the thread
 * count: compare bit for bit with a sequential float sum. */
static void scatter_add_deterministic(void **s) {
    (void)s;
    enum { K = 64, M = 4096, S = 5 };
    int64_t *iv = malloc(sizeof(int64_t) * K * M);
    float *sv = malloc(sizeof(float) * K * M), *want = calloc(S * M, sizeof(float));
    for (int k = 0; k < K; k++)
        for (int m = 0; m < M; m++) {
            iv[k * M + m] = (k * 7 + m * 3) % S;
            sv[k * M + m] = (float)(sin(k * 0.37 + m * 1.3) * 1000); /* no float multiply to contract */
            want[iv[k * M + m] * M + m] += sv[k * M + m];
        }
    kl_tensor *idx = kl_from_data(iv, KL_SHAPE(K, M), KL_I64), *src = kl_from_data(sv, KL_SHAPE(K, M), KL_F32);
    for (int threads = 1; threads <= 4; threads += 3) {
        kl_set_num_threads(threads);
        kl_tensor *y = kl_scatter_add(kl_zeros(KL_SHAPE(S, M), KL_F32), 0, idx, src);
        assert_non_null(y);
        assert_memory_equal(kl_data_ptr(y), want, sizeof(float) * S * M);
        /* along the last dim: runs are the lines */
        kl_tensor *yt = kl_scatter_add(kl_zeros(KL_SHAPE(M, S), KL_F32), 1, kl_t(idx), kl_t(src));
        assert_non_null(yt);
        for (int64_t i = 0; i < S * M; i++) assert_true(kt_get(yt, (i % M) * S + i / M) == want[i]);
    }
    kl_set_num_threads(2);
    free(iv);
    free(sv);
    free(want);
}

/* ---- take_along_dim --------------------------------------------------------------------- */

static void take_along_dim_values(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    kl_tensor *y = kl_take_along_dim(x, mki(KL_SHAPE(2, 1), (int64_t[]){0, 2}), 1);
    kt_assert_shape(y, KL_SHAPE(2, 1));
    KT_VALUES(y, 0, 0, 5);
    /* the index broadcasts over x's rows */
    y = kl_take_along_dim(x, mki(KL_SHAPE(1, 4), (int64_t[]){0, 1, 2, 2}), -1);
    kt_assert_shape(y, KL_SHAPE(2, 4));
    KT_VALUES(y, 0, 0, 1, 2, 2, 3, 4, 5, 5);
    /* x broadcasts over the index's leading dim */
    y = kl_take_along_dim(seq(KL_F32, KL_SHAPE(1, 2, 3)), mki(KL_SHAPE(2, 1, 1), (int64_t[]){1, 0}), 1);
    kt_assert_shape(y, KL_SHAPE(2, 1, 3));
    KT_VALUES(y, 0, 3, 4, 5, 0, 1, 2);
    y = kl_take_along_dim(kl_t(x), mki(KL_SHAPE(2, 2), (int64_t[]){5, 0, 1, 1}), KL_DIM_NONE);
    kt_assert_shape(y, KL_SHAPE(4));
    KT_VALUES(y, 0, 5, 0, 3, 3); /* flattened transposed x: 0 3 1 4 2 5 */
    y = kl_take_along_dim(kl_scalar_tensor(5, KL_F32), mki(KL_SHAPE(2), (int64_t[]){0, 0}), KL_DIM_NONE);
    KT_VALUES(y, 0, 5, 5);
}

static void take_along_dim_errors(void **s) {
    (void)s;
    kl_tensor *x = seq(KL_F32, KL_SHAPE(2, 3));
    assert_null(kl_take_along_dim(x, mki(KL_SHAPE(1, 1), (int64_t[]){-1}), 0));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_take_along_dim: index -1 is out of range for dim 0 with size 2");
    assert_null(kl_take_along_dim(x, mki(KL_SHAPE(2), (int64_t[]){1, 6}), KL_DIM_NONE));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_take_along_dim: index 6 is out of range for dim 0 with size 6");
    assert_null(kl_take_along_dim(x, mk(KL_I32, KL_SHAPE(1, 1), (double[]){0}), 0));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_take_along_dim: indices must be int64, got [1,1] int32 cpu");
    assert_null(kl_take_along_dim(x, mki(KL_SHAPE(1), (int64_t[]){0}), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_take_along_dim: x [2,3] float32 cpu and indices [1] int64 cpu must have the same number of dims");
    assert_null(kl_take_along_dim(x, kl_zeros(KL_SHAPE(3, 1), KL_I64), 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "cannot broadcast outside dim 1 (dim 0: 2 vs 3)");
    assert_null(kl_take_along_dim(kl_scalar_tensor(1, KL_F32), kl_scalar_tensor(0, KL_I64), 0));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_take_along_dim: dim 0 given for 0-dim tensors");
}

/* ---- embedding ---------------------------------------------------------------------------- */

static void embedding_values(void **s) {
    (void)s;
    kl_tensor *w = seq(KL_F32, KL_SHAPE(4, 2));
    kl_tensor *y = kl_embedding(w, mki(KL_SHAPE(3, 2), (int64_t[]){3, 0, 1, 1, 2, 3}));
    kt_assert_shape(y, KL_SHAPE(3, 2, 2));
    KT_VALUES(y, 0, 6, 7, 0, 1, 2, 3, 2, 3, 4, 5, 6, 7);
    y = kl_embedding(kl_t(kl_contiguous(kl_t(w))), mk(KL_I32, KL_SHAPE(2), (double[]){2, 0}));
    KT_VALUES(y, 0, 4, 5, 0, 1);
    y = kl_embedding(w, kl_scalar_tensor(1, KL_I64));
    kt_assert_shape(y, KL_SHAPE(2));
    KT_VALUES(y, 0, 2, 3);
    y = kl_embedding(w, kl_empty(KL_SHAPE(0, 2), KL_I64));
    kt_assert_shape(y, KL_SHAPE(0, 2, 2));
    y = kl_embedding(kl_empty(KL_SHAPE(4, 0), KL_F32), mki(KL_SHAPE(1), (int64_t[]){3}));
    kt_assert_shape(y, KL_SHAPE(1, 0));
    /* many rows: memcpy per row across the pool */
    kl_set_num_threads(4);
    kl_tensor *big = seq(KL_F32, KL_SHAPE(1000, 64));
    int64_t *iv = malloc(sizeof(int64_t) * 5000);
    for (int i = 0; i < 5000; i++) iv[i] = i * 13 % 1000;
    kl_tensor *ix = kl_from_data(iv, KL_SHAPE(50, 100), KL_I64);
    free(iv);
    y = kl_embedding(big, ix);
    kt_assert_shape(y, KL_SHAPE(50, 100, 64));
    assert_true(kt_get(y, 4999 * 64 + 63) == (4999 * 13 % 1000) * 64 + 63);
    kl_set_num_threads(2);
}

static void embedding_errors(void **s) {
    (void)s;
    kl_tensor *w = seq(KL_F32, KL_SHAPE(4, 2));
    assert_null(kl_embedding(w, mki(KL_SHAPE(2), (int64_t[]){1, 4})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_embedding: index 4 is out of range for dim 0 with size 4");
    assert_null(kl_embedding(w, mki(KL_SHAPE(1), (int64_t[]){-1})));
    KT_EXPECT_ERROR(KL_ERR_INDEX, "kl_embedding: index -1 is out of range");
    assert_null(kl_embedding(w, mk(KL_F32, KL_SHAPE(1), (double[]){1})));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_embedding: indices must be int64 or int32, got [1] float32 cpu");
    assert_null(kl_embedding(kl_ones(KL_SHAPE(4), KL_F32), mki(KL_SHAPE(1), (int64_t[]){1})));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_embedding: weight must be 2-D [num, dim], got [4] float32 cpu");
    assert_null(kl_embedding(w, kl_zeros(8, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1}, KL_I64)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_embedding: indices [1,1,1,1,1,1,1,1] int64 cpu have 8 dims");
}

/* ---- Meta: shapes only; index values are never read ----------------------------------------- */

static void meta_shapes(void **s) {
    (void)s;
    kl_device M = KL_DEVICE_META;
    kl_tensor *a = kl_empty_on(KL_SHAPE(2, 3), KL_F32, M), *b = kl_empty_on(KL_SHAPE(2, 5), KL_I32, M);
    kl_tensor *y = kl_cat(2, (kl_tensor *[]){a, b}, 1);
    kt_assert_shape(y, KL_SHAPE(2, 8));
    assert_int_equal(kl_device_of(y).type, KL_META);
    kt_assert_shape(kl_stack(2, (kl_tensor *[]){a, a}, 2), KL_SHAPE(2, 3, 2));
    kt_assert_shape(kl_repeat(a, KL_SHAPE(2, 2, 2)), KL_SHAPE(2, 4, 6));
    kt_assert_shape(kl_pad(a, KL_SHAPE(1, 1, -1, 0), 0), KL_SHAPE(1, 5));
    kl_tensor *p[4];
    assert_int_equal(kl_chunk(a, 2, 1, p, 4), 2);
    kt_assert_shape(p[1], KL_SHAPE(2, 1));
    kl_tensor *ix = kl_empty_on(KL_SHAPE(4, 3), KL_I64, M); /* values unknown: no check */
    kt_assert_shape(kl_gather(a, 0, ix), KL_SHAPE(4, 3));
    kt_assert_shape(kl_index_select(a, 1, kl_empty_on(KL_SHAPE(7), KL_I32, M)), KL_SHAPE(2, 7));
    kt_assert_shape(kl_scatter_add(kl_empty_on(KL_SHAPE(5, 3), KL_F32, M), 0, ix, kl_empty_on(KL_SHAPE(4, 3), KL_F32, M)),
                    KL_SHAPE(5, 3));
    kt_assert_shape(kl_take_along_dim(a, kl_empty_on(KL_SHAPE(1, 6), KL_I64, M), 1), KL_SHAPE(2, 6));
    kt_assert_shape(kl_embedding(a, ix), KL_SHAPE(4, 3, 3));
    assert_null(kl_gather(a, 0, kl_empty_on(KL_SHAPE(4, 3), KL_I32, M))); /* dtypes still checked */
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_gather: index must be int64");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(cat_values),          KT_TEST(cat_noncontiguous),     KT_TEST(cat_promotes),
        KT_TEST(cat_legacy_empty_and_zero_size), KT_TEST(cat_errors), KT_TEST(cat_large),
        KT_TEST(stack_values),        KT_TEST(stack_errors),          KT_TEST(split_pieces),
        KT_TEST(chunk_pieces),        KT_TEST(split_chunk_errors),    KT_TEST(repeat_values),
        KT_TEST(repeat_errors),       KT_TEST(pad_values),            KT_TEST(pad_errors),
        KT_TEST(every_dtype),         KT_TEST(index_select_values),   KT_TEST(index_select_errors),
        KT_TEST(gather_values),       KT_TEST(gather_errors),         KT_TEST(scatter_add_values),
        KT_TEST(scatter_add_errors),  KT_TEST(scatter_gather_3d),  KT_TEST(scatter_add_deterministic), KT_TEST(take_along_dim_values),
        KT_TEST(take_along_dim_errors), KT_TEST(embedding_values),    KT_TEST(embedding_errors),
        KT_TEST(meta_shapes),
    };
    return cmocka_run_group_tests_name("index", tests, NULL, NULL);
}
