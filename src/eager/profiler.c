/*
 * profiler.c — kl_profiler_*: the recording core (see profiler.h), the
 * dispatcher's watched path, the Chrome trace writer and the summary table.
 *
 * One ring of fixed-size events for all threads: a writer takes a slot with
 * one fetch-add on the head and publishes it by storing its sequence number
 * last, so no thread waits on another and the ring's size bounds the
 * memory whatever runs. Writers count themselves in `writers` around the
 * write; kl_profiler_stop turns recording off and waits for that count to
 * drop to zero before it reads the ring, so no write lands in freed memory.
 */
#include "profiler.h"

#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_EVENTS 32768
#define MAX_EVENTS (1 << 24)

typedef struct prof_event {
    _Atomic uint64_t seq;      /* index + 1 once written; 0 while being written */
    int64_t ts, dur;           /* ns; dur < 0: an instant event */
    int64_t bytes;
    int32_t tid;
    uint8_t cat;
    char name[KE_PROF_NAME];
    char args[KE_PROF_ARGS];
} prof_event;

_Atomic int ke_prof_on;
static _Atomic int writers;
static _Atomic uint64_t head;
static prof_event *ring;
static uint64_t cap;
static int64_t t_start, t_stop;
static _Atomic int next_tid;
static _Thread_local int my_tid;
static pthread_mutex_t ctl = PTHREAD_MUTEX_INITIALIZER; /* start, stop, summary */

/* The last stopped session, sorted by thread then start time. */
static prof_event *kept;
static uint64_t nkept, kept_dropped, kept_cap;
static int have_session;

static const char *const cat_names[KE_PROF_NCAT] = {
    [KE_PROF_OP] = "op",           [KE_PROF_CALL] = "compiled_call", [KE_PROF_KERNEL] = "kernel",
    [KE_PROF_LIBRARY] = "library", [KE_PROF_TRACE] = "trace",        [KE_PROF_COMPILE] = "compile",
    [KE_PROF_CACHE] = "cache",     [KE_PROF_RECOMPILE] = "recompile", [KE_PROF_FALLBACK] = "fallback",
};

int64_t ke_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ke_observe_update(void) {
    int on = atomic_load(&ke_prof_on) ||
             atomic_load_explicit(&ke_log_levels[KE_LOG_DISPATCH], memory_order_relaxed) >= KL_LOG_INFO;
    atomic_store(&ke_observe, on);
}

static void record(ke_prof_cat cat, const char *name, int64_t t0, int64_t dur, int64_t bytes, const char *args) {
    atomic_fetch_add(&writers, 1);
    if (atomic_load(&ke_prof_on)) { /* stop may have begun since the caller looked */
        if (!my_tid) my_tid = atomic_fetch_add(&next_tid, 1) + 1;
        uint64_t i = atomic_fetch_add_explicit(&head, 1, memory_order_relaxed);
        prof_event *e = &ring[i % cap];
        atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
        e->ts = t0;
        e->dur = dur;
        e->bytes = bytes;
        e->tid = my_tid;
        e->cat = (uint8_t)cat;
        snprintf(e->name, sizeof e->name, "%s", name ? name : "?");
        snprintf(e->args, sizeof e->args, "%s", args ? args : "");
        atomic_store_explicit(&e->seq, i + 1, memory_order_release);
    }
    atomic_fetch_sub(&writers, 1);
}

void ke_prof_complete(ke_prof_cat cat, const char *name, int64_t t0, int64_t t1, int64_t bytes, const char *args) {
    record(cat, name, t0, t1 - t0, bytes, args);
}

void ke_prof_instant(ke_prof_cat cat, const char *name, const char *args) {
    record(cat, name, ke_prof_now(), -1, 0, args);
}

