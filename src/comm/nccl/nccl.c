/* The NCCL transport: groups of CUDA devices in one process, one NCCL rank
 * per member, each communicator created on the member's own host thread.
 * Collectives are queued on the device's own stream (so they follow the
 * kernels queued before them) and then waited for by polling the stream, so
 * that the group's timeout and failure state apply as on the other
 * transports: on a timeout the communicator is aborted (ncclCommAbort), never
 * waited for forever.
 *
 * Two logical devices on one GPU ({split=2}): NCCL refuses a communicator
 * with the same GPU twice ("Duplicate GPU detected"). Such a group uses the
 * local transport instead, staging each member's data through host memory
 * (see execute() in collectives.c). */
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda.h"
#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

typedef struct nccl_state {
    ncclUniqueId id;
    ncclComm_t *comms; /* per local member */
} nccl_state;

static td_status nccl_status(ncclResult_t r, const char *call, const td_device *dev) {
    if (r == ncclSuccess)
        return TD_OK;
    return td__error(r == ncclSystemError || r == ncclRemoteError ? TD_ERR_DEVICE_LOST
                                                                  : TD_ERR_DEVICE,
                     "%s: %s failed: %s", td_device_name(dev), call, ncclGetErrorString(r));
}

typedef struct init_args {
    td_group *g;
    int k;
} init_args;

static td_status init_task(td_device *dev, void *p) {
    init_args *a = p;
    nccl_state *s = a->g->nccl;
    return nccl_status(ncclCommInitRank(&s->comms[a->k], a->g->nlocal, s->id, a->k),
                       "ncclCommInitRank", dev);
}

static td_status destroy_task(td_device *dev, void *p) {
    ncclComm_t comm = p;
    return nccl_status(ncclCommDestroy(comm), "ncclCommDestroy", dev);
}

static td_status group_init(td_group *g) {
    nccl_state *s;
    init_args *args = NULL;
    td_event **evs = NULL;
    td_status st = TD_OK;
    for (int i = 0; i < g->nlocal; i++)
        for (int j = 0; j < i; j++) {
            int a = td__cuda_ordinal(g->members[i].dev), b = td__cuda_ordinal(g->members[j].dev);
            if (a == b) {
                /* NCCL refuses one GPU twice: the local transport over host
                 * staging serves such a group. */
                TD_LOG_INFO("%s and %s share GPU %d: NCCL refuses that, so this group uses the "
                            "local transport through host memory",
                            td_device_name(g->members[i].dev), td_device_name(g->members[j].dev),
                            a);
                g->tr = &td__transport_local;
                return TD_OK;
            }
        }
    s = td__calloc(sizeof *s, "the NCCL transport");
    if (!s)
        return TD_ERR_OUT_OF_MEMORY;
    g->nccl = s;
    s->comms = td__calloc(sizeof *s->comms * (size_t)g->nlocal, "NCCL communicators");
    args = td__calloc(sizeof *args * (size_t)g->nlocal, "NCCL set-up");
    evs = td__calloc(sizeof *evs * (size_t)g->nlocal, "NCCL set-up");
    if (!s->comms || !args || !evs) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto done;
    }
    if ((st = nccl_status(ncclGetUniqueId(&s->id), "ncclGetUniqueId", g->members[0].dev)) != TD_OK)
        goto done;
    /* Every rank must be inside ncclCommInitRank at once: one per host thread. */
    for (int k = 0; k < g->nlocal; k++) {
        args[k].g = g;
        args[k].k = k;
        if ((st = td_device_submit(g->members[k].dev, init_task, &args[k], &evs[k])) != TD_OK)
            break;
    }
    for (int k = 0; k < g->nlocal; k++) {
        td_status one;
        if (!evs[k])
            continue;
        one = td_event_wait(evs[k]);
        if (st == TD_OK)
            st = one;
        td_event_destroy(evs[k]);
    }
done:
    free(args);
    free(evs);
    return st;
}

static void group_deinit(td_group *g) {
    nccl_state *s = g->nccl;
    if (!s)
        return;
    for (int k = 0; s->comms && k < g->nlocal; k++)
        if (s->comms[k])
            td_device_run(g->members[k].dev, destroy_task, s->comms[k]);
    free(s->comms);
    free(s);
    g->nccl = NULL;
}

