/*
 * kiln_cuda.h — the prelude of every CUDA C program Kiln generates or writes
 * by hand (`#include "kiln_cuda.h"` first). One source text then compiles
 * both with NVRTC for a GPU and with the host C++ compiler for the emulated
 * device (KL_CUDA_EMULATE=1, which defines KL_EMU). Served from memory to
 * NVRTC (nvrtc.c); written next to the emulator's objects for the host
 * compiler (cuda_emu_module.c). Keep to this vocabulary:
 *
 *   threadIdx blockIdx blockDim gridDim (.x .y .z), warpSize
 *   __global__ __device__ __host__ __forceinline__ __restrict__
 *   __syncthreads() __syncwarp(mask)
 *   __shfl_sync __shfl_up_sync __shfl_down_sync __shfl_xor_sync
 *       (float, double, int, unsigned, long long, unsigned long long)
 *   __ballot_sync __all_sync __any_sync
 *   atomicAdd (float, double, int, unsigned, unsigned long long)
 *   atomicMax atomicMin (int, unsigned, long long, unsigned long long)
 *   atomicCAS (int, unsigned, unsigned long long) atomicExch (int, unsigned, float)
 *   static `__shared__ T a[N];` in a kernel; dynamic shared memory as
 *       KL_DYN_SHARED(T, name);   (a T * over the launch's shmem bytes)
 *   __int_as_float __float_as_int __uint_as_float __float_as_uint
 *   __longlong_as_double __double_as_longlong
 *   fmaf fma sqrtf expf ... (NVRTC's built-in math = the host's libm)
 *   <stdint.h> types; "vmath.h" may be included after this header.
 *
 * Every kernel is `extern "C" __global__ void name(...)` followed by
 * KL_EMU_EXPORT(name) — or KL_EMU_EXPORT_SYNC(name) when it calls
 * __syncthreads, __syncwarp or a warp-wide operation: the emulator runs the
 * threads of such a block as fibers; the others as plain calls, one thread
 * after another (and fails the launch if one synchronizes after all). Both
 * expand to nothing on NVRTC. f16/bf16 are uint16_t with Kiln's own bit code:
 * no __half here.
 */
#ifndef KILN_CUDA_H
#define KILN_CUDA_H

/* ---- The emulator ABI: shared by the host-compiled module and the
 * emulated driver (cuda_emu_module.c includes this part alone). ------------- */
#if defined(KL_EMU) || defined(KL_EMU_ABI_ONLY)
#define KL_EMU_ABI 1 /* bumped when a struct below changes */
enum { KL_EMU_SHFL_IDX, KL_EMU_SHFL_UP, KL_EMU_SHFL_DOWN, KL_EMU_SHFL_XOR, KL_EMU_BALLOT, KL_EMU_SYNCWARP };
typedef struct kl_emu_dim3 {
    unsigned x, y, z;
} kl_emu_dim3;
/* One CUDA thread as the kernel sees it: a fiber's own copy (synchronizing
 * kernels) or the one slot a plain block reuses for each thread in turn. */
typedef struct kl_emu_thread {
    kl_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
    void *dyn_shared;                             /* the launch's dynamic shared memory (16-byte aligned) */
    void *rt;                                     /* the emulated driver's state for this thread */
    void (*barrier)(struct kl_emu_thread *t);     /* __syncthreads: returns when the whole block is there */
    unsigned long long (*warp)(struct kl_emu_thread *t, int kind, unsigned mask, unsigned long long v, int arg,
                               int width);        /* a warp-wide operation (KL_EMU_SHFL_... ) */
    void (*trap)(struct kl_emu_thread *t, const char *why); /* ends the launch with an error; does not return */
} kl_emu_thread;
/* What KL_EMU_EXPORT(name) publishes as `kl_emu_kernel_<name>`. */
typedef struct kl_emu_kernel {
    int abi;     /* KL_EMU_ABI */
    int sync;    /* 1: KL_EMU_EXPORT_SYNC (run as fibers) */
    int nparams; /* the kernel's parameter count */
    /* Runs the kernel with t as this host thread's current CUDA thread:
     * once (all == 0), or for every thread of t's block in order, x fastest,
     * rewriting t->threadIdx (all == 1). args[i] points at parameter i. */
    void (*run)(kl_emu_thread *t, void **args, int all);
} kl_emu_kernel;
#endif

