/* Split-frame's speed: a training step of a plain conv net (the layers of
 * examples/shapes_cnn.json: four convolutions and three max-pools over one
 * 512x512 image, then a linear layer; batch 1, SGD, f32) on one CPU device
 * against the `spatial` strategy on two (each image's rows in two bands, halos
 * traded per convolution), and on two of which one runs three times slower
 * against the ideal: the work at the sum of the two devices' speeds, each
 * measured alone. Prints each member's compute, exchanges and halo time for
 * the last step, the halo exchange's share of the step (median over the
 * rounds), then the floors and whether they hold (exit status 1 when one
 * does not).
 *
 * Floors: spatial on two devices >= 1.6x one device; with one device
 * slowed 3x, within 1.15x of the ideal.
 *
 * Configurations take timed windows in turn, round after round, so a slow
 * spell of the machine falls on all of them; ratios come from medians.
 *
 *   bench_spatial [--rounds N] [--steps N] [--size PIXELS] [--quick]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/bench.h"
#include "tandem/tandem.h"

#define MAX_ROUNDS 16

enum { ONE, ONE_SLOWED, SPATIAL, SPATIAL_SLOWED, SPATIAL_ONE, NCONFIGS };

typedef struct config {
    const char *label, *devices, *strategy;
    td_group *g;
    td_strategy *s;
    double seconds[MAX_ROUNDS]; /* per step, each round */
    double halo[MAX_ROUNDS];    /* the halo exchange's share of the step, each round */
    td_step_stats last;
} config;

/* examples/shapes_cnn.json's layers on a size x size image. */
static void cnn_json(char *buf, size_t n, int size) {
    snprintf(buf, n,
             "{\"name\": \"bench_shapes_cnn\", \"input\": {\"shape\": [1, %d, %d]}, \"layers\": ["
             "{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 5, \"stride\": 2, \"padding\": 2},"
             "{\"type\": \"relu\"},"
             "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1},"
             "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 2},"
             "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1},"
             "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 2},"
             "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1},"
             "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 4},"
             "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]}",
             size, size);
}

static int fail(const char *what) {
    fprintf(stderr, "bench_spatial: %s: %s\n", what, td_last_error());
    return 1;
}

static const char *verdict(int quick, int pass) {
    return quick ? "" : pass ? ": PASS" : ": FAIL";
}

/* The halo exchange's share of a step: its slowest member's halo time. */
static double halo_share(const td_step_stats *st) {
    double most = 0;
    for (int k = 0; k < st->members; k++)
        most = fmax(most, st->m[k].halo_s);
    return st->step_s > 0 ? most / st->step_s : 0;
}

static int report(const config *cf, int rounds, int quick) {
    double t_one = td_bench_median(cf[ONE].seconds, rounds),
           t_slow = td_bench_median(cf[ONE_SLOWED].seconds, rounds);
    double ideal = 1.0 / (1.0 / t_one + 1.0 / t_slow);
    double speedup = t_one / td_bench_median(cf[SPATIAL].seconds, rounds);
    double vs_ideal = td_bench_median(cf[SPATIAL_SLOWED].seconds, rounds) / ideal;
    for (int c = SPATIAL; c <= SPATIAL_SLOWED; c++) {
        const td_step_stats *st = &cf[c].last;
        printf("\n%s, the last step (%.4f s): member by member\n", cf[c].label, st->step_s);
        printf("  %-8s %8s %10s %12s %10s %10s\n", "member", "share", "compute s", "exchanges s",
               "halo s", "wait s");
        for (int k = 0; k < st->members; k++)
            printf("  %-8d %7.1f%% %10.4f %12.4f %10.4f %10.4f\n", k, 100 * st->m[k].share,
                   st->m[k].compute_s, st->m[k].comm_s, st->m[k].halo_s, st->m[k].wait_s);
        printf("  the halo exchange's share of the step: %.1f%% (median over the rounds)\n",
               100 * td_bench_median(cf[c].halo, rounds));
    }
    printf("\nspatial speed-up on 2 devices at batch 1: %.2fx (floor 1.6x)%s\n", speedup,
           verdict(quick, speedup >= 1.6));
    printf("spatial with cpu:1 slowed 3x / ideal at batch 1: %.3fx (floor 1.15x)%s\n", vs_ideal,
           verdict(quick, vs_ideal <= 1.15));
    return quick || (speedup >= 1.6 && vs_ideal <= 1.15);
}

