/*
 * attr_text.c — an op's named attributes as text and back: the one printer
 * (the graph IR writes a node's attributes with it, src/ir/print.c) and the
 * one parser (kl_op_call reads them, opcall.c), so whatever a graph prints,
 * a call by name accepts.
 *
 *     dims=[1], keepdim=true        shape=[2,3], value=0.5, dtype=f32
 *
 * Attributes follow their declaration order (the attrs column of
 * optable.def, src/ir/ir_attrs.def), each left out where it holds its
 * declared default; floats in the shortest form that reads back exactly,
 * dtypes, reductions and devices by name, lists in brackets. A random op's
 * seed and offset print as slot=N when they name a graph's per-call slot
 * (KE_RANDOM_SLOT).
 */
#include "dispatch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const reduction_names[] = {[KL_REDUCE_NONE] = "none", [KL_REDUCE_MEAN] = "mean",
                                              [KL_REDUCE_SUM] = "sum"};
static const char *const device_names[] = {[KL_CPU] = "cpu", [KL_CUDA] = "cuda", [KL_META] = "meta"};
#define N_REDUCTIONS ((int)(sizeof reduction_names / sizeof reduction_names[0]))
#define N_DEVICES ((int)(sizeof device_names / sizeof device_names[0]))

/* ---- printing ------------------------------------------------------------------------------- */

/* The shortest %g form that reads back as the same double. */
static void print_double(FILE *f, double v) {
    char b[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    fputs(b, f);
}

/* One attribute's value, by its declared type. */
static void print_value(FILE *f, const ke_attrs *a, const ke_attr_desc *d) {
    int64_t i = d->type == KE_AT_FLOAT || d->type >= KE_AT_LIST ? 0 : ke_attr_int_at(a, d);
    switch ((ke_attr_type)d->type) {
    case KE_AT_INT: fprintf(f, "%lld", (long long)i); break;
    case KE_AT_BOOL: fputs(i ? "true" : "false", f); break;
    case KE_AT_FLOAT: print_double(f, ke_attr_float_at(a, d)); break;
    case KE_AT_DTYPE:
        if (ke_dtype_valid((kl_dtype)i)) fputs(ke_dtypes[i].short_name, f);
        else fprintf(f, "%lld", (long long)i);
        break;
    case KE_AT_REDUCTION:
        if (i >= 0 && i < N_REDUCTIONS) fputs(reduction_names[i], f);
        else fprintf(f, "%lld", (long long)i);
        break;
    case KE_AT_DEVICE:
        if (i >= 0 && i < N_DEVICES) fputs(device_names[i], f);
        else fprintf(f, "%lld", (long long)i);
        break;
    case KE_AT_LIST:
    case KE_AT_LIST2: {
        int n;
        const int64_t *l = ke_attr_list_at(a, d, &n);
        fputc('[', f);
        for (int k = 0; k < n; k++) fprintf(f, "%s%lld", k ? "," : "", (long long)l[k]);
        fputc(']', f);
        break;
    }
    }
}

/* 1 if attribute d of a is at its default (so the text leaves it out). */
static int is_default(const ke_attrs *a, const ke_attr_desc *d) {
    if (d->def == KE_HIDDEN) return 1;
    if (d->def == KE_NODEF) return 0;
    if (d->type >= KE_AT_LIST) { /* a list with a default: empty is the default */
        int n;
        ke_attr_list_at(a, d, &n);
        return n == 0;
    }
    double v = d->type == KE_AT_FLOAT ? ke_attr_float_at(a, d) : (double)ke_attr_int_at(a, d);
    return v == d->def;
}

void ke_attrs_print(FILE *f, const ke_attr_set *s, int random, const ke_attrs *a, const char *lead) {
    int slot = random && ke_attr_offset(a) == KE_RANDOM_SLOT;
    const char *sep = lead;
    for (int k = 0; k < s->n; k++) {
        const ke_attr_desc *d = &s->attr[k];
        if (slot && (!strcmp(d->name, "seed") || !strcmp(d->name, "offset"))) {
            if (!strcmp(d->name, "seed")) fprintf(f, "%sslot=%lld", sep, (long long)ke_attr_seed(a));
            sep = ", ";
            continue;
        }
        if (is_default(a, d)) continue;
        fprintf(f, "%s%s=", sep, d->name);
        print_value(f, a, d);
        sep = ", ";
    }
}

char *ke_attrs_to_string(const ke_attr_set *s, int random, const ke_attrs *a) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        ke_err(KL_ERR_OOM, "op_call", "out of memory");
        return NULL;
    }
    ke_attrs_print(f, s, random, a, "");
    if (fclose(f) || !buf) {
        free(buf);
        ke_err(KL_ERR_OOM, "op_call", "out of memory");
        return NULL;
    }
    return buf;
}

/* ---- parsing -------------------------------------------------------------------------------- */

typedef struct parse {
    const ke_attr_set *s;
    const char *text, *at; /* the whole text (for messages) and the cursor */
    const char *who, *op;
} parse;

