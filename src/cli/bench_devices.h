/* tandem bench devices: how fast each device is (bench_devices.c). */
#ifndef TD_CLI_BENCH_DEVICES_H
#define TD_CLI_BENCH_DEVICES_H

/* Runs `tandem bench devices` with argv[0] "devices"; returns the exit
 * status: 0, 1 on failure (message printed), 2 on a usage error. */
int td_cli_bench_devices(int argc, char **argv);

/* bench_devices_gemm.c: the GEMMs it times. --------------------------------- */

#include <stdint.h>

#include "tandem/tandem.h"

typedef struct td_cli_gemm_sizing {
    double min_s;    /* grow n until one GEMM takes this long */
    int64_t max_n;   /* or n reaches this */
    double budget_s; /* the timed repetitions take about this long (3 at least) */
} td_cli_gemm_sizing;

/* The most repetitions td_cli_bench_gemm times: t holds this many. */
#define TD_CLI_GEMM_MAX_REPS 51

/* Times c (n, n) = a (n, n) b (n, n) of dtype dt on dev at its current
 * precision, from dev's host thread: n doubles from 128 until one GEMM takes
 * z->min_s, n reaches z->max_n or the next size's three matrices pass
 * mem_limit bytes. *n_out is the last n and *gflops 2 n^3 over the median
 * time. t is scratch for TD_CLI_GEMM_MAX_REPS times. On failure the outputs
 * are untouched and the error is the op's. */
td_status td_cli_bench_gemm(td_device *dev, td_dtype dt, const td_cli_gemm_sizing *z,
                            uint64_t mem_limit, double *t, int64_t *n_out, double *gflops);

/* The same in f32 with bf16 products: sets dev's precision to bf16 for the
 * timing and back to what it was, even on failure. Fails with
 * TD_ERR_UNSUPPORTED where dev has no bf16 path (TD_DEVICE_CAP_BF16). */
td_status td_cli_bench_gemm_bf16(td_device *dev, const td_cli_gemm_sizing *z, uint64_t mem_limit,
                                 double *t, int64_t *n_out, double *gflops);

/* The median of t[0..n), which it sorts. */
double td_cli_median(double *t, int n);

#endif
