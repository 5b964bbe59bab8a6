/*
 * test_codegen.c — the LLVM backend (src/codegen_llvm): every f32 math op
 * over a dense sweep with special values (bitwise against eager where the
 * docs say so, ulps against a double reference), the fuse workloads run
 * through LLVM against the interpreter (bitwise for elementwise kernels)
 * and against eager, strided / broadcast / dtype / in-place / multi-output
 * kernels, loop errors, compile errors and the fallback to the interpreter.
 */
#include "harness.h"

#include "cg_llvm.h"
#include "kernel.h"
#include "kernels_nn.h"
#include "trace.h"
#include "workloads.h"
#ifdef KL_HAVE_LLVM
#include "../src/eager/diskcache.h"
#endif

#include <float.h>
#include <stdlib.h>

#ifdef KL_HAVE_LLVM

/* ---- direct kernels ----------------------------------------------------------------- */

/* y = op(x) over n elements of dtype dt computing in cdt, as lower.c builds it. */
typedef struct kbuild {
    ir_kernel k;
    ir_kbuf bufs[8];
    ir_kstmt st[16];
} kbuild;

static void kb_init(kbuild *b, int ndim, const int64_t *shape) {
    memset(b, 0, sizeof *b);
    b->k.ndim = (uint8_t)ndim;
    memcpy(b->k.shape, shape, sizeof(int64_t) * ndim);
    b->k.bufs = b->bufs;
    b->k.stmts = b->st;
}

/* A contiguous buffer shaped like the domain. */
static int kb_buf(kbuild *b, int dt, int output) {
    int i = b->k.ninputs + b->k.noutputs;
    ir_kbuf *f = &b->bufs[i];
    f->dtype = (uint8_t)dt;
    f->ndim = b->k.ndim;
    f->output = (uint8_t)output;
    int64_t s = 1;
    for (int d = b->k.ndim - 1; d >= 0; d--) {
        f->shape[d] = b->k.shape[d];
        f->stride[d] = f->index[d] = s;
        s *= b->k.shape[d];
    }
    f->contig_inner = 1;
    if (output) b->k.noutputs++;
    else b->k.ninputs++;
    return i;
}

static int kb_stmt(kbuild *b, ir_kstmt s) {
    b->st[b->k.nstmts] = s;
    return b->k.nstmts++;
}

static kl_tensor *sweep_f32(int64_t *n_out) {
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MIN, -FLT_MIN, FLT_MAX,
                                    -FLT_MAX, 1e-45f, -1e-45f, 1.17e-38f, 88.72283f, 88.7229f, -87.33654f,
                                    -103.97208f, -104.0f, 89.0f, 0.5f, 1.0f, -1.0f, 2.0f, 20.0f, 9.0f, -9.0f,
                                    1e-8f, 3.14159265f, 8.0e8f, 8.5e8f, 1e10f, -1e10f, 0.693147f, 1e4f, -1e4f};
    int64_t ns = (int64_t)(sizeof special / sizeof special[0]);
    const uint32_t step = 2053; /* every 2053rd bit pattern: ~2.1M values over all signs and exponents */
    int64_t n = ns + (int64_t)(0xffffffffu / step) + 1;
    float *v = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    memcpy(v, special, sizeof special);
    int64_t i = ns;
    for (uint64_t u = 0; u <= 0xffffffffu && i < n; u += step, i++) {
        uint32_t w = (uint32_t)u;
        memcpy(&v[i], &w, 4);
    }
    kl_tensor *t = kl_from_data(v, 1, (int64_t[]){i}, KL_F32);
    free(v);
    *n_out = i;
    return t;
}

static kl_tensor *run_backend(const ir_backend *b, ir_kernel *k, kl_tensor *const *in, int dt_out) {
    kl_tensor *y = kl_empty(k->ndim, k->shape, (kl_dtype)dt_out);
    void *h = b == &cg_llvm_backend ? cg_llvm_compile_strict(k) : b->compile(k);
    assert_non_null(h);
    assert_int_equal(b->run(h, in, &y), 0);
    b->free(h);
    return y;
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ulps between a float and the double reference, NaN = NaN */
static double ulps(float got, double ref) {
    if (isnan(ref) || isnan(got)) return isnan(ref) && isnan(got) ? 0 : 1e9;
    if (isinf(ref) || isinf(got)) return (float)ref == got ? 0 : 1e9;
    double r = ref;
    int e;
    frexp((float)r, &e);
    double ulp = ldexp(1.0, (e - 24 > -149 ? e - 24 : -149));
    return fabs((double)got - r) / ulp;
}

typedef struct mathop {
    int op;
    double (*ref)(double);
    double lo, hi;   /* domain of the ulp check */
    double max_ulp;  /* vmath.h's documented bound */
} mathop;

static double d_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double d_rsqrt(double x) { return 1 / sqrt(x); }
/* stable forms (as test_vmath.c); NaN at -inf as PyTorch's formulas give */
static double d_gelu(double x) { return x == -INFINITY ? NAN : x == INFINITY ? x : 0.5 * x * erfc(-x / sqrt(2.0)); }
static double d_gelu_tanh(double x) {
    return x == -INFINITY ? NAN : x == INFINITY ? x : x * d_sigmoid(2 * 0.7978845608028654 * (x + 0.044715 * x * x * x));
}
static double d_silu(double x) { return x == -INFINITY ? NAN : x == INFINITY ? x : x * d_sigmoid(x); }
static double d_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }
static double d_recip(double x) { return 1 / x; }
/* issue 12's ops; the elu family's coefficients as the f32 kernel rounds them */
static double d_logit(double x) { return x < 0.25 || x > 0.75 ? log(x / (1 - x)) : log1p((2 * x - 1) / (1 - x)); }
static double d_mish(double x) {
    if (isinf(x)) return x > 0 ? x : NAN;
    double t = exp(x);
    return x > 20 ? x : x * (t * (t + 2)) / (t * (t + 2) + 2);
}
static double d_selu(double x) {
    return x <= 0 ? expm1(x) * (double)((float)1.6732632423543772 * (float)1.0507009873554805)
                  : x * (double)(float)1.0507009873554805;
}
static double d_elu1(double x) { return x <= 0 ? expm1(x) : x; }
static double d_celu2(double x) { return x <= 0 ? expm1(x * 0.5) * 2 : x; }
static double d_leaky(double x) { return x > 0 ? x : x * (double)0.01f; }
static double d_hsig(double x) { return x != x ? x : fmin(fmax(x + 3, 0), 6) / 6; }
static double d_hswish(double x) { return x != x ? x : x * fmin(fmax(x + 3, 0), 6) / 6; }
static double d_softsign(double x) { return x / (fabs(x) + 1); }
static double d_hardtanh(double x) { return x != x ? x : fmin(fmax(x, -1), 1); }

