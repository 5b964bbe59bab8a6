/*
 * oprows.h — the row macros of the op table (optable.def) and the helpers
 * that expand its columns.
 *
 * Every row is, in the end, one full row
 *
 *   KE_OP(name, kind, nin, nout, flags, dtype, accept, infer, cpu, view, decomp, impl, wrap, save, deriv,
 *         attrs)
 *
 *   kind        ke_op_kind without prefix (EW, REDUCE, VIEW, ...)
 *   nin/nout    tensor inputs (-1 variadic) and outputs
 *   flags       KE_F_* (0 if none)
 *   dtype       ke_dtype_rule without prefix; accept: ke_accept without prefix
 *   infer       shape rule (+ dtype rule)           } a function name,
 *   cpu         eager CPU kernel                     } or `none`
 *   view        view rule (views only)               }
 *   decomp      decomposition written with kl_ ops   }
 *   impl        data for the generic kernel: EW(x) = the loops ke_ew_x,
 *               RD(x) = the reduction ke_rd_x, or `none`
 *   wrap        the public functions generated from the row (wrappers.c):
 *               UNARY, UNARY_IP, UNARY_F1_IP, UNARY_F2_IP, BINARY, or `none`
 *               (the op's public functions are written by hand)
 *   save        what the derivative reads: AG_IN(i) | AG_OUT(j) | ..., or 0
 *   deriv       the derivative formula (an ag_deriv_fn), `decomp` (through
 *               the decomposition), or `none` (not differentiable, implicit)
 *   attrs       the op's named attributes (attrs.h says what they generate):
 *               KE_A(name, type, slot, default) KE_A(...) ..., AS(other) for
 *               other's attributes read through other's accessors
 *               (log_softmax reads ke_attr_softmax_dim), or `none`
 *
 * Each layer defines KE_OP to take the columns it needs and includes
 * optable.def: eager builds ke_ops[] and declares the functions the rows name
 * (optable.h), the wrappers come from `wrap` (wrappers.c), the autograd layer
 * expands `save` and `deriv` (derivatives.c), dispatch.h and optable.c
 * expand `attrs` into accessors and descriptors. The derivative columns are text
 * to eager, which never expands them, so eager does not depend on autograd.
 *
 * The per-kind macros below fill the columns from the name: KE_UNARY(sinh,
 * FLOAT, ALL, AG_IN(0)) is the row of an elementwise op with loops
 * ke_ew_sinh, derivative ag_d_sinh and the public kl_sinh / kl_sinh_inplace.
 * An op that fits none of them is written as a full KE_OP row.
 *
 * Names in columns must be plain identifiers that are not macros: the
 * helpers tell `none` from a name by token pasting. tests/test_optable.c
 * checks what each per-kind macro expands to.
 *
 * The per-kind macros of kinds whose ops may have attributes take the attrs
 * column as their last argument; the others pass `none`.
 */
#ifndef KE_OPROWS_H
#define KE_OPROWS_H

/* ---- elementwise -------------------------------------------------------------- */

