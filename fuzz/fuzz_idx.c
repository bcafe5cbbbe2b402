/* Fuzzes the IDX reader, gzip included: any bytes must give TD_OK with a
 * consistent result or a clean error, never a crash or a leak. */
#include <stdlib.h>

#include "tandem/train.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td_idx idx;
    if (td_idx_parse(data, size, "fuzz", &idx) == TD_OK) {
        size_t n = 1;
        if (idx.ndim < 1 || idx.ndim > TD_MAX_DIMS || !idx.data)
            abort();
        for (int d = 0; d < idx.ndim; d++)
            n *= (size_t)idx.dims[d];
        if (n != idx.size)
            abort();
        /* Touch every byte so the sanitizer checks the allocation's size. */
        volatile unsigned char sum = 0;
        for (size_t i = 0; i < idx.size; i++)
            sum ^= idx.data[i];
        (void)sum;
    } else if (idx.data || idx.size) {
        abort();
    }
    td_idx_deinit(&idx);
    return 0;
}
