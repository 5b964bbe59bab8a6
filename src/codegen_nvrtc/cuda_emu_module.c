/*
 * cuda_emu_module.c — modules and launches of the emulated device.
 *
 * A module image is Kiln's CUDA C source behind a magic line (KU_EMU_IMAGE_MAGIC,
 * what ku_module_get hands the emulator); cuModuleLoadData compiles it with
 * the host's C++ compiler (c++, or $KL_CUDA_EMU_CXX) against the prelude
 * kiln_cuda.h with KL_EMU defined, into a shared object kept in a cache
 * folder (the kernel cache's folder, ke_cache_dir, under cuda-emu/; key =
 * SHA-256 of prelude, vmath.h, the eager files, source, compiler identity and
 * flags; written under a temporary name and renamed), and dlopens it.
 *
 * cuLaunchKernel runs the grid on the calling thread, block after block. A
 * kernel exported with KL_EMU_EXPORT runs its threads as plain calls, one
 * after another (a __syncthreads there ends the launch with an error); one
 * exported with KL_EMU_EXPORT_SYNC runs each CUDA thread of a block as a
 * fiber switching only at __syncthreads and warp operations (a 20-instruction
 * register switch on x86-64; ucontext elsewhere, whose signal-mask system
 * call per switch made a 256-thread block reduction ~25x slower), with
 * a scheduler that releases a barrier when every thread of the block is at
 * it and reports a deadlock (threads at a barrier while others have exited
 * or wait elsewhere) as a launch failure. Everything a launch needs lives in
 * thread-local storage, so two host threads may launch at once.
 */
#define _GNU_SOURCE
#include "cuda_emu.h"

#define KL_EMU_ABI_ONLY
#include "kiln_cuda.h"

#include "core.h"
#include "diskcache.h"
#include "fileio.h"
#include "log.h"
#include "sha256.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucontext.h>

#if defined(__x86_64__) && !defined(KU_EMU_UCONTEXT)
#define KU_FAST_SWITCH 1
#endif
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define KU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KU_ASAN 1
#endif
#endif
#ifdef KU_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
void __asan_unpoison_memory_region(const volatile void *addr, size_t size);
#endif

extern char **environ;
extern const char ku_vmath_h[];
extern const char ku_kiln_cuda_h[];
/* The eager files generated programs include (nvrtc_dev_files.c, embed_header.py --table). */
typedef struct ku_embedded {
    const char *name, *text;
} ku_embedded;
extern const ku_embedded ku_dev_files[];

/* The flags every module is compiled with (part of the cache key): no FP
 * contraction, as NVRTC's -fmad=false; __FMA__ exactly when the library has
 * it, so vmath takes the same path as on the CPU and under NVRTC. */
static const char *const cxx_flags[] = {
    "-x", "c++", "-std=c++17", "-DKL_EMU", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fvisibility=hidden",
#if defined(__FMA__)
    "-D__FMA__=1",
#endif
};
#define N_CXX_FLAGS (sizeof cxx_flags / sizeof *cxx_flags)

/* ---- Cache key ---------------------------------------------------------------- */

/* SHA-256 (the kernel caches' digest) over length-framed parts, so ("ab","c")
 * differs from ("a","bc"). */
static void key_add(ke_sha256_ctx *k, const char *text) {
    uint64_t n = strlen(text);
    ke_sha256_update(k, &n, sizeof n);
    ke_sha256_update(k, text, n);
}

static void key_hex(ke_sha256_ctx *k, char out[65]) {
    uint8_t d[32];
    ke_sha256_final(k, d);
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* ---- The host compiler and the cache folder (once per process) ------------ */

static pthread_mutex_t setup_mu = PTHREAD_MUTEX_INITIALIZER;
static int setup_done;
static char cxx_path[1024];  /* "" : none; cxx_why says why */
static char cxx_why[600];
static ke_sha256_ctx base_key; /* prelude + vmath + eager files + compiler identity + flags */
static char *cache_dir;      /* <...>/cuda-emu, or a private temporary folder */
static int cache_private;    /* 1: entries are deleted once loaded */
static char include_dir[1200];

static char *dup_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 1);
    if (p) {
        memcpy(p, a, la);
        memcpy(p + la, b, lb + 1);
    }
    return p;
}

/* The program `name` as a path: itself if it holds a '/', else found in PATH. */
static int find_program(const char *name, char *out, size_t cap) {
    if (strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return access(out, X_OK) == 0 ? 0 : -1;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(out, cap, "%.*s/%s", (int)(n ? n : 1), n ? p : ".", name);
        if (access(out, X_OK) == 0) return 0;
        p += n + (e ? 1 : 0);
    }
    return -1;
}

/* Runs argv (argv[0] a path) with stdout and stderr into *out (malloc'd,
 * NUL-terminated, the first 64 KiB); the exit status, or -1 if it could not
 * be started (*out then says why). */
