/* kernels_core.h — shape rules, kernels and view rules named by the rows of
 * ops_create.def and ops_view.def (create.c, view.c). */
#ifndef KE_KERNELS_CORE_H
#define KE_KERNELS_CORE_H
#include "ew.h"

extern const ke_ew_impl ke_ew_identity;
int ke_infer_create(ke_call *c, ke_outspec *out);
int ke_infer_arange(ke_call *c, ke_outspec *out);
int ke_infer_linspace(ke_call *c, ke_outspec *out);
int ke_infer_eye(ke_call *c, ke_outspec *out);
int ke_infer_copy(ke_call *c, ke_outspec *out);
int ke_cpu_empty(ke_call *c);
int ke_cpu_full(ke_call *c);
int ke_cpu_arange(ke_call *c);
int ke_cpu_linspace(ke_call *c);
int ke_cpu_eye(ke_call *c);
int ke_cpu_rand(ke_call *c);
int ke_cpu_randn(ke_call *c);
int ke_cpu_randint(ke_call *c);
int ke_cpu_bernoulli(ke_call *c);
int ke_cpu_copy(ke_call *c);
int ke_decomp_to_device(ke_call *c);

int ke_view_view(ke_call *c);
int ke_view_permute(ke_call *c);
int ke_view_transpose(ke_call *c);
int ke_view_expand(ke_call *c);
int ke_view_squeeze(ke_call *c);
int ke_view_unsqueeze(ke_call *c);
int ke_view_slice(ke_call *c);
int ke_view_select(ke_call *c);
int ke_view_as_strided(ke_call *c);
int ke_view_alias(ke_call *c);
int ke_decomp_reshape(ke_call *c);
int ke_decomp_flatten(ke_call *c);
int ke_decomp_narrow(ke_call *c);
int ke_decomp_t(ke_call *c);
int ke_decomp_squeeze_all(ke_call *c);
int ke_decomp_contiguous(ke_call *c);
#endif
