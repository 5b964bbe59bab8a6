/*
 * test_interop.c — printing (kl_format against torch 1.13's repr), .npy
 * files (numpy-written samples, round trips, every malformed-input error,
 * mmap zero-copy) and DLPack (round trips, a hand-built managed tensor,
 * errors). Tables come from tests/gen_print_cases.py and
 * tests/gen_npy_samples.py.
 */
#include "harness.h"

#include <dirent.h>
#include <dlpack/dlpack.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------- */

/* A tensor of dtype dt with value f(i) = a*i + b, or vals when given. */
static kl_tensor *make(kl_dtype dt, int ndim, const int64_t *shape, const double *vals, double a, double b) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        volatile double ai = a * (double)i; /* no fma contraction: match Python's a*i + b */
        v[i] = vals ? vals[i] : ai + b;
    }
    kl_tensor *t = kl_to_dtype(kl_from_data(v, ndim, shape, KL_F64), dt);
    free(v);
    return t;
}

static void assert_same_values(const kl_tensor *a, const kl_tensor *b) {
    assert_int_equal(kl_ndim(a), kl_ndim(b));
    for (int d = 0; d < kl_ndim(a); d++) assert_int_equal(kl_shape(a)[d], kl_shape(b)[d]);
    for (int64_t i = 0; i < kl_numel(a); i++) {
        double x = kt_get(a, i), y = kt_get(b, i);
        if (!(x == y || (isnan(x) && isnan(y)))) {
            print_error("element %lld: %.9g vs %.9g\n", (long long)i, x, y);
            fail();
        }
    }
}


