/* The KV-cache decoder against the ordinary full forward: the logits of
 * every position, by prefilling the whole sequence and by prefilling part
 * of it and stepping the rest, in f64 and f32, with the fused and the
 * composed attention, for a GPT and a Llama; and the models it refuses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn-impl.h"
#include "support/full_logits.h"
#include "support/support.h"

/* gpt_tiny's layers, smaller; a dropout (the identity at inference) inside. */
static const char *const small_gpt =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4}, {\"type\": \"dropout\", \"p\": 0.2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": 32}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

/* A small Llama: RMSNorm, grouped-query attention (2 query heads per key
 * and value head) with rotary positions and no biases, a SwiGLU MLP; then
 * Qwen2's q, k, v biases on multi-query attention with Llama 3's scaling. */
static const char *const small_llama =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32, \"positions\": false},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000, "
    "\"qkv_bias\": false, \"proj_bias\": false}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"swiglu\", \"hidden\": 48}]}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 1, \"rope_theta\": 500, "
    "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 4, \"original_max_position_embeddings\": "
    "64}, \"proj_bias\": false}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false}]}";

enum { T = 16, V = 64 };

/* Fails unless got (V) equals want (V) within tol relative to the row's size. */
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

static void decoder_matches_forward(const char *json, const char *spec, td_dtype dtype, int generic,
                                    double tol) {
    td_device_list *list = td_test_open(spec);
    td_model *m = NULL;
    td_decoder *d = NULL;
    int32_t tok[T];
    double ref[T * V], got[V];
    td__nn_generic_attention = generic;
    TD_ASSERT_OK(td_model_load_string(json, "small", td_device_list_get(list, 0), dtype, 7, &m));
    for (int i = 0; i < T; i++)
        tok[i] = (int32_t)((i * 37 + 11) % V);
    td_test_full_logits(m, tok, T, ref);
    TD_ASSERT_OK(td_decoder_create(m, &d));
    assert_int_equal(td_decoder_context(d), T);
    assert_int_equal(td_decoder_vocab(d), V);
    for (int64_t n = 1; n <= T; n++) {
        TD_ASSERT_OK(td_decoder_prefill(d, tok, n, got));
        expect_row(got, ref + (n - 1) * V, tol, "prefill", n - 1);
    }
    for (int64_t k = 1; k <= T; k += 5) {
        TD_ASSERT_OK(td_decoder_prefill(d, tok, k, NULL));
        for (int64_t pos = k; pos < T; pos++) {
            TD_ASSERT_OK(td_decoder_step(d, tok[pos], got));
            expect_row(got, ref + pos * V, tol, "step", pos);
        }
        assert_int_equal(td_decoder_position(d), T);
        TD_ASSERT_STATUS(td_decoder_step(d, 0, got), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("full");
    }
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
    td__nn_generic_attention = 0;
}

static void f64_fused(void **state) {
    decoder_matches_forward(small_gpt, "cpu", TD_F64, 0, 1e-12);
}
static void f64_composed(void **state) {
    decoder_matches_forward(small_gpt, "cpu", TD_F64, 1, 1e-12);
}
static void f32_fused(void **state) {
    decoder_matches_forward(small_gpt, "cpu", TD_F32, 0, 1e-4);
}
static void f32_composed(void **state) {
    decoder_matches_forward(small_gpt, "cpu", TD_F32, 1, 1e-4);
}

/* The cache of grouped-query heads holds each key and value head once. */
static void llama_matches_forward(void **state) {
    decoder_matches_forward(small_llama, "cpu", TD_F64, 0, 1e-12);
    decoder_matches_forward(small_llama, "cpu", TD_F64, 1, 1e-12);
    decoder_matches_forward(small_llama, "cpu", TD_F32, 0, 1e-4);
    decoder_matches_forward(small_llama, "cpu", TD_F32, 1, 1e-4);
}

/* The same on OpenCL (PoCL in CI), whose kernels the decoder reaches
 * through the same table. */
static void opencl_matches_forward(void **state) {
    td_device_list *list = NULL;
    if (td_devices_open("opencl:0.0", &list) != TD_OK) {
        printf("skipped: no OpenCL device (%s)\n", td_last_error());
        skip();
    }
    td_device_list_destroy(list);
    decoder_matches_forward(small_gpt, "opencl:0.0", TD_F32, 0, 1e-4);
    if (td_device_supports_f64(td_device_list_get(list = td_test_open("opencl:0.0"), 0)))
        decoder_matches_forward(small_gpt, "opencl:0.0", TD_F64, 0, 1e-12);
    td_device_list_destroy(list);
}

/* A training step between decoder calls re-carves the workspace; the cache
 * keeps what it held. */
static void training_between_steps_is_harmless(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    td_decoder *d = NULL;
    int32_t tok[T], lab[4 * T] = {0}, many[4 * T] = {0};
    double ref[T * V], got[V];
    td_batch b = {4, NULL, many, lab};
    TD_ASSERT_OK(
        td_model_load_string(small_gpt, "small_gpt", td_device_list_get(list, 0), TD_F64, 3, &m));
    for (int i = 0; i < T; i++)
        tok[i] = (int32_t)((i * 5 + 2) % V);
    td_test_full_logits(m, tok, T, ref);
    TD_ASSERT_OK(td_decoder_create(m, &d));
    TD_ASSERT_OK(td_decoder_prefill(d, tok, 6, NULL));
    TD_ASSERT_OK(td_model_evaluate(m, &b, NULL));
    TD_ASSERT_OK(td_decoder_step(d, tok[6], got));
    expect_row(got, ref + 6 * V, 1e-12, "step after evaluate", 6);
    td_decoder_destroy(d);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

/* A decoder carves its passes' views for inference only, its layers
 * sharing memory; a training step on one sample afterwards (the same size)
 * carves them anew: its gradients equal a fresh model's. */
static void training_after_decoding_is_exact(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL, *fresh = NULL;
    td_decoder *d = NULL;
    int32_t tok[T], lab[T];
    td_batch b = {1, NULL, tok, lab};
    td_step_result r1, r2;
    for (int i = 0; i < T; i++) {
        tok[i] = (int32_t)((i * 5 + 2) % V);
        lab[i] = (int32_t)((i * 3 + 1) % V);
    }
    TD_ASSERT_OK(
        td_model_load_string(small_gpt, "small_gpt", td_device_list_get(list, 0), TD_F64, 3, &m));
    TD_ASSERT_OK(td_model_load_string(small_gpt, "small_gpt", td_device_list_get(list, 0), TD_F64,
                                      3, &fresh));
    TD_ASSERT_OK(td_decoder_create(m, &d));
    TD_ASSERT_OK(td_decoder_prefill(d, tok, T, NULL));
    td_decoder_destroy(d);
    TD_ASSERT_OK(td_model_train_step(m, &b, 1.0, 0, 0, &r1));
    TD_ASSERT_OK(td_model_train_step(fresh, &b, 1.0, 0, 0, &r2));
    assert_true(r1.loss_sum == r2.loss_sum);
    for (size_t i = 0; i < td_model_param_count(m); i++) {
        td_tensor *g1 = td_model_grad(m, i), *g2 = td_model_grad(fresh, i);
        size_t n = td_tensor_nbytes(g1);
        unsigned char *a = malloc(n + 1), *c = malloc(n + 1);
        TD_ASSERT_OK(td_tensor_read(g1, a, n));
        TD_ASSERT_OK(td_tensor_read(g2, c, n));
        if (memcmp(a, c, n) != 0)
            fail_msg("%s: the gradient differs after decoding", td_model_param_name(m, i));
        free(a);
        free(c);
    }
    td_model_destroy(m);
    td_model_destroy(fresh);
    td_device_list_destroy(list);
}

static void bad_input_is_refused(void **state) {
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL, *mlp = NULL;
    td_decoder *d = NULL;
    int32_t tok[T + 1] = {0};
    double got[V];
    TD_ASSERT_OK(td_model_load(TD_SOURCE_DIR "/examples/mnist_mlp.json",
                               td_device_list_get(list, 0), TD_F32, 1, &mlp));
    TD_ASSERT_STATUS(td_decoder_create(mlp, &d), TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("features");
    assert_null(d);
    TD_ASSERT_OK(
        td_model_load_string(small_gpt, "small_gpt", td_device_list_get(list, 0), TD_F32, 1, &m));
    TD_ASSERT_OK(td_decoder_create(m, &d));
    TD_ASSERT_STATUS(td_decoder_step(d, 1, got), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("nothing prefilled");
    TD_ASSERT_STATUS(td_decoder_prefill(d, tok, 0, got), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_decoder_prefill(d, tok, T + 1, got), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("1 to 16");
    tok[3] = V;
    TD_ASSERT_STATUS(td_decoder_prefill(d, tok, 5, got), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("token 64 at 3");
    assert_int_equal(td_decoder_position(d), 0);
    TD_ASSERT_OK(td_decoder_prefill(d, tok, 2, got));
    TD_ASSERT_STATUS(td_decoder_step(d, -1, got), TD_ERR_INVALID_ARG);
    assert_int_equal(td_decoder_position(d), 2);
    td_decoder_destroy(d);
    td_decoder_destroy(NULL);
    td_model_destroy(m);
    td_model_destroy(mlp);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f64_fused),
        cmocka_unit_test(f64_composed),
        cmocka_unit_test(f32_fused),
        cmocka_unit_test(f32_composed),
        cmocka_unit_test(llama_matches_forward),
        cmocka_unit_test(opencl_matches_forward),
        cmocka_unit_test(training_between_steps_is_harmless),
        cmocka_unit_test(training_after_decoding_is_exact),
        cmocka_unit_test(bad_input_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
