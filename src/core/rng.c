/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11), the generator cuRAND and PyTorch use for the same reason: any
 * element can be computed on its own from (seed, index). */
#include <math.h>

#include "core/philox.h"
#include "tandem/core.h"

void td_philox(const uint32_t counter[4], uint64_t key, uint32_t out[4]) {
    td__philox4x32(counter, key, out);
}

double td_rng_uniform(uint64_t seed, uint64_t i) {
    return td__rng_uniform_at(seed, i);
}

double td_rng_normal(uint64_t seed, uint64_t i) {
    return td__rng_normal_at(seed, i);
}
