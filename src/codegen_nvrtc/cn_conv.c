/*
 * cn_conv.c — conv2d, max_pool2d and avg_pool2d on CUDA tensors.
 *
 * conv2d is the CPU's lowering (src/eager/conv.c) on the device: an im2col
 * kernel lays the receptive fields of a chunk of samples out as [n, C * kh *
 * kw, OH * OW] (0 in the padding; only bits move, so one kernel per element
 * size), then per group one strided-batched GEMM (ku_gemm: cuBLAS, or the
 * emulated cuBLAS) multiplies the group's [O/G, C/G * kh * kw] weights by
 * every sample's columns, adding onto the bias rows a fill kernel wrote
 * first (beta 1). Floating dtypes only (cuBLAS has no integer GEMM; f16 /
 * bf16 multiply and accumulate in f32, as the CPU). Within the GEMM
 * tolerance of the CPU (a different summation order). conv1d and
 * conv_transpose2d are written with conv2d (their decompositions), and
 * conv2d's derivatives are conv2d / conv_transpose2d of other shapes, so they
 * run here too.
 *
 * Pooling (max, avg, adaptive avg): a thread per output element running the CPU's loop
 * (src/eager/tmpl/pool.h) — the same taps in the same order, so max is
 * exact and float averages are the CPU's bits: max lets NaN win and never
 * counts padding; avg divides by PyTorch's divisor; integer averages
 * truncate. f16 / bf16 compute in f32 (cast on the device before and
 * after), as the CPU's ke_with_compute_dtype.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_api.h"
#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char conv_src[] =
    "extern \"C\" __global__ void kl_im2col(const T *__restrict__ x, T *__restrict__ col, long long total,\n"
    "                                      long long C, long long H, long long W, long long kh, long long kw,\n"
    "                                      long long sh, long long sw, long long ph, long long pw, long long dh,\n"
    "                                      long long dw, long long OH, long long OW) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {\n"
    "        long long t = i;\n"
    "        const long long ow = t % OW; t /= OW;\n"
    "        const long long oh = t % OH; t /= OH;\n"
    "        const long long kj = t % kw; t /= kw;\n"
    "        const long long ki = t % kh; t /= kh; /* t: sample * C + channel */\n"
    "        const long long ih = oh * sh - ph + ki * dh, iw = ow * sw - pw + kj * dw;\n"
    "        col[i] = ih >= 0 && ih < H && iw >= 0 && iw < W ? x[(t * H + ih) * W + iw] : (T)0;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_im2col)\n"
    "/* y[n, o, p] = b[o] over n * O * P elements */\n"
    "extern \"C\" __global__ void kl_bias_rows(T *__restrict__ y, const T *__restrict__ b, long long total,\n"
    "                                         long long O, long long P) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step)\n"
    "        y[i] = b[(i / P) % O];\n"
    "}\n"
    "KL_EMU_EXPORT(kl_bias_rows)\n";

