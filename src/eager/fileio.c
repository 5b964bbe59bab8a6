/*
 * fileio.c — whole-descriptor reads and atomic file writes (see fileio.h).
 */
#include "fileio.h"

#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

uint8_t *ke_read_all(int fd, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    uint8_t *p = malloc(cap);
    while (p) {
        if (n == cap) {
            uint8_t *q = cap <= SIZE_MAX / 2 ? realloc(p, cap * 2) : NULL;
            if (!q) {
                free(p);
                errno = ENOMEM;
                return NULL;
            }
            p = q;
            cap *= 2;
        }
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(p);
            errno = e;
            return NULL;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    *len = n;
    return p;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static _Atomic unsigned tmp_counter;
static _Atomic int inject_err, inject_at_write;

void ke_write_fail_inject(int err, int at_write) {
    inject_at_write = at_write;
    inject_err = err;
}

/* The write itself, recording nothing: 0, or an errno value with *stage saying
 * what failed (0 allocation, 1 creating the temporary, 2 writing/renaming). */
static int write_atomic(const char *path, int n, const void *const *parts, const size_t *sizes, int *stage) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 48);
    *stage = 0;
    if (!tmp) return ENOMEM;
    int inj = inject_err, fd = -1;
    if (inj && !inject_at_write) {
        free(tmp);
        *stage = 1;
        return inj;
    }
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, plen + 48, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        free(tmp);
        *stage = 1;
        return e;
    }
    int bad = 0, e = 0;
    if (inj) { /* a full disk: part of the data lands, then a write fails */
        if (n > 0 && sizes[0] > 1) (void)write_all(fd, parts[0], sizes[0] / 2);
        bad = 1, e = inj;
    }
    for (int i = 0; i < n && !bad; i++)
        if (sizes[i] && write_all(fd, parts[i], sizes[i]) != 0) bad = 1, e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, e = errno;
    if (bad) unlink(tmp);
    free(tmp);
    *stage = 2;
    return bad ? (e ? e : EIO) : 0;
}

static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int ke_write_file_atomic(const char *op, const char *path, int n, const void *const *parts, const size_t *sizes) {
    /* The rule (kiln.h): a symbolic link is written through, like cp (the
     * temporary goes beside the file it names; a dangling one is refused, as
     * cp refuses it), and only a regular file is ever replaced. Renaming over
     * the path replaced the link itself, or a FIFO or a device node. */
    struct stat st;
    char *real = NULL;
    const char *target = path;
    if (lstat(path, &st) == 0) {
        if (S_ISLNK(st.st_mode)) {
            if (stat(path, &st) != 0) {
                int e = errno;
                return ke_err(KL_ERR_IO, op, "%s: not writing through a %s symbolic link%s%s", path,
                              e == ENOENT ? "dangling" : "unusable", e == ENOENT ? "" : ": ",
                              e == ENOENT ? "" : strerror(e));
            }
            if (!(real = realpath(path, NULL)))
                return ke_err(KL_ERR_IO, op, "%s: cannot resolve the symbolic link: %s", path, strerror(errno));
            target = real;
        }
        if (!S_ISREG(st.st_mode)) {
            free(real);
            return ke_err(KL_ERR_IO, op, "%s is %s: a save replaces only a regular file", path, kind_of(st.st_mode));
        }
    }
    int stage, e = write_atomic(target, n, parts, sizes, &stage);
    free(real);
    if (!e) return 0;
    if (stage == 0) return ke_err(KL_ERR_OOM, op, "%s: out of memory", path);
    if (stage == 1) return ke_err(KL_ERR_IO, op, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
    return ke_err(KL_ERR_IO, op, "%s: write failed: %s", path, strerror(e));
}

int ke_write_file_atomic_quiet(const char *path, int n, const void *const *parts, const size_t *sizes) {
    int stage;
    return write_atomic(path, n, parts, sizes, &stage);
}
