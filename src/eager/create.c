/*
 * create.c — creation, random and copy ops (rows in ops_create.def): shape
 * rules, CPU kernels, and the public wrappers, plus kl_from_data/from_blob,
 * which wrap memory rather than dispatch.
 */
#include "optable.h" /* declares this file's kernels, checked against their columns */
#include "philox.h"
#include "threadpool.h"

#include <math.h>

/* The identity loops of clone and to_dtype (ke_ew_identity) are in ew_unary.c. */

/* ---- shape rules -------------------------------------------------------------- */

int ke_infer_create(ke_call *c, ke_outspec *out) {
    kl_dtype dt = ke_attr_dtype(&c->a);
    int nd = ke_attr_shape_len(&c->a);
    if (ke_check_shape(ke_opname(c), nd, ke_attr_shape(&c->a), dt)) return -1;
    if ((c->op == KE_OP_rand || c->op == KE_OP_randn) && !ke_is_float(dt))
        return ke_err(KL_ERR_DTYPE, ke_opname(c), "needs a floating dtype, got %s", ke_dtypes[dt].name);
    if (c->op == KE_OP_full && ke_check_scalar_cast(ke_opname(c), ke_attr_full_value(&c->a), dt)) return -1;
    out->dtype = dt;
    c->compute = ke_compute_dtype(dt);
    out->ndim = nd;
    memcpy(out->shape, ke_attr_shape(&c->a), sizeof(int64_t) * nd);
    return 1;
}

int ke_infer_arange(ke_call *c, ke_outspec *out) {
    double start = ke_attr_arange_start(&c->a), end = ke_attr_arange_end(&c->a), step = ke_attr_arange_step(&c->a);
    kl_dtype dt = ke_attr_dtype(&c->a);
    if (!ke_dtype_valid(dt)) return ke_err(KL_ERR_DTYPE, ke_opname(c), "invalid dtype value %d", (int)dt);
    if (!isfinite(start) || !isfinite(end)) return ke_err(KL_ERR_ARG, ke_opname(c), "start and end must be finite");
    if (step == 0 || !isfinite(step)) return ke_err(KL_ERR_ARG, ke_opname(c), "step must be finite and nonzero");
    if ((end - start) / step < 0)
        return ke_err(KL_ERR_ARG, ke_opname(c), "upper bound and step sign are inconsistent (%g to %g by %g)", start,
                      end, step);
    double n = ceil((end - start) / step);
    if (n > 1e15) return ke_err(KL_ERR_OVERFLOW, ke_opname(c), "%g elements is too many", n);
    out->dtype = dt;
    c->compute = ke_compute_dtype(dt);
    out->ndim = 1;
    out->shape[0] = (int64_t)n;
    return ke_check_shape(ke_opname(c), 1, out->shape, dt) ? -1 : 1;
}

int ke_infer_linspace(ke_call *c, ke_outspec *out) {
    kl_dtype dt = ke_attr_dtype(&c->a);
    if (!ke_dtype_valid(dt)) return ke_err(KL_ERR_DTYPE, ke_opname(c), "invalid dtype value %d", (int)dt);
    if (ke_attr_linspace_steps(&c->a) < 0)
        return ke_err(KL_ERR_ARG, ke_opname(c), "number of steps must be non-negative");
    out->dtype = dt;
    c->compute = ke_compute_dtype(dt);
    out->ndim = 1;
    out->shape[0] = ke_attr_linspace_steps(&c->a);
    return ke_check_shape(ke_opname(c), 1, out->shape, dt) ? -1 : 1;
}

int ke_infer_eye(ke_call *c, ke_outspec *out) {
    kl_dtype dt = ke_attr_dtype(&c->a);
    int64_t n = ke_attr_eye_n(&c->a), m = ke_attr_eye_m(&c->a) < 0 ? n : ke_attr_eye_m(&c->a);
    if (n < 0) return ke_err(KL_ERR_ARG, ke_opname(c), "n must be non-negative, got %lld", (long long)n);
    out->dtype = dt;
    c->compute = ke_compute_dtype(dt);
    out->ndim = 2;
    out->shape[0] = n;
    out->shape[1] = m;
    return ke_check_shape(ke_opname(c), 2, out->shape, dt) ? -1 : 1;
}

