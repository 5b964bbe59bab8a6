/*
 * safetensors_save.c — writing safetensors files byte-for-byte as the
 * reference implementation lays them out (tensors sorted by dtype, largest
 * first in its enum order, then by name; compact JSON with __metadata__
 * first; header padded with spaces to a multiple of 8 so every tensor starts
 * aligned), atomically through a temporary file; and the kl_params glue
 * (save all parameters, load a file into existing parameters by name).
 */
#include "fileio.h"
#include "nn_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A growable byte buffer for the header. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string literal as serde_json writes it (non-ASCII stays raw UTF-8). */
static void sb_json(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                sb_put(b, esc, 6);
            } else {
                sb_put(b, (const char *)c, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

/* 1 if s is well-formed UTF-8 (what readers require of the header). */
static int utf8_ok(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len) return 0;
        for (int k = 1; k < len; k++)
            if (p[k] < 0x80 || p[k] > 0xbf) return 0;
        if (len == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f))) return 0;
        if (len == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))) return 0;
        p += len;
    }
    return 1;
}

typedef struct save_item {
    const char *name;
    kl_tensor *t;      /* contiguous CPU tensor (scope-owned) */
    int row;           /* nn_st_dtypes row */
} save_item;

static int cmp_items(const void *a, const void *b) {
    const save_item *x = a, *y = b;
    if (x->row != y->row) return x->row > y->row ? -1 : 1; /* descending dtype order */
    return strcmp(x->name, y->name);
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(((const save_item *)a)->name, ((const save_item *)b)->name);
}

/* The file: 8-byte little-endian header length, the header, the tensors' bytes. */
static int write_file(const char *op, const char *path, const sbuf *hdr, const save_item *items, int n) {
    const void **parts = calloc((size_t)n + 2, sizeof *parts);
    size_t *sizes = calloc((size_t)n + 2, sizeof *sizes);
    if (!parts || !sizes) {
        free(parts);
        free(sizes);
        return ke_err(KL_ERR_OOM, op, "out of memory");
    }
    unsigned char len8[8];
    uint64_t hn = hdr->n;
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)(hn >> (8 * k));
    parts[0] = len8;
    sizes[0] = 8;
    parts[1] = hdr->p;
    sizes[1] = hdr->n;
    for (int i = 0; i < n; i++) {
        sizes[i + 2] = (size_t)kl_numel(items[i].t) * kl_dtype_size(kl_dtype_of(items[i].t));
        parts[i + 2] = sizes[i + 2] ? ke_data(items[i].t) : NULL;
    }
    int rc = ke_write_file_atomic(op, path, n + 2, parts, sizes);
    free(parts);
    free(sizes);
    return rc;
}

static int save_checked(const char *op, const char *path, int n, const char *const *names, kl_tensor *const *tensors,
                        const char *const *metadata, save_item *items) {
    if (!path) return ke_err(KL_ERR_NULL_ARG, op, "path is NULL");
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        if (!name || !*name) return ke_err(KL_ERR_ARG, op, "tensor %d has an empty or NULL name", i);
        if (!strcmp(name, "__metadata__")) return ke_err(KL_ERR_ARG, op, "\"__metadata__\" is reserved, not a tensor name");
        if (!utf8_ok(name)) return ke_err(KL_ERR_ARG, op, "tensor %d's name is not valid UTF-8", i);
        if (ke_check_tensor(tensors[i], op, 4)) return -1;
        int row = nn_st_dtype_row((kl_dtype)tensors[i]->dtype);
        KE_ASSERT(row >= 0); /* every Kiln dtype has a safetensors name */
        kl_tensor *c = kl_contiguous(kl_to_device(tensors[i], KL_DEVICE_CPU));
        if (!c) return -1;
        items[i] = (save_item){name, c, row};
    }
    /* Unique names: sort by name alone first (the layout sort groups by dtype). */
    qsort(items, (size_t)n, sizeof *items, cmp_names);
    for (int i = 1; i < n; i++)
        if (!strcmp(items[i].name, items[i - 1].name))
            return ke_err(KL_ERR_ARG, op, "duplicate tensor name '%s'", items[i].name);
    qsort(items, (size_t)n, sizeof *items, cmp_items);
    sbuf h = {0};
    sb_str(&h, "{");
    int first = 1;
    if (metadata && metadata[0]) {
        sb_str(&h, "\"__metadata__\":{");
        for (int k = 0; metadata[k]; k += 2) {
            if (!metadata[k + 1]) {
                free(h.p);
                return ke_err(KL_ERR_ARG, op, "metadata key '%s' has no value (the list holds key, value pairs "
                              "and ends with NULL)", metadata[k]);
            }
            for (int j = 0; j < k; j += 2)
                if (!strcmp(metadata[j], metadata[k])) {
                    free(h.p);
                    return ke_err(KL_ERR_ARG, op, "duplicate metadata key '%s'", metadata[k]);
                }
            if (!utf8_ok(metadata[k]) || !utf8_ok(metadata[k + 1])) {
                free(h.p);
                return ke_err(KL_ERR_ARG, op, "metadata entry %d is not valid UTF-8", k / 2);
            }
            if (k) sb_str(&h, ",");
            sb_json(&h, metadata[k]);
            sb_str(&h, ":");
            sb_json(&h, metadata[k + 1]);
        }
        sb_str(&h, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        kl_tensor *t = items[i].t;
        char num[64];
        if (!first) sb_str(&h, ",");
        first = 0;
        sb_json(&h, items[i].name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, nn_st_dtypes[items[i].row].name);
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)t->shape[d]);
            sb_str(&h, num);
        }
        uint64_t nb = (uint64_t)kl_numel(t) * kl_dtype_size(kl_dtype_of(t));
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + nb));
        sb_str(&h, num);
        off += nb;
    }
    sb_str(&h, "}");
    while (!h.oom && h.n % 8) sb_str(&h, " ");
    if (h.oom) {
        free(h.p);
        return ke_err(KL_ERR_OOM, op, "out of memory");
    }
    int rc = write_file(op, path, &h, items, n);
    free(h.p);
    return rc;
}

