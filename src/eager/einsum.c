/*
 * einsum.c — outer, baddbmm and einsum (rows in ops_linalg.def), implicit
 * composites written with kl_ ops, and their public wrappers.
 *
 * einsum handles what maps onto one bmm: two operands whose subscripts are
 * sorted into batch letters (in both operands and the output), contracted
 * letters (in both, not in the output) and letters kept from one operand;
 * letters in one operand only and not in the output are summed first. The
 * operands are permuted to [batch, kept, contracted] and [batch, contracted,
 * kept], reshaped to 3-D, multiplied and the result permuted to the output's
 * order. One operand: a permutation with sums over dropped letters, and the
 * 2-D trace "ii->" and diagonal "ii->i". Anything else (ellipses, repeated
 * letters in two-operand equations, three or more operands, broadcasting of
 * size-1 dims) is a KL_ERR_ARG naming the equation.
 */
#include "optable.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>

/* ---- outer, baddbmm ------------------------------------------------------------------------- */

int ke_decomp_outer(ke_call *c) {
    kl_tensor *a = c->in[0], *b = c->in[1];
    char b1[256], b2[256];
    if (a->ndim != 1 || b->ndim != 1)
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "expects two 1-D tensors, got %s and %s",
                      ke_fmt_tensor(b1, sizeof b1, a), ke_fmt_tensor(b2, sizeof b2, b));
    kl_scope_begin();
    kl_tensor *y = kl_mul(kl_unsqueeze(a, 1), b);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* beta * self + alpha * bmm(b1, b2) in the batches' dtype, as PyTorch 1.13:
 * self is converted to it, integer products take beta and alpha truncated to
 * integers, and beta == 0 ignores self's values (NaN too). */
int ke_decomp_baddbmm(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *s = c->in[0], *b1 = c->in[1], *b2 = c->in[2];
    double beta = ke_attr_baddbmm_beta(&c->a), alpha = ke_attr_baddbmm_alpha(&c->a);
    char t1[256], t2[256];
    if (!ke_is_float((kl_dtype)b1->dtype)) beta = trunc(beta), alpha = trunc(alpha);
    kl_scope_begin();
    kl_tensor *y = kl_bmm(b1, b2);
    if (y) { /* self must broadcast to the product's shape [b, n, p] */
        int ok = s->ndim <= 3;
        for (int i = 1; ok && i <= s->ndim; i++)
            ok = s->shape[s->ndim - i] == y->shape[3 - i] || s->shape[s->ndim - i] == 1;
        if (!ok) {
            ke_err(KL_ERR_SHAPE, op, "self %s does not broadcast to the product's shape %s",
                   ke_fmt_tensor(t1, sizeof t1, s), ke_fmt_shape(t2, sizeof t2, 3, y->shape));
            y = NULL;
        }
    }
    if (y && s->dtype != y->dtype) s = kl_to_dtype(s, (kl_dtype)y->dtype);
    if (y && alpha != 1) y = kl_mul_scalar(y, alpha);
    if (y && beta != 0) y = kl_add(beta == 1 ? s : kl_mul_scalar(s, beta), y);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* ---- einsum ----------------------------------------------------------------------------------- */

#define EQ_MAX (8 * KE_MAX_LIST) /* characters: 8 per list element */

typedef struct eq_term {
    char s[KL_MAX_DIMS + 1];
    int n;
} eq_term;

/* The equation packed in the list attribute, back into text. */
static void eq_unpack(const ke_call *c, char *eq) {
    const int64_t *l = ke_attr_einsum_equation(&c->a);
    int n = ke_attr_einsum_equation_len(&c->a), k = 0;
    if (n > KE_MAX_LIST) n = KE_MAX_LIST; /* never: ke_set_list refuses more */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 8; b++) eq[k++] = (char)(((uint64_t)l[i] >> (8 * b)) & 0xff);
    eq[k] = 0;
}

