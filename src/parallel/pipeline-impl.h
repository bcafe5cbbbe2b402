/* The `pipeline` strategy's inside: the plan (which device holds which
 * layers), made from each layer's measured cost on each device and from each
 * device's memory, and the stages that run it. */
#ifndef TD_PIPELINE_IMPL_H
#define TD_PIPELINE_IMPL_H

#include <pthread.h>

#include "parallel/member_rows.h"
#include "parallel/procs.h"
#include "tandem/strategy.h"

#define TD_PP_MAX_STAGES TD_DP_MAX_MEMBERS
/* Micro-batches a stage holds at once, at most: 1F1B needs one per stage
 * from it to the last; more only let it run ahead. A channel holds as many
 * messages, since a sender has at most its slots' worth not yet taken. */
#define TD_PP_MAX_SLOTS TD_PP_MAX_STAGES

typedef struct td_pp_plan {
    int members;                 /* the group's size: stages, some maybe empty */
    int first[TD_PP_MAX_STAGES]; /* member k holds layers [first[k], end[k]) */
    int end[TD_PP_MAX_STAGES];
    double seconds[TD_PP_MAX_STAGES]; /* its layers' forward + backward per step, measured */
    double alone_s[TD_PP_MAX_STAGES]; /* the whole model's on it alone, per step */
    size_t bytes[TD_PP_MAX_STAGES];   /* what it holds: weights, gradients, optimizer
                                         state, activations */
    int slots[TD_PP_MAX_STAGES];      /* micro-batches it holds at once: at least 1F1B's,
                                         more where its memory has room */
} td_pp_plan;

/* What the plan needs to know about the run. */
typedef struct td_pp_need {
    const char *json, *name;
    td_dtype dtype;
    uint64_t seed;
    const td_optimizer_config *opt;
    const td_model_info *info;
    const td_layer_info *layers; /* info->layers of them */
    int64_t batch;               /* samples a step takes */
    int64_t micro_batches;
    const unsigned char *joined; /* NULL, or by layer: 1 where no stage may begin (inside a
                                    unit split over a stage's members) */
} td_pp_need;

/* Whether the stages after the first carry the end of a training step (the
 * weight gradients they still owe, their optimizer step) into the next
 * (pipeline_run.c): not when clipping, whose norm every stage's update
 * needs at once. */
int td__pp_tails_carry(const td_optimizer_config *opt);

/* Measures every layer on every member of g (forward and backward of one
 * micro-batch, each layer alone) and cuts the layers into consecutive
 * stages, member k taking the k-th, so that the slowest stage is as fast as
 * it can be while every stage fits its device's free memory. Members may be
 * left empty (more members than layers, or a device too slow to help).
 * TD_ERR_OUT_OF_MEMORY naming the devices when no cut fits. */
td_status td__pp_plan(td_group *g, const td_pp_need *need, td_pp_plan *out);

/* The pipeline strategy's decoder (td_strategy_decoder_create):
 * pipeline_decode.c. */
td_status td__pipeline_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                               const char *options, td_decoder **out);

/* The running pipeline, shared by pipeline.c (the strategy) and
 * pipeline_run.c (a step on the stages). ------------------------------- */

/* Micro-batches a step may be cut into. */
#define MAX_MICRO 4096

typedef struct channel {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const td_buffer *buf[TD_PP_MAX_SLOTS]; /* message j at [j % TD_PP_MAX_SLOTS] */
    int64_t posted, consumed;              /* messages 0..posted-1 posted; consumed likewise */
    /* Set where the receiver cannot copy from the sender's device on its own
     * thread (td_buffer_copy_is_direct): the sender then reads each message
     * into host memory on its own thread, at the same place as buf's. */
    int staged;
    void *host[TD_PP_MAX_SLOTS];
    size_t host_bytes[TD_PP_MAX_SLOTS];
} channel;

typedef struct pipeline pipeline;
typedef struct pp_mesh pp_mesh;

typedef struct stage {
    pipeline *p;
    td_group *group;
    td_device *dev;
    int rank, slots;
    td_model *part; /* NULL: an empty member, which holds no layer */
    td_optimizer *opt;
    td_buffer *recv; /* what this stage copies its neighbours' messages into */
    size_t recv_bytes;
    td__rows rows;     /* the step's row of every stage, gathered */
    size_t term_first; /* this stage's first term of the model's norm */
    td_buffer *terms;  /* (nterms) f64: the norm's terms, gathered */
    double *terms_host;
    double compute_s, comm_s, update_s; /* idle: the rest of the step */
    td_step_result res;
    /* Micro-batches [w_next, b_done) went back to their input but still owe
     * their weight gradients (td_model_part_backward_weights). */
    int64_t w_next, b_done;
    int update_owed;  /* the step before's optimizer step (pipeline_run.c) */
    td_group *across; /* this stage of every replica (data:R,pipeline:N); NULL: none */
    td_group *tgroup; /* the members splitting this stage (pipeline:P,tensor:N); NULL: none */
    int shard;        /* this member's place in tgroup */
} stage;

