/* The `data` strategy's speed: MNIST MLP and LeNet-5 training samples/s on
 * one device of one core and on two devices of one core each (scaling
 * efficiency = speed-up / 2), on two devices with one slowed 3x against the
 * ideal (the work at the sum of the two devices' speeds, each measured
 * alone), the share of the slowed pair's step spent reducing (the slowest
 * member's), and the share of the gradient reduction hidden behind
 * backward when two devices overlap it (CPU devices do not by default: see
 * specs below); prints the floors and whether they hold. It also runs the
 * two pairs with nothing between their devices (at_once below), which tells
 * what of a floor's shortfall is the machine's and what the strategy's.
 *
 * Cores can change pace for seconds to a minute at a time (a virtual
 * machine's where the host runs them), so one measurement can land in a
 * bad spell. The bench therefore makes several runs, one after another,
 * each of rounds in which every configuration of every model takes a timed
 * window in turn; a run's ratios come from the medians of its own windows,
 * and the floors judge the median of the runs' ratios.
 *
 * The slowed-device floor judges the balancing: how near the split of each
 * batch keeps two unequal devices to the sum of their speeds. What a step
 * pays beyond its compute whatever the split (the reduction of the
 * gradients, the optimizer's update on every replica) is a fixed part of
 * the step, and it should be small beside the compute, as it is for
 * LeNet-5 at batch 128 (about 0.07 of 10 ms). The MLP's 0.94 MB of
 * gradients take 60 to 300 us to reduce between two cores of this machine
 * (the range is where the host places the two virtual CPUs) and its update
 * about 0.1 ms: 10 to 40% of a 1 ms step at batch 128, about 5% of the
 * slowed pair's 5 ms step at batch 512, which leaves 5% for the two cores'
 * pace varying from step to step (10-15% here), and about 2% at batch 1024.
 * So the MLP carries the slowed-device floor at batch 1024, and batches 128
 * and 512 are reported without floors.
 *
 * The two-device configurations run twice, the optimizer replicated (the
 * default) and with ZeRO-1; the exit status follows the default's floors.
 *
 * --quick is a smoke run (the tests run it, under the sanitizers too): every
 * configuration of the MLP at batch 128 and of LeNet-5, one window of a few
 * steps each, no floors judged.
 *
 *   bench_data_parallel [--data DIR] [--examples DIR] [--steps N] [--runs N] [--quick]
 *                       [--verbose]
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/bench.h"
#include "tandem/tandem.h"

#define MAX_RUNS    16
#define RUN_WINDOWS 5 /* timed windows per configuration and run */
#define MAX_WINDOWS (MAX_RUNS * RUN_WINDOWS)
#define NCONFIGS    7

static int verbose; /* --verbose: each window's last step, member by member */

typedef struct bench_opts {
    const char *data, *examples;
    int steps;       /* at least, per timed window */
    double window_s; /* about, per timed window */
    int windows;     /* timed windows per configuration and run, at most RUN_WINDOWS */
    int runs;        /* at most MAX_RUNS */
} bench_opts;

/* One configuration under test: a group with a replica on each member. */
typedef struct config {
    const char *spec;
    int zero;    /* ZeRO-1 */
    int overlap; /* td_dp_config.overlap: -1 the default (off for CPU devices), 1 forced on */
    td_group *g;
    td_dp *dp;
    int steps;               /* per timed window */
    double sps[MAX_WINDOWS]; /* samples/s per timed window */
    double hidden[MAX_WINDOWS];
    double comm[MAX_WINDOWS];   /* the longest member's reduction time over the step time */
    double reduce[MAX_WINDOWS]; /* the shortest member's reduction time (no wait in it), s */
    /* Where a step's time went, s per step (window means): the longest
     * member's forward and backward, how much sooner the shortest one's
     * ended (the wait at the reduction), the longest update, and what is
     * left of the step beyond those and `reduce` (the hand-offs between the
     * caller and the members, the step's numbers exchanged). */
    double compute[MAX_WINDOWS], gap[MAX_WINDOWS], update[MAX_WINDOWS], rest[MAX_WINDOWS];
} config;

