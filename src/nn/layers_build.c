/* Building layers from their JSON specs: checking every field, shapes, and
 * creating and initialising the parameters (with a shard's slices: shard.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "nn/build-impl.h"
#include "nn/nn-impl.h"

/* Building from JSON --------------------------------------------------------------------- */

/* gelu's "approximate", as torch.nn.GELU's: "none" (erf, the default) or
 * "tanh" (GPT-2's). */
static td_status get_gelu_kind(const build_ctx *b, td_act *act) {
    json_t *v = json_object_get(b->spec, "approximate");
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (!v || (s && !strcmp(s, "none"))) {
        *act = TD_ACT_GELU;
        return TD_OK;
    }
    if (s && !strcmp(s, "tanh")) {
        *act = TD_ACT_GELU_TANH;
        return TD_OK;
    }
    return td__spec_error(b, "approximate", "expected \"none\" or \"tanh\"");
}

td_status td__build_shape_error(const build_ctx *b, const char *need, int in_ndim,
                                const int64_t *in_shape) {
    char s[64];
    return td__error(TD_ERR_PARSE, "%s: %s: %s needs %s input, got %s", b->file, b->where,
                     b->kind->type, need, td__shape_text(in_shape, in_ndim, s));
}

/* The stream of the parameter made last: its place in the whole model, so
 * that a part starts from the whole model's values. */
static uint64_t init_stream(const td_model *m) {
    return td__nn_mix64(m->seed ^ td__nn_mix64((uint64_t)m->param_serial - 1));
}

static td_status init_uniform_fan_in(td_model *m, td_tensor *t, int64_t fan_in) {
    double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
    if (!t) /* dry */
        return TD_OK;
    /* kaiming_uniform(a = sqrt 5) gives the same bound as the bias: 1 / sqrt(fan_in). */
    return td_tensor_rand_uniform(t, init_stream(m), 0, -bound, bound);
}

static td_status add_uniform_param(td_model *m, td_layer *l, const char *name, int ndim,
                                   const int64_t *shape, int64_t fan_in, td_tensor **p) {
    TD_CHECK(td__model_add_param(m, l, name, ndim, shape, p));
    return init_uniform_fan_in(m, *p, fan_in);
}

/* The convolution unfolds an image into (c kh kw, oh ow) columns: one tensor. */
static int unfolded_fits(const td_conv_desc *d) {
    int64_t cols[5] = {d->c, d->kh, d->kw, d->oh, d->ow};
    return td__nn_numel(cols, 5) >= 0;
}

/* A linear whose weight is the embedding's table (vocab, dim), as GPT-2's
 * head: no weight of its own, so checkpoints and optimizers see the table
 * once, and its gradient is added to the embedding's (layers.c). The
 * embedding must come before it and lie in the same part. */
static td_status build_tied(build_ctx *b, td_layer *l, int64_t in) {
    td_model *m = b->m;
    char msg[160];
    if (!m->embed_vocab)
        return td__spec_error(b, "tied", "needs the model's embedding before this layer");
    if (l->out_features != m->embed_vocab || in != m->embed_dim) {
        snprintf(msg, sizeof msg,
                 "a tied linear maps the embedding's %lld channels to its %lld tokens; here "
                 "%lld to %lld",
                 (long long)m->embed_dim, (long long)m->embed_vocab, (long long)in,
                 (long long)l->out_features);
        return td__spec_error(b, "tied", msg);
    }
    l->tied = 1;
    if (m->dry)
        return TD_OK;
    if (!m->embed)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: %s.tied: the embedding whose table this layer uses lies in another "
                         "part (pipeline stage); tied weights need both in one part",
                         b->file, b->where);
    m->embed->tied = 1;
    l->param[0] = m->embed->param[0];
    return TD_OK;
}

/* One build_fn per family of layer types, found by name in layer_kinds. */