static ncclDataType_t nccl_type(td_dtype dt) {
    return dt == TD_F64 ? ncclFloat64 : ncclFloat32;
}

static ncclRedOp_t nccl_op(td_reduce_op op) {
    switch (op) {
    case TD_REDUCE_MEAN: return ncclAvg;
    case TD_REDUCE_MAX: return ncclMax;
    case TD_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* Polls the stream until the collective is done, NCCL reports an error, the
 * group fails, or the timeout passes (then the communicator is aborted). */
static td_status nccl_wait(td__member *m, ncclComm_t comm, const td__op *o) {
    td_group *g = m->g;
    uint64_t start = td_clock_ns(), limit = (uint64_t)g->timeout_ms * 1000000u;
    unsigned rounds = 0;
    for (;;) {
        ncclResult_t async = ncclSuccess;
        td_status done = td__cuda_stream_query(m->dev);
        if (done == TD_OK)
            return TD_OK;
        if (done != TD_IN_PROGRESS) {
            return td__group_fail(g, m->rank, "collective #%llu: %s", (unsigned long long)o->seq,
                                  td_last_error());
        }
        if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
            nccl_status(async, "an NCCL collective", m->dev);
            ncclCommAbort(comm);
            return td__group_fail(g, m->rank, "collective #%llu: %s", (unsigned long long)o->seq,
                                  td_last_error());
        }
        if (atomic_load_explicit(&g->aborted, memory_order_acquire)) {
            ncclCommAbort(comm);
            return td__group_lost(g);
        }
        if (td_clock_ns() - start > limit) {
            char rec[4096];
            td__group_fail(g, -1,
                           "collective #%llu (%s): timed out after %d ms on %s: a member never "
                           "arrived",
                           (unsigned long long)o->seq, td_collective_name(o->kind), g->timeout_ms,
                           td_device_name(m->dev));
            TD_LOG_ERROR("%s\n%s", td_last_error(), td_group_record(g, rec, sizeof rec));
            ncclCommAbort(comm);
            return td__group_lost(g);
        }
        if (++rounds > 1000) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static td_status run(td__member *m, const td__op *o) {
    nccl_state *s = m->g->nccl;
    cudaStream_t stream = td__cuda_stream(m->dev);
    ncclComm_t comm = s->comms[m->local];
    ncclResult_t r = ncclSuccess;
    const char *call = "";
    /* The engine thread runs asynchronous collectives: select the GPU there too. */
    TD_CHECK(td__cuda_select(m->dev));
    switch (o->kind) {
    case TD_COLL_ALLREDUCE:
        call = "ncclAllReduce";
        r = ncclAllReduce(o->in, o->out, o->count, nccl_type(o->dtype), nccl_op(o->op), comm,
                          stream);
        break;
    case TD_COLL_BROADCAST:
        call = "ncclBroadcast";
        r = ncclBroadcast(o->in, o->out, o->count, nccl_type(o->dtype), o->root, comm, stream);
        break;
    case TD_COLL_REDUCE:
        call = "ncclReduce";
        r = ncclReduce(o->in, o->out, o->count, nccl_type(o->dtype), nccl_op(o->op), o->root, comm,
                       stream);
        break;
    case TD_COLL_ALLGATHER:
        call = "ncclAllGather";
        r = ncclAllGather(o->in, o->out, o->count, nccl_type(o->dtype), comm, stream);
        break;
    case TD_COLL_REDUCE_SCATTER:
        call = "ncclReduceScatter";
        r = ncclReduceScatter(o->in, o->out, o->count, nccl_type(o->dtype), nccl_op(o->op), comm,
                              stream);
        break;
    }
    if (r != ncclSuccess) {
        nccl_status(r, call, m->dev);
        return td__group_fail(m->g, m->rank, "collective #%llu: %s", (unsigned long long)o->seq,
                              td_last_error());
    }
    return nccl_wait(m, comm, o);
}

const td__transport td__transport_nccl = {
    .name = "nccl",
    .device_memory = 1,
    .connect = group_init,
    .release = group_deinit,
    .run = run,
};