/* Names in the temp dir containing ".tmp." (leftovers of a non-atomic save). */
static int count_temp_leftovers(void) {
    int n = 0;
    DIR *d = opendir(kt_tmp_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    *len = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    *len = fread(p, 1, (size_t)n, f);
    fclose(f);
    return p;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* ---- printing: the torch cases ---------------------------------------------------- */

enum { PV_NONE, PV_T, PV_EXPAND, PV_STEP, PV_META };

typedef struct pcase {
    const char *name;
    kl_dtype dt;
    int ndim;
    int64_t shape[KL_MAX_DIMS];
    int nvals;
    const double *vals;
    double a, b;
    int view;
    int opts[4]; /* precision, threshold, edgeitems, linewidth; -1 = default */
    kl_dtype def;
    const char *expect;
} pcase;

static const pcase print_cases[] = {
#include "data/print_cases.inc"
};

static kl_tensor *build_case(const pcase *c) {
    if (c->view == PV_META) return kl_empty_on(c->ndim, c->shape, c->dt, KL_DEVICE_META);
    kl_tensor *t = make(c->dt, c->ndim, c->shape, c->vals, c->a, c->b);
    switch (c->view) {
    case PV_T: return kl_transpose(t, 0, 1);
    case PV_EXPAND: return kl_expand(t, KL_SHAPE(3, c->shape[1]));
    case PV_STEP: return kl_slice(t, -1, 0, INT64_MAX, 2);
    default: return t;
    }
}

static void format_matches_torch(void **s) {
    (void)s;
    char buf[8192];
    for (size_t k = 0; k < sizeof print_cases / sizeof print_cases[0]; k++) {
        const pcase *c = &print_cases[k];
        kl_tensor *t = build_case(c);
        assert_non_null(t);
        kl_set_print_options(c->opts[0], c->opts[1], c->opts[2], c->opts[3]);
        kl_set_default_dtype(c->def);
        int n = kl_format(t, buf, sizeof buf);
        kl_set_print_options(4, 1000, 3, 80);
        kl_set_default_dtype(KL_F32);
        KT_NO_ERROR();
        if (n != (int)strlen(c->expect) || strcmp(buf, c->expect) != 0) {
            print_error("case %s:\n--- got (%d)\n%s\n--- expected (%d)\n%s\n", c->name, n, buf,
                        (int)strlen(c->expect), c->expect);
            fail();
        }
    }
}

static void format_snprintf_semantics(void **s) {
    (void)s;
    kl_tensor *t = make(KL_F32, KL_SHAPE(2), (const double[]){1, 2}, 0, 0);
    const char *full = "tensor([1., 2.])";
    int len = (int)strlen(full);
    assert_int_equal(kl_format(t, NULL, 0), len);
    char buf[32];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(kl_format(t, buf, 0), len);
    assert_int_equal(buf[0], 'x'); /* cap 0: nothing written */
    assert_int_equal(kl_format(t, buf, 1), len);
    assert_string_equal(buf, "");
    assert_int_equal(kl_format(t, buf, 7), len);
    assert_string_equal(buf, "tensor");
    assert_int_equal(kl_format(t, buf, (size_t)len), len);
    assert_int_equal(strlen(buf), len - 1);
    assert_int_equal(kl_format(t, buf, (size_t)len + 1), len);
    assert_string_equal(buf, full);
}

static void format_special_values(void **s) {
    (void)s;
    char buf[128];
    /* a negative NaN prints "nan" as Python does, not printf's "-nan" */
    kl_tensor *t = make(KL_F64, KL_SHAPE(2), (const double[]){-NAN, 0.5}, 0, 0);
    kl_format(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor([   nan, 0.5000], dtype=float64)");
    /* int64 extremes */
    int64_t v[2] = {INT64_MIN, INT64_MAX};
    kl_format(kl_from_data(v, KL_SHAPE(2), KL_I64), buf, sizeof buf);
    assert_string_equal(buf, "tensor([-9223372036854775808,  9223372036854775807])");
    /* subnormal float32 */
    float sub[2] = {1e-45f, 1.0f};
    kl_format(kl_from_data(sub, KL_SHAPE(2), KL_F32), buf, sizeof buf);
    assert_string_equal(buf, "tensor([1.4013e-45, 1.0000e+00])");
}

static void format_errors(void **s) {
    (void)s;
    char buf[16] = "keep";
    assert_int_equal(kl_format(NULL, buf, sizeof buf), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_format: tensor argument 1 is NULL");
    assert_string_equal(buf, "keep");
    kl_tensor *t = kl_ones(KL_SHAPE(1), KL_F32);
    kl_release(t);
    assert_int_equal(kl_format(t, buf, sizeof buf), -1);
    KT_EXPECT_ERROR(KL_ERR_FREED, "kl_format");
}

static void set_print_options_keeps_on_negative(void **s) {
    (void)s;
    char buf[128];
    kl_tensor *t = make(KL_F32, KL_SHAPE(10), NULL, 1, 0.5);
    kl_set_print_options(2, 5, 1, -1);
    kl_set_print_options(-1, -1, 0, 0); /* all kept */
    kl_format(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor([0.50,  ..., 9.50])");
    kl_set_print_options(4, 1000, 3, 80);
    kl_format(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor([0.5000, 1.5000, 2.5000, 3.5000, 4.5000, 5.5000, 6.5000, 7.5000, 8.5000,\n"
                             "        9.5000])");
}

/* Runs kl_print with stdout captured into out. */
static void capture_print(const kl_tensor *t, char *out, size_t cap) {
    fflush(stdout);
    int saved = dup(1);
    FILE *f = tmpfile();
    assert_non_null(f);
    dup2(fileno(f), 1);
    kl_print(t);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

static void print_writes_stdout(void **s) {
    (void)s;
    char out[256];
    capture_print(make(KL_I32, KL_SHAPE(2, 2), NULL, 1, -1), out, sizeof out);
    assert_string_equal(out, "tensor([[-1,  0],\n        [ 1,  2]], dtype=int32)\n");
    capture_print(NULL, out, sizeof out);
    assert_string_equal(out, "tensor(<error: kl_format: tensor argument 1 is NULL>)\n");
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_format");
}

/* ---- .npy: numpy's samples ------------------------------------------------------------ */

typedef struct nsample {
    const char *file;
    kl_dtype dt;
    int ndim;
    int64_t shape[KL_MAX_DIMS];
    int fortran, canonical;
} nsample;

static const nsample npy_samples[] = {
#include "data/npy/samples.inc"
};

/* The formula of gen_npy_samples.py, flat C-order index i. */
static double sample_value(kl_dtype dt, int64_t i) {
    switch (dt) {
    case KL_I32: return (double)(i * 1000003 - 7);
    case KL_I64: return (double)(i * ((int64_t)1 << 40) - 5);
    case KL_U8: return (double)((i * 37 + 200) % 256);
    case KL_BOOL: return i % 3 == 0;
    default: return (double)(i - 3) * 0.25;
    }
}

static const char *npy_dir(void) {
    static char dir[600];
    if (dir[0]) return dir;
    const char *env = getenv("KT_NPY_DIR");
    char exe[512] = {0}, cand[600];
    const char *rel[] = {"tests/data/npy", "../tests/data/npy", "../../tests/data/npy"};
    if (env) return strcpy(dir, env);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        *strrchr(exe, '/') = 0;
        snprintf(cand, sizeof cand, "%s/../../tests/data/npy/f4_2x3.npy", exe);
        if (access(cand, R_OK) == 0) return (void)snprintf(dir, sizeof dir, "%s/../../tests/data/npy", exe), dir;
    }
    for (size_t k = 0; k < 3; k++) {
        snprintf(cand, sizeof cand, "%s/f4_2x3.npy", rel[k]);
        if (access(cand, R_OK) == 0) return strcpy(dir, rel[k]);
    }
    fail_msg("cannot find tests/data/npy (set KT_NPY_DIR)");
    return NULL;
}

static const char *sample_path(const char *file) {
    static char p[700];
    snprintf(p, sizeof p, "%s/%s", npy_dir(), file);
    return p;
}

static void check_sample(const nsample *sm, const kl_tensor *t) {
    if (!t) {
        print_error("%s: %s\n", sm->file, kl_last_error());
        fail();
    }
    assert_int_equal(kl_dtype_of(t), sm->dt);
    kt_assert_shape(t, sm->ndim, sm->shape);
    for (int64_t i = 0; i < kl_numel(t); i++) {
        if (kt_get(t, i) != sample_value(sm->dt, i)) {
            print_error("%s element %lld: %.17g, expected %.17g\n", sm->file, (long long)i, kt_get(t, i),
                        sample_value(sm->dt, i));
            fail();
        }
    }
    if (sm->fortran && kl_numel(t) > 0) { /* column-major view: dim 0 is the fastest */
        assert_int_equal(kl_stride(t)[0], 1);
        assert_int_equal(kl_stride(t)[1], sm->shape[0]);
    }
}

static void npy_load_samples(void **s) {
    (void)s;
    for (size_t k = 0; k < sizeof npy_samples / sizeof npy_samples[0]; k++) {
        const nsample *sm = &npy_samples[k];
        kl_scope_begin();
        check_sample(sm, kl_load_npy(sample_path(sm->file)));
        size_t len;
        uint8_t *bytes = read_file(sample_path(sm->file), &len);
        assert_non_null(bytes);
        check_sample(sm, kl_load_npy_buffer(bytes, len));
        free(bytes);
        kl_scope_end();
    }
}

/* np.save's bytes, reproduced by kl_save_npy for every sample numpy wrote with its defaults. */
static void npy_save_matches_numpy_bytes(void **s) {
    (void)s;
    int checked = 0;
    for (size_t k = 0; k < sizeof npy_samples / sizeof npy_samples[0]; k++) {
        const nsample *sm = &npy_samples[k];
        if (!sm->canonical) continue;
        kl_scope_begin();
        kl_tensor *t = kl_load_npy(sample_path(sm->file));
        assert_int_equal(kl_save_npy(kt_tmp_path("copy.npy"), t), 0);
        size_t la, lb;
        uint8_t *a = read_file(sample_path(sm->file), &la), *b = read_file(kt_tmp_path("copy.npy"), &lb);
        if (la != lb || memcmp(a, b, la) != 0) {
            print_error("%s: kl_save_npy output differs from numpy's (%zu vs %zu bytes)\n", sm->file, lb, la);
            fail();
        }
        free(a);
        free(b);
        kl_scope_end();
        checked++;
    }
    assert_true(checked >= 10);
    unlink(kt_tmp_path("copy.npy"));
}

static void npy_load_is_zero_copy_and_private(void **s) {
    (void)s;
    size_t len;
    uint8_t *orig = read_file(sample_path("f4_2x3.npy"), &len);
    write_file(kt_tmp_path("z.npy"), orig, len);
    kl_tensor *t = kl_load_npy(kt_tmp_path("z.npy"));
    assert_non_null(t);
    /* the data sits right after the 128-byte header of a page-aligned mapping */
    assert_int_equal((uintptr_t)kl_data_ptr(t) % 4096, 128);
    assert_true(kl_is_contiguous(t));
    kl_fill_inplace(t, 42);
    KT_VALUES(t, 0, 42, 42, 42, 42, 42, 42);
    /* MAP_PRIVATE: the file is untouched */
    size_t len2;
    uint8_t *now = read_file(kt_tmp_path("z.npy"), &len2);
    assert_int_equal(len2, len);
    assert_memory_equal(now, orig, len);
    KT_VALUES(kl_load_npy(kt_tmp_path("z.npy")), 0, -0.75, -0.5, -0.25, 0, 0.25, 0.5);
    free(orig);
    free(now);
    /* the mapping outlives the scope of the first view, not the last */
    kl_scope_begin();
    kl_tensor *row = kl_keep(kl_select(kl_load_npy(kt_tmp_path("z.npy")), 0, 1));
    kl_scope_end();
    unlink(kt_tmp_path("z.npy"));
    KT_VALUES(row, 0, 0, 0.25, 0.5);
}

static void npy_bool_bytes_are_normalized(void **s) {
    (void)s;
    size_t len;
    uint8_t *img = read_file(sample_path("b1_2x3.npy"), &len);
    img[len - 6] = 7;   /* element 0 */
    img[len - 1] = 255; /* element 5 */
    write_file(kt_tmp_path("b.npy"), img, len);
    kl_tensor *a = kl_load_npy(kt_tmp_path("b.npy")), *b = kl_load_npy_buffer(img, len);
    uint8_t *pa = kl_data_ptr(a), *pb = kl_data_ptr(b);
    for (int i = 0; i < 6; i++) {
        assert_true(pa[i] <= 1);
        assert_int_equal(pa[i], pb[i]);
    }
    assert_int_equal(pa[0], 1);
    assert_int_equal(pa[5], 1);
    free(img);
    unlink(kt_tmp_path("b.npy"));
}

static void npy_load_from_pipe(void **s) {
    (void)s;
    const char *fifo = kt_tmp_path("pipe.npy");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        size_t len;
        uint8_t *img = read_file(sample_path("i8_2x3.npy"), &len);
        int fd = open(fifo, O_WRONLY);
        ssize_t w = write(fd, img, len);
        _exit(w == (ssize_t)len ? 0 : 1);
    }
    check_sample(&npy_samples[4], kl_load_npy(fifo));
    int st;
    waitpid(pid, &st, 0);
    assert_int_equal(WEXITSTATUS(st), 0);
    unlink(fifo);
}

/* ---- .npy: saving ----------------------------------------------------------------------- */

static void npy_round_trip_every_dtype(void **s) {
    (void)s;
    for (int dt = 0; dt < KL_NUM_DTYPES; dt++) {
        kl_scope_begin();
        kl_tensor *t = make((kl_dtype)dt, KL_SHAPE(3, 4), NULL, dt == KL_U8 ? 17 : -1.5, dt == KL_U8 ? 3 : 6);
        kl_tensor *views[] = {
            t,
            kl_transpose(t, 0, 1),
            kl_slice(t, 1, 1, INT64_MAX, 2),
            kl_expand(kl_select(t, 0, 2), KL_SHAPE(2, 4)),
            kl_select(kl_select(t, 0, 1), 0, 3), /* 0-dim */
            kl_slice(t, 0, 3, 3, 1),             /* [0, 4] */
            kl_reshape(kl_slice(t, 1, 0, 0, 1), KL_SHAPE(0)),
            kl_reshape(t, KL_SHAPE(1, 2, 1, 3, 1, 2, 1, 1)),
        };
        for (size_t k = 0; k < sizeof views / sizeof views[0]; k++) {
            assert_non_null(views[k]);
            assert_int_equal(kl_save_npy(kt_tmp_path("rt.npy"), views[k]), 0);
            kl_tensor *back = kl_load_npy(kt_tmp_path("rt.npy"));
            assert_non_null(back);
            assert_int_equal(kl_dtype_of(back), dt == KL_BF16 ? KL_F32 : dt);
            assert_true(kl_is_contiguous(back));
            assert_same_values(back, views[k]);
        }
        kl_scope_end();
    }
    assert_int_equal(count_temp_leftovers(), 0);
    unlink(kt_tmp_path("rt.npy"));
}

static void npy_save_overwrites_atomically(void **s) {
    (void)s;
    assert_int_equal(kl_save_npy(kt_tmp_path("o.npy"), kl_ones(KL_SHAPE(1000), KL_F64)), 0);
    assert_int_equal(kl_save_npy(kt_tmp_path("o.npy"), kl_zeros(KL_SHAPE(2), KL_I32)), 0);
    kl_tensor *t = kl_load_npy(kt_tmp_path("o.npy"));
    assert_int_equal(kl_dtype_of(t), KL_I32);
    KT_VALUES(t, 0, 0, 0);
    assert_int_equal(count_temp_leftovers(), 0);
    unlink(kt_tmp_path("o.npy"));
}

static void npy_save_errors(void **s) {
    (void)s;
    kl_tensor *t = kl_ones(KL_SHAPE(2), KL_F32);
    assert_int_equal(kl_save_npy(kt_tmp_path("m.npy"), kl_empty_on(KL_SHAPE(2), KL_F32, KL_DEVICE_META)), KL_ERR_DEVICE);
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "m.npy: cannot save [2] float32 meta: move it to the CPU first");
    assert_int_equal(kl_save_npy(NULL, t), KL_ERR_NULL_ARG);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_save_npy: path is NULL");
    assert_int_equal(kl_save_npy(kt_tmp_path("n.npy"), NULL), KL_ERR_NULL_ARG);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_save_npy: tensor argument 1 is NULL");
    assert_int_equal(kl_save_npy("/nonexistent-dir/x.npy", t), KL_ERR_IO);
    KT_EXPECT_ERROR(KL_ERR_IO, "kl_save_npy: /nonexistent-dir/x.npy: cannot create a temporary file beside it: "
                               "No such file or directory");
    /* the target is a directory: refused before any temporary is made */
    assert_int_equal(mkdir(kt_tmp_path("adir"), 0700), 0);
    assert_int_equal(kl_save_npy(kt_tmp_path("adir"), t), KL_ERR_IO);
    KT_EXPECT_ERROR(KL_ERR_IO, "adir is a directory: a save replaces only a regular file");
    assert_int_equal(count_temp_leftovers(), 0);
    rmdir(kt_tmp_path("adir"));
}

/* ---- .npy: malformed input ------------------------------------------------------------------- */

/* A v1/v2 image with numpy's padding around dict, then dn bytes of data. */
static size_t build_npy(uint8_t *out, int major, const char *dict, size_t dn) {
    size_t prefix = major == 1 ? 10 : 12, dl = strlen(dict), hlen = dl + 1;
    size_t pad = 64 - (prefix + hlen) % 64, total = prefix + hlen + pad;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    uint32_t field = (uint32_t)(hlen + pad);
    for (size_t i = 0; i < prefix - 8; i++) out[8 + i] = (uint8_t)(field >> (8 * i));
    memcpy(out + prefix, dict, dl);
    memset(out + prefix + dl, ' ', pad);
    out[total - 1] = '\n';
    memset(out + total, 0, dn);
    return total + dn;
}

#define D(descr, shape) "{'descr': " descr ", 'fortran_order': False, 'shape': " shape ", }"

static const struct bad_header {
    const char *dict;
    size_t data;
    const char *needle;
} bad_headers[] = {
    {"[1, 2]", 0, "bad header: not a dict literal (starts with '[1, 2]"},
    {"", 0, "not a dict literal (starts with end of header)"},
    {"{'descr': '<f4', 'fortran_order': False}", 0, "bad header: missing key 'shape'"},
    {"{'fortran_order': False, 'shape': (2,)}", 0, "missing key 'descr'"},
    {D("'<f4'", "(2,)") "", 8, ""}, /* valid: the control case */
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8, "bad header: unexpected key 'x'"},
    {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "key 'descr' appears twice"},
    {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", 8, "expected ',' or '}' at ''fortran_ord"},
    {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "expected ':' after 'descr'"},
    {"{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "expected a quoted key at 'descr"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 8, "unexpected 'x' after the dict"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,),", 8, "expected a quoted key at end of header"},
    {"{'descr: '<f4'}", 8, "unexpected key 'descr: '"},
    {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", 8, "unsupported dtype '<f4, '"},
    {"{'descr': 'abcdefghijklmnopqrstuvwxyz', 'fortran_order': False, 'shape': (2,)}", 8, "'descr' too long"},
    {"{'descr': '<f4", 8, "bad header: unterminated 'descr'"},
    {"{'descr': '<\\f4', 'fortran_order': False, 'shape': (2,)}", 8, "escapes in 'descr' are not supported"},
    {D("'<c8'", "(2,)"), 16, "unsupported dtype '<c8' (Kiln loads f4, f8, f2, i4, i8, u1 and b1)"},
    {D("'<i2'", "(2,)"), 4, "unsupported dtype '<i2'"},
    {D("'O'", "(2,)"), 16, "unsupported dtype 'O'"},
    {D("[('a', '<f4')]", "(2,)"), 8, "structured arrays (a 'descr' list) are not supported"},
    {D("5", "(2,)"), 8, "bad header: 'descr' is not a string at '5"},
    {"{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,)}", 8, "'fortran_order' is not True or False at 'maybe"},
    {D("'<f4'", "[2, 3]"), 24, "bad shape: expected a tuple at '[2, 3]"},
    {D("'<f4'", "(2, x)"), 24, "bad shape: expected a dimension at 'x)"},
    {D("'<f4'", "(2,,)"), 24, "bad shape: expected a dimension at ',)"},
    {D("'<f4'", "(2 3)"), 24, "bad shape: expected ',' or ')' at '3)"},
    {D("'<f4'", "(3)"), 12, "bad shape: (3) is an int, not a tuple (write (3,))"},
    {D("'<f4'", "(-1,)"), 0, "bad shape: negative dimension in dim 0"},
    {D("'<f4'", "(2, -3)"), 0, "negative dimension in dim 1"},
    {D("'<f4'", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), 4, "shape has more than 8 dims, Kiln's limit"},
    {D("'<f4'", "(99999999999999999999,)"), 0, "bad shape: dimension 0 does not fit in 64 bits"},
    {D("'<f4'", "(4294967296, 4294967296)"), 0, "shape [4294967296,4294967296] of float32 is too large"},
    {D("'<u1'", "(0, 4611686018427387904, 4)"), 0, "shape [0,4611686018427387904,4] of uint8 is too large"},
    {D("'<f4'", "(4,)"), 8, "truncated data: shape [4] of float32 needs 16 bytes, 8 present"},
    {D("'<f8'", "(2, 3)"), 47, "shape [2,3] of float64 needs 48 bytes, 47 present"},
    {D("'<f4'", "(2"), 8, "bad shape: expected a dimension at '}'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2", 8, "bad shape: expected ',' or ')' at end of header"},
};

static void expect_bad_buffer(const uint8_t *img, size_t len, const char *needle) {
    assert_null(kl_load_npy_buffer(img, len));
    if (kl_last_status() != KL_ERR_FORMAT || !strstr(kl_last_error(), needle) ||
        !strstr(kl_last_error(), "kl_load_npy_buffer: ")) {
        print_error("expected KL_ERR_FORMAT containing \"%s\", got %s: \"%s\"\n", needle,
                    kl_status_name(kl_last_status()), kl_last_error());
        fail();
    }
    kl_clear_error();
    /* the same through a file: the message names it */
    write_file(kt_tmp_path("bad.npy"), img, len);
    assert_null(kl_load_npy(kt_tmp_path("bad.npy")));
    char want[600];
    snprintf(want, sizeof want, "kl_load_npy: %s: ", kt_tmp_path("bad.npy"));
    if (kl_last_status() != KL_ERR_FORMAT || !strstr(kl_last_error(), needle) || !strstr(kl_last_error(), want)) {
        print_error("file: expected \"%s\" ... \"%s\", got \"%s\"\n", want, needle, kl_last_error());
        fail();
    }
    kl_clear_error();
}

static void npy_malformed_headers(void **s) {
    (void)s;
    uint8_t img[512];
    for (size_t k = 0; k < sizeof bad_headers / sizeof bad_headers[0]; k++) {
        for (int major = 1; major <= 2; major++) {
            size_t len = build_npy(img, major, bad_headers[k].dict, bad_headers[k].data);
            if (!bad_headers[k].needle[0]) {
                KT_VALUES(kl_load_npy_buffer(img, len), 0, 0, 0);
                continue;
            }
            expect_bad_buffer(img, len, bad_headers[k].needle);
        }
    }
    unlink(kt_tmp_path("bad.npy"));
}

static void npy_malformed_preamble(void **s) {
    (void)s;
    uint8_t img[512];
    size_t len = build_npy(img, 1, D("'<f4'", "(2,)"), 8);
    expect_bad_buffer(img, 5, "truncated: 5 bytes, shorter than the 10-byte .npy preamble");
    expect_bad_buffer(img, 0, "truncated: 0 bytes");
    expect_bad_buffer(img, 70, "truncated header: header length 118 but only 60 bytes follow");
    img[4] = 'Z';
    expect_bad_buffer(img, len, "bad magic: not a .npy file");
    img[4] = 'P';
    img[6] = 4;
    expect_bad_buffer(img, len, "unsupported format version 4.0 (Kiln reads 1.0, 2.0 and 3.0)");
    img[6] = 1, img[7] = 1;
    expect_bad_buffer(img, len, "unsupported format version 1.1");
    img[7] = 0, img[8] = 0xff, img[9] = 0xff;
    expect_bad_buffer(img, len, "truncated header: header length 65535 but only 126 bytes follow");
    len = build_npy(img, 2, D("'<f4'", "(2,)"), 8);
    expect_bad_buffer(img, 11, "truncated: 11 bytes, shorter than the 12-byte preamble");
    memset(img + 8, 0xff, 4);
    expect_bad_buffer(img, len, "truncated header: header length 4294967295 but only 124 bytes follow");
    unlink(kt_tmp_path("bad.npy"));
    assert_null(kl_load_npy_buffer(NULL, 10));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_load_npy_buffer: buffer pointer is NULL for 10 bytes");
    assert_null(kl_load_npy_buffer(NULL, 0));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "truncated: 0 bytes");
}

static void npy_load_io_errors(void **s) {
    (void)s;
    assert_null(kl_load_npy(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_load_npy: path is NULL");
    assert_null(kl_load_npy("/nonexistent/x.npy"));
    KT_EXPECT_ERROR(KL_ERR_IO, "kl_load_npy: /nonexistent/x.npy: cannot open: No such file or directory");
    assert_null(kl_load_npy(npy_dir()));
    KT_EXPECT_ERROR(KL_ERR_IO, "cannot read: is a directory");
    assert_null(kl_load_npy("/proc/self/status")); /* size 0 in stat: read, not mapped */
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "kl_load_npy: /proc/self/status: bad magic: not a .npy file");
    write_file(kt_tmp_path("empty.npy"), "", 0);
    assert_null(kl_load_npy(kt_tmp_path("empty.npy")));
    KT_EXPECT_ERROR(KL_ERR_FORMAT, "empty.npy: truncated: 0 bytes");
    unlink(kt_tmp_path("empty.npy"));
}

/* ---- DLPack ---------------------------------------------------------------------------------- */

static const struct {
    kl_dtype dt;
    uint8_t code, bits;
} dl_codes[] = {
    {KL_F32, kDLFloat, 32}, {KL_F64, kDLFloat, 64}, {KL_F16, kDLFloat, 16}, {KL_BF16, kDLBfloat, 16},
    {KL_I32, kDLInt, 32},   {KL_I64, kDLInt, 64},   {KL_U8, kDLUInt, 8},    {KL_BOOL, kDLUInt, 8},
};

static void dlpack_round_trip(void **s) {
    (void)s;
    for (size_t k = 0; k < sizeof dl_codes / sizeof dl_codes[0]; k++) {
        kl_scope_begin();
        kl_tensor *base = make(dl_codes[k].dt, KL_SHAPE(3, 4), NULL, 1, -5);
        kl_tensor *views[] = {base, kl_transpose(base, 0, 1), kl_select(base, 1, 2), kl_slice(base, 0, 3, 3, 1),
                              kl_select(kl_select(base, 0, 2), 0, 1)};
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
            kl_tensor *t = views[v];
            DLManagedTensor *m = kl_to_dlpack(t);
            assert_non_null(m);
            const DLTensor *dl = &m->dl_tensor;
            assert_int_equal(dl->device.device_type, kDLCPU);
            assert_int_equal(dl->dtype.code, dl_codes[k].code);
            assert_int_equal(dl->dtype.bits, dl_codes[k].bits);
            assert_int_equal(dl->dtype.lanes, 1);
            assert_int_equal(dl->ndim, kl_ndim(t));
            assert_ptr_equal(dl->data, kl_data_ptr(t));
            assert_int_equal(dl->byte_offset, 0);
            for (int d = 0; d < dl->ndim; d++) {
                assert_int_equal(dl->shape[d], kl_shape(t)[d]);
                assert_int_equal(dl->strides[d], kl_stride(t)[d]);
            }
            kl_tensor *back = kl_from_dlpack(m);
            assert_non_null(back);
            assert_int_equal(kl_dtype_of(back), dl_codes[k].dt == KL_BOOL ? KL_U8 : dl_codes[k].dt);
            assert_ptr_equal(kl_data_ptr(back), kl_data_ptr(t));
            assert_same_values(back, t);
        }
        kl_scope_end(); /* the imports die, calling the exports' deleters */
    }
}

static void *call_deleter(void *m) {
    ((DLManagedTensor *)m)->deleter(m);
    return NULL;
}

static void dlpack_export_outlives_scope(void **s) {
    (void)s;
    DLManagedTensor *m;
    kl_scope_begin();
    m = kl_to_dlpack(make(KL_F32, KL_SHAPE(2, 2), NULL, 1.5, 0));
    kl_scope_end();
    assert_int_equal(kl_live_tensors(), 0); /* the tensor is gone, */
    assert_int_equal(kl_live_storages(), 1); /* its storage is not */
    float *p = (float *)m->dl_tensor.data;
    assert_true(p[3] == 4.5f);
    pthread_t th; /* the deleter runs on any thread */
    assert_int_equal(pthread_create(&th, NULL, call_deleter, m), 0);
    pthread_join(th, NULL);
    assert_int_equal(kl_live_storages(), 0);
}

static int hand_deleted;
static void hand_deleter(DLManagedTensor *m) {
    hand_deleted++;
    free(m->dl_tensor.data);
}

/* A managed tensor as another framework would build it. */
static DLManagedTensor *hand_built(DLManagedTensor *m, int64_t *shape, int64_t *strides, DLDataType dt) {
    float *data = malloc(8 * sizeof(float));
    for (int i = 0; i < 8; i++) data[i] = (float)i * 10;
    memset(m, 0, sizeof *m);
    m->dl_tensor = (DLTensor){data, {kDLCPU, 0}, 2, dt, shape, strides, 2 * sizeof(float)};
    m->deleter = hand_deleter;
    return m;
}

static void dlpack_hand_built(void **s) {
    (void)s;
    DLManagedTensor m;
    int64_t shape[2] = {2, 3}, strides[2] = {1, 2};
    hand_deleted = 0;
    kl_scope_begin();
    kl_tensor *t = kl_from_dlpack(hand_built(&m, shape, NULL, (DLDataType){kDLFloat, 32, 1}));
    KT_VALUES(t, 0, 20, 30, 40, 50, 60, 70); /* byte_offset skips 2 floats; strides NULL = row-major */
    assert_false(kl_shares_storage(t, kl_clone(t)));
    kl_scope_end();
    assert_int_equal(hand_deleted, 1);
    t = kl_from_dlpack(hand_built(&m, shape, strides, (DLDataType){kDLFloat, 32, 1}));
    KT_VALUES(t, 0, 20, 40, 60, 30, 50, 70); /* column-major strides */
    assert_false(kl_is_contiguous(t));
    kl_release(t);
    assert_int_equal(hand_deleted, 2);
    /* DLPack 0.8's kDLBool (code 6) imports as bool */
    kl_scope_begin(); /* b and e live on this stack frame: release before returning */
    uint8_t bits[3] = {1, 0, 1};
    int64_t n3[1] = {3};
    DLManagedTensor b = {.dl_tensor = {bits, {kDLCPU, 0}, 1, {6, 8, 1}, n3, NULL, 0}};
    t = kl_from_dlpack(&b);
    assert_int_equal(kl_dtype_of(t), KL_BOOL);
    KT_VALUES(t, 0, 1, 0, 1);
    /* empty tensor with a NULL data pointer and a byte offset */
    int64_t n0[1] = {0};
    DLManagedTensor e = {.dl_tensor = {NULL, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, n0, NULL, 16}};
    t = kl_from_dlpack(&e);
    assert_int_equal(kl_numel(t), 0);
    assert_int_equal(kl_dtype_of(t), KL_I64);
    kl_scope_end();
}

static void dlpack_errors(void **s) {
    (void)s;
    DLManagedTensor m;
    int64_t shape[2] = {2, 3}, neg[2] = {2, -3}, negst[2] = {3, -1}, big[2] = {(int64_t)1 << 62, 1};
    int64_t shape9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    hand_deleted = 0;
    static const struct {
        DLDataType dt;
        kl_status code;
        const char *needle;
    } bad_dtypes[] = {
        {{kDLFloat, 32, 4}, KL_ERR_DTYPE, "kl_from_dlpack: vector dtypes (lanes 4) are not supported"},
        {{kDLComplex, 64, 1}, KL_ERR_DTYPE, "unsupported dtype (code 5, 64 bits): complex is not supported"},
        {{kDLInt, 16, 1}, KL_ERR_DTYPE, "unsupported dtype (code 0, 16 bits)"},
        {{kDLUInt, 32, 1}, KL_ERR_DTYPE, "unsupported dtype (code 1, 32 bits)"},
        {{kDLOpaqueHandle, 64, 1}, KL_ERR_DTYPE, "unsupported dtype (code 3, 64 bits)"},
    };
    for (size_t k = 0; k < sizeof bad_dtypes / sizeof bad_dtypes[0]; k++) {
        assert_null(kl_from_dlpack(hand_built(&m, shape, NULL, bad_dtypes[k].dt)));
        KT_EXPECT_ERROR(bad_dtypes[k].code, bad_dtypes[k].needle);
        m.deleter(&m); /* on failure the caller still owns m */
    }
    DLDataType f32 = {kDLFloat, 32, 1};
    hand_built(&m, shape, NULL, f32);
    m.dl_tensor.device.device_type = kDLCUDAHost;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "only CPU (kDLCPU) and CUDA (kDLCUDA) tensors can be imported, got device type 3");
    if (!kl_cuda_is_available()) { /* kDLCUDA without a driver (test_cuda_tensor: with one) */
        m.dl_tensor.device.device_type = kDLCUDA;
        assert_null(kl_from_dlpack(&m));
        KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_from_dlpack: CUDA not available: ");
    }
    m.dl_tensor.device.device_type = kDLCPU;
    m.dl_tensor.shape = neg;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "kl_from_dlpack: negative dimension -3 in shape [2,-3]");
    m.dl_tensor.shape = shape;
    m.dl_tensor.strides = negst;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "negative stride -1 in dim 1 is not supported");
    m.dl_tensor.strides = big;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_OVERFLOW, "strides span more than");
    m.dl_tensor.strides = NULL;
    m.dl_tensor.ndim = 9;
    m.dl_tensor.shape = shape9;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_SHAPE, "9 dims; Kiln supports at most 8");
    m.dl_tensor.ndim = 2;
    m.dl_tensor.shape = NULL;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "shape pointer is NULL for 2 dims");
    m.dl_tensor.shape = shape;
    m.dl_tensor.byte_offset = 2;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_ARG, "is not aligned for float32");
    void *data = m.dl_tensor.data;
    m.dl_tensor.data = NULL;
    assert_null(kl_from_dlpack(&m));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_from_dlpack: data pointer is NULL");
    m.dl_tensor.data = data;
    assert_int_equal(hand_deleted, 5);
    m.deleter(&m);
    assert_null(kl_from_dlpack(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_from_dlpack: managed tensor is NULL");
    assert_null(kl_to_dlpack(NULL));
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "kl_to_dlpack: tensor argument 1 is NULL");
    assert_null(kl_to_dlpack(kl_empty_on(KL_SHAPE(2), KL_F32, KL_DEVICE_META)));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "kl_to_dlpack: only CPU and CUDA tensors can be exported, got [2] float32 meta");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(format_matches_torch),
        KT_TEST(format_snprintf_semantics),
        KT_TEST(format_special_values),
        KT_TEST(format_errors),
        KT_TEST(set_print_options_keeps_on_negative),
        KT_TEST(print_writes_stdout),
        KT_TEST(npy_load_samples),
        KT_TEST(npy_save_matches_numpy_bytes),
        KT_TEST(npy_load_is_zero_copy_and_private),
        KT_TEST(npy_bool_bytes_are_normalized),
        KT_TEST(npy_load_from_pipe),
        KT_TEST(npy_round_trip_every_dtype),
        KT_TEST(npy_save_overwrites_atomically),
        KT_TEST(npy_save_errors),
        KT_TEST(npy_malformed_headers),
        KT_TEST(npy_malformed_preamble),
        KT_TEST(npy_load_io_errors),
        KT_TEST(dlpack_round_trip),
        KT_TEST(dlpack_export_outlives_scope),
        KT_TEST(dlpack_hand_built),
        KT_TEST(dlpack_errors),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
