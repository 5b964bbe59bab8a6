/*
 * test_cuda_codegen.c — kernel IR -> CUDA C (src/codegen_nvrtc/cn_emit.c):
 * every elementwise op row and every compute dtype its impl has yields a
 * device function (the eager formula compiled for the device); NVRTC +
 * ptxas compile, for sm_80 and sm_90, each op's one-op kernel in every
 * compute dtype (and f16/bf16 storage, broadcast and strided operands), row
 * kernels for every foldable reduction (the two-pass var, std and logsumexp
 * too), and the kernels kl_compile makes of
 * fusion-test style programs (captured by a CPU backend that generates their
 * CUDA C and then runs them with the interpreter, whose results are checked
 * against eager). A compile failure prints the source; a kernel that spills
 * registers fails. Golden text for a small kernel. Compiles skip with a
 * message where NVRTC is missing; the generation tests always run.
 */
#include "harness.h"

#include "cuda_harness.h"

#include "../src/codegen_nvrtc/cn.h"
#include "../src/codegen_nvrtc/cuda_api.h"
#include "ew.h"
#include "kernels_reduce.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>

static const char *OP = "cuda_codegen_test";

static int have_nvrtc(void) {
    if (ku_nvrtc_available(OP)) return 1;
    print_message("skipped: %s\n", kl_last_error());
    kl_clear_error();
    return 0;
}

/* Compiles src for sm_80 and sm_90: no error, no spill. Prints the source
 * and NVRTC's log on failure. */
static int compiled_kernels, compiled_programs, max_registers;
static void compile_both(const char *src, const char *what, int nkernels) {
    static const int arch[2] = {80, 90};
    for (int a = 0; a < 2; a++) {
        ku_cubin c;
        if (ku_nvrtc_compile(OP, src, what, arch[a], &c) != 0) {
            print_error("NVRTC failed on %s for sm_%d:\n%s\n---- source ----\n%s\n", what, arch[a], kl_last_error(), src);
            fail();
        }
        if (c.spill_bytes > 0) {
            print_error("%s spills %d bytes on sm_%d (registers %d):\n%s\n", what, c.spill_bytes, arch[a], c.registers,
                        c.log);
            fail();
        }
        assert_true(c.size > 0);
        if (c.registers > max_registers) max_registers = c.registers;
        ku_cubin_free(&c);
    }
    compiled_kernels += nkernels;
    compiled_programs++;
}

/* ---- one-op kernels built by hand ----------------------------------------------------- */

/* A one-op elementwise kernel over [3, 5]: operand 0 strided (a transposed
 * [5, 3] view), the others broadcast along dim 0, operands stored in `sd`
 * (the compute dtype unless f16/bf16 storage is asked for). */
typedef struct kbuild {
    ir_kernel k;
    ir_kbuf bufs[6];
    ir_kstmt stmts[10];
} kbuild;

static void one_op_kernel_shaped(kbuild *b, int op, kl_dtype compute, kl_dtype sd, unsigned bcast, int64_t d0,
                                 int64_t d1, int all_flat) {
    const ke_ew_impl *impl = ke_ops[op].impl;
    int nin = ke_ops[op].nin;
    memset(b, 0, sizeof *b);
    ir_kernel *k = &b->k;
    k->ndim = 2;
    k->shape[0] = d0;
    k->shape[1] = d1;
    k->ninputs = nin;
    k->noutputs = 1;
    k->bufs = b->bufs;
    k->stmts = b->stmts;
    for (int i = 0; i < nin; i++) {
        ir_kbuf *kb = &b->bufs[i];
        kb->dtype = (impl->bool_in >> i) & 1 ? KL_BOOL : sd;
        kb->ndim = 2;
        if ((bcast >> i) & 1) { /* one element */
            kb->index[0] = kb->index[1] = 0;
        } else if (all_flat) { /* contiguous */
            kb->index[0] = d1, kb->index[1] = 1, kb->contig_inner = 1;
        } else if (i == 0) { /* strided: a [d1, d0] buffer read transposed */
            kb->index[0] = 1, kb->index[1] = d0;
        } else { /* broadcast along dim 0 */
            kb->index[0] = 0, kb->index[1] = 1, kb->contig_inner = 1;
        }
        b->stmts[i] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = kb->dtype, .buf = i};
    }
    kl_dtype od = impl->out_bool ? KL_BOOL : sd;
    b->bufs[nin] = (ir_kbuf){.dtype = od, .ndim = 2, .output = 1, .contig_inner = 1, .index = {d1, 1}};
    ir_kstmt *s = &b->stmts[nin];
    *s = (ir_kstmt){.kind = IR_K_OP, .dtype = od, .compute = compute, .op = op, .nargs = nin, .bcast = (uint8_t)bcast};
    for (int i = 0; i < nin; i++) s->args[i] = i;
    b->stmts[nin + 1] = (ir_kstmt){.kind = IR_K_STORE, .dtype = od, .buf = nin, .nargs = 1, .args = {nin}};
    k->nstmts = nin + 2;
}

