/*
 * grad_main.c — runs the gradcheck suite (one group per op family file), then
 * checks coverage: every op of the table that is differentiable has exactly
 * one derivative row, and that derivative (or its decomposition) ran during
 * the suite. Non-differentiable ops must be marked so and refuse nothing.
 */
#include "grad_harness.h"

#include "autograd.h"

extern const struct CMUnitTest kt_grad_ew_tests[], kt_grad_shape_tests[], kt_grad_nn_tests[];
extern const size_t kt_grad_ew_count, kt_grad_shape_count, kt_grad_nn_count;

static void every_op_has_a_derivative_or_a_mark(void **state) {
    (void)state;
    int missing = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        const ke_op_info *o = &ke_ops[op];
        const ag_deriv *d = &ag_derivs[op];
        int has = d->fn != NULL || d->decomp;
        int exempt = (o->flags & (KE_F_NONDIFF | KE_F_IMPLICIT)) != 0;
        if (has && exempt) {
            print_error("kl_%s is marked %s but has a derivative row\n", o->name,
                        (o->flags & KE_F_NONDIFF) ? "not differentiable" : "implicit");
            missing++;
        } else if (!has && !exempt) {
            print_error("kl_%s has no derivative and no 'not differentiable' mark\n", o->name);
            missing++;
        } else if (d->decomp && !o->decomp) {
            print_error("kl_%s differentiates through a decomposition it does not have\n", o->name);
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

static void every_derivative_was_gradchecked(void **state) {
    (void)state;
    int missing = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        const ag_deriv *d = &ag_derivs[op];
        if (!(d->fn || d->decomp)) continue;
        if (atomic_load(&ag_stat_backward[op]) == 0) {
            print_error("the derivative of kl_%s never ran in the gradcheck suite\n", ke_ops[op].name);
            missing++;
        }
    }
    assert_int_equal(missing, 0);
}

int main(void) {
    int failed = 0;
    failed += _cmocka_run_group_tests("grad_ew", kt_grad_ew_tests, kt_grad_ew_count, NULL, NULL);
    failed += _cmocka_run_group_tests("grad_shape", kt_grad_shape_tests, kt_grad_shape_count, NULL, NULL);
    failed += _cmocka_run_group_tests("grad_nn", kt_grad_nn_tests, kt_grad_nn_count, NULL, NULL);
    const struct CMUnitTest coverage[] = {
        cmocka_unit_test(every_op_has_a_derivative_or_a_mark),
        cmocka_unit_test(every_derivative_was_gradchecked),
    };
    failed += cmocka_run_group_tests_name("grad_coverage", coverage, NULL, NULL);
    return failed ? 1 : 0;
}
