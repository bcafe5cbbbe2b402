/* The strategies through `tandem train` and `tandem eval`, as users run
 * them: checkpoints of data-parallel runs against one device, deterministic
 * runs byte for byte across device counts, resume, ZeRO-1, alternate
 * evaluation, and training on when a device is lost. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/dp_check.h"
#include "support/support.h"

/* Runs `tandem train` and fails the test if it fails; returns its stdout. */
static char *train_output(const char *devices, const char *extra, const char *ckpt) {
    return td_dp_train_cli("", devices, extra, ckpt);
}

static void train(const char *devices, const char *extra, const char *ckpt) {
    free(train_output(devices, extra, ckpt));
}

/* The tensors' bytes of two checkpoints: what follows the safetensors header
 * (the header's metadata may differ: the resumed run's options, say). */
static int same_weights(const char *a, const char *b) {
    char *da = NULL, *db = NULL;
    long na = 0, nb = 0;
    int same = 0;
    FILE *fa, *fb;
    fa = fopen(td_test_tmp(a), "rb");
    fb = fopen(td_test_tmp(b), "rb");
    if (fa && fb) {
        unsigned char ha[8], hb[8];
        uint64_t la = 0, lb = 0;
        if (fread(ha, 1, 8, fa) == 8 && fread(hb, 1, 8, fb) == 8) {
            for (int i = 7; i >= 0; i--) {
                la = la << 8 | ha[i];
                lb = lb << 8 | hb[i];
            }
            fseek(fa, 0, SEEK_END);
            fseek(fb, 0, SEEK_END);
            na = ftell(fa) - 8 - (long)la;
            nb = ftell(fb) - 8 - (long)lb;
            da = malloc((size_t)na + 1);
            db = malloc((size_t)nb + 1);
            fseek(fa, 8 + (long)la, SEEK_SET);
            fseek(fb, 8 + (long)lb, SEEK_SET);
            same = na == nb && na > 0 && fread(da, 1, (size_t)na, fa) == (size_t)na &&
                   fread(db, 1, (size_t)nb, fb) == (size_t)nb && !memcmp(da, db, (size_t)na);
        }
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    free(da);
    free(db);
    return same;
}

/* td_dp_checkpoint_diff of two checkpoints in the test directory. */
static double checkpoint_diff(const char *a, const char *b) {
    return td_dp_checkpoint_diff(td_test_tmp(a), td_test_tmp(b));
}

/* Trains with `fault` in the environment (a TANDEM_FAULT=... prefix) and
 * requires the run's report to say `says` and its weights (checkpoint ckpt)
 * to equal one device's (one256.safetensors) within 1e-12. */
static void survives_as_one_device(const char *fault, const char *devices, const char *cmd,
                                   const char *ckpt, const char *says) {
    char *out = td_dp_train_cli(fault, devices, cmd, ckpt);
    double d;
    if (!strstr(out, says))
        fail_msg("%sdid not say \"%s\": %s", fault, says, out);
    free(out);
    d = checkpoint_diff(ckpt, "one256.safetensors");
    printf("%s: differs from one device by %g\n", fault, d);
    if (d > 1e-12)
        fail_msg("%s: the survivors' weights differ from one device's by %g", fault, d);
}

static void data_strategy_matches_one_device(void **state) {
    double d;
    train("cpu:0", "--steps 15 --precision f64", "one64.safetensors");
    train("cpu*2", "--steps 15 --precision f64 --strategy data", "two64.safetensors");
    d = checkpoint_diff("two64.safetensors", "one64.safetensors");
    if (d > 1e-12)
        fail_msg("f64: 2 devices differ from 1 by %g", d);
    train("cpu:0", "--steps 15", "one32.safetensors");
    train("cpu:0,cpu:1{slowdown=2}", "--steps 15 --strategy data", "two32.safetensors");
    d = checkpoint_diff("two32.safetensors", "one32.safetensors");
    if (d > 1e-5)
        fail_msg("f32: 2 devices differ from 1 by %g", d);
}

/* --overlap on: CPU devices start each bucket's reduction while backward
 * goes on (by default they reduce after it); the weights are still one
 * device's, and the end-of-run table says how many buckets started during
 * backward. The small --bucket-bytes makes several buckets of the MLP's
 * gradients. (How much of the reduction that hid depends on whether the
 * collective engine found a free core, so it is not asserted.) */
static void overlap_on_the_command_line_matches_one_device(void **state) {
    static const char *const what = "gradient reduction: ";
    char *out, *line;
    int buckets = 0, in_backward = 0;
    double d;
    train("cpu:0", "--steps 15 --precision f64", "ov1.safetensors");
    out = train_output("cpu*2",
                       "--steps 15 --precision f64 --strategy data --overlap on "
                       "--bucket-bytes 65536",
                       "ov2.safetensors");
    line = strstr(out, what);
    if (!line ||
        sscanf(line + strlen(what), "%d buckets, %d started during backward", &buckets,
               &in_backward) != 2 ||
        buckets < 2 || in_backward != buckets)
        fail_msg("not every bucket started during backward: %s", out);
    free(out);
    d = checkpoint_diff("ov2.safetensors", "ov1.safetensors");
    if (d > 1e-12)
        fail_msg("overlapped, 2 devices differ from 1 by %g", d);
}

static void deterministic_runs_are_byte_identical_for_1_2_3_devices(void **state) {
    train("cpu:0", "--steps 12 --strategy data --deterministic", "d1.safetensors");
    train("cpu*2", "--steps 12 --strategy data --deterministic", "d2.safetensors");
    train("cpu*3", "--steps 12 --strategy data --deterministic", "d3.safetensors");
    assert_true(same_weights("d1.safetensors", "d2.safetensors"));
    assert_true(same_weights("d1.safetensors", "d3.safetensors"));
}

static void resuming_a_data_parallel_run_equals_never_stopping(void **state) {
    char extra[512];
    train("cpu*2", "--steps 24 --strategy data --deterministic", "whole.safetensors");
    train("cpu*2", "--steps 10 --strategy data --deterministic", "half.safetensors");
    snprintf(extra, sizeof extra, "--steps 24 --strategy data --deterministic --resume %s/%s",
             td_test_tmpdir(), "half.safetensors");
    train("cpu*2", extra, "resumed.safetensors");
    assert_true(same_weights("whole.safetensors", "resumed.safetensors"));
}

/* ZeRO-1 through the CLI: the weights equal one device's (f64, the run of
 * the first test), and a run stopped, saved (the shards gathered) and
 * resumed (the state scattered) ends where one that never stopped does. The
 * data mode's splits follow measured speeds, so the comparison is to 1e-12
 * in f64, not bitwise; a resume that lost AdamW's state would miss by far
 * more. */
static void zero_1_matches_one_device_and_resumes(void **state) {
    char extra[512];
    double d;
    train("cpu*3", "--steps 15 --precision f64 --strategy data --zero", "zero64.safetensors");
    d = checkpoint_diff("zero64.safetensors", "one64.safetensors");
    if (d > 1e-12)
        fail_msg("ZeRO-1 on 3 devices differs from 1 by %g", d);
    train("cpu*2", "--steps 24 --precision f64 --optimizer adamw --lr 0.002 --strategy data --zero",
          "zwhole.safetensors");
    train("cpu*2", "--steps 10 --precision f64 --optimizer adamw --lr 0.002 --strategy data --zero",
          "zhalf.safetensors");
    snprintf(extra, sizeof extra,
             "--steps 24 --precision f64 --optimizer adamw --lr 0.002 --strategy data --zero "
             "--resume %s/zhalf.safetensors",
             td_test_tmpdir());
    train("cpu*2", extra, "zresumed.safetensors");
    d = checkpoint_diff("zresumed.safetensors", "zwhole.safetensors");
    if (d > 1e-12)
        fail_msg("ZeRO-1: the resumed run differs from the whole one by %g", d);
}

static char *eval_json(const char *devices, const char *strategy) {
    char cmd[1024], *out = NULL, *err = NULL, *loss;
    snprintf(cmd, sizeof cmd,
             "%s eval --checkpoint %s/one32.safetensors --data %s/data/mnist --json "
             "--devices '%s' --strategy %s",
             TD_TANDEM_EXE, td_test_tmpdir(), TD_SOURCE_DIR, devices, strategy);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("'%s' failed: %s", cmd, err ? err : "");
    free(err);
    loss = strstr(out, "\"loss\"");
    assert_non_null(loss);
    /* Compare from the loss on, without the timing at the end. */
    *strstr(loss, ",\"seconds\"") = '\0';
    memmove(out, loss, strlen(loss) + 1);
    return out;
}

static void alternate_evaluation_equals_one_device(void **state) {
    char *one = eval_json("cpu:0", "single");
    char *three = eval_json("cpu*3", "alternate");
    char *slow = eval_json("cpu:0,cpu:1{slowdown=3}", "alternate");
    assert_string_equal(one, three);
    assert_string_equal(one, slow);
    free(one);
    free(three);
    free(slow);
}

/* `tandem train ARGS` (the MNIST MLP and data unless ARGS name others) exits
 * with `code` and says `why` on stderr. */
static void refused(const char *args, int code, const char *why) {
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd,
             "%s train --model %s/examples/mnist_mlp.json --data %s/data/mnist --steps 1 %s",
             TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR, args);
    assert_int_equal(td_test_run_command(cmd, &out, &err), code);
    if (!err || !strstr(err, why))
        fail_msg("'%s' did not say \"%s\": %s", cmd, why, err ? err : "");
    free(out);
    free(err);
}

