/*
 * charlm_gemm_bench.c — the GEMM floor of examples/charlm's compiled training
 * step (issue 16, bench/RESULTS.md "The charlm step's GEMM floor"): every
 * matrix product one step runs, with its shape, operand layouts and batch
 * count, timed alone through kl_matmul (the dispatcher, linalg.c's batched
 * executor and OpenBLAS: the path the eager and the compiled step take),
 * summed over the step; next to the single-sgemm rate of one large square
 * product, which is what the library reaches when nothing else limits it.
 *
 *   build/bench/charlm_gemm_bench [--batch 32] [--threads 1] [--reps 20]
 *        [--layers 4] [--heads 4] [--embed 128] [--context 128] [--vocab 114]
 *        [--peak 1024] [--count] [--list all|step|attn|blocks64|blocks32]
 *
 * The list is the step's as the profiler counts it (99 `matmul`/`mm` calls
 * at 4 layers: per layer 8 forward and 16 backward, the head's 1 + 2); the
 * attention products are batched over [B, H] with q, k and v as the
 * [B, T, H, D] -> [B, H, T, D] views the model makes. Two more tables:
 *  - the attention products issued as one sgemm per (b, h) straight to
 *    OpenBLAS, and as one sgemm with the same flops and the same inner
 *    dimension (the batch stacked into rows): what the per-call overhead of
 *    128 small calls costs against one large one;
 *  - causal attention split into query blocks of 32 and 64 rows, each block
 *    against its key prefix only (issue 16, "Causal attention skipping its
 *    masked half"): the same six products per layer at the smaller shapes.
 * --count runs each product as many times as one step does, untimed, for callgrind
 * (`valgrind --tool=callgrind --toggle-collect=kb_run_once ... --count --list
 * step`: instructions of the listed products alone); --list picks one table
 * (attn: the step's six attention products alone).
 * Timings on a loaded machine are ratios within one run at best.
 */
#include "kiln.h"

#include "bench_util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How an operand reaches the product. */
enum kb_layout {
    KB_ROWS,     /* contiguous [M, K] (or [B, H, M, K]) */
    KB_T,        /* the transpose of a contiguous matrix (a column-major view) */
    KB_HEADS,    /* [B, H, rows, D] view of a [B, rows, H, D] tensor (q, k, v, their gradients) */
    KB_HEADS_T,  /* the transpose of a KB_HEADS view ([B, H, D, rows]) */
};

typedef struct kb_gemm {
    const char *what;
    int64_t M, N, K, batch;  /* batch: B*H for the attention products, else 1 */
    int la, lb;              /* enum kb_layout of a [M, K] and b [K, N] */
    int per_step;            /* calls per step */
    kl_tensor *a, *b;
    double ms;               /* median time of one call */
} kb_gemm;

typedef struct kb_cfg {
    int64_t batch, layers, heads, embed, context, vocab;
} kb_cfg;

static kl_tensor *rand_mat(int64_t r, int64_t c) { return kl_randn(KL_SHAPE(r, c), KL_F32); }

/* An operand [rows, cols] of the layout asked, batched over [B, H] for the heads. */
static kl_tensor *operand(const kb_cfg *c, int layout, int64_t rows, int64_t cols, int64_t batch) {
    int64_t B = c->batch, H = c->heads;
    switch (layout) {
    case KB_ROWS:
        return batch > 1 ? kl_randn(KL_SHAPE(B, H, rows, cols), KL_F32) : rand_mat(rows, cols);
    case KB_T:
        return batch > 1 ? kl_transpose(kl_randn(KL_SHAPE(B, H, cols, rows), KL_F32), -2, -1)
                         : kl_t(rand_mat(cols, rows));
    case KB_HEADS: /* rows is T, cols is D */
        return kl_transpose(kl_randn(KL_SHAPE(B, rows, H, cols), KL_F32), 1, 2);
    default: /* KB_HEADS_T: rows is D, cols is T */
        return kl_transpose(kl_transpose(kl_randn(KL_SHAPE(B, cols, H, rows), KL_F32), 1, 2), -2, -1);
    }
}

