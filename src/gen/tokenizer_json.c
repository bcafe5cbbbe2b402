/* tokenizers' tokenizer.json (td_bpe_load_json, include/tandem/tokenizer.h)
 * into a td_bpe: the BPE model's vocabulary and merges, the added tokens
 * as special tokens, which of the two BPE kinds it is (byte-level with a
 * split pattern, or SentencePiece-style with "▁" and byte fallback) from its
 * normalizer and pre-tokenizer, the post-processor's special tokens, and
 * tokenizer_config.json's eos_token. What tandem does not implement is
 * refused naming the field, so that no text is encoded otherwise than
 * tokenizers encodes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "gen/bpe-impl.h"

#define SPACE_MARK "\xe2\x96\x81" /* "▁" */

typedef struct reader {
    const char *path;
    int byte_level;                     /* a ByteLevel pre-tokenizer */
    const char *pattern[TD_BPE_SPLITS]; /* the splits' regexes, in order */
    int npattern;
} reader;

static td_status unsupported(const reader *r, const char *field, const char *what) {
    return td__error(TD_ERR_UNSUPPORTED, "%s: \"%s\": %s", r->path, field, what);
}

static const char *type_of(const json_t *o) {
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : "";
}

/* One normalizer (or each of a Sequence's). */
static td_status read_normalizer(td_bpe *t, const reader *r, json_t *n) {
    const char *type = type_of(n);
    char msg[160];
    if (!n || json_is_null(n) || !strcmp(type, "NFC"))
        return TD_OK; /* NFC: text is taken as composed already */
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(n, "normalizers"), i, item)
            TD_CHECK(read_normalizer(t, r, item));
        return TD_OK;
    }
    if (!strcmp(type, "Prepend") &&
        !strcmp(json_string_value(json_object_get(n, "prepend")) ?: "", SPACE_MARK)) {
        t->sentencepiece = t->prepend = 1;
        return TD_OK;
    }
    if (!strcmp(type, "Replace") &&
        !strcmp(json_string_value(json_object_get(json_object_get(n, "pattern"), "String")) ?: "",
                " ") &&
        !strcmp(json_string_value(json_object_get(n, "content")) ?: "", SPACE_MARK)) {
        t->sentencepiece = 1;
        return TD_OK;
    }
    snprintf(msg, sizeof msg,
             "a \"%.32s\" normalizer is not one tandem has (NFC; Prepend and Replace of "
             "SentencePiece's \"\xe2\x96\x81\")",
             type);
    return unsupported(r, "normalizer", msg);
}

static td_status add_pattern(reader *r, const char *pattern) {
    if (r->npattern == TD_BPE_SPLITS)
        return unsupported(r, "pre_tokenizer", "more than 4 splits");
    r->pattern[r->npattern++] = pattern;
    return TD_OK;
}

/* One pre-tokenizer (or each of a Sequence's). */
static td_status read_pre(td_bpe *t, reader *r, json_t *p) {
    const char *type = type_of(p);
    if (!p || json_is_null(p))
        return TD_OK;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, item)
            TD_CHECK(read_pre(t, r, item));
        return TD_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        json_t *re = json_object_get(p, "use_regex"), *ps = json_object_get(p, "add_prefix_space");
        r->byte_level = 1;
        if (json_is_true(ps))
            return unsupported(r, "pre_tokenizer",
                               "ByteLevel's add_prefix_space is not implemented");
        if (!re || json_is_true(re)) {
            TD_CHECK(add_pattern(r, td__bpe_gpt2_pattern));
        }
        return TD_OK;
    }
    if (!strcmp(type, "Split")) {
        json_t *re = json_object_get(json_object_get(p, "pattern"), "Regex");
        const char *b = json_string_value(json_object_get(p, "behavior"));
        if (!json_is_string(re))
            return unsupported(r, "pre_tokenizer", "a Split by a \"Regex\" pattern only");
        if (!b || strcmp(b, "Isolated") != 0 || json_is_true(json_object_get(p, "invert")))
            return unsupported(r, "pre_tokenizer",
                               "a Split's behavior \"Isolated\" (not inverted) only");
        return add_pattern(r, json_string_value(re));
    }
    if (!strcmp(type, "Digits")) /* tokenizers' is_numeric: \p{N} */
        return add_pattern(r, json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}"
                                                                                    : "\\p{N}+");
    if (!strcmp(type, "Metaspace")) {
        const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
        if (json_is_true(json_object_get(p, "split")))
            return unsupported(r, "pre_tokenizer", "Metaspace's split is not implemented");
        t->sentencepiece = 1;
        t->prepend = !scheme || !strcmp(scheme, "always") ? 3 : !strcmp(scheme, "first") ? 2 : 0;
        return TD_OK;
    }
    return unsupported(r, "pre_tokenizer",
                       "not one tandem has (ByteLevel, Split by a regex, Digits, Metaspace, a "
                       "Sequence of them)");
}

