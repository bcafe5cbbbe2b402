/* Seeded shuffling and batching: same seed, same order, whatever the batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/support.h"

static char path[] = "/tmp/td_loader_XXXXXX";
#define NTEXT 1000 /* 900 train bytes -> 899 windows of T = 1 */

static int setup(void **state) {
    char text[NTEXT];
    int fd = mkstemp(path);
    for (int i = 0; i < NTEXT; i++)
        text[i] = (char)(i % 251);
    if (fd < 0 || write(fd, text, NTEXT) != NTEXT)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state) {
    return unlink(path);
}

/* A data set whose sample i has token i % 251 at its one position. */
static td_dataset *open_set(void) {
    td_text_options opt = {1, 0.1, TD_TEXT_BYTES};
    td_dataset *train, *val;
    TD_ASSERT_OK(td_text_open(path, &opt, &train, &val));
    td_dataset_destroy(val);
    return train;
}

/* The first `epochs` epochs' order of sample ids (via the token, which is the
 * start byte, which is the id mod 251; with 899 samples, a start s has token
 * s % 251, so collect starts by the loader's own order instead). */
static void read_epochs(const td_dataset *ds, int64_t batch, uint64_t seed, int epochs,
                        int32_t *tokens, int64_t *nbatches) {
    td_loader *l;
    td_batch b;
    int64_t k = 0, nb = 0;
    TD_ASSERT_OK(td_loader_create(ds, batch, seed, 1, &l));
    for (int e = 0; e < epochs; e++) {
        for (;;) {
            TD_ASSERT_OK(td_loader_next(l, &b));
            if (b.n == 0)
                break;
            assert_true(b.n <= batch);
            assert_null(b.x);
            memcpy(tokens + k, b.tokens, (size_t)b.n * sizeof *tokens);
            k += b.n;
            nb++;
        }
    }
    assert_int_equal(k, 899 * epochs);
    *nbatches = nb;
    td_loader_destroy(l);
}

static void same_seed_same_order_for_any_batch_size(void **state) {
    td_dataset *ds = open_set();
    static int32_t a[2 * 899], b[2 * 899], c[2 * 899];
    int64_t na, nb, nc;
    read_epochs(ds, 64, 42, 2, a, &na);
    read_epochs(ds, 7, 42, 2, b, &nb);
    read_epochs(ds, 64, 43, 2, c, &nc);
    assert_int_equal(na, 2 * 15); /* ceil(899 / 64) per epoch */
    assert_int_equal(nb, 2 * 129);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    /* Epochs differ from each other. */
    assert_memory_not_equal(a, a + 899, 899 * sizeof *a);
    td_dataset_destroy(ds);
}

static void each_epoch_is_a_permutation(void **state) {
    td_dataset *ds = open_set();
    td_loader *l;
    char seen[899];
    int64_t s;
    TD_ASSERT_OK(td_loader_create(ds, 10, 7, 1, &l));
    for (int64_t e = 0; e < 3; e++) {
        memset(seen, 0, sizeof seen);
        for (int64_t i = 0; i < 899; i++) {
            TD_ASSERT_OK(td_loader_order(l, e, i, &s));
            assert_true(s >= 0 && s < 899);
            assert_false(seen[s]);
            seen[s] = 1;
        }
    }
    TD_ASSERT_STATUS(td_loader_order(l, 0, 899, &s), TD_ERR_INVALID_ARG);
    td_loader_destroy(l);
    td_dataset_destroy(ds);
}