void ke_prof_json_str(char *buf, size_t bcap, size_t *used, const char *s) {
    size_t u = *used;
#define PUT(ch) do { if (u + 1 < bcap) buf[u] = (ch); u++; } while (0)
    PUT('"');
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            PUT('\\');
            PUT((char)ch);
        } else if (ch == '\n') {
            PUT('\\');
            PUT('n');
        } else if (ch < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            for (char *p = esc; *p; p++) PUT(*p);
        } else {
            PUT((char)ch);
        }
    }
    PUT('"');
#undef PUT
    if (bcap) buf[u < bcap ? u : bcap - 1] = 0;
    *used = u < bcap ? u : bcap - 1;
}

/* ---- the dispatcher's watched path -------------------------------------------------- */

/* "f32[2,3] cpu" per input, for the log line and the event. */
static void fmt_inputs(const ke_call *c, char *buf, size_t bcap) {
    size_t u = 0;
    buf[0] = 0;
    for (int i = 0; i < c->nin && u + 1 < bcap; i++) {
        char sh[160];
        const kl_tensor *t = c->in[i];
        if (!t || t->magic != KE_MAGIC_LIVE) {
            u += (size_t)snprintf(buf + u, bcap - u, "%s?", i ? ", " : "");
            continue;
        }
        u += (size_t)snprintf(buf + u, bcap - u, "%s%s%s", i ? ", " : "", ke_dtypes[t->dtype].short_name,
                              (t->flags & KE_TF_WRAPPED) ? "(scalar)" : ke_fmt_shape(sh, sizeof sh, t->ndim, t->shape));
    }
}