static const mathop math_ops[] = {
    {KE_OP_exp, exp, -104, 89, 2},          {KE_OP_exp2, exp2, -150, 128, 2},
    {KE_OP_expm1, expm1, -20, 89, 3},       {KE_OP_log, log, 0, INFINITY, 2},
    {KE_OP_log2, log2, 0, INFINITY, 2},     {KE_OP_log1p, log1p, -1, INFINITY, 3},
    {KE_OP_sqrt, sqrt, 0, INFINITY, 0.5},   {KE_OP_rsqrt, d_rsqrt, 0, INFINITY, 1},
    {KE_OP_reciprocal, d_recip, -INFINITY, INFINITY, 0.5},
    {KE_OP_sin, sin, -1e4, 1e4, 4},         {KE_OP_cos, cos, -1e4, 1e4, 4},
    {KE_OP_tan, tan, -1e4, 1e4, 6},         {KE_OP_tanh, tanh, -INFINITY, INFINITY, 4},
    {KE_OP_sigmoid, d_sigmoid, -INFINITY, INFINITY, 4},
    {KE_OP_erf, erf, -INFINITY, INFINITY, 4},
    {KE_OP_gelu, d_gelu, -INFINITY, INFINITY, 4},
    {KE_OP_gelu_tanh, d_gelu_tanh, -INFINITY, INFINITY, 4},
    {KE_OP_silu, d_silu, -INFINITY, INFINITY, 4},
    {KE_OP_softplus, d_softplus, -INFINITY, INFINITY, 3},
    {KE_OP_floor, floor, -INFINITY, INFINITY, 0}, {KE_OP_ceil, ceil, -INFINITY, INFINITY, 0},
    {KE_OP_trunc, trunc, -INFINITY, INFINITY, 0}, {KE_OP_round, nearbyint, -INFINITY, INFINITY, 0},
    {KE_OP_abs, fabs, -INFINITY, INFINITY, 0},    {KE_OP_relu, NULL, 0, 0, 0},
    {KE_OP_neg, NULL, 0, 0, 0},                   {KE_OP_square, NULL, 0, 0, 0},
    {KE_OP_sign, NULL, 0, 0, 0},
};

/* issue 12's ops, with their attributes (a.f[0], a.f[1]) where they have some */
typedef struct mathop_attr {
    mathop m;
    double f0, f1;
} mathop_attr;
static const mathop_attr math_ops_attr[] = {
    {{KE_OP_sinh, sinh, -INFINITY, INFINITY, 3}, 0, 0},
    {{KE_OP_cosh, cosh, -INFINITY, INFINITY, 2}, 0, 0},
    {{KE_OP_asin, asin, -INFINITY, INFINITY, 1}, 0, 0},
    {{KE_OP_acos, acos, -INFINITY, INFINITY, 1}, 0, 0},
    {{KE_OP_atan, atan, -INFINITY, INFINITY, 1}, 0, 0},
    {{KE_OP_asinh, asinh, -INFINITY, INFINITY, 3}, 0, 0},
    {{KE_OP_acosh, acosh, -INFINITY, INFINITY, 3}, 0, 0},
    {{KE_OP_atanh, atanh, -INFINITY, INFINITY, 3}, 0, 0},
    {{KE_OP_log10, log10, -INFINITY, INFINITY, 1}, 0, 0},
    {{KE_OP_logit, d_logit, -INFINITY, INFINITY, 3}, -1, 0},
    {{KE_OP_logit, NULL, 0, 0, 0}, 0.25, 0},
    {{KE_OP_mish, d_mish, -INFINITY, INFINITY, 2}, 0, 0},
    {{KE_OP_selu, d_selu, -INFINITY, INFINITY, 2}, 0, 0},
    {{KE_OP_elu, d_elu1, -INFINITY, INFINITY, 2}, 1, 0},
    {{KE_OP_celu, d_celu2, -INFINITY, INFINITY, 2}, 2, 0},
    {{KE_OP_leaky_relu, d_leaky, -INFINITY, INFINITY, 0.5}, 0.01, 0},
    {{KE_OP_hardsigmoid, d_hsig, -INFINITY, INFINITY, 2}, 0, 0},
    {{KE_OP_hardswish, d_hswish, -1e30, 1e30, 3}, 0, 0},
    {{KE_OP_softsign, d_softsign, -INFINITY, INFINITY, 2}, 0, 0},
    {{KE_OP_hardtanh, d_hardtanh, -INFINITY, INFINITY, 0}, -1, 1},
    {{KE_OP_hardtanh, NULL, 0, 0, 0}, 0.5, -2},
};
#define N_MATH_OPS (sizeof math_ops / sizeof math_ops[0])
#define N_MATH_ALL (N_MATH_OPS + sizeof math_ops_attr / sizeof math_ops_attr[0])

/* Every op's compiled f32 result is bitwise eager's (docs/CODEGEN.md). The
 * trig loops of eager switch a block of 256 elements to libm when one of
 * them is beyond 8e8 (or not finite); compiled code decides per element,
 * so trig ops are swept over |x| <= 8e8. */
static int64_t eager_mismatches(const float *a, const float *b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (f2u(a[i]) != f2u(b[i]) && !(isnan(a[i]) && isnan(b[i]))) bad++;
    return bad;
}



/* Trig inputs without |x| > 8e8 or non-finite values (see eager_mismatches). */
static kl_tensor *trig_domain(kl_tensor *x, int64_t *n) {
    const float *xv = kl_data_ptr(x);
    float *v = malloc(sizeof(float) * (size_t)*n);
    assert_non_null(v);
    int64_t m = 0;
    for (int64_t i = 0; i < *n; i++)
        if (fabsf(xv[i]) <= 8e8f) v[m++] = xv[i];
    kl_tensor *t = kl_from_data(v, 1, (int64_t[]){m}, KL_F32);
    free(v);
    *n = m;
    return t;
}

static void f32_math_sweep(void **state) {
    (void)state;
    int64_t nall, ntrig;
    kl_tensor *xall = sweep_f32(&nall);
    ntrig = nall;
    kl_tensor *xtrig = trig_domain(xall, &ntrig);
    int64_t total_bad = 0;
    for (size_t o = 0; o < N_MATH_ALL; o++) {
        const mathop *m = o < N_MATH_OPS ? &math_ops[o] : &math_ops_attr[o - N_MATH_OPS].m;
        double f0 = o < N_MATH_OPS ? 0 : math_ops_attr[o - N_MATH_OPS].f0;
        double f1 = o < N_MATH_OPS ? 0 : math_ops_attr[o - N_MATH_OPS].f1;
        int trig = m->op == KE_OP_sin || m->op == KE_OP_cos || m->op == KE_OP_tan;
        kl_tensor *x = trig ? xtrig : xall;
        int64_t n = trig ? ntrig : nall;
        const float *xv = kl_data_ptr(x);
        kbuild b;
        kb_init(&b, 1, (int64_t[]){n});
        kb_buf(&b, KL_F32, 0);
        kb_buf(&b, KL_F32, 1);
        int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F32, .buf = 0, .op = -1});
        ir_kstmt os = {.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = m->op, .nargs = 1, .args = {l}};
        os.a.f[0] = f0, os.a.f[1] = f1;
        int r = kb_stmt(&b, os);
        kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 1, .nargs = 1, .args = {r}, .op = -1});
        kl_tensor *y = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
        kl_tensor *yi = run_backend(&ir_interp_backend, &b.k, &x, KL_F32);
        kl_tensor *in1[1] = {x};
        ke_call ec = {.op = m->op, .nin = 1, .in = in1};
        ec.a.f[0] = f0, ec.a.f[1] = f1;
        kl_tensor *ye = ke_call1(&ec);
        assert_non_null(ye);
        const float *yv = kl_data_ptr(y), *iv = kl_data_ptr(yi), *ev = kl_data_ptr(ye);
        int64_t bad_interp = eager_mismatches(yv, iv, n), bad_eager = eager_mismatches(yv, ev, n);
        double worst = 0;
        if (m->ref)
            for (int64_t i = 0; i < n; i++) {
                if (!(xv[i] >= m->lo && xv[i] <= m->hi) && !isnan(xv[i])) continue;
                double u = ulps(yv[i], m->ref((double)xv[i]));
                if (u > worst) worst = u;
            }
        if (getenv("KT_VERBOSE") || bad_eager || bad_interp || worst > m->max_ulp)
            print_message("%-10s max %.2f ulp (bound %.1f); differs from eager at %lld of %lld, from interp at %lld\n",
                          ke_ops[m->op].name, worst, m->max_ulp, (long long)bad_eager, (long long)n,
                          (long long)bad_interp);
        assert_true(worst <= m->max_ulp);
        total_bad += bad_eager + bad_interp;
    }
    assert_int_equal(total_bad, 0);
}

