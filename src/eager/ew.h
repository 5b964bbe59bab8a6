/*
 * ew.h — the elementwise engine and the macros that generate per-dtype inner
 * loops from one formula.
 *
 * An elementwise op's row points (impl) at a ke_ew_impl: one inner loop per
 * compute dtype. The engine (ew.c) broadcasts, coalesces dims, converts
 * operands whose dtype or layout does not suit the loop into small buffers,
 * splits the work across the thread pool, and calls the loop on contiguous
 * chunks. So a loop only ever sees contiguous arrays of its compute dtype, or
 * a single broadcast element for inputs whose bit is set in `bcast`.
 */
#ifndef KE_EW_H
#define KE_EW_H

#include "dispatch.h"
#include "ew_gen.h"

/* err codes a loop may raise (first one wins; the engine turns it into an error) */
enum { KE_EW_OK, KE_EW_INT_DIV_ZERO };

typedef void (*ke_ew_loop)(int64_t n, void *out, const void *const *in, unsigned bcast, const ke_attrs *a,
                           int *err);

typedef struct ke_ew_impl {
    ke_ew_loop loop[KL_NUM_DTYPES]; /* by compute dtype; NULL = unsupported */
    unsigned bcast_ok;              /* inputs the loops accept as one broadcast element */
    uint8_t out_bool;               /* loops write bool (uint8) instead of the compute dtype */
    uint8_t bool_in;                /* bit per input the loops read as bool (masks, conditions) */
} ke_ew_impl;

/* Every loop's name, for code generators that compile the same formula for
 * another device (src/codegen_nvrtc: the device function has the loop's
 * name). The loop shells below and the hand-written ones of ew_*.c add an
 * entry with KE_EW_NAME to one linker section, so no list is kept by hand. */
typedef struct ke_ew_loop_name {
    ke_ew_loop loop;
    const char *name; /* "neg_f32" */
    const char *file; /* the source file defining it: "ew_unary.c" */
} ke_ew_loop_name;
#define KE_EW_NAME(fname)                                                                     \
    static const ke_ew_loop_name fname##_kename_                                              \
        __attribute__((used, section("ke_ew_names"), aligned(sizeof(void *)))) = {fname, #fname, \
                                                                                  __FILE__};
/* The entry of loop f (NULL if f is no loop of ew_*.c). */
const ke_ew_loop_name *ke_ew_loop_name_of(ke_ew_loop f);

/* The generic CPU kernel of every KE_KIND_EW row: runs impl's loops. */
int ke_cpu_ew(ke_call *c);
/* Runs impl over c->in -> c->out[0] with the given compute dtype (for kernels
 * of other kinds that reuse the engine). */
int ke_ew_run(ke_call *c, const ke_ew_impl *impl, kl_dtype compute);

/* ---- loop generators ------------------------------------------------------
 * T: compute type; TO: output element type; EXPR uses x (and y, z), attrs `a`
 * and may set *err. Loops are plain for-loops over restrict pointers so GCC
 * vectorizes them. */

#define KE_EW_UNARY(fname, T, TO, EXPR)                                                         \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        TO *restrict o = (TO *)o_;                                                                \
        const T *restrict X = (const T *)in[0];                                                   \
        (void)a;                                                                                  \
        (void)err;                                                                                \
        (void)bc;                                                                                 \
        for (int64_t i = 0; i < n; i++) {                                                         \
            T x = X[i];                                                                           \
            o[i] = (TO)(EXPR);                                                                    \
        }                                                                                         \
    }                                                                                             \
    KE_EW_NAME(fname)

#define KE_EW_BINARY(fname, T, TO, EXPR)                                                        \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        TO *restrict o = (TO *)o_;                                                                \
        const T *restrict A = (const T *)in[0], *restrict B = (const T *)in[1];                   \
        (void)a;                                                                                  \
        (void)err;                                                                                \
        if (bc == 0) {                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                     \
                T x = A[i], y = B[i];                                                             \
                o[i] = (TO)(EXPR);                                                                \
            }                                                                                     \
        } else if (bc == 2) {                                                                     \
            const T y = B[0];                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                     \
                T x = A[i];                                                                       \
                o[i] = (TO)(EXPR);                                                                \
            }                                                                                     \
        } else if (bc == 1) {                                                                     \
            const T x = A[0];                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                     \
                T y = B[i];                                                                       \
                o[i] = (TO)(EXPR);                                                                \
            }                                                                                     \
        } else {                                                                                  \
            const T x = A[0], y = B[0];                                                           \
            const TO v = (TO)(EXPR);                                                              \
            for (int64_t i = 0; i < n; i++) o[i] = v;                                             \
        }                                                                                         \
    }                                                                                             \
    KE_EW_NAME(fname)

/* Ternary loops never see broadcast inputs (bcast_ok = 0): the engine expands them. */
#define KE_EW_TERNARY(fname, T, TO, EXPR)                                                       \
    static void fname(int64_t n, void *o_, const void *const *in, unsigned bc, const ke_attrs *a,   \
                      int *err) {                                                                 \
        TO *restrict o = (TO *)o_;                                                                \
        const T *restrict X = (const T *)in[0], *restrict Y = (const T *)in[1],                   \
                          *restrict Z = (const T *)in[2];                                         \
        (void)a;                                                                                  \
        (void)err;                                                                                \
        (void)bc;                                                                                 \
        for (int64_t i = 0; i < n; i++) {                                                         \
            T x = X[i], y = Y[i], z = Z[i];                                                       \
            o[i] = (TO)(EXPR);                                                                    \
        }                                                                                         \
    }                                                                                             \
    KE_EW_NAME(fname)


#endif /* KE_EW_H */
