/* rd_formulas.h — the reductions' formulas (reduce_ops.c's kernels, nn.c's
 * softmax and norm rows): per op INIT(A), STEP(A, a, x), MERGE(A, a, b),
 * FIN(A, a) and AUX, written once. */
#ifndef KE_RD_FORMULAS_H
#define KE_RD_FORMULAS_H
#include "vmath.h"

#include <math.h>
#include <stdint.h>

/* ---- formulas ----------------------------------------------------------------
 * Per op: INIT(A), STEP(A, a, x) folds element x into accumulator a,
 * MERGE(A, a, b), FIN(A, a), and AUX (1 if it reads a first-pass value).
 * STEP and FIN may use `aux` (this output's first-pass value) and `p`
 * (attribute f0); FIN also `cnt`, the number of elements reduced. Integer
 * sums and products accumulate in uint64_t, so they wrap without UB. */

#ifdef __cplusplus
/* C++ (the CUDA device build of these formulas, src/codegen_nvrtc/cn_emit.c):
 * overloads in place of _Generic, choosing the same functions by type. */
template <typename T> static inline int rk_isnan_(T v) { return v != v; }
static inline float rk_abs_(float v) { return fabsf(v); }
static inline double rk_abs_(double v) { return fabs(v); }
static inline float rk_sqrt_(float v) { return sqrtf(v); }
static inline double rk_sqrt_(double v) { return sqrt(v); }
static inline float rk_exp_(float v) { return ke_vexpf(v); }
static inline double rk_exp_(double v) { return exp(v); }
static inline float rk_log_(float v) { return ke_vlogf(v); }
static inline double rk_log_(double v) { return log(v); }
static inline float rk_pow_(float v, float e) { return ke_vpowf(v, e); }
static inline double rk_pow_(double v, double e) { return pow(v, e); }
template <typename T> static inline T rk_lowest_(T) { return 0; }
static inline float rk_lowest_(float) { return -INFINITY; }
static inline double rk_lowest_(double) { return -INFINITY; }
static inline int32_t rk_lowest_(int32_t) { return INT32_MIN; }
static inline int64_t rk_lowest_(int64_t) { return INT64_MIN; }
template <typename T> static inline T rk_highest_(T) { return 255; }
static inline float rk_highest_(float) { return INFINITY; }
static inline double rk_highest_(double) { return INFINITY; }
static inline int32_t rk_highest_(int32_t) { return INT32_MAX; }
static inline int64_t rk_highest_(int64_t) { return INT64_MAX; }
#define RK_ISNAN(v) rk_isnan_(v)
#define RK_ABS(v) rk_abs_(v)
#define RK_SQRT(v) rk_sqrt_(v)
#define RK_EXP(v) rk_exp_(v)
#define RK_LOG(v) rk_log_(v)
#define RK_POW(v, e) rk_pow_(v, e)
#define RK_LOWEST(A) rk_lowest_((A)0)
#define RK_HIGHEST(A) rk_highest_((A)0)
#else
static inline int rk_nan_f(float v) { return v != v; }
static inline int rk_nan_d(double v) { return v != v; }
static inline int rk_nan_i(int64_t v) { return (void)v, 0; }
#define RK_ISNAN(v) _Generic((v), float: rk_nan_f, double: rk_nan_d, default: rk_nan_i)(v)
#define RK_ABS(v) _Generic((v), float: fabsf, default: fabs)(v)
#define RK_SQRT(v) _Generic((v), float: sqrtf, default: sqrt)(v)
#define RK_EXP(v) _Generic((v), float: ke_vexpf, default: exp)(v) /* vmath.h: vectorizes */
#define RK_LOG(v) _Generic((v), float: ke_vlogf, default: log)(v)
#define RK_POW(v, e) _Generic((v), float: ke_vpowf, default: pow)(v, e) /* f32: vmath, as the elementwise pow */
#define RK_LOWEST(A) \
    ((A)_Generic((A)0, float: -INFINITY, double: -INFINITY, int32_t: INT32_MIN, int64_t: INT64_MIN, default: 0))
#define RK_HIGHEST(A) \
    ((A)_Generic((A)0, float: INFINITY, double: INFINITY, int32_t: INT32_MAX, int64_t: INT64_MAX, default: 255))
#endif

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
#endif
