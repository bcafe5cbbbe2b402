/* Model parts (pipeline stages) against the whole model: the same parameter
 * names and initial values, the same loss and gradients when parts on
 * several devices pass micro-batches along (dropout included), a
 * description that builds nothing on a device, a slot over a device's
 * budget, and bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

/* A small GPT with dropout: 2 blocks, 32 channels, context 16, vocabulary 64. */
static const char gpt_small[] =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32, \"positions\": true},"
    "{\"type\": \"dropout\", \"p\": 0.2},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"attention\", \"heads\": 4}]},"
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"},"
    "    {\"type\": \"dropout\", \"p\": 0.25}, {\"type\": \"linear\", \"out\": 32}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

/* An MLP with dropout between its layers. */
static const char mlp_dropout[] = "{\"input\": {\"shape\": [12]}, \"layers\": ["
                                  "{\"type\": \"linear\", \"out\": 24}, {\"type\": \"relu\"}, "
                                  "{\"type\": \"dropout\", \"p\": 0.3},"
                                  "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"tanh\"}, "
                                  "{\"type\": \"dropout\", \"p\": 0.5},"
                                  "{\"type\": \"linear\", \"out\": 5}]}";

static char *example(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/examples/%s", TD_SOURCE_DIR, file);
    return (char *)td_test_read_file(path, NULL);
}

static double *read_all(td_tensor *t) {
    double *v = malloc(sizeof(double) * td_tensor_numel(t) + 1);
    TD_ASSERT_OK(td_tensor_read_f64(t, v, td_tensor_numel(t)));
    return v;
}

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Cuts [0, layers) into `count` parts: cut[0] = 0 < cut[1] < ... < cut[count] = layers. */
static void cuts(int layers, int count, int *cut) {
    for (int k = 0; k <= count; k++)
        cut[k] = layers * k / count;
}

static int layers_of(const char *json) {
    td_model_info info;
    TD_ASSERT_OK(td_model_describe(json, "m.json", &info, NULL, 0));
    return info.layers;
}

/* 1. Parameter names and initial values ---------------------------------------------------- */

static void check_parts_start_as_whole(const char *json, td_device *dev) {
    int cut[4], L = layers_of(json);
    td_model *whole = NULL;
    size_t next = 0;
    cuts(L, 3, cut);
    TD_ASSERT_OK(td_model_load_string(json, "m.json", dev, TD_F64, 1234, &whole));
    for (int k = 0; k < 3; k++) {
        td_model *part = NULL;
        int first, end;
        size_t first_param;
        td_model_info a, b;
        TD_ASSERT_OK(
            td_model_load_part(json, "m.json", dev, TD_F64, 1234, cut[k], cut[k + 1], 1, &part));
        td_model_part_range(part, &first, &end, &first_param);
        assert_int_equal(first, cut[k]);
        assert_int_equal(end, cut[k + 1]);
        assert_int_equal(first_param, next);
        td_model_get_info(part, &a);
        td_model_get_info(whole, &b);
        assert_memory_equal(&a, &b, sizeof a);
        for (size_t i = 0; i < td_model_param_count(part); i++) {
            td_tensor *p = td_model_param(part, i), *w = td_model_param(whole, first_param + i);
            double *pv, *wv;
            assert_non_null(w);
            assert_string_equal(td_model_param_name(part, i),
                                td_model_param_name(whole, first_param + i));
            assert_int_equal(td_tensor_numel(p), td_tensor_numel(w));
            pv = read_all(p);
            wv = read_all(w);
            assert_memory_equal(pv, wv, sizeof(double) * td_tensor_numel(p));
            free(pv);
            free(wv);
        }
        next += td_model_param_count(part);
        td_model_destroy(part);
    }
    assert_int_equal(next, td_model_param_count(whole));
    td_model_destroy(whole);
}

