/* Users' own data through td_data_open(): .npy pairs, safetensors files and
 * CSV tables written here from arrays the test made, read back and compared
 * with those arrays; the held-out split; an IDX folder other than MNIST; and
 * every kind of bad file, each with the message that names what is wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/data_files.h"
#include "support/support.h"
#include "tandem/checkpoint.h"

/* A model that reads `features` floats (or T tokens) and has `classes` outputs. */
static td_model_info model(td_input_kind kind, int64_t features, int64_t classes) {
    td_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.kind = kind;
    mi.in_ndim = 1;
    mi.in_shape[0] = features;
    mi.classes = classes;
    return mi;
}

/* A version 1 .npy file whose header is dict and a newline, without data. */
static void write_npy_dict(const char *path, const char *dict) {
    size_t len = strlen(dict) + 1;
    unsigned char *buf = malloc(10 + len);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)len;
    buf[9] = (unsigned char)(len >> 8);
    memcpy(buf + 10, dict, len - 1);
    buf[9 + len] = '\n';
    td_test_write_file(path, buf, 10 + len);
    free(buf);
}

/* Every sample of train and test against the arrays that made them: x[r*f]
 * is r, which says which row a sample is. Rows appear once, in file order
 * within each part. */
static void expect_rows(td_dataset *train, td_dataset *test, const float *x, const int32_t *y,
                        int64_t rows, int64_t f) {
    td_dataset *part[2] = {train, test};
    int *seen = calloc((size_t)rows, sizeof *seen);
    float *got = malloc((size_t)f * sizeof *got);
    for (int p = 0; p < 2; p++) {
        td_dataset_info info;
        int64_t prev = -1;
        td_dataset_get_info(part[p], &info);
        assert_int_equal(info.features, f);
        for (int64_t i = 0; i < info.size; i++) {
            int32_t label;
            int64_t r;
            TD_ASSERT_OK(td_dataset_get(part[p], i, got, NULL, &label));
            r = (int64_t)got[0];
            assert_true(r > prev && r < rows);
            prev = r;
            seen[r]++;
            assert_memory_equal(got, x + r * f, (size_t)f * sizeof *got);
            assert_int_equal(label, y[r]);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(seen[r], 1);
    free(seen);
    free(got);
}

#define ROWS 40
#define FEAT 3

/* The reference arrays: row r is (r, r/8 - 2, -r/4), labels r mod 4, all
 * exact in float32 and float64. */
static void make_rows(float *x, double *xd, unsigned char *xb, int64_t *y64, int32_t *y) {
    for (int r = 0; r < ROWS; r++) {
        float v[FEAT] = {(float)r, (float)r / 8 - 2, -(float)r / 4};
        for (int j = 0; j < FEAT; j++) {
            x[r * FEAT + j] = xb ? (float)(unsigned char)(r * (j + 1)) : v[j];
            if (xd)
                xd[r * FEAT + j] = v[j];
            if (xb)
                xb[r * FEAT + j] = (unsigned char)(r * (j + 1));
        }
        y64[r] = r % 4;
        y[r] = r % 4;
    }
}

/* Big-endian copy of n elements of `size` bytes. */
static void *swapped(const void *src, size_t n, size_t size) {
    const unsigned char *s = src;
    unsigned char *d = malloc(n * size);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < size; k++)
            d[i * size + k] = s[i * size + size - 1 - k];
    return d;
}

static void npy_pairs_read_back_what_was_written(void **state) {
    float x[ROWS * FEAT], xu8f[ROWS * FEAT];
    double xd[ROWS * FEAT];
    unsigned char xb[ROWS * FEAT], yb[ROWS];
    int64_t y64[ROWS];
    int32_t y[ROWS], y32[ROWS];
    td_model_info mi = model(TD_INPUT_FEATURES, FEAT, 4);
    td_data_options o = {.split = 0.25};
    td_dataset *train, *test;
    td_dataset_info info;
    char path[1024];
    void *be;
    make_rows(x, xd, NULL, y64, y);
    make_rows(xu8f, NULL, xb, y64, y);
    for (int r = 0; r < ROWS; r++) {
        y32[r] = y[r];
        yb[r] = (unsigned char)y[r];
    }
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(40, 3)", x, sizeof x);
    td_test_write_npy(td_test_tmp("y.npy"), "<i8", "(40,)", y64, sizeof y64);
    td_test_write_npy(td_test_tmp("xd.npy"), "<f8", "(40, 3)", xd, sizeof xd);
    td_test_write_npy(td_test_tmp("xb.npy"), "|u1", "(40, 3)", xb, sizeof xb);
    td_test_write_npy(td_test_tmp("y32.npy"), "<i4", "(40, 1)", y32, sizeof y32);
    td_test_write_npy(td_test_tmp("yb.npy"), "|u1", "(40,)", yb, sizeof yb);
    be = swapped(x, ROWS * FEAT, 4);
    td_test_write_npy_v(td_test_tmp("xbe.npy"), 2, ">f4", "False", "(40, 3)", be, sizeof x);
    free(be);

    snprintf(path, sizeof path, "%s,%s", td_test_tmp("x.npy"), td_test_tmp("y.npy"));
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.size, 30);
    assert_int_equal(info.kind, TD_INPUT_FEATURES);
    assert_int_equal(info.num_classes, 4);
    assert_int_equal(info.labels_per_sample, 1);
    assert_string_equal(td_dataset_source(train), path);
    td_dataset_get_info(test, &info);
    assert_int_equal(info.size, 10);
    expect_rows(train, test, x, y, ROWS, FEAT);
    {
        /* The same file splits the same way again. */
        td_dataset *train2, *test2;
        float a[FEAT], b[FEAT];
        int32_t la, lb;
        TD_ASSERT_OK(td_data_open(path, &o, &mi, &train2, &test2));
        for (int64_t i = 0; i < 10; i++) {
            TD_ASSERT_OK(td_dataset_get(test, i, a, NULL, &la));
            TD_ASSERT_OK(td_dataset_get(test2, i, b, NULL, &lb));
            assert_memory_equal(a, b, sizeof a);
        }
        td_dataset_destroy(train2);
        td_dataset_destroy(test2);
    }
    td_dataset_destroy(train);
    td_dataset_destroy(test);

    /* float64 features, int32 (N, 1) labels; big-endian float32 in format
     * version 2; bytes with byte labels. */
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("xd.npy"), td_test_tmp("y32.npy"));
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    expect_rows(train, test, x, y, ROWS, FEAT);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("xbe.npy"), td_test_tmp("yb.npy"));
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    expect_rows(train, test, x, y, ROWS, FEAT);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("xb.npy"), td_test_tmp("y.npy"));
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    expect_rows(train, test, xu8f, y, ROWS, FEAT);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
}

