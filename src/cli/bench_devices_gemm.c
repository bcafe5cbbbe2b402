/* The GEMMs of `tandem bench devices`: f32, f64, and f32 with bf16 products
 * (the device's precision set to bf16, so that td_tensor_matmul takes the
 * backend's gemm_bf16 slot), each timed the same way so that the three
 * figures compare. */
#include <math.h>
#include <stdlib.h>

#include "bench_devices.h"
#include "cli.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double td_cli_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static td_status square(td_device *dev, td_dtype dt, int64_t n, td_tensor **out) {
    int64_t shape[2] = {n, n};
    return td_tensor_create(dev, dt, 2, shape, out);
}

/* One GEMM, waited for, slowed as a pass of a slowed device is. */
static td_status gemm_once(td_device *dev, td_tensor *c, const td_tensor *a, const td_tensor *b,
                           double *s) {
    uint64_t t0 = td_clock_ns();
    td_status st;
    if ((st = td_tensor_matmul(c, a, 0, b, 0, 1.0, 0.0)) != TD_OK ||
        (st = td_device_sync(dev)) != TD_OK)
        return st;
    td_device_throttle(dev, t0, 0);
    *s = (double)(td_clock_ns() - t0) * 1e-9;
    return TD_OK;
}

td_status td_cli_bench_gemm(td_device *dev, td_dtype dt, const td_cli_gemm_sizing *z,
                            uint64_t mem_limit, double *t, int64_t *n_out, double *gflops) {
    uint64_t esize = dt == TD_F64 ? 8 : 4;
    int64_t n = 128;
    td_tensor *a = NULL, *b = NULL, *c = NULL;
    double one = 0;
    int reps;
    td_status st = TD_OK;
    for (;;) {
        /* a, b, c: (n, n) */
        TD_CLI_TRY(square(dev, dt, n, &a));
        TD_CLI_TRY(square(dev, dt, n, &b));
        TD_CLI_TRY(square(dev, dt, n, &c));
        TD_CLI_TRY(td_tensor_rand_uniform(a, 1, 0, -1, 1));
        TD_CLI_TRY(td_tensor_rand_uniform(b, 2, 0, -1, 1));
        TD_CLI_TRY(td_tensor_fill(c, 0));
        /* The first call may compile kernels or grow BLAS buffers; of the
         * next two the faster, as one may have been interrupted. */
        TD_CLI_TRY(gemm_once(dev, c, a, b, &one));
        TD_CLI_TRY(gemm_once(dev, c, a, b, &t[0]));
        TD_CLI_TRY(gemm_once(dev, c, a, b, &t[1]));
        one = fmin(t[0], t[1]);
        if (one >= z->min_s || n * 2 > z->max_n ||
            3 * (uint64_t)(2 * n) * (uint64_t)(2 * n) * esize > mem_limit)
            break;
        td_tensor_destroy(a);
        td_tensor_destroy(b);
        td_tensor_destroy(c);
        a = b = c = NULL;
        n *= 2;
    }
    /* The two timed at this size count among the repetitions. */
    reps = (int)(z->budget_s / fmax(one, 1e-9));
    reps = reps < 3 ? 3 : reps > TD_CLI_GEMM_MAX_REPS ? TD_CLI_GEMM_MAX_REPS : reps;
    for (int i = 2; i < reps; i++)
        TD_CLI_TRY(gemm_once(dev, c, a, b, &t[i]));
    *n_out = n;
    *gflops = 2.0 * (double)n * (double)n * (double)n / td_cli_median(t, reps) * 1e-9;
fail:
    td_tensor_destroy(a);
    td_tensor_destroy(b);
    td_tensor_destroy(c);
    return st;
}

td_status td_cli_bench_gemm_bf16(td_device *dev, const td_cli_gemm_sizing *z, uint64_t mem_limit,
                                 double *t, int64_t *n_out, double *gflops) {
    td_precision was = td_device_precision(dev);
    td_status st = td_device_set_precision(dev, TD_PRECISION_BF16);
    if (st != TD_OK)
        return st;
    st = td_cli_bench_gemm(dev, TD_F32, z, mem_limit, t, n_out, gflops);
    /* Back to f32 (or what it was) whatever happened: the f32 and f64 rows
     * and every later user of the device expect it. */
    td_device_set_precision(dev, was);
    return st;
}
