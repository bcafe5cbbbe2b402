/* The local transport: members in one process. CPU devices share one address
 * space, so a member reads its peers' buffers directly, as a GPU reads its
 * peers' memory through peer access.
 *
 * Synchronisation is by phases. Each member counts the phases it runs (every
 * member runs the same ones, so the counts agree); to start phase p it
 * publishes its pointers and stores p into its `posted` flag, then waits
 * until every peer posted p. Inside a pipelined phase, members publish how
 * many units (chunk steps) they completed in `prog`, as (p << 32) | units,
 * which only grows, so a stale value from an earlier phase always reads as
 * "not yet". Flags sit on cache lines of their own; waits (wait.c) spin with
 * pause, then yield, then sleep (devices may outnumber cores), and give up at
 * the timeout or when the group fails. No mutex or condition variable is on this
 * path.
 *
 * Algorithms:
 *   shared  (large all-reduce) see shared_allreduce(): chunk jobs pulled from
 *           a shared counter by whichever member is free. Chosen over the
 *           ring for all-reduce because on shared memory there are no links
 *           for a ring to respect, and members share cores with other work
 *           (2 cores here): a ring stalls whenever one member is descheduled.
 *   direct  each member copies its contribution into its own small slot,
 *           posts, and computes its result from all slots in rank order:
 *           one barrier, so latency is one cache-line handoff. Slots are
 *           double buffered by phase parity, so no barrier is needed after.
 *   ring    the data is cut into n segments and each segment into chunks;
 *           units run chunk by chunk so that the ring is a pipeline. All-reduce
 *           is a reduce-scatter (member r finishes segment r: it adds its input
 *           to the partial sum its left neighbour left in its FIFO, or to the
 *           neighbour's input at the first step) followed by an all-gather
 *           (each member copies the finished segments from its left
 *           neighbour's output). Broadcast and reduce are pipelined chains.
 *           Each member returns once its right neighbour, the only reader of
 *           its memory, is done. */
#include <string.h>

#include "comm/comm-impl.h"
#include "core/error.h"

/* Phases -------------------------------------------------------------------- */

static td__pub *my_pub(td__member *m, uint64_t phase) {
    return &m->g->slots[m->local].pub[phase & 1];
}

static const td__pub *peer_pub(td__member *m, int peer, uint64_t phase) {
    return &m->g->slots[peer].pub[phase & 1];
}

/* Starts a phase: publishes the pointers; the caller fills its slot, then
 * calls phase_post. */
static uint64_t phase_open(td__member *m, const void *in, void *out, size_t count, int kind,
                           td_dtype dt, int op, int root, uint64_t seq) {
    uint64_t ph = ++m->phase;
    td__pub *p = my_pub(m, ph);
    p->in = in;
    p->out = out;
    p->count = count;
    p->kind = kind;
    p->dtype = (int)dt;
    p->op = op;
    p->root = root;
    p->seq = seq;
    return ph;
}

/* Arrives at phase ph and waits for every local peer to arrive. Checks that
 * they called the same collective. */
static td_status phase_post(td__member *m, uint64_t ph) {
    td_group *g = m->g;
    td_status st;
    const td__pub *me = my_pub(m, ph);
    atomic_store_explicit(&g->slots[m->local].posted, ph, memory_order_release);
    for (int k = 0; k < g->nlocal; k++) {
        if (k == m->local)
            continue;
        if ((st = td__comm_wait(m, &g->slots[k].posted, ph, k, me->seq)) != TD_OK)
            return st;
    }
    if (m->local != 0) {
        const td__pub *p0 = peer_pub(m, 0, ph);
        if (p0->seq != me->seq || p0->kind != me->kind || p0->count != me->count ||
            p0->dtype != me->dtype || p0->op != me->op || p0->root != me->root)
            return td__group_fail(
                g, m->rank,
                "collective #%llu: %s (rank %d) called %s of %zu %s (op %d, root %d) but %s "
                "(rank %d) called #%llu, %s of %zu %s (op %d, root %d): every member must make "
                "the same calls in the same order",
                (unsigned long long)me->seq, td_device_name(m->dev), m->rank,
                td_collective_name((td_collective_kind)me->kind), me->count,
                td_dtype_name((td_dtype)me->dtype), me->op, me->root,
                td_device_name(g->members[0].dev), g->members[0].rank, (unsigned long long)p0->seq,
                td_collective_name((td_collective_kind)p0->kind), p0->count,
                td_dtype_name((td_dtype)p0->dtype), p0->op, p0->root);
    }
    return TD_OK;
}

