/*
 * cuda_api.h — Kiln's CUDA runtime (prefix ku_): the driver API as a table of
 * function pointers filled by dlopen("libcuda.so.1") or by the emulated
 * driver (KL_CUDA_EMULATE=1), the caching device allocator, per-thread
 * streams, NVRTC and cuBLAS loaded at first use. No toolkit header is needed:
 * the few types and enum values below are the driver's ABI, declared here.
 * Every ku_ function that can fail records a Kiln error naming the op and
 * the failing CUDA call (see docs/GPU.md).
 */
#ifndef KILN_CUDA_API_H
#define KILN_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

/* ---- Driver ABI (values as in cuda.h of CUDA 12/13) ------------------ */
typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};

enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_DISABLE_TIMING = 2 };
enum { CU_MEMHOSTALLOC_PORTABLE = 1 };

/* X(name, symbol, return, params): the driver entry points Kiln calls. The
 * symbol is the versioned one cuda.h's macros would pick (legacy default
 * stream semantics, not _ptsz). */
#define KU_DRIVER_FUNCS(X)                                                                          \
    X(Init, "cuInit", (unsigned flags))                                                             \
    X(DriverGetVersion, "cuDriverGetVersion", (int *version))                                       \
    X(DeviceGetCount, "cuDeviceGetCount", (int *count))                                             \
    X(DeviceGet, "cuDeviceGet", (CUdevice * dev, int ordinal))                                      \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *value, int attrib, CUdevice dev))           \
    X(DeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice dev))                        \
    X(DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t * bytes, CUdevice dev))                        \
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * ctx, CUdevice dev))          \
    X(CtxSetCurrent, "cuCtxSetCurrent", (CUcontext ctx))                                            \
    X(CtxSynchronize, "cuCtxSynchronize", (void))                                                   \
    X(MemAlloc, "cuMemAlloc_v2", (CUdeviceptr * dptr, size_t bytes))                                \
    X(MemFree, "cuMemFree_v2", (CUdeviceptr dptr))                                                  \
    X(MemGetInfo, "cuMemGetInfo_v2", (size_t * free_bytes, size_t * total_bytes))                   \
    X(MemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void *src, size_t n))                  \
    X(MemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, CUdeviceptr src, size_t n))                        \
    X(MemcpyDtoD, "cuMemcpyDtoD_v2", (CUdeviceptr dst, CUdeviceptr src, size_t n))                  \
    X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr dst, const void *src, size_t n, CUstream s)) \
    X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *dst, CUdeviceptr src, size_t n, CUstream s))  \
    X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)) \
    X(MemsetD8, "cuMemsetD8_v2", (CUdeviceptr dst, unsigned char v, size_t n))                      \
    X(MemsetD8Async, "cuMemsetD8Async", (CUdeviceptr dst, unsigned char v, size_t n, CUstream s))   \
    X(MemHostAlloc, "cuMemHostAlloc", (void **p, size_t bytes, unsigned flags))                     \
    X(MemFreeHost, "cuMemFreeHost", (void *p))                                                      \
    X(StreamCreate, "cuStreamCreate", (CUstream * s, unsigned flags))                               \
    X(StreamDestroy, "cuStreamDestroy_v2", (CUstream s))                                            \
    X(StreamSynchronize, "cuStreamSynchronize", (CUstream s))                                       \
    X(StreamQuery, "cuStreamQuery", (CUstream s))                                                   \
    X(StreamWaitEvent, "cuStreamWaitEvent", (CUstream s, CUevent e, unsigned flags))                \
    X(EventCreate, "cuEventCreate", (CUevent * e, unsigned flags))                                  \
    X(EventRecord, "cuEventRecord", (CUevent e, CUstream s))                                        \
    X(EventQuery, "cuEventQuery", (CUevent e))                                                      \
    X(EventSynchronize, "cuEventSynchronize", (CUevent e))                                          \
    X(EventElapsedTime, "cuEventElapsedTime_v2", (float *ms, CUevent start, CUevent end))           \
    X(EventDestroy, "cuEventDestroy_v2", (CUevent e))                                               \
    X(ModuleLoadData, "cuModuleLoadData", (CUmodule * m, const void *image))                        \
    X(ModuleGetFunction, "cuModuleGetFunction", (CUfunction * f, CUmodule m, const char *name))     \
    X(ModuleUnload, "cuModuleUnload", (CUmodule m))                                                 \
    X(LaunchKernel, "cuLaunchKernel",                                                               \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
       unsigned shmem, CUstream s, void **params, void **extra))                                    \
    X(GetErrorName, "cuGetErrorName", (CUresult r, const char **name))                              \
    X(GetErrorString, "cuGetErrorString", (CUresult r, const char **str))

