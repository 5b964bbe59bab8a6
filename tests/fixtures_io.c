/*
 * fixtures_io.c — the fixture manifest read into cases, a case's input specs
 * built into tensors (with their :bf16/:T/:S2/:E modifiers), and results
 * compared with torch's, naming the first mismatching element.
 */
#include "fixtures.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
/* ---- the manifest ----------------------------------------------------------------------------- */

static const char *fx_dir(void) {
    static char dir[PATH_MAX];
    char probe[PATH_MAX + 32];
    const char *env = getenv("KT_FIXTURES_DIR");
    if (env) return env;
    const char *rel[] = {"tests/fixtures", "../tests/fixtures", "../../tests/fixtures"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(probe, sizeof probe, "%s/manifest.txt", rel[i]);
        if (access(probe, R_OK) == 0) return rel[i];
    }
    /* meson runs tests from the build dir; the binary is build/tests/test_fixtures */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(dir, sizeof dir, "%.*s/../../tests/fixtures", (int)(sizeof dir - 32), exe);
        snprintf(probe, sizeof probe, "%s/manifest.txt", dir);
        if (access(probe, R_OK) == 0) return dir;
    }
    return NULL;
}

/* Splits "a,b,c" in place into up to max pointers; returns the count (-1 if more). */
static int fx_split_commas(char *s, char **out, int max) {
    int n = 0;
    for (char *tok = s; tok;) {
        char *comma = strchr(tok, ',');
        if (comma) *comma = 0;
        if (n == max) return -1;
        out[n++] = tok;
        tok = comma ? comma + 1 : NULL;
    }
    return n;
}

static bool fx_parse_line(char *line, int lineno, fx_case *c) {
    memset(c, 0, sizeof *c);
    c->line = lineno;
    char *save = NULL;
    c->name = strtok_r(line, " \t\r", &save);
    c->op = strtok_r(NULL, " \t\r", &save);
    if (!c->name || !c->op) return false;
    for (char *tok; (tok = strtok_r(NULL, " \t\r", &save));) {
        char *eq = strchr(tok, '=');
        if (!eq) return false;
        *eq = 0;
        char *v = eq + 1;
        if (!strcmp(tok, "in")) {
            if ((c->nin = fx_split_commas(v, c->in, FX_MAX_IN)) < 0) return false;
        } else if (!strcmp(tok, "out")) {
            if ((c->nout = fx_split_commas(v, c->out, FX_MAX_OUT)) < 0) return false;
        } else if (!strcmp(tok, "gw")) {
            if ((c->ngw = fx_split_commas(v, c->gw, FX_MAX_OUT)) < 0) return false;
        } else if (!strcmp(tok, "grad")) {
            if ((c->ngrad = fx_split_commas(v, c->grad, FX_MAX_IN)) < 0) return false;
        } else {
            if (c->nattr == FX_MAX_ATTR) return false;
            c->key[c->nattr] = tok;
            c->val[c->nattr++] = v;
            if (!strcmp(tok, "error")) c->error = atoi(v) != 0;
            if (!strcmp(tok, "novalues")) c->novalues = atoi(v) != 0;
        }
    }
    return true;
}

