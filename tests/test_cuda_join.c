/*
 * test_cuda_join.c — the data-movement ops on CUDA tensors (cn_join.c: cat,
 * stack, roll, pad in every mode, flip, repeat), sort / argsort / topk
 * (cn_sort.c: rows of one block, and long rows in tiles and merge passes)
 * and max_pool2d's indices (cn_conv.c) against the CPU, byte for byte, in
 * every dtype; the gradients through them and through conv2d /
 * conv_transpose2d (a small CNN's kl_backward) against the CPU's; and the
 * coverage table: every op of the op table either has a CUDA path or is on
 * the known-missing list below, which may only shrink (it is empty now), and
 * the ops that refuse some dtype on CUDA (integer GEMMs) still do. The NVRTC compile of
 * the programs runs in the suite without the emulator. Runs on the emulated
 * device in CI (cuda_join_emu).
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"
#include "dispatch.h"

#include <math.h>
#include <string.h>

static const char *OP = "cuda_join_test";

/* want (CPU) and got (CUDA) hold the same bytes. */
static void same(kl_tensor *want, kl_tensor *got, const char *what) {
    if (!want) print_error("%s on the CPU: %s\n", what, kl_last_error());
    assert_non_null(want);
    if (!got) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    kl_tensor *w = kl_contiguous(want), *g = host(got);
    if (!same_bytes(w, g)) {
        char a[1024], b[1024];
        kl_format(w, a, sizeof a);
        kl_format(g, b, sizeof b);
        print_error("%s: CUDA differs from the CPU\ncpu  %s\ncuda %s\n", what, a, b);
        fail();
    }
}

static kl_tensor *dev(kl_tensor *t) {
    kl_tensor *d = kl_to_device(t, CUDA0);
    assert_non_null(d);
    return d;
}

/* Values of dtype dt with repeats (ties) and signs; 0/1 for bool. */
static kl_tensor *values(int ndim, const int64_t *shape, kl_dtype dt) {
    kl_tensor *x = kl_round(kl_mul_scalar(kl_randn(ndim, shape, KL_F64), 4));
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0);
    if (dt == KL_U8) x = kl_abs(x);
    return kl_to_dtype(x, dt);
}

/* cat, stack, roll, flip, repeat in every dtype, contiguous and transposed
 * inputs, mixed dtypes, legacy empties, 0-dim and empty tensors. */
