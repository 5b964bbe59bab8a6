/*
 * test_philox.c - tests for the Philox4x32-10 counter-based RNG core.
 *
 * All statistical checks run on fixed seeds, so they are deterministic; the
 * bounds are still 5 sigma so that changing a seed or the stream layout
 * cannot turn them into flaky tests.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

/* ---- helpers ------------------------------------------------------------- */

/* Small deterministic PRNG for choosing split points (independent of the
 * code under test). */
static uint64_t xs_state = 0x9E3779B97F4A7C15u;
static uint64_t xs_next(void)
{
    uint64_t x = xs_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return xs_state = x;
}
static int64_t xs_range(int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(xs_next() % (uint64_t)(hi - lo + 1));
}

enum { NKINDS = 5 };
static const int kinds[NKINDS] = {KE_PHILOX_UNIFORM_F32, KE_PHILOX_UNIFORM_F64,
                                  KE_PHILOX_NORMAL_F32, KE_PHILOX_NORMAL_F64,
                                  KE_PHILOX_RANDINT_I64};
static size_t elem_size(int kind)
{
    return kind == KE_PHILOX_UNIFORM_F32 || kind == KE_PHILOX_NORMAL_F32 ? 4 : 8;
}
static int64_t per_counter(int kind)
{
    return kind == KE_PHILOX_UNIFORM_F32 || kind == KE_PHILOX_NORMAL_F32 ? 4 : 2;
}

/* One entry point for every fill kind, with fixed non-trivial parameters. */
static void fill(int kind, uint64_t seed, uint64_t off, void *dst, int64_t b,
                 int64_t e)
{
    switch (kind) {
    case KE_PHILOX_UNIFORM_F32:
        ke_philox_uniform_f32(seed, off, dst, b, e, -2.0f, 3.0f);
        break;
    case KE_PHILOX_UNIFORM_F64:
        ke_philox_uniform_f64(seed, off, dst, b, e, -2.0, 3.0);
        break;
    case KE_PHILOX_NORMAL_F32:
        ke_philox_normal_f32(seed, off, dst, b, e, 0.5f, 2.0f);
        break;
    case KE_PHILOX_NORMAL_F64:
        ke_philox_normal_f64(seed, off, dst, b, e, 0.5, 2.0);
        break;
    case KE_PHILOX_RANDINT_I64:
        ke_philox_randint_i64(seed, off, dst, b, e, -1000, 123457);
        break;
    default:
        fail();
    }
}

static void philox_ctr(uint64_t seed, uint64_t c, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ke_philox4x32(ctr, key, out);
}

/* ---- known answers ------------------------------------------------------- */

static void test_kat(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } v[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t t = 0; t < sizeof v / sizeof v[0]; t++) {
        uint32_t out[4];
        ke_philox4x32(v[t].ctr, v[t].key, out);
        for (int k = 0; k < 4; k++)
            assert_int_equal(out[k], v[t].out[k]);
        /* in place (out aliasing ctr) must also work */
        uint32_t io[4];
        memcpy(io, v[t].ctr, sizeof io);
        ke_philox4x32(io, v[t].key, io);
        assert_memory_equal(io, v[t].out, sizeof io);
    }
}

/* The documented stream layout, checked against the raw block function.
 * The offset straddles 2^32 so the counter's high word is exercised. */
