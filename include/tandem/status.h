/* tandem: status codes and error messages.
 *
 * Every call that can fail returns a td_status: TD_OK (0) on success, a
 * negative code on failure. The code says what kind of failure; the detail
 * (which file, field, device, size) is in the calling thread's message,
 * td_last_error(), which stays valid until the next failing call on the same
 * thread. */
#ifndef TANDEM_STATUS_H
#define TANDEM_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden symbols; only TD_API ones are exported. */
#define TD_API __attribute__((visibility("default")))

/* One table gives the enum, the names and the short messages. */
#define TD_STATUS_MAP(X)                                                                           \
    X(OK, 0, "success")                                                                            \
    X(IN_PROGRESS, 1, "operation still in progress")                                               \
    X(ERR_INVALID_ARG, -1, "invalid argument")                                                     \
    X(ERR_OUT_OF_MEMORY, -2, "out of memory")                                                      \
    X(ERR_NO_DEVICE, -3, "no such device")                                                         \
    X(ERR_UNSUPPORTED, -4, "not supported")                                                        \
    X(ERR_PARSE, -5, "malformed input")                                                            \
    X(ERR_IO, -6, "input/output error")                                                            \
    X(ERR_DEVICE, -7, "device error")                                                              \
    X(ERR_DEVICE_LOST, -8, "device lost")                                                          \
    X(ERR_TIMEOUT, -9, "timed out")                                                                \
    X(ERR_SHAPE, -10, "shape mismatch")                                                            \
    X(ERR_DTYPE, -11, "data type mismatch")                                                        \
    X(ERR_CORRUPT, -12, "corrupt data")                                                            \
    X(ERR_INTERNAL, -13, "internal error")

typedef enum td_status {
#define TD_STATUS_ENUM(name, value, msg) TD_##name = value,
    TD_STATUS_MAP(TD_STATUS_ENUM)
#undef TD_STATUS_ENUM
} td_status;

/* "TD_ERR_OUT_OF_MEMORY" for TD_ERR_OUT_OF_MEMORY; "TD_UNKNOWN" otherwise.
 * The string is static. */
TD_API const char *td_status_name(td_status st);

/* A short English message for the code ("out of memory"). Static. */
TD_API const char *td_status_str(td_status st);

/* The detailed message of the last failure on this thread, such as
 * "cpu:1: allocating 1.0 GiB exceeds the budget (512.0 MiB, 12.0 MiB used)".
 * Never NULL; "" when nothing failed yet. Valid until the next failure on this
 * thread. */
TD_API const char *td_last_error(void);

/* The setting the last failure on this thread is about, named as the C API
 * names it: a field of the configuration the caller filled ("dtype",
 * "batch", "data_path", "opt.warmup_steps", td_data_options' "test_path")
 * or a call's argument. NULL when the failure is about no one setting.
 * td_last_error() names the same setting between backquotes (`dtype`), so
 * that a front end can put its own name for it (a command-line flag) in
 * its place. Set and cleared with the message; the string is static. */
TD_API const char *td_last_error_setting(void);

/* Forgets this thread's last message (and its setting). */
TD_API void td_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