/* copy(dst, src): src broadcasts to dst; the result is dst itself. */
int ke_infer_copy(ke_call *c, ke_outspec *out) {
    kl_tensor *dst = c->in[0], *src = c->in[1];
    int nd;
    int64_t shape[KL_MAX_DIMS];
    kl_tensor *pair[2] = {dst, src};
    if (ke_broadcast_shapes(ke_opname(c), 2, pair, &nd, shape)) return -1;
    if (nd != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * nd)) {
        char b1[256], b2[256];
        return ke_err(KL_ERR_SHAPE, ke_opname(c), "source %s does not broadcast to destination %s",
                      ke_fmt_tensor(b1, sizeof b1, src), ke_fmt_tensor(b2, sizeof b2, dst));
    }
    out->dtype = (kl_dtype)dst->dtype;
    c->compute = (kl_dtype)dst->dtype;
    out->ndim = dst->ndim;
    memcpy(out->shape, dst->shape, sizeof(int64_t) * dst->ndim);
    return 1;
}

/* ---- kernels ------------------------------------------------------------------ */

int ke_cpu_empty(ke_call *c) {
    (void)c;
    return 0;
}

/* Writes one value, already in the output dtype, over a contiguous tensor. */
static void fill_bytes(kl_tensor *t, const void *val) {
    size_t es = ke_dtypes[t->dtype].size;
    int64_t n = ke_numel(t->ndim, t->shape);
    char *p = ke_data(t);
    int zero = 1;
    for (size_t b = 0; b < es; b++)
        if (((const char *)val)[b]) zero = 0;
    if (zero) {
        memset(p, 0, (size_t)n * es);
        return;
    }
    switch (es) {
    case 1: memset(p, *(const uint8_t *)val, (size_t)n); break;
    case 2: for (int64_t i = 0; i < n; i++) memcpy(p + 2 * i, val, 2); break;
    case 4: {
        uint32_t v;
        memcpy(&v, val, 4);
        for (int64_t i = 0; i < n; i++) ((uint32_t *)p)[i] = v;
        break;
    }
    default: {
        uint64_t v;
        memcpy(&v, val, 8);
        for (int64_t i = 0; i < n; i++) ((uint64_t *)p)[i] = v;
        break;
    }
    }
}

int ke_cpu_full(ke_call *c) {
    char val[8];
    ke_store_f64(val, (kl_dtype)c->out[0]->dtype, 0, ke_attr_full_value(&c->a));
    fill_bytes(c->out[0], val);
    return 0;
}

int ke_cpu_arange(ke_call *c) {
    kl_tensor *o = c->out[0];
    double start = ke_attr_arange_start(&c->a), step = ke_attr_arange_step(&c->a);
    for (int64_t i = 0; i < o->shape[0]; i++) ke_store_f64(ke_data(o), (kl_dtype)o->dtype, i, start + (double)i * step);
    return 0;
}

int ke_cpu_linspace(ke_call *c) {
    kl_tensor *o = c->out[0];
    int64_t n = o->shape[0];
    double a = ke_attr_linspace_start(&c->a), b = ke_attr_linspace_end(&c->a), step = n > 1 ? (b - a) / (double)(n - 1) : 0;
    if (n == 1) { /* one step is the start, as PyTorch */
        ke_store_f64(ke_data(o), (kl_dtype)o->dtype, 0, a);
        return 0;
    }
    /* symmetric evaluation as PyTorch: the second half counts back from end */
    for (int64_t i = 0; i < n; i++) {
        double v = i < n / 2 ? a + step * (double)i : b - step * (double)(n - 1 - i);
        ke_store_f64(ke_data(o), (kl_dtype)o->dtype, i, v);
    }
    return 0;
}

int ke_cpu_eye(ke_call *c) {
    kl_tensor *o = c->out[0];
    char zero[8] = {0};
    fill_bytes(o, zero);
    int64_t n = o->shape[0], m = o->shape[1];
    for (int64_t i = 0; i < n && i < m; i++) ke_store_f64(ke_data(o), (kl_dtype)o->dtype, i * m + i, 1.0);
    return 0;
}

