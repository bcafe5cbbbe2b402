/* BPE tokenizers (include/tandem/tokenizer.h): loading GPT-2's vocab.json
 * and merges.txt, the vocabulary and merge tables tokenizer.json also fills
 * (bpe-impl.h), each token's bytes, decoding. Encoding: bpe_encode.c. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "gen/bpe-impl.h"

#define MERGES_MAX ((long)256 << 20)
#define MAX_ID     TD_BPE_MAX_ID

typedef td__bpe_str_slot str_slot;
typedef td__bpe_pair_slot pair_slot;

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
 * others (control characters, space, 0x7F-0xA0, 0xAD) for U+0100 on. */
static uint32_t byte_char(int b) {
    int n = 0;
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return (uint32_t)b;
    for (int i = 0; i < b; i++)
        if (!((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF)))
            n++;
    return 256u + (uint32_t)n;
}

/* UTF-8 ---------------------------------------------------------------------------- */

uint32_t td__bpe_utf8_next(const unsigned char *s, size_t n, size_t *len) {
    uint32_t c = s[0], min;
    size_t k;
    *len = 1;
    if (c < 0x80)
        return c;
    if ((c & 0xE0) == 0xC0)
        k = 2, c &= 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        k = 3, c &= 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        k = 4, c &= 0x07, min = 0x10000;
    else
        return TD_BPE_NO_CODEPOINT;
    if (k > n)
        return TD_BPE_NO_CODEPOINT;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return TD_BPE_NO_CODEPOINT;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return TD_BPE_NO_CODEPOINT;
    *len = k;
    return c;
}

/* Hash tables ------------------------------------------------------------------------ */

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

int32_t td__bpe_str_find(const td_bpe *t, const char *key) {
    size_t mask = t->nstr_slots - 1;
    for (size_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
        if (!t->strs[i].key)
            return -1;
        if (!strcmp(t->strs[i].key, key))
            return t->strs[i].id;
    }
}

static void str_put(td_bpe *t, const char *key, int32_t id) {
    size_t mask = t->nstr_slots - 1, i = hash_str(key) & mask;
    while (t->strs[i].key)
        i = (i + 1) & mask;
    t->strs[i].key = key;
    t->strs[i].id = id;
}

static uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a + 1) << 32 | ((uint64_t)(uint32_t)b + 1);
}

const td__bpe_pair_slot *td__bpe_pair_find(const td_bpe *t, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    size_t mask = t->npair_slots - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (!t->pairs[i].key)
            return NULL;
        if (t->pairs[i].key == key)
            return &t->pairs[i];
    }
}

/* A pair merged again keeps its later rank, as a Python dict built from
 * merges.txt does. */
static void pair_put(td_bpe *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = pair_key(a, b);
    size_t mask = t->npair_slots - 1, i = hash_u64(key) & mask;
    while (t->pairs[i].key && t->pairs[i].key != key)
        i = (i + 1) & mask;
    t->pairs[i].key = key;
    t->pairs[i].rank = rank;
    t->pairs[i].id = id;
}

static size_t pow2_above(size_t n) {
    size_t p = 16;
    while (p < 2 * n)
        p *= 2;
    return p;
}

/* The vocabulary ------------------------------------------------------------------ */

/* The bytes a byte-level token's characters stand for, or an error naming it. */
static td_status byte_level_bytes(const td_bpe *t, const char *where, const char *tok, char *b,
                                  size_t *n) {
    size_t len = strlen(tok), k = 0;
    for (size_t i = 0; i < len;) {
        size_t cl;
        uint32_t c = td__bpe_utf8_next((const unsigned char *)tok + i, len - i, &cl);
        if (c >= TD_BPE_BYTE_CHARS || t->from_char[c] < 0)
            return td__error(TD_ERR_PARSE,
                             "%s: token \"%.64s\": character U+%04X is not one of GPT-2's byte "
                             "characters",
                             where, tok, c == TD_BPE_NO_CODEPOINT ? 0xFFFDu : c);
        b[k++] = (char)t->from_char[c];
        i += cl;
    }
    *n = k;
    return TD_OK;
}

