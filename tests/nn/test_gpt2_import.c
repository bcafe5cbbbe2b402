/* GPT-2 weights from elsewhere against transformers itself: the fixture in
 * tests/fixtures/gpt2_tiny (made by its make_fixture.py with PyTorch, which
 * CI never runs) holds a small random GPT2LMHeadModel as save_pretrained
 * wrote it, the same weights in llm.c's layout, and the logits and greedy
 * tokens transformers computed. Converted by tandem, the model must give
 * those logits (f32 and f64, through the ordinary forward and through the
 * KV-cache decoder) and those tokens; llm.c's file must give the same model;
 * and damaged or foreign inputs must fail with messages that name the file
 * and the field. Also the schema pieces GPT-2 needs: a tied head and GELU's
 * tanh approximation. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/full_logits.h"
#include "support/support.h"

#define FIXTURE TD_SOURCE_DIR "/tests/fixtures/gpt2_tiny"

enum { V = 300, T_MAX = 64 };

typedef struct reference {
    json_t *json;
    int32_t tokens[T_MAX], prompt[T_MAX], greedy[T_MAX];
    int64_t ntokens, nprompt, ngreedy;
    double *logits32, *logits64; /* (ntokens, V) */
} reference;

static reference ref;
static char hf_ckpt[512], llmc_ckpt[512];

static int64_t read_ints(json_t *arr, int32_t *out) {
    size_t i;
    json_t *v;
    assert_true(json_is_array(arr) && json_array_size(arr) <= T_MAX);
    json_array_foreach(arr, i, v) out[i] = (int32_t)json_integer_value(v);
    return (int64_t)json_array_size(arr);
}

static double *read_logits(const td_safetensors *st, const char *name, td_dtype dt) {
    const td_st_tensor *t = td_safetensors_find(st, name);
    double *out;
    assert_non_null(t);
    assert_int_equal(t->dtype, dt);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], ref.ntokens);
    assert_int_equal(t->shape[1], V);
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

static int setup(void **state) {
    json_error_t e;
    td_safetensors *st = NULL;
    if (td_test_tmpdir_setup(state) != 0)
        return -1;
    if (!(ref.json = json_load_file(FIXTURE "/reference.json", 0, &e)))
        return -1;
    ref.ntokens = read_ints(json_object_get(ref.json, "tokens"), ref.tokens);
    ref.nprompt = read_ints(json_object_get(ref.json, "greedy_prompt"), ref.prompt);
    ref.ngreedy = read_ints(json_object_get(ref.json, "greedy_tokens"), ref.greedy);
    TD_ASSERT_OK(td_safetensors_load(FIXTURE "/reference.safetensors", &st));
    ref.logits32 = read_logits(st, "logits_f32", TD_F32);
    ref.logits64 = read_logits(st, "logits_f64", TD_F64);
    td_safetensors_destroy(st);
    snprintf(hf_ckpt, sizeof hf_ckpt, "%s", td_test_tmp("hf.safetensors"));
    snprintf(llmc_ckpt, sizeof llmc_ckpt, "%s", td_test_tmp("llmc.safetensors"));
    TD_ASSERT_OK(td_import_hf_gpt2(FIXTURE, hf_ckpt, NULL, NULL));
    TD_ASSERT_OK(td_import_llmc_gpt2(FIXTURE "/gpt2_tiny_llmc.bin", llmc_ckpt, NULL, NULL));
    return 0;
}

static int teardown(void **state) {
    json_decref(ref.json);
    free(ref.logits32);
    free(ref.logits64);
    return td_test_tmpdir_teardown(state);
}

/* Fails unless row got (V) is want (V) within tol of the row's largest logit. */
static void expect_row(const double *got, const double *want, double tol, const char *how,
                       int64_t pos) {
    double scale = 0, worst = 0;
    for (int i = 0; i < V; i++)
        scale = fmax(scale, fabs(want[i]));
    for (int i = 0; i < V; i++)
        worst = fmax(worst, fabs(got[i] - want[i]));
    if (!(worst <= tol * scale))
        fail_msg("%s: position %lld: logits differ from transformers' by %g (tolerance %g)", how,
                 (long long)pos, worst, tol * scale);
}

