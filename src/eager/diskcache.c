/*
 * objcache.c — the on-disk object cache (see diskcache.h for the contract and
 * the file format). The folder is resolved from the environment once per
 * process (or per ke_cache_reset) under a mutex; the file work itself runs
 * outside the lock, which is safe because every store is a temporary file
 * renamed into place and every load reads through one open descriptor.
 */
#include "diskcache.h"

#include "fileio.h"
#include "log.h"
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the file format ------------------------------------------------------ */

enum {
    HDR_MAGIC = 0,    /* 8 bytes "KILNOBJC" */
    HDR_VERSION = 8,  /* u32 LE, CG_FORMAT_VERSION */
    HDR_FLAGS = 12,   /* u32 LE, 0 (reserved: a reader must reject what it does not know) */
    HDR_SIZE = 16,    /* u64 LE payload bytes */
    HDR_KEY = 24,     /* the 32-byte key, so a renamed or misnamed file is caught */
    HDR_DIGEST = 56,  /* SHA-256 of the payload */
    HDR_BYTES = 88
};
#define CG_MAGIC "KILNOBJC"
#define CG_FORMAT_VERSION 1u

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ---- keys ----------------------------------------------------------------- */

void ke_cache_key_of(ke_cache_key *k, int n, const void *const *parts, const size_t *sizes) {
    ke_sha256_ctx s;
    ke_sha256_init(&s);
    for (int i = 0; i < n; i++) {
        uint8_t len[8];
        put_u64(len, sizes[i]);
        ke_sha256_update(&s, len, sizeof len);
        ke_sha256_update(&s, parts[i], sizes[i]);
    }
    ke_sha256_final(&s, k->b);
}

void ke_cache_key_hex(const ke_cache_key *k, char out[65]) {
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hex[k->b[i] >> 4];
        out[2 * i + 1] = hex[k->b[i] & 15];
    }
    out[64] = 0;
}

/* The first 16 hex digits, enough to tell entries apart in a log. */
static void key_prefix(const ke_cache_key *k, char out[17]) {
    char h[65];
    ke_cache_key_hex(k, h);
    memcpy(out, h, 16);
    out[16] = 0;
}

/* ---- the folder ----------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int resolved; /* the environment has been read */
static int enabled;  /* dir is usable (as far as we know) */
static int writable; /* stores go on: off once the folder proved read-only or full (loads continue) */
static int created;  /* dir exists: made or found by this process */
static char *dir;    /* kept until ke_cache_reset, so ke_cache_dir's answer stays valid */

static _Atomic int64_t n_hits, n_misses, n_corrupt, n_stores, n_store_failures;

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 1);
    if (p) {
        memcpy(p, a, la);
        memcpy(p + la, b, lb + 1);
    }
    return p;
}

static void resolve_locked(void) {
    if (resolved) return;
    resolved = 1;
    enabled = created = 0;
    const char *e = getenv("KL_CACHE_DIR"), *why = NULL;
    if (e) {
        if (!e[0] || strcmp(e, "off") == 0) why = "KL_CACHE_DIR is empty or off";
        else dir = join(e, "");
    } else if ((e = getenv("XDG_CACHE_HOME")) && e[0] == '/') { /* XDG: relative values are ignored */
        dir = join(e, "/kiln");
    } else if ((e = getenv("HOME")) && e[0]) {
        dir = join(e, "/.cache/kiln");
    } else {
        why = "none of KL_CACHE_DIR, XDG_CACHE_HOME, HOME is set";
    }
    if (why) {
        ke_log(KE_LOG_CACHE, "disabled: %s", why);
        return;
    }
    if (!dir) {
        ke_log(KE_LOG_CACHE, "disabled: out of memory");
        return;
    }
    enabled = writable = 1;
    ke_log(KE_LOG_CACHE, "dir %s", dir);
}

int ke_make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int bad = mkdir(path, 0700) != 0 && errno != EEXIST;
        int e = errno;
        *p = '/';
        if (bad) return e;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) return errno;
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) return ENOTDIR;
    if (access(path, W_OK | X_OK) != 0) return errno;
    return 0;
}

