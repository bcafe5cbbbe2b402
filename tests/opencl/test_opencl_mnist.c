/* A mixed group trains MNIST as a user runs it: `tandem train --devices
 * 'cpu:0,opencl:0.0' --strategy data` with the demo's settings reaches the
 * demo's accuracy floor (97.5% after 3 epochs), and the device table says
 * what each member did. And a device lost while the OpenCL device sits
 * steps out: the others train on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/tandem.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"
/* Under LeakSanitizer the child may build kernels PoCL's cache lacks, which
 * leaks inside libpocl. */
#define POCL_LSAN "LSAN_OPTIONS=suppressions='" TD_SOURCE_DIR "/tests/opencl/pocl-lsan.supp' "

static void a_mixed_group_trains_mnist_to_the_floor(void **state) {
    char cmd[2048], *out = NULL, *err = NULL, *line;
    double acc = 0;
    int rc;
    snprintf(cmd, sizeof cmd,
             POCL_LSAN "'%s' train --model '%s' --data '%s' --epochs 3 --batch 64 --optimizer sgd "
                       "--lr 0.05 --momentum 0.9 --schedule cosine --seed 1 --devices "
                       "'cpu:0,opencl:0.0' --strategy data --summary --quiet",
             EXE, MLP, MNIST);
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

/* cpu:1 is lost in the fourth step while opencl:0.0 sits every step out
 * (parked: {latency=200} adds 200 ms to each of its passes), so that step
 * ran on a group of cpu:0 and cpu:1, which alone knows who failed. The
 * trainer carries on with cpu:0 and the parked device from cpu:0's replica
 * (the parked one is behind), and after 15 steps the weights equal one
 * device's (f64). The parked member is an OpenCL device because the command
 * line cannot park one of `cpu*3`'s devices and not the others. */
static void a_device_lost_while_another_is_parked(void **state) {
    static const char *const steps = "--steps 15 --precision f64 --batch 256";
    char cmd[256], *out, *row;
    int parked = -1;
    double d;
    (void)state;
    free(td_dp_train_cli("", "cpu:0", steps, "one256.safetensors"));
    snprintf(cmd, sizeof cmd, "%s --strategy data", steps);
    out = td_dp_train_cli(POCL_LSAN "TANDEM_FAULT=cpu:1@allreduce:20:error ",
                          "cpu:0,cpu:1,opencl:0.0{latency=200}", cmd, "lost.safetensors");
    if (!strstr(out, "lost: cpu:1 in step 4;"))
        fail_msg("did not say \"lost: cpu:1 in step 4;\": %s", out);
    row = strstr(out, "\nopencl:0.0 ");
    if (!row || sscanf(row, "%*s %*d %*s %*f %*f %*f %*f %d", &parked) != 1 || parked != 15)
        fail_msg("opencl:0.0 was not parked for all 15 steps: %s", out);
    free(out);
    d = td_dp_checkpoint_diff(td_test_tmp("lost.safetensors"), td_test_tmp("one256.safetensors"));
    printf("cpu:1 lost while opencl:0.0 was parked: differs from one device by %g\n", d);
    if (d > 1e-12)
        fail_msg("the survivors' weights differ from one device's by %g", d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_mixed_group_trains_mnist_to_the_floor),
        cmocka_unit_test(a_device_lost_while_another_is_parked),
    };
    td_test_require_devices("opencl:0.0", "OpenCL device");
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
