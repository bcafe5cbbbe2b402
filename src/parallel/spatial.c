/* The `spatial` strategy (split-frame rendering's counterpart): every
 * member holds the whole model, and runs its head (the leading conv2d,
 * pool and activation layers) on one horizontal band of each image, the
 * bands sized by measured speed (spatial_plan.c). Before each convolution
 * or pooling neighbours trade the halo rows it reads, and after its
 * backward the gradients of those rows go back to their owner and are added
 * there; the head's output is gathered whole on every member, and the rest
 * of the model (flatten, linear) runs replicated, on the same numbers
 * everywhere. The head's weight gradients (each member's band's) are
 * all-reduced; the others agree already. The exchanges are the model's
 * gather hook (an all-gather) and its reduce hook (src/nn/band.c), so that
 * `nn` needs no `comm`. Every member then takes the same update.
 *
 * Checkpoints are whole-model files from member 0 (every member holds the
 * same weights), loaded into every member; the shares are recorded
 * (`split`) so that a resumed run cuts the same bands. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/placement.h"
#include "parallel/spatial-impl.h"
#include "tensor/view.h"

/* The hook the head's weight gradients are summed through. */
static td_status reduce_hook(void *arg, td_tensor *t) {
    sp_member *m = arg;
    td_buffer b = td__tensor_as_buffer(t);
    uint64_t t0 = td_clock_ns();
    td_status st =
        td_allreduce(m->group, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t), TD_REDUCE_SUM);
    m->reduce_s += (double)(td_clock_ns() - t0) * 1e-9;
    return st;
}

/* Steps ------------------------------------------------------------------------ */

typedef struct sp_step_call {
    spatial_par *p;
    const td_batch *batch;
    uint64_t step;
    double grad_scale;
} sp_step_call;

static double comm_of(const sp_member *m) {
    return m->halo_s + m->gather_s + m->reduce_s;
}

static td_status step_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    sp_step_call *c = arg;
    sp_member *m = &c->p->mb[rank];
    uint64_t t0 = td_clock_ns(), t1;
    (void)dev;
    (void)size;
    m->halo_s = m->gather_s = m->reduce_s = m->update_s = 0;
    memset(&m->res, 0, sizeof m->res);
    TD_CHECK(td_model_train_slice(m->m, c->batch, 0, c->grad_scale, 0, c->step, &m->res));
    t1 = td_clock_ns();
    m->compute_s = fmax(0, (double)(t1 - t0) * 1e-9 - comm_of(m));
    TD_CHECK(td_optimizer_step(m->opt, NULL));
    m->update_s = (double)(td_clock_ns() - t1) * 1e-9;
    {
        td__member_row row = {.compute_s = m->compute_s,
                              .comm_s = comm_of(m),
                              .update_s = m->update_s,
                              .loss_sum = m->res.loss_sum,
                              .correct = (double)m->res.correct,
                              .count = (double)m->res.count};
        return td__rows_gather(g, &m->rows, &row);
    }
}

static void fill_stats(spatial_par *p, const td__member_row *rows, int64_t n, double step_s,
                       td_step_stats *stats) {
    double speed = 0;
    memset(stats, 0, sizeof *stats);
    stats->members = p->size;
    stats->step_s = step_s;
    for (int k = 0; k < p->size; k++)
        speed += p->mb[k].alone_s > 0 ? 1.0 / p->mb[k].alone_s : 0;
    stats->ideal_s = speed > 0 ? (double)n / speed : 0;
    td__rows_to_stats(rows, p->size, step_s, stats->m);
    for (int k = 0; k < p->size; k++) {
        stats->m[k].samples = n;
        stats->m[k].share = p->share[k];
        stats->m[k].halo_s = p->mb[k].halo_s;
    }
}

static td_status sp_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                         td_step_stats *stats) {
    spatial_par *p = impl;
    td__member_row rows[TD_DP_MAX_MEMBERS];
    uint64_t t0 = td_clock_ns();
    sp_step_call c = {p, batch, step, 1.0 / (double)batch->n};
    TD_CHECK(td_group_run(p->g, step_job, &c));
    TD_CHECK(td__rows_read(&p->mb[0].rows, rows));
    res->loss_sum = rows[0].loss_sum;
    res->correct = (int64_t)rows[0].correct;
    res->count = (int64_t)rows[0].count;
    if (stats)
        fill_stats(p, rows, batch->n, (double)(td_clock_ns() - t0) * 1e-9, stats);
    return td__sp_rebalance(p);
}

static td_status sp_evaluate(void *impl, const td_batch *batches, size_t n,
                             td_step_result *per_batch) {
    spatial_par *p = impl;
    td_model *models[TD_DP_MAX_MEMBERS];
    for (int k = 0; k < p->size; k++)
        models[k] = p->mb[k].m;
    return td__rows_evaluate_alike(p->g, models, batches, n, per_batch);
}

/* Checkpoints (placement.c) and the rest ----------------------------------------- */

static void sp_holdings(void *impl, td__holding *h, int *n) {
    spatial_par *p = impl;
    for (int k = 0; k < p->size; k++)
        h[k] = (td__holding){p->mb[k].m, p->mb[k].opt, k};
    *n = p->size;
}

static td_status sp_save(void *impl, const char *path, const td_train_state *state) {
    td__holding h[TD_DP_MAX_MEMBERS];
    int n;
    sp_holdings(impl, h, &n);
    return td__placement_save(h, 1, path, state); /* every member holds the same */
}

static td_status sp_load(void *impl, const char *path, td_train_state *state) {
    td__holding h[TD_DP_MAX_MEMBERS];
    int n;
    sp_holdings(impl, h, &n);
    return td__placement_load(h, n, path, state);
}

