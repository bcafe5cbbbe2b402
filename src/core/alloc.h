/* Internal host allocation that reports failure through the error message. */
#ifndef TD_CORE_ALLOC_H
#define TD_CORE_ALLOC_H

#include <stddef.h>

#include "tandem/status.h"

/* Zeroed memory of n bytes, or NULL with the message set ("what" names the
 * purpose for the message). Free with free(). */
void *td__calloc(size_t n, const char *what);

/* 64-byte aligned memory, or NULL with the message set. Free with free(). */
void *td__aligned_alloc(size_t n, const char *what);

/* strdup that sets the message on failure. */
char *td__strdup(const char *s);

/* "1.5 GiB" style sizes for messages; buf must hold 32 bytes. */
const char *td__format_bytes(double n, char buf[32]);

#endif