static int run_capture(char *const argv[], char **out) {
    enum { CAP = 64 * 1024 };
    char *buf = malloc(CAP + 1);
    *out = buf;
    if (!buf) return -1;
    buf[0] = 0;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(buf, CAP, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        snprintf(buf, CAP, "cannot run %s: %s", argv[0], strerror(e));
        return -1;
    }
    size_t n = 0;
    for (;;) {
        char tmp[4096];
        ssize_t r = read(fds[0], tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t k = (size_t)r < CAP - n ? (size_t)r : CAP - n;
        memcpy(buf + n, tmp, k);
        n += k;
    }
    buf[n] = 0;
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Writes data to path through a temporary name and a rename (fileio.c), so
 * a reader never sees half a file; -1 with errno set on failure. */
static int write_file_atomic(const char *path, const char *data, size_t n) {
    const void *parts[1] = {data};
    int e = ke_write_file_atomic_quiet(path, 1, parts, &n);
    if (e) errno = e;
    return e ? -1 : 0;
}

/* The folder: the CPU object cache's rules (docs/CODEGEN.md), a cuda-emu/
 * subfolder; a private temporary folder when the cache is off or unusable. */
static void setup_cache_dir(void) {
    const char *base = ke_cache_dir();
    if (base) {
        cache_dir = dup_join(base, "/cuda-emu");
        int e = cache_dir ? ke_make_dirs(cache_dir) : ENOMEM;
        if (!e) return;
        ke_log(KE_LOG_CACHE, "emulated CUDA: cannot use %s: %s; using a temporary folder", cache_dir ? cache_dir : "?",
               strerror(e));
        free(cache_dir);
        cache_dir = NULL;
    }
    const char *t = getenv("TMPDIR");
    char *tmpl = dup_join(t && t[0] == '/' ? t : "/tmp", "/kiln-cuda-emu-XXXXXX");
    if (tmpl && mkdtemp(tmpl)) {
        cache_dir = tmpl;
        cache_private = 1;
    } else {
        free(tmpl);
    }
}

static void setup_locked(void) {
    if (setup_done) return;
    setup_done = 1;
    const char *over = getenv("KL_CUDA_EMU_CXX");
    const char *name = over && over[0] ? over : "c++";
    if (find_program(name, cxx_path, sizeof cxx_path) != 0) {
        snprintf(cxx_why, sizeof cxx_why, "no host C++ compiler (%s%s not found or not executable)",
                 over && over[0] ? "$KL_CUDA_EMU_CXX=" : "", name);
        cxx_path[0] = 0;
        return;
    }
    /* The compiler's identity: its path and what --version says. */
    char *ver = NULL;
    char *argv[] = {cxx_path, "--version", NULL};
    int st = run_capture(argv, &ver);
    if (st != 0) {
        snprintf(cxx_why, sizeof cxx_why, "the host C++ compiler %s does not run (%s --version: %.300s)",
                 cxx_path, cxx_path, ver ? ver : "out of memory");
        cxx_path[0] = 0;
        free(ver);
        return;
    }
    ke_sha256_init(&base_key);
    key_add(&base_key, "kiln-cuda-emu-1");
    key_add(&base_key, ku_kiln_cuda_h);
    key_add(&base_key, ku_vmath_h);
    for (const ku_embedded *e = ku_dev_files; e->name; e++) {
        key_add(&base_key, e->name);
        key_add(&base_key, e->text);
    }
    key_add(&base_key, cxx_path);
    key_add(&base_key, ver);
    for (size_t i = 0; i < N_CXX_FLAGS; i++) key_add(&base_key, cxx_flags[i]);
    free(ver);
    setup_cache_dir();
    if (!cache_dir) {
        snprintf(cxx_why, sizeof cxx_why, "no folder to compile modules in (cache and temporary folder unusable)");
        cxx_path[0] = 0;
        return;
    }
    /* The headers, in a folder named by their digest (written once). */
    char hex[65];
    ke_sha256_ctx k = base_key;
    key_hex(&k, hex);
    snprintf(include_dir, sizeof include_dir, "%s/include-%.16s", cache_dir, hex);
    char p1[1300], p2[1300];
    snprintf(p1, sizeof p1, "%s/kiln_cuda.h", include_dir);
    snprintf(p2, sizeof p2, "%s/vmath.h", include_dir);
    if (mkdir(include_dir, 0700) != 0 && errno != EEXIST) goto bad;
    if (write_file_atomic(p1, ku_kiln_cuda_h, strlen(ku_kiln_cuda_h)) ||
        write_file_atomic(p2, ku_vmath_h, strlen(ku_vmath_h)))
        goto bad;
    /* the eager files generated kernels include, under the names NVRTC serves
     * them by (kernels_ew.h is kernels_ew_device.h) */
    for (const ku_embedded *e = ku_dev_files; e->name; e++) {
        snprintf(p1, sizeof p1, "%s/%s", include_dir, e->name);
        if (write_file_atomic(p1, e->text, strlen(e->text))) goto bad;
    }
    ke_log(KE_LOG_CACHE, "emulated CUDA: modules in %s, compiler %s", cache_dir, cxx_path);
    return;
bad:
    snprintf(cxx_why, sizeof cxx_why, "cannot write the prelude to %.400s: %s", include_dir, strerror(errno));
    cxx_path[0] = 0;
}

void ku_emu_reset_compiler(void) {
    pthread_mutex_lock(&setup_mu);
    setup_done = 0;
    cxx_path[0] = 0;
    free(cache_dir);
    cache_dir = NULL;
    cache_private = 0;
    ke_cache_reset(); /* the folder comes from the kernel cache: it reads the variables again too */
    pthread_mutex_unlock(&setup_mu);
}

/* ---- Modules ------------------------------------------------------------------- */

#define MODULE_MAGIC 0x4d4f4455u
#define FUNC_MAGIC 0x46554e43u

struct CUfunc_st {
    uint32_t magic;
    const kl_emu_kernel *k;
    struct CUmod_st *mod;
    struct CUfunc_st *next;
    char name[];
};
struct CUmod_st {
    uint32_t magic;
    void *dl;
    struct CUfunc_st *funcs;
    pthread_mutex_t mu;
    struct CUmod_st *next_dead; /* on the graveyard once unloaded */
};

/* "<first lines of the source>" for error messages. */
static void source_head(const char *src, char *out, size_t cap, int lines) {
    size_t n = 0;
    const char *p = src;
    for (int l = 0; l < lines && *p; l++) {
        const char *e = strchr(p, '\n');
        p = e ? e + 1 : p + strlen(p);
    }
    n = (size_t)(p - src);
    snprintf(out, cap, "%.*s%s", (int)n, src, *p ? "..." : "");
}

/* Compiles src into so_path (temporary name + rename); CUDA_SUCCESS or an
 * error whose detail holds the compiler's output and the source's head. */
static CUresult compile_module(const char *src, const char *key_hex, const char *so_path) {
    static _Atomic unsigned seq;
    unsigned s = seq++;
    char cu[1400], tmp_so[1400], inc[1300];
    snprintf(cu, sizeof cu, "%s/%s.%ld.%u.cu", cache_dir, key_hex, (long)getpid(), s);
    snprintf(tmp_so, sizeof tmp_so, "%s/%s.%ld.%u.so.tmp", cache_dir, key_hex, (long)getpid(), s);
    snprintf(inc, sizeof inc, "-I%s", include_dir);
    /* The key goes into the object, so a file renamed into another's place is caught at load. */
    size_t n = strlen(src);
    char tail[256];
    int tn = snprintf(tail, sizeof tail,
                      "\nextern \"C\" __attribute__((visibility(\"default\"))) const char kl_emu_module_key[] = \"%s\";\n",
                      key_hex);
    char *text = malloc(n + (size_t)tn + 1);
    if (!text) return ku_emu_fail(CUDA_ERROR_OUT_OF_MEMORY, "no host memory for the module's source");
    memcpy(text, src, n);
    memcpy(text + n, tail, (size_t)tn + 1);
    int w = write_file_atomic(cu, text, n + (size_t)tn);
    free(text);
    if (w) return ku_emu_fail(CUDA_ERROR_UNKNOWN, "cannot write %s: %s", cu, strerror(errno));
    char *argv[N_CXX_FLAGS + 8];
    int a = 0;
    argv[a++] = cxx_path;
    for (size_t i = 0; i < N_CXX_FLAGS; i++) argv[a++] = (char *)cxx_flags[i];
    argv[a++] = inc;
    argv[a++] = cu;
    argv[a++] = "-o";
    argv[a++] = tmp_so;
    argv[a++] = "-lm";
    argv[a] = NULL;
    char *out = NULL;
    int st = run_capture(argv, &out);
    unlink(cu);
    CUresult r = CUDA_SUCCESS;
    if (st != 0) {
        char head[240];
        source_head(src, head, sizeof head, 4);
        r = ku_emu_fail(CUDA_ERROR_INVALID_SOURCE, "compiling the module with %s failed (status %d):\n%.560s\nsource begins:\n%s",
                        cxx_path, st, out ? out : "", head);
        unlink(tmp_so);
    } else if (rename(tmp_so, so_path) != 0) {
        r = ku_emu_fail(CUDA_ERROR_UNKNOWN, "cannot rename the compiled module to %s: %s", so_path, strerror(errno));
        unlink(tmp_so);
    }
    free(out);
    return r;
}

/* dlopen + the key check; NULL (and *why) for a missing, truncated or stale file. */
static void *open_module(const char *so_path, const char *key_hex, char *why, size_t cap) {
    void *dl = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        snprintf(why, cap, "%s", e ? e : "dlopen failed");
        return NULL;
    }
    const char *k = dlsym(dl, "kl_emu_module_key");
    if (!k || strcmp(k, key_hex) != 0) {
        snprintf(why, cap, "%.400s holds another module", so_path);
        dlclose(dl);
        return NULL;
    }
    return dl;
}

CUresult ku_emu_module_load(CUmodule *m, const void *image) {
    if (!m || !image) return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "NULL module or image");
    const char *img = image;
    size_t ml = strlen(KU_EMU_IMAGE_MAGIC);
    if (strncmp(img, KU_EMU_IMAGE_MAGIC, ml) != 0) {
        int elf = img[0] == 0x7f && img[1] == 'E' && img[2] == 'L' && img[3] == 'F';
        return ku_emu_fail(CUDA_ERROR_INVALID_IMAGE,
                           "the image is %s, not Kiln CUDA C source (first line \"%s\"): the emulated device runs only "
                           "source, as ku_module_get gives it",
                           elf ? "an ELF file (a CUBIN?)" : "not Kiln CUDA C source", KU_EMU_IMAGE_MAGIC);
    }
    const char *src = img + ml;
    pthread_mutex_lock(&setup_mu);
    setup_locked();
    pthread_mutex_unlock(&setup_mu);
    if (!cxx_path[0]) return ku_emu_fail(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "%s", cxx_why);
    ke_sha256_ctx d = base_key;
    key_add(&d, src);
    char hex[65], so_path[1400], why[512];
    key_hex(&d, hex);
    snprintf(so_path, sizeof so_path, "%s/%s.so", cache_dir, hex);
    void *dl = cache_private ? NULL : open_module(so_path, hex, why, sizeof why);
    if (!dl) {
        if (!cache_private && access(so_path, F_OK) == 0) {
            ke_log(KE_LOG_CACHE, "emulated CUDA: bad entry %s (%s): recompiling", so_path, why);
            unlink(so_path);
        }
        CUresult r = compile_module(src, hex, so_path);
        if (r != CUDA_SUCCESS) return r;
        dl = open_module(so_path, hex, why, sizeof why);
        if (cache_private) unlink(so_path); /* the mapping stays valid */
        if (!dl) return ku_emu_fail(CUDA_ERROR_INVALID_IMAGE, "cannot load the compiled module: %s", why);
    }
    struct CUmod_st *mod = calloc(1, sizeof *mod);
    if (!mod) {
        dlclose(dl);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mod->magic = MODULE_MAGIC;
    mod->dl = dl;
    pthread_mutex_init(&mod->mu, NULL);
    *m = mod;
    return CUDA_SUCCESS;
}

CUresult ku_emu_module_get_function(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !name) return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "NULL function or name");
    if (!m || m->magic != MODULE_MAGIC) return ku_emu_fail(CUDA_ERROR_INVALID_HANDLE, "not a loaded module");
    char sym[300];
    snprintf(sym, sizeof sym, "kl_emu_kernel_%s", name);
    const kl_emu_kernel *k = strlen(name) < 250 ? dlsym(m->dl, sym) : NULL;
    if (!k)
        return ku_emu_fail(CUDA_ERROR_NOT_FOUND,
                           "no kernel \"%s\" in the module (an extern \"C\" __global__ function followed by "
                           "KL_EMU_EXPORT(%s))",
                           name, name);
    if (k->abi != KL_EMU_ABI)
        return ku_emu_fail(CUDA_ERROR_INVALID_IMAGE, "kernel %s was built for emulator ABI %d, this one is %d", name,
                           k->abi, KL_EMU_ABI);
    pthread_mutex_lock(&m->mu);
    struct CUfunc_st *fn;
    for (fn = m->funcs; fn && strcmp(fn->name, name) != 0; fn = fn->next) {}
    if (!fn) {
        size_t n = strlen(name);
        fn = calloc(1, sizeof *fn + n + 1);
        if (fn) {
            fn->magic = FUNC_MAGIC;
            fn->k = k;
            fn->mod = m;
            memcpy(fn->name, name, n + 1);
            fn->next = m->funcs;
            m->funcs = fn;
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    *f = fn;
    return CUDA_SUCCESS;
}

/* Unloaded modules and their functions keep their (small) records, marked
 * dead, on this list: a stale handle then fails as an invalid handle instead
 * of reading freed memory, as the driver's handle checks do. */
static struct CUmod_st *graveyard;
static pthread_mutex_t graveyard_mu = PTHREAD_MUTEX_INITIALIZER;

CUresult ku_emu_module_unload(CUmodule m) {
    pthread_mutex_lock(&graveyard_mu);
    int live = m && m->magic == MODULE_MAGIC;
    if (live) m->magic = 0;
    pthread_mutex_unlock(&graveyard_mu);
    if (!live) return ku_emu_fail(CUDA_ERROR_INVALID_HANDLE, "not a loaded module");
    pthread_mutex_lock(&m->mu);
    for (struct CUfunc_st *f = m->funcs; f; f = f->next) f->magic = 0;
    pthread_mutex_unlock(&m->mu);
    dlclose(m->dl);
    m->dl = NULL;
    pthread_mutex_lock(&graveyard_mu);
    m->next_dead = graveyard;
    graveyard = m;
    pthread_mutex_unlock(&graveyard_mu);
    return CUDA_SUCCESS;
}

/* ---- Launches ------------------------------------------------------------------ */

enum { F_READY, F_BARRIER, F_WARP, F_DONE };

#ifdef KU_FAST_SWITCH
/* Pushes the callee-saved registers and the SSE/x87 control words, stores
 * the stack pointer in *save and continues on stack `to` (saved by this
 * function, or laid out by ctx_prepare). */
void ku_emu_ctx_switch_(void **save, void *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl ku_emu_ctx_switch_\n"
        ".hidden ku_emu_ctx_switch_\n"
        ".type ku_emu_ctx_switch_, @function\n"
        "ku_emu_ctx_switch_:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ku_emu_ctx_switch_, .-ku_emu_ctx_switch_\n");

/* A fresh stack below `top` that ku_emu_ctx_switch_ "returns" into entry
 * on, with the stack aligned as after a call and default control words. */
static void *ctx_prepare(char *top, void (*entry)(void)) {
    uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15);
    *--sp = 0;                  /* entry's return address: it never returns */
    *--sp = (uintptr_t)entry;   /* popped by ret; leaves sp = 8 mod 16 at entry */
    for (int r = 0; r < 6; r++) *--sp = 0; /* rbp rbx r12-r15 */
    *--sp = 0x1F80u | (uint64_t)0x037Fu << 32; /* MXCSR, x87 control word: the defaults */
    return sp;
}
#endif
#define FIBER_STACK (256 * 1024) /* mapped lazily: only touched pages cost */
#define EMU_MAX_DYN_SHARED (48 * 1024)
#define EMU_MAX_THREADS 1024 /* per block */

