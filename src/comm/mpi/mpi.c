/* The MPI transport: members in several processes started by mpirun.
 *
 * Hierarchical: inside a process the members combine through the local
 * transport (shared memory, far faster than MPI between processes on one
 * machine), then one member per process, the leader (local member 0),
 * combines across processes, and the result is spread locally again.
 * Between processes on one machine the leaders all-reduce through a segment
 * they all map (shm.c), which beats Open MPI at every size. Otherwise they
 * use MPI's own collectives: Open MPI picks among recursive doubling, ring
 * and Rabenseifner per size and per network (InfiniBand or TCP), which no
 * fixed algorithm of ours would match. They are started nonblocking
 * (MPI_Iallreduce and friends) and polled with MPI_Test, so that a process
 * that never arrives costs a timeout, not a hang.
 *
 * Threads: only the leader's thread (its host thread, or its engine for
 * asynchronous collectives) and the thread that creates, shrinks and destroys
 * groups call MPI, never at once, so MPI_THREAD_SERIALIZED suffices. tandem
 * initialises MPI when nobody did (and finalises it at exit); an application
 * that initialised MPI itself must have asked for MPI_THREAD_SERIALIZED. */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"
#include "comm/mpi/shm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/watchdog.h"

typedef struct mpi_state {
    MPI_Comm comm; /* the data collectives */
    MPI_Comm ctl;  /* agreement on failures: never left with a request hanging */
    int process, nprocs;
    int world_rank;
    int *counts;  /* members per process */
    int *offsets; /* global rank of each process's first member */
    int counted;  /* counted in live_groups */
    td__shm *shm; /* all-reduces through shared memory: NULL across machines */
    char *hosts;  /* (nprocs, HOST_NAME) each process's host name, for messages */
} mpi_state;

#define HOST_NAME 64

static int tandem_owns_mpi;
static atomic_int live_groups;

void td_comm_mpi_finalize(void) {
    int init = 0, fin = 0;
    if (!tandem_owns_mpi || atomic_load(&live_groups) > 0)
        return;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Finalize();
}