static void one_op_kernel(kbuild *b, int op, kl_dtype compute, kl_dtype sd, unsigned bcast) {
    one_op_kernel_shaped(b, op, compute, sd, bcast, 3, 5, 0);
}

/* Every elementwise row's loops have a device function, named as the loop. */
static void every_loop_has_a_device_function(void **state) {
    (void)state;
    int n = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        if (ke_ops[op].kind != KE_KIND_EW) continue;
        const ke_ew_impl *impl = ke_ops[op].impl;
        assert_non_null(impl);
        for (int d = 0; d < KL_NUM_DTYPES; d++) {
            if (!impl->loop[d]) continue;
            const char *file = NULL, *fn = cn_device_fn(op, (kl_dtype)d, &file);
            if (!fn) print_error("kl_%s in %s: %s\n", ke_ops[op].name, ke_dtypes[d].name, kl_last_error());
            assert_non_null(fn);
            assert_true(!strcmp(file, "ew_unary.c") || !strcmp(file, "ew_binary.c") || !strcmp(file, "ew_other.c"));
            n++;
        }
    }
    print_message("%d (op, compute dtype) device functions\n", n);
    assert_true(n > 200);
    /* a loop that is not an elementwise one has none */
    assert_null(cn_device_fn(KE_OP_sum, KL_F32, NULL));
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "nvrtc backend: kl_sum in float32 has no device function");
}

/* Every op x compute dtype (x f16/bf16 storage for float ops, x pow's scalar
 * exponent), many kernels per NVRTC program. */
static void one_op_kernels_compile(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    enum { MAXK = 160 };
    kbuild *kb = calloc(MAXK, sizeof *kb);
    const ir_kernel *ks[MAXK];
    char names[MAXK][48];
    const char *np[MAXK];
    int nk = 0, ops_in_batch = 0;
    for (int op = 0; op <= KE_OP_COUNT; op++) {
        int flush = op == KE_OP_COUNT || ops_in_batch == 12;
        if (flush && nk) {
            char *src = NULL;
            assert_int_equal(cn_emit_program(ks, np, nk, &src), 0);
            compile_both(src, "one_op_batch.cu", nk);
            free(src);
            nk = ops_in_batch = 0;
        }
        if (op == KE_OP_COUNT) break;
        if (ke_ops[op].kind != KE_KIND_EW) continue;
        const ke_ew_impl *impl = ke_ops[op].impl;
        ops_in_batch++;
        for (int d = 0; d < KL_NUM_DTYPES; d++) {
            if (!impl->loop[d]) continue;
            int nvar = d == KL_F32 ? 3 : 1; /* f32 compute: also f16 and bf16 storage */
            for (int v = 0; v < nvar; v++) {
                kl_dtype sd = v == 0 ? (kl_dtype)d : v == 1 ? KL_F16 : KL_BF16;
                for (int bc = 0; bc < (op == KE_OP_pow ? 2 : 1); bc++) {
                    assert_true(nk < MAXK);
                    /* operands in the compute dtype: contiguous (the 16-byte path); f16/bf16: strided, broadcast */
                    one_op_kernel_shaped(&kb[nk], op, (kl_dtype)d, sd, bc ? 2u : 0u, 64, 33, v == 0);
                    snprintf(names[nk], sizeof names[nk], "%s_%s_%s%s", ke_ops[op].name, ke_dtypes[d].short_name,
                             ke_dtypes[sd].short_name, bc ? "_scalar" : "");
                    ks[nk] = &kb[nk].k;
                    np[nk] = names[nk];
                    nk++;
                }
            }
        }
    }
    print_message("%d one-op kernels in %d programs, each for sm_80 and sm_90: no spills, at most %d registers\n",
                  compiled_kernels, compiled_programs, max_registers);
    free(kb);
}

