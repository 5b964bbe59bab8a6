/*
 * cg_emit.c — kernel IR to one LLVM function (cg.h's cg_entry).
 *
 * The math is not written here: an OP statement stores its operands
 * (converted to the op's compute dtype by dtype.c's conversion for that
 * pair) in stack slots and calls the op's eager loop for that dtype with
 * n = 1, exactly what the interpreter does a chunk at a time. The functions
 * come from the eager bitcode (cg_bc_extract copies them into the kernel's
 * module), are found through the impl tables' initializers at compile time
 * (so the call is direct), and inline into the element loop, where SROA
 * turns the slots into registers and the loop vectorizer widens the scalar
 * formula. So compiled elementwise math is the eager formula.
 *
 * A REDUCE folds its row the way interp does. Sum, mean, prod, amax and amin
 * of f32/f64 compute their operand and fold it in one pass, in registers
 * (emit_fused_fold: row_fold.h's fold, bitwise the eager one); the operand
 * goes to a scratch row only when a later statement reads it. Other
 * reductions write the operand of the whole row to a scratch row, then the
 * reduction's own eager row fold and fin run on it. Row kernels recompute
 * the element statements each loop needs (loads are hits in cache: the row
 * is small), and a last loop does the stores.
 */
#include "cg.h"

#include "ew.h"
#include "kernels_reduce.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RD_NFNS = 5 }; /* a reduction's functions: init, row, fin, push, drain */
struct roots;

typedef struct em {
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b, ab; /* body builder; alloca builder (entry block) */
    const ir_kernel *k;
    const cg_plan *p;
    LLVMValueRef fn, base[CG_MAX_BUFS + 1], ret_slot;
    LLVMBasicBlockRef entry, exit;
    LLVMTypeRef i8, i16, i32, i64, f32, f64, ptr, vd;
    LLVMTypeRef loop_ty, conv_ty, init_ty, row_ty, fin_ty, casc_ty;
    /* per statement */
    LLVMValueRef *val;   /* element value in the current loop body, or row value */
    uint8_t *have;       /* val[s] valid (element values: for the current body only) */
    uint8_t *lvl;        /* where s is computed: 0 once per call, 1 once per row, 2 per element */
    LLVMValueRef *saved; /* element values a REDUCE left in its scratch row (same dtype), or NULL */
    LLVMValueRef cur_j;  /* position in the row of the current element loop */
    int nreduce;
    LLVMValueRef *loopf; /* OP: loop function; REDUCE: unused */
    LLVMValueRef *attrs; /* OP / REDUCE: constant ke_attrs */
    LLVMValueRef off[CG_MAX_BUFS]; /* element offsets in the current body */
    LLVMValueRef row_off[CG_MAX_BUFS];
    LLVMValueRef conv[KL_NUM_DTYPES][KL_NUM_DTYPES]; /* in the master module, then in m */
    /* memory accesses of the element loop being built (cg_mark_parallel) */
    int in_loop, nacc, acc_overflow;
    LLVMValueRef acc[512];
    /* found by collect(), in the master module until prepare() maps them */
    LLVMValueRef (*rdm)[2][RD_NFNS]; /* per REDUCE: the reduction's functions, main and first pass */
    int (*rdvdt)[2];                 /* per REDUCE: dtypes of their values */
    struct roots *roots;             /* every function the kernel calls */
} em;

static void track(em *e, LLVMValueRef inst) {
    if (!e->in_loop) return;
    if (e->nacc < (int)(sizeof e->acc / sizeof e->acc[0])) e->acc[e->nacc++] = inst;
    else e->acc_overflow = 1;
}

/* Names instruction v as fmt says, unless it has a name already (constants
 * have none): values after their kernel IR statements (v12, v4.sum, in0.addr),
 * so KL_DEBUG_DIR's .ll files read like the kernel IR printed beside them. */
static LLVMValueRef vnamed(int force, LLVMValueRef v, const char *fmt, va_list ap) {
    if (!v || !LLVMIsAInstruction(v)) return v;
    size_t len;
    LLVMGetValueName2(v, &len);
    if (len && !force) return v;
    char buf[64];
    vsnprintf(buf, sizeof buf, fmt, ap);
    LLVMSetValueName2(v, buf, strlen(buf));
    return v;
}
static LLVMValueRef named(LLVMValueRef v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vnamed(0, v, fmt, ap);
    va_end(ap);
    return v;
}
/* The same, renaming a value named before (a fold's last step is its result). */
static LLVMValueRef renamed(LLVMValueRef v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vnamed(1, v, fmt, ap);
    va_end(ap);
    return v;
}

/* ---- constants of the eager bitcode ----------------------------------------------- */

/* The constant at byte offset off inside initializer c (through structs and
 * arrays; clang emits partly zero arrays as structs), or NULL for zero. */
static LLVMValueRef const_at(LLVMValueRef c, uint64_t off) {
    LLVMTargetDataRef td = cg_master_layout();
    for (;;) {
        if (!c || LLVMIsNull(c)) return NULL;
        LLVMTypeRef t = LLVMTypeOf(c);
        LLVMTypeKind kind = LLVMGetTypeKind(t);
        if (kind == LLVMStructTypeKind) {
            unsigned n = LLVMCountStructElementTypes(t), i;
            for (i = 0; i + 1 < n && LLVMOffsetOfElement(td, t, i + 1) <= off; i++) {
            }
            off -= LLVMOffsetOfElement(td, t, i);
            c = LLVMGetAggregateElement(c, i);
        } else if (kind == LLVMArrayTypeKind) {
            uint64_t es = LLVMABISizeOfType(td, LLVMGetElementType(t));
            c = LLVMGetAggregateElement(c, (unsigned)(off / es));
            off %= es;
        } else {
            return off == 0 ? c : NULL;
        }
    }
}

static LLVMValueRef global_init(LLVMValueRef g) {
    return g && LLVMIsAGlobalVariable(g) ? LLVMGetInitializer(g) : NULL;
}

static LLVMValueRef fn_at(LLVMValueRef init, uint64_t off) {
    LLVMValueRef f = const_at(init, off);
    return f && LLVMIsAFunction(f) ? f : NULL;
}

/* ---- helpers ----------------------------------------------------------------------- */

static LLVMTypeRef ty(em *e, int dt) {
    switch (dt) {
    case KL_F32: return e->f32;
    case KL_F64: return e->f64;
    case KL_F16:
    case KL_BF16: return e->i16;
    case KL_I32: return e->i32;
    case KL_I64: return e->i64;
    default: return e->i8;
    }
}

static LLVMValueRef ci64(em *e, int64_t v) { return LLVMConstInt(e->i64, (unsigned long long)v, 1); }
static LLVMValueRef ci32(em *e, int64_t v) { return LLVMConstInt(e->i32, (unsigned long long)v, 1); }

static LLVMValueRef slot(em *e, unsigned bytes) {
    LLVMValueRef a = LLVMBuildAlloca(e->ab, LLVMArrayType(e->i8, bytes), "");
    LLVMSetAlignment(a, 16);
    return a;
}

static LLVMValueRef fn_in_m(em *e, LLVMValueRef master_fn) {
    size_t len;
    const char *name = LLVMGetValueName2(master_fn, &len);
    return LLVMGetNamedFunction(e->m, name);
}