static inline void publish_units(td__member *m, uint64_t ph, uint64_t units) {
    atomic_store_explicit(&m->g->slots[m->local].prog, (ph << 32) | units, memory_order_release);
}

/* Waits until local member k completed `units` units of phase ph. */
static inline td_status wait_units(td__member *m, int k, uint64_t ph, uint64_t units,
                                   uint64_t seq) {
    return td__comm_wait(m, &m->g->slots[k].prog, (ph << 32) | units, k, seq);
}

/* Geometry ------------------------------------------------------------------ */

/* Segment s of n over count elements: the first count % n segments are one
 * longer. */
static size_t seg_begin(size_t count, int n, int s) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    return q * (size_t)s + ((size_t)s < r ? (size_t)s : r);
}

static size_t chunk_elems(const td_group *g, td_dtype dt) {
    size_t ce = g->chunk_bytes / td_dtype_size(dt);
    return ce ? ce : 1;
}

/* Chunk c of [b, e): [*lo, *hi), possibly empty. */
static void chunk_range(size_t b, size_t e, size_t ce, size_t c, size_t *lo, size_t *hi) {
    size_t l = b + c * ce;
    *lo = l < e ? l : e;
    *hi = l + ce < e ? l + ce : e;
}

#define AT(p, i)  ((char *)(p) + (i)*es)
#define CAT(p, i) ((const char *)(p) + (i)*es)

static void *fifo_slot(td__member *m, uint64_t u) {
    return (char *)m->fifo + (size_t)(u % TD_COMM_FIFO) * m->g->chunk_bytes;
}

/* Ring algorithms ----------------------------------------------------------- */

/* All-reduce (segments over count) or reduce-scatter (segments of count each,
 * results to out). divide_by > 1 divides the results (mean). */
