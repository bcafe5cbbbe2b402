/* The `data` strategy behind the strategy table: td_dp (data_parallel.c)
 * holds a replica on every member. Checkpoints hold rank 0's replica and a
 * whole optimizer (ZeRO-1's shards put together); evaluation goes round-robin
 * over the replicas (`alternate`) within one process, and on each process's
 * first replica across several. A lost member's survivors carry on from the
 * most advanced survivor's replica, unless the lost one held state none of
 * them has. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

typedef struct data {
    td_strategy *s;
    td_dp_config cfg; /* from the strategy's options */
    td_dp *dp;
    td_model_info info;
} data;

static const td_strategy_option data_options[] = {
    {"deterministic", "0|1", "bitwise the same weights for any number of devices"},
    {"zero", "0|1", "ZeRO-1: each device keeps only its shard of the optimizer state"},
    {"overlap", "auto|on|off",
     "reduce each bucket while backward goes on (auto: unless every device is a CPU device of "
     "this process)"},
    {"bucket_bytes", "N", "gradient all-reduce bucket size (default 4 MiB)"},
    {NULL, NULL, NULL},
};

/* td_dp's configuration from the strategy's options. */
static td_status dp_config_of(const td_strategy *s, td_dp_config *c) {
    static const char *const overlap[] = {"auto", "on", "off", NULL};
    int64_t bucket = 0;
    int ov = 0;
    *c = (td_dp_config)TD_DP_CONFIG_INIT;
    TD_CHECK(td__option_flag(s, "deterministic", &c->deterministic));
    TD_CHECK(td__option_flag(s, "zero", &c->zero));
    TD_CHECK(td__option_choice(s, "overlap", overlap, &ov));
    c->overlap = ov == 0 ? -1 : ov == 1;
    TD_CHECK(td__option_count(s, "bucket_bytes", 1, &bucket));
    if (bucket > 0) {
        c->bucket_bytes = (size_t)bucket;
        c->first_bucket_bytes = bucket / 16 ? (size_t)bucket / 16 : 1;
    }
    return TD_OK;
}

/* The rank in g of this process's member (of `among`, when not NULL) whose
 * replica's optimizer has counted the most steps (a parked replica falls
 * behind while it sits steps out), or -1. */
static int most_advanced(td_dp *dp, const td_group *g, const td_group *among) {
    int best = -1;
    for (int r = 0; r < td_group_size(g); r++)
        if (td_group_device(g, r) &&
            (!among || td_group_rank_of(among, td_group_device(g, r)) >= 0) &&
            (best < 0 || td_optimizer_steps(td_dp_optimizer(dp, r)) >
                             td_optimizer_steps(td_dp_optimizer(dp, best))))
            best = r;
    return best;
}

/* This process's first member's rank. */
static int first_local(const td_group *g) {
    for (int r = 0; r < td_group_size(g); r++)
        if (td_group_device(g, r))
            return r;
    return -1;
}

static td_status data_calibrate(void *impl, const td_batch *sample) {
    return td_dp_calibrate(((data *)impl)->dp, sample);
}

static td_status data_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats) {
    return td_dp_step(((data *)impl)->dp, batch, step, res, stats);
}

static td_status data_evaluate(void *impl, const td_batch *batches, size_t n,
                               td_step_result *per_batch) {
    data *d = impl;
    td_group *g = td_dp_group(d->dp);
    td_model *m;
    /* Parked replicas catch up first; every process calls it. */
    TD_CHECK(td_dp_refresh(d->dp));
    if (td_group_local_size(g) == td_group_size(g))
        return td_dp_evaluate(d->dp, batches, n, per_batch);
    m = td_dp_model(d->dp, first_local(g));
    for (size_t i = 0; i < n; i++)
        TD_CHECK(td_model_evaluate(m, &batches[i], &per_batch[i]));
    return TD_OK;
}

/* ZeRO-1: the shards of the optimizer state, put together for the
 * checkpoint in a whole optimizer that lives while it is written (rank 0's
 * device holds the whole state for that while). */