static void test_layout(void **state)
{
    (void)state;
    const uint64_t seed = 0x0123456789abcdefu, off = 0xfffffffdu;
    enum { N = 64 };
    float f[N];
    double d[N];
    int64_t q[N];
    ke_philox_uniform_f32(seed, off, f, 0, N, 0.0f, 1.0f);
    ke_philox_uniform_f64(seed, off, d, 0, N, 0.0, 1.0);
    /* range 2^32: multiply-shift gives exactly the high word of the 64 bits */
    ke_philox_randint_i64(seed, off, q, 0, N, 0, INT64_C(1) << 32);
    for (int64_t i = 0; i < N; i++) {
        uint32_t l[4];
        philox_ctr(seed, off + (uint64_t)(i / 4), l);
        assert_true(f[i] == (float)(l[i % 4] >> 8) * 0x1p-24f);
        philox_ctr(seed, off + (uint64_t)(i / 2), l);
        uint64_t m = (((uint64_t)l[2 * (i % 2)] << 32) | l[2 * (i % 2) + 1]) >> 11;
        assert_true(d[i] == (double)m * 0x1p-53);
        assert_int_equal(q[i], (int64_t)l[2 * (i % 2)]);
    }
}

/* ---- range-split invariance ---------------------------------------------- */

static void test_split_invariance(void **state)
{
    (void)state;
    const int64_t n = 1003; /* odd, spans several internal batches */
    const uint64_t seed = 1234567, off = 77;
    for (int kk = 0; kk < NKINDS; kk++) {
        const int kind = kinds[kk];
        const size_t es = elem_size(kind);
        unsigned char *ref = malloc((size_t)n * es);
        /* slack for the shifted-offset check at the end */
        unsigned char *got = malloc((size_t)(n + 64) * es);
        assert_non_null(ref);
        assert_non_null(got);
        fill(kind, seed, off, ref, 0, n);

        for (int trial = 0; trial < 40; trial++) {
            /* random partition into pieces, filled in shuffled order */
            int64_t cuts[1100];
            int ncut = 0;
            int64_t pos = 0;
            cuts[ncut++] = 0;
            const int64_t maxlen = trial % 4 == 0 ? 3 : trial % 4 == 1 ? 17 : 300;
            while (pos < n) {
                pos += xs_range(1, maxlen);
                if (pos > n)
                    pos = n;
                cuts[ncut++] = pos;
            }
            int order[1100];
            for (int p = 0; p < ncut - 1; p++)
                order[p] = p;
            for (int p = ncut - 2; p > 0; p--) {
                int r = (int)xs_range(0, p), t = order[p];
                order[p] = order[r];
                order[r] = t;
            }
            memset(got, 0xAB, (size_t)n * es);
            for (int p = 0; p < ncut - 1; p++)
                fill(kind, seed, off, got, cuts[order[p]], cuts[order[p] + 1]);
            assert_memory_equal(ref, got, (size_t)n * es);
        }

        /* a single odd sub-range touches exactly [b, e) */
        for (int trial = 0; trial < 50; trial++) {
            int64_t b = xs_range(0, n - 1) | 1, e = xs_range(b, n) | 1;
            if (b >= n)
                b = n - 2;
            if (e > n)
                e = n;
            memset(got, 0xCD, (size_t)n * es);
            fill(kind, seed, off, got, b, e);
            for (int64_t i = 0; i < n; i++) {
                if (i >= b && i < e)
                    assert_memory_equal(got + i * es, ref + i * es, es);
                else
                    for (size_t k = 0; k < es; k++)
                        assert_int_equal(got[i * es + k], 0xCD);
            }
        }

        /* empty and reversed ranges write nothing */
        memset(got, 0xEF, (size_t)n * es);
        fill(kind, seed, off, got, 5, 5);
        fill(kind, seed, off, got, 9, 3);
        for (int64_t i = 0; i < n * (int64_t)es; i++)
            assert_int_equal(got[i], 0xEF);

        /* element i depends only on (seed, offset + i / per, i % per): a fill
         * shifted by m counters reproduces the tail of the original */
        const int64_t per = per_counter(kind), m = 5;
        fill(kind, seed, off - (uint64_t)m, got, m * per, m * per + (n - 1));
        assert_memory_equal(got + (size_t)(m * per) * es, ref, (size_t)(n - 1) * es);

        free(ref);
        free(got);
    }
}

