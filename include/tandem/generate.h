/* tandem: text generation from a token model (a GPT): a decoder that keeps
 * each attention layer's keys and values (the KV cache) so that one more
 * token costs one position's forward, and a generator that samples from it.
 *
 * The decoder is the nn layer's (one model, or one tensor-parallel shard,
 * on one device); a strategy makes decoders over several devices
 * (td_strategy_decoder_create in strategy.h) through td_decoder_create_custom.
 * The generator sits above them, as the trainer does. */
#ifndef TANDEM_GENERATE_H
#define TANDEM_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The decoder ------------------------------------------------------------------
 *
 * A decoder runs a loaded whole model (td_model_load*), a tensor-parallel
 * shard (td_model_load_shard) or a pipeline part (td_model_load_part; see
 * td_decoder_part_pass) of a model that reads tokens and gives logits per position: an embedding
 * first, then layers that act on each position alone (linear, layer norm, activations, dropout,
 * which is the identity here) or causal attention, in residual and sequential blocks. Its cache
 * holds the model's context length T (its input's tokens) positions. It computes on the model's
 * device with that device's kernels, in the model's dtype, and uses the model's activation memory
 * as its workspace: training or evaluating the model between two decoder calls is allowed (the
 * cache is the decoder's own), and the next decoder call carves the workspace again. One thread at
 * a time. */

typedef struct td_decoder td_decoder;

/* Creates a decoder for m (borrowed: it must outlive the decoder) with a
 * cache of m's context length, allocated on m's device. A model the decoder
 * cannot run is TD_ERR_UNSUPPORTED naming the reason: a features model, a
 * part or shard, a layer that is not position-wise (flatten, conv2d, pool),
 * an output other than (T, vocabulary). The caller destroys *out. */
TD_API td_status td_decoder_create(td_model *m, td_decoder **out);
/* Hands d its model: td_decoder_destroy then destroys the model too, so a
 * caller that built a model only to decode it can hand out d alone. The
 * model is then d's alone: its gradients and, with compact weights, the
 * f32 copies of the matrices d reads packed are freed. */
TD_API void td_decoder_take_model(td_decoder *d);
/* NULL-safe. */
TD_API void td_decoder_destroy(td_decoder *d);

/* What decoders created after this call keep keys and values in: the
 * model's dtype (the default), or f16 or bf16 (rounded to nearest even),
 * which halves every layer's cache but for one f32 work cache the layers
 * share (an f32 model only; else td_decoder_create fails with
 * TD_ERR_DTYPE). Process-wide and thread-safe (tandem generate --kv-cache). */
typedef enum td_kv_cache {
    TD_KV_CACHE_MODEL = 0,
    TD_KV_CACHE_F16 = 1,
    TD_KV_CACHE_BF16 = 2,
} td_kv_cache;
TD_API void td_decoder_set_default_kv_cache(td_kv_cache kind);
/* Device bytes d's key/value caches take (0 for a custom decoder). */
TD_API size_t td_decoder_kv_bytes(const td_decoder *d);

/* Positions the cache holds: the model's context length T. */
TD_API int64_t td_decoder_context(const td_decoder *d);
/* Logits per position (the vocabulary of the head). */
TD_API int64_t td_decoder_vocab(const td_decoder *d);
/* Token ids the embedding reads: [0, this). */
TD_API int64_t td_decoder_token_limit(const td_decoder *d);
/* Positions filled: the next token's position. */
TD_API int64_t td_decoder_position(const td_decoder *d);

/* Empties the cache and runs tokens[0..n) (1 <= n <= T) at positions
 * [0, n) in one batched pass, filling every attention layer's cache.
 * logits (NULL: not read) gets the vocab logits of position n - 1, as
 * doubles. A token outside [0, token limit) or a bad n is
 * TD_ERR_INVALID_ARG naming it; the cache is then empty. */
TD_API td_status td_decoder_prefill(td_decoder *d, const int32_t *tokens, int64_t n,
                                    double *logits);
/* Runs one token at the next position (td_decoder_position), reading the
 * cache of the positions before and adding its own; logits as prefill's.
 * A full cache (position T) is TD_ERR_INVALID_ARG: the caller re-prefills a
 * shorter window (td_generate slides, see below). */
TD_API td_status td_decoder_step(td_decoder *d, int32_t token, double *logits);

/* Makes the decoder compute and read only logits [first, first + count) of
 * the model's head (its last layer, a whole linear): prefill and step then
 * write only those entries of logits. The decoders of one model's shards
 * take a slice each, so that they share the reading of the head. count 0:
 * no logits at all (another decoder gives them). A part of the vocabulary
 * when the head is not a whole linear is TD_ERR_UNSUPPORTED; a range
 * outside the vocabulary TD_ERR_INVALID_ARG. */
TD_API td_status td_decoder_set_vocab_slice(td_decoder *d, int64_t first, int64_t count);

/* Pipeline stages: a decoder of a model part (td_model_load_part) keeps the
 * cache of its own attention layers and runs its layers over n rows: the
 * first part reads tokens[0..n), a later one the previous part's output
 * rows (in: n rows of its input width on any device, copied in), and only
 * the last part gives logits. pos 0 empties the cache; otherwise pos is the
 * cache's position and n is 1. Call it from a thread that is no device's.
 * A bad pos, n or argument is TD_ERR_INVALID_ARG naming it. */
TD_API td_status td_decoder_part_pass(td_decoder *d, const int32_t *tokens, const td_buffer *in,
                                      int64_t pos, int64_t n, double *logits);
/* The rows the part's last pass gave, on its device, until its next pass;
 * NULL before the first. */
TD_API const td_buffer *td_decoder_part_output(const td_decoder *d);

/* A decoder whose passes someone else runs. pass runs tokens[0..n) at
 * positions [pos, pos + n) of one sequence (pos 0: the cache is emptied
 * first) and, when logits is not NULL, writes the vocab logits of position
 * pos + n - 1; the decoder checks the tokens and keeps the position.
 * destroy (may be NULL) frees impl with the decoder. */
typedef struct td_decoder_impl {
    td_status (*pass)(void *impl, const int32_t *tokens, int64_t pos, int64_t n, double *logits);
    void (*destroy)(void *impl);
    void *impl;
    int64_t context, vocab, token_limit;
} td_decoder_impl;
/* *out drives impl (copied). */
TD_API td_status td_decoder_create_custom(const td_decoder_impl *impl, td_decoder **out);

/* The generator ----------------------------------------------------------------- */

/* The most tokens one td_generate call makes: past the context generation
 * goes on by sliding the window, so without a bound a mistyped count runs
 * until the process is killed. */
#define TD_GENERATE_MAX_TOKENS ((int64_t)1000000)

typedef struct td_generate_config {
    int64_t tokens;      /* tokens to generate, in [0, TD_GENERATE_MAX_TOKENS] */
    double temperature;  /* logits are divided by it; 0: greedy (arg-max, ties to the lower id) */
    int64_t top_k;       /* sample among the k likeliest; 0: all */
    double top_p;        /* then among the fewest likeliest whose probability reaches p; 1: all */
    uint64_t seed;       /* token i draws number i of this Philox stream (td_rng_uniform) */
    int64_t token_limit; /* sample only ids [0, limit) (256 for bytes); 0: the vocabulary */
} td_generate_config;

#define TD_GENERATE_CONFIG_INIT                                                                    \
    { .tokens = 100, .temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 0, .token_limit = 0 }

/* Called with each generated token as soon as it is chosen (the text can be
 * streamed); a nonzero return stops generation after it. */
typedef int (*td_token_fn)(void *arg, int32_t token);

typedef struct td_generate_stats {
    int64_t prompt_tokens;    /* prefilled at the start (the prompt's last T at most) */
    int64_t generated_tokens; /* chosen and passed to the callback */
    int64_t slides;           /* times the window was re-prefilled */
    double prefill_ms;        /* the prompt's prefill */
    double decode_ms;         /* choosing every token, the steps and re-prefills after */
} td_generate_stats;

/* Prefills the prompt tokens[0..n) (n >= 1; only its last T tokens when it
 * is longer than the context), then chooses cfg->tokens tokens one at a time
 * from the last position's logits, calling fn (may be NULL) with each.
 * When the cache is full the window slides: the last max(1, T / 2) tokens
 * are prefilled again at positions [0, T / 2), as the model saw windows of
 * text in training, and decoding goes on. The same seed and settings give
 * the same tokens every time, on any device of one dtype up to rounding.
 * Bad settings (tokens outside [0, TD_GENERATE_MAX_TOKENS], temperature < 0
 * or not finite, top_k < 0, top_p outside (0, 1], a limit over the
 * vocabulary) are TD_ERR_INVALID_ARG naming them.
 * *stats (may be NULL) is filled on return, also after a failure. */
TD_API td_status td_generate(td_decoder *d, const int32_t *prompt, int64_t n,
                             const td_generate_config *cfg, td_token_fn fn, void *arg,
                             td_generate_stats *stats);

/* Chooses a token from logits[0..vocab) as td_generate does for its token
 * number `index`: the settings of cfg (its `tokens` unused), the random
 * number td_rng_uniform(cfg->seed, index). *token gets the id. */
TD_API td_status td_generate_choose(const double *logits, int64_t vocab,
                                    const td_generate_config *cfg, uint64_t index, int32_t *token);

/* Creates the model a checkpoint holds on dev in dtype, whatever the
 * checkpoint's (its values converted), with its weights. Errors name the
 * file and the tensor. The caller destroys *out. */
TD_API td_status td_generate_load_model(const char *checkpoint, td_device *dev, td_dtype dtype,
                                        td_model **out);

#ifdef __cplusplus
}
#endif
#endif
