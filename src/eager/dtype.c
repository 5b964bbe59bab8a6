/*
 * dtype.c — the dtype table, PyTorch's type promotion, and the one routine
 * that converts between dtypes (every cast in eager goes through it).
 */
#include "core.h"

#include <math.h>

const ke_dtype_info ke_dtypes[KL_NUM_DTYPES] = {
    /*            name        short  size category       npy */
    [KL_F32]  = {"float32",  "f32", 4, KE_CAT_FLOAT, 'f'},
    [KL_F64]  = {"float64",  "f64", 8, KE_CAT_FLOAT, 'f'},
    [KL_F16]  = {"float16",  "f16", 2, KE_CAT_FLOAT, 'f'},
    [KL_BF16] = {"bfloat16", "bf16", 2, KE_CAT_FLOAT, 'V'},
    [KL_I32]  = {"int32",    "i32", 4, KE_CAT_INT,   'i'},
    [KL_I64]  = {"int64",    "i64", 8, KE_CAT_INT,   'i'},
    [KL_U8]   = {"uint8",    "u8",  1, KE_CAT_INT,   'u'},
    [KL_BOOL] = {"bool",     "bool", 1, KE_CAT_BOOL, 'b'},
};
_Static_assert(sizeof ke_dtypes / sizeof ke_dtypes[0] == KL_NUM_DTYPES, "dtype table length");

size_t kl_dtype_size(kl_dtype dt) { return ke_dtype_valid(dt) ? ke_dtypes[dt].size : 0; }
const char *kl_dtype_name(kl_dtype dt) { return ke_dtype_valid(dt) ? ke_dtypes[dt].name : "invalid"; }
bool kl_dtype_is_floating(kl_dtype dt) { return ke_dtype_valid(dt) && ke_is_float(dt); }

/* PyTorch's promotion lattice for the 8 dtypes (c10::promoteTypes), with
 * f16 x bf16 -> f32 and u8 x i32 -> i32 as there. */
#define F32 KL_F32
#define F64 KL_F64
#define F16 KL_F16
#define BF  KL_BF16
#define I32 KL_I32
#define I64 KL_I64
#define U8  KL_U8
#define B   KL_BOOL
static const uint8_t promote_table[KL_NUM_DTYPES][KL_NUM_DTYPES] = {
    /*          F32  F64  F16  BF16 I32  I64  U8   BOOL */
    /* F32  */ {F32, F64, F32, F32, F32, F32, F32, F32},
    /* F64  */ {F64, F64, F64, F64, F64, F64, F64, F64},
    /* F16  */ {F32, F64, F16, F32, F16, F16, F16, F16},
    /* BF16 */ {F32, F64, F32, BF,  BF,  BF,  BF,  BF},
    /* I32  */ {F32, F64, F16, BF,  I32, I64, I32, I32},
    /* I64  */ {F32, F64, F16, BF,  I64, I64, I64, I64},
    /* U8   */ {F32, F64, F16, BF,  I32, I64, U8,  U8},
    /* BOOL */ {F32, F64, F16, BF,  I32, I64, U8,  B},
};
#undef F32
#undef F64
#undef F16
#undef BF
#undef I32
#undef I64
#undef U8
#undef B

kl_dtype kl_promote_types(kl_dtype a, kl_dtype b) {
    if (!ke_dtype_valid(a) || !ke_dtype_valid(b)) return KL_NUM_DTYPES;
    return (kl_dtype)promote_table[a][b];
}

/* PyTorch's checked conversion of the fill value (full, fill, pad and masked_fill pass a double):
 * no NaN or out-of-range values into integers, no finite values beyond a
 * float type's range; bool takes anything. */
