/* The mirror strategy: every member computes the same step, so its weights
 * are one device's (f64 1e-12 and f32 1e-5; in fact bitwise) on cpu*2, cpu*3
 * and a slowed pair; every bit flip TANDEM_FAULT injects (in a gradient,
 * the input activations or a weight) is caught in the step it strikes and
 * names the right device: with three members the majority drops it and the
 * survivors end with one device's weights, with two a passing flip is
 * computed again and a lasting one stops the run naming both; one device
 * and bad fault items are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/strategy.h"

#define SEED 5

static void mirror_trains_as_one_device(void **state) {
    (void)state;
    td_strategy_check_equals_one_device("mirror", "cpu*2", "mirror_2");
    td_strategy_check_equals_one_device("mirror", "cpu*3", "mirror_3");
    td_strategy_check_equals_one_device("mirror", "cpu:0,cpu:1{slowdown=3}", "mirror_slowed");
}

static td_strategy_config config(char *json, size_t n) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    td_dp_check_model("mirror_flip", json, n);
    c.name = "mirror";
    c.dtype = TD_F64;
    c.seed = SEED;
    c.batch = TD_DP_CHECK_BATCH;
    c.options = "check_weights=2";
    c.opt.kind = TD_OPT_SGD;
    c.opt.lr = 0.1;
    c.opt.momentum = 0.9;
    return c;
}

/* One device's weights after the check's steps, on a device of *one
 * (destroyed after the model). */
static td_model *reference(const char *json, const td_strategy_config *c, const td_dp_data *d,
                           td_device_list **one) {
    td_step_result last;
    TD_ASSERT_OK(td_devices_open("cpu:0", one));
    return td_dp_train_single(json, "mirror_flip", SEED, &c->opt, td_device_list_get(*one, 0),
                              TD_F64, d, &last);
}

/* The strategy over the survivors, as the trainer carries on after a loss:
 * the odd member left out, the step taken again. *g becomes the survivors'
 * group; the first group, which owns the devices, stays for the caller. */
static td_strategy *carry_on(td_strategy *s, td_group **g, td_group *first, const char *odd) {
    td_group *survivors = NULL;
    td_strategy *next = NULL;
    const char *why = NULL;
    int taken = 1;
    TD_ASSERT_OK(td_strategy_survivors(s, &survivors));
    assert_int_equal(td_group_size(survivors), td_group_size(*g) - 1);
    for (int r = 0; r < td_group_size(survivors); r++)
        assert_string_not_equal(td_device_name(td_group_device(survivors, r)), odd);
    TD_ASSERT_OK(td_strategy_carry_on(s, survivors, td_strategy_steps(s), &next, &taken, &why));
    assert_int_equal(taken, 0);
    td_strategy_destroy(s);
    if (*g != first)
        td_group_destroy(*g);
    *g = survivors;
    return next;
}

/* Runs the check's steps on `spec` with the fault item `fault` ("cpu:1@grad:3")
 * that strikes `device` at step 3; checks what was caught and named. */
/* The same under `strategy` (mirror, or a mesh data:R,mirror:M whose groups
 * have `per` members each). */
static void a_flip_is_caught_in(const char *strategy, int per, const char *spec, const char *fault,
                                const char *device, const char *options) {
    td_dp_data *d = td_dp_check_data();
    td_group_config gc = TD_GROUP_CONFIG_INIT;
    td_strategy_report words;
    td_run_figures f = {0};
    td_group *g = NULL, *first = NULL;
    td_strategy *s = NULL;
    char json[512];
    td_strategy_config c = config(json, sizeof json);
    td_device_list *one = NULL;
    c.options = options;
    c.name = strategy;
    td_model *ref = reference(json, &c, d, &one);
    int members, lasting = strstr(fault, "@weight") != NULL, stopped = 0;
    gc.fault = fault;
    TD_ASSERT_OK(td_group_create_spec(spec, &gc, &g));
    first = g;
    members = per ? per : td_group_size(g);
    TD_ASSERT_OK(td_strategy_create(g, json, "mirror_flip", &c, &s));
    for (int k = 0; k < TD_DP_CHECK_STEPS && !stopped; k++) {
        td_step_result res;
        td_status st = td_strategy_step(s, &d->batch[k], (uint64_t)k, &res, NULL);
        if (k != 2) {
            TD_ASSERT_OK(st);
            continue;
        }
        printf("%s on %s, step 3: %s: %s\n", fault, spec, td_status_name(st), td_last_error());
        if (members >= 3) { /* the majority names it; it is dropped, the step taken again */
            assert_int_equal(st, TD_ERR_DEVICE_LOST);
            assert_non_null(strstr(td_last_error(), device));
            s = carry_on(s, &g, first, device);
            TD_ASSERT_OK(td_strategy_step(s, &d->batch[k], (uint64_t)k, &res, NULL));
        } else if (lasting) { /* both stay as they are: the run stops naming both */
            assert_int_equal(st, TD_ERR_DEVICE);
            assert_non_null(strstr(td_last_error(), "cpu:0"));
            assert_non_null(strstr(td_last_error(), "cpu:1"));
            assert_true(td_strategy_steps(s) == 2); /* nobody updated */
            stopped = 1;
        } else { /* computed again, the member whose result changed is named */
            TD_ASSERT_OK(st);
            td_strategy_report_make(s, &f, &words);
            printf("%s\n", words.note);
            assert_non_null(strstr(words.note, "step 3: "));
            assert_non_null(strstr(words.note, device));
            assert_non_null(strstr(words.note, "recomputed"));
        }
    }
    if (!stopped) {
        double diff = td_strategy_weights_diff(s, ref);
        printf("  weights differ from one device by %g\n", diff);
        assert_true(diff <= 1e-12);
    }
    td_strategy_destroy(s);
    if (g != first)
        td_group_destroy(g);
    td_group_destroy(first);
    td_model_destroy(ref);
    td_device_list_destroy(one);
    td_dp_data_destroy(d);
}

