/* The `data` strategy (and `alternate` for evaluation): replicas on every
 * member of a group, batches split by measured speed, gradients all-reduced
 * in buckets while backward goes on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "tandem/parallel.h"
#include "tensor/ops.h"
#include "tensor/tensor-impl.h"

/* Per rank and step, gathered on every member: loss sum, correct, count,
 * compute seconds, communication seconds (calibration: the quarter batch's
 * seconds) and the update's seconds. */
#define STAT_WORDS 6

typedef struct bucket {
    size_t first, count; /* parameters [first, first + count) */
} bucket;

typedef struct dp_member {
    td_device *dev;
    int rank;
    int cpu; /* a CPU device: reduces with the cores it computes on */
    td_model *model;
    td_optimizer *opt;
    td_tensor *stats_send; /* (STAT_WORDS) f64 */
    td_tensor *stats_all;  /* (size, STAT_WORDS) f64 */

    /* ZeRO-1: where the reduce-scatter puts this member's shard of each
     * gradient (NULL where the shard is empty; one per parameter, since
     * several can be in flight during backward), and one number shared with
     * the others (a squared norm, a step count). */
    td_tensor **shard_grads;
    td_tensor *scalar;

    /* Buckets in flight during one step. */
    struct td_dp *dp;
    td_group *g;
    unsigned char *ready; /* per parameter */
    size_t next_bucket;
    td_comm_request **reqs; /* per parameter */
    td_status hook_status;
    uint64_t all_started_ns; /* when the last bucket started: backward's end (td_clock_ns) */
    int buckets_in_backward; /* of this step's, started from backward's gradient hook */

    /* Deterministic mode: one gradient copy per chunk this member runs. */
    td_tensor ***chunk_grads; /* [chunk slot][param] */
    size_t chunk_slots;
    td_tensor *chunk_results; /* (chunks, 3) f64: loss, correct, count per chunk */
    td_tensor *chunk_results_all;

    /* With overlap, how long this step's reductions ran (reduce_s) and how
     * much of that after backward's end (exposed_s). */
    double reduce_s, exposed_s;
} dp_member;

struct td_dp {
    td_group *g;
    int size;
    td_dp_config cfg;
    td_dtype stat_dtype;
    dp_member *members; /* local ones */
    int nlocal;
    td_balancer *balancer;
    bucket *buckets;
    size_t nbuckets, nparams;
    int64_t labels_per_sample;
    int64_t features; /* floats per sample for feature inputs */
    int64_t tokens;   /* tokens per sample for token inputs */
    int overlap;      /* resolved for the members of this step (cfg.overlap may be -1) */

    /* Parking: members the balancer leaves out sit out whole steps, so the
     * steps run on a group of the others (made when the set changes), and
     * the parked replicas fall behind until refreshed. */
    td_group *active;                               /* NULL: the whole group */
    unsigned char active_parked[TD_DP_MAX_MEMBERS]; /* the set `active` leaves out */
    unsigned char stale[TD_DP_MAX_MEMBERS];

    /* The group of the last td_group_run: dp->g or `active`. After a
     * failure it alone knows who failed (td_dp_survivors). */
    td_group *ran;
};

/* Work handed to members through td_group_run. */
typedef struct dp_work {
    td_dp *dp;
    const td_batch *batch;
    const int64_t *counts;   /* samples (or chunks) per rank */
    const int64_t *offsets;  /* first sample (or chunk) per rank */
    const int *ranks;        /* rank in the group run -> rank in dp->g; NULL: the same */
    const dp_member *reader; /* the member that copies the gathered numbers to rows */
    double *rows;            /* (dp->size, STAT_WORDS) */
    double *chunk_rows;      /* deterministic mode: (chunks, 3) */
    int root;                /* broadcast_replicas: the rank whose state the others take */
    uint64_t step;
    /* evaluate */
    const td_batch *batches;
    const int *owner;
    size_t nbatches;
    td_step_result *per_batch;
    /* create */
    const char *json, *name;
    td_dtype dtype;
    uint64_t seed;
    const td_optimizer_config *opt;
} dp_work;

static dp_member *member_of(td_dp *dp, int rank) {
    for (int i = 0; i < dp->nlocal; i++)
        if (dp->members[i].rank == rank)
            return &dp->members[i];
    return NULL;
}

/* td_group_run on g (dp->g or dp->active), noted for td_dp_survivors. */
static td_status run_on(td_dp *dp, td_group *g, td_group_fn fn, void *arg) {
    dp->ran = g;
    return td_group_run(g, fn, arg);
}

/* The part [offset, offset + n) of a host batch. */
static td_batch slice_of(const td_dp *dp, const td_batch *b, int64_t offset, int64_t n) {
    td_batch s;
    s.n = n;
    s.x = b->x ? b->x + offset * dp->features : NULL;
    s.tokens = b->tokens ? b->tokens + offset * dp->tokens : NULL;
    s.labels = b->labels + offset * dp->labels_per_sample;
    return s;
}

/* Buckets --------------------------------------------------------------------- */

/* Reverse layer order, as backward makes them: the last parameters first.
 * The first bucket is small so the first reduction starts early. */
static td_status plan_buckets(td_dp *dp, td_model *m) {
    size_t n = td_model_param_count(m), bytes = 0, hi = n;
    dp->nparams = n;
    dp->buckets = td__calloc(sizeof *dp->buckets * (n ? n : 1), "gradient buckets");
    if (!dp->buckets)
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = n; i-- > 0;) {
        size_t limit = dp->nbuckets == 0 ? dp->cfg.first_bucket_bytes : dp->cfg.bucket_bytes;
        bytes += td_tensor_nbytes(td_model_grad(m, i));
        if (bytes >= limit || i == 0) {
            dp->buckets[dp->nbuckets++] = (bucket){i, hi - i};
            hi = i;
            bytes = 0;
        }
    }
    return TD_OK;
}

/* Parameter p's gradient summed over the members: the whole of it, or with
 * ZeRO-1 this member's shard, into shard_grads[p] (place_shards puts it in
 * place). Started asynchronously with overlap, else run here. */