static int eq_err(const char *eq, const char *fmt, const char *detail) {
    char m[256];
    snprintf(m, sizeof m, fmt, detail);
    return ke_err(KL_ERR_ARG, "einsum", "\"%s\": %s", eq, m);
}

static int term_has(const eq_term *t, char ch) { return memchr(t->s, ch, (size_t)t->n) != NULL; }
static int term_pos(const eq_term *t, char ch) { return (int)((const char *)memchr(t->s, ch, (size_t)t->n) - t->s); }

/* Parses "ab,bc->ac" (spaces ignored; without "->" the output is the letters
 * seen once, sorted, as in PyTorch) into nin terms and the output. */
static int eq_parse(const char *eq, int nin, eq_term *in, eq_term *out) {
    eq_term t[3] = {{{0}, 0}};
    int k = 0, arrow = 0;
    for (const char *p = eq; *p; p++) {
        if (*p == ' ') continue;
        if (*p == '.') return eq_err(eq, "%s", "ellipses (...) are not supported");
        if (*p == ',') {
            if (arrow || ++k > 1) return eq_err(eq, "%s", "only one- and two-operand equations are supported");
            continue;
        }
        if (*p == '-' && p[1] == '>') {
            if (arrow) return eq_err(eq, "%s", "more than one \"->\"");
            arrow = 1;
            p++;
            continue;
        }
        if (!isalpha((unsigned char)*p)) {
            char ch[2] = {*p, 0};
            return eq_err(eq, "invalid subscript '%s' (letters only)", ch);
        }
        eq_term *dst = arrow ? &t[2] : &t[k];
        if (dst->n == KL_MAX_DIMS) return eq_err(eq, "%s", "a term has more subscripts than Kiln has dims");
        dst->s[dst->n++] = *p;
    }
    if (k + 1 != nin) {
        char d[64];
        snprintf(d, sizeof d, "%d terms for %d operands", k + 1, nin);
        return eq_err(eq, "%s", d);
    }
    if (!arrow) { /* implicit output: letters that occur exactly once, in alphabetical order */
        for (int ch = 'A'; ch <= 'z'; ch++) {
            if (!isalpha(ch)) continue;
            int cnt = 0;
            for (int i = 0; i < nin; i++)
                for (int j = 0; j < t[i].n; j++) cnt += t[i].s[j] == ch;
            if (cnt == 1) t[2].s[t[2].n++] = (char)ch;
        }
    }
    for (int i = 0; i < nin; i++) in[i] = t[i];
    *out = t[2];
    for (int j = 0; j < out->n; j++) {
        char ch[2] = {out->s[j], 0};
        if (memchr(out->s + j + 1, out->s[j], (size_t)(out->n - j - 1)))
            return eq_err(eq, "output subscript '%s' appears more than once", ch);
        int seen = 0;
        for (int i = 0; i < nin; i++) seen |= term_has(&in[i], out->s[j]);
        if (!seen) return eq_err(eq, "output subscript '%s' appears in no operand", ch);
    }
    return 0;
}

static int has_repeat(const eq_term *t) {
    for (int j = 0; j < t->n; j++)
        if (memchr(t->s + j + 1, t->s[j], (size_t)(t->n - j - 1))) return 1;
    return 0;
}

/* x summed over the letters of t missing from keep_a and keep_b; t updated. */
static kl_tensor *sum_unused(kl_tensor *x, eq_term *t, const eq_term *keep_a, const eq_term *keep_b) {
    int64_t dims[KL_MAX_DIMS];
    int nd = 0;
    eq_term r = {{0}, 0};
    for (int j = 0; j < t->n; j++) {
        if (term_has(keep_a, t->s[j]) || (keep_b && term_has(keep_b, t->s[j])))
            r.s[r.n++] = t->s[j];
        else
            dims[nd++] = j;
    }
    *t = r;
    return nd ? kl_sum(x, nd, dims, false) : x;
}