/* The event's args: shapes, dtypes, device, bytes of fresh outputs. */
static int64_t op_args(const ke_call *c, int rc, char *buf, size_t bcap) {
    size_t u = 0;
    int64_t bytes = 0;
    kl_device dev = c->device;
    if (c->nin > 0 && c->in[0] && c->in[0]->magic == KE_MAGIC_LIVE) dev = c->in[0]->storage->device;
    u += (size_t)snprintf(buf + u, bcap - u, "\"shapes\": [");
    for (int i = 0; i < c->nin && u < bcap; i++) {
        const kl_tensor *t = c->in[i];
        u += (size_t)snprintf(buf + u, bcap - u, "%s[", i ? ", " : "");
        for (int d = 0; t && t->magic == KE_MAGIC_LIVE && d < t->ndim && u < bcap; d++)
            u += (size_t)snprintf(buf + u, bcap - u, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        u += (size_t)snprintf(buf + u, bcap - u, "]");
    }
    u += (size_t)snprintf(buf + u, bcap - u, "], \"dtypes\": [");
    for (int i = 0; i < c->nin && u < bcap; i++) {
        const kl_tensor *t = c->in[i];
        u += (size_t)snprintf(buf + u, bcap - u, "%s\"%s%s\"", i ? ", " : "",
                              t && t->magic == KE_MAGIC_LIVE ? ke_dtypes[t->dtype].short_name : "?",
                              t && t->magic == KE_MAGIC_LIVE && (t->flags & KE_TF_WRAPPED) ? " scalar" : "");
    }
    if (rc == 0)
        for (int j = c->inplace ? 1 : 0; j < c->nout; j++) {
            const kl_tensor *o = c->out[j];
            int fresh = o != NULL;
            for (int i = 0; i < c->nin && fresh; i++)
                if (c->in[i] && c->in[i]->storage == o->storage) fresh = 0;
            if (fresh) bytes += (int64_t)o->storage->nbytes;
        }
    if (u < bcap)
        u += (size_t)snprintf(buf + u, bcap - u, "], \"device\": \"%s\", \"bytes\": %lld%s", ke_device_name(dev),
                              (long long)bytes, rc ? ", \"error\": true" : "");
    ke_loc l = ke_loc_now(); /* the user's line (-DKL_TRACK_SOURCE) */
    if (l.file && u < bcap) {
        char at[300];
        size_t n = 0;
        snprintf(at, sizeof at, "%s:%d", l.file, l.line);
        char q[620];
        ke_prof_json_str(q, sizeof q, &n, at);
        if (u + n + 10 < bcap) { /* whole or not at all */
            memcpy(buf + u, ", \"loc\": ", 9);
            memcpy(buf + u + 9, q, n + 1);
            u += 9 + n;
        }
    }
    return bytes;
}

int ke_observed_dispatch(ke_call *c) {
    ke_log_init(); /* the first op reads $KL_LOG (ke_observe starts at 1 for this) */
    int prof = ke_prof_active();
    int logd = ke_log_on(KE_LOG_DISPATCH);
    if (!prof && !logd) return ke_dispatch_unobserved(c);
    int64_t t0 = prof ? ke_prof_now() : 0;
    int rc = ke_dispatch_unobserved(c);
    int64_t t1 = prof ? ke_prof_now() : 0;
    int meta = c->nin > 0 ? c->in[0] && c->in[0]->magic == KE_MAGIC_LIVE && c->in[0]->storage->device.type == KL_META
                          : c->device.type == KL_META;
    if (prof && !meta) {
        char args[KE_PROF_ARGS], name[KE_PROF_NAME];
        int64_t bytes = op_args(c, rc, args, sizeof args);
        snprintf(name, sizeof name, "%s%s", ke_opname(c), c->inplace ? "_" : "");
        ke_prof_complete(KE_PROF_OP, name, t0, t1, bytes, args);
    }
    if (logd) {
        char ins[600], out[200] = "error";
        fmt_inputs(c, ins, sizeof ins);
        if (rc == 0 && c->nout > 0 && c->out[0]) {
            char sh[160];
            snprintf(out, sizeof out, "%s%s", ke_dtypes[c->out[0]->dtype].short_name,
                     ke_fmt_shape(sh, sizeof sh, c->out[0]->ndim, c->out[0]->shape));
        }
        kl_device dev = c->device;
        if (c->nin > 0 && c->in[0] && c->in[0]->magic == KE_MAGIC_LIVE) dev = c->in[0]->storage->device;
        char at[320];
        ke_loc_fmt(at + 4, sizeof at - 4, ke_loc_now(), NULL);
        if (at[4]) memcpy(at, " at ", 4);
        ke_log(KE_LOG_DISPATCH, "%s%s(%s) -> %s on %s%s", ke_opname(c), c->inplace ? "_" : "", ins, out,
               ke_device_name(dev), at[4] ? at : "");
    }
    return rc;
}

/* ---- start and stop ------------------------------------------------------------------- */

int kl_profiler_start(const kl_profiler_options *opts) {
    ke_log_init();
    int64_t n = opts && opts->max_events ? opts->max_events : DEFAULT_EVENTS;
    if (n < 1 || n > MAX_EVENTS)
        return ke_err(KL_ERR_ARG, "profiler_start", "max_events must be in [1, %d] (0: the default %d), got %lld",
                      MAX_EVENTS, DEFAULT_EVENTS, (long long)n);
    pthread_mutex_lock(&ctl);
    if (atomic_load(&ke_prof_on)) {
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_STATE, "profiler_start", "the profiler is already recording");
    }
    prof_event *r = calloc((size_t)n, sizeof *r);
    if (!r) {
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_OOM, "profiler_start", "out of memory for %lld events", (long long)n);
    }
    ring = r;
    cap = (uint64_t)n;
    atomic_store(&head, 0);
    t_start = ke_prof_now();
    atomic_store(&ke_prof_on, 1);
    ke_observe_update();
    pthread_mutex_unlock(&ctl);
    return 0;
}

static int by_thread_then_time(const void *a, const void *b) {
    const prof_event *x = a, *y = b;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) return x->dur > y->dur ? -1 : 1; /* the enclosing event first */
    return 0;
}

static void fmt_us(FILE *o, int64_t ns) { fprintf(o, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000)); }

