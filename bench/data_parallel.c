/* The `data` strategy's speed: MNIST MLP and LeNet-5 training samples/s on
 * one device of one core and on two devices of one core each (scaling
 * efficiency = speed-up / 2), on two devices with one slowed 3x against the
 * ideal (total work / sum of the devices' speeds), and the share of the
 * gradient reduction hidden behind backward. Medians over several timed
 * windows; prints the floors and whether they hold.
 *
 *   bench_data_parallel [--data DIR] [--examples DIR] [--steps N] [--quick]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

#define WINDOWS 5

typedef struct bench_opts {
    const char *data, *examples;
    int steps; /* per timed window */
} bench_opts;

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

typedef struct run_result {
    double samples_per_s;   /* median over windows */
    double step_s, ideal_s; /* medians of the last window's steps */
    double hidden;          /* median hidden fraction */
    double share[2];
} run_result;

/* Trains `model` on `spec` with the data strategy: calibration, warm-up,
 * then WINDOWS timed windows of o->steps steps. */
static int run(const bench_opts *o, const char *json, const char *spec, int64_t batch,
               td_loader *loader, run_result *out) {
    td_group *g = NULL;
    td_dp *dp = NULL;
    td_dp_config cfg = TD_DP_CONFIG_INIT;
    td_optimizer_config opt = TD_OPTIMIZER_CONFIG_INIT;
    double sps[WINDOWS], hid[WINDOWS], steps[64], ideals[64];
    td_batch b;
    td_step_result r;
    td_dp_stats stats;
    int nsteps = o->steps < 64 ? o->steps : 64;
    opt.lr = 0.05;
    memset(out, 0, sizeof *out);
    if (td_group_create_spec(spec, NULL, &g) != TD_OK ||
        td_dp_create(g, json, "model", TD_F32, 1, &opt, &cfg, &dp) != TD_OK) {
        fprintf(stderr, "bench: %s: %s\n", spec, td_last_error());
        td_group_destroy(g);
        return 1;
    }
    if (td_loader_next(loader, &b) != TD_OK || b.n == 0 || td_dp_calibrate(dp, &b) != TD_OK)
        goto fail;
    for (int s = 0; s < 5; s++) /* warm-up: shares settle */
        if (td_loader_next(loader, &b) != TD_OK || td_dp_step(dp, &b, 0, &r, &stats) != TD_OK)
            goto fail;
    for (int w = 0; w < WINDOWS; w++) {
        uint64_t t0 = td_clock_ns();
        int64_t samples = 0;
        double hsum = 0;
        for (int s = 0; s < nsteps; s++) {
            if (td_loader_next(loader, &b) != TD_OK)
                goto fail;
            if (b.n < batch) /* an epoch's short last batch: take the next */
                if (td_loader_next(loader, &b) != TD_OK)
                    goto fail;
            if (td_dp_step(dp, &b, (uint64_t)s, &r, &stats) != TD_OK)
                goto fail;
            samples += b.n;
            hsum += stats.hidden_fraction;
            steps[s] = stats.step_s;
            ideals[s] = stats.ideal_s;
        }
        sps[w] = (double)samples / ((double)(td_clock_ns() - t0) * 1e-9);
        hid[w] = hsum / nsteps;
    }
    out->samples_per_s = median(sps, WINDOWS);
    out->hidden = median(hid, WINDOWS);
    out->step_s = median(steps, nsteps);
    out->ideal_s = median(ideals, nsteps);
    for (int i = 0; i < td_group_size(g) && i < 2; i++)
        out->share[i] = td_balancer_share(td_dp_balancer(dp), i);
    td_dp_destroy(dp);
    td_group_destroy(g);
    return 0;
fail:
    fprintf(stderr, "bench: %s: %s\n", spec, td_last_error());
    td_dp_destroy(dp);
    td_group_destroy(g);
    return 1;
}

int main(int argc, char **argv) {
    bench_opts o = {"data/mnist", "examples", 20};
    static const struct {
        const char *name, *file;
        int64_t batch;
        double floor;
    } models[] = {{"MLP", "mnist_mlp.json", 128, 0.0}, {"LeNet-5", "lenet5.json", 128, 0.90}};
    td_dataset *train = NULL, *test = NULL;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            o.data = argv[++i];
        else if (!strcmp(argv[i], "--examples") && i + 1 < argc)
            o.examples = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            o.steps = 6;
        else {
            fprintf(stderr, "usage: bench_data_parallel [--data DIR] [--examples DIR] [--steps N] "
                            "[--quick]\n");
            return 2;
        }
    }
    if (td_mnist_open(o.data, &train, &test) != TD_OK) {
        fprintf(stderr, "bench: %s\n", td_last_error());
        return 1;
    }
    printf(
        "data strategy on this machine's cores: samples/s, medians of %d windows of %d steps\n\n",
        WINDOWS, o.steps);
    printf("%-8s %12s %12s %9s %9s | %14s %9s %8s | %7s\n", "model", "1 dev", "2 devs", "speed-up",
           "effic.", "2 devs, 1 slow", "vs ideal", "share", "hidden");
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        char path[1024], *json;
        td_loader *loader = NULL;
        run_result one, two, slow;
        double eff, vs_ideal;
        snprintf(path, sizeof path, "%s/%s", o.examples, models[k].file);
        if (!(json = slurp(path))) {
            fprintf(stderr, "bench: cannot read %s\n", path);
            return 1;
        }
        if (td_loader_create(train, models[k].batch, 7, 1, &loader) != TD_OK ||
            run(&o, json, "cpu:0", models[k].batch, loader, &one) ||
            run(&o, json, "cpu*2", models[k].batch, loader, &two) ||
            run(&o, json, "cpu:0,cpu:1{slowdown=3}", models[k].batch, loader, &slow)) {
            fprintf(stderr, "bench: %s\n", td_last_error());
            return 1;
        }
        eff = two.samples_per_s / one.samples_per_s / 2.0;
        /* Ideal with one device slowed 3x: the two speeds add up. */
        vs_ideal = slow.step_s / slow.ideal_s;
        printf("%-8s %12.0f %12.0f %8.2fx %8.1f%% | %14.0f %8.2fx %8.3f | %6.0f%%\n",
               models[k].name, one.samples_per_s, two.samples_per_s, 2 * eff, 100 * eff,
               slow.samples_per_s, vs_ideal, slow.share[1], 100 * two.hidden);
        if (models[k].floor > 0) {
            int ok = eff >= models[k].floor;
            printf("  floor: %s scaling efficiency %.1f%% >= %.0f%%: %s\n", models[k].name,
                   100 * eff, 100 * models[k].floor, ok ? "PASS" : "FAIL");
            failed |= !ok;
        }
        {
            int ok = vs_ideal <= 1.10;
            printf("  floor: %s with a 3x slowed device, step time %.2fx the ideal <= 1.10x: %s\n",
                   models[k].name, vs_ideal, ok ? "PASS" : "FAIL");
            failed |= !ok;
        }
        td_loader_destroy(loader);
        free(json);
    }
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    return failed;
}
