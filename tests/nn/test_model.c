/* Model files: the shipped examples load with the expected parameters, bad
 * files give messages that name the file, the layer and the field, seeds give
 * the same weights on every device, and the step API keeps its promises
 * (accumulation, the gradient hook, determinism, a slowed device's passes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static void examples_load(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_model *m = NULL;
    int64_t shape[TD_MAX_DIMS];
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/lenet5.json", dev, TD_F32, 1, &m));
    assert_int_equal(td_model_num_weights(m), 156 + 2416 + 48120 + 10164 + 850);
    assert_int_equal(td_model_input_shape(m, shape), 3);
    assert_int_equal(shape[0], 1);
    assert_int_equal(shape[2], 28);
    assert_int_equal(td_model_num_classes(m), 10);
    assert_int_equal(td_model_input_kind(m), TD_INPUT_FEATURES);
    td_model_destroy(m);

    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/gpt_tiny.json", dev, TD_F64, 1, &m));
    assert_int_equal(td_model_input_kind(m), TD_INPUT_TOKENS);
    assert_int_equal(td_model_input_shape(m, shape), 1);
    assert_int_equal(shape[0], 128);
    assert_int_equal(td_model_num_classes(m), 256);
    /* embeddings, 4 blocks of (2 layer norms, attention, MLP), final norm, head */
    assert_int_equal(td_model_param_count(m), 2 + 4 * (4 + 4 + 4) + 2 + 2);
    assert_int_equal(td_model_num_weights(m),
                     256 * 128 + 128 * 128 +
                         4 * (2 * 256 + 3 * 128 * 128 + 3 * 128 + 128 * 128 + 128 + 128 * 512 +
                              512 + 512 * 128 + 128) +
                         256 + 128 * 256 + 256);
    assert_string_equal(td_model_param_name(m, 0), "layers.0.wte.weight");
    assert_string_equal(td_model_param_name(m, 1), "layers.0.wpe.weight");
    assert_string_equal(td_model_param_name(m, 4), "layers.1.1.qkv.weight");
    assert_string_equal(td_model_param_name(m, 10), "layers.2.1.weight");
    assert_non_null(strstr(td_model_json(m), "gpt_tiny"));
    td_model_destroy(m);
    td_device_list_destroy(list);
}

typedef struct bad_case {
    const char *json;
    td_status status;
    const char *message;
} bad_case;

