/*
 * bench_util.h — timing helpers shared by the bench programs: a monotonic
 * clock and the median / quartiles of a set of timings.
 */
#ifndef KB_BENCH_UTIL_H
#define KB_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double kb_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct kb_stats {
    double median, q1, q3;
} kb_stats;

static inline int kb_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts t[0..n) and returns its median and quartiles. */
static inline kb_stats kb_summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof t[0], kb_cmp_double);
    return (kb_stats){t[n / 2], t[n / 4], t[(3 * n) / 4]};
}

#endif /* KB_BENCH_UTIL_H */
