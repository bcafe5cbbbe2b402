/* Encoding (include/tandem/tokenizer.h): the text is cut at the special
 * tokens; each stretch between them is split by the pre-tokenizer's
 * pattern (PCRE2 with Unicode classes: GPT-2's, Llama 3's, Qwen2's; the
 * stretches between matches are pieces too, as tokenizers' "Isolated"
 * split keeps them), or, for SentencePiece, taken whole with "▁" for its
 * spaces; each piece becomes symbols (its bytes' tokens, or SentencePiece's
 * characters, falling back to <0xXX> byte tokens), which are merged lowest
 * rank first. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "gen/bpe-impl.h"

const char td__bpe_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

td_status td__bpe_set_split(td_bpe *t, const char *pattern, const char *where) {
    int err;
    PCRE2_SIZE off;
    if (t->nsplit == TD_BPE_SPLITS)
        return td__error(TD_ERR_UNSUPPORTED, "%s: more than %d split patterns", where,
                         TD_BPE_SPLITS);
    t->split[t->nsplit] =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!t->split[t->nsplit]) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return td__error(TD_ERR_PARSE, "%s: the split pattern, at offset %zu: %s", where,
                         (size_t)off, (const char *)msg);
    }
    t->nsplit++;
    return TD_OK;
}

void td__bpe_free_split(td_bpe *t) {
    for (int i = 0; i < t->nsplit; i++)
        pcre2_code_free(t->split[i]);
    t->nsplit = 0;
}

/* Merging ------------------------------------------------------------------------- */

typedef struct id_list {
    int32_t *v;
    size_t n, cap;
} id_list;

static td_status push(id_list *l, int32_t id) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        int32_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory encoding a text");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = id;
    return TD_OK;
}

/* Merges the symbols sym[0..*n) in place: the pair of lowest rank first,
 * every occurrence of it left to right, until no pair is a merge. */
static void merge_word(const td_bpe *t, int32_t *sym, size_t *n) {
    for (;;) {
        const td__bpe_pair_slot *best = NULL;
        int32_t a = 0, b = 0;
        size_t k = 0;
        for (size_t i = 0; i + 1 < *n; i++) {
            const td__bpe_pair_slot *p = td__bpe_pair_find(t, sym[i], sym[i + 1]);
            if (p && (!best || p->rank < best->rank))
                best = p, a = sym[i], b = sym[i + 1];
        }
        if (!best)
            return;
        for (size_t i = 0; i < *n; k++) {
            if (i + 1 < *n && sym[i] == a && sym[i + 1] == b) {
                sym[k] = best->id;
                i += 2;
            } else {
                sym[k] = sym[i++];
            }
        }
        *n = k;
    }
}

/* Pieces ---------------------------------------------------------------------------- */

/* A byte-level piece: its bytes' tokens, merged; with ignore_merges a
 * piece that is a token is that token (Llama 3's tokenizer.json). sym has
 * room for n symbols and buf for 2 n + 1 bytes. */
static td_status byte_level_piece(const td_bpe *t, const char *p, size_t n, int32_t *sym, char *buf,
                                  id_list *out) {
    for (size_t b = 0; b < n; b++)
        sym[b] = t->byte_id[(unsigned char)p[b]];
    if (t->ignore_merges) {
        size_t k = 0;
        int32_t id;
        for (size_t b = 0; b < n; b++) {
            /* the byte's character in UTF-8: the vocabulary's spelling */
            uint32_t c = t->to_char[(unsigned char)p[b]];
            if (c < 0x80)
                buf[k++] = (char)c;
            else
                buf[k++] = (char)(0xC0 | c >> 6), buf[k++] = (char)(0x80 | (c & 0x3F));
        }
        buf[k] = '\0';
        if ((id = td__bpe_str_find(t, buf)) >= 0)
            return push(out, id);
    }
    merge_word(t, sym, &n);
    for (size_t s = 0; s < n; s++)
        TD_CHECK(push(out, sym[s]));
    return TD_OK;
}

/* A SentencePiece stretch: "▁" before it (when the tokenizer prepends: to
 * every stretch, or with Metaspace to the `first`, at the text's start, or
 * to every one, unless it starts with a space) and
 * for each space; each character its token, or its bytes' <0xXX> tokens,
 * or the unknown token; merged. sym has room for 3 n + 3 symbols and buf
 * for 3 n + 4 bytes. */
static td_status sentencepiece_piece(const td_bpe *t, const char *p, size_t n, int first,
                                     int32_t *sym, char *buf, id_list *out) {
    size_t k = 0, ns = 0;
    /* Metaspace (prepend 2, 3) adds none before a text that has its space */
    if ((t->prepend == 1 || (t->prepend == 2 && first) || t->prepend == 3) &&
        !(t->prepend > 1 && n && p[0] == ' '))
        memcpy(buf, "\xe2\x96\x81", 3), k = 3;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ')
            memcpy(buf + k, "\xe2\x96\x81", 3), k += 3;
        else
            buf[k++] = p[i];
    }
    for (size_t i = 0; i < k;) {
        size_t cl;
        char ch[8] = {0};
        int32_t id;
        td__bpe_utf8_next((const unsigned char *)buf + i, k - i, &cl);
        memcpy(ch, buf + i, cl);
        if ((id = td__bpe_str_find(t, ch)) >= 0) {
            sym[ns++] = id;
        } else {
            int fell_back = 1;
            for (size_t b = 0; b < cl; b++)
                fell_back &= t->byte_id[(unsigned char)ch[b]] >= 0;
            if (fell_back)
                for (size_t b = 0; b < cl; b++)
                    sym[ns++] = t->byte_id[(unsigned char)ch[b]];
            else if (t->unk >= 0)
                sym[ns++] = t->unk;
            else
                return td__error(TD_ERR_INVALID_ARG,
                                 "a character (bytes 0x%02X...) has no token, no byte tokens and "
                                 "the tokenizer no unknown token",
                                 (unsigned char)ch[0]);
        }
        i += cl;
    }
    merge_word(t, sym, &ns);
    for (size_t s = 0; s < ns; s++)
        TD_CHECK(push(out, sym[s]));
    return TD_OK;
}

