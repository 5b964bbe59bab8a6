/*
 * test_cuda_module.c — the module and launch API (ku_module_get,
 * ku_module_function, ku_launch) and the prelude kiln_cuda.h: hand-written
 * CUDA C kernels (grid-stride elementwise, shared-memory block reduction,
 * warp shuffles, atomics, dynamic shared memory, 2D/3D grids) launched on
 * device memory and checked against plain C; error cases (compile errors
 * with the log, unknown kernels, bad launch configurations, a barrier
 * deadlock, a CUBIN given to the emulator). The same sources compile with
 * NVRTC to CUBIN for sm_80 and sm_90, so the prelude is proven on both sides.
 * Runs on the emulated device (the _emu run) or a GPU; skips with a message
 * where neither (or NVRTC) is there.
 */
#include "harness.h"

#include <pthread.h>
#include <sys/wait.h>

#include "cuda_vmath_list.h"

static const char *OP = "module_test";
#include "cuda_harness.h"

#define KT_CASE_SRC_(id, name) "    case " #id ": y = ke_v" #name "f(v); break;\n"
#define KT_CASE2_SRC_(id, name) "    case " #id ": y = ke_v" #name "f(v, u); break;\n"
/* Every kernel of the suite, in one program (as the code generator emits). */
static const char kernels_src[] =
    "#include \"kiln_cuda.h\"\n"
    "#include \"vmath.h\"\n"
    /* grid-stride elementwise, with the eager math */
    "extern \"C\" __global__ void axpy_exp(float *__restrict__ y, const float *__restrict__ x, float a,\n"
    "                                      unsigned long long n) {\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x)\n"
    "    y[i] = fmaf(a, ke_vexpf(x[i]), y[i]);\n"
    "}\n"
    "KL_EMU_EXPORT(axpy_exp)\n"
    /* every vmath function the GPU suites compare, on given inputs */
    "extern \"C\" __global__ void vmath_all(float *out, const float *x, unsigned n, int fn) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  float v = x[i], y = 0.0f;\n"
    "  switch (fn) {\n" KT_VMATH_LIST(KT_CASE_SRC_) "  }\n"
    "  out[i] = y;\n"
    "}\n"
    "KL_EMU_EXPORT(vmath_all)\n"
    /* the two-argument ones (pow, atan2, hypot) */
    "extern \"C\" __global__ void vmath_all2(float *out, const float *x, const float *w, unsigned n, int fn) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  float v = x[i], u = w[i], y = 0.0f;\n"
    "  switch (fn) {\n" KT_VMATH_LIST2(KT_CASE2_SRC_) "  }\n"
    "  out[i] = y;\n"
    "}\n"
    "KL_EMU_EXPORT(vmath_all2)\n"
    /* one block per 256 inputs: a tree in static shared memory */
    "extern \"C\" __global__ void block_sum(const float *x, float *out, unsigned n) {\n"
    "  __shared__ float buf[256];\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  buf[threadIdx.x] = i < n ? x[i] : 0.0f;\n"
    "  __syncthreads();\n"
    "  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {\n"
    "    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(block_sum)\n"
    /* warp-level: shuffle-down sum (f32), xor all-reduce (f64), broadcast,
     * shuffle-up scan within 8 lanes (int), ballot / any / all */
    "extern \"C\" __global__ void warp_ops(const float *x, const double *xd, float *wsum, double *wall,\n"
    "                                      int *bcast, int *scan, unsigned *ballot, int *anyall) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31, w = i / 32;\n"
    "  float v = x[i];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);\n"
    "  if (lane == 0) wsum[w] = v;\n"
    "  double d = xd[i];\n"
    "  for (int o = 1; o < 32; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);\n"
    "  wall[i] = d;\n"
    "  bcast[i] = __shfl_sync(0xffffffffu, (int)i * 7, 3);\n"
    "  int s = (int)lane;\n"
    "  for (unsigned o = 1; o < 8; o <<= 1) {\n"
    "    int t = __shfl_up_sync(0xffffffffu, s, o, 8);\n"
    "    if ((lane & 7) >= o) s += t;\n"
    "  }\n"
    "  scan[i] = s;\n"
    "  __syncwarp();\n"
    "  ballot[i] = __ballot_sync(0xffffffffu, x[i] > 0.0f);\n"
    "  anyall[i] = __any_sync(0xffffffffu, lane == 5) * 2 + __all_sync(0xffffffffu, lane < 40);\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(warp_ops)\n"
    /* atomics on every type the prelude lists */
    "extern \"C\" __global__ void atomics(const int *v, unsigned n, int *hist, float *fsum, double *dsum,\n"
    "                                     unsigned long long *usum, int *imax, int *imin, long long *lmax,\n"
    "                                     unsigned *umin, int *first) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  atomicAdd(&hist[v[i] & 15], 1);\n"
    "  atomicAdd(fsum, (float)v[i]);\n"
    "  atomicAdd(dsum, 0.5 * v[i]);\n"
    "  atomicAdd(usum, (unsigned long long)v[i] << 20);\n"
    "  atomicMax(imax, v[i] - 500);\n"
    "  atomicMin(imin, v[i] - 500);\n"
    "  atomicMax(lmax, (long long)v[i] << 33);\n"
    "  atomicMin(umin, (unsigned)v[i] + 3u);\n"
    "  atomicCAS(first, -1, (int)i);\n"
    "}\n"
    "KL_EMU_EXPORT(atomics)\n"
    /* dynamic shared memory: reverse each block's chunk */
    "extern \"C\" __global__ void reverse_blocks(const float *x, float *y) {\n"
    "  KL_DYN_SHARED(float, s);\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  s[threadIdx.x] = x[i];\n"
    "  __syncthreads();\n"
    "  y[i] = s[blockDim.x - 1 - threadIdx.x];\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(reverse_blocks)\n"
    /* 3D grid of 3D blocks: each thread writes who it is */
    "extern \"C\" __global__ void where(unsigned *out) {\n"
    "  unsigned bx = blockIdx.x * blockDim.x + threadIdx.x, by = blockIdx.y * blockDim.y + threadIdx.y;\n"
    "  unsigned bz = blockIdx.z * blockDim.z + threadIdx.z;\n"
    "  unsigned W = gridDim.x * blockDim.x, H = gridDim.y * blockDim.y;\n"
    "  out[(bz * H + by) * W + bx] = threadIdx.x | threadIdx.y << 4 | threadIdx.z << 8 | blockIdx.x << 12 |\n"
    "                               blockIdx.y << 16 | blockIdx.z << 20;\n"
    "}\n"
    "KL_EMU_EXPORT(where)\n";

