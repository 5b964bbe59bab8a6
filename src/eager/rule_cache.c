/*
 * rule_cache.c — the backend step's per-thread memo of resolved shape/dtype
 * rules (ke_infer_cached in dispatch.h).
 *
 * On a small op the rule (broadcasting, PyTorch's three promotion tiers, the
 * accept check, the loop check) was a fifth of the whole call. The shared
 * elementwise rules read nothing but their inputs' dtypes, wrapped-scalar
 * flags and shapes, the row and the default dtype, so the same signature gets
 * the same answer: each thread keeps the last answer per op (a small
 * direct-mapped table, no locks) and runs the rule only on a new signature.
 * Only successes are stored, so a bad call runs the rule, which records the
 * error, every time. Rules that read attributes (KE_DT_ATTR) or data (pow's
 * negative integer exponent) are never memoized.
 */
#include "kernels_ew.h"

#define RC_SLOTS 64   /* a power of two; indexed by op id */
#define RC_MAXIN 4
#define RC_MAXDIMS 16 /* all inputs' dims together */

typedef struct rc_entry {
    int32_t tag;                 /* op + 1; 0 = empty. Only memoizable ops are stored */
    uint8_t nin;
    uint8_t default_dtype;
    uint8_t compute;
    uint64_t sig;                /* per input 16 bits: dtype | 0x80 if wrapped, ndim << 8 */
    int64_t dims[RC_MAXDIMS];    /* the inputs' shapes, one after another */
    ke_outspec out;
} rc_entry;

static _Thread_local rc_entry tl_rules[RC_SLOTS];

/* The rules whose answer depends only on what the key holds. */
static int memoizable(const ke_op_info *op) {
    return (op->infer == ke_infer_ew_bcast || op->infer == ke_infer_ew_same || op->infer == ke_infer_broadcast ||
            op->infer == ke_infer_same) &&
           op->dtype_rule != KE_DT_ATTR && op->dtype_rule != KE_DT_CUSTOM;
}

static inline uint64_t sig_of(const kl_tensor *t, int i) {
    return (uint64_t)(t->dtype | ((t->flags & KE_TF_WRAPPED) ? 0x80u : 0u) | (unsigned)t->ndim << 8) << (16 * i);
}

/* The miss: runs the rule and remembers a success (kept out of line so the
 * hit path stays small). */
__attribute__((noinline)) static int infer_and_remember(ke_call *c, ke_outspec *out, rc_entry *e, uint8_t defdt) {
    const ke_op_info *op = &ke_ops[c->op];
    const int nin = c->nin;
    int r = op->infer(c, out);
    if (r != 1 || !memoizable(op) || nin > RC_MAXIN) return r;
    int nd = 0;
    for (int i = 0; i < nin; i++) nd += c->in[i]->ndim;
    if (nd > RC_MAXDIMS) return r;
    e->tag = c->op + 1;
    e->nin = (uint8_t)nin;
    e->default_dtype = defdt;
    e->compute = (uint8_t)c->compute;
    e->sig = 0;
    nd = 0;
    for (int i = 0; i < nin; i++) {
        const kl_tensor *t = c->in[i];
        e->sig |= sig_of(t, i);
        memcpy(&e->dims[nd], t->shape, sizeof(int64_t) * t->ndim);
        nd += t->ndim;
    }
    e->out = *out;
    return r;
}

int ke_infer_cached(ke_call *c, ke_outspec *out) {
    rc_entry *e = &tl_rules[c->op & (RC_SLOTS - 1)];
    const int nin = c->nin;
    uint8_t defdt = (uint8_t)kl_get_default_dtype();
    if (e->tag != c->op + 1 || e->nin != nin || e->default_dtype != defdt) goto miss;
    uint64_t sig = 0;
    for (int i = 0; i < nin; i++) sig |= sig_of(c->in[i], i);
    if (sig != e->sig) goto miss;
    const int64_t *k = e->dims;
    for (int i = 0; i < nin; i++) {
        const kl_tensor *t = c->in[i];
        for (int d = 0; d < t->ndim; d++)
            if (k[d] != t->shape[d]) goto miss;
        k += t->ndim;
    }
    *out = e->out;
    c->compute = (kl_dtype)e->compute;
    return 1;
miss:
    return infer_and_remember(c, out, e, defdt);
}
