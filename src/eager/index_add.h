/* index_add.h — scatter_add's accumulation of one element, per dtype, as the
 * CUDA kernel's text (codegen_nvrtc/cn_index.c puts these macros' expansions
 * into its CUDA C): f16/bf16 add in f32 and round after every add (as
 * PyTorch's Half +=), integers wrap, bool ORs. The CPU's scatter kernels
 * (index.c, KE_SC_DTYPE's sum, which also serves scatter_reduce) compute the
 * same; test_cuda_index compares the two bit for bit.
 * a and b are values of the dtype's C type (f16/bf16: their bits). */
#ifndef KE_INDEX_ADD_H
#define KE_INDEX_ADD_H

#define KE_SADD_F32(a, b) ((a) + (b))
#define KE_SADD_F64(a, b) ((a) + (b))
#define KE_SADD_F16(a, b) ke_f32_to_f16(ke_f16_to_f32(a) + ke_f16_to_f32(b))
#define KE_SADD_BF16(a, b) ke_f32_to_bf16(ke_bf16_to_f32(a) + ke_bf16_to_f32(b))
#define KE_SADD_I32(a, b) ((uint32_t)(a) + (uint32_t)(b))
#define KE_SADD_I64(a, b) ((uint64_t)(a) + (uint64_t)(b))
#define KE_SADD_U8(a, b) ((uint32_t)(a) + (uint32_t)(b))
#define KE_SADD_BOOL(a, b) (((a) | (b)) != 0)

#endif