static int add(kb_gemm *g, int n, const char *what, int64_t M, int64_t N, int64_t K, int64_t batch, int la, int lb,
               int per_step) {
    g[n] = (kb_gemm){what, M, N, K, batch, la, lb, per_step, NULL, NULL, 0};
    return n + 1;
}

/* The step's products (the model in examples/charlm/charlm_model.c and the
 * matmul backward of src/autograd: a column-major operand gets its gradient
 * in its own layout, so dW is dY^T @ X and dK is dS^T @ Q). */
static int step_list(const kb_cfg *c, kb_gemm *g) {
    int64_t BT = c->batch * c->context, C = c->embed, T = c->context, D = c->embed / c->heads;
    int64_t BH = c->batch * c->heads, L = c->layers;
    int n = 0;
    n = add(g, n, "qkv forward x W^T (3 per layer)", BT, C, C, 1, KB_ROWS, KB_T, (int)(3 * L));
    n = add(g, n, "attn q k^T", T, T, D, BH, KB_HEADS, KB_HEADS_T, (int)L);
    n = add(g, n, "attn P v", T, D, T, BH, KB_ROWS, KB_HEADS, (int)L);
    n = add(g, n, "attn proj forward", BT, C, C, 1, KB_ROWS, KB_T, (int)L);
    n = add(g, n, "mlp fc forward", BT, 4 * C, C, 1, KB_ROWS, KB_T, (int)L);
    n = add(g, n, "mlp proj forward", BT, C, 4 * C, 1, KB_ROWS, KB_T, (int)L);
    n = add(g, n, "head forward", BT, c->vocab, C, 1, KB_ROWS, KB_T, 1);
    n = add(g, n, "head dX = dY W", BT, C, c->vocab, 1, KB_ROWS, KB_ROWS, 1);
    n = add(g, n, "head dW = dY^T X", c->vocab, C, BT, 1, KB_T, KB_ROWS, 1);
    n = add(g, n, "mlp proj dX", BT, 4 * C, C, 1, KB_ROWS, KB_ROWS, (int)L);
    n = add(g, n, "mlp proj dW", C, 4 * C, BT, 1, KB_T, KB_ROWS, (int)L);
    n = add(g, n, "mlp fc dX", BT, C, 4 * C, 1, KB_ROWS, KB_ROWS, (int)L);
    n = add(g, n, "mlp fc dW", 4 * C, C, BT, 1, KB_T, KB_ROWS, (int)L);
    n = add(g, n, "attn proj dX", BT, C, C, 1, KB_ROWS, KB_ROWS, (int)L);
    n = add(g, n, "attn proj dW", C, C, BT, 1, KB_T, KB_ROWS, (int)L);
    n = add(g, n, "attn dP = dY v^T", T, T, D, BH, KB_HEADS, KB_HEADS_T, (int)L);
    n = add(g, n, "attn dv = P^T dY", T, D, T, BH, KB_T, KB_HEADS, (int)L);
    n = add(g, n, "attn dq = dS k", T, D, T, BH, KB_ROWS, KB_HEADS, (int)L);
    n = add(g, n, "attn dk = dS^T q", T, D, T, BH, KB_T, KB_HEADS, (int)L);
    n = add(g, n, "qkv dX (3 per layer)", BT, C, C, 1, KB_ROWS, KB_ROWS, (int)(3 * L));
    n = add(g, n, "qkv dW (3 per layer)", C, C, BT, 1, KB_T, KB_ROWS, (int)(3 * L));
    return n;
}

/* The six attention products of one layer with the queries split into
 * blocks of `blk` rows, block i against keys [0, end of block i). */
