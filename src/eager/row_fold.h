/* row_fold.h — the shape of the row fold, the one order in which Kiln folds a
 * contiguous row of values into one (sum, mean, prod, amax, amin, var, norm...).
 * Eager reductions (reduce_ops.c), softmax / layer_norm / cross-entropy rows
 * (nn.c, loss.c) and the LLVM code generator (cg_emit.c) all fold in this
 * order, so their results are bitwise equal (tests/test_codegen.c,
 * row_fold_bitwise). The fold itself is the template tmpl/row_fold.h; the
 * code generator emits the same steps and calls the cascade functions
 * (ke_rd_kernel's push / drain) of that template from the eager bitcode.
 *
 * A row of n elements:
 *   - is cut into chunks of KE_FOLD_CHUNK elements (the last may be shorter);
 *     a row of at most KE_FOLD_CHUNK elements is one chunk and skips the cascade;
 *   - a chunk folds into a value: L = KE_FOLD_LANES(A) lane accumulators start
 *     at INIT; lane l folds elements l, l + L, l + 2L... of each whole block of
 *     L in order; the lanes merge as a halving tree (l[j] = MERGE(l[j], l[j+w])
 *     for w = L/2 .. 1); the result merges into the value; then the tail (the
 *     elements after the last whole block) folds into it one by one;
 *     a chunk shorter than L is its tail;
 *   - chunk values join a cascade of fan-in KE_FOLD_FAN: level 0 merges up to
 *     FAN chunk values left to right, a full level passes its value up;
 *     at the end the non-empty levels merge into INIT, earliest first.
 * Lanes make the loops vectorize without reassociation (256 bytes of
 * accumulators: enough independent chains to hide the add latency with
 * AVX-512); the chunks and the cascade bound the serial rounding chains of a
 * long row (32 per f32 lane, FAN per cascade level).
 */
#ifndef KE_ROW_FOLD_H
#define KE_ROW_FOLD_H
#include <stdint.h>

#define KE_FOLD_BYTES 256 /* bytes of lane accumulators */
#define KE_FOLD_LANES(A) ((int)(KE_FOLD_BYTES / sizeof(A)))
#define KE_FOLD_CHUNK 2048 /* elements per chunk: 32 per f32 lane; a multiple of every L */
#define KE_FOLD_FAN 8      /* cascade fan-in */
#define KE_FOLD_LEVELS 12  /* cascade depth: above 8^12 chunk values the top level folds serially */
#define KE_FOLD_ACC_MAX 16 /* largest accumulator a cascade holds */

/* The cascade of one row's chunk values (zero-initialized to start). */
typedef struct ke_fold_casc {
    int32_t cnt[KE_FOLD_LEVELS];
    _Alignas(16) unsigned char lv[KE_FOLD_LEVELS][KE_FOLD_ACC_MAX];
} ke_fold_casc;
#endif
