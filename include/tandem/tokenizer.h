/* tandem: BPE tokenizers: GPT-2's byte-level BPE, read from the vocab.json
 * and merges.txt that Hugging Face's GPT2Tokenizer reads, and the BPE
 * models of tokenizers' tokenizer.json (td_bpe_load_json), byte-level or
 * SentencePiece-style.
 *
 * Encoding: the text (UTF-8 bytes) is cut at the special tokens (vocabulary
 * entries written "<|...|>", such as "<|endoftext|>", which become their
 * ids), each stretch between them is split as GPT-2's pre-tokenization
 * regex splits it,
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * each piece's bytes become GPT-2's printable byte characters, and pairs of
 * symbols are merged lowest merge rank first until no merge applies; each
 * symbol is then a token. Decoding maps tokens back to bytes.
 *
 * tokenizer.json's byte-level BPE goes the same way with its own special
 * tokens (added_tokens) and split pattern; its SentencePiece-style BPE
 * takes each stretch between special tokens whole, "▁" for its spaces (and
 * one put before it), each character a symbol, or its bytes' <0xXX> tokens
 * when the character is none (byte fallback).
 *
 * The split runs under PCRE2 with Unicode's classes (\p{L}, \p{N},
 * White_Space for \s), as Python's regex and tokenizers' Oniguruma run it;
 * bytes that are not valid UTF-8 match nothing and become pieces of their
 * own (the bytes always survive: decode(encode(t)) = t). */
#ifndef TANDEM_TOKENIZER_H
#define TANDEM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_bpe td_bpe;

/* Loads dir/tokenizer.json (with dir/tokenizer_config.json where present)
 * when it exists, else dir/vocab.json and dir/merges.txt. */
TD_API td_status td_bpe_load(const char *dir, td_bpe **out);
/* Loads a tokenizers tokenizer.json whose model is BPE: byte-level (a
 * ByteLevel pre-tokenizer, alone as GPT-2's, after a Split by a regex as
 * Llama 3's and Qwen2's, or after Digits as SmolLM's: each split's pieces
 * split by the next, the regexes under PCRE2 with Unicode classes)
 * or SentencePiece-style (spaces as "▁", put before the text by a Prepend
 * normalizer or a Metaspace pre-tokenizer, byte_fallback to <0xXX> tokens,
 * as Llama 2's and TinyLlama's). Its added_tokens are special tokens, cut
 * out of a text before anything else; a TemplateProcessing post-processor
 * gives the tokens td_bpe_encode_special puts around a text. An NFC
 * normalizer is accepted but not applied (text is taken as NFC already);
 * another normalizer, pre-tokenizer, split behaviour or model type is
 * TD_ERR_UNSUPPORTED naming the field. config_json (may be NULL or absent)
 * is tokenizer_config.json, whose eos_token becomes td_bpe_eos. Errors name
 * the file and the field (a merge naming a token the vocabulary lacks:
 * TD_ERR_PARSE, with the merge's index). The caller destroys *out. */
TD_API td_status td_bpe_load_json(const char *tokenizer_json, const char *config_json,
                                  td_bpe **out);
/* Loads the vocabulary (a JSON object from token to id, ids in [0, 2^24)
 * and distinct, every one of the 256 byte characters present) and the merges
 * (an optional "#version" line, then one "a b" pair a line, rank = order,
 * with a, b and ab all in the vocabulary). Errors name the file, and the
 * line or token: TD_ERR_IO, TD_ERR_PARSE. The caller destroys *out. */
TD_API td_status td_bpe_load_files(const char *vocab_json, const char *merges_txt, td_bpe **out);
/* NULL-safe. */
TD_API void td_bpe_destroy(td_bpe *t);

/* Ids are in [0, this): the largest id + 1. */
TD_API int64_t td_bpe_vocab_size(const td_bpe *t);

/* Encodes text[0..n) into *ids (malloc'ed, the caller frees it; NULL when
 * *count is 0) and *count. */
TD_API td_status td_bpe_encode(const td_bpe *t, const char *text, size_t n, int32_t **ids,
                               size_t *count);
/* The same with the special tokens tokenizer.json's post-processor puts
 * around a text (Llama's BOS before it, say), as tokenizers' encode(text)
 * with add_special_tokens; none for vocab.json + merges.txt. */
TD_API td_status td_bpe_encode_special(const td_bpe *t, const char *text, size_t n, int32_t **ids,
                                       size_t *count);
/* The end-of-sequence token (tokenizer_config.json's eos_token), after
 * which generation stops; -1 when the tokenizer names none. */
TD_API int32_t td_bpe_eos(const td_bpe *t);
/* The bytes of token id (*n of them), borrowed while t lives; NULL when no
 * token has that id. */
TD_API const char *td_bpe_token_bytes(const td_bpe *t, int32_t id, size_t *n);
/* Decodes ids[0..n) into *text (malloc'ed and NUL-terminated, *len bytes
 * before the NUL). An id without a token is TD_ERR_INVALID_ARG naming it. */
TD_API td_status td_bpe_decode(const td_bpe *t, const int32_t *ids, size_t n, char **text,
                               size_t *len);

#ifdef __cplusplus
}
#endif
#endif