static int causal_list(const kb_cfg *c, int64_t blk, kb_gemm *g) {
    int64_t T = c->context, D = c->embed / c->heads, BH = c->batch * c->heads;
    int n = 0;
    for (int64_t r0 = 0; r0 < T; r0 += blk) {
        int64_t m = T - r0 < blk ? T - r0 : blk, S = r0 + m;
        n = add(g, n, "q_i k^T", m, S, D, BH, KB_HEADS, KB_HEADS_T, (int)c->layers);
        n = add(g, n, "P_i v", m, D, S, BH, KB_ROWS, KB_HEADS, (int)c->layers);
        n = add(g, n, "dP_i = dY_i v^T", m, S, D, BH, KB_HEADS, KB_HEADS_T, (int)c->layers);
        n = add(g, n, "dv += P_i^T dY_i", S, D, m, BH, KB_T, KB_HEADS, (int)c->layers);
        n = add(g, n, "dq_i = dS_i k", m, D, S, BH, KB_ROWS, KB_HEADS, (int)c->layers);
        n = add(g, n, "dk += dS_i^T q_i", S, D, m, BH, KB_T, KB_HEADS, (int)c->layers);
    }
    return n;
}

static double flops(const kb_gemm *g) { return 2.0 * (double)g->M * (double)g->N * (double)g->K * (double)g->batch; }

static int make(const kb_cfg *c, kb_gemm *g) {
    /* the heads' layouts are [B, H, T, D] views; M/N/K say which of T and D each side is */
    g->a = operand(c, g->la, g->M, g->K, g->batch);
    g->b = operand(c, g->lb, g->K, g->N, g->batch);
    if (!g->a || !g->b) return -1;
    g->a = kl_retain(g->a), g->b = kl_retain(g->b);
    return 0;
}

__attribute__((noinline)) int kb_run_once(kb_gemm *g);
__attribute__((noinline)) int kb_run_once(kb_gemm *g) {
    kl_scope_begin();
    kl_tensor *y = kl_matmul(g->a, g->b);
    kl_scope_end();
    return y ? 0 : -1;
}

static double time_one(kb_gemm *g, int reps) {
    double *t = malloc(sizeof(double) * (size_t)reps);
    kb_run_once(g);
    for (int r = 0; r < reps; r++) {
        double t0 = kb_now_s();
        kb_run_once(g);
        t[r] = kb_now_s() - t0;
    }
    double med = kb_summarize(t, reps).median;
    free(t);
    return med * 1e3;
}

/* Times and prints a list; returns the summed ms per step (and the flops). */
static double run_list(const kb_cfg *c, kb_gemm *g, int n, int reps, int count_only, double *step_flops,
                       int64_t *step_calls) {
    double ms = 0, fl = 0;
    int64_t calls = 0;
    printf("| product | M x N x K | batch | per step | GFLOP per step | ms per call | GFLOP/s | ms per step |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        if (make(c, &g[i]) < 0) {
            fprintf(stderr, "charlm_gemm_bench: %s: %s\n", g[i].what, kl_last_error());
            exit(1);
        }
        if (count_only) { /* as often as the step runs it, so the count is the step's */
            for (int k = 0; k < g[i].per_step; k++)
                if (kb_run_once(&g[i]) < 0) exit(1);
        } else {
            g[i].ms = time_one(&g[i], reps);
        }
        double f = flops(&g[i]) * g[i].per_step;
        fl += f;
        ms += g[i].ms * g[i].per_step;
        calls += g[i].per_step * g[i].batch;
        printf("| %s | %lld x %lld x %lld | %lld | %d | %.3f | %.4f | %.1f | %.2f |\n", g[i].what, (long long)g[i].M,
               (long long)g[i].N, (long long)g[i].K, (long long)g[i].batch, g[i].per_step, f / 1e9, g[i].ms,
               g[i].ms > 0 ? flops(&g[i]) / (g[i].ms * 1e6) : 0.0, g[i].ms * g[i].per_step);
        kl_release(g[i].a);
        kl_release(g[i].b);
    }
    *step_flops = fl;
    *step_calls = calls;
    return ms;
}

/* The attention products' batch straight to OpenBLAS, one sgemm per (b, h)
 * with the views' strides, against one sgemm of the same flops and inner
 * dimension (the batch stacked into A's rows). */
