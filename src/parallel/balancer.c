/* Shares follow measured cost. Each device's time for n samples is modelled
 * as fixed + per_sample * n: the fixed part is what a pass costs whatever its
 * size (kernel launches, packing the weights, a driver's per-call overhead),
 * and it is why a device twice as fast per sample does not always deserve
 * twice the samples. The split is the one that makes the devices finish
 * together (water filling); a device whose fixed cost alone exceeds the step
 * the others reach would only slow the group, and is parked. */
#include <assert.h>
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
/* A parked device comes back only when that shortens the step by this much:
 * coming back costs a copy of the weights, and its estimate is old. */
#define UNPARK_GAIN 0.10
/* A parked device is tried again with a few samples after this many steps,
 * then after twice as many each time it stays parked, up to PROBE_MAX: its
 * costs were measured once and may have been noise, or may have changed. */
#define PROBE_FIRST 16
#define PROBE_MAX   1024
/* Shares are reported for a batch of this many samples until a split says
 * which batch size is in use. */
#define REFERENCE_BATCH 256

struct td_balancer {
    int n;
    td_balancer_config cfg;
    double *fixed, *per_sample; /* seconds, as measured (calibration or set) */
    double *scale;              /* current cost / measured cost, smoothed */
    double *baseline;           /* long-run scale, for stragglers; 0 until observed */
    double (*recent)[2];        /* the two observations before the last, 0: none */
    int *slow_streak;           /* consecutive steps above the straggler ratio */
    unsigned char *parked;
    unsigned char *probing; /* unparked for one step to be measured again */
    int *park_steps;        /* steps parked since parked or last tried */
    int *probe_every;
    int64_t last_total; /* batch size of the last split */
    char (*names)[32];
};

