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

/* What a model file may ask for, checked when it loads, before its layers
 * are allocated (docs/models.md): layers once repeat blocks are expanded
 * (residual blocks and their layers counted), residual and repeat blocks
 * nested in one another, elements of one tensor (the input or a layer's
 * output per sample, a parameter), and elements of all the parameters or
 * of one sample's activations together. Beyond them a file is refused
 * (TD_ERR_PARSE naming the field) rather than left to exhaust memory or
 * overflow a size. */
#define TD_MODEL_MAX_LAYERS 100000
#define TD_MODEL_MAX_DEPTH  16
#define TD_MODEL_MAX_TENSOR ((int64_t)1 << 32)
#define TD_MODEL_MAX_TOTAL  ((int64_t)1 << 36)

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

/* What a model is, without building it. */
typedef struct td_model_info {
    td_input_kind kind;
    int in_ndim;
    int64_t in_shape[TD_MAX_DIMS]; /* per sample: (784), (1, 28, 28), (T) */
    int64_t classes;               /* classes, or the vocabulary of a token model */
    int layers;         /* top-level layers (repeat blocks expanded): where a model is cut */
    size_t num_weights; /* scalar parameters of the whole model */
} td_model_info;

/* One top-level layer, for planning a cut. */
typedef struct td_layer_info {
    char type[16];         /* as in the JSON: "linear", "relu", "residual", ... */
    size_t weights;        /* its scalar parameters */
    size_t act_per_sample; /* activation elements a pass over one sample keeps for it
                              (output, its gradient, workspace) */
    int out_ndim;
    int64_t out_shape[TD_MAX_DIMS]; /* what it gives per sample */
} td_layer_info;

/* Describes the model in json (`name` stands for its file in messages)
 * without allocating anything on a device: *info, and when layers is not
 * NULL, layers[0..min(info->layers, max_layers)). Errors as td_model_load's. */
TD_API td_status td_model_describe(const char *json, const char *name, td_model_info *info,
                                   td_layer_info *layers, int max_layers);
/* The same of a loaded model (or part: the whole model's). */
TD_API void td_model_get_info(const td_model *m, td_model_info *out);

/* Model parts (pipeline stages) ---------------------------------------------
 *
 * A part holds top-level layers [first, end) of a model and only their
 * parameters, under the whole model's names and with the whole model's
 * initial values (a part's parameter i is the whole model's parameter
 * first_param + i). It reads the activations layer `first` reads (the
 * model's input when first is 0) and gives those layer end - 1 gives (the
 * logits, and then the loss, when end is the layer count). It keeps `slots`
 * independent sets of activations, so that that many micro-batches can be
 * between their forward and their backward at once; each slot's arena is
 * allocated on dev at the slot's first forward of a larger micro-batch (an
 * arena over dev's budget is TD_ERR_OUT_OF_MEMORY naming dev). Parts run
 * forward and backward on their device's thread (inline when called from
 * it); one part is used by one thread at a time. A whole model is the part
 * [0, layer count) with one slot; td_model_train_step and friends refuse
 * any other part. The accessors above (input shape, classes, JSON) give the
 * whole model's; td_model_param*() the part's own parameters. A bad range
 * (first < 0, end <= first, end over the layer count) or slots < 1 is
 * TD_ERR_INVALID_ARG. */
TD_API td_status td_model_load_part(const char *json, const char *name, td_device *dev,
                                    td_dtype dtype, uint64_t seed, int first, int end, int slots,
                                    td_model **out);
/* Layers [*first, *end) a model holds (0 and the layer count for a whole
 * model), and the part's index of its first parameter in the whole model. */
TD_API void td_model_part_range(const td_model *m, int *first, int *end, size_t *first_param);

/* Forward of micro-batch mb (mb->n samples, whose first is sample
 * `first_sample` of the step's batch: dropout masks as one pass over the
 * batch) in activation slot `slot`. The first part reads mb's x or tokens;
 * a later part reads `in`, the previous part's output (n, in...) in its
 * dtype on any device, copied in (a peer copy where the backend can). With
 * train, dropout is on and the last part also computes the loss of mb's
 * labels, scaled by grad_scale for backward; *res (may be NULL) gets the
 * loss sum and counts on the last part, zeros elsewhere. */