/* Turns the cache off for this process (until ke_cache_reset): one line. */
static void disable_locked(const char *what, const char *path, int e) {
    if (!enabled) return;
    enabled = 0;
    ke_log(KE_LOG_CACHE, "disabled: %s %s: %s", what, path, strerror(e));
}

/* Stops storing for this process (until ke_cache_reset), one line: a folder
 * that is read-only or full can still serve the entries it holds. */
static void stores_off_locked(const char *what, const char *path, int e) {
    if (!enabled || !writable) return;
    writable = 0;
    ke_log(KE_LOG_CACHE, "stores off: %s %s: %s (compiles go on; entries already there still load)", what, path,
           strerror(e));
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* <dir>/<hex><kind>, malloc'd; NULL when the cache is off, or for a store
 * (create) when stores are. With create, makes the folder first (once per
 * process): if it cannot, a folder that exists still serves loads, anything
 * else disables the cache. */
static char *entry_path(const char *kind, const ke_cache_key *k, int create) {
    char hex[65], *path = NULL;
    ke_cache_key_hex(k, hex);
    pthread_mutex_lock(&mu);
    resolve_locked();
    if (enabled && create && writable && !created) {
        char *tmp = join(dir, "");
        int e = tmp ? ke_make_dirs(tmp) : ENOMEM;
        if (e && e != ENOMEM && is_dir(dir)) stores_off_locked("cannot write to the folder", dir, e);
        else if (e) disable_locked("cannot make or use the folder", dir, e);
        else created = 1;
        free(tmp);
    }
    if (enabled && (!create || writable)) {
        size_t n = strlen(dir) + 1 + 64 + strlen(kind) + 1;
        path = malloc(n);
        if (path) snprintf(path, n, "%s/%s%s", dir, hex, kind);
    }
    pthread_mutex_unlock(&mu);
    return path;
}

const char *ke_cache_dir(void) {
    pthread_mutex_lock(&mu);
    resolve_locked();
    const char *d = enabled ? dir : NULL;
    pthread_mutex_unlock(&mu);
    return d;
}

void ke_cache_reset(void) {
    pthread_mutex_lock(&mu);
    free(dir);
    dir = NULL;
    resolved = enabled = writable = created = 0;
    pthread_mutex_unlock(&mu);
}

void ke_cache_get_stats(ke_cache_stats *s) {
    s->hits = n_hits;
    s->misses = n_misses;
    s->corrupt = n_corrupt;
    s->stores = n_stores;
    s->store_failures = n_store_failures;
}

/* ---- load ----------------------------------------------------------------- */

static int read_full(int fd, void *buf, size_t n) {
    uint8_t *b = buf;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Removes a bad entry, but only if the name still points at the file we read:
 * a writer may have renamed a good entry over it in the meantime. */
static void reject(const char *path, const struct stat *seen, const char *prefix, const char *why) {
    struct stat now;
    int removed = stat(path, &now) == 0 && now.st_dev == seen->st_dev && now.st_ino == seen->st_ino &&
                  unlink(path) == 0;
    n_corrupt++;
    ke_log(KE_LOG_CACHE, "corrupt %s: %s (%lld bytes); %s", prefix, why, (long long)seen->st_size,
           removed ? "removed" : "not removed");
}

int ke_cache_load(const char *kind, const ke_cache_key *k, void **obj, size_t *size) {
    *obj = NULL;
    *size = 0;
    char *path = entry_path(kind, k, 0), pre[17];
    if (!path) return 0;
    key_prefix(k, pre);
    /* O_NONBLOCK: opening a FIFO planted at the path would block until a
     * writer came (kl_fn_call hung); O_NOFOLLOW: an entry is never a link.
     * The type is checked before anything is read. */
    int hit = 0, fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat st;
    uint8_t hdr[HDR_BYTES], digest[32];
    uint8_t *payload = NULL;
    const char *why = NULL;
    uint64_t psize = 0;
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) ke_log(KE_LOG_CACHE, "miss %s", pre);
        else ke_log(KE_LOG_CACHE, "miss %s: %s: %s", pre, path, strerror(errno));
        goto done;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ke_log(KE_LOG_CACHE, "miss %s: %s is not a readable regular file", pre, path);
        goto done;
    }
    if ((uint64_t)st.st_size < HDR_BYTES || read_full(fd, hdr, HDR_BYTES) != 0) why = "shorter than the header";
    else if (memcmp(hdr + HDR_MAGIC, CG_MAGIC, 8) != 0) why = "not a Kiln cache entry (magic)";
    else if (get_u32(hdr + HDR_VERSION) != CG_FORMAT_VERSION) why = "other format version";
    else if (get_u32(hdr + HDR_FLAGS) != 0) why = "unknown flags";
    else if (memcmp(hdr + HDR_KEY, k->b, 32) != 0) why = "header holds another key";
    else if ((psize = get_u64(hdr + HDR_SIZE)) != (uint64_t)st.st_size - HDR_BYTES) why = "payload size mismatch";
    else if (psize > SIZE_MAX - 1) why = "payload too large";
    if (why) {
        reject(path, &st, pre, why);
        goto done;
    }
    payload = malloc(psize ? (size_t)psize : 1);
    if (!payload) {
        ke_log(KE_LOG_CACHE, "miss %s: out of memory for %llu bytes", pre, (unsigned long long)psize);
        goto done;
    }
    if (read_full(fd, payload, (size_t)psize) != 0) {
        reject(path, &st, pre, "payload unreadable or truncated");
        goto done;
    }
    ke_sha256(payload, (size_t)psize, digest);
    if (memcmp(digest, hdr + HDR_DIGEST, 32) != 0) {
        reject(path, &st, pre, "payload digest mismatch");
        goto done;
    }
    hit = 1;
    *obj = payload;
    *size = (size_t)psize;
    payload = NULL;
    ke_log(KE_LOG_CACHE, "hit %s %zu bytes", pre, *size);
done:
    if (fd >= 0) close(fd);
    free(payload);
    free(path);
    if (hit) n_hits++;
    else n_misses++;
    return hit;
}

