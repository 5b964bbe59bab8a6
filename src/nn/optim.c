/*
 * optim.c — SGD, Adam and AdamW with torch.optim 1.13's single-tensor
 * updates (the same operations in the same order, so results agree to the
 * rounding of fused multiply-adds).
 *
 * A step is written only with kl_ ops (out-of-place temporaries in a scope,
 * then in-place writes into the parameter and its state) under no-grad, so a
 * later layer can trace one step and compile it into one kernel. Scalars that
 * depend on the step count (bias corrections) are computed in C, as PyTorch
 * does without `capturable`.
 */
#include "core.h"
#include "profiler.h"
#include "threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_NUM_KINDS };
enum { OPT_MAX_STATE = 3 };

/* One parameter and its lazily created state. */
typedef struct opt_slot {
    kl_tensor *param;                   /* internal reference */
    kl_tensor *state[OPT_MAX_STATE];    /* internal references, NULL until the first step */
    int64_t step;                       /* updates applied to this parameter */
} opt_slot;

struct kl_optim {
    int kind;
    kl_sgd_options sgd;
    kl_adam_options adam;
    int n;
    opt_slot *slots;
    int64_t steps;
};

/* ---- options ----------------------------------------------------------------- */

kl_sgd_options kl_sgd_options_default(void) {
    return (kl_sgd_options){.lr = 0.01};
}

