/* The `pipeline` strategy: member k of the group holds the model's layers
 * [first_k, end_k) (a part, td_model_load_part) and its own optimizer for
 * them. A step cuts the batch into M micro-batches that go through the
 * stages in the 1F1B order: stage s of P first runs P - s - 1 forwards, then
 * one forward and one backward in turn, then the backwards left, so it holds
 * at most P - s micro-batches' activations. A stage whose memory holds more
 * (the plan gives it up to M slots, at most TD_PP_MAX_SLOTS) runs that many forwards ahead instead,
 * but for the last stage, whose every backward the others wait for.
 * Each backward sends the input's gradient on first and leaves the weight
 * gradients for the stage's waits or the step's end; a stage after the first
 * may carry that end and its optimizer step into the next step's start
 * (pipeline_run.c). A stage receives its input from
 * the stage before and the gradient of its output from the stage after
 * through a channel: the sender posts its buffer, the receiver copies it onto
 * its own device (a peer copy where the backend can) on its own thread and
 * marks it consumed, and the sender overwrites a posted buffer only once it
 * was. Each member runs on its device's host thread, so where the copy
 * would need the sender's thread too (OpenCL devices, a CPU and a GPU), the
 * sender reads the message into host memory before posting it and the
 * receiver writes it from there: each on its own thread. Gradients of the micro-batches add up on
 * each stage, scaled by one over the whole batch's labels, so each stage's optimizer step is
 * exactly one device's over the whole batch (up to summation order). The step ends with an
 * all-gather of every stage's numbers and timings, a collective, so a lost member fails the step as
 * under the data strategy.
 *
 * This file holds the strategy's table (step, evaluate, save, load, the
 * report) and its creation; a step's run on the stages is pipeline_run.c,
 * the plan pipeline_plan.c, their shared types pipeline-impl.h. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/pipeline-impl.h"
#include "parallel/placement.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

static stage *first_stage(pipeline *p) {
    for (int k = 0; k < p->size; k++)
        if (p->st[k].part)
            return &p->st[k];
    return NULL;
}

static void fill_stats(pipeline *p, const td__member_row *rows, int64_t n, double step_s,
                       td_step_stats *stats) {
    double cost = 0, speed = 0, idle = 0;
    int active = 0;
    memset(stats, 0, sizeof *stats);
    stats->members = p->size;
    stats->step_s = step_s;
    stats->micro_batches = (int)p->m;
    for (int k = 0; k < p->size; k++) {
        cost += p->plan.seconds[k];
        speed += p->plan.alone_s[k] > 0 ? 1.0 / p->plan.alone_s[k] : 0;
    }
    /* The plan timed a batch of the configured size. */
    stats->ideal_s = speed > 0 ? (double)n / (double)p->s->cfg.batch / speed : 0;
    td__rows_to_stats(rows, p->size, step_s, stats->m);
    for (int k = 0; k < p->size; k++) {
        td_member_stats *m = &stats->m[k];
        m->samples = p->st[k].part ? n : 0;
        m->share = cost > 0 ? p->plan.seconds[k] / cost : 0;
        m->parked = !p->st[k].part;
        if (p->st[k].part) {
            idle += step_s > 0 ? m->wait_s / step_s : 0;
            active++;
        }
    }
    stats->bubble = active ? idle / active : 0;
    stats->bubble_theory = (double)(active - 1) / (double)(p->m + active - 1);
}

void td__pp_setup_step(pipeline *p, const td_batch *batch, int64_t first, uint64_t step,
                       double grad_scale) {
    td__pp_split(p, batch->n);
    p->batch = batch;
    p->first = first;
    p->evals = NULL;
    p->train = 1;
    p->step = step;
    p->grad_scale = grad_scale;
}

td_status td__pp_results(pipeline *p, td_step_result *res, td__member_row *rows) {
    TD_CHECK(td__rows_read(&p->st[0].rows, rows));
    memset(res, 0, sizeof *res);
    for (int k = 0; k < p->size; k++) { /* the last stage's numbers; the others give zeros */
        res->loss_sum += rows[k].loss_sum;
        res->correct += (int64_t)rows[k].correct;
        res->count += (int64_t)rows[k].count;
    }
    return TD_OK;
}

