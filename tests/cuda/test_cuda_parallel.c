/* The `data`, `pipeline` and `tensor` strategies over CUDA devices: two
 * logical GPUs on one (cuda:0{split=2}) and a mixed group (cpu:0 with
 * cuda:0, whose pipeline messages go through host memory) train like one
 * CPU device on the same global batches (f64 1e-12, f32 1e-5). The checks
 * are shared with OpenCL: tests/support/dp_check.c. Skipped without a CUDA
 * device. */
#include "support/dp_check.h"
#include "support/support.h"

static void logical_gpus_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("cuda:0{split=2}", "dp_cuda");
}

static void cpu_and_cuda_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("cpu:0,cuda:0", "dp_cuda");
}

static void pipeline_over_logical_gpus_trains_like_one_device(void **state) {
    td_strategy_check_equals_one_device("pipeline", "cuda:0{split=2}", "pp_cuda");
}

static void pipeline_over_cpu_and_cuda_trains_like_one_device(void **state) {
    td_strategy_check_equals_one_device("pipeline", "cpu:0,cuda:0", "pp_cuda");
}

static void tensor_over_logical_gpus_trains_like_one_device(void **state) {
    td_strategy_check_equals_one_device("tensor", "cuda:0{split=2}", "tp_cuda");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(logical_gpus_train_like_one_device),
        cmocka_unit_test(cpu_and_cuda_train_like_one_device),
        cmocka_unit_test(pipeline_over_logical_gpus_trains_like_one_device),
        cmocka_unit_test(pipeline_over_cpu_and_cuda_trains_like_one_device),
        cmocka_unit_test(tensor_over_logical_gpus_trains_like_one_device),
    };
    td_test_require_devices("cuda:0", "CUDA device");
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
