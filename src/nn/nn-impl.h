/* The inside of the nn layer: layers, the model that holds them, and the
 * planner that carves every activation out of one allocation per batch size.
 *
 * A layer sees activations with the batch first: x (n, in...) -> out (n,
 * out...). Its out and dout are views into the model's arena, re-carved when
 * the batch size changes, so a training step allocates nothing. Containers
 * ("sequential", "residual") hold children; a sequential's out and dout are
 * its last child's. Everything here runs on the model's device thread.
 *
 * Every model is a part: top-level layers [part_first, part_end) of the
 * model its JSON describes (a whole model is [0, layer count)). The whole
 * tree is built, the layers outside the range "dry": they count their
 * parameters (param_serial, serial_weights) so that names, initial values
 * and dropout streams are the whole model's, but create no tensors, and are
 * then dropped from the root. td_model_describe builds everything dry, with
 * no device. A part keeps `nslots` arenas; the layer views point into one
 * of them (cur_slot) at a time and are re-carved when the slot or the batch
 * size changes. */
#ifndef TD_NN_IMPL_H
#define TD_NN_IMPL_H

#include <jansson.h>

#include "device/buffer.h" /* td_buffer views held by value */
#include "tandem/nn.h"
#include "tensor/ops.h"

#define TD_LAYER_MAX_PARAMS 4
#define TD_LAYER_MAX_WS     10

typedef struct td_layer td_layer;
typedef struct td_nn_plan td_nn_plan;

/* A layer's part in a tensor-parallel shard (shard.c). */
typedef enum td__split_kind {
    TD__SPLIT_NONE = 0, /* whole: replicated on every shard */
    TD__SPLIT_OUT,      /* the first linear of a pair: output features [first, first + count) */
    TD__SPLIT_MID,      /* an activation or dropout inside a pair: those features */
    TD__SPLIT_IN,       /* the second linear: those input features; its output is partial */
    TD__SPLIT_HEADS,    /* attention: heads [first, first + count) of total */
    TD__SPLIT_GATED,    /* a SwiGLU MLP: those hidden features; its output is partial */
} td__split_kind;

typedef struct td__split {
    td__split_kind kind;
    int unit;                    /* the splittable unit it belongs to */
    int64_t first, count, total; /* features or heads */
} td__split;

/* What one forward or backward pass knows. */
typedef struct td_nn_run {
    td_model *model;
    int train;               /* dropout on */
    int acc;                 /* add parameter gradients to what is there */
    int defer;               /* backward leaves the weight gradients to vt->weights */
    uint64_t dropout_seed;   /* stream for this step; each layer mixes in its id */
    int64_t first_sample;    /* the pass's first sample's place in the whole batch */
    const td_buffer *tokens; /* (n, t) int32 for token models */
} td_nn_run;

typedef struct td_layer_vt {
    const char *type;
    /* Carves out, dout and workspace for batch n from p; x is the input view
     * (already carved). */
    td_status (*plan)(td_layer *l, td_nn_plan *p, const td_tensor *x);
    td_status (*forward)(td_layer *l, const td_tensor *x, td_nn_run *r);
    /* Reads l->dout; writes dx (NULL: not needed) and the parameter gradients. */
    td_status (*backward)(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r);
    /* The weight gradients a backward with r->defer left out (NULL: it left
     * none), from the x and l->dout that backward saw, still in the slot:
     * so that a pipeline stage sends its input's gradient on before the
     * GEMMs whose result only it needs. */
    td_status (*weights)(td_layer *l, const td_tensor *x, td_nn_run *r);
} td_layer_vt;

struct td_layer {
    const td_layer_vt *vt;
    char type[16]; /* as in the JSON: "relu", "maxpool", ... */
    char *path;    /* "layers.3" or "layers.3.1": parameter name prefix (owned) */
    int uid;       /* distinct per layer, for dropout streams */
    /* Per-sample shapes. */
    int in_ndim, out_ndim;
    int64_t in_shape[TD_MAX_DIMS], out_shape[TD_MAX_DIMS];

