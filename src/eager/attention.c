/*
 * attention.c — causal attention's fused CPU kernels (rows causal_attention
 * and causal_attention_backward in ops_nn.def), what
 * kl_scaled_dot_product_attention(..., causal = true) runs on the CPU when q,
 * k and v share their batch dims and there is no mask (nn.c routes it here).
 *
 * Why: the decomposition (q k^T, scale, where on the causal mask, softmax,
 * @ v) computes the whole [L, S] score matrix of every head, half of which the
 * mask throws away, and writes the scores, the probabilities and (backward)
 * their gradients as [..., L, S] tensors. Here each (batch, head) matrix runs
 * in query blocks of KE_CA_BLOCK rows: block [r0, r1) needs the keys [0, r1)
 * only (row i keeps keys j <= i, as the decomposition's ge(i, j) mask), so the
 * GEMMs skip the upper triangle's blocks, and the block's scores sit in a
 * small scratch while the softmax runs over them.
 *
 * The backward recomputes each block's probabilities from q and k (the
 * forward saves only its inputs; one GEMM per block more, no [..., L, S]
 * tensor kept between the passes), then per block:
 *   dv[0, r1) += P^T g,  dP = g v^T,  dS = P * (dP - rowsum(P * dP)),
 *   dq[r0, r1) = scale * dS k,  dk[0, r1) += scale * dS^T q
 * with dk and dv accumulated through BLAS's beta = 1 (zeroed first), so no
 * block pads a partial gradient to full size.
 *
 * Both are composites: the decompositions (the sdpa formula; the backward's
 * formula with kl_ ops) serve other devices and double backward;
 * KE_F_KEEP_CPU keeps them whole in compiled CPU graphs. Every operand keeps
 * its strides (ke_gemm takes row and column strides), so head views need no
 * copy in; seq_major ([..., L, H, E] operands, H a batch dim; nn.c passes it
 * for head views of [B, T, H, D] tensors) makes the outputs come out in that
 * layout, so none needs a copy back either. f16/bf16 compute in f32.
 * Threads: one task per (batch, head) matrix, its blocks in a fixed order
 * (the same bits at any thread count), while the block GEMMs are small
 * enough for OpenBLAS to run them on the calling thread (see ca_compute).
 */
#include "kernels_nn.h"
#include "threadpool.h"
#include "vmath.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Query rows per block: 32 skips 37.5% of the products at T = 128 (blocks of
 * 64: 25%) for 4x (2x) the GEMM calls of one full product. */
enum { KE_CA_BLOCK = 32 };

/* One operand matrix per (batch, head): its pointer is base + the batch
 * offset; rs, cs its row and column strides in elements. */
typedef struct ca_mat {
    char *p;
    int64_t rs, cs, bst[KL_MAX_DIMS];
} ca_mat;

typedef struct ca_ctx {
    kl_dtype dt;
    int nb;
    int64_t bshape[KL_MAX_DIMS];
    int64_t L, S, E, Ev;
    double scale;
    ca_mat q, k, v, g;
    ca_mat out, dq, dk, dv; /* outputs: columns contiguous (cs 1) */
    int failed;             /* a task could not get its scratch */
} ca_ctx;

/* The logical [batch..., rows, cols] view of t: t itself, or with seq_major
 * (t is [..., rows, H, cols]) its dims -3 and -2 swapped, so that H is the
 * last batch dim. Fills shape (may be NULL) and the matrix's strides. */
static void ca_view(const kl_tensor *t, int seq_major, int64_t *shape, ca_mat *m) {
    int nd = t->ndim;
    int64_t sh[KL_MAX_DIMS], st[KL_MAX_DIMS];
    memcpy(sh, t->shape, sizeof(int64_t) * (size_t)nd);
    memcpy(st, t->stride, sizeof(int64_t) * (size_t)nd);
    if (seq_major && nd >= 3) {
        int64_t a = sh[nd - 3], b = st[nd - 3];
        sh[nd - 3] = sh[nd - 2], st[nd - 3] = st[nd - 2];
        sh[nd - 2] = a, st[nd - 2] = b;
    }
    if (shape) memcpy(shape, sh, sizeof(int64_t) * (size_t)nd);
    if (m) {
        *m = (ca_mat){.p = ke_data(t), .rs = st[nd - 2], .cs = st[nd - 1]};
        memcpy(m->bst, st, sizeof(int64_t) * (size_t)(nd - 2));
    }
}