/* Different seeds / offsets give different streams. */
static void test_streams_differ(void **state)
{
    (void)state;
    enum { N = 256 };
    for (int kk = 0; kk < NKINDS; kk++) {
        unsigned char a[N * 8], b[N * 8], c[N * 8];
        const size_t es = elem_size(kinds[kk]);
        fill(kinds[kk], 1, 0, a, 0, N);
        fill(kinds[kk], 2, 0, b, 0, N);
        fill(kinds[kk], 1, ke_philox_counters_used(N, kinds[kk]), c, 0, N);
        int same_ab = 0, same_ac = 0;
        for (int i = 0; i < N; i++) {
            same_ab += !memcmp(a + i * es, b + i * es, es);
            same_ac += !memcmp(a + i * es, c + i * es, es);
        }
        /* randint has 124457 values, so a few coincidences are expected */
        assert_true(same_ab < 4);
        assert_true(same_ac < 4);
    }
}

/* ---- uniform ------------------------------------------------------------- */

enum { NSTAT = 1000000 };

static void check_uniform_moments(const double *x, int64_t n, double lo, double hi)
{
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(x[i] >= lo);
        assert_true(x[i] < hi);
        s += x[i];
    }
    const double mean = s / (double)n;
    for (int64_t i = 0; i < n; i++)
        s2 += (x[i] - mean) * (x[i] - mean);
    const double var = s2 / (double)(n - 1);
    const double w = hi - lo, mu = (lo + hi) / 2, sigma2 = w * w / 12;
    /* sd(mean) = sqrt(var/n); sd(var) ~ sqrt((mu4 - sigma^4)/n), mu4 = w^4/80 */
    const double sd_mean = sqrt(sigma2 / (double)n);
    const double sd_var = sqrt((pow(w, 4) / 80 - sigma2 * sigma2) / (double)n);
    assert_true(fabs(mean - mu) < 5 * sd_mean);
    assert_true(fabs(var - sigma2) < 5 * sd_var);
}

static void test_uniform_f32(void **state)
{
    (void)state;
    float *f = malloc(NSTAT * sizeof *f);
    double *x = malloc(NSTAT * sizeof *x);
    assert_non_null(f);
    assert_non_null(x);
    static const float ranges[][2] = {{0.0f, 1.0f}, {-3.0f, 5.0f}, {-1e-3f, 2e-3f}};
    for (int r = 0; r < 3; r++) {
        ke_philox_uniform_f32(42, 1000 * (uint64_t)r, f, 0, NSTAT, ranges[r][0],
                              ranges[r][1]);
        for (int64_t i = 0; i < NSTAT; i++)
            x[i] = f[i];
        check_uniform_moments(x, NSTAT, ranges[r][0], ranges[r][1]);
    }
    /* all 2^24 grid values are reachable in principle; check both ends of
     * [0, 1) are approached: min < 1e-5, max > 1 - 1e-5 over 1M samples */
    ke_philox_uniform_f32(7, 0, f, 0, NSTAT, 0.0f, 1.0f);
    float mn = 1, mx = 0;
    for (int64_t i = 0; i < NSTAT; i++) {
        mn = f[i] < mn ? f[i] : mn;
        mx = f[i] > mx ? f[i] : mx;
    }
    assert_true(mn < 1e-5f);
    assert_true(mx > 1.0f - 1e-5f && mx < 1.0f);
    free(f);
    free(x);
}

static void test_uniform_f64(void **state)
{
    (void)state;
    double *x = malloc(NSTAT * sizeof *x);
    assert_non_null(x);
    ke_philox_uniform_f64(42, 5, x, 0, NSTAT, 0.0, 1.0);
    check_uniform_moments(x, NSTAT, 0.0, 1.0);
    ke_philox_uniform_f64(43, 5, x, 0, NSTAT, -10.0, -2.5);
    check_uniform_moments(x, NSTAT, -10.0, -2.5);
    /* 53-bit resolution: values are not all multiples of 2^-24 */
    int fine = 0;
    ke_philox_uniform_f64(44, 0, x, 0, 1000, 0.0, 1.0);
    for (int i = 0; i < 1000; i++)
        fine += x[i] * 0x1p24 != floor(x[i] * 0x1p24);
    assert_true(fine > 990);
    free(x);
}

