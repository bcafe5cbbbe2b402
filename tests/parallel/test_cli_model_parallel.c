/* The pipeline and tensor strategies through `tandem train` and `tandem
 * eval`, as users run them: one device's weights on 2 and 3 devices,
 * checkpoints resumed under another strategy, evaluation, a device lost
 * (the survivors re-plan and go back to the checkpoint), and bad
 * micro-batch counts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"

static void train(const char *launcher, const char *devices, const char *extra, const char *ckpt) {
    free(td_dp_train_cli(launcher, devices, extra, ckpt));
}

static double diff(const char *a, const char *b) {
    return td_dp_checkpoint_diff(td_test_tmp(a), td_test_tmp(b));
}

static void pipeline_matches_one_device(void **state) {
    double d2, d3, ds;
    (void)state;
    train("", "cpu:0", "--steps 12 --precision f64", "one.safetensors");
    train("", "cpu*2", "--steps 12 --precision f64 --strategy pipeline --micro-batches 4",
          "two.safetensors");
    train("", "cpu*3", "--steps 12 --precision f64 --strategy pipeline --micro-batches 3",
          "three.safetensors");
    train("", "cpu:0,cpu:1{slowdown=3}", "--steps 12 --precision f64 --strategy pipeline",
          "slowed.safetensors");
    d2 = diff("two.safetensors", "one.safetensors");
    d3 = diff("three.safetensors", "one.safetensors");
    ds = diff("slowed.safetensors", "one.safetensors");
    printf("pipeline differs from one device by %g on 2 devices, %g on 3, %g with one slowed\n", d2,
           d3, ds);
    assert_true(d2 <= 1e-12);
    assert_true(d3 <= 1e-12);
    assert_true(ds <= 1e-12);
}

/* Half a run under pipeline, the rest under single: one device's run; and
 * pipeline resumed under pipeline on the same devices: bitwise the run that
 * never stopped. */
static void resuming_under_another_strategy(void **state) {
    char extra[512];
    (void)state;
    train("", "cpu*2", "--steps 6 --precision f64 --strategy pipeline", "p6.safetensors");
    snprintf(extra, sizeof extra, "--steps 12 --precision f64 --resume %s/p6.safetensors",
             td_test_tmpdir());
    train("", "cpu:0", extra, "p6s12.safetensors");
    assert_true(diff("p6s12.safetensors", "one.safetensors") <= 1e-12);
    train("", "cpu*2", "--steps 12 --precision f64 --strategy pipeline", "p12.safetensors");
    snprintf(extra, sizeof extra,
             "--steps 12 --precision f64 --strategy pipeline --resume %s/p6.safetensors",
             td_test_tmpdir());
    train("", "cpu*2", extra, "p6p12.safetensors");
    assert_true(diff("p6p12.safetensors", "p12.safetensors") == 0.0);
}

static double eval_loss(const char *devices, const char *strategy) {
    char cmd[1024], *out = NULL, *err = NULL, *loss;
    double v;
    snprintf(cmd, sizeof cmd,
             "%s eval --checkpoint %s/one.safetensors --data %s/data/mnist --json "
             "--devices '%s' --strategy %s",
             TD_TANDEM_EXE, td_test_tmpdir(), TD_SOURCE_DIR, devices, strategy);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("'%s' failed: %s", cmd, err ? err : "");
    loss = strstr(out, "\"loss\":");
    assert_non_null(loss);
    v = strtod(loss + strlen("\"loss\":"), NULL);
    free(out);
    free(err);
    return v;
}

static void evaluation_under_pipeline_equals_one_device(void **state) {
    double one = eval_loss("cpu:0", "single"), two = eval_loss("cpu*2", "pipeline");
    (void)state;
    printf("test loss: %.17g on one device, %.17g under pipeline\n", one, two);
    assert_true(fabs(one - two) <= 1e-12 * fabs(one));
}

/* cpu:1 fails at its third step's all-gather: it held layers no other
 * device has, so the two left re-plan and go back to the checkpoint of step
 * 2, and the run ends with one device's weights. */
static void a_lost_device_sends_the_run_back_to_its_checkpoint(void **state) {
    double d;
    (void)state;
    train("TANDEM_FAULT=cpu:1@allgather:3:error ", "cpu*3",
          "--steps 12 --precision f64 --strategy pipeline --checkpoint-every 2",
          "lost.safetensors");
    d = diff("lost.safetensors", "one.safetensors");
    printf("after losing cpu:1: differs from one device by %g\n", d);
    assert_true(d <= 1e-12);
}

static void tensor_matches_one_device_and_survives_a_loss(void **state) {
    double d, dl;
    (void)state;
    train("", "cpu*3", "--steps 12 --precision f64 --strategy tensor", "tensor.safetensors");
    /* cpu:2 fails at its 12th all-reduce, in training whether or not the
     * members timed their shards first: calibration takes 3, timing 4 and
     * a step one (the MLP's pair in forward; its input needs no gradient).
     * Back to the last checkpoint, on two devices */
    train("TANDEM_FAULT=cpu:2@allreduce:12:error ", "cpu*3",
          "--steps 12 --precision f64 --strategy tensor --checkpoint-every 1",
          "tensor_lost.safetensors");
    d = diff("tensor.safetensors", "one.safetensors");
    dl = diff("tensor_lost.safetensors", "one.safetensors");
    printf("tensor differs from one device by %g, after losing cpu:2 by %g\n", d, dl);
    assert_true(d <= 1e-12);
    assert_true(dl <= 1e-12);
    assert_true(fabs(eval_loss("cpu*2", "tensor") - eval_loss("cpu:0", "single")) <=
                1e-12 * fabs(eval_loss("cpu:0", "single")));
}

/* `tandem train ARGS` exits with `code` and says `why` on stderr. */
static void refused(const char *args, int code, const char *why) {
    char cmd[1024], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/examples/mnist_mlp.json --data %s/data/mnist --steps 2 "
             "--quiet %s",
             TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != code || !err || !strstr(err, why))
        fail_msg("'%s' exited %d (wanted %d), said: %s", cmd, rc, code, err ? err : "");
    free(out);
    free(err);
}

static void bad_micro_batch_counts_are_refused(void **state) {
    (void)state;
    refused("--devices cpu*2 --strategy pipeline --micro-batches 0", 2, "--micro-batches");
    refused("--devices cpu*2 --strategy pipeline --batch 8 --micro-batches 9", 1,
            "9 micro-batches (--micro-batches) for a batch of 8 samples");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pipeline_matches_one_device),
        cmocka_unit_test(resuming_under_another_strategy),
        cmocka_unit_test(evaluation_under_pipeline_equals_one_device),
        cmocka_unit_test(a_lost_device_sends_the_run_back_to_its_checkpoint),
        cmocka_unit_test(tensor_matches_one_device_and_survives_a_loss),
        cmocka_unit_test(bad_micro_batch_counts_are_refused),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
