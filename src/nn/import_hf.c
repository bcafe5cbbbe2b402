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
#include "nn/hf-impl.h"
#include "nn/import-impl.h"

typedef struct hf_src {
    td__hf_folder f;
    const char *prefix; /* "transformer." (GPT2LMHeadModel) or "" (GPT2Model) */
} hf_src;

static td_status cfg_error(const hf_src *s, const char *key, const char *what) {
    return td__hf_cfg_error(&s->f, key, what);
}

static td_status cfg_bool(const hf_src *s, const char *key, int def, int *out) {
    return td__hf_bool(&s->f, key, def, out);
}

/* model_type "gpt2" and architectures naming GPT2LMHeadModel or GPT2Model,
 * where present; one of them must be. */
static td_status check_architecture(const hf_src *s) {
    json_t *type = json_object_get(s->f.cfg, "model_type"),
           *arch = json_object_get(s->f.cfg, "architectures");
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
    json_t *v = json_object_get(s->f.cfg, "activation_function");
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
    return td__error(TD_ERR_UNSUPPORTED, "%s: \"activation_function\": %s", s->f.cfg_path, msg);
}

/* Options that change what GPT-2 computes, which tandem's attention does not do. */
static td_status check_attention_options(const hf_src *s) {
    int v;
    TD_CHECK(cfg_bool(s, "scale_attn_weights", 1, &v));
    if (!v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"scale_attn_weights\": false; tandem's attention always scales "
                         "the scores by 1/sqrt(head size)",
                         s->f.cfg_path);
    TD_CHECK(cfg_bool(s, "scale_attn_by_inverse_layer_idx", 0, &v));
    if (v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"scale_attn_by_inverse_layer_idx\": true is not implemented",
                         s->f.cfg_path);
    TD_CHECK(cfg_bool(s, "add_cross_attention", 0, &v));
    if (v)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: \"add_cross_attention\": true; tandem's GPT-2 is a decoder only",
                         s->f.cfg_path);
    return TD_OK;
}

static td_status read_config(hf_src *s, td__gpt2_out *o) {
    static const char *const fields[] = {"n_positions", "vocab_size", "n_layer",           "n_head",
                                         "n_embd",      "n_inner",    "layer_norm_epsilon"};
    td_gpt2_info *g = &o->info;
    const td__hf_folder *f = &s->f;
    TD_CHECK(check_architecture(s));
    TD_CHECK(td__hf_int(f, "n_embd", 1, 0, &g->channels));
    TD_CHECK(td__hf_int(f, "n_layer", 1, 0, &g->layers));
    TD_CHECK(td__hf_int(f, "n_head", 1, 0, &g->heads));
    TD_CHECK(td__hf_int(f, "vocab_size", 1, 0, &g->vocab));
    /* older configs name the context n_ctx */
    TD_CHECK(td__hf_int(f, "n_positions", !json_object_get(f->cfg, "n_ctx"), 0, &g->context));
    if (!json_object_get(f->cfg, "n_positions"))
        TD_CHECK(td__hf_int(f, "n_ctx", 1, 0, &g->context));
    TD_CHECK(td__hf_int(f, "n_inner", 0, 4 * g->channels, &g->inner));
    TD_CHECK(td__hf_number(f, "layer_norm_epsilon", 1e-5, &g->eps));
    TD_CHECK(cfg_bool(s, "tie_word_embeddings", 1, &g->tied));
    TD_CHECK(cfg_activation(s, &o->act));
    TD_CHECK(check_attention_options(s));
    return td__gpt2_check(g, f->cfg_path, fields);
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

/* The tensor of kind k of block b, checked against config.json's shape,
 * converted to f32 and, for a Conv1D weight, transposed to (out, in). */
static td_status take(hf_src *s, td__gpt2_out *o, td__gpt2_kind k, int64_t b) {
    char name[160], sizes[256];
    int64_t want[2];
    int conv = hf_name(s, k, b, name, sizeof name), nd = td__gpt2_shape(&o->info, k, want);
    float *out;
    size_t numel = (size_t)want[0] * (nd == 2 ? (size_t)want[1] : 1);
    td_status st;
    snprintf(sizes, sizeof sizes,
             "n_embd = %lld, n_inner = %lld, vocab_size = %lld, n_positions = %lld, n_layer = "
             "%lld",
             (long long)o->info.channels, (long long)o->info.inner, (long long)o->info.vocab,
             (long long)o->info.context, (long long)o->info.layers);
    if (!(out = td__aligned_alloc(numel * sizeof *out, "a converted tensor")))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td__hf_take(&s->f, name, nd, want, conv, sizes, out)) != TD_OK) {
        free(out);
        return st;
    }
    return td__gpt2_add(o, k, b, out, 1);
}

/* GPT2LMHeadModel's names start with "transformer.", GPT2Model's do not. */
static td_status find_prefix(hf_src *s) {
    if (td__hf_find(&s->f, "transformer.wte.weight", NULL))
        s->prefix = "transformer.";
    else if (td__hf_find(&s->f, "wte.weight", NULL))
        s->prefix = "";
    else
        return td__error(TD_ERR_SHAPE,
                         "%s: no tensor \"transformer.wte.weight\" (nor \"wte.weight\"): not "
                         "the weights of a GPT-2",
                         s->f.paths[0]);
    return TD_OK;
}

/* The attention's causal-mask buffers older versions saved: not parameters. */
static int ignorable(const char *name) {
    size_t n = strlen(name);
    if (!strncmp(name, "transformer.", 12))
        name += 12, n -= 12;
    if (strncmp(name, "h.", 2) != 0)
        return 0;
    return (n > 10 && !strcmp(name + n - 10, ".attn.bias")) ||
           (n > 17 && !strcmp(name + n - 17, ".attn.masked_bias"));
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
    else
        td__hf_ignore(&s->f, "lm_head.weight"); /* a tied head's copy of wte */
    return td__hf_check_all_used(&s->f, ignorable, "GPT-2");
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
    TD_TRY(td__hf_open_config(dir, &s.f));
    TD_TRY(read_config(&s, &o));
    TD_TRY(td__hf_open_weights(dir, &s.f));
    TD_TRY(find_prefix(&s));
    TD_TRY(take_all(&s, &o));
    TD_TRY(td__gpt2_save(&o, out, state, info));
fail:
    td__gpt2_free(&o);
    td__hf_close(&s.f);
    return st;
}
