/* On a machine without a GPU, CUDA specs fail clearly and `auto` falls back
 * to the CPU. On a machine with one, this test does not apply and says so. */
#include "support/support.h"

static void without_a_gpu_cuda_specs_fail_clearly(void **state) {
    td_device_list *list = NULL;
    td_status st = td_devices_open("cuda:0", &list);
    assert_int_equal(st, TD_ERR_NO_DEVICE);
    td_test_assert_message_contains("cuda:0");
    td_test_assert_message_contains("Devices here:");
    /* "auto" falls back to the CPU rather than failing. */
    list = td_test_open("auto");
    assert_string_equal(td_device_name(td_device_list_get(list, 0)), "cpu");
    td_device_list_destroy(list);
}

int main(void) {
    td_device_list *list = NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(without_a_gpu_cuda_specs_fail_clearly),
    };
    if (td_devices_open("cuda:0", &list) == TD_OK) {
        td_device_list_destroy(list);
        td_test_skip("a CUDA device is present; this test is for machines without one");
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