static void bad_strategies_are_refused(void **state) {
    refused("--strategy diagonal", 2, "--strategy is single, data, pipeline");
    refused("--strategy tiles --devices 'cpu*2'", 1, "tiles does not train");
    refused("--zero", 1, "single has no option --zero (its options: none)");
    refused("--strategy pipeline --devices 'cpu*2' --zero", 1,
            "pipeline has no option --zero (its options: --micro-batches, `replicas`, `tensor`)");
    refused("--strategy data --strategy-option chunk=3", 1,
            "data has no option `chunk` (its options: --deterministic, --zero, --overlap, "
            "--bucket-bytes)");
    refused("--strategy data --strategy-option zero=maybe", 1,
            "data: --zero wants 0 or 1 or off or on or no or yes, not 'maybe'");
    refused("--strategy-option zero", 2, "--strategy-option wants KEY=VALUE, not 'zero'");
    refused("--strategy alternate", 1,
            "alternate does not train: evaluation: whole batches round-robin");
    refused("--devices 'cpu*2' --strategy data --zero --deterministic", 1,
            "ZeRO-1 and deterministic mode do not go together");
    refused("--overlap sometimes", 2, "--overlap is auto, on or off, not 'sometimes'");
    refused("--overlap on", 1, "single has no option --overlap");
}