/* The BPE model's options other than its vocabulary and merges. */
static td_status read_model_options(td_bpe *t, const reader *r, json_t *m) {
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    json_t *type = json_object_get(m, "type");
    if (!json_is_object(m))
        return td__error(TD_ERR_PARSE, "%s: \"model\": expected an object", r->path);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0))
        return unsupported(r, "model", "tandem reads BPE models only");
    for (int i = 0; i < 2; i++) {
        const char *v = json_string_value(json_object_get(m, affixes[i]));
        if (v && *v)
            return unsupported(r, affixes[i], "not implemented");
    }
    if (json_number_value(json_object_get(m, "dropout")) > 0)
        return unsupported(r, "dropout", "BPE dropout is for training; tandem encodes without");
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    if (t->sentencepiece && !json_is_true(json_object_get(m, "byte_fallback")))
        for (int b = 0; b < 256; b++)
            t->byte_id[b] = -1; /* no fallback: an unknown character is <unk> */
    return TD_OK;
}

static td_status read_merges(td_bpe *t, const reader *r, json_t *merges) {
    size_t i;
    json_t *m;
    if (!json_is_array(merges))
        return td__error(TD_ERR_PARSE, "%s: \"model\": \"merges\": expected an array", r->path);
    TD_CHECK(td__bpe_merges_init(t, json_array_size(merges)));
    json_array_foreach(merges, i, m) {
        char where[4200], pair[1024];
        const char *a = NULL, *b = NULL;
        snprintf(where, sizeof where, "%s: \"model\": \"merges\"[%zu]", r->path, i);
        if (json_is_array(m) && json_array_size(m) == 2) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
        } else if (json_is_string(m) && json_string_length(m) < sizeof pair) {
            char *sp;
            snprintf(pair, sizeof pair, "%s", json_string_value(m));
            if ((sp = strchr(pair, ' ')) != NULL && sp != pair && !strchr(sp + 1, ' '))
                *sp = '\0', a = pair, b = sp + 1;
        }
        if (!a || !b || !*a || !*b)
            return td__error(TD_ERR_PARSE, "%s: expected \"a b\" or [\"a\", \"b\"]", where);
        TD_CHECK(td__bpe_add_merge(t, where, a, b, (int32_t)i));
    }
    return TD_OK;
}

