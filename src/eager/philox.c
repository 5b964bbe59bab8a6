/*
 * philox.c - Philox4x32-10 and the range fills built on it.
 * See philox.h for the stream layout contract.
 */
#include "philox.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* Floating-point semantics for this file, pinned here rather than in the
 * build so the guarantees hold however the file is compiled:
 *  - fp-contract=off: a*b+c must not be fused into an FMA on some targets
 *    and not on others (or in the vectorized body but not in the scalar
 *    edge path), or the same (seed, offset, i) would give different last
 *    bits.  Costs a few % in the polynomials below.
 *  - no-fast-math: the Box-Muller code relies on IEEE rounding, e.g.
 *    (x + 1.5*2^23) - 1.5*2^23 rounds x to an integer; reassociation would
 *    fold it to x and destroy the quadrant reduction.
 * With these, GCC and Clang produce bit-identical streams at -O0..-Ofast
 * and for SSE2/AVX2/AVX-512 (checked).  File scope, so every function has
 * the same options and inlining between them is unaffected.  Clang cannot
 * override -ffast-math / -ffp-contract=fast from inside the file (its
 * "fast" contraction ignores pragmas), hence the #error; do not pass
 * -ffp-contract=fast to Clang for this file either. */
#if defined(__clang__)
#if defined(__FAST_MATH__)
#error "philox.c needs IEEE semantics: compile it without -ffast-math"
#endif
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("no-fast-math", "fp-contract=off")
#endif

/* The per-element transforms must be inlined into the block loop even at
 * -O2 (whose inliner gives up on their size), or nothing vectorizes. */
#define KE_INLINE static inline __attribute__((always_inline))

#include "philox_xf.h"

/* Blocks per batch in the vectorized body.  A batch is always computed and
 * transformed in full (constant trip count, see tmpl/philox_fill.h); a short
 * last batch wastes at most KE_CHUNK-1 block evaluations (~100 ns), noise
 * next to an op's dispatch cost.  Stack: 4 lane arrays of 32 uint32 plus at
 * most a 512-byte output buffer. */
#define KE_CHUNK 32

void ke_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    ke_keysched ks;
    ke_key_schedule(key[0], key[1], &ks);
    uint32_t r[4];
    ke_philox_rounds(&ks, ctr[0], ctr[1], ctr[2], ctr[3], r);
    memcpy(out, r, sizeof r); /* out may alias ctr */
}

/* KE_CHUNK consecutive blocks starting at counter `base`, written
 * structure-of-arrays so the loop over j is a plain SIMD loop (each vector
 * lane is a different counter); the AoS alternative needs gathers. */
KE_INLINE void ke_blocks(const ke_keysched *ks, uint64_t base,
                         uint32_t *restrict L0, uint32_t *restrict L1,
                         uint32_t *restrict L2, uint32_t *restrict L3)
{
    for (int j = 0; j < KE_CHUNK; j++) {
        uint32_t l[4];
        ke_block(ks, base + (uint64_t)j, l);
        L0[j] = l[0];
        L1[j] = l[1];
        L2[j] = l[2];
        L3[j] = l[3];
    }
}

/* The fills' shared driver is the template tmpl/philox_fill.h, included as
 * each fill function's body. */

void ke_philox_uniform_f32(uint64_t seed, uint64_t offset, float *dst,
                           int64_t begin, int64_t end, float lo, float hi)
{
    /* Largest float strictly below hi; for an empty range fall back to lo so
     * the fill is well defined instead of returning values < lo. */
    const float cap = hi > lo ? nextafterf(hi, lo) : lo;
    const double dlo = lo, span = (double)hi - (double)lo;
#define XF(l, out) ke_xf_uniform_f32((l), (out), dlo, span, cap)
#define FD_T float
#define FD_P 4
#define FD_XFORM XF
#include "tmpl/philox_fill.h"
#undef XF
}

void ke_philox_uniform_f64(uint64_t seed, uint64_t offset, double *dst,
                           int64_t begin, int64_t end, double lo, double hi)
{
    const double cap = hi > lo ? nextafter(hi, lo) : lo;
    const double span = hi - lo;
#define XF(l, out) ke_xf_uniform_f64((l), (out), lo, span, cap)
#define FD_T double
#define FD_P 2
#define FD_XFORM XF
#include "tmpl/philox_fill.h"
#undef XF
}

double ke_philox_log1m_f64(double u)
{
    return ke_log1m_f64(u);
}

