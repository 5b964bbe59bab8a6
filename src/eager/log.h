/*
 * log.h — KL_LOG topics (a comma list, like TORCH_LOGS: KL_LOG=recompile,trace
 * or KL_LOG=all): one line per event to stderr, "[kiln:topic] message".
 */
#ifndef KE_LOG_H
#define KE_LOG_H

/* 1 if topic is enabled in $KL_LOG (read once per process). */
int ke_log_on(const char *topic);
/* Prints the line if topic is enabled. */
void ke_log(const char *topic, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* KE_LOG_H */
