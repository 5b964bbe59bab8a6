/*
 * print.c — kl_format / kl_print: PyTorch 1.13's tensor repr
 * (torch/_tensor_str.py), reproduced rule for rule so a Kiln tensor prints
 * exactly as the same torch tensor would. The one deliberate difference:
 * dtype suffixes name the dtype without "torch." (", dtype=float64").
 *
 * The text is built in a growable buffer, then copied out with snprintf
 * semantics. Values are read through the strides (no contiguous copy); a
 * CUDA tensor is copied to the CPU first; meta tensors print their size.
 *
 * How torch does it, and so how this file does it:
 *  - Above `threshold` elements the repr is summarized: every dim longer than
 *    2*edgeitems shows its first and last edgeitems entries around "...".
 *  - One formatter for the whole tensor, built from the elements actually
 *    shown: a common width, and for floats a mode chosen from the nonzero
 *    finite values: "int" (all integral: "1."), "sci" (max/min > 1000,
 *    max > 1e8, or min < 1e-4 when not int: "%.{p}e"), else fixed "%.{p}f".
 *  - Rows wrap at linewidth; suffixes (device, size, dtype) go on the last
 *    line or a new one when they would pass linewidth.
 */
#include "core.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- options (process-wide, like torch.set_printoptions) -------------------- */

static _Atomic int opt_precision = 4;
static _Atomic int64_t opt_threshold = 1000;
static _Atomic int opt_edgeitems = 3;
static _Atomic int opt_linewidth = 80;

/* Values below a setting's minimum (precision 0, threshold 0, edgeitems 1,
 * linewidth 1), e.g. -1, keep that setting: torch's edgeitems=0 prints the
 * whole dim after "..." (a slicing accident), so it is refused. */
void kl_set_print_options(int precision, int64_t threshold, int edgeitems, int linewidth) {
    /* past 64 digits a double has nothing left to show, and "%.*f" with a
     * huge precision would build a gigabyte string per element */
    if (precision >= 0) atomic_store(&opt_precision, precision < 64 ? precision : 64);
    if (threshold >= 0) atomic_store(&opt_threshold, threshold);
    if (edgeitems >= 1) atomic_store(&opt_edgeitems, edgeitems);
    if (linewidth >= 1) atomic_store(&opt_linewidth, linewidth);
}

typedef struct popts {
    int precision, edgeitems, linewidth;
    int64_t threshold;
} popts;

/* ---- growable text buffer ----------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static int sb_reserve(sbuf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return -1;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (sb_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_spaces(sbuf *b, size_t n) {
    if (sb_reserve(b, n)) return;
    memset(b->p + b->n, ' ', n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0 || sb_reserve(b, (size_t)len)) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)len + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)len;
}

/* Right-aligns what was appended since `start` in a field of `width`. */
static void sb_pad_from(sbuf *b, size_t start, size_t width) {
    size_t len = b->n - start;
    if (len >= width || sb_reserve(b, width - len)) return;
    memmove(b->p + start + (width - len), b->p + start, len + 1);
    memset(b->p + start, ' ', width - len);
    b->n += width - len;
}

/* ---- the formatter (torch's _Formatter) ----------------------------------------- */

typedef struct fmtr {
    int floating, int_mode, sci_mode;
    size_t width;
    int precision;
} fmtr;

/* The element view being printed: data, dtype, shape and element strides. */
typedef struct pview {
    const char *data;
    kl_dtype dt;
    int ndim;
    const int64_t *shape, *stride;
    int summarize, edge;
} pview;

static double elem_f(const pview *v, int64_t off) {
    return ke_load_f64(v->data, v->dt, off);
}

/* Python's float formatting for nan/inf ("nan" whatever the sign bit), or NULL. */
static const char *nonfinite_str(double x) {
    if (isnan(x)) return "nan";
    if (isinf(x)) return x > 0 ? "inf" : "-inf";
    return NULL;
}

