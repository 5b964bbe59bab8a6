/*
 * ir.h — the graph IR of compiled functions (prefix ir_).
 *
 * A graph is SSA: every value is defined once, by a graph input or by one
 * output of one node, and carries its dtype, shape, strides and device. Nodes
 * are ops of the eager op table (the same ke_op ids and ke_attrs the
 * dispatcher uses, so a node can always be run by building a ke_call) plus a
 * few IR-only ops (constants, captured tensors). Nodes are kept in a valid
 * execution order: every input of node k is a graph input or an output of a
 * node before k.
 *
 * In-place ops are recorded as they were called (inplace = 1: output 0 is a
 * new value that stands for input 0's storage after the write); the
 * functionalization pass rewrites them. View ops produce values that alias
 * their input's storage: a value's `base` names the value whose storage it
 * shares (itself if it owns its storage), which the passes that move or
 * remove writes must respect.
 */
#ifndef IR_IR_H
#define IR_IR_H

#include "dispatch.h"

#include <stdio.h>

/* IR-only ops, numbered after the op table. */
enum ir_op {
    IR_OP_SCALAR = KE_OP_COUNT, /* 0-dim constant: value, dtype; wrapped: C scalar promotion rules */
    IR_OP_CAPTURED,             /* a tensor captured from outside the traced function, read at each
                                   call (not baked in): graph->captured[index] */
    IR_OP_COPY_BACK,            /* writes in[1] into graph input in[0]'s storage (functionalization's
                                   final write-back); no outputs */
    /* ---- fusion (fuse.c, kernel.h) ---- */
    IR_OP_KERNEL,               /* a fused kernel: graph->kernels[id] reads in[], writes out[] */
    IR_OP_END
};

/* Named attributes of the IR-only ops (ir_attrs.def): ir_attr_scalar_value(a), ... */
#define KE_A KE_ATTR_TUPLE
#define IR_ATTRS(OP, op, attrs) KE_ATTR_ACCESSORS(ir, op, attrs)
#include "ir_attrs.def"
#undef KE_A
#undef IR_ATTRS
/* The declared attributes of any node's op: the op table's or the IR's. */
const ke_attr_set *ir_op_attrs(int op);

/* Random op nodes (KE_F_RANDOM) carry a reservation in their seed and offset
 * attributes. When offset == IR_RANDOM_SLOT, seed is a slot: each call reserves fresh
 * counters once per slot, in graph order, and every node of a slot draws the
 * same numbers (dropout's backward regenerates its forward's mask that way,
 * as eager does from the same attributes). Otherwise seed and offset are a fixed
 * seed and offset reserved before tracing (a mask made outside the function). */
#define IR_RANDOM_SLOT KE_RANDOM_SLOT

typedef enum ir_value_kind {
    IR_VAL_INPUT,   /* graph input number `index` */
    IR_VAL_NODE     /* output `index` of node `node` */
} ir_value_kind;

typedef struct ir_value {
    int32_t id;
    uint8_t kind;           /* ir_value_kind */
    uint8_t dtype;
    uint8_t ndim;
    uint8_t wrapped;        /* a C scalar (lowest promotion priority) */
    kl_device device;
    int32_t node;           /* IR_VAL_NODE: defining node */
    int32_t index;          /* input number or output index */
    int32_t base;           /* value whose storage this one shares (itself if none) */
    int64_t offset;         /* element offset into base's storage */
    int64_t shape[KL_MAX_DIMS];
    int64_t stride[KL_MAX_DIMS];
} ir_value;

