/*
 * philox.h - counter-based random number core for Kiln's eager backend.
 *
 * Why counter-based: with Philox4x32-10 the random bits of element i are a
 * pure function of (seed, offset, i).  There is no sequential state to carry
 * from one element to the next, so a fill can be split across any number of
 * threads, in any chunking, and still produce bit-identical tensors.  It is
 * also the generator cuRAND and PyTorch's CUDA backend use, and since the
 * transforms below are plain IEEE arithmetic a GPU kernel can reproduce
 * these streams bit for bit: the per-element math is philox_xf.h, which the
 * CUDA random kernels (src/codegen_nvrtc/cn_rng.c) compile too.
 *
 * Stream layout (the contract every fill function follows):
 *   key     = { lo32(seed), hi32(seed) }
 *   counter = { lo32(c), hi32(c), 0, 0 }   with c = offset + block index
 *   One Philox call ("block") yields 4 uint32 lanes l[0..3].
 *
 *   kind               elements/block  element i reads
 *   uniform_f32        4               block i/4, lane i%4
 *   normal_f32         4               block i/4, lanes (0,1) for i%4 in {0,1},
 *                                      lanes (2,3) for i%4 in {2,3};
 *                                      even i%4 -> cos branch, odd -> sin
 *   uniform_f64        2               block i/2, lanes 2*(i%2) (high word)
 *                                      and 2*(i%2)+1 (low word)
 *   randint_i64        2               same lanes as uniform_f64
 *   normal_f64         2               block i/2, all 4 lanes;
 *                                      i%2 == 0 -> cos branch, 1 -> sin
 *
 * Fill functions write dst[begin..end) where dst points at element 0 of the
 * whole fill; a parallel-for may hand out arbitrary sub-ranges.
 *
 * Reproducibility: results are bit-identical for any range split / thread
 * count (the scalar edge path and the vectorized body run the same per-block
 * transform), and also across optimization levels, SSE2/AVX2/AVX-512 and
 * GCC/Clang: the fills use no libm (Box-Muller's log/sqrt/sin/cos are
 * in-house, built from IEEE +,-,*,/ only) and philox.c pins fp-contract=off
 * and no-fast-math for itself.  The raw Philox integers (and therefore
 * randint) are exact everywhere.
 */
#ifndef KILN_EAGER_PHILOX_H
#define KILN_EAGER_PHILOX_H

#include <stdint.h>

