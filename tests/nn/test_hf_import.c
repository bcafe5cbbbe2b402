/* The Llama family from transformers against transformers itself: the
 * fixtures in tests/fixtures/hf (made by scripts/make_hf_fixtures with
 * PyTorch, which CI never runs) hold a small random LlamaForCausalLM (bf16,
 * 6 query heads on 3 key/value heads, Llama 3's rope_scaling, untied),
 * Qwen2ForCausalLM (f16, 6 on 2, q/k/v biases, tied) and MistralForCausalLM
 * (f32 in two shards, 4 on 1, untied) as save_pretrained wrote them, with
 * the logits and greedy tokens transformers computed from those weights.
 * Converted by td_import_hf, each must give those logits (f32 within 1e-5
 * of the largest logit, f64 within 1e-12; through the full forward and the
 * KV-cache decoder) and those tokens; and bad folders must fail with
 * messages naming the file and the field. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/full_logits.h"
#include "support/support.h"

#define FIXTURES TD_SOURCE_DIR "/tests/fixtures/hf"

enum { T_MAX = 64 };

typedef struct reference {
    json_t *json;
    int32_t tokens[T_MAX], prompt[T_MAX], greedy[T_MAX];
    int64_t ntokens, nprompt, ngreedy, vocab;
    double *logits32, *logits64; /* (ntokens, vocab) */
    char ckpt[512];
    td_hf_info info;
} reference;

static int64_t read_ints(json_t *arr, int32_t *out) {
    size_t i;
    json_t *v;
    assert_true(json_is_array(arr) && json_array_size(arr) <= T_MAX);
    json_array_foreach(arr, i, v) out[i] = (int32_t)json_integer_value(v);
    return (int64_t)json_array_size(arr);
}

static double *read_logits(const td_safetensors *st, const char *name, td_dtype dt, reference *r) {
    const td_st_tensor *t = td_safetensors_find(st, name);
    double *out;
    assert_non_null(t);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], r->ntokens);
    r->vocab = t->shape[1];
    out = malloc(sizeof(double) * t->numel);
    for (size_t i = 0; i < t->numel; i++) {
        if (dt == TD_F32) {
            float f;
            memcpy(&f, (const char *)t->data + 4 * i, 4);
            out[i] = f;
        } else {
            memcpy(&out[i], (const char *)t->data + 8 * i, 8);
        }
    }
    return out;
}

/* Reads the fixture `name` and converts it into the test's folder. */
static void load_reference(const char *name, reference *r) {
    char path[512];
    json_error_t e;
    td_safetensors *st = NULL;
    memset(r, 0, sizeof *r);
    snprintf(path, sizeof path, FIXTURES "/%s/reference.json", name);
    r->json = json_load_file(path, 0, &e);
    assert_non_null(r->json);
    r->ntokens = read_ints(json_object_get(r->json, "tokens"), r->tokens);
    r->nprompt = read_ints(json_object_get(r->json, "greedy_prompt"), r->prompt);
    r->ngreedy = read_ints(json_object_get(r->json, "greedy_tokens"), r->greedy);
    snprintf(path, sizeof path, FIXTURES "/%s/reference.safetensors", name);
    TD_ASSERT_OK(td_safetensors_load(path, &st));
    r->logits32 = read_logits(st, "logits_f32", TD_F32, r);
    r->logits64 = read_logits(st, "logits_f64", TD_F64, r);
    td_safetensors_destroy(st);
    snprintf(path, sizeof path, "%s.safetensors", name);
    snprintf(r->ckpt, sizeof r->ckpt, "%s", td_test_tmp(path));
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    TD_ASSERT_OK(td_import_hf(path, r->ckpt, NULL, &r->info));
}

static void free_reference(reference *r) {
    json_decref(r->json);
    free(r->logits32);
    free(r->logits64);
}

