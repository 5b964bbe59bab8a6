/*
 * fused_ref.h — the hand-written fused C loops of bench/fused_ref.c (the
 * practical limit codegen_bench compares compiled kernels with). All f32,
 * contiguous, threaded with Kiln's pool.
 */
#ifndef KB_FUSED_REF_H
#define KB_FUSED_REF_H

#include <stdint.h>

void fr_chain5(const float *x, float *y, int64_t n);
void fr_gelu(const float *x, float *y, int64_t n);
void fr_softmax(const float *x, float *y, int64_t R, int64_t C);
void fr_layernorm(const float *x, const float *w, const float *b, float *y, int64_t R, int64_t C);
/* mean cross-entropy; rowloss: B floats of scratch */
float fr_xent(const float *x, const int64_t *target, float *rowloss, int64_t B, int64_t C);
/* y[M,N] = gelu(x[M,K] @ w1[K,H] + b1) @ w2[H,N] + b2; h: M*H floats of scratch */
void fr_mlp(const float *x, const float *w1, const float *b1, const float *w2, const float *b2, float *h, float *y,
            int64_t M, int64_t K, int64_t H, int64_t N);

/* AdamW's scalars as the primitive-op program rounds them to f32 */
typedef struct fr_adamw_consts {
    float decay;    /* 1 - lr*wd */
    float b1, one_m_b1, b2, one_m_b2;
    float bc2;      /* 1 - b2^t */
    float eps;
    float step;     /* lr / (1 - b1^t) */
} fr_adamw_consts;
void fr_adamw(float *p, const float *g, float *m, float *v, int64_t n, const fr_adamw_consts *k);

void fr_stream_copy(const float *a, float *c, int64_t n);
void fr_stream_add(const float *a, const float *b, float *c, int64_t n);

#endif /* KB_FUSED_REF_H */
