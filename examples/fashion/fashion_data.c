/*
 * fashion_data.c — the IDX reader of fashion_data.h. zlib's gzread reads
 * gzip and plain files alike, so the fetch script's .gz files are read in
 * process without unpacking them.
 */
#include "fashion_data.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* Reads exactly len bytes; returns the count read (short at end of file) or -1 on a decompression error. */
static int64_t read_full(gzFile f, void *buf, int64_t len) {
    int64_t got = 0;
    while (got < len) {
        int64_t want = len - got > (1 << 30) ? (1 << 30) : len - got;
        int r = gzread(f, (char *)buf + got, (unsigned)want);
        if (r < 0) return -1;
        if (r == 0) break;
        got += r;
    }
    return got;
}

int idx_load(const char *path, int want_ndim, idx_array *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (!f) return fail(err, errcap, "%s: cannot open", path);
    int rc = -1, zerr;
    uint8_t head[4 + 4 * 3];
    int64_t got = read_full(f, head, 4);
    if (got < 0) {
        fail(err, errcap, "%s: not a valid gzip stream (%s)", path, gzerror(f, &zerr));
        goto done;
    }
    if (got < 4) {
        fail(err, errcap, "%s: truncated: %lld of the 4 magic bytes", path, (long long)got);
        goto done;
    }
    if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != want_ndim) {
        fail(err, errcap, "%s: bad magic %02x %02x %02x %02x (want 00 00 08 %02x: unsigned bytes, %d dims)", path,
             head[0], head[1], head[2], head[3], want_ndim, want_ndim);
        goto done;
    }
    got = read_full(f, head + 4, 4 * want_ndim);
    if (got != 4 * want_ndim) {
        fail(err, errcap, "%s: truncated header: %lld of %d size bytes", path, got < 0 ? 0LL : (long long)got,
             4 * want_ndim);
        goto done;
    }
    int64_t total = 1;
    out->ndim = want_ndim;
    for (int d = 0; d < want_ndim; d++) {
        const uint8_t *b = head + 4 + 4 * d;
        int64_t v = (int64_t)b[0] << 24 | (int64_t)b[1] << 16 | (int64_t)b[2] << 8 | b[3];
        if (v < 1 || v > (1 << 24)) {
            fail(err, errcap, "%s: dimension %d has size %lld (want 1..%d)", path, d, (long long)v, 1 << 24);
            goto done;
        }
        out->dims[d] = v;
        total *= v;
    }
    if (total > ((int64_t)1 << 32)) {
        fail(err, errcap, "%s: %lld elements is more than this reader takes", path, (long long)total);
        goto done;
    }
    if (!(out->data = malloc((size_t)total))) {
        fail(err, errcap, "%s: out of memory for %lld bytes", path, (long long)total);
        goto done;
    }
    got = read_full(f, out->data, total);
    if (got < 0) {
        fail(err, errcap, "%s: corrupt gzip data (%s)", path, gzerror(f, &zerr));
        goto done;
    }
    if (got != total) {
        fail(err, errcap, "%s: truncated: %lld of %lld data bytes", path, (long long)got, (long long)total);
        goto done;
    }
    uint8_t extra;
    got = read_full(f, &extra, 1);
    if (got != 0) {
        fail(err, errcap, got < 0 ? "%s: corrupt gzip data after the elements" : "%s: trailing bytes after the %lld elements",
             path, (long long)total);
        goto done;
    }
    rc = 0;
done:
    gzclose(f);
    if (rc < 0) idx_free(out);
    return rc;
}

void idx_free(idx_array *a) {
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* dir/name.gz, else dir/name when only the plain file exists. */
static void idx_path(const char *dir, const char *prefix, const char *kind, char *buf, size_t cap) {
    struct stat st;
    snprintf(buf, cap, "%s/%s-%s.gz", dir, prefix, kind);
    if (stat(buf, &st) == 0) return;
    snprintf(buf, cap, "%s/%s-%s", dir, prefix, kind);
    if (stat(buf, &st) == 0) return;
    snprintf(buf, cap, "%s/%s-%s.gz", dir, prefix, kind); /* the name the error should give */
}

int fashion_load(const char *dir, const char *prefix, int64_t limit, fashion_set *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    char ipath[4096], lpath[4096];
    idx_path(dir, prefix, "images-idx3-ubyte", ipath, sizeof ipath);
    idx_path(dir, prefix, "labels-idx1-ubyte", lpath, sizeof lpath);
    idx_array im, lb;
    if (idx_load(ipath, 3, &im, err, errcap) < 0) return -1;
    if (idx_load(lpath, 1, &lb, err, errcap) < 0) {
        idx_free(&im);
        return -1;
    }
    int rc = -1;
    if (im.dims[1] != FASHION_SIDE || im.dims[2] != FASHION_SIDE) {
        fail(err, errcap, "%s: images are %lldx%lld, not %dx%d", ipath, (long long)im.dims[1], (long long)im.dims[2],
             FASHION_SIDE, FASHION_SIDE);
        goto done;
    }
    if (lb.dims[0] != im.dims[0]) {
        fail(err, errcap, "%s has %lld labels for the %lld images of %s", lpath, (long long)lb.dims[0],
             (long long)im.dims[0], ipath);
        goto done;
    }
    int64_t n = limit > 0 && limit < im.dims[0] ? limit : im.dims[0];
    for (int64_t i = 0; i < n; i++)
        if (lb.data[i] >= FASHION_CLASSES) {
            fail(err, errcap, "%s: label %lld is %d (want 0..9)", lpath, (long long)i, lb.data[i]);
            goto done;
        }
    out->x = malloc(sizeof(float) * (size_t)(n * FASHION_PIXELS));
    out->y = malloc(sizeof(int64_t) * (size_t)n);
    if (!out->x || !out->y) {
        fail(err, errcap, "out of memory for %lld images", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n * FASHION_PIXELS; i++) out->x[i] = (float)im.data[i] / 255.0f;
    for (int64_t i = 0; i < n; i++) out->y[i] = lb.data[i];
    out->n = n;
    rc = 0;
done:
    idx_free(&im);
    idx_free(&lb);
    if (rc < 0) fashion_free(out);
    return rc;
}

void fashion_free(fashion_set *s) {
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}

uint64_t fashion_rand_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}
