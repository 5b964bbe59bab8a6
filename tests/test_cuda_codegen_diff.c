/*
 * test_cuda_codegen_diff.c — test_compile_diff's random programs on CUDA.
 *
 * Generated code: a sample of its programs (seeds 1..KT_CUDA_DIFF_PROGRAMS,
 * default 150) is compiled in FUSE mode with a CPU backend that generates
 * every kernel's CUDA C (and runs it with the interpreter); the kernels are
 * then compiled by NVRTC + ptxas for sm_80 and sm_90, 24 per program, with no
 * spills. The generator refuses none of them (the two-pass var, std and
 * logsumexp are generated too). Runs without the emulator (NVRTC needs no
 * device).
 *
 * Executed: with a device (the emulated one in CI: cuda_codegen_diff_emu),
 * programs of seeds 1..KT_CUDA_EXEC_PROGRAMS (default 40) run compiled in
 * FUSE mode on CUDA tensors (creation ops on the device: it is the default
 * device meanwhile) and are compared with the same program run eagerly on the
 * CPU, outputs and inputs written in place, at test_compile_diff's tolerance.
 *
 * The generator's programs come from test_compile_diff.c itself (included, its
 * main renamed).
 */
#define main compile_diff_main
#include "test_compile_diff.c"
#undef main

#include "../src/codegen_nvrtc/cn.h"
#include "../src/codegen_nvrtc/cuda_api.h"
#include "kernel.h"

#include "cuda_harness.h"

static const char *OP = "cuda_codegen_diff";

enum { MAXK = 4096 };
static ir_kernel *kernels[MAXK];
static int nkernels, refused;

static void *capture_compile(const ir_kernel *k) {
    char *src = NULL;
    const ir_kernel *one[1] = {k};
    const char *name[1] = {"probe"};
    if (cn_emit_program(one, name, 1, &src) == 0) {
        if (nkernels < MAXK) kernels[nkernels++] = ir_kernel_ref((ir_kernel *)k);
    } else {
        print_error("no CUDA C: %s\n", kl_last_error());
        refused++;
    }
    kl_clear_error();
    free(src);
    return ir_interp_backend.compile(k);
}
static int capture_run(void *h, kl_tensor *const *in, kl_tensor *const *out) { return ir_interp_backend.run(h, in, out); }
static void capture_free(void *h) { ir_interp_backend.free(h); }
static const ir_backend capture_backend = {.name = "cuda_capture", .device = KL_CPU, .priority = -100,
                                           .compile = capture_compile, .run = capture_run, .free = capture_free};

static void random_program_kernels_compile(void **state) {
    (void)state;
    if (kl_cuda_is_available() && kt_cuda_emulated(OP)) {
        print_message("skipped: the run without the emulator compiles these\n");
        skip();
    }
    kl_init();
    assert_int_equal(ir_backend_register(&capture_backend), 0);
    const char *e = getenv("KT_CUDA_DIFF_PROGRAMS");
    int nprog = e ? atoi(e) : 150;
    static prog p;
    for (int seed = 1; seed <= nprog; seed++) {
        generate(&p, (uint64_t)seed);
        kl_scope_begin();
        kl_tensor *in[MAXIN], *out[MAXOUT] = {0};
        for (int i = 0; i < p.n_in; i++) in[i] = make_input(&p, i);
        kl_compile_options o = kl_compile_options_default();
        o.backend = "cuda_capture";
        o.mode = KL_COMPILE_FUSE;
        kl_fn *f = kl_compile(run_prog, &p, &o);
        assert_non_null(f);
        if (kl_fn_call(f, in, p.n_in, out, p.n_out) != 0) kl_clear_error(); /* eager errors are test_compile_diff's */
        kl_fn_release(f);
        kl_scope_end();
    }
    print_message("%d programs: %d kernels generated, %d refused\n", nprog, nkernels, refused);
    assert_int_equal(refused, 0);
    assert_true(nkernels > 0);
    if (!ku_nvrtc_available(OP)) {
        print_message("skipped the NVRTC compiles: %s\n", kl_last_error());
        kl_clear_error();
    } else {
        int maxreg = 0;
        for (int b = 0; b < nkernels; b += 24) {
            int n = nkernels - b < 24 ? nkernels - b : 24;
            const ir_kernel *ks[24];
            char names[24][16];
            const char *np[24];
            for (int i = 0; i < n; i++) {
                ks[i] = kernels[b + i];
                snprintf(names[i], sizeof names[i], "k%d", b + i);
                np[i] = names[i];
            }
            char *src = NULL;
            assert_int_equal(cn_emit_program(ks, np, n, &src), 0);
            for (int a = 80; a <= 90; a += 10) {
                ku_cubin c;
                if (ku_nvrtc_compile(OP, src, "random_kernels.cu", a, &c) != 0) {
                    print_error("%s\n---- source ----\n%s\n", kl_last_error(), src);
                    fail();
                }
                if (c.spill_bytes > 0) {
                    print_error("spills %d bytes on sm_%d:\n%s\n---- source ----\n%s\n", c.spill_bytes, a, c.log, src);
                    fail();
                }
                if (c.registers > maxreg) maxreg = c.registers;
                ku_cubin_free(&c);
            }
            free(src);
        }
        print_message("compiled for sm_80 and sm_90: no spills, at most %d registers\n", maxreg);
    }
    for (int i = 0; i < nkernels; i++) ir_kernel_free(kernels[i]);
    nkernels = 0;
}

