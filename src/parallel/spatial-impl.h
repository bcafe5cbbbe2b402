/* The inside of the `spatial` strategy (split-frame): spatial.c runs its
 * steps, spatial_plan.c measures the members and cuts the bands. */
#ifndef TD_PARALLEL_SPATIAL_IMPL_H
#define TD_PARALLEL_SPATIAL_IMPL_H

#include "parallel/member_rows.h"
#include "parallel/strategy-impl.h"
#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

typedef struct sp_member {
    td_group *group;
    td_device *dev;
    int rank;
    td_model *m; /* the whole model, its head run on band `rank` */
    td_optimizer *opt;
    td__rows rows;             /* the step's row of every member, gathered */
    double alone_s;            /* calibration: a whole-model step on one sample, alone */
    double halo_s;             /* this step: trading halo rows and their gradients */
    double gather_s, reduce_s; /* gathering the head's output; summing its gradients */
    double compute_s, update_s;
    td_step_result res;
} sp_member;

typedef struct spatial_par {
    td_strategy *s;
    td_group *g;
    int size;
    td_model_info info;
    td_band_head head;
    double share[TD_DP_MAX_MEMBERS];
    /* the shares speed asked for when the bands were last cut (share itself
     * may have moved toward even for the kernels' sake) */
    double wanted[TD_DP_MAX_MEMBERS];
    int64_t *bounds;    /* (head.layers, size + 1): band k of head layer i */
    int64_t steps_seen; /* steps since the shares were last set */
    int rebalance;      /* the `rebalance` option (default 1): cut anew while running */
    double busy_s[TD_DP_MAX_MEMBERS]; /* measured compute per row share, smoothed */
    sp_member mb[TD_DP_MAX_MEMBERS];
} spatial_par;

/* spatial_plan.c ----------------------------------------------------------------- */

/* Times every member alone and shares the rows by speed (p->share). */
td_status td__sp_calibrate(spatial_par *p);
/* Cuts every head layer by p->share and hands each member its bands. */
td_status td__sp_cut(spatial_par *p);
/* td__sp_cut, or where p->share would cut a band thinner than a kernel's
 * halo, by shares moved toward even ones a quarter at a time: a slow
 * device's band then keeps the rows the kernels read. Refused (naming the
 * layer) only when even bands are too thin. */
td_status td__sp_cut_fitting(spatial_par *p);
/* After a step: where the members' measured compute says the shares are
 * off, moves them and cuts again (as `data` re-balances its slices). */
td_status td__sp_rebalance(spatial_par *p);
/* The table's split and adopt_split: the shares, exactly. */
void td__sp_split(void *impl, char *buf, size_t n);
td_status td__sp_adopt_split(void *impl, const char *text, int *adopted);
/* "band k: rows [a, b) of 512 (75%)" lines into buf. */
const char *td__sp_plan_text(void *impl, char *buf, size_t n);

#endif