/* A device lost in the middle of a run: the other device trains on, and the
 * weights still equal one device's after all 15 steps (f64). cpu:1 fails at
 * its 20th all-reduce, in the fourth step, before anyone's update; cpu:0
 * stops answering at its 8th gather of a step's numbers, in the seventh,
 * after everyone's (the step then counts, and its loss is unknown: null in
 * the metrics). And cpu:1 stuck for good at its 20th all-reduce: its host
 * thread never comes back, so the run must neither wait for it to free its
 * replica nor to close the device (timeout turns a hang into exit 124).
 * And on cpu*3, cpu:1 fails in step 1 and cpu:2 while the two left take
 * that step again: cpu:0 takes it alone, and trains on.
 * Batches of 256, so that no device's fixed cost per pass
 * comes near a step even on a busy machine: a parked device would skip the
 * collectives its fault counts. */
static void training_goes_on_when_a_device_is_lost(void **state) {
    static const char *const steps = "--steps 15 --precision f64 --batch 256";
    static const struct {
        const char *fault, *devices, *says;
    } cases[] = {{"TANDEM_FAULT=cpu:1@allreduce:20:error ", "cpu*2", "lost: cpu:1 in step 4;"},
                 {"TANDEM_COMM_TIMEOUT_MS=500 TANDEM_FAULT=cpu:0@allgather:8 ", "cpu*2",
                  "lost: cpu:0 in step 7;"},
                 {"TANDEM_COMM_TIMEOUT_MS=500 TANDEM_FAULT=cpu:1@allreduce:20:stuck timeout 120 ",
                  "cpu*2", "lost: cpu:1 in step 4;"},
                 {"TANDEM_FAULT=cpu:1@allreduce:5:error,cpu:2@allreduce:9:error timeout 120 ",
                  "cpu*3",
                  "lost: cpu:1 in step 1; the other devices trained on\nlost: cpu:2 in step 1;"}};
    char cmd[1024];
    free(td_dp_train_cli("", "cpu:0", steps, "one256.safetensors"));
    snprintf(cmd, sizeof cmd, "%s --strategy data", steps);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        survives_as_one_device(cases[k].fault, cases[k].devices, cmd, "lost.safetensors",
                               cases[k].says);
}

