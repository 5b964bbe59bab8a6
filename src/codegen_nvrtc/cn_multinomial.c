/*
 * cn_multinomial.c — multinomial sampling on CUDA tensors: the CPU's per-row
 * algorithm (src/eager/multinomial.c) run on the device in the same order and
 * precision, so the same seed draws the same indices on both devices, not
 * only indices distributed alike.
 *
 * The uniforms are the CPU's: element r * m + s of the call's f64 uniform
 * stream (m = num_samples with replacement, else the category count), drawn
 * by philox_xf.h's ke_xf_uniform_f64 from the seed and offset the call
 * reserved (philox.h's layout: block offset + j / 2, lanes 2 (j % 2) and
 * 2 (j % 2) + 1). Three steps, each a kernel of one program per probability
 * dtype:
 *
 *   kl_mn_rows  a thread per row converts the row to doubles (exact for
 *               every floating dtype), checks it as the CPU does and, with
 *               replacement, forms the running sum in the CPU's order (the
 *               cdf) and the last non-zero category; the first bad row goes
 *               to a word the call reads back (atomicMin), and the host
 *               raises the CPU's error for that row through the CPU's own
 *               check (ke_multinomial_check_row), before anything is drawn;
 *   kl_mn_repl  with replacement, a thread per sample: t = u * cdf[n - 1],
 *               the first category whose cdf exceeds t by the CPU's binary
 *               search (the last non-zero one where rounding leaves none);
 *   kl_mn_keys  without replacement, a thread per category: the key
 *               ln(1 - u) / p (philox_xf.h's ke_log1m_f64, the CPU's
 *               function: libm's log1p would differ between the devices),
 *               -inf for p = 0; then kl_topk of the keys (largest, sorted:
 *               decreasing key, ties by increasing index, the CPU's qsort
 *               order) gives the indices.
 *
 * The check reads a word back, so the call waits for the device, as the
 * other ops with data-dependent errors (bernoulli, the indexing ops) do.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "multinomial.h"
#include "philox.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char ku_philox_xf_h[]; /* src/eager/philox_xf.h, embedded (meson.build) */

/* Defined before it: KL_T (the probabilities' storage type), KL_LD(v) (one as
 * a double). */
static const char mn_kernels[] =
    "/* row r of p as doubles into w (cdf with replacement), checked as the CPU's\n"
    " * ke_multinomial_check_row; the first bad row into *bad */\n"
    "extern \"C\" __global__ void kl_mn_rows(const KL_T *__restrict__ p, long long ps0, long long ps1,\n"
    "                                       double *__restrict__ w, long long *__restrict__ last,\n"
    "                                       unsigned long long *bad, long long rows, long long n, long long ns,\n"
    "                                       int repl) {\n"
    "    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows;\n"
    "         r += (long long)gridDim.x * blockDim.x) {\n"
    "        const KL_T *row = p + r * ps0;\n"
    "        double *wr = w + r * n, total = 0;\n"
    "        long long nonzero = 0, lst = 0;\n"
    "        int ok = 1;\n"
    "        for (long long i = 0; i < n; i++) {\n"
    "            const double v = KL_LD(row[i * ps1]);\n"
    "            if (!(v >= 0) || v - v != 0) { /* NaN, negative or infinite (inf - inf is NaN) */\n"
    "                ok = 0;\n"
    "                break;\n"
    "            }\n"
    "            total += v;\n"
    "            nonzero += v > 0;\n"
    "            if (v > 0) lst = i;\n"
    "            wr[i] = repl && i ? wr[i - 1] + v : v;\n"
    "        }\n"
    "        if (!(total > 0) || (!repl && nonzero < ns)) ok = 0;\n"
    "        if (!ok) atomicMin(bad, (unsigned long long)r);\n"
    "        last[r] = lst;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_mn_rows)\n"
    "\n"
    "/* the uniform of element j of the stream: block offset + j / 2, its half j % 2 */\n"
    "static __device__ __forceinline__ double kl_mn_u(const ke_keysched *ks, unsigned long long offset, long long j,\n"
    "                                                 double cap) {\n"
    "    uint32_t l[4];\n"
    "    double v[2];\n"
    "    ke_block(ks, offset + (uint64_t)(j / 2), l);\n"
    "    ke_xf_uniform_f64(l, v, 0.0, 1.0, cap);\n"
    "    return v[j % 2];\n"
    "}\n"
    "\n"
    "/* with replacement: sample j = r * ns + s, the first category whose cdf exceeds u * total */\n"
    "extern \"C\" __global__ void kl_mn_repl(const double *__restrict__ cdf, const long long *__restrict__ last,\n"
    "                                       long long *__restrict__ y, long long rows, long long n, long long ns,\n"
    "                                       unsigned long long seed, unsigned long long offset, double cap) {\n"
    "    ke_keysched ks;\n"
    "    ke_key_schedule((uint32_t)seed, (uint32_t)(seed >> 32), &ks);\n"
    "    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < rows * ns;\n"
    "         j += (long long)gridDim.x * blockDim.x) {\n"
    "        const long long r = j / ns;\n"
    "        const double *wr = cdf + r * n;\n"
    "        const double t = kl_mn_u(&ks, offset, j, cap) * wr[n - 1];\n"
    "        long long lo = 0, hi = n;\n"
    "        while (lo < hi) {\n"
    "            const long long mid = lo + (hi - lo) / 2;\n"
    "            if (wr[mid] > t) hi = mid;\n"
    "            else lo = mid + 1;\n"
    "        }\n"
    "        y[j] = lo < n ? lo : last[r];\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_mn_repl)\n"
    "\n"
    "/* without replacement: category j = r * n + i gets the key ln(1 - u) / p, ninf (-inf) for p = 0 */\n"
    "extern \"C\" __global__ void kl_mn_keys(const double *__restrict__ w, double *__restrict__ key, long long total,\n"
    "                                       unsigned long long seed, unsigned long long offset, double cap,\n"
    "                                       double ninf) {\n"
    "    ke_keysched ks;\n"
    "    ke_key_schedule((uint32_t)seed, (uint32_t)(seed >> 32), &ks);\n"
    "    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < total;\n"
    "         j += (long long)gridDim.x * blockDim.x)\n"
    "        key[j] = w[j] > 0 ? ke_log1m_f64(kl_mn_u(&ks, offset, j, cap)) / w[j] : ninf;\n"
    "}\n"
    "KL_EMU_EXPORT(kl_mn_keys)\n";