/* Random fills run in chunks through an f32/f64/i64 buffer when the output
 * dtype differs, so every dtype sees the same stream. */
typedef struct rand_ctx {
    ke_call *c;
    kl_tensor *o;
    int kind;
    uint64_t seed, offset;
} rand_ctx;

static void rand_range(void *ctx_, int64_t begin, int64_t end) {
    rand_ctx *r = ctx_;
    kl_dtype dt = (kl_dtype)r->o->dtype;
    char *dst = ke_data(r->o);
    _Alignas(64) char buf[1024 * 8];
    for (int64_t b = begin; b < end; b += 1024) {
        int64_t e = b + 1024 < end ? b + 1024 : end, n = e - b;
        void *tgt;
        kl_dtype tdt;
        switch (r->kind) {
        case KE_PHILOX_UNIFORM_F64:
        case KE_PHILOX_NORMAL_F64: tdt = KL_F64; break;
        case KE_PHILOX_RANDINT_I64: tdt = KL_I64; break;
        default: tdt = KL_F32; break;
        }
        /* fills write dst[begin..end) relative to element 0: shift the buffer base */
        int direct = tdt == dt;
        /* the fill writes tgt[b..e): point tgt b elements before buf, through
         * integers, since pointer arithmetic outside buf would be undefined */
        tgt = direct ? (void *)dst : (void *)((uintptr_t)buf - (uintptr_t)(b * (int64_t)ke_dtypes[tdt].size));
        switch (r->kind) {
        case KE_PHILOX_UNIFORM_F32: ke_philox_uniform_f32(r->seed, r->offset, tgt, b, e, 0.f, 1.f); break;
        case KE_PHILOX_UNIFORM_F64: ke_philox_uniform_f64(r->seed, r->offset, tgt, b, e, 0., 1.); break;
        case KE_PHILOX_NORMAL_F32: ke_philox_normal_f32(r->seed, r->offset, tgt, b, e, 0.f, 1.f); break;
        case KE_PHILOX_NORMAL_F64: ke_philox_normal_f64(r->seed, r->offset, tgt, b, e, 0., 1.); break;
        default:
            ke_philox_randint_i64(r->seed, r->offset, tgt, b, e, ke_attr_randint_low(&r->c->a),
                                  ke_attr_randint_high(&r->c->a));
            break;
        }
        if (!direct) ke_convert(dst + b * (int64_t)ke_dtypes[dt].size, dt, buf, tdt, n);
    }
}

static int run_random(ke_call *c, kl_tensor *o, int kind) {
    rand_ctx r = {c, o, kind, (uint64_t)ke_attr_seed(&c->a), (uint64_t)ke_attr_offset(&c->a)};
    ke_parallel_for(ke_numel(o->ndim, o->shape), 1 << 16, rand_range, &r);
    return 0;
}

int ke_cpu_rand(ke_call *c) {
    return run_random(c, c->out[0], c->out[0]->dtype == KL_F64 ? KE_PHILOX_UNIFORM_F64 : KE_PHILOX_UNIFORM_F32);
}
int ke_cpu_randn(ke_call *c) {
    return run_random(c, c->out[0], c->out[0]->dtype == KL_F64 ? KE_PHILOX_NORMAL_F64 : KE_PHILOX_NORMAL_F32);
}
int ke_cpu_randint(ke_call *c) { return run_random(c, c->out[0], KE_PHILOX_RANDINT_I64); }

int ke_cpu_bernoulli(ke_call *c) {
    kl_tensor *p = c->in[0], *o = c->out[0];
    int64_t n = ke_numel(o->ndim, o->shape);
    kl_scope_begin();
    kl_tensor *pc = kl_contiguous(kl_to_dtype(p, o->dtype == KL_F64 ? KL_F64 : KL_F32));
    kl_tensor *u = kl_empty_on(o->ndim, o->shape, (kl_dtype)pc->dtype, KL_DEVICE_CPU);
    int rc = -1;
    if (pc && u) {
        run_random(c, u, pc->dtype == KL_F64 ? KE_PHILOX_UNIFORM_F64 : KE_PHILOX_UNIFORM_F32);
        const char *pp = ke_data(pc), *up = ke_data(u);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double pv = ke_load_f64(pp, (kl_dtype)pc->dtype, i);
            if (!(pv >= 0 && pv <= 1)) bad = 1;
            ke_store_f64(ke_data(o), (kl_dtype)o->dtype, i, ke_load_f64(up, (kl_dtype)u->dtype, i) < pv ? 1.0 : 0.0);
        }
        rc = bad ? ke_err(KL_ERR_ARG, "bernoulli", "probabilities must be in [0, 1]") : 0;
    }
    kl_scope_end();
    return rc;
}