/* The loader's next whole batch: an epoch's short last batch (and the empty
 * one that ends an epoch) are skipped. */
static int next_full_batch(td_loader *loader, int64_t batch, td_batch *b) {
    for (int tries = 0; tries < 3; tries++) {
        if (td_loader_next(loader, b) != TD_OK)
            return 1;
        if (b->n == batch)
            return 0;
    }
    return 1;
}

#define SETTLE_STEPS 10

/* Creates the group and replicas, calibrates, and lets the shares settle.
 * A window gets at least min_steps steps and about window_s seconds, so that
 * one stretched step (this machine's virtual CPUs stall now and then) weighs
 * little. */
static int setup(config *c, const char *json, int64_t batch, td_loader *loader, int min_steps,
                 double window_s) {
    td_dp_config cfg = TD_DP_CONFIG_INIT;
    td_optimizer_config opt = TD_OPTIMIZER_CONFIG_INIT;
    td_batch b;
    td_step_result r;
    double t[SETTLE_STEPS];
    opt.lr = 0.05;
    cfg.zero = c->zero;
    cfg.overlap = c->overlap;
    if (c->overlap > 0) {
        /* Several buckets, so that there is something to start during
         * backward: at the defaults each model's gradients make one. */
        cfg.first_bucket_bytes = 16u << 10;
        cfg.bucket_bytes = 64u << 10;
    }
    if (td_group_create_spec(c->spec, NULL, &c->g) != TD_OK ||
        td_dp_create(c->g, json, "model", TD_F32, 1, &opt, &cfg, &c->dp) != TD_OK ||
        next_full_batch(loader, batch, &b) || td_dp_calibrate(c->dp, &b) != TD_OK)
        return 1;
    for (int s = 0; s < SETTLE_STEPS; s++) {
        uint64_t t0;
        if (next_full_batch(loader, batch, &b))
            return 1;
        t0 = td_clock_ns();
        if (td_dp_step(c->dp, &b, 0, &r, NULL) != TD_OK)
            return 1;
        t[s] = (double)(td_clock_ns() - t0) * 1e-9;
    }
    c->steps = (int)ceil(window_s / td_bench_median(t, SETTLE_STEPS));
    if (c->steps < min_steps)
        c->steps = min_steps;
    return 0;
}

/* The shortest and longest of a step's members' reduction times: the
 * shortest has no waiting for the others in it. */
static void comm_range(const td_step_stats *s, double *least, double *most) {
    *least = INFINITY;
    *most = 0;
    for (int i = 0; i < s->members; i++) {
        *least = fmin(*least, s->m[i].comm_s);
        *most = fmax(*most, s->m[i].comm_s);
    }
}

/* What one timed window measured. */
typedef struct window_stats {
    double sps, hidden, comm, reduce, compute, gap, update, rest; /* as in config */
} window_stats;

/* A step's part of the window's breakdown (config.compute to rest), added
 * to sum[0..3]; members that sat the step out are left out. */
static void add_breakdown(const td_step_stats *s, double least_comm, double sum[4]) {
    double longest = 0, shortest = INFINITY, update = 0;
    for (int i = 0; i < s->members; i++) {
        if (s->m[i].parked)
            continue;
        longest = fmax(longest, s->m[i].compute_s);
        shortest = fmin(shortest, s->m[i].compute_s);
        update = fmax(update, s->m[i].update_s);
    }
    sum[0] += longest;
    sum[1] += longest - shortest;
    sum[2] += update;
    sum[3] += fmax(0.0, s->step_s - longest - least_comm - update);
}

/* One timed window of `steps` steps: samples over the time spent in the
 * steps. The loader's time is left out: it is the same serial work on the
 * caller's thread whatever the devices, and a trainer overlaps it. An
 * untimed step comes first, since the group's threads and caches have
 * idled while the other configurations ran. */
