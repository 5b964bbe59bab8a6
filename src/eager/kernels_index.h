/* kernels_index.h — the strided-copy machinery join.c and index.c share
 * (what the rows of ops_index.def name is declared by optable.h): every op
 * of the family only moves elements, so one row walker over element offsets
 * and one copy routine generic over element size serve them all. */
#ifndef KE_KERNELS_INDEX_H
#define KE_KERNELS_INDEX_H
#include "optable.h"

/* ---- the row walker (join.c) ----
 * An n-d iteration space (up to 16 dims: repeat views each dim as two) over
 * up to 2 operands with element strides. The callback gets runs of
 * consecutive positions along the last dim: coord[] is the position of the
 * run's first element, off[k] operand k's element offset there, n the run
 * length. */
#define KE_ROWS_MAXD (2 * KL_MAX_DIMS)
#define KE_ROWS_MAXOPS 2
#define KE_ROWS_GRAIN 32768 /* elements per thread chunk, as the ew engine */

typedef struct ke_rows {
    int nd; /* >= 1 */
    int nops;
    int64_t shape[KE_ROWS_MAXD];
    int64_t stride[KE_ROWS_MAXOPS][KE_ROWS_MAXD];
} ke_rows;

typedef void (*ke_row_fn)(void *ctx, const int64_t *coord, const int64_t *off, int64_t n);

/* Runs fn over the whole space, split across the pool above `grain` elements. */
void ke_rows_run(const ke_rows *r, int64_t grain, ke_row_fn fn, void *ctx);

/* Element moves by size: BODY runs with T an unsigned type of es bytes that
 * may alias any element type (every dtype is 1, 2, 4 or 8 bytes). */
typedef uint16_t __attribute__((may_alias)) ke_m16;
typedef uint32_t __attribute__((may_alias)) ke_m32;
typedef uint64_t __attribute__((may_alias)) ke_m64;
#define KE_BY_SIZE(es, ...)                                                                                    \
    switch (es) {                                                                                              \
    case 1: { typedef uint8_t T; __VA_ARGS__ } break;                                                          \
    case 2: { typedef ke_m16 T; __VA_ARGS__ } break;                                                           \
    case 4: { typedef ke_m32 T; __VA_ARGS__ } break;                                                           \
    default: { typedef ke_m64 T; __VA_ARGS__ } break;                                                          \
    }

/* dst[i] = src[i] over an n-d shape (strides in elements; 0 broadcasts),
 * converting dtype when st != dt. Same-dtype runs move bytes (memcpy where
 * both are contiguous). */
void ke_copy_nd(int nd, const int64_t *shape, char *dst, kl_dtype dt, const int64_t *dstride, const char *src,
                kl_dtype st, const int64_t *sstride);

/* pad's non-constant modes (reflect 1, replicate 2, circular 3: kl_pad_mode's
 * values): the source index along a padded dim of size s for output index i,
 * pads (l, r) (negative: cropped); circular wraps around the cropped core,
 * as torch 1.13's _pad_circular. One definition for join.c and the CUDA
 * kernel (cn_join.c pastes its text, with Q the device qualifiers); the
 * derivative (src/autograd/d_shape.c) writes the same map with kl_ ops. */
#define KE_PAD_SOURCE_DEF(Q)                                                                           \
    Q long long ke_pad_source(int mode, long long i, long long s, long long l, long long r) {          \
        long long j = i - l;                                                                           \
        if (mode == 1) {                                                                               \
            if (j < 0) j = -j;                                                                         \
            return j >= s ? 2 * (s - 1) - j : j;                                                       \
        }                                                                                              \
        if (mode == 2) return j < 0 ? 0 : j >= s ? s - 1 : j;                                          \
        const long long cl = l < 0 ? -l : 0, core = s - cl - (r < 0 ? -r : 0);                         \
        j = (i - (l > 0 ? l : 0)) % core;                                                              \
        return cl + (j < 0 ? j + core : j);                                                            \
    }
KE_PAD_SOURCE_DEF(static inline)
/* The (before, after) pads of dim d of an ndim-dim input under pad's
 * attributes (0 for dims the list does not reach: F.pad lists the last dim
 * first). */
void ke_pad_pads(const struct ke_call *c, int ndim, int d, int64_t *l, int64_t *r);

/* The errors of bad index values, one wording on every device (the CUDA
 * kernels read the first bad position back and raise them too): KL_ERR_INDEX
 * naming op, the value, the dim and its size (index.c); one_hot's class value
 * outside [0, nc) (reorder.c). Both return -1. */
int ke_index_range_error(const char *op, int64_t v, int dim, int64_t size);
int ke_one_hot_range_error(const char *op, int64_t v, int64_t nc);
/* The op gather's messages name: gather, or take_along_dim, which runs as
 * gather (its attribute caller) (index.c). */
struct ke_call;
const char *ke_gather_name(const struct ke_call *c);
/* The value an element scatter_reduce reduces without itself (include_self
 * false) starts from, as one element of dt written into buf (8 bytes): the
 * reduction's identity (PyTorch's; lowest / highest for integer amax / amin).
 * reduce is a kl_scatter_reduction (index.c). */
void ke_scatter_identity(int reduce, kl_dtype dt, char *buf);

#endif
