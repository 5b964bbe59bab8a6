/*
 * repro.c — KL_COMPILE_CHECK's minifier and repro bundles.
 *
 * When a compiled call differs from eager, or a signature's compile fails,
 * the signature's graph as traced (kept beside the compiled one while the
 * check is on) is cut down by delta debugging over its nodes: a candidate is a set of op nodes; its inputs are
 * the values it reads but does not make, taken from one eager run of the
 * whole graph (snapshots, so later in-place writes do not change them); its
 * outputs are the values it makes that the graph returns or other nodes
 * read. A candidate "still fails" when compiling it (same mode and backend,
 * through kl_compile itself) gives outputs that differ from running it
 * eagerly, or, for a failed compile, when its compile fails with the same
 * status and the same message up to the first digit (value ids and sizes
 * differ between subgraphs; the failure's kind does not). Constants are recreated where they are
 * read, never cut; random ops are never candidates (their draws depend on
 * the call's order), so their values are inputs.
 *
 * The smallest failing set is written to a folder: the graph as traced and
 * after the passes (for a failed compile: as far as they got), the kernel IR
 * (of the kernels that lowered), the LLVM IR the backend emits for each
 * compiled kernel, the inputs as .npy, and replay.c, a C program that
 * rebuilds the subgraph with public kl_ calls and compares compiled against
 * eager with only the installed library (exit 1: reproduced). replay.c calls
 * the typed public forms the op table generates where a node has one (its wrap
 * column: unary, unary with float attributes, binary), and every other node
 * (reductions, views, matmul, creation, composites, several outputs, ...)
 * through kl_op_call with its name and its attribute text exactly as the graph
 * prints it, so every subgraph replays without editing.
 */
#include "trace.h"

#include "log.h"
#include "philox.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Thread_local int tr_in_repro;

#define MAX_TESTS 200 /* compiles per minification, at most */

/* The public forms the op table generates (wrappers.c): what replay.c can call. */
enum { W_none, W_UNARY, W_UNARY_F, W_BINARY };
#define W_UNARY_IP W_UNARY
#define W_UNARY_F1_IP W_UNARY_F
#define W_UNARY_F2_IP W_UNARY_F
static const unsigned char wrap_form[KE_OP_COUNT] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, ...) W_##wrap_,
#include "optable.def"
#undef KE_OP
};

/* One candidate: nodes of g (ascending), the values fed in, the values returned. */
typedef struct rp_set {
    const ir_graph *g;
    int32_t *nodes, n;
    int32_t *in_ids, nin;
    int32_t *out_ids, nout;
} rp_set;

static void set_free(rp_set *s) {
    free(s->nodes);
    free(s->in_ids);
    free(s->out_ids);
    memset(s, 0, sizeof *s);
}

static int is_scalar_value(const ir_graph *g, int32_t v) {
    const ir_value *iv = &g->values[v];
    return iv->kind == IR_VAL_NODE && g->nodes[iv->node].op == IR_OP_SCALAR;
}

/* Fills s's inputs and outputs from its nodes. 0 or -1 (out of memory). */
static int set_io(rp_set *s) {
    const ir_graph *g = s->g;
    uint8_t *mine = calloc((size_t)g->nvalues + 1, 1), *seen = calloc((size_t)g->nvalues + 1, 1);
    s->in_ids = malloc(sizeof *s->in_ids * (size_t)(g->nvalues + 1));
    s->out_ids = malloc(sizeof *s->out_ids * (size_t)(g->nvalues + 1));
    if (!mine || !seen || !s->in_ids || !s->out_ids) {
        free(mine), free(seen);
        return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    }
    s->nin = s->nout = 0;
    for (int k = 0; k < s->n; k++) {
        const ir_node *n = &g->nodes[s->nodes[k]];
        for (int i = 0; i < n->nin; i++) {
            int32_t v = n->in[i];
            if (mine[v] || seen[v] || is_scalar_value(g, v)) continue;
            seen[v] = 1;
            s->in_ids[s->nin++] = v;
        }
        for (int j = 0; j < n->nout; j++) mine[n->out[j]] = 1;
    }
    /* outputs: what the graph returns, or nodes outside the set read (as the
     * whole graph would hand them on), so fusion sees the cut the graph had */
    memset(seen, 0, (size_t)g->nvalues + 1);
    int32_t at = 0;
    for (int32_t k = 0; k < g->nnodes; k++) {
        if (at < s->n && s->nodes[at] == k) {
            at++;
            continue;
        }
        for (int i = 0; i < g->nodes[k].nin; i++) seen[g->nodes[k].in[i]] = 1;
    }
    for (int32_t i = 0; i < g->noutputs; i++) seen[g->outputs[i]] = 1;
    for (int k = 0; k < s->n; k++) {
        const ir_node *n = &g->nodes[s->nodes[k]];
        for (int j = 0; j < n->nout; j++)
            if (seen[n->out[j]]) s->out_ids[s->nout++] = n->out[j];
    }
    free(mine), free(seen);
    return 0;
}

