/* Every collective against a serial f64 reference: 1 to 4 local devices,
 * both dtypes, every op, sizes from 0 to past a million elements (primes,
 * counts that do not divide by the members), in place and out of place,
 * with the direct exchange, the ring and the shared job queue with tiny
 * chunks (many pipeline steps and FIFO wrap-arounds), and the automatic
 * choice. */
#include <sched.h>
#include <stdatomic.h>

#include "comm/common.h"

typedef struct sweep {
    int algo_mask; /* bit a: run with td_comm_algorithm a */
    const size_t *counts;
    size_t ncounts;
    atomic_int failures;
    atomic_int claimed; /* the member that writes `first` */
    char first[1024];
} sweep;

static const size_t small_counts[] = {0, 1, 2, 3, 5, 7, 13, 64, 97, 257, 1000, 4099};
static const size_t ring_counts[] = {1, 2, 7, 13, 97, 1000, 3, 257};

static td_status sweep_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    sweep *s = arg;
    for (size_t ci = 0; ci < s->ncounts; ci++) {
        for (int kind = 0; kind < 5; kind++) {
            /* dtype and placement rotate with the count, so that every
             * collective and op meets all four combinations over the sizes. */
            const int dt = (int)(ci % 2);
            const int in_place = (int)((ci / 2 + (size_t)kind) % 2);
            const int nops = kind == TD_COLL_BROADCAST || kind == TD_COLL_ALLGATHER ? 1 : 4;
            for (int op = 0; op < nops; op++) {
                td_collective c = {(td_collective_kind)kind,
                                   NULL,
                                   0,
                                   NULL,
                                   0,
                                   s->counts[ci],
                                   (td_dtype)dt,
                                   (td_reduce_op)op,
                                   (int)((ci + (size_t)op) % (size_t)n)};
                char err[512];
                td_status st = comm_check(g, dev, rank, n, c, in_place, err, sizeof err);
                if (st == TD_ERR_CORRUPT) {
                    if (atomic_exchange(&s->claimed, 1) == 0)
                        snprintf(s->first, sizeof s->first, "%s", err);
                    atomic_fetch_add(&s->failures, 1);
                } else if (st != TD_OK) {
                    return st;
                }
            }
        }
    }
    return TD_OK;
}

static void run_sweep(const char *spec, td_comm_algorithm algo, size_t chunk, const size_t *counts,
                      size_t ncounts) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    sweep s;
    memset(&s, 0, sizeof s);
    s.counts = counts;
    s.ncounts = ncounts;
    cfg.algorithm = algo;
    cfg.chunk_bytes = chunk;
    cfg.timeout_ms = 120000;
    cfg.fault = "";
    TD_ASSERT_OK(td_group_create_spec(spec, &cfg, &g));
    TD_ASSERT_OK(td_group_run(g, sweep_fn, &s));
    if (atomic_load(&s.failures))
        fail_msg("%s, algorithm %d, chunk %zu: %d wrong results; first: %s", spec, (int)algo, chunk,
                 atomic_load(&s.failures), s.first);
    td_group_destroy(g);
}

static const char *const specs[] = {"cpu*1", "cpu*2", "cpu*3", "cpu*4"};

static void direct_exchange_matches_reference(void **state) {
    for (int i = 0; i < 4; i++)
        run_sweep(specs[i], TD_ALGO_DIRECT, 0, small_counts,
                  sizeof small_counts / sizeof *small_counts);
}

static void ring_with_tiny_chunks_matches_reference(void **state) {
    /* 24-byte chunks: every size runs many pipeline steps and wraps the FIFO. */
    for (int i = 0; i < 4; i++)
        run_sweep(specs[i], TD_ALGO_RING, 24, ring_counts,
                  sizeof ring_counts / sizeof *ring_counts);
}

static void shared_queue_with_tiny_chunks_matches_reference(void **state) {
    /* All-reduce through the shared job queue (the others take the ring). */
    for (int i = 0; i < 4; i++)
        run_sweep(specs[i], TD_ALGO_SHARED, 24, ring_counts,
                  sizeof ring_counts / sizeof *ring_counts);
}

static void automatic_choice_matches_reference_at_large_sizes(void **state) {
    /* Past the switch point, several default-size chunks per segment. */
    static const size_t big[] = {65537, 67039, 262144 + 3};
    for (int i = 1; i < 3; i++)
        run_sweep(specs[i], TD_ALGO_AUTO, 0, big, sizeof big / sizeof *big);
}

typedef struct tensor_args {
    int bad;
} tensor_args;

