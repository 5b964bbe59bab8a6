/*
 * cn_emit.c — kernel IR (kernel.h) -> CUDA C source.
 *
 * One definition of the math: an OP statement calls the __device__ function
 * that the eager file defining its CPU loop becomes under
 * kernels_ew_device.h (same name: ke_ew_loop_name_of), so the formula, its
 * attributes and its dtype handling are the CPU's; operands and results are
 * cast with dtype_conv.h's KE_CV_* macros, the rules of ke_convert. f16 and
 * bf16 live in registers as their uint16_t bits and compute in f32, as eager.
 *
 * Kernel shapes (docs/GPU.md, "Generating CUDA C"):
 *  - elementwise: a grid-stride loop over the flat domain, CN_BLOCK threads
 *    per block; each buffer's offset from the domain index and its strides
 *    over the domain, baked in as constants (flat buffers use the index as
 *    is); 32-bit index math when the domain and every offset fit, else 64.
 *    All-flat kernels first take 16-byte accesses (kl_vec) when every pointer
 *    is aligned, checked at run time; the element loop does the rest.
 *  - row kernels: one block per row (grid-stride over rows). Each REDUCE is a
 *    pass over the row recomputing the element statements it needs, folding
 *    with the reduction's rd_formulas.h formulas (STEP per element, MERGE
 *    across warp shuffles and then shared memory, FIN); a last pass writes
 *    the element outputs. An input read by several passes is loaded once
 *    per row into registers when the row fits the cache (cn_row_cache), and
 *    the passes run over those. Rows are not split across blocks (no
 *    two-pass form for very long rows yet). The fold order is a tree, not
 *    the CPU's cascade: float sums differ from eager in the last bits.
 */
#include "cn.h"

#include "cuda_api.h"
#include "ew.h"
#include "kernels_reduce.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- a growing string -------------------------------------------------------------- */

typedef struct cn_buf {
    char *p;
    size_t n, cap;
    int oom;
} cn_buf;

__attribute__((format(printf, 2, 3))) static void put(cn_buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)w < room) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)w + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* ---- dtypes ---------------------------------------------------------------------- */

/* The C type holding a value of dtype d (f16/bf16: their bits). */
const char *cn_ctype(int d) {
    switch (d) {
    case KL_F32: return "float";
    case KL_F64: return "double";
    case KL_F16:
    case KL_BF16: return "uint16_t";
    case KL_I32: return "int32_t";
    case KL_I64: return "int64_t";
    default: return "uint8_t";
    }
}
/* The suffix of dtype_conv.h's KE_CV_LOAD_ / KE_CV_STORE_ macros. */
const char *cn_cvname(int d) {
    static const char *const n[KL_NUM_DTYPES] = {[KL_F32] = "F32", [KL_F64] = "F64", [KL_F16] = "F16",
                                                 [KL_BF16] = "BF16", [KL_I32] = "I32", [KL_I64] = "I64",
                                                 [KL_U8] = "U8", [KL_BOOL] = "BOOL"};
    return n[d];
}
/* expr (a value of dtype from) as dtype to, by ke_convert's rules. */
static void put_conv(cn_buf *b, int to, int from, const char *expr) {
    if (to == from) put(b, "%s", expr);
    else
        put(b, "KE_CV_STORE_%s(KE_CV_LOAD_%s(%s), %d)", cn_cvname(to), cn_cvname(from), expr,
            ke_is_float((kl_dtype)from));
}

/* ---- what a kernel needs ----------------------------------------------------------- */

const char *cn_device_fn(int op, kl_dtype compute, const char **file) {
    const ke_ew_impl *impl = op >= 0 && op < KE_OP_COUNT && ke_ops[op].kind == KE_KIND_EW ? ke_ops[op].impl : NULL;
    ke_ew_loop loop = impl && ke_dtype_valid(compute) ? impl->loop[compute] : NULL;
    const ke_ew_loop_name *e = loop ? ke_ew_loop_name_of(loop) : NULL;
    if (!e) {
        ke_err(KL_ERR_UNSUPPORTED, "compile", "nvrtc backend: kl_%s in %s has no device function",
               op >= 0 && op < KE_OP_COUNT ? ke_ops[op].name : "?",
               ke_dtype_valid(compute) ? ke_dtypes[compute].name : "?");
        return NULL;
    }
    if (file) {
        const char *s = strrchr(e->file, '/');
        *file = s ? s + 1 : e->file;
    }
    return e->name;
}

/* The reductions a row kernel can fold: the formulas of rd_formulas.h with
 * their accumulator kinds (tmpl/rd_types.h). Two-pass ones (var, std,
 * logsumexp) name their first pass too (var's mean, in double as the CPU's
 * RK_KIND_MEAN_F32D; logsumexp's max): the row is folded twice, the first
 * pass's value (`aux` in the formulas) feeding the second. The norms have no
 * impl of their own (ke_rd_norm_op picks one by p), so they never reach a row
 * kernel: they stay graph nodes. */
enum { RD_SAME, RD_SUM, RD_BOOL, RD_DOUBLE };
static const struct {
    const ke_rd_op *op;
    const char *formula;
    int kind;
    const char *pre;  /* the first pass's formula, or NULL */
    int pre_kind;
} rd_table[] = {
    {&ke_rd_sum, "SUM", RD_SUM, NULL, 0},   {&ke_rd_prod, "PROD", RD_SUM, NULL, 0},
    {&ke_rd_mean, "MEAN", RD_SAME, NULL, 0}, {&ke_rd_amax, "AMAX", RD_SAME, NULL, 0},
    {&ke_rd_amin, "AMIN", RD_SAME, NULL, 0}, {&ke_rd_all, "ALL", RD_BOOL, NULL, 0},
    {&ke_rd_any, "ANY", RD_BOOL, NULL, 0},  {&ke_rd_var, "VAR", RD_DOUBLE, "MEAN", RD_DOUBLE},
    {&ke_rd_std, "STD", RD_DOUBLE, "MEAN", RD_DOUBLE}, {&ke_rd_logsumexp, "LSE", RD_SAME, "AMAX", RD_SAME},
};