static int measure(const config *c, int w, int64_t batch, td_loader *loader, window_stats *out) {
    uint64_t busy = 0;
    int64_t samples = 0;
    double hsum = 0, csum = 0, rsum = 0, parts[4] = {0, 0, 0, 0};
    td_batch b;
    td_step_result r;
    td_step_stats stats;
    if (next_full_batch(loader, batch, &b) || td_dp_step(c->dp, &b, 0, &r, NULL) != TD_OK)
        return 1;
    for (int s = 0; s < c->steps; s++) {
        double least, most;
        uint64_t t0;
        if (next_full_batch(loader, batch, &b))
            return 1;
        t0 = td_clock_ns();
        if (td_dp_step(c->dp, &b, (uint64_t)s, &r, &stats) != TD_OK)
            return 1;
        busy += td_clock_ns() - t0;
        samples += b.n;
        hsum += stats.hidden_fraction;
        comm_range(&stats, &least, &most);
        csum += most / stats.step_s;
        rsum += least;
        add_breakdown(&stats, least, parts);
    }
    out->sps = (double)samples / ((double)busy * 1e-9);
    if (verbose) {
        /* The window's last step, member by member, in milliseconds. */
        fprintf(stderr, "%s%s window %d: %.0f samples/s;", c->spec, c->zero ? " ZeRO-1" : "", w,
                out->sps);
        for (int i = 0; i < stats.members; i++)
            fprintf(stderr, " [%lld samples, compute %.2f, comm %.2f, wait %.2f]",
                    (long long)stats.m[i].samples, stats.m[i].compute_s * 1e3,
                    stats.m[i].comm_s * 1e3, stats.m[i].wait_s * 1e3);
        fprintf(stderr, "\n");
    }
    out->hidden = hsum / c->steps;
    out->comm = csum / c->steps;
    out->reduce = rsum / c->steps;
    out->compute = parts[0] / c->steps;
    out->gap = parts[1] / c->steps;
    out->update = parts[2] / c->steps;
    out->rest = parts[3] / c->steps;
    return 0;
}

/* A timed window recorded as the configuration's window w. */
static int window(config *c, int w, int64_t batch, td_loader *loader) {
    window_stats s;
    if (measure(c, w, batch, loader, &s))
        return 1;
    c->sps[w] = s.sps;
    c->hidden[w] = s.hidden;
    c->comm[w] = s.comm;
    c->reduce[w] = s.reduce;
    c->compute[w] = s.compute;
    c->gap[w] = s.gap;
    c->update[w] = s.update;
    c->rest[w] = s.rest;
    return 0;
}

static void teardown(config *c) {
    td_dp_destroy(c->dp);
    td_group_destroy(c->g);
}

/* Two devices working at once with nothing between them: one group, a
 * replica and optimizer of its own on each member, each step a td_group_run
 * in which every member trains its slice of the batch and steps its own
 * optimizer, with no reduction. Each member times its own work, so the
 * window's speed is the sum of the members' speeds while both work: the
 * ideal for a pair of these devices on this machine, with the pair's
 * threads (one caller polling, a thread per device). */
typedef struct at_once {
    td_group *g;
    td_model *m[2];
    td_optimizer *opt[2];
    const char *json;
    td_batch b;
    int64_t n[2];     /* the step's samples per member */
    int64_t features; /* floats per sample */
    uint64_t busy[2];
    int64_t samples[2];
    double sps[MAX_WINDOWS];
} at_once;

static td_status at_once_create(td_group *g, td_device *dev, int rank, int size, void *arg) {
    at_once *a = arg;
    td_optimizer_config opt = TD_OPTIMIZER_CONFIG_INIT;
    td_status st;
    (void)g, (void)size;
    opt.lr = 0.05;
    if ((st = td_model_load_string(a->json, "model", dev, TD_F32, 1, &a->m[rank])) != TD_OK)
        return st;
    return td_optimizer_create(a->m[rank], &opt, &a->opt[rank]);
}