/* A row kernel y = REDUCE(x) stored per row, and z = x - y over the row. */
static void row_kernel(kbuild *b, int op, kl_dtype in, kl_dtype compute) {
    const ke_rd_op *ro = ke_ops[op].impl;
    kl_dtype vdt = (kl_dtype)ro->k[compute]->vdt;
    memset(b, 0, sizeof *b);
    ir_kernel *k = &b->k;
    k->row = 1;
    k->ndim = 2;
    k->shape[0] = 4;
    k->shape[1] = 300;
    k->ninputs = 1;
    k->noutputs = 1;
    k->bufs = b->bufs;
    k->stmts = b->stmts;
    b->bufs[0] = (ir_kbuf){.dtype = in, .ndim = 2, .contig_inner = 1, .index = {300, 1}};
    b->bufs[1] = (ir_kbuf){.dtype = vdt, .ndim = 2, .output = 1, .row = 1, .index = {1, 0}};
    b->stmts[0] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = in, .buf = 0};
    b->stmts[1] = (ir_kstmt){.kind = IR_K_REDUCE, .dtype = vdt, .compute = compute, .row = 1, .op = op, .nargs = 1};
    b->stmts[2] = (ir_kstmt){.kind = IR_K_STORE, .dtype = vdt, .buf = 1, .nargs = 1, .args = {1}};
    k->nstmts = 3;
}

static void row_kernels_compile(void **state) {
    (void)state;
    static const int ops[] = {KE_OP_sum, KE_OP_mean, KE_OP_prod, KE_OP_amax, KE_OP_amin, KE_OP_all,
                              KE_OP_any, KE_OP_var,  KE_OP_std,  KE_OP_logsumexp};
    enum { MAXK = 64 };
    kbuild *kb = calloc(MAXK, sizeof *kb);
    const ir_kernel *ks[MAXK];
    char names[MAXK][48];
    const char *np[MAXK];
    int nk = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        const ke_rd_op *ro = ke_ops[ops[i]].impl;
        for (int d = 0; d < KL_NUM_DTYPES; d++) {
            if (!ro->k[d]) continue;
            for (int v = 0; v < (d == KL_F32 ? 2 : 1); v++) {
                kl_dtype in = v ? KL_F16 : (kl_dtype)d;
                row_kernel(&kb[nk], ops[i], in, (kl_dtype)d);
                snprintf(names[nk], sizeof names[nk], "row_%s_%s_%s", ke_ops[ops[i]].name, ke_dtypes[d].short_name,
                         ke_dtypes[in].short_name);
                ks[nk] = &kb[nk].k;
                np[nk] = names[nk];
                nk++;
            }
        }
    }
    char *src = NULL;
    assert_int_equal(cn_emit_program(ks, np, nk, &src), 0);
    assert_non_null(strstr(src, "__shfl_xor_sync"));
    assert_non_null(strstr(src, "#include \"rd_formulas.h\""));
    if (have_nvrtc()) {
        max_registers = 0;
        compile_both(src, "row_kernels.cu", nk);
        print_message("%d row kernels: no spills, at most %d registers\n", nk, max_registers);
    }
    free(src);
    /* the two-pass ones fold the row twice, the first pass's value feeding the second */
    row_kernel(&kb[0], KE_OP_logsumexp, KL_F32, KL_F32);
    cn_kernel_src ksrc;
    assert_int_equal(cn_emit_kernel(&kb[0].k, "lse_row", &ksrc), 0);
    assert_non_null(strstr(ksrc.src, "AMAX_STEP(float, accp1, x)"));
    assert_non_null(strstr(ksrc.src, "LSE_STEP(float, acc1, x)"));
    cn_kernel_src_free(&ksrc);
    /* a reduction with positions (cn_argreduce.c's kernels) is refused with a clear error */
    row_kernel(&kb[0], KE_OP_max_dim, KL_F32, KL_F32);
    assert_int_equal(cn_emit_kernel(&kb[0].k, "max_row", &ksrc), -1);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "nvrtc backend: cannot fold kl_max_dim in float32 in a row kernel");
    free(kb);
}

