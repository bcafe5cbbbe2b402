/* data × pipeline within one process (the mesh data:R,pipeline:N, mesh.c):
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
    td__mesh m;                       /* the replicas\' groups, and those across them */
    pipeline *rep[TD_DP_MAX_MEMBERS]; /* rep[0] is the strategy's own */
};

int td__pp_mesh_replicas(const pp_mesh *x) {
    return x ? x->m.replicas : 1;
}

pipeline *td__pp_mesh_replica(const pp_mesh *x, int r) {
    return x->rep[r];
}

void td__pp_mesh_close(pp_mesh *x) {
    if (!x)
        return;
    for (int r = 1; r < x->m.replicas; r++)
        td__pp_free(x->rep[r]);
    td__mesh_close(&x->m);
    free(x);
}

td_status td__pp_mesh_open(td_strategy *s, int replicas, pipeline **out) {
    td_group *g = s->group;
    pp_mesh *x;
    td_status st;
    *out = NULL;
    if (!(x = td__calloc(sizeof *x, "a data x pipeline mesh")))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td__mesh_open(g, replicas, "pipeline", &x->m)) != TD_OK) {
        td__pp_mesh_close(x);
        return st;
    }
    st = td__pp_build(s, x->m.rgroup[0], NULL, &x->rep[0]);
    for (int r = 1; r < replicas && st == TD_OK; r++)
        st = td__pp_build(s, x->m.rgroup[r], &x->rep[0]->plan, &x->rep[r]);
    for (int r = 0; r < replicas && st == TD_OK; r++)
        for (int k = 0; k < x->m.n; k++)
            x->rep[r]->st[k].across = x->m.across[k];
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

td_status td__pp_mesh_step(pipeline *p, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats) {
    pp_mesh *x = p->mesh;
    td_batch rows[TD_DP_MAX_MEMBERS];
    td__member_row stage_rows[TD_PP_MAX_STAGES];
    void *args[TD_DP_MAX_MEMBERS];
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1, feats = 1;
    uint64_t t0 = td_clock_ns();
    double step_s, speed = 0;
    if (batch->n < x->m.replicas)
        return td__error_setting(TD_ERR_INVALID_ARG, "batch",
                                 "pipeline: a batch of %lld samples for %d replicas: give each "
                                 "at least one",
                                 (long long)batch->n, x->m.replicas);
    for (int d = 0; d < p->info.in_ndim; d++)
        feats *= p->info.in_shape[d];
    for (int r = 0; r < x->m.replicas; r++) {
        int64_t lo = batch->n * r / x->m.replicas, hi = batch->n * (r + 1) / x->m.replicas;
        rows[r] = *batch;
        rows[r].n = hi - lo;
        rows[r].x = batch->x ? batch->x + lo * feats : NULL;
        rows[r].tokens = batch->tokens ? batch->tokens + lo * feats : NULL;
        rows[r].labels = batch->labels + lo * lps;
        td__pp_setup_step(x->rep[r], &rows[r], lo, step, 1.0 / (double)(batch->n * lps));
        args[r] = x->rep[r];
    }
    TD_CHECK(td__mesh_run_all(x->m.replicas, run_pipeline, args));
    step_s = (double)(td_clock_ns() - t0) * 1e-9;
    memset(res, 0, sizeof *res);
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->members = x->m.replicas * x->m.n;
        stats->step_s = step_s;
        stats->micro_batches = (int)p->m;
    }
    for (int r = 0; r < x->m.replicas; r++) {
        pipeline *q = x->rep[r];
        td_step_result part;
        double cost = 0;
        TD_CHECK(td__pp_results(q, &part, stage_rows));
        res->loss_sum += part.loss_sum;
        res->correct += part.correct;
        res->count += part.count;
        if (!stats)
            continue;
        td__rows_to_stats(stage_rows, q->size, step_s, &stats->m[r * x->m.n]);
        for (int k = 0; k < q->size; k++)
            cost += q->plan.seconds[k];
        for (int k = 0; k < q->size; k++) {
            td_member_stats *m = &stats->m[r * x->m.n + k];
            m->samples = q->st[k].part ? rows[r].n : 0;
            m->share = cost > 0 ? q->plan.seconds[k] / cost / x->m.replicas : 0;
            m->parked = !q->st[k].part;
            speed += r == 0 && q->plan.alone_s[k] > 0 ? x->m.replicas / q->plan.alone_s[k] : 0;
        }
    }
    if (stats) /* the plan timed a batch of the configured size, on one replica */
        stats->ideal_s = speed > 0 ? (double)batch->n / (double)p->s->cfg.batch / speed : 0;
    return TD_OK;
}
