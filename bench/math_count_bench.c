/*
 * math_count_bench.c — instruction counts of the f32 math on 2^20 elements
 * (bench/RESULTS.md, "FP contraction"): one eager op, or one call of a
 * compiled workload (shared/WORKLOADS.md's chain5 and gelu), inside the
 * named noinline function kb_measure so that callgrind counts it alone:
 *
 *   valgrind --tool=callgrind --toggle-collect=kb_measure \
 *       build-vg/bench/math_count_bench exp
 *
 * what: exp log tanh gelu gelu_tanh softmax pow atan2 chain5 gelu_wl (the
 * last two compiled; their compile and first call run before kb_measure;
 * pow: |x| + 1e-3 to a tensor of N(0, 1) exponents, the general path, not
 * the scalar shortcuts; atan2: x against a second N(0, 3^2) tensor). One
 * thread, fixed seed; the result's sum is printed so a wrong build shows.
 */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* y = tanh(sigmoid(x*2 + 1) * x) */
static int chain5(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    out[0] = kl_tanh(kl_mul(kl_sigmoid(kl_add_scalar(kl_mul_scalar(x, 2), 1)), x));
    return out[0] ? 0 : -1;
}

/* y = 0.5*x*(1 + tanh(0.7978845608*(x + 0.044715*x*x*x))), Python's order */
static int gelu_wl(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *x3 = kl_mul(kl_mul(kl_mul_scalar(x, 0.044715), x), x);
    kl_tensor *t = kl_tanh(kl_mul_scalar(kl_add(x, x3), 0.7978845608));
    out[0] = kl_mul(kl_mul_scalar(x, 0.5), kl_add_scalar(t, 1));
    return out[0] ? 0 : -1;
}

static const char *what;
static kl_fn *fn;
static kl_tensor *other; /* pow's exponents, atan2's x */

__attribute__((noinline)) kl_tensor *kb_measure(kl_tensor *x);
__attribute__((noinline)) kl_tensor *kb_measure(kl_tensor *x) {
    if (fn) {
        kl_tensor *y = NULL;
        return kl_fn_call(fn, &x, 1, &y, 1) == 0 ? y : NULL;
    }
    if (!strcmp(what, "exp")) return kl_exp(x);
    if (!strcmp(what, "log")) return kl_log(x);
    if (!strcmp(what, "tanh")) return kl_tanh(x);
    if (!strcmp(what, "gelu")) return kl_gelu(x);
    if (!strcmp(what, "gelu_tanh")) return kl_gelu_tanh(x);
    if (!strcmp(what, "softmax")) return kl_softmax(kl_reshape(x, KL_SHAPE(1024, 1024)), -1);
    if (!strcmp(what, "pow")) return kl_pow(x, other);
    if (!strcmp(what, "atan2")) return kl_atan2(x, other);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: math_count_bench exp|log|tanh|gelu|gelu_tanh|softmax|pow|atan2|chain5|gelu_wl\n");
        return 2;
    }
    what = argv[1];
    kl_set_num_threads(1);
    kl_manual_seed(0);
    kl_scope_begin();
    /* log's input is positive; the others see N(0, 3^2) */
    kl_tensor *x = kl_mul_scalar(kl_randn(KL_SHAPE(1 << 20), KL_F32), 3.0);
    if (!strcmp(what, "log")) x = kl_add_scalar(kl_abs(x), 1e-3);
    other = kl_mul_scalar(kl_randn(KL_SHAPE(1 << 20), KL_F32), !strcmp(what, "pow") ? 1.0 : 3.0);
    if (!strcmp(what, "pow")) x = kl_add_scalar(kl_abs(x), 1e-3);
    if (!strcmp(what, "chain5") || !strcmp(what, "gelu_wl")) {
        fn = kl_compile(!strcmp(what, "chain5") ? chain5 : gelu_wl, NULL, NULL);
        kl_tensor *y = NULL;
        if (!fn || kl_fn_call(fn, &x, 1, &y, 1) != 0 || kl_fn_wait_compiled(fn) != 0) { /* counted: compiled */
            fprintf(stderr, "math_count_bench: %s\n", kl_last_error());
            return 1;
        }
    }
    kl_tensor *y = kb_measure(x);
    if (!y) {
        fprintf(stderr, "math_count_bench: %s: %s\n", what, kl_last_error());
        return 1;
    }
    printf("math_count_bench %s: sum %.9g\n", what, kl_item(kl_sum(kl_to_dtype(y, KL_F64), 0, NULL, false)));
    if (fn) kl_fn_release(fn);
    kl_scope_end();
    return 0;
}
