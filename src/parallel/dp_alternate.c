/* The `alternate` strategy over the data strategy's replicas: whole
 * batches round-robin, weighted by speed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/dp-impl.h"

/* Evaluation: the `alternate` strategy ------------------------------------------ */

static td_status evaluate_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    dp_work *w = arg;
    dp_member *mb = td__dp_member(w->dp, rank);
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
    st = td__dp_run_on(dp, dp->g, evaluate_member, &w);
    free(owner);
    free(credit);
    return st;
}
