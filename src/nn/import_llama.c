/* The Llama family from transformers' save_pretrained folders (Llama,
 * Qwen2, Mistral: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)
 * into a tandem checkpoint, and td_import_hf, which picks the importer by
 * config.json's architecture.
 *
 * transformers' Llama is tandem's llama model as it is: q_proj, k_proj and
 * v_proj are stacked into qkv (rows q, k, v), gate_proj and up_proj into
 * gate_up, and the rotary embedding already is the rotate_half form that
 * tandem's attention computes. Qwen2 has biases on q, k and v; Llama has
 * them on all four projections when attention_bias says so, and on the MLP
 * when mlp_bias does; Mistral has none. A sliding window shorter than the
 * context is refused: tandem's attention sees the whole context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/hf-impl.h"
#include "nn/import-impl.h"

/* Limits within which every product below stays far from overflowing. */
#define MAX_TOKENS   ((int64_t)1 << 24)
#define MAX_CONTEXT  ((int64_t)1 << 20)
#define MAX_LAYERS   ((int64_t)1 << 12)
#define MAX_CHANNELS ((int64_t)1 << 16)

typedef enum family { LLAMA, QWEN2, MISTRAL } family;

typedef struct llama_cfg {
    family fam;
    td_hf_info info;
    int proj_bias, mlp_bias;
    json_t *scaling; /* borrowed from config.json: Llama 3's rope scaling, or NULL */
    char sizes[320]; /* the fields that fix the shapes, for messages */
} llama_cfg;

/* config.json ---------------------------------------------------------------------- */

static td_status check_size(const td__hf_folder *f, const char *key, int64_t v, int64_t max) {
    if (v >= 1 && v <= max)
        return TD_OK;
    return td__error(TD_ERR_PARSE, "%s: \"%s\" = %lld: expected an integer from 1 to %lld",
                     f->cfg_path, key, (long long)v, (long long)max);
}

/* rope_theta and rope_scaling as transformers 4 writes them, or its 5's
 * rope_parameters ({"rope_theta", "rope_type", and the type's fields}). */
static td_status read_rope(const td__hf_folder *f, llama_cfg *c) {
    json_t *params = json_object_get(f->cfg, "rope_parameters"), *type;
    const char *key = params ? "rope_parameters" : "rope_scaling";
    json_t *sc = params ? params : json_object_get(f->cfg, "rope_scaling"), *theta;
    char msg[200];
    c->info.rope_theta = 10000;
    theta = params ? json_object_get(params, "rope_theta") : json_object_get(f->cfg, "rope_theta");
    if (theta && !json_is_number(theta))
        return td__hf_cfg_error(f, params ? "rope_parameters\": \"rope_theta" : "rope_theta",
                                "expected a number");
    if (theta)
        c->info.rope_theta = json_number_value(theta);
    if (!(c->info.rope_theta > 1))
        return td__hf_cfg_error(f, "rope_theta", "expected a number above 1");
    if (!sc || json_is_null(sc))
        return TD_OK;
    if (!json_is_object(sc))
        return td__hf_cfg_error(f, key, "expected an object");
    type = json_object_get(sc, "rope_type");
    if (!type)
        type = json_object_get(sc, "type");
    if (!type || !json_is_string(type) || !strcmp(json_string_value(type), "default"))
        return TD_OK;
    if (strcmp(json_string_value(type), "llama3") != 0) {
        snprintf(msg, sizeof msg, "rope_type \"%.64s\" is not one tandem has (default, llama3)",
                 json_string_value(type));
        return td__error(TD_ERR_UNSUPPORTED, "%s: \"%s\": %s", f->cfg_path, key, msg);
    }
    c->scaling = sc;
    c->info.rope_scaled = 1;
    return TD_OK;
}

/* Mistral's sliding_window, Qwen2's when use_sliding_window is true: a
 * window that covers the context is ordinary attention. */
static td_status check_window(const td__hf_folder *f, llama_cfg *c) {
    int64_t w;
    int use = c->fam == MISTRAL;
    if (c->fam == QWEN2)
        TD_CHECK(td__hf_bool(f, "use_sliding_window", 0, &use));
    if (!use)
        return TD_OK;
    TD_CHECK(td__hf_int(f, "sliding_window", 0, 0, &w));
    if (w > 0 && w < c->info.context)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"sliding_window\" = %lld is shorter than the context "
                         "(max_position_embeddings = %lld): tandem's attention has no sliding "
                         "window",
                         f->cfg_path, (long long)w, (long long)c->info.context);
    return TD_OK;
}