static LLVMValueRef call(em *e, LLVMTypeRef t, LLVMValueRef f, LLVMValueRef *args, unsigned n) {
    return LLVMBuildCall2(e->b, t, f, args, n, "");
}

/* Converts value v of dtype from to dtype to through dtype.c's routine. */
static LLVMValueRef convert(em *e, LLVMValueRef v, int from, int to) {
    if (from == to) return v;
    LLVMValueRef s = slot(e, 8), d = slot(e, 8);
    LLVMBuildStore(e->b, v, s);
    LLVMValueRef args[] = {d, ci64(e, 1), s, ci64(e, 1), ci64(e, 1)};
    call(e, e->conv_ty, e->conv[from][to], args, 5);
    return LLVMBuildLoad2(e->b, ty(e, to), d, "");
}

/* for (iv = lo; iv < hi; iv++): opens the body; loop_end closes it. */
typedef struct loopctx {
    LLVMBasicBlockRef pre, body, exit;
    LLVMValueRef iv, hi;
    int parallel; /* an element loop: annotated parallel */
} loopctx;

/* nm names the loop's blocks (nm, nm.end) and induction variable (nm.i). */
static void loop_begin(em *e, loopctx *L, LLVMValueRef lo, LLVMValueRef hi, int parallel, const char *nm) {
    char buf[64];
    L->parallel = parallel;
    if (parallel) e->in_loop = 1, e->nacc = 0, e->acc_overflow = 0;
    L->pre = LLVMGetInsertBlock(e->b);
    L->body = LLVMAppendBasicBlockInContext(e->c, e->fn, nm);
    snprintf(buf, sizeof buf, "%s.end", nm);
    L->exit = LLVMAppendBasicBlockInContext(e->c, e->fn, buf);
    L->hi = hi;
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, lo, hi, ""), L->body, L->exit);
    LLVMPositionBuilderAtEnd(e->b, L->body);
    snprintf(buf, sizeof buf, "%s.i", nm);
    L->iv = LLVMBuildPhi(e->b, e->i64, buf);
    LLVMAddIncoming(L->iv, &lo, &L->pre, 1);
}

static void loop_end(em *e, loopctx *L) {
    LLVMValueRef next = LLVMBuildAdd(e->b, L->iv, ci64(e, 1), "next");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
    LLVMAddIncoming(L->iv, &next, &latch, 1);
    LLVMValueRef br = LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, next, L->hi, ""), L->body, L->exit);
    if (L->parallel) {
        if (!e->acc_overflow) cg_mark_parallel(br, e->acc, e->nacc);
        e->in_loop = 0;
    }
    LLVMPositionBuilderAtEnd(e->b, L->exit);
}

/* Buffer b's name in the kernel IR printer's words: in0.., out0.., scratch. */
static const char *bufname(em *e, int b, char *buf, size_t n) {
    if (b >= e->p->nb) snprintf(buf, n, "scratch");
    else if (b < e->k->ninputs) snprintf(buf, n, "in%d", b);
    else snprintf(buf, n, "out%d", b - e->k->ninputs);
    return buf;
}

/* Element offsets of every buffer at position j of the current row. */
static void set_offsets(em *e, LLVMValueRef j) {
    const cg_plan *p = e->p;
    e->cur_j = j;
    char nm[16];
    for (int b = 0; b < p->nb; b++) {
        LLVMValueRef o = LLVMBuildMul(e->b, j, ci64(e, p->stride[b][p->nd - 1]), "");
        e->off[b] = named(e->row_off[b] ? LLVMBuildAdd(e->b, e->row_off[b], o, "") : o, "%s.off",
                          bufname(e, b, nm, sizeof nm));
    }
}

/* Row offsets of row r (all dims but the last). */
static void set_row_offsets(em *e, LLVMValueRef r) {
    const cg_plan *p = e->p;
    for (int b = 0; b < p->nb; b++) e->row_off[b] = ci64(e, 0);
    LLVMValueRef rem = r;
    for (int d = p->nd - 2; d >= 0; d--) {
        LLVMValueRef idx = d > 0 ? LLVMBuildSRem(e->b, rem, ci64(e, p->shape[d]), "") : rem;
        for (int b = 0; b < p->nb; b++)
            if (p->stride[b][d])
                e->row_off[b] =
                    LLVMBuildAdd(e->b, e->row_off[b], LLVMBuildMul(e->b, idx, ci64(e, p->stride[b][d]), ""), "");
        if (d > 0) rem = LLVMBuildSDiv(e->b, rem, ci64(e, p->shape[d]), "");
    }
    char nm[16];
    for (int b = 0; b < p->nb; b++) named(e->row_off[b], "%s.row", bufname(e, b, nm, sizeof nm));
}

static void forget_level(em *e, int level) {
    for (int s = 0; s < e->k->nstmts; s++)
        if (e->lvl[s] == level) e->have[s] = 0;
}
static void forget_elements(em *e) { forget_level(e, 2); }

/* Hoisting by hand what LICM cannot (an output might alias a broadcast
 * input, so the loads stay in the loop) and what would narrow the vectors
 * (an int64 scalar operand in the loop halves the vectorization factor):
 * loads that are the same for the whole call (stride 0 over the coalesced
 * domain) or the whole row (stride 0 along the last dim), and ops of only
 * such values, are computed once per call or per row. Not for rows of
 * length 0, where they would run without any element (an integer division
 * by zero must not be raised there). */
static void classify(em *e) {
    const ir_kernel *k = e->k;
    const cg_plan *p = e->p;
    int hoist = p->shape[p->nd - 1] > 0;
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        int l = 2;
        if (st->row || st->kind == IR_K_REDUCE) l = 1;
        else if (st->kind == IR_K_LOAD && hoist) {
            int all0 = 1;
            for (int d = 0; d < p->nd; d++) all0 &= p->stride[st->buf][d] == 0;
            l = all0 ? 0 : (!p->flat && p->stride[st->buf][p->nd - 1] == 0) ? 1 : 2;
        } else if (st->kind == IR_K_OP && hoist) {
            l = 0;
            for (int i = 0; i < st->nargs; i++) l = e->lvl[st->args[i]] > l ? e->lvl[st->args[i]] : l;
        } else if (st->kind == IR_K_STORE) l = 3;
        e->lvl[s] = (uint8_t)l;
    }
}

/* ---- statements ------------------------------------------------------------------- */

static LLVMValueRef value(em *e, int s);


