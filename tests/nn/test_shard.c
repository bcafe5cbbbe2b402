/* Tensor-parallel shards against the whole model: the units found, initial
 * slices equal to the whole parameters' bit for bit, a shard that holds
 * every unit whole training as the whole model does, a shard that holds
 * nothing of a unit running, the slices' host copies, and bad plans. The
 * shards of a split run together under the tensor strategy
 * (tests/parallel/test_tensor.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

/* A small GPT with dropout inside its MLPs: 2 blocks, 32 channels, 4 heads,
 * context 16, vocabulary 64. */
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

/* Llama's layers: rotary attention and grouped-query attention (split by
 * query heads), SwiGLU MLPs with and without biases (split by hidden
 * features). */
static const char llama_small[] =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32, \"positions\": false},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "  {\"type\": \"attention\", \"heads\": 4, \"rope_theta\": 10000, \"qkv_bias\": false}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "  {\"type\": \"swiglu\", \"hidden\": 40, \"bias\": true}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "  {\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "  {\"type\": \"swiglu\", \"hidden\": 24}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false}]}";

static const char mlp_dropout[] = "{\"input\": {\"shape\": [12]}, \"layers\": ["
                                  "{\"type\": \"linear\", \"out\": 24}, {\"type\": \"relu\"}, "
                                  "{\"type\": \"dropout\", \"p\": 0.3},"
                                  "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"tanh\"}, "
                                  "{\"type\": \"dropout\", \"p\": 0.5},"
                                  "{\"type\": \"linear\", \"out\": 5}]}";

static const char cnn[] = "{\"input\": {\"shape\": [1, 8, 8]}, \"layers\": ["
                          "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3},"
                          "{\"type\": \"relu\"}, {\"type\": \"flatten\"},"
                          "{\"type\": \"linear\", \"out\": 10}]}";

static char *example(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/examples/%s", TD_SOURCE_DIR, file);
    return (char *)td_test_read_file(path, NULL);
}

static int units_of(const char *json, td_split_info *u) {
    int n = -1;
    TD_ASSERT_OK(td_model_describe_splits(json, "m.json", u, TD_SHARD_MAX_UNITS, &n));
    return n;
}

/* Shard k of `of`: each unit cut as evenly as can be (the first ones larger). */
static void even_plan(const td_split_info *u, int n, int k, int of, td_shard_plan *p) {
    memset(p, 0, sizeof *p);
    p->units = n;
    for (int i = 0; i < n; i++) {
        int64_t base = u[i].size / of, rem = u[i].size % of, first = 0;
        for (int j = 0; j < k; j++)
            first += base + (j < rem);
        p->first[i] = first;
        p->count[i] = base + (k < rem);
    }
}

static void units_are_found(void **state) {
    td_split_info u[TD_SHARD_MAX_UNITS];
    char *mnist = example("mnist_mlp.json");
    int n;
    (void)state;
    assert_int_equal(units_of(gpt_small, u), 4);
    assert_int_equal(u[0].kind, TD_SPLIT_HEADS);
    assert_int_equal(u[0].size, 4);
    assert_int_equal(u[0].width, 8);
    assert_string_equal(u[0].layer, "layers.2.1");
    assert_int_equal(u[0].weights, 3 * 32 * 32 + 3 * 32 + 32 * 32);
    assert_int_equal(u[1].kind, TD_SPLIT_MLP);
    assert_int_equal(u[1].size, 64);
    assert_string_equal(u[1].layer, "layers.3.1");
    assert_int_equal(u[1].weights, 64 * 32 + 64 + 32 * 64);
    assert_int_equal(u[3].kind, TD_SPLIT_MLP);
    /* 784 -> 256 -> relu -> 128 is the pair; the last linear stays whole */
    assert_int_equal(units_of(mnist, u), 1);
    assert_int_equal(u[0].size, 256);
    assert_string_equal(u[0].layer, "layers.0");
    /* a linear ends at most one pair */
    assert_int_equal(units_of(mlp_dropout, u), 1);
    assert_int_equal(u[0].size, 24);
    n = units_of(cnn, u);
    assert_int_equal(n, 0);
    /* rotary attention without q, k, v biases; SwiGLU (its down bias left
     * out of the split weights); grouped-query attention, by query heads */
    assert_int_equal(units_of(llama_small, u), 4);
    assert_int_equal(u[0].kind, TD_SPLIT_HEADS);
    assert_int_equal(u[0].weights, 3 * 32 * 32 + 32 * 32);
    assert_int_equal(u[1].kind, TD_SPLIT_MLP);
    assert_int_equal(u[1].size, 40);
    assert_string_equal(u[1].layer, "layers.2.1");
    assert_int_equal(u[1].weights, 2 * 40 * 32 + 2 * 40 + 32 * 40);
    assert_int_equal(u[2].kind, TD_SPLIT_HEADS);
    assert_int_equal(u[2].size, 4);
    assert_int_equal(u[2].group, 2);
    assert_string_equal(u[2].layer, "layers.3.1");
    assert_int_equal(u[3].size, 24);
    assert_string_equal(u[3].layer, "layers.4.1");
    free(mnist);
}

/* Every shard parameter is the whole parameter's slice, bit for bit, and the
 * shards together cover every element of the split ones. */
static void check_init(const char *json, td_dtype dt, int of) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_split_info u[TD_SHARD_MAX_UNITS];
    int n = units_of(json, u);
    size_t es = dt == TD_F64 ? 8 : 4;
    td_model *whole = NULL;
    TD_ASSERT_OK(td_model_load_string(json, "m.json", dev, dt, 77, &whole));
    for (int k = 0; k < of; k++) {
        td_shard_plan p;
        td_model *sh = NULL;
        even_plan(u, n, k, of, &p);
        TD_ASSERT_OK(td_model_load_shard(json, "m.json", dev, dt, 77, &p, &sh));
        assert_true(td_model_is_shard(sh));
        assert_int_equal(td_model_param_count(sh), td_model_param_count(whole));
        for (size_t i = 0; i < td_model_param_count(sh); i++) {
            td_tensor *w = td_model_param(whole, i), *s = td_model_param(sh, i);
            td_param_slice sl;
            unsigned char *hw = calloc(td_tensor_nbytes(w) + 1, 1),
                          *hs = calloc(td_tensor_nbytes(s) + 1, 1),
                          *cut = calloc(td_tensor_nbytes(s) + 1, 1);
            assert_string_equal(td_model_param_name(sh, i), td_model_param_name(whole, i));
            td_model_param_slice(sh, i, &sl);
            assert_int_equal(sl.ndim, td_tensor_ndim(w));
            for (int d = 0; d < sl.ndim; d++)
                assert_int_equal(sl.shape[d], td_tensor_dim(w, d));
            TD_ASSERT_OK(td_tensor_read(w, hw, td_tensor_nbytes(w)));
            TD_ASSERT_OK(td_tensor_read(s, hs, td_tensor_nbytes(s)));
            td_param_slice_scatter(&sl, es, hw, cut);
            if (memcmp(cut, hs, td_tensor_nbytes(s)) != 0)
                fail_msg("shard %d of %d: %s differs from the whole model's slice", k, of,
                         td_model_param_name(sh, i));
            free(hw);
            free(hs);
            free(cut);
        }
        assert_int_equal(td_model_num_weights(whole) >= td_model_num_weights(sh), 1);
        td_model_destroy(sh);
    }
    td_model_destroy(whole);
    td_device_list_destroy(list);
}

static void shard_slices_equal_the_whole_models(void **state) {
    char *mnist = example("mnist_mlp.json");
    (void)state;
    check_init(gpt_small, TD_F64, 3);
    check_init(gpt_small, TD_F32, 4);
    check_init(gpt_small, TD_F32, 5); /* more shards than heads: one holds none */
    check_init(mnist, TD_F32, 3);
    check_init(mlp_dropout, TD_F64, 2);
    check_init(llama_small, TD_F64, 3);
    check_init(llama_small, TD_F32, 5); /* more shards than heads */
    free(mnist);
}

/* Gather then scatter of every slice kind gives the numbers back. */
static void slices_copy_both_ways(void **state) {
    td_param_slice s = {.ndim = 2, .shape = {6, 4}, .dim = 0, .blocks = 3, .first = 1, .count = 1};
    td_param_slice g = {.ndim = 2,
                        .shape = {10, 2},
                        .dim = 0,
                        .blocks = 3,
                        .first = 2,
                        .count = 4,
                        .kv_extent = 2,
                        .kv_first = 1,
                        .kv_count = 1};
    double whole[24], part[12], back[24];
    (void)state;
    for (int i = 0; i < 24; i++)
        whole[i] = i;
    /* rows 1 of each of 3 blocks of 2 rows: rows 1, 3, 5 */
    td_param_slice_scatter(&s, sizeof(double), whole, part);
    assert_true(part[0] == 4 && part[4] == 12 && part[8] == 20 && part[11] == 23);
    memset(back, 0, sizeof back);
    td_param_slice_gather(&s, sizeof(double), part, back);
    assert_true(back[4] == 4 && back[23] == 23 && back[0] == 0);
    s.dim = 1;
    s.blocks = 1;
    s.first = 1;
    s.count = 2; /* columns 1, 2 */
    td_param_slice_scatter(&s, sizeof(double), whole, part);
    assert_true(part[0] == 1 && part[1] == 2 && part[2] == 5 && part[11] == 22);
    /* grouped: q rows 2-5 of 6, then key row 1 of 2 (row 7), value row 1 (row 9) */
    td_param_slice_scatter(&g, sizeof(double), whole, part);
    assert_true(part[0] == 4 && part[7] == 11 && part[8] == 14 && part[9] == 15 && part[10] == 18 &&
                part[11] == 19);
    memset(back, 0, sizeof back);
    td_param_slice_gather(&g, sizeof(double), part, back);
    assert_true(back[4] == 4 && back[11] == 11 && back[14] == 14 && back[19] == 19 &&
                back[12] == 0 && back[16] == 0);
}

static double *read_all(td_tensor *t) {
    double *v = malloc(sizeof(double) * td_tensor_numel(t) + 1);
    TD_ASSERT_OK(td_tensor_read_f64(t, v, td_tensor_numel(t)));
    return v;
}

/* A shard holding every unit whole (no reduce hook needed) trains exactly as
 * the whole model: same loss, same gradients (dropout included). */
static void full_shard_trains_as_the_whole_model(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_split_info u[TD_SHARD_MAX_UNITS];
    int n = units_of(gpt_small, u);
    td_shard_plan p;
    td_model *whole = NULL, *sh = NULL;
    int32_t tokens[3 * 16], labels[3 * 16];
    td_batch b = {3, NULL, tokens, labels};
    td_step_result ra, rb;
    (void)state;
    for (int i = 0; i < 3 * 16; i++) {
        tokens[i] = (i * 7 + 3) % 64;
        labels[i] = (i * 5 + 1) % 64;
    }
    even_plan(u, n, 0, 1, &p);
    TD_ASSERT_OK(td_model_load_string(gpt_small, "m.json", dev, TD_F64, 5, &whole));
    TD_ASSERT_OK(td_model_load_shard(gpt_small, "m.json", dev, TD_F64, 5, &p, &sh));
    TD_ASSERT_OK(td_model_train_step(whole, &b, 1.0 / 48, 0, 3, &ra));
    TD_ASSERT_OK(td_model_train_step(sh, &b, 1.0 / 48, 0, 3, &rb));
    assert_true(ra.loss_sum == rb.loss_sum);
    assert_int_equal(ra.correct, rb.correct);
    for (size_t i = 0; i < td_model_param_count(whole); i++) {
        double *ga = read_all(td_model_grad(whole, i)), *gb = read_all(td_model_grad(sh, i));
        for (size_t j = 0; j < td_tensor_numel(td_model_grad(whole, i)); j++)
            if (fabs(ga[j] - gb[j]) > 1e-13 * (1 + fabs(ga[j])))
                fail_msg("%s[%zu]: %.17g vs %.17g", td_model_param_name(whole, i), j, ga[j], gb[j]);
        free(ga);
        free(gb);
    }
    TD_ASSERT_OK(td_model_evaluate(sh, &b, &rb));
    TD_ASSERT_OK(td_model_evaluate(whole, &b, &ra));
    assert_true(fabs(ra.loss_sum - rb.loss_sum) < 1e-12 * fabs(ra.loss_sum));
    td_model_destroy(whole);
    td_model_destroy(sh);
    td_device_list_destroy(list);
}

/* A shard that holds nothing of any unit still runs (its partial sums are
 * zeros) and has empty slices. */
static void empty_shard_of(const char *json) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_split_info u[TD_SHARD_MAX_UNITS];
    int n = units_of(json, u);
    td_shard_plan p;
    td_model *sh = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config oc = TD_OPTIMIZER_CONFIG_INIT;
    int32_t tokens[16], labels[16];
    td_batch b = {1, NULL, tokens, labels};
    td_step_result r;
    for (int i = 0; i < 16; i++)
        tokens[i] = labels[i] = i;
    memset(&p, 0, sizeof p);
    p.units = n;
    p.first[0] = 4; /* an empty range at the end */
    for (int k = 1; k < n; k++)
        p.first[k] = 1; /* and empty ranges inside a group of query heads */
    TD_ASSERT_OK(td_model_load_shard(json, "m.json", dev, TD_F32, 5, &p, &sh));
    oc.kind = TD_OPT_ADAMW;
    oc.clip_norm = 1.0;
    TD_ASSERT_OK(td_optimizer_create(sh, &oc, &opt));
    TD_ASSERT_OK(td_model_train_step(sh, &b, 1.0 / 16, 0, 0, &r));
    assert_true(isfinite(r.loss_sum));
    TD_ASSERT_OK(td_optimizer_step(opt, NULL));
    td_optimizer_destroy(opt);
    td_model_destroy(sh);
    td_device_list_destroy(list);
}

/* No heads of the attention layers (of a grouped-query one, none from the
 * middle of a group: it shares no key/value head), no hidden features of
 * the MLPs; clipping sums the gradient's norm. */
static void empty_shard_runs(void **state) {
    (void)state;
    empty_shard_of(gpt_small);
    empty_shard_of(llama_small);
}

static void bad_plans_are_refused(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    td_shard_plan p;
    td_model *sh = NULL;
    (void)state;
    memset(&p, 0, sizeof p);
    p.units = 3;
    TD_ASSERT_STATUS(td_model_load_shard(gpt_small, "m.json", dev, TD_F32, 5, &p, &sh),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("has 3 units; the model has 4");
    p.units = 4;
    p.first[1] = 60;
    p.count[1] = 5;
    TD_ASSERT_STATUS(td_model_load_shard(gpt_small, "m.json", dev, TD_F32, 5, &p, &sh),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("[60, 65) is not within its 64 hidden features");
    assert_null(sh);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(units_are_found),
        cmocka_unit_test(shard_slices_equal_the_whole_models),
        cmocka_unit_test(slices_copy_both_ways),
        cmocka_unit_test(full_shard_trains_as_the_whole_model),
        cmocka_unit_test(empty_shard_runs),
        cmocka_unit_test(bad_plans_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