/* hi must never be produced, even when lo + (hi - lo) * x rounds up to it. */
static void test_uniform_clamp(void **state)
{
    (void)state;
    enum { N = 4096 };
    float f[N];
    double d[N];
    /* spacing of floats at 2^24 is 2, so [2^24, 2^24 + 2) holds only lo */
    ke_philox_uniform_f32(3, 0, f, 0, N, 0x1p24f, 0x1p24f + 2.0f);
    for (int i = 0; i < N; i++)
        assert_true(f[i] == 0x1p24f);
    /* one-ulp range at 1 */
    ke_philox_uniform_f32(3, 0, f, 0, N, 1.0f, nextafterf(1.0f, 2.0f));
    for (int i = 0; i < N; i++)
        assert_true(f[i] == 1.0f);
    ke_philox_uniform_f64(3, 0, d, 0, N, 0x1p53, 0x1p53 + 2.0);
    for (int i = 0; i < N; i++)
        assert_true(d[i] == 0x1p53);
    ke_philox_uniform_f64(3, 0, d, 0, N, 1.0, nextafter(1.0, 2.0));
    for (int i = 0; i < N; i++)
        assert_true(d[i] == 1.0);
    /* two-ulp range: both values occur, hi never.  Round-to-nearest sends
     * x < 1/4 to lo and the rest to lo+ulp (x >= 3/4 via the clamp), so the
     * split is 1/4 : 3/4 -- the documented cost of clamping on ranges only a
     * few ulps wide. */
    const float lo = 1.0f, hi = nextafterf(nextafterf(1.0f, 2.0f), 2.0f);
    ke_philox_uniform_f32(4, 0, f, 0, N, lo, hi);
    int nlo = 0, nmid = 0;
    for (int i = 0; i < N; i++) {
        assert_true(f[i] >= lo && f[i] < hi);
        nlo += f[i] == lo;
        nmid += f[i] == nextafterf(lo, 2.0f);
    }
    assert_int_equal(nlo + nmid, N);
    assert_true(nlo > N / 8 && nlo < 3 * N / 8);
    /* lo == hi fills lo */
    ke_philox_uniform_f32(5, 0, f, 0, N, -7.5f, -7.5f);
    for (int i = 0; i < N; i++)
        assert_true(f[i] == -7.5f);
    ke_philox_uniform_f64(5, 0, d, 0, N, 2.25, 2.25);
    for (int i = 0; i < N; i++)
        assert_true(d[i] == 2.25);
    /* wide range does not overflow in hi - lo */
    ke_philox_uniform_f32(6, 0, f, 0, N, -3.0e38f, 3.0e38f);
    for (int i = 0; i < N; i++)
        assert_true(isfinite(f[i]) && f[i] >= -3.0e38f && f[i] < 3.0e38f);
}

/* ---- normal -------------------------------------------------------------- */

static void check_normal_moments(const double *x, int64_t n, double zmax)
{
    double s = 0, s2 = 0, amax = 0;
    int64_t beyond3 = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(x[i]));
        s += x[i];
        beyond3 += fabs(x[i]) > 3.0;
        amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
    }
    const double mean = s / (double)n;
    for (int64_t i = 0; i < n; i++)
        s2 += (x[i] - mean) * (x[i] - mean);
    const double var = s2 / (double)(n - 1);
    /* sd(mean) = 1/sqrt(n); sd(var) = sqrt(2/n) for a standard normal */
    assert_true(fabs(mean) < 5 / sqrt((double)n));
    assert_true(fabs(var - 1) < 5 * sqrt(2 / (double)n));
    /* P(|Z| > 3) = erfc(3/sqrt 2) = 0.0026998 */
    const double p3 = erfc(3 / sqrt(2.0));
    const double frac = (double)beyond3 / (double)n;
    assert_true(fabs(frac - p3) < 5 * sqrt(p3 * (1 - p3) / (double)n));
    /* Box-Muller with these uniforms cannot exceed sqrt(-2 ln umin) */
    assert_true(amax <= zmax);
    assert_true(amax > 4.0); /* 1M samples: P(max <= 4) ~ e^-63 */
}

