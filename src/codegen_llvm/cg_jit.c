/*
 * cg_jit.c — the LLVM side of the backend that is not kernel specific: the
 * shared context with the eager bitcode, the host target machine, the
 * optimization pipeline, object emission, and the process's one ORC LLJIT
 * (created on first use, disposed at exit so leak checkers see it freed).
 *
 * The target machine is built from LLVMGetHostCPUFeatures(): on this
 * machine's Zen 5 LLVMGetHostCPUName() answers "generic", and the features
 * are what give 512-bit vectors ($KL_LLVM_CPU and $KL_LLVM_FEATURES override
 * both, for tools such as valgrind that cannot run AVX-512). Objects are position independent (small
 * code model): the JIT places them anywhere, and calls to libm go through
 * stubs. The JIT resolves libm and other process symbols with a dynamic
 * library search generator; kernels never call back into Kiln (the host
 * splits the range over its thread pool and calls the kernel per chunk), so
 * no absolute symbols are needed.
 */
#include "cg.h"

#include "log.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/BitReader.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern const unsigned char cg_bitcode[];
extern const size_t cg_bitcode_size;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int state; /* 0 not yet, 1 ready, -1 failed */
    LLVMContextRef ctx;
    LLVMModuleRef master;
    LLVMTargetDataRef master_td;
    LLVMTargetMachineRef tm;
    char *triple, *cpu, *features;
    LLVMOrcLLJITRef jit;
    char why[512];
} G;

void cg_lock(void) { pthread_mutex_lock(&lock); }
/* After an LLVM fatal error (cg_guard): no more LLVM in this process. */
void cg_jit_disable(const char *why) {
    /* LLVM's objects may be half-updated (the error unwound through them):
     * leaked rather than disposed at exit */
    memset(&G, 0, sizeof G);
    G.state = -1;
    snprintf(G.why, sizeof G.why, "disabled after an LLVM fatal error: %s", why);
}
void cg_unlock(void) { pthread_mutex_unlock(&lock); }
LLVMContextRef cg_ctx(void) { return G.ctx; }
LLVMModuleRef cg_master(void) { return G.master; }
LLVMTargetDataRef cg_master_layout(void) { return G.master_td; }
const char *cg_cpu_name(void) { return G.cpu; }
const char *cg_cpu_features(void) { return G.features; }

static void shutdown_jit(void) {
    cg_lock();
    if (G.jit) LLVMOrcDisposeLLJIT(G.jit);
    if (G.tm) LLVMDisposeTargetMachine(G.tm);
    if (G.master_td) LLVMDisposeTargetData(G.master_td);
    if (G.master) LLVMDisposeModule(G.master);
    if (G.ctx) LLVMContextDispose(G.ctx);
    LLVMDisposeMessage(G.triple);
    LLVMDisposeMessage(G.cpu);
    LLVMDisposeMessage(G.features);
    memset(&G, 0, sizeof G);
    G.state = -1;
    snprintf(G.why, sizeof G.why, "the JIT was shut down at exit");
    cg_unlock();
}

