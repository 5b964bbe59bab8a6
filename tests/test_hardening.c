/*
 * test_hardening.c — regression tests for issue 17's defects: each was found
 * by using the library as a careless or hostile user would (huge attribute
 * values, mismatched counts, threads, file system oddities), crashed, hung or
 * gave a wrong answer, and must now give a clean error or the right result.
 */
#include "harness.h"

#include <stdlib.h>

/* ---- 1: view rules' size arithmetic ----------------------------------------- */

static void huge_slice_step(void **s) {
    (void)s;
    kl_tensor *x = kl_arange(0, 6, 1, KL_F32);
    x = kl_view(x, 2, (int64_t[]){2, 3});
    /* step INT64_MAX over 2 rows takes row 0 only ((end-start+step-1)/step overflowed to -1) */
    kl_tensor *v = kl_slice(x, 0, 0, 2, INT64_MAX);
    kt_assert_shape(v, 2, (int64_t[]){1, 3});
    KT_VALUES(v, 0, 0, 1, 2);
    kl_tensor *c = kl_cat(2, (kl_tensor *[]){v, x}, 0);
    kt_assert_shape(c, 2, (int64_t[]){3, 3});
    KT_VALUES(c, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5);
    /* extremes of start/end and step on the other dim too */
    kt_assert_shape(kl_slice(x, 1, INT64_MIN, INT64_MAX, INT64_MAX), 2, (int64_t[]){2, 1});
    kt_assert_shape(kl_slice(x, 1, INT64_MAX, INT64_MIN, 1), 2, (int64_t[]){2, 0});
    kl_tensor *w = kl_slice(x, 1, 1, INT64_MAX, INT64_MAX - 1);
    kt_assert_shape(w, 2, (int64_t[]){2, 1});
    KT_VALUES(w, 0, 1, 4);
    /* v's stride (3 * INT64_MAX) overflowed, harmless for one row; an
     * expanded dim's stride 0 times any step is 0 */
    kl_tensor *e = kl_expand(kl_ones(KL_SHAPE(1, 3), KL_F32), 2, (int64_t[]){5, 3});
    kt_assert_shape(kl_slice(e, 0, 0, 5, INT64_MAX / 2), 2, (int64_t[]){1, 3});
    kt_assert_shape(kl_slice(e, 0, 0, 5, 2), 2, (int64_t[]){3, 3});
    KT_NO_ERROR();
}

static void as_strided_extreme_strides(void **s) {
    (void)s;
    kl_tensor *x = kl_zeros(KL_SHAPE(8), KL_F32);
    /* (shape-1)*stride overflows int64: the bounds check must not wrap around */
    assert_null(kl_as_strided(x, 1, (int64_t[]){3}, (int64_t[]){INT64_MAX}, 0));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 2, (int64_t[]){3, 3}, (int64_t[]){INT64_MAX / 2, INT64_MAX / 2}, 0));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 1, (int64_t[]){3}, (int64_t[]){INT64_MIN}, 7));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    assert_null(kl_as_strided(x, 1, (int64_t[]){2}, (int64_t[]){1}, INT64_MAX));
    assert_true(kl_last_status() == KL_ERR_INDEX || kl_last_status() == KL_ERR_OVERFLOW);
    kl_clear_error();
    kl_tensor *one = kl_as_strided(x, 1, (int64_t[]){1}, (int64_t[]){INT64_MAX}, 7);
    kt_assert_shape(one, 1, (int64_t[]){1});
    /* slicing past its only element: start * stride overflows, the result is empty */
    kt_assert_shape(kl_slice(one, 0, 1, 2, 1), 1, (int64_t[]){0});
    kt_assert_shape(kl_slice(one, 0, 0, 1, 3), 1, (int64_t[]){1});
    KT_NO_ERROR();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(huge_slice_step),
        KT_TEST(as_strided_extreme_strides),
    };
    int r = cmocka_run_group_tests_name("hardening", tests, NULL, NULL);
    kt_tmp_cleanup();
    return r;
}
