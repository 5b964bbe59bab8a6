/*
 * train.c — training-loop helpers: gradient clipping (clip_grad_norm_) and
 * learning-rate schedules (closed forms, so a resumed run gets the same rate
 * from its step count alone).
 */
#include "core.h"

#include <math.h>
#include <stdlib.h>

/* torch 1.13: norms = [norm(g, p) for each grad]; total = norm(stack(norms), p)
 * (max for inf); coef = clamp(max_norm / (total + 1e-6), max=1); g *= coef. */
double kl_clip_grad_norm(kl_params *p, double max_norm, double norm_type) {
    static const char *op = "clip_grad_norm";
    if (!p) {
        if (!ke_error_pending()) ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
        return NAN;
    }
    if (!(max_norm >= 0)) return ke_err(KL_ERR_ARG, op, "max_norm must be >= 0, got %g", max_norm), NAN;
    if (!(norm_type > 0)) return ke_err(KL_ERR_ARG, op, "norm_type must be > 0 (or INFINITY), got %g", norm_type), NAN;
    int n = kl_params_count(p), k = 0;
    double total = NAN;
    kl_scope_begin();
    kl_no_grad_begin();
    kl_tensor **norms = n ? malloc(sizeof(kl_tensor *) * (size_t)n) : NULL;
    if (n && !norms) {
        ke_err(KL_ERR_OOM, op, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        kl_tensor *g = kl_grad(kl_params_get(p, i));
        if (!g) continue;
        if (!(norms[k++] = kl_to_dtype(kl_norm(g, norm_type, KL_ALL_DIMS, false), KL_F64))) goto out;
    }
    if (k == 0) {
        total = 0;
        goto out;
    }
    kl_tensor *all = kl_norm(kl_stack(k, norms, 0), norm_type, KL_ALL_DIMS, false);
    if (!all) goto out;
    total = kl_item(all);
    double coef = max_norm / (total + 1e-6);
    if (coef > 1) coef = 1;
    for (int i = 0; i < n; i++) {
        kl_tensor *g = kl_grad(kl_params_get(p, i));
        if (g && !kl_mul_scalar_inplace(g, coef)) {
            total = NAN;
            goto out;
        }
    }
out:
    free(norms);
    kl_no_grad_end();
    kl_scope_end();
    return total;
}

double kl_lr_cosine_warmup(int64_t step, double base_lr, int64_t warmup, int64_t total, double min_lr) {
    if (step < 0 || warmup < 0 || total < warmup) {
        ke_err(KL_ERR_ARG, "lr_cosine_warmup", "needs 0 <= step, 0 <= warmup <= total (step %lld, warmup %lld, total %lld)",
               (long long)step, (long long)warmup, (long long)total);
        return NAN;
    }
    if (step < warmup) return base_lr * (double)(step + 1) / (double)warmup;
    if (step >= total) return min_lr;
    return min_lr + (base_lr - min_lr) * (1 + cos(3.14159265358979323846 * (double)(step - warmup) / (double)(total - warmup))) / 2;
}

double kl_lr_step(int64_t step, double base_lr, int64_t step_size, double gamma) {
    if (step < 0 || step_size < 1) {
        ke_err(KL_ERR_ARG, "lr_step", "needs step >= 0 and step_size >= 1 (step %lld, step_size %lld)", (long long)step,
               (long long)step_size);
        return NAN;
    }
    return base_lr * pow(gamma, (double)(step / step_size));
}
