/* Data files written from arrays a test made, for the readers of users'
 * data (tests/train/test_data_formats.c, test_cli_data.c): .npy files as
 * numpy writes them and safetensors files of any dtype, by hand, so that
 * the reader is checked against an independent writer. */
#ifndef TD_TEST_DATA_FILES_H
#define TD_TEST_DATA_FILES_H

#include <stddef.h>

/* A .npy file of format `version` (1 or 2): the header dict of descr
 * ("<f4"), fortran ("False") and shape (Python's tuple text, "(40, 3)"),
 * padded with spaces and a newline to a multiple of 64 bytes, then nbytes
 * of data. Fails the test when it cannot write. */
void td_test_write_npy_v(const char *path, int version, const char *descr, const char *fortran,
                         const char *shape, const void *data, size_t nbytes);
/* Version 1, C order. */
void td_test_write_npy(const char *path, const char *descr, const char *shape, const void *data,
                       size_t nbytes);

/* One tensor of a safetensors file: dtype as the format names it ("I64"),
 * shape as JSON ("[40,3]"). */
typedef struct td_test_st_entry {
    const char *name, *dtype, *shape;
    const void *data;
    size_t nbytes;
} td_test_st_entry;

/* A safetensors file of n tensors, stored in the order given. */
void td_test_write_safetensors(const char *path, const td_test_st_entry *e, int n);

#endif