static td_status tensor_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    tensor_args *a = arg;
    int64_t shape[2] = {3, 5};
    td_tensor *t = NULL;
    double host[15];
    td_status st;
    if ((st = td_tensor_create(dev, TD_F64, 2, shape, &t)) != TD_OK)
        return st;
    for (int i = 0; i < 15; i++)
        host[i] = rank + i;
    if ((st = td_tensor_write_f64(t, host, 15)) != TD_OK)
        goto done;
    if ((st = td_allreduce_tensor(g, t, TD_REDUCE_MEAN)) != TD_OK)
        goto done;
    if ((st = td_tensor_read_f64(t, host, 15)) != TD_OK)
        goto done;
    for (int i = 0; i < 15; i++)
        if (host[i] != (n - 1) / 2.0 + i)
            a->bad = 1;
    for (int i = 0; i < 15; i++)
        host[i] = rank * 100 + i;
    if ((st = td_tensor_write_f64(t, host, 15)) != TD_OK)
        goto done;
    if ((st = td_broadcast_tensor(g, t, n - 1)) != TD_OK)
        goto done;
    if ((st = td_tensor_read_f64(t, host, 15)) != TD_OK)
        goto done;
    for (int i = 0; i < 15; i++)
        if (host[i] != (n - 1) * 100 + i)
            a->bad = 1;
done:
    td_tensor_destroy(t);
    return st;
}

static void tensors_reduce_and_broadcast_in_place(void **state) {
    td_group *g = NULL;
    tensor_args a = {0};
    TD_ASSERT_OK(td_group_create_spec("cpu*3", NULL, &g));
    assert_int_equal(td_group_size(g), 3);
    assert_string_equal(td_group_transport(g), "local");
    TD_ASSERT_OK(td_group_run(g, tensor_fn, &a));
    assert_int_equal(a.bad, 0);
    td_group_destroy(g);
}

/* Joining a group of some of the members from inside the whole group's
 * run: the even ranks and the odd ranks of cpu*4 each sum their ranks
 * along their own axis, and the whole group sums those after. */
typedef struct join_args {
    td_group *axis[2]; /* ranks 0 and 2; ranks 1 and 3 */
    double got[4], total[4];
} join_args;

static td_status sum_rank(td_group *g, td_device *dev, int rank, int n, void *arg) {
    double *v = arg;
    td_buffer *b = NULL;
    td_status st;
    (void)rank;
    (void)n;
    if ((st = td_buffer_alloc(dev, sizeof *v, &b)) != TD_OK)
        return st;
    st = td_buffer_write(b, 0, v, sizeof *v);
    if (st == TD_OK)
        st = td_allreduce(g, b, 0, b, 0, 1, TD_F64, TD_REDUCE_SUM);
    if (st == TD_OK)
        st = td_buffer_read(b, 0, v, sizeof *v);
    td_buffer_free(b);
    return st;
}

static td_status join_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    join_args *a = arg;
    a->got[rank] = rank;
    td_status st = td_group_join(a->axis[rank % 2], sum_rank, &a->got[rank]);
    if (st != TD_OK)
        return st;
    a->total[rank] = a->got[rank];
    return sum_rank(g, dev, rank, n, &a->total[rank]); /* the whole group's again, after */
}

