/*
 * ew_other.c — the elementwise ops that are neither plain unary nor binary
 * (rows in ops_ew_other.def): where, threshold_backward, clamp, lerp, masked_fill, and tril/triu
 * (a position-dependent mask over the last two dims, with its own kernel).
 * Also the shape rules every elementwise row shares (ke_infer_ew_*).
 */
#include "kernels_ew.h"

#ifndef KE_DEVICE
#include "threadpool.h"
#endif

#include <math.h>

#ifndef KE_DEVICE /* host code (KE_DEVICE: kernels_ew_device.h) */
/* ---- shared shape rules ---------------------------------------------------------- */

/* The row's impl must have a loop for the compute dtype the rule chose:
 * remainder and pow of two bools, for example, have none (as in PyTorch). */
static int check_loop(ke_call *c) {
    const ke_ew_impl *impl = (const ke_ew_impl *)ke_ops[c->op].impl;
    if (!impl || impl->loop[c->compute]) return 1;
    char b[256];
    return ke_err(KL_ERR_DTYPE, ke_opname(c), "not implemented for %s operands (input %s)",
                  ke_dtypes[c->compute].name, ke_fmt_tensor(b, sizeof b, c->in[0]));
}

int ke_infer_ew_same(ke_call *c, ke_outspec *out) {
    if (ke_infer_same(c, out) < 0) return -1;
    return check_loop(c);
}

int ke_infer_ew_bcast(ke_call *c, ke_outspec *out) {
    if (ke_infer_broadcast(c, out) < 0) return -1;
    return check_loop(c);
}

/* A mask or condition input must be bool (PyTorch 1.13 still takes uint8
 * with a deprecation warning; Kiln refuses it). */
static int need_bool(ke_call *c, int i, const char *what) {
    if (c->in[i]->dtype == KL_BOOL) return 0;
    char b[256];
    return ke_err(KL_ERR_DTYPE, ke_opname(c), "expects a bool %s, got %s (argument %d)", what,
                  ke_fmt_tensor(b, sizeof b, c->in[i]), i + 1);
}

#endif /* !KE_DEVICE */

