/*
 * test_objcache.c — the on-disk object cache (src/codegen_llvm/objcache.c)
 * and its SHA-256: standard vectors, store/load round trips, a hit in a fresh
 * process, corrupt / truncated / foreign entries (rejected and removed), an
 * unusable folder, concurrent writers, the empty payload, a disabled cache,
 * folder resolution from the environment and the KL_LOG=cache lines.
 *
 * The binary re-executes itself (/proc/self/exe --child-...) for the checks
 * that need a fresh process; children report through their exit status.
 */
#define _GNU_SOURCE /* mkdtemp, fchmod */
#include "harness.h"

#include "core.h" /* ke_err: a pending error the cache must leave alone */

#include "../src/eager/diskcache.h"
#include "../src/eager/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define HDR 88 /* objcache.c's header size: the tests poke at the format on purpose */

/* ---- helpers ---------------------------------------------------------------- */

static void hex_of(const uint8_t *d, char out[65]) {
    ke_cache_key_hex((const ke_cache_key *)(const void *)d, out);
}

static void fill(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static ke_cache_key key_named(const char *name) {
    ke_cache_key k;
    const void *parts[1] = {name};
    size_t sizes[1] = {strlen(name)};
    ke_cache_key_of(&k, 1, parts, sizes);
    return k;
}

/* Points the cache at a fresh (not yet existing) folder in the test scratch dir. */
static const char *use_dir(const char *name) {
    static char d[512];
    snprintf(d, sizeof d, "%s", kt_tmp_path(name));
    kt_rm_tree(d);
    setenv("KL_CACHE_DIR", d, 1);
    ke_cache_reset();
    return d;
}

static void entry_path(char *out, size_t cap, const char *dir, const ke_cache_key *k) {
    char h[65];
    ke_cache_key_hex(k, h);
    snprintf(out, cap, "%s/%s.o.kc", dir, h);
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

static uint8_t *read_file(const char *p, size_t *n) {
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    uint8_t *b = NULL;
    size_t len = 0;
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    len = (size_t)st.st_size;
    b = malloc(len ? len : 1);
    assert_non_null(b);
    assert_int_equal(read(fd, b, len), (ssize_t)len);
    close(fd);
    *n = len;
    return b;
}

static void write_file(const char *p, const void *b, size_t n) {
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    close(fd);
}

/* Files in dir whose name ends in suffix (and all files if suffix is NULL). */
static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        size_t l = strlen(e->d_name), s = suffix ? strlen(suffix) : 0;
        if (!suffix || (l >= s && strcmp(e->d_name + l - s, suffix) == 0)) n++;
    }
    closedir(d);
    return n;
}

/* Asserts a load of k is a hit returning exactly want[0..n). */
static void expect_hit(const ke_cache_key *k, const uint8_t *want, size_t n) {
    void *obj = (void *)1;
    size_t size = 12345;
    assert_int_equal(ke_cache_load(KE_CACHE_OBJ, k, &obj, &size), 1);
    assert_non_null(obj);
    assert_int_equal(size, n);
    if (n) assert_memory_equal(obj, want, n);
    free(obj);
}

static void expect_miss(const ke_cache_key *k) {
    void *obj = (void *)1;
    size_t size = 12345;
    assert_int_equal(ke_cache_load(KE_CACHE_OBJ, k, &obj, &size), 0);
    assert_null(obj);
    assert_int_equal(size, 0);
}

/* Runs this binary again with args (and extra "NAME=value" env entries, and
 * stderr to err_path if given); returns its exit status (-1 if it died). */
