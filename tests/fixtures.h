/*
 * fixtures.h — what the fixture test's files share: a manifest case, the
 * context a runner sees, the runner table, and the helpers each file exports.
 *
 *   fixtures_ops.c     the runner table: a manifest OP -> the op-table row and a call of its kl_ function
 *   fixtures_io.c      the manifest, building inputs from specs, comparing results with torch's
 *   test_fixtures.c    running cases (values, gradients, on Meta), coverage checks, main
 *   fixtures_byname.c  every recorded call replayed through kl_op_call
 *
 * The manifest's format is described at the top of test_fixtures.c.
 */
#ifndef KT_FIXTURES_H
#define KT_FIXTURES_H

#include "harness.h"

#include "autograd.h"
#include "dispatch.h"

#define FX_MAX_IN 8
#define FX_MAX_OUT 16
#define FX_MAX_ATTR 16

typedef struct fx_case {
    int line;
    char *name, *op;
    int nin, nout, nattr;
    char *in[FX_MAX_IN];
    char *out[FX_MAX_OUT];
    char *key[FX_MAX_ATTR], *val[FX_MAX_ATTR];
    bool error, novalues;
    int ngw, ngrad;               /* gradient keys; 0 when the case has none */
    char *gw[FX_MAX_OUT];
    char *grad[FX_MAX_IN];
} fx_case;

typedef struct fx_manifest {
    char *text;       /* the file, tokens point into it */
    fx_case *cases;
    int n;
} fx_manifest;

typedef struct fx_op fx_op;

/* What a runner sees: the case, its built inputs, where its outputs go. */
typedef struct fx_ctx {
    const fx_case *c;
    const fx_op *op;
    kl_tensor *in[FX_MAX_IN];
    int nin;
    kl_tensor *out[FX_MAX_OUT];
    int nout;
    char bad[256];    /* malformed case or broken contract (not a Kiln error) */
} fx_ctx;

typedef int (*fx_run_fn)(fx_ctx *cx);

/* The public function a generic runner calls. */
typedef union fx_fp {
    kl_tensor *(*u)(kl_tensor *);
    kl_tensor *(*b)(kl_tensor *, kl_tensor *);
    kl_tensor *(*bs)(kl_tensor *, double);
    kl_tensor *(*red)(kl_tensor *, int, const int64_t *, bool);
    kl_tensor *(*var)(kl_tensor *, int, const int64_t *, double, bool);
    kl_tensor *(*arg)(kl_tensor *, int, bool);
    int (*mdim)(kl_tensor *, int, bool, kl_tensor **, kl_tensor **);
    kl_tensor *(*scan)(kl_tensor *, int);
    kl_tensor *(*tri)(kl_tensor *, int64_t);
    kl_tensor *(*sm)(kl_tensor *, int);
    kl_tensor *(*pool)(kl_tensor *, const kl_pool2d_options *);
    kl_tensor *(*loss)(kl_tensor *, kl_tensor *, kl_reduction);
    kl_tensor *(*join)(int, kl_tensor *const *, int);
    kl_tensor *(*shape)(kl_tensor *, int, const int64_t *);
    kl_tensor *(*dt)(int, const int64_t *, kl_dtype);
    kl_tensor *(*like)(const kl_tensor *);
} fx_fp;

struct fx_op {
    const char *name;   /* manifest OP: the public function without kl_ */
    const char *row;    /* the op-table row it exercises */
    fx_run_fn run;
    fx_fp fp;
};

/* A row that cannot be checked against torch by value, and why. */
typedef struct fx_allow {
    const char *row, *why;
} fx_allow;

/* Reports a failed check of case c (in scope) and clears the caller's ok. */
#define FX_FAIL(...)                                                                \
    do {                                                                            \
        char m_[768];                                                               \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                       \
        print_message("FAIL %s (%s, manifest line %d): %s\n", c->name, c->op, c->line, m_); \
        ok = false;                                                                 \
    } while (0)

/* fixtures_ops.c */
extern const fx_op fx_ops[];
extern const size_t fx_nops;
extern const fx_allow fx_allowlist[];
extern const size_t fx_nallow;
const fx_op *fx_find_op(const char *name);   /* NULL if no runner has that name */
int fx_row_index(const char *row);           /* -1 if the op table has no such row */

/* fixtures_io.c */
bool fx_load_manifest(fx_manifest *m);       /* false (with a message) if it cannot be read */
void fx_free_manifest(fx_manifest *m);
/* A SPEC's tensor with its modifiers applied; *leaf (if asked) gets the loaded tensor
 * marked requires_grad before them. NULL with err filled on a bad spec. */
kl_tensor *fx_build_leaf(const char *spec, kl_dtype *want, kl_tensor **leaf, char *err, size_t cap);
kl_tensor *fx_build(const char *spec, kl_dtype *want, char *err, size_t cap);
double fx_default_tol(kl_dtype d);
/* 0 if got matches want (dtype want_dt, shape, and values within tol unless !values); else msg says where. */
int fx_compare(kl_tensor *got, kl_tensor *want, kl_dtype want_dt, double tol, bool values, char *msg, size_t cap);

/* test_fixtures.c */
extern const char *volatile fx_current;      /* the case running, named if it crashes */
bool fx_run_case(const fx_case *c);
bool fx_is_inplace(const fx_case *c);
bool fx_shape_from_data(const fx_case *c);
/* Runs run on every case (selected by KT_FIXTURE_FILTER; only those with gradients if grads_only), then fails the test if any failed. */
void fx_run_all(const char *what, bool grads_only, bool catch_signals, bool (*run)(const fx_case *));

/* fixtures_byname.c */
void fixtures_replay_by_name(void **s);

#endif