static td_status read_config(const td__hf_folder *f, llama_cfg *c) {
    td_hf_info *g = &c->info;
    json_t *act = json_object_get(f->cfg, "hidden_act");
    int64_t head_dim;
    TD_CHECK(td__hf_int(f, "hidden_size", 1, 0, &g->channels));
    TD_CHECK(td__hf_int(f, "intermediate_size", 1, 0, &g->inner));
    TD_CHECK(td__hf_int(f, "num_hidden_layers", 1, 0, &g->layers));
    TD_CHECK(td__hf_int(f, "num_attention_heads", 1, 0, &g->heads));
    TD_CHECK(td__hf_int(f, "num_key_value_heads", 0, g->heads, &g->kv_heads));
    TD_CHECK(td__hf_int(f, "vocab_size", 1, 0, &g->vocab));
    TD_CHECK(td__hf_int(f, "max_position_embeddings", 1, 0, &g->context));
    TD_CHECK(td__hf_number(f, "rms_norm_eps", 1e-6, &g->eps));
    TD_CHECK(td__hf_bool(f, "tie_word_embeddings", 0, &g->tied));
    TD_CHECK(check_size(f, "hidden_size", g->channels, MAX_CHANNELS));
    TD_CHECK(check_size(f, "intermediate_size", g->inner, MAX_CHANNELS * 16));
    TD_CHECK(check_size(f, "num_hidden_layers", g->layers, MAX_LAYERS));
    TD_CHECK(check_size(f, "num_attention_heads", g->heads, g->channels));
    TD_CHECK(check_size(f, "num_key_value_heads", g->kv_heads, g->heads));
    TD_CHECK(check_size(f, "vocab_size", g->vocab, MAX_TOKENS));
    TD_CHECK(check_size(f, "max_position_embeddings", g->context, MAX_CONTEXT));
    if (g->channels % g->heads != 0)
        return td__error(TD_ERR_PARSE,
                         "%s: \"num_attention_heads\" = %lld does not divide \"hidden_size\" = "
                         "%lld",
                         f->cfg_path, (long long)g->heads, (long long)g->channels);
    if (g->heads % g->kv_heads != 0)
        return td__error(TD_ERR_PARSE,
                         "%s: \"num_attention_heads\" = %lld is not a multiple of "
                         "\"num_key_value_heads\" = %lld",
                         f->cfg_path, (long long)g->heads, (long long)g->kv_heads);
    TD_CHECK(td__hf_int(f, "head_dim", 0, g->channels / g->heads, &head_dim));
    if (head_dim != g->channels / g->heads)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"head_dim\" = %lld: tandem's heads are hidden_size / "
                         "num_attention_heads = %lld wide",
                         f->cfg_path, (long long)head_dim, (long long)(g->channels / g->heads));
    if (!(g->eps > 0 && g->eps <= 1))
        return td__hf_cfg_error(f, "rms_norm_eps", "expected a number in (0, 1]");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"hidden_act\": \"%.64s\": tandem's SwiGLU gates with silu only",
                         f->cfg_path, json_is_string(act) ? json_string_value(act) : "?");
    if (c->fam == LLAMA) {
        TD_CHECK(td__hf_bool(f, "attention_bias", 0, &g->qkv_bias));
        TD_CHECK(td__hf_bool(f, "mlp_bias", 0, &c->mlp_bias));
        c->proj_bias = g->qkv_bias;
    }
    g->qkv_bias |= c->fam == QWEN2;
    TD_CHECK(read_rope(f, c));
    TD_CHECK(check_window(f, c));
    snprintf(c->sizes, sizeof c->sizes,
             "hidden_size = %lld, intermediate_size = %lld, num_attention_heads = %lld, "
             "num_key_value_heads = %lld, vocab_size = %lld, num_hidden_layers = %lld",
             (long long)g->channels, (long long)g->inner, (long long)g->heads,
             (long long)g->kv_heads, (long long)g->vocab, (long long)g->layers);
    return TD_OK;
}

/* The model JSON ---------------------------------------------------------------------- */