typedef struct emu_fiber {
    kl_emu_thread t; /* first: the kernel's view of this thread */
#ifdef KU_FAST_SWITCH
    void *sp; /* its saved stack pointer while switched out */
#else
    ucontext_t uc;
#endif
    void *stack;     /* FIBER_STACK bytes above a guard page */
    int state;
    int wkind, warg, wwidth; /* the warp operation it waits at */
    unsigned wmask;
    unsigned long long wval, wres;
    void *asan_fake;
} emu_fiber;

/* This host thread's launch state. */
typedef struct emu_launch {
    emu_fiber *fiber; /* EMU_MAX_THREADS, never moved: a ucontext points into itself */
    int nf;
#ifdef KU_FAST_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    const kl_emu_kernel *k;
    void **args;
    int failed;
    char why[700];
    jmp_buf plain_jmp; /* where a plain (non-fiber) launch fails to */
    void *dyn;         /* EMU_MAX_DYN_SHARED bytes */
    const void *sched_bottom;
    size_t sched_size;
    void *sched_fake;
} emu_launch;

static _Thread_local emu_launch *tl_launch;
static pthread_key_t launch_key;
static pthread_once_t launch_once = PTHREAD_ONCE_INIT;

static void launch_free(void *p) {
    emu_launch *L = p;
    if (!L) return;
    for (int i = 0; i < L->nf; i++) munmap((char *)L->fiber[i].stack - 4096, FIBER_STACK + 4096);
    free(L->fiber);
    free(L->dyn);
    free(L);
}
static void launch_key_make(void) { pthread_key_create(&launch_key, launch_free); }