static void bad_files_name_file_layer_and_field(void **state) {
    static const bad_case cases[] = {
        {"{\"input\": {\"shape\": [4]}, \"layers\": [", TD_ERR_PARSE, "bad.json:1:"},
        {"[1, 2]", TD_ERR_PARSE, "bad.json: expected a JSON object"},
        {"{\"layers\": []}", TD_ERR_PARSE, "bad.json: input: missing"},
        {"{\"input\": {\"shape\": [4]}}", TD_ERR_PARSE, "bad.json: layers: missing"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": []}", TD_ERR_PARSE,
         "bad.json: layers: expected at least one layer"},
        {"{\"input\": {\"shape\": [0]}, \"layers\": []}", TD_ERR_PARSE,
         "bad.json: input.shape: expected an array of 1 to 3 positive integers"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"relu\"}, {\"type\": \"linear\", "
         "\"out\": 3}, {\"type\": \"linear\", \"out\": -2}]}",
         TD_ERR_PARSE, "bad.json: layers[2].out: expected a positive integer"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\", \"out\": \"3\"}]}",
         TD_ERR_PARSE, "bad.json: layers[0].out: expected a positive integer"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\"}]}", TD_ERR_PARSE,
         "bad.json: layers[0].out: missing"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"out\": 3}]}", TD_ERR_PARSE,
         "bad.json: layers[0].type: missing"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"lnear\", \"out\": 3}]}",
         TD_ERR_PARSE, "bad.json: layers[0].type: unknown layer type"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\", \"out\": 3, "
         "\"outs\": 4}]}",
         TD_ERR_PARSE, "bad.json: layers[0].outs: unknown field"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"dropout\", \"p\": 1.5}, "
         "{\"type\": \"linear\", \"out\": 3}]}",
         TD_ERR_PARSE, "bad.json: layers[0].p: expected a number in [0, 1)"},
        {"{\"input\": {\"shape\": [784]}, \"layers\": [{\"type\": \"conv2d\", \"out\": 6, "
         "\"kernel\": 5}]}",
         TD_ERR_PARSE,
         "bad.json: layers[0]: conv2d needs (channels, height, width) input, got "
         "(784)"},
        {"{\"input\": {\"shape\": [1, 4, 4]}, \"layers\": [{\"type\": \"conv2d\", \"out\": 2, "
         "\"kernel\": 7}, {\"type\": \"flatten\"}]}",
         TD_ERR_PARSE, "bad.json: layers[0].kernel: larger than the padded input"},
        {"{\"input\": {\"shape\": [1, 4, 4]}, \"layers\": [{\"type\": \"conv2d\", \"out\": 2, "
         "\"kernel\": 3}]}",
         TD_ERR_PARSE, "a classifier ends with (classes) logits"},
        {"{\"input\": {\"shape\": [8]}, \"layers\": [{\"type\": \"residual\", \"layers\": "
         "[{\"type\": \"linear\", \"out\": 4}]}, {\"type\": \"linear\", \"out\": 2}]}",
         TD_ERR_PARSE, "bad.json: layers[0]: residual: its layers turn (8) into (4)"},
        {"{\"input\": {\"shape\": [8]}, \"layers\": [{\"type\": \"residual\", \"layers\": "
         "[{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 0}]}]}",
         TD_ERR_PARSE, "bad.json: layers[0].layers[1].out: expected a positive integer"},
        {"{\"input\": {\"shape\": [8]}, \"layers\": [{\"type\": \"repeat\", \"count\": 0, "
         "\"layers\": [{\"type\": \"relu\"}]}]}",
         TD_ERR_PARSE, "bad.json: layers[0].count: expected a positive integer"},
        {"{\"input\": {\"tokens\": 8, \"vocab\": 5}, \"layers\": [{\"type\": \"linear\", "
         "\"out\": 5}]}",
         TD_ERR_PARSE, "bad.json: layers[0].type: a token model starts with an embedding"},
        {"{\"input\": {\"tokens\": 8}, \"layers\": []}", TD_ERR_PARSE,
         "bad.json: input.vocab: missing"},
        {"{\"input\": {\"tokens\": 8, \"vocab\": 5}, \"layers\": [{\"type\": \"embedding\", "
         "\"vocab\": 5, \"dim\": 6}, {\"type\": \"attention\", \"heads\": 4}]}",
         TD_ERR_PARSE, "bad.json: layers[1].heads: must divide the channels"},
        {"{\"input\": {\"tokens\": 8, \"vocab\": 5}, \"layers\": [{\"type\": \"embedding\", "
         "\"vocab\": 5, \"dim\": 6}, {\"type\": \"linear\", \"out\": 4}]}",
         TD_ERR_PARSE, "must end with (8, 5) logits"},
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\", \"out\": 3}], "
         "\"optimizer\": 1}",
         TD_ERR_PARSE, "bad.json: optimizer: unknown field"},
    };
    td_device_list *list = td_test_open("cpu:0");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        td_model *m = (td_model *)0x1;
        td_status st = td_model_load_string(cases[i].json, "bad.json", td_device_list_get(list, 0),
                                            TD_F32, 1, &m);
        if (st != cases[i].status)
            fail_msg("case %zu: %s, expected %s: %s", i, td_status_name(st),
                     td_status_name(cases[i].status), td_last_error());
        assert_null(m);
        td_test_assert_message_contains(cases[i].message);
    }
    {
        td_model *m = NULL;
        TD_ASSERT_STATUS(
            td_model_load("/nonexistent/model.json", td_device_list_get(list, 0), TD_F32, 1, &m),
            TD_ERR_IO);
        td_test_assert_message_contains("/nonexistent/model.json");
    }
    td_model_destroy(NULL);
    td_device_list_destroy(list);
}

/* The size tests' device, opened around each (a model goes before its device). */
static td_device_list *size_devs;

static int size_setup(void **state) {
    size_devs = td_test_open("cpu:0");
    return 0;
}

static int size_teardown(void **state) {
    td_device_list_destroy(size_devs);
    size_devs = NULL;
    return 0;
}

static td_status load_text(const char *json, td_model **m) {
    return td_model_load_string(json, "big.json", td_device_list_get(size_devs, 0), TD_F32, 1, m);
}