int ke_cpu_copy(ke_call *c) {
    kl_tensor *in[1] = {c->in[1]};
    ke_call k = *c;
    k.in = in;
    k.nin = 1;
    return ke_ew_run(&k, &ke_ew_identity, ke_compute_dtype((kl_dtype)c->in[0]->dtype));
}

/* Moves are empty_on(to) + copy: copy may cross devices (dispatch.c), its
 * device kernel moves the bytes, and autograd sees a copy whose gradient the
 * engine moves back to the source's device. Same device: an alias (PyTorch's
 * .to returns self). */
int ke_decomp_to_device(ke_call *c) {
    kl_tensor *x = c->in[0];
    /* while tracing, x's real device (a traced value is a meta tensor) */
    kl_device from = ke_device_of(x), to = {ke_attr_to_device_device(&c->a), (int)ke_attr_to_device_index(&c->a)};
    kl_tensor *y = NULL;
    /* a traced value (meta) sent to meta: a decomposition traced on meta
     * stand-ins asked for another value's device, which is meta there too */
    if ((from.type == to.type && (from.index == to.index || to.type != KL_CUDA)) ||
        (x->storage->device.type == KL_META && to.type == KL_META)) {
        y = ke_unary(KE_OP_alias, x, 0);
    } else if (to.type == KL_META) {
        y = kl_empty_on(x->ndim, x->shape, (kl_dtype)x->dtype, to);
    } else if ((unsigned)to.type > KL_META) {
        ke_err(KL_ERR_ARG, ke_opname(c), "unknown device type %d", (int)to.type);
    } else if (from.type == KL_META) {
        char b[256];
        ke_err(KL_ERR_DEVICE, ke_opname(c), "cannot move %s to %s: a meta tensor has no data",
               ke_fmt_tensor(b, sizeof b, x), ke_device_name(to));
    } else {
        /* The target is checked first, so a missing driver or a bad index
         * is this op's error, not the allocation's. */
        const ke_device_ops *o = ke_device_ops_of(KL_CUDA);
        void *none;
        if (!o) {
            ke_err(KL_ERR_DEVICE, ke_opname(c), "CUDA not available: no CUDA backend in this build");
        } else if (to.type != KL_CUDA || !o->alloc(ke_opname(c), to.index, 0, &none)) {
            kl_tensor *e = kl_empty_on(x->ndim, x->shape, (kl_dtype)x->dtype, to);
            y = e ? kl_copy_inplace(e, x) : NULL;
        }
    }
    return ke_set_out1(c, y);
}

/* ---- public wrappers ---------------------------------------------------------- */

/* value: full's fill value (empty has none); name: the public function the
   user called (kl_zeros is a full underneath, but its errors say "zeros") */
static kl_tensor *create_call(int op, const char *name, int ndim, const int64_t *shape, kl_dtype dt, kl_device dev,
                              double value) {
    ke_call c = {.op = op, .nin = 0, .device = dev};
    if (ke_check_shape(name, ndim, shape, dt)) return NULL;
    ke_set_list(&c, ndim, shape);
    if (op == KE_OP_full) ke_attr_set_full_value(&c.a, value);
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}