static void shuffles_are_uniform(void **state) {
    /* Where sample 0 lands over many seeds: each of 5 places about equally.
     * Chi-square with 4 degrees of freedom; 30 is far beyond p = 1e-5. */
    td_text_options opt = {1, 0.5, TD_TEXT_BYTES};
    char tp[] = "/tmp/td_loader5_XXXXXX";
    int fd = mkstemp(tp);
    td_dataset *train, *val;
    int64_t counts[5] = {0}, s;
    const int seeds = 20000;
    double chi2 = 0;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abcdefghijkl", 12), 12); /* 6 train bytes: 5 windows */
    close(fd);
    TD_ASSERT_OK(td_text_open(tp, &opt, &train, &val));
    for (int seed = 0; seed < seeds; seed++) {
        td_loader *l;
        TD_ASSERT_OK(td_loader_create(train, 5, (uint64_t)seed * 7919u, 1, &l));
        for (int i = 0; i < 5; i++) {
            TD_ASSERT_OK(td_loader_order(l, 0, i, &s));
            if (s == 0)
                counts[i]++;
        }
        td_loader_destroy(l);
    }
    for (int i = 0; i < 5; i++)
        chi2 += pow((double)counts[i] - seeds / 5.0, 2) / (seeds / 5.0);
    assert_true(chi2 < 30);
    td_dataset_destroy(train);
    td_dataset_destroy(val);
    unlink(tp);
}

static void seek_continues_exactly_where_position_was(void **state) {
    td_dataset *ds = open_set();
    td_loader *l1, *l2;
    td_batch b1, b2;
    int64_t epoch, index;
    TD_ASSERT_OK(td_loader_create(ds, 100, 5, 1, &l1));
    for (int i = 0; i < 13; i++) /* into the second epoch */
        TD_ASSERT_OK(td_loader_next(l1, &b1));
    td_loader_position(l1, &epoch, &index);
    assert_int_equal(epoch, 1);
    assert_int_equal(index, 300);
    TD_ASSERT_OK(td_loader_create(ds, 100, 5, 1, &l2));
    TD_ASSERT_OK(td_loader_seek(l2, epoch, index));
    for (int i = 0; i < 12; i++) {
        TD_ASSERT_OK(td_loader_next(l1, &b1));
        TD_ASSERT_OK(td_loader_next(l2, &b2));
        assert_int_equal(b1.n, b2.n);
        assert_memory_equal(b1.tokens, b2.tokens, (size_t)b1.n * sizeof *b1.tokens);
        assert_memory_equal(b1.labels, b2.labels, (size_t)b1.n * sizeof *b1.labels);
    }
    TD_ASSERT_STATUS(td_loader_seek(l2, 0, 900), TD_ERR_INVALID_ARG);
    td_loader_destroy(l2);
    TD_ASSERT_STATUS(td_loader_create(ds, 0, 5, 1, &l2), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("batch size 0");
    assert_null(l2);
    td_loader_destroy(l1);
    td_loader_destroy(NULL);
    td_dataset_destroy(ds);
}

static void unshuffled_loaders_keep_the_data_order(void **state) {
    td_dataset *train, *test;
    td_loader *l;
    td_batch b;
    int64_t seen = 0;
    static const int32_t first[10] = {7, 2, 1, 0, 4, 1, 4, 9, 5, 9};
    TD_ASSERT_OK(td_mnist_open(TD_SOURCE_DIR "/data/mnist", &train, &test));
    TD_ASSERT_OK(td_loader_create(test, 1000, 0, 0, &l));
    assert_int_equal(td_loader_batches_per_epoch(l), 10);
    TD_ASSERT_OK(td_loader_next(l, &b));
    assert_int_equal(b.n, 1000);
    assert_non_null(b.x);
    assert_null(b.tokens);
    assert_memory_equal(b.labels, first, sizeof first);
    for (seen = b.n; b.n; seen += b.n)
        TD_ASSERT_OK(td_loader_next(l, &b));
    assert_int_equal(seen, 10000);
    td_loader_destroy(l);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_seed_same_order_for_any_batch_size),
        cmocka_unit_test(each_epoch_is_a_permutation),
        cmocka_unit_test(shuffles_are_uniform),
        cmocka_unit_test(seek_continues_exactly_where_position_was),
        cmocka_unit_test(unshuffled_loaders_keep_the_data_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
