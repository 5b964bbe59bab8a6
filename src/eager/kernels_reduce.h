/* kernels_reduce.h — the types of the reduction engine (reduce.c) and of the
 * reductions' formulas (reduce_ops.c): the ke_rd_<op> impls that the rows of
 * ops_reduce.def name (declared, with the rows' shape rules and kernels, by
 * optable.h). */
#ifndef KE_KERNELS_REDUCE_H
#define KE_KERNELS_REDUCE_H
#include "optable.h"
#include "row_fold.h"

#define KE_RD_ACC_MAX KE_FOLD_ACC_MAX /* largest accumulator: a value and an int64 position */

/* One reduction's formulas expanded for one loop dtype. The engine hands
 * them contiguous arrays of that dtype only. */
typedef struct ke_rd_kernel {
    void (*init)(void *acc, int64_t n);
    /* folds x[0..n), at reduced positions i0.., into acc[0] (row_fold.h's order) */
    void (*row)(void *acc, const void *x, int64_t n, int64_t i0, const void *aux, const ke_attrs *a);
    /* folds rows r < m of x (row r at x + r*xs elements, reduced position
     * i0 + r) into acc[0..n), element j into acc[j]; positions grow from
     * call to call between two inits */
    void (*cols)(void *acc, const void *x, int64_t n, int64_t m, int64_t xs, int64_t i0, const void *aux,
                 const ke_attrs *a);
    /* acc[j] = acc[j] followed by other[j] (other covers later positions) */
    void (*merge)(void *acc, const void *other, int64_t n);
    /* n results from n accumulators: values (dtype vdt) and positions */
    void (*fin)(void *val, int64_t *idx, const void *acc, int64_t n, int64_t count, const void *aux,
                const ke_attrs *a);
    /* the row fold's cascade (row_fold.h): the accumulator *v of the next
     * chunk of a row joins c; acc[0] = merge(acc[0], the cascade's value).
     * row() uses them for rows longer than KE_FOLD_CHUNK, the engine for runs
     * it folds a chunk at a time, compiled kernels for theirs */
    void (*push)(ke_fold_casc *c, const void *v);
    void (*drain)(void *acc, const ke_fold_casc *c);
    uint8_t asize; /* bytes per accumulator */
    uint8_t vdt;   /* dtype of the values fin writes */
} ke_rd_kernel;

/* A reduction op: its kernels by loop dtype and how the engine runs them.
 * `aux` is one value per output from a first pass (var: the mean;
 * logsumexp: the max), in the accumulator type of the second pass. */
typedef struct ke_rd_op {
    const ke_rd_kernel *k[KL_NUM_DTYPES]; /* by loop dtype (F32, F64, I32, I64, U8) */
    const struct ke_rd_op *pre;           /* first pass computing aux, or NULL */
    uint8_t pre_inf_to_zero;              /* logsumexp: an infinite max shifts by 0 instead */
    uint8_t ordered;                      /* positions are reported: keep the reduced dims in order */
    int8_t vout, iout;                    /* output slots of the values and the positions (-1: none) */
} ke_rd_op;

/* The norm's formulas for p (2, 1, 0, inf, -inf and any other). */
const ke_rd_op *ke_rd_norm_op(double p);

#endif
