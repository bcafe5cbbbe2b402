/* examples/llama_tiny.json (RMSNorm, grouped-query attention with rotary
 * positions, SwiGLU) trained a few steps under `data` on cpu*2 against one
 * device on the same batches: the weights within 1e-12 in f64 and 1e-5 in
 * f32, the last step's loss and counts alike. And the example's shape and
 * parameter count as docs/models.md gives them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/model_data.h"
#include "support/support.h"
#include "tandem/strategy.h"

#define STEPS 3
#define BATCH 3

static char *llama_tiny(void) {
    return (char *)td_test_read_file(TD_SOURCE_DIR "/examples/llama_tiny.json", NULL);
}

/* Trains `name` on spec over d's batches; saves the weights to path. */
static void train(const char *name, const char *spec, const char *json, td_dtype dt,
                  const td_test_data *d, const char *path, td_step_result *last) {
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    char plan[4096];
    c.name = name;
    c.dtype = dt;
    c.seed = 11;
    c.batch = d->n;
    /* SGD with momentum: its update is linear in the gradients (see dp_check.h) */
    c.opt.kind = TD_OPT_SGD;
    c.opt.lr = 0.05;
    c.opt.momentum = 0.9;
    c.opt.weight_decay = 0.01;
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "llama_tiny", &c, &s));
    printf("%s on %s:\n%s", name, spec, td_strategy_plan(s, plan, sizeof plan));
    for (int k = 0; k < d->steps; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->b[k], (uint64_t)k, last, NULL));
    TD_ASSERT_OK(td_strategy_save(s, path, NULL));
    td_strategy_destroy(s);
    td_group_destroy(g);
}

static void data_on_two_devices_equals_one(void **state) {
    char *json = llama_tiny();
    td_test_data *d = td_test_data_create(json, STEPS, BATCH);
    (void)state;
    for (int dt = TD_F64; dt >= TD_F32; dt--) {
        double tol = dt == TD_F64 ? 1e-12 : 1e-5, diff;
        td_step_result one, two;
        train("single", "cpu:0", json, (td_dtype)dt, d, td_test_tmp("one.safetensors"), &one);
        train("data", "cpu*2", json, (td_dtype)dt, d, td_test_tmp("two.safetensors"), &two);
        diff =
            td_dp_checkpoint_diff(td_test_tmp("one.safetensors"), td_test_tmp("two.safetensors"));
        printf("llama_tiny, %s: data on cpu*2 differs from one device by %.3g (tol %g); loss "
               "%.17g vs %.17g\n",
               dt == TD_F64 ? "f64" : "f32", diff, tol, two.loss_sum, one.loss_sum);
        assert_true(diff <= tol);
        assert_true(fabs(two.loss_sum - one.loss_sum) <= 10 * tol * fabs(one.loss_sum));
        assert_int_equal(two.count, one.count);
        assert_int_equal(two.correct, one.correct);
    }
    td_test_data_destroy(d);
    free(json);
}

static void the_example_is_as_documented(void **state) {
    char *json = llama_tiny();
    td_model_info info;
    (void)state;
    TD_ASSERT_OK(td_model_describe(json, "llama_tiny.json", &info, NULL, 0));
    /* embedding 256x128; 4 blocks of (qkv 256x128, proj 128x128, SwiGLU
     * 2x344x128 + 128x344, two RMSNorms); final RMSNorm; head 256x128 */
    assert_int_equal(info.num_weights, 791680);
    free(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_example_is_as_documented),
        cmocka_unit_test(data_on_two_devices_equals_one),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
