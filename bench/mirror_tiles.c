/* The mirror and tiles strategies' costs, on devices of one core.
 *
 * mirror: LeNet-5 training steps at batch 128 under `mirror` on cpu*2,
 * against `single` on cpu:0 and against two `single`s at once, one on
 * cpu:0 and one on cpu:1, each on its own thread with nothing between them
 * (the duplicated compute with what two busy cores cost each other, and
 * nothing of mirror's). Mirror over the two at once is mirror's own cost:
 * the digests of the gradients, the comparison and the members' hand-offs.
 * Floor: at most 1.10x. Mirror over one device alone is printed beside it,
 * and the digests' share of the step from the members' stats.
 *
 * tiles: evaluation of a conv net on 2 images of 3x256x256 in a grid of
 * 8x8 tiles, on cpu:0 alone, on cpu:1{slowdown=3} alone and on the pair;
 * the ideal is the work at the sum of the two speeds, 1 / (1/t0 + 1/t1).
 * Floor: the pair within 1.10x of the ideal.
 *
 * Cores change pace for seconds at a time on a virtual machine, so each
 * configuration takes a timed window in turn, several rounds, and the
 * floors judge the medians.
 *
 *   bench_mirror_tiles [--examples DIR] [--rounds N] [--quick]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/bench.h"
#include "tandem/tandem.h"

#define MAX_ROUNDS 32

/* 3x256x256 -> conv 16 -> conv 16 -> pool -> conv 16 -> pool: a 16x64x64 map, then a classifier */
static const char *conv_json =
    "{\"name\": \"bench_tiles\", \"input\": {\"shape\": [3, 256, 256]}, \"layers\": ["
    "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    "{\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"conv2d\", \"out\": 16, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    "{\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]}";

/* A batch of n samples of `features` values (uniform in [0, 1)) and labels below classes. */
static td_batch random_batch(int64_t n, int64_t features, int classes, float **x, int32_t **y) {
    uint64_t r = 88172645463325252ull;
    *x = malloc(sizeof **x * (size_t)(n * features));
    *y = malloc(sizeof **y * (size_t)n);
    for (int64_t i = 0; *x && i < n * features; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        (*x)[i] = (float)(r >> 40) / (float)(1 << 24);
    }
    for (int64_t i = 0; *y && i < n; i++)
        (*y)[i] = (int32_t)(i % classes);
    return (td_batch){n, *x, NULL, *y};
}

/* A strategy `name` over spec for json. */
typedef struct setup {
    const char *name, *spec, *options;
    td_group *g;
    td_strategy *s;
    double t[MAX_ROUNDS]; /* seconds per step or evaluation, per window */
    double digest[MAX_ROUNDS];
} setup;

static int make(setup *c, const char *json, int64_t batch) {
    td_strategy_config cfg = TD_STRATEGY_CONFIG_INIT;
    td_status st;
    cfg.name = c->name;
    cfg.options = c->options;
    cfg.batch = batch;
    cfg.opt.lr = 0.01;
    if ((st = td_group_create_spec(c->spec, NULL, &c->g)) == TD_OK)
        st = td_strategy_create(c->g, json, "bench", &cfg, &c->s);
    if (st != TD_OK)
        fprintf(stderr, "bench_mirror_tiles: %s on %s: %s\n", c->name, c->spec, td_last_error());
    return st != TD_OK;
}

static void unmake(setup *c) {
    td_strategy_destroy(c->s);
    td_group_destroy(c->g);
}

/* A window of `steps` training steps: seconds a step, and the digest's share. */
static int train_window(setup *c, const td_batch *b, int steps, int round) {
    td_step_result r;
    td_step_stats stats;
    double digest = 0;
    uint64_t t0 = td_clock_ns();
    for (int k = 0; k < steps; k++) {
        if (td_strategy_step(c->s, b, (uint64_t)k, &r, &stats) != TD_OK) {
            fprintf(stderr, "bench_mirror_tiles: %s: %s\n", c->name, td_last_error());
            return 1;
        }
        digest += stats.m[0].comm_s / stats.step_s;
    }
    c->t[round] = (double)(td_clock_ns() - t0) * 1e-9 / steps;
    c->digest[round] = digest / steps;
    return 0;
}

static int eval_window(setup *c, const td_batch *b, int evals, int round) {
    td_step_result r;
    uint64_t t0 = td_clock_ns();
    for (int k = 0; k < evals; k++)
        if (td_strategy_evaluate(c->s, b, 1, &r) != TD_OK) {
            fprintf(stderr, "bench_mirror_tiles: %s: %s\n", c->name, td_last_error());
            return 1;
        }
    c->t[round] = (double)(td_clock_ns() - t0) * 1e-9 / evals;
    return 0;
}

typedef struct window_args {
    setup *c;
    const td_batch *b;
    int steps, round, bad;
} window_args;

static void *window_thread(void *arg) {
    window_args *a = arg;
    a->bad = train_window(a->c, a->b, a->steps, a->round);
    return NULL;
}

/* A window of c[0] and c[1] training at once, each on a thread of its own;
 * *t the later one's seconds a step. */