static td_status pp_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                         td_step_stats *stats) {
    pipeline *p = impl;
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1;
    td__member_row rows[TD_PP_MAX_STAGES];
    uint64_t t0 = td_clock_ns();
    if (p->mesh)
        return td__pp_mesh_step(p, batch, step, res, stats);
    td_batch mine = *batch;
    if (p->procs.nprocs > 1)
        td__pp_procs_setup_step(p, batch, &mine, step);
    else
        td__pp_setup_step(p, batch, 0, step, 1.0 / (double)(batch->n * lps));
    TD_CHECK(td__pp_run(p));
    TD_CHECK(td__pp_results(p, res, rows));
    TD_CHECK(td__pp_procs_results(p, res));
    if (stats)
        fill_stats(p, rows, mine.n, (double)(td_clock_ns() - t0) * 1e-9, stats);
    return TD_OK;
}

/* Sets p up to evaluate: each batch cut into micro-batches of the
 * training's size, so that it needs no more memory than the plan gave the
 * stages; their sums go into per_batch. */
static td_status setup_evaluation(pipeline *p, const td_batch *batches, size_t n,
                                  td_step_result *per_batch) {
    int64_t size = (p->s->cfg.batch + p->micro_batches - 1) / p->micro_batches, m = 0;
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1, feats = 1;
    for (int d = 0; d < p->info.in_ndim; d++)
        feats *= p->info.in_shape[d];
    for (size_t i = 0; i < n; i++)
        m += (batches[i].n + size - 1) / size;
    p->evals = td__calloc(sizeof *p->evals * (size_t)(m ? m : 1), "evaluation micro-batches");
    p->eval_of = td__calloc(sizeof *p->eval_of * (size_t)(m ? m : 1), "evaluation micro-batches");
    if (!p->evals || !p->eval_of)
        return TD_ERR_OUT_OF_MEMORY;
    m = 0;
    for (size_t i = 0; i < n; i++) {
        const td_batch *b = &batches[i];
        memset(&per_batch[i], 0, sizeof per_batch[i]);
        for (int64_t off = 0; off < b->n; off += size, m++) {
            p->evals[m].n = b->n - off < size ? b->n - off : size;
            p->evals[m].x = b->x ? b->x + off * feats : NULL;
            p->evals[m].tokens = b->tokens ? b->tokens + off * feats : NULL;
            p->evals[m].labels = b->labels + off * lps;
            p->eval_of[m] = i;
        }
    }
    p->eval_res = per_batch;
    p->m = m;
    p->train = 0;
    p->step = 0;
    p->grad_scale = 0;
    return TD_OK;
}

static void end_evaluation(pipeline *p) {
    free(p->evals);
    free(p->eval_of);
    p->evals = NULL;
    p->eval_of = NULL;
}

/* A tensor mesh evaluates on every chain at once (their stages' sums need
 * each other); the first chain's numbers are the answer. */