static int rd_find(const ir_kstmt *st) {
    const ke_rd_op *ro = st->op >= 0 && st->op < KE_OP_COUNT ? ke_ops[st->op].impl : NULL;
    for (size_t i = 0; i < sizeof rd_table / sizeof *rd_table; i++)
        if (rd_table[i].op == ro && ro->k[st->compute] && (!ro->pre || ro->pre->k[st->compute])) return (int)i;
    return ke_err(KL_ERR_UNSUPPORTED, "compile", "nvrtc backend: cannot fold kl_%s in %s in a row kernel",
                  st->op >= 0 && st->op < KE_OP_COUNT ? ke_ops[st->op].name : "?",
                  ke_dtype_valid(st->compute) ? ke_dtypes[st->compute].name : "?");
}

/* The accumulator type of a reduction in compute dtype cd. */
static const char *rd_acc(int kind, int cd) {
    if (kind == RD_BOOL) return "uint8_t";
    if (kind == RD_DOUBLE) return "double";
    if (kind == RD_SUM && !ke_is_float((kl_dtype)cd)) return "uint64_t";
    return cn_ctype(cd);
}

/* Checks every statement, collecting the eager files the program includes
 * (bit 0 ew_unary.c, 1 ew_binary.c, 2 ew_other.c, 3 rd_formulas.h). */
static const char *const inc_files[] = {"ew_unary.c", "ew_binary.c", "ew_other.c", "rd_formulas.h"};
static int check_kernel(const ir_kernel *k, unsigned *files) {
    if (k->nstmts <= 0 || k->ndim > KL_MAX_DIMS || k->ninputs + k->noutputs > IR_KERNEL_MAX_IN + KE_MAX_OUT)
        return ke_err(KL_ERR_UNSUPPORTED, "compile", "nvrtc backend: malformed kernel");
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_OP) {
            const char *file = NULL;
            if (!cn_device_fn(st->op, (kl_dtype)st->compute, &file)) return -1;
            for (unsigned f = 0; f < 3; f++)
                if (!strcmp(file, inc_files[f])) *files |= 1u << f;
        } else if (st->kind == IR_K_REDUCE) {
            if (!k->row)
                return ke_err(KL_ERR_UNSUPPORTED, "compile", "nvrtc backend: a reduction outside a row kernel");
            if (rd_find(st) < 0) return -1;
            *files |= 8u;
        }
    }
    return 0;
}

/* ---- index math -------------------------------------------------------------------- */

static int64_t numel(const ir_kernel *k, int upto) {
    int64_t n = 1;
    for (int d = 0; d < upto; d++) n *= k->shape[d];
    return n;
}

/* 1 if the domain, and every buffer's largest offset, fit in 31 bits. */
static int fits32(const ir_kernel *k) {
    const int64_t lim = INT32_MAX;
    if (numel(k, k->ndim) >= lim) return 0;
    for (int b = 0; b < k->ninputs + k->noutputs; b++) {
        int64_t m = 0;
        for (int d = 0; d < k->ndim; d++) {
            int64_t ix = k->bufs[b].index[d];
            m += (k->shape[d] > 0 ? k->shape[d] - 1 : 0) * (ix < 0 ? -ix : ix);
            if (m >= lim) return 0;
        }
    }
    return 1;
}

/* 1 if buffer b's element at flat domain index i is element i (dims from
 * `from` on; a row kernel's buffers are flat along the row when index is 1). */
static int flat(const ir_kernel *k, int b) {
    int64_t st = 1;
    for (int d = k->ndim - 1; d >= 0; d--) {
        if (k->shape[d] != 1 && k->bufs[b].index[d] != st) return 0;
        st *= k->shape[d];
    }
    return 1;
}

/* buffer b's offset over dims [d0, d1) of the domain, named i<d> */
static void put_offset(cn_buf *o, const ir_kernel *k, int b, int d0, int d1) {
    int any = 0;
    for (int d = d0; d < d1; d++) {
        int64_t ix = k->bufs[b].index[d];
        if (!ix || k->shape[d] == 1) continue;
        if (ix == 1) put(o, "%si%d", any ? " + " : "", d);
        else put(o, "%si%d * %" PRId64, any ? " + " : "", d, ix);
        any = 1;
    }
    if (!any) put(o, "0");
}

static const char *bufname(const ir_kernel *k, int b, char *tmp) {
    snprintf(tmp, 16, b < k->ninputs ? "in%d" : "out%d", b < k->ninputs ? b : b - k->ninputs);
    return tmp;
}

/* ---- statements -------------------------------------------------------------------- */

typedef struct emit {
    const ir_kernel *k;
    cn_buf *o;
    const char *ind;       /* indentation of the current block */
    int vec;               /* in the 16-byte path: buffers are read from l<b>.v[u], written to s<b>.v[u] */
    int dyn;               /* run-time shape (CN_DYN_FLAT / CN_DYN_STRIDED), else 0: baked in */
    unsigned byval;        /* inputs passed by value (bit b: input b is a scalar parameter, not a pointer) */
    unsigned hoist;        /* inputs of one element read once before the loops, as c<b> (elementwise kernels) */
    const uint8_t *cached; /* row kernels: cached[s] when LOAD s is held in registers (kc<s>[u]) */
    int incache;           /* emitting the register-cached form of a row pass */
} emit;

/* Whether buffer b of a run-time-shape kernel is one element for every
 * domain index (a scalar or a broadcast one-element operand). */
static int all_zero(const ir_kernel *k, int b) {
    for (int d = 0; d < k->ndim; d++)
        if (k->bufs[b].index[d] && k->shape[d] != 1) return 0;
    return 1;
}

