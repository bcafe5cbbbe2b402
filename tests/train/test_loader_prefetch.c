/* The loader's prefetch thread (loader.c) changes nothing the caller sees:
 * a prefetching loader hands out the batches a synchronous one does, bit for
 * bit, in the same order, across epoch ends and after seeks, and reports the
 * position of the batch it handed out, not of the one it made ahead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/support.h"
#include "train/train-impl.h"

static td_dataset *g_train, *g_test;

static int setup(void **state) {
    return td_mnist_open(TD_SOURCE_DIR "/data/mnist", &g_train, &g_test) == TD_OK ? 0 : -1;
}

static int teardown(void **state) {
    td_dataset_destroy(g_train);
    td_dataset_destroy(g_test);
    return 0;
}

static td_loader *make(const td_dataset *ds, int64_t batch, uint64_t seed, int shuffle,
                       int prefetch) {
    td_loader *l = NULL;
    TD_ASSERT_OK(td_loader_create(ds, batch, seed, shuffle, &l));
    td__loader_set_prefetch(l, prefetch);
    return l;
}

/* One call on each loader: the same batch, bit for bit, and the same
 * position after it. Returns n. */
static int64_t next_both(td_loader *sync, td_loader *pre, const td_dataset_info *info,
                         int64_t call) {
    td_batch a, b;
    int64_t ea, ia, eb, ib;
    size_t f = (size_t)info->features;
    TD_ASSERT_OK(td_loader_next(sync, &a));
    TD_ASSERT_OK(td_loader_next(pre, &b));
    if (a.n != b.n)
        fail_msg("call %lld: %lld samples synchronously, %lld prefetched", (long long)call,
                 (long long)a.n, (long long)b.n);
    if (a.n) {
        assert_int_equal(a.x == NULL, b.x == NULL);
        if (a.x && memcmp(a.x, b.x, (size_t)a.n * f * sizeof *a.x) != 0)
            fail_msg("call %lld: the inputs differ", (long long)call);
        if (a.tokens && memcmp(a.tokens, b.tokens, (size_t)a.n * f * sizeof *a.tokens) != 0)
            fail_msg("call %lld: the tokens differ", (long long)call);
        if (memcmp(a.labels, b.labels,
                   (size_t)(a.n * info->labels_per_sample) * sizeof *a.labels) != 0)
            fail_msg("call %lld: the labels differ", (long long)call);
    }
    td_loader_position(sync, &ea, &ia);
    td_loader_position(pre, &eb, &ib);
    if (ea != eb || ia != ib)
        fail_msg("call %lld: position (%lld, %lld) synchronously, (%lld, %lld) prefetched",
                 (long long)call, (long long)ea, (long long)ia, (long long)eb, (long long)ib);
    return a.n;
}

