/* OpenCL against the CPU backend: GEMM GFLOP/s through CLBlast (on PoCL here)
 * against the CPU backend's GEMM, and MNIST MLP training samples/s on
 * opencl:0.0 against the CPU devices alone. Medians of several runs; the
 * first (compiling) call is not timed. One floor: the data strategy over
 * cpu:0 and opencl:0.0 is not slower than its fastest member alone (exit
 * status 1 when it is); PoCL is a CPU, so no floor on its speed.
 *
 *   bench_opencl [gemm reps] [train steps]      (defaults 7 and 200) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/bench.h"
#include "tandem/comm.h"
#include "tandem/parallel.h"
#include "tandem/tandem.h"
#include "tensor/ops.h"

#define WINDOWS 5

/* GEMM ------------------------------------------------------------------------ */

typedef struct gemm_job {
    td_tensor *a, *b, *c;
    int inner;
} gemm_job;

static td_status gemm_reps(td_device *dev, void *arg) {
    gemm_job *j = arg;
    td_status st = TD_OK;
    (void)dev;
    for (int i = 0; i < j->inner && st == TD_OK; i++)
        st = td__op_matmul(j->c, j->a, 0, j->b, 0, 1.0, 0.0);
    return st;
}

/* Median GFLOP/s of an (n, n) x (n, n) GEMM on dev, or 0 on failure. */
static double gemm_gflops(td_device *dev, td_dtype dt, int64_t n, int reps) {
    int64_t shape[2] = {n, n};
    gemm_job j = {NULL, NULL, NULL, 1};
    double flop = 2.0 * (double)n * (double)n * (double)n, g[32], out = 0;
    if (reps > 32)
        reps = 32;
    if (td_tensor_create(dev, dt, 2, shape, &j.a) || td_tensor_create(dev, dt, 2, shape, &j.b) ||
        td_tensor_create(dev, dt, 2, shape, &j.c) || td_tensor_rand_uniform(j.a, 1, 0, -1, 1) ||
        td_tensor_rand_uniform(j.b, 2, 0, -1, 1))
        goto done;
    /* warm-up: compiles the kernels on OpenCL */
    if (td_device_run(dev, gemm_reps, &j) || td_device_sync(dev))
        goto done;
    j.inner = (int)(4e9 / flop) + 1; /* each timing lasts a while */
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = td_clock_ns();
        if (td_device_run(dev, gemm_reps, &j) || td_device_sync(dev))
            goto done;
        g[r] = flop * j.inner / ((double)(td_clock_ns() - t0) / 1e9) / 1e9;
    }
    out = td_bench_median(g, reps);
done:
    if (out == 0)
        fprintf(stderr, "gemm on %s: %s\n", td_device_name(dev), td_last_error());
    td_tensor_destroy(j.a);
    td_tensor_destroy(j.b);
    td_tensor_destroy(j.c);
    return out;
}

/* Training --------------------------------------------------------------------- */

/* examples/mnist_mlp.json */
static const char mlp_json[] =
    "{\"name\": \"mnist_mlp\", \"input\": {\"shape\": [784]}, \"layers\": ["
    "{\"type\": \"linear\", \"out\": 256}, {\"type\": \"relu\"},"
    "{\"type\": \"linear\", \"out\": 128}, {\"type\": \"relu\"},"
    "{\"type\": \"linear\", \"out\": 10}]}";

/* Every training run here: synthetic MNIST-shaped batches of 128 (the speed
 * does not depend on the data) and AdamW. */
enum { BATCH = 128 };

static td_batch synthetic_batch(void) {
    static float x[BATCH * 784];
    static int32_t y[BATCH];
    for (int i = 0; i < BATCH * 784; i++)
        x[i] = (float)td_rng_uniform(3, (uint64_t)i);
    for (int i = 0; i < BATCH; i++)
        y[i] = i % 10;
    return (td_batch){BATCH, x, NULL, y};
}

static td_optimizer_config adamw(void) {
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    cfg.kind = TD_OPT_ADAMW;
    cfg.lr = 1e-3;
    return cfg;
}

/* Median samples/s of MNIST MLP training steps (forward, backward, AdamW) on
 * dev. */
static double train_samples_per_s(td_device *dev, int steps) {
    enum { WARM = 5 };
    td_batch b = synthetic_batch();
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = adamw();
    double *t = malloc((size_t)steps * sizeof *t), out = 0;
    if (!t || td_model_load_string(mlp_json, "mnist_mlp", dev, TD_F32, 1, &m) ||
        td_optimizer_create(m, &cfg, &opt))
        goto done;
    for (int s = 0; s < WARM + steps; s++) {
        td_step_result r;
        uint64_t t0 = td_clock_ns();
        if (td_model_train_step(m, &b, 1.0 / BATCH, 0, (uint64_t)s, &r) ||
            td_optimizer_step(opt, NULL) || td_device_sync(dev))
            goto done;
        if (s >= WARM)
            t[s - WARM] = (double)(td_clock_ns() - t0) / 1e9;
    }
    out = BATCH / td_bench_median(t, steps);
done:
    if (out == 0)
        fprintf(stderr, "training on %s: %s\n", td_device_name(dev), td_last_error());
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    free(t);
    return out;
}

/* The data strategy over a group spec: calibrated shares, kept adjusting. */
typedef struct dp_run {
    const char *spec;
    td_group *g;
    td_dp *dp;
    double sps[WINDOWS];
} dp_run;

/* Untimed steps before the windows. The balancer tries a parked member
 * again after 16 steps, then after twice as many each time, up to 1024: a
 * try of opencl:0.0 costs its fixed cost per pass, several milliseconds, and
 * in the first few hundred steps the tries took 5-9% of cpu:0's time. The
 * floor judges the group as a long run has it. */
