/*
 * cg_jit.c — the LLVM side of the backend that is not kernel specific: the
 * shared context with the eager bitcode, the host target machine, the
 * optimization pipeline, object emission, and the process's one ORC LLJIT
 * (created on first use, disposed at exit so leak checkers see it freed).
 *
 * Compiles run concurrently, each in a slot of its own (its LLVMContext,
 * the eager bitcode loaded into it, its target machine); the JIT, whose
 * ExecutionSession is thread-safe, is shared, and loading into it happens
 * under the lock (cg_llvm.c checks there that no other thread loaded the
 * same kernel first: two definitions of one symbol would be an error).
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
#include "threadpool.h"

#include <llvm-c/Analysis.h>
#include <llvm-c/BitReader.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern const unsigned char cg_bitcode[];
extern const size_t cg_bitcode_size;

/* One compile slot per concurrent compile: LLVM objects of one context may be
 * touched by one thread at a time, and a target machine is not shared between
 * concurrent codegens either. A slot is made when a compile finds none free
 * (up to the thread count, CG_MAX_SLOTS at most), kept for the process, and
 * its lazily loaded eager bitcode materializes only the functions kernels
 * used, once per slot. */
#define CG_MAX_SLOTS 16
typedef struct cg_slot {
    LLVMContextRef ctx;
    LLVMModuleRef master;
    LLVMTargetDataRef master_td;
    LLVMTargetMachineRef tm;
    int busy;
} cg_slot;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_cond = PTHREAD_COND_INITIALIZER; /* a slot was released */
static struct {
    int state;    /* 0 not yet, 1 ready, -1 failed, shut down or disabled */
    int disabled; /* after an LLVM fatal error: nothing is disposed (it may be half-updated) */
    LLVMTargetRef target;
    char *triple, *cpu, *features;
    LLVMOrcLLJITRef jit;
    cg_slot *slots[CG_MAX_SLOTS];
    int nslots, nbusy, making; /* making: slots being made (counted in nbusy too) */
    int exiting;               /* exit_gate ran: no new compiles */
    char why[512];
} G;
static int peak_busy; /* cg_llvm_peak_compiles */
static _Thread_local cg_slot *tl_slot;  /* the slot this thread compiles in */
static _Thread_local int tl_locked;     /* this thread holds lock (cg_guard's unwinding skips unlocks) */
static _Thread_local int tl_making;     /* this thread is making a slot (counted in G.making, G.nbusy) */

void cg_lock(void) {
    pthread_mutex_lock(&lock);
    tl_locked = 1;
}
void cg_unlock(void) {
    tl_locked = 0;
    pthread_mutex_unlock(&lock);
}
int cg_lock_held(void) { return tl_locked; }

/* After an LLVM fatal error (cg_guard): no more LLVM in this process. Called
 * with the lock held. */
void cg_jit_disable(const char *why) {
    /* LLVM's objects may be half-updated (the error unwound through them):
     * leaked rather than disposed at exit; compiles in flight in other slots
     * finish (their results are refused: state is -1) */
    G.state = -1;
    G.disabled = 1;
    snprintf(G.why, sizeof G.why, "disabled after an LLVM fatal error: %s", why);
}
LLVMContextRef cg_ctx(void) { return tl_slot ? tl_slot->ctx : NULL; }
LLVMModuleRef cg_master(void) { return tl_slot ? tl_slot->master : NULL; }
LLVMTargetDataRef cg_master_layout(void) { return tl_slot ? tl_slot->master_td : NULL; }
const char *cg_cpu_name(void) { return G.cpu; }
const char *cg_cpu_features(void) { return G.features; }

static void slot_dispose(cg_slot *s) {
    if (s->tm) LLVMDisposeTargetMachine(s->tm);
    if (s->master_td) LLVMDisposeTargetData(s->master_td);
    if (s->master) LLVMDisposeModule(s->master);
    if (s->ctx) LLVMContextDispose(s->ctx);
    free(s);
}

/* At exit (registered once, before anything can compile in the background: the
 * trace layer's async compiles and cg_llvm_prepare's thread are joined by
 * handlers registered later, so they run first): waits for compiles in
 * flight, then disposes everything so leak checkers see it freed. */