/* ---- workloads through kl_compile ---------------------------------------------------- */

static kl_tensor *seq(int64_t n, double scale, kl_dtype dt) {
    return kl_to_dtype(kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F64), (double)n / 2), scale), dt);
}

static kl_tensor *noise(int64_t n, double scale, kl_dtype dt) {
    return kl_to_dtype(kl_mul_scalar(kl_sin(kl_mul_scalar(kl_arange(0, (double)n, 1, KL_F64), 12.9898)), scale), dt);
}

/* Runs fn eagerly, compiled with backend "llvm" and with "interp" (each on
 * its own clones of in[] when fn writes its inputs), twice each. LLVM and
 * the interpreter agree bit for bit (elementwise kernels call the same eager
 * loops; row folds run the same eager row fold); against eager within tol
 * (0: bitwise). Inputs written in place are compared too. No kernel may
 * have fallen back to the interpreter. */
static void compare_backends(kl_traceable fn, kl_tensor **in, int n_in, int n_out, double tol) {
    int64_t fb0 = cg_llvm_fallbacks();
    kl_tensor *res[3][4] = {{0}}, *ins[3][8];
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < n_in; i++) ins[r][i] = kl_clone(in[i]);
        if (r == 0) {
            assert_int_equal(fn(NULL, ins[r], n_in, res[r], n_out), 0);
            continue;
        }
        kl_compile_options o = kl_compile_options_default();
        o.interp_tier = -1; /* compiled at the first call */
        o.backend = r == 1 ? "llvm" : "interp";
        kl_fn *f = kl_compile(fn, NULL, &o);
        assert_non_null(f);
        /* twice: the second call runs the cached kernels (on fresh clones for in-place fns) */
        for (int call = 0; call < 2; call++) {
            if (call)
                for (int i = 0; i < n_in; i++) ins[r][i] = kl_clone(in[i]);
            assert_int_equal(kl_fn_call(f, ins[r], n_in, res[r], n_out), 0);
        }
        kl_fn_release(f);
    }
    for (int j = 0; j < n_out + n_in; j++) {
        kl_tensor *a = j < n_out ? res[1][j] : ins[1][j - n_out], *b = j < n_out ? res[2][j] : ins[2][j - n_out],
                  *e = j < n_out ? res[0][j] : ins[0][j - n_out];
        assert_int_equal(a->dtype, e->dtype);
        if (kl_allclose(a, b, 0, 0, true) != 1) {
            kl_tensor *a64 = kl_contiguous(kl_to_dtype(a, KL_F64)), *b64 = kl_contiguous(kl_to_dtype(b, KL_F64));
            const double *av = kl_data_ptr(a64), *bv = kl_data_ptr(b64);
            for (int64_t q = 0, shown = 0; q < kl_numel(a) && shown < 4; q++)
                if (av[q] != bv[q] && !(isnan(av[q]) && isnan(bv[q])))
                    print_message("output %d [%lld]: llvm %.17g interp %.17g (%s)\n", j, (long long)q, av[q], bv[q],
                                  kl_dtype_name(a->dtype)), shown++;
        }
        assert_int_equal(kl_allclose(a, b, 0, 0, true), 1);
        if (tol == 0 && kl_allclose(a, e, 0, 0, true) != 1)
            print_message("output %d: llvm vs eager differ; interp vs eager equal: %d, dtype %s, numel %lld\n", j,
                          kl_allclose(b, e, 0, 0, true), kl_dtype_name(e->dtype), (long long)kl_numel(e));
        if (tol == 0) assert_int_equal(kl_allclose(a, e, 0, 0, true), 1);
        else assert_int_equal(kl_allclose(kl_to_dtype(a, KL_F64), kl_to_dtype(e, KL_F64), tol, tol, true), 1);
    }
    assert_int_equal(cg_llvm_fallbacks(), fb0);
}

static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub(kl_exp(kl_relu(kl_add_scalar(kl_mul(in[0], in[1]), 1))), in[0]);
    return out[0] ? 0 : -1;
}

/* WORKLOADS.md's chain5 and gelu, as the library defines them for kiln-bench
 * (src/bench/workloads.c) */
#define WL(id) (kw_find(#id)->fn)

/* issue 12's binary ops and attribute-carrying activations fused into one
 * kernel with others: the attributes reach the kernel as constants */
static int new_ops_chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0], *y = in[1];
    kl_tensor *b = kl_add(kl_hypot(x, y), kl_copysign(kl_xlogy(x, kl_abs(y)), y));
    b = kl_add(b, kl_fmod(x, kl_add_scalar(kl_abs(y), 0.5)));
    kl_tensor *a = kl_add(kl_leaky_relu(x, 0.2), kl_elu(y, 1.5));
    a = kl_add(a, kl_mul(kl_celu(x, 0.7), kl_hardtanh(y, -0.5, 2)));
    a = kl_add(a, kl_logit(kl_sigmoid(x), 0.1));
    a = kl_add(a, kl_mul(kl_mish(x), kl_softsign(y)));
    a = kl_add(a, kl_add(kl_hardswish(x), kl_selu(kl_hardsigmoid(y))));
    a = kl_add(a, kl_atan(kl_asinh(kl_sinh(kl_mul_scalar(x, 0.25)))));
    out[0] = kl_add(a, b);
    return out[0] ? 0 : -1;
}