TD_API td_status td_model_part_forward(td_model *m, int slot, const td_batch *mb,
                                       int64_t first_sample, const td_buffer *in, int train,
                                       uint64_t dropout_step, double grad_scale,
                                       td_step_result *res);
/* The slot's output activations (n, out...) after its forward, on m's
 * device; valid until the slot's next forward. */
TD_API const td_buffer *td_model_part_output(td_model *m, int slot);
/* Backward of the slot's micro-batch: dout is the gradient of the part's
 * output (n, out...) from the next part, on any device (copied in); NULL on
 * the last part, which starts from its loss (a dout given there stands in
 * for the loss's gradient). The slot must hold a forward with train set,
 * not yet gone back through (once per forward). Parameter gradients are
 * added to what is there (accumulate = 1) or replace it (0). */
TD_API td_status td_model_part_backward(td_model *m, int slot, const td_buffer *dout,
                                        int accumulate);
/* The same backward in two halves, so that a stage can send its input's
 * gradient on before the GEMMs whose results only it needs (a zero-bubble
 * pipeline's B and W): _input leaves out the weight gradients of linear,
 * attention and embedding layers, which _weights computes later from the
 * activations and gradients the slot still holds, with the accumulate flag
 * _input had. Together they give what td_model_part_backward gives,
 * bitwise. A slot owing its weights refuses a forward until _weights ran. */
TD_API td_status td_model_part_backward_input(td_model *m, int slot, const td_buffer *dout,
                                              int accumulate);
TD_API td_status td_model_part_backward_weights(td_model *m, int slot);
/* _weights for several slots, each given once, in that order: the same
 * sums in the same order as one call per slot, bitwise, computed layer by
 * layer so that each layer's gradients stay in cache across the slots. */
TD_API td_status td_model_part_backward_weights_many(td_model *m, const int *slots, int count);
/* The gradient of the slot's input (n, in...) after its backward, on m's
 * device; NULL for a part that starts at layer 0. Valid until the slot's
 * next backward. */
TD_API const td_buffer *td_model_part_input_grad(td_model *m, int slot);

/* Tensor-parallel shards ------------------------------------------------------
 *
 * A shard holds every layer of a model, but each splittable unit only its
 * slice:
 *   an MLP pair: a linear whose output goes through an elementwise
 *     activation (relu, gelu, tanh, sigmoid), and optionally a dropout, into
 *     another linear of the same layer list. The first linear keeps output
 *     features [first, first + count) (rows of its weight and bias), the
 *     second the same input features (columns of its weight) and its whole
 *     bias. The pair's output is partial on each shard: the model sums it
 *     across the shards with the reduce hook, then adds the second bias once;
 *     in backward the first linear's input gradient is summed likewise.
 *   attention: heads [first, first + count): the rows of qkv.weight and
 *     qkv.bias for those heads' q, k and v, the columns of proj.weight;
 *     proj.bias whole, added after the sum; the input gradient summed in
 *     backward.
 * Everything else (embedding, layer norm, a lone linear, convolutions,
 * pools) is replicated: every shard computes it on the same numbers, so its
 * gradients agree on every shard. Pairs are found left to right in each
 * layer list, so a linear ends at most one pair. A shard's parameters have
 * the whole model's names and the whole model's initial values, slice by
 * slice, exactly; td_model_train_step, td_model_train_slice and
 * td_model_evaluate run a shard on the whole batch (the loss is the whole
 * model's on every shard). The shards of one step call the reduce hook the
 * same number of times, in the same order, with tensors of the same shape. */

typedef enum td_split_kind {
    TD_SPLIT_MLP = 0,   /* linear, activation (, dropout), linear; or SwiGLU: hidden features */
    TD_SPLIT_HEADS = 1, /* attention: heads */
} td_split_kind;