static void shutdown_jit(void) {
    cg_lock();
    while (G.nbusy > 0) pthread_cond_wait(&slot_cond, &lock);
    if (!G.disabled) {
        if (G.jit) LLVMOrcDisposeLLJIT(G.jit);
        for (int i = 0; i < G.nslots; i++) slot_dispose(G.slots[i]);
        LLVMDisposeMessage(G.triple);
        LLVMDisposeMessage(G.cpu);
        LLVMDisposeMessage(G.features);
    }
    memset(&G, 0, sizeof G);
    G.state = -1;
    G.disabled = 1;
    G.exiting = 1;
    snprintf(G.why, sizeof G.why, "the JIT was shut down at exit");
    cg_unlock();
}
/* fork: only the forking thread lives on in the child, so the slots other threads were
 * using or making are gone with them. Left counted, exit_gate and shutdown_jit waited for
 * them forever (found in test_hardening: a child forked while the background prepare
 * thread was making the first slot hung at exit). The child drops them (leaked: their
 * owners may have left LLVM half-updated) and gets a fresh lock; the prepare holds the
 * lock so the counts are consistent at the fork. */
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_parent(void) { pthread_mutex_unlock(&lock); }
static void fork_child(void) {
    for (int i = 0; i < G.nslots; i++)
        if (G.slots[i]->busy && G.slots[i] != tl_slot) {
            G.slots[i--] = G.slots[--G.nslots];
            G.nbusy--;
        }
    int mine = tl_making ? 1 : 0;
    G.nbusy -= G.making - mine;
    G.making = mine;
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&slot_cond, NULL);
    tl_locked = 0;
}
static void register_shutdown(void) {
    atexit(shutdown_jit);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}
void cg_jit_register_shutdown(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_shutdown);
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

/* Called with the lock held: the target and the JIT (not the slots). */
int cg_jit_init(void) {
    if (G.state == 1) return 0;
    if (G.state == -1) return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: %s", G.why);
    static pthread_once_t handlers = PTHREAD_ONCE_INIT;
    pthread_once(&handlers, cg_install_error_handlers);
    cg_jit_register_shutdown();
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    G.triple = LLVMGetDefaultTargetTriple();
    /* $KL_LLVM_CPU / $KL_LLVM_FEATURES replace the host's (e.g. "haswell" and
     * "": AVX2 code that valgrind, which cannot decode AVX-512, can run). */
    const char *cpu = getenv("KL_LLVM_CPU"), *features = getenv("KL_LLVM_FEATURES");
    G.cpu = cpu ? LLVMCreateMessage(cpu) : LLVMGetHostCPUName();
    G.features = features ? LLVMCreateMessage(features) : LLVMGetHostCPUFeatures();
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(G.triple, &G.target, &msg)) {
        fail_init("no target for the host", msg);
        LLVMDisposeMessage(msg);
        return -1;
    }
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
    G.state = 1;
    return 0;
}

/* A new slot: its context, the eager bitcode loaded lazily into it, and a
 * target machine. Called without the lock (the slot is not shared yet). */
static cg_slot *slot_new(void) {
    cg_slot *s = calloc(1, sizeof *s);
    if (!s) {
        ke_err(KL_ERR_OOM, "compile", "out of memory");
        return NULL;
    }
    s->ctx = LLVMContextCreate();
    LLVMMemoryBufferRef mb =
        LLVMCreateMemoryBufferWithMemoryRange((const char *)cg_bitcode, cg_bitcode_size, "kiln-eager.bc", 0);
    if (LLVMGetBitcodeModuleInContext2(s->ctx, mb, &s->master)) {
        LLVMDisposeMemoryBuffer(mb);
        s->master = NULL;
        slot_dispose(s);
        ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: cannot read the embedded eager bitcode");
        return NULL;
    }
    s->master_td = LLVMCreateTargetData(LLVMGetDataLayoutStr(s->master));
    s->tm = LLVMCreateTargetMachine(G.target, G.triple, G.cpu, G.features, LLVMCodeGenLevelDefault, LLVMRelocPIC,
                                    LLVMCodeModelSmall);
    if (!s->tm) {
        slot_dispose(s);
        ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: cannot create the target machine");
        return NULL;
    }
    return s;
}

/* ---- exit ----------------------------------------------------------------------------------
 * LLVM constructs some of its statics on first use (bitcode reading's intrinsic-upgrade
 * Regex, ...), which registers their destructors with atexit then: after any handler of
 * ours. A compile still running on another thread when exit() runs would use them after
 * they were destroyed. So the gate runs before every atexit handler: as a thread_local
 * destructor of the main thread (glibc runs the exiting thread's before the atexit list),
 * armed by the main thread's first kl_compile or compile. It waits for the compiles in
 * flight and refuses later ones (they fall back to the interpreter), leaving the objects
 * for shutdown_jit. Not covered: exit() called by a thread other than main while another
 * thread compiles; the main thread calling pthread_exit (later compiles then fall back). */
