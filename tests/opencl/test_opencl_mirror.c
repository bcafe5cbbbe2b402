/* The mirror strategy over OpenCL devices: beside a CPU device (two kinds:
 * digests compared within the tolerance, 1e-9 of a block's magnitude in
 * f64, 1e-3 in f32) and over two PoCL sub-devices (one kind: bitwise), it
 * trains like one CPU device with no false alarm, and a gradient flipped
 * on the OpenCL device is caught and named. */
#include <stdio.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/strategy.h"

static void cpu_and_opencl_agree_within_the_tolerance(void **state) {
    (void)state;
    td_strategy_check_equals_one_device("mirror", "cpu:0,opencl:0.0", "mirror_ocl");
}

static void sub_devices_agree_bitwise(void **state) {
    (void)state;
    td_strategy_check_equals_one_device("mirror", "opencl:0.0{split=2}", "mirror_ocl_split");
}

static void a_flip_on_the_opencl_device_is_named(void **state) {
    td_dp_data *d = td_dp_check_data();
    td_group_config gc = TD_GROUP_CONFIG_INIT;
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    td_strategy_report words;
    td_run_figures f = {0};
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_step_result res;
    char json[512];
    (void)state;
    td_dp_check_model("mirror_ocl_flip", json, sizeof json);
    c.name = "mirror";
    c.batch = TD_DP_CHECK_BATCH;
    gc.fault = "opencl:0.0@grad:2";
    TD_ASSERT_OK(td_group_create_spec("cpu:0,opencl:0.0", &gc, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "mirror_ocl_flip", &c, &s));
    for (int k = 0; k < TD_DP_CHECK_STEPS; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->batch[k], (uint64_t)k, &res, NULL));
    td_strategy_report_make(s, &f, &words);
    printf("%s\n", words.note);
    assert_non_null(strstr(words.note, "within a tolerance"));
    assert_non_null(strstr(words.note, "step 2: opencl:0.0 (the gradient of"));
    td_strategy_destroy(s);
    td_group_destroy(g);
    td_dp_data_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cpu_and_opencl_agree_within_the_tolerance),
        cmocka_unit_test(sub_devices_agree_bitwise),
        cmocka_unit_test(a_flip_on_the_opencl_device_is_named),
    };
    td_test_require_devices("opencl:0.0", "OpenCL device");
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