static td_status ring_reduce(td__member *m, const td__op *o, int scatter, int divide_by) {
    td_group *g = m->g;
    const int n = g->nlocal, r = m->local;
    const int left = (r + n - 1) % n, right = (r + 1) % n;
    const size_t es = td_dtype_size(o->dtype);
    const size_t total = scatter ? o->count * (size_t)n : o->count;
    const size_t ce = chunk_elems(g, o->dtype);
    const int steps = scatter ? n - 1 : 2 * (n - 1); /* units per chunk */
    size_t maxseg, nchunks;
    uint64_t ph;
    td_status st;
    td__member *lm = &g->members[left];
    const td__pub *lp;

    ph = phase_open(m, o->in, o->out, o->count, o->kind, o->dtype, o->op, o->root, o->seq);
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    lp = peer_pub(m, left, ph);
    maxseg = scatter ? o->count : seg_begin(total, n, 1);
    nchunks = (maxseg + ce - 1) / ce;
    /* Units go chunk by chunk (a pipeline through the ring), except with two
     * members, where step by step leaves one wait per collective instead of
     * one per chunk: the first step needs nothing from the peer. */
    const int step_major = n == 2;
#define UNIT(c, j)                                                                                 \
    (step_major ? (uint64_t)(j)*nchunks + (uint64_t)(c) : (uint64_t)(c)*steps + (uint64_t)(j))
    for (size_t outer = 0; outer < (step_major ? (size_t)steps : nchunks); outer++) {
        for (size_t inner = 0; inner < (step_major ? nchunks : (size_t)steps); inner++) {
            const size_t c = step_major ? inner : outer;
            const int j = (int)(step_major ? outer : inner);
            uint64_t u = UNIT(c, j);
            size_t lo, hi, len;
            if (j < n - 1) {
                /* Reduce-scatter step j: segment r + n - 2 - j, finished at step n - 2. */
                int s = (r + 2 * n - 2 - j) % n;
                size_t b = scatter ? (size_t)s * o->count : seg_begin(total, n, s);
                size_t e = scatter ? b + o->count : seg_begin(total, n, s + 1);
                const void *partial;
                void *dst;
                int final = j == n - 2;
                chunk_range(b, e, ce, c, &lo, &hi);
                len = hi - lo;
                if (j == 0) {
                    partial = CAT(lp->in, lo);
                } else {
                    /* n > 2 here, so units are chunk-major: (c, j - 1) is u - 1. */
                    if ((st = wait_units(m, left, ph, u, o->seq)) != TD_OK)
                        return st;
                    partial = fifo_slot(lm, u - 1);
                }
                if (final) {
                    dst = scatter ? AT(o->out, lo - b) : AT(o->out, lo);
                } else {
                    /* The right neighbour must have read what this FIFO slot held. */
                    if (u >= TD_COMM_FIFO &&
                        (st = wait_units(m, right, ph, u - TD_COMM_FIFO + 2, o->seq)) != TD_OK)
                        return st;
                    dst = fifo_slot(m, u);
                }
                td__reduce2(dst, partial, CAT(o->in, lo), len, o->dtype, o->op);
                if (final && divide_by > 1)
                    td__scale(dst, len, o->dtype, divide_by);
            } else {
                /* All-gather step k: copy finished segment r - 1 - k from the left. */
                int k = j - (n - 1);
                int s = (r + 2 * n - 1 - k) % n;
                chunk_range(seg_begin(total, n, s), seg_begin(total, n, s + 1), ce, c, &lo, &hi);
                len = hi - lo;
                if ((st = wait_units(m, left, ph, UNIT(c, j - 1) + 1, o->seq)) != TD_OK)
                    return st;
                /* In place, this overwrites input the right neighbour reads at
                 * its first step: wait for it. */
                if (k == 0 && (st = wait_units(m, right, ph, UNIT(c, 0) + 1, o->seq)) != TD_OK)
                    return st;
                if (len)
                    memcpy(AT(o->out, lo), CAT(lp->out, lo), len * es);
            }
            publish_units(m, ph, u + 1);
        }
    }
#undef UNIT
    /* The right neighbour reads this member's memory until it is done. */
    return wait_units(m, right, ph, nchunks * (uint64_t)steps, o->seq);
}

static td_status ring_allgather(td__member *m, const td__op *o) {
    td_group *g = m->g;
    const int n = g->nlocal, r = m->local;
    const int left = (r + n - 1) % n, right = (r + 1) % n;
    const size_t es = td_dtype_size(o->dtype);
    const size_t ce = chunk_elems(g, o->dtype);
    const size_t nchunks = (o->count + ce - 1) / ce;
    const int steps = n;
    uint64_t ph;
    td_status st;
    const td__pub *lp;

    ph = phase_open(m, o->in, o->out, o->count, o->kind, o->dtype, o->op, o->root, o->seq);
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    lp = peer_pub(m, left, ph);
    for (size_t c = 0; c < nchunks; c++) {
        for (int j = 0; j < steps; j++) {
            uint64_t u = c * (uint64_t)steps + (uint64_t)j;
            size_t lo, hi;
            int s = (r + n - j) % n; /* own segment first, then r - 1, r - 2, ... */
            chunk_range(0, o->count, ce, c, &lo, &hi);
            if (j == 0) {
                void *dst = AT(o->out, (size_t)r * o->count + lo);
                if (dst != CAT(o->in, lo) && hi > lo)
                    memmove(dst, CAT(o->in, lo), (hi - lo) * es);
            } else if (j == 1) {
                /* The left neighbour's own part: straight from its input. */
                if (hi > lo)
                    memcpy(AT(o->out, (size_t)s * o->count + lo), CAT(lp->in, lo), (hi - lo) * es);
            } else {
                size_t off = (size_t)s * o->count + lo;
                if ((st = wait_units(m, left, ph, u, o->seq)) != TD_OK)
                    return st;
                if (hi > lo)
                    memcpy(AT(o->out, off), CAT(lp->out, off), (hi - lo) * es);
            }
            publish_units(m, ph, u + 1);
        }
    }
    return wait_units(m, right, ph, nchunks * (uint64_t)steps, o->seq);
}

