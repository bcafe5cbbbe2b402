#include "core/error.h"

#include <stdio.h>
#include <string.h>

#define TD_MESSAGE_MAX 2048

static _Thread_local char last_message[TD_MESSAGE_MAX];
/* Static strings (the callers' literals), so a pointer survives any thread. */
static _Thread_local const char *last_setting;

const char *td_status_name(td_status st) {
    switch (st) {
#define TD_STATUS_NAME(name, value, msg)                                                           \
    case TD_##name: return "TD_" #name;
        TD_STATUS_MAP(TD_STATUS_NAME)
#undef TD_STATUS_NAME
    }
    return "TD_UNKNOWN";
}

const char *td_status_str(td_status st) {
    switch (st) {
#define TD_STATUS_STR(name, value, msg)                                                            \
    case TD_##name: return msg;
        TD_STATUS_MAP(TD_STATUS_STR)
#undef TD_STATUS_STR
    }
    return "unknown status";
}

const char *td_last_error(void) {
    return last_message;
}

const char *td_last_error_setting(void) {
    return last_setting;
}

void td_clear_error(void) {
    last_message[0] = '\0';
    last_setting = NULL;
}

td_status td__verror(td_status st, const char *fmt, va_list ap) {
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    last_setting = NULL;
    return st;
}

td_status td__error_setting(td_status st, const char *setting, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    td__verror(st, fmt, ap);
    va_end(ap);
    last_setting = setting;
    return st;
}

td_status td__error(td_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    td__verror(st, fmt, ap);
    va_end(ap);
    return st;
}

td_status td__error_prefix(td_status st, const char *fmt, ...) {
    char joined[2 * TD_MESSAGE_MAX];
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(joined, TD_MESSAGE_MAX, fmt, ap);
    va_end(ap);
    n = strlen(joined);
    memcpy(joined + n, last_message, strlen(last_message) + 1);
    /* Longer messages are cut at the buffer's end. */
    joined[TD_MESSAGE_MAX - 1] = '\0';
    memcpy(last_message, joined, TD_MESSAGE_MAX);
    return st;
}

void td__error_set(const char *msg, const char *setting) {
    snprintf(last_message, sizeof last_message, "%s", msg ? msg : "");
    last_setting = setting;
}

void td__error_set_message(const char *msg) {
    td__error_set(msg, NULL);
}
