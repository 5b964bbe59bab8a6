/*
 * autograd.h — the autograd layer's internal structures: per-tensor metadata,
 * backward nodes, saved tensors, and the derivative table.
 *
 * The layer plugs into eager by registering the Autograd dispatch key's
 * handler (record.c) and the tensor free hook; eager never includes this.
 *
 * Graph shape (as PyTorch's): a tensor produced by a recorded op points to its
 * node (grad_fn) and its output number; a node points to the nodes of its
 * inputs (edges). A leaf that requires grad is reached through an
 * accumulate node that holds the leaf and adds incoming gradients to its grad.
 * Nodes are refcounted: by the tensors they produced and by later nodes'
 * edges, so the graph dies with the last tensor that can reach it.
 */
#ifndef AG_AUTOGRAD_H
#define AG_AUTOGRAD_H

#include "dispatch.h"

typedef struct ag_node ag_node;

/* Per-tensor autograd state (kl_tensor.autograd), created on demand. */
typedef struct ag_meta {
    uint8_t requires_grad;
    uint8_t retains_grad;
    uint8_t is_view;          /* made by a recorded view op: no in-place through it */
    int16_t nondiff_op;       /* 1 + ke_op of the non-differentiable op that made
                                 it from an input requiring grad (for errors), or 0 */
    int32_t output_nr;        /* which output of grad_fn this tensor is */
    ag_node *grad_fn;         /* strong; NULL for leaves */
    ag_node *acc;             /* weak: the leaf's accumulate node while one lives */
    kl_tensor *grad;          /* strong (internal reference) */
    int64_t view_version;     /* storage version when the view was recorded */
} ag_meta;

/* An edge to the node that receives the gradient of one input. */
typedef struct ag_edge {
    ag_node *fn;              /* strong; NULL: the input needs no gradient */
    int32_t output_nr;
} ag_edge;

/* dtype, shape and device of a node's input or output (to shape gradients). */
typedef struct ag_tmeta {
    uint8_t dtype, ndim;
    kl_device device;
    int64_t shape[KL_MAX_DIMS];
} ag_tmeta;

/* A tensor saved for backward with the version it had then. Outputs are
 * saved as a history-free alias (a saved output holding its own node would
 * be a cycle) and get the node back as grad_fn when unpacked for double
 * backward, as PyTorch's SavedVariable does. */
typedef struct ag_saved {
    kl_tensor *t;             /* strong, or NULL if not saved / released */
    int64_t version;
    uint8_t is_output;
} ag_saved;

#define AG_OP_ACCUMULATE (-1) /* node kind of a leaf's accumulator */
#define AG_OP_CUSTOM (-2)     /* node kind whose backward is a callback (ag_custom) */

/* A node whose backward is a callback, for an upper layer (a compiled
 * function's call is one node; src/trace/aot.c): autograd never calls up by
 * name. backward receives the output gradients (zeros materialized for
 * floating outputs where none flowed), which inputs need a gradient, and
 * create_graph; it fills gin[nin] with scope-owned gradients (NULL = zero) and
 * returns 0, or -1 with an error recorded. release_saved drops what the
 * backward needs (after a backward without retain_graph; a second backward
 * then fails in backward itself); release frees ctx when the node dies. */
typedef struct ag_custom {
    const char *name;
    int (*backward)(void *ctx, int create_graph, int nout, kl_tensor *const *gout, int nin, const uint8_t *need,
                    kl_tensor **gin);
    void (*release_saved)(void *ctx);
    void (*release)(void *ctx);
} ag_custom;

struct ag_node {
    _Atomic int32_t refcount;
    int32_t op;               /* ke_op, or AG_OP_ACCUMULATE */
    uint8_t inplace;
    uint8_t released;         /* saved tensors freed by a backward */
    int64_t seq;              /* creation order: later nodes run first */
    ke_loc loc;               /* the forward call's line (-DKL_TRACK_SOURCE; anomaly reports) */
    ke_attrs a;
    int32_t nin, nout;
    ag_edge *next;            /* [nin] */
    ag_tmeta *in_meta;        /* [nin] */
    ag_tmeta *out_meta;       /* [nout] */
    ag_saved *saved_in;       /* [nin] */
    ag_saved *saved_out;      /* [nout] */
    kl_tensor *leaf;          /* AG_OP_ACCUMULATE: the leaf (strong) */
    kl_tensor **retained;     /* [nout] weak: outputs that retain their grad */
    const ag_custom *custom;  /* AG_OP_CUSTOM: the callbacks, and their context (owned) */
    void *custom_ctx;
    /* Scratch of the backward pass running over this node (engine.c; one
     * backward at a time, under the engine's lock). */
    int64_t run;              /* id of the pass that set the fields below */
    int32_t deps;             /* edges from reached nodes not yet processed */
    uint8_t needed;           /* kl_autograd_grad: leads to a requested input */
    kl_tensor **buf;          /* [nout] gradients received so far */
};

/* What a derivative formula sees. Formulas are written with kl_ ops, so they
 * run on any backend and are themselves recorded when create_graph is set. */
typedef struct ag_ctx {
    int op;
    uint8_t inplace;
    const ke_attrs *a;
    int nin, nout;
    const ag_tmeta *in_meta;   /* [nin] every input's dtype/shape/device */
    const ag_tmeta *out_meta;  /* [nout] */
    kl_tensor *const *in;      /* [nin] saved inputs (NULL where not saved) */
    kl_tensor *const *out;     /* [nout] saved outputs (NULL where not saved) */
    kl_tensor *const *gout;    /* [nout] output gradients: zeros where none
                                  flowed; NULL for non-floating outputs */
    const uint8_t *need;       /* [nin] nonzero: gin[i] is wanted */
    kl_tensor **gin;           /* [nin] results, scope-owned; NULL = zero. May
                                  have the broadcast shape or another float
                                  dtype: the engine sums to the input's shape
                                  and casts to its dtype. */
} ag_ctx;

