/* The `spatial` strategy's plan: how many rows of every image each member
 * computes. At creation every member in turn times a training step of the
 * whole model on one sample, alone; the rows are shared in proportion to
 * the speeds (to eighths: a device three times as fast gets three quarters
 * of the rows), and every head layer's rows are cut by those shares, with
 * largest remainders. While it runs, each member's compute per step is
 * measured (its halo and gather waits left out), and when the speeds it
 * implies call for other eighths, the bands are cut again, as `data`
 * re-balances its slices. A checkpoint records the shares exactly
 * (td__sp_split), so that a resumed run cuts the same bands. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/spatial-impl.h"
#include "tensor/view.h"

/* A measured step counts this much in the running estimate of a speed. */
#define SMOOTHING 0.3
/* Steps between looks at the shares, and before the first. */
#define REBALANCE_EVERY 4

/* Calibration ------------------------------------------------------------------- */

/* Times a step of member m's whole model (no bands yet) on one sample of
 * zeros: the best of 3 after a warm-up. */
static td_status time_alone(spatial_par *p, sp_member *m) {
    size_t feats = 1;
    float *x;
    int32_t label = 0;
    td_step_result r;
    td_status st = TD_OK;
    for (int i = 0; i < p->info.in_ndim; i++)
        feats *= (size_t)p->info.in_shape[i];
    if (!(x = td__calloc(sizeof(float) * feats, "a calibration sample")))
        return TD_ERR_OUT_OF_MEMORY;
    td_batch one = {1, x, NULL, &label};
    m->alone_s = 0;
    for (int i = 0; i < 4 && st == TD_OK; i++) {
        uint64_t t0 = td_clock_ns();
        double dt;
        st = td_model_train_step(m->m, &one, 1.0, 0, 0, &r);
        dt = (double)(td_clock_ns() - t0) * 1e-9;
        if (i > 0 && (m->alone_s == 0 || dt < m->alone_s))
            m->alone_s = dt;
    }
    free(x);
    return st;
}

td_status td__sp_calibrate(spatial_par *p) {
    double alone[TD_DP_MAX_MEMBERS];
    /* one member at a time, so that they do not slow each other down */
    for (int k = 0; k < p->size; k++) {
        TD_CHECK(time_alone(p, &p->mb[k]));
        alone[k] = p->mb[k].alone_s;
        p->busy_s[k] = 0;
    }
    td__shares_from_speed(alone, p->size, p->share);
    return TD_OK;
}

/* Cutting ------------------------------------------------------------------------ */

static td_status gather_hook_set(spatial_par *p);

td_status td__sp_cut(spatial_par *p) {
    int n = p->size, layers = p->head.layers;
    for (int i = 0; i < layers; i++) {
        int64_t first[TD_DP_MAX_MEMBERS], count[TD_DP_MAX_MEMBERS];
        int64_t *row = p->bounds + (size_t)i * (size_t)(n + 1);
        td__cut_by_shares(p->head.rows[i], p->share, n, first, count);
        for (int k = 0; k < n; k++)
            row[k] = first[k];
        row[n] = p->head.rows[i];
    }
    for (int k = 0; k < n; k++) {
        td_band_plan plan = {n, k, layers, p->bounds};
        TD_CHECK(td_model_set_bands(p->mb[k].m, &plan));
    }
    p->steps_seen = 0;
    return gather_hook_set(p);
}

td_status td__sp_cut_fitting(spatial_par *p) {
    double want[TD_DP_MAX_MEMBERS];
    td_status st = TD_OK;
    memcpy(want, p->share, sizeof(double) * (size_t)p->size);
    memcpy(p->wanted, want, sizeof want[0] * (size_t)p->size);
    for (int step = 0; step <= 4; step++) {
        for (int k = 0; k < p->size; k++)
            p->share[k] = want[k] + (1.0 / p->size - want[k]) * step / 4.0;
        st = td__sp_cut(p);
        if (st != TD_ERR_INVALID_ARG)
            break;
    }
    if (st == TD_OK && memcmp(want, p->share, sizeof(double) * (size_t)p->size)) {
        char text[256];
        td__sp_split(p, text, sizeof text);
        TD_LOG_INFO("spatial: the measured speeds would cut a band too thin; shares %s", text);
    }
    return st;
}

/* Every member's all-gather across the group. */
static td_status gather(void *arg, const td_tensor *send, td_tensor *recv, int halo) {
    sp_member *m = arg;
    td_buffer s = td__tensor_as_buffer(send), r = td__tensor_as_buffer(recv);
    uint64_t t0 = td_clock_ns();
    td_status st =
        td_allgather(m->group, &s, 0, &r, 0, td_tensor_numel(send), td_tensor_dtype(send));
    *(halo ? &m->halo_s : &m->gather_s) += (double)(td_clock_ns() - t0) * 1e-9;
    return st;
}

