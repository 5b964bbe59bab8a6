/*
 * test_attrs.c — the named attribute declarations (optable.def's attrs column,
 * ir_attrs.def) and the accessors they generate: every declaration names a
 * real slot, no two attributes of an op share one, the conventional names
 * (keepdim, dtype, seed, offset, dims, reduction) sit in their conventional
 * slots, the ops whose generic code reads a conventional slot declare it, and
 * each generated setter writes exactly the slot its descriptor names.
 */
#include "harness.h"

#include "dispatch.h"
#include "ir.h"

#include <math.h>
#include <string.h>

/* The storage an attribute occupies: i[] (0), f[] (1) or list[] (2). */
static int kind_of(const ke_attr_desc *d) {
    switch ((ke_attr_type)d->type) {
    case KE_AT_FLOAT: return 1;
    case KE_AT_LIST:
    case KE_AT_LIST2: return 2;
    default: return 0;
    }
}

static const ke_attr_desc *find(const ke_attr_set *s, const char *name) {
    for (int k = 0; k < s->n; k++)
        if (!strcmp(s->attr[k].name, name)) return &s->attr[k];
    return NULL;
}

static void check_set(const char *op, const ke_attr_set *s) {
    for (int k = 0; k < s->n; k++) {
        const ke_attr_desc *d = &s->attr[k];
        int kind = kind_of(d);
        if (kind == 0 && d->slot >= 6) fail_msg("%s.%s: integer slot %d out of range", op, d->name, d->slot);
        if (kind == 1 && d->slot >= 4) fail_msg("%s.%s: float slot %d out of range", op, d->name, d->slot);
        if (kind == 2 && d->slot + (d->type == KE_AT_LIST2 ? 2 : 0) > KE_MAX_LIST)
            fail_msg("%s.%s: list slot %d out of range", op, d->name, d->slot);
        for (int j = 0; j < k; j++) {
            const ke_attr_desc *e = &s->attr[j];
            if (!strcmp(d->name, e->name)) fail_msg("%s: attribute %s declared twice", op, d->name);
            if (kind != kind_of(e)) continue;
            if (kind < 2 && d->slot == e->slot) fail_msg("%s: %s and %s share a slot", op, d->name, e->name);
            if (kind == 2) {
                /* a whole list (LIST) runs to the end; LIST2 covers two elements */
                int d_end = d->type == KE_AT_LIST2 ? d->slot + 2 : KE_MAX_LIST;
                int e_end = e->type == KE_AT_LIST2 ? e->slot + 2 : KE_MAX_LIST;
                if (d->slot < e_end && e->slot < d_end) fail_msg("%s: lists %s and %s overlap", op, d->name, e->name);
            }
        }
    }
}

static void declarations_are_well_formed(void **state) {
    (void)state;
    int declared = 0;
    for (int op = 0; op < IR_OP_END; op++) {
        const ke_attr_set *s = ir_op_attrs(op);
        check_set(ir_op_name(op), s);
        declared += s->n > 0;
    }
    assert_true(declared > 60);
    /* the IR-only ops are declared too */
    assert_non_null(find(ir_op_attrs(IR_OP_SCALAR), "value"));
    assert_non_null(find(ir_op_attrs(IR_OP_KERNEL), "write_into"));
    assert_int_equal(ir_op_attrs(-1)->n, 0);
    assert_int_equal(ir_op_attrs(IR_OP_END)->n, 0);
}

/* A conventional name means the conventional slot, wherever it is declared. */
static void common_names_keep_their_slots(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int type, slot;
    } common[] = {
        {"keepdim", KE_AT_BOOL, KE_ATTR_KEEPDIM}, {"dtype", KE_AT_DTYPE, KE_ATTR_DTYPE},
        {"reduction", KE_AT_REDUCTION, ke_attr_slot_reduction},
    };
    for (int op = 0; op < KE_OP_COUNT; op++) {
        const ke_attr_set *s = &ke_op_attrs[op];
        for (size_t c = 0; c < sizeof common / sizeof common[0]; c++) {
            const ke_attr_desc *d = find(s, common[c].name);
            if (d && (d->type != common[c].type || d->slot != common[c].slot))
                fail_msg("%s.%s is not the common %s", ke_ops[op].name, d->name, common[c].name);
        }
        /* what generic code reads: random ops' counters, KE_DT_ATTR's dtype,
         * every reduction's dim list and keepdim */
        const ke_op_info *o = &ke_ops[op];
        if (o->flags & KE_F_RANDOM) {
            const ke_attr_desc *seed = find(s, "seed"), *off = find(s, "offset");
            if (!seed || !off || seed->slot != KE_ATTR_SEED || off->slot != KE_ATTR_OFFSET)
                fail_msg("random op %s must declare seed and offset in their slots", o->name);
        }
        if (o->dtype_rule == KE_DT_ATTR && !find(s, "dtype")) fail_msg("%s takes its dtype from an attribute", o->name);
        if (o->kind == KE_KIND_REDUCE) {
            const ke_attr_desc *k = find(s, "keepdim");
            int lists = 0;
            for (int j = 0; j < s->n; j++) lists += s->attr[j].type == KE_AT_LIST && s->attr[j].slot == 0;
            if (!k || lists != 1) fail_msg("reduction %s must declare keepdim and its dim list", o->name);
        }
        if (o->kind == KE_KIND_VIEW && o->nin == 1 && op != KE_OP_alias && s->n == 0)
            fail_msg("view %s has no attributes", o->name);
    }
}

