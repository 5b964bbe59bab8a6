/*
 * diskcache.h — the on-disk cache of compiled kernels, shared by both code
 * generators: the LLVM backend's objects (kind KE_CACHE_OBJ; its key hashes
 * the kernel IR text, CPU name and features, LLVM and Kiln versions) and the
 * CUDA runtime's CUBINs (KE_CACHE_CUBIN; source, architecture, NVRTC version,
 * options). Each hashes what decides its machine code into a ke_cache_key,
 * asks ke_cache_load before compiling and hands the result to ke_cache_store
 * after. Pure C, no LLVM, no CUDA: the cache only moves bytes. It lives in
 * src/eager, the lowest layer, beside fileio.c (atomic writes) and log.c,
 * because both codegen layers sit above it and neither may include the other.
 *
 * Where: $KL_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln;
 * KL_CACHE_DIR set to "" or "off" disables it. The environment is read once,
 * on first use (ke_cache_reset re-reads it). The folder is created on the
 * first store; if it cannot be made (a file in the way) the cache disables
 * itself for the process with one KL_LOG=cache line. A folder that exists but
 * refuses writes (read-only, no permission) or is full (ENOSPC, EDQUOT,
 * EFBIG) stops stores for the process, also with one line ("stores off"),
 * and keeps serving the entries it holds; a failed store leaves no file
 * behind (the temporary is removed).
 *
 * Entries are <dir>/<64 hex digits of the key><kind>: an 88-byte header (magic,
 * format version, flags, payload size, the key, SHA-256 of the payload) then
 * the payload. Stores are atomic (temporary file + rename), so concurrent
 * processes see a whole entry or none; a load checks every header field and
 * the payload digest and removes a file that fails. Nothing here ever records
 * a Kiln error: the cache is an optimization, and every failure is a miss or
 * a skipped store with a KL_LOG=cache line. There is no eviction yet: the
 * folder grows until someone empties it (safe at any time, even while
 * processes run).
 *
 * Thread-safe. Entries are trusted as far as whoever can write the folder is:
 * the digest catches corruption, not tampering.
 */
#ifndef KE_DISKCACHE_H
#define KE_DISKCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ke_cache_key { uint8_t b[32]; } ke_cache_key; /* SHA-256 */

/* Kinds of entry: the file name's suffix (one folder holds all kinds). */
#define KE_CACHE_OBJ ".o.kc"       /* LLVM backend: an ELF object */
#define KE_CACHE_CUBIN ".cubin.kc" /* CUDA runtime: a CUBIN from NVRTC */

/* SHA-256 over parts[0..n), each framed by its length (8 bytes, little
 * endian) so ("ab","c") and ("a","bc") differ. parts[i] may be NULL when
 * sizes[i] is 0. */
void ke_cache_key_of(ke_cache_key *k, int n, const void *const *parts, const size_t *sizes);
/* The key as 64 lowercase hex digits and a NUL. */
void ke_cache_key_hex(const ke_cache_key *k, char out[65]);

/* Entry `k` of kind `kind` (KE_CACHE_*): 1 and *obj (malloc'd, caller frees; non-NULL even for an empty payload) +
 * *size on a hit; 0 on a miss, a disabled cache, or a corrupt, truncated or
 * foreign file (which is removed and logged, never trusted); never an error
 * for the caller. */
int ke_cache_load(const char *kind, const ke_cache_key *k, void **obj, size_t *size);
/* Stores atomically (temp file + rename); failures only log. obj may be NULL
 * when size is 0. */
void ke_cache_store(const char *kind, const ke_cache_key *k, const void *obj, size_t size);
/* The folder in use; NULL when disabled. The string stays valid until
 * ke_cache_reset. */
const char *ke_cache_dir(void);
/* mkdir -p (path is modified and restored), then checks that the result is a
 * folder we may write (root may write anywhere: only a file in the way or a
 * read-only file system stops it). 0 or an errno value. */
int ke_make_dirs(char *path);
/* Forgets the resolved folder and the disabled state so the next call reads
 * the environment again (tests; a program that changes KL_CACHE_DIR). */
void ke_cache_reset(void);

/* Process-wide counts since start (not cleared by ke_cache_reset). */
typedef struct ke_cache_stats {
    int64_t hits, misses;   /* loads while enabled; a corrupt entry is a miss too */
    int64_t corrupt;        /* entries rejected and removed */
    int64_t stores;         /* entries written */
    int64_t store_failures; /* stores attempted but not written */
} ke_cache_stats;
void ke_cache_get_stats(ke_cache_stats *s);

#endif /* KE_DISKCACHE_H */
