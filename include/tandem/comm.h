/* tandem: device groups and collectives.
 *
 * A group is a set of devices that run one function together, SPMD style:
 * td_group_run() runs fn on every member's own host thread, with the
 * member's rank and the group size, and waits for all of them. Inside fn,
 * every member calls the same collectives in the same order (as with NCCL or
 * MPI); a collective combines the members' td_buffer or td_tensor data.
 *
 * Transports:
 *   local  members in this process. CPU devices share one address space, so a
 *          member reads its peers' buffers directly (peer copies, as GPUs
 *          with peer access do); devices whose memory the host cannot address
 *          are staged through host memory.
 *   mpi    members in several processes started by mpirun; hierarchical:
 *          the members inside a process combine first, then one member per
 *          process talks to the other processes through MPI.
 *   nccl   CUDA devices, one per GPU, through NCCL.
 *
 * Failure: every wait inside a collective has a timeout (TANDEM_COMM_TIMEOUT_MS,
 * default 300000: five minutes, as a device's first passes may compile its
 * kernels). A member that fails, or that does not arrive in time, puts
 * the group into an error state: every member's collective returns
 * TD_ERR_DEVICE_LOST naming the member, the group's record of its last
 * collectives is logged, and later collectives fail at once. td_group_shrink()
 * then makes a working group of the survivors.
 *
 * Fault injection for tests, TANDEM_FAULT (or td_group_config.fault):
 *   ITEM[,ITEM...]   ITEM = [pP/]DEVICE@KIND:N[:MODE]
 *   DEVICE  a member's device name, "cpu:1"; pP/ limits it to MPI process P
 *   KIND    allreduce, broadcast, reduce, allgather, reducescatter or any
 *   N       the device fails at its N-th collective of that kind (1-based)
 *   MODE    hang (default): it stops answering, so its peers time out and
 *           name it; error: it fails at once and tells its peers.
 * or a bit flip, for a strategy that checks its members' numbers (mirror):
 *   KIND    grad, act or weight: one bit of a gradient, of the step's input
 *           activations or of a weight on DEVICE
 *   N       the step (from 1) in which it flips; MODE flip (the default)
 * Examples: TANDEM_FAULT=cpu:1@allreduce:5, TANDEM_FAULT=cpu:2@grad:3 */
#ifndef TANDEM_COMM_H
#define TANDEM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/device.h"
#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_group td_group;
typedef struct td_comm_request td_comm_request;

typedef enum td_reduce_op {
    TD_REDUCE_SUM = 0,
    TD_REDUCE_MEAN = 1, /* the sum divided by the group size */
    TD_REDUCE_MAX = 2,
    TD_REDUCE_MIN = 3,
} td_reduce_op;

typedef enum td_transport {
    TD_TRANSPORT_AUTO = 0, /* nccl for CUDA devices where it can, else local */
    TD_TRANSPORT_LOCAL = 1,
    TD_TRANSPORT_MPI = 2, /* needs a tandem built with MPI; see td_group_create */
    TD_TRANSPORT_NCCL = 3,
} td_transport;

/* Which algorithm a collective uses. AUTO takes the latency-optimised direct
 * exchange below the switch size; above it, the shared work queue for a local
 * all-reduce and the chunked pipelined ring (or chain) for the rest. */
typedef enum td_comm_algorithm {
    TD_ALGO_AUTO = 0,
    TD_ALGO_DIRECT = 1, /* every member reads every peer's contribution: one barrier */
    TD_ALGO_RING = 2,   /* chunked, pipelined ring (chain for broadcast and reduce) */
    TD_ALGO_SHARED = 3, /* all-reduce: members pull chunks of the whole job from a shared
                           counter; a descheduled member delays no one (local only) */
} td_comm_algorithm;

typedef enum td_collective_kind {
    TD_COLL_ALLREDUCE = 0,
    TD_COLL_BROADCAST = 1,
    TD_COLL_REDUCE = 2,
    TD_COLL_ALLGATHER = 3,
    TD_COLL_REDUCE_SCATTER = 4,
} td_collective_kind;
/* How many kinds there are, for tables indexed by kind. */
#define TD_COLL_KINDS 5

/* "allreduce", "broadcast", "reduce", "allgather", "reducescatter". Static. */
TD_API const char *td_collective_name(td_collective_kind kind);