/* Element offset of batch item b in a matrix with batch strides bst. */
static int64_t ca_boff(const ca_ctx *p, const int64_t *bst, int64_t b) {
    int64_t off = 0;
    for (int d = p->nb - 1; d >= 0; d--) {
        off += (b % p->bshape[d]) * bst[d];
        b /= p->bshape[d];
    }
    return off;
}

/* Matrix b of m: its first element. */
static char *ca_at(const ca_ctx *p, const ca_mat *m, int64_t b) {
    return m->p + ca_boff(p, m->bst, b) * (int64_t)ke_dtypes[p->dt].size;
}

/* softmax over the kept keys [0, min(i + 1, S)) of each block row of P
 * (m rows, ld S, kn columns written by the scores' GEMM); the masked rest of
 * the row's kn columns set to 0 so the GEMMs after may read all kn.
 * ca_dsoftmax: D = P * (D - rowsum(P * D)) over the same columns. The max,
 * the sums and the dot run in KE_CA_LANES independent lanes so the loops
 * vectorize without reassociation (rows are short: at most S, 128 in charlm;
 * nn.c's row folds cost more than the row here). */
enum { KE_CA_LANES = 16 };
#define KE_CA_ROWS(T, sfx, EXP)                                                                          \
    static void ca_softmax_##sfx(T *P, int64_t m, int64_t r0, int64_t kn, int64_t S) {                   \
        for (int64_t ii = 0; ii < m; ii++) {                                                             \
            T *restrict r = P + ii * S;                                                                  \
            const int64_t n = r0 + ii + 1 < S ? r0 + ii + 1 : S, nl = n / KE_CA_LANES * KE_CA_LANES;     \
            T acc[KE_CA_LANES], mx = r[0], s = 0;                                                        \
            for (int l = 0; l < KE_CA_LANES; l++) acc[l] = r[0];                                         \
            for (int64_t j = 0; j < nl; j += KE_CA_LANES)                                                \
                for (int l = 0; l < KE_CA_LANES; l++) acc[l] = r[j + l] > acc[l] ? r[j + l] : acc[l];    \
            for (int64_t j = nl; j < n; j++) mx = r[j] > mx ? r[j] : mx;                                 \
            for (int l = 0; l < KE_CA_LANES; l++) mx = acc[l] > mx ? acc[l] : mx, acc[l] = 0;            \
            for (int64_t j = 0; j < nl; j += KE_CA_LANES)                                                \
                for (int l = 0; l < KE_CA_LANES; l++) acc[l] += r[j + l] = EXP(r[j + l] - mx);           \
            for (int64_t j = nl; j < n; j++) s += r[j] = EXP(r[j] - mx);                                 \
            for (int l = 0; l < KE_CA_LANES; l++) s += acc[l];                                           \
            const T inv = (T)1 / s;                                                                      \
            for (int64_t j = 0; j < n; j++) r[j] *= inv;                                                 \
            for (int64_t j = n; j < kn; j++) r[j] = 0;                                                   \
        }                                                                                                \
    }                                                                                                    \
    static void ca_dsoftmax_##sfx(const T *P, T *D, int64_t m, int64_t kn, int64_t S) {                  \
        for (int64_t ii = 0; ii < m; ii++) {                                                             \
            const T *restrict pr = P + ii * S;                                                           \
            T *restrict dr = D + ii * S;                                                                 \
            T acc[KE_CA_LANES] = {0}, dot = 0;                                                           \
            int64_t j = 0;                                                                               \
            for (; j + KE_CA_LANES <= kn; j += KE_CA_LANES)                                              \
                for (int l = 0; l < KE_CA_LANES; l++) acc[l] += pr[j + l] * dr[j + l];                  \
            for (; j < kn; j++) dot += pr[j] * dr[j];                                                    \
            for (int l = 0; l < KE_CA_LANES; l++) dot += acc[l];                                         \
            for (j = 0; j < kn; j++) dr[j] = pr[j] * (dr[j] - dot);                                      \
        }                                                                                                \
    }