bool fx_load_manifest(fx_manifest *m) {
    memset(m, 0, sizeof *m);
    const char *dir = fx_dir();
    if (!dir) {
        print_error("cannot find tests/fixtures/manifest.txt (set KT_FIXTURES_DIR)\n");
        return false;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.txt", dir);
    m->text = kt_read_text(path);
    if (!m->text) {
        print_error("cannot read %s\n", path);
        return false;
    }
    int cap = 1;
    for (const char *p = m->text; *p; p++) cap += *p == '\n';
    m->cases = calloc((size_t)cap, sizeof *m->cases);
    int lineno = 0;
    for (char *line = m->text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        if (*line && *line != '#') {
            if (!fx_parse_line(line, lineno, &m->cases[m->n])) {
                print_error("manifest.txt:%d: malformed line\n", lineno);
                return false;
            }
            m->n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    return m->n > 0;
}

void fx_free_manifest(fx_manifest *m) {
    free(m->cases);
    free(m->text);
}

/* ---- building inputs -------------------------------------------------------------------------- */

/* "file:mod:mod" -> a tensor; its dtype for outputs goes to *want (bf16 marks).
 * With leaf, the loaded tensor is marked requires_grad before the modifiers
 * and returned there (the tensor whose gradient is compared). */
kl_tensor *fx_build_leaf(const char *spec, kl_dtype *want, kl_tensor **leaf, char *err, size_t cap) {
    char buf[512], path[PATH_MAX + 600];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL, *file = strtok_r(buf, ":", &save);
    snprintf(path, sizeof path, "%s/npy/%s", fx_dir(), file);
    kl_tensor *t = kl_load_npy(path);
    if (!t) {
        snprintf(err, cap, "cannot load %s: %s", file, kl_last_error());
        return NULL;
    }
    if (want) *want = kl_dtype_of(t);
    if (leaf) {
        if (kl_set_requires_grad(t, true) != 0) {
            snprintf(err, cap, "cannot make %s a leaf: %s", file, kl_last_error());
            return NULL;
        }
        *leaf = t;
    }
    for (char *mod; t && (mod = strtok_r(NULL, ":", &save));) {
        if (!strcmp(mod, "bf16")) {
            if (want) *want = KL_BF16;
            else t = kl_to_dtype(t, KL_BF16);
        } else if (!strcmp(mod, "T")) {
            t = kl_transpose(t, -1, -2);
        } else if (!strcmp(mod, "S2")) {
            t = kl_slice(t, -1, 0, INT64_MAX, 2);
        } else if (!strncmp(mod, "E=", 2)) {
            int64_t shape[KL_MAX_DIMS];
            int n = 0;
            for (char *p = mod + 2; *p && n < KL_MAX_DIMS;) {
                char *end;
                shape[n++] = strtoll(p, &end, 10);
                p = *end == 'x' ? end + 1 : end;
            }
            t = kl_expand(t, n, shape);
        } else {
            snprintf(err, cap, "unknown modifier ':%s'", mod);
            return NULL;
        }
    }
    if (!t) snprintf(err, cap, "building %s failed: %s", spec, kl_last_error());
    return t;
}

kl_tensor *fx_build(const char *spec, kl_dtype *want, char *err, size_t cap) {
    return fx_build_leaf(spec, want, NULL, err, cap);
}

/* ---- comparing -------------------------------------------------------------------------------- */

static double fx_half(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Element i (row-major over the logical shape) read straight from memory,
 * so comparisons do not depend on Kiln's own conversion kernels. */
static void fx_elem(const kl_tensor *t, int64_t i, double *f, int64_t *n) {
    int nd = kl_ndim(t);
    const int64_t *shape = kl_shape(t), *stride = kl_stride(t);
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % shape[d]) * stride[d];
        i /= shape[d];
    }
    const char *p = (const char *)kl_data_ptr(t) + off * (int64_t)kl_dtype_size(kl_dtype_of(t));
    *n = 0;
    *f = 0;
    switch (kl_dtype_of(t)) {
    case KL_F32: { float v; memcpy(&v, p, 4); *f = v; break; }
    case KL_F64: memcpy(f, p, 8); break;
    case KL_F16: { uint16_t h; memcpy(&h, p, 2); *f = fx_half(h); break; }
    case KL_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        uint32_t u = (uint32_t)h << 16;
        float v;
        memcpy(&v, &u, 4);
        *f = v;
        break;
    }
    case KL_I32: { int32_t v; memcpy(&v, p, 4); *n = v; break; }
    case KL_I64: memcpy(n, p, 8); break;
    case KL_U8: case KL_BOOL: *n = *(const uint8_t *)p; break;
    default: break;
    }
}

double fx_default_tol(kl_dtype d) {
    switch (d) {
    case KL_F32: return 1e-5;
    case KL_F64: return 1e-12;
    case KL_F16: return 1e-3;
    case KL_BF16: return 1e-2;
    default: return 0;
    }
}

static void fx_fmt_shape(char *buf, size_t cap, const kl_tensor *t) {
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < kl_ndim(t) && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ",%lld" : "%lld", (long long)kl_shape(t)[d]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
}

static void fx_fmt_index(char *buf, size_t cap, const kl_tensor *t, int64_t i) {
    int nd = kl_ndim(t);
    int64_t idx[KL_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = i % kl_shape(t)[d];
        i /= kl_shape(t)[d];
    }
    int n = snprintf(buf, cap, "[");
    for (int d = 0; d < nd && n < (int)cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, d ? ",%lld" : "%lld", (long long)idx[d]);
    if (n < (int)cap) snprintf(buf + n, cap - (size_t)n, "]");
}

/* 0 if got matches want (shape, dtype want_dt, values), else 1 and a message. */
int fx_compare(kl_tensor *got, kl_tensor *want, kl_dtype want_dt, double tol, bool values, char *msg,
                      size_t cap) {
    char s1[128], s2[128];
    fx_fmt_shape(s1, sizeof s1, got);
    fx_fmt_shape(s2, sizeof s2, want);
    if (strcmp(s1, s2)) return snprintf(msg, cap, "shape %s, torch %s", s1, s2), 1;
    if (kl_dtype_of(got) != want_dt)
        return snprintf(msg, cap, "dtype %s, torch %s", kl_dtype_name(kl_dtype_of(got)), kl_dtype_name(want_dt)), 1;
    if (!values) return 0;
    bool fl = kl_dtype_is_floating(want_dt);
    int64_t n = kl_numel(want), bad = 0, first = -1;
    double gf = 0, wf = 0;
    int64_t gi = 0, wi = 0;
    for (int64_t i = 0; i < n; i++) {
        double a, b;
        int64_t x, y;
        fx_elem(got, i, &a, &x);
        fx_elem(want, i, &b, &y);
        bool ok;
        if (!fl) ok = x == y;
        else if (isnan(b)) ok = isnan(a);
        else if (isinf(b)) ok = a == b;
        else ok = isfinite(a) && fabs(a - b) <= tol * (1 + fabs(b));
        if (!ok && bad++ == 0) first = i, gf = a, wf = b, gi = x, wi = y;
    }
    if (!bad) return 0;
    fx_fmt_index(s1, sizeof s1, want, first);
    if (fl)
        snprintf(msg, cap, "%lld of %lld differ; first at %s: got %.9g, torch %.9g (tol %g)", (long long)bad,
                 (long long)n, s1, gf, wf, tol);
    else
        snprintf(msg, cap, "%lld of %lld differ; first at %s: got %lld, torch %lld", (long long)bad, (long long)n, s1,
                 (long long)gi, (long long)wi);
    return 1;
}
