/*
 * cn_rng.c — the random ops on CUDA tensors generated on the device: rand,
 * randn, randint, bernoulli, dropout, dropout2d.
 *
 * The CPU's Philox stream, bit for bit: the kernel's per-element math is
 * src/eager/philox_xf.h — the text philox.c's fills include — pasted into
 * the program (embedded at build time, so only these modules depend on it).
 * Element i of a fill reads Philox block offset + i / P, lane i % P (P = 4
 * for f32, 2 for f64 and int64: philox.h's layout), keyed by the seed; the
 * transforms are +, -, *, / and bit operations, compiled without contraction
 * on every side (philox.c's pragma, NVRTC's -fmad=false, the emulator's
 * -ffp-contract=off), so uniform, normal (Box-Muller with the in-house
 * log / sincos / sqrt) and randint values are the CPU's bits. The seed and
 * offset are the call's attributes (reserved by ke_random_reserve, as on the
 * CPU), so the same seed draws the same numbers on either device, and a
 * dropout's backward (the op again with its recorded attributes) draws the
 * forward's mask.
 *
 * One kernel template, its mode and element type chosen by #defines at the
 * top of the generated program: FILL (rand, randn, randint), DROPOUT
 * (x * (u < 1 - p ? 1 / (1 - p) : 0) with the CPU's q and scale, per element
 * or, for dropout2d, one draw per [N, C] plane), BERNOULLI (u < p, out-of-range
 * probabilities flagged in a status word the call reads back: the CPU's
 * error). A thread computes one Philox block and writes its P elements
 * (grid-stride); dropout2d's threads take one element each and recompute
 * their plane's block. Dtypes other than f32 / f64 / int64 go through a
 * temporary of the stream's type and the device's cast kernel (cn_eager.c's
 * identity), as the CPU converts its f32 / f64 / int64 buffer.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "philox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char ku_philox_xf_h[]; /* src/eager/philox_xf.h, embedded (meson.build) */

enum { RNG_FILL = CN_RNG_FILL, RNG_DROPOUT = CN_RNG_DROPOUT, RNG_BERNOULLI = CN_RNG_BERNOULLI };

typedef struct rng_gen {
    int mode, kind; /* kind: ke_philox_kind */
} rng_gen;

/* Parameters a0..a2 (double) and u0, u1 (u64) are the transform's constants
 * (uniform lo, span, cap; normal mean, std; randint low, range), b0, b1 the
 * mode's (dropout q, scale). */
static const char rng_kernel[] =
    "extern \"C\" __global__ void kl_rng(KL_T *__restrict__ out, const KL_T *__restrict__ x, int *status,\n"
    "                                    long long n, long long plane, unsigned long long seed,\n"
    "                                    unsigned long long offset, double a0, double a1, double a2,\n"
    "                                    unsigned long long u0, unsigned long long u1, double b0, double b1) {\n"
    "    ke_keysched ks;\n"
    "    ke_key_schedule((uint32_t)seed, (uint32_t)(seed >> 32), &ks);\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    (void)x; (void)status; (void)a0; (void)a1; (void)a2; (void)u0; (void)u1; (void)b0; (void)b1;\n"
    "    if (plane == 1) { /* a thread per Philox block: its KL_P elements */\n"
    "        const long long nblk = (n + KL_P - 1) / KL_P;\n"
    "        for (long long b = t; b < nblk; b += step) {\n"
    "            uint32_t l[4];\n"
    "            KL_T v[KL_P];\n"
    "            ke_block(&ks, offset + (uint64_t)b, l);\n"
    "            KL_XF(l, v);\n"
    "            for (int k = 0; k < KL_P; k++) {\n"
    "                const long long i = b * KL_P + k;\n"
    "                if (i < n) KL_APPLY(i, v[k]);\n"
    "            }\n"
    "        }\n"
    "    } else { /* a thread per element, one draw per plane of `plane` elements */\n"
    "        for (long long i = t; i < n; i += step) {\n"
    "            const long long d = i / plane;\n"
    "            uint32_t l[4];\n"
    "            KL_T v[KL_P];\n"
    "            ke_block(&ks, offset + (uint64_t)(d / KL_P), l);\n"
    "            KL_XF(l, v);\n"
    "            KL_APPLY(i, v[d % KL_P]);\n"
    "        }\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_rng)\n";