static td_status build_linear(build_ctx *b, td_layer *l, int variant, int in_ndim,
                              const int64_t *in) {
    static const char *const keys[] = {"type", "out", "bias", "tied", NULL};
    td_model *m = b->m;
    int64_t w[2];
    const td__split *sp;
    int wdim, tied;
    double bound;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_int(b, "out", 1, 0, 1, 1 << 24, &l->out_features));
    TD_CHECK(td__spec_bool(b, "bias", 1, &l->has_bias));
    TD_CHECK(td__spec_bool(b, "tied", 0, &tied));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__linear_vt;
    if (tied) {
        TD_CHECK(build_tied(b, l, in[in_ndim - 1]));
        l->out_shape[in_ndim - 1] = l->out_features;
        return l->has_bias ? add_uniform_param(m, l, "bias", 1, &l->out_features, in[in_ndim - 1],
                                               &l->param[1])
                           : TD_OK;
    }
    /* A shard's pair: the first keeps rows (output features), the second
     * columns of the whole weight (out, in); its bias stays whole. */
    sp = &l->split;
    wdim = sp->kind == TD__SPLIT_OUT ? 0 : sp->kind == TD__SPLIT_IN ? 1 : -1;
    w[0] = l->out_features;
    w[1] = sp->kind == TD__SPLIT_IN ? sp->total : in[in_ndim - 1];
    bound = 1.0 / sqrt((double)w[1]);
    TD_CHECK(td__model_add_slice(m, l, "weight", 2, w, wdim, 1, sp->first, sp->count, 0, bound,
                                 &l->param[0]));
    if (l->has_bias)
        TD_CHECK(td__model_add_slice(m, l, "bias", 1, w, wdim == 0 ? 0 : -1, 1, sp->first,
                                     sp->count, 0, bound, &l->param[1]));
    if (sp->kind == TD__SPLIT_OUT)
        l->out_features = sp->count;
    l->out_shape[in_ndim - 1] = l->out_features;
    return TD_OK;
}

/* relu, tanh, sigmoid (variant: the td_act); gelu has its own entry. */
static td_status build_activation(build_ctx *b, td_layer *l, int variant, int in_ndim,
                                  const int64_t *in) {
    static const char *const keys[] = {"type", NULL};
    TD_CHECK(td__spec_keys(b, keys));
    l->vt = &td__act_vt;
    l->act = (td_act)variant;
    return TD_OK;
}

static td_status build_gelu(build_ctx *b, td_layer *l, int variant, int in_ndim,
                            const int64_t *in) {
    static const char *const keys[] = {"type", "approximate", NULL};
    TD_CHECK(td__spec_keys(b, keys));
    l->vt = &td__act_vt;
    l->act = TD_ACT_GELU;
    return get_gelu_kind(b, &l->act);
}

static td_status build_dropout(build_ctx *b, td_layer *l, int variant, int in_ndim,
                               const int64_t *in) {
    static const char *const keys[] = {"type", "p", NULL};
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_real(b, "p", 0.5, 0.0, 1.0, 1, &l->p));
    l->vt = &td__dropout_vt;
    return TD_OK;
}

static td_status build_flatten(build_ctx *b, td_layer *l, int variant, int in_ndim,
                               const int64_t *in) {
    static const char *const keys[] = {"type", NULL};
    TD_CHECK(td__spec_keys(b, keys));
    l->vt = &td__flatten_vt;
    l->out_ndim = 1;
    /* within the cap: the input was checked when it was made */
    l->out_shape[0] = td__nn_numel(in, in_ndim);
    return TD_OK;
}

static td_status build_layernorm(build_ctx *b, td_layer *l, int variant, int in_ndim,
                                 const int64_t *in) {
    static const char *const keys[] = {"type", "eps", NULL};
    td_model *m = b->m;
    int64_t c;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_real(b, "eps", 1e-5, 0.0, 1.0, 0, &l->eps));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__layernorm_vt;
    c = in[in_ndim - 1];
    TD_CHECK(td__model_add_param(m, l, "weight", 1, &c, &l->param[0]));
    if (l->param[0])
        TD_CHECK(td_tensor_fill(l->param[0], 1.0));
    TD_CHECK(td__model_add_param(m, l, "bias", 1, &c, &l->param[1]));
    return l->param[1] ? td_tensor_fill(l->param[1], 0.0) : TD_OK;
}

