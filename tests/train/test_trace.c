/* tandem train --trace as a user runs it: the file is JSON in Chrome's
 * trace-event format with a named track per device and one for the
 * trainer; spans on a track nest and come in time order; every traced step
 * has its forward, backward, optimizer step and gradient all-reduces on
 * every device, the all-reduces' bytes adding up to the model's gradient
 * (counted here from the model file, not by tandem), and no other step
 * shows; bad --trace and --trace-steps are clear errors. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"
#define EPS   0.0015 /* microseconds: ts and dur are printed to the nanosecond */

#define MAX_TRACKS 16

/* One track of the file: its name and its complete events in file order. */
typedef struct track {
    int pid, tid;
    const char *name;
    json_t *events[4096];
    size_t n;
} track;

typedef struct trace {
    json_t *root;
    track t[MAX_TRACKS];
    int n;
} trace;

static void run(const char *args, int want_rc, const char *err_needle) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd,
             "'%s' train --model " MLP " --data " MNIST " --batch 64 --lr 0.05 "
             "--eval-samples 100 --no-epoch-eval --quiet %s",
             EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", cmd, rc, want_rc,
                 out ? out : "", err ? err : "");
    if (err_needle && (!err || !strstr(err, err_needle)))
        fail_msg("'%s': stderr lacks \"%s\": %s", cmd, err_needle, err ? err : "");
    free(out);
    free(err);
}

static track *track_of(trace *tr, int pid, int tid) {
    for (int i = 0; i < tr->n; i++)
        if (tr->t[i].pid == pid && tr->t[i].tid == tid)
            return &tr->t[i];
    if (tr->n == MAX_TRACKS)
        fail_msg("more than %d tracks", MAX_TRACKS);
    tr->t[tr->n].pid = pid;
    tr->t[tr->n].tid = tid;
    return &tr->t[tr->n++];
}

/* Reads the file into tracks; fails unless it is a trace-event JSON object. */
static void load(const char *path, trace *tr) {
    json_error_t e;
    json_t *events, *ev;
    size_t i;
    memset(tr, 0, sizeof *tr);
    tr->root = json_load_file(path, 0, &e);
    if (!tr->root)
        fail_msg("%s is not JSON: line %d: %s", path, e.line, e.text);
    events = json_object_get(tr->root, "traceEvents");
    assert_true(json_is_array(events));
    json_array_foreach(events, i, ev) {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        const char *name = json_string_value(json_object_get(ev, "name"));
        int tid = (int)json_integer_value(json_object_get(ev, "tid"));
        int pid = (int)json_integer_value(json_object_get(ev, "pid"));
        assert_non_null(ph);
        assert_non_null(name);
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            track *t = track_of(tr, pid, tid);
            if (t->name)
                fail_msg("tid %d named twice", tid);
            t->name = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
        } else if (!strcmp(ph, "X")) {
            track *t = track_of(tr, pid, tid);
            assert_true(t->n < sizeof t->events / sizeof t->events[0]);
            t->events[t->n++] = ev;
        }
    }
}

static double num(json_t *ev, const char *key) {
    return json_number_value(json_object_get(ev, key));
}

static long long arg(json_t *ev, const char *key) {
    json_t *v = json_object_get(json_object_get(ev, "args"), key);
    return v ? json_integer_value(v) : -1;
}

/* Every track named, in time order, its spans nested: each lies wholly
 * inside those it overlaps that started before it. */
static void check_tracks(const trace *tr) {
    for (int i = 0; i < tr->n; i++) {
        const track *t = &tr->t[i];
        double end[64];
        int depth = 0;
        if (!t->name)
            fail_msg("tid %d has events but no name", t->tid);
        for (size_t k = 0; k < t->n; k++) {
            double ts = num(t->events[k], "ts"), dur = num(t->events[k], "dur");
            assert_true(dur >= 0);
            if (k > 0 && ts < num(t->events[k - 1], "ts"))
                fail_msg("%s: event %zu starts at %.3f, before the one ahead of it", t->name, k,
                         ts);
            while (depth > 0 && end[depth - 1] <= ts + EPS)
                depth--;
            if (depth > 0 && ts + dur > end[depth - 1] + EPS)
                fail_msg("%s: %s [%.3f, %.3f] overlaps the span it starts in, ending %.3f", t->name,
                         json_string_value(json_object_get(t->events[k], "name")), ts, ts + dur,
                         end[depth - 1]);
            assert_true(depth < 64);
            end[depth++] = ts + dur;
        }
    }
}

