/*
 * gradcheck.c — kl_gradcheck and kl_gradgradcheck: the analytic Jacobian
 * (one backward per output element, as PyTorch's slow mode) against central
 * finite differences in float64, with PyTorch's default tolerances.
 *
 * Perturbations are written straight into the inputs' memory, element by
 * element at their strided positions: non-contiguous inputs are checked as
 * they are, and the version counter is not bumped (nothing was really
 * modified once the value is restored).
 */
#include "autograd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

kl_gradcheck_options kl_gradcheck_options_default(void) {
    return (kl_gradcheck_options){.eps = 1e-6, .atol = 1e-5, .rtol = 1e-3, .quiet = false};
}

/* Pointer to logical element e of a CPU f64 tensor. */
static double *elem_ptr(kl_tensor *t, int64_t e) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (e % t->shape[d]) * t->stride[d];
        e /= t->shape[d];
    }
    return (double *)ke_data(t) + off;
}

/* Output values as doubles into v[m]. */
static int read_output(kl_tensor *out, double *v, int64_t m) {
    kl_tensor *c = kl_contiguous(out);
    if (!c) return -1;
    const char *p = ke_data(c);
    for (int64_t k = 0; k < m; k++) v[k] = ke_load_f64(p, (kl_dtype)c->dtype, k);
    return 0;
}

static int check_output(kl_tensor *out) {
    if (!out) {
        if (!ke_error_pending()) ke_err(KL_ERR_NULL_ARG, "gradcheck", "fn returned NULL without an error");
        return -1;
    }
    if (ke_check_tensor(out, "gradcheck", 0)) return -1;
    char b[256];
    if (!ke_is_float((kl_dtype)out->dtype) || out->storage->device.type != KL_CPU)
        return ke_err(KL_ERR_DTYPE, "gradcheck", "fn must return a floating CPU tensor, got %s",
                      ke_fmt_tensor(b, sizeof b, out));
    return 0;
}

static int check_inputs(int n, kl_tensor *const *in, int *nreq) {
    char b[256];
    *nreq = 0;
    for (int i = 0; i < n; i++) {
        if (ke_check_tensor(in[i], "gradcheck", i + 1)) return -1;
        if (!ag_requires(in[i])) continue;
        kl_tensor *t = in[i];
        if (t->dtype != KL_F64 || t->storage->device.type != KL_CPU)
            return ke_err(KL_ERR_DTYPE, "gradcheck",
                          "input %d is %s: inputs that require grad must be float64 CPU tensors, or finite "
                          "differences are too coarse",
                          i + 1, ke_fmt_tensor(b, sizeof b, t));
        for (int d = 0; d < t->ndim; d++)
            if (t->stride[d] == 0 && t->shape[d] > 1)
                return ke_err(KL_ERR_ARG, "gradcheck",
                              "input %d (%s) overlaps itself (stride 0): perturbing one element would move "
                              "several",
                              i + 1, ke_fmt_tensor(b, sizeof b, t));
        (*nreq)++;
    }
    return 0;
}

/* Numerical Jacobian of output (m elements) w.r.t. input t into J[e * m + k]. */
static int numerical(kl_grad_fn fn, void *user, int n, kl_tensor *const *in, kl_tensor *t, int64_t m, double eps,
                     double *J, double *plus, double *minus) {
    int64_t nt = ke_numel(t->ndim, t->shape);
    for (int64_t e = 0; e < nt; e++) {
        double *p = elem_ptr(t, e), orig = *p;
        int rc = 0;
        for (int side = 0; side < 2 && !rc; side++) {
            *p = side == 0 ? orig + eps : orig - eps;
            kl_scope_begin();
            kl_tensor *out = fn(user, n, in);
            rc = check_output(out);
            if (!rc && ke_numel(out->ndim, out->shape) != m)
                rc = ke_err(KL_ERR_SHAPE, "gradcheck", "fn's output changed size under perturbation");
            if (!rc) rc = read_output(out, side == 0 ? plus : minus, m);
            kl_scope_end();
        }
        *p = orig;
        if (rc) return -1;
        for (int64_t k = 0; k < m; k++) J[e * m + k] = (plus[k] - minus[k]) / (2 * eps);
    }
    return 0;
}