typedef struct ir_node {
    int32_t op;             /* ke_op or ir_op */
    uint8_t inplace;        /* output 0 is input 0 after an in-place write */
    uint8_t dead;           /* removed by a pass (compacted by ir_graph_compact) */
    int8_t compute;         /* the dtype the op computes in, as its shape rule chose when it was
                               traced (ke_call.compute; outputs are in out[]'s values); -1: none
                               (IR-only ops, views): such a node is never fused */
    int32_t nin, nout;
    int32_t *in;            /* [nin] value ids */
    int32_t out[KE_MAX_OUT];
    kl_device device;       /* the device the node computes on (creation ops: create on) */
    ke_loc loc;             /* the user's line that called the op (-DKL_TRACK_SOURCE), or none */
    ke_attrs a;
} ir_node;

typedef struct ir_graph {
    ir_value *values;
    int32_t nvalues, cap_values;
    ir_node *nodes;
    int32_t nnodes, cap_nodes;
    int32_t *inputs, ninputs;      /* value ids of the graph inputs, in call order */
    int32_t *outputs, noutputs;    /* value ids returned, in order */
    kl_tensor **captured;          /* tensors IR_OP_CAPTURED reads (strong references) */
    int32_t ncaptured;
    /* ---- fusion (fuse.c, kernel.h) ---- */
    struct ir_kernel **kernels;    /* what IR_OP_KERNEL nodes run (owned) */
    int32_t nkernels;
    uint8_t fuse;                  /* FUSE mode may fuse this graph (set by the compiler) */
    /* ---- memory planning (plan.c) ---- */
    struct ir_plan *plan;          /* made by the last pass; NULL: none (TRACE_ONLY) */
    char *notes;                   /* why fusion stopped where it did, one line each, written where
                                      fuse.c decides (owned; NULL: none): KL_LOG=fusion, kl_fn_explain */
} ir_graph;