/* Splits text[0..len) by the patterns from `level` on, each piece of one
 * split again by the next, and encodes the last ones onto out. */
static td_status split_pieces(const td_bpe *t, int level, const char *text, size_t len,
                              int32_t *sym, char *buf, id_list *out) {
    pcre2_match_data *md;
    size_t at = 0;
    td_status st = TD_OK;
    if (level >= t->nsplit || level >= TD_BPE_SPLITS) /* (nsplit <= TD_BPE_SPLITS) */
        return byte_level_piece(t, text, len, sym, buf, out);
    if (!(md = pcre2_match_data_create_from_pattern(t->split[level], NULL)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory encoding a text");
    while (at < len && st == TD_OK) {
        int rc = pcre2_match(t->split[level], (PCRE2_SPTR)text, len, at, 0, md, NULL);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t from = rc >= 0 ? ov[0] : len, to = rc >= 0 ? ov[1] : len;
        if (from > at) /* what no match covers is a piece of its own */
            st = split_pieces(t, level + 1, text + at, from - at, sym, buf, out);
        if (st == TD_OK && to > from)
            st = split_pieces(t, level + 1, text + from, to - from, sym, buf, out);
        at = to > from ? to : from + 1; /* an empty match moves on by a byte */
        if (to == from && from < len && st == TD_OK)
            st = split_pieces(t, level + 1, text + from, 1, sym, buf, out);
    }
    pcre2_match_data_free(md);
    return st;
}

/* Encodes text[0..len) (no special tokens in it; `first`: at the start of
 * the whole text) onto out. */
static td_status encode_plain(const td_bpe *t, const char *text, size_t len, int first,
                              id_list *out) {
    int32_t *sym = NULL;
    char *buf = NULL;
    td_status st;
    if (!len)
        return TD_OK;
    if (!(sym = td__calloc((3 * len + 3) * sizeof *sym, "a text")) ||
        !(buf = td__calloc(3 * len + 4, "a text"))) {
        free(sym);
        return TD_ERR_OUT_OF_MEMORY;
    }
    st = t->sentencepiece ? sentencepiece_piece(t, text, len, first, sym, buf, out)
                          : split_pieces(t, 0, text, len, sym, buf, out);
    free(sym);
    free(buf);
    return st;
}

/* Special tokens ----------------------------------------------------------------------- */

/* The first special token in text[0..len) at or after `from`: its place,
 * or len; the longest one when several start there. */
static size_t next_special(const td_bpe *t, const char *text, size_t len, size_t from,
                           const td__bpe_special **which) {
    *which = NULL;
    for (size_t i = from; i < len && t->nspecials; i++) {
        for (size_t k = 0; k < t->nspecials; k++) {
            const td__bpe_special *s = &t->specials[k];
            if (s->len && s->len <= len - i && text[i] == s->text[0] &&
                !memcmp(text + i, s->text, s->len) && (!*which || s->len > (*which)->len))
                *which = s;
        }
        if (*which)
            return i;
    }
    return len;
}

static td_status encode(const td_bpe *t, const char *text, size_t n, int with_specials,
                        int32_t **ids, size_t *count) {
    id_list out = {NULL, 0, 0};
    size_t pos = 0;
    td_status st = TD_OK;
    if (!ids || !count)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_encode: ids or count is NULL");
    *ids = NULL;
    *count = 0;
    if (!t || (!text && n))
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_encode: tokenizer or text is NULL");
    for (int i = 0; with_specials && i < t->nprefix && st == TD_OK; i++)
        st = push(&out, t->prefix[i]);
    while (pos < n && st == TD_OK) {
        const td__bpe_special *s;
        size_t at = next_special(t, text, n, pos, &s);
        if ((st = encode_plain(t, text + pos, at - pos, pos == 0, &out)) == TD_OK && s)
            st = push(&out, s->id);
        pos = s ? at + s->len : n;
    }
    for (int i = 0; with_specials && i < t->nsuffix && st == TD_OK; i++)
        st = push(&out, t->suffix[i]);
    if (st != TD_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *count = out.n;
    return TD_OK;
}

td_status td_bpe_encode(const td_bpe *t, const char *text, size_t n, int32_t **ids, size_t *count) {
    return encode(t, text, n, 0, ids, count);
}

td_status td_bpe_encode_special(const td_bpe *t, const char *text, size_t n, int32_t **ids,
                                size_t *count) {
    return encode(t, text, n, 1, ids, count);
}

int32_t td_bpe_eos(const td_bpe *t) {
    return t ? t->eos : -1;
}
