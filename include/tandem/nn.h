/* tandem: neural networks on one device. A model is a stack of layers read
 * from a JSON file; it runs forward and backward on the device it was loaded
 * on, in f32 or f64. Several replicas on several devices make data
 * parallelism (see parallel.h); this header knows one device only. */
#ifndef TANDEM_NN_H
#define TANDEM_NN_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_model td_model;
typedef struct td_optimizer td_optimizer;

/* What a model reads per sample. */
typedef enum td_input_kind {
    TD_INPUT_FEATURES = 0, /* floats, shape td_model_input_shape() (MLP, CNN) */
    TD_INPUT_TOKENS = 1,   /* int32 token ids, shape (T) (GPT) */
} td_input_kind;

/* A batch in host memory. The model copies it to its device. */
typedef struct td_batch {
    int64_t n;             /* samples */
    const float *x;        /* (n, input shape...) for TD_INPUT_FEATURES, else NULL */
    const int32_t *tokens; /* (n, T) for TD_INPUT_TOKENS, else NULL */
    const int32_t *labels; /* (n) classes, or (n, T) next tokens for a GPT */
} td_batch;

/* Sums over the batch, so that slices from several devices add up. */
typedef struct td_step_result {
    double loss_sum; /* sum of per-label cross-entropy losses, in nats */
    int64_t correct; /* labels whose arg-max prediction was right */
    int64_t count;   /* labels counted: n, or n * T for a GPT */
} td_step_result;

/* Loads the model described by the JSON file at path and creates its
 * parameters on dev in dtype, initialised as PyTorch's defaults do, from
 * seed (the same numbers on every device). Errors name the file, the layer
 * index and the field. The caller destroys *out. */
TD_API td_status td_model_load(const char *path, td_device *dev, td_dtype dtype, uint64_t seed,
                               td_model **out);
/* The same from JSON text; `name` stands for the file in messages. */
TD_API td_status td_model_load_string(const char *json, const char *name, td_device *dev,
                                      td_dtype dtype, uint64_t seed, td_model **out);
/* NULL-safe. */
TD_API void td_model_destroy(td_model *m);

TD_API td_device *td_model_device(const td_model *m);
TD_API td_dtype td_model_dtype(const td_model *m);
TD_API td_input_kind td_model_input_kind(const td_model *m);
/* Per-sample input shape into shape[0..return value): (784), (1, 28, 28), (T). */
TD_API int td_model_input_shape(const td_model *m, int64_t shape[TD_MAX_DIMS]);
/* Classes (or vocabulary size for a GPT). */
TD_API int64_t td_model_num_classes(const td_model *m);
/* The model's JSON text as loaded, for checkpoints. Valid while m lives. */
TD_API const char *td_model_json(const td_model *m);

/* Forward and backward over the batch. The gradients become
 * grad_scale * d(loss_sum)/d(param) (grad_scale = 1/count gives the mean
 * loss); with accumulate they are added to the gradients already there.
 * Dropout draws from (seed, step) so replicas and reruns agree. *out gets
 * the loss sum and accuracy counts. */
TD_API td_status td_model_train_step(td_model *m, const td_batch *batch, double grad_scale,
                                     int accumulate, uint64_t dropout_step, td_step_result *out);
/* td_model_train_step over a slice of a larger batch whose first sample is
 * sample `first` of that batch. Dropout draws each sample's mask by its place
 * in the whole batch, so slices trained apart (on several devices, or in
 * chunks) drop exactly what one pass over the whole batch would. */
TD_API td_status td_model_train_slice(td_model *m, const td_batch *slice, int64_t first,
                                      double grad_scale, int accumulate, uint64_t dropout_step,
                                      td_step_result *out);
/* Forward only, in inference mode (no dropout). */
TD_API td_status td_model_evaluate(td_model *m, const td_batch *batch, td_step_result *out);

/* Parameters in forward order. Borrowed: valid while m lives. Names are
 * "layers.<i>.<what>", stable across runs (checkpoint keys). */
TD_API size_t td_model_param_count(const td_model *m);
TD_API td_tensor *td_model_param(td_model *m, size_t i);
TD_API td_tensor *td_model_grad(td_model *m, size_t i);
TD_API const char *td_model_param_name(const td_model *m, size_t i);
/* Total number of scalar parameters. */
TD_API size_t td_model_num_weights(const td_model *m);

