/* Hugging Face's GPT-2 (GPT2LMHeadModel.save_pretrained: config.json and
 * model.safetensors) into a tandem checkpoint.
 *
 * transformers' GPT-2 computes its projections with Conv1D, whose weight is
 * stored (in, out), the transpose of a torch.nn.Linear's (out, in) that
 * tandem's linear and attention layers hold: those four weights per block are
 * transposed here. c_attn holds q, k and v side by side with the heads inside
 * each, as tandem's qkv does, so it is taken as it is. The head is tied to
 * wte unless config.json says tie_word_embeddings = false; save_pretrained
 * then writes lm_head.weight, and otherwise leaves it out. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "core/text.h"
#include "nn/import-impl.h"
#include "nn/safetensors-impl.h"

/* A config.json larger than this is no GPT-2's. */
#define CONFIG_MAX_BYTES ((size_t)16 << 20)

typedef struct hf_src {
    char cfg_path[4096], st_path[4096];
    json_t *cfg;
    td_safetensors *st;
    const char *prefix; /* "transformer." (GPT2LMHeadModel) or "" (GPT2Model) */
    char *used;         /* per tensor of st: converted or known to be no parameter */
} hf_src;

/* config.json ---------------------------------------------------------------------- */

static td_status cfg_error(const hf_src *s, const char *key, const char *what) {
    return td__error(TD_ERR_PARSE, "%s: \"%s\": %s", s->cfg_path, key, what);
}

/* An integer field; absent or null gives def unless required. */
static td_status cfg_int(const hf_src *s, const char *key, int required, int64_t def,
                         int64_t *out) {
    json_t *v = json_object_get(s->cfg, key);
    if (!v || json_is_null(v)) {
        if (required)
            return cfg_error(s, key, "missing (a required integer)");
        *out = def;
        return TD_OK;
    }
    if (!json_is_integer(v))
        return cfg_error(s, key, "expected an integer");
    *out = json_integer_value(v);
    return TD_OK;
}

static td_status cfg_bool(const hf_src *s, const char *key, int def, int *out) {
    json_t *v = json_object_get(s->cfg, key);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_boolean(v))
        return cfg_error(s, key, "expected true or false");
    *out = json_is_true(v);
    return TD_OK;
}

/* model_type "gpt2" and architectures naming GPT2LMHeadModel or GPT2Model,
 * where present; one of them must be. */
static td_status check_architecture(const hf_src *s) {
    json_t *type = json_object_get(s->cfg, "model_type"),
           *arch = json_object_get(s->cfg, "architectures");
    json_t *a;
    size_t i;
    int found = 0;
    char msg[256];
    if (!type && !arch)
        return cfg_error(s, "model_type",
                         "missing, and so is \"architectures\": nothing says this is a GPT-2");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "gpt2") != 0)) {
        snprintf(msg, sizeof msg, "\"%.64s\": tandem converts GPT-2 (\"gpt2\") only",
                 json_is_string(type) ? json_string_value(type) : "?");
        return cfg_error(s, "model_type", msg);
    }
    if (!arch)
        return TD_OK;
    if (!json_is_array(arch))
        return cfg_error(s, "architectures", "expected an array of names");
    json_array_foreach(arch, i, a) {
        const char *n = json_is_string(a) ? json_string_value(a) : "";
        found |= !strcmp(n, "GPT2LMHeadModel") || !strcmp(n, "GPT2Model");
    }
    if (found)
        return TD_OK;
    a = json_array_get(arch, 0);
    snprintf(msg, sizeof msg, "\"%.64s\": tandem converts GPT2LMHeadModel (or GPT2Model) only",
             json_is_string(a) ? json_string_value(a) : "?");
    return cfg_error(s, "architectures", msg);
}

