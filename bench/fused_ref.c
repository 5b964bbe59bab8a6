/*
 * fused_ref.c — hand-written fused C loops for the workloads of
 * shared/WORKLOADS.md: the practical limit the compiled kernels are measured
 * against (issue 5: "within 1.25x of a hand-written fused C loop"). One pass
 * over memory per workload, plain loops that gcc -O3 -march=native (the
 * project's release flags) vectorizes, the same f32 math as Kiln's eager
 * kernels (vmath.h polynomials, the same operation order as the primitive-op
 * definition), threaded with Kiln's own pool (ke_parallel_for, so
 * kl_set_num_threads sets the count for Kiln and this code alike).
 *
 * Row reductions use 16 independent accumulators: that is what lets gcc
 * vectorize a float sum without -ffast-math, and it reassociates the sum as a
 * vectorized compiled kernel would (results differ from eager's cascade
 * within f32 rounding).
 */
#include "fused_ref.h"

#include "threadpool.h"
#include "vmath.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { EW_GRAIN = 1 << 15, RA = 16 };

/* ---- elementwise ---------------------------------------------------------- */

typedef struct ew_ctx {
    const float *x, *x2;
    float *y;
} ew_ctx;

static void chain5_range(void *c_, int64_t b, int64_t e) {
    const ew_ctx *c = c_;
    const float *restrict x = c->x;
    float *restrict y = c->y;
    for (int64_t i = b; i < e; i++) {
        float v = x[i];
        y[i] = ke_vtanhf(ke_vsigmoidf(v * 2.0f + 1.0f) * v);
    }
}

void fr_chain5(const float *x, float *y, int64_t n) {
    ke_parallel_for(n, EW_GRAIN, chain5_range, &(ew_ctx){x, NULL, y});
}

/* 0.5*x*(1 + tanh(0.7978845608*(x + 0.044715*x*x*x))), Python's evaluation order */
static void gelu_range(void *c_, int64_t b, int64_t e) {
    const ew_ctx *c = c_;
    const float *restrict x = c->x;
    float *restrict y = c->y;
    for (int64_t i = b; i < e; i++) {
        float v = x[i];
        float inner = 0.7978845608f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + ke_vtanhf(inner));
    }
}

void fr_gelu(const float *x, float *y, int64_t n) {
    ke_parallel_for(n, EW_GRAIN, gelu_range, &(ew_ctx){x, NULL, y});
}

/* ---- row reductions ------------------------------------------------------- */

static inline float row_sum(const float *restrict x, int64_t n) {
    float acc[RA] = {0};
    int64_t i = 0;
    for (; i + RA <= n; i += RA)
        for (int j = 0; j < RA; j++) acc[j] += x[i + j];
    float s = 0;
    for (int j = 0; j < RA; j++) s += acc[j];
    for (; i < n; i++) s += x[i];
    return s;
}

/* max with NaN propagation (eager's amax rule): a NaN, once in, stays in */
static inline float nanmax(float a, float v) { return ke__self((v > a) | (v != v), v, a); }

/* GCC's vector extension: its loop vectorizer does not take the select-based
 * max reduction above, so the 16 lanes are written out as one vector */
typedef float fr_v16 __attribute__((vector_size(64)));
typedef int32_t fr_i16 __attribute__((vector_size(64)));

static inline float row_max(const float *restrict x, int64_t n) {
    fr_v16 acc;
    for (int j = 0; j < RA; j++) acc[j] = -INFINITY;
    int64_t i = 0;
    for (; i + RA <= n; i += RA) {
        fr_v16 v;
        memcpy(&v, x + i, sizeof v);
        fr_i16 take = (v > acc) | (v != v);
        acc = (fr_v16)(((fr_i16)v & take) | ((fr_i16)acc & ~take));
    }
    float m = -INFINITY;
    for (int j = 0; j < RA; j++) m = nanmax(m, acc[j]);
    for (; i < n; i++) m = nanmax(m, x[i]);
    return m;
}

typedef struct row_ctx {
    const float *x, *w, *b;
    const int64_t *t;
    float *y;
    int64_t C;
} row_ctx;

/* rows per task: about 64 KiB of input */
static int64_t row_grain(int64_t C) { return C >= 16384 ? 1 : 16384 / C; }

static void softmax_range(void *c_, int64_t b, int64_t e) {
    const row_ctx *c = c_;
    const int64_t C = c->C;
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = c->x + r * C;
        float *restrict y = c->y + r * C;
        float m = row_max(x, C);
        for (int64_t i = 0; i < C; i++) y[i] = ke_vexpf(x[i] - m);
        float s = row_sum(y, C);
        for (int64_t i = 0; i < C; i++) y[i] = y[i] / s;
    }
}

void fr_softmax(const float *x, float *y, int64_t R, int64_t C) {
    ke_parallel_for(R, row_grain(C), softmax_range, &(row_ctx){x, NULL, NULL, NULL, y, C});
}

/* mu = mean; d = x - mu; v = mean(d*d); y = d*rsqrt(v + 1e-5)*w + b. The
 * centred row is kept in y between the passes (it stays in cache). */
