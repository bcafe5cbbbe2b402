#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

td_device_list *td_test_open(const char *spec) {
    td_device_list *list = NULL;
    TD_ASSERT_OK(td_devices_open(spec, &list));
    assert_non_null(list);
    return list;
}

void td_test_assert_message_contains(const char *needle) {
    const char *msg = td_last_error();
    if (!strstr(msg, needle))
        fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
}

void td_test_skip(const char *why) {
    printf("skipped: %s\n", why);
    fflush(stdout);
    exit(77);
}

void td_test_require_devices(const char *spec, const char *what) {
    td_device_list *list = NULL;
    char why[512];
    if (td_devices_open(spec, &list) == TD_OK) {
        td_device_list_destroy(list);
        return;
    }
    snprintf(why, sizeof why, "no %s (%s)", what, td_last_error());
    td_test_skip(why);
}

/* mkdtemp's template: it replaces the six Xs with a unique name. */
static char tmpdir[] = "/tmp/td_test_XXXXXX";

int td_test_tmpdir_setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

int td_test_tmpdir_teardown(void **state) {
    char cmd[64];
    (void)state;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

const char *td_test_tmpdir(void) {
    return tmpdir;
}

const char *td_test_tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    return buf;
}

int td_test_run_command(const char *cmd, char **out, char **err) {
    char outp[] = "/tmp/td_test_outXXXXXX", errp[] = "/tmp/td_test_errXXXXXX";
    int fo = mkstemp(outp), fe = mkstemp(errp);
    char *full;
    int rc;
    size_t n;
    if (fo < 0 || fe < 0)
        return -1;
    close(fo);
    close(fe);
    n = strlen(cmd) + strlen(outp) + strlen(errp) + 16;
    full = malloc(n);
    snprintf(full, n, "%s >%s 2>%s", cmd, outp, errp);
    rc = system(full);
    free(full);
    *out = slurp(outp);
    *err = slurp(errp);
    unlink(outp);
    unlink(errp);
    if (rc == -1 || !WIFEXITED(rc))
        return -1;
    return WEXITSTATUS(rc);
}

unsigned char *td_test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long len;
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    if (n)
        *n = (size_t)len;
    return buf;
}