/* Each setter writes the slot its descriptor names, and nothing else. */
#define ROUND_TRIP_I(op, name, v)                                                                   \
    do {                                                                                            \
        ke_attrs a;                                                                                 \
        memset(&a, 0, sizeof a);                                                                    \
        ke_attr_set_##op##_##name(&a, v);                                                           \
        assert_true(ke_attr_##op##_##name(&a) == (v));                                              \
        const ke_attr_desc *d = find(&ke_op_attrs[KE_OP_##op], #name);                              \
        assert_non_null(d);                                                                         \
        assert_true(ke_attr_int_at(&a, d) == (int64_t)(v));                                         \
        ke_attrs z;                                                                                 \
        memset(&z, 0, sizeof z);                                                                    \
        ke_attr_set_##op##_##name(&a, 0);                                                           \
        assert_memory_equal(&a, &z, sizeof a);                                                      \
    } while (0)
#define ROUND_TRIP_F(op, name, v)                                                                   \
    do {                                                                                            \
        ke_attrs a;                                                                                 \
        memset(&a, 0, sizeof a);                                                                    \
        ke_attr_set_##op##_##name(&a, v);                                                           \
        assert_true(ke_attr_##op##_##name(&a) == (v));                                              \
        const ke_attr_desc *d = find(&ke_op_attrs[KE_OP_##op], #name);                              \
        assert_non_null(d);                                                                         \
        assert_true(ke_attr_float_at(&a, d) == (v));                                                \
        ke_attrs z;                                                                                 \
        memset(&z, 0, sizeof z);                                                                    \
        ke_attr_set_##op##_##name(&a, 0);                                                           \
        assert_memory_equal(&a, &z, sizeof a);                                                      \
    } while (0)

static void accessors_write_their_declared_slot(void **state) {
    (void)state;
    ROUND_TRIP_I(softmax, dim, -1);
    ROUND_TRIP_I(layer_norm, normalized_ndim, 2);
    ROUND_TRIP_I(layer_norm, has_bias, true);
    ROUND_TRIP_F(layer_norm, eps, 1e-5);
    ROUND_TRIP_I(slice, step, 3);
    ROUND_TRIP_I(split, total, 7);
    ROUND_TRIP_I(cross_entropy, reduction, KL_REDUCE_SUM);
    ROUND_TRIP_I(cross_entropy, ignore_index, -100);
    ROUND_TRIP_F(clamp, max, 2.5);
    ROUND_TRIP_F(addmm, alpha, -3);
    ROUND_TRIP_I(randint, high, 9);
    ROUND_TRIP_I(full, dtype, KL_I64);
    ROUND_TRIP_I(to_device, device, KL_META);
    ROUND_TRIP_I(scaled_dot_product_attention, causal, true);
    ROUND_TRIP_I(max_pool2d, count_include_pad, true);
    /* the common accessors are the declared slots of the ops that use them */
    ke_attrs a;
    memset(&a, 0, sizeof a);
    ke_attr_set_seed(&a, 11);
    ke_attr_set_offset(&a, 12);
    assert_int_equal(ke_attr_rand_seed(&a), 11);
    assert_int_equal(ke_attr_dropout_offset(&a), 12);
    ke_attr_set_keepdim(&a, true);
    assert_true(ke_attr_sum_keepdim(&a));
    ke_attr_set_reduce_param(&a, 0.5);
    assert_true(ke_attr_var_correction(&a) == 0.5 && ke_attr_norm_p(&a) == 0.5);
    /* lists: the declared part of the one list */
    ke_call c = {.op = KE_OP_conv2d};
    assert_int_equal(ke_set_list(&c, 6, (int64_t[]){1, 2, 3, 4, 5, 6}), 0);
    assert_int_equal(ke_attr_conv2d_padding(&c.a)[1], 4);
    assert_int_equal(ke_attr_conv2d_dilation(&c.a)[0], 5);
    int n;
    const int64_t *l = ke_attr_list_at(&c.a, find(&ke_op_attrs[KE_OP_conv2d], "dilation"), &n);
    assert_int_equal(n, 2);
    assert_int_equal(l[1], 6);
    assert_int_equal(ke_attr_view_shape_len(&c.a), 6);
    /* a LIST2 beyond a short list reads as empty, never past nlist */
    c.a.nlist = 3;
    ke_attr_list_at(&c.a, find(&ke_op_attrs[KE_OP_conv2d], "dilation"), &n);
    assert_int_equal(n, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(declarations_are_well_formed),
        KT_TEST(common_names_keep_their_slots),
        KT_TEST(accessors_write_their_declared_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
