/* The `pipeline` strategy's inside: the plan (which device holds which
 * layers), made from each layer's measured cost on each device and from each
 * device's memory, and the stages that run it. */
#ifndef TD_PIPELINE_IMPL_H
#define TD_PIPELINE_IMPL_H

#include "tandem/strategy.h"

#define TD_PP_MAX_STAGES TD_DP_MAX_MEMBERS

typedef struct td_pp_plan {
    int members;                 /* the group's size: stages, some maybe empty */
    int first[TD_PP_MAX_STAGES]; /* member k holds layers [first[k], end[k]) */
    int end[TD_PP_MAX_STAGES];
    double seconds[TD_PP_MAX_STAGES]; /* its layers' forward + backward per step, measured */
    double alone_s[TD_PP_MAX_STAGES]; /* the whole model's on it alone, per step */
    size_t bytes[TD_PP_MAX_STAGES];   /* what it holds: weights, gradients, optimizer
                                         state, activations */
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
} td_pp_need;

/* Measures every layer on every member of g (forward and backward of one
 * micro-batch, each layer alone) and cuts the layers into consecutive
 * stages, member k taking the k-th, so that the slowest stage is as fast as
 * it can be while every stage fits its device's free memory. Members may be
 * left empty (more members than layers, or a device too slow to help).
 * TD_ERR_OUT_OF_MEMORY naming the devices when no cut fits. */
td_status td__pp_plan(td_group *g, const td_pp_need *need, td_pp_plan *out);

/* Activation slots member k of plan needs: one per micro-batch it can hold
 * between forward and backward under 1F1B. */
int td__pp_slots(const td_pp_plan *plan, int k, int64_t micro_batches);

#endif
