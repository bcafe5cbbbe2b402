/* tandem train and tandem eval as a user runs them: help, bad input, a
 * short run whose checkpoint eval reads back, resuming (the schedule, flags
 * against the checkpoint), a killed run's leftovers, and mpirun's output. */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/support.h"
#include "tandem/checkpoint.h"

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

/* The library names a setting as its C API does (`metrics`, `checkpoint`);
 * the command says the flag that sets it, and no field name or backquote
 * reaches its user. */
static void library_messages_name_the_flags(void **state) {
    char cmd[2048], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd,
             "'%s' train --model " MLP " --data " MNIST " --steps 1 --checkpoint /tmp/x.st "
             "--metrics /tmp/x.st",
             EXE);
    assert_int_equal(td_test_run_command(cmd, &out, &err), 2);
    assert_non_null(err);
    if (!strstr(err, "--metrics and --checkpoint both name /tmp/x.st") || strchr(err, '`'))
        fail_msg("stderr: %s", err);
    free(out);
    free(err);
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
    expect("train --model " MLP " --data " MNIST " --precision f16", 2, NULL, "f32, f64 or bf16");
    expect("train --data " MNIST, 2, NULL, "--model is required");
    expect("train --model " MLP, 2, NULL, "--data is required");
    expect("train --model /nonexistent/m.json --data " MNIST, 1, NULL, "/nonexistent/m.json");
    expect("train --model " MLP " --data /nonexistent/mnist", 1, NULL, "/nonexistent/mnist");
    expect("train --model " MLP " --data " MNIST " --resume /nonexistent/c.st", 1, NULL,
           "/nonexistent/c.st");
    expect("train --model " MLP " --data " MNIST " --devices cpu:999 --steps 1", 1, NULL,
           "cpu:999");
    expect("train --model " MLP " --data " MNIST " --steps 1 --devices ''", 2, NULL,
           "--devices is empty");
    expect("train --model " TD_SOURCE_DIR "/examples --data " MNIST " --steps 1", 1, NULL,
           "not a regular file");
    expect("train --model " MLP " --data " MNIST " --steps 1 --checkpoint " TD_SOURCE_DIR
           "/examples",
           1, NULL, "(--checkpoint)");
    expect("train --model " MLP " --data " MNIST " --steps 1 --checkpoint /tmp/x.st "
           "--metrics /tmp/../tmp/x.st",
           2, NULL, "--metrics and --checkpoint both name");
    /* An output over an input would destroy it. */
    expect("train --model " MLP " --data " MNIST " --steps 1 --checkpoint " MNIST, 2, NULL,
           "--checkpoint and --data both name");
    expect("train --model " MLP " --data " MNIST " --steps 1 --metrics " MLP, 2, NULL,
           "--metrics and --model both name");
    expect("train --model " MLP " --data " MNIST " --steps 1 --batch 16777216", 2, NULL,
           "more than the 60000 training samples");
    expect("train --model " MLP " --data " MNIST " --steps 1 --extend restart", 2, NULL,
           "there is no --resume");
    expect("train --model " MLP " --data " MNIST " --extend sideways", 2, NULL,
           "--extend is stretch or restart");
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

/* The fields of the step events in a metrics file, in file order: their
 * step numbers and learning rates; the count. Fails on a line that is not
 * whole JSON. */
static int read_steps(const char *path, int64_t *step, double *lr, int max) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!o || line[strlen(line) - 1] != '\n')
            fail_msg("%s: a torn line: %s", path, line);
        if (!strcmp(json_string_value(json_object_get(o, "event")), "step") && n < max) {
            step[n] = json_integer_value(json_object_get(o, "step"));
            lr[n++] = json_number_value(json_object_get(o, "lr"));
        }
        json_decref(o);
    }
    fclose(f);
    return n;
}

/* MNIST at 6000 samples a step: 10 steps an epoch. */
#define TEN_STEPS " --data " MNIST " --batch 6000 --eval-samples 10 --no-epoch-eval --quiet"

static double cosine(double lr, double t) {
    return 0.5 * lr * (1 + cos(M_PI * t));
}

