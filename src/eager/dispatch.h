/*
 * dispatch.h — the op table and the dispatcher.
 *
 * Every op is one row of the table (optable.def and the family files it
 * includes). A public call such as kl_add(a, b) fills a ke_call (op id,
 * inputs, attributes) and hands it to ke_dispatch, which runs the handler of
 * the highest dispatch key present among the inputs (plus the thread's include
 * set, minus its exclude set): Trace > Autograd > CPU | CUDA | Meta. Handlers
 * for Trace and Autograd are their layers', installed by src/init.c through
 * ke_install_hooks (core.h); the backends run the
 * row's shape/dtype rule, allocate outputs and call the row's kernel.
 *
 * The same ke_call (op + attributes) is what the tracer records as an IR node,
 * so attributes are plain data: scalars, integers and one integer list. Each
 * op names its attributes in the attrs column of its row, which generates typed accessors
 * (ke_attr_softmax_dim(&c->a), ke_attr_set_softmax_dim(&c.a, dim)); code
 * reads and writes attributes only through them (attrs.h).
 */
#ifndef KE_DISPATCH_H
#define KE_DISPATCH_H

#include "core.h"

#include <stdio.h>

/* Op kinds: how the generic machinery treats an op. */
typedef enum ke_op_kind {
    KE_KIND_EW,        /* elementwise: broadcast inputs, one output of the broadcast shape */
    KE_KIND_REDUCE,    /* reduction over a dim list */
    KE_KIND_VIEW,      /* shares its input's storage; no kernel */
    KE_KIND_EXTERN,    /* library call (BLAS) */
    KE_KIND_COMPOSITE, /* defined by a decomposition into other ops (may have a fast kernel) */
    KE_KIND_CREATE,    /* no tensor inputs: creation and random ops */
    KE_KIND_OTHER      /* anything else with its own kernel (indexing, joining, nn) */
} ke_op_kind;

/* Output dtype rules (the dtype half of the table's shape/dtype rule). */
typedef enum ke_dtype_rule {
    KE_DT_PROMOTE,   /* PyTorch result_type of the inputs */
    KE_DT_FLOAT,     /* result_type, then integers/bool -> default float */
    KE_DT_BOOL,      /* bool output; inputs compared in their promoted type */
    KE_DT_I64,       /* int64 output (indices) */
    KE_DT_FIRST,     /* dtype of input 0 */
    KE_DT_ATTR,      /* dtype given by the dtype attribute */
    KE_DT_CUSTOM     /* the infer function sets it */
} ke_dtype_rule;

/* Which input dtypes an op accepts (checked before the rule runs). */
typedef enum ke_accept {
    KE_ACC_ALL,      /* every dtype */
    KE_ACC_NUM,      /* not bool */
    KE_ACC_INTBOOL,  /* integers and bool (bitwise ops) */
    KE_ACC_FLOAT,    /* floating only */
    KE_ACC_NOBOOL_SIGN /* not bool (neg, sign): PyTorch refuses bool */
} ke_accept;

enum ke_op_flags {
    KE_F_INPLACE = 1 << 0,   /* has an _inplace variant */
    KE_F_NONDIFF = 1 << 1,   /* not differentiable (outputs never require grad) */
    KE_F_IMPLICIT = 1 << 2,  /* composite that decomposes before autograd/trace */
    KE_F_RANDOM = 1 << 3,    /* consumes the generator (seed/offset in attrs) */
    KE_F_ANYCAST = 1 << 5,   /* in-place output may have any dtype (copy) */
    /* composite whose CPU kernel does in one or two passes what its decomposition's
     * kernels do in more: FUSE graphs keep the node whole on the CPU (a library call
     * the fusion pass fuses around) instead of decomposing it (src/ir/decompose.c) */
    KE_F_KEEP_CPU = 1 << 6,
};