/* Called during backward, on the device's thread, each time the gradients of
 * parameters [first, first + count) are final: backward visits layers in
 * reverse, so a data-parallel trainer can start reducing them while backward
 * goes on. NULL removes the hook. */
typedef void (*td_grad_ready_fn)(void *arg, size_t first, size_t count);
TD_API void td_model_set_grad_hook(td_model *m, td_grad_ready_fn fn, void *arg);

/* Optimizers ---------------------------------------------------------------- */

typedef enum td_optimizer_kind {
    TD_OPT_SGD = 0, /* with momentum and optional Nesterov */
    TD_OPT_ADAMW = 1,
} td_optimizer_kind;

typedef enum td_lr_schedule {
    TD_LR_CONSTANT = 0,
    TD_LR_COSINE = 1, /* from lr to min_lr over total_steps, after warm-up */
} td_lr_schedule;

typedef struct td_optimizer_config {
    td_optimizer_kind kind;
    double lr;
    double momentum;     /* SGD */
    int nesterov;        /* SGD */
    double beta1, beta2; /* AdamW */
    double eps;          /* AdamW */
    double weight_decay; /* decoupled for AdamW, L2 for SGD */
    double clip_norm;    /* clip gradients to this global L2 norm; 0: off */
    td_lr_schedule schedule;
    int64_t warmup_steps; /* linear warm-up from 0 */
    int64_t total_steps;  /* for the cosine schedule */
    double min_lr;
} td_optimizer_config;

#define TD_OPTIMIZER_CONFIG_INIT                                                                   \
    { TD_OPT_SGD, 0.01, 0.9, 0, 0.9, 0.999, 1e-8, 0.0, 0.0, TD_LR_CONSTANT, 0, 0, 0.0 }

/* Creates an optimizer over every parameter of m, state on m's device. */
TD_API td_status td_optimizer_create(td_model *m, const td_optimizer_config *cfg,
                                     td_optimizer **out);
TD_API void td_optimizer_destroy(td_optimizer *opt);
/* One update from the current gradients (clipped first when configured);
 * *grad_norm, when not NULL, gets the global norm before clipping. */
TD_API td_status td_optimizer_step(td_optimizer *opt, double *grad_norm);

/* ZeRO-1: an optimizer that keeps state for, and updates, only shard `rank`
 * of `size` of every parameter: with c = numel / size, elements
 * [rank * c, rank * c + c), plus the numel % size elements at the end, which
 * every shard keeps and updates alike. Its state tensors are 1-D (c + that
 * tail), named as the whole optimizer's; a checkpoint refuses it and takes
 * the whole state (td_dp_gather_optimizer). Clipping needs the norm of the whole
 * gradient: `reduce`, when set, sums every shard's sum of squares (each
 * shard counts its own elements, and the tail only in shard 0). */
typedef td_status (*td_sumsq_reduce_fn)(void *arg, double *sumsq);
TD_API td_status td_optimizer_create_shard(td_model *m, const td_optimizer_config *cfg, int rank,
                                           int size, td_optimizer **out);
TD_API void td_optimizer_set_sumsq_reduce(td_optimizer *opt, td_sumsq_reduce_fn reduce, void *arg);
/* The shard's rank and the number of shards (0 and 1 for a whole optimizer). */
TD_API int td_optimizer_shard_rank(const td_optimizer *opt);
TD_API int td_optimizer_shard_count(const td_optimizer *opt);
/* Where shard `rank` of `size` of a parameter of `numel` elements lies:
 * *first and *count for its own part, *tail_first and *tail for the tail. */
TD_API void td_optimizer_shard_range(size_t numel, int rank, int size, size_t *first, size_t *count,
                                     size_t *tail_first, size_t *tail);
/* The learning rate the next step will use. */
TD_API double td_optimizer_lr(const td_optimizer *opt);
TD_API int64_t td_optimizer_steps(const td_optimizer *opt);
TD_API void td_optimizer_set_steps(td_optimizer *opt, int64_t steps);
/* State tensors (momentum, Adam moments) in a stable order and with stable
 * names ("layers.0.weight.exp_avg"), for checkpoints. Borrowed. */
TD_API size_t td_optimizer_state_count(const td_optimizer *opt);
TD_API td_tensor *td_optimizer_state(td_optimizer *opt, size_t i);
TD_API const char *td_optimizer_state_name(const td_optimizer *opt, size_t i);

#ifdef __cplusplus
}
#endif
#endif