/* ---- kernels of compiled programs ------------------------------------------------------ */

/* A CPU backend that generates every kernel's CUDA C (kept for compiling)
 * and runs the kernel with the interpreter. */
enum { MAX_CAPTURED = 64 };
static char *captured[MAX_CAPTURED];
static int ncaptured, capture_failures;
static void *capture_compile(const ir_kernel *k) {
    cn_kernel_src s;
    if (cn_emit_kernel(k, "captured", &s) == 0) {
        if (ncaptured < MAX_CAPTURED) captured[ncaptured++] = s.src;
        else cn_kernel_src_free(&s);
    } else {
        print_error("no CUDA C for a kernel: %s\n", kl_last_error());
        capture_failures++;
        kl_clear_error();
    }
    return ir_interp_backend.compile(k);
}
static const ir_backend capture_backend = {.name = "cuda_capture",
                                           .device = KL_CPU,
                                           .priority = -100,
                                           .compile = capture_compile,
                                           .run = NULL, /* set below: the interpreter's */
                                           .free = NULL};

static int chain(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    out[0] = kl_sub(kl_exp(kl_relu(kl_add_scalar(kl_mul(in[0], in[1]), 1))), in[0]);
    return out[0] ? 0 : -1;
}
static int gelu_tanh_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *inner = kl_mul_scalar(kl_add(x, kl_mul_scalar(kl_mul(kl_mul(x, x), x), 0.044715)), 0.7978845608);
    out[0] = kl_mul(kl_mul_scalar(x, 0.5), kl_add_scalar(kl_tanh(inner), 1));
    return out[0] ? 0 : -1;
}
static int softmax_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *e = kl_exp(kl_sub(x, kl_amax(x, KL_DIMS(-1), true)));
    out[0] = kl_div(e, kl_sum(e, KL_DIMS(-1), true));
    return out[0] ? 0 : -1;
}
static int layer_norm_ops(void *u, kl_tensor *const *in, int n_in, kl_tensor **out, int n_out) {
    (void)u, (void)n_in, (void)n_out;
    kl_tensor *x = in[0];
    kl_tensor *xc = kl_sub(x, kl_mean(x, KL_DIMS(-1), true));
    kl_tensor *var = kl_mean(kl_mul(xc, xc), KL_DIMS(-1), true);
    kl_tensor *y = kl_mul(xc, kl_rsqrt(kl_add_scalar(var, 1e-5)));
    out[0] = kl_add(kl_mul(y, in[1]), in[2]);
    return out[0] ? 0 : -1;
}


static int interp_run(void *h, kl_tensor *const *in, kl_tensor *const *out) { return ir_interp_backend.run(h, in, out); }
static void interp_free(void *h) { ir_interp_backend.free(h); }

/* Compiles fn with the capturing backend, checks its results against eager
 * (tol 0: bitwise), and returns how many kernels it captured. */
static int capture(kl_traceable fn, kl_tensor **in, int n_in, int n_out, double tol) {
    int before = ncaptured;
    kl_compile_options o = kl_compile_options_default();
    o.backend = "cuda_capture";
    kl_fn *f = kl_compile(fn, NULL, &o);
    assert_non_null(f);
    kl_tensor *ref[4] = {0}, *got[4] = {0};
    if (fn(NULL, in, n_in, ref, n_out)) print_error("eager: %s\n", kl_last_error());
    assert_non_null(ref[0]);
    assert_int_equal(kl_fn_call(f, in, n_in, got, n_out), 0);
    for (int j = 0; j < n_out; j++) {
        if (tol == 0) assert_int_equal(kl_allclose(got[j], ref[j], 0, 0, true), 1);
        else assert_int_equal(kl_allclose(kl_to_dtype(got[j], KL_F64), kl_to_dtype(ref[j], KL_F64), tol, tol, true), 1);
    }
    kl_fn_release(f);
    return ncaptured - before;
}

