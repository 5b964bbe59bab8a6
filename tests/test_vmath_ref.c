/*
 * test_vmath_ref.c — one definition of the math (docs/CODEGEN.md, "FP
 * contraction and bitwise equality"), checked on this machine without a GPU:
 *  - the eager f32 ops built on vmath.h, and the same ops compiled by
 *    kl_compile (LLVM kernels), equal bit for bit the vmath functions
 *    compiled apart with -ffp-contract=off (tests/cuda_vmath_ref.c: the
 *    reference the GPU test holds CUDA's -fmad=false kernels to), over 2^22
 *    bit patterns spread over all 2^32, 2^22 over +-[2^-8, 2^8) and special
 *    values; and lerp (a formula outside vmath, with plain multiply-adds)
 *    shows that eager and the kernels' bitcode are compiled without
 *    contraction: a contraction flag change in the library fails here;
 *    The two-argument functions (pow, atan2, hypot) likewise, over 2^22
 *    pairs (random bit patterns, all binades against moderate exponents,
 *    integer exponents of negative bases, and every pair of special values);
 *  - vmath compiled with -ffp-contract=fast equals vmath compiled with
 *    -ffp-contract=off, both with FMA: a multiply-add written as plain
 *    `a * b + c` instead of KE__FMA (which a contracting compiler would fuse
 *    on one device and not on another) fails here.
 */
#include "harness.h"

#include "dispatch.h"
#include "optable.h"
#ifdef KL_HAVE_LLVM
#include "cg_llvm.h"
#endif
#include "cuda_vmath_list.h"

#include <float.h>

#define KT_REF_DECL_(v)                                                     \
    void kt_vmath_ref_##v(int fn, const float *x, float *y, size_t n); \
    void kt_vmath_ref_##v##_lerp(const float *a, const float *b, const float *w, float *y, size_t n); \
    void kt_vmath_ref_##v##_2(int fn, const float *a, const float *b, float *y, size_t n);
KT_REF_DECL_(off)
KT_REF_DECL_(fast)
#ifdef KT_HAVE_FMA_REF
KT_REF_DECL_(fma_off)
KT_REF_DECL_(fma_fast)
#endif

#define KT_NAME_(id, name) #name,
static const char *const fn_names[] = {KT_VMATH_LIST_CPU(KT_NAME_)};
static const char *const fn2_names[] = {KT_VMATH_LIST2(KT_NAME_)};
#undef KT_NAME_
_Static_assert(sizeof fn2_names / sizeof *fn2_names == KT_VMATH_COUNT2, "KT_VMATH_COUNT2 matches the list");
_Static_assert(sizeof fn_names / sizeof *fn_names == KT_VMATH_COUNT_CPU, "KT_VMATH_COUNT_CPU matches the list");

/* The eager op of each function: its op id, its attribute (logit's eps < 0:
 * no clamp) and whether PyTorch's formula gives NaN at -inf where vmath gives
 * the limit (the eager loop selects NaN there). */
typedef struct fn_op {
    int op;
    double f0;
    int nan_at_neg_inf;
} fn_op;
static fn_op op_of(int fn) {
    const char *name = fn_names[fn];
    if (!strcmp(name, "gelu_erf")) name = "gelu";
    fn_op o = {-1, 0, 0};
    for (int i = 0; i < KE_OP_COUNT; i++)
        if (!strcmp(ke_ops[i].name, name)) o.op = i;
    assert_true(o.op >= 0);
    if (!strcmp(name, "logit")) o.f0 = -1;
    o.nan_at_neg_inf = !strcmp(name, "gelu") || !strcmp(name, "gelu_tanh") || !strcmp(name, "silu") ||
                       !strcmp(name, "mish");
    return o;
}

/* eager's sin/cos/tan switch a block of 256 elements to libm when one element
 * is beyond 8e8 or not finite (docs/CODEGEN.md): those inputs are left out */