static td_status start_reduction(dp_member *mb, size_t p) {
    td_dp *dp = mb->dp;
    td_tensor *gr = td_model_grad(mb->model, p);
    td_collective c = {TD_COLL_ALLREDUCE, gr->buf,       0, gr->buf, 0, gr->numel,
                       gr->dtype,         TD_REDUCE_SUM, 0};
    if (dp->cfg.zero) {
        if (!mb->shard_grads[p])
            return TD_OK;
        c.kind = TD_COLL_REDUCE_SCATTER;
        c.recv = mb->shard_grads[p]->buf;
        c.count = mb->shard_grads[p]->numel;
    }
    return dp->overlap ? td_collective_start(mb->g, &c, &mb->reqs[p])
                       : td_collective_run(mb->g, &c);
}

static void launch_ready_buckets(dp_member *mb) {
    td_dp *dp = mb->dp;
    while (mb->next_bucket < dp->nbuckets && mb->hook_status == TD_OK) {
        const bucket *b = &dp->buckets[mb->next_bucket];
        for (size_t p = b->first; p < b->first + b->count; p++)
            if (!mb->ready[p])
                return;
        if (mb->next_bucket + 1 == dp->nbuckets)
            mb->all_started_ns = td_clock_ns();
        for (size_t p = b->first; p < b->first + b->count; p++) {
            td_status st = start_reduction(mb, p);
            if (st != TD_OK) {
                mb->hook_status = st;
                return;
            }
        }
        mb->next_bucket++;
    }
}

static void on_grads_ready(void *arg, size_t first, size_t count) {
    dp_member *mb = arg;
    for (size_t p = first; p < first + count && p < mb->dp->nparams; p++)
        mb->ready[p] = 1;
    launch_ready_buckets(mb);
}

/* ZeRO-1, once the reduce-scatters are done: each shard into its place in
 * the gradient, and the tails (the elements past the last whole shard,
 * which every member keeps) summed whole. */
static td_status place_shards(dp_member *mb) {
    td_dp *dp = mb->dp;
    td_status st = TD_OK;
    for (size_t p = 0; p < dp->nparams && st == TD_OK; p++) {
        td_tensor *gr = td_model_grad(mb->model, p);
        size_t es = td_dtype_size(gr->dtype), first, count, tail_first, tail;
        td_optimizer_shard_range(gr->numel, mb->rank, dp->size, &first, &count, &tail_first, &tail);
        if (count)
            st = td_buffer_copy(gr->buf, first * es, mb->shard_grads[p]->buf, 0, count * es);
        if (st == TD_OK && tail)
            st = td_allreduce(mb->g, gr->buf, tail_first * es, gr->buf, tail_first * es, tail,
                              gr->dtype, TD_REDUCE_SUM);
    }
    return st;
}

/* Adds a finished request's run to the member's reduction time, and the
 * part of it after backward's end (the last bucket's start) to the exposed
 * time. By the clock, not by when the member's thread came back from
 * backward: a collective engine sharing the member's core may have run the
 * last bucket before that. */
static void count_run(dp_member *mb, td_comm_request *req) {
    uint64_t began, ended, end_of_backward = mb->all_started_ns;
    if (td_comm_request_times(req, &began, &ended) != TD_OK)
        return;
    mb->reduce_s += (double)(ended - began) * 1e-9;
    if (ended > end_of_backward)
        mb->exposed_s +=
            (double)(ended - (began > end_of_backward ? began : end_of_backward)) * 1e-9;
}

/* Marks every gradient ready, starts what is left and waits for all.
 * Without overlap the reductions run right here on the member's thread: an
 * asynchronous start would only add a hand-off to the collective engine. */
static td_status finish_reductions(dp_member *mb) {
    td_dp *dp = mb->dp;
    td_status st = mb->hook_status, wst;
    mb->buckets_in_backward = (int)mb->next_bucket; /* the hook's, as backward has ended */
    mb->reduce_s = mb->exposed_s = 0;
    if (dp->cfg.zero && dp->size == 1) /* one shard: the gradient is the sum */
        return st;
    if (!dp->overlap) {
        for (size_t p = 0; p < dp->nparams && st == TD_OK; p++)
            st = start_reduction(mb, p);
    } else {
        memset(mb->ready, 1, dp->nparams);
        if (st == TD_OK)
            launch_ready_buckets(mb);
        st = st ? st : mb->hook_status;
        for (size_t p = 0; p < dp->nparams; p++) {
            if (!mb->reqs[p])
                continue;
            wst = td_comm_wait(mb->reqs[p]);
            if (st == TD_OK)
                st = wst;
            count_run(mb, mb->reqs[p]);
            td_comm_request_destroy(mb->reqs[p]);
            mb->reqs[p] = NULL;
        }
    }
    if (st == TD_OK && dp->cfg.zero) {
        uint64_t began = td_clock_ns();
        double took;
        st = place_shards(mb);
        took = (double)(td_clock_ns() - began) * 1e-9;
        mb->reduce_s += took;
        mb->exposed_s += took;
    }
    return st;
}

/* Creation ------------------------------------------------------------------- */

/* Overlapping pays when something other than the compute cores moves the
 * bytes: a GPU's copy engines, a network. CPU devices of one process reduce
 * with their own cores, so a reduction started during backward only competes
 * with backward for them (measured on 2 cores: slower, and the shares drift);
 * there the reduction waits for backward's end. Decided for the members
 * that take part (parked: nonzero entries of parked, which may be NULL). */
static int resolve_overlap(const td_dp *dp, const unsigned char *parked) {
    if (dp->cfg.overlap >= 0)
        return dp->cfg.overlap;
    if (dp->nlocal != dp->size)
        return 1;
    for (int i = 0; i < dp->nlocal; i++)
        if (!(parked && parked[dp->members[i].rank]) && !dp->members[i].cpu)
            return 1;
    return 0;
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
static td_status sum_over_members(void *arg, double *sumsq) {
    dp_member *mb = arg;
    td_status st;
    if ((st = td_tensor_write_f64(mb->scalar, sumsq, 1)) != TD_OK ||
        (st = td_allreduce_tensor(mb->g, mb->scalar, TD_REDUCE_SUM)) != TD_OK)
        return st;
    return td_tensor_read_f64(mb->scalar, sumsq, 1);
}

/* The member's optimizer for its shard, and the buffers a step needs. */
static td_status create_shard_state(dp_member *mb, const td_optimizer_config *opt, int rank,
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
        td_optimizer_shard_range(gr->numel, rank, size, &first, &count, &tail_first, &tail);
        len = (int64_t)count;
        if (count &&
            (st = td_tensor_create(mb->dev, gr->dtype, 1, &len, &mb->shard_grads[p])) != TD_OK)
            return st;
    }
    return TD_OK;
}