/* The checkpoint's logits of the reference tokens, by the full forward and
 * by the decoder (a prefill of each length, and steps after one token). */
static void logits_on(const char *spec, const char *ckpt, td_dtype dt, const double *want,
                      double tol) {
    td_device_list *list = td_test_open(spec);
    td_model *m = NULL;
    td_decoder *d = NULL;
    double *full = malloc(sizeof(double) * (size_t)(ref.ntokens * V)), row[V];
    int64_t n = ref.ntokens;
    TD_ASSERT_OK(td_generate_load_model(ckpt, td_device_list_get(list, 0), dt, &m));
    assert_int_equal(td_model_num_classes(m), V);
    td_test_full_logits(m, ref.tokens, n, full);
    for (int64_t p = 0; p < n; p++)
        expect_row(full + p * V, want + p * V, tol, "forward", p);
    TD_ASSERT_OK(td_decoder_create(m, &d));
    assert_int_equal(td_decoder_context(d), 64);
    for (int64_t k = 1; k <= n; k++) {
        TD_ASSERT_OK(td_decoder_prefill(d, ref.tokens, k, row));
        expect_row(row, want + (k - 1) * V, tol, "prefill", k - 1);
    }
    TD_ASSERT_OK(td_decoder_prefill(d, ref.tokens, 1, NULL));
    for (int64_t p = 1; p < n; p++) {
        TD_ASSERT_OK(td_decoder_step(d, ref.tokens[p], row));
        expect_row(row, want + p * V, tol, "step", p);
    }
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free(full);
}

static void logits_match(const char *ckpt, td_dtype dt, const double *want, double tol) {
    logits_on("cpu", ckpt, dt, want, tol);
}

/* f32 against transformers' f32 forward (observed: 5e-7 of the largest
 * logit); f64 against its f64 forward, which differs from tandem's only by
 * the order of rounding (observed: 1e-15). GELU's exact form instead of the
 * tanh approximation moves these logits by 2e-4 of the largest, so either
 * tolerance tells them apart. */
static void hf_logits_match_f32(void **state) {
    logits_match(hf_ckpt, TD_F32, ref.logits32, 1e-5);
}
static void hf_logits_match_f64(void **state) {
    logits_match(hf_ckpt, TD_F64, ref.logits64, 1e-12);
}
static void llmc_logits_match(void **state) {
    logits_match(llmc_ckpt, TD_F64, ref.logits64, 1e-12);
    logits_match(llmc_ckpt, TD_F32, ref.logits32, 1e-5);
}

/* The same through the OpenCL backend's kernels (PoCL in CI), the tanh
 * GELU among them. */
static void opencl_logits_match(void **state) {
    td_device_list *list = NULL;
    if (td_devices_open("opencl:0.0", &list) != TD_OK) {
        printf("skipped: no OpenCL device (%s)\n", td_last_error());
        skip();
    }
    td_device_list_destroy(list);
    logits_on("opencl:0.0", hf_ckpt, TD_F32, ref.logits32, 1e-5);
}

/* And through CUDA's (kernels.cu), where there is a GPU. */
static void cuda_logits_match(void **state) {
    td_device_list *list = NULL;
    if (td_devices_open("cuda:0", &list) != TD_OK) {
        printf("skipped: no CUDA device (%s)\n", td_last_error());
        skip();
    }
    td_device_list_destroy(list);
    logits_on("cuda:0", hf_ckpt, TD_F32, ref.logits32, 1e-5);
    logits_on("cuda:0", hf_ckpt, TD_F64, ref.logits64, 1e-12);
}

/* Both sources hold the same f32 numbers, one of them transposed: the two
 * checkpoints must hold the same tensors bit for bit. */