static td_status at_once_step(td_group *g, td_device *dev, int rank, int size, void *arg) {
    at_once *a = arg;
    td_batch slice = a->b;
    td_step_result r;
    uint64_t t0 = td_clock_ns();
    td_status st;
    (void)g, (void)dev, (void)size;
    slice.n = a->n[rank];
    slice.x += (rank ? a->n[0] : 0) * a->features;
    slice.labels += rank ? a->n[0] : 0;
    if (slice.n == 0) /* a parked member */
        return TD_OK;
    if ((st = td_model_train_slice(a->m[rank], &slice, rank ? a->n[0] : 0, 1.0 / (double)a->b.n, 0,
                                   0, &r)) != TD_OK ||
        (st = td_optimizer_step(a->opt[rank], NULL)) != TD_OK)
        return st;
    a->busy[rank] += td_clock_ns() - t0;
    a->samples[rank] += slice.n;
    return TD_OK;
}

static int at_once_setup(at_once *a, const char *spec, const char *json) {
    int64_t shape[TD_MAX_DIMS];
    int dims;
    a->json = json;
    if (td_group_create_spec(spec, NULL, &a->g) != TD_OK ||
        td_group_run(a->g, at_once_create, a) != TD_OK)
        return 1;
    dims = td_model_input_shape(a->m[0], shape);
    a->features = 1;
    for (int d = 0; d < dims; d++)
        a->features *= shape[d];
    return 0;
}

static void at_once_teardown(at_once *a) {
    for (int r = 0; r < 2; r++) {
        td_optimizer_destroy(a->opt[r]);
        td_model_destroy(a->m[r]);
    }
    td_group_destroy(a->g);
}

/* A window of `steps` steps with `share1` of each batch on the second
 * member (after an untimed step, as in measure). */
static int at_once_window(at_once *a, int w, int steps, double share1, int64_t batch,
                          td_loader *loader) {
    for (int s = -1; s < steps; s++) {
        if (next_full_batch(loader, batch, &a->b))
            return 1;
        a->n[1] = (int64_t)llround(share1 * (double)batch);
        a->n[0] = batch - a->n[1];
        if (s == 0)
            memset(a->busy, 0, sizeof a->busy), memset(a->samples, 0, sizeof a->samples);
        if (td_group_run(a->g, at_once_step, a) != TD_OK)
            return 1;
    }
    a->sps[w] = 0;
    for (int r = 0; r < 2; r++)
        if (a->busy[r])
            a->sps[w] += (double)a->samples[r] / ((double)a->busy[r] * 1e-9);
    return 0;
}

/* One model's configurations, kept for the whole run, and each run's
 * ratios: [0] the optimizer replicated, [1] ZeRO-1. */
typedef struct model_bench {
    const char *name, *file;
    int64_t batch;
    double floor;   /* scaling efficiency, 0: reported only */
    int slow_floor; /* the slowed pair within 10% of the ideal; 0: reported only */
    int in_quick;   /* run by --quick: the other batches take the same paths */
    char *json;
    td_loader *loader;
    config cf[NCONFIGS];
    double eff[2][MAX_RUNS], vs_ideal[2][MAX_RUNS];
    double overlap_vs[MAX_RUNS]; /* cpu*2 with overlap forced on over cpu*2 without */
    /* [0] cpu*2 with half the batch each, [1] the slowed pair with its
     * shares, each device training on its own (at_once), and each run's
     * ratios against them: the two-device pair's speed over [0] and the
     * slowed pair's step time over [1]'s, for both optimizer modes. */
    at_once both[2];
    double vs_both[2][MAX_RUNS], vs_slowed_both[2][MAX_RUNS];
} model_bench;

/* 0: cpu:0 alone; 3: the slowed one alone; 1, 2 and 4, 5: two devices, and
 * two with one slowed, the optimizer replicated and then sharded (ZeRO-1);
 * 6: two devices with the reduction overlapped with backward, which CPU
 * devices do not do by default (it runs on the cores backward uses), forced
 * on to show what share of it hides and what that costs here. */
#define OVERLAPPED 6
static const char *const specs[NCONFIGS] = {"cpu:0",
                                            "cpu*2",
                                            "cpu:0,cpu:1{slowdown=3}",
                                            "cpu:1{slowdown=3}",
                                            "cpu*2",
                                            "cpu:0,cpu:1{slowdown=3}",
                                            "cpu*2"};