/* Returns 0, or -1 with an error recorded. */
typedef int (*ag_deriv_fn)(ag_ctx *c);

/* What to save: inputs by bit i, outputs by bit 16 + i. */
#define AG_IN(i) (1u << (i))
#define AG_OUT(i) (1u << (16 + (i)))
#define AG_ALL_IN 0xffffu    /* every input (variadic ops) */

typedef struct ag_deriv {
    ag_deriv_fn fn;            /* NULL: see decomp */
    uint32_t save;
    uint8_t decomp;            /* differentiate through the op's decomposition */
} ag_deriv;

/* The derivative columns of the op table (optable.def), indexed by ke_op:
 * fn and save for a row with a formula, decomp for `decomp`, all zero for
 * `none`. */
extern const ag_deriv ag_derivs[KE_OP_COUNT];

/* The formulas the rows name (d_*.c), declared from the rows. */
typedef int ag_deriv_sig(ag_ctx *c);
#define AG_DECL_NAME(fn) ag_deriv_sig fn;
#define AG_DECL_DECOMP(fn)
#define AG_DECL_NONE(fn)
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    KE_PP_CAT(AG_DECL_, KE_COL_TAG(deriv_))(deriv_)
#include "optable.def"
#undef KE_OP

/* ---- metadata and nodes (meta.c, node.c) ---- */
ag_meta *ag_meta_get(const kl_tensor *t);           /* NULL if none */
ag_meta *ag_meta_ensure(kl_tensor *t);              /* NULL + KL_ERR_OOM */
static inline int ag_requires(const kl_tensor *t) {
    const ag_meta *m = (const ag_meta *)t->autograd;
    return m && m->requires_grad;
}
/* Sets or clears t's Autograd dispatch key from its requires_grad. */
void ag_sync_key(kl_tensor *t);

ag_node *ag_node_new(int op, int nin, int nout);    /* refcount 1 */
static inline void ag_node_incref(ag_node *n) {
    atomic_fetch_add_explicit(&n->refcount, 1, memory_order_relaxed);
}
void ag_node_decref(ag_node *n);
/* The edge that receives t's gradient (accumulate node for a leaf, made on
 * demand); {NULL, 0} if t does not require grad. The edge holds a reference. */
int ag_edge_of(kl_tensor *t, ag_edge *e);
void ag_saved_release(ag_node *n);
/* Unpacks saved tensor i of a node (input or output) after checking its
 * version; scope-owned result. For outputs with grad_on, the result has
 * the node as grad_fn. NULL + KL_ERR_STATE on a stale or released save. */
kl_tensor *ag_saved_unpack(ag_node *n, ag_saved *s, int index, int grad_on);
void ag_tmeta_of(const kl_tensor *t, ag_tmeta *m);

/* Records one AG_OP_CUSTOM node with edges to inputs[0..nin) (those not
 * requiring grad get none) and makes outputs[0..nout) its results: each
 * floating output, which must be a fresh tensor without history (made by the
 * caller, not an input or a view of one), gets the node as grad_fn. The node
 * owns ctx from this call on (released with it, or here on failure).
 * Returns 0 or -1. (node.c) */
int ag_record_custom(const ag_custom *cb, void *ctx, int nin, kl_tensor *const *inputs, int nout,
                     kl_tensor *const *outputs);

/* ---- grad mode (meta.c) ---- */
static inline int ag_grad_enabled(void) {
    return !(ke_tls_state.exclude & KE_KS(KE_KEY_AUTOGRAD));
}
/* Sets grad mode, returning the previous one (for the engine's inner scopes). */
int ag_set_grad_mode(int enabled);
extern _Atomic int ag_anomaly;
/* The Autograd key's handler (record.c). */
int ag_record_handler(ke_call *c);
/* 1 if the handler would differentiate c through its op's decomposition
 * (grad mode on, an input requires grad, the row's derivative is `decomp`):
 * it then records the decomposition's pieces, not one node. (record.c) */
int ag_records_pieces(const ke_call *c);
/* Hooks src/init.c installs into eager (ke_hooks): the tensor free hook,
 * which drops what t's metadata holds; and $KL_ANOMALY, read once. */
void ag_meta_free(kl_tensor *t);
void ag_anomaly_from_env(void);

/* ---- helpers for derivative formulas (helpers.c) ---- */
/* g summed over broadcast dims down to (ndim, shape); g itself if equal. */
kl_tensor *ag_sum_to(kl_tensor *g, int ndim, const int64_t *shape);
/* A scope-owned tensor of zeros described by m. */
kl_tensor *ag_zeros(const ag_tmeta *m);
/* Runs op on inputs with the given attributes through the dispatcher (for
 * formulas that reuse a forward op with its recorded attributes, e.g.
 * dropout's mask from the same seed). Returns out[0], scope-owned. */
kl_tensor *ag_call(int op, int nin, kl_tensor *const *in, const ke_attrs *a);

/* ---- test hooks ---- */
/* How many times each op's derivative ran (decomp: its decomposition was
 * recorded), and how many of those under create_graph. Used by the test that
 * every differentiable op is gradchecked. */
extern _Atomic int64_t ag_stat_backward[KE_OP_COUNT];
extern _Atomic int64_t ag_stat_double[KE_OP_COUNT];

#endif /* AG_AUTOGRAD_H */