static int is_trig(int fn) {
    return !strcmp(fn_names[fn], "sin") || !strcmp(fn_names[fn], "cos") || !strcmp(fn_names[fn], "tan");
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* 2^22 bit patterns spread over all 2^32 (a multiplicative hash fills the
 * gaps), 2^22 more over +-[2^-8, 2^8) where the functions do most of their
 * work (every 64th pattern, jittered), then special values; trig: only
 * |x| <= 8e8. Returns the count. */
static const float special[] = {0.0f,      -0.0f,    INFINITY,   -INFINITY,   NAN,      -NAN,   FLT_MIN,
                                -FLT_MIN,  FLT_MAX,  -FLT_MAX,   1e-45f,      -1e-45f,  0.5f,   1.0f,
                                -1.0f,     2.0f,     0.25f,      0.75f,       20.0f,    -20.0f, 88.72283f,
                                -87.3365f, -103.97f, 14.849242f, -14.849242f, 3.0e-39f, 8.0e8f, -8.0e8f};
#define NSPECIAL ((int64_t)(sizeof special / sizeof *special))
#define NSWEEP ((int64_t)1 << 23)
static int64_t make_inputs(float *v, int trig) {
    int64_t m = 0;
    for (int64_t i = 0; i < NSWEEP; i++) {
        uint32_t h = (uint32_t)((uint64_t)i * 2654435761u);
        uint32_t b = i < NSWEEP / 2 ? (uint32_t)i * 2048u + (h >> 21)
                                    : (0x3b800000u + (uint32_t)(i - NSWEEP / 2) / 2u * 64u + (h >> 26)) |
                                          (uint32_t)(i & 1) << 31;
        float x;
        memcpy(&x, &b, 4);
        if (!trig || fabsf(x) <= 8e8f) v[m++] = x;
    }
    for (int64_t i = 0; i < NSPECIAL; i++)
        if (!trig || fabsf(special[i]) <= 8e8f) v[m++] = special[i];
    return m;
}

/* Bitwise differences (any NaN equals any NaN: payloads are not part of the
 * contract), the first one printed. */
static int64_t count_diff(const char *what, const char *name, const float *x, const float *got, const float *want,
                          int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (f2u(got[i]) == f2u(want[i]) || (isnan(got[i]) && isnan(want[i]))) continue;
        if (!bad)
            print_message("%-10s %s: first at x=%a: %a (0x%08x), reference %a (0x%08x)\n", name, what, (double)x[i],
                          (double)got[i], f2u(got[i]), (double)want[i], f2u(want[i]));
        bad++;
    }
    if (bad) print_message("%-10s %s: %lld of %lld differ\n", name, what, (long long)bad, (long long)n);
    return bad;
}

/* The op of fn_op as a traced function (user = fn_op *). */
static int one_op(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const fn_op *o = user;
    kl_tensor *x[1] = {in[0]};
    ke_call c = {.op = o->op, .nin = 1, .in = x};
    c.a.f[0] = o->f0;
    out[0] = ke_call1(&c);
    return out[0] ? 0 : -1;
}

/* Eager and compiled f32 ops against the no-contraction reference. */
static void eager_and_compiled_equal_reference(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    float *ref = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    assert_non_null(x);
    assert_non_null(ref);
    int64_t total = 0;
#ifdef KL_HAVE_LLVM
    int64_t fb0 = cg_llvm_fallbacks();
#endif
    for (int fn = 0; fn < KT_VMATH_COUNT_CPU; fn++) {
        int64_t n = make_inputs(x, is_trig(fn));
        fn_op o = op_of(fn);
        kt_vmath_ref_off(fn, x, ref, (size_t)n);
        if (o.nan_at_neg_inf)
            for (int64_t i = 0; i < n; i++)
                if (x[i] == -INFINITY) ref[i] = NAN;
        kl_scope_begin();
        kl_tensor *xt = kl_from_data(x, 1, (int64_t[]){n}, KL_F32);
        assert_non_null(xt);
        kl_tensor *ye = NULL;
        assert_int_equal(one_op(&o, &xt, 1, &ye, 1), 0);
        total += count_diff("eager", fn_names[fn], x, kl_data_ptr(ye), ref, n);
#ifdef KL_HAVE_LLVM
        kl_compile_options opt = kl_compile_options_default();
        opt.backend = "llvm";
        kl_fn *f = kl_compile(one_op, &o, &opt);
        assert_non_null(f);
        kl_tensor *yc = NULL;
        assert_int_equal(kl_fn_call(f, &xt, 1, &yc, 1), 0);
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.eager_calls, 0); /* a traced graph of one kernel ran */
        assert_int_equal(st.kernels, 1);
        total += count_diff("compiled", fn_names[fn], x, kl_data_ptr(yc), ref, n);
        kl_fn_release(f);
#endif
        kl_scope_end();
    }
