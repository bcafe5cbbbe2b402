/* The balancer: splits that add up, follow speed, respect the minimum, and
 * converge to the ideal step time on simulated unequal devices. */
#include <math.h>
#include <string.h>

#include "support/support.h"
#include "tandem/parallel.h"

static td_balancer *make(int n, const char *const *names) {
    td_balancer *b = NULL;
    TD_ASSERT_OK(td_balancer_create(n, names, NULL, &b));
    return b;
}

static void splits_add_up_and_follow_speed(void **state) {
    td_balancer *b = make(3, NULL);
    double speeds[3] = {100, 300, 600};
    int64_t c[3];
    td_balancer_split(b, 100, c);
    /* Equal shares at first: 34, 33, 33 (the leftover to the lowest index). */
    assert_int_equal(c[0], 34);
    assert_int_equal(c[1], 33);
    assert_int_equal(c[2], 33);
    TD_ASSERT_OK(td_balancer_set_speeds(b, speeds));
    assert_true(fabs(td_balancer_share(b, 2) - 0.6) < 1e-12);
    for (int64_t total = 0; total < 500; total += 7) {
        td_balancer_split(b, total, c);
        assert_int_equal(c[0] + c[1] + c[2], total);
        for (int i = 0; i < 3; i++) {
            /* Within one sample of the exact proportion, after the minimums. */
            int64_t fm = (int64_t)ceil(0.02 * (double)total);
            int use_min = fm * 3 <= total && fm > 0;
            double rest = (double)(use_min ? total - 3 * fm : total);
            double exact = rest * speeds[i] / 1000.0 + (use_min ? (double)fm : 0);
            assert_true(fabs((double)c[i] - exact) < 1.0 + 1e-9);
        }
    }
    td_balancer_destroy(b);
}

static void the_minimum_share_holds_for_a_very_slow_device(void **state) {
    td_balancer *b = make(2, NULL);
    double speeds[2] = {1, 10000};
    int64_t c[2];
    TD_ASSERT_OK(td_balancer_set_speeds(b, speeds));
    td_balancer_split(b, 1000, c);
    assert_true(c[0] >= 20); /* 2% of 1000 */
    assert_int_equal(c[0] + c[1], 1000);
    td_balancer_split(b, 1, c);
    assert_int_equal(c[0] + c[1], 1);
    td_balancer_destroy(b);
}

static void bad_configs_and_speeds_are_refused(void **state) {
    td_balancer *b = NULL;
    td_balancer_config cfg = TD_BALANCER_CONFIG_INIT;
    double bad[2] = {1, NAN};
    TD_ASSERT_STATUS(td_balancer_create(0, NULL, NULL, &b), TD_ERR_INVALID_ARG);
    cfg.min_share = 0.6;
    TD_ASSERT_STATUS(td_balancer_create(2, NULL, &cfg, &b), TD_ERR_INVALID_ARG);
    b = make(2, NULL);
    TD_ASSERT_STATUS(td_balancer_set_speeds(b, bad), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("device 1");
    td_balancer_destroy(b);
}

/* Devices whose true speeds are 1000 and 333 samples/s (one slowed 3x): from
 * equal shares, a few observed steps bring the step time within 10% of the
 * ideal, total / (sum of speeds). */
static void observed_steps_converge_to_the_ideal(void **state) {
    static const char *const names[2] = {"cpu:0", "cpu:1"};
    const double truth[2] = {1000, 1000.0 / 3};
    const int64_t batch = 256;
    td_balancer *b = make(2, names);
    double ideal = batch / (truth[0] + truth[1]), step = 0;
    for (int s = 0; s < 12; s++) {
        int64_t c[2];
        double sec[2];
        td_balancer_split(b, batch, c);
        for (int i = 0; i < 2; i++)
            sec[i] = (double)c[i] / truth[i];
        step = fmax(sec[0], sec[1]);
        td_balancer_observe(b, c, sec, NULL, 0);
    }
    if (step > 1.10 * ideal)
        fail_msg("step %.4f s, ideal %.4f s", step, ideal);
    assert_true(fabs(td_balancer_share(b, 0) - 0.75) < 0.02);
    td_balancer_destroy(b);
}

static void a_device_that_slows_down_is_named(void **state) {
    static const char *const names[2] = {"cpu:0", "cpu:1"};
    td_balancer *b = make(2, names);
    char report[512];
    int64_t c[2] = {64, 64};
    double sec[2] = {0.064, 0.064};
    for (int s = 0; s < 5; s++)
        assert_int_equal(td_balancer_observe(b, c, sec, report, sizeof report), 0);
    sec[1] = 0.064 * 2.5;
    /* One slow step is noise; the third in a row is a straggler, named once. */
    assert_int_equal(td_balancer_observe(b, c, sec, report, sizeof report), 0);
    assert_int_equal(td_balancer_observe(b, c, sec, report, sizeof report), 0);
    assert_int_equal(td_balancer_observe(b, c, sec, report, sizeof report), 1);
    assert_non_null(strstr(report, "cpu:1 is a straggler"));
    assert_non_null(strstr(report, "x its average"));
    assert_null(strstr(report, "cpu:0"));
    assert_int_equal(td_balancer_observe(b, c, sec, report, sizeof report), 0);
    td_balancer_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_add_up_and_follow_speed),
        cmocka_unit_test(the_minimum_share_holds_for_a_very_slow_device),
        cmocka_unit_test(bad_configs_and_speeds_are_refused),
        cmocka_unit_test(observed_steps_converge_to_the_ideal),
        cmocka_unit_test(a_device_that_slows_down_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