/* Issue 26, item 4: a few hundred bytes must not ask for a billion layers,
 * nor a small model for more activations than any machine holds. */
static void models_too_large_are_refused_before_building(void **state) {
    static const char *const cases[][2] = {
        /* the audit's 229-byte file: 1024^3 relus */
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"repeat\", \"count\": 1024, "
         "\"layers\": [{\"type\": \"repeat\", \"count\": 1024, \"layers\": [{\"type\": "
         "\"repeat\", \"count\": 1024, \"layers\": [{\"type\": \"relu\"}]}]}]}, {\"type\": "
         "\"linear\", \"out\": 2}]}",
         "big.json: layers[0].layers[0]: the model has more than 100000 layers"},
        /* one layer over the limit */
        {"{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"repeat\", \"count\": 1000, "
         "\"layers\": [{\"type\": \"repeat\", \"count\": 100, \"layers\": [{\"type\": "
         "\"relu\"}]}]}, {\"type\": \"linear\", \"out\": 2}]}",
         "big.json: layers[1]: the model has more than 100000 layers"},
        /* small weights, but attention scores of (64, 2^20, 2^20) per sample */
        {"{\"input\": {\"tokens\": 1048576, \"vocab\": 16}, \"layers\": [{\"type\": "
         "\"embedding\", \"vocab\": 16, \"dim\": 64, \"positions\": false}, {\"type\": "
         "\"attention\", \"heads\": 64}, {\"type\": \"linear\", \"out\": 16}]}",
         "big.json: layers: one sample's activations come to more than 68719476736 elements"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        td_model *m = (td_model *)0x1;
        TD_ASSERT_STATUS(load_text(cases[i][0], &m), TD_ERR_PARSE);
        assert_null(m);
        td_test_assert_message_contains(cases[i][1]);
    }
}

/* Issue 26, item 5: products of sizes from the file are checked, not left
 * to overflow int64 (the input) or to ask for petabytes (a parameter, an
 * output). td_model_describe, which the trainer sizes its data by, refuses
 * them too. */
static void sizes_whose_products_overflow_are_refused(void **state) {
    static const char *const cases[][2] = {
        {"{\"input\": {\"shape\": [16777216, 16777216, 16777216]}, \"layers\": [{\"type\": "
         "\"flatten\"}, {\"type\": \"linear\", \"out\": 2}]}",
         "big.json: input.shape: (16777216, 16777216, 16777216) has more than the 4294967296 "
         "elements a tensor may hold"},
        {"{\"input\": {\"shape\": [16777216]}, \"layers\": [{\"type\": \"linear\", \"out\": "
         "16777216}, {\"type\": \"linear\", \"out\": 2}]}",
         "big.json: parameter layers.0.weight (16777216, 16777216) has more than the 4294967296 "
         "elements"},
        {"{\"input\": {\"shape\": [1, 65536, 65536]}, \"layers\": [{\"type\": \"conv2d\", "
         "\"out\": 2, \"kernel\": 1}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": "
         "2}]}",
         "big.json: layers[0]: conv2d gives (2, 65536, 65536) per sample, more than the "
         "4294967296 elements"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        td_model *m = (td_model *)0x1;
        td_model_info info;
        TD_ASSERT_STATUS(load_text(cases[i][0], &m), TD_ERR_PARSE);
        assert_null(m);
        td_test_assert_message_contains(cases[i][1]);
        TD_ASSERT_STATUS(td_model_describe(cases[i][0], "big.json", &info, NULL, 0), TD_ERR_PARSE);
        td_test_assert_message_contains(cases[i][1]);
    }
}

/* A model of residual blocks nested `depth` deep (then `repeats` repeat
 * blocks inside), each list holding `pad` relus before the next block, the
 * innermost two linears. malloc'ed. */
static char *nested_model(int depth, int repeats, int pad) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{\"input\": {\"shape\": [8]}, \"layers\": [");
    for (int d = 0; d < depth + repeats; d++) {
        for (int k = 0; d > 0 && k < pad; k++)
            n += (size_t)snprintf(s + n, cap - n, "{\"type\": \"relu\"}, ");
        n += (size_t)snprintf(s + n, cap - n,
                              d < depth ? "{\"type\": \"residual\", \"layers\": ["
                                        : "{\"type\": \"repeat\", \"count\": 1, \"layers\": [");
    }
    for (int k = 0; k < pad; k++)
        n += (size_t)snprintf(s + n, cap - n, "{\"type\": \"relu\"}, ");
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"type\": \"linear\", \"out\": 8}, {\"type\": \"linear\", \"out\": 8}");
    for (int d = 0; d < depth + repeats; d++)
        n += (size_t)snprintf(s + n, cap - n, "]}");
    snprintf(s + n, cap - n, ", {\"type\": \"linear\", \"out\": 3}]}");
    return s;
}