static void overhead_table(const kb_cfg *c, int reps) {
    int64_t T = c->context, D = c->embed / c->heads, BH = c->batch * c->heads, C = c->embed;
    float *q = malloc(sizeof(float) * (size_t)(c->batch * T * C)), *k = malloc(sizeof(float) * (size_t)(c->batch * T * C));
    float *s = malloc(sizeof(float) * (size_t)(BH * T * T)), *big = malloc(sizeof(float) * (size_t)(BH * T * D));
    if (!q || !k || !s || !big) exit(1);
    for (int64_t i = 0; i < c->batch * T * C; i++) q[i] = (float)((i * 7919) % 1000) * 1e-3f, k[i] = q[i];
    for (int64_t i = 0; i < BH * T * D; i++) big[i] = (float)(i % 997) * 1e-3f;
    double *t = malloc(sizeof(double) * (size_t)reps);
    printf("\n| q k^T for all %lld (b, h) | ms | GFLOP/s |\n|---|---|---|\n", (long long)BH);
    for (int v = 0; v < 3; v++) {
        for (int r = -1; r < reps; r++) {
            double t0 = kb_now_s();
            if (v == 0) {
                kl_scope_begin();
                kl_tensor *qa = kl_transpose(kl_from_data(q, KL_SHAPE(c->batch, T, c->heads, D), KL_F32), 1, 2);
                kl_tensor *ka = kl_transpose(kl_from_data(k, KL_SHAPE(c->batch, T, c->heads, D), KL_F32), 1, 2);
                t0 = kb_now_s();
                kl_matmul(qa, kl_transpose(ka, -2, -1));
                if (r >= 0) t[r] = kb_now_s() - t0;
                kl_scope_end();
                continue;
            } else if (v == 1) {
                for (int64_t bh = 0; bh < BH; bh++) {
                    int64_t b = bh / c->heads, h = bh % c->heads;
                    const float *qa = q + b * T * C + h * D, *ka = k + b * T * C + h * D;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)D, 1, qa, (int)C, ka,
                                (int)C, 0, s + bh * T * T, (int)T);
                }
            } else {
                /* [BH*T, D] @ [D, T]: the same flops and K in one call */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(BH * T), (int)T, (int)D, 1, big, (int)D, k,
                            (int)C, 0, s, (int)T);
            }
            if (r >= 0) t[r] = kb_now_s() - t0;
        }
        double med = kb_summarize(t, reps).median * 1e3;
        static const char *what[3] = {"kl_matmul on the [B, H, T, D] views (Kiln's loop)",
                                      "one cblas_sgemm per (b, h), strided operands",
                                      "one cblas_sgemm [B*H*T, D] @ [D, T] (same flops, same K)"};
        printf("| %s | %.3f | %.1f |\n", what[v], med, 2.0 * (double)(BH * T * T * D) / (med * 1e6));
    }
    free(t), free(q), free(k), free(s), free(big);
}

static int64_t arg(int argc, char **argv, const char *name, int64_t def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoll(argv[i + 1]);
    return def;
}

