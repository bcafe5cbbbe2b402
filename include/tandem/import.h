/* tandem: GPT-2 weights from elsewhere, converted into tandem checkpoints.
 *
 * Two layouts are read: a Hugging Face folder as transformers'
 * GPT2LMHeadModel.save_pretrained writes it (config.json and
 * model.safetensors; Conv1D weights stored (in, out), the head tied to the
 * token embedding), and llm.c's gpt2_*.bin (a 256-int32 header, then the
 * parameters in llm.c's order, f32). Either becomes a tandem model (the JSON
 * below, docs/models.md) and a weights-only f32 checkpoint that tandem
 * generate and tandem eval load like any other.
 *
 * The model: an embedding with learned positions (context = the source's
 * n_positions), then per block x + attention(layernorm(x)) and
 * x + linear(gelu(linear(layernorm(x)))), a final layer norm and a linear
 * head without bias whose weight is the embedding's table ("tied": true,
 * unless the source keeps its own lm_head). Parameter names are tandem's
 * (layers.0.wte.weight, layers.1.1.qkv.weight, ...). */
#ifndef TANDEM_IMPORT_H
#define TANDEM_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/checkpoint.h"
#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a converted GPT-2 is. */
typedef struct td_gpt2_info {
    int64_t context;  /* positions: n_positions, llm.c's max_seq_len */
    int64_t vocab;    /* tokens (llm.c's padding rows dropped) */
    int64_t layers;   /* transformer blocks */
    int64_t heads;    /* attention heads */
    int64_t channels; /* n_embd */
    int64_t inner;    /* the MLP's hidden width (4 channels unless n_inner says) */
    double eps;       /* layer norms' epsilon */
    int tied;         /* the head is the embedding's table */
    size_t weights;   /* scalar parameters of the tandem model */
} td_gpt2_info;

/* Converts the Hugging Face GPT-2 in folder dir (config.json,
 * model.safetensors or the shards model.safetensors.index.json names;
 * tensors F32, F64, F16 or BF16, names with or without
 * the "transformer." prefix) into a tandem checkpoint at out (f32, written
 * atomically). With state NULL it holds the weights only (enough for
 * td_generate_load_model and tandem generate); else it is a training
 * checkpoint at state's step with state's metadata and the optimizer state
 * of state->opt all zeros (AdamW's moments, SGD's momentum buffers: what a
 * fresh optimizer starts from), which tandem eval and tandem train --resume
 * take. config.json must name a GPT-2
 * (model_type "gpt2", architectures GPT2LMHeadModel or GPT2Model), with an
 * activation tandem has (gelu_new, gelu_pytorch_tanh, gelu_fast: GELU's tanh
 * approximation; gelu, relu, tanh, sigmoid) and the plain attention scaling.
 * Every tensor must have the shape config.json implies, and every tensor of
 * the file must belong to the model (the attention-mask buffers aside).
 * Errors name the file and the field or tensor: TD_ERR_PARSE for
 * config.json, TD_ERR_SHAPE for a shape, TD_ERR_UNSUPPORTED for what tandem
 * cannot run, TD_ERR_CORRUPT for a damaged file. *info (may be NULL) is
 * filled on success. */
TD_API td_status td_import_hf_gpt2(const char *dir, const char *out, const td_train_state *state,
                                   td_gpt2_info *info);

/* What a converted transformers model is (td_import_hf). */
typedef struct td_hf_info {
    const char *arch;  /* "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM",
                          "MistralForCausalLM": a static string */
    int64_t context;   /* max_position_embeddings (n_positions) */
    int64_t vocab;     /* vocab_size */
    int64_t layers;    /* blocks */
    int64_t heads;     /* query heads */
    int64_t kv_heads;  /* key/value heads (= heads for GPT-2) */
    int64_t channels;  /* hidden_size */
    int64_t inner;     /* the MLP's hidden width (SwiGLU's intermediate_size) */
    double eps;        /* the norms' epsilon */
    double rope_theta; /* 0 for GPT-2 (learned positions) */
    int rope_scaled;   /* Llama 3's rope_scaling */
    int tied;          /* the head is the embedding's table */
    int qkv_bias;      /* biases on q, k and v */
    size_t weights;    /* scalar parameters of the tandem model */
} td_hf_info;

/* Converts the transformers model in folder dir, as save_pretrained writes
 * it, into a tandem checkpoint at out, as td_import_hf_gpt2 does (state
 * likewise). config.json's "architectures" (or, without it, "model_type")
 * picks the importer: GPT2LMHeadModel (td_import_hf_gpt2), or
 * LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, which become the
 * llama model of docs/models.md (RMSNorm, grouped-query attention with
 * rotary positions and Llama 3's rope_scaling, SwiGLU; Qwen2's q/k/v
 * biases; Llama's attention_bias and mlp_bias; a head tied to the embedding
 * when tie_word_embeddings says so). The weights are model.safetensors or
 * the shards model.safetensors.index.json names; F32, F64, F16 and BF16
 * tensors are converted to f32. Another architecture is TD_ERR_UNSUPPORTED
 * with the list of those tandem knows; so are a Mistral (or Qwen2) sliding
 * window shorter than the context, a head_dim other than hidden_size /
 * heads, an activation other than silu and a rope type other than llama3.
 * Errors name the file and the field or tensor, as td_import_hf_gpt2's: a
 * head count that is not a multiple of num_key_value_heads is TD_ERR_PARSE,
 * a missing shard TD_ERR_IO. *info (may be NULL) is filled on success. */
TD_API td_status td_import_hf(const char *dir, const char *out, const td_train_state *state,
                              td_hf_info *info);

/* Converts llm.c's GPT-2 checkpoint file (header[0] = 20240326, header[1] =
 * 3 for f32; header[2..7] = max_seq_len, vocab_size, num_layers, num_heads,
 * channels, padded_vocab_size) into a tandem checkpoint at out, as
 * td_import_hf_gpt2 does (state likewise). Another magic, version 5 (bf16) or any other
 * version, a size that disagrees with the header's shapes (truncated or
 * longer) are errors naming the file and the header field. */
TD_API td_status td_import_llmc_gpt2(const char *file, const char *out, const td_train_state *state,
                                     td_gpt2_info *info);

/* Reads llm.c's token file (header[0] = 20240520, header[1] = 1, header[2]
 * = the count, then that many uint16 tokens) into *tokens (malloc'ed: the
 * caller frees it) and *count. Errors as td_import_llmc_gpt2's. */
TD_API td_status td_import_llmc_tokens(const char *file, int32_t **tokens, size_t *count);

#ifdef __cplusplus
}
#endif
#endif