/* Issue 26, item 6: names past 63 characters stay whole and distinct (they
 * are checkpoint keys), and nesting past the limit, residual blocks counted
 * with repeat blocks, is refused up front. */
static void deep_nesting_keeps_names_whole_or_is_refused(void **state) {
    char *json = nested_model(TD_MODEL_MAX_DEPTH, 0, 100), want[256];
    size_t n = 0;
    td_model *m = NULL;
    TD_ASSERT_OK(load_text(json, &m));
    free(json);
    /* the first linear: layers.0, then .100 in each of the 15 nested lists, then its own */
    n += (size_t)snprintf(want, sizeof want, "layers.0");
    for (int d = 0; d < TD_MODEL_MAX_DEPTH; d++)
        n += (size_t)snprintf(want + n, sizeof want - n, ".100");
    snprintf(want + n, sizeof want - n, ".weight");
    assert_true(strlen(want) > 63);
    assert_string_equal(td_model_param_name(m, 0), want);
    want[strlen(want) - strlen("100.weight")] = '\0';
    strcat(want, "101.weight");
    assert_string_equal(td_model_param_name(m, 2), want);
    for (size_t i = 0; i < td_model_param_count(m); i++)
        for (size_t j = i + 1; j < td_model_param_count(m); j++)
            assert_string_not_equal(td_model_param_name(m, i), td_model_param_name(m, j));
    td_model_destroy(m);

    json = nested_model(TD_MODEL_MAX_DEPTH + 1, 0, 1);
    m = (td_model *)0x1;
    TD_ASSERT_STATUS(load_text(json, &m), TD_ERR_PARSE);
    assert_null(m);
    td_test_assert_message_contains("residual and repeat blocks nested more than 16 deep");
    free(json);
    /* residual blocks count toward the depth that repeat blocks did alone */
    json = nested_model(TD_MODEL_MAX_DEPTH / 2, TD_MODEL_MAX_DEPTH / 2 + 1, 1);
    TD_ASSERT_STATUS(load_text(json, &m), TD_ERR_PARSE);
    td_test_assert_message_contains("nested more than 16 deep");
    free(json);
}

static double *read_all(td_tensor *t) {
    double *v = malloc(sizeof(double) * td_tensor_numel(t));
    TD_ASSERT_OK(td_tensor_read_f64(t, v, td_tensor_numel(t)));
    return v;
}

static void seed_gives_same_weights_on_every_device(void **state) {
    td_device_list *list = td_test_open("cpu*2");
    td_model *a = NULL, *b = NULL, *c = NULL;
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/lenet5.json", td_device_list_get(list, 0),
                               TD_F32, 77, &a));
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/lenet5.json", td_device_list_get(list, 1),
                               TD_F32, 77, &b));
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/lenet5.json", td_device_list_get(list, 1),
                               TD_F32, 78, &c));
    for (size_t i = 0; i < td_model_param_count(a); i++) {
        td_compare_result r;
        size_t n = td_tensor_numel(td_model_param(a, i));
        double *w = read_all(td_model_param(a, i)), bound = 0;
        TD_ASSERT_OK(td_tensor_compare(td_model_param(a, i), td_model_param(b, i), &r));
        assert_true(r.max_abs == 0);
        TD_ASSERT_OK(td_tensor_compare(td_model_param(a, i), td_model_param(c, i), &r));
        assert_true(r.max_abs > 0);
        /* PyTorch's bound: 1 / sqrt(fan_in); conv1 has fan_in 25 */
        for (size_t k = 0; k < n; k++)
            bound = fmax(bound, fabs(w[k]));
        if (i == 0)
            assert_true(bound <= 0.2 && bound > 0.15);
        free(w);
    }
    td_model_destroy(a);
    td_model_destroy(b);
    td_model_destroy(c);
    td_device_list_destroy(list);
}

