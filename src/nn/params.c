/*
 * params.c — kl_params, an ordered collection of named parameters (what
 * PyTorch's named_parameters() yields), and nn.Linear's default parameters.
 * The collection holds an internal reference to each tensor, independent of
 * scopes and of the user's kl_retain / kl_release counts; optimizers and
 * safetensors loading read it through the public accessors.
 */
#include "core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct kl_params {
    int n, cap;
    char **names;
    kl_tensor **ts;
};

kl_params *kl_params_new(void) {
    kl_params *p = calloc(1, sizeof *p);
    if (!p) ke_err(KL_ERR_OOM, "params_new", "out of memory");
    return p;
}

void kl_params_free(kl_params *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        free(p->names[i]);
        ke_tensor_decref(p->ts[i]);
    }
    free(p->names);
    free(p->ts);
    free(p);
}

int kl_params_index(const kl_params *p, const char *name) {
    if (!p || !name) return -1;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->names[i], name)) return i;
    return -1;
}

static int check_params(const kl_params *p, const char *op) {
    if (p) return 0;
    if (ke_error_pending()) return -1;
    return ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
}

int kl_params_add(kl_params *p, const char *name, kl_tensor *t) {
    static const char *op = "params_add";
    if (check_params(p, op)) return -1;
    if (!name || !*name) return ke_err(KL_ERR_ARG, op, "a parameter needs a non-empty name");
    if (ke_check_tensor(t, op, 3)) return -1;
    char buf[256];
    if (!ke_is_float((kl_dtype)t->dtype))
        return ke_err(KL_ERR_DTYPE, op, "parameter '%s' must be floating, got %s", name,
                      ke_fmt_tensor(buf, sizeof buf, t));
    if (!kl_is_leaf(t))
        return ke_err(KL_ERR_ARG, op, "parameter '%s' is not a leaf (the result of a recorded op); "
                      "add kl_detach(t) or a clone made under no-grad", name);
    if (kl_params_index(p, name) >= 0)
        return ke_err(KL_ERR_ARG, op, "a parameter named '%s' is already in the collection", name);
    for (int i = 0; i < p->n; i++)
        if (p->ts[i] == t)
            return ke_err(KL_ERR_ARG, op, "the tensor given as '%s' is already in the collection as '%s'",
                          name, p->names[i]);
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 8;
        char **nn = realloc(p->names, (size_t)cap * sizeof *nn);
        if (!nn) return ke_err(KL_ERR_OOM, op, "out of memory");
        p->names = nn;
        kl_tensor **nt = realloc(p->ts, (size_t)cap * sizeof *nt);
        if (!nt) return ke_err(KL_ERR_OOM, op, "out of memory");
        p->ts = nt;
        p->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return ke_err(KL_ERR_OOM, op, "out of memory");
    if (kl_set_requires_grad(t, true)) {
        free(copy);
        return -1;
    }
    ke_tensor_incref(t);
    p->names[p->n] = copy;
    p->ts[p->n] = t;
    return p->n++;
}

/* Undoes the latest kl_params_add (kl_params_add_linear's failure path). */
static void params_pop(kl_params *p) {
    p->n--;
    free(p->names[p->n]);
    ke_tensor_decref(p->ts[p->n]);
}

int kl_params_count(const kl_params *p) { return p ? p->n : 0; }

kl_tensor *kl_params_get(const kl_params *p, int i) {
    if (check_params(p, "params_get")) return NULL;
    if (i < 0 || i >= p->n) {
        ke_err(KL_ERR_INDEX, "params_get", "index %d out of range for %d parameters", i, p->n);
        return NULL;
    }
    return p->ts[i];
}

const char *kl_params_name(const kl_params *p, int i) {
    if (check_params(p, "params_name")) return NULL;
    if (i < 0 || i >= p->n) {
        ke_err(KL_ERR_INDEX, "params_name", "index %d out of range for %d parameters", i, p->n);
        return NULL;
    }
    return p->names[i];
}

kl_tensor *kl_params_find(const kl_params *p, const char *name) {
    int i = kl_params_index(p, name);
    return i < 0 ? NULL : p->ts[i];
}

int kl_params_zero_grad(kl_params *p) {
    if (check_params(p, "params_zero_grad")) return -1;
    for (int i = 0; i < p->n; i++)
        if (kl_zero_grad(p->ts[i])) return -1;
    return 0;
}

int64_t kl_params_numel(const kl_params *p) {
    if (check_params(p, "params_numel")) return -1;
    int64_t n = 0;
    for (int i = 0; i < p->n; i++) n += ke_numel(p->ts[i]->ndim, p->ts[i]->shape);
    return n;
}