static void parts_have_the_whole_models_names_and_values(void **state) {
    static const char *const files[] = {"mnist_mlp.json", "lenet5.json", "gpt_tiny.json"};
    td_device_list *list = td_test_open("cpu:0");
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char *json = example(files[f]);
        check_parts_start_as_whole(json, td_device_list_get(list, 0));
        free(json);
    }
    check_parts_start_as_whole(gpt_small, td_device_list_get(list, 0));
    td_device_list_destroy(list);
}

/* 2. Chained parts against one whole step ------------------------------------------------ */

typedef struct chain_case {
    const char *json;
    int64_t batch;
    int parts;
    int micro;     /* micro-batches */
    uint64_t step; /* dropout step */
} chain_case;

static void check_chain(const chain_case *c, td_device_list *list) {
    td_model_info info;
    td_model *whole = NULL, *part[3] = {NULL, NULL, NULL};
    int cut[4];
    int64_t feats, lps, off[5];
    size_t first_param[3];
    float *x = NULL;
    int32_t *tokens = NULL, *labels;
    uint64_t s = 99;
    td_batch b = {c->batch, NULL, NULL, NULL};
    td_step_result whole_res, res;
    double loss = 0, scale;
    int64_t count = 0, correct = 0;

    TD_ASSERT_OK(td_model_describe(c->json, "m.json", &info, NULL, 0));
    feats = 1;
    for (int i = 0; i < info.in_ndim; i++)
        feats *= info.in_shape[i];
    lps = info.kind == TD_INPUT_TOKENS ? info.in_shape[0] : 1;
    labels = malloc(sizeof *labels * (size_t)(c->batch * lps));
    for (int64_t i = 0; i < c->batch * lps; i++)
        labels[i] = (int32_t)(lcg(&s) % (uint32_t)info.classes);
    if (info.kind == TD_INPUT_TOKENS) {
        tokens = malloc(sizeof *tokens * (size_t)(c->batch * feats));
        for (int64_t i = 0; i < c->batch * feats; i++)
            tokens[i] = (int32_t)(lcg(&s) % (uint32_t)info.classes);
    } else {
        x = malloc(sizeof *x * (size_t)(c->batch * feats));
        for (int64_t i = 0; i < c->batch * feats; i++)
            x[i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
    }
    b.x = x;
    b.tokens = tokens;
    b.labels = labels;
    scale = 1.0 / (double)(c->batch * lps);

    TD_ASSERT_OK(
        td_model_load_string(c->json, "m.json", td_device_list_get(list, 0), TD_F64, 7, &whole));
    TD_ASSERT_OK(td_model_train_step(whole, &b, scale, 0, c->step, &whole_res));

    cuts(info.layers, c->parts, cut);
    for (int k = 0; k < c->parts; k++) {
        TD_ASSERT_OK(td_model_load_part(c->json, "m.json", td_device_list_get(list, (size_t)k),
                                        TD_F64, 7, cut[k], cut[k + 1], c->micro, &part[k]));
        td_model_part_range(part[k], NULL, NULL, &first_param[k]);
    }
    /* uneven micro-batches: the last takes the rest */
    for (int j = 0; j <= c->micro; j++)
        off[j] = j == c->micro ? c->batch : c->batch * j / c->micro + (j > 0 && j < c->micro);
    for (int j = 0; j < c->micro; j++) {
        td_batch mb = {off[j + 1] - off[j], x ? x + off[j] * feats : NULL,
                       tokens ? tokens + off[j] * feats : NULL, labels + off[j] * lps};
        for (int k = 0; k < c->parts; k++) {
            const td_buffer *in = k ? td_model_part_output(part[k - 1], j) : NULL;
            TD_ASSERT_OK(
                td_model_part_forward(part[k], j, &mb, off[j], in, 1, c->step, scale, &res));
            if (k < c->parts - 1) {
                assert_int_equal(res.count, 0);
                assert_non_null(td_model_part_output(part[k], j));
            }
        }
        loss += res.loss_sum;
        correct += res.correct;
        count += res.count;
    }
    /* backward in another order than forward, gradients added up */
    for (int j = c->micro - 1; j >= 0; j--)
        for (int k = c->parts - 1; k >= 0; k--) {
            const td_buffer *dout =
                k < c->parts - 1 ? td_model_part_input_grad(part[k + 1], j) : NULL;
            if (k < c->parts - 1)
                assert_non_null(dout);
            TD_ASSERT_OK(td_model_part_backward(part[k], j, dout, j != c->micro - 1));
        }
    assert_null(td_model_part_input_grad(part[0], 0));
    assert_int_equal(count, whole_res.count);
    assert_int_equal(correct, whole_res.correct);
    assert_true(fabs(loss - whole_res.loss_sum) <= 1e-12 * fabs(whole_res.loss_sum));
    for (int k = 0; k < c->parts; k++)
        for (size_t i = 0; i < td_model_param_count(part[k]); i++) {
            td_tensor *pg = td_model_grad(part[k], i),
                      *wg = td_model_grad(whole, first_param[k] + i);
            double *pv = read_all(pg), *wv = read_all(wg), big = 0;
            size_t n = td_tensor_numel(wg);
            assert_int_equal(td_tensor_numel(pg), n);
            for (size_t e = 0; e < n; e++)
                big = fmax(big, fabs(wv[e]));
            assert_true(big > 0);
            for (size_t e = 0; e < n; e++)
                if (fabs(pv[e] - wv[e]) > 1e-12 * big)
                    fail_msg("%s[%zu]: part %g, whole %g",
                             td_model_param_name(whole, first_param[k] + i), e, pv[e], wv[e]);
            free(pv);
            free(wv);
        }
    for (int k = 0; k < c->parts; k++)
        td_model_destroy(part[k]);
    td_model_destroy(whole);
    free(x);
    free(tokens);
    free(labels);
}

static void chained_parts_match_one_whole_step(void **state) {
    td_device_list *list = td_test_open("cpu*3");
    char *mlp = example("mnist_mlp.json"), *lenet = example("lenet5.json");
    const chain_case cases[] = {
        {mlp, 8, 3, 3, 0},          {lenet, 6, 2, 2, 0},     {mlp_dropout, 10, 3, 4, 5},
        {mlp_dropout, 7, 2, 2, 11}, {gpt_small, 5, 3, 2, 3}, {gpt_small, 6, 2, 3, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_chain(&cases[i], list);
    free(mlp);
    free(lenet);
    td_device_list_destroy(list);
}

/* A slot used again with another micro-batch size, and evaluation (no
 * dropout, no loss gradient) on the last part. */
static void slots_are_reused_and_evaluation_has_no_gradient(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_model *part = NULL, *whole = NULL;
    float x[5 * 12];
    int32_t labels[5];
    td_batch b = {5, x, NULL, labels};
    td_step_result r, w;
    uint64_t s = 5;
    for (int i = 0; i < 60; i++)
        x[i] = (float)(lcg(&s) % 100) / 50.0f - 1.0f;
    for (int i = 0; i < 5; i++)
        labels[i] = (int32_t)(lcg(&s) % 5);
    TD_ASSERT_OK(td_model_load_string(mlp_dropout, "m.json", dev, TD_F64, 3, &whole));
    TD_ASSERT_OK(td_model_load_part(mlp_dropout, "m.json", dev, TD_F64, 3, 0, 7, 2, &part));
    TD_ASSERT_OK(td_model_evaluate(whole, &b, &w));
    b.n = 2;
    TD_ASSERT_OK(td_model_part_forward(part, 1, &b, 0, NULL, 1, 0, 1.0, &r));
    b.n = 5;
    TD_ASSERT_OK(td_model_part_forward(part, 1, &b, 0, NULL, 0, 0, 1.0, &r));
    assert_int_equal(r.count, 5);
    assert_true(fabs(r.loss_sum - w.loss_sum) <= 1e-12 * fabs(w.loss_sum));
    TD_ASSERT_STATUS(td_model_part_backward(part, 1, NULL, 0), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("no training forward");
    /* a part is not a model for the whole-batch step */
    td_model_destroy(part);
    TD_ASSERT_OK(td_model_load_part(mlp_dropout, "m.json", dev, TD_F64, 3, 0, 3, 1, &part));
    TD_ASSERT_STATUS(td_model_train_step(part, &b, 1.0, 0, 0, &r), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("td_model_part_forward");
    td_model_destroy(part);
    td_model_destroy(whole);
    td_device_list_destroy(list);
}

/* The backward in two halves (input, then weights) against the fused one:
 * the same parameter gradients and input gradients, bitwise, for a part
 * that starts the model (embedding) and one that does not, with a tied
 * head, the weights slot by slot (halves 1) and both slots in one call
 * (halves 2); and the order the halves must come in. */
static void run_halves(td_model *m, td_model *prefix, int halves, const td_batch *mb,
                       double **in_grads) {
    const td_buffer *in[2] = {NULL, NULL};
    for (int j = 0; j < 2; j++) {
        if (prefix) {
            TD_ASSERT_OK(td_model_part_forward(prefix, j, &mb[j], 2 * j, NULL, 1, 9, 1.0, NULL));
            in[j] = td_model_part_output(prefix, j);
        }
        TD_ASSERT_OK(td_model_part_forward(m, j, &mb[j], 2 * j, in[j], 1, 9, 1.0, NULL));
    }
    for (int j = 0; j < 2; j++) {
        const td_buffer *g;
        if (halves) {
            TD_ASSERT_OK(td_model_part_backward_input(m, j, NULL, j > 0));
            if (j == 0) { /* the slot owes its weights: no forward into it yet */
                TD_ASSERT_STATUS(td_model_part_forward(m, 0, &mb[0], 0, in[0], 1, 9, 1.0, NULL),
                                 TD_ERR_INVALID_ARG);
                td_test_assert_message_contains("td_model_part_backward_weights");
            }
        } else {
            TD_ASSERT_OK(td_model_part_backward(m, j, NULL, j > 0));
        }
        if ((g = td_model_part_input_grad(m, j)) != NULL) {
            in_grads[j] = malloc(td_buffer_size(g));
            TD_ASSERT_OK(td_buffer_read(g, 0, in_grads[j], td_buffer_size(g)));
        }
    }
    if (halves == 1) {
        for (int j = 0; j < 2; j++)
            TD_ASSERT_OK(td_model_part_backward_weights(m, j));
    } else if (halves == 2) {
        static const int twice[2] = {1, 1}, both[2] = {0, 1};
        TD_ASSERT_STATUS(td_model_part_backward_weights_many(m, both, 0), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("expected at least one slot");
        TD_ASSERT_STATUS(td_model_part_backward_weights_many(m, NULL, 2), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("slots is NULL");
        TD_ASSERT_STATUS(td_model_part_backward_weights_many(m, twice, 2), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("slot 1 given twice");
        TD_ASSERT_OK(td_model_part_backward_weights_many(m, both, 2));
    }
    if (halves) {
        TD_ASSERT_STATUS(td_model_part_backward_weights(m, 0), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("owes no weight gradients");
    }
}

static void check_halves(const char *json, int first, td_device *dev) {
    int L = layers_of(json);
    int32_t tokens[4 * 16], labels[4 * 16];
    td_batch mb[2];
    td_model *fused = NULL, *halves[2] = {NULL, NULL}, *prefix = NULL;
    double *in_f[2] = {NULL, NULL}, *in_h[2][2] = {{NULL, NULL}, {NULL, NULL}};
    uint64_t s = 11;
    for (int i = 0; i < 4 * 16; i++) {
        tokens[i] = (int32_t)(lcg(&s) % 64);
        labels[i] = (int32_t)(lcg(&s) % 64);
    }
    for (int j = 0; j < 2; j++)
        mb[j] = (td_batch){2, NULL, tokens + 2 * 16 * j, labels + 2 * 16 * j};
    if (first > 0)
        TD_ASSERT_OK(td_model_load_part(json, "m.json", dev, TD_F64, 7, 0, first, 2, &prefix));
    TD_ASSERT_OK(td_model_load_part(json, "m.json", dev, TD_F64, 7, first, L, 2, &fused));
    run_halves(fused, prefix, 0, mb, in_f);
    assert_true(td_model_param_count(fused) > 0);
    for (int h = 0; h < 2; h++) {
        TD_ASSERT_OK(td_model_load_part(json, "m.json", dev, TD_F64, 7, first, L, 2, &halves[h]));
        run_halves(halves[h], prefix, h + 1, mb, in_h[h]);
        for (size_t i = 0; i < td_model_param_count(fused); i++) {
            double *a = read_all(td_model_grad(fused, i)),
                   *b = read_all(td_model_grad(halves[h], i));
            assert_memory_equal(a, b, sizeof(double) * td_tensor_numel(td_model_grad(fused, i)));
            free(a);
            free(b);
        }
        for (int j = 0; j < 2; j++) {
            assert_true((in_f[j] == NULL) == (first == 0));
            if (in_f[j])
                assert_memory_equal(in_f[j], in_h[h][j], sizeof(double) * 2 * 16 * 32);
            free(in_h[h][j]);
        }
        td_model_destroy(halves[h]);
    }
    for (int j = 0; j < 2; j++)
        free(in_f[j]);
    td_model_destroy(fused);
    td_model_destroy(prefix);
}

static void backward_in_two_halves_is_the_fused_one_bitwise(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    char tied[sizeof gpt_small + 64], *head;
    (void)state;
    snprintf(tied, sizeof tied, "%s", gpt_small);
    head = strstr(tied, "{\"type\": \"linear\", \"out\": 64}]}");
    assert_non_null(head);
    snprintf(head, sizeof tied - (size_t)(head - tied),
             "{\"type\": \"linear\", \"out\": 64, \"bias\": false, \"tied\": true}]}");
    check_halves(gpt_small, 0, td_device_list_get(list, 0));
    check_halves(gpt_small, 2, td_device_list_get(list, 0));
    check_halves(tied, 0, td_device_list_get(list, 0));
    td_device_list_destroy(list);
}

/* 3. Describing ----------------------------------------------------------------------------- */

static void describe_matches_the_loaded_model(void **state) {
    static const struct {
        const char *file;
        int layers;
        int64_t classes;
    } files[] = {{"mnist_mlp.json", 5, 10}, {"lenet5.json", 12, 10}, {"gpt_tiny.json", 11, 256}};
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char *json = example(files[f].file);
        td_model_info info, got;
        td_layer_info li[16];
        td_model *m = NULL;
        size_t sum = 0;
        uint64_t used = td_device_mem_used(dev);
        memset(li, 0xA5, sizeof li);
        TD_ASSERT_OK(td_model_describe(json, files[f].file, &info, li, 16));
        assert_int_equal(td_device_mem_used(dev), used);
        assert_int_equal(info.layers, files[f].layers);
        assert_int_equal(info.classes, files[f].classes);
        TD_ASSERT_OK(td_model_load_string(json, files[f].file, dev, TD_F32, 1, &m));
        assert_int_equal(info.num_weights, td_model_num_weights(m));
        td_model_get_info(m, &got);
        assert_memory_equal(&got, &info, sizeof info);
        for (int i = 0; i < info.layers; i++)
            sum += li[i].weights;
        assert_int_equal(sum, info.num_weights);
        /* the last layer gives the logits */
        assert_int_equal(li[info.layers - 1].out_shape[li[info.layers - 1].out_ndim - 1],
                         info.classes);
        td_model_destroy(m);
        free(json);
    }
    {
        char *json = example("mnist_mlp.json");
        td_model_info info;
        td_layer_info li[2];
        TD_ASSERT_OK(td_model_describe(json, "mlp", &info, li, 2));
        /* linear 784 -> 256: out and dout, 512 a sample */
        assert_string_equal(li[0].type, "linear");
        assert_int_equal(li[0].weights, 784 * 256 + 256);
        assert_true(li[0].act_per_sample >= 512 && li[0].act_per_sample <= 512 * 12 / 10);
        assert_string_equal(li[1].type, "relu");
        assert_int_equal(li[1].out_ndim, 1);
        assert_int_equal(li[1].out_shape[0], 256);
        free(json);
    }
    {
        /* gpt_tiny's attention block keeps its scores: (4, 128, 128) at least */
        char *json = example("gpt_tiny.json");
        td_model_info info;
        td_layer_info li[11];
        TD_ASSERT_OK(td_model_describe(json, "gpt", &info, li, 11));
        assert_string_equal(li[1].type, "residual");
        assert_true(li[1].act_per_sample >= 4 * 128 * 128);
        assert_true(li[1].act_per_sample < 6 * 4 * 128 * 128);
        free(json);
    }
    td_device_list_destroy(list);
}

static void describe_fails_as_load_does(void **state) {
    static const char *const bad[] = {
        "{\"input\": {\"shape\": [4]}, \"layers\": [",
        "{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"relu\"}, {\"type\": \"linear\", "
        "\"out\": 3}, {\"type\": \"linear\", \"out\": -2}]}",
        "{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"lnear\", \"out\": 3}]}",
        "{\"input\": {\"tokens\": 4, \"vocab\": 9}, \"layers\": [{\"type\": \"linear\", \"out\": "
        "3}]}",
        "{\"input\": {\"shape\": [4]}, \"layers\": [{\"type\": \"linear\", \"out\": 3}, {\"type\": "
        "\"relu\"}, {\"type\": \"flatten\"}, {\"type\": \"attention\", \"heads\": 2}]}",
    };
    td_device_list *list = td_test_open("cpu:0");
    td_model_info info;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        td_model *m = NULL;
        char want[1024];
        td_status a = td_model_load_string(bad[i], "bad.json", td_device_list_get(list, 0), TD_F32,
                                           1, &m),
                  b;
        assert_null(m);
        assert_int_not_equal(a, TD_OK);
        snprintf(want, sizeof want, "%s", td_last_error());
        b = td_model_describe(bad[i], "bad.json", &info, NULL, 0);
        assert_int_equal(a, b);
        assert_string_equal(td_last_error(), want);
    }
    TD_ASSERT_STATUS(td_model_describe(NULL, "x", &info, NULL, 0), TD_ERR_INVALID_ARG);
    td_device_list_destroy(list);
}

/* 4. A device's budget ------------------------------------------------------------------------ */

static void slots_over_a_budget_fail_naming_the_device(void **state) {
    td_device_list *list = td_test_open("cpu:0{mem=1M},cpu:1");
    td_device *small = td_device_list_get(list, 0), *big = td_device_list_get(list, 1);
    char *json = example("mnist_mlp.json");
    td_model *part = NULL;
    td_buffer *in = NULL;
    int32_t labels[100] = {0};
    td_batch mb = {100, NULL, NULL, labels};
    void *zeros = calloc(100 * 256, sizeof(float));
    /* layers [1, 5): 33K parameters; a slot of 100 samples is about half the budget */
    TD_ASSERT_OK(td_model_load_part(json, "mnist_mlp.json", small, TD_F32, 1, 1, 5, 2, &part));
    TD_ASSERT_OK(td_buffer_alloc(big, 100 * 256 * sizeof(float), &in));
    TD_ASSERT_OK(td_buffer_write(in, 0, zeros, 100 * 256 * sizeof(float)));
    TD_ASSERT_OK(td_model_part_forward(part, 0, &mb, 0, in, 1, 0, 0.01, NULL));
    TD_ASSERT_STATUS(td_model_part_forward(part, 1, &mb, 0, in, 1, 0, 0.01, NULL),
                     TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cpu:0");
    assert_null(td_model_part_output(part, 1));
    /* slot 0 still works */
    TD_ASSERT_OK(td_model_part_backward(part, 0, NULL, 0));
    assert_non_null(td_model_part_input_grad(part, 0));
    td_model_destroy(part);
    td_buffer_free(in);
    assert_int_equal(td_device_mem_used(small), 0);
    free(zeros);
    free(json);
    td_device_list_destroy(list);
}

/* 5. Bad arguments ----------------------------------------------------------------------------- */

static void bad_arguments_are_refused(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    char *json = example("mnist_mlp.json");
    td_model *part = (td_model *)1;
    float x[784] = {0};
    int32_t label = 3;
    td_batch mb = {1, x, NULL, &label};
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", dev, TD_F32, 1, 3, 3, 1, &part),
                     TD_ERR_INVALID_ARG);
    assert_null(part);
    td_test_assert_message_contains("[3, 3)");
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", dev, TD_F32, 1, 4, 2, 1, &part),
                     TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", dev, TD_F32, 1, -1, 2, 1, &part),
                     TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", dev, TD_F32, 1, 2, 6, 1, &part),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("has 5 layers");
    assert_null(part);
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", dev, TD_F32, 1, 0, 2, 0, &part),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("slots");
    TD_ASSERT_STATUS(td_model_load_part(json, "mlp", NULL, TD_F32, 1, 0, 2, 1, &part),
                     TD_ERR_INVALID_ARG);

    TD_ASSERT_OK(td_model_load_part(json, "mlp", dev, TD_F32, 1, 2, 5, 2, &part));
    TD_ASSERT_STATUS(td_model_part_forward(part, 2, &mb, 0, NULL, 1, 0, 1.0, NULL),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("slot 2");
    TD_ASSERT_STATUS(td_model_part_forward(part, -1, &mb, 0, NULL, 1, 0, 1.0, NULL),
                     TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_model_part_forward(part, 0, &mb, 0, NULL, 1, 0, 1.0, NULL),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("`in` is NULL");
    TD_ASSERT_STATUS(td_model_part_forward(part, 0, NULL, 0, NULL, 1, 0, 1.0, NULL),
                     TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_model_part_backward(part, 0, NULL, 0), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_model_part_backward(part, 5, NULL, 0), TD_ERR_INVALID_ARG);
    assert_null(td_model_part_output(part, 0));
    assert_null(td_model_part_output(part, 9));
    assert_null(td_model_part_input_grad(part, 0));
    {
        /* an input too small for the micro-batch */
        td_buffer *in = NULL;
        TD_ASSERT_OK(td_buffer_alloc(dev, 10, &in));
        TD_ASSERT_STATUS(td_model_part_forward(part, 0, &mb, 0, in, 1, 0, 1.0, NULL),
                         TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("bytes");
        td_buffer_free(in);
    }
    td_model_destroy(part);

    /* a part that does not end the model needs dout */
    TD_ASSERT_OK(td_model_load_part(json, "mlp", dev, TD_F32, 1, 0, 2, 1, &part));
    TD_ASSERT_OK(td_model_part_forward(part, 0, &mb, 0, NULL, 1, 0, 1.0, NULL));
    TD_ASSERT_STATUS(td_model_part_backward(part, 0, NULL, 0), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("dout");
    td_model_destroy(part);
    td_model_part_range(NULL, NULL, NULL, NULL);
    td_model_get_info(NULL, NULL);
    free(json);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parts_have_the_whole_models_names_and_values),
        cmocka_unit_test(chained_parts_match_one_whole_step),
        cmocka_unit_test(slots_are_reused_and_evaluation_has_no_gradient),
        cmocka_unit_test(backward_in_two_halves_is_the_fused_one_bitwise),
        cmocka_unit_test(describe_matches_the_loaded_model),
        cmocka_unit_test(describe_fails_as_load_does),
        cmocka_unit_test(slots_over_a_budget_fail_naming_the_device),
        cmocka_unit_test(bad_arguments_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