static int run_self(const char *const *args, const char *const *env_add, const char *err_path) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (int i = 0; env_add && env_add[i]; i++) putenv((char *)env_add[i]);
        if (err_path) {
            int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0 || dup2(fd, 2) < 0) _exit(120);
            close(fd);
        }
        char *argv[8] = {"test_objcache"};
        int i = 0;
        for (; args[i] && i < 6; i++) argv[i + 1] = (char *)args[i];
        argv[i + 1] = NULL;
        execv("/proc/self/exe", argv);
        _exit(121);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- SHA-256 (FIPS 180-4 vectors; digests from Python's hashlib) ------------ */

static void expect_digest(const void *p, size_t n, const char *want) {
    uint8_t d[32];
    char h[65];
    ke_sha256(p, n, d);
    hex_of(d, h);
    assert_string_equal(h, want);
    /* The same message fed in uneven pieces must give the same digest. */
    ke_sha256_ctx s;
    ke_sha256_init(&s);
    const uint8_t *b = p;
    for (size_t i = 0, step = 1; i < n; i += step, step = step * 3 % 97 + 1)
        ke_sha256_update(&s, b + i, step < n - i ? step : n - i);
    ke_sha256_update(&s, NULL, 0);
    ke_sha256_final(&s, d);
    hex_of(d, h);
    assert_string_equal(h, want);
}

static void test_sha256_vectors(void **state) {
    (void)state;
    expect_digest("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect_digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu";
    expect_digest(m896, 112, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    expect_digest(a, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
    /* Lengths around the padding boundaries (55/56 bytes mod 64), bytes (7i+3) mod 256. */
    static const struct { size_t n; const char *hex; } edge[] = {
        {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
        {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
        {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
        {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
        {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
        {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
        {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
        {127, "a8d23e75d936f303d248888d9b165ee543f4cbafcad3c9dd2a79bd84faa11d07"},
        {128, "d2742f1f4ac6bb7ca2b239ee18402ba8b3f9f8e652d2a72973c2b9ba11c08cf6"},
    };
    uint8_t buf[128];
    for (int i = 0; i < 128; i++) buf[i] = (uint8_t)(i * 7 + 3);
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) expect_digest(buf, edge[i].n, edge[i].hex);
}

static void test_key_of(void **state) {
    (void)state;
    /* sha256(le64(6) "kernel" le64(0)), from hashlib. */
    ke_cache_key k;
    char h[65];
    const void *parts[2] = {"kernel", NULL};
    size_t sizes[2] = {6, 0};
    ke_cache_key_of(&k, 2, parts, sizes);
    ke_cache_key_hex(&k, h);
    assert_string_equal(h, "07cde08d4816b95c8d727896731bfe218e01cbfc90560fda4c6fe1c84b6ff736");
    /* No parts: the digest of nothing. */
    ke_cache_key_of(&k, 0, NULL, NULL);
    ke_cache_key_hex(&k, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    /* Length framing keeps part boundaries apart. */
    ke_cache_key k1, k2, k3;
    const void *p1[2] = {"ab", "c"}, *p2[2] = {"a", "bc"}, *p3[1] = {"abc"};
    size_t s1[2] = {2, 1}, s2[2] = {1, 2}, s3[1] = {3};
    ke_cache_key_of(&k1, 2, p1, s1);
    ke_cache_key_of(&k2, 2, p2, s2);
    ke_cache_key_of(&k3, 1, p3, s3);
    assert_memory_not_equal(k1.b, k2.b, 32);
    assert_memory_not_equal(k1.b, k3.b, 32);
    ke_cache_key_of(&k2, 2, p1, s1);
    assert_memory_equal(k1.b, k2.b, 32);
}

/* ---- round trips -------------------------------------------------------------- */

static void test_store_load(void **state) {
    (void)state;
    const char *dir = use_dir("rt");
    assert_string_equal(ke_cache_dir(), dir);
    ke_cache_key k = key_named("roundtrip");
    expect_miss(&k); /* the folder does not exist yet: a plain miss */
    assert_false(exists(dir));
    uint8_t obj[10000];
    fill(obj, sizeof obj, 1);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
    char p[600];
    entry_path(p, sizeof p, dir, &k);
    assert_int_equal(file_size(p), HDR + (long)sizeof obj);
    expect_hit(&k, obj, sizeof obj);
    expect_hit(&k, obj, sizeof obj); /* a hit leaves the entry in place */
    /* Overwriting an entry replaces it whole. */
    fill(obj, 777, 2);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, 777);
    expect_hit(&k, obj, 777);
    assert_int_equal(count_files(dir, NULL), 1); /* no temporaries left behind */
    /* The folder may be deleted under a running process: the next store makes it again. */
    kt_rm_tree(dir);
    expect_miss(&k);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, 100);
    expect_hit(&k, obj, 100);
    kt_rm_tree(dir);
}

static void test_empty_payload(void **state) {
    (void)state;
    const char *dir = use_dir("empty");
    ke_cache_key k = key_named("empty");
    ke_cache_store(KE_CACHE_OBJ, &k, NULL, 0);
    char p[600];
    entry_path(p, sizeof p, dir, &k);
    assert_int_equal(file_size(p), HDR);
    expect_hit(&k, NULL, 0);
    kt_rm_tree(dir);
}

/* Child side of test_restart: loads the entry the parent stored. */
static int child_load(void) {
    ke_cache_key k = key_named("restart");
    uint8_t want[5000];
    fill(want, sizeof want, 3);
    void *obj;
    size_t size;
    if (!ke_cache_load(KE_CACHE_OBJ, &k, &obj, &size)) return 2;
    int ok = size == sizeof want && memcmp(obj, want, size) == 0;
    free(obj);
    ke_cache_stats st;
    ke_cache_get_stats(&st);
    return ok && st.hits == 1 ? 0 : 3;
}

static void test_restart(void **state) {
    (void)state;
    const char *dir = use_dir("restart");
    ke_cache_key k = key_named("restart");
    uint8_t obj[5000];
    fill(obj, sizeof obj, 3);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
    const char *args[] = {"--child-load", NULL};
    assert_int_equal(run_self(args, NULL, NULL), 0);
    kt_rm_tree(dir);
    assert_int_equal(run_self(args, NULL, NULL), 2); /* and a plain miss once it is gone */
}

/* ---- bad entries ---------------------------------------------------------------- */

/* Stores a fresh entry for k and returns the file's bytes. */
static uint8_t *fresh_entry(const ke_cache_key *k, const char *p, size_t n, size_t *len) {
    uint8_t *obj = malloc(n);
    assert_non_null(obj);
    fill(obj, n, 4);
    ke_cache_store(KE_CACHE_OBJ, k, obj, n);
    free(obj);
    return read_file(p, len);
}

static void expect_rejected(const ke_cache_key *k, const char *p) {
    ke_cache_stats a, b;
    ke_cache_get_stats(&a);
    expect_miss(k);
    ke_cache_get_stats(&b);
    assert_int_equal(b.corrupt, a.corrupt + 1);
    assert_false(exists(p));
}

static void test_corrupt(void **state) {
    (void)state;
    const char *dir = use_dir("corrupt");
    ke_cache_key k = key_named("corrupt");
    char p[600];
    entry_path(p, sizeof p, dir, &k);
    size_t n = 300, len;
    uint8_t *good = fresh_entry(&k, p, n, &len);
    assert_int_equal(len, HDR + n);
    /* Every header byte is checked, and payload bytes through the digest. */
    size_t pos[HDR + 4];
    int npos = 0;
    for (size_t i = 0; i < HDR; i++) pos[npos++] = i;
    pos[npos++] = HDR, pos[npos++] = HDR + 1, pos[npos++] = HDR + n / 2, pos[npos++] = HDR + n - 1;
    for (int i = 0; i < npos; i++) {
        uint8_t *bad = malloc(len);
        assert_non_null(bad);
        memcpy(bad, good, len);
        bad[pos[i]] ^= 0x10;
        write_file(p, bad, len);
        free(bad);
        expect_rejected(&k, p);
    }
    /* After all that, a new store works again. */
    write_file(p, good, len);
    uint8_t obj[300];
    fill(obj, n, 4);
    expect_hit(&k, obj, n);
    free(good);
    kt_rm_tree(dir);
}

/* A FIFO at an entry's path made the load block in open (kl_fn_call hung);
 * a link there is not followed. Both are misses, and neither is removed. */
static void test_not_regular(void **state) {
    (void)state;
    const char *dir = use_dir("notreg");
    assert_int_equal(mkdir(dir, 0755), 0);
    ke_cache_key k = key_named("fifo"), k2 = key_named("link");
    char p[600], p2[600], target[700];
    entry_path(p, sizeof p, dir, &k);
    entry_path(p2, sizeof p2, dir, &k2);
    assert_int_equal(mkfifo(p, 0644), 0);
    expect_miss(&k);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    /* a valid entry reached through a link is still refused */
    uint8_t obj[64];
    fill(obj, sizeof obj, 9);
    ke_cache_store(KE_CACHE_OBJ, &k2, obj, sizeof obj);
    snprintf(target, sizeof target, "%s.real", p2);
    assert_int_equal(rename(p2, target), 0);
    assert_int_equal(symlink(target, p2), 0);
    expect_miss(&k2);
    assert_int_equal(lstat(p2, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    kt_rm_tree(dir);
}

static void test_truncated(void **state) {
    (void)state;
    const char *dir = use_dir("trunc");
    ke_cache_key k = key_named("truncated");
    char p[600];
    entry_path(p, sizeof p, dir, &k);
    size_t n = 1000, len;
    uint8_t *good = fresh_entry(&k, p, n, &len);
    size_t cuts[HDR + 4];
    int ncut = 0;
    for (size_t i = 0; i < HDR; i++) cuts[ncut++] = i;
    cuts[ncut++] = HDR, cuts[ncut++] = HDR + 1, cuts[ncut++] = HDR + n / 3, cuts[ncut++] = HDR + n - 1;
    for (int i = 0; i < ncut; i++) {
        write_file(p, good, cuts[i]);
        expect_rejected(&k, p);
    }
    /* A byte too many is as wrong as one too few. */
    uint8_t *longer = malloc(len + 1);
    assert_non_null(longer);
    memcpy(longer, good, len);
    longer[len] = 0;
    write_file(p, longer, len + 1);
    expect_rejected(&k, p);
    free(longer);
    free(good);
    kt_rm_tree(dir);
}

static void test_foreign(void **state) {
    (void)state;
    const char *dir = use_dir("foreign");
    ke_cache_key k = key_named("foreign"), other = key_named("other");
    char p[600], q[600];
    entry_path(p, sizeof p, dir, &k);
    entry_path(q, sizeof q, dir, &other);
    /* Some other program's file under our name. */
    uint8_t obj[64];
    fill(obj, sizeof obj, 5);
    ke_cache_store(KE_CACHE_OBJ, &other, obj, sizeof obj); /* makes the folder */
    const char text[] = "this is not a cache entry, but it is long enough to cover the whole header......\n";
    write_file(p, text, sizeof text - 1);
    expect_rejected(&k, p);
    /* A valid entry for another key, renamed to ours. */
    assert_int_equal(rename(q, p), 0);
    expect_rejected(&k, p);
    /* A folder where the entry should be: a miss, left alone, no crash. */
    assert_int_equal(mkdir(p, 0700), 0);
    expect_miss(&k);
    assert_true(exists(p));
    ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj); /* rename fails: logged only */
    KT_NO_ERROR();
    rmdir(p);
    kt_rm_tree(dir);
}

/* ---- unusable and disabled -------------------------------------------------------- */

static void test_unusable_dir(void **state) {
    (void)state;
    /* Tests run as root, so permissions do not stop writes: put a file in the way. */
    const char *file = kt_tmp_path("plain_file");
    write_file(file, "x", 1);
    char d[600];
    snprintf(d, sizeof d, "%s/cache", file);
    const char *dirs[2] = {d, file};
    for (int i = 0; i < 2; i++) {
        setenv("KL_CACHE_DIR", dirs[i], 1);
        ke_cache_reset();
        assert_string_equal(ke_cache_dir(), dirs[i]); /* not known to be bad until used */
        ke_cache_key k = key_named("unusable");
        uint8_t obj[32] = {1, 2, 3};
        ke_cache_stats a, b;
        ke_cache_get_stats(&a);
        ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
        KT_NO_ERROR();
        assert_null(ke_cache_dir());
        ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
        expect_miss(&k);
        ke_cache_get_stats(&b);
        assert_int_equal(b.stores, a.stores);
        assert_int_equal(b.hits, a.hits);
    }
    assert_int_equal(file_size(file), 1);
    unlink(file);
}

/* The cache never touches the caller's error record: a pending error stays
 * exactly as it was through hits, misses, rejects and failed stores. */
static void test_error_state_untouched(void **state) {
    (void)state;
    const char *dir = use_dir("errstate");
    ke_err(KL_ERR_ARG, "test", "pending before the cache ran");
    ke_cache_key k = key_named("errstate");
    uint8_t obj[100];
    fill(obj, sizeof obj, 9);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
    expect_hit(&k, obj, sizeof obj);
    char p[600];
    entry_path(p, sizeof p, dir, &k);
    write_file(p, "junk", 4);
    expect_rejected(&k, p);
    assert_int_equal(mkdir(p, 0700), 0);
    ke_cache_store(KE_CACHE_OBJ, &k, obj, sizeof obj);
    expect_miss(&k);
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_test: pending before the cache ran");
    kt_rm_tree(dir);
}

static void test_disabled(void **state) {
    (void)state;
    const char *vals[2] = {"", "off"};
    for (int i = 0; i < 2; i++) {
        setenv("KL_CACHE_DIR", vals[i], 1);
        ke_cache_reset();
        assert_null(ke_cache_dir());
        ke_cache_key k = key_named("disabled");
        ke_cache_stats a, b;
        ke_cache_get_stats(&a);
        ke_cache_store(KE_CACHE_OBJ, &k, "abc", 3);
        expect_miss(&k);
        ke_cache_get_stats(&b);
        assert_int_equal(b.stores, a.stores);
        assert_int_equal(b.store_failures, a.store_failures);
        KT_NO_ERROR();
    }
}

/* The folder comes from KL_CACHE_DIR, $XDG_CACHE_HOME/kiln, $HOME/.cache/kiln. */
static void test_dir_resolution(void **state) {
    (void)state;
    const char *names[3] = {"KL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;

    unsetenv("KL_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/somewhere/xdg", 1);
    setenv("HOME", "/home/someone", 1);
    ke_cache_reset();
    assert_string_equal(ke_cache_dir(), "/somewhere/xdg/kiln");
    /* Read once: a change is seen only after a reset. */
    setenv("XDG_CACHE_HOME", "/elsewhere", 1);
    assert_string_equal(ke_cache_dir(), "/somewhere/xdg/kiln");
    /* XDG says relative and empty values are to be ignored. */
    setenv("XDG_CACHE_HOME", "relative/xdg", 1);
    ke_cache_reset();
    assert_string_equal(ke_cache_dir(), "/home/someone/.cache/kiln");
    setenv("XDG_CACHE_HOME", "", 1);
    ke_cache_reset();
    assert_string_equal(ke_cache_dir(), "/home/someone/.cache/kiln");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    ke_cache_reset();
    assert_null(ke_cache_dir());
    setenv("XDG_CACHE_HOME", "/x", 1);
    setenv("KL_CACHE_DIR", "relative/dir", 1); /* taken as given */
    ke_cache_reset();
    assert_string_equal(ke_cache_dir(), "relative/dir");

    for (int i = 0; i < 3; i++) {
        if (saved[i]) setenv(names[i], saved[i], 1);
        else unsetenv(names[i]);
        free(saved[i]);
    }
    ke_cache_reset();
}

/* ---- concurrency ---------------------------------------------------------------- */

enum { ROUNDS = 100 };

/* Child side of test_concurrent: stores the shared key and its own keys,
 * loading between stores; any corrupt sighting or wrong bytes fails. */
static int child_writer(int id) {
    ke_cache_stats st0, st;
    ke_cache_get_stats(&st0); /* counts inherited through fork */
    ke_cache_key shared = key_named("shared");
    uint8_t want[4096], obj[4096];
    fill(want, sizeof want, 100);
    for (int i = 0; i < ROUNDS; i++) {
        ke_cache_store(KE_CACHE_OBJ, &shared, want, sizeof want);
        char name[64];
        snprintf(name, sizeof name, "own-%d-%d", id, i);
        ke_cache_key own = key_named(name);
        size_t n = 100 + (size_t)(i * 37 % 4000);
        fill(obj, n, (uint32_t)(id * 1000 + i));
        ke_cache_store(KE_CACHE_OBJ, &own, obj, n);
        void *got;
        size_t size;
        if (ke_cache_load(KE_CACHE_OBJ, &shared, &got, &size)) {
            int ok = size == sizeof want && memcmp(got, want, size) == 0;
            free(got);
            if (!ok) return 4;
        }
    }
    ke_cache_get_stats(&st);
    return st.corrupt == st0.corrupt && st.store_failures == st0.store_failures &&
                   st.stores - st0.stores == 2 * ROUNDS
               ? 0
               : 5;
}

static void test_concurrent(void **state) {
    (void)state;
    const char *dir = use_dir("concurrent");
    pid_t pids[2];
    for (int c = 0; c < 2; c++) {
        pids[c] = fork();
        assert_true(pids[c] >= 0);
        if (pids[c] == 0) {
            ke_cache_reset();
            _exit(child_writer(c));
        }
    }
    for (int c = 0; c < 2; c++) {
        int st;
        assert_int_equal(waitpid(pids[c], &st, 0), pids[c]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    uint8_t want[4096];
    fill(want, sizeof want, 100);
    ke_cache_key shared = key_named("shared");
    expect_hit(&shared, want, sizeof want);
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < ROUNDS; i++) {
            char name[64];
            snprintf(name, sizeof name, "own-%d-%d", c, i);
            ke_cache_key own = key_named(name);
            size_t n = 100 + (size_t)(i * 37 % 4000);
            fill(want, n, (uint32_t)(c * 1000 + i));
            expect_hit(&own, want, n);
        }
    assert_int_equal(count_files(dir, NULL), 1 + 2 * ROUNDS);
    assert_int_equal(count_files(dir, ".o.kc"), 1 + 2 * ROUNDS);
    kt_rm_tree(dir);
}

/* ---- logs ------------------------------------------------------------------------- */

/* Child side of test_log_lines (KL_LOG=cache, stderr to a file). */
static int child_log(const char *dir) {
    char d[600], p[700], blocked[700];
    snprintf(d, sizeof d, "%s/cache", dir);
    setenv("KL_CACHE_DIR", d, 1);
    ke_cache_key k = key_named("logged"), absent = key_named("absent");
    void *obj;
    size_t size;
    ke_cache_store(KE_CACHE_OBJ, &k, "payload", 7);
    if (!ke_cache_load(KE_CACHE_OBJ, &k, &obj, &size)) return 2;
    free(obj);
    if (ke_cache_load(KE_CACHE_OBJ, &absent, &obj, &size)) return 3;
    entry_path(p, sizeof p, d, &k);
    int fd = open(p, O_WRONLY | O_TRUNC);
    if (fd < 0) return 4;
    close(fd);
    if (ke_cache_load(KE_CACHE_OBJ, &k, &obj, &size)) return 5;
    /* An unusable folder: one "disabled" line however many stores follow. */
    snprintf(blocked, sizeof blocked, "%s/entry-in-the-way/cache", dir);
    char file[700];
    snprintf(file, sizeof file, "%s/entry-in-the-way", dir);
    fd = open(file, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) return 6;
    close(fd);
    setenv("KL_CACHE_DIR", blocked, 1);
    ke_cache_reset();
    for (int i = 0; i < 3; i++) ke_cache_store(KE_CACHE_OBJ, &k, "payload", 7);
    /* A failing write (a folder where the entry goes) must not record an
     * error either: the parent runs this with KL_ABORT_ON_ERROR=1. */
    snprintf(d, sizeof d, "%s/cache2", dir);
    setenv("KL_CACHE_DIR", d, 1);
    ke_cache_reset();
    ke_cache_store(KE_CACHE_OBJ, &absent, "x", 1);
    entry_path(p, sizeof p, d, &k);
    if (mkdir(p, 0700) != 0) return 7;
    ke_cache_store(KE_CACHE_OBJ, &k, "payload", 7);
    if (ke_cache_load(KE_CACHE_OBJ, &k, &obj, &size)) return 8;
    return kl_last_status() == KL_OK ? 0 : 9;
}

static void test_log_lines(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("logs");
    kt_rm_tree(dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    char err[600];
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    const char *args[] = {"--child-log", dir, NULL};
    const char *env[] = {"KL_LOG=cache", "KL_ABORT_ON_ERROR=1", NULL};
    assert_int_equal(run_self(args, env, err), 0);
    size_t n;
    uint8_t *raw = read_file(err, &n);
    char *text = malloc(n + 1);
    assert_non_null(text);
    memcpy(text, raw, n);
    text[n] = 0;
    free(raw);
    char pre[65];
    ke_cache_key k = key_named("logged");
    ke_cache_key_hex(&k, pre);
    pre[16] = 0;
    char line[256];
    snprintf(line, sizeof line, "[kiln:cache] store %s 7 bytes", pre);
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof line, "[kiln:cache] hit %s 7 bytes", pre);
    assert_non_null(strstr(text, line));
    assert_non_null(strstr(text, "[kiln:cache] miss "));
    snprintf(line, sizeof line, "[kiln:cache] corrupt %s: shorter than the header (0 bytes); removed", pre);
    assert_non_null(strstr(text, line));
    int disabled = 0;
    for (const char *s = text; (s = strstr(s, "[kiln:cache] disabled")); s++) disabled++;
    assert_int_equal(disabled, 1);
    int blocked = 0; /* and no other line says why (the "dir <path>" line only announces it) */
    for (const char *s = text; (s = strstr(s, "entry-in-the-way/cache: ")); s++) blocked++;
    assert_int_equal(blocked, 1);
    assert_non_null(strstr(text, "failed: "));
    assert_non_null(strstr(text, ": Is a directory"));
    free(text);
    kt_rm_tree(dir);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--child-load") == 0) return child_load();
    if (argc >= 3 && strcmp(argv[1], "--child-log") == 0) return child_log(argv[2]);
    /* The tests choose their own folders; never touch the user's real cache. */
    setenv("KL_CACHE_DIR", "off", 1);
    const struct CMUnitTest tests[] = {
        KT_TEST(test_sha256_vectors),
        KT_TEST(test_key_of),
        KT_TEST(test_store_load),
        KT_TEST(test_empty_payload),
        KT_TEST(test_restart),
        KT_TEST(test_corrupt),
        KT_TEST(test_truncated),
        KT_TEST(test_not_regular),
        KT_TEST(test_foreign),
        KT_TEST(test_unusable_dir),
        KT_TEST(test_disabled),
        KT_TEST(test_dir_resolution),
        KT_TEST(test_concurrent),
        KT_TEST(test_log_lines),
        KT_TEST(test_error_state_untouched),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (kt_tmp_dir[0]) kt_rm_tree(kt_tmp_dir); /* failed tests leave whole folders behind */
    kt_tmp_cleanup();
    return rc;
}