static int write_trace(const char *path) {
    FILE *o = fopen(path, "w");
    if (!o) return ke_err(KL_ERR_IO, "profiler_stop", "cannot write %s: %s", path, strerror(errno));
    fprintf(o, "{\"traceEvents\": [\n");
    fprintf(o, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": {\"name\": \"kiln\"}}");
    int last_tid = 0;
    for (uint64_t i = 0; i < nkept; i++) {
        const prof_event *e = &kept[i];
        if (e->tid != last_tid) {
            fprintf(o, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": "
                       "\"thread %d\"}}", e->tid, e->tid);
            last_tid = e->tid;
        }
        char name[KE_PROF_NAME * 2 + 8];
        size_t u = 0;
        ke_prof_json_str(name, sizeof name, &u, e->name);
        fprintf(o, ",\n{\"name\": %s, \"cat\": \"%s\", \"ph\": \"%s\", \"ts\": ", name, cat_names[e->cat],
                e->dur < 0 ? "i" : "X");
        fmt_us(o, e->ts - t_start);
        if (e->dur >= 0) {
            fprintf(o, ", \"dur\": ");
            fmt_us(o, e->dur);
        } else {
            fprintf(o, ", \"s\": \"t\"");
        }
        fprintf(o, ", \"pid\": 1, \"tid\": %d, \"args\": {%s}}", e->tid, e->args);
    }
    fprintf(o, "\n],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": {\"producer\": \"kiln profiler\", \"events\": %llu, "
               "\"dropped\": %llu, \"max_events\": %llu, \"wall_us\": ",
            (unsigned long long)nkept, (unsigned long long)kept_dropped, (unsigned long long)kept_cap);
    fmt_us(o, t_stop - t_start);
    fprintf(o, "}}\n");
    int bad = ferror(o);
    if (fclose(o) || bad) return ke_err(KL_ERR_IO, "profiler_stop", "cannot write %s: %s", path, strerror(errno));
    return 0;
}

int kl_profiler_stop(const char *path) {
    pthread_mutex_lock(&ctl);
    if (!atomic_load(&ke_prof_on)) {
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_STATE, "profiler_stop", "the profiler is not recording (kl_profiler_start first)");
    }
    atomic_store(&ke_prof_on, 0);
    ke_observe_update();
    while (atomic_load(&writers)) /* writes in flight take microseconds */
        sched_yield();
    t_stop = ke_prof_now();
    uint64_t h = atomic_load(&head), n = h < cap ? h : cap;
    free(kept);
    kept = malloc(sizeof *kept * (size_t)(n ? n : 1));
    nkept = 0;
    if (kept)
        for (uint64_t i = h - n; i < h; i++) {
            prof_event *e = &ring[i % cap];
            if (atomic_load_explicit(&e->seq, memory_order_acquire) != i + 1) continue;
            memcpy(&kept[nkept], e, sizeof *e);
            nkept++;
        }
    kept_dropped = h - nkept;
    kept_cap = cap;
    free(ring);
    ring = NULL;
    if (!kept) {
        have_session = 0;
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_OOM, "profiler_stop", "out of memory");
    }
    qsort(kept, (size_t)nkept, sizeof *kept, by_thread_then_time);
    have_session = 1;
    int rc = path ? write_trace(path) : 0;
    pthread_mutex_unlock(&ctl);
    return rc;
}

/* ---- the summary ----------------------------------------------------------------------- */

typedef struct row {
    const char *name;
    uint8_t cat;
    int64_t calls, total, self, bytes;
} row;

static int by_total(const void *a, const void *b) {
    const row *x = a, *y = b;
    if (x->total != y->total) return x->total > y->total ? -1 : 1;
    if (x->calls != y->calls) return x->calls > y->calls ? -1 : 1;
    int c = strcmp(x->name, y->name);
    return c ? c : (int)x->cat - (int)y->cat;
}

static void fmt_time(char *buf, size_t n, double ns) {
    if (ns >= 1e9) snprintf(buf, n, "%.3fs", ns * 1e-9);
    else if (ns >= 1e6) snprintf(buf, n, "%.3fms", ns * 1e-6);
    else snprintf(buf, n, "%.3fus", ns * 1e-3);
}