static void elementwise_workloads(void **state) {
    (void)state;
    /* small, then large enough for vector loops and two threads */
    int64_t sizes[] = {12, 1000, 1 << 17};
    for (int i = 0; i < 3; i++) {
        kl_tensor *x[1] = {noise(sizes[i], 3, KL_F32)};
        compare_backends(WL(chain5), x, 1, 1, 0);
        compare_backends(WL(gelu), x, 1, 1, 0);
        kl_tensor *in[2] = {x[0], noise(sizes[i], -0.5, KL_F32)};
        compare_backends(chain, in, 2, 1, 0);
        compare_backends(new_ops_chain, in, 2, 1, 0);
    }
    /* strided (transposed) x, broadcast row w; 2-d domain with an inner loop */
    kl_tensor *xt = kl_transpose(kl_reshape(noise(600, 2, KL_F32), KL_SHAPE(20, 30)), 0, 1);
    kl_tensor *st[2] = {xt, noise(20, 1, KL_F32)};
    compare_backends(chain, st, 2, 1, 0);
    /* a column broadcast [n,1] */
    kl_tensor *col[2] = {kl_reshape(noise(600, 2, KL_F32), KL_SHAPE(30, 20)), kl_reshape(noise(30, 1, KL_F32), KL_SHAPE(30, 1))};
    compare_backends(chain, col, 2, 1, 0);
    /* f64, f16, bf16 (loaded and stored as such, computed in f32), i32 promoted with f32 */
    kl_dtype dts[] = {KL_F64, KL_F16, KL_BF16};
    for (int i = 0; i < 3; i++) {
        kl_tensor *d[2] = {noise(777, 2, dts[i]), noise(777, 0.5, dts[i])};
        compare_backends(chain, d, 2, 1, 0);
        compare_backends(WL(gelu), d, 1, 1, 0);
        compare_backends(new_ops_chain, d, 2, 1, 0);
    }
    kl_tensor *m[2] = {seq(66, 1, KL_I32), noise(66, 0.125, KL_F32)};
    compare_backends(chain, m, 2, 1, 0);
    /* 0-dim and empty */
    kl_tensor *z[2] = {kl_scalar_tensor(0.5, KL_F32), kl_scalar_tensor(-2, KL_F32)};
    compare_backends(chain, z, 2, 1, 0);
    kl_tensor *e[2] = {kl_zeros(KL_SHAPE(0, 3), KL_F32), kl_ones(KL_SHAPE(3), KL_F32)};
    compare_backends(chain, e, 2, 1, 0);
}

/* where / clamp / casts / comparisons / bool logic / integer ops */
static int mixed(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *i = in[0], *d = in[1], *b = in[2];
    kl_tensor *c = kl_clamp(kl_to_dtype(kl_mul_scalar(i, 3), KL_F32), -4, 5);
    kl_tensor *m = kl_logical_and(kl_gt(d, c), b);
    out[0] = kl_where(m, kl_sqrt(kl_abs(d)), kl_neg(c));
    out[1] = kl_bitwise_xor(kl_add(i, kl_to_dtype(b, KL_I32)), kl_remainder_scalar(i, 7));
    return out[0] && out[1] ? 0 : -1;
}

static void dtypes_and_bool(void **state) {
    (void)state;
    kl_tensor *i = kl_reshape(seq(1200, 1, KL_I32), KL_SHAPE(30, 40));
    kl_tensor *in[3] = {i, noise(40, 9, KL_F64), kl_gt(noise(1200, 1, KL_F32), kl_scalar_tensor(0, KL_F32))};
    kl_tensor *b3 = kl_reshape(in[2], KL_SHAPE(30, 40));
    in[2] = b3;
    compare_backends(mixed, in, 3, 2, 0);
    kl_tensor *t[3] = {kl_transpose(kl_reshape(seq(1200, 1, KL_I32), KL_SHAPE(40, 30)), 0, 1), noise(40, -3, KL_F64),
                       kl_expand(kl_gt(noise(40, 1, KL_F32), kl_scalar_tensor(0, KL_F32)), KL_SHAPE(30, 40))};
    compare_backends(mixed, t, 3, 2, 0);
}

static int softmax_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *e = kl_exp(kl_sub(x, kl_amax(x, KL_DIMS(-1), true)));
    out[0] = kl_div(e, kl_sum(e, KL_DIMS(-1), true));
    return out[0] ? 0 : -1;
}

static int layer_norm_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *xc = kl_sub(x, kl_mean(x, KL_DIMS(-1), true));
    kl_tensor *var = kl_mean(kl_mul(xc, xc), KL_DIMS(-1), true);
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(var, 1e-5)));
    out[0] = kl_add(kl_mul(y, in[1]), in[2]);
    return out[0] ? 0 : -1;
}

static int library_rows(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_softmax(in[0], -1);
    out[1] = kl_layer_norm(in[0], 1, in[1], in[2], 1e-5);
    out[2] = kl_logsumexp(in[0], KL_DIMS(-1), true);
    return out[0] && out[1] && out[2] ? 0 : -1;
}

/* rows of length 0: sums are 0, their consumers still run once per row */
static int empty_rows(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *s = kl_sum(kl_exp(in[0]), KL_DIMS(-1), true);
    out[0] = kl_add(kl_mul(s, in[1]), in[1]);
    out[1] = kl_sub(in[0], s);
    return out[0] ? 0 : -1;
}

/* every emitted lane fold: amax/amin (NaN and inf rows), sum of an operand
 * read again later (kept in scratch), mean of a load, prod */
static int row_folds(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *sq = kl_mul(x, x);
    out[0] = kl_sub(kl_amax(x, KL_DIMS(-1), true), kl_amin(x, KL_DIMS(-1), true));
    out[1] = kl_div(sq, kl_add_scalar(kl_sum(sq, KL_DIMS(-1), true), 1));
    out[2] = kl_add(kl_mean(x, KL_DIMS(-1), true), kl_prod(kl_add_scalar(kl_mul_scalar(x, 0.01), 1), KL_DIMS(-1), true));
    return out[0] && out[1] && out[2] ? 0 : -1;
}

static void row_fold_edges(void **state) {
    (void)state;
    /* no block, a short tail, blocks with a long tail, blocks only (f32 lanes: 64, f64: 32) */
    int64_t cols[] = {5, 40, 200, 256, 1000};
    kl_dtype dts[] = {KL_F32, KL_F64};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 5; i++) {
            int64_t r = 4, c = cols[i];
            kl_tensor *x = kl_contiguous(kl_to_dtype(kl_reshape(noise(r * c, 4, KL_F64), KL_SHAPE(r, c)), KL_F64));
            double *xv = kl_data_ptr(x);
            xv[1 * c + c / 3] = NAN; /* row 1: a NaN; row 2: +-inf; row 3: a NaN in the tail */
            xv[2 * c + c / 2] = INFINITY;
            xv[2 * c + c - 1] = -INFINITY;
            xv[3 * c + c - 2] = NAN;
            kl_tensor *in[1] = {kl_to_dtype(x, dts[d])};
            compare_backends(row_folds, in, 1, 3, dts[d] == KL_F32 ? 1e-5 : 1e-12);
        }
}

/* The five lane-folded reductions over the last dim of in[0], negated (exact)
 * so that compiling makes one row kernel of them. */