    size_t first_param;  /* index in the model's (or part's) parameter list */
    size_t first_serial; /* index in the whole model's parameter list */
    size_t weights;      /* scalar parameters, children's included */
    int nparams;         /* held: 0 for a dry layer */
    td_tensor *param[TD_LAYER_MAX_PARAMS], *grad[TD_LAYER_MAX_PARAMS];

    td_tensor out, dout;           /* (n, out...) views into the arena */
    td_tensor ws[TD_LAYER_MAX_WS]; /* layer-specific workspace views */
    td_buffer iws;                 /* int32 workspace view (max-pool arg-max) */

    /* Configuration by type. */
    int64_t out_features; /* linear */
    int has_bias;
    td_act act;
    double p;   /* dropout */
    double eps; /* layer norm */
    td_conv_desc conv;
    td_pool_kind pool;
    int64_t heads, vocab;
    /* attention: key and value heads (heads, or fewer for grouped-query
     * attention); whether the output projection has a bias (has_bias: q, k
     * and v's); rotary positions' (2, T, head width / 2) cos and sin table
     * (owned; NULL: none) */
    int64_t kv_heads;
    int proj_bias;
    td_tensor *rope;
    int64_t hidden; /* swiglu: the gate's features */
    int fused;      /* attention: the backend's fused kernels, chosen at planning */
    int positions;
    /* linear: its weight is the embedding's table (param[0], grad[0] borrowed);
     * embedding: such a linear adds its gradient to the table's first */
    int tied;
    td__split split; /* in a shard: its slice (TD__SPLIT_NONE elsewhere) */

    /* Containers. */
    td_layer **children;
    int nchildren;
};

/* One set of activations of a part: an arena, and what the micro-batch in it
 * needs between its forward and its backward. */
typedef struct td_nn_slot {
    td_tensor *arena;  /* dtype elements */
    td_buffer *iarena; /* int32 elements */
    int64_t cap_n;     /* the arena fits batches of up to cap_n samples */
    int cap_infer;     /* ... sized for inference only (td__model_prepare) */
    int64_t n;         /* samples of the last forward */
    int forward_done, backward_done, train;
    int weights_owed, accumulate; /* a backward left its weight gradients for later */
    uint64_t dropout_seed;
    int64_t first_sample;
    td_buffer out, in_grad; /* views handed out by td_model_part_output, _input_grad */
} td_nn_slot;

struct td_model {
    td_device *dev; /* NULL while describing */
    td_dtype dtype;
    td_weights weights; /* the format its matrices were rounded to (compact.c) */
    uint64_t seed;
    char *json;
    td_input_kind kind;
    int in_ndim;
    int64_t in_shape[TD_MAX_DIMS];
    int64_t classes;
    const char *file; /* while building: the file's name, for messages */
    td_layer *root;   /* a sequential of top-level layers [part_first, part_end) */
    int nlayers_made;
    td_model_info info; /* the whole model's */

    /* The part, and how it is being built. */
    int part_first, part_end;
    size_t part_first_param; /* the whole model's index of this part's parameter 0 */
    int dry;                 /* building a layer outside the part: no tensors */
    int build_top;           /* the next sequential built is the root */
    size_t param_serial;     /* parameters made so far, dry ones included */
    size_t serial_weights;   /* their scalars */
    /* The embedding built so far, for a tied linear (layers_build.c): its
     * table's shape (0: none yet), and the layer when it is in the part. */
    int64_t embed_vocab, embed_dim;
    td_layer *embed;

    size_t nparams, cap_params;
    td_tensor **params, **grads;
    char **names;

    td_grad_ready_fn hook;
    void *hook_arg;

    /* A tensor-parallel shard (shard.c): each layer's split by uid, each
     * parameter's place in the whole one (cap_params entries), and the hook
     * that sums partial activations across the shards. */
    td__split *splits; /* NULL: not a shard */
    int nsplits;
    td_param_slice *slices;
    td_reduce_fn reduce;
    void *reduce_arg;
    /* A band model (band.c): its head runs on one band of every image; NULL:
     * not one. */
    struct td__bands *bands;

