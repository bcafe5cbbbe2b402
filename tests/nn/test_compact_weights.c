/* Compact weights in the nn layer: a decoder reading q8_0 or bf16 matrices
 * against an f64 decoder of the same rounded values (the only difference
 * left is the rounding of activations the kernels do, as llama.cpp's), for
 * a GPT and a Llama; compact checkpoints round-trip; f16 and bf16
 * key/value caches take half the bytes a layer and keep the logits; a q8_0
 * tensor whose rows are not whole blocks, and an unknown dtype, are
 * refused naming the file and the tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"
#include "tandem/tandem.h"
#include "tensor/ops.h"

enum { T = 16, V = 64 };

static const char *gpt_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": %d, \"positions\": true},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 128}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": %d}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

static const char *llama_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": %d, \"positions\": false},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000, "
    "\"qkv_bias\": false, \"proj_bias\": false}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"swiglu\", \"hidden\": 96}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false}]}";

static td_device_list *devs;

static int setup(void **state) {
    devs = td_test_open("cpu:0");
    return td_test_tmpdir_setup(state);
}

static int teardown(void **state) {
    td_device_list_destroy(devs);
    return td_test_tmpdir_teardown(state);
}

static td_model *make_model(const char *fmt, int dim, td_dtype dt) {
    char json[2048];
    td_model *m = NULL;
    snprintf(json, sizeof json, fmt, dim, dim);
    TD_ASSERT_OK(td_model_load_string(json, "test", td_device_list_get(devs, 0), dt, 7, &m));
    return m;
}

/* Prefill 5 tokens, then steps: the compact decoder's logits against the
 * f64 decoder of the same rounded weights. */
static void decoder_matches_f64(const char *json, td_weights w, double tol) {
    td_model *m = make_model(json, 64, TD_F32), *ref = NULL;
    td_decoder *d = NULL, *dr = NULL;
    const char *path = td_test_tmp("rounded.safetensors");
    int32_t tokens[T] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
    double a[V], b[V], worst = 0, scale = 0;
    TD_ASSERT_OK(td_model_set_weights(m, w));
    assert_int_equal(td_model_weights(m), w);
    /* the rounded values, exactly, in an f64 model */
    TD_ASSERT_OK(td_checkpoint_save_weights(path, m, TD_WEIGHTS_F32, NULL));
    TD_ASSERT_OK(td_generate_load_model(path, td_device_list_get(devs, 0), TD_F64, &ref));
    TD_ASSERT_OK(td_decoder_create(m, &d));
    TD_ASSERT_OK(td_decoder_create(ref, &dr));
    for (int i = 5; i <= T; i++) {
        if (i == 5) {
            TD_ASSERT_OK(td_decoder_prefill(d, tokens, 5, a));
            TD_ASSERT_OK(td_decoder_prefill(dr, tokens, 5, b));
        } else {
            TD_ASSERT_OK(td_decoder_step(d, tokens[i - 1], a));
            TD_ASSERT_OK(td_decoder_step(dr, tokens[i - 1], b));
        }
        for (int v = 0; v < V; v++) {
            worst = fmax(worst, fabs(a[v] - b[v]));
            scale = fmax(scale, fabs(b[v]));
        }
    }
    print_message("%s: max |logit - f64's| %.2e of logits up to %.2f\n", td_weights_name(w), worst,
                  scale);
    assert_true(scale > 0.1 && worst <= tol * scale);
    td_decoder_destroy(d);
    td_decoder_destroy(dr);
    td_model_destroy(m);
    td_model_destroy(ref);
}

static void gpt_q8_0_decodes_like_f64(void **state) {
    decoder_matches_f64(gpt_json, TD_WEIGHTS_Q8_0, 2e-2);
}
static void gpt_bf16_decodes_like_f64(void **state) {
    decoder_matches_f64(gpt_json, TD_WEIGHTS_BF16, 1e-2);
}
static void llama_q8_0_decodes_like_f64(void **state) {
    decoder_matches_f64(llama_json, TD_WEIGHTS_Q8_0, 2e-2);
}
static void llama_bf16_decodes_like_f64(void **state) {
    decoder_matches_f64(llama_json, TD_WEIGHTS_BF16, 1e-2);
}

