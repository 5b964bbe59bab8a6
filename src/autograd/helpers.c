/*
 * helpers.c — small building blocks shared by derivative formulas and the
 * engine, written with kl_ ops so they stay differentiable.
 */
#include "autograd.h"

kl_tensor *ag_sum_to(kl_tensor *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    int lead = g->ndim - ndim;
    if (lead < 0)
        return ke_err(KL_ERR_INTERNAL, "backward", "gradient has fewer dims (%d) than its input (%d)", g->ndim,
                      ndim),
               NULL;
    int64_t dims[KL_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < lead; d++) dims[nd++] = d;
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 1 && g->shape[lead + d] != 1) dims[nd++] = lead + d;
    if (nd == 0 && lead == 0) return g;
    kl_tensor *r = nd ? kl_sum(g, nd, dims, true) : g;
    return kl_reshape(r, ndim, shape);
}

kl_tensor *ag_call(int op, int nin, kl_tensor *const *in, const ke_attrs *a) {
    ke_call c = {.op = op, .nin = nin, .in = in, .device = KL_DEVICE_CPU};
    c.a = *a;
    return ke_call1(&c);
}

kl_tensor *ag_zeros(const ag_tmeta *m) {
    ke_call c = {.op = KE_OP_full, .nin = 0, .device = m->device};
    ke_attr_set_dtype(&c.a, m->dtype);
    if (ke_set_list(&c, m->ndim, m->shape)) return NULL;
    return ke_call1(&c);
}