static td_status save_gathered(data *d, const char *path, const td_train_state *state) {
    td_model *m0 = td_dp_model(d->dp, 0);
    td_optimizer *whole = NULL;
    td_status st;
    if (m0 && (st = td_optimizer_create(m0, &d->s->cfg.opt, &whole)) != TD_OK)
        return st;
    st = td_dp_gather_optimizer(d->dp, whole);
    if (st == TD_OK && m0)
        st = td_checkpoint_save(path, m0, whole, state);
    td_optimizer_destroy(whole);
    return st;
}

static td_status data_save(void *impl, const char *path, const td_train_state *state) {
    data *d = impl;
    /* Every process calls the refresh; only rank 0's writes. */
    TD_CHECK(td_dp_refresh(d->dp));
    if (d->cfg.zero)
        return save_gathered(d, path, state);
    if (!td_dp_model(d->dp, 0))
        return TD_OK;
    return td_checkpoint_save(path, td_dp_model(d->dp, 0), td_dp_optimizer(d->dp, 0), state);
}

/* The checkpoint into rank 0's replica and a whole optimizer, then to
 * every member: weights by td_dp_sync_replicas, the optimizer's state (each
 * member its part) by td_dp_scatter_optimizer. The other processes read the
 * run's state from the file themselves. */
static td_status data_load(void *impl, const char *path, td_train_state *state) {
    data *d = impl;
    td_model *m0 = td_dp_model(d->dp, 0);
    td_optimizer *whole = NULL;
    td_status st = TD_OK;
    if (m0) {
        if ((st = td_optimizer_create(m0, &d->s->cfg.opt, &whole)) == TD_OK)
            st = td_checkpoint_load(path, m0, whole, state);
    } else if (state) {
        char *json = NULL;
        td_dtype dt;
        st = td_checkpoint_read_meta(path, &json, &dt, state);
        free(json);
    }
    if (st == TD_OK)
        st = td_dp_sync_replicas(d->dp);
    if (st == TD_OK)
        st = td_dp_scatter_optimizer(d->dp, whole);
    td_optimizer_destroy(whole);
    return st;
}

/* The most advanced replica's: a parked one's optimizer lags. */
static double data_lr(void *impl) {
    data *d = impl;
    return td_optimizer_lr(td_dp_optimizer(d->dp, most_advanced(d->dp, td_dp_group(d->dp), NULL)));
}

static int64_t data_steps(void *impl) {
    data *d = impl;
    return td_optimizer_steps(
        td_dp_optimizer(d->dp, most_advanced(d->dp, td_dp_group(d->dp), NULL)));
}

static td_status data_survivors(void *impl, td_group **out) {
    return td_dp_survivors(((data *)impl)->dp, out);
}

static void data_model_info(void *impl, td_model_info *out) {
    *out = ((data *)impl)->info;
}

static const char *data_plan(void *impl, char *buf, size_t n) {
    data *d = impl;
    td_group *g = td_dp_group(d->dp);
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < td_group_size(g) && used < n; r++) {
        td_device *dev = td_group_device(g, r);
        used += (size_t)snprintf(buf + used, n - used,
                                 "%s: a replica of the whole model, %.1f%% of each batch\n",
                                 dev ? td_device_name(dev) : "(another process)",
                                 100 * td_balancer_share(td_dp_balancer(d->dp), r));
    }
    return buf;
}

static void data_destroy(void *impl) {
    data *d = impl;
    if (!d)
        return;
    td_dp_destroy(d->dp);
    free(d);
}

static td_status data_create(td_strategy *s) {
    data *d = td__calloc(sizeof *d, "the data strategy");
    td_group *g = s->group;
    int first = first_local(g);
    if (!d)
        return TD_ERR_OUT_OF_MEMORY;
    s->impl = d;
    d->s = s;
    for (int r = 0; r < td_group_size(g); r++)
        TD_CHECK(td__tensor_check_dtype(td_group_device(g, r), s->cfg.dtype));
    if (first < 0)
        return td__error(TD_ERR_INVALID_ARG, "data: none of the group's devices is here");
    TD_CHECK(dp_config_of(s, &d->cfg));
    TD_CHECK(td_dp_create(g, s->json, s->model_name, s->cfg.dtype, s->cfg.seed, &s->cfg.opt,
                          &d->cfg, &d->dp));
    td_model_get_info(td_dp_model(d->dp, first), &d->info);
    return TD_OK;
}