static td_status build_embedding(build_ctx *b, td_layer *l, int variant, int in_ndim,
                                 const int64_t *in) {
    static const char *const keys[] = {"type", "vocab", "dim", "positions", NULL};
    td_model *m = b->m;
    int64_t dim, s[2];
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_int(b, "vocab", 1, 0, 1, 1 << 24, &l->vocab));
    TD_CHECK(td__spec_int(b, "dim", 1, 0, 1, 1 << 20, &dim));
    TD_CHECK(td__spec_bool(b, "positions", 1, &l->positions));
    if (m->kind != TD_INPUT_TOKENS || in_ndim != 1 || m->param_serial != 0)
        return td__build_shape_error(b, "the model's tokens as", in_ndim, in);
    if (m->classes > 0 && l->vocab != m->classes)
        return td__spec_error(b, "vocab", "differs from input.vocab");
    l->vt = &td__embedding_vt;
    l->out_ndim = 2;
    l->out_shape[0] = in[0];
    l->out_shape[1] = dim;
    s[0] = l->vocab;
    s[1] = dim;
    TD_CHECK(td__model_add_param(m, l, "wte.weight", 2, s, &l->param[0]));
    if (l->param[0])
        TD_CHECK(td_tensor_rand_normal(l->param[0], init_stream(m), 0, 0.0, 1.0));
    /* for a tied head further on */
    m->embed_vocab = l->vocab;
    m->embed_dim = dim;
    m->embed = l->param[0] ? l : NULL;
    if (l->positions) {
        s[0] = in[0];
        TD_CHECK(td__model_add_param(m, l, "wpe.weight", 2, s, &l->param[1]));
        if (l->param[1])
            TD_CHECK(td_tensor_rand_normal(l->param[1], init_stream(m), 0, 0.0, 1.0));
    }
    return TD_OK;
}

/* A square window over (channels, height, width), for conv2d and the pools:
 * the input, "kernel", "stride" (default_stride, or the kernel when 0) and
 * "padding" into l->conv. */
static td_status read_window(build_ctx *b, td_layer *l, int64_t default_stride, int in_ndim,
                             const int64_t *in) {
    td_conv_desc *d = &l->conv;
    if (in_ndim != 3)
        return td__build_shape_error(b, "(channels, height, width)", in_ndim, in);
    d->c = in[0];
    d->h = in[1];
    d->w = in[2];
    TD_CHECK(td__spec_int(b, "kernel", 1, 0, 1, 1024, &d->kh));
    d->kw = d->kh;
    TD_CHECK(
        td__spec_int(b, "stride", 0, default_stride ? default_stride : d->kh, 1, 1024, &d->stride));
    return td__spec_int(b, "padding", 0, 0, 0, 1024, &d->pad);
}

/* The window's output size (oc, oh, ow), once d->oc is known. */
static td_status window_output(build_ctx *b, td_layer *l) {
    td_conv_desc *d = &l->conv;
    if (d->h + 2 * d->pad < d->kh || d->w + 2 * d->pad < d->kw)
        return td__spec_error(b, "kernel", "larger than the padded input");
    d->oh = (d->h + 2 * d->pad - d->kh) / d->stride + 1;
    d->ow = (d->w + 2 * d->pad - d->kw) / d->stride + 1;
    l->out_shape[0] = d->oc;
    l->out_shape[1] = d->oh;
    l->out_shape[2] = d->ow;
    return TD_OK;
}

static td_status build_conv2d(build_ctx *b, td_layer *l, int variant, int in_ndim,
                              const int64_t *in) {
    static const char *const keys[] = {"type", "out", "kernel", "stride", "padding", "bias", NULL};
    td_model *m = b->m;
    td_conv_desc *d = &l->conv;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(read_window(b, l, 1, in_ndim, in));
    TD_CHECK(td__spec_int(b, "out", 1, 0, 1, 1 << 20, &d->oc));
    TD_CHECK(td__spec_bool(b, "bias", 1, &l->has_bias));
    TD_CHECK(window_output(b, l));
    if (!unfolded_fits(d))
        return td__spec_error(b, "kernel",
                              "the unfolded input (channels x kernel^2 x output pixels) is "
                              "more than a tensor may hold");
    int64_t w[4] = {d->oc, d->c, d->kh, d->kw};
    l->vt = &td__conv2d_vt;
    TD_CHECK(add_uniform_param(m, l, "weight", 4, w, d->c * d->kh * d->kw, &l->param[0]));
    if (l->has_bias)
        TD_CHECK(add_uniform_param(m, l, "bias", 1, w, d->c * d->kh * d->kw, &l->param[1]));
    return TD_OK;
}

/* maxpool and avgpool (variant: the td_pool_kind); stride defaults to the kernel. */
static td_status build_pool(build_ctx *b, td_layer *l, int variant, int in_ndim,
                            const int64_t *in) {
    static const char *const keys[] = {"type", "kernel", "stride", "padding", NULL};
    td_conv_desc *d = &l->conv;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(read_window(b, l, 0, in_ndim, in));
    d->oc = d->c;
    if (2 * d->pad > d->kh)
        return td__spec_error(b, "padding", "must be at most half the kernel");
    TD_CHECK(window_output(b, l));
    l->vt = &td__pool_vt;
    l->pool = (td_pool_kind)variant;
    return TD_OK;
}

