/* GPT-2 as a tandem model: the parameters by kind with their tandem names
 * and shapes, the model JSON, and saving the converted tensors as a
 * checkpoint (the readers of each source: import_hf.c, import_llmc.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/import-impl.h"
#include "tandem/nn.h"

/* The model's top-level layers: the embedding (0), then per block b an
 * attention residual (1 + 2b) and an MLP residual (2 + 2b), the final layer
 * norm (1 + 2L) and the head (2 + 2L). Inside a residual: 0 the layer norm,
 * then the attention (1), or the MLP's linears (1 and 3, the activation 2). */
typedef enum place { IN_EMBEDDING, IN_ATTENTION, IN_MLP, IN_FINAL_NORM, IN_HEAD } place;

static const struct {
    const char *name; /* after "layers.<i>." */
    place where;
} kinds[TD__G_KINDS] = {
    [TD__G_WTE] = {"wte.weight", IN_EMBEDDING},
    [TD__G_WPE] = {"wpe.weight", IN_EMBEDDING},
    [TD__G_LN1W] = {"0.weight", IN_ATTENTION},
    [TD__G_LN1B] = {"0.bias", IN_ATTENTION},
    [TD__G_QKVW] = {"1.qkv.weight", IN_ATTENTION},
    [TD__G_QKVB] = {"1.qkv.bias", IN_ATTENTION},
    [TD__G_ATTPROJW] = {"1.proj.weight", IN_ATTENTION},
    [TD__G_ATTPROJB] = {"1.proj.bias", IN_ATTENTION},
    [TD__G_LN2W] = {"0.weight", IN_MLP},
    [TD__G_LN2B] = {"0.bias", IN_MLP},
    [TD__G_FCW] = {"1.weight", IN_MLP},
    [TD__G_FCB] = {"1.bias", IN_MLP},
    [TD__G_FCPROJW] = {"3.weight", IN_MLP},
    [TD__G_FCPROJB] = {"3.bias", IN_MLP},
    [TD__G_LNFW] = {"weight", IN_FINAL_NORM},
    [TD__G_LNFB] = {"bias", IN_FINAL_NORM},
    [TD__G_HEAD] = {"weight", IN_HEAD},
};

int td__gpt2_per_block(td__gpt2_kind k) {
    return kinds[k].where == IN_ATTENTION || kinds[k].where == IN_MLP;
}

int td__gpt2_shape(const td_gpt2_info *g, td__gpt2_kind k, int64_t s[2]) {
    int64_t c = g->channels;
    switch (k) {
    case TD__G_WTE:
    case TD__G_HEAD: s[0] = g->vocab, s[1] = c; return 2;
    case TD__G_WPE: s[0] = g->context, s[1] = c; return 2;
    case TD__G_QKVW: s[0] = 3 * c, s[1] = c; return 2;
    case TD__G_QKVB: s[0] = 3 * c; return 1;
    case TD__G_ATTPROJW: s[0] = c, s[1] = c; return 2;
    case TD__G_FCW: s[0] = g->inner, s[1] = c; return 2;
    case TD__G_FCB: s[0] = g->inner; return 1;
    case TD__G_FCPROJW: s[0] = c, s[1] = g->inner; return 2;
    default: s[0] = c; return 1; /* layer norms, the projections' biases */
    }
}

/* "layers.<i>.<what>" of kind k in block b. */
static void tandem_name(const td_gpt2_info *g, td__gpt2_kind k, int64_t b, char *buf, size_t n) {
    place w = kinds[k].where;
    int64_t top = w == IN_EMBEDDING    ? 0
                  : w == IN_ATTENTION  ? 1 + 2 * b
                  : w == IN_MLP        ? 2 + 2 * b
                  : w == IN_FINAL_NORM ? 1 + 2 * g->layers
                                       : 2 + 2 * g->layers;
    snprintf(buf, n, "layers.%lld.%s", (long long)top, kinds[k].name);
}

/* Limits within which every product below stays far from overflowing, and
 * which every published GPT-2 (and much larger) meets. */
#define MAX_TOKENS   ((int64_t)1 << 24)
#define MAX_CONTEXT  ((int64_t)1 << 20)
#define MAX_LAYERS   ((int64_t)1 << 12)
#define MAX_CHANNELS ((int64_t)1 << 16)

static td_status size_error(const char *file, const char *field, int64_t v, int64_t max) {
    return td__error(TD_ERR_PARSE, "%s: %s = %lld: expected an integer from 1 to %lld", file, field,
                     (long long)v, (long long)max);
}

