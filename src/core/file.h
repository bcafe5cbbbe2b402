/* Reading whole files into host memory. */
#ifndef TD_CORE_FILE_H
#define TD_CORE_FILE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

/* Reads the whole regular file at path into *out (64-byte aligned, so that
 * its bytes may be read as any element type; free with free()) and its size
 * into *len. A file larger than max_bytes is TD_ERR_IO; every message names
 * the file. On failure *out is NULL and *len 0. */
td_status td__read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len);

/* Reads the JSON file at path (at most max_bytes; jansson's `flags`) into
 * *out, which the caller releases with json_decref(). A file that cannot be
 * read fails as td__read_file does ("PATH: cannot open: REASON"), one that
 * does not parse with TD_ERR_PARSE "PATH:LINE:COLUMN: REASON". jansson's own
 * json_load_file() says neither well: "PATH:-1: unable to open PATH: ...". On
 * failure *out is NULL. */
td_status td__read_json_file(const char *path, size_t max_bytes, size_t flags, json_t **out);

#endif
