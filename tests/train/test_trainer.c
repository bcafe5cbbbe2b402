/* The trainer: loss falls on MNIST, a resumed run repeats an uninterrupted
 * one bit for bit (weights, optimizer state, losses), a text model trains,
 * and the MNIST MLP reaches its accuracy floor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"
#include "tandem/checkpoint.h"

#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"
#define TEXT  TD_SOURCE_DIR "/data/text/tinyshakespeare.txt"

/* The "loss" of every step event in a metrics file, in order. */
static int read_step_losses(const char *path, double *loss, int max) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!o)
            fail_msg("%s: not a JSON line: %s (%s)", path, line, e.text);
        if (!strcmp(json_string_value(json_object_get(o, "event")), "step") && n < max) {
            assert_int_equal(json_integer_value(json_object_get(o, "step")), n + 1);
            loss[n++] = json_real_value(json_object_get(o, "loss"));
        }
        json_decref(o);
    }
    fclose(f);
    return n;
}

static void mnist_loss_falls(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    double loss[200], head = 0, tail = 0;
    c.model_path = MLP;
    c.data_path = MNIST;
    c.steps = 150;
    c.epochs = 0;
    c.batch = 64;
    c.opt.lr = 0.05;
    c.eval_samples = 1000;
    c.metrics = td_test_tmp("falls.jsonl");
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.steps, 150);
    assert_int_equal(s.samples, 150 * 64);
    assert_int_equal(s.test_samples, 1000);
    assert_int_equal(read_step_losses(c.metrics, loss, 200), 150);
    for (int i = 0; i < 20; i++) {
        head += loss[i] / 20;
        tail += loss[130 + i] / 20;
    }
    /* ln 10 = 2.30 at the start; a working step is far below after 150. */
    assert_true(head > 1.0);
    assert_true(tail < 0.5 * head);
    assert_true(s.test_accuracy > 0.85);
}

/* Tensor-by-tensor equality of two checkpoints, bit for bit. */
static void assert_same_tensors(const char *a, const char *b) {
    td_safetensors *x, *y;
    TD_ASSERT_OK(td_safetensors_load(a, &x));
    TD_ASSERT_OK(td_safetensors_load(b, &y));
    assert_int_equal(td_safetensors_count(x), td_safetensors_count(y));
    assert_true(td_safetensors_count(x) > 0);
    for (size_t i = 0; i < td_safetensors_count(x); i++) {
        const td_st_tensor *tx = td_safetensors_tensor(x, i);
        const td_st_tensor *ty = td_safetensors_find(y, tx->name);
        assert_non_null(ty);
        assert_int_equal(tx->nbytes, ty->nbytes);
        if (memcmp(tx->data, ty->data, tx->nbytes) != 0)
            fail_msg("tensor %s differs between %s and %s", tx->name, a, b);
    }
    assert_string_equal(td_safetensors_meta(x, "tandem.step"),
                        td_safetensors_meta(y, "tandem.step"));
    assert_string_equal(td_safetensors_meta(x, "tandem.epoch"),
                        td_safetensors_meta(y, "tandem.epoch"));
    assert_string_equal(td_safetensors_meta(x, "tandem.sample"),
                        td_safetensors_meta(y, "tandem.sample"));
    td_safetensors_destroy(x);
    td_safetensors_destroy(y);
}

/* Runs `total` steps straight, and `first` steps then a resume to `total`;
 * both must end with the same bits and log the same losses. */