kl_adam_options kl_adam_options_default(void) {
    return (kl_adam_options){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

kl_adam_options kl_adamw_options_default(void) {
    kl_adam_options o = kl_adam_options_default();
    o.weight_decay = 1e-2;
    return o;
}

/* torch.optim's constructor checks, with its messages. */
static int check_sgd(const kl_sgd_options *o) {
    if (!(o->lr >= 0)) return ke_err(KL_ERR_ARG, "optim_sgd", "invalid learning rate: %g", o->lr);
    if (!(o->momentum >= 0)) return ke_err(KL_ERR_ARG, "optim_sgd", "invalid momentum value: %g", o->momentum);
    if (!(o->weight_decay >= 0))
        return ke_err(KL_ERR_ARG, "optim_sgd", "invalid weight_decay value: %g", o->weight_decay);
    if (isnan(o->dampening)) return ke_err(KL_ERR_ARG, "optim_sgd", "invalid dampening value: nan");
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return ke_err(KL_ERR_ARG, "optim_sgd", "nesterov momentum requires a momentum and zero dampening "
                      "(momentum %g, dampening %g)", o->momentum, o->dampening);
    return 0;
}

static int check_adam(const kl_adam_options *o, const char *op) {
    if (!(o->lr >= 0)) return ke_err(KL_ERR_ARG, op, "invalid learning rate: %g", o->lr);
    if (!(o->eps >= 0)) return ke_err(KL_ERR_ARG, op, "invalid epsilon value: %g", o->eps);
    if (!(o->beta1 >= 0 && o->beta1 < 1))
        return ke_err(KL_ERR_ARG, op, "invalid beta parameter at index 0: %g", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1))
        return ke_err(KL_ERR_ARG, op, "invalid beta parameter at index 1: %g", o->beta2);
    if (!(o->weight_decay >= 0)) return ke_err(KL_ERR_ARG, op, "invalid weight_decay value: %g", o->weight_decay);
    return 0;
}

/* ---- updates ----------------------------------------------------------------- */

/* A new state tensor owned by the slot (kept past the step's scope). */
static kl_tensor *slot_state(opt_slot *s, int i, kl_tensor *t) {
    if (!t) return NULL;
    ke_tensor_incref(t);
    s->state[i] = t;
    return t;
}

/* _single_tensor_sgd. state[0]: momentum_buffer. */
static int sgd_update(const kl_optim *o, opt_slot *s, kl_tensor *grad) {
    const kl_sgd_options *op = &o->sgd;
    kl_tensor *p = s->param;
    kl_tensor *d = op->maximize ? kl_neg(grad) : grad;
    if (op->weight_decay != 0) d = kl_add(d, kl_mul_scalar(p, op->weight_decay));
    if (op->momentum != 0) {
        kl_tensor *buf = s->state[0];
        if (!buf) {
            buf = slot_state(s, 0, kl_clone(d));
        } else {
            kl_mul_scalar_inplace(buf, op->momentum);
            kl_add_inplace(buf, kl_mul_scalar(d, 1 - op->dampening));
        }
        d = op->nesterov ? kl_add(d, kl_mul_scalar(buf, op->momentum)) : buf;
    }
    return kl_add_inplace(p, kl_mul_scalar(d, -op->lr)) ? 0 : -1;
}

/* ---- Adam/AdamW in one pass on the CPU ---------------------------------------------- */

/* adam_update's kl_ ops, element by element in the same order and precision:
 * each op rounds to the tensor's dtype and a C scalar is converted to that
 * dtype first (as a wrapped scalar is), and the build contracts no
 * multiply-add (-ffp-contract=off), so the results are bit-identical to the
 * composed step (tests/test_optim.c compares them). One pass over p, g, m, v
 * instead of about twelve dispatched ops and five temporaries per parameter:
 * on small models (the digits MLP) the dispatches were most of the
 * optimizer's time. */
typedef struct adam_pass {
    void *p, *m, *v;
    const void *g;
    double decay, wd, c1, b1, b2, c2, bc2_sqrt, eps, neg_step;
    bool adamw, maximize;
} adam_pass;

#define ADAM_PASS(T, SQRT)                                                                  \
    static void adam_range_##T(void *ctx, int64_t begin, int64_t end) {                     \
        const adam_pass *a = ctx;                                                            \
        T *p = a->p, *m = a->m, *v = a->v;                                                   \
        const T *g = a->g;                                                                   \
        const T decay = (T)a->decay, wd = (T)a->wd, b1 = (T)a->b1, c1 = (T)a->c1;             \
        const T b2 = (T)a->b2, c2 = (T)a->c2, bc2_sqrt = (T)a->bc2_sqrt, eps = (T)a->eps;     \
        const T neg_step = (T)a->neg_step;                                                   \
        for (int64_t i = begin; i < end; i++) {                                              \
            T gi = a->maximize ? -g[i] : g[i], pi = p[i];                                    \
            if (a->adamw) {                                                                  \
                if (a->wd != 0) pi = pi * decay;                                             \
            } else if (a->wd != 0) {                                                         \
                gi = gi + pi * wd;                                                           \
            }                                                                                \
            T mi = m[i] * b1;                                                                \
            mi = mi + gi * c1;                                                               \
            T vi = v[i] * b2;                                                                \
            vi = vi + (gi * c2) * gi;                                                        \
            T d = SQRT(vi) / bc2_sqrt;                                                       \
            d = d + eps;                                                                     \
            p[i] = pi + (mi * neg_step) / d;                                                 \
            m[i] = mi, v[i] = vi;                                                            \
        }                                                                                    \
    }
ADAM_PASS(float, sqrtf)
ADAM_PASS(double, sqrt)

/* The one-pass form applies: p, its gradient and both moments are CPU
 * tensors of one float dtype, contiguous and of one shape, nothing is being
 * traced (a traced step must record its ops) and amsgrad is off. */
static bool adam_fusable(const kl_adam_options *op, kl_tensor *p, kl_tensor *g, kl_tensor *m, kl_tensor *v) {
    if (op->amsgrad || ((ke_tls_state.include & ~ke_tls_state.exclude) & KE_KS(KE_KEY_TRACE))) return false;
    kl_dtype dt = kl_dtype_of(p);
    if (dt != KL_F32 && dt != KL_F64) return false;
    kl_tensor *t[4] = {p, g, m, v};
    for (int i = 0; i < 4; i++) {
        if (kl_dtype_of(t[i]) != dt || kl_device_of(t[i]).type != KL_CPU || !kl_is_contiguous(t[i]) ||
            kl_ndim(t[i]) != kl_ndim(p) || memcmp(kl_shape(t[i]), kl_shape(p), (size_t)kl_ndim(p) * sizeof(int64_t)))
            return false;
    }
    return true;
}