static void compiled_program_kernels_compile(void **state) {
    (void)state;
    kl_init();
    static ir_backend b;
    b = capture_backend;
    b.run = interp_run;
    b.free = interp_free;
    assert_int_equal(ir_backend_register(&b), 0);
    kl_tensor *x = kl_reshape(seq(35, 0.37, KL_F32), KL_SHAPE(5, 7)), *w = seq(7, 0.5, KL_F32);
    kl_tensor *in2[2] = {x, w};
    assert_true(capture(chain, in2, 2, 1, 0) >= 1);
    kl_tensor *xt[2] = {kl_transpose(kl_reshape(seq(35, 0.1, KL_F64), KL_SHAPE(7, 5)), 0, 1), kl_ones(KL_SHAPE(7), KL_F64)};
    assert_true(capture(chain, xt, 2, 1, 0) >= 1);
    kl_tensor *h[2] = {kl_to_dtype(x, KL_F16), kl_to_dtype(w, KL_BF16)};
    assert_true(capture(chain, h, 2, 1, 0) >= 1);
    kl_tensor *g1[1] = {x};
    assert_true(capture(gelu_tanh_ops, g1, 1, 1, 0) >= 1);
    assert_true(capture(softmax_ops, g1, 1, 1, 1e-5) >= 1);
    kl_tensor *ln[3] = {x, w, seq(7, -0.25, KL_F32)};
    assert_true(capture(layer_norm_ops, ln, 3, 1, 1e-5) >= 1);
    assert_true(capture(kt_two_outputs, in2, 2, 2, 0) >= 1);
    kl_tensor *ii[2] = {kl_to_dtype(seq(12, 3, KL_F64), KL_I32), kl_to_dtype(seq(12, -2, KL_F64), KL_I64)};
    assert_true(capture(kt_int_ops, ii, 2, 1, 0) >= 1);
    assert_int_equal(capture_failures, 0);
    print_message("%d kernels from compiled programs\n", ncaptured);
    if (have_nvrtc()) {
        max_registers = 0;
        for (int i = 0; i < ncaptured; i++) {
            char what[32];
            snprintf(what, sizeof what, "captured_%d.cu", i);
            compile_both(captured[i], what, 1);
        }
        print_message("captured kernels: no spills, at most %d registers\n", max_registers);
    }
    for (int i = 0; i < ncaptured; i++) free(captured[i]);
    ncaptured = 0;
}

/* ---- the generated text ---------------------------------------------------------------- */

