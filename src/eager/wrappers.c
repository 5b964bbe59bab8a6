/*
 * wrappers.c — the public functions generated from the op table: each row's
 * `wrap` column names a form, and the form's macro below writes its
 * functions (kl_<op>, kl_<op>_inplace, ...), so an op's public functions
 * come from its row and from no other list.
 *
 * include/kiln.h declares every one of them literally (grep, ctags and gdb
 * find kl_add there). Missing prototypes are errors in this file (the pragma
 * below), so a row whose function the header lacks fails the build;
 * tests/test_header.c fails on the converse (a prototype of a generated form
 * with no row) and on duplicates.
 */
#pragma GCC diagnostic error "-Wmissing-prototypes"

#include "dispatch.h"

/* The forms _F1 and _F2: the op's first one or two declared attributes
 * (the row's attrs column; FLOAT, in declaration order) from the C arguments. */
static kl_tensor *call_f(int op, kl_tensor *x, int inplace, int nf, double f0, double f1) {
    kl_tensor *in[1] = {x};
    ke_call c = {.op = op, .inplace = (uint8_t)inplace, .nin = 1, .in = in};
    const ke_attr_set *s = &ke_op_attrs[op];
    const double v[2] = {f0, f1};
    KE_ASSERT(s->n >= nf);
    for (int k = 0; k < nf; k++) {
        KE_ASSERT(s->attr[k].type == KE_AT_FLOAT);
        ke_attr_set_float_at(&c.a, &s->attr[k], v[k]);
    }
    return ke_call1(&c);
}

/* The forms. Parameter names match kiln.h's prototypes where they are generic. */
#define KE_WRAP_none(name)
/* kl_<op>(x) */
#define KE_WRAP_UNARY(name) \
    kl_tensor *kl_##name(kl_tensor *x) { return ke_unary(KE_OP_##name, x, 0); }
/* kl_<op>(x), kl_<op>_inplace(x) */
#define KE_WRAP_UNARY_IP(name) \
    KE_WRAP_UNARY(name)        \
    kl_tensor *kl_##name##_inplace(kl_tensor *x) { return ke_unary(KE_OP_##name, x, 1); }
/* kl_<op>(x, f0), kl_<op>_inplace(x, f0) */
#define KE_WRAP_UNARY_F1_IP(name)                                                                         \
    kl_tensor *kl_##name(kl_tensor *x, double f0) { return call_f(KE_OP_##name, x, 0, 1, f0, 0); }          \
    kl_tensor *kl_##name##_inplace(kl_tensor *x, double f0) { return call_f(KE_OP_##name, x, 1, 1, f0, 0); }
/* kl_<op>(x, f0, f1), kl_<op>_inplace(x, f0, f1) */
#define KE_WRAP_UNARY_F2_IP(name)                                                                         \
    kl_tensor *kl_##name(kl_tensor *x, double f0, double f1) { return call_f(KE_OP_##name, x, 0, 2, f0, f1); } \
    kl_tensor *kl_##name##_inplace(kl_tensor *x, double f0, double f1) {                                  \
        return call_f(KE_OP_##name, x, 1, 2, f0, f1);                                                        \
    }
/* kl_<op>(a, b), kl_<op>_inplace(a, b), kl_<op>_scalar(a, s), kl_<op>_scalar_inplace(a, s) */
#define KE_WRAP_BINARY(name)                                                                               \
    kl_tensor *kl_##name(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_##name, a, b, 0); }           \
    kl_tensor *kl_##name##_inplace(kl_tensor *a, kl_tensor *b) { return ke_binary(KE_OP_##name, a, b, 1); } \
    kl_tensor *kl_##name##_scalar(kl_tensor *a, double s) { return ke_binary_scalar(KE_OP_##name, a, s, 0); } \
    kl_tensor *kl_##name##_scalar_inplace(kl_tensor *a, double s) {                                        \
        return ke_binary_scalar(KE_OP_##name, a, s, 1);                                                    \
    }

#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_WRAP_##wrap_(name_)
#include "optable.def"
#undef KE_OP