#ifdef KL_HAVE_LLVM
    assert_int_equal(cg_llvm_fallbacks(), fb0); /* every kernel ran LLVM code, none the interpreter */
#else
    print_message("built without LLVM: compiled kernels not checked\n");
#endif
    free(x);
    free(ref);
    assert_int_equal(total, 0);
}

static int lerp_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)user, (void)n_in, (void)n_out;
    out[0] = kl_lerp(in[0], in[1], in[2]);
    return out[0] ? 0 : -1;
}

/* Formulas outside vmath follow the rule too: eager and compiled lerp (a
 * multiply-add in each branch) against the no-contraction reference. A build
 * that contracts (GCC's default for eager, clang's 'on' for the bitcode)
 * fuses them on a machine with FMA and fails here. */
static void lerp_equals_reference(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    float *v = malloc(sizeof(float) * 4 * N);
    assert_non_null(v);
    float *a = v, *b = v + N, *w = v + 2 * N, *ref = v + 3 * N;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) { /* a, b in +-2^e with e in [-8, 8), w in [-0.5, 1.5) */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = ldexpf((float)(int32_t)(s >> 32) * 0x1p-31f, (int)(s >> 8 & 15) - 8);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b[i] = ldexpf((float)(int32_t)(s >> 32) * 0x1p-31f, (int)(s >> 8 & 15) - 8);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)(s >> 40) * 0x1p-24f * 2.0f - 0.5f;
    }
    kt_vmath_ref_off_lerp(a, b, w, ref, N);
    kl_tensor *in[3] = {kl_from_data(a, 1, (int64_t[]){N}, KL_F32), kl_from_data(b, 1, (int64_t[]){N}, KL_F32),
                        kl_from_data(w, 1, (int64_t[]){N}, KL_F32)};
    kl_tensor *ye = NULL;
    assert_int_equal(lerp_fn(NULL, in, 3, &ye, 1), 0);
    int64_t total = count_diff("eager", "lerp", a, kl_data_ptr(ye), ref, N);
#ifdef KL_HAVE_LLVM
    int64_t fb0 = cg_llvm_fallbacks();
    kl_compile_options opt = kl_compile_options_default();
    opt.backend = "llvm";
    kl_fn *f = kl_compile(lerp_fn, NULL, &opt);
    assert_non_null(f);
    kl_tensor *yc = NULL;
    assert_int_equal(kl_fn_call(f, in, 3, &yc, 1), 0);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(f, &st), 0);
    assert_int_equal(st.eager_calls, 0);
    assert_int_equal(st.kernels, 1);
    total += count_diff("compiled", "lerp", a, kl_data_ptr(yc), ref, N);
    kl_fn_release(f);
    assert_int_equal(cg_llvm_fallbacks(), fb0);
#endif
    free(v);
    assert_int_equal(total, 0);
}

/* ---- two-argument functions ---------------------------------------------------- */