static int adam_one_pass(const kl_adam_options *op, bool adamw, double step_size, double bc2_sqrt, kl_tensor *p,
                         kl_tensor *g, kl_tensor *m, kl_tensor *v) {
    int64_t t0 = ke_prof_active() ? ke_prof_now() : 0;
    adam_pass a = {
        .p = kl_data_ptr(p), .m = kl_data_ptr(m), .v = kl_data_ptr(v), .g = kl_data_ptr(g),
        .decay = 1 - op->lr * op->weight_decay, .wd = op->weight_decay, .b1 = op->beta1, .c1 = 1 - op->beta1,
        .b2 = op->beta2, .c2 = 1 - op->beta2, .bc2_sqrt = bc2_sqrt, .eps = op->eps, .neg_step = -step_size,
        .adamw = adamw, .maximize = op->maximize,
    };
    if (!a.p || !a.m || !a.v || !a.g) return -1;
    ke_parallel_for(kl_numel(p), 1 << 14, kl_dtype_of(p) == KL_F32 ? adam_range_float : adam_range_double, &a);
    ke_bump_version(p), ke_bump_version(m), ke_bump_version(v);
    if (t0) ke_prof_complete(KE_PROF_OP, adamw ? "optim_adamw (one pass)" : "optim_adam (one pass)", t0,
                             ke_prof_now(), 0, NULL);
    return 0;
}

/* _single_tensor_adam / _single_tensor_adamw. state: exp_avg, exp_avg_sq,
 * max_exp_avg_sq (amsgrad). */
static int adam_update(const kl_optim *o, opt_slot *s, kl_tensor *grad) {
    const kl_adam_options *op = &o->adam;
    kl_tensor *p = s->param;
    if (!s->state[0]) {
        slot_state(s, 0, kl_zeros_like(p));
        slot_state(s, 1, kl_zeros_like(p));
        if (op->amsgrad) slot_state(s, 2, kl_zeros_like(p));
        if (!s->state[0] || !s->state[1] || (op->amsgrad && !s->state[2])) return -1;
    }
    kl_tensor *m = s->state[0], *v = s->state[1];
    s->step++;
    if (adam_fusable(op, p, grad, m, v)) {
        double step = (double)s->step;
        return adam_one_pass(op, o->kind == OPT_ADAMW, op->lr / (1 - pow(op->beta1, step)),
                             sqrt(1 - pow(op->beta2, step)), p, grad, m, v);
    }
    kl_tensor *g = op->maximize ? kl_neg(grad) : grad;
    if (!g) return -1;
    if (o->kind == OPT_ADAMW) {
        if (op->weight_decay != 0) kl_mul_scalar_inplace(p, 1 - op->lr * op->weight_decay);
    } else if (op->weight_decay != 0) {
        g = kl_add(g, kl_mul_scalar(p, op->weight_decay));
    }
    /* exp_avg.mul_(beta1).add_(grad, alpha=1-beta1) */
    kl_mul_scalar_inplace(m, op->beta1);
    kl_add_inplace(m, kl_mul_scalar(g, 1 - op->beta1));
    /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2): value*g first, as ATen */
    kl_mul_scalar_inplace(v, op->beta2);
    kl_add_inplace(v, kl_mul(kl_mul_scalar(g, 1 - op->beta2), g));

    double step = (double)s->step;
    double bias_correction1 = 1 - pow(op->beta1, step);
    double bias_correction2 = 1 - pow(op->beta2, step);
    double step_size = op->lr / bias_correction1;
    double bias_correction2_sqrt = sqrt(bias_correction2);
    kl_tensor *second = v;
    if (op->amsgrad) second = kl_maximum_inplace(s->state[2], v);
    /* denom = (second.sqrt() / bias_correction2_sqrt).add_(eps) */
    kl_tensor *denom = kl_sqrt(second);
    kl_div_scalar_inplace(denom, bias_correction2_sqrt);
    kl_add_scalar_inplace(denom, op->eps);
    /* param.addcdiv_(exp_avg, denom, value=-step_size) */
    return kl_add_inplace(p, kl_div(kl_mul_scalar(m, -step_size), denom)) ? 0 : -1;
}

