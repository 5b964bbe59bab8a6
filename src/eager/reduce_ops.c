/*
 * reduce_ops.c — the reductions of ops_reduce.def as formulas for the
 * engine in reduce.c (sum, mean, prod, amax/amin, max_dim/min_dim,
 * argmax/argmin, var/std, logsumexp, norm, all/any), their shape and dtype
 * rule (PyTorch 1.13's result dtypes and empty-reduction errors) and the
 * public wrappers.
 *
 * Each op's formulas are written once as macros and expanded per loop dtype
 * by RK_VALUE_OP (one accumulator value) or RK_INDEX_OP (best value and its
 * position) into a ke_rd_kernel. Float sums accumulate in their own type
 * (f16/bf16 are read as f32), var/std in double as PyTorch's CPU kernels,
 * integer sums and products in uint64_t (wrapping, returned as int64).
 */
#include "kernels_reduce.h"
#include "vmath.h"

#include <math.h>

/* ---- formulas ----------------------------------------------------------------
 * Per op: INIT(A), STEP(A, a, x) folds element x into accumulator a,
 * MERGE(A, a, b), FIN(A, a), and AUX (1 if it reads a first-pass value).
 * STEP and FIN may use `aux` (this output's first-pass value) and `p`
 * (attribute f0); FIN also `cnt`, the number of elements reduced. Integer
 * sums and products accumulate in uint64_t, so they wrap without UB. */

static inline int rk_nan_f(float v) { return v != v; }
static inline int rk_nan_d(double v) { return v != v; }
static inline int rk_nan_i(int64_t v) { return (void)v, 0; }
#define RK_ISNAN(v) _Generic((v), float: rk_nan_f, double: rk_nan_d, default: rk_nan_i)(v)
#define RK_ABS(v) _Generic((v), float: fabsf, default: fabs)(v)
#define RK_SQRT(v) _Generic((v), float: sqrtf, default: sqrt)(v)
#define RK_EXP(v) _Generic((v), float: ke_vexpf, default: exp)(v) /* vmath.h: vectorizes */
#define RK_LOG(v) _Generic((v), float: logf, default: log)(v)
#define RK_POW(v, e) _Generic((v), float: powf, default: pow)(v, e)
#define RK_LOWEST(A) \
    ((A)_Generic((A)0, float: -INFINITY, double: -INFINITY, int32_t: INT32_MIN, int64_t: INT64_MIN, default: 0))
#define RK_HIGHEST(A) \
    ((A)_Generic((A)0, float: INFINITY, double: INFINITY, int32_t: INT32_MAX, int64_t: INT64_MAX, default: 255))

/* var/std divide by N - correction, never by a negative number (PyTorch) */
static inline double rk_var_div(int64_t n, double correction) {
    double d = (double)n - correction;
    return d > 0 ? d : 0;
}

#define SUM_INIT(A) ((A)0)
#define SUM_STEP(A, a, x) ((a) + (A)(x))
#define SUM_MERGE(A, a, b) ((a) + (b))
#define SUM_FIN(A, a) (a)
#define SUM_AUX 0

#define MEAN_INIT SUM_INIT
#define MEAN_STEP SUM_STEP
#define MEAN_MERGE SUM_MERGE
#define MEAN_FIN(A, a) ((a) / (A)cnt)
#define MEAN_AUX 0

#define PROD_INIT(A) ((A)1)
#define PROD_STEP(A, a, x) ((a) * (A)(x))
#define PROD_MERGE(A, a, b) ((a) * (b))
#define PROD_FIN SUM_FIN
#define PROD_AUX 0

/* max/min keep a NaN once they have seen one: no comparison replaces it */
#define AMAX_INIT(A) RK_LOWEST(A)
#define AMAX_STEP(A, a, x) (((A)(x) > (a) || RK_ISNAN((A)(x))) ? (A)(x) : (a))
#define AMAX_MERGE AMAX_STEP
#define AMAX_FIN SUM_FIN
#define AMAX_AUX 0

#define AMIN_INIT(A) RK_HIGHEST(A)
#define AMIN_STEP(A, a, x) (((A)(x) < (a) || RK_ISNAN((A)(x))) ? (A)(x) : (a))
#define AMIN_MERGE AMIN_STEP
#define AMIN_FIN SUM_FIN
#define AMIN_AUX 0