/* After the update: every member's shard of the weights to all. */
static td_status gather_weights(dp_member *mb) {
    td_dp *dp = mb->dp;
    td_status st = TD_OK;
    if (dp->size == 1)
        return TD_OK;
    for (size_t p = 0; p < dp->nparams && st == TD_OK; p++) {
        td_tensor *w = td_model_param(mb->model, p);
        size_t first, count, tail_first, tail;
        td_optimizer_shard_range(w->numel, mb->rank, dp->size, &first, &count, &tail_first, &tail);
        if (count)
            st = td_allgather(mb->g, NULL, 0, w->buf, 0, count, w->dtype);
    }
    return st;
}

static td_status create_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    dp_member *mb = member_of(dp, rank);
    int64_t shape[2] = {size, STAT_WORDS}, words = STAT_WORDS, one = 1;
    td_status st;
    if ((st = td_model_load_string(w->json, w->name, dev, w->dtype, w->seed, &mb->model)) != TD_OK)
        return st;
    if ((st = dp->cfg.zero ? create_shard_state(mb, w->opt, rank, size)
                           : td_optimizer_create(mb->model, w->opt, &mb->opt)) != TD_OK)
        return st;
    if ((st = td_tensor_create(dev, dp->stat_dtype, 1, &words, &mb->stats_send)) != TD_OK)
        return st;
    if ((st = td_tensor_create(dev, dp->stat_dtype, 2, shape, &mb->stats_all)) != TD_OK ||
        (st = td_tensor_create(dev, dp->stat_dtype, 1, &one, &mb->scalar)) != TD_OK)
        return st;
    return TD_OK;
}

static td_status broadcast_replicas(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    dp_member *mb = member_of(w->dp, rank);
    td_status st;
    for (size_t p = 0; p < td_model_param_count(mb->model); p++)
        if ((st = td_broadcast_tensor(g, td_model_param(mb->model, p), w->root)) != TD_OK)
            return st;
    /* ZeRO-1 shards differ by design: td_dp_scatter_optimizer sets them. */
    for (size_t s = 0; !w->dp->cfg.zero && s < td_optimizer_state_count(mb->opt); s++)
        if ((st = td_broadcast_tensor(g, td_optimizer_state(mb->opt, s), w->root)) != TD_OK)
            return st;
    return TD_OK;
}

static int64_t product(const int64_t *shape, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= shape[i];
    return p;
}

td_status td_dp_create(td_group *g, const char *model_json, const char *name, td_dtype dtype,
                       uint64_t seed, const td_optimizer_config *opt, const td_dp_config *cfg,
                       td_dp **out) {
    td_dp_config def = TD_DP_CONFIG_INIT;
    td_dp *dp = NULL;
    dp_work w;
    td_status st;
    const char **names = NULL;
    int64_t shape[TD_MAX_DIMS];
    int ndim;
    *out = NULL;
    if (!g || !model_json)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_create: group or model is NULL");
    dp = td__calloc(sizeof *dp, "data-parallel state");
    if (!dp)
        return TD_ERR_OUT_OF_MEMORY;
    dp->g = g;
    dp->size = td_group_size(g);
    dp->cfg = cfg ? *cfg : def;
    if (dp->cfg.chunk_samples < 1)
        dp->cfg.chunk_samples = def.chunk_samples;
    if (dp->cfg.zero && dp->cfg.deterministic) {
        st = td__error(TD_ERR_INVALID_ARG,
                       "data parallel: ZeRO-1 and deterministic mode do not go together (the "
                       "deterministic chain reduces whole gradients)");
        goto fail;
    }
    if (dp->size > TD_DP_MAX_MEMBERS) {
        st = td__error(TD_ERR_INVALID_ARG, "data parallel: %d members (at most %d)", dp->size,
                       TD_DP_MAX_MEMBERS);
        goto fail;
    }
    dp->members = td__calloc(sizeof *dp->members * (size_t)dp->size, "data-parallel members");
    names = td__calloc(sizeof *names * (size_t)dp->size, "device names");
    if (!dp->members || !names) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    dp->stat_dtype = TD_F64;
    for (int r = 0; r < dp->size; r++) {
        td_device *dev = td_group_device(g, r);
        names[r] = dev ? td_device_name(dev) : "remote";
        if (!dev)
            continue;
        if (!td_device_supports_f64(dev))
            dp->stat_dtype = TD_F32;
        dp->members[dp->nlocal].dev = dev;
        dp->members[dp->nlocal].rank = r;
        {
            td_device_info info;
            dp->members[dp->nlocal].cpu =
                td_device_get_info(dev, &info) == TD_OK && !strcmp(info.backend, "cpu");
        }
        dp->members[dp->nlocal].dp = dp;
        dp->members[dp->nlocal].g = g;
        dp->nlocal++;
    }
    dp->overlap = resolve_overlap(dp, NULL);
    /* Parking runs steps on a group of the unparked members, which a
     * process cannot make alone when the group spans several. */
    if (dp->nlocal != dp->size)
        dp->cfg.balancer.park = 0;
    TD_TRY(td_balancer_create(dp->size, names, &dp->cfg.balancer, &dp->balancer));
    memset(&w, 0, sizeof w);
    w.dp = dp;
    w.json = model_json;
    w.name = name ? name : "(model)";
    w.dtype = dtype;
    w.seed = seed;
    w.opt = opt;
    TD_TRY(td_group_run(g, create_member, &w));
    TD_TRY(plan_buckets(dp, dp->members[0].model));
    ndim = td_model_input_shape(dp->members[0].model, shape);
    if (td_model_input_kind(dp->members[0].model) == TD_INPUT_TOKENS) {
        dp->tokens = product(shape, ndim);
        dp->labels_per_sample = dp->tokens;
    } else {
        dp->features = product(shape, ndim);
        dp->labels_per_sample = 1;
    }
    for (int i = 0; i < dp->nlocal; i++) {
        dp_member *mb = &dp->members[i];
        mb->ready = td__calloc(dp->nparams + 1, "gradient bucket state");
        mb->reqs = td__calloc(sizeof *mb->reqs * (dp->nparams + 1), "gradient bucket state");
        if (!mb->ready || !mb->reqs) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
    }
    TD_TRY(td_group_run(g, broadcast_replicas, &w));
    free(names);
    *out = dp;
    return TD_OK;
fail:
    free(names);
    td_dp_destroy(dp);
    return st;
}

