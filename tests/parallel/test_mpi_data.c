/* `mpirun -np 2 tandem train --strategy data` (and `tensor`, tensor inside
 * each process and data across them): one model trained across two
 * processes (Open MPI), against one device. Skipped where tandem was built
 * without MPI or mpirun is missing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/dp_check.h"
#include "support/support.h"

/* Runs `tandem train` (under mpirun when np > 0) and fails the test if it fails. */
static char *train(int np, const char *devices, const char *extra, const char *ckpt) {
    char launcher[512] = "";
    if (np > 0)
        /* Open MPI as root needs these; its plugins' own allocations are not ours to leak-check. */
        snprintf(launcher, sizeof launcher,
                 "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "ASAN_OPTIONS=detect_leaks=0 mpirun --oversubscribe --mca btl self,vader "
                 "-np %d ",
                 np);
    return td_dp_train_cli(launcher, devices, extra, ckpt);
}

/* The metrics file's last "devices" line: both ranks' parts of the step,
 * the other process's included (gathered, not only this process's own). */
static void assert_devices_timed(const char *path) {
    char *text = (char *)td_test_read_file(path, NULL), *line, *last = NULL;
    json_t *root, *devs;
    assert_non_null(text);
    for (line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "\"event\":\"devices\""))
            last = line;
    assert_non_null(last);
    root = json_loads(last, 0, NULL);
    assert_non_null(root);
    devs = json_object_get(root, "devices");
    assert_int_equal(json_array_size(devs), 2);
    for (size_t r = 0; r < 2; r++) {
        json_t *d = json_array_get(devs, r);
        double comm = json_real_value(json_object_get(d, "comm_s"));
        double update = json_real_value(json_object_get(d, "update_s"));
        if (!(comm > 0 && update > 0))
            fail_msg("rank %zu: comm_s %g, update_s %g in %s", r, comm, update, last);
    }
    json_decref(root);
    free(text);
}

static void two_processes_train_one_model(void **state) {
    char cmp[1024], metrics[1024], *out;
    /* Deterministic mode: two processes give exactly one device's weights. */
    free(train(0, "cpu:0", "--steps 12 --strategy data --deterministic", "one.safetensors"));
    snprintf(metrics, sizeof metrics, "--steps 12 --strategy data --deterministic --metrics %s",
             td_test_tmp("mpi.jsonl"));
    out = train(2, "cpu", metrics, "mpi.safetensors");
    /* Rank 0 alone reports: one summary table, two members. */
    assert_non_null(strstr(out, "rank 1"));
    assert_null(strstr(strstr(out, "final test accuracy") + 1, "final test accuracy"));
    free(out);
    assert_devices_timed(td_test_tmp("mpi.jsonl"));
    snprintf(cmp, sizeof cmp, "cmp -s %s/one.safetensors %s/mpi.safetensors", td_test_tmpdir(),
             td_test_tmpdir());
    if (system(cmp) != 0)
        fail_msg("the 2-process checkpoint differs from the one-device checkpoint");
}

/* td_dp_checkpoint_diff of two checkpoints in the test directory. */
static double checkpoint_diff(const char *a, const char *b) {
    return td_dp_checkpoint_diff(td_test_tmp(a), td_test_tmp(b));
}

/* ZeRO-1 across processes: the gradient shards are reduce-scattered and the
 * weights all-gathered over MPI; AdamW's state is gathered from both
 * processes into rank 0's checkpoint. Equal to one device within 1e-12 in
 * f64 (the split follows measured speeds, so not bitwise). */
static void two_processes_train_with_zero_1(void **state) {
    double d;
    free(train(0, "cpu:0", "--steps 12 --precision f64 --optimizer adamw --lr 0.002",
               "one_adamw.safetensors"));
    free(train(2, "cpu",
               "--steps 12 --precision f64 --optimizer adamw --lr 0.002 --strategy data --zero",
               "mpi_zero.safetensors"));
    d = checkpoint_diff("mpi_zero.safetensors", "one_adamw.safetensors");
    if (d > 1e-12)
        fail_msg("ZeRO-1 over 2 processes differs from one device by %g", d);
}

/* 2-D: `tensor` over each process's two devices, the batch shared between
 * the processes as `data` shares it. The same model as one device within
 * 1e-12 in f64 (SGD, and AdamW with the gradient clipped: its norm summed
 * over both devices' slices after the processes' sum) and 1e-5 in f32
 * (SGD, clipped; AdamW's steps in f32 part by 1e-4 from one device even
 * within one process, as it divides by roots of tiny numbers). */
