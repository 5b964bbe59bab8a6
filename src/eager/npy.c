/*
 * npy.c — NumPy .npy files: kl_load_npy, kl_load_npy_buffer, kl_save_npy.
 *
 * Format (numpy/lib/format.py): "\x93NUMPY", major, minor (1.0, 2.0, 3.0),
 * a little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0), then a
 * Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and '\n' so the data starts on a 64-byte boundary.
 *
 * Loading. Everything in a file is untrusted: the header parser checks every
 * byte against the grammar, every size against the bytes actually present
 * and every product for overflow, and any problem is KL_ERR_FORMAT (a
 * failed open/read/mmap is KL_ERR_IO) with a message naming the file.
 * kl_load_npy maps the file MAP_PRIVATE (copy-on-write: writing to the
 * tensor never touches the file) and wraps the data in place when it is
 * aligned for the dtype and in host byte order; otherwise it copies. The
 * mapping is unmapped when the last tensor using it dies. A file truncated
 * by another process while mapped raises SIGBUS, as with any mmap.
 * Fortran-order files load as a column-major strided view of the data
 * (zero-copy; kl_contiguous gives C order). Bool bytes other than 0/1 are
 * normalized to 1 so kernels only ever see 0/1. kl_load_npy_buffer always
 * copies (the buffer is borrowed), and so does kl_load_npy_copy (the opt-out
 * of the mapping: a later rewrite or truncation of the file cannot reach the
 * tensor). Loads never yield bfloat16.
 *
 * Saving writes format 1.0 (2.0 if the header outgrows 65535 bytes) in C
 * order, byte-for-byte as numpy 1.24 writes it, to a temporary file renamed
 * over the target: readers see the old or the new file, never a partial one.
 * bfloat16 has no numpy dtype: it is saved as float32 ('<f4'), exactly.
 */
#include "core.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NPY_NATIVE '<'
#define NPY_FOREIGN '>'
#else
#define NPY_NATIVE '>'
#define NPY_FOREIGN '<'
#endif

static const uint8_t npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* numpy type codes Kiln loads and saves (the byte-order character apart). */
static const struct {
    const char *code;
    kl_dtype dt;
} npy_types[] = {
    {"f4", KL_F32}, {"f8", KL_F64}, {"f2", KL_F16}, {"i4", KL_I32},
    {"i8", KL_I64}, {"u1", KL_U8},  {"b1", KL_BOOL},
};

/* ---- errors naming the source ------------------------------------------------ */

typedef struct npy_src {
    const char *op;    /* "load_npy" / "load_npy_buffer" / "save_npy" */
    const char *name;  /* the path, or NULL for a buffer */
} npy_src;