int kl_save_safetensors(const char *path, int n, const char *const *names, kl_tensor *const *tensors,
                        const char *const *metadata) {
    static const char *op = "save_safetensors";
    if (ke_error_pending()) return -1;
    if (n < 0) return ke_err(KL_ERR_ARG, op, "n must be >= 0, got %d", n);
    if (n > 0 && (!names || !tensors)) return ke_err(KL_ERR_NULL_ARG, op, "names or tensors is NULL");
    save_item *items = calloc((size_t)(n ? n : 1), sizeof *items);
    if (!items) return ke_err(KL_ERR_OOM, op, "out of memory");
    kl_no_grad_begin();
    kl_scope_begin();
    int rc = save_checked(op, path, n, names, tensors, metadata, items);
    kl_scope_end();
    kl_no_grad_end();
    free(items);
    return rc;
}

/* ---- kl_params glue ------------------------------------------------------------- */

int kl_params_save_safetensors(const kl_params *p, const char *path) {
    static const char *op = "params_save_safetensors";
    if (!p) return ke_error_pending() ? -1 : ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
    int n = kl_params_count(p);
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    kl_tensor **ts = malloc((size_t)(n ? n : 1) * sizeof *ts);
    int rc = -1;
    if (!names || !ts) {
        ke_err(KL_ERR_OOM, op, "out of memory");
    } else {
        for (int i = 0; i < n; i++) names[i] = kl_params_name(p, i), ts[i] = kl_params_get(p, i);
        rc = kl_save_safetensors(path, n, names, ts, NULL);
    }
    free(names);
    free(ts);
    return rc;
}

int kl_params_load_safetensors(kl_params *p, const char *path, bool strict) {
    static const char *op = "params_load_safetensors";
    if (!p) return ke_error_pending() ? -1 : ke_err(KL_ERR_NULL_ARG, op, "the parameter collection is NULL");
    kl_safetensors *f = kl_load_safetensors(path);
    if (!f) return -1;
    int rc = 0, loaded = 0, n = kl_params_count(p), nf = kl_safetensors_count(f);
    /* Check everything before writing anything. */
    for (int i = 0; i < nf && rc == 0; i++) {
        const char *name = kl_safetensors_name(f, i);
        kl_tensor *src = kl_safetensors_get(f, i), *dst = kl_params_find(p, name);
        if (!dst) {
            if (strict)
                rc = ke_err(KL_ERR_ARG, op, "%s: unexpected tensor '%s' (no parameter has that name)", path, name);
            continue;
        }
        char a[256], b[256];
        if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, (size_t)dst->ndim * sizeof dst->shape[0]))
            rc = ke_err(KL_ERR_SHAPE, op, "%s: parameter '%s' is %s but the file's tensor is %s", path, name,
                        ke_fmt_tensor(a, sizeof a, dst), ke_fmt_tensor(b, sizeof b, src));
        else if (dst->dtype != src->dtype)
            rc = ke_err(KL_ERR_DTYPE, op, "%s: parameter '%s' is %s but the file's tensor is %s", path, name,
                        ke_fmt_tensor(a, sizeof a, dst), ke_fmt_tensor(b, sizeof b, src));
    }
    for (int i = 0; i < n && rc == 0 && strict; i++)
        if (!kl_safetensors_find(f, kl_params_name(p, i)))
            rc = ke_err(KL_ERR_ARG, op, "%s: missing parameter '%s'", path, kl_params_name(p, i));
    if (rc == 0) {
        kl_no_grad_begin();
        for (int i = 0; i < nf && rc == 0; i++) {
            kl_tensor *dst = kl_params_find(p, kl_safetensors_name(f, i));
            if (!dst) continue;
            if (kl_copy_inplace(dst, kl_safetensors_get(f, i))) loaded++;
            else rc = -1;
        }
        kl_no_grad_end();
    }
    kl_safetensors_free(f);
    return rc ? -1 : loaded;
}