/* Its "layers" as one sequential child, which must keep the shape. */
static td_status build_residual(build_ctx *b, td_layer *l, int variant, int in_ndim,
                                const int64_t *in) {
    static const char *const keys[] = {"type", "layers", NULL};
    char s1[64], s2[64], w2[256];
    td_layer *inner = NULL;
    TD_CHECK(td__spec_keys(b, keys));
    l->vt = &td__residual_vt;
    snprintf(w2, sizeof w2, "%s.layers", b->where);
    TD_CHECK(td__layer_build_seq(b->m, b->file, json_object_get(b->spec, "layers"), w2, l->path,
                                 in_ndim, in, &inner));
    if (!(l->children = td__calloc(sizeof *l->children, "a residual block"))) {
        td__layer_destroy(inner);
        return TD_ERR_OUT_OF_MEMORY;
    }
    l->children[0] = inner; /* the caller's td__layer_destroy(l) frees it on failure */
    l->nchildren = 1;
    if (inner->out_ndim != in_ndim ||
        memcmp(inner->out_shape, in, sizeof(int64_t) * (size_t)in_ndim) != 0)
        return td__error(TD_ERR_PARSE,
                         "%s: %s: residual: its layers turn %s into %s; they must keep the shape",
                         b->file, b->where, td__shape_text(in, in_ndim, s1),
                         td__shape_text(inner->out_shape, inner->out_ndim, s2));
    return TD_OK;
}

/* The layer types, in the order the error for an unknown one lists them. */
static const layer_kind layer_kinds[] = {
    {.type = "linear", .build = build_linear},
    {.type = "conv2d", .build = build_conv2d},
    {.type = "maxpool", .build = build_pool, .variant = TD_POOL_MAX},
    {.type = "avgpool", .build = build_pool, .variant = TD_POOL_AVG},
    {.type = "relu", .build = build_activation, .variant = TD_ACT_RELU},
    {.type = "gelu", .build = build_gelu},
    {.type = "tanh", .build = build_activation, .variant = TD_ACT_TANH},
    {.type = "sigmoid", .build = build_activation, .variant = TD_ACT_SIGMOID},
    {.type = "dropout", .build = build_dropout},
    {.type = "flatten", .build = build_flatten},
    {.type = "layernorm", .build = build_layernorm},
    {.type = "embedding", .build = build_embedding},
    {.type = "attention", .build = td__build_attention},
    {.type = "rmsnorm", .build = td__build_rmsnorm},
    {.type = "swiglu", .build = td__build_swiglu},
    {.type = "residual", .build = build_residual, .container = 1},
    {.type = "repeat", .build = NULL, .container = 1},
};

#define NKINDS (sizeof layer_kinds / sizeof layer_kinds[0])

/* The entry that builds type, or NULL after an error that lists the known types. */
static const layer_kind *find_kind(const build_ctx *b, const char *type) {
    char msg[256];
    size_t len;
    for (size_t i = 0; i < NKINDS; i++)
        if (layer_kinds[i].build && !strcmp(layer_kinds[i].type, type))
            return &layer_kinds[i];
    len = (size_t)snprintf(msg, sizeof msg, "unknown layer type (");
    for (size_t i = 0; i < NKINDS && len < sizeof msg; i++)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s", i ? ", " : "",
                                layer_kinds[i].type);
    if (len < sizeof msg)
        snprintf(msg + len, sizeof msg - len, ")");
    td__spec_error(b, "type", msg);
    return NULL;
}

/* A layer's output per sample must fit a tensor; its input already does. */
static td_status check_out_size(const build_ctx *b, const td_layer *l) {
    char s[64];
    if (td__nn_numel(l->out_shape, l->out_ndim) >= 0)
        return TD_OK;
    return td__error(TD_ERR_PARSE,
                     "%s: %s: %s gives %s per sample, more than the %lld elements a tensor may "
                     "hold",
                     b->file, b->where, l->type, td__shape_text(l->out_shape, l->out_ndim, s),
                     (long long)TD_MODEL_MAX_TENSOR);
}