/* A scalar node's value where a node reads it. */
static kl_tensor *scalar_of(const ir_node *n) {
    int wrapped = ir_attr_scalar_wrapped(&n->a);
    double value = ir_attr_scalar_value(&n->a);
    kl_tensor *t = wrapped ? ke_wrap_scalar(value) : kl_scalar_tensor(value, ir_attr_scalar_dtype(&n->a));
    if (t && wrapped) ke_scope_adopt(t);
    return t;
}

/* Runs node n through the dispatcher, reading vals, writing its outputs there. */
static int run_node(const ir_graph *g, const ir_node *n, kl_tensor **vals) {
    kl_tensor *inl[8], **in = n->nin <= 8 ? inl : malloc(sizeof *in * (size_t)n->nin);
    if (!in) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    int rc = 0;
    for (int i = 0; i < n->nin && !rc; i++) {
        int32_t v = n->in[i];
        if (!vals[v] && is_scalar_value(g, v)) vals[v] = scalar_of(&g->nodes[g->values[v].node]);
        if (!(in[i] = vals[v])) rc = ke_err(KL_ERR_INTERNAL, "fn_call", "repro: value %%%d has no tensor", v);
    }
    ke_call c = {.op = n->op, .inplace = n->inplace, .nin = n->nin, .in = in, .device = n->device};
    c.a = n->a;
    if (!rc) rc = ke_dispatch(&c);
    for (int j = 0; !rc && j < n->nout && j < c.nout; j++) vals[n->out[j]] = c.out[j];
    if (in != inl) free(in);
    return rc;
}

/* The candidate as a traceable function: its nodes, replayed through the dispatcher. */
static int replay(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    const rp_set *s = user;
    kl_tensor **vals = calloc((size_t)s->g->nvalues + 1, sizeof *vals);
    if (!vals) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    for (int i = 0; i < n_in && i < s->nin; i++) vals[s->in_ids[i]] = in[i];
    int rc = 0;
    for (int k = 0; k < s->n && !rc; k++) rc = run_node(s->g, &s->g->nodes[s->nodes[k]], vals);
    for (int j = 0; j < n_out; j++) {
        out[j] = rc || j >= s->nout ? NULL : vals[s->out_ids[j]];
        if (!out[j] && !rc) rc = ke_err(KL_ERR_INTERNAL, "fn_call", "repro: output %d was not made", j + 1);
    }
    free(vals);
    return rc;
}

typedef struct rp_state {
    const ir_graph *g;
    kl_tensor **snap;            /* [nvalues]: each value after the eager run of the whole graph */
    kl_compile_options o;        /* the function's options, renamed "repro" */
    const char *fname;           /* the function's own name */
    int tests;
    int fail_code;               /* 0: minify a mismatch; else a compile failing with this status */
    const char *fail_msg;        /* ... and this message (compared up to its first digit) */
} rp_state;

/* Inputs of s from the snapshots, as fresh clones (an in-place node writes its input). */
static int clone_inputs(const rp_state *r, const rp_set *s, kl_tensor **in) {
    for (int i = 0; i < s->nin; i++) {
        kl_tensor *t = r->snap[s->in_ids[i]];
        if (!t) return ke_err(KL_ERR_INTERNAL, "fn_call", "repro: no eager value of %%%d", s->in_ids[i]);
        if (!(in[i] = kl_clone(t))) return -1;
    }
    return 0;
}

/* The same failure: status and message up to the first digit (value ids, sizes, kernel
 * numbers differ from subgraph to subgraph). A "kl_fn_call: " in front is not part of it. */
static int same_failure(const rp_state *r) {
    if (kl_last_status() != r->fail_code) return 0;
    const char *a = kl_last_error(), *b = r->fail_msg;
    if (!strncmp(a, "kl_fn_call: ", 12)) a += 12;
    if (!strncmp(b, "kl_fn_call: ", 12)) b += 12;
    for (; *a && *a == *b && !isdigit((unsigned char)*a); a++, b++) {}
    return (!*a && !*b) || (isdigit((unsigned char)*a) && isdigit((unsigned char)*b));
}

/* 1: compiling s still gives other values than eager (a mismatch) or still fails the same
 * way (a failed compile); 0: it does not (or it fails some other way, which is not the
 * failure being minified); -1: out of memory. Leaves no error pending. */
