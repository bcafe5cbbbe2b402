/* GPT-2's byte-level BPE (include/tandem/tokenizer.h): loading vocab.json
 * and merges.txt, the pre-tokenization split, merging by rank, decoding.
 *
 * Symbols are token ids from the start: each byte's one-character token,
 * then each merge replaces a pair of ids with the id of their concatenation.
 * That is GPT-2's merging over strings, because loading requires both halves
 * and the result of every merge to be tokens, and token strings and ids are
 * one to one. Two hash tables serve it: token text to id (for loading) and
 * pair of ids to (rank, merged id). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "tandem/tokenizer.h"

#define MAX_ID          ((json_int_t)1 << 24)
#define MERGES_MAX      ((long)256 << 20)
#define VOCAB_MAX_BYTES ((size_t)256 << 20)
#define NO_CODEPOINT    0xFFFFFFFFu
#define BYTE_CHAR_MAX   324 /* GPT-2's byte characters are below U+0144 */

/* Token text (UTF-8) to id, open addressing. */
typedef struct str_slot {
    const char *key; /* borrowed from the vocabulary's JSON, which t keeps */
    int32_t id;
} str_slot;

/* (left id, right id) to (rank, merged id), open addressing; key 0 is free
 * because ids are stored plus one. */
typedef struct pair_slot {
    uint64_t key;
    int32_t rank, id;
} pair_slot;

typedef struct special {
    const char *text; /* its bytes (all ASCII: "<|endoftext|>") */
    size_t len;
    int32_t id;
} special;

struct td_bpe {
    json_t *vocab_json;
    str_slot *strs;
    size_t nstr_slots;
    pair_slot *pairs;
    size_t npair_slots;
    char **bytes;   /* per id: its decoded bytes (NULL: no token) */
    size_t *nbytes; /* and their count */
    int64_t size;
    int32_t byte_id[256];             /* each byte's one-character token */
    int16_t from_char[BYTE_CHAR_MAX]; /* each byte character's byte, or -1 */
    special *specials;
    size_t nspecials;
};

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

/* The code point at s[0..n) and its length in *len; an invalid or cut
 * sequence is one byte long and NO_CODEPOINT. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *len) {
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
        return NO_CODEPOINT;
    if (k > n)
        return NO_CODEPOINT;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return NO_CODEPOINT;
        c = c << 6 | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return NO_CODEPOINT;
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

static int32_t str_find(const td_bpe *t, const char *key) {
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

static const pair_slot *pair_find(const td_bpe *t, int32_t a, int32_t b) {
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

/* vocab.json ---------------------------------------------------------------------- */