static void join_flip_repeat_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(51);
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        kl_scope_begin();
        kl_tensor *a = values(KL_SHAPE(2, 3, 4), (kl_dtype)dt), *b = values(KL_SHAPE(2, 5, 4), (kl_dtype)dt);
        kl_tensor *c3 = values(KL_SHAPE(4, 3, 2), (kl_dtype)dt);
        kl_tensor *ga = dev(a), *gb = dev(b), *gc3 = dev(c3);
        same(kl_cat(2, (kl_tensor *[]){a, b}, 1), kl_cat(2, (kl_tensor *[]){ga, gb}, 1), "cat dim 1");
        same(kl_cat(3, (kl_tensor *[]){a, a, a}, 0), kl_cat(3, (kl_tensor *[]){ga, ga, ga}, 0), "cat dim 0");
        /* a transposed input ([2, 3, 4] from [4, 3, 2]) along the last dim */
        kl_tensor *t = kl_transpose(c3, 0, 2), *gt = kl_transpose(gc3, 0, 2);
        same(kl_cat(2, (kl_tensor *[]){a, t}, -1), kl_cat(2, (kl_tensor *[]){ga, gt}, -1), "cat of a view");
        kl_tensor *e = kl_zeros(KL_SHAPE(0), (kl_dtype)dt);
        same(kl_cat(3, (kl_tensor *[]){e, a, e}, 2), kl_cat(3, (kl_tensor *[]){dev(e), ga, dev(e)}, 2),
             "cat with legacy empties");
        same(kl_stack(2, (kl_tensor *[]){a, t}, 3), kl_stack(2, (kl_tensor *[]){ga, gt}, 3), "stack");
        same(kl_stack(2, (kl_tensor *[]){a, a}, 0), kl_stack(2, (kl_tensor *[]){ga, ga}, 0), "stack dim 0");
        same(kl_roll(a, 2, (int64_t[]){-1, 5}, (int64_t[]){1, 2}), kl_roll(ga, 2, (int64_t[]){-1, 5}, (int64_t[]){1, 2}),
             "roll");
        same(kl_roll(t, 1, (int64_t[]){3}, NULL), kl_roll(gt, 1, (int64_t[]){3}, NULL), "roll flattened");
        same(kl_flip(a, 2, (int64_t[]){0, 2}), kl_flip(ga, 2, (int64_t[]){0, 2}), "flip 0, 2");
        same(kl_flip(t, 1, (int64_t[]){-2}), kl_flip(gt, 1, (int64_t[]){-2}), "flip of a view");
        same(kl_flip(a, 0, NULL), kl_flip(ga, 0, NULL), "flip of no dim");
        same(kl_repeat(a, 3, (int64_t[]){2, 1, 3}), kl_repeat(ga, 3, (int64_t[]){2, 1, 3}), "repeat");
        same(kl_repeat(t, 4, (int64_t[]){2, 1, 1, 2}), kl_repeat(gt, 4, (int64_t[]){2, 1, 1, 2}), "repeat new dim");
        static const int64_t diags[] = {-1, 0, 2, -100, INT64_MAX};
        for (int k = 0; k < 5; k++) {
            same(kl_tril(a, diags[k]), kl_tril(ga, diags[k]), "tril");
            same(kl_triu(t, diags[k]), kl_triu(gt, diags[k]), "triu of a view");
        }
        /* scatter: duplicate indices, the last write wins as on the CPU */
        for (int dim = 0; dim < 3; dim++) {
            int64_t ish[3] = {2, 3, 4};
            ish[dim] = 5;
            kl_tensor *ix = kl_randint(0, kl_shape(a)[dim], 3, ish, KL_I64), *src = values(3, ish, (kl_dtype)dt);
            same(kl_scatter(a, dim, ix, src), kl_scatter(ga, dim, dev(ix), dev(src)), "scatter");
        }
        kl_scope_end();
    }
    /* mixed dtypes promote (the input cast on the device) */
    kl_tensor *i = kl_to_dtype(values(KL_SHAPE(3, 2), KL_F64), KL_I32), *f = values(KL_SHAPE(3, 1), KL_F16);
    same(kl_cat(2, (kl_tensor *[]){i, f}, 1), kl_cat(2, (kl_tensor *[]){dev(i), dev(f)}, 1), "cat int32 + f16");
    /* 0-dim and empty */
    kl_tensor *z = kl_scalar_tensor(2.5, KL_F32), *em = kl_zeros(KL_SHAPE(2, 0, 3), KL_F32);
    same(kl_flip(z, 0, NULL), kl_flip(dev(z), 0, NULL), "flip 0-dim");
    same(kl_repeat(z, 2, (int64_t[]){2, 3}), kl_repeat(dev(z), 2, (int64_t[]){2, 3}), "repeat 0-dim");
    same(kl_cat(2, (kl_tensor *[]){em, em}, 1), kl_cat(2, (kl_tensor *[]){dev(em), dev(em)}, 1), "cat empty");
    same(kl_flip(em, 1, (int64_t[]){1}), kl_flip(dev(em), 1, (int64_t[]){1}), "flip empty");
    /* shape errors come from the shared rule: the CPU's message */
    assert_null(kl_cat(2, (kl_tensor *[]){dev(kl_zeros(KL_SHAPE(2, 3), KL_F32)), dev(kl_zeros(KL_SHAPE(3, 3), KL_F32))}, 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "must match except in dim 1");
    assert_null(kl_cat(2, (kl_tensor *[]){dev(kl_zeros(KL_SHAPE(2), KL_F32)), kl_zeros(KL_SHAPE(2), KL_F32)}, 0));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "expected all tensors on one device");
}

/* pad: constant (growing, cropping, both), reflect, replicate, circular
 * (cropping too) over 1, 2 and 3 padded dims, every dtype. */
