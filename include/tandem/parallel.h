/* tandem: strategies over device groups, and the balancer that sizes each
 * device's share of the work from its measured speed. */
#ifndef TANDEM_PARALLEL_H
#define TANDEM_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one step of any strategy reports ------------------------------------ */

#define TD_DP_MAX_MEMBERS 64

/* One member's part of a step. */
typedef struct td_member_stats {
    int64_t samples;  /* its slice (data), or the micro-batches' samples it passed (pipeline) */
    double share;     /* its share when the step was split (data), or of the layers' cost */
    double compute_s; /* forward and backward */
    double comm_s;    /* data: waiting for reductions after its backward ended (exposed);
                         pipeline: copying activations and their gradients in */
    double update_s;  /* the optimizer step (and ZeRO-1's gather of the weights) */
    double wait_s;    /* the rest of the step: idle (waiting for the others) */
    double halo_s;    /* spatial: trading halo rows and their gradients (within comm_s) */
    int parked;       /* sat the step out (see td_balancer_parked) */
} td_member_stats;

typedef struct td_step_stats {
    int members;
    double step_s;  /* wall time of the whole step */
    double ideal_s; /* total compute work / sum of speeds */
    /* Share of the reduction hidden behind backward: on this process's member
     * whose backward ended last (its last bucket's start), the part of its
     * reductions' run time (td_comm_request_times) before that; 0 without
     * overlap. */
    double hidden_fraction;
    /* The step's gradient buckets, and how many of them the same member
     * started from within backward (all of them with overlap, the last as
     * backward ends; none without). */
    int buckets, buckets_in_backward;
    /* pipeline: micro-batches, the measured bubble (the stages' mean share
     * of the step spent idle) and 1F1B's theory (p - 1) / (m + p - 1) */
    int micro_batches;
    double bubble, bubble_theory;
    td_member_stats m[TD_DP_MAX_MEMBERS];
    char stragglers[512]; /* lines naming devices that slowed down, or "" */
} td_step_stats;

typedef struct td_balancer td_balancer;

#define TD_BALANCER_MAX_DEVICES 256

typedef struct td_balancer_config {
    double min_share;       /* a device that takes part gets at least this fraction of a
                               batch (0.02) */
    double smoothing;       /* weight of a new measurement in the running estimate (0.3) */
    double straggler_ratio; /* a device is named when its time for its share exceeds its
                               long-run average by this factor (1.5) */
    int park;               /* leave out devices whose fixed cost exceeds the step (1) */
} td_balancer_config;

#define TD_BALANCER_CONFIG_INIT                                                                    \
    { .min_share = 0.02, .smoothing = 0.3, .straggler_ratio = 1.5, .park = 1 }

/* A balancer over n devices (at most TD_BALANCER_MAX_DEVICES), equal shares
 * until told costs. names[i] (may be NULL) name the devices in reports; they
 * are copied. */
TD_API td_status td_balancer_create(int n, const char *const *names, const td_balancer_config *cfg,
                                    td_balancer **out);
TD_API void td_balancer_destroy(td_balancer *b);

/* Sets each device's cost model, as a calibration measured it: n samples take
 * fixed_s[i] + per_sample_s[i] * n seconds (fixed >= 0, per sample > 0). The
 * fixed part is what a pass costs whatever its size: kernel launches,
 * packing the weights, a driver's overhead per call. Forgets earlier
 * observations and parking. */
TD_API td_status td_balancer_set_costs(td_balancer *b, const double *fixed_s,
                                       const double *per_sample_s);
/* The same with no fixed part: speeds in samples per second (> 0). */
TD_API td_status td_balancer_set_speeds(td_balancer *b, const double *samples_per_second);

/* Splits a batch of `total` samples into counts[0..n) that add up to total,
 * so that the devices finish together by the current costs (water filling:
 * devices join in order of fixed cost while their fixed cost is below the
 * step time the others reach). A device taking part gets at least the
 * minimum share when the batch has room for it. With parking on, a device
 * the filling leaves out is parked (count 0) until bringing it back would
 * shorten the step by 10%, by its last known costs; and since those may be
 * stale, it is tried again with the minimum share after 16 parked steps,
 * then 32, 64, ... up to 1024, the try's measurement replacing its costs'
 * scale. The split is a pure function of the balancer's state and total, so
 * every process computes the same one. */
