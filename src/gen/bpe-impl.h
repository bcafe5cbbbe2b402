/* What the tokenizer's files share: the td_bpe object, its hash tables and
 * the vocabulary and merge loaders that both file layouts use. bpe.c loads
 * vocab.json + merges.txt and decodes, tokenizer_json.c loads
 * tokenizer.json, bpe_encode.c splits and merges.
 *
 * Symbols are token ids from the start: each byte's (or character's) token,
 * then each merge replaces a pair of ids with the id of their concatenation.
 * That is BPE's merging over strings, because loading requires both halves
 * and the result of every merge to be tokens, and token strings and ids are
 * one to one. Two hash tables serve it: token text to id (for loading) and
 * pair of ids to (rank, merged id). */
#ifndef TD_GEN_BPE_IMPL_H
#define TD_GEN_BPE_IMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem/tokenizer.h"

#define TD_BPE_NO_CODEPOINT   0xFFFFFFFFu
#define TD_BPE_MAX_ID         ((json_int_t)1 << 24)
#define TD_BPE_BYTE_CHARS     324 /* GPT-2's byte characters are below U+0144 */
#define TD_BPE_TEMPLATE       8   /* special tokens a template may put around a text */
#define TD_BPE_SPLITS         4   /* split patterns one after the other */
#define TD_BPE_JSON_MAX_BYTES ((size_t)256 << 20) /* vocab.json, tokenizer.json and its config */

/* Token text (UTF-8) to id, open addressing. */
typedef struct td__bpe_str_slot {
    const char *key; /* borrowed from the vocabulary's JSON, which t keeps */
    int32_t id;
} td__bpe_str_slot;

/* (left id, right id) to (rank, merged id), open addressing; key 0 is free
 * because ids are stored plus one. */
typedef struct td__bpe_pair_slot {
    uint64_t key;
    int32_t rank, id;
} td__bpe_pair_slot;

typedef struct td__bpe_special {
    const char *text; /* its bytes, borrowed from the JSON */
    size_t len;
    int32_t id;
} td__bpe_special;

struct td_bpe {
    json_t *vocab_json; /* vocab.json's object, or tokenizer.json's */
    td__bpe_str_slot *strs;
    size_t nstr_slots;
    td__bpe_pair_slot *pairs;
    size_t npair_slots;
    char **bytes;   /* per id: its decoded bytes (NULL: no token) */
    size_t *nbytes; /* and their count */
    int64_t size;
    int32_t byte_id[256];                 /* each byte's token (byte level), or -1 */
    int16_t from_char[TD_BPE_BYTE_CHARS]; /* each byte character's byte, or -1 */
    uint16_t to_char[256];                /* and each byte's character */
    td__bpe_special *specials;
    size_t nspecials;
    /* tokenizer.json's choices (tokenizer_json.c); all 0 or -1 for GPT-2's files */
    int sentencepiece;          /* "▁" for spaces, characters as tokens, <0xXX> byte fallback */
    int prepend;                /* SentencePiece: "▁" put before each stretch of text */
    int ignore_merges;          /* a piece that is a token is that token, unmerged */
    void *split[TD_BPE_SPLITS]; /* the pre-tokenizers' patterns (pcre2_code), in order: */
    int nsplit;                 /* each piece of one is split by the next */
    int32_t unk;                /* the unknown token, or -1 */
    int32_t eos;                /* the end-of-sequence token, or -1 */
    int32_t prefix[TD_BPE_TEMPLATE], suffix[TD_BPE_TEMPLATE];
    int nprefix, nsuffix; /* the post-processor's special tokens around a text */
};

/* The code point at s[0..n) and its length in *len; an invalid or cut
 * sequence is one byte long and TD_BPE_NO_CODEPOINT. */
uint32_t td__bpe_utf8_next(const unsigned char *s, size_t n, size_t *len);

/* The id of token text key, or -1. */
int32_t td__bpe_str_find(const td_bpe *t, const char *key);
/* The merge of (a, b), or NULL. */
const td__bpe_pair_slot *td__bpe_pair_find(const td_bpe *t, int32_t a, int32_t b);

/* Takes the vocabulary object `vocab` (token to id) into t, which keeps
 * its strings borrowed (t->vocab_json must hold them): ids in [0, 2^24) and
 * distinct; for a byte-level BPE every byte character a token and every
 * token made of them; for SentencePiece the byte tokens <0xXX> where
 * present. `where` names it in errors (TD_ERR_PARSE). With `gpt2_specials`
 * tokens written "<|...|>" become special tokens (vocab.json's rule). */
td_status td__bpe_set_vocab(td_bpe *t, json_t *vocab, const char *where, int gpt2_specials);

/* Allocates the merge table for n merges. */
td_status td__bpe_merges_init(td_bpe *t, size_t n);
/* Adds merge (a, b) of rank `rank`; a, b and ab must be tokens, else
 * TD_ERR_PARSE naming `where` and the token that is not. */
td_status td__bpe_add_merge(td_bpe *t, const char *where, const char *a, const char *b,
                            int32_t rank);

/* Adds special token `text` (borrowed) with id. */
td_status td__bpe_add_special(td_bpe *t, const char *text, int32_t id);

/* Loads tokenizer.json at path (tokenizer_json.c) into t, with
 * tokenizer_config.json's eos_token when config is not NULL and exists. */
td_status td__bpe_load_json(td_bpe *t, const char *path, const char *config);

/* Compiles a split pattern after t's others (PCRE2, Unicode classes);
 * `where` names it in errors. Frees them: td__bpe_free_split. */
td_status td__bpe_set_split(td_bpe *t, const char *pattern, const char *where);
void td__bpe_free_split(td_bpe *t);

/* GPT-2's pre-tokenization pattern. */
extern const char td__bpe_gpt2_pattern[];

#endif
