/* The `tensor` strategy (Megatron-style tensor parallelism): member k of the
 * group holds a shard of the model (td_model_load_shard): a slice of every
 * splittable unit (the hidden features of an MLP pair, the heads of an
 * attention layer) and every other layer whole. Slices follow measured
 * speed: at creation every member in turn times a training step of the
 * whole model on one sample, and each unit is cut in proportion to the speeds with
 * largest remainders (a device three times as fast gets 3 of 4 heads): the
 * plan, tp_plan.c.
 *
 * Every member takes the whole batch. A step runs each member's forward and
 * backward on its own thread; the partial outputs of each unit and their
 * input gradients are summed across the members by small all-reduces (the
 * model's reduce hook), so every member computes the replicated layers on
 * the same numbers and gets the same gradients for them. Each member
 * updates what it holds, layer by layer in the backward where it can
 * (backward()), else after it; clipping needs the norm of the
 * whole gradient: every member's sum of squares over its slices, plus the
 * replicated parameters once (member 0's), all-reduced. The step ends with
 * an all-gather of every member's numbers and timings, a collective, so a
 * lost member fails the step as under the other strategies.
 *
 * Checkpoints are whole-model files: saving gathers each parameter's slices
 * (and its optimizer state's) into the whole tensor in host memory; loading
 * scatters each member's slices out of the whole tensors (placement.c).
 * Under mpirun each process splits the model over its own devices and takes
 * its rows of the batch (procs.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/placement.h"
#include "parallel/tp-impl.h"
#include "tensor/view.h"

/* The hook the shards sum their partial activations through. */
static td_status reduce_hook(void *arg, td_tensor *t) {
    tp_member *m = arg;
    /* t is a view into the model's activations: a buffer over its elements */
    td_buffer b = td__tensor_as_buffer(t);
    uint64_t t0 = td_clock_ns();
    td_status st =
        td_allreduce(m->group, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t), TD_REDUCE_SUM);
    m->comm_s += (double)(td_clock_ns() - t0) * 1e-9;
    return st;
}

td_status td__tp_sum_scalar(tp_member *m, double *v) {
    TD_CHECK(td_buffer_write(m->scalar, 0, v, sizeof *v));
    TD_CHECK(td_allreduce(m->group, m->scalar, 0, m->scalar, 0, 1, TD_F64, TD_REDUCE_SUM));
    return td_buffer_read(m->scalar, 0, v, sizeof *v);
}

/* The squared norm of the whole gradient, for clipping: each member's
 * optimizer counts its slices, member 0's also the replicated parameters. */
static td_status sum_over_members(void *arg, const double *terms, size_t n, double *sumsq) {
    (void)terms;
    (void)n;
    return td__tp_sum_scalar(arg, sumsq);
}

/* Steps ------------------------------------------------------------------------ */

static td_status gather_stats(td_group *g, tp_member *m) {
    td__member_row row = {.compute_s = m->compute_s,
                          .comm_s = m->comm_s,
                          .update_s = m->update_s,
                          .loss_sum = m->res.loss_sum,
                          .correct = (double)m->res.correct,
                          .count = (double)m->res.count};
    return td__rows_gather(g, &m->rows, &row);
}

/* The gradient hook of a step whose update may run in the backward: updates
 * the layer whose gradients are final. */
static void update_early(void *arg, size_t first, size_t count) {
    tp_member *m = arg;
    uint64_t t0 = td_clock_ns();
    td_status st = td_optimizer_step_params(m->opt, first, count);
    if (m->early_st == TD_OK)
        m->early_st = st;
    m->update_s += (double)(td_clock_ns() - t0) * 1e-9;
}

/* Forward and backward; with `early`, each layer's update as soon as its
 * gradients are final, between the layers' compute: the members' updates
 * then do not all stream their optimizer state at once, which on CPU
 * devices sharing one memory bus slows every one of them. */
static td_status backward(const tp_step_call *c, tp_member *m, int early) {
    uint64_t t0 = td_clock_ns();
    td_status st;
    m->comm_s = m->compute_s = m->update_s = 0;
    m->early_st = TD_OK;
    memset(&m->res, 0, sizeof m->res);
    if (early)
        td_model_set_grad_hook(m->m, update_early, m);
    st = td_model_train_slice(m->m, c->batch, c->first, c->grad_scale, 0, c->step, &m->res);
    if (early)
        td_model_set_grad_hook(m->m, NULL, NULL);
    TD_CHECK(st);
    TD_CHECK(m->early_st);
    m->compute_s = fmax(0, (double)(td_clock_ns() - t0) * 1e-9 - m->comm_s - m->update_s);
    return TD_OK;
}