static td_status pp_evaluate(void *impl, const td_batch *batches, size_t n,
                             td_step_result *per_batch) {
    pipeline *p = impl;
    int chains = td__pp_mesh_sliced(p->mesh) ? td__pp_mesh_pipelines(p->mesh) : 1;
    td_step_result *scratch = NULL;
    td_status st = TD_OK;
    if (chains > 1 && !(scratch = td__calloc(sizeof *scratch * (n ? n : 1) * (size_t)chains,
                                             "evaluation results")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int j = 0; j < chains && st == TD_OK; j++)
        st = setup_evaluation(j ? td__pp_mesh_pipeline(p->mesh, j) : p, batches, n,
                              j ? scratch + (size_t)j * n : per_batch);
    if (st == TD_OK && p->m > 0)
        st = chains > 1 ? td__pp_mesh_run(p) : td__pp_run(p);
    for (int j = 0; j < chains; j++)
        end_evaluation(j ? td__pp_mesh_pipeline(p->mesh, j) : p);
    free(scratch);
    return st;
}

/* The stages that hold layers, in layer order, at their ranks in the
 * strategy's group: *n of them. */
static void holdings_of(const pipeline *p, td__holding *h, int *n) {
    *n = 0;
    for (int k = 0; k < p->size; k++)
        if (p->st[k].part)
            h[(*n)++] = (td__holding){p->st[k].part, p->st[k].opt, p->rank0 + k * p->rank_step};
}

/* Every pipeline's stages, pipeline after pipeline. */
static void pp_holdings(void *impl, td__holding *h, int *n) {
    pipeline *p = impl;
    int pipelines = td__pp_mesh_pipelines(p->mesh);
    *n = 0;
    for (int r = 0; r < pipelines; r++) {
        int got;
        holdings_of(r ? td__pp_mesh_pipeline(p->mesh, r) : p, h + *n, &got);
        *n += got;
    }
}

static td_status settle_all(pipeline *p) {
    for (int r = 0; r < td__pp_mesh_pipelines(p->mesh); r++)
        TD_CHECK(td__pp_settle(r ? td__pp_mesh_pipeline(p->mesh, r) : p));
    return TD_OK;
}

static td_status pp_save(void *impl, const char *path, const td_train_state *state) {
    pipeline *p = impl;
    td__holding h[TD_DP_MAX_MEMBERS];
    int n;
    TD_CHECK(settle_all(p));
    if (p->procs.process != 0) /* every process holds the same model: one writes */
        return TD_OK;
    if (td__pp_mesh_sliced(p->mesh))
        pp_holdings(p, h, &n);
    else
        holdings_of(p, h, &n); /* every replica holds the same */
    return td__placement_save(h, n, path, state);
}

static td_status pp_load(void *impl, const char *path, td_train_state *state) {
    pipeline *p = impl;
    td__holding h[TD_DP_MAX_MEMBERS];
    int n;
    TD_CHECK(settle_all(p));
    pp_holdings(p, h, &n);
    return td__placement_load(h, n, path, state);
}

static double pp_lr(void *impl) {
    return td_optimizer_lr(first_stage(impl)->opt);
}

static int64_t pp_steps(void *impl) {
    return td_optimizer_steps(first_stage(impl)->opt);
}

static void pp_model_info(void *impl, td_model_info *out) {
    *out = ((pipeline *)impl)->info;
}

/* A line per stage of replica p. */
static size_t plan_lines(const pipeline *p, char *buf, size_t n) {
    size_t used = 0;
    for (int k = 0; k < p->size && used < n; k++) {
        const char *name = td_device_name(p->st[k].dev);
        if (!p->st[k].part)
            used += (size_t)snprintf(buf + used, n - used,
                                     "%s: no layer (more devices than layers, or too slow to "
                                     "shorten the step)\n",
                                     name);
        else
            used += (size_t)snprintf(
                buf + used, n - used,
                "%s: layers %d-%d (%s .. %s), %.1f MB, %.1f ms a step "
                "measured, %d micro-batch slot%s\n",
                name, p->plan.first[k], p->plan.end[k] - 1, p->layers[p->plan.first[k]].type,
                p->layers[p->plan.end[k] - 1].type, (double)p->plan.bytes[k] / 1e6,
                p->plan.seconds[k] * 1e3, p->st[k].slots, p->st[k].slots == 1 ? "" : "s");
    }
    return used;
}

static const char *pp_plan_text(void *impl, char *buf, size_t n) {
    pipeline *p = impl;
    int replicas = td__pp_mesh_pipelines(p->mesh);
    size_t used = 0;
    buf[0] = '\0';
    if (td__pp_mesh_sliced(p->mesh))
        return td__pp_mesh_plan(p, buf, n);
    for (int r = 0; r < replicas && used < n; r++) {
        if (replicas > 1)
            used += (size_t)snprintf(buf + used, n - used,
                                     "replica %d of %d, rows %d/%d of each batch%s:\n", r + 1,
                                     replicas, r + 1, replicas, r ? ", cut as the first" : "");
        if (used < n)
            used += plan_lines(r ? td__pp_mesh_pipeline(p->mesh, r) : p, buf + used, n - used);
    }
    return buf;
}

static void pp_destroy(void *impl) {
    pipeline *p = impl;
    if (p)
        td__pp_mesh_close(p->mesh);
    td__pp_free(p);
}

void td__pp_free(pipeline *p) {
    if (!p)
        return;
    for (int k = 0; k < p->size; k++) {
        stage *s = &p->st[k];
        td_optimizer_destroy(s->opt);
        td_model_destroy(s->part);
        td_buffer_free(s->recv);
        td__rows_free(&s->rows);
        td_buffer_free(s->terms);
        free(s->terms_host);
        for (int i = 0; i < TD_PP_MAX_SLOTS; i++) {
            free(p->fwd[k].host[i]);
            free(p->bwd[k].host[i]);
        }
        pthread_mutex_destroy(&p->fwd[k].mu);
        pthread_cond_destroy(&p->fwd[k].cv);
        pthread_mutex_destroy(&p->bwd[k].mu);
        pthread_cond_destroy(&p->bwd[k].cv);
    }
    free(p->layers);
    free(p->shards);
    td__procs_close(&p->procs);
    free(p);
}

static const td_strategy_option pp_options[] = {
    {"micro_batches", "M",
     "micro-batches per step, at most the batch (default: four per "
     "device, or the batch if smaller)"},
    {"replicas", "R",
     "data-parallel replicas of the pipeline within this process, each on size / R "
     "consecutive devices (the mesh data:R,pipeline:N)"},
    {"tensor", "N",
     "each stage split over N consecutive devices by heads and hidden features, as "
     "the tensor strategy splits a model (the mesh pipeline:P,tensor:N)"},
    {NULL, NULL, NULL},
};

/* The micro-batch count: the configured one, checked, or four per stage. */
static td_status choose_micro_batches(pipeline *p) {
    const td_strategy_config *c = &p->s->cfg;
    int64_t m = 0;
    TD_CHECK(td__option_count(p->s, "micro_batches", 1, &m));
    if (m == 0)
        m = c->batch < 4 * (int64_t)p->size ? c->batch : 4 * (int64_t)p->size;
    if (m > c->batch)
        return td__error(TD_ERR_INVALID_ARG,
                         "pipeline: %lld micro-batches (`micro_batches`) for a batch of %lld "
                         "samples: at most one micro-batch per sample",
                         (long long)m, (long long)c->batch);
    if (m > MAX_MICRO)
        return td__error(TD_ERR_INVALID_ARG, "pipeline: %lld micro-batches: at most %d",
                         (long long)m, MAX_MICRO);
    p->micro_batches = m;
    return TD_OK;
}

static td_status describe(pipeline *p) {
    td_strategy *s = p->s;
    TD_CHECK(td_model_describe(s->json, s->model_name, &p->info, NULL, 0));
    if (!(p->layers =
              td__calloc((size_t)p->info.layers * sizeof *p->layers, "the layers' descriptions")))
        return TD_ERR_OUT_OF_MEMORY;
    return td_model_describe(s->json, s->model_name, &p->info, p->layers, p->info.layers);
}

static td_status check_devices(pipeline *p) {
    if (strcmp(td_group_transport(p->g), "local") || td_group_local_size(p->g) != p->size)
        return td__error(TD_ERR_UNSUPPORTED,
                         "pipeline: runs within one process (the group's transport is %s); "
                         "across processes use the mesh data:P,pipeline:N (each process one "
                         "replica) or the data strategy",
                         td_group_transport(p->g));
    for (int k = 0; k < p->size; k++)
        TD_CHECK(td__tensor_check_dtype(td_group_device(p->g, k), p->s->cfg.dtype));
    return TD_OK;
}

static td_status allreduce_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    td_tensor *t = arg;
    td_buffer b = td__tensor_as_buffer(t); /* a view into the part's activations */
    (void)dev, (void)rank, (void)size;
    return td_allreduce(g, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t), TD_REDUCE_SUM);
}