td_status td_balancer_create(int n, const char *const *names, const td_balancer_config *cfg,
                             td_balancer **out) {
    td_balancer_config def = TD_BALANCER_CONFIG_INIT;
    td_balancer *b;
    *out = NULL;
    if (n < 1 || n > TD_BALANCER_MAX_DEVICES)
        return td__error(TD_ERR_INVALID_ARG, "a balancer takes 1 to %d devices, not %d",
                         TD_BALANCER_MAX_DEVICES, n);
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
    b->last_total = REFERENCE_BATCH;
    b->fixed = td__calloc(sizeof *b->fixed * (size_t)n, "a balancer");
    b->per_sample = td__calloc(sizeof *b->per_sample * (size_t)n, "a balancer");
    b->scale = td__calloc(sizeof *b->scale * (size_t)n, "a balancer");
    b->baseline = td__calloc(sizeof *b->baseline * (size_t)n, "a balancer");
    b->recent = td__calloc(sizeof *b->recent * (size_t)n, "a balancer");
    b->slow_streak = td__calloc(sizeof *b->slow_streak * (size_t)n, "a balancer");
    b->parked = td__calloc((size_t)n, "a balancer");
    b->probing = td__calloc((size_t)n, "a balancer");
    b->park_steps = td__calloc(sizeof *b->park_steps * (size_t)n, "a balancer");
    b->probe_every = td__calloc(sizeof *b->probe_every * (size_t)n, "a balancer");
    b->names = td__calloc(sizeof *b->names * (size_t)n, "a balancer");
    if (!b->fixed || !b->per_sample || !b->scale || !b->baseline || !b->recent || !b->slow_streak ||
        !b->parked || !b->probing || !b->park_steps || !b->probe_every || !b->names) {
        td_balancer_destroy(b);
        return TD_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < n; i++) {
        b->per_sample[i] = 1.0;
        b->scale[i] = 1.0;
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
    free(b->fixed);
    free(b->per_sample);
    free(b->scale);
    free(b->baseline);
    free(b->recent);
    free(b->slow_streak);
    free(b->parked);
    free(b->probing);
    free(b->park_steps);
    free(b->probe_every);
    free(b->names);
    free(b);
}

static void reset_observations(td_balancer *b) {
    for (int i = 0; i < b->n; i++) {
        b->scale[i] = 1.0;
        b->baseline[i] = 0;
        b->recent[i][0] = b->recent[i][1] = 0;
        b->slow_streak[i] = 0;
        b->parked[i] = 0;
        b->probing[i] = 0;
        b->park_steps[i] = 0;
        b->probe_every[i] = PROBE_FIRST;
    }
}

td_status td_balancer_set_costs(td_balancer *b, const double *fixed_s, const double *per_sample_s) {
    for (int i = 0; i < b->n; i++)
        if (!(fixed_s[i] >= 0) || !isfinite(fixed_s[i]) || !(per_sample_s[i] > 0) ||
            !isfinite(per_sample_s[i]))
            return td__error(TD_ERR_INVALID_ARG,
                             "balancer: %s costs %g s per step plus %g s per sample", b->names[i],
                             fixed_s[i], per_sample_s[i]);
    for (int i = 0; i < b->n; i++) {
        b->fixed[i] = fixed_s[i];
        b->per_sample[i] = per_sample_s[i];
    }
    reset_observations(b);
    return TD_OK;
}

td_status td_balancer_set_speeds(td_balancer *b, const double *sps) {
    for (int i = 0; i < b->n; i++)
        if (!(sps[i] > 0) || !isfinite(sps[i]))
            return td__error(TD_ERR_INVALID_ARG, "balancer: %s has speed %g samples/s", b->names[i],
                             sps[i]);
    for (int i = 0; i < b->n; i++) {
        b->fixed[i] = 0;
        b->per_sample[i] = 1.0 / sps[i];
    }
    reset_observations(b);
    return TD_OK;
}

/* Current costs. */
static double cost_fixed(const td_balancer *b, int i) {
    return b->fixed[i] * b->scale[i];
}
static double cost_per_sample(const td_balancer *b, int i) {
    return b->per_sample[i] * b->scale[i];
}

/* Water filling over the devices allowed by `use`: the step time T at
 * which they take `total` samples between them, each (T - fixed) /
 * per_sample, devices joining in order of fixed cost while their fixed cost
 * is below the T the others reach. in[i] (may be NULL) says who joined. */
static double water_fill(const td_balancer *b, double total, const unsigned char *use,
                         unsigned char *in) {
    double sum_ratio = 0, sum_inv = 0, t = INFINITY;
    unsigned char joined[TD_BALANCER_MAX_DEVICES];
    memset(joined, 0, (size_t)b->n);
    for (;;) {
        int next = -1;
        for (int i = 0; i < b->n; i++)
            if (use[i] && !joined[i] && (next < 0 || cost_fixed(b, i) < cost_fixed(b, next)))
                next = i;
        /* The first always joins. */
        if (next < 0 || (t < INFINITY && cost_fixed(b, next) >= t))
            break;
        joined[next] = 1;
        sum_ratio += cost_fixed(b, next) / cost_per_sample(b, next);
        sum_inv += 1.0 / cost_per_sample(b, next);
        t = (total + sum_ratio) / sum_inv;
    }
    if (in)
        memcpy(in, joined, (size_t)b->n);
    return t;
}

static void active_mask(const td_balancer *b, unsigned char *use) {
    for (int i = 0; i < b->n; i++)
        use[i] = !b->parked[i];
}

/* Parks the devices the water filling leaves out and brings back a parked
 * one when that shortens the step by UNPARK_GAIN. Never parks them all. */
static void update_parking(td_balancer *b, int64_t total) {
    unsigned char use[TD_BALANCER_MAX_DEVICES], in[TD_BALANCER_MAX_DEVICES];
    double t;
    if (!b->cfg.park || b->n < 2)
        return;
    active_mask(b, use);
    t = water_fill(b, (double)total, use, in);
    for (int i = 0; i < b->n; i++)
        if (use[i] && !in[i]) {
            b->parked[i] = 1;
            b->park_steps[i] = 0;
        }
    for (int i = 0; i < b->n; i++) {
        if (!b->parked[i])
            continue;
        active_mask(b, use);
        use[i] = 1;
        if (water_fill(b, (double)total, use, NULL) * (1 + UNPARK_GAIN) <= t) {
            b->parked[i] = 0;
            t = water_fill(b, (double)total, use, NULL);
        }
    }
}

/* Ideal real-valued counts for the unparked devices, with every device that
 * takes part given at least `least` samples. */
static void ideal_counts(const td_balancer *b, int64_t total, double least, double *x) {
    unsigned char use[TD_BALANCER_MAX_DEVICES], in[TD_BALANCER_MAX_DEVICES];
    unsigned char *u = use;
    double rest = (double)total;
    active_mask(b, u);
    for (int i = 0; i < b->n; i++)
        x[i] = 0;
    /* Devices the filling gives less than the minimum are held at it, and
     * the rest is filled again without them. */
    for (int round = 0; round <= b->n; round++) {
        double t = water_fill(b, rest, u, in);
        int clamped = 0;
        for (int i = 0; i < b->n; i++) {
            if (!u[i])
                continue;
            x[i] = in[i] ? (t - cost_fixed(b, i)) / cost_per_sample(b, i) : 0;
        }
        for (int i = 0; i < b->n; i++)
            if (u[i] && in[i] && x[i] < least && least * 2 <= rest) {
                x[i] = least;
                rest -= least;
                u[i] = 0;
                clamped = 1;
            }
        if (!clamped)
            break;
    }
}

/* Unparks, for this step, each parked device whose turn to be tried came. */
static void start_probes(td_balancer *b) {
    for (int i = 0; i < b->n; i++)
        if (b->parked[i] && ++b->park_steps[i] >= b->probe_every[i]) {
            b->parked[i] = 0;
            b->probing[i] = 1;
            b->park_steps[i] = 0;
            if (b->probe_every[i] < PROBE_MAX)
                b->probe_every[i] *= 2;
        }
}

/* A device being tried gets at least the minimum share (one sample at
 * least), taken from the others in proportion. */
static void give_probes_samples(const td_balancer *b, int64_t total, double least, double *x) {
    for (int i = 0; i < b->n; i++) {
        double want = fmax(least, 1.0), others = 0;
        if (!b->probing[i] || x[i] >= want || (double)total < 2 * want)
            continue;
        for (int k = 0; k < b->n; k++)
            others += k == i ? 0 : x[k];
        for (int k = 0; k < b->n && others > 0; k++)
            if (k != i)
                x[k] *= ((double)total - want) / others;
        x[i] = want;
    }
}

void td_balancer_split(td_balancer *b, int64_t total, int64_t *counts) {
    int n = b->n;
    double least = ceil(b->cfg.min_share * (double)total), x[TD_BALANCER_MAX_DEVICES];
    int64_t given = 0;
    if (total <= 0) {
        memset(counts, 0, sizeof *counts * (size_t)n);
        return;
    }
    b->last_total = total;
    update_parking(b, total);
    start_probes(b);
    ideal_counts(b, total, least, x);
    give_probes_samples(b, total, least, x);
    for (int i = 0; i < n; i++) {
        counts[i] = (int64_t)floor(x[i] + 1e-9);
        if (counts[i] < 0)
            counts[i] = 0;
        given += counts[i];
    }
    while (given > total) /* rounding can only overshoot by the epsilon */
        for (int i = n - 1; i >= 0 && given > total; i--)
            if (counts[i] > 0) {
                counts[i]--;
                given--;
            }
    /* The leftover, a sample at a time, to the device that then finishes
     * first (ties to the lower index), among those taking part. */
    while (given < total) {
        int best = -1, any = 0;
        double best_t = INFINITY;
        for (int i = 0; i < n; i++)
            any |= !b->parked[i] && x[i] > 0;
        for (int i = 0; i < n; i++) {
            double t;
            if (b->parked[i] || (any && x[i] <= 0))
                continue;
            t = cost_fixed(b, i) + cost_per_sample(b, i) * (double)(counts[i] + 1);
            if (best < 0 || t < best_t) {
                best = i;
                best_t = t;
            }
        }
        if (best < 0)
            best = 0;
        counts[best]++;
        given++;
    }
    assert(given == total);
}

int td_balancer_parked(const td_balancer *b, int i) {
    return i >= 0 && i < b->n ? b->parked[i] : 0;
}

double td_balancer_share(const td_balancer *b, int i) {
    double x[TD_BALANCER_MAX_DEVICES], least = ceil(b->cfg.min_share * (double)b->last_total);
    if (i < 0 || i >= b->n)
        return 0.0;
    ideal_counts(b, b->last_total, least, x);
    return x[i] / (double)b->last_total;
}

double td_balancer_speed(const td_balancer *b, int i) {
    return i >= 0 && i < b->n ? 1.0 / cost_per_sample(b, i) : 0.0;
}

double td_balancer_fixed_seconds(const td_balancer *b, int i) {
    return i >= 0 && i < b->n ? cost_fixed(b, i) : 0.0;
}

double td_balancer_ideal_seconds(const td_balancer *b, int64_t total) {
    unsigned char use[TD_BALANCER_MAX_DEVICES];
    active_mask(b, use);
    return water_fill(b, (double)total, use, NULL);
}

/* The median of r and the two before it (those that exist). */
static double median3(double r, const double *before) {
    double a = before[0], c = before[1];
    if (a == 0 || c == 0)
        return r;
    if ((a <= r && r <= c) || (c <= r && r <= a))
        return r;
    if ((r <= a && a <= c) || (c <= a && a <= r))
        return a;
    return c;
}

int td_balancer_observe(td_balancer *b, const int64_t *counts, const double *seconds, char *report,
                        size_t report_size) {
    int named = 0;
    size_t used = 0;
    if (report && report_size)
        report[0] = '\0';
    for (int i = 0; i < b->n; i++) {
        double measured_cost, r;
        if (counts[i] <= 0 || !(seconds[i] > 0) || b->parked[i])
            continue;
        /* This step's scale: what it took over what the measured costs say. */
        measured_cost = b->fixed[i] + b->per_sample[i] * (double)counts[i];
        r = seconds[i] / measured_cost;
        if (b->probing[i]) {
            /* Tried again after parking: this measurement replaces the
             * old belief rather than nudging it. */
            b->probing[i] = 0;
            b->scale[i] = r;
            b->recent[i][0] = b->recent[i][1] = 0;
            continue;
        }
        /* Smoothed in the log, so a device found 10x faster or 10x slower
         * than believed converges equally fast either way, and through the
         * median of the last three steps, so one step that a page fault or
         * another process stretched does not move the split. */
        b->scale[i] *= pow(median3(r, b->recent[i]) / b->scale[i], b->cfg.smoothing);
        b->recent[i][1] = b->recent[i][0];
        b->recent[i][0] = r;
        if (b->baseline[i] == 0) {
            b->baseline[i] = r;
            continue;
        }
        if (r <= b->cfg.straggler_ratio * b->baseline[i])
            b->slow_streak[i] = 0;
        else if (++b->slow_streak[i] == STRAGGLER_STEPS) {
            double tps = seconds[i] / (double)counts[i];
            double avg = b->baseline[i] * measured_cost / (double)counts[i];
            named++;
            if (report && used + 1 < report_size)
                used += (size_t)snprintf(report + used, report_size - used,
                                         "%s is a straggler: %.3g ms per sample, %.1fx its "
                                         "average of %.3g ms\n",
                                         b->names[i], tps * 1e3, tps / avg, avg * 1e3);
        }
        b->baseline[i] = (1 - BASELINE_WEIGHT) * b->baseline[i] + BASELINE_WEIGHT * r;
    }
    return named;
}
