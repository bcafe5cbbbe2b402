/* Generation split across devices (td_strategy_decoder_create) against the
 * whole model's ordinary forward on one device: the logits of every
 * position, prefilled and stepped, under tensor (2 and 3 devices, a device
 * three times slower, a member that holds no head) and pipeline (2 and 3
 * stages, a slowed device, more devices than the cut uses), for a GPT and
 * a Llama; greedy
 * generation gives the single strategy's tokens; and what is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/full_logits.h"
#include "support/support.h"
#include "tandem/strategy.h"

enum { T = 16, V = 64 };

/* Whether small_gpt's head is tied to its embedding, as GPT-2's is. */
static int tied_head;

/* Whether small_gpt is a Llama instead: RMSNorms, rotary attention split by
 * heads, grouped-query attention (heads / 2 key/value heads) split by
 * query heads and SwiGLU MLPs split by hidden features. */
static int llama;

/* gpt_tiny's layers, smaller, with `heads` heads of 32 channels in all. */
static const char *small_gpt(int heads) {
    static char json[1024];
    if (llama) {
        snprintf(json, sizeof json,
                 "{\"input\": {\"tokens\": %d, \"vocab\": %d}, \"layers\": ["
                 "{\"type\": \"embedding\", \"vocab\": %d, \"dim\": 32, \"positions\": false},"
                 "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
                 "{\"type\": \"attention\", \"heads\": %d, \"rope_theta\": 10000}]},"
                 "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
                 "{\"type\": \"swiglu\", \"hidden\": 40}]},"
                 "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
                 "{\"type\": \"attention\", \"heads\": %d, \"kv_heads\": %d, "
                 "\"rope_theta\": 10000, \"qkv_bias\": false, \"proj_bias\": false}]},"
                 "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
                 "{\"type\": \"swiglu\", \"hidden\": 3, \"bias\": true}]},"
                 "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": %d, \"bias\": false}]}",
                 T, V, V, heads, heads, heads / 2, V);
        return json;
    }
    snprintf(json, sizeof json,
             "{\"input\": {\"tokens\": %d, \"vocab\": %d}, \"layers\": ["
             "{\"type\": \"embedding\", \"vocab\": %d, \"dim\": 32, \"positions\": true},"
             "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
             "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
             "{\"type\": \"attention\", \"heads\": %d}]},"
             "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
             "{\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"}, "
             "{\"type\": \"linear\", \"out\": 32}]}]},"
             "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": %d%s}]}",
             T, V, V, heads, V, tied_head ? ", \"bias\": false, \"tied\": true" : "");
    return json;
}

static void expect_row(const double *got, const double *want, double tol, const char *how,
                       int64_t pos) {
    double scale = 1, worst = 0;
    for (int i = 0; i < V; i++)
        scale = fmax(scale, fabs(want[i]));
    for (int i = 0; i < V; i++)
        worst = fmax(worst, fabs(got[i] - want[i]));
    if (!(worst <= tol * scale))
        fail_msg("%s: position %lld: logits differ by %g (tolerance %g)", how, (long long)pos,
                 worst, tol * scale);
}

/* A checkpoint of small_gpt(heads) in dtype, initialised from seed 5, and
 * the whole model's logits of tok[0..T) into ref. */
static const char *make_checkpoint(int heads, td_dtype dtype, const int32_t *tok, double *ref) {
    td_device_list *list = td_test_open("cpu:0");
    td_model *m = NULL;
    const char *path = td_test_tmp(dtype == TD_F64 ? "gpt64.safetensors" : "gpt32.safetensors");
    TD_ASSERT_OK(td_model_load_string(small_gpt(heads), "small_gpt", td_device_list_get(list, 0),
                                      dtype, 5, &m));
    td_test_full_logits(m, tok, T, ref);
    TD_ASSERT_OK(td_checkpoint_save(path, m, NULL, NULL));
    td_model_destroy(m);
    td_device_list_destroy(list);
    return path;
}

static void tokens(int32_t *tok) {
    for (int i = 0; i < T; i++)
        tok[i] = (int32_t)((i * 37 + 11) % V);
}