/* What an injected bit flip strikes (TANDEM_FAULT's KIND grad, act, weight). */
typedef enum td_flip_target {
    TD_FLIP_GRAD = 0,
    TD_FLIP_ACT = 1,
    TD_FLIP_WEIGHT = 2
} td_flip_target;
#define TD_FLIP_TARGETS 3

typedef struct td_group_config {
    td_transport transport;
    int timeout_ms;      /* 0: TANDEM_COMM_TIMEOUT_MS, else 300000 */
    size_t switch_bytes; /* direct below, ring at or above; 0: TANDEM_ALLREDUCE_SWITCH_BYTES,
                            else the default measured on the reference machine */
    td_comm_algorithm algorithm; /* force one algorithm (tests, calibration) */
    size_t chunk_bytes;          /* ring pipeline chunk; 0: 128 KiB */
    const char *fault;           /* fault injection, as TANDEM_FAULT; NULL: read TANDEM_FAULT */
} td_group_config;

#define TD_GROUP_CONFIG_INIT                                                                       \
    {                                                                                              \
        .transport = TD_TRANSPORT_AUTO, .timeout_ms = 0, .switch_bytes = 0,                        \
        .algorithm = TD_ALGO_AUTO, .chunk_bytes = 0, .fault = NULL                                 \
    }

/* Creates a group over every device of `devices`, ranks in list order. The
 * list must outlive the group (destroy the group first). cfg may be NULL for
 * the defaults. With cfg->transport TD_TRANSPORT_MPI every process started by
 * mpirun must call this collectively (from its main thread); global ranks go
 * process by process (all of process 0's devices first). tandem calls
 * MPI_Init_thread(MPI_THREAD_SERIALIZED) when MPI is not initialised yet, and
 * then MPI_Finalize at process exit (or in td_comm_mpi_finalize); when the
 * application initialised MPI itself it must provide MPI_THREAD_SERIALIZED or
 * more, and it finalises MPI itself. On failure *out is NULL. */
TD_API td_status td_group_create(td_device_list *devices, const td_group_config *cfg,
                                 td_group **out);
/* The same over devs[0..n), devices already open (members of another group,
 * say, for a group of some of them); they must outlive the group. */
TD_API td_status td_group_create_devices(td_device *const *devs, size_t n,
                                         const td_group_config *cfg, td_group **out);
/* The same over the devices a spec names ("cpu*2"); the group owns the list. */
TD_API td_status td_group_create_spec(const char *spec, const td_group_config *cfg, td_group **out);
/* Waits for outstanding asynchronous collectives, then releases everything.
 * NULL-safe. Not from inside td_group_run. */
TD_API void td_group_destroy(td_group *g);

/* Members in the whole group (all processes) and in this process. */
TD_API int td_group_size(const td_group *g);
TD_API int td_group_local_size(const td_group *g);
/* The device of global rank `rank` when it is in this process, else NULL. */
TD_API td_device *td_group_device(const td_group *g, int rank);
/* The global rank of dev in g when it is a member in this process, else -1. */
TD_API int td_group_rank_of(const td_group *g, const td_device *dev);
/* How long a member waits for the others before the group fails (ms). */
TD_API int td_group_timeout_ms(const td_group *g);
/* "local", "mpi" or "nccl". */
TD_API const char *td_group_transport(const td_group *g);
/* 1 when this process's members' host threads contend for cores: more
 * members than the process may use CPUs, or CPU devices bound to a common
 * core (cpu*3 on two cores, and the two of it that share one). A waiting
 * member then gives its core away at once, and the local all-reduce takes
 * the shared queue rather than the ring, which a descheduled member stalls. */
TD_API int td_group_shares_cores(const td_group *g);

/* What each member runs: its device, its global rank and the group size. */
typedef td_status (*td_group_fn)(td_group *g, td_device *dev, int rank, int size, void *arg);

/* Runs fn on every local member's host thread and waits for all of them (a
 * barrier). Returns TD_OK when every member returned TD_OK; otherwise the
 * status of the member whose failure came first (the one that broke the
 * group when there is one), with a message naming it: "member 1 (cpu:1):
 * ...". A member whose fn fails puts the group into its error state, so its
 * peers stop waiting for it. Call it from a thread that is no member's host
 * thread; one td_group_run at a time per group. Members that stop answering
 * are waited for no longer than the timeout after the group failed; such a
 * member's task is left running (its device's queue stays blocked behind
 * it), so neither the group nor fn's arg may be freed before it returns. */