static int fold_outs(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    out[0] = kl_neg(kl_sum(x, KL_DIMS(-1), true));
    out[1] = kl_neg(kl_amax(x, KL_DIMS(-1), true));
    out[2] = kl_neg(kl_amin(x, KL_DIMS(-1), true));
    out[3] = kl_neg(kl_mean(x, KL_DIMS(-1), true));
    out[4] = kl_neg(kl_prod(x, KL_DIMS(-1), true));
    return out[4] ? 0 : -1;
}

/* Element i of a and b (contiguous, same dtype) have the same bits, or are
 * both NaN (a NaN's sign and payload depend on which operand an x86 add
 * propagates, which compilers may commute). */
static void assert_same_bits(const kl_tensor *a, const kl_tensor *b, const char *what, int64_t n) {
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(kl_numel(a), kl_numel(b));
    size_t es = a->dtype == KL_F64 ? 8 : 4;
    const unsigned char *pa = kl_data_ptr(a), *pb = kl_data_ptr(b);
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double va = es == 8 ? ((const double *)pa)[i] : ((const float *)pa)[i];
        double vb = es == 8 ? ((const double *)pb)[i] : ((const float *)pb)[i];
        if (isnan(va) && isnan(vb)) continue;
        if (memcmp(pa + i * es, pb + i * es, es))
            print_message("%s, row length %lld, row %lld: %.17g vs %.17g\n", what, (long long)n, (long long)i, va, vb);
        assert_memory_equal(pa + i * es, pb + i * es, es);
    }
}

/* row_fold.h's one fold, bit for bit in all three places: eager reductions
 * (the engine, cutting long rows into chunks and cascading them), nn.c's row
 * folds (softmax, layer_norm, cross-entropy) and compiled row kernels (LLVM,
 * and the interpreter through the eager row()). Lengths around the lanes
 * (f32: 64, f64: 32), the chunk (2048) and the cascade's fan-in (8 chunks);
 * rows of noise (mixed signs), with a NaN, with +inf and -inf, with +inf
 * only, cancelling huge values and signed zeros, all -0, -inf only, a NaN in
 * the tail. */
static void row_fold_bitwise(void **state) {
    (void)state;
    int64_t lens[] = {1, 7, 31, 32, 33, 63, 64, 65, 127, 2047, 2048, 2049, 3001, 4097, 16385, 18433};
    const int R = 16; /* >= the engine's split threshold: rows are never cut into slices */
    int64_t fb0 = cg_llvm_fallbacks();
    for (int d = 0; d < 2; d++) {
        kl_dtype dt = d ? KL_F64 : KL_F32;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            kl_tensor *x64 = kl_contiguous(kl_reshape(noise(R * n, 3, KL_F64), KL_SHAPE(R, n)));
            double *v = kl_data_ptr(x64);
            v[1 * n + n / 3] = NAN;
            v[2 * n + n / 2] = INFINITY, v[2 * n + n - 1] = -INFINITY;
            v[3 * n + (n - 1) / 4] = INFINITY;
            for (int64_t i = 0; i < n; i++) {
                v[4 * n + i] = i % 3 == 0 ? 1e30 : i % 3 == 1 ? -1e30 : (i & 4 ? -0.0 : 0.0);
                v[5 * n + i] = -0.0;
                v[6 * n + i] = -INFINITY;
            }
            v[7 * n + n - 1] = NAN;
            kl_tensor *x = kl_contiguous(kl_to_dtype(x64, dt));
            kl_tensor *eager[5], *comp[2][5];
            kl_tensor *in[1] = {x};
            assert_int_equal(fold_outs(NULL, in, 1, eager, 5), 0);
            for (int b = 0; b < 2; b++) {
                kl_compile_options o = kl_compile_options_default();
                o.interp_tier = -1; /* compiled at the first call */
                o.backend = b ? "interp" : "llvm";
                kl_fn *f = kl_compile(fold_outs, NULL, &o);
                assert_non_null(f);
                /* the second call runs the compiled kernels */
                for (int call = 0; call < 2; call++) assert_int_equal(kl_fn_call(f, in, 1, comp[b], 5), 0);
                kl_fn_release(f);
            }
            static const char *names[5] = {"sum", "amax", "amin", "mean", "prod"};
            char what[64];
            for (int j = 0; j < 5; j++) {
                snprintf(what, sizeof what, "%s %s llvm vs eager", kl_dtype_name(dt), names[j]);
                assert_same_bits(kl_contiguous(comp[0][j]), kl_contiguous(eager[j]), what, n);
                snprintf(what, sizeof what, "%s %s interp vs eager", kl_dtype_name(dt), names[j]);
                assert_same_bits(kl_contiguous(comp[1][j]), kl_contiguous(eager[j]), what, n);
            }
            /* nn.c's folds of the same rows */
            kl_tensor *rs = kl_empty(KL_SHAPE(R, 1), dt), *rm = kl_empty(KL_SHAPE(R, 1), dt);
            for (int r = 0; r < R; r++) {
                if (d) {
                    const double *row = (const double *)kl_data_ptr(x) + r * n;
                    ((double *)kl_data_ptr(rs))[r] = ke_row_sum_f64(row, n);
                    ((double *)kl_data_ptr(rm))[r] = ke_row_max_f64(row, n);
                } else {
                    const float *row = (const float *)kl_data_ptr(x) + r * n;
                    ((float *)kl_data_ptr(rs))[r] = (float)ke_row_sum_f32(row, n);
                    ((float *)kl_data_ptr(rm))[r] = ke_row_max_f32(row, n);
                }
            }
            snprintf(what, sizeof what, "%s sum nn.c vs eager", kl_dtype_name(dt));
            assert_same_bits(rs, kl_contiguous(kl_sum(x, KL_DIMS(-1), true)), what, n);
            snprintf(what, sizeof what, "%s amax nn.c vs eager", kl_dtype_name(dt));
            assert_same_bits(rm, kl_contiguous(kl_amax(x, KL_DIMS(-1), true)), what, n);
        }
    }
    assert_int_equal(cg_llvm_fallbacks(), fb0);
}

static void row_workloads(void **state) {
    (void)state;
    int64_t shapes[][2] = {{5, 7}, {64, 1000}, {3, 4096}};
    for (int i = 0; i < 3; i++) {
        int64_t r = shapes[i][0], c = shapes[i][1];
        kl_tensor *x = kl_reshape(noise(r * c, 4, KL_F32), KL_SHAPE(r, c));
        kl_tensor *in[1] = {x};
        /* f32 row folds: eager's lane fold on the whole row, eager cascades: 1e-5 */
        compare_backends(softmax_ops, in, 1, 1, 1e-5);
        kl_tensor *ln[3] = {x, noise(c, 0.5, KL_F32), noise(c, -0.25, KL_F32)};
        compare_backends(layer_norm_ops, ln, 3, 1, 1e-5);
        compare_backends(library_rows, ln, 3, 3, 1e-5);
    }
    /* f64 transposed rows; a 3-d input with a broadcast [1,1,5] weight; bf16 rows */
    kl_tensor *xt[1] = {kl_transpose(kl_reshape(noise(35, 3, KL_F64), KL_SHAPE(7, 5)), 0, 1)};
    compare_backends(softmax_ops, xt, 1, 1, 1e-12);
    kl_tensor *ln3[3] = {kl_reshape(noise(30, 2, KL_F64), KL_SHAPE(2, 3, 5)), kl_reshape(noise(5, 0.5, KL_F64), KL_SHAPE(1, 1, 5)),
                         noise(5, 0.1, KL_F64)};
    compare_backends(layer_norm_ops, ln3, 3, 1, 1e-12);
    kl_tensor *xb[1] = {kl_reshape(noise(8 * 50, 4, KL_BF16), KL_SHAPE(8, 50))};
    compare_backends(softmax_ops, xb, 1, 1, 1e-2);
    kl_tensor *er[2] = {kl_zeros(KL_SHAPE(3, 0), KL_F32), kl_reshape(seq(3, 1, KL_F32), KL_SHAPE(3, 1))};
    compare_backends(empty_rows, er, 2, 2, 0);
    kl_tensor *e2[1] = {kl_zeros(KL_SHAPE(0, 4), KL_F32)};
    compare_backends(softmax_ops, e2, 1, 1, 0);
}