#define ALL_INIT(A) ((A)1)
#define ALL_STEP(A, a, x) ((A)((a) & ((x) != 0)))
#define ALL_MERGE(A, a, b) ((A)((a) & (b)))
#define ALL_FIN SUM_FIN
#define ALL_AUX 0

#define ANY_INIT(A) ((A)0)
#define ANY_STEP(A, a, x) ((A)((a) | ((x) != 0)))
#define ANY_MERGE(A, a, b) ((A)((a) | (b)))
#define ANY_FIN SUM_FIN
#define ANY_AUX 0

/* second pass of var/std: squared deviations from the first pass's mean */
#define VAR_INIT SUM_INIT
#define VAR_STEP(A, a, x) ((a) + ((A)(x) - aux) * ((A)(x) - aux))
#define VAR_MERGE SUM_MERGE
#define VAR_FIN(A, a) ((a) / rk_var_div(cnt, p))
#define VAR_AUX 1

#define STD_INIT SUM_INIT
#define STD_STEP VAR_STEP
#define STD_MERGE SUM_MERGE
#define STD_FIN(A, a) RK_SQRT(VAR_FIN(A, a))
#define STD_AUX 1

/* second pass of logsumexp: sum of exp(x - max) */
#define LSE_INIT SUM_INIT
#define LSE_STEP(A, a, x) ((a) + RK_EXP((A)(x) - aux))
#define LSE_MERGE SUM_MERGE
#define LSE_FIN(A, a) (RK_LOG(a) + aux)
#define LSE_AUX 1

/* vector norms by p: 2, 1, inf, -inf, 0 (count of non-zeros), any other */
#define NRM2_INIT SUM_INIT
#define NRM2_STEP(A, a, x) ((a) + (A)(x) * (A)(x))
#define NRM2_MERGE SUM_MERGE
#define NRM2_FIN(A, a) RK_SQRT(a)
#define NRM2_AUX 0

#define NRM1_INIT SUM_INIT
#define NRM1_STEP(A, a, x) ((a) + RK_ABS((A)(x)))
#define NRM1_MERGE SUM_MERGE
#define NRM1_FIN SUM_FIN
#define NRM1_AUX 0

#define NRMI_INIT SUM_INIT
#define NRMI_STEP(A, a, x) AMAX_STEP(A, a, RK_ABS((A)(x)))
#define NRMI_MERGE AMAX_STEP
#define NRMI_FIN SUM_FIN
#define NRMI_AUX 0

#define NRMNI_INIT AMIN_INIT
#define NRMNI_STEP(A, a, x) AMIN_STEP(A, a, RK_ABS((A)(x)))
#define NRMNI_MERGE AMIN_STEP
#define NRMNI_FIN SUM_FIN
#define NRMNI_AUX 0

#define NRM0_INIT SUM_INIT
#define NRM0_STEP(A, a, x) ((a) + (A)((x) != 0))
#define NRM0_MERGE SUM_MERGE
#define NRM0_FIN SUM_FIN
#define NRM0_AUX 0

#define NRMP_INIT SUM_INIT
#define NRMP_STEP(A, a, x) ((a) + RK_POW(RK_ABS((A)(x)), (A)p))
#define NRMP_MERGE SUM_MERGE
#define NRMP_FIN(A, a) RK_POW(a, (A)(1.0 / p))
#define NRMP_AUX 0

/* max/min with positions: a NaN beats any number, the first position wins ties */
#define ARGMAX_BETTER(a, b) ((a) > (b) || (RK_ISNAN(a) && !RK_ISNAN(b)))
#define ARGMIN_BETTER(a, b) ((a) < (b) || (RK_ISNAN(a) && !RK_ISNAN(b)))
#define RK_SAME(a, b) ((a) == (b) || (RK_ISNAN(a) && RK_ISNAN(b)))

/* ---- kernel generators ------------------------------------------------------- */

/* Lanes of a row fold: 256 bytes of accumulators, enough independent chains
 * to hide the add latency with AVX-512. */
#define RK_LANES(A) ((int)(256 / sizeof(A)))