static void two_processes_split_every_layer_over_their_devices(void **state) {
    static const struct {
        const char *args, *name;
        double tol;
    } runs[] = {
        {"--steps 12 --precision f64", "f64_sgd", 1e-12},
        {"--steps 12 --precision f64 --optimizer adamw --lr 0.002 --clip 0.5", "f64_adamw", 1e-12},
        {"--steps 12 --clip 0.5", "f32_sgd", 1e-5},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char one[64], two[64], extra[256];
        double d;
        snprintf(one, sizeof one, "one_%s.safetensors", runs[i].name);
        snprintf(two, sizeof two, "tensor_%s.safetensors", runs[i].name);
        snprintf(extra, sizeof extra, "%s --strategy tensor", runs[i].args);
        free(train(0, "cpu:0", runs[i].args, one));
        free(train(2, "cpu*2", extra, two));
        d = checkpoint_diff(two, one);
        printf("tensor in 2 processes of 2 devices, %s: %.3g from one device\n", runs[i].name, d);
        if (d > runs[i].tol)
            fail_msg("tensor in 2 processes of 2 devices differs from one device by %g (%s)", d,
                     runs[i].name);
    }
    /* the same, spelled as the mesh: each process one replica */
    free(train(2, "cpu*2", "--steps 12 --precision f64 --strategy data:2,tensor:2", "mesh.st"));
    {
        double d = checkpoint_diff("mesh.st", "one_f64_sgd.safetensors");
        printf("data:2,tensor:2 in 2 processes of 2 devices: %.3g from one device\n", d);
        if (d > 1e-12)
            fail_msg("data:2,tensor:2 over 2 processes differs from one device by %g", d);
    }
}

/* data:2,pipeline:2 under mpirun: each process a two-stage pipeline over
 * its devices, the stages summing their gradients with their peers; and a
 * checkpoint of the data:2,tensor:2 run resumes under it. */
static void two_processes_each_run_a_pipeline(void **state) {
    double d;
    (void)state;
    free(train(2, "cpu*2", "--steps 12 --precision f64 --strategy data:2,pipeline:2", "pp.st"));
    d = checkpoint_diff("pp.st", "one_f64_sgd.safetensors");
    printf("data:2,pipeline:2 in 2 processes of 2 devices: %.3g from one device\n", d);
    if (d > 1e-12)
        fail_msg("data:2,pipeline:2 over 2 processes differs from one device by %g", d);
    free(train(2, "cpu*2", "--steps 6 --precision f64 --strategy data:2,tensor:2", "half.st"));
    {
        char extra[1024];
        snprintf(extra, sizeof extra,
                 "--steps 12 --precision f64 --strategy data:2,pipeline:2 --resume %s/half.st",
                 td_test_tmpdir());
        free(train(2, "cpu*2", extra, "resumed.st"));
    }
    d = checkpoint_diff("resumed.st", "one_f64_sgd.safetensors");
    printf("data:2,tensor:2 for 6 steps, then data:2,pipeline:2: %.3g from one device\n", d);
    if (d > 1e-12)
        fail_msg("data:2,tensor:2 resumed under data:2,pipeline:2 differs from one device by %g",
                 d);
}

/* A device lost in process 1: that process's run fails, and it ends the
 * job, so process 0 stops at once instead of waiting in its next collective
 * for the default timeout (five minutes; `timeout` stops the test long
 * before). */
static void a_failed_process_ends_the_job(void **state) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(
        cmd, sizeof cmd,
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
        "TANDEM_FAULT=p1/cpu@allreduce:20:error timeout 150 mpirun --oversubscribe "
        "--mca btl self,vader -np 2 %s train --model %s/examples/mnist_mlp.json "
        "--data %s/data/mnist --batch 64 --steps 12 --quiet --devices cpu --strategy data",
        TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc == 0 || rc == 124 || !err || !strstr(err, "cpu (rank 1) failed") ||
        !strstr(err, "ending all 2 processes of this MPI job"))
        fail_msg("exit %d (124: still waiting after 150 s): %s", rc, err ? err : "");
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_processes_train_one_model),
        cmocka_unit_test(two_processes_train_with_zero_1),
        cmocka_unit_test(two_processes_split_every_layer_over_their_devices),
        cmocka_unit_test(two_processes_each_run_a_pipeline),
        cmocka_unit_test(a_failed_process_ends_the_job),
    };
#ifndef TD_HAVE_MPI
    td_test_skip("tandem was built without MPI");
#endif
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        td_test_skip("no mpirun on this machine");
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