static void llmc_and_hf_give_the_same_checkpoint(void **state) {
    td_safetensors *a = NULL, *b = NULL;
    TD_ASSERT_OK(td_safetensors_load(hf_ckpt, &a));
    TD_ASSERT_OK(td_safetensors_load(llmc_ckpt, &b));
    assert_int_equal(td_safetensors_count(a), td_safetensors_count(b));
    for (size_t i = 0; i < td_safetensors_count(a); i++) {
        const td_st_tensor *x = td_safetensors_tensor(a, i);
        const td_st_tensor *y = td_safetensors_find(b, x->name);
        if (!y || y->nbytes != x->nbytes || memcmp(x->data, y->data, x->nbytes) != 0)
            fail_msg("tensor %s differs between the two conversions", x->name);
    }
    /* the tied head adds no tensor of its own */
    assert_null(td_safetensors_find(a, "layers.6.weight"));
    assert_non_null(td_safetensors_find(a, "layers.0.wte.weight"));
    td_safetensors_destroy(a);
    td_safetensors_destroy(b);
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
static void greedy_tokens_match_transformers(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_decoder *d = NULL;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    sink s = {{0}, 0};
    TD_ASSERT_OK(td_generate_load_model(hf_ckpt, td_device_list_get(list, 0), TD_F32, &m));
    TD_ASSERT_OK(td_decoder_create(m, &d));
    cfg.tokens = ref.ngreedy;
    cfg.temperature = 0;
    TD_ASSERT_OK(td_generate(d, ref.prompt, ref.nprompt, &cfg, collect, &s, NULL));
    assert_int_equal(s.n, ref.ngreedy);
    for (int64_t i = 0; i < s.n; i++)
        if (s.v[i] != ref.greedy[i])
            fail_msg("greedy token %lld is %d; transformers chose %d", (long long)i, s.v[i],
                     ref.greedy[i]);
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

/* A converted model trains: a few SGD steps on one batch lower its loss
 * (the tied head's gradient reaches the embedding's table). */
static void converted_model_trains(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config oc = TD_OPTIMIZER_CONFIG_INIT;
    int32_t tok[2 * 64], lab[2 * 64];
    td_batch b = {2, NULL, tok, lab};
    td_step_result r0, r;
    for (int i = 0; i < 2 * 64; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % V);
        lab[i] = (int32_t)((i * 7 + 10) % V);
    }
    TD_ASSERT_OK(td_generate_load_model(hf_ckpt, td_device_list_get(list, 0), TD_F32, &m));
    oc.lr = 0.05;
    oc.momentum = 0;
    TD_ASSERT_OK(td_optimizer_create(m, &oc, &opt));
    TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / 128, 0, 0, &r0));
    assert_true(isfinite(r0.loss_sum));
    for (int k = 0; k < 5; k++) {
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / 128, 0, 0, &r));
    }
    if (!(r.loss_sum < r0.loss_sum))
        fail_msg("loss went from %g to %g", r0.loss_sum, r.loss_sum);
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

/* Bad Hugging Face folders -------------------------------------------------------- */

/* A copy of the fixture folder named `name` with config.json's `key` set to
 * value (NULL: removed; key NULL: unchanged) and model.safetensors cut to
 * `keep` bytes (0: whole). Returns the folder. */
static const char *hf_copy(const char *name, const char *key, json_t *value, size_t keep) {
    static char dir[512];
    char path[600];
    json_error_t e;
    json_t *cfg = json_load_file(FIXTURE "/config.json", 0, &e);
    unsigned char *st;
    size_t n;
    char *text;
    assert_non_null(cfg);
    snprintf(dir, sizeof dir, "%s", td_test_tmp(name));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s failed", dir);
    if (key && value)
        json_object_set_new(cfg, key, value);
    else if (key)
        json_object_del(cfg, key);
    text = json_dumps(cfg, JSON_INDENT(2));
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_test_write_file(path, text, strlen(text));
    free(text);
    json_decref(cfg);
    st = td_test_read_file(FIXTURE "/model.safetensors", &n);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    td_test_write_file(path, st, keep && keep < n ? keep : n);
    free(st);
    return dir;
}

/* Converting dir fails with want, and the message holds each needle. */
static void hf_fails(const char *dir, td_status want, const char *n1, const char *n2) {
    TD_ASSERT_STATUS(td_import_hf_gpt2(dir, td_test_tmp("bad.safetensors"), NULL, NULL), want);
    td_test_assert_message_contains(n1);
    if (n2)
        td_test_assert_message_contains(n2);
}

