/*
 * cuda_harness.h — what the CUDA suites share: whether the device in use is
 * the emulated one, and skipping (with the reason) a test that needs a
 * device, or the emulator's knobs (capacity, held streams, poisoning).
 * Include after harness.h; the including file defines `OP`, the op name its
 * driver calls are made under.
 */
#ifndef KT_CUDA_HARNESS_H
#define KT_CUDA_HARNESS_H

#include "../src/codegen_nvrtc/cuda_api.h"

static inline int kt_cuda_emulated(const char *op) {
    const ku_driver *d = kl_cuda_is_available() ? ku_driver_get(op) : NULL;
    return d && d->emulated;
}

#define NEED_CUDA()                                                                             \
    do {                                                                                        \
        if (!kl_cuda_is_available()) {                                                          \
            print_message("skipped: CUDA not available: %s\n", kl_cuda_unavailable_reason()); \
            skip();                                                                             \
        }                                                                                       \
    } while (0)
#define NEED_EMULATOR()                                                                       \
    do {                                                                                      \
        NEED_CUDA();                                                                          \
        if (!kt_cuda_emulated(OP)) {                                                          \
            print_message("skipped: needs the emulated device's knobs (KL_CUDA_EMULATE=1)\n"); \
            skip();                                                                           \
        }                                                                                     \
    } while (0)

#endif