/* "<prefix>.<what>" into buf; -1 (KL_ERR_ARG) if it does not fit. */
static int param_name(char *buf, size_t cap, const char *op, const char *prefix, const char *what) {
    const char *pre = prefix ? prefix : "", *dot = *pre ? "." : "";
    if (snprintf(buf, cap, "%s%s%s", pre, dot, what) >= (int)cap)
        return ke_err(KL_ERR_ARG, op, "prefix is too long (%zu characters)", strlen(pre));
    return 0;
}

/* A layer's "<prefix>.weight" of wshape and, if bias, "<prefix>.bias"
 * [nbias], in the default dtype, with the default init of PyTorch's
 * nn.Linear / nn.ConvNd (reset_parameters): kaiming_uniform_(a = sqrt(5)),
 * i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in from the weight's
 * dims 1.. (kl_init_calculate_fans), and the bias from the same bound. */
static int add_weight_bias(kl_params *p, const char *op, const char *prefix, int nd, const int64_t *wshape,
                           int64_t nbias, bool bias, kl_tensor **weight, kl_tensor **b) {
    if (weight) *weight = NULL;
    if (b) *b = NULL;
    if (check_params(p, op)) return -1;
    char wname[512], bname[512];
    if (param_name(wname, sizeof wname, op, prefix, "weight") || param_name(bname, sizeof bname, op, prefix, "bias"))
        return -1;
    /* Name clashes first, so that nothing is created for nothing. */
    if (kl_params_index(p, wname) >= 0 || (bias && kl_params_index(p, bname) >= 0))
        return ke_err(KL_ERR_ARG, op, "a parameter named '%s' is already in the collection",
                      kl_params_index(p, wname) >= 0 ? wname : bname);

    kl_dtype dt = kl_get_default_dtype();
    int rc = -1;
    kl_scope_begin();
    kl_tensor *w = kl_empty(nd, wshape, dt);
    int64_t fan_in = 0;
    if (w && kl_init_kaiming_uniform(w, sqrt(5.0), KL_FAN_IN, KL_NONLIN_LEAKY_RELU) &&
        kl_init_calculate_fans(w, &fan_in, NULL) == 0 && kl_params_add(p, wname, w) >= 0) {
        if (!bias) {
            rc = 0;
        } else {
            double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
            kl_tensor *bt = kl_empty(1, &nbias, dt);
            if (bt && kl_init_uniform(bt, -bound, bound) && kl_params_add(p, bname, bt) >= 0) {
                rc = 0;
                if (b) *b = bt;
            } else {
                params_pop(p);
            }
        }
        if (rc == 0 && weight) *weight = w;
    }
    kl_scope_end(); /* the collection's references keep w and b alive */
    return rc;
}

int kl_params_add_linear(kl_params *p, const char *prefix, int64_t in_features, int64_t out_features,
                         bool bias, kl_tensor **weight, kl_tensor **b) {
    static const char *op = "params_add_linear";
    if (in_features < 0 || out_features < 0) {
        if (weight) *weight = NULL;
        if (b) *b = NULL;
        if (check_params(p, op)) return -1;
        return ke_err(KL_ERR_SHAPE, op, "in_features (%lld) and out_features (%lld) must be >= 0",
                      (long long)in_features, (long long)out_features);
    }
    return add_weight_bias(p, op, prefix, 2, (int64_t[]){out_features, in_features}, out_features, bias, weight, b);
}

/* Channels and groups of a convolution layer: positive, both divisible. */
static int check_conv_layer(const char *op, int64_t in, int64_t out, int64_t groups, int nk, const int64_t *k) {
    if (in < 1 || out < 1 || groups < 1 || in % groups || out % groups)
        return ke_err(KL_ERR_ARG, op,
                      "in_channels (%lld) and out_channels (%lld) must be positive and divisible by groups (%lld)",
                      (long long)in, (long long)out, (long long)groups);
    for (int i = 0; i < nk; i++)
        if (k[i] < 1) return ke_err(KL_ERR_ARG, op, "kernel size %lld must be positive", (long long)k[i]);
    return 0;
}

int kl_params_add_conv1d(kl_params *p, const char *prefix, int64_t in_channels, int64_t out_channels,
                         int64_t kernel_size, int64_t groups, bool bias, kl_tensor **weight, kl_tensor **b) {
    static const char *op = "params_add_conv1d";
    if (check_conv_layer(op, in_channels, out_channels, groups, 1, &kernel_size)) {
        if (weight) *weight = NULL;
        if (b) *b = NULL;
        return -1;
    }
    return add_weight_bias(p, op, prefix, 3, (int64_t[]){out_channels, in_channels / groups, kernel_size},
                           out_channels, bias, weight, b);
}

