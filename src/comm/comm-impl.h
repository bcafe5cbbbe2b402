/* The inside of the comm layer: the group, its members and their shared
 * synchronisation slots, and the entry points of each transport. */
#ifndef TD_COMM_IMPL_H
#define TD_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "device/internal.h"
#include "tandem/comm.h"

#define TD_CACHE_LINE     64
#define TD_COMM_RECORD    16 /* collectives remembered per member */
#define TD_COMM_FIFO      8  /* ring pipeline slots per member */
#define TD_COMM_MAX_FAULT 8

/* The switch point used when neither the config, TANDEM_ALLREDUCE_SWITCH_BYTES
 * nor td_group_calibrate() gave one: measured with `bench_collectives
 * --calibrate` on the reference machine (2-core EPYC, 2 local members). */
#define TD_COMM_DEFAULT_SWITCH (64u << 10)
#define TD_COMM_DEFAULT_CHUNK  (128u << 10)

/* One operation as a transport sees it: host-addressable pointers. */
typedef struct td__transport td__transport; /* below */

typedef struct td__op {
    td_collective_kind kind;
    const void *in; /* NULL: not read by this member (reduce on non-roots is fine) */
    void *out;      /* NULL where the result is not wanted here */
    size_t count;   /* elements, as in the public call */
    td_dtype dtype;
    td_reduce_op op;
    int root;               /* global rank */
    uint64_t seq;           /* the member's collective number, from 1 */
    td_comm_algorithm algo; /* AUTO: the group's choice (calibration forces one) */
} td__op;

/* A member's slot, read by its peers. Each field a peer polls sits on its own
 * cache line, so that one member's writes do not slow another's polling. */
/* What a member publishes for one phase: written before `posted` (release)
 * and read by peers after it (acquire). Two of them, by phase parity: a
 * member starts phase p + 2 only after every peer reached p + 1, so nobody
 * still reads the copy it overwrites. */
typedef struct td__pub {
    const void *in;
    void *out;
    size_t count;
    int kind, dtype, op, root;
    uint64_t seq;
} td__pub;

typedef struct td__slot {
    _Alignas(TD_CACHE_LINE) atomic_uint_least64_t posted; /* phase number the member reached */
    td__pub pub[2];
    _Alignas(TD_CACHE_LINE) atomic_uint_least64_t prog; /* (phase << 32) | units completed */
    _Alignas(TD_CACHE_LINE) char pad[1];
} td__slot;

/* One remembered collective of one member. Fields are atomics because the
 * record is read by whichever member reports a timeout. */
typedef struct td__record_entry {
    atomic_uint_least64_t seq; /* 0: empty */
    atomic_int kind;
    atomic_int dtype;
    atomic_uint_least64_t count;
    atomic_uint_least64_t arrive_ns; /* td_clock_ns() when it arrived */
    atomic_uint_least64_t done_ns;   /* 0 while running */
    atomic_int status;
} td__record_entry;

typedef struct td__fault {
    char device[32];
    int process; /* -1: any */
    int kind;    /* td_collective_kind, -1 for any, or TD__FAULT_FLIP_KIND + td_flip_target */
    int nth;     /* the N-th collective of that kind; for a flip, the step (from 1) */
    /* fail loudly; stop answering until the peers gave up; or for good; flip
     * one bit of a number (the strategy asks td_group_fault_flip) */
    enum { TD__FAULT_ERROR, TD__FAULT_HANG, TD__FAULT_STUCK, TD__FAULT_FLIP } mode;
} td__fault;

/* Flip items' kinds: past every collective kind, so a collective never matches one. */
#define TD__FAULT_FLIP_KIND 100

typedef struct td__engine td__engine; /* a member's async engine (collectives.c) */
/* Faults planned for a group and shared with the groups shrunk from it (fault.c). */
typedef struct td__fault_plan td__fault_plan;

