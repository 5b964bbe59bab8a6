/*
 * train_bench.c — eager training step time of the digits MLP (the
 * digits_step workload of shared/WORKLOADS.md): 64 -> 256 -> 256 -> 10,
 * GELU, mean cross-entropy, backward, AdamW (lr 1e-3, wd 1e-2), on random
 * inputs of the digits' shape. bench/torch_train.py is the same step in
 * PyTorch with the same output format; bench/run_train_bench.sh runs both
 * side by side. Method: warm-up, then at least 10 steps and 0.5 s, median and
 * interquartile range of one step (zero_grad + forward + backward + step).
 *
 *   build/bench/train_bench [threads] [batch ...]     (default: 1; 64 256)
 */
#include <kiln.h>

#include "bench_util.h"
#include <kiln/nn.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>


typedef struct model {
    kl_tensor *w[3], *b[3];
    kl_optim *opt;
    kl_tensor *x, *y;
} model;

/* One training step; its temporaries and graph die with the scope. */
static int step(const model *m) {
    kl_scope_begin();
    kl_tensor *h = m->x;
    for (int l = 0; l < 2; l++) h = kl_gelu(kl_linear(h, m->w[l], m->b[l]));
    kl_tensor *loss = kl_cross_entropy(kl_linear(h, m->w[2], m->b[2]), m->y, KL_REDUCE_MEAN, 0);
    int rc = loss && kl_optim_zero_grad(m->opt) == 0 && kl_backward(loss, NULL, NULL) == 0 &&
                     kl_optim_step(m->opt) == 0
                 ? 0
                 : -1;
    kl_scope_end();
    return rc;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    kl_set_num_threads(threads);
    printf("train_bench: %d threads, Kiln %s\n", kl_get_num_threads(), kl_version());
    static const int64_t sizes[4] = {64, 256, 256, 10};
    static const char *names[3] = {"fc1", "fc2", "fc3"};
    int nb = argc > 2 ? argc - 2 : 2;
    for (int bi = 0; bi < nb; bi++) {
        int64_t batch = argc > 2 ? atoll(argv[bi + 2]) : (bi ? 256 : 64);
        kl_manual_seed(0);
        kl_scope_begin();
        model m = {0};
        kl_params *p = kl_params_new();
        for (int l = 0; l < 3; l++)
            kl_params_add_linear(p, names[l], sizes[l], sizes[l + 1], true, &m.w[l], &m.b[l]);
        kl_adam_options o = kl_adamw_options_default();
        o.lr = 1e-3;
        o.weight_decay = 1e-2;
        m.opt = kl_optim_adamw(p, &o);
        m.x = kl_randn(KL_SHAPE(batch, 64), KL_F32);
        m.y = kl_randint(0, 10, KL_SHAPE(batch), KL_I64);
        enum { MAXR = 100000 };
        static double t[MAXR];
        int n = 0, rc = m.opt && m.x && m.y ? 0 : -1;
        for (int w = 0; w < 3 && rc == 0; w++) rc = step(&m);
        double start = kb_now_s();
        while (rc == 0 && n < MAXR && (n < 10 || kb_now_s() - start < 0.5)) {
            double s = kb_now_s();
            rc = step(&m);
            t[n++] = kb_now_s() - s;
        }
        kl_optim_free(m.opt);
        kl_params_free(p);
        kl_scope_end();
        if (rc) {
            fprintf(stderr, "train_bench: %s\n", kl_last_error());
            return 1;
        }
        kb_stats st = kb_summarize(t, n);
        printf("digits_step batch %4lld  %8.3f ms  [%8.3f, %8.3f]\n", (long long)batch, st.median * 1e3,
               st.q1 * 1e3, st.q3 * 1e3);
    }
    return 0;
}
