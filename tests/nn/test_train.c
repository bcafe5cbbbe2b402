/* Short training runs through the public API: the loss must fall and the
 * accuracy rise on a separable synthetic problem, for each example model
 * kind and each optimizer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

/* n samples of dim features: class c is a fixed random prototype plus noise. */
static void make_blobs(int64_t n, int64_t dim, int classes, uint64_t seed, float *x,
                       int32_t *labels) {
    for (int64_t i = 0; i < n; i++) {
        int c = (int)(td_rng_uniform(seed, (uint64_t)i) * classes);
        labels[i] = c;
        for (int64_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(td_rng_normal(1000 + (uint64_t)c, (uint64_t)j) +
                                     0.7 * td_rng_normal(seed + 1, (uint64_t)(i * dim + j)));
    }
}

static void run_mlp(td_optimizer_kind kind, const char *spec, td_dtype dt) {
    td_device_list *list = td_test_open(spec);
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    int64_t n = 64, dim = 784;
    float *x = malloc(sizeof(float) * (size_t)(n * dim));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    td_batch b = {n, x, NULL, y};
    td_step_result first = {0}, last = {0}, ev;
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/mnist_mlp.json",
                               td_device_list_get(list, 0), dt, 42, &m));
    assert_int_equal(td_model_param_count(m), 6);
    assert_int_equal(td_model_num_weights(m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    assert_string_equal(td_model_param_name(m, 0), "layers.0.weight");
    assert_string_equal(td_model_param_name(m, 5), "layers.4.bias");
    assert_int_equal(td_model_num_classes(m), 10);
    cfg.kind = kind;
    cfg.lr = kind == TD_OPT_ADAMW ? 1e-3 : 0.05;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    for (int step = 0; step < 30; step++) {
        td_step_result r;
        /* the same classes, a different sample each step */
        make_blobs(n, dim, 10, 100 + (uint64_t)step, x, y);
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / (double)n, 0, (uint64_t)step, &r));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
        if (step == 0)
            first = r;
        last = r;
    }
    TD_ASSERT_OK(td_model_evaluate(m, &b, &ev));
    assert_int_equal(ev.count, n);
    if (!(last.loss_sum < 0.5 * first.loss_sum))
        fail_msg("loss fell from %g to %g only", first.loss_sum / n, last.loss_sum / n);
    if (ev.correct < n * 9 / 10)
        fail_msg("accuracy %lld of %lld after training", (long long)ev.correct, (long long)n);
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free(x);
    free(y);
}

static void mlp_sgd_loss_falls(void **state) {
    run_mlp(TD_OPT_SGD, "cpu:0", TD_F32);
}
static void mlp_adamw_loss_falls_two_cores(void **state) {
    run_mlp(TD_OPT_ADAMW, "cpu", TD_F32);
}
static void mlp_f64_loss_falls(void **state) {
    run_mlp(TD_OPT_SGD, "cpu:0", TD_F64);
}

/* LeNet-5 on 28x28 blobs: a few steps of SGD with momentum. */
static void lenet_loss_falls(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    int64_t n = 32, dim = 784;
    float *x = malloc(sizeof(float) * (size_t)(n * dim));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    td_batch b = {n, x, NULL, y};
    td_step_result first = {0}, last = {0};
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/lenet5.json", td_device_list_get(list, 0),
                               TD_F32, 5, &m));
    cfg.lr = 0.05;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    for (int step = 0; step < 40; step++) {
        make_blobs(n, dim, 10, 300 + (uint64_t)step, x, y);
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / (double)n, 0, (uint64_t)step, &last));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
        if (step == 0)
            first = last;
    }
    /* from log(10) = 2.3 nats; LeNet leaves its plateau slowly at first */
    if (!(last.loss_sum < 0.8 * first.loss_sum))
        fail_msg("loss fell from %g to %g only", first.loss_sum / n, last.loss_sum / n);
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free(x);
    free(y);
}

/* A small character GPT (gpt_tiny's layers, narrower and shorter, so the test
 * stays quick under the sanitizers) learns a periodic byte sequence with
 * AdamW, warm-up, cosine decay and clipping. */