    /* Activations: the views are carved for planned_n samples in slot cur_slot
     * (-1: none). */
    td_nn_slot *slots;
    int nslots, cur_slot;
    int64_t planned_n;
    int planned_infer; /* the views were carved for inference only */
    td_tensor input;   /* (n, in...) view: features, or a later part's input */
    td_tensor in_grad; /* (n, in...) view: a later part's input gradient */
    td_buffer tokens;  /* (n, t) int32 view, the part with the embedding */
    td_buffer labels;  /* (n) or (n, t) int32 view, the part with the loss */
    void *host_tmp;    /* f64 conversion of inputs */
    size_t host_tmp_n;

    /* The training step recorded as a device graph (model.c), replayed while
     * the batch size, gradient scale, accumulate flag and arena stay those it
     * was recorded with. graph_off: never (no backend support, a dropout
     * layer, a failed recording). The replayed cross-entropy writes its sums
     * to graph_loss and graph_correct. */
    struct td_graph *graph;
    int graph_off, graph_checked;
    int64_t graph_n, graph_cap;
    double graph_scale;
    int graph_acc;
    double graph_loss;
    int64_t graph_correct;
    uint64_t graph_replays; /* steps run by replaying (tests read it) */
    /* When the pass's current stretch of compute began: its start, or the
     * end of the shard's last reduction (a slowed device is slowed per
     * stretch, td__model_reduce). */
    uint64_t stretch_start;
};

/* The planner: a dry pass counts, a second carves views. */
struct td_nn_plan {
    td_device *dev;
    int64_t n;
    int dry;
    int infer;          /* inference only: siblings share banks (td__model_prepare) */
    size_t used, iused; /* elements */
    td_tensor *base;
    td_buffer *ibase;
};

#define PLAN_ALIGN 16 /* elements: 64 bytes in f32 */

/* Carves a (n, shape...) view (batch dim prepended when batched). */
td_status td__plan_tensor(td_nn_plan *p, td_tensor *view, int batched, int ndim,
                          const int64_t *shape);
td_status td__plan_ints(td_nn_plan *p, td_buffer *view, size_t count);

/* Layers (layers.c, built in layers_build.c) ---------------------------------- */

/* The weight gradients a deferred backward left to child i of sequential
 * l, from the input x of l (the pass's views carved). */
td_status td__seq_child_weights(td_layer *l, int i, const td_tensor *x, td_nn_run *r);

extern const td_layer_vt td__linear_vt, td__act_vt, td__dropout_vt, td__flatten_vt,
    td__layernorm_vt, td__embedding_vt, td__attention_vt, td__conv2d_vt, td__pool_vt,
    td__sequential_vt, td__residual_vt;
/* The Llama family's (layers_llama.c). */
extern const td_layer_vt td__rmsnorm_vt, td__swiglu_vt;

/* Refuses (TD_ERR_PARSE naming the file and the JSON path) a layer list
 * that expands to more than TD_MODEL_MAX_LAYERS layers or nests residual
 * and repeat blocks more than TD_MODEL_MAX_DEPTH deep, before anything is
 * built. Malformed specs are left to the builder to report. */
td_status td__layers_check_size(const char *file, json_t *arr);
/* Builds the layer described by `spec` at JSON path `where` for per-sample
 * input shape in[0..in_ndim), appending its parameters to m. On failure the
 * message names file (m's name), `where` and the field. */
td_status td__layer_build(td_model *m, const char *file, json_t *spec, const char *where,
                          const char *path, int in_ndim, const int64_t *in_shape, td_layer **out);
/* A sequential over a JSON array of layer specs (repeat blocks expanded). */
td_status td__layer_build_seq(td_model *m, const char *file, json_t *arr, const char *where,
                              const char *path, int in_ndim, const int64_t *in_shape,
                              td_layer **out);
void td__layer_destroy(td_layer *l);

/* Tests set this to run attention through gemm_batched and causal_softmax_*
 * even where the backend has the fused kernels. */
extern int td__nn_generic_attention;