/* A pipelined chain from the root: each member copies chunk c from its left
 * neighbour's output once the neighbour has it. */
static td_status chain_bcast(td__member *m, const td__op *o, int root, int kind) {
    td_group *g = m->g;
    const int n = g->nlocal, r = m->local;
    const int left = (r + n - 1) % n, right = (r + 1) % n;
    const int pos = (r - root + n) % n;
    const size_t es = td_dtype_size(o->dtype);
    const size_t ce = chunk_elems(g, o->dtype);
    const size_t nchunks = (o->count + ce - 1) / ce;
    uint64_t ph;
    td_status st;
    const td__pub *lp;

    ph = phase_open(m, o->in, o->out, o->count, kind, o->dtype, o->op, o->root, o->seq);
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    lp = peer_pub(m, left, ph);
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo, hi;
        chunk_range(0, o->count, ce, c, &lo, &hi);
        if (pos == 0) {
            if (o->out != o->in)
                memcpy(AT(o->out, lo), CAT(o->in, lo), (hi - lo) * es);
        } else if (pos == 1) {
            /* Next to the root: straight from the root's input. */
            if (o->out)
                memcpy(AT(o->out, lo), CAT(lp->in, lo), (hi - lo) * es);
        } else {
            if ((st = wait_units(m, left, ph, c + 1, o->seq)) != TD_OK)
                return st;
            if (o->out)
                memcpy(AT(o->out, lo), CAT(lp->out, lo), (hi - lo) * es);
        }
        publish_units(m, ph, c + 1);
    }
    if (pos == n - 1)
        return TD_OK;
    return wait_units(m, right, ph, nchunks, o->seq);
}

/* A pipelined chain that ends at the root: member at position p adds its
 * input to the partial sum of position p - 1. */
static td_status chain_reduce(td__member *m, const td__op *o, int root, int divide_by) {
    td_group *g = m->g;
    const int n = g->nlocal, r = m->local;
    const int left = (r + n - 1) % n, right = (r + 1) % n;
    const int pos = (r - root - 1 + 2 * n) % n; /* the root is last */
    const size_t es = td_dtype_size(o->dtype);
    const size_t ce = chunk_elems(g, o->dtype);
    const size_t nchunks = (o->count + ce - 1) / ce;
    uint64_t ph;
    td_status st;
    const td__pub *lp;
    td__member *lm = &g->members[left];

    ph = phase_open(m, o->in, o->out, o->count, TD_COLL_REDUCE, o->dtype, o->op, o->root, o->seq);
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    lp = peer_pub(m, left, ph);
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo, hi;
        chunk_range(0, o->count, ce, c, &lo, &hi);
        if (pos > 0) {
            const void *partial;
            void *dst;
            if (pos == 1) {
                partial = CAT(lp->in, lo);
            } else {
                if ((st = wait_units(m, left, ph, c + 1, o->seq)) != TD_OK)
                    return st;
                partial = fifo_slot(lm, c);
            }
            if (pos == n - 1) {
                dst = AT(o->out, lo);
            } else {
                if (c >= TD_COMM_FIFO &&
                    (st = wait_units(m, right, ph, c - TD_COMM_FIFO + 1, o->seq)) != TD_OK)
                    return st;
                dst = fifo_slot(m, c);
            }
            td__reduce2(dst, partial, CAT(o->in, lo), hi - lo, o->dtype, o->op);
            if (pos == n - 1 && divide_by > 1)
                td__scale(dst, hi - lo, o->dtype, divide_by);
        }
        publish_units(m, ph, c + 1);
    }
    if (pos == n - 1)
        return TD_OK;
    return wait_units(m, right, ph, nchunks, o->seq);
}

/* Shared work queue --------------------------------------------------------- */