/* A compact checkpoint loads as the rounded values, with its format. */
static void compact_checkpoints_round_trip(void **state) {
    const td_weights formats[] = {TD_WEIGHTS_BF16, TD_WEIGHTS_Q8_0};
    for (int f = 0; f < 2; f++) {
        td_model *m = make_model(gpt_json, 64, TD_F32), *back = NULL;
        const char *path = td_test_tmp("compact.safetensors");
        td_weights got;
        TD_ASSERT_OK(td_checkpoint_save_weights(path, m, formats[f], NULL));
        TD_ASSERT_OK(td_model_set_weights(m, formats[f]));
        TD_ASSERT_OK(td_checkpoint_read_weights(path, &got));
        assert_int_equal(got, formats[f]);
        TD_ASSERT_OK(td_checkpoint_load_model(path, td_device_list_get(devs, 0), &back, NULL));
        assert_int_equal(td_model_weights(back), formats[f]);
        for (size_t i = 0; i < td_model_param_count(m); i++) {
            td_compare_result r;
            TD_ASSERT_OK(td_tensor_compare(td_model_param(m, i), td_model_param(back, i), &r));
            if (r.max_abs != 0)
                fail_msg("%s: %s differs by %g", td_weights_name(formats[f]),
                         td_model_param_name(m, i), r.max_abs);
        }
        td_model_destroy(m);
        td_model_destroy(back);
    }
}

/* gpt_json with 4 blocks: 4 caches of (16, 3 * 64). */
static const char *deep_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": %d, \"positions\": true},"
    "{\"type\": \"repeat\", \"count\": 4, \"layers\": ["
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 128}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": %d}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

/* The logits of a prefill of 6 tokens and the steps after it, all in out. */
static void decode_all(td_model *m, double out[T - 5][V]) {
    int32_t tokens[T] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
    td_decoder *d = NULL;
    TD_ASSERT_OK(td_decoder_create(m, &d));
    TD_ASSERT_OK(td_decoder_prefill(d, tokens, 6, out[0]));
    for (int i = 6; i < T; i++)
        TD_ASSERT_OK(td_decoder_step(d, tokens[i], out[i - 5]));
    td_decoder_destroy(d);
}

/* gpt_json with its head tied to the embedding's table. */
static const char *tied_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": %d, \"positions\": true},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 128}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": %d}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false, "
    "\"tied\": true}]}";

/* A decoder that owns its model frees the f32 copies of what it reads
 * packed (the tied table among them, its embedding rows then come from the
 * head's packed copy) and every gradient, and decodes exactly as before. */
static void owned_models_keep_only_packed_matrices(void **state) {
    const td_weights formats[] = {TD_WEIGHTS_BF16, TD_WEIGHTS_Q8_0};
    static double want[T - 5][V], got[T - 5][V];
    int32_t tokens[T] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
    (void)state;
    for (int f = 0; f < 2; f++) {
        td_model *m = make_model(tied_json, 64, TD_F32), *own = make_model(tied_json, 64, TD_F32);
        td_decoder *d = NULL;
        size_t freed = 0, kept = 0;
        TD_ASSERT_OK(td_model_set_weights(m, formats[f]));
        TD_ASSERT_OK(td_model_set_weights(own, formats[f]));
        decode_all(m, want);
        TD_ASSERT_OK(td_decoder_create(own, &d));
        td_decoder_take_model(d);
        for (size_t i = 0; i < td_model_param_count(own); i++) {
            const char *name = td_model_param_name(own, i);
            int matrix = strstr(name, "wte") || strstr(name, "qkv.weight") ||
                         strstr(name, "proj.weight") || !strcmp(name, "layers.2.1.weight") ||
                         !strcmp(name, "layers.2.3.weight");
            assert_null(td_model_grad(own, i)->data);
            if (matrix)
                assert_null(td_model_param(own, i)->data);
            freed += matrix;
            kept += td_model_param(own, i)->data != NULL;
        }
        assert_int_equal(freed, 5);
        assert_true(kept > 0); /* biases, norms and wpe stay */
        TD_ASSERT_OK(td_decoder_prefill(d, tokens, 6, got[0]));
        for (int i = 6; i < T; i++)
            TD_ASSERT_OK(td_decoder_step(d, tokens[i], got[i - 5]));
        assert_memory_equal(got, want, sizeof got);
        td_decoder_destroy(d);
        td_model_destroy(m);
    }
}

/* A half-precision cache: each layer's keys and values in 2 bytes and
 * nothing else (the CPU's attention reads them as stored), half the f32
 * cache's bytes; the logits those of the f32 cache up to the rounding of
 * keys and values. */
