/*
 * philox_xf.h - the per-element math of the Philox streams: the key schedule,
 * the 10 rounds, and the transforms from a block's 4 lanes to uniform,
 * normal (Box-Muller) and randint values (philox.h has the stream layout).
 *
 * One definition for every device: philox.c's fills include it, and the
 * CUDA random kernels (src/codegen_nvrtc/cn_rng.c) paste the same text into
 * their program, so a seed gives the same bits on the CPU and on CUDA. Hence
 * plain C that NVRTC (-default-device, -fmad=false) and a C++ compiler
 * accept: only +, -, *, / and bit operations, no libm, no contraction (the
 * includer pins fp-contract=off: philox.c by pragma, NVRTC by -fmad=false,
 * the emulator by -ffp-contract=off). Needs uint32_t / uint64_t and memcpy
 * declared first, and KE_INLINE defined.
 */
#ifndef KILN_EAGER_PHILOX_XF_H
#define KILN_EAGER_PHILOX_XF_H

#ifndef UINT32_C
#define UINT32_C(x) x##u
#endif
#ifndef UINT64_C
#define UINT64_C(x) x##ull
#endif

/* Constants from Salmon et al., SC'11, Table 2 / Random123. */
#define KE_PHILOX_M0 UINT32_C(0xD2511F53)
#define KE_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define KE_PHILOX_W0 UINT32_C(0x9E3779B9) /* golden ratio */
#define KE_PHILOX_W1 UINT32_C(0xBB67AE85) /* sqrt(3) - 1 */
#define KE_PHILOX_ROUNDS 10

/* Round keys are the same for every block of a fill, so compute them once
 * instead of bumping the key inside the per-block loop (which would also
 * give the vectorizer a loop-carried dependency to prove away). */
typedef struct {
    uint32_t k[KE_PHILOX_ROUNDS][2];
} ke_keysched;

static inline void ke_key_schedule(uint32_t k0, uint32_t k1, ke_keysched *ks)
{
    for (int r = 0; r < KE_PHILOX_ROUNDS; r++) {
        ks->k[r][0] = k0 + (uint32_t)r * KE_PHILOX_W0; /* wraps mod 2^32 */
        ks->k[r][1] = k1 + (uint32_t)r * KE_PHILOX_W1;
    }
}

/* The 10 rounds on one counter.  mulhi/mullo come from one 32x32->64
 * multiply, which GCC maps to vpmuludq when the caller's loop vectorizes. */
