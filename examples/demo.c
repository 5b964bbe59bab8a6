/*
 * demo.c — Kiln's eager mode in a page: create tensors, run ops through the
 * dispatcher, see an error message, and time a few ops. The README's first
 * command builds and runs this.
 */
#include <kiln.h>

#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    printf("Kiln %s, %d threads\n\n", kl_version(), kl_get_num_threads());
    kl_manual_seed(0);

    kl_scope_begin();
    kl_tensor *x = kl_reshape(kl_arange(0, 6, 1, KL_F32), KL_SHAPE(2, 3));
    kl_tensor *w = kl_randn(KL_SHAPE(3, 4), KL_F32);
    printf("x =\n");
    kl_print(x);
    printf("softmax(relu(x @ w), -1) =\n");
    kl_print(kl_softmax(kl_relu(kl_matmul(x, w)), -1));
    printf("sum(x * x, dim=1) =\n");
    kl_print(kl_sum(kl_mul(x, x), KL_DIMS(1), false));

    /* Errors: NULL plus a message naming the op, shapes, dtypes and devices. */
    kl_tensor *bad = kl_exp(kl_add(x, kl_ones(KL_SHAPE(4), KL_F32)));
    if (!bad) printf("\nan error, reported at the end of the chain:\n  %s\n\n", kl_last_error());
    kl_clear_error();
    kl_scope_end();

    /* Timing: dispatch overhead and a bandwidth-bound op. */
    kl_tensor *one = kl_retain(kl_ones(KL_SHAPE(1), KL_F32));
    int n = 200000;
    double t0 = now_s();
    for (int i = 0; i < n; i += 1000) {
        kl_scope_begin();
        for (int j = 0; j < 1000; j++) kl_add(one, one);
        kl_scope_end();
    }
    double per_op = (now_s() - t0) / n;
    printf("kl_add on 1-element tensors: %.0f ns per call\n", per_op * 1e9);

    int64_t N = 1 << 24;
    kl_tensor *a = kl_retain(kl_rand(KL_SHAPE(N), KL_F32)), *b = kl_retain(kl_rand(KL_SHAPE(N), KL_F32));
    double best = 1e9;
    for (int r = 0; r < 10; r++) {
        kl_scope_begin();
        double s = now_s();
        kl_add(a, b);
        double e = now_s() - s;
        if (e < best) best = e;
        kl_scope_end();
    }
    printf("kl_add on 2^24 f32 elements: %.2f ms (%.1f GB/s moved)\n", best * 1e3, 12.0 * (double)N / best / 1e9);
    kl_release(a);
    kl_release(b);
    kl_release(one);
    return kl_last_status() == KL_OK ? 0 : 1;
}