TD_API void td_balancer_split(td_balancer *b, int64_t total, int64_t *counts);

/* Whether device i is parked: it takes no samples, and the data strategy
 * leaves it out of the step altogether. */
TD_API int td_balancer_parked(const td_balancer *b, int i);

/* Feeds one step's measurements: device i computed counts[i] samples in
 * seconds[i]. Scales its costs towards what it took (smoothed). When a
 * device's time has stayed above its long-run average by the straggler ratio
 * for 3 steps in a row, a line naming it and by how much goes into report
 * (which may be NULL), once until it recovers; returns how many devices were
 * named. */
TD_API int td_balancer_observe(td_balancer *b, const int64_t *counts, const double *seconds,
                               char *report, size_t report_size);

/* Device i's share of a batch of the size last split (256 before any), its
 * speed (samples per second, fixed cost aside) and its fixed cost. */
TD_API double td_balancer_share(const td_balancer *b, int i);
TD_API double td_balancer_speed(const td_balancer *b, int i);
TD_API double td_balancer_fixed_seconds(const td_balancer *b, int i);

/* The step time an ideal split of `total` samples reaches at the current
 * costs (the water filling's, before rounding to whole samples). */
TD_API double td_balancer_ideal_seconds(const td_balancer *b, int64_t total);

/* The `data` strategy -----------------------------------------------------
 *
 * One replica of the model on every member of a group. Each step splits the
 * global batch across the members by their shares; each member runs forward
 * and backward on its slice with gradients scaled by 1 / (labels in the whole
 * batch), so that their sum, made by an all-reduce, is the gradient one
 * device would compute on the whole batch; every replica then takes the same
 * optimizer step. Gradients join buckets in reverse layer order (a small
 * first bucket, then larger ones) and a full bucket's all-reduce starts while
 * backward goes on.
 *
 * Deterministic mode cuts the batch into fixed micro-chunks instead, whatever
 * the number of devices; each member keeps each of its chunks' gradients and
 * the chunks are summed in chunk order along a chain of the members, so the
 * weights are bitwise the same for 1, 2 or 3 devices. Its cost: one gradient
 * copy per chunk a member runs (memory), a chain of broadcasts in place of
 * an overlapped all-reduce (time), and chunks too small to use a device's
 * cores well.
 *
 * ZeRO-1 (cfg.zero): member r keeps optimizer state only for shard r of each
 * parameter (td_optimizer_create_shard), so each holds about 1 / size of it.
 * The gradients are reduce-scattered (each member gets the sum of its shard)
 * instead of all-reduced, bucket by bucket during backward when overlapping,
 * each member updates its shard of the weights, and the weights are
 * all-gathered. The weights equal those of the replicated optimizer. A
 * parked member stays in the group (it holds the only copy of its shard):
 * it takes no samples and runs no pass, but updates its shard and gathers
 * the weights, so it never falls behind. It does not go with deterministic
 * mode. Checkpoints take the whole state:
 * td_dp_gather_optimizer and td_dp_scatter_optimizer move it between the
 * shards and one whole optimizer. */

typedef struct td_dp td_dp;

typedef struct td_dp_config {
    int deterministic;         /* see above */
    int64_t chunk_samples;     /* micro-chunk size in deterministic mode (16) */
    size_t first_bucket_bytes; /* 256 KiB */
    size_t bucket_bytes;       /* 4 MiB */
    int overlap;               /* start buckets during backward: 1 on, 0 off, -1 (default)
                                  on unless every member is a local CPU device */
    int rebalance;             /* keep adjusting shares from step times (1) */
    td_balancer_config balancer;
    int zero; /* ZeRO-1 (0): see below */
} td_dp_config;

