/* The IDX reader on the real MNIST files and on broken copies of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "support/support.h"

#define MNIST TD_SOURCE_DIR "/data/mnist/"

/* The file unpacked with zlib's own gz reader: an independent path to the bytes. */
static unsigned char *gunzip_file(const char *path, size_t *n) {
    gzFile g = gzopen(path, "rb");
    size_t cap = 1 << 20, len = 0;
    unsigned char *buf = malloc(cap);
    int got;
    assert_non_null(g);
    while ((got = gzread(g, buf + len, (unsigned)(cap - len))) > 0) {
        len += (size_t)got;
        if (len == cap)
            buf = realloc(buf, cap *= 2);
    }
    assert_int_equal(got, 0);
    gzclose(g);
    *n = len;
    return buf;
}

static void label_counts(const td_idx *lb, int counts[10]) {
    memset(counts, 0, 10 * sizeof *counts);
    for (size_t i = 0; i < lb->size; i++) {
        assert_true(lb->data[i] < 10);
        counts[lb->data[i]]++;
    }
}

static void reads_the_shipped_mnist_files(void **state) {
    td_idx im, lb;
    int counts[10];
    /* Class counts published with the data set (data/README.md). */
    static const int train_counts[10] = {5923, 6742, 5958, 6131, 5842,
                                         5421, 5918, 6265, 5851, 5949};
    static const int test_counts[10] = {980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009};
    /* The first labels of each file, as every MNIST tutorial prints them. */
    static const unsigned char train_first[10] = {5, 0, 4, 1, 9, 2, 1, 3, 1, 4};
    static const unsigned char test_first[10] = {7, 2, 1, 0, 4, 1, 4, 9, 5, 9};

    TD_ASSERT_OK(td_idx_read(MNIST "train-images-idx3-ubyte.gz", &im));
    assert_int_equal(im.ndim, 3);
    assert_int_equal(im.dims[0], 60000);
    assert_int_equal(im.dims[1], 28);
    assert_int_equal(im.dims[2], 28);
    assert_int_equal(im.size, 60000u * 784u);
    {
        size_t n;
        unsigned char *ref = gunzip_file(MNIST "train-images-idx3-ubyte.gz", &n);
        assert_int_equal(n, 16 + im.size);
        assert_memory_equal(ref + 16, im.data, im.size);
        free(ref);
    }
    td_idx_deinit(&im);

    TD_ASSERT_OK(td_idx_read(MNIST "train-labels-idx1-ubyte.gz", &lb));
    assert_int_equal(lb.ndim, 1);
    assert_int_equal(lb.dims[0], 60000);
    label_counts(&lb, counts);
    assert_memory_equal(counts, train_counts, sizeof counts);
    assert_memory_equal(lb.data, train_first, 10);
    td_idx_deinit(&lb);

    TD_ASSERT_OK(td_idx_read(MNIST "t10k-labels-idx1-ubyte.gz", &lb));
    assert_int_equal(lb.dims[0], 10000);
    label_counts(&lb, counts);
    assert_memory_equal(counts, test_counts, sizeof counts);
    assert_memory_equal(lb.data, test_first, 10);
    td_idx_deinit(&lb);
    td_idx_deinit(&lb); /* twice is harmless */
}

static void plain_and_gzipped_files_read_the_same(void **state) {
    char path[512];
    size_t n;
    unsigned char *raw = gunzip_file(MNIST "t10k-labels-idx1-ubyte.gz", &n);
    td_idx a, b;
    snprintf(path, sizeof path, "%s/labels", td_test_tmpdir());
    td_test_write_file(path, raw, n);
    TD_ASSERT_OK(td_idx_read(path, &a));
    TD_ASSERT_OK(td_idx_read(MNIST "t10k-labels-idx1-ubyte.gz", &b));
    assert_int_equal(a.size, b.size);
    assert_memory_equal(a.data, b.data, a.size);
    td_idx_deinit(&a);
    td_idx_deinit(&b);
    free(raw);
}

/* Writes bytes to td_test_tmpdir()/name and expects td_idx_read to fail with want and a
 * message holding the path and `needle`. */
static void expect_error(const char *name, const void *bytes, size_t n, td_status want,
                         const char *needle) {
    char path[512];
    td_idx idx;
    snprintf(path, sizeof path, "%s/%s", td_test_tmpdir(), name);
    td_test_write_file(path, bytes, n);
    TD_ASSERT_STATUS(td_idx_read(path, &idx), want);
    td_test_assert_message_contains(path);
    td_test_assert_message_contains(needle);
    assert_null(idx.data);
    assert_int_equal(idx.size, 0);
}

static void broken_gzip_files_are_errors(void **state) {
    size_t n;
    unsigned char *gz = td_test_read_file(MNIST "t10k-images-idx3-ubyte.gz", &n);
    expect_error("half.gz", gz, n / 2, TD_ERR_CORRUPT, "truncated");
    expect_error("no-trailer.gz", gz, n - 4, TD_ERR_CORRUPT, "truncated");
    expect_error("header-only.gz", gz, 12, TD_ERR_CORRUPT, "");
    gz[n / 2] ^= 0x5a;
    expect_error("flipped.gz", gz, n, TD_ERR_CORRUPT, "");
    gz[n / 2] ^= 0x5a;
    gz[n - 8] ^= 0x01; /* the CRC-32 of the data */
    expect_error("bad-crc.gz", gz, n, TD_ERR_CORRUPT, "corrupt");
    free(gz);
}