static void prefetched_batches_equal_synchronous_ones(void **state) {
    /* 10,000 samples in batches of 384: 26 full ones and one of 16. */
    const int64_t batch = 384;
    td_dataset_info info;
    td_loader *sync = make(g_test, batch, 11, 1, 0), *pre = make(g_test, batch, 11, 1, 1);
    int64_t call = 0, ends = 0, samples = 0, bpe = td_loader_batches_per_epoch(pre);
    td_dataset_get_info(g_test, &info);
    assert_int_equal(bpe, 27);
    /* Two and a half epochs: two epoch ends, each a short batch then n = 0. */
    while (call < 2 * (bpe + 1) + bpe / 2) {
        int64_t n = next_both(sync, pre, &info, call++);
        ends += n == 0;
        samples += n;
    }
    assert_int_equal(ends, 2);
    assert_int_equal(samples, 2 * 10000 + (bpe / 2) * batch);

    /* A seek while a batch is being made ahead: back into the first epoch,
     * mid-way, then on across its end. */
    TD_ASSERT_OK(td_loader_seek(sync, 0, 5 * batch + 7));
    TD_ASSERT_OK(td_loader_seek(pre, 0, 5 * batch + 7));
    for (int i = 0; i < bpe + 3; i++)
        next_both(sync, pre, &info, call++);
    /* To an epoch's very end: the next call ends that epoch. */
    TD_ASSERT_OK(td_loader_seek(sync, 4, 10000));
    TD_ASSERT_OK(td_loader_seek(pre, 4, 10000));
    assert_int_equal(next_both(sync, pre, &info, call++), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(next_both(sync, pre, &info, call++), batch);
    /* Seeks right after each other, and to where the loader already is. */
    TD_ASSERT_OK(td_loader_seek(pre, 9, 0));
    TD_ASSERT_OK(td_loader_seek(pre, 2, 384));
    TD_ASSERT_OK(td_loader_seek(sync, 2, 384));
    for (int i = 0; i < 3; i++)
        next_both(sync, pre, &info, call++);
    TD_ASSERT_OK(td_loader_seek(sync, 2, 4 * 384));
    TD_ASSERT_OK(td_loader_seek(pre, 2, 4 * 384));
    for (int i = 0; i < bpe; i++)
        next_both(sync, pre, &info, call++);
    td_loader_destroy(sync);
    td_loader_destroy(pre);
}

static void a_fresh_loader_sought_to_a_position_continues_the_prefetched_run(void **state) {
    /* The resume path: a prefetching run's position, given to a new
     * prefetching loader, gives the batches the first goes on with. */
    td_dataset_info info;
    td_loader *a = make(g_train, 1000, 3, 1, 1), *b;
    int64_t epoch, index, call = 0;
    td_dataset_get_info(g_train, &info);
    for (int i = 0; i < 64; i++) { /* 60 batches and an end: into the second epoch */
        td_batch skip;
        TD_ASSERT_OK(td_loader_next(a, &skip));
    }
    td_loader_position(a, &epoch, &index);
    assert_int_equal(epoch, 1);
    assert_int_equal(index, 3000);
    b = make(g_train, 1000, 3, 1, 1);
    TD_ASSERT_OK(td_loader_seek(b, epoch, index));
    for (int i = 0; i < 10; i++)
        next_both(a, b, &info, call++);
    td_loader_destroy(a);
    td_loader_destroy(b);
}

static void a_batch_stays_intact_while_the_next_is_made(void **state) {
    td_loader *l = make(g_test, 500, 5, 1, 1);
    td_batch b;
    float *copy = malloc(500 * 784 * sizeof *copy);
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 6; i++) {
        TD_ASSERT_OK(td_loader_next(l, &b));
        assert_int_equal(b.n, 500);
        memcpy(copy, b.x, 500 * 784 * sizeof *copy);
        /* Long enough for the thread to have made the next batch. */
        nanosleep(&ts, NULL);
        assert_memory_equal(copy, b.x, 500 * 784 * sizeof *copy);
    }
    free(copy);
    td_loader_destroy(l);
}

static void order_answers_while_prefetching(void **state) {
    /* td_loader_order reads the shuffle the thread may be making. */
    td_loader *l = make(g_test, 2000, 9, 1, 1), *ref = make(g_test, 2000, 9, 1, 0);
    td_batch b;
    int64_t s, r;
    for (int i = 0; i < 14; i++) { /* past the first epoch's end */
        TD_ASSERT_OK(td_loader_next(l, &b));
        for (int64_t k = 0; k < 10000; k += 997)
            for (int64_t e = 0; e < 3; e++) {
                TD_ASSERT_OK(td_loader_order(l, e, k, &s));
                TD_ASSERT_OK(td_loader_order(ref, e, k, &r));
                assert_int_equal(s, r);
            }
    }
    td_loader_destroy(l);
    td_loader_destroy(ref);
}

/* The threads of this process, from /proc. */
static int threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* Loaders made with TANDEM_PREFETCH=value and the batch size given: whether
 * the third batch started a thread. */
static int starts_a_thread(const char *value, int64_t batch) {
    td_loader *l;
    td_batch b;
    int before = threads(), during;
    if (value)
        setenv("TANDEM_PREFETCH", value, 1);
    else
        unsetenv("TANDEM_PREFETCH");
    TD_ASSERT_OK(td_loader_create(g_test, batch, 1, 1, &l));
    unsetenv("TANDEM_PREFETCH");
    for (int i = 0; i < 3; i++)
        TD_ASSERT_OK(td_loader_next(l, &b));
    during = threads();
    td_loader_destroy(l);
    assert_int_equal(threads(), before);
    return during - before;
}

static void the_environment_and_the_batch_size_choose(void **state) {
    /* By default a batch of 2 images (1,568 values) stays synchronous, a
     * batch of 64 prefetches; 0 and 1 override the size. */
    assert_int_equal(starts_a_thread(NULL, 2), 0);
    assert_int_equal(starts_a_thread(NULL, 64), 1);
    assert_int_equal(starts_a_thread("0", 64), 0);
    assert_int_equal(starts_a_thread("1", 2), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prefetched_batches_equal_synchronous_ones),
        cmocka_unit_test(a_fresh_loader_sought_to_a_position_continues_the_prefetched_run),
        cmocka_unit_test(a_batch_stays_intact_while_the_next_is_made),
        cmocka_unit_test(order_answers_while_prefetching),
        cmocka_unit_test(the_environment_and_the_batch_size_choose),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