static int at_once(setup *c, const td_batch *b, int steps, int round, double *t) {
    window_args a[2] = {{&c[0], b, steps, round, 0}, {&c[1], b, steps, round, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&th[i], NULL, window_thread, &a[i]))
            return 1;
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    *t = c[0].t[round] > c[1].t[round] ? c[0].t[round] : c[1].t[round];
    return a[0].bad || a[1].bad;
}

static int bench_mirror(const char *examples, int rounds, int steps, int judge) {
    char path[1024], *json;
    setup c[4] = {{.name = "single", .spec = "cpu:0"},
                  {.name = "mirror", .spec = "cpu*2"},
                  {.name = "single", .spec = "cpu:0"},
                  {.name = "single", .spec = "cpu:1"}};
    float *x;
    int32_t *y;
    td_batch b;
    double ratio[MAX_ROUNDS], alone[MAX_ROUNDS], both[MAX_ROUNDS], med;
    int bad = 0;
    snprintf(path, sizeof path, "%s/lenet5.json", examples);
    if (!(json = td_bench_slurp(path))) {
        fprintf(stderr, "bench_mirror_tiles: cannot read %s\n", path);
        return 1;
    }
    b = random_batch(128, 28 * 28, 10, &x, &y);
    for (int i = 0; i < 4 && !bad; i++)
        bad = make(&c[i], json, 128) || train_window(&c[i], &b, 3, 0); /* warm-up */
    for (int r = 0; r < rounds && !bad; r++) {
        bad = train_window(&c[0], &b, steps, r) || train_window(&c[1], &b, steps, r) ||
              at_once(&c[2], &b, steps, r, &both[r]);
        ratio[r] = c[1].t[r] / both[r];
        alone[r] = c[1].t[r] / c[0].t[r];
    }
    if (!bad) {
        med = td_bench_median(ratio, rounds);
        printf("mirror, LeNet-5 at batch 128, a step: single cpu:0 %.2f ms, two singles at once "
               "(cpu:0, cpu:1) %.2f ms, mirror cpu*2 %.2f ms; digests and comparison %.2f%% of "
               "mirror's step\n",
               1e3 * td_bench_median(c[0].t, rounds), 1e3 * td_bench_median(both, rounds),
               1e3 * td_bench_median(c[1].t, rounds), 100 * td_bench_median(c[1].digest, rounds));
        printf("  mirror over one device alone: %.3fx (no floor: two busy cores)\n",
               td_bench_median(alone, rounds));
        printf("  mirror over two devices at once: %.3fx (floor <= 1.10x): %s\n", med,
               !judge        ? "not judged (--quick)"
               : med <= 1.10 ? "PASS"
                             : "FAIL");
        bad = judge && med > 1.10;
    }
    for (int i = 0; i < 4; i++)
        unmake(&c[i]);
    free(json);
    free(x);
    free(y);
    return bad;
}

static int bench_tiles(int rounds, int evals, int judge) {
    setup c[3] = {{.name = "tiles", .spec = "cpu:0", .options = "grid=8"},
                  {.name = "tiles", .spec = "cpu:1{slowdown=3}", .options = "grid=8"},
                  {.name = "tiles", .spec = "cpu:0,cpu:1{slowdown=3}", .options = "grid=8"}};
    float *x;
    int32_t *y;
    td_batch b = random_batch(2, 3 * 256 * 256, 10, &x, &y);
    double ratio[MAX_ROUNDS], med;
    int bad = 0;
    for (int i = 0; i < 3 && !bad; i++)
        bad = make(&c[i], conv_json, 2) || eval_window(&c[i], &b, 1, 0); /* warm-up */
    for (int r = 0; r < rounds && !bad; r++) {
        for (int i = 0; i < 3 && !bad; i++)
            bad = eval_window(&c[i], &b, evals, r);
        ratio[r] = c[2].t[r] * (1 / c[0].t[r] + 1 / c[1].t[r]);
    }
    if (!bad) {
        td_strategy_report words;
        td_run_figures none = {0};
        med = td_bench_median(ratio, rounds);
        td_strategy_report_make(c[2].s, &none, &words);
        printf("tiles, 2 images of 3x256x256 in 8x8 tiles: cpu:0 alone %.1f ms, "
               "cpu:1{slowdown=3} alone %.1f ms, the pair %.1f ms\n  %s\n",
               1e3 * td_bench_median(c[0].t, rounds), 1e3 * td_bench_median(c[1].t, rounds),
               1e3 * td_bench_median(c[2].t, rounds), words.note);
        printf("  tiles on the unequal pair over the ideal: %.3fx (floor <= 1.10x): %s\n", med,
               !judge        ? "not judged (--quick)"
               : med <= 1.10 ? "PASS"
                             : "FAIL");
        bad = judge && med > 1.10;
    }
    for (int i = 0; i < 3; i++)
        unmake(&c[i]);
    free(x);
    free(y);
    return bad;
}

int main(int argc, char **argv) {
    const char *examples = "examples";
    int rounds = 7, quick = 0, bad;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--examples") && i + 1 < argc)
            examples = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: bench_mirror_tiles [--examples DIR] [--rounds N] [--quick]\n");
            return 2;
        }
    }
    if (quick)
        rounds = 1;
    rounds = rounds < 1 ? 1 : rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
    bad = bench_mirror(examples, rounds, quick ? 2 : 20, !quick);
    bad |= bench_tiles(rounds, quick ? 1 : 3, !quick);
    return bad;
}