typedef struct td__member {
    td_group *g;
    int local; /* index in this process */
    int rank;  /* global rank */
    td_device *dev;
    bool host_memory;  /* the device's pointers are host addresses (CPU) */
    uint64_t seq;      /* collectives issued so far (the issuing thread only) */
    uint64_t phase;    /* synchronisation phases run (the executing thread only) */
    int fault_slot;    /* its device's counters in g->faults, -1: none */
    atomic_int failed; /* 1 once this member failed or was lost */
    /* The collective it runs (on its host thread or engine): td_clock_ns()
     * when it began, 0 between collectives; its number and kind. */
    atomic_uint_least64_t busy_since, busy_seq;
    atomic_int busy_kind;
    td__engine *engine;
    atomic_uint_least64_t async_issued, async_done;
    void *small[2]; /* direct-exchange slots, double buffered by phase */
    void *fifo;     /* TD_COMM_FIFO ring slots of chunk_bytes */
    void *temp;     /* chunk_bytes: the shared all-reduce's result, kept in cache */
    td_buffer *small_buf, *fifo_buf;
    td__record_entry record[TD_COMM_RECORD];
} td__member;

struct td_group {
    int size;   /* global members */
    int nlocal; /* members in this process */
    int rank0;  /* global rank of local member 0 */
    int timeout_ms;
    int spin_rounds; /* rounds of spinning before yielding: few when members share cores */
    size_t switch_bytes;
    size_t small_bytes; /* capacity of one direct-exchange slot */
    size_t chunk_bytes;
    td_comm_algorithm algorithm;
    td_device_list *owned_list;
    td__fault_plan *faults; /* NULL: none injected */

    td__member *members; /* nlocal */
    td__slot *slots;     /* nlocal, cache-line aligned */

    /* The shared all-reduce's work queue, by phase parity (local/local.c). */
    _Alignas(TD_CACHE_LINE) atomic_uint_least64_t work_next[2];
    _Alignas(TD_CACHE_LINE) atomic_uint_least64_t work_done[2];

    _Alignas(TD_CACHE_LINE) atomic_int aborted;
    _Alignas(TD_CACHE_LINE) pthread_mutex_t fail_lock;
    td_status fail_status;
    int fail_rank; /* the member that broke the group, -1 when unknown */
    char fail_reason[1024];
    atomic_int running;   /* a td_group_run is in progress */
    uint64_t last_run_ns; /* the last td_group_run's duration, the caller's */

    const td__transport *tr;
    void *mpi;                  /* the MPI transport's state, or NULL */
    const td_group *mpi_parent; /* during td_group_shrink: the group shrunk */
    void *nccl;                 /* the NCCL transport's state, or NULL */
    td_group_config cfg;
};

/* The member whose host thread (or engine) is running; set by td_group_run. */
td__member *td__comm_current(void);
void td__comm_set_current(td__member *m);

/* Puts the group into its error state (once: later calls keep the first
 * reason) and returns TD_ERR_DEVICE_LOST with the reason as the message.
 * rank: the member at fault, or -1. */