int kl_gradcheck(kl_grad_fn fn, void *user, int n, kl_tensor *const *inputs, const kl_gradcheck_options *opts) {
    kl_gradcheck_options o = opts ? *opts : kl_gradcheck_options_default();
    if (!fn) return ke_err(KL_ERR_NULL_ARG, "gradcheck", "fn is NULL");
    if (n < 1 || !inputs) return ke_err(KL_ERR_ARG, "gradcheck", "no inputs");
    int nreq = 0;
    if (check_inputs(n, inputs, &nreq)) return -1;
    if (nreq == 0) return ke_err(KL_ERR_ARG, "gradcheck", "no input requires grad");
    kl_tensor **req = calloc((size_t)nreq, sizeof *req);
    int *req_idx = calloc((size_t)nreq, sizeof *req_idx);
    kl_tensor **grads = calloc((size_t)nreq, sizeof *grads);
    double *num = NULL, *ana = NULL, *plus = NULL, *minus = NULL;
    int result = -1;
    if (!req || !req_idx || !grads) {
        ke_err(KL_ERR_OOM, "gradcheck", "out of memory");
        goto done;
    }
    for (int i = 0, j = 0; i < n; i++)
        if (ag_requires(inputs[i])) {
            req_idx[j] = i;
            req[j++] = inputs[i];
        }
    kl_scope_begin();
    kl_enable_grad_begin();
    kl_tensor *out = fn(user, n, inputs);
    kl_enable_grad_end();
    if (check_output(out)) goto scope_done;
    int64_t m = ke_numel(out->ndim, out->shape);
    int64_t total = 0;
    for (int j = 0; j < nreq; j++) total += ke_numel(req[j]->ndim, req[j]->shape);
    num = calloc((size_t)(total * m + 1), sizeof *num);
    ana = calloc((size_t)(total * m + 1), sizeof *ana);
    plus = calloc((size_t)m + 1, sizeof *plus);
    minus = calloc((size_t)m + 1, sizeof *minus);
    if (!num || !ana || !plus || !minus) {
        ke_err(KL_ERR_OOM, "gradcheck", "out of memory for a %lld x %lld Jacobian", (long long)total, (long long)m);
        goto scope_done;
    }
    /* Analytic: one backward per output element (one-hot grad_output). */
    if (ag_requires(out)) {
        kl_backward_options bo = {.retain_graph = true, .allow_unused = true};
        for (int64_t k = 0; k < m; k++) {
            kl_scope_begin();
            kl_tensor *go = kl_zeros_like(out);
            int rc = go ? 0 : -1;
            if (!rc) {
                ke_store_f64(ke_data(go), (kl_dtype)go->dtype, k, 1.0);
                rc = kl_autograd_grad(1, &out, &go, nreq, req, grads, &bo);
            }
            for (int j = 0, base = 0; !rc && j < nreq; j++) {
                int64_t nj = ke_numel(req[j]->ndim, req[j]->shape);
                if (grads[j]) {
                    kl_tensor *c = kl_contiguous(grads[j]);
                    if (!c) {
                        rc = -1;
                        break;
                    }
                    const char *p = ke_data(c);
                    for (int64_t e = 0; e < nj; e++) ana[(base + e) * m + k] = ke_load_f64(p, (kl_dtype)c->dtype, e);
                }
                base += (int)nj;
            }
            kl_scope_end();
            if (rc) goto scope_done;
        }
    }
    /* Numerical, with grad mode off (fn's own graph is not needed). */
    kl_no_grad_begin();
    int64_t base = 0;
    int rc = 0;
    for (int j = 0; j < nreq && !rc; j++) {
        rc = numerical(fn, user, n, inputs, req[j], m, o.eps, num + base * m, plus, minus);
        base += ke_numel(req[j]->ndim, req[j]->shape);
    }
    kl_no_grad_end();
    if (rc) goto scope_done;
    result = 1;
    base = 0;
    for (int j = 0; j < nreq && result == 1; j++) {
        int64_t nj = ke_numel(req[j]->ndim, req[j]->shape);
        for (int64_t e = 0; e < nj && result == 1; e++)
            for (int64_t k = 0; k < m; k++) {
                double a = ana[(base + e) * m + k], nu = num[(base + e) * m + k];
                if (fabs(a - nu) <= o.atol + o.rtol * fabs(nu)) continue;
                ke_err(KL_ERR_ARG, "gradcheck",
                       "Jacobian mismatch for input %d, element %lld -> output element %lld: numerical %.10g, "
                       "analytical %.10g (atol %g, rtol %g)",
                       req_idx[j] + 1, (long long)e, (long long)k, nu, a, o.atol, o.rtol);
                if (!o.quiet) fprintf(stderr, "kl_gradcheck: %s\n", kl_last_error());
                result = 0;
                break;
            }
        base += nj;
    }
scope_done:
    kl_scope_end();
done:
    free(req);
    free(req_idx);
    free(grads);
    free(num);
    free(ana);
    free(plus);
    free(minus);
    return result;
}