/* <0xXX>: SentencePiece's byte token for byte XX, or -1. */
static int sp_byte(const char *tok) {
    unsigned v;
    char end;
    if (strlen(tok) != 6 || strncmp(tok, "<0x", 3) != 0 ||
        sscanf(tok + 3, "%2x%c", &v, &end) != 2 || end != '>')
        return -1;
    return (int)v;
}

/* A SentencePiece token's bytes: "▁" a space, <0xXX> its byte. */
static void sentencepiece_bytes(const char *tok, char *b, size_t *n) {
    size_t k = 0;
    int byte = sp_byte(tok);
    if (byte >= 0) {
        b[0] = (char)byte;
        *n = 1;
        return;
    }
    for (const char *p = tok; *p;) {
        if (!strncmp(p, "\xe2\x96\x81", 3)) {
            b[k++] = ' ';
            p += 3;
        } else {
            b[k++] = *p++;
        }
    }
    *n = k;
}

/* Token id's bytes. With `raw_else`, a byte-level token that is not made of
 * byte characters keeps its UTF-8 as its bytes: tokenizer.json's vocabulary
 * may hold its added tokens ("<|im start|>", say), which are special. */
static td_status token_bytes(td_bpe *t, const char *where, const char *tok, int32_t id,
                             int raw_else) {
    char *b = td__calloc(strlen(tok) + 1, "a token");
    td_status st;
    if (!b)
        return TD_ERR_OUT_OF_MEMORY;
    if (t->sentencepiece)
        sentencepiece_bytes(tok, b, &t->nbytes[id]);
    else if ((st = byte_level_bytes(t, where, tok, b, &t->nbytes[id])) != TD_OK) {
        if (!raw_else) {
            free(b);
            return st;
        }
        memcpy(b, tok, strlen(tok));
        t->nbytes[id] = strlen(tok);
    }
    t->bytes[id] = b;
    return TD_OK;
}

static int is_gpt2_special(const char *tok) {
    size_t n = strlen(tok);
    return n > 4 && !strncmp(tok, "<|", 2) && !strcmp(tok + n - 2, "|>");
}

td_status td__bpe_add_special(td_bpe *t, const char *tok, int32_t id) {
    td__bpe_special *s = realloc(t->specials, (t->nspecials + 1) * sizeof *s);
    if (!s)
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory loading a tokenizer");
    t->specials = s;
    s[t->nspecials].text = tok;
    s[t->nspecials].len = strlen(tok);
    s[t->nspecials++].id = id;
    return TD_OK;
}

/* Each byte's token: its byte character's (byte level) or <0xXX>. */
static td_status find_byte_tokens(td_bpe *t, const char *where) {
    for (int b = 0; b < 256; b++) {
        char s[8] = {0};
        uint32_t c = byte_char(b);
        if (t->sentencepiece)
            snprintf(s, sizeof s, "<0x%02X>", b);
        else if (c < 0x80) /* one character, in UTF-8 */
            s[0] = (char)c;
        else
            s[0] = (char)(0xC0 | c >> 6), s[1] = (char)(0x80 | (c & 0x3F));
        if ((t->byte_id[b] = td__bpe_str_find(t, s)) < 0 && !t->sentencepiece)
            return td__error(TD_ERR_PARSE,
                             "%s: no token for byte 0x%02X (\"%s\"); a byte-level BPE vocabulary "
                             "holds all 256",
                             where, b, s);
    }
    return TD_OK;
}

td_status td__bpe_set_vocab(td_bpe *t, json_t *vocab, const char *where, int gpt2_specials) {
    const char *tok;
    json_t *v;
    json_int_t max = -1;
    for (int i = 0; i < TD_BPE_BYTE_CHARS; i++)
        t->from_char[i] = -1;
    for (int i = 0; i < 256; i++) {
        t->to_char[i] = (uint16_t)byte_char(i);
        t->from_char[t->to_char[i]] = (int16_t)i;
    }
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return td__error(TD_ERR_PARSE, "%s: expected an object from token to id", where);
    json_object_foreach(vocab, tok, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
            return td__error(TD_ERR_PARSE, "%s: token \"%.64s\": id is not an integer in [0, %lld)",
                             where, tok, (long long)MAX_ID);
        if (json_integer_value(v) > max)
            max = json_integer_value(v);
    }
    t->size = max + 1;
    t->nstr_slots = pow2_above(json_object_size(vocab));
    if (!(t->strs = td__calloc(t->nstr_slots * sizeof *t->strs, "a vocabulary")) ||
        !(t->bytes = td__calloc((size_t)t->size * sizeof *t->bytes, "a vocabulary")) ||
        !(t->nbytes = td__calloc((size_t)t->size * sizeof *t->nbytes, "a vocabulary")))
        return TD_ERR_OUT_OF_MEMORY;
    json_object_foreach(vocab, tok, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->bytes[id])
            return td__error(TD_ERR_PARSE, "%s: token \"%.64s\": id %d is another token's too",
                             where, tok, id);
        TD_CHECK(token_bytes(t, where, tok, id, !gpt2_specials));
        str_put(t, tok, id);
        if (gpt2_specials && is_gpt2_special(tok))
            TD_CHECK(td__bpe_add_special(t, tok, id));
    }
    return find_byte_tokens(t, where);
}

