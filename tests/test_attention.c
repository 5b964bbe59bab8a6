/*
 * test_attention.c — causal attention's fused CPU op (causal_attention and
 * its backward, src/eager/attention.c), beyond the PyTorch fixtures of
 * scaled_dot_product_attention (test_fixtures.c: small causal cases, values
 * and torch's gradients, every float dtype) and the gradchecks (grad_nn.c):
 * values and gradients against the formula written out with kl_ ops in f64
 * for sizes past one query block (odd, 1, L < S, L > S, views), the same
 * bits at 1 and 2 threads, the op inside compiled graphs against eager, the
 * cases that keep the decomposition (broadcast batch dims, masks), and bad
 * input.
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The causal formula with kl_ ops (what PyTorch's math path does), no fused op. */
static kl_tensor *reference(kl_tensor *q, kl_tensor *k, kl_tensor *v, double scale) {
    int64_t L = kl_shape(q)[kl_ndim(q) - 2], S = kl_shape(k)[kl_ndim(k) - 2];
    kl_tensor *s = kl_mul_scalar(kl_matmul(q, kl_transpose(k, -2, -1)), scale);
    kl_tensor *keep = kl_ge(kl_unsqueeze(kl_arange(0, (double)L, 1, KL_I64), 1),
                            kl_unsqueeze(kl_arange(0, (double)S, 1, KL_I64), 0));
    kl_tensor *p = kl_softmax(kl_where(keep, s, kl_full(0, NULL, -INFINITY, kl_dtype_of(q))), -1);
    return kl_matmul(p, v);
}

/* y = attention(q, k, v) and the gradients of sum(y * w) with respect to q, k, v. */
static void run(kl_tensor *const *qkv, kl_tensor *w, double scale, int fused, kl_tensor **y, kl_tensor **g) {
    kl_tensor *l[3];
    for (int i = 0; i < 3; i++) {
        l[i] = kl_detach(qkv[i]);
        assert_int_equal(kl_set_requires_grad(l[i], true), 0);
    }
    *y = fused ? kl_scaled_dot_product_attention(l[0], l[1], l[2], NULL, true, scale) : reference(l[0], l[1], l[2], scale);
    assert_non_null(*y);
    kl_tensor *loss = kl_sum(kl_mul(*y, w), KL_ALL_DIMS, false);
    assert_int_equal(kl_autograd_grad(1, &loss, NULL, 3, l, g, NULL), 0);
}

/* shape of q as [batch..., L, E]; k [batch..., S, E]; v [batch..., S, Ev] */
typedef struct ca_case {
    int nb;
    int64_t b[2], L, S, E, Ev;
    int views; /* q, k, v as the [B, T, H, D] -> [B, H, T, D] views charlm makes */
} ca_case;

static kl_tensor *make(const ca_case *c, int64_t rows, int64_t cols, kl_dtype dt) {
    kl_dtype rd = dt == KL_F64 ? KL_F64 : KL_F32;
    if (c->views && c->nb == 2)
        return kl_to_dtype(kl_transpose(kl_randn(KL_SHAPE(c->b[0], rows, c->b[1], cols), rd), 1, 2), dt);
    int64_t shape[4];
    int n = 0;
    for (int i = 0; i < c->nb; i++) shape[n++] = c->b[i];
    shape[n++] = rows, shape[n++] = cols;
    return kl_to_dtype(kl_randn(n, shape, rd), dt);
}

static const ca_case cases[] = {
    {2, {2, 3}, 70, 70, 8, 8, 1},  /* past two blocks, not a multiple of 32 */
    {1, {3}, 1, 1, 4, 5, 0},       /* T = 1 */
    {0, {0}, 33, 50, 3, 2, 0},     /* L < S, no batch dims */
    {1, {2}, 64, 40, 5, 3, 0},     /* L > S: the last rows see every key */
    {2, {1, 2}, 128, 128, 16, 16, 1},
    {1, {2}, 200, 230, 40, 48, 0}, /* 32 x 200 x 48 block GEMMs: past KE_GEMM_SMALL, OpenBLAS's threads */
};