/* The track of process pid named `name`. */
static const track *named_in(const trace *tr, int pid, const char *name) {
    for (int i = 0; i < tr->n; i++)
        if (tr->t[i].pid == pid && tr->t[i].name && !strcmp(tr->t[i].name, name))
            return &tr->t[i];
    fail_msg("no track named %s in process %d", name, pid);
    return NULL;
}

static const track *named(const trace *tr, const char *name) {
    return named_in(tr, 0, name);
}

/* Events named `name` (NULL: any) of `step` on t, and their bytes. */
static int count(const track *t, const char *name, long long step, long long *bytes) {
    int c = 0;
    if (bytes)
        *bytes = 0;
    for (size_t k = 0; k < t->n; k++) {
        const char *n = json_string_value(json_object_get(t->events[k], "name"));
        if ((!name || !strcmp(n, name)) && arg(t->events[k], "step") == step) {
            c++;
            if (bytes)
                *bytes += arg(t->events[k], "bytes");
        }
    }
    return c;
}

/* The MLP's gradient bytes in f32, from its file: (in + 1) * out per linear. */
static long long gradient_bytes(void) {
    json_error_t e;
    json_t *m = json_load_file(MLP, 0, &e), *layer;
    long long in, params = 0;
    size_t i;
    assert_non_null(m);
    in = json_integer_value(
        json_array_get(json_object_get(json_object_get(m, "input"), "shape"), 0));
    json_array_foreach(json_object_get(m, "layers"), i, layer) {
        if (strcmp(json_string_value(json_object_get(layer, "type")), "linear"))
            continue;
        long long out = json_integer_value(json_object_get(layer, "out"));
        params += (in + 1) * out;
        in = out;
    }
    json_decref(m);
    assert_int_equal(params, 235146);
    return params * 4;
}

static void a_data_parallel_trace_shows_each_device_in_each_step(void **state) {
    const char *path = td_test_tmp("data.json");
    char args[1024];
    trace tr;
    long long grad = gradient_bytes(), bytes;
    snprintf(args, sizeof args,
             "--steps 6 --devices 'cpu*2' --strategy data --trace %s --trace-steps 2:4", path);
    run(args, 0, NULL);
    load(path, &tr);
    check_tracks(&tr);
    assert_int_equal(tr.n, 3); /* cpu:0, cpu:1 and the trainer: CPU devices reduce in place */
    for (long long s = 1; s <= 6; s++) {
        int traced = s >= 2 && s <= 4;
        const track *trainer = named(&tr, "trainer");
        assert_int_equal(count(trainer, "step", s, NULL), traced);
        assert_int_equal(count(trainer, "load batch", s, NULL), traced);
        for (int d = 0; d < 2; d++) {
            const track *t = named(&tr, d ? "cpu:1" : "cpu:0");
            if (!traced) {
                assert_int_equal(count(t, NULL, s, NULL), 0);
                continue;
            }
            assert_int_equal(count(t, "forward", s, NULL), 1);
            assert_int_equal(count(t, "backward", s, NULL), 1);
            assert_int_equal(count(t, "optimizer step", s, NULL), 1);
            assert_true(count(t, "copy HtoD", s, NULL) >= 1);
            assert_true(count(t, "allreduce", s, &bytes) >= 1);
            if (bytes != grad)
                fail_msg("%s, step %lld: all-reduces of %lld bytes; the gradient has %lld", t->name,
                         s, bytes, grad);
        }
    }
    /* A collective names its kind. */
    for (size_t k = 0; k < named(&tr, "cpu:0")->n; k++) {
        json_t *ev = named(&tr, "cpu:0")->events[k];
        if (!strcmp(json_string_value(json_object_get(ev, "cat")), "comm"))
            assert_string_equal(
                json_string_value(json_object_get(json_object_get(ev, "args"), "kind")),
                json_string_value(json_object_get(ev, "name")));
    }
    json_decref(tr.root);
}

/* The budgets hold the 3 MB model only when it is cut in two: on a quiet
 * machine the planner would rightly keep so small a model on one device. */