/* One disc on a dark image, label 0. */
static float *disc_image(int size) {
    float *x = calloc((size_t)size * (size_t)size, sizeof *x);
    double c = size / 2.0, r = size / 4.0;
    for (int i = 0; x && i < size; i++)
        for (int j = 0; j < size; j++)
            x[(size_t)i * (size_t)size + (size_t)j] =
                (i - c) * (i - c) + (j - c) * (j - c) < r * r ? 1.0f : 0.0f;
    return x;
}

int main(int argc, char **argv) {
    int rounds = 5, steps = 6, quick = 0, size = 512, ok;
    char json[4096];
#define CONFIG(dev, strat) {.label = strat " on " dev, .devices = dev, .strategy = strat}
    config cf[NCONFIGS] = {
        [ONE] = CONFIG("cpu:0", "single"),
        [ONE_SLOWED] = CONFIG("cpu:1{slowdown=3}", "single"),
        [SPATIAL] = CONFIG("cpu*2", "spatial"),
        [SPATIAL_SLOWED] = CONFIG("cpu:0,cpu:1{slowdown=3}", "spatial"),
        /* one band: what the band machinery costs beside a plain step */
        [SPATIAL_ONE] = CONFIG("cpu:0", "spatial"),
    };
#undef CONFIG
    int32_t label = 0;
    float *x;
    td_batch b1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: bench_spatial [--rounds N] [--steps N] [--size PIXELS] "
                            "[--quick]\n");
            return 2;
        }
    }
    if (quick) /* a smoke run: every configuration and line, a 128x128 image (at 64 the last pool's
                  2 rows give a quarter band none) */
        size = 128, rounds = 1, steps = 1;
    if (rounds < 1 || rounds > MAX_ROUNDS || steps < 1 || size < 64) {
        fprintf(stderr, "bench_spatial: --rounds 1..%d, --steps >= 1, --size >= 64\n", MAX_ROUNDS);
        return 2;
    }
    cnn_json(json, sizeof json, size);
    if (!(x = disc_image(size)))
        return fail("an image");
    b1 = (td_batch){1, x, NULL, &label};
    printf("conv net (examples/shapes_cnn.json's layers) on one %dx%d image: batch 1, f32, SGD; "
           "%d rounds of %d steps\n",
           size, size, rounds, steps);
    for (int c = 0; c < NCONFIGS; c++) {
        td_strategy_config sc = TD_STRATEGY_CONFIG_INIT;
        td_step_result r;
        char plan[2048];
        sc.name = cf[c].strategy;
        sc.opt.lr = 1e-3;
        sc.batch = 1;
        if (td_group_create_spec(cf[c].devices, NULL, &cf[c].g) != TD_OK)
            return fail(cf[c].devices);
        if (td_strategy_create(cf[c].g, json, "bench_shapes_cnn", &sc, &cf[c].s) != TD_OK)
            return fail(cf[c].label);
        if (td_strategy_step(cf[c].s, &b1, 0, &r, NULL) != TD_OK) /* warm-up */
            return fail(cf[c].label);
        printf("%s:\n%s", cf[c].label, td_strategy_plan(cf[c].s, plan, sizeof plan));
    }
    for (int round = 0; round < rounds; round++)
        for (int c = 0; c < NCONFIGS; c++) {
            td_step_result r;
            double halo = 0;
            uint64_t t0 = td_clock_ns();
            for (int s = 0; s < steps; s++) {
                if (td_strategy_step(cf[c].s, &b1, (uint64_t)s, &r, &cf[c].last) != TD_OK)
                    return fail(cf[c].label);
                halo += halo_share(&cf[c].last);
            }
            cf[c].seconds[round] = (double)(td_clock_ns() - t0) * 1e-9 / steps;
            cf[c].halo[round] = halo / steps;
        }
    printf("\n%-46s %12s\n", "configuration", "s per step");
    for (int c = 0; c < NCONFIGS; c++)
        printf("%-46s %12.4f\n", cf[c].label, td_bench_median(cf[c].seconds, rounds));
    ok = report(cf, rounds, quick);
    for (int c = 0; c < NCONFIGS; c++) {
        td_strategy_destroy(cf[c].s);
        td_group_destroy(cf[c].g);
    }
    free(x);
    return ok ? 0 : 1;
}
