/*
 * grad_harness.h — helpers for the gradcheck suites (test_grad): f64 inputs
 * that require grad in several layouts, and one-line gradcheck assertions.
 *
 * Every family file (grad_ew.c, grad_shape.c, grad_nn.c) defines
 *     const struct CMUnitTest kt_grad_<family>_tests[];
 *     const size_t kt_grad_<family>_count;
 * and grad_main.c runs them all, then checks that every differentiable op of
 * the table had its derivative exercised by a gradcheck.
 */
#ifndef KT_GRAD_HARNESS_H
#define KT_GRAD_HARNESS_H

#include "harness.h"

/* Layouts a gradcheck input can take. */
enum kt_layout {
    KT_CONTIG,      /* contiguous */
    KT_TRANSPOSED,  /* the last two dims stored swapped (non-contiguous) */
    KT_STRIDED      /* every other element of a twice-as-long last dim */
};

/* A leaf f64 tensor of shape (ndim, shape) in the given layout with values
 * uniform in [lo, hi), requiring grad. Scope-owned. Seeded by the caller. */
static inline kl_tensor *kt_input(int ndim, const int64_t *shape, enum kt_layout layout, double lo, double hi) {
    int64_t s[KL_MAX_DIMS] = {0}; /* zeroed: GCC cannot see ndim <= KL_MAX_DIMS */
    for (int d = 0; d < ndim; d++) s[d] = shape[d];
    kl_tensor *t = NULL;
    if (layout == KT_TRANSPOSED && ndim >= 2) {
        s[ndim - 1] = shape[ndim - 2];
        s[ndim - 2] = shape[ndim - 1];
        t = kl_transpose(kl_rand(ndim, s, KL_F64), ndim - 2, ndim - 1);
    } else if (layout == KT_STRIDED && ndim >= 1) {
        s[ndim - 1] = 2 * shape[ndim - 1];
        t = kl_slice(kl_rand(ndim, s, KL_F64), ndim - 1, 0, INT64_MAX, 2);
    } else {
        t = kl_rand(ndim, s, KL_F64);
    }
    /* Scale in place through a detached alias: t is a leaf (no history). */
    kl_tensor *r = kl_detach(t);
    kl_mul_scalar_inplace(r, hi - lo);
    kl_add_scalar_inplace(r, lo);
    kl_set_requires_grad(r, true);
    assert_non_null(r);
    return r;
}

/* Asserts kl_gradcheck passes (and kl_gradgradcheck too if second). */
static inline void kt_gradcheck_(kl_grad_fn fn, void *user, int n, kl_tensor *const *in, int second,
                                 const char *what, const char *file, int line) {
    kl_gradcheck_options o = kl_gradcheck_options_default();
    int r = kl_gradcheck(fn, user, n, in, &o);
    if (r != 1) {
        print_error("%s:%d: gradcheck of %s failed: %s\n", file, line, what, kl_last_error());
        fail();
    }
    if (second) {
        r = kl_gradgradcheck(fn, user, n, in, &o);
        if (r != 1) {
            print_error("%s:%d: gradgradcheck of %s failed: %s\n", file, line, what, kl_last_error());
            fail();
        }
    }
}
#define KT_GRADCHECK(fn, user, n, in) kt_gradcheck_((fn), (user), (n), (in), 0, #fn, __FILE__, __LINE__)
#define KT_GRADGRADCHECK(fn, user, n, in) kt_gradcheck_((fn), (user), (n), (in), 1, #fn, __FILE__, __LINE__)

#endif /* KT_GRAD_HARNESS_H */
