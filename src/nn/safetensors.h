/* What the nn layer's safetensors reader gives the layers above beyond
 * include/tandem/checkpoint.h: loading a file whose tensors are not all f32
 * or f64, and naming their dtypes, for the train layer's data files
 * (src/train/data_tensors.c). Narrow on purpose: the metadata entries and the
 * checksum the reader and writer share stay in safetensors-impl.h. */
#ifndef TD_NN_SAFETENSORS_H
#define TD_NN_SAFETENSORS_H

#include "tandem/checkpoint.h"

/* td_safetensors_load() that keeps tensors of every dtype the format names
 * (U8, I64, F16, ...), not only F32 and F64, for readers that convert the
 * bytes themselves (the train layer's data files). The td_st_tensor.dtype of
 * a tensor of another dtype means nothing; td__safetensors_dtype() names it.
 * Errors and ownership as td_safetensors_load()'s. */
td_status td__safetensors_load_any(const char *path, td_safetensors **out);
/* The file's dtype name of tensor t of st ("F32", "U8", "I64", ...); NULL
 * when t is not one of st's. Valid while the program runs. */
const char *td__safetensors_dtype(const td_safetensors *st, const td_st_tensor *t);

/* Adds a tensor of a dtype td_dtype does not name (file_dtype: a string
 * that outlives w, "BF16", "U8", ...) of esize bytes an element: numel(shape)
 * elements from data (copied). Errors as td_safetensors_writer_add's. */
td_status td__safetensors_writer_add_raw(td_safetensors_writer *w, const char *name,
                                         const char *file_dtype, size_t esize, int ndim,
                                         const int64_t *shape, const void *data);

#endif