TD_API td_status td_group_run(td_group *g, td_group_fn fn, void *arg);

/* From inside another group's run, on the host thread of a device that is
 * also a member of g: runs fn as that member of g, there and then, so that
 * a member can take part in a collective along another axis of a mesh (a
 * pipeline stage summing its gradients with the same stage of the other
 * replicas) without leaving its own run. Every member of g must join, each
 * from its own thread; a failure puts g into its error state, as in
 * td_group_run. TD_ERR_INVALID_ARG when the calling thread is no member's
 * host thread of g. */
TD_API td_status td_group_join(td_group *g, td_group_fn fn, void *arg);

/* Puts g into its error state from outside its collectives (why says what
 * happened, for its members' messages): members waiting in one of its
 * collectives, or entering one, get TD_ERR_DEVICE_LOST at once instead of
 * waiting for the timeout. For a mesh, whose other groups do not see a
 * failure in one of them. Safe from any thread; a group already failed
 * keeps its first reason. */
TD_API void td_group_abort(td_group *g, const char *why);

/* TD_OK while the group works; once it failed, the status its collectives
 * return (TD_ERR_DEVICE_LOST) with the reason as this thread's message. */
TD_API td_status td_group_error(td_group *g);

/* Whether the member of global rank `rank`, in this process, failed or was
 * lost (the members td_group_shrink(g, NULL, 0, ...) leaves out); 0 for a
 * rank not here. */
TD_API int td_group_member_failed(const td_group *g, int rank);

/* Makes a new group of this group's members less the excluded ranks
 * (exclude[0..n_exclude)); with n_exclude 0, less the members that failed.
 * The new group has the same configuration, ranks renumbered in the old
 * order, and its own sequence numbers; g stays valid (destroy it when done).
 * Not from inside td_group_run. With MPI every process calls it. */
TD_API td_status td_group_shrink(td_group *g, const int *exclude, size_t n_exclude, td_group **out);

/* The record of the group's last collectives, one line each: sequence
 * number, kind, size, and per member when it arrived and finished (or that
 * it never arrived). Written into buf (truncated to n bytes); returns buf.
 * The same text is logged when a collective times out. */
TD_API const char *td_group_record(td_group *g, char *buf, size_t n);

/* For a strategy that checks its members' numbers: 1 when fault injection
 * plans a bit flip in `what` on the device of member `rank` (of this
 * process) at step `step` (from 1), else 0. The item then counts as fired
 * and strikes no more, in g and in the groups shrunk from it; the caller
 * flips the bit. Safe from the member's host thread. */
TD_API int td_group_fault_flip(td_group *g, int rank, td_flip_target what, int64_t step);

/* Measures the direct exchange and the large-message all-reduce (the shared
 * queue locally, the ring otherwise) on this group over sizes 64 B to 1 MiB
 * and sets the group's switch point to the smallest size from which the
 * large-message algorithm is faster at every size; *switch_bytes (may be NULL) receives it. Not
 * from inside td_group_run; every process calls it for an MPI group. */
TD_API td_status td_group_calibrate(td_group *g, size_t *switch_bytes);
/* The switch point in use. */
TD_API size_t td_group_switch_bytes(const td_group *g);

/* Collectives. Called inside td_group_run by every member, in the same order
 * and with the same count, dtype, op and root. Buffers are the calling
 * member's own (on its device); offsets are in bytes. Passing send == recv
 * at the same place works in place. count is in elements:
 *   allreduce       recv[i] = op over members of send[i], i < count
 *   broadcast       recv = send of root (send is read on root only)
 *   reduce          root's recv = op of every send (recv ignored elsewhere, may be NULL)
 *   allgather       recv (count * size) = concatenation of every send (count) in rank order
 *   reduce_scatter  recv (count) = op over members of send[rank * count + i]
 *                   (send holds count * size)
 * All members get bit-identical results. Errors: TD_ERR_INVALID_ARG for
 * bad buffers or a call outside td_group_run (the group then fails, so peers
 * do not wait), TD_ERR_DEVICE_LOST when any member failed or timed out. */