static emu_launch *launch_state(void) {
    if (tl_launch) return tl_launch;
    pthread_once(&launch_once, launch_key_make);
    emu_launch *L = calloc(1, sizeof *L);
    if (!L) return NULL;
    L->dyn = aligned_alloc(16, EMU_MAX_DYN_SHARED);
    if (!L->dyn) {
        free(L);
        return NULL;
    }
    pthread_setspecific(launch_key, L);
    tl_launch = L;
    return L;
}

/* Ends the launch with `why` (first reason wins); from a fiber, back to the
 * scheduler for good; from a plain launch, back to its setjmp. */
static void emu_trap(kl_emu_thread *t, const char *why);

static void switch_to_sched(emu_fiber *f) {
    emu_launch *L = tl_launch;
#ifdef KU_ASAN
    __sanitizer_start_switch_fiber(f->state == F_DONE || L->failed ? NULL : &f->asan_fake, L->sched_bottom,
                                   L->sched_size);
#endif
#ifdef KU_FAST_SWITCH
    ku_emu_ctx_switch_(&f->sp, L->sched_sp);
#else
    swapcontext(&f->uc, &L->sched);
#endif
#ifdef KU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, NULL, NULL);
#endif
}

static void switch_to_fiber(emu_launch *L, emu_fiber *f) {
#ifdef KU_ASAN
    __sanitizer_start_switch_fiber(&L->sched_fake, f->stack, FIBER_STACK);
#endif
#ifdef KU_FAST_SWITCH
    ku_emu_ctx_switch_(&L->sched_sp, f->sp);
#else
    swapcontext(&L->sched, &f->uc);
#endif
#ifdef KU_ASAN
    __sanitizer_finish_switch_fiber(L->sched_fake, NULL, NULL);
#endif
}