/* Replicas over the survivors from the most advanced survivor's replica
 * and optimizer. The survivors of a loss in a collective all took the
 * step's update (the loss came in its last exchange, of its numbers) or
 * none did; a survivor whose optimizer lags the step had sat steps out. */
static td_status data_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                               td_strategy *next, int *step_taken, const char **why) {
    data *d = s->impl, *n;
    int from = most_advanced(d->dp, s->group, survivors);
    td_model *src, *dst;
    if (from < 0) {
        *why = "no device of this process is left";
        return td__error(TD_ERR_UNSUPPORTED, "data: %s", *why);
    }
    if (d->cfg.zero) {
        *why = "its shard of the ZeRO-1 optimizer state was the only copy";
        return td__error(TD_ERR_UNSUPPORTED, "data: %s", *why);
    }
    if (td_optimizer_steps(td_dp_optimizer(d->dp, from)) < steps_before) {
        *why = "the devices left had sat steps out, parked, and it held the only current replica";
        return td__error(TD_ERR_UNSUPPORTED, "data: %s", *why);
    }
    *step_taken = td_optimizer_steps(td_dp_optimizer(d->dp, from)) > steps_before;
    TD_CHECK(data_create(next));
    n = next->impl;
    src = td_dp_model(d->dp, from);
    dst = td_dp_model(n->dp, 0);
    for (size_t p = 0; p < td_model_param_count(src); p++)
        TD_CHECK(td_tensor_copy(td_model_param(dst, p), td_model_param(src, p)));
    TD_CHECK(td_dp_sync_replicas(n->dp));
    return td_dp_scatter_optimizer(n->dp, td_dp_optimizer(d->dp, from));
}

/* A replica on every member of this process (ZeRO-1's shards of the
 * optimizer state are data_carry_on's to judge). */
static void data_holdings(void *impl, td__holding *h, int *n) {
    data *d = impl;
    td_group *g = td_dp_group(d->dp);
    *n = 0;
    for (int r = 0; r < td_group_size(g) && *n < TD_DP_MAX_MEMBERS; r++)
        if (td_dp_model(d->dp, r))
            h[(*n)++] = (td__holding){td_dp_model(d->dp, r), td_dp_optimizer(d->dp, r), r};
}

static void data_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    (void)impl;
    snprintf(out->note, sizeof out->note,
             "gradient reduction: %d bucket%s, %d started during backward, %.0f%% of its time "
             "hidden behind backward; step time %.2fx the ideal",
             f->buckets, f->buckets == 1 ? "" : "s", f->buckets_in_backward, 100 * f->hidden,
             f->ideal_ratio);
}

const td_strategy_ops td__strategy_data = {
    .name = "data",
    .summary = "a replica on every device, batches split by measured speed, gradients "
               "all-reduced; under mpirun, across processes",
    .options = data_options,
    .report = data_report,
    .create = data_create,
    .destroy = data_destroy,
    .model_info = data_model_info,
    .plan = data_plan,
    .calibrate = data_calibrate,
    .step = data_step,
    .evaluate = data_evaluate,
    .save = data_save,
    .load = data_load,
    .lr = data_lr,
    .steps = data_steps,
    .holdings = data_holdings,
    .survivors = data_survivors,
    .carry_on = data_carry_on,
};

/* Evaluation's name for the data strategy: whole batches go round-robin
 * across the replicas by speed (td_dp_evaluate). */
const td_strategy_ops td__strategy_alternate = {
    .name = "alternate",
    .summary = "evaluation: whole batches round-robin across the devices by measured speed",
    .evaluates_only = 1,
    .options = data_options, /* data_create reads them */
    .create = data_create,
    .destroy = data_destroy,
    .model_info = data_model_info,
    .plan = data_plan,
    .calibrate = data_calibrate,
    .evaluate = data_evaluate,
    .save = data_save,
    .load = data_load,
    .lr = data_lr,
    .steps = data_steps,
};
