/* The public collectives: checking the call, resolving buffers to pointers
 * (staging through host memory for devices the host cannot address), fault
 * injection and the record, dispatch to the transport, and the asynchronous
 * engine.
 *
 * Asynchronous collectives run on the member's engine: one helper thread per
 * member, started on first use, that runs the member's started collectives
 * in order, as a GPU's copy engine runs its queue beside the compute queue.
 * It touches only the buffers handed to it and its peers' comm memory, so the
 * rule that only a device's host thread drives the device still holds for
 * everything else. Sequence numbers are taken when a collective is issued;
 * a synchronous collective first waits for the member's outstanding ones, so
 * every member runs its collectives in issue order. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/fpmode.h"
#include "core/log.h"
#include "core/trace.h"

struct td_comm_request {
    td__member *m;
    td_collective c;
    uint64_t seq;
    atomic_int done;
    td_status status;
    char *message;
    uint64_t began_ns, ended_ns;  /* when it ran (td_clock_ns) */
    struct td_comm_request *next; /* in the engine's queue */
};

struct td__engine {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    td_comm_request *head, *tail;
    int stopping;
    /* The floating-point control word of the member's host thread, which
     * started the engine: its reductions then round and flush subnormals as
     * the device's own kernels do (core/fpmode.h). */
    uint64_t fp_control;
};

/* Checking ------------------------------------------------------------------ */

static int bad_range(const td_buffer *b, size_t off, size_t count, size_t es) {
    size_t size = td_buffer_size(b);
    if (count > SIZE_MAX / es)
        return 1;
    return off > size || count * es > size - off;
}

/* Elements of send and recv this member needs for c. */
static void extents(const td_group *g, const td__member *m, const td_collective *c, size_t *nsend,
                    size_t *nrecv) {
    *nsend = *nrecv = c->count;
    switch (c->kind) {
    case TD_COLL_ALLGATHER: *nrecv = c->count * (size_t)g->size; break;
    case TD_COLL_REDUCE_SCATTER: *nsend = c->count * (size_t)g->size; break;
    case TD_COLL_BROADCAST:
        if (m->rank != c->root)
            *nsend = 0;
        break;
    case TD_COLL_REDUCE:
        if (m->rank != c->root)
            *nrecv = 0;
        break;
    default: break;
    }
}

static td_status check_call(td_group *g, td__member *m, const td_collective *c, const char *what) {
    char msg[512];
    size_t nsend, nrecv, es;
    msg[0] = '\0';
    if ((unsigned)c->kind >= TD_COLL_KINDS)
        snprintf(msg, sizeof msg, "unknown collective kind %d", (int)c->kind);
    else if (c->dtype != TD_F32 && c->dtype != TD_F64)
        snprintf(msg, sizeof msg, "unknown dtype %d", (int)c->dtype);
    else if ((unsigned)c->op > TD_REDUCE_MIN)
        snprintf(msg, sizeof msg, "unknown reduce op %d", (int)c->op);
    else if ((c->kind == TD_COLL_BROADCAST || c->kind == TD_COLL_REDUCE) &&
             (c->root < 0 || c->root >= g->size))
        snprintf(msg, sizeof msg, "root %d is not a rank of the group of %d", c->root, g->size);
    else if (c->count > SIZE_MAX / 8 / (size_t)(g->size ? g->size : 1))
        snprintf(msg, sizeof msg, "count %zu is too large", c->count);
    if (!msg[0]) {
        es = td_dtype_size(c->dtype);
        extents(g, m, c, &nsend, &nrecv);
        if (nrecv && !c->recv)
            snprintf(msg, sizeof msg, "the receive buffer is NULL");
        else if (nsend && !c->send && c->kind == TD_COLL_REDUCE_SCATTER)
            snprintf(msg, sizeof msg, "the send buffer is NULL");
        else if (c->recv && td_buffer_device(c->recv) != m->dev)
            snprintf(msg, sizeof msg, "the receive buffer is on %s, not on the member's device",
                     td_device_name(td_buffer_device(c->recv)));
        else if (c->send && nsend && td_buffer_device(c->send) != m->dev)
            snprintf(msg, sizeof msg, "the send buffer is on %s, not on the member's device",
                     td_device_name(td_buffer_device(c->send)));
        else if (c->recv && nrecv && bad_range(c->recv, c->recv_offset, nrecv, es))
            snprintf(msg, sizeof msg,
                     "the receive buffer (%zu bytes) does not hold %zu %s at offset %zu",
                     td_buffer_size(c->recv), nrecv, td_dtype_name(c->dtype), c->recv_offset);
        else if (c->send && nsend && bad_range(c->send, c->send_offset, nsend, es))
            snprintf(msg, sizeof msg,
                     "the send buffer (%zu bytes) does not hold %zu %s at offset %zu",
                     td_buffer_size(c->send), nsend, td_dtype_name(c->dtype), c->send_offset);
    }
    if (!msg[0])
        return TD_OK;
    /* The peers would wait for this member: fail the group, then report. */
    td__group_fail(g, m->rank, "%s on %s (rank %d): %s", what, td_device_name(m->dev), m->rank,
                   msg);
    return td__error(TD_ERR_INVALID_ARG, "%s on %s (rank %d): %s", what, td_device_name(m->dev),
                     m->rank, msg);
}