kl_tensor *kl_empty_on(int ndim, const int64_t *shape, kl_dtype dt, kl_device dev) {
    return create_call(KE_OP_empty, "empty", ndim, shape, dt, dev, 0);
}
kl_tensor *kl_empty(int ndim, const int64_t *shape, kl_dtype dt) {
    return create_call(KE_OP_empty, "empty", ndim, shape, dt, ke_tls_state.default_device, 0);
}
kl_tensor *kl_full(int ndim, const int64_t *shape, double value, kl_dtype dt) {
    return create_call(KE_OP_full, "full", ndim, shape, dt, ke_tls_state.default_device, value);
}
kl_tensor *kl_zeros(int ndim, const int64_t *shape, kl_dtype dt) {
    return create_call(KE_OP_full, "zeros", ndim, shape, dt, ke_tls_state.default_device, 0);
}
kl_tensor *kl_ones(int ndim, const int64_t *shape, kl_dtype dt) {
    return create_call(KE_OP_full, "ones", ndim, shape, dt, ke_tls_state.default_device, 1);
}
kl_tensor *kl_scalar_tensor(double value, kl_dtype dt) { return kl_full(0, NULL, value, dt); }

kl_tensor *kl_arange(double start, double end, double step, kl_dtype dt) {
    ke_call c = {.op = KE_OP_arange, .device = ke_tls_state.default_device};
    ke_attr_set_arange_start(&c.a, start);
    ke_attr_set_arange_end(&c.a, end);
    ke_attr_set_arange_step(&c.a, step);
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}
kl_tensor *kl_linspace(double start, double end, int64_t steps, kl_dtype dt) {
    ke_call c = {.op = KE_OP_linspace, .device = ke_tls_state.default_device};
    ke_attr_set_linspace_start(&c.a, start);
    ke_attr_set_linspace_end(&c.a, end);
    ke_attr_set_linspace_steps(&c.a, steps);
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}
kl_tensor *kl_eye(int64_t n, int64_t m, kl_dtype dt) {
    ke_call c = {.op = KE_OP_eye, .device = ke_tls_state.default_device};
    ke_attr_set_eye_n(&c.a, n);
    ke_attr_set_eye_m(&c.a, m);
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}

static kl_tensor *like(const kl_tensor *t, int op, double v, const char *name) {
    if (ke_check_tensor(t, name, 1)) return NULL;
    return create_call(op, name, t->ndim, t->shape, (kl_dtype)t->dtype, ke_device_of(t), v);
}
kl_tensor *kl_empty_like(const kl_tensor *t) { return like(t, KE_OP_empty, 0, "empty_like"); }
kl_tensor *kl_zeros_like(const kl_tensor *t) { return like(t, KE_OP_full, 0, "zeros_like"); }
kl_tensor *kl_ones_like(const kl_tensor *t) { return like(t, KE_OP_full, 1, "ones_like"); }
kl_tensor *kl_full_like(const kl_tensor *t, double value) { return like(t, KE_OP_full, value, "full_like"); }

/* Random ops reserve their Philox counters at the call, so the seed and offset
 * are attributes (seed, offset): a trace records them, and a replay of the trace
 * calls this again for fresh numbers. The counters used depend on the op, the
 * element count and the dtype; this is the one place that knows how. */
int ke_random_reserve(ke_call *c) {
    int64_t n;
    kl_dtype dt;
    if (c->nin == 0) {
        n = ke_numel(ke_attr_shape_len(&c->a), ke_attr_shape(&c->a));
        dt = ke_attr_dtype(&c->a);
    } else {
        n = ke_numel(c->in[0]->ndim, c->in[0]->shape);
        dt = (kl_dtype)c->in[0]->dtype;
        if (c->op == KE_OP_dropout2d) n = c->in[0]->ndim >= 2 ? c->in[0]->shape[0] * c->in[0]->shape[1] : n; /* a draw per plane */
    }
    int f64 = dt == KL_F64, kind;
    switch (c->op) {
    case KE_OP_randn: kind = f64 ? KE_PHILOX_NORMAL_F64 : KE_PHILOX_NORMAL_F32; break;
    case KE_OP_randint: kind = KE_PHILOX_RANDINT_I64; break;
    case KE_OP_rand:
    case KE_OP_bernoulli:
    case KE_OP_dropout:
    case KE_OP_dropout2d: kind = f64 ? KE_PHILOX_UNIFORM_F64 : KE_PHILOX_UNIFORM_F32; break;
    case KE_OP_multinomial: { /* f64 uniforms: num_samples per row with replacement, else one per category */
        const kl_tensor *p = c->in[0];
        int64_t rows = p->ndim == 2 ? p->shape[0] : 1, m = p->ndim ? p->shape[p->ndim - 1] : 1;
        if (ke_attr_multinomial_replacement(&c->a)) m = ke_attr_multinomial_num_samples(&c->a);
        n = m > 0 ? rows * m : 0;
        kind = KE_PHILOX_UNIFORM_F64;
        break;
    }
    default: return ke_err(KL_ERR_INTERNAL, ke_opname(c), "is not a random op");
    }
    uint64_t seed, off = ke_generator_reserve_seeded(ke_default_generator(), ke_philox_counters_used(n, kind), &seed);
    ke_attr_set_seed(&c->a, (int64_t)seed);
    ke_attr_set_offset(&c->a, (int64_t)off);
    return 0;
}