/* A run that cannot go on says why and exits 1 soon after the collective
 * timeout (2 s here: a sanitizer build on a busy machine can take 0.5 s to
 * reach a peer's collective), whatever state its devices are in: its only device
 * stuck for good in a collective, with no peer to time out on it; and, under
 * ZeRO-1 before any checkpoint, a device stuck for good whose replica the
 * run must free without its host thread. `timeout` turns a hang into exit
 * 124; 30 s leaves room for a sanitizer build's start. */
static void a_run_that_cannot_go_on_ends_within_its_timeout(void **state) {
    static const struct {
        const char *fault, *devices, *says;
    } cases[] = {{"cpu:0@allreduce:3:stuck", "'cpu:0'",
                  "cpu:0 (rank 0) has not come back from its collective"},
                 {"cpu:1@reducescatter:25:stuck", "'cpu*2' --zero", "no checkpoint to go back to"}};
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char cmd[1024], *out = NULL, *err = NULL;
        uint64_t t0 = td_clock_ns();
        int rc;
        snprintf(cmd, sizeof cmd,
                 "TANDEM_COMM_TIMEOUT_MS=2000 TANDEM_FAULT=%s timeout 30 %s train --model "
                 "%s/examples/mnist_mlp.json --data %s/data/mnist --steps 60 --quiet --devices %s "
                 "--strategy data",
                 cases[k].fault, TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR, cases[k].devices);
        rc = td_test_run_command(cmd, &out, &err);
        printf("%s: exit %d after %.1f s\n", cases[k].fault, rc,
               (double)(td_clock_ns() - t0) / 1e9);
        if (rc != 1 || !err || !strstr(err, cases[k].says))
            fail_msg("'%s' exited %d, not 1 saying \"%s\": %s", cmd, rc, cases[k].says,
                     err ? err : "");
        free(out);
        free(err);
    }
}

/* With ZeRO-1 a lost device takes the only copy of its shard of the
 * optimizer state with it. The others go back to the run's newest
 * checkpoint (of step 8: --checkpoint-every 4) and train on from there: cpu:2
 * of cpu*3 fails at its 66th reduce-scatter, in step 11, and the weights
 * after all 15 steps still equal one device's (f64), which they would not
 * had steps 9 and 10 been taken twice or the shard's state been lost. With
 * no checkpoint saved yet the run ends, and says why. */
static void with_zero_1_a_lost_device_sends_the_run_back_to_its_checkpoint(void **state) {
    static const char *const steps = "--steps 15 --precision f64 --batch 256";
    char cmd[1024], metrics[512], *out, *err, *text;
    (void)state;
    free(td_dp_train_cli("", "cpu:0", steps, "one256.safetensors"));
    snprintf(metrics, sizeof metrics, "%s/back.jsonl", td_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s --strategy data --zero --checkpoint-every 4 --metrics %s", steps,
             metrics);
    survives_as_one_device("TANDEM_FAULT=cpu:2@reducescatter:66:error ", "cpu*3", cmd,
                           "back.safetensors",
                           "lost: cpu:2 in step 11; the other devices went back to the checkpoint "
                           "of step 8 and trained on");
    text = (char *)td_test_read_file(metrics, NULL);
    if (!strstr(text, "{\"event\":\"rewind\",\"step\":10,\"to_step\":8,\"lost\":\"cpu:2\"}"))
        fail_msg("the metrics file has no rewind event from step 10 to 8: %s", text);
    free(text);
    snprintf(cmd, sizeof cmd,
             "TANDEM_FAULT=cpu:1@any:40:error %s train --model %s/examples/mnist_mlp.json "
             "--data %s/data/mnist --steps 8 --quiet --devices 'cpu*2' --strategy data --zero",
             TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR);
    assert_int_equal(td_test_run_command(cmd, &out, &err), 1);
    if (!err || !strstr(err, "cpu:1") || !strstr(err, "shard of the ZeRO-1 optimizer state") ||
        !strstr(err, "no checkpoint to go back to"))
        fail_msg("ZeRO-1 with a lost device and no checkpoint: %s", err ? err : "");
    free(out);
    free(err);
}

