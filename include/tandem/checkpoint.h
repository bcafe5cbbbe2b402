/* tandem: safetensors files and training checkpoints.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON, then the tensors' bytes. The JSON maps each tensor name to
 * {"dtype": "F32"|"F64", "shape": [...], "data_offsets": [begin, end]}
 * (offsets into the data that follows the header, which the tensors cover
 * exactly, without gaps) and "__metadata__" to a map of strings. Python's
 * `safetensors` package reads the files tandem writes. tandem adds the
 * metadata key "tandem.crc32": the CRC-32 of the data and of the other
 * metadata, checked when a file is loaded. */
#ifndef TANDEM_CHECKPOINT_H
#define TANDEM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/nn.h"
#include "tandem/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reading ------------------------------------------------------------------ */

typedef struct td_safetensors td_safetensors;

#define TD_ST_MAX_DIMS 8

typedef struct td_st_tensor {
    const char *name; /* valid while the file object lives */
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_ST_MAX_DIMS];
    size_t numel;
    const void *data; /* nbytes little-endian bytes, possibly unaligned */
    size_t nbytes;
} td_st_tensor;

/* Parses and verifies a safetensors file held in memory (copied; bytes may
 * be freed afterwards): header bounds, JSON, every tensor's dtype, shape and
 * offsets against the data, offsets covering the data exactly, and the
 * checksum when the metadata has one. `name` stands for the file in
 * messages; errors also name the tensor (TD_ERR_CORRUPT, TD_ERR_UNSUPPORTED
 * for dtypes other than F32 and F64). The caller destroys *out. */
TD_API td_status td_safetensors_parse(const void *bytes, size_t n, const char *name,
                                      td_safetensors **out);
/* td_safetensors_parse() of the file at path. */
TD_API td_status td_safetensors_load(const char *path, td_safetensors **out);
/* NULL-safe. */
TD_API void td_safetensors_destroy(td_safetensors *st);

/* The name given when parsed or loaded. */
TD_API const char *td_safetensors_name(const td_safetensors *st);
TD_API size_t td_safetensors_count(const td_safetensors *st);
/* Tensor i in the order of their data (NULL when out of range), or by name
 * (NULL when absent). Borrowed: valid while st lives. */
TD_API const td_st_tensor *td_safetensors_tensor(const td_safetensors *st, size_t i);
TD_API const td_st_tensor *td_safetensors_find(const td_safetensors *st, const char *name);
/* A metadata value, or NULL when the key is absent. Borrowed. */
TD_API const char *td_safetensors_meta(const td_safetensors *st, const char *key);
/* 1 when the file carried a tandem checksum (and it matched). */
TD_API int td_safetensors_has_checksum(const td_safetensors *st);
/* Copies tensor `name` into t, whose dtype and shape must match; errors name
 * the file and the tensor (TD_ERR_CORRUPT when absent, TD_ERR_SHAPE,
 * TD_ERR_DTYPE). */
TD_API td_status td_safetensors_read_tensor(const td_safetensors *st, const char *name,
                                            td_tensor *t);

/* Writing ------------------------------------------------------------------ */

typedef struct td_safetensors_writer td_safetensors_writer;

TD_API td_status td_safetensors_writer_create(td_safetensors_writer **out);
/* NULL-safe. */
TD_API void td_safetensors_writer_destroy(td_safetensors_writer *w);
/* Adds a tensor from host memory (copied) of numel(shape) elements. Names
 * are unique and not "__metadata__". */
TD_API td_status td_safetensors_writer_add(td_safetensors_writer *w, const char *name,
                                           td_dtype dtype, int ndim, const int64_t *shape,
                                           const void *data);
/* Adds a tensor read from its device now. */
TD_API td_status td_safetensors_writer_add_tensor(td_safetensors_writer *w, const char *name,
                                                  const td_tensor *t);
/* Sets a metadata string (valid UTF-8); a key set twice keeps the last value.
 * "tandem.crc32" is reserved. */
TD_API td_status td_safetensors_writer_set_meta(td_safetensors_writer *w, const char *key,
                                                const char *value);
/* Writes the file atomically: a temporary file in path's folder, fsync,
 * rename over path, fsync of the folder. On failure path is untouched and
 * the temporary file removed. Tensors are stored in the order added. */
TD_API td_status td_safetensors_writer_save(td_safetensors_writer *w, const char *path);

/* Checkpoints -----------------------------------------------------------------
 *
 * A checkpoint is a safetensors file with the model's parameters under their
 * own names ("layers.0.weight"), the optimizer's state under
 * "optimizer.<name>", and in the metadata: the model JSON ("tandem.model"),
 * the step, the data position, the seed, the batch size, the optimizer
 * configuration ("tandem.optimizer", JSON) and the text vocabulary if any. */

/* The longest split text a checkpoint records, with its terminating NUL. */
#define TD_SPLIT_TEXT_MAX 512