static void golden_neg_kernel(void **state) {
    (void)state;
    kbuild b;
    one_op_kernel(&b, KE_OP_neg, KL_F32, KL_F16, 0);
    cn_kernel_src s;
    assert_int_equal(cn_emit_kernel(&b.k, "neg_f16", &s), 0);
    const char *want =
        "/* neg_f16: elementwise kernel over [3, 5] */\n"
        "extern \"C\" __global__ void neg_f16(const uint16_t *in0, uint16_t *out0, int *kl_status) {\n"
        "    int kl_err = 0; /* a formula's error (KE_EW_INT_DIV_ZERO) */\n"
        "    for (int i = blockIdx.x * (int)blockDim.x + threadIdx.x; i < 15; i += (int)gridDim.x * blockDim.x) {\n"
        "        /* the domain index, for the buffers that are not flat */\n"
        "        int r = i;\n"
        "        const int i1 = r % 5; r /= 5;\n"
        "        const int i0 = r;\n"
        "        /* LOAD in0 */\n"
        "        const uint16_t v0 = in0[i0 + i1 * 3];\n"
        "        /* v1 = neg(v0) computed in float32 */\n"
        "        const uint16_t v1 = KE_CV_STORE_F16(KE_CV_LOAD_F32(neg_f32(KE_CV_STORE_F32(KE_CV_LOAD_F16(v0), 1), 0u, "
        "(const ke_attrs *)0, &kl_err)), 1);\n"
        "        /* STORE out0 */\n"
        "        out0[i] = v1;\n"
        "    }\n"
        "    if (kl_err) atomicCAS(kl_status, 0, kl_err); /* the first error wins */\n"
        "}\n"
        "KL_EMU_EXPORT(neg_f16)\n";
    const char *at = strstr(s.src, "/* neg_f16:");
    if (!at || strncmp(at, want, strlen(want)) != 0)
        print_error("---- got ----\n%s\n---- want ----\n%s\n", s.src, want);
    assert_non_null(at);
    assert_int_equal(strncmp(at, want, strlen(want)), 0);
    assert_non_null(strstr(s.src, "#include \"ew_unary.c\"\n"));
    assert_null(strstr(s.src, "ew_binary.c"));
    assert_int_equal(s.launch.block[0], CN_BLOCK);
    assert_int_equal(s.launch.grid[0], 1);
    assert_int_equal(s.index64, 0);
    cn_kernel_src_free(&s);
    /* contiguous f32 operands: 16-byte accesses when aligned, then the tail */
    one_op_kernel_shaped(&b, KE_OP_add, KL_F32, KL_F32, 0, 64, 33, 1);
    assert_int_equal(cn_emit_kernel(&b.k, "add_vec", &s), 0);
    assert_non_null(strstr(s.src, "if ((((unsigned long long)in0 | (unsigned long long)in1 | (unsigned long long)out0) & 15) == 0) {"));
    assert_non_null(strstr(s.src, "const kl_vec<float, 4> l0 = reinterpret_cast<const kl_vec<float, 4> *>(in0)[q];"));
    assert_non_null(strstr(s.src, "reinterpret_cast<kl_vec<float, 4> *>(out0)[q] = s2;"));
    assert_non_null(strstr(s.src, "for (int i = kl_head + blockIdx.x"));
    cn_kernel_src_free(&s);
    /* past 2^31 elements, 64-bit index math */
    one_op_kernel(&b, KE_OP_neg, KL_F32, KL_F16, 0);
    b.k.shape[0] = 1 << 20;
    b.k.shape[1] = 1 << 12;
    b.bufs[0].index[1] = 1 << 20;
    assert_int_equal(cn_emit_kernel(&b.k, "neg_big", &s), 0);
    assert_int_equal(s.index64, 1);
    assert_non_null(strstr(s.src, "for (long long i = "));
    assert_int_equal(s.launch.grid[0], 65535);
    cn_kernel_src_free(&s);
}

/* The backend is registered for CUDA. Its compile loads the module on the
 * kernel's device, so without one it fails with the reason (launching is
 * tested on the emulated device by test_cuda_compile). */
static void backend_is_registered(void **state) {
    (void)state;
    kl_init();
    const ir_backend *b = ir_backend_by_name("nvrtc");
    assert_ptr_equal(b, &cn_nvrtc_backend);
    assert_ptr_equal(ir_backend_for_device(KL_CUDA), b);
    if (kl_cuda_is_available()) return;
    kbuild kb;
    one_op_kernel(&kb, KE_OP_add, KL_F32, KL_F32, 0);
    kb.k.device = (kl_device){KL_CUDA, 0};
    assert_null(b->compile(&kb.k));
    KT_EXPECT_ERROR(KL_ERR_DEVICE, "CUDA not available");
}

/* Run-time-shape kernels (eager's one-op kernels): one source for every
 * shape of a layout class, and it compiles. */