typedef struct ku_driver {
#define KU_FIELD_(name, sym, params) CUresult (*name) params;
    KU_DRIVER_FUNCS(KU_FIELD_)
#undef KU_FIELD_
    int emulated; /* 1: the host stand-in of cuda_emu.c */
} ku_driver;

/* ---- Driver table and devices (cuda_api.c) --------------------------- */
#define KU_MAX_DEVICES 64 /* devices past this index are not used */
/* The process's driver table, loaded and cuInit'ed at the first call; NULL
 * with "CUDA not available: <reason>" recorded (as kl_<op>) when there is none. */
/* The first of n library names that dlopen loads, or NULL with reason set to
 * "<what> not available: <the first name's dlerror>". Versioned names go
 * first: an unversioned .so is a development symlink. */
void *ku_dlopen_first(const char *what, const char *const *names, size_t n, char *reason, size_t cap);
/* dlsym(h, sym) into *slot; 0, or -1 with reason "<what> not available: no symbol <sym>". */
int ku_dlsym_into(void *h, const char *what, const char *sym, void **slot, char *reason, size_t cap);
const ku_driver *ku_driver_get(const char *op);
/* Records "<call> failed: <CUDA_ERROR_NAME>: <string>" for r != CUDA_SUCCESS
 * (KL_ERR_OOM for out of memory) and returns -1; returns 0 for success. */
int ku_check(const char *op, const char *call, CUresult r);
/* Calls d->fn(args) and checks it, naming the call: `if (KU_CALL(op, d, MemFree, p)) ...`. */
#define KU_CALL(op, d, fn, ...) ku_check((op), "cu" #fn, (d)->fn(__VA_ARGS__))
/* Number of devices (0 without CUDA, no error recorded then). */
int ku_device_count(void);
/* Makes device `dev`'s primary context current on this thread; -1 and an
 * error for a bad index or without CUDA. */
int ku_device_enter(const char *op, int dev);
/* The emulated driver's table (cuda_emu.c). */
const ku_driver *ku_emu_driver(void);

/* ---- Emulated driver knobs (tests) ----------------------------------- */
/* Device memory the emulated device may hand out (default: $KL_CUDA_EMULATE_MEM
 * bytes, else 1 GiB); lowering it below what is allocated makes allocations fail. */
void ku_emu_set_capacity(size_t bytes);
/* Held stream: its events stay incomplete (cuEventQuery says NOT_READY) until
 * the stream is released — lets tests show what happens while work is pending. */
void ku_emu_hold_stream(CUstream s, int hold);
/* Bytes the emulated device has allocated now (cuMemAlloc minus cuMemFree). */
size_t ku_emu_used(void);
/* Forgets the host compiler and cache folder found for emulated modules, so
 * the next load reads $KL_CUDA_EMU_CXX and the cache variables again (tests:
 * call it with no module load in flight). */
void ku_emu_reset_compiler(void);
/* 1 if [p, p+n) lies inside one live emulated allocation (the emulated
 * cuBLAS checks every operand with it). */
int ku_emu_range_ok(CUdeviceptr p, size_t n);
/* 1 if s is NULL (the default stream) or a live emulated stream. */
int ku_emu_stream_ok(CUstream s);

/* ---- Streams (cuda_alloc.c) ------------------------------------------ */
/* This thread's current stream on `dev` (NULL: the legacy default stream). */
CUstream ku_current_stream(int dev);
void ku_set_current_stream(int dev, CUstream s);

/* ---- Caching device allocator (cuda_alloc.c) ------------------------- */
/* Device memory of at least `bytes` (rounded up to 512) usable on `stream`;
 * 0 and an error (op named) on failure; bytes == 0 gives 0 without error. */