/* All-reduce as a queue of chunk jobs that any member may take: job c reads
 * chunk c of every member's input, reduces it in rank order, and writes it
 * to every member's output. The memory traffic equals the ring's (each byte
 * read once, each result written once per member) and, like the ring, every
 * result is computed once, so members agree bit for bit; but a member that
 * the OS deschedules (cores shared with other work, or members outnumbering
 * cores) holds back at most the chunk it took, where a ring would stall at
 * its next step. Counters are by phase parity; member 0 resets this phase's
 * before it posts, when nobody can still be using them (see phase_post). */
static td_status shared_allreduce(td__member *m, const td__op *o, int divide_by) {
    td_group *g = m->g;
    const int n = g->nlocal;
    const size_t es = td_dtype_size(o->dtype);
    const size_t ce = chunk_elems(g, o->dtype);
    const uint64_t jobs = (o->count + ce - 1) / ce;
    uint64_t ph, done_here = 0;
    td_status st;
    int streamed = 0;
    ph = phase_open(m, o->in, o->out, o->count, o->kind, o->dtype, o->op, o->root, o->seq);
    if (m->local == 0) {
        atomic_store_explicit(&g->work_next[ph & 1], 0, memory_order_relaxed);
        atomic_store_explicit(&g->work_done[ph & 1], 0, memory_order_relaxed);
    }
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    for (;;) {
        uint64_t c = atomic_fetch_add_explicit(&g->work_next[ph & 1], 1, memory_order_relaxed);
        size_t lo, hi, len;
        void *dst;
        if (c >= jobs)
            break;
        lo = (size_t)c * ce;
        hi = lo + ce < o->count ? lo + ce : o->count;
        len = hi - lo;
        if (n == 2 && divide_by <= 1) {
            /* Two members: one pass from both inputs to both outputs. */
            void *outs[2] = {AT(peer_pub(m, 0, ph)->out, lo), AT(peer_pub(m, 1, ph)->out, lo)};
            if (td__reduce2_stream(outs, 2, CAT(peer_pub(m, 0, ph)->in, lo),
                                   CAT(peer_pub(m, 1, ph)->in, lo), len, o->dtype, o->op)) {
                td__stream_fence();
                done_here++;
                atomic_fetch_add_explicit(&g->work_done[ph & 1], 1, memory_order_acq_rel);
                continue;
            }
        }
        /* Reduced into this member's chunk buffer, which stays in cache,
         * then streamed to every output. */
        dst = m->temp;
        td__reduce2(dst, CAT(peer_pub(m, 0, ph)->in, lo), CAT(peer_pub(m, 1, ph)->in, lo), len,
                    o->dtype, o->op);
        for (int k = 2; k < n; k++)
            td__reduce2(dst, dst, CAT(peer_pub(m, k, ph)->in, lo), len, o->dtype, o->op);
        if (divide_by > 1)
            td__scale(dst, len, o->dtype, divide_by);
        for (int k = 0; k < n; k++)
            streamed |= td__stream_copy(AT(peer_pub(m, k, ph)->out, lo), dst, len * es);
        if (streamed)
            td__stream_fence();
        done_here++;
        atomic_fetch_add_explicit(&g->work_done[ph & 1], 1, memory_order_acq_rel);
    }
    (void)done_here;
    /* Everyone's buffers are in use until every job is done. */
    return td__comm_wait(m, &g->work_done[ph & 1], jobs, -1, o->seq);
}

/* Direct exchange ----------------------------------------------------------- */

/* Bytes of one member's slot contribution for op. */
static size_t direct_bytes(const td_group *g, const td__op *o) {
    size_t es = td_dtype_size(o->dtype);
    return o->kind == TD_COLL_REDUCE_SCATTER ? o->count * (size_t)g->nlocal * es : o->count * es;
}