static void free_chunk_grads(dp_member *mb, size_t nparams) {
    for (size_t c = 0; c < mb->chunk_slots; c++) {
        for (size_t p = 0; mb->chunk_grads[c] && p < nparams; p++)
            td_tensor_destroy(mb->chunk_grads[c][p]);
        free(mb->chunk_grads[c]);
    }
    free(mb->chunk_grads);
    mb->chunk_grads = NULL;
    mb->chunk_slots = 0;
}

void td_dp_destroy(td_dp *dp) {
    if (!dp)
        return;
    for (int i = 0; i < dp->nlocal; i++) {
        dp_member *mb = &dp->members[i];
        free_chunk_grads(mb, dp->nparams);
        td_tensor_destroy(mb->chunk_results);
        td_tensor_destroy(mb->chunk_results_all);
        td_tensor_destroy(mb->stats_send);
        td_tensor_destroy(mb->stats_all);
        /* dp->nparams is unset when creation failed before the buckets */
        for (size_t p = 0; mb->shard_grads && p < td_model_param_count(mb->model); p++)
            td_tensor_destroy(mb->shard_grads[p]);
        free(mb->shard_grads);
        td_tensor_destroy(mb->scalar);
        td_optimizer_destroy(mb->opt);
        td_model_destroy(mb->model);
        free(mb->ready);
        free(mb->reqs);
    }
    free(dp->members);
    free(dp->buckets);
    td_balancer_destroy(dp->balancer);
    td_group_destroy(dp->active);
    free(dp);
}

td_model *td_dp_model(td_dp *dp, int rank) {
    dp_member *mb = dp ? member_of(dp, rank) : NULL;
    return mb ? mb->model : NULL;
}

td_optimizer *td_dp_optimizer(td_dp *dp, int rank) {
    dp_member *mb = dp ? member_of(dp, rank) : NULL;
    return mb ? mb->opt : NULL;
}

td_balancer *td_dp_balancer(td_dp *dp) {
    return dp ? dp->balancer : NULL;
}
td_group *td_dp_group(td_dp *dp) {
    return dp ? dp->g : NULL;
}

/* Every replica takes rank root's weights, optimizer state and step count. */
static td_status sync_from(td_dp *dp, int root) {
    dp_work w;
    td_optimizer *src = td_dp_optimizer(dp, root);
    td_status st;
    memset(&w, 0, sizeof w);
    w.dp = dp;
    w.root = root;
    if ((st = run_on(dp, dp->g, broadcast_replicas, &w)) != TD_OK)
        return st;
    for (int i = 0; i < dp->nlocal && src; i++)
        td_optimizer_set_steps(dp->members[i].opt, td_optimizer_steps(src));
    memset(dp->stale, 0, sizeof dp->stale);
    return TD_OK;
}

td_status td_dp_sync_replicas(td_dp *dp) {
    if (!dp)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_sync_replicas: dp is NULL");
    return sync_from(dp, 0);
}

td_status td_dp_refresh(td_dp *dp) {
    if (!dp)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_refresh: dp is NULL");
    for (int r = 0; r < dp->size; r++)
        if (dp->stale[r]) {
            int root = 0;
            while (dp->stale[root])
                root++;
            TD_LOG_INFO("data parallel: %s catches up from %s",
                        td_device_name(td_group_device(dp->g, r)),
                        td_device_name(td_group_device(dp->g, root)));
            return sync_from(dp, root);
        }
    return TD_OK;
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
    size_t es = td_dtype_size(mine->dtype), first, count, tail_first, tail;
    int shards = td_optimizer_shard_count(mb->opt);
    td_status st = TD_OK;
    td_optimizer_shard_range(numel, td_optimizer_shard_rank(mb->opt), shards, &first, &count,
                             &tail_first, &tail);
    if (ww->to_whole) {
        if (shards == 1) /* replicated: rank 0's is the state */
            return whole ? td_buffer_copy(whole->buf, 0, mine->buf, 0, numel * es) : TD_OK;
        if (count &&
            (st = td_allgather(mb->g, mine->buf, 0, tmp->buf, 0, count, mine->dtype)) != TD_OK)
            return st;
        if (whole && count)
            st = td_buffer_copy(whole->buf, 0, tmp->buf, 0, tail_first * es);
        if (whole && tail && st == TD_OK)
            st = td_buffer_copy(whole->buf, tail_first * es, mine->buf, count * es, tail * es);
        return st;
    }
    if (whole && (st = td_buffer_copy(tmp->buf, 0, whole->buf, 0, numel * es)) != TD_OK)
        return st;
    if ((st = td_broadcast(mb->g, tmp->buf, 0, tmp->buf, 0, numel, mine->dtype, 0)) != TD_OK)
        return st;
    if (count && (st = td_buffer_copy(mine->buf, 0, tmp->buf, first * es, count * es)) != TD_OK)
        return st;
    return tail ? td_buffer_copy(mine->buf, count * es, tmp->buf, tail_first * es, tail * es)
                : TD_OK;
}

static td_status move_member_state(td_group *g, td_device *dev, int rank, int size, void *arg) {
    whole_work *ww = arg;
    dp_member *mb = member_of(ww->dp, rank);
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
    root = member_of(dp, 0);
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
    return run_on(dp, dp->g, move_member_state, &ww);
}

td_status td_dp_gather_optimizer(td_dp *dp, td_optimizer *whole) {
    return move_whole(dp, whole, 1, "td_dp_gather_optimizer");
}

