/* The byte-level text data set: windows, labels, vocabularies, the split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"

#define SHAKESPEARE TD_SOURCE_DIR "/data/text/tinyshakespeare.txt"

static char path[] = "/tmp/td_text_XXXXXX";

static int setup(void **state) {
    /* 30 bytes: 27 train (0.9), 3 validation. */
    static const char text[] = "abcabcabcabcabcabcabcabcab\nzyx";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, 30) != 30)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state) {
    return unlink(path);
}

static const char TEXT[] = "abcabcabcabcabcabcabcabcab\nzyx";

static void windows_start_every_byte_and_labels_are_the_next_byte(void **state) {
    /* 15 bytes train, 15 validate. */
    td_text_options opt = {4, 0.5, TD_TEXT_BYTES};
    td_dataset *train, *val;
    td_dataset_info info;
    int32_t tok[4], lab[4];
    TD_ASSERT_OK(td_text_open(path, &opt, &train, &val));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.kind, TD_INPUT_TOKENS);
    assert_int_equal(info.size, 15 - 4);
    assert_int_equal(info.ndim, 1);
    assert_int_equal(info.shape[0], 4);
    assert_int_equal(info.num_classes, 256);
    assert_int_equal(info.labels_per_sample, 4);
    for (int64_t s = 0; s < info.size; s++) {
        TD_ASSERT_OK(td_dataset_get(train, s, NULL, tok, lab));
        for (int i = 0; i < 4; i++) {
            assert_int_equal(tok[i], TEXT[s + i]);
            assert_int_equal(lab[i], TEXT[s + i + 1]);
        }
    }
    /* The last label is the last training byte; no window reads past it. */
    assert_int_equal(lab[3], TEXT[14]);
    TD_ASSERT_STATUS(td_dataset_get(train, info.size, NULL, tok, lab), TD_ERR_INVALID_ARG);
    /* Validation windows do not overlap: start 15 + 4 * s. */
    td_dataset_get_info(val, &info);
    assert_int_equal(info.size, (15 - 1) / 4);
    for (int64_t s = 0; s < info.size; s++) {
        TD_ASSERT_OK(td_dataset_get(val, s, NULL, tok, lab));
        for (int i = 0; i < 4; i++) {
            assert_int_equal(tok[i], (uint8_t)TEXT[15 + 4 * s + i]);
            assert_int_equal(lab[i], (uint8_t)TEXT[15 + 4 * s + i + 1]);
        }
    }
    assert_null(td_dataset_vocab(train, NULL));
    td_dataset_destroy(train);
    td_dataset_destroy(val);
}

static void chars_vocabulary_is_the_sorted_distinct_bytes(void **state) {
    td_text_options opt = {2, 0.5, TD_TEXT_CHARS};
    td_dataset *train, *val;
    td_dataset_info info;
    const uint8_t *vocab;
    size_t n;
    int32_t tok[2], lab[2];
    TD_ASSERT_OK(td_text_open(path, &opt, &train, &val));
    vocab = td_dataset_vocab(train, &n);
    assert_int_equal(n, 7);
    assert_memory_equal(vocab, "\nabcxyz", 7);
    td_dataset_get_info(val, &info);
    assert_int_equal(info.num_classes, 7);
    /* Validation: bytes 15..29, windows every 2 bytes. */
    assert_int_equal(info.size, (15 - 1) / 2);
    TD_ASSERT_OK(td_dataset_get(val, 0, NULL, tok, lab));
    assert_int_equal(vocab[tok[0]], TEXT[15]);
    assert_int_equal(vocab[lab[1]], TEXT[17]);
    TD_ASSERT_OK(td_dataset_get(val, info.size - 1, NULL, tok, lab));
    assert_int_equal(vocab[tok[0]], 'z');
    assert_int_equal(vocab[lab[1]], 'x');
    td_dataset_destroy(train);
    td_dataset_destroy(val);
}

static void tiny_shakespeare_has_65_characters(void **state) {
    td_text_options opt = TD_TEXT_OPTIONS_INIT;
    td_dataset *train, *val;
    td_dataset_info ti, vi;
    size_t n;
    opt.vocab = TD_TEXT_CHARS;
    TD_ASSERT_OK(td_text_open(SHAKESPEARE, &opt, &train, &val));
    td_dataset_vocab(train, &n);
    assert_int_equal(n, 65); /* data/README.md */
    td_dataset_get_info(train, &ti);
    td_dataset_get_info(val, &vi);
    /* 1,115,394 bytes: 1,003,854 train (90%), 111,540 validation. */
    assert_int_equal(ti.size, 1003854 - 128);
    assert_int_equal(vi.size, (111540 - 1) / 128);
    assert_string_equal(td_dataset_source(train), SHAKESPEARE);
    td_dataset_destroy(train);
    td_dataset_destroy(val);
}

static void bad_options_and_files_are_errors(void **state) {
    td_text_options opt = {4, 0.1, TD_TEXT_BYTES};
    td_dataset *train = (td_dataset *)1, *val = (td_dataset *)1;
    TD_ASSERT_STATUS(td_text_open("/nonexistent.txt", &opt, &train, &val), TD_ERR_IO);
    td_test_assert_message_contains("/nonexistent.txt");
    TD_ASSERT_STATUS(td_text_open(TD_SOURCE_DIR "/data", &opt, &train, &val), TD_ERR_IO);
    td_test_assert_message_contains("not a regular file");
    assert_null(train);
    assert_null(val);
    opt.context = 0;
    TD_ASSERT_STATUS(td_text_open(path, &opt, &train, &val), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("context 0");
    opt.context = 4;
    opt.val_fraction = 1.5;
    TD_ASSERT_STATUS(td_text_open(path, &opt, &train, &val), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("fraction");
    /* Validation part of 3 bytes cannot hold a window of 4. */
    opt.val_fraction = 0.1;
    opt.context = 4;
    opt.val_fraction = 0.05;
    TD_ASSERT_STATUS(td_text_open(path, &opt, &train, &val), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("validation part");
    opt.context = 40;
    opt.val_fraction = 0.5;
    TD_ASSERT_STATUS(td_text_open(path, &opt, &train, &val), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("training part");
    assert_null(train);
    assert_null(val);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(windows_start_every_byte_and_labels_are_the_next_byte),
        cmocka_unit_test(chars_vocabulary_is_the_sorted_distinct_bytes),
        cmocka_unit_test(tiny_shakespeare_has_65_characters),
        cmocka_unit_test(bad_options_and_files_are_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