static td_status update(td_group *g, tp_member *m) {
    uint64_t t0 = td_clock_ns();
    TD_CHECK(td_optimizer_step(m->opt, NULL));
    m->update_s += (double)(td_clock_ns() - t0) * 1e-9;
    return gather_stats(g, m);
}

/* The update may run in the backward where it needs no more than the
 * layer's own gradients: no clipping (the whole gradient's norm), and no
 * other processes (their gradients summed first). */
static int can_update_early(const tensor_par *p) {
    return p->s->cfg.opt.clip_norm <= 0 && p->procs.nprocs == 1 && !p->mesh;
}

/* A step within one process: forward, backward and the update. */
static td_status step_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tp_step_call *c = arg;
    tp_member *m = &c->p->mb[rank];
    (void)dev;
    (void)size;
    TD_CHECK(backward(c, m, can_update_early(c->p)));
    return update(g, m);
}

/* Across processes (or replicas), first forward and backward, */
td_status td__tp_backward_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tp_step_call *c = arg;
    (void)g;
    (void)dev;
    (void)size;
    return backward(c, &c->p->mb[rank], 0);
}

/* then, the gradients summed over the processes (or replicas), the update. */
td_status td__tp_update_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tp_step_call *c = arg;
    (void)dev;
    (void)size;
    return update(g, &c->p->mb[rank]);
}

static void fill_stats(tensor_par *p, const td__member_row *rows, int64_t n, double step_s,
                       td_step_stats *stats) {
    double speed = 0;
    memset(stats, 0, sizeof *stats);
    stats->members = p->size;
    stats->step_s = step_s;
    for (int k = 0; k < p->size; k++)
        speed += p->mb[k].alone_s > 0 ? 1.0 / p->mb[k].alone_s : 0;
    /* calibration timed one sample of the whole model */
    stats->ideal_s = speed > 0 ? (double)n / speed : 0;
    td__rows_to_stats(rows, p->size, step_s, stats->m);
    for (int k = 0; k < p->size; k++) {
        stats->m[k].samples = n;
        stats->m[k].share = p->share[k];
    }
}

/* Across processes: this process's rows, then every member's gradients
 * summed with its peers in the other processes, then the update; the
 * step's numbers summed over the processes. */
static td_status step_across(tp_step_call *c, const td_batch *batch) {
    tensor_par *p = c->p;
    td_batch rows = td__procs_rows(&p->procs, batch, &p->info, &c->first);
    c->batch = &rows;
    TD_CHECK(td_group_run(p->g, td__tp_backward_job, c));
    for (int k = 0; k < p->size; k++) {
        uint64_t t0 = td_clock_ns();
        TD_CHECK(td__procs_sum_grads(&p->procs, k, p->mb[k].m));
        p->mb[k].comm_s += (double)(td_clock_ns() - t0) * 1e-9;
    }
    return td_group_run(p->g, td__tp_update_job, c);
}

static td_status tp_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                         td_step_stats *stats) {
    tensor_par *p = impl;
    td__member_row rows[TD_DP_MAX_MEMBERS];
    uint64_t t0 = td_clock_ns();
    tp_step_call c = {p, batch, 0, step, 1.0 / (double)(batch->n * p->lps)};
    if (p->mesh)
        return td__tp_mesh_step(p, batch, step, res, stats);
    TD_CHECK(p->procs.nprocs > 1 ? step_across(&c, batch) : td_group_run(p->g, step_job, &c));
    TD_CHECK(td__rows_read(&p->mb[0].rows, rows));
    /* every member computed the same loss: member 0's; summed over processes */
    TD_CHECK(td__procs_agree(&p->procs, 0, &rows[0].loss_sum, 3, TD_REDUCE_SUM));
    res->loss_sum = rows[0].loss_sum;
    res->correct = (int64_t)rows[0].correct;
    res->count = (int64_t)rows[0].count;
    if (stats)
        fill_stats(p, rows, batch->n, (double)(td_clock_ns() - t0) * 1e-9, stats);
    return TD_OK;
}