td_status td_dp_scatter_optimizer(td_dp *dp, td_optimizer *whole) {
    return move_whole(dp, whole, 0, "td_dp_scatter_optimizer");
}

/* Sharing per-rank numbers ------------------------------------------------------ */

/* Every member contributes STAT_WORDS numbers; all get everyone's. The
 * run's reader (one member) also copies them to the host, here on its own
 * thread: read from the caller's, they would cost a round trip to it. The
 * host copy has a row per rank of the run, then rows left from earlier runs,
 * dp->size in all. */
static td_status gather_stats(td_group *g, dp_member *mb, const dp_work *w,
                              const double v[STAT_WORDS]) {
    td_status st;
    if ((st = td_tensor_write_f64(mb->stats_send, v, STAT_WORDS)) != TD_OK)
        return st;
    if ((st = td_allgather(g, mb->stats_send->buf, 0, mb->stats_all->buf, 0, STAT_WORDS,
                           mb->stats_send->dtype)) != TD_OK)
        return st;
    if (mb != w->reader)
        return TD_OK;
    return td_tensor_read_f64(mb->stats_all, w->rows, (size_t)mb->dp->size * STAT_WORDS);
}

/* Calibration ----------------------------------------------------------------- */

#define CALIBRATION_WARMUP 1
#define CALIBRATION_RUNS   3

/* The fastest of CALIBRATION_RUNS passes over batch, after a warm-up. */
static td_status time_passes(dp_member *mb, const td_batch *batch, double *out) {
    td_step_result r;
    td_status st;
    *out = INFINITY;
    for (int i = 0; i < CALIBRATION_WARMUP + CALIBRATION_RUNS; i++) {
        uint64_t c0 = td_clock_ns();
        if ((st = td_model_train_step(mb->model, batch, 1.0, 0, 0, &r)) != TD_OK)
            return st;
        if (i >= CALIBRATION_WARMUP)
            *out = fmin(*out, (double)(td_clock_ns() - c0) * 1e-9);
    }
    return TD_OK;
}

/* Each member times forward and backward on the whole batch and on a
 * quarter of it: two points of its cost line. */
static td_status calibrate_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    dp_member *mb = member_of(w->dp, rank);
    td_batch part = slice_of(w->dp, w->batch, 0, w->batch->n >= 4 ? w->batch->n / 4 : w->batch->n);
    double v[STAT_WORDS] = {0};
    td_status st;
    td_model_set_grad_hook(mb->model, NULL, NULL);
    if ((st = time_passes(mb, w->batch, &v[3])) != TD_OK ||
        (st = time_passes(mb, &part, &v[4])) != TD_OK)
        return st;
    return gather_stats(g, mb, w, v);
}

/* The line through (n1, t1) and (n2, t2), n1 > n2: fixed + per_sample * n,
 * neither negative and per_sample above zero. A flat or falling line (the
 * per-sample part is below the timing noise) is all fixed cost; one that
 * would cross zero above the origin is all per-sample. */
static void fit_costs(double n1, double t1, double n2, double t2, double *fixed, double *per) {
    if (n1 <= n2) {
        *per = t1 / n1;
        *fixed = 0;
        return;
    }
    *per = (t1 - t2) / (n1 - n2);
    if (!(*per > 1e-3 * t1 / n1))
        *per = 1e-3 * t1 / n1;
    *fixed = t1 - *per * n1;
    if (*fixed < 0) {
        *per = t1 / n1;
        *fixed = 0;
    }
}

td_status td_dp_calibrate(td_dp *dp, const td_batch *batch) {
    dp_work w;
    double all[TD_DP_MAX_MEMBERS * STAT_WORDS], fixed[TD_DP_MAX_MEMBERS], per[TD_DP_MAX_MEMBERS];
    double n1, n2;
    td_status st;
    if (!dp || !batch || batch->n < 1)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_calibrate: needs a batch of samples");
    /* Every member measures, parked or not: a calibration starts afresh. */
    if ((st = td_dp_refresh(dp)) != TD_OK)
        return st;
    memset(&w, 0, sizeof w);
    w.dp = dp;
    w.batch = batch;
    w.reader = &dp->members[0];
    w.rows = all;
    if ((st = run_on(dp, dp->g, calibrate_member, &w)) != TD_OK)
        return st;
    n1 = (double)batch->n;
    n2 = (double)(batch->n >= 4 ? batch->n / 4 : batch->n);
    for (int r = 0; r < dp->size; r++)
        fit_costs(n1, fmax(all[r * STAT_WORDS + 3], 1e-9), n2, fmax(all[r * STAT_WORDS + 4], 1e-9),
                  &fixed[r], &per[r]);
    if ((st = td_balancer_set_costs(dp->balancer, fixed, per)) != TD_OK)
        return st;
    for (int r = 0; r < dp->size; r++)
        TD_LOG_INFO("calibration: rank %d costs %.3g ms per pass plus %.3g ms per sample "
                    "(%.0f samples/s on %.0f)",
                    r, fixed[r] * 1e3, per[r] * 1e3, n1 / (fixed[r] + per[r] * n1), n1);
    return TD_OK;
}

/* A step ------------------------------------------------------------------------ */

/* A member's timings into its step numbers: compute from c0, communication
 * from c1, and the update from u0 until now. */
static void put_times(double v[STAT_WORDS], uint64_t c0, uint64_t c1, uint64_t u0) {
    v[3] = (double)(c1 - c0) * 1e-9;
    v[4] = (double)(u0 - c1) * 1e-9;
    v[5] = (double)(td_clock_ns() - u0) * 1e-9;
}