static void causal_matches_formula(void **s) {
    (void)s;
    kl_manual_seed(16);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const ca_case *c = &cases[i];
        for (int d = 0; d < 2; d++) {
            kl_dtype dt = d ? KL_F64 : KL_F32;
            kl_scope_begin();
            kl_tensor *qkv[3] = {make(c, c->L, c->E, dt), make(c, c->S, c->E, dt), make(c, c->S, c->Ev, dt)};
            kl_tensor *w = kl_to_dtype(kl_randn(kl_ndim(qkv[0]), kl_shape(kl_scaled_dot_product_attention(
                                                                   qkv[0], qkv[1], qkv[2], NULL, true, 0)),
                                                KL_F64),
                                       dt);
            kl_tensor *y, *g[3], *yr, *gr[3];
            run(qkv, w, 0.37, 1, &y, g);
            /* the reference in f64 */
            kl_tensor *q64[3] = {kl_to_dtype(qkv[0], KL_F64), kl_to_dtype(qkv[1], KL_F64), kl_to_dtype(qkv[2], KL_F64)};
            run(q64, kl_to_dtype(w, KL_F64), 0.37, 0, &yr, gr);
            double rt = d ? 1e-10 : 2e-5, at = d ? 1e-12 : 2e-5;
            assert_int_equal(kl_dtype_of(y), dt);
            assert_true(kl_allclose(kl_to_dtype(y, KL_F64), yr, rt, at, false));
            for (int j = 0; j < 3; j++) {
                assert_int_equal(kl_ndim(g[j]), kl_ndim(qkv[j]));
                assert_true(kl_allclose(kl_to_dtype(g[j], KL_F64), gr[j], rt, at, false));
            }
            kl_scope_end();
        }
    }
}

/* Half types compute in f32: the f16 result is the f32 one rounded. */
static void causal_half_types(void **s) {
    (void)s;
    kl_manual_seed(3);
    ca_case c = {1, {2}, 40, 40, 8, 8, 0};
    kl_dtype dts[2] = {KL_F16, KL_BF16};
    for (int d = 0; d < 2; d++) {
        kl_scope_begin();
        kl_tensor *qkv[3] = {make(&c, 40, 8, dts[d]), make(&c, 40, 8, dts[d]), make(&c, 40, 8, dts[d])};
        kl_tensor *y = kl_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], NULL, true, 0);
        assert_int_equal(kl_dtype_of(y), dts[d]);
        kl_tensor *r = reference(kl_to_dtype(qkv[0], KL_F32), kl_to_dtype(qkv[1], KL_F32), kl_to_dtype(qkv[2], KL_F32),
                                 1 / sqrt(8.0));
        assert_true(kl_allclose(kl_to_dtype(y, KL_F32), r, d ? 1e-2 : 2e-3, d ? 1e-2 : 2e-3, false));
        kl_scope_end();
    }
}

/* One task per (batch, head) matrix, each in a fixed order: the same bits at any thread count. */
static void causal_threads_bitwise(void **s) {
    (void)s;
    kl_manual_seed(5);
    ca_case c = {2, {3, 4}, 100, 100, 8, 8, 1};
    kl_tensor *qkv[3] = {make(&c, 100, 8, KL_F32), make(&c, 100, 8, KL_F32), make(&c, 100, 8, KL_F32)};
    kl_tensor *w = kl_randn(KL_SHAPE(3, 4, 100, 8), KL_F32);
    int threads = kl_get_num_threads();
    kl_tensor *y[2], *g[2][3];
    for (int t = 0; t < 2; t++) {
        kl_set_num_threads(t + 1);
        run(qkv, w, 0, 1, &y[t], g[t]);
    }
    kl_set_num_threads(threads);
    assert_memory_equal(kl_data_ptr(y[0]), kl_data_ptr(y[1]), sizeof(float) * 3 * 4 * 100 * 8);
    for (int j = 0; j < 3; j++)
        assert_memory_equal(kl_data_ptr(kl_contiguous(g[0][j])), kl_data_ptr(kl_contiguous(g[1][j])),
                            sizeof(float) * 3 * 4 * 100 * 8);
}

/* in: q, k, v, w; out: the loss's gradients of q, k and v[, the attention's output].
 * u non-NULL: q, k, v are [B, T, H, D], made head views inside (as charlm does). */