#define RK_VALUE_OP(OP, sfx, T, A, R, VDT)                                                            \
    static void OP##_init_##sfx(void *acc_, int64_t n) {                                              \
        A *acc = acc_;                                                                                \
        for (int64_t j = 0; j < n; j++) acc[j] = OP##_INIT(A);                                        \
    }                                                                                                 \
    static void OP##_row_##sfx(void *acc_, const void *x_, int64_t n, int64_t i0, const void *aux_,   \
                               const ke_attrs *at) {                                                  \
        enum { L = RK_LANES(A) };                                                                     \
        const T *restrict x = x_;                                                                     \
        const A aux = OP##_AUX ? *(const A *)aux_ : (A)0;                                             \
        const double p = ke_attr_reduce_param(at);                                                                  \
        A l[L], a;                                                                                    \
        int64_t i = 0;                                                                                \
        (void)i0, (void)aux, (void)p;                                                                 \
        a = *(A *)acc_;                                                                               \
        if (n >= L) { /* short runs skip the lanes */                                                 \
            for (int j = 0; j < L; j++) l[j] = OP##_INIT(A);                                          \
            for (; i + L <= n; i += L)                                                                \
                for (int j = 0; j < L; j++) l[j] = OP##_STEP(A, l[j], x[i + j]);                      \
            for (int w = L / 2; w > 0; w /= 2)                                                        \
                for (int j = 0; j < w; j++) l[j] = OP##_MERGE(A, l[j], l[j + w]);                     \
            a = OP##_MERGE(A, a, l[0]);                                                               \
        }                                                                                             \
        for (; i < n; i++) a = OP##_STEP(A, a, x[i]);                                                 \
        *(A *)acc_ = a;                                                                               \
    }                                                                                                 \
    static void OP##_cols_##sfx(void *acc_, const void *x_, int64_t n, int64_t m, int64_t xs,         \
                                int64_t i0, const void *aux_, const ke_attrs *at) {                   \
        A *restrict acc = acc_;                                                                       \
        const A *restrict auxv = aux_;                                                                \
        const double p = ke_attr_reduce_param(at);                                                                  \
        (void)i0, (void)p, (void)auxv;                                                                \
        for (int64_t r = 0; r < m; r++) {                                                             \
            const T *restrict x = (const T *)x_ + r * xs;                                             \
            for (int64_t j = 0; j < n; j++) {                                                         \
                const A aux = OP##_AUX ? auxv[j] : (A)0;                                              \
                (void)aux;                                                                            \
                acc[j] = OP##_STEP(A, acc[j], x[j]);                                                  \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    static void OP##_merge_##sfx(void *a_, const void *b_, int64_t n) {                               \
        A *restrict a = a_;                                                                           \
        const A *restrict b = b_;                                                                     \
        for (int64_t j = 0; j < n; j++) a[j] = OP##_MERGE(A, a[j], b[j]);                             \
    }                                                                                                 \
    static void OP##_fin_##sfx(void *v_, int64_t *idx, const void *acc_, int64_t n, int64_t cnt,      \
                               const void *aux_, const ke_attrs *at) {                                \
        R *restrict v = v_;                                                                           \
        const A *restrict acc = acc_;                                                                 \
        const A *restrict auxv = aux_;                                                                \
        const double p = ke_attr_reduce_param(at);                                                                  \
        (void)idx, (void)cnt, (void)p, (void)auxv;                                                    \
        for (int64_t j = 0; j < n; j++) {                                                             \
            const A aux = OP##_AUX ? auxv[j] : (A)0;                                                  \
            (void)aux;                                                                                \
            v[j] = (R)(OP##_FIN(A, acc[j]));                                                          \
        }                                                                                             \
    }                                                                                                 \
    static const ke_rd_kernel OP##_k_##sfx = {OP##_init_##sfx,  OP##_row_##sfx, OP##_cols_##sfx,         \
                                           OP##_merge_##sfx, OP##_fin_##sfx, sizeof(A), VDT};

/* Accumulator: the best value and its position (i < 0: nothing seen yet).
 * row finds the best value with a lane fold, then its first position. */
#define RK_INDEX_OP(OP, sfx, T, VDT)                                                                  \
    typedef struct OP##_acc_##sfx {                                                                   \
        T v;                                                                                          \
        int64_t i;                                                                                    \
    } OP##_acc_##sfx;                                                                                 \
    static inline void OP##_take_##sfx(OP##_acc_##sfx *a, T v, int64_t i) {                           \
        if (a->i < 0 || OP##_BETTER(v, a->v) || (RK_SAME(v, a->v) && i < a->i)) {                     \
            a->v = v;                                                                                 \
            a->i = i;                                                                                 \
        }                                                                                             \
    }                                                                                                 \
    static void OP##_init_##sfx(void *acc_, int64_t n) {                                              \
        OP##_acc_##sfx *acc = acc_;                                                                   \
        for (int64_t j = 0; j < n; j++) acc[j] = (OP##_acc_##sfx){0, -1};                             \
    }                                                                                                 \
    static void OP##_row_##sfx(void *acc_, const void *x_, int64_t n, int64_t i0, const void *aux_,   \
                               const ke_attrs *at) {                                                  \
        enum { L = RK_LANES(T) > 64 ? 64 : RK_LANES(T) };                                             \
        const T *restrict x = x_;                                                                     \
        T best;                                                                                       \
        int64_t i = 1;                                                                                \
        (void)aux_, (void)at;                                                                         \
        if (n <= 0) return;                                                                           \
        best = x[0];                                                                                  \
        if (n >= L) {                                                                                 \
            T l[L];                                                                                   \
            for (int j = 0; j < L; j++) l[j] = x[j];                                                  \
            for (i = L; i + L <= n; i += L)                                                           \
                for (int j = 0; j < L; j++) l[j] = OP##_BETTER(x[i + j], l[j]) ? x[i + j] : l[j];     \
            for (int w = L / 2; w > 0; w /= 2)                                                        \
                for (int j = 0; j < w; j++) l[j] = OP##_BETTER(l[j + w], l[j]) ? l[j + w] : l[j];     \
            best = l[0];                                                                              \
        }                                                                                             \
        for (; i < n; i++) best = OP##_BETTER(x[i], best) ? x[i] : best;                              \
        for (i = 0; i + L <= n; i += L) { /* skip blocks without it, vectorized */                    \
            int hit = 0;                                                                              \
            for (int j = 0; j < L; j++) hit |= RK_SAME(x[i + j], best);                               \
            if (hit) break;                                                                           \
        }                                                                                             \
        for (; i < n - 1 && !RK_SAME(x[i], best); i++) {                                              \
        }                                                                                             \
        OP##_take_##sfx(acc_, best, i0 + i);                                                          \
    }                                                                                                 \
    static void OP##_cols_##sfx(void *acc_, const void *x_, int64_t n, int64_t m, int64_t xs,         \
                                int64_t i0, const void *aux_, const ke_attrs *at) {                   \
        OP##_acc_##sfx *restrict acc = acc_;                                                          \
        (void)aux_, (void)at;                                                                         \
        for (int64_t r = 0; r < m; r++) {                                                             \
            const T *restrict x = (const T *)x_ + r * xs;                                             \
            for (int64_t j = 0; j < n; j++)                                                           \
                if (acc[j].i < 0 || OP##_BETTER(x[j], acc[j].v)) acc[j] = (OP##_acc_##sfx){x[j], i0 + r}; \
        }                                                                                             \
    }                                                                                                 \
    static void OP##_merge_##sfx(void *a_, const void *b_, int64_t n) {                               \
        OP##_acc_##sfx *a = a_;                                                                       \
        const OP##_acc_##sfx *b = b_;                                                                 \
        for (int64_t j = 0; j < n; j++)                                                               \
            if (b[j].i >= 0) OP##_take_##sfx(&a[j], b[j].v, b[j].i);                                  \
    }                                                                                                 \
    static void OP##_fin_##sfx(void *v_, int64_t *idx, const void *acc_, int64_t n, int64_t cnt,      \
                               const void *aux_, const ke_attrs *at) {                                \
        T *v = v_;                                                                                    \
        const OP##_acc_##sfx *acc = acc_;                                                             \
        (void)cnt, (void)aux_, (void)at;                                                              \
        for (int64_t j = 0; j < n; j++) {                                                             \
            v[j] = acc[j].v;                                                                          \
            idx[j] = acc[j].i;                                                                        \
        }                                                                                             \
    }                                                                                                 \
    _Static_assert(sizeof(OP##_acc_##sfx) <= KE_RD_ACC_MAX, "accumulator size");                         \
    static const ke_rd_kernel OP##_k_##sfx = {OP##_init_##sfx,  OP##_row_##sfx, OP##_cols_##sfx,         \
                                           OP##_merge_##sfx, OP##_fin_##sfx, sizeof(OP##_acc_##sfx),  \
                                           VDT};

/* Loop dtypes of each kind of op: X(OP, suffix, input T, accumulator A, result R, dtype of R). */
#define RK_TYPES_SUM(X, OP)                                                                 \
    X(OP, f32, float, float, float, KL_F32) X(OP, f64, double, double, double, KL_F64)      \
    X(OP, i32, int32_t, uint64_t, int64_t, KL_I64) X(OP, i64, int64_t, uint64_t, int64_t, KL_I64) \
    X(OP, u8, uint8_t, uint64_t, int64_t, KL_I64)
#define RK_TYPES_SAME(X, OP)                                                                \
    X(OP, f32, float, float, float, KL_F32) X(OP, f64, double, double, double, KL_F64)      \
    X(OP, i32, int32_t, int32_t, int32_t, KL_I32) X(OP, i64, int64_t, int64_t, int64_t, KL_I64) \
    X(OP, u8, uint8_t, uint8_t, uint8_t, KL_U8)
#define RK_TYPES_BOOL(X, OP)                                                                \
    X(OP, f32, float, uint8_t, uint8_t, KL_BOOL) X(OP, f64, double, uint8_t, uint8_t, KL_BOOL) \
    X(OP, i32, int32_t, uint8_t, uint8_t, KL_BOOL) X(OP, i64, int64_t, uint8_t, uint8_t, KL_BOOL) \
    X(OP, u8, uint8_t, uint8_t, uint8_t, KL_BOOL)
#define RK_TYPES_FLOAT(X, OP) X(OP, f32, float, float, float, KL_F32) X(OP, f64, double, double, double, KL_F64)
/* var/std accumulate in double, as PyTorch's CPU kernels do */
#define RK_TYPES_DOUBLE(X, OP) X(OP, f32, float, double, double, KL_F64) X(OP, f64, double, double, double, KL_F64)
#define RK_TYPES_INDEX(X, OP)                                                               \
    X(OP, f32, float, KL_F32) X(OP, f64, double, KL_F64) X(OP, i32, int32_t, KL_I32)        \
    X(OP, i64, int64_t, KL_I64) X(OP, u8, uint8_t, KL_U8)

RK_TYPES_SUM(RK_VALUE_OP, SUM)
RK_TYPES_SUM(RK_VALUE_OP, PROD)
RK_TYPES_FLOAT(RK_VALUE_OP, MEAN)
RK_VALUE_OP(MEAN, f32d, float, double, double, KL_F64) /* var's first pass */
RK_TYPES_SAME(RK_VALUE_OP, AMAX)
RK_TYPES_SAME(RK_VALUE_OP, AMIN)
RK_TYPES_BOOL(RK_VALUE_OP, ALL)
RK_TYPES_BOOL(RK_VALUE_OP, ANY)
RK_TYPES_DOUBLE(RK_VALUE_OP, VAR)
RK_TYPES_DOUBLE(RK_VALUE_OP, STD)
RK_TYPES_FLOAT(RK_VALUE_OP, LSE)
RK_TYPES_FLOAT(RK_VALUE_OP, NRM2)
RK_TYPES_FLOAT(RK_VALUE_OP, NRM1)
RK_TYPES_FLOAT(RK_VALUE_OP, NRMI)
RK_TYPES_FLOAT(RK_VALUE_OP, NRMNI)
RK_TYPES_FLOAT(RK_VALUE_OP, NRM0)
RK_TYPES_FLOAT(RK_VALUE_OP, NRMP)
RK_TYPES_INDEX(RK_INDEX_OP, ARGMAX)
RK_TYPES_INDEX(RK_INDEX_OP, ARGMIN)

#define RK_ALL5(OP) \
    {[KL_F32] = &OP##_k_f32, [KL_F64] = &OP##_k_f64, [KL_I32] = &OP##_k_i32, [KL_I64] = &OP##_k_i64, [KL_U8] = &OP##_k_u8}
#define RK_FLOAT2(OP) {[KL_F32] = &OP##_k_f32, [KL_F64] = &OP##_k_f64}

const ke_rd_op ke_rd_sum = {.k = RK_ALL5(SUM), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_prod = {.k = RK_ALL5(PROD), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_mean = {.k = RK_FLOAT2(MEAN), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_amax = {.k = RK_ALL5(AMAX), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_amin = {.k = RK_ALL5(AMIN), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_all = {.k = RK_ALL5(ALL), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_any = {.k = RK_ALL5(ANY), .vout = 0, .iout = -1};
const ke_rd_op ke_rd_max_dim = {.k = RK_ALL5(ARGMAX), .ordered = 1, .vout = 0, .iout = 1};
const ke_rd_op ke_rd_min_dim = {.k = RK_ALL5(ARGMIN), .ordered = 1, .vout = 0, .iout = 1};
const ke_rd_op ke_rd_argmax = {.k = RK_ALL5(ARGMAX), .ordered = 1, .vout = -1, .iout = 0};
const ke_rd_op ke_rd_argmin = {.k = RK_ALL5(ARGMIN), .ordered = 1, .vout = -1, .iout = 0};
static const ke_rd_op rk_var_mean = {.k = {[KL_F32] = &MEAN_k_f32d, [KL_F64] = &MEAN_k_f64}, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_var = {.k = RK_FLOAT2(VAR), .pre = &rk_var_mean, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_std = {.k = RK_FLOAT2(STD), .pre = &rk_var_mean, .vout = 0, .iout = -1};
const ke_rd_op ke_rd_logsumexp = {
    .k = RK_FLOAT2(LSE), .pre = &ke_rd_amax, .pre_inf_to_zero = 1, .vout = 0, .iout = -1};
static const ke_rd_op rk_norm2 = {.k = RK_FLOAT2(NRM2), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm1 = {.k = RK_FLOAT2(NRM1), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm_inf = {.k = RK_FLOAT2(NRMI), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm_ninf = {.k = RK_FLOAT2(NRMNI), .vout = 0, .iout = -1};
static const ke_rd_op rk_norm0 = {.k = RK_FLOAT2(NRM0), .vout = 0, .iout = -1};
static const ke_rd_op rk_normp = {.k = RK_FLOAT2(NRMP), .vout = 0, .iout = -1};

const ke_rd_op *ke_rd_norm_op(double p) {
    if (p == 2) return &rk_norm2;
    if (p == 1) return &rk_norm1;
    if (p == 0) return &rk_norm0;
    if (p == INFINITY) return &rk_norm_inf;
    if (p == -INFINITY) return &rk_norm_ninf;
    return &rk_normp;
}

/* ---- shape and dtype rule ---------------------------------------------------------- */

/* The dtype the loops read: f16/bf16 as f32, bool as u8. */
static kl_dtype rk_loop_dtype(kl_dtype d) { return d == KL_BOOL ? KL_U8 : ke_compute_dtype(d); }

int ke_infer_rd(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    kl_dtype xd = (kl_dtype)x->dtype, od = xd;
    int op = c->op, float_only = 0, no_identity = 0;
    char b[256];
    switch (op) {
    case KE_OP_sum:
    case KE_OP_prod: od = ke_is_float(xd) ? xd : KL_I64; break;
    case KE_OP_mean:
    case KE_OP_var:
    case KE_OP_std:
    case KE_OP_norm:
        if (!ke_is_float(xd))
            return ke_err(KL_ERR_DTYPE, ke_opname(c), "expects a floating-point input, got %s",
                          ke_fmt_tensor(b, sizeof b, x));
        float_only = 1;
        no_identity = op == KE_OP_norm && (ke_attr_norm_p(&c->a) < 0 || ke_attr_norm_p(&c->a) == INFINITY);
        break;
    case KE_OP_logsumexp: /* integers promote, as torch.logsumexp does */
        od = ke_is_float(xd) ? xd : kl_get_default_dtype();
        float_only = 1;
        break;
    case KE_OP_argmax:
    case KE_OP_argmin:
        if (xd == KL_BOOL)
            return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for bool input %s", ke_fmt_tensor(b, sizeof b, x));
        od = KL_I64;
        no_identity = 1;
        break;
    case KE_OP_all:
    case KE_OP_any: od = xd == KL_U8 ? KL_U8 : KL_BOOL; break; /* uint8 stays uint8, as in PyTorch */
    default: no_identity = 1; break;                          /* amax, amin, max_dim, min_dim */
    }
    if (ke_infer_reduce(c, out) < 0) return -1;
    out->dtype = od;
    c->compute = float_only ? ke_compute_dtype(od) : rk_loop_dtype(xd);
    if (no_identity) {
        /* max, min and the inf and negative norms have no value for an empty reduction */
        uint32_t mask;
        if (ke_reduce_mask(c, x->ndim, &mask)) return -1;
        int64_t numel = ke_numel(x->ndim, x->shape);
        if (ke_attr_dims_len(&c->a) == 0 && numel == 0)
            return op == KE_OP_norm
                       ? ke_err(KL_ERR_SHAPE, ke_opname(c),
                                "cannot compute the %g norm of an empty tensor %s: the operation has no identity",
                                ke_attr_norm_p(&c->a), ke_fmt_tensor(b, sizeof b, x))
                       : ke_err(KL_ERR_SHAPE, ke_opname(c),
                                "expected a reduction dim to be specified for an input with 0 elements %s",
                                ke_fmt_tensor(b, sizeof b, x));
        for (int d = 0; d < x->ndim; d++)
            if ((mask >> d & 1) && x->shape[d] == 0)
                return op == KE_OP_norm
                           ? ke_err(KL_ERR_SHAPE, ke_opname(c),
                                    "cannot compute the %g norm over dim %d of %s, which is empty: the "
                                    "operation has no identity",
                                    ke_attr_norm_p(&c->a), d, ke_fmt_tensor(b, sizeof b, x))
                           : ke_err(KL_ERR_SHAPE, ke_opname(c),
                                    "expected reduction dim %d to have non-zero size, input %s", d,
                                    ke_fmt_tensor(b, sizeof b, x));
    }
    if (ke_ops[op].nout == 2) {
        out[1] = out[0];
        out[1].dtype = KL_I64;
    }
    return ke_ops[op].nout;
}

/* ---- public wrappers ------------------------------------------------------------------ */

/* param: var's and std's correction, norm's p; 0 for the others. The
 * reduction loops read it as the common reduce_param. */
_Static_assert(KE_ATTR_SAME_SLOT(var_correction, reduce_param) &&
                   KE_ATTR_SAME_SLOT(norm_p, reduce_param),
               "the reduction loops' scalar");
static kl_tensor *rk_reduce(int op, kl_tensor *x, int ndims, const int64_t *dims, bool keepdim, double param) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    if (ke_check_tensor(x, ke_ops[op].name, 1) || ke_set_list(&c, ndims, dims)) return NULL;
    ke_attr_set_keepdim(&c.a, keepdim);
    ke_attr_set_reduce_param(&c.a, param);
    return ke_call1(&c);
}

kl_tensor *kl_sum(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_sum, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_mean(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_mean, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_prod(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_prod, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_amax(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_amax, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_amin(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_amin, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_var(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return rk_reduce(KE_OP_var, x, ndims, dims, keepdim, correction);
}
kl_tensor *kl_std(kl_tensor *x, int ndims, const int64_t *dims, double correction, bool keepdim) {
    return rk_reduce(KE_OP_std, x, ndims, dims, keepdim, correction);
}
kl_tensor *kl_logsumexp(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_logsumexp, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_norm(kl_tensor *x, double p, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_norm, x, ndims, dims, keepdim, p);
}
kl_tensor *kl_all(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_all, x, ndims, dims, keepdim, 0);
}
kl_tensor *kl_any(kl_tensor *x, int ndims, const int64_t *dims, bool keepdim) {
    return rk_reduce(KE_OP_any, x, ndims, dims, keepdim, 0);
}

kl_tensor *kl_argmax(kl_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return rk_reduce(KE_OP_argmax, x, dim == KL_DIM_NONE ? 0 : 1, &d, keepdim, 0);
}
kl_tensor *kl_argmin(kl_tensor *x, int dim, bool keepdim) {
    int64_t d = dim;
    return rk_reduce(KE_OP_argmin, x, dim == KL_DIM_NONE ? 0 : 1, &d, keepdim, 0);
}

static int rk_minmax_dim(int op, kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!values || !indices) return ke_err(KL_ERR_NULL_ARG, ke_ops[op].name, "values and indices must not be NULL");
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    int64_t d = dim;
    ke_set_list(&c, 1, &d);
    ke_attr_set_keepdim(&c.a, keepdim);
    if (ke_dispatch(&c)) return -1;
    *values = c.out[0];
    *indices = c.out[1];
    return 0;
}

int kl_max_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    return rk_minmax_dim(KE_OP_max_dim, x, dim, keepdim, values, indices);
}
int kl_min_dim(kl_tensor *x, int dim, bool keepdim, kl_tensor **values, kl_tensor **indices) {
    return rk_minmax_dim(KE_OP_min_dim, x, dim, keepdim, values, indices);
}