/* activation_function, as transformers' ACT2FN names them, onto tandem's. */
static td_status cfg_activation(const hf_src *s, td_act *act) {
    static const struct {
        const char *name;
        td_act act;
    } acts[] = {
        {"gelu_new", TD_ACT_GELU_TANH},  {"gelu_pytorch_tanh", TD_ACT_GELU_TANH},
        {"gelu_fast", TD_ACT_GELU_TANH}, {"gelu", TD_ACT_GELU},
        {"relu", TD_ACT_RELU},           {"tanh", TD_ACT_TANH},
        {"sigmoid", TD_ACT_SIGMOID},
    };
    json_t *v = json_object_get(s->cfg, "activation_function");
    char msg[256];
    if (!v) {
        *act = TD_ACT_GELU_TANH; /* GPT2Config's default, "gelu_new" */
        return TD_OK;
    }
    for (size_t i = 0; json_is_string(v) && i < sizeof acts / sizeof *acts; i++)
        if (!strcmp(json_string_value(v), acts[i].name)) {
            *act = acts[i].act;
            return TD_OK;
        }
    snprintf(msg, sizeof msg,
             "\"%.64s\" is not an activation tandem has (gelu_new, gelu_pytorch_tanh, "
             "gelu_fast, gelu, relu, tanh, sigmoid)",
             json_is_string(v) ? json_string_value(v) : "?");
    return td__error(TD_ERR_UNSUPPORTED, "%s: \"activation_function\": %s", s->cfg_path, msg);
}

/* Options that change what GPT-2 computes, which tandem's attention does not do. */
static td_status check_attention_options(const hf_src *s) {
    int v;
    TD_CHECK(cfg_bool(s, "scale_attn_weights", 1, &v));
    if (!v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"scale_attn_weights\": false; tandem's attention always scales "
                         "the scores by 1/sqrt(head size)",
                         s->cfg_path);
    TD_CHECK(cfg_bool(s, "scale_attn_by_inverse_layer_idx", 0, &v));
    if (v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"scale_attn_by_inverse_layer_idx\": true is not implemented",
                         s->cfg_path);
    TD_CHECK(cfg_bool(s, "add_cross_attention", 0, &v));
    if (v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"add_cross_attention\": true; tandem's GPT-2 is a decoder only",
                         s->cfg_path);
    return TD_OK;
}

static td_status read_config(hf_src *s, td__gpt2_out *o) {
    static const char *const fields[] = {"n_positions", "vocab_size", "n_layer",           "n_head",
                                         "n_embd",      "n_inner",    "layer_norm_epsilon"};
    td_gpt2_info *g = &o->info;
    json_t *eps;
    TD_CHECK(td__read_json_file(s->cfg_path, CONFIG_MAX_BYTES, 0, &s->cfg));
    if (!json_is_object(s->cfg))
        return td__error(TD_ERR_PARSE, "%s: expected a JSON object", s->cfg_path);
    TD_CHECK(check_architecture(s));
    TD_CHECK(cfg_int(s, "n_embd", 1, 0, &g->channels));
    TD_CHECK(cfg_int(s, "n_layer", 1, 0, &g->layers));
    TD_CHECK(cfg_int(s, "n_head", 1, 0, &g->heads));
    TD_CHECK(cfg_int(s, "vocab_size", 1, 0, &g->vocab));
    /* older configs name the context n_ctx */
    TD_CHECK(cfg_int(s, "n_positions", !json_object_get(s->cfg, "n_ctx"), 0, &g->context));
    if (!json_object_get(s->cfg, "n_positions"))
        TD_CHECK(cfg_int(s, "n_ctx", 1, 0, &g->context));
    TD_CHECK(cfg_int(s, "n_inner", 0, 4 * g->channels, &g->inner));
    eps = json_object_get(s->cfg, "layer_norm_epsilon");
    if (eps && !json_is_number(eps))
        return cfg_error(s, "layer_norm_epsilon", "expected a number");
    g->eps = eps ? json_number_value(eps) : 1e-5;
    TD_CHECK(cfg_bool(s, "tie_word_embeddings", 1, &g->tied));
    TD_CHECK(cfg_activation(s, &o->act));
    TD_CHECK(check_attention_options(s));
    return td__gpt2_check(g, s->cfg_path, fields);
}

/* model.safetensors ------------------------------------------------------------------ */

/* The Hugging Face name of kind k of block b, and whether it is a Conv1D
 * weight, stored (in, out). */