/* Loops over every compute dtype of a formula that only moves values. */
#define KE_GEN_MOVE(GEN, name)   \
    GEN(name##_f32, float)      \
    GEN(name##_f64, double)     \
    GEN(name##_i32, int32_t)    \
    GEN(name##_i64, int64_t)    \
    GEN(name##_u8, uint8_t)     \
    GEN(name##_b8, uint8_t)

/* ---- where(cond, a, b) ------------------------------------------------------------ */

/* cond is read as bool (bool_in bit 0); a and b in their promoted dtype.
 * Both are loaded unconditionally so the select vectorizes. */
#define WHERE_X(c, x, y) ((c) ? (x) : (y))
#ifdef KE_DEVICE
#define WHERE_LOOP(fname, T) KE_EW_DEVICE_FN(fname, T, (uint8_t c, T x, T y), , WHERE_X(c, x, y))
#else
#define WHERE_LOOP(fname, T)                                                                        \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        T *restrict o = (T *)o_;                                                                  \
        const uint8_t *restrict C = (const uint8_t *)in[0];                                       \
        const T *restrict X = (const T *)in[1], *restrict Y = (const T *)in[2];                   \
        (void)bc, (void)a, (void)err;                                                             \
        for (int64_t i = 0; i < n; i++) {                                                         \
            T x = X[i], y = Y[i];                                                                 \
            o[i] = WHERE_X(C[i], x, y);                                                           \
        }                                                                                         \
    }                                                                                             \
    KE_EW_NAME(fname)
#endif
KE_GEN_MOVE(WHERE_LOOP, where)
KE_EW_IMPL(where, .loop = {KE_LOOPS_ALL(where)}, .bool_in = 1)

#ifndef KE_DEVICE

int ke_infer_where(ke_call *c, ke_outspec *out) {
    if (need_bool(c, 0, "condition")) return -1;
    if (ke_broadcast_shapes(ke_opname(c), 3, c->in, &out->ndim, out->shape)) return -1;
    out->dtype = ke_result_type(2, c->in + 1);
    c->compute = ke_compute_dtype(out->dtype);
    return 1;
}

#endif /* !KE_DEVICE */

/* ---- threshold_backward(g, y): relu's gradient ------------------------------------ */

/* x = g, y = the saved result: 0 where y <= threshold, else g (PyTorch's
 * threshold_backward; a NaN y passes g). One pass where masked_fill(g,
 * le(y, 0), 0) took two and a bool tensor. */
#define THRESHOLD_BWD_X(T) (y <= (T)ke_attr_threshold_backward_threshold(a) ? (T)0 : x)
KE_GEN_F(KE_EW_BINARY, threshold_backward, THRESHOLD_BWD_X)
KE_EW_IMPL(threshold_backward, .loop = {KE_LOOPS_F(threshold_backward)})

/* ---- clamp(x, lo, hi): f0 = lo, f1 = hi; -inf / +inf mean no bound ------------------ */

/* Bounds in the compute dtype. Integer compute only sees integral bounds
 * (ke_infer_clamp) or infinities; out-of-range ones saturate, since a bound
 * beyond the dtype's range cannot bind. */
static inline float clamp_bound_float(double v) { return (float)v; }
static inline double clamp_bound_double(double v) { return v; }
static inline int32_t clamp_bound_int32_t(double v) {
    return v <= INT32_MIN ? INT32_MIN : v >= INT32_MAX ? INT32_MAX : (int32_t)v;
}
static inline int64_t clamp_bound_int64_t(double v) {
    return v <= -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v;
}
/* uint8 takes a finite bound as PyTorch converts it, wrapping (-1 binds as 255). */
static inline uint8_t clamp_bound_uint8_t(double v) {
    return isinf(v) ? (v < 0 ? 0 : 255) : (uint8_t)(uint64_t)(int64_t)v;
}
#define clamp_bound_bool(v) ((v) <= 0 ? 0 : (v) >= 1 ? 1 : (uint8_t)(v))

/* NaN in x stays NaN (both compares are false); a NaN bound makes every
 * result NaN when both bounds are given and binds nothing when it is the
 * only one (PyTorch 1.13's clamp vs clamp_min/clamp_max); lo > hi gives hi
 * everywhere. */
#define CLAMP_PRE(T, BOUND)                                                                       \
    const T lo = BOUND(ke_attr_clamp_min(a)), hi = BOUND(ke_attr_clamp_max(a));                   \
    const int both = ke_attr_clamp_min(a) != -INFINITY && ke_attr_clamp_max(a) != INFINITY;
#define CLAMP_LO(x) (((x) < lo || (both && lo != lo)) ? lo : (x))
#define CLAMP_X(x) ((CLAMP_LO(x) > hi || (both && hi != hi)) ? hi : CLAMP_LO(x))
#ifdef KE_DEVICE
#define CLAMP_LOOP(fname, T, BOUND) KE_EW_DEVICE_FN(fname, T, (T x), CLAMP_PRE(T, BOUND), CLAMP_X(x))
#else
#define CLAMP_LOOP(fname, T, BOUND)                                                                 \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        T *restrict o = (T *)o_;                                                                  \
        const T *restrict X = (const T *)in[0];                                                   \
        CLAMP_PRE(T, BOUND)                                                                       \
        (void)bc, (void)err;                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                         \
            T x = X[i];                                                                           \
            o[i] = CLAMP_X(x);                                                                    \
        }                                                                                         \
    }                                                                                             \
    KE_EW_NAME(fname)
#endif
CLAMP_LOOP(clamp_f32, float, clamp_bound_float)
CLAMP_LOOP(clamp_f64, double, clamp_bound_double)
CLAMP_LOOP(clamp_i32, int32_t, clamp_bound_int32_t)
CLAMP_LOOP(clamp_i64, int64_t, clamp_bound_int64_t)
CLAMP_LOOP(clamp_u8, uint8_t, clamp_bound_uint8_t)
CLAMP_LOOP(clamp_b8, uint8_t, clamp_bound_bool)
KE_EW_IMPL(clamp, .loop = {KE_LOOPS_ALL(clamp)})

#ifndef KE_DEVICE

/* As ke_wrap_scalar decides: an integral bound counts as an integer scalar. */
static int integral(double v) { return isfinite(v) && v == trunc(v) && fabs(v) < 9.007199254740992e15; }

/* The result dtype is PyTorch's result_type(x, lo, hi) over the bounds that
 * are present, each a C scalar: int x stays int with integral bounds and
 * becomes the default float with a fractional one; bool x with a bound is int64. */
int ke_infer_clamp(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    double bound[2] = {ke_attr_clamp_min(&c->a), ke_attr_clamp_max(&c->a)};
    /* stand-ins for wrapped scalars: result_type reads only dtype, flags, ndim */
    kl_tensor fake[2];
    kl_tensor *ts[3] = {c->in[0]};
    int n = 1;
    for (int k = 0; k < 2; k++) {
        if (bound[k] == (k == 0 ? -INFINITY : INFINITY)) continue;
        memset(&fake[k], 0, sizeof fake[k]);
        fake[k].dtype = integral(bound[k]) ? KL_I64 : KL_F64;
        fake[k].flags = KE_TF_WRAPPED;
        ts[n++] = &fake[k];
    }
    out->dtype = ke_result_type(n, ts);
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

#endif /* !KE_DEVICE */

/* ---- lerp(a, b, w) = a + w (b - a) -------------------------------------------------- */

/* PyTorch 1.13's two-sided form (exact at w = 0 and w = 1); its test is
 * w < 0.5, not |w| < 0.5, which decides what infinities give. */
#define LERP(T, x, y, w) ((w) < (T)0.5 ? (x) + (w) * ((y) - (x)) : (y) - ((y) - (x)) * ((T)1 - (w)))
KE_EW_TERNARY(lerp_f32, float, float, LERP(float, x, y, z))
KE_EW_TERNARY(lerp_f64, double, double, LERP(double, x, y, z))
KE_EW_IMPL(lerp, .loop = {KE_LOOPS_F(lerp)})

/* lerp_scalar: the weight is an attribute */
KE_EW_BINARY(lerp_scalar_f32, float, float, LERP(float, x, y, (float)ke_attr_lerp_scalar_weight(a)))
KE_EW_BINARY(lerp_scalar_f64, double, double, LERP(double, x, y, ke_attr_lerp_scalar_weight(a)))
KE_EW_IMPL(lerp_scalar, .loop = {KE_LOOPS_F(lerp_scalar)}, .bcast_ok = 3)

#ifndef KE_DEVICE
/* For lerp and lerp_scalar: floating inputs of one dtype (PyTorch does not
 * promote here), broadcast together; the result has a's dtype. */
int ke_infer_lerp(ke_call *c, ke_outspec *out) {
    static const char *const names[3] = {"input", "end", "weight"};
    kl_dtype d = (kl_dtype)c->in[0]->dtype;
    char b[256];
    if (!ke_is_float(d))
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "expects floating-point tensors, got %s (argument 1)",
                      ke_fmt_tensor(b, sizeof b, c->in[0]));
    for (int i = 1; i < c->nin; i++)
        if (c->in[i]->dtype != d)
            return ke_err(KL_ERR_DTYPE, ke_opname(c), "expected dtype %s for %s but got %s (argument %d)",
                          ke_dtypes[d].name, names[i], ke_fmt_tensor(b, sizeof b, c->in[i]), i + 1);
    if (ke_broadcast_shapes(ke_opname(c), c->nin, c->in, &out->ndim, out->shape)) return -1;
    out->dtype = d;
    c->compute = ke_compute_dtype(d);
    return 1;
}

#endif /* !KE_DEVICE */

/* ---- masked_fill(x, mask, value): value is an attribute ------------------------------------------ */

/* The value in x's compute dtype: integers truncate (NaN -> 0), bool is value != 0. */
#define MF_FLOAT(T) ((T)ke_attr_masked_fill_value(a))
#define MF_INT(T) ((T)(uint64_t)ke_ew_f2i(ke_attr_masked_fill_value(a)))
#define MF_BOOL(T) ((T)(ke_attr_masked_fill_value(a) != 0))
#define MASKED_FILL_X(m, x) ((m) ? v : (x))
#ifdef KE_DEVICE
#define MASKED_FILL_LOOP(fname, T, VALUE) \
    KE_EW_DEVICE_FN(fname, T, (T x, uint8_t m), const T v = VALUE(T);, MASKED_FILL_X(m, x))
#else
#define MASKED_FILL_LOOP(fname, T, VALUE)                                                           \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        T *restrict o = (T *)o_;                                                                  \
        const T *restrict X = (const T *)in[0];                                                   \
        const uint8_t *restrict M = (const uint8_t *)in[1];                                       \
        const T v = VALUE(T);                                                                     \
        (void)bc, (void)err;                                                                      \
        for (int64_t i = 0; i < n; i++) o[i] = MASKED_FILL_X(M[i], X[i]);                         \
    }                                                                                             \
    KE_EW_NAME(fname)
#endif
MASKED_FILL_LOOP(masked_fill_f32, float, MF_FLOAT)
MASKED_FILL_LOOP(masked_fill_f64, double, MF_FLOAT)
MASKED_FILL_LOOP(masked_fill_i32, int32_t, MF_INT)
MASKED_FILL_LOOP(masked_fill_i64, int64_t, MF_INT)
MASKED_FILL_LOOP(masked_fill_u8, uint8_t, MF_INT)
MASKED_FILL_LOOP(masked_fill_b8, uint8_t, MF_BOOL)
KE_EW_IMPL(masked_fill, .loop = {KE_LOOPS_ALL(masked_fill)}, .bool_in = 2)

#ifndef KE_DEVICE /* the rest is host code */

/* x and mask broadcast together (PyTorch's out-of-place masked_fill may
 * grow x; the in-place form may not, which the in-place check enforces). */
int ke_infer_masked_fill(ke_call *c, ke_outspec *out) {
    if (need_bool(c, 1, "mask")) return -1;
    if (ke_check_scalar_cast(ke_opname(c), ke_attr_masked_fill_value(&c->a), (kl_dtype)c->in[0]->dtype)) return -1;
    if (ke_broadcast_shapes(ke_opname(c), 2, c->in, &out->ndim, out->shape)) return -1;
    out->dtype = (kl_dtype)c->in[0]->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    return 1;
}

/* ---- tril / triu: i0 = diagonal offset k ------------------------------------------------ */

int ke_infer_tri(ke_call *c, ke_outspec *out) {
    const kl_tensor *x = c->in[0];
    if (x->ndim < 2) {
        char b[256];
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "expects a tensor with at least 2 dims, got %s",
                      ke_fmt_tensor(b, sizeof b, x));
    }
    out->dtype = (kl_dtype)x->dtype;
    c->compute = ke_compute_dtype(out->dtype);
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * x->ndim);
    return 1;
}

