/* The `data` strategy (and `alternate` for evaluation): replicas on every
 * member of a group, batches split by measured speed, gradients all-reduced
 * in buckets while backward goes on. This file: creation, the buckets, a
 * step, parking; ZeRO-1, deterministic mode, statistics and evaluation are
 * beside it (see dp-impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "device/bench_cache.h"
#include "parallel/dp-impl.h"

dp_member *td__dp_member(td_dp *dp, int rank) {
    for (int i = 0; i < dp->nlocal; i++)
        if (dp->members[i].rank == rank)
            return &dp->members[i];
    return NULL;
}

/* td_group_run on g (dp->g or dp->active), noted for td_dp_survivors. */
td_status td__dp_run_on(td_dp *dp, td_group *g, td_group_fn fn, void *arg) {
    dp->ran = g;
    return td_group_run(g, fn, arg);
}

/* The part [offset, offset + n) of a host batch. */
td_batch td__dp_slice(const td_dp *dp, const td_batch *b, int64_t offset, int64_t n) {
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
    td_collective c = {TD_COLL_ALLREDUCE,
                       td_tensor_buffer(gr, NULL),
                       0,
                       td_tensor_buffer(gr, NULL),
                       0,
                       td_tensor_numel(gr),
                       td_tensor_dtype(gr),
                       TD_REDUCE_SUM,
                       0};
    if (dp->cfg.zero) {
        if (!mb->shard_grads[p])
            return TD_OK;
        c.kind = TD_COLL_REDUCE_SCATTER;
        c.recv = td_tensor_buffer(mb->shard_grads[p], NULL);
        c.count = td_tensor_numel(mb->shard_grads[p]);
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
        st = td__dp_place_shards(mb);
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

static td_status create_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    dp_member *mb = td__dp_member(dp, rank);
    int64_t one = 1;
    td_status st;
    if ((st = td_model_load_string(w->json, w->name, dev, w->dtype, w->seed, &mb->model)) != TD_OK)
        return st;
    if ((st = dp->cfg.zero ? td__dp_create_shard_state(mb, w->opt, rank, size)
                           : td_optimizer_create(mb->model, w->opt, &mb->opt)) != TD_OK)
        return st;
    if ((st = td__rows_alloc(dev, size, &mb->rows)) != TD_OK)
        return st;
    return td_tensor_create(dev, dp->stat_dtype, 1, &one, &mb->scalar);
}

static td_status broadcast_replicas(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    dp_member *mb = td__dp_member(w->dp, rank);
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

/* Until a calibration measures them, shares follow the f32 GFLOP/s that
 * `tandem bench devices` cached for these devices, when it has a figure for
 * every member (else they stay equal). Only where every member is local:
 * each process must compute the same split. The fastest takes 1 sample/s,
 * the unit equal shares use. */
static void shares_from_bench_cache(td_dp *dp) {
    td_device *devs[TD_DP_MAX_MEMBERS];
    double gflops[TD_DP_MAX_MEMBERS], top = 0;
    if (dp->nlocal != dp->size)
        return;
    for (int r = 0; r < dp->size; r++)
        devs[r] = td_group_device(dp->g, r);
    if (!td__bench_cache_gflops(devs, dp->size, gflops))
        return;
    for (int r = 0; r < dp->size; r++)
        top = fmax(top, gflops[r]);
    for (int r = 0; r < dp->size; r++)
        gflops[r] /= top;
    if (td_balancer_set_speeds(dp->balancer, gflops) == TD_OK)
        TD_LOG_INFO("data parallel: first shares from the bench cache (tandem bench devices)");
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
        dp->members[dp->nlocal].cpu = !(td_device_caps(dev) & TD_DEVICE_CAP_ASYNC_COPY);
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
    shares_from_bench_cache(dp);
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

void td_dp_destroy(td_dp *dp) {
    if (!dp)
        return;
    for (int i = 0; i < dp->nlocal; i++) {
        dp_member *mb = &dp->members[i];
        td__dp_free_chunk_grads(mb, dp->nparams);
        td_tensor_destroy(mb->chunk_results);
        td_tensor_destroy(mb->chunk_results_all);
        td__rows_free(&mb->rows);
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
    dp_member *mb = dp ? td__dp_member(dp, rank) : NULL;
    return mb ? mb->model : NULL;
}

td_optimizer *td_dp_optimizer(td_dp *dp, int rank) {
    dp_member *mb = dp ? td__dp_member(dp, rank) : NULL;
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
    if ((st = td__dp_run_on(dp, dp->g, broadcast_replicas, &w)) != TD_OK)
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

/* A step ------------------------------------------------------------------------ */

static td_status step_member(td_group *g, td_device *dev, int run_rank, int size, void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    int rank = w->ranks ? w->ranks[run_rank] : run_rank;
    dp_member *mb = td__dp_member(dp, rank);
    td_batch slice = td__dp_slice(dp, w->batch, w->offsets[rank], w->counts[rank]);
    double scale = 1.0 / (double)(w->batch->n * dp->labels_per_sample);
    td_step_result r = {0, 0, 0};
    td__member_row row;
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
    if (dp->cfg.zero && (st = td__dp_gather_weights(mb)) != TD_OK)
        return st;
    row = (td__member_row){
        .loss_sum = r.loss_sum, .correct = (double)r.correct, .count = (double)r.count};
    td__dp_put_times(&row, c0, c1, u0);
    return td__dp_gather_stats(g, mb, w, &row);
}

/* The step from tr (td__trace_begin's) on, as idle time on the tracks of
 * the members that sat it out: their threads did nothing to record it. */
static void trace_parked(const td_dp *dp, uint64_t tr) {
    for (int r = 0; tr && r < dp->size; r++) {
        td_device *dev = td_group_device(dp->g, r);
        if (dev && td__dp_sits_out(dp, r)) {
            td__trace_rec rec = {.t0 = tr,
                                 .name = "parked",
                                 .track = td_device_name(dev),
                                 .bytes = -1,
                                 .item = -1,
                                 .cat = TD__TRACE_IDLE};
            td__trace_add(&rec);
        }
    }
}

/* Whether member r is parked this step (deterministic mode never parks). */
int td__dp_is_parked(const td_dp *dp, int r) {
    return !dp->cfg.deterministic && td_balancer_parked(dp->balancer, r);
}

/* Whether a parked member sits the whole step out: it leaves the group and
 * its replica falls behind, unless ZeRO-1 keeps it in for its shard. */
int td__dp_sits_out(const td_dp *dp, int r) {
    return td__dp_is_parked(dp, r) && !dp->cfg.zero;
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
        parked[r] = (unsigned char)td__dp_is_parked(dp, r);
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
                     td_step_stats *stats) {
    int64_t counts[TD_DP_MAX_MEMBERS], offsets[TD_DP_MAX_MEMBERS];
    td__member_row rows[TD_DP_MAX_MEMBERS], all[TD_DP_MAX_MEMBERS];
    double seconds[TD_DP_MAX_MEMBERS];
    int64_t units, samples[TD_DP_MAX_MEMBERS];
    int ranks[TD_DP_MAX_MEMBERS], nrun;
    char report[512] = "";
    uint64_t t0 = td_clock_ns(), tr = td__trace_begin();
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
        w.reader = td__dp_member(dp, ranks[k]);
    w.rows = rows;
    if (dp->cfg.deterministic && !(w.chunk_rows = malloc(sizeof *w.chunk_rows * (size_t)units * 3)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory");
    st = td__dp_run_on(dp, g,
                       dp->cfg.deterministic ? td__dp_step_member_deterministic : step_member, &w);
    if (st != TD_OK) {
        free(w.chunk_rows);
        return st;
    }
    /* Rows by the run's ranks; the parked ones did nothing. */
    memset(all, 0, sizeof *all * (size_t)dp->size);
    for (int k = 0; k < nrun; k++)
        all[ranks[k]] = rows[k];
    trace_parked(dp, tr);
    for (int r = 0; r < dp->size; r++)
        if (td__dp_sits_out(dp, r))
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
            res->loss_sum += all[r].loss_sum;
            res->correct += (int64_t)all[r].correct;
            res->count += (int64_t)all[r].count;
            samples[r] = counts[r];
        }
    }
    for (int r = 0; r < dp->size; r++)
        seconds[r] = all[r].compute_s;
    if (dp->cfg.rebalance) {
        /* The caller shows the report (stats) or the log does. */
        if (td_balancer_observe(dp->balancer, samples, seconds, report, sizeof report) > 0 &&
            !stats)
            TD_LOG_WARN("%s", report);
    }
    if (stats) {
        td__dp_fill_stats(dp, all, samples, (double)(td_clock_ns() - t0) * 1e-9, batch->n, stats);
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