typedef struct hook_log {
    size_t next_end; /* params must arrive last-first, contiguous */
    size_t calls;
    int bad;
} hook_log;

static void hook(void *arg, size_t first, size_t count) {
    hook_log *h = arg;
    if (first + count != h->next_end)
        h->bad = 1;
    h->next_end = first;
    h->calls++;
}

static void step_accumulates_hooks_and_repeats_bitwise(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL, *m2 = NULL;
    int32_t tokens[2 * 128], labels[2 * 128];
    td_batch b = {2, NULL, tokens, labels};
    td_step_result r1, r2;
    hook_log h = {0, 0, 0};
    double *g1, *g2;
    size_t last;
    for (int i = 0; i < 256; i++) {
        tokens[i] = (int32_t)(td_rng_uniform(5, (uint64_t)i) * 256);
        labels[i] = (i * 31) % 256;
    }
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/gpt_tiny.json", td_device_list_get(list, 0),
                               TD_F32, 3, &m));
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/gpt_tiny.json", td_device_list_get(list, 0),
                               TD_F32, 3, &m2));
    last = td_model_param_count(m) - 1;
    h.next_end = td_model_param_count(m);
    td_model_set_grad_hook(m, hook, &h);
    TD_ASSERT_OK(td_model_train_step(m, &b, 1.0, 0, 0, &r1));
    assert_int_equal(h.next_end, 0);
    assert_false(h.bad);
    assert_true(h.calls >= 10);
    assert_int_equal(r1.count, 256);
    /* loss at initialisation is near log(256) per token, well above 0 */
    assert_true(r1.loss_sum / 256 > 2.0);
    td_model_set_grad_hook(m, NULL, NULL);
    g1 = read_all(td_model_grad(m, last));
    TD_ASSERT_OK(td_model_train_step(m, &b, 1.0, 1, 0, &r2));
    g2 = read_all(td_model_grad(m, last));
    assert_true(r1.loss_sum == r2.loss_sum);
    for (size_t i = 0; i < td_tensor_numel(td_model_grad(m, last)); i++)
        assert_true(fabs(g2[i] - 2 * g1[i]) <= 1e-5 * fabs(g1[i]) + 1e-7);
    /* the same step on a twin model gives bitwise the same gradients */
    TD_ASSERT_OK(td_model_train_step(m2, &b, 1.0, 0, 0, &r2));
    assert_true(r1.loss_sum == r2.loss_sum);
    free(g2);
    g2 = read_all(td_model_grad(m2, last));
    assert_memory_equal(g1, g2, sizeof(double) * td_tensor_numel(td_model_grad(m, last)));
    /* bad tokens are an error, not a crash */
    tokens[5] = 300;
    TD_ASSERT_STATUS(td_model_train_step(m, &b, 1.0, 0, 0, &r2), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("token 300");
    free(g1);
    free(g2);
    td_model_destroy(m);
    td_model_destroy(m2);
    td_device_list_destroy(list);
}

/* {latency=MS} and {slowdown=F} hold for a model's passes whatever runs
 * them, here with no strategy at all: the throttle spins to its deadline,
 * so a pass cannot take less than the added milliseconds (a lower bound,
 * which a slow machine only exceeds). */
static void a_slowed_device_is_slowed_without_a_strategy(void **state) {
    td_device_list *list = td_test_open("cpu:0{latency=40}");
    td_model *m = NULL;
    float x[2 * 784] = {0};
    int32_t labels[2] = {3, 7};
    td_batch b = {2, x, NULL, labels};
    td_step_result r;
    uint64_t t0;
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/mnist_mlp.json",
                               td_device_list_get(list, 0), TD_F32, 1, &m));
    t0 = td_clock_ns();
    TD_ASSERT_OK(td_model_train_step(m, &b, 0.5, 0, 0, &r));
    if (td_clock_ns() - t0 < 40000000u)
        fail_msg("a training pass on a device with latency=40 took %.1f ms",
                 (double)(td_clock_ns() - t0) * 1e-6);
    t0 = td_clock_ns();
    TD_ASSERT_OK(td_model_evaluate(m, &b, &r));
    if (td_clock_ns() - t0 < 40000000u)
        fail_msg("an evaluation pass on a device with latency=40 took %.1f ms",
                 (double)(td_clock_ns() - t0) * 1e-6);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

