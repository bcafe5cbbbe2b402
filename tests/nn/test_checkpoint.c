/* Checkpoints of a model and its optimizer: round trip, and clear errors for
 * files that are corrupt or belong to another model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"
#include "tandem/checkpoint.h"

#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"
#define LENET TD_SOURCE_DIR "/examples/lenet5.json"

static td_device_list *devs;
static td_device *dev;

static int setup(void **state) {
    if (td_test_tmpdir_setup(state) || td_devices_open("cpu", &devs) != TD_OK)
        return -1;
    dev = td_device_list_get(devs, 0);
    return 0;
}

static int teardown(void **state) {
    td_device_list_destroy(devs);
    return td_test_tmpdir_teardown(state);
}

/* A few AdamW steps on a fixed batch so the moments are not zero. */
static void train_a_little(td_model *m, td_optimizer *opt) {
    static float x[8 * 784];
    static int32_t y[8];
    td_batch b = {8, x, NULL, y};
    td_step_result r;
    for (int i = 0; i < 8 * 784; i++)
        x[i] = (float)td_rng_normal(5, (uint64_t)i);
    for (int i = 0; i < 8; i++)
        y[i] = i % 10;
    for (int s = 0; s < 3; s++) {
        TD_ASSERT_OK(td_model_train_step(m, &b, 1.0 / 8, 0, (uint64_t)s, &r));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
    }
}

static void assert_same(td_tensor *a, td_tensor *b) {
    size_t n = td_tensor_nbytes(a);
    void *x = malloc(n), *y = malloc(n);
    assert_int_equal(n, td_tensor_nbytes(b));
    TD_ASSERT_OK(td_tensor_read(a, x, n));
    TD_ASSERT_OK(td_tensor_read(b, y, n));
    assert_memory_equal(x, y, n);
    free(x);
    free(y);
}

static void round_trip_restores_weights_optimizer_and_state(void **state) {
    td_model *m, *m2, *m3;
    td_optimizer *opt, *opt2;
    td_optimizer_config oc = TD_OPTIMIZER_CONFIG_INIT;
    td_train_state s, back;
    td_safetensors *sf;
    memset(&s, 0, sizeof s);
    oc.kind = TD_OPT_ADAMW;
    oc.lr = 1e-3;
    oc.weight_decay = 0.1;
    oc.schedule = TD_LR_COSINE;
    oc.total_steps = 100;
    TD_ASSERT_OK(td_model_load(MLP, dev, TD_F32, 1, &m));
    TD_ASSERT_OK(td_optimizer_create(m, &oc, &opt));
    train_a_little(m, opt);
    s.step = 3;
    s.epoch = 2;
    s.sample = 640;
    s.seed = 0xfedcba9876543210ull;
    s.batch = 64;
    s.opt = oc;
    memcpy(s.vocab, "\nab", 3);
    s.vocab_len = 3;
    TD_ASSERT_OK(td_checkpoint_save(td_test_tmp("rt.st"), m, opt, &s));

    /* Another initialisation, then the checkpoint over it. */
    TD_ASSERT_OK(td_model_load(MLP, dev, TD_F32, 99, &m2));
    TD_ASSERT_OK(td_optimizer_create(m2, &oc, &opt2));
    TD_ASSERT_OK(td_checkpoint_load(td_test_tmp("rt.st"), m2, opt2, &back));
    for (size_t i = 0; i < td_model_param_count(m); i++)
        assert_same(td_model_param(m, i), td_model_param(m2, i));
    assert_int_equal(td_optimizer_state_count(opt), td_optimizer_state_count(opt2));
    assert_true(td_optimizer_state_count(opt) >= 2 * td_model_param_count(m));
    for (size_t i = 0; i < td_optimizer_state_count(opt); i++)
        assert_same(td_optimizer_state(opt, i), td_optimizer_state(opt2, i));
    assert_int_equal(td_optimizer_steps(opt2), 3);
    assert_int_equal(back.step, 3);
    assert_int_equal(back.epoch, 2);
    assert_int_equal(back.sample, 640);
    assert_true(back.seed == 0xfedcba9876543210ull);
    assert_int_equal(back.batch, 64);
    assert_int_equal(back.opt.kind, TD_OPT_ADAMW);
    assert_true(back.opt.lr == 1e-3 && back.opt.weight_decay == 0.1);
    assert_int_equal(back.opt.schedule, TD_LR_COSINE);
    assert_int_equal(back.opt.total_steps, 100);
    assert_int_equal(back.vocab_len, 3);
    assert_memory_equal(back.vocab, "\nab", 3);

    /* The model can be rebuilt from the file alone. */
    TD_ASSERT_OK(td_checkpoint_load_model(td_test_tmp("rt.st"), dev, &m3, NULL));
    assert_int_equal(td_model_param_count(m3), td_model_param_count(m));
    for (size_t i = 0; i < td_model_param_count(m); i++)
        assert_same(td_model_param(m, i), td_model_param(m3, i));

    /* And the file is plain safetensors with the documented keys. */
    TD_ASSERT_OK(td_safetensors_load(td_test_tmp("rt.st"), &sf));
    assert_non_null(td_safetensors_find(sf, "layers.0.weight"));
    assert_non_null(td_safetensors_find(sf, "optimizer.layers.0.weight.exp_avg"));
    assert_string_equal(td_safetensors_meta(sf, "tandem.step"), "3");
    assert_string_equal(td_safetensors_meta(sf, "tandem.model"), td_model_json(m));
    td_safetensors_destroy(sf);

    td_optimizer_destroy(opt);
    td_optimizer_destroy(opt2);
    td_model_destroy(m);
    td_model_destroy(m2);
    td_model_destroy(m3);
}