static LLVMValueRef emit_op(em *e, int s) {
    const ir_kstmt *st = &e->k->stmts[s];
    const ke_ew_impl *impl = ke_ops[st->op].impl;
    LLVMValueRef inarr = named(LLVMBuildAlloca(e->ab, LLVMArrayType(e->ptr, 4), ""), "v%d.args", s);
    for (int i = 0; i < st->nargs; i++) {
        const ir_kstmt *a = &e->k->stmts[st->args[i]];
        int want = (impl->bool_in >> i) & 1 ? KL_BOOL : st->compute;
        LLVMValueRef v = convert(e, value(e, st->args[i]), a->dtype, want);
        LLVMValueRef sl = named(slot(e, 8), "v%d.arg%d", s, i);
        LLVMBuildStore(e->b, v, sl);
        LLVMValueRef idx[] = {ci64(e, 0), ci64(e, i)};
        LLVMBuildStore(e->b, sl, LLVMBuildGEP2(e->b, LLVMArrayType(e->ptr, 4), inarr, idx, 2, ""));
    }
    LLVMValueRef res = named(slot(e, 8), "v%d.res", s), err = named(LLVMBuildAlloca(e->ab, e->i32, ""), "v%d.err", s);
    LLVMBuildStore(e->b, ci32(e, 0), err);
    LLVMValueRef args[] = {ci64(e, 1), res, inarr, ci32(e, st->bcast), e->attrs[s], err};
    call(e, e->loop_ty, e->loopf[s], args, 6);
    /* integer division by zero: leave with (op << 32 | err); folds away for
     * loops that never set err */
    LLVMValueRef ev = LLVMBuildLoad2(e->b, e->i32, err, "");
    LLVMBasicBlockRef bad = LLVMAppendBasicBlockInContext(e->c, e->fn, "err"),
                      ok = LLVMAppendBasicBlockInContext(e->c, e->fn, "ok");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntNE, ev, ci32(e, 0), ""), bad, ok);
    LLVMPositionBuilderAtEnd(e->b, bad);
    LLVMValueRef code = LLVMBuildOr(e->b, LLVMBuildZExt(e->b, ev, e->i64, ""), ci64(e, (int64_t)st->op << 32), "");
    LLVMBuildStore(e->b, code, e->ret_slot);
    LLVMBuildBr(e->b, e->exit);
    LLVMPositionBuilderAtEnd(e->b, ok);
    int rdt = impl->out_bool ? KL_BOOL : st->compute;
    return convert(e, LLVMBuildLoad2(e->b, ty(e, rdt), res, ""), rdt, st->dtype);
}

static LLVMValueRef emit_load(em *e, int s, LLVMValueRef off) {
    const ir_kstmt *st = &e->k->stmts[s];
    LLVMTypeRef t = ty(e, st->dtype);
    char nm[16];
    LLVMValueRef p = named(LLVMBuildGEP2(e->b, t, e->base[st->buf], &off, 1, ""), "%s.addr",
                           bufname(e, st->buf, nm, sizeof nm));
    LLVMValueRef v = LLVMBuildLoad2(e->b, t, p, "");
    LLVMSetAlignment(v, (unsigned)ke_dtypes[st->dtype].size);
    track(e, v);
    return v;
}

/* Value of statement s in the current loop body (or the row's value). */
static LLVMValueRef value(em *e, int s) {
    if (e->have[s]) return e->val[s];
    const ir_kstmt *st = &e->k->stmts[s];
    LLVMValueRef v = NULL;
    if (e->saved[s] && e->lvl[s] == 2) { /* computed by an earlier loop of this row: reload */
        LLVMTypeRef t = ty(e, st->dtype);
        v = LLVMBuildLoad2(e->b, t, LLVMBuildGEP2(e->b, t, e->saved[s], &e->cur_j, 1, ""), "");
        track(e, v);
    } else if (st->kind == IR_K_LOAD)
        v = emit_load(e, s, e->lvl[s] == 0 ? ci64(e, 0) : e->lvl[s] == 1 ? e->row_off[st->buf] : e->off[st->buf]);
    else if (st->kind == IR_K_OP) v = emit_op(e, s);
    e->val[s] = named(v, "v%d", s);
    e->have[s] = 1;
    return v;
}

static void emit_store(em *e, int s, LLVMValueRef off) {
    const ir_kstmt *st = &e->k->stmts[s];
    LLVMValueRef v = value(e, st->args[0]);
    LLVMTypeRef t = ty(e, st->dtype);
    char nm[16];
    LLVMValueRef p = named(LLVMBuildGEP2(e->b, t, e->base[st->buf], &off, 1, ""), "%s.addr",
                           bufname(e, st->buf, nm, sizeof nm));
    LLVMValueRef in = LLVMBuildStore(e->b, v, p);
    LLVMSetAlignment(in, (unsigned)ke_dtypes[st->dtype].size);
    track(e, in);
}

/* One reduction's functions in the kernel module. */
typedef struct rdfns {
    LLVMValueRef init, row, fin, push, drain;
    int vdt;
} rdfns;

static LLVMValueRef master_rd_kernel(int op, int compute, const ke_rd_op **host) {
    const char *sym = cg_impl_symbol(op);
    *host = ke_ops[op].impl;
    LLVMValueRef g = sym ? LLVMGetNamedGlobal(cg_master(), sym) : NULL;
    LLVMValueRef kern = const_at(global_init(g), offsetof(ke_rd_op, k) + (uint64_t)compute * sizeof(void *));
    return kern && LLVMIsAGlobalVariable(kern) ? kern : NULL;
}

static LLVMValueRef master_rd_pre(int op, int compute) {
    const char *sym = cg_impl_symbol(op);
    LLVMValueRef g = sym ? LLVMGetNamedGlobal(cg_master(), sym) : NULL;
    LLVMValueRef pre = const_at(global_init(g), offsetof(ke_rd_op, pre));
    if (!pre || !LLVMIsAGlobalVariable(pre)) return NULL;
    LLVMValueRef kern = const_at(global_init(pre), offsetof(ke_rd_op, k) + (uint64_t)compute * sizeof(void *));
    return kern && LLVMIsAGlobalVariable(kern) ? kern : NULL;
}

static int rd_master_fns(LLVMValueRef kern, LLVMValueRef f[RD_NFNS]) {
    LLVMValueRef init = global_init(kern);
    f[0] = fn_at(init, offsetof(ke_rd_kernel, init));
    f[1] = fn_at(init, offsetof(ke_rd_kernel, row));
    f[2] = fn_at(init, offsetof(ke_rd_kernel, fin));
    f[3] = fn_at(init, offsetof(ke_rd_kernel, push));
    f[4] = fn_at(init, offsetof(ke_rd_kernel, drain));
    return f[0] && f[1] && f[2] && f[3] && f[4] ? 0 : -1;
}

static void rd_call(em *e, const rdfns *f, LLVMValueRef acc, LLVMValueRef out, LLVMValueRef pos, LLVMValueRef aux,
                    LLVMValueRef scratch, int64_t n, LLVMValueRef attrs) {
    LLVMValueRef a1[] = {acc, ci64(e, 1)};
    call(e, e->init_ty, f->init, a1, 2);
    LLVMValueRef a2[] = {acc, scratch, ci64(e, n), ci64(e, 0), aux, attrs};
    call(e, e->row_ty, f->row, a2, 6);
    LLVMValueRef a3[] = {out, pos, acc, ci64(e, 1), ci64(e, n), aux, attrs};
    call(e, e->fin_ty, f->fin, a3, 7);
}

/* ---- lane folds -------------------------------------------------------------------
 * sum, mean, prod, amax and amin of f32/f64 rows, written here with a vector
 * accumulator: clang turns the eager max/min lane step into a select of
 * pointers the vectorizer cannot widen (GCC vectorizes it), which left
 * softmax's amax scalar. The IR is the row fold of row_fold.h, step for step
 * as tmpl/row_fold.h writes it in C (KE_FOLD_* are its constants; the cascade
 * of long rows is the template's own, called from the bitcode): bitwise the
 * eager row fold (and the interpreter's); tests/test_codegen.c's
 * row_fold_bitwise checks it on awkward lengths and NaN / inf rows. */
