/* The balancer: splits that add up, follow speed, respect the minimum,
 * match a brute-force search over every split when devices have fixed
 * costs, park a device that would only slow the step, and converge to the
 * ideal step time on simulated unequal devices. */
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
            /* Within one sample of the exact proportion (each is above the
             * 2% minimum, which therefore does not bind). */
            double exact = (double)total * speeds[i] / 1000.0;
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

/* The slowest device's time for a split under the model fixed + per * n
 * (devices with no samples take no time). */
static double step_time(const double *fixed, const double *per, const int64_t *c, int n) {
    double t = 0;
    for (int i = 0; i < n; i++)
        if (c[i] > 0)
            t = fmax(t, fixed[i] + per[i] * (double)c[i]);
    return t;
}

/* Against every split of the batch: the balancer's is as good as the best
 * to within one sample's time on the slowest device. */
static void fixed_costs_split_as_well_as_a_search_of_every_split(void **state) {
    td_balancer_config cfg = TD_BALANCER_CONFIG_INIT;
    static const double cases[][2][3] = {
        {{1e-3, 1e-3, 1e-3}, {1e-5, 2e-5, 4e-5}},
        {{0, 2e-3, 8e-3}, {3e-5, 1e-5, 5e-6}},
        {{4e-3, 0, 1e-4}, {1e-6, 1e-5, 3e-5}},
    };
    cfg.min_share = 0;
    cfg.park = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const double *fixed = cases[k][0], *per = cases[k][1];
        td_balancer *b = NULL;
        TD_ASSERT_OK(td_balancer_create(3, NULL, &cfg, &b));
        TD_ASSERT_OK(td_balancer_set_costs(b, fixed, per));
        for (int64_t total = 1; total <= 200; total += 13) {
            int64_t c[3], t[3];
            double best = INFINITY, got, slack = 0;
            td_balancer_split(b, total, c);
            assert_int_equal(c[0] + c[1] + c[2], total);
            for (t[0] = 0; t[0] <= total; t[0]++)
                for (t[1] = 0; t[0] + t[1] <= total; t[1]++) {
                    t[2] = total - t[0] - t[1];
                    best = fmin(best, step_time(fixed, per, t, 3));
                }
            for (int i = 0; i < 3; i++)
                slack = fmax(slack, per[i]);
            got = step_time(fixed, per, c, 3);
            if (got > best + slack + 1e-12)
                fail_msg("case %zu, %lld samples: split %lld/%lld/%lld takes %.6g s, best %.6g s",
                         k, (long long)total, (long long)c[0], (long long)c[1], (long long)c[2],
                         got, best);
        }
        td_balancer_destroy(b);
    }
}

/* A device whose fixed cost alone exceeds what the others need for the
 * whole batch (a PoCL device's few milliseconds per pass beside a CPU's
 * sub-millisecond step) is parked; it comes back when the others slow down
 * enough that it shortens the step by more than 10%. */
static void a_device_with_a_large_fixed_cost_is_parked_until_it_helps(void **state) {
    static const char *const names[2] = {"cpu:0", "opencl:0.0"};
    const double fixed[2] = {1e-4, 4e-3}, per[2] = {5e-6, 1e-5};
    td_balancer *b = make(2, names);
    int64_t c[2];
    double sec[2];
    TD_ASSERT_OK(td_balancer_set_costs(b, fixed, per));
    td_balancer_split(b, 128, c);
    assert_int_equal(c[0], 128);
    assert_int_equal(c[1], 0);
    assert_true(td_balancer_parked(b, 1));
    assert_false(td_balancer_parked(b, 0));
    assert_true(td_balancer_share(b, 1) == 0.0);
    assert_true(fabs(td_balancer_ideal_seconds(b, 128) - (1e-4 + 128 * 5e-6)) < 1e-12);
    /* cpu:0 becomes 20x slower (its step 14.8 ms): opencl:0.0 helps again. */
    for (int s = 0; s < 30 && td_balancer_parked(b, 1); s++) {
        td_balancer_split(b, 128, c);
        sec[0] = 20 * (fixed[0] + per[0] * (double)c[0]);
        sec[1] = c[1] ? fixed[1] + per[1] * (double)c[1] : 0;
        td_balancer_observe(b, c, sec, NULL, 0);
        td_balancer_split(b, 128, c);
    }
    assert_false(td_balancer_parked(b, 1));
    assert_true(c[1] > 0 && c[0] > 0);
    td_balancer_destroy(b);
}

/* Runs steps with the given true costs; returns the first step at which
 * device 1 got samples (-1: none within `steps`). */
