/* The data strategy's ZeRO-1: each member keeps the optimizer state of its
 * shard of every parameter, and the whole state moves to and from one
 * optimizer for checkpoints. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/dp-impl.h"

/* ZeRO-1, once the reduce-scatters are done: each shard into its place in
 * the gradient, and the tails (the elements past the last whole shard,
 * which every member keeps) summed whole. */
td_status td__dp_place_shards(dp_member *mb) {
    td_dp *dp = mb->dp;
    td_status st = TD_OK;
    for (size_t p = 0; p < dp->nparams && st == TD_OK; p++) {
        td_tensor *gr = td_model_grad(mb->model, p);
        td_buffer *gbuf = td_tensor_buffer(gr, NULL);
        size_t es = td_dtype_size(td_tensor_dtype(gr)), first, count, tail_first, tail;
        td_optimizer_shard_range(td_tensor_numel(gr), mb->rank, dp->size, &first, &count,
                                 &tail_first, &tail);
        if (count)
            st = td_buffer_copy(gbuf, first * es, td_tensor_buffer(mb->shard_grads[p], NULL), 0,
                                count * es);
        if (st == TD_OK && tail)
            st = td_allreduce(mb->g, gbuf, tail_first * es, gbuf, tail_first * es, tail,
                              td_tensor_dtype(gr), TD_REDUCE_SUM);
    }
    return st;
}

/* ZeRO-1 ------------------------------------------------------------------------ */

/* The largest numel of a parameter of m. */
static size_t largest_param(td_model *m) {
    size_t most = 1;
    for (size_t p = 0; p < td_model_param_count(m); p++)
        if (td_tensor_numel(td_model_param(m, p)) > most)
            most = td_tensor_numel(td_model_param(m, p));
    return most;
}

/* Sums every member's part of the squared gradient norm (the optimizer's
 * reducer, called on the member's thread during the step). */
static td_status sum_over_members(void *arg, const double *terms, size_t n, double *sumsq) {
    dp_member *mb = arg;
    td_status st;
    (void)terms;
    (void)n;
    if ((st = td_tensor_write_f64(mb->scalar, sumsq, 1)) != TD_OK ||
        (st = td_allreduce_tensor(mb->g, mb->scalar, TD_REDUCE_SUM)) != TD_OK)
        return st;
    return td_tensor_read_f64(mb->scalar, sumsq, 1);
}

/* The member's optimizer for its shard, and the buffers a step needs. */
td_status td__dp_create_shard_state(dp_member *mb, const td_optimizer_config *opt, int rank,
                                    int size) {
    size_t n = td_model_param_count(mb->model);
    td_status st;
    if ((st = td_optimizer_create_shard(mb->model, opt, rank, size, &mb->opt)) != TD_OK)
        return st;
    td_optimizer_set_sumsq_reduce(mb->opt, sum_over_members, mb);
    mb->shard_grads = td__calloc(sizeof *mb->shard_grads * (n ? n : 1), "gradient shards");
    if (!mb->shard_grads)
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t p = 0; p < n; p++) {
        td_tensor *gr = td_model_grad(mb->model, p);
        size_t first, count, tail_first, tail;
        int64_t len;
        td_optimizer_shard_range(td_tensor_numel(gr), rank, size, &first, &count, &tail_first,
                                 &tail);
        len = (int64_t)count;
        if (count && (st = td_tensor_create(mb->dev, td_tensor_dtype(gr), 1, &len,
                                            &mb->shard_grads[p])) != TD_OK)
            return st;
    }
    return TD_OK;
}

/* After the update: every member's shard of the weights to all. */
td_status td__dp_gather_weights(dp_member *mb) {
    td_dp *dp = mb->dp;
    td_status st = TD_OK;
    if (dp->size == 1)
        return TD_OK;
    for (size_t p = 0; p < dp->nparams && st == TD_OK; p++) {
        td_tensor *w = td_model_param(mb->model, p);
        size_t first, count, tail_first, tail;
        td_optimizer_shard_range(td_tensor_numel(w), mb->rank, dp->size, &first, &count,
                                 &tail_first, &tail);
        if (count)
            st = td_allgather(mb->g, NULL, 0, td_tensor_buffer(w, NULL), 0, count,
                              td_tensor_dtype(w));
    }
    return st;
}

/* The whole optimizer state and the members' ---------------------------------- */

typedef struct whole_work {
    td_dp *dp;
    td_optimizer *whole; /* on rank 0's process; NULL elsewhere */
    int to_whole;        /* 1: gather into it; 0: scatter from it */
} whole_work;

/* State tensor i of a member's optimizer to or from the whole one, through
 * tmp (a parameter's numel elements): each member's own elements, and the
 * tail from rank 0 (every member holds the same). */