/* The bytes a token's characters stand for, or an error naming it. */
static td_status token_bytes(const td_bpe *t, const char *file, const char *tok, char **out,
                             size_t *n) {
    size_t len = strlen(tok), k = 0;
    char *b;
    if (!(b = td__calloc(len + 1, "a token")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < len;) {
        size_t cl;
        uint32_t c = utf8_next((const unsigned char *)tok + i, len - i, &cl);
        if (c >= BYTE_CHAR_MAX || t->from_char[c] < 0) {
            free(b);
            return td__error(TD_ERR_PARSE,
                             "%s: token \"%.64s\": character U+%04X is not one of GPT-2's byte "
                             "characters",
                             file, tok, c == NO_CODEPOINT ? 0xFFFDu : c);
        }
        b[k++] = (char)t->from_char[c];
        i += cl;
    }
    *out = b;
    *n = k;
    return TD_OK;
}

static int is_special(const char *tok) {
    size_t n = strlen(tok);
    return n > 4 && !strncmp(tok, "<|", 2) && !strcmp(tok + n - 2, "|>");
}

static td_status add_special(td_bpe *t, const char *tok, int32_t id) {
    special *s = realloc(t->specials, (t->nspecials + 1) * sizeof *s);
    if (!s)
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory loading a tokenizer");
    t->specials = s;
    s[t->nspecials].text = tok;
    s[t->nspecials].len = strlen(tok);
    s[t->nspecials++].id = id;
    return TD_OK;
}

static td_status read_vocab(td_bpe *t, const char *file) {
    const char *tok;
    json_t *v;
    json_int_t max = -1;
    for (int i = 0; i < BYTE_CHAR_MAX; i++)
        t->from_char[i] = -1;
    for (int i = 0; i < 256; i++)
        t->from_char[byte_char(i)] = (int16_t)i;
    TD_CHECK(td__read_json_file(file, VOCAB_MAX_BYTES, 0, &t->vocab_json));
    if (!json_is_object(t->vocab_json) || json_object_size(t->vocab_json) == 0)
        return td__error(TD_ERR_PARSE, "%s: expected an object from token to id", file);
    json_object_foreach(t->vocab_json, tok, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
            return td__error(TD_ERR_PARSE, "%s: token \"%.64s\": id is not an integer in [0, %lld)",
                             file, tok, (long long)MAX_ID);
        if (json_integer_value(v) > max)
            max = json_integer_value(v);
    }
    t->size = max + 1;
    t->nstr_slots = pow2_above(json_object_size(t->vocab_json));
    if (!(t->strs = td__calloc(t->nstr_slots * sizeof *t->strs, "a vocabulary")) ||
        !(t->bytes = td__calloc((size_t)t->size * sizeof *t->bytes, "a vocabulary")) ||
        !(t->nbytes = td__calloc((size_t)t->size * sizeof *t->nbytes, "a vocabulary")))
        return TD_ERR_OUT_OF_MEMORY;
    json_object_foreach(t->vocab_json, tok, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->bytes[id])
            return td__error(TD_ERR_PARSE, "%s: token \"%.64s\": id %d is another token's too",
                             file, tok, id);
        TD_CHECK(token_bytes(t, file, tok, &t->bytes[id], &t->nbytes[id]));
        str_put(t, tok, id);
        if (is_special(tok))
            TD_CHECK(add_special(t, tok, id));
    }
    for (int b = 0; b < 256; b++) {
        char s[3] = {0};
        uint32_t c = byte_char(b);
        /* one character, in UTF-8 */
        if (c < 0x80)
            s[0] = (char)c;
        else
            s[0] = (char)(0xC0 | c >> 6), s[1] = (char)(0x80 | (c & 0x3F));
        if ((t->byte_id[b] = str_find(t, s)) < 0)
            return td__error(TD_ERR_PARSE,
                             "%s: no token for byte 0x%02X (\"%s\"); a byte-level BPE vocabulary "
                             "holds all 256",
                             file, b, s);
    }
    return TD_OK;
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

/* One "a b" line (cut at its end, CR dropped) as a merge of rank `rank`. */
static td_status read_merge(td_bpe *t, const char *file, int line, char *s, int32_t rank) {
    char *sp = strchr(s, ' '), joined[1024];
    int32_t a, b, ab;
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
        return td__error(TD_ERR_PARSE, "%s:%d: expected two tokens separated by one space", file,
                         line);
    *sp = '\0';
    if (strlen(s) + strlen(sp + 1) >= sizeof joined)
        return td__error(TD_ERR_PARSE, "%s:%d: a merge longer than %zu bytes", file, line,
                         sizeof joined);
    snprintf(joined, sizeof joined, "%s%s", s, sp + 1);
    if ((a = str_find(t, s)) < 0 || (b = str_find(t, sp + 1)) < 0 || (ab = str_find(t, joined)) < 0)
        return td__error(TD_ERR_PARSE,
                         "%s:%d: \"%.64s %.64s\": \"%.128s\" is not in the vocabulary "
                         "(vocab.json does not cover the merges)",
                         file, line, s, sp + 1,
                         a < 0   ? s
                         : b < 0 ? sp + 1
                                 : joined);
    pair_put(t, a, b, rank, ab);
    return TD_OK;
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
    t->npair_slots = pow2_above(lines);
    if (!(t->pairs = td__calloc(t->npair_slots * sizeof *t->pairs, "merges"))) {
        free(text);
        return TD_ERR_OUT_OF_MEMORY;
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
    TD_TRY(read_vocab(t, vocab_json));
    TD_TRY(read_merges(t, merges_txt));
    *out = t;
    return TD_OK;
fail:
    td_bpe_destroy(t);
    return st;
}

td_status td_bpe_load(const char *dir, td_bpe **out) {
    char v[4096], m[4096];
    if (!dir) {
        if (out)
            *out = NULL;
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_load: dir is NULL");
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

/* The split ----------------------------------------------------------------------- */

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };

typedef struct range {
    uint32_t lo, hi;
} range;

static int in_ranges(uint32_t c, const range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (c >= r[i].lo && c <= r[i].hi)
            return 1;
    return 0;
}

/* \p{L} beyond ASCII, for the scripts tokenizer.h names. */
static const range letters[] = {
    {0xAA, 0xAA},     {0xB5, 0xB5},     {0xBA, 0xBA},       {0xC0, 0xD6},     {0xD8, 0xF6},
    {0xF8, 0x2C1},    {0x2C6, 0x2D1},   {0x2E0, 0x2E4},     {0x2EC, 0x2EC},   {0x2EE, 0x2EE},
    {0x370, 0x374},   {0x376, 0x377},   {0x37A, 0x37D},     {0x37F, 0x37F},   {0x386, 0x386},
    {0x388, 0x3F5},   {0x3F7, 0x481},   {0x48A, 0x52F},     {0x531, 0x556},   {0x559, 0x559},
    {0x560, 0x588},   {0x5D0, 0x5EA},   {0x5EF, 0x5F2},     {0x620, 0x64A},   {0x66E, 0x66F},
    {0x671, 0x6D3},   {0x6D5, 0x6D5},   {0x1E00, 0x1FBC},   {0x3005, 0x3006}, {0x3031, 0x3035},
    {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F},   {0x30A1, 0x30FA}, {0x30FC, 0x30FF},
    {0x3400, 0x4DBF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},   {0xF900, 0xFAFF}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0xFF66, 0xFF9D}, {0x20000, 0x2FA1F},
};

/* \p{N} beyond ASCII: superscripts, fractions, Arabic-Indic and Devanagari
 * digits, number forms, circled numbers, fullwidth digits. */
static const range numbers[] = {
    {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},   {0x6F0, 0x6F9},
    {0x966, 0x96F},   {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2189},
    {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0xFF10, 0xFF19},
};

/* \s: Unicode's White_Space. */
static const range spaces[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

#define COUNT(a) (sizeof a / sizeof *a)

static int char_class(uint32_t c) {
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            return C_LETTER;
        if (c >= '0' && c <= '9')
            return C_NUMBER;
        return in_ranges(c, spaces, 2) ? C_SPACE : C_OTHER;
    }
    if (c == NO_CODEPOINT)
        return C_OTHER;
    if (in_ranges(c, spaces, COUNT(spaces)))
        return C_SPACE;
    if (in_ranges(c, letters, COUNT(letters)))
        return C_LETTER;
    return in_ranges(c, numbers, COUNT(numbers)) ? C_NUMBER : C_OTHER;
}

/* The text as characters: each one's class, code point and byte offset. */
typedef struct chars {
    uint32_t *cp;
    unsigned char *cls;
    size_t *at; /* n + 1 offsets: at[n] is the text's length */
    size_t n;
} chars;

static td_status decode_chars(const char *text, size_t len, chars *c) {
    const unsigned char *s = (const unsigned char *)text;
    memset(c, 0, sizeof *c);
    if (!(c->cp = td__calloc((len + 1) * sizeof *c->cp, "a text")) ||
        !(c->cls = td__calloc(len + 1, "a text")) ||
        !(c->at = td__calloc((len + 1) * sizeof *c->at, "a text")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < len;) {
        size_t k;
        uint32_t cp = utf8_next(s + i, len - i, &k);
        c->cp[c->n] = cp;
        c->cls[c->n] = (unsigned char)char_class(cp);
        c->at[c->n++] = i;
        i += k;
    }
    c->at[c->n] = len;
    return TD_OK;
}

static void free_chars(chars *c) {
    free(c->cp);
    free(c->cls);
    free(c->at);
}

/* GPT-2's contractions, which the regex tries first. */
static size_t contraction(const chars *c, size_t i) {
    static const char *const tails[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (c->cp[i] != '\'')
        return 0;
    for (size_t k = 0; k < COUNT(tails); k++) {
        size_t n = strlen(tails[k]), j = 0;
        while (j < n && i + 1 + j < c->n && c->cp[i + 1 + j] == (uint32_t)tails[k][j])
            j++;
        if (j == n)
            return n + 1;
    }
    return 0;
}

/* The regex's ` ?X+` for class X: its length from i, or 0. */
static size_t run_of(const chars *c, size_t i, int cls) {
    size_t j = i;
    if (c->cp[j] == ' ' && j + 1 < c->n && c->cls[j + 1] == cls)
        j++;
    if (c->cls[j] != cls)
        return 0;
    while (j < c->n && c->cls[j] == cls)
        j++;
    return j - i;
}

/* The length of the piece the regex matches at character i. */
static size_t piece_at(const chars *c, size_t i) {
    size_t len, j;
    if ((len = contraction(c, i)) || (len = run_of(c, i, C_LETTER)) ||
        (len = run_of(c, i, C_NUMBER)) || (len = run_of(c, i, C_OTHER)))
        return len;
    /* whitespace: \s+(?!\S) keeps the last space for the word after it
     * when there are two or more; else \s+ takes the one */
    for (j = i; j < c->n && c->cls[j] == C_SPACE; j++)
        ;
    if (j < c->n && j - i >= 2)
        return j - i - 1;
    return j - i;
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
        const pair_slot *best = NULL;
        int32_t a = 0, b = 0;
        size_t k = 0;
        for (size_t i = 0; i + 1 < *n; i++) {
            const pair_slot *p = pair_find(t, sym[i], sym[i + 1]);
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

/* Encodes text[0..len) (no special tokens in it) onto out. */
static td_status encode_plain(const td_bpe *t, const char *text, size_t len, id_list *out) {
    chars c;
    int32_t *sym = NULL;
    td_status st = TD_OK;
    if (!len)
        return TD_OK;
    if ((st = decode_chars(text, len, &c)) != TD_OK ||
        !(sym = td__calloc(len * sizeof *sym, "a text"))) {
        free_chars(&c);
        return st != TD_OK ? st : TD_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < c.n && st == TD_OK;) {
        size_t k = piece_at(&c, i), from = c.at[i], to = c.at[i + k], n = to - from;
        for (size_t b = 0; b < n; b++)
            sym[b] = t->byte_id[(unsigned char)text[from + b]];
        merge_word(t, sym, &n);
        for (size_t s = 0; s < n && st == TD_OK; s++)
            st = push(out, sym[s]);
        i += k;
    }
    free(sym);
    free_chars(&c);
    return st;
}

/* The first special token in text[0..len) at or after `from`: its place,
 * or len; the longest one when several start there. */
static size_t next_special(const td_bpe *t, const char *text, size_t len, size_t from,
                           const special **which) {
    *which = NULL;
    for (size_t i = from; i < len && t->nspecials; i++) {
        if (text[i] != '<')
            continue;
        for (size_t k = 0; k < t->nspecials; k++) {
            const special *s = &t->specials[k];
            if (s->len <= len - i && !memcmp(text + i, s->text, s->len) &&
                (!*which || s->len > (*which)->len))
                *which = s;
        }
        if (*which)
            return i;
    }
    return len;
}

td_status td_bpe_encode(const td_bpe *t, const char *text, size_t n, int32_t **ids, size_t *count) {
    id_list out = {NULL, 0, 0};
    size_t pos = 0;
    td_status st = TD_OK;
    if (!ids || !count)
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_encode: ids or count is NULL");
    *ids = NULL;
    *count = 0;
    if (!t || (!text && n))
        return td__error(TD_ERR_INVALID_ARG, "td_bpe_encode: tokenizer or text is NULL");
    while (pos < n && st == TD_OK) {
        const special *s;
        size_t at = next_special(t, text, n, pos, &s);
        if ((st = encode_plain(t, text + pos, at - pos, &out)) == TD_OK && s)
            st = push(&out, s->id);
        pos = s ? at + s->len : n;
    }
    if (st != TD_OK) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *count = out.n;
    return TD_OK;
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
    *text = s;
    *len = total;
    return TD_OK;
}