static int model_setup(model_bench *m, const bench_opts *o, td_dataset *train) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", o->examples, m->file);
    if (!(m->json = td_bench_slurp(path))) {
        fprintf(stderr, "bench: cannot read %s\n", path);
        return 1;
    }
    if (td_loader_create(train, m->batch, 7, 1, &m->loader) != TD_OK ||
        at_once_setup(&m->both[0], "cpu*2", m->json) ||
        at_once_setup(&m->both[1], "cpu:0,cpu:1{slowdown=3}", m->json))
        goto fail;
    for (int c = 0; c < NCONFIGS; c++) {
        m->cf[c].spec = specs[c];
        m->cf[c].zero = c == 4 || c == 5;
        m->cf[c].overlap = c == OVERLAPPED ? 1 : -1;
        if (setup(&m->cf[c], m->json, m->batch, m->loader, o->steps, o->window_s))
            goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "bench: %s: %s\n", m->name, td_last_error());
    return 1;
}

/* Run r: o->windows rounds, the configurations taking turns window by
 * window, and the run's ratios from the medians of its own windows. */
static int model_run(model_bench *m, const bench_opts *o, int r) {
    const int W = o->windows, first = r * W;
    for (int w = first; w < first + W; w++) {
        int bad = 0;
        for (int c = 0; c < NCONFIGS && !bad; c++)
            bad = window(&m->cf[c], w, m->batch, m->loader);
        if (bad || at_once_window(&m->both[0], w, m->cf[1].steps, 0.5, m->batch, m->loader) ||
            at_once_window(&m->both[1], w, m->cf[2].steps,
                           td_balancer_share(td_dp_balancer(m->cf[2].dp), 1), m->batch,
                           m->loader)) {
            fprintf(stderr, "bench: %s: %s\n", m->name, td_last_error());
            return 1;
        }
    }
    double one = td_bench_median(m->cf[0].sps + first, W);
    double ideal = one + td_bench_median(m->cf[3].sps + first, W);
    double both = td_bench_median(m->both[0].sps + first, W),
           slowed_both = td_bench_median(m->both[1].sps + first, W);
    for (int mode = 0; mode < 2; mode++) {
        double pair = td_bench_median(m->cf[mode ? 4 : 1].sps + first, W);
        double slowed = td_bench_median(m->cf[mode ? 5 : 2].sps + first, W);
        m->eff[mode][r] = pair / one / 2.0;
        m->vs_ideal[mode][r] = ideal / slowed;
        m->vs_both[mode][r] = pair / both;
        m->vs_slowed_both[mode][r] = slowed_both / slowed;
    }
    m->overlap_vs[r] = td_bench_median(m->cf[OVERLAPPED].sps + first, W) /
                       td_bench_median(m->cf[1].sps + first, W);
    return 0;
}

/* percent: 0.923 as 92.3%; else as a ratio, 1.07x. */
static void print_runs(const char *what, const double *v, int n, int percent) {
    printf("    %s, run by run:", what);
    for (int r = 0; r < n; r++)
        printf(percent ? " %.1f%%" : " %.2fx", percent ? 100 * v[r] : v[r]);
    printf("\n");
}

/* Where a configuration's steps went, medians of its windows, in ms. */
static void print_breakdown(const char *what, const config *c, int n) {
    printf("    %s's step, ms: compute %.3f, wait for the other member %.3f, reduction %.3f, "
           "update %.3f, the rest %.3f\n",
           what, 1e3 * td_bench_median(c->compute, n), 1e3 * td_bench_median(c->gap, n),
           1e3 * td_bench_median(c->reduce, n), 1e3 * td_bench_median(c->update, n),
           1e3 * td_bench_median(c->rest, n));
}