static int still_fails(rp_state *r, const int32_t *nodes, int n, kl_fn **keep) {
    rp_set s = {.g = r->g, .nodes = malloc(sizeof(int32_t) * (size_t)(n + 1)), .n = n};
    if (s.nodes) memcpy(s.nodes, nodes, sizeof(int32_t) * (size_t)n);
    if (!s.nodes || set_io(&s)) {
        set_free(&s);
        return -1;
    }
    r->tests++;
    int fails = 0;
    if (s.nout == 0) { /* nothing it makes is seen */
        set_free(&s);
        return 0;
    }
    kl_scope_begin();
    kl_tensor **ein = calloc((size_t)s.nin + 1, sizeof *ein), **cin = calloc((size_t)s.nin + 1, sizeof *cin);
    kl_tensor **eout = calloc((size_t)s.nout + 1, sizeof *eout), **cout = calloc((size_t)s.nout + 1, sizeof *cout);
    kl_fn *f = NULL;
    if (ein && cin && eout && cout && !clone_inputs(r, &s, ein) && !clone_inputs(r, &s, cin) &&
        !replay(&s, ein, s.nin, eout, s.nout)) {
        f = kl_compile(replay, &s, &r->o);
        int crc = f ? kl_fn_call(f, cin, s.nin, cout, s.nout) : -1;
        if (r->fail_code) fails = crc && same_failure(r);
        else if (!crc)
            for (int j = 0; j < s.nout && !fails; j++) fails = !tr_same_values(cout[j], eout[j]);
    }
    kl_clear_error();
    free(ein), free(cin), free(eout), free(cout);
    kl_scope_end();
    if (keep && fails) *keep = f;
    else kl_fn_release(f);
    set_free(&s);
    return fails;
}

/* Zeller's ddmin over c[0..*n): shrinks it to a set that still fails and
 * from which no single chunk can be removed (1-minimal, within MAX_TESTS). */
static int ddmin(rp_state *r, int32_t *c, int *n) {
    int32_t *sub = malloc(sizeof *sub * (size_t)(*n + 1));
    if (!sub) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    int gran = 2;
    while (*n >= 2 && r->tests < MAX_TESTS) {
        int len = *n, reduced = 0;
        for (int part = 0; part < gran && !reduced && r->tests < MAX_TESTS; part++) {
            int lo = len * part / gran, hi = len * (part + 1) / gran, m = 0;
            /* the chunk alone, then everything but the chunk */
            for (int pass = 0; pass < 2 && !reduced; pass++) {
                m = 0;
                for (int i = 0; i < len; i++)
                    if ((i >= lo && i < hi) == (pass == 0)) sub[m++] = c[i];
                if (m == 0 || m == len) continue;
                int fr = still_fails(r, sub, m, NULL);
                if (fr < 0) {
                    free(sub);
                    return -1;
                }
                if (fr) {
                    memcpy(c, sub, sizeof *c * (size_t)m);
                    *n = m;
                    gran = pass == 0 ? 2 : (gran > 2 ? gran - 1 : 2);
                    reduced = 1;
                }
            }
        }
        if (reduced) continue;
        if (gran >= len) break;
        gran = gran * 2 < len ? gran * 2 : len;
    }
    free(sub);
    return 0;
}

/* ---- the bundle ---------------------------------------------------------------------------- */

static int write_text(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *o = fopen(path, "w");
    if (!o) return ke_err(KL_ERR_IO, "fn_call", "repro: cannot write %s: %s", path, strerror(errno));
    fputs(text ? text : "", o);
    return fclose(o) ? ke_err(KL_ERR_IO, "fn_call", "repro: cannot write %s", path) : 0;
}

static const char *dtype_enum(kl_dtype d, char *buf, size_t cap) {
    snprintf(buf, cap, "KL_%s", ke_dtypes[d].short_name);
    for (char *p = buf; *p; p++) *p = (char)toupper((unsigned char)*p);
    return buf;
}

/* v as a C expression of type double, exact ("0x1.8p+1" would do too; %.17g reads back exactly). */
static void c_double(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "NAN");
    else if (isinf(v)) snprintf(buf, cap, "%sINFINITY", v < 0 ? "-" : "");
    else snprintf(buf, cap, "%.17g", v);
}