static void resuming_a_cosine_run_for_more_epochs_goes_on_learning(void **state) {
    char args[2048], ckpt[512], m[512];
    int64_t step[64];
    double lr[64];
    snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp("cos.st"));
    snprintf(m, sizeof m, "%s", td_test_tmp("cos.jsonl"));
    snprintf(args, sizeof args,
             "train --model " MLP TEN_STEPS " --epochs 1 --lr 0.1 --schedule cosine "
             "--checkpoint %s",
             ckpt);
    expect(args, 0, NULL, NULL);
    /* The README's case: two epochs where one was planned. The schedule
     * stretches to the new end, so step 11 takes cosine(10/20). */
    snprintf(args, sizeof args, "train --resume %s" TEN_STEPS " --epochs 2 --metrics %s", ckpt, m);
    expect(args, 0, NULL, NULL);
    assert_int_equal(read_steps(m, step, lr, 64), 10);
    assert_int_equal(step[0], 11);
    assert_float_equal(lr[0], cosine(0.1, 10.0 / 20), 1e-9);
    assert_float_equal(lr[9], cosine(0.1, 19.0 / 20), 1e-9);
    /* Or a new cosine from --lr over the new steps. */
    unlink(m);
    snprintf(args, sizeof args,
             "train --resume %s" TEN_STEPS " --epochs 2 --metrics %s --extend restart --lr 0.2",
             ckpt, m);
    expect(args, 0, NULL, NULL);
    assert_int_equal(read_steps(m, step, lr, 64), 10);
    assert_float_equal(lr[0], 0.2, 1e-12);
    assert_float_equal(lr[9], cosine(0.2, 9.0 / 10), 1e-9);
}

static void a_run_at_learning_rate_0_says_so(void **state) {
    expect("train --model " MLP TEN_STEPS " --steps 2 --lr 0", 0, NULL,
           "the learning rate was 0 in every step");
}

static void resuming_refuses_flags_that_contradict_the_checkpoint(void **state) {
    static const char *const refused[][2] = {
        {"--batch 64", "trained with batch 6000, not 64 (--batch): leave --batch unset to resume"},
        {"--seed 2", "trained with seed 1, not 2 (--seed)"},
        {"--precision f64", "holds f32 weights, not f64 (--precision): leave --precision unset"},
        {"--optimizer adamw", "holds the state of sgd, not adamw (--optimizer)"},
        {"--warmup 5", "a warm-up of 0 steps, not 5 (--warmup)"},
        {"--model " TD_SOURCE_DIR "/examples/lenet5.json", "holds (\"mnist_mlp\") (--model)"},
    };
    char args[2048], ckpt[512], m[512];
    int64_t step[64];
    double lr[64];
    snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp("flags.st"));
    snprintf(m, sizeof m, "%s", td_test_tmp("flags.jsonl"));
    snprintf(args, sizeof args, "train --model " MLP TEN_STEPS " --steps 3 --checkpoint %s", ckpt);
    expect(args, 0, NULL, NULL);
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        snprintf(args, sizeof args, "train --resume %s" TEN_STEPS " --steps 5 %s", ckpt,
                 refused[i][0]);
        expect(args, 2, NULL, refused[i][1]);
    }
    /* The same values are no contradiction, and --lr applies from here on. */
    snprintf(args, sizeof args,
             "train --resume %s" TEN_STEPS " --steps 5 --batch 6000 --seed 1 --model " MLP
             " --optimizer sgd --lr 0.07 --metrics %s",
             ckpt, m);
    expect(args, 0, NULL, NULL);
    assert_int_equal(read_steps(m, step, lr, 64), 2);
    assert_int_equal(step[0], 4);
    assert_float_equal(lr[0], 0.07, 1e-12);
}

/* bf16 trains f32 master weights: an f32 checkpoint resumes in bf16, an
 * f64 one is refused in words that name the flag. */
static void bf16_resumes_f32_checkpoints_and_refuses_f64_ones(void **state) {
    char args[2048], ckpt[512];
    for (int f64 = 0; f64 < 2; f64++) {
        snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp(f64 ? "w64.st" : "w32.st"));
        snprintf(args, sizeof args,
                 "train --model " MLP TEN_STEPS " --steps 2 --precision %s --checkpoint %s",
                 f64 ? "f64" : "f32", ckpt);
        expect(args, 0, NULL, NULL);
        snprintf(args, sizeof args, "train --resume %s" TEN_STEPS " --steps 3 --precision bf16",
                 ckpt);
        if (f64)
            expect(
                args, 2, NULL,
                "holds f64 weights; bf16 mixed precision (--precision) keeps f32 master weights");
        else
            expect(args, 0, "precision: cpu bf16 (", NULL);
    }
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    int n = 0, c;
    if (!f)
        return 0;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* Starts tandem with args (split on spaces) in the background, output
 * discarded; its pid. */
