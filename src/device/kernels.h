/* The ops every backend implements, called on the device's host thread with
 * device pointers. The tensor and nn layers reach kernels only through this
 * table, so a new backend is a new table. */
#ifndef TD_DEVICE_KERNELS_H
#define TD_DEVICE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

typedef enum td_rng_kind {
    TD_RNG_UNIFORM = 0, /* a + (b - a) * u, u in [0, 1) */
    TD_RNG_NORMAL = 1,  /* a + b * z, z standard normal */
} td_rng_kind;

typedef struct td_kernels {
    /* x[0:n] = value. */
    td_status (*fill)(void *ctx, void *x, td_dtype dt, size_t n, double value);
    /* x[i] = the (offset + i)-th number of stream `seed` (td_rng_uniform or
     * td_rng_normal), scaled by a and b as td_rng_kind says. */
    td_status (*rng)(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                     uint64_t offset, double a, double b);
} td_kernels;

#endif