/* Calls fn on the storage offset of every shown element, in row-major order. */
typedef void (*elem_fn)(const pview *v, int64_t off, void *ctx);
static void for_each_shown(const pview *v, elem_fn fn, void *ctx) {
    int64_t idx[KL_MAX_DIMS] = {0}, off = 0;
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] == 0) return;
    for (;;) {
        fn(v, off, ctx);
        int d = v->ndim - 1;
        for (; d >= 0; d--) {
            int64_t n = v->shape[d], i = idx[d] + 1;
            if (v->summarize && n > 2 * (int64_t)v->edge && i == v->edge) i = n - v->edge;
            if (i < n) {
                off += (i - idx[d]) * v->stride[d];
                idx[d] = i;
                break;
            }
            off -= idx[d] * v->stride[d];
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

typedef struct fstats {
    int any;               /* nonzero finite values seen */
    int int_mode;
    double amin, amax;
    size_t width;
    const fmtr *f;         /* pass 2: the mode decided */
} fstats;

static void stat_pass1(const pview *v, int64_t off, void *ctx) {
    fstats *s = ctx;
    if (!ke_is_float(v->dt)) {
        char tmp[32];
        size_t len;
        if (v->dt == KL_BOOL)
            len = elem_f(v, off) != 0 ? 4 : 5;
        else
            len = (size_t)snprintf(tmp, sizeof tmp, "%lld", (long long)ke_load_i64(v->data, v->dt, off));
        if (len > s->width) s->width = len;
        return;
    }
    double x = elem_f(v, off);
    if (!isfinite(x) || x == 0) return;
    double a = fabs(x);
    if (!s->any) s->amin = s->amax = a;
    if (a < s->amin) s->amin = a;
    if (a > s->amax) s->amax = a;
    s->any = 1;
    if (x != ceil(x)) s->int_mode = 0;
}

static void stat_pass2(const pview *v, int64_t off, void *ctx) {
    fstats *s = ctx;
    double x = elem_f(v, off);
    if (!isfinite(x) || x == 0) return;
    int p = s->f->precision;
    size_t len;
    if (s->f->sci_mode)
        len = (size_t)snprintf(NULL, 0, "%.*e", p, x);
    else if (s->f->int_mode)
        len = (size_t)snprintf(NULL, 0, "%.0f", x) + 1;
    else
        len = (size_t)snprintf(NULL, 0, "%.*f", p, x);
    if (len > s->width) s->width = len;
}

static fmtr make_formatter(const pview *v, int precision) {
    fmtr f = {.floating = ke_is_float(v->dt), .int_mode = 1, .sci_mode = 0, .width = 1, .precision = precision};
    fstats s = {.int_mode = 1, .width = 1};
    for_each_shown(v, stat_pass1, &s);
    if (!f.floating || !s.any) {
        f.width = s.width;
        return f;
    }
    f.int_mode = s.int_mode;
    if (f.int_mode)
        f.sci_mode = s.amax / s.amin > 1000.0 || s.amax > 1.0e8;
    else
        f.sci_mode = s.amax / s.amin > 1000.0 || s.amax > 1.0e8 || s.amin < 1.0e-4;
    s.f = &f;
    for_each_shown(v, stat_pass2, &s);
    f.width = s.width;
    return f;
}

static void fmt_value(sbuf *b, const fmtr *f, const pview *v, int64_t off) {
    size_t start = b->n;
    if (!f->floating) {
        if (v->dt == KL_BOOL)
            sb_puts(b, elem_f(v, off) != 0 ? "True" : "False");
        else
            sb_printf(b, "%lld", (long long)ke_load_i64(v->data, v->dt, off));
    } else {
        double x = elem_f(v, off);
        const char *nf = nonfinite_str(x);
        if (nf)
            sb_puts(b, nf);
        else if (f->sci_mode)
            sb_printf(b, "%.*e", f->precision, x);
        else if (f->int_mode)
            sb_printf(b, "%.0f.", x);
        else
            sb_printf(b, "%.*f", f->precision, x);
    }
    sb_pad_from(b, start, f->width);
}

/* ---- layout (torch's _vector_str / _tensor_str_with_formatter) -------------------- */

static void emit(sbuf *b, const fmtr *f, const pview *v, int d, int64_t off, size_t indent, int linewidth) {
    if (d == v->ndim) {
        fmt_value(b, f, v, off);
        return;
    }
    int64_t n = v->shape[d];
    int skip = v->summarize && n > 2 * (int64_t)v->edge;
    sb_putn(b, "[", 1);
    if (d == v->ndim - 1) {
        int64_t item_len = (int64_t)f->width + 2, avail = (int64_t)linewidth - (int64_t)indent;
        int64_t per_line = avail > 0 ? avail / item_len : 0, k = 0;
        if (per_line < 1) per_line = 1;
        for (int64_t i = 0; i < n; i++, k++) {
            if (k > 0) {
                if (k % per_line == 0) {
                    sb_putn(b, ",\n", 2);
                    sb_spaces(b, indent + 1);
                } else {
                    sb_putn(b, ", ", 2);
                }
            }
            if (skip && i == v->edge) {
                sb_puts(b, " ...");
                i = n - v->edge - 1;
                continue;
            }
            fmt_value(b, f, v, off + i * v->stride[d]);
        }
    } else {
        int rest = v->ndim - d; /* dims of this slice */
        for (int64_t i = 0; i < n; i++) {
            if (i > 0) {
                sb_putn(b, ",", 1);
                for (int k = 0; k < rest - 1; k++) sb_putn(b, "\n", 1);
                sb_spaces(b, indent + 1);
            }
            if (skip && i == v->edge) {
                sb_puts(b, "...");
                i = n - v->edge - 1;
                continue;
            }
            emit(b, f, v, d + 1, off + i * v->stride[d], indent + 1, linewidth);
        }
    }
    sb_putn(b, "]", 1);
}

/* ---- suffixes (torch's _add_suffixes) ------------------------------------------------ */

static void add_suffixes(sbuf *b, char suffixes[][160], int ns, size_t indent, int linewidth) {
    if (b->oom) return;
    size_t last_nl = 0;
    int found = 0;
    for (size_t i = b->n; i-- > 0;)
        if (b->p[i] == '\n') {
            last_nl = i, found = 1;
            break;
        }
    /* torch: len(s) - s.rfind("\n") + 1, with rfind = -1 when there is none */
    int64_t last_len = found ? (int64_t)(b->n - last_nl) + 1 : (int64_t)b->n + 2;
    for (int i = 0; i < ns; i++) {
        int64_t slen = (int64_t)strlen(suffixes[i]);
        if (last_len + slen + 2 > linewidth) {
            sb_putn(b, ",\n", 2);
            sb_spaces(b, indent);
            last_len = (int64_t)indent + slen;
        } else {
            sb_putn(b, ", ", 2);
            last_len += slen + 2;
        }
        sb_puts(b, suffixes[i]);
    }
    sb_putn(b, ")", 1);
}

static void fmt_size(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "size=(");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (n < cap) snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
}

/* Builds the repr of a live tensor into b. Returns 0 or -1 (error recorded). */
static int build_repr(sbuf *b, const kl_tensor *t) {
    const popts o = {atomic_load(&opt_precision), atomic_load(&opt_edgeitems), atomic_load(&opt_linewidth),
                     atomic_load(&opt_threshold)};
    const char *prefix = "tensor(";
    const size_t indent = 7;
    kl_dtype dt = (kl_dtype)t->dtype, def = kl_get_default_dtype();
    kl_device dev = t->storage->device;
    int64_t numel = ke_numel(t->ndim, t->shape);
    char suffixes[3][160];
    int ns = 0;

    if (dev.type != KL_CPU) {
        if (dev.type == KL_CUDA)
            snprintf(suffixes[ns++], sizeof suffixes[0], "device='cuda:%d'", dev.index);
        else
            snprintf(suffixes[ns++], sizeof suffixes[0], "device='%s'", ke_device_name(dev));
    }
    sb_puts(b, prefix);
    if (dev.type == KL_META || numel == 0) {
        /* No values to show: torch spells out the size (except an empty 1-D
         * tensor) and any non-default dtype, since nothing else reveals it. */
        if (dev.type == KL_META || t->ndim != 1) fmt_size(suffixes[ns++], sizeof suffixes[0], t->ndim, t->shape);
        if (dt != def) snprintf(suffixes[ns++], sizeof suffixes[0], "dtype=%s", ke_dtypes[dt].name);
        sb_puts(b, dev.type == KL_META ? "..." : "[]");
        add_suffixes(b, suffixes, ns, indent, o.linewidth);
        return 0;
    }
    if (dt != def && dt != KL_I64 && dt != KL_BOOL)
        snprintf(suffixes[ns++], sizeof suffixes[0], "dtype=%s", ke_dtypes[dt].name);

    int rc = 0;
    kl_scope_begin();
    const kl_tensor *src = t;
    if (dev.type != KL_CPU) {
        src = kl_to_device((kl_tensor *)t, KL_DEVICE_CPU);
        if (!src) rc = -1;
    }
    if (!rc) {
        pview v = {ke_data(src), dt, src->ndim, src->shape, src->stride, numel > o.threshold, o.edgeitems};
        fmtr f = make_formatter(&v, o.precision);
        emit(b, &f, &v, 0, 0, indent, o.linewidth);
        add_suffixes(b, suffixes, ns, indent, o.linewidth);
    }
    kl_scope_end();
    return rc;
}

/* The repr of t in b (the caller frees b->p). Returns 0 or -1 (error recorded). */
static int format_into(sbuf *b, const kl_tensor *t) {
    if (ke_check_tensor(t, "format", 1) || ke_check_data(t, "format")) return -1;
    char desc[256];
    if (build_repr(b, t)) return -1;
    if (b->oom)
        return ke_err(KL_ERR_OOM, "format", "out of memory building the repr of %s",
                      ke_fmt_tensor(desc, sizeof desc, t));
    if (b->n > INT_MAX) return ke_err(KL_ERR_OVERFLOW, "format", "repr of %zu bytes does not fit an int", b->n);
    return 0;
}

int kl_format(const kl_tensor *t, char *buf, size_t cap) {
    sbuf b = {0};
    int rc = format_into(&b, t);
    if (!rc && buf && cap > 0) {
        size_t k = b.n < cap - 1 ? b.n : cap - 1;
        if (k) memcpy(buf, b.p, k);
        buf[k] = 0;
    }
    free(b.p);
    return rc ? -1 : (int)b.n;
}

/* On failure kl_print still prints a line naming the error, which stays
 * pending like any other. */
void kl_print(const kl_tensor *t) {
    sbuf b = {0};
    if (format_into(&b, t) == 0)
        printf("%s\n", b.p);
    else
        printf("tensor(<error: %s>)\n", kl_last_error());
    free(b.p);
}