static td_status step_member(td_group *g, td_device *dev, int run_rank, int size, void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    int rank = w->ranks ? w->ranks[run_rank] : run_rank;
    dp_member *mb = member_of(dp, rank);
    td_batch slice = slice_of(dp, w->batch, w->offsets[rank], w->counts[rank]);
    double scale = 1.0 / (double)(w->batch->n * dp->labels_per_sample);
    td_step_result r = {0, 0, 0};
    double v[STAT_WORDS];
    uint64_t c0, c1, u0; /* compute, communication and update start */
    td_status st = TD_OK;

    mb->g = g; /* the whole group, or the unparked members' */
    mb->next_bucket = 0;
    mb->all_started_ns = 0;
    mb->hook_status = TD_OK;
    memset(mb->ready, 0, dp->nparams);
    td_model_set_grad_hook(mb->model, dp->overlap ? on_grads_ready : NULL, mb);
    c0 = td_clock_ns();
    if (slice.n > 0) {
        st = td_model_train_slice(mb->model, &slice, w->offsets[rank], scale, 0, w->step, &r);
    } else {
        /* A member with no samples this step adds zeros to the sum. */
        for (size_t p = 0; p < dp->nparams && st == TD_OK; p++)
            st = td_tensor_fill(td_model_grad(mb->model, p), 0.0);
    }
    c1 = td_clock_ns();
    if (st == TD_OK)
        st = finish_reductions(mb);
    else
        (void)finish_reductions(mb);
    u0 = td_clock_ns();
    if (st != TD_OK)
        return st;
    if ((st = td_optimizer_step(mb->opt, NULL)) != TD_OK)
        return st;
    if (dp->cfg.zero && (st = gather_weights(mb)) != TD_OK)
        return st;
    v[0] = r.loss_sum;
    v[1] = (double)r.correct;
    v[2] = (double)r.count;
    put_times(v, c0, c1, u0);
    return gather_stats(g, mb, w, v);
}

/* Deterministic mode: chunk gradients, then a chain in chunk order. */
static td_status ensure_chunk_slots(td_dp *dp, dp_member *mb, size_t slots) {
    td_status st;
    if (mb->chunk_slots >= slots)
        return TD_OK;
    free_chunk_grads(mb, dp->nparams);
    mb->chunk_grads = td__calloc(sizeof *mb->chunk_grads * slots, "chunk gradients");
    if (!mb->chunk_grads)
        return TD_ERR_OUT_OF_MEMORY;
    mb->chunk_slots = slots;
    for (size_t c = 0; c < slots; c++) {
        mb->chunk_grads[c] = td__calloc(sizeof **mb->chunk_grads * dp->nparams, "chunk gradients");
        if (!mb->chunk_grads[c])
            return TD_ERR_OUT_OF_MEMORY;
        for (size_t p = 0; p < dp->nparams; p++) {
            td_tensor *gr = td_model_grad(mb->model, p);
            if ((st = td_tensor_create(mb->dev, gr->dtype, gr->ndim, gr->shape,
                                       &mb->chunk_grads[c][p])) != TD_OK)
                return st;
        }
    }
    return TD_OK;
}

static td_status step_member_deterministic(td_group *g, td_device *dev, int rank, int size,
                                           void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    dp_member *mb = member_of(dp, rank);
    const int64_t C = dp->cfg.chunk_samples, B = w->batch->n;
    const int64_t nchunks = (B + C - 1) / C;
    double scale = 1.0 / (double)(B * dp->labels_per_sample);
    int64_t res_shape[2] = {nchunks, 3};
    double *res = NULL, v[STAT_WORDS] = {0};
    uint64_t c0, c1, u0; /* compute, communication and update start */
    td_status st;

    mb->g = g;
    td_model_set_grad_hook(mb->model, NULL, NULL);
    TD_TRY(ensure_chunk_slots(dp, mb, (size_t)(w->counts[rank] > 0 ? w->counts[rank] : 1)));
    if (!mb->chunk_results || td_tensor_dim(mb->chunk_results, 0) != nchunks) {
        td_tensor_destroy(mb->chunk_results);
        td_tensor_destroy(mb->chunk_results_all);
        mb->chunk_results = mb->chunk_results_all = NULL;
        TD_TRY(td_tensor_create(dev, dp->stat_dtype, 2, res_shape, &mb->chunk_results));
        TD_TRY(td_tensor_create(dev, dp->stat_dtype, 2, res_shape, &mb->chunk_results_all));
    }
    res = td__calloc(sizeof *res * (size_t)nchunks * 3, "chunk results");
    if (!res) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    c0 = td_clock_ns();
    for (int64_t k = 0; k < w->counts[rank]; k++) {
        int64_t chunk = w->offsets[rank] + k, first = chunk * C;
        int64_t n = B - first < C ? B - first : C;
        td_batch slice = slice_of(dp, w->batch, first, n);
        td_step_result r;
        TD_TRY(td_model_train_slice(mb->model, &slice, first, scale, 0, w->step, &r));
        for (size_t p = 0; p < dp->nparams; p++)
            TD_TRY(td__op_copy(td_model_grad(mb->model, p), mb->chunk_grads[k][p]));
        res[chunk * 3 + 0] = r.loss_sum;
        res[chunk * 3 + 1] = (double)r.correct;
        res[chunk * 3 + 2] = (double)r.count;
    }
    c1 = td_clock_ns();
    /* The chain: rank d folds its chunks, in order, into the running sum it
     * received, and hands it on; the fold order is the chunk order whatever
     * the ranks' shares. */
    for (int d = 0; d < size; d++) {
        if (w->counts[d] == 0)
            continue;
        if (d == rank) {
            for (int64_t k = 0; k < w->counts[rank]; k++)
                for (size_t p = 0; p < dp->nparams; p++) {
                    td_tensor *gr = td_model_grad(mb->model, p);
                    if (w->offsets[rank] + k == 0)
                        TD_TRY(td__op_copy(mb->chunk_grads[k][p], gr));
                    else
                        TD_TRY(td__op_axpby(1.0, mb->chunk_grads[k][p], 1.0, gr));
                }
        }
        for (size_t p = 0; p < dp->nparams; p++)
            TD_TRY(td_broadcast_tensor(g, td_model_grad(mb->model, p), d));
    }
    u0 = td_clock_ns();
    TD_TRY(td_optimizer_step(mb->opt, NULL));
    put_times(v, c0, c1, u0);
    /* Each chunk's numbers come from one rank and zeros from the others, so
     * the sum is exact; the fold over chunks happens in order on the host. */
    TD_TRY(td_tensor_write_f64(mb->chunk_results, res, (size_t)nchunks * 3));
    TD_TRY(td_allreduce(g, mb->chunk_results->buf, 0, mb->chunk_results_all->buf, 0,
                        (size_t)nchunks * 3, dp->stat_dtype, TD_REDUCE_SUM));
    if (mb == w->reader)
        TD_TRY(td_tensor_read_f64(mb->chunk_results_all, w->chunk_rows, (size_t)nchunks * 3));
    st = gather_stats(g, mb, w, v);
fail:
    free(res);
    return st;
}