enum { FOLD_NONE, FOLD_SUM, FOLD_MEAN, FOLD_PROD, FOLD_AMAX, FOLD_AMIN };

static int fold_kind(const ir_kstmt *st) {
    if (st->compute != KL_F32 && st->compute != KL_F64) return FOLD_NONE;
    switch (st->op) {
    case KE_OP_sum: return FOLD_SUM;
    case KE_OP_mean: return FOLD_MEAN;
    case KE_OP_prod: return FOLD_PROD;
    case KE_OP_amax: return FOLD_AMAX;
    case KE_OP_amin: return FOLD_AMIN;
    default: return FOLD_NONE;
    }
}

/* STEP(a, x) (MERGE is the same formula for these ops), scalars or vectors */
static LLVMValueRef fold_step(em *e, int kind, LLVMValueRef a, LLVMValueRef x) {
    switch (kind) {
    case FOLD_SUM:
    case FOLD_MEAN: return LLVMBuildFAdd(e->b, a, x, "");
    case FOLD_PROD: return LLVMBuildFMul(e->b, a, x, "");
    default: { /* (x > a || isnan(x)) ? x : a, and < for amin */
        LLVMValueRef better = LLVMBuildFCmp(e->b, kind == FOLD_AMAX ? LLVMRealOGT : LLVMRealOLT, x, a, "");
        LLVMValueRef nan = LLVMBuildFCmp(e->b, LLVMRealUNO, x, x, "");
        return LLVMBuildSelect(e->b, LLVMBuildOr(e->b, better, nan, ""), x, a, "");
    }
    }
}

static LLVMValueRef fold_init(em *e, int kind, LLVMTypeRef t) {
    switch (kind) {
    case FOLD_PROD: return LLVMConstReal(t, 1.0);
    case FOLD_AMAX: return LLVMConstReal(t, -1.0 / 0.0);
    case FOLD_AMIN: return LLVMConstReal(t, 1.0 / 0.0);
    default: return LLVMConstReal(t, 0.0);
    }
}

static LLVMValueRef lanes_mask(em *e, unsigned from, unsigned n) {
    LLVMValueRef idx[64];
    for (unsigned i = 0; i < n; i++) idx[i] = ci32(e, from + i);
    return LLVMConstVector(idx, n);
}

/* MERGE of the L lanes held as K vectors of W (lane j of vector k is
 * l[k * W + j]), as the halving tree l[j] = MERGE(l[j], l[j + w]) for
 * w = L/2 .. 1: whole vectors while w >= W, then shufflevectors. Returns
 * lane 0. */
enum { FOLD_K = 8 };
static LLVMValueRef fold_tree(em *e, int kind, LLVMValueRef *v, unsigned W) {
    for (int k = FOLD_K / 2; k > 0; k /= 2)
        for (int q = 0; q < k; q++) v[q] = fold_step(e, kind, v[q], v[q + k]);
    LLVMValueRef x = v[0];
    for (unsigned w = W / 2; w > 0; w /= 2) {
        LLVMValueRef lo = LLVMBuildShuffleVector(e->b, x, LLVMGetUndef(LLVMTypeOf(x)), lanes_mask(e, 0, w), "");
        LLVMValueRef hi = LLVMBuildShuffleVector(e->b, x, LLVMGetUndef(LLVMTypeOf(x)), lanes_mask(e, w, w), "");
        x = fold_step(e, kind, lo, hi);
    }
    return LLVMBuildExtractElement(e->b, x, ci32(e, 0), "");
}

/* a = STEP(a, src[i]) for i in [from, n), in order (the tail of a row). */
static LLVMValueRef fold_tail(em *e, int s, int kind, LLVMTypeRef t, LLVMValueRef a, LLVMValueRef src, int64_t from,
                              int64_t n) {
    char nm[32];
    snprintf(nm, sizeof nm, "v%d.tail", s);
    if (n - from <= 8) { /* short tails unrolled */
        for (int64_t i = from; i < n; i++) {
            LLVMValueRef idx = ci64(e, i);
            LLVMValueRef x = LLVMBuildLoad2(e->b, t, LLVMBuildGEP2(e->b, t, src, &idx, 1, ""), "");
            a = fold_step(e, kind, a, x);
        }
        return a;
    }
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
    LLVMValueRef a0 = a;
    loopctx T;
    loop_begin(e, &T, ci64(e, from), ci64(e, n), 0, nm);
    LLVMValueRef acc = LLVMBuildPhi(e->b, t, nm);
    LLVMAddIncoming(acc, &a0, &pre, 1);
    LLVMValueRef x = LLVMBuildLoad2(e->b, t, LLVMBuildGEP2(e->b, t, src, &T.iv, 1, ""), "");
    LLVMValueRef next = fold_step(e, kind, acc, x);
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
    LLVMAddIncoming(acc, &next, &latch, 1);
    loop_end(e, &T);
    a = LLVMBuildPhi(e->b, t, nm);
    LLVMAddIncoming(a, &next, &latch, 1);
    LLVMAddIncoming(a, &a0, &T.pre, 1);
    return a;
}

/* Is element value v used by a statement after s (read by a later loop of
 * the row)? */
static int used_after(em *e, int s, int v) {
    for (int t = s + 1; t < e->k->nstmts; t++) {
        const ir_kstmt *st = &e->k->stmts[t];
        for (int i = 0; i < st->nargs; i++)
            if (st->args[i] == v) return 1;
    }
    return 0;
}

/* Element i of the REDUCE's operand, converted to the compute dtype, in the
 * current (element) loop body. */
static LLVMValueRef reduce_operand(em *e, int s, LLVMValueRef i) {
    const ir_kstmt *st = &e->k->stmts[s];
    forget_elements(e);
    set_offsets(e, i);
    return convert(e, value(e, st->args[0]), e->k->stmts[st->args[0]].dtype, st->compute);
}

/* One chunk of REDUCE s's row (row_fold.h), elements [base, base + len),
 * the operand computed and folded in the same pass:
 *
 *   for each block b of L elements:            (lanes: L accumulators)
 *     for l in [0, L): lanes[l] = STEP(lanes[l], operand(base + b * L + l))
 *
 * The inner loop is an element loop like any other (annotated parallel:
 * iteration l touches only lanes[l] and its own element), so the vectorizer
 * widens the operand's math and the steps, unrolls the L iterations away and
 * LICM keeps the lanes in registers across blocks. Then the tree merge into
 * acc, and the tail (computed by a vectorizable loop into scratch, folded
 * element by element; only a chunk at a constant base, base_c, has one).
 * Lane l sees the elements l, l + L, l + 2L... in order: tmpl/row_fold.h's
 * lanes(), so bitwise the eager fold. The operand goes to the scratch row
 * only when a later statement reads it (save: softmax's exp); a load operand
 * (mean of x) is folded straight from its buffer. */