struct pipeline {
    td_strategy *s;
    pp_mesh *mesh; /* replicas of it (data:R,pipeline:N; pp_mesh.c); NULL: none */
    td_group *g;   /* this replica's stages */
    int size;
    int rank0, rank_step;  /* stage k is member rank0 + k rank_step of the strategy's group */
    td__procs procs;       /* under mpirun, each process a replica (pp_procs.c) */
    td_shard_plan *shards; /* stage k's slices, when a tensor axis splits the stages */
    td_model_info info;
    td_layer_info *layers;
    td_pp_plan plan;
    int64_t micro_batches;
    size_t nterms; /* the gradient norm's terms: two per parameter of the model */
    stage st[TD_PP_MAX_STAGES];
    int prev[TD_PP_MAX_STAGES], next[TD_PP_MAX_STAGES]; /* neighbours with layers, or -1 */
    channel fwd[TD_PP_MAX_STAGES];                      /* k to next[k]: activations */
    channel bwd[TD_PP_MAX_STAGES];                      /* k to prev[k]: their gradients */
    int abort;      /* a member failed: the others stop (atomic) */
    int first_done; /* the first stage has finished the step (atomic) */

    /* The step or evaluation under way. */
    const td_batch *batch;                     /* training: the whole batch */
    td_batch *evals;                           /* evaluation: the batches cut into micro-batches */
    size_t *eval_of;                           /* the batch each came from */
    td_step_result *eval_res;                  /* per batch */
    int64_t m, off[MAX_MICRO], cnt[MAX_MICRO]; /* micro-batches: first sample, samples */
    int train;
    uint64_t step;
    double grad_scale;
    int64_t first; /* the batch's first sample in the global batch (a replica's rows) */
};

/* Splits a batch of n samples into p->m micro-batches as even as can be. */
void td__pp_split(pipeline *p, int64_t n);
/* Sets p up for a training step on batch (rows of the global batch from
 * `first`), each label's gradient scaled by grad_scale. */
void td__pp_setup_step(pipeline *p, const td_batch *batch, int64_t first, uint64_t step,
                       double grad_scale);
/* The step's results: the sum of the stages' numbers into *res, the rows
 * themselves into rows (p->size of them). */
td_status td__pp_results(pipeline *p, td_step_result *res, td__member_row *rows);
/* Builds the pipeline over g (one replica): its plan measured (plan NULL)
 * or the one given. On failure *out holds what was made, for td__pp_free. */
td_status td__pp_build(td_strategy *s, td_group *g, const td_pp_plan *plan, pipeline **out);
/* td__pp_build in three: what comes before the plan, the plan measured over
 * p's members, and the stages made by `plan` (each the shard p->shards[k]
 * of its layers, when set). */
td_status td__pp_begin(td_strategy *s, td_group *g, pipeline **out);
td_status td__pp_measure(pipeline *p, const unsigned char *joined, td_pp_plan *plan);
td_status td__pp_finish(pipeline *p, const td_pp_plan *plan);
/* What td__pp_build made, not the mesh; NULL-safe. */
void td__pp_free(pipeline *p);

/* pp_procs.c: data x pipeline over MPI processes, each one replica over
 * its own devices, cut as process 0 measured. */
td_status td__pp_procs_open(td_strategy *s, pipeline **out);
/* This process's rows of the global batch, set up for a step. */
void td__pp_procs_setup_step(pipeline *p, const td_batch *batch, td_batch *rows, uint64_t step);
/* The step's numbers summed over the processes. */
td_status td__pp_procs_results(pipeline *p, td_step_result *res);

/* pp_mesh.c: data x pipeline and pipeline x tensor within one process:
 * `replicas` replicas, or each stage split over `tensor` members. */
td_status td__pp_mesh_open(td_strategy *s, int replicas, int tensor, pipeline **out);
/* Whether the mesh's pipelines hold different slices (a tensor axis): a
 * checkpoint then gathers from every one. */
int td__pp_mesh_sliced(const pp_mesh *x);
void td__pp_mesh_close(pp_mesh *x);
/* The mesh's pipelines (1 for none): its replicas, or a tensor mesh's
 * chains; pipeline r of them (0 is the strategy's own). */
int td__pp_mesh_pipelines(const pp_mesh *x);
pipeline *td__pp_mesh_pipeline(const pp_mesh *x, int r);
td_status td__pp_mesh_step(pipeline *p, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats);
/* The plan text of a tensor mesh: a line per stage, with its members'
 * shares of its units. */
const char *td__pp_mesh_plan(const pipeline *p, char *buf, size_t n);
/* The table's split and adopt_split: a tensor mesh's shares, stage after
 * stage; nothing for the others, whose cut changes no number. */
void td__pp_mesh_split(void *impl, char *buf, size_t n);
td_status td__pp_mesh_adopt_split(void *impl, const char *text, int *adopted);
/* Every stage made again: after p->shards changed. */
td_status td__pp_remake_stages(pipeline *p);
/* Runs what is set up in every pipeline of p's mesh at once. */
td_status td__pp_mesh_run(pipeline *p);
/* Runs the step or evaluation set up in p on every member (td_group_run);
 * a member that fails stops the others. */
td_status td__pp_run(pipeline *p);
/* Has every stage pay what it still owes of the step before: before
 * anything reads or replaces the weights or the optimizer's state. */
td_status td__pp_settle(pipeline *p);
/* The optimizer's sum-of-squares reduction over the stages (arg: a stage). */
td_status td__pp_sum_over_stages(void *arg, const double *terms, size_t n, double *sumsq);

#endif
