/*
 * fuzz_npy.c — fuzzes the .npy reader (kl_load_npy_buffer) and, on what
 * loads, the printer (kl_format). Every input must either load or fail with
 * a recorded error, leak nothing and never read out of bounds.
 *
 * libFuzzer (build the library with clang -fsanitize=fuzzer-no-link,address
 * so the fuzzer sees its coverage):
 *     clang -g -O1 -fsanitize=fuzzer,address -DKT_LIBFUZZER -Iinclude -I<build>/include \
 *         tests/fuzz_npy.c <build>/libkiln.a -lopenblas -lm -lpthread -o fuzz_npy
 *     ./fuzz_npy -max_total_time=120 corpus/
 * Plain program (a regression test): replays the files named on argv, or
 * else a built-in corpus of mutated headers plus deterministic random
 * mutations of it, and exits non-zero on a leak or an unreported failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static void fuzz_check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_npy: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kl_scope_begin();
    kl_tensor *t = kl_load_npy_buffer(data, size);
    if (t) {
        char buf[256];
        kl_set_print_options(4, 64, 2, 80); /* bound the repr of large loads */
        fuzz_check(kl_format(t, buf, sizeof buf) >= 0, "kl_format failed on a loaded tensor");
        fuzz_check(kl_numel(t) * (int64_t)kl_dtype_size(kl_dtype_of(t)) <= (int64_t)size,
                   "loaded more bytes than the input holds");
    } else {
        fuzz_check(kl_last_status() != KL_OK, "NULL without an error");
    }
    kl_scope_end();
    kl_clear_error();
    fuzz_check(kl_live_tensors() == 0 && kl_live_storages() == 0, "leaked a tensor or storage");
    return 0;
}

#ifndef KT_LIBFUZZER

/* A v1 (or v2) image: preamble, dict padded as numpy does, then n data bytes. */
static size_t image(uint8_t *out, int major, const char *dict, size_t n) {
    size_t prefix = major == 1 ? 10 : 12, dl = strlen(dict), hlen = dl + 1;
    size_t pad = 64 - (prefix + hlen) % 64, total = prefix + hlen + pad;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) out[8 + i] = (uint8_t)((hlen + pad) >> (8 * i));
    memcpy(out + prefix, dict, dl);
    memset(out + prefix + dl, ' ', pad);
    out[total - 1] = '\n';
    for (size_t i = 0; i < n; i++) out[total + i] = (uint8_t)(i * 131 + 7);
    return total + n;
}

static const struct {
    int major;
    const char *dict;
    size_t data;
} seeds[] = {
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24},
    {1, "{'descr': '<f8', 'fortran_order': True, 'shape': (3, 2), }", 48},
    {1, "{'descr': '>f2', 'fortran_order': False, 'shape': (4,), }", 8},
    {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }", 4},
    {1, "{'descr': '>i8', 'fortran_order': True, 'shape': (2, 1, 2), }", 32},
    {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }", 0},
    {1, "{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }", 5},
    {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 2), }", 8},
    {2, "{\"shape\": (3L,), \"descr\": \"<i8\", \"fortran_order\": False}", 24},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0, 4611686018427387904), }", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", 12},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,), }", 8},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4},
    {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8},
    {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4},
    {1, "{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,), }", 4},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 0}", 4},
    {1, "{'descr': '<f4', 'descr': '<f4', 'shape': (1,)}", 4},
    {1, "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", 4},
    {1, "{'descr': '<f4", 0},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 7},
    {1, "[1, 2, 3]", 0},
    {1, "", 0},
    {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,)} junk", 16},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2", 8},
    {1, "{'descr': 'ab\\cd', 'fortran_order': False, 'shape': (2,)}", 8},
};

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            FILE *f = fopen(argv[i], "rb");
            if (!f) {
                perror(argv[i]);
                return 1;
            }
            uint8_t *buf = malloc(1 << 20);
            size_t n = fread(buf, 1, 1 << 20, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, n);
            free(buf);
        }
        printf("fuzz_npy: replayed %d file(s)\n", argc - 1);
        return 0;
    }
    enum { NSEEDS = sizeof seeds / sizeof seeds[0], MUTATIONS = 4000 };
    static uint8_t img[1024], mut[1024];
    int loaded = 0;
    for (int s = 0; s < NSEEDS; s++) {
        size_t len = image(img, seeds[s].major, seeds[s].dict, seeds[s].data);
        /* every prefix (truncations), then the whole image */
        for (size_t n = 0; n <= len; n += n < 16 ? 1 : 7) LLVMFuzzerTestOneInput(img, n);
        kl_scope_begin();
        loaded += kl_load_npy_buffer(img, len) != NULL;
        kl_scope_end();
        kl_clear_error();
        for (int m = 0; m < MUTATIONS; m++) {
            size_t n = len;
            memcpy(mut, img, len);
            int edits = 1 + (int)(next_rand() % 4);
            for (int e = 0; e < edits; e++) {
                size_t at = (size_t)(next_rand() % n);
                switch (next_rand() % 4) {
                case 0: mut[at] = (uint8_t)next_rand(); break;                 /* random byte */
                case 1: mut[at] = (uint8_t)"(),:'\"0123456789-LTF{} "[next_rand() % 23]; break;
                case 2: mut[at] ^= (uint8_t)(1u << (next_rand() % 8)); break;  /* bit flip */
                default: n = at; break;                                       /* truncate */
                }
                if (n == 0) break;
            }
            LLVMFuzzerTestOneInput(mut, n);
        }
    }
    printf("fuzz_npy: %d seeds (%d valid), %d mutations each, no failures\n", NSEEDS, loaded, MUTATIONS);
    return 0;
}
#endif