/* The load of buffer b at the current element. */
static void put_access(emit *e, int b) {
    const ir_kernel *k = e->k;
    char tmp[16];
    if (b < k->ninputs && ((e->hoist >> b) & 1)) {
        put(e->o, "c%d", b);
        return;
    }
    if (e->vec) {
        put(e->o, b < k->ninputs ? "l%d.v[u]" : "s%d.v[u]", b);
        return;
    }
    if (b < k->ninputs && ((e->byval >> b) & 1)) {
        put(e->o, "%s", bufname(k, b, tmp));
        return;
    }
    put(e->o, "%s[", bufname(k, b, tmp));
    if (e->dyn == CN_DYN_FLAT) {
        put(e->o, all_zero(k, b) ? "0" : "i");
    } else if (e->dyn == CN_DYN_STRIDED) {
        for (int d = 0; d < k->ndim; d++) put(e->o, "%si%d * kl_d.index[%d][%d]", d ? " + " : "", d, b, d);
        if (!k->ndim) put(e->o, "0");
    } else if (!k->row) {
        if (flat(k, b)) put(e->o, "i");
        else put_offset(e->o, k, b, 0, k->ndim);
    } else {
        /* row base + position along the row */
        int64_t ix = k->bufs[b].index[k->ndim - 1];
        put(e->o, "rb%d", b);
        if (e->dyn) {
            /* a row-shaped buffer (index 0 along the row) is read or written outside the j loops */
            if (ix) put(e->o, " + j * kl_d.index[%d][%d]", b, k->ndim - 1);
        } else if (ix == 1) put(e->o, " + j");
        else if (ix && k->shape[k->ndim - 1] != 1) put(e->o, " + j * %" PRId64, ix);
    }
    put(e->o, "]");
}

/* v<s> = statement s (LOAD or OP), operands already in scope. */
static void put_stmt(emit *e, int s) {
    const ir_kernel *k = e->k;
    const ir_kstmt *st = &k->stmts[s];
    cn_buf *o = e->o;
    char tmp[16];
    if (st->kind == IR_K_LOAD) {
        put(o, "%s/* LOAD %s */\n%sconst %s v%d = ", e->ind, bufname(k, st->buf, tmp), e->ind, cn_ctype(st->dtype), s);
        if (e->incache && e->cached && e->cached[s]) put(o, "kc%d[u]", s); /* read once per row, at its start */
        else put_access(e, st->buf);
        put(o, ";\n");
        return;
    }
    /* OP: operands to the compute dtype (bool where the op reads bool) */
    const ke_ew_impl *impl = ke_ops[st->op].impl;
    const char *fn = cn_device_fn(st->op, (kl_dtype)st->compute, NULL);
    put(o, "%s/* v%d = %s(", e->ind, s, ke_ops[st->op].name);
    for (int i = 0; i < st->nargs; i++) put(o, "%sv%d", i ? ", " : "", st->args[i]);
    put(o, ") computed in %s */\n", ke_dtypes[st->compute].name);
    int rdt = impl->out_bool ? KL_BOOL : st->compute;
    char call[1024];
    int n = snprintf(call, sizeof call, "%s(", fn);
    for (int i = 0; i < st->nargs; i++) {
        const ir_kstmt *a = &k->stmts[st->args[i]];
        int want = (impl->bool_in >> i) & 1 ? KL_BOOL : st->compute;
        char v[16];
        snprintf(v, sizeof v, "v%d", st->args[i]);
        cn_buf cb = {0};
        put_conv(&cb, want, a->dtype, v);
        n += snprintf(call + n, sizeof call - (size_t)n, "%s, ", cb.p ? cb.p : "");
        free(cb.p);
    }
    if (ke_op_attrs[st->op].n > 0) snprintf(call + n, sizeof call - (size_t)n, "%uu, &a%d, &kl_err)", st->bcast, s);
    else snprintf(call + n, sizeof call - (size_t)n, "%uu, (const ke_attrs *)0, &kl_err)", st->bcast);
    put(o, "%sconst %s v%d = ", e->ind, cn_ctype(st->dtype), s);
    put_conv(o, st->dtype, rdt, call);
    put(o, ";\n");
}

/* Marks in need[] the element statements (not row values) that s needs. */
static void mark(const ir_kernel *k, int s, uint8_t *need) {
    const ir_kstmt *st = &k->stmts[s];
    if (need[s] || st->row || st->kind == IR_K_REDUCE) return;
    need[s] = 1;
    if (st->kind == IR_K_OP)
        for (int i = 0; i < st->nargs; i++) mark(k, st->args[i], need);
}

static void put_needed(emit *e, const uint8_t *need) {
    for (int s = 0; s < e->k->nstmts; s++)
        if (need[s]) put_stmt(e, s);
}

/* The attribute constants of the kernel's ops, and the error word. */
static void put_prologue(emit *e) {
    const ir_kernel *k = e->k;
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind != IR_K_OP || ke_op_attrs[st->op].n == 0) continue;
        char init[1024];
        ke_attrs_c_init(&st->a, init, sizeof init);
        put(e->o, "    /* attributes of %s (v%d) */\n    const ke_attrs a%d = %s;\n", ke_ops[st->op].name, s, s, init);
    }
    put(e->o, "    int kl_err = 0; /* a formula's error (KE_EW_INT_DIV_ZERO) */\n");
}

/* Row kernels synchronize (__syncthreads, shuffles): the emulator runs their
 * threads as fibers (KL_EMU_EXPORT_SYNC); elementwise ones as plain calls. */
static void put_epilogue(emit *e, const char *name) {
    put(e->o, "    if (kl_err) atomicCAS(kl_status, 0, kl_err); /* the first error wins */\n}\nKL_EMU_EXPORT%s(%s)\n\n",
        e->k->row ? "_SYNC" : "", name);
}

static void put_params(emit *e, const char *name) {
    const ir_kernel *k = e->k;
    char tmp[16];
    put(e->o, "extern \"C\" __global__ void %s%s(", k->row ? "KL_ROW_BOUNDS " : "", name);
    for (int b = 0; b < k->ninputs + k->noutputs; b++)
        put(e->o, "%s%s%s %s%s", b ? ", " : "", b < k->ninputs ? "const " : "", cn_ctype(k->bufs[b].dtype),
            b < k->ninputs && ((e->byval >> b) & 1) ? "" : "*", bufname(k, b, tmp));
    put(e->o, "%sint *kl_status%s) {\n", k->ninputs + k->noutputs ? ", " : "", e->dyn ? ", const kl_dims kl_d" : "");
}