/* The op's attribute names, for "its attributes: ..." in messages. */
static void names_of(const ke_attr_set *s, int random, char *buf, size_t cap) {
    size_t u = 0;
    buf[0] = 0;
    for (int k = 0; k < s->n && u < cap; k++)
        u += (size_t)snprintf(buf + u, cap - u, "%s%s", k ? ", " : "", s->attr[k].name);
    if (random && u < cap) snprintf(buf + u, cap - u, "%sslot", s->n ? ", " : "");
    if (!s->n && !random) snprintf(buf, cap, "none");
}

static void skip_space(parse *p) {
    while (*p->at == ' ' || *p->at == '\t' || *p->at == '\n') p->at++;
}

/* A malformed value of attribute d: names the op, the attribute, the value and the whole text. */
static int bad_value(parse *p, const ke_attr_desc *d, const char *v, size_t n, const char *want) {
    return ke_err(KL_ERR_ARG, p->who, "%s: attribute %s: '%.*s' is not %s (in \"%s\")", p->op, d ? d->name : "slot",
                  (int)(n < 200 ? n : 200), v, want, p->text);
}

/* An integer of exactly v[0..n) into *out. */
static int parse_int(const char *v, size_t n, int64_t *out) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, v, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (*end || errno) return -1;
    *out = x;
    return 0;
}

static int parse_double(const char *v, size_t n, double *out) {
    char buf[64];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, v, n);
    buf[n] = 0;
    char *end;
    double x = strtod(buf, &end);
    if (*end) return -1;
    *out = x;
    return 0;
}

static int name_index(const char *const *names, int count, const char *v, size_t n) {
    for (int i = 0; i < count; i++)
        if (names[i] && strlen(names[i]) == n && !strncmp(names[i], v, n)) return i;
    return -1;
}

/* A list "[1,2,3]" at the cursor into l (at most cap elements); its count, or -1 (error recorded). */
static int parse_list(parse *p, const ke_attr_desc *d, int64_t *l, int cap) {
    const char *start = p->at;
    if (*p->at != '[') {
        size_t n = strcspn(p->at, ",");
        return bad_value(p, d, start, n, "a list like [1,2]");
    }
    p->at++;
    int n = 0;
    skip_space(p);
    if (*p->at == ']') {
        p->at++;
        return 0;
    }
    for (;;) {
        skip_space(p);
        size_t len = strcspn(p->at, ",] \t");
        int64_t x;
        if (parse_int(p->at, len, &x)) {
            size_t all = strcspn(start, "]");
            return bad_value(p, d, start, all + (start[all] == ']'), "a list of integers like [1,2]");
        }
        if (n == cap)
            return ke_err(KL_ERR_ARG, p->who, "%s: attribute %s: more than %d elements (in \"%s\")", p->op, d->name,
                          cap, p->text);
        l[n++] = x;
        p->at += len;
        skip_space(p);
        if (*p->at == ']') {
            p->at++;
            return n;
        }
        if (*p->at != ',') {
            size_t all = strcspn(start, "]");
            return bad_value(p, d, start, all + (start[all] == ']'), "a list of integers like [1,2]");
        }
        p->at++;
    }
}

/* The value of attribute d at the cursor into a. 0 or -1. */
static int parse_value(parse *p, const ke_attr_desc *d, ke_attrs *a) {
    if (d->type == KE_AT_LIST || d->type == KE_AT_LIST2) {
        int64_t l[KE_MAX_LIST];
        int room = KE_MAX_LIST - d->slot;
        const char *start = p->at;
        int n = parse_list(p, d, l, d->type == KE_AT_LIST2 ? 2 : room);
        if (n < 0) return -1;
        if (d->type == KE_AT_LIST2 && n != 2) return bad_value(p, d, start, (size_t)(p->at - start), "a pair like [1,2]");
        for (int k = 0; k < n; k++) a->list[d->slot + k] = l[k];
        if (d->type == KE_AT_LIST) a->nlist = d->slot + n;
        else if (a->nlist < d->slot + 2) a->nlist = d->slot + 2;
        return 0;
    }
    const char *v = p->at;
    size_t n = strcspn(v, ",");
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\n')) n--;
    p->at = v + n;
    int64_t x = 0;
    double f;
    switch ((ke_attr_type)d->type) {
    case KE_AT_INT:
        if (parse_int(v, n, &x)) return bad_value(p, d, v, n, "an integer");
        break;
    case KE_AT_BOOL:
        if ((x = name_index((const char *const[]){"false", "true"}, 2, v, n)) < 0)
            return bad_value(p, d, v, n, "a bool (true or false)");
        break;
    case KE_AT_FLOAT:
        if (parse_double(v, n, &f)) return bad_value(p, d, v, n, "a number");
        ke_attr_set_float_at(a, d, f);
        return 0;
    case KE_AT_DTYPE: {
        const char *names[KL_NUM_DTYPES];
        for (int k = 0; k < KL_NUM_DTYPES; k++) names[k] = ke_dtypes[k].short_name;
        if ((x = name_index(names, KL_NUM_DTYPES, v, n)) < 0)
            return bad_value(p, d, v, n, "a dtype (f32, f64, f16, bf16, i32, i64, u8, bool)");
        break;
    }
    case KE_AT_REDUCTION:
        if ((x = name_index(reduction_names, N_REDUCTIONS, v, n)) < 0)
            return bad_value(p, d, v, n, "a reduction (none, mean, sum)");
        break;
    case KE_AT_DEVICE:
        if ((x = name_index(device_names, N_DEVICES, v, n)) < 0)
            return bad_value(p, d, v, n, "a device type (cpu, cuda, meta)");
        break;
    default: break;
    }
    ke_attr_set_int_at(a, d, x);
    return 0;
}

