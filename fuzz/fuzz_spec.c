/* Fuzzes the device-spec parser: any bytes must give TD_OK or a clean error,
 * never a crash, a leak or an out-of-bounds read. */
#include <stdlib.h>
#include <string.h>

#include "device/spec.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *spec = malloc(size + 1);
    td_spec_item *items = NULL;
    size_t n = 0;
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    if (td__spec_parse(spec, &items, &n) == TD_OK) {
        /* Every parsed item is within its documented ranges. */
        for (size_t i = 0; i < n; i++)
            if (items[i].count < 1 || items[i].count > 4096 ||
                (items[i].opts.has_cores && items[i].opts.cores < 1))
                abort();
        free(items);
    }
    free(spec);
    return 0;
}