static LLVMValueRef emit_lane_fold(em *e, int s, int kind, LLVMValueRef scratch, LLVMValueRef acc, LLVMValueRef base,
                                   int64_t base_c, int64_t len, int save) {
    int dt = e->k->stmts[s].compute;
    LLVMTypeRef t = ty(e, dt);
    unsigned L = (unsigned)KE_FOLD_BYTES / (unsigned)ke_dtypes[dt].size, W = L / FOLD_K;
    int64_t blocks = len / (int64_t)L;
    if (blocks > 0) {
        LLVMTypeRef vt = LLVMVectorType(t, W);
        LLVMValueRef init[64];
        for (unsigned i = 0; i < W; i++) init[i] = fold_init(e, kind, t);
        LLVMValueRef v0 = LLVMConstVector(init, W), v[FOLD_K];
        char nm[32];
        LLVMValueRef lanes = named(LLVMBuildAlloca(e->ab, LLVMArrayType(t, L), ""), "v%d.lanes", s);
        LLVMSetAlignment(lanes, 64);
        for (int q = 0; q < FOLD_K; q++) {
            LLVMValueRef off = ci64(e, (int64_t)q * W);
            LLVMSetAlignment(LLVMBuildStore(e->b, v0, LLVMBuildGEP2(e->b, t, lanes, &off, 1, "")), 32);
        }
        loopctx B, I;
        snprintf(nm, sizeof nm, "v%d.block", s);
        loop_begin(e, &B, ci64(e, 0), ci64(e, blocks), 0, nm);
        LLVMValueRef first = LLVMBuildAdd(e->b, base, LLVMBuildMul(e->b, B.iv, ci64(e, L), ""), "");
        snprintf(nm, sizeof nm, "v%d.lane", s);
        loop_begin(e, &I, ci64(e, 0), ci64(e, L), 1, nm);
        LLVMValueRef j = LLVMBuildAdd(e->b, first, I.iv, "");
        LLVMValueRef x = reduce_operand(e, s, j);
        if (save) track(e, LLVMBuildStore(e->b, x, LLVMBuildGEP2(e->b, t, scratch, &j, 1, "")));
        LLVMValueRef lp = LLVMBuildGEP2(e->b, t, lanes, &I.iv, 1, "");
        LLVMValueRef old = LLVMBuildLoad2(e->b, t, lp, "");
        track(e, old);
        track(e, LLVMBuildStore(e->b, fold_step(e, kind, old, x), lp));
        loop_end(e, &I);
        forget_elements(e);
        loop_end(e, &B);
        for (int q = 0; q < FOLD_K; q++) {
            LLVMValueRef off = ci64(e, (int64_t)q * W);
            v[q] = LLVMBuildLoad2(e->b, vt, LLVMBuildGEP2(e->b, t, lanes, &off, 1, ""), "");
            LLVMSetAlignment(v[q], 32);
        }
        acc = named(fold_step(e, kind, acc, named(fold_tree(e, kind, v, W), "v%d.tree", s)), "v%d.lanesum", s);
    }
    if (blocks * (int64_t)L < len) { /* the tail: operand into scratch (vectorized), folded in order */
        int64_t from = base_c + blocks * (int64_t)L, to = base_c + len;
        char nm[32];
        snprintf(nm, sizeof nm, "v%d.operand", s);
        loopctx T;
        loop_begin(e, &T, ci64(e, from), ci64(e, to), 1, nm);
        LLVMValueRef x = reduce_operand(e, s, T.iv);
        track(e, LLVMBuildStore(e->b, x, LLVMBuildGEP2(e->b, t, scratch, &T.iv, 1, "")));
        loop_end(e, &T);
        forget_elements(e);
        acc = fold_tail(e, s, kind, t, acc, scratch, from, to);
    }
    return acc;
}

/* REDUCE s (sum, mean, prod, amax, amin of f32/f64) over the current row of
 * n elements, folded as row_fold.h says: a row of at most KE_FOLD_CHUNK
 * elements is one chunk; a longer one folds chunk by chunk (a loop over the
 * whole chunks, then the last, shorter one), each chunk's value joining the
 * cascade through the reduction's own push / drain from the eager bitcode
 * (tmpl/fold_cascade.h: the cascade is not written twice). */
static LLVMValueRef emit_fused_fold(em *e, int s, int kind, const rdfns *f, LLVMValueRef scratch, int64_t n) {
    const ir_kstmt *st = &e->k->stmts[s];
    const ir_kstmt *a = &e->k->stmts[st->args[0]];
    int dt = st->compute;
    LLVMTypeRef t = ty(e, dt);
    int save = a->dtype == dt && !a->row && a->kind == IR_K_OP && e->lvl[st->args[0]] == 2 &&
               used_after(e, s, st->args[0]);
    LLVMValueRef acc;
    if (n <= KE_FOLD_CHUNK) {
        acc = emit_lane_fold(e, s, kind, scratch, fold_init(e, kind, t), ci64(e, 0), 0, n, save);
    } else {
        char nm[32];
        LLVMValueRef casc = named(LLVMBuildAlloca(e->ab, LLVMArrayType(e->i8, sizeof(ke_fold_casc)), ""), "v%d.casc", s);
        LLVMSetAlignment(casc, 16);
        LLVMBuildMemSet(e->b, casc, LLVMConstInt(e->i8, 0, 0), ci64(e, sizeof(ke_fold_casc)), 16);
        LLVMValueRef part = named(LLVMBuildAlloca(e->ab, t, ""), "v%d.part", s);
        int64_t whole = n / KE_FOLD_CHUNK, rest = n % KE_FOLD_CHUNK;
        loopctx C;
        snprintf(nm, sizeof nm, "v%d.chunk", s);
        loop_begin(e, &C, ci64(e, 0), ci64(e, whole), 0, nm);
        LLVMValueRef base = LLVMBuildMul(e->b, C.iv, ci64(e, KE_FOLD_CHUNK), "");
        LLVMBuildStore(e->b, emit_lane_fold(e, s, kind, scratch, fold_init(e, kind, t), base, -1, KE_FOLD_CHUNK, save),
                       part);
        LLVMValueRef pa[] = {casc, part};
        call(e, e->casc_ty, f->push, pa, 2);
        loop_end(e, &C);
        if (rest) {
            int64_t b0 = whole * KE_FOLD_CHUNK;
            LLVMBuildStore(e->b, emit_lane_fold(e, s, kind, scratch, fold_init(e, kind, t), ci64(e, b0), b0, rest, save),
                           part);
            call(e, e->casc_ty, f->push, pa, 2);
        }
        LLVMBuildStore(e->b, fold_init(e, kind, t), part);
        LLVMValueRef da[] = {part, casc};
        call(e, e->casc_ty, f->drain, da, 2);
        acc = named(LLVMBuildLoad2(e->b, t, part, ""), "v%d.casc.value", s);
    }
    if (save) e->saved[st->args[0]] = scratch;
    if (kind == FOLD_MEAN) acc = LLVMBuildFDiv(e->b, acc, LLVMConstReal(t, (double)n), "");
    return renamed(acc, "v%d.%s", s, ke_ops[st->op].name);
}

/* REDUCE s over the current row: a lane fold (above), or its operand into
 * scratch, then the reduction's eager row functions. */