static td_status tp_evaluate(void *impl, const td_batch *batches, size_t n,
                             td_step_result *per_batch) {
    tensor_par *p = impl;
    td_model *models[TD_DP_MAX_MEMBERS];
    for (int k = 0; k < p->size; k++)
        models[k] = p->mb[k].m;
    return td__rows_evaluate_alike(p->g, models, batches, n, per_batch);
}

/* Checkpoints (placement.c) and the rest ----------------------------------------- */

/* Every member's shard and optimizer, in rank order; first (the rank of
 * member 0) numbers them in the strategy's group. */
static void holdings_of(const tensor_par *p, td__holding *h, int first) {
    for (int k = 0; k < p->size; k++)
        h[k] = (td__holding){p->mb[k].m, p->mb[k].opt, first + k};
}

/* The replicas' holdings, in the group's order. */
static void tp_holdings(void *impl, td__holding *h, int *n) {
    tensor_par *p = impl;
    int replicas = p->mesh ? td__tp_mesh_replicas(p->mesh) : 1;
    *n = 0;
    for (int r = 0; r < replicas && *n + p->size <= TD_DP_MAX_MEMBERS; r++) {
        holdings_of(r ? td__tp_mesh_replica(p->mesh, r) : p, h + *n, *n);
        *n += p->size;
    }
}

static td_status tp_save(void *impl, const char *path, const td_train_state *state) {
    tensor_par *p = impl;
    td__holding h[TD_DP_MAX_MEMBERS];
    if (p->procs.process != 0) /* every process holds the same model: one writes */
        return TD_OK;
    holdings_of(p, h, 0); /* every replica holds the same */
    return td__placement_save(h, p->size, path, state);
}

static td_status tp_load(void *impl, const char *path, td_train_state *state) {
    td__holding h[TD_DP_MAX_MEMBERS];
    int n;
    tp_holdings(impl, h, &n);
    return td__placement_load(h, n, path, state);
}

static double tp_lr(void *impl) {
    return td_optimizer_lr(((tensor_par *)impl)->mb[0].opt);
}

static int64_t tp_steps(void *impl) {
    return td_optimizer_steps(((tensor_par *)impl)->mb[0].opt);
}

static void tp_model_info(void *impl, td_model_info *out) {
    *out = ((tensor_par *)impl)->info;
}

/* A line per member of replica p (a later replica: cut as the first). */
static size_t plan_lines(const tensor_par *p, int later, char *buf, size_t n) {
    size_t used = 0;
    for (int k = 0; k < p->size && used < n; k++) {
        const tp_member *m = &p->mb[k];
        int64_t heads = 0, all_heads = 0, feats = 0, all_feats = 0, kv = 0, all_kv = 0;
        int natt = 0, nmlp = 0;
        char kvs[64] = "";
        for (int u = 0; u < p->nunits; u++) {
            const td_split_info *un = &p->units[u];
            if (un->kind == TD_SPLIT_HEADS) {
                int64_t first = m->plan.first[u], count = m->plan.count[u];
                heads += count;
                all_heads += un->size;
                /* the key and value heads its query heads read */
                kv += count ? (first + count - 1) / un->group - first / un->group + 1 : 0;
                all_kv += un->size / un->group;
                natt++;
            } else {
                feats += m->plan.count[u];
                all_feats += p->units[u].size;
                nmlp++;
            }
        }
        char why[96];
        if (later)
            snprintf(why, sizeof why, "as the first replica's member %d", k);
        else
            snprintf(why, sizeof why, "by measured speed (%.2f ms a whole-model step alone)",
                     m->alone_s * 1e3);
        if (all_kv != all_heads)
            snprintf(kvs, sizeof kvs, " (reading %lld of %lld key/value heads)", (long long)kv,
                     (long long)all_kv);
        used += (size_t)snprintf(
            buf + used, n - used,
            "%s: %lld of %lld heads%s in %d attention layer%s, %lld of %lld hidden features in %d "
            "MLP%s; %.0f%% %s, %.2f MB of weights\n",
            td_device_name(m->dev), (long long)heads, (long long)all_heads, kvs, natt,
            natt == 1 ? "" : "s", (long long)feats, (long long)all_feats, nmlp,
            nmlp == 1 ? "" : "s", 100 * p->share[k], why,
            (double)td_model_num_weights(m->m) * (double)td_dtype_size(p->s->cfg.dtype) / 1e6);
    }
    return used;
}

