/* What the safetensors reader and writer share: the metadata entries and
 * the checksum over data and metadata that tandem keeps in "tandem.crc32". */
#ifndef TD_SAFETENSORS_IMPL_H
#define TD_SAFETENSORS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/checkpoint.h"

#define TD_ST_CRC_KEY "tandem.crc32"

typedef struct st_meta {
    char *key, *value;
} st_meta;

/* CRC-32 (zlib's) continued from crc over n bytes of data, any size. */
uint32_t td__st_crc_data(uint32_t crc, const void *data, size_t n);
/* Continued over each metadata key and value (with their terminating
 * zeros) in key order, leaving out the checksum itself; sorts meta. */
uint32_t td__st_crc_meta(uint32_t crc, st_meta *meta, size_t nmeta);

/* td_safetensors_load() that keeps tensors of every dtype the format names
 * (U8, I64, F16, ...), not only F32 and F64, for readers that convert the
 * bytes themselves (the train layer's data files). The td_st_tensor.dtype of
 * a tensor of another dtype means nothing; td__safetensors_dtype() names it.
 * Errors and ownership as td_safetensors_load()'s. */
td_status td__safetensors_load_any(const char *path, td_safetensors **out);
/* The file's dtype name of tensor t of st ("F32", "U8", "I64", ...); NULL
 * when t is not one of st's. Valid while the program runs. */
const char *td__safetensors_dtype(const td_safetensors *st, const td_st_tensor *t);

#endif