static void dyn_kernels_are_shape_free(void **state) {
    (void)state;
    kbuild a, b;
    cn_kernel_src sa, sb;
    for (int all_flat = 1; all_flat >= 0; all_flat--) {
        one_op_kernel_shaped(&a, KE_OP_add, KL_F32, KL_F32, 0, 3, 5, all_flat);
        one_op_kernel_shaped(&b, KE_OP_add, KL_F32, KL_F32, 0, 64, 33, all_flat);
        assert_int_equal(cn_dyn_class(&a.k), all_flat ? CN_DYN_FLAT : CN_DYN_STRIDED);
        assert_int_equal(cn_emit_kernel_dyn(&a.k, "dyn", &sa), 0);
        assert_int_equal(cn_emit_kernel_dyn(&b.k, "dyn", &sb), 0);
        assert_string_equal(sa.src, sb.src);
        assert_non_null(strstr(sa.src, "const kl_dims kl_d"));
        /* the launch configuration still follows the shape */
        assert_int_equal(sa.launch.grid[0], 1);
        assert_int_equal(sb.launch.grid[0], (64 * 33 + CN_BLOCK - 1) / CN_BLOCK);
        cn_dims d;
        cn_dims_of(&b.k, &d);
        assert_int_equal(d.n, 64 * 33);
        assert_int_equal(d.index[0][1], all_flat ? 1 : 64);
        if (have_nvrtc()) compile_both(sa.src, "dyn.cu", 1);
        cn_kernel_src_free(&sa);
        cn_kernel_src_free(&sb);
    }
    /* a one-element operand stays in the flat class, read at [0] */
    one_op_kernel_shaped(&a, KE_OP_add, KL_F32, KL_F32, 2, 8, 8, 1);
    assert_int_equal(cn_dyn_class(&a.k), CN_DYN_FLAT);
    assert_int_equal(cn_emit_kernel_dyn(&a.k, "dyn", &sa), 0);
    assert_non_null(strstr(sa.src, "in1[0]"));
    cn_kernel_src_free(&sa);
    /* row kernels have no such form */
    row_kernel(&a, KE_OP_sum, KL_F32, KL_F32);
    assert_int_equal(cn_dyn_class(&a.k), 0);
}

/* The hand-written kernels of the eager CUDA ops (cn_argreduce.c, cn_index.c):
 * every program they generate, for sm_80 and sm_90, no spills. */
static void handwritten_kernels_compile(void **state) {
    (void)state;
    if (!have_nvrtc()) return;
    max_registers = compiled_programs = 0;
    for (int d = 0; d < KL_NUM_DTYPES; d++) {
        const kl_dtype cd = d == KL_BOOL ? KL_U8 : ke_compute_dtype((kl_dtype)d);
        for (int k = 0; k < 2; k++) {
            char *src = cn_argreduce_source(k ? KE_OP_argmin : KE_OP_argmax, (kl_dtype)d, cd), what[64];
            assert_non_null(src);
            snprintf(what, sizeof what, "arg%s_%s.cu", k ? "min" : "max", ke_dtypes[d].short_name);
            compile_both(src, what, 2);
            free(src);
            src = cn_index_source((kl_dtype)d, k ? KL_I32 : KL_I64);
            assert_non_null(src);
            snprintf(what, sizeof what, "index_%s_%s.cu", ke_dtypes[d].short_name, k ? "i32" : "i64");
            compile_both(src, what, 11);
            free(src);
        }
    }
    print_message("%d hand-written programs: no spills, at most %d registers\n", compiled_programs, max_registers);
    assert_int_equal(compiled_programs, 4 * KL_NUM_DTYPES);
}

/* Row kernels that read an input in several passes hold it in registers
 * (cn_row_cache): the eager fused softmax / norm kernels in every float
 * dtype cache x (CN_ROW_KR_MAX values a thread, what their launches
 * assume), not the weight and bias (read by every row, L1-resident), and
 * compile for sm_80 and sm_90 without spills under their launch bounds; a
 * one-pass reduction caches nothing; the block size follows the row length,
 * and a static row kernel longer than the cache takes the strided passes only. */