static _Thread_local emu_fiber *tl_starting;

static void fiber_main(void) {
    emu_fiber *f = tl_starting;
    emu_launch *L = tl_launch;
#ifdef KU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &L->sched_bottom, &L->sched_size);
#endif
    L->k->run(&f->t, L->args, 0);
    f->state = F_DONE;
    switch_to_sched(f);
    abort(); /* never resumed */
}

static void emu_barrier(kl_emu_thread *t) {
    emu_fiber *f = t->rt;
    if (!f)
        emu_trap(t, "__syncthreads() in a kernel exported with KL_EMU_EXPORT: export it with KL_EMU_EXPORT_SYNC");
    f->state = F_BARRIER;
    switch_to_sched(f);
}

static unsigned long long emu_warp(kl_emu_thread *t, int kind, unsigned mask, unsigned long long v, int arg, int width) {
    emu_fiber *f = t->rt;
    if (!f)
        emu_trap(t, "a warp operation (__shfl*_sync, __ballot_sync, __syncwarp) in a kernel exported with "
                    "KL_EMU_EXPORT: export it with KL_EMU_EXPORT_SYNC");
    if (width < 1 || width > 32 || (width & (width - 1))) emu_trap(t, "warp shuffle width is not a power of 2 up to 32");
    f->wkind = kind;
    f->wmask = mask;
    f->wval = v;
    f->warg = arg;
    f->wwidth = width;
    f->state = F_WARP;
    switch_to_sched(f);
    return f->wres;
}

