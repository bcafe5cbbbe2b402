/* Helpers shared by the tests: cmocka, plus checks that print tandem's own
 * message when a call fails. */
#ifndef TD_TEST_SUPPORT_H
#define TD_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four includes above first. */
#include <cmocka.h>

#include "tandem/tandem.h"

/* Fails the test with the status name and td_last_error() unless call is TD_OK. */
#define TD_ASSERT_OK(call)                                                                         \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != TD_OK)                                                                          \
            fail_msg("%s returned %s: %s", #call, td_status_name(st_), td_last_error());           \
    } while (0)

/* Fails unless call returns `want`; prints the message it gave either way. */
#define TD_ASSERT_STATUS(call, want)                                                               \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != (want))                                                                         \
            fail_msg("%s returned %s, expected %s: %s", #call, td_status_name(st_),                \
                     td_status_name(want), td_last_error());                                       \
    } while (0)

/* Opens the devices of spec or fails the test with tandem's message. */
td_device_list *td_test_open(const char *spec);

/* Fails unless td_last_error() contains needle. */
void td_test_assert_message_contains(const char *needle);

/* Exits 77 (counted as skipped by ctest) after printing "skipped: why". */
void td_test_skip(const char *why) __attribute__((noreturn));

/* Skips the test program ("skipped: no WHAT (tandem's message)") unless the
 * devices of spec open. */
void td_test_require_devices(const char *spec, const char *what);

/* Runs a command, captures its stdout and stderr into malloc'ed strings, and
 * returns its exit status (or -1). */
int td_test_run_command(const char *cmd, char **out, char **err);

/* A fresh directory for one test program's files, for cmocka_run_group_tests:
 * the setup makes it, the teardown removes it with all it holds. */
int td_test_tmpdir_setup(void **state);
int td_test_tmpdir_teardown(void **state);
const char *td_test_tmpdir(void);

/* name inside that directory. The result lives until the fourth call after
 * this one, so one statement can use several. */
const char *td_test_tmp(const char *name);

/* The whole file, malloc'ed and NUL-terminated (its length in *n unless n is
 * NULL); fails the test when it cannot be read. */
unsigned char *td_test_read_file(const char *path, size_t *n);

/* Writes n bytes to path (created or truncated); fails the test when it
 * cannot. */
void td_test_write_file(const char *path, const void *bytes, size_t n);

/* n bytes passed along the first three devices of a list: a pseudo-random
 * pattern in src (from seed), written to b[0] and copied b[0] -> b[1] ->
 * b[2]; dst is n + 1 bytes for reading back. */
typedef struct td_test_chain {
    size_t n;
    unsigned char *src, *dst;
    td_buffer *b[3];
} td_test_chain;
void td_test_chain_create(td_device_list *list, size_t n, uint32_t seed, td_test_chain *c);
void td_test_chain_destroy(td_test_chain *c);

#endif