#if defined(KL_EMU)
/* ---- The emulated device: the host C++ compiler ------------------------- */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The CUDA thread running now on this host thread (fibers switch it). */
static thread_local kl_emu_thread *kl_emu_cur;

#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
/* Per host thread, so concurrent launches from two host threads do not
 * share a block's memory; the fibers of one block run on one host thread. */
#define __shared__ static thread_local
#define KL_DYN_SHARED(T, name) T *name = reinterpret_cast<T *>(kl_emu_cur->dyn_shared)

/* A switch point saves and restores the current thread: other fibers of the
 * block run (and set kl_emu_cur) before the call returns. */
static inline void __syncthreads(void) {
    kl_emu_thread *me = kl_emu_cur;
    me->barrier(me);
    kl_emu_cur = me;
}
static inline unsigned long long kl_emu_warp_(int kind, unsigned mask, unsigned long long v, int arg, int width) {
    kl_emu_thread *me = kl_emu_cur;
    unsigned long long r = me->warp(me, kind, mask, v, arg, width);
    kl_emu_cur = me;
    return r;
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { kl_emu_warp_(KL_EMU_SYNCWARP, mask, 0, 0, 32); }
static inline void __trap(void) { kl_emu_cur->trap(kl_emu_cur, "__trap() called"); }

template <class T> static inline unsigned long long kl_emu_bits_(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T kl_emu_from_bits_(unsigned long long b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return kl_emu_from_bits_<T>(kl_emu_warp_(KL_EMU_SHFL_IDX, mask, kl_emu_bits_(v), src, width));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return kl_emu_from_bits_<T>(kl_emu_warp_(KL_EMU_SHFL_UP, mask, kl_emu_bits_(v), (int)delta, width));
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return kl_emu_from_bits_<T>(kl_emu_warp_(KL_EMU_SHFL_DOWN, mask, kl_emu_bits_(v), (int)delta, width));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return kl_emu_from_bits_<T>(kl_emu_warp_(KL_EMU_SHFL_XOR, mask, kl_emu_bits_(v), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)kl_emu_warp_(KL_EMU_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == __ballot_sync(mask, 1); }
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }

/* Bit casts. */
static inline float __int_as_float(int i) { return kl_emu_from_bits_<float>((unsigned)i); }
static inline float __uint_as_float(unsigned i) { return kl_emu_from_bits_<float>(i); }
static inline int __float_as_int(float f) { return (int)(unsigned)kl_emu_bits_(f); }
static inline unsigned __float_as_uint(float f) { return (unsigned)kl_emu_bits_(f); }
static inline double __longlong_as_double(long long i) { return kl_emu_from_bits_<double>((unsigned long long)i); }
static inline long long __double_as_longlong(double d) { return (long long)kl_emu_bits_(d); }

/* Atomics: device-wide, so real host atomics (two host threads may launch
 * on the same memory at once). Each returns the old value, as CUDA's. */
#define KL_EMU_ATOMIC_INT_(T)                                                                       \
    static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }     \
    static inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }     \
    static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicCAS(T *p, T cmp, T v) {                                                  \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);         \
        return cmp;                                                                                 \
    }                                                                                               \
    static inline T atomicMax(T *p, T v) {                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                               \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                           \
        return old;                                                                                 \
    }                                                                                               \
    static inline T atomicMin(T *p, T v) {                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                               \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
        }                                                                                           \
        return old;                                                                                 \
    }
