/*
 * charlm_data.c — corpus reading, the fixed split, the byte vocabulary,
 * training windows and the bigram baseline (charlm_data.h).
 */
#include "charlm_data.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

uint64_t charlm_rand_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A growable byte buffer. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* True if the line [s, e) (without its newline) is a fortune separator. */
static bool is_separator(const char *s, const char *e) {
    if (e > s && e[-1] == '\r') e--;
    return e - s == 1 && *s == '%';
}

int charlm_corpus_from_text(const char *text, size_t len, charlm_corpus *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    if (len == 0) return fail(err, errcap, "the corpus is empty");
    buf split[2] = {{0}}; /* train, validation */
    int64_t fortune = 0;
    const char *start = text, *end = text + len;
    /* A fortune runs from start to the next separator line (or the end). */
    for (const char *line = text; line <= end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *eol = nl ? nl : end;
        bool sep = is_separator(line, eol);
        if (sep || !nl) {
            const char *stop = sep ? line : end;
            bool blank = true;
            for (const char *q = start; q < stop && blank; q++) blank = *q == '\n' || *q == ' ' || *q == '\t';
            if (!blank) {
                buf *b = &split[fortune % 10 == 9];
                if (buf_put(b, start, (size_t)(stop - start)) < 0 ||
                    (stop > start && stop[-1] != '\n' && buf_put(b, "\n", 1) < 0) || buf_put(b, "%\n", 2) < 0) {
                    free(split[0].p), free(split[1].p);
                    return fail(err, errcap, "out of memory");
                }
                fortune++;
            }
            start = nl ? nl + 1 : end;
        }
        if (!nl) break;
        line = nl + 1;
    }
    out->fortunes = fortune;
    bool seen[256] = {false};
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < split[s].n; i++) seen[(uint8_t)split[s].p[i]] = true;
    charlm_vocab *v = &out->vocab;
    for (int b = 0; b < 256; b++) {
        v->id_of[b] = -1;
        if (seen[b]) v->id_of[b] = (int16_t)v->size, v->byte_of[v->size++] = (uint8_t)b;
    }
    out->n_train = (int64_t)split[0].n, out->n_val = (int64_t)split[1].n;
    out->train = malloc(sizeof(int64_t) * (split[0].n + 1));
    out->val = malloc(sizeof(int64_t) * (split[1].n + 1));
    if (!out->train || !out->val) {
        free(split[0].p), free(split[1].p);
        charlm_corpus_free(out);
        return fail(err, errcap, "out of memory");
    }
    for (size_t i = 0; i < split[0].n; i++) out->train[i] = v->id_of[(uint8_t)split[0].p[i]];
    for (size_t i = 0; i < split[1].n; i++) out->val[i] = v->id_of[(uint8_t)split[1].p[i]];
    free(split[0].p), free(split[1].p);
    if (out->n_val == 0) {
        charlm_corpus_free(out);
        return fail(err, errcap, "%lld fortunes leave no validation text (fortune i with i %% 10 == 9 is validation)",
                    (long long)fortune);
    }
    return 0;
}

static int read_file(const char *path, buf *b, char *err, size_t errcap) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, errcap, "cannot open %s", path);
    char chunk[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_put(b, chunk, n) < 0) {
            rc = fail(err, errcap, "out of memory reading %s", path);
            break;
        }
    if (!rc && ferror(f)) rc = fail(err, errcap, "cannot read %s", path);
    fclose(f);
    /* Files are concatenated: each must end its last line (and its last fortune). */
    if (!rc && b->n && b->p[b->n - 1] != '\n' && buf_put(b, "\n", 1) < 0) rc = fail(err, errcap, "out of memory");
    if (!rc && b->n && buf_put(b, "%\n", 2) < 0) rc = fail(err, errcap, "out of memory");
    return rc;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int charlm_corpus_load(const char *path, charlm_corpus *out, char *err, size_t errcap) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0) return fail(err, errcap, "%s not found", path);
    buf text = {0};
    int rc = 0;
    if (!S_ISDIR(st.st_mode)) {
        rc = read_file(path, &text, err, errcap);
    } else {
        DIR *d = opendir(path);
        if (!d) return fail(err, errcap, "cannot open folder %s", path);
        char **names = NULL;
        size_t n = 0, cap = 0;
        for (struct dirent *e; (e = readdir(d));) {
            size_t len = strlen(e->d_name);
            if (e->d_name[0] == '.' || !strcmp(e->d_name, "SOURCES") ||
                (len > 4 && !strcmp(e->d_name + len - 4, ".dat")))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **p = realloc(names, cap * sizeof *names);
                if (!p) break;
                names = p;
            }
            if (!(names[n] = strdup(e->d_name))) break;
            n++;
        }
        closedir(d);
        qsort(names, n, sizeof *names, by_name);
        size_t files = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            char full[4096];
            snprintf(full, sizeof full, "%s/%s", path, names[i]);
            if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode)) continue; /* *.u8 links repeat their target */
            rc = read_file(full, &text, err, errcap);
            files++;
        }
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        if (!rc && files == 0) rc = fail(err, errcap, "%s holds no text files", path);
    }
    if (!rc) rc = charlm_corpus_from_text(text.p, text.n, out, err, errcap);
    free(text.p);
    return rc;
}

void charlm_corpus_free(charlm_corpus *c) {
    free(c->train);
    free(c->val);
    c->train = c->val = NULL;
}

void charlm_windows(const int64_t *text, int64_t n, int batch, int context, uint64_t *state, int64_t *x,
                    int64_t *y) {
    uint64_t starts = (uint64_t)(n - context);
    for (int b = 0; b < batch; b++) {
        int64_t s = (int64_t)(charlm_rand_next(state) % starts);
        memcpy(x + (size_t)b * context, text + s, sizeof(int64_t) * (size_t)context);
        memcpy(y + (size_t)b * context, text + s + 1, sizeof(int64_t) * (size_t)context);
    }
}

double charlm_bigram_loss(const charlm_corpus *c) {
    int v = c->vocab.size;
    double *count = calloc((size_t)v * (size_t)v, sizeof(double)), *row = calloc((size_t)v, sizeof(double));
    if (!count || !row) {
        free(count), free(row);
        return NAN;
    }
    for (int64_t i = 0; i + 1 < c->n_train; i++) {
        count[c->train[i] * v + c->train[i + 1]]++;
        row[c->train[i]]++;
    }
    double nll = 0;
    for (int64_t i = 0; i + 1 < c->n_val; i++) {
        int64_t a = c->val[i], b = c->val[i + 1];
        nll -= log((count[a * v + b] + 1) / (row[a] + v));
    }
    free(count), free(row);
    return c->n_val > 1 ? nll / (double)(c->n_val - 1) : NAN;
}
