/*
 * error.c — the thread-local error record (first error wins), status names
 * from KL_STATUS_MAP, message formatting helpers and KL_ABORT_ON_ERROR.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct ke_error {
    kl_status code;
    char msg[1024];
} ke_error;

static _Thread_local ke_error tl_err;

/* Read at every error (errors are rare), so a program or test may set it late. */
static int abort_on_error(void) {
    const char *v = getenv("KL_ABORT_ON_ERROR");
    return v && v[0] && strcmp(v, "0") != 0;
}

int ke_verr(kl_status code, const char *op, const char *fmt, va_list ap) {
    if (tl_err.code != KL_OK) return -1; /* first error wins */
    tl_err.code = code;
    int n = snprintf(tl_err.msg, sizeof tl_err.msg, "kl_%s: ", op ? op : "?");
    if (n < 0) n = 0;
    if ((size_t)n < sizeof tl_err.msg) vsnprintf(tl_err.msg + n, sizeof tl_err.msg - (size_t)n, fmt, ap);
    ke_loc l = ke_loc_now(); /* the caller's line, when it was built with -DKL_TRACK_SOURCE */
    if (l.file) {
        size_t used = strlen(tl_err.msg);
        snprintf(tl_err.msg + used, sizeof tl_err.msg - used, " at %s:%d", l.file, l.line);
    }
    if (abort_on_error()) {
        fprintf(stderr, "kiln: %s (%s); aborting because KL_ABORT_ON_ERROR is set\n", tl_err.msg,
                kl_status_name(code));
        abort();
    }
    return -1;
}

int ke_err(kl_status code, const char *op, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ke_verr(code, op, fmt, ap);
    va_end(ap);
    return -1;
}

int ke_error_pending(void) { return tl_err.code != KL_OK; }

_Static_assert(sizeof(ke_error_stash) == sizeof(ke_error), "ke_error_stash mirrors ke_error");

void ke_error_set_aside(ke_error_stash *s) {
    s->code = tl_err.code;
    if (tl_err.code == KL_OK) return; /* the common case copies nothing */
    memcpy(s->msg, tl_err.msg, sizeof s->msg);
    kl_clear_error();
}

void ke_error_put_back(const ke_error_stash *s) {
    if (s->code == KL_OK) return;
    tl_err.code = s->code;
    memcpy(tl_err.msg, s->msg, sizeof tl_err.msg);
}

kl_status kl_last_status(void) { return tl_err.code; }
const char *kl_last_error(void) { return tl_err.code == KL_OK ? "" : tl_err.msg; }
void kl_clear_error(void) {
    tl_err.code = KL_OK;
    tl_err.msg[0] = 0;
}

const char *kl_status_name(kl_status s) {
    switch (s) {
#define KE_NAME_(name, code, desc) \
    case KL_ERR_##name:            \
        return "KL_ERR_" #name;
        KL_STATUS_MAP(KE_NAME_)
#undef KE_NAME_
    }
    return "KL_ERR_UNKNOWN";
}

const char *kl_status_string(kl_status s) {
    switch (s) {
#define KE_DESC_(name, code, desc) \
    case KL_ERR_##name:            \
        return desc;
        KL_STATUS_MAP(KE_DESC_)
#undef KE_DESC_
    }
    return "unknown status";
}

_Noreturn void ke_assert_fail(const char *what, const char *file, int line) {
    fprintf(stderr, "kiln: internal invariant broken: %s (%s:%d)\n", what, file, line);
    abort();
}

char *ke_fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    if (cap == 0) return buf;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

const char *ke_device_name(kl_device d) {
    switch (d.type) {
    case KL_CPU: return "cpu";
    case KL_CUDA: {
        /* Static strings (callers keep several names alive in one message);
         * indices past the table are not usable devices anyway. */
#define KE_CUDA_NAME_(i) "cuda:" #i
        static const char *const names[] = {
            KE_CUDA_NAME_(0),  KE_CUDA_NAME_(1),  KE_CUDA_NAME_(2),  KE_CUDA_NAME_(3),  KE_CUDA_NAME_(4),
            KE_CUDA_NAME_(5),  KE_CUDA_NAME_(6),  KE_CUDA_NAME_(7),  KE_CUDA_NAME_(8),  KE_CUDA_NAME_(9),
            KE_CUDA_NAME_(10), KE_CUDA_NAME_(11), KE_CUDA_NAME_(12), KE_CUDA_NAME_(13), KE_CUDA_NAME_(14),
            KE_CUDA_NAME_(15),
        };
#undef KE_CUDA_NAME_
        return (unsigned)d.index < sizeof names / sizeof names[0] ? names[d.index]
               : d.index < 0                                       ? "cuda:<negative index>"
                                                                   : "cuda:<index over 15>";
    }
    case KL_META: return "meta";
    }
    return "?";
}

char *ke_fmt_tensor(char *buf, size_t cap, const kl_tensor *t) {
    if (!ke_alive(t)) {
        snprintf(buf, cap, "(null)");
        return buf;
    }
    char sh[200];
    ke_fmt_shape(sh, sizeof sh, t->ndim, t->shape);
    snprintf(buf, cap, "%s %s %s", sh, ke_dtypes[t->dtype].name, ke_device_name(t->storage->device));
    return buf;
}