static int hf_name(const hf_src *s, td__gpt2_kind k, int64_t b, char *buf, size_t n) {
    static const struct {
        const char *name;
        int conv1d;
    } names[TD__G_KINDS] = {
        [TD__G_WTE] = {"wte.weight", 0},
        [TD__G_WPE] = {"wpe.weight", 0},
        [TD__G_LN1W] = {"ln_1.weight", 0},
        [TD__G_LN1B] = {"ln_1.bias", 0},
        [TD__G_QKVW] = {"attn.c_attn.weight", 1},
        [TD__G_QKVB] = {"attn.c_attn.bias", 0},
        [TD__G_ATTPROJW] = {"attn.c_proj.weight", 1},
        [TD__G_ATTPROJB] = {"attn.c_proj.bias", 0},
        [TD__G_LN2W] = {"ln_2.weight", 0},
        [TD__G_LN2B] = {"ln_2.bias", 0},
        [TD__G_FCW] = {"mlp.c_fc.weight", 1},
        [TD__G_FCB] = {"mlp.c_fc.bias", 0},
        [TD__G_FCPROJW] = {"mlp.c_proj.weight", 1},
        [TD__G_FCPROJB] = {"mlp.c_proj.bias", 0},
        [TD__G_LNFW] = {"ln_f.weight", 0},
        [TD__G_LNFB] = {"ln_f.bias", 0},
        [TD__G_HEAD] = {"lm_head.weight", 0},
    };
    if (k == TD__G_HEAD)
        snprintf(buf, n, "%s", names[k].name); /* beside "transformer", not in it */
    else if (td__gpt2_per_block(k))
        snprintf(buf, n, "%sh.%lld.%s", s->prefix, (long long)b, names[k].name);
    else
        snprintf(buf, n, "%s%s", s->prefix, names[k].name);
    return names[k].conv1d;
}

/* IEEE half and bfloat16 to float. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    float f;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp != 0)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0)
        bits = sign;
    else {
        /* subnormal: man * 2^-24 */
        f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of a tensor's bytes p (possibly unaligned) as a float, one
 * function per dtype of the file. */
typedef float (*element_fn)(const unsigned char *p, size_t i);

static float f32_at(const unsigned char *p, size_t i) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

static float f64_at(const unsigned char *p, size_t i) {
    double d;
    memcpy(&d, p + 8 * i, 8);
    return (float)d;
}

static float f16_at(const unsigned char *p, size_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return half_to_float(h);
}

/* bfloat16: the top half of a float */
static float bf16_at(const unsigned char *p, size_t i) {
    uint16_t h;
    uint32_t bits;
    float f;
    memcpy(&h, p + 2 * i, 2);
    bits = (uint32_t)h << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static element_fn element_of(const char *dtype) {
    return !strcmp(dtype, "F32")    ? f32_at
           : !strcmp(dtype, "F64")  ? f64_at
           : !strcmp(dtype, "F16")  ? f16_at
           : !strcmp(dtype, "BF16") ? bf16_at
                                    : NULL;
}

/* The tensor of kind k of block b, checked against config.json's shape,
 * converted to f32 and, for a Conv1D weight, transposed to (out, in). */
static td_status take(hf_src *s, td__gpt2_out *o, td__gpt2_kind k, int64_t b) {
    char name[160], want_s[64], got_s[64];
    int64_t want[2];
    int conv = hf_name(s, k, b, name, sizeof name), nd = td__gpt2_shape(&o->info, k, want);
    const td_st_tensor *t = td_safetensors_find(s->st, name);
    const char *dtype;
    element_fn at;
    float *out;
    if (!t)
        return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" is missing (%s: n_layer = %lld)",
                         s->st_path, name, s->cfg_path, (long long)o->info.layers);
    if (conv) { /* stored (in, out) */
        int64_t tmp = want[0];
        want[0] = want[1];
        want[1] = tmp;
    }
    if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1]))
        return td__error(TD_ERR_SHAPE,
                         "%s: tensor \"%s\" is %s; %s (n_embd %lld, n_inner %lld, vocab_size "
                         "%lld, n_positions %lld) says %s",
                         s->st_path, name, td__shape_text(t->shape, t->ndim, got_s), s->cfg_path,
                         (long long)o->info.channels, (long long)o->info.inner,
                         (long long)o->info.vocab, (long long)o->info.context,
                         td__shape_text(want, nd, want_s));
    dtype = td__safetensors_dtype(s->st, t);
    if (!(at = element_of(dtype)))
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: tensor \"%s\" is %s; weights are F32, F64, F16 or BF16", s->st_path,
                         name, dtype);
    if (!(out = td__aligned_alloc(t->numel * sizeof *out, "a converted tensor")))
        return TD_ERR_OUT_OF_MEMORY;
    if (conv) {
        /* out (out_features, in_features) = t^T, t (in_features, out_features) */
        size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++)
                out[j * rows + i] = at(t->data, i * cols + j);
    } else {
        for (size_t i = 0; i < t->numel; i++)
            out[i] = at(t->data, i);
    }
    s->used[t - td_safetensors_tensor(s->st, 0)] = 1;
    return td__gpt2_add(o, k, b, out, 1);
}

