/*
 * opcall.c — kl_op_call: any op of the table by name, its attributes as the
 * text a graph prints for a node ("dims=[1], keepdim=true", attr_text.c).
 *
 * The call is built as a graph node run op by op builds it (src/trace/exec.c,
 * the repro minifier): the row, the in-place flag (a trailing _ on the name,
 * as the IR prints it), the inputs, the parsed attributes, the device (the
 * inputs', or the thread's default device for an op without inputs), then
 * ke_dispatch, so autograd records, tracing traces and every backend runs it
 * as any eager call. That makes every node of a graph replayable from its
 * text alone: repro bundles' replay.c calls it for each node without a
 * generated public function, and bindings can reach every op with one entry
 * point.
 */
#include "dispatch.h"

#include <stdlib.h>
#include <string.h>

/* Levenshtein distance of a and b (short op names), capped at 9. */
static int distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 40 || nb > 40) return 9;
    int row[41];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb] < 9 ? row[nb] : 9;
}

/* The op named name (without a trailing _), or -1. */
static int op_named(const char *name, size_t n) {
    for (int op = 0; op < KE_OP_COUNT; op++)
        if (strlen(ke_ops[op].name) == n && !strncmp(ke_ops[op].name, name, n)) return op;
    return -1;
}

static int unknown_op(const char *name) {
    int best = -1, bd = 9;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        int d = distance(name, ke_ops[op].name);
        if (d < bd) bd = d, best = op;
    }
    size_t n = strlen(name);
    if (best >= 0 && bd <= (n < 6 ? 1 : 2))
        return ke_err(KL_ERR_ARG, "op_call", "unknown op '%.100s' (did you mean '%s'?)", name, ke_ops[best].name);
    return ke_err(KL_ERR_ARG, "op_call", "unknown op '%.100s' (the op table's names, as a graph prints them)", name);
}

/* Inputs the row takes for this call; -1 where it is variadic (the op checks the count). */
static int inputs_taken(int op) {
    return ke_ops[op].kind == KE_KIND_CREATE ? 0 : ke_ops[op].nin;
}

int kl_op_call(const char *op, kl_tensor *const *inputs, int n_inputs, const char *attrs, kl_tensor **outputs,
               int n_outputs) {
    if (!op) return ke_err(KL_ERR_NULL_ARG, "op_call", "op name is NULL");
    if (n_outputs < 0 || (n_outputs > 0 && !outputs))
        return ke_err(KL_ERR_NULL_ARG, "op_call", "%s: no room for outputs (outputs %s, n_outputs %d)", op,
                      outputs ? "given" : "NULL", n_outputs);
    for (int j = 0; j < n_outputs; j++) outputs[j] = NULL;
    if (n_inputs < 0 || (n_inputs > 0 && !inputs))
        return ke_err(KL_ERR_NULL_ARG, "op_call", "%s: inputs %s, n_inputs %d", op, inputs ? "given" : "NULL",
                      n_inputs);
    /* a trailing _ is the in-place form, as the graph IR prints it */
    size_t n = strlen(op);
    int id = op_named(op, n), inplace = 0;
    if (id < 0 && n > 1 && op[n - 1] == '_' && (id = op_named(op, n - 1)) >= 0) inplace = 1;
    if (id < 0) return unknown_op(op);
    const ke_op_info *row = &ke_ops[id];
    /* copy is in place by nature (copy_(dst, src): kl_copy_inplace) */
    if (inplace && !(row->flags & (KE_F_INPLACE | KE_F_ANYCAST)))
        return ke_err(KL_ERR_ARG, "op_call", "%s: kl_%s has no in-place form", op, row->name);
    int want = inputs_taken(id);
    if (want >= 0 && n_inputs != want)
        return ke_err(KL_ERR_ARG, "op_call", "%s takes %d input%s, got %d", op, want, want == 1 ? "" : "s", n_inputs);
    if (want < 0 && n_inputs < 1) return ke_err(KL_ERR_ARG, "op_call", "%s takes 1 input or more, got %d", op, n_inputs);
    ke_call c = {.op = id, .inplace = (uint8_t)inplace, .nin = n_inputs, .in = inputs,
                 .device = ke_tls_state.default_device};
    int random = (row->flags & KE_F_RANDOM) != 0;
    int fresh = ke_attrs_parse(&ke_op_attrs[id], random, attrs, &c.a, "op_call", op);
    if (fresh < 0) return -1;
    if (random && ke_attr_offset(&c.a) == KE_RANDOM_SLOT)
        return ke_err(KL_ERR_ARG, "op_call", "%s: slot=%lld names a compiled graph's per-call random slot, which only "
                      "that graph's call can fill: give seed= and offset= (the numbers to draw), or neither for "
                      "fresh ones", op, (long long)ke_attr_seed(&c.a));
    /* the op's output count: the row's, or (split, chunk) the window asked for */
    int nout = row->nout >= 0 ? row->nout : -1;
    if (nout < 0 && n_outputs > KE_MAX_OUT) /* split, chunk: a window of pieces per call */
        return ke_err(KL_ERR_ARG, "op_call", "%s makes at most %d outputs per call (its count attribute), got room for %d",
                      op, KE_MAX_OUT, n_outputs);
    if (nout >= 0 && n_outputs != nout)
        return ke_err(KL_ERR_ARG, "op_call", "%s makes %d output%s, got room for %d", op, nout, nout == 1 ? "" : "s",
                      n_outputs);
    if (n_inputs > 0) {
        /* the dispatcher's check, first, so a NULL input is named before the random draw */
        for (int i = 0; i < n_inputs; i++)
            if (ke_check_tensor(inputs[i], row->name, i + 1)) return -1;
    }
    if (fresh && ke_random_reserve(&c)) return -1;
    if (ke_dispatch(&c)) return -1;
    if (c.nout != n_outputs) {
        for (int j = 0; j < c.nout && j < KE_MAX_OUT; j++) c.out[j] = NULL;
        return ke_err(KL_ERR_ARG, "op_call", "%s made %d output%s, got room for %d", op, c.nout, c.nout == 1 ? "" : "s",
                      n_outputs);
    }
    for (int j = 0; j < n_outputs; j++) outputs[j] = c.out[j];
    return 0;
}

kl_tensor *kl_wrapped_scalar(double value) {
    kl_tensor *t = ke_wrap_scalar(value);
    if (t) ke_scope_adopt(t);
    return t;
}
