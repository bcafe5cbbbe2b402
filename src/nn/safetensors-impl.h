/* What the safetensors reader and writer share: the metadata entries and
 * the checksum over data and metadata that tandem keeps in "tandem.crc32".
 * Private to the nn layer; the layers above use nn/safetensors.h. */
#ifndef TD_SAFETENSORS_IMPL_H
#define TD_SAFETENSORS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/safetensors.h"
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

#endif