static void hf_refuses_another_architecture(void **state) {
    const char *d = hf_copy("bert", "model_type", json_string("bert"), 0);
    hf_fails(d, TD_ERR_PARSE, "config.json: \"model_type\"", "\"bert\"");
    d = hf_copy("arch", "architectures", json_pack("[s]", "BertForMaskedLM"), 0);
    hf_fails(d, TD_ERR_PARSE, "config.json: \"architectures\"", "BertForMaskedLM");
}

static void hf_refuses_an_unknown_activation(void **state) {
    const char *d = hf_copy("swish", "activation_function", json_string("swish"), 0);
    hf_fails(d, TD_ERR_UNSUPPORTED, "config.json: \"activation_function\"", "\"swish\"");
}

static void hf_refuses_shapes_that_disagree_with_the_config(void **state) {
    const char *d = hf_copy("narrow", "n_embd", json_integer(32), 0);
    hf_fails(d, TD_ERR_SHAPE, "model.safetensors: tensor \"transformer.wte.weight\" is (300, 64)",
             "config.json (n_embd = 32");
    d = hf_copy("deeper", "n_layer", json_integer(3), 0);
    hf_fails(d, TD_ERR_SHAPE, "tensor \"transformer.h.2.ln_1.weight\" is missing", "n_layer = 3");
    d = hf_copy("shallower", "n_layer", json_integer(1), 0);
    hf_fails(d, TD_ERR_SHAPE, "tensor \"transformer.h.1.", "is not part of the GPT-2");
    d = hf_copy("heads", "n_head", json_integer(5), 0);
    hf_fails(d, TD_ERR_PARSE, "config.json: n_head = 5 does not divide n_embd = 64", NULL);
    d = hf_copy("nolayers", "n_layer", NULL, 0);
    hf_fails(d, TD_ERR_PARSE, "config.json: \"n_layer\": missing", NULL);
}

static void hf_refuses_a_truncated_file(void **state) {
    const char *d = hf_copy("truncated", NULL, NULL, 300000);
    TD_ASSERT_STATUS(td_import_hf_gpt2(d, td_test_tmp("bad.safetensors"), NULL, NULL),
                     TD_ERR_CORRUPT);
    td_test_assert_message_contains("model.safetensors");
    TD_ASSERT_STATUS(
        td_import_hf_gpt2(td_test_tmp("nowhere"), td_test_tmp("bad.safetensors"), NULL, NULL),
        TD_ERR_IO);
    td_test_assert_message_contains("nowhere/config.json: cannot open: No such file");
    /* Once, and with no line number -1 (jansson's for a file not opened). */
    assert_null(strstr(strstr(td_last_error(), "nowhere/config.json") + 1, "nowhere/config.json"));
    assert_null(strstr(td_last_error(), ":-1"));
}

/* Half precision -------------------------------------------------------------------- */

/* x as IEEE half bits, the mantissa cut (not rounded), below 2^-14 a
 * subnormal (multiples of 2^-24); *back gets the value the bits stand for,
 * computed apart from tandem. */
static uint16_t to_f16(float x, float *back) {
    uint32_t b, m, sign;
    int e;
    memcpy(&b, &x, 4);
    sign = b >> 31;
    e = (int)((b >> 23) & 0xff) - 127;
    assert_true(e <= 15);
    if (e < -14) {
        m = (uint32_t)(fabsf(x) * 16777216.0f); /* x / 2^-24, cut */
        *back = ldexpf((float)m, -24) * (sign ? -1.0f : 1.0f);
        return (uint16_t)(sign << 15 | m);
    }
    m = (b >> 13) & 0x3ff;
    *back = ldexpf(1.0f + (float)m / 1024.0f, e) * (sign ? -1.0f : 1.0f);
    return (uint16_t)(sign << 15 | (uint32_t)(e + 15) << 10 | m);
}

/* x as bfloat16 bits (its top half) and the value they stand for. */
static uint16_t to_bf16(float x, float *back) {
    uint32_t b;
    memcpy(&b, &x, 4);
    b &= 0xFFFF0000u;
    memcpy(back, &b, 4);
    return (uint16_t)(b >> 16);
}

