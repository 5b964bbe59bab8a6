/*
 * test_ew.c — the elementwise ops (ew_unary.c, ew_binary.c, ew_other.c):
 * values against PyTorch 1.13 (tables computed once with torch and pasted
 * here), the result dtype of every op for every input dtype and its in-place
 * form, broadcasting, strided, zero-size and Meta inputs, the C-scalar forms
 * and their promotion, every error path with its message, and an accuracy
 * sweep of the f32 math functions (vmath.h) against f64 libm.
 */
#include "harness.h"

#include <float.h>
#include <stdlib.h>

typedef kl_tensor *(*unary_fn)(kl_tensor *);
typedef kl_tensor *(*binary_fn)(kl_tensor *, kl_tensor *);
typedef kl_tensor *(*scalar_fn)(kl_tensor *, double);

typedef struct unary_case {
    const char *name;
    unary_fn fn;
    double f32[17], f64[17];
} unary_case;
typedef struct unary_int_case {
    const char *name;
    unary_fn fn;
    kl_dtype dt; /* KL_NUM_DTYPES: refused */
    double v[7];
} unary_int_case;
typedef struct binary_case {
    const char *name;
    binary_fn fn;
    double f32[16], f64[16];
} binary_case;
typedef struct binary_int_case {
    const char *name;
    binary_fn fn;
    kl_dtype dt;
    double v[10];
} binary_int_case;
/* Result dtypes as letters (f d h b i l u ? for the dtypes in all_dtypes
 * order, E for an error): unary ops one per input dtype; binary ops 64 for
 * tensor pairs (row = first operand) then, per first dtype, the C scalars 2
 * and 2.5. */
typedef struct dtype_case {
    const char *name;
    unary_fn u, u_inplace;
    binary_fn b, b_inplace;
    scalar_fn s, s_inplace;
    const char *codes;
} dtype_case;

