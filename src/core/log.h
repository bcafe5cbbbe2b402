/* Internal logging to stderr. The level comes from TANDEM_LOG
 * (error, warn, info, debug; default warn) or td_log_set_level(). */
#ifndef TD_CORE_LOG_H
#define TD_CORE_LOG_H

#include "core/error.h"
#include "tandem/core.h"

void td__log(td_log_level level, const char *fmt, ...) TD_PRINTF(2, 3);
int td__log_enabled(td_log_level level);

#define TD_LOG_ERROR(...) td__log(TD_LOG_ERROR, __VA_ARGS__)
#define TD_LOG_WARN(...)  td__log(TD_LOG_WARN, __VA_ARGS__)
#define TD_LOG_INFO(...)  td__log(TD_LOG_INFO, __VA_ARGS__)
#define TD_LOG_DEBUG(...) td__log(TD_LOG_DEBUG, __VA_ARGS__)

#endif