/* The fixture's folder with model.safetensors rewritten, by hand, in dtype
 * (F32, F16 or BF16); with `hub`, named as the GPT-2 on the Hugging Face hub
 * is (GPT2Model's names, without "transformer."), with the causal-mask
 * buffer "h.0.attn.bias" older versions saved. */
static const char *hf_rewrite(const char *name, const char *dtype, int hub) {
    const char *dir = hf_copy(name, NULL, NULL, 0);
    td_safetensors *st = NULL;
    json_t *hdr = json_object();
    size_t total = 0, hlen, pad, es = strcmp(dtype, "F32") ? 2 : 4, mask = 64 * 64;
    unsigned char *data;
    char *text, path[600];
    FILE *f;
    uint64_t len;
    TD_ASSERT_OK(td_safetensors_load(FIXTURE "/model.safetensors", &st));
    for (size_t i = 0; i < td_safetensors_count(st); i++)
        total += td_safetensors_tensor(st, i)->numel * es;
    data = calloc(1, total + mask * es);
    total = 0;
    for (size_t i = 0; i < td_safetensors_count(st); i++) {
        const td_st_tensor *t = td_safetensors_tensor(st, i);
        json_t *shape = json_array();
        const char *tn = t->name;
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        if (hub && !strncmp(tn, "transformer.", 12))
            tn += 12;
        json_object_set_new(hdr, tn,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype, "shape", shape,
                                      "data_offsets", (json_int_t)total,
                                      (json_int_t)(total + es * t->numel)));
        for (size_t k = 0; k < t->numel; k++) {
            float x, back;
            uint16_t h;
            memcpy(&x, (const char *)t->data + 4 * k, 4);
            if (es == 4) {
                memcpy(data + total + 4 * k, &x, 4);
                continue;
            }
            h = !strcmp(dtype, "BF16") ? to_bf16(x, &back) : to_f16(x, &back);
            memcpy(data + total + 2 * k, &h, 2);
        }
        total += es * t->numel;
    }
    if (hub) {
        json_object_set_new(hdr, "h.0.attn.bias",
                            json_pack("{s:s,s:[i,i,i,i],s:[I,I]}", "dtype", dtype, "shape", 1, 1,
                                      64, 64, "data_offsets", (json_int_t)total,
                                      (json_int_t)(total + es * mask)));
        total += es * mask;
    }
    text = json_dumps(hdr, JSON_COMPACT);
    hlen = strlen(text);
    pad = (8 - hlen % 8) % 8;
    len = hlen + pad;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_non_null(f = fopen(path, "wb"));
    fwrite(&len, 8, 1, f);
    fwrite(text, 1, hlen, f);
    fwrite("        ", 1, pad, f);
    fwrite(data, 1, total, f);
    fclose(f);
    free(text);
    free(data);
    json_decref(hdr);
    td_safetensors_destroy(st);
    return dir;
}

/* The hub's naming converts to the same checkpoint, bit for bit. */
static void hf_reads_the_hubs_names(void **state) {
    td_safetensors *a = NULL, *b = NULL;
    const char *dir = hf_rewrite("hub", "F32", 1);
    TD_ASSERT_OK(td_import_hf_gpt2(dir, td_test_tmp("hub.safetensors"), NULL, NULL));
    TD_ASSERT_OK(td_safetensors_load(hf_ckpt, &a));
    TD_ASSERT_OK(td_safetensors_load(td_test_tmp("hub.safetensors"), &b));
    assert_int_equal(td_safetensors_count(a), td_safetensors_count(b));
    for (size_t i = 0; i < td_safetensors_count(a); i++) {
        const td_st_tensor *x = td_safetensors_tensor(a, i);
        const td_st_tensor *y = td_safetensors_find(b, x->name);
        if (!y || y->nbytes != x->nbytes || memcmp(x->data, y->data, x->nbytes) != 0)
            fail_msg("tensor %s differs", x->name);
    }
    td_safetensors_destroy(a);
    td_safetensors_destroy(b);
}