int ke_check_scalar_cast(const char *op, double v, kl_dtype dt) {
    double lo, hi;
    switch (dt) {
    case KL_BOOL:
    case KL_F64: return 0;
    case KL_F32: lo = -3.4028234663852886e38, hi = 3.4028234663852886e38; break;
    case KL_F16: lo = -65504.0, hi = 65504.0; break;
    case KL_BF16: lo = -3.3895313892515355e38, hi = 3.3895313892515355e38; break;
    case KL_I32: lo = -2147483648.0, hi = 2147483647.0; break;
    case KL_I64: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    /* c10::overflows lets an integer scalar wrap into an unsigned type down
     * to -max; a C double with an integral value counts as an integer
     * (the scalar rule of kiln.h), a fractional one as a float */
    default: lo = v == trunc(v) ? -255 : 0, hi = 255; break;
    }
    if (ke_is_float(dt) && (isnan(v) || isinf(v))) return 0;
    if (!(v >= lo && v <= hi))
        return ke_err(KL_ERR_ARG, op, "value %g cannot be converted to %s without overflow", v, ke_dtypes[dt].name);
    return 0;
}

/* ---- f16 ---------------------------------------------------------------- */

/* ---- element access (slow paths) ---------------------------------------- */

double ke_load_f64(const void *p, kl_dtype d, int64_t i) {
    switch (d) {
    case KL_F32: return ((const float *)p)[i];
    case KL_F64: return ((const double *)p)[i];
    case KL_F16: return ke_f16_to_f32(((const uint16_t *)p)[i]);
    case KL_BF16: return ke_bf16_to_f32(((const uint16_t *)p)[i]);
    case KL_I32: return ((const int32_t *)p)[i];
    case KL_I64: return (double)((const int64_t *)p)[i];
    case KL_U8: return ((const uint8_t *)p)[i];
    case KL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return NAN;
    }
}

int64_t ke_load_i64(const void *p, kl_dtype d, int64_t i) {
    switch (d) {
    case KL_I32: return ((const int32_t *)p)[i];
    case KL_I64: return ((const int64_t *)p)[i];
    case KL_U8: return ((const uint8_t *)p)[i];
    case KL_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: {
        double v = ke_load_f64(p, d, i);
        return (v != v || v >= 9.2233720368547758e18 || v < -9.2233720368547758e18) ? INT64_MIN : (int64_t)v;
    }
    }
}

/* Float -> integer casts are UB in C outside the target's range; PyTorch's
 * results there are unspecified too. We define them: NaN -> 0, out of range
 * wraps through int64 (like x86 cvttsd2si for in-range values). */

void ke_store_f64(void *p, kl_dtype d, int64_t i, double v) {
    switch (d) {
    case KL_F32: ((float *)p)[i] = (float)v; break;
    case KL_F64: ((double *)p)[i] = v; break;
    case KL_F16: ((uint16_t *)p)[i] = ke_f32_to_f16((float)v); break;
    case KL_BF16: ((uint16_t *)p)[i] = ke_f32_to_bf16((float)v); break;
    case KL_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)ke_f2i(v); break;
    case KL_I64: ((int64_t *)p)[i] = ke_f2i(v); break;
    case KL_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)ke_f2i(v); break;
    case KL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}

/* ---- conversion ------------------------------------------------------------
 * One generic strided loop per (src, dst) pair, generated from two tables of
 * load/store expressions; contiguous fast paths fall out of stride == 1
 * specialisation by the compiler (the loop body is branch-free). */

#define KE_LOAD_F32(p, i) KE_CV_LOAD_F32(((const float *)(p))[i])
#define KE_LOAD_F64(p, i) KE_CV_LOAD_F64(((const double *)(p))[i])
#define KE_LOAD_F16(p, i) KE_CV_LOAD_F16(((const uint16_t *)(p))[i])
#define KE_LOAD_BF16(p, i) KE_CV_LOAD_BF16(((const uint16_t *)(p))[i])
#define KE_LOAD_I32(p, i) KE_CV_LOAD_I32(((const int32_t *)(p))[i])
#define KE_LOAD_I64(p, i) KE_CV_LOAD_I64(((const int64_t *)(p))[i])
#define KE_LOAD_U8(p, i) KE_CV_LOAD_U8(((const uint8_t *)(p))[i])
#define KE_LOAD_BOOL(p, i) KE_CV_LOAD_BOOL(((const uint8_t *)(p))[i])

