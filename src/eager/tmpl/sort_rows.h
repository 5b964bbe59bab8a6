/* tmpl/sort_rows.h — stable sort of the rows of one dtype (sort.c): a
 * template, included once per dtype. Define before including (#undef'd at the
 * end): SO_T the element type, SO_K the key type it compares as, SO_KEY(v)
 * the key of an element, SO_ISNAN(k) and SO_SFX the suffix.
 *
 * Each row is copied as (key, index) pairs and merge-sorted bottom-up: a
 * merge takes the right run's pair only when it is strictly before the left
 * one, so equal keys keep their input order (PyTorch's stable=True), and NaN
 * sorts after every number (NaNs tie). The first j->k pairs are written out;
 * values are copied from the input element itself (NaN payloads and -0 stay). */
#include "tmpl.h"

#define SO_FN(name) KE_TCAT3(name, _, SO_SFX)

typedef struct SO_FN(so_pair) {
    SO_K k;
    int64_t i;
} SO_FN(so_pair);

/* a strictly before b in ascending order */
static inline int SO_FN(so_lt)(SO_K a, SO_K b) { return a < b || (SO_ISNAN(b) && !SO_ISNAN(a)); }

static void SO_FN(sort_rows)(void *ctx, int64_t r0, int64_t r1) {
    sort_job *j = ctx;
    const int64_t n = j->n;
    SO_FN(so_pair) *a = malloc(sizeof *a * (size_t)n * 2);
    if (!a) {
        atomic_store(&j->oom, 1);
        return;
    }
    SO_FN(so_pair) *b = a + n;
    for (int64_t r = r0; r < r1; r++) {
        int64_t xo, oo;
        sort_row_offsets(j, r, &xo, &oo);
        const SO_T *x = (const SO_T *)j->x + xo;
        for (int64_t i = 0; i < n; i++) {
            a[i].k = SO_KEY(x[i * j->xs]);
            a[i].i = i;
        }
        SO_FN(so_pair) *src = a, *dst = b;
        for (int64_t w = 1; w < n; w *= 2) {
            for (int64_t lo = 0; lo < n; lo += 2 * w) {
                int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
                int64_t p = lo, q = mid, o = lo;
                while (p < mid && q < hi) {
                    int right = j->desc ? SO_FN(so_lt)(src[p].k, src[q].k) : SO_FN(so_lt)(src[q].k, src[p].k);
                    dst[o++] = right ? src[q++] : src[p++];
                }
                while (p < mid) dst[o++] = src[p++];
                while (q < hi) dst[o++] = src[q++];
            }
            SO_FN(so_pair) *t = src;
            src = dst;
            dst = t;
        }
        SO_T *v = (SO_T *)j->v + oo;
        int64_t *ix = j->ix + oo;
        for (int64_t t = 0; t < j->k; t++) {
            v[t * j->os] = x[src[t].i * j->xs];
            ix[t * j->os] = src[t].i;
        }
    }
    free(a);
}

#undef SO_FN
#undef SO_T
#undef SO_K
#undef SO_KEY
#undef SO_ISNAN
#undef SO_SFX