/* GPT2LMHeadModel's names start with "transformer.", GPT2Model's do not. */
static td_status find_prefix(hf_src *s) {
    if (td_safetensors_find(s->st, "transformer.wte.weight"))
        s->prefix = "transformer.";
    else if (td_safetensors_find(s->st, "wte.weight"))
        s->prefix = "";
    else
        return td__error(TD_ERR_SHAPE,
                         "%s: no tensor \"transformer.wte.weight\" (nor \"wte.weight\"): not "
                         "the weights of a GPT-2",
                         s->st_path);
    return TD_OK;
}

/* The attention's causal-mask buffers older versions saved, and a tied
 * head's copy of wte: not parameters. */
static int ignorable(const hf_src *s, const char *name, int tied) {
    size_t np = strlen(s->prefix), n = strlen(name);
    if (tied && !strcmp(name, "lm_head.weight"))
        return 1;
    if (strncmp(name, s->prefix, np) != 0 || strncmp(name + np, "h.", 2) != 0)
        return 0;
    return (n > 10 && !strcmp(name + n - 10, ".attn.bias")) ||
           (n > 17 && !strcmp(name + n - 17, ".attn.masked_bias"));
}

/* Every tensor of the file must have been converted or be ignorable: one
 * more (a layer beyond n_layer, say) means config.json describes another
 * model. */
static td_status check_all_used(const hf_src *s, int tied) {
    for (size_t i = 0; i < td_safetensors_count(s->st); i++) {
        const char *name = td_safetensors_tensor(s->st, i)->name;
        if (!s->used[i] && !ignorable(s, name, tied))
            return td__error(TD_ERR_SHAPE,
                             "%s: tensor \"%s\" is not part of the GPT-2 that %s describes",
                             s->st_path, name, s->cfg_path);
    }
    return TD_OK;
}

/* Every parameter in tandem's order: embedding, blocks, final norm, head. */
static td_status take_all(hf_src *s, td__gpt2_out *o) {
    TD_CHECK(take(s, o, TD__G_WTE, 0));
    TD_CHECK(take(s, o, TD__G_WPE, 0));
    for (int64_t b = 0; b < o->info.layers; b++)
        for (int k = TD__G_LN1W; k <= TD__G_FCPROJB; k++)
            TD_CHECK(take(s, o, (td__gpt2_kind)k, b));
    TD_CHECK(take(s, o, TD__G_LNFW, 0));
    TD_CHECK(take(s, o, TD__G_LNFB, 0));
    if (!o->info.tied)
        TD_CHECK(take(s, o, TD__G_HEAD, 0));
    return check_all_used(s, o->info.tied);
}

td_status td_import_hf_gpt2(const char *dir, const char *out, const td_train_state *state,
                            td_gpt2_info *info) {
    hf_src s;
    td__gpt2_out o;
    td_status st;
    memset(&s, 0, sizeof s);
    memset(&o, 0, sizeof o);
    if (!dir || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_import_hf_gpt2: dir or out is NULL");
    o.source = "Hugging Face transformers";
    snprintf(s.cfg_path, sizeof s.cfg_path, "%s/config.json", dir);
    snprintf(s.st_path, sizeof s.st_path, "%s/model.safetensors", dir);
    TD_TRY(read_config(&s, &o));
    TD_TRY(td__safetensors_load_any(s.st_path, &s.st));
    if (!(s.used = td__calloc(td_safetensors_count(s.st) + 1, "a tensor list"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    TD_TRY(find_prefix(&s));
    TD_TRY(take_all(&s, &o));
    TD_TRY(td__gpt2_save(&o, out, state, info));
fail:
    td__gpt2_free(&o);
    free(s.used);
    td_safetensors_destroy(s.st);
    json_decref(s.cfg);
    return st;
}