static kl_tensor *random_call(int op, int ndim, const int64_t *shape, kl_dtype dt, kl_device dev, int64_t lo,
                              int64_t hi) {
    ke_call c = {.op = op, .device = dev};
    if (ke_check_shape(ke_opname(&c), ndim, shape, dt)) return NULL;
    ke_set_list(&c, ndim, shape);
    if (op == KE_OP_randint) ke_attr_set_randint_low(&c.a, lo), ke_attr_set_randint_high(&c.a, hi);
    ke_attr_set_dtype(&c.a, dt);
    if (ke_random_reserve(&c)) return NULL;
    return ke_call1(&c);
}
kl_tensor *kl_rand(int ndim, const int64_t *shape, kl_dtype dt) {
    return random_call(KE_OP_rand, ndim, shape, dt, ke_tls_state.default_device, 0, 0);
}
kl_tensor *kl_randn(int ndim, const int64_t *shape, kl_dtype dt) {
    return random_call(KE_OP_randn, ndim, shape, dt, ke_tls_state.default_device, 0, 0);
}
kl_tensor *kl_randint(int64_t low, int64_t high, int ndim, const int64_t *shape, kl_dtype dt) {
    if (high <= low) {
        ke_err(KL_ERR_ARG, "randint", "low (%lld) must be less than high (%lld)", (long long)low, (long long)high);
        return NULL;
    }
    return random_call(KE_OP_randint, ndim, shape, dt, ke_tls_state.default_device, low, high);
}
kl_tensor *kl_rand_like(const kl_tensor *t) {
    if (ke_check_tensor(t, "rand_like", 1)) return NULL;
    return random_call(KE_OP_rand, t->ndim, t->shape, (kl_dtype)t->dtype, ke_device_of(t), 0, 0);
}
kl_tensor *kl_randn_like(const kl_tensor *t) {
    if (ke_check_tensor(t, "randn_like", 1)) return NULL;
    return random_call(KE_OP_randn, t->ndim, t->shape, (kl_dtype)t->dtype, ke_device_of(t), 0, 0);
}
kl_tensor *kl_bernoulli(kl_tensor *p) {
    if (ke_check_tensor(p, "bernoulli", 1)) return NULL;
    kl_tensor *in[1] = {p};
    ke_call c = {.op = KE_OP_bernoulli, .nin = 1, .in = in};
    if (ke_random_reserve(&c)) return NULL;
    return ke_call1(&c);
}

kl_tensor *kl_clone(kl_tensor *t) { return ke_unary(KE_OP_clone, t, 0); }

kl_tensor *kl_to_dtype(kl_tensor *t, kl_dtype dt) {
    if (ke_check_tensor(t, "to_dtype", 1)) return NULL;
    if (t->dtype == dt) return ke_unary(KE_OP_alias, t, 0);
    kl_tensor *in[1] = {t};
    ke_call c = {.op = KE_OP_to_dtype, .nin = 1, .in = in};
    ke_attr_set_dtype(&c.a, dt);
    return ke_call1(&c);
}

kl_tensor *kl_to_device(kl_tensor *t, kl_device dev) {
    kl_tensor *in[1] = {t};
    ke_call c = {.op = KE_OP_to_device, .nin = 1, .in = in};
    ke_attr_set_to_device_device(&c.a, dev.type);
    ke_attr_set_to_device_index(&c.a, dev.index);
    return ke_call1(&c);
}

