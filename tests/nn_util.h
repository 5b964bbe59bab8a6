/*
 * nn_util.h — literal tensors for the nn suites (test_nn.c, test_nn_layers.c).
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

#endif