/* Kernels that are wrong on purpose (the emulator must say so). */
static const char bad_sync_src[] =
    "#include \"kiln_cuda.h\"\n"
    "extern \"C\" __global__ void half_exit(int *x) {\n"
    "  if (threadIdx.x < 16) return;\n"
    "  __syncthreads();\n"
    "  x[threadIdx.x] = 1;\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(half_exit)\n"
    "extern \"C\" __global__ void unmarked_sync(int *x) {\n"
    "  x[threadIdx.x] = 1;\n"
    "  __syncthreads();\n"
    "}\n"
    "KL_EMU_EXPORT(unmarked_sync)\n"
    "extern \"C\" __global__ void unmarked_shfl(int *x) {\n"
    "  x[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);\n"
    "}\n"
    "KL_EMU_EXPORT(unmarked_shfl)\n"
    "extern \"C\" __global__ void lane_exit(int *x) {\n"
    "  if (threadIdx.x == 31) return;\n"
    "  x[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);\n"
    "}\n"
    "KL_EMU_EXPORT_SYNC(lane_exit)\n";

static const char syntax_error_src[] =
    "#include \"kiln_cuda.h\"\n"
    "extern \"C\" __global__ void broken(float *x) {\n"
    "  x[threadIdx.x] = undeclared_thing + ;\n"
    "}\n"
    "KL_EMU_EXPORT(broken)\n";

/* vmath on the CPU without contraction (tests/cuda_vmath_ref.c): what both
 * NVRTC's -fmad=false and the emulator's -ffp-contract=off compute. */
void kt_vmath_ref_off(int fn, const float *x, float *y, size_t n);
void kt_vmath_ref_off_2(int fn, const float *a, const float *b, float *y, size_t n);

static const ku_driver *drv(void) { return ku_driver_get(OP); }

static CUdeviceptr up(const void *h, size_t n) {
    CUdeviceptr p = ku_malloc(OP, 0, n, NULL);
    assert_true(p != 0);
    if (h) assert_int_equal(KU_CALL(OP, drv(), MemcpyHtoD, p, h, n), 0);
    else assert_int_equal(KU_CALL(OP, drv(), MemsetD8, p, 0, n), 0);
    return p;
}

