#include "core/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int log_level = -1;

static int level_from_env(void) {
    const char *s = getenv("TANDEM_LOG");
    if (!s)
        return TD_LOG_WARN;
    if (!strcmp(s, "error"))
        return TD_LOG_ERROR;
    if (!strcmp(s, "info"))
        return TD_LOG_INFO;
    if (!strcmp(s, "debug"))
        return TD_LOG_DEBUG;
    return TD_LOG_WARN;
}

void td_log_set_level(td_log_level level) {
    atomic_store(&log_level, (int)level);
}

int td__log_enabled(td_log_level level) {
    int cur = atomic_load(&log_level);
    if (cur < 0) {
        cur = level_from_env();
        atomic_store(&log_level, cur);
    }
    return (int)level <= cur;
}

void td__log(td_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    char line[2048];
    va_list ap;
    if (!td__log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so that lines from device threads do not interleave. */
    fprintf(stderr, "tandem: %s: %s\n", names[level], line);
}