static void half_kv_caches_hold_half_the_bytes(void **state) {
    const td_kv_cache kinds[] = {TD_KV_CACHE_F16, TD_KV_CACHE_BF16};
    const double tol[] = {5e-4, 5e-3};
    td_model *m = make_model(deep_json, 64, TD_F32), *m64 = make_model(deep_json, 64, TD_F64);
    static double want[T - 5][V], got[T - 5][V];
    size_t layer = (size_t)T * 3 * 64;
    td_decoder *d = NULL;
    decode_all(m, want);
    TD_ASSERT_OK(td_decoder_create(m, &d));
    assert_int_equal(td_decoder_kv_bytes(d), 4 * layer * 4);
    td_decoder_destroy(d);
    for (int k = 0; k < 2; k++) {
        double worst = 0, scale = 0;
        td_decoder_set_default_kv_cache(kinds[k]);
        TD_ASSERT_OK(td_decoder_create(m, &d));
        assert_int_equal(td_decoder_kv_bytes(d), 4 * layer * 2);
        td_decoder_destroy(d);
        decode_all(m, got);
        for (int i = 0; i < T - 5; i++)
            for (int v = 0; v < V; v++) {
                worst = fmax(worst, fabs(got[i][v] - want[i][v]));
                scale = fmax(scale, fabs(want[i][v]));
            }
        print_message("%s cache: max |logit - f32 cache's| %.2e of logits up to %.2f\n",
                      kinds[k] == TD_KV_CACHE_F16 ? "f16" : "bf16", worst, scale);
        assert_true(scale > 0.1 && worst > 0 && worst <= tol[k] * scale);
        /* an f64 model keeps f64 keys and values */
        assert_int_equal(td_decoder_create(m64, &d), TD_ERR_DTYPE);
        td_test_assert_message_contains("key/value cache holds an f32 model's");
    }
    td_decoder_set_default_kv_cache(TD_KV_CACHE_MODEL);
    td_model_destroy(m);
    td_model_destroy(m64);
}

/* Replaces the first `from` in the file's header by `to` (same length):
 * the header's tensor entries are outside the checksum. */
static void patch_header(const char *path, const char *from, const char *to) {
    size_t n;
    unsigned char *b = td_test_read_file(path, &n);
    char *hit = memmem(b, n, from, strlen(from));
    assert_non_null(hit);
    assert_int_equal(strlen(from), strlen(to));
    memcpy(hit, to, strlen(to));
    td_test_write_file(path, b, n);
    free(b);
}

static void bad_files_are_refused_by_name(void **state) {
    td_model *m = make_model(gpt_json, 64, TD_F32), *narrow = make_model(gpt_json, 40, TD_F32);
    td_model *back = NULL;
    const char *path = td_test_tmp("bad.safetensors");
    /* rows of 40 values are no whole q8_0 blocks: refused when saving... */
    assert_int_equal(td_checkpoint_save_weights(path, narrow, TD_WEIGHTS_Q8_0, NULL), TD_ERR_SHAPE);
    td_test_assert_message_contains("rows of 40 values are not whole q8_0 blocks of 32");
    /* ...and a q8_0 file read into them */
    TD_ASSERT_OK(td_checkpoint_save_weights(path, m, TD_WEIGHTS_Q8_0, NULL));
    assert_int_equal(td_checkpoint_load(path, narrow, NULL, NULL), TD_ERR_SHAPE);
    td_test_assert_message_contains("bad.safetensors: tensor layers.0.wte.weight is q8_0, but its "
                                    "rows of 40 values are not whole blocks of 32");
    /* a dtype safetensors names but no weight has */
    TD_ASSERT_OK(td_checkpoint_save_weights(path, m, TD_WEIGHTS_BF16, NULL));
    patch_header(path, "\"BF16\"", "\"I16\" ");
    assert_int_equal(td_checkpoint_load_model(path, td_device_list_get(devs, 0), &back, NULL),
                     TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("bad.safetensors: tensor layers.0.wte.weight has dtype I16");
    /* a dtype safetensors does not name */
    TD_ASSERT_OK(td_checkpoint_save_weights(path, m, TD_WEIGHTS_BF16, NULL));
    patch_header(path, "\"BF16\"", "\"Q4_K\"");
    assert_int_not_equal(td_checkpoint_load_model(path, td_device_list_get(devs, 0), &back, NULL),
                         TD_OK);
    td_test_assert_message_contains(
        "bad.safetensors: tensor \"layers.0.wte.weight\": dtype \"Q4_K\"");
    assert_null(back);
    td_model_destroy(m);
    td_model_destroy(narrow);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpt_q8_0_decodes_like_f64),
        cmocka_unit_test(gpt_bf16_decodes_like_f64),
        cmocka_unit_test(llama_q8_0_decodes_like_f64),
        cmocka_unit_test(llama_bf16_decodes_like_f64),
        cmocka_unit_test(compact_checkpoints_round_trip),
        cmocka_unit_test(half_kv_caches_hold_half_the_bytes),
        cmocka_unit_test(owned_models_keep_only_packed_matrices),
        cmocka_unit_test(bad_files_are_refused_by_name),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