static void a_member_joins_a_group_along_another_axis(void **state) {
    td_group *g = NULL;
    join_args a = {{NULL, NULL}, {0}, {0}};
    int odd[] = {1, 3}, even[] = {0, 2};
    TD_ASSERT_OK(td_group_create_spec("cpu*4", NULL, &g));
    TD_ASSERT_OK(td_group_shrink(g, odd, 2, &a.axis[0]));
    TD_ASSERT_OK(td_group_shrink(g, even, 2, &a.axis[1]));
    TD_ASSERT_OK(td_group_run(g, join_fn, &a));
    for (int r = 0; r < 4; r++) {
        assert_true(a.got[r] == (r % 2 ? 1 + 3 : 0 + 2));
        assert_true(a.total[r] == 2 * 2 + 2 * 4);
    }
    /* off a member's host thread it is refused */
    TD_ASSERT_STATUS(td_group_join(a.axis[0], sum_rank, &a.got[0]), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("off the host thread of a member of the group");
    /* aborted from outside, a group's collectives fail at once, saying why */
    td_group_abort(a.axis[1], "the other axis failed");
    TD_ASSERT_STATUS(td_group_error(a.axis[1]), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("the other axis failed");
    TD_ASSERT_STATUS(td_group_run(g, join_fn, &a), TD_ERR_DEVICE_LOST);
    assert_int_equal(td_group_error(a.axis[0]), TD_OK); /* the other axis works on */
    td_group_destroy(a.axis[0]);
    td_group_destroy(a.axis[1]);
    td_group_destroy(g);
}

static td_status misuse_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    td_buffer *b = NULL;
    td_status st = td_buffer_alloc(dev, 16, &b);
    if (st != TD_OK)
        return st;
    /* 8 floats do not fit in 16 bytes. */
    st = td_allreduce(g, b, 0, b, 0, rank == 0 ? 8 : 4, TD_F32, TD_REDUCE_SUM);
    td_buffer_free(b);
    return st;
}

static void misuse_fails_the_group_instead_of_hanging(void **state) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    td_buffer *b = NULL;
    cfg.fault = "";
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    /* Outside td_group_run. */
    TD_ASSERT_OK(td_buffer_alloc(td_group_device(g, 0), 16, &b));
    TD_ASSERT_STATUS(td_allreduce(g, b, 0, b, 0, 4, TD_F32, TD_REDUCE_SUM), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("inside td_group_run");
    td_buffer_free(b);
    TD_ASSERT_STATUS(td_group_run(g, misuse_fn, NULL), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("member 0 (cpu:0)");
    td_test_assert_message_contains("does not hold 8 f32");
    TD_ASSERT_STATUS(td_group_error(g), TD_ERR_DEVICE_LOST);
    td_group_destroy(g);
}

static void the_switch_point_is_tunable_and_measured(void **state) {
    td_group *g = NULL;
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    size_t sw = 0;
    cfg.fault = "";
    setenv("TANDEM_ALLREDUCE_SWITCH_BYTES", "3K", 1);
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    unsetenv("TANDEM_ALLREDUCE_SWITCH_BYTES");
    assert_int_equal(td_group_switch_bytes(g), 3072);
    TD_ASSERT_OK(td_group_calibrate(g, &sw));
    /* Whatever the machine measured: a size it tried, and now in use. */
    assert_int_equal(td_group_switch_bytes(g), sw);
    assert_true(sw >= 64 && sw <= (2u << 20));
    assert_int_equal(sw & (sw - 1), 0);
    td_group_destroy(g);
}

/* Whether members share cores, against what their specs bind: cpu:0 and
 * cpu:1 own a core each; cpu:0{cores=2} owns cpu:1's core too; cpu*3 splits
 * the CPUs three ways, so on fewer than three its first two devices share
 * the first, and so do they after the third leaves (td_group_shrink). */
static void members_that_share_a_core_are_told_apart(void **state) {
    static const struct {
        const char *spec;
        int shares;
    } cases[] = {{"cpu:0,cpu:1", 0}, {"cpu:0{cores=2},cpu:1", 1}, {"cpu:0", 0}};
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    td_group *g = NULL, *two = NULL;
    int exclude = 2;
    (void)state;
    if (cpus < 2) {
        print_message("skipped: one CPU, so no two CPU devices can own a core each\n");
        skip();
    }
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        TD_ASSERT_OK(td_group_create_spec(cases[k].spec, NULL, &g));
        if (td_group_shares_cores(g) != cases[k].shares)
            fail_msg("%s: shares cores %d, expected %d", cases[k].spec, td_group_shares_cores(g),
                     cases[k].shares);
        td_group_destroy(g);
    }
    TD_ASSERT_OK(td_group_create_spec("cpu*3", NULL, &g));
    assert_int_equal(td_group_shares_cores(g), cpus < 3);
    TD_ASSERT_OK(td_group_shrink(g, &exclude, 1, &two));
    assert_int_equal(td_group_local_size(two), 2);
    assert_int_equal(td_group_shares_cores(two), cpus < 3);
    td_group_destroy(two);
    td_group_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(direct_exchange_matches_reference),
        cmocka_unit_test(ring_with_tiny_chunks_matches_reference),
        cmocka_unit_test(shared_queue_with_tiny_chunks_matches_reference),
        cmocka_unit_test(automatic_choice_matches_reference_at_large_sizes),
        cmocka_unit_test(tensors_reduce_and_broadcast_in_place),
        cmocka_unit_test(a_member_joins_a_group_along_another_axis),
        cmocka_unit_test(misuse_fails_the_group_instead_of_hanging),
        cmocka_unit_test(the_switch_point_is_tunable_and_measured),
        cmocka_unit_test(members_that_share_a_core_are_told_apart),
    };
    if (getenv("TD_TEST_FILTER"))
        cmocka_set_test_filter(getenv("TD_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
