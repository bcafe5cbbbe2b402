/* tokenizer.json against the tokenizers library: each folder under
 * tests/fixtures/hf (made by scripts/make_hf_fixtures) holds a tokenizer
 * trained by tokenizers on Tiny Shakespeare (llama: byte-level BPE with
 * Llama 3's split pattern and <|begin_of_text|> put before a text; qwen2:
 * Qwen2's pattern, one digit a piece; mistral: SentencePiece-style BPE with
 * byte fallback and <s>; metaspace: the same written with a Metaspace
 * pre-tokenizer; digits: SmolLM's Digits then GPT-2's split) and the ids
 * tokenizers gave for each test string,
 * without and with the post-processor's special tokens, and the text it
 * decodes them back to. tandem must give the same ids and the same text
 * (the string itself, but for SentencePiece's "▁" after a special token),
 * know the EOS token, and
 * refuse bad files naming the file and the field. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/support.h"

#define FIXTURES TD_SOURCE_DIR "/tests/fixtures/hf"

/* ids (n) must be the JSON array want's. */
static void expect_ids(const char *who, const char *text, const char *how, const int32_t *ids,
                       size_t n, json_t *want) {
    if (n != json_array_size(want))
        fail_msg("%s: \"%s\" (%s): %zu tokens; tokenizers gives %zu", who, text, how, n,
                 json_array_size(want));
    for (size_t k = 0; k < n; k++)
        if (ids[k] != json_integer_value(json_array_get(want, k)))
            fail_msg("%s: \"%s\" (%s): token %zu is %d; tokenizers gives %d", who, text, how, k,
                     ids[k], (int)json_integer_value(json_array_get(want, k)));
}

static void encodes_as_tokenizers(const char *name) {
    char path[512];
    json_error_t e;
    json_t *ref, *c;
    td_bpe *bpe = NULL;
    size_t i;
    snprintf(path, sizeof path, FIXTURES "/%s/reference.json", name);
    assert_non_null(ref = json_load_file(path, 0, &e));
    snprintf(path, sizeof path, FIXTURES "/%s", name);
    TD_ASSERT_OK(td_bpe_load(path, &bpe));
    assert_int_equal(td_bpe_eos(bpe), json_integer_value(json_object_get(ref, "eos")));
    json_array_foreach(json_object_get(ref, "tokenizer_cases"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        const char *decoded = json_string_value(json_object_get(c, "decoded"));
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        char *back = NULL;
        TD_ASSERT_OK(td_bpe_encode(bpe, text, strlen(text), &ids, &n));
        expect_ids(name, text, "no special tokens", ids, n, json_object_get(c, "ids"));
        TD_ASSERT_OK(td_bpe_decode(bpe, ids, n, &back, &len));
        if (len != strlen(decoded) || memcmp(back, decoded, len) != 0)
            fail_msg("%s: \"%s\" decodes to \"%s\"; tokenizers gives \"%s\"", name, text, back,
                     decoded);
        free(ids);
        free(back);
        TD_ASSERT_OK(td_bpe_encode_special(bpe, text, strlen(text), &ids, &n));
        expect_ids(name, text, "with special tokens", ids, n, json_object_get(c, "ids_special"));
        free(ids);
    }
    td_bpe_destroy(bpe);
    json_decref(ref);
}

static void llama3_byte_level(void **state) {
    encodes_as_tokenizers("llama");
}

static void qwen2_byte_level(void **state) {
    encodes_as_tokenizers("qwen2");
}

static void sentencepiece_byte_fallback(void **state) {
    encodes_as_tokenizers("mistral");
}

/* Byte-level with two splits, each piece of the first split by the
 * second: SmolLM's Digits (one digit a piece), then GPT-2's pattern. */
static void digits_then_gpt2_split(void **state) {
    encodes_as_tokenizers("digits");
}

/* The same, "▁" put before the text's first stretch only (Metaspace's
 * prepend_scheme "first"), not after a special token. */
static void sentencepiece_metaspace(void **state) {
    encodes_as_tokenizers("metaspace");
}

/* Bad files ------------------------------------------------------------------------- */

/* A copy of fixture src's tokenizer.json with edit applied, in a folder of
 * the test's; returns the file's path. */
static const char *edited(const char *src, const char *name, void (*edit)(json_t *doc)) {
    static char path[600];
    char from[512], *text;
    json_error_t e;
    json_t *doc;
    snprintf(from, sizeof from, FIXTURES "/%s/tokenizer.json", src);
    assert_non_null(doc = json_load_file(from, 0, &e));
    edit(doc);
    text = json_dumps(doc, 0);
    snprintf(path, sizeof path, "%s", td_test_tmp(name));
    td_test_write_file(path, text, strlen(text));
    free(text);
    json_decref(doc);
    return path;
}

static void unknown_merge(json_t *doc) {
    json_array_append_new(json_object_get(json_object_get(doc, "model"), "merges"),
                          json_pack("[s,s]", "\xc4\xa0t", "zzqx"));
}

static void lowercase(json_t *doc) {
    json_object_set_new(doc, "normalizer", json_pack("{s:s}", "type", "Lowercase"));
}

static void wordpiece(json_t *doc) {
    json_object_set_new(json_object_get(doc, "model"), "type", json_string("WordPiece"));
}

static void bad_pattern(json_t *doc) {
    json_t *split =
        json_array_get(json_object_get(json_object_get(doc, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(json_object_get(split, "pattern"), "Regex", json_string("(\\p{L}+"));
}

static void fails(const char *path, td_status want, const char *n1, const char *n2) {
    td_bpe *bpe = (td_bpe *)1;
    TD_ASSERT_STATUS(td_bpe_load_json(path, NULL, &bpe), want);
    assert_null(bpe);
    td_test_assert_message_contains(n1);
    if (n2)
        td_test_assert_message_contains(n2);
}

static void refuses_bad_files(void **state) {
    const char *p = edited("llama", "merge.json", unknown_merge);
    fails(p, TD_ERR_PARSE, "merge.json: \"model\": \"merges\"[",
          "\"zzqx\" is not in the vocabulary");
    fails(edited("qwen2", "lower.json", lowercase), TD_ERR_UNSUPPORTED,
          "lower.json: \"normalizer\"", "\"Lowercase\"");
    fails(edited("mistral", "wp.json", wordpiece), TD_ERR_UNSUPPORTED, "wp.json: \"model\"",
          "BPE models only");
    fails(edited("llama", "re.json", bad_pattern), TD_ERR_PARSE, "re.json: the split pattern",
          NULL);
    fails(td_test_tmp("absent.json"), TD_ERR_IO, "absent.json", NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama3_byte_level),           cmocka_unit_test(qwen2_byte_level),
        cmocka_unit_test(sentencepiece_byte_fallback), cmocka_unit_test(sentencepiece_metaspace),
        cmocka_unit_test(digits_then_gpt2_split),      cmocka_unit_test(refuses_bad_files),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