static void pad_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(52);
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        kl_scope_begin();
        const kl_dtype d = (kl_dtype)dt;
        kl_tensor *x = values(KL_SHAPE(2, 3, 4, 5), d), *gx = dev(x);
        kl_tensor *xt = kl_transpose(x, 2, 3), *gxt = kl_transpose(gx, 2, 3);
        const double v = d == KL_BOOL ? 1 : 3;
        same(kl_pad(x, 4, (int64_t[]){1, 2, 0, 3}, v), kl_pad(gx, 4, (int64_t[]){1, 2, 0, 3}, v), "pad constant");
        same(kl_pad(x, 6, (int64_t[]){-1, 2, 1, -2, 0, 1}, v), kl_pad(gx, 6, (int64_t[]){-1, 2, 1, -2, 0, 1}, v),
             "pad constant cropping");
        same(kl_pad(xt, 2, (int64_t[]){-2, -1}, v), kl_pad(gxt, 2, (int64_t[]){-2, -1}, v), "pad crop of a view");
        /* one padded dim: a batched 1-D [N, C, W] input (a transposed view too) */
        kl_tensor *x3 = kl_select(x, 0, 1), *gx3 = kl_select(gx, 0, 1);
        kl_tensor *x3t = kl_transpose(x3, 0, 1), *gx3t = kl_transpose(gx3, 0, 1);
        for (int m = KL_PAD_REFLECT; m <= KL_PAD_CIRCULAR; m++) {
            char what[64];
            snprintf(what, sizeof what, "pad mode %d", m);
            same(kl_pad_ex(x3, 2, (int64_t[]){3, 2}, (kl_pad_mode)m, 0),
                 kl_pad_ex(gx3, 2, (int64_t[]){3, 2}, (kl_pad_mode)m, 0), what);
            same(kl_pad_ex(x3t, 2, (int64_t[]){1, 2}, (kl_pad_mode)m, 0),
                 kl_pad_ex(gx3t, 2, (int64_t[]){1, 2}, (kl_pad_mode)m, 0), what);
            same(kl_pad_ex(xt, 4, (int64_t[]){1, 3, 2, 0}, (kl_pad_mode)m, 0),
                 kl_pad_ex(gxt, 4, (int64_t[]){1, 3, 2, 0}, (kl_pad_mode)m, 0), what);
            if (m != KL_PAD_CIRCULAR) /* 3 padded dims: reflect / replicate of a 4-D [C, D, H, W] */
                same(kl_pad_ex(x, 6, (int64_t[]){1, 1, 0, 2, 2, 1}, (kl_pad_mode)m, 0),
                     kl_pad_ex(gx, 6, (int64_t[]){1, 1, 0, 2, 2, 1}, (kl_pad_mode)m, 0), what);
        }
        same(kl_pad_ex(x, 4, (int64_t[]){-1, 2, 3, -1}, KL_PAD_CIRCULAR, 0),
             kl_pad_ex(gx, 4, (int64_t[]){-1, 2, 3, -1}, KL_PAD_CIRCULAR, 0), "pad circular cropping");
        kl_scope_end();
    }
    /* the fill value's bits: -0.0, a NaN, an f16 rounding */
    kl_tensor *x = values(KL_SHAPE(3, 4), KL_F32);
    same(kl_pad(x, 2, (int64_t[]){1, 1}, -0.0), kl_pad(dev(x), 2, (int64_t[]){1, 1}, -0.0), "pad -0");
    same(kl_pad(x, 2, (int64_t[]){1, 1}, NAN), kl_pad(dev(x), 2, (int64_t[]){1, 1}, NAN), "pad NaN");
    kl_tensor *h = kl_to_dtype(x, KL_BF16);
    same(kl_pad(h, 2, (int64_t[]){2, 0}, 0.1), kl_pad(dev(h), 2, (int64_t[]){2, 0}, 0.1), "pad bf16 0.1");
    /* errors from the shared rule */
    assert_null(kl_pad_ex(dev(x), 2, (int64_t[]){4, 0}, KL_PAD_REFLECT, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "must be below the size");
}

/* Rows with ties, NaNs, infinities, -0 and +0 in every dtype: sort
 * (ascending, descending, every dim, a transposed input), argsort, topk
 * (largest, smallest, k = 0, 1, n) byte for byte; 0-dim, empty, a row of
 * 4096 f64 elements (48 KiB of shared memory), one past it refused. */