static td_status read_vocab(td_bpe *t, const char *file) {
    TD_CHECK(td__read_json_file(file, TD_BPE_JSON_MAX_BYTES, 0, &t->vocab_json));
    return td__bpe_set_vocab(t, t->vocab_json, file, 1);
}

/* merges.txt ---------------------------------------------------------------------- */

static td_status read_text(const char *file, char **out) {
    FILE *f = fopen(file, "rb");
    long len;
    *out = NULL;
    if (!f)
        return td__error(TD_ERR_IO, "%s: cannot open: %s", file, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || len > MERGES_MAX ||
        fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return td__error(TD_ERR_IO, "%s: cannot read its size, or it is over %ld bytes", file,
                         MERGES_MAX);
    }
    if (!(*out = td__calloc((size_t)len + 1, "merges"))) {
        fclose(f);
        return TD_ERR_OUT_OF_MEMORY;
    }
    if (fread(*out, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        return td__error(TD_ERR_IO, "%s: read failed", file);
    }
    fclose(f);
    return TD_OK;
}

td_status td__bpe_merges_init(td_bpe *t, size_t n) {
    t->npair_slots = pow2_above(n);
    if (!(t->pairs = td__calloc(t->npair_slots * sizeof *t->pairs, "merges")))
        return TD_ERR_OUT_OF_MEMORY;
    return TD_OK;
}

td_status td__bpe_add_merge(td_bpe *t, const char *where, const char *a, const char *b,
                            int32_t rank) {
    char joined[1024];
    int32_t ia, ib, iab;
    if (strlen(a) + strlen(b) >= sizeof joined)
        return td__error(TD_ERR_PARSE, "%s: a merge longer than %zu bytes", where, sizeof joined);
    snprintf(joined, sizeof joined, "%s%s", a, b);
    if ((ia = td__bpe_str_find(t, a)) < 0 || (ib = td__bpe_str_find(t, b)) < 0 ||
        (iab = td__bpe_str_find(t, joined)) < 0)
        return td__error(TD_ERR_PARSE,
                         "%s: \"%.64s %.64s\": \"%.128s\" is not in the vocabulary (it does not "
                         "cover the merges)",
                         where, a, b,
                         ia < 0   ? a
                         : ib < 0 ? b
                                  : joined);
    pair_put(t, ia, ib, rank, iab);
    return TD_OK;
}

/* One "a b" line (cut at its end, CR dropped) as a merge of rank `rank`. */
static td_status read_merge(td_bpe *t, const char *file, int line, char *s, int32_t rank) {
    char *sp = strchr(s, ' '), where[4200];
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
        return td__error(TD_ERR_PARSE, "%s:%d: expected two tokens separated by one space", file,
                         line);
    *sp = '\0';
    snprintf(where, sizeof where, "%s:%d", file, line);
    return td__bpe_add_merge(t, where, s, sp + 1, rank);
}

static td_status read_merges(td_bpe *t, const char *file) {
    char *text = NULL, *p, *next;
    size_t lines = 1;
    int32_t rank = 0;
    int line = 0;
    td_status st;
    TD_CHECK(read_text(file, &text));
    for (p = text; *p; p++)
        lines += *p == '\n';
    if ((st = td__bpe_merges_init(t, lines)) != TD_OK) {
        free(text);
        return st;
    }
    for (p = text; p && *p; p = next) {
        size_t n;
        next = strchr(p, '\n');
        if (next)
            *next++ = '\0';
        line++;
        n = strlen(p);
        if (n && p[n - 1] == '\r')
            p[--n] = '\0';
        if (!n || (line == 1 && !strncmp(p, "#version", 8)))
            continue;
        if ((st = read_merge(t, file, line, p, rank++)) != TD_OK) {
            free(text);
            return st;
        }
    }
    free(text);
    return TD_OK;
}

td_status td_bpe_load_files(const char *vocab_json, const char *merges_txt, td_bpe **out) {
    td_bpe *t;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load_files: out is NULL");
    *out = NULL;
    if (!vocab_json || !merges_txt)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load_files: a path is NULL");
    if (!(t = td__calloc(sizeof *t, "a tokenizer")))
        return TD_ERR_OUT_OF_MEMORY;
    t->unk = t->eos = -1;
    TD_TRY(read_vocab(t, vocab_json));
    TD_TRY(read_merges(t, merges_txt));
    TD_TRY(td__bpe_set_split(t, td__bpe_gpt2_pattern, vocab_json));
    *out = t;
    return TD_OK;
fail:
    td_bpe_destroy(t);
    return st;
}

td_status td_bpe_load_json(const char *tokenizer_json, const char *config_json, td_bpe **out) {
    td_bpe *t;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load_json: out is NULL");
    *out = NULL;
    if (!tokenizer_json)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load_json: the path is NULL");
    if (!(t = td__calloc(sizeof *t, "a tokenizer")))
        return TD_ERR_OUT_OF_MEMORY;
    TD_TRY(td__bpe_load_json(t, tokenizer_json, config_json));
    *out = t;
    return TD_OK;
fail:
    td_bpe_destroy(t);
    return st;
}

td_status td_bpe_load(const char *dir, td_bpe **out) {
    char v[4096], m[4096];
    FILE *f;
    if (!dir) {
        if (out)
            *out = NULL;
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load: dir is NULL");
    }
    snprintf(v, sizeof v, "%s/tokenizer.json", dir);
    if ((f = fopen(v, "rb")) != NULL) {
        fclose(f);
        snprintf(m, sizeof m, "%s/tokenizer_config.json", dir);
        return td_bpe_load_json(v, m, out);
    }
    snprintf(v, sizeof v, "%s/vocab.json", dir);

    snprintf(m, sizeof m, "%s/merges.txt", dir);
    return td_bpe_load_files(v, m, out);
}

void td_bpe_destroy(td_bpe *t) {
    if (!t)
        return;
    for (int64_t i = 0; t->bytes && i < t->size; i++)
        free(t->bytes[i]);
    free(t->bytes);
    free(t->nbytes);
    free(t->strs);
    free(t->pairs);
    free(t->specials);
    td__bpe_free_split(t);
    json_decref(t->vocab_json);
    free(t);
}

int64_t td_bpe_vocab_size(const td_bpe *t) {
    return t ? t->size : 0;
}

const char *td_bpe_token_bytes(const td_bpe *t, int32_t id, size_t *n) {
    if (!t || id < 0 || id >= t->size || !t->bytes[id])
        return NULL;
    if (n)
        *n = t->nbytes[id];
    return t->bytes[id];
}

td_status td_bpe_decode(const td_bpe *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    size_t total = 0;
    char *s;
    if (!text || !len)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_decode: text or len is NULL");
    *text = NULL;
    *len = 0;
    if (!t || (!ids && n))
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_decode: tokenizer or ids is NULL");
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (!td_bpe_token_bytes(t, ids[i], &k))
            return td__error(TD_ERR_INVALID_ARG,
                             "td_bpe_decode: id %d at %zu is no token (the vocabulary has %lld)",
                             (int)ids[i], i, (long long)t->size);
        total += k;
    }
    if (!(s = td__calloc(total + 1, "a decoded text")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0, at = 0; i < n; i++) {
        memcpy(s + at, t->bytes[ids[i]], t->nbytes[ids[i]]);
        at += t->nbytes[ids[i]];
    }
    if (t->sentencepiece && t->prepend && total && s[0] == ' ') {
        /* the space SentencePiece put before the text */
        memmove(s, s + 1, total--);
    }
    *text = s;
    *len = total;
    return TD_OK;
}