typedef struct opt_kind_info {
    const char *name;    /* for messages: "optim_sgd" -> kl_optim_sgd */
    int (*update)(const kl_optim *o, opt_slot *s, kl_tensor *grad);
} opt_kind_info;

static const opt_kind_info opt_kinds[] = {
    [OPT_SGD]   = {"optim_sgd",   sgd_update},
    [OPT_ADAM]  = {"optim_adam",  adam_update},
    [OPT_ADAMW] = {"optim_adamw", adam_update},
};
_Static_assert(sizeof opt_kinds / sizeof opt_kinds[0] == OPT_NUM_KINDS, "one row per optimizer kind");

/* ---- lifetime ------------------------------------------------------------------ */

static kl_optim *optim_new(int kind, const kl_params *p) {
    const char *op = opt_kinds[kind].name;
    if (!p) {
        if (!ke_error_pending()) ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
        return NULL;
    }
    int n = kl_params_count(p);
    if (n == 0) {
        ke_err(KL_ERR_ARG, op, "optimizer got an empty parameter list");
        return NULL;
    }
    kl_optim *o = calloc(1, sizeof *o);
    opt_slot *slots = calloc((size_t)n, sizeof *slots);
    if (!o || !slots) {
        free(o);
        free(slots);
        ke_err(KL_ERR_OOM, op, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        slots[i].param = kl_params_get(p, i);
        ke_tensor_incref(slots[i].param);
    }
    o->kind = kind;
    o->n = n;
    o->slots = slots;
    return o;
}

kl_optim *kl_optim_sgd(const kl_params *p, const kl_sgd_options *opts) {
    kl_sgd_options o = opts ? *opts : kl_sgd_options_default();
    if (!p && ke_error_pending()) return NULL;
    if (check_sgd(&o)) return NULL;
    kl_optim *r = optim_new(OPT_SGD, p);
    if (r) r->sgd = o;
    return r;
}

static kl_optim *adam_new(int kind, const kl_params *p, const kl_adam_options *opts) {
    kl_adam_options o = opts ? *opts : kind == OPT_ADAMW ? kl_adamw_options_default() : kl_adam_options_default();
    if (!p && ke_error_pending()) return NULL;
    if (check_adam(&o, opt_kinds[kind].name)) return NULL;
    kl_optim *r = optim_new(kind, p);
    if (r) r->adam = o;
    return r;
}

kl_optim *kl_optim_adam(const kl_params *p, const kl_adam_options *opts) { return adam_new(OPT_ADAM, p, opts); }
kl_optim *kl_optim_adamw(const kl_params *p, const kl_adam_options *opts) { return adam_new(OPT_ADAMW, p, opts); }

void kl_optim_free(kl_optim *o) {
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        for (int k = 0; k < OPT_MAX_STATE; k++)
            if (o->slots[i].state[k]) ke_tensor_decref(o->slots[i].state[k]);
        ke_tensor_decref(o->slots[i].param);
    }
    free(o->slots);
    free(o);
}

static int check_optim(const kl_optim *o, const char *op) {
    if (o) return 0;
    if (ke_error_pending()) return -1;
    return ke_err(KL_ERR_NULL_ARG, op, "the optimizer is NULL");
}

/* ---- steps ------------------------------------------------------------------------ */

int kl_optim_step(kl_optim *o) {
    if (check_optim(o, "optim_step")) return -1;
    if (ke_error_pending()) return -1; /* a failed forward/backward: do not half-update */
    int rc = 0;
    kl_no_grad_begin();
    for (int i = 0; i < o->n && rc == 0; i++) {
        kl_tensor *g = kl_grad(o->slots[i].param);
        if (!g) continue;
        kl_scope_begin();
        if (o->kind == OPT_SGD) o->slots[i].step++;
        rc = opt_kinds[o->kind].update(o, &o->slots[i], g);
        kl_scope_end();
    }
    kl_no_grad_end();
    if (rc == 0) o->steps++;
    return rc;
}