/* A split stage's reduce hook: its partial sums added up over the members
 * splitting it, within its forward or backward (whose time it counted). */
static td_status reduce_in_stage(void *arg, td_tensor *t) {
    stage *st = arg;
    uint64_t t0 = td_clock_ns();
    td_status ret = td_group_join(st->tgroup, allreduce_member, t);
    double dt = (double)(td_clock_ns() - t0) * 1e-9;
    st->comm_s += dt;
    st->compute_s -= dt;
    return ret;
}

static td_status load_part(pipeline *p, int k, td_model **out) {
    td_strategy *s = p->s;
    if (p->shards)
        return td_model_load_part_shard(s->json, s->model_name, p->st[k].dev, s->cfg.dtype,
                                        s->cfg.seed, p->plan.first[k], p->plan.end[k],
                                        p->st[k].slots, &p->shards[k], out);
    return td_model_load_part(s->json, s->model_name, p->st[k].dev, s->cfg.dtype, s->cfg.seed,
                              p->plan.first[k], p->plan.end[k], p->st[k].slots, out);
}

static td_status make_stage(pipeline *p, int k) {
    td_strategy *s = p->s;
    stage *st = &p->st[k];
    st->p = p;
    st->group = p->g;
    st->dev = td_group_device(p->g, k);
    st->rank = k;
    TD_CHECK(td__rows_alloc(st->dev, p->size, &st->rows));
    if (p->plan.end[k] == p->plan.first[k])
        return TD_OK;
    st->slots = p->plan.slots[k];
    TD_CHECK(load_part(p, k, &st->part));
    if (st->tgroup)
        td_model_set_reduce_hook(st->part, reduce_in_stage, st);
    TD_CHECK(td_optimizer_create(st->part, &s->cfg.opt, &st->opt));
    if (s->cfg.opt.clip_norm > 0)
        td_optimizer_set_sumsq_reduce(st->opt, td__pp_sum_over_stages, st);
    /* the layers a split stage holds whole count once in the norm */
    td_optimizer_set_sumsq_skip_replicated(st->opt, st->shard != 0);
    return TD_OK;
}

