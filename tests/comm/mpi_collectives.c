/* The MPI transport under mpirun: every collective against the serial f64
 * reference across processes (the all-reduce through shared memory, or
 * through MPI with TANDEM_MPI_SHM=0), with an uneven number of devices per process
 * (1 in even processes, 2 in odd ones), then all-reduces started together
 * and waited for, then a shrink that drops one member.
 * Prints what failed and exits non-zero; run by tests/comm/tests.cmake with
 * mpirun -np 2 and -np 3, and across network namespaces (scripts/nodes) with
 * --across-nodes, where shared memory must not be used: the leaders' step
 * goes over MPI's TCP transport, as between machines. */
#include <mpi.h>
#include <stdatomic.h>
#include <unistd.h>

#include "comm/comm-impl.h"
#include "comm/common.h"

static atomic_int failures;
static char first[1024];
static atomic_int claimed;

static void fail_once(const char *msg) {
    if (atomic_exchange(&claimed, 1) == 0)
        snprintf(first, sizeof first, "%s", msg);
    atomic_fetch_add(&failures, 1);
}

static td_status sweep_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    static const size_t counts[] = {0, 1, 7, 1000, 70001};
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
        for (int kind = 0; kind < 5; kind++)
            for (int dt = 0; dt < 2; dt++) {
                int nops = kind == TD_COLL_BROADCAST || kind == TD_COLL_ALLGATHER ? 1 : 4;
                for (int op = 0; op < nops; op++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        td_collective c = {(td_collective_kind)kind,
                                           NULL,
                                           0,
                                           NULL,
                                           0,
                                           counts[ci],
                                           (td_dtype)dt,
                                           (td_reduce_op)op,
                                           (int)((ci * 3 + (size_t)op) % (size_t)n)};
                        char err[512];
                        td_status st = comm_check(g, dev, rank, n, c, in_place, err, sizeof err);
                        if (st == TD_ERR_CORRUPT)
                            fail_once(err);
                        else if (st != TD_OK)
                            return st;
                    }
            }
    return TD_OK;
}

/* Several all-reduces started, then waited for: a member's engine runs them
 * while its host thread starts the next, as the data strategy's buckets do. f64 sums of exact
 * integers: every element is checked exactly. */
#define ASYNC_N 8
static td_status async_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    td_buffer *b[ASYNC_N] = {0};
    td_comm_request *req[ASYNC_N] = {0};
    double *host = NULL;
    size_t counts[ASYNC_N];
    td_status st = TD_OK;
    (void)arg;
    for (int k = 0; k < ASYNC_N; k++)
        counts[k] = k % 2 ? 1000 + (size_t)k : 70001;
    if (!(host = malloc(sizeof *host * 70001)))
        return TD_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < ASYNC_N && st == TD_OK; k++) {
        for (size_t i = 0; i < counts[k]; i++)
            host[i] = (double)(rank * 3 + k) + (double)(i % 97);
        if ((st = td_buffer_alloc(dev, counts[k] * sizeof *host, &b[k])) == TD_OK)
            st = td_buffer_write(b[k], 0, host, counts[k] * sizeof *host);
    }
    for (int k = 0; k < ASYNC_N && st == TD_OK; k++) {
        td_collective c = {TD_COLL_ALLREDUCE, b[k], 0, b[k], 0, counts[k], TD_F64,
                           TD_REDUCE_SUM,     0};
        st = td_collective_start(g, &c, &req[k]);
        /* Odd ranks start theirs slowly, even ranks all at once: peers in a
         * process have started different numbers when their engines meet. */
        if (rank % 2)
            usleep(20000);
    }
    for (int k = 0; k < ASYNC_N; k++) {
        td_status w = req[k] ? td_comm_wait(req[k]) : TD_OK;
        st = st == TD_OK ? w : st;
        td_comm_request_destroy(req[k]);
    }
    for (int k = 0; k < ASYNC_N && st == TD_OK; k++) {
        char err[256];
        if ((st = td_buffer_read(b[k], 0, host, counts[k] * sizeof *host)) != TD_OK)
            break;
        for (size_t i = 0; i < counts[k]; i++) {
            /* sum over r of (3 r + k + i % 97) */
            double want = 3.0 * n * (n - 1) / 2 + (double)n * ((double)k + (double)(i % 97));
            if (host[i] != want) {
                snprintf(err, sizeof err, "async all-reduce %d, element %zu: %g, expected %g", k, i,
                         host[i], want);
                fail_once(err);
                break;
            }
        }
    }
    for (int k = 0; k < ASYNC_N; k++)
        td_buffer_free(b[k]);
    free(host);
    return st;
}