static void mismatched_models_are_errors_naming_the_tensor(void **state) {
    td_model *mlp, *lenet, *m64;
    td_optimizer *opt;
    td_optimizer_config oc = TD_OPTIMIZER_CONFIG_INIT;
    TD_ASSERT_OK(td_model_load(MLP, dev, TD_F32, 1, &mlp));
    TD_ASSERT_OK(td_checkpoint_save(td_test_tmp("w.st"), mlp, NULL, NULL));
    TD_ASSERT_OK(td_model_load(LENET, dev, TD_F32, 1, &lenet));
    TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("w.st"), lenet, NULL, NULL), TD_ERR_SHAPE);
    td_test_assert_message_contains(td_test_tmp("w.st"));
    td_test_assert_message_contains("\"layers.0.weight\"");
    TD_ASSERT_OK(td_model_load(MLP, dev, TD_F64, 1, &m64));
    TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("w.st"), m64, NULL, NULL), TD_ERR_DTYPE);
    td_test_assert_message_contains("f32");
    /* Weights only, but the optimizer is wanted. */
    TD_ASSERT_OK(td_optimizer_create(mlp, &oc, &opt));
    TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("w.st"), mlp, opt, NULL), TD_ERR_CORRUPT);
    td_test_assert_message_contains("no optimizer state");
    TD_ASSERT_OK(td_checkpoint_load(td_test_tmp("w.st"), mlp, NULL, NULL));
    td_optimizer_destroy(opt);
    td_model_destroy(mlp);
    td_model_destroy(lenet);
    td_model_destroy(m64);
}

