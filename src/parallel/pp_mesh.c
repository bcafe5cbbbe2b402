/* data × pipeline within one process (the mesh data:R,pipeline:N, mesh.c),
 * pipeline × tensor (pipeline:P,tensor:N) and both (data:R,pipeline:P,tensor:N):
 * R replicas of the pipeline, each over N consecutive members of the group,
 * all cut alike (the first replica's measured plan), so that stage k of
 * every replica holds the same layers. A step gives replica r rows
 * [n r / R, n (r + 1) / R) of the batch; the replicas run their schedules at
 * once (a thread each: a group's run blocks its caller), and before its
 * optimizer step each stage sums its gradients with the same stage of the
 * other replicas, joining their group from inside its own run
 * (td_group_join): every replica takes the same update. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/pipeline-impl.h"
#include "parallel/strategy-impl.h"

struct pp_mesh {
    td__mesh m; /* the replicas' groups and those across them; or, with a tensor
                   axis, (replica 0's) stages' members (rgroup) and chains (across) */
    int tensor; /* members splitting each stage; 1: rep[] are replicas */
    /* With a tensor axis, replicas of the whole (data:R,pipeline:P,tensor:N):
     * R, the groups across them (data.across[k N + j]: member j of stage k
     * in every replica) and replica r's stages and chains (sub[r], r >= 1). */
    int replicas;
    td__mesh data, *sub;
    double share[TD_PP_MAX_STAGES][TD_DP_MAX_MEMBERS]; /* stage k's split, by member */
    pipeline *rep[TD_DP_MAX_MEMBERS];                  /* rep[0] is the strategy's own */
};

int td__pp_mesh_pipelines(const pp_mesh *x) {
    return !x ? 1 : x->tensor > 1 ? x->tensor * x->replicas : x->m.replicas;
}

int td__pp_mesh_sliced(const pp_mesh *x) {
    return x && x->tensor > 1;
}

pipeline *td__pp_mesh_pipeline(const pp_mesh *x, int r) {
    return x->rep[r];
}

void td__pp_mesh_close(pp_mesh *x) {
    if (!x)
        return;
    for (int r = 1; r < td__pp_mesh_pipelines(x); r++)
        td__pp_free(x->rep[r]);
    td__mesh_close(&x->m);
    if (x->replicas > 1 && x->tensor > 1) {
        for (int r = 1; r < x->replicas && x->sub; r++)
            td__mesh_close(&x->sub[r]);
        td__mesh_close(&x->data);
    }
    free(x->sub);
    free(x);
}

static td_status open_replicas(td_strategy *s, pp_mesh *x, int replicas) {
    td_status st;
    TD_CHECK(td__mesh_open(s->group, replicas, "pipeline", &x->m));
    st = td__pp_build(s, x->m.rgroup[0], NULL, &x->rep[0]);
    for (int r = 1; r < replicas && st == TD_OK; r++)
        st = td__pp_build(s, x->m.rgroup[r], &x->rep[0]->plan, &x->rep[r]);
    for (int r = 0; r < replicas && st == TD_OK; r++) {
        x->rep[r]->rank0 = r * x->m.n;
        for (int k = 0; k < x->m.n; k++)
            x->rep[r]->st[k].across = x->m.across[k];
    }
    return st;
}

/* Stage k's members' shares of its units, by their speed at reading
 * weights (as the decoders cut theirs). */
static td_status measure_shares(td_strategy *s, pp_mesh *x) {
    double alone[TD_DP_MAX_MEMBERS];
    for (int k = 0; k < x->m.replicas; k++) {
        for (int j = 0; j < x->tensor; j++)
            TD_CHECK(td__speed_probe(td_group_device(x->m.rgroup[k], j), s->cfg.dtype, &alone[j]));
        td__shares_from_speed(alone, x->tensor, x->share[k]);
    }
    return TD_OK;
}