/* The table's rows and the floors; returns whether a judged floor failed. */
static int model_report(const model_bench *m, const bench_opts *o, int judge) {
    const config *cf = m->cf;
    const int n = o->runs * o->windows;
    double one = td_bench_median(cf[0].sps, n), slow_alone = td_bench_median(cf[3].sps, n);
    double both = td_bench_median(m->both[0].sps, n),
           slowed_both = td_bench_median(m->both[1].sps, n);
    int failed = 0;
    printf("%-8s %5lld at once, no communication: cpu*2 %.0f samples/s (%.1f%% of twice one "
           "device alone), the two-device pair at %.1f%% of that; cpu:0 and the slowed device "
           "%.0f, the slowed pair's step %.2fx that\n",
           m->name, (long long)m->batch, both, 100 * both / one / 2,
           100 * td_bench_median(m->vs_both[0], o->runs), slowed_both,
           td_bench_median(m->vs_slowed_both[0], o->runs));
    printf("%-8s %5lld overlap forced on cpu*2: %.0f%% of the reduction hidden behind backward, "
           "%.0f samples/s, %.3fx the default's\n",
           m->name, (long long)m->batch, 100 * td_bench_median(cf[OVERLAPPED].hidden, n),
           td_bench_median(cf[OVERLAPPED].sps, n), td_bench_median(m->overlap_vs, o->runs));
    for (int mode = 0; mode < 2; mode++) {
        const config *pair = &cf[mode ? 4 : 1], *slowed = &cf[mode ? 5 : 2];
        double eff = td_bench_median(m->eff[mode], o->runs),
               vs_ideal = td_bench_median(m->vs_ideal[mode], o->runs);
        const char *name = mode ? "ZeRO-1" : "replicated";
        int ok;
        printf("%-8s %5lld %-10s %9.0f %9.0f %6.1f%% | %9.0f %9.0f %9.0f %7.2fx %6.3f | %5.0f%% "
               "%6.0f\n",
               m->name, (long long)m->batch, name, one, td_bench_median(pair->sps, n), 100 * eff,
               slow_alone, one + slow_alone, td_bench_median(slowed->sps, n), vs_ideal,
               td_balancer_share(td_dp_balancer(slowed->dp), 1),
               100 * td_bench_median(slowed->comm, n), 1e6 * td_bench_median(pair->reduce, n));
        print_breakdown("two-device pair", pair, n);
        print_breakdown("slowed pair", slowed, n);
        if (o->runs > 1) {
            print_runs("efficiency", m->eff[mode], o->runs, 1);
            print_runs("slowed pair / ideal", m->vs_ideal[mode], o->runs, 0);
            print_runs("two-device pair / the same at once", m->vs_both[mode], o->runs, 1);
            print_runs("slowed pair / the same at once", m->vs_slowed_both[mode], o->runs, 0);
        }
        if (m->floor > 0) {
            ok = eff >= m->floor;
            printf("  floor: %s (batch %lld, %s) scaling efficiency %.2f%% >= %.0f%%: %s\n",
                   m->name, (long long)m->batch, name, 100 * eff, 100 * m->floor,
                   ok ? "PASS" : "FAIL");
            failed |= !ok && !mode && judge;
        }
        if (!m->slow_floor)
            continue;
        ok = vs_ideal <= 1.10;
        printf("  floor: %s (batch %lld, %s) with a 3x slowed device, step time %.3fx the "
               "ideal <= 1.10x: %s\n",
               m->name, (long long)m->batch, name, vs_ideal, ok ? "PASS" : "FAIL");
        failed |= !ok && !mode && judge;
    }
    return failed;
}

static void model_teardown(model_bench *m) {
    for (int c = 0; c < NCONFIGS; c++)
        teardown(&m->cf[c]);
    td_loader_destroy(m->loader);
    for (int k = 0; k < 2; k++)
        at_once_teardown(&m->both[k]);
    free(m->json);
}