#ifndef KL_API
#define KL_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Philox4x32-10 block function exactly as defined by Salmon et al., SC'11
 * (and Random123's philox4x32_R with R = 10). */
void ke_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* ---- range fills (see the layout table above) ----------------------------
 * Preconditions (the op layer validates them, these are hot loops):
 *   0 <= begin, and dst is valid for [begin, end); begin >= end is a no-op.
 *   uniform: lo <= hi, both finite, hi - lo finite.  lo == hi fills lo.
 *   normal:  std >= 0.
 *   randint: low < high (high <= low fills low). */

/* Uniform in [lo, hi) from 24 random bits: x = (u >> 8) * 2^-24 in
 * [0, 1 - 2^-24], r = lo + (hi - lo) * x.  Rounding can still land exactly
 * on hi, so the result is clamped to the largest float below hi (which
 * therefore gets a little extra mass; visible only for ranges a few ulps
 * wide, e.g. [1, 1 + 2 ulp) splits 1/4 : 3/4). */
void ke_philox_uniform_f32(uint64_t seed, uint64_t offset, float *dst,
                           int64_t begin, int64_t end, float lo, float hi);

/* Uniform in [lo, hi) from 53 random bits taken from two lanes, clamped
 * below hi like the f32 version. */
void ke_philox_uniform_f64(uint64_t seed, uint64_t offset, double *dst,
                           int64_t begin, int64_t end, double lo, double hi);

/* Normal(mean, std) by Box-Muller.  The radius uniform is in (0, 1] so
 * log() never sees 0.  f32 uses 24-bit uniforms, which bounds |z| at
 * sqrt(2 * 24 * ln 2) ~= 5.77; f64 uses 53-bit uniforms (|z| <= ~8.57). */
void ke_philox_normal_f32(uint64_t seed, uint64_t offset, float *dst,
                          int64_t begin, int64_t end, float mean, float std);
void ke_philox_normal_f64(uint64_t seed, uint64_t offset, double *dst,
                          int64_t begin, int64_t end, double mean, double std);

/* Integers uniform in [low, high) from 64 random bits per element, mapped by
 * Lemire's multiply-shift  floor(r * range / 2^64)  without rejection.  The
 * bias of that map is at most range / 2^64 relative per value (< 2^-32 for
 * range < 2^32, i.e. far below anything a test or model could observe); a
 * rejection loop would make the counter consumption data-dependent, which
 * would break the fixed offset accounting below. */
void ke_philox_randint_i64(uint64_t seed, uint64_t offset, int64_t *dst,
                           int64_t begin, int64_t end, int64_t low, int64_t high);

/* ln(1 - u) for u drawn by ke_philox_uniform_f64 over [0, 1) (philox_xf.h's
 * ke_log1m_f64, the same bits on the CUDA device): multinomial's keys. */
double ke_philox_log1m_f64(double u);

typedef enum {
    KE_PHILOX_UNIFORM_F32 = 0, /* 4 elements per counter */
    KE_PHILOX_UNIFORM_F64 = 1, /* 2 elements per counter */
    KE_PHILOX_NORMAL_F32 = 2,  /* 4 elements per counter */
    KE_PHILOX_NORMAL_F64 = 3,  /* 2 elements per counter */
    KE_PHILOX_RANDINT_I64 = 4  /* 2 elements per counter */
} ke_philox_kind;

/* Number of counter values a fill of numel elements consumes: the generator
 * advances its offset by this much so the next op never reuses a block.
 * numel <= 0 -> 0; an unknown kind is treated conservatively as 1 element
 * per counter. */
uint64_t ke_philox_counters_used(int64_t numel, int kind);

/* ---- generator state ------------------------------------------------------ */

/* PyTorch's default seed (default_rng_seed_val), so a fresh process is
 * deterministic and users coming from PyTorch see a familiar value. */
#define KE_DEFAULT_SEED UINT64_C(67280421310721)

typedef struct {
    uint64_t seed, offset;
} ke_generator;

/* Process-global generator; statically initialised to KE_DEFAULT_SEED,
 * offset 0, so no init call or constructor ordering is involved. */
ke_generator *ke_default_generator(void);

/* Initialise a caller-owned generator (not yet shared, so no locking). */
void ke_generator_init(ke_generator *g, uint64_t seed);

/* Reserve `counters` counter values: returns the offset to pass to the fill
 * and advances g->offset by `counters`, atomically with respect to other
 * reserve/seed calls on any generator (one process-wide mutex; the critical
 * section is a handful of instructions). */
uint64_t ke_generator_reserve(ke_generator *g, uint64_t counters);

/* Same, but also returns the seed read under the same lock.  Ops should use
 * this one: reading g->seed separately could pair a new seed (from a
 * concurrent kl_manual_seed) with an offset reserved under the old one. */
uint64_t ke_generator_reserve_seeded(ke_generator *g, uint64_t counters,
                                     uint64_t *seed_out);

/* Set seed and reset offset to 0 (under the lock). */
void ke_generator_set_seed(ke_generator *g, uint64_t seed);
/* Seed and offset together (under the lock): tracing saves and restores
 * them, so recording a random op does not consume numbers. */
ke_generator ke_generator_get_state(ke_generator *g);
void ke_generator_set_state(ke_generator *g, ke_generator st);
uint64_t ke_generator_get_seed(ke_generator *g);

/* Public API: reseed the default generator (offset reset to 0), and read the
 * seed it is currently using. */
KL_API void kl_manual_seed(uint64_t seed);
KL_API uint64_t kl_initial_seed(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_EAGER_PHILOX_H */