int main(int argc, char **argv) {
    kb_cfg c = {arg(argc, argv, "--batch", 32),   arg(argc, argv, "--layers", 4),   arg(argc, argv, "--heads", 4),
                arg(argc, argv, "--embed", 128),  arg(argc, argv, "--context", 128), arg(argc, argv, "--vocab", 114)};
    int threads = (int)arg(argc, argv, "--threads", 1), reps = (int)arg(argc, argv, "--reps", 20);
    int64_t peak_n = arg(argc, argv, "--peak", 1024);
    int count_only = 0;
    const char *list = "all";
    for (int i = 1; i < argc; i++) {
        count_only |= !strcmp(argv[i], "--count");
        if (!strcmp(argv[i], "--list") && i + 1 < argc) list = argv[i + 1];
    }
    int all = !strcmp(list, "all"), attn_only = !strcmp(list, "attn"), want_step = all || attn_only || !strcmp(list, "step");
    if (!want_step && strcmp(list, "blocks64") && strcmp(list, "blocks32")) {
        fprintf(stderr, "charlm_gemm_bench: --list takes all, step, attn, blocks64 or blocks32\n");
        return 2;
    }
    if (c.batch < 1 || c.layers < 1 || c.heads < 1 || c.embed < 1 || c.embed % c.heads || c.context < 1 ||
        c.vocab < 1 || threads < 1 || reps < 1 || peak_n < 1) {
        fprintf(stderr, "charlm_gemm_bench: bad arguments\n");
        return 2;
    }
    kl_set_num_threads(threads);
    kl_manual_seed(0);
    printf("charlm_gemm_bench: %s\n", kl_config_string());
    printf("model: %lld layers, %lld heads, embed %lld, context %lld, vocab %lld; batch %lld; %d reps, median\n\n",
           (long long)c.layers, (long long)c.heads, (long long)c.embed, (long long)c.context, (long long)c.vocab,
           (long long)c.batch, reps);

    /* one square sgemm: the library's rate with nothing else in the way */
    kb_gemm sq = {"square", peak_n, peak_n, peak_n, 1, KB_ROWS, KB_ROWS, 1, NULL, NULL, 0};
    if (make(&c, &sq) < 0) return 1;
    if (!count_only && all) sq.ms = time_one(&sq, reps < 5 ? reps : 5);
    double peak = sq.ms > 0 ? flops(&sq) / (sq.ms * 1e6) : 0;
    kl_release(sq.a), kl_release(sq.b);

    kb_gemm g[64];
    double fl;
    int64_t calls;
    int n = step_list(&c, g), ops = 0;
    if (attn_only) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (g[i].batch > 1) g[k++] = g[i];
        n = k;
    }
    for (int i = 0; i < n; i++) ops += g[i].per_step;
    double ms = 0;
    fl = 0, calls = 0;
    if (want_step) {
        printf("The step's products (%d matmul/mm calls, each batch entry one BLAS call):\n\n", ops);
        ms = run_list(&c, g, n, reps, count_only, &fl, &calls);
    } else {
        for (int i = 0; i < n; i++) fl += flops(&g[i]) * g[i].per_step;
    }
    printf("\nstep GEMM floor: %.2f ms, %.2f GFLOP, %lld BLAS calls, %.1f GFLOP/s; square %lld sgemm %.1f GFLOP/s "
           "(floor at that rate: %.2f ms)\n",
           ms, fl / 1e9, (long long)calls, ms > 0 ? fl / (ms * 1e6) : 0.0, (long long)peak_n, peak,
           peak > 0 ? fl / (peak * 1e6) : 0.0);

    double att_ms = 0, att_fl = 0;
    for (int i = 0; i < n; i++)
        if (g[i].batch > 1) att_ms += g[i].ms * g[i].per_step, att_fl += flops(&g[i]) * g[i].per_step;
    printf("attention products: %.2f ms, %.2f GFLOP (%.1f%% of the step's GEMM flops)\n", att_ms, att_fl / 1e9,
           100 * att_fl / fl);
    for (int64_t blk = 64; blk >= 32; blk /= 2) {
        kb_gemm cg[6 * 64];
        char name[16];
        snprintf(name, sizeof name, "blocks%lld", (long long)blk);
        if (c.context / blk + 1 > 64 || !(all || !strcmp(list, name))) continue;
        int nc = causal_list(&c, blk, cg);
        printf("\nCausal attention in query blocks of %lld rows (the six products, all layers):\n\n", (long long)blk);
        double cms = run_list(&c, cg, nc, reps, count_only, &fl, &calls);
        printf("\nblocks of %lld: %.2f ms, %.2f GFLOP, %lld BLAS calls (full: %.2f ms, %.2f GFLOP)\n", (long long)blk,
               cms, fl / 1e9, (long long)calls, att_ms, att_fl / 1e9);
    }
    if (!count_only && all) overhead_table(&c, reps);
    return 0;
}
