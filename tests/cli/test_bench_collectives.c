/* `tandem bench collectives` as a user runs it, on tiny sizes (the floors
 * are judged only by a full run, so either verdict passes here): its table
 * and floor lines, an exit status that says whether a floor failed (3 iff a
 * floor line says FAIL), the MPI section's own floor under mpirun with its
 * verdict carried out of the child processes, and usage errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

/* Runs "ENV tandem bench collectives ARGS"; returns the exit status. */
static int run_env(const char *env, const char *args, char **out, char **err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s '%s' bench collectives %s", env, TD_TANDEM_EXE, args);
    return td_test_run_command(cmd, out, err);
}

static int run(const char *args, char **out, char **err) {
    return run_env("", args, out, err);
}

/* Checks a run that finished: 0 when every floor line passed, 3 when one
 * failed, and at least one floor line. */
static void assert_verdict(int rc, const char *out, const char *err) {
    const char *p = out;
    int floors = 0, failed = 0;
    while ((p = strstr(p, "\nfloor: "))) {
        const char *eol = strchr(p + 1, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        floors++;
        failed += len >= 6 && !strncmp(p + len - 6, ": FAIL", 6);
        p += len;
    }
    if (floors == 0 || (rc != 0 && rc != 3) || (rc == 3) != (failed > 0))
        fail_msg("exit %d with %d floor lines (%d failed)\nstdout: %s\nstderr: %s", rc, floors,
                 failed, out, err);
}

static void the_local_section_prints_its_table_and_floors(void **state) {
    char *out, *err;
    int rc = run("--no-mpi --only allreduce --max-bytes 1K", &out, &err);
    assert_verdict(rc, out, err);
    assert_non_null(strstr(out, "# tandem collectives, local transport: 2 devices (cpu*2)"));
    assert_non_null(strstr(out, "\nallreduce             8 B"));
    assert_non_null(strstr(out, "\nallreduce           1 KiB"));
    assert_non_null(strstr(out, "floor: 8-byte all-reduce median <= 5 us: "));
    assert_non_null(strstr(out, "# mpi section skipped"));
    assert_null(strstr(out, "mpi transport"));
    free(out);
    free(err);
}

static void the_mpi_section_carries_its_floor_out(void **state) {
    char *out, *err;
    int rc;
#ifndef TD_HAVE_MPI
    skip();
#endif
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    /* As for tests/comm's mpirun tests: no leak check under AddressSanitizer
     * (Open MPI's unloaded plugins keep memory no suppression can match), and
     * shared memory only on one machine. */
    rc = run_env("ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 OMPI_MCA_btl=self,vader",
                 "--only allreduce --max-bytes 256", &out, &err);
    assert_verdict(rc, out, err);
    assert_non_null(strstr(out, "# tandem all-reduce, mpi transport: 2 processes"));
    assert_non_null(strstr(out, "floor: mpi transport >= 1.0x MPI_Allreduce at every size "
                                "(medians): worst "));
    /* A failed floor is a verdict, not a crash: no abort of the MPI job. */
    assert_null(strstr(err, "MPI_ABORT"));
    assert_null(strstr(err, "the MPI section failed"));
    free(out);
    free(err);
}

static void usage_errors_exit_2(void **state) {
    static const char *const bad[] = {"--bogus",
                                      "--max-bytes 2",
                                      "--max-bytes lots",
                                      "--only everything",
                                      "--min-bytes 1K --max-bytes 64",
                                      "--np 0"};
    char *out, *err;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run(bad[i], &out, &err);
        if (rc != 2 || !strstr(err, "usage: "))
            fail_msg("'%s' exited %d\nstderr: %s", bad[i], rc, err);
        free(out);
        free(err);
    }
    assert_int_equal(run("--help", &out, &err), 0);
    assert_non_null(strstr(out, "Exit status 3 when a floor fails"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_local_section_prints_its_table_and_floors),
        cmocka_unit_test(the_mpi_section_carries_its_floor_out),
        cmocka_unit_test(usage_errors_exit_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
