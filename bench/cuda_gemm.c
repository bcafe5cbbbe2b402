/* GEMM on a CUDA GPU: tandem's kernel table (through the tensor ops, as the
 * nn layers call it) against cuBLAS called directly, f32 and f64, in one run.
 * Prints TFLOP/s for each and the ratio (medians of several runs). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "support/bench.h"
#include "tandem/tandem.h"
#include "tensor/ops.h"

#define RUNS 7

typedef struct gemm_args {
    td_tensor *a, *b, *c;
    int reps;
} gemm_args;

static td_status tandem_gemm(td_device *dev, void *arg) {
    gemm_args *g = arg;
    td_status st = TD_OK;
    for (int r = 0; r < g->reps && st == TD_OK; r++)
        st = td__op_matmul(g->c, g->a, 0, g->b, 0, 1.0, 0.0);
    return st ? st : td_device_sync(dev);
}

/* cuBLAS on the same GPU with its own stream, from this thread. */
static double cublas_seconds(int n, td_dtype dt, int reps) {
    size_t es = td_dtype_size(dt), bytes = (size_t)n * (size_t)n * es;
    void *a, *b, *c;
    cublasHandle_t h;
    cudaEvent_t e0, e1;
    float ms = 0;
    double one = 1, zero = 0;
    float onef = 1, zerof = 0;
    cudaMalloc(&a, bytes);
    cudaMalloc(&b, bytes);
    cudaMalloc(&c, bytes);
    cublasCreate(&h);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int r = 0; r < reps; r++) {
        if (dt == TD_F32)
            cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &onef, b, n, a, n, &zerof, c, n);
        else
            cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, a, n, &zero, c, n);
    }
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return ms * 1e-3;
}

int main(void) {
    static const int sizes[] = {1024, 4096, 8192};
    td_device_list *list = NULL;
    td_device *dev;
    if (td_devices_open("cuda:0", &list) != TD_OK) {
        printf("skipped: no CUDA device (%s)\n", td_last_error());
        return 0;
    }
    dev = td_device_list_get(list, 0);
    printf("%-6s %6s %14s %14s %7s\n", "dtype", "n", "tandem TF/s", "cuBLAS TF/s", "ratio");
    for (int d = 0; d < 2; d++) {
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            int n = sizes[k], reps = n >= 8192 ? 3 : 10;
            int64_t shape[2] = {n, n};
            double tt[RUNS], tc[RUNS], flops = 2.0 * n * (double)n * n * reps;
            gemm_args g = {NULL, NULL, NULL, reps};
            td_tensor_create(dev, (td_dtype)d, 2, shape, &g.a);
            td_tensor_create(dev, (td_dtype)d, 2, shape, &g.b);
            td_tensor_create(dev, (td_dtype)d, 2, shape, &g.c);
            td_tensor_rand_normal(g.a, 1, 0, 0, 1);
            td_tensor_rand_normal(g.b, 2, 0, 0, 1);
            td_device_run(dev, tandem_gemm, &g); /* warm-up */
            cublas_seconds(n, (td_dtype)d, 1);
            for (int r = 0; r < RUNS; r++) {
                uint64_t t0 = td_clock_ns();
                if (td_device_run(dev, tandem_gemm, &g) != TD_OK) {
                    printf("tandem GEMM failed: %s\n", td_last_error());
                    return 1;
                }
                tt[r] = (double)(td_clock_ns() - t0) * 1e-9;
                tc[r] = cublas_seconds(n, (td_dtype)d, reps);
            }
            {
                double a = flops / td_bench_median(tt, RUNS) * 1e-12,
                       b = flops / td_bench_median(tc, RUNS) * 1e-12;
                printf("%-6s %6d %14.2f %14.2f %7.2f\n", td_dtype_name((td_dtype)d), n, a, b,
                       a / b);
            }
            td_tensor_destroy(g.a);
            td_tensor_destroy(g.b);
            td_tensor_destroy(g.c);
        }
    }
    td_device_list_destroy(list);
    return 0;
}