static void test_normal_f32(void **state)
{
    (void)state;
    float *f = malloc(NSTAT * sizeof *f);
    double *x = malloc(NSTAT * sizeof *x);
    assert_non_null(f);
    assert_non_null(x);
    ke_philox_normal_f32(2024, 0, f, 0, NSTAT, 0.0f, 1.0f);
    for (int64_t i = 0; i < NSTAT; i++)
        x[i] = f[i];
    check_normal_moments(x, NSTAT, sqrt(-2 * log(0x1p-24)) * (1 + 1e-6));
    /* cos and sin branches separately (even / odd elements) */
    for (int br = 0; br < 2; br++) {
        double s = 0, s2 = 0;
        for (int64_t i = br; i < NSTAT; i += 2) {
            s += x[i];
            s2 += x[i] * x[i];
        }
        const double h = NSTAT / 2;
        assert_true(fabs(s / h) < 5 / sqrt(h));
        assert_true(fabs(s2 / h - 1) < 5 * sqrt(2 / h) + 5 / h);
    }
    /* mean / std are applied as mean + std * z */
    float g[1024];
    ke_philox_normal_f32(2024, 0, g, 0, 1024, 3.0f, 0.25f);
    for (int i = 0; i < 1024; i++)
        assert_true(fabsf(g[i] - (3.0f + 0.25f * f[i])) <= 1e-6f);
    free(f);
    free(x);
}

static void test_normal_f64(void **state)
{
    (void)state;
    double *x = malloc(NSTAT * sizeof *x);
    assert_non_null(x);
    ke_philox_normal_f64(2025, 3, x, 0, NSTAT, 0.0, 1.0);
    check_normal_moments(x, NSTAT, sqrt(-2 * log(0x1p-53)) * (1 + 1e-12));
    free(x);
}

/* The in-house log/sqrt/sincos must agree with libm evaluated in double on
 * the same Philox lanes (checks the polynomials and the quadrant logic). */
static void test_normal_accuracy(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    const double twopi = 6.283185307179586476925;
    const long double twopiL = 6.283185307179586476925286766559L;
    static float f[N];
    static double d[N];
    const uint64_t seed = 99, off = 12345;
    ke_philox_normal_f32(seed, off, f, 0, N, 0.0f, 1.0f);
    ke_philox_normal_f64(seed, off, d, 0, N, 0.0, 1.0);
    double maxerr32 = 0, maxerr64 = 0;
    for (int64_t i = 0; i < N; i++) {
        uint32_t l[4];
        philox_ctr(seed, off + (uint64_t)(i / 4), l);
        int p = (int)(i % 4) / 2;
        double u1 = ((l[2 * p] >> 8) + 1) * 0x1p-24;
        double u2 = ((l[2 * p + 1] >> 8) + 1) * 0x1p-24;
        double r = sqrt(-2 * log(u1));
        double ref = i % 2 ? r * sin(twopi * u2) : r * cos(twopi * u2);
        /* error relative to the radius: the angle part is absolute */
        double e = fabs(f[i] - ref) / (r > 1 ? r : 1);
        maxerr32 = e > maxerr32 ? e : maxerr32;

        philox_ctr(seed, off + (uint64_t)(i / 2), l);
        /* long double reference: in double, 2*pi*v2 alone is off by up to
         * ~2^-51 absolute, which would dominate the measured error */
        long double v1 = (long double)((((uint64_t)l[0] << 32 | l[1]) >> 11) + 1) * 0x1p-53L;
        long double v2 = (long double)((((uint64_t)l[2] << 32 | l[3]) >> 11) + 1) * 0x1p-53L;
        long double rr = sqrtl(-2 * logl(v1));
        long double ref64 = i % 2 ? rr * sinl(twopiL * v2) : rr * cosl(twopiL * v2);
        double e64 = (double)(fabsl((long double)d[i] - ref64) / (rr > 1 ? rr : 1));
        maxerr64 = e64 > maxerr64 ? e64 : maxerr64;
    }
    print_message("normal max err vs libm: f32 %.3g (%.2f x 2^-24), f64 %.3g (%.2f x 2^-53)\n",
                  maxerr32, maxerr32 / 0x1p-24, maxerr64, maxerr64 / 0x1p-53);
    assert_true(maxerr32 < 6 * 0x1p-24); /* measured 2.66 */
    assert_true(maxerr64 < 6 * 0x1p-53); /* measured 2.94 */
    for (int64_t i = 0; i < N; i++) {
        assert_false(isnan(f[i]));
        assert_false(isnan(d[i]));
    }
}