/* linear + bias + GELU + linear + bias */
static int mlp(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *h = kl_gelu(kl_add(kl_matmul(in[0], in[1]), in[2]));
    out[0] = kl_add(kl_matmul(h, in[3]), in[4]);
    return out[0] ? 0 : -1;
}

/* AdamW over one parameter: param, m, v updated in place from grad */
static int adamw(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *p = in[0], *g = in[1], *m = in[2], *v = in[3];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, bc1 = 1 - 0.9, bc2 = 1 - 0.999;
    kl_mul_scalar_inplace(p, 1 - lr * wd);
    kl_add_inplace(kl_mul_scalar_inplace(m, b1), kl_mul_scalar(g, 1 - b1));
    kl_add_inplace(kl_mul_scalar_inplace(v, b2), kl_mul_scalar(kl_mul(g, g), 1 - b2));
    kl_tensor *den = kl_add_scalar(kl_sqrt(kl_div_scalar(v, bc2)), eps);
    out[0] = kl_sub_inplace(p, kl_mul_scalar(kl_div(m, den), lr / bc1));
    return out[0] ? 0 : -1;
}

/* y and y*y are both returned: one kernel with two outputs */
static int two_outputs(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sigmoid(kl_add(in[0], in[1]));
    out[1] = kl_mul(out[0], kl_sub_scalar(out[0], 1));
    return out[1] ? 0 : -1;
}

static void mlp_adamw_multi_output(void **state) {
    (void)state;
    kl_tensor *in[5] = {kl_reshape(noise(32 * 64, 1, KL_F32), KL_SHAPE(32, 64)),
                        kl_reshape(noise(64 * 128, 0.1, KL_F32), KL_SHAPE(64, 128)), noise(128, 0.2, KL_F32),
                        kl_reshape(noise(128 * 16, 0.1, KL_F32), KL_SHAPE(128, 16)), noise(16, 0.3, KL_F32)};
    compare_backends(mlp, in, 5, 1, 0);
    for (int64_t n = 8; n <= 100000; n *= 50) {
        kl_tensor *a[4] = {noise(n, 0.1, KL_F32), noise(n, -0.2, KL_F32), noise(n, 0.01, KL_F32),
                           kl_abs(noise(n, 0.02, KL_F32))};
        compare_backends(adamw, a, 4, 1, 0);
    }
    kl_tensor *t[2] = {kl_reshape(noise(600, 2, KL_F32), KL_SHAPE(20, 30)), noise(30, 0.25, KL_F32)};
    compare_backends(two_outputs, t, 2, 2, 0);
}

static int int_remainder(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_remainder(kl_add_scalar(in[0], 1), kl_mul_scalar(in[1], 2));
    return out[0] ? 0 : -1;
}

static void loop_errors_are_raised(void **state) {
    (void)state;
    kl_tensor *a = seq(5000, 1, KL_I32), *z = kl_zeros(KL_SHAPE(5000), KL_I32), *y = NULL;
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.backend = "llvm";
    kl_fn *f = kl_compile(int_remainder, NULL, &o);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, kl_add_scalar(kl_abs(a), 5)}, 2, &y, 1), 0);
    assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, z}, 2, &y, 1), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    kl_fn_release(f);
    /* an unknown backend */
    o.backend = "gpu";
    assert_null(kl_compile(int_remainder, NULL, &o));
    KT_EXPECT_ERROR(KL_ERR_ARG, "unknown or unavailable backend \"gpu\" (registered: interp, llvm, nvrtc)");
}

/* A kernel with an op LLVM has no loop for: the strict compile fails with
 * a Kiln error naming it; the backend's compile hands it to the
 * interpreter instead. */
static void compile_errors_and_fallback(void **state) {
    (void)state;
    kbuild b;
    kb_init(&b, 1, (int64_t[]){4});
    kb_buf(&b, KL_F64, 0);
    kb_buf(&b, KL_F64, 1);
    int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F64, .buf = 0, .op = -1});
    int r = kb_stmt(&b, (ir_kstmt){.kind = IR_K_OP, .dtype = KL_F64, .compute = KL_F64, .op = KE_OP_matmul, .nargs = 2,
                                   .args = {l, l}});
    kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F64, .buf = 1, .nargs = 1, .args = {r}, .op = -1});
    assert_null(cg_llvm_compile_strict(&b.k));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "llvm backend: statement v1 (matmul in float64): no elementwise loop");
    /* the same through the backend: the interpreter refuses it too */
    assert_null(cg_llvm_backend.compile(&b.k));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "interpreter: kl_matmul in float64 is not an elementwise loop");
    b.st[1].op = KE_OP_add;
    void *h = cg_llvm_backend.compile(&b.k);
    assert_non_null(h);
    assert_int_equal(cg_llvm_is_compiled(h), 1);
    kl_tensor *x = seq(4, 0.5, KL_F64), *y = kl_empty(KL_SHAPE(4), KL_F64);
    assert_int_equal(cg_llvm_backend.run(h, &x, &y), 0);
    KT_VALUES(y, 0, -2, -1, 0, 1);
    /* strides other than compiled: run by the interpreter, same result */
    kl_tensor *xs = kl_slice(seq(8, 0.5, KL_F64), 0, 0, 8, 2);
    assert_int_equal(cg_llvm_backend.run(h, &xs, &y), 0);
    KT_VALUES(y, 0, -4, -2, 0, 2);
    cg_llvm_backend.free(h);
}

/* The object cache: a kernel compiled once is stored; freed and compiled
 * again it is loaded from the cache (no LLVM compile) and runs the same. */
