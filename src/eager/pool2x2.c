/*
 * pool2x2.c — max_pool2d and max_pool2d_backward over disjoint 2x2 windows
 * (kernel 2, stride 2, no padding, dilation 1: the CNNs' pool) on one f32
 * plane, in explicit 16-lane vectors (GCC/Clang vector extensions: SSE2 to
 * AVX-512 code from one source). conv.c and nn_backward.c call these for
 * f32 where ke_pool_2x2 holds; other dtypes keep the template loops.
 *
 * Why explicit vectors: the CNNs' rows are short (fashion: 13 and 5
 * windows), too short for an auto-vectorized row loop's body, and the
 * scalar loops' data-dependent compares mispredict about half the time
 * (~50 cycles a window). Here 16 windows at a time: the rows' even and odd
 * taps split by shuffles, the same compares in the same order as the
 * template loops (the first maximum in window order wins, a NaN takes over,
 * so the last NaN: PyTorch's choice, and bit for bit the same value and
 * gradient position as the general path), selected with masks.
 *
 * A call takes a run of contiguous planes (a task's share). A row whose last
 * block of 16 windows would run past it reads and writes on into the rows
 * below, and past a plane's end into the next plane's rows, when that stays
 * inside the run (those places are written again, correctly, later in the
 * same call: outputs never alias inputs, the dispatcher and the compiled
 * plan allocate them); near the run's end the block goes through small
 * local buffers instead.
 */
#include "kernels_nn.h"

#include <string.h>

/* Without AVX-512 (-Dnative=false) GCC warns that returning a 64-byte vector
 * changes the ABI: load() is static and inlined, no ABI is crossed (and the
 * vectors are never passed as arguments: PICK and STORE are macros, as
 * the note that accompanies the warning cannot be turned off). */
#pragma GCC diagnostic ignored "-Wpsabi"

enum { VL = 16 };
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define EVEN 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define ODD 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define ZIP_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define ZIP_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31

static inline v16f load(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
#define STORE(p, v)                                                                                    \
    do {                                                                                               \
        v16f v_ = (v);                                                                                 \
        memcpy((p), &v_, sizeof v_);                                                                   \
    } while (0)
#define PICK(m, a, b) ((v16f)(((m) & (v16i)(a)) | (~(m) & (v16i)(b)))) /* m ? a : b, per lane */

/* 16 windows from rows r0, r1 (32 floats each): their maxima, and which tap
 * won (masks: tap 1, 2, 3 took over; tap 0 if none did). */
typedef struct win16 {
    v16f m;
    v16i s1, s2, s3;
} win16;
static inline win16 windows(const float *r0, const float *r1) {
    v16f t0 = load(r0), t1 = load(r0 + VL), u0 = load(r1), u1 = load(r1 + VL);
    v16f a = __builtin_shufflevector(t0, t1, EVEN), b = __builtin_shufflevector(t0, t1, ODD);
    v16f c = __builtin_shufflevector(u0, u1, EVEN), d = __builtin_shufflevector(u0, u1, ODD);
    win16 w;
    w.s1 = (b > a) | (b != b), w.m = PICK(w.s1, b, a);
    w.s2 = (c > w.m) | (c != c), w.m = PICK(w.s2, c, w.m);
    w.s3 = (d > w.m) | (d != d), w.m = PICK(w.s3, d, w.m);
    return w;
}

/* The block of 16 windows from (oh, ow) of a plane, run on past its row, stays
 * inside this call's planes: xn and yn elements are left from the plane's
 * start in x (and gx) and in y (and g). */
static inline int fits(int64_t W, int64_t OW, int64_t xn, int64_t yn, int64_t oh, int64_t ow) {
    return (2 * oh + 1) * W + 2 * (ow + VL) <= xn && oh * OW + ow + VL <= yn;
}

void ke_maxpool2x2_f32(const float *x, float *y, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    for (int64_t pl = 0; pl < planes; pl++, x += H * W, y += OH * OW) {
        int64_t xn = (planes - pl) * H * W, yn = (planes - pl) * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
            float *yr = y + oh * OW;
            for (int64_t ow = 0; ow < OW; ow += VL) {
                if (fits(W, OW, xn, yn, oh, ow)) {
                    STORE(yr + ow, windows(r0 + 2 * ow, r1 + 2 * ow).m);
                    continue;
                }
                size_t n = (size_t)(OW - ow); /* < VL: a full block always fits */
                float a0[2 * VL] = {0}, a1[2 * VL] = {0}, out[VL];
                memcpy(a0, r0 + 2 * ow, 2 * n * sizeof(float));
                memcpy(a1, r1 + 2 * ow, 2 * n * sizeof(float));
                STORE(out, windows(a0, a1).m);
                memcpy(yr + ow, out, n * sizeof(float));
            }
        }
    }
}

