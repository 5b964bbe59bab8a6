/*
 * safetensors.c — reading safetensors files: the dtype table, a JSON parser
 * for the header's subset of JSON, the validation the reference
 * implementation does (and a little more), and the kl_safetensors handle.
 *
 * Trust nothing: the header length is checked against a 100 MB limit (the
 * reference's) and the bytes present; the header must be UTF-8 and JSON;
 * every tensor needs a known dtype, a shape whose byte size fits in int64 and
 * matches its data_offsets, and the tensors sorted by offset must tile the
 * data section exactly (no gap, no overlap, nothing left over). Any failure
 * is KL_ERR_FORMAT with a message naming the file and the problem (a dtype
 * of the spec that Kiln lacks is KL_ERR_UNSUPPORTED). Tensor data is copied
 * out of the file, so a loaded file is not kept mapped.
 */
#include "fileio.h"
#include "nn_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

const nn_st_dtype nn_st_dtypes[] = {
    {"BOOL", 1, KL_BOOL}, {"U8", 1, KL_U8},   {"I8", 1, -1},       {"F8_E5M2", 1, -1}, {"F8_E4M3", 1, -1},
    {"I16", 2, -1},       {"U16", 2, -1},     {"F16", 2, KL_F16},  {"BF16", 2, KL_BF16}, {"I32", 4, KL_I32},
    {"U32", 4, -1},       {"F32", 4, KL_F32}, {"F64", 8, KL_F64},  {"I64", 8, KL_I64},  {"U64", 8, -1},
    /* later additions to the spec, known so their error says "unsupported" */
    {"F8_E8M0", 1, -1},   {"C64", 8, -1},     {"F4", 1, -1},       {"F6_E2M3", 1, -1}, {"F6_E3M2", 1, -1},
};
const int nn_st_num_dtypes = (int)(sizeof nn_st_dtypes / sizeof nn_st_dtypes[0]);

int nn_st_dtype_row(kl_dtype dt) {
    for (int i = 0; i < nn_st_num_dtypes; i++)
        if (nn_st_dtypes[i].kiln == (int)dt) return i;
    return -1;
}

#define ST_MAX_HEADER 100000000ull /* the reference's MAX_HEADER_SIZE */
#define ST_MAX_DEPTH 64            /* nesting allowed inside ignored values */

struct kl_safetensors {
    int n, nmeta;
    char **names;
    kl_tensor **ts;
    char **mkeys, **mvals;
};

/* One tensor as the header describes it. */
typedef struct st_entry {
    char *name;
    int dtype;            /* row of nn_st_dtypes */
    int ndim;
    int64_t shape[KL_MAX_DIMS];
    uint64_t begin, end;
} st_entry;

typedef struct st_reader {
    const char *op, *src;           /* "load_safetensors", path or "buffer" */
    const unsigned char *s;         /* the header */
    size_t n, pos;
    st_entry *e;
    int ne, cape;
    char **mkeys, **mvals;
    int nmeta, capm;
    int seen_meta;
} st_reader;

static int st_fail(const st_reader *r, kl_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int st_fail(const st_reader *r, kl_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ke_err(code, r->op, "%s: %s", r->src, msg);
}

static int bad_json(const st_reader *r, const char *what) {
    if (r->pos >= r->n) return st_fail(r, KL_ERR_FORMAT, "bad JSON header: %s, found the end of the header", what);
    unsigned char c = r->s[r->pos];
    if (c >= 0x20 && c < 0x7f)
        return st_fail(r, KL_ERR_FORMAT, "bad JSON header at byte %zu: %s, found '%c'", r->pos, what, c);
    return st_fail(r, KL_ERR_FORMAT, "bad JSON header at byte %zu: %s, found byte 0x%02x", r->pos, what, c);
}

/* ---- UTF-8 ------------------------------------------------------------------- */

/* Offset of the first byte that is not well-formed UTF-8, or n. */
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0) lo = 0xa0;       /* overlong */
            if (c == 0xed) hi = 0x9f;       /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0) lo = 0x90;       /* overlong */
            if (c == 0xf4) hi = 0x8f;       /* above U+10FFFF */
        } else
            return i;
        if (n - i < (size_t)len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (int k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
        i += (size_t)len;
    }
    return n;
}