/* The C expression of value v in replay.c. */
static void value_expr(const rp_set *s, int32_t v, char *buf, size_t cap) {
    for (int i = 0; i < s->nin; i++)
        if (s->in_ids[i] == v) {
            snprintf(buf, cap, "in[%d]", i);
            return;
        }
    if (is_scalar_value(s->g, v)) {
        const ir_node *n = &s->g->nodes[s->g->values[v].node];
        char dt[16], num[40];
        c_double(ir_attr_scalar_value(&n->a), num, sizeof num);
        if (ir_attr_scalar_wrapped(&n->a)) snprintf(buf, cap, "kl_wrapped_scalar(%s)", num);
        else snprintf(buf, cap, "kl_scalar_tensor(%s, %s)", num, dtype_enum(ir_attr_scalar_dtype(&n->a), dt, sizeof dt));
        return;
    }
    snprintf(buf, cap, "v%d", v);
}

/* The IR line of node n as the whole graph prints it ("%5: f32[4] = sum(%3, dims=[1])"), from
 * text (ir_to_string of s->g), into buf. */
static void node_line(const rp_set *s, const char *text, const ir_node *n, char *buf, size_t cap) {
    char key[32];
    snprintf(key, sizeof key, "\n  %%%d: ", n->nout ? n->out[0] : -1);
    const char *at = text ? strstr(text, key) : NULL;
    if (!at) {
        snprintf(buf, cap, "%s node", ir_op_name(n->op));
        return;
    }
    at += 3;
    size_t len = strcspn(at, "\n");
    snprintf(buf, cap, "%.*s", (int)(len < cap ? len : cap - 1), at);
    (void)s;
}

/* Node n as a kl_op_call in replay.c: its name (a trailing _ in place), its inputs, its attribute
 * text as the graph prints it, its outputs; the graph's line above it. */
static int write_op_call(FILE *f, const rp_set *s, const char *gtext, const ir_node *n) {
    char line[512];
    node_line(s, gtext, n, line, sizeof line);
    char *attrs = ke_attrs_to_string(&ke_op_attrs[n->op], (ke_ops[n->op].flags & KE_F_RANDOM) != 0, &n->a);
    if (!attrs) return -1;
    fprintf(f, "    /* %s */\n", line);
    /* a creation node runs on the device it was recorded on (kl_op_call: the default device) */
    int dev = n->nin == 0 && n->device.type != KL_CPU;
    if (dev) fprintf(f, "    kl_set_default_device((kl_device){%d, %d});\n", (int)n->device.type, n->device.index);
    fprintf(f, "    kl_tensor *o%d[%d];\n", n->out[0], n->nout);
    fprintf(f, "    if (kl_op_call(\"%s%s\", ", ke_ops[n->op].name, n->inplace ? "_" : "");
    if (n->nin == 0) {
        fprintf(f, "NULL, 0");
    } else {
        fprintf(f, "(kl_tensor *[]){");
        for (int i = 0; i < n->nin; i++) {
            char e[96];
            value_expr(s, n->in[i], e, sizeof e);
            fprintf(f, "%s%s", i ? ", " : "", e);
        }
        fprintf(f, "}, %d", n->nin);
    }
    fprintf(f, ", \"%s\", o%d, %d))\n        return -1;\n", attrs, n->out[0], n->nout);
    if (dev) fprintf(f, "    kl_set_default_device(KL_DEVICE_CPU);\n");
    for (int j = 0; j < n->nout; j++) fprintf(f, "    kl_tensor *v%d = o%d[%d];\n", n->out[j], n->out[0], j);
    free(attrs);
    return 0;
}