static const char *const small_gpt =
    "{\"input\": {\"tokens\": 32, \"vocab\": 256}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 256, \"dim\": 64},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 256}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": 64}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 256}]}";

/* The same with llama_tiny's layers: RMSNorm, grouped-query attention with
 * rotary positions (no position embedding), SwiGLU, no biases. */
static const char *const small_llama =
    "{\"input\": {\"tokens\": 32, \"vocab\": 256}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 256, \"dim\": 64, \"positions\": false},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000, "
    "\"qkv_bias\": false, \"proj_bias\": false}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"swiglu\", \"hidden\": 172}]}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 256, \"bias\": false}]}";

static void token_model_loss_falls(const char *json) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    enum { N = 8, T = 32 };
    int32_t *tok = malloc(sizeof(int32_t) * N * T), *next = malloc(sizeof(int32_t) * N * T);
    td_batch b = {N, NULL, tok, next};
    td_step_result first = {0}, last = {0};
    const char *text = "the quick brown fox jumps over the lazy dog. ";
    size_t len = strlen(text);
    double norm;
    TD_ASSERT_OK(td_model_load_string(json, "small", td_device_list_get(list, 0), TD_F32, 5, &m));
    cfg.kind = TD_OPT_ADAMW;
    cfg.lr = 3e-3;
    cfg.weight_decay = 0.01;
    cfg.schedule = TD_LR_COSINE;
    cfg.warmup_steps = 5;
    cfg.total_steps = 40;
    cfg.clip_norm = 1.0;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    for (int step = 0; step < 40; step++) {
        for (int i = 0; i < N; i++)
            for (int t = 0; t < T; t++) {
                size_t at = (size_t)(step * 7 + i * 13 + t);
                tok[i * T + t] = (unsigned char)text[at % len];
                next[i * T + t] = (unsigned char)text[(at + 1) % len];
            }
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / (N * T), 0, (uint64_t)step, &last));
        TD_ASSERT_OK(td_optimizer_step(opt, &norm));
        assert_true(isfinite(norm));
        if (step == 0)
            first = last;
    }
    /* from about log(256) = 5.5 nats to well under half */
    if (!(last.loss_sum < 0.4 * first.loss_sum))
        fail_msg("loss fell from %g to %g only", first.loss_sum / (N * T), last.loss_sum / (N * T));
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
    free(tok);
    free(next);
}

static void gpt_loss_falls(void **state) {
    token_model_loss_falls(small_gpt);
}

static void llama_loss_falls(void **state) {
    token_model_loss_falls(small_llama);
}

/* Updating each layer from the backward's gradient hook, as soon as its
 * gradients are final (td_optimizer_step_params), must give bitwise the
 * weights of the update after the backward: the same kernels on the same
 * numbers, only earlier. A tied head reads the embedding's table in its
 * backward, before the embedding's gradients are final: the table must
 * not be updated before the embedding's backward. */
typedef struct early {
    td_optimizer *opt;
    size_t named; /* parameters named, with repeats */
    td_status st;
} early;

static void update_early(void *arg, size_t first, size_t count) {
    early *e = arg;
    td_status st = td_optimizer_step_params(e->opt, first, count);
    e->named += count;
    if (e->st == TD_OK)
        e->st = st;
}

/* Every parameter of m, one after another, as f64. */
static void read_weights(td_model *m, double *out) {
    for (size_t i = 0; i < td_model_param_count(m); i++) {
        td_tensor *w = td_model_param(m, i);
        TD_ASSERT_OK(td_tensor_read_f64(w, out, td_tensor_numel(w)));
        out += td_tensor_numel(w);
    }
}