int main(int argc, char **argv) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL, *s = NULL;
    int process = 0, nprocs = 0, rc = 1, want;
    const int across_nodes = argc > 1 && !strcmp(argv[1], "--across-nodes");
    char spec[16];
    td_status st;
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.timeout_ms = 120000;
    cfg.fault = "";
    /* tandem initialises MPI itself (and finalises it at exit). */
    {
        int init = 0;
        MPI_Initialized(&init);
        if (init)
            return 2;
    }
    /* The spec depends on the process: ask MPI which one this is, after
     * tandem has initialised it, through a throwaway group. */
    if ((st = td_group_create_spec("cpu:0", &cfg, &g)) != TD_OK) {
        fprintf(stderr, "creating a probe group: %s: %s\n", td_status_name(st), td_last_error());
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &process);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if (td_group_size(g) != nprocs) {
        fprintf(stderr, "probe group has %d members, expected %d\n", td_group_size(g), nprocs);
        return 1;
    }
    td_group_destroy(g);
    g = NULL;

    snprintf(spec, sizeof spec, "cpu*%d", 1 + process % 2);
    if ((st = td_group_create_spec(spec, &cfg, &g)) != TD_OK) {
        fprintf(stderr, "process %d: td_group_create_spec(%s): %s: %s\n", process, spec,
                td_status_name(st), td_last_error());
        return 1;
    }
    want = 0;
    for (int p = 0; p < nprocs; p++)
        want += 1 + p % 2;
    if (td_group_size(g) != want || strcmp(td_group_transport(g), "mpi")) {
        fprintf(stderr, "process %d: group of %d (%s), expected %d (mpi)\n", process,
                td_group_size(g), td_group_transport(g), want);
        goto done;
    }
    {
        /* One machine: the leaders all-reduce through shared memory, unless
         * told not to; then through MPI. Several nodes: through MPI. */
        const char *env = getenv("TANDEM_MPI_SHM");
        int want_shm = !(env && !strcmp(env, "0")) && !across_nodes;
        if (td__mpi_shared_memory(g) != want_shm) {
            fprintf(stderr, "process %d: shared memory %s, expected %s\n", process,
                    td__mpi_shared_memory(g) ? "used" : "not used", want_shm ? "used" : "not");
            goto done;
        }
    }
    if ((st = td_group_run(g, sweep_fn, NULL)) != TD_OK) {
        fprintf(stderr, "process %d: td_group_run: %s: %s\n", process, td_status_name(st),
                td_last_error());
        goto done;
    }
    if ((st = td_group_run(g, async_fn, NULL)) != TD_OK) {
        fprintf(stderr, "process %d: asynchronous all-reduces: %s: %s\n", process,
                td_status_name(st), td_last_error());
        goto done;
    }
    if (atomic_load(&failures)) {
        fprintf(stderr, "process %d: %d wrong results; first: %s\n", process,
                atomic_load(&failures), first);
        goto done;
    }
    /* Drop global rank 1 (process 1's first device) and use the rest. */
    {
        int drop[1] = {1};
        if ((st = td_group_shrink(g, drop, 1, &s)) != TD_OK &&
            !(process == 1 && nprocs == 2 && td_group_local_size(g) == 1)) {
            fprintf(stderr, "process %d: td_group_shrink: %s: %s\n", process, td_status_name(st),
                    td_last_error());
            goto done;
        }
        if (s) {
            if (td_group_size(s) != want - 1) {
                fprintf(stderr, "process %d: shrunk group of %d, expected %d\n", process,
                        td_group_size(s), want - 1);
                goto done;
            }
            if ((st = td_group_run(s, sweep_fn, NULL)) != TD_OK || atomic_load(&failures)) {
                fprintf(stderr, "process %d: after shrinking: %s: %s %s\n", process,
                        td_status_name(st), td_last_error(), first);
                goto done;
            }
        }
    }
    {
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        printf("process %d of %d on %s: %d members, all-reduce %s, every collective matched the "
               "reference\n",
               process, nprocs, host, want,
               td__mpi_shared_memory(g) ? "through shared memory" : "through MPI");
    }
    rc = 0;
done:
    td_group_destroy(s);
    td_group_destroy(g);
    return rc;
}