td_status td__group_fail(td_group *g, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* TD_ERR_DEVICE_LOST with the group's failure reason as the message. */
td_status td__group_lost(td_group *g);

/* Whether m has been inside one collective for longer than its group's
 * timeout and a second: its peers' own waits give up within the timeout, so
 * a member still in a collective then (alone in its group, or hung for
 * good) is not coming back. */
int td__member_stuck(td__member *m, uint64_t now_ns);
/* Fails the group (unless it already failed) naming stuck member m and the
 * collective it is in; returns TD_ERR_DEVICE_LOST. */
td_status td__member_give_up(td__member *m);

/* The asynchronous engine (collectives.c): waits until every collective the
 * member started has finished (TD_ERR_DEVICE_LOST when the engine is stuck
 * in one: td_group_destroy then keeps the member); stops the engine thread. */
td_status td__engine_drain(td__member *m);
void td__engine_stop(td__member *m);

/* Fault injection: counts the collective and returns TD_OK, or fails as the
 * fault says (a hanging fault waits until the group has failed). */
td_status td__fault_check(td__member *m, td_collective_kind kind);
/* The plan of `text` (TANDEM_FAULT's syntax; NULL or "": none) for a new
 * group of devs, before its members exist. */
td_status td__fault_parse(td_group *g, const char *text, td_device *const *devs, size_t n);
/* Points every member of g at its device's counters (after the members exist). */
void td__fault_attach(td_group *g);
/* Gives `to`, shrunk from `from`, `from`'s plan: a device's collectives count
 * across both, and an item that fired does not fire again. */
void td__fault_share(td_group *from, td_group *to);
void td__fault_release(td_group *g);

/* The diagnostic record. */
void td__record_arrive(td__member *m, const td__op *op);
void td__record_done(td__member *m, const td__op *op, td_status st);
/* Members (local) that have not arrived at collective `seq`, as "cpu:1 (rank 1)". */
void td__record_missing(td_group *g, uint64_t seq, char *buf, size_t n);

/* Local transport: runs op among this process's members. */
td_status td__local_run(td__member *m, const td__op *op);
/* The pieces the MPI transport composes with (root is a local index here). */
td_status td__local_reduce(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                           td_reduce_op op, int root_local, int divide_by);
td_status td__local_bcast(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                          int root_local);
/* Each member's `out` (NULL: none) gets count elements from the root's `in`
 * at element offset local * stride: a scatter (stride = count) or a copy to
 * everyone (stride 0) from host memory the root owns. */
td_status td__local_scatter(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                            int root_local, size_t stride);
/* The root's `out` gets every member's `in` (count each) in local order. */
td_status td__local_gather(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                           int root_local);
/* A barrier among the local members. */
td_status td__local_barrier(td__member *m);

/* Waits with spinning, then yielding, then sleeping, until *p >= want; gives
 * up when the group fails or after the timeout (naming `waiting_for`, a local
 * index, or -1 for "members that have not arrived at op seq"). */
td_status td__comm_wait(td__member *m, atomic_uint_least64_t *p, uint64_t want, int waiting_for,
                        uint64_t seq);

/* Element-wise kernels over host memory. */
void td__reduce2(void *dst, const void *a, const void *b, size_t n, td_dtype dt, td_reduce_op op);
void td__scale(void *x, size_t n, td_dtype dt, double divisor);
/* memcpy with non-temporal stores where that pays (large, aligned); returns
 * 1 when it used them, and then td__stream_fence() must come before anyone
 * is told the data is there (a release store does not order them). */
int td__stream_copy(void *dst, const void *src, size_t n);
void td__stream_fence(void);
/* outs[k] = a op b for k < nout in one pass with non-temporal stores; 0 when
 * it cannot (then nothing was written). Needs td__stream_fence() after. */
int td__reduce2_stream(void *const *outs, int nout, const void *a, const void *b, size_t n,
                       td_dtype dt, td_reduce_op op);

/* Transports ------------------------------------------------------------------
 *
 * How the members of a group combine: one table per transport, each in its
 * folder (local/, mpi/, nccl/); transports.c lists those built in. Hooks
 * that are NULL do nothing. */
struct td__transport {
    const char *name; /* as td_group_transport says it */
    /* A group may have members in other processes (g->size > g->nlocal),
     * and none in this one after a shrink. */
    int spans_processes;
    /* Works on device memory itself: no staging through host memory. */
    int device_memory;
    /* Before the members are set up: joins the other processes, sets
     * g->size and g->rank0. */
    td_status (*span)(td_group *g);
    /* After they are: connects them (NCCL's communicators). */
    td_status (*connect)(td_group *g);
    void (*release)(td_group *g);
    td_status (*run)(td__member *m, const td__op *o);
    /* Agrees across processes which global ranks failed (OR of masks). */
    td_status (*agree_failed)(td_group *g, unsigned char *failed);
    /* The group just failed here (any thread): tell the other processes
     * that can be told without a collective. */
    void (*failed)(td_group *g);
    /* This process's index among the job's (0 when alone). */
    int (*process)(const td_group *g);
    /* td__group_clock_sync and td__group_gather_text (comm/process.h). */
    td_status (*clock_sync)(td_group *g, int64_t *offset_ns, uint64_t *base_ns);
    td_status (*gather_text)(td_group *g, const char *text, size_t n, char **all, size_t *all_n);
};

extern const td__transport td__transport_local;
/* The transport `kind` names for the devs (TD_TRANSPORT_AUTO: NCCL for two
 * or more devices it can serve, else local); an error naming what is
 * missing when this build lacks it or the devices cannot use it. */
td_status td__transport_choose(td_transport kind, td_device *const *devs, size_t n,
                               const td__transport **out);

/* Whether the MPI transport all-reduces g through shared memory (tests). */
int td__mpi_shared_memory(const td_group *g);

#endif