char *cn_multinomial_source(kl_dtype dt) {
    const char *T = "float", *ld = "(double)(v)";
    switch (dt) {
    case KL_F64: T = "double"; break;
    case KL_F16: T = "uint16_t", ld = "(double)ke_f16_to_f32(v)"; break;
    case KL_BF16: T = "uint16_t", ld = "(double)ke_bf16_to_f32(v)"; break;
    default: break;
    }
    const char *fmt = "//kiln multinomial kernels\n#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n"
                      "#define KE_INLINE static __forceinline__\n%s\n#define KL_T %s\n#define KL_LD(v) %s\n\n%s";
    const size_t cap = strlen(fmt) + strlen(ku_philox_xf_h) + sizeof mn_kernels + 128;
    char *s = malloc(cap);
    if (s) snprintf(s, cap, fmt, ku_philox_xf_h, T, ld, mn_kernels);
    return s;
}

typedef struct mn_gen {
    kl_dtype dt;
    const char *entry;
} mn_gen;

static int mn_generate(void *ctx, cn_kernel_src *src) {
    const mn_gen *g = ctx;
    memset(src, 0, sizeof *src);
    if (!(src->src = cn_multinomial_source(g->dt)))
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    snprintf(src->name, sizeof src->name, "%s", g->entry);
    return 0;
}

enum { MN_ROWS, MN_REPL, MN_KEYS };
static const char *const mn_entry[] = {"kl_mn_rows", "kl_mn_repl", "kl_mn_keys"};

/* Launches entry `which` of dt's program over `work` items, grid-stride. */
static int mn_launch(const char *op, int dev, kl_dtype dt, int which, void **args, int64_t work) {
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 15; /* multinomial */
    key.op = which;
    key.dev = dev;
    key.dt[0] = (uint8_t)dt;
    mn_gen g = {dt, mn_entry[which]};
    CUfunction fn;
    if (cn_eager_fn(op, &key, mn_generate, &g, &fn) || ku_device_enter(op, dev)) return -1;
    const int64_t blocks = (work + CN_BLOCK - 1) / CN_BLOCK;
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                   block[3] = {work < CN_BLOCK ? (unsigned)(work + 31) / 32 * 32 : CN_BLOCK, 1, 1};
    return ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
}

