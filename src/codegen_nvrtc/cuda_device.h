/*
 * cuda_device.h — the CUDA device's data movers for eager (cuda_device.c),
 * registered by the composition root: ke_register_device(KL_CUDA, &ku_cuda_device_ops).
 */
#ifndef KILN_CUDA_DEVICE_H
#define KILN_CUDA_DEVICE_H

#include "core.h"

/* Allocation through the caching allocator, copies and fills on the calling
 * thread's current stream (the driver is loaded at the first call). */
extern const ke_device_ops ku_cuda_device_ops;

#endif
