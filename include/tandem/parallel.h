/* tandem: strategies over device groups, and the balancer that sizes each
 * device's share of the work from its measured speed. */
#ifndef TANDEM_PARALLEL_H
#define TANDEM_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_balancer td_balancer;

typedef struct td_balancer_config {
    double min_share;       /* no device gets less than this fraction of a batch (0.02) */
    double smoothing;       /* weight of a new speed measurement in the running estimate (0.3) */
    double straggler_ratio; /* a device is named when its time per sample exceeds its
                               long-run average by this factor (1.5) */
} td_balancer_config;

#define TD_BALANCER_CONFIG_INIT                                                                    \
    { 0.02, 0.3, 1.5 }

/* A balancer over n devices, equal shares until told speeds. names[i] (may be
 * NULL) name the devices in straggler reports; they are copied. */
TD_API td_status td_balancer_create(int n, const char *const *names, const td_balancer_config *cfg,
                                    td_balancer **out);
TD_API void td_balancer_destroy(td_balancer *b);

/* Sets the speed estimates (samples per second, > 0), as a calibration run
 * measured them; shares follow. */
TD_API td_status td_balancer_set_speeds(td_balancer *b, const double *samples_per_second);

/* Splits a batch of `total` samples into counts[0..n) that add up to total,
 * in proportion to the shares, each at least the minimum share (when the
 * batch has room for it); largest remainders take the leftover samples, ties
 * to the lower index, so the split is a pure function of the shares. */
TD_API void td_balancer_split(const td_balancer *b, int64_t total, int64_t *counts);

/* Feeds one step's measurements: device i computed counts[i] samples in
 * seconds[i]. Updates the speeds (smoothed) and so the shares. When a
 * device's time per sample has drifted above its long-run average by the
 * straggler ratio, a line naming it and by how much goes into report (which
 * may be NULL); returns how many devices were named. */
TD_API int td_balancer_observe(td_balancer *b, const int64_t *counts, const double *seconds,
                               char *report, size_t report_size);

/* Device i's current share (they add up to 1) and speed estimate. */
TD_API double td_balancer_share(const td_balancer *b, int i);
TD_API double td_balancer_speed(const td_balancer *b, int i);

/* The step time an ideal split would reach for `total` samples at the
 * current speeds: total / sum of speeds. */
TD_API double td_balancer_ideal_seconds(const td_balancer *b, int64_t total);

#ifdef __cplusplus
}
#endif
#endif