/* Registers a parameter of l (created on m's device) named "<path>.<name>".
 * While m->dry it only counts it and *param is NULL: the init helpers skip
 * NULL parameters. */
td_status td__model_add_param(td_model *m, td_layer *l, const char *name, int ndim,
                              const int64_t *shape, td_tensor **param);

/* Elements of a per-sample shape or a parameter, or -1 when the product
 * exceeds TD_MODEL_MAX_TENSOR (overflow included). */
int64_t td__nn_numel(const int64_t *shape, int ndim);

/* SplitMix64's finaliser: parameter init streams, dropout seeds. */
uint64_t td__nn_mix64(uint64_t x);

/* Models (model.c) ---------------------------------------------------------- */

/* Makes slot's arena fit n samples and carves the views onto it. On the
 * device's thread. For inference only (a decoder's passes), a layer list's
 * children take turns in two banks of the arena (seq_plan): a child's
 * activations live until the next child has read them, so the passes
 * touch a few layers' memory, not every layer's. */
td_status td__model_prepare(td_model *m, int slot, int64_t n, int infer);
/* Writes b's inputs (x or tokens: when `inputs`) and labels (when `labels`)
 * into the carved views. */
td_status td__model_load_batch(td_model *m, const td_batch *b, int inputs, int labels);
size_t td__model_labels_per_sample(const td_model *m);
/* The step's dropout seed, as every strategy draws it. */
uint64_t td__model_dropout_seed(const td_model *m, uint64_t dropout_step);

/* Loading (describe.c) ------------------------------------------------------ */

/* Builds the part [first, end) of the model in json (end < 0: to the last
 * layer) with `slots` activation slots on dev; dev NULL builds everything dry
 * (describing). splits (NULL: none) makes a shard: splits[uid] for the layer
 * built uid-th, nsplits of them (copied). Errors as td_model_load's; on
 * failure *out is NULL. */
td_status td__model_build(const char *json, const char *name, td_device *dev, td_dtype dtype,
                          uint64_t seed, int first, int end, int slots, const td__split *splits,
                          int nsplits, td_model **out);

/* Bands (band.c) --------------------------------------------------------------- */

/* The forward (the loss included) and, with r->train, the backward of a band
 * model over its loaded input and labels: the head on bands, the rest whole. */
td_status td__band_passes(td_model *m, td_nn_run *r, double grad_scale, double *loss_sum,
                          int64_t *correct);
/* NULL-safe. */
void td__bands_free(struct td__bands *b);
/* Carves a band model's views: of its head only the last layer's output
 * and its gradient, whole (the gather's destination, the rest's input); the
 * head's bands have buffers of their own. */
td_status td__band_plan(td_model *m, td_nn_plan *p);

/* Shards (shard.c) ------------------------------------------------------------- */

/* Registers a parameter whose whole shape is whole[0..ndim), of which the
 * model holds the slice `slice` describes (dim < 0: all), initialised as the
 * whole parameter would be: uniform in [-bound, bound] (normal 0, bound when
 * normal), each element from its place in the whole tensor. */
td_status td__model_add_slice(td_model *m, td_layer *l, const char *name, int ndim,
                              const int64_t *whole, int dim, int blocks, int64_t first,
                              int64_t count, int normal, double bound, td_tensor **param);
/* The same for any slice (its shape the whole one), grouped ones included. */
td_status td__model_add_param_slice(td_model *m, td_layer *l, const char *name,
                                    const td_param_slice *slice, int normal, double bound,
                                    td_tensor **param);
/* The squared norm of the gradient elements of parameter i a lower shard
 * holds too (td_param_slice.kv_shared); 0 for the rest. */
td_status td__slice_shared_sumsq(const td_model *m, size_t i, double *out);
/* Along its dim, block b of a slice: the whole tensor's [*at, *at + *count). */
void td__slice_block(const td_param_slice *s, int b, int64_t *at, int64_t *count);
/* An attention layer's query heads here (all, or a shard's) and the key and
 * value heads they read (layers.c). */
