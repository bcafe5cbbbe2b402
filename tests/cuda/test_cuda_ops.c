/* Every op of the kernel table on CUDA (cuda:0) against the CPU backend
 * (cpu:0), through the tensor-level API, in f64 and f32 on small odd shapes
 * (tolerance 1e-12 in f64, 1e-5 in f32); logical GPUs computing at once; and
 * f64 refused on a GPU presented without it. The op cases are shared with
 * OpenCL: tests/support/backend_ops.c. Skipped without a CUDA device. */
#include <stdlib.h>

#include "support/support.h"

#ifndef TD_HAVE_CUDA
int main(void) {
    td_test_skip("no CUDA device (built without CUDA)");
}
#else

#include "backend/cuda/cuda-impl.h"
#include "support/backend_ops.h"

static const td_ops_backend cuda = {"cuda", "CUDA", "cuda:0", &td__cuda_kernels};

/* CUDA-only paths ------------------------------------------------------------------------ */

/* TANDEM_CUDA_FP64=0 presents the GPU as one without f64: f64 tensors and
 * f64 training are refused with the device named, as on an OpenCL device
 * without cl_khr_fp64. */
static void f64_is_refused_without_fp64(void **state) {
    td_device_list *list = NULL;
    td_device_info info;
    td_tensor *t = NULL;
    td_model *m = NULL;
    int64_t n = 5;
    setenv("TANDEM_CUDA_FP64", "0", 1);
    list = td_test_open("cuda:0");
    unsetenv("TANDEM_CUDA_FP64");
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(list, 0), &info));
    assert_int_equal(info.fp64, 0);
    assert_true(info.fp64_rate > 0); /* the rate is still shown */
    TD_ASSERT_STATUS(td_tensor_create(td_device_list_get(list, 0), TD_F64, 1, &n, &t),
                     TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("cuda:0");
    td_test_assert_message_contains("fp64");
    assert_true(td_model_load_string("{\"input\": {\"shape\": [4]}, \"layers\": "
                                     "[{\"type\": \"linear\", \"out\": 3}]}",
                                     "m", td_device_list_get(list, 0), TD_F64, 1, &m) != TD_OK);
    assert_null(m);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TD_OPS_ALL_CASES,
        cmocka_unit_test(f64_is_refused_without_fp64),
    };
    int rc;
    if (td_ops_begin(&cuda) != TD_OK)
        td_test_skip("no CUDA device");
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    td_ops_end();
    return rc;
}

#endif