/* u1 == 1 gives radius 0, the edge case of the in-house sqrt (rsqrt(0) would
 * overflow).  Counter 8418514 under seed 1 has lane 0 = 0xffffff41, i.e.
 * u1 = 1 for f32 elements 0 and 1 of that block (found by search). */
static void test_normal_zero_radius(void **state)
{
    (void)state;
    const uint64_t c = 8418514;
    uint32_t l[4];
    philox_ctr(1, c, l);
    assert_int_equal(l[0] >> 8, 0xffffff);
    float f[4];
    ke_philox_normal_f32(1, c, f, 0, 4, 1.5f, 2.0f);
    assert_true(f[0] == 1.5f);
    assert_true(f[1] == 1.5f);
    assert_true(f[2] != 1.5f && !isnan(f[2]));
    /* also through the batched body (the block in the middle of a fill) */
    float g[400];
    ke_philox_normal_f32(1, c - 50, g, 0, 400, 1.5f, 2.0f);
    assert_true(g[200] == 1.5f && g[201] == 1.5f);
}

/* ---- randint ------------------------------------------------------------- */

static void test_randint(void **state)
{
    (void)state;
    int64_t *q = malloc(NSTAT * sizeof *q);
    assert_non_null(q);

    /* small range with negatives: every value appears, counts within 5 sigma */
    const int64_t lo = -3, hi = 4, k = hi - lo;
    ke_philox_randint_i64(11, 0, q, 0, NSTAT, lo, hi);
    int64_t cnt[7] = {0};
    for (int64_t i = 0; i < NSTAT; i++) {
        assert_true(q[i] >= lo && q[i] < hi);
        cnt[q[i] - lo]++;
    }
    const double pe = 1.0 / (double)k, ex = NSTAT * pe;
    const double sd = sqrt(NSTAT * pe * (1 - pe));
    for (int v = 0; v < k; v++)
        assert_true(fabs((double)cnt[v] - ex) < 5 * sd);

    /* high - low == 1 */
    ke_philox_randint_i64(12, 0, q, 0, 1000, 5, 6);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(q[i], 5);
    ke_philox_randint_i64(12, 0, q, 0, 1000, -10, -9);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(q[i], -10);
    ke_philox_randint_i64(12, 0, q, 0, 1000, INT64_MIN, INT64_MIN + 1);
    for (int i = 0; i < 1000; i++)
        assert_true(q[i] == INT64_MIN);

    /* entirely negative range */
    ke_philox_randint_i64(13, 0, q, 0, 100000, -1000000, -999990);
    int seen[10] = {0};
    for (int i = 0; i < 100000; i++) {
        assert_true(q[i] >= -1000000 && q[i] < -999990);
        seen[q[i] + 1000000] = 1;
    }
    for (int v = 0; v < 10; v++)
        assert_true(seen[v]);

    /* widest range: [INT64_MIN, INT64_MAX) -- in range, both signs, mean ~0 */
    ke_philox_randint_i64(14, 0, q, 0, 100000, INT64_MIN, INT64_MAX);
    int neg = 0;
    for (int i = 0; i < 100000; i++) {
        assert_true(q[i] < INT64_MAX);
        neg += q[i] < 0;
    }
    assert_true(abs(neg - 50000) < 5 * 158); /* sd = sqrt(1e5/4) = 158 */

    /* large range above 2^32: high bits are used */
    ke_philox_randint_i64(15, 0, q, 0, 100000, 0, INT64_C(1) << 40);
    int64_t mx = 0;
    for (int i = 0; i < 100000; i++) {
        assert_true(q[i] >= 0 && q[i] < (INT64_C(1) << 40));
        mx = q[i] > mx ? q[i] : mx;
    }
    assert_true(mx > (INT64_C(1) << 39));

    /* high <= low: documented to fill low */
    ke_philox_randint_i64(16, 0, q, 0, 100, 7, 7);
    for (int i = 0; i < 100; i++)
        assert_int_equal(q[i], 7);
    free(q);
}