/* F16 and BF16 folders convert to the f32 conversion's values as those
 * dtypes hold them (the f32 checkpoint's elements, cut the same way). */
static void hf_reads_half_and_bfloat16(void **state) {
    static const char *const dtypes[] = {"F16", "BF16"};
    for (int k = 0; k < 2; k++) {
        td_safetensors *whole = NULL, *half = NULL;
        const char *dir = hf_rewrite(dtypes[k], dtypes[k], 0);
        TD_ASSERT_OK(td_import_hf_gpt2(dir, td_test_tmp("half.safetensors"), NULL, NULL));
        TD_ASSERT_OK(td_safetensors_load(hf_ckpt, &whole));
        TD_ASSERT_OK(td_safetensors_load(td_test_tmp("half.safetensors"), &half));
        for (size_t i = 0; i < td_safetensors_count(whole); i++) {
            const td_st_tensor *a = td_safetensors_tensor(whole, i);
            const td_st_tensor *b = td_safetensors_find(half, a->name);
            assert_non_null(b);
            assert_int_equal(b->numel, a->numel);
            for (size_t e = 0; e < a->numel; e++) {
                float x, y, want;
                memcpy(&x, (const char *)a->data + 4 * e, 4);
                memcpy(&y, (const char *)b->data + 4 * e, 4);
                if (k)
                    to_bf16(x, &want);
                else
                    to_f16(x, &want);
                if (y != want)
                    fail_msg("%s: %s[%zu] is %.9g; %g as %s is %.9g", dtypes[k], a->name, e, y, x,
                             dtypes[k], want);
            }
        }
        td_safetensors_destroy(whole);
        td_safetensors_destroy(half);
    }
}

/* Bad llm.c files --------------------------------------------------------------------- */

/* The fixture's llm.c file with header[field] = value and the last `cut`
 * bytes dropped, converted: fails with want and a message holding needle. */
static void llmc_fails(int field, int32_t value, size_t cut, td_status want, const char *needle) {
    size_t n;
    unsigned char *b = td_test_read_file(FIXTURE "/gpt2_tiny_llmc.bin", &n);
    const char *path = td_test_tmp("bad_llmc.bin");
    if (field >= 0)
        memcpy(b + 4 * field, &value, 4);
    td_test_write_file(path, b, n - cut);
    free(b);
    TD_ASSERT_STATUS(td_import_llmc_gpt2(path, td_test_tmp("bad.safetensors"), NULL, NULL), want);
    td_test_assert_message_contains("bad_llmc.bin: ");
    td_test_assert_message_contains(needle);
}

static void llmc_refuses_bad_headers(void **state) {
    llmc_fails(0, 12345, 0, TD_ERR_CORRUPT, "header[0] (magic) is 12345, not 20240326");
    llmc_fails(0, 20240520, 0, TD_ERR_CORRUPT, "it is an llm.c token file");
    llmc_fails(1, 5, 0, TD_ERR_UNSUPPORTED, "header[1] (version) is 5: bf16");
    llmc_fails(1, 1, 0, TD_ERR_UNSUPPORTED, "header[1] (version) is 1;");
    llmc_fails(-1, 0, 100, TD_ERR_CORRUPT, "truncated");
    llmc_fails(6, 0, 0, TD_ERR_PARSE, "header[6] (channels) = 0");
    llmc_fails(5, 3, 0, TD_ERR_PARSE, "header[5] (num_heads) = 3 does not divide");
    llmc_fails(7, 100, 0, TD_ERR_CORRUPT, "header[7] (padded_vocab_size) is 100");
    llmc_fails(-1, 0, 1000, TD_ERR_CORRUPT, "truncated");
}

