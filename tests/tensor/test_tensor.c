/* Tensors: creation, transfers, fills, the counter-based RNG across devices,
 * and the comparison used by every numeric test. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static td_tensor *make(td_device *dev, td_dtype dt, int ndim, const int64_t *shape) {
    td_tensor *t = NULL;
    TD_ASSERT_OK(td_tensor_create(dev, dt, ndim, shape, &t));
    return t;
}

static void create_reports_shape_and_refuses_bad_ones(void **state) {
    td_device_list *list = td_test_open("cpu:0{mem=64K}");
    td_device *dev = td_device_list_get(list, 0);
    int64_t shape[4] = {2, 3, 4, 5}, bad[2] = {3, -1}, big[2] = {1024, 1024};
    td_tensor *t = make(dev, TD_F64, 4, shape), *u = (td_tensor *)0x1;
    assert_int_equal(td_tensor_numel(t), 120);
    assert_int_equal(td_tensor_nbytes(t), 960);
    assert_int_equal(td_tensor_ndim(t), 4);
    assert_int_equal(td_tensor_dim(t, 2), 4);
    assert_int_equal(td_tensor_dim(t, 7), 0);
    assert_ptr_equal(td_tensor_device(t), dev);
    TD_ASSERT_STATUS(td_tensor_create(dev, TD_F32, 2, bad, &u), TD_ERR_SHAPE);
    assert_null(u);
    TD_ASSERT_STATUS(td_tensor_create(dev, TD_F32, 5, shape, &u), TD_ERR_INVALID_ARG);
    /* 4 MiB on a 64 KiB budget. */
    TD_ASSERT_STATUS(td_tensor_create(dev, TD_F32, 2, big, &u), TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cpu:0");
    td_tensor_destroy(t);
    td_tensor_destroy(NULL);
    /* A scalar has one element. */
    t = make(dev, TD_F32, 0, NULL);
    assert_int_equal(td_tensor_numel(t), 1);
    td_tensor_destroy(t);
    td_device_list_destroy(list);
}