/* ---- counters / generator ------------------------------------------------ */

static void test_counters_used(void **state)
{
    (void)state;
    assert_int_equal(ke_philox_counters_used(0, KE_PHILOX_UNIFORM_F32), 0);
    assert_int_equal(ke_philox_counters_used(-5, KE_PHILOX_NORMAL_F64), 0);
    assert_int_equal(ke_philox_counters_used(1, KE_PHILOX_UNIFORM_F32), 1);
    assert_int_equal(ke_philox_counters_used(4, KE_PHILOX_UNIFORM_F32), 1);
    assert_int_equal(ke_philox_counters_used(5, KE_PHILOX_NORMAL_F32), 2);
    assert_int_equal(ke_philox_counters_used(1, KE_PHILOX_UNIFORM_F64), 1);
    assert_int_equal(ke_philox_counters_used(2, KE_PHILOX_NORMAL_F64), 1);
    assert_int_equal(ke_philox_counters_used(3, KE_PHILOX_RANDINT_I64), 2);
    assert_int_equal(ke_philox_counters_used(INT64_MAX, KE_PHILOX_UNIFORM_F32),
                     (UINT64_C(1) << 61));
    assert_int_equal(ke_philox_counters_used(7, 12345), 7); /* unknown kind */

    /* a fill really uses only its counters: element n of a fill of n+1 elems
     * belongs to the next counter iff the count says so */
    for (int kk = 0; kk < NKINDS; kk++) {
        const int kind = kinds[kk];
        const int64_t per = per_counter(kind);
        for (int64_t n = 1; n < 12; n++)
            assert_int_equal(ke_philox_counters_used(n, kind),
                             (uint64_t)((n + per - 1) / per));
    }
}

/* Runs first: the default generator starts at PyTorch's default seed. */
static void test_default_seed(void **state)
{
    (void)state;
    assert_int_equal(kl_initial_seed(), UINT64_C(67280421310721));
    assert_int_equal(ke_default_generator()->seed, UINT64_C(67280421310721));
    assert_int_equal(ke_default_generator()->offset, 0);
}