/* Chain j's slices: of every unit, stage k's share of member j. */
static td_status cut_slices(td_strategy *s, const pp_mesh *x, int j, td_shard_plan **out) {
    td_split_info units[TD_SHARD_MAX_UNITS];
    int nunits;
    td_shard_plan *plans;
    TD_CHECK(td_model_describe_splits(s->json, s->model_name, units, TD_SHARD_MAX_UNITS, &nunits));
    if (!(*out = plans = td__calloc(sizeof *plans * (size_t)x->m.replicas, "a stage's slices")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < x->m.replicas; k++)
        td__cut_units(units, nunits, x->share[k], x->tensor, TD_WEIGHTS_F32, j, &plans[k]);
    return TD_OK;
}

/* By top-level layer, 1 inside a split unit (a pair of linears at the
 * top): a stage beginning there would send on a slice of the pair's
 * hidden features, not its output. */
static td_status mark_joined(td_strategy *s, int layers, unsigned char **out, int *units) {
    td_split_info u[TD_SHARD_MAX_UNITS];
    unsigned char *joined;
    TD_CHECK(td_model_describe_splits(s->json, s->model_name, u, TD_SHARD_MAX_UNITS, units));
    if (!(*out = joined = td__calloc((size_t)layers + 1, "a pipeline plan")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < *units; k++) {
        int at, len = 0;
        if (sscanf(u[k].layer, "layers.%d%n", &at, &len) == 1 && u[k].layer[len] == '\0')
            for (int i = at + 1; i < at + u[k].span && i < layers; i++)
                joined[i] = 1;
    }
    return TD_OK;
}

/* Replica r's stages and chains over g (r 0: x->m), and its pipelines:
 * chain j's is rep[r * tensor + j]. */
static td_status begin_replica(td_strategy *s, pp_mesh *x, int r, td_group *g) {
    td__mesh *cm = r ? &x->sub[r] : &x->m;
    TD_CHECK(td__mesh_open(g, td_group_size(g) / x->tensor, "pipeline", cm));
    for (int j = 0; j < x->tensor; j++)
        TD_CHECK(td__pp_begin(s, cm->across[j], &x->rep[r * x->tensor + j]));
    return TD_OK;
}

/* pipeline:P,tensor:N: the stages of chain j are member j of every
 * stage's members; all cut alike (the first chain's measured plan). With
 * R replicas of that (data:R,pipeline:P,tensor:N), replica r is the group's
 * r-th P N consecutive devices, cut as replica 0, its rows of the batch
 * its own, and member j of stage k sums its gradients with member j of
 * stage k of every other replica. */
static td_status open_chains(td_strategy *s, pp_mesh *x, int replicas, int tensor) {
    td_pp_plan plan;
    int per = td_group_size(s->group) / replicas, units = 0;
    unsigned char *joined = NULL;
    td_status st;
    x->tensor = tensor;
    x->replicas = replicas;
    if (replicas > 1) {
        if (!(x->sub = td__calloc(sizeof *x->sub * (size_t)replicas, "a mesh's replicas")))
            return TD_ERR_OUT_OF_MEMORY;
        TD_CHECK(td__mesh_open(s->group, replicas, "pipeline", &x->data));
    }
    for (int r = 0; r < replicas; r++)
        TD_CHECK(begin_replica(s, x, r, replicas > 1 ? x->data.rgroup[r] : s->group));
    st = mark_joined(s, x->rep[0]->info.layers, &joined, &units);
    if (st == TD_OK && units == 0)
        st = td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                               "pipeline x tensor: %s has no layer to split across devices (an "
                               "MLP pair, or attention)",
                               s->model_name ? s->model_name : "the model");
    if (st == TD_OK)
        st = td__pp_measure(x->rep[0], joined, &plan);
    free(joined);
    TD_CHECK(st);
    TD_CHECK(measure_shares(s, x));
    for (int q = 0; q < replicas * tensor; q++) {
        int r = q / tensor, j = q % tensor;
        const td__mesh *cm = r ? &x->sub[r] : &x->m;
        pipeline *p = x->rep[q];
        p->rank0 = r * per + j;
        p->rank_step = tensor;
        for (int k = 0; k < p->size; k++) {
            p->st[k].tgroup = cm->rgroup[k];
            p->st[k].shard = j;
            if (replicas > 1)
                p->st[k].across = x->data.across[k * tensor + j];
        }
        TD_CHECK(cut_slices(s, x, j, &p->shards));
        TD_CHECK(td__pp_finish(p, &plan));
    }
    return TD_OK;
}

td_status td__pp_mesh_open(td_strategy *s, int replicas, int tensor, pipeline **out) {
    pp_mesh *x;
    td_status st;
    *out = NULL;
    if (!(x = td__calloc(sizeof *x, "a pipeline mesh")))
        return TD_ERR_OUT_OF_MEMORY;
    x->tensor = 1;
    x->replicas = 1;
    if (tensor > 1 && td_group_size(s->group) % (replicas * tensor) != 0)
        st = td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                               "pipeline: %d replicas of stages of %d members do not divide the "
                               "group's %d devices",
                               replicas, tensor, td_group_size(s->group));
    else
        st = tensor > 1 ? open_chains(s, x, replicas, tensor) : open_replicas(s, x, replicas);
    if (!x->rep[0]) {
        td__pp_mesh_close(x);
        return st;
    }
    x->rep[0]->mesh = x;
    *out = x->rep[0]; /* the strategy's destroy takes the mesh with it */
    return st;
}

