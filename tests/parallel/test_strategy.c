/* The strategy table: `single` and `data` (cpu*2, f64) stepped through
 * td_strategy_step equal one device trained by hand with
 * td_model_train_step and td_optimizer_step; a checkpoint saved under data
 * loads under single with the same weights; the dispatcher's defaults; an
 * unknown name is refused naming the known ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/checkpoint.h"
#include "tandem/strategy.h"

#define FEATURES 12
#define CLASSES  5
#define BATCH    37 /* prime: no split is even */
#define STEPS    4
#define SEED     5

static const char *model_json =
    "{\"name\": \"strategy_test\", \"input\": {\"shape\": [12]}, \"layers\": ["
    "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"tanh\"},"
    "{\"type\": \"linear\", \"out\": 9}, {\"type\": \"relu\"},"
    "{\"type\": \"dropout\", \"p\": 0.25}, {\"type\": \"linear\", \"out\": 5}]}";

static td_optimizer_config adamw(void) {
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    o.kind = TD_OPT_ADAMW;
    o.lr = 0.01;
    o.weight_decay = 0.01;
    return o;
}

static td_strategy_config config(const char *name) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    c.name = name;
    c.dtype = TD_F64;
    c.seed = SEED;
    c.opt = adamw();
    c.batch = BATCH;
    return c;
}

/* The strategy's weights, through a checkpoint loaded on cpu:0, against
 * ref's. */
static double weights_diff(td_strategy *s, td_model *ref, const char *file) {
    td_model *m = NULL;
    td_device_list *one = td_test_open("cpu:0");
    double d;
    TD_ASSERT_OK(td_strategy_save(s, td_test_tmp(file), NULL));
    TD_ASSERT_OK(td_checkpoint_load_model(td_test_tmp(file), td_device_list_get(one, 0), &m, NULL));
    d = td_dp_weights_diff(m, ref);
    td_model_destroy(m);
    td_device_list_destroy(one);
    return d;
}

static void steps_equal_one_device(const char *name, const char *spec) {
    td_dp_data *d = td_dp_data_create(STEPS, BATCH, FEATURES, CLASSES, 77, 78);
    td_device_list *one = td_test_open("cpu:0");
    td_optimizer_config o = adamw();
    td_step_result ref_last, last;
    td_step_stats stats;
    td_strategy_config c = config(name);
    td_model *ref = td_dp_train_single(model_json, "strategy_test", SEED, &o,
                                       td_device_list_get(one, 0), TD_F64, d, &ref_last);
    td_group *g = NULL;
    td_strategy *s = NULL;
    char file[64], plan[1024];
    double diff;
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, model_json, "strategy_test", &c, &s));
    assert_string_equal(td_strategy_name(s), name);
    printf("%s", td_strategy_plan(s, plan, sizeof plan));
    for (int k = 0; k < STEPS; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->batch[k], (uint64_t)k, &last, &stats));
    assert_int_equal(td_strategy_steps(s), STEPS);
    assert_int_equal(stats.members, td_group_size(g) > 1 && !strcmp(name, "data") ? 2 : 1);
    assert_int_equal(last.count, ref_last.count);
    assert_int_equal(last.correct, ref_last.correct);
    assert_true(fabs(last.loss_sum - ref_last.loss_sum) <= 1e-12 * fabs(ref_last.loss_sum));
    snprintf(file, sizeof file, "%s.safetensors", name);
    diff = weights_diff(s, ref, file);
    printf("%s on %s: weights differ from one device's by %.3g\n", name, spec, diff);
    assert_true(diff <= 1e-12);
    td_strategy_destroy(s);
    td_group_destroy(g);
    td_model_destroy(ref);
    td_device_list_destroy(one);
    td_dp_data_destroy(d);
}

static void single_equals_one_device(void **state) {
    (void)state;
    steps_equal_one_device("single", "cpu*2");
}

static void data_equals_one_device(void **state) {
    (void)state;
    steps_equal_one_device("data", "cpu*2");
}

/* Two steps under data, saved; loaded under single, both strategies take
 * the same two more steps and end with the same weights. */