static int npy_fail(const npy_src *src, kl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int npy_fail(const npy_src *src, kl_status code, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (src->name)
        return ke_err(code, src->op, "%s: %s", src->name, msg);
    return ke_err(code, src->op, "%s", msg);
}

/* ---- header parsing -------------------------------------------------------------- */

typedef struct npy_header {
    kl_dtype dt;
    int swap;                  /* file byte order is not the host's */
    int fortran;
    int ndim;
    int64_t shape[KL_MAX_DIMS];
    size_t data_off;           /* first data byte */
    size_t nbytes;             /* data bytes the shape needs */
} npy_header;

typedef struct cursor {
    const char *s;
    size_t i, n;
} cursor;

static void skip_ws(cursor *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r'))
        c->i++;
}

static int peek(const cursor *c) { return c->i < c->n ? (unsigned char)c->s[c->i] : -1; }

static int eat(cursor *c, char ch) {
    if (peek(c) != (unsigned char)ch) return 0;
    c->i++;
    return 1;
}

/* The first few characters at the cursor, printable, for messages. */
static const char *near(const cursor *c, char *buf, size_t cap) {
    size_t k = 0;
    if (c->i >= c->n) return "end of header";
    buf[k++] = '\'';
    for (size_t j = c->i; j < c->n && j < c->i + 12 && k + 3 < cap; j++) {
        unsigned char ch = (unsigned char)c->s[j];
        buf[k++] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    while (k > 1 && buf[k - 1] == ' ') k--; /* the padding says nothing */
    buf[k++] = '\'';
    buf[k] = 0;
    return buf;
}

/* A quoted string ('...' or "..."), without escapes, into out. */
static int parse_string(const npy_src *src, cursor *c, char *out, size_t cap, const char *what) {
    char nb[32];
    int q = peek(c);
    if (q != '\'' && q != '"')
        return npy_fail(src, KL_ERR_FORMAT, "bad header: expected a quoted %s at %s", what, near(c, nb, sizeof nb));
    size_t start = ++c->i;
    while (c->i < c->n && c->s[c->i] != q && c->s[c->i] != '\n') {
        if (c->s[c->i] == '\\')
            return npy_fail(src, KL_ERR_FORMAT, "bad header: escapes in %s are not supported", what);
        c->i++;
    }
    if (c->i >= c->n || c->s[c->i] != q) return npy_fail(src, KL_ERR_FORMAT, "bad header: unterminated %s", what);
    size_t len = c->i - start;
    c->i++;
    if (len >= cap) return npy_fail(src, KL_ERR_FORMAT, "bad header: %s too long (%zu characters)", what, len);
    memcpy(out, c->s + start, len);
    out[len] = 0;
    return 0;
}

static int parse_descr(const npy_src *src, cursor *c, npy_header *h) {
    char d[16], nb[32];
    if (peek(c) == '[')
        return npy_fail(src, KL_ERR_FORMAT, "unsupported dtype: structured arrays (a 'descr' list) are not supported");
    if (peek(c) != '\'' && peek(c) != '"')
        return npy_fail(src, KL_ERR_FORMAT, "bad header: 'descr' is not a string at %s", near(c, nb, sizeof nb));
    if (parse_string(src, c, d, sizeof d, "'descr'")) return -1;
    const char *code = d;
    char order = '=';
    if (*code == '<' || *code == '>' || *code == '|' || *code == '=') order = *code++;
    for (size_t k = 0; k < sizeof npy_types / sizeof npy_types[0]; k++) {
        if (strcmp(code, npy_types[k].code) != 0) continue;
        h->dt = npy_types[k].dt;
        h->swap = order == NPY_FOREIGN && ke_dtypes[h->dt].size > 1;
        return 0;
    }
    return npy_fail(src, KL_ERR_FORMAT, "unsupported dtype '%s' (Kiln loads f4, f8, f2, i4, i8, u1 and b1)", d);
}

static int parse_bool(const npy_src *src, cursor *c, int *out) {
    char nb[32];
    if (c->n - c->i >= 4 && memcmp(c->s + c->i, "True", 4) == 0) {
        c->i += 4;
        *out = 1;
        return 0;
    }
    if (c->n - c->i >= 5 && memcmp(c->s + c->i, "False", 5) == 0) {
        c->i += 5;
        *out = 0;
        return 0;
    }
    return npy_fail(src, KL_ERR_FORMAT, "bad header: 'fortran_order' is not True or False at %s",
                    near(c, nb, sizeof nb));
}

/* A Python tuple of non-negative ints: (), (3,), (2, 3), (2, 3,); "3L" as
 * Python 2's numpy wrote longs. (3) is an int, not a tuple, so numpy rejects
 * it and so do we. */
static int parse_shape(const npy_src *src, cursor *c, npy_header *h) {
    char nb[32];
    if (!eat(c, '('))
        return npy_fail(src, KL_ERR_FORMAT, "bad shape: expected a tuple at %s", near(c, nb, sizeof nb));
    skip_ws(c);
    h->ndim = 0;
    int commas = 0;
    while (!eat(c, ')')) {
        if (h->ndim > commas)
            return npy_fail(src, KL_ERR_FORMAT, "bad shape: expected ',' or ')' at %s", near(c, nb, sizeof nb));
        if (eat(c, '-'))
            return npy_fail(src, KL_ERR_FORMAT, "bad shape: negative dimension in dim %d", h->ndim);
        if (peek(c) < '0' || peek(c) > '9')
            return npy_fail(src, KL_ERR_FORMAT, "bad shape: expected a dimension at %s", near(c, nb, sizeof nb));
        if (h->ndim == KL_MAX_DIMS)
            return npy_fail(src, KL_ERR_FORMAT, "shape has more than %d dims, Kiln's limit", KL_MAX_DIMS);
        int64_t v = 0;
        while (peek(c) >= '0' && peek(c) <= '9') {
            int digit = peek(c) - '0';
            if (v > (INT64_MAX - digit) / 10)
                return npy_fail(src, KL_ERR_FORMAT, "bad shape: dimension %d does not fit in 64 bits", h->ndim);
            v = v * 10 + digit;
            c->i++;
        }
        eat(c, 'L');
        h->shape[h->ndim++] = v;
        skip_ws(c);
        if (eat(c, ',')) {
            commas++;
            skip_ws(c);
        }
    }
    if (h->ndim == 1 && commas == 0)
        return npy_fail(src, KL_ERR_FORMAT, "bad shape: (%lld) is an int, not a tuple (write (%lld,))",
                        (long long)h->shape[0], (long long)h->shape[0]);
    return 0;
}

/* The dict: exactly the keys descr, fortran_order and shape, in any order. */
static int parse_dict(const npy_src *src, const char *text, size_t len, npy_header *h) {
    cursor c = {text, 0, len};
    char key[32], nb[32];
    int seen[3] = {0, 0, 0}, items = 0, comma = 0;
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    skip_ws(&c);
    if (!eat(&c, '{'))
        return npy_fail(src, KL_ERR_FORMAT, "bad header: not a dict literal (starts with %s)", near(&c, nb, sizeof nb));
    for (;;) {
        skip_ws(&c);
        if (eat(&c, '}')) break;
        if (items > 0 && !comma)
            return npy_fail(src, KL_ERR_FORMAT, "bad header: expected ',' or '}' at %s", near(&c, nb, sizeof nb));
        if (parse_string(src, &c, key, sizeof key, "key")) return -1;
        int k = 0;
        while (k < 3 && strcmp(key, keys[k]) != 0) k++;
        if (k == 3) return npy_fail(src, KL_ERR_FORMAT, "bad header: unexpected key '%s'", key);
        if (seen[k]) return npy_fail(src, KL_ERR_FORMAT, "bad header: key '%s' appears twice", key);
        seen[k] = 1;
        skip_ws(&c);
        if (!eat(&c, ':'))
            return npy_fail(src, KL_ERR_FORMAT, "bad header: expected ':' after '%s'", key);
        skip_ws(&c);
        int rc = k == 0 ? parse_descr(src, &c, h) : k == 1 ? parse_bool(src, &c, &h->fortran) : parse_shape(src, &c, h);
        if (rc) return -1;
        items++;
        skip_ws(&c);
        comma = eat(&c, ',');
    }
    skip_ws(&c);
    if (c.i != c.n)
        return npy_fail(src, KL_ERR_FORMAT, "bad header: unexpected %s after the dict", near(&c, nb, sizeof nb));
    for (int k = 0; k < 3; k++)
        if (!seen[k]) return npy_fail(src, KL_ERR_FORMAT, "bad header: missing key '%s'", keys[k]);
    return 0;
}

/* Validates the preamble, header and sizes of a len-byte image. */
static int parse_npy(const npy_src *src, const uint8_t *p, size_t len, npy_header *h) {
    memset(h, 0, sizeof *h);
    if (len < 10)
        return npy_fail(src, KL_ERR_FORMAT, "truncated: %zu bytes, shorter than the 10-byte .npy preamble", len);
    if (memcmp(p, npy_magic, sizeof npy_magic) != 0)
        return npy_fail(src, KL_ERR_FORMAT, "bad magic: not a .npy file");
    int major = p[6], minor = p[7];
    if (major < 1 || major > 3 || minor != 0)
        return npy_fail(src, KL_ERR_FORMAT, "unsupported format version %d.%d (Kiln reads 1.0, 2.0 and 3.0)",
                        major, minor);
    size_t prefix = major == 1 ? 10 : 12, hlen;
    if (len < prefix)
        return npy_fail(src, KL_ERR_FORMAT, "truncated: %zu bytes, shorter than the %zu-byte preamble", len, prefix);
    if (major == 1)
        hlen = (size_t)p[8] | (size_t)p[9] << 8;
    else
        hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
    if (hlen > len - prefix)
        return npy_fail(src, KL_ERR_FORMAT, "truncated header: header length %zu but only %zu bytes follow", hlen,
                        len - prefix);
    if (parse_dict(src, (const char *)p + prefix, hlen, h)) return -1;

    /* numpy's rule: the product of the nonzero dims must fit, so even an
     * empty array's strides cannot overflow. */
    uint64_t n = ke_dtypes[h->dt].size;
    int empty = 0;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] == 0) {
            empty = 1;
            continue;
        }
        if (__builtin_mul_overflow(n, (uint64_t)h->shape[d], &n) || n > (uint64_t)INT64_MAX) {
            char sh[200];
            return npy_fail(src, KL_ERR_FORMAT, "shape %s of %s is too large",
                            ke_fmt_shape(sh, sizeof sh, h->ndim, h->shape), ke_dtypes[h->dt].name);
        }
    }
    h->data_off = prefix + hlen;
    h->nbytes = empty ? 0 : (size_t)n;
    if (h->nbytes > len - h->data_off) {
        char sh[200];
        return npy_fail(src, KL_ERR_FORMAT, "truncated data: shape %s of %s needs %zu bytes, %zu present",
                        ke_fmt_shape(sh, sizeof sh, h->ndim, h->shape), ke_dtypes[h->dt].name, h->nbytes,
                        len - h->data_off);
    }
    return 0;
}