/* Fails unless row got (V) is want (V) within tol of the row's largest logit. */
static void expect_row(const reference *r, const double *got, const double *want, double tol,
                       const char *how, int64_t pos) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < r->vocab; i++)
        scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < r->vocab; i++)
        worst = fmax(worst, fabs(got[i] - want[i]));
    if (!(worst <= tol * scale))
        fail_msg("%s: %s: position %lld: logits differ from transformers' by %g (tolerance %g)",
                 r->info.arch, how, (long long)pos, worst, tol * scale);
}

/* The checkpoint's logits of the reference tokens, by the full forward and
 * by the decoder (a prefill of each length, and steps after one token). */
static void logits_match(const reference *r, td_dtype dt, const double *want, double tol) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_decoder *d = NULL;
    int64_t n = r->ntokens, V = r->vocab;
    double *full = malloc(sizeof(double) * (size_t)(n * V)), *row = malloc(sizeof(double) * V);
    TD_ASSERT_OK(td_generate_load_model(r->ckpt, td_device_list_get(list, 0), dt, &m));
    assert_int_equal(td_model_num_classes(m), V);
    td_test_full_logits(m, r->tokens, n, full);
    for (int64_t p = 0; p < n; p++)
        expect_row(r, full + p * V, want + p * V, tol, "forward", p);
    TD_ASSERT_OK(td_decoder_create(m, &d));
    for (int64_t k = 1; k <= n; k += 7) {
        TD_ASSERT_OK(td_decoder_prefill(d, r->tokens, k, row));
        expect_row(r, row, want + (k - 1) * V, tol, "prefill", k - 1);
    }
    TD_ASSERT_OK(td_decoder_prefill(d, r->tokens, 1, NULL));
    for (int64_t p = 1; p < n; p++) {
        TD_ASSERT_OK(td_decoder_step(d, r->tokens[p], row));
        expect_row(r, row, want + p * V, tol, "step", p);
    }
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free(full);
    free(row);
}

typedef struct sink {
    int32_t v[T_MAX];
    int64_t n;
} sink;

static int collect(void *arg, int32_t token) {
    sink *s = arg;
    if (s->n < T_MAX)
        s->v[s->n++] = token;
    return 0;
}

/* transformers' generate(do_sample=False) in f32, token for token. */
static void greedy_match(const reference *r) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_decoder *d = NULL;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    sink s = {{0}, 0};
    TD_ASSERT_OK(td_generate_load_model(r->ckpt, td_device_list_get(list, 0), TD_F32, &m));
    TD_ASSERT_OK(td_decoder_create(m, &d));
    cfg.tokens = r->ngreedy;
    cfg.temperature = 0;
    TD_ASSERT_OK(td_generate(d, r->prompt, r->nprompt, &cfg, collect, &s, NULL));
    assert_int_equal(s.n, r->ngreedy);
    for (int64_t i = 0; i < s.n; i++)
        if (s.v[i] != r->greedy[i])
            fail_msg("%s: greedy token %lld is %d; transformers chose %d", r->info.arch,
                     (long long)i, s.v[i], r->greedy[i]);
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

/* f32 against transformers' f32 forward (observed: 1.1e-6 of the largest logit);
 * f64 against its f64 forward (observed: below 1e-14) of
 * the same (bf16, f16 or f32) weights, which differs from tandem's only by
 * the order of rounding. */
static void check_model(const char *name) {
    reference r;
    load_reference(name, &r);
    logits_match(&r, TD_F32, r.logits32, 1e-5);
    logits_match(&r, TD_F64, r.logits64, 1e-12);
    greedy_match(&r);
    free_reference(&r);
}

static void llama_matches_transformers(void **state) {
    reference r;
    load_reference("llama", &r);
    assert_string_equal(r.info.arch, "LlamaForCausalLM");
    assert_int_equal(r.info.heads, 6);
    assert_int_equal(r.info.kv_heads, 3);
    assert_true(r.info.rope_scaled && !r.info.tied && !r.info.qkv_bias);
    free_reference(&r);
    check_model("llama");
}