static void row_kernels_cache_their_rows(void **state) {
    (void)state;
    static const int ops[] = {KE_OP_softmax, KE_OP_log_softmax, KE_OP_layer_norm, KE_OP_rms_norm};
    static const kl_dtype fd[] = {KL_F32, KL_F64, KL_F16, KL_BF16};
    const int nvrtc = have_nvrtc();
    max_registers = compiled_programs = 0;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        for (int d = 0; d < 4; d++)
            for (int wb = 0; wb < (ops[i] == KE_OP_layer_norm ? 3 : ops[i] == KE_OP_rms_norm ? 2 : 1); wb++) {
                const int has_w = wb >= 1, has_b = wb == 2;
                assert_int_equal(cn_fused_row_program(ops[i], fd[d], has_w, has_b, NULL), CN_ROW_KR_MAX);
                cn_kernel_src src;
                assert_int_equal(cn_fused_row_program(ops[i], fd[d], has_w, has_b, &src), 0);
                assert_non_null(strstr(src.src, "const bool kl_cached = cnt <= (int64_t)" CN_STR(CN_ROW_KR_MAX) " * blockDim.x;"));
                assert_non_null(strstr(src.src, "kc0[u] = in0[")); /* x, read once */
                assert_null(strstr(src.src, "kc1[")); /* weight / bias / eps: not cached */
                assert_non_null(strstr(src.src, "KL_ROW_BOUNDS kl_row("));
                if (nvrtc) {
                    char what[64];
                    snprintf(what, sizeof what, "%s_%s_%d.cu", ke_ops[ops[i]].name, ke_dtypes[fd[d]].short_name, wb);
                    compile_both(src.src, what, 1);
                }
                cn_kernel_src_free(&src);
            }
    if (nvrtc) print_message("%d fused row programs: no spills, at most %d registers\n", compiled_programs, max_registers);
    /* a one-pass reduction reads each element once anyway */
    kbuild b;
    row_kernel(&b, KE_OP_sum, KL_F32, KL_F32);
    assert_int_equal(cn_row_cache(&b.k, NULL), 0);
    /* block sizes: about 8 values a thread, whole warps, up to 512; past 8 * 512 the old rule */
    assert_int_equal(CN_ROW_KR_MAX * CN_ROW_MAX_THREADS, 4096);
    static const int64_t lens[] = {1, 31, 32, 33, 127, 128, 129, 1000, 2048, 4095, 4096, 4097};
    static const unsigned want[] = {32, 32, 32, 32, 32, 32, 32, 128, 256, 512, 512, 256};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        assert_int_equal(cn_row_threads(lens[i], CN_ROW_KR_MAX), want[i]);
        assert_true(lens[i] > (int64_t)CN_ROW_KR_MAX * CN_ROW_MAX_THREADS ||
                    lens[i] <= (int64_t)CN_ROW_KR_MAX * cn_row_threads(lens[i], CN_ROW_KR_MAX));
    }
    assert_int_equal(cn_row_threads(4096, 0), 256);
    assert_int_equal(cn_row_threads(100, 0), CN_BLOCK);
    /* a static softmax-like row kernel (x read by the max and the output
     * pass): cached up to 8 * 512, not past it */
    for (int big = 0; big < 2; big++) {
        row_kernel(&b, KE_OP_amax, KL_F32, KL_F32);
        const int64_t len = big ? 4097 : 4096;
        b.k.shape[1] = len;
        b.bufs[0].index[0] = len;
        b.bufs[2] = (ir_kbuf){.dtype = KL_F32, .ndim = 2, .output = 1, .contig_inner = 1, .index = {len, 1}};
        b.k.noutputs = 2;
        b.stmts[3] = (ir_kstmt){.kind = IR_K_OP, .dtype = KL_F32, .compute = KL_F32, .op = KE_OP_sub, .nargs = 2,
                                .args = {0, 1}};
        b.stmts[4] = (ir_kstmt){.kind = IR_K_STORE, .dtype = KL_F32, .buf = 2, .nargs = 1, .args = {3}};
        b.k.nstmts = 5;
        assert_int_equal(cn_row_cache(&b.k, NULL), CN_ROW_KR_MAX);
        cn_kernel_src src;
        assert_int_equal(cn_emit_kernel(&b.k, "rowc", &src), 0);
        assert_int_equal(src.launch.block[0], big ? 256 : 512);
        if (big) assert_null(strstr(src.src, "kl_cached"));
        else assert_non_null(strstr(src.src, "kc0[u]"));
        if (nvrtc) compile_both(src.src, "rowc.cu", 1);
        cn_kernel_src_free(&src);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_loop_has_a_device_function),
        cmocka_unit_test(golden_neg_kernel),
        cmocka_unit_test(backend_is_registered),
        cmocka_unit_test(dyn_kernels_are_shape_free),
        cmocka_unit_test(one_op_kernels_compile),
        cmocka_unit_test(row_kernels_compile),
        cmocka_unit_test(row_kernels_cache_their_rows),
        cmocka_unit_test(compiled_program_kernels_compile),
        cmocka_unit_test(handwritten_kernels_compile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