static uint64_t xs64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static float u2f(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* NPAIRS pairs: a quarter random bit patterns for both; a quarter any a
 * against b in +-[2^-8, 2^8) (pow then reaches every result binade), every
 * fourth b an integer in [-40, 40] (signs of negative bases); half both in
 * +-[2^-8, 2^8); then every pair of special values. Returns the count. */
#define NPAIRS ((int64_t)1 << 22)
static int64_t make_pairs(float *a, float *b) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    int64_t m = 0;
    for (int64_t i = 0; i < NPAIRS; i++, m++) {
        uint64_t r = xs64(&s);
        uint32_t lo = (uint32_t)r, hi = (uint32_t)(r >> 32);
        /* +-[2^-8, 2^8): exponent field 119..134, random mantissa and sign */
        float ma = u2f((lo & 0x807fffffu) | (119u + (lo >> 23 & 15u)) << 23);
        float mb = u2f((hi & 0x807fffffu) | (119u + (hi >> 23 & 15u)) << 23);
        if (i < NPAIRS / 4) {
            a[m] = u2f(lo);
            b[m] = u2f(hi);
        } else if (i < NPAIRS / 2) {
            a[m] = u2f((uint32_t)xs64(&s));
            b[m] = (i & 3) ? mb : (float)((int)(hi % 81u) - 40);
        } else {
            a[m] = ma;
            b[m] = mb;
        }
    }
    for (int64_t i = 0; i < NSPECIAL; i++)
        for (int64_t j = 0; j < NSPECIAL; j++, m++) a[m] = special[i], b[m] = special[j];
    return m;
}

static int op2_fn(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)n_in, (void)n_out;
    const char *name = fn2_names[*(const int *)user];
    out[0] = !strcmp(name, "pow")     ? kl_pow(in[0], in[1])
             : !strcmp(name, "atan2") ? kl_atan2(in[0], in[1])
                                      : kl_hypot(in[0], in[1]);
    return out[0] ? 0 : -1;
}

/* count_diff for pairs: the first difference names both operands. */
static int64_t count_diff2(const char *what, const char *name, const float *a, const float *b, const float *got,
                           const float *want, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (f2u(got[i]) == f2u(want[i]) || (isnan(got[i]) && isnan(want[i]))) continue;
        if (!bad)
            print_message("%-10s %s: first at (%a, %a): %a (0x%08x), reference %a (0x%08x)\n", name, what, (double)a[i],
                          (double)b[i], (double)got[i], f2u(got[i]), (double)want[i], f2u(want[i]));
        bad++;
    }
    if (bad) print_message("%-10s %s: %lld of %lld differ\n", name, what, (long long)bad, (long long)n);
    return bad;
}

/* Eager and compiled pow / atan2 / hypot (tensor operands) against the
 * no-contraction reference. */
static void eager_and_compiled_equal_reference_2(void **state) {
    (void)state;
    size_t cap = (size_t)(NPAIRS + NSPECIAL * NSPECIAL);
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap), *ref = malloc(sizeof(float) * cap);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(ref);
    int64_t n = make_pairs(a, b), total = 0;
#ifdef KL_HAVE_LLVM
    int64_t fb0 = cg_llvm_fallbacks();
#endif
    for (int fn = 0; fn < KT_VMATH_COUNT2; fn++) {
        kt_vmath_ref_off_2(fn, a, b, ref, (size_t)n);
        kl_scope_begin();
        kl_tensor *in[2] = {kl_from_data(a, 1, (int64_t[]){n}, KL_F32), kl_from_data(b, 1, (int64_t[]){n}, KL_F32)};
        assert_non_null(in[0]);
        assert_non_null(in[1]);
        kl_tensor *ye = NULL;
        assert_int_equal(op2_fn(&fn, in, 2, &ye, 1), 0);
        total += count_diff2("eager", fn2_names[fn], a, b, kl_data_ptr(ye), ref, n);
#ifdef KL_HAVE_LLVM
        kl_compile_options opt = kl_compile_options_default();
        opt.backend = "llvm";
        kl_fn *f = kl_compile(op2_fn, &fn, &opt);
        assert_non_null(f);
        kl_tensor *yc = NULL;
        assert_int_equal(kl_fn_call(f, in, 2, &yc, 1), 0);
        kl_fn_stats st;
        assert_int_equal(kl_fn_get_stats(f, &st), 0);
        assert_int_equal(st.eager_calls, 0);
        assert_int_equal(st.kernels, 1);
        total += count_diff2("compiled", fn2_names[fn], a, b, kl_data_ptr(yc), ref, n);
        kl_fn_release(f);
#endif
        kl_scope_end();
    }