static void emu_trap(kl_emu_thread *t, const char *why) {
    emu_launch *L = tl_launch;
    if (!L->failed) {
        snprintf(L->why, sizeof L->why, "thread (%u,%u,%u) of block (%u,%u,%u): %s", t->threadIdx.x, t->threadIdx.y,
                 t->threadIdx.z, t->blockIdx.x, t->blockIdx.y, t->blockIdx.z, why);
        L->failed = 1;
    }
    emu_fiber *f = t->rt;
    if (f) switch_to_sched(f);
    else longjmp(L->plain_jmp, 1);
    abort();
}

static void block_fail(emu_launch *L, const kl_emu_thread *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void block_fail(emu_launch *L, const kl_emu_thread *t, const char *fmt, ...) {
    if (L->failed) return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(L->why, sizeof L->why, "block (%u,%u,%u): %s", t->blockIdx.x, t->blockIdx.y, t->blockIdx.z, msg);
    L->failed = 1;
}

/* getcontext returns twice as far as the compiler knows (it never does
 * here: makecontext replaces what it saved); out of line, it clobbers nothing. */
#ifndef KU_FAST_SWITCH
static __attribute__((noinline)) int context_init(ucontext_t *uc) { return getcontext(uc); }
#endif

/* Fibers for n threads (stacks kept for later launches on this thread). */
static int ensure_fibers(emu_launch *L, int n) {
    if (n <= L->nf) return 0;
    if (!L->fiber && !(L->fiber = calloc(EMU_MAX_THREADS, sizeof *L->fiber))) return -1;
    for (int i = L->nf; i < n; i++) {
        emu_fiber *f = &L->fiber[i];
        memset(f, 0, sizeof *f);
        char *m = mmap(NULL, FIBER_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) return -1;
        mprotect(m, 4096, PROT_NONE); /* a guard page: an overflow faults, not corrupts */
        f->stack = m + 4096;
#ifndef KU_FAST_SWITCH
        if (context_init(&f->uc) != 0) {
            munmap(m, FIBER_STACK + 4096);
            return -1;
        }
#endif
        L->nf = i + 1;
    }
    return 0;
}

/* The value lane `l` of warp w gets from a finished warp operation. */
static void warp_results(emu_fiber *w, int nlanes, unsigned arrived) {
    int kind = -1;
    for (int l = 0; l < nlanes; l++)
        if (arrived >> l & 1) kind = w[l].wkind;
    unsigned ballot = 0;
    if (kind == KL_EMU_BALLOT)
        for (int l = 0; l < nlanes; l++)
            if ((arrived >> l & 1) && w[l].wval) ballot |= 1u << l;
    for (int l = 0; l < nlanes; l++) {
        if (!(arrived >> l & 1)) continue;
        emu_fiber *f = &w[l];
        int width = f->wwidth, seg = l & ~(width - 1), in = l & (width - 1), src = l;
        switch (f->wkind) {
        case KL_EMU_SHFL_IDX: src = seg + (f->warg & (width - 1)); break;
        case KL_EMU_SHFL_UP: src = in - f->warg < 0 ? l : l - f->warg; break;
        case KL_EMU_SHFL_DOWN: src = in + f->warg >= width ? l : l + f->warg; break;
        case KL_EMU_SHFL_XOR: src = l ^ f->warg; src = src < 0 || src >= seg + width ? l : src; break;
        default: break;
        }
        /* A lane that does not take part (absent, or not in the mask) gives
         * the reader its own value, as CUDA does outside the width. */
        if (src < 0 || src >= nlanes || !(arrived >> src & 1)) src = l;
        f->wres = f->wkind == KL_EMU_BALLOT ? ballot : f->wkind == KL_EMU_SYNCWARP ? 0 : w[src].wval;
    }
    for (int l = 0; l < nlanes; l++)
        if (arrived >> l & 1) w[l].state = F_READY;
}

/* Releases the warps whose lanes have all arrived at the same operation;
 * 1 if any was released, 0 if none, -1 (L->failed) for an inconsistency. */
static int release_warps(emu_launch *L, int n) {
    int any = 0;
    for (int w0 = 0; w0 < n; w0 += 32) {
        emu_fiber *w = &L->fiber[w0];
        int nl = n - w0 < 32 ? n - w0 : 32;
        unsigned arrived = 0, exists = nl == 32 ? 0xffffffffu : (1u << nl) - 1, mask = 0;
        int kind = -1, first = -1;
        for (int l = 0; l < nl; l++) {
            if (w[l].state != F_WARP) continue;
            if (first < 0) {
                first = l;
                kind = w[l].wkind;
                mask = w[l].wmask;
            } else if (w[l].wkind != kind || w[l].wmask != mask) {
                block_fail(L, &w[l].t, "warp %d: lanes %d and %d wait at different warp operations or with different masks",
                           w0 / 32, first, l);
                return -1;
            }
            arrived |= 1u << l;
        }
        if (!arrived) continue;
        unsigned need = mask & exists;
        if (arrived & ~need) {
            block_fail(L, &w[first].t, "warp %d: a lane calls a warp operation with a mask (0x%x) that leaves it out",
                       w0 / 32, mask);
            return -1;
        }
        if ((arrived & need) != need) {
            for (int l = 0; l < nl; l++)
                if ((need >> l & 1) && w[l].state == F_DONE) {
                    block_fail(L, &w[first].t, "warp %d: lane %d exited while the others wait at a warp operation",
                               w0 / 32, l);
                    return -1;
                }
            continue; /* a lane is elsewhere: the deadlock check decides */
        }
        warp_results(w, nl, arrived);
        any = 1;
    }
    return any;
}

static void set_thread(kl_emu_thread *t, unsigned i, const kl_emu_dim3 *bd) {
    t->threadIdx.x = i % bd->x;
    t->threadIdx.y = i / bd->x % bd->y;
    t->threadIdx.z = i / bd->x / bd->y;
}

/* One block as fibers; 0, or -1 with L->failed. */
static int run_block_fibers(emu_launch *L, const kl_emu_thread *proto) {
    int n = (int)(proto->blockDim.x * proto->blockDim.y * proto->blockDim.z);
    for (int i = 0; i < n; i++) {
        emu_fiber *f = &L->fiber[i];
        f->t = *proto;
        f->t.rt = f;
        set_thread(&f->t, (unsigned)i, &proto->blockDim);
        f->state = F_READY;
#ifdef KU_ASAN
        __asan_unpoison_memory_region(f->stack, FIBER_STACK); /* a fiber abandoned by a failed launch */
#endif
        /* Stacks start at different offsets within a page: at the same
         * offset, the fibers' hot frames would all fall in one cache set. */
        char *top = (char *)f->stack + FIBER_STACK - (((size_t)i * 64) & 4095);
#ifdef KU_FAST_SWITCH
        f->sp = ctx_prepare(top, fiber_main);
#else
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = (size_t)(top - (char *)f->stack);
        f->uc.uc_link = NULL;
        makecontext(&f->uc, fiber_main, 0);
#endif
    }
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (L->fiber[i].state != F_READY) continue;
            tl_starting = &L->fiber[i];
            switch_to_fiber(L, &L->fiber[i]);
            if (L->failed) return -1;
        }
        int r = release_warps(L, n);
        if (r < 0) return -1;
        if (r > 0) continue;
        int done = 0, bar = 0, warp = 0;
        for (int i = 0; i < n; i++) {
            done += L->fiber[i].state == F_DONE;
            bar += L->fiber[i].state == F_BARRIER;
            warp += L->fiber[i].state == F_WARP;
        }
        if (done == n) return 0;
        if (bar == n) {
            for (int i = 0; i < n; i++) L->fiber[i].state = F_READY;
            continue;
        }
        block_fail(L, proto, "deadlock: %d of %d threads wait at __syncthreads, %d at a warp operation, %d exited",
                   bar, n, warp, done);
        return -1;
    }
}

