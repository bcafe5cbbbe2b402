/* tandem train --monitor as a user runs it: under a pseudo-terminal (script
 * from util-linux) the block of lines redrawn in place, a bar line per
 * device with plausible numbers (busy and share fractions, shares adding up
 * to the whole batch, memory in use above 0); without a terminal a plain
 * line per refresh and no escape codes; the options it cannot go with.
 *
 * script comes with Debian (bsdutils); without it the test fails rather
 * than skips, since it is a tool of the build machine, not a device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"
#define RUN                                                                                        \
    "'" EXE "' train --model " MLP " --data " MNIST " --steps 30 --batch 128 --eval-samples 500 "  \
    "--monitor"

/* One device's line of the block, as drawn:
 *   "  cpu:0   busy [###....]  62%  mem [.......] 4.0M/24G  share [####...]  53.1%  time 0.8 ms" */
typedef struct dev_line {
    char name[32];
    double busy, share, time_ms, mem_used; /* percent, percent, ms, bytes */
} dev_line;

/* "4.0M" as bytes; -1 when it is not such a number. */
static double bytes_of(const char *s) {
    char *end;
    double v = strtod(s, &end);
    const char *units = "KMGTP", *u = strchr(units, *end);
    if (end == s || !*end || !u)
        return -1;
    for (double k = 1024; u >= units; u--)
        v *= k;
    return v;
}

/* Parses a device line; 1 when it is one. */
static int parse_dev_line(const char *line, dev_line *d) {
    char label[8], busy_bar[40], mem_bar[40], mem[40], share_bar[40];
    memset(d, 0, sizeof *d);
    if (sscanf(line,
               " %31s %7s [%39[#.]] %lf%% mem [%39[#.]] %39s share [%39[#.]] %lf%% time %lf ms",
               d->name, label, busy_bar, &d->busy, mem_bar, mem, share_bar, &d->share,
               &d->time_ms) != 9)
        return 0;
    if (strcmp(label, "busy") && strcmp(label, "util"))
        return 0;
    d->mem_used = bytes_of(mem);
    return 1;
}

/* Fails unless the tool is on PATH. */
static void require_tool(const char *tool, const char *package) {
    char cmd[256], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "command -v %s", tool);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("%s not found: install %s", tool, package);
    free(out);
    free(err);
}

/* Checks the numbers of one refresh's device lines: want of them, named
 * "cpu:0", "cpu:1", ... (or "cpu", the one device of the spec "cpu"). */
static void check_devices(const dev_line *d, int n, int want, const char *text) {
    double shares = 0;
    if (n != want)
        fail_msg("a refresh shows %d device lines, expected %d:\n%s", n, want, text);
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, want == 1 ? "cpu" : "cpu:%d", i);
        if (strcmp(d[i].name, name))
            fail_msg("device line %d is %s, expected %s:\n%s", i, d[i].name, name, text);
        if (d[i].busy < 0 || d[i].busy > 100 || d[i].share < 0 || d[i].share > 100 ||
            d[i].time_ms < 0)
            fail_msg("%s: busy %.1f%%, share %.1f%%, time %.1f ms: out of range:\n%s", d[i].name,
                     d[i].busy, d[i].share, d[i].time_ms, text);
        if (!(d[i].mem_used > 0))
            fail_msg("%s: no memory in use:\n%s", d[i].name, text);
        shares += d[i].share;
    }
    if (shares < 99.5 || shares > 100.5)
        fail_msg("the shares add up to %.1f%%:\n%s", shares, text);
}

/* Whether `script` can give a command a terminal here; when it cannot (no
 * /dev/pts in a container or a bare chroot), why, in why. Any other failure
 * of script fails the test. */
static int script_has_a_terminal(char *why, size_t n) {
    char *out = NULL, *err = NULL;
    int rc = td_test_run_command("script -qfec true /dev/null", &out, &err);
    int no_pty = rc != 0 && err &&
                 (strstr(err, "pseudo-terminal") || strstr(err, "openpty") || strstr(err, "pty"));
    if (rc != 0 && !no_pty)
        fail_msg("'script -qfec true /dev/null' exited %d: %s", rc, err ? err : "");
    if (no_pty) {
        char *nl = strchr(err, '\n');
        if (nl)
            *nl = '\0';
        snprintf(why, n, "script finds no pseudo-terminal (%s)", err);
    }
    free(out);
    free(err);
    return !no_pty;
}

/* In a terminal: blocks of a header line ("... | step X ms") and a line per
 * device, each block after the first going back up over the one before. */