static void qwen2_matches_transformers(void **state) {
    reference r;
    td_safetensors *st = NULL;
    load_reference("qwen2", &r);
    assert_string_equal(r.info.arch, "Qwen2ForCausalLM");
    assert_int_equal(r.info.kv_heads, 2);
    assert_true(r.info.tied && r.info.qkv_bias && !r.info.rope_scaled);
    /* the tied head has no tensor of its own; q, k, v have biases */
    TD_ASSERT_OK(td_safetensors_load(r.ckpt, &st));
    assert_null(td_safetensors_find(st, "layers.6.weight"));
    assert_non_null(td_safetensors_find(st, "layers.1.1.qkv.bias"));
    assert_null(td_safetensors_find(st, "layers.1.1.proj.bias"));
    td_safetensors_destroy(st);
    free_reference(&r);
    check_model("qwen2");
}

static void mistral_matches_transformers(void **state) {
    reference r;
    load_reference("mistral", &r);
    assert_string_equal(r.info.arch, "MistralForCausalLM");
    assert_int_equal(r.info.kv_heads, 1);
    assert_false(r.info.tied);
    free_reference(&r);
    check_model("mistral");
}

/* The converted models split across devices give transformers' f64 logits
 * too, after a prefill and step by step: tensor on two with one slowed, on
 * three (one slowed: their query heads cut within the groups of the 3
 * key/value heads), on four, and on three sharing Mistral's one key/value
 * head; pipeline on two. */
static void split_matches(const char *name, const char *strategy, const char *spec) {
    reference r;
    td_device_list *list;
    td_group *g = NULL;
    td_decoder *d = NULL;
    double *row;
    load_reference(name, &r);
    row = malloc(sizeof(double) * (size_t)r.vocab);
    list = td_test_open(spec);
    TD_ASSERT_OK(td_group_create(list, NULL, &g));
    TD_ASSERT_OK(td_strategy_decoder_create(g, strategy, r.ckpt, TD_F64, &d));
    TD_ASSERT_OK(td_decoder_prefill(d, r.tokens, 9, row));
    expect_row(&r, row, r.logits64 + 8 * r.vocab, 1e-12, strategy, 8);
    for (int64_t p = 9; p < r.ntokens; p++) {
        TD_ASSERT_OK(td_decoder_step(d, r.tokens[p], row));
        expect_row(&r, row, r.logits64 + p * r.vocab, 1e-12, strategy, p);
    }
    td_decoder_destroy(d);
    td_group_destroy(g);
    td_device_list_destroy(list);
    free(row);
    free_reference(&r);
}

static void split_across_devices(void **state) {
    split_matches("llama", "tensor", "cpu*3");
    split_matches("llama", "tensor", "cpu*2,cpu*1{slowdown=3}");
    split_matches("qwen2", "tensor", "cpu:0,cpu:1{slowdown=3}");
    split_matches("qwen2", "tensor", "cpu*4");
    split_matches("mistral", "tensor", "cpu*3");
    split_matches("mistral", "pipeline", "cpu*2");
}

/* Bad folders ----------------------------------------------------------------------- */

static void copy_file(const char *from, const char *to) {
    size_t n;
    unsigned char *b = td_test_read_file(from, &n);
    td_test_write_file(to, b, n);
    free(b);
}

/* A copy of fixture `src` named `name`, config.json's `key` set to value
 * (NULL: removed; key NULL: unchanged), without the file `skip` (may be
 * NULL). Returns the folder. */