static void optimizer_schedule_and_clipping(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_model *m = NULL;
    td_optimizer *o = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    float x[4 * 784];
    int32_t y[4] = {1, 2, 3, 4};
    td_batch b = {4, x, NULL, y};
    double norm, norm2, *before, *after, *g;
    size_t n;
    for (int i = 0; i < 4 * 784; i++)
        x[i] = (float)td_rng_normal(9, (uint64_t)i);
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/mnist_mlp.json",
                               td_device_list_get(list, 0), TD_F64, 1, &m));
    cfg.kind = TD_OPT_SGD;
    cfg.momentum = 0;
    cfg.lr = 0.1;
    cfg.schedule = TD_LR_COSINE;
    cfg.warmup_steps = 10;
    cfg.total_steps = 110;
    cfg.min_lr = 0.01;
    cfg.clip_norm = 1e-3;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &o));
    assert_int_equal(td_optimizer_state_count(o), 0);
    assert_true(fabs(td_optimizer_lr(o) - 0.01) < 1e-12); /* warm-up: 1/10 of lr */
    td_optimizer_set_steps(o, 10);
    assert_true(fabs(td_optimizer_lr(o) - 0.1) < 1e-12);
    td_optimizer_set_steps(o, 60);
    assert_true(fabs(td_optimizer_lr(o) - 0.055) < 1e-12);
    td_optimizer_set_steps(o, 500);
    assert_true(fabs(td_optimizer_lr(o) - 0.01) < 1e-12);
    td_optimizer_set_steps(o, 60);
    /* plain SGD with clipping: w' = w - lr * g * clip / (norm + 1e-6) */
    TD_ASSERT_OK(td_model_train_step(m, &b, 0.25, 0, 0, NULL));
    n = td_tensor_numel(td_model_param(m, 0));
    before = read_all(td_model_param(m, 0));
    g = read_all(td_model_grad(m, 0));
    TD_ASSERT_OK(td_optimizer_step(o, &norm));
    after = read_all(td_model_param(m, 0));
    assert_true(norm > 1e-3);
    for (size_t i = 0; i < n; i += 97)
        assert_true(fabs(after[i] - (before[i] - 0.055 * g[i] * 1e-3 / (norm + 1e-6))) < 1e-15);
    assert_int_equal(td_optimizer_steps(o), 61);
    td_optimizer_destroy(o);
    /* AdamW keeps two named moments per parameter */
    cfg.kind = TD_OPT_ADAMW;
    cfg.clip_norm = 0;
    cfg.schedule = TD_LR_CONSTANT;
    cfg.warmup_steps = 0;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &o));
    assert_int_equal(td_optimizer_state_count(o), 12);
    assert_string_equal(td_optimizer_state_name(o, 0), "layers.0.weight.exp_avg");
    assert_string_equal(td_optimizer_state_name(o, 1), "layers.0.weight.exp_avg_sq");
    TD_ASSERT_OK(td_optimizer_step(o, &norm2));
    assert_true(fabs(norm2 - norm) < 1e-12 * norm);
    td_optimizer_destroy(o);
    cfg.momentum = 1.5;
    TD_ASSERT_STATUS(td_optimizer_create(m, &cfg, &o), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("momentum");
    free(before);
    free(after);
    free(g);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(examples_load),
        cmocka_unit_test(bad_files_name_file_layer_and_field),
        cmocka_unit_test_setup_teardown(models_too_large_are_refused_before_building, size_setup,
                                        size_teardown),
        cmocka_unit_test_setup_teardown(sizes_whose_products_overflow_are_refused, size_setup,
                                        size_teardown),
        cmocka_unit_test_setup_teardown(deep_nesting_keeps_names_whole_or_is_refused, size_setup,
                                        size_teardown),
        cmocka_unit_test(seed_gives_same_weights_on_every_device),
        cmocka_unit_test(step_accumulates_hooks_and_repeats_bitwise),
        cmocka_unit_test(optimizer_schedule_and_clipping),
        cmocka_unit_test(a_slowed_device_is_slowed_without_a_strategy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