/* Places every stage's parameters take in the model's gradient norm. */
static td_status make_norm_terms(pipeline *p) {
    for (int k = 0; k < p->size; k++) {
        p->st[k].term_first = p->nterms;
        if (p->st[k].part)
            p->nterms += 2 * td_model_param_count(p->st[k].part);
    }
    for (int k = 0; k < p->size; k++) {
        stage *st = &p->st[k];
        if (!(st->terms_host = td__calloc(sizeof(double) * (p->nterms + 1), "a pipeline stage")))
            return TD_ERR_OUT_OF_MEMORY;
        TD_CHECK(td_buffer_alloc(st->dev, sizeof(double) * (p->nterms + 1), &st->terms));
    }
    return TD_OK;
}

td_status td__pp_begin(td_strategy *s, td_group *g, pipeline **out) {
    pipeline *p = td__calloc(sizeof *p, "a pipeline");
    *out = p;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    p->s = s;
    p->g = g;
    p->rank_step = 1;
    if (td_group_size(g) > TD_PP_MAX_STAGES)
        return td__error(TD_ERR_INVALID_ARG, "pipeline: %d devices; at most %d", td_group_size(g),
                         TD_PP_MAX_STAGES);
    p->size = td_group_size(g);
    for (int k = 0; k < p->size; k++) {
        pthread_mutex_init(&p->fwd[k].mu, NULL);
        pthread_cond_init(&p->fwd[k].cv, NULL);
        pthread_mutex_init(&p->bwd[k].mu, NULL);
        pthread_cond_init(&p->bwd[k].cv, NULL);
    }
    TD_CHECK(check_devices(p));
    TD_CHECK(choose_micro_batches(p));
    return describe(p);
}

td_status td__pp_measure(pipeline *p, const unsigned char *joined, td_pp_plan *plan) {
    td_strategy *s = p->s;
    td_pp_need need = {s->json,  s->model_name, s->cfg.dtype, s->cfg.seed,      &s->cfg.opt,
                       &p->info, p->layers,     s->cfg.batch, p->micro_batches, joined};
    return td__pp_plan(p->g, &need, plan);
}