KE_CA_ROWS(float, f32, ke_vexpf)
KE_CA_ROWS(double, f64, exp)

/* P[m, kn] = scale * q[r0, r1) k[0, kn)^T, then the causal softmax. */
static void ca_probs(const ca_ctx *p, const char *q, const char *k, void *P, int64_t r0, int64_t m, int64_t kn) {
    size_t es = ke_dtypes[p->dt].size;
    ke_gemm(p->dt, m, kn, p->E, p->scale, q + (size_t)(r0 * p->q.rs) * es, p->q.rs, p->q.cs, k, p->k.cs, p->k.rs,
            0, P, p->S);
    if (p->dt == KL_F64)
        ca_softmax_f64(P, m, r0, kn, p->S);
    else
        ca_softmax_f32(P, m, r0, kn, p->S);
}

static void ca_fwd_range(void *ctx, int64_t b0, int64_t b1) {
    ca_ctx *p = ctx;
    size_t es = ke_dtypes[p->dt].size;
    void *P = malloc(es * (size_t)(KE_CA_BLOCK * p->S));
    if (!P) {
        p->failed = 1;
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const char *q = ca_at(p, &p->q, b), *k = ca_at(p, &p->k, b), *v = ca_at(p, &p->v, b);
        char *out = ca_at(p, &p->out, b);
        for (int64_t r0 = 0; r0 < p->L; r0 += KE_CA_BLOCK) {
            int64_t m = p->L - r0 < KE_CA_BLOCK ? p->L - r0 : KE_CA_BLOCK;
            int64_t kn = r0 + m < p->S ? r0 + m : p->S;
            ca_probs(p, q, k, P, r0, m, kn);
            ke_gemm(p->dt, m, p->Ev, kn, 1, P, p->S, 1, v, p->v.rs, p->v.cs, 0, out + (size_t)(r0 * p->out.rs) * es,
                    p->out.rs);
        }
    }
    free(P);
}

/* Zeroes the rows x cols matrix at d (row stride rs, columns contiguous). */
static void ca_zero(char *d, int64_t rows, int64_t cols, int64_t rs, size_t es) {
    if (rs == cols) {
        memset(d, 0, es * (size_t)(rows * cols));
        return;
    }
    for (int64_t r = 0; r < rows; r++) memset(d + (size_t)(r * rs) * es, 0, es * (size_t)cols);
}

static void ca_bwd_range(void *ctx, int64_t b0, int64_t b1) {
    ca_ctx *p = ctx;
    size_t es = ke_dtypes[p->dt].size;
    char *P = malloc(es * (size_t)(2 * KE_CA_BLOCK * p->S)), *D = P + es * (size_t)(KE_CA_BLOCK * p->S);
    if (!P) {
        p->failed = 1;
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const char *q = ca_at(p, &p->q, b), *k = ca_at(p, &p->k, b), *v = ca_at(p, &p->v, b), *g = ca_at(p, &p->g, b);
        char *dq = ca_at(p, &p->dq, b), *dk = ca_at(p, &p->dk, b), *dv = ca_at(p, &p->dv, b);
        /* keys past L (S > L) get no probability: their gradients stay 0 */
        ca_zero(dk, p->S, p->E, p->dk.rs, es);
        ca_zero(dv, p->S, p->Ev, p->dv.rs, es);
        for (int64_t r0 = 0; r0 < p->L; r0 += KE_CA_BLOCK) {
            int64_t m = p->L - r0 < KE_CA_BLOCK ? p->L - r0 : KE_CA_BLOCK;
            int64_t kn = r0 + m < p->S ? r0 + m : p->S;
            const char *gb = g + (size_t)(r0 * p->g.rs) * es, *qb = q + (size_t)(r0 * p->q.rs) * es;
            ca_probs(p, q, k, P, r0, m, kn);
            ke_gemm(p->dt, kn, p->Ev, m, 1, P, 1, p->S, gb, p->g.rs, p->g.cs, 1, dv, p->dv.rs);
            ke_gemm(p->dt, m, kn, p->Ev, 1, gb, p->g.rs, p->g.cs, v, p->v.cs, p->v.rs, 0, D, p->S);
            if (p->dt == KL_F64)
                ca_dsoftmax_f64((const double *)P, (double *)D, m, kn, p->S);
            else
                ca_dsoftmax_f32((const float *)P, (float *)D, m, kn, p->S);
            ke_gemm(p->dt, m, p->E, kn, p->scale, D, p->S, 1, k, p->k.rs, p->k.cs, 0,
                    dq + (size_t)(r0 * p->dq.rs) * es, p->dq.rs);
            ke_gemm(p->dt, kn, p->E, m, p->scale, D, 1, p->S, qb, p->q.rs, p->q.cs, 1, dk, p->dk.rs);
        }
    }
    free(P);
}

