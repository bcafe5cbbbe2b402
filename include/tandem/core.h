/* tandem: logging level, clocks, version and the counter-based RNG. */
#ifndef TANDEM_CORE_H
#define TANDEM_CORE_H

#include <stdint.h>

#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_VERSION_STRING "0.1.0"

/* Element types. Every op exists for both. */
typedef enum td_dtype {
    TD_F32 = 0,
    TD_F64 = 1,
} td_dtype;

/* Bytes per element: 4 or 8. */
static inline unsigned td_dtype_size(td_dtype dt) {
    return dt == TD_F64 ? 8u : 4u;
}
/* "f32" or "f64". */
static inline const char *td_dtype_name(td_dtype dt) {
    return dt == TD_F64 ? "f64" : "f32";
}

/* How a model's weight matrices are held for generation: in the model's
 * dtype, or compact (docs/models.md): bf16 (rounded to nearest even), or
 * q8_0 (llama.cpp's blocks of 32 int8 values sharing one f16 scale). */
typedef enum td_weights {
    TD_WEIGHTS_F32 = 0,
    TD_WEIGHTS_BF16 = 1,
    TD_WEIGHTS_Q8_0 = 2,
} td_weights;

/* "f32", "bf16" or "q8_0". */
static inline const char *td_weights_name(td_weights w) {
    return w == TD_WEIGHTS_BF16 ? "bf16" : w == TD_WEIGHTS_Q8_0 ? "q8_0" : "f32";
}

/* How a device computes the products of f32 matrices (td_device_set_precision):
 * in f32, or mixed: each input rounded to bf16 (nearest even), the products
 * summed in f32 (weights, gradients and everything else stay f32). */
typedef enum td_precision {
    TD_PRECISION_F32 = 0,
    TD_PRECISION_BF16 = 1,
} td_precision;

/* "f32" or "bf16". */
static inline const char *td_precision_name(td_precision p) {
    return p == TD_PRECISION_BF16 ? "bf16" : "f32";
}

typedef enum td_log_level {
    TD_LOG_ERROR = 0,
    TD_LOG_WARN = 1,
    TD_LOG_INFO = 2,
    TD_LOG_DEBUG = 3,
} td_log_level;

/* Sets the level below which messages are dropped. Thread-safe. */
TD_API void td_log_set_level(td_log_level level);

/* Monotonic clock in nanoseconds. */
TD_API uint64_t td_clock_ns(void);

/* Philox4x32-10: a counter-based generator, so the numbers at a position depend
 * only on (seed, position), never on which device or how many devices make
 * them. td_philox() fills out[4] from a 128-bit counter and a 64-bit key. */
TD_API void td_philox(const uint32_t counter[4], uint64_t key, uint32_t out[4]);

/* The i-th number of stream `seed`: uniform in [0, 1) with 53 random bits, and
 * standard normal (Box-Muller over the pair that position i belongs to). */
TD_API double td_rng_uniform(uint64_t seed, uint64_t i);
TD_API double td_rng_normal(uint64_t seed, uint64_t i);

#ifdef __cplusplus
}
#endif
#endif