int kl_optim_zero_grad(kl_optim *o) {
    if (check_optim(o, "optim_zero_grad")) return -1;
    for (int i = 0; i < o->n; i++)
        if (kl_zero_grad(o->slots[i].param)) return -1;
    return 0;
}

int kl_optim_set_lr(kl_optim *o, double lr) {
    if (check_optim(o, "optim_set_lr")) return -1;
    if (!(lr >= 0)) return ke_err(KL_ERR_ARG, "optim_set_lr", "invalid learning rate: %g", lr);
    if (o->kind == OPT_SGD) o->sgd.lr = lr;
    else o->adam.lr = lr;
    return 0;
}

double kl_optim_get_lr(const kl_optim *o) {
    if (check_optim(o, "optim_get_lr")) return NAN;
    return o->kind == OPT_SGD ? o->sgd.lr : o->adam.lr;
}

int64_t kl_optim_steps(const kl_optim *o) { return o ? o->steps : -1; }

/* ---- state files -------------------------------------------------------------------- */

static const char *const opt_kind_names[] = {[OPT_SGD] = "sgd", [OPT_ADAM] = "adam", [OPT_ADAMW] = "adamw"};
static const char *const opt_state_names[OPT_NUM_KINDS][OPT_MAX_STATE] = {
    [OPT_SGD] = {"momentum_buffer"},
    [OPT_ADAM] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    [OPT_ADAMW] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
};

/* Name of o's slot i in p (the optimizer holds p's tensors in p's order). */
static const char *slot_name(const kl_optim *o, const kl_params *p, int i, const char *op) {
    if (i >= kl_params_count(p) || kl_params_get(p, i) != o->slots[i].param) {
        ke_err(KL_ERR_ARG, op, "parameter %d of the optimizer is not parameter %d of the collection", i, i);
        return NULL;
    }
    return kl_params_name(p, i);
}

int kl_optim_save_safetensors(const kl_optim *o, const kl_params *p, const char *path) {
    static const char *op = "optim_save_safetensors";
    if (check_optim(o, op)) return -1;
    if (!p) return ke_error_pending() ? -1 : ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
    int cap = o->n * (OPT_MAX_STATE + 1), n = 0, rc = -1;
    char **names = calloc((size_t)cap, sizeof *names);
    kl_tensor **ts = calloc((size_t)cap, sizeof *ts);
    kl_scope_begin();
    if (!names || !ts) {
        ke_err(KL_ERR_OOM, op, "out of memory");
        goto out;
    }
    for (int i = 0; i < o->n; i++) {
        const char *pn = slot_name(o, p, i, op);
        if (!pn) goto out;
        for (int k = -1; k < OPT_MAX_STATE; k++) {
            kl_tensor *t = k < 0 ? kl_scalar_tensor((double)o->slots[i].step, KL_I64) : o->slots[i].state[k];
            if (!t) continue;
            const char *sn = k < 0 ? "step" : opt_state_names[o->kind][k];
            size_t len = strlen(pn) + strlen(sn) + 2;
            if (!(names[n] = malloc(len))) {
                ke_err(KL_ERR_OOM, op, "out of memory");
                goto out;
            }
            snprintf(names[n], len, "%s.%s", pn, sn);
            ts[n++] = t;
        }
    }
    char steps[32], lr[40];
    snprintf(steps, sizeof steps, "%lld", (long long)o->steps);
    snprintf(lr, sizeof lr, "%.17g", kl_optim_get_lr(o));
    const char *meta[] = {"kiln.optim", opt_kind_names[o->kind], "steps", steps, "lr", lr, NULL};
    rc = kl_save_safetensors(path, n, (const char *const *)names, ts, meta);
out:
    kl_scope_end();
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(ts);
    return rc;
}