int kl_profiler_summary(FILE *stream) {
    if (!stream) return ke_err(KL_ERR_NULL_ARG, "profiler_summary", "stream is NULL");
    pthread_mutex_lock(&ctl);
    if (!have_session) {
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_STATE, "profiler_summary", "no profiling session has stopped yet");
    }
    /* self time: an event's duration less its children's (events nest per thread) */
    int64_t *self = malloc(sizeof *self * (size_t)(nkept + 1));
    uint64_t *stack = malloc(sizeof *stack * (size_t)(nkept + 1));
    row *rows = calloc((size_t)nkept + 1, sizeof *rows);
    if (!self || !stack || !rows) {
        free(self), free(stack), free(rows);
        pthread_mutex_unlock(&ctl);
        return ke_err(KL_ERR_OOM, "profiler_summary", "out of memory");
    }
    uint64_t depth = 0;
    for (uint64_t i = 0; i < nkept; i++) {
        const prof_event *e = &kept[i];
        self[i] = e->dur > 0 ? e->dur : 0;
        while (depth && (kept[stack[depth - 1]].tid != e->tid ||
                         kept[stack[depth - 1]].ts + kept[stack[depth - 1]].dur <= e->ts))
            depth--;
        if (depth && e->dur > 0) self[stack[depth - 1]] -= e->dur;
        if (e->dur > 0) stack[depth++] = i;
    }
    size_t nrows = 0;
    int64_t self_sum = 0;
    for (uint64_t i = 0; i < nkept; i++) {
        const prof_event *e = &kept[i];
        size_t r = 0;
        while (r < nrows && (rows[r].cat != e->cat || strcmp(rows[r].name, e->name))) r++;
        if (r == nrows) rows[nrows].name = e->name, rows[nrows].cat = e->cat, nrows++;
        rows[r].calls++;
        rows[r].total += e->dur > 0 ? e->dur : 0;
        rows[r].self += self[i] > 0 ? self[i] : 0;
        rows[r].bytes += e->bytes;
        self_sum += self[i] > 0 ? self[i] : 0;
    }
    qsort(rows, nrows, sizeof *rows, by_total);
    char wall[32];
    fmt_time(wall, sizeof wall, (double)(t_stop - t_start));
    fprintf(stream, "kiln profiler: %llu events over %s (%llu dropped; ring of %llu)\n", (unsigned long long)nkept,
            wall, (unsigned long long)kept_dropped, (unsigned long long)kept_cap);
    const char *rule = "-----------------------------------------------------------------------------------------------"
                       "-----------------------------";
    fprintf(stream, "%.*s\n", 124, rule);
    fprintf(stream, "%-36s %-14s %8s %12s %8s %12s %12s %8s %12s\n", "Name", "Category", "Self %", "Self time",
            "Total %", "Total time", "Avg time", "Calls", "Bytes");
    fprintf(stream, "%.*s\n", 124, rule);
    for (size_t r = 0; r < nrows; r++) {
        char st[32], tt[32], at[32];
        fmt_time(st, sizeof st, (double)rows[r].self);
        fmt_time(tt, sizeof tt, (double)rows[r].total);
        fmt_time(at, sizeof at, (double)rows[r].total / (double)rows[r].calls);
        double den = self_sum > 0 ? (double)self_sum : 1;
        fprintf(stream, "%-36.36s %-14s %7.2f%% %12s %7.2f%% %12s %12s %8lld %12lld\n", rows[r].name,
                cat_names[rows[r].cat], 100.0 * (double)rows[r].self / den, st, 100.0 * (double)rows[r].total / den, tt,
                at, (long long)rows[r].calls, (long long)rows[r].bytes);
    }
    fprintf(stream, "%.*s\n", 124, rule);
    char ss[32];
    fmt_time(ss, sizeof ss, (double)self_sum);
    fprintf(stream, "Self time total: %s\n", ss);
    free(self), free(stack), free(rows);
    pthread_mutex_unlock(&ctl);
    return 0;
}
