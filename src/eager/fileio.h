/*
 * fileio.h — the file helpers every format reader and writer shares (.npy here,
 * safetensors in src/nn): read a whole descriptor, and write a file
 * atomically (a temporary beside it, renamed over it).
 */
#ifndef KE_FILEIO_H
#define KE_FILEIO_H

#include <stddef.h>
#include <stdint.h>

/* All of fd's remaining bytes (for pipes and files mmap refuses). NULL with
 * errno set on failure; the caller frees. */
uint8_t *ke_read_all(int fd, size_t *len);

/* Writes parts[0..n) to a fresh temporary file beside path, then renames it
 * over path, so readers never see half a file. A symbolic link at path is
 * written through (the file it names is replaced; a dangling link is
 * refused); anything else that is not a regular file is refused. Returns 0,
 * or -1 with KL_ERR_IO ("kl_<op>: <path>: ...") or KL_ERR_OOM recorded. */
int ke_write_file_atomic(const char *op, const char *path, int n, const void *const *parts, const size_t *sizes);
/* Same write, recording no error (best-effort writers such as the object
 * cache must neither disturb the caller's error state nor trip
 * KL_ABORT_ON_ERROR), and replacing whatever is at path itself (a link too:
 * the cache never writes through one): returns 0, or an errno value. */
int ke_write_file_atomic_quiet(const char *path, int n, const void *const *parts, const size_t *sizes);

/* Test-only fault injection (tests/test_hardening.c): until called again with
 * err 0, every atomic write above fails with errno err: at_write 0 as it
 * creates its temporary file (a read-only or unwritable folder), at_write 1
 * after part of the data is written (a full disk: ENOSPC). Tests only: the
 * setting is process-wide. */
void ke_write_fail_inject(int err, int at_write);

#endif /* KE_FILEIO_H */