static void objects_come_back_from_the_cache(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("cache");
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
    kbuild b;
    kb_init(&b, 1, (int64_t[]){100});
    kb_buf(&b, KL_F32, 0);
    kb_buf(&b, KL_F32, 1);
    int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F32, .buf = 0, .op = -1});
    ir_kstmt c = {.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = KE_OP_clamp, .nargs = 1, .args = {l}};
    c.a.f[0] = -1;
    c.a.f[1] = (double)getpid() / 1e6; /* a kernel no earlier run has cached */
    int r = kb_stmt(&b, c);
    kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 1, .nargs = 1, .args = {r}, .op = -1});
    ke_cache_stats s0, s1, s2;
    ke_cache_get_stats(&s0);
    kl_tensor *x = seq(100, 0.1, KL_F32);
    kl_tensor *y1 = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
    ke_cache_get_stats(&s1);
    assert_int_equal(s1.stores, s0.stores + 1);
    assert_int_equal(s1.misses, s0.misses + 1);
    kl_tensor *y2 = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
    ke_cache_get_stats(&s2);
    assert_int_equal(s2.hits, s1.hits + 1);
    assert_int_equal(s2.stores, s1.stores);
    assert_int_equal(kl_equal(y1, y2), 1);
    assert_int_equal(kl_allclose(y1, kl_clamp(x, -1, c.a.f[1]), 0, 0, true), 1);
    unsetenv("KL_CACHE_DIR");
    setenv("KL_CACHE_DIR", "off", 1);
    ke_cache_reset();
}

/* KL_DEBUG_DIR receives per kernel its IR text, the LLVM IR before and
 * after optimization and the assembly. */
static void debug_dir_gets_llvm_ir_and_assembly(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("dbg");
    setenv("KL_DEBUG_DIR", dir, 1);
    kbuild b;
    kb_init(&b, 2, (int64_t[]){3, 5});
    kb_buf(&b, KL_F32, 0);
    kb_buf(&b, KL_F32, 1);
    int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F32, .buf = 0, .op = -1});
    ir_kstmt c = {.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = KE_OP_clamp, .nargs = 1, .args = {l}};
    c.a.f[0] = -0.25, c.a.f[1] = (double)getpid() / 3e6; /* not loaded already by an earlier test */
    int r = kb_stmt(&b, c);
    kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 1, .nargs = 1, .args = {r}, .op = -1});
    kl_tensor *x = kl_reshape(seq(15, 0.1, KL_F32), KL_SHAPE(3, 5));
    kl_tensor *y = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
    assert_int_equal(kl_allclose(y, kl_clamp(x, -0.25, c.a.f[1]), 0, 0, true), 1);
    unsetenv("KL_DEBUG_DIR");
    const char *want[] = {".kernel.txt", ".ll", ".opt.ll", ".s"};
    int found[4] = {0};
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *ent;
    char path[700];
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        size_t len = strlen(ent->d_name);
        for (int i = 0; i < 4; i++) {
            size_t wl = strlen(want[i]);
            if (!strncmp(ent->d_name, "codegen", 7) && len > wl && !strcmp(ent->d_name + len - wl, want[i]) &&
                !(i == 1 && len > 7 && !strcmp(ent->d_name + len - 7, ".opt.ll")))
                found[i]++;
        }
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
    for (int i = 0; i < 4; i++) assert_int_equal(found[i], 1);
}

/* A whole small file, NUL-terminated (NULL if unreadable). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* Does ll name a value `%<name>` (followed by a space, '.' or digit-free end)? */
static int ll_has(const char *ll, const char *name) {
    size_t n = strlen(name);
    for (const char *q = ll; (q = strstr(q, name)); q += n)
        if (q > ll && q[-1] == '%' && (q[n] == ' ' || q[n] == '.' || q[n] == ',' || q[n] == ')')) return 1;
    return 0;
}

/* KL_DEBUG_DIR's .ll names LLVM values after the kernel IR beside it: every
 * statement vN of the .kernel.txt is a value %vN (or %vN.<op> for a
 * reduction), buffers are %in0.. / %out0.., their element addresses
 * %in0.addr..., a reduction's lanes %vN.lanes, loops are blocks named row /
 * elem / vN.block. Checked on softmax over rows of 200 (a lane fold with a
 * tail) and the five folds of fold_outs over rows of 4097 (chunks). */
static void debug_ll_reads_like_the_kernel_ir(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("dbgnames");
    setenv("KL_DEBUG_DIR", dir, 1);
    kl_tensor *x1 = kl_reshape(noise(3 * 200, 2, KL_F32), KL_SHAPE(3, 200));
    kl_tensor *x2 = kl_reshape(noise(2 * 4097, 2, KL_F32), KL_SHAPE(2, 4097));
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.backend = "llvm";
    kl_fn *f1 = kl_compile(softmax_ops, NULL, &o), *f2 = kl_compile(fold_outs, NULL, &o);
    kl_tensor *out[5];
    for (int call = 0; call < 2; call++) {
        assert_int_equal(kl_fn_call(f1, &x1, 1, out, 1), 0);
        assert_int_equal(kl_fn_call(f2, &x2, 1, out, 5), 0);
    }
    kl_fn_release(f1);
    kl_fn_release(f2);
    unsetenv("KL_DEBUG_DIR");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *ent;
    char path[700];
    int kernels = 0, reductions = 0, statements = 0;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (len < 11 || strcmp(ent->d_name + len - 11, ".kernel.txt")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        char *txt = slurp(path);
        snprintf(path, sizeof path, "%s/%.*s.ll", dir, (int)(len - 11), ent->d_name);
        char *ll = slurp(path);
        assert_non_null(txt);
        assert_non_null(ll);
        kernels++;
        assert_true(ll_has(ll, "begin") && ll_has(ll, "end") && ll_has(ll, "bases"));
        assert_true(ll_has(ll, "in0") && ll_has(ll, "out0") && ll_has(ll, "in0.addr") && ll_has(ll, "out0.addr"));
        assert_true(strstr(ll, "\nrow:") || strstr(ll, "\nelem:"));
        char name[64];
        for (const char *line = txt; (line = strstr(line, "\n  v")); line++) {
            int v;
            char rd[32];
            if (sscanf(line + 3, "v%d:", &v) != 1) continue;
            statements++;
            snprintf(name, sizeof name, "v%d", v);
            if (!ll_has(ll, name)) print_message("%s: no %%%s in the .ll\n", ent->d_name, name);
            assert_true(ll_has(ll, name));
            const char *eq = strchr(line + 1, '=');
            if (eq && sscanf(eq, "= reduce_%31[a-z](", rd) == 1) {
                reductions++;
                snprintf(name, sizeof name, "v%d.%s", v, rd);
                if (!ll_has(ll, name)) print_message("%s: no %%%s in the .ll\n", ent->d_name, name);
                assert_true(ll_has(ll, name));
                snprintf(name, sizeof name, "v%d.lanes", v);
                assert_true(ll_has(ll, name));
            }
        }
        free(txt);
        free(ll);
    }
    rewinddir(d);
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
    assert_true(kernels >= 2);
    assert_true(reductions >= 7); /* softmax's amax and sum, fold_outs' five */
    assert_true(statements >= 12);
}

/* Element loops fold their tail into the vector loop by masking (cg_bitcode.cpp's
 * cg_mark_parallel; a compile-latency measure: one copy of the loop body instead of three).
 * Every f32 math op, at lengths around the vector width, gives eager's and the
 * interpreter's bits in every element, the masked last iteration included; integer
 * division (which must not run on masked-off lanes) raises only for a real zero; and the
 * optimized IR of a flat kernel has a masked store and no epilogue loop. */