static void safetensors_files_read_back_and_test_data_is_used_whole(void **state) {
    float x[ROWS * FEAT];
    double xd[ROWS * FEAT];
    int64_t y64[ROWS];
    int32_t y[ROWS];
    td_model_info mi = model(TD_INPUT_FEATURES, FEAT, 4);
    td_data_options o = {0};
    td_dataset *train, *test;
    td_dataset_info info;
    make_rows(x, xd, NULL, y64, y);
    {
        td_test_st_entry e[] = {{"x", "F32", "[40,3]", x, ROWS * FEAT * 4},
                                {"y", "I64", "[40]", y64, sizeof y64}};
        td_test_write_safetensors(td_test_tmp("d.safetensors"), e, 2);
    }
    {
        td_test_st_entry e[] = {{"y", "I64", "[40]", y64, sizeof y64},
                                {"x", "F64", "[40,3]", xd, sizeof xd}};
        td_test_write_safetensors(td_test_tmp("t.safetensors"), e, 2);
    }
    /* Default split: 10% held out. */
    TD_ASSERT_OK(td_data_open(td_test_tmp("d.safetensors"), &o, &mi, &train, &test));
    td_dataset_get_info(test, &info);
    assert_int_equal(info.size, 4);
    expect_rows(train, test, x, y, ROWS, FEAT);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    /* --test-data: the second file is the test set, whole and in order. */
    o.test_path = td_test_tmp("t.safetensors");
    TD_ASSERT_OK(td_data_open(td_test_tmp("d.safetensors"), &o, &mi, &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.size, ROWS);
    td_dataset_get_info(test, &info);
    assert_int_equal(info.size, ROWS);
    for (int64_t i = 0; i < ROWS; i++) {
        float got[FEAT];
        int32_t label;
        TD_ASSERT_OK(td_dataset_get(test, i, got, NULL, &label));
        assert_memory_equal(got, x + i * FEAT, sizeof got);
        assert_int_equal(label, y[i]);
    }
    td_dataset_destroy(train);
    td_dataset_destroy(test);
}

/* td_data_open of path fails with want, the message holding each needle. */
static void expect_open_error(const char *path, const td_data_options *o, const td_model_info *mi,
                              td_status want, const char *needle1, const char *needle2) {
    td_dataset *train = (td_dataset *)1, *test = (td_dataset *)1;
    TD_ASSERT_STATUS(td_data_open(path, o, mi, &train, &test), want);
    assert_null(train);
    assert_null(test);
    td_test_assert_message_contains(needle1);
    if (needle2)
        td_test_assert_message_contains(needle2);
}

static void safetensors_mistakes_are_named(void **state) {
    float x[8] = {0, 1, 2, 3, 4, 5, 6, NAN};
    float yf[4] = {0, 1, 0, 1};
    int64_t y[4] = {0, 1, 0, 1}, y5[5] = {0};
    uint16_t h[8] = {0};
    td_model_info mi = model(TD_INPUT_FEATURES, 2, 2);
    td_data_options o = {.split = 0.5};
    {
        td_test_st_entry e[] = {{"x", "F32", "[4,2]", x, sizeof x},
                                {"y", "I64", "[4]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("nan.safetensors"), e, 2);
    }
    expect_open_error(td_test_tmp("nan.safetensors"), &o, &mi, TD_ERR_INVALID_ARG,
                      "tensor \"x\": row 3 (0-based), value 1 is NaN", NULL);
    x[7] = 7;
    {
        /* tandem's own writer: float labels. */
        td_safetensors_writer *w;
        int64_t xs[2] = {4, 2}, ys[1] = {4};
        TD_ASSERT_OK(td_safetensors_writer_create(&w));
        TD_ASSERT_OK(td_safetensors_writer_add(w, "x", TD_F32, 2, xs, x));
        TD_ASSERT_OK(td_safetensors_writer_add(w, "y", TD_F32, 1, ys, yf));
        TD_ASSERT_OK(td_safetensors_writer_save(w, td_test_tmp("fy.safetensors")));
        td_safetensors_writer_destroy(w);
    }
    expect_open_error(td_test_tmp("fy.safetensors"), &o, &mi, TD_ERR_DTYPE,
                      "tensor \"y\": labels are float32; they must be integers", NULL);
    {
        td_test_st_entry e[] = {{"x", "F32", "[4,2]", x, sizeof x},
                                {"y", "I64", "[5]", y5, sizeof y5}};
        td_test_write_safetensors(td_test_tmp("n.safetensors"), e, 2);
    }
    expect_open_error(td_test_tmp("n.safetensors"), &o, &mi, TD_ERR_SHAPE, "has 4 rows",
                      "tensor \"y\" has 5");
    {
        td_test_st_entry e[] = {{"x", "F32", "[4,2]", x, sizeof x},
                                {"labels", "I64", "[4]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("noy.safetensors"), e, 2);
    }
    expect_open_error(td_test_tmp("noy.safetensors"), &o, &mi, TD_ERR_SHAPE, "no tensor \"y\"",
                      "\"labels\"");
    {
        td_test_st_entry e[] = {{"x", "F16", "[4,2]", h, sizeof h},
                                {"y", "I64", "[4]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("f16.safetensors"), e, 2);
    }
    expect_open_error(td_test_tmp("f16.safetensors"), &o, &mi, TD_ERR_DTYPE, "dtype F16", NULL);
    {
        /* A dtype the format lacks (strings): the message names what a data
         * file may hold, integers included, not only F32 and F64. */
        td_test_st_entry e[] = {{"x", "STR", "[4,2]", x, sizeof x},
                                {"y", "I64", "[4]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("str.safetensors"), e, 2);
    }
    expect_open_error(td_test_tmp("str.safetensors"), &o, &mi, TD_ERR_CORRUPT,
                      "tensor \"x\": dtype \"STR\"; not one the safetensors format names "
                      "(tandem reads F32, F64, BOOL and integer (U8 to I64) tensors)",
                      NULL);
    {
        /* (4, 2) samples of 2 values, a model reading 3. */
        td_model_info three = model(TD_INPUT_FEATURES, 3, 2);
        td_test_st_entry e[] = {{"x", "F32", "[4,2]", x, sizeof x},
                                {"y", "I64", "[4]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("ok.safetensors"), e, 2);
        expect_open_error(td_test_tmp("ok.safetensors"), &o, &three, TD_ERR_SHAPE,
                          "ok.safetensors: samples have shape (2) (2 values)",
                          "the model reads (3) (3 values)");
        /* Labels past the model's classes. */
        y[2] = 5;
        td_test_write_safetensors(td_test_tmp("ok.safetensors"), e, 2);
        expect_open_error(td_test_tmp("ok.safetensors"), &o, &mi, TD_ERR_INVALID_ARG,
                          "row 2 (0-based): label 5 is outside the model's classes [0, 2)", NULL);
    }
}

static void npy_mistakes_are_named(void **state) {
    float x[15] = {0};
    int64_t y[5] = {0, 1, 2, 0, 1}, y4[4] = {0};
    double yd[5] = {0};
    td_model_info mi = model(TD_INPUT_FEATURES, 3, 3);
    td_data_options o = {.split = 0.4};
    char path[1024];
    unsigned char *bytes;
    size_t n;
    td_test_write_npy(td_test_tmp("y.npy"), "<i8", "(5,)", y, sizeof y);
#define PAIR(xname)                                                                                \
    (snprintf(path, sizeof path, "%s,%s", td_test_tmp(xname), td_test_tmp("y.npy")), path)
    /* Truncated data, and a truncated header. */
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(5, 3)", x, sizeof x);
    bytes = td_test_read_file(td_test_tmp("x.npy"), &n);
    td_test_write_file(td_test_tmp("short.npy"), bytes, n - 5);
    expect_open_error(PAIR("short.npy"), &o, &mi, TD_ERR_CORRUPT, "short.npy: truncated",
                      "need 60 bytes of data, the file has 55");
    td_test_write_file(td_test_tmp("short.npy"), bytes, 40);
    expect_open_error(PAIR("short.npy"), &o, &mi, TD_ERR_CORRUPT, "short.npy: truncated", NULL);
    td_test_write_file(td_test_tmp("short.npy"), "\x93NUMPX\x01\x00", 8);
    expect_open_error(PAIR("short.npy"), &o, &mi, TD_ERR_CORRUPT, "not a .npy file", NULL);
    free(bytes);
    /* Layouts and dtypes tandem does not read. */
    td_test_write_npy_v(td_test_tmp("f.npy"), 1, "<f4", "True", "(5, 3)", x, sizeof x);
    expect_open_error(PAIR("f.npy"), &o, &mi, TD_ERR_UNSUPPORTED, "fortran_order is True", NULL);
    td_test_write_npy(td_test_tmp("h.npy"), "<f2", "(5, 3)", x, 30);
    expect_open_error(PAIR("h.npy"), &o, &mi, TD_ERR_UNSUPPORTED, "dtype '<f2'", "astype");
    td_test_write_npy(td_test_tmp("c.npy"), "<c8", "(5, 3)", x, 0);
    expect_open_error(PAIR("c.npy"), &o, &mi, TD_ERR_UNSUPPORTED, "dtype '<c8'", NULL);
    /* Headers that are not the dict numpy writes. */
    td_test_write_npy(td_test_tmp("s.npy"), "<f4", "(5)", x, 20);
    expect_open_error(PAIR("s.npy"), &o, &mi, TD_ERR_CORRUPT, "needs its comma", NULL);
    write_npy_dict(td_test_tmp("k.npy"), "{'descr': '<f4', 'fortran_order': False, 'shap': (1,)}");
    expect_open_error(PAIR("k.npy"), &o, &mi, TD_ERR_CORRUPT, "key 'shap' (unknown)", NULL);
    write_npy_dict(td_test_tmp("k.npy"), "{'descr': [('a', '<f4')], 'shape': (1,)}");
    expect_open_error(PAIR("k.npy"), &o, &mi, TD_ERR_UNSUPPORTED, "structured dtype", NULL);
    /* Data that does not fit: extra bytes, row counts, values. */
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(4, 3)", x, sizeof x);
    expect_open_error(PAIR("x.npy"), &o, &mi, TD_ERR_CORRUPT, "12 unexpected bytes", NULL);
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(5, 3)", x, sizeof x);
    td_test_write_npy(td_test_tmp("y4.npy"), "<i8", "(4,)", y4, sizeof y4);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("x.npy"), td_test_tmp("y4.npy"));
    expect_open_error(path, &o, &mi, TD_ERR_SHAPE, "x.npy has 5 rows but", "y4.npy has 4");
    x[3 * 3 + 1] = INFINITY;
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(5, 3)", x, sizeof x);
    expect_open_error(PAIR("x.npy"), &o, &mi, TD_ERR_INVALID_ARG,
                      "x.npy: row 3 (0-based), value 1 is infinite", NULL);
    x[3 * 3 + 1] = 0;
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(5, 3)", x, sizeof x);
    td_test_write_npy(td_test_tmp("yd.npy"), "<f8", "(5,)", yd, sizeof yd);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("x.npy"), td_test_tmp("yd.npy"));
    expect_open_error(path, &o, &mi, TD_ERR_DTYPE, "labels are float64", NULL);
    y[4] = -1;
    td_test_write_npy(td_test_tmp("y.npy"), "<i8", "(5,)", y, sizeof y);
    expect_open_error(PAIR("x.npy"), &o, &mi, TD_ERR_INVALID_ARG,
                      "y.npy: row 4 (0-based): label -1 is outside the model's classes [0, 3)",
                      NULL);
    /* Paths: a lone .npy, a missing labels file. */
    expect_open_error(td_test_tmp("x.npy"), &o, &mi, TD_ERR_INVALID_ARG,
                      "give the features and the labels as `data_path` X.npy,Y.npy", NULL);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("x.npy"), td_test_tmp("none.npy"));
    expect_open_error(path, &o, &mi, TD_ERR_IO, "none.npy", NULL);
#undef PAIR
}

static void token_models_read_token_arrays(void **state) {
    int32_t tok[6 * 4], next[6 * 4];
    td_model_info mi = model(TD_INPUT_TOKENS, 4, 10);
    td_data_options o = {.split = 0.5};
    td_dataset *train, *test;
    td_dataset_info info;
    char path[1024];
    for (int i = 0; i < 24; i++) {
        tok[i] = i % 10;
        next[i] = (i + 1) % 10;
    }
    td_test_write_npy(td_test_tmp("tx.npy"), "<i4", "(6, 4)", tok, sizeof tok);
    td_test_write_npy(td_test_tmp("ty.npy"), "<i4", "(6, 4)", next, sizeof next);
    snprintf(path, sizeof path, "%s,%s", td_test_tmp("tx.npy"), td_test_tmp("ty.npy"));
    TD_ASSERT_OK(td_data_open(path, &o, &mi, &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.kind, TD_INPUT_TOKENS);
    assert_int_equal(info.size, 3);
    assert_int_equal(info.labels_per_sample, 4);
    for (int p = 0; p < 2; p++) {
        td_dataset *ds = p ? test : train;
        for (int64_t i = 0; i < 3; i++) {
            int32_t t[4], l[4], r;
            TD_ASSERT_OK(td_dataset_get(ds, i, NULL, t, l));
            r = -1;
            for (int k = 0; k < 6; k++)
                if (!memcmp(t, tok + 4 * k, sizeof t))
                    r = k;
            assert_true(r >= 0);
            assert_memory_equal(l, next + 4 * r, sizeof l);
        }
    }
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    tok[9] = 10;
    td_test_write_npy(td_test_tmp("tx.npy"), "<i4", "(6, 4)", tok, sizeof tok);
    expect_open_error(path, &o, &mi, TD_ERR_INVALID_ARG,
                      "tx.npy: row 2 (0-based), position 1: token 10 is outside the model's "
                      "vocabulary [0, 10)",
                      NULL);
    expect_open_error(TD_SOURCE_DIR "/data/text/tinyshakespeare.txt.csv", &o, &mi, TD_ERR_IO,
                      "no such file", NULL);
}

static void csv_tables_read_back_what_was_written(void **state) {
    /* Quoted names, the label column in the middle under another name, CRLF
     * line ends, a byte order mark, spaces and a quoted cell, blank lines
     * at the end. */
    static const char text[] = "\xEF\xBB\xBF"
                               "\"a, first\",species,b\r\n"
                               "0.5,2,-1.25\r\n"
                               "1, 0 ,\"3e2\"\r\n"
                               "2,1,0.125\r\n"
                               "3,\"2\",-0\r\n"
                               "\r\n\r\n";
    static const float want_x[] = {0.5f, -1.25f, 1, 300, 2, 0.125f, 3, -0.0f};
    static const int32_t want_y[] = {2, 0, 1, 2};
    td_model_info mi = model(TD_INPUT_FEATURES, 2, 3);
    td_data_options o = {.split = 0.5, .label_column = "species"};
    td_dataset *train, *test;
    td_dataset_info info;
    td_test_write_file(td_test_tmp("t.csv"), text, sizeof text - 1);
    TD_ASSERT_OK(td_data_open(td_test_tmp("t.csv"), &o, &mi, &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.size, 2);
    assert_int_equal(info.ndim, 1);
    assert_int_equal(info.shape[0], 2);
    {
        /* Row r's first value tells it apart (0.5 is row 0). */
        for (int p = 0; p < 2; p++) {
            td_dataset *ds = p ? test : train;
            for (int64_t i = 0; i < 2; i++) {
                float got[2];
                int32_t label;
                int r;
                TD_ASSERT_OK(td_dataset_get(ds, i, got, NULL, &label));
                r = got[0] == 0.5f ? 0 : (int)got[0];
                assert_memory_equal(got, want_x + 2 * r, sizeof got);
                assert_int_equal(label, want_y[r]);
            }
        }
    }
    td_dataset_destroy(train);
    td_dataset_destroy(test);
}

/* A CSV table of `text` opened for a 2-feature, 3-class model fails with
 * a message holding each needle. */
static void expect_csv_error(const char *text, const char *needle1, const char *needle2) {
    td_model_info mi = model(TD_INPUT_FEATURES, 2, 3);
    td_data_options o = {.split = 0.5};
    td_test_write_file(td_test_tmp("bad.csv"), text, strlen(text));
    expect_open_error(td_test_tmp("bad.csv"), &o, &mi, TD_ERR_INVALID_ARG, needle1, needle2);
}

/* As expect_csv_error, for a table of n bytes that may hold NULs. */
static void expect_csv_bytes_error(const char *text, size_t n, const char *needle1,
                                   const char *needle2) {
    td_model_info mi = model(TD_INPUT_FEATURES, 2, 3);
    td_data_options o = {.split = 0.5};
    td_test_write_file(td_test_tmp("nul.csv"), text, n);
    expect_open_error(td_test_tmp("nul.csv"), &o, &mi, TD_ERR_INVALID_ARG, needle1, needle2);
}

static void csv_mistakes_name_the_line_and_column(void **state) {
    expect_csv_error("a,b,label\n1,2,0\n3,4\n5,6,1\n", "bad.csv: line 3 has 2 cells",
                     "the header has 3");
    expect_csv_error("a,b,label\n1,2,0\n3,4,1,9\n", "line 3, column 4",
                     "more cells than the header's 3 columns");
    expect_csv_error("a,b,label\n1,2,0\n3,x4,1\n", "line 3, column 2 (\"b\")",
                     "'x4' is not a number");
    expect_csv_error("a,b,label\n1,,0\n", "line 2, column 2 (\"b\")", "an empty cell");
    expect_csv_error("a,b,label\n1,2,0\nnan,4,1\n", "line 3, column 1 (\"a\")",
                     "'nan' is not finite");
    expect_csv_error("a,b,label\n1,-inf,0\n", "line 2, column 2 (\"b\")", "not finite");
    expect_csv_error("a,b,label\n1,1e39,0\n", "line 2, column 2", "beyond float32's range");
    expect_csv_error("a,b,label\n1,2,0\n1,2,3\n", "line 3, column 3 (\"label\")",
                     "label 3 is outside the model's classes [0, 3)");
    expect_csv_error("a,b,label\n1,2,-1\n", "line 2, column 3", "label -1 is outside");
    expect_csv_error("a,b,label\n1,2,1.5\n", "line 2, column 3", "not a whole number");
    expect_csv_error("a,b,class\n1,2,1\n", "line 1: no column named \"label\"", "`label_column`");
    assert_string_equal(td_last_error_setting(), "label_column");
    expect_csv_error("a,label,label\n1,2,1\n", "columns 2 and 3 are both named", NULL);
    assert_null(td_last_error_setting());
    expect_csv_error("a,b,label\n1,\"2,0\n", "line 2, column 2: a quoted cell never closes", NULL);
    expect_csv_error("a,b,label\n1,\"2\"x,0\n", "line 2, column 2", "text after the closing quote");
    expect_csv_error("a,b,label\n1,2\"3,0\n", "line 2, column 2", "a quote inside an unquoted");
    expect_csv_error("a,b,label\n1,2,0\n\n1,2,0\n", "line 3 is empty", NULL);
    expect_csv_error("", "empty; a CSV table starts with a header", NULL);
    expect_csv_error("a,b,label\n", "a header but no rows", NULL);
    expect_csv_error("label\n1\n", "only the label column", NULL);
    /* A NUL inside a cell, in a feature, a label, a quoted cell or the header,
     * is refused rather than ending the cell early ("2\0abc" read as 2). */
    {
        static const char feature[] = "a,b,label\n1,2\0abc,0\n3,4,1\n";
        static const char label[] = "a,b,label\n1,2,1\0x\n3,4,1\n";
        static const char quoted[] = "a,b,label\n1,2,0\n\"3\0\",4,1\n";
        static const char header[] = "a,b\0c,label\n1,2,0\n";
        expect_csv_bytes_error(feature, sizeof feature - 1, "nul.csv: line 2, column 2 (\"b\")",
                               "a NUL byte inside the cell");
        expect_csv_bytes_error(label, sizeof label - 1, "line 2, column 3 (\"label\")",
                               "a NUL byte inside the cell");
        expect_csv_bytes_error(quoted, sizeof quoted - 1, "line 3, column 1 (\"a\")",
                               "a NUL byte inside the cell");
        expect_csv_bytes_error(header, sizeof header - 1, "line 1, column 2",
                               "a NUL byte inside the cell");
    }
    /* A quoted cell may span lines: the next record's line is counted right. */
    expect_csv_error("\"a\nb\",c,label\n1,2,0\n1,2,x\n", "line 4, column 3", NULL);
}

static void split_and_test_data_rules(void **state) {
    td_model_info mi = model(TD_INPUT_FEATURES, 2, 3);
    td_data_options o = {.split = 0.1};
    static const char three[] = "a,b,label\n1,2,0\n3,4,1\n5,6,2\n";
    td_test_write_file(td_test_tmp("three.csv"), three, strlen(three));
    expect_open_error(td_test_tmp("three.csv"), &o, &mi, TD_ERR_INVALID_ARG,
                      "holding out 0.1 of 3 samples leaves the test part empty", "(`split`)");
    /* The library names settings as the C API does; a flag is the CLI's. */
    assert_string_equal(td_last_error_setting(), "split");
    o.split = 0.9;
    expect_open_error(td_test_tmp("three.csv"), &o, &mi, TD_ERR_INVALID_ARG,
                      "leaves the training part empty", NULL);
    o.test_path = td_test_tmp("three.csv");
    expect_open_error(td_test_tmp("three.csv"), &o, &mi, TD_ERR_INVALID_ARG,
                      "`split` and `test_path` both say", NULL);
    assert_string_equal(td_last_error_setting(), "split");
    o.split = 0;
    expect_open_error(TD_SOURCE_DIR "/data/mnist", &o, &mi, TD_ERR_INVALID_ARG,
                      "its own t10k test files", NULL);
    o.test_path = NULL;
    o.split = 0.2;
    expect_open_error(TD_SOURCE_DIR "/data/mnist", &o, &mi, TD_ERR_INVALID_ARG,
                      "`split` holds out part of one file", NULL);
    o.split = 0;
    expect_open_error(
        TD_SOURCE_DIR "/examples/mnist_mlp.json", &o, &mi, TD_ERR_INVALID_ARG,
        "not a folder of MNIST IDX files, a .csv, a .safetensors, X.npy,Y.npy or an llm.c", NULL);
    {
        td_model_info gpt = model(TD_INPUT_TOKENS, 4, 256);
        expect_open_error(td_test_tmp("three.csv"), &o, &gpt, TD_ERR_INVALID_ARG,
                          "a CSV table holds features; the model reads tokens", NULL);
    }
}

/* An IDX file of unsigned bytes with the given extents. */
static void write_idx(const char *path, int ndim, const uint32_t *dims, const unsigned char *data,
                      size_t n) {
    unsigned char *buf = malloc(4 + 4 * (size_t)ndim + n);
    buf[0] = buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int k = 0; k < 4; k++)
            buf[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
    memcpy(buf + 4 + 4 * ndim, data, n);
    td_test_write_file(path, buf, 4 + 4 * (size_t)ndim + n);
    free(buf);
}

static void any_idx_folder_is_normalised_by_its_training_images(void **state) {
    /* Training pixels: three of 255 to each 0 -> p/255 has mean 0.75 and
     * deviation sqrt(0.75 * 0.25) = 0.4330 (to 4 decimals). */
    unsigned char im[4 * 2 * 2], lb[4] = {0, 1, 2, 1}, tim[2 * 2 * 2] = {0}, tlb[2] = {1, 0};
    uint32_t idim[3] = {4, 2, 2}, ldim[1] = {4}, tidim[3] = {2, 2, 2}, tldim[1] = {2};
    td_model_info mi = model(TD_INPUT_FEATURES, 4, 3);
    td_dataset *train, *test;
    td_dataset_info info;
    float x[4];
    int32_t label;
    char dir[1024];
    const double mean = 0.75, std = 0.4330;
    for (int i = 0; i < 16; i++)
        im[i] = i % 4 ? 255 : 0;
    tim[1] = 255;
    snprintf(dir, sizeof dir, "%s/fashion", td_test_tmpdir());
    assert_int_equal(mkdir(dir, 0755), 0);
    write_idx(td_test_tmp("fashion/train-images-idx3-ubyte"), 3, idim, im, sizeof im);
    write_idx(td_test_tmp("fashion/train-labels-idx1-ubyte"), 1, ldim, lb, sizeof lb);
    write_idx(td_test_tmp("fashion/t10k-images-idx3-ubyte"), 3, tidim, tim, sizeof tim);
    write_idx(td_test_tmp("fashion/t10k-labels-idx1-ubyte"), 1, tldim, tlb, sizeof tlb);
    TD_ASSERT_OK(td_data_open(dir, NULL, &mi, &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.size, 4);
    assert_int_equal(info.ndim, 3);
    TD_ASSERT_OK(td_dataset_get(train, 1, x, NULL, &label));
    assert_int_equal(label, 1);
    assert_float_equal(x[0], (0 - mean) / std, 1e-6);
    assert_float_equal(x[1], (1 - mean) / std, 1e-6);
    /* The test images take the training images' numbers. */
    TD_ASSERT_OK(td_dataset_get(test, 0, x, NULL, &label));
    assert_int_equal(label, 1);
    assert_float_equal(x[0], (0 - mean) / std, 1e-6);
    assert_float_equal(x[1], (1 - mean) / std, 1e-6);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    /* A model reading another shape is told both. */
    mi = model(TD_INPUT_FEATURES, 784, 10);
    expect_open_error(dir, NULL, &mi, TD_ERR_SHAPE, "samples have shape (1, 2, 2) (4 values)",
                      "the model reads (784) (784 values)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(npy_pairs_read_back_what_was_written),
        cmocka_unit_test(safetensors_files_read_back_and_test_data_is_used_whole),
        cmocka_unit_test(safetensors_mistakes_are_named),
        cmocka_unit_test(npy_mistakes_are_named),
        cmocka_unit_test(token_models_read_token_arrays),
        cmocka_unit_test(csv_tables_read_back_what_was_written),
        cmocka_unit_test(csv_mistakes_name_the_line_and_column),
        cmocka_unit_test(split_and_test_data_rules),
        cmocka_unit_test(any_idx_folder_is_normalised_by_its_training_images),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