static void put_shape_comment(cn_buf *o, const ir_kernel *k, const char *name) {
    put(o, "/* %s: %s kernel over [", name, k->row ? "row" : "elementwise");
    for (int d = 0; d < k->ndim; d++) put(o, "%s%" PRId64, d ? ", " : "", k->shape[d]);
    put(o, "]%s */\n", k->row ? " (one block per row, the last dim reduced)" : "");
}

/* The statements of an elementwise kernel for the current element. */
static void put_body(emit *e) {
    const ir_kernel *k = e->k;
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind != IR_K_STORE) {
            put_stmt(e, s);
            continue;
        }
        char tmp[16], v[16];
        snprintf(v, sizeof v, "v%d", st->args[0]);
        put(e->o, "%s/* STORE %s */\n%s", e->ind, bufname(k, st->buf, tmp), e->ind);
        put_access(e, st->buf);
        put(e->o, " = ");
        put_conv(e->o, st->dtype, k->stmts[st->args[0]].dtype, v);
        put(e->o, ";\n");
    }
}

/* Elements per 16-byte access when every buffer is flat (no broadcast, no
 * strides) and the domain is long enough to be worth it; else 0. */
static int vec_width(const ir_kernel *k, unsigned hoist) {
    int maxsz = 1;
    if (numel(k, k->ndim) < 4 * CN_BLOCK) return 0;
    for (int b = 0; b < k->ninputs + k->noutputs; b++) {
        if (b < k->ninputs && ((hoist >> b) & 1)) continue;
        if (!flat(k, b)) return 0;
        int sz = ke_dtypes[k->bufs[b].dtype].size;
        maxsz = sz > maxsz ? sz : maxsz;
    }
    return 16 / maxsz >= 2 ? 16 / maxsz : 0;
}

static int emit_elementwise(emit *e, const char *name, const char *it) {
    const ir_kernel *k = e->k;
    cn_buf *o = e->o;
    const int nb = k->ninputs + k->noutputs;
    put_params(e, name);
    put_prologue(e);
    int64_t n = numel(k, k->ndim);
    /* One-element inputs (a wrapped C scalar, a broadcast [1] operand) are
     * read once: the loops then hold only the streamed buffers, and their
     * conversions to the compute dtype leave the loop with them. */
    char tmp[16];
    if (e->dyn != CN_DYN_STRIDED)
        for (int b = 0; b < k->ninputs; b++)
            if (!((e->byval >> b) & 1) && all_zero(k, b) && n > 1) {
                e->hoist |= 1u << b;
                put(o, "    const %s c%d = %s[0];\n", cn_ctype(k->bufs[b].dtype), b, bufname(k, b, tmp));
            }
    int need_idx = 0;
    for (int b = 0; b < nb; b++) need_idx |= !flat(k, b) && !(b < k->ninputs && ((e->hoist >> b) & 1));
    if (e->dyn) need_idx = e->dyn == CN_DYN_STRIDED;
    const char *start = "";
    int vw = e->dyn ? 0 : vec_width(k, e->hoist);
    char bound[32];
    if (e->dyn) snprintf(bound, sizeof bound, "kl_d.n");
    else snprintf(bound, sizeof bound, "%" PRId64, n);
    if (vw) {
        put(o, "    /* 16-byte accesses, %d elements at a time, when every streamed buffer is 16-byte aligned;\n"
               "       the rest (or everything, unaligned) element by element below */\n", vw);
        put(o, "    %s kl_head = 0;\n    if (((", it);
        int any = 0;
        for (int b = 0; b < nb; b++)
            if (!(b < k->ninputs && ((e->hoist >> b) & 1)))
                put(o, "%s(unsigned long long)%s", any++ ? " | " : "", bufname(k, b, tmp));
        put(o, ") & 15) == 0) {\n        kl_head = %" PRId64 ";\n", n / vw * vw);
        put(o, "        for (%s q = blockIdx.x * (%s)blockDim.x + threadIdx.x; q < %" PRId64 "; q += (%s)gridDim.x * blockDim.x) {\n",
            it, it, n / vw, it);
        for (int b = 0; b < k->ninputs; b++)
            if (!((e->hoist >> b) & 1))
                put(o, "            const kl_vec<%s, %d> l%d = reinterpret_cast<const kl_vec<%s, %d> *>(in%d)[q];\n",
                cn_ctype(k->bufs[b].dtype), vw, b, cn_ctype(k->bufs[b].dtype), vw, b);
        for (int b = k->ninputs; b < nb; b++) put(o, "            kl_vec<%s, %d> s%d;\n", cn_ctype(k->bufs[b].dtype), vw, b);
        put(o, "#pragma unroll\n            for (int u = 0; u < %d; u++) {\n", vw);
        e->ind = "                ";
        e->vec = 1;
        put_body(e);
        e->vec = 0;
        put(o, "            }\n");
        for (int b = k->ninputs; b < nb; b++)
            put(o, "            reinterpret_cast<kl_vec<%s, %d> *>(out%d)[q] = s%d;\n", cn_ctype(k->bufs[b].dtype), vw,
                b - k->ninputs, b);
        put(o, "        }\n    }\n");
        start = "kl_head + ";
    }
    put(o, "    for (%s i = %sblockIdx.x * (%s)blockDim.x + threadIdx.x; i < %s; i += (%s)gridDim.x * blockDim.x) {\n",
        it, start, it, bound, it);
    if (need_idx && k->ndim > 0) {
        put(o, "        /* the domain index, for the buffers that are not flat */\n        %s r = i;\n", it);
        for (int d = k->ndim - 1; d > 0; d--) {
            if (e->dyn) put(o, "        const %s i%d = r %% kl_d.shape[%d]; r /= kl_d.shape[%d];\n", it, d, d, d);
            else put(o, "        const %s i%d = r %% %" PRId64 "; r /= %" PRId64 ";\n", it, d, k->shape[d], k->shape[d]);
        }
        put(o, "        const %s i0 = r;\n", it);
    }
    e->ind = "        ";
    put_body(e);
    put(o, "    }\n");
    put_epilogue(e, name);
    return 0;
}