/* One splittable unit, for sizing a split. */
typedef struct td_split_info {
    td_split_kind kind;
    int64_t size;    /* hidden features, or heads: what a plan divides */
    int64_t width;   /* activation columns per unit of size: 1, or the head dimension */
    char layer[128]; /* the path of its (first) layer: "layers.0", "layers.2.1" (the
                        limits above keep every path shorter) */
    size_t weights;  /* scalars of the parameters it splits, in the whole model */
    int span;        /* layers of its list it takes, from `layer` on: 1, or a pair's 3 or 4 */
    int64_t group;   /* query heads per key and value head (grouped-query attention); else 1 */
} td_split_info;

#define TD_SHARD_MAX_UNITS 256

/* What one shard holds of each unit, in td_model_describe_splits' order:
 * [first[k], first[k] + count[k]) of units[k].size; count may be 0 (the
 * shard holds none of it: its partial output is zeros). */
typedef struct td_shard_plan {
    int units;
    int64_t first[TD_SHARD_MAX_UNITS], count[TD_SHARD_MAX_UNITS];
} td_shard_plan;

/* The model in json with every tied linear (a head sharing the embedding's
 * table) given a weight of its own under the linear's own name: a pipeline
 * part can then hold the head without the embedding (loading it from the
 * table: td_checkpoint_load_weights_alias). *out (malloc'ed; the caller
 * frees it) is NULL when nothing is tied. Malformed JSON is TD_ERR_PARSE
 * naming `name`. */
TD_API td_status td_model_untie(const char *json, const char *name, char **out);

/* Lists the model's splittable units in forward order into
 * units[0..min(*count, max_units)) (units may be NULL to count them);
 * *count gets their number (0: nothing to split). Errors as
 * td_model_describe's; more than TD_SHARD_MAX_UNITS units is
 * TD_ERR_UNSUPPORTED. */
TD_API td_status td_model_describe_splits(const char *json, const char *name, td_split_info *units,
                                          int max_units, int *count);
/* Loads the shard `plan` describes on dev, as td_model_load_string loads a
 * whole model. A plan whose unit count differs from the model's, or a range
 * outside a unit, is TD_ERR_INVALID_ARG naming the unit. The caller destroys
 * *out. */
TD_API td_status td_model_load_shard(const char *json, const char *name, td_device *dev,
                                     td_dtype dtype, uint64_t seed, const td_shard_plan *plan,
                                     td_model **out);
/* A pipeline stage's part (td_model_load_part) of that shard: layers
 * [first, end) with `slots` activation slots, each splittable unit among them
 * cut as `plan` says (the plan covers every unit of the whole model). */
TD_API td_status td_model_load_part_shard(const char *json, const char *name, td_device *dev,
                                          td_dtype dtype, uint64_t seed, int first, int end,
                                          int slots, const td_shard_plan *plan, td_model **out);
/* 1 for a shard. */
TD_API int td_model_is_shard(const td_model *m);

/* Sums t (on the model's device) in place across every shard of the model;
 * called on the device's thread during forward and backward. */
typedef td_status (*td_reduce_fn)(void *arg, td_tensor *t);
/* Sets the hook (NULL: none, right only for a shard that holds every unit
 * whole). arg stays the caller's. */
TD_API void td_model_set_reduce_hook(td_model *m, td_reduce_fn fn, void *arg);

/* Where a parameter of a shard lies in the whole parameter of its name: the
 * whole shape, and along dimension `dim` (-1: the whole tensor, replicated)
 * `blocks` equal blocks (3 for attention's q, k, v rows; else 1), of each of
 * which the shard holds [first, first + count), concatenated in block order.
 * Grouped-query attention's q, k, v rows are unequal blocks (kv_extent > 0):
 * the last two (keys, values) kv_extent each, of which the shard holds
 * [kv_first, kv_first + kv_count), the first one the rest, of which it holds
 * [first, first + count). A key and value head serves several query heads,
 * and so may be held by several shards: the first kv_shared of each of
 * those two blocks' held elements along dim are held by a lower shard too. */
