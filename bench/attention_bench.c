/*
 * attention_bench.c — one layer of examples/charlm's causal attention, eager
 * forward and backward, timed two ways in one process: causal = true (the
 * fused causal_attention op and its backward on the CPU) and an explicit
 * [T, T] bool mask (sdpa's decomposition: full q k^T, where, softmax, @ v,
 * and their backward formulas), on q, k, v laid out as charlm makes them
 * ([B, T, H, D] views as [B, H, T, D]). Alternates the two per repetition
 * and prints each one's median.
 *
 *   build/bench/attention_bench [--batch 32] [--heads 4] [--context 128] [--head-dim 32]
 *                               [--threads 1] [--reps 20]
 */
#include "bench_util.h"
#include "kiln.h"

#include <stdio.h>
#include <string.h>

/* forward, then the gradients of sum(y * w) for q, k and v */
static double run(kl_tensor *const *qkv, kl_tensor *w, kl_tensor *mask) {
    kl_scope_begin();
    kl_tensor *l[3], *g[3];
    for (int i = 0; i < 3; i++) {
        l[i] = kl_detach(qkv[i]);
        kl_set_requires_grad(l[i], true);
    }
    double t0 = kb_now_s();
    kl_tensor *y = kl_scaled_dot_product_attention(l[0], l[1], l[2], mask, !mask, 0);
    kl_tensor *loss = kl_sum(kl_mul(y, w), KL_ALL_DIMS, false);
    int rc = kl_autograd_grad(1, &loss, NULL, 3, l, g, NULL);
    double t = kb_now_s() - t0;
    kl_scope_end();
    if (rc) {
        fprintf(stderr, "attention_bench: %s\n", kl_last_error());
        exit(1);
    }
    return t;
}

int main(int argc, char **argv) {
    int64_t B = 32, H = 4, T = 128, D = 32;
    int threads = 1, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--batch")) B = v;
        else if (!strcmp(argv[i], "--heads")) H = v;
        else if (!strcmp(argv[i], "--context")) T = v;
        else if (!strcmp(argv[i], "--head-dim")) D = v;
        else if (!strcmp(argv[i], "--threads")) threads = (int)v;
        else if (!strcmp(argv[i], "--reps")) reps = (int)v;
        else {
            fprintf(stderr, "attention_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    kl_set_num_threads(threads);
    kl_manual_seed(1);
    kl_tensor *qkv[3];
    for (int i = 0; i < 3; i++) qkv[i] = kl_transpose(kl_randn(KL_SHAPE(B, T, H, D), KL_F32), 1, 2);
    kl_tensor *w = kl_randn(KL_SHAPE(B, H, T, D), KL_F32);
    kl_tensor *mask = kl_ge(kl_unsqueeze(kl_arange(0, (double)T, 1, KL_I64), 1),
                            kl_unsqueeze(kl_arange(0, (double)T, 1, KL_I64), 0));
    double *tf = malloc(sizeof(double) * (size_t)reps), *tm = malloc(sizeof(double) * (size_t)reps);
    run(qkv, w, NULL), run(qkv, w, mask); /* warm-up */
    for (int r = 0; r < reps; r++) tf[r] = run(qkv, w, NULL), tm[r] = run(qkv, w, mask);
    kb_stats f = kb_summarize(tf, reps), m = kb_summarize(tm, reps);
    printf("attention_bench: B %lld, H %lld, T %lld, D %lld, %d threads, %d reps (forward + backward, eager)\n",
           (long long)B, (long long)H, (long long)T, (long long)D, threads, reps);
    printf("causal (fused causal_attention)  median %8.3f ms (q1 %.3f, q3 %.3f)\n", 1e3 * f.median, 1e3 * f.q1, 1e3 * f.q3);
    printf("mask (sdpa decomposition)        median %8.3f ms (q1 %.3f, q3 %.3f)\n", 1e3 * m.median, 1e3 * m.q1, 1e3 * m.q3);
    printf("mask / causal                    %.2fx\n", m.median / f.median);
    free(tf), free(tm);
    return 0;
}
