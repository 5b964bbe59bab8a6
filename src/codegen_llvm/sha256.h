/*
 * sha256.h — SHA-256 (FIPS 180-4), incremental and one-shot. The object
 * cache (objcache.c) names and checks its entries with it; written here so
 * the library needs no crypto dependency. Not constant-time: it hashes
 * public data (kernel IR, compiled objects), never secrets.
 */
#ifndef CG_SHA256_H
#define CG_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct cg_sha256_ctx {
    uint32_t h[8];     /* chaining state */
    uint64_t nbytes;   /* message length so far */
    uint8_t buf[64];   /* pending partial block */
    size_t nbuf;       /* bytes pending in buf */
} cg_sha256_ctx;

void cg_sha256_init(cg_sha256_ctx *s);
/* Appends n bytes (p may be NULL when n is 0). */
void cg_sha256_update(cg_sha256_ctx *s, const void *p, size_t n);
/* Writes the 32-byte digest; s must be re-initialized before reuse. */
void cg_sha256_final(cg_sha256_ctx *s, uint8_t out[32]);
/* Digest of one buffer. */
void cg_sha256(const void *p, size_t n, uint8_t out[32]);

#endif /* CG_SHA256_H */
