/* Reading a model's JSON: its input, its layers built whole, as a part or
 * all dry for td_model_describe, and what a model is (td_model_info). See
 * docs/models.md for the schema. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "nn/nn-impl.h"

static td_status input_error(const char *file, const char *field, const char *what) {
    return td__error(TD_ERR_PARSE, "%s: input.%s: %s", file, field, what);
}

static td_status parse_input(td_model *m, const char *file, json_t *in) {
    json_t *shape = json_object_get(in, "shape"), *tokens = json_object_get(in, "tokens");
    const char *key;
    json_t *v;
    if (!json_is_object(in))
        return td__error(TD_ERR_PARSE,
                         "%s: input: expected an object with \"shape\" or "
                         "\"tokens\"",
                         file);
    json_object_foreach(in, key, v) {
        if (strcmp(key, "shape") && strcmp(key, "tokens") && strcmp(key, "vocab"))
            return input_error(file, key, "unknown field (shape, tokens, vocab)");
    }
    if (shape && tokens)
        return td__error(TD_ERR_PARSE, "%s: input: give \"shape\" or \"tokens\", not both", file);
    if (shape) {
        size_t i;
        if (!json_is_array(shape) || json_array_size(shape) < 1 || json_array_size(shape) > 3)
            return input_error(file, "shape", "expected an array of 1 to 3 positive integers");
        json_array_foreach(shape, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                json_integer_value(v) > (1 << 24))
                return input_error(file, "shape", "expected an array of 1 to 3 positive integers");
            m->in_shape[i] = json_integer_value(v);
        }
        if (json_object_get(in, "vocab"))
            return input_error(file, "vocab", "only for token input");
        m->kind = TD_INPUT_FEATURES;
        m->in_ndim = (int)json_array_size(shape);
        if (td__nn_numel(m->in_shape, m->in_ndim) < 0) {
            char s[64], msg[160];
            snprintf(msg, sizeof msg, "%s has more than the %lld elements a tensor may hold",
                     td__shape_text(m->in_shape, m->in_ndim, s), (long long)TD_MODEL_MAX_TENSOR);
            return input_error(file, "shape", msg);
        }
        return TD_OK;
    }
    if (tokens) {
        json_t *vocab = json_object_get(in, "vocab");
        if (!json_is_integer(tokens) || json_integer_value(tokens) < 1 ||
            json_integer_value(tokens) > (1 << 20))
            return input_error(file, "tokens", "expected a positive integer (the context length)");
        if (!vocab)
            return input_error(file, "vocab", "missing (a required integer)");
        if (!json_is_integer(vocab) || json_integer_value(vocab) < 1 ||
            json_integer_value(vocab) > (1 << 24))
            return input_error(file, "vocab", "expected a positive integer");
        m->kind = TD_INPUT_TOKENS;
        m->in_ndim = 1;
        m->in_shape[0] = json_integer_value(tokens);
        m->classes = json_integer_value(vocab);
        return TD_OK;
    }
    return td__error(TD_ERR_PARSE, "%s: input: expected \"shape\" or \"tokens\"", file);
}

static td_status check_output(td_model *m, const char *file) {
    td_layer *root = m->root, *first = root->children[0];
    char s[64];
    if (m->kind == TD_INPUT_TOKENS) {
        if (strcmp(first->vt->type, "embedding"))
            return td__error(TD_ERR_PARSE,
                             "%s: layers[0].type: a token model starts with an embedding", file);
        if (root->out_ndim != 2 || root->out_shape[0] != m->in_shape[0] ||
            root->out_shape[1] != m->classes)
            return td__error(TD_ERR_PARSE,
                             "%s: layers: the last layer gives %s per sample; a token model "
                             "must end with (%lld, %lld) logits (tokens, vocab)",
                             file, td__shape_text(root->out_shape, root->out_ndim, s),
                             (long long)m->in_shape[0], (long long)m->classes);
        return TD_OK;
    }
    if (root->out_ndim != 1)
        return td__error(TD_ERR_PARSE,
                         "%s: layers: the last layer gives %s per sample; a classifier ends with "
                         "(classes) logits (add a flatten and a linear)",
                         file, td__shape_text(root->out_shape, root->out_ndim, s));
    m->classes = root->out_shape[0];
    return TD_OK;
}

/* Destroys the root's top-level layers outside [first, end), which were built dry. */
static void keep_part(td_layer *root, int first, int end) {
    int k = 0;
    for (int i = 0; i < root->nchildren; i++) {
        if (i >= first && i < end)
            root->children[k++] = root->children[i];
        else
            td__layer_destroy(root->children[i]);
    }
    root->nchildren = k;
    root->in_ndim = root->children[0]->in_ndim;
    memcpy(root->in_shape, root->children[0]->in_shape, sizeof root->in_shape);
    root->out_ndim = root->children[k - 1]->out_ndim;
    memcpy(root->out_shape, root->children[k - 1]->out_shape, sizeof root->out_shape);
}