static void train_gpt(const char *spec, td_device *dev, int in_backward, double *weights,
                      size_t nweights) {
    enum { N = 2, T = 32, STEPS = 4 };
    td_model *m = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    early e = {NULL, 0, TD_OK};
    int32_t tok[N * T], next[N * T];
    td_batch b = {N, NULL, tok, next};
    TD_ASSERT_OK(td_model_load_string(spec, "gpt", dev, TD_F64, 9, &m));
    cfg.kind = TD_OPT_ADAMW;
    cfg.lr = 1e-2;
    cfg.weight_decay = 0.1;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &e.opt));
    if (in_backward)
        td_model_set_grad_hook(m, update_early, &e);
    for (int step = 0; step < STEPS; step++) {
        td_step_result r;
        for (int i = 0; i < N * T; i++) {
            tok[i] = (int32_t)(td_rng_uniform((uint64_t)step, (uint64_t)i) * 256);
            next[i] = (tok[i] * 7 + 3) % 256;
        }
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / (N * T), 0, (uint64_t)step, &r));
        TD_ASSERT_OK(e.st);
        TD_ASSERT_OK(td_optimizer_step(e.opt, NULL));
    }
    if (in_backward)
        assert_true(e.named >= STEPS * td_model_param_count(m));
    assert_int_equal(td_optimizer_steps(e.opt), STEPS);
    assert_int_equal(td_model_num_weights(m), nweights);
    read_weights(m, weights);
    td_optimizer_destroy(e.opt);
    td_model_destroy(m);
}

static void check_update_in_backward(const char *spec) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_model *m = NULL;
    size_t n;
    double *after, *early_after, *before;
    TD_ASSERT_OK(td_model_load_string(spec, "gpt", dev, TD_F64, 9, &m));
    n = td_model_num_weights(m);
    td_model_destroy(m);
    after = malloc(sizeof(double) * n);
    early_after = malloc(sizeof(double) * n);
    before = malloc(sizeof(double) * n);
    train_gpt(spec, dev, 0, after, n);
    train_gpt(spec, dev, 1, early_after, n);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&after[i], &early_after[i], sizeof(double)))
            fail_msg("weight %zu: %.17g updated in the backward, %.17g after it", i, early_after[i],
                     after[i]);
    /* and training moved them: an update that did nothing would pass above */
    {
        size_t moved = 0;
        TD_ASSERT_OK(td_model_load_string(spec, "gpt", dev, TD_F64, 9, &m));
        read_weights(m, before);
        td_model_destroy(m);
        for (size_t i = 0; i < n; i++)
            moved += before[i] != after[i];
        assert_true(moved > n * 9 / 10);
    }
    free(after);
    free(early_after);
    free(before);
    td_device_list_destroy(list);
}

static void update_in_backward_matches_after(void **state) {
    check_update_in_backward(small_gpt);
    check_update_in_backward(small_llama);
}

static void update_in_backward_waits_for_tied_table(void **state) {
    static const char *const tied_gpt =
        "{\"input\": {\"tokens\": 32, \"vocab\": 256}, \"layers\": ["
        "{\"type\": \"embedding\", \"vocab\": 256, \"dim\": 64},"
        "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
        "{\"type\": \"attention\", \"heads\": 4}]},"
        "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 256, \"tied\": true}]}";
    check_update_in_backward(tied_gpt);
}

/* Clipping scales by the whole gradient's norm, unknown layer by layer. */
static void update_in_backward_refused_with_clipping(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    TD_ASSERT_OK(
        td_model_load_string(small_gpt, "gpt", td_device_list_get(list, 0), TD_F32, 1, &m));
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    assert_int_equal(td_optimizer_step_params(opt, 0, 100), TD_ERR_INVALID_ARG);
    assert_non_null(strstr(td_last_error(), "parameters [0, 100)"));
    TD_ASSERT_OK(td_optimizer_step_params(opt, 0, td_model_param_count(m)));
    td_optimizer_destroy(opt);
    cfg.clip_norm = 1.0;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    assert_int_equal(td_optimizer_step_params(opt, 0, 1), TD_ERR_INVALID_ARG);
    assert_non_null(strstr(td_last_error(), "clipping"));
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_sgd_loss_falls),
        cmocka_unit_test(mlp_adamw_loss_falls_two_cores),
        cmocka_unit_test(mlp_f64_loss_falls),
        cmocka_unit_test(lenet_loss_falls),
        cmocka_unit_test(gpt_loss_falls),
        cmocka_unit_test(llama_loss_falls),
        cmocka_unit_test(update_in_backward_matches_after),
        cmocka_unit_test(update_in_backward_waits_for_tied_table),
        cmocka_unit_test(update_in_backward_refused_with_clipping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
