/* index_add.h — the scatter kernels' update of one element, per dtype, written
 * once for both devices: the CPU's scatter kernels (index.c's KE_SC_DTYPE:
 * scatter, scatter_add, scatter_reduce) expand these macros, and the CUDA
 * indexing program (codegen_nvrtc/cn_index.c) gets their expansions as text.
 * test_cuda_index compares the two bit for bit.
 *
 * Per dtype D: KE_SC_C_D is the compute type, KE_SC_LD_D(v) loads a stored
 * element into it (f16/bf16 bits to f32), KE_SC_ST_D(v) stores it back (so
 * f16/bf16 round after every update, as PyTorch's Half +=), KE_SC_ADD_D and
 * KE_SC_MUL_D combine two compute values (integers wrap, bool ORs and ANDs),
 * KE_SC_DIV_D(a, n) divides by a count n (a double holding an integer:
 * floats divide in C, integers floor-divide in int64 since a u8 element may
 * take more than 255 entries). amax / amin are KE_SC_MAX / KE_SC_MIN for
 * every dtype: a NaN already there stays, a NaN arriving wins. Everything is
 * an expression of its arguments only (no helper functions), so its text
 * compiles as CUDA C as it is. */
#ifndef KE_INDEX_ADD_H
#define KE_INDEX_ADD_H

#define KE_SC_ID(v) (v)
#define KE_SC_PLUS(a, b) ((a) + (b))
#define KE_SC_TIMES(a, b) ((a) * (b))
#define KE_SC_MAX(a, b) ((a) != (a) || (a) > (b) ? (a) : (b))
#define KE_SC_MIN(a, b) ((a) != (a) || (a) < (b) ? (a) : (b))
#define KE_SC_FDIV(C, a, n) ((a) / (C)(n))
/* floor division of int64 values (n > 0 here: a count) */
#define KE_SC_FLOORDIV(a, n) ((a) / (n) - ((a) % (n) != 0 && ((a) ^ (n)) < 0))
#define KE_SC_IDIV(a, n) KE_SC_FLOORDIV((int64_t)(a), (int64_t)(n))

#define KE_SC_C_F32 float
#define KE_SC_LD_F32(v) KE_SC_ID(v)
#define KE_SC_ST_F32(v) KE_SC_ID(v)
#define KE_SC_ADD_F32(a, b) KE_SC_PLUS(a, b)
#define KE_SC_MUL_F32(a, b) KE_SC_TIMES(a, b)
#define KE_SC_DIV_F32(a, n) KE_SC_FDIV(float, a, n)

#define KE_SC_C_F64 double
#define KE_SC_LD_F64(v) KE_SC_ID(v)
#define KE_SC_ST_F64(v) KE_SC_ID(v)
#define KE_SC_ADD_F64(a, b) KE_SC_PLUS(a, b)
#define KE_SC_MUL_F64(a, b) KE_SC_TIMES(a, b)
#define KE_SC_DIV_F64(a, n) KE_SC_FDIV(double, a, n)

#define KE_SC_C_F16 float
#define KE_SC_LD_F16(v) ke_f16_to_f32(v)
#define KE_SC_ST_F16(v) ke_f32_to_f16(v)
#define KE_SC_ADD_F16(a, b) KE_SC_PLUS(a, b)
#define KE_SC_MUL_F16(a, b) KE_SC_TIMES(a, b)
#define KE_SC_DIV_F16(a, n) KE_SC_FDIV(float, a, n)

#define KE_SC_C_BF16 float
#define KE_SC_LD_BF16(v) ke_bf16_to_f32(v)
#define KE_SC_ST_BF16(v) ke_f32_to_bf16(v)
#define KE_SC_ADD_BF16(a, b) KE_SC_PLUS(a, b)
#define KE_SC_MUL_BF16(a, b) KE_SC_TIMES(a, b)
#define KE_SC_DIV_BF16(a, n) KE_SC_FDIV(float, a, n)

#define KE_SC_C_I32 int32_t
#define KE_SC_LD_I32(v) KE_SC_ID(v)
#define KE_SC_ST_I32(v) KE_SC_ID(v)
#define KE_SC_ADD_I32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define KE_SC_MUL_I32(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define KE_SC_DIV_I32(a, n) KE_SC_IDIV(a, n)

#define KE_SC_C_I64 int64_t
#define KE_SC_LD_I64(v) KE_SC_ID(v)
#define KE_SC_ST_I64(v) KE_SC_ID(v)
#define KE_SC_ADD_I64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define KE_SC_MUL_I64(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define KE_SC_DIV_I64(a, n) KE_SC_IDIV(a, n)

#define KE_SC_C_U8 uint8_t
#define KE_SC_LD_U8(v) KE_SC_ID(v)
#define KE_SC_ST_U8(v) KE_SC_ID(v)
#define KE_SC_ADD_U8(a, b) ((uint8_t)((uint32_t)(a) + (uint32_t)(b)))
#define KE_SC_MUL_U8(a, b) ((uint8_t)((uint32_t)(a) * (uint32_t)(b)))
#define KE_SC_DIV_U8(a, n) KE_SC_IDIV(a, n)

#define KE_SC_C_BOOL uint8_t
#define KE_SC_LD_BOOL(v) KE_SC_ID(v)
#define KE_SC_ST_BOOL(v) KE_SC_ID(v)
#define KE_SC_ADD_BOOL(a, b) (((a) | (b)) != 0)
#define KE_SC_MUL_BOOL(a, b) (((a) & (b)) != 0)
#define KE_SC_DIV_BOOL(a, n) KE_SC_IDIV(a, n) /* mean of bool is refused by the shape rule */

#endif
