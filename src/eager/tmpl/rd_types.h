/* tmpl/rd_types.h — instantiates a reduction's kernel for each loop dtype of
 * its kind (reduce_ops.c), TH's THGenerate*Types.h style. Define before
 * including (#undef'd at the end):
 *   RK_OP    the formula prefix (SUM, VAR, ARGMAX...)
 *   RK_KIND  which loop dtypes, as (input T, accumulator A, result R):
 *     RK_KIND_SUM     floats as themselves; i32, i64, u8 summed in uint64_t, result int64
 *     RK_KIND_SAME    every loop dtype as itself
 *     RK_KIND_BOOL    every loop dtype into a bool (uint8_t)
 *     RK_KIND_FLOAT   f32 and f64 as themselves
 *     RK_KIND_DOUBLE  f32 and f64 accumulated in double (var/std, as PyTorch's CPU kernels)
 *     RK_KIND_MEAN_F32D  f32 into double only (suffix f32d: var's first pass)
 *     RK_KIND_INDEX   every loop dtype, best value and position (tmpl/rd_index_op.h)
 */
#define RK_KIND_SUM 1
#define RK_KIND_SAME 2
#define RK_KIND_BOOL 3
#define RK_KIND_FLOAT 4
#define RK_KIND_DOUBLE 5
#define RK_KIND_MEAN_F32D 6
#define RK_KIND_INDEX 7
#if RK_KIND == RK_KIND_SUM
#define RK_SFX f32
#define RK_T float
#define RK_A float
#define RK_R float
#define RK_VDT KL_F32
#include "rd_value_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#define RK_SFX i32
#define RK_T int32_t
#define RK_A uint64_t
#define RK_R int64_t
#define RK_VDT KL_I64
#include "rd_value_op.h"
#define RK_SFX i64
#define RK_T int64_t
#define RK_A uint64_t
#define RK_R int64_t
#define RK_VDT KL_I64
#include "rd_value_op.h"
#define RK_SFX u8
#define RK_T uint8_t
#define RK_A uint64_t
#define RK_R int64_t
#define RK_VDT KL_I64
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_SAME
#define RK_SFX f32
#define RK_T float
#define RK_A float
#define RK_R float
#define RK_VDT KL_F32
#include "rd_value_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#define RK_SFX i32
#define RK_T int32_t
#define RK_A int32_t
#define RK_R int32_t
#define RK_VDT KL_I32
#include "rd_value_op.h"
#define RK_SFX i64
#define RK_T int64_t
#define RK_A int64_t
#define RK_R int64_t
#define RK_VDT KL_I64
#include "rd_value_op.h"
#define RK_SFX u8
#define RK_T uint8_t
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_U8
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_BOOL
#define RK_SFX f32
#define RK_T float
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_BOOL
#include "rd_value_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_BOOL
#include "rd_value_op.h"
#define RK_SFX i32
#define RK_T int32_t
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_BOOL
#include "rd_value_op.h"
#define RK_SFX i64
#define RK_T int64_t
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_BOOL
#include "rd_value_op.h"
#define RK_SFX u8
#define RK_T uint8_t
#define RK_A uint8_t
#define RK_R uint8_t
#define RK_VDT KL_BOOL
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_FLOAT
#define RK_SFX f32
#define RK_T float
#define RK_A float
#define RK_R float
#define RK_VDT KL_F32
#include "rd_value_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_DOUBLE
#define RK_SFX f32
#define RK_T float
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_MEAN_F32D
#define RK_SFX f32d
#define RK_T float
#define RK_A double
#define RK_R double
#define RK_VDT KL_F64
#include "rd_value_op.h"
#elif RK_KIND == RK_KIND_INDEX
#define RK_SFX f32
#define RK_T float
#define RK_VDT KL_F32
#include "rd_index_op.h"
#define RK_SFX f64
#define RK_T double
#define RK_VDT KL_F64
#include "rd_index_op.h"
#define RK_SFX i32
#define RK_T int32_t
#define RK_VDT KL_I32
#include "rd_index_op.h"
#define RK_SFX i64
#define RK_T int64_t
#define RK_VDT KL_I64
#include "rd_index_op.h"
#define RK_SFX u8
#define RK_T uint8_t
#define RK_VDT KL_U8
#include "rd_index_op.h"
#else
#error "tmpl/rd_types.h: unknown RK_KIND"
#endif
#undef RK_OP
#undef RK_KIND