static void a_pipeline_trace_shows_each_micro_batch(void **state) {
    const char *path = td_test_tmp("pipeline.json");
    char args[1024];
    trace tr;
    snprintf(args, sizeof args,
             "--steps 2 --devices 'cpu:0{mem=3M},cpu:1{mem=3M}' --strategy pipeline "
             "--micro-batches 4 --trace %s",
             path);
    run(args, 0, NULL);
    load(path, &tr);
    check_tracks(&tr);
    for (long long s = 1; s <= 2; s++)
        for (int d = 0; d < 2; d++) {
            const track *t = named(&tr, d ? "cpu:1" : "cpu:0");
            assert_int_equal(count(t, "forward", s, NULL), 4);
            assert_int_equal(count(t, "backward", s, NULL), 4);
            /* The second stage takes step s's update at the start of step
             * s + 1 (no clipping here), the first stage within step s. */
            assert_int_equal(count(t, "optimizer step", s, NULL), d && s == 1 ? 0 : 1);
            /* Activations come in to the second stage, their gradients to the first. */
            assert_int_equal(count(t, "copy peer", s, NULL), 4);
        }
    json_decref(tr.root);
}

/* A device whose fixed cost per pass exceeds the step the other takes is
 * parked: its track shows the steps it sat out, and in each step it either
 * sat out or worked. Unoptimised builds (the sanitizers') step far slower,
 * so their slow device is slower still. */
#ifdef NDEBUG
#define PARK_LATENCY "100"
#else
#define PARK_LATENCY "400"
#endif
static void a_parked_device_shows_the_steps_it_sat_out(void **state) {
    const char *path = td_test_tmp("parked.json");
    char args[1024];
    trace tr;
    const track *slow;
    int parked = 0;
    snprintf(args, sizeof args,
             "--steps 12 --devices 'cpu:0,cpu:1{latency=" PARK_LATENCY
             "}' --strategy data --trace %s",
             path);
    run(args, 0, NULL);
    load(path, &tr);
    check_tracks(&tr);
    slow = named(&tr, "cpu:1");
    for (long long s = 1; s <= 12; s++) {
        int p = count(slow, "parked", s, NULL);
        parked += p;
        assert_int_equal(p + count(slow, "forward", s, NULL), 1);
        assert_int_equal(count(named(&tr, "cpu:0"), "forward", s, NULL), 1);
    }
    if (parked < 1)
        fail_msg("cpu:1, " PARK_LATENCY " ms a pass, was never parked");
    json_decref(tr.root);
}

/* Under mpirun: one file, a process (pid) per rank, each with its device's
 * and its trainer's tracks; the ranks' collectives were one operation, so
 * with the clocks aligned each rank's last all-gather of a step overlaps
 * the other's. */
static void under_mpirun_one_file_holds_every_rank(void **state) {
#ifdef TD_HAVE_MPI
    const char *path = td_test_tmp("mpi.json");
    char cmd[2048], *out = NULL, *err = NULL;
    trace tr;
    int rc;
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        print_message("skipped: no mpirun\n");
        skip();
    }
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 OMPI_MCA_btl=self,vader mpirun "
             "--allow-run-as-root --oversubscribe -np 2 '%s' train --model " MLP " --data " MNIST
             " --steps 4 --batch 128 --devices cpu --strategy data --eval-samples 100 "
             "--no-epoch-eval --quiet --trace %s --trace-steps 2:3",
             EXE, path);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("mpirun exited %d\nstdout: %s\nstderr: %s", rc, out, err);
    free(out);
    free(err);
    load(path, &tr);
    check_tracks(&tr);
    for (long long s = 1; s <= 4; s++) {
        double at[2][2] = {{0, 0}, {0, 0}};
        for (int pid = 0; pid < 2; pid++) {
            const track *dev = named_in(&tr, pid, "cpu");
            int traced = s == 2 || s == 3;
            assert_int_equal(count(named_in(&tr, pid, "trainer"), "step", s, NULL), traced);
            assert_int_equal(count(dev, "forward", s, NULL), traced);
            assert_int_equal(count(dev, "backward", s, NULL), traced);
            assert_int_equal(count(dev, "allgather", s, NULL), traced);
            for (size_t k = 0; traced && k < dev->n; k++)
                if (arg(dev->events[k], "step") == s &&
                    !strcmp(json_string_value(json_object_get(dev->events[k], "name")),
                            "allgather")) {
                    at[pid][0] = num(dev->events[k], "ts");
                    at[pid][1] = at[pid][0] + num(dev->events[k], "dur");
                }
        }
        if ((s == 2 || s == 3) && (at[0][0] > at[1][1] || at[1][0] > at[0][1]))
            fail_msg("step %lld: the ranks' all-gathers [%.3f, %.3f] and [%.3f, %.3f] do not "
                     "overlap: the clocks are not aligned",
                     s, at[0][0], at[0][1], at[1][0], at[1][1]);
    }
    json_decref(tr.root);