static void broken_idx_headers_and_lengths_are_errors(void **state) {
    size_t n;
    unsigned char *raw = gunzip_file(MNIST "t10k-labels-idx1-ubyte.gz", &n);
    unsigned char *big = malloc(n + 3);
    expect_error("short", raw, n - 1, TD_ERR_CORRUPT, "truncated: the header promises 10000");
    expect_error("tiny", raw, 3, TD_ERR_CORRUPT, "too short");
    expect_error("empty", raw, 0, TD_ERR_CORRUPT, "too short");
    expect_error("header-cut", raw, 6, TD_ERR_CORRUPT, "truncated header");
    memcpy(big, raw, n);
    memset(big + n, 0, 3);
    expect_error("long", big, n + 3, TD_ERR_CORRUPT, "3 unexpected bytes");
    raw[0] = 0x1f; /* not a gzip stream: 0x1f 0x08 */
    expect_error("magic", raw, n, TD_ERR_CORRUPT, "magic");
    raw[0] = 0;
    raw[2] = 0x0D;
    expect_error("floats", raw, n, TD_ERR_UNSUPPORTED, "float");
    raw[2] = 0x42;
    expect_error("type", raw, n, TD_ERR_CORRUPT, "element type 0x42");
    raw[2] = 0x08;
    raw[3] = 0;
    expect_error("ndim0", raw, n, TD_ERR_CORRUPT, "0 dimensions");
    raw[3] = 9;
    expect_error("ndim9", raw, n, TD_ERR_CORRUPT, "9 dimensions");
    raw[3] = 1;
    memset(raw + 4, 0, 4);
    expect_error("zero", raw, n, TD_ERR_CORRUPT, "extent 0");
    memset(raw + 4, 0xff, 4);
    expect_error("huge", raw, n, TD_ERR_CORRUPT, "would exceed");
    free(raw);
    free(big);
}

static void missing_files_and_mismatched_pairs_are_errors(void **state) {
    td_idx idx;
    td_dataset *ds = (td_dataset *)1, *train, *test;
    TD_ASSERT_STATUS(td_idx_read("/nonexistent/train.gz", &idx), TD_ERR_IO);
    td_test_assert_message_contains("/nonexistent/train.gz");
    TD_ASSERT_STATUS(td_dataset_open_idx(MNIST "t10k-images-idx3-ubyte.gz",
                                         MNIST "train-labels-idx1-ubyte.gz", &ds),
                     TD_ERR_CORRUPT);
    td_test_assert_message_contains("10000 images");
    td_test_assert_message_contains("60000 labels");
    assert_null(ds);
    TD_ASSERT_STATUS(td_dataset_open_idx(MNIST "t10k-labels-idx1-ubyte.gz",
                                         MNIST "t10k-labels-idx1-ubyte.gz", &ds),
                     TD_ERR_CORRUPT);
    td_test_assert_message_contains("at least 2 dimensions");
    TD_ASSERT_STATUS(td_mnist_open(td_test_tmpdir(), &train, &test), TD_ERR_IO);
    td_test_assert_message_contains("train-images-idx3-ubyte");
    assert_null(train);
    assert_null(test);
}

static void mnist_is_normalised_to_mean_0_and_deviation_1(void **state) {
    td_dataset *train, *test;
    td_dataset_info info;
    float x[784];
    int32_t label;
    double s = 0, s2 = 0, n = 0;
    TD_ASSERT_OK(td_mnist_open(TD_SOURCE_DIR "/data/mnist", &train, &test));
    td_dataset_get_info(train, &info);
    assert_int_equal(info.kind, TD_INPUT_FEATURES);
    assert_int_equal(info.size, 60000);
    assert_int_equal(info.ndim, 3);
    assert_int_equal(info.shape[0], 1);
    assert_int_equal(info.shape[1], 28);
    assert_int_equal(info.shape[2], 28);
    assert_int_equal(info.features, 784);
    assert_int_equal(info.num_classes, 10);
    assert_int_equal(info.labels_per_sample, 1);
    for (int64_t i = 0; i < info.size; i++) {
        TD_ASSERT_OK(td_dataset_get(train, i, x, NULL, &label));
        for (int j = 0; j < 784; j++) {
            s += x[j];
            s2 += (double)x[j] * x[j];
        }
        n += 784;
    }
    /* 0.1307 and 0.3081 are MNIST's pixel mean and deviation to 4 digits. */
    assert_true(fabs(s / n) < 2e-3);
    assert_true(fabs(sqrt(s2 / n - (s / n) * (s / n)) - 1.0) < 2e-3);
    TD_ASSERT_OK(td_dataset_get(test, 0, x, NULL, &label));
    assert_int_equal(label, 7);
    assert_float_equal(x[0], (0.0 - 0.1307) / 0.3081, 1e-6);
    TD_ASSERT_STATUS(td_dataset_get(test, 10000, x, NULL, &label), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("out of range");
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    td_dataset_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_the_shipped_mnist_files),
        cmocka_unit_test(plain_and_gzipped_files_read_the_same),
        cmocka_unit_test(broken_gzip_files_are_errors),
        cmocka_unit_test(broken_idx_headers_and_lengths_are_errors),
        cmocka_unit_test(missing_files_and_mismatched_pairs_are_errors),
        cmocka_unit_test(mnist_is_normalised_to_mean_0_and_deviation_1),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
