/* The arithmetic of tandem/tensor.h (td_tensor_matmul, td_tensor_add,
 * td_tensor_axpby) as a user of the public API calls it: on the device's
 * host thread, with small exact values; refused off that thread and for
 * shapes that do not match. The kernels themselves are tested against f64
 * references in test_ops.c. */
#include <stdio.h>
#include <stdlib.h>

#include "support/support.h"

typedef struct ops {
    td_tensor *a, *b, *c, *x, *y, *z;
} ops;

static td_status run_ops(td_device *dev, void *arg) {
    ops *o = arg;
    td_status st;
    /* c (2, 2) = 2 a (2, 3) b (3, 2) + 0 c */
    if ((st = td_tensor_matmul(o->c, o->a, 0, o->b, 0, 2.0, 0.0)) != TD_OK)
        return st;
    /* z (3) = x + y, then y = 2 x + 0.5 y */
    if ((st = td_tensor_add(o->x, o->y, o->z)) != TD_OK)
        return st;
    if ((st = td_tensor_axpby(2.0, o->x, 0.5, o->y)) != TD_OK)
        return st;
    return td_device_sync(dev);
}

static td_status run_bad_matmul(td_device *dev, void *arg) {
    ops *o = arg;
    /* a (2, 3) x a (2, 3): inner extents 3 and 2 differ */
    return td_tensor_matmul(o->c, o->a, 0, o->a, 0, 1.0, 0.0);
}

static td_tensor *make(td_device *dev, int64_t rows, int64_t cols, const double *v) {
    int64_t shape[2] = {rows, cols};
    td_tensor *t = NULL;
    TD_ASSERT_OK(td_tensor_create(dev, TD_F32, cols ? 2 : 1, shape, &t));
    TD_ASSERT_OK(td_tensor_write_f64(t, v, (size_t)(rows * (cols ? cols : 1))));
    return t;
}

static void the_ops_compute_on_the_device_thread(void **state) {
    static const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, 0, 1, 1, 1}, zero[4] = {0};
    static const double x[] = {1, 2, 3}, y[] = {10, 20, 30};
    /* 2 a b: a's rows (1 2 3) and (4 5 6) against b's columns (1 0 1), (0 1 1) */
    static const double want_c[] = {8, 10, 20, 22}, want_z[] = {11, 22, 33}, want_y[] = {7, 14, 21};
    td_device_list *l = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(l, 0);
    ops o = {make(dev, 2, 3, a), make(dev, 3, 2, b), make(dev, 2, 2, zero),
             make(dev, 3, 0, x), make(dev, 3, 0, y), make(dev, 3, 0, zero)};
    double got[4];
    TD_ASSERT_OK(td_device_run(dev, run_ops, &o));
    TD_ASSERT_OK(td_tensor_read_f64(o.c, got, 4));
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == want_c[i]);
    TD_ASSERT_OK(td_tensor_read_f64(o.z, got, 3));
    for (int i = 0; i < 3; i++)
        assert_true(got[i] == want_z[i]);
    TD_ASSERT_OK(td_tensor_read_f64(o.y, got, 3));
    for (int i = 0; i < 3; i++)
        assert_true(got[i] == want_y[i]);

    /* Off the device's host thread, and with extents that do not match. */
    TD_ASSERT_STATUS(td_tensor_add(o.x, o.y, o.z), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_device_run(dev, run_bad_matmul, &o), TD_ERR_SHAPE);

    td_tensor_destroy(o.a);
    td_tensor_destroy(o.b);
    td_tensor_destroy(o.c);
    td_tensor_destroy(o.x);
    td_tensor_destroy(o.y);
    td_tensor_destroy(o.z);
    td_device_list_destroy(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_ops_compute_on_the_device_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