/* ---- JSON -------------------------------------------------------------------- */

static void skip_ws(st_reader *r) {
    while (r->pos < r->n && (r->s[r->pos] == ' ' || r->s[r->pos] == '\t' || r->s[r->pos] == '\n' ||
                             r->s[r->pos] == '\r'))
        r->pos++;
}

/* Consumes c after whitespace; 0 if it was there. */
static int eat(st_reader *r, char c) {
    skip_ws(r);
    if (r->pos < r->n && r->s[r->pos] == (unsigned char)c) {
        r->pos++;
        return 0;
    }
    return -1;
}

static int hex4(st_reader *r, unsigned *out) {
    if (r->n - r->pos < 4) return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = r->s[r->pos + (size_t)k];
        unsigned d = c >= '0' && c <= '9' ? c - '0' + 0u : c >= 'a' && c <= 'f' ? c - 'a' + 10u
                   : c >= 'A' && c <= 'F' ? c - 'A' + 10u : 16u;
        if (d > 15) return -1;
        v = v * 16 + d;
    }
    r->pos += 4;
    *out = v;
    return 0;
}

/* A JSON string into a fresh NUL-terminated UTF-8 buffer (*out NULL to skip). */
static int parse_string(st_reader *r, char **out) {
    if (out) *out = NULL;
    skip_ws(r);
    if (r->pos >= r->n || r->s[r->pos] != '"') return bad_json(r, "expected a string");
    r->pos++;
    /* The decoded string is never longer than the encoded one. */
    size_t start = r->pos, cap = 1;
    while (r->pos < r->n && r->s[r->pos] != '"') r->pos += r->s[r->pos] == '\\' ? 2 : 1;
    if (r->pos >= r->n) {
        r->pos = r->n;
        return bad_json(r, "unterminated string");
    }
    cap += r->pos - start;
    r->pos = start;
    char *buf = out ? malloc(cap) : NULL;
    if (out && !buf) return st_fail(r, KL_ERR_OOM, "out of memory");
    size_t k = 0;
    for (;;) {
        unsigned char c = r->s[r->pos];
        if (c == '"') {
            r->pos++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return bad_json(r, "control character in a string");
        }
        if (c != '\\') {
            if (buf) buf[k] = (char)c;
            k++;
            r->pos++;
            continue;
        }
        r->pos++;
        c = r->s[r->pos++];
        unsigned cp;
        switch (c) {
        case '"': case '\\': case '/': cp = c; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (hex4(r, &cp)) {
                free(buf);
                return bad_json(r, "bad \\u escape");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned lo;
                if (r->n - r->pos < 2 || r->s[r->pos] != '\\' || r->s[r->pos + 1] != 'u' ||
                    (r->pos += 2, hex4(r, &lo)) || lo < 0xdc00 || lo > 0xdfff) {
                    free(buf);
                    return bad_json(r, "unpaired UTF-16 surrogate in a \\u escape");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                free(buf);
                return bad_json(r, "unpaired UTF-16 surrogate in a \\u escape");
            }
            if (cp == 0) {
                free(buf);
                return st_fail(r, KL_ERR_UNSUPPORTED, "a string in the header contains a NUL character");
            }
            break;
        default:
            r->pos--;
            free(buf);
            return bad_json(r, "bad escape in a string");
        }
        /* Encode cp as UTF-8: at most 4 bytes, never more than the escape's 6 (or 12). */
        unsigned char u[4];
        int m;
        if (cp < 0x80) u[0] = (unsigned char)cp, m = 1;
        else if (cp < 0x800) u[0] = (unsigned char)(0xc0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 0x3f)), m = 2;
        else if (cp < 0x10000)
            u[0] = (unsigned char)(0xe0 | cp >> 12), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
            u[2] = (unsigned char)(0x80 | (cp & 0x3f)), m = 3;
        else
            u[0] = (unsigned char)(0xf0 | cp >> 18), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
            u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (unsigned char)(0x80 | (cp & 0x3f)), m = 4;
        if (buf) memcpy(buf + k, u, (size_t)m);
        k += (size_t)m;
    }
    if (buf) {
        if (memchr(buf, 0, k)) { /* a raw NUL byte (valid UTF-8, not C) */
            free(buf);
            return st_fail(r, KL_ERR_UNSUPPORTED, "a string in the header contains a NUL character");
        }
        buf[k] = 0;
        *out = buf;
    }
    return 0;
}