static void llmc_tokens_read(void **state) {
    int32_t *tok = NULL, head[T_MAX];
    size_t n = 0;
    int64_t nh = read_ints(json_object_get(ref.json, "llmc_tokens_head"), head);
    TD_ASSERT_OK(td_import_llmc_tokens(FIXTURE "/tokens_llmc.bin", &tok, &n));
    assert_int_equal(n, json_integer_value(json_object_get(ref.json, "llmc_tokens")));
    for (int64_t i = 0; i < nh; i++)
        assert_int_equal(tok[i], head[i]);
    free(tok);
    TD_ASSERT_STATUS(td_import_llmc_tokens(FIXTURE "/gpt2_tiny_llmc.bin", &tok, &n),
                     TD_ERR_CORRUPT);
    td_test_assert_message_contains("it is an llm.c GPT-2 checkpoint");
    assert_null(tok);
}

/* The schema ------------------------------------------------------------------------ */

static const char *const tied_gpt =
    "{\"input\": {\"tokens\": 8, \"vocab\": 11}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 11, \"dim\": 6},"
    "{\"type\": \"linear\", \"out\": 6}, {\"type\": \"gelu\", \"approximate\": \"tanh\"},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 11, \"bias\": false, "
    "\"tied\": true}]}";

static void load_fails(const char *json, td_status want, const char *needle) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    TD_ASSERT_STATUS(
        td_model_load_string(json, "m.json", td_device_list_get(list, 0), TD_F32, 1, &m), want);
    td_test_assert_message_contains(needle);
    td_device_list_destroy(list);
}

static void schema_tied_and_gelu_tanh(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_model_info info;
    TD_ASSERT_OK(
        td_model_load_string(tied_gpt, "m.json", td_device_list_get(list, 0), TD_F32, 1, &m));
    /* wte, wpe, the linear's two, the norm's two: the head has none of its own */
    assert_int_equal(td_model_param_count(m), 6);
    td_model_get_info(m, &info);
    assert_int_equal(info.num_weights, 11 * 6 + 8 * 6 + 6 * 6 + 6 + 6 + 6);
    td_model_destroy(m);
    /* a pipeline stage holding the head but not the embedding */
    TD_ASSERT_STATUS(
        td_model_load_part(tied_gpt, "m.json", td_device_list_get(list, 0), TD_F32, 1, 1, 5, 1, &m),
        TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("m.json: layers[4].tied: the embedding");
    td_device_list_destroy(list);
    load_fails("{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\", \"out\": 4, "
               "\"tied\": true}]}",
               TD_ERR_PARSE, "m.json: layers[0].tied: needs the model's embedding");
    load_fails("{\"input\": {\"tokens\": 8, \"vocab\": 11}, \"layers\": [{\"type\": "
               "\"embedding\", \"vocab\": 11, \"dim\": 6}, {\"type\": \"linear\", \"out\": 7, "
               "\"tied\": true}]}",
               TD_ERR_PARSE,
               "layers[1].tied: a tied linear maps the embedding's 6 channels to "
               "its 11 tokens; here 6 to 7");
    load_fails("{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"gelu\", \"approximate\": "
               "\"fast\"}]}",
               TD_ERR_PARSE, "m.json: layers[0].approximate: expected \"none\" or \"tanh\"");
    load_fails("{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"relu\", \"approximate\": "
               "\"tanh\"}]}",
               TD_ERR_PARSE, "layers[0].approximate: unknown field");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hf_logits_match_f32),
        cmocka_unit_test(hf_logits_match_f64),
        cmocka_unit_test(llmc_logits_match),
        cmocka_unit_test(opencl_logits_match),
        cmocka_unit_test(cuda_logits_match),
        cmocka_unit_test(llmc_and_hf_give_the_same_checkpoint),
        cmocka_unit_test(greedy_tokens_match_transformers),
        cmocka_unit_test(converted_model_trains),
        cmocka_unit_test(hf_refuses_another_architecture),
        cmocka_unit_test(hf_refuses_an_unknown_activation),
        cmocka_unit_test(hf_refuses_shapes_that_disagree_with_the_config),
        cmocka_unit_test(hf_refuses_a_truncated_file),
        cmocka_unit_test(hf_reads_half_and_bfloat16),
        cmocka_unit_test(hf_reads_the_hubs_names),
        cmocka_unit_test(llmc_refuses_bad_headers),
        cmocka_unit_test(llmc_tokens_read),
        cmocka_unit_test(schema_tied_and_gelu_tanh),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