int kl_params_add_conv2d(kl_params *p, const char *prefix, int64_t in_channels, int64_t out_channels, int64_t kh,
                         int64_t kw, int64_t groups, bool bias, kl_tensor **weight, kl_tensor **b) {
    static const char *op = "params_add_conv2d";
    if (check_conv_layer(op, in_channels, out_channels, groups, 2, (int64_t[]){kh, kw})) {
        if (weight) *weight = NULL;
        if (b) *b = NULL;
        return -1;
    }
    return add_weight_bias(p, op, prefix, 4, (int64_t[]){out_channels, in_channels / groups, kh, kw},
                           out_channels, bias, weight, b);
}

/* nn.ConvTranspose2d's weight is [in, out / groups, kh, kw]: its fan_in
 * (dim 1) counts output channels, as PyTorch's init computes it. */
int kl_params_add_conv_transpose2d(kl_params *p, const char *prefix, int64_t in_channels, int64_t out_channels,
                                   int64_t kh, int64_t kw, int64_t groups, bool bias, kl_tensor **weight,
                                   kl_tensor **b) {
    static const char *op = "params_add_conv_transpose2d";
    if (check_conv_layer(op, in_channels, out_channels, groups, 2, (int64_t[]){kh, kw})) {
        if (weight) *weight = NULL;
        if (b) *b = NULL;
        return -1;
    }
    return add_weight_bias(p, op, prefix, 4, (int64_t[]){in_channels, out_channels / groups, kh, kw},
                           out_channels, bias, weight, b);
}

int kl_params_add_batch_norm(kl_params *p, const char *prefix, int64_t num_features, bool affine,
                             kl_tensor **weight, kl_tensor **b, kl_tensor **running_mean, kl_tensor **running_var) {
    static const char *op = "params_add_batch_norm";
    if (weight) *weight = NULL;
    if (b) *b = NULL;
    if (running_mean) *running_mean = NULL;
    if (running_var) *running_var = NULL;
    if (check_params(p, op)) return -1;
    if (num_features < 1) return ke_err(KL_ERR_ARG, op, "num_features (%lld) must be positive", (long long)num_features);
    char wname[512], bname[512];
    if (param_name(wname, sizeof wname, op, prefix, "weight") || param_name(bname, sizeof bname, op, prefix, "bias"))
        return -1;
    if (affine && (kl_params_index(p, wname) >= 0 || kl_params_index(p, bname) >= 0))
        return ke_err(KL_ERR_ARG, op, "a parameter named '%s' is already in the collection",
                      kl_params_index(p, wname) >= 0 ? wname : bname);
    kl_dtype dt = kl_get_default_dtype();
    /* the buffers first: they belong to the caller's scope, the parameters to p */
    kl_tensor *rm = running_mean ? kl_zeros(1, &num_features, dt) : NULL,
              *rv = running_var ? kl_ones(1, &num_features, dt) : NULL;
    if ((running_mean && !rm) || (running_var && !rv)) return -1;
    if (affine) {
        int rc = -1;
        kl_scope_begin();
        kl_tensor *w = kl_ones(1, &num_features, dt), *bt = kl_zeros(1, &num_features, dt);
        if (w && bt && kl_params_add(p, wname, w) >= 0) {
            if (kl_params_add(p, bname, bt) >= 0)
                rc = 0;
            else
                params_pop(p);
        }
        kl_scope_end();
        if (rc) {
            if (rm) kl_release(rm);
            if (rv) kl_release(rv);
            return -1;
        }
        if (weight) *weight = w;
        if (b) *b = bt;
    }
    if (running_mean) *running_mean = rm;
    if (running_var) *running_var = rv;
    return 0;
}

/* nn.PReLU's weight: num_parameters copies of init (PyTorch's default 0.25). */
int kl_params_add_prelu(kl_params *p, const char *prefix, int64_t num_parameters, double init, kl_tensor **weight) {
    static const char *op = "params_add_prelu";
    if (weight) *weight = NULL;
    if (check_params(p, op)) return -1;
    if (num_parameters < 1)
        return ke_err(KL_ERR_ARG, op, "num_parameters (%lld) must be positive", (long long)num_parameters);
    char wname[512];
    if (param_name(wname, sizeof wname, op, prefix, "weight")) return -1;
    if (kl_params_index(p, wname) >= 0)
        return ke_err(KL_ERR_ARG, op, "a parameter named '%s' is already in the collection", wname);
    int rc = -1;
    kl_scope_begin();
    kl_tensor *w = kl_full(1, &num_parameters, init, kl_get_default_dtype());
    if (w && kl_params_add(p, wname, w) >= 0) rc = 0;
    kl_scope_end();
    if (rc == 0 && weight) *weight = w;
    return rc;
}
