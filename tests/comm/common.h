/* Shared by the comm tests: inputs that depend only on (rank, index), the
 * serial f64 reference of every collective, and one checked collective run
 * inside a member. */
#ifndef TD_TEST_COMM_COMMON_H
#define TD_TEST_COMM_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

/* Quarter-integers in [-7.5, 7.5]: sums of a few are exact in f32. */
static inline double comm_input(int rank, size_t i) {
    return (double)((int)((i * 7u + (size_t)rank * 13u + (i >> 9)) % 61u) - 30) / 4.0;
}

static inline double comm_combine(td_reduce_op op, const double *v, int n) {
    double acc = v[0];
    for (int k = 1; k < n; k++) {
        if (op == TD_REDUCE_MAX)
            acc = v[k] > acc ? v[k] : acc;
        else if (op == TD_REDUCE_MIN)
            acc = v[k] < acc ? v[k] : acc;
        else
            acc += v[k];
    }
    return op == TD_REDUCE_MEAN ? acc / n : acc;
}

/* Element i of what rank `rank` must hold after c in a group of n. NAN when
 * the result is not defined there. */
static inline double comm_expected(const td_collective *c, int n, int rank, size_t i) {
    double v[64] = {0};
    switch (c->kind) {
    case TD_COLL_ALLREDUCE:
    case TD_COLL_REDUCE:
        if (c->kind == TD_COLL_REDUCE && rank != c->root)
            return NAN;
        for (int k = 0; k < n; k++)
            v[k] = comm_input(k, i);
        return comm_combine(c->op, v, n);
    case TD_COLL_BROADCAST: return comm_input(c->root, i);
    case TD_COLL_ALLGATHER: return comm_input((int)(i / c->count), i % c->count);
    case TD_COLL_REDUCE_SCATTER:
        for (int k = 0; k < n; k++)
            v[k] = comm_input(k, (size_t)rank * c->count + i);
        return comm_combine(c->op, v, n);
    }
    return NAN;
}

static inline void comm_extents(const td_collective *c, int n, int rank, size_t *nsend,
                                size_t *nrecv) {
    *nsend = *nrecv = c->count;
    if (c->kind == TD_COLL_ALLGATHER)
        *nrecv = c->count * (size_t)n;
    if (c->kind == TD_COLL_REDUCE_SCATTER)
        *nsend = c->count * (size_t)n;
}

#define COMM_GUARD    8       /* elements after the data that must stay untouched */
#define COMM_SENTINEL 12345.0 /* their value */

/* Runs collective `c` (buffers ignored) on this member with fresh buffers at
 * byte offset `off`, in place or not, and compares with the reference.
 * Returns the call's status; a wrong value becomes TD_ERR_CORRUPT with
 * the details in err. */
static inline td_status comm_check(td_group *g, td_device *dev, int rank, int n, td_collective c,
                                   int in_place, char *err, size_t errn) {
    const size_t es = td_dtype_size(c.dtype);
    const size_t off = 16;
    size_t nsend, nrecv, nbuf, send_at;
    td_buffer *sb = NULL, *rb = NULL;
    double *host = NULL;
    td_status st = TD_OK;
    comm_extents(&c, n, rank, &nsend, &nrecv);
    /* In place: one buffer; an all-gather's input sits at its rank's place
     * and a reduce-scatter's output at its rank's place in the input. */
    nbuf = (nsend > nrecv ? nsend : nrecv) + COMM_GUARD;
    host = malloc(sizeof *host * nbuf);
    if (!host)
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td_buffer_alloc(dev, off + nbuf * es, &rb)) != TD_OK)
        goto done;
    if (!in_place && (st = td_buffer_alloc(dev, off + nbuf * es, &sb)) != TD_OK)
        goto done;
    send_at = in_place && c.kind == TD_COLL_ALLGATHER ? (size_t)rank * c.count : 0;
    for (size_t i = 0; i < nbuf; i++)
        host[i] = COMM_SENTINEL;
    /* The receive buffer first (sentinels), then the input over it or beside it. */
    {
        void *raw = malloc(nbuf * es);
        if (!raw) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto done;
        }
        for (size_t i = 0; i < nbuf; i++) {
            double x = host[i];
            if (i >= send_at && i < send_at + nsend)
                x = comm_input(rank, i - send_at);
            if (c.dtype == TD_F32)
                ((float *)raw)[i] = (float)x;
            else
                ((double *)raw)[i] = x;
        }
        if (in_place) {
            st = td_buffer_write(rb, off, raw, nbuf * es);
        } else {
            st = td_buffer_write(sb, off, raw, nbuf * es);
            for (size_t i = 0; i < nbuf && st == TD_OK; i++) {
                if (c.dtype == TD_F32)
                    ((float *)raw)[i] = (float)COMM_SENTINEL;
                else
                    ((double *)raw)[i] = COMM_SENTINEL;
            }
            if (st == TD_OK)
                st = td_buffer_write(rb, off, raw, nbuf * es);
        }
        free(raw);
        if (st != TD_OK)
            goto done;
    }
    c.recv = rb;
    c.recv_offset = off;
    if (in_place) {
        c.send = rb;
        c.send_offset = off + send_at * es;
        if (c.kind == TD_COLL_REDUCE_SCATTER)
            c.recv_offset = off + (size_t)rank * c.count * es;
    } else {
        c.send = sb;
        c.send_offset = off;
    }
    if ((st = td_collective_run(g, &c)) != TD_OK)
        goto done;
    {
        void *raw = malloc(nbuf * es);
        size_t out_at = (c.recv_offset - off) / es;
        if (!raw) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if ((st = td_buffer_read(rb, off, raw, nbuf * es)) != TD_OK) {
            free(raw);
            goto done;
        }
        for (size_t i = 0; i < nrecv + COMM_GUARD && st == TD_OK; i++) {
            double got = c.dtype == TD_F32 ? (double)((float *)raw)[out_at + i]
                                           : ((double *)raw)[out_at + i];
            double want = i < nrecv ? comm_expected(&c, n, rank, i) : NAN;
            double tol;
            if (i >= nrecv) {
                /* Past the result: the guard, unless in place input lies there. */
                if (in_place && out_at + i < send_at + nsend)
                    continue;
                if (out_at + i >= nbuf)
                    break;
                want = COMM_SENTINEL;
            }
            if (isnan(want))
                continue;
            tol = (c.dtype == TD_F32 ? 1e-6 : 1e-13) * (fabs(want) > 1 ? fabs(want) : 1);
            if (fabs(got - want) > tol) {
                snprintf(err, errn,
                         "%s %s count %zu op %d root %d %s on rank %d of %d: element %zu is %.9g, "
                         "expected %.9g",
                         td_collective_name(c.kind), td_dtype_name(c.dtype), c.count, (int)c.op,
                         c.root, in_place ? "in place" : "out of place", rank, n, i, got, want);
                st = TD_ERR_CORRUPT;
            }
        }
        free(raw);
    }
done:
    td_buffer_free(sb);
    td_buffer_free(rb);
    free(host);
    return st;
}

#endif