static void corrupt_checkpoints_are_clear_errors(void **state) {
    td_model *m, *m2 = (td_model *)1;
    FILE *f;
    unsigned char *b;
    long n;
    TD_ASSERT_OK(td_model_load(MLP, dev, TD_F32, 1, &m));
    TD_ASSERT_OK(td_checkpoint_save(td_test_tmp("c.st"), m, NULL, NULL));
    f = fopen(td_test_tmp("c.st"), "rb");
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = malloc((size_t)n);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);

    b[n - 100] ^= 0x01; /* a bit of the last tensor */
    f = fopen(td_test_tmp("flip.st"), "wb");
    fwrite(b, 1, (size_t)n, f);
    fclose(f);
    TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("flip.st"), m, NULL, NULL), TD_ERR_CORRUPT);
    td_test_assert_message_contains(td_test_tmp("flip.st"));
    td_test_assert_message_contains("checksum");
    TD_ASSERT_STATUS(td_checkpoint_load_model(td_test_tmp("flip.st"), dev, &m2, NULL),
                     TD_ERR_CORRUPT);
    assert_null(m2);
    b[n - 100] ^= 0x01;

    f = fopen(td_test_tmp("short.st"), "wb");
    fwrite(b, 1, (size_t)n / 2, f);
    fclose(f);
    TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("short.st"), m, NULL, NULL), TD_ERR_CORRUPT);
    td_test_assert_message_contains(td_test_tmp("short.st"));
    td_test_assert_message_contains("truncated");

    /* A plain safetensors file without tandem's metadata. */
    {
        td_safetensors_writer *w;
        int64_t shape[1] = {1};
        float one = 1;
        TD_ASSERT_OK(td_safetensors_writer_create(&w));
        TD_ASSERT_OK(td_safetensors_writer_add(w, "layers.0.weight", TD_F32, 1, shape, &one));
        TD_ASSERT_OK(td_safetensors_writer_save(w, td_test_tmp("plain.st")));
        td_safetensors_writer_destroy(w);
        TD_ASSERT_STATUS(td_checkpoint_load(td_test_tmp("plain.st"), m, NULL, NULL),
                         TD_ERR_CORRUPT);
        td_test_assert_message_contains("not a tandem checkpoint");
        TD_ASSERT_STATUS(td_checkpoint_load_model(td_test_tmp("plain.st"), dev, &m2, NULL),
                         TD_ERR_CORRUPT);
        td_test_assert_message_contains("tandem.model");
    }
    free(b);
    td_model_destroy(m);
}

/* A checkpoint of a 3-to-2 linear whose metadata is a valid run's, but for
 * `key` set to `value` (NULL: all valid). */
static const char *with_meta(const char *key, const char *value) {
    static const char *const meta[][2] = {
        {"tandem.format", "tandem-checkpoint-1"},
        {"tandem.model", "{\"input\": {\"shape\": [3]}, \"layers\": [{\"type\": \"linear\", "
                         "\"out\": 2}]}"},
        {"tandem.dtype", "f32"},
        {"tandem.step", "3"},
        {"tandem.epoch", "1"},
        {"tandem.sample", "8"},
        {"tandem.seed", "18446744073709551615"},
        {"tandem.batch", "4"},
        {"tandem.has_optimizer", "0"},
        {"tandem.optimizer",
         "{\"kind\":\"adamw\",\"lr\":0.01,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"cosine\",\"warmup_steps\":0,\"total_steps\":10,\"min_lr\":0}"},
        {"tandem.vocab", "0a61"},
    };
    td_safetensors_writer *w;
    float weight[6] = {0}, bias[2] = {0};
    int64_t ws[2] = {2, 3}, bs[1] = {2};
    TD_ASSERT_OK(td_safetensors_writer_create(&w));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "layers.0.weight", TD_F32, 2, ws, weight));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "layers.0.bias", TD_F32, 1, bs, bias));
    for (size_t i = 0; i < sizeof meta / sizeof *meta; i++)
        TD_ASSERT_OK(td_safetensors_writer_set_meta(w, meta[i][0], meta[i][1]));
    if (key)
        TD_ASSERT_OK(td_safetensors_writer_set_meta(w, key, value));
    TD_ASSERT_OK(td_safetensors_writer_save(w, td_test_tmp("meta.st")));
    td_safetensors_writer_destroy(w);
    return td_test_tmp("meta.st");
}

/* Issue 26, item 9: each field of the metadata is range-checked, and a bad
 * one is an error naming it, whichever way the file is read. */
