/*
 * nn_util.h — literal tensors for the nn suites (test_nn.c, test_nn_layers.c), and
 * the bn -> relu -> max_pool training step test_compile.c and test_pool.c compile.
 */
#ifndef KT_NN_UTIL_H
#define KT_NN_UTIL_H

#include "kiln.h"

/* TF(shape, values...): a float32 tensor of that shape from literal values */
static inline kl_tensor *kt_f32(int nd, const int64_t *shape, const float *v) { return kl_from_data(v, nd, shape, KL_F32); }
#define TF(shape, ...) kt_f32(shape, (const float[]){__VA_ARGS__})
#define TI64(shape, ...) kl_from_data((const int64_t[]){__VA_ARGS__}, shape, KL_I64)

/* arange(n) as float32 in the given shape */
static inline kl_tensor *ar(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return kl_reshape(kl_arange(0, (double)n, 1, KL_F32), nd, shape);
}
static inline kl_tensor *ar_dt(int nd, const int64_t *shape, kl_dtype dt) { return kl_to_dtype(ar(nd, shape), dt); }

/* bn -> relu -> 2x2 max_pool step: in = {x, weight, bias, g}; out = {dL/dx,
 * dL/dweight, pooled} for L = sum(pooled * g). Its backward calls the internal
 * composites batch_norm_backward and max_pool2d_backward. */
static inline int kt_bn_relu_pool_step(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p[2] = {kl_detach(in[0]), kl_detach(in[1])};
    if (!p[0] || !p[1] || kl_set_requires_grad(p[0], true) < 0 || kl_set_requires_grad(p[1], true) < 0) return -1;
    kl_pool2d_options po = kl_pool2d_options_default(2);
    kl_tensor *h = kl_max_pool2d(kl_relu(kl_batch_norm(p[0], NULL, NULL, p[1], in[2], true, 0.1, 1e-5)), &po);
    kl_tensor *loss = kl_sum(kl_mul(h, in[3]), KL_ALL_DIMS, false);
    if (!loss || kl_autograd_grad(1, &loss, NULL, 2, p, out, NULL) < 0) return -1;
    out[2] = kl_detach(h);
    return out[2] ? 0 : -1;
}

#endif