/* ---- second order ------------------------------------------------------------------- */

typedef struct gg_user {
    kl_grad_fn fn;
    void *user;
} gg_user;

/* The first-order gradients of fn (with grad_output v = the last input),
 * flattened and concatenated: gradcheck of this is gradgradcheck. */
static kl_tensor *gg_fn(void *u, int n1, kl_tensor *const *in) {
    gg_user *g = u;
    int n = n1 - 1;
    kl_tensor *v = in[n], *r = NULL;
    kl_tensor **req = calloc(3 * (size_t)n + 1, sizeof *req);
    if (!req) return ke_err(KL_ERR_OOM, "gradgradcheck", "out of memory"), NULL;
    kl_tensor **grads = req + n, **flat = grads + n;
    int nreq = 0;
    for (int i = 0; i < n; i++)
        if (ag_requires(in[i])) req[nreq++] = in[i];
    kl_enable_grad_begin();
    kl_tensor *out = g->fn(g->user, n, in);
    kl_backward_options bo = {.create_graph = true, .allow_unused = true};
    if (out && kl_autograd_grad(1, &out, &v, nreq, req, grads, &bo) == 0) {
        int ok = 1;
        for (int j = 0; j < nreq && ok; j++) {
            int64_t all = -1;
            flat[j] = grads[j] ? kl_reshape(grads[j], 1, &all) : kl_zeros(1, (int64_t[]){kl_numel(req[j])}, KL_F64);
            ok = flat[j] != NULL;
        }
        if (ok) r = kl_cat(nreq, flat, 0);
    }
    kl_enable_grad_end();
    free(req);
    return r;
}

int kl_gradgradcheck(kl_grad_fn fn, void *user, int n, kl_tensor *const *inputs, const kl_gradcheck_options *opts) {
    if (!fn) return ke_err(KL_ERR_NULL_ARG, "gradgradcheck", "fn is NULL");
    if (n < 1 || !inputs) return ke_err(KL_ERR_ARG, "gradgradcheck", "no inputs");
    int nreq = 0;
    if (check_inputs(n, inputs, &nreq)) return -1;
    kl_scope_begin();
    int result = -1;
    kl_tensor *out = fn(user, n, inputs);
    kl_tensor **in1 = calloc((size_t)n + 1, sizeof *in1);
    if (!in1) {
        ke_err(KL_ERR_OOM, "gradgradcheck", "out of memory");
    } else if (!check_output(out)) {
        /* grad_output: a fixed random f64 leaf of the output's shape. */
        kl_tensor *v = kl_randn(out->ndim, out->shape, KL_F64);
        if (v && kl_set_requires_grad(v, true) == 0) {
            for (int i = 0; i < n; i++) in1[i] = inputs[i];
            in1[n] = v;
            gg_user g = {fn, user};
            result = kl_gradcheck(gg_fn, &g, n + 1, in1, opts);
        }
    }
    free(in1);
    kl_scope_end();
    return result;
}