/* tmpl/pool.h's loops, a thread per output element (planes * OH * OW) */
static const char pool_src[] =
    "static __forceinline__ long long first_tap(long long base, long long d) { return base >= 0 ? 0 : (-base - 1) / d + 1; }\n"
    "static __forceinline__ long long end_tap(long long base, long long d, long long n, long long k) {\n"
    "    if (base > n - 1) return 0;\n"
    "    const long long e = (n - 1 - base) / d + 1;\n"
    "    return e < k ? e : k;\n"
    "}\n"
    "extern \"C\" __global__ void kl_maxpool(const T *__restrict__ x, T *__restrict__ y, long long total, long long H,\n"
    "                                       long long W, long long OH, long long OW, long long kh, long long kw,\n"
    "                                       long long sh, long long sw, long long ph, long long pw, long long dh,\n"
    "                                       long long dw, int cip) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    (void)cip;\n"
    "    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {\n"
    "        const long long ow = o % OW, oh = (o / OW) % OH, pl = o / (OW * OH);\n"
    "        const T *xp = x + pl * H * W;\n"
    "        T m = LOWEST;\n"
    "        const long long hb = oh * sh - ph, wb = ow * sw - pw;\n"
    "        const long long i0 = first_tap(hb, dh), i1 = end_tap(hb, dh, H, kh);\n"
    "        const long long j0 = first_tap(wb, dw), j1 = end_tap(wb, dw, W, kw);\n"
    "        for (long long i = i0; i < i1; i++) {\n"
    "            const long long ih = hb + i * dh;\n"
    "            for (long long j = j0; j < j1; j++) {\n"
    "                const T v = xp[ih * W + wb + j * dw];\n"
    "                if (v > m || ISNAN(v)) m = v;\n"
    "            }\n"
    "        }\n"
    "        y[o] = m;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_maxpool)\n"
    "/* max_pool2d_indices (nn_backward.c's loop): the flat index in its plane of each window's maximum, the\n"
    " * first in window order, NaN taking over; H * W for a window without an element of x */\n"
    "static __forceinline__ void span(long long start, long long k, long long dil, long long n, long long *lo,\n"
    "                                 long long *hi) {\n"
    "    const long long end = start + (k - 1) * dil + 1;\n"
    "    *hi = end < n ? end : n;\n"
    "    *lo = start >= 0 ? start : start + (-start + dil - 1) / dil * dil;\n"
    "}\n"
    "extern \"C\" __global__ void kl_maxpool_idx(const T *__restrict__ x, long long *__restrict__ y, long long total,\n"
    "                                           long long H, long long W, long long OH, long long OW, long long kh,\n"
    "                                           long long kw, long long sh, long long sw, long long ph, long long pw,\n"
    "                                           long long dh, long long dw, int cip) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    (void)cip;\n"
    "    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {\n"
    "        const long long ow = o % OW, oh = (o / OW) % OH, pl = o / (OW * OH);\n"
    "        const T *xp = x + pl * H * W;\n"
    "        long long ih0, ih1, iw0, iw1, best = H * W;\n"
    "        span(oh * sh - ph, kh, dh, H, &ih0, &ih1);\n"
    "        span(ow * sw - pw, kw, dw, W, &iw0, &iw1);\n"
    "        if (ih0 < ih1 && iw0 < iw1) {\n"
    "            best = ih0 * W + iw0;\n"
    "            T m = LOWEST;\n"
    "            for (long long ih = ih0; ih < ih1; ih += dh)\n"
    "                for (long long iw = iw0; iw < iw1; iw += dw) {\n"
    "                    const T v = xp[ih * W + iw];\n"
    "                    if (v > m || ISNAN(v)) m = v, best = ih * W + iw;\n"
    "                }\n"
    "        }\n"
    "        y[o] = best;\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_maxpool_idx)\n"
    "extern \"C\" __global__ void kl_avgpool(const T *__restrict__ x, T *__restrict__ y, long long total, long long H,\n"
    "                                       long long W, long long OH, long long OW, long long kh, long long kw,\n"
    "                                       long long sh, long long sw, long long ph, long long pw, long long dh,\n"
    "                                       long long dw, int cip) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    (void)dh; (void)dw;\n"
    "    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {\n"
    "        const long long ow = o % OW, oh = (o / OW) % OH, pl = o / (OW * OH);\n"
    "        const T *xp = x + pl * H * W;\n"
    "        long long hs = oh * sh - ph, ws = ow * sw - pw;\n"
    "        long long he = kh < H + ph - hs ? hs + kh : H + ph;\n"
    "        long long we = kw < W + pw - ws ? ws + kw : W + pw;\n"
    "        const double pool = (double)(he - hs) * (double)(we - ws);\n"
    "        hs = hs < 0 ? 0 : hs, ws = ws < 0 ? 0 : ws;\n"
    "        he = he > H ? H : he, we = we > W ? W : we;\n"
    "        if (hs >= he || ws >= we) {\n"
    "            y[o] = (T)0;\n"
    "            continue;\n"
    "        }\n"
    "        A sum = 0;\n"
    "        for (long long ih = hs; ih < he; ih++)\n"
    "            for (long long iw = ws; iw < we; iw++) sum = ADD(sum, xp[ih * W + iw]);\n"
    "        if (cip && pool > 0x1p62) {\n"
    "            y[o] = (T)((double)sum / pool);\n"
    "            continue;\n"
    "        }\n"
    "        const A div = (A)(cip ? (long long)pool : (he - hs) * (we - ws));\n"
    "        y[o] = (T)(sum / div);\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_avgpool)\n"
    "/* adaptive_avg_pool2d: each output its window's sum in double over the window's size */\n"
    "extern \"C\" __global__ void kl_adaptive(const T *__restrict__ x, T *__restrict__ y, long long total, long long H,\n"
    "                                        long long W, long long OH, long long OW) {\n"
    "    const long long step = (long long)blockDim.x * gridDim.x;\n"
    "    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {\n"
    "        const long long ow = o % OW, oh = (o / OW) % OH, pl = o / (OW * OH);\n"
    "        const T *xp = x + pl * H * W;\n"
    "        const long long hs = (oh * H) / OH, he = ((oh + 1) * H + OH - 1) / OH;\n"
    "        const long long ws = (ow * W) / OW, we = ((ow + 1) * W + OW - 1) / OW;\n"
    "        double s = 0;\n"
    "        for (long long ih = hs; ih < he; ih++)\n"
    "            for (long long iw = ws; iw < we; iw++) s += xp[ih * W + iw];\n"
    "        y[o] = (T)(s / (double)((he - hs) * (we - ws)));\n"
    "    }\n"
    "}\n"
    "KL_EMU_EXPORT(kl_adaptive)\n";

