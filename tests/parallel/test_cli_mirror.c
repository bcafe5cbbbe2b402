/* The mirror strategy through `tandem train`, as users run it: one
 * device's weights on cpu*2 and cpu*3 (f64, 1e-12); a flipped gradient on
 * cpu*3 drops the device that computed it, named, and the run ends with one
 * device's weights; a run saved on one device resumes under mirror as if
 * it never stopped; a flipped weight on cpu*2 stops the run with exit 1
 * naming both devices, and the checkpoint written before the disagreement
 * stays; one device is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/checkpoint.h"

/* `[env ]tandem train` on the MNIST MLP (12 steps of 64, f64) with extra;
 * its exit status, standard output and error (freed by the caller). */
static int train(const char *env, const char *extra, const char *ckpt, char **out, char **err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s%s train --model %s/examples/mnist_mlp.json --data %s/data/mnist --batch 64 "
             "--lr 0.05 --steps 12 --precision f64 --eval-samples 200 --no-epoch-eval %s "
             "--checkpoint %s",
             env, TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR, extra, td_test_tmp(ckpt));
    return td_test_run_command(cmd, out, err);
}

static void train_ok(const char *env, const char *extra, const char *ckpt, char **out, char **err) {
    int rc = train(env, extra, ckpt, out, err);
    if (rc != 0)
        fail_msg("train %s exited %d: %s", extra, rc, *err ? *err : "");
}

static double diff(const char *a, const char *b) {
    return td_dp_checkpoint_diff(td_test_tmp(a), td_test_tmp(b));
}

static void mirror_matches_one_device_and_drops_a_liar(void **state) {
    char *out = NULL, *err = NULL;
    double d2, d3, dl;
    (void)state;
    train_ok("", "--devices cpu:0", "one.safetensors", &out, &err);
    free(out);
    free(err);
    train_ok("", "--devices cpu*2 --strategy mirror --deterministic", "two.safetensors", &out,
             &err);
    assert_non_null(strstr(out, "mirror: 12 steps compared (bitwise)"));
    free(out);
    free(err);
    train_ok("", "--devices cpu*3 --strategy mirror --strategy-option check_weights=3",
             "three.safetensors", &out, &err);
    assert_non_null(strstr(out, "12 steps compared (bitwise), 4 with the weights"));
    free(out);
    free(err);
    train_ok("TANDEM_FAULT=cpu:2@grad:5 ", "--devices cpu*3 --strategy mirror", "liar.safetensors",
             &out, &err);
    printf("%s%s", out, err);
    assert_non_null(strstr(err, "step 5: cpu:2 lost (mirror: step 5: cpu:2 computed the gradient"));
    assert_non_null(strstr(out, "1 device dropped"));
    free(out);
    free(err);
    d2 = diff("two.safetensors", "one.safetensors");
    d3 = diff("three.safetensors", "one.safetensors");
    dl = diff("liar.safetensors", "one.safetensors");
    printf("mirror differs from one device by %g on cpu*2, %g on cpu*3, %g with cpu:2 dropped\n",
           d2, d3, dl);
    assert_true(d2 <= 1e-12 && d3 <= 1e-12 && dl <= 1e-12);
}

/* Half a run on one device, the rest under mirror: one device's run. */
static void a_run_resumes_under_mirror(void **state) {
    char *out = NULL, *err = NULL, *json = NULL, extra[1024];
    td_train_state st;
    td_dtype dt;
    (void)state;
    train_ok("", "--devices cpu:0 --steps 6", "half.safetensors", &out, &err);
    free(out);
    free(err);
    TD_ASSERT_OK(td_checkpoint_read_meta(td_test_tmp("half.safetensors"), &json, &dt, &st));
    assert_int_equal(st.step, 6); /* the later --steps wins */
    free(json);
    snprintf(extra, sizeof extra, "--devices cpu*2 --strategy mirror --resume %s",
             td_test_tmp("half.safetensors"));
    train_ok("", extra, "resumed.safetensors", &out, &err);
    free(out);
    free(err);
    printf("resumed under mirror: differs from one device by %g\n",
           diff("resumed.safetensors", "one.safetensors"));
    assert_true(diff("resumed.safetensors", "one.safetensors") <= 1e-12);
}

static void two_that_keep_disagreeing_stop_the_run(void **state) {
    char *out = NULL, *err = NULL, *json = NULL;
    td_train_state st;
    td_dtype dt;
    int rc;
    (void)state;
    rc = train("TANDEM_FAULT=cpu:1@weight:7 ",
               "--devices cpu:0,cpu:1{slowdown=3} --strategy mirror --checkpoint-every 2",
               "stopped.safetensors", &out, &err);
    printf("exit %d: %s", rc, err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "step 7: cpu:0 and cpu:1 disagree"));
    TD_ASSERT_OK(td_checkpoint_read_meta(td_test_tmp("stopped.safetensors"), &json, &dt, &st));
    printf("the checkpoint left holds step %lld\n", (long long)st.step);
    assert_int_equal(st.step, 6);
    free(json);
    free(out);
    free(err);
}

static void one_device_is_refused(void **state) {
    char *out = NULL, *err = NULL;
    (void)state;
    assert_int_equal(train("", "--devices cpu:0 --strategy mirror", "x.safetensors", &out, &err),
                     1);
    assert_non_null(strstr(err, "mirror runs on at least 2 devices; the group has 1"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mirror_matches_one_device_and_drops_a_liar),
        cmocka_unit_test(a_run_resumes_under_mirror),
        cmocka_unit_test(two_that_keep_disagreeing_stop_the_run),
        cmocka_unit_test(one_device_is_refused),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