/* replay.c's text (malloc'd), or NULL (out of memory). */
static char *replay_source(const rp_set *s, const rp_state *r, const char *what) {
    const kl_compile_options *o = &r->o;
    char *text = NULL, *gtext = ir_to_string(s->g);
    size_t len = 0;
    kl_clear_error(); /* ir_to_string's, if it failed: the lines then name the op only */
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        free(gtext);
        return NULL;
    }
    fprintf(f, "/* replay.c — written by Kiln's KL_COMPILE_CHECK minifier: the smallest subgraph of \"%s\" that\n"
               " * still %s (%s).\n"
               " *\n"
               " *   cc replay.c $(pkg-config --cflags --libs kiln) -o replay && ./replay [folder]\n"
               " *\n"
               " * Loads the inputs (in*.npy) from the folder (default: .), runs the subgraph eagerly and through\n"
               " * kl_compile, and compares them at KL_COMPILE_CHECK's tolerance. Exit 1: reproduced (the compile\n"
               " * or the compiled call failed, or compiled and eager differ); 0: compiled and eager agree; 2: the\n"
               " * program itself failed. */\n",
            r->fname, r->fail_code ? "failed to compile" : "compiled to other values than eager", what);
    fprintf(f, "#include <kiln.h>\n\n#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n");
    fprintf(f, "#define N_IN %d\n#define N_OUT %d\n\n", s->nin, s->nout);
    fprintf(f, "static const double tolerance[N_OUT + 1] = {");
    for (int j = 0; j < s->nout; j++) fprintf(f, "%s%g", j ? ", " : "", tr_tolerance((kl_dtype)s->g->values[s->out_ids[j]].dtype));
    fprintf(f, "};\n\n");
    fprintf(f, "static int subgraph(void *user, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {\n"
               "    (void)user, (void)n_in, (void)n_out;\n");
    int rc = 0;
    for (int k = 0; k < s->n && !rc; k++) {
        const ir_node *n = &s->g->nodes[s->nodes[k]];
        const char *name = ke_ops[n->op].name;
        int form = wrap_form[n->op];
        char a[96] = "", b[96];
        if (n->nin > 0) value_expr(s, n->in[0], a, sizeof a);
        if (form == W_UNARY && n->nin == 1) {
            fprintf(f, "    kl_tensor *v%d = kl_%s%s(%s);\n", n->out[0], name, n->inplace ? "_inplace" : "", a);
        } else if (form == W_UNARY_F && n->nin == 1) {
            fprintf(f, "    kl_tensor *v%d = kl_%s%s(%s", n->out[0], name, n->inplace ? "_inplace" : "", a);
            const ke_attr_set *as = ir_op_attrs(n->op);
            for (int d = 0; d < as->n; d++)
                if (as->attr[d].type == KE_AT_FLOAT) {
                    char num[40];
                    c_double(ke_attr_float_at(&n->a, &as->attr[d]), num, sizeof num);
                    fprintf(f, ", %s", num);
                }
            fprintf(f, ");\n");
        } else if (form == W_BINARY && n->nin == 2 && !is_scalar_value(s->g, n->in[0])) {
            int32_t v1 = n->in[1];
            if (is_scalar_value(s->g, v1) && ir_attr_scalar_wrapped(&s->g->nodes[s->g->values[v1].node].a)) {
                char num[40];
                c_double(ir_attr_scalar_value(&s->g->nodes[s->g->values[v1].node].a), num, sizeof num);
                fprintf(f, "    kl_tensor *v%d = kl_%s_scalar%s(%s, %s);\n", n->out[0], name,
                        n->inplace ? "_inplace" : "", a, num);
            } else {
                value_expr(s, v1, b, sizeof b);
                fprintf(f, "    kl_tensor *v%d = kl_%s%s(%s, %s);\n", n->out[0], name, n->inplace ? "_inplace" : "", a, b);
            }
        } else {
            /* no typed form the table generates (or not for these operands): by name */
            rc = write_op_call(f, s, gtext, n);
        }
    }
    for (int j = 0; j < s->nout; j++) fprintf(f, "    out[%d] = v%d;\n", j, s->out_ids[j]);
    fprintf(f, "    for (int j = 0; j < N_OUT; j++)\n        if (!out[j]) return -1;\n    return 0;\n}\n\n");
    fprintf(f, "int main(int argc, char **argv) {\n"
               "    const char *dir = argc > 1 ? argv[1] : \".\";\n");
    fprintf(f, "    kl_tensor *in[N_IN + 1], *eager[N_OUT], *compiled[N_OUT];\n"
               "    for (int i = 0; i < N_IN; i++) {\n"
               "        char path[4096];\n"
               "        snprintf(path, sizeof path, \"%%s/in%%d.npy\", dir, i);\n"
               "        if (!(in[i] = kl_load_npy(path))) {\n"
               "            fprintf(stderr, \"replay: %%s\\n\", kl_last_error());\n"
               "            return 2;\n"
               "        }\n"
               "    }\n"
               "    unsetenv(\"KL_COMPILE_CHECK\"); /* this program does the check itself */\n"
               "    if (subgraph(NULL, in, N_IN, eager, N_OUT)) {\n"
               "        fprintf(stderr, \"replay: the eager run failed: %%s\\n\", kl_last_error());\n"
               "        return 2;\n"
               "    }\n"
               "    kl_compile_options o = kl_compile_options_default();\n"
               "    o.name = \"repro\";\n"
               "    o.mode = %d;\n", (int)o->mode);
    if (o->backend) fprintf(f, "    o.backend = \"%s\";\n", o->backend);
    fprintf(f, "    kl_fn *f = kl_compile(subgraph, NULL, &o);\n"
               "    if (!f || kl_fn_call(f, in, N_IN, compiled, N_OUT)) {\n"
               "        printf(\"reproduced: the compiled call failed: %%s\\n\", kl_last_error());\n"
               "        kl_fn_release(f);\n"
               "        return 1;\n"
               "    }\n"
               "    int bad = 0;\n"
               "    for (int j = 0; j < N_OUT; j++) {\n"
               "        int same = kl_dtype_of(compiled[j]) == kl_dtype_of(eager[j]) && kl_ndim(compiled[j]) == kl_ndim(eager[j]) &&\n"
               "                   !memcmp(kl_shape(compiled[j]), kl_shape(eager[j]), sizeof(int64_t) * (size_t)kl_ndim(eager[j])) &&\n"
               "                   kl_allclose(kl_to_dtype(compiled[j], KL_F64), kl_to_dtype(eager[j], KL_F64), tolerance[j],\n"
               "                               tolerance[j], true) == 1;\n"
               "        if (!same) {\n"
               "            printf(\"output %%d: compiled differs from eager\\n\", j + 1);\n"
               "            bad = 1;\n"
               "        }\n"
               "    }\n"
               "    printf(\"%%s\\n\", bad ? \"reproduced: the compiled subgraph differs from eager\"\n"
               "                         : \"not reproduced: compiled and eager agree\");\n"
               "    kl_fn_release(f);\n"
               "    return bad;\n"
               "}\n");
    if (fclose(f)) rc = -1;
    free(gtext);
    if (rc) {
        free(text);
        return NULL;
    }
    return text;
}