void td_comm_mpi_abort(int code) {
    int init = 0, fin = 0, processes = 1, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return;
    MPI_Comm_size(MPI_COMM_WORLD, &processes);
    if (processes < 2)
        return;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    TD_LOG_ERROR("process %d failed: ending all %d processes of this MPI job", rank, processes);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void finalize_at_exit(void) {
    td_comm_mpi_finalize();
}

static td_status mpi_error(int rc, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return td__error(TD_ERR_DEVICE, "%s failed: %s", call, text);
}

#define MPI_TRY(call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS) {                                                                  \
            st = mpi_error(rc_, #call);                                                            \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static td_status ensure_mpi(void) {
    int init = 0, fin = 0, provided = 0;
    MPI_Finalized(&fin);
    if (fin)
        return td__error(TD_ERR_UNSUPPORTED, "the mpi transport: MPI was already finalised");
    MPI_Initialized(&init);
    if (!init) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return td__error(TD_ERR_DEVICE, "MPI_Init_thread failed (started through mpirun?)");
        tandem_owns_mpi = 1;
        atexit(finalize_at_exit);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return td__error(TD_ERR_UNSUPPORTED,
                         "the mpi transport needs MPI_THREAD_SERIALIZED (MPI gave level %d): "
                         "initialise MPI with MPI_Init_thread or let tandem do it",
                         provided);
    return TD_OK;
}

int td__mpi_shared_memory(const td_group *g) {
    const mpi_state *s = g->mpi;
    return s && s->shm;
}

static int process_index(const td_group *g) {
    const mpi_state *s = g->mpi;
    return s ? s->world_rank : 0;
}

static td_status join_group(td_group *g) {
    mpi_state *s = NULL;
    const td_group *parent = g->mpi_parent;
    MPI_Comm base;
    td_status st;
    if ((st = ensure_mpi()) != TD_OK)
        return st;
    s = td__calloc(sizeof *s, "the MPI transport");
    if (!s)
        return TD_ERR_OUT_OF_MEMORY;
    s->comm = s->ctl = MPI_COMM_NULL;
    g->mpi = s;
    MPI_Comm_rank(MPI_COMM_WORLD, &s->world_rank);
    base = parent ? ((const mpi_state *)parent->mpi)->ctl : MPI_COMM_WORLD;
    /* Processes with no member here (after a shrink) leave the group. */
    MPI_TRY(MPI_Comm_split(base, g->nlocal > 0 ? 0 : MPI_UNDEFINED, s->world_rank, &s->comm));
    if (s->comm == MPI_COMM_NULL)
        return TD_OK;
    MPI_TRY(MPI_Comm_dup(s->comm, &s->ctl));
    MPI_Comm_rank(s->comm, &s->process);
    MPI_Comm_size(s->comm, &s->nprocs);
    s->counts = td__calloc(sizeof *s->counts * (size_t)s->nprocs, "MPI counts");
    s->offsets = td__calloc(sizeof *s->offsets * (size_t)s->nprocs, "MPI offsets");
    s->hosts = td__calloc((size_t)s->nprocs * HOST_NAME, "MPI host names");
    if (!s->counts || !s->offsets || !s->hosts) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    MPI_TRY(MPI_Allgather(&g->nlocal, 1, MPI_INT, s->counts, 1, MPI_INT, s->comm));
    g->size = 0;
    for (int p = 0; p < s->nprocs; p++) {
        s->offsets[p] = g->size;
        g->size += s->counts[p];
    }
    g->rank0 = s->offsets[s->process];
    {
        char mine[HOST_NAME] = "", name[MPI_MAX_PROCESSOR_NAME] = "";
        int len = 0;
        MPI_Get_processor_name(name, &len);
        snprintf(mine, sizeof mine, "%s", name);
        MPI_TRY(MPI_Allgather(mine, HOST_NAME, MPI_CHAR, s->hosts, HOST_NAME, MPI_CHAR, s->comm));
    }
    TD_TRY(td__shm_open(s->comm, s->process, s->nprocs, &s->shm));
    atomic_fetch_add(&live_groups, 1);
    s->counted = 1;
    return TD_OK;
fail:
    return st;
}

/* Starting MPI and making the group's communicators wait for every process
 * and have no timeout: a watchdog gives them the group's, but at least
 * STARTUP_MIN_MS, as MPI's start-up alone can take seconds on a busy
 * machine. */
#define STARTUP_MIN_MS 10000

static td_status group_init(td_group *g) {
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    td__watchdog *w =
        td__watchdog_arm(g->timeout_ms > STARTUP_MIN_MS ? g->timeout_ms : STARTUP_MIN_MS,
                         "MPI process %s: starting MPI and joining a group of "
                         "processes",
                         rank ? rank : "?");
    td_status st = join_group(g);
    td__watchdog_disarm(w);
    return st;
}

static void group_deinit(td_group *g) {
    mpi_state *s = g->mpi;
    int fin = 0;
    if (!s)
        return;
    MPI_Finalized(&fin);
    if (!fin && s->ctl != MPI_COMM_NULL)
        MPI_Comm_free(&s->ctl);
    if (!fin && s->comm != MPI_COMM_NULL)
        MPI_Comm_free(&s->comm);
    if (s->counted)
        atomic_fetch_sub(&live_groups, 1);
    td__shm_close(s->shm);
    free(s->hosts);
    free(s->counts);
    free(s->offsets);
    free(s);
    g->mpi = NULL;
}

static td_status agree_failed(td_group *g, unsigned char *failed) {
    mpi_state *s = g->mpi;
    int rc;
    if (!s || s->comm == MPI_COMM_NULL)
        return TD_OK;
    rc = MPI_Allreduce(MPI_IN_PLACE, failed, g->size, MPI_UNSIGNED_CHAR, MPI_MAX, s->ctl);
    return rc == MPI_SUCCESS ? TD_OK : mpi_error(rc, "MPI_Allreduce (agreeing on failed members)");
}

/* Naming the process a collective waits for. A nonblocking collective does
 * not say who is missing, so a leader that has waited half the timeout tells
 * every other process "I am here, in collective #seq" (a word on the control
 * communicator, tagged by seq) and listens for theirs. The processes still
 * running wait in the same collective and say so too; one that died,
 * stalled or lost its link does not. At the timeout, whoever has not spoken
 * is named. Left-over requests are cancelled (receives) or freed (sends):
 * the word sent lives in static storage. */
#define PROBE_TAG  0x4000 /* + seq % PROBE_TAGS: an earlier collective's word does not match */
#define PROBE_TAGS 4096

typedef struct probe {
    MPI_Request *rq; /* (nprocs, 2): send to p, receive from p */
    int *heard;      /* (nprocs) */
} probe;

static void probe_start(const mpi_state *s, probe *pr, uint64_t seq) {
    static const int here = 1;
    const int tag = PROBE_TAG + (int)(seq % PROBE_TAGS);
    pr->rq = calloc((size_t)s->nprocs * 2, sizeof *pr->rq);
    pr->heard = calloc((size_t)s->nprocs, sizeof *pr->heard);
    if (!pr->rq || !pr->heard)
        return;
    for (int p = 0; p < s->nprocs; p++) {
        pr->rq[2 * p] = pr->rq[2 * p + 1] = MPI_REQUEST_NULL;
        if (p == s->process)
            continue;
        MPI_Isend(&here, 1, MPI_INT, p, tag, s->ctl, &pr->rq[2 * p]);
        MPI_Irecv(&pr->heard[p], 1, MPI_INT, p, tag, s->ctl, &pr->rq[2 * p + 1]);
    }
}

/* Writes "MPI process P (on HOST), ..." for those not heard from into who
 * ("" when all were: one is late, not gone). */
static void probe_absent(const mpi_state *s, probe *pr, char *who, size_t n) {
    size_t used = 0;
    who[0] = '\0';
    if (!pr->rq || !pr->heard)
        return;
    for (int p = 0; p < s->nprocs; p++) {
        int done = 0;
        if (pr->rq[2 * p + 1] != MPI_REQUEST_NULL)
            MPI_Test(&pr->rq[2 * p + 1], &done, MPI_STATUS_IGNORE);
        if (p == s->process || pr->heard[p] || used >= n)
            continue;
        used += (size_t)snprintf(who + used, n - used, "%sMPI process %d (on %s)", used ? ", " : "",
                                 p, s->hosts + (size_t)p * HOST_NAME);
    }
}

static void probe_end(const mpi_state *s, probe *pr) {
    for (int p = 0; pr->rq && p < 2 * s->nprocs; p++) {
        if (pr->rq[p] == MPI_REQUEST_NULL)
            continue;
        if (p % 2) { /* a cancelled receive completes at once: heard is freed below */
            MPI_Cancel(&pr->rq[p]);
            MPI_Wait(&pr->rq[p], MPI_STATUS_IGNORE);
        } else {
            MPI_Request_free(&pr->rq[p]);
        }
    }
    free(pr->rq);
    free(pr->heard);
}

/* Polls an MPI request until it completes, the group fails, or the timeout. */
static td_status mpi_wait(td__member *m, MPI_Request *req, const td__op *o) {
    td_group *g = m->g;
    const mpi_state *s = g->mpi;
    uint64_t start = td_clock_ns(), limit = (uint64_t)g->timeout_ms * 1000000u;
    probe pr = {NULL, NULL};
    int probing = 0;
    td_status st = TD_OK;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        uint64_t waited = td_clock_ns() - start;
        if (rc != MPI_SUCCESS) {
            st = td__group_fail(g, -1, "collective #%llu: %s", (unsigned long long)o->seq,
                                (mpi_error(rc, "MPI_Test"), td_last_error()));
            break;
        }
        if (done)
            break;
        if (atomic_load_explicit(&g->aborted, memory_order_acquire)) {
            st = td__group_lost(g);
            break;
        }
        if (!probing && waited > limit / 2) {
            probe_start(s, &pr, o->seq);
            probing = 1;
        }
        if (waited > limit) {
            char who[512], rec[4096];
            probe_absent(s, &pr, who, sizeof who);
            td__group_fail(g, -1, "collective #%llu (%s): timed out after %d ms in MPI: %s%s",
                           (unsigned long long)o->seq, td_collective_name(o->kind), g->timeout_ms,
                           who[0] ? who : "another process never arrived",
                           who[0] ? " never arrived, nor said it waits (died, stalled or cut off)"
                                  : " (every process said it waits: one is late)");
            TD_LOG_ERROR("%s\n%s", td_last_error(), td_group_record(g, rec, sizeof rec));
            st = td__group_lost(g);
            break;
        }
        /* MPI progresses only inside MPI_Test: poll without pause for 2 ms,
         * then yield (processes may outnumber cores), then sleep a little. */
        if (waited > 2000000u) {
            if (waited < 100000000u) {
                sched_yield();
            } else {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
    }
    if (probing)
        probe_end(s, &pr);
    return st;
}

static MPI_Datatype mpi_type(td_dtype dt) {
    return dt == TD_F64 ? MPI_DOUBLE : MPI_FLOAT;
}

static MPI_Op mpi_op(td_reduce_op op) {
    switch (op) {
    case TD_REDUCE_MAX: return MPI_MAX;
    case TD_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* The local part reduces with the op itself, except that a mean is a sum
 * divided once at the end. */
static td_reduce_op local_op(td_reduce_op op) {
    return op == TD_REDUCE_MEAN ? TD_REDUCE_SUM : op;
}

/* An MPI call failed: the group fails, naming the collective. */
static td_status mpi_collective_failed(td__member *m, const td__op *o, int rc) {
    mpi_error(rc, "an MPI collective");
    return td__group_fail(m->g, m->rank, "collective #%llu: %s", (unsigned long long)o->seq,
                          td_last_error());
}

#define MAX_PIECE ((size_t)1 << 30) /* MPI counts are ints */

/* A process leader's all-reduce, broadcast or reduce of o->count elements
 * of buf across processes, in pieces MPI's int counts can take; an
 * all-reduce reads from in when it is not buf. owner is the process that
 * sends the broadcast or receives the reduction. */
static td_status mpi_pieces(td__member *m, const td__op *o, const void *in, void *buf, int owner) {
    td_status st = TD_OK;
    mpi_state *s = m->g->mpi;
    const size_t es = td_dtype_size(o->dtype);
    MPI_Datatype type = mpi_type(o->dtype);
    for (size_t done = 0; done < o->count; done += MAX_PIECE) {
        int n = (int)(o->count - done < MAX_PIECE ? o->count - done : MAX_PIECE), rc;
        char *p = (char *)buf + done * es;
        MPI_Request req;
        if (o->kind == TD_COLL_BROADCAST)
            rc = MPI_Ibcast(p, n, type, owner, s->comm, &req);
        else if (o->kind == TD_COLL_REDUCE)
            rc = MPI_Ireduce(owner == s->process ? MPI_IN_PLACE : p, p, n, type, mpi_op(o->op),
                             owner, s->comm, &req);
        else {
            /* Always in place: Open MPI 4.1's libnbc picks its algorithm
             * per process, by whether that process passed MPI_IN_PLACE
             * (binomial if so, Rabenseifner if not, from 4 processes and
             * 64 KiB), so processes that differ there exchange mismatched
             * messages (MPI_ERR_TRUNCATE). A process with one device
             * reduces out of place, one with several in place. */
            if (in != buf)
                memcpy(p, (const char *)in + done * es, (size_t)n * es);
            rc = MPI_Iallreduce(MPI_IN_PLACE, p, n, type, mpi_op(o->op), s->comm, &req);
        }
        if (rc != MPI_SUCCESS)
            return mpi_collective_failed(m, o, rc);
        TD_TRY(mpi_wait(m, &req, o));
    }
fail:
    return st;
}

/* The process owning rank: ranks are numbered process by process. */
static int owner_of(const mpi_state *s, int rank) {
    int owner = 0;
    while (owner + 1 < s->nprocs && s->offsets[owner + 1] <= rank)
        owner++;
    return owner;
}

/* Reduce-scatter and all-gather hand MPI each process's count (int, checked
 * beforehand) and offset. */
static td_status mpi_counts(const td__op *o, const mpi_state *s, int **counts, int **displs) {
    *counts = malloc(sizeof **counts * (size_t)s->nprocs);
    *displs = malloc(sizeof **displs * (size_t)s->nprocs);
    if (!*counts || !*displs) {
        free(*counts);
        free(*displs);
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory in an MPI %s",
                         td_collective_name(o->kind));
    }
    for (int p = 0; p < s->nprocs; p++) {
        (*counts)[p] = s->counts[p] * (int)o->count;
        (*displs)[p] = s->offsets[p] * (int)o->count;
    }
    return TD_OK;
}

/* The leader's all-reduce across processes: through shared memory on one
 * machine, else MPI. */
static td_status across_processes(td__member *m, const td__op *o, const void *in) {
    mpi_state *s = m->g->mpi;
    return s->shm ? td__shm_allreduce(s->shm, m, o, in, o->out) : mpi_pieces(m, o, in, o->out, 0);
}

/* Reduces within the process to its leader, across processes, and hands the
 * result on within the process. */
static td_status mpi_allreduce(td__member *m, const td__op *o) {
    td_status st = TD_OK;
    td_group *g = m->g;
    const int leader = m->local == 0;
    if (g->nlocal == 1) /* alone in this process: straight across, out of place as asked */
        TD_TRY(across_processes(m, o, o->in));
    else {
        TD_TRY(td__local_reduce(m, o->in, leader ? o->out : NULL, o->count, o->dtype,
                                local_op(o->op), 0, 1));
        if (leader)
            TD_TRY(across_processes(m, o, o->out));
    }
    if (leader && o->op == TD_REDUCE_MEAN)
        td__scale(o->out, o->count, o->dtype, g->size);
    if (g->nlocal > 1)
        TD_TRY(td__local_bcast(m, o->out, o->out, o->count, o->dtype, 0));
fail:
    return st;
}

static td_status mpi_broadcast(td__member *m, const td__op *o) {
    td_status st = TD_OK;
    td_group *g = m->g;
    mpi_state *s = g->mpi;
    int owner = owner_of(s, o->root);
    if (owner == s->process)
        TD_TRY(td__local_bcast(m, o->in, o->out, o->count, o->dtype, o->root - g->rank0));
    if (m->local == 0)
        TD_TRY(mpi_pieces(m, o, o->out, o->out, owner));
    if (owner != s->process)
        TD_TRY(td__local_bcast(m, o->out, o->out, o->count, o->dtype, 0));
fail:
    return st;
}

/* tmp: the leader's buffer of the process's partial sums (NULL elsewhere). */
static td_status mpi_reduce(td__member *m, const td__op *o, void *tmp) {
    td_status st = TD_OK;
    td_group *g = m->g;
    mpi_state *s = g->mpi;
    int owner = owner_of(s, o->root);
    TD_TRY(td__local_reduce(m, o->in, tmp, o->count, o->dtype, local_op(o->op), 0, 1));
    if (m->local == 0) {
        TD_TRY(mpi_pieces(m, o, tmp, tmp, owner));
        if (o->op == TD_REDUCE_MEAN && owner == s->process)
            td__scale(tmp, o->count, o->dtype, g->size);
    }
    if (owner == s->process)
        TD_TRY(td__local_scatter(m, tmp, m->rank == o->root ? o->out : NULL, o->count, o->dtype, 0,
                                 0));
fail:
    return st;
}

static td_status mpi_allgather(td__member *m, const td__op *o) {
    td_group *g = m->g;
    mpi_state *s = g->mpi;
    const size_t es = td_dtype_size(o->dtype), total = o->count * (size_t)g->size;
    const int leader = m->local == 0;
    int *counts, *displs, rc;
    MPI_Request req;
    td_status st = TD_OK;
    TD_TRY(td__local_gather(m, o->in,
                            leader ? (char *)o->out + (size_t)g->rank0 * o->count * es : NULL,
                            o->count, o->dtype, 0));
    if (leader) {
        TD_TRY(mpi_counts(o, s, &counts, &displs));
        rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, o->out, counts, displs,
                             mpi_type(o->dtype), s->comm, &req);
        st = rc == MPI_SUCCESS ? mpi_wait(m, &req, o) : mpi_collective_failed(m, o, rc);
        free(counts);
        free(displs);
        TD_TRY(st);
    }
    st = td__local_bcast(m, o->out, o->out, total, o->dtype, 0);
fail:
    return st;
}

/* tmp: the leader's buffer of the process's partial sums (NULL elsewhere). */
static td_status mpi_reduce_scatter(td__member *m, const td__op *o, void *tmp) {
    td_group *g = m->g;
    mpi_state *s = g->mpi;
    const size_t total = o->count * (size_t)g->size;
    int *counts, *displs, rc;
    MPI_Request req;
    td_status st = TD_OK;
    TD_TRY(td__local_reduce(m, o->in, tmp, total, o->dtype, local_op(o->op), 0, 1));
    if (m->local == 0) {
        TD_TRY(mpi_counts(o, s, &counts, &displs));
        /* In place: the process's part lands at the start of tmp. */
        rc = MPI_Ireduce_scatter(MPI_IN_PLACE, tmp, counts, mpi_type(o->dtype), mpi_op(o->op),
                                 s->comm, &req);
        st = rc == MPI_SUCCESS ? mpi_wait(m, &req, o) : mpi_collective_failed(m, o, rc);
        free(counts);
        free(displs);
        TD_TRY(st);
        if (o->op == TD_REDUCE_MEAN)
            td__scale(tmp, (size_t)g->nlocal * o->count, o->dtype, g->size);
    }
    st = td__local_scatter(m, tmp, o->out, o->count, o->dtype, 0, o->count);
fail:
    return st;
}

static td_status run(td__member *m, const td__op *o) {
    td_group *g = m->g;
    const mpi_state *s = g->mpi;
    const int whole = o->kind == TD_COLL_ALLGATHER || o->kind == TD_COLL_REDUCE_SCATTER;
    const size_t n = o->count * (whole ? (size_t)g->size : 1);
    void *tmp = NULL;
    td_status st;

    if (s->nprocs == 1)
        return td__local_run(m, o);
    /* Every member refuses, so none waits for a leader that did. */
    if (whole && n > INT_MAX)
        return td__error(TD_ERR_UNSUPPORTED, "%s of %zu elements: MPI counts are ints",
                         td_collective_name(o->kind), n);
    switch (o->kind) {
    case TD_COLL_ALLREDUCE: return mpi_allreduce(m, o);
    case TD_COLL_BROADCAST: return mpi_broadcast(m, o);
    case TD_COLL_ALLGATHER: return mpi_allgather(m, o);
    case TD_COLL_REDUCE:
    case TD_COLL_REDUCE_SCATTER:
        if (m->local == 0 &&
            !(tmp = td__aligned_alloc(n * td_dtype_size(o->dtype), "an MPI reduction")))
            return TD_ERR_OUT_OF_MEMORY;
        st = o->kind == TD_COLL_REDUCE ? mpi_reduce(m, o, tmp) : mpi_reduce_scatter(m, o, tmp);
        free(tmp);
        return st;
    }
    return td__error(TD_ERR_INVALID_ARG, "collective kind %d", (int)o->kind);
}

/* Per process, for the trace writer (comm/process.h) ------------------------- */

#define CLOCK_ROUNDS 64 /* more tries at a quick round trip on a busy machine */
#define CLOCK_TAG    0x7d01

/* Each other process asks process 0 for its clock CLOCK_ROUNDS times and
 * keeps the answer of the quickest round trip, taking it to have been read
 * half way through: Cristian's method, within half that trip. On the control
 * communicator, from the thread that creates groups, with no collective in
 * flight. */
static td_status clock_sync(td_group *g, int64_t *offset_ns, uint64_t *base_ns) {
    mpi_state *s = g->mpi;
    uint64_t base = td_clock_ns(), best = UINT64_MAX;
    int64_t offset = 0;
    td_status st = TD_OK;
    *offset_ns = 0;
    *base_ns = base;
    if (!s || s->comm == MPI_COMM_NULL || s->nprocs == 1)
        return TD_OK;
    if (s->process == 0) {
        for (int p = 1; p < s->nprocs; p++)
            for (int i = 0; i < CLOCK_ROUNDS; i++) {
                uint64_t now;
                MPI_TRY(MPI_Recv(NULL, 0, MPI_BYTE, p, CLOCK_TAG, s->ctl, MPI_STATUS_IGNORE));
                now = td_clock_ns();
                MPI_TRY(MPI_Send(&now, 1, MPI_UINT64_T, p, CLOCK_TAG, s->ctl));
            }
    } else {
        for (int i = 0; i < CLOCK_ROUNDS; i++) {
            uint64_t there, t1 = td_clock_ns(), t2;
            MPI_TRY(MPI_Send(NULL, 0, MPI_BYTE, 0, CLOCK_TAG, s->ctl));
            MPI_TRY(MPI_Recv(&there, 1, MPI_UINT64_T, 0, CLOCK_TAG, s->ctl, MPI_STATUS_IGNORE));
            t2 = td_clock_ns();
            if (t2 - t1 < best) {
                best = t2 - t1;
                offset = (int64_t)there - (int64_t)(t1 + (t2 - t1) / 2);
            }
        }
    }
    base = td_clock_ns();
    MPI_TRY(MPI_Bcast(&base, 1, MPI_UINT64_T, 0, s->ctl));
    *offset_ns = offset;
    *base_ns = base;
    return TD_OK;
fail:
    return st;
}

static td_status gather_text(td_group *g, const char *text, size_t n, char **all, size_t *all_n) {
    mpi_state *s = g->mpi;
    long long mine = (long long)n, total = 0, *sizes = NULL;
    int *counts = NULL, *displs = NULL, fits = 1;
    char *buf = NULL;
    td_status st = TD_OK;
    *all = NULL;
    *all_n = 0;
    if (!s || s->comm == MPI_COMM_NULL)
        return TD_OK;
    if (s->process == 0) {
        sizes = td__calloc(sizeof *sizes * (size_t)s->nprocs, "a trace's sizes");
        counts = td__calloc(sizeof *counts * (size_t)s->nprocs, "a trace's sizes");
        displs = td__calloc(sizeof *displs * (size_t)s->nprocs, "a trace's sizes");
        fits = sizes && counts && displs;
    }
    /* Everyone takes part in each call, so that none waits on a process
     * that gave up. */
    MPI_TRY(MPI_Gather(&mine, 1, MPI_LONG_LONG, sizes, 1, MPI_LONG_LONG, 0, s->ctl));
    for (int p = 0; fits && s->process == 0 && p < s->nprocs; p++) {
        displs[p] = (int)total;
        counts[p] = (int)sizes[p];
        total += sizes[p];
        fits = total < INT_MAX;
    }
    if (fits && s->process == 0)
        fits = (buf = td__calloc((size_t)total + 1, "a trace's text")) != NULL;
    MPI_TRY(MPI_Bcast(&fits, 1, MPI_INT, 0, s->ctl));
    if (!fits) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "the trace of %d processes: %lld bytes at process 0",
                       s->nprocs, total);
        goto fail;
    }
    MPI_TRY(MPI_Gatherv(text, (int)mine, MPI_CHAR, buf, counts, displs, MPI_CHAR, 0, s->ctl));
    if (s->process == 0) {
        *all = buf;
        *all_n = (size_t)total;
        buf = NULL;
    }
fail:
    free(buf);
    free(sizes);
    free(counts);
    free(displs);
    return st;
}

static void group_failed(td_group *g) {
    mpi_state *s = g->mpi;
    if (s && s->shm)
        td__shm_failed(s->shm);
}

const td__transport td__transport_mpi = {
    .name = "mpi",
    .spans_processes = 1,
    .span = group_init,
    .release = group_deinit,
    .run = run,
    .agree_failed = agree_failed,
    .failed = group_failed,
    .process = process_index,
    .clock_sync = clock_sync,
    .gather_text = gather_text,
};
