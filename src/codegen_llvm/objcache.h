/*
 * objcache.h — the on-disk cache of compiled kernel objects. The LLVM backend
 * hashes what decides a kernel's machine code (kernel IR text, CPU name and
 * features, LLVM and Kiln versions) into a cg_key, asks cg_cache_load before
 * compiling and hands the emitted object to cg_cache_store after. Pure C, no
 * LLVM: the cache only moves bytes.
 *
 * Where: $KL_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln;
 * KL_CACHE_DIR set to "" or "off" disables it. The environment is read once,
 * on first use (cg_cache_reset re-reads it). The folder is created on the
 * first store; if it cannot be (a file in the way, no permission) the cache
 * disables itself for the process with one KL_LOG=cache line.
 *
 * Entries are <dir>/<64 hex digits of the key>.o.kc: an 88-byte header (magic,
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
#ifndef CG_OBJCACHE_H
#define CG_OBJCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct cg_key { uint8_t b[32]; } cg_key; /* SHA-256 */

/* SHA-256 over parts[0..n), each framed by its length (8 bytes, little
 * endian) so ("ab","c") and ("a","bc") differ. parts[i] may be NULL when
 * sizes[i] is 0. */
void cg_key_of(cg_key *k, int n, const void *const *parts, const size_t *sizes);
/* The key as 64 lowercase hex digits and a NUL. */
void cg_key_hex(const cg_key *k, char out[65]);

/* 1 and *obj (malloc'd, caller frees; non-NULL even for an empty payload) +
 * *size on a hit; 0 on a miss, a disabled cache, or a corrupt, truncated or
 * foreign file (which is removed and logged, never trusted); never an error
 * for the caller. */
int cg_cache_load(const cg_key *k, void **obj, size_t *size);
/* Stores atomically (temp file + rename); failures only log. obj may be NULL
 * when size is 0. */
void cg_cache_store(const cg_key *k, const void *obj, size_t size);
/* The folder in use; NULL when disabled. The string stays valid until
 * cg_cache_reset. */
const char *cg_cache_dir(void);
/* Forgets the resolved folder and the disabled state so the next call reads
 * the environment again (tests; a program that changes KL_CACHE_DIR). */
void cg_cache_reset(void);

/* Process-wide counts since start (not cleared by cg_cache_reset). */
typedef struct cg_cache_stats {
    int64_t hits, misses;   /* loads while enabled; a corrupt entry is a miss too */
    int64_t corrupt;        /* entries rejected and removed */
    int64_t stores;         /* entries written */
    int64_t store_failures; /* stores attempted but not written */
} cg_cache_stats;
void cg_cache_get_stats(cg_cache_stats *s);

#endif /* CG_OBJCACHE_H */