/* A store of statement s (STORE) in a row kernel. */
static void put_row_store(emit *e, int s) {
    const ir_kernel *k = e->k;
    const ir_kstmt *st = &k->stmts[s];
    char tmp[16], v[16];
    snprintf(v, sizeof v, "v%d", st->args[0]);
    put(e->o, "%s/* STORE %s */\n%s", e->ind, bufname(k, st->buf, tmp), e->ind);
    put_access(e, st->buf);
    put(e->o, " = ");
    put_conv(e->o, st->dtype, k->stmts[st->args[0]].dtype, v);
    put(e->o, ";\n");
}

/* Whether element statement s (not a row value) is an element output of
 * the row kernel: a STORE to a buffer that varies along the row. */
static int elem_store(const ir_kernel *k, int s) {
    const ir_kstmt *st = &k->stmts[s];
    return st->kind == IR_K_STORE && k->bufs[st->buf].index[k->ndim - 1] != 0;
}

/* Whether buffer b is the same for every row (a weight or bias read along
 * the row): every outer dim broadcast. Such a buffer stays in L1/L2 across
 * rows, so it is not worth registers. */
static int row_invariant(const ir_kernel *k, int b) {
    if (numel(k, k->ndim - 1) <= 1) return 0;
    for (int d = 0; d < k->ndim - 1; d++)
        if (k->bufs[b].index[d] && k->shape[d] != 1) return 0;
    return 1;
}

int cn_row_cache(const ir_kernel *k, uint8_t *cached) {
    if (!k->row || k->ndim < 1) return 0;
    uint8_t *need = calloc((size_t)k->nstmts, 1), *uses = calloc((size_t)k->nstmts, 1);
    if (!need || !uses) {
        free(need);
        free(uses);
        return 0;
    }
    /* how many passes over the row (each REDUCE, then the element outputs) read each LOAD */
    int outs = 0;
    for (int s = 0; s <= k->nstmts; s++) {
        memset(need, 0, (size_t)k->nstmts);
        if (s < k->nstmts) {
            if (k->stmts[s].kind != IR_K_REDUCE) continue;
            mark(k, k->stmts[s].args[0], need);
        } else {
            for (int t = 0; t < k->nstmts; t++)
                if (elem_store(k, t)) {
                    mark(k, k->stmts[t].args[0], need);
                    outs = 1;
                }
            if (!outs) break;
        }
        /* a two-pass reduction (var, logsumexp) reads its operand twice */
        const ke_rd_op *ro = s < k->nstmts ? ke_ops[k->stmts[s].op].impl : NULL;
        const int passes = ro && ro->pre ? 2 : 1;
        for (int t = 0; t < k->nstmts; t++)
            if (need[t] && k->stmts[t].kind == IR_K_LOAD) uses[t] = (uint8_t)(uses[t] + passes > 255 ? 255 : uses[t] + passes);
    }
    int words = 0;
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        int c = st->kind == IR_K_LOAD && !st->row && uses[s] >= 2 && !row_invariant(k, st->buf);
        if (cached) cached[s] = (uint8_t)c;
        if (c) words += ke_dtypes[st->dtype].size > 4 ? 2 : 1;
    }
    free(need);
    free(uses);
    /* at most ~8-16 registers of cached values a thread: 16 values made
     * ptxas use 104-124 registers for layer_norm (64 and spills for f16:
     * it hoists the weight loads of every unrolled step), 8 values 32-64 */
    int kr = !words ? 0 : words <= 2 ? CN_ROW_KR_MAX : words <= 4 ? CN_ROW_KR_MAX / 2 : words <= 8 ? CN_ROW_KR_MAX / 4 : 0;
    if (!kr && cached) memset(cached, 0, (size_t)k->nstmts);
    return kr;
}

unsigned cn_row_threads(int64_t len, int kr) {
    if (kr > 0 && len <= (int64_t)kr * CN_ROW_MAX_THREADS) {
        /* about CN_ROW_PER_THREAD values a thread, whole warps */
        int64_t t = (len + CN_ROW_PER_THREAD - 1) / CN_ROW_PER_THREAD;
        t = (t + 31) / 32 * 32;
        return (unsigned)(t < 32 ? 32 : t > CN_ROW_MAX_THREADS ? CN_ROW_MAX_THREADS : t);
    }
    return len <= 32 ? 32u : len >= 2048 ? 256u : (unsigned)CN_BLOCK;
}

/* Opens one pass over the row: the register-cached form (u-th value of the
 * thread, unrolled: the cache arrays stay in registers) or the strided loop
 * reading global memory. Both visit j = threadIdx.x, + blockDim.x, ... in
 * that order, so a fold gives the same bits either way. */
static void open_pass(emit *e, int kr, int cached) {
    if (cached) {
        put(e->o, "#pragma unroll\n            for (int u = 0; u < %d; u++) {\n"
                  "                const int64_t j = threadIdx.x + (int64_t)u * blockDim.x;\n"
                  "                (void)j;\n                if (j >= cnt) break;\n", kr);
        e->ind = "                ";
    } else {
        put(e->o, "            for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {\n");
        e->ind = "                ";
    }
    e->incache = cached;
}

static void close_pass(emit *e) {
    put(e->o, "            }\n");
    e->incache = 0;
}

/* A double as a C literal that reads back exactly. */
static void put_double(cn_buf *o, double v) {
    if (v != v) put(o, "(double)NAN");
    else if (v == INFINITY || v == -INFINITY) put(o, "%s(double)INFINITY", v < 0 ? "-" : "");
    else put(o, "%.17g", v);
}

/* Folds v<s>'s operand over the row into acc<tag><s> with formula F in
 * accumulator type A (the strided and, with kr, the register-cached form),
 * then across the block (warp shuffles, the warps' partials in sh<tag><s>):
 * every thread ends with the row's accumulator. aux: the name prefix of the
 * first pass's value (aux<s>) when F reads one, else NULL. */