/* The file's tensor called "<pn>.<sn>" (NULL if absent), checked against
 * want's shape and dtype when want is given. */
static kl_tensor *state_in_file(const kl_safetensors *f, const char *pn, const char *sn, const kl_tensor *want,
                                const char *path, int *rc) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", pn, sn);
    kl_tensor *t = kl_safetensors_find(f, name);
    if (!t || !want || *rc) return t;
    char a[256], b[256];
    if (t->ndim != want->ndim || memcmp(t->shape, want->shape, sizeof(int64_t) * (size_t)t->ndim))
        *rc = ke_err(KL_ERR_SHAPE, "optim_load_safetensors", "%s: '%s' is %s but the parameter is %s", path, name,
                     ke_fmt_tensor(a, sizeof a, t), ke_fmt_tensor(b, sizeof b, want));
    else if (t->dtype != want->dtype)
        *rc = ke_err(KL_ERR_DTYPE, "optim_load_safetensors", "%s: '%s' is %s but the parameter is %s", path, name,
                     ke_fmt_tensor(a, sizeof a, t), ke_fmt_tensor(b, sizeof b, want));
    return t;
}

int kl_optim_load_safetensors(kl_optim *o, const kl_params *p, const char *path) {
    static const char *op = "optim_load_safetensors";
    if (check_optim(o, op)) return -1;
    if (!p) return ke_error_pending() ? -1 : ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
    kl_safetensors *f = kl_load_safetensors(path);
    if (!f) return -1;
    int rc = 0;
    const char *kind = kl_safetensors_metadata(f, "kiln.optim"), *steps = kl_safetensors_metadata(f, "steps");
    const char *lr = kl_safetensors_metadata(f, "lr");
    if (!kind || !steps || !lr)
        rc = ke_err(KL_ERR_FORMAT, op, "%s: no optimizer metadata (kiln.optim, steps, lr)", path);
    else if (strcmp(kind, opt_kind_names[o->kind]))
        rc = ke_err(KL_ERR_ARG, op, "%s holds %s state, but the optimizer is %s", path, kind, opt_kind_names[o->kind]);
    /* Check everything before writing anything. */
    for (int i = 0; i < o->n && rc == 0; i++) {
        const char *pn = slot_name(o, p, i, op);
        if (!pn) {
            rc = -1;
            break;
        }
        kl_tensor *st = state_in_file(f, pn, "step", NULL, path, &rc);
        if (!st || st->ndim != 0 || st->dtype != KL_I64) {
            rc = ke_err(KL_ERR_ARG, op, "%s: no int64 '%s.step'", path, pn);
            break;
        }
        for (int k = 0; k < OPT_MAX_STATE && opt_state_names[o->kind][k]; k++)
            state_in_file(f, pn, opt_state_names[o->kind][k], o->slots[i].param, path, &rc);
    }
    if (rc == 0) {
        kl_no_grad_begin();
        kl_scope_begin();
        for (int i = 0; i < o->n && rc == 0; i++) {
            opt_slot *s = &o->slots[i];
            const char *pn = kl_params_name(p, i);
            s->step = (int64_t)kl_item(state_in_file(f, pn, "step", NULL, path, &rc));
            for (int k = 0; k < OPT_MAX_STATE && opt_state_names[o->kind][k] && rc == 0; k++) {
                kl_tensor *t = state_in_file(f, pn, opt_state_names[o->kind][k], NULL, path, &rc);
                if (s->state[k]) { /* the file decides: state it lacks is dropped */
                    ke_tensor_decref(s->state[k]);
                    s->state[k] = NULL;
                }
                if (!t) continue;
                if (!slot_state(s, k, kl_to_device(kl_clone(t), kl_device_of(s->param)))) rc = -1;
            }
        }
        kl_scope_end();
        kl_no_grad_end();
        if (rc == 0) {
            o->steps = strtoll(steps, NULL, 10);
            kl_optim_set_lr(o, strtod(lr, NULL));
        }
    }
    kl_safetensors_free(f);
    return rc ? -1 : 0;
}