/* Whether member r is parked this step (deterministic mode never parks). */
static int is_parked(const td_dp *dp, int r) {
    return !dp->cfg.deterministic && td_balancer_parked(dp->balancer, r);
}

/* Whether a parked member sits the whole step out: it leaves the group and
 * its replica falls behind, unless ZeRO-1 keeps it in for its shard. */
static int sits_out(const td_dp *dp, int r) {
    return is_parked(dp, r) && !dp->cfg.zero;
}

static void fill_stats(td_dp *dp, const double *all, const int64_t *counts, double step_s,
                       int64_t total, td_dp_stats *stats) {
    /* The share of its reductions' time that ran before backward ended, on
     * the member of this process whose backward ended last: the others'
     * reductions include waiting for it, which is not communication. */
    const dp_member *last = NULL;
    memset(stats, 0, sizeof *stats);
    stats->members = dp->size;
    stats->step_s = step_s;
    stats->ideal_s = td_balancer_ideal_seconds(dp->balancer, total);
    for (int r = 0; r < dp->size; r++) {
        td_dp_member_stats *m = &stats->m[r];
        dp_member *mb = member_of(dp, r);
        m->samples = counts[r];
        m->share = total ? (double)counts[r] / (double)total : 0;
        m->parked = is_parked(dp, r);
        /* A member that sat the step out has a row of zeros. */
        m->compute_s = all[r * STAT_WORDS + 3];
        m->comm_s = all[r * STAT_WORDS + 4];
        m->update_s = all[r * STAT_WORDS + 5];
        m->wait_s =
            sits_out(dp, r) ? 0 : fmax(0.0, step_s - m->compute_s - m->comm_s - m->update_s);
        if (mb && !m->parked && (!last || mb->all_started_ns > last->all_started_ns))
            last = mb;
    }
    stats->buckets = (int)dp->nbuckets;
    stats->buckets_in_backward = last ? last->buckets_in_backward : 0;
    /* Without overlap (and in deterministic mode's chain) nothing is hidden. */
    stats->hidden_fraction = last && last->reduce_s > 0 && !dp->cfg.deterministic && dp->overlap
                                 ? fmin(1.0, fmax(0.0, 1.0 - last->exposed_s / last->reduce_s))
                                 : 0.0;
}

/* Notes a parked set in dp->active_parked and logs its members when it
 * changed; returns whether it did. */
static int note_parked_set(td_dp *dp, const unsigned char *parked) {
    if (!memcmp(parked, dp->active_parked, (size_t)dp->size))
        return 0;
    memcpy(dp->active_parked, parked, (size_t)dp->size);
    for (int r = 0; r < dp->size; r++)
        if (parked[r])
            TD_LOG_INFO("data parallel: %s is parked: its fixed cost of %.3g ms per pass exceeds "
                        "the step the others take%s",
                        td_device_name(td_group_device(dp->g, r)),
                        td_balancer_fixed_seconds(dp->balancer, r) * 1e3,
                        dp->cfg.zero ? "; it takes no samples and keeps updating its shard of "
                                       "the optimizer state (ZeRO-1)"
                                     : "");
    return 1;
}

/* The group this step runs on: the whole one, or (parked members leaving
 * it) one of the others, kept while the parked set stays. ranks[] maps the
 * run's ranks to dp->g's; *n gets how many take part. */
static td_status step_group(td_dp *dp, td_group **g, int *ranks, int *n) {
    unsigned char parked[TD_DP_MAX_MEMBERS];
    int excluded[TD_DP_MAX_MEMBERS], nx = 0, changed = 0;
    for (int r = 0; r < dp->size; r++) {
        parked[r] = (unsigned char)is_parked(dp, r);
        if (parked[r])
            excluded[nx++] = r;
    }
    if (nx > 0)
        changed = note_parked_set(dp, parked);
    /* With ZeRO-1 a parked member holds the only copy of its shard of the
     * optimizer state, which every step updates, so it stays in the group:
     * no samples, no forward or backward, but its part of the reductions,
     * its shard's update and the weights' gather. It never falls behind. */
    if (nx == 0 || dp->cfg.zero) {
        *g = dp->g;
        *n = dp->size;
        for (int r = 0; r < dp->size; r++)
            ranks[r] = r;
        dp->overlap = resolve_overlap(dp, NULL);
        return TD_OK;
    }
    *n = 0;
    for (int r = 0; r < dp->size; r++)
        if (!parked[r])
            ranks[(*n)++] = r;
    dp->overlap = resolve_overlap(dp, parked);
    if (changed || !dp->active) {
        if (dp->ran == dp->active)
            dp->ran = NULL;
        td_group_destroy(dp->active);
        dp->active = NULL;
        td_status st = td_group_shrink(dp->g, excluded, (size_t)nx, &dp->active);
        if (st != TD_OK)
            return st;
    }
    *g = dp->active;
    return TD_OK;
}