static int fail_init(const char *what, const char *detail) {
    snprintf(G.why, sizeof G.why, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    G.state = -1;
    return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: %s", G.why);
}

static int err_msg(LLVMErrorRef e, char *buf, size_t cap) {
    char *m = LLVMGetErrorMessage(e);
    snprintf(buf, cap, "%s", m);
    LLVMDisposeErrorMessage(m);
    return -1;
}

/* Called with the lock held. */
int cg_jit_init(void) {
    if (G.state == 1) return 0;
    if (G.state == -1) return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: %s", G.why);
    static pthread_once_t handlers = PTHREAD_ONCE_INIT;
    pthread_once(&handlers, cg_install_error_handlers);
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    G.ctx = LLVMContextCreate();
    LLVMMemoryBufferRef mb =
        LLVMCreateMemoryBufferWithMemoryRange((const char *)cg_bitcode, cg_bitcode_size, "kiln-eager.bc", 0);
    if (LLVMGetBitcodeModuleInContext2(G.ctx, mb, &G.master)) {
        LLVMDisposeMemoryBuffer(mb);
        G.master = NULL;
        return fail_init("cannot read the embedded eager bitcode", NULL);
    }
    G.master_td = LLVMCreateTargetData(LLVMGetDataLayoutStr(G.master));
    G.triple = LLVMGetDefaultTargetTriple();
    /* $KL_LLVM_CPU / $KL_LLVM_FEATURES replace the host's (e.g. "haswell" and
     * "": AVX2 code that valgrind, which cannot decode AVX-512, can run). */
    const char *cpu = getenv("KL_LLVM_CPU"), *features = getenv("KL_LLVM_FEATURES");
    G.cpu = cpu ? LLVMCreateMessage(cpu) : LLVMGetHostCPUName();
    G.features = features ? LLVMCreateMessage(features) : LLVMGetHostCPUFeatures();
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(G.triple, &target, &msg)) {
        fail_init("no target for the host", msg);
        LLVMDisposeMessage(msg);
        return -1;
    }
    G.tm = LLVMCreateTargetMachine(target, G.triple, G.cpu, G.features, LLVMCodeGenLevelDefault, LLVMRelocPIC,
                                   LLVMCodeModelSmall);
    if (!G.tm) return fail_init("cannot create the target machine", NULL);
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&G.jit, NULL);
    if (e) {
        char buf[400];
        err_msg(e, buf, sizeof buf);
        G.jit = NULL;
        return fail_init("cannot create the JIT", buf);
    }
    LLVMOrcDefinitionGeneratorRef gen;
    e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(G.jit), NULL, NULL);
    if (e) {
        char buf[400];
        err_msg(e, buf, sizeof buf);
        return fail_init("cannot search the process's symbols", buf);
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(G.jit), gen);
    atexit(shutdown_jit);
    G.state = 1;
    return 0;
}

static int count_instructions(LLVMModuleRef m) {
    int n = 0;
    for (LLVMValueRef f = LLVMGetFirstFunction(m); f; f = LLVMGetNextFunction(f))
        for (LLVMBasicBlockRef b = LLVMGetFirstBasicBlock(f); b; b = LLVMGetNextBasicBlock(b))
            for (LLVMValueRef i = LLVMGetFirstInstruction(b); i; i = LLVMGetNextInstruction(i)) n++;
    return n;
}

static void dump_module(LLVMModuleRef m, const char *prefix, const char *suffix) {
    if (!prefix) return;
    char path[1200];
    snprintf(path, sizeof path, "%s%s", prefix, suffix);
    char *msg = NULL;
    if (LLVMPrintModuleToFile(m, path, &msg)) ke_log(KE_LOG_CODEGEN, "cannot write %s: %s", path, msg ? msg : "");
    if (msg) LLVMDisposeMessage(msg);
}

/* The passes for a kernel module, instead of default<O2> (half of a cold
 * compile, and most of it spent re-optimizing code clang had optimized).
 * What the module holds is known: one kernel function whose calls go to
 * eager loop functions already compiled at -O2 (cg_emit.c marks them
 * alwaysinline), each called with n = 1 through stack slots. So: inline them
 * all without the inliner's cost model and without first simplifying each
 * callee again (default<O2>'s CGSCC walk does: always-inline instead of it
 * took softmax's optimize from ~9 to ~4 ms); clean up; delete the inlined
 * n = 1 loops (loop-deletion breaks their backedge; they carry
 * -fno-unroll-loops' unroll.disable, so loop-unroll-full would not) so that
 * the second SROA turns the slots into registers; hoist what is invariant and
 * rotate the kernel's loops; vectorize them (interleave count from the cost
 * model, as before); clean up the vector code. Left out, because in the
 * workload kernels they changed nothing or only cost compile time: SLP (the
 * element loops are widened by the loop vectorizer and the row folds are
 * emitted as vectors: the same IR without it), GVN, indvars, jump threading.
 * loop-unroll after vectorization stays, with SROA and LICM after it: a row
 * fold's block loop over its 64 lanes vectorizes to 4 iterations; unrolled,
 * its lane accesses are at constant offsets and LICM keeps the lanes in
 * registers across blocks (without: a load and a store of the lanes per
 * vector; layernorm [256,4096] 0.207 instead of 0.145 ms, softmax 0.307
 * instead of 0.246). No pass here reassociates or contracts (there are no fast-math flags), and the tests
 * compare compiled against eager bitwise. */
