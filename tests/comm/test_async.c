/* Asynchronous collectives: several in flight per member, overlapped with
 * other work, mixed with synchronous ones (which must run after them), and
 * left unwaited at the end of the member function. */
#include <stdatomic.h>

#include "comm/common.h"

#define BUCKETS 6

typedef struct async_args {
    atomic_int bad;
    char first[512];
    atomic_int claimed;
} async_args;

static void note(async_args *a, const char *what, int rank, size_t i, double got, double want) {
    if (atomic_exchange(&a->claimed, 1) == 0)
        snprintf(a->first, sizeof a->first, "%s on rank %d: element %zu is %g, expected %g", what,
                 rank, i, got, want);
    atomic_fetch_add(&a->bad, 1);
}

static td_status async_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    async_args *a = arg;
    /* Bucket sizes straddle the switch point: some direct, some ring. */
    static const size_t sizes[BUCKETS] = {1, 100, 5000, 70000, 300001, 17};
    td_buffer *b[BUCKETS] = {0};
    td_comm_request *req[BUCKETS] = {0};
    td_buffer *sync_buf = NULL;
    uint64_t started[BUCKETS], prev_end = 0;
    double *host = NULL;
    td_status st = TD_OK;
    volatile double busy = 0;
    host = malloc(sizeof *host * 300001);
    if (!host)
        return TD_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < BUCKETS && st == TD_OK; k++) {
        st = td_buffer_alloc(dev, sizes[k] * 8, &b[k]);
        for (size_t i = 0; i < sizes[k] && st == TD_OK; i++)
            host[i] = comm_input(rank, i + (size_t)k);
        if (st == TD_OK)
            st = td_buffer_write(b[k], 0, host, sizes[k] * 8);
    }
    if (st == TD_OK)
        st = td_buffer_alloc(dev, 8, &sync_buf);
    if (st != TD_OK)
        goto done;
    /* Started one after another, as a backward pass would finish buckets. */
    for (int k = 0; k < BUCKETS && st == TD_OK; k++) {
        started[k] = td_clock_ns();
        st = td_allreduce_async(g, b[k], 0, sizes[k], TD_F64, TD_REDUCE_SUM, &req[k]);
        for (int i = 0; i < 20000; i++)
            busy += i * 0.5;
    }
    if (st != TD_OK)
        goto done;
    {
        td_status t = td_comm_test(req[BUCKETS - 1]);
        if (t != TD_OK && t != TD_IN_PROGRESS)
            note(a, "td_comm_test", rank, 0, (double)t, 0);
    }
    /* A synchronous collective now runs after every started one. */
    host[0] = rank + 1;
    if ((st = td_buffer_write(sync_buf, 0, host, 8)) != TD_OK ||
        (st = td_allreduce(g, sync_buf, 0, sync_buf, 0, 1, TD_F64, TD_REDUCE_MAX)) != TD_OK ||
        (st = td_buffer_read(sync_buf, 0, host, 8)) != TD_OK)
        goto done;
    if (host[0] != n)
        note(a, "sync max", rank, 0, host[0], n);
    for (int k = 0; k < BUCKETS; k++) {
        uint64_t began, ended;
        if ((st = td_comm_wait(req[k])) != TD_OK ||
            (st = td_comm_request_times(req[k], &began, &ended)) != TD_OK)
            goto done;
        /* Each ran after it was started and after the one before it (one
         * engine per member, in order), and ended before it was waited for. */
        if (!(began >= started[k] && began >= prev_end && ended >= began && ended <= td_clock_ns()))
            note(a, "request times", rank, (size_t)k, (double)began, (double)ended);
        prev_end = ended;
        if ((st = td_buffer_read(b[k], 0, host, sizes[k] * 8)) != TD_OK)
            goto done;
        for (size_t i = 0; i < sizes[k]; i++) {
            double want = 0;
            for (int r = 0; r < n; r++)
                want += comm_input(r, i + (size_t)k);
            if (host[i] != want) {
                note(a, "async sum", rank, i, host[i], want);
                break;
            }
        }
    }
    /* One more, left for the end of the run to finish. */
    td_comm_request_destroy(req[0]);
    req[0] = NULL;
    st = td_allreduce_async(g, b[0], 0, sizes[0], TD_F64, TD_REDUCE_SUM, &req[0]);