static td_status find_member(td_group *g, const char *what, td__member **out) {
    td__member *m = td__comm_current();
    *out = NULL;
    if (!g)
        return td__error(TD_ERR_INVALID_ARG, "%s: group is NULL", what);
    if (!m || m->g != g)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: must be called inside td_group_run, by every member of the group",
                         what);
    *out = m;
    return TD_OK;
}

/* Execution ----------------------------------------------------------------- */

/* The pointers of c on this member: device pointers; for host-memory devices
 * these are host addresses. Missing send means in place. */
static void resolve(const td__member *m, const td_collective *c, const void **in, void **out) {
    const td_group *g = m->g;
    size_t es = td_dtype_size(c->dtype);
    *out = c->recv ? (char *)td__buffer_ptr(c->recv) + c->recv_offset : NULL;
    if (c->send)
        *in = (const char *)td__buffer_ptr(c->send) + c->send_offset;
    else if (c->kind == TD_COLL_ALLGATHER)
        *in = *out ? (char *)*out + (size_t)(m->rank) * c->count * es : NULL;
    else
        *in = *out;
    (void)g;
}

/* Runs c (already checked, seq assigned) on this member. */
static td_status run_collective(td__member *m, const td_collective *c, uint64_t seq,
                                td_comm_algorithm algo) {
    td_group *g = m->g;
    td__op o;
    const void *in;
    void *out;
    void *host_in = NULL, *host_out = NULL;
    size_t nsend, nrecv, es = td_dtype_size(c->dtype);
    td_status st;

    if ((st = td__fault_check(m, c->kind)) != TD_OK)
        return st;
    if (atomic_load_explicit(&g->aborted, memory_order_acquire))
        return td__group_lost(g);
    memset(&o, 0, sizeof o);
    o.kind = c->kind;
    o.count = c->count;
    o.dtype = c->dtype;
    o.op = c->op;
    o.root = c->root;
    o.seq = seq;
    o.algo = algo;
    td__record_arrive(m, &o);
    if (c->count == 0) {
        td__record_done(m, &o, TD_OK);
        return TD_OK;
    }
    resolve(m, c, &in, &out);
    extents(g, m, c, &nsend, &nrecv);
    if (!m->host_memory && !g->tr->device_memory) {
        /* The host cannot address this device's memory: stage through host
         * buffers (this is also the path when two logical devices share one
         * GPU, which NCCL refuses). The transport then works on host memory. */
        size_t insz = nsend * es, outsz = nrecv * es;
        host_out = outsz ? td__aligned_alloc(outsz, "staging a collective") : NULL;
        host_in = insz ? td__aligned_alloc(insz, "staging a collective") : NULL;
        if ((outsz && !host_out) || (insz && !host_in)) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if (insz) {
            const td_buffer *src = c->send ? c->send : c->recv;
            size_t off = c->send ? c->send_offset
                         : c->kind == TD_COLL_ALLGATHER
                             ? c->recv_offset + (size_t)m->rank * c->count * es
                             : c->recv_offset;
            if ((st = td_buffer_read(src, off, host_in, insz)) != TD_OK)
                goto done;
        }
        in = host_in;
        out = host_out;
        if (!c->send && c->kind != TD_COLL_ALLGATHER && host_out && insz == outsz) {
            memcpy(host_out, host_in, insz);
            in = host_out;
        }
    }
    o.in = in;
    o.out = out;
    st = g->tr->run(m, &o);
    if (st == TD_OK && host_out)
        st = td_buffer_write(c->recv, c->recv_offset, host_out, nrecv * es);
done:
    free(host_in);
    free(host_out);
    td__record_done(m, &o, st);
    return st;
}