static json_t *rope_scaling_json(const json_t *sc) {
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    json_t *o = json_pack("{s:s}", "type", "llama3");
    for (size_t i = 0; o && i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(sc, keys[i]);
        if (v)
            json_object_set(o, keys[i], v);
    }
    return o;
}

/* The model JSON (malloc'ed) as docs/models.md describes it. */
static char *model_json(const llama_cfg *c, const char *arch) {
    const td_hf_info *g = &c->info;
    char desc[320];
    json_t *attn, *root;
    char *text;
    snprintf(desc, sizeof desc,
             "%s from Hugging Face transformers: %lld blocks, %lld heads on %lld key/value "
             "heads, %lld channels, SwiGLU hidden %lld, context %lld, vocabulary %lld",
             arch, (long long)g->layers, (long long)g->heads, (long long)g->kv_heads,
             (long long)g->channels, (long long)g->inner, (long long)g->context,
             (long long)g->vocab);
    attn = json_pack("{s:s,s:I,s:I,s:f,s:b,s:b}", "type", "attention", "heads",
                     (json_int_t)g->heads, "kv_heads", (json_int_t)g->kv_heads, "rope_theta",
                     g->rope_theta, "qkv_bias", g->qkv_bias, "proj_bias", c->proj_bias);
    if (attn && c->scaling)
        json_object_set_new(attn, "rope_scaling", rope_scaling_json(c->scaling));
    root = json_pack(
        "{s:s,s:s,s:{s:I,s:I},s:[{s:s,s:I,s:I,s:b},{s:s,s:I,s:[{s:s,s:[{s:s,s:f},o]},"
        "{s:s,s:[{s:s,s:f},{s:s,s:I,s:b}]}]},{s:s,s:f},{s:s,s:I,s:b,s:b}]}",
        "name", "llama", "description", desc, "input", "tokens", (json_int_t)g->context, "vocab",
        (json_int_t)g->vocab, "layers", "type", "embedding", "vocab", (json_int_t)g->vocab, "dim",
        (json_int_t)g->channels, "positions", 0, "type", "repeat", "count", (json_int_t)g->layers,
        "layers", "type", "residual", "layers", "type", "rmsnorm", "eps", g->eps, attn, "type",
        "residual", "layers", "type", "rmsnorm", "eps", g->eps, "type", "swiglu", "hidden",
        (json_int_t)g->inner, "bias", c->mlp_bias, "type", "rmsnorm", "eps", g->eps, "type",
        "linear", "out", (json_int_t)g->vocab, "bias", 0, "tied", g->tied);
    text = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    return text;
}

/* The tensors ---------------------------------------------------------------------- */

/* One tandem tensor of shape (rows, cols) (cols 0: a vector) stacked from
 * the transformers tensors names[0..n) (NULL-terminated), each of rows[i]
 * rows, in that order. */