/* ---- store ---------------------------------------------------------------- */

/* errno values that mean the folder is read-only or unusable, not this one
 * write: stores stop for the process. */
static int folder_error(int e) { return e == EACCES || e == EPERM || e == EROFS || e == ENOTDIR; }
/* ... or that it is full: the next stores would fail alike (and each would
 * write part of an entry before failing). */
static int full_error(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

void ke_cache_store(const char *kind, const ke_cache_key *k, const void *obj, size_t size) {
    char *path = entry_path(kind, k, 1), pre[17];
    if (!path) return;
    key_prefix(k, pre);
    uint8_t hdr[HDR_BYTES];
    memcpy(hdr + HDR_MAGIC, CG_MAGIC, 8);
    put_u32(hdr + HDR_VERSION, CG_FORMAT_VERSION);
    put_u32(hdr + HDR_FLAGS, 0);
    put_u64(hdr + HDR_SIZE, size);
    memcpy(hdr + HDR_KEY, k->b, 32);
    ke_sha256(obj, size, hdr + HDR_DIGEST);
    const void *parts[2] = {hdr, obj};
    const size_t sizes[2] = {HDR_BYTES, size};
    int e = ke_write_file_atomic_quiet(path, 2, parts, sizes);
    if (e == ENOENT) {
        /* Someone removed the folder since we made it (emptying a cache by
         * deleting it is allowed): make it again, once. */
        free(path);
        pthread_mutex_lock(&mu);
        created = 0;
        pthread_mutex_unlock(&mu);
        path = entry_path(kind, k, 1);
        if (!path) {
            n_store_failures++;
            return;
        }
        e = ke_write_file_atomic_quiet(path, 2, parts, sizes);
    }
    if (e) {
        n_store_failures++;
        ke_log(KE_LOG_CACHE, "store %s failed: %s: %s", pre, path, strerror(e));
        if (folder_error(e) || full_error(e)) {
            pthread_mutex_lock(&mu);
            stores_off_locked(full_error(e) ? "no room in" : "cannot write to", dir, e);
            pthread_mutex_unlock(&mu);
        }
    } else {
        n_stores++;
        ke_log(KE_LOG_CACHE, "store %s %zu bytes", pre, size);
    }
    free(path);
}