int ke_attrs_parse(const ke_attr_set *s, int random, const char *text, ke_attrs *a, const char *who,
                   const char *op) {
    memset(a, 0, sizeof *a);
    parse p = {.s = s, .text = text ? text : "", .at = text ? text : "", .who = who, .op = op};
    uint32_t given = 0; /* bit k: attribute k was in the text */
    int slot_given = 0;
    for (;;) {
        skip_space(&p);
        if (!*p.at) break;
        const char *name = p.at;
        size_t n = 0;
        while ((name[n] >= 'a' && name[n] <= 'z') || (name[n] >= 'A' && name[n] <= 'Z') || name[n] == '_' ||
               (n && name[n] >= '0' && name[n] <= '9'))
            n++;
        p.at += n;
        skip_space(&p);
        if (!n || *p.at != '=') {
            size_t len = strcspn(name, ",");
            return ke_err(KL_ERR_ARG, who, "%s: expected name=value, got '%.*s' (in \"%s\")", op,
                          (int)(len < 200 ? len : 200), name, p.text);
        }
        p.at++;
        skip_space(&p);
        int k = 0;
        while (k < s->n && !(strlen(s->attr[k].name) == n && !strncmp(s->attr[k].name, name, n))) k++;
        if (k == s->n && random && n == 4 && !strncmp(name, "slot", 4)) { /* a graph's per-call reservation */
            const char *v = p.at;
            size_t len = strcspn(v, ",");
            while (len && v[len - 1] == ' ') len--;
            int64_t x;
            if (parse_int(v, len, &x) || x < 0) return bad_value(&p, NULL, v, len, "a slot number (0 or more)");
            if (slot_given || (given & 3u << 30))
                return ke_err(KL_ERR_ARG, who, "%s: slot= and seed=/offset= exclude each other (in \"%s\")", op, p.text);
            ke_attr_set_seed(a, x);
            ke_attr_set_offset(a, KE_RANDOM_SLOT);
            slot_given = 1;
            p.at = v + len;
        } else if (k == s->n) {
            char names[512];
            names_of(s, random, names, sizeof names);
            return ke_err(KL_ERR_ARG, who, "%s: unknown attribute '%.*s' (in \"%s\"; its attributes: %s)", op,
                          (int)(n < 100 ? n : 100), name, p.text, names);
        } else {
            if (given & 1u << k)
                return ke_err(KL_ERR_ARG, who, "%s: attribute %s given twice (in \"%s\")", op, s->attr[k].name, p.text);
            int rs = random && (!strcmp(s->attr[k].name, "seed") || !strcmp(s->attr[k].name, "offset"));
            if (rs && slot_given)
                return ke_err(KL_ERR_ARG, who, "%s: slot= and seed=/offset= exclude each other (in \"%s\")", op, p.text);
            given |= 1u << k;
            if (rs) given |= 1u << (!strcmp(s->attr[k].name, "seed") ? 30 : 31);
            if (parse_value(&p, &s->attr[k], a)) return -1;
        }
        skip_space(&p);
        if (*p.at == ',') p.at++;
        else if (*p.at)
            return ke_err(KL_ERR_ARG, who, "%s: expected ',' between attributes at '%.40s' (in \"%s\")", op, p.at,
                          p.text);
    }
    /* what the text left out: its default, or an error where there is none */
    int fresh = 0;
    if (random && !slot_given) {
        int seed = !!(given & 1u << 30), off = !!(given & 1u << 31);
        if (seed != off)
            return ke_err(KL_ERR_ARG, who, "%s: attribute %s is missing (in \"%s\"): give seed and offset together, "
                          "or neither for fresh random numbers", op, seed ? "offset" : "seed", p.text);
        fresh = !seed;
    }
    for (int k = 0; k < s->n; k++) {
        const ke_attr_desc *d = &s->attr[k];
        if (given & 1u << k) continue;
        if (random && (!strcmp(d->name, "seed") || !strcmp(d->name, "offset"))) continue;
        if (d->def == KE_HIDDEN) continue; /* never printed: the op sets it itself */
        if (d->def == KE_NODEF) {
            char names[512];
            names_of(s, random, names, sizeof names);
            return ke_err(KL_ERR_ARG, who, "%s: attribute %s is missing (in \"%s\"; it has no default; its attributes: "
                          "%s)", op, d->name, p.text, names);
        }
        if (d->type == KE_AT_FLOAT) ke_attr_set_float_at(a, d, d->def);
        else if (d->type < KE_AT_LIST) ke_attr_set_int_at(a, d, (int64_t)d->def);
        /* a list's default is the empty list */
    }
    return fresh;
}