static void down(void *h, CUdeviceptr p, size_t n) { assert_int_equal(KU_CALL(OP, drv(), MemcpyDtoH, h, p, n), 0); }

/* The emulator needs a host C++ compiler (a fresh Debian may have none):
 * without one, the tests that run kernels skip with the reason. */
#define NEED_MODULES()                                                                   \
    do {                                                                                 \
        NEED_CUDA();                                                                     \
        ku_module *m_;                                                                   \
        if (ku_module_get(OP, "#include \"kiln_cuda.h\"\n", 0, &m_) &&                    \
            (strstr(kl_last_error(), "CUDA_ERROR_JIT_COMPILER_NOT_FOUND") ||              \
             strstr(kl_last_error(), "NVRTC not available"))) {                          \
            print_message("skipped: %s\n", kl_last_error());                             \
            kl_clear_error();                                                            \
            skip();                                                                      \
        }                                                                                \
        KT_NO_ERROR();                                                                   \
    } while (0)

static CUfunction kernel(const char *src, const char *name) {
    ku_module *m = NULL;
    if (ku_module_get(OP, src, 0, &m)) print_error("%s\n", kl_last_error());
    assert_non_null(m);
    CUfunction f = NULL;
    assert_int_equal(ku_module_function(OP, m, name, &f), 0);
    return f;
}

static int launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shmem, void **args) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return ku_launch(OP, f, g, b, shmem, NULL, args);
}

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((int)(*s >> 8) - (1 << 23)) / (float)(1 << 20);
}

static void test_module_cache(void **state) {
    (void)state;
    NEED_MODULES();
    ku_module *a = NULL, *b = NULL;
    assert_int_equal(ku_module_get(OP, kernels_src, 0, &a), 0);
    assert_int_equal(ku_module_get(OP, kernels_src, 0, &b), 0);
    assert_ptr_equal(a, b); /* the second call is a lookup */
    CUfunction f1, f2;
    assert_int_equal(ku_module_function(OP, a, "axpy_exp", &f1), 0);
    assert_int_equal(ku_module_function(OP, a, "block_sum", &f2), 0);
    assert_ptr_not_equal(f1, f2);
    assert_int_equal(ku_module_get(OP, kernels_src, 7, &b), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA device 7 does not exist");
    KT_NO_ERROR();
}

static void test_elementwise(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "axpy_exp");
    /* 1 element, a partial block, and more than one grid-stride sweep */
    const unsigned long long sizes[] = {1, 1000, 100003};
    for (int c = 0; c < 3; c++) {
        unsigned long long n = sizes[c];
        float *x = malloc(n * 4), *y = malloc(n * 4), *r = malloc(n * 4);
        uint32_t s = 7 + (uint32_t)c;
        for (unsigned long long i = 0; i < n; i++) {
            x[i] = frand(&s) / 64;
            y[i] = frand(&s);
        }
        kt_vmath_ref_off(0 /* exp */, x, r, n);
        for (unsigned long long i = 0; i < n; i++) r[i] = fmaf(0.75f, r[i], y[i]);
        CUdeviceptr dx = up(x, n * 4), dy = up(y, n * 4);
        float a = 0.75f;
        void *args[] = {&dy, &dx, &a, &n};
        assert_int_equal(launch(f, 64, 1, 1, 128, 1, 1, 0, args), 0);
        down(y, dy, n * 4);
        for (unsigned long long i = 0; i < n; i++)
            if (memcmp(&y[i], &r[i], 4)) {
                print_error("n=%llu i=%llu: got %a want %a\n", n, i, y[i], r[i]);
                fail();
            }
        ku_free(OP, dx);
        ku_free(OP, dy);
        free(x);
        free(y);
        free(r);
    }
    KT_NO_ERROR();
}

/* All 17 vmath functions over 2^16 bit patterns spread over all 2^32 equal
 * the CPU's, built without contraction (what both device compilers get),
 * bit for bit except a NaN's sign and payload (which operand's NaN an add
 * passes on is the compiler's choice; a GPU gives canonical NaNs anyway). */