typedef struct cv_gen {
    int pool; /* 0: the conv program (by element size), 1: the pool program (by dtype) */
    int which; /* conv: 0 im2col, 1 bias rows; pool: 0 max, 1 avg, 2 adaptive avg, 3 max's indices */
    kl_dtype dt;
} cv_gen;

static const char *ctype(kl_dtype d) {
    switch (d) {
    case KL_F32: return "float";
    case KL_F64: return "double";
    case KL_I32: return "int32_t";
    case KL_I64: return "long long";
    default: return "uint8_t";
    }
}

static int gen_cv(void *ctx, cn_kernel_src *src) {
    const cv_gen *g = ctx;
    const size_t cap = sizeof pool_src + sizeof conv_src + 1024;
    char *s = malloc(cap);
    if (!s) return ke_err(KL_ERR_OOM, "conv2d", "out of memory for a kernel source");
    int len;
    if (!g->pool) {
        const size_t es = ke_dtypes[g->dt].size;
        len = snprintf(s, cap, "//kiln conv kernels\n#include \"kiln_cuda.h\"\n#define T %s\n%s",
                       es == 8 ? "unsigned long long" : es == 4 ? "unsigned int" : es == 2 ? "uint16_t" : "uint8_t",
                       conv_src);
    } else {
        const int f = ke_is_float(g->dt);
        len = snprintf(s, cap,
                       "//kiln pool kernels\n#include \"kiln_cuda.h\"\n#define T %s\n#define A %s\n#define LOWEST %s\n"
                       "#define ISNAN(v) %s\n#define ADD(s, v) %s\n%s",
                       ctype(g->dt), f ? ctype(g->dt) : "long long",
                       g->dt == KL_F32 ? "__int_as_float((int)0xff800000u)" : g->dt == KL_F64 ? "__longlong_as_double((long long)0xfff0000000000000ull)" : g->dt == KL_I32 ? "(T)(-2147483647 - 1)"
                                          : g->dt == KL_I64 ? "(T)(-9223372036854775807ll - 1)"
                                                            : "(T)0",
                       f ? "((v) != (v))" : "0",
                       f ? "((s) + (v))" : "((long long)((unsigned long long)(s) + (unsigned long long)(long long)(v)))",
                       pool_src);
    }
    if (len < 0 || (size_t)len >= cap) {
        free(s);
        return ke_err(KL_ERR_INTERNAL, "conv2d", "kernel source too long");
    }
    memset(src, 0, sizeof *src);
    src->src = s;
    strcpy(src->name, g->pool ? (g->which == 3 ? "kl_maxpool_idx" : g->which == 2 ? "kl_adaptive" : g->which ? "kl_avgpool" : "kl_maxpool") : g->which ? "kl_bias_rows" : "kl_im2col");
    return 0;
}

int cn_conv_program(int pool, kl_dtype dt, cn_kernel_src *src) {
    cv_gen g = {pool, 0, dt};
    return gen_cv(&g, src);
}

static int cv_fn(const char *op, int dev, int pool, int which, kl_dtype dt, CUfunction *fn) {
    cv_gen g = {pool, which, dt};
    cn_ekey key;
    memset(&key, 0, sizeof key);
    key.kind = 12; /* conv / pool kernels */
    key.op = pool;
    key.dev = dev;
    key.rank = (uint8_t)which;
    key.dt[0] = (uint8_t)(pool ? dt : (kl_dtype)ke_dtypes[dt].size); /* conv: by element size */
    return cn_eager_fn(op, &key, gen_cv, &g, fn);
}

