/*
 * test_cuda_cache.c — CUBINs in the on-disk kernel cache (src/codegen_nvrtc/
 * cuda_cache.c over src/eager/diskcache.c): the key changes with each of its
 * four parts (source, architecture, NVRTC version, options), a compile is
 * stored and the next is a hit with the same bytes and ptxas report, a
 * flipped byte or a truncated entry is deleted and recompiled, an unusable
 * or disabled folder still compiles (no cache), and threads compiling the
 * same kernel into an empty folder all succeed. Needs NVRTC (not a GPU):
 * skips with the reason where libnvrtc cannot be loaded.
 */
#include "harness.h"

#include <fcntl.h>
#include <pthread.h>

#include "../src/codegen_nvrtc/cuda_api.h"
#include "../src/eager/diskcache.h"

static const char *OP = "cuda_cache_test";

#define NEED_NVRTC()                                         \
    do {                                                     \
        if (!ku_nvrtc_available(OP)) {                       \
            print_message("skipped: %s\n", kl_last_error()); \
            kl_clear_error();                                \
            skip();                                          \
        }                                                    \
    } while (0)

static const char *SRC = "extern \"C\" __global__ void twice(float *x, int n) {\n"
                         "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "  if (i < n) x[i] *= 2.0f;\n"
                         "}\n";

static char dir[512];

/* A fresh, not yet existing cache folder for this test. */
static void use_dir(const char *name) {
    snprintf(dir, sizeof dir, "%s", kt_tmp_path(name));
    kt_rm_tree(dir);
    setenv("KL_CACHE_DIR", dir, 1);
    ke_cache_reset();
}

/* The one CUBIN entry of the folder (asserts there is exactly one). */
static void the_entry(char *out, size_t cap) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 9 && !strcmp(e->d_name + l - 9, ".cubin.kc")) {
            snprintf(out, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    }
    closedir(d);
    assert_int_equal(n, 1);
}

/* want_cached: 1 a hit, 0 compiled, -1 either. */
static void compile(ku_cubin *c, int want_cached) {
    int rc = ku_nvrtc_compile_cached(OP, SRC, "twice.cu", 90, c);
    if (rc) print_error("%s\n", kl_last_error());
    assert_int_equal(rc, 0);
    assert_true(c->size > 0);
    if (want_cached >= 0) assert_int_equal(c->cached, want_cached);
    assert_non_null(c->log);
}

static void test_key_parts(void **state) {
    (void)state;
    ke_cache_key base, k;
    ku_cubin_key(&base, SRC, 90, "13.0", "-arch=sm_90\n");
    ku_cubin_key(&k, SRC, 90, "13.0", "-arch=sm_90\n");
    assert_memory_equal(base.b, k.b, 32);
    ku_cubin_key(&k, "extern \"C\" __global__ void twice(float *x, int n) {}\n", 90, "13.0", "-arch=sm_90\n");
    assert_memory_not_equal(base.b, k.b, 32);
    ku_cubin_key(&k, SRC, 80, "13.0", "-arch=sm_90\n");
    assert_memory_not_equal(base.b, k.b, 32);
    ku_cubin_key(&k, SRC, 90, "13.1", "-arch=sm_90\n");
    assert_memory_not_equal(base.b, k.b, 32);
    ku_cubin_key(&k, SRC, 90, "13.0", "-arch=sm_90\n-fmad=true\n");
    assert_memory_not_equal(base.b, k.b, 32);
    /* the parts are framed: moving a character from one part to the next changes the key */
    ku_cubin_key(&k, SRC, 90, "13.0-", "arch=sm_90\n");
    assert_memory_not_equal(base.b, k.b, 32);
    /* the options text the compile really uses: per architecture, with the headers */
    char o80[KU_NVRTC_INPUTS_MAX], o90[KU_NVRTC_INPUTS_MAX];
    assert_int_equal(ku_nvrtc_inputs(80, o80, sizeof o80), 0);
    assert_int_equal(ku_nvrtc_inputs(90, o90, sizeof o90), 0);
    assert_non_null(strstr(o90, "-arch=sm_90\n"));
    assert_non_null(strstr(o90, "-fmad=false\n"));
    assert_non_null(strstr(o90, "header vmath.h "));
    assert_non_null(strstr(o90, "header kiln_vmath_impl.h "));
    assert_string_not_equal(o80, o90);
    char tiny[16];
    assert_int_equal(ku_nvrtc_inputs(90, tiny, sizeof tiny), -1);
}

static void test_hit_after_put(void **state) {
    (void)state;
    NEED_NVRTC();
    use_dir("hit");
    ke_cache_stats s0, s1;
    ke_cache_get_stats(&s0);
    ku_cubin a, b;
    compile(&a, 0);
    char path[1024];
    the_entry(path, sizeof path);
    compile(&b, 1);
    ke_cache_get_stats(&s1);
    assert_int_equal(s1.hits, s0.hits + 1);
    assert_int_equal(s1.stores, s0.stores + 1);
    assert_int_equal(a.size, b.size);
    assert_memory_equal(a.image, b.image, a.size);
    assert_int_equal(a.registers, b.registers);
    assert_int_equal(a.spill_bytes, b.spill_bytes);
    assert_int_equal(a.stack_bytes, b.stack_bytes);
    assert_string_equal(b.log, "");
    print_message("cold compile %.1f ms, disk-cache load %.3f ms (loaded machine)\n", a.compile_ms, b.compile_ms);
    /* another architecture is another entry */
    ku_cubin c;
    assert_int_equal(ku_nvrtc_compile_cached(OP, SRC, "twice.cu", 80, &c), 0);
    assert_int_equal(c.cached, 0);
    ku_cubin_free(&a);
    ku_cubin_free(&b);
    ku_cubin_free(&c);
}