static void test_vmath_bitwise(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "vmath_all");
    unsigned n = 1u << 16;
    float *x = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    for (unsigned i = 0; i < n; i++) {
        uint32_t b = i * 65536u + ((i * 2654435761u) >> 16);
        memcpy(&x[i], &b, 4);
    }
    CUdeviceptr dx = up(x, n * 4), dout = up(NULL, n * 4);
    for (int fn = 0; fn < KT_VMATH_COUNT; fn++) {
        void *args[] = {&dout, &dx, &n, &fn};
        assert_int_equal(launch(f, n / 256, 1, 1, 256, 1, 1, 0, args), 0);
        down(got, dout, n * 4);
        kt_vmath_ref_off(fn, x, want, n);
        unsigned bad = 0;
        for (unsigned i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], 4) && !(isnan(got[i]) && isnan(want[i])) && bad++ < 3)
                print_error("vmath function %d at %a: got %a, want %a\n", fn, x[i], got[i], want[i]);
        if (bad) {
            print_error("vmath function %d: %u of %u results differ\n", fn, bad, n);
            fail();
        }
    }
    ku_free(OP, dx);
    ku_free(OP, dout);
    free(x);
    free(want);
    free(got);
    KT_NO_ERROR();
}

/* pow, atan2 and hypot likewise, over 2^16 pairs: x as above, w any bit
 * pattern for odd i and in +-[2^-8, 2^8) for even i (pow's every result
 * binade). */
static void test_vmath2_bitwise(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "vmath_all2");
    unsigned n = 1u << 16;
    float *x = malloc(n * 4), *w = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
    for (unsigned i = 0; i < n; i++) {
        uint32_t b = i * 65536u + ((i * 2654435761u) >> 16), h = (i * 2246822507u) ^ (i >> 3) * 2654435761u;
        uint32_t c = (i & 1) ? h : ((h & 0x807fffffu) | ((119u + ((h >> 23) & 15u)) << 23));
        memcpy(&x[i], &b, 4);
        memcpy(&w[i], &c, 4);
    }
    CUdeviceptr dx = up(x, n * 4), dw = up(w, n * 4), dout = up(NULL, n * 4);
    for (int fn = 0; fn < KT_VMATH_COUNT2; fn++) {
        void *args[] = {&dout, &dx, &dw, &n, &fn};
        assert_int_equal(launch(f, n / 256, 1, 1, 256, 1, 1, 0, args), 0);
        down(got, dout, n * 4);
        kt_vmath_ref_off_2(fn, x, w, want, n);
        unsigned bad = 0;
        for (unsigned i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], 4) && !(isnan(got[i]) && isnan(want[i])) && bad++ < 3)
                print_error("vmath two-argument function %d at (%a, %a): got %a, want %a\n", fn, x[i], w[i], got[i],
                            want[i]);
        if (bad) {
            print_error("vmath two-argument function %d: %u of %u results differ\n", fn, bad, n);
            fail();
        }
    }
    ku_free(OP, dx);
    ku_free(OP, dw);
    ku_free(OP, dout);
    free(x);
    free(w);
    free(want);
    free(got);
    KT_NO_ERROR();
}

/* The same tree as the kernel, in C: bitwise equal. */
static float tree_sum(const float *x, unsigned n, unsigned base, unsigned bs) {
    float buf[1024];
    for (unsigned t = 0; t < bs; t++) buf[t] = base + t < n ? x[base + t] : 0.0f;
    for (unsigned s = bs / 2; s > 0; s >>= 1)
        for (unsigned t = 0; t < s; t++) buf[t] += buf[t + s];
    return buf[0];
}

static void check_block_sum(CUfunction f, unsigned n, unsigned seed) {
    unsigned bs = 256, nb = (n + bs - 1) / bs;
    float *x = malloc(n * 4), *r = malloc(nb * 4);
    uint32_t s = seed;
    for (unsigned i = 0; i < n; i++) x[i] = frand(&s);
    CUdeviceptr dx = up(x, n * 4), dout = up(NULL, nb * 4);
    void *args[] = {&dx, &dout, &n};
    assert_int_equal(launch(f, nb, 1, 1, bs, 1, 1, 0, args), 0);
    down(r, dout, nb * 4);
    for (unsigned b = 0; b < nb; b++) {
        float want = tree_sum(x, n, b * bs, bs);
        if (memcmp(&want, &r[b], 4)) {
            print_error("block %u: got %a want %a\n", b, r[b], want);
            fail();
        }
    }
    ku_free(OP, dx);
    ku_free(OP, dout);
    free(x);
    free(r);
}

static void test_block_reduction(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "block_sum");
    check_block_sum(f, 1, 1);
    check_block_sum(f, 5000, 2);
    KT_NO_ERROR();
}

