/* tandem train and tandem eval as a user runs them: help, bad input, and a
 * short run whose checkpoint eval reads back. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"

/* Runs "tandem <args>" and checks the exit status and that stderr (or
 * stdout when err_needle is NULL) holds the needle. */
static void expect(const char *args, int want_rc, const char *out_needle, const char *err_needle) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' %s", EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", args, rc, want_rc,
                 out ? out : "", err ? err : "");
    if (out_needle && (!out || !strstr(out, out_needle)))
        fail_msg("'%s': stdout lacks \"%s\": %s", args, out_needle, out ? out : "");
    if (err_needle && (!err || !strstr(err, err_needle)))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, err_needle, err ? err : "");
    free(out);
    free(err);
}

static void help_describes_the_options(void **state) {
    expect("train --help", 0, "--resume", NULL);
    expect("train --help", 0, "--metrics", NULL);
    expect("eval --help", 0, "--checkpoint", NULL);
    expect("--help", 0, "train", NULL);
}

static void bad_input_is_a_clear_error(void **state) {
    expect("train --model " MLP " --data " MNIST " --bogus", 2, NULL, "unknown option '--bogus'");
    expect("train --model " MLP " --data " MNIST " --epochs three", 2, NULL,
           "--epochs wants an integer");
    expect("train --model " MLP " --data " MNIST " --epochs 0", 2, NULL,
           "--epochs wants an integer >= 1");
    expect("train --model " MLP " --data " MNIST " --lr -1", 2, NULL, "--lr wants a number");
    expect("train --model " MLP " --data " MNIST " --lr 1e999", 2, NULL, "--lr wants a number");
    expect("train --model " MLP " --data " MNIST " --batch", 2, NULL, "--batch needs a value");
    expect("train --model " MLP " --data " MNIST " --optimizer adam", 2, NULL,
           "sgd or adamw, not 'adam'");
    expect("train --model " MLP " --data " MNIST " --precision f16", 2, NULL, "f32 or f64");
    expect("train --data " MNIST, 2, NULL, "--model is required");
    expect("train --model " MLP, 2, NULL, "--data is required");
    expect("train --model /nonexistent/m.json --data " MNIST, 1, NULL, "/nonexistent/m.json");
    expect("train --model " MLP " --data /nonexistent/mnist", 1, NULL, "/nonexistent/mnist");
    expect("train --model " MLP " --data " MNIST " --resume /nonexistent/c.st", 1, NULL,
           "/nonexistent/c.st");
    expect("train --model " MLP " --data " MNIST " --devices cpu:999 --steps 1", 1, NULL,
           "cpu:999");
    expect("eval --data " MNIST, 2, NULL, "--checkpoint and --data are required");
    expect("eval --checkpoint /nonexistent/c.st --data " MNIST, 1, NULL, "/nonexistent/c.st");
    expect("eval --checkpoint " MLP " --data " MNIST, 1, NULL, "header length");
    expect("eval --checkpoint " MNIST " --data " MNIST, 1, NULL, "not a regular file");
    expect("eval --checkpoint x --data " MNIST " --samples -3", 2, NULL,
           "--samples wants an integer");
}

static void a_short_run_writes_metrics_and_a_checkpoint_that_eval_reads(void **state) {
    char args[2048], metrics[512], ckpt[512], cmd[2048], *out = NULL, *err = NULL;
    double summary_acc = -1, eval_acc = -2;
    int steps = 0, epochs = 0, rc;
    FILE *f;
    char line[4096];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", td_test_tmpdir());
    snprintf(ckpt, sizeof ckpt, "%s/c.safetensors", td_test_tmpdir());
    snprintf(args, sizeof args,
             "train --model " MLP " --data " MNIST " --steps 40 --batch 32 --lr 0.05 "
             "--eval-samples 2000 --metrics %s --checkpoint %s --summary",
             metrics, ckpt);
    expect(args, 0, "final test accuracy", NULL);
    /* Every metrics line is JSON; 40 steps, then the end. */
    assert_non_null(f = fopen(metrics, "r"));
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        const char *ev;
        assert_non_null(o);
        ev = json_string_value(json_object_get(o, "event"));
        if (!strcmp(ev, "step"))
            steps++;
        else if (!strcmp(ev, "done"))
            summary_acc = json_real_value(json_object_get(o, "test_accuracy"));
        else
            epochs++;
        assert_true(json_is_number(json_object_get(o, "loss")));
        json_decref(o);
    }
    fclose(f);
    assert_int_equal(steps, 40);
    assert_int_equal(epochs, 0);
    assert_true(summary_acc > 0.5);
    /* eval on the same 2000 test samples gives the same accuracy. */
    snprintf(cmd, sizeof cmd, "'%s' eval --checkpoint %s --data " MNIST " --samples 2000 --json",
             EXE, ckpt);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("eval failed: %s", err);
    {
        json_error_t e;
        json_t *o = json_loads(out, 0, &e);
        assert_non_null(o);
        eval_acc = json_real_value(json_object_get(o, "accuracy"));
        assert_int_equal(json_integer_value(json_object_get(o, "labels")), 2000);
        json_decref(o);
    }
    assert_true(fabs(eval_acc - summary_acc) < 1e-9);
    free(out);
    free(err);
    /* Plain lines, not a progress bar, when output is not a terminal. */
    snprintf(args, sizeof args,
             "train --model " MLP " --data " MNIST " --epochs 1 --steps 30 --batch 500 "
             "--eval-samples 500");
    expect(args, 0, "step 12  epoch 1  12/120", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(help_describes_the_options),
        cmocka_unit_test(bad_input_is_a_clear_error),
        cmocka_unit_test(a_short_run_writes_metrics_and_a_checkpoint_that_eval_reads),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