KL_EMU_ATOMIC_INT_(int)
KL_EMU_ATOMIC_INT_(unsigned)
KL_EMU_ATOMIC_INT_(long long)
KL_EMU_ATOMIC_INT_(unsigned long long)
#undef KL_EMU_ATOMIC_INT_
/* Floating-point add and exchange: a compare-and-swap loop on the bits. */
template <class T, class U> static inline T kl_emu_atomic_fadd_(T *p, T v) {
    U *q = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(q, __ATOMIC_RELAXED), nw;
    do {
        nw = kl_emu_bits_(kl_emu_from_bits_<T>(old) + v);
    } while (!__atomic_compare_exchange_n(q, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return kl_emu_from_bits_<T>(old);
}
static inline float atomicAdd(float *p, float v) { return kl_emu_atomic_fadd_<float, unsigned>(p, v); }
static inline double atomicAdd(double *p, double v) { return kl_emu_atomic_fadd_<double, unsigned long long>(p, v); }
static inline float atomicExch(float *p, float v) {
    return __uint_as_float(__atomic_exchange_n(reinterpret_cast<unsigned *>(p), __float_as_uint(v), __ATOMIC_RELAXED));
}

/* KL_EMU_EXPORT(name): the descriptor the emulated cuModuleGetFunction finds,
 * with a caller that unpacks cuLaunchKernel's parameter array by the
 * kernel's own parameter types. */
template <unsigned... I> struct kl_emu_seq_ {};
template <unsigned N, unsigned... I> struct kl_emu_mkseq_ : kl_emu_mkseq_<N - 1, N - 1, I...> {};
template <unsigned... I> struct kl_emu_mkseq_<0, I...> { typedef kl_emu_seq_<I...> type; };
template <class... A, unsigned... I>
static inline void kl_emu_call_(void (*f)(A...), void **args, kl_emu_seq_<I...>) {
    (void)args;
    f(*static_cast<A *>(args[I])...);
}
template <class... A> static inline void kl_emu_run_(void (*f)(A...), kl_emu_thread *t, void **args, int all) {
    typedef typename kl_emu_mkseq_<sizeof...(A)>::type seq;
    kl_emu_cur = t;
    if (!all) {
        kl_emu_call_(f, args, seq());
        return;
    }
    for (unsigned z = 0; z < t->blockDim.z; z++)
        for (unsigned y = 0; y < t->blockDim.y; y++)
            for (unsigned x = 0; x < t->blockDim.x; x++) {
                t->threadIdx.x = x;
                t->threadIdx.y = y;
                t->threadIdx.z = z;
                kl_emu_call_(f, args, seq());
            }
}
template <class... A> static constexpr int kl_emu_nparams_(void (*)(A...)) { return (int)sizeof...(A); }
#define KL_EMU_EXPORT_(name, s)                                                                              \
    static void kl_emu_run_##name(kl_emu_thread *t, void **args, int all) { kl_emu_run_(name, t, args, all); } \
    extern "C" __attribute__((visibility("default"))) const kl_emu_kernel kl_emu_kernel_##name = {            \
        KL_EMU_ABI, s, kl_emu_nparams_(name), kl_emu_run_##name};
#define KL_EMU_EXPORT(name) KL_EMU_EXPORT_(name, 0)
#define KL_EMU_EXPORT_SYNC(name) KL_EMU_EXPORT_(name, 1)

/* Last: the names would otherwise rewrite the struct members above. */
#define threadIdx (kl_emu_cur->threadIdx)
#define blockIdx (kl_emu_cur->blockIdx)
#define blockDim (kl_emu_cur->blockDim)
#define gridDim (kl_emu_cur->gridDim)

#elif defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* ---- NVRTC: CUDA itself, plus Kiln's two spellings ---------------------- */
#include <stdint.h>
#define KL_DYN_SHARED(T, name)                                  \
    extern __shared__ __align__(16) unsigned char kl_dyn_shared_[]; \
    T *name = reinterpret_cast<T *>(kl_dyn_shared_)
#define KL_EMU_EXPORT(name)
#define KL_EMU_EXPORT_SYNC(name)
#endif

#endif