static void split_matches_whole(const char *strategy, const char *spec, int heads, td_dtype dtype,
                                double tol) {
    int32_t tok[T];
    double ref[T * V], got[V];
    td_device_list *list;
    td_group *g = NULL;
    td_decoder *d = NULL;
    const char *path;
    tokens(tok);
    path = make_checkpoint(heads, dtype, tok, ref);
    list = td_test_open(spec);
    TD_ASSERT_OK(td_group_create(list, NULL, &g));
    TD_ASSERT_OK(td_strategy_decoder_create(g, strategy, path, dtype, &d));
    assert_int_equal(td_decoder_context(d), T);
    assert_int_equal(td_decoder_vocab(d), V);
    for (int64_t k = 1; k <= T; k += 5) {
        TD_ASSERT_OK(td_decoder_prefill(d, tok, k, got));
        expect_row(got, ref + (k - 1) * V, tol, spec, k - 1);
        for (int64_t pos = k; pos < T; pos++) {
            TD_ASSERT_OK(td_decoder_step(d, tok[pos], got));
            expect_row(got, ref + pos * V, tol, spec, pos);
        }
    }
    td_decoder_destroy(d);
    td_group_destroy(g);
    td_device_list_destroy(list);
}

static void two_devices_f64(void **state) {
    split_matches_whole("tensor", "cpu*2", 4, TD_F64, 1e-12);
}
static void two_devices_f32(void **state) {
    split_matches_whole("tensor", "cpu*2", 4, TD_F32, 1e-5);
}
static void three_to_one_speeds_f64(void **state) {
    split_matches_whole("tensor", "cpu:0,cpu:1{slowdown=3}", 4, TD_F64, 1e-12);
}
/* 2 heads over 3 devices: one member computes no head of any layer. */
static void a_member_without_heads_f64(void **state) {
    split_matches_whole("tensor", "cpu*3", 2, TD_F64, 1e-12);
}

/* A head tied to the embedding: tensor slices the table's rows; pipeline
 * gives the stage holding the head its own copy of the table. */
static void tied_head_f64(void **state) {
    tied_head = 1;
    split_matches_whole("tensor", "cpu*2", 4, TD_F64, 1e-12);
    split_matches_whole("pipeline", "cpu*2", 4, TD_F64, 1e-12);
    split_matches_whole("pipeline", "cpu*3", 4, TD_F64, 1e-12);
    tied_head = 0;
}

/* A Llama: the members' rotary heads, grouped-query heads (on cpu*3 with 8
 * heads in groups of 2, the second member's first query head is its
 * group's second) and SwiGLU features (3 hidden features over 3 devices in
 * the second MLP; on cpu*3 with 2 heads one member holds none). */
static void llama_f64(void **state) {
    llama = 1;
    split_matches_whole("tensor", "cpu*2", 4, TD_F64, 1e-12);
    split_matches_whole("tensor", "cpu*3", 2, TD_F64, 1e-12);
    split_matches_whole("tensor", "cpu*3", 8, TD_F64, 1e-12);
    split_matches_whole("tensor", "cpu*3", 8, TD_F32, 1e-5);
    split_matches_whole("tensor", "cpu*2", 4, TD_F32, 1e-5);
    split_matches_whole("pipeline", "cpu*3", 4, TD_F64, 1e-12);
    llama = 0;
}

static void pipeline_two_stages_f64(void **state) {
    split_matches_whole("pipeline", "cpu*2", 4, TD_F64, 1e-12);
}
static void pipeline_two_stages_f32(void **state) {
    split_matches_whole("pipeline", "cpu*2", 4, TD_F32, 1e-5);
}
static void pipeline_three_stages_f64(void **state) {
    split_matches_whole("pipeline", "cpu*3", 4, TD_F64, 1e-12);
}
static void pipeline_one_stage_slowed_f64(void **state) {
    split_matches_whole("pipeline", "cpu:0,cpu:1{slowdown=3}", 4, TD_F64, 1e-12);
}
/* 9 devices for 7 top-level layers: some stages are empty. */
static void pipeline_more_devices_than_layers_f64(void **state) {
    split_matches_whole("pipeline", "cpu*9", 4, TD_F64, 1e-12);
}

typedef struct collected {
    int32_t tok[64];
    int n;
} collected;

static int collect(void *arg, int32_t token) {
    collected *c = arg;
    c->tok[c->n++] = token;
    return 0;
}

/* pipeline:P,tensor:N: stages of N devices, each splitting its layers'
 * heads and features; the last stage's members each give a slice of the
 * logits; a tied head, and a Llama's grouped-query heads, split too. */
