/*
 * multinomial.c — multinomial sampling (row in ops_create.def) and its
 * public wrapper.
 *
 * Randomness is the Philox stream's f64 uniforms: the call reserves
 * rows * m of them (m = num_samples with replacement, else the category
 * count; ke_random_reserve) and element r * m + s belongs to row r, so a
 * result depends only on the seed, the offset and the shapes.
 *
 * With replacement, a uniform u picks the first category whose cumulative
 * sum exceeds u * total (a zero-probability category never does). Without
 * replacement each category gets the key log(1 - u) / p (Efraimidis and
 * Spirakis: the categories in decreasing key order are a draw without
 * replacement), and the first num_samples keys win; a zero-probability
 * category has key -inf and is never drawn. log(1 - u) is philox_xf.h's
 * in-house one, not libm's log1p, so the CUDA kernel (cn_multinomial.c),
 * which runs this per-row algorithm in the same order and precision, draws
 * the same indices bit for bit. Every row is checked before any
 * sampling: negative, infinite or NaN probabilities, an all-zero row, or
 * fewer non-zero categories than samples without replacement are errors.
 */
#include "multinomial.h"

#include "alloc.h"
#include "optable.h"
#include "philox.h"

#include <math.h>
#include <stdlib.h>

int ke_infer_multinomial(ke_call *c, ke_outspec *out) {
    const char *op = ke_opname(c);
    const kl_tensor *p = c->in[0];
    char b[256];
    int64_t ns = ke_attr_multinomial_num_samples(&c->a);
    if (ke_rule_dtype(c, &out->dtype)) return -1; /* floating probabilities, int64 result */
    if (p->ndim < 1 || p->ndim > 2)
        return ke_err(KL_ERR_SHAPE, op, "probabilities must be 1-D or 2-D, got %s", ke_fmt_tensor(b, sizeof b, p));
    int64_t n = p->shape[p->ndim - 1];
    if (n == 0) return ke_err(KL_ERR_SHAPE, op, "probabilities %s have no categories", ke_fmt_tensor(b, sizeof b, p));
    if (ns <= 0) return ke_err(KL_ERR_ARG, op, "num_samples must be positive, got %lld", (long long)ns);
    if (!ke_attr_multinomial_replacement(&c->a) && ns > n)
        return ke_err(KL_ERR_ARG, op, "cannot draw %lld samples from %lld categories without replacement",
                      (long long)ns, (long long)n);
    out->ndim = p->ndim;
    if (p->ndim == 2) out->shape[0] = p->shape[0];
    out->shape[p->ndim - 1] = ns;
    return 1;
}

int ke_multinomial_check_row(const char *op, const double *w, int64_t r, int64_t n, int repl, int64_t ns) {
    double total = 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!(w[i] >= 0) || isinf(w[i]))
            return ke_err(KL_ERR_ARG, op, "row %lld: probability %lld is %g (must be finite and >= 0)", (long long)r,
                          (long long)i, w[i]);
        total += w[i];
        nonzero += w[i] > 0;
    }
    if (!(total > 0))
        return ke_err(KL_ERR_ARG, op, "row %lld: the probabilities sum to 0 (every category has probability 0)",
                      (long long)r);
    if (!repl && nonzero < ns)
        return ke_err(KL_ERR_ARG, op,
                      "row %lld: only %lld categories have non-zero probability, too few for %lld samples without "
                      "replacement", (long long)r, (long long)nonzero, (long long)ns);
    return 0;
}

/* Row r's probabilities as doubles, checked; -1 with the error recorded. */
static int load_row(const char *op, const kl_tensor *p, int64_t r, int64_t n, int repl, int64_t ns, double *w) {
    const char *row = ke_data(p) + (p->ndim == 2 ? r * p->stride[0] : 0) * (int64_t)ke_dtypes[p->dtype].size;
    ke_convert_strided(w, KL_F64, 1, row, (kl_dtype)p->dtype, p->stride[p->ndim - 1], n);
    return ke_multinomial_check_row(op, w, r, n, repl, ns);
}

typedef struct mn_key {
    double k;
    int64_t i;
} mn_key;

/* decreasing key, then increasing index (keys tie only at -inf or by chance) */
static int key_cmp(const void *a, const void *b) {
    const mn_key *x = a, *y = b;
    if (x->k != y->k) return x->k > y->k ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

int ke_cpu_multinomial(ke_call *c) {
    const char *op = ke_opname(c);
    const kl_tensor *p = c->in[0];
    int64_t *y = (int64_t *)ke_data(c->out[0]);
    int64_t rows = p->ndim == 2 ? p->shape[0] : 1, n = p->shape[p->ndim - 1];
    int64_t ns = ke_attr_multinomial_num_samples(&c->a);
    int repl = (int)ke_attr_multinomial_replacement(&c->a);
    int64_t m = repl ? ns : n;
    if (rows == 0) return 0;
    double *w = malloc(sizeof *w * (size_t)(rows * n)), *u = malloc(sizeof *u * (size_t)(rows * m));
    mn_key *keys = repl ? NULL : malloc(sizeof *keys * (size_t)n);
    int rc = 0;
    if (!w || !u || (!repl && !keys)) {
        rc = ke_err(KL_ERR_OOM, op, "out of memory for %lld probabilities", (long long)(rows * n));
        goto done;
    }
    for (int64_t r = 0; r < rows && rc == 0; r++) rc = load_row(op, p, r, n, repl, ns, w + r * n);
    if (rc) goto done;
    ke_philox_uniform_f64((uint64_t)ke_attr_seed(&c->a), (uint64_t)ke_attr_offset(&c->a), u, 0, rows * m, 0.0, 1.0);
    for (int64_t r = 0; r < rows; r++) {
        double *wr = w + r * n;
        const double *ur = u + r * m;
        int64_t *yr = y + r * ns;
        if (repl) {
            int64_t last = 0; /* the last non-zero category: where rounding may leave u * total */
            for (int64_t i = 0; i < n; i++) {
                if (wr[i] > 0) last = i;
                if (i) wr[i] += wr[i - 1];
            }
            for (int64_t s = 0; s < ns; s++) {
                double t = ur[s] * wr[n - 1];
                int64_t lo = 0, hi = n; /* first i with cdf[i] > t */
                while (lo < hi) {
                    int64_t mid = lo + (hi - lo) / 2;
                    if (wr[mid] > t) hi = mid;
                    else lo = mid + 1;
                }
                yr[s] = lo < n ? lo : last;
            }
        } else {
            for (int64_t i = 0; i < n; i++)
                keys[i] = (mn_key){wr[i] > 0 ? ke_philox_log1m_f64(ur[i]) / wr[i] : -INFINITY, i};
            qsort(keys, (size_t)n, sizeof *keys, key_cmp);
            for (int64_t s = 0; s < ns; s++) yr[s] = keys[s].i;
        }
    }
done:
    free(w);
    free(u);
    free(keys);
    return rc;
}

kl_tensor *kl_multinomial(kl_tensor *probs, int64_t num_samples, bool replacement) {
    if (ke_check_tensor(probs, "multinomial", 1)) return NULL;
    kl_tensor *in[1] = {probs};
    ke_call c = {.op = KE_OP_multinomial, .nin = 1, .in = in};
    ke_attr_set_multinomial_num_samples(&c.a, num_samples);
    ke_attr_set_multinomial_replacement(&c.a, replacement);
    if (ke_random_reserve(&c)) return NULL;
    return ke_call1(&c);
}