typedef struct td_param_slice {
    int ndim;
    int64_t shape[TD_MAX_DIMS]; /* the whole parameter's */
    int dim, blocks;
    int64_t first, count;
    int64_t kv_extent, kv_first, kv_count, kv_shared;
} td_param_slice;

/* Parameter i's slice (of a model that is no shard: the whole tensor). */
TD_API void td_model_param_slice(const td_model *m, size_t i, td_param_slice *out);
/* Host copies between a whole parameter and a shard's slice of it, elements
 * of elem_size bytes: gather writes the slice's elements into `whole`,
 * scatter reads them from it. */
TD_API void td_param_slice_gather(const td_param_slice *s, size_t elem_size, const void *part,
                                  void *whole);
TD_API void td_param_slice_scatter(const td_param_slice *s, size_t elem_size, const void *whole,
                                   void *part);

/* Spatial bands ----------------------------------------------------------------
 *
 * A band model holds the whole model, but runs its head (the leading
 * top-level layers that compute each output row from nearby input rows:
 * conv2d, maxpool, avgpool and element-wise activations) on one horizontal
 * band of every image: band `rank` of `members`, top to bottom. Before each
 * convolution or pooling it needs rows its neighbours hold (the halo); after
 * its backward it owes them the gradients of those rows; after the head the
 * bands are gathered whole on every member and the rest of the model runs
 * on the same numbers everywhere. All three go through the gather hook, an
 * all-gather across the members. The head's weight gradients are partial
 * (their band's) and are summed through the reduce hook after the
 * backward; the rest are the whole model's on every member. Every member
 * calls the hooks the same number of times, in the same order, with tensors
 * of the same shape. td_model_train_step, td_model_train_slice (accumulate
 * 0) and td_model_evaluate run a band model on the whole batch; the loss is
 * the whole model's on every member. */

#define TD_BAND_MAX_LAYERS 64

/* What of a model can run on bands: its head, top-level layers [0, layers),
 * and each head layer's output height (in_rows: the input's). */
typedef struct td_band_head {
    int layers;
    int64_t in_rows;
    int64_t rows[TD_BAND_MAX_LAYERS];
    char type[TD_BAND_MAX_LAYERS][16]; /* as in the JSON */
} td_band_head;

/* Finds the head of the model in json. A model of tokens, whose input is
 * not (channels, height, width), whose head has no convolution or pooling,
 * or that has nothing after its head, is TD_ERR_UNSUPPORTED saying which. */
TD_API td_status td_model_describe_bands(const char *json, const char *name, td_band_head *out);

/* How the head is cut: band k of head layer i's output is rows
 * [bounds[i (members + 1) + k], bounds[i (members + 1) + k + 1]). */
typedef struct td_band_plan {
    int members, rank, layers;
    const int64_t *bounds; /* (layers, members + 1); copied by td_model_set_bands */
} td_band_plan;

/* Makes m (a whole model, not a part or shard) run its head on band
 * plan->rank, or on other bands when it already does. An empty band, or one
 * whose neighbour holds fewer rows than a kernel's halo needs, is
 * TD_ERR_INVALID_ARG naming the layer and the band (m stays as it was).
 * From the thread that made m, while no pass runs. */
TD_API td_status td_model_set_bands(td_model *m, const td_band_plan *plan);

/* All-gathers send (on the model's device) into recv (members times as
 * many elements, in rank order) across the members; halo: 1 for the rows
 * neighbours trade around a convolution (or their gradients), 0 for the
 * head's output gathered whole. Called on the device's thread. */
typedef td_status (*td_gather_fn)(void *arg, const td_tensor *send, td_tensor *recv, int halo);
/* Sets the hook of a band model (nothing for another); td_model_set_bands
 * clears it, so set it after each. A band model of one member needs none.
 * arg stays the caller's. */
TD_API void td_model_set_gather_hook(td_model *m, td_gather_fn fn, void *arg);

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