static void check_resume(td_train_config base, int64_t first, int64_t total, const char *tag) {
    td_train_config c;
    td_train_summary s;
    char straight[64], part[64], resumed[64], m1[64], m2[64];
    static double l1[400], l2[400];
    int n1, n2;
    snprintf(straight, sizeof straight, "%s-straight.st", tag);
    snprintf(part, sizeof part, "%s-part.st", tag);
    snprintf(resumed, sizeof resumed, "%s-resumed.st", tag);
    snprintf(m1, sizeof m1, "%s-1.jsonl", tag);
    snprintf(m2, sizeof m2, "%s-2.jsonl", tag);
    c = base;
    c.steps = total;
    c.checkpoint = td_test_tmp(straight);
    c.metrics = td_test_tmp(m1);
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.steps, total);

    c = base;
    c.steps = first;
    c.checkpoint = td_test_tmp(part);
    c.metrics = td_test_tmp(m2);
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.steps, first);

    c = base;
    c.model_path = NULL; /* the checkpoint's model */
    c.resume = td_test_tmp(part);
    c.steps = total;
    c.checkpoint = td_test_tmp(resumed);
    c.metrics = td_test_tmp(m2); /* appended */
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.steps, total);
    assert_int_equal(s.samples, (total - first) * base.batch);

    assert_same_tensors(td_test_tmp(straight), td_test_tmp(resumed));
    n1 = read_step_losses(td_test_tmp(m1), l1, 400);
    n2 = read_step_losses(td_test_tmp(m2), l2, 400);
    assert_int_equal(n1, total);
    assert_int_equal(n2, total);
    for (int i = 0; i < n1; i++)
        if (memcmp(&l1[i], &l2[i], sizeof l1[i]) != 0)
            fail_msg("%s: step %d loss %.17g straight, %.17g resumed", tag, i + 1, l1[i], l2[i]);
}

static void resuming_mnist_repeats_the_run_bit_for_bit(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    c.model_path = MLP;
    c.data_path = MNIST;
    c.epochs = 0;
    c.batch = 1000; /* 60 steps an epoch: the resume crosses an epoch's end */
    c.opt.lr = 0.05;
    c.opt.schedule = TD_LR_COSINE;
    c.opt.total_steps = 70;
    c.opt.nesterov = 1;
    c.seed = 7;
    c.eval_samples = 500;
    check_resume(c, 45, 70, "mlp");
}

/* A small GPT: the token path, AdamW with warm-up and clipping, dropout. */
static const char *write_tiny_gpt(void) {
    static const char json[] =
        "{\"name\":\"gpt_micro\",\"input\":{\"tokens\":16,\"vocab\":256},\"layers\":["
        "{\"type\":\"embedding\",\"vocab\":256,\"dim\":32,\"positions\":true},"
        "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\"},"
        "{\"type\":\"attention\",\"heads\":2},{\"type\":\"dropout\",\"p\":0.1}]},"
        "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\"},"
        "{\"type\":\"linear\",\"out\":64},{\"type\":\"gelu\"},{\"type\":\"linear\",\"out\":32}]},"
        "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":256}]}";
    const char *path = td_test_tmp("gpt_micro.json");
    td_test_write_file(path, json, strlen(json));
    return path;
}

static void resuming_a_text_model_repeats_the_run_bit_for_bit(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    static char model[512];
    snprintf(model, sizeof model, "%s", write_tiny_gpt());
    c.model_path = model;
    c.data_path = TEXT;
    c.epochs = 0;
    c.batch = 8;
    c.opt.kind = TD_OPT_ADAMW;
    c.opt.lr = 3e-3;
    c.opt.weight_decay = 0.01;
    c.opt.warmup_steps = 5;
    c.opt.clip_norm = 1.0;
    c.seed = 3;
    c.eval_samples = 64;
    check_resume(c, 17, 30, "gpt");
}

static void a_text_model_learns(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    double loss[200], head = 0, tail = 0;
    static char model[512];
    snprintf(model, sizeof model, "%s", write_tiny_gpt());
    c.model_path = model;
    c.data_path = TEXT;
    c.epochs = 0;
    c.steps = 120;
    c.batch = 16;
    c.opt.kind = TD_OPT_ADAMW;
    c.opt.lr = 3e-3;
    c.eval_samples = 128;
    c.metrics = td_test_tmp("gpt-learns.jsonl");
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(read_step_losses(c.metrics, loss, 200), 120);
    for (int i = 0; i < 10; i++) {
        head += loss[i] / 10;
        tail += loss[110 + i] / 10;
    }
    /* Uniform over 256 bytes is ln 256 = 5.55 nats; English letters alone are far below. */
    assert_true(head > 4.0);
    assert_true(tail < 3.3);
    assert_true(s.test_loss < 3.3);
}