#define KE_MAX_OUT 4
/* ke_attrs, its conventional slots, and the accessors ke_attr_<op>_<name>(a)
 * generated from the table (also compiled for the CUDA device). */
#include "attr_access.h"

typedef struct ke_outspec {
    kl_dtype dtype;
    int ndim;
    int64_t shape[KL_MAX_DIMS];
} ke_outspec;

typedef struct ke_call {
    int op;                     /* ke_op */
    uint8_t inplace;            /* write into in[0] (out[0] = in[0]) */
    int nin;
    kl_tensor *const *in;
    int nout;                   /* set by the dispatcher from the row or infer */
    kl_tensor *out[KE_MAX_OUT];
    kl_device device;           /* device of the computation (creation ops: target) */
    kl_dtype compute;           /* dtype kernels compute in (set by infer) */
    ke_attrs a;
} ke_call;

/* Shape and dtype rule: validates attributes and inputs (recording errors
 * that name the op, shapes, dtypes) and fills one spec per output.
 * Returns the number of outputs, or -1. */
typedef int (*ke_infer_fn)(ke_call *c, ke_outspec *out);
/* Eager kernel: outputs are allocated per the specs (or out[0] = in[0] for
 * in-place). Returns 0 or -1 with an error recorded. */
typedef int (*ke_kernel_fn)(ke_call *c);
/* View rule: makes c->out[] headers that share storage with the inputs. */
typedef int (*ke_view_fn)(ke_call *c);
/* Decomposition written with kl_ ops; sets c->out[], returns 0 or -1. */
typedef int (*ke_decomp_fn)(ke_call *c);

typedef struct ke_op_info {
    const char *name;           /* "add": messages say "kl_add" */
    uint8_t kind;               /* ke_op_kind */
    int8_t nin;                 /* tensor inputs; -1 variadic */
    int8_t nout;                /* outputs */
    uint16_t flags;             /* ke_op_flags */
    uint8_t dtype_rule;         /* ke_dtype_rule */
    uint8_t accept;             /* ke_accept */
    ke_infer_fn infer;          /* shape rule (+ dtype rule); views: NULL */
    ke_kernel_fn cpu;           /* eager CPU kernel, or NULL */
    ke_view_fn view;            /* views only */
    ke_decomp_fn decomp;        /* composite decomposition, or NULL */
    const void *impl;           /* kind-specific data for the generic kernel */
} ke_op_info;

typedef enum ke_op {
#define KE_OP(name, ...) KE_OP_##name,
#include "optable.def"
#undef KE_OP
    KE_OP_COUNT
} ke_op;

extern const ke_op_info ke_ops[KE_OP_COUNT];
/* The declared attributes of each op (n = 0: none), in declaration order. */
extern const ke_attr_set ke_op_attrs[KE_OP_COUNT];

/* Attributes as text (attr_text.c: the graph IR prints a node's attributes with it,
 * kl_op_call parses them): "dims=[1], keepdim=true", in declaration order, those at
 * their declared default left out, lead before the first. random: the op is a
 * KE_F_RANDOM one (its seed and offset print as slot=N when offset is KE_RANDOM_SLOT). */
void ke_attrs_print(FILE *f, const ke_attr_set *s, int random, const ke_attrs *a, const char *lead);
/* The same text, malloc'd (the caller frees it); NULL and KL_ERR_OOM. */
char *ke_attrs_to_string(const ke_attr_set *s, int random, const ke_attrs *a);
/* Parses text as ke_attrs_print writes it into *a (cleared first; each attribute
 * left out takes its declared default). 0; 1 for a random op whose seed and offset
 * are both left out (the caller reserves fresh counters); -1 and KL_ERR_ARG, the
 * message "kl_<who>: <op>: ..." naming the attribute and the text, for an unknown,
 * repeated or malformed attribute or a missing one without a default. */
int ke_attrs_parse(const ke_attr_set *s, int random, const char *text, ke_attrs *a, const char *who,
                   const char *op);

