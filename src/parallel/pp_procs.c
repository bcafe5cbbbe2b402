/* data x pipeline across MPI processes (the mesh data:P,pipeline:N under
 * mpirun): each process runs the pipeline over its own N devices and takes
 * its rows of the batch; before its optimizer step, stage k joins the group
 * of stage k of every process (procs.h) to sum its gradients, as the
 * replicas within one process do (pp_mesh.c). Every process must cut the
 * layers alike: each measures, and all take process 0's cut. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "parallel/pipeline-impl.h"
#include "parallel/strategy-impl.h"

/* Per stage: its first layer, its end and its slots, in v[3k..3k+3). */
#define PLAN_WORDS 3
#define AGREE_MOST 8

/* plan's cut, every process taking process 0's. */
static td_status agree_plan(td__procs *pp, td_pp_plan *plan) {
    double v[PLAN_WORDS * TD_PP_MAX_STAGES];
    int n = PLAN_WORDS * plan->members, mine = pp->process == 0;
    for (int k = 0; k < plan->members; k++) {
        v[PLAN_WORDS * k] = mine ? plan->first[k] : 0;
        v[PLAN_WORDS * k + 1] = mine ? plan->end[k] : 0;
        v[PLAN_WORDS * k + 2] = mine ? plan->slots[k] : 0;
    }
    for (int at = 0; at < n; at += AGREE_MOST)
        TD_CHECK(td__procs_agree(pp, 0, v + at, (size_t)(n - at < AGREE_MOST ? n - at : AGREE_MOST),
                                 TD_REDUCE_SUM));
    for (int k = 0; k < plan->members; k++) {
        plan->first[k] = (int)v[PLAN_WORDS * k];
        plan->end[k] = (int)v[PLAN_WORDS * k + 1];
        plan->slots[k] = (int)v[PLAN_WORDS * k + 2];
    }
    return TD_OK;
}

td_status td__pp_procs_open(td_strategy *s, pipeline **out) {
    td__procs pp;
    td_pp_plan plan;
    pipeline *p;
    td_status st;
    *out = NULL;
    if ((st = td__procs_open(s->group, &pp)) != TD_OK) {
        td__procs_close(&pp);
        return st;
    }
    st = td__pp_begin(s, pp.local, out);
    if (!(p = *out)) {
        td__procs_close(&pp);
        return st;
    }
    p->procs = pp; /* the pipeline's to close from here on */
    TD_CHECK(st);
    p->rank0 = pp.process * pp.n;
    TD_CHECK(td__pp_measure(p, NULL, &plan));
    TD_CHECK(agree_plan(&p->procs, &plan));
    for (int k = 0; k < p->size; k++)
        p->st[k].across = p->procs.across[k];
    return td__pp_finish(p, &plan);
}

void td__pp_procs_setup_step(pipeline *p, const td_batch *batch, td_batch *rows, uint64_t step) {
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1, first;
    *rows = td__procs_rows(&p->procs, batch, &p->info, &first);
    td__pp_setup_step(p, rows, first, step, 1.0 / (double)(batch->n * lps));
}

td_status td__pp_procs_results(pipeline *p, td_step_result *res) {
    double v[3] = {res->loss_sum, (double)res->correct, (double)res->count};
    if (p->procs.nprocs < 2)
        return TD_OK;
    TD_CHECK(td__procs_agree(&p->procs, 0, v, 3, TD_REDUCE_SUM));
    res->loss_sum = v[0];
    res->correct = (int64_t)v[1];
    res->count = (int64_t)v[2];
    return TD_OK;
}