static td_status run_pipeline(void *p) {
    return td__pp_run(p);
}

/* The data replicas: of the pipeline, or of a tensor mesh's chains. */
static int replicas_of(const pp_mesh *x) {
    return x->tensor > 1 ? x->replicas : x->m.replicas;
}

/* Pipeline r's rows of the batch: its replica's share of the rows (the
 * chains of one replica take the same rows: its stages split the layers,
 * not the samples). */
static td_batch rows_of(const pp_mesh *x, const pipeline *p, const td_batch *batch, int r,
                        int64_t *first) {
    int replicas = replicas_of(x), rep = x->tensor > 1 ? r / x->tensor : r;
    int64_t lo = batch->n * rep / replicas, hi = batch->n * (rep + 1) / replicas;
    *first = lo;
    return replicas == 1 ? *batch : td__batch_rows(batch, &p->info, lo, hi);
}

/* Pipeline r's stages in stats->m (at their ranks in the group). */
static void fill_member_stats(const pp_mesh *x, const pipeline *q, const td__member_row *rows,
                              int64_t samples, double step_s, td_step_stats *stats, double *speed) {
    int pipelines = td__pp_mesh_pipelines(x);
    double cost = 0;
    td_member_stats one[TD_PP_MAX_STAGES];
    td__rows_to_stats(rows, q->size, step_s, one);
    for (int k = 0; k < q->size; k++)
        cost += q->plan.seconds[k];
    for (int k = 0; k < q->size; k++) {
        td_member_stats *m = &stats->m[q->rank0 + k * q->rank_step];
        *m = one[k];
        m->samples = q->st[k].part ? samples : 0;
        m->share = cost > 0 ? q->plan.seconds[k] / cost / pipelines : 0;
        m->parked = !q->st[k].part;
        if (q == x->rep[0] && q->plan.alone_s[k] > 0)
            *speed += pipelines / q->plan.alone_s[k];
    }
}

td_status td__pp_mesh_step(pipeline *p, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats) {
    pp_mesh *x = p->mesh;
    int pipelines = td__pp_mesh_pipelines(x);
    td_batch rows[TD_DP_MAX_MEMBERS];
    td__member_row stage_rows[TD_PP_MAX_STAGES];
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1, first;
    uint64_t t0 = td_clock_ns();
    double step_s, speed = 0;
    if (batch->n < replicas_of(x))
        return td__error_setting(TD_ERR_INVALID_ARG, "batch",
                                 "pipeline: a batch of %lld samples for %d replicas: give each "
                                 "at least one",
                                 (long long)batch->n, replicas_of(x));
    for (int r = 0; r < pipelines; r++) {
        rows[r] = rows_of(x, p, batch, r, &first);
        td__pp_setup_step(x->rep[r], &rows[r], first, step, 1.0 / (double)(batch->n * lps));
    }
    TD_CHECK(td__pp_mesh_run(p));
    step_s = (double)(td_clock_ns() - t0) * 1e-9;
    memset(res, 0, sizeof *res);
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->members = td_group_size(p->s->group);
        stats->step_s = step_s;
        stats->micro_batches = (int)p->m;
    }
    for (int r = 0; r < pipelines; r++) {
        td_step_result part;
        TD_CHECK(td__pp_results(x->rep[r], &part, stage_rows));
        if (r % x->tensor == 0) { /* a replica's chains all compute the same loss */
            res->loss_sum += part.loss_sum;
            res->correct += part.correct;
            res->count += part.count;
        }
        if (stats)
            fill_member_stats(x, x->rep[r], stage_rows, rows[r].n, step_s, stats, &speed);
    }
    if (stats) /* the plan timed a batch of the configured size, on one pipeline */
        stats->ideal_s = speed > 0 ? (double)batch->n / (double)p->s->cfg.batch / speed : 0;
    return TD_OK;
}

td_status td__pp_mesh_run(pipeline *p) {
    void *args[TD_DP_MAX_MEMBERS];
    int pipelines = td__pp_mesh_pipelines(p->mesh);
    for (int r = 0; r < pipelines; r++)
        args[r] = td__pp_mesh_pipeline(p->mesh, r);
    return td__mesh_run_all(pipelines, run_pipeline, args);
}

