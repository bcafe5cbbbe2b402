/* The inside of the `tensor` strategy: tensor.c runs it and sizes its
 * slices, tensor_ckpt.c puts whole-model checkpoints together from the
 * members' shards and takes them apart again, tensor_decode.c generates
 * with the same slices. */
#ifndef TD_PARALLEL_TENSOR_IMPL_H
#define TD_PARALLEL_TENSOR_IMPL_H

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/generate.h"
#include "tandem/nn.h"

/* Saves the model that shards[0..n) (one model's shards, together every
 * unit) and their optimizers hold as one whole-model checkpoint, as
 * td_checkpoint_save saves the whole model: each parameter's and optimizer
 * state's slices gathered into the whole tensor in host memory; replicated
 * ones taken from shards[0]. */
td_status td__tensor_save(td_model *const *shards, td_optimizer *const *opts, int n,
                          const char *path, const td_train_state *state);
/* Loads a whole-model checkpoint of the shards' model into each shard and
 * its optimizer (its slices of every tensor) and the step count; *state
 * (may be NULL) gets the run state. */
td_status td__tensor_load(td_model *const *shards, td_optimizer *const *opts, int n,
                          const char *path, td_train_state *state);

/* The tensor strategy's decoder (td_strategy_decoder_create). */
td_status td__tensor_decoder(td_group *g, const char *checkpoint, td_dtype dtype, td_decoder **out);

#endif