static void put_fold(emit *e, int s, const char *tag, const char *F, const char *A, const char *aux, int kr,
                     const uint8_t *need) {
    const ir_kernel *k = e->k;
    const ir_kstmt *st = &k->stmts[s];
    cn_buf *o = e->o;
    char v[16];
    snprintf(v, sizeof v, "v%d", st->args[0]);
    put(o, "        %s acc%s%d = %s_INIT(%s);\n", A, tag, s, F, A);
    for (int form = kr ? 1 : 0; form >= 0; form--) {
        if (kr) put(o, form ? "        if (kl_cached) {\n" : "        } else {\n");
        else put(o, "        {\n");
        if (aux) put(o, "            const %s aux = %s%d;\n", A, aux, s);
        put(o, "            const double p = p%d; (void)p;\n", s);
        open_pass(e, kr, form);
        put_needed(e, need);
        put(o, "%sconst %s x = ", e->ind, cn_ctype(st->compute));
        put_conv(o, st->compute, k->stmts[st->args[0]].dtype, v);
        put(o, ";\n%sacc%s%d = %s_STEP(%s, acc%s%d, x);\n", e->ind, tag, s, F, A, tag, s);
        close_pass(e);
    }
    put(o, "        }\n");
    put(o, "        /* the block's fold: warp shuffles, then the warps' partials */\n");
    put(o, "        for (int m = 16; m > 0; m >>= 1) acc%s%d = %s_MERGE(%s, acc%s%d, kl_shfl_xor(acc%s%d, m));\n", tag, s,
        F, A, tag, s, tag, s);
    put(o, "        if (lane == 0) sh%s%d[warp] = acc%s%d;\n        __syncthreads();\n", tag, s, tag, s);
    put(o, "        if (warp == 0) {\n            acc%s%d = lane < nwarps ? sh%s%d[lane] : %s_INIT(%s);\n", tag, s, tag,
        s, F, A);
    put(o, "            for (int m = 16; m > 0; m >>= 1) acc%s%d = %s_MERGE(%s, acc%s%d, kl_shfl_xor(acc%s%d, m));\n", tag,
        s, F, A, tag, s, tag, s);
    put(o, "            if (lane == 0) sh%s%d[0] = acc%s%d;\n        }\n        __syncthreads();\n", tag, s, tag, s);
    put(o, "        acc%s%d = sh%s%d[0];\n        __syncthreads(); /* sh%s%d is read before the next row reuses it */\n",
        tag, s, tag, s, tag, s);
}