/* Rounds m's weight matrices (linear layers, attention's q/k/v and output
 * projections, SwiGLU's, the token embedding's table) to fmt's values in
 * place and records fmt, so that evaluation computes with what the compact
 * format holds and decoders made from m pack them (generate.h). F32 only
 * records. q8_0 needs rows of whole 32-value blocks: else TD_ERR_SHAPE
 * naming the layer; a compact format on an f64 model is TD_ERR_DTYPE. */
TD_API td_status td_model_set_weights(td_model *m, td_weights fmt);
/* A process-wide choice of weights (tandem generate and eval --weights): a
 * td_weights, or -1 (the default) for each checkpoint's own. When set,
 * every model loaded from a checkpoint afterwards has its matrices rounded
 * to it (td_model_set_weights; f32 only records), and every decoder
 * created afterwards packs them in it. Thread-safe. */
TD_API void td_weights_set_default(int weights);
TD_API int td_weights_default(void);

/* The format m's matrices hold (a compact checkpoint's when loaded from
 * one); TD_WEIGHTS_F32 otherwise. */
TD_API td_weights td_model_weights(const td_model *m);

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
    {                                                                                              \
        .kind = TD_OPT_SGD, .lr = 0.01, .momentum = 0.9, .nesterov = 0, .beta1 = 0.9,              \
        .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0, .clip_norm = 0.0,                        \
        .schedule = TD_LR_CONSTANT, .warmup_steps = 0, .total_steps = 0, .min_lr = 0.0             \
    }

/* Creates an optimizer over every parameter of m, state on m's device. */
TD_API td_status td_optimizer_create(td_model *m, const td_optimizer_config *cfg,
                                     td_optimizer **out);
TD_API void td_optimizer_destroy(td_optimizer *opt);
/* One update from the current gradients (clipped first when configured);
 * *grad_norm, when not NULL, gets the global norm before clipping. */
TD_API td_status td_optimizer_step(td_optimizer *opt, double *grad_norm);
/* Updates parameters [first, first + count) with the step under way, from
 * their gradients as they are now, so that a model's backward can update
 * each layer as soon as its gradients are final (td_model_set_grad_hook),
 * while the cache still holds them and, on a CPU shared with other devices,
 * while the others compute rather than all streaming state at once. The
 * step ends with td_optimizer_step, which updates the parameters not updated
 * yet; the weights are bitwise those of td_optimizer_step alone. A
 * parameter is updated once per step however often it is named. Refused
 * with clipping, which needs the whole gradient's norm first. */
TD_API td_status td_optimizer_step_params(td_optimizer *opt, size_t first, size_t count);

/* ZeRO-1: an optimizer that keeps state for, and updates, only shard `rank`
 * of `size` of every parameter: with c = numel / size, elements
 * [rank * c, rank * c + c), plus the numel % size elements at the end, which
 * every shard keeps and updates alike. Its state tensors are 1-D (c + that
 * tail), named as the whole optimizer's; a checkpoint refuses it and takes
 * the whole state (td_dp_gather_optimizer). Clipping needs the norm of the whole
 * gradient: `reduce`, when set, sums every shard's sum of squares (each
 * shard counts its own elements, and the tail only in shard 0). It gets
 * *sumsq as the sum of `terms` (n = 2 * parameters: each parameter's shard,
 * then its tail; 0 where not counted), added in that order, and returns
 * the whole gradient's. */
typedef td_status (*td_sumsq_reduce_fn)(void *arg, const double *terms, size_t n, double *sumsq);
TD_API td_status td_optimizer_create_shard(td_model *m, const td_optimizer_config *cfg, int rank,
                                           int size, td_optimizer **out);
TD_API void td_optimizer_set_sumsq_reduce(td_optimizer *opt, td_sumsq_reduce_fn reduce, void *arg);
/* For a shard's optimizer (td_model_load_shard): with skip set, the sum of
 * squares it computes before `reduce` leaves out the parameters the shard
 * holds whole, which every shard holds alike and one of them counts. */
TD_API void td_optimizer_set_sumsq_skip_replicated(td_optimizer *opt, int skip);
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