static void emit_reduce(em *e, int s, const rdfns *main, const rdfns *pre) {
    const ir_kstmt *st = &e->k->stmts[s];
    const ke_rd_op *ro = ke_ops[st->op].impl;
    const cg_plan *p = e->p;
    int64_t n = p->shape[p->nd - 1];
    LLVMValueRef off = ci64(e, (int64_t)e->nreduce++ * (p->shape[p->nd - 1] > 0 ? p->shape[p->nd - 1] : 1) * 8);
    LLVMValueRef scratch = named(LLVMBuildGEP2(e->b, e->i8, e->base[p->nb], &off, 1, ""), "v%d.scratch", s);
    int fk = fold_kind(st);
    if (fk != FOLD_NONE && !pre) {
        e->val[s] = named(convert(e, emit_fused_fold(e, s, fk, main, scratch, n), st->compute, st->dtype), "v%d", s);
        e->have[s] = 1;
        return;
    }
    char nm[32];
    snprintf(nm, sizeof nm, "v%d.operand", s);
    loopctx L;
    loop_begin(e, &L, ci64(e, 0), ci64(e, n), 1, nm);
    forget_elements(e);
    set_offsets(e, L.iv);
    const ir_kstmt *a = &e->k->stmts[st->args[0]];
    LLVMValueRef v = convert(e, value(e, st->args[0]), a->dtype, st->compute);
    LLVMValueRef dst = LLVMBuildGEP2(e->b, ty(e, st->compute), scratch, &L.iv, 1, "");
    track(e, LLVMBuildStore(e->b, v, dst));
    loop_end(e, &L);
    /* later loops of the row read the operand back instead of recomputing it
     * (softmax's exp); loads and cheap values are recomputed anyway */
    if (a->dtype == st->compute && !a->row && a->kind == IR_K_OP && e->lvl[st->args[0]] == 2)
        e->saved[st->args[0]] = scratch;
    forget_elements(e);
    LLVMValueRef acc = named(slot(e, KE_RD_ACC_MAX), "v%d.acc", s), out = named(slot(e, 16), "v%d.out", s),
                 aux = named(slot(e, 16), "v%d.aux", s);
    LLVMValueRef pos = named(LLVMBuildAlloca(e->ab, e->i64, ""), "v%d.pos", s);
    LLVMValueRef auxp = LLVMConstNull(e->ptr);
    if (pre) {
        rd_call(e, pre, acc, aux, pos, LLVMConstNull(e->ptr), scratch, n, e->attrs[s]);
        if (ro->pre_inf_to_zero && (pre->vdt == KL_F32 || pre->vdt == KL_F64)) {
            LLVMTypeRef t = ty(e, pre->vdt);
            LLVMValueRef x = LLVMBuildLoad2(e->b, t, aux, "");
            LLVMValueRef fabs_args[] = {x};
            LLVMTypeRef ft = LLVMFunctionType(t, &t, 1, 0);
            const char *fname = pre->vdt == KL_F32 ? "llvm.fabs.f32" : "llvm.fabs.f64";
            LLVMValueRef fabs = LLVMGetNamedFunction(e->m, fname);
            if (!fabs) fabs = LLVMAddFunction(e->m, fname, ft);
            LLVMValueRef ax = call(e, ft, fabs, fabs_args, 1);
            LLVMValueRef inf = LLVMBuildFCmp(e->b, LLVMRealOEQ, ax, LLVMConstReal(t, 1.0 / 0.0), "");
            LLVMBuildStore(e->b, LLVMBuildSelect(e->b, inf, LLVMConstReal(t, 0.0), x, ""), aux);
        }
        auxp = aux;
    }
    rd_call(e, main, acc, out, pos, auxp, scratch, n, e->attrs[s]);
    LLVMValueRef r = named(LLVMBuildLoad2(e->b, ty(e, main->vdt), out, ""), "v%d.%s", s, ke_ops[st->op].name);
    e->val[s] = named(convert(e, r, main->vdt, st->dtype), "v%d", s);
    e->have[s] = 1;
}

/* ---- the kernel ------------------------------------------------------------------- */

static int unsupported(const ir_kernel *k, int s, const char *why) {
    const ir_kstmt *st = &k->stmts[s];
    return ke_err(KL_ERR_UNSUPPORTED, "compile", "llvm backend: statement v%d (%s%s in %s): %s", s,
                  st->kind == IR_K_REDUCE ? "reduce_" : "", st->op >= 0 ? ke_ops[st->op].name : "store",
                  ke_dtypes[st->compute].name, why);
}

static void make_types(em *e) {
    LLVMContextRef c = e->c;
    e->i8 = LLVMInt8TypeInContext(c);
    e->i16 = LLVMInt16TypeInContext(c);
    e->i32 = LLVMInt32TypeInContext(c);
    e->i64 = LLVMInt64TypeInContext(c);
    e->f32 = LLVMFloatTypeInContext(c);
    e->f64 = LLVMDoubleTypeInContext(c);
    e->ptr = LLVMPointerTypeInContext(c, 0);
    e->vd = LLVMVoidTypeInContext(c);
    LLVMTypeRef lp[] = {e->i64, e->ptr, e->ptr, e->i32, e->ptr, e->ptr};
    e->loop_ty = LLVMFunctionType(e->vd, lp, 6, 0);
    LLVMTypeRef cp[] = {e->ptr, e->i64, e->ptr, e->i64, e->i64};
    e->conv_ty = LLVMFunctionType(e->vd, cp, 5, 0);
    LLVMTypeRef ip[] = {e->ptr, e->i64};
    e->init_ty = LLVMFunctionType(e->vd, ip, 2, 0);
    LLVMTypeRef rp[] = {e->ptr, e->ptr, e->i64, e->i64, e->ptr, e->ptr};
    e->row_ty = LLVMFunctionType(e->vd, rp, 6, 0);
    LLVMTypeRef fp[] = {e->ptr, e->ptr, e->ptr, e->i64, e->i64, e->ptr, e->ptr};
    e->fin_ty = LLVMFunctionType(e->vd, fp, 7, 0);
    LLVMTypeRef pp[] = {e->ptr, e->ptr};
    e->casc_ty = LLVMFunctionType(e->vd, pp, 2, 0);
}

static LLVMValueRef attrs_global(em *e, const ke_attrs *a) {
    /* The constant is LLVM-uniqued by its bytes: built field by field into
     * zeroed memory, because a's padding (after nlist) and list slots past
     * nlist may be uninitialised (valgrind memcheck, test_plan). */
    ke_attrs z;
    memset(&z, 0, sizeof z);
    memcpy(z.f, a->f, sizeof z.f);
    memcpy(z.i, a->i, sizeof z.i);
    z.nlist = a->nlist;
    if (a->nlist > 0 && a->nlist <= KE_MAX_LIST) memcpy(z.list, a->list, sizeof(int64_t) * (size_t)a->nlist);
    LLVMValueRef init = LLVMConstStringInContext(e->c, (const char *)&z, sizeof z, 1);
    LLVMValueRef g = LLVMAddGlobal(e->m, LLVMTypeOf(init), "attrs");
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    LLVMSetUnnamedAddr(g, 1);
    LLVMSetAlignment(g, 16);
    return g;
}

/* Roots in the master module: every function the kernel calls. */
typedef struct roots {
    LLVMValueRef v[4 * 64 + 64];
    int n;
} roots;

static void add_root(roots *r, LLVMValueRef f) {
    for (int i = 0; i < r->n; i++)
        if (r->v[i] == f) return;
    if (r->n < (int)(sizeof r->v / sizeof r->v[0])) r->v[r->n++] = f;
}