KE_INLINE void
ke_philox_rounds(const ke_keysched *ks, uint32_t c0, uint32_t c1, uint32_t c2,
                 uint32_t c3, uint32_t out[4])
{
#ifndef __CUDACC_RTC__
#pragma GCC unroll 10
#endif
    for (int r = 0; r < KE_PHILOX_ROUNDS; r++) {
        uint64_t p0 = (uint64_t)KE_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)KE_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ ks->k[r][0];
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ ks->k[r][1];
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* One block for the 64-bit counter value c: ctr = {lo32, hi32, 0, 0}. */
KE_INLINE void ke_block(const ke_keysched *ks, uint64_t c, uint32_t l[4])
{
    ke_philox_rounds(ks, (uint32_t)c, (uint32_t)(c >> 32), 0, 0, l);
}

/* 64 random bits from lanes (a, b): a is the high word (documented layout). */
KE_INLINE uint64_t ke_join(uint32_t a, uint32_t b)
{
    return ((uint64_t)a << 32) | b;
}

/* Bit casts via memcpy: well defined in C and compiled to nothing (or to a
 * register move), so they do not block vectorization. */
KE_INLINE uint32_t ke_f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
KE_INLINE float ke_f32_from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}
KE_INLINE uint64_t ke_f64_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
KE_INLINE double ke_f64_from_bits(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Exact v -> double for v < 2^53 using the 2^52 "magic number": x86 has no
 * packed int64 -> double conversion before AVX-512DQ, so a plain cast would
 * keep the f64 loops scalar on AVX2/SSE2 machines. */
KE_INLINE double ke_u53_to_f64(uint64_t v)
{
    double lo = ke_f64_from_bits(UINT64_C(0x4330000000000000) |
                                 (v & ((UINT64_C(1) << 52) - 1))) -
                0x1p52; /* = v mod 2^52, exact */
    /* + 2^52 if bit 52 is set, as a bit mask rather than ?: (GCC does not
     * if-convert that select for AVX2, which left the f64 loops scalar) */
    double top = ke_f64_from_bits((UINT64_C(0) - ((v >> 52) & 1)) &
                                  UINT64_C(0x4330000000000000));
    return lo + top; /* exact: < 2^53 */
}

/* ---- uniform ------------------------------------------------------------- */

/* The affine map is done in double: x has 24 bits and lo/hi are floats, so
 * the double result is (nearly) exact and the single rounding to float is
 * correct; it also keeps hi - lo from overflowing for ranges like
 * [-FLT_MAX, FLT_MAX].  (u >> 8) < 2^24 so the int32 conversion is exact and
 * vectorizes (there is no packed uint32->double convert before AVX-512). */
KE_INLINE void ke_xf_uniform_f32(const uint32_t l[4], float *out, double lo,
                                 double span, float cap)
{
#ifndef __CUDACC_RTC__
#pragma GCC unroll 4
#endif
    for (int k = 0; k < 4; k++) {
        double x = (double)(int32_t)(l[k] >> 8) * 0x1p-24;
        float r = (float)(lo + span * x);
        out[k] = r > cap ? cap : r; /* only r == hi can exceed cap */
    }
}

KE_INLINE void ke_xf_uniform_f64(const uint32_t l[4], double *out, double lo,
                                 double span, double cap)
{
#ifndef __CUDACC_RTC__
#pragma GCC unroll 4
#endif
    for (int k = 0; k < 2; k++) {
        uint64_t m = ke_join(l[2 * k], l[2 * k + 1]) >> 11; /* 53 bits */
        double x = ke_u53_to_f64(m) * 0x1p-53;               /* [0, 1-2^-53] */
        double r = lo + span * x;
        out[k] = r > cap ? cap : r;
    }
}


/* ---- elementary functions for Box-Muller ----------------------------------
 *
 * Why not libm: glibc only exposes vector logf/sincosf under -ffast-math, so
 * calling libm keeps the normal fills scalar (normal_f32 measured ~4-6x
 * slower that way at -O3 -march=native), and libm results differ between
 * versions and platforms.  These use only +, -, *, / (IEEE correctly rounded) and bit
 * operations, so with fp-contract off they give the same bits on every
 * conforming target.
 *
 * The domain is tiny, which makes them simple: log only sees u in (0, 1],
 * and sin/cos only see 2*pi*u with u in (0, 1], where quadrant reduction is
 * exact arithmetic on u (no Cody-Waite / Payne-Hanek needed).  Taylor
 * coefficients are used for readability; the truncation terms are below
 * 2^-27 (f32) and 2^-60 (f64) relative.  sin/cos max error: 1.64 * 2^-24
 * (f32, exhaustive) and 1.59 * 2^-53 (f64, 20M inputs) absolute. */

#define KE_LN2_HI_F 0.693145751953125f          /* 16 bits: e*hi is exact */
#define KE_LN2_LO_F 1.428606765330187045e-06f   /* ln 2 - hi */
#define KE_LN2_HI 6.93147180369123816490e-01    /* fdlibm split */
#define KE_LN2_LO 1.90821492927058770002e-10
#define KE_2PI_F 6.28318530717958647692f
#define KE_2PI 6.28318530717958647692

/* -2 ln(x) for x in (0, 1] (normal floats).  x = 2^e * m with m in
 * [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716.
 * Max error 2.5 ulp (exhaustive over the 2^24 inputs the f32 fill can
 * produce; the f64 version below measured 2.6 ulp on 20M inputs). */
KE_INLINE float ke_neg2log_f32(float x)
{
    uint32_t b = ke_f32_bits(x);
    /* Adding bits(1.0) - bits(sqrt(1/2)) carries into the exponent field
     * exactly when x's significand (in [1, 2)) is >= sqrt(2), so e is chosen
     * with m = x / 2^e in [sqrt(1/2), sqrt(2)). */
    int32_t e = (int32_t)((b + (UINT32_C(0x3f800000) - UINT32_C(0x3f3504f3))) >> 23) - 127;
    float m = ke_f32_from_bits(b - ((uint32_t)e << 23));
    float s = (m - 1.0f) / (m + 1.0f), z = s * s;
    float p = 1.0f + z * (1.0f / 3 + z * (1.0f / 5 + z * (1.0f / 7 + z * (1.0f / 9))));
    float fe = (float)e;
    return -2.0f * (fe * KE_LN2_HI_F + (2.0f * s * p + fe * KE_LN2_LO_F));
}

/* cos and sin of 2*pi*u for u in [0, 1].  q = round(4u) via the 1.5*2^23
 * magic constant (its low mantissa bits then hold q, giving the quadrant
 * without a float->int conversion); f = u - q/4 is exact and in [-1/8, 1/8],
 * so the polynomial argument is |a| <= pi/4. */
KE_INLINE void ke_sincos2pi_f32(float u, float *c, float *s)
{
    float t = u * 4.0f + 0x1.8p23f;
    uint32_t qi = ke_f32_bits(t);
    float q = t - 0x1.8p23f;
    float a = (u - q * 0.25f) * KE_2PI_F, a2 = a * a;
    float sn = a * (1.0f + a2 * (-1.0f / 6 + a2 * (1.0f / 120 + a2 * (-1.0f / 5040 +
                                                   a2 * (1.0f / 362880)))));
    float cs = 1.0f + a2 * (-0.5f + a2 * (1.0f / 24 + a2 * (-1.0f / 720 +
                                          a2 * (1.0f / 40320 + a2 * (-1.0f / 3628800)))));
    /* Rotate by q quarter turns: (c, s) -> (-s, c) -> (-c, -s) -> (s, -c).
     * Done with bit masks rather than ?: because GCC fails to if-convert
     * the float selects for AVX2 and then leaves the whole loop scalar. */
    uint32_t swap = UINT32_C(0) - (qi & 1);                 /* all ones if odd */
    uint32_t cb = ke_f32_bits(cs), sb = ke_f32_bits(sn);
    uint32_t ccb = (sb & swap) | (cb & ~swap);
    uint32_t ssb = (cb & swap) | (sb & ~swap);
    ccb ^= ((qi ^ (qi >> 1)) & 1) << 31;                    /* q = 1, 2 */
    ssb ^= ((qi >> 1) & 1) << 31;                           /* q = 2, 3 */
    *c = ke_f32_from_bits(ccb);
    *s = ke_f32_from_bits(ssb);
}

KE_INLINE double ke_neg2log_f64(double x)
{
    uint64_t b = ke_f64_bits(x);
    int64_t e = (int64_t)((b + (UINT64_C(0x3ff0000000000000) -
                                UINT64_C(0x3fe6a09e667f3bcd))) >> 52) - 1023;
    double m = ke_f64_from_bits(b - ((uint64_t)e << 52));
    double s = (m - 1.0) / (m + 1.0), z = s * s;
    /* sum_{k=0..10} z^k / (2k+1); the next term is < 0.0295^11 / 23 */
    double p = 1.0 / 21;
    p = 1.0 / 19 + z * p;
    p = 1.0 / 17 + z * p;
    p = 1.0 / 15 + z * p;
    p = 1.0 / 13 + z * p;
    p = 1.0 / 11 + z * p;
    p = 1.0 / 9 + z * p;
    p = 1.0 / 7 + z * p;
    p = 1.0 / 5 + z * p;
    p = 1.0 / 3 + z * p;
    p = 1.0 + z * p;
    double fe = (double)(int32_t)e; /* e in [-53, 0]; int32 converts packed */
    return -2.0 * (fe * KE_LN2_HI + (2.0 * s * p + fe * KE_LN2_LO));
}

/* ln(1 - u) for u a uniform of ke_xf_uniform_f64 over [0, 1): u is a
 * multiple of 2^-53 below 1, so 1 - u is exact, in [2^-53, 1], where
 * ke_neg2log_f64 works, and the halving is exact. multinomial's keys without
 * replacement use it on both devices: libm's log1p (glibc's on the CPU,
 * libdevice's on a GPU) may differ in the last bit and so swap two close
 * keys, this gives the same bits everywhere. */
KE_INLINE double ke_log1m_f64(double u)
{
    return -0.5 * ke_neg2log_f64(1.0 - u);
}

KE_INLINE void ke_sincos2pi_f64(double u, double *c, double *s)
{
    double t = u * 4.0 + 0x1.8p52;
    uint64_t qi = ke_f64_bits(t);
    double q = t - 0x1.8p52;
    double a = (u - q * 0.25) * KE_2PI, a2 = a * a;
    /* Taylor to a^19 (sin) and a^18 (cos), Horner in a2 = a^2 */
    double sp = -1.0 / 121645100408832000.0; /* 1/19! */
    sp = 1.0 / 355687428096000.0 + a2 * sp;  /* 1/17! */
    sp = -1.0 / 1307674368000.0 + a2 * sp;   /* 1/15! */
    sp = 1.0 / 6227020800.0 + a2 * sp;       /* 1/13! */
    sp = -1.0 / 39916800.0 + a2 * sp;        /* 1/11! */
    sp = 1.0 / 362880.0 + a2 * sp;           /* 1/9! */
    sp = -1.0 / 5040.0 + a2 * sp;
    sp = 1.0 / 120.0 + a2 * sp;
    sp = -1.0 / 6.0 + a2 * sp;
    double sn = a + a * (a2 * sp);
    double cp = 1.0 / 6402373705728000.0;    /* 1/18! */
    cp = -1.0 / 20922789888000.0 + a2 * cp;  /* 1/16! */
    cp = 1.0 / 87178291200.0 + a2 * cp;      /* 1/14! */
    cp = -1.0 / 479001600.0 + a2 * cp;       /* 1/12! */
    cp = 1.0 / 3628800.0 + a2 * cp;          /* 1/10! */
    cp = -1.0 / 40320.0 + a2 * cp;           /* 1/8! */
    cp = 1.0 / 720.0 + a2 * cp;
    cp = -1.0 / 24.0 + a2 * cp;
    cp = 0.5 + a2 * cp;
    double cs = 1.0 - a2 * cp;
    uint64_t swap = UINT64_C(0) - (qi & 1); /* see ke_sincos2pi_f32 */
    uint64_t cb = ke_f64_bits(cs), sb = ke_f64_bits(sn);
    uint64_t ccb = (sb & swap) | (cb & ~swap);
    uint64_t ssb = (cb & swap) | (sb & ~swap);
    ccb ^= ((qi ^ (qi >> 1)) & 1) << 63;
    ssb ^= ((qi >> 1) & 1) << 63;
    *c = ke_f64_from_bits(ccb);
    *s = ke_f64_from_bits(ssb);
}

/* sqrt(t) for t in [0, 74] from an rsqrt bit-trick guess (Lomont's
 * constant, <= 3.5% error), Newton steps y <- y (1.5 - t/2 y^2) (each
 * squares the relative error), then r = t*y and one residual correction
 * r += (y/2)(t - r^2).  Max error vs. the correctly rounded sqrt: 1 ulp
 * (exhaustive over the 2^24 f32 inputs; 20M random f64 inputs).  Why not
 * sqrtf(): without -fno-math-errno GCC guards every sqrt call with an errno
 * branch, and a pragma cannot lift that (builtin attributes are fixed from
 * the command line), so the whole normal loop would stay scalar. */
KE_INLINE float ke_sqrt_f32(float t)
{
    /* tiny is absorbed for every t the fill produces (t >= 1.19e-7) and
     * only matters for t == 0, where it keeps y finite (2^50) so the result
     * is exactly 0 instead of 0 * inf = NaN.  Cheaper than a select, which
     * AVX2 code would need if-converted (see ke_sincos2pi_f32). */
    float tt = t + 0x1p-100f;
    float y = ke_f32_from_bits(UINT32_C(0x5f375a86) - (ke_f32_bits(tt) >> 1));
    float h = 0.5f * tt;
    y = y * (1.5f - h * y * y); /* rel. error 1.8e-3 */
    y = y * (1.5f - h * y * y); /* 4.9e-6 */
    float r = t * y;
    return r + (0.5f * y) * (t - r * r); /* ~1e-11: rounding-limited */
}

KE_INLINE double ke_sqrt_f64(double t)
{
    double tt = t + 0x1p-600; /* as above; t >= 2.2e-16 or t == 0 */
    double y = ke_f64_from_bits(UINT64_C(0x5fe6eb50c7b537a9) - (ke_f64_bits(tt) >> 1));
    double h = 0.5 * tt;
    y = y * (1.5 - h * y * y); /* 1.8e-3 */
    y = y * (1.5 - h * y * y); /* 4.9e-6 */
    y = y * (1.5 - h * y * y); /* 3.6e-11 */
    double r = t * y;
    return r + (0.5 * y) * (t - r * r); /* ~1e-21: rounding-limited */
}

/* ---- normal -------------------------------------------------------------- */

/* Box-Muller.  Both uniforms are in (0, 1]: u1 because log(0) = -inf, u2
 * only for symmetry (2*pi*1 is the same angle as 0).  Each (u1, u2) pair
 * yields two independent normals (cos and sin branch), so no random bits
 * are discarded. */
KE_INLINE void ke_xf_normal_f32(const uint32_t l[4], float *out, float mean,
                                float std)
{
#ifndef __CUDACC_RTC__
#pragma GCC unroll 4
#endif
    for (int k = 0; k < 2; k++) {
        float u1 = (float)(int32_t)((l[2 * k] >> 8) + 1) * 0x1p-24f;
        float u2 = (float)(int32_t)((l[2 * k + 1] >> 8) + 1) * 0x1p-24f;
        float r = ke_sqrt_f32(ke_neg2log_f32(u1));
        float c, s;
        ke_sincos2pi_f32(u2, &c, &s);
        out[2 * k] = mean + std * (r * c);
        out[2 * k + 1] = mean + std * (r * s);
    }
}

KE_INLINE void ke_xf_normal_f64(const uint32_t l[4], double *out, double mean,
                                double std)
{
    double u1 = (ke_u53_to_f64(ke_join(l[0], l[1]) >> 11) + 1.0) * 0x1p-53;
    double u2 = (ke_u53_to_f64(ke_join(l[2], l[3]) >> 11) + 1.0) * 0x1p-53;
    double r = ke_sqrt_f64(ke_neg2log_f64(u1));
    double c, s;
    ke_sincos2pi_f64(u2, &c, &s);
    out[0] = mean + std * (r * c);
    out[1] = mean + std * (r * s);
}


/* ---- randint ------------------------------------------------------------- */

/* High 64 bits of a 64x64 product: one MUL with __int128, portable
 * 32-bit-limb version otherwise (same result, so the fallback is exact). */
KE_INLINE uint64_t ke_mulhi64(uint64_t a, uint64_t b)
{
#if defined(__SIZEOF_INT128__) && !defined(__CUDACC_RTC__)
    __extension__ typedef unsigned __int128 ke_u128;
    return (uint64_t)(((ke_u128)a * b) >> 64);
#else
    uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
    uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint64_t mid = (ll >> 32) + (uint32_t)lh + (uint32_t)hl;
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

/* range is computed in uint64 so negative bounds and spans up to 2^64 - 1
 * (e.g. [INT64_MIN, INT64_MAX)) work; low + v wraps back into int64 via
 * unsigned arithmetic (GCC defines the final conversion as modular). */
KE_INLINE void ke_xf_randint(const uint32_t l[4], int64_t *out, uint64_t low,
                                 uint64_t range)
{
#ifndef __CUDACC_RTC__
#pragma GCC unroll 4
#endif
    for (int k = 0; k < 2; k++) {
        uint64_t r = ke_join(l[2 * k], l[2 * k + 1]);
        uint64_t v = ke_mulhi64(r, range);
        out[k] = (int64_t)(low + v);
    }
}


#endif /* KILN_EAGER_PHILOX_XF_H */