/* Row d of gx for 16 windows (its top row if top, else its bottom row): g + 0
 * at each window's maximum (as a zeroed plane plus g: -0 becomes +0), +0 at
 * its other taps. */
static inline void grad_row(const float *r0, const float *r1, const float *g, float *d, int top) {
    win16 w = windows(r0, r1);
    v16i w3 = w.s3, w2 = w.s2 & ~w3, w1 = w.s1 & ~w.s2 & ~w3, w0 = ~(w.s1 | w.s2 | w3);
    v16i gv = (v16i)(load(g) + 0.0f);
    v16i l = top ? w0 & gv : w2 & gv, r = top ? w1 & gv : w3 & gv;
    STORE(d, (v16f)__builtin_shufflevector(l, r, ZIP_LO));
    STORE(d + VL, (v16f)__builtin_shufflevector(l, r, ZIP_HI));
}

/* Each element of x is in at most one window, so gx is written once; the rows
 * and the column past the last window get 0. A block running past the end of
 * a top row writes into the bottom row, and one past a bottom row into the
 * next windows' rows (or the next plane's): so a row's blocks go before the
 * rows below them, the windows' top rows before their bottom rows, a row's
 * trailing column after its blocks, the rows past a plane's last window at
 * the plane's end, the planes in order. */
void ke_maxpool2x2_backward_f32(const float *x, const float *g, float *gx, int64_t planes, int64_t H, int64_t W,
                                int64_t OH, int64_t OW) {
    for (int64_t pl = 0; pl < planes; pl++, x += H * W, g += OH * OW, gx += H * W) {
        int64_t xn = (planes - pl) * H * W, yn = (planes - pl) * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = x + 2 * oh * W, *r1 = r0 + W, *gr = g + oh * OW;
            for (int top = 1; top >= 0; top--) {
                float *d = gx + (2 * oh + !top) * W;
                for (int64_t ow = 0; ow < OW; ow += VL) {
                    if (fits(W, OW, xn, yn, oh, ow)) {
                        grad_row(r0 + 2 * ow, r1 + 2 * ow, gr + ow, d + 2 * ow, top);
                        continue;
                    }
                    size_t n = (size_t)(OW - ow);
                    float a0[2 * VL] = {0}, a1[2 * VL] = {0}, gb[VL] = {0}, out[2 * VL];
                    memcpy(a0, r0 + 2 * ow, 2 * n * sizeof(float));
                    memcpy(a1, r1 + 2 * ow, 2 * n * sizeof(float));
                    memcpy(gb, gr + ow, n * sizeof(float));
                    grad_row(a0, a1, gb, out, top);
                    memcpy(d + 2 * ow, out, 2 * n * sizeof(float));
                }
                for (int64_t iw = 2 * OW; iw < W; iw++) d[iw] = 0;
            }
        }
        if (2 * OH < H) memset(gx + 2 * OH * W, 0, sizeof(float) * (size_t)((H - 2 * OH) * W));
    }
}