static int run_until_tried(td_balancer *b, const double *fixed, const double *per, int steps) {
    for (int s = 0; s < steps; s++) {
        int64_t c[2];
        double sec[2];
        td_balancer_split(b, 128, c);
        for (int i = 0; i < 2; i++)
            sec[i] = c[i] ? fixed[i] + per[i] * (double)c[i] : 0;
        td_balancer_observe(b, c, sec, NULL, 0);
        if (c[1] > 0)
            return s;
    }
    return -1;
}

/* A calibration that was noise (device 1 measured with a 50 ms fixed cost,
 * truly as fast as device 0) parks it; it is tried again after 16 steps,
 * measured, and stays with a fair share. A device that really is that slow
 * is tried after 16 steps, then 32, then 64: trying costs little. */
static void a_parked_device_is_tried_again(void **state) {
    const double believed[2] = {1e-4, 5e-2}, truth[2] = {1e-4, 1e-4}, per[2] = {1e-5, 1e-5};
    td_balancer *b = make(2, NULL);
    int64_t c[2];
    int t1, t2, t3;
    TD_ASSERT_OK(td_balancer_set_costs(b, believed, per));
    td_balancer_split(b, 128, c);
    assert_true(td_balancer_parked(b, 1));
    t1 = run_until_tried(b, truth, per, 100);
    assert_true(t1 >= 14 && t1 <= 17);
    for (int s = 0; s < 20; s++)
        assert_true(run_until_tried(b, truth, per, 1) == 0); /* in every step now */
    td_balancer_split(b, 128, c);
    assert_false(td_balancer_parked(b, 1));
    if (c[1] < 128 / 4)
        fail_msg("device 1 gets %lld of 128 after coming back", (long long)c[1]);
    td_balancer_destroy(b);

    b = make(2, NULL);
    TD_ASSERT_OK(td_balancer_set_costs(b, believed, per));
    t1 = run_until_tried(b, believed, per, 200);
    t2 = run_until_tried(b, believed, per, 200);
    t3 = run_until_tried(b, believed, per, 200);
    if (!(t1 > 0 && t2 > t1 && t3 > t2))
        fail_msg("tries after %d, %d, %d steps: they should back off", t1, t2, t3);
    td_balancer_destroy(b);
}

/* With parking off, such a device gets no samples but stays in. */
static void without_parking_a_costly_device_gets_nothing(void **state) {
    td_balancer_config cfg = TD_BALANCER_CONFIG_INIT;
    const double fixed[2] = {1e-4, 4e-3}, per[2] = {5e-6, 1e-5};
    td_balancer *b = NULL;
    int64_t c[2];
    cfg.park = 0;
    TD_ASSERT_OK(td_balancer_create(2, NULL, &cfg, &b));
    TD_ASSERT_OK(td_balancer_set_costs(b, fixed, per));
    td_balancer_split(b, 128, c);
    assert_int_equal(c[0], 128);
    assert_int_equal(c[1], 0);
    assert_false(td_balancer_parked(b, 1));
    td_balancer_destroy(b);
}

/* One step of 256 samples where device i takes tps[i] seconds per sample;
 * c gets the split the step ran. */
static void timed_step(td_balancer *b, const double tps[2], int64_t c[2]) {
    double sec[2];
    td_balancer_split(b, 256, c);
    for (int i = 0; i < 2; i++)
        sec[i] = tps[i] * (double)c[i];
    td_balancer_observe(b, c, sec, NULL, 0);
}

/* One step stretched 5x (a page fault, another process) leaves the split
 * where it was; the same slowdown three steps running moves it. */
static void one_slow_step_does_not_move_the_split(void **state) {
    static const double even[2] = {1e-3, 1e-3}, slow[2] = {1e-3, 5e-3};
    td_balancer *b = make(2, NULL);
    int64_t c[2], before[2];
    for (int s = 0; s < 8; s++)
        timed_step(b, even, c);
    timed_step(b, slow, before);
    td_balancer_split(b, 256, c);
    assert_int_equal(c[0], before[0]);
    for (int s = 0; s < 3; s++)
        timed_step(b, slow, c);
    td_balancer_split(b, 256, c);
    assert_true(c[1] < before[1] - 20);
    td_balancer_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_add_up_and_follow_speed),
        cmocka_unit_test(the_minimum_share_holds_for_a_very_slow_device),
        cmocka_unit_test(bad_configs_and_speeds_are_refused),
        cmocka_unit_test(observed_steps_converge_to_the_ideal),
        cmocka_unit_test(a_device_that_slows_down_is_named),
        cmocka_unit_test(fixed_costs_split_as_well_as_a_search_of_every_split),
        cmocka_unit_test(a_device_with_a_large_fixed_cost_is_parked_until_it_helps),
        cmocka_unit_test(without_parking_a_costly_device_gets_nothing),
        cmocka_unit_test(one_slow_step_does_not_move_the_split),
        cmocka_unit_test(a_parked_device_is_tried_again),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