/* x (subscripts t) permuted to the order of `to` (same letters). */
static kl_tensor *permute_to(kl_tensor *x, const eq_term *t, const char *to, int n) {
    int64_t p[KL_MAX_DIMS];
    int ident = 1;
    for (int j = 0; j < n; j++) {
        p[j] = term_pos(t, to[j]);
        ident &= p[j] == j;
    }
    return ident ? x : kl_permute(x, n, p);
}

static kl_tensor *einsum1(const char *eq, kl_tensor *x, eq_term *a, const eq_term *o) {
    if (has_repeat(a)) {
        if (!(a->n == 2 && x->ndim == 2 && (o->n == 0 || o->n == 1))) {
            eq_err(eq, "%s", "repeated subscripts are supported only as the 2-D trace \"ii->\" and diagonal \"ii->i\"");
            return NULL;
        }
        if (x->shape[0] != x->shape[1]) {
            eq_err(eq, "%s", "the repeated subscript has two sizes");
            return NULL;
        }
        int64_t n = x->shape[0], st = x->stride[0] + x->stride[1];
        kl_tensor *d = kl_as_strided(x, 1, &n, &st, x->offset);
        return o->n ? kl_clone(d) : kl_sum(d, 0, NULL, false);
    }
    x = sum_unused(x, a, o, NULL);
    return x ? kl_clone(permute_to(x, a, o->s, o->n)) : NULL;
}

static int64_t size_of(kl_tensor *x, const eq_term *t, char ch) { return x->shape[term_pos(t, ch)]; }

static kl_tensor *einsum2(const char *eq, kl_tensor *x, kl_tensor *y, eq_term *a, eq_term *b, const eq_term *o) {
    if (has_repeat(a) || has_repeat(b)) {
        eq_err(eq, "%s", "repeated subscripts within an operand (diagonals) are not supported with two operands");
        return NULL;
    }
    if (x->dtype != y->dtype) {
        char d[64];
        snprintf(d, sizeof d, "%s and %s", ke_dtypes[x->dtype].name, ke_dtypes[y->dtype].name);
        eq_err(eq, "operands must have one dtype, got %s", d);
        return NULL;
    }
    for (int j = 0; j < a->n; j++)
        if (term_has(b, a->s[j]) && size_of(x, a, a->s[j]) != size_of(y, b, a->s[j])) {
            char d[96];
            snprintf(d, sizeof d, "subscript '%c' has size %lld in operand 0 and %lld in operand 1", a->s[j],
                     (long long)size_of(x, a, a->s[j]), (long long)size_of(y, b, a->s[j]));
            eq_err(eq, "%s (no broadcasting)", d);
            return NULL;
        }
    x = sum_unused(x, a, b, o);
    y = sum_unused(y, b, a, o);
    if (!x || !y) return NULL;
    /* batch (both, output), contracted (both, not output), kept (one side, output) */
    char bt[KL_MAX_DIMS], ct[KL_MAX_DIMS], ak[KL_MAX_DIMS], bk[KL_MAX_DIMS], pa[KL_MAX_DIMS], pb[KL_MAX_DIMS],
        res[3 * KL_MAX_DIMS];
    int nb = 0, nc = 0, na = 0, nbk = 0;
    int64_t B = 1, M = 1, K = 1, N = 1, rs[3 * KL_MAX_DIMS];
    for (int j = 0; j < a->n; j++) {
        char ch = a->s[j];
        int64_t s = x->shape[j];
        if (term_has(b, ch) && term_has(o, ch)) bt[nb++] = ch, B *= s;
        else if (term_has(b, ch)) ct[nc++] = ch, K *= s;
        else ak[na++] = ch, M *= s;
    }
    for (int j = 0; j < b->n; j++)
        if (!term_has(a, b->s[j])) bk[nbk++] = b->s[j], N *= y->shape[j];
    int n = 0, nr = 0;
    for (int j = 0; j < nb; j++) pa[n++] = bt[j];
    for (int j = 0; j < na; j++) pa[n++] = ak[j];
    for (int j = 0; j < nc; j++) pa[n++] = ct[j];
    n = 0;
    for (int j = 0; j < nb; j++) pb[n++] = bt[j];
    for (int j = 0; j < nc; j++) pb[n++] = ct[j];
    for (int j = 0; j < nbk; j++) pb[n++] = bk[j];
    for (int j = 0; j < nb; j++) res[nr] = bt[j], rs[nr++] = size_of(x, a, bt[j]);
    for (int j = 0; j < na; j++) res[nr] = ak[j], rs[nr++] = size_of(x, a, ak[j]);
    for (int j = 0; j < nbk; j++) res[nr] = bk[j], rs[nr++] = size_of(y, b, bk[j]);
    kl_tensor *x3 = kl_reshape(permute_to(x, a, pa, a->n), 3, (const int64_t[]){B, M, K});
    kl_tensor *y3 = kl_reshape(permute_to(y, b, pb, b->n), 3, (const int64_t[]){B, K, N});
    kl_tensor *r = kl_reshape(kl_bmm(x3, y3), nr, rs);
    if (!r) return NULL;
    eq_term rt = {{0}, nr};
    memcpy(rt.s, res, (size_t)nr);
    kl_tensor *out = permute_to(r, &rt, o->s, o->n);
    return out == r ? out : kl_contiguous(out);
}

