/*
 * test_cuda_codegen_diff.c — the kernels of test_compile_diff's random
 * programs as CUDA C: a sample of its programs (seeds 1..KT_CUDA_DIFF_PROGRAMS,
 * default 150) is compiled in FUSE mode with a CPU backend that generates
 * every kernel's CUDA C (and runs it with the interpreter); the kernels are
 * then compiled by NVRTC + ptxas for sm_80 and sm_90, 24 per program, with no
 * spills. Kernels the generator refuses are counted by reason: only the
 * documented gaps (two-pass row reductions) may be refused. The generator's
 * programs come from test_compile_diff.c itself (included, its main renamed).
 */
#define main compile_diff_main
#include "test_compile_diff.c"
#undef main

#include "../src/codegen_nvrtc/cn.h"
#include "../src/codegen_nvrtc/cuda_api.h"
#include "kernel.h"

static const char *OP = "cuda_codegen_diff";

enum { MAXK = 4096 };
static ir_kernel *kernels[MAXK];
static int nkernels, refused_two_pass, refused_other;

static void *capture_compile(const ir_kernel *k) {
    char *src = NULL;
    const ir_kernel *one[1] = {k};
    const char *name[1] = {"probe"};
    if (cn_emit_program(one, name, 1, &src) == 0) {
        if (nkernels < MAXK) kernels[nkernels++] = ir_kernel_ref((ir_kernel *)k);
    } else if (strstr(kl_last_error(), "cannot fold kl_var") || strstr(kl_last_error(), "cannot fold kl_std") ||
               strstr(kl_last_error(), "cannot fold kl_logsumexp") || strstr(kl_last_error(), "cannot fold kl_norm")) {
        refused_two_pass++;
    } else {
        print_error("no CUDA C: %s\n", kl_last_error());
        refused_other++;
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
    print_message("%d programs: %d kernels generated, %d refused (two-pass row reductions)\n", nprog, nkernels,
                  refused_two_pass);
    assert_int_equal(refused_other, 0);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_program_kernels_compile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
