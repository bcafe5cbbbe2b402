/* The data strategy's numbers: per-rank results and timings shared after
 * a run, the calibration that sets the shares, and a step's statistics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/dp-impl.h"

/* Sharing per-rank numbers ------------------------------------------------------ */

/* Every member contributes its row; all get everyone's. The run's reader
 * (one member) also copies them to the host, here on its own thread: read
 * from the caller's, they would cost a round trip to it. The host copy has
 * a row per rank of the run, then rows left from earlier runs, dp->size in
 * all. */
td_status td__dp_gather_stats(td_group *g, dp_member *mb, const dp_work *w,
                              const td__member_row *row) {
    TD_CHECK(td__rows_gather(g, &mb->rows, row));
    return mb == w->reader ? td__rows_read(&mb->rows, w->rows) : TD_OK;
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
    dp_member *mb = td__dp_member(w->dp, rank);
    td_batch part =
        td__dp_slice(w->dp, w->batch, 0, w->batch->n >= 4 ? w->batch->n / 4 : w->batch->n);
    td__member_row row = {0};
    td_status st;
    td_model_set_grad_hook(mb->model, NULL, NULL);
    if ((st = time_passes(mb, w->batch, &row.compute_s)) != TD_OK ||
        (st = time_passes(mb, &part, &row.part_s)) != TD_OK)
        return st;
    return td__dp_gather_stats(g, mb, w, &row);
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
    td__member_row all[TD_DP_MAX_MEMBERS];
    double fixed[TD_DP_MAX_MEMBERS], per[TD_DP_MAX_MEMBERS];
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
    if ((st = td__dp_run_on(dp, dp->g, calibrate_member, &w)) != TD_OK)
        return st;
    n1 = (double)batch->n;
    n2 = (double)(batch->n >= 4 ? batch->n / 4 : batch->n);
    for (int r = 0; r < dp->size; r++)
        fit_costs(n1, fmax(all[r].compute_s, 1e-9), n2, fmax(all[r].part_s, 1e-9), &fixed[r],
                  &per[r]);
    if ((st = td_balancer_set_costs(dp->balancer, fixed, per)) != TD_OK)
        return st;
    for (int r = 0; r < dp->size; r++)
        TD_LOG_INFO("calibration: rank %d costs %.3g ms per pass plus %.3g ms per sample "
                    "(%.0f samples/s on %.0f)",
                    r, fixed[r] * 1e3, per[r] * 1e3, n1 / (fixed[r] + per[r] * n1), n1);
    return TD_OK;
}

/* A step's timings and statistics ------------------------------------------------ */

/* A member's timings into its step numbers: compute from c0, communication
 * from c1, and the update from u0 until now. */
void td__dp_put_times(td__member_row *row, uint64_t c0, uint64_t c1, uint64_t u0) {
    row->compute_s = (double)(c1 - c0) * 1e-9;
    row->comm_s = (double)(u0 - c1) * 1e-9;
    row->update_s = (double)(td_clock_ns() - u0) * 1e-9;
}

void td__dp_fill_stats(td_dp *dp, const td__member_row *all, const int64_t *counts, double step_s,
                       int64_t total, td_step_stats *stats) {
    /* The share of its reductions' time that ran before backward ended, on
     * the member of this process whose backward ended last: the others'
     * reductions include waiting for it, which is not communication. */
    const dp_member *last = NULL;
    memset(stats, 0, sizeof *stats);
    stats->members = dp->size;
    stats->step_s = step_s;
    stats->ideal_s = td_balancer_ideal_seconds(dp->balancer, total);
    for (int r = 0; r < dp->size; r++) {
        td_member_stats *m = &stats->m[r];
        dp_member *mb = td__dp_member(dp, r);
        m->samples = counts[r];
        m->share = total ? (double)counts[r] / (double)total : 0;
        m->parked = td__dp_is_parked(dp, r);
        /* A member that sat the step out has a row of zeros, and no wait. */
        td__rows_to_stats(&all[r], 1, step_s, m);
        if (td__dp_sits_out(dp, r))
            m->wait_s = 0;
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
