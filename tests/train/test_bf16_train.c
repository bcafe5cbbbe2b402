/* Mixed-precision training (td_train_config.precision bf16): the MNIST MLP
 * reaches the 97.5% floor in two epochs; bf16 moves the numbers a
 * little from f32's, and only a little; the strategies that split the batch
 * or the layers train in it unchanged; f64 weights are refused. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "support/support.h"

#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"

/* The demo's recipe (docs/train.md), two epochs of its three: about 97.9%
 * in bf16 and 98.1% in f32. */
static void mnist_mlp_reaches_the_floor_in_bf16(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    c.model_path = MLP;
    c.data_path = MNIST;
    c.epochs = 2;
    c.batch = 64;
    c.opt.lr = 0.05;
    c.opt.schedule = TD_LR_COSINE;
    c.eval_each_epoch = 0;
    c.precision = TD_PRECISION_BF16;
    TD_ASSERT_OK(td_train_run(&c, &s));
    assert_int_equal(s.test_samples, 10000);
    printf("MNIST MLP in bf16, 2 epochs: test accuracy %.2f%% (%s)\n", 100 * s.test_accuracy,
           s.precision);
    assert_non_null(strstr(s.precision, " bf16 ("));
    assert_true(s.test_accuracy >= 0.975);
}

/* The same short run in f32 and in bf16, from the same seed: bf16's
 * rounding changes the losses (so bf16 products really ran) by less than
 * their 8 bits could if it had gone wrong. */
static void bf16_moves_the_loss_a_little(void **state) {
    double loss[2];
    for (int p = 0; p < 2; p++) {
        td_train_config c = TD_TRAIN_CONFIG_INIT;
        td_train_summary s;
        c.model_path = MLP;
        c.data_path = MNIST;
        c.steps = 40;
        c.opt.lr = 0.05;
        c.eval_samples = 2000;
        c.eval_each_epoch = 0;
        c.precision = p ? TD_PRECISION_BF16 : TD_PRECISION_F32;
        TD_ASSERT_OK(td_train_run(&c, &s));
        assert_int_equal(s.precision[0] != 0, p);
        loss[p] = s.test_loss;
    }
    printf("test loss after 40 steps: f32 %.6f, bf16 %.6f\n", loss[0], loss[1]);
    assert_true(loss[0] != loss[1]);
    assert_true(fabs(loss[1] - loss[0]) < 0.02 * loss[0]);
}

/* data splits the batch over two devices, pipeline the layers: neither
 * knows the precision, each of their devices reports bf16, and their test
 * loss is one device's in bf16 up to the order of the sums. */
static void strategies_train_in_bf16(void **state) {
    static const char *const strategies[] = {"single", "data", "pipeline"};
    double loss0 = 0;
    for (int i = 0; i < 3; i++) {
        td_train_config c = TD_TRAIN_CONFIG_INIT;
        td_train_summary s;
        c.model_path = MLP;
        c.data_path = MNIST;
        c.devices = i ? "cpu*2" : "cpu:0";
        c.strategy = strategies[i];
        c.steps = 30;
        c.batch = 128;
        c.opt.lr = 0.05;
        c.eval_samples = 2000;
        c.eval_each_epoch = 0;
        c.precision = TD_PRECISION_BF16;
        TD_ASSERT_OK(td_train_run(&c, &s));
        printf("%s in bf16: %s; test loss %.6f\n", strategies[i], s.precision, s.test_loss);
        assert_non_null(strstr(s.precision, "cpu:0 bf16 ("));
        if (i == 0) {
            loss0 = s.test_loss;
            continue;
        }
        assert_non_null(strstr(s.precision, "cpu:1 bf16 ("));
        assert_true(fabs(s.test_loss - loss0) < 0.01 * loss0);
    }
}

static void f64_weights_are_refused(void **state) {
    td_train_config c = TD_TRAIN_CONFIG_INIT;
    td_train_summary s;
    c.model_path = MLP;
    c.data_path = MNIST;
    c.steps = 1;
    c.dtype = TD_F64;
    c.precision = TD_PRECISION_BF16;
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("f32 master weights");
    assert_string_equal(td_last_error_setting(), "precision");
    assert_int_equal(s.bad_setting, 1);
    c.dtype = TD_F32;
    c.precision = (td_precision)9;
    TD_ASSERT_STATUS(td_train_run(&c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("unknown precision 9");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mnist_mlp_reaches_the_floor_in_bf16),
        cmocka_unit_test(bf16_moves_the_loss_a_little),
        cmocka_unit_test(strategies_train_in_bf16),
        cmocka_unit_test(f64_weights_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