static void write_read_and_convert(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    int64_t n = 1001;
    td_tensor *t32 = make(td_device_list_get(list, 0), TD_F32, 1, &n);
    td_tensor *t64 = make(td_device_list_get(list, 0), TD_F64, 1, &n);
    double *in = malloc(sizeof(double) * (size_t)n), *out = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        in[i] = sin((double)i) * 1e3;
    TD_ASSERT_OK(td_tensor_write_f64(t32, in, (size_t)n));
    TD_ASSERT_OK(td_tensor_write_f64(t64, in, (size_t)n));
    TD_ASSERT_OK(td_tensor_read_f64(t64, out, (size_t)n));
    assert_memory_equal(in, out, sizeof(double) * (size_t)n);
    TD_ASSERT_OK(td_tensor_read_f64(t32, out, (size_t)n));
    for (int64_t i = 0; i < n; i++)
        assert_true(out[i] == (double)(float)in[i]);
    TD_ASSERT_STATUS(td_tensor_read(t32, out, 8), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("8 bytes given");
    free(in);
    free(out);
    td_tensor_destroy(t32);
    td_tensor_destroy(t64);
    td_device_list_destroy(list);
}

/* The RNG's numbers at positions [offset, offset + n) must be the reference
 * td_rng_* values, whatever device makes them. */
static void check_stream(td_tensor *t, uint64_t seed, uint64_t offset, int normal) {
    size_t n = td_tensor_numel(t);
    double *h = malloc(sizeof(double) * n);
    TD_ASSERT_OK(td_tensor_read_f64(t, h, n));
    for (size_t i = 0; i < n; i++) {
        double want = normal ? 0.5 + 2.0 * td_rng_normal(seed, offset + i)
                             : -1.0 + 3.0 * td_rng_uniform(seed, offset + i);
        if (td_tensor_dtype(t) == TD_F32)
            want = (float)want;
        if (h[i] != want)
            fail_msg("position %zu: %.17g, expected %.17g", (size_t)offset + i, h[i], want);
    }
    free(h);
}

static void rng_is_the_same_on_every_device_and_device_count(void **state) {
    static const char *specs[] = {"cpu", "cpu*2", "cpu*3"};
    const int64_t total = 10007; /* prime: shards are unequal */
    for (int dt = 0; dt < 2; dt++) {
        double *whole = NULL;
        for (size_t s = 0; s < 3; s++) {
            td_device_list *list = td_test_open(specs[s]);
            size_t ndev = td_device_list_count(list);
            double *joined = malloc(sizeof(double) * (size_t)total);
            for (size_t d = 0; d < ndev; d++) {
                /* Device d holds shard [begin, end) of one logical tensor. */
                int64_t begin = total * (int64_t)d / (int64_t)ndev;
                int64_t end = total * (int64_t)(d + 1) / (int64_t)ndev, len = end - begin;
                td_tensor *t = make(td_device_list_get(list, d), (td_dtype)dt, 1, &len);
                TD_ASSERT_OK(td_tensor_rand_normal(t, 1234, (uint64_t)begin, 0.5, 2.0));
                check_stream(t, 1234, (uint64_t)begin, 1);
                TD_ASSERT_OK(td_tensor_read_f64(t, joined + begin, (size_t)len));
                TD_ASSERT_OK(td_tensor_rand_uniform(t, 99, (uint64_t)begin, -1.0, 2.0));
                check_stream(t, 99, (uint64_t)begin, 0);
                td_tensor_destroy(t);
            }
            if (!whole)
                whole = joined;
            else {
                assert_memory_equal(whole, joined, sizeof(double) * (size_t)total);
                free(joined);
            }
            td_device_list_destroy(list);
        }
        free(whole);
    }
}

static void fill_copy_and_compare_across_devices(void **state) {
    td_device_list *list = td_test_open("cpu*2");
    int64_t shape[2] = {37, 29};
    td_tensor *a = make(td_device_list_get(list, 0), TD_F64, 2, shape);
    td_tensor *b = make(td_device_list_get(list, 1), TD_F64, 2, shape);
    td_tensor *c = make(td_device_list_get(list, 1), TD_F32, 2, shape);
    int64_t other[2] = {29, 37};
    td_tensor *d = make(td_device_list_get(list, 1), TD_F64, 2, other);
    td_compare_result r;
    double h[37 * 29];
    TD_ASSERT_OK(td_tensor_fill(a, 2.5));
    TD_ASSERT_OK(td_tensor_read_f64(a, h, 37 * 29));
    for (int i = 0; i < 37 * 29; i++)
        assert_true(h[i] == 2.5);
    TD_ASSERT_OK(td_tensor_rand_normal(a, 7, 0, 0, 1));
    TD_ASSERT_OK(td_tensor_copy(b, a));
    TD_ASSERT_OK(td_tensor_compare(a, b, &r));
    assert_true(r.max_abs == 0 && r.max_rel == 0 && r.nonfinite == 0);
    /* One changed element is found, with its size and place. */
    TD_ASSERT_OK(td_tensor_read_f64(b, h, 37 * 29));
    h[500] += 0.25;
    TD_ASSERT_OK(td_tensor_write_f64(b, h, 37 * 29));
    TD_ASSERT_OK(td_tensor_compare(a, b, &r));
    assert_int_equal(r.worst_index, 500);
    assert_true(fabs(r.max_abs - 0.25) < 1e-15);
    h[7] = NAN;
    TD_ASSERT_OK(td_tensor_write_f64(b, h, 37 * 29));
    TD_ASSERT_OK(td_tensor_compare(a, b, &r));
    assert_int_equal(r.nonfinite, 1);
    /* f32 against f64: the difference is rounding only. */
    TD_ASSERT_OK(td_tensor_rand_normal(c, 7, 0, 0, 1));
    TD_ASSERT_OK(td_tensor_compare(a, c, &r));
    assert_true(r.max_rel < 6e-8);
    TD_ASSERT_STATUS(td_tensor_copy(c, a), TD_ERR_DTYPE);
    TD_ASSERT_STATUS(td_tensor_copy(d, a), TD_ERR_SHAPE);
    td_test_assert_message_contains("(29, 37) on cpu:1 and (37, 29) on cpu:0");
    td_tensor_destroy(a);
    td_tensor_destroy(b);
    td_tensor_destroy(c);
    td_tensor_destroy(d);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_reports_shape_and_refuses_bad_ones),
        cmocka_unit_test(write_read_and_convert),
        cmocka_unit_test(rng_is_the_same_on_every_device_and_device_count),
        cmocka_unit_test(fill_copy_and_compare_across_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
