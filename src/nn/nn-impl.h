/* The inside of the nn layer: layers, the model that holds them, and the
 * planner that carves every activation out of one allocation per batch size.
 *
 * A layer sees activations with the batch first: x (n, in...) -> out (n,
 * out...). Its out and dout are views into the model's arena, re-carved when
 * the batch size changes, so a training step allocates nothing. Containers
 * ("sequential", "residual") hold children; a sequential's out and dout are
 * its last child's. Everything here runs on the model's device thread. */
#ifndef TD_NN_IMPL_H
#define TD_NN_IMPL_H

#include <jansson.h>

#include "tandem/nn.h"
#include "tensor/ops.h"

#define TD_LAYER_MAX_PARAMS 4
#define TD_LAYER_MAX_WS     6

typedef struct td_layer td_layer;
typedef struct td_nn_plan td_nn_plan;

/* What one forward or backward pass knows. */
typedef struct td_nn_run {
    td_model *model;
    int train;               /* dropout on */
    int acc;                 /* add parameter gradients to what is there */
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
} td_layer_vt;

struct td_layer {
    const td_layer_vt *vt;
    char path[64]; /* "layers.3" or "layers.3.1": parameter name prefix */
    int uid;       /* distinct per layer, for dropout streams */
    /* Per-sample shapes. */
    int in_ndim, out_ndim;
    int64_t in_shape[TD_MAX_DIMS], out_shape[TD_MAX_DIMS];

    size_t first_param; /* index in the model's parameter list */
    int nparams;
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
    int fused; /* attention: the backend's fused kernels, chosen at planning */
    int positions;

    /* Containers. */
    td_layer **children;
    int nchildren;
};

struct td_model {
    td_device *dev;
    td_dtype dtype;
    uint64_t seed;
    char *json;
    td_input_kind kind;
    int in_ndim;
    int64_t in_shape[TD_MAX_DIMS];
    int64_t classes;
    td_layer *root; /* a sequential */
    int nlayers_made;

    size_t nparams, cap_params;
    td_tensor **params, **grads;
    char **names;

    td_grad_ready_fn hook;
    void *hook_arg;

    /* Activations for batches of up to cap_n samples. */
    int64_t cap_n, planned_n;
    td_tensor *arena;  /* dtype elements */
    td_buffer *iarena; /* int32 elements */
    td_tensor input;   /* (n, in...) view, features models */
    td_buffer tokens;  /* (n, t) int32 view */
    td_buffer labels;  /* (n) or (n, t) int32 view */
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
};

/* The planner: a dry pass counts, a second carves views. */
struct td_nn_plan {
    td_device *dev;
    int64_t n;
    int dry;
    size_t used, iused; /* elements */
    td_tensor *base;
    td_buffer *ibase;
};

/* Carves a (n, shape...) view (batch dim prepended when batched). */
td_status td__plan_tensor(td_nn_plan *p, td_tensor *view, int batched, int ndim,
                          const int64_t *shape);
td_status td__plan_ints(td_nn_plan *p, td_buffer *view, size_t count);

/* Layers (layers.c) -------------------------------------------------------- */

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

/* Registers a parameter of l (created on m's device) named "<path>.<name>". */
td_status td__model_add_param(td_model *m, td_layer *l, const char *name, int ndim,
                              const int64_t *shape, td_tensor **param);

#endif
