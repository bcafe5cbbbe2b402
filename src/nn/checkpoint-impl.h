/* What checkpoint.c shares with checkpoint_compact.c: reading weights of
 * any dtype tandem knows, and writing compact ones. */
#ifndef TD_NN_CHECKPOINT_IMPL_H
#define TD_NN_CHECKPOINT_IMPL_H

#include "tandem/checkpoint.h"

/* The format "tandem.weights" names (f32 when absent); an unknown one is
 * TD_ERR_UNSUPPORTED naming the file. */
td_status td__ckpt_weights_meta(const td_safetensors *sf, td_weights *out);
/* File tensor t (of a file loaded with td__safetensors_load_any), stored
 * for a parameter of shape[0..ndim), as numel(shape) doubles in out: F32,
 * F64, BF16, F16 or q8_0 blocks (U8). Another dtype, a q8_0 tensor whose
 * rows are not whole blocks, or a shape not the parameter's: an error
 * naming the file and the tensor. */
td_status td__ckpt_values(const td_safetensors *sf, const td_st_tensor *t, int ndim,
                          const int64_t *shape, double *out);
/* Adds parameter p to w under name in fmt (bf16 or q8_0). */
td_status td__ckpt_add_compact(td_safetensors_writer *w, const char *name, td_weights fmt,
                               const td_tensor *p);

#endif