static void *sum_thread(void *arg) {
    CUfunction f = arg;
    for (int k = 0; k < 3; k++) check_block_sum(f, 20000, 100 + (unsigned)k);
    return NULL;
}

/* Two host threads launching at once keep their blocks' shared memory apart. */
static void test_concurrent_launches(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "block_sum");
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, sum_thread, f), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    KT_NO_ERROR();
}

static void test_warp_shuffles(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "warp_ops");
    enum { NB = 3, BS = 96, N = NB * BS, NW = N / 32 };
    float x[N], wsum[NW];
    double xd[N], wall[N];
    int bcast[N], scan[N], anyall[N];
    unsigned ballot[N];
    uint32_t s = 5;
    for (int i = 0; i < N; i++) {
        x[i] = frand(&s);
        xd[i] = frand(&s) * 1e-3;
    }
    CUdeviceptr dx = up(x, sizeof x), dxd = up(xd, sizeof xd), dws = up(NULL, sizeof wsum), dwa = up(NULL, sizeof wall);
    CUdeviceptr db = up(NULL, sizeof bcast), dsc = up(NULL, sizeof scan), dba = up(NULL, sizeof ballot);
    CUdeviceptr daa = up(NULL, sizeof anyall);
    void *args[] = {&dx, &dxd, &dws, &dwa, &db, &dsc, &dba, &daa};
    assert_int_equal(launch(f, NB, 1, 1, BS, 1, 1, 0, args), 0);
    down(wsum, dws, sizeof wsum);
    down(wall, dwa, sizeof wall);
    down(bcast, db, sizeof bcast);
    down(scan, dsc, sizeof scan);
    down(ballot, dba, sizeof ballot);
    down(anyall, daa, sizeof anyall);
    for (int w = 0; w < NW; w++) {
        const float *v = x + 32 * w;
        float t[32];
        memcpy(t, v, sizeof t);
        /* shuffle-down: lane l adds lane l+o, out-of-range lanes add their own value */
        for (int o = 16; o > 0; o >>= 1) {
            float nt[32];
            for (int l = 0; l < 32; l++) nt[l] = t[l] + (l + o < 32 ? t[l + o] : t[l]);
            memcpy(t, nt, sizeof t);
        }
        assert_memory_equal(&wsum[w], &t[0], 4);
        double d[32];
        memcpy(d, xd + 32 * w, sizeof d);
        for (int o = 1; o < 32; o <<= 1) {
            double nd[32];
            for (int l = 0; l < 32; l++) nd[l] = d[l] + d[l ^ o];
            memcpy(d, nd, sizeof d);
        }
        unsigned want_ballot = 0;
        for (int l = 0; l < 32; l++) want_ballot |= (unsigned)(v[l] > 0.0f) << l;
        for (int l = 0; l < 32; l++) {
            int i = 32 * w + l;
            assert_memory_equal(&wall[i], &d[l], 8);
            assert_int_equal(bcast[i], (32 * w + 3) * 7);
            int seg = l & 7;
            assert_int_equal(scan[i], (l - seg) * (seg + 1) + seg * (seg + 1) / 2);
            assert_int_equal(ballot[i], want_ballot);
            assert_int_equal(anyall[i], 3);
        }
    }
    CUdeviceptr all[] = {dx, dxd, dws, dwa, db, dsc, dba, daa};
    for (int i = 0; i < 8; i++) ku_free(OP, all[i]);
    KT_NO_ERROR();
}

