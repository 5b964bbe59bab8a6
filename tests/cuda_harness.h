/*
 * cuda_harness.h — what the CUDA suites share: whether the device in use is
 * the emulated one, and skipping (with the reason) a test that needs a
 * device, or the emulator's knobs (capacity, held streams, poisoning); the
 * device cuda:0 (CUDA0), moving results to the host, a sequence of values.
 * Include after harness.h; the including file defines `OP`, the op name its
 * driver calls are made under.
 */
#ifndef KT_CUDA_HARNESS_H
#define KT_CUDA_HARNESS_H

#include "../src/codegen_nvrtc/cuda_api.h"

#include <math.h>
#include <string.h>

static inline int kt_cuda_emulated(const char *op) {
    const ku_driver *d = kl_cuda_is_available() ? ku_driver_get(op) : NULL;
    return d && d->emulated;
}

#define CUDA0 ((kl_device){KL_CUDA, 0})

/* t on the CPU, contiguous (moves a CUDA tensor through kl_to_device). */
static inline kl_tensor *host(kl_tensor *t) {
    kl_tensor *c = kl_contiguous(kl_to_device(t, KL_DEVICE_CPU));
    if (!c) print_error("moving to the CPU failed: %s\n", kl_last_error());
    assert_non_null(c);
    assert_int_equal(kl_device_of(c).type, KL_CPU);
    return c;
}

/* The first element where a and b (CPU tensors, contiguous, one dtype and
 * numel) hold different bytes, or -1. With nan_equal, two NaNs count as equal
 * whatever their bits: arithmetic on a NaN gives x86's operand payload on the
 * CPU and CUDA's canonical 0x7fffffff on a GPU (the emulator, compiled for
 * the host, gives the CPU's), so only copies are held to a NaN's bits. */
static inline int64_t kt_first_difference(kl_tensor *a, kl_tensor *b, int nan_equal) {
    const size_t es = kl_dtype_size(kl_dtype_of(a));
    const char *pa = kl_data_ptr(a), *pb = kl_data_ptr(b);
    for (int64_t i = 0; i < kl_numel(a); i++)
        if (memcmp(pa + (size_t)i * es, pb + (size_t)i * es, es) &&
            !(nan_equal && isnan(kt_get(a, i)) && isnan(kt_get(b, i))))
            return i;
    return -1;
}

/* a and b have one shape and dtype. */
static inline int kt_same_layout(kl_tensor *a, kl_tensor *b) {
    if (kl_dtype_of(a) != kl_dtype_of(b) || kl_ndim(a) != kl_ndim(b)) return 0;
    for (int d = 0; d < kl_ndim(a); d++)
        if (kl_shape(a)[d] != kl_shape(b)[d]) return 0;
    return 1;
}

/* a and b (CPU tensors, contiguous) hold the same bytes (NaNs included),
 * shape and dtype. */
static inline int same_bytes(kl_tensor *a, kl_tensor *b) {
    return kt_same_layout(a, b) && kt_first_difference(a, b, 0) < 0;
}

/* cpu and cuda results of one op: the same dtype and shape, and per element
 * tol 0: equal (NaN where NaN, or the same bits); else |a - b| <= tol * (1 + |a|). */
static inline void compare(kl_tensor *cpu, kl_tensor *cuda, double tol, const char *what) {
    if (!cuda) print_error("%s on CUDA: %s\n", what, kl_last_error());
    if (!cpu) print_error("%s on the CPU: %s\n", what, kl_last_error());
    assert_non_null(cpu);
    assert_non_null(cuda);
    assert_int_equal(kl_device_of(cuda).type, KL_CUDA);
    kl_tensor *a = host(cpu), *b = host(cuda);
    assert_int_equal(kl_dtype_of(a), kl_dtype_of(b));
    kt_assert_shape(b, kl_ndim(a), kl_shape(a));
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double x = kt_get(a, i), y = kt_get(b, i);
        int ok = tol == 0 ? (x == y || (isnan(x) && isnan(y))) || !memcmp(&x, &y, sizeof x)
                          : fabs(x - y) <= tol * (1 + fabs(x));
        if (!ok) {
            print_error("%s: element %lld: cpu %.17g cuda %.17g\n", what, (long long)i, x, y);
            fail();
        }
    }
}

/* n values (i - n/2) * scale in dtype dt, on the CPU. */
static inline kl_tensor *seq(int64_t n, double scale, kl_dtype dt) {
    return kl_to_dtype(kl_mul_scalar(kl_sub_scalar(kl_arange(0, (double)n, 1, KL_F64), (double)n / 2), scale), dt);
}

/* Functions both the code generation and the compile suites trace: two
 * outputs, a clamp and a where (attributes, bool operands), pow by a scalar;
 * integer arithmetic with remainder (an error word), comparisons to bool. */
static inline int kt_two_outputs(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *c = kl_clamp(kl_mul(in[0], in[1]), -0.5, 0.75);
    out[0] = kl_where(kl_gt(c, in[1]), kl_pow_scalar(c, 2), kl_neg(in[1]));
    out[1] = kl_leaky_relu(kl_sub(in[0], c), 0.01);
    return out[0] && out[1] ? 0 : -1;
}
static inline int kt_int_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *r = kl_remainder(kl_add(in[0], in[1]), kl_add_scalar(kl_abs(in[1]), 1));
    out[0] = kl_logical_and(kl_ge(r, in[0]), kl_ne(r, in[1]));
    return out[0] ? 0 : -1;
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

/* Skips a test of NVRTC compiles in the emulated run (the suite without
 * KL_CUDA_EMULATE runs it) and where NVRTC cannot be loaded. */
#define NEED_NVRTC_ONLY()                                                                        \
    do {                                                                                         \
        if (kt_cuda_emulated(OP)) {                                                              \
            print_message("skipped: the NVRTC compile runs in the suite without KL_CUDA_EMULATE\n"); \
            skip();                                                                              \
        }                                                                                        \
        if (!ku_nvrtc_available(OP)) {                                                           \
            print_message("skipped: %s\n", kl_last_error());                                     \
            kl_clear_error();                                                                    \
            skip();                                                                              \
        }                                                                                        \
    } while (0)

/* src compiles with NVRTC for sm_80 and sm_90 without spilling (the source
 * is printed otherwise); returns the larger register count. */
static inline int kt_nvrtc_compiles(const char *op, const char *src, const char *name) {
    int maxreg = 0;
    for (int arch = 80; arch <= 90; arch += 10) {
        ku_cubin c;
        int rc = ku_nvrtc_compile(op, src, name, arch, &c);
        if (rc) print_error("sm_%d: %s\n%s\n", arch, kl_last_error(), src);
        assert_int_equal(rc, 0);
        if (c.spill_bytes > 0) print_error("spills %d bytes on sm_%d:\n%s\n", c.spill_bytes, arch, src);
        assert_true(c.spill_bytes <= 0);
        if (c.registers > maxreg) maxreg = c.registers;
        ku_cubin_free(&c);
    }
    return maxreg;
}

#endif