static const char *tp_plan_text(void *impl, char *buf, size_t n) {
    tensor_par *p = impl;
    int replicas = p->mesh ? td__tp_mesh_replicas(p->mesh) : 1;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < replicas && used < n; r++) {
        if (replicas > 1)
            used += (size_t)snprintf(buf + used, n - used,
                                     "replica %d of %d, rows %d/%d of each "
                                     "batch:\n",
                                     r + 1, replicas, r + 1, replicas);
        if (used < n)
            used +=
                plan_lines(r ? td__tp_mesh_replica(p->mesh, r) : p, r > 0, buf + used, n - used);
    }
    return buf;
}

/* What td__tp_make_member made. */
void td__tp_drop_member(tp_member *m) {
    td_optimizer_destroy(m->opt);
    td_model_destroy(m->m);
    td__rows_free(&m->rows);
    m->opt = NULL;
    m->m = NULL;
}

void td__tp_free(tensor_par *p) {
    if (!p)
        return;
    for (int k = 0; k < p->size; k++) {
        td__tp_drop_member(&p->mb[k]);
        td_buffer_free(p->mb[k].scalar);
    }
    td__procs_close(&p->procs);
    free(p);
}

static void tp_destroy(void *impl) {
    tensor_par *p = impl;
    if (p)
        td__tp_mesh_close(p->mesh);
    td__tp_free(p);
}

static td_status check_group(tensor_par *p) {
    td_strategy *s = p->s;
    if (p->size > TD_DP_MAX_MEMBERS)
        return td__error(TD_ERR_INVALID_ARG, "tensor: %d devices; at most %d", p->size,
                         TD_DP_MAX_MEMBERS);
    for (int k = 0; k < p->size; k++)
        TD_CHECK(td__tensor_check_dtype(td_group_device(p->g, k), s->cfg.dtype));
    return TD_OK;
}

td_status td__tp_make_member(tensor_par *p, int k) {
    td_strategy *s = p->s;
    tp_member *m = &p->mb[k];
    TD_CHECK(td__rows_alloc(m->dev, p->size, &m->rows));
    TD_CHECK(td_model_load_shard(s->json, s->model_name, m->dev, s->cfg.dtype, s->cfg.seed,
                                 &m->plan, &m->m));
    td_model_set_reduce_hook(m->m, reduce_hook, m);
    TD_CHECK(td_optimizer_create(m->m, &s->cfg.opt, &m->opt));
    td_optimizer_set_sumsq_reduce(m->opt, sum_over_members, m);
    td_optimizer_set_sumsq_skip_replicated(m->opt, k != 0);
    return TD_OK;
}

td_status td__tp_build(td_strategy *s, td_group *g, const double *share, tensor_par **out) {
    tensor_par *p = td__calloc(sizeof *p, "the tensor strategy");
    *out = p;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    p->s = s;
    TD_CHECK(td__procs_open(g, &p->procs));
    p->g = p->procs.local ? p->procs.local : g;
    p->size = td_group_size(p->g);
    TD_CHECK(check_group(p));
    TD_CHECK(td_model_describe(s->json, s->model_name, &p->info, NULL, 0));
    p->lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1;
    TD_CHECK(
        td_model_describe_splits(s->json, s->model_name, p->units, TD_SHARD_MAX_UNITS, &p->nunits));
    if (p->nunits == 0)
        return td__error_setting(
            TD_ERR_UNSUPPORTED, "strategy",
            "tensor: %s has no layer to split across devices (an MLP pair: linear, "
            "activation, linear; or attention); use `strategy` data or pipeline",
            s->model_name ? s->model_name : "the model");
    for (int k = 0; k < p->size; k++) {
        p->mb[k].group = p->g;
        p->mb[k].dev = td_group_device(p->g, k);
        p->mb[k].rank = k;
        TD_CHECK(td_buffer_alloc(p->mb[k].dev, sizeof(double), &p->mb[k].scalar));
    }
    if (share)
        return td__tp_use_shares(p, share);
    TD_CHECK(td__tp_plan(p));
    for (int k = 0; k < p->size; k++)
        TD_CHECK(td__tp_make_member(p, k));
    return td__tp_rebalance(p);
}