static void tty_redraws_a_block(void **state) {
    char cmd[2048], *out = NULL, *err = NULL, *save = NULL, *copy, why[512];
    dev_line d[8];
    int rc, n = -1, blocks = 0;
    (void)state;
    require_tool("script", "bsdutils (util-linux)");
    if (!script_has_a_terminal(why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    snprintf(cmd, sizeof cmd,
             "script -qfec \"" RUN " --devices 'cpu*2' --strategy data\" /dev/null");
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("'%s' exited %d\nstdout: %s\nstderr: %s", cmd, rc, out, err);
    assert_non_null(strstr(out, "final test accuracy"));
    copy = strdup(out);
    /* Rows end in \n, and each starts with \r and the erase-line code. */
    for (char *row = strtok_r(copy, "\n", &save); row; row = strtok_r(NULL, "\n", &save)) {
        char *text = strrchr(row, '\r') && strrchr(row, '\r')[1] ? strrchr(row, '\r') + 1 : row;
        char *k = strstr(row, "\033[K");
        dev_line one;
        if (k)
            text = k + 3;
        if (strstr(text, "| step ") && strstr(text, "ms")) {
            if (n >= 0)
                check_devices(d, n, 2, out);
            n = 0;
            blocks++;
        } else if (n >= 0 && parse_dev_line(text, &one)) {
            if (n < 8)
                d[n] = one;
            n++;
        }
    }
    free(copy);
    if (blocks == 0)
        fail_msg("no monitor block in the terminal's output:\n%s", out);
    check_devices(d, n, 2, out);
    /* Redrawn in place: back up over the block (header and two devices) and
     * erase down. */
    assert_non_null(strstr(out, "\033[3A"));
    assert_non_null(strstr(out, "\033[J"));
    print_message("%d refreshes; last: %s %.0f%% busy %.1f%% share %.0f bytes, %s %.0f%% busy "
                  "%.1f%% share %.0f bytes\n",
                  blocks, d[0].name, d[0].busy, d[0].share, d[0].mem_used, d[1].name, d[1].busy,
                  d[1].share, d[1].mem_used);
    free(out);
    free(err);
}

/* The plain lines on stderr: "monitor: step N, X ms/step: cpu:0 busy 62% mem
 * 4.0M/24G share 53.1% time 0.8 ms; cpu:1 ...". */
static int plain_line(const char *line, dev_line *d, int max) {
    const char *p = strstr(line, "ms/step:");
    int n = 0;
    if (strncmp(line, "monitor: step ", 14) || !p)
        return -1;
    for (p += 8; p && *p && n < max; n++) {
        char label[8], mem[40];
        memset(&d[n], 0, sizeof d[n]);
        if (sscanf(p, " %31s %7s %lf%% mem %39s share %lf%% time %lf ms", d[n].name, label,
                   &d[n].busy, mem, &d[n].share, &d[n].time_ms) != 6)
            return -1;
        d[n].mem_used = bytes_of(mem);
        if ((p = strchr(p, ';')))
            p++;
    }
    return n;
}

/* Without a terminal: the first step's line (the next would come 10 s
 * later), no escape codes, stdout as without --monitor. */
static void plain_lines_without_a_terminal(void **state) {
    char *out = NULL, *err = NULL, *save = NULL;
    const char *cases[][2] = {{"--devices 'cpu*2' --strategy data", "2"}, {"--devices cpu", "1"}};
    (void)state;
    for (int c = 0; c < 2; c++) {
        char cmd[2048];
        int lines = 0, rc;
        snprintf(cmd, sizeof cmd, RUN " %s", cases[c][0]);
        rc = td_test_run_command(cmd, &out, &err);
        if (rc != 0)
            fail_msg("'%s' exited %d\nstdout: %s\nstderr: %s", cmd, rc, out, err);
        if (strchr(err, '\033') || strchr(out, '\033'))
            fail_msg("escape codes without a terminal:\n%s", err);
        for (char *line = strtok_r(err, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            dev_line d[8];
            int n = plain_line(line, d, 8);
            if (n < 0)
                continue;
            check_devices(d, n, atoi(cases[c][1]), line);
            lines++;
        }
        if (lines < 1 || lines > 2)
            fail_msg("%d monitor lines from a short run (one at its first step):\n%s", lines, err);
        assert_non_null(strstr(out, "final test accuracy"));
        free(out);
        free(err);
    }
}

static void options_it_cannot_go_with(void **state) {
    char *out = NULL, *err = NULL;
    (void)state;
    assert_int_equal(td_test_run_command(RUN " --quiet", &out, &err), 2);
    assert_non_null(strstr(err, "--monitor shows the devices while --quiet shows nothing"));
    free(out);
    free(err);
    assert_int_equal(td_test_run_command("'" EXE "' train --help", &out, &err), 0);
    assert_non_null(strstr(out, "--monitor"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tty_redraws_a_block),
        cmocka_unit_test(plain_lines_without_a_terminal),
        cmocka_unit_test(options_it_cannot_go_with),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