static _Atomic int bundle_seq;

/* Makes the bundle's folder: $KL_DEBUG_DIR/kiln_repro_<pid>_<n> (KL_DEBUG_DIR made if missing), or
 * ./kiln_repro_<pid>_<n>. */
static int make_dir(char *dir, size_t cap) {
    const char *base = getenv("KL_DEBUG_DIR");
    if (!base || !*base) base = ".";
    /* and the folders above it that are missing, as mkdir -p */
    snprintf(dir, cap, "%s", base);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0777);
            *p = '/';
        }
    mkdir(base, 0777);
    for (int tries = 0; tries < 100; tries++) {
        snprintf(dir, cap, "%s/kiln_repro_%d_%d", base, (int)getpid(), atomic_fetch_add(&bundle_seq, 1));
        if (mkdir(dir, 0777) == 0) return 0;
        if (errno != EEXIST) break;
    }
    return ke_err(KL_ERR_IO, "fn_call", "repro: cannot make a folder under %s: %s", base, strerror(errno));
}

/* Each kernel of g: kernel<N>.txt, and kernel<N>.ll where its backend can dump it. */
int tr_dump_kernels(const ir_graph *g, const char *dir) {
    for (int32_t k = 0; k < g->nkernels; k++) {
        const ir_kernel *kn = g->kernels[k];
        char path[4200];
        snprintf(path, sizeof path, "%s/kernel%d.txt", dir, (int)k);
        char *text = ir_kernel_to_string(kn);
        FILE *o = text ? fopen(path, "w") : NULL;
        if (o) {
            fprintf(o, "# kernel %d = %s\n%s", (int)k, kn->ops ? kn->ops : "?", text);
            fclose(o);
        }
        free(text);
        if (!o) return ke_err(KL_ERR_IO, "fn_call", "repro: cannot write %s", path);
        snprintf(path, sizeof path, "%s/kernel%d.ll", dir, (int)k);
        if (kn->backend && kn->backend->dump && kn->backend->dump(kn, path)) return -1;
    }
    return 0;
}

/* A failed compile: the subgraph (sub, as traced) compiled again step by step as kl_compile
 * does (passes, then kernels) on a copy, so the bundle shows how far it got: explain.txt
 * with the error and the graph after the passes, kernel<N>.txt of what lowered. */
static int write_failed_compile(const rp_state *r, const ir_graph *sub, const char *dir) {
    ir_graph *g = ir_graph_clone(sub);
    if (!g) return -1;
    g->fuse = r->o.mode == KL_COMPILE_FUSE;
    const char *want = r->o.backend ? r->o.backend : getenv("KL_CPU_BACKEND");
    const ir_backend *cpu = NULL;
    const char *step = "the passes";
    int bad = r->o.mode != KL_COMPILE_TRACE_ONLY && ir_optimize(g);
    if (!bad && r->o.mode != KL_COMPILE_TRACE_ONLY) {
        step = "compiling the kernels";
        bad = (want && *want && !(cpu = ir_backend_by_name(want))) || tr_compile_kernels(g, cpu);
    }
    char err[1100];
    snprintf(err, sizeof err, "%s", bad ? kl_last_error() : "(it compiled here)");
    kl_clear_error();
    char *gtext = ir_to_string(g), *text = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&text, &len);
    int rc = 0;
    if (o) {
        fprintf(o, "The compile of this subgraph fails in %s:\n  %s\n\nThe graph after the passes, as far as they "
                "got (kernel nodes are groups that lowered; kernelN.txt holds their kernel IR):\n%s",
                step, err, gtext ? gtext : "(could not be printed)\n");
        fclose(o);
        rc = write_text(dir, "explain.txt", text);
    } else {
        rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    }
    free(text);
    free(gtext);
    if (!rc) rc = tr_dump_kernels(g, dir);
    ir_graph_free(g);
    return rc;
}

