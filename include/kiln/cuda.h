/*
 * kiln/cuda.h — the CUDA runtime's public face: is a GPU there, which one,
 * wait for it, and the caching device allocator's statistics. Included by
 * kiln.h. The driver is found at run time (dlopen of libcuda.so.1), so these
 * work in every build: without a driver they fail cleanly, the error saying
 * why ("CUDA not available: <reason>"). KL_CUDA_EMULATE=1 selects the
 * emulated device, a host stand-in for tests (docs/GPU.md).
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

#include "kiln.h" /* kl_device (kiln.h includes this file after defining it) */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef KL_API
#    define KL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The device value for CUDA device `index` ((kl_device){KL_CUDA, index}), for
 * kl_empty_on, kl_to_device and kl_set_default_device. Checks nothing: a bad
 * index fails at the first use, naming it. */
KL_API kl_device kl_cuda_device(int index);

/* True if a CUDA driver with at least one device was found (loads it on first call; no error recorded). */
KL_API bool kl_cuda_is_available(void);
/* Number of CUDA devices; 0 without CUDA (no error recorded). */
KL_API int kl_cuda_device_count(void);
/* Why CUDA is not available (dlopen's message, cuInit's error), "" if it is. */
KL_API const char *kl_cuda_unavailable_reason(void);
/* Writes device dev's name into buf (NUL-terminated); 0, or -1 and an error. */
KL_API int kl_cuda_device_name(int dev, char *buf, size_t len);
/* Device dev's compute capability as 10*major + minor (90 for sm_90); -1 and an error. */
KL_API int kl_cuda_compute_capability(int dev);
/* Waits until all work queued on device dev has finished; 0, or -1 and an error. */
KL_API int kl_cuda_synchronize(int dev);

/* The caching allocator's counters for one device (all since the process
 * started, peaks since the last kl_cuda_reset_peak_memory_stats). */
typedef struct kl_cuda_mem_stats {
    int64_t allocated_bytes;      /* in blocks handed out now (sizes rounded to 512 B) */
    int64_t reserved_bytes;       /* in segments obtained from the driver (allocated + cached) */
    int64_t peak_allocated_bytes;
    int64_t peak_reserved_bytes;
    int64_t num_allocs;           /* successful allocations */
    int64_t num_frees;
    int64_t cache_hits;           /* allocations served without a cuMemAlloc */
    int64_t num_segments;         /* segments held now */
    int64_t num_device_allocs;    /* cuMemAlloc calls that succeeded */
    int64_t num_device_frees;     /* cuMemFree calls */
    int64_t num_oom_retries;      /* cuMemAlloc out of memory -> cache emptied -> retried */
    int64_t num_ooms;             /* allocations that failed after the retry */
} kl_cuda_mem_stats;

/* Fills *out for device dev; 0, or -1 and an error. */
KL_API int kl_cuda_memory_stats(int dev, kl_cuda_mem_stats *out);
/* Sets the peaks to the current values; 0, or -1 and an error. */
KL_API int kl_cuda_reset_peak_memory_stats(int dev);
/* Returns every cached, unused segment of device dev to the driver (after
 * waiting for the events that guard them); 0, or -1 and an error. */
KL_API int kl_cuda_empty_cache(int dev);

/* TF32 in float32 matmuls (PyTorch's torch.backends.cuda.matmul.allow_tf32):
 * off by default (full f32 products); on lets cuBLAS round f32 inputs to
 * TF32 (10 mantissa bits) on tensor cores, ~8x faster on A100/H100 at ~1e-3
 * relative error. Process-wide; read at every matmul. */
KL_API void kl_cuda_set_allow_tf32(bool allow);
/* Whether TF32 is allowed in float32 matmuls (false unless set). */
KL_API bool kl_cuda_get_allow_tf32(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_H */