static int emit_row(emit *e, const char *name, const char *it) {
    const ir_kernel *k = e->k;
    cn_buf *o = e->o;
    const int nd = k->ndim, nb = k->ninputs + k->noutputs;
    const int64_t rows = numel(k, nd - 1), len = k->shape[nd - 1];
    uint8_t *need = calloc((size_t)k->nstmts, 1), *cached = calloc((size_t)k->nstmts, 1);
    if (!need || !cached) {
        free(need);
        free(cached);
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    }
    int kr = cn_row_cache(k, cached);
    if (!e->dyn && len > (int64_t)kr * CN_ROW_MAX_THREADS) kr = 0; /* never fits: no cached form */
    if (!kr) memset(cached, 0, (size_t)k->nstmts);
    e->cached = cached;
    put_params(e, name);
    put_prologue(e);
    for (int s = 0; s < k->nstmts; s++)
        if (k->stmts[s].kind == IR_K_REDUCE) {
            int r = rd_find(&k->stmts[s]);
            put(o, "    __shared__ %s sh%d[32]; /* per-warp partials of v%d */\n", rd_acc(rd_table[r].kind, k->stmts[s].compute), s, s);
            if (rd_table[r].pre)
                put(o, "    __shared__ %s shp%d[32]; /* per-warp partials of v%d's first pass */\n",
                    rd_acc(rd_table[r].pre_kind, k->stmts[s].compute), s, s);
        }
    put(o, "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;\n");
    if (e->dyn) put(o, "    const int64_t cnt = kl_d.shape[1]; /* elements per row */\n");
    else put(o, "    const int64_t cnt = %" PRId64 "; /* elements per row */\n", len);
    put(o, "    (void)lane, (void)warp, (void)nwarps, (void)cnt;\n");
    if (kr)
        put(o, "    /* rows of up to %d values a thread are read from global memory once, into registers\n"
               "       (kc<s>), and every pass works on those; longer rows take the strided passes */\n"
               "    const bool kl_cached = cnt <= (int64_t)%d * blockDim.x;\n", kr, kr);
    if (e->dyn) put(o, "    for (%s row = blockIdx.x; row < kl_d.shape[0]; row += gridDim.x) {\n", it);
    else put(o, "    for (%s row = blockIdx.x; row < %" PRId64 "; row += gridDim.x) {\n", it, rows);
    put(o, "        /* the row's index, and each buffer's offset of the row's first element */\n        %s r = row;\n", it);
    for (int d = nd - 2; d > 0; d--) put(o, "        const %s i%d = r %% %" PRId64 "; r /= %" PRId64 ";\n", it, d, k->shape[d], k->shape[d]);
    if (nd >= 2) put(o, "        const %s i0 = r;\n", it);
    put(o, "        (void)r;\n");
    for (int b = 0; b < nb; b++) {
        put(o, "        const %s rb%d = ", it, b);
        if (e->dyn) put(o, "i0 * kl_d.index[%d][0]", b);
        else put_offset(o, k, b, 0, nd - 1);
        put(o, "; (void)rb%d;\n", b);
    }
    if (kr) {
        put(o, "        /* the cached loads: the row's values of this thread */\n");
        for (int s = 0; s < k->nstmts; s++)
            if (cached[s]) put(o, "        %s kc%d[%d];\n", cn_ctype(k->stmts[s].dtype), s, kr);
        put(o, "        if (kl_cached) {\n");
        open_pass(e, kr, 1);
        for (int s = 0; s < k->nstmts; s++)
            if (cached[s]) {
                put(o, "%skc%d[u] = ", e->ind, s);
                put_access(e, k->stmts[s].buf);
                put(o, ";\n");
            }
        close_pass(e);
        put(o, "        }\n");
    }
    for (int s = 0; s < k->nstmts; s++) {
        const ir_kstmt *st = &k->stmts[s];
        if (st->kind == IR_K_REDUCE) {
            const int r = rd_find(st);
            const char *F = rd_table[r].formula, *A = rd_acc(rd_table[r].kind, st->compute);
            const ke_rd_op *ro = ke_ops[st->op].impl;
            const ke_rd_kernel *rk = ro->k[st->compute];
            memset(need, 0, (size_t)k->nstmts);
            mark(k, st->args[0], need);
            put(o, "        /* v%d = REDUCE %s(v%d) over the row, in %s */\n", s, ke_ops[st->op].name, st->args[0],
                ke_dtypes[st->compute].name);
            /* the formulas' scalar (var's correction) and, for two-pass ones, the first pass's value */
            put(o, "        const double p%d = ", s);
            put_double(o, ke_attr_reduce_param(&st->a));
            put(o, "; (void)p%d;\n", s);
            if (rd_table[r].pre) {
                const char *PF = rd_table[r].pre, *PA = rd_acc(rd_table[r].pre_kind, st->compute);
                const ke_rd_kernel *pk = ro->pre->k[st->compute];
                put(o, "        /* first pass: %s of the row */\n", PF);
                put_fold(e, s, "p", PF, PA, NULL, kr, need);
                put(o, "        %s aux%d = (%s)(%s)%s_FIN(%s, accp%d);\n", A, s, A, cn_ctype(pk->vdt), PF, PA, s);
                if (ro->pre_inf_to_zero)
                    put(o, "        if (aux%d == (%s)INFINITY || aux%d == -(%s)INFINITY) aux%d = 0; /* shift an infinite max by 0 */\n",
                        s, A, s, A, s);
            }
            put_fold(e, s, "", F, A, rd_table[r].pre ? "aux" : NULL, kr, need);
            char fin[160];
            snprintf(fin, sizeof fin, "(%s)%s_FIN(%s, acc%d)", cn_ctype(rk->vdt), F, A, s);
            put(o, "        %s v%d;\n        {\n            const double p = p%d; (void)p;\n", cn_ctype(st->dtype), s, s);
            if (rd_table[r].pre) put(o, "            const %s aux = aux%d;\n", A, s);
            put(o, "            v%d = ", s);
            put_conv(o, st->dtype, rk->vdt, fin);
            put(o, ";\n        }\n");
        } else if ((st->kind == IR_K_OP || st->kind == IR_K_LOAD) && st->row) {
            /* a row value: once per row, by every thread */
            e->ind = "        ";
            put_stmt(e, s);
        } else if (st->kind == IR_K_STORE && !elem_store(k, s)) {
            /* a row-shaped output: one element per row */
            put(o, "        if (threadIdx.x == 0) {\n");
            e->ind = "            ";
            put_row_store(e, s);
            put(o, "        }\n");
        }
    }
    /* the element outputs: one last pass over the row */
    memset(need, 0, (size_t)k->nstmts);
    int stores = 0;
    for (int s = 0; s < k->nstmts; s++)
        if (elem_store(k, s)) {
            mark(k, k->stmts[s].args[0], need);
            stores++;
        }
    if (stores) {
        put(o, "        /* the element outputs */\n");
        for (int form = kr ? 1 : 0; form >= 0; form--) {
            if (kr) put(o, form ? "        if (kl_cached) {\n" : "        } else {\n");
            else put(o, "        {\n");
            open_pass(e, kr, form);
            put_needed(e, need);
            for (int s = 0; s < k->nstmts; s++)
                if (elem_store(k, s)) put_row_store(e, s);
            close_pass(e);
        }
        put(o, "        }\n");
    }
    put(o, "    }\n");
    put_epilogue(e, name);
    e->cached = NULL;
    free(need);
    free(cached);
    return 0;
}

/* ---- programs ---------------------------------------------------------------------- */