#define TD_DP_CONFIG_INIT                                                                          \
    {                                                                                              \
        .deterministic = 0, .chunk_samples = 16, .first_bucket_bytes = 256u << 10,                 \
        .bucket_bytes = 4u << 20, .overlap = -1, .rebalance = 1,                                   \
        .balancer = TD_BALANCER_CONFIG_INIT, .zero = 0                                             \
    }

/* Loads a replica of the model (JSON text; `name` stands for its file in
 * messages) on every local member of g, in dtype, from seed, and an
 * optimizer for each; then broadcasts rank 0's weights so that replicas start
 * identical. g must outlive the td_dp. For an MPI group every process calls
 * it. On failure *out is NULL. */
TD_API td_status td_dp_create(td_group *g, const char *model_json, const char *name, td_dtype dtype,
                              uint64_t seed, const td_optimizer_config *opt,
                              const td_dp_config *cfg, td_dp **out);
TD_API void td_dp_destroy(td_dp *dp);

/* Measures every member's time per sample on a few forward and backward
 * passes over `batch` (no update) and sets the shares from it. */
TD_API td_status td_dp_calibrate(td_dp *dp, const td_batch *batch);

/* One training step on the global batch (host memory, the same on every
 * process). `step` seeds dropout. *res gets the whole batch's loss sum and
 * accuracy counts; *stats (may be NULL) the timings. */
TD_API td_status td_dp_step(td_dp *dp, const td_batch *batch, uint64_t step, td_step_result *res,
                            td_step_stats *stats);

/* The `alternate` strategy: whole batches go round-robin across the members,
 * weighted by their speed; per_batch[i] gets batch i's result, exactly what
 * one device evaluating batch i gives. */
TD_API td_status td_dp_evaluate(td_dp *dp, const td_batch *batches, size_t n,
                                td_step_result *per_batch);

/* Broadcasts rank 0's weights, optimizer state and step count to every
 * replica (after loading a checkpoint into rank 0, say). */
TD_API td_status td_dp_sync_replicas(td_dp *dp);

/* Copies the optimizer state of every member into `whole`, a whole optimizer
 * (td_optimizer_create) over rank 0's replica, given by the process that
 * holds rank 0 (NULL in the others, which still call). Without ZeRO-1 that
 * is rank 0's own state; with it, the shards put together. */
TD_API td_status td_dp_gather_optimizer(td_dp *dp, td_optimizer *whole);

/* The reverse: every member takes its part of `whole` (given by the process
 * holding rank 0, NULL elsewhere), and its step count. Without ZeRO-1, rank 0
 * takes it all and the others get it by td_dp_sync_replicas. */
TD_API td_status td_dp_scatter_optimizer(td_dp *dp, td_optimizer *whole);

/* Brings the replicas of parked members, which sat steps out, up to date
 * from an unparked one; nothing to do (and no cost) when none is behind.
 * Steps do it themselves when a member comes back; call it before reading a
 * replica that may have been parked (to save a checkpoint from rank 0, say). */
TD_API td_status td_dp_refresh(td_dp *dp);

/* After a call on dp (a step, a refresh, a calibration, moving the optimizer
 * state, an evaluation) failed with TD_ERR_DEVICE_LOST: a new group of dp's
 * group's members less those lost in that call. While members are parked a
 * step runs on a group of the others, which alone knows who failed, so
 * td_group_shrink(td_dp_group(dp), NULL, 0, ...) would keep a lost member
 * then. The caller destroys the group; dp and its group stay as they are. */
TD_API td_status td_dp_survivors(td_dp *dp, td_group **out);

/* The replica and optimizer of a local member by global rank (NULL when the
 * rank is in another process). Borrowed. */
TD_API td_model *td_dp_model(td_dp *dp, int rank);
TD_API td_optimizer *td_dp_optimizer(td_dp *dp, int rank);
TD_API td_balancer *td_dp_balancer(td_dp *dp);
TD_API td_group *td_dp_group(td_dp *dp);

#ifdef __cplusplus
}
#endif
#endif