static int step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *l[3];
    for (int i = 0; i < 3; i++)
        if (!(l[i] = kl_detach(in[i])) || kl_set_requires_grad(l[i], true) < 0) return -1;
    kl_tensor *a[3] = {kl_tanh(l[0]), l[1], l[2]};
    for (int i = 0; i < 3 && u; i++) a[i] = kl_transpose(a[i], 1, 2); /* [B, T, H, D] -> heads */
    kl_tensor *y = kl_scaled_dot_product_attention(a[0], a[1], a[2], NULL, true, 0);
    kl_tensor *loss = kl_sum(kl_mul(y, in[3]), KL_ALL_DIMS, false);
    if (n_out > 3) out[3] = kl_detach(y);
    return kl_autograd_grad(1, &loss, NULL, 3, l, out, NULL);
}

static void graph_text(kl_fn *f, char *text, size_t cap) {
    int len = kl_fn_graph_text(f, text, cap);
    assert_true(len > 0 && (size_t)len < cap);
}

/* The compiled step holds the fused forward and backward nodes (kept whole on
 * the CPU) and gives eager's gradients: q, k, v contiguous, and as head views
 * of [B, T, H, D] tensors (seq_major: the output and gradients in that layout). */
static void causal_compiled_matches_eager(void **s) {
    (void)s;
    kl_manual_seed(9);
    for (int views = 0; views < 2; views++) {
        kl_scope_begin();
        kl_tensor *in[4];
        for (int i = 0; i < 3; i++)
            in[i] = views ? kl_randn(KL_SHAPE(2, 45, 2, 8), KL_F32) : kl_randn(KL_SHAPE(2, 2, 45, 8), KL_F32);
        in[3] = kl_randn(KL_SHAPE(2, 2, 45, 8), KL_F32);
        void *u = views ? in : NULL;
        kl_tensor *gc[4], *ge[4];
        kl_fn *f = kl_compile(step, u, NULL);
        assert_non_null(f);
        assert_int_equal(kl_fn_call(f, in, 4, gc, 4), 0);
        assert_int_equal(step(u, in, 4, ge, 4), 0);
        for (int j = 0; j < 4; j++) assert_true(kl_allclose(gc[j], ge[j], 1e-5, 1e-6, false));
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.eager_calls, 0);
        static char text[1 << 16];
        graph_text(f, text, sizeof text);
        assert_non_null(strstr(text, "causal_attention("));
        assert_non_null(strstr(text, "causal_attention_backward("));
        assert_int_equal(strstr(text, "seq_major=true") != NULL, views);
        kl_fn_release(f);
        kl_scope_end();
    }
}