void cn_launch_of(const ir_kernel *k, cn_launch *l) {
    memset(l, 0, sizeof *l);
    l->grid[1] = l->grid[2] = l->block[1] = l->block[2] = 1;
    if (k->row && k->ndim > 0) {
        int64_t rows = numel(k, k->ndim - 1), len = k->shape[k->ndim - 1];
        l->block[0] = cn_row_threads(len, cn_row_cache(k, NULL));
        l->grid[0] = (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
    } else {
        int64_t n = numel(k, k->ndim), blocks = (n + CN_BLOCK - 1) / CN_BLOCK;
        l->block[0] = CN_BLOCK;
        /* a grid-stride loop: more blocks than the device runs at once buy nothing */
        l->grid[0] = (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
    }
}

const char cn_prelude_row[] =
    "/* row kernels launch with up to CN_ROW_MAX_THREADS threads: ptxas keeps their registers within that */\n"
    "#ifdef KL_EMU\n#define KL_ROW_BOUNDS\n#else\n#define KL_ROW_BOUNDS __launch_bounds__(" CN_STR(CN_ROW_MAX_THREADS) ")\n#endif\n"
    "/* warp shuffles of every accumulator type (uint8_t through int) */\n"
    "template <typename T> static __device__ __forceinline__ T kl_shfl_xor(T v, int m) {\n"
    "    return __shfl_xor_sync(0xffffffffu, v, m);\n"
    "}\n"
    "static __device__ __forceinline__ uint8_t kl_shfl_xor(uint8_t v, int m) {\n"
    "    return (uint8_t)__shfl_xor_sync(0xffffffffu, (int)v, m);\n"
    "}\n\n";

static int emit_program(const ir_kernel *const *ks, const char *const *names, int n, int dyn, unsigned byval,
                        char **src) {
    *src = NULL;
    unsigned files = 0;
    int any_row = 0;
    for (int i = 0; i < n; i++) {
        if (check_kernel(ks[i], &files)) return -1;
        any_row |= ks[i]->row;
        for (const char *c = names[i]; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_'))
                return ke_err(KL_ERR_ARG, "compile", "nvrtc backend: bad kernel name '%s'", names[i]);
    }
    cn_buf o = {0};
    put(&o, "/* Generated by Kiln (src/codegen_nvrtc/cn_emit.c) from kernel IR. The math is the\n"
            " * eager CPU formulas, #included from the files the CPU compiles. */\n");
    put(&o, "#define KL_MAX_DIMS %d\n#include \"kiln_cuda.h\"\n#include \"dtype_conv.h\"\n", KL_MAX_DIMS);
    for (unsigned f = 0; f < 4; f++)
        if (files & (1u << f)) put(&o, "#include \"%s\"\n", inc_files[f]);
    put(&o, "\n");
    put(&o, "/* n elements of T as one aligned access (16 bytes at most) */\n"
            "template <typename T, int N> struct alignas(sizeof(T) * N) kl_vec {\n    T v[N];\n};\n\n");
    if (any_row) put(&o, "%s", cn_prelude_row);
    if (dyn)
        put(&o, "/* the run-time shape: elements, domain shape, each buffer's strides over the domain (cn_dims) */\n"
                "struct kl_dims {\n    long long n;\n    long long shape[KL_MAX_DIMS];\n"
                "    long long index[%d][KL_MAX_DIMS];\n};\n\n", CN_DYN_BUFS);
    for (int i = 0; i < n; i++) {
        const ir_kernel *k = ks[i];
        emit e = {.k = k, .o = &o, .ind = "        ", .dyn = dyn, .byval = byval};
        const char *it = fits32(k) && !dyn ? "int" : "long long";
        if (dyn == CN_DYN_ROW)
            put(&o, "/* %s: row kernel over [rows, cnt] (one block per row, the last dim reduced), shape and strides at "
                    "run time (kl_d) */\n", names[i]);
        else if (dyn) put(&o, "/* %s: elementwise kernel of rank %d, shape and strides at run time (kl_d)%s */\n", names[i],
                     k->ndim, dyn == CN_DYN_FLAT ? ", every buffer flat or one element" : "");
        else put_shape_comment(&o, k, names[i]);
        int rc = k->row ? emit_row(&e, names[i], it) : emit_elementwise(&e, names[i], it);
        if (rc) {
            free(o.p);
            return -1;
        }
    }
    if (o.oom) {
        free(o.p);
        return ke_err(KL_ERR_OOM, "compile", "out of memory generating CUDA C");
    }
    *src = o.p;
    return 0;
}

int cn_emit_program(const ir_kernel *const *ks, const char *const *names, int n, char **src) {
    return emit_program(ks, names, n, 0, 0, src);
}

int cn_dyn_class(const ir_kernel *k) {
    if (k->row || k->ninputs + k->noutputs > CN_DYN_BUFS) return 0;
    for (int b = 0; b < k->ninputs + k->noutputs; b++)
        if (!flat(k, b) && !all_zero(k, b)) return CN_DYN_STRIDED;
    return CN_DYN_FLAT;
}

void cn_dims_of(const ir_kernel *k, cn_dims *d) {
    memset(d, 0, sizeof *d);
    d->n = numel(k, k->ndim);
    for (int i = 0; i < k->ndim; i++) d->shape[i] = k->shape[i];
    for (int b = 0; b < k->ninputs + k->noutputs && b < CN_DYN_BUFS; b++)
        for (int i = 0; i < k->ndim; i++) d->index[b][i] = k->shape[i] == 1 ? 0 : k->bufs[b].index[i];
}

int cn_emit_kernel_dyn(const ir_kernel *k, const char *name, cn_kernel_src *out) {
    return cn_emit_kernel_dyn_byval(k, name, 0, out);
}

int cn_emit_kernel_dyn_byval(const ir_kernel *k, const char *name, unsigned byval, cn_kernel_src *out) {
    memset(out, 0, sizeof *out);
    int dyn = cn_dyn_class(k);
    if (!dyn) return ke_err(KL_ERR_INTERNAL, "compile", "nvrtc backend: no run-time-shape form for this kernel");
    if (strlen(name) >= sizeof out->name) return ke_err(KL_ERR_ARG, "compile", "nvrtc backend: kernel name too long");
    if (emit_program(&k, &name, 1, dyn, byval, &out->src)) return -1;
    strcpy(out->name, name);
    cn_launch_of(k, &out->launch);
    out->index64 = 1;
    return 0;
}

int cn_emit_kernel(const ir_kernel *k, const char *name, cn_kernel_src *out) {
    memset(out, 0, sizeof *out);
    if (strlen(name) >= sizeof out->name) return ke_err(KL_ERR_ARG, "compile", "nvrtc backend: kernel name too long");
    if (cn_emit_program(&k, &name, 1, &out->src)) return -1;
    strcpy(out->name, name);
    cn_launch_of(k, &out->launch);
    out->index64 = !fits32(k);
    return 0;
}

int cn_emit_row_dyn(const ir_kernel *k, const char *name, unsigned byval, cn_kernel_src *out) {
    memset(out, 0, sizeof *out);
    if (!k->row || k->ndim != 2 || k->ninputs + k->noutputs > CN_DYN_BUFS)
        return ke_err(KL_ERR_INTERNAL, "compile", "nvrtc backend: no run-time-shape form for this row kernel");
    if (strlen(name) >= sizeof out->name) return ke_err(KL_ERR_ARG, "compile", "nvrtc backend: kernel name too long");
    if (emit_program(&k, &name, 1, CN_DYN_ROW, byval, &out->src)) return -1;
    strcpy(out->name, name);
    cn_launch_of(k, &out->launch);
    out->index64 = 1;
    return 0;
}

void cn_kernel_src_free(cn_kernel_src *s) {
    if (!s) return;
    free(s->src);
    memset(s, 0, sizeof *s);
}