/* ---- building (graph.c) ----------------------------------------------------------- */
/* Appends one line to g->notes (dropped if out of memory: notes explain, they decide nothing). */
void ir_note(ir_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ir_graph *ir_graph_new(void);                    /* NULL + KL_ERR_OOM */
void ir_graph_free(ir_graph *g);
/* A copy of g; its kernels are shared with g, never recompiled (kernel.h). */
ir_graph *ir_graph_clone(const ir_graph *g);
/* Adds a graph input shaped like t (dtype, shape, strides, device). Returns its value id or -1. */
int32_t ir_add_input(ir_graph *g, const kl_tensor *t);
/* Appends a node computing on device in dtype compute (-1: none); its outputs
 * get new value ids shaped like out_like (the meta results of the op) on that
 * device. Returns the node index or -1. */
int32_t ir_add_node(ir_graph *g, int op, int inplace, int nin, const int32_t *in, int nout,
                    kl_tensor *const *out_like, const ke_attrs *a, kl_device device, int compute);
/* A 0-dim constant node; returns its value id. */
int32_t ir_add_scalar(ir_graph *g, double v, kl_dtype dt, int wrapped, kl_device device);
/* Holds t (a reference) and adds an IR_OP_CAPTURED node; returns its value id. */
int32_t ir_add_captured(ir_graph *g, kl_tensor *t);
int ir_set_outputs(ir_graph *g, int n, const int32_t *ids);
/* Drops dead nodes and unreferenced values, renumbering (passes call it last). */
int ir_graph_compact(ir_graph *g);
/* Number of uses of each value (node inputs + graph outputs) into uses[nvalues]. */
void ir_count_uses(const ir_graph *g, int32_t *uses);

static inline const char *ir_op_name(int op) {
    if (op < KE_OP_COUNT) return ke_ops[op].name;
    switch (op) {
    case IR_OP_SCALAR: return "scalar";
    case IR_OP_CAPTURED: return "captured";
    case IR_OP_COPY_BACK: return "copy_back";
    case IR_OP_KERNEL: return "kernel";
    default: return "?";
    }
}

/* ---- passes (pipeline.c; one pass per file) ---------------------------------------------- */
/* The pass pipeline of NO_FUSE / FUSE modes. With KL_DEBUG_DIR set, the graph
 * after each pass is written there. Returns 0 or -1. */
int ir_optimize(ir_graph *g);
/* Dead-code elimination: drops nodes whose outputs nothing uses, keeping
 * writes into graph inputs or captured tensors and random ops (they advance
 * the generator). Returns the number of nodes removed, or -1. */
int ir_pass_dce(ir_graph *g);
/* 1 if node n has an effect besides its outputs. */
int ir_node_has_effect(const ir_graph *g, const ir_node *n);

/* ---- fusion (fuse.c; kernel IR in kernel.h) ---------------------------------------------- */
/* Fusion: when g->fuse is set, replaces groups of elementwise nodes (and row
 * reductions with their producers and consumers) by IR_OP_KERNEL nodes, each
 * lowered to kernel IR. Nothing is compiled here: the trace layer hands the
 * kernels to a backend once every pass has run. Returns the number of
 * kernels made, or -1. */
int ir_pass_fuse(ir_graph *g);
/* After fusion: an elementwise kernel whose output is copied back into a tensor it
 * reads at the same elements writes that tensor directly (the kernel node's write_into[j]:
 * the input position output j is written into, -1 for a fresh output), and the copy_back
 * goes (writeback.c). Returns the number of copies removed, or -1. */
int ir_pass_writeback(ir_graph *g);
/* Frees g's kernel table (graph.c calls it). */
void ir_free_kernels(ir_graph *g);
/* Gives dst src's kernel table: the same kernels, one more reference each. 0 or -1. */
int ir_clone_kernels(ir_graph *dst, const ir_graph *src);

/* ---- graph passes: shared helpers (passutil.c) and the passes (cse.c, fold.c, simplify.c,
 * decompose.c, functionalize.c). Each returns the number of changes or -1. -------------- */
/* A malloc'd mask of nvalues entries: 1 for every storage base that an in-place node
 * or a copy_back writes. A value over such a base may change between its definition
 * and a later read, so value-replacing passes leave it alone. NULL + KL_ERR_OOM. */
uint8_t *ir_written_mask(const ir_graph *g);
/* 1 if value id is one of the graph's outputs. */
int ir_is_output(const ir_graph *g, int32_t id);
/* Exact attribute equality over the slots that carry meaning: f[] (bitwise, so -0 != 0 and
 * NaN == the same NaN), i[], nlist and list[0..nlist). */
int ir_attrs_equal(const ke_attrs *a, const ke_attrs *b);
/* Same dtype, rank, shape, strides, offset, device and wrapped flag. */
int ir_same_layout(const ir_value *a, const ir_value *b);
/* Every node input from value `from` (nodes after its definition) and every graph output
 * naming it now names `to`. */
void ir_replace_uses(ir_graph *g, int32_t from, int32_t to);
/* 1 if value id is a constant: a scalar node or a folded constant tensor (an IR_OP_CAPTURED
 * node with constant = 1, owned by the graph, never written). */
int ir_is_const(const ir_graph *g, int32_t id);

/* Records that graph input i shares its storage with the earlier input j (the caller passed
 * one tensor twice, or two views of one storage): input i and every value over its storage
 * take input j as their base, so passes treat writes through either as writes to both. */
void ir_alias_input(ir_graph *g, int32_t i, int32_t j);

/* Common-subexpression elimination: a pure node equal to an earlier one (op, attrs,
 * inputs, device, inplace = 0, no random draw, no effect) reuses the earlier outputs. */
int ir_pass_cse(ir_graph *g);
/* Constant folding: a pure node whose inputs are all constants runs once at compile time
 * through the dispatcher; 0-dim results become scalar nodes, others read-only constant
 * tensors (IR_OP_CAPTURED with constant = 1). */
int ir_pass_fold(ir_graph *g);
/* relu's gradient mask before max pooling's: threshold_backward(max_pool2d_backward(gp, r), r)
 * becomes max_pool2d_backward(threshold_backward(gp, p), r) where p = max_pool2d(r) is in the
 * graph (exact; the mask then runs over the pooled gradient). */
int ir_pass_pool_mask(ir_graph *g);
/* Algebraic simplification: x*1, x/1, x-0, x+0 (integers), neg(neg x), identity view
 * chains, view(view x) and expand(expand x) collapsed. */
int ir_pass_simplify(ir_graph *g);
/* Decomposition: a composite node (ke_ops[op].kind == KE_KIND_COMPOSITE with a decomp) is
 * replaced by the primitives of its decomposition, traced into a subgraph. The IR layer does
 * not call the trace layer: it uses ir_hook.subtrace (below). Without it the pass changes
 * nothing; it also changes nothing unless g->fuse (decomposing only helps fusion, and costs
 * bitwise equality with eager). */
int ir_pass_decompose(ir_graph *g);

/* ---- hooks: what the layers above ir install into it (src/init.c, once) ---------------- */
typedef struct ir_hooks {
    /* Traces node n's decomposition on meta stand-ins of its inputs and returns a graph with
     * n's inputs and outputs (NULL, with no error pending, where it cannot: a data-dependent
     * decomposition, ...). The trace layer's tr_subtrace. */
    ir_graph *(*subtrace)(const ir_graph *g, const ir_node *n);
} ir_hooks;
extern ir_hooks ir_hook;                 /* the hooks installed (NULL entries: none) */
void ir_install_hooks(const ir_hooks *h); /* called once by kl_init (decompose.c) */
/* Functionalization: in-place elementwise writes become pure ops, plus one copy_back per
 * written graph input or captured tensor at the end of the graph. */
int ir_pass_functionalize(ir_graph *g);

/* ---- memory planning (plan.c) ------------------------------------------------------------ */
/* Where intermediates live during a call. Every value a node defines that the graph does
 * not return is dropped right after its last use (drops, per node); kernel outputs that
 * nothing else can see (not returned, not viewed, not written in place, not written into an
 * input) get a slot: one buffer per slot is allocated per call and the values whose
 * lifetimes [defining node, last use] do not overlap share it. Slots are assigned by a
 * linear scan in execution order, best fit: the smallest free slot with enough bytes, else
 * the largest free one grown, else a new one. */
typedef struct ir_plan {
    int32_t nvalues, nnodes;       /* of the graph it was made for */
    int32_t nslots;
    int64_t *slot_bytes;           /* [nslots] */
    int32_t *slot_of;              /* [nvalues]: the value's slot, -1 if none */
    int32_t *last_use;             /* [nvalues]: node of the last use (-1: none, or kept) */
    int32_t *drop_start, *drops;   /* [nnodes + 1] CSR: values dropped after node k */
    int64_t value_bytes;           /* bytes of the values given slots */
    int64_t slot_total;            /* bytes of the slots */
} ir_plan;
/* The planning pass (last in the pipeline): replaces g->plan. Returns the number of slots or -1. */
int ir_pass_plan(ir_graph *g);
void ir_plan_free(ir_plan *p);
ir_plan *ir_plan_clone(const ir_plan *p);
/* The plan's text form (KL_DEBUG_DIR writes it as plan<N>.txt). */
int ir_plan_print(const ir_graph *g, FILE *f);

/* ---- checking and printing (verify.c, print.c) ---------------------------------------- */
/* Checks SSA order, value descriptions and node arities. 0, or -1 with
 * KL_ERR_INTERNAL naming the first problem (and `after`, the pass before it). */
int ir_verify(const ir_graph *g, const char *after);
/* The stable text form (golden tests): one line per input, node and output. */
int ir_print(const ir_graph *g, FILE *f);
/* The text form into a malloc'd string. */
char *ir_to_string(const ir_graph *g);
/* Any printer's output into a malloc'd string (NULL + an error). */
char *ir_print_to_string(int (*print)(const void *obj, FILE *f), const void *obj);
int ir_print_dot(const ir_graph *g, FILE *f);

#endif /* IR_IR_H */