td_status td__pp_finish(pipeline *p, const td_pp_plan *plan) {
    int last = -1;
    p->plan = *plan;
    for (int k = 0; k < p->size; k++) {
        p->prev[k] = p->next[k] = -1;
        if (p->plan.end[k] == p->plan.first[k])
            continue;
        p->prev[k] = last;
        if (last >= 0) {
            p->next[last] = k;
            td_device *a = td_group_device(p->g, last), *b = td_group_device(p->g, k);
            p->fwd[last].staged = !td_buffer_copy_is_direct(b, a);
            p->bwd[k].staged = !td_buffer_copy_is_direct(a, b);
        }
        last = k;
    }
    for (int k = 0; k < p->size; k++)
        TD_CHECK(make_stage(p, k));
    return make_norm_terms(p);
}

td_status td__pp_build(td_strategy *s, td_group *g, const td_pp_plan *plan, pipeline **out) {
    td_pp_plan measured;
    TD_CHECK(td__pp_begin(s, g, out));
    if (!plan) {
        TD_CHECK(td__pp_measure(*out, NULL, &measured));
        plan = &measured;
    }
    return td__pp_finish(*out, plan);
}

static td_status pp_create(td_strategy *s) {
    int64_t replicas = 1, tensor = 1;
    pipeline *p = NULL;
    td_status st;
    TD_CHECK(td__option_count(s, "replicas", 1, &replicas));
    TD_CHECK(td__option_count(s, "tensor", 1, &tensor));
    if (replicas > 1 && td_group_local_size(s->group) != td_group_size(s->group)) {
        /* under mpirun each process is a replica (pp_procs.c): data:P,pipeline:N */
        if (replicas * td_group_local_size(s->group) != td_group_size(s->group) || tensor > 1)
            return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                     "pipeline: %lld replicas over processes of %d devices each: "
                                     "under mpirun each process is one replica",
                                     (long long)replicas, td_group_local_size(s->group));
        st = td__pp_procs_open(s, &p);
        s->impl = p;
        return st;
    }
    st = replicas > 1 || tensor > 1 ? td__pp_mesh_open(s, (int)replicas, (int)tensor, &p)
                                    : td__pp_build(s, s->group, NULL, &p);
    s->impl = p;
    return st;
}

static void pp_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    (void)impl;
    (void)f;
    out->show_plan = 1;
    snprintf(out->comm_label, sizeof out->comm_label, "transfer s");
    snprintf(out->wait_label, sizeof out->wait_label, "idle s");
    snprintf(out->note, sizeof out->note,
             "pipeline: share: of the layers' cost; transfer: activations and their gradients "
             "copied in; idle: the bubble and waiting for the neighbours");
}

/* Stage k's part, optimizer and rows made again (after new slices). */
td_status td__pp_remake_stages(pipeline *p) {
    for (int k = 0; k < p->size; k++) {
        stage *st = &p->st[k];
        td_optimizer_destroy(st->opt);
        td_model_destroy(st->part);
        td__rows_free(&st->rows);
        st->opt = NULL;
        st->part = NULL;
        TD_CHECK(make_stage(p, k));
    }
    return TD_OK;
}

const td_strategy_ops td__strategy_pipeline = {
    .name = "pipeline",
    .summary = "the layers cut into stages, one per device, micro-batches flowing through "
               "them: a model too big for one device",
    .options = pp_options,
    .report = pp_report,
    .create = pp_create,
    .destroy = pp_destroy,
    .model_info = pp_model_info,
    .plan = pp_plan_text,
    .step = pp_step,
    .evaluate = pp_evaluate,
    .save = pp_save,
    .load = pp_load,
    .lr = pp_lr,
    .steps = pp_steps,
    .holdings = pp_holdings,
    .split = td__pp_mesh_split,
    .adopt_split = td__pp_mesh_adopt_split,
    .decoder = td__pipeline_decoder,
};