static void test_atomics(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "atomics");
    unsigned n = 3000;
    int *v = malloc(n * sizeof *v);
    uint32_t s = 9;
    for (unsigned i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (int)(s >> 22);
    }
    int hist[16] = {0}, wh[16] = {0}, imax = -1000000, imin = 1000000, first = -1;
    float fsum = 0;
    double dsum = 0;
    unsigned long long usum = 0;
    long long lmax = -1;
    unsigned umin = 0xffffffffu;
    CUdeviceptr dv = up(v, n * sizeof *v), dh = up(hist, sizeof hist), dfs = up(&fsum, 4), dds = up(&dsum, 8);
    CUdeviceptr dus = up(&usum, 8), dmx = up(&imax, 4), dmn = up(&imin, 4), dlm = up(&lmax, 8), dum = up(&umin, 4);
    CUdeviceptr dfi = up(&first, 4);
    void *args[] = {&dv, &n, &dh, &dfs, &dds, &dus, &dmx, &dmn, &dlm, &dum, &dfi};
    assert_int_equal(launch(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, args), 0);
    down(hist, dh, sizeof hist);
    down(&fsum, dfs, 4);
    down(&dsum, dds, 8);
    down(&usum, dus, 8);
    down(&imax, dmx, 4);
    down(&imin, dmn, 4);
    down(&lmax, dlm, 8);
    down(&umin, dum, 4);
    down(&first, dfi, 4);
    long long tot = 0;
    int mx = -1000000, mn = 1000000;
    for (unsigned i = 0; i < n; i++) {
        wh[v[i] & 15]++;
        tot += v[i];
        mx = v[i] > mx ? v[i] : mx;
        mn = v[i] < mn ? v[i] : mn;
    }
    assert_memory_equal(hist, wh, sizeof wh);
    assert_true(fsum == (float)tot); /* integers below 2^24: exact in any order */
    assert_true(dsum == 0.5 * (double)tot);
    assert_true(usum == (unsigned long long)tot << 20);
    assert_int_equal(imax, mx - 500);
    assert_int_equal(imin, mn - 500);
    assert_true(lmax == (long long)mx << 33);
    assert_int_equal(umin, (unsigned)mn + 3u);
    assert_true(first >= 0 && first < (int)n); /* exactly one thread won */
    CUdeviceptr all[] = {dv, dh, dfs, dds, dus, dmx, dmn, dlm, dum, dfi};
    for (int i = 0; i < 10; i++) ku_free(OP, all[i]);
    free(v);
    KT_NO_ERROR();
}

static void test_dynamic_shared_and_grids(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction rev = kernel(kernels_src, "reverse_blocks");
    enum { BS = 200, NB = 5, N = BS * NB };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i;
    CUdeviceptr dx = up(x, sizeof x), dy = up(NULL, sizeof y);
    void *args[] = {&dx, &dy};
    assert_int_equal(launch(rev, NB, 1, 1, BS, 1, 1, BS * sizeof(float), args), 0);
    down(y, dy, sizeof y);
    for (int i = 0; i < N; i++) assert_true(y[i] == x[i / BS * BS + BS - 1 - i % BS]);
    ku_free(OP, dx);
    ku_free(OP, dy);

    CUfunction where = kernel(kernels_src, "where");
    const unsigned g[2][3] = {{3, 2, 1}, {3, 2, 2}}, b[2][3] = {{4, 5, 1}, {4, 2, 3}};
    for (int c = 0; c < 2; c++) {
        unsigned W = g[c][0] * b[c][0], H = g[c][1] * b[c][1], D = g[c][2] * b[c][2], n = W * H * D;
        unsigned *out = malloc(n * 4);
        CUdeviceptr dout = up(NULL, n * 4);
        void *a2[] = {&dout};
        assert_int_equal(launch(where, g[c][0], g[c][1], g[c][2], b[c][0], b[c][1], b[c][2], 0, a2), 0);
        down(out, dout, n * 4);
        for (unsigned z = 0; z < D; z++)
            for (unsigned y2 = 0; y2 < H; y2++)
                for (unsigned x2 = 0; x2 < W; x2++) {
                    unsigned want = x2 % b[c][0] | (y2 % b[c][1]) << 4 | (z % b[c][2]) << 8 | (x2 / b[c][0]) << 12 |
                                    (y2 / b[c][1]) << 16 | (z / b[c][2]) << 20;
                    assert_int_equal(out[(z * H + y2) * W + x2], want);
                }
        ku_free(OP, dout);
        free(out);
    }
    KT_NO_ERROR();
}