static double sp_lr(void *impl) {
    return td_optimizer_lr(((spatial_par *)impl)->mb[0].opt);
}

static int64_t sp_steps(void *impl) {
    return td_optimizer_steps(((spatial_par *)impl)->mb[0].opt);
}

static void sp_model_info(void *impl, td_model_info *out) {
    *out = ((spatial_par *)impl)->info;
}

static void sp_destroy(void *impl) {
    spatial_par *p = impl;
    if (!p)
        return;
    for (int k = 0; k < p->size; k++) {
        td_optimizer_destroy(p->mb[k].opt);
        td_model_destroy(p->mb[k].m);
        td__rows_free(&p->mb[k].rows);
    }
    free(p->bounds);
    free(p);
}

static td_status check_group(spatial_par *p) {
    if (p->size > TD_DP_MAX_MEMBERS)
        return td__error(TD_ERR_INVALID_ARG, "spatial: %d devices; at most %d", p->size,
                         TD_DP_MAX_MEMBERS);
    if (td_group_local_size(p->g) != p->size)
        return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                 "spatial: runs within one process; this group spans several");
    for (int k = 0; k < p->size; k++)
        TD_CHECK(td__tensor_check_dtype(td_group_device(p->g, k), p->s->cfg.dtype));
    return TD_OK;
}

static td_status make_member(spatial_par *p, int k) {
    td_strategy *s = p->s;
    sp_member *m = &p->mb[k];
    m->group = p->g;
    m->dev = td_group_device(p->g, k);
    m->rank = k;
    TD_CHECK(td__rows_alloc(m->dev, p->size, &m->rows));
    TD_CHECK(
        td_model_load_string(s->json, s->model_name, m->dev, s->cfg.dtype, s->cfg.seed, &m->m));
    td_model_set_reduce_hook(m->m, reduce_hook, m);
    return td_optimizer_create(m->m, &s->cfg.opt, &m->opt);
}

static td_status sp_create(td_strategy *s) {
    spatial_par *p = td__calloc(sizeof *p, "the spatial strategy");
    s->impl = p;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    p->s = s;
    p->g = s->group;
    p->size = td_group_size(p->g);
    p->rebalance = 1;
    TD_CHECK(td__option_flag(s, "rebalance", &p->rebalance));
    TD_CHECK(check_group(p));
    TD_CHECK(td_model_describe(s->json, s->model_name, &p->info, NULL, 0));
    TD_CHECK(td_model_describe_bands(s->json, s->model_name, &p->head));
    p->bounds = td__calloc(sizeof(int64_t) * (size_t)p->head.layers * (size_t)(p->size + 1),
                           "the spatial bands");
    if (!p->bounds)
        return TD_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < p->size; k++)
        TD_CHECK(make_member(p, k));
    TD_CHECK(td__sp_calibrate(p));
    return td__sp_cut_fitting(p);
}

/* Whether the device of rank `member` in s's group is among the survivors. */
static int survived(const td_strategy *s, const td_group *survivors, int member) {
    td_device *dev = td_group_device(s->group, member);
    return dev && td_group_rank_of(survivors, dev) >= 0;
}

/* Every member holds the whole model, so any survivor can carry the run on:
 * the survivors make a spatial strategy of their own, its bands cut anew,
 * from the weights and optimizer state of the survivors that counted the
 * most optimizer steps (a loss in a step's last exchange may come after
 * some members' updates). */
static td_status sp_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                             td_strategy *next, int *step_taken, const char **why) {
    td__holding h[TD_DP_MAX_MEMBERS], from[TD_DP_MAX_MEMBERS], to[TD_DP_MAX_MEMBERS];
    int n, nf = 0, nt;
    int64_t most = -1;
    (void)why;
    sp_holdings(s->impl, h, &n);
    for (int k = 0; k < n; k++)
        if (survived(s, survivors, h[k].member) && td_optimizer_steps(h[k].opt) > most)
            most = td_optimizer_steps(h[k].opt);
    for (int k = 0; k < n; k++)
        if (survived(s, survivors, h[k].member) && td_optimizer_steps(h[k].opt) == most)
            from[nf++] = h[k];
    if (nf == 0)
        return td__error(TD_ERR_INVALID_ARG, "spatial: no member survived");
    TD_CHECK(sp_create(next));
    sp_holdings(next->impl, to, &nt);
    TD_CHECK(td__placement_copy(from, nf, to, nt, most));
    *step_taken = most > steps_before;
    return TD_OK;
}

static void sp_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    (void)impl;
    (void)f;
    out->show_plan = 1;
    snprintf(out->note, sizeof out->note,
             "spatial: every device takes every image, its band of rows through the conv "
             "layers (the plan says which); comm: the halo rows traded before each "
             "convolution, the bands gathered after the last, the weight gradients summed, "
             "waiting for the others included");
}

static const td_strategy_option sp_options[] = {
    {"rebalance", "0|1",
     "cut the bands anew while it runs, as the measured compute asks (default 1); 0 keeps the "
     "bands of the start, for runs that repeat bitwise"},
    {NULL, NULL, NULL},
};

const td_strategy_ops td__strategy_spatial = {
    .name = "spatial",
    .options = sp_options,
    .summary = "each image's rows cut into bands across the devices (split-frame): conv nets "
               "at batch size 1",
    .report = sp_report,
    .create = sp_create,
    .destroy = sp_destroy,
    .model_info = sp_model_info,
    .plan = td__sp_plan_text,
    .step = sp_step,
    .evaluate = sp_evaluate,
    .save = sp_save,
    .load = sp_load,
    .lr = sp_lr,
    .steps = sp_steps,
    .split = td__sp_split,
    .adopt_split = td__sp_adopt_split,
    .holdings = sp_holdings,
    .carry_on = sp_carry_on,
};