static void metadata_out_of_range_is_an_error_naming_the_field(void **state) {
    static const char *const bad[][3] = {
        /* key, value, what the message names */
        {"tandem.epoch", "9223372036854775807", "\"tandem.epoch\""},
        {"tandem.step", "99999999999999999999", "\"tandem.step\""},
        {"tandem.sample", "-1", "\"tandem.sample\""},
        {"tandem.batch", "16777217", "\"tandem.batch\""},
        {"tandem.seed", "abc", "\"tandem.seed\""},
        {"tandem.seed", "-1", "\"tandem.seed\""},
        {"tandem.seed", "18446744073709551616", "\"tandem.seed\""},
        {"tandem.has_optimizer", "2", "\"tandem.has_optimizer\""},
        {"tandem.vocab", "-1", "\"tandem.vocab\""},
        {"tandem.vocab", "0g", "\"tandem.vocab\""},
        {"tandem.format", "tandem-checkpoint-9", "\"tandem.format\""},
        {"tandem.optimizer",
         "{\"kind\":\"rmsprop\",\"lr\":0.01,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"constant\",\"warmup_steps\":0,\"total_steps\":0,\"min_lr\":0}",
         "\"tandem.optimizer\": \"kind\""},
        {"tandem.optimizer",
         "{\"kind\":\"sgd\",\"lr\":0.01,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"linear\",\"warmup_steps\":0,\"total_steps\":0,\"min_lr\":0}",
         "\"tandem.optimizer\": \"schedule\""},
        {"tandem.optimizer",
         "{\"kind\":\"sgd\",\"lr\":-1,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"constant\",\"warmup_steps\":0,\"total_steps\":0,\"min_lr\":0}",
         "\"tandem.optimizer\": \"lr\""},
        {"tandem.optimizer",
         "{\"kind\":\"sgd\",\"lr\":0.01,\"momentum\":1.5,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"constant\",\"warmup_steps\":0,\"total_steps\":0,\"min_lr\":0}",
         "\"tandem.optimizer\": \"momentum\""},
        {"tandem.optimizer",
         "{\"kind\":\"sgd\",\"lr\":0.01,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"constant\",\"warmup_steps\":-5,\"total_steps\":0,\"min_lr\":0}",
         "\"tandem.optimizer\": \"warmup_steps\""},
        {"tandem.optimizer",
         "{\"kind\":\"sgd\",\"lr\":0.01,\"momentum\":0.9,\"nesterov\":false,\"beta1\":0.9,"
         "\"beta2\":0.999,\"eps\":1e-08,\"weight_decay\":0,\"clip_norm\":0,\"schedule\":"
         "\"constant\",\"warmup_steps\":0,\"total_steps\":0,\"min_lr\":0,\"lr2\":1}",
         "lr2"},
    };
    char *json = NULL;
    td_dtype dt;
    td_train_state s;
    td_model *m = NULL;

    /* The valid file reads back whole: the largest seed included. */
    TD_ASSERT_OK(td_checkpoint_read_meta(with_meta(NULL, NULL), &json, &dt, &s));
    free(json);
    assert_true(s.seed == UINT64_MAX);
    assert_int_equal(s.epoch, 1);
    assert_int_equal(s.opt.kind, TD_OPT_ADAMW);
    assert_int_equal(s.opt.schedule, TD_LR_COSINE);
    assert_int_equal(s.vocab_len, 2);
    assert_memory_equal(s.vocab, "\na", 2);

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *path = with_meta(bad[i][0], bad[i][1]);
        json = (char *)0x1;
        if (td_checkpoint_read_meta(path, &json, &dt, &s) != TD_ERR_CORRUPT)
            fail_msg("case %zu (%s = %s) was accepted", i, bad[i][0], bad[i][1]);
        assert_null(json);
        td_test_assert_message_contains(bad[i][2]);
        TD_ASSERT_STATUS(td_checkpoint_load_model(path, dev, &m, &s), TD_ERR_CORRUPT);
        assert_null(m);
        td_test_assert_message_contains(bad[i][2]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_restores_weights_optimizer_and_state),
        cmocka_unit_test(mismatched_models_are_errors_naming_the_tensor),
        cmocka_unit_test(corrupt_checkpoints_are_clear_errors),
        cmocka_unit_test(metadata_out_of_range_is_an_error_naming_the_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