static void layernorm_range(void *c_, int64_t b, int64_t e) {
    const row_ctx *c = c_;
    const int64_t C = c->C;
    const float *restrict w = c->w, *restrict bias = c->b;
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = c->x + r * C;
        float *restrict y = c->y + r * C;
        float mu = row_sum(x, C) / (float)C;
        float acc[RA] = {0};
        int64_t i = 0;
        for (; i + RA <= C; i += RA)
            for (int j = 0; j < RA; j++) {
                float d = x[i + j] - mu;
                y[i + j] = d;
                acc[j] += d * d;
            }
        float ss = 0;
        for (int j = 0; j < RA; j++) ss += acc[j];
        for (; i < C; i++) {
            float d = x[i] - mu;
            y[i] = d;
            ss += d * d;
        }
        float rs = ke_vrsqrtf(ss / (float)C + 1e-5f);
        for (i = 0; i < C; i++) y[i] = y[i] * rs * w[i] + bias[i];
    }
}

void fr_layernorm(const float *x, const float *w, const float *b, float *y, int64_t R, int64_t C) {
    ke_parallel_for(R, row_grain(C), layernorm_range, &(row_ctx){x, w, b, NULL, y, C});
}

/* per row: -((x[t] - m) - log(sum(exp(x - m)))) into y[r]; the mean is taken
 * serially from those B floats (negligible next to B*C) */
static void xent_range(void *c_, int64_t b, int64_t e) {
    const row_ctx *c = c_;
    const int64_t C = c->C;
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = c->x + r * C;
        float m = row_max(x, C);
        float acc[RA] = {0};
        int64_t i = 0;
        for (; i + RA <= C; i += RA)
            for (int j = 0; j < RA; j++) acc[j] += ke_vexpf(x[i + j] - m);
        float s = 0;
        for (int j = 0; j < RA; j++) s += acc[j];
        for (; i < C; i++) s += ke_vexpf(x[i] - m);
        int64_t t = c->t[r];
        c->y[r] = -((x[t] - m) - ke_vlogf(s));
    }
}

float fr_xent(const float *x, const int64_t *target, float *rowloss, int64_t B, int64_t C) {
    ke_parallel_for(B, row_grain(C), xent_range, &(row_ctx){x, NULL, NULL, target, rowloss, C});
    return row_sum(rowloss, B) / (float)B;
}

/* ---- mlp: two sgemms with the bias + GELU in one pass between them ------- */

typedef struct mlp_ctx {
    float *h, *y;
    const float *b1, *b2;
    int64_t H, N;
} mlp_ctx;

static void bias_gelu_range(void *c_, int64_t b, int64_t e) {
    const mlp_ctx *c = c_;
    for (int64_t r = b; r < e; r++) {
        float *restrict h = c->h + r * c->H;
        const float *restrict b1 = c->b1;
        for (int64_t i = 0; i < c->H; i++) h[i] = ke_vgelu_erff(h[i] + b1[i]);
        float *restrict y = c->y + r * c->N; /* the second sgemm accumulates onto b2 */
        for (int64_t i = 0; i < c->N; i++) y[i] = c->b2[i];
    }
}

void fr_mlp(const float *x, const float *w1, const float *b1, const float *w2, const float *b2, float *h, float *y,
            int64_t M, int64_t K, int64_t H, int64_t N) {
    ke_pool_quiesce(); /* hand the cores to OpenBLAS, as eager matmul does */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)H, (int)K, 1.0f, x, (int)K, w1, (int)H, 0.0f, h,
                (int)H);
    ke_parallel_for(M, 4, bias_gelu_range, &(mlp_ctx){h, y, b1, b2, H, N});
    ke_pool_quiesce();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)H, 1.0f, h, (int)H, w2, (int)N, 1.0f, y,
                (int)N);
}

/* ---- adamw: p, m, v updated in place from g, one pass --------------------- */

typedef struct adamw_ctx {
    float *p, *m, *v;
    const float *g;
    fr_adamw_consts k;
} adamw_ctx;

static void adamw_range(void *c_, int64_t b, int64_t e) {
    const adamw_ctx *c = c_;
    float *restrict p = c->p, *restrict m = c->m, *restrict v = c->v;
    const float *restrict g = c->g;
    const fr_adamw_consts k = c->k;
    for (int64_t i = b; i < e; i++) {
        float gi = g[i];
        float pi = p[i] * k.decay;
        float mi = m[i] * k.b1 + gi * k.one_m_b1;
        float vi = v[i] * k.b2 + gi * gi * k.one_m_b2;
        float den = sqrtf(vi / k.bc2) + k.eps;
        p[i] = pi - mi / den * k.step;
        m[i] = mi;
        v[i] = vi;
    }
}

void fr_adamw(float *p, const float *g, float *m, float *v, int64_t n, const fr_adamw_consts *k) {
    ke_parallel_for(n, EW_GRAIN, adamw_range, &(adamw_ctx){p, m, v, g, *k});
}

/* ---- STREAM copy / add ---------------------------------------------------- */

static void copy_range(void *c_, int64_t b, int64_t e) {
    const ew_ctx *c = c_;
    const float *restrict x = c->x;
    float *restrict y = c->y;
    for (int64_t i = b; i < e; i++) y[i] = x[i];
}

static void add_range(void *c_, int64_t b, int64_t e) {
    const ew_ctx *c = c_;
    const float *restrict x = c->x, *restrict x2 = c->x2;
    float *restrict y = c->y;
    for (int64_t i = b; i < e; i++) y[i] = x[i] + x2[i];
}

void fr_stream_copy(const float *a, float *c, int64_t n) {
    ke_parallel_for(n, 1 << 16, copy_range, &(ew_ctx){a, NULL, c});
}

void fr_stream_add(const float *a, const float *b, float *c, int64_t n) {
    ke_parallel_for(n, 1 << 16, add_range, &(ew_ctx){a, b, c});
}