static void a_flip_is_caught_with(const char *spec, const char *fault, const char *device,
                                  const char *options) {
    a_flip_is_caught_in("mirror", 0, spec, fault, device, options);
}

static void a_flip_is_caught(const char *spec, const char *fault, const char *device) {
    a_flip_is_caught_with(spec, fault, device, "check_weights=2");
}

static void every_flip_is_caught_among_three(void **state) {
    (void)state;
    a_flip_is_caught("cpu*3", "cpu:1@grad:3", "cpu:1");
    a_flip_is_caught("cpu*3", "cpu:2@act:3", "cpu:2");
    a_flip_is_caught("cpu*3", "cpu:0@weight:3", "cpu:0");
}

static void every_flip_is_caught_between_two(void **state) {
    (void)state;
    a_flip_is_caught("cpu*2", "cpu:1@grad:3", "cpu:1");
    a_flip_is_caught("cpu:0,cpu:1{slowdown=3}", "cpu:0@act:3", "cpu:0");
    a_flip_is_caught("cpu*2", "cpu:1@weight:3:flip", "cpu:1");
    /* compared within the tolerance (1e-9 of a tensor's magnitude in f64) */
    a_flip_is_caught_with("cpu*2", "cpu:0@grad:3", "cpu:0", "deterministic=0");
    a_flip_is_caught_with("cpu*3", "cpu:2@act:3", "cpu:2", "deterministic=0");
}

/* data:R,mirror:M: R groups of M mirrored devices, each group its rows of
 * a batch, gradients summed across the groups: one device's weights; a
 * flip is settled within its group (computed again between two, the odd
 * one dropped among three, the survivors carrying on as one mirror). */
static void mirror_composes_with_data(void **state) {
    (void)state;
    td_strategy_check_equals_one_device("data:2,mirror:2", "cpu*4", "mirror_mesh");
    a_flip_is_caught_in("data:2,mirror:2", 2, "cpu*4", "cpu:3@grad:3", "cpu:3", NULL);
    a_flip_is_caught_in("data:2,mirror:3", 3, "cpu*6", "cpu:4@act:3", "cpu:4", NULL);
}

static void bad_input_is_refused(void **state) {
    td_group_config gc = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    td_strategy *s = NULL;
    char json[512];
    td_strategy_config c = config(json, sizeof json);
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g));
    TD_ASSERT_STATUS(td_strategy_create(g, json, "mirror_flip", &c, &s), TD_ERR_INVALID_ARG);
    printf("one device: %s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "at least 2 devices"));
    td_group_destroy(g);
    gc.fault = "cpu:1@grad:0";
    TD_ASSERT_STATUS(td_group_create_spec("cpu*2", &gc, &g), TD_ERR_PARSE);
    assert_non_null(strstr(td_last_error(), "steps count from 1, so a count of 0"));
    gc.fault = "cpu:1@weight:2:hang";
    TD_ASSERT_STATUS(td_group_create_spec("cpu*2", &gc, &g), TD_ERR_PARSE);
    printf("a flip that hangs: %s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "grad|act|weight"));
    gc.fault = "cpu:5@act:2";
    TD_ASSERT_STATUS(td_group_create_spec("cpu*2", &gc, &g), TD_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mirror_trains_as_one_device),
        cmocka_unit_test(every_flip_is_caught_among_three),
        cmocka_unit_test(every_flip_is_caught_between_two),
        cmocka_unit_test(mirror_composes_with_data),
        cmocka_unit_test(bad_input_is_refused),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