td_status td__gpt2_check(const td_gpt2_info *g, const char *file, const char *const *f) {
    const int64_t v[6] = {g->context, g->vocab, g->layers, g->heads, g->channels, g->inner};
    const int64_t max[6] = {MAX_CONTEXT,  MAX_TOKENS,       MAX_LAYERS,
                            MAX_CHANNELS, MAX_CHANNELS * 4, MAX_CHANNELS * 16};
    for (int i = 0; i < 6; i++)
        if (v[i] < 1 || v[i] > max[i])
            return size_error(file, f[i], v[i], max[i]);
    if (g->channels % g->heads != 0)
        return td__error(TD_ERR_PARSE, "%s: %s = %lld does not divide %s = %lld", file, f[3],
                         (long long)g->heads, f[4], (long long)g->channels);
    if (!(g->eps > 0 && g->eps <= 1))
        return td__error(TD_ERR_PARSE, "%s: %s = %g: expected a number in (0, 1]", file, f[6],
                         g->eps);
    return TD_OK;
}

td_status td__ckpt_list_add(td__ckpt_list *l, const char *name, int ndim, const int64_t *shape,
                            float *data, int owned) {
    td_ckpt_entry *e;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        td_ckpt_entry *ne = realloc(l->e, cap * sizeof *ne);
        float **no = ne ? realloc(l->owned, cap * sizeof *no) : NULL;
        if (ne)
            l->e = ne;
        if (!ne || !no) {
            if (owned)
                free(data);
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory converting a model");
        }
        l->owned = no;
        l->cap = cap;
    }
    e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = td__strdup(name))) {
        if (owned)
            free(data);
        return TD_ERR_OUT_OF_MEMORY;
    }
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        e->shape[d] = shape[d];
    e->data = data;
    l->owned[l->n++] = owned ? data : NULL;
    return TD_OK;
}

td_status td__gpt2_add(td__gpt2_out *o, td__gpt2_kind k, int64_t block, float *data, int owned) {
    char name[96];
    int64_t shape[2];
    int nd = td__gpt2_shape(&o->info, k, shape);
    tandem_name(&o->info, k, block, name, sizeof name);
    return td__ckpt_list_add(&o->list, name, nd, shape, data, owned);
}

/* The JSON of one activation layer. */
static json_t *act_json(td_act act) {
    switch (act) {
    case TD_ACT_RELU: return json_pack("{s:s}", "type", "relu");
    case TD_ACT_GELU: return json_pack("{s:s}", "type", "gelu");
    case TD_ACT_TANH: return json_pack("{s:s}", "type", "tanh");
    case TD_ACT_SIGMOID: return json_pack("{s:s}", "type", "sigmoid");
    default: return json_pack("{s:s,s:s}", "type", "gelu", "approximate", "tanh");
    }
}

/* The model JSON (malloc'ed), as docs/models.md and import.h describe it. */
static char *model_json(const td__gpt2_out *o) {
    const td_gpt2_info *g = &o->info;
    char desc[256];
    json_t *head, *root;
    char *text;
    snprintf(desc, sizeof desc,
             "GPT-2 from %s: %lld blocks, %lld heads, %lld channels, context %lld, vocabulary "
             "%lld",
             o->source, (long long)g->layers, (long long)g->heads, (long long)g->channels,
             (long long)g->context, (long long)g->vocab);
    head = json_pack("{s:s,s:I,s:b}", "type", "linear", "out", (json_int_t)g->vocab, "bias", 0);
    if (head && g->tied)
        json_object_set_new(head, "tied", json_true());
    root = json_pack(
        "{s:s,s:s,s:{s:I,s:I},s:[{s:s,s:I,s:I,s:b},{s:s,s:I,s:[{s:s,s:[{s:s,s:f},{s:s,s:I}]},"
        "{s:s,s:[{s:s,s:f},{s:s,s:I},o,{s:s,s:I}]}]},{s:s,s:f},o]}",
        "name", "gpt2", "description", desc, "input", "tokens", (json_int_t)g->context, "vocab",
        (json_int_t)g->vocab, "layers", "type", "embedding", "vocab", (json_int_t)g->vocab, "dim",
        (json_int_t)g->channels, "positions", 1, "type", "repeat", "count", (json_int_t)g->layers,
        "layers", "type", "residual", "layers", "type", "layernorm", "eps", g->eps, "type",
        "attention", "heads", (json_int_t)g->heads, "type", "residual", "layers", "type",
        "layernorm", "eps", g->eps, "type", "linear", "out", (json_int_t)g->inner, act_json(o->act),
        "type", "linear", "out", (json_int_t)g->channels, "type", "layernorm", "eps", g->eps, head);
    text = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    return text;
}