static td_status direct(td__member *m, const td__op *o, int root, int divide_by) {
    td_group *g = m->g;
    const int n = g->nlocal, r = m->local;
    const size_t es = td_dtype_size(o->dtype);
    const size_t bytes = direct_bytes(g, o);
    uint64_t ph;
    td_status st;
    void *mine;

    ph = phase_open(m, o->in, o->out, o->count, o->kind, o->dtype, o->op, o->root, o->seq);
    mine = m->small[ph & 1];
    if (o->kind != TD_COLL_BROADCAST || r == root)
        memcpy(mine, o->in, bytes);
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
#define SLOT(k) ((const char *)g->members[k].small[ph & 1])
    switch (o->kind) {
    case TD_COLL_ALLREDUCE:
    case TD_COLL_REDUCE:
    case TD_COLL_REDUCE_SCATTER: {
        size_t off = o->kind == TD_COLL_REDUCE_SCATTER ? (size_t)r * o->count * es : 0;
        if (o->kind == TD_COLL_REDUCE && r != root)
            break;
        if (n == 1) {
            memcpy(o->out, SLOT(0) + off, o->count * es);
        } else {
            td__reduce2(o->out, SLOT(0) + off, SLOT(1) + off, o->count, o->dtype, o->op);
            for (int k = 2; k < n; k++)
                td__reduce2(o->out, o->out, SLOT(k) + off, o->count, o->dtype, o->op);
        }
        if (divide_by > 1)
            td__scale(o->out, o->count, o->dtype, divide_by);
        break;
    }
    case TD_COLL_BROADCAST:
        if (o->out)
            memcpy(o->out, SLOT(root), bytes);
        break;
    case TD_COLL_ALLGATHER:
        for (int k = 0; k < n; k++)
            memcpy((char *)o->out + (size_t)k * bytes, SLOT(k), bytes);
        break;
    }
#undef SLOT
    return TD_OK;
}

/* Entry points -------------------------------------------------------------- */

static int use_direct(const td_group *g, const td__op *o) {
    size_t bytes = direct_bytes(g, o);
    td_comm_algorithm algo = o->algo != TD_ALGO_AUTO ? o->algo : g->algorithm;
    if (bytes > g->small_bytes)
        return 0;
    if (algo == TD_ALGO_DIRECT)
        return 1;
    if (algo == TD_ALGO_RING || algo == TD_ALGO_SHARED)
        return 0;
    return bytes < g->switch_bytes;
}

/* The ring for an all-reduce of `bytes`, rather than the shared queue? The
 * ring's members only read their peers' buffers; the queue's also write
 * them, and a buffer its owner has just written (a gradient after backward)
 * sits modified in that core's cache, so each of those writes takes the line
 * from the other core. Measured on 2 cores, in place, buffers freshly
 * written: 800 KB 60-68 us on the ring against 118-122 us queued, 16 MiB
 * 1.0-1.2 ms against 1.9-2.0 ms, 64 MiB 8.9-9.7 ms against 6.6-7.2 ms (the
 * queue wins once the buffers outgrow the caches). With more members than
 * cores the queue stays: a descheduled member stalls a ring. */
#define RING_MAX_BYTES ((size_t)16 << 20)

static int ring_pays(const td_group *g, size_t bytes) {
    return bytes <= RING_MAX_BYTES && g->spin_rounds > 2;
}

td_status td__local_run(td__member *m, const td__op *o) {
    td_group *g = m->g;
    const int n = g->nlocal;
    const int root = o->root - g->rank0;
    const int divide = o->op == TD_REDUCE_MEAN ? g->size : 1;
    const size_t es = td_dtype_size(o->dtype);
    if (n == 1) {
        /* Alone: copy (reduce-scatter and all-gather keep their layout). */
        if (o->out && o->out != o->in)
            memmove(o->out, o->in, o->count * es);
        if (divide > 1 && o->kind != TD_COLL_BROADCAST && o->kind != TD_COLL_ALLGATHER && o->out)
            td__scale(o->out, o->count, o->dtype, divide);
        return TD_OK;
    }
    if (use_direct(g, o))
        return direct(m, o, root, divide);
    switch (o->kind) {
    case TD_COLL_ALLREDUCE: {
        td_comm_algorithm algo = o->algo != TD_ALGO_AUTO ? o->algo : g->algorithm;
        if (algo == TD_ALGO_RING || (algo == TD_ALGO_AUTO && ring_pays(g, o->count * es)))
            return ring_reduce(m, o, 0, divide);
        return shared_allreduce(m, o, divide);
    }
    case TD_COLL_REDUCE_SCATTER: return ring_reduce(m, o, 1, divide);
    case TD_COLL_ALLGATHER: return ring_allgather(m, o);
    case TD_COLL_BROADCAST: return chain_bcast(m, o, root, TD_COLL_BROADCAST);
    case TD_COLL_REDUCE: return chain_reduce(m, o, root, divide);
    }
    return td__error(TD_ERR_INTERNAL, "unknown collective %d", (int)o->kind);
}