static void test_reserve(void **state)
{
    (void)state;
    ke_generator g;
    ke_generator_init(&g, 555);
    enum { N = 1001 };
    float a[N], b[N];
    uint64_t s = 0;
    const uint64_t used = ke_philox_counters_used(N, KE_PHILOX_UNIFORM_F32);
    uint64_t o1 = ke_generator_reserve_seeded(&g, used, &s);
    assert_int_equal(o1, 0);
    assert_int_equal(s, 555);
    uint64_t o2 = ke_generator_reserve(&g, used);
    assert_int_equal(o2, used);
    assert_int_equal(g.offset, 2 * used);
    ke_philox_uniform_f32(s, o1, a, 0, N, 0.0f, 1.0f);
    ke_philox_uniform_f32(s, o2, b, 0, N, 0.0f, 1.0f);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += a[i] == b[i];
    assert_true(same < 5);
    /* reserve(0) returns the current offset and does not advance */
    assert_int_equal(ke_generator_reserve(&g, 0), 2 * used);
    assert_int_equal(ke_generator_reserve(&g, 0), 2 * used);
    ke_generator_set_seed(&g, 9);
    assert_int_equal(ke_generator_get_seed(&g), 9);
    assert_int_equal(g.offset, 0);
}

enum { NTHREADS = 4, NRES = 2000 };
typedef struct {
    ke_generator *g;
    uint64_t got[NRES];
} reserve_arg;

static void *reserve_worker(void *p)
{
    reserve_arg *a = p;
    for (int i = 0; i < NRES; i++)
        a->got[i] = ke_generator_reserve(a->g, 3);
    return NULL;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Concurrent reservations hand out disjoint ranges and lose no updates. */
static void test_reserve_threads(void **state)
{
    (void)state;
    ke_generator g;
    ke_generator_init(&g, 1);
    static reserve_arg args[NTHREADS];
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        args[t].g = &g;
        assert_int_equal(pthread_create(&th[t], NULL, reserve_worker, &args[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(g.offset, (uint64_t)NTHREADS * NRES * 3);
    static uint64_t all[NTHREADS * NRES];
    for (int t = 0; t < NTHREADS; t++)
        memcpy(all + t * NRES, args[t].got, sizeof args[t].got);
    qsort(all, NTHREADS * NRES, sizeof all[0], cmp_u64);
    for (int i = 0; i < NTHREADS * NRES; i++)
        assert_int_equal(all[i], (uint64_t)i * 3);
}

/* What an op does: reserve from the default generator, then fill. */
static void op_randn(float *dst, int64_t n)
{
    uint64_t seed;
    uint64_t off = ke_generator_reserve_seeded(
        ke_default_generator(), ke_philox_counters_used(n, KE_PHILOX_NORMAL_F32), &seed);
    ke_philox_normal_f32(seed, off, dst, 0, n, 0.0f, 1.0f);
}

static void test_manual_seed(void **state)
{
    (void)state;
    enum { N = 333 };
    float a1[N], a2[N], b1[N], b2[N], c[N];
    kl_manual_seed(42);
    assert_int_equal(kl_initial_seed(), 42);
    assert_int_equal(ke_default_generator()->offset, 0);
    op_randn(a1, N);
    op_randn(a2, N);
    assert_true(memcmp(a1, a2, sizeof a1) != 0); /* consecutive ops differ */
    kl_manual_seed(42);
    op_randn(b1, N);
    op_randn(b2, N);
    assert_memory_equal(a1, b1, sizeof a1); /* reseeding reproduces */
    assert_memory_equal(a2, b2, sizeof a2);
    kl_manual_seed(43);
    op_randn(c, N);
    assert_true(memcmp(a1, c, sizeof a1) != 0);
    assert_int_equal(kl_initial_seed(), 43);
    kl_manual_seed(KE_DEFAULT_SEED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_seed),
        cmocka_unit_test(test_kat),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_split_invariance),
        cmocka_unit_test(test_streams_differ),
        cmocka_unit_test(test_uniform_f32),
        cmocka_unit_test(test_uniform_f64),
        cmocka_unit_test(test_uniform_clamp),
        cmocka_unit_test(test_normal_f32),
        cmocka_unit_test(test_normal_f64),
        cmocka_unit_test(test_normal_accuracy),
        cmocka_unit_test(test_normal_zero_radius),
        cmocka_unit_test(test_randint),
        cmocka_unit_test(test_counters_used),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_reserve_threads),
        cmocka_unit_test(test_manual_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