#define UC(name, ...) {#name, kl_##name, __VA_ARGS__}
#define UIC(name, ...) {#name, kl_##name, __VA_ARGS__}
#define BC(name, ...) {#name, kl_##name, __VA_ARGS__}
#define BIC(name, ...) {#name, kl_##name, __VA_ARGS__}
#define UD(name, codes) {#name, kl_##name, kl_##name##_inplace, NULL, NULL, NULL, NULL, codes}
#define UDP(name, codes) {#name, kl_##name, NULL, NULL, NULL, NULL, NULL, codes}
#define BD(name, codes) \
    {#name, NULL, NULL, kl_##name, kl_##name##_inplace, kl_##name##_scalar, kl_##name##_scalar_inplace, codes}

static const kl_dtype all_dtypes[8] = {KL_F32, KL_F64, KL_F16, KL_BF16, KL_I32, KL_I64, KL_U8, KL_BOOL};

/* ---- expectations computed with torch 1.13 ----------------------------------------- */

/* inputs */
static const double ux[] = {-INFINITY, -100, -20.5, -3, -1, -0.5, -0.0, 0, 1e-08, 0.5, 1, 2.5, 3.5, 30, 100, INFINITY, NAN};
static const unary_case unary_cases[] = {
    UC(neg, {INFINITY, 100, 20.5, 3, 1, 0.5, 0, -0.0, -9.99999994e-09, -0.5, -1, -2.5, -3.5, -30, -100, -INFINITY, NAN},
       {INFINITY, 100, 20.5, 3, 1, 0.5, 0, -0.0, -1e-08, -0.5, -1, -2.5, -3.5, -30, -100, -INFINITY, NAN}),
    UC(abs, {INFINITY, 100, 20.5, 3, 1, 0.5, 0, 0, 9.99999994e-09, 0.5, 1, 2.5, 3.5, 30, 100, INFINITY, NAN},
       {INFINITY, 100, 20.5, 3, 1, 0.5, 0, 0, 1e-08, 0.5, 1, 2.5, 3.5, 30, 100, INFINITY, NAN}),
    UC(sign, {-1, -1, -1, -1, -1, -1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0},
       {-1, -1, -1, -1, -1, -1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0}),
    UC(exp, {0, 3.78350585e-44, 1.25015287e-09, 0.0497870669, 0.36787945, 0.606530666, 1, 1, 1, 1.64872122, 2.71828175, 12.1824942, 33.1154518, 1.06864742e+13, INFINITY, INFINITY, NAN},
       {0, 3.7200759760208361e-44, 1.2501528663867428e-09, 0.049787068367863944, 0.36787944117144233, 0.60653065971263342, 1, 1, 1.0000000099999999, 1.6487212707001282, 2.7182818284590451, 12.182493960703473, 33.115451958692312, 10686474581524.463, 2.6881171418161356e+43, INFINITY, NAN}),
    UC(exp2, {0, 7.88860905e-31, 6.74349565e-07, 0.125, 0.5, 0.707106769, 1, 1, 1, 1.41421354, 2, 5.65685415, 11.3137083, 1.07374182e+09, 1.2676506e+30, INFINITY, NAN},
       {0, 7.8886090522101181e-31, 6.7434957617430455e-07, 0.125, 0.5, 0.70710678118654757, 1, 1, 1.0000000069314718, 1.4142135623730951, 2, 5.6568542494923806, 11.313708498984761, 1073741824, 1.2676506002282294e+30, INFINITY, NAN}),
    UC(expm1, {-1, -1, -1, -0.950212955, -0.63212055, -0.393469334, -0.0, 0, 9.99999994e-09, 0.648721278, 1.71828187, 11.1824942, 32.1154518, 1.06864742e+13, INFINITY, INFINITY, NAN},
       {-1, -1, -0.99999999874984713, -0.95021293163213605, -0.63212055882855767, -0.39346934028736658, -0.0, 0, 1.0000000050000001e-08, 0.64872127070012819, 1.7182818284590453, 11.182493960703473, 32.115451958692312, 10686474581523.463, 2.6881171418161356e+43, INFINITY, NAN}),
    UC(log, {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, -INFINITY, -18.420681, -0.693147182, 0, 0.91629076, 1.25276291, 3.40119743, 4.60517025, INFINITY, NAN},
       {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, -INFINITY, -18.420680743952367, -0.69314718055994529, 0, 0.91629073187415511, 1.2527629684953681, 3.4011973816621555, 4.6051701859880918, INFINITY, NAN}),
    UC(log2, {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, -INFINITY, -26.5754242, -1, 0, 1.32192814, 1.80735493, 4.90689039, 6.64385605, INFINITY, NAN},
       {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, -INFINITY, -26.575424759098897, -1, 0, 1.3219280948873624, 1.8073549220576042, 4.9068905956085187, 6.6438561897747244, INFINITY, NAN}),
    UC(log1p, {NAN, NAN, NAN, NAN, -INFINITY, -0.693147182, -0.0, 0, 9.99999994e-09, 0.405465096, 0.693147182, 1.25276291, 1.50407743, 3.43398714, 4.61512041, INFINITY, NAN},
       {NAN, NAN, NAN, NAN, -INFINITY, -0.69314718055994529, -0.0, 0, 9.999999950000001e-09, 0.40546510810816438, 0.69314718055994529, 1.2527629684953681, 1.5040773967762742, 3.4339872044851463, 4.6151205168412597, INFINITY, NAN}),
    UC(sqrt, {NAN, NAN, NAN, NAN, NAN, NAN, -0.0, 0, 9.99999975e-05, 0.707106769, 1, 1.58113885, 1.87082875, 5.47722578, 10, INFINITY, NAN},
       {NAN, NAN, NAN, NAN, NAN, NAN, -0.0, 0, 0.0001, 0.70710678118654757, 1, 1.5811388300841898, 1.8708286933869707, 5.4772255750516612, 10, INFINITY, NAN}),
    UC(rsqrt, {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, INFINITY, 10000, 1.41421354, 1, 0.632455528, 0.534522474, 0.182574183, 0.100000001, 0, NAN},
       {NAN, NAN, NAN, NAN, NAN, NAN, -INFINITY, INFINITY, 10000, 1.4142135623730949, 1, 0.63245553203367588, 0.53452248382484879, 0.18257418583505536, 0.10000000000000001, 0, NAN}),
    UC(square, {INFINITY, 10000, 420.25, 9, 1, 0.25, 0, 0, 1.00000002e-16, 0.25, 1, 6.25, 12.25, 900, 10000, INFINITY, NAN},
       {INFINITY, 10000, 420.25, 9, 1, 0.25, 0, 0, 1.0000000000000001e-16, 0.25, 1, 6.25, 12.25, 900, 10000, INFINITY, NAN}),
    UC(reciprocal, {-0.0, -0.00999999978, -0.048780486, -0.333333343, -1, -2, -INFINITY, INFINITY, 100000000, 2, 1, 0.400000006, 0.285714298, 0.0333333351, 0.00999999978, 0, NAN},
       {-0.0, -0.01, -0.04878048780487805, -0.33333333333333331, -1, -2, -INFINITY, INFINITY, 100000000, 2, 1, 0.40000000000000002, 0.2857142857142857, 0.033333333333333333, 0.01, 0, NAN}),
    UC(sin, {NAN, 0.506365657, -0.996829808, -0.141120002, -0.841470957, -0.47942555, -0.0, 0, 9.99999994e-09, 0.47942555, 0.841470957, 0.598472118, -0.350783229, -0.988031626, -0.506365657, NAN, NAN},
       {NAN, 0.50636564110975879, -0.99682979427879925, -0.14112000805986721, -0.8414709848078965, -0.47942553860420301, -0.0, 0, 1e-08, 0.47942553860420301, 0.8414709848078965, 0.59847214410395644, -0.35078322768961984, -0.98803162409286183, -0.50636564110975879, NAN, NAN}),
    UC(cos, {NAN, 0.862318873, -0.0795635656, -0.989992499, 0.540302336, 0.87758255, 1, 1, 1, 0.87758255, 0.540302336, -0.801143587, -0.93645668, 0.154251456, 0.862318873, NAN, NAN},
       {NAN, 0.86231887228768389, -0.079563567278540068, -0.98999249660044542, 0.54030230586813977, 0.87758256189037276, 1, 1, 1, 0.87758256189037276, 0.54030230586813977, -0.8011436155469337, -0.93645668729079634, 0.15425144988758405, 0.86231887228768389, NAN, NAN}),
    UC(tan, {NAN, 0.587213933, 12.5287218, 0.142546549, -1.55740774, -0.546302497, -0.0, 0, 9.99999994e-09, 0.546302497, 1.55740774, -0.747022331, 0.374585629, -6.40533113, -0.587213933, NAN, NAN},
       {NAN, 0.58721391515692911, 12.528721729997956, 0.1425465430742778, -1.5574077246549023, -0.54630248984379048, -0.0, 0, 1e-08, 0.54630248984379048, 1.5574077246549023, -0.74702229723866032, 0.37458564015859469, -6.4053311966462756, -0.58721391515692911, NAN, NAN}),
    UC(tanh, {-1, -1, -1, -0.995054781, -0.761594176, -0.462117165, -0.0, 0, 9.99999994e-09, 0.462117165, 0.761594176, 0.986614287, 0.998177886, 1, 1, 1, NAN},
       {-1, -1, -1, -0.99505475368673046, -0.76159415595576485, -0.46211715726000974, -0.0, 0, 1e-08, 0.46211715726000974, 0.76159415595576485, 0.98661429815143031, 0.99817789761119868, 1, 1, 1, NAN}),
    UC(sigmoid, {0, 0, 1.25015287e-09, 0.0474258736, 0.268941432, 0.377540678, 0.5, 0.5, 0.5, 0.622459352, 0.731058598, 0.924141824, 0.970687747, 1, 1, 1, NAN},
       {0, 3.7200759760208356e-44, 1.2501528648238605e-09, 0.047425873177566781, 0.2689414213699951, 0.37754066879814541, 0.5, 0.5, 0.50000000249999998, 0.62245933120185459, 0.7310585786300049, 0.92414181997875655, 0.97068776924864364, 0.99999999999990652, 1, 1, NAN}),
    UC(relu, {0, 0, 0, 0, 0, 0, -0.0, 0, 9.99999994e-09, 0.5, 1, 2.5, 3.5, 30, 100, INFINITY, NAN},
       {0, 0, 0, 0, 0, 0, -0.0, 0, 1e-08, 0.5, 1, 2.5, 3.5, 30, 100, INFINITY, NAN}),
    UC(gelu, {NAN, 0, 0, -0.00404986739, -0.158655286, -0.154268786, 0, 0, 4.99999997e-09, 0.345731199, 0.841344714, 2.48447585, 3.49918556, 30, 100, INFINITY, NAN},
       {NAN, -0.0, -0.0, -0.0040496940948903104, -0.15865525393145702, -0.15426876936299344, -0.0, 0, 5.0000000398942279e-09, 0.34573123063700656, 0.84134474606854304, 2.4844758366855597, 3.4991857982233756, 30, 100, INFINITY, NAN}),
    UC(gelu_tanh, {NAN, -0.0, -0.0, -0.00363743305, -0.158807993, -0.154285997, -0.0, 0, 4.99999997e-09, 0.345714003, 0.841192007, 2.48491573, 3.49938369, 30, 100, INFINITY, NAN},
       {NAN, -0.0, -0.0, -0.0036373920817729943, -0.15880800939172329, -0.15428599017485606, -0.0, 0, 5.0000000398942279e-09, 0.34571400982514394, 0.84119199060827676, 2.4849157339100012, 3.4993838023446262, 30, 100, INFINITY, NAN}),
    UC(silu, {NAN, -0.0, -2.56281325e-08, -0.142277613, -0.268941432, -0.188770339, -0.0, 0, 4.99999997e-09, 0.311229676, 0.731058598, 2.31035447, 3.39740729, 30, 100, INFINITY, NAN},
       {NAN, -3.7200759760208357e-42, -2.5628133728889141e-08, -0.14227761953270035, -0.2689414213699951, -0.1887703343990727, -0.0, 0, 5.0000000249999997e-09, 0.3112296656009273, 0.7310585786300049, 2.3103545499468914, 3.3974071923702525, 29.999999999997197, 100, INFINITY, NAN}),
    UC(softplus, {0, 3.9236357e-44, 1.25015287e-09, 0.048587352, 0.313261688, 0.474076986, 0.693147182, 0.693147182, 0.693147182, 0.974076986, 1.31326163, 2.57888985, 3.52975035, 30, 100, INFINITY, NAN},
       {0, 3.7200759760208361e-44, 1.2501528656053017e-09, 0.048587351573742062, 0.31326168751822286, 0.47407698418010669, 0.69314718055994529, 0.69314718055994529, 0.69314718555994526, 0.97407698418010669, 1.3132616875182228, 2.5788897342925496, 3.5297504182726205, 30, 100, INFINITY, NAN}),
    UC(erf, {-1, -1, -1, -0.999977887, -0.842700779, -0.520499885, -0.0, 0, 1.12837917e-08, 0.520499885, 0.842700779, 0.999593019, 0.999999285, 1, 1, 1, NAN},
       {-1, -1, -1, -0.99997790950300136, -0.84270079294971489, -0.52049987781304652, -0.0, 0, 1.1283791670955126e-08, 0.52049987781304652, 0.84270079294971489, 0.99959304798255499, 0.99999925690162761, 1, 1, 1, NAN}),
    UC(floor, {-INFINITY, -100, -21, -3, -1, -1, -0.0, 0, 0, 0, 1, 2, 3, 30, 100, INFINITY, NAN},
       {-INFINITY, -100, -21, -3, -1, -1, -0.0, 0, 0, 0, 1, 2, 3, 30, 100, INFINITY, NAN}),
    UC(ceil, {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 1, 1, 1, 3, 4, 30, 100, INFINITY, NAN},
       {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 1, 1, 1, 3, 4, 30, 100, INFINITY, NAN}),
    UC(round, {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 4, 30, 100, INFINITY, NAN},
       {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 4, 30, 100, INFINITY, NAN}),
    UC(trunc, {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 3, 30, 100, INFINITY, NAN},
       {-INFINITY, -100, -20, -3, -1, -0.0, -0.0, 0, 0, 0, 1, 2, 3, 30, 100, INFINITY, NAN}),
    UC(logical_not, {0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0},
       {0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
    UC(isnan, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}),
    UC(isinf, {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
       {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}),
    UC(isfinite, {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
       {0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}),
};
static const int32_t ix[] = {INT32_MIN, -7, -1, 0, 1, 5, 2147483647};
static const unary_int_case unary_int_cases[] = {
    UIC(neg, KL_I32, {-2147483648, 7, 1, 0, -1, -5, -2147483647}),
    UIC(abs, KL_I32, {-2147483648, 7, 1, 0, 1, 5, 2147483647}),
    UIC(sign, KL_I32, {-1, -1, -1, 0, 1, 1, 1}),
    UIC(exp, KL_F32, {0, 0.000911881973, 0.36787945, 1, 2.71828175, 148.413162, INFINITY}),
    UIC(exp2, KL_F32, {0, 0.0078125, 0.5, 1, 2, 32, INFINITY}),
    UIC(expm1, KL_F32, {-1, -0.999088109, -0.63212055, 0, 1.71828187, 147.413162, INFINITY}),
    UIC(log, KL_F32, {NAN, NAN, NAN, -INFINITY, 0, 1.60943794, 21.4875622}),
    UIC(log2, KL_F32, {NAN, NAN, NAN, -INFINITY, 0, 2.32192802, 31}),
    UIC(log1p, KL_F32, {NAN, NAN, -INFINITY, 0, 0.693147182, 1.79175949, 21.4875622}),
    UIC(sqrt, KL_F32, {NAN, NAN, NAN, 0, 1, 2.23606801, 46340.9492}),
    UIC(rsqrt, KL_F32, {NAN, NAN, NAN, INFINITY, 1, 0.44721359, 2.15791861e-05}),
    UIC(square, KL_I32, {0, 49, 1, 0, 1, 25, 1}),
    UIC(reciprocal, KL_F32, {-4.65661287e-10, -0.142857149, -1, INFINITY, 1, 0.200000003, 4.65661287e-10}),
    UIC(sin, KL_F32, {0.971310198, -0.656986594, -0.841470957, 0, 0.841470957, -0.958924294, -0.971310198}),
    UIC(cos, KL_F32, {0.2378162, 0.753902256, 0.540302336, 1, 0.540302336, 0.2836622, 0.2378162}),
    UIC(tan, KL_F32, {4.08428955, -0.87144798, -1.55740774, 0, 1.55740774, -3.3805151, -4.08428955}),
    UIC(tanh, KL_F32, {-1, -0.999998331, -0.761594176, 0, 0.761594176, 0.999909222, 1}),
    UIC(sigmoid, KL_F32, {0, 0.000911051175, 0.268941432, 0.5, 0.731058598, 0.993307173, 1}),
    UIC(relu, KL_I32, {0, 0, 0, 0, 1, 5, 2147483647}),
    UIC(gelu, KL_NUM_DTYPES, {0}), /* torch: "GeluKernelImpl" not implemented for 'Int' */
    UIC(gelu_tanh, KL_NUM_DTYPES, {0}), /* torch: "GeluKernelImpl" not implemented for 'Int' */
    UIC(silu, KL_NUM_DTYPES, {0}), /* torch: "silu_cpu" not implemented for 'Int' */
    UIC(softplus, KL_NUM_DTYPES, {0}), /* torch: "softplus_cpu" not implemented for 'Int' */
    UIC(erf, KL_F32, {-1, -1, -0.842700779, 0, 0.842700779, 1, 1}),
    UIC(floor, KL_I32, {-2147483648, -7, -1, 0, 1, 5, 2147483647}),
    UIC(ceil, KL_I32, {-2147483648, -7, -1, 0, 1, 5, 2147483647}),
    UIC(round, KL_I32, {-2147483648, -7, -1, 0, 1, 5, 2147483647}),
    UIC(trunc, KL_I32, {-2147483648, -7, -1, 0, 1, 5, 2147483647}),
    UIC(logical_not, KL_BOOL, {0, 0, 0, 1, 0, 0, 0}),
    UIC(isnan, KL_BOOL, {0, 0, 0, 0, 0, 0, 0}),
    UIC(isinf, KL_BOOL, {0, 0, 0, 0, 0, 0, 0}),
    UIC(isfinite, KL_BOOL, {1, 1, 1, 1, 1, 1, 1}),
    UIC(bitwise_not, KL_I32, {2147483647, 6, 0, -1, -2, -6, -2147483648}),
};
static const dtype_case unary_dtypes[] = {
    UD(neg, "fdhbiluE"),
    UD(abs, "fdhbiluE"),
    UD(sign, "fdhbilu?"),
    UD(exp, "fdhbffff"),
    UD(exp2, "fdhbffff"),
    UD(expm1, "fdhbffff"),
    UD(log, "fdhbffff"),
    UD(log2, "fdhbffff"),
    UD(log1p, "fdhbffff"),
    UD(sqrt, "fdhbffff"),
    UD(rsqrt, "fdhbffff"),
    UD(square, "fdhbilul"),
    UD(reciprocal, "fdhbffff"),
    UD(sin, "fdhbffff"),
    UD(cos, "fdhbffff"),
    UD(tan, "fdhbffff"),
    UD(tanh, "fdhbffff"),
    UD(sigmoid, "fdhbffff"),
    UD(relu, "fdhbiluE"),
    UD(gelu, "fdhbEEEE"),
    UD(gelu_tanh, "fdhbEEEE"),
    UD(silu, "fdhbEEEE"),
    UD(softplus, "fdhbEEEE"),
    UD(erf, "fdhbffff"),
    UD(floor, "fdhbiluE"),
    UD(ceil, "fdhbiluE"),
    UD(round, "fdhbiluE"),
    UD(trunc, "fdhbiluE"),
    UD(logical_not, "????????"),
    UDP(isnan, "????????"),
    UDP(isinf, "????????"),
    UDP(isfinite, "????????"),
    UD(bitwise_not, "EEEEilu?"),
};
static const dtype_case binary_dtypes[] = {
    BD(add, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbilu?ffddhhbbiflfuflf"),
    BD(sub, "fdfffffEdddddddEfdhfhhhEfdfbbbbEfdhbiliEfdhblllEfdhbiluEEEEEEEEEffddhhbbiflfufEE"),
    BD(mul, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbilu?ffddhhbbiflfuflf"),
    BD(div, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbfffffdhbfffffdhbfffffdhbffffffddhhbbffffffff"),
    BD(remainder, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbiluEffddhhbbiflfuflf"),
    BD(pow, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbiluEffddhhbbiflfuflf"),
    BD(maximum, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbilu?ffddhhbbiflfuflf"),
    BD(minimum, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbiliifdhbllllfdhbiluufdhbilu?ffddhhbbiflfuflf"),
    BD(atan2, "fdffffffddddddddfdhfhhhhfdfbbbbbfdhbfffffdhbfffffdhbfffffdhbffffffddhhbbffffffff"),
    BD(eq, "????????????????????????????????????????????????????????????????????????????????"),
    BD(ne, "????????????????????????????????????????????????????????????????????????????????"),
    BD(lt, "????????????????????????????????????????????????????????????????????????????????"),
    BD(le, "????????????????????????????????????????????????????????????????????????????????"),
    BD(gt, "????????????????????????????????????????????????????????????????????????????????"),
    BD(ge, "????????????????????????????????????????????????????????????????????????????????"),
    BD(logical_and, "????????????????????????????????????????????????????????????????????????????????"),
    BD(logical_or, "????????????????????????????????????????????????????????????????????????????????"),
    BD(logical_xor, "????????????????????????????????????????????????????????????????????????????????"),
    BD(bitwise_and, "EEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEiliiEEEEllllEEEEiluuEEEEilu?EEEEEEEEiElEuElE"),
    BD(bitwise_or, "EEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEiliiEEEEllllEEEEiluuEEEEilu?EEEEEEEEiElEuElE"),
    BD(bitwise_xor, "EEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEEiliiEEEEllllEEEEiluuEEEEilu?EEEEEEEEiElEuElE"),
};
static const double bxa[] = {-INFINITY, -3.5, -2, -0.0, 0, 1, 2.5, 3, INFINITY, NAN, 7, -7, 0, -0.0, 5.5, 1e+30};
static const double bxb[] = {2, 2, -0.0, 0, 3, -3, INFINITY, -INFINITY, 1, 2, NAN, 0, -0.0, 0, -2, 1e+30};
static const binary_case binary_cases[] = {
    BC(add, {-INFINITY, -1.5, -2, 0, 3, -2, INFINITY, -INFINITY, INFINITY, NAN, NAN, -7, 0, 0, 3.5, 2.00000003e+30},
       {-INFINITY, -1.5, -2, 0, 3, -2, INFINITY, -INFINITY, INFINITY, NAN, NAN, -7, 0, 0, 3.5, 2e+30}),
    BC(sub, {-INFINITY, -5.5, -2, -0.0, -3, 4, -INFINITY, INFINITY, INFINITY, NAN, NAN, -7, 0, -0.0, 7.5, 0},
       {-INFINITY, -5.5, -2, -0.0, -3, 4, -INFINITY, INFINITY, INFINITY, NAN, NAN, -7, 0, -0.0, 7.5, 0}),
    BC(mul, {-INFINITY, -7, 0, -0.0, 0, -3, INFINITY, -INFINITY, INFINITY, NAN, NAN, -0.0, -0.0, -0.0, -11, INFINITY},
       {-INFINITY, -7, 0, -0.0, 0, -3, INFINITY, -INFINITY, INFINITY, NAN, NAN, -0.0, -0.0, -0.0, -11, 1.0000000000000001e+60}),
    BC(div, {-INFINITY, -1.75, INFINITY, NAN, 0, -0.333333343, 0, -0.0, INFINITY, NAN, NAN, -INFINITY, NAN, NAN, -2.75, 1},
       {-INFINITY, -1.75, INFINITY, NAN, 0, -0.33333333333333331, 0, -0.0, INFINITY, NAN, NAN, -INFINITY, NAN, NAN, -2.75, 1}),
    BC(remainder, {NAN, 0.5, NAN, NAN, 0, -2, 2.5, -INFINITY, NAN, NAN, NAN, NAN, NAN, NAN, -0.5, 0},
       {NAN, 0.5, NAN, NAN, 0, -2, 2.5, -INFINITY, NAN, NAN, NAN, NAN, NAN, NAN, -0.5, 0}),
    BC(pow, {INFINITY, 12.25, 1, 1, 0, 1, INFINITY, 0, INFINITY, NAN, NAN, 1, 1, 1, 0.0330578499, INFINITY},
       {INFINITY, 12.25, 1, 1, 0, 1, INFINITY, 0, INFINITY, NAN, NAN, 1, 1, 1, 0.033057851239669422, INFINITY}),
    BC(maximum, {2, 2, -0.0, 0, 3, 1, INFINITY, 3, INFINITY, NAN, NAN, 0, -0.0, 0, 5.5, 1.00000002e+30},
       {2, 2, -0.0, 0, 3, 1, INFINITY, 3, INFINITY, NAN, NAN, 0, -0.0, 0, 5.5, 1e+30}),
    BC(minimum, {-INFINITY, -3.5, -2, 0, 0, -3, 2.5, -INFINITY, 1, NAN, NAN, -7, -0.0, 0, -2, 1.00000002e+30},
       {-INFINITY, -3.5, -2, 0, 0, -3, 2.5, -INFINITY, 1, NAN, NAN, -7, -0.0, 0, -2, 1e+30}),
    BC(atan2, {-1.57079637, -1.05165017, -1.57079637, -0.0, 0, 2.8198421, 0, 3.14159274, 1.57079637, NAN, NAN, -1.57079637, 3.14159274, -0.0, 1.91956735, 0.785398126},
       {-1.5707963267948966, -1.0516502125483738, -1.5707963267948966, -0.0, 0, 2.819842099193151, 0, 3.1415926535897931, 1.5707963267948966, NAN, NAN, -1.5707963267948966, 3.1415926535897931, -0.0, 1.9195673303788037, 0.78539816339744828}),
    BC(eq, {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1},
       {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1}),
    BC(ne, {1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0},
       {1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0}),
    BC(lt, {1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0},
       {1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0}),
    BC(le, {1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1},
       {1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1}),
    BC(gt, {0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0},
       {0, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0}),
    BC(ge, {0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1},
       {0, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1}),
    BC(logical_and, {1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1},
       {1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1}),
    BC(logical_or, {1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1},
       {1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}),
    BC(logical_xor, {0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0},
       {0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}),
};
static const int32_t bia[] = {-7, 7, -7, 7, INT32_MIN, 2147483647, 0, 5, -1, 3};
static const int32_t bib[] = {3, -3, -3, 3, -1, 1, 2, 2, 2, 0};
static const binary_int_case binary_int_cases[] = {
    BIC(add, KL_I32, {-4, 4, -10, 10, 2147483647, -2147483648, 2, 7, 1, 3}),
    BIC(sub, KL_I32, {-10, 10, -4, 4, -2147483647, 2147483646, -2, 3, -3, 3}),
    BIC(mul, KL_I32, {-21, -21, 21, 21, -2147483648, 2147483647, 0, 10, -2, 0}),
    BIC(div, KL_F32, {-2.33333325, -2.33333325, 2.33333325, 2.33333325, 2.14748365e+09, 2.14748365e+09, 0, 2.5, -0.5, INFINITY}),
    BIC(remainder, KL_I32, {2, -2, -1, 1, 0, 0, 0, 1, 1, 0}), /* Python's %; 3 % 0 is an error, tested apart */
    BIC(pow, KL_I32, {-343, 0, 0, 343, 0, 2147483647, 0, 25, 1, 1}),
    BIC(maximum, KL_I32, {3, 7, -3, 7, -1, 2147483647, 2, 5, 2, 3}),
    BIC(minimum, KL_I32, {-7, -3, -7, 3, -2147483648, 1, 0, 2, -1, 0}),
    BIC(atan2, KL_F32, {-1.16590452, 1.9756881, -1.9756881, 1.16590452, -1.57079625, 1.57079637, 0, 1.19028997, -0.463647604, 1.57079637}),
    BIC(eq, KL_BOOL, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
    BIC(ne, KL_BOOL, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}),
    BIC(lt, KL_BOOL, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0}),
    BIC(le, KL_BOOL, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0}),
    BIC(gt, KL_BOOL, {0, 1, 0, 1, 0, 1, 0, 1, 0, 1}),
    BIC(ge, KL_BOOL, {0, 1, 0, 1, 0, 1, 0, 1, 0, 1}),
    BIC(logical_and, KL_BOOL, {1, 1, 1, 1, 1, 1, 0, 1, 1, 0}),
    BIC(logical_or, KL_BOOL, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}),
    BIC(logical_xor, KL_BOOL, {0, 0, 0, 0, 0, 0, 1, 0, 0, 1}),
    BIC(bitwise_and, KL_I32, {1, 5, -7, 3, -2147483648, 1, 0, 0, 2, 0}),
    BIC(bitwise_or, KL_I32, {-5, -1, -3, 7, -1, 2147483647, 2, 7, -1, 3}),
    BIC(bitwise_xor, KL_I32, {-6, -6, 4, 4, 2147483647, 2147483646, 2, 7, -3, 3}),
};

/* ---- helpers ---------------------------------------------------------------------- */

/* n doubles as a 1-D tensor of dtype dt. */
static kl_tensor *vec(const double *v, int64_t n, kl_dtype dt) {
    return kl_to_dtype(kl_from_data(v, 1, &n, KL_F64), dt);
}
#define VEC(dt, ...) vec((const double[]){__VA_ARGS__}, sizeof((double[]){__VA_ARGS__}) / sizeof(double), (dt))

/* Asserts t's values: |got - want| <= rtol |want| + |atol|, NaN matches NaN,
 * and exact zeros have the expected sign unless atol < 0. */
static void check(const char *what, const kl_tensor *t, const double *want, int64_t n, double rtol, double atol) {
    assert_non_null(t);
    assert_int_equal(kl_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double v = kt_get(t, i), w = want[i];
        int ok = (isnan(w) && isnan(v)) || v == w || fabs(v - w) <= rtol * fabs(w) + fabs(atol);
        if (ok && v == 0 && w == 0 && signbit(v) != signbit(w) && !(atol < 0)) ok = 0;
        if (!ok) {
            print_error("%s: element %lld: got %.9g, expected %.9g\n", what, (long long)i, v, w);
            fail();
        }
    }
}
#define CHECK(t, dt, rtol, ...)                                                                       \
    do {                                                                                              \
        kl_tensor *t_ = (t);                                                                          \
        assert_non_null(t_);                                                                          \
        assert_int_equal(kl_dtype_of(t_), (dt));                                                      \
        check(#t, t_, (const double[]){__VA_ARGS__}, sizeof((double[]){__VA_ARGS__}) / sizeof(double), \
              (rtol), 0);                                                                             \
    } while (0)

static kl_dtype code_dtype(char c) {
    switch (c) {
    case 'f': return KL_F32;
    case 'd': return KL_F64;
    case 'h': return KL_F16;
    case 'b': return KL_BF16;
    case 'i': return KL_I32;
    case 'l': return KL_I64;
    case 'u': return KL_U8;
    case '?': return KL_BOOL;
    default: return KL_NUM_DTYPES;
    }
}

/* PyTorch's can_cast for in-place results: no float -> integer, no non-bool -> bool. */
static int can_cast(kl_dtype from, kl_dtype to) {
    if (kl_dtype_is_floating(from) && !kl_dtype_is_floating(to)) return 0;
    return !(from != KL_BOOL && to == KL_BOOL);
}

/* Checks one call against a dtype letter: a result of that dtype, or an error. */
static void expect_dtype(const char *op, const char *form, kl_dtype a, kl_dtype b, kl_tensor *r, char code) {
    kl_dtype want = code_dtype(code);
    if (want == KL_NUM_DTYPES) {
        if (r || kl_last_status() != KL_ERR_DTYPE) {
            print_error("%s %s (%s, %s): expected a dtype error, got %s / %s\n", op, form, kl_dtype_name(a),
                        kl_dtype_name(b), r ? kl_dtype_name(kl_dtype_of(r)) : "NULL", kl_last_error());
            fail();
        }
        kl_clear_error();
    } else if (!r || kl_dtype_of(r) != want) {
        print_error("%s %s (%s, %s): expected %s, got %s (%s)\n", op, form, kl_dtype_name(a), kl_dtype_name(b),
                    kl_dtype_name(want), r ? kl_dtype_name(kl_dtype_of(r)) : "NULL", kl_last_error());
        fail();
    }
}

/* An in-place form must succeed iff the out-of-place result casts into self. */
static void expect_inplace(const char *op, kl_dtype self, kl_dtype other, kl_tensor *t, kl_tensor *r, char code) {
    kl_dtype want = code_dtype(code);
    if (want != KL_NUM_DTYPES && can_cast(want, self)) {
        if (r != t) {
            print_error("%s_inplace (%s, %s): expected success, got %s\n", op, kl_dtype_name(self),
                        kl_dtype_name(other), kl_last_error());
            fail();
        }
        assert_int_equal(kl_dtype_of(r), self);
    } else {
        if (r || kl_last_status() != KL_ERR_DTYPE) {
            print_error("%s_inplace (%s, %s): expected a dtype error, got %s\n", op, kl_dtype_name(self),
                        kl_dtype_name(other), r ? "a result" : kl_last_error());
            fail();
        }
        kl_clear_error();
    }
}

static int bool_result(const char *name) {
    static const char *const ops[] = {"logical_not", "isnan", "isinf", "isfinite", "eq", "ne", "lt", "le",
                                      "gt", "ge", "logical_and", "logical_or", "logical_xor"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(name, ops[i])) return 1;
    return 0;
}

/* ---- values ---------------------------------------------------------------------------- */

/* f32 results: vmath is within a few ulp (see accuracy_sweep), so 1e-6
 * relative; f64 results are libm's. */
static void unary_values(void **s) {
    (void)s;
    const int64_t n = sizeof ux / sizeof ux[0];
    kl_tensor *x32 = vec(ux, n, KL_F32), *x64 = vec(ux, n, KL_F64);
    for (size_t k = 0; k < sizeof unary_cases / sizeof unary_cases[0]; k++) {
        const unary_case *c = &unary_cases[k];
        kl_scope_begin();
        int b = bool_result(c->name);
        kl_tensor *r = c->fn(x32);
        assert_non_null(r);
        assert_int_equal(kl_dtype_of(r), b ? KL_BOOL : KL_F32);
        char what[64];
        snprintf(what, sizeof what, "%s f32", c->name);
        /* PyTorch's f32 gelu computes 1 + erf(x / sqrt 2) (gelu_tanh 1 + tanh)
         * and loses digits to cancellation at x < 0 (4e-5 relative at -3);
         * vmath does not, so f32 gelu is held to torch's f64 values. The far
         * tail underflows to a zero whose sign depends on PyTorch's code path. */
        int gelu = !strncmp(c->name, "gelu", 4);
        check(what, r, gelu ? c->f64 : c->f32, n, 1e-6, gelu ? -1e-38 : 1e-38);
        r = c->fn(x64);
        assert_int_equal(kl_dtype_of(r), b ? KL_BOOL : KL_F64);
        snprintf(what, sizeof what, "%s f64", c->name);
        check(what, r, c->f64, n, 1e-14, 1e-300);
        kl_scope_end();
    }
}

static void unary_int_values(void **s) {
    (void)s;
    kl_tensor *x = kl_from_data(ix, KL_SHAPE(7), KL_I32);
    for (size_t k = 0; k < sizeof unary_int_cases / sizeof unary_int_cases[0]; k++) {
        const unary_int_case *c = &unary_int_cases[k];
        kl_tensor *r = c->fn(x);
        if (c->dt == KL_NUM_DTYPES) {
            assert_null(r);
            KT_EXPECT_ERROR(KL_ERR_DTYPE, "expects floating-point tensors, got [7] int32 cpu");
            continue;
        }
        assert_non_null(r);
        assert_int_equal(kl_dtype_of(r), c->dt);
        check(c->name, r, c->v, 7, c->dt == KL_F32 ? 1e-6 : 0, 0);
    }
}

static void binary_values(void **s) {
    (void)s;
    const int64_t n = sizeof bxa / sizeof bxa[0];
    kl_tensor *a32 = vec(bxa, n, KL_F32), *b32 = vec(bxb, n, KL_F32);
    kl_tensor *a64 = vec(bxa, n, KL_F64), *b64 = vec(bxb, n, KL_F64);
    for (size_t k = 0; k < sizeof binary_cases / sizeof binary_cases[0]; k++) {
        const binary_case *c = &binary_cases[k];
        int b = bool_result(c->name);
        char what[64];
        kl_tensor *r = c->fn(a32, b32);
        assert_non_null(r);
        assert_int_equal(kl_dtype_of(r), b ? KL_BOOL : KL_F32);
        snprintf(what, sizeof what, "%s f32", c->name);
        check(what, r, c->f32, n, 1e-6, 0);
        r = c->fn(a64, b64);
        assert_int_equal(kl_dtype_of(r), b ? KL_BOOL : KL_F64);
        snprintf(what, sizeof what, "%s f64", c->name);
        check(what, r, c->f64, n, 1e-15, 0);
    }
}

static void binary_int_values(void **s) {
    (void)s;
    kl_tensor *a = kl_from_data(bia, KL_SHAPE(10), KL_I32), *b = kl_from_data(bib, KL_SHAPE(10), KL_I32);
    for (size_t k = 0; k < sizeof binary_int_cases / sizeof binary_int_cases[0]; k++) {
        const binary_int_case *c = &binary_int_cases[k];
        /* the last pair divides by zero: remainder's error is tested apart */
        int64_t n = strcmp(c->name, "remainder") ? 10 : 9;
        kl_tensor *r = c->fn(kl_slice(a, 0, 0, n, 1), kl_slice(b, 0, 0, n, 1));
        assert_non_null(r);
        assert_int_equal(kl_dtype_of(r), c->dt);
        check(c->name, r, c->v, n, c->dt == KL_F32 ? 1e-6 : 0, 0);
    }
}

/* ---- dtype rules, out of place and in place ------------------------------------------- */

static void unary_dtype_rules(void **s) {
    (void)s;
    for (size_t k = 0; k < sizeof unary_dtypes / sizeof unary_dtypes[0]; k++) {
        const dtype_case *c = &unary_dtypes[k];
        kl_scope_begin();
        for (int i = 0; i < 8; i++) {
            kl_dtype d = all_dtypes[i];
            expect_dtype(c->name, "", d, d, c->u(kl_ones(KL_SHAPE(2), d)), c->codes[i]);
            if (c->u_inplace) {
                kl_tensor *t = kl_ones(KL_SHAPE(2), d);
                expect_inplace(c->name, d, d, t, c->u_inplace(t), c->codes[i]);
            }
        }
        kl_scope_end();
    }
}

static void binary_dtype_rules(void **s) {
    (void)s;
    for (size_t k = 0; k < sizeof binary_dtypes / sizeof binary_dtypes[0]; k++) {
        const dtype_case *c = &binary_dtypes[k];
        kl_scope_begin();
        for (int i = 0; i < 8; i++) {
            kl_dtype da = all_dtypes[i];
            for (int j = 0; j < 8; j++) {
                kl_dtype db = all_dtypes[j];
                char code = c->codes[i * 8 + j];
                kl_tensor *b = kl_ones(KL_SHAPE(2), db), *t = kl_ones(KL_SHAPE(2), da);
                expect_dtype(c->name, "", da, db, c->b(kl_ones(KL_SHAPE(2), da), b), code);
                expect_inplace(c->name, da, db, t, c->b_inplace(t, b), code);
            }
            for (int j = 0; j < 2; j++) {
                double v = j ? 2.5 : 2;
                char code = c->codes[64 + i * 2 + j];
                kl_tensor *t = kl_ones(KL_SHAPE(2), da);
                expect_dtype(c->name, j ? "scalar 2.5" : "scalar 2", da, da, c->s(kl_ones(KL_SHAPE(2), da), v), code);
                expect_inplace(c->name, da, da, t, c->s_inplace(t, v), code);
            }
        }
        kl_scope_end();
    }
}

/* ---- scalars and special cases ---------------------------------------------------------- */

static void scalar_forms(void **s) {
    (void)s;
    kl_tensor *f = VEC(KL_F32, 1, 2), *i = VEC(KL_I32, 1, 2), *h = VEC(KL_F16, 1, 2);
    CHECK(kl_add_scalar(f, 2.5), KL_F32, 0, 3.5, 4.5);  /* a float scalar does not widen f32 */
    CHECK(kl_add_scalar(i, 2.5), KL_F32, 0, 3.5, 4.5);  /* int tensor, float scalar: default float */
    CHECK(kl_add_scalar(i, 2), KL_I32, 0, 3, 4);        /* int scalar does not widen i32 */
    CHECK(kl_mul_scalar(h, 2.5), KL_F16, 0, 2.5, 5);
    CHECK(kl_add_scalar(VEC(KL_BOOL, 1, 0), 2), KL_I64, 0, 3, 2);
    CHECK(kl_sub_scalar(i, 0.5), KL_F32, 0, 0.5, 1.5);
    CHECK(kl_rsub_scalar(i, 10), KL_I32, 0, 9, 8);
    CHECK(kl_rsub_scalar(f, 2.5), KL_F32, 0, 1.5, 0.5);
    CHECK(kl_rdiv_scalar(VEC(KL_I32, 4, 0), 10), KL_F32, 0, 2.5, INFINITY);
    CHECK(kl_div_scalar(i, 4), KL_F32, 0, 0.25, 0.5);
    /* uint8 wraps both ways, like PyTorch */
    CHECK(kl_add_scalar(VEC(KL_U8, 250), 10), KL_U8, 0, 4);
    CHECK(kl_sub_scalar(VEC(KL_U8, 1), 2), KL_U8, 0, 255);
    CHECK(kl_remainder_scalar(VEC(KL_U8, 5), 3), KL_U8, 0, 2);
    CHECK(kl_pow_scalar(VEC(KL_U8, 3), 3), KL_U8, 0, 27);
    /* bool arithmetic: add is or, mul is and */
    kl_tensor *bt = VEC(KL_BOOL, 1, 0), *bu = VEC(KL_BOOL, 1, 1);
    CHECK(kl_add(bt, bu), KL_BOOL, 0, 1, 1);
    CHECK(kl_mul(bt, bu), KL_BOOL, 0, 1, 0);
    CHECK(kl_maximum(bt, VEC(KL_BOOL, 0, 0)), KL_BOOL, 0, 1, 0);
    CHECK(kl_minimum_scalar(bt, 1), KL_I64, 0, 1, 0);
    /* Python's remainder with scalars of either sign */
    CHECK(kl_remainder_scalar(VEC(KL_I32, -7, 7), -3), KL_I32, 0, -1, -2);
    CHECK(kl_remainder_scalar(VEC(KL_F32, -7, 7), 2.5), KL_F32, 0, 0.5, 2);
    /* comparisons happen in the promoted dtype */
    CHECK(kl_lt_scalar(VEC(KL_I32, 1, 2, 3), 2.5), KL_BOOL, 0, 1, 1, 0);
    CHECK(kl_eq(VEC(KL_I32, 16777217), VEC(KL_F32, 16777216)), KL_BOOL, 0, 1);
    CHECK(kl_eq(VEC(KL_F32, 1.5), VEC(KL_F64, 1.5)), KL_BOOL, 0, 1);
    CHECK(kl_atan2_scalar(VEC(KL_F32, 1, -1), -1), KL_F32, 1e-6, 2.3561945, -2.3561945);
    CHECK(kl_logical_xor_scalar(VEC(KL_F32, 0, 3, NAN), 1), KL_BOOL, 0, 1, 0, 0);
    CHECK(kl_bitwise_xor_scalar(VEC(KL_I64, 5, -1), 3), KL_I64, 0, 6, -4);
    /* the scalar's value reaches the loop as a single element in every position */
    kl_tensor *big = kl_arange(0, 3000, 1, KL_F32);
    kl_tensor *r = kl_rsub_scalar(big, 1);
    assert_true(kt_get(r, 0) == 1 && kt_get(r, 2999) == -2998);
}

/* pow(Tensor, Scalar) takes PyTorch's shortcuts; the values at the edges show it. */
static void pow_special_cases(void **s) {
    (void)s;
    kl_tensor *x = VEC(KL_F32, -INFINITY, -0.0, 4, -4);
    CHECK(kl_pow_scalar(x, 0.5), KL_F32, 0, NAN, -0.0, 2, NAN);
    CHECK(kl_pow_scalar(x, -0.5), KL_F32, 0, NAN, -INFINITY, 0.5, NAN);
    CHECK(kl_pow_scalar(x, 3), KL_F32, 0, -INFINITY, -0.0, 64, -64);
    CHECK(kl_pow_scalar(x, -1), KL_F32, 0, -0.0, -INFINITY, 0.25, -0.25);
    CHECK(kl_pow_scalar(x, -2), KL_F32, 0, 0, INFINITY, 0.0625, 0.0625);
    CHECK(kl_pow_scalar(x, 2), KL_F32, 0, INFINITY, 0, 16, 16);
    CHECK(kl_pow_scalar(VEC(KL_F64, NAN, -INFINITY, 0), 0), KL_F64, 0, 1, 1, 1);
    CHECK(kl_pow_scalar(VEC(KL_F64, 2, -8), 1.0 / 3), KL_F64, 1e-15, 1.2599210498948732, NAN);
    CHECK(kl_pow_scalar(VEC(KL_I32, 2, -3, 5), 3), KL_I32, 0, 8, -27, 125);
    CHECK(kl_pow_scalar(VEC(KL_I32, 2, -3), 2.5), KL_F32, 1e-6, 5.65685425, NAN);
    CHECK(kl_pow_scalar(VEC(KL_I64, 3), 40), KL_I64, 0, -6289078614652622815.0); /* 3^40 wraps */
    /* a tensor exponent may be negative: 0, or +-1 for a base of +-1 */
    CHECK(kl_pow(VEC(KL_I32, 2, 1, -1, -1), kl_scalar_tensor(-3, KL_I32)), KL_I32, 0, 0, 1, -1, -1);
    /* a negative integer C scalar is refused */
    assert_null(kl_pow_scalar(VEC(KL_I32, 2), -1));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_pow: integers to negative integer powers are not allowed (exponent -1)");
    CHECK(kl_pow_scalar(VEC(KL_I32, 2), -1.5), KL_F32, 1e-6, 0.35355339);
}

/* ---- where, clamp, lerp, masked_fill, tril/triu ------------------------------------------- */

static void where_op(void **s) {
    (void)s;
    kl_tensor *cond = kl_view(VEC(KL_BOOL, 1, 0, 1), KL_SHAPE(1, 3));
    kl_tensor *a = kl_view(VEC(KL_I32, 1, 2), KL_SHAPE(2, 1)), *b = VEC(KL_F32, 7.5, 8.5, 9.5);
    kl_tensor *r = kl_where(cond, a, b); /* three-way broadcast, a and b promoted */
    kt_assert_shape(r, 2, (int64_t[]){2, 3});
    CHECK(r, KL_F32, 0, 1, 8.5, 1, 2, 8.5, 2);
    /* 0-dim operands rank below dimensioned ones, as in PyTorch */
    CHECK(kl_where(VEC(KL_BOOL, 1, 0), VEC(KL_I32, 1, 2), kl_scalar_tensor(2.5, KL_F64)), KL_F64, 0, 1, 2.5);
    CHECK(kl_where(VEC(KL_BOOL, 1, 0), VEC(KL_F16, 1, 2), kl_scalar_tensor(2.5, KL_F64)), KL_F16, 0, 1, 2.5);
    CHECK(kl_where(VEC(KL_BOOL, 0, 1), VEC(KL_F64, 1, 2), VEC(KL_F32, 3, 4)), KL_F64, 0, 3, 2);
    CHECK(kl_where(VEC(KL_BOOL, 0, 1), VEC(KL_BOOL, 1, 1), VEC(KL_BOOL, 0, 0)), KL_BOOL, 0, 0, 1);
    CHECK(kl_where(VEC(KL_BOOL, 1, 0), VEC(KL_F16, 1, NAN), VEC(KL_F16, -0.0, 2)), KL_F16, 0, 1, 2);
    assert_null(kl_where(VEC(KL_U8, 1, 0), a, b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_where: expects a bool condition, got [2] uint8 cpu (argument 1)");
    assert_null(kl_where(VEC(KL_BOOL, 1, 0), VEC(KL_F32, 1, 2, 3), b));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_where: shapes [2], [3] and [3] cannot broadcast");
}

static void clamp_op(void **s) {
    (void)s;
    kl_tensor *x = VEC(KL_F32, -INFINITY, -2, -0.5, -0.0, 0.5, 2, INFINITY, NAN);
    CHECK(kl_clamp(x, -1, 1), KL_F32, 0, -1, -1, -0.5, -0.0, 0.5, 1, 1, NAN);
    CHECK(kl_clamp(x, -INFINITY, 0.25), KL_F32, 0, -INFINITY, -2, -0.5, -0.0, 0.25, 0.25, 0.25, NAN);
    CHECK(kl_clamp(x, -0.25, INFINITY), KL_F32, 0, -0.25, -0.25, -0.25, -0.0, 0.5, 2, INFINITY, NAN);
    /* a NaN bound binds nothing; lo > hi gives hi (PyTorch's CPU results) */
    CHECK(kl_clamp(x, NAN, INFINITY), KL_F32, 0, -INFINITY, -2, -0.5, -0.0, 0.5, 2, INFINITY, NAN);
    CHECK(kl_clamp(VEC(KL_F64, 1, NAN, 5), 3, 2), KL_F64, 0, 2, NAN, 2);
    /* integers stay integers with integral bounds */
    kl_tensor *i = VEC(KL_I32, -5, 0, 5, 100);
    CHECK(kl_clamp(i, 0, 10), KL_I32, 0, 0, 0, 5, 10);
    CHECK(kl_clamp(i, 0.5, 10), KL_F32, 0, 0.5, 0.5, 5, 10);
    CHECK(kl_clamp(i, -INFINITY, INFINITY), KL_I32, 0, -5, 0, 5, 100);
    CHECK(kl_clamp(i, -1e10, 5), KL_I32, 0, -5, 0, 5, 5); /* a bound beyond int32 cannot bind */
    CHECK(kl_clamp(VEC(KL_U8, 0, 5, 200), 3, 100), KL_U8, 0, 3, 5, 100);
    CHECK(kl_clamp(VEC(KL_BOOL, 1, 0), 0, 1), KL_I64, 0, 1, 0);
    CHECK(kl_clamp(VEC(KL_I64, INT64_MIN, 7), -INFINITY, 6), KL_I64, 0, (double)INT64_MIN, 6);
    /* in place, into a strided view */
    kl_tensor *m = kl_arange(0, 6, 1, KL_F32), *col = kl_slice(m, 0, 0, 6, 2);
    assert_ptr_equal(kl_clamp_inplace(col, 1, 3), col);
    KT_VALUES(m, 0, 1, 1, 2, 3, 3, 5);
    assert_null(kl_clamp_inplace(i, 0.5, 1));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_clamp: result type float32 can't be cast to the in-place output [4] int32 cpu");
}

static void lerp_op(void **s) {
    (void)s;
    kl_tensor *a = VEC(KL_F32, 0, 1, 2, -3, 5, 1e30, 0, NAN), *b = VEC(KL_F32, 10, -1, 2, 3, INFINITY, -1e30, 1, 1);
    kl_tensor *w = VEC(KL_F32, 0, 1, 0.5, 0.75, -1, 0.25, 2, 0.5);
    CHECK(kl_lerp(a, b, w), KL_F32, 1e-7, 0, -1, 2, 1.5, -INFINITY, 5.000000075237331e+29, 2, NAN);
    CHECK(kl_lerp_scalar(a, b, 0.3), KL_F32, 1e-7, 3.0, 0.3999999761581421, 2.0, -1.1999999284744263, INFINITY,
          3.999999682400546e+29, 0.30000001192092896, NAN);
    CHECK(kl_lerp_scalar(a, b, 1), KL_F32, 1e-7, 10, -1, 2, 3, NAN, -1.0000000150474662e+30, 1, NAN);
    /* broadcast weight and operands */
    kl_tensor *r = kl_lerp(VEC(KL_F64, 1, 2), kl_view(VEC(KL_F64, 3, 4, 5, 6), KL_SHAPE(2, 2)), kl_scalar_tensor(0.25, KL_F64));
    kt_assert_shape(r, 2, (int64_t[]){2, 2});
    CHECK(r, KL_F64, 0, 1.5, 2.5, 2, 3);
    CHECK(kl_lerp_scalar(VEC(KL_BF16, 0, 4), VEC(KL_BF16, 8, 4), 0.5), KL_BF16, 0, 4, 4);
    kl_tensor *t = VEC(KL_F32, 0, 10);
    assert_ptr_equal(kl_lerp_scalar_inplace(t, VEC(KL_F32, 10), 0.5), t);
    KT_VALUES(t, 0, 5, 10);
    /* no promotion: one floating dtype */
    assert_null(kl_lerp_scalar(a, VEC(KL_F64, 1), 0.5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_lerp_scalar: expected dtype float32 for end but got [1] float64 cpu (argument 2)");
    assert_null(kl_lerp(a, b, kl_scalar_tensor(0.5, KL_F64)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_lerp: expected dtype float32 for weight but got [] float64 cpu (argument 3)");
    assert_null(kl_lerp(VEC(KL_I64, 1), VEC(KL_I64, 2), VEC(KL_I64, 0)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_lerp: expects floating-point tensors, got [1] int64 cpu (argument 1)");
    assert_null(kl_lerp_scalar_inplace(VEC(KL_F32, 1), VEC(KL_F32, 1, 2), 0.5));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_lerp_scalar: in-place output [1] float32 cpu cannot hold");
}

static void masked_fill_op(void **s) {
    (void)s;
    kl_tensor *z = kl_zeros(KL_SHAPE(2, 3), KL_F32), *m = VEC(KL_BOOL, 1, 0, 1);
    CHECK(kl_masked_fill(z, m, -INFINITY), KL_F32, 0, -INFINITY, 0, -INFINITY, -INFINITY, 0, -INFINITY);
    kl_tensor *i = kl_view(VEC(KL_I32, 1, 2, 3, 4, 5, 6), KL_SHAPE(2, 3));
    CHECK(kl_masked_fill(i, kl_view(VEC(KL_BOOL, 1, 0), KL_SHAPE(2, 1)), 2.7), KL_I32, 0, 2, 2, 2, 4, 5, 6);
    CHECK(kl_masked_fill(VEC(KL_BOOL, 0, 0), VEC(KL_BOOL, 1, 0), 2), KL_BOOL, 0, 1, 0);
    CHECK(kl_masked_fill(VEC(KL_F16, 1, 2), VEC(KL_BOOL, 0, 1), 0.1), KL_F16, 0, 1, 0.0999755859375);
    /* out of place, x grows to the broadcast shape as in PyTorch; in place it cannot */
    kl_tensor *r = kl_masked_fill(kl_zeros(KL_SHAPE(3), KL_F32), kl_ones(KL_SHAPE(2, 3), KL_BOOL), 1);
    kt_assert_shape(r, 2, (int64_t[]){2, 3});
    assert_null(kl_masked_fill_inplace(kl_zeros(KL_SHAPE(3), KL_F32), kl_ones(KL_SHAPE(2, 3), KL_BOOL), 1));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "in-place output [3] float32 cpu cannot hold the broadcast result of shape [2,3]");
    /* in place into a transposed view */
    kl_tensor *base = kl_zeros(KL_SHAPE(2, 3), KL_I64), *tv = kl_t(base);
    assert_ptr_equal(kl_masked_fill_inplace(tv, kl_view(VEC(KL_BOOL, 1, 0), KL_SHAPE(1, 2)), -7), tv);
    KT_VALUES(base, 0, -7, -7, -7, 0, 0, 0);
    assert_null(kl_masked_fill(z, VEC(KL_U8, 1, 0, 1), 1));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_masked_fill: expects a bool mask, got [3] uint8 cpu (argument 2)");
}

/* Checks tril/triu of x against the definition, element by element. */
static void check_tri(kl_tensor *x, int64_t k, int upper) {
    kl_tensor *r = upper ? kl_triu(x, k) : kl_tril(x, k);
    int nd = kl_ndim(x);
    kt_assert_shape(r, nd, kl_shape(x));
    assert_int_equal(kl_dtype_of(r), kl_dtype_of(x));
    int64_t R = kl_shape(x)[nd - 2], C = kl_shape(x)[nd - 1];
    for (int64_t e = 0; e < kl_numel(x); e++) {
        int64_t i = (e / C) % R, j = e % C;
        int keep = upper ? j - i >= k : j - i <= k;
        if (kt_get(r, e) != (keep ? kt_get(x, e) : 0)) {
            print_error("%s k=%lld: element %lld is %g\n", upper ? "triu" : "tril", (long long)k, (long long)e,
                        kt_get(r, e));
            fail();
        }
    }
}

static void tril_triu(void **s) {
    (void)s;
    kl_tensor *x = kl_add_scalar(kl_view(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4)), 1);
    CHECK(kl_tril(x, 0), KL_F32, 0, 1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0);
    CHECK(kl_triu(x, 1), KL_F32, 0, 0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12);
    kl_tensor *xs[] = {x, kl_t(x), kl_ones(KL_SHAPE(2, 3, 3), KL_BOOL),
                       kl_permute(kl_view(kl_arange(1, 61, 1, KL_I64), KL_SHAPE(3, 4, 5)), KL_DIMS(1, 2, 0)),
                       kl_slice(kl_view(kl_arange(1, 41, 1, KL_F16), KL_SHAPE(2, 4, 5)), 2, 0, 5, 2),
                       kl_expand(kl_view(VEC(KL_U8, 1, 2, 3), KL_SHAPE(3, 1)), KL_SHAPE(2, 3, 4))};
    const int64_t ks[] = {0, 1, -1, 2, -2, 7, -7, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
            check_tri(xs[i], ks[k], 0);
            check_tri(xs[i], ks[k], 1);
        }
    kt_assert_shape(kl_tril(kl_zeros(KL_SHAPE(0, 3, 3), KL_F32), 0), 3, (int64_t[]){0, 3, 3});
    kt_assert_shape(kl_triu(kl_zeros(KL_SHAPE(2, 0), KL_F32), 0), 2, (int64_t[]){2, 0});
    /* a big one goes through the thread pool */
    kl_tensor *big = kl_ones(KL_SHAPE(3, 300, 301), KL_F64);
    check_tri(big, 5, 0);
    check_tri(big, -3, 1);
    assert_null(kl_tril(VEC(KL_F32, 1, 2), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_tril: expects a tensor with at least 2 dims, got [2] float32 cpu");
    assert_null(kl_triu(kl_scalar_tensor(1, KL_F32), 0));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_triu: expects a tensor with at least 2 dims, got [] float32 cpu");
}

/* ---- layouts: broadcasting, strides, zero-size, in place, Meta ------------------------------ */

static void broadcasting(void **s) {
    (void)s;
    kl_tensor *a = kl_view(kl_arange(0, 6, 1, KL_F32), KL_SHAPE(2, 3));
    kl_tensor *row = VEC(KL_F32, 10, 20, 30), *col = kl_view(VEC(KL_I32, 100, 200), KL_SHAPE(2, 1));
    CHECK(kl_add(a, row), KL_F32, 0, 10, 21, 32, 13, 24, 35);
    CHECK(kl_sub(col, row), KL_F32, 0, 90, 80, 70, 190, 180, 170);           /* [2,1] x [3] -> [2,3] */
    CHECK(kl_gt(row, kl_view(VEC(KL_F64, 15, 25), KL_SHAPE(2, 1))), KL_BOOL, 0, 0, 1, 1, 0, 0, 1);
    CHECK(kl_maximum(a, kl_scalar_tensor(2.5, KL_F64)), KL_F32, 0, 2.5, 2.5, 2.5, 3, 4, 5);
    kl_tensor *r = kl_mul(kl_view(a, KL_SHAPE(2, 1, 3)), kl_view(VEC(KL_F32, 1, -1), KL_SHAPE(2, 1)));
    kt_assert_shape(r, 3, (int64_t[]){2, 2, 3});
    CHECK(r, KL_F32, 0, 0, 1, 2, -0.0, -1, -2, 3, 4, 5, -3, -4, -5);
    assert_null(kl_add(a, VEC(KL_F32, 1, 2)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_add: shapes [2,3] and [2] cannot broadcast");
    assert_null(kl_bitwise_or(kl_ones(KL_SHAPE(4, 1, 2), KL_I32), kl_ones(KL_SHAPE(3, 3), KL_I32)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_bitwise_or: shapes [4,1,2] and [3,3] cannot broadcast");
}

/* Strided inputs (transposed, sliced, expanded) give what their contiguous copies give. */
static void strided_inputs(void **s) {
    (void)s;
    kl_tensor *base = kl_view(kl_arange(-12, 12, 1, KL_F32), KL_SHAPE(4, 6));
    kl_tensor *views[] = {kl_t(base), kl_slice(kl_slice(base, 1, 1, 6, 2), 0, 0, 4, 3),
                          kl_expand(kl_view(VEC(KL_F32, 1, -2, 3), KL_SHAPE(3, 1)), KL_SHAPE(3, 5)),
                          kl_select(base, 1, 4)};
    for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
        kl_tensor *x = views[v], *xc = kl_contiguous(x);
        assert_true(kl_equal(kl_exp(x), kl_exp(xc)) == 1);
        assert_true(kl_equal(kl_abs(x), kl_abs(xc)) == 1);
        assert_true(kl_equal(kl_isfinite(x), kl_isfinite(xc)) == 1);
        assert_true(kl_equal(kl_mul(x, x), kl_mul(xc, xc)) == 1);
        assert_true(kl_equal(kl_remainder_scalar(x, 5), kl_remainder_scalar(xc, 5)) == 1);
        assert_true(kl_equal(kl_pow_scalar(x, 2), kl_square(xc)) == 1);
        assert_true(kl_equal(kl_le(x, kl_neg(x)), kl_le(xc, kl_neg(xc))) == 1);
        assert_true(kl_equal(kl_clamp(x, -1, 2), kl_clamp(xc, -1, 2)) == 1);
        assert_true(kl_equal(kl_where(kl_gt_scalar(x, 0), x, kl_neg(x)), kl_abs(xc)) == 1);
    }
    /* mixed: a transposed int tensor with a sliced float one (dtype conversion + strides) */
    kl_tensor *it = kl_t(kl_view(kl_arange(0, 6, 1, KL_I64), KL_SHAPE(2, 3)));
    kl_tensor *fs = kl_slice(kl_view(kl_arange(0, 12, 1, KL_F64), KL_SHAPE(3, 4)), 1, 0, 4, 2);
    CHECK(kl_add(it, fs), KL_F64, 0, 0, 5, 5, 10, 10, 15);
}

static void zero_size(void **s) {
    (void)s;
    kl_tensor *e = kl_zeros(KL_SHAPE(0, 3), KL_F32), *row = VEC(KL_F32, 1, 2, 3);
    kt_assert_shape(kl_exp(e), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_add(e, row), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_mul(kl_zeros(KL_SHAPE(1, 0), KL_I32), kl_zeros(KL_SHAPE(4, 1), KL_I32)), 2, (int64_t[]){4, 0});
    kt_assert_shape(kl_eq_scalar(e, 0), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_where(kl_zeros(KL_SHAPE(0, 1), KL_BOOL), e, row), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_clamp(e, 0, 1), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_masked_fill(e, kl_zeros(KL_SHAPE(3), KL_BOOL), 1), 2, (int64_t[]){0, 3});
    kt_assert_shape(kl_lerp_scalar(e, row, 0.5), 2, (int64_t[]){0, 3});
    /* an integer remainder over no elements divides by nothing */
    kt_assert_shape(kl_remainder(kl_zeros(KL_SHAPE(0), KL_I32), kl_zeros(KL_SHAPE(0), KL_I32)), 1, (int64_t[]){0});
    assert_ptr_equal(kl_neg_inplace(e), e);
    assert_null(kl_add(e, VEC(KL_F32, 1, 2)));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_add: shapes [0,3] and [2] cannot broadcast");
}

static void inplace_views(void **s) {
    (void)s;
    kl_tensor *x = kl_view(kl_arange(0, 12, 1, KL_F32), KL_SHAPE(3, 4));
    int64_t v0 = kl_version_of(x);
    kl_tensor *col = kl_select(x, 1, 1); /* stride 4 */
    assert_ptr_equal(kl_mul_scalar_inplace(col, 10), col);
    assert_int_equal(kl_version_of(x), v0 + 1);
    KT_VALUES(x, 0, 0, 10, 2, 3, 4, 50, 6, 7, 8, 90, 10, 11);
    kl_tensor *xt = kl_t(x); /* [4,3] transposed view */
    assert_ptr_equal(kl_sub_inplace(xt, VEC(KL_F32, 1, 2, 3)), xt); /* broadcast along rows of xt */
    KT_VALUES(x, 0, -1, 9, 1, 2, 2, 48, 4, 5, 5, 87, 7, 8);
    kl_tensor *ends = kl_slice(x, 1, 0, 4, 3); /* columns 0 and 3 */
    assert_ptr_equal(kl_abs_inplace(ends), ends);
    KT_VALUES(x, 0, 1, 9, 1, 2, 2, 48, 4, 5, 5, 87, 7, 8);
    /* unary in place into a strided integer view */
    kl_tensor *iv = kl_view(kl_arange(-4, 4, 1, KL_I32), KL_SHAPE(2, 4)), *odd = kl_slice(iv, 1, 1, 4, 2);
    assert_ptr_equal(kl_neg_inplace(odd), odd);
    KT_VALUES(iv, 0, -4, 3, -2, 1, 0, -1, 2, -3);
    /* results that cast into self: bool -> int, f32 -> f16, f64 -> f32 */
    assert_ptr_equal(kl_logical_not_inplace(iv), iv);
    KT_VALUES(iv, 0, 0, 0, 0, 0, 1, 0, 0, 0);
    kl_tensor *h = VEC(KL_F16, 1, 2);
    assert_ptr_equal(kl_add_inplace(h, VEC(KL_F32, 0.5, 0.25)), h);
    CHECK(h, KL_F16, 0, 1.5, 2.25);
    kl_tensor *f = VEC(KL_F32, 1, 2);
    assert_ptr_equal(kl_eq_inplace(f, VEC(KL_F64, 1, 3)), f);
    CHECK(f, KL_F32, 0, 1, 0);
    kl_tensor *f2 = VEC(KL_F32, 1);
    assert_ptr_equal(kl_add_scalar_inplace(f2, 1e-9), f2); /* computed in f32 */
    CHECK(f2, KL_F32, 0, 1);
    kl_tensor *b = VEC(KL_BOOL, 1, 0);
    assert_ptr_equal(kl_bitwise_not_inplace(b), b);
    CHECK(b, KL_BOOL, 0, 0, 1);
    kl_tensor *l = VEC(KL_I64, 3);
    assert_ptr_equal(kl_bitwise_and_inplace(l, VEC(KL_BOOL, 1)), l);
    CHECK(l, KL_I64, 0, 1);
}

static void meta_inputs(void **s) {
    (void)s;
    kl_tensor *mi = kl_empty_on(KL_SHAPE(2, 3), KL_I32, KL_DEVICE_META);
    kl_tensor *md = kl_empty_on(KL_SHAPE(3), KL_F64, KL_DEVICE_META);
    kl_tensor *mb = kl_empty_on(KL_SHAPE(2, 1), KL_BOOL, KL_DEVICE_META);
    kl_tensor *r = kl_div(mi, md);
    kt_assert_shape(r, 2, (int64_t[]){2, 3});
    assert_int_equal(kl_dtype_of(r), KL_F64);
    assert_int_equal(kl_device_of(r).type, KL_META);
    assert_int_equal(kl_dtype_of(kl_where(mb, mi, md)), KL_F64);
    assert_int_equal(kl_dtype_of(kl_clamp(mi, 0.5, 1)), KL_F32);
    assert_int_equal(kl_dtype_of(kl_clamp(mi, 0, 1)), KL_I32);
    assert_int_equal(kl_dtype_of(kl_square(mb)), KL_I64);
    assert_int_equal(kl_dtype_of(kl_tril(mi, 1)), KL_I32);
    assert_int_equal(kl_dtype_of(kl_masked_fill(mi, mb, 1)), KL_I32);
    assert_int_equal(kl_dtype_of(kl_lerp_scalar(md, md, 0.5)), KL_F64);
    assert_int_equal(kl_dtype_of(kl_pow_scalar(mi, 2)), KL_I32);
    /* the shape rules refuse what the kernels could not run */
    assert_null(kl_pow_scalar(mi, -2));
    KT_EXPECT_ERROR(KL_ERR_ARG, "negative integer powers");
    assert_null(kl_remainder(mb, mb));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_remainder: not implemented for bool operands (input [2,1] bool meta)");
}

/* ---- errors ---------------------------------------------------------------------------------- */

static void errors(void **s) {
    (void)s;
    kl_tensor *f = VEC(KL_F32, 1, 2), *i = VEC(KL_I32, 3, 4), *b = VEC(KL_BOOL, 1, 0);
    /* bitwise ops take integers and bool only */
    assert_null(kl_bitwise_and(f, i));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_bitwise_and: expects integer or bool tensors, got [2] float32 cpu (argument 1)");
    assert_null(kl_bitwise_or_scalar(i, 2.5));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_bitwise_or: expects integer or bool operands, got a float scalar");
    assert_null(kl_bitwise_not(f));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_bitwise_not: expects integer or bool tensors, got [2] float32 cpu");
    /* bool refused where PyTorch refuses it */
    assert_null(kl_sub(b, b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_sub: expects numeric (non-bool) tensors, got [2] bool cpu (argument 1)");
    assert_null(kl_rsub_scalar(b, 1));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_sub: expects numeric (non-bool) tensors, got [2] bool cpu (argument 2)");
    assert_null(kl_abs(b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_abs: expects numeric (non-bool) tensors");
    assert_null(kl_floor(b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_floor: expects numeric (non-bool) tensors");
    assert_null(kl_remainder(b, b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_remainder: not implemented for bool operands (input [2] bool cpu)");
    assert_null(kl_pow(b, b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_pow: not implemented for bool operands");
    assert_null(kl_gelu(i));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_gelu: expects floating-point tensors, got [2] int32 cpu (argument 1)");
    /* integer division by zero, in every integer dtype, from tensors and scalars */
    assert_null(kl_remainder(i, VEC(KL_I32, 1, 0)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    assert_null(kl_remainder_scalar(VEC(KL_I64, 5), 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    assert_null(kl_remainder_scalar(VEC(KL_U8, 5), 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    int64_t v0 = kl_version_of(i);
    assert_null(kl_remainder_scalar_inplace(i, 0));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    assert_int_equal(kl_version_of(i), v0);
    CHECK(kl_remainder_scalar(f, 0), KL_F32, 0, NAN, NAN); /* floats give NaN */
    CHECK(kl_remainder_scalar(VEC(KL_I32, INT32_MIN), -1), KL_I32, 0, 0); /* no overflow trap */
    /* in-place results must cast into self */
    assert_null(kl_div_inplace(i, i));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_div: result type float32 can't be cast to the in-place output [2] int32 cpu");
    assert_null(kl_exp_inplace(VEC(KL_I64, 1)));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_exp: result type float32 can't be cast");
    assert_null(kl_add_scalar_inplace(b, 1));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_add: result type int64 can't be cast to the in-place output [2] bool cpu");
    assert_null(kl_square_inplace(b));
    KT_EXPECT_ERROR(KL_ERR_DTYPE, "kl_square: result type int64 can't be cast");
    assert_null(kl_mul_inplace(VEC(KL_F32, 1), f));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_mul: in-place output [1] float32 cpu cannot hold the broadcast result of shape [2]");
    assert_null(kl_exp_inplace(kl_expand(VEC(KL_F32, 1), KL_SHAPE(3))));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_exp: in-place write into [3] float32 cpu, which has broadcast (stride 0) dims");
    /* NULL arguments keep the first error */
    assert_null(kl_exp(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_exp: tensor argument 1 is NULL");
    assert_null(kl_add_scalar(NULL, 1));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_add: tensor argument 1 is NULL");
    assert_null(kl_rdiv_scalar(NULL, 1));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_div: tensor argument 1 is NULL");
    assert_null(kl_where(b, f, NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_where: tensor argument 3 is NULL");
    assert_null(kl_clamp(NULL, 0, 1));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_clamp: tensor argument 1 is NULL");
    assert_null(kl_tril(NULL, 0));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_tril: tensor argument 1 is NULL");
}

/* ---- big tensors: the parallel split and chunked conversion --------------------------------------- */

static void large_tensors(void **s) {
    (void)s;
    kl_manual_seed(7);
    kl_tensor *x = kl_randn(KL_SHAPE(300, 401), KL_F32), *xt = kl_t(x);
    kl_tensor *row = kl_randn(KL_SHAPE(300), KL_F64);
    kl_tensor *th = kl_tanh(xt), *sum = kl_add(xt, row), *cmp = kl_lt(xt, row);
    for (int64_t e = 0; e < 300 * 401; e++) {
        double v = kt_get(xt, e), w = kt_get(row, e % 300);
        if (fabs(kt_get(th, e) - tanh(v)) > 1e-6 || kt_get(sum, e) != v + w || kt_get(cmp, e) != (v < w)) {
            print_error("element %lld differs\n", (long long)e);
            fail();
        }
    }
    /* a zero divisor anywhere in a big integer tensor is still reported */
    kl_tensor *n = kl_arange(0, 200000, 1, KL_I32);
    assert_null(kl_remainder(kl_add_scalar(n, 1), kl_remainder_scalar(n, 150001)));
    KT_EXPECT_ERROR(KL_ERR_ARG, "integer division by zero");
    kl_tensor *same = kl_eq(kl_remainder_scalar(n, 7), kl_sub(n, kl_mul_scalar(kl_floor(kl_div_scalar(n, 7)), 7)));
    const uint8_t *p = kl_data_ptr(same);
    for (int64_t e = 0; e < 200000; e++) assert_int_equal(p[e], 1);
}

/* ---- accuracy of the f32 math functions ------------------------------------------------------------
 * Each op runs on 100000 f32 points of its domain (half evenly spaced, half
 * log-spaced magnitudes of both signs, so tiny arguments are covered) and is
 * compared with f64 libm on the same f32 inputs. err = |got - ref| /
 * max(|ref|, FLT_MIN) (subnormal results come from gradual underflow and
 * carry fewer bits). The test prints the measured maxima; the bounds are
 * about twice those (room for FMA vs non-FMA builds).
 * 1.19e-7 is one ulp at the bottom of a binade, so 2.4e-7 allows 2 ulp
 * including the final rounding. Measured (gcc 12, -O3 -march=native):
 * exp 8.6e-8, exp2 8.7e-8, expm1 1.1e-7, log 7.5e-8, log2 8.7e-8,
 * log1p 1.0e-7, sqrt 6.0e-8 (correctly rounded), rsqrt 6.0e-8, sin 1.2e-7,
 * cos 1.2e-7, tan 1.8e-7 (|x| <= 1e5), tanh 1.6e-7, sigmoid 1.6e-7,
 * erf 7.0e-8, gelu 3.4e-7, gelu_tanh 1.9e-7, silu 1.8e-7, softplus 1.2e-7. */

static double ref_rsqrt(double x) { return 1 / sqrt(x); }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
/* erfc and the logistic form avoid the cancellation of 1 + erf / 1 + tanh at negative x */
static double ref_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double ref_gelu_tanh(double x) {
    return x / (1 + exp(-2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
static double ref_silu(double x) { return x / (1 + exp(-x)); }
static double ref_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

typedef struct sweep_case {
    const char *name;
    unary_fn fn;
    double (*ref)(double);
    double lo, hi;  /* domain; lo > 0 means log-spaced only */
    double bound;   /* max err */
} sweep_case;

static const sweep_case sweeps[] = {
    {"exp", kl_exp, exp, -104, 89, 1.8e-7},
    {"exp2", kl_exp2, exp2, -150, 128, 1.8e-7},
    {"expm1", kl_expm1, expm1, -20, 89, 2.4e-7},
    {"log", kl_log, log, 1e-45, 3e38, 1.8e-7},
    {"log2", kl_log2, log2, 1e-45, 3e38, 1.8e-7},
    {"log1p", kl_log1p, log1p, -0.99999, 1e6, 2.4e-7},
    {"sqrt", kl_sqrt, sqrt, 1e-45, 3e38, 6e-8},
    {"rsqrt", kl_rsqrt, ref_rsqrt, 1e-38, 3e38, 1.2e-7},
    {"sin", kl_sin, sin, -1e5, 1e5, 2.4e-7},
    {"cos", kl_cos, cos, -1e5, 1e5, 2.4e-7},
    {"tan", kl_tan, tan, -1e5, 1e5, 3.6e-7},
    {"tanh", kl_tanh, tanh, -12, 12, 3e-7},
    {"sigmoid", kl_sigmoid, ref_sigmoid, -104, 30, 3e-7},
    {"erf", kl_erf, erf, -5, 5, 1.5e-7},
    {"gelu", kl_gelu, ref_gelu, -14, 14, 6e-7},
    {"gelu_tanh", kl_gelu_tanh, ref_gelu_tanh, -14, 14, 3.6e-7},
    {"silu", kl_silu, ref_silu, -100, 100, 3.6e-7},
    {"softplus", kl_softplus, ref_softplus, -100, 100, 2.4e-7},
};

static void accuracy_sweep(void **s) {
    (void)s;
    enum { N = 100000 };
    float *x = malloc(sizeof(float) * N);
    assert_non_null(x);
    for (size_t k = 0; k < sizeof sweeps / sizeof sweeps[0]; k++) {
        const sweep_case *c = &sweeps[k];
        kl_scope_begin();
        for (int i = 0; i < N; i++) {
            double t = (double)(i / 2) / (N / 2 - 1);
            if (c->lo > 0) { /* log-spaced over the whole domain */
                x[i] = (float)exp(log(c->lo) + (log(c->hi) - log(c->lo)) * (double)i / (N - 1));
            } else if (i % 2 == 0) {
                x[i] = (float)(c->lo + (c->hi - c->lo) * t);
            } else { /* +-10^[-30, log10(max)] alternating signs, within the domain */
                double m = exp(log(1e-30) + (log(fmin(-c->lo, c->hi)) - log(1e-30)) * t);
                x[i] = (float)((i / 2) % 2 ? -m : m);
            }
        }
        kl_tensor *r = c->fn(kl_from_data(x, KL_SHAPE(N), KL_F32));
        assert_non_null(r);
        const float *y = kl_data_ptr(r);
        double worst = 0, at = 0;
        for (int i = 0; i < N; i++) {
            double ref = c->ref((double)x[i]);
            int nan_differs = isnan(ref) != isnan(y[i]);
            if (isnan(ref) && !nan_differs) continue;
            double err = nan_differs ? INFINITY : fabs((double)y[i] - ref) / fmax(fabs(ref), FLT_MIN);
            volatile float ref32 = (float)ref; /* volatile: no folding of isinf((float)ref) to isinf(ref) */
            if (isinf(ref32)) err = y[i] == ref32 ? 0 : INFINITY; /* the f32 result overflows */
            if (err > worst) worst = err, at = x[i];
        }
        print_message("  %-10s max err %.3g at x = %.9g (bound %.2g)\n", c->name, worst, at, c->bound);
        if (!(worst <= c->bound)) {
            print_error("%s: error %.3g at x = %.9g exceeds %.2g\n", c->name, worst, at, c->bound);
            free(x);
            fail();
        }
        kl_scope_end();
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(unary_values),   KT_TEST(unary_int_values), KT_TEST(binary_values),
        KT_TEST(binary_int_values), KT_TEST(unary_dtype_rules), KT_TEST(binary_dtype_rules),
        KT_TEST(scalar_forms),   KT_TEST(pow_special_cases), KT_TEST(where_op),
        KT_TEST(clamp_op),       KT_TEST(lerp_op),          KT_TEST(masked_fill_op),
        KT_TEST(tril_triu),      KT_TEST(broadcasting),     KT_TEST(strided_inputs),
        KT_TEST(zero_size),      KT_TEST(inplace_views),    KT_TEST(meta_inputs),
        KT_TEST(errors),         KT_TEST(large_tensors),    KT_TEST(accuracy_sweep),
    };
    return cmocka_run_group_tests_name("ew", tests, NULL, NULL);
}