/* run_collective, in view of whoever waits on the member (td__member_stuck). */
static td_status execute(td__member *m, const td_collective *c, uint64_t seq,
                         td_comm_algorithm algo) {
    td_status st;
    uint64_t tr = td__trace_begin();
    atomic_store(&m->busy_seq, seq);
    atomic_store(&m->busy_kind, (int)c->kind);
    atomic_store(&m->busy_since, td_clock_ns());
    st = run_collective(m, c, seq, algo);
    atomic_store(&m->busy_since, 0);
    /* Its span holds the wait for the slowest member as well: a collective
     * ends for everyone when the last one arrives. Bytes: the call's count. */
    td__trace_end(tr, TD__TRACE_COMM, td_collective_name(c->kind),
                  (int64_t)(c->count * td_dtype_size(c->dtype)));
    return st;
}

/* Runs a request's collective and publishes its outcome and when it ran. */
static void run_request(td__member *m, td_comm_request *r) {
    r->began_ns = td_clock_ns();
    r->status = execute(m, &r->c, r->seq, TD_ALGO_AUTO);
    r->ended_ns = td_clock_ns();
    r->message = r->status != TD_OK ? strdup(td_last_error()) : NULL;
    atomic_store_explicit(&r->done, 1, memory_order_release);
}

/* The engine ---------------------------------------------------------------- */

static void *engine_main(void *p) {
    td__member *m = p;
    td__engine *e = m->engine;
    td__comm_set_current(m);
    /* Its collectives overlap its device's compute: a track of their own. */
    td__trace_thread_name("%s comm", td_device_name(m->dev));
    td__fp_control_set(e->fp_control);
    for (;;) {
        td_comm_request *r;
        pthread_mutex_lock(&e->lock);
        while (!e->head && !e->stopping)
            pthread_cond_wait(&e->wake, &e->lock);
        r = e->head;
        if (!r) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        e->head = r->next;
        if (!e->head)
            e->tail = NULL;
        pthread_mutex_unlock(&e->lock);
        run_request(m, r);
        atomic_fetch_add_explicit(&m->async_done, 1, memory_order_release);
    }
    return NULL;
}

static td_status engine_start(td__member *m) {
    td__engine *e;
    if (m->engine)
        return TD_OK;
    e = td__calloc(sizeof *e, "a collective engine");
    if (!e)
        return TD_ERR_OUT_OF_MEMORY;
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    e->fp_control = td__fp_control_get();
    m->engine = e;
    if (pthread_create(&e->thread, NULL, engine_main, m) != 0) {
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->wake);
        free(e);
        m->engine = NULL;
        return td__error(TD_ERR_INTERNAL, "%s: cannot start its collective engine thread",
                         td_device_name(m->dev));
    }
    return TD_OK;
}

/* Waits with backoff for a flag another thread sets. */
static void backoff(unsigned *rounds) {
    (*rounds)++;
    if (*rounds < 64) {
        sched_yield();
    } else {
        struct timespec ts = {0, *rounds < 1024 ? 10000 : 200000};
        nanosleep(&ts, NULL);
    }
}

/* Whether whoever waits on m's engine should give up: checked now and then,
 * as reading the clock on every round would slow short waits. */
static int engine_stuck(td__member *m, unsigned rounds) {
    return rounds % 64 == 0 && td__member_stuck(m, td_clock_ns());
}