typedef struct tri_ctx {
    const kl_tensor *x;
    kl_tensor *o;
    int64_t k;
    int upper;
} tri_ctx;

/* Copies n elements of size es with source stride s (elements) to a dense row. */
static void copy_row(char *restrict dst, const char *restrict src, int64_t s, int64_t n, size_t es) {
    if (s == 1) {
        memcpy(dst, src, (size_t)n * es);
        return;
    }
#define KE_COPY_STRIDED(T)                                                     \
    for (int64_t j = 0; j < n; j++) memcpy(dst + j * (int64_t)sizeof(T), src + j * s * (int64_t)sizeof(T), sizeof(T)); \
    break;
    switch (es) {
    case 1: KE_COPY_STRIDED(uint8_t)
    case 2: KE_COPY_STRIDED(uint16_t)
    case 4: KE_COPY_STRIDED(uint32_t)
    default: KE_COPY_STRIDED(uint64_t)
    }
#undef KE_COPY_STRIDED
}

/* Rows [r0, r1) of the output viewed as [rows, C]: each keeps one column
 * range of x's row and zeroes the rest (zero bytes are 0 in every dtype). */
static void tri_rows(void *ctx, int64_t r0, int64_t r1) {
    const tri_ctx *t = ctx;
    const kl_tensor *x = t->x;
    const int nd = x->ndim;
    const int64_t R = x->shape[nd - 2], C = x->shape[nd - 1];
    const size_t es = ke_dtypes[x->dtype].size;
    const char *xb = ke_data(x);
    char *ob = ke_data(t->o);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % R, b = r / R, off = i * x->stride[nd - 2];
        for (int d = nd - 3; d >= 0; d--) {
            off += (b % x->shape[d]) * x->stride[d];
            b /= x->shape[d];
        }
        int64_t lo = t->upper ? i + t->k : 0, hi = t->upper ? C : i + t->k + 1;
        lo = lo < 0 ? 0 : lo > C ? C : lo;
        hi = hi < lo ? lo : hi > C ? C : hi;
        char *row = ob + r * C * (int64_t)es;
        memset(row, 0, (size_t)lo * es);
        copy_row(row + lo * (int64_t)es, xb + (off + lo * x->stride[nd - 1]) * (int64_t)es, x->stride[nd - 1],
                 hi - lo, es);
        memset(row + hi * (int64_t)es, 0, (size_t)(C - hi) * es);
    }
}

