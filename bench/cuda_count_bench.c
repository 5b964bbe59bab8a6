/*
 * cuda_count_bench.c — what one call of a workload does on a CUDA device,
 * counted rather than timed (so it runs on the emulated device, on any
 * machine): kernel launches, cuBLAS GEMM calls (and how many of them are
 * strided-batched), device-to-device / host-to-device / device-to-host
 * copies, memsets, and the caching allocator's allocations. Eager (each op
 * dispatched) and compiled (kl_compile), after a warm-up call each, so module
 * compiles are not in the numbers. Issue 13: attention on CUDA was 4-6x
 * slower than PyTorch; these counts say where the launches and copies are.
 *
 *     cuda_count_bench [workload [small|medium|large]]   # default: attention small
 *
 * Without a GPU it uses the emulated device (KL_CUDA_EMULATE=1). Never run
 * by meson test (the emulator compiles modules on first use).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/codegen_nvrtc/cuda_api.h"
#include "workloads.h"
#include "kiln.h"
#include "kiln/cuda.h"

#define CUDA0 ((kl_device){KL_CUDA, 0})

static int one(kw_case *c, kl_fn *f, const char *how) {
    kl_cuda_mem_stats m0, m1;
    int64_t n0[KU_N_COUNT], n1[KU_N_COUNT];
    kl_scope_begin();
    if (kw_case_run(c, f, NULL)) return -1; /* warm-up: modules built, cuBLAS handle made */
    kl_scope_end();
    if (kl_cuda_synchronize(0) || kl_cuda_memory_stats(0, &m0)) return -1;
    ku_counts(n0);
    kl_scope_begin();
    int rc = kw_case_run(c, f, NULL);
    kl_scope_end();
    if (rc || kl_cuda_synchronize(0) || kl_cuda_memory_stats(0, &m1)) return -1;
    ku_counts(n1);
    printf("%-8s %s %s: %lld launches, %lld GEMM calls (%lld strided-batched), %lld D2D copies, %lld H2D, %lld D2H, "
           "%lld memsets, %lld allocations\n",
           how, c->def->id, c->size_name, (long long)(n1[KU_N_LAUNCH] - n0[KU_N_LAUNCH]),
           (long long)(n1[KU_N_GEMM] - n0[KU_N_GEMM]), (long long)(n1[KU_N_GEMM_BATCHED] - n0[KU_N_GEMM_BATCHED]),
           (long long)(n1[KU_N_D2D] - n0[KU_N_D2D]), (long long)(n1[KU_N_H2D] - n0[KU_N_H2D]),
           (long long)(n1[KU_N_D2H] - n0[KU_N_D2H]), (long long)(n1[KU_N_MEMSET] - n0[KU_N_MEMSET]),
           (long long)(m1.num_allocs - m0.num_allocs));
    return 0;
}

int main(int argc, char **argv) {
    const char *id = argc > 1 ? argv[1] : "attention";
    int size = argc > 2 ? kw_size_parse(argv[2]) : KW_SMALL;
    /* the device is chosen at the first CUDA call: no driver, the emulator */
    void *drv = getenv("KL_CUDA_EMULATE") ? NULL : dlopen("libcuda.so.1", RTLD_LAZY);
    if (drv) dlclose(drv);
    else if (!getenv("KL_CUDA_EMULATE")) setenv("KL_CUDA_EMULATE", "1", 1);
    if (size < 0 || !kl_cuda_is_available()) {
        fprintf(stderr, "cuda_count_bench: %s\n", size < 0 ? kl_last_error() : kl_cuda_unavailable_reason());
        return 1;
    }
    kw_case *c = kw_case_new_on(id, (kw_size)size, 1, CUDA0);
    if (!c) {
        fprintf(stderr, "cuda_count_bench: %s\n", kl_last_error());
        return 1;
    }
    char name[256] = "?";
    kl_cuda_device_name(0, name, sizeof name);
    printf("device: %s\n", name);
    kl_fn *f = kw_case_compile(c, KL_COMPILE_FUSE);
    if (one(c, NULL, "eager") || !f || one(c, f, "compiled")) {
        fprintf(stderr, "cuda_count_bench: %s\n", kl_last_error());
        return 1;
    }
    kl_fn_release(f);
    kw_case_free(c);
    return 0;
}