done:
    for (int k = 0; k < BUCKETS; k++) {
        td_comm_request_destroy(req[k]);
        td_buffer_free(b[k]);
    }
    td_buffer_free(sync_buf);
    free(host);
    return st;
}

static void async_collectives_overlap_and_keep_order(void **state) {
    static const char *const specs[] = {"cpu*1", "cpu*2", "cpu*3"};
    uint64_t began, ended;
    TD_ASSERT_STATUS(td_comm_request_times(NULL, &began, &ended), TD_ERR_INVALID_ARG);
    for (int i = 0; i < 3; i++) {
        td_group *g = NULL;
        async_args a;
        td_group_config cfg = TD_GROUP_CONFIG_INIT;
        cfg.fault = "";
        cfg.timeout_ms = 120000;
        memset(&a, 0, sizeof a);
        TD_ASSERT_OK(td_group_create_spec(specs[i], &cfg, &g));
        TD_ASSERT_OK(td_group_run(g, async_fn, &a));
        if (atomic_load(&a.bad))
            fail_msg("%s: %d wrong results; first: %s", specs[i], atomic_load(&a.bad), a.first);
        /* The group is still in order afterwards. */
        TD_ASSERT_OK(td_group_run(g, async_fn, &a));
        assert_int_equal(atomic_load(&a.bad), 0);
        td_group_destroy(g);
    }
}

static td_status async_fault_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    td_buffer *b = NULL;
    td_comm_request *r1 = NULL, *r2 = NULL;
    td_status st, s1, s2;
    int *seen = arg;
    if ((st = td_buffer_alloc(dev, 64, &b)) != TD_OK)
        return st;
    if ((st = td_allreduce_async(g, b, 0, 4, TD_F32, TD_REDUCE_SUM, &r1)) == TD_OK)
        st = td_allreduce_async(g, b, 0, 4, TD_F32, TD_REDUCE_SUM, &r2);
    s1 = r1 ? td_comm_wait(r1) : st;
    s2 = r2 ? td_comm_wait(r2) : st;
    seen[rank * 2] = s1;
    seen[rank * 2 + 1] = s2;
    td_comm_request_destroy(r1);
    td_comm_request_destroy(r2);
    td_buffer_free(b);
    return s2;
}

static void a_fault_reaches_asynchronous_collectives(void **state) {
    td_group *g = NULL;
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    int seen[4] = {0};
    cfg.fault = "cpu:1@allreduce:2:error";
    cfg.timeout_ms = 60000;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    TD_ASSERT_STATUS(td_group_run(g, async_fault_fn, seen), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("cpu:1");
    assert_int_equal(seen[0], TD_OK);
    assert_int_equal(seen[1], TD_ERR_DEVICE_LOST);
    assert_int_equal(seen[2], TD_OK);
    assert_int_equal(seen[3], TD_ERR_DEVICE_LOST);
    td_group_destroy(g);
}

/* cpu:1's engine stuck for good in its second all-reduce: cpu:0 times out
 * on it, cpu:1's host thread gives up waiting for its engine (after the
 * timeout and a second) instead of waiting for ever, and destroying the
 * group leaves the stuck engine thread running rather than join it. */
static void a_stuck_engine_is_given_up(void **state) {
    td_group *g = NULL;
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    int seen[4] = {0};
    uint64_t t0 = td_clock_ns();
    (void)state;
    cfg.fault = "cpu:1@allreduce:2:stuck";
    cfg.timeout_ms = 300;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    TD_ASSERT_STATUS(td_group_run(g, async_fault_fn, seen), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("cpu:1");
    assert_int_equal(seen[0], TD_OK);
    assert_int_equal(seen[1], TD_ERR_DEVICE_LOST);
    assert_int_equal(seen[2], TD_OK);
    assert_int_equal(seen[3], TD_ERR_DEVICE_LOST);
    td_group_destroy(g);
    assert_true(td_clock_ns() - t0 < 20ull * 1000000000ull);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(async_collectives_overlap_and_keep_order),
        cmocka_unit_test(a_fault_reaches_asynchronous_collectives),
        cmocka_unit_test(a_stuck_engine_is_given_up),
    };
    td_log_set_level(TD_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