/* A JSON number that must be a non-negative integer fitting in int64. */
static int parse_uint(st_reader *r, uint64_t *out, const char *what) {
    skip_ws(r);
    size_t start = r->pos;
    uint64_t v = 0;
    while (r->pos < r->n && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') {
        unsigned d = r->s[r->pos] - '0';
        if (v > (uint64_t)(INT64_MAX - d) / 10) {
            r->pos = start;
            return st_fail(r, KL_ERR_FORMAT, "%s at byte %zu is too large", what, start);
        }
        v = v * 10 + d;
        r->pos++;
    }
    size_t len = r->pos - start;
    int bad = len == 0 || (len > 1 && r->s[start] == '0') ||
              (r->pos < r->n && (r->s[r->pos] == '.' || r->s[r->pos] == 'e' || r->s[r->pos] == 'E'));
    if (bad) {
        r->pos = start;
        char msg[96];
        snprintf(msg, sizeof msg, "%s must be a non-negative integer", what);
        return bad_json(r, msg);
    }
    *out = v;
    return 0;
}

static int skip_value(st_reader *r, int depth);

static int skip_number(st_reader *r) {
    size_t start = r->pos;
    if (r->pos < r->n && r->s[r->pos] == '-') r->pos++;
    size_t d0 = r->pos;
    while (r->pos < r->n && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
    if (r->pos == d0 || (r->pos - d0 > 1 && r->s[d0] == '0')) {
        r->pos = start;
        return bad_json(r, "bad number");
    }
    if (r->pos < r->n && r->s[r->pos] == '.') {
        size_t f0 = ++r->pos;
        while (r->pos < r->n && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
        if (r->pos == f0) return bad_json(r, "bad number");
    }
    if (r->pos < r->n && (r->s[r->pos] == 'e' || r->s[r->pos] == 'E')) {
        r->pos++;
        if (r->pos < r->n && (r->s[r->pos] == '+' || r->s[r->pos] == '-')) r->pos++;
        size_t e0 = r->pos;
        while (r->pos < r->n && r->s[r->pos] >= '0' && r->s[r->pos] <= '9') r->pos++;
        if (r->pos == e0) return bad_json(r, "bad number");
    }
    return 0;
}

static int skip_literal(st_reader *r, const char *lit) {
    size_t len = strlen(lit);
    if (r->n - r->pos < len || memcmp(r->s + r->pos, lit, len)) return bad_json(r, "expected a JSON value");
    r->pos += len;
    return 0;
}

/* Any JSON value (fields the format does not define are ignored, as serde does). */
static int skip_value(st_reader *r, int depth) {
    if (depth > ST_MAX_DEPTH) return bad_json(r, "values nested too deeply");
    skip_ws(r);
    if (r->pos >= r->n) return bad_json(r, "expected a JSON value");
    unsigned char c = r->s[r->pos];
    if (c == '"') return parse_string(r, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->pos++;
        if (!eat(r, close)) return 0;
        for (;;) {
            if (c == '{') {
                if (parse_string(r, NULL)) return -1;
                if (eat(r, ':')) return bad_json(r, "expected ':' after a key");
            }
            if (skip_value(r, depth + 1)) return -1;
            if (!eat(r, close)) return 0;
            if (eat(r, ',')) return bad_json(r, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return skip_number(r);
    if (c == 't') return skip_literal(r, "true");
    if (c == 'f') return skip_literal(r, "false");
    if (c == 'n') return skip_literal(r, "null");
    return bad_json(r, "expected a JSON value");
}

/* "shape": [d, ...] */
static int parse_shape(st_reader *r, st_entry *e) {
    if (eat(r, '[')) return bad_json(r, "expected '[' to open a shape");
    e->ndim = 0;
    if (!eat(r, ']')) return 0;
    for (;;) {
        uint64_t d;
        if (parse_uint(r, &d, "a shape dimension")) return -1;
        if (e->ndim == KL_MAX_DIMS)
            return st_fail(r, KL_ERR_UNSUPPORTED, "tensor '%s' has more than %d dimensions", e->name, KL_MAX_DIMS);
        e->shape[e->ndim++] = (int64_t)d;
        if (!eat(r, ']')) return 0;
        if (eat(r, ',')) return bad_json(r, "expected ',' or ']' in a shape");
    }
}

/* "data_offsets": [begin, end] */
static int parse_offsets(st_reader *r, st_entry *e) {
    if (eat(r, '[')) return bad_json(r, "expected '[' to open data_offsets");
    if (parse_uint(r, &e->begin, "a data offset")) return -1;
    if (eat(r, ',')) return bad_json(r, "expected ',' in data_offsets (two offsets)");
    if (parse_uint(r, &e->end, "a data offset")) return -1;
    if (eat(r, ']')) return bad_json(r, "expected ']' after the two data_offsets");
    return 0;
}

static int parse_dtype(st_reader *r, st_entry *e) {
    char *s;
    if (parse_string(r, &s)) return -1;
    e->dtype = -1;
    for (int i = 0; i < nn_st_num_dtypes; i++)
        if (!strcmp(s, nn_st_dtypes[i].name)) e->dtype = i;
    int rc = 0;
    if (e->dtype < 0)
        rc = st_fail(r, KL_ERR_FORMAT, "tensor '%s' has an unknown dtype \"%.40s\"", e->name, s);
    else if (nn_st_dtypes[e->dtype].kiln < 0)
        rc = st_fail(r, KL_ERR_UNSUPPORTED, "tensor '%s' has dtype %s, which Kiln does not support", e->name, s);
    free(s);
    return rc;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} (other keys ignored). */
static int parse_info(st_reader *r, st_entry *e) {
    enum { HAVE_DTYPE = 1, HAVE_SHAPE = 2, HAVE_OFFSETS = 4 };
    int have = 0;
    if (eat(r, '{')) return bad_json(r, "expected '{' to open a tensor's description");
    if (eat(r, '}')) {
        for (;;) {
            char *key;
            if (parse_string(r, &key)) return -1;
            int bit = !strcmp(key, "dtype") ? HAVE_DTYPE : !strcmp(key, "shape") ? HAVE_SHAPE
                    : !strcmp(key, "data_offsets") ? HAVE_OFFSETS : 0;
            free(key);
            if (have & bit)
                return st_fail(r, KL_ERR_FORMAT, "tensor '%s' has a duplicate key before byte %zu", e->name, r->pos);
            if (eat(r, ':')) return bad_json(r, "expected ':' after a key");
            have |= bit;
            int rc = bit == HAVE_DTYPE ? parse_dtype(r, e) : bit == HAVE_SHAPE ? parse_shape(r, e)
                   : bit == HAVE_OFFSETS ? parse_offsets(r, e) : skip_value(r, 1);
            if (rc) return -1;
            if (!eat(r, '}')) break;
            if (eat(r, ',')) return bad_json(r, "expected ',' or '}' in a tensor's description");
        }
    }
    if (have != (HAVE_DTYPE | HAVE_SHAPE | HAVE_OFFSETS))
        return st_fail(r, KL_ERR_FORMAT, "tensor '%s' lacks \"%s\"", e->name,
                       !(have & HAVE_DTYPE) ? "dtype" : !(have & HAVE_SHAPE) ? "shape" : "data_offsets");
    return 0;
}

/* "__metadata__": {"key": "value", ...} or null. */
static int parse_metadata(st_reader *r) {
    if (r->seen_meta) return st_fail(r, KL_ERR_FORMAT, "duplicate \"__metadata__\"");
    r->seen_meta = 1;
    skip_ws(r);
    if (r->pos < r->n && r->s[r->pos] == 'n') return skip_literal(r, "null");
    if (eat(r, '{')) return bad_json(r, "expected '{' to open __metadata__");
    if (!eat(r, '}')) return 0;
    for (;;) {
        char *k, *v;
        if (parse_string(r, &k)) return -1;
        for (int i = 0; i < r->nmeta; i++)
            if (!strcmp(r->mkeys[i], k)) {
                int rc = st_fail(r, KL_ERR_FORMAT, "duplicate metadata key '%s'", k);
                free(k);
                return rc;
            }
        if (eat(r, ':')) {
            free(k);
            return bad_json(r, "expected ':' after a key");
        }
        skip_ws(r);
        if (r->pos < r->n && r->s[r->pos] != '"') {
            free(k);
            return bad_json(r, "metadata values must be strings");
        }
        if (parse_string(r, &v)) {
            free(k);
            return -1;
        }
        if (r->nmeta == r->capm) {
            int cap = r->capm ? 2 * r->capm : 8;
            char **nk = realloc(r->mkeys, (size_t)cap * sizeof *nk);
            if (nk) r->mkeys = nk;
            char **nv = nk ? realloc(r->mvals, (size_t)cap * sizeof *nv) : NULL;
            if (nv) r->mvals = nv;
            if (!nk || !nv) {
                free(k);
                free(v);
                return st_fail(r, KL_ERR_OOM, "out of memory");
            }
            r->capm = cap;
        }
        r->mkeys[r->nmeta] = k;
        r->mvals[r->nmeta++] = v;
        if (!eat(r, '}')) return 0;
        if (eat(r, ',')) return bad_json(r, "expected ',' or '}' in __metadata__");
    }
}

static int parse_header(st_reader *r) {
    if (eat(r, '{')) return bad_json(r, "expected '{' to open the header");
    if (eat(r, '}')) {
        for (;;) {
            char *name;
            if (parse_string(r, &name)) return -1;
            if (eat(r, ':')) {
                free(name);
                return bad_json(r, "expected ':' after a key");
            }
            if (!strcmp(name, "__metadata__")) {
                free(name);
                if (parse_metadata(r)) return -1;
            } else {
                if (r->ne == r->cape) {
                    int cap = r->cape ? 2 * r->cape : 16;
                    st_entry *ne = cap > 0 ? realloc(r->e, (size_t)cap * sizeof *ne) : NULL;
                    if (!ne) {
                        free(name);
                        return st_fail(r, KL_ERR_OOM, "out of memory");
                    }
                    r->e = ne;
                    r->cape = cap;
                }
                st_entry *e = &r->e[r->ne++];
                memset(e, 0, sizeof *e);
                e->name = name;
                if (parse_info(r, e)) return -1;
            }
            if (!eat(r, '}')) break;
            if (eat(r, ',')) return bad_json(r, "expected ',' or '}' between tensors");
        }
    }
    skip_ws(r);
    if (r->pos != r->n) return bad_json(r, "expected the end of the header (only space padding may follow)");
    return 0;
}

/* ---- validation -------------------------------------------------------------- */

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* File order: by offsets, then name (zero-size tensors may share an offset). */
static int cmp_offsets(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int validate(st_reader *r, uint64_t data_len) {
    /* Duplicate names (JSON allows them; a silent last-one-wins would hide a bug). */
    if (r->ne > 1) {
        st_entry **by = malloc((size_t)r->ne * sizeof *by);
        if (!by) return st_fail(r, KL_ERR_OOM, "out of memory");
        for (int i = 0; i < r->ne; i++) by[i] = &r->e[i];
        qsort(by, (size_t)r->ne, sizeof *by, cmp_name);
        for (int i = 1; i < r->ne; i++)
            if (!strcmp(by[i]->name, by[i - 1]->name)) {
                int rc = st_fail(r, KL_ERR_FORMAT, "duplicate tensor name '%s'", by[i]->name);
                free(by);
                return rc;
            }
        free(by);
    }
    for (int i = 0; i < r->ne; i++) {
        st_entry *e = &r->e[i];
        char sh[8 * 24];
        ke_fmt_shape(sh, sizeof sh, e->ndim, e->shape);
        uint64_t bytes = nn_st_dtypes[e->dtype].size;
        for (int d = 0; d < e->ndim; d++)
            if (__builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes) || bytes > (uint64_t)INT64_MAX)
                return st_fail(r, KL_ERR_FORMAT, "tensor '%s': shape %s of %s overflows", e->name, sh,
                               nn_st_dtypes[e->dtype].name);
        if (e->begin > e->end)
            return st_fail(r, KL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] are reversed", e->name,
                           (unsigned long long)e->begin, (unsigned long long)e->end);
        if (e->end > data_len)
            return st_fail(r, KL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] run past the data (%llu bytes)",
                           e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)data_len);
        if (e->end - e->begin != bytes)
            return st_fail(r, KL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape %s of "
                           "%s needs %llu", e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                           (unsigned long long)(e->end - e->begin), sh, nn_st_dtypes[e->dtype].name,
                           (unsigned long long)bytes);
    }
    if (r->ne > 1) qsort(r->e, (size_t)r->ne, sizeof *r->e, cmp_offsets);
    uint64_t at = 0;
    for (int i = 0; i < r->ne; i++) {
        const st_entry *e = &r->e[i];
        if (e->begin != at)
            return st_fail(r, KL_ERR_FORMAT, "tensor '%s' starts at byte %llu of the data but the tensors before it "
                           "end at %llu (tensors must tile the data without gaps or overlaps)", e->name,
                           (unsigned long long)e->begin, (unsigned long long)at);
        at = e->end;
    }
    if (at != data_len)
        return st_fail(r, KL_ERR_FORMAT, "the tensors cover %llu bytes but the data section has %llu",
                       (unsigned long long)at, (unsigned long long)data_len);
    return 0;
}

/* ---- the handle -------------------------------------------------------------- */

void kl_safetensors_free(kl_safetensors *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->names[i]);
        if (f->ts[i]) ke_tensor_decref(f->ts[i]);
    }
    for (int i = 0; i < f->nmeta; i++) free(f->mkeys[i]), free(f->mvals[i]);
    free(f->names);
    free(f->ts);
    free(f->mkeys);
    free(f->mvals);
    free(f);
}