static td_status gather_hook_set(spatial_par *p) {
    for (int k = 0; k < p->size; k++)
        td_model_set_gather_hook(p->mb[k].m, gather, &p->mb[k]);
    return TD_OK;
}

/* Re-balancing ------------------------------------------------------------------- */

td_status td__sp_rebalance(spatial_par *p) {
    double per_all[TD_DP_MAX_MEMBERS], share[TD_DP_MAX_MEMBERS], old[TD_DP_MAX_MEMBERS];
    char text[256];
    int moved = 0;
    for (int k = 0; k < p->size; k++) {
        /* the time the whole image would take this member */
        double t = p->mb[k].compute_s / p->share[k];
        p->busy_s[k] = p->busy_s[k] > 0 ? (1 - SMOOTHING) * p->busy_s[k] + SMOOTHING * t : t;
        per_all[k] = p->busy_s[k];
    }
    if (++p->steps_seen < REBALANCE_EVERY || p->size == 1 || !p->rebalance)
        return TD_OK;
    p->steps_seen = 0;
    td__shares_from_speed(per_all, p->size, share);
    /* half an eighth from what was asked last: timing noise moves nothing */
    for (int k = 0; k < p->size; k++)
        moved |= fabs(share[k] - p->wanted[k]) >= 1.0 / 16;
    if (!moved)
        return TD_OK;
    memcpy(old, p->share, sizeof(double) * (size_t)p->size);
    memcpy(p->share, share, sizeof(double) * (size_t)p->size);
    /* a device far slower than the others may be due no rows at a deep
     * layer: its band then keeps what the kernels read */
    if (td__sp_cut_fitting(p) == TD_OK) {
        td__sp_split(p, text, sizeof text);
        TD_LOG_INFO("spatial: the measured compute moves the bands to shares %s", text);
        return TD_OK;
    }
    TD_LOG_INFO("spatial: no shares near the measured ones cut bands the kernels can read "
                "(%s); the bands stay",
                td_last_error());
    memcpy(p->share, old, sizeof(double) * (size_t)p->size);
    return td__sp_cut(p);
}

/* The split ----------------------------------------------------------------------- */

void td__sp_split(void *impl, char *buf, size_t n) {
    spatial_par *p = impl;
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < p->size && used < n; k++)
        used += (size_t)snprintf(buf + used, n - used, "%s%.17g", k ? " " : "", p->share[k]);
}

td_status td__sp_adopt_split(void *impl, const char *text, int *adopted) {
    spatial_par *p = impl;
    double share[TD_DP_MAX_MEMBERS], sum = 0;
    const char *at = text;
    int n = 0;
    *adopted = 0;
    while (*at) {
        char *end;
        if (n == TD_DP_MAX_MEMBERS)
            return td__error(TD_ERR_CORRUPT, "more than %d shares", TD_DP_MAX_MEMBERS);
        share[n] = strtod(at, &end);
        if (end == at || !(share[n] >= 0 && share[n] <= 1))
            return td__error(TD_ERR_CORRUPT, "\"%.20s\" is not a share from 0 to 1", at);
        sum += share[n++];
        for (at = end; *at == ' '; at++)
            ;
    }
    if (!(sum > 0.999 && sum < 1.001))
        return td__error(TD_ERR_CORRUPT, "the shares add up to %g, not 1", sum);
    if (n != p->size)
        return TD_OK;
    memcpy(p->share, share, sizeof(double) * (size_t)n);
    memcpy(p->wanted, share, sizeof(double) * (size_t)n);
    *adopted = 1;
    return td__sp_cut(p);
}

const char *td__sp_plan_text(void *impl, char *buf, size_t n) {
    spatial_par *p = impl;
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < p->size && used < n; k++) {
        const sp_member *m = &p->mb[k];
        int64_t lo = p->bounds[k], hi = p->bounds[k + 1];
        used += (size_t)snprintf(buf + used, n - used,
                                 "%s: rows [%lld, %lld) of %lld of layer 0 (%s), %.0f%% of the "
                                 "rows (%.2f ms a whole-model step alone); %d layers on bands\n",
                                 td_device_name(m->dev), (long long)lo, (long long)hi,
                                 (long long)p->head.rows[0], p->head.type[0], 100 * p->share[k],
                                 m->alone_s * 1e3, p->head.layers);
    }
    return buf;
}