td_status td__layer_build(td_model *m, const char *file, json_t *spec, const char *where,
                          const char *path, int in_ndim, const int64_t *in_shape, td_layer **out) {
    build_ctx b = {.m = m, .file = file, .spec = spec, .where = where};
    json_t *jt;
    const char *type;
    td_layer *l;
    td_status st;
    *out = NULL;
    if (!json_is_object(spec))
        return td__error(TD_ERR_PARSE, "%s: %s: expected an object", file, where);
    jt = json_object_get(spec, "type");
    if (!jt)
        return td__spec_error(&b, "type", "missing (a required string)");
    if (!json_is_string(jt))
        return td__spec_error(&b, "type", "expected a string");
    type = json_string_value(jt);
    if (!(b.kind = find_kind(&b, type)))
        return TD_ERR_PARSE;
    if (!(l = td__calloc(sizeof *l, "a layer")))
        return TD_ERR_OUT_OF_MEMORY;
    if (!(l->path = td__strdup(path))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    snprintf(l->type, sizeof l->type, "%s", type);
    l->uid = m->nlayers_made++;
    if (m->splits && l->uid < m->nsplits)
        l->split = m->splits[l->uid];
    l->in_ndim = in_ndim;
    memcpy(l->in_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
    l->first_param = m->nparams;
    l->first_serial = m->param_serial;
    l->weights = m->serial_weights;
    /* the input's shape unless the builder changes it */
    memcpy(l->out_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
    l->out_ndim = in_ndim;
    if ((st = b.kind->build(&b, l, b.kind->variant, in_ndim, in_shape)) != TD_OK ||
        (st = check_out_size(&b, l)) != TD_OK)
        goto fail;
    l->weights = m->serial_weights - l->weights;
    if (!b.kind->container) { /* a container's parameters are its children's */
        l->nparams = (int)(m->nparams - l->first_param);
        /* in slot order, skipping the slots of parameters a layer leaves out
         * (an attention without q, k, v biases, a SwiGLU MLP without biases) */
        for (int i = 0, k = 0; i < TD_LAYER_MAX_PARAMS && k < l->nparams; i++)
            if (l->param[i])
                l->grad[i] = m->grads[l->first_param + (size_t)k++];
        if (l->tied && l->param[0]) {
            /* the weight is the embedding's (a parameter of that layer), the bias its own */
            l->grad[1] = l->nparams ? l->grad[0] : NULL;
            l->grad[0] = m->embed->grad[0];
        }
    }
    *out = l;
    return TD_OK;
fail:
    td__layer_destroy(l);
    return st;
}

static td_status seq_append(td_layer *seq, td_layer *child, int *cap) {
    if (seq->nchildren == *cap) {
        int ncap = *cap ? *cap * 2 : 8;
        td_layer **n = realloc(seq->children, sizeof *n * (size_t)ncap);
        if (!n)
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory building a model");
        seq->children = n;
        *cap = ncap;
    }
    seq->children[seq->nchildren++] = child;
    return TD_OK;
}

/* "<path>.<index>", malloc'ed: no fixed buffer, so deep names stay whole and distinct. */
static char *child_path(const char *path, int index) {
    size_t n = strlen(path) + 16;
    char *p = td__calloc(n, "a layer's path");
    if (p)
        snprintf(p, n, "%s.%d", path, index);
    return p;
}

/* Appends the layers of JSON array arr to seq; repeat blocks expand in place.
 * In the root (top), a layer outside the model's part is built dry. */
static td_status seq_fill(td_model *m, const char *file, json_t *arr, const char *where,
                          const char *path, td_layer *seq, int *cap, int top) {
    size_t i;
    json_t *spec;
    td_status st;
    if (!json_is_array(arr))
        return td__error(TD_ERR_PARSE, "%s: %s: expected an array of layers", file, where);
    json_array_foreach(arr, i, spec) {
        char w[256], *p;
        int in_ndim = seq->nchildren ? seq->children[seq->nchildren - 1]->out_ndim : seq->in_ndim;
        const int64_t *in =
            seq->nchildren ? seq->children[seq->nchildren - 1]->out_shape : seq->in_shape;
        json_t *jt = json_object_get(spec, "type");
        td_layer *child = NULL;
        snprintf(w, sizeof w, "%s[%zu]", where, i);
        if (json_is_string(jt) && !strcmp(json_string_value(jt), "repeat")) {
            build_ctx b = {.m = m, .file = file, .spec = spec, .where = w};
            static const char *const keys[] = {"type", "count", "layers", NULL};
            int64_t count;
            char w2[256];
            TD_CHECK(td__spec_keys(&b, keys));
            TD_CHECK(td__spec_int(&b, "count", 1, 0, 1, 1024, &count));
            snprintf(w2, sizeof w2, "%s.layers", w);
            for (int64_t k = 0; k < count; k++)
                TD_CHECK(
                    seq_fill(m, file, json_object_get(spec, "layers"), w2, path, seq, cap, top));
            continue;
        }
        if (top) {
            int k = seq->nchildren;
            m->dry = !m->dev || k < m->part_first || k >= m->part_end;
            if (k == m->part_first)
                m->part_first_param = m->param_serial;
        }
        if (!(p = child_path(path, seq->nchildren)))
            return TD_ERR_OUT_OF_MEMORY;
        st = td__layer_build(m, file, spec, w, p, in_ndim, in, &child);
        free(p);
        if (st != TD_OK)
            return st;
        if ((st = seq_append(seq, child, cap)) != TD_OK) {
            td__layer_destroy(child);
            return st;
        }
    }
    return TD_OK;
}

td_status td__layer_build_seq(td_model *m, const char *file, json_t *arr, const char *where,
                              const char *path, int in_ndim, const int64_t *in_shape,
                              td_layer **out) {
    td_layer *seq;
    int cap = 0, top = m->build_top;
    td_status st;
    *out = NULL;
    m->build_top = 0;
    if (!(seq = td__calloc(sizeof *seq, "a layer list")))
        return TD_ERR_OUT_OF_MEMORY;
    seq->vt = &td__sequential_vt;
    if (!(seq->path = td__strdup(path))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    seq->uid = m->nlayers_made++;
    seq->in_ndim = in_ndim;
    memcpy(seq->in_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
    seq->first_param = m->nparams;
    seq->first_serial = m->param_serial;
    snprintf(seq->type, sizeof seq->type, "sequential");
    if ((st = seq_fill(m, file, arr, where, path, seq, &cap, top)) != TD_OK)
        goto fail;
    if (seq->nchildren == 0) {
        st = td__error(TD_ERR_PARSE, "%s: %s: expected at least one layer", file, where);
        goto fail;
    }
    seq->out_ndim = seq->children[seq->nchildren - 1]->out_ndim;
    memcpy(seq->out_shape, seq->children[seq->nchildren - 1]->out_shape,
           sizeof(int64_t) * TD_MAX_DIMS);
    *out = seq;
    return TD_OK;
fail:
    td__layer_destroy(seq);
    return st;
}

/* Adds to *count the layers JSON array arr expands to, stopping with an
 * error once they pass TD_MODEL_MAX_LAYERS or a list lies deeper than
 * TD_MODEL_MAX_DEPTH. Walks the JSON, not the expansion: a repeat block's
 * layers are counted once and multiplied, so a tiny file asking for
 * billions of layers costs no more than its size. */
static td_status count_layers(const char *file, json_t *arr, const char *where, int depth,
                              int64_t *count) {
    size_t i;
    json_t *spec;
    if (depth > TD_MODEL_MAX_DEPTH)
        return td__error(TD_ERR_PARSE,
                         "%s: %s: residual and repeat blocks nested more than %d deep", file, where,
                         TD_MODEL_MAX_DEPTH);
    json_array_foreach(arr, i, spec) {
        json_t *jt = json_object_get(spec, "type"), *jc = json_object_get(spec, "count");
        const char *type = json_is_string(jt) ? json_string_value(jt) : "";
        int repeat = !strcmp(type, "repeat");
        int64_t inner = 0, times = 1;
        if (repeat || !strcmp(type, "residual")) {
            char w[256];
            snprintf(w, sizeof w, "%s[%zu].layers", where, i);
            TD_CHECK(count_layers(file, json_object_get(spec, "layers"), w, depth + 1, &inner));
        }
        /* a bad count is the builder's to report */
        if (repeat && json_is_integer(jc) && json_integer_value(jc) >= 1 &&
            json_integer_value(jc) <= 1024)
            times = json_integer_value(jc);
        *count += repeat ? times * inner : 1 + inner;
        if (*count > TD_MODEL_MAX_LAYERS)
            return td__error(TD_ERR_PARSE,
                             "%s: %s[%zu]: the model has more than %d layers once repeat blocks "
                             "are expanded",
                             file, where, i, TD_MODEL_MAX_LAYERS);
    }
    return TD_OK;
}

td_status td__layers_check_size(const char *file, json_t *arr) {
    int64_t count = 0;
    return count_layers(file, arr, "layers", 0, &count);
}
