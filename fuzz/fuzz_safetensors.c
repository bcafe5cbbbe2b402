/* Fuzzes the safetensors reader: any bytes must give a verified file or a
 * clean error, never a crash, a leak or a read outside the input. */
#include <stdlib.h>
#include <string.h>

#include "tandem/checkpoint.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td_safetensors *st = NULL;
    if (td_safetensors_parse(data, size, "fuzz", &st) == TD_OK) {
        size_t total = 0;
        for (size_t i = 0; i < td_safetensors_count(st); i++) {
            const td_st_tensor *t = td_safetensors_tensor(st, i);
            volatile unsigned char sum = 0;
            if (!t || !t->name || t->nbytes != t->numel * td_dtype_size(t->dtype) ||
                td_safetensors_find(st, t->name) == NULL)
                abort();
            for (size_t k = 0; k < t->nbytes; k++)
                sum ^= ((const unsigned char *)t->data)[k];
            (void)sum;
            total += t->nbytes;
        }
        if (total > size)
            abort();
        (void)td_safetensors_meta(st, "tandem.crc32");
    } else if (st) {
        abort();
    }
    td_safetensors_destroy(st);
    return 0;
}