CUdeviceptr ku_malloc(const char *op, int dev, size_t bytes, CUstream stream);
/* Returns a block of ku_malloc to the cache; 0 is ignored; -1 and an error
 * for a pointer ku_malloc did not return. */
int ku_free(const char *op, CUdeviceptr p);
/* Marks block p as used on `stream` too: once freed, it is reused only after
 * the work queued on `stream` by then has completed (PyTorch's record_stream). */
int ku_record_stream(const char *op, CUdeviceptr p, CUstream stream);
/* Size (after rounding) of the block p points to, 0 if p is not a live block. */
size_t ku_block_size(CUdeviceptr p);

/* ---- NVRTC (nvrtc.c) -------------------------------------------------- */
typedef struct ku_cubin {
    void *image;       /* CUBIN bytes (malloc'd) */
    size_t size;
    int registers;     /* of the most demanding kernel, from ptxas -v (-1: no report in the log) */
    int spill_bytes;   /* spill stores + loads, summed over kernels (-1: no report) */
    int stack_bytes;   /* largest stack frame (-1: no report) */
    double compile_ms; /* nvrtcCompileProgram's wall time (a disk-cache hit: the load's) */
    char *log;         /* the full NVRTC/ptxas log (malloc'd, may be ""; "" on a cache hit) */
    int cached;        /* 1: loaded from Kiln's disk cache (ku_nvrtc_compile_cached) */
} ku_cubin;
/* 1 if NVRTC can be loaded (loads it); 0 and an error saying why if not. */
int ku_nvrtc_available(const char *op);
/* NVRTC's "major.minor" version, or -1 without NVRTC. */
int ku_nvrtc_version(int *major, int *minor);
/* Compiles CUDA C `src` (which may #include "vmath.h") to a CUBIN for
 * sm_<arch> (e.g. 90), -fmad=false, -default-device, NVRTC's cache off; 0 on
 * success, -1 and an error holding NVRTC's log otherwise. */
int ku_nvrtc_compile(const char *op, const char *src, const char *name, int arch, ku_cubin *out);
void ku_cubin_free(ku_cubin *c);
/* What besides the source decides a CUBIN, as text for the cache key: every
 * option of the compile for sm_<arch> and the name and SHA-256 of every
 * in-memory header, one per line. 0, or -1 if cap is too small. */
/* Room ku_nvrtc_inputs needs: the options and one line (name, SHA-256) per in-memory header. */
#define KU_NVRTC_INPUTS_MAX 16384
int ku_nvrtc_inputs(int arch, char *buf, size_t cap);

/* ---- The on-disk kernel cache (cuda_cache.c) ----------------------------- */
/* The key of a CUBIN: SHA-256 of (entry format, source, architecture, NVRTC
 * version "major.minor", options text), each part length-framed. */
struct ke_cache_key;
void ku_cubin_key(struct ke_cache_key *k, const char *src, int arch, const char *nvrtc_version, const char *options);
/* The CUBIN (with ptxas's register/spill/stack report) stored under k in the
 * disk cache (src/eager/diskcache.h, kind KE_CACHE_CUBIN; KL_CACHE_DIR): 1
 * and *out filled (out->cached = 1), or 0 on a miss, a disabled cache, or a
 * bad entry (deleted, never trusted). Never an error. */
int ku_cache_get(const struct ke_cache_key *k, ku_cubin *out);
/* Stores c under k (atomically; failures only log). */
void ku_cache_put(const struct ke_cache_key *k, const ku_cubin *c);
/* The seam every kernel load goes through: source -> CUBIN for sm_<arch>,
 * from the disk cache when it holds one, else ku_nvrtc_compile and stored.
 * Same contract as ku_nvrtc_compile. */
int ku_nvrtc_compile_cached(const char *op, const char *src, const char *name, int arch, ku_cubin *out);

/* ---- Modules and launches (cuda_module.c) ----------------------------- */
/* The first line of a module image for the emulated device: the CUDA C
 * source follows it (a CUBIN handed to the emulator fails clearly). */
#define KU_EMU_IMAGE_MAGIC "//kiln-emulated-cuda-c v1\n"
typedef struct ku_module ku_module; /* a loaded program: cached per (source digest, device), never freed before exit */
/* The module for CUDA C `src` (starting with #include "kiln_cuda.h") on
 * device dev: on a real device NVRTC -> CUBIN for the device's exact sm ->
 * cuModuleLoadData; on the emulated device the same source compiled for the
 * host with the prelude. Cached in memory by (digest of src, dev): a second
 * call is a lookup. 0, or -1 and an error naming op (compile logs included). */