static void pipeline_of_tensor_stages_f64(void **state) {
    split_matches_whole("pipeline:2,tensor:2", "cpu*4", 4, TD_F64, 1e-12);
    split_matches_whole("pipeline:3,tensor:2", "cpu*6", 4, TD_F64, 1e-12);
    split_matches_whole("pipeline:2,tensor:2", "cpu*4", 4, TD_F32, 1e-5);
    tied_head = 1;
    split_matches_whole("pipeline:2,tensor:2", "cpu*4", 4, TD_F64, 1e-12);
    tied_head = 0;
    llama = 1;
    split_matches_whole("pipeline:2,tensor:3", "cpu*6", 8, TD_F64, 1e-12);
    llama = 0;
}

/* Greedy text from `strategy` over spec: n tokens after the prompt, sliding
 * the window past the context. */
static collected greedy(const char *spec, const char *strategy, const char *path) {
    td_device_list *list = td_test_open(spec);
    td_group *g = NULL;
    td_decoder *d = NULL;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    int32_t prompt[3] = {1, 2, 3};
    collected c = {{0}, 0};
    cfg.tokens = 40;
    cfg.temperature = 0;
    TD_ASSERT_OK(td_group_create(list, NULL, &g));
    TD_ASSERT_OK(td_strategy_decoder_create(g, strategy, path, TD_F64, &d));
    TD_ASSERT_OK(td_generate(d, prompt, 3, &cfg, collect, &c, NULL));
    td_decoder_destroy(d);
    td_group_destroy(g);
    td_device_list_destroy(list);
    return c;
}

static void greedy_text_is_the_single_devices(void **state) {
    int32_t tok[T];
    double ref[T * V];
    const char *path;
    collected one, two, three;
    tokens(tok);
    path = make_checkpoint(4, TD_F64, tok, ref);
    one = greedy("cpu:0", "single", path);
    two = greedy("cpu*2", "tensor", path);
    three = greedy("cpu*2", "pipeline", path);
    assert_int_equal(one.n, 40);
    assert_int_equal(two.n, 40);
    assert_int_equal(three.n, 40);
    assert_memory_equal(one.tok, two.tok, sizeof one.tok);
    assert_memory_equal(one.tok, three.tok, sizeof one.tok);
}

static void what_cannot_generate_is_refused(void **state) {
    int32_t tok[T];
    double ref[T * V];
    td_device_list *list = td_test_open("cpu*2");
    td_group *g = NULL;
    td_decoder *d = NULL;
    td_model *mlp = NULL;
    const char *path, *mlp_path = td_test_tmp("mlp.safetensors");
    tokens(tok);
    path = make_checkpoint(4, TD_F32, tok, ref);
    TD_ASSERT_OK(td_group_create(list, NULL, &g));
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "data", path, TD_F32, &d), TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("data: does not generate (these do: single, pipeline, tensor)");
    assert_null(d);
    /* data replicas serve batches, not one sequence */
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "data:2,tensor:1", path, TD_F32, &d),
                     TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("not one sequence");
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "pipeline:2,tensor:2", path, TD_F32, &d),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("names 4 devices; the group has 2");
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "sideways", path, TD_F32, &d),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("unknown strategy 'sideways'");
    TD_ASSERT_STATUS(
        td_strategy_decoder_create(g, "tensor", td_test_tmp("none.safetensors"), TD_F32, &d),
        TD_ERR_IO);
    td_test_assert_message_contains("none.safetensors");
    /* an image model reads no tokens */
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/mnist_mlp.json",
                               td_device_list_get(list, 0), TD_F32, 1, &mlp));
    TD_ASSERT_OK(td_checkpoint_save(mlp_path, mlp, NULL, NULL));
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "tensor", mlp_path, TD_F32, &d),
                     TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("features");
    assert_null(d);
    TD_ASSERT_STATUS(td_strategy_decoder_create(g, "pipeline", mlp_path, TD_F32, &d),
                     TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("features");
    assert_null(d);
    td_model_destroy(mlp);
    td_group_destroy(g);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_devices_f64),
        cmocka_unit_test(two_devices_f32),
        cmocka_unit_test(three_to_one_speeds_f64),
        cmocka_unit_test(a_member_without_heads_f64),
        cmocka_unit_test(tied_head_f64),
        cmocka_unit_test(llama_f64),
        cmocka_unit_test(pipeline_two_stages_f64),
        cmocka_unit_test(pipeline_two_stages_f32),
        cmocka_unit_test(pipeline_three_stages_f64),
        cmocka_unit_test(pipeline_one_stage_slowed_f64),
        cmocka_unit_test(pipeline_more_devices_than_layers_f64),
        cmocka_unit_test(pipeline_of_tensor_stages_f64),
        cmocka_unit_test(greedy_text_is_the_single_devices),
        cmocka_unit_test(what_cannot_generate_is_refused),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