static td_status move_state(dp_member *mb, whole_work *ww, size_t i, td_tensor *tmp) {
    td_tensor *mine = td_optimizer_state(mb->opt, i);
    td_tensor *whole = mb->rank == 0 && ww->whole ? td_optimizer_state(ww->whole, i) : NULL;
    size_t per = td_optimizer_state_count(mb->opt) / ww->dp->nparams;
    size_t numel = td_tensor_numel(td_model_param(mb->model, i / per));
    /* whole's buffer is NULL when whole is */
    td_buffer *mbuf = td_tensor_buffer(mine, NULL), *wbuf = td_tensor_buffer(whole, NULL);
    td_buffer *tbuf = td_tensor_buffer(tmp, NULL);
    td_dtype dtype = td_tensor_dtype(mine);
    size_t es = td_dtype_size(dtype), first, count, tail_first, tail;
    int shards = td_optimizer_shard_count(mb->opt);
    td_status st = TD_OK;
    td_optimizer_shard_range(numel, td_optimizer_shard_rank(mb->opt), shards, &first, &count,
                             &tail_first, &tail);
    if (ww->to_whole) {
        if (shards == 1) /* replicated: rank 0's is the state */
            return whole ? td_buffer_copy(wbuf, 0, mbuf, 0, numel * es) : TD_OK;
        if (count && (st = td_allgather(mb->g, mbuf, 0, tbuf, 0, count, dtype)) != TD_OK)
            return st;
        if (whole && count)
            st = td_buffer_copy(wbuf, 0, tbuf, 0, tail_first * es);
        if (whole && tail && st == TD_OK)
            st = td_buffer_copy(wbuf, tail_first * es, mbuf, count * es, tail * es);
        return st;
    }
    if (whole && (st = td_buffer_copy(tbuf, 0, wbuf, 0, numel * es)) != TD_OK)
        return st;
    if ((st = td_broadcast(mb->g, tbuf, 0, tbuf, 0, numel, dtype, 0)) != TD_OK)
        return st;
    if (count && (st = td_buffer_copy(mbuf, 0, tbuf, first * es, count * es)) != TD_OK)
        return st;
    return tail ? td_buffer_copy(mbuf, count * es, tbuf, tail_first * es, tail * es) : TD_OK;
}

static td_status move_member_state(td_group *g, td_device *dev, int rank, int size, void *arg) {
    whole_work *ww = arg;
    dp_member *mb = td__dp_member(ww->dp, rank);
    int64_t most = (int64_t)largest_param(mb->model);
    td_tensor *tmp = NULL;
    double steps;
    td_status st;
    (void)g, (void)dev, (void)size;
    mb->g = ww->dp->g;
    if ((st = td_tensor_create(mb->dev, td_model_dtype(mb->model), 1, &most, &tmp)) != TD_OK)
        return st;
    for (size_t i = 0; i < td_optimizer_state_count(mb->opt) && st == TD_OK; i++)
        st = move_state(mb, ww, i, tmp);
    td_tensor_destroy(tmp);
    if (st != TD_OK || ww->to_whole)
        return st;
    /* The step count too, which the learning-rate schedule and AdamW use. */
    steps = mb->rank == 0 && ww->whole ? (double)td_optimizer_steps(ww->whole) : 0;
    if ((st = td_tensor_write_f64(mb->scalar, &steps, 1)) != TD_OK ||
        (st = td_broadcast_tensor(g, mb->scalar, 0)) != TD_OK ||
        (st = td_tensor_read_f64(mb->scalar, &steps, 1)) != TD_OK)
        return st;
    td_optimizer_set_steps(mb->opt, (int64_t)steps);
    return TD_OK;
}

static td_status move_whole(td_dp *dp, td_optimizer *whole, int to_whole, const char *what) {
    whole_work ww = {dp, whole, to_whole};
    dp_member *root;
    td_status st;
    if (!dp)
        return td__error(TD_ERR_INVALID_ARG, "%s: dp is NULL", what);
    root = td__dp_member(dp, 0);
    if (whole && (!root || td_optimizer_shard_count(whole) != 1 ||
                  td_optimizer_state_count(whole) != td_optimizer_state_count(root->opt)))
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: needs a whole optimizer of the replicas' kind, given by the "
                         "process that holds rank 0",
                         what);
    /* A parked replica would hand on stale state. */
    if ((st = td_dp_refresh(dp)) != TD_OK)
        return st;
    if (to_whole && whole)
        td_optimizer_set_steps(whole, td_optimizer_steps(root->opt));
    return td__dp_run_on(dp, dp->g, move_member_state, &ww);
}

td_status td_dp_gather_optimizer(td_dp *dp, td_optimizer *whole) {
    return move_whole(dp, whole, 1, "td_dp_gather_optimizer");
}

td_status td_dp_scatter_optimizer(td_dp *dp, td_optimizer *whole) {
    return move_whole(dp, whole, 0, "td_dp_scatter_optimizer");
}