#ifdef KL_HAVE_LLVM
    assert_int_equal(cg_llvm_fallbacks(), fb0);
#endif
    free(a);
    free(b);
    free(ref);
    assert_int_equal(total, 0);
}

/* The two-argument references with and without contraction: equal.
 * (fn_off, fn_fast): the library's instruction set, or with FMA. */
typedef void (*ref2_fn)(int, const float *, const float *, float *, size_t);
static int64_t contraction_diff_2(ref2_fn off, ref2_fn fast, const char *what) {
    size_t cap = (size_t)(NPAIRS + NSPECIAL * NSPECIAL);
    float *a = malloc(sizeof(float) * cap), *b = malloc(sizeof(float) * cap), *r0 = malloc(sizeof(float) * cap),
          *r1 = malloc(sizeof(float) * cap);
    assert_true(a && b && r0 && r1);
    int64_t n = make_pairs(a, b), total = 0;
    for (int fn = 0; fn < KT_VMATH_COUNT2; fn++) {
        off(fn, a, b, r0, (size_t)n);
        fast(fn, a, b, r1, (size_t)n);
        total += count_diff2(what, fn2_names[fn], a, b, r1, r0, n);
    }
    free(a);
    free(b);
    free(r0);
    free(r1);
    return total;
}

/* The references themselves: with contraction, as without (with FMA). */
static void contraction_changes_nothing(void **state) {
    (void)state;
#ifndef KT_HAVE_FMA_REF
    print_message("skipped: the compiler cannot target FMA (-mfma)\n");
    skip();
#else
    if (!__builtin_cpu_supports("fma")) {
        print_message("skipped: this CPU has no FMA\n");
        skip();
    }
    float *x = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    float *a = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    float *b = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    int64_t total = 0;
    for (int fn = 0; fn < KT_VMATH_COUNT_CPU; fn++) {
        int64_t n = make_inputs(x, 0);
        kt_vmath_ref_fma_off(fn, x, a, (size_t)n);
        kt_vmath_ref_fma_fast(fn, x, b, (size_t)n);
        total += count_diff("-ffp-contract=fast vs off", fn_names[fn], x, b, a, n);
    }
    total += contraction_diff_2(kt_vmath_ref_fma_off_2, kt_vmath_ref_fma_fast_2, "-ffp-contract=fast vs off");
    free(x);
    free(a);
    free(b);
    assert_int_equal(total, 0);
#endif
}

/* The library's own instruction set: its fast build against its off build
 * (the same as above where the build has FMA; on a build without FMA no
 * compiler can contract, and the two must agree trivially). */
static void contraction_changes_nothing_here(void **state) {
    (void)state;
    float *x = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    float *a = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    float *b = malloc(sizeof(float) * (size_t)(NSWEEP + NSPECIAL));
    assert_non_null(x);
    assert_non_null(a);
    assert_non_null(b);
    int64_t total = 0;
    for (int fn = 0; fn < KT_VMATH_COUNT_CPU; fn++) {
        int64_t n = make_inputs(x, 0);
        kt_vmath_ref_off(fn, x, a, (size_t)n);
        kt_vmath_ref_fast(fn, x, b, (size_t)n);
        total += count_diff("-ffp-contract=fast vs off (library ISA)", fn_names[fn], x, b, a, n);
    }
    total += contraction_diff_2(kt_vmath_ref_off_2, kt_vmath_ref_fast_2, "-ffp-contract=fast vs off (library ISA)");
    free(x);
    free(a);
    free(b);
    assert_int_equal(total, 0);
}

int main(void) {
    /* tests stay out of the user's kernel cache */
    setenv("KL_CACHE_DIR", "off", 1);
    const struct CMUnitTest tests[] = {
        KT_TEST(eager_and_compiled_equal_reference),
        KT_TEST(eager_and_compiled_equal_reference_2),
        KT_TEST(lerp_equals_reference),
        KT_TEST(contraction_changes_nothing),
        KT_TEST(contraction_changes_nothing_here),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