/* The entries of a fresh optimizer's state for o's parameters, named as
 * td_optimizer_state_name() names them, all pointing at one buffer of
 * zeros (*zeros, malloc'ed): appended to o->e's n parameters in *all. */
static td_status with_zero_state(const td__ckpt_list *o, const td_optimizer_config *opt,
                                 td_ckpt_entry **all, size_t *n, float **zeros) {
    static const char *const adam[] = {"exp_avg", "exp_avg_sq"}, *const sgd[] = {"momentum_buffer"};
    int per = opt->kind == TD_OPT_ADAMW ? 2 : opt->momentum > 0 ? 1 : 0;
    size_t most = 1, k = o->n;
    *all = NULL;
    *zeros = NULL;
    for (size_t i = 0; i < o->n; i++) {
        size_t numel = 1;
        for (int d = 0; d < o->e[i].ndim; d++)
            numel *= (size_t)o->e[i].shape[d];
        most = numel > most ? numel : most;
    }
    if (!(*all = td__calloc((o->n * (size_t)(1 + per) + 1) * sizeof **all, "a checkpoint")) ||
        !(*zeros = td__calloc(most * sizeof **zeros, "an optimizer's state")))
        return TD_ERR_OUT_OF_MEMORY;
    memcpy(*all, o->e, o->n * sizeof **all);
    for (size_t i = 0; i < o->n; i++)
        for (int s = 0; s < per; s++, k++) {
            char name[160];
            snprintf(name, sizeof name, "optimizer.%s.%s", o->e[i].name,
                     opt->kind == TD_OPT_ADAMW ? adam[s] : sgd[s]);
            (*all)[k] = o->e[i];
            (*all)[k].data = *zeros;
            if (!((*all)[k].name = td__strdup(name))) {
                *n = k;
                return TD_ERR_OUT_OF_MEMORY;
            }
        }
    *n = k;
    return TD_OK;
}

/* Saves o's tensors, with state's zero optimizer state when there is one. */
static td_status save_entries(const td__ckpt_list *o, const char *path, const char *json,
                              const td_train_state *state) {
    td_ckpt_entry *all = NULL;
    float *zeros = NULL;
    size_t n = 0;
    td_status st;
    if (!state)
        return td_checkpoint_save_host(path, json, TD_F32, o->e, o->n, 0, NULL);
    if ((st = with_zero_state(o, &state->opt, &all, &n, &zeros)) == TD_OK)
        st = td_checkpoint_save_host(path, json, TD_F32, all, n, 1, state);
    for (size_t i = o->n; all && i < n; i++)
        free((char *)all[i].name);
    free(all);
    free(zeros);
    return st;
}

td_status td__ckpt_list_save(const td__ckpt_list *l, const char *path, const char *json,
                             const char *what, const td_train_state *state, size_t *weights) {
    td_model_info mi;
    size_t total = 0;
    /* The tensors must be exactly the model's: the same count of weights. */
    TD_CHECK(td_model_describe(json, what, &mi, NULL, 0));
    for (size_t i = 0; i < l->n; i++) {
        size_t n = 1;
        for (int d = 0; d < l->e[i].ndim; d++)
            n *= (size_t)l->e[i].shape[d];
        total += n;
    }
    if (total != mi.num_weights)
        return td__error(TD_ERR_INTERNAL, "%s: %zu weights converted; the model has %zu", path,
                         total, mi.num_weights);
    TD_CHECK(save_entries(l, path, json, state));
    if (weights)
        *weights = total;
    return TD_OK;
}

void td__ckpt_list_free(td__ckpt_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->e[i].name);
        free(l->owned[i]);
    }
    free(l->e);
    free(l->owned);
    memset(l, 0, sizeof *l);
}

td_status td__gpt2_save(td__gpt2_out *o, const char *path, const td_train_state *state,
                        td_gpt2_info *info) {
    char *json = model_json(o);
    td_status st;
    if (!json)
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory writing a GPT-2's model JSON");
    st = td__ckpt_list_save(&o->list, path, json, "the converted GPT-2", state, &o->info.weights);
    if (st == TD_OK && info)
        *info = o->info;
    free(json);
    return st;
}

void td__gpt2_free(td__gpt2_out *o) {
    td__ckpt_list_free(&o->list);
    memset(o, 0, sizeof *o);
}
