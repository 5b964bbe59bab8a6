/*
 * log.c — KL_LOG topics (see log.h).
 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char topics[256];

static void read_env(void) {
    const char *e = getenv("KL_LOG");
    if (e) snprintf(topics, sizeof topics, ",%s,", e);
}

int ke_log_on(const char *topic) {
    pthread_once(&once, read_env);
    if (!topics[0]) return 0;
    if (strstr(topics, ",all,")) return 1;
    char key[64];
    snprintf(key, sizeof key, ",%s,", topic);
    return strstr(topics, key) != NULL;
}

void ke_log(const char *topic, const char *fmt, ...) {
    if (!ke_log_on(topic)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[kiln:%s] %s\n", topic, msg);
}