/* Broadcast batch dims and masks keep the decomposition: same values, no fused node. */
static void causal_fallbacks(void **s) {
    (void)s;
    kl_manual_seed(11);
    kl_tensor *q = kl_randn(KL_SHAPE(2, 40, 4), KL_F64), *k = kl_randn(KL_SHAPE(1, 40, 4), KL_F64),
              *v = kl_randn(KL_SHAPE(40, 3), KL_F64);
    kl_tensor *y = kl_scaled_dot_product_attention(q, k, v, NULL, true, 0.5);
    assert_true(kl_allclose(y, reference(q, k, v, 0.5), 1e-12, 1e-12, false));
    kl_tensor *in[4] = {q, kl_expand(k, KL_SHAPE(2, 40, 4)), kl_expand(kl_unsqueeze(v, 0), KL_SHAPE(2, 40, 3)),
                        kl_randn(KL_SHAPE(2, 40, 3), KL_F64)};
    kl_tensor *g[3];
    /* expanded (stride-0) batch dims are equal batch dims: the fused op reads them in place */
    assert_int_equal(step(NULL, in, 4, g, 3), 0);
    kl_tensor *g2[3];
    kl_tensor *in2[4] = {q, kl_contiguous(in[1]), kl_contiguous(in[2]), in[3]};
    assert_int_equal(step(NULL, in2, 4, g2, 3), 0);
    for (int j = 0; j < 3; j++) assert_true(kl_allclose(g[j], g2[j], 1e-12, 1e-12, false));
    /* causal and a mask together are refused, as before */
    kl_tensor *m = kl_ones(KL_SHAPE(40, 40), KL_BOOL);
    assert_null(kl_scaled_dot_product_attention(q, q, q, m, true, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "either an explicit mask or causal = true");
}

/* The internal ops by name: their shape and dtype rules, and no keys at all. */
static void causal_op_errors(void **s) {
    (void)s;
    kl_tensor *q = kl_zeros(KL_SHAPE(2, 3, 4), KL_F32), *k = kl_zeros(KL_SHAPE(2, 5, 4), KL_F32),
              *v = kl_zeros(KL_SHAPE(2, 5, 6), KL_F32), *out[3];
    kl_tensor *bad[3] = {q, kl_zeros(KL_SHAPE(2, 5, 3), KL_F32), v};
    assert_int_equal(kl_op_call("causal_attention", bad, 3, "scale=0.5", out, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_causal_attention: q [2,3,4] float32 cpu, k [2,5,3] float32 cpu and v [2,5,6] float32 cpu do not fit");
    kl_tensor *ints[3] = {kl_zeros(KL_SHAPE(2, 3, 4), KL_I32), k, v};
    assert_int_equal(kl_op_call("causal_attention", ints, 3, "scale=0.5", out, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_causal_attention: q, k and v must share one floating dtype");
    kl_tensor *bb[3] = {q, kl_zeros(KL_SHAPE(1, 5, 4), KL_F32), kl_zeros(KL_SHAPE(1, 5, 6), KL_F32)};
    assert_int_equal(kl_op_call("causal_attention", bb, 3, "scale=0.5", out, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_causal_attention: q [2,3,4] float32 cpu, k [1,5,4] float32 cpu");
    /* seq_major needs [..., L, H, E]: a 2-D q has no head dim */
    kl_tensor *flat[3] = {kl_zeros(KL_SHAPE(3, 4), KL_F32), kl_zeros(KL_SHAPE(5, 4), KL_F32),
                          kl_zeros(KL_SHAPE(5, 6), KL_F32)};
    assert_int_equal(kl_op_call("causal_attention", flat, 3, "scale=0.5, seq_major=true", out, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "do not fit [..., L, H, E], [..., S, H, E], [..., S, H, Ev] (seq_major)");
    kl_tensor *gin[4] = {kl_zeros(KL_SHAPE(2, 3, 5), KL_F32), q, k, v};
    assert_int_equal(
        kl_op_call("causal_attention_backward", gin, 4, "scale=0.5", out, 3), -1);
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_causal_attention_backward: gradient [2,3,5] float32 cpu does not match");
    /* S = 0: an empty softmax times an empty v, every output 0 (dk, dv empty) */
    kl_tensor *none[3] = {q, kl_zeros(KL_SHAPE(2, 0, 4), KL_F32), kl_zeros(KL_SHAPE(2, 0, 6), KL_F32)};
    assert_int_equal(kl_op_call("causal_attention", none, 3, "scale=0.5", out, 1), 0);
    assert_true(kl_equal(out[0], kl_zeros(KL_SHAPE(2, 3, 6), KL_F32)));
    /* L = 0: no query sees a key, so dk and dv are 0 */
    kl_tensor *gq[4] = {kl_zeros(KL_SHAPE(2, 0, 6), KL_F32), kl_zeros(KL_SHAPE(2, 0, 4), KL_F32),
                        kl_ones(KL_SHAPE(2, 5, 4), KL_F32), kl_ones(KL_SHAPE(2, 5, 6), KL_F32)};
    assert_int_equal(kl_op_call("causal_attention_backward", gq, 4, "scale=0.5", out, 3), 0);
    assert_true(kl_equal(out[1], kl_zeros(KL_SHAPE(2, 5, 4), KL_F32)));
    assert_true(kl_equal(out[2], kl_zeros(KL_SHAPE(2, 5, 6), KL_F32)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(causal_matches_formula), KT_TEST(causal_half_types),         KT_TEST(causal_threads_bitwise),
        KT_TEST(causal_compiled_matches_eager), KT_TEST(causal_fallbacks), KT_TEST(causal_op_errors),
    };
    return cmocka_run_group_tests_name("attention", tests, NULL, NULL);
}
