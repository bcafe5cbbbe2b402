/* A folder as transformers' save_pretrained writes it, for the importers
 * (import_hf.c: GPT-2; import_llama.c: Llama, Qwen2, Mistral): config.json
 * and its fields, and the weights, from model.safetensors or from the
 * shards that model.safetensors.index.json names, each tensor found by name,
 * checked against the shape the config implies and converted to f32 from
 * F32, F64, F16 or BF16. Every tensor taken is marked, so that one the model
 * does not use (a layer beyond the config's count, say) is an error. */
#ifndef TD_NN_HF_IMPL_H
#define TD_NN_HF_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/checkpoint.h"

typedef struct td__hf_folder {
    char cfg_path[4096];
    json_t *cfg;             /* config.json's object */
    char weights[4096 + 32]; /* model.safetensors or its index, for messages */
    size_t nfiles;
    td_safetensors **files; /* model.safetensors, or each shard once */
    char **paths;           /* per file: its path, for messages */
    char **used;            /* per file, per tensor: taken or known to be no parameter */
} td__hf_folder;

/* td__hf_open_config opens dir's config.json (a JSON object); f is the
 * caller's, zeroed there. td__hf_open_weights then opens the weights, so
 * that the config is checked first: model.safetensors, or, when that is
 * absent and model.safetensors.index.json exists, every shard its
 * "weight_map" names (each of which must hold the tensors the map puts in
 * it). Errors name the file and the field: TD_ERR_IO for a file that cannot
 * be opened (a missing shard among them), TD_ERR_PARSE for JSON,
 * TD_ERR_CORRUPT for a damaged safetensors file. td__hf_close() frees what
 * f holds, even after a failure. */
td_status td__hf_open_config(const char *dir, td__hf_folder *f);
td_status td__hf_open_weights(const char *dir, td__hf_folder *f);
void td__hf_close(td__hf_folder *f);

/* config.json's fields. An integer (absent or null: def unless required);
 * true or false (absent: def); a number (absent: def). Errors name the
 * file and the key (TD_ERR_PARSE). */
td_status td__hf_int(const td__hf_folder *f, const char *key, int required, int64_t def,
                     int64_t *out);
td_status td__hf_bool(const td__hf_folder *f, const char *key, int def, int *out);
td_status td__hf_number(const td__hf_folder *f, const char *key, double def, double *out);
/* TD_ERR_PARSE "<config.json>: "<key>": <what>". */
td_status td__hf_cfg_error(const td__hf_folder *f, const char *key, const char *what);

/* The tensor `name` from whichever file holds it (its path in *path when
 * not NULL); NULL when none does. */
const td_st_tensor *td__hf_find(const td__hf_folder *f, const char *name, const char **path);

/* Converts tensor `name` to f32 into dst (numel(want) floats), after
 * checking it has shape want (ndim dims), or, with `transposed`, the
 * transpose of want's 2 dims (stored (in, out), as GPT-2's Conv1D), which is
 * undone. `sizes` tells which config.json fields fixed the shape
 * ("n_embd 64, ..."), for the messages: TD_ERR_SHAPE for a missing tensor or
 * another shape, TD_ERR_UNSUPPORTED for a dtype other than F32, F64, F16,
 * BF16. Marks the tensor used. */
td_status td__hf_take(td__hf_folder *f, const char *name, int ndim, const int64_t *want,
                      int transposed, const char *sizes, float *dst);

/* Marks the tensor `name` used when present (a tied head's copy, a buffer
 * that is no parameter). */
void td__hf_ignore(td__hf_folder *f, const char *name);

/* Fails (TD_ERR_SHAPE) naming the first tensor neither taken nor ignored
 * and not accepted by `ignorable` (may be NULL): it is "not part of the
 * <what> that config.json describes". */
td_status td__hf_check_all_used(const td__hf_folder *f, int (*ignorable)(const char *name),
                                const char *what);

#endif