static int need_conv(em *e, roots *r, LLVMValueRef table, int from, int to) {
    if (from == to || e->conv[from][to]) return 0;
    LLVMValueRef f = fn_at(table, ((uint64_t)from * KL_NUM_DTYPES + (uint64_t)to) * sizeof(void *));
    if (!f) return -1;
    e->conv[from][to] = f;
    add_root(r, f);
    return 0;
}

/* Step 1: every function the kernel calls, found in the master module (the
 * eager bitcode) through the impl tables' initializers: OP loops, reduction
 * functions, conversions. Fails (unsupported) for what the backend cannot take. */
static int collect(em *e) {
    const ir_kernel *k = e->k;
    const cg_plan *p = e->p;
    roots *R = e->roots;
    int rc = 0;
    LLVMValueRef conv_table = global_init(LLVMGetNamedGlobal(cg_master(), "conv_table"));
    if (!conv_table) return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: no conversion table in the eager bitcode");
    for (int s = 0; s < k->nstmts && !rc; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_OP) {
            const ke_ew_impl *impl = ke_ops[st->op].impl;
            const char *sym = cg_impl_symbol(st->op);
            LLVMValueRef g = sym ? LLVMGetNamedGlobal(cg_master(), sym) : NULL;
            LLVMValueRef f = fn_at(global_init(g), offsetof(ke_ew_impl, loop) + (uint64_t)st->compute * sizeof(void *));
            if (ke_ops[st->op].kind != KE_KIND_EW || !impl || !impl->loop[st->compute] || !f || st->nargs > 4)
                return unsupported(k, s, "no elementwise loop in the eager bitcode");
            add_root(R, f);
            e->loopf[s] = f;
            for (int i = 0; i < st->nargs && !rc; i++) {
                int want = (impl->bool_in >> i) & 1 ? KL_BOOL : st->compute;
                rc = need_conv(e, R, conv_table, k->stmts[st->args[i]].dtype, want);
            }
            if (!rc) rc = need_conv(e, R, conv_table, impl->out_bool ? KL_BOOL : st->compute, st->dtype);
            if (rc) rc = unsupported(k, s, "no conversion");
        } else if (st->kind == IR_K_REDUCE) {
            const ke_rd_op *ro;
            LLVMValueRef kern = master_rd_kernel(st->op, st->compute, &ro);
            if (ke_ops[st->op].kind != KE_KIND_REDUCE || !ro || ro->vout != 0 || ro->iout >= 0 || !k->row ||
                !ro->k[st->compute] || !kern || rd_master_fns(kern, e->rdm[s][0]))
                return unsupported(k, s, "not a row reduction of the eager bitcode");
            e->rdvdt[s][0] = ro->k[st->compute]->vdt;
            if (ro->pre) {
                LLVMValueRef pk = master_rd_pre(st->op, st->compute);
                if (!ro->pre->k[st->compute] || !pk || rd_master_fns(pk, e->rdm[s][1]))
                    return unsupported(k, s, "no first pass in the eager bitcode");
                e->rdvdt[s][1] = ro->pre->k[st->compute]->vdt;
                for (int i = 0; i < 3; i++) add_root(R, e->rdm[s][1][i]);
            }
            for (int i = 0; i < 3; i++) add_root(R, e->rdm[s][0][i]);
            if (fold_kind(st) != FOLD_NONE && !ro->pre && p->shape[p->nd - 1] > KE_FOLD_CHUNK)
                for (int i = 3; i < RD_NFNS; i++) add_root(R, e->rdm[s][0][i]); /* the lane fold's cascade */
            rc = need_conv(e, R, conv_table, k->stmts[st->args[0]].dtype, st->compute);
            if (!rc) rc = need_conv(e, R, conv_table, e->rdvdt[s][0], st->dtype);
            if (rc) rc = unsupported(k, s, "no conversion");
        } else if (st->kind == IR_K_STORE) {
            const ir_kstmt *a = &k->stmts[st->args[0]];
            int once = k->row && k->bufs[st->buf].index[k->ndim - 1] == 0;
            if (a->dtype != st->dtype) rc = unsupported(k, s, "stores a value of another dtype");
            else if (once && !a->row) rc = unsupported(k, s, "stores an element value into a row output");
        }
    }
    return rc;
}

/* Step 2: the kernel's module: the closure of the collected functions cloned
 * out of the bitcode, made private and always-inline, unused declarations
 * dropped; the collected references mapped into it; one constant attrs
 * global per OP / REDUCE. */
static int prepare(em *e) {
    const ir_kernel *k = e->k;
    char *err = NULL;
    e->m = cg_bc_extract(cg_master(), e->roots->v, e->roots->n, &err);
    if (!e->m) {
        int rc = ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: reading the eager bitcode: %s", err ? err : "");
        free(err);
        return rc;
    }
    /* everything copied is private to the kernel and inlined into it (cg_jit.c's
     * passes inline by this attribute, not by cost); the target comes from the
     * JIT's target machine, not from how the bitcode was compiled */
    LLVMAttributeRef always_inline =
        LLVMCreateEnumAttribute(e->c, LLVMGetEnumAttributeKindForName("alwaysinline", 12), 0);
    for (LLVMValueRef f = LLVMGetFirstFunction(e->m); f; f = LLVMGetNextFunction(f)) {
        if (LLVMIsDeclaration(f)) continue;
        LLVMSetLinkage(f, LLVMInternalLinkage);
        LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, always_inline);
        LLVMRemoveStringAttributeAtIndex(f, LLVMAttributeFunctionIndex, "target-cpu", 10);
        LLVMRemoveStringAttributeAtIndex(f, LLVMAttributeFunctionIndex, "target-features", 15);
        LLVMRemoveStringAttributeAtIndex(f, LLVMAttributeFunctionIndex, "tune-cpu", 8);
    }
    for (LLVMValueRef g = LLVMGetFirstGlobal(e->m); g; g = LLVMGetNextGlobal(g))
        if (!LLVMIsDeclaration(g)) LLVMSetLinkage(g, LLVMInternalLinkage);
    /* the clone declares everything the bitcode defines: drop what is unused,
     * so the passes do not walk ~800 declarations */
    for (LLVMValueRef f = LLVMGetFirstFunction(e->m), next; f; f = next) {
        next = LLVMGetNextFunction(f);
        if (LLVMIsDeclaration(f) && !LLVMGetFirstUse(f)) LLVMDeleteFunction(f);
    }
    for (LLVMValueRef g = LLVMGetFirstGlobal(e->m), next; g; g = next) {
        next = LLVMGetNextGlobal(g);
        if (LLVMIsDeclaration(g) && !LLVMGetFirstUse(g)) LLVMDeleteGlobal(g);
    }
    for (int s = 0; s < k->nstmts; s++) {
        if (e->loopf[s]) e->loopf[s] = fn_in_m(e, e->loopf[s]);
        if (k->stmts[s].kind == IR_K_OP || k->stmts[s].kind == IR_K_REDUCE) e->attrs[s] = attrs_global(e, &k->stmts[s].a);
    }
    for (int a = 0; a < KL_NUM_DTYPES; a++)
        for (int b = 0; b < KL_NUM_DTYPES; b++)
            if (e->conv[a][b]) e->conv[a][b] = fn_in_m(e, e->conv[a][b]);
    return 0;
}