static int tri_run(ke_call *c, int upper) {
    const kl_tensor *x = c->in[0];
    int64_t n = ke_numel(x->ndim, x->shape);
    if (n == 0) return 0;
    const int64_t R = x->shape[x->ndim - 2], C = x->shape[x->ndim - 1];
    /* beyond +-(R + C) every k gives the same result; clamping keeps i + k in range */
    int64_t k = ke_attr_tril_diagonal(&c->a); /* triu has tril's attributes */
    k = k < -(R + C) ? -(R + C) : k > R + C ? R + C : k;
    tri_ctx t = {.x = x, .o = c->out[0], .k = k, .upper = upper};
    ke_parallel_for(n / C, 1 + 32768 / C, tri_rows, &t);
    return 0;
}

int ke_cpu_tril(ke_call *c) { return tri_run(c, 0); }
int ke_cpu_triu(ke_call *c) { return tri_run(c, 1); }

/* ---- public wrappers ------------------------------------------------------------------------ */

kl_tensor *kl_where(kl_tensor *cond, kl_tensor *a, kl_tensor *b) {
    kl_tensor *in[3] = {cond, a, b};
    ke_call c = {.op = KE_OP_where, .nin = 3, .in = in};
    return ke_call1(&c);
}

/* kl_clamp and kl_clamp_inplace come from the row (wrappers.c). */