static void grid_of(int64_t n, unsigned grid[3], unsigned block[3]) {
    const int64_t blocks = (n + CN_BLOCK - 1) / CN_BLOCK;
    grid[0] = (unsigned)(blocks > 65535 ? 65535 : blocks), grid[1] = grid[2] = 1;
    block[0] = n < CN_BLOCK ? (unsigned)(n + 31) / 32 * 32 : CN_BLOCK, block[1] = block[2] = 1;
}

/* Column buffers above this size are split into chunks of samples. */
#define CN_COL_BYTES ((int64_t)256 << 20)

int ku_cuda_conv2d(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *out = c->out[0];
    const kl_dtype dt = (kl_dtype)out->dtype;
    if (!ke_is_float(dt)) {
        char b[256];
        return ke_err(KL_ERR_DTYPE, op, "not implemented for %s on CUDA (cuBLAS has no integer GEMM)",
                      ke_fmt_tensor(b, sizeof b, c->in[0]));
    }
    if (ke_numel(out->ndim, out->shape) == 0) return 0;
    const int has_bias = (int)ke_attr_conv2d_has_bias(&c->a), dev = c->device.index;
    const int64_t *st = ke_attr_conv2d_stride(&c->a), *pad = ke_attr_conv2d_padding(&c->a),
                  *dil = ke_attr_conv2d_dilation(&c->a), G = ke_attr_conv2d_groups(&c->a);
    const int b = c->in[0]->ndim == 4;
    const int64_t N = b ? c->in[0]->shape[0] : 1, C = c->in[0]->shape[b], H = c->in[0]->shape[b + 1],
                  W = c->in[0]->shape[b + 2], O = c->in[1]->shape[0], kh = c->in[1]->shape[2],
                  kw = c->in[1]->shape[3], OH = out->shape[b + 1], OW = out->shape[b + 2], P = OH * OW,
                  Cg = C / G, Og = O / G, Kc = Cg * kh * kw, es = (int64_t)ke_dtypes[dt].size;
    kl_scope_begin();
    int rc = 0;
    kl_tensor *x = cn_as_contiguous(c, c->in[0], dt), *w = cn_as_contiguous(c, c->in[1], dt);
    kl_tensor *bias = has_bias ? cn_as_contiguous(c, c->in[2], dt) : NULL, *y = out;
    if (!x || !w || (has_bias && !bias)) rc = -1;
    if (!rc && !cn_is_contiguous(out) && !(y = kl_empty_on(out->ndim, out->shape, dt, c->device))) rc = -1;
    CUfunction f_col = NULL, f_bias = NULL;
    if (!rc) rc = cv_fn(op, dev, 0, 0, dt, &f_col) || cv_fn(op, dev, 0, 1, dt, &f_bias);
    if (!rc) rc = ku_device_enter(op, dev);
    const ku_driver *d = rc ? NULL : ku_driver_get(op);
    if (!rc && !d) rc = -1;
    CUstream s = ku_current_stream(dev);
    unsigned grid[3], block[3];
    /* the bias rows (or zeros) the GEMMs add onto */
    if (!rc && has_bias) {
        void *py = ke_data(y), *pb = ke_data(bias);
        long long total = N * O * P, lO = O, lP = P;
        void *args[] = {&py, &pb, &total, &lO, &lP};
        grid_of(total, grid, block);
        rc = ku_launch(op, f_bias, grid, block, 0, s, args);
    } else if (!rc && (Kc == 0 || !has_bias)) {
        rc = KU_CALL(op, d, MemsetD8Async, (CUdeviceptr)(uintptr_t)ke_data(y), 0, (size_t)(N * O * P * es), s);
    }
    if (!rc && Kc > 0) {
        const int64_t per = C * kh * kw * P; /* column elements per sample */
        int64_t nb = per * es > 0 ? CN_COL_BYTES / (per * es) : N;
        if (nb < 1) nb = 1;
        if (nb > N) nb = N;
        kl_tensor *col = kl_empty_on(1, (int64_t[]){nb * per}, dt, c->device);
        if (!col) rc = -1;
        for (int64_t n0 = 0; n0 < N && !rc; n0 += nb) {
            const int64_t cnt = N - n0 < nb ? N - n0 : nb;
            void *px = (char *)ke_data(x) + n0 * C * H * W * es, *pc = ke_data(col);
            long long a[14] = {cnt * per, C, H, W, kh, kw, st[0], st[1], pad[0], pad[1], dil[0], dil[1], OH, OW};
            void *args[16] = {&px, &pc};
            for (int i = 0; i < 14; i++) args[2 + i] = &a[i];
            grid_of(cnt * per, grid, block);
            rc = ku_launch(op, f_col, grid, block, 0, s, args);
            for (int64_t g = 0; g < G && !rc; g++) {
                ku_matrix A = {(CUdeviceptr)(uintptr_t)ke_data(w) + (CUdeviceptr)(g * Og * Kc * es), Kc, 1, 0};
                ku_matrix B = {(CUdeviceptr)(uintptr_t)ke_data(col) + (CUdeviceptr)(g * Kc * P * es), P, 1, per};
                ku_matrix Cm = {(CUdeviceptr)(uintptr_t)ke_data(y) + (CUdeviceptr)(((n0 * O) + g * Og) * P * es), P,
                                1, O * P};
                rc = ku_gemm(op, dev, dt, cnt, Og, P, Kc, 1.0, A, B, 1.0, Cm, s);
            }
        }
    }
    if (!rc && y != out) rc = cn_copy_into(c, y, out);
    kl_scope_end();
    return rc ? -1 : 0;
}

