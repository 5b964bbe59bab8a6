/*
 * add1_bench.c — the per-op cost of the eager path: 1-element kl_add of two
 * f32 tensors, result owned by a scope (bench/RESULTS.md, "The gap").
 *
 *   build/bench/add1_bench            timed: ns per call, median [IQR]
 *   build/bench/add1_bench count N    N blocks, untimed, for callgrind:
 *
 *   valgrind --tool=callgrind --toggle-collect=kb_add_block \
 *       build-vg/bench/add1_bench count 200
 *
 * Each block is kl_scope_begin, KB_PER_BLOCK adds, kl_scope_end, so a call's
 * cost includes its share of releasing the result at scope end (which
 * eager_bench's timing of the same op leaves out). Instructions per call =
 * the collected total / (N * KB_PER_BLOCK). The block function is noinline
 * and named so callgrind can count it alone, without start-up.
 */
#include "kiln.h"

#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_PER_BLOCK 1000

__attribute__((noinline)) void kb_add_block(kl_tensor *x, kl_tensor *y);
__attribute__((noinline)) void kb_add_block(kl_tensor *x, kl_tensor *y) {
    kl_scope_begin();
    for (int i = 0; i < KB_PER_BLOCK; i++) kl_add(x, y);
    kl_scope_end();
}

int main(int argc, char **argv) {
    kl_set_num_threads(1);
    kl_manual_seed(0);
    kl_tensor *x = kl_retain(kl_randn(KL_SHAPE(1), KL_F32));
    kl_tensor *y = kl_retain(kl_randn(KL_SHAPE(1), KL_F32));
    if (!x || !y) {
        fprintf(stderr, "add1_bench: %s\n", kl_last_error());
        return 1;
    }
    /* a wrong result would make the count meaningless */
    kl_scope_begin();
    kl_tensor *r = kl_add(x, y);
    double want = kl_item(x) + kl_item(y), got = r ? kl_item(r) : 0;
    kl_scope_end();
    if (!r || (float)got != (float)want) {
        fprintf(stderr, "add1_bench: wrong result %g (want %g): %s\n", got, want, kl_last_error());
        return 1;
    }

    if (argc > 2 && !strcmp(argv[1], "count")) {
        int n = atoi(argv[2]);
        for (int b = 0; b < n; b++) kb_add_block(x, y);
        printf("add1_bench: %d blocks of %d calls\n", n, KB_PER_BLOCK);
    } else {
        enum { MAXR = 20000 };
        static double t[MAXR];
        for (int w = 0; w < 20; w++) kb_add_block(x, y);
        int n = 0;
        double start = kb_now_s();
        while (n < MAXR && (n < 10 || kb_now_s() - start < 1.0)) {
            double s = kb_now_s();
            kb_add_block(x, y);
            t[n++] = (kb_now_s() - s) / KB_PER_BLOCK;
        }
        kb_stats st = kb_summarize(t, n);
        printf("kl_add 1 element, scope end included: %.1f ns per call [%.1f, %.1f] (%d blocks of %d)\n",
               st.median * 1e9, st.q1 * 1e9, st.q3 * 1e9, n, KB_PER_BLOCK);
    }
    kl_release(x);
    kl_release(y);
    return 0;
}
