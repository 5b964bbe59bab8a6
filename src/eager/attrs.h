/*
 * attrs.h — named attributes: the generator that turns attribute
 * declarations (the attrs column of optable.def's rows, and the IR's
 * ir_attrs.def) into typed accessors over the positional slots of
 * ke_attrs, plus the descriptor table the IR printer and the tests read.
 *
 * A declaration is KE_A(name, type, slot, default):
 *   type     INT (int64_t i[slot]), BOOL (i[slot] != 0), FLOAT (double f[slot]),
 *            DTYPE (kl_dtype in i[slot]), REDUCTION (kl_reduction in i[slot]),
 *            DEVICE (kl_device_type in i[slot]), LIST (the integer list from
 *            element slot to nlist), LIST2 (two list elements at slot)
 *   default  the value the IR text leaves out (KE_NODEF: always printed;
 *            KE_HIDDEN: never, because the value's type already shows it;
 *            for a list, any number: the empty list is left out)
 * and an op's list KE_A(...) KE_A(...) (its row's attrs column, expanded by
 * dispatch.h) generates, for each attribute,
 *   <type> ke_attr_<op>_<name>(const ke_attrs *a)        the getter
 *   void   ke_attr_set_<op>_<name>(ke_attrs *a, <type> v)  the setter
 *   enum   ke_attr_slot_<op>_<name>                        its slot, for the
 *          _Static_asserts of code that serves two ops with one accessor
 * (LIST: the getter returns the elements, ke_attr_<op>_<name>_len their
 * count; lists are set with ke_set_list). AS(other) in op's row gives op
 * other's attributes, read through other's accessors (log_softmax reads
 * ke_attr_softmax_dim). KE_ATTRS_COMMON declares the conventional slots
 * shared by families of ops: ke_attr_keepdim, ke_attr_dtype, ke_attr_seed, ...
 *
 * This header and the struct in attr_access.h are the only code that may index
 * a->i[] / a->f[] (tests/check_attr_slots.sh greps src/ for any other).
 * The slot layout of ke_attrs itself is unchanged, so what the tracer
 * records, the guards hash and the IR stores is the same data as before.
 */
#ifndef KE_ATTRS_H
#define KE_ATTRS_H

#include <stdbool.h>
#include <stdint.h>

/* The printer's defaults: no default (always printed) / never printed.
 * Neither equals any attribute a program sets. */
#define KE_NODEF 0x1p1000
#define KE_HIDDEN 0x1.8p1000

typedef enum ke_attr_type {
    KE_AT_INT,
    KE_AT_BOOL,
    KE_AT_FLOAT,
    KE_AT_DTYPE,
    KE_AT_REDUCTION,
    KE_AT_DEVICE,
    KE_AT_LIST,
    KE_AT_LIST2
} ke_attr_type;

/* One declared attribute, for code that walks an op's attributes by name. */
typedef struct ke_attr_desc {
    const char *name;
    uint8_t type;  /* ke_attr_type */
    uint8_t slot;  /* index into i[], f[] or list[] by type */
    double def;    /* printed only when different (KE_NODEF, KE_HIDDEN) */
} ke_attr_desc;

typedef struct ke_attr_set {
    const ke_attr_desc *attr;
    int n;
} ke_attr_set;

/* Attribute d of a by its descriptor, for code that walks declarations (the
 * IR printer): integer-like types as int64, FLOAT as double; lists by
 * ke_attr_list_at (their elements, count in *n). */
static inline int64_t ke_attr_int_at(const struct ke_attrs *a, const ke_attr_desc *d) { return a->i[d->slot]; }
static inline double ke_attr_float_at(const struct ke_attrs *a, const ke_attr_desc *d) { return a->f[d->slot]; }
/* Sets FLOAT attribute d of a (the generated wrappers of the _F1/_F2 forms
 * fill an op's declared float attributes in order). */
static inline void ke_attr_set_float_at(struct ke_attrs *a, const ke_attr_desc *d, double v) { a->f[d->slot] = v; }
/* Sets integer-like attribute d of a (INT, BOOL, DTYPE, REDUCTION, DEVICE):
 * the attribute text parser (attr_text.c) writes by descriptor. */