#define KE_STORE_F32(p, i, v, isf) (((float *)(p))[i] = KE_CV_STORE_F32(v, isf))
#define KE_STORE_F64(p, i, v, isf) (((double *)(p))[i] = KE_CV_STORE_F64(v, isf))
#define KE_STORE_F16(p, i, v, isf) (((uint16_t *)(p))[i] = KE_CV_STORE_F16(v, isf))
#define KE_STORE_BF16(p, i, v, isf) (((uint16_t *)(p))[i] = KE_CV_STORE_BF16(v, isf))
#define KE_STORE_I32(p, i, v, isf) (((int32_t *)(p))[i] = KE_CV_STORE_I32(v, isf))
#define KE_STORE_I64(p, i, v, isf) (((int64_t *)(p))[i] = KE_CV_STORE_I64(v, isf))
#define KE_STORE_U8(p, i, v, isf) (((uint8_t *)(p))[i] = KE_CV_STORE_U8(v, isf))
#define KE_STORE_BOOL(p, i, v, isf) (((uint8_t *)(p))[i] = KE_CV_STORE_BOOL(v, isf))

#define KE_ISF_F32 1
#define KE_ISF_F64 1
#define KE_ISF_F16 1
#define KE_ISF_BF16 1
#define KE_ISF_I32 0
#define KE_ISF_I64 0
#define KE_ISF_U8 0
#define KE_ISF_BOOL 0

#define KE_DTYPES(X) X(F32) X(F64) X(F16) X(BF16) X(I32) X(I64) X(U8) X(BOOL)

#define KE_CONV_FN(S, D)                                                                      \
    static void conv_##S##_##D(void *dst, int64_t ds, const void *src, int64_t ss, int64_t n) { \
        if (ds == 1 && ss == 1) {                                                             \
            for (int64_t i = 0; i < n; i++) KE_STORE_##D(dst, i, KE_LOAD_##S(src, i), KE_ISF_##S); \
        } else {                                                                              \
            for (int64_t i = 0; i < n; i++)                                                   \
                KE_STORE_##D(dst, i * ds, KE_LOAD_##S(src, i * ss), KE_ISF_##S);              \
        }                                                                                     \
    }
#define KE_CONV_ROW(S) KE_CONV_FN(S, F32) KE_CONV_FN(S, F64) KE_CONV_FN(S, F16) KE_CONV_FN(S, BF16) \
    KE_CONV_FN(S, I32) KE_CONV_FN(S, I64) KE_CONV_FN(S, U8) KE_CONV_FN(S, BOOL)
KE_DTYPES(KE_CONV_ROW)

typedef void (*conv_fn)(void *, int64_t, const void *, int64_t, int64_t);
#define KE_CONV_ENTRY(S) \
    {conv_##S##_F32, conv_##S##_F64, conv_##S##_F16, conv_##S##_BF16, conv_##S##_I32, conv_##S##_I64, \
     conv_##S##_U8, conv_##S##_BOOL},
static const conv_fn conv_table[KL_NUM_DTYPES][KL_NUM_DTYPES] = {KE_DTYPES(KE_CONV_ENTRY)};

void ke_convert_strided(void *dst, kl_dtype dd, int64_t dstride, const void *src, kl_dtype sd,
                        int64_t sstride, int64_t n) {
    if (n <= 0) return;
    if (dd == sd && dstride == 1 && sstride == 1) {
        memcpy(dst, src, (size_t)n * ke_dtypes[dd].size);
        return;
    }
    conv_table[sd][dd](dst, dstride, src, sstride, n);
}

void ke_convert(void *dst, kl_dtype dd, const void *src, kl_dtype sd, int64_t n) {
    ke_convert_strided(dst, dd, 1, src, sd, 1, n);
}
