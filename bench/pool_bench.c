/*
 * pool_bench.c — max_pool2d (kernel 2, stride 2) forward and backward at the
 * fashion CNN's two pools, [128,32,26,26] and [128,64,11,11] f32, on 1
 * thread: median and min ms per call over REPS calls (bench/RESULTS.md,
 * "cnn16d"). The backward is max_pool2d_backward alone, reached through
 * kl_autograd_grad of the pooled output. Build it at two commits and run
 * the two binaries alternately: a ratio in one run is what means anything
 * on a shared machine.
 *
 *   build/bench/pool_bench [REPS]      (default 40)
 */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 40;
    if (reps < 1 || reps > 1000) reps = 40;
    kl_set_num_threads(1);
    static const int64_t shapes[2][4] = {{128, 32, 26, 26}, {128, 64, 11, 11}};
    double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
    if (!tf || !tb) return 1;
    for (int s = 0; s < 2; s++) {
        kl_scope_begin();
        kl_tensor *x = kl_randn(4, shapes[s], KL_F32);
        if (!x || kl_set_requires_grad(x, true) < 0) return 1;
        kl_pool2d_options o = kl_pool2d_options_default(2);
        for (int r = 0; r < reps; r++) {
            kl_scope_begin();
            double t0 = now_ms();
            kl_tensor *y = kl_max_pool2d(x, &o);
            double t1 = now_ms();
            kl_tensor *g = kl_ones_like(y), *gx;
            double t2 = now_ms();
            if (kl_autograd_grad(1, &y, &g, 1, &x, &gx, NULL) < 0) {
                fprintf(stderr, "pool_bench: %s\n", kl_last_error());
                return 1;
            }
            double t3 = now_ms();
            tf[r] = t1 - t0, tb[r] = t3 - t2;
            kl_scope_end();
        }
        qsort(tf, (size_t)reps, sizeof(double), cmp), qsort(tb, (size_t)reps, sizeof(double), cmp);
        printf("max_pool2d [%lld,%lld,%lld,%lld] f32, 1 thread: forward median %.3f ms (min %.3f), "
               "backward median %.3f ms (min %.3f)\n",
               (long long)shapes[s][0], (long long)shapes[s][1], (long long)shapes[s][2], (long long)shapes[s][3],
               tf[reps / 2], tf[0], tb[reps / 2], tb[0]);
        kl_scope_end();
    }
    free(tf), free(tb);
    return 0;
}