static void test_bad_launches(void **state) {
    (void)state;
    NEED_MODULES();
    CUfunction f = kernel(kernels_src, "where");
    CUdeviceptr d = up(NULL, 4096);
    void *args[] = {&d};
    const unsigned bad[][6] = {
        {1, 1, 1, 1025, 1, 1}, {1, 1, 1, 32, 32, 2}, {1, 1, 1, 1, 1, 65}, {1, 1, 1, 0, 1, 1},
        {0, 1, 1, 32, 1, 1},   {1, 65536, 1, 1, 1, 1}, {1, 1, 65536, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(launch(f, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4], bad[i][5], 0, args), -1);
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE");
    }
    assert_int_equal(launch(f, 1, 1, 1, 1, 1, 1, 64 * 1024, args), -1); /* beyond 48 KiB without opting in */
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE");
    ku_module *m;
    assert_int_equal(ku_module_get(OP, kernels_src, 0, &m), 0);
    CUfunction g = NULL;
    assert_int_equal(ku_module_function(OP, m, "no_such_kernel", &g), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND");
    ku_free(OP, d);
    KT_NO_ERROR();
}

/* What only the emulator can show (on a GPU these are undefined behaviour
 * or no error at all): barrier deadlocks, unmarked synchronizing kernels. */
static void test_emulator_launch_failures(void **state) {
    (void)state;
    NEED_EMULATOR();
    NEED_MODULES();
    CUdeviceptr d = up(NULL, 4096);
    void *args[] = {&d};
    assert_int_equal(launch(kernel(bad_sync_src, "half_exit"), 2, 1, 1, 64, 1, 1, 0, args), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure (emulated device: kernel "
                                   "half_exit: block (0,0,0): deadlock: 48 of 64 threads wait at __syncthreads, 0 at a "
                                   "warp operation, 16 exited");
    assert_int_equal(launch(kernel(bad_sync_src, "unmarked_sync"), 1, 1, 1, 32, 1, 1, 0, args), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kernel unmarked_sync: thread (0,0,0) of block (0,0,0): __syncthreads() in a "
                                   "kernel exported with KL_EMU_EXPORT: export it with KL_EMU_EXPORT_SYNC");
    assert_int_equal(launch(kernel(bad_sync_src, "unmarked_shfl"), 1, 1, 1, 32, 1, 1, 0, args), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "a warp operation (__shfl*_sync");
    assert_int_equal(launch(kernel(bad_sync_src, "lane_exit"), 1, 1, 1, 32, 1, 1, 0, args), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "warp 0: lane 31 exited while the others wait at a warp operation");
    /* the thread's state is clean afterwards: a good launch works */
    CUfunction f = kernel(kernels_src, "block_sum");
    check_block_sum(f, 300, 3);
    /* params missing, extra given, a stale handle */
    const ku_driver *dr = drv();
    assert_int_equal(KU_CALL(OP, dr, LaunchKernel, f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kernel block_sum takes 3 parameters: `params` is NULL");
    void *extra[] = {NULL};
    assert_int_equal(KU_CALL(OP, dr, LaunchKernel, f, 1, 1, 1, 32, 1, 1, 0, NULL, args, extra), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA_ERROR_NOT_SUPPORTED");
    static const char junk[64] = "junk";
    assert_int_equal(KU_CALL(OP, dr, LaunchKernel, (CUfunction)(void *)junk, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA_ERROR_INVALID_HANDLE");
    ku_free(OP, d);
    KT_NO_ERROR();
}

static void test_emulator_images(void **state) {
    (void)state;
    NEED_EMULATOR();
    NEED_MODULES();
    const ku_driver *d = drv();
    CUmodule m = NULL;
    /* an ELF file (what NVRTC gives) is refused, not run */
    static const char elf[64] = "\177ELF\2\1\1";
    assert_int_equal(KU_CALL(OP, d, ModuleLoadData, &m, elf), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid "
                                   "(emulated device: the image is an ELF file (a CUBIN?), not Kiln CUDA C source");
    assert_int_equal(KU_CALL(OP, d, ModuleLoadData, &m, "__global__ void f() {}"), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA_ERROR_INVALID_IMAGE");
    /* a compile error carries the compiler's output and the source's head */
    ku_module *km = NULL;
    assert_int_equal(ku_module_get(OP, syntax_error_src, 0, &km), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuModuleLoadData failed: CUDA_ERROR_INVALID_SOURCE");
    assert_int_equal(ku_module_get(OP, syntax_error_src, 0, &km), -1);
    assert_non_null(strstr(kl_last_error(), "undeclared_thing"));
    assert_non_null(strstr(kl_last_error(), "source begins:\n#include \"kiln_cuda.h\"\nextern \"C\" __global__ void broken"));
    kl_clear_error();
    /* load, get, unload through the driver table; then the image is reloaded from the disk cache */
    char *img = NULL;
    size_t n = 0;
    assert_int_equal(ku_module_image(OP, bad_sync_src, 0, (void **)&img, &n), 0);
    assert_int_equal(strncmp(img, KU_EMU_IMAGE_MAGIC, strlen(KU_EMU_IMAGE_MAGIC)), 0);
    assert_int_equal(KU_CALL(OP, d, ModuleLoadData, &m, img), 0);
    CUfunction f;
    assert_int_equal(KU_CALL(OP, d, ModuleGetFunction, &f, m, "half_exit"), 0);
    assert_int_equal(KU_CALL(OP, d, ModuleUnload, m), 0);
    /* a cache entry damaged on disk is thrown away and rebuilt (replaced,
     * not truncated in place: the loaded modules map these files) */
    const char *cd = getenv("KL_CACHE_DIR");
    int corrupted = 0;
    if (cd && cd[0] && strcmp(cd, "off")) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/cuda-emu", cd);
        DIR *dd = opendir(dir);
        assert_non_null(dd);
        struct dirent *e;
        while ((e = readdir(dd))) {
            size_t l = strlen(e->d_name);
            if (l < 4 || strcmp(e->d_name + l - 3, ".so")) continue;
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            char tmp[1300];
            snprintf(tmp, sizeof tmp, "%s.junk", p);
            FILE *fp = fopen(tmp, "wb");
            assert_non_null(fp);
            fputs("\177ELF truncated", fp);
            fclose(fp);
            assert_int_equal(rename(tmp, p), 0);
            corrupted++;
        }
        closedir(dd);
        assert_true(corrupted > 0);
    }
    assert_int_equal(KU_CALL(OP, d, ModuleLoadData, &m, img), 0);
    assert_int_equal(KU_CALL(OP, d, ModuleGetFunction, &f, m, "lane_exit"), 0);
    assert_int_equal(KU_CALL(OP, d, ModuleUnload, m), 0);
    assert_int_equal(KU_CALL(OP, d, ModuleUnload, m), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA_ERROR_INVALID_HANDLE");
    CUdeviceptr dp = up(NULL, 256); /* a kernel of an unloaded module is a stale handle */
    void *args[] = {&dp};
    assert_int_equal(launch(f, 1, 1, 1, 32, 1, 1, 0, args), -1);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "cuLaunchKernel failed: CUDA_ERROR_INVALID_HANDLE");
    ku_free(OP, dp);
    free(img);
    KT_NO_ERROR();
}

/* Without a host compiler the emulator says so (checked in a child process:
 * the compiler is looked up once per process). */
static void test_emulator_without_compiler(void **state) {
    (void)state;
    NEED_EMULATOR();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("KL_CUDA_EMU_CXX", "/nonexistent/c++", 1);
        ku_emu_reset_compiler();
        ku_module *m;
        int ok = ku_module_get(OP, "#include \"kiln_cuda.h\"\n// another source\n", 0, &m) == -1 &&
                 strstr(kl_last_error(), "CUDA_ERROR_JIT_COMPILER_NOT_FOUND") &&
                 strstr(kl_last_error(), "emulated device: no host C++ compiler ($KL_CUDA_EMU_CXX=/nonexistent/c++ "
                                         "not found or not executable)");
        if (!ok) fprintf(stderr, "child: %s\n", kl_last_error());
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The same program, through NVRTC, for both architectures Kiln targets. */
static void test_sources_compile_with_nvrtc(void **state) {
    (void)state;
    if (!ku_nvrtc_available(OP)) {
        print_message("skipped: %s\n", kl_last_error());
        kl_clear_error();
        skip();
    }
    const char *srcs[] = {kernels_src, bad_sync_src};
    for (int i = 0; i < 2; i++)
        for (int arch = 80; arch <= 90; arch += 10) {
            ku_cubin c;
            if (ku_nvrtc_compile(OP, srcs[i], "test_module", arch, &c)) {
                print_error("%s\n", kl_last_error());
                fail();
            }
            assert_true(c.size > 0);
            assert_int_equal(c.spill_bytes, 0);
            ku_cubin_free(&c);
        }
    ku_cubin c;
    assert_int_equal(ku_nvrtc_compile(OP, syntax_error_src, "broken", 90, &c), -1);
    KT_EXPECT_ERROR(KL_ERR_INTERNAL, "undeclared_thing");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(test_sources_compile_with_nvrtc),
        KT_TEST(test_module_cache),
        KT_TEST(test_elementwise),
        KT_TEST(test_vmath_bitwise),
        KT_TEST(test_vmath2_bitwise),
        KT_TEST(test_block_reduction),
        KT_TEST(test_concurrent_launches),
        KT_TEST(test_warp_shuffles),
        KT_TEST(test_atomics),
        KT_TEST(test_dynamic_shared_and_grids),
        KT_TEST(test_bad_launches),
        KT_TEST(test_emulator_launch_failures),
        KT_TEST(test_emulator_images),
        KT_TEST(test_emulator_without_compiler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