/* A loss under ZeRO-1 before the first checkpoint ends the run: the
 * message asks for --checkpoint and --checkpoint-every only when they are
 * missing, and with both given says when the first checkpoint comes. */
static void a_run_with_no_checkpoint_yet_says_what_is_missing(void **state) {
    static const struct {
        const char *args, *says, *not_says;
    } cases[] = {
        {"--checkpoint %s --checkpoint-every 100",
         "no checkpoint to go back to yet: the first is saved after step 100 "
         "(--checkpoint-every 100)",
         "give --checkpoint"},
        {"--checkpoint %s", "saves", "give --checkpoint with"},
        {"", "give --checkpoint with --checkpoint-every", NULL},
    };
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char cmd[2048], args[600], *out = NULL, *err = NULL;
        int rc;
        snprintf(args, sizeof args, cases[k].args, td_test_tmp("never.safetensors"));
        snprintf(cmd, sizeof cmd,
                 "TANDEM_FAULT=cpu:1@any:40:error %s train --model %s/examples/mnist_mlp.json "
                 "--data %s/data/mnist --steps 8 --quiet --devices 'cpu*2' --strategy data "
                 "--zero %s",
                 TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR, args);
        rc = td_test_run_command(cmd, &out, &err);
        if (rc != 1 || !err || !strstr(err, cases[k].says) ||
            (cases[k].not_says && strstr(err, cases[k].not_says)))
            fail_msg("'%s' exited %d; stderr should say \"%s\"%s%s: %s", cmd, rc, cases[k].says,
                     cases[k].not_says ? " and not " : "",
                     cases[k].not_says ? cases[k].not_says : "", err ? err : "");
        if (k == 1 && !strstr(err, "give --checkpoint-every too"))
            fail_msg("--checkpoint alone: %s", err);
        free(out);
        free(err);
    }
}

/* The number of times needle occurs in text. */
static int occurrences(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* With the optimizer replicated, a device lost while the others sat steps
 * out, parked, held the only current replica: cpu:0{latency=250} is parked
 * (250 ms a pass, against cpu:1's steps of a few ms, tens under
 * ThreadSanitizer), so when cpu:1 fails the run goes back to its
 * checkpoint of step 8 and cpu:0 trains on alone.
 * cpu:1 fails in step 10 (at its 101st collective, counting the 13 that
 * create the replicas and calibrate them); in a second run
 * between steps 12 and 13 (its 131st), while the checkpoint of step 12
 * brings cpu:0's replica up to date, which used to end the run; in a third
 * there, while the evaluation of step 12 does (checkpoints every 8 steps
 * and evaluations every 4), and step 12 is evaluated once, when the run
 * comes back to it, not also on the way back. Every time the weights after
 * 15 steps equal one device's (f64). */
static void a_lost_device_holding_the_only_current_replica_sends_the_run_back(void **state) {
    static const char *const steps = "--steps 15 --precision f64 --batch 256";
    static const struct {
        const char *fault, *every, *said, *event;
    } cases[] = {
        {"TANDEM_FAULT=cpu:1@any:101:error ", "--checkpoint-every 4",
         "lost: cpu:1 in step 10; the other devices went back to the checkpoint of step 8",
         "{\"event\":\"rewind\",\"step\":9,\"to_step\":8,\"lost\":\"cpu:1\"}"},
        {"TANDEM_FAULT=cpu:1@any:131:error ", "--checkpoint-every 4",
         "lost: cpu:1 in step 13; the other devices went back to the checkpoint of step 8",
         "{\"event\":\"rewind\",\"step\":12,\"to_step\":8,\"lost\":\"cpu:1\"}"},
        {"TANDEM_FAULT=cpu:1@any:131:error ", "--checkpoint-every 8 --eval-every 4",
         "lost: cpu:1 in step 13; the other devices went back to the checkpoint of step 8",
         "{\"event\":\"rewind\",\"step\":12,\"to_step\":8,\"lost\":\"cpu:1\"}"},
    };
    char cmd[1024], metrics[512], *text;
    (void)state;
    free(td_dp_train_cli("", "cpu:0", steps, "one256.safetensors"));
    snprintf(metrics, sizeof metrics, "%s/parked.jsonl", td_test_tmpdir());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "%s --strategy data %s --metrics %s", steps, cases[i].every,
                 metrics);
        survives_as_one_device(cases[i].fault, "cpu:0{latency=250},cpu:1", cmd,
                               "parked.safetensors", cases[i].said);
        text = (char *)td_test_read_file(metrics, NULL);
        if (!strstr(text, cases[i].event))
            fail_msg("%s: the metrics file has no %s: %s", cases[i].fault, cases[i].event, text);
        if (strstr(cases[i].every, "--eval-every") &&
            occurrences(text, "{\"event\":\"eval\",\"step\":12,") != 1)
            fail_msg("%s: step 12 is not evaluated exactly once: %s", cases[i].fault, text);
        free(text);
    }
}