#define SETTLE_STEPS 1100

static int dp_setup(dp_run *r) {
    td_batch b = synthetic_batch();
    td_dp_config cfg = TD_DP_CONFIG_INIT;
    td_optimizer_config opt = adamw();
    td_step_result res;
    int bad = td_group_create_spec(r->spec, NULL, &r->g) ||
              td_dp_create(r->g, mlp_json, "mnist_mlp", TD_F32, 1, &opt, &cfg, &r->dp) ||
              td_dp_calibrate(r->dp, &b);
    for (int s = 0; s < SETTLE_STEPS && !bad; s++)
        bad = td_dp_step(r->dp, &b, (uint64_t)s, &res, NULL) != TD_OK;
    if (bad)
        fprintf(stderr, "training on %s: %s\n", r->spec, td_last_error());
    return bad;
}

/* Window w: samples/s over `steps` steps' own time (median-free: the
 * windows' median is taken later). */
static int dp_window(dp_run *r, int w, int steps) {
    td_batch b = synthetic_batch();
    double busy = 0;
    for (int s = 0; s < steps; s++) {
        td_step_result res;
        td_step_stats st;
        if (td_dp_step(r->dp, &b, (uint64_t)s, &res, &st)) {
            fprintf(stderr, "training on %s: %s\n", r->spec, td_last_error());
            return 1;
        }
        busy += st.step_s;
    }
    r->sps[w] = BATCH * steps / busy;
    return 0;
}

static void dp_teardown(dp_run *r) {
    td_dp_destroy(r->dp);
    td_group_destroy(r->g);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7, steps = argc > 2 ? atoi(argv[2]) : 200;
    static const int64_t sizes[] = {256, 512, 1024};
    td_device_list *list = NULL;
    td_device *cpu, *cpu0, *ocl;
    td_device_info info;
    int pass = 1;
    if (reps < 1)
        reps = 1;
    if (steps < 1)
        steps = 1;
    if (td_devices_open("cpu,cpu:0,opencl:0.0", &list) != TD_OK) {
        printf("skipped: no OpenCL device (%s)\n", td_last_error());
        return 0;
    }
    cpu = td_device_list_get(list, 0);
    cpu0 = td_device_list_get(list, 1);
    ocl = td_device_list_get(list, 2);
    if (td_device_get_info(ocl, &info) == TD_OK)
        printf("opencl:0.0 is %s (%s, %d compute units)\n\n", info.model, info.vendor,
               info.compute_units);
    printf("GEMM (n, n) x (n, n), GFLOP/s, median of %d\n", reps);
    printf("%-5s %6s %12s %12s %12s %10s %10s\n", "dtype", "n", "cpu:0", "cpu", "opencl:0.0",
           "ocl/cpu:0", "ocl/cpu");
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            td_dtype dt = (td_dtype)d;
            double g0 = gemm_gflops(cpu0, dt, sizes[i], reps);
            double g1 = gemm_gflops(cpu, dt, sizes[i], reps);
            double go = gemm_gflops(ocl, dt, sizes[i], reps);
            printf("%-5s %6lld %12.1f %12.1f %12.1f %10.2f %10.2f\n", td_dtype_name(dt),
                   (long long)sizes[i], g0, g1, go, g0 > 0 ? go / g0 : 0, g1 > 0 ? go / g1 : 0);
        }
    printf("\nMNIST MLP training (batch 128, AdamW, f32), samples/s, median of %d steps\n", steps);
    {
        double s0 = train_samples_per_s(cpu0, steps), s1 = train_samples_per_s(cpu, steps);
        double so = train_samples_per_s(ocl, steps);
        printf("%-12s %12s\n", "device", "samples/s");
        printf("%-12s %12.0f\n", "cpu:0", s0);
        printf("%-12s %12.0f\n", "cpu", s1);
        printf("%-12s %12.0f   (%.2fx cpu:0, %.2fx cpu)\n", "opencl:0.0", so, s0 > 0 ? so / s0 : 0,
               s1 > 0 ? so / s1 : 0);
        /* The group must not be slower than its fastest member alone: both
         * run the data strategy, taking turns window by window. */
        {
            dp_run runs[2] = {{"cpu:0", NULL, NULL, {0}}, {"cpu:0,opencl:0.0", NULL, NULL, {0}}};
            int bad = dp_setup(&runs[0]) || dp_setup(&runs[1]);
            for (int w = 0; w < WINDOWS && !bad; w++)
                for (int k = 0; k < 2 && !bad; k++)
                    bad = dp_window(&runs[k], w, steps / WINDOWS + 1);
            if (!bad) {
                double alone = td_bench_median(runs[0].sps, WINDOWS),
                       mixed = td_bench_median(runs[1].sps, WINDOWS);
                double best = alone > so ? alone : so;
                int parked = td_balancer_parked(td_dp_balancer(runs[1].dp), 1);
                printf("\ndata strategy, medians of %d windows taking turns:\n", WINDOWS);
                printf("%-20s %12.0f\n", "cpu:0", alone);
                printf("%-20s %12.0f   (%.2fx its fastest member alone; opencl:0.0 %s)\n",
                       "cpu:0 + opencl:0.0", mixed, mixed / best,
                       parked ? "parked: its fixed cost per pass exceeds cpu:0's step"
                              : "takes a share");
                pass = mixed / best >= 0.95;
                printf("floor: the mixed group is not slower than its fastest member alone "
                       "(%.2fx >= 0.95x, run-to-run noise): %s\n",
                       mixed / best, pass ? "PASS" : "FAIL");
            }
            dp_teardown(&runs[0]);
            dp_teardown(&runs[1]);
        }
    }
    td_device_list_destroy(list);
    return pass ? 0 : 1;
}