#else
    print_message("skipped: built without MPI\n");
    skip();
#endif
}

static void bad_trace_options_are_clear_errors(void **state) {
    run("--steps 1 --trace /nonexistent/folder/run.json", 1, "/nonexistent/folder/run.json");
    run("--steps 1 --trace " TD_SOURCE_DIR "/examples", 1, "not a regular file");
    run("--steps 1 --trace x.json --trace-steps 5:2", 2, "--trace-steps wants FIRST:LAST");
    run("--steps 1 --trace x.json --trace-steps 0:2", 2, "--trace-steps wants FIRST:LAST");
    run("--steps 1 --trace x.json --trace-steps two", 2, "not 'two'");
    run("--steps 1 --trace x.json --trace-steps 2:3x", 2, "not '2:3x'");
    run("--steps 1 --trace-steps 2:3", 2, "there is no --trace");
}

/* --trace naming a file another setting names would lose one output (or
 * overwrite an input) without a word: refused before anything is written. */
static void a_trace_sharing_another_file_is_refused(void **state) {
    char args[2048], ckpt[512], metrics[512];
    snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp("shared.st"));
    snprintf(metrics, sizeof metrics, "%s", td_test_tmp("shared.jsonl"));
    snprintf(args, sizeof args, "--steps 1 --checkpoint %s --trace %s/../%s/shared.st", ckpt,
             td_test_tmpdir(), strrchr(td_test_tmpdir(), '/') + 1);
    run(args, 2, "--trace and --checkpoint both name");
    snprintf(args, sizeof args, "--steps 1 --metrics %s --trace %s", metrics, metrics);
    run(args, 2, "--metrics and --trace both name");
    snprintf(args, sizeof args, "--steps 1 --trace %s", MLP);
    run(args, 2, "--trace and --model both name");
    assert_int_equal(access(ckpt, F_OK), -1);
    assert_int_equal(access(metrics, F_OK), -1);
}

/* Every output is checked before any is made: a trace that cannot be
 * created (its "folder" a regular file) leaves no empty metrics file, and
 * the other way round. */
static void an_output_that_cannot_be_made_leaves_no_other_behind(void **state) {
    char args[2048], file[512], metrics[512], trace_path[512], bad[600];
    snprintf(file, sizeof file, "%s", td_test_tmp("plain"));
    snprintf(metrics, sizeof metrics, "%s", td_test_tmp("left.jsonl"));
    snprintf(trace_path, sizeof trace_path, "%s", td_test_tmp("left.json"));
    td_test_write_file(file, "x", 1);
    snprintf(bad, sizeof bad, "%s/run.json", file);
    snprintf(args, sizeof args, "--steps 1 --metrics %s --trace %s", metrics, bad);
    run(args, 1, "plain/run.json: cannot write the trace there");
    run(args, 1, "plain is not a folder (--trace)");
    assert_int_equal(access(metrics, F_OK), -1);
    snprintf(bad, sizeof bad, "%s/m.jsonl", file);
    snprintf(args, sizeof args, "--steps 1 --metrics %s --trace %s", bad, trace_path);
    run(args, 1, "plain/m.jsonl: cannot write the metrics there");
    assert_int_equal(access(trace_path, F_OK), -1);
    snprintf(bad, sizeof bad, "%s/c.st", file);
    snprintf(args, sizeof args, "--steps 1 --metrics %s --checkpoint %s", metrics, bad);
    run(args, 1, "plain/c.st: cannot write a checkpoint there");
    assert_int_equal(access(metrics, F_OK), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_data_parallel_trace_shows_each_device_in_each_step),
        cmocka_unit_test(a_pipeline_trace_shows_each_micro_batch),
        cmocka_unit_test(a_parked_device_shows_the_steps_it_sat_out),
        cmocka_unit_test(under_mpirun_one_file_holds_every_rank),
        cmocka_unit_test(bad_trace_options_are_clear_errors),
        cmocka_unit_test(a_trace_sharing_another_file_is_refused),
        cmocka_unit_test(an_output_that_cannot_be_made_leaves_no_other_behind),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