static void a_character_vocabulary_is_kept_in_the_checkpoint(void **state) {
    static const char json[] =
        "{\"name\":\"gpt_chars\",\"input\":{\"tokens\":8,\"vocab\":65},\"layers\":["
        "{\"type\":\"embedding\",\"vocab\":65,\"dim\":16,\"positions\":true},"
        "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\"},"
        "{\"type\":\"attention\",\"heads\":2}]},"
        "{\"type\":\"layernorm\"},{\"type\":\"linear\",\"out\":65}]}";
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    td_safetensors *sf;
    const char *vocab;
    static char model[512], ckpt[512], other[512];
    FILE *f;
    snprintf(model, sizeof model, "%s", td_test_tmp("gpt_chars.json"));
    snprintf(ckpt, sizeof ckpt, "%s", td_test_tmp("chars.st"));
    snprintf(other, sizeof other, "%s", td_test_tmp("other.txt"));
    td_test_write_file(model, json, strlen(json));
    c.model_path = model;
    c.data_path = TEXT;
    c.epochs = 0;
    c.steps = 3;
    c.batch = 4;
    c.opt.kind = TD_OPT_ADAMW;
    c.opt.lr = 1e-3;
    c.eval_samples = 8;
    c.checkpoint = ckpt;
    TD_ASSERT_OK(td_train_run(&c, &s));
    TD_ASSERT_OK(td_safetensors_load(ckpt, &sf));
    vocab = td_safetensors_meta(sf, "tandem.vocab");
    assert_non_null(vocab);
    /* 65 characters in byte order: newline, space, '!', ... 'z'. */
    assert_int_equal(strlen(vocab), 2 * 65);
    assert_memory_equal(vocab, "0a2021", 6);
    assert_memory_equal(vocab + 2 * 64, "7a", 2);
    td_safetensors_destroy(sf);
    /* Resuming on a text with other characters would scramble the tokens. */
    assert_non_null(f = fopen(other, "w"));
    for (int i = 0; i < 200; i++)
        fputs("abcdefgh\n", f);
    fclose(f);
    c.model_path = NULL;
    c.resume = ckpt;
    c.data_path = other;
    c.steps = 5;
    c.checkpoint = NULL;
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("characters differ");
    c.data_path = TEXT;
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.steps, 5);
}

static void mnist_mlp_reaches_its_floor_in_three_epochs(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    c.model_path = MLP;
    c.data_path = MNIST;
    c.epochs = 3;
    c.batch = 64;
    c.opt.lr = 0.05;
    c.opt.schedule = TD_LR_COSINE;
    c.eval_each_epoch = 0;
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.epochs_done, 3);
    assert_int_equal(s.steps, 3 * 938);
    assert_int_equal(s.test_samples, 10000);
    printf("MNIST MLP, 3 epochs: test accuracy %.2f%%\n", 100 * s.test_accuracy);
    assert_true(s.test_accuracy >= 0.975);
}

static void bad_configurations_are_errors(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    c.model_path = MLP;
    c.data_path = TEXT;
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("folder of MNIST IDX files");
    c.data_path = td_test_tmp("nothing-here");
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_IO);
    td_test_assert_message_contains("nothing-here");
    c.data_path = MNIST;
    c.model_path = td_test_tmp("missing.json");
    assert_true(td_train_run(&c, &s) != TD_OK);
    td_test_assert_message_contains("missing.json");
    c.model_path = MLP;
    c.batch = 0;
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("batch size 0");
    /* The message and td_last_error_setting() name the field, not a flag. */
    td_test_assert_message_contains("(`batch`)");
    assert_string_equal(td_last_error_setting(), "batch");
    c.batch = 64;
    c.resume = td_test_tmp("no-checkpoint.st");
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_IO);
    td_test_assert_message_contains("no-checkpoint.st");
    c.resume = NULL;
    c.checkpoint = td_test_tmp("no/such/folder/c.st");
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_IO);
    td_test_assert_message_contains("cannot write a checkpoint there");
    assert_string_equal(td_last_error_setting(), "checkpoint");
    c.checkpoint = NULL;
    c.devices = "cpu:999";
    assert_true(td_train_run(&c, &s) != TD_OK);
    td_test_assert_message_contains("cpu:999");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mnist_loss_falls),
        cmocka_unit_test(resuming_mnist_repeats_the_run_bit_for_bit),
        cmocka_unit_test(resuming_a_text_model_repeats_the_run_bit_for_bit),
        cmocka_unit_test(a_text_model_learns),
        cmocka_unit_test(a_character_vocabulary_is_kept_in_the_checkpoint),
        cmocka_unit_test(mnist_mlp_reaches_its_floor_in_three_epochs),
        cmocka_unit_test(bad_configurations_are_errors),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