/* Row r of p (on the device) checked on the host by the CPU's function: its error. */
static int row_error(const char *op, kl_tensor *p, int64_t r, int64_t n, int repl, int64_t ns) {
    int rc = -1;
    double *w = malloc(sizeof *w * (size_t)n);
    kl_scope_begin();
    kl_tensor *row = kl_to_device(kl_contiguous(p->ndim == 2 ? kl_select(p, 0, r) : p), KL_DEVICE_CPU);
    if (!w) {
        ke_err(KL_ERR_OOM, op, "out of memory for %lld probabilities", (long long)n);
    } else if (row) {
        ke_convert_strided(w, KL_F64, 1, ke_data(row), (kl_dtype)row->dtype, 1, n);
        if (!ke_multinomial_check_row(op, w, r, n, repl, ns))
            ke_err(KL_ERR_INTERNAL, op, "row %lld failed the check on the device but not on the host", (long long)r);
    }
    kl_scope_end();
    free(w);
    return rc;
}

int ku_cuda_multinomial(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *p = c->in[0], *y = c->out[0];
    const int64_t rows = p->ndim == 2 ? p->shape[0] : 1, n = p->shape[p->ndim - 1];
    const int64_t ns = ke_attr_multinomial_num_samples(&c->a);
    const int repl = (int)ke_attr_multinomial_replacement(&c->a);
    if (rows == 0) return 0;
    if (!cn_is_contiguous(y)) return ke_err(KL_ERR_INTERNAL, op, "expects a contiguous result");
    const int dev = c->device.index;
    const kl_dtype dt = (kl_dtype)p->dtype;
    const ku_driver *drv = ku_driver_get(op);
    if (!drv || ku_device_enter(op, dev)) return -1;
    CUstream s = ku_current_stream(dev);
    kl_scope_begin();
    int rc = 0;
    kl_tensor *w = kl_empty_on(KL_SHAPE(rows, n), KL_F64, c->device), *last = kl_empty_on(KL_SHAPE(rows), KL_I64, c->device);
    CUdeviceptr bad = ku_malloc(op, dev, sizeof(uint64_t), s);
    if (!w || !last || !bad) rc = -1;
    /* 1. the rows, checked: the first bad one raises the CPU's error before any draw */
    uint64_t first = UINT64_MAX;
    if (!rc) {
        long long ps0 = p->ndim == 2 ? p->stride[0] : 0, ps1 = p->stride[p->ndim - 1], r_ = rows, n_ = n, ns_ = ns;
        void *pp = ke_data(p), *pw = ke_data(w), *pl = ke_data(last), *pb = (void *)(uintptr_t)bad;
        void *args[] = {&pp, &ps0, &ps1, &pw, &pl, &pb, &r_, &n_, &ns_, (void *)&repl};
        rc = KU_CALL(op, drv, MemsetD8Async, bad, 0xFF, sizeof(uint64_t), s) ||
             mn_launch(op, dev, dt, MN_ROWS, args, rows) ||
             KU_CALL(op, drv, MemcpyDtoHAsync, &first, bad, sizeof first, s) || KU_CALL(op, drv, StreamSynchronize, s);
    }
    if (bad) ku_free(op, bad);
    if (!rc && first != UINT64_MAX) rc = row_error(op, p, (int64_t)first, n, repl, ns);
    /* 2. the draws, from the call's seed and offset */
    unsigned long long seed = (uint64_t)ke_attr_seed(&c->a), off = (uint64_t)ke_attr_offset(&c->a);
    double cap = nextafter(1.0, 0.0); /* ke_philox_uniform_f64's over [0, 1) */
    long long r_ = rows, n_ = n, ns_ = ns;
    if (!rc && repl) {
        void *pw = ke_data(w), *pl = ke_data(last), *py = ke_data(y);
        void *args[] = {&pw, &pl, &py, &r_, &n_, &ns_, &seed, &off, &cap};
        rc = mn_launch(op, dev, dt, MN_REPL, args, rows * ns);
    } else if (!rc) {
        kl_tensor *keys = kl_empty_on(KL_SHAPE(rows, n), KL_F64, c->device), *kv = NULL, *ki = NULL;
        if (!keys) rc = -1;
        if (!rc) {
            void *pw = ke_data(w), *pk = ke_data(keys);
            long long total = rows * n;
            double ninf = -INFINITY;
            void *args[] = {&pw, &pk, &total, &seed, &off, &cap, &ninf};
            rc = mn_launch(op, dev, dt, MN_KEYS, args, total);
        }
        /* decreasing key, ties by increasing index: the stable topk's order */
        if (!rc) rc = kl_topk(keys, ns, 1, true, true, &kv, &ki) ? -1 : 0;
        if (!rc) rc = cn_copy_into(c, p->ndim == 2 ? ki : kl_reshape(ki, KL_SHAPE(ns)), y);
    }
    kl_scope_end();
    return rc ? -1 : 0;
}