/* Pieces for the hierarchical MPI transport --------------------------------- */

/* The sequence number of the collective m runs now, which the pieces below
 * are parts of. Not m->seq: that is the last one the member's host thread
 * issued, and with asynchronous collectives it runs ahead of the one its
 * engine runs (and the engine would read it while the host thread writes
 * it), so local peers compared different numbers for one phase. */
static uint64_t running_seq(td__member *m) {
    return atomic_load_explicit(&m->busy_seq, memory_order_relaxed);
}

static td__op piece(td_collective_kind kind, const void *in, void *out, size_t count, td_dtype dt,
                    td_reduce_op op, int root, uint64_t seq) {
    return (td__op){.kind = kind,
                    .in = in,
                    .out = out,
                    .count = count,
                    .dtype = dt,
                    .op = op,
                    .root = root,
                    .seq = seq};
}

td_status td__local_reduce(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                           td_reduce_op op, int root_local, int divide_by) {
    td__op o = piece(TD_COLL_REDUCE, in, out, count, dt, op, root_local, running_seq(m));
    if (m->g->nlocal == 1) {
        if (out != in)
            memmove(out, in, count * td_dtype_size(dt));
        if (divide_by > 1)
            td__scale(out, count, dt, divide_by);
        return TD_OK;
    }
    if (use_direct(m->g, &o))
        return direct(m, &o, root_local, divide_by);
    return chain_reduce(m, &o, root_local, divide_by);
}

td_status td__local_bcast(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                          int root_local) {
    td__op o =
        piece(TD_COLL_BROADCAST, in, out, count, dt, TD_REDUCE_SUM, root_local, running_seq(m));
    if (m->g->nlocal == 1) {
        if (out && out != in)
            memmove(out, in, count * td_dtype_size(dt));
        return TD_OK;
    }
    if (use_direct(m->g, &o))
        return direct(m, &o, root_local, 1);
    return chain_bcast(m, &o, root_local, TD_COLL_BROADCAST);
}

td_status td__local_barrier(td__member *m) {
    uint64_t ph = phase_open(m, NULL, NULL, 0, -1, TD_F32, 0, 0, running_seq(m));
    return phase_post(m, ph);
}

td_status td__local_scatter(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                            int root_local, size_t stride) {
    const size_t es = td_dtype_size(dt);
    uint64_t ph = phase_open(m, in, out, count, -2, dt, 0, root_local, running_seq(m));
    td_status st;
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    {
        const td__pub *rp = peer_pub(m, root_local, ph);
        const char *src = (const char *)rp->in + (size_t)m->local * stride * es;
        if (out && out != src && count)
            memmove(out, src, count * es);
    }
    /* The root's memory is read until everyone is past here. */
    return td__local_barrier(m);
}

td_status td__local_gather(td__member *m, const void *in, void *out, size_t count, td_dtype dt,
                           int root_local) {
    const size_t es = td_dtype_size(dt);
    uint64_t ph = phase_open(m, in, out, count, -3, dt, 0, root_local, running_seq(m));
    td_status st;
    if ((st = phase_post(m, ph)) != TD_OK)
        return st;
    if (m->local == root_local) {
        for (int k = 0; k < m->g->nlocal; k++) {
            const td__pub *p = peer_pub(m, k, ph);
            char *dst = (char *)out + (size_t)k * count * es;
            if (dst != p->in && count)
                memmove(dst, p->in, count * es);
        }
    }
    return td__local_barrier(m);
}

const td__transport td__transport_local = {
    .name = "local",
    .run = td__local_run,
};