/* The reduction functions of REDUCE s (which: 0 main, 1 first pass) in the kernel's module. */
static rdfns rd_fns(em *e, int s, int which) {
    LLVMValueRef *f = e->rdm[s][which];
    rdfns r = {fn_in_m(e, f[0]), fn_in_m(e, f[1]), fn_in_m(e, f[2]), NULL, NULL, e->rdvdt[s][which]};
    if (!which) r.push = fn_in_m(e, f[3]), r.drain = fn_in_m(e, f[4]);
    return r;
}

/* Row kernels, per row: one loop per REDUCE, row-level values, one loop for
 * the element stores, then the row outputs. */
static void emit_rows(em *e, LLVMValueRef begin, LLVMValueRef end) {
    const ir_kernel *k = e->k;
    const cg_plan *p = e->p;
    loopctx R0;
    loop_begin(e, &R0, begin, end, 0, "row");
    set_row_offsets(e, R0.iv);
    forget_level(e, 1);
    int64_t n = p->shape[p->nd - 1];
    int any_elem_store = 0;
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_REDUCE) {
            rdfns mainf = rd_fns(e, s, 0), pref = {0};
            if (e->rdm[s][1][0]) pref = rd_fns(e, s, 1);
            emit_reduce(e, s, &mainf, e->rdm[s][1][0] ? &pref : NULL);
        } else if (e->lvl[s] == 1) {
            value(e, s);
        } else if (st->kind == IR_K_STORE && !(k->row && k->bufs[st->buf].index[k->ndim - 1] == 0)) {
            any_elem_store = 1;
        }
    }
    if (any_elem_store) {
        loopctx L;
        loop_begin(e, &L, ci64(e, 0), ci64(e, n), 1, "elem");
        forget_elements(e);
        set_offsets(e, L.iv);
        for (int s = 0; s < k->nstmts; s++) {
            const ir_kstmt *st = &k->stmts[s];
            if (st->kind == IR_K_STORE && !(k->row && k->bufs[st->buf].index[k->ndim - 1] == 0))
                emit_store(e, s, e->off[st->buf]);
        }
        loop_end(e, &L);
        forget_elements(e);
    }
    for (int s = 0; s < k->nstmts; s++) { /* row outputs: one element per row, also for an empty row */
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_STORE && k->row && k->bufs[st->buf].index[k->ndim - 1] == 0)
            emit_store(e, s, e->row_off[st->buf]);
    }
    loop_end(e, &R0);
}

/* Step 3: the function int64_t name(int64_t begin, int64_t end, char *const
 * *bases): buffer bases, the values computed once per call, then one flat
 * element loop or the row loop. */
static void emit_body(em *e, const char *name) {
    const ir_kernel *k = e->k;
    const cg_plan *p = e->p;
    LLVMTypeRef params[] = {e->i64, e->i64, e->ptr};
    e->fn = LLVMAddFunction(e->m, name, LLVMFunctionType(e->i64, params, 3, 0));
    LLVMSetLinkage(e->fn, LLVMExternalLinkage);
    LLVMAddAttributeAtIndex(e->fn, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(e->c, LLVMGetEnumAttributeKindForName("nounwind", 8), 0));
    e->b = LLVMCreateBuilderInContext(e->c);
    e->ab = LLVMCreateBuilderInContext(e->c);
    e->entry = LLVMAppendBasicBlockInContext(e->c, e->fn, "entry");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, e->fn, "body");
    e->exit = LLVMAppendBasicBlockInContext(e->c, e->fn, "exit");
    LLVMPositionBuilderAtEnd(e->ab, e->entry);
    e->ret_slot = LLVMBuildAlloca(e->ab, e->i64, "ret");
    LLVMPositionBuilderAtEnd(e->b, body);
    LLVMValueRef begin = LLVMGetParam(e->fn, 0), end = LLVMGetParam(e->fn, 1), bases = LLVMGetParam(e->fn, 2);
    LLVMSetValueName2(begin, "begin", 5);
    LLVMSetValueName2(end, "end", 3);
    LLVMSetValueName2(bases, "bases", 5);
    char nm[16];
    for (int b = 0; b <= p->nb; b++) {
        LLVMValueRef idx = ci64(e, b);
        e->base[b] = named(LLVMBuildLoad2(e->b, e->ptr, LLVMBuildGEP2(e->b, e->ptr, bases, &idx, 1, ""), ""), "%s",
                           bufname(e, b, nm, sizeof nm));
    }
    LLVMBuildStore(e->b, ci64(e, 0), e->ret_slot);
    classify(e);
    for (int s = 0; s < k->nstmts; s++) /* once per call (the range is never empty) */
        if (e->lvl[s] == 0) value(e, s);
    /* stores in statement order come last, after every load of the element:
     * an output aliasing an input in place reads before it writes */
    if (p->flat) {
        loopctx L;
        loop_begin(e, &L, begin, end, 1, "elem");
        for (int b = 0; b < p->nb; b++) e->row_off[b] = NULL;
        set_offsets(e, L.iv);
        forget_elements(e);
        for (int s = 0; s < k->nstmts; s++) {
            if (k->stmts[s].kind == IR_K_STORE) emit_store(e, s, e->off[k->stmts[s].buf]);
            else value(e, s);
        }
        loop_end(e, &L);
    } else {
        emit_rows(e, begin, end);
    }
    LLVMBuildBr(e->b, e->exit);
    LLVMBuildBr(e->ab, body);
    LLVMPositionBuilderAtEnd(e->b, e->exit);
    LLVMBuildRet(e->b, LLVMBuildLoad2(e->b, e->i64, e->ret_slot, ""));
    LLVMDisposeBuilder(e->b);
    LLVMDisposeBuilder(e->ab);
}

int cg_emit_kernel(const ir_kernel *k, const cg_plan *p, const char *name, LLVMModuleRef *out) {
    em E = {.c = cg_ctx(), .k = k, .p = p};
    em *e = &E;
    make_types(e);
    size_t ns = (size_t)k->nstmts + 1;
    e->val = calloc(ns, sizeof *e->val);
    e->have = calloc(ns, 1);
    e->lvl = calloc(ns, 1);
    e->saved = calloc(ns, sizeof *e->saved);
    e->loopf = calloc(ns, sizeof *e->loopf);
    e->attrs = calloc(ns, sizeof *e->attrs);
    e->rdm = calloc(ns, sizeof *e->rdm);
    e->rdvdt = calloc(ns, sizeof *e->rdvdt);
    e->roots = calloc(1, sizeof *e->roots);
    int rc;
    if (!e->val || !e->have || !e->lvl || !e->saved || !e->loopf || !e->attrs || !e->rdm || !e->rdvdt || !e->roots)
        rc = ke_err(KL_ERR_OOM, "compile", "out of memory");
    else if (!(rc = collect(e)) && !(rc = prepare(e))) {
        emit_body(e, name);
        *out = e->m;
        e->m = NULL;
    }
    if (e->m) LLVMDisposeModule(e->m);
    free(e->val);
    free(e->have);
    free(e->lvl);
    free(e->saved);
    free(e->loopf);
    free(e->attrs);
    free(e->rdm);
    free(e->rdvdt);
    free(e->roots);
    return rc ? -1 : 0;
}