void ke_philox_normal_f32(uint64_t seed, uint64_t offset, float *dst,
                          int64_t begin, int64_t end, float mean, float std)
{
#define XF(l, out) ke_xf_normal_f32((l), (out), mean, std)
#define FD_T float
#define FD_P 4
#define FD_XFORM XF
#include "tmpl/philox_fill.h"
#undef XF
}

void ke_philox_normal_f64(uint64_t seed, uint64_t offset, double *dst,
                          int64_t begin, int64_t end, double mean, double std)
{
#define XF(l, out) ke_xf_normal_f64((l), (out), mean, std)
#define FD_T double
#define FD_P 2
#define FD_XFORM XF
#include "tmpl/philox_fill.h"
#undef XF
}

void ke_philox_randint_i64(uint64_t seed, uint64_t offset, int64_t *dst,
                           int64_t begin, int64_t end, int64_t low, int64_t high)
{
    /* high <= low gives range 0, i.e. every element = low (see header). */
    const uint64_t range = high > low ? (uint64_t)high - (uint64_t)low : 0;
    const uint64_t ulow = (uint64_t)low;
#define XF(l, out) ke_xf_randint((l), (out), ulow, range)
#define FD_T int64_t
#define FD_P 2
#define FD_XFORM XF
#include "tmpl/philox_fill.h"
#undef XF
}

/* ---- bookkeeping --------------------------------------------------------- */

uint64_t ke_philox_counters_used(int64_t numel, int kind)
{
    if (numel <= 0)
        return 0;
    uint64_t n = (uint64_t)numel, per;
    switch (kind) {
    case KE_PHILOX_UNIFORM_F32:
    case KE_PHILOX_NORMAL_F32:
        per = 4;
        break;
    case KE_PHILOX_UNIFORM_F64:
    case KE_PHILOX_NORMAL_F64:
    case KE_PHILOX_RANDINT_I64:
        per = 2;
        break;
    default:
        per = 1; /* over-reserving is always safe, under-reserving is not */
        break;
    }
    return n / per + (n % per != 0);
}

/* One lock for every generator: seed and offset must change together (a
 * 128-bit CAS is not portable), and contention is negligible because a
 * reservation happens once per op, not per element. */
static pthread_mutex_t ke_gen_lock = PTHREAD_MUTEX_INITIALIZER;
static ke_generator ke_default_gen = {KE_DEFAULT_SEED, 0};

ke_generator *ke_default_generator(void)
{
    return &ke_default_gen;
}

void ke_generator_init(ke_generator *g, uint64_t seed)
{
    g->seed = seed;
    g->offset = 0;
}

uint64_t ke_generator_reserve_seeded(ke_generator *g, uint64_t counters,
                                     uint64_t *seed_out)
{
    pthread_mutex_lock(&ke_gen_lock);
    uint64_t off = g->offset;
    /* Wraps after 2^64 counters, i.e. never in practice. */
    g->offset = off + counters;
    if (seed_out)
        *seed_out = g->seed;
    pthread_mutex_unlock(&ke_gen_lock);
    return off;
}

uint64_t ke_generator_reserve(ke_generator *g, uint64_t counters)
{
    return ke_generator_reserve_seeded(g, counters, NULL);
}

void ke_generator_set_seed(ke_generator *g, uint64_t seed)
{
    pthread_mutex_lock(&ke_gen_lock);
    g->seed = seed;
    g->offset = 0;
    pthread_mutex_unlock(&ke_gen_lock);
}

uint64_t ke_generator_get_seed(ke_generator *g)
{
    pthread_mutex_lock(&ke_gen_lock);
    uint64_t s = g->seed;
    pthread_mutex_unlock(&ke_gen_lock);
    return s;
}

ke_generator ke_generator_get_state(ke_generator *g)
{
    pthread_mutex_lock(&ke_gen_lock);
    ke_generator st = *g;
    pthread_mutex_unlock(&ke_gen_lock);
    return st;
}

void ke_generator_set_state(ke_generator *g, ke_generator st)
{
    pthread_mutex_lock(&ke_gen_lock);
    *g = st;
    pthread_mutex_unlock(&ke_gen_lock);
}

KL_API void kl_manual_seed(uint64_t seed)
{
    ke_generator_set_seed(&ke_default_gen, seed);
}

KL_API uint64_t kl_initial_seed(void)
{
    return ke_generator_get_seed(&ke_default_gen);
}
