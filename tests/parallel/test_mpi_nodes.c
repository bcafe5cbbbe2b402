/* `tandem train` across two nodes: one process on each of two network
 * namespaces (scripts/nodes), which talk over Open MPI's TCP transport on
 * shaped links as two machines would, against one device. `data` over
 * one and two devices a node on 1 Gbit/s links, `tensor` inside each node with
 * `data` across on 10 Gbit/s links; `pipeline` runs within one process and
 * must say so. Skipped, with the reason, where tandem was built without MPI,
 * mpirun is missing, or namespaces cannot be made (not root, a container
 * without privileges). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"

/* The launcher: scripts/nodes with 2 nodes, each link at rate. Open MPI's
 * plugins' own allocations are not ours to leak-check. */
static const char *nodes(const char *rate) {
    static char launcher[512];
    snprintf(launcher, sizeof launcher,
             "ASAN_OPTIONS=detect_leaks=0 %s/scripts/nodes --nodes 2 --rate %s --timeout 240 ",
             TD_SOURCE_DIR, rate);
    return launcher;
}

static double checkpoint_diff(const char *a, const char *b) {
    return td_dp_checkpoint_diff(td_test_tmp(a), td_test_tmp(b));
}

static void train_one_device(const char *args, const char *ckpt) {
    free(td_dp_train_cli("", "cpu:0", args, ckpt));
}

/* data: one or two replicas in each node, reduced inside the node and then
 * across the slow link. f64: within 1e-12 of one device. */
static void data_across_two_nodes_equals_one_device(void **state) {
    static const char *const devices[] = {"cpu", "cpu*2"};
    const char *args = "--steps 8 --precision f64";
    char extra[256], rank[16], *out;
    train_one_device(args, "one.safetensors");
    snprintf(extra, sizeof extra, "%s --strategy data", args);
    for (int k = 0; k < 2; k++) {
        double d;
        out = td_dp_train_cli(nodes("1gbit"), devices[k], extra, "data.safetensors");
        /* Rank 0's process alone reports, and it knows every member. */
        snprintf(rank, sizeof rank, "rank %d", 2 * (k + 1) - 1);
        if (!strstr(out, rank))
            fail_msg("the report names no %s: %s", rank, out);
        free(out);
        d = checkpoint_diff("data.safetensors", "one.safetensors");
        printf("data over 2 nodes of %s (1 Gbit/s links), f64: %.3g from one device\n", devices[k],
               d);
        if (d > 1e-12)
            fail_msg("data over 2 nodes of %s differs from one device by %g", devices[k], d);
    }
}

/* tensor inside each node (every layer split over its two devices), data
 * across the nodes. f64, SGD: within 1e-12 of one device. */
static void tensor_inside_data_across_two_nodes_equals_one_device(void **state) {
    const char *args = "--steps 8 --precision f64";
    char extra[256];
    double d;
    train_one_device(args, "one_t.safetensors");
    snprintf(extra, sizeof extra, "%s --strategy tensor", args);
    free(td_dp_train_cli(nodes("10gbit"), "cpu*2", extra, "tensor.safetensors"));
    d = checkpoint_diff("tensor.safetensors", "one_t.safetensors");
    printf("tensor inside 2 nodes of 2 devices, data across (10 Gbit/s), f64: %.3g from one "
           "device\n",
           d);
    if (d > 1e-12)
        fail_msg("tensor inside 2 nodes differs from one device by %g", d);
}

/* pipeline's stages pass activations by peer copies inside one process: a
 * job across nodes is refused, saying what to use instead, and ends. */
static void pipeline_across_nodes_is_refused(void **state) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd,
             "%s%s train --model %s/examples/mnist_mlp.json --data %s/data/mnist --batch 64 "
             "--steps 2 --quiet --devices 'cpu*2' --strategy pipeline",
             nodes("10gbit"), TD_TANDEM_EXE, TD_SOURCE_DIR, TD_SOURCE_DIR);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc == 0 || rc == 124 || rc == 137 || !err ||
        !strstr(err, "pipeline: runs within one process"))
        fail_msg("exit %d: %s", rc, err ? err : "");
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(data_across_two_nodes_equals_one_device),
        cmocka_unit_test(tensor_inside_data_across_two_nodes_equals_one_device),
        cmocka_unit_test(pipeline_across_nodes_is_refused),
    };
    char cmd[1024], *out = NULL, *err = NULL;
    int rc;
#ifndef TD_HAVE_MPI
    td_test_skip("tandem was built without MPI");
#endif
    snprintf(cmd, sizeof cmd, "%s/scripts/nodes --check --nodes 2", TD_SOURCE_DIR);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc == 77) {
        /* scripts/nodes said "skipped: REASON" */
        fputs(out ? out : "skipped: scripts/nodes --check\n", stdout);
        exit(77);
    }
    if (rc != 0) {
        fprintf(stderr, "'%s' exited %d: %s%s\n", cmd, rc, out ? out : "", err ? err : "");
        return 1;
    }
    free(out);
    free(err);
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