static void exit_gate(void *u) {
    (void)u;
    cg_lock();
    G.exiting = 1;
    while (G.nbusy > 0) pthread_cond_wait(&slot_cond, &lock);
    if (G.state == 1) {
        G.state = -1;
        snprintf(G.why, sizeof G.why, "the process is exiting");
    }
    cg_unlock();
}
#ifdef __GLIBC__
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *obj, void *dso);
extern void *__dso_handle;
#endif
void cg_arm_exit_gate(void) {
#ifdef __GLIBC__
    static _Atomic int armed;
    if (atomic_load(&armed) || syscall(SYS_gettid) != getpid() || atomic_exchange(&armed, 1)) return;
    __cxa_thread_atexit_impl(exit_gate, NULL, &__dso_handle);
#endif
}

int cg_slot_acquire(void) {
    cg_arm_exit_gate();
    int most = kl_get_num_threads();
    most = most < 1 ? 1 : most > CG_MAX_SLOTS ? CG_MAX_SLOTS : most;
    cg_lock();
    for (;;) {
        if (G.exiting) {
            cg_unlock();
            return ke_err(KL_ERR_STATE, "compile", "llvm backend: the process is exiting");
        }
        if (cg_jit_init()) {
            cg_unlock();
            return -1;
        }
        for (int i = 0; i < G.nslots; i++)
            if (!G.slots[i]->busy) {
                tl_slot = G.slots[i];
                tl_slot->busy = 1;
                if (++G.nbusy > peak_busy) peak_busy = G.nbusy;
                cg_unlock();
                return 0;
            }
        if (G.nslots + G.making < most) break;
        pthread_cond_wait(&slot_cond, &lock);
    }
    G.nbusy++; /* shutdown_jit waits for the slot being made, too */
    G.making++;
    tl_making = 1;
    cg_unlock();
    cg_slot *s = slot_new();
    cg_lock();
    tl_making = 0;
    G.making--;
    if (s && G.state == 1 && G.nslots < CG_MAX_SLOTS) {
        s->busy = 1;
        if (G.nbusy > peak_busy) peak_busy = G.nbusy;
        G.slots[G.nslots++] = tl_slot = s;
        cg_unlock();
        return 0;
    }
    G.nbusy--;
    pthread_cond_broadcast(&slot_cond);
    int rc = s ? ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: %s", G.state == 1 ? "too many slots" : G.why) : -1;
    cg_unlock();
    if (s) slot_dispose(s);
    return rc;
}

int cg_llvm_peak_compiles(int reset) {
    cg_lock();
    int n = peak_busy;
    if (reset) peak_busy = G.nbusy;
    cg_unlock();
    return n;
}

void cg_slot_release(void) {
    if (!tl_slot) return;
    cg_lock();
    tl_slot->busy = 0;
    tl_slot = NULL;
    G.nbusy--;
    pthread_cond_broadcast(&slot_cond);
    cg_unlock();
}

void cg_slot_abandon(void) {
    if (!tl_slot && !tl_making) return;
    int held = tl_locked;
    if (!held) cg_lock();
    if (tl_making) { /* LLVM threw while the slot was made: it is leaked */
        tl_making = 0;
        G.making--;
        G.nbusy--;
        pthread_cond_broadcast(&slot_cond);
        if (!held) cg_unlock();
        return;
    }
    for (int i = 0; i < G.nslots; i++)
        if (G.slots[i] == tl_slot) G.slots[i] = G.slots[--G.nslots]; /* leaked: LLVM may have left it half-updated */
    tl_slot = NULL;
    G.nbusy--;
    pthread_cond_broadcast(&slot_cond);
    if (!held) cg_unlock();
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
double cg_thread_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int cg_jit_optimize_emit(LLVMModuleRef m, const char *name, const char *dbg_prefix, void **obj, size_t *size,
                         int *ninstr_before, int *ninstr_after, double ms[4]) {
    LLVMTargetMachineRef tm = tl_slot->tm;
    LLVMSetTarget(m, G.triple);
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
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
    double t0 = now_ms(), c0 = cg_thread_cpu_ms();
    LLVMErrorRef e = LLVMRunPasses(m, kernel_passes, tm, opts);
    ms[0] = now_ms() - t0;
    ms[2] = cg_thread_cpu_ms() - c0;
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
        if (!LLVMTargetMachineEmitToMemoryBuffer(tm, c, LLVMAssemblyFile, &msg, &amb)) {
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
    t0 = now_ms(), c0 = cg_thread_cpu_ms();
    int bad = LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &msg, &mb);
    ms[1] = now_ms() - t0;
    ms[3] = cg_thread_cpu_ms() - c0;
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
    if (G.state != 1) return ke_err(KL_ERR_INTERNAL, "compile", "llvm backend: %s", G.why);
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