static const char *const kernel_passes =
    "always-inline,"
    "function("
    "sroa<modify-cfg>,early-cse<>,simplifycfg<keep-loops>,instcombine,"
    "loop(loop-deletion),simplifycfg<keep-loops>,sroa<modify-cfg>,early-cse<>,instcombine,"
    "loop-mssa(licm<allowspeculation>,loop-rotate,licm<allowspeculation>),"
    "loop-vectorize,loop-unroll<O2>,sroa<modify-cfg>,instcombine,loop-mssa(licm<allowspeculation>),simplifycfg"
    "),"
    "globaldce";

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int cg_jit_optimize_emit(LLVMModuleRef m, const char *name, const char *dbg_prefix, void **obj, size_t *size,
                         int *ninstr_before, int *ninstr_after, double ms[2]) {
    LLVMSetTarget(m, G.triple);
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(G.tm);
    LLVMSetModuleDataLayout(m, td);
    LLVMDisposeTargetData(td);
    char *msg = NULL;
    if (LLVMVerifyModule(m, LLVMReturnStatusAction, &msg)) {
        dump_module(m, dbg_prefix, ".bad.ll");
        int rc = ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: kernel %s does not verify: %.300s", name,
                        msg ? msg : "");
        LLVMDisposeMessage(msg);
        return rc;
    }
    LLVMDisposeMessage(msg);
    msg = NULL;
    *ninstr_before = count_instructions(m);
    dump_module(m, dbg_prefix, ".ll");
    LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(opts, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1);
    double t0 = now_ms();
    LLVMErrorRef e = LLVMRunPasses(m, kernel_passes, G.tm, opts);
    ms[0] = now_ms() - t0;
    LLVMDisposePassBuilderOptions(opts);
    if (e) {
        char buf[400];
        err_msg(e, buf, sizeof buf);
        return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: optimizing kernel %s: %s", name, buf);
    }
    *ninstr_after = count_instructions(m);
    dump_module(m, dbg_prefix, ".opt.ll");
    if (dbg_prefix) { /* emitting consumes the module's codegen state: a clone gives the assembly */
        LLVMModuleRef c = LLVMCloneModule(m);
        LLVMMemoryBufferRef amb;
        if (!LLVMTargetMachineEmitToMemoryBuffer(G.tm, c, LLVMAssemblyFile, &msg, &amb)) {
            char path[1200];
            snprintf(path, sizeof path, "%s.s", dbg_prefix);
            FILE *f = fopen(path, "w");
            if (f) {
                fwrite(LLVMGetBufferStart(amb), 1, LLVMGetBufferSize(amb), f);
                fclose(f);
            }
            LLVMDisposeMemoryBuffer(amb);
        }
        if (msg) LLVMDisposeMessage(msg);
        msg = NULL;
        LLVMDisposeModule(c);
    }
    LLVMMemoryBufferRef mb;
    t0 = now_ms();
    int bad = LLVMTargetMachineEmitToMemoryBuffer(G.tm, m, LLVMObjectFile, &msg, &mb);
    ms[1] = now_ms() - t0;
    if (bad) {
        int rc = ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: emitting kernel %s: %s", name, msg ? msg : "");
        LLVMDisposeMessage(msg);
        return rc;
    }
    *size = LLVMGetBufferSize(mb);
    *obj = malloc(*size ? *size : 1);
    if (!*obj) {
        LLVMDisposeMemoryBuffer(mb);
        return ke_err(KL_ERR_OOM, "compile", "out of memory");
    }
    memcpy(*obj, LLVMGetBufferStart(mb), *size);
    LLVMDisposeMemoryBuffer(mb);
    return 0;
}

int cg_jit_add(const void *obj, size_t size, const char *sym, void **rt_out, void **fn) {
    char buf[600];
    LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(G.jit);
    LLVMOrcResourceTrackerRef rt = LLVMOrcJITDylibCreateResourceTracker(jd);
    LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, size, sym);
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFileWithRT(G.jit, rt, mb);
    LLVMOrcExecutorAddress addr = 0;
    if (!e) e = LLVMOrcLLJITLookup(G.jit, &addr, sym);
    if (e) {
        err_msg(e, buf, sizeof buf);
        LLVMErrorRef e2 = LLVMOrcResourceTrackerRemove(rt);
        if (e2) LLVMConsumeError(e2);
        LLVMOrcReleaseResourceTracker(rt);
        return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: loading kernel %s: %s", sym, buf);
    }
    *rt_out = rt;
    *fn = (void *)(uintptr_t)addr;
    return 0;
}

void cg_jit_remove(void *rt_) {
    LLVMOrcResourceTrackerRef rt = rt_;
    if (G.state == 1) {
        LLVMErrorRef e = LLVMOrcResourceTrackerRemove(rt);
        if (e) LLVMConsumeError(e);
        LLVMOrcReleaseResourceTracker(rt);
    }
}