static void sort_topk_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(53);
    static const double special[] = {NAN, 1, -0.0, 0.0, INFINITY, 1, -INFINITY, NAN, -2, 0.0};
    /* twice: rows sorted by one block each, then with tiles of 8 (cn_set_sort_tile), so rows of 10 and
     * 37 take the long-row path (tiles, then merge passes in global memory) */
    for (int pass = 0; pass < 2; pass++)
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        cn_set_sort_tile(pass ? 8 : CN_SORT_MAX_ROW);
        kl_scope_begin();
        const kl_dtype d = (kl_dtype)dt;
        kl_tensor *x = values(KL_SHAPE(3, 10, 37), d);
        if (ke_is_float(d)) { /* row 0 of dim 1 gets the specials */
            kl_tensor *sp = kl_to_dtype(kl_from_data(special, KL_SHAPE(10), KL_F64), d);
            kl_tensor *col = kl_select(kl_select(x, 0, 1), 1, 5);
            assert_non_null(kl_copy_inplace(col, sp));
        }
        kl_tensor *gx = dev(x), *xt = kl_transpose(x, 0, 2), *gxt = kl_transpose(gx, 0, 2);
        for (int dim = 0; dim < 3; dim++)
            for (int desc = 0; desc < 2; desc++) {
                kl_tensor *v[2], *ix[2];
                assert_int_equal(kl_sort(x, dim, desc, true, &v[0], &ix[0]), 0);
                int rc = kl_sort(gx, dim, desc, true, &v[1], &ix[1]);
                if (rc) print_error("sort on CUDA: %s\n", kl_last_error());
                assert_int_equal(rc, 0);
                same(v[0], v[1], "sort values");
                same(ix[0], ix[1], "sort indices");
                assert_int_equal(kl_sort(xt, dim, desc, false, &v[0], &ix[0]), 0);
                assert_int_equal(kl_sort(gxt, dim, desc, false, &v[1], &ix[1]), 0);
                same(v[0], v[1], "sort values of a view");
                same(ix[0], ix[1], "sort indices of a view");
            }
        same(kl_argsort(x, -1, true, true), kl_argsort(gx, -1, true, true), "argsort");
        static const int64_t ks[] = {0, 1, 5, 10};
        for (int k = 0; k < 4; k++)
            for (int largest = 0; largest < 2; largest++) {
                kl_tensor *v[2], *ix[2];
                assert_int_equal(kl_topk(x, ks[k], 1, largest, true, &v[0], &ix[0]), 0);
                assert_int_equal(kl_topk(gx, ks[k], 1, largest, k & 1, &v[1], &ix[1]), 0);
                same(v[0], v[1], "topk values");
                same(ix[0], ix[1], "topk indices");
            }
        kl_scope_end();
    }
    kl_tensor *v[2], *ix[2];
    /* the long-row path ran: a row of 37 with tiles of 8 is one tile launch and merges of runs of 8, 16
     * and 32 (the last writing the result) */
    int64_t n0[KU_N_COUNT], n1[KU_N_COUNT];
    kl_tensor *r37 = dev(values(KL_SHAPE(2, 37), KL_F32));
    ku_counts(n0);
    assert_int_equal(kl_sort(r37, 1, false, true, &v[1], &ix[1]), 0);
    ku_counts(n1);
    assert_int_equal(n1[KU_N_LAUNCH] - n0[KU_N_LAUNCH], 4);
    cn_set_sort_tile(CN_SORT_MAX_ROW);
    ku_counts(n0);
    assert_int_equal(kl_sort(r37, 1, false, true, &v[1], &ix[1]), 0);
    ku_counts(n1);
    assert_int_equal(n1[KU_N_LAUNCH] - n0[KU_N_LAUNCH], 1); /* one block per row */
    kl_tensor *z = kl_scalar_tensor(-1.5, KL_F32), *em = kl_zeros(KL_SHAPE(3, 0), KL_F32);
    assert_int_equal(kl_sort(z, 0, false, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_sort(dev(z), 0, false, true, &v[1], &ix[1]), 0);
    same(v[0], v[1], "sort 0-dim");
    same(ix[0], ix[1], "sort 0-dim indices");
    assert_int_equal(kl_sort(em, 1, false, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_sort(dev(em), 1, false, true, &v[1], &ix[1]), 0);
    same(v[0], v[1], "sort empty");
    /* the longest row a block sorts, with 8-byte keys: 48 KiB of shared memory */
    kl_tensor *lg = kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(1, CN_SORT_MAX_ROW), KL_F64), 50));
    assert_int_equal(kl_topk(lg, 7, 1, true, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_topk(dev(lg), 7, 1, true, true, &v[1], &ix[1]), 0);
    same(v[0], v[1], "topk of a 4096-element row");
    same(ix[0], ix[1], "topk indices of a 4096-element row");
    assert_int_equal(kl_sort(lg, 1, false, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_sort(dev(lg), 1, false, true, &v[1], &ix[1]), 0);
    same(ix[0], ix[1], "sort indices of a 4096-element row");
    /* longer rows: tiles of 4096 in shared memory, then merge passes (one past a tile: 2 tiles; 10000: 3
     * tiles, two passes), with ties, in f32 (4-byte keys) and f16 (kept as f32 keys); a strided dim */
    kl_tensor *l1 = kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(2, CN_SORT_MAX_ROW + 1), KL_F32), 50));
    for (int desc = 0; desc < 2; desc++) {
        assert_int_equal(kl_sort(l1, 1, desc, true, &v[0], &ix[0]), 0);
        assert_int_equal(kl_sort(dev(l1), 1, desc, true, &v[1], &ix[1]), 0);
        same(v[0], v[1], "sort values of 4097-element rows");
        same(ix[0], ix[1], "sort indices of 4097-element rows");
    }
    kl_tensor *l2 = kl_to_dtype(kl_round(kl_mul_scalar(kl_randn(KL_SHAPE(10000, 2), KL_F64), 300)), KL_F16);
    assert_int_equal(kl_sort(l2, 0, true, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_sort(dev(l2), 0, true, true, &v[1], &ix[1]), 0);
    same(v[0], v[1], "sort values of 10000-element columns");
    same(ix[0], ix[1], "sort indices of 10000-element columns");
    assert_int_equal(kl_topk(l2, 9, 0, false, true, &v[0], &ix[0]), 0);
    assert_int_equal(kl_topk(dev(l2), 9, 0, false, true, &v[1], &ix[1]), 0);
    same(v[0], v[1], "topk values of 10000-element columns");
    same(ix[0], ix[1], "topk indices of 10000-element columns");
}