static td_status stack(td__hf_folder *f, const llama_cfg *c, td__ckpt_list *out, const char *tandem,
                       const char *const *names, const int64_t *rows, int64_t cols) {
    int64_t total = 0, shape[2];
    size_t at = 0;
    float *data;
    for (int i = 0; names[i]; i++)
        total += rows[i];
    if (!(data = td__aligned_alloc((size_t)total * (size_t)(cols ? cols : 1) * sizeof *data,
                                   "a converted tensor")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int i = 0; names[i]; i++) {
        td_status st;
        shape[0] = rows[i];
        shape[1] = cols;
        if ((st = td__hf_take(f, names[i], cols ? 2 : 1, shape, 0, c->sizes, data + at)) != TD_OK) {
            free(data);
            return st;
        }
        at += (size_t)rows[i] * (size_t)(cols ? cols : 1);
    }
    shape[0] = total;
    shape[1] = cols;
    return td__ckpt_list_add(out, tandem, cols ? 2 : 1, shape, data, 1);
}

/* One transformers tensor as one tandem tensor. */
static td_status one(td__hf_folder *f, const llama_cfg *c, td__ckpt_list *out, const char *tandem,
                     const char *name, int64_t rows, int64_t cols) {
    const char *names[] = {name, NULL};
    return stack(f, c, out, tandem, names, &rows, cols);
}

static td_status take_block(td__hf_folder *f, const llama_cfg *c, td__ckpt_list *out, int64_t b) {
    const td_hf_info *g = &c->info;
    int64_t d = g->channels / g->heads, C = g->channels, a = 1 + 2 * b, m = 2 + 2 * b;
    int64_t qkv_rows[3] = {g->heads * d, g->kv_heads * d, g->kv_heads * d};
    int64_t gu_rows[2] = {g->inner, g->inner};
    char t[96], h[8][128];
    const char *qkv_w[] = {h[0], h[1], h[2], NULL}, *qkv_b[] = {h[3], h[4], h[5], NULL};
    const char *gu[] = {h[6], h[7], NULL};
    static const char *const p[] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; i++) {
        snprintf(h[i], sizeof h[i], "model.layers.%lld.self_attn.%s.weight", (long long)b, p[i]);
        snprintf(h[3 + i], sizeof h[i], "model.layers.%lld.self_attn.%s.bias", (long long)b, p[i]);
    }
    snprintf(t, sizeof t, "layers.%lld.0.weight", (long long)a);
    snprintf(h[6], sizeof h[6], "model.layers.%lld.input_layernorm.weight", (long long)b);
    TD_CHECK(one(f, c, out, t, h[6], C, 0));
    snprintf(t, sizeof t, "layers.%lld.1.qkv.weight", (long long)a);
    TD_CHECK(stack(f, c, out, t, qkv_w, qkv_rows, C));
    if (g->qkv_bias) {
        snprintf(t, sizeof t, "layers.%lld.1.qkv.bias", (long long)a);
        TD_CHECK(stack(f, c, out, t, qkv_b, qkv_rows, 0));
    }
    snprintf(t, sizeof t, "layers.%lld.1.proj.weight", (long long)a);
    snprintf(h[6], sizeof h[6], "model.layers.%lld.self_attn.o_proj.weight", (long long)b);
    TD_CHECK(one(f, c, out, t, h[6], C, C));
    if (c->proj_bias) {
        snprintf(t, sizeof t, "layers.%lld.1.proj.bias", (long long)a);
        snprintf(h[6], sizeof h[6], "model.layers.%lld.self_attn.o_proj.bias", (long long)b);
        TD_CHECK(one(f, c, out, t, h[6], C, 0));
    }
    snprintf(t, sizeof t, "layers.%lld.0.weight", (long long)m);
    snprintf(h[6], sizeof h[6], "model.layers.%lld.post_attention_layernorm.weight", (long long)b);
    TD_CHECK(one(f, c, out, t, h[6], C, 0));
    for (int bias = 0; bias <= c->mlp_bias; bias++) {
        const char *w = bias ? "bias" : "weight";
        snprintf(t, sizeof t, "layers.%lld.1.gate_up.%s", (long long)m, w);
        snprintf(h[6], sizeof h[6], "model.layers.%lld.mlp.gate_proj.%s", (long long)b, w);
        snprintf(h[7], sizeof h[7], "model.layers.%lld.mlp.up_proj.%s", (long long)b, w);
        TD_CHECK(stack(f, c, out, t, gu, gu_rows, bias ? 0 : C));
    }
    for (int bias = 0; bias <= c->mlp_bias; bias++) {
        const char *w = bias ? "bias" : "weight";
        snprintf(t, sizeof t, "layers.%lld.1.down.%s", (long long)m, w);
        snprintf(h[6], sizeof h[6], "model.layers.%lld.mlp.down_proj.%s", (long long)b, w);
        TD_CHECK(one(f, c, out, t, h[6], C, bias ? 0 : g->inner));
    }
    return TD_OK;
}

/* Buffers older versions saved (rotary_emb.inv_freq): not parameters. */
static int ignorable(const char *name) {
    size_t n = strlen(name);
    return n > 21 && !strcmp(name + n - 21, ".rotary_emb.inv_freq");
}

/* Every parameter in tandem's order: embedding, blocks, final norm, head. */
static td_status take_all(td__hf_folder *f, const llama_cfg *c, td__ckpt_list *out) {
    const td_hf_info *g = &c->info;
    char t[64];
    TD_CHECK(
        one(f, c, out, "layers.0.wte.weight", "model.embed_tokens.weight", g->vocab, g->channels));
    for (int64_t b = 0; b < g->layers; b++)
        TD_CHECK(take_block(f, c, out, b));
    snprintf(t, sizeof t, "layers.%lld.weight", (long long)(1 + 2 * g->layers));
    TD_CHECK(one(f, c, out, t, "model.norm.weight", g->channels, 0));
    snprintf(t, sizeof t, "layers.%lld.weight", (long long)(2 + 2 * g->layers));
    if (!g->tied)
        TD_CHECK(one(f, c, out, t, "lm_head.weight", g->vocab, g->channels));
    else
        td__hf_ignore(f, "lm_head.weight"); /* a tied head's copy of embed_tokens */
    return td__hf_check_all_used(f, ignorable, g->arch);
}

