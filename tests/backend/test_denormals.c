/* Subnormal numbers on CPU devices (core/fpmode.h): flushed to zero by
 * default on a device's host thread, its helper threads and in BLAS; kept
 * exactly with {denormals=keep} or TANDEM_DENORMALS=keep. The reference is
 * the IEEE value computed on this test's main thread, whose floating-point
 * mode no device changes. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fpmode.h"
#include "support/support.h"
#include "tensor/ops.h"

/* Above ELEM_PARALLEL_MIN (kern_elem.c), so a device with two cores splits
 * the op between its host thread and a helper. */
#define N 65536

/* The inputs: even elements are subnormal (DAZ reads them as 0), odd ones
 * normal with a subnormal product (FTZ flushes it). */
static void inputs_f64(double *x) {
    for (size_t i = 0; i < N; i++)
        x[i] = i % 2 ? 1e-307 * (double)(1 + i % 7) : 1e-310 * (double)(1 + i % 5);
}
static void inputs_f32(float *x) {
    for (size_t i = 0; i < N; i++)
        x[i] = i % 2 ? 1e-37f * (float)(1 + i % 7) : 1e-40f * (float)(1 + i % 5);
}

#define ALPHA 0.01

typedef struct job {
    td_tensor *x, *y;
    td_status st;
    int denormals; /* the device thread's mode, as td__denormals_get() read it there */
} job;

static td_status axpby_task(td_device *dev, void *arg) {
    job *j = arg;
    j->denormals = (int)td__denormals_get();
    return j->st = td__op_axpby(ALPHA, j->x, 0.0, j->y);
}

/* y = ALPHA x on the first device of spec, in dtype dt; out gets y's bytes. */
static int run_axpby(const char *spec, td_dtype dt, void *out) {
    td_device_list *list = td_test_open(spec);
    td_device *dev = td_device_list_get(list, 0);
    int64_t n = N;
    size_t es = dt == TD_F32 ? sizeof(float) : sizeof(double);
    void *x = malloc(N * es);
    job j;
    memset(&j, 0, sizeof j);
    if (dt == TD_F32)
        inputs_f32(x);
    else
        inputs_f64(x);
    TD_ASSERT_OK(td_tensor_create(dev, dt, 1, &n, &j.x));
    TD_ASSERT_OK(td_tensor_create(dev, dt, 1, &n, &j.y));
    /* Raw bytes: td_tensor_write_f64 would convert on the device thread. */
    TD_ASSERT_OK(td_tensor_write(j.x, x, N * es));
    TD_ASSERT_OK(td_tensor_fill(j.y, 0.0));
    TD_ASSERT_OK(td_device_run(dev, axpby_task, &j));
    TD_ASSERT_OK(j.st);
    TD_ASSERT_OK(td_tensor_read(j.y, out, N * es));
    td_tensor_destroy(j.x);
    td_tensor_destroy(j.y);
    td_device_list_destroy(list);
    free(x);
    return j.denormals;
}

/* The IEEE products, computed here: this thread's mode is the C default. */
static void reference(td_dtype dt, void *out) {
    if (dt == TD_F32) {
        float *x = malloc(N * sizeof *x), *y = out;
        volatile float a = (float)ALPHA;
        inputs_f32(x);
        for (size_t i = 0; i < N; i++)
            y[i] = a * x[i];
        free(x);
    } else {
        double *x = malloc(N * sizeof *x), *y = out;
        volatile double a = ALPHA;
        inputs_f64(x);
        for (size_t i = 0; i < N; i++)
            y[i] = a * x[i];
        free(x);
    }
}

static void expect_flushed(td_dtype dt, const void *y) {
    for (size_t i = 0; i < N; i++) {
        double v = dt == TD_F32 ? (double)((const float *)y)[i] : ((const double *)y)[i];
        if (v != 0.0)
            fail_msg("%s element %zu is %g, not flushed to 0", td_dtype_name(dt), i, v);
    }
}

static void expect_ieee(td_dtype dt, const void *y) {
    size_t es = dt == TD_F32 ? sizeof(float) : sizeof(double);
    void *ref = malloc(N * es);
    reference(dt, ref);
    /* The reference really is subnormal, and nonzero. */
    for (size_t i = 0; i < N; i++) {
        double r = dt == TD_F32 ? (double)((float *)ref)[i] : ((double *)ref)[i];
        double lim = dt == TD_F32 ? (double)FLT_MIN : DBL_MIN;
        if (!(r > 0 && r < lim))
            fail_msg("%s reference %zu is %g, not subnormal", td_dtype_name(dt), i, r);
    }
    for (size_t i = 0; i < N; i++)
        if (memcmp((const char *)y + i * es, (const char *)ref + i * es, es) != 0)
            fail_msg("%s element %zu differs from the IEEE product", td_dtype_name(dt), i);
    free(ref);
}

static void main_thread_keeps_ieee(void **state) {
    /* The premise of every reference here, and what opening devices must
     * not change: only their own threads flush. */
    assert_int_equal(td__denormals_get(), TD__DENORMALS_KEEP);
}

static void device_threads_flush_by_default(void **state) {
    static const td_dtype dts[] = {TD_F32, TD_F64};
    void *y = malloc(N * sizeof(double));
    for (int d = 0; d < 2; d++) {
        /* "cpu": every core, so a helper thread takes part of the op. */
        assert_int_equal(run_axpby("cpu", dts[d], y), TD__DENORMALS_FLUSH);
        expect_flushed(dts[d], y);
        assert_int_equal(run_axpby("cpu:0{denormals=flush}", dts[d], y), TD__DENORMALS_FLUSH);
        expect_flushed(dts[d], y);
    }
    free(y);
    assert_int_equal(td__denormals_get(), TD__DENORMALS_KEEP);
}