static void a_checkpoint_moves_from_data_to_single(void **state) {
    td_dp_data *d = td_dp_data_create(STEPS, BATCH, FEATURES, CLASSES, 77, 78);
    td_strategy_config cd = config("data"), cs = config("single");
    td_group *g2 = NULL, *g1 = NULL;
    td_strategy *dp = NULL, *one = NULL;
    td_model *a = NULL, *b = NULL;
    td_device_list *cpu = td_test_open("cpu:0");
    td_train_state ts, back;
    td_step_result r;
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g2));
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_strategy_create(g2, model_json, "strategy_test", &cd, &dp));
    TD_ASSERT_OK(td_strategy_create(g1, model_json, "strategy_test", &cs, &one));
    for (int k = 0; k < 2; k++)
        TD_ASSERT_OK(td_strategy_step(dp, &d->batch[k], (uint64_t)k, &r, NULL));
    memset(&ts, 0, sizeof ts);
    ts.step = 2;
    ts.seed = SEED;
    ts.batch = BATCH;
    ts.opt = adamw();
    TD_ASSERT_OK(td_strategy_save(dp, td_test_tmp("data2.safetensors"), &ts));
    TD_ASSERT_OK(td_strategy_load(one, td_test_tmp("data2.safetensors"), &back));
    assert_int_equal(back.step, 2);
    assert_int_equal(td_strategy_steps(one), 2);
    assert_true(td_strategy_lr(one) == td_strategy_lr(dp));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("single2.safetensors"), &ts));
    TD_ASSERT_OK(td_checkpoint_load_model(td_test_tmp("data2.safetensors"),
                                          td_device_list_get(cpu, 0), &a, NULL));
    TD_ASSERT_OK(td_checkpoint_load_model(td_test_tmp("single2.safetensors"),
                                          td_device_list_get(cpu, 0), &b, NULL));
    assert_true(td_dp_weights_diff(a, b) == 0.0);
    td_model_destroy(a);
    td_model_destroy(b);
    for (int k = 2; k < STEPS; k++) {
        TD_ASSERT_OK(td_strategy_step(dp, &d->batch[k], (uint64_t)k, &r, NULL));
        TD_ASSERT_OK(td_strategy_step(one, &d->batch[k], (uint64_t)k, &r, NULL));
    }
    TD_ASSERT_OK(td_strategy_save(dp, td_test_tmp("data4.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("single4.safetensors"), NULL));
    printf("4 steps, 2 under data then 2 under each: they differ by %.3g\n",
           td_dp_checkpoint_diff(td_test_tmp("data4.safetensors"),
                                 td_test_tmp("single4.safetensors")));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("data4.safetensors"),
                                      td_test_tmp("single4.safetensors")) <= 1e-12);
    td_strategy_destroy(one);
    td_strategy_destroy(dp);
    td_group_destroy(g1);
    td_group_destroy(g2);
    td_device_list_destroy(cpu);
    td_dp_data_destroy(d);
}

/* Evaluation through single and data gives one device's numbers. */
static void evaluation_equals_one_device(void **state) {
    td_dp_data *d = td_dp_data_create(STEPS, BATCH, FEATURES, CLASSES, 77, 78);
    td_strategy_config cd = config("data"), cs = config("single");
    td_group *g = NULL;
    td_strategy *dp = NULL, *one = NULL;
    td_step_result a[STEPS], b[STEPS];
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, model_json, "strategy_test", &cd, &dp));
    TD_ASSERT_OK(td_strategy_create(g, model_json, "strategy_test", &cs, &one));
    TD_ASSERT_OK(td_strategy_evaluate(dp, d->batch, STEPS, a));
    TD_ASSERT_OK(td_strategy_evaluate(one, d->batch, STEPS, b));
    for (int k = 0; k < STEPS; k++) {
        assert_int_equal(a[k].count, b[k].count);
        assert_int_equal(a[k].correct, b[k].correct);
        assert_true(a[k].loss_sum == b[k].loss_sum);
    }
    td_strategy_destroy(one);
    td_strategy_destroy(dp);
    td_group_destroy(g);
    td_dp_data_destroy(d);
}