typedef struct td_train_state {
    int64_t step;   /* optimizer steps taken */
    int64_t epoch;  /* data position: the epoch of the next batch */
    int64_t sample; /* and its position in that epoch's order */
    uint64_t seed;  /* initialisation, data order and dropout */
    int64_t batch;  /* samples per step */
    td_optimizer_config opt;
    char vocab[257]; /* text models with a character vocabulary: its bytes */
    int vocab_len;   /* 0: none (images, or the 256-byte vocabulary) */
    /* How the strategy that saved it split the model, in its own words
     * ("tensor 0.75 0.25": its name, then what it needs to cut the same
     * slices again), so that a resumed run takes bitwise the same steps;
     * "": nothing recorded ("tandem.split"). */
    char split[TD_SPLIT_TEXT_MAX];
} td_train_state;

/* Saves m, opt (NULL: weights only) and state to path, atomically. */
TD_API td_status td_checkpoint_save(const char *path, td_model *m, td_optimizer *opt,
                                    const td_train_state *state);
/* Loads path into m (and opt when not NULL, and *state when not NULL), after
 * verifying the file and that every parameter and state tensor is there
 * with m's shapes and dtype. On failure m and opt may hold part of the
 * file's values; the message names the file and the tensor. */
TD_API td_status td_checkpoint_load(const char *path, td_model *m, td_optimizer *opt,
                                    td_train_state *state);
/* Creates the model a checkpoint holds on dev, in the checkpoint's dtype,
 * with its weights; *state gets the rest when not NULL. The caller
 * destroys *out. */
TD_API td_status td_checkpoint_load_model(const char *path, td_device *dev, td_model **out,
                                          td_train_state *state);

/* Reads a checkpoint's model JSON (*model_json, malloc'ed: the caller frees
 * it), dtype and run state after verifying the file, without building the
 * model (which may not fit one device). */
TD_API td_status td_checkpoint_read_meta(const char *path, char **model_json, td_dtype *dtype,
                                         td_train_state *state);
/* Saves a model held in parts (td_model_load_part; a pipeline's stages, in
 * layer order, together the whole model) and their optimizers (opts may be
 * NULL: weights only) as one whole-model checkpoint, as td_checkpoint_save
 * saves a whole model. */
TD_API td_status td_checkpoint_save_parts(const char *path, td_model *const *parts,
                                          td_optimizer *const *opts, int n,
                                          const td_train_state *state);
/* Saves m's weights alone (an f32 model; no optimizer state; state's
 * counters, NULL: zeros) with its weight matrices (td_model_set_weights
 * names them) in fmt: bf16 as "BF16" tensors of their shape, q8_0 as "U8"
 * tensors of ggml's 34-byte blocks, shape (rows, cols / 32 * 34); the
 * format in the metadata "tandem.weights". Loading such a file (any
 * td_checkpoint_load*) gives the rounded values and records the format
 * (td_model_weights). q8_0 rows that are not whole blocks are TD_ERR_SHAPE
 * naming the tensor. Atomic as td_checkpoint_save. */
TD_API td_status td_checkpoint_save_weights(const char *path, td_model *m, td_weights fmt,
                                            const td_train_state *state);

/* The format of a checkpoint's weight matrices ("tandem.weights"; f32
 * when absent), after verifying the file. */
TD_API td_status td_checkpoint_read_weights(const char *path, td_weights *out);

/* One whole tensor in host memory, for td_checkpoint_save_host. */
typedef struct td_ckpt_entry {
    const char *name; /* "layers.0.weight", or "optimizer.layers.0.weight.exp_avg" */
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    const void *data; /* numel(shape) elements of the checkpoint's dtype */
} td_ckpt_entry;

/* Saves whole tensors held in host memory (a model put together from
 * shards, say) as the checkpoint td_checkpoint_save writes for the model
 * model_json in dtype: entries[0..n) in the order given (the parameters in
 * the model's order, then the optimizer's state under "optimizer.<name>"
 * when has_optimizer), the metadata from state (NULL: zeros). Atomic, as
 * td_checkpoint_save; the entries are copied. */
TD_API td_status td_checkpoint_save_host(const char *path, const char *model_json, td_dtype dtype,
                                         const td_ckpt_entry *entries, size_t n, int has_optimizer,
                                         const td_train_state *state);
/* Loads part m's parameters (and opt's state when not NULL) from a
 * whole-model checkpoint whose model JSON is m's, checking each tensor's
 * shape and dtype; the file's other tensors belong to the other parts. */
TD_API td_status td_checkpoint_load_part(const char *path, td_model *m, td_optimizer *opt,
                                         td_train_state *state);
/* Loads m's weights only from a checkpoint of either precision, converted
 * to m's: a whole model's, or a tensor-parallel shard's slices of each
 * (td_model_param_slice). Each tensor is found by name and checked against
 * the whole parameter's shape; errors name the file and the tensor. */
TD_API td_status td_checkpoint_load_weights(const char *path, td_model *m);
/* The same, a parameter the file does not hold read from its tensor
 * missing_from instead (NULL: none): a head untied by td_model_untie reads
 * the embedding's table. */
TD_API td_status td_checkpoint_load_weights_alias(const char *path, td_model *m,
                                                  const char *missing_from);

#ifdef __cplusplus
}
#endif
#endif
