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

/* Puts "prefix" in front of this thread's message and returns st; used by a
 * caller that knows more context (a file name) than the callee did. */
td_status td__error_prefix(td_status st, const char *fmt, ...) TD_PRINTF(2, 3);

/* Replaces this thread's message (st keeps its meaning); used to carry a
 * message from one thread to another. */
void td__error_set_message(const char *msg);

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