static void the_option_keeps_subnormals_exactly(void **state) {
    static const td_dtype dts[] = {TD_F32, TD_F64};
    void *y = malloc(N * sizeof(double));
    for (int d = 0; d < 2; d++) {
        assert_int_equal(run_axpby("cpu{denormals=keep}", dts[d], y), TD__DENORMALS_KEEP);
        expect_ieee(dts[d], y);
    }
    free(y);
}

/* GEMM goes to OpenBLAS (f64 always), on the device's own thread. */
typedef struct gemm_job {
    td_tensor *a, *b, *c;
    td_status st;
} gemm_job;

static td_status gemm_task(td_device *dev, void *arg) {
    gemm_job *g = arg;
    return g->st = td__op_matmul(g->c, g->a, 0, g->b, 0, 1.0, 0.0);
}

/* C = A B with every product 1e-160 * 1e-150 = 1e-310, subnormal. */
static double gemm_c00(const char *spec) {
    td_device_list *list = td_test_open(spec);
    td_device *dev = td_device_list_get(list, 0);
    int64_t s[2] = {8, 8};
    double a[64], b[64], c[64];
    gemm_job g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < 64; i++) {
        a[i] = 1e-160;
        b[i] = 1e-150;
    }
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 2, s, &g.a));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 2, s, &g.b));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 2, s, &g.c));
    TD_ASSERT_OK(td_tensor_write(g.a, a, sizeof a));
    TD_ASSERT_OK(td_tensor_write(g.b, b, sizeof b));
    TD_ASSERT_OK(td_device_run(dev, gemm_task, &g));
    TD_ASSERT_OK(g.st);
    TD_ASSERT_OK(td_tensor_read(g.c, c, sizeof c));
    for (int i = 1; i < 64; i++)
        assert_true(c[i] == c[0]);
    td_tensor_destroy(g.a);
    td_tensor_destroy(g.b);
    td_tensor_destroy(g.c);
    td_device_list_destroy(list);
    return c[0];
}

static void blas_on_device_threads_flushes_too(void **state) {
    volatile double p = 1e-160;
    double want = 8 * (p * 1e-150), kept;
    assert_true(want > 0 && want < DBL_MIN);
    assert_true(gemm_c00("cpu:0") == 0.0);
    kept = gemm_c00("cpu:0{denormals=keep}");
    /* Eight subnormal products summed in BLAS's order: close, not bitwise. */
    assert_true(kept > 0 && kept < DBL_MIN);
    assert_true(kept > want * (1 - 1e-9) && kept < want * (1 + 1e-9));
}

static void bad_options_are_parse_errors(void **state) {
    td_device_list *list = NULL;
    TD_ASSERT_STATUS(td_devices_open("cpu:0{denormals=maybe}", &list), TD_ERR_PARSE);
    td_test_assert_message_contains("denormals=maybe is neither 'keep' nor 'flush'");
    TD_ASSERT_STATUS(td_devices_open("cpu:0{denormals=keep,denormals=keep}", &list), TD_ERR_PARSE);
    td_test_assert_message_contains("'denormals' given twice");
    TD_ASSERT_STATUS(td_devices_open("cpu:0{colour=red}", &list), TD_ERR_PARSE);
    td_test_assert_message_contains("denormals");
    assert_null(list);
}

/* Run in a child started with TANDEM_DENORMALS=keep: devices keep
 * subnormals unless their spec says flush. */
static void the_environment_keeps_subnormals(void **state) {
    void *y = malloc(N * sizeof(double));
    assert_int_equal(td__denormals_default(), TD__DENORMALS_KEEP);
    assert_int_equal(run_axpby("cpu", TD_F32, y), TD__DENORMALS_KEEP);
    expect_ieee(TD_F32, y);
    assert_int_equal(run_axpby("cpu", TD_F64, y), TD__DENORMALS_KEEP);
    expect_ieee(TD_F64, y);
    assert_int_equal(run_axpby("cpu{denormals=flush}", TD_F64, y), TD__DENORMALS_FLUSH);
    expect_flushed(TD_F64, y);
    free(y);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(main_thread_keeps_ieee),
        cmocka_unit_test(device_threads_flush_by_default),
        cmocka_unit_test(the_option_keeps_subnormals_exactly),
        cmocka_unit_test(blas_on_device_threads_flushes_too),
        cmocka_unit_test(bad_options_are_parse_errors),
    };
    const struct CMUnitTest env_tests[] = {
        cmocka_unit_test(main_thread_keeps_ieee),
        cmocka_unit_test(the_environment_keeps_subnormals),
    };
    pid_t pid;
    int status = 0, failed;
    if (getenv("TD_TEST_DENORMALS_CHILD"))
        return cmocka_run_group_tests_name("TANDEM_DENORMALS=keep", env_tests, NULL, NULL);
    unsetenv("TANDEM_DENORMALS");
    failed = cmocka_run_group_tests(tests, NULL, NULL) != 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        setenv("TANDEM_DENORMALS", "keep", 1);
        setenv("TD_TEST_DENORMALS_CHILD", "1", 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        printf("FAILED with TANDEM_DENORMALS=keep\n");
        failed = 1;
    }
    return failed;
}