kl_tensor *kl_copy_inplace(kl_tensor *dst, kl_tensor *src) { return ke_binary(KE_OP_copy, dst, src, 1); }

kl_tensor *kl_fill_inplace(kl_tensor *t, double value) {
    if (ke_check_tensor(t, "fill_inplace", 1) || ke_check_scalar_cast("fill_inplace", value, (kl_dtype)t->dtype))
        return NULL;
    kl_tensor *v = ke_tensor_new((kl_dtype)t->dtype, 0, NULL, KL_DEVICE_CPU, "fill_inplace");
    if (!v) return NULL;
    ke_store_f64(v->storage->data, (kl_dtype)t->dtype, 0, value);
    v->flags |= KE_TF_WRAPPED; /* a C scalar: joins a computation on any device */
    kl_tensor *r = ke_binary(KE_OP_copy, t, v, 1);
    ke_tensor_decref(v);
    return r;
}
kl_tensor *kl_zero_inplace(kl_tensor *t) { return kl_fill_inplace(t, 0); }

/* ---- wrapping user memory ------------------------------------------------------- */

kl_tensor *kl_from_data(const void *data, int ndim, const int64_t *shape, kl_dtype dt) {
    if (ke_check_shape("from_data", ndim, shape, dt)) return NULL;
    int64_t n = ke_numel(ndim, shape);
    if (n > 0 && !data) {
        ke_err(KL_ERR_NULL_ARG, "from_data", "data pointer is NULL");
        return NULL;
    }
    kl_tensor *t = ke_tensor_new(dt, ndim, shape, KL_DEVICE_CPU, "from_data");
    if (!t) return NULL;
    if (n) memcpy(t->storage->data, data, (size_t)n * ke_dtypes[dt].size);
    ke_scope_adopt(t);
    return t;
}

kl_tensor *kl_from_blob(void *data, int ndim, const int64_t *shape, const int64_t *strides, kl_dtype dt,
                        void (*deleter)(void *data, void *ctx), void *ctx) {
    return ke_from_blob_on(data, ndim, shape, strides, dt, KL_DEVICE_CPU, deleter, ctx);
}

kl_tensor *ke_from_blob_on(void *data, int ndim, const int64_t *shape, const int64_t *strides, kl_dtype dt,
                           kl_device dev, void (*deleter)(void *data, void *ctx), void *ctx) {
    if (ke_check_shape("from_blob", ndim, shape, dt)) return NULL;
    int64_t st[KL_MAX_DIMS];
    if (strides)
        memcpy(st, strides, sizeof(int64_t) * ndim);
    else
        ke_contiguous_strides(ndim, shape, st);
    int64_t n = ke_numel(ndim, shape), hi = 0;
    for (int d = 0; d < ndim; d++) {
        if (st[d] < 0) {
            ke_err(KL_ERR_ARG, "from_blob", "negative strides are not supported");
            return NULL;
        }
        if (n) hi += (shape[d] - 1) * st[d];
    }
    if (n > 0 && !data) {
        ke_err(KL_ERR_NULL_ARG, "from_blob", "data pointer is NULL");
        return NULL;
    }
    if ((uintptr_t)data % ke_dtypes[dt].size) {
        ke_err(KL_ERR_ARG, "from_blob", "data pointer %p is not aligned for %s", data, ke_dtypes[dt].name);
        return NULL;
    }
    ke_storage *s = ke_storage_blob_on(data, n ? (size_t)(hi + 1) * ke_dtypes[dt].size : 0, dev, deleter, ctx);
    if (!s) {
        ke_err(KL_ERR_OOM, "from_blob", "out of memory allocating a storage header");
        return NULL;
    }
    kl_tensor *t = ke_tensor_wrap(s, dt, ndim, shape, st, 0);
    if (!t) {
        /* the deleter must not run: the caller keeps ownership on failure */
        s->deleter = NULL;
        ke_storage_decref(s);
        ke_err(KL_ERR_OOM, "from_blob", "out of memory allocating a tensor header");
        return NULL;
    }
    ke_storage_decref(s);
    ke_scope_adopt(t);
    return t;
}