static inline void ke_attr_set_int_at(struct ke_attrs *a, const ke_attr_desc *d, int64_t v) { a->i[d->slot] = v; }
static inline const int64_t *ke_attr_list_at(const struct ke_attrs *a, const ke_attr_desc *d, int *n) {
    int len = d->type == KE_AT_LIST2 ? 2 : a->nlist - d->slot;
    *n = d->slot + len <= a->nlist && len > 0 ? len : 0;
    return a->list + d->slot;
}

#ifndef KE_DEVICE
#include <stdio.h>
/* a as a C99/C++ aggregate initializer of ke_attrs ("{{f...}, {i...}, nlist,
 * {list...}}"), every value exact (doubles in hex; infinities and NaN by the
 * <math.h> macros, a NaN's payload is not kept): code generators bake a
 * node's attributes into device code with it. The text's length (snprintf's). */
static inline int ke_attrs_c_init(const struct ke_attrs *a, char *buf, size_t cap) {
    int n = 0;
#define KE_ATTRS_PUT_(...) n += snprintf(buf + (n < (int)cap ? n : (int)cap), (size_t)n < cap ? cap - (size_t)n : 0, __VA_ARGS__)
    KE_ATTRS_PUT_("{{");
    for (size_t k = 0; k < sizeof a->f / sizeof a->f[0]; k++) {
        double v = a->f[k];
        if (v != v) KE_ATTRS_PUT_("%s(double)NAN", __builtin_signbit(v) ? "-" : "");
        else if (v == __builtin_inf() || v == -__builtin_inf()) KE_ATTRS_PUT_("%s(double)INFINITY", v < 0 ? "-" : "");
        else KE_ATTRS_PUT_("%a", v);
        KE_ATTRS_PUT_(k + 1 < sizeof a->f / sizeof a->f[0] ? ", " : "}, {");
    }
    for (size_t k = 0; k < sizeof a->i / sizeof a->i[0]; k++) {
        if (a->i[k] == INT64_MIN) KE_ATTRS_PUT_("(-9223372036854775807LL - 1)");
        else KE_ATTRS_PUT_("%lldLL", (long long)a->i[k]);
        KE_ATTRS_PUT_(k + 1 < sizeof a->i / sizeof a->i[0] ? ", " : "}, ");
    }
    KE_ATTRS_PUT_("%d, {", (int)a->nlist);
    for (int k = 0; k < a->nlist && k < (int)(sizeof a->list / sizeof a->list[0]); k++)
        KE_ATTRS_PUT_("%s%lldLL", k ? ", " : "", (long long)a->list[k]);
    KE_ATTRS_PUT_("%s}}", a->nlist > 0 ? "" : "0");
#undef KE_ATTRS_PUT_
    return n;
}
#endif

/* ---- the generator ---------------------------------------------------------
 * With KE_A defined as KE_ATTR_TUPLE, an attribute list becomes a comma list
 * of (name, type, slot, default) tuples, walked by KE_ATTR_EACH (at most 8
 * attributes per op; the leading comma separates the tuples from p). */
#define KE_ATTR_TUPLE(name, type, slot, def) , (name, type, slot, def)
#define KE_ATTR_DESC(name, type, slot, def) {#name, KE_AT_##type, (slot), (def)},
#define KE_ATTR_CAT_(a, b) a##b
#define KE_ATTR_CAT(a, b) KE_ATTR_CAT_(a, b)
#define KE_ATTR_CALL(m, ...) m(__VA_ARGS__)
#define KE_ATTR_CALL2(m, ...) m(__VA_ARGS__) /* inside KE_ATTR_CALL, which may not recurse */
#define KE_ATTR_UNPAREN(...) __VA_ARGS__
#define KE_ATTR_NARG(...) KE_ATTR_NARG_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KE_ATTR_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define KE_ATTR_EACH_1(m, p, x) KE_ATTR_CALL(m, p, KE_ATTR_UNPAREN x)
#define KE_ATTR_EACH_2(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_1(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_3(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_2(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_4(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_3(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_5(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_4(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_6(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_5(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_7(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_6(m, p, __VA_ARGS__)
#define KE_ATTR_EACH_8(m, p, x, ...) KE_ATTR_EACH_1(m, p, x) KE_ATTR_EACH_7(m, p, __VA_ARGS__)
#define KE_ATTR_EACH(m, p, ...) KE_ATTR_CAT(KE_ATTR_EACH_, KE_ATTR_NARG(__VA_ARGS__))(m, p, __VA_ARGS__)