/* ---- shape rules ----------------------------------------------------------------------------- */

/* q [..., L, E], k [..., S, E], v [..., S, Ev] with one floating dtype and the
 * same batch dims (no broadcasting: kl_scaled_dot_product_attention sends the
 * other cases to the decomposition); with seq_major [..., L, H, E],
 * [..., S, H, E], [..., S, H, Ev]. Fills the logical ([batch..., rows, cols])
 * shapes of the three. */
static int ca_check(ke_call *c, kl_tensor *const *qkv, int64_t (*ls)[KL_MAX_DIMS]) {
    const char *op = ke_opname(c);
    char b1[256], b2[256], b3[256];
    const kl_tensor *q = qkv[0], *k = qkv[1], *v = qkv[2];
    int sm = ke_attr_causal_attention_seq_major(&c->a);
    ke_fmt_tensor(b1, sizeof b1, q), ke_fmt_tensor(b2, sizeof b2, k), ke_fmt_tensor(b3, sizeof b3, v);
    if (!ke_is_float((kl_dtype)q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return ke_err(KL_ERR_DTYPE, op, "q, k and v must share one floating dtype, got %s, %s and %s", b1, b2, b3);
    int nd = q->ndim, ok = nd >= 2 + sm && k->ndim == nd && v->ndim == nd;
    for (int i = 0; ok && i < 3; i++) ca_view(qkv[i], sm, ls[i], NULL);
    for (int d = 0; ok && d < nd - 2; d++) ok = ls[1][d] == ls[0][d] && ls[2][d] == ls[0][d];
    if (!ok || ls[1][nd - 1] != ls[0][nd - 1] || ls[2][nd - 2] != ls[1][nd - 2])
        return ke_err(KL_ERR_SHAPE, op, "q %s, k %s and v %s do not fit %s", b1, b2, b3,
                      sm ? "[..., L, H, E], [..., S, H, E], [..., S, H, Ev] (seq_major)"
                         : "[..., L, E], [..., S, E], [..., S, Ev]");
    return 0;
}

int ke_infer_causal_attention(ke_call *c, ke_outspec *out) {
    int64_t ls[3][KL_MAX_DIMS];
    if (c->nin != 3) return ke_err(KL_ERR_ARG, ke_opname(c), "expects q, k and v, got %d inputs", c->nin);
    if (ca_check(c, c->in, ls) < 0) return -1;
    const kl_tensor *q = c->in[0], *v = c->in[2];
    out->ndim = q->ndim;
    memcpy(out->shape, q->shape, sizeof(int64_t) * (size_t)q->ndim);
    out->shape[q->ndim - 1] = v->shape[v->ndim - 1];
    out->dtype = (kl_dtype)q->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    return 1;
}

/* inputs g (the output's gradient), q, k, v; outputs dq, dk, dv */
int ke_infer_causal_attention_backward(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    char b1[256], b2[256];
    int64_t ls[3][KL_MAX_DIMS];
    if (c->nin != 4) return ke_err(KL_ERR_ARG, op, "expects g, q, k and v, got %d inputs", c->nin);
    if (ca_check(c, c->in + 1, ls) < 0) return -1;
    const kl_tensor *g = c->in[0], *q = c->in[1], *v = c->in[3];
    int nd = q->ndim, ok = g->ndim == nd && g->dtype == q->dtype;
    for (int d = 0; ok && d < nd - 1; d++) ok = g->shape[d] == q->shape[d];
    if (!ok || g->shape[nd - 1] != v->shape[nd - 1])
        return ke_err(KL_ERR_SHAPE, op, "gradient %s does not match the output of q %s and v's last dim",
                      ke_fmt_tensor(b1, sizeof b1, g), ke_fmt_tensor(b2, sizeof b2, q));
    for (int o = 0; o < 3; o++) {
        const kl_tensor *t = c->in[1 + o];
        out[o].dtype = (kl_dtype)t->dtype;
        out[o].ndim = t->ndim;
        memcpy(out[o].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    c->compute = ke_compute_dtype((kl_dtype)q->dtype);
    return 3;
}

/* ---- CPU kernels ----------------------------------------------------------------------------- */

static int ca_compute(ke_call *c, kl_tensor *const *in, kl_tensor *const *out) {
    int bwd = c->op == KE_OP_causal_attention_backward, sm = ke_attr_causal_attention_seq_major(&c->a);
    kl_tensor *const *qkv = in + bwd;
    int64_t ls[3][KL_MAX_DIMS];
    ca_ctx p = {.dt = c->compute, .nb = qkv[0]->ndim - 2, .scale = ke_attr_causal_attention_scale(&c->a)};
    ca_view(qkv[0], sm, ls[0], &p.q), ca_view(qkv[1], sm, ls[1], &p.k), ca_view(qkv[2], sm, ls[2], &p.v);
    int nb = p.nb;
    p.L = ls[0][nb], p.S = ls[1][nb], p.E = ls[0][nb + 1], p.Ev = ls[2][nb + 1];
    memcpy(p.bshape, ls[0], sizeof(int64_t) * (size_t)nb);
    int64_t nbatch = ke_numel(nb, ls[0]);
    if (bwd) {
        ca_view(in[0], sm, NULL, &p.g);
        ca_view(out[0], sm, NULL, &p.dq), ca_view(out[1], sm, NULL, &p.dk), ca_view(out[2], sm, NULL, &p.dv);
    } else {
        ca_view(out[0], sm, NULL, &p.out);
    }
    if (nbatch == 0) return 0;
    if (p.L == 0 || p.S == 0) {
        /* no queries or no keys: every output is 0 (an empty softmax times an empty v) */
        for (int o = 0; o < c->nout; o++)
            memset(ke_data(out[o]), 0, ke_dtypes[p.dt].size * (size_t)ke_numel(out[o]->ndim, out[o]->shape));
        return 0;
    }
    /* linalg.c's rule: GEMMs below KE_GEMM_SMALL run on one OpenBLAS thread, so the
     * matrices go over Kiln's pool; larger ones (long sequences, wide heads) would nest
     * OpenBLAS's threads inside the pool's, so they run one after the other on its threads */
    double work = (double)KE_CA_BLOCK * (double)(p.L < p.S ? p.L : p.S) * (double)(p.E > p.Ev ? p.E : p.Ev);
    if (work < KE_GEMM_SMALL) {
        ke_parallel_for(nbatch, 1, bwd ? ca_bwd_range : ca_fwd_range, &p);
    } else {
        ke_blas_prepare();
        (bwd ? ca_bwd_range : ca_fwd_range)(&p, 0, nbatch);
    }
    if (p.failed)
        return ke_err(KL_ERR_OOM, ke_opname(c), "out of memory for a %d x %lld score block", KE_CA_BLOCK,
                      (long long)p.S);
    return 0;
}

int ke_cpu_causal_attention(ke_call *c) { return ke_with_compute_dtype_views(c, ca_compute); }
int ke_cpu_causal_attention_backward(ke_call *c) { return ke_with_compute_dtype_views(c, ca_compute); }

/* ---- decompositions -------------------------------------------------------------------------- */

/* With seq_major, t's dims -3 and -2 swapped (a view): the logical layout. */
static kl_tensor *ca_logical(const ke_call *c, kl_tensor *t) {
    return ke_attr_causal_attention_seq_major(&c->a) ? kl_transpose(t, -3, -2) : t;
}

int ke_decomp_causal_attention(ke_call *c) {
    ke_outspec spec;
    if (ke_infer_causal_attention(c, &spec) < 0) return -1;
    kl_scope_begin();
    kl_tensor *y = ca_logical(c, ke_sdpa_formula(ca_logical(c, c->in[0]), ca_logical(c, c->in[1]),
                                                 ca_logical(c, c->in[2]), NULL, true,
                                                 ke_attr_causal_attention_scale(&c->a)));
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* The backward's formula over the whole [..., L, S] matrices (the masked
 * probabilities are exactly 0, so the mask needs no second where). */
int ke_decomp_causal_attention_backward(ke_call *c) {
    ke_outspec spec[3];
    if (ke_infer_causal_attention_backward(c, spec) < 0) return -1;
    double scale = ke_attr_causal_attention_scale(&c->a);
    kl_scope_begin();
    kl_tensor *g = ca_logical(c, c->in[0]), *q = ca_logical(c, c->in[1]), *k = ca_logical(c, c->in[2]),
              *v = ca_logical(c, c->in[3]);
    int64_t L = kl_shape(q)[kl_ndim(q) - 2], S = kl_shape(k)[kl_ndim(k) - 2], last = -1;
    kl_tensor *s = kl_mul_scalar(kl_matmul(q, kl_transpose(k, -2, -1)), scale);
    kl_tensor *keep = kl_to_device(kl_ge(kl_unsqueeze(kl_arange(0, (double)L, 1, KL_I64), 1),
                                         kl_unsqueeze(kl_arange(0, (double)S, 1, KL_I64), 0)),
                                   kl_device_of(q));
    kl_tensor *pr = kl_softmax(kl_where(keep, s, kl_full(0, NULL, -INFINITY, kl_dtype_of(q))), -1);
    kl_tensor *dp = kl_matmul(g, kl_transpose(v, -2, -1));
    kl_tensor *ds = kl_mul_scalar(kl_mul(pr, kl_sub(dp, kl_sum(kl_mul(pr, dp), 1, &last, true))), scale);
    kl_tensor *o[3] = {kl_matmul(ds, k), kl_matmul(kl_transpose(ds, -2, -1), q),
                       kl_matmul(kl_transpose(pr, -2, -1), g)};
    int ok = o[0] && o[1] && o[2];
    for (int i = 0; i < 3 && ok; i++) kl_keep(o[i] = ca_logical(c, o[i]));
    kl_scope_end();
    if (!ok) return -1;
    for (int i = 0; i < 3; i++) c->out[i] = o[i];
    c->nout = 3;
    return 0;
}

/* 1 if kl_scaled_dot_product_attention(q, k, v, NULL, true, .) can run as
 * causal_attention: CPU tensors (kl_device_of: a traced value's real
 * device, not its meta stand-in's), one floating dtype, the same batch dims,
 * nothing empty. */
int ke_causal_attention_fits(const kl_tensor *q, const kl_tensor *k, const kl_tensor *v) {
    const kl_tensor *t[3] = {q, k, v};
    int nd = q->ndim;
    for (int i = 0; i < 3; i++) {
        if (kl_device_of(t[i]).type != KL_CPU || t[i]->dtype != q->dtype || t[i]->ndim != nd || nd < 2 ||
            ke_numel(t[i]->ndim, t[i]->shape) == 0)
            return 0;
        for (int d = 0; d < nd - 2; d++)
            if (t[i]->shape[d] != q->shape[d]) return 0;
    }
    return ke_is_float((kl_dtype)q->dtype) && k->shape[nd - 1] == q->shape[nd - 1] &&
           v->shape[nd - 2] == k->shape[nd - 2];
}
