/* GPT-2's byte-level BPE against transformers' GPT2Tokenizer: the ids it
 * gave for each string in tests/fixtures/gpt2_tiny/reference.json (made by
 * make_fixture.py from the fixture's vocab.json and merges.txt), decoding
 * back to the string, any bytes surviving encode then decode, and the
 * vocabularies and merges it refuses, with messages naming file and line. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

#define FIXTURE TD_SOURCE_DIR "/tests/fixtures/gpt2_tiny"

static td_bpe *bpe;

static int setup(void **state) {
    if (td_test_tmpdir_setup(state) != 0)
        return -1;
    return td_bpe_load(FIXTURE, &bpe) == TD_OK ? 0 : -1;
}

static int teardown(void **state) {
    td_bpe_destroy(bpe);
    return td_test_tmpdir_teardown(state);
}

static void encodes_as_gpt2_tokenizer(void **state) {
    json_error_t e;
    json_t *ref = json_load_file(FIXTURE "/reference.json", 0, &e), *c;
    size_t i;
    assert_non_null(ref);
    assert_int_equal(td_bpe_vocab_size(bpe), 300);
    json_array_foreach(json_object_get(ref, "tokenizer_cases"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *want = json_object_get(c, "ids");
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        char *back = NULL;
        TD_ASSERT_OK(td_bpe_encode(bpe, text, strlen(text), &ids, &n));
        if (n != json_array_size(want))
            fail_msg("\"%s\": %zu tokens; GPT2Tokenizer gives %zu", text, n, json_array_size(want));
        for (size_t k = 0; k < n; k++)
            if (ids[k] != json_integer_value(json_array_get(want, k)))
                fail_msg("\"%s\": token %zu is %d; GPT2Tokenizer gives %d", text, k, ids[k],
                         (int)json_integer_value(json_array_get(want, k)));
        TD_ASSERT_OK(td_bpe_decode(bpe, ids, n, &back, &len));
        assert_int_equal(len, strlen(text));
        assert_memory_equal(back, text, len);
        free(ids);
        free(back);
    }
    json_decref(ref);
}

/* Whatever the bytes, UTF-8 or not, decode(encode(x)) is x. */
static void any_bytes_round_trip(void **state) {
    char text[512];
    uint64_t x = 12345;
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(round * 7 % 500) + 1, len = 0, count = 0;
        int32_t *ids = NULL;
        char *back = NULL;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly text, with spaces, quotes, high bytes and the special token's pieces */
            text[i] = round % 3 ? " tThe'sxl.<|>\xc3\xa9\n"[(x >> 33) % 16] : (char)(x >> 40);
        }
        TD_ASSERT_OK(td_bpe_encode(bpe, text, n, &ids, &count));
        TD_ASSERT_OK(td_bpe_decode(bpe, ids, count, &back, &len));
        assert_int_equal(len, n);
        assert_memory_equal(back, text, n);
        free(ids);
        free(back);
    }
}