static int gen_rng(void *ctx, cn_kernel_src *src) {
    const rng_gen *g = ctx;
    const char *T, *xf;
    int P;
    switch (g->kind) {
    case KE_PHILOX_UNIFORM_F32: T = "float", P = 4, xf = "ke_xf_uniform_f32(l, v, a0, a1, (float)a2)"; break;
    case KE_PHILOX_UNIFORM_F64: T = "double", P = 2, xf = "ke_xf_uniform_f64(l, v, a0, a1, a2)"; break;
    case KE_PHILOX_NORMAL_F32: T = "float", P = 4, xf = "ke_xf_normal_f32(l, v, (float)a0, (float)a1)"; break;
    case KE_PHILOX_NORMAL_F64: T = "double", P = 2, xf = "ke_xf_normal_f64(l, v, a0, a1)"; break;
    default: T = "int64_t", P = 2, xf = "ke_xf_randint(l, v, u0, u1)"; break;
    }
    const char *apply = g->mode == RNG_FILL      ? "out[i] = (u)"
                        : g->mode == RNG_DROPOUT ? "out[i] = x[i] * ((u) < (KL_T)b0 ? (KL_T)b1 : (KL_T)0)"
                                                 : "{ const KL_T p_ = x[i]; if (!(p_ >= 0 && p_ <= 1)) atomicExch(status, 1);"
                                                   " out[i] = (u) < p_ ? (KL_T)1 : (KL_T)0; }";
    const size_t cap = strlen(ku_philox_xf_h) + sizeof rng_kernel + 1024;
    char *s = malloc(cap);
    if (!s) return ke_err(KL_ERR_OOM, "rng", "out of memory for a kernel source");
    int len = snprintf(s, cap,
                       "//kiln random kernel: %s\n#include \"kiln_cuda.h\"\n"
                       "#define KE_INLINE static __forceinline__\n%s\n"
                       "#define KL_T %s\n#define KL_P %d\n#define KL_XF(l, v) %s\n#define KL_APPLY(i, u) %s\n%s",
                       g->mode == RNG_FILL ? "fill" : g->mode == RNG_DROPOUT ? "dropout" : "bernoulli",
                       ku_philox_xf_h, T, P, xf, apply, rng_kernel);
    if (len < 0 || (size_t)len >= cap) {
        free(s);
        return ke_err(KL_ERR_INTERNAL, "rng", "kernel source too long");
    }
    memset(src, 0, sizeof *src);
    src->src = s;
    strcpy(src->name, "kl_rng");
    return 0;
}

int cn_rng_program(int mode, int kind, cn_kernel_src *src) {
    rng_gen g = {mode, kind};
    return gen_rng(&g, src);
}

int cn_is_contiguous(const kl_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != st) return 0;
        st *= t->shape[d];
    }
    return 1;
}


/* t as a contiguous tensor of dtype dt on the device (t itself when it is one). */
kl_tensor *cn_as_contiguous(const ke_call *c, kl_tensor *t, kl_dtype dt) {
    if (t->dtype == dt && cn_is_contiguous(t)) return t;
    kl_tensor *r = kl_empty_on(t->ndim, t->shape, dt, c->device);
    return r && !cn_copy_into(c, t, r) ? r : NULL;
}