static void reader_free(st_reader *r) {
    for (int i = 0; i < r->ne; i++) free(r->e[i].name);
    for (int i = 0; i < r->nmeta; i++) free(r->mkeys[i]), free(r->mvals[i]);
    free(r->e);
    free(r->mkeys);
    free(r->mvals);
}

static kl_safetensors *parse_buffer(const char *op, const char *src, const unsigned char *buf, size_t len) {
    st_reader r = {.op = op, .src = src};
    if (len < 8) {
        st_fail(&r, KL_ERR_FORMAT, "%zu bytes: too short for the 8-byte header length", len);
        return NULL;
    }
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--) hn = hn << 8 | buf[k];
    if (hn > ST_MAX_HEADER) {
        st_fail(&r, KL_ERR_FORMAT, "header length %llu exceeds the %llu-byte limit", (unsigned long long)hn,
                ST_MAX_HEADER);
        return NULL;
    }
    if (hn > len - 8) {
        st_fail(&r, KL_ERR_FORMAT, "header length %llu runs past the end of the file (%zu bytes after the length)",
                (unsigned long long)hn, len - 8);
        return NULL;
    }
    r.s = buf + 8;
    r.n = (size_t)hn;
    size_t bad = utf8_invalid_at(r.s, r.n);
    if (bad < r.n) {
        st_fail(&r, KL_ERR_FORMAT, "header is not valid UTF-8 (byte %zu)", bad);
        return NULL;
    }
    kl_safetensors *f = NULL;
    if (parse_header(&r) || validate(&r, (uint64_t)(len - 8 - r.n))) goto done;
    f = calloc(1, sizeof *f);
    if (f && r.ne) {
        f->names = calloc((size_t)r.ne, sizeof *f->names);
        f->ts = calloc((size_t)r.ne, sizeof *f->ts);
    }
    if (!f || (r.ne && (!f->names || !f->ts))) {
        kl_safetensors_free(f);
        f = NULL;
        st_fail(&r, KL_ERR_OOM, "out of memory");
        goto done;
    }
    const unsigned char *data = buf + 8 + r.n;
    for (int i = 0; i < r.ne; i++, f->n++) {
        st_entry *e = &r.e[i];
        kl_dtype dt = (kl_dtype)nn_st_dtypes[e->dtype].kiln;
        kl_tensor *t = ke_tensor_new(dt, e->ndim, e->shape, KL_DEVICE_CPU, op);
        if (!t) {
            kl_safetensors_free(f);
            f = NULL;
            goto done;
        }
        size_t nb = (size_t)(e->end - e->begin);
        if (nb) memcpy(ke_data(t), data + e->begin, nb);
        if (dt == KL_BOOL) { /* kernels only ever see 0/1 */
            unsigned char *p = (unsigned char *)ke_data(t);
            for (size_t k = 0; k < nb; k++) p[k] = p[k] != 0;
        }
        f->ts[i] = t;
        f->names[i] = e->name;
        e->name = NULL;
    }
    f->mkeys = r.mkeys, f->mvals = r.mvals, f->nmeta = r.nmeta;
    r.mkeys = r.mvals = NULL, r.nmeta = 0;
