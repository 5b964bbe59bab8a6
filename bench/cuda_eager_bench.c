/*
 * cuda_eager_bench.c — the host cost of one eager CUDA elementwise call on
 * the emulated device (docs/GPU.md, "What runs on CUDA"): kl_add of two
 * 1-element f32 CUDA tensors, and kl_mul of one by a 0-dim CPU tensor (a C
 * scalar joining a CUDA op), results owned by a scope. For callgrind, never
 * timed (bench/RESULTS.md, "Eager CUDA call cost"):
 *
 *   KL_CUDA_EMULATE=1 valgrind --tool=callgrind --toggle-collect=kb_cuda_block \
 *       build/bench/cuda_eager_bench add 20
 *
 * Each block is kl_scope_begin, KB_PER_BLOCK calls, kl_scope_end; instructions
 * per call = the collected total / (N * KB_PER_BLOCK). The first call of each
 * kind (the module's compile or disk-cache load) runs before counting starts.
 * The count includes the emulated launch (one CUDA thread run as a plain call).
 */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KB_PER_BLOCK 100

__attribute__((noinline)) void kb_cuda_block(kl_tensor *x, kl_tensor *y, int scalar);
__attribute__((noinline)) void kb_cuda_block(kl_tensor *x, kl_tensor *y, int scalar) {
    kl_scope_begin();
    for (int i = 0; i < KB_PER_BLOCK; i++) {
        if (!(scalar ? kl_mul(x, y) : kl_add(x, y))) {
            fprintf(stderr, "cuda_eager_bench: %s\n", kl_last_error());
            exit(1);
        }
    }
    kl_scope_end();
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "add") && strcmp(argv[1], "scalar"))) {
        fprintf(stderr, "usage: cuda_eager_bench add|scalar BLOCKS (KL_CUDA_EMULATE=1, under callgrind)\n");
        return 2;
    }
    const int scalar = !strcmp(argv[1], "scalar");
    kl_manual_seed(0);
    kl_scope_begin();
    kl_tensor *hx = kl_randn(KL_SHAPE(1), KL_F32), *hy = kl_randn(KL_SHAPE(1), KL_F32);
    kl_tensor *x = hx ? kl_retain(kl_to_device(hx, kl_cuda_device(0))) : NULL;
    kl_tensor *y = scalar ? kl_retain(kl_scalar_tensor(2.5, KL_F32))
                          : hy ? kl_retain(kl_to_device(hy, kl_cuda_device(0))) : NULL;
    if (!x || !y) {
        fprintf(stderr, "cuda_eager_bench: %s\n", kl_last_error());
        return 1;
    }
    /* a wrong result would make the count meaningless */
    kl_tensor *r = scalar ? kl_mul(x, y) : kl_add(x, y);
    double want = scalar ? (float)(kl_item(hx) * 2.5) : (float)(kl_item(hx) + kl_item(hy));
    double got = r ? kl_item(r) : 0;
    kl_scope_end();
    if (!r || (float)got != (float)want) {
        fprintf(stderr, "cuda_eager_bench: wrong result %g (want %g): %s\n", got, want, kl_last_error());
        return 1;
    }
    int n = atoi(argv[2]);
    for (int b = 0; b < n; b++) kb_cuda_block(x, y, scalar);
    printf("cuda_eager_bench %s: %d blocks of %d calls\n", argv[1], n, KB_PER_BLOCK);
    kl_release(x);
    kl_release(y);
    return 0;
}
