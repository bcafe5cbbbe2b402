/* Shares follow measured speed: a device twice as fast gets twice the
 * samples, so unequal devices finish a step together. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tandem/parallel.h"

/* The long-run average a straggler is compared with moves this slowly, so a
 * sudden slowdown stands out against it for several steps. */
#define BASELINE_WEIGHT 0.05
/* A device is named once it has been slow this many steps in a row (one slow
 * step is noise: another process, a page fault), and once per episode. */
#define STRAGGLER_STEPS 3

struct td_balancer {
    int n;
    td_balancer_config cfg;
    double *speed;        /* samples per second, smoothed */
    double *baseline_tps; /* long-run seconds per sample; 0 until measured */
    int *slow_streak;     /* consecutive steps above the straggler ratio */
    char (*names)[32];
};

td_status td_balancer_create(int n, const char *const *names, const td_balancer_config *cfg,
                             td_balancer **out) {
    td_balancer_config def = TD_BALANCER_CONFIG_INIT;
    td_balancer *b;
    *out = NULL;
    if (n < 1)
        return td__error(TD_ERR_INVALID_ARG, "a balancer needs at least one device, not %d", n);
    if (cfg && (cfg->min_share < 0 || cfg->min_share * n > 1 || cfg->smoothing <= 0 ||
                cfg->smoothing > 1 || cfg->straggler_ratio <= 1))
        return td__error(TD_ERR_INVALID_ARG,
                         "balancer config: min_share %g (0 to 1/%d), smoothing %g (0 to 1], "
                         "straggler_ratio %g (> 1)",
                         cfg->min_share, n, cfg->smoothing, cfg->straggler_ratio);
    b = td__calloc(sizeof *b, "a balancer");
    if (!b)
        return TD_ERR_OUT_OF_MEMORY;
    b->n = n;
    b->cfg = cfg ? *cfg : def;
    b->speed = td__calloc(sizeof *b->speed * (size_t)n, "a balancer");
    b->baseline_tps = td__calloc(sizeof *b->baseline_tps * (size_t)n, "a balancer");
    b->names = td__calloc(sizeof *b->names * (size_t)n, "a balancer");
    b->slow_streak = td__calloc(sizeof *b->slow_streak * (size_t)n, "a balancer");
    if (!b->speed || !b->baseline_tps || !b->names || !b->slow_streak) {
        td_balancer_destroy(b);
        return TD_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        b->speed[i] = 1.0;
        if (names && names[i])
            snprintf(b->names[i], sizeof b->names[i], "%s", names[i]);
        else
            snprintf(b->names[i], sizeof b->names[i], "device %d", i);
    }
    *out = b;
    return TD_OK;
}

void td_balancer_destroy(td_balancer *b) {
    if (!b)
        return;
    free(b->speed);
    free(b->baseline_tps);
    free(b->slow_streak);
    free(b->names);
    free(b);
}

td_status td_balancer_set_speeds(td_balancer *b, const double *sps) {
    for (int i = 0; i < b->n; i++)
        if (!(sps[i] > 0) || !isfinite(sps[i]))
            return td__error(TD_ERR_INVALID_ARG, "balancer: %s has speed %g samples/s", b->names[i],
                             sps[i]);
    for (int i = 0; i < b->n; i++) {
        b->speed[i] = sps[i];
        b->baseline_tps[i] = 1.0 / sps[i];
    }
    return TD_OK;
}

static double total_speed(const td_balancer *b) {
    double s = 0;
    for (int i = 0; i < b->n; i++)
        s += b->speed[i];
    return s;
}

double td_balancer_share(const td_balancer *b, int i) {
    return i >= 0 && i < b->n ? b->speed[i] / total_speed(b) : 0.0;
}

double td_balancer_speed(const td_balancer *b, int i) {
    return i >= 0 && i < b->n ? b->speed[i] : 0.0;
}

double td_balancer_ideal_seconds(const td_balancer *b, int64_t total) {
    return (double)total / total_speed(b);
}

void td_balancer_split(const td_balancer *b, int64_t total, int64_t *counts) {
    int n = b->n;
    double sum = total_speed(b);
    int64_t floor_min = (int64_t)ceil(b->cfg.min_share * (double)total);
    int64_t given = 0;
    /* With room for every minimum, the minimums come first and the rest is
     * shared by speed; otherwise plain proportions. */
    int use_min = floor_min * n <= total && floor_min > 0;
    int64_t rest = use_min ? total - floor_min * n : total;
    double *frac = malloc(sizeof *frac * (size_t)n);
    for (int i = 0; i < n; i++) {
        double exact = (double)rest * b->speed[i] / sum;
        int64_t whole = (int64_t)floor(exact);
        counts[i] = whole + (use_min ? floor_min : 0);
        if (frac)
            frac[i] = exact - (double)whole;
        given += counts[i];
    }
    /* Largest remainders first; ties to the lower index. */
    while (given < total) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (frac && frac[i] > frac[best])
                best = i;
        counts[best]++;
        if (frac)
            frac[best] = -1.0;
        given++;
    }
    free(frac);
}

int td_balancer_observe(td_balancer *b, const int64_t *counts, const double *seconds, char *report,
                        size_t report_size) {
    int named = 0;
    size_t used = 0;
    if (report && report_size)
        report[0] = '\0';
    for (int i = 0; i < b->n; i++) {
        double tps, a = b->cfg.smoothing;
        if (counts[i] <= 0 || !(seconds[i] > 0))
            continue;
        tps = seconds[i] / (double)counts[i];
        b->speed[i] = (1 - a) * b->speed[i] + a * (1.0 / tps);
        if (b->baseline_tps[i] == 0) {
            b->baseline_tps[i] = tps;
            continue;
        }
        if (tps <= b->cfg.straggler_ratio * b->baseline_tps[i])
            b->slow_streak[i] = 0;
        else if (++b->slow_streak[i] == STRAGGLER_STEPS) {
            named++;
            if (report && used + 1 < report_size)
                used += (size_t)snprintf(report + used, report_size - used,
                                         "%s is a straggler: %.3g ms per sample, %.1fx its "
                                         "average of %.3g ms\n",
                                         b->names[i], tps * 1e3, tps / b->baseline_tps[i],
                                         b->baseline_tps[i] * 1e3);
        }
        b->baseline_tps[i] = (1 - BASELINE_WEIGHT) * b->baseline_tps[i] + BASELINE_WEIGHT * tps;
    }
    return named;
}