td_kv_map td__att_map(const td_layer *l);
/* Sums t across the shards through the model's reduce hook (nothing without one). */
td_status td__model_reduce(td_model *m, td_tensor *t);
/* Calls the model's gradient hook (nothing without one) for parameters
 * [first, first + count), whose gradients are final. */
void td__model_grads_ready(td_model *m, size_t first, size_t count);
/* Frees m's gradients, for a model that only ever runs forward (a
 * decoder's); training it afterwards is a bug. */
void td__model_release_grads(td_model *m);
/* Zeros t (a view) on the device's thread. */
td_status td__zero(td_tensor *t);

/* A decoder's weight matrices packed in a compact format on the model's
 * device (compact.c). td__packed_create packs m's matrices in the format
 * td_weights_set_default chose, else m's own (td_model_weights),
 * rounding m's values to it first; *out stays NULL for f32. */
typedef struct td__packed_set td__packed_set;
td_status td__packed_create(td_model *m, td__packed_set **out);
void td__packed_destroy(td__packed_set *s); /* NULL-safe */
td_weights td__packed_format(const td__packed_set *s);
size_t td__packed_bytes(const td__packed_set *s);
/* y (n, r) = x (n, c) W^T for W rows [first_row, first_row + r) of l's
 * param k: from its packed copy when s holds one, else from w (f32). */
td_status td__packed_matmul(const td__packed_set *s, const td_layer *l, int k, int64_t first_row,
                            td_tensor *y, const td_tensor *x, const td_tensor *w);
/* Frees the f32 copies of the matrices s packed: a decoder that owns its
 * model reads only the packed ones (td__packed_embed for a tied table). */
void td__packed_release_f32(td__packed_set *s);
/* y (1, n, c) = rows tokens[0, n) of table, from the packed copy s holds
 * of it (a tied head's); TD_ERR_UNSUPPORTED when it holds none. */
td_status td__packed_embed(const td__packed_set *s, const td_tensor *table, const td_buffer *tokens,
                           int64_t n, td_tensor *y);

/* After loading m from a checkpoint: its matrices rounded to the process's
 * default format (td_weights_set_default), if one is set. */
td_status td__model_take_default_weights(td_model *m);

/* *flags (malloc'ed, one per parameter of m) gets 1 for the weight
 * matrices a compact format holds (compact.c), 0 for the others. */
td_status td__model_matrix_flags(td_model *m, unsigned char **flags);

/* A decoder's key/value caches (decode_kv.c): natt of (ctx, row) in the
 * model's dtype, or in f16/bf16, as td_decoder_set_default_kv_cache chose
 * when created; heads is the most query heads of a layer. add gives cache
 * i's row width (0: no heads here); finish allocates. A pass computes its
 * rows [pos, pos + n) of layer i into raw, as rows gives it (the cache's
 * own rows, or the first rows of ws, the layer's (1, T, >= row) f32
 * workspace), then sync stores them (nothing for the model's dtype). A
 * step (pos > 0, raw's one row) then attends: yh (1, 1, h d) from q in raw
 * and the cached keys and values [0, pos]. */
typedef struct td__kv_cache td__kv_cache;
td_status td__kv_cache_create(td_model *m, int natt, int64_t ctx, int64_t heads,
                              td__kv_cache **out);
void td__kv_cache_add(td__kv_cache *c, int i, int64_t row);
td_status td__kv_cache_finish(td__kv_cache *c);
int64_t td__kv_cache_row(const td__kv_cache *c, int i);
td_status td__kv_cache_rows(const td__kv_cache *c, int i, const td_tensor *ws, int64_t pos,
                            int64_t n, td_tensor *raw);
td_status td__kv_cache_sync(td__kv_cache *c, int i, int64_t pos, int64_t n, td_tensor *raw);
td_status td__kv_cache_attend(const td__kv_cache *c, int i, td_kv_map m, int64_t d, int64_t pos,
                              const td_tensor *raw, td_tensor *yh);
size_t td__kv_cache_bytes(const td__kv_cache *c);
void td__kv_cache_destroy(td__kv_cache *c); /* NULL-safe */

#endif