int ku_cuda_pool2d(ke_call *c) {
    const char *op = ke_opname(c);
    kl_tensor *out = c->out[0], *x0 = c->in[0];
    if (c->op != KE_OP_max_pool2d && c->op != KE_OP_avg_pool2d && c->op != KE_OP_adaptive_avg_pool2d &&
        c->op != KE_OP_max_pool2d_indices)
        return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    /* max_pool2d_indices: int64 positions (out is contiguous int64 already), values compared in dt */
    const int indices = c->op == KE_OP_max_pool2d_indices;
    const int64_t total = ke_numel(out->ndim, out->shape);
    if (total == 0) return 0;
    /* f16 / bf16 computed in f32, as the CPU */
    const kl_dtype dt = x0->dtype == KL_F16 || x0->dtype == KL_BF16 ? KL_F32 : (kl_dtype)x0->dtype;
    const int b = x0->ndim == 4, dev = c->device.index;
    const int adaptive = c->op == KE_OP_adaptive_avg_pool2d;
    static const int64_t none[2] = {1, 1};
    /* adaptive_avg_pool2d has no window attributes (its kernel ignores them) */
    const int64_t *k = adaptive ? none : ke_attr_max_pool2d_kernel_size(&c->a),
                  *s = adaptive ? none : ke_attr_max_pool2d_stride(&c->a),
                  *pad = adaptive ? none : ke_attr_max_pool2d_padding(&c->a),
                  *dil = adaptive ? none : ke_attr_max_pool2d_dilation(&c->a);
    kl_scope_begin();
    int rc = 0;
    kl_tensor *x = cn_as_contiguous(c, x0, dt), *y = out;
    if (!x) rc = -1;
    if (!rc && !indices && (out->dtype != dt || !cn_is_contiguous(out)) &&
        !(y = kl_empty_on(out->ndim, out->shape, dt, c->device)))
        rc = -1;
    CUfunction fn = NULL;
    if (!rc) rc = cv_fn(op, dev, 1, indices ? 3 : adaptive ? 2 : c->op == KE_OP_avg_pool2d, dt, &fn);
    if (!rc) rc = ku_device_enter(op, dev);
    if (!rc) {
        void *px = ke_data(x), *py = ke_data(y);
        long long a[13] = {total,  x0->shape[b + 1], x0->shape[b + 2], out->shape[b + 1], out->shape[b + 2],
                           k[0],   k[1],             s[0],             s[1],              pad[0],
                           pad[1], dil[0],           dil[1]};
        int cip = adaptive ? 0 : (int)ke_attr_max_pool2d_count_include_pad(&c->a);
        void *args[16] = {&px, &py};
        for (int i = 0; i < 13; i++) args[2 + i] = &a[i];
        args[15] = &cip;
        unsigned grid[3], block[3];
        grid_of(total, grid, block);
        rc = ku_launch(op, fn, grid, block, 0, ku_current_stream(dev), args);
    }
    if (!rc && y != out) rc = cn_copy_into(c, y, out);
    kl_scope_end();
    return rc ? -1 : 0;
}