static const char *copy(const char *src, const char *name, const char *key, json_t *value,
                        const char *skip) {
    static char dir[512];
    static const char *const files[] = {"model.safetensors", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char from[600], to[600];
    json_error_t e;
    json_t *cfg;
    char *text;
    snprintf(dir, sizeof dir, "%s", td_test_tmp(name));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s failed", dir);
    snprintf(from, sizeof from, FIXTURES "/%s/config.json", src);
    assert_non_null(cfg = json_load_file(from, 0, &e));
    if (key && value)
        json_object_set_new(cfg, key, value);
    else if (key)
        json_object_del(cfg, key);
    text = json_dumps(cfg, JSON_INDENT(2));
    snprintf(to, sizeof to, "%s/config.json", dir);
    td_test_write_file(to, text, strlen(text));
    free(text);
    json_decref(cfg);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat sb;
        snprintf(from, sizeof from, FIXTURES "/%s/%s", src, files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (stat(from, &sb) == 0 && !(skip && !strcmp(skip, files[i])))
            copy_file(from, to);
    }
    return dir;
}

/* Converting dir fails with want, and the message holds each needle. */
static void fails(const char *dir, td_status want, const char *n1, const char *n2) {
    TD_ASSERT_STATUS(td_import_hf(dir, td_test_tmp("bad.safetensors"), NULL, NULL), want);
    td_test_assert_message_contains(n1);
    if (n2)
        td_test_assert_message_contains(n2);
}

static void refuses_an_unknown_architecture(void **state) {
    const char *d =
        copy("llama", "bert", "architectures", json_pack("[s]", "BertForMaskedLM"), NULL);
    fails(d, TD_ERR_UNSUPPORTED, "config.json: \"architectures\": \"BertForMaskedLM\"",
          "tandem converts GPT2LMHeadModel (\"gpt2\"), GPT2Model (\"gpt2\"), LlamaForCausalLM "
          "(\"llama\"), "
          "Qwen2ForCausalLM (\"qwen2\"), MistralForCausalLM (\"mistral\")");
}

static void refuses_a_short_sliding_window(void **state) {
    const char *d = copy("mistral", "window", "sliding_window", json_integer(16), NULL);
    fails(d, TD_ERR_UNSUPPORTED, "config.json: \"sliding_window\" = 16 is shorter than the context",
          "max_position_embeddings = 64");
}

static void refuses_sizes_that_disagree_with_the_tensors(void **state) {
    const char *d = copy("llama", "vocab", "vocab_size", json_integer(300), NULL);
    fails(d, TD_ERR_SHAPE, "model.safetensors: tensor \"model.embed_tokens.weight\" is (378, 48)",
          "vocab_size = 300");
    d = copy("llama", "narrow", "head_dim", json_integer(6), NULL);
    fails(d, TD_ERR_UNSUPPORTED, "config.json: \"head_dim\" = 6", NULL);
    d = copy("qwen2", "wider", "intermediate_size", json_integer(96), NULL);
    fails(d, TD_ERR_SHAPE, "tensor \"model.layers.0.mlp.gate_proj.weight\" is (64, 48)",
          "intermediate_size = 96");
    d = copy("mistral", "deeper", "num_hidden_layers", json_integer(3), NULL);
    fails(d, TD_ERR_SHAPE,
          "model.safetensors.index.json: tensor \"model.layers.2.input_layernorm.weight\" is "
          "missing",
          "num_hidden_layers = 3");
    d = copy("llama", "shallower", "num_hidden_layers", json_integer(1), NULL);
    fails(d, TD_ERR_SHAPE, "tensor \"model.layers.1.", "is not part of the LlamaForCausalLM");
    d = copy("qwen2", "untied", "tie_word_embeddings", json_false(), NULL);
    fails(d, TD_ERR_SHAPE, "tensor \"lm_head.weight\" is missing", NULL);
}

static void refuses_heads_not_a_multiple_of_kv_heads(void **state) {
    const char *d = copy("llama", "kv4", "num_key_value_heads", json_integer(4), NULL);
    fails(d, TD_ERR_PARSE, "config.json: \"num_attention_heads\" = 6 is not a multiple of",
          "\"num_key_value_heads\" = 4");
    d = copy("llama", "nolayers", "num_hidden_layers", NULL, NULL);
    fails(d, TD_ERR_PARSE, "config.json: \"num_hidden_layers\": missing", NULL);
}

static void refuses_a_missing_shard(void **state) {
    const char *d = copy("mistral", "noshard", NULL, NULL, "model-00002-of-00002.safetensors");
    fails(d, TD_ERR_IO, "model.safetensors.index.json: \"weight_map\"",
          "shard \"model-00002-of-00002.safetensors\": cannot open");
    d = copy("mistral", "noindex", NULL, NULL, "model.safetensors.index.json");
    fails(d, TD_ERR_IO, "model.safetensors: cannot open", "model.safetensors.index.json");
}

/* A tensor of a dtype tandem does not convert: the llama fixture's
 * header with its first "BF16" (2 bytes an element) turned into "I16 "
 * (as wide), so the file stays whole; then into "Q16 ", no dtype at all. */
static void refuses_an_unknown_dtype(void **state) {
    const char *d = copy("llama", "int16", NULL, NULL, NULL);
    char path[600];
    size_t n;
    unsigned char *b, *at;
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    b = td_test_read_file(path, &n);
    assert_non_null(at = memmem(b, n < 4096 ? n : 4096, "\"BF16\"", 6));
    memcpy(at, "\"I16\" ", 6);
    td_test_write_file(path, b, n);
    free(b);
    fails(d, TD_ERR_UNSUPPORTED, "model.safetensors: tensor \"", "dtype I16; weights are F32");
    /* and one the format does not name */
    b = td_test_read_file(path, &n);
    assert_non_null(at = memmem(b, n < 4096 ? n : 4096, "\"I16\" ", 6));
    memcpy(at, "\"Q16\" ", 6);
    td_test_write_file(path, b, n);
    free(b);
    fails(d, TD_ERR_CORRUPT, "model.safetensors: tensor \"",
          "dtype \"Q16\"; not one the safetensors format names");
}

/* The checkpoint trains: a few SGD steps on one batch lower the loss. */
static void converted_model_trains(void **state) {
    reference r;
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config oc = TD_OPTIMIZER_CONFIG_INIT;
    int32_t tok[2 * 64], lab[2 * 64];
    td_batch b = {2, NULL, tok, lab};
    td_step_result r0, rs;
    load_reference("qwen2", &r);
    for (int i = 0; i < 2 * 64; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % r.vocab);
        lab[i] = (int32_t)((i * 7 + 10) % r.vocab);
    }
    TD_ASSERT_OK(td_generate_load_model(r.ckpt, td_device_list_get(list, 0), TD_F32, &m));
    oc.lr = 0.02;
    oc.momentum = 0;
    TD_ASSERT_OK(td_optimizer_create(m, &oc, &opt));
    TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / 128, 0, 0, &r0));
    assert_true(isfinite(r0.loss_sum));
    for (int k = 0; k < 5; k++) {
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / 128, 0, 0, &rs));
    }
    if (!(rs.loss_sum < r0.loss_sum))
        fail_msg("loss went from %g to %g", r0.loss_sum, rs.loss_sum);
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free_reference(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama_matches_transformers),
        cmocka_unit_test(qwen2_matches_transformers),
        cmocka_unit_test(mistral_matches_transformers),
        cmocka_unit_test(split_across_devices),
        cmocka_unit_test(refuses_an_unknown_architecture),
        cmocka_unit_test(refuses_a_short_sliding_window),
        cmocka_unit_test(refuses_sizes_that_disagree_with_the_tensors),
        cmocka_unit_test(refuses_heads_not_a_multiple_of_kv_heads),
        cmocka_unit_test(refuses_a_missing_shard),
        cmocka_unit_test(refuses_an_unknown_dtype),
        cmocka_unit_test(converted_model_trains),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
