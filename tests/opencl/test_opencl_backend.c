/* The OpenCL backend on whatever OpenCL device is here (PoCL on the CPU in
 * CI): discovery, sub-devices, memory, copies to and from other backends, and
 * kernels against the CPU backend's results. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static void split_gives_sub_devices_that_share_the_compute_units(void **state) {
    td_device_list *whole = td_test_open("opencl:0.0"),
                   *parts = td_test_open("opencl:0.0{split=2}");
    td_device_info a, b;
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(whole, 0), &a));
    assert_int_equal(td_device_list_count(parts), 2);
    assert_string_equal(td_device_name(td_device_list_get(parts, 1)), "opencl:0.0/1");
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(parts, 0), &b));
    assert_string_equal(b.backend, "opencl");
    assert_int_equal(b.compute_units, a.compute_units / 2);
    assert_true(b.mem_total > 0);
    td_device_list_destroy(parts);
    td_device_list_destroy(whole);
}

static void copies_cross_backends_and_sub_devices(void **state) {
    static const size_t sizes[] = {0, 1, 4093, 3 << 20};
    td_device_list *list = td_test_open("cpu:0,opencl:0.0{split=2}");
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        td_test_chain c; /* cpu -> opencl -> opencl */
        size_t n = sizes[k];
        td_test_chain_create(list, n, 40503u, &c);
        if (n > 8) /* within one device, at offsets */
            TD_ASSERT_OK(td_buffer_copy(c.b[2], 0, c.b[2], 4, 4));
        memset(c.dst, 0, n + 1);
        TD_ASSERT_OK(td_buffer_copy(c.b[0], 0, c.b[2], 0, n)); /* opencl -> cpu */
        TD_ASSERT_OK(td_buffer_read(c.b[0], 0, c.dst, n));
        if (n > 8)
            memcpy(c.src, c.src + 4, 4);
        assert_memory_equal(c.dst, c.src, n);
        td_test_chain_destroy(&c);
    }
    td_device_list_destroy(list);
}

static void budgets_apply_to_opencl_devices(void **state) {
    td_device_list *list = td_test_open("opencl:0.0{mem=1M}");
    td_buffer *a = NULL, *b = NULL;
    TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, 0), 1 << 20, &a));
    TD_ASSERT_STATUS(td_buffer_alloc(td_device_list_get(list, 0), 1, &b), TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("opencl:0.0");
    td_buffer_free(a);
    td_device_list_destroy(list);
}

/* fill and the RNG on OpenCL equal the CPU backend's: uniform bit for bit,
 * normal within the last bits (OpenCL's log/sin/cos may round differently). */
static void kernels_match_the_cpu_backend(void **state) {
    td_device_list *list = td_test_open("cpu:0,opencl:0.0");
    const int64_t n = 100003;
    for (int dt = 0; dt < 2; dt++) {
        td_tensor *c = NULL, *o = NULL;
        td_compare_result r;
        double tol = dt == TD_F64 ? 1e-13 : 1e-6;
        TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 0), (td_dtype)dt, 1, &n, &c));
        TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 1), (td_dtype)dt, 1, &n, &o));
        TD_ASSERT_OK(td_tensor_fill(c, 0.125));
        TD_ASSERT_OK(td_tensor_fill(o, 0.125));
        TD_ASSERT_OK(td_tensor_compare(c, o, &r));
        assert_true(r.max_abs == 0);
        TD_ASSERT_OK(td_tensor_rand_uniform(c, 5, 17, -2, 3));
        TD_ASSERT_OK(td_tensor_rand_uniform(o, 5, 17, -2, 3));
        TD_ASSERT_OK(td_tensor_compare(c, o, &r));
        if (r.max_abs != 0)
            fail_msg("%s uniform differs by %g at %zu", dt ? "f64" : "f32", r.max_abs,
                     r.worst_index);
        TD_ASSERT_OK(td_tensor_rand_normal(c, 5, 17, 1, 2));
        TD_ASSERT_OK(td_tensor_rand_normal(o, 5, 17, 1, 2));
        TD_ASSERT_OK(td_tensor_compare(c, o, &r));
        if (r.max_abs > tol * 10)
            fail_msg("%s normal differs by %g at %zu", dt ? "f64" : "f32", r.max_abs,
                     r.worst_index);
        td_tensor_destroy(c);
        td_tensor_destroy(o);
    }
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_gives_sub_devices_that_share_the_compute_units),
        cmocka_unit_test(copies_cross_backends_and_sub_devices),
        cmocka_unit_test(budgets_apply_to_opencl_devices),
        cmocka_unit_test(kernels_match_the_cpu_backend),
    };
    td_test_require_devices("opencl:0.0", "OpenCL device");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
