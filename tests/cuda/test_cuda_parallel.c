/* The `data` strategy over CUDA devices: two logical GPUs on one
 * (cuda:0{split=2}) and a mixed group (cpu:0 with cuda:0) train like one CPU
 * device on the same global batches, within the data-parallel tolerances
 * (f64 1e-12, f32 1e-5). The check is shared with OpenCL:
 * tests/support/dp_check.c. Skipped without a CUDA device. */
#include "support/dp_check.h"
#include "support/support.h"

static void logical_gpus_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("cuda:0{split=2}", "dp_cuda");
}

static void cpu_and_cuda_train_like_one_device(void **state) {
    td_dp_check_equals_one_device("cpu:0,cuda:0", "dp_cuda");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(logical_gpus_train_like_one_device),
        cmocka_unit_test(cpu_and_cuda_train_like_one_device),
    };
    td_test_require_devices("cuda:0", "CUDA device");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