static void the_dispatcher_checks_and_defaults(void **state) {
    td_strategy_config c = config("diagonal");
    const char *const *names = td_strategy_names();
    td_group *g = NULL, *left = NULL;
    td_strategy *s = NULL, *next = NULL;
    td_model_info info;
    const char *why = NULL;
    int taken = 1;
    (void)state;
    assert_string_equal(names[0], "single");
    assert_string_equal(names[1], "data");
    assert_string_equal(names[2], "pipeline");
    for (int i = 3; names[i]; i++) /* later strategies follow, the list ends with NULL */
        assert_true(i < 16);
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_STATUS(td_strategy_create(g, model_json, "strategy_test", &c, &s),
                     TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("unknown strategy 'diagonal'");
    td_test_assert_message_contains("single, data, pipeline");
    assert_null(s);
    td_strategy_destroy(NULL);
    c.name = NULL; /* single */
    TD_ASSERT_OK(td_strategy_create(g, model_json, "strategy_test", &c, &s));
    assert_string_equal(td_strategy_name(s), "single");
    td_strategy_model_info(s, &info);
    assert_int_equal(info.classes, CLASSES);
    assert_int_equal(info.in_shape[0], FEATURES);
    /* No calibration to make; the survivors of nothing lost are everyone;
     * single cannot carry on without a member. */
    {
        td_dp_data *d = td_dp_data_create(1, BATCH, FEATURES, CLASSES, 77, 78);
        TD_ASSERT_OK(td_strategy_calibrate(s, &d->batch[0]));
        td_dp_data_destroy(d);
    }
    TD_ASSERT_OK(td_strategy_survivors(s, &left));
    assert_int_equal(td_group_size(left), 2);
    TD_ASSERT_STATUS(td_strategy_carry_on(s, left, 0, &next, &taken, &why), TD_ERR_UNSUPPORTED);
    assert_null(next);
    assert_int_equal(taken, 0);
    assert_string_equal(why, "a lost device held state no survivor has");
    td_group_destroy(left);
    td_strategy_destroy(s);
    td_group_destroy(g);
}

/* What the table says of each strategy: summaries, member counts, options;
 * options a strategy lacks are refused naming its own. */
static void the_table_describes_each_strategy(void **state) {
    td_strategy_about a;
    (void)state;
    for (const char *const *n = td_strategy_names(); *n; n++) {
        TD_ASSERT_OK(td_strategy_about_get(*n, &a));
        assert_string_equal(a.name, *n);
        assert_non_null(a.summary);
        assert_true(strlen(a.summary) > 10);
        assert_true(a.min_members >= 1);
    }
    TD_ASSERT_OK(td_strategy_about_get("data", &a));
    assert_true(a.trains);
    assert_string_equal(a.option_name[1], "zero");
    assert_string_equal(a.option_values[1], "0|1");
    TD_ASSERT_OK(td_strategy_about_get("alternate", &a));
    assert_false(a.trains);
    TD_ASSERT_OK(td_strategy_about_get(NULL, &a));
    assert_string_equal(a.name, "single");
    assert_int_equal(a.max_members, 1);
    TD_ASSERT_OK(td_strategy_about_get("tiles", &a));
    assert_false(a.trains);
    assert_string_equal(a.option_name[0], "grid");
    TD_ASSERT_OK(td_strategy_about_get("mirror", &a));
    assert_true(a.trains);
    assert_int_equal(a.min_members, 2);
    TD_ASSERT_STATUS(td_strategy_about_get("diagonal", &a), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("unknown strategy 'diagonal'");
    TD_ASSERT_OK(td_strategy_check_options("data", "zero=1,overlap=off"));
    TD_ASSERT_OK(td_strategy_check_options("pipeline", ""));
    TD_ASSERT_STATUS(td_strategy_check_options("tensor", "zero=1"), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("tensor has no option `zero` (its options: `replicas`)");
    TD_ASSERT_STATUS(td_strategy_check_options("data", "zero=1,,x=2"), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("data has no option ``");
}

/* Losing a member: under tensor and pipeline it held the only copy of
 * parameters (the survivors cannot carry on, and the reason names one);
 * under data the other replica holds everything. */
static void the_survival_rule_follows_the_holdings(void **state) {
    static const char *const names[] = {"tensor", "pipeline", "data"};
    td_dp_data *d = td_dp_data_create(1, BATCH, FEATURES, CLASSES, 77, 78);
    (void)state;
    for (int i = 0; i < 3; i++) {
        td_strategy_config c = config(names[i]);
        td_group *g = NULL, *left = NULL;
        td_strategy *s = NULL, *next = NULL;
        td_step_result r;
        const char *why = NULL;
        int taken = 1, lost = 1;
        TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
        TD_ASSERT_OK(td_strategy_create(g, model_json, "strategy_test", &c, &s));
        TD_ASSERT_OK(td_strategy_step(s, &d->batch[0], 0, &r, NULL));
        TD_ASSERT_OK(td_group_shrink(g, &lost, 1, &left));
        if (i < 2) {
            TD_ASSERT_STATUS(td_strategy_carry_on(s, left, 1, &next, &taken, &why),
                             TD_ERR_UNSUPPORTED);
            assert_null(next);
            assert_non_null(why);
            if (!strstr(why, "a lost device held the only copy of its part of layers."))
                fail_msg("%s: %s", names[i], why);
        } else {
            TD_ASSERT_OK(td_strategy_carry_on(s, left, 0, &next, &taken, &why));
            assert_non_null(next);
            assert_true(taken); /* its one step was taken: 0 steps before it */
        }
        td_strategy_destroy(next);
        td_strategy_destroy(s);
        td_group_destroy(left);
        td_group_destroy(g);
    }
    td_dp_data_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(single_equals_one_device),
        cmocka_unit_test(data_equals_one_device),
        cmocka_unit_test(a_checkpoint_moves_from_data_to_single),
        cmocka_unit_test(evaluation_equals_one_device),
        cmocka_unit_test(the_dispatcher_checks_and_defaults),
        cmocka_unit_test(the_table_describes_each_strategy),
        cmocka_unit_test(the_survival_rule_follows_the_holdings),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
