/*
 * digits_data.c — reads digits.csv.gz with zlib (in process: a corrupt or
 * truncated file fails its CRC check with a clear message instead of yielding
 * half a data set, and nothing depends on a gzip binary or a shell) and makes
 * the fixed train/test split. Every line is checked: 65 integers, pixels in
 * 0..16, labels in 0..9, exactly 1,797 rows.
 */
#include "digits_data.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* The whole decompressed file, NUL-terminated; NULL with a message on failure. */
static char *read_gz(const char *path, size_t *len, char *err, size_t cap) {
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fail(err, cap, "%s: %s", path, errno ? strerror(errno) : "cannot open");
        return NULL;
    }
    size_t n = 0, room = 1 << 18;
    char *buf = malloc(room);
    for (;;) {
        if (!buf) {
            gzclose(f);
            fail(err, cap, "%s: out of memory", path);
            return NULL;
        }
        if (room - n < 65536) {
            char *bigger = realloc(buf, room * 2);
            if (!bigger) free(buf);
            buf = bigger;
            room *= 2;
            continue;
        }
        int got = gzread(f, buf + n, (unsigned)(room - n - 1));
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            fail(err, cap, "%s: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
            free(buf);
            gzclose(f);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    int rc = gzclose(f);
    if (rc != Z_OK) { /* e.g. a truncated stream or a CRC mismatch */
        fail(err, cap, "%s: corrupt gzip data (zlib status %d)", path, rc);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int digits_load(const char *path, digits_set *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    size_t len;
    char *text = read_gz(path, &len, err, errcap);
    if (!text) return -1;
    float *x = malloc(sizeof(float) * DIGITS_ROWS * DIGITS_FEATURES);
    int64_t *y = malloc(sizeof(int64_t) * DIGITS_ROWS);
    if (!x || !y) goto oom;

    int64_t row = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        if (*p == '\n' || *p == '\r') { /* blank lines and CRLF endings are fine */
            p++;
            continue;
        }
        if (row == DIGITS_ROWS) {
            fail(err, errcap, "%s: more than %d rows", path, DIGITS_ROWS);
            goto bad;
        }
        for (int c = 0; c <= DIGITS_FEATURES; c++) {
            int v = 0, digits = 0;
            while (*p >= '0' && *p <= '9' && digits < 4) v = v * 10 + (*p++ - '0'), digits++;
            /* The file has integers; tolerate "3.0" as written by other tools. */
            if (*p == '.') {
                p++;
                while (*p == '0') p++;
            }
            int last = c == DIGITS_FEATURES;
            char want = last ? '\n' : ',';
            int sep_ok = *p == want || (last && (*p == '\r' || *p == '\0'));
            int max = last ? DIGITS_CLASSES - 1 : 16;
            if (!digits || !sep_ok || v > max) {
                fail(err, errcap, "%s: row %lld, field %d: expected %s in 0..%d followed by %s", path,
                     (long long)row + 1, c + 1, last ? "a label" : "a pixel count", max,
                     last ? "the end of the line" : "','");
                goto bad;
            }
            if (*p) p++;
            if (last)
                y[row] = v;
            else
                x[row * DIGITS_FEATURES + c] = (float)v / 16.0f;
        }
        row++;
    }
    if (row != DIGITS_ROWS) {
        fail(err, errcap, "%s: %lld rows, expected %d", path, (long long)row, DIGITS_ROWS);
        goto bad;
    }
    free(text);
    *out = (digits_set){row, x, y};
    return 0;

oom:
    fail(err, errcap, "%s: out of memory", path);
bad:
    free(text);
    free(x);
    free(y);
    return -1;
}

uint64_t digits_rand_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static int take(const digits_set *all, const int64_t *rows, int64_t n, digits_set *out) {
    out->n = n;
    out->x = malloc(sizeof(float) * (size_t)(n * DIGITS_FEATURES) + 1);
    out->y = malloc(sizeof(int64_t) * (size_t)n + 1);
    if (!out->x || !out->y) return -1;
    for (int64_t i = 0; i < n; i++) {
        memcpy(out->x + i * DIGITS_FEATURES, all->x + rows[i] * DIGITS_FEATURES, sizeof(float) * DIGITS_FEATURES);
        out->y[i] = all->y[rows[i]];
    }
    return 0;
}

int digits_split(const digits_set *all, digits_set *train, digits_set *test) {
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    int64_t n = all->n;
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)n + 1);
    if (!perm) return -1;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    uint64_t s = 0;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(digits_rand_next(&s) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t n_test = (n * 20 + 99) / 100; /* ceil, as scikit-learn rounds the test share */
    int rc = take(all, perm, n - n_test, train) || take(all, perm + (n - n_test), n_test, test) ? -1 : 0;
    free(perm);
    if (rc) {
        digits_free(train);
        digits_free(test);
    }
    return rc;
}

void digits_free(digits_set *d) {
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof *d);
}