done:
    reader_free(&r);
    return f;
}

kl_safetensors *kl_load_safetensors_buffer(const void *buf, size_t len) {
    if (!buf && len) {
        ke_err(KL_ERR_NULL_ARG, "load_safetensors_buffer", "buffer is NULL");
        return NULL;
    }
    return parse_buffer("load_safetensors_buffer", "buffer", buf ? buf : "", len);
}

/* Pipes and files without mmap: read everything. */
kl_safetensors *kl_load_safetensors(const char *path) {
    static const char *op = "load_safetensors";
    if (!path) {
        ke_err(KL_ERR_NULL_ARG, op, "path is NULL");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ke_err(KL_ERR_IO, op, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int bad_stat = fstat(fd, &st) != 0;
    if (bad_stat || S_ISDIR(st.st_mode)) {
        ke_err(KL_ERR_IO, op, "%s: cannot read: %s", path, bad_stat ? strerror(errno) : "is a directory");
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = MAP_FAILED;
    if (S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX)
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    unsigned char *all = NULL;
    if (map == MAP_FAILED) {
        all = ke_read_all(fd, &len);
        if (!all) {
            ke_err(KL_ERR_IO, op, "%s: read failed: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);
    kl_safetensors *f = parse_buffer(op, path, all ? all : map, len);
    if (all) free(all);
    else munmap(map, len);
    return f;
}

int kl_safetensors_count(const kl_safetensors *f) { return f ? f->n : 0; }

static int check_index(const kl_safetensors *f, int i, const char *op) {
    if (!f) {
        if (!ke_error_pending()) ke_err(KL_ERR_NULL_ARG, op, "the safetensors handle is NULL");
        return -1;
    }
    if (i < 0 || i >= f->n) return ke_err(KL_ERR_INDEX, op, "index %d out of range for %d tensors", i, f->n);
    return 0;
}

const char *kl_safetensors_name(const kl_safetensors *f, int i) {
    return check_index(f, i, "safetensors_name") ? NULL : f->names[i];
}

kl_tensor *kl_safetensors_get(const kl_safetensors *f, int i) {
    return check_index(f, i, "safetensors_get") ? NULL : f->ts[i];
}

kl_tensor *kl_safetensors_find(const kl_safetensors *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) return f->ts[i];
    return NULL;
}

const char *kl_safetensors_metadata(const kl_safetensors *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->mkeys[i], key)) return f->mvals[i];
    return NULL;
}

int kl_safetensors_metadata_count(const kl_safetensors *f) { return f ? f->nmeta : 0; }

const char *kl_safetensors_metadata_key(const kl_safetensors *f, int i) {
    return f && i >= 0 && i < f->nmeta ? f->mkeys[i] : NULL;
}
