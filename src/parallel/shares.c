/* Sizing members' shares from measured speed: the probe that times a
 * device at reading weights (what batch-1 decoding does), shares rounded so
 * that noise moves nothing between equal devices, and cutting a range by
 * them. Used by the tensor strategy's slices and by the decoders. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/strategy-impl.h"

/* The probe: one row times a (PROBE_OUT, PROBE_IN) weight, 16 MiB in f32. */
#define PROBE_IN   1024
#define PROBE_OUT  4096
#define PROBE_RUNS 6

td_status td__speed_probe(td_device *dev, td_dtype dtype, double *seconds) {
    char json[256];
    float *x = td__calloc(PROBE_IN * sizeof *x, "a probe input");
    int32_t label = 0;
    td_batch b = {1, x, NULL, &label};
    td_step_result r;
    td_model *pm = NULL;
    td_status st = TD_OK;
    snprintf(json, sizeof json,
             "{\"name\": \"probe\", \"input\": {\"shape\": [%d]}, \"layers\": "
             "[{\"type\": \"linear\", \"out\": %d}]}",
             PROBE_IN, PROBE_OUT);
    *seconds = 0;
    if (!x)
        return TD_ERR_OUT_OF_MEMORY;
    st = td_model_load_string(json, "(the speed probe)", dev, dtype, 1, &pm);
    for (int i = 0; i <= PROBE_RUNS && st == TD_OK; i++) {
        uint64_t t0 = td_clock_ns();
        double dt;
        st = td_model_evaluate(pm, &b, &r);
        dt = (double)(td_clock_ns() - t0) * 1e-9;
        if (i > 0 && (*seconds == 0 || dt < *seconds))
            *seconds = dt;
    }
    td_model_destroy(pm);
    free(x);
    return st;
}

void td__shares_from_speed(const double *alone_s, int n, double *share) {
    double sum = 0;
    int measured = 1;
    for (int k = 0; k < n; k++)
        measured &= alone_s[k] > 0;
    for (int k = 0; k < n; k++) {
        share[k] = measured ? 1.0 / alone_s[k] : 1.0;
        sum += share[k];
    }
    /* to eighths, so that timing noise moves no slice between equal devices
     * (a device three times as fast still gets three quarters) */
    for (int k = 0; k < n; k++) {
        double q = round(8.0 * share[k] / sum) / 8.0;
        share[k] = q > 0 ? q : 1.0 / 64;
    }
    sum = 0;
    for (int k = 0; k < n; k++)
        sum += share[k];
    for (int k = 0; k < n; k++)
        share[k] /= sum;
}

void td__cut_by_shares(int64_t size, const double *share, int n, int64_t *first, int64_t *count) {
    int64_t given = 0, at = 0;
    double frac[TD_DP_MAX_MEMBERS];
    assert(n > 0 && n <= TD_DP_MAX_MEMBERS && size >= 0);
    for (int k = 0; k < n; k++) {
        double q = (double)size * share[k];
        count[k] = (int64_t)floor(q);
        frac[k] = q - (double)count[k];
        given += count[k];
    }
    while (given < size) {
        int best = 0;
        for (int k = 1; k < n; k++)
            if (frac[k] > frac[best])
                best = k;
        count[best]++;
        frac[best] = -1;
        given++;
    }
    for (int k = 0; k < n; k++) {
        first[k] = at;
        at += count[k];
    }
    assert(at == size); /* shares summing past 1 would overshoot */
}

/* The units a cut keeps together so that no q8_0 block of 32 columns is
 * split between two members: whole blocks of features, or enough heads
 * to fill one (a head width that divides no block cannot be q8_0 anyway). */
static int64_t block_granule(const td_split_info *u, td_weights w) {
    int64_t g = 1;
    while (w == TD_WEIGHTS_Q8_0 && (g * u->width) % 32 != 0 && g < 32)
        g *= 2;
    return (g * u->width) % 32 == 0 ? g : 1;
}

void td__cut_units(const td_split_info *units, int nunits, const double *share, int n, td_weights w,
                   int j, td_shard_plan *plan) {
    plan->units = nunits;
    for (int u = 0; u < nunits; u++) {
        int64_t first[TD_DP_MAX_MEMBERS], count[TD_DP_MAX_MEMBERS], g = block_granule(&units[u], w);
        td__cut_by_shares(units[u].size / g, share, n, first, count);
        plan->first[u] = first[j] * g;
        /* a tail shorter than a granule: the last member's */
        plan->count[u] = count[j] * g + (j == n - 1 ? units[u].size % g : 0);
    }
}