static int write_bundle(rp_state *r, const rp_set *s, kl_fn *f, const char *what, int n_before, char *dir,
                        size_t dir_cap) {
    if (make_dir(dir, dir_cap)) return -1;
    int rc = 0;
    /* the subgraph as traced, and everything kl_fn_explain says of its compiled form */
    kl_tensor **in = calloc((size_t)s->nin + 1, sizeof *in);
    if (!in) return ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    ir_graph *sub = NULL;
    kl_scope_begin();
    rc = clone_inputs(r, s, in);
    for (int i = 0; i < s->nin && !rc; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/in%d.npy", dir, i);
        rc = kl_save_npy(path, in[i]);
    }
    if (!rc) {
        int broke = 0;
        char why[256];
        sub = tr_trace(replay, (void *)s, in, s->nin, s->nout, &broke, why, sizeof why);
        char *text = sub ? ir_to_string(sub) : NULL;
        kl_clear_error(); /* a subgraph that does not trace is said so in graph.txt */
        rc = write_text(dir, "graph.txt", text ? text : "(the subgraph did not trace)\n");
        free(text);
    }
    kl_scope_end();
    free(in);
    if (!rc && r->fail_code) {
        rc = sub ? write_failed_compile(r, sub, dir) : write_text(dir, "explain.txt", "(the subgraph did not trace)\n");
    } else if (!rc) {
        char *text = NULL;
        size_t len = 0;
        FILE *o = open_memstream(&text, &len);
        if (o) {
            kl_fn_explain(f, o);
            fclose(o);
        }
        rc = write_text(dir, "explain.txt", text);
        free(text);
        if (!rc) rc = tr_fn_dump_kernels(f, dir);
    }
    ir_graph_free(sub);
    char *src = rc ? NULL : replay_source(s, r, what);
    if (!rc && !src) rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    if (src) rc = write_text(dir, "replay.c", src);
    free(src);
    if (!rc) {
        char readme[6144];
        snprintf(readme, sizeof readme,
                 "Kiln repro bundle of \"%s\": %s\n\n"
                 "The graph as traced had %d op nodes; the smallest subgraph that still %s has %d\n"
                 "(delta debugging over nodes, %d compiles).\n\n"
                 "graph.txt      the subgraph as traced (its inputs are in*.npy, in order)\n"
                 "explain.txt    %s\n"
                 "kernelN.txt    kernel IR of each fused kernel%s\n"
                 "kernelN.ll     LLVM IR the backend emits for it (LLVM builds%s)\n"
                 "in*.npy        the subgraph's inputs, from the eager run of the whole graph\n"
                 "replay.c       cc replay.c $(pkg-config --cflags --libs kiln) -o replay && ./replay .\n"
                 "               exit 1: reproduced, 0: not reproduced, 2: the program failed\n",
                 r->fname, what, n_before, r->fail_code ? "fails to compile the same way" : "differs", s->n, r->tests,
                 r->fail_code ? "the compile's error, and the graph after the passes as far as they got"
                              : "kl_fn_explain of the compiled subgraph: graph after the passes, kernels",
                 r->fail_code ? " that lowered before the failure" : "", r->fail_code ? ", kernels that compiled" : "");
        rc = write_text(dir, "README.txt", readme);
    }
    return rc;
}

