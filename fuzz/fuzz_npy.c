/* Fuzzes the .npy reader: any bytes must give an array whose shape, element
 * size and data fit exactly inside the input, or a clean error; never a
 * crash, an overread or a leak. */
#include <stdlib.h>
#include <string.h>

#include "train/data-impl.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td__array a;
    size_t numel = 1, nbytes;
    if (td__npy_parse(data, size, "fuzz", &a) != TD_OK)
        return 0;
    if (a.ndim < 0 || a.ndim > TD_ST_MAX_DIMS)
        abort();
    for (int d = 0; d < a.ndim; d++)
        numel *= (size_t)a.shape[d];
    nbytes = numel * td__elem_size(a.elem);
    if (numel != a.numel || a.data < data || a.data + nbytes != data + size)
        abort();
    /* Touch every byte so the sanitizer checks the bounds. */
    volatile unsigned char sum = 0;
    for (size_t i = 0; i < nbytes; i++)
        sum ^= a.data[i];
    (void)sum;
    return 0;
}