const char *td__pp_mesh_plan(const pipeline *p, char *buf, size_t n) {
    const pp_mesh *x = p->mesh;
    size_t used = 0;
    buf[0] = '\0';
    if (x->replicas > 1)
        used += (size_t)snprintf(buf, n,
                                 "%d replicas, each %d stages of %d devices taking 1/%d of the "
                                 "batch rows, cut as the first:\n",
                                 x->replicas, p->size, x->tensor, x->replicas);
    for (int k = 0; k < p->size && used < n; k++) {
        if (!p->st[k].part) {
            used += (size_t)snprintf(buf + used, n - used, "stage %d: no layer\n", k + 1);
            continue;
        }
        used += (size_t)snprintf(buf + used, n - used,
                                 "stage %d: layers %d-%d (%s .. %s), %.1f ms a step measured, %d "
                                 "micro-batch slot%s; split by speed over",
                                 k + 1, p->plan.first[k], p->plan.end[k] - 1,
                                 p->layers[p->plan.first[k]].type,
                                 p->layers[p->plan.end[k] - 1].type, p->plan.seconds[k] * 1e3,
                                 p->st[k].slots, p->st[k].slots == 1 ? "" : "s");
        for (int j = 0; j < x->tensor && used < n; j++)
            used += (size_t)snprintf(buf + used, n - used, "%s %s %.0f%%", j ? "," : "",
                                     td_device_name(td_group_device(x->m.rgroup[k], j)),
                                     100 * x->share[k][j]);
        if (used < n)
            used += (size_t)snprintf(buf + used, n - used, "\n");
    }
    return buf;
}

void td__pp_mesh_split(void *impl, char *buf, size_t n) {
    const pipeline *p = impl;
    const pp_mesh *x = p->mesh;
    size_t used = 0;
    buf[0] = '\0';
    if (!td__pp_mesh_sliced(x))
        return;
    for (int k = 0; k < x->m.replicas; k++)
        for (int j = 0; j < x->tensor && used < n; j++)
            used +=
                (size_t)snprintf(buf + used, n - used, "%s%.17g", k + j ? " " : "", x->share[k][j]);
}

/* The shares td__pp_mesh_split wrote: stages x members numbers from 0 to 1,
 * each stage's summing to 1; *count of them. */
static td_status parse_shares(const char *text, double *share, int most, int members, int *count) {
    const char *at = text;
    double sum = 0;
    for (*count = 0; *at; (*count)++) {
        char *end;
        if (*count == most)
            return td__error(TD_ERR_CORRUPT, "more than %d shares", most);
        share[*count] = strtod(at, &end);
        if (end == at || !(share[*count] >= 0 && share[*count] <= 1))
            return td__error(TD_ERR_CORRUPT, "\"%.20s\" is not a share from 0 to 1", at);
        sum += share[*count];
        if ((*count + 1) % members == 0) {
            if (!(sum > 0.999 && sum < 1.001))
                return td__error(TD_ERR_CORRUPT, "a stage's shares add up to %g, not 1", sum);
            sum = 0;
        }
        for (at = end; *at == ' '; at++)
            ;
    }
    return TD_OK;
}

td_status td__pp_mesh_adopt_split(void *impl, const char *text, int *adopted) {
    pipeline *p = impl;
    pp_mesh *x = p->mesh;
    double share[TD_PP_MAX_STAGES * TD_DP_MAX_MEMBERS];
    int n, stages, same = 1;
    *adopted = 0;
    if (!td__pp_mesh_sliced(x)) {
        *adopted = !*text; /* a tensor mesh's shares do not apply here */
        return TD_OK;
    }
    stages = x->m.replicas;
    TD_CHECK(parse_shares(text, share, TD_PP_MAX_STAGES * TD_DP_MAX_MEMBERS, x->tensor, &n));
    if (n != stages * x->tensor)
        return TD_OK;
    *adopted = 1;
    for (int k = 0; k < stages; k++)
        for (int j = 0; j < x->tensor; j++) {
            same &= x->share[k][j] == share[k * x->tensor + j];
            x->share[k][j] = share[k * x->tensor + j];
        }
    if (same)
        return TD_OK; /* these slices are built */
    for (int r = 0; r < td__pp_mesh_pipelines(x); r++) {
        pipeline *q = x->rep[r];
        free(q->shards);
        q->shards = NULL;
        TD_CHECK(cut_slices(p->s, x, r % x->tensor, &q->shards));
        TD_CHECK(td__pp_remake_stages(q));
    }
    return TD_OK;
}
