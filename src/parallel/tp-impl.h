/* The inside of the `tensor` strategy (tensor parallelism, "tp"):
 * tp_strategy.c runs its steps, tp_plan.c measures the members and cuts
 * the slices, procs.c spans MPI processes, tp_decode.c generates with the
 * same slices; placement.c writes and reads its checkpoints. */
#ifndef TD_PARALLEL_TP_IMPL_H
#define TD_PARALLEL_TP_IMPL_H

#include "parallel/member_rows.h"
#include "parallel/procs.h"
#include "parallel/strategy-impl.h"
#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/generate.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

/* The tensor strategy's decoder (td_strategy_decoder_create; tp_decode.c). */
td_status td__tensor_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                             const char *options, td_decoder **out);

typedef struct tp_member {
    td_group *group;
    td_device *dev;
    int rank;
    td_model *m;
    td_optimizer *opt;
    td_shard_plan plan;
    td__rows rows;     /* the step's row of every member, gathered */
    td_buffer *scalar; /* (1) f64: the gradients' squared norm, summed */
    double alone_s;    /* calibration: a whole-model step on one sample */
    double shard_s;    /* calibration: its first shard's step, less waiting */
    uint64_t mem_free; /* calibration: its device's free memory, bytes */
    double comm_s, compute_s, update_s;
    td_status early_st; /* the first failure of an update in the backward */
    td_step_result res;
} tp_member;

typedef struct tp_mesh tp_mesh;

typedef struct tensor_par {
    td_strategy *s;
    tp_mesh *mesh; /* replicas of it in this process (data:R,tensor:N; tp_mesh.c); NULL: none */
    td_group *g;   /* this process's members (of this replica) */
    td__procs procs;
    int size;
    td_model_info info;
    int64_t lps; /* labels per sample */
    td_split_info units[TD_SHARD_MAX_UNITS];
    int nunits;
    double share[TD_DP_MAX_MEMBERS];
    tp_member mb[TD_DP_MAX_MEMBERS];
} tensor_par;

/* tp_strategy.c ------------------------------------------------------------------ */

/* A training step's call on one replica: the batch (its rows), their first
 * sample's place in the global batch, the dropout step and the loss scale. */
typedef struct tp_step_call {
    tensor_par *p;
    const td_batch *batch;
    int64_t first;
    uint64_t step;
    double grad_scale;
} tp_step_call;

/* Builds the strategy's state over g (one replica): the plan measured
 * (share NULL) or cut by `share`, and every member's shard. On failure
 * *out holds what was made, for td__tp_free. */
td_status td__tp_build(td_strategy *s, td_group *g, const double *share, tensor_par **out);
/* What td__tp_build made, not the mesh; NULL-safe. */
void td__tp_free(tensor_par *p);
/* Group jobs over a replica (arg: a tp_step_call): forward and backward,
 * then, the gradients summed with the other replicas', the update. */
td_status td__tp_backward_job(td_group *g, td_device *dev, int rank, int size, void *arg);
td_status td__tp_update_job(td_group *g, td_device *dev, int rank, int size, void *arg);

/* Member k's shard of the model (its plan's slices), optimizer and buffers. */
td_status td__tp_make_member(tensor_par *p, int k);
/* What td__tp_make_member made; the member keeps its place. */
void td__tp_drop_member(tp_member *m);
/* Every member's v summed into v; on the member's thread, all together. */
td_status td__tp_sum_scalar(tp_member *m, double *v);

/* tp_mesh.c ---------------------------------------------------------------------- */

/* Builds `replicas` replicas over s's group (consecutive members, size /
 * replicas each), the first with the measured plan, the others cut alike:
 * *out is the first, whose mesh holds the rest. */
td_status td__tp_mesh_open(td_strategy *s, int replicas, tensor_par **out);
void td__tp_mesh_close(tp_mesh *x);
int td__tp_mesh_replicas(const tp_mesh *x);
/* After a loss: s's group (g) less the members that failed in any of the
 * mesh's groups. */
td_status td__tp_mesh_survivors(const tp_mesh *x, td_group *g, td_group **out);
tensor_par *td__tp_mesh_replica(const tp_mesh *x, int r);
/* One step over every replica: each its rows, gradients summed across the
 * replicas member by member, then the update. */
td_status td__tp_mesh_step(tensor_par *p, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats);

/* tp_plan.c ---------------------------------------------------------------------- */

/* Times every member alone, agrees the timings across processes and cuts
 * the slices (p->share, each member's plan) by speed and memory. */
td_status td__tp_plan(tensor_par *p);
/* Where the members' speeds differ, times their shards and, where that
 * calls for other shares, builds the members again with them. */
td_status td__tp_rebalance(tensor_par *p);
/* The table's split and adopt_split. */
void td__tp_split(void *impl, char *buf, size_t n);
/* Cuts the slices by share (one per member) and builds the members again. */
td_status td__tp_use_shares(tensor_par *p, const double *share);
td_status td__tp_adopt_split(void *impl, const char *text, int *adopted);

#endif