static pid_t start(char *args) {
    char *argv[64];
    int argc = 0;
    pid_t pid;
    argv[argc++] = EXE;
    for (char *tok = strtok(args, " "); tok && argc < 63; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    assert_true((pid = fork()) >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execv(EXE, argv);
        _exit(127);
    }
    return pid;
}

/* Files in the test's folder whose names begin with prefix. */
static int count_files(const char *prefix) {
    DIR *d = opendir(td_test_tmpdir());
    struct dirent *e;
    int n = 0;
    assert_non_null(d);
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

static void a_killed_run_resumes_with_whole_metrics_and_no_leftovers(void **state) {
    char args[2048], ckpt[512], m[512];
    static int64_t step[100000];
    static double lr[100000];
    struct timespec pause = {0, 5000000};
    td_safetensors *st;
    long long saved;
    int status, n;
    pid_t pid;
    snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp("killed.st"));
    snprintf(m, sizeof m, "%s", td_test_tmp("killed.jsonl"));
    snprintf(args, sizeof args,
             "train --model " MLP " --data " MNIST " --batch 8 --steps 1000000 --quiet "
             "--checkpoint %s --checkpoint-every 7 --metrics %s",
             ckpt, m);
    pid = start(args);
    for (int waited = 0; count_lines(m) < 300 && waited < 6000; waited++)
        nanosleep(&pause, NULL);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* The lines are whole (read_steps fails on a torn one), none held back
     * in a buffer: at least the steps up to the checkpoint. */
    TD_ASSERT_OK(td_safetensors_load(ckpt, &st));
    saved = atoll(td_safetensors_meta(st, "tandem.step"));
    td_safetensors_destroy(st);
    assert_true(saved >= 7);
    assert_true(read_steps(m, step, lr, 100000) >= saved);
    /* A temporary file of this checkpoint, as a kill in a save leaves one,
     * goes; another checkpoint's stays. */
    td_test_write_file(td_test_tmp("killed.st.tmp.Ab12Cd"), "x", 1);
    td_test_write_file(td_test_tmp("other.st.tmp.Ab12Cd"), "x", 1);
    snprintf(args, sizeof args,
             "train --resume %s --data " MNIST " --steps %lld --quiet --eval-samples 10 "
             "--checkpoint %s --metrics %s",
             ckpt, saved + 3, ckpt, m);
    expect(args, 0, NULL, NULL);
    assert_int_equal(count_files("killed.st.tmp."), 0);
    assert_int_equal(count_files("other.st.tmp."), 1);
    /* The metrics were cut back to the checkpoint: each step once. */
    n = read_steps(m, step, lr, 100000);
    assert_int_equal(n, saved + 3);
    for (int i = 0; i < n; i++)
        assert_int_equal(step[i], i + 1);
}

static void under_mpirun_only_rank_0_prints_progress(void **state) {
#ifdef TD_HAVE_MPI
    char cmd[2048], *out = NULL, *err = NULL;
    const char *at;
    int rc, lines = 0;
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 OMPI_MCA_btl=self,vader mpirun "
             "--allow-run-as-root --oversubscribe -np 2 '%s' train --model " MLP " --data " MNIST
             " --steps 30 --batch 500 --devices cpu --strategy data --eval-samples 100",
             EXE);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("mpirun exited %d\nstdout: %s\nstderr: %s", rc, out, err);
    for (at = out; (at = strstr(at, "  step 12  epoch 1")); at++)
        lines++;
    if (lines != 1)
        fail_msg("%d progress lines for step 12, not 1:\n%s", lines, out);
    free(out);
    free(err);
#else
    print_message("skipped: built without MPI\n");
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(help_describes_the_options),
        cmocka_unit_test(library_messages_name_the_flags),
        cmocka_unit_test(bad_input_is_a_clear_error),
        cmocka_unit_test(a_short_run_writes_metrics_and_a_checkpoint_that_eval_reads),
        cmocka_unit_test(resuming_a_cosine_run_for_more_epochs_goes_on_learning),
        cmocka_unit_test(a_run_at_learning_rate_0_says_so),
        cmocka_unit_test(resuming_refuses_flags_that_contradict_the_checkpoint),
        cmocka_unit_test(bf16_resumes_f32_checkpoints_and_refuses_f64_ones),
        cmocka_unit_test(a_killed_run_resumes_with_whole_metrics_and_no_leftovers),
        cmocka_unit_test(under_mpirun_only_rank_0_prints_progress),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
