/* The inside of the train layer, shared by its files and the checkpoint code. */
#ifndef TD_TRAIN_IMPL_H
#define TD_TRAIN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/train.h"

/* Reads the whole file at path into a malloc'ed buffer; larger than max_bytes
 * is an error. Messages name the file. */
td_status td__read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len);

/* Unpacks one gzip stream (n bytes at in) into a malloc'ed buffer of at most
 * max_out bytes. Truncated, corrupt or oversized input is TD_ERR_CORRUPT
 * naming `name`. */
td_status td__gunzip(const uint8_t *in, size_t n, const char *name, size_t max_out, uint8_t **out,
                     size_t *out_len);

#endif