TD_API td_status td_allreduce(td_group *g, const td_buffer *send, size_t send_offset,
                              td_buffer *recv, size_t recv_offset, size_t count, td_dtype dtype,
                              td_reduce_op op);
TD_API td_status td_broadcast(td_group *g, const td_buffer *send, size_t send_offset,
                              td_buffer *recv, size_t recv_offset, size_t count, td_dtype dtype,
                              int root);
TD_API td_status td_reduce(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                           size_t recv_offset, size_t count, td_dtype dtype, td_reduce_op op,
                           int root);
TD_API td_status td_allgather(td_group *g, const td_buffer *send, size_t send_offset,
                              td_buffer *recv, size_t recv_offset, size_t count, td_dtype dtype);
TD_API td_status td_reduce_scatter(td_group *g, const td_buffer *send, size_t send_offset,
                                   td_buffer *recv, size_t recv_offset, size_t count,
                                   td_dtype dtype, td_reduce_op op);

/* In place on a whole tensor. */
TD_API td_status td_allreduce_tensor(td_group *g, td_tensor *t, td_reduce_op op);
TD_API td_status td_broadcast_tensor(td_group *g, td_tensor *t, int root);

/* One collective described as data, for the asynchronous calls. */
typedef struct td_collective {
    td_collective_kind kind;
    const td_buffer *send;
    size_t send_offset;
    td_buffer *recv;
    size_t recv_offset;
    size_t count;
    td_dtype dtype;
    td_reduce_op op; /* allreduce, reduce, reduce_scatter */
    int root;        /* broadcast, reduce */
} td_collective;

/* Runs c now, as the matching call above does. */
TD_API td_status td_collective_run(td_group *g, const td_collective *c);

/* Starts c and returns at once with *req. The member's communication engine
 * (one helper thread per member, started on first use; it works on this
 * member's buffers only, as a GPU's copy engine would) runs the member's
 * asynchronous collectives in the order they were started, so the caller can
 * compute meanwhile (say, backward of earlier layers). The buffers must stay
 * untouched until the request is done. A synchronous collective, and the end
 * of fn, first wait for the member's outstanding ones. The caller destroys
 * *req (after waiting). Inside td_group_run only. */
TD_API td_status td_collective_start(td_group *g, const td_collective *c, td_comm_request **req);
TD_API td_status td_allreduce_async(td_group *g, td_buffer *buf, size_t offset, size_t count,
                                    td_dtype dtype, td_reduce_op op, td_comm_request **req);
/* TD_IN_PROGRESS while running; else the collective's status (and message). */
TD_API td_status td_comm_test(td_comm_request *req);
/* Waits until done; returns the collective's status and carries its message. */
TD_API td_status td_comm_wait(td_comm_request *req);
/* When the collective ran (td_clock_ns, from its start to its end, waiting
 * for the other members included); waits for it first. For telling how much
 * of it ran while the caller computed. */
TD_API td_status td_comm_request_times(td_comm_request *req, uint64_t *began_ns,
                                       uint64_t *ended_ns);
/* Waits when still running, then frees. NULL-safe. */
TD_API void td_comm_request_destroy(td_comm_request *req);

/* Where the job launcher (mpirun: Open MPI's OMPI_COMM_WORLD_*, or a PMI
 * launcher's PMI_*) placed this process, before any group exists: *rank
 * and *size (each may be NULL); 0 and 1 when no launcher started it. A
 * size over 1 is what TD_TRANSPORT_MPI serves. */
TD_API void td_comm_launch(int *rank, int *size);

/* Finalises MPI when tandem initialised it and no group uses it any more;
 * otherwise does nothing. Also run at exit. */
TD_API void td_comm_mpi_finalize(void);

/* Ends every process of the MPI job (MPI_Abort on MPI_COMM_WORLD with `code`)
 * when MPI is initialised, not finalised, and the job has more than one
 * process; otherwise returns. For an application whose run failed in this
 * process: the other processes would otherwise wait in their next collective
 * until its timeout (five minutes by default) before they found out. */
TD_API void td_comm_mpi_abort(int code);

#ifdef __cplusplus
}
#endif
#endif