/* Handlers per dispatch key. Backends share one generic handler; Trace and
 * Autograd are their layers', installed through ke_hooks (core.h). */
typedef int (*ke_handler_fn)(ke_call *c);
/* Registers an eager kernel for op on a non-CPU backend (CUDA); a later
 * registration for the same op replaces an earlier one. */
void ke_register_kernel(ke_key backend, int op, ke_kernel_fn fn);
/* 1 if a kernel for op is registered on backend (the CUDA coverage test reads it). */
int ke_has_kernel(ke_key backend, int op);
/* Registers device.c's CUDA kernels (creation ops, clone, copy, bernoulli:
 * byte moves and host-staged fills through the registered ke_device_ops).
 * Called by the composition root before it registers the CUDA device. */
void ke_register_device_kernels(void);

/* Runs c through the dispatcher. Returns 0 (outputs in c->out, each new one
 * owned by the current scope) or -1 with an error recorded. */
int ke_dispatch(ke_call *c);
/* Runs c with the keys above `below` masked off (for handlers that redispatch). */
int ke_redispatch(ke_call *c, ke_key below);
/* Runs the backend part only (shape rule, allocation, kernel) on c->device. */
int ke_backend_run(ke_call *c);
/* The row's shape/dtype rule, answered from a per-thread memo when the rule
 * reads only the inputs' dtypes, wrapped flags and shapes (rule_cache.c). */
int ke_infer_cached(ke_call *c, ke_outspec *out);

/* Helpers for the public wrappers. */
kl_tensor *ke_call1(ke_call *c);           /* dispatch, return out[0] or NULL */
kl_tensor *ke_unary(int op, kl_tensor *x, int inplace);
kl_tensor *ke_binary(int op, kl_tensor *a, kl_tensor *b, int inplace);
kl_tensor *ke_binary_scalar(int op, kl_tensor *a, double s, int inplace);
/* The one result of a decomposition: out[0] = t; -1 if t is NULL (its error stands). */
static inline int ke_set_out1(ke_call *c, kl_tensor *t) {
    if (!t) return -1;
    c->out[0] = t;
    c->nout = 1;
    return 0;
}
/* A random op (KE_F_RANDOM) reserves fresh Philox counters for c into its
 * seed and offset attributes (create.c). Calls and replays of traces use it. */
int ke_random_reserve(ke_call *c);
/* Fills c->a.list/nlist from (n, dims); KL_ERR_ARG if too many. */
int ke_set_list(ke_call *c, int n, const int64_t *v);

static inline const char *ke_opname(const ke_call *c) { return ke_ops[c->op].name; }

/* Shared shape/dtype rules (shape.c). */
int ke_infer_same(ke_call *c, ke_outspec *out);        /* one input, same shape */
int ke_infer_broadcast(ke_call *c, ke_outspec *out);   /* n inputs broadcast */
int ke_infer_reduce(ke_call *c, ke_outspec *out);      /* attributes dims, keepdim */
/* dtype of the op's rule over its inputs, or -1 (error recorded). */
int ke_rule_dtype(ke_call *c, kl_dtype *out);
/* PyTorch's result_type over tensors (dimensioned > 0-dim > wrapped scalar). */
kl_dtype ke_result_type(int n, kl_tensor *const *ts);
/* Broadcast shapes of n tensors into shape; -1 with an error naming them. */
int ke_broadcast_shapes(const char *op, int n, kl_tensor *const *ts, int *ndim, int64_t *shape);
/* Strides of t viewed as broadcast to (ndim, shape): 0 on broadcast dims. */
void ke_broadcast_strides(const kl_tensor *t, int ndim, const int64_t *shape, int64_t *stride);
/* The reduction's dims (ke_attr_dims) as a mask (bit per dim); -1 on bad dim. */
int ke_reduce_mask(ke_call *c, int ndim, uint32_t *mask);

#endif /* KE_DISPATCH_H */
