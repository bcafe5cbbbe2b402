/* Fuzzes the CSV table reader: the input's first byte picks the number of
 * classes (0: any label), the rest is the table with its label column named
 * "label". Any bytes must give rows whose labels are in range and features
 * finite, or a clean error with *out zeroed; never a crash or a leak. */
#include <math.h>
#include <stdlib.h>

#include "train/data-impl.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td__csv csv;
    int64_t classes;
    if (size < 1)
        return 0;
    classes = data[0] & 31;
    if (td__csv_parse((const char *)data + 1, size - 1, "fuzz", "label", classes, &csv) != TD_OK) {
        if (csv.x || csv.labels || csv.rows)
            abort();
        return 0;
    }
    if (csv.rows < 1 || csv.features < 1)
        abort();
    for (int64_t i = 0; i < csv.rows; i++)
        if (csv.labels[i] < 0 || (classes && csv.labels[i] >= classes))
            abort();
    for (int64_t i = 0; i < csv.rows * csv.features; i++)
        if (!isfinite(csv.x[i]))
            abort();
    td__csv_deinit(&csv);
    return 0;
}