/* One program compiled on CUDA against its eager CPU run; returns 1 if it ran. */
static int run_on_device(prog *p, uint64_t seed) {
    kl_scope_begin();
    kl_tensor *rin[MAXIN], *rout[MAXOUT], *din[MAXIN], *out[MAXOUT] = {0};
    for (int i = 0; i < p->n_in; i++) rin[i] = make_input(p, i);
    kl_manual_seed(seed);
    if (run_prog(p, rin, p->n_in, rout, p->n_out) != 0) { /* test_compile_diff's business */
        kl_clear_error();
        kl_scope_end();
        return 0;
    }
    for (int i = 0; i < p->n_in; i++) din[i] = kl_to_device(make_input(p, i), CUDA0);
    kl_compile_options o = kl_compile_options_default();
    o.mode = KL_COMPILE_FUSE;
    o.name = "diff_cuda";
    kl_fn *f = kl_compile(run_prog, p, &o);
    assert_non_null(f);
    const kl_device cpu = kl_get_default_device();
    kl_set_default_device(CUDA0);
    kl_manual_seed(seed);
    int rc = kl_fn_call(f, din, p->n_in, out, p->n_out);
    kl_set_default_device(cpu);
    char why[400];
    if (rc) {
        if (strstr(kl_last_error(), "no host C++ compiler")) {
            print_message("skipped: %s\n", kl_last_error());
            kl_clear_error();
            kl_fn_release(f);
            kl_scope_end();
            skip();
        }
        report(p, seed, "FUSE on CUDA", kl_last_error());
        kl_clear_error();
    } else {
        kl_fn_stats st;
        kl_fn_get_stats(f, &st);
        if (st.eager_calls) report(p, seed, "FUSE on CUDA", st.last_reason);
        for (int j = 0; j < p->n_out; j++) {
            if (kl_device_of(out[j]).type != KL_CUDA) report(p, seed, "FUSE on CUDA", "an output is not on the device");
            if (differs(host(out[j]), rout[j], p->lowp[p->outs[j]], why, sizeof why)) {
                char msg[600];
                snprintf(msg, sizeof msg, "output %d (%%%d): %s", j, p->outs[j], why);
                report(p, seed, "FUSE on CUDA", msg);
                break;
            }
        }
        for (int i = 0; i < p->n_in; i++)
            if (differs(host(din[i]), rin[i], p->in_lowp[i], why, sizeof why)) {
                char msg[600];
                snprintf(msg, sizeof msg, "input %d after the call: %s", i, why);
                report(p, seed, "FUSE on CUDA", msg);
                break;
            }
    }
    kl_fn_release(f);
    kl_scope_end();
    return 1;
}

static void random_programs_run_on_the_device(void **state) {
    (void)state;
    NEED_CUDA();
    const char *e = getenv("KT_CUDA_EXEC_PROGRAMS");
    int nprog = e ? atoi(e) : 40, ran = 0;
    static prog p;
    nfail = 0;
    for (int seed = 1; seed <= nprog; seed++) {
        generate(&p, (uint64_t)seed);
        ran += run_on_device(&p, (uint64_t)seed);
    }
    print_message("%d programs: %d ran compiled on CUDA, %d differ from CPU eager or failed\n", nprog, ran, nfail);
    assert_true(ran > nprog / 2);
    assert_int_equal(nfail, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_program_kernels_compile),
        cmocka_unit_test(random_programs_run_on_the_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
