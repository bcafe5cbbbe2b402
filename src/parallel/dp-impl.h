/* The inside of the `data` strategy (td_dp), shared by its files:
 *   data_parallel.c     creation, buckets and the overlapped reduction, a step,
 *                       parking and refreshing replicas, survivors
 *   dp_zero.c           ZeRO-1: optimizer shards, the weights' gather, moving the
 *                       whole optimizer state to and from the shards
 *   dp_deterministic.c  deterministic mode: chunk gradients summed along a chain
 *   dp_stats.c          per-rank numbers shared after a run, calibration, a
 *                       step's statistics
 *   dp_alternate.c      evaluation, whole batches round-robin (`alternate`) */
#ifndef TD_DP_IMPL_H
#define TD_DP_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/member_rows.h"
#include "tandem/parallel.h"

typedef struct bucket {
    size_t first, count; /* parameters [first, first + count) */
} bucket;

typedef struct dp_member {
    td_device *dev;
    int rank;
    int cpu; /* no TD_DEVICE_CAP_ASYNC_COPY (a CPU device): reduces with the cores it computes on */
    td_model *model;
    td_optimizer *opt;
    td__rows rows; /* the run's row of every member, gathered */

    /* ZeRO-1: where the reduce-scatter puts this member's shard of each
     * gradient (NULL where the shard is empty; one per parameter, since
     * several can be in flight during backward), and one number shared with
     * the others (a squared norm, a step count). */
    td_tensor **shard_grads;
    td_tensor *scalar;

    /* Buckets in flight during one step. */
    struct td_dp *dp;
    td_group *g;
    unsigned char *ready; /* per parameter */
    size_t next_bucket;
    td_comm_request **reqs; /* per parameter */
    td_status hook_status;
    uint64_t all_started_ns; /* when the last bucket started: backward's end (td_clock_ns) */
    int buckets_in_backward; /* of this step's, started from backward's gradient hook */

    /* Deterministic mode: one gradient copy per chunk this member runs. */
    td_tensor ***chunk_grads; /* [chunk slot][param] */
    size_t chunk_slots;
    td_tensor *chunk_results; /* (chunks, 3) f64: loss, correct, count per chunk */
    td_tensor *chunk_results_all;

    /* With overlap, how long this step's reductions ran (reduce_s) and how
     * much of that after backward's end (exposed_s). */
    double reduce_s, exposed_s;
} dp_member;

struct td_dp {
    td_group *g;
    int size;
    td_dp_config cfg;
    td_dtype stat_dtype;
    dp_member *members; /* local ones */
    int nlocal;
    td_balancer *balancer;
    bucket *buckets;
    size_t nbuckets, nparams;
    int64_t labels_per_sample;
    int64_t features; /* floats per sample for feature inputs */
    int64_t tokens;   /* tokens per sample for token inputs */
    int overlap;      /* resolved for the members of this step (cfg.overlap may be -1) */

    /* Parking: members the balancer leaves out sit out whole steps, so the
     * steps run on a group of the others (made when the set changes), and
     * the parked replicas fall behind until refreshed. */
    td_group *active;                               /* NULL: the whole group */
    unsigned char active_parked[TD_DP_MAX_MEMBERS]; /* the set `active` leaves out */
    unsigned char stale[TD_DP_MAX_MEMBERS];

    /* The group of the last td_group_run: dp->g or `active`. After a
     * failure it alone knows who failed (td_dp_survivors). */
    td_group *ran;
};

/* Work handed to members through td_group_run. */
typedef struct dp_work {
    td_dp *dp;
    const td_batch *batch;
    const int64_t *counts;   /* samples (or chunks) per rank */
    const int64_t *offsets;  /* first sample (or chunk) per rank */
    const int *ranks;        /* rank in the group run -> rank in dp->g; NULL: the same */
    const dp_member *reader; /* the member that copies the gathered rows to `rows` */
    td__member_row *rows;    /* (dp->size): a row per rank of the run, then earlier runs' */
    double *chunk_rows;      /* deterministic mode: (chunks, 3) */
    int root;                /* broadcast_replicas: the rank whose state the others take */
    uint64_t step;
    /* evaluate */
    const td_batch *batches;
    const int *owner;
    size_t nbatches;
    td_step_result *per_batch;
    /* create */
    const char *json, *name;
    td_dtype dtype;
    uint64_t seed;
    const td_optimizer_config *opt;
} dp_work;

/* The local member of global rank `rank`, or NULL. */
dp_member *td__dp_member(td_dp *dp, int rank);
/* td_group_run on g (dp->g or dp->active), noted for td_dp_survivors. */
td_status td__dp_run_on(td_dp *dp, td_group *g, td_group_fn fn, void *arg);
/* The part [offset, offset + n) of a host batch. */
td_batch td__dp_slice(const td_dp *dp, const td_batch *b, int64_t offset, int64_t n);
/* Whether member r is parked this step, and whether it sits the step out. */
int td__dp_is_parked(const td_dp *dp, int r);
int td__dp_sits_out(const td_dp *dp, int r);

/* ZeRO-1 (dp_zero.c). */
td_status td__dp_create_shard_state(dp_member *mb, const td_optimizer_config *opt, int rank,
                                    int size);
td_status td__dp_place_shards(dp_member *mb);
td_status td__dp_gather_weights(dp_member *mb);

/* Deterministic mode (dp_deterministic.c): a td_group_fn. */
td_status td__dp_step_member_deterministic(td_group *g, td_device *dev, int rank, int size,
                                           void *arg);
void td__dp_free_chunk_grads(dp_member *mb, size_t nparams);

/* Numbers and timings (dp_stats.c). */
td_status td__dp_gather_stats(td_group *g, dp_member *mb, const dp_work *w,
                              const td__member_row *row);
void td__dp_put_times(td__member_row *row, uint64_t c0, uint64_t c1, uint64_t u0);
void td__dp_fill_stats(td_dp *dp, const td__member_row *all, const int64_t *counts, double step_s,
                       int64_t total, td_step_stats *stats);

#endif
