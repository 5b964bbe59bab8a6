/*
 * harness.h — shared CMocka helpers for Kiln's suites: every test runs in
 * its own scope and must end with no live tensors or storages, no open scope
 * and no pending error (the leak check on every test).
 */
#ifndef KT_HARNESS_H
#define KT_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* A per-process scratch folder for tests that write files; kt_tmp_cleanup
 * removes it and what is in it (call it at the end of main). */
static char kt_tmp_dir[64];

static inline const char *kt_tmp_path(const char *name) {
    static char bufs[4][512];
    static int k;
    if (!kt_tmp_dir[0]) {
        strcpy(kt_tmp_dir, "/tmp/kiln_test_XXXXXX");
        assert_non_null(mkdtemp(kt_tmp_dir));
    }
    char *b = bufs[k++ % 4];
    snprintf(b, 512, "%s/%s", kt_tmp_dir, name);
    return b;
}

/* Removes a file, or a folder and everything below it (the kernel cache
 * writes subfolders into a test's scratch folder). */
static inline void kt_rm_tree(const char *path) {
    struct stat sb;
    DIR *d = lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? opendir(path) : NULL; /* links are not followed */
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p) kt_rm_tree(p);
    }
    closedir(d);
    rmdir(path);
}

static inline void kt_tmp_cleanup(void) {
    if (kt_tmp_dir[0]) kt_rm_tree(kt_tmp_dir);
}

/* A whole text file, NUL-terminated (malloc'd; NULL if unreadable). */
static inline char *kt_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static inline int kt_setup(void **state) {
    (void)state;
    kl_clear_error();
    kl_scope_begin();
    return 0;
}

static inline int kt_teardown(void **state) {
    (void)state;
    if (kl_scope_depth() != 1) {
        print_error("test left %d scopes open\n", kl_scope_depth() - 1);
        while (kl_scope_depth() > 0) kl_scope_end();
        return -1;
    }
    kl_scope_end();
    int bad = 0;
    if (kl_last_status() != KL_OK) {
        print_error("test left a pending error: %s\n", kl_last_error());
        kl_clear_error();
        bad = 1;
    }
    if (kl_live_tensors() != 0 || kl_live_storages() != 0) {
        print_error("test leaked %lld tensors and %lld storages\n", (long long)kl_live_tensors(),
                    (long long)kl_live_storages());
        bad = 1;
    }
    return bad ? -1 : 0;
}

#define KT_TEST(fn) cmocka_unit_test_setup_teardown(fn, kt_setup, kt_teardown)

/* Asserts the pending error has code `code` and its message contains `needle`, then clears it. */
#define KT_EXPECT_ERROR(code, needle)                                                        \
    do {                                                                                     \
        if (kl_last_status() != (code) || !strstr(kl_last_error(), (needle))) {             \
            print_error("expected %s containing \"%s\", got %s: \"%s\"\n", kl_status_name(code), \
                        (needle), kl_status_name(kl_last_status()), kl_last_error());        \
            fail();                                                                          \
        }                                                                                    \
        kl_clear_error();                                                                    \
    } while (0)

#define KT_NO_ERROR()                                                                 \
    do {                                                                              \
        if (kl_last_status() != KL_OK) {                                              \
            print_error("unexpected error: %s\n", kl_last_error());                  \
            fail();                                                                   \
        }                                                                             \
    } while (0)

/* Element i (row-major over the logical shape) of any tensor, as double. */
static inline double kt_get(const kl_tensor *t, int64_t i) {
    int nd = kl_ndim(t);
    const int64_t *shape = kl_shape(t), *stride = kl_stride(t);
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    const char *p = (const char *)kl_data_ptr(t);
    size_t es = kl_dtype_size(kl_dtype_of(t));
    switch (kl_dtype_of(t)) {
    case KL_F32: { float v; memcpy(&v, p + off * (int64_t)es, 4); return v; }
    case KL_F64: { double v; memcpy(&v, p + off * (int64_t)es, 8); return v; }
    case KL_I32: { int32_t v; memcpy(&v, p + off * (int64_t)es, 4); return v; }
    case KL_I64: { int64_t v; memcpy(&v, p + off * (int64_t)es, 8); return (double)v; }
    case KL_U8: case KL_BOOL: return ((const uint8_t *)p)[off];
    case KL_BF16: {
        uint16_t h;
        memcpy(&h, p + off * (int64_t)es, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case KL_F16: {
        uint16_t h;
        memcpy(&h, p + off * (int64_t)es, 2);
        int e = (h >> 10) & 31, m = h & 1023;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    default: return NAN;
    }
}

/* Asserts t has the given shape. */
static inline void kt_assert_shape(const kl_tensor *t, int ndim, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(kl_ndim(t), ndim);
    for (int d = 0; d < ndim; d++) assert_int_equal(kl_shape(t)[d], shape[d]);
}

/* Asserts t's values equal vals (tolerance tol, NaN equal to NaN). */
static inline void kt_assert_values(const kl_tensor *t, const double *vals, int64_t n, double tol) {
    assert_non_null(t);
    assert_int_equal(kl_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double v = kt_get(t, i), w = vals[i];
        if ((isnan(w) && isnan(v)) || v == w) continue;
        if (!(fabs(v - w) <= tol * (1 + fabs(w)))) {
            print_error("element %lld: got %.9g, expected %.9g\n", (long long)i, v, w);
            fail();
        }
    }
}
#define KT_VALUES(t, tol, ...)                                                                    \
    kt_assert_values((t), (const double[]){__VA_ARGS__}, sizeof((double[]){__VA_ARGS__}) / sizeof(double), (tol))

#endif