td_status td_dp_step(td_dp *dp, const td_batch *batch, uint64_t step, td_step_result *res,
                     td_dp_stats *stats) {
    int64_t counts[TD_DP_MAX_MEMBERS], offsets[TD_DP_MAX_MEMBERS];
    double rows[TD_DP_MAX_MEMBERS * STAT_WORDS], all[TD_DP_MAX_MEMBERS * STAT_WORDS];
    double seconds[TD_DP_MAX_MEMBERS];
    int64_t units, samples[TD_DP_MAX_MEMBERS];
    int ranks[TD_DP_MAX_MEMBERS], nrun;
    char report[512] = "";
    uint64_t t0 = td_clock_ns();
    td_group *g;
    dp_work w;
    td_status st;
    if (!dp || !batch || batch->n < 1 || !batch->labels)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_step: needs a batch with labels");
    /* Deterministic mode splits whole chunks; the normal mode samples. */
    units = dp->cfg.deterministic ? (batch->n + dp->cfg.chunk_samples - 1) / dp->cfg.chunk_samples
                                  : batch->n;
    td_balancer_split(dp->balancer, units, counts);
    if ((st = step_group(dp, &g, ranks, &nrun)) != TD_OK)
        return st;
    /* A member coming back from parking catches up first. */
    for (int k = 0; k < nrun; k++)
        if (dp->stale[ranks[k]]) {
            if ((st = td_dp_refresh(dp)) != TD_OK)
                return st;
            break;
        }
    offsets[0] = 0;
    for (int r = 1; r < dp->size; r++)
        offsets[r] = offsets[r - 1] + counts[r - 1];
    memset(&w, 0, sizeof w);
    w.dp = dp;
    w.batch = batch;
    w.counts = counts;
    w.offsets = offsets;
    w.ranks = g == dp->g ? NULL : ranks;
    w.step = step;
    for (int k = 0; k < nrun && !w.reader; k++)
        w.reader = member_of(dp, ranks[k]);
    w.rows = rows;
    if (dp->cfg.deterministic && !(w.chunk_rows = malloc(sizeof *w.chunk_rows * (size_t)units * 3)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory");
    st = run_on(dp, g, dp->cfg.deterministic ? step_member_deterministic : step_member, &w);
    if (st != TD_OK) {
        free(w.chunk_rows);
        return st;
    }
    /* Rows by the run's ranks; the parked ones did nothing. */
    memset(all, 0, sizeof *all * (size_t)dp->size * STAT_WORDS);
    for (int k = 0; k < nrun; k++)
        memcpy(&all[ranks[k] * STAT_WORDS], &rows[k * STAT_WORDS], sizeof *rows * STAT_WORDS);
    for (int r = 0; r < dp->size; r++)
        if (sits_out(dp, r))
            dp->stale[r] = 1;
    memset(res, 0, sizeof *res);
    if (dp->cfg.deterministic) {
        for (int64_t c = 0; c < units; c++) {
            res->loss_sum += w.chunk_rows[c * 3];
            res->correct += (int64_t)w.chunk_rows[c * 3 + 1];
            res->count += (int64_t)w.chunk_rows[c * 3 + 2];
        }
        free(w.chunk_rows);
        for (int r = 0; r < dp->size; r++) {
            int64_t first = offsets[r] * dp->cfg.chunk_samples;
            int64_t last = (offsets[r] + counts[r]) * dp->cfg.chunk_samples;
            samples[r] =
                (last < batch->n ? last : batch->n) - (first < batch->n ? first : batch->n);
        }
    } else {
        for (int r = 0; r < dp->size; r++) {
            res->loss_sum += all[r * STAT_WORDS + 0];
            res->correct += (int64_t)all[r * STAT_WORDS + 1];
            res->count += (int64_t)all[r * STAT_WORDS + 2];
            samples[r] = counts[r];
        }
    }
    for (int r = 0; r < dp->size; r++)
        seconds[r] = all[r * STAT_WORDS + 3];
    if (dp->cfg.rebalance) {
        /* The caller shows the report (stats) or the log does. */
        if (td_balancer_observe(dp->balancer, samples, seconds, report, sizeof report) > 0 &&
            !stats)
            TD_LOG_WARN("%s", report);
    }
    if (stats) {
        fill_stats(dp, all, samples, (double)(td_clock_ns() - t0) * 1e-9, batch->n, stats);
        snprintf(stats->stragglers, sizeof stats->stragglers, "%s", report);
    }
    return TD_OK;
}

td_status td_dp_survivors(td_dp *dp, td_group **out) {
    int exclude[TD_DP_MAX_MEMBERS];
    size_t nx = 0;
    const td_group *ran;
    if (!dp || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_dp_survivors: dp or out is NULL");
    *out = NULL;
    ran = dp->ran ? dp->ran : dp->g;
    if (ran == dp->g)
        return td_group_shrink(dp->g, NULL, 0, out);
    /* The last run was on the unparked members' group, which alone knows
     * who failed. */
    for (int r = 0; r < dp->size; r++) {
        td_device *dev = td_group_device(dp->g, r);
        if (dev && td_group_member_failed(ran, td_group_rank_of(ran, dev)))
            exclude[nx++] = r;
    }
    return td_group_shrink(dp->g, exclude, nx, out);
}

/* Evaluation: the `alternate` strategy ------------------------------------------ */

static td_status evaluate_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    dp_member *mb = member_of(w->dp, rank);
    td_status st;
    for (size_t i = 0; i < w->nbatches; i++) {
        if (w->owner[i] != rank)
            continue;
        if ((st = td_model_evaluate(mb->model, &w->batches[i], &w->per_batch[i])) != TD_OK)
            return st;
    }
    return TD_OK;
}

td_status td_dp_evaluate(td_dp *dp, const td_batch *batches, size_t n, td_step_result *per_batch) {
    int *owner;
    double *credit;
    dp_work w;
    td_status st;
    if (!dp || (n && (!batches || !per_batch)))
        return td__error(TD_ERR_INVALID_ARG, "td_dp_evaluate: NULL argument");
    if (dp->nlocal != dp->size)
        return td__error(TD_ERR_UNSUPPORTED,
                         "the alternate strategy runs within one process; this group spans "
                         "several");
    owner = malloc(sizeof *owner * (n ? n : 1));
    credit = calloc((size_t)dp->size, sizeof *credit);
    if (!owner || !credit) {
        free(owner);
        free(credit);
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    /* Smooth weighted round-robin: each batch goes to the member with the
     * most credit, credit growing by share; a member twice as fast gets
     * twice the batches, interleaved. */
    for (size_t i = 0; i < n; i++) {
        int best = -1;
        for (int r = 0; r < dp->size; r++) {
            if (dp->stale[r]) /* parked: its replica is behind */
                continue;
            credit[r] += td_balancer_share(dp->balancer, r);
            if (best < 0 || credit[r] > credit[best])
                best = r;
        }
        credit[best] -= 1.0;
        owner[i] = best;
    }
    memset(&w, 0, sizeof w);
    w.dp = dp;
    w.batches = batches;
    w.nbatches = n;
    w.owner = owner;
    w.per_batch = per_batch;
    st = run_on(dp, dp->g, evaluate_member, &w);
    free(owner);
    free(credit);
    return st;
}
