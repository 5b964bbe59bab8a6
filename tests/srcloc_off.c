/*
 * srcloc_off.c — the half of test_srcloc built WITHOUT -DKL_TRACK_SOURCE:
 * its calls carry no location, even right after tracked calls returned.
 */
#include "kiln.h"

#include <stdio.h>

#ifdef kl_add
#error "srcloc_off.c must be compiled without KL_TRACK_SOURCE"
#endif

/* A shape error from an untracked call; its message is copied to buf. */
void kt_untracked_error(char *buf, size_t cap) {
    kl_tensor *a = kl_zeros(1, (const int64_t[]){2}, KL_F32), *b = kl_zeros(1, (const int64_t[]){3}, KL_F32);
    kl_tensor *r = kl_add(a, b);
    snprintf(buf, cap, "%s", r ? "" : kl_last_error());
    kl_clear_error();
}

/* An untracked op, for the profiler test: no "loc" in its event. */
kl_tensor *kt_untracked_neg(kl_tensor *x) { return kl_neg(x); }
