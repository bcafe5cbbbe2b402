/* The `data` strategy over OpenCL devices: PoCL sub-devices
 * (opencl:0.0{split=2}) and a mixed group (cpu:0 with opencl:0.0) train like
 * one CPU device on the same global batches, within the data-parallel
 * tolerances (f64 1e-12, f32 1e-5; the check is shared with CUDA:
 * tests/support/dp_check.c); so do `pipeline` and `tensor` over the
 * sub-devices, where no peer copy exists and a stage's messages go through
 * host memory; and `spatial` over a CPU and an OpenCL device. An OpenCL member that is lost stops
 * the step with a status naming it, and the survivors train on. */
#include <stdio.h>

#include "support/dp_check.h"
#include "support/model_data.h"
#include "support/support.h"
#include "tandem/comm.h"
#include "tandem/parallel.h"

static void sub_devices_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("opencl:0.0{split=2}", "dp_ocl");
}

static void cpu_and_opencl_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("cpu:0,opencl:0.0", "dp_ocl");
}

static void pipeline_over_sub_devices_trains_like_one_device(void **state) {
    td_strategy_check_equals_one_device("pipeline", "opencl:0.0{split=2}", "pp_ocl");
}

static void tensor_over_sub_devices_trains_like_one_device(void **state) {
    td_strategy_check_equals_one_device("tensor", "opencl:0.0{split=2}", "tp_ocl");
}

/* opencl:0.0 fails at its third all-reduce (injected: TANDEM_FAULT syntax),
 * in the first training step: the step returns TD_ERR_DEVICE_LOST naming
 * it; the group shrinks to cpu:0, which trains on from its own replica. */
static void a_lost_opencl_member_is_named_and_the_survivor_trains_on(void **state) {
    td_dp_data *d = td_dp_check_data();
    td_group *g = NULL, *alive = NULL;
    td_group_config gc = TD_GROUP_CONFIG_INIT;
    td_dp *dp = NULL, *dp2 = NULL;
    td_dp_config cfg = TD_DP_CONFIG_INIT;
    td_optimizer_config o = td_dp_check_adamw();
    td_step_result res;
    char model_json[512];
    td_dp_check_model("dp_ocl", model_json, sizeof model_json);
    gc.fault = "opencl:0.0@allreduce:3:error";
    cfg.balancer.park = 0; /* both members take part in the step */
    cfg.rebalance = 0;
    TD_ASSERT_OK(td_group_create_spec("cpu:0,opencl:0.0", &gc, &g));
    TD_ASSERT_OK(td_dp_create(g, model_json, "dp_ocl", TD_F32, 3, &o, &cfg, &dp));
    TD_ASSERT_STATUS(td_dp_step(dp, &d->batch[0], 0, &res, NULL), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("opencl:0.0");
    td_dp_destroy(dp);
    TD_ASSERT_OK(td_group_shrink(g, NULL, 0, &alive));
    assert_int_equal(td_group_size(alive), 1);
    TD_ASSERT_OK(td_dp_create(alive, model_json, "dp_ocl", TD_F32, 3, &o, &cfg, &dp2));
    for (int s = 0; s < TD_DP_CHECK_STEPS; s++)
        TD_ASSERT_OK(td_dp_step(dp2, &d->batch[s], (uint64_t)s, &res, NULL));
    assert_int_equal(res.count, TD_DP_CHECK_BATCH);
    td_dp_destroy(dp2);
    td_group_destroy(alive);
    td_group_destroy(g);
    td_dp_data_destroy(d);
}

/* `spatial` over a CPU device and an OpenCL device: a small conv net's
 * bands on both, its halos through host memory, like one CPU device (f64
 * 1e-12, f32 1e-5). */
static void spatial_over_cpu_and_opencl_trains_like_one_device(void **state) {
    static const char *cnn =
        "{\"input\": {\"shape\": [2, 32, 12]}, \"layers\": ["
        "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1},"
        "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 2},"
        "{\"type\": \"conv2d\", \"out\": 3, \"kernel\": 5, \"stride\": 2, \"padding\": 2},"
        "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 5}]}";
    td_test_data *d = td_test_data_create(cnn, 3, 2);
    (void)state;
    for (int f64 = 1; f64 >= 0; f64--) {
        td_strategy *s[2] = {NULL, NULL};
        td_group *g[2] = {NULL, NULL};
        const char *spec[2] = {"cpu:0", "cpu:0,opencl:0.0"}, *name[2] = {"single", "spatial"};
        char path[2][64];
        td_step_result r;
        double diff;
        for (int k = 0; k < 2; k++) {
            td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
            c.name = name[k];
            c.dtype = f64 ? TD_F64 : TD_F32;
            c.seed = 3;
            c.opt.lr = 0.1;
            c.batch = 2;
            TD_ASSERT_OK(td_group_create_spec(spec[k], NULL, &g[k]));
            TD_ASSERT_OK(td_strategy_create(g[k], cnn, "sp_ocl", &c, &s[k]));
            for (int i = 0; i < d->steps; i++)
                TD_ASSERT_OK(td_strategy_step(s[k], &d->b[i], (uint64_t)i, &r, NULL));
            snprintf(path[k], sizeof path[k], "sp_ocl_%d.safetensors", k);
            TD_ASSERT_OK(td_strategy_save(s[k], td_test_tmp(path[k]), NULL));
        }
        diff = td_dp_checkpoint_diff(td_test_tmp(path[0]), td_test_tmp(path[1]));
        printf("spatial on cpu:0,opencl:0.0 (%s): weights differ by %.3g\n", f64 ? "f64" : "f32",
               diff);
        assert_true(diff <= (f64 ? 1e-12 : 1e-5));
        for (int k = 0; k < 2; k++) {
            td_strategy_destroy(s[k]);
            td_group_destroy(g[k]);
        }
    }
    td_test_data_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sub_devices_train_like_one_device),
        cmocka_unit_test(cpu_and_opencl_train_like_one_device),
        cmocka_unit_test(pipeline_over_sub_devices_trains_like_one_device),
        cmocka_unit_test(tensor_over_sub_devices_trains_like_one_device),
        cmocka_unit_test(spatial_over_cpu_and_opencl_trains_like_one_device),
        cmocka_unit_test(a_lost_opencl_member_is_named_and_the_survivor_trains_on),
    };
    td_test_require_devices("opencl:0.0", "OpenCL device");
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