static td_status tp_create(td_strategy *s) {
    int64_t replicas = 1;
    tensor_par *p = NULL;
    td_status st;
    TD_CHECK(td__option_count(s, "replicas", 1, &replicas));
    if (replicas > 1 && td_group_local_size(s->group) != td_group_size(s->group)) {
        /* under mpirun each process is a replica (procs.c): data:P,tensor:N */
        if (replicas * td_group_local_size(s->group) != td_group_size(s->group))
            return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                     "tensor: %lld replicas over processes of %d devices each: "
                                     "under mpirun each process is one replica",
                                     (long long)replicas, td_group_local_size(s->group));
        replicas = 1;
    }
    st =
        replicas > 1 ? td__tp_mesh_open(s, (int)replicas, &p) : td__tp_build(s, s->group, NULL, &p);
    s->impl = p;
    return st;
}

static td_status tp_survivors(void *impl, td_group **out) {
    tensor_par *p = impl;
    return p->mesh ? td__tp_mesh_survivors(p->mesh, p->s->group, out)
                   : td_group_shrink(p->s->group, NULL, 0, out);
}

/* Whether the device of rank `member` in s's group is among the survivors. */
static int survived(const td_strategy *s, const td_group *survivors, int member) {
    td_device *dev = td_group_device(s->group, member);
    return dev && td_group_rank_of(survivors, dev) >= 0;
}

/* The survivors' holdings still cover every slice (under a mesh, the other
 * replica's; or the lost member held none): they carry on as one tensor
 * strategy over all of them, its slices planned anew, from what the
 * survivors that counted the most optimizer steps hold (a loss in a step's
 * last exchange may come after some updates). */
static td_status tp_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                             td_strategy *next, int *step_taken, const char **why) {
    td__holding h[TD_DP_MAX_MEMBERS], from[TD_DP_MAX_MEMBERS], to[TD_DP_MAX_MEMBERS];
    int alive[TD_DP_MAX_MEMBERS], n, nf = 0, nt;
    int64_t most = -1;
    char lost[200];
    tp_holdings(s->impl, h, &n);
    for (int k = 0; k < n; k++)
        if (survived(s, survivors, h[k].member))
            most = td_optimizer_steps(h[k].opt) > most ? td_optimizer_steps(h[k].opt) : most;
    for (int k = 0; k < n; k++) {
        alive[k] = survived(s, survivors, h[k].member) && td_optimizer_steps(h[k].opt) == most;
        if (alive[k])
            from[nf++] = h[k];
    }
    if (!td__placement_covers(h, n, alive, lost, sizeof lost)) {
        snprintf(s->why, sizeof s->why,
                 "the devices that took the step's update do not hold all of %s", lost);
        *why = s->why;
        return td__error(TD_ERR_UNSUPPORTED, "tensor: %s", s->why);
    }
    next->options[0] = '\0'; /* no replicas: the survivors split the model anew */
    next->cfg.options = next->options;
    TD_CHECK(tp_create(next));
    tp_holdings(next->impl, to, &nt);
    TD_CHECK(td__placement_copy(from, nf, to, nt, most));
    *step_taken = most > steps_before;
    return TD_OK;
}

static void tp_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    (void)impl;
    (void)f;
    out->show_plan = 1;
    snprintf(out->note, sizeof out->note,
             "tensor: every device takes every sample (the plan at the start says which heads "
             "and hidden features each holds); comm: the all-reduces of partial results and "
             "input gradients, waiting for the others included");
}

static const td_strategy_option tp_options[] = {
    {"replicas", "R",
     "data-parallel replicas of the split model within this process, each on size / R "
     "consecutive devices (the mesh data:R,tensor:N)"},
    {NULL, NULL, NULL},
};

const td_strategy_ops td__strategy_tensor = {
    .name = "tensor",
    .options = tp_options,
    .summary = "each layer's heads and hidden features split across the devices: batch size 1",
    .report = tp_report,
    .create = tp_create,
    .destroy = tp_destroy,
    .model_info = tp_model_info,
    .plan = tp_plan_text,
    .step = tp_step,
    .evaluate = tp_evaluate,
    .save = tp_save,
    .load = tp_load,
    .lr = tp_lr,
    .steps = tp_steps,
    .split = td__tp_split,
    .adopt_split = td__tp_adopt_split,
    .holdings = tp_holdings,
    .survivors = tp_survivors,
    .carry_on = tp_carry_on,
    .decoder = td__tensor_decoder,
};