td_status td__engine_drain(td__member *m) {
    unsigned rounds = 0;
    while (atomic_load_explicit(&m->async_done, memory_order_acquire) !=
           atomic_load_explicit(&m->async_issued, memory_order_relaxed)) {
        backoff(&rounds);
        if (engine_stuck(m, rounds))
            return td__member_give_up(m);
    }
    return TD_OK;
}

void td__engine_stop(td__member *m) {
    td__engine *e = m->engine;
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    e->stopping = 1;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->wake);
    free(e);
    m->engine = NULL;
}

/* Public entry points ------------------------------------------------------- */

td_status td_collective_run(td_group *g, const td_collective *c) {
    td__member *m;
    td_status st;
    const char *what = c ? td_collective_name(c->kind) : "td_collective_run";
    if ((st = find_member(g, what, &m)) != TD_OK)
        return st;
    if (!c)
        return td__error(TD_ERR_INVALID_ARG, "td_collective_run: collective is NULL");
    if ((st = check_call(g, m, c, what)) != TD_OK)
        return st;
    TD_CHECK(td__engine_drain(m));
    return execute(m, c, ++m->seq, TD_ALGO_AUTO);
}

/* Runs c with a forced algorithm (calibration). */
td_status td__collective_run_algo(td_group *g, const td_collective *c, td_comm_algorithm algo);
td_status td__collective_run_algo(td_group *g, const td_collective *c, td_comm_algorithm algo) {
    td__member *m;
    td_status st;
    if ((st = find_member(g, "calibration", &m)) != TD_OK)
        return st;
    if ((st = check_call(g, m, c, "calibration")) != TD_OK)
        return st;
    TD_CHECK(td__engine_drain(m));
    return execute(m, c, ++m->seq, algo);
}

td_status td_collective_start(td_group *g, const td_collective *c, td_comm_request **req) {
    td__member *m;
    td_comm_request *r;
    td_status st;
    const char *what = c ? td_collective_name(c->kind) : "td_collective_start";
    if (!req)
        return td__error(TD_ERR_INVALID_ARG, "td_collective_start: req is NULL");
    *req = NULL;
    if ((st = find_member(g, what, &m)) != TD_OK)
        return st;
    if (!c)
        return td__error(TD_ERR_INVALID_ARG, "td_collective_start: collective is NULL");
    if ((st = check_call(g, m, c, what)) != TD_OK)
        return st;
    r = td__calloc(sizeof *r, "a collective request");
    if (!r)
        return TD_ERR_OUT_OF_MEMORY;
    r->m = m;
    r->c = *c;
    atomic_init(&r->done, 0);
    if (g->size == 1 || (!m->host_memory && !g->tr->device_memory)) {
        /* Alone, there is no one to wait for: the engine's hand-off would be
         * the whole cost. Staging reads the device through its host thread,
         * which may be waiting on this request. Either way: run it now. */
        if ((st = td__engine_drain(m)) != TD_OK) {
            free(r);
            return st;
        }
        r->seq = ++m->seq;
        run_request(m, r);
        *req = r;
        return TD_OK;
    }
    if ((st = engine_start(m)) != TD_OK) {
        free(r);
        return st;
    }
    r->seq = ++m->seq;
    atomic_fetch_add_explicit(&m->async_issued, 1, memory_order_relaxed);
    pthread_mutex_lock(&m->engine->lock);
    if (m->engine->tail)
        m->engine->tail->next = r;
    else
        m->engine->head = r;
    m->engine->tail = r;
    pthread_cond_signal(&m->engine->wake);
    pthread_mutex_unlock(&m->engine->lock);
    *req = r;
    return TD_OK;
}

td_status td_comm_test(td_comm_request *req) {
    if (!req)
        return td__error(TD_ERR_INVALID_ARG, "td_comm_test: request is NULL");
    if (!atomic_load_explicit(&req->done, memory_order_acquire))
        return TD_IN_PROGRESS;
    if (req->status != TD_OK)
        td__error_set_message(req->message ? req->message : td_status_str(req->status));
    return req->status;
}

