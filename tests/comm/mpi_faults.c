/* Failure across processes under mpirun: a device in process 1 fails at its
 * third all-reduce; every process's run must end with TD_ERR_DEVICE_LOST
 * within the timeout (through shared memory process 0 is told at once;
 * through MPI it finds out by timing out), and the survivors shrink to a
 * group that works. Run with -np 2 by tests.cmake; with --stall, across
 * two nodes one of which scripts/nodes stalls (stalled_node_is_named);
 * with --late, process 1 stalls before it starts MPI (late_process_ends_the_run). */
#include <mpi.h>
#include <unistd.h>

#include "comm/comm-impl.h"
#include "comm/common.h"

static td_status fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    td_status st = TD_OK;
    for (int i = 0; i < 5 && st == TD_OK; i++) {
        td_collective c = {TD_COLL_ALLREDUCE, NULL, 0, NULL, 0, 1000, TD_F32, TD_REDUCE_SUM, 0};
        char err[512];
        st = comm_check(g, dev, rank, n, c, 0, err, sizeof err);
        if (st == TD_ERR_CORRUPT)
            fprintf(stderr, "%s\n", err);
    }
    return st;
}

/* Across nodes (scripts/nodes --fault stop:1@S): all-reduces until the
 * group fails; process 1's node is stalled meanwhile, so process 0 times
 * out in MPI and must name it. Prints "named the stalled node" on success
 * and then leaves at once (MPI_Finalize would wait for the stalled node). */
static int stalled_node_is_named(void) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    int process = 0;
    td_status st;
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.timeout_ms = 3000;
    cfg.fault = "";
    if ((st = td_group_create_spec("cpu", &cfg, &g)) != TD_OK) {
        fprintf(stderr, "td_group_create_spec: %s: %s\n", td_status_name(st), td_last_error());
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &process);
    while ((st = td_group_run(g, fn, NULL)) == TD_OK)
        ;
    printf("process %d: %s: %s\n", process, td_status_name(st), td_last_error());
    if (process == 0 && st == TD_ERR_DEVICE_LOST &&
        strstr(td_last_error(), "MPI process 1 (on node1) never arrived"))
        printf("process 0: named the stalled node\n");
    fflush(stdout);
    _exit(0);
}

/* Process 1 stalls for a minute before it starts MPI: process 0's start-up
 * (MPI_Init, the group's communicators), which has no timeout of its own,
 * ends at its watchdog's 10 s with the reason on stderr, and mpirun ends
 * process 1. Reaching the end is the failure. */
static int late_process_ends_the_run(void) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (rank && !strcmp(rank, "1"))
        sleep(60);
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.timeout_ms = 1000;
    cfg.fault = "";
    (void)td_group_create_spec("cpu", &cfg, &g);
    printf("process %s: the group was made after all: the stall went unnoticed\n",
           rank ? rank : "?");
    return 1;
}

int main(int argc, char **argv) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL, *s = NULL;
    int process = 0;
    td_status st;
    uint64_t t0;
    if (argc > 1 && !strcmp(argv[1], "--stall"))
        return stalled_node_is_named();
    if (argc > 1 && !strcmp(argv[1], "--late"))
        return late_process_ends_the_run();
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.timeout_ms = 2000;
    cfg.fault = "p1/cpu@allreduce:3:error";
    if ((st = td_group_create_spec("cpu", &cfg, &g)) != TD_OK) {
        fprintf(stderr, "td_group_create_spec: %s: %s\n", td_status_name(st), td_last_error());
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &process);
    t0 = td_clock_ns();
    st = td_group_run(g, fn, NULL);
    if (st != TD_ERR_DEVICE_LOST) {
        fprintf(stderr, "process %d: the run returned %s, expected TD_ERR_DEVICE_LOST: %s\n",
                process, td_status_name(st), td_last_error());
        return 1;
    }
    if (td_clock_ns() - t0 > 20ull * 1000000000ull) {
        fprintf(stderr, "process %d: the failure took more than 20 s to reach\n", process);
        return 1;
    }
    /* Through shared memory process 1 says it failed: process 0 must not
     * need its timeout to find out. */
    if (td__mpi_shared_memory(g) && td_clock_ns() - t0 >= 2000ull * 1000000ull) {
        fprintf(stderr, "process %d: the failure took the whole timeout to reach\n", process);
        return 1;
    }
    printf("process %d: %s\n", process, td_last_error());
    st = td_group_shrink(g, NULL, 0, &s);
    if (process == 1) {
        if (st != TD_ERR_DEVICE_LOST || s) {
            fprintf(stderr, "process 1: shrink returned %s, expected no survivor here\n",
                    td_status_name(st));
            return 1;
        }
    } else {
        if (st != TD_OK || td_group_size(s) != 1) {
            fprintf(stderr, "process 0: shrink: %s: %s\n", td_status_name(st), td_last_error());
            return 1;
        }
        if ((st = td_group_run(s, fn, NULL)) != TD_OK) {
            fprintf(stderr, "process 0: the shrunk group: %s: %s\n", td_status_name(st),
                    td_last_error());
            return 1;
        }
        printf("process 0: the survivor's group works\n");
    }
    td_group_destroy(s);
    td_group_destroy(g);
    return 0;
}
