/*
 * log.c — KL_LOG categories and levels (see log.h; the syntax is kiln.h's).
 *
 * Levels are read on every ke_log call site's test, so they are atomics in
 * one array; the callback and its user pointer change together under a lock,
 * which also keeps lines from several threads whole.
 */
#include "log.h"

#include "core.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Atomic unsigned char ke_log_levels[KE_LOG_NCAT];
_Atomic int ke_observe = 1;

static const char *const cat_names[KE_LOG_NCAT] = {
    [KE_LOG_DISPATCH] = "dispatch", [KE_LOG_TRACE] = "trace",         [KE_LOG_GRAPH] = "graph",
    [KE_LOG_FUSION] = "fusion",     [KE_LOG_CODEGEN] = "codegen",     [KE_LOG_CACHE] = "cache",
    [KE_LOG_RECOMPILE] = "recompile", [KE_LOG_FALLBACK] = "fallback", [KE_LOG_GUARDS] = "guards",
};

const char *ke_log_cat_name(ke_log_cat cat) { return (unsigned)cat < KE_LOG_NCAT ? cat_names[cat] : "?"; }

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static kl_log_fn sink_fn;
static void *sink_user;
static _Thread_local int in_sink; /* a callback that logs would take sink_lock twice */

/* Parses spec into lv[]; unknown names are listed into bad (empty if none). */
static void parse_spec(const char *spec, unsigned char *lv, char *bad, size_t badcap) {
    for (int c = 0; c < KE_LOG_NCAT; c++) lv[c] = KL_LOG_WARN;
    bad[0] = 0;
    const char *s = spec;
    while (s && *s) {
        while (*s == ',' || isspace((unsigned char)*s)) s++;
        if (!*s) break;
        kl_log_level level = KL_LOG_INFO;
        if (*s == '+') level = KL_LOG_DEBUG, s++;
        else if (*s == '-') level = KL_LOG_OFF, s++;
        const char *e = s;
        while (*e && *e != ',' && !isspace((unsigned char)*e)) e++;
        size_t n = (size_t)(e - s);
        int found = 0;
        if (n == 3 && !strncmp(s, "all", 3)) {
            for (int c = 0; c < KE_LOG_NCAT; c++) lv[c] = (unsigned char)level;
            found = 1;
        }
        for (int c = 0; c < KE_LOG_NCAT && !found; c++)
            if (strlen(cat_names[c]) == n && !strncmp(s, cat_names[c], n)) lv[c] = (unsigned char)level, found = 1;
        if (!found && n) {
            size_t used = strlen(bad);
            snprintf(bad + used, badcap - used, "%s\"%.*s\"", used ? ", " : "", (int)n, s);
        }
        s = e;
    }
}

static void apply(const unsigned char *lv) {
    for (int c = 0; c < KE_LOG_NCAT; c++) atomic_store_explicit(&ke_log_levels[c], lv[c], memory_order_relaxed);
    ke_observe_update();
}

static void read_env(void) {
    unsigned char lv[KE_LOG_NCAT];
    char bad[256];
    parse_spec(getenv("KL_LOG"), lv, bad, sizeof bad);
    apply(lv);
    if (bad[0])
        fprintf(stderr, "[kiln:log] KL_LOG: unknown category %s (categories: dispatch, trace, graph, fusion, codegen, "
                        "cache, recompile, fallback, guards, all)\n", bad);
}

void ke_log_init(void) { pthread_once(&once, read_env); }

int kl_set_log(const char *spec) {
    ke_log_init();
    unsigned char lv[KE_LOG_NCAT];
    char bad[256];
    parse_spec(spec, lv, bad, sizeof bad);
    if (bad[0])
        return ke_err(KL_ERR_ARG, "set_log",
                      "unknown category %s (categories: dispatch, trace, graph, fusion, codegen, cache, recompile, "
                      "fallback, guards, all)", bad);
    apply(lv);
    return 0;
}

void kl_set_log_callback(kl_log_fn fn, void *user) {
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_user = user;
    pthread_mutex_unlock(&sink_lock);
}

int ke_log_at(ke_log_cat cat, kl_log_level lv) {
    ke_log_init();
    return lv != KL_LOG_OFF && atomic_load_explicit(&ke_log_levels[cat], memory_order_relaxed) >= lv;
}

void ke_logl(ke_log_cat cat, kl_log_level lv, const char *fmt, ...) {
    if (!ke_log_at(cat, lv) || in_sink) return;
    char small[1024], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1))) { /* graph text is long */
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (!msg) msg = small;
    pthread_mutex_lock(&sink_lock);
    in_sink = 1;
    if (sink_fn) sink_fn(sink_user, cat_names[cat], lv, msg);
    else fprintf(stderr, "[kiln:%s] %s\n", cat_names[cat], msg);
    in_sink = 0;
    pthread_mutex_unlock(&sink_lock);
    if (msg != small) free(msg);
}