/* ---- building the tensor ------------------------------------------------------------ */

static void npy_strides(const npy_header *h, int64_t *st) {
    if (!h->fortran) {
        ke_contiguous_strides(h->ndim, h->shape, st);
        return;
    }
    int64_t s = 1;
    for (int d = 0; d < h->ndim; d++) {
        st[d] = s;
        s *= h->shape[d] > 1 ? h->shape[d] : 1;
    }
}

static void byteswap(uint8_t *p, size_t nbytes, size_t es) {
    for (size_t i = 0; i + es <= nbytes; i += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            uint8_t t = p[i + a];
            p[i + a] = p[i + b];
            p[i + b] = t;
        }
}

static void normalize_bools(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] > 1) p[i] = 1;
}

/* A new tensor holding a copy of the data (fixed up for byte order and bools). */
static kl_tensor *npy_copy(const npy_header *h, const uint8_t *data) {
    int64_t st[KL_MAX_DIMS];
    npy_strides(h, st);
    if (h->nbytes == 0) return kl_empty_on(h->ndim, h->shape, h->dt, KL_DEVICE_CPU);
    /* A contiguous block over the data's own layout, viewed with its strides. */
    kl_tensor *flat = kl_empty_on(1, (const int64_t[]){(int64_t)(h->nbytes / ke_dtypes[h->dt].size)}, h->dt,
                                  KL_DEVICE_CPU);
    if (!flat) return NULL;
    uint8_t *dst = (uint8_t *)ke_data(flat);
    memcpy(dst, data, h->nbytes);
    if (h->swap) byteswap(dst, h->nbytes, ke_dtypes[h->dt].size);
    if (h->dt == KL_BOOL) normalize_bools(dst, h->nbytes);
    kl_tensor *t = kl_as_strided(flat, h->ndim, h->shape, st, 0);
    kl_release(flat);
    return t;
}