int ku_cuda_rng(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *out = c->out[0];
    const int64_t n = ke_numel(out->ndim, out->shape);
    if (n == 0) return 0;
    const int f64 = out->dtype == KL_F64;
    rng_gen g = {RNG_FILL, f64 ? KE_PHILOX_UNIFORM_F64 : KE_PHILOX_UNIFORM_F32};
    double a[3] = {0, 1, 0}, b[2] = {0, 0};
    uint64_t u[2] = {0, 0};
    int64_t plane = 1;
    switch (c->op) {
    case KE_OP_rand: break;
    case KE_OP_randn: g.kind = f64 ? KE_PHILOX_NORMAL_F64 : KE_PHILOX_NORMAL_F32; break;
    case KE_OP_randint: {
        const int64_t lo = ke_attr_randint_low(&c->a), hi = ke_attr_randint_high(&c->a);
        g.kind = KE_PHILOX_RANDINT_I64;
        u[0] = (uint64_t)lo;
        u[1] = hi > lo ? (uint64_t)hi - (uint64_t)lo : 0; /* ke_philox_randint_i64's range */
        break;
    }
    case KE_OP_bernoulli: g.mode = RNG_BERNOULLI; break;
    case KE_OP_dropout:
    case KE_OP_dropout2d: {
        const double p = ke_attr_dropout_p(&c->a);
        g.mode = RNG_DROPOUT;
        /* the CPU's constants, rounded to the stream's type as it rounds them */
        if (f64) {
            const double q = 1 - p;
            b[0] = q, b[1] = p < 1 ? 1 / q : 0;
        } else {
            const float q = (float)(1 - p);
            b[0] = q, b[1] = p < 1 ? 1.0f / q : 0.0f;
        }
        if (c->op == KE_OP_dropout2d) {
            const int64_t planes = out->ndim >= 2 ? out->shape[0] * out->shape[1] : 1;
            plane = planes ? n / planes : 1;
        }
        break;
    }
    default: return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    }
    if (g.kind == KE_PHILOX_UNIFORM_F32) a[2] = nextafterf(1.0f, 0.0f); /* the largest value below hi = 1 */
    if (g.kind == KE_PHILOX_UNIFORM_F64) a[2] = nextafter(1.0, 0.0);
    const kl_dtype base = g.kind == KE_PHILOX_RANDINT_I64 ? KL_I64
                          : g.kind == KE_PHILOX_UNIFORM_F64 || g.kind == KE_PHILOX_NORMAL_F64 ? KL_F64
                                                                                              : KL_F32;
    const int P = base == KL_F32 ? 4 : 2, dev = c->device.index;

    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 10; /* a random kernel */
    key.op = c->op;
    key.dev = dev;
    key.nin = (uint8_t)c->nin;
    key.dt[0] = (uint8_t)base;
    key.dt[1] = (uint8_t)g.kind;
    CUfunction fn = NULL;
    if (cn_eager_fn(op, &key, gen_rng, &g, &fn)) return -1;

    kl_scope_begin();
    int rc = 0;
    kl_tensor *x = NULL, *dst = out;
    if (g.mode != RNG_FILL && !(x = cn_as_contiguous(c, c->in[0], base))) rc = -1;
    if (!rc && (out->dtype != base || !cn_is_contiguous(out)))
        if (!(dst = kl_empty_on(out->ndim, out->shape, base, c->device))) rc = -1;
    CUstream s = ku_current_stream(dev);
    const ku_driver *d = rc ? NULL : ku_driver_get(op);
    if (!d || ku_device_enter(op, dev)) rc = -1;
    CUdeviceptr status = 0;
    if (!rc && g.mode == RNG_BERNOULLI) {
        if (!(status = ku_malloc(op, dev, sizeof(int), s)) || KU_CALL(op, d, MemsetD8Async, status, 0, sizeof(int), s))
            rc = -1;
    }
    if (!rc) {
        void *po = ke_data(dst), *px = x ? ke_data(x) : NULL, *ps = (void *)(uintptr_t)status;
        long long nn = n, pl = plane;
        unsigned long long seed = (uint64_t)ke_attr_seed(&c->a), off = (uint64_t)ke_attr_offset(&c->a);
        void *args[] = {&po, &px, &ps, &nn, &pl, &seed, &off, &a[0], &a[1], &a[2], &u[0], &u[1], &b[0], &b[1]};
        const int64_t work = plane == 1 ? (n + P - 1) / P : n, blocks = (work + CN_BLOCK - 1) / CN_BLOCK;
        const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                       block[3] = {work < CN_BLOCK ? (unsigned)(work + 31) / 32 * 32 : CN_BLOCK, 1, 1};
        rc = ku_launch(op, fn, grid, block, 0, s, args);
    }
    if (!rc && status) {
        int st = 0;
        rc = KU_CALL(op, d, MemcpyDtoHAsync, &st, status, sizeof st, s) || KU_CALL(op, d, StreamSynchronize, s);
        if (!rc && st) rc = ke_err(KL_ERR_ARG, "bernoulli", "probabilities must be in [0, 1]");
    }
    if (status) ku_free(op, status);
    /* the stream's values into out's dtype, as the CPU's ke_convert */
    if (!rc && dst != out) rc = cn_copy_into(c, dst, out);
    kl_scope_end();
    return rc ? -1 : 0;
}