static void folded_tails_bitwise(void **state) {
    (void)state;
    static const int64_t lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 100, 1031};
    int64_t nall, ntrig;
    kl_tensor *xall = sweep_f32(&nall);
    ntrig = nall;
    kl_tensor *xtrig = trig_domain(xall, &ntrig);
    int64_t bad = 0, runs = 0;
    for (size_t o = 0; o < N_MATH_ALL; o++) {
        const mathop *m = o < N_MATH_OPS ? &math_ops[o] : &math_ops_attr[o - N_MATH_OPS].m;
        int trig = m->op == KE_OP_sin || m->op == KE_OP_cos || m->op == KE_OP_tan;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            /* specials first, then values spread over the sweep */
            kl_tensor *src = trig ? xtrig : xall;
            int64_t step = ((trig ? ntrig : nall) - 40) / n;
            kl_tensor *x = kl_contiguous(kl_cat(2, (kl_tensor *[]){kl_slice(src, 0, 0, 40 < n ? 40 : n, 1),
                                                                   kl_slice(src, 0, 40, 40 + (n - 40 > 0 ? n - 40 : 0) * step, step)}, 0));
            assert_int_equal(kl_numel(x), n);
            kbuild b;
            kb_init(&b, 1, (int64_t[]){n});
            kb_buf(&b, KL_F32, 0);
            kb_buf(&b, KL_F32, 1);
            int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F32, .buf = 0, .op = -1});
            ir_kstmt os = {.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = m->op, .nargs = 1, .args = {l}};
            if (o >= N_MATH_OPS) os.a.f[0] = math_ops_attr[o - N_MATH_OPS].f0, os.a.f[1] = math_ops_attr[o - N_MATH_OPS].f1;
            int r = kb_stmt(&b, os);
            kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 1, .nargs = 1, .args = {r}, .op = -1});
            kl_tensor *y = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
            kl_tensor *yi = run_backend(&ir_interp_backend, &b.k, &x, KL_F32);
            kl_tensor *in1[1] = {x};
            ke_call ec = {.op = m->op, .nin = 1, .in = in1};
            ec.a.f[0] = os.a.f[0], ec.a.f[1] = os.a.f[1];
            kl_tensor *ye = ke_call1(&ec);
            assert_non_null(ye);
            int64_t be = eager_mismatches(kl_data_ptr(y), kl_data_ptr(ye), n),
                    bi = eager_mismatches(kl_data_ptr(y), kl_data_ptr(yi), n);
            if (be || bi)
                print_message("%s at length %lld: differs from eager at %lld, from interp at %lld\n", ke_ops[m->op].name,
                              (long long)n, (long long)be, (long long)bi);
            bad += be + bi;
            runs++;
        }
    }
    assert_int_equal(bad, 0);
    assert_true(runs >= 400);
    /* integer remainder at tail lengths: no division by a masked-off lane */
    kl_compile_options o = kl_compile_options_default();
    o.interp_tier = -1; /* compiled at the first call */
    o.backend = "llvm";
    kl_fn *f = kl_compile(int_remainder, NULL, &o);
    static const int64_t ilens[] = {3, 17, 33, 1001};
    for (int i = 0; i < 4; i++) {
        kl_tensor *a = seq(ilens[i], 1, KL_I32), *d = kl_add_scalar(kl_abs(a), 3), *y = NULL, *want = NULL;
        assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, d}, 2, &y, 1), 0);
        assert_int_equal(int_remainder(NULL, (kl_tensor *[]){a, d}, 2, &want, 1), 0);
        assert_int_equal(kl_equal(y, want), 1);
        /* a zero divisor in the last element only */
        kl_tensor *dz = kl_clone(d);
        ((int32_t *)kl_data_ptr(dz))[ilens[i] - 1] = 0;
        assert_int_equal(kl_fn_call(f, (kl_tensor *[]){a, dz}, 2, &y, 1), -1);
        KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    }
    kl_fn_release(f);
    /* the IR: one vector loop with a masked store, no epilogue */
    const char *dir = kt_tmp_path("dbgtail");
    setenv("KL_DEBUG_DIR", dir, 1);
    kbuild b;
    kb_init(&b, 1, (int64_t[]){1000});
    kb_buf(&b, KL_F32, 0);
    kb_buf(&b, KL_F32, 1);
    int l = kb_stmt(&b, (ir_kstmt){.kind = IR_K_LOAD, .dtype = KL_F32, .buf = 0, .op = -1});
    ir_kstmt c = {.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = KE_OP_clamp, .nargs = 1, .args = {l}};
    c.a.f[0] = -0.5, c.a.f[1] = (double)getpid() / 7e6; /* not loaded already */
    int r = kb_stmt(&b, c);
    int e = kb_stmt(&b, (ir_kstmt){.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = KE_OP_exp, .nargs = 1, .args = {r}});
    kb_stmt(&b, (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 1, .nargs = 1, .args = {e}, .op = -1});
    kl_tensor *x = seq(1000, 0.01, KL_F32);
    kl_tensor *y = run_backend(&cg_llvm_backend, &b.k, &x, KL_F32);
    assert_int_equal(kl_allclose(y, kl_exp(kl_clamp(x, -0.5, c.a.f[1])), 0, 0, true), 1);
    unsetenv("KL_DEBUG_DIR");
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *ent;
    char path[700];
    int checked = 0;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (len > 7 && !strcmp(ent->d_name + len - 7, ".opt.ll")) {
            char *ll = slurp(path);
            assert_non_null(ll);
            if (!strstr(ll, "llvm.masked.store") || strstr(ll, "vec.epilog"))
                print_message("%s: the tail is not folded into the vector loop\n", ent->d_name);
            assert_non_null(strstr(ll, "llvm.masked.store"));
            assert_null(strstr(ll, "vec.epilog"));
            assert_non_null(strstr(ll, "x float>"));
            free(ll);
            checked++;
        }
        if (ent->d_name[0] != '.') unlink(path);
    }
    closedir(d);
    rmdir(dir);
    assert_int_equal(checked, 1);
}

#endif /* KL_HAVE_LLVM */

int main(void) {
#ifdef KL_HAVE_LLVM
    /* tests stay out of the user's cache; one test turns it on in a temp dir */
    setenv("KL_CACHE_DIR", "off", 1);
    const struct CMUnitTest tests[] = {
        KT_TEST(f32_math_sweep),
        KT_TEST(elementwise_workloads),
        KT_TEST(dtypes_and_bool),
        KT_TEST(row_workloads),
        KT_TEST(row_fold_edges),
        KT_TEST(row_fold_bitwise),
        KT_TEST(mlp_adamw_multi_output),
        KT_TEST(loop_errors_are_raised),
        KT_TEST(compile_errors_and_fallback),
        KT_TEST(objects_come_back_from_the_cache),
        KT_TEST(debug_dir_gets_llvm_ir_and_assembly),
        KT_TEST(debug_ll_reads_like_the_kernel_ir),
        KT_TEST(folded_tails_bitwise),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
#else
    printf("LLVM backend not built: nothing to test\n");
    return 0;
#endif
}