kl_tensor *kl_lerp(kl_tensor *a, kl_tensor *b, kl_tensor *w) {
    kl_tensor *in[3] = {a, b, w};
    ke_call c = {.op = KE_OP_lerp, .nin = 3, .in = in};
    return ke_call1(&c);
}

static kl_tensor *lerp_scalar_call(kl_tensor *a, kl_tensor *b, double w, int inplace) {
    kl_tensor *in[2] = {a, b};
    ke_call c = {.op = KE_OP_lerp_scalar, .inplace = (uint8_t)inplace, .nin = 2, .in = in};
    ke_attr_set_lerp_scalar_weight(&c.a, w);
    return ke_call1(&c);
}
kl_tensor *kl_lerp_scalar(kl_tensor *a, kl_tensor *b, double w) { return lerp_scalar_call(a, b, w, 0); }
kl_tensor *kl_lerp_scalar_inplace(kl_tensor *a, kl_tensor *b, double w) { return lerp_scalar_call(a, b, w, 1); }

static kl_tensor *masked_fill_call(kl_tensor *x, kl_tensor *mask, double value, int inplace) {
    kl_tensor *in[2] = {x, mask};
    ke_call c = {.op = KE_OP_masked_fill, .inplace = (uint8_t)inplace, .nin = 2, .in = in};
    ke_attr_set_masked_fill_value(&c.a, value);
    return ke_call1(&c);
}
kl_tensor *kl_masked_fill(kl_tensor *x, kl_tensor *mask, double value) { return masked_fill_call(x, mask, value, 0); }
kl_tensor *kl_masked_fill_inplace(kl_tensor *x, kl_tensor *mask, double value) {
    return masked_fill_call(x, mask, value, 1);
}

static kl_tensor *tri_call(int op, kl_tensor *x, int64_t k) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .nin = 1, .in = in};
    ke_attr_set_tril_diagonal(&c.a, k);
    return ke_call1(&c);
}
kl_tensor *kl_tril(kl_tensor *x, int64_t k) { return tri_call(KE_OP_tril, x, k); }
kl_tensor *kl_triu(kl_tensor *x, int64_t k) { return tri_call(KE_OP_triu, x, k); }

#endif /* !KE_DEVICE */