/* max_pool2d's indices (every window rule: padding, dilation, ceil_mode,
 * ties, NaN, a window past the input) and the gradient of max_pool2d. */
static void max_pool_indices_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(54);
    static const kl_dtype dts[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    for (int i = 0; i < 4; i++) {
        kl_scope_begin();
        kl_tensor *x = values(KL_SHAPE(2, 3, 7, 6), dts[i]);
        assert_non_null(kl_copy_inplace(kl_select(kl_select(kl_select(x, 0, 1), 0, 2), 0, 3), kl_scalar_tensor(NAN, KL_F64)));
        kl_tensor *gx = dev(x);
        kl_pool2d_options o[3] = {kl_pool2d_options_default(2), kl_pool2d_options_default(3), kl_pool2d_options_default(2)};
        o[1].stride[0] = 2, o[1].stride[1] = 1, o[1].padding[0] = 1, o[1].padding[1] = 1, o[1].ceil_mode = true;
        o[2].dilation[0] = 2, o[2].dilation[1] = 3, o[2].padding[1] = 1, o[2].stride[1] = 2;
        for (int k = 0; k < 3; k++) {
            kl_tensor *w = values(4, kl_shape(kl_max_pool2d(x, &o[k])), KL_F64);
            kl_tensor *grads[2];
            for (int on = 0; on < 2; on++) {
                kl_tensor *p = kl_detach(on ? gx : x);
                assert_int_equal(kl_set_requires_grad(p, true), 0);
                kl_tensor *y = kl_max_pool2d(p, &o[k]);
                if (!y) print_error("max_pool2d on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
                assert_non_null(y);
                kl_tensor *l = kl_sum(kl_mul(kl_to_dtype(y, KL_F64), on ? dev(w) : w), 0, NULL, false);
                int rc = kl_backward(l, NULL, NULL);
                if (rc) print_error("max_pool2d backward on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
                assert_int_equal(rc, 0);
                grads[on] = kl_grad(p);
                assert_non_null(grads[on]);
            }
            same(grads[0], grads[1], "max_pool2d gradient");
        }
        kl_scope_end();
    }
}

static void close_to(kl_tensor *want, kl_tensor *got, double tol, const char *what) {
    if (!got) print_error("%s on CUDA: %s\n", what, kl_last_error());
    assert_non_null(got);
    assert_int_equal(kl_device_of(got).type, KL_CUDA);
    if (kl_allclose(host(got), want, tol, tol, true) != 1) {
        char a[1024], b[1024];
        kl_format(want, a, sizeof a);
        kl_format(host(got), b, sizeof b);
        print_error("%s: CUDA differs from the CPU\ncpu  %s\ncuda %s\n", what, a, b);
        fail();
    }
}

/* A small CNN trained one step's worth on CUDA — conv2d (padding, stride),
 * a reflect pad, max_pool2d, conv_transpose2d, flip, cat, topk of the
 * logits, linear, cross_entropy — gives the CPU's loss and gradients of
 * every parameter and of the input within 1e-4; then the pieces' own
 * derivatives on CUDA in f64: cat, pad (each mode), flip, sort, topk,
 * repeat, and cumsum / cumprod (whose derivatives need index_select, cat
 * and flip on CUDA), within 1e-12. */
static void cnn_backward_like_cpu(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(55);
    enum { NP = 6 };
    kl_tensor *x0 = kl_randn(KL_SHAPE(2, 3, 8, 8), KL_F32);
    kl_tensor *p0[NP] = {kl_mul_scalar(kl_randn(KL_SHAPE(4, 3, 3, 3), KL_F32), 0.3), kl_randn(KL_SHAPE(4), KL_F32),
                         kl_mul_scalar(kl_randn(KL_SHAPE(4, 2, 2, 2), KL_F32), 0.3), kl_randn(KL_SHAPE(2), KL_F32),
                         kl_mul_scalar(kl_randn(KL_SHAPE(5, 148), KL_F32), 0.1), kl_randn(KL_SHAPE(5), KL_F32)};
    kl_tensor *tgt = kl_from_data((int64_t[]){1, 4}, KL_SHAPE(2), KL_I64);
    kl_tensor *grads[2][NP + 1], *losses[2];
    for (int on = 0; on < 2; on++) {
        kl_device d = on ? CUDA0 : KL_DEVICE_CPU;
        kl_tensor *p[NP + 1];
        for (int i = 0; i <= NP; i++) {
            p[i] = kl_to_device(kl_clone(i < NP ? p0[i] : x0), d);
            assert_int_equal(kl_set_requires_grad(p[i], true), 0);
        }
        kl_conv2d_options co = kl_conv2d_options_default();
        co.padding[0] = co.padding[1] = 1;
        kl_tensor *h = kl_relu(kl_conv2d(kl_pad_ex(p[NP], 4, (int64_t[]){1, 0, 0, 1}, KL_PAD_REFLECT, 0), p[0], p[1], &co));
        kl_pool2d_options po = kl_pool2d_options_default(2);
        kl_tensor *m = kl_max_pool2d(h, &po);                                   /* [2, 4, 4, 4] */
        kl_conv_transpose2d_options to = kl_conv_transpose2d_options_default();
        to.stride[0] = to.stride[1] = 2;
        kl_tensor *u = kl_conv_transpose2d(m, p[2], p[3], &to);                /* [2, 2, 8, 8] */
        kl_tensor *f = kl_flatten(kl_cat(2, (kl_tensor *[]){kl_flatten(m, 1, -1), kl_flatten(kl_flip(u, 1, (int64_t[]){3}), 1, -1)}, 1), 1, -1);
        kl_tensor *f2 = kl_narrow(f, 1, 0, 148 - 8);
        kl_tensor *tv, *ti;
        assert_int_equal(kl_topk(f, 8, 1, true, true, &tv, &ti), 0);
        kl_tensor *logits = kl_linear(kl_cat(2, (kl_tensor *[]){f2, tv}, 1), p[4], p[5]);
        losses[on] = kl_cross_entropy(logits, kl_to_device(tgt, d), KL_REDUCE_MEAN, 0);
        if (!losses[on]) print_error("forward on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
        assert_non_null(losses[on]);
        int rc = kl_backward(losses[on], NULL, NULL);
        if (rc) print_error("backward on %s: %s\n", on ? "cuda" : "cpu", kl_last_error());
        assert_int_equal(rc, 0);
        for (int i = 0; i <= NP; i++) {
            grads[on][i] = kl_grad(p[i]);
            assert_non_null(grads[on][i]);
            assert_int_equal(kl_device_of(grads[on][i]).type, on ? KL_CUDA : KL_CPU);
        }
    }
    close_to(losses[0], losses[1], 1e-5, "the CNN's loss");
    for (int i = 0; i <= NP; i++) close_to(grads[0][i], grads[1][i], 1e-4, "a CNN gradient");

    /* each op's own derivative in f64 */
    kl_tensor *a = kl_randn(KL_SHAPE(2, 3, 4, 5), KL_F64), *b = kl_randn(KL_SHAPE(2, 3, 2, 5), KL_F64);
    for (int op = 0; op < 10; op++) {
        kl_tensor *g[2];
        for (int on = 0; on < 2; on++) {
            kl_tensor *pa = kl_detach(on ? dev(a) : a), *pb = kl_detach(on ? dev(b) : b), *y = NULL;
            kl_set_requires_grad(pa, true);
            kl_set_requires_grad(pb, true);
            kl_tensor *v, *ix;
            switch (op) {
            case 0: y = kl_cat(2, (kl_tensor *[]){pa, pb}, 2); break;
            case 1: y = kl_pad(pa, 4, (int64_t[]){1, -1, 2, 0}, 0.5); break;
            case 2: y = kl_pad_ex(pa, 4, (int64_t[]){2, 1, 1, 2}, KL_PAD_REFLECT, 0); break;
            case 3: y = kl_pad_ex(pa, 4, (int64_t[]){2, 1, 1, 2}, KL_PAD_REPLICATE, 0); break;
            case 4: y = kl_pad_ex(pa, 4, (int64_t[]){2, 1, 1, 2}, KL_PAD_CIRCULAR, 0); break;
            case 5: y = kl_flip(pa, 2, (int64_t[]){1, 3}); break;
            case 6: y = kl_sort(pa, 2, true, true, &v, &ix) ? NULL : kl_add(v, kl_topk(pa, 2, 3, false, true, &v, &ix) ? NULL : kl_sum(v, 1, (int64_t[]){3}, true)); break;
            case 7: y = kl_repeat(pa, 4, (int64_t[]){1, 2, 1, 3}); break;
            case 8: y = kl_cumsum(pa, 2); break; /* its derivative: a flip (index_select), cumsum, a flip */
            default: y = kl_cumprod(pa, 3); break;
            }
            if (!y) print_error("op %d on %s: %s\n", op, on ? "cuda" : "cpu", kl_last_error());
            assert_non_null(y);
            kl_tensor *w = kl_cos(kl_arange(0, (double)kl_numel(y), 1, KL_F64));
            w = kl_reshape(on ? dev(w) : w, kl_ndim(y), kl_shape(y));
            int rc = kl_backward(kl_sum(kl_mul(kl_mul(y, y), w), 0, NULL, false), NULL, NULL);
            if (rc) print_error("op %d backward on %s: %s\n", op, on ? "cuda" : "cpu", kl_last_error());
            assert_int_equal(rc, 0);
            g[on] = kl_grad(pa);
            assert_non_null(g[on]);
        }
        close_to(g[0], g[1], 1e-12, "an op's gradient");
    }
}

/* Ops still without a CUDA path: neither a CUDA kernel, nor a view, nor a
 * composite whose decomposition runs there. A fix removes the op here (the
 * test fails while a covered op is still listed); an op losing its CUDA
 * path fails the test. docs/GPU.md's coverage table is this list. */
static const char *const known_missing[] = {
    NULL, /* none left (multinomial and scatter_reduce have kernels since issue 13's gpuops13) */
};

/* Ops whose CUDA kernel refuses dtypes the CPU takes: each must still refuse
 * them (KL_ERR_DTYPE on CUDA where the CPU computes), so this list too can only
 * shrink. docs/GPU.md's exception table is this list. */
typedef struct dtype_gap {
    const char *op, *why;
} dtype_gap;
static const dtype_gap known_dtype_gaps[] = {
    {"matmul", "integer dtypes: cuBLAS has no integer GEMM"},
    {"mm", "integer dtypes: cuBLAS has no integer GEMM"},
    {"bmm", "integer dtypes: cuBLAS has no integer GEMM"},
    {"addmm", "integer dtypes: cuBLAS has no integer GEMM"},
    {"linear", "integer dtypes: cuBLAS has no integer GEMM"},
    {"conv2d", "integer dtypes: im2col + cuBLAS, which has no integer GEMM"},
};

/* op (a name of known_dtype_gaps) on small int32 tensors on device d */
static kl_tensor *int32_call(const char *op, kl_device d) {
    kl_tensor *a = kl_to_device(kl_ones(KL_SHAPE(2, 3), KL_I32), d), *b = kl_to_device(kl_ones(KL_SHAPE(3, 2), KL_I32), d);
    if (!strcmp(op, "matmul")) return kl_matmul(a, b);
    if (!strcmp(op, "mm")) return kl_mm(a, b);
    if (!strcmp(op, "bmm")) return kl_bmm(kl_unsqueeze(a, 0), kl_unsqueeze(b, 0));
    if (!strcmp(op, "addmm")) return kl_addmm(kl_to_device(kl_ones(KL_SHAPE(2, 2), KL_I32), d), a, b, 1, 1);
    if (!strcmp(op, "linear")) return kl_linear(a, kl_transpose(b, 0, 1), kl_to_device(kl_ones(KL_SHAPE(2), KL_I32), d));
    kl_conv2d_options o = kl_conv2d_options_default();
    return kl_conv2d(kl_to_device(kl_ones(KL_SHAPE(1, 1, 3, 3), KL_I32), d),
                     kl_to_device(kl_ones(KL_SHAPE(1, 1, 2, 2), KL_I32), d), NULL, &o);
}

static void coverage(void **s) {
    (void)s;
    NEED_CUDA();
    /* the first CUDA tensor joins the CUDA backend (kl_init registers its kernels) */
    kl_tensor *one = kl_to_device(kl_ones(KL_SHAPE(1), KL_F32), CUDA0);
    assert_non_null(one);
    const int nknown = (int)(sizeof known_missing / sizeof *known_missing);
    int bad = 0, nkernel = 0, nview = 0, ndecomp = 0, nmissing = 0;
    print_message("%-34s %s\n", "op", "CUDA path");
    for (int op = 0; op < KE_OP_COUNT; op++) {
        const ke_op_info *o = &ke_ops[op];
        const char *how;
        int missing = 0;
        if (ke_has_kernel(KE_KEY_CUDA, op)) how = "kernel", nkernel++;
        else if (o->kind == KE_KIND_VIEW) how = "view (no kernel)", nview++;
        else if (o->decomp) how = "decomposition", ndecomp++;
        else how = "MISSING", missing = 1, nmissing++;
        int listed = 0;
        for (int k = 0; k < nknown; k++)
            if (known_missing[k] && !strcmp(known_missing[k], o->name)) listed = 1;
        print_message("%-34s %s\n", o->name, how);
        if (missing && !listed) {
            print_error("%s has no CUDA path and is not on the known-missing list\n", o->name);
            bad = 1;
        }
        if (!missing && listed) {
            print_error("%s has a CUDA path now: take it off the known-missing list\n", o->name);
            bad = 1;
        }
    }
    print_message("%d ops: %d CUDA kernels, %d views, %d decompositions, %d missing\n", (int)KE_OP_COUNT, nkernel,
                  nview, ndecomp, nmissing);
    /* the dtype exceptions: ops of the table, with a CUDA path, still refusing int32 (the CPU computes it) */
    for (size_t k = 0; k < sizeof known_dtype_gaps / sizeof *known_dtype_gaps; k++) {
        const char *name = known_dtype_gaps[k].op;
        int found = 0;
        for (int op = 0; op < KE_OP_COUNT; op++)
            if (!strcmp(ke_ops[op].name, name)) found = 1, assert_true(ke_has_kernel(KE_KEY_CUDA, op));
        if (!found) print_error("%s is on the dtype exception list but not in the op table\n", name);
        assert_true(found);
        assert_non_null(int32_call(name, KL_DEVICE_CPU));
        if (int32_call(name, CUDA0)) {
            print_error("%s runs on int32 CUDA tensors now: take it off the dtype exception list\n", name);
            bad = 1;
        } else {
            KT_EXPECT_ERROR(KL_ERR_DTYPE, "cuBLAS has no");
            print_message("%-34s refuses integer dtypes on CUDA (%s)\n", name, known_dtype_gaps[k].why);
        }
    }
    assert_false(bad);
}

static void nvrtc_compiles(void **s) {
    (void)s;
    NEED_NVRTC_ONLY();
    int maxreg = 0;
    for (int es = 1; es <= 8; es *= 2) {
        char *src = cn_join_source(es);
        assert_non_null(src);
        int r = kt_nvrtc_compiles(OP, src, "remap");
        maxreg = r > maxreg ? r : maxreg;
        free(src);
    }
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        char *src = cn_sort_source((kl_dtype)dt);
        assert_non_null(src);
        int r = kt_nvrtc_compiles(OP, src, "sort");
        maxreg = r > maxreg ? r : maxreg;
        free(src);
    }
    print_message("largest register count: %d\n", maxreg);
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(coverage),
        KT_TEST(join_flip_repeat_like_cpu),
        KT_TEST(pad_like_cpu),
        KT_TEST(sort_topk_like_cpu),
        KT_TEST(max_pool_indices_like_cpu),
        KT_TEST(cnn_backward_like_cpu),
        KT_TEST(nvrtc_compiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
