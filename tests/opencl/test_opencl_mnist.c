/* A mixed group trains MNIST as a user runs it: `tandem train --devices
 * 'cpu:0,opencl:0.0' --strategy data` with the demo's settings reaches the
 * demo's accuracy floor (97.5% after 3 epochs), and the device table says
 * what each member did. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"
#include "tandem/tandem.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"

static void a_mixed_group_trains_mnist_to_the_floor(void **state) {
    char cmd[2048], *out = NULL, *err = NULL, *line;
    double acc = 0;
    int rc;
    /* Under LeakSanitizer the child may build kernels PoCL's cache lacks,
     * which leaks inside libpocl (see pocl-lsan.supp). */
    snprintf(cmd, sizeof cmd,
             "LSAN_OPTIONS=suppressions='%s' '%s' train --model '%s' --data '%s' --epochs 3 "
             "--batch 64 --optimizer sgd --lr 0.05 "
             "--momentum 0.9 --schedule cosine --seed 1 --devices 'cpu:0,opencl:0.0' "
             "--strategy data --summary --quiet",
             TD_SOURCE_DIR "/tests/opencl/pocl-lsan.supp", EXE, MLP, MNIST);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("tandem train exited %d\nstdout: %s\nstderr: %s", rc, out ? out : "",
                 err ? err : "");
    line = out ? strstr(out, "\"test_accuracy\":") : NULL;
    if (!line || sscanf(line, "\"test_accuracy\":%lf", &acc) != 1)
        fail_msg("no test accuracy in the summary: %s", out ? out : "");
    if (acc < 0.975)
        fail_msg("the mixed group reached %.2f%% after 3 epochs (floor 97.5%%)\n%s", 100 * acc,
                 out);
    /* Both members are in the table, and whatever the split, every sample. */
    assert_non_null(strstr(out, "cpu:0 "));
    assert_non_null(strstr(out, "opencl:0.0 "));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_mixed_group_trains_mnist_to_the_floor),
    };
    td_test_require_devices("opencl:0.0", "OpenCL device");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