static td_status import_llama(const char *dir, td__hf_folder *f, family fam, const char *arch,
                              const char *out, const td_train_state *state, td_hf_info *info) {
    llama_cfg c;
    td__ckpt_list list;
    char *json = NULL;
    td_status st;
    memset(&c, 0, sizeof c);
    memset(&list, 0, sizeof list);
    c.fam = fam;
    c.info.arch = arch;
    TD_TRY(read_config(f, &c));
    TD_TRY(td__hf_open_weights(dir, f));
    TD_TRY(take_all(f, &c, &list));
    if (!(json = model_json(&c, arch))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "out of memory writing a model JSON");
        goto fail;
    }
    TD_TRY(td__ckpt_list_save(&list, out, json, f->cfg_path, state, &c.info.weights));
    if (info)
        *info = c.info;
fail:
    free(json);
    td__ckpt_list_free(&list);
    return st;
}

/* Choosing the importer ---------------------------------------------------------------- */

static const struct {
    const char *model_type, *arch;
    int fam; /* -1: GPT-2 */
} known[] = {
    {"gpt2", "GPT2LMHeadModel", -1},
    {"gpt2", "GPT2Model", -1}, /* without a head: tied to the embedding */
    {"llama", "LlamaForCausalLM", LLAMA},
    {"qwen2", "Qwen2ForCausalLM", QWEN2},
    {"mistral", "MistralForCausalLM", MISTRAL},
};

#define NKNOWN (sizeof known / sizeof *known)

/* The entry of known[] config.json names: architectures' first name that
 * tandem knows, else model_type's; -1 after an error listing them. */
static int pick(const td__hf_folder *f) {
    json_t *arch = json_object_get(f->cfg, "architectures"),
           *type = json_object_get(f->cfg, "model_type"), *a;
    const char *what = "?", *key = "architectures";
    char list[256] = "";
    size_t i;
    json_array_foreach(arch, i, a) {
        for (size_t k = 0; json_is_string(a) && k < NKNOWN; k++)
            if (!strcmp(json_string_value(a), known[k].arch))
                return (int)k;
        if (i == 0 && json_is_string(a))
            what = json_string_value(a);
    }
    if (!json_array_size(arch)) {
        key = "model_type";
        for (size_t k = 0; json_is_string(type) && k < NKNOWN; k++)
            if (!strcmp(json_string_value(type), known[k].model_type))
                return (int)k;
        if (json_is_string(type))
            what = json_string_value(type);
    }
    for (size_t k = 0; k < NKNOWN; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s (\"%s\")", k ? ", " : "",
                 known[k].arch, known[k].model_type);
    td__error(TD_ERR_UNSUPPORTED, "%s: \"%s\": \"%.64s\": tandem converts %s", f->cfg_path, key,
              what, list);
    return -1;
}

td_status td_import_hf(const char *dir, const char *out, const td_train_state *state,
                       td_hf_info *info) {
    td__hf_folder f;
    td_gpt2_info g;
    td_status st;
    int k;
    memset(&f, 0, sizeof f);
    if (!dir || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_import_hf: dir or out is NULL");
    TD_TRY(td__hf_open_config(dir, &f));
    if ((k = pick(&f)) < 0) {
        st = TD_ERR_UNSUPPORTED;
        goto fail;
    }
    if (known[k].fam < 0) {
        td__hf_close(&f);
        TD_CHECK(td_import_hf_gpt2(dir, out, state, &g));
        if (info) {
            memset(info, 0, sizeof *info);
            info->arch = known[k].arch;
            info->context = g.context, info->vocab = g.vocab, info->layers = g.layers;
            info->heads = info->kv_heads = g.heads;
            info->channels = g.channels, info->inner = g.inner, info->eps = g.eps;
            info->tied = g.tied, info->qkv_bias = 1, info->weights = g.weights;
        }
        return TD_OK;
    }
    st = import_llama(dir, &f, (family)known[k].fam, known[k].arch, out, state, info);
fail:
    td__hf_close(&f);
    return st;
}
