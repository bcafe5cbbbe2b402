/* The CUDA backend on a real GPU: memory, copies with the CPU, logical
 * devices on one GPU, and kernels against the CPU backend. Skipped, and
 * counted as skipped, on machines without a CUDA device. */
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static void info_reports_a_real_gpu(void **state) {
    td_device_list *list = td_test_open("cuda:0");
    td_device_info info;
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(list, 0), &info));
    assert_string_equal(info.backend, "cuda");
    assert_true(info.compute_units > 0);
    assert_true(info.mem_total > info.mem_free / 2);
    assert_true(info.cc_major >= 3);
    td_device_list_destroy(list);
}

static void copies_between_cpu_gpu_and_logical_gpus(void **state) {
    static const size_t sizes[] = {0, 1, 4093, (16 << 20) + 3};
    td_device_list *list = td_test_open("cpu:0,cuda:0{split=2}");
    assert_int_equal(td_device_list_count(list), 3);
    assert_string_equal(td_device_name(td_device_list_get(list, 2)), "cuda:0/1");
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        td_test_chain c; /* cpu -> gpu -> the other logical gpu: the peer path */
        td_test_chain_create(list, sizes[k], 2246822519u, &c);
        memset(c.dst, 0, c.n + 1);
        TD_ASSERT_OK(td_buffer_read(c.b[2], 0, c.dst, c.n));
        assert_memory_equal(c.dst, c.src, c.n);
        td_test_chain_destroy(&c);
    }
    td_device_list_destroy(list);
}

static void out_of_memory_is_a_status(void **state) {
    td_device_list *list = td_test_open("cuda:0");
    td_buffer *b = NULL;
    TD_ASSERT_STATUS(td_buffer_alloc(td_device_list_get(list, 0), (size_t)1 << 50, &b),
                     TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cuda:0");
    /* The device still works afterwards. */
    TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, 0), 1024, &b));
    td_buffer_free(b);
    td_device_list_destroy(list);
}

static void rng_and_fill_match_the_cpu(void **state) {
    td_device_list *list = td_test_open("cpu:0,cuda:0");
    const int64_t n = 1000003;
    for (int dt = 0; dt < 2; dt++) {
        td_tensor *c = NULL, *g = NULL;
        td_compare_result r;
        TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 0), (td_dtype)dt, 1, &n, &c));
        TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 1), (td_dtype)dt, 1, &n, &g));
        TD_ASSERT_OK(td_tensor_rand_uniform(c, 11, 5, -1, 1));
        TD_ASSERT_OK(td_tensor_rand_uniform(g, 11, 5, -1, 1));
        TD_ASSERT_OK(td_tensor_compare(c, g, &r));
        assert_true(r.max_abs == 0);
        TD_ASSERT_OK(td_tensor_rand_normal(c, 11, 5, 0, 1));
        TD_ASSERT_OK(td_tensor_rand_normal(g, 11, 5, 0, 1));
        TD_ASSERT_OK(td_tensor_compare(c, g, &r));
        assert_true(r.max_abs < (dt ? 1e-12 : 1e-5));
        td_tensor_destroy(c);
        td_tensor_destroy(g);
    }
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(info_reports_a_real_gpu),
        cmocka_unit_test(copies_between_cpu_gpu_and_logical_gpus),
        cmocka_unit_test(out_of_memory_is_a_status),
        cmocka_unit_test(rng_and_fill_match_the_cpu),
    };
    td_test_require_devices("cuda:0", "CUDA device");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
