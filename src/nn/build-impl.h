/* Building layers from JSON: the context a layer type's builder gets, and
 * the readers of a spec's fields (spec.c), each checked, whose messages
 * name the file, the layer's place and the field. For layers_build.c. */
#ifndef TD_NN_BUILD_IMPL_H
#define TD_NN_BUILD_IMPL_H

#include "nn/nn-impl.h"

typedef struct build_ctx build_ctx;

/* Builds one family of layer types: checks the spec's fields and the input
 * shape (in_ndim, in), sets the layer's vt, output shape (the input's unless
 * it changes it) and parameters. variant tells apart the types one function
 * builds: a td_act for the activations, a td_pool_kind for the pools. */
typedef td_status (*build_fn)(build_ctx *b, td_layer *l, int variant, int in_ndim,
                              const int64_t *in);

/* A row of layer_kinds (layers_build.c): a container holds other layers, which own
 * the parameters; repeat is no layer of its own, as seq_fill expands it in
 * place. */
typedef struct layer_kind {
    const char *type;
    build_fn build; /* NULL: repeat, never built here */
    int variant;
    int container;
} layer_kind;

struct build_ctx {
    td_model *m;
    const char *file;
    json_t *spec;
    const char *where;
    const layer_kind *kind; /* the layer's type; NULL building a repeat block */
};

td_status td__spec_error(const build_ctx *b, const char *field, const char *what);
/* An integer field in [min, max]; `def` when absent and not required. */
td_status td__spec_int(const build_ctx *b, const char *key, int required, int64_t def, int64_t min,
                       int64_t max, int64_t *out);
/* A number in [lo, hi] ([lo, hi) with hi_open); `def` when absent. */
td_status td__spec_real(const build_ctx *b, const char *key, double def, double lo, double hi,
                        int hi_open, double *out);
td_status td__spec_bool(const build_ctx *b, const char *key, int def, int *out);
/* Every key of the spec must be in the NULL-terminated list. */
td_status td__spec_keys(const build_ctx *b, const char *const *allowed);

/* A layer given an input of the wrong shape: "<file>: <where>: <type> needs
 * <need> input, got <shape>". */
td_status td__build_shape_error(const build_ctx *b, const char *need, int in_ndim,
                                const int64_t *in);

/* The builders of layers_build_llama.c. */
td_status td__build_attention(build_ctx *b, td_layer *l, int variant, int in_ndim,
                              const int64_t *in);
td_status td__build_rmsnorm(build_ctx *b, td_layer *l, int variant, int in_ndim, const int64_t *in);
td_status td__build_swiglu(build_ctx *b, td_layer *l, int variant, int in_ndim, const int64_t *in);

#endif
