/* llm.c's token files as --data: windows read back against the tokens the
 * test wrote, the held-out end or a --test-data file, training from the CLI,
 * and the mistakes, each named. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

enum { T = 8, N = 1000 };

/* An llm.c token file (header[0] 20240520, header[1] version, header[2]
 * the count, 256 ints in all, then uint16 tokens) of tok[0..n), whose
 * header claims `claim` tokens. */
static void write_tokens(const char *path, const int32_t *tok, int n, int version, int claim) {
    size_t len = 256 * sizeof(int32_t) + (size_t)n * 2;
    unsigned char *buf = calloc(1, len);
    int32_t h[3] = {20240520, version, claim};
    memcpy(buf, h, sizeof h);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)tok[i];
        memcpy(buf + 256 * sizeof(int32_t) + 2 * (size_t)i, &t, 2);
    }
    td_test_write_file(path, buf, len);
    free(buf);
}

static void make_tokens(int32_t *tok, int n, int vocab) {
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(((unsigned)i * 2654435761u >> 7) % (unsigned)vocab);
}

static td_model_info gpt(int64_t classes) {
    td_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.kind = TD_INPUT_TOKENS;
    mi.in_ndim = 1;
    mi.in_shape[0] = T;
    mi.classes = classes;
    return mi;
}

/* Sample i of ds is the window at tok[start + i * stride]: tokens and, one
 * on, labels. */
static void expect_windows(td_dataset *ds, const int32_t *tok, size_t start, size_t stride,
                           int64_t size) {
    td_dataset_info di;
    int32_t got[T], lab[T];
    td_dataset_get_info(ds, &di);
    assert_int_equal(di.size, size);
    assert_int_equal(di.features, T);
    for (int64_t i = 0; i < size; i += 7) {
        const int32_t *w = tok + start + (size_t)i * stride;
        TD_ASSERT_OK(td_dataset_get(ds, i, NULL, got, lab));
        assert_memory_equal(got, w, sizeof got);
        assert_memory_equal(lab, w + 1, sizeof lab);
    }
}

static void windows_are_the_files_tokens(void **state) {
    int32_t tok[N], val[300];
    td_model_info mi = gpt(50257);
    td_data_options o = {0};
    td_dataset *train = NULL, *test = NULL;
    const char *path = td_test_tmp("d_train.bin"), *vpath = td_test_tmp("d_val.bin");
    make_tokens(tok, N, 50257);
    make_tokens(val, 300, 50000);
    write_tokens(path, tok, N, 1, N);
    write_tokens(vpath, val, 300, 1, 300);
    /* the end held out: 900 tokens train, 100 validate without overlap */
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    expect_windows(train, tok, 0, 1, 900 - T);
    expect_windows(test, tok, 900, T, (100 - 1) / T);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    o.test_path = vpath;
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    expect_windows(train, tok, 0, 1, N - T);
    expect_windows(test, val, 0, T, (300 - 1) / T);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
}

static void expect_error(const char *path, const td_data_options *o, const td_model_info *mi,
                         td_status want, const char *needle) {
    td_dataset *train = NULL, *test = NULL;
    TD_ASSERT_STATUS(td_data_open(path, o, mi, &train, &test), want);
    td_test_assert_message_contains(needle);
    assert_null(train);
    assert_null(test);
}

static void mistakes_are_named(void **state) {
    int32_t tok[N];
    td_model_info mi = gpt(256), image = gpt(10);
    td_data_options o = {0};
    const char *path = td_test_tmp("m.bin");
    image.kind = TD_INPUT_FEATURES;
    make_tokens(tok, N, 300);
    write_tokens(path, tok, N, 1, N);
    expect_error(path, &o, &mi, TD_ERR_SHAPE, "the model outputs 256");
    expect_error(path, &o, &image, TD_ERR_INVALID_ARG, "reads features");
    make_tokens(tok, N, 256);
    write_tokens(path, tok, N, 2, N);
    expect_error(path, &o, &mi, TD_ERR_UNSUPPORTED, "header[1] (version) is 2");
    write_tokens(path, tok, N, 1, N + 5);
    expect_error(path, &o, &mi, TD_ERR_CORRUPT, "header[2]");
    write_tokens(path, tok, T, 1, T);
    expect_error(path, &o, &mi, TD_ERR_INVALID_ARG, "a window of context 8");
    td_test_write_file(td_test_tmp("short.bin"), "abc", 3);
    expect_error(td_test_tmp("short.bin"), &o, &mi, TD_ERR_CORRUPT, "short.bin");
    {
        /* A text corpus named .bin: its message says how to train on it. */
        static const char line[] = "First Citizen:\nBefore we proceed any further, hear me.\n";
        char text[2048];
        for (size_t i = 0; i < sizeof text; i++)
            text[i] = line[i % (sizeof line - 1)];
        td_test_write_file(td_test_tmp("corpus.bin"), text, sizeof text);
        expect_error(td_test_tmp("corpus.bin"), &o, &mi, TD_ERR_CORRUPT,
                     "not an llm.c token file; it looks like text, and tandem reads any .bin as "
                     "llm.c tokens: rename it (to ");
        td_test_assert_message_contains("corpus.txt, say) to train on it as a text corpus");
        /* Bytes that are not text (a NUL, a bad magic) are not called text. */
        text[100] = '\0';
        td_test_write_file(td_test_tmp("corpus.bin"), text, sizeof text);
        expect_error(td_test_tmp("corpus.bin"), &o, &mi, TD_ERR_CORRUPT, "not an llm.c token file");
        assert_null(strstr(td_last_error(), "looks like text"));
        write_tokens(path, tok, N, 1, N);
        {
            FILE *f = fopen(path, "r+b");
            int32_t magic = 7;
            assert_non_null(f);
            assert_int_equal(fwrite(&magic, 4, 1, f), 1);
            fclose(f);
        }
        expect_error(path, &o, &mi, TD_ERR_CORRUPT, "not an llm.c token file");
        assert_null(strstr(td_last_error(), "looks like text"));
    }
    write_tokens(path, tok, N, 1, N);
    o.test_path = td_test_tmp("v.csv");
    td_test_write_file(o.test_path, "a\n", 2);
    expect_error(path, &o, &mi, TD_ERR_INVALID_ARG, "`test_path` must be one too");
    assert_string_equal(td_last_error_setting(), "test_path");
}

/* tandem train reads the files: a byte-level GPT-tiny on tokens < 256. */
static void the_cli_trains_on_them(void **state) {
    int32_t tok[4000];
    char cmd[4096];
    const char *path = td_test_tmp("s_train.bin"), *vpath = td_test_tmp("s_val.bin");
    make_tokens(tok, 4000, 256);
    write_tokens(path, tok, 4000, 1, 4000);
    write_tokens(vpath, tok + 3000, 1000, 1, 1000);
    snprintf(cmd, sizeof cmd,
             "'%s' train --model '%s/examples/gpt_tiny.json' --data '%s' --test-data '%s' "
             "--steps 2 --batch 2 > '%s' 2>&1",
             TD_TANDEM_EXE, TD_SOURCE_DIR, path, vpath, td_test_tmp("out.txt"));
    if (system(cmd) != 0) {
        char *out = (char *)td_test_read_file(td_test_tmp("out.txt"), NULL);
        fail_msg("%s failed: %s", cmd, out ? out : "(no output)");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(windows_are_the_files_tokens),
        cmocka_unit_test(mistakes_are_named),
        cmocka_unit_test(the_cli_trains_on_them),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