int ke_decomp_einsum(ke_call *c) {
    char eq[EQ_MAX + 1];
    eq_unpack(c, eq);
    eq_term t[2], o;
    if (eq_parse(eq, c->nin, t, &o)) return -1;
    for (int i = 0; i < c->nin; i++)
        if (t[i].n != c->in[i]->ndim) {
            char d[96];
            snprintf(d, sizeof d, "operand %d has %d dims but %d subscripts", i, c->in[i]->ndim, t[i].n);
            return eq_err(eq, "%s", d);
        }
    kl_scope_begin();
    kl_tensor *y = c->nin == 1 ? einsum1(eq, c->in[0], &t[0], &o) : einsum2(eq, c->in[0], c->in[1], &t[0], &t[1], &o);
    kl_keep(y);
    kl_scope_end();
    return ke_set_out1(c, y);
}

/* ---- public wrappers -------------------------------------------------------------------------- */

kl_tensor *kl_outer(kl_tensor *a, kl_tensor *b) {
    kl_tensor *in[2] = {a, b};
    ke_call c = {.op = KE_OP_outer, .nin = 2, .in = in};
    return ke_call1(&c);
}

kl_tensor *kl_baddbmm(kl_tensor *self, kl_tensor *batch1, kl_tensor *batch2, double beta, double alpha) {
    kl_tensor *in[3] = {self, batch1, batch2};
    ke_call c = {.op = KE_OP_baddbmm, .nin = 3, .in = in};
    ke_attr_set_baddbmm_beta(&c.a, beta);
    ke_attr_set_baddbmm_alpha(&c.a, alpha);
    return ke_call1(&c);
}

kl_tensor *kl_einsum(const char *equation, int n, kl_tensor *const *operands) {
    if (!equation) {
        ke_err(KL_ERR_NULL_ARG, "einsum", "equation is NULL");
        return NULL;
    }
    size_t len = strlen(equation);
    if (len > EQ_MAX) {
        ke_err(KL_ERR_ARG, "einsum", "equation \"%.40s...\" is longer than %d characters", equation, EQ_MAX);
        return NULL;
    }
    if (n < 1 || n > 2 || !operands) {
        eq_err(equation, "%s", "only one- and two-operand equations are supported");
        return NULL;
    }
    int64_t l[KE_MAX_LIST] = {0};
    for (size_t i = 0; i < len; i++) l[i / 8] = (int64_t)((uint64_t)l[i / 8] | (uint64_t)(unsigned char)equation[i] << (8 * (i % 8)));
    ke_call c = {.op = KE_OP_einsum, .nin = n, .in = operands};
    if (ke_set_list(&c, (int)((len + 7) / 8), l)) return NULL;
    return ke_call1(&c);
}
