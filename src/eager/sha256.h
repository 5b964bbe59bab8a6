/*
 * sha256.h — SHA-256 (FIPS 180-4), incremental and one-shot. The object
 * cache (diskcache.c) names and checks its entries with it; written here so
 * the library needs no crypto dependency. Not constant-time: it hashes
 * public data (kernel IR, compiled objects), never secrets.
 */
#ifndef KE_SHA256_H
#define KE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ke_sha256_ctx {
    uint32_t h[8];     /* chaining state */
    uint64_t nbytes;   /* message length so far */
    uint8_t buf[64];   /* pending partial block */
    size_t nbuf;       /* bytes pending in buf */
} ke_sha256_ctx;

void ke_sha256_init(ke_sha256_ctx *s);
/* Appends n bytes (p may be NULL when n is 0). */
void ke_sha256_update(ke_sha256_ctx *s, const void *p, size_t n);
/* Writes the 32-byte digest; s must be re-initialized before reuse. */
void ke_sha256_final(ke_sha256_ctx *s, uint8_t out[32]);
/* Digest of one buffer. */
void ke_sha256(const void *p, size_t n, uint8_t out[32]);

#endif /* KE_SHA256_H */
