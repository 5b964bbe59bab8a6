/*
 * test_optable.c — the row macros of oprows.h fill the columns they promise.
 *
 * Each per-kind macro is expanded on a made-up row (the ops that later
 * issues add: sinh, leaky_relu, hardtanh, fmod, ...) by a KE_OP that
 * stringifies its columns, and compared with the full row the macro stands
 * for; the column helpers are checked on names, `none` and `decomp`. The
 * real table's expansions (ke_ops, ag_derivs, wrappers) are covered by the
 * suites that use them.
 */
#include "harness.h"

#include "optable.h"

typedef struct row_text {
    const char *col[16];
} row_text;

#define STR_(x) #x
#define STR(x) STR_(x)
/* Stringifies after expansion, as the row reaches an includer's KE_OP. */
#define KE_OP(...) ROW_(__VA_ARGS__)
#define ROW_(name, kind, nin, nout, flags, dt, acc, infer, cpu, view, decomp, impl, wrap, save, deriv, ...) \
    {{#name, #kind, #nin, #nout, #flags, #dt, #acc, #infer, #cpu, #view, #decomp, #impl, #wrap, #save, #deriv,   \
      #__VA_ARGS__}},

static const row_text got[] = {
    KE_UNARY(sinh, FLOAT, ALL, AG_IN(0))
    KE_UNARY_ND(logical_not, BOOL, ALL)
    KE_PREDICATE(isnan)
    KE_UNARY_F1(leaky_relu, FIRST, FLOAT, AG_IN(0), KE_A(negative_slope, FLOAT, 0, 0.01))
    KE_UNARY_F2(hardtanh, FIRST, FLOAT, AG_IN(0), KE_A(min_val, FLOAT, 0, -1) KE_A(max_val, FLOAT, 1, 1))
    KE_BINARY(fmod, PROMOTE, NUM, AG_IN(0) | AG_IN(1))
    KE_BINARY_ND(eq, BOOL, ALL)
    KE_REDUCE(sum, ALL, 0, KE_A(dims, LIST, 0, 0))
    KE_REDUCE_ND(argmax, NUM, AS(amax))
    KE_VIEW(as_strided, AG_IN(0), none)
    KE_IMPLICIT(stack, -1, 1, CUSTOM, KE_A(dim, INT, 0, 0))
    KE_CREATE(rand, KE_F_RANDOM, ke_infer_create, AS(randn))
    KE_KERNEL(gather, 2, 0, CUSTOM, ALL, AG_IN(1), KE_A(dim, INT, 0, -1))
};
#undef KE_OP

/* The full rows, as oprows.h documents each macro. */
static const row_text want[] = {
    {{"sinh", "EW", "1", "1", "KE_F_INPLACE", "FLOAT", "ALL", "ke_infer_ew_same", "ke_cpu_ew", "none", "none",
      "EW(sinh)", "UNARY_IP", "AG_IN(0)", "ag_d_sinh", "none"}},
    {{"logical_not", "EW", "1", "1", "KE_F_INPLACE | KE_F_NONDIFF", "BOOL", "ALL", "ke_infer_ew_same", "ke_cpu_ew",
      "none", "none", "EW(logical_not)", "UNARY_IP", "0", "none", "none"}},
    {{"isnan", "EW", "1", "1", "KE_F_NONDIFF", "BOOL", "ALL", "ke_infer_ew_same", "ke_cpu_ew", "none", "none",
      "EW(isnan)", "UNARY", "0", "none", "none"}},
    {{"leaky_relu", "EW", "1", "1", "KE_F_INPLACE", "FIRST", "FLOAT", "ke_infer_ew_same", "ke_cpu_ew", "none", "none",
      "EW(leaky_relu)", "UNARY_F1_IP", "AG_IN(0)", "ag_d_leaky_relu",
      "KE_A(negative_slope, FLOAT, 0, 0.01)"}},
    {{"hardtanh", "EW", "1", "1", "KE_F_INPLACE", "FIRST", "FLOAT", "ke_infer_ew_same", "ke_cpu_ew", "none", "none",
      "EW(hardtanh)", "UNARY_F2_IP", "AG_IN(0)", "ag_d_hardtanh",
      "KE_A(min_val, FLOAT, 0, -1) KE_A(max_val, FLOAT, 1, 1)"}},
    {{"fmod", "EW", "2", "1", "KE_F_INPLACE", "PROMOTE", "NUM", "ke_infer_ew_bcast", "ke_cpu_ew", "none", "none",
      "EW(fmod)", "BINARY", "AG_IN(0) | AG_IN(1)", "ag_d_fmod", "none"}},
    {{"eq", "EW", "2", "1", "KE_F_INPLACE | KE_F_NONDIFF", "BOOL", "ALL", "ke_infer_ew_bcast", "ke_cpu_ew", "none",
      "none", "EW(eq)", "BINARY", "0", "none", "none"}},
    {{"sum", "REDUCE", "1", "1", "0", "CUSTOM", "ALL", "ke_infer_rd", "ke_cpu_reduce", "none", "none", "RD(sum)",
      "none", "0", "ag_d_sum", "KE_A(dims, LIST, 0, 0)"}},
    {{"argmax", "REDUCE", "1", "1", "KE_F_NONDIFF", "CUSTOM", "NUM", "ke_infer_rd", "ke_cpu_reduce", "none", "none",
      "RD(argmax)", "none", "0", "none", "AS(amax)"}},
    {{"as_strided", "VIEW", "1", "1", "0", "FIRST", "ALL", "none", "none", "ke_view_as_strided", "none", "none",
      "none", "AG_IN(0)", "ag_d_as_strided", "none"}},
    {{"stack", "COMPOSITE", "-1", "1", "KE_F_IMPLICIT", "CUSTOM", "ALL", "none", "none", "none", "ke_decomp_stack",
      "none", "none", "0", "none", "KE_A(dim, INT, 0, 0)"}},
    {{"rand", "CREATE", "0", "1", "KE_F_NONDIFF | (KE_F_RANDOM)", "ATTR", "ALL", "ke_infer_create", "ke_cpu_rand",
      "none", "none", "none", "none", "0", "none", "AS(randn)"}},
    {{"gather", "OTHER", "2", "1", "0", "CUSTOM", "ALL", "ke_infer_gather", "ke_cpu_gather", "none", "none", "none",
      "none", "AG_IN(1)", "ag_d_gather", "KE_A(dim, INT, 0, -1)"}},
};

static void per_kind_macros_fill_the_documented_columns(void **state) {
    (void)state;
    assert_int_equal(sizeof got / sizeof got[0], sizeof want / sizeof want[0]);
    static const char *const colname[16] = {"name", "kind",   "nin",  "nout", "flags", "dtype", "accept", "infer",
                                            "cpu",  "view",   "decomp", "impl", "wrap", "save", "deriv", "attrs"};
    int bad = 0;
    for (size_t r = 0; r < sizeof want / sizeof want[0]; r++)
        for (int k = 0; k < 16; k++)
            if (strcmp(got[r].col[k], want[r].col[k])) {
                print_error("row %s, column %s: '%s', expected '%s'\n", want[r].col[0], colname[k], got[r].col[k],
                            want[r].col[k]);
                bad++;
            }
    assert_int_equal(bad, 0);
}

static int col_fn_probe(void) { return 7; }

static void column_helpers_tell_names_from_none(void **state) {
    (void)state;
    assert_string_equal(STR(KE_COL_TAG(ke_cpu_ew)), "NAME");
    assert_string_equal(STR(KE_COL_TAG(none)), "NONE");
    assert_string_equal(STR(KE_COL_TAG(decomp)), "DECOMP");
    assert_true(KE_COL_FN(none) == NULL);
    assert_true(KE_COL_FN(col_fn_probe) == col_fn_probe);
    assert_null(KE_IMPL_NAME(none));
    assert_string_equal(KE_IMPL_NAME(EW(add)), "ke_ew_add");
    assert_string_equal(KE_IMPL_NAME(RD(sum)), "ke_rd_sum");
    assert_true(KE_IMPL_PTR(none) == NULL);
    assert_true(KE_IMPL_PTR(EW(add)) == ke_ops[KE_OP_add].impl);
    assert_true(KE_IMPL_PTR(RD(sum)) == ke_ops[KE_OP_sum].impl);
    assert_int_equal(KE_FORM_IP_UNARY, 0);
    assert_int_equal(KE_FORM_IP_UNARY_IP + KE_FORM_IP_UNARY_F1_IP + KE_FORM_IP_UNARY_F2_IP + KE_FORM_IP_BINARY, 4);
}

/* The attrs column as KE_OP's variadic tail sees it (a list already turned
 * into tuples by KE_A = KE_ATTR_TUPLE), and as the real table expands it. */
static void attrs_column_tells_none_as_and_lists(void **state) {
    (void)state;
    assert_string_equal(STR(KE_ATTRCOL_KIND(none)), "NONE");
    assert_string_equal(STR(KE_ATTRCOL_KIND(AS(softmax))), "AS");
    assert_string_equal(STR(KE_ATTRCOL_KIND(, (dim, INT, 0, KE_NODEF))), "LIST");
    assert_string_equal(STR(KE_ATTRCOL_KIND(, (a, INT, 0, 0), (b, BOOL, 1, 0))), "LIST");
    assert_string_equal(STR(KE_ATTRCOL_OTHER(AS(softmax))), "softmax");
    /* AS(other) rows share other's descriptors; `none` rows have none. */
    assert_ptr_equal(ke_op_attrs[KE_OP_log_softmax].attr, ke_op_attrs[KE_OP_softmax].attr);
    assert_int_equal(ke_op_attrs[KE_OP_log_softmax].n, 1);
    assert_ptr_equal(ke_op_attrs[KE_OP_mean].attr, ke_op_attrs[KE_OP_sum].attr);
    assert_int_equal(ke_op_attrs[KE_OP_add].n, 0);
    assert_int_equal(ke_op_attrs[KE_OP_alias].n, 0);
    assert_int_equal(ke_op_attrs[KE_OP_conv2d].n, 5);
    assert_string_equal(ke_op_attrs[KE_OP_conv2d].attr[4].name, "has_bias");
    assert_int_equal(ke_attr_slot_conv2d_groups, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(per_kind_macros_fill_the_documented_columns),
        cmocka_unit_test(column_helpers_tell_names_from_none),
        cmocka_unit_test(attrs_column_tells_none_as_and_lists),
    };
    return cmocka_run_group_tests_name("optable", tests, NULL, NULL);
}