int main(int argc, char **argv) {
    bench_opts o = {"data/mnist", "examples", 20, 0.25, RUN_WINDOWS, 5};
    /* Batches are made in place, between the timed steps: the loader's
     * prefetch thread would make the next one during a step, on a core a
     * device owns (MLP at batch 1024: 0.67 ms of a 5 ms step, on one member
     * only, so the other waited). */
    setenv("TANDEM_PREFETCH", "0", 1);
    model_bench models[] = {
        {.name = "MLP", .file = "mnist_mlp.json", .batch = 128, .in_quick = 1},
        {.name = "MLP", .file = "mnist_mlp.json", .batch = 512},
        {.name = "MLP", .file = "mnist_mlp.json", .batch = 1024, .slow_floor = 1},
        {.name = "LeNet-5",
         .file = "lenet5.json",
         .batch = 128,
         .floor = 0.90,
         .slow_floor = 1,
         .in_quick = 1}};
    int nmodels = (int)(sizeof models / sizeof *models);
    td_dataset *train = NULL, *test = NULL;
    int failed = 0, judge = 1, bad = 0, ready = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            o.data = argv[++i];
        else if (!strcmp(argv[i], "--examples") && i + 1 < argc)
            o.examples = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            o.runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            o.steps = 3, o.window_s = 0, o.windows = 1, o.runs = 1, judge = 0;
        else if (!strcmp(argv[i], "--verbose"))
            verbose = 1;
        else {
            fprintf(stderr, "usage: bench_data_parallel [--data DIR] [--examples DIR] [--steps N] "
                            "[--runs N] [--quick] [--verbose]\n");
            return 2;
        }
    }
    if (o.runs < 1 || o.runs > MAX_RUNS || o.steps < 1) {
        fprintf(stderr, "bench: --runs is from 1 to %d, --steps at least 1\n", MAX_RUNS);
        return 2;
    }
    if (td_mnist_open(o.data, &train, &test) != TD_OK) {
        fprintf(stderr, "bench: %s\n", td_last_error());
        return 1;
    }
    if (!judge) {
        int kept = 0;
        for (int k = 0; k < nmodels; k++)
            if (models[k].in_quick)
                models[kept++] = models[k];
        nmodels = kept;
        printf("--quick: a smoke run; the floors below are printed, not judged\n");
    }
    printf("data strategy on this machine's cores: %d runs, one after another, each of %d rounds\n"
           "in which every configuration of every model takes a window of %.2f s (at least %d\n"
           "steps) in turn, so the machine's drift hits all; speeds are medians of all windows,\n"
           "efficiency and step / ideal the medians of the runs' own ratios.\n"
           "ideal with one device slowed 3x: the sum of the two devices' speeds alone (the\n"
           "floor's); at once: the same two devices in one group, each training a replica of\n"
           "its own on its part of each batch with no communication, each timing its own\n"
           "work: what the two cores give when both work (reported, not judged);\n"
           "comm: the slowed pair's reduction time over its step time; reduce: the two-device\n"
           "pair's reduction in us, from the member that waited least (how quickly the devices\n"
           "reach each other during this run); overlap: the two-device pair again with its\n"
           "reduction started during backward, off by default on CPU devices;\n"
           "a pair's step, ms: the longest member's forward and backward, how much sooner the\n"
           "other's ended (its wait), the reduction (as reduce), the longest update, and the\n"
           "rest of the step (hand-offs, the step's numbers exchanged)\n\n",
           o.runs, o.windows, o.window_s, o.steps);
    for (; ready < nmodels && !bad; ready++)
        bad = model_setup(&models[ready], &o, train);
    for (int r = 0; r < o.runs && !bad; r++)
        for (int k = 0; k < nmodels && !bad; k++)
            bad = model_run(&models[k], &o, r);
    if (!bad) {
        printf("%-8s %5s %-10s %9s %9s %7s | %9s %9s %9s %8s %6s | %6s %6s\n", "model", "batch",
               "optimizer", "1 dev", "2 devs", "effic.", "slow alone", "ideal", "2, 1 slow",
               "vs ideal", "share", "comm", "reduce");
        for (int k = 0; k < nmodels; k++)
            failed |= model_report(&models[k], &o, judge);
    }
    for (int k = 0; k < ready; k++)
        model_teardown(&models[k]);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    return bad ? 1 : failed;
}