/* Room for ids below size. */
static td_status grow(td_bpe *t, int64_t size) {
    char **b;
    size_t *n;
    if (size <= t->size)
        return TD_OK;
    if (!(b = realloc(t->bytes, (size_t)size * sizeof *b)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory loading a tokenizer");
    t->bytes = b;
    if (!(n = realloc(t->nbytes, (size_t)size * sizeof *n)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory loading a tokenizer");
    t->nbytes = n;
    memset(b + t->size, 0, (size_t)(size - t->size) * sizeof *b);
    memset(n + t->size, 0, (size_t)(size - t->size) * sizeof *n);
    t->size = size;
    return TD_OK;
}

/* added_tokens: special tokens, their bytes their content as it is. */
static td_status read_added(td_bpe *t, const reader *r, json_t *added) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        int32_t k;
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TD_BPE_MAX_ID || !json_is_string(content) ||
            !json_string_length(content))
            return td__error(TD_ERR_PARSE,
                             "%s: \"added_tokens\"[%zu]: expected an \"id\" in [0, %lld) and a "
                             "\"content\"",
                             r->path, i, (long long)TD_BPE_MAX_ID);
        k = (int32_t)json_integer_value(id);
        TD_CHECK(grow(t, (int64_t)k + 1));
        free(t->bytes[k]);
        if (!(t->bytes[k] = td__strdup(json_string_value(content))))
            return TD_ERR_OUT_OF_MEMORY;
        t->nbytes[k] = json_string_length(content);
        TD_CHECK(td__bpe_add_special(t, json_string_value(content), k));
    }
    return TD_OK;
}

/* The id of token text: an added token's or the vocabulary's; -1. */
static int32_t token_id(const td_bpe *t, const char *text) {
    for (size_t i = 0; i < t->nspecials; i++)
        if (!strcmp(t->specials[i].text, text))
            return t->specials[i].id;
    return td__bpe_str_find(t, text);
}

/* A TemplateProcessing's "single": its special tokens before and after $A. */
static td_status read_template(td_bpe *t, const reader *r, json_t *p) {
    size_t i;
    json_t *item;
    int after = 0;
    if (!strcmp(type_of(p), "Sequence")) {
        json_array_foreach(json_object_get(p, "processors"), i, item)
            TD_CHECK(read_template(t, r, item));
        return TD_OK;
    }
    if (strcmp(type_of(p), "TemplateProcessing") != 0)
        return TD_OK; /* ByteLevel's offsets and the like change no ids */
    json_array_foreach(json_object_get(p, "single"), i, item) {
        json_t *sp = json_object_get(item, "SpecialToken");
        const char *name = json_string_value(json_object_get(sp, "id"));
        int32_t id;
        if (json_object_get(item, "Sequence")) {
            after = 1;
            continue;
        }
        if (!name || (id = token_id(t, name)) < 0)
            return td__error(TD_ERR_PARSE,
                             "%s: \"post_processor\": \"single\"[%zu]: \"%.64s\" is no token",
                             r->path, i, name ? name : "?");
        if ((after ? t->nsuffix : t->nprefix) == TD_BPE_TEMPLATE)
            return unsupported(r, "post_processor", "more than 8 special tokens around a text");
        if (after)
            t->suffix[t->nsuffix++] = id;
        else
            t->prefix[t->nprefix++] = id;
    }
    return TD_OK;
}

/* tokenizer_config.json's eos_token (a string, or {"content": ...}). */
static td_status read_eos(td_bpe *t, const char *config) {
    json_t *doc = NULL, *eos;
    const char *text;
    FILE *f = config ? fopen(config, "rb") : NULL;
    if (!f)
        return TD_OK;
    fclose(f);
    /* JSON_DECODE_INT_AS_REAL: transformers writes model_max_length as 1e30 in digits */
    TD_CHECK(td__read_json_file(config, TD_BPE_JSON_MAX_BYTES, JSON_DECODE_INT_AS_REAL, &doc));
    eos = json_object_get(doc, "eos_token");
    text = json_is_object(eos) ? json_string_value(json_object_get(eos, "content"))
                               : json_string_value(eos);
    if (text && (t->eos = token_id(t, text)) < 0) {
        td_status st =
            td__error(TD_ERR_PARSE, "%s: \"eos_token\": \"%.64s\" is no token", config, text);
        json_decref(doc);
        return st;
    }
    json_decref(doc);
    return TD_OK;
}

td_status td__bpe_load_json(td_bpe *t, const char *path, const char *config) {
    reader r = {path, 0, {NULL}, 0};
    json_t *doc, *model, *unk;
    char where[4200];
    t->unk = t->eos = -1;
    TD_CHECK(td__read_json_file(path, TD_BPE_JSON_MAX_BYTES, 0, &t->vocab_json));
    doc = t->vocab_json;
    if (!json_is_object(doc))
        return td__error(TD_ERR_PARSE, "%s: expected a JSON object", path);
    TD_CHECK(read_normalizer(t, &r, json_object_get(doc, "normalizer")));
    TD_CHECK(read_pre(t, &r, json_object_get(doc, "pre_tokenizer")));
    if (r.byte_level == t->sentencepiece)
        return unsupported(&r, "pre_tokenizer",
                           r.byte_level ? "both byte-level and SentencePiece-style"
                                        : "neither byte-level (ByteLevel) nor SentencePiece-style "
                                          "(\xe2\x96\x81 for spaces)");
    model = json_object_get(doc, "model");
    snprintf(where, sizeof where, "%s: \"model\": \"vocab\"", path);
    TD_CHECK(read_model_options(t, &r, model)); /* refuses what tandem lacks before the work */
    TD_CHECK(td__bpe_set_vocab(t, json_object_get(model, "vocab"), where, 0));
    TD_CHECK(read_model_options(t, &r, model)); /* byte fallback, now that byte_id is known */
    TD_CHECK(read_merges(t, &r, json_object_get(model, "merges")));
    TD_CHECK(read_added(t, &r, json_object_get(doc, "added_tokens")));
    unk = json_object_get(model, "unk_token");
    if (json_is_string(unk) && (t->unk = token_id(t, json_string_value(unk))) < 0)
        return td__error(TD_ERR_PARSE, "%s: \"model\": \"unk_token\": \"%.64s\" is no token", path,
                         json_string_value(unk));
    for (int i = 0; i < r.npattern; i++)
        TD_CHECK(td__bpe_set_split(t, r.pattern[i], path));
    TD_CHECK(read_template(t, &r, json_object_get(doc, "post_processor")));
    return read_eos(t, config);
}