kl_tensor *kl_load_npy_buffer(const void *buf, size_t len) {
    npy_src src = {"load_npy_buffer", NULL};
    npy_header h;
    if (!buf && len) {
        ke_err(KL_ERR_NULL_ARG, src.op, "buffer pointer is NULL for %zu bytes", len);
        return NULL;
    }
    if (parse_npy(&src, buf ? buf : (const void *)"", buf ? len : 0, &h)) return NULL;
    return npy_copy(&h, (const uint8_t *)buf + h.data_off);
}

typedef struct npy_map {
    void *base;
    size_t len;
} npy_map;

static void npy_unmap(void *data, void *ctx) {
    npy_map *m = ctx;
    munmap(m->base, m->len);
    free(m);
}

/* map: wrap the file's private mapping in place when it can (kl_load_npy);
 * otherwise read it all and copy (kl_load_npy_copy, pipes, procfs). */
static kl_tensor *load_npy(const char *op, const char *path, int map) {
    if (!path) {
        ke_err(KL_ERR_NULL_ARG, op, "path is NULL");
        return NULL;
    }
    npy_src src = {op, path};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        npy_fail(&src, KL_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    int bad_stat = fstat(fd, &st) != 0;
    if (bad_stat || S_ISDIR(st.st_mode)) {
        npy_fail(&src, KL_ERR_IO, "cannot read: %s", bad_stat ? strerror(errno) : "is a directory");
        close(fd);
        return NULL;
    }
    npy_header h;
    size_t len = (size_t)st.st_size;
    void *base = MAP_FAILED;
    if (map && S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
        /* Pipes, size-less files (procfs) and filesystems without mmap: read it all. */
        uint8_t *all = ke_read_all(fd, &len);
        int e = errno;
        close(fd);
        if (!all) {
            npy_fail(&src, KL_ERR_IO, "read failed: %s", strerror(e));
            return NULL;
        }
        kl_tensor *t = parse_npy(&src, all, len, &h) ? NULL : npy_copy(&h, all + h.data_off);
        free(all);
        return t;
    }
    close(fd);
    if (parse_npy(&src, base, len, &h)) {
        munmap(base, len);
        return NULL;
    }
    uint8_t *data = (uint8_t *)base + h.data_off;
    npy_map *m = NULL;
    if (h.nbytes && !h.swap && h.data_off % ke_dtypes[h.dt].size == 0) m = malloc(sizeof *m);
    if (!m) {
        kl_tensor *t = npy_copy(&h, data);
        munmap(base, len);
        return t;
    }
    /* Zero-copy: the private mapping is the storage. Fixing bool bytes
     * writes only the pages that need it (copy-on-write). */
    if (h.dt == KL_BOOL) normalize_bools(data, h.nbytes);
    m->base = base;
    m->len = len;
    int64_t strides[KL_MAX_DIMS];
    npy_strides(&h, strides);
    kl_tensor *t = kl_from_blob(data, h.ndim, h.shape, strides, h.dt, npy_unmap, m);
    if (!t) npy_unmap(data, m); /* kl_from_blob leaves the memory to us on failure */
    return t;
}

kl_tensor *kl_load_npy(const char *path) { return load_npy("load_npy", path, 1); }

kl_tensor *kl_load_npy_copy(const char *path) { return load_npy("load_npy_copy", path, 0); }

/* ---- saving ---------------------------------------------------------------------------- */

/* numpy 1.24's header for a C-order array, padding and all. Returns its length. */
static size_t npy_header_text(char *out, size_t cap, kl_dtype dt, int ndim, const int64_t *shape, int *major) {
    char dict[512], sh[256];
    size_t k = 0;
    const char *code = "";
    for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
        if (npy_types[i].dt == dt) code = npy_types[i].code;
    char order = ke_dtypes[dt].size == 1 ? '|' : NPY_NATIVE;
    k += (size_t)snprintf(sh + k, sizeof sh - k, "(");
    for (int d = 0; d < ndim; d++) k += (size_t)snprintf(sh + k, sizeof sh - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    snprintf(sh + k, sizeof sh - k, ndim == 1 ? ",)" : ")");
    int dl = snprintf(dict, sizeof dict, "{'descr': '%c%s', 'fortran_order': False, 'shape': %s, }", order, code, sh);
    /* numpy leaves room to grow the first dim in place (GROWTH_AXIS_MAX_DIGITS). */
    if (ndim > 0) {
        int digits = snprintf(NULL, 0, "%lld", (long long)shape[0]);
        dl += snprintf(dict + dl, sizeof dict - (size_t)dl, "%*s", 21 - digits, "");
    }
    size_t hlen = (size_t)dl + 1, prefix = 10, pad = 64 - (prefix + hlen) % 64;
    *major = 1;
    if (hlen + pad > 65535) { /* too long for 1.0's 16-bit length */
        *major = 2, prefix = 12;
        pad = 64 - (prefix + hlen) % 64;
    }
    size_t total = prefix + hlen + pad;
    if (total > cap) return 0;
    memcpy(out, npy_magic, 6);
    out[6] = (char)*major;
    out[7] = 0;
    uint32_t field = (uint32_t)(hlen + pad);
    for (size_t i = 0; i < prefix - 8; i++) out[8 + i] = (char)(field >> (8 * i));
    memcpy(out + prefix, dict, (size_t)dl);
    memset(out + prefix + dl, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

int kl_save_npy(const char *path, const kl_tensor *t) {
    npy_src src = {"save_npy", path};
    if (ke_check_tensor(t, "save_npy", 1) || ke_check_data(t, "save_npy")) return kl_last_status();
    if (!path) {
        ke_err(KL_ERR_NULL_ARG, "save_npy", "path is NULL");
        return KL_ERR_NULL_ARG;
    }
    if (t->storage->device.type == KL_META) {
        char desc[256];
        npy_fail(&src, KL_ERR_DEVICE, "cannot save %s: move it to the CPU first", ke_fmt_tensor(desc, sizeof desc, t));
        return KL_ERR_DEVICE;
    }
    int rc = 0;
    kl_scope_begin();
    kl_tensor *c = (kl_tensor *)t;
    if (c->storage->device.type != KL_CPU) c = kl_to_device(c, KL_DEVICE_CPU); /* through the host */
    if (c && c->dtype == KL_BF16) c = kl_to_dtype(c, KL_F32);
    c = kl_contiguous(c);
    if (!c) {
        rc = -1;
    } else {
        char hdr[1024];
        int major;
        size_t hn = npy_header_text(hdr, sizeof hdr, (kl_dtype)c->dtype, c->ndim, c->shape, &major);
        size_t dn = (size_t)ke_numel(c->ndim, c->shape) * ke_dtypes[c->dtype].size;
        KE_ASSERT(hn > 0);
        const void *parts[2] = {hdr, dn ? ke_data(c) : NULL};
        size_t sizes[2] = {hn, dn};
        rc = ke_write_file_atomic("save_npy", path, 2, parts, sizes);
    }
    kl_scope_end();
    return rc ? (int)kl_last_status() : 0;
}