/* Damages the entry with fn, then: the next compile is a miss (the entry
 * deleted and counted corrupt), stores a good entry again, and the one after
 * is a hit. */
static void damaged(void (*fn)(const char *path, size_t size)) {
    ku_cubin a, b, c;
    compile(&a, -1);
    char path[1024];
    the_entry(path, sizeof path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    fn(path, (size_t)st.st_size);
    ke_cache_stats s0, s1;
    ke_cache_get_stats(&s0);
    compile(&b, 0);
    ke_cache_get_stats(&s1);
    assert_int_equal(s1.corrupt, s0.corrupt + 1);
    assert_memory_equal(a.image, b.image, a.size);
    compile(&c, 1);
    ku_cubin_free(&a);
    ku_cubin_free(&b);
    ku_cubin_free(&c);
}

static void flip_at(const char *path, size_t off) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char x;
    assert_int_equal(pread(fd, &x, 1, (off_t)off), 1);
    x ^= 0x10;
    assert_int_equal(pwrite(fd, &x, 1, (off_t)off), 1);
    close(fd);
}
static void flip_payload(const char *path, size_t size) { flip_at(path, size - 7); }
static void flip_header(const char *path, size_t size) {
    (void)size;
    flip_at(path, 30); /* inside the stored key */
}
static void truncate_half(const char *path, size_t size) { assert_int_equal(truncate(path, (off_t)(size / 2)), 0); }
static void truncate_header(const char *path, size_t size) {
    (void)size;
    assert_int_equal(truncate(path, 40), 0);
}

static void test_corrupt(void **state) {
    (void)state;
    NEED_NVRTC();
    use_dir("corrupt");
    damaged(flip_payload);
    damaged(flip_header);
    damaged(truncate_half);
    damaged(truncate_header);
}

/* A folder that cannot be made (a file in its way: this holds for root too)
 * and a disabled cache: every compile works, none is cached. */
static void test_no_cache(void **state) {
    (void)state;
    NEED_NVRTC();
    char file[512];
    snprintf(file, sizeof file, "%s", kt_tmp_path("a_file"));
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/cache", file);
    const char *dirs[] = {sub, "off"};
    for (int i = 0; i < 2; i++) {
        setenv("KL_CACHE_DIR", dirs[i], 1);
        ke_cache_reset();
        ku_cubin a, b;
        compile(&a, 0);
        compile(&b, 0);
        KT_NO_ERROR();
        assert_null(ke_cache_dir());
        ku_cubin_free(&a);
        ku_cubin_free(&b);
    }
    unlink(file);
}

/* Threads compiling the same kernel into an empty folder: each store is a
 * temporary file renamed into place, so every load sees a whole entry. */
typedef struct warg {
    ku_cubin c;
    int rc;
} warg;
static void *writer(void *p) {
    warg *w = p;
    w->rc = ku_nvrtc_compile_cached(OP, SRC, "twice.cu", 90, &w->c);
    return NULL;
}

static void test_concurrent_writers(void **state) {
    (void)state;
    NEED_NVRTC();
    use_dir("concurrent");
    enum { NT = 4 };
    pthread_t th[NT];
    warg w[NT];
    memset(w, 0, sizeof w);
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_create(&th[i], NULL, writer, &w[i]), 0);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) {
        assert_int_equal(w[i].rc, 0);
        assert_int_equal(w[i].c.size, w[0].c.size);
        assert_memory_equal(w[i].c.image, w[0].c.image, w[0].c.size);
    }
    char path[1024];
    the_entry(path, sizeof path); /* one entry, no temporary files left */
    DIR *d = opendir(dir);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) files += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, 1);
    ku_cubin c;
    compile(&c, 1);
    ku_cubin_free(&c);
    for (int i = 0; i < NT; i++) ku_cubin_free(&w[i].c);
}

/* A compile error is not cached, and is reported as by ku_nvrtc_compile. */
static void test_errors_not_cached(void **state) {
    (void)state;
    NEED_NVRTC();
    use_dir("errors");
    ku_cubin c;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ku_nvrtc_compile_cached(OP, "__global__ void broken( {", "broken.cu", 90, &c), -1);
        KT_EXPECT_ERROR(KL_ERR_INTERNAL, "NVRTC compile of broken.cu for sm_90 failed");
    }
    assert_int_equal(ku_nvrtc_compile_cached(OP, SRC, "twice.cu", 7, &c), -1);
    KT_EXPECT_ERROR(KL_ERR_ARG, "bad architecture sm_7");
    assert_int_equal(ku_nvrtc_compile_cached(OP, NULL, "x.cu", 90, &c), -1);
    KT_EXPECT_ERROR(KL_ERR_NULL_ARG, "NULL source");
    struct stat st;
    assert_true(stat(dir, &st) != 0); /* nothing was stored: the folder was never made */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(test_key_parts), KT_TEST(test_hit_after_put),      KT_TEST(test_corrupt),
        KT_TEST(test_no_cache),  KT_TEST(test_concurrent_writers), KT_TEST(test_errors_not_cached),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