/* One getter and one setter per attribute, by type. */
#define KE_ATTR_FN_INT(get, set, slot)                                                   \
    static inline int64_t get(const ke_attrs *a) { return a->i[slot]; }                   \
    static inline void set(ke_attrs *a, int64_t v) { a->i[slot] = v; }
#define KE_ATTR_FN_BOOL(get, set, slot)                                                  \
    static inline bool get(const ke_attrs *a) { return a->i[slot] != 0; }                 \
    static inline void set(ke_attrs *a, bool v) { a->i[slot] = v; }
#define KE_ATTR_FN_FLOAT(get, set, slot)                                                 \
    static inline double get(const ke_attrs *a) { return a->f[slot]; }                    \
    static inline void set(ke_attrs *a, double v) { a->f[slot] = v; }
#define KE_ATTR_FN_DTYPE(get, set, slot)                                                 \
    static inline kl_dtype get(const ke_attrs *a) { return (kl_dtype)a->i[slot]; }        \
    static inline void set(ke_attrs *a, kl_dtype v) { a->i[slot] = v; }
#define KE_ATTR_FN_REDUCTION(get, set, slot)                                             \
    static inline kl_reduction get(const ke_attrs *a) { return (kl_reduction)a->i[slot]; } \
    static inline void set(ke_attrs *a, kl_reduction v) { a->i[slot] = v; }
#define KE_ATTR_FN_DEVICE(get, set, slot)                                                \
    static inline kl_device_type get(const ke_attrs *a) { return (kl_device_type)a->i[slot]; } \
    static inline void set(ke_attrs *a, kl_device_type v) { a->i[slot] = v; }
#define KE_ATTR_FN_LIST(get, set, slot)                                                  \
    static inline const int64_t *get(const ke_attrs *a) { return a->list + (slot); }      \
    static inline int KE_ATTR_CAT(get, _len)(const ke_attrs *a) { return a->nlist - (slot); }
#define KE_ATTR_FN_LIST2(get, set, slot)                                                 \
    static inline const int64_t *get(const ke_attrs *a) { return a->list + (slot); }

/* <pfx>_attr_<op>_<name> and <pfx>_attr_set_<op>_<name>; p is (pfx, op). */
#define KE_ATTR_GEN_OP(pfx, op, name, type, slot, def)                                   \
    enum { pfx##_attr_slot_##op##_##name = (slot) };                                     \
    KE_ATTR_FN_##type(pfx##_attr_##op##_##name, pfx##_attr_set_##op##_##name, slot)
#define KE_ATTR_GEN_OP_(p, name, type, slot, def)                                        \
    KE_ATTR_CALL2(KE_ATTR_GEN_OP, KE_ATTR_UNPAREN p, name, type, slot, def)
/* <pfx>_attr_<name> and <pfx>_attr_set_<name> (the common slots); p is pfx. */
#define KE_ATTR_GEN_COMMON(pfx, name, type, slot, def)                                   \
    enum { pfx##_attr_slot_##name = (slot) };                                            \
    KE_ATTR_FN_##type(pfx##_attr_##name, pfx##_attr_set_##name, slot)

/* For _Static_assert: x and y name the same slot (each slot constant is an
 * enum of its own). */
#define KE_ATTR_SAME_SLOT(x, y) ((int)ke_attr_slot_##x == (int)ke_attr_slot_##y)

/* The accessors of op's attribute list `attrs` (KE_A(...) KE_A(...)), with
 * KE_A defined as KE_ATTR_TUPLE where this is expanded. */
#define KE_ATTR_ACCESSORS(pfx, op, ...) KE_ATTR_EACH(KE_ATTR_GEN_OP_, (pfx, op) __VA_ARGS__)
#define KE_ATTR_COMMON_ACCESSORS(pfx, ...) KE_ATTR_EACH(KE_ATTR_GEN_COMMON, pfx __VA_ARGS__)

#endif /* KE_ATTRS_H */
