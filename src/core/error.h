/* Internal error helpers: set the per-thread message and return the status. */
#ifndef TD_CORE_ERROR_H
#define TD_CORE_ERROR_H

#include <stdarg.h>

#include "tandem/status.h"

#define TD_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Sets this thread's message from a printf format and returns st, so that a
 * failure reads `return td__error(TD_ERR_PARSE, "%s:%d: ...", ...);`. */
td_status td__error(td_status st, const char *fmt, ...) TD_PRINTF(2, 3);
td_status td__verror(td_status st, const char *fmt, va_list ap);

/* td__error for a failure about one setting the caller chose: records
 * `setting` (a static string, as td_last_error_setting() documents) with
 * the message. The message names the setting, and any other, between
 * backquotes and never by a command-line flag, which only the CLI knows:
 * td__error_setting(TD_ERR_INVALID_ARG, "batch", "batch %d: give at least
 * 1 (`batch`)", b). */
td_status td__error_setting(td_status st, const char *setting, const char *fmt, ...)
    TD_PRINTF(3, 4);

/* Puts "prefix" in front of this thread's message and returns st; used by a
 * caller that knows more context (a file name) than the callee did. The
 * setting stays. */
td_status td__error_prefix(td_status st, const char *fmt, ...) TD_PRINTF(2, 3);

/* Replaces this thread's message (st keeps its meaning) and forgets its
 * setting; used to carry a message from one thread to another. */
void td__error_set_message(const char *msg);
/* The same, keeping `setting` (td_last_error_setting() of the thread the
 * message came from, or NULL) with it. */
void td__error_set(const char *msg, const char *setting);

/* Evaluates a call returning td_status and jumps to `fail` on failure, with
 * the status kept in `st`. */
#define TD_TRY(call)                                                                               \
    do {                                                                                           \
        if ((st = (call)) != TD_OK)                                                                \
            goto fail;                                                                             \
    } while (0)

/* Evaluates a call returning td_status and returns its failure at once: for
 * functions with nothing to release on the way out. */
#define TD_CHECK(call)                                                                             \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != TD_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

#endif