int tr_repro(const ir_graph *traced, kl_tensor *const *inputs, int n_in, const kl_compile_options *o, const char *what,
             int fail_code, char *dir, size_t dir_cap) {
    const ir_graph *g = traced;
    if (g->ninputs != n_in) return ke_err(KL_ERR_INTERNAL, "fn_call", "repro: %d inputs for a graph of %d", n_in, g->ninputs);
    rp_state r = {.g = g, .o = *o, .fname = o->name ? o->name : "fn", .fail_code = fail_code, .fail_msg = what};
    r.o.name = "repro";
    int rc = 0;
    int32_t *cand = malloc(sizeof *cand * (size_t)(g->nnodes + 1));
    kl_tensor **vals = calloc((size_t)g->nvalues + 1, sizeof *vals);
    r.snap = calloc((size_t)g->nvalues + 1, sizeof *r.snap);
    if (!cand || !vals || !r.snap) rc = ke_err(KL_ERR_OOM, "fn_call", "out of memory");
    int n = 0;
    tr_in_repro++;
    kl_no_grad_begin();
    kl_scope_begin();
    /* every value of one eager run, snapshotted as it is made */
    for (int i = 0; i < n_in && !rc; i++) {
        vals[g->inputs[i]] = kl_clone(inputs[i]);
        rc = !(r.snap[g->inputs[i]] = kl_retain(kl_clone(inputs[i])));
    }
    for (int32_t k = 0; k < g->nnodes && !rc; k++) {
        const ir_node *nd = &g->nodes[k];
        if (nd->op == IR_OP_SCALAR) continue;
        if (nd->op == IR_OP_CAPTURED) {
            vals[nd->out[0]] = g->captured[ir_attr_captured_index(&nd->a)];
        } else if (nd->op >= KE_OP_COUNT) {
            rc = ke_err(KL_ERR_INTERNAL, "fn_call", "repro: unexpected %s node in a traced graph", ir_op_name(nd->op));
            break;
        } else {
            rc = run_node(g, nd, vals);
            if (!(ke_ops[nd->op].flags & KE_F_RANDOM)) cand[n++] = k;
        }
        for (int j = 0; j < nd->nout && !rc; j++)
            rc = !(r.snap[nd->out[j]] = kl_retain(kl_clone(vals[nd->out[j]])));
    }
    kl_scope_end();
    int n_before = n;
    kl_fn *f = NULL;
    if (!rc) {
        int fr = still_fails(&r, cand, n, NULL);
        if (fr < 0) rc = -1;
        else if (!fr)
            rc = ke_err(KL_ERR_STATE, "fn_call", "repro: the graph replayed node by node %s",
                        fail_code ? "compiles (or fails another way)" : "does not differ");
    }
    /* KL_TEST_REPRO_NO_MINIFY (tests only): the bundle of the whole graph, so a test's replay.c
     * holds every node the function made */
    const char *keep_all = getenv("KL_TEST_REPRO_NO_MINIFY");
    if (!rc && !(keep_all && *keep_all == '1')) rc = ddmin(&r, cand, &n);
    if (!rc && still_fails(&r, cand, n, &f) != 1) rc = ke_err(KL_ERR_STATE, "fn_call", "repro: the minimized graph stopped failing");
    if (!rc) {
        rp_set s = {.g = g, .nodes = malloc(sizeof(int32_t) * (size_t)(n + 1)), .n = n};
        if (s.nodes) memcpy(s.nodes, cand, sizeof(int32_t) * (size_t)n);
        rc = !s.nodes || set_io(&s) ? -1 : write_bundle(&r, &s, f, what, n_before, dir, dir_cap);
        set_free(&s);
    }
    if (!rc)
        ke_logl(KE_LOG_GRAPH, KL_LOG_WARN, "%s: KL_COMPILE_CHECK: minified the graph from %d to %d op nodes (%d compiles); "
                "repro bundle in %s", o->name ? o->name : "fn", n_before, n, r.tests, dir);
    kl_fn_release(f);
    kl_no_grad_end();
    tr_in_repro--;
    for (int32_t v = 0; r.snap && v < g->nvalues; v++)
        if (r.snap[v]) kl_release(r.snap[v]);
    free(r.snap);
    free(vals);
    free(cand);
    return rc;
}

int tr_repro_error(const ir_graph *traced, kl_tensor *const *inputs, int n_in, const kl_compile_options *o,
                   int fail_code) {
    ke_error_stash found;
    ke_error_set_aside(&found);
    const char *what = found.msg;
    if (!strncmp(what, "kl_fn_call: ", 12)) what += 12;
    char dir[4096];
    /* the minifier's eager run draws random numbers: later draws stay as if it had not run */
    ke_generator gen = ke_generator_get_state(ke_default_generator());
    int rc = tr_repro(traced, inputs, n_in, o, what, fail_code, dir, sizeof dir);
    ke_generator_set_state(ke_default_generator(), gen);
    char tail[4700]; /* appended: the error stays the one found, word for word */
    if (rc) {
        snprintf(tail, sizeof tail, " (no repro bundle: %.600s)", kl_last_error());
        kl_clear_error();
    } else {
        snprintf(tail, sizeof tail, "; repro bundle: %s", dir);
    }
    strncat(found.msg, tail, sizeof found.msg - strlen(found.msg) - 1);
    ke_error_put_back(&found);
    return -1;
}