/* The blocks in order; a plain block's trap longjmps back here (no frame
 * between owns anything). Kept out of line so nothing of the caller's is
 * live across the setjmp. */
static __attribute__((noinline)) void run_grid(emu_launch *L, const kl_emu_kernel *k, kl_emu_thread *t,
                                               void **params) {
    unsigned long long blocks = (unsigned long long)t->gridDim.x * t->gridDim.y * t->gridDim.z;
    if (setjmp(L->plain_jmp) != 0) return;
    for (unsigned long long b = 0; b < blocks; b++) {
        t->blockIdx.x = (unsigned)(b % t->gridDim.x);
        t->blockIdx.y = (unsigned)(b / t->gridDim.x % t->gridDim.y);
        t->blockIdx.z = (unsigned)(b / t->gridDim.x / t->gridDim.y);
        if (k->sync) {
            if (run_block_fibers(L, t)) return;
        } else {
            k->run(t, params, 1);
        }
    }
}

static int dim_ok(unsigned v, unsigned max) { return v >= 1 && v <= max; }

CUresult ku_emu_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream s, void **params, void **extra) {
    if (!f || f->magic != FUNC_MAGIC) return ku_emu_fail(CUDA_ERROR_INVALID_HANDLE, "not a kernel of a loaded module");
    if (!ku_emu_stream_ok(s)) return ku_emu_fail(CUDA_ERROR_INVALID_HANDLE, "not a live stream");
    /* An H100's limits. */
    if (!dim_ok(bx, 1024) || !dim_ok(by, 1024) || !dim_ok(bz, 64) || (unsigned long long)bx * by * bz > EMU_MAX_THREADS)
        return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "block (%u,%u,%u): each side >= 1, x,y <= 1024, z <= 64, at most 1024 threads",
                           bx, by, bz);
    if (!dim_ok(gx, 0x7fffffffu) || !dim_ok(gy, 65535) || !dim_ok(gz, 65535))
        return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "grid (%u,%u,%u): each side >= 1, x < 2^31, y,z <= 65535", gx, gy, gz);
    if (shmem > EMU_MAX_DYN_SHARED)
        return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "%u bytes of dynamic shared memory (at most %d without opting in)",
                           shmem, EMU_MAX_DYN_SHARED);
    if (extra) return ku_emu_fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel's `extra` parameter packing");
    if (f->k->nparams > 0 && !params)
        return ku_emu_fail(CUDA_ERROR_INVALID_VALUE, "kernel %s takes %d parameters: `params` is NULL", f->name,
                           f->k->nparams);
    emu_launch *L = launch_state();
    if (!L) return CUDA_ERROR_OUT_OF_MEMORY;
    if (L->k) return ku_emu_fail(CUDA_ERROR_LAUNCH_FAILED, "a kernel launched a kernel");
    L->k = f->k;
    L->args = params;
    L->failed = 0;
    L->why[0] = 0;
    memset(L->dyn, 0xA5, shmem); /* shared memory starts as garbage, as on a GPU */
    kl_emu_thread t = {
        .blockDim = {bx, by, bz},
        .gridDim = {gx, gy, gz},
        .dyn_shared = L->dyn,
        .rt = NULL,
        .barrier = emu_barrier,
        .warp = emu_warp,
        .trap = emu_trap,
    };
    if (f->k->sync && ensure_fibers(L, (int)(bx * by * bz)) != 0) {
        L->k = NULL;
        return ku_emu_fail(CUDA_ERROR_OUT_OF_MEMORY, "no memory for %u fiber stacks", bx * by * bz);
    }
    run_grid(L, f->k, &t, params);
    L->k = NULL;
    if (L->failed) return ku_emu_fail(CUDA_ERROR_LAUNCH_FAILED, "kernel %s: %s", f->name, L->why);
    return CUDA_SUCCESS;
}