/* Activation elements of layer l for a batch of n (a dry plan). */
static td_status plan_size(td_layer *l, int64_t n, size_t *elements) {
    td_nn_plan p;
    td_tensor x;
    memset(&p, 0, sizeof p);
    memset(&x, 0, sizeof x);
    p.n = n;
    p.dry = 1;
    TD_CHECK(l->vt->plan(l, &p, &x));
    *elements = p.used + p.iused;
    return TD_OK;
}

/* One sample's activations must fit the total limit, so that no batch
 * size the steps accept can overflow the arena's size. */
static td_status check_activations(td_model *m, const char *file) {
    size_t elements = 0;
    td_status st = plan_size(m->root, 1, &elements);
    if (st == TD_ERR_OUT_OF_MEMORY || (st == TD_OK && elements > (size_t)TD_MODEL_MAX_TOTAL))
        return td__error(TD_ERR_PARSE,
                         "%s: layers: one sample's activations come to more than %lld elements",
                         file, (long long)TD_MODEL_MAX_TOTAL);
    return st;
}

td_status td__model_build(const char *json, const char *name, td_device *dev, td_dtype dtype,
                          uint64_t seed, int first, int end, int slots, const td__split *splits,
                          int nsplits, td_model **out) {
    td_model *m = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    td_status st;
    const char *key;
    json_t *v;
    *out = NULL;
    if (!name)
        name = "<model>";
    if (dtype != TD_F32 && dtype != TD_F64)
        return td__error(TD_ERR_DTYPE, "%s: unknown dtype %d", name, (int)dtype);
    /* A dry build first checks every limit, so that a file asking too much
     * is refused before anything is allocated on dev. */
    if (dev) {
        TD_CHECK(td__model_build(json, name, NULL, dtype, seed, 0, -1, 0, NULL, 0, &m));
        td_model_destroy(m);
        m = NULL;
    }
    if (!(root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr)))
        return td__error(TD_ERR_PARSE, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        st = td__error(TD_ERR_PARSE, "%s: expected a JSON object at the top", name);
        goto fail;
    }
    json_object_foreach(root, key, v) {
        if (strcmp(key, "name") && strcmp(key, "description") && strcmp(key, "input") &&
            strcmp(key, "layers")) {
            st = td__error(TD_ERR_PARSE, "%s: %s: unknown field (name, description, input, layers)",
                           name, key);
            goto fail;
        }
    }
    if (!(m = td__calloc(sizeof *m, "a model"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    m->dev = dev;
    m->file = name;
    m->dtype = dtype;
    m->seed = seed;
    m->part_first = first;
    m->part_end = end < 0 ? INT_MAX : end;
    m->cur_slot = -1;
    if (splits) {
        if (!(m->splits = td__calloc(sizeof *m->splits * (size_t)nsplits, "a shard's splits"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        memcpy(m->splits, splits, sizeof *m->splits * (size_t)nsplits);
        m->nsplits = nsplits;
    }
    if (!(m->json = td__strdup(json))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    if (!json_object_get(root, "input")) {
        st = td__error(TD_ERR_PARSE,
                       "%s: input: missing (an object with \"shape\" or "
                       "\"tokens\")",
                       name);
        goto fail;
    }
    if ((st = parse_input(m, name, json_object_get(root, "input"))) != TD_OK)
        goto fail;
    if (!json_object_get(root, "layers")) {
        st = td__error(TD_ERR_PARSE, "%s: layers: missing (an array of layers)", name);
        goto fail;
    }
    if ((st = td__layers_check_size(name, json_object_get(root, "layers"))) != TD_OK)
        goto fail;
    m->build_top = 1;
    if ((st = td__layer_build_seq(m, name, json_object_get(root, "layers"), "layers", "layers",
                                  m->in_ndim, m->in_shape, &m->root)) != TD_OK)
        goto fail;
    if ((st = check_output(m, name)) != TD_OK || (st = check_activations(m, name)) != TD_OK)
        goto fail;
    m->info.kind = m->kind;
    m->info.in_ndim = m->in_ndim;
    memcpy(m->info.in_shape, m->in_shape, sizeof m->info.in_shape);
    m->info.classes = m->classes;
    m->info.layers = m->root->nchildren;
    m->info.num_weights = m->serial_weights;
    if (m->part_end > m->info.layers) {
        if (end >= 0) {
            st = td__error(TD_ERR_INVALID_ARG, "%s: part [%d, %d): the model has %d layers", name,
                           first, end, m->info.layers);
            goto fail;
        }
        m->part_end = m->info.layers;
    }
    if (dev) {
        keep_part(m->root, m->part_first, m->part_end);
        if (!(m->slots = td__calloc(sizeof *m->slots * (size_t)slots, "a model's slots"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        m->nslots = slots;
    }
    json_decref(root);
    m->file = NULL; /* the caller's name need not outlive the build */
    *out = m;
    return TD_OK;
fail:
    json_decref(root);
    td_model_destroy(m);
    return st;
}

td_status td_model_describe(const char *json, const char *name, td_model_info *info,
                            td_layer_info *layers, int max_layers) {
    td_model *m = NULL;
    td_status st;
    if (!json || !info)
        return td__error(TD_ERR_INVALID_ARG, "td_model_describe: json or info is NULL");
    memset(info, 0, sizeof *info);
    if ((st = td__model_build(json, name, NULL, TD_F32, 0, 0, -1, 0, NULL, 0, &m)) != TD_OK)
        return st;
    *info = m->info;
    for (int i = 0; layers && i < m->info.layers && i < max_layers; i++) {
        td_layer *l = m->root->children[i];
        td_layer_info *li = &layers[i];
        size_t one, many;
        /* per sample: the growth from 1 to 65 samples, which alignment blurs less */
        if ((st = plan_size(l, 1, &one)) != TD_OK || (st = plan_size(l, 65, &many)) != TD_OK)
            break;
        memset(li, 0, sizeof *li);
        snprintf(li->type, sizeof li->type, "%s", l->type);
        li->weights = l->weights;
        li->act_per_sample = (many - one + 63) / 64;
        li->out_ndim = l->out_ndim;
        memcpy(li->out_shape, l->out_shape, sizeof li->out_shape);
    }
    td_model_destroy(m);
    return st;
}

void td_model_get_info(const td_model *m, td_model_info *out) {
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (m)
        *out = m->info;
}

/* Untying -------------------------------------------------------------------------- */

/* Drops "tied" from every linear in the layer list arr and its sublists;
 * *n counts them. */
static void untie_layers(json_t *arr, int *n) {
    size_t i;
    json_t *l;
    json_array_foreach(arr, i, l) {
        if (json_is_true(json_object_get(l, "tied"))) {
            json_object_del(l, "tied");
            ++*n;
        }
        if (json_is_array(json_object_get(l, "layers")))
            untie_layers(json_object_get(l, "layers"), n);
    }
}

td_status td_model_untie(const char *json, const char *name, char **out) {
    json_error_t err;
    json_t *root;
    int n = 0;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_untie: out is NULL");
    *out = NULL;
    if (!json)
        return td__error(TD_ERR_INVALID_ARG, "td_model_untie: json is NULL");
    if (!(root = json_loads(json, 0, &err)))
        return td__error(TD_ERR_PARSE, "%s: line %d: %s", name ? name : "(model)", err.line,
                         err.text);
    untie_layers(json_object_get(root, "layers"), &n);
    if (n && !(*out = json_dumps(root, JSON_COMPACT))) {
        json_decref(root);
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the untied model",
                         name ? name : "(model)");
    }
    json_decref(root);
    return TD_OK;
}