/* Unary, differentiable, with an in-place variant: kl_<name>(x), kl_<name>_inplace(x). */
#define KE_UNARY(name, dtype, accept, save)                                                                   \
    KE_OP(name, EW, 1, 1, KE_F_INPLACE, dtype, accept, ke_infer_ew_same, ke_cpu_ew, none, none, EW(name),      \
          UNARY_IP, save, ag_d_##name, none)
/* Unary, not differentiable, with an in-place variant (logical and bitwise). */
#define KE_UNARY_ND(name, dtype, accept)                                                                      \
    KE_OP(name, EW, 1, 1, KE_F_INPLACE | KE_F_NONDIFF, dtype, accept, ke_infer_ew_same, ke_cpu_ew, none, none, \
          EW(name), UNARY_IP, 0, none, none)
/* A predicate: a new bool tensor, no in-place variant (as in PyTorch). */
#define KE_PREDICATE(name)                                                                                    \
    KE_OP(name, EW, 1, 1, KE_F_NONDIFF, BOOL, ALL, ke_infer_ew_same, ke_cpu_ew, none, none, EW(name), UNARY, 0, \
          none, none)
/* Unary with one or two double attributes in f[0], f[1] (leaky_relu's
 * negative_slope, hardtanh's min and max): kl_<name>(x, f0[, f1]) and
 * kl_<name>_inplace(x, f0[, f1]). The loops read them from the call's
 * attributes as clamp's do. */
#define KE_UNARY_F1(name, dtype, accept, save, attrs)                                                         \
    KE_OP(name, EW, 1, 1, KE_F_INPLACE, dtype, accept, ke_infer_ew_same, ke_cpu_ew, none, none, EW(name),      \
          UNARY_F1_IP, save, ag_d_##name, attrs)
#define KE_UNARY_F2(name, dtype, accept, save, attrs)                                                         \
    KE_OP(name, EW, 1, 1, KE_F_INPLACE, dtype, accept, ke_infer_ew_same, ke_cpu_ew, none, none, EW(name),      \
          UNARY_F2_IP, save, ag_d_##name, attrs)
/* Binary with broadcasting, differentiable: kl_<name>(a, b), _inplace(a, b),
 * _scalar(a, s), _scalar_inplace(a, s). */
#define KE_BINARY(name, dtype, accept, save)                                                                  \
    KE_OP(name, EW, 2, 1, KE_F_INPLACE, dtype, accept, ke_infer_ew_bcast, ke_cpu_ew, none, none, EW(name),     \
          BINARY, save, ag_d_##name, none)
/* Binary, not differentiable (comparisons, logical and bitwise ops). */
#define KE_BINARY_ND(name, dtype, accept)                                                                     \
    KE_OP(name, EW, 2, 1, KE_F_INPLACE | KE_F_NONDIFF, dtype, accept, ke_infer_ew_bcast, ke_cpu_ew, none, none, \
          EW(name), BINARY, 0, none, none)

/* ---- reductions, views, composites, creation, kernels ------------------------------ */

/* A reduction over a dim list with one output; formulas ke_rd_<name>. */
#define KE_REDUCE(name, accept, save, attrs)                                                                  \
    KE_OP(name, REDUCE, 1, 1, 0, CUSTOM, accept, ke_infer_rd, ke_cpu_reduce, none, none, RD(name), none, save, \
          ag_d_##name, attrs)
#define KE_REDUCE_ND(name, accept, attrs)                                                                     \
    KE_OP(name, REDUCE, 1, 1, KE_F_NONDIFF, CUSTOM, accept, ke_infer_rd, ke_cpu_reduce, none, none, RD(name),  \
          none, 0, none, attrs)
/* A view: view rule ke_view_<name>, no kernel. */
#define KE_VIEW(name, save, attrs)                                                                            \
    KE_OP(name, VIEW, 1, 1, 0, FIRST, ALL, none, none, ke_view_##name, none, none, none, save, ag_d_##name, attrs)
/* An implicit composite: decomposes (ke_decomp_<name>) before autograd and
 * tracing, so its pieces are recorded and it has no derivative of its own. */
#define KE_IMPLICIT(name, nin, nout, dtype, attrs)                                                            \
    KE_OP(name, COMPOSITE, nin, nout, KE_F_IMPLICIT, dtype, ALL, none, none, none, ke_decomp_##name, none,      \
          none, 0, none, attrs)
/* A creation op: no tensor inputs, dtype from the attributes, kernel ke_cpu_<name>. */
#define KE_CREATE(name, flags, infer, attrs)                                                                  \
    KE_OP(name, CREATE, 0, 1, KE_F_NONDIFF | (flags), ATTR, ALL, infer, ke_cpu_##name, none, none, none, none, \
          0, none, attrs)
/* An op with its own shape rule ke_infer_<name> and kernel ke_cpu_<name>. */
#define KE_KERNEL(name, nin, flags, dtype, accept, save, attrs)                                               \
    KE_OP(name, OTHER, nin, 1, flags, dtype, accept, ke_infer_##name, ke_cpu_##name, none, none, none, none,    \
          save, ag_d_##name, attrs)

/* Whether a wrap form has an _inplace function: its row must then carry
 * KE_F_INPLACE (checked in optable.c). */
#define KE_FORM_IP_none 0
#define KE_FORM_IP_UNARY 0
#define KE_FORM_IP_UNARY_IP 1
#define KE_FORM_IP_UNARY_F1_IP 1
#define KE_FORM_IP_UNARY_F2_IP 1
#define KE_FORM_IP_BINARY 1

/* ---- column helpers --------------------------------------------------------------
 * KE_COL_TAG(x) is NONE for `none`, DECOMP for `decomp` and NAME for anything
 * else, by pasting x onto KE_COL_TAG_ and taking the second of the resulting
 * list (only the two tag macros make it a list). */
#define KE_PP_CAT(a, b) KE_PP_CAT_(a, b)
#define KE_PP_CAT_(a, b) a##b
#define KE_PP_2ND(...) KE_PP_2ND_(__VA_ARGS__, )
#define KE_PP_2ND_(a, b, ...) b
#define KE_COL_TAG(x) KE_PP_2ND(KE_COL_TAG_##x, NAME)
#define KE_COL_TAG_none ~, NONE
#define KE_COL_TAG_decomp ~, DECOMP

/* A function column as a pointer: the function, or NULL for `none`. */
#define KE_COL_FN(x) KE_PP_CAT(KE_COL_FN_, KE_COL_TAG(x))(x)
#define KE_COL_FN_NAME(x) x
#define KE_COL_FN_NONE(x) NULL
#define KE_COL_HAS(x) KE_PP_CAT(KE_COL_HAS_, KE_COL_TAG(x)) /* 1: the column names a function */
#define KE_COL_HAS_NAME 1
#define KE_COL_HAS_NONE 0
#define KE_COL_HAS_DECOMP 0
/* A declaration of a function column with the function type sig; nothing for `none`. */
#define KE_COL_DECL(sig, x) KE_PP_CAT(KE_COL_DECL_, KE_COL_TAG(x))(sig, x)
#define KE_COL_DECL_NAME(sig, x) sig x;
#define KE_COL_DECL_NONE(sig, x)

/* The impl column: its address, its declaration, its C name as a string. */
#define KE_IMPL_PTR(impl) KE_IMPL_PTR_##impl
#define KE_IMPL_PTR_none NULL
#define KE_IMPL_PTR_EW(x) ((const void *)&ke_ew_##x)
#define KE_IMPL_PTR_RD(x) ((const void *)&ke_rd_##x)
#define KE_IMPL_DECL(impl) KE_IMPL_DECL_##impl
#define KE_IMPL_DECL_none
#define KE_IMPL_DECL_EW(x) extern const ke_ew_impl ke_ew_##x;
#define KE_IMPL_DECL_RD(x) extern const struct ke_rd_op ke_rd_##x;
#define KE_IMPL_NAME(impl) KE_IMPL_NAME_##impl
#define KE_IMPL_NAME_none NULL
#define KE_IMPL_NAME_EW(x) "ke_ew_" #x
#define KE_IMPL_NAME_RD(x) "ke_rd_" #x

/* The attrs column: `none`, AS(other), or a list KE_A(...) KE_A(...). The
 * includers that expand the list define KE_A as KE_ATTR_TUPLE (attrs.h), so
 * by the time the row reaches KE_OP the list is ", (name, type, slot, def),
 * ..." and KE_OP takes the column as its variadic tail (every KE_OP is
 * declared `..., deriv, ...)`). KE_ATTRCOL_KIND(tail) is NONE, AS or LIST,
 * by pasting the tail's first element (empty for a list) onto
 * KE_ATTRCOL_KIND_; KE_ATTRCOL_OTHER(tail) is the op named by AS(other). */
#define KE_PP_1ST(a, ...) a
#define KE_ATTRCOL_KIND(...) KE_PP_2ND(KE_PP_CAT(KE_ATTRCOL_KIND_, KE_PP_1ST(__VA_ARGS__, ~)), LIST)
#define KE_ATTRCOL_KIND_none ~, NONE
#define KE_ATTRCOL_KIND_AS(other) ~, AS
#define KE_ATTRCOL_OTHER(...) KE_PP_CAT(KE_ATTRCOL_OTHER_, KE_PP_1ST(__VA_ARGS__, ~))
#define KE_ATTRCOL_OTHER_AS(other) other

#endif /* KE_OPROWS_H */