static void token_bytes_and_bad_ids(void **state) {
    size_t n = 0;
    int32_t bad[2] = {5, 300};
    char *text = NULL;
    size_t len;
    const char *s = td_bpe_token_bytes(bpe, 299, &n);
    assert_non_null(s);
    assert_int_equal(n, 13);
    assert_memory_equal(s, "<|endoftext|>", 13);
    /* GPT-2's order: '!' is byte character 0, space stands for itself as 'Ġ' (220) */
    s = td_bpe_token_bytes(bpe, 0, &n);
    assert_true(n == 1 && s[0] == '!');
    s = td_bpe_token_bytes(bpe, 220, &n);
    assert_true(n == 1 && s[0] == ' ');
    assert_null(td_bpe_token_bytes(bpe, 300, &n));
    assert_null(td_bpe_token_bytes(bpe, -1, &n));
    TD_ASSERT_STATUS(td_bpe_decode(bpe, bad, 2, &text, &len), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("id 300 at 1 is no token");
}

/* The fixture's vocabulary with `drop` left out (NULL: none) and
 * `merges` as merges.txt, loaded: fails with want naming needle. */
static void load_fails(const char *drop, const char *merges, td_status want, const char *needle) {
    json_error_t e;
    json_t *vocab = json_load_file(FIXTURE "/vocab.json", 0, &e);
    char *text;
    td_bpe *t = NULL;
    assert_non_null(vocab);
    if (drop)
        json_object_del(vocab, drop);
    text = json_dumps(vocab, 0);
    td_test_write_file(td_test_tmp("vocab.json"), text, strlen(text));
    td_test_write_file(td_test_tmp("merges.txt"), merges, strlen(merges));
    free(text);
    json_decref(vocab);
    TD_ASSERT_STATUS(td_bpe_load(td_test_tmpdir(), &t), want);
    td_test_assert_message_contains(needle);
    assert_null(t);
}

static void refuses_bad_vocabularies_and_merges(void **state) {
    /* "fo" + "x" = "fox" dropped from the vocabulary: the merge has no token */
    load_fails("fox", "#version: 0.2\nf o\nfo x\n", TD_ERR_PARSE,
               "merges.txt:3: \"fo x\": \"fox\" is not in the vocabulary (it does not cover "
               "the merges)");
    load_fails(NULL, "#version: 0.2\nq zz\n", TD_ERR_PARSE, "merges.txt:2: \"q zz\": \"zz\"");
    load_fails(NULL, "h e\nthree tokens here\n", TD_ERR_PARSE,
               "merges.txt:2: expected two tokens separated by one space");
    /* 'Ġ' is the space byte's character */
    load_fails("\xc4\xa0", "", TD_ERR_PARSE,
               "vocab.json: no token for byte 0x20 (\"\xc4\xa0\"); a byte-level BPE vocabulary "
               "holds all 256");
    {
        td_bpe *t = NULL;
        const char *dup = "{\"a\": 1, \"b\": 1}", *euro = "{\"a\": 1, \"\xe2\x82\xac\": 2}";
        td_test_write_file(td_test_tmp("vocab.json"), dup, strlen(dup));
        TD_ASSERT_STATUS(td_bpe_load(td_test_tmpdir(), &t), TD_ERR_PARSE);
        td_test_assert_message_contains("id 1 is another token's too");
        td_test_write_file(td_test_tmp("vocab.json"), euro, strlen(euro));
        TD_ASSERT_STATUS(td_bpe_load(td_test_tmpdir(), &t), TD_ERR_PARSE);
        td_test_assert_message_contains("character U+20AC is not one of GPT-2's byte characters");
        td_test_write_file(td_test_tmp("vocab.json"), "[1, 2]", 6);
        TD_ASSERT_STATUS(td_bpe_load(td_test_tmpdir(), &t), TD_ERR_PARSE);
        td_test_assert_message_contains("vocab.json: expected an object from token to id");
        TD_ASSERT_STATUS(td_bpe_load(td_test_tmp("missing"), &t), TD_ERR_IO);
        td_test_assert_message_contains("missing/vocab.json");
    }
}

/* td_last_error() names path once, says `what`, and has no line number
 * when there is no line (jansson's -1 for a file it could not open). */
static void expect_named_once(const char *path, const char *what) {
    const char *msg = td_last_error(), *at = strstr(msg, path);
    if (!at || strstr(at + 1, path) || strstr(msg, ":-1") || !strstr(msg, what))
        fail_msg("expected %s once, saying \"%s\", with no line -1: %s", path, what, msg);
}

static void a_vocabulary_that_cannot_be_read_is_named_once(void **state) {
    td_bpe *t = NULL;
    const char *broken = "{\"a\": 1,\n \"b\" 2}";
    (void)state;
    TD_ASSERT_STATUS(td_bpe_load(td_test_tmp("missing"), &t), TD_ERR_IO);
    expect_named_once("missing/vocab.json", ": cannot open: No such file or directory");
    td_test_write_file(td_test_tmp("vocab.json"), broken, strlen(broken));
    TD_ASSERT_STATUS(td_bpe_load(td_test_tmpdir(), &t), TD_ERR_PARSE);
    expect_named_once("vocab.json", "vocab.json:2:");
    assert_null(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(encodes_as_gpt2_tokenizer),
        cmocka_unit_test(any_bytes_round_trip),
        cmocka_unit_test(token_bytes_and_bad_ids),
        cmocka_unit_test(refuses_bad_vocabularies_and_merges),
        cmocka_unit_test(a_vocabulary_that_cannot_be_read_is_named_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