int ku_module_get(const char *op, const char *src, int dev, ku_module **out);
/* Modules built so far (sources compiled and loaded, not cache lookups), over
 * the process: the tests count what a kl_compile costs. */
int64_t ku_module_loads(void);
/* What the runtime did, over the process (relaxed atomic counters): kernel
 * launches, GEMM calls (and how many of them were strided-batched), copies
 * device-to-device, host-to-device, device-to-host through the device's
 * movers, memsets. bench/cuda_count_bench and the tests read them per call. */
enum { KU_N_LAUNCH, KU_N_GEMM, KU_N_GEMM_BATCHED, KU_N_D2D, KU_N_H2D, KU_N_D2H, KU_N_MEMSET, KU_N_COUNT };
void ku_count(int what);
void ku_counts(int64_t out[KU_N_COUNT]);
/* Entry point `name` (an extern "C" __global__ function of the source,
 * exported with KL_EMU_EXPORT). 0, or -1 and an error. */
int ku_module_function(const char *op, ku_module *m, const char *name, CUfunction *f);
/* cuLaunchKernel on `stream` with the kernel's parameter array (args[i]
 * points at parameter i). 0, or -1 and an error (bad configuration, launch
 * failure: the emulator's message says which thread and why). */
int ku_launch(const char *op, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
              CUstream stream, void **args);
/* The seam for the on-disk kernel cache: the image cuModuleLoadData takes
 * for src on dev (a CUBIN for the device's sm, or the emulator's marked
 * source). *image is malloc'd. 0, or -1 and an error. */
int ku_module_image(const char *op, const char *src, int dev, void **image, size_t *size);

/* ---- cuBLAS (cublas.c) ------------------------------------------------ */
typedef struct cublasContext *cublasHandle_t;
/* 1 if libcublas can be loaded (loads it); 0 and an error if not. */
int ku_cublas_available(const char *op);
/* cuBLAS's version number (e.g. 130100), -1 without cuBLAS. */
int ku_cublas_version(void);

/* ---- GEMM through cuBLAS (cuda_gemm.c) --------------------------------- */
/* A row-major matrix operand in device memory: element (i, j) of batch b is
 * at ptr + (b*bs + i*rs + j*cs) elements. bs == 0 broadcasts one matrix over
 * the batch. */
typedef struct ku_matrix {
    CUdeviceptr ptr;
    int64_t rs, cs, bs;
} ku_matrix;
/* C[b] = alpha * A[b] @ B[b] + beta * C[b] for b < batch, A[b] m x k, B[b]
 * k x n, C[b] m x n, dtype KL_F32 / KL_F64 / KL_F16 / KL_BF16 (an int here:
 * kl_dtype), enqueued on `stream` of device dev. No copies: each operand
 * needs a unit row or column stride (a transposed view is a transposed
 * cuBLAS operand) with the other stride at least its extent; otherwise -1
 * and an error saying which operand to make contiguous. beta == 0: C is not
 * read. f16/bf16 multiply and accumulate in f32; f32 uses TF32 only when
 * kl_cuda_set_allow_tf32(true). 0, or -1 and an error naming the cuBLAS
 * call and its status. */
int ku_gemm(const char *op, int dev, int dtype, int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
            ku_matrix a, ku_matrix b, double beta, ku_matrix c, CUstream stream);
/* 1 if ku_gemm takes an r x c operand with strides (rs, cs) as it is. */
int ku_gemm_operand_ok(int64_t r, int64_t c, int64_t rs, int64_t cs);

/* ---- Eager CUDA kernels of matmul / mm / bmm, addmm, linear (cuda_matmul.c) ----
 * ke_kernel_fn's signature (struct ke_call from src/eager/dispatch.h);
 * registered for KE_KEY_CUDA by src/init.c. */
struct ke_call;
int ku_cuda_matmul(struct ke_call *c);
int ku_cuda_addmm(struct ke_call *c);
int ku_cuda_linear(struct ke_call *c);

#endif