/* A linear model over MNIST (7850 weights) for 2 epochs of 8 steps of
 * 8192 samples, f64, on devices, with extra options: tandem's output. */
static char *train_linear(const char *fault, const char *devices, const char *extra,
                          const char *ckpt) {
    static const char model[] =
        "{\"input\": {\"shape\": [784]}, \"layers\": [{\"type\": \"linear\", \"out\": 10}]}\n";
    char path[512], all[512];
    snprintf(path, sizeof path, "%s", td_test_tmp("linear.json"));
    td_test_write_file(path, model, strlen(model));
    snprintf(all, sizeof all, "--epochs 2 --batch 8192 --precision f64 --summary %s", extra);
    return td_dp_train_cli_model(fault, path, devices, all, ckpt);
}

/* An epoch that a loss sends the run back into is trained again and
 * counted once: cpu:1 fails at its 35th collective, while the checkpoint at
 * the first epoch's end (after step 8) brings the parked cpu:0 up to date;
 * the run goes back to its checkpoint of step 6 and ends the first epoch a
 * second time. It reports 2 epochs and 16 steps, and its weights are one
 * device's (f64). cpu:0's fixed cost of 1 s a pass parks it from the start
 * in every build (at 250 ms it took part under ThreadSanitizer, whose steps
 * of 8192 samples take about 0.4 s on cpu:1 alone). */
static void an_epoch_trained_again_after_a_loss_counts_once(void **state) {
    char *out;
    double d;
    (void)state;
    free(train_linear("", "cpu:0", "", "linear1.safetensors"));
    out = train_linear("TANDEM_FAULT=cpu:1@any:35:error ", "cpu:0{latency=1000},cpu:1",
                       "--strategy data --checkpoint-every 6", "linear2.safetensors");
    if (!strstr(out, "lost: cpu:1 in step 9; the other devices went back to the checkpoint of "
                     "step 6") ||
        !strstr(out, "\"steps\":16,\"epochs\":2,"))
        fail_msg("the run sent back into its first epoch did not report 16 steps of 2 epochs: %s",
                 out);
    free(out);
    d = checkpoint_diff("linear2.safetensors", "linear1.safetensors");
    if (d > 1e-12)
        fail_msg("the survivor's weights differ from one device's by %g", d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(data_strategy_matches_one_device),
        cmocka_unit_test(overlap_on_the_command_line_matches_one_device),
        cmocka_unit_test(deterministic_runs_are_byte_identical_for_1_2_3_devices),
        cmocka_unit_test(resuming_a_data_parallel_run_equals_never_stopping),
        cmocka_unit_test(zero_1_matches_one_device_and_resumes),
        cmocka_unit_test(alternate_evaluation_equals_one_device),
        cmocka_unit_test(bad_strategies_are_refused),
        cmocka_unit_test(training_goes_on_when_a_device_is_lost),
        cmocka_unit_test(a_run_that_cannot_go_on_ends_within_its_timeout),
        cmocka_unit_test(with_zero_1_a_lost_device_sends_the_run_back_to_its_checkpoint),
        cmocka_unit_test(a_run_with_no_checkpoint_yet_says_what_is_missing),
        cmocka_unit_test(a_lost_device_holding_the_only_current_replica_sends_the_run_back),
        cmocka_unit_test(an_epoch_trained_again_after_a_loss_counts_once),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
