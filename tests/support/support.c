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

/* The whole file, malloc'ed and NUL-terminated (its length in *n unless n
 * is NULL), or NULL. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = len < 0 ? NULL : malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (buf) {
        buf[len] = '\0';
        if (n)
            *n = (size_t)len;
    }
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
    *out = slurp(outp, NULL);
    *err = slurp(errp, NULL);
    unlink(outp);
    unlink(errp);
    if (rc == -1 || !WIFEXITED(rc))
        return -1;
    return WEXITSTATUS(rc);
}

unsigned char *td_test_read_file(const char *path, size_t *n) {
    unsigned char *buf = (unsigned char *)slurp(path, n);
    if (!buf)
        fail_msg("cannot read %s", path);
    return buf;
}

void td_test_write_file(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot write %s", path);
    if (fwrite(bytes, 1, n, f) != n || fclose(f) != 0)
        fail_msg("cannot write %s", path);
}

void td_test_chain_create(td_device_list *list, size_t n, uint32_t seed, td_test_chain *c) {
    c->n = n;
    c->src = malloc(n + 1);
    c->dst = malloc(n + 1);
    assert_non_null(c->src);
    assert_non_null(c->dst);
    for (size_t i = 0; i < n; i++)
        c->src[i] = (unsigned char)((uint32_t)i * seed >> 11);
    for (size_t d = 0; d < 3; d++)
        TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, d), n, &c->b[d]));
    TD_ASSERT_OK(td_buffer_write(c->b[0], 0, c->src, n));
    TD_ASSERT_OK(td_buffer_copy(c->b[1], 0, c->b[0], 0, n));
    TD_ASSERT_OK(td_buffer_copy(c->b[2], 0, c->b[1], 0, n));
}

void td_test_chain_destroy(td_test_chain *c) {
    for (size_t d = 0; d < 3; d++)
        td_buffer_free(c->b[d]);
    free(c->src);
    free(c->dst);
}