td_status td_comm_wait(td_comm_request *req) {
    unsigned rounds = 0;
    uint64_t tr;
    if (!req)
        return td__error(TD_ERR_INVALID_ARG, "td_comm_wait: request is NULL");
    if (atomic_load_explicit(&req->done, memory_order_acquire))
        return td_comm_test(req); /* no wait worth a span */
    tr = td__trace_begin();
    /* Spin briefly first: a small collective finishes within microseconds. */
    for (int i = 0; i < 2000 && !atomic_load_explicit(&req->done, memory_order_acquire); i++)
        sched_yield();
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) {
        backoff(&rounds);
        if (engine_stuck(req->m, rounds))
            return td__member_give_up(req->m);
    }
    td__trace_end(tr, TD__TRACE_WAIT, "wait for collective", -1);
    return td_comm_test(req);
}

td_status td_comm_request_times(td_comm_request *req, uint64_t *began_ns, uint64_t *ended_ns) {
    if (!req || !began_ns || !ended_ns)
        return td__error(TD_ERR_INVALID_ARG, "td_comm_request_times: an argument is NULL");
    (void)td_comm_wait(req); /* a failed collective ran too */
    *began_ns = req->began_ns;
    *ended_ns = req->ended_ns;
    return TD_OK;
}

void td_comm_request_destroy(td_comm_request *req) {
    if (!req)
        return;
    if (td_comm_wait(req) != TD_OK && !atomic_load_explicit(&req->done, memory_order_acquire))
        return; /* a stuck engine holds it */
    free(req->message);
    free(req);
}

td_status td_allreduce_async(td_group *g, td_buffer *buf, size_t offset, size_t count,
                             td_dtype dtype, td_reduce_op op, td_comm_request **req) {
    td_collective c = {TD_COLL_ALLREDUCE, buf, offset, buf, offset, count, dtype, op, 0};
    return td_collective_start(g, &c, req);
}

td_status td_allreduce(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                       size_t recv_offset, size_t count, td_dtype dtype, td_reduce_op op) {
    td_collective c = {
        TD_COLL_ALLREDUCE, send, send_offset, recv, recv_offset, count, dtype, op, 0};
    return td_collective_run(g, &c);
}

td_status td_broadcast(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                       size_t recv_offset, size_t count, td_dtype dtype, int root) {
    td_collective c = {TD_COLL_BROADCAST, send, send_offset, recv, recv_offset, count, dtype,
                       TD_REDUCE_SUM,     root};
    return td_collective_run(g, &c);
}

td_status td_reduce(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                    size_t recv_offset, size_t count, td_dtype dtype, td_reduce_op op, int root) {
    td_collective c = {TD_COLL_REDUCE, send,  send_offset, recv, recv_offset,
                       count,          dtype, op,          root};
    return td_collective_run(g, &c);
}

td_status td_allgather(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                       size_t recv_offset, size_t count, td_dtype dtype) {
    td_collective c = {TD_COLL_ALLGATHER, send, send_offset, recv, recv_offset, count, dtype,
                       TD_REDUCE_SUM,     0};
    return td_collective_run(g, &c);
}

td_status td_reduce_scatter(td_group *g, const td_buffer *send, size_t send_offset, td_buffer *recv,
                            size_t recv_offset, size_t count, td_dtype dtype, td_reduce_op op) {
    td_collective c = {
        TD_COLL_REDUCE_SCATTER, send, send_offset, recv, recv_offset, count, dtype, op, 0};
    return td_collective_run(g, &c);
}

td_status td_allreduce_tensor(td_group *g, td_tensor *t, td_reduce_op op) {
    size_t off;
    td_buffer *buf = td_tensor_buffer(t, &off);
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "td_allreduce_tensor: tensor is NULL");
    return td_allreduce(g, buf, off, buf, off, td_tensor_numel(t), td_tensor_dtype(t), op);
}

td_status td_broadcast_tensor(td_group *g, td_tensor *t, int root) {
    size_t off;
    td_buffer *buf = td_tensor_buffer(t, &off);
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "td_broadcast_tensor: tensor is NULL");
    return td_broadcast(g, buf, off, buf, off, td_tensor_numel(t), td_tensor_dtype(t), root);
}
