/* The data files users bring: .npy arrays, safetensors files and CSV tables,
 * read into data sets held in memory. data_open.c decides which reader a
 * data path goes to; the readers check everything a file claims before
 * trusting it, and their messages name the file, the row and the column. */
#ifndef TD_TRAIN_DATA_IMPL_H
#define TD_TRAIN_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/checkpoint.h"
#include "tandem/train.h"

/* Arrays in files ----------------------------------------------------------- */

typedef enum td__elem {
    TD__ELEM_F32 = 0,
    TD__ELEM_F64,
    TD__ELEM_U8, /* bool (numpy's b1) too: the bytes 0 and 1 */
    TD__ELEM_I8,
    TD__ELEM_U16,
    TD__ELEM_I16,
    TD__ELEM_U32,
    TD__ELEM_I32,
    TD__ELEM_U64,
    TD__ELEM_I64,
} td__elem;

/* Bytes per element of e. */
size_t td__elem_size(td__elem e);
/* Its name in messages: "float32", "uint8", ... */
const char *td__elem_name(td__elem e);

/* An array whose elements lie in a file's bytes (borrowed: valid while
 * those bytes are), with what messages call it. */
typedef struct td__array {
    char source[1100]; /* "x.npy", or "d.safetensors: tensor \"x\"" */
    td__elem elem;
    int big_endian; /* the elements' byte order in the file */
    int ndim;
    int64_t shape[TD_ST_MAX_DIMS];
    size_t numel;
    const uint8_t *data; /* numel elements, possibly unaligned */
} td__array;

/* Parses a .npy file (format versions 1 to 3) held in memory: the magic
 * string, the header's Python dict ('descr', 'fortran_order', 'shape' and
 * nothing else) and a data length exactly the shape's. *out borrows bytes.
 * A malformed or truncated file is TD_ERR_CORRUPT; a dtype tandem does not
 * read (float16, complex, strings, objects, structured) or fortran_order
 * True is TD_ERR_UNSUPPORTED; messages name `name`. */
td_status td__npy_parse(const uint8_t *bytes, size_t n, const char *name, td__array *out);

/* A data set from x (N samples of any shape) and y (N labels, or N x T
 * tokens for a token model) for the model mi describes: features become
 * floats and must be finite; labels and tokens are integers in
 * [0, mi->classes). Errors name `source`, the array and the sample at
 * fault (TD_ERR_SHAPE, TD_ERR_DTYPE, TD_ERR_INVALID_ARG). The caller
 * destroys *out. */
td_status td__dataset_from_arrays(const char *source, const td__array *x, const td__array *y,
                                  const td_model_info *mi, td_dataset **out);

/* Opens a .npy pair: features from x_path, labels from y_path. */
td_status td__npy_open(const char *x_path, const char *y_path, const td_model_info *mi,
                       td_dataset **out);

/* Opens a safetensors file holding tensors "x" and "y". */
td_status td__tensors_open(const char *path, const td_model_info *mi, td_dataset **out);

/* CSV tables ------------------------------------------------------------------ */

typedef struct td__csv {
    int64_t rows;     /* data rows (the header not counted) */
    int64_t features; /* the columns other than the label's */
    float *x;         /* (rows, features), malloc'ed */
    int32_t *labels;  /* (rows), malloc'ed */
} td__csv;

/* Parses a CSV table held in memory (RFC 4180: commas, optional double
 * quotes with "" inside, LF or CRLF line ends; a UTF-8 byte order mark is
 * skipped): a header row naming the columns, one of them label_column, then
 * rows of as many numbers. Labels are whole numbers in [0, classes) (with
 * classes 0: any that fits an int32). A ragged row, a cell that is not a
 * number, a NaN or infinite feature, or a label out of range is
 * TD_ERR_INVALID_ARG naming `name`, the line and the column. On failure
 * *out is zeroed. The caller frees it with td__csv_deinit(). */
td_status td__csv_parse(const char *text, size_t n, const char *name, const char *label_column,
                        int64_t classes, td__csv *out);
/* NULL-safe, and safe on a zeroed td__csv. */
void td__csv_deinit(td__csv *csv);

/* Opens a CSV file for a model reading features. */
td_status td__csv_open(const char *path, const char *label_column, const td_model_info *mi,
                       td_dataset **out);

/* Data sets over arrays (dataset.c) ------------------------------------------ */

/* A data set that takes over malloc'ed arrays (freed with it, or here on
 * failure): for features, x (size, features) and labels (size); for tokens,
 * tokens (size, T) and labels (size, T). info says which and their shape. */
td_status td__dataset_adopt(const char *source, const td_dataset_info *info, float *x,
                            int32_t *tokens, int32_t *labels, td_dataset **out);

/* Splits a data set made by td__dataset_adopt() in two: round(size *
 * fraction) samples, chosen by a shuffle with a fixed seed (so the same
 * file splits the same way in every run), go to *test; the rest to *train;
 * both keep the file's order. Either part empty is TD_ERR_INVALID_ARG. */
td_status td__dataset_split(const td_dataset *ds, double fraction, td_dataset **train,
                            td_dataset **test);

/* A data set of windows over a token stream, as td_text_open's over bytes:
 * training (is_val 0) a window of T at every start, validation one every T
 * tokens; labels are the next tokens. Adopts tokens[0..len) (freed on
 * failure too); classes are the largest token + 1. Too few tokens for one
 * window is TD_ERR_INVALID_ARG naming source. */
td_status td__dataset_tokens(const char *source, int32_t *tokens, size_t len, int64_t T, int is_val,
                             td_dataset **out);

#endif
