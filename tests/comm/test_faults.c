/* Failure: injected faults in every collective, loud (error) and silent
 * (hang, found by the timeout), a member whose own code fails, the record
 * naming the member that never arrived, and shrinking to the survivors. */
#include <stdatomic.h>
#include <unistd.h>

#include "comm/common.h"
#include "core/error.h"

typedef struct fault_args {
    td_collective_kind kind;
    int calls;               /* collectives each member makes */
    int fail_rank;           /* -1: none; else this rank's fn fails on its own */
    td_status status[8];     /* what each rank's last collective returned */
    atomic_int completed[8]; /* collectives that succeeded, per rank */
} fault_args;

static td_status fault_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    fault_args *a = arg;
    td_status st = TD_OK;
    for (int i = 0; i < a->calls; i++) {
        td_collective c = {a->kind, NULL, 0, NULL, 0, 37, TD_F32, TD_REDUCE_SUM, 0};
        char err[512];
        if (a->fail_rank == rank && i == 2)
            return td__error(TD_ERR_IO, "the member's own work failed");
        st = comm_check(g, dev, rank, n, c, i & 1, err, sizeof err);
        a->status[rank] = st;
        if (st != TD_OK)
            return st;
        atomic_fetch_add(&a->completed[rank], 1);
    }
    return st;
}

static td_group *make_group(const char *spec, const char *fault, int timeout_ms) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    cfg.fault = fault;
    cfg.timeout_ms = timeout_ms;
    TD_ASSERT_OK(td_group_create_spec(spec, &cfg, &g));
    return g;
}

/* After the failure: the survivors form a group that works again. */
static void shrink_and_reuse(td_group *g, int want_size) {
    td_group *s = NULL;
    fault_args ok;
    TD_ASSERT_OK(td_group_shrink(g, NULL, 0, &s));
    assert_int_equal(td_group_size(s), want_size);
    for (int r = 0; r < want_size; r++)
        assert_string_not_equal(td_device_name(td_group_device(s, r)), "cpu:1");
    TD_ASSERT_OK(td_group_error(s));
    for (int kind = 0; kind < 5; kind++) {
        memset(&ok, 0, sizeof ok);
        ok.kind = (td_collective_kind)kind;
        ok.calls = 3;
        ok.fail_rank = -1;
        TD_ASSERT_OK(td_group_run(s, fault_fn, &ok));
        for (int r = 0; r < want_size; r++)
            assert_int_equal(atomic_load(&ok.completed[r]), 3);
    }
    td_group_destroy(s);
}

static void loud_fault_in_each_collective_fails_every_member(void **state) {
    for (int kind = 0; kind < 5; kind++) {
        char fault[64];
        td_group *g;
        fault_args a;
        snprintf(fault, sizeof fault, "cpu:1@%s:3:error",
                 td_collective_name((td_collective_kind)kind));
        /* A long timeout: the loud fault must end the run long before it. */
        g = make_group("cpu*3", fault, 60000);
        memset(&a, 0, sizeof a);
        a.kind = (td_collective_kind)kind;
        a.calls = 5;
        a.fail_rank = -1;
        TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_DEVICE_LOST);
        td_test_assert_message_contains("member 1 (cpu:1)");
        td_test_assert_message_contains("injected by TANDEM_FAULT=cpu:1@");
        for (int r = 0; r < 3; r++) {
            assert_int_equal(a.status[r], TD_ERR_DEVICE_LOST);
            assert_int_equal(atomic_load(&a.completed[r]), 2);
        }
        TD_ASSERT_STATUS(td_group_error(g), TD_ERR_DEVICE_LOST);
        td_test_assert_message_contains("cpu:1 (rank 1) failed at its");
        shrink_and_reuse(g, 2);
        td_group_destroy(g);
    }
}

static void silent_fault_in_each_collective_times_out_and_names_the_member(void **state) {
    for (int kind = 0; kind < 5; kind++) {
        char fault[64], rec[4096];
        td_group *g;
        fault_args a;
        snprintf(fault, sizeof fault, "cpu:1@%s:2", td_collective_name((td_collective_kind)kind));
        g = make_group("cpu*2", fault, 300);
        memset(&a, 0, sizeof a);
        a.kind = (td_collective_kind)kind;
        a.calls = 4;
        a.fail_rank = -1;
        TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_DEVICE_LOST);
        td_test_assert_message_contains("member 1 (cpu:1)");
        td_test_assert_message_contains("never arrived");
        assert_int_equal(a.status[0], TD_ERR_DEVICE_LOST);
        assert_int_equal(atomic_load(&a.completed[0]), 1);
        assert_int_equal(atomic_load(&a.completed[1]), 1);
        td_group_record(g, rec, sizeof rec);
        if (!strstr(rec, "#2 ") || !strstr(rec, "cpu:1 NEVER ARRIVED") ||
            !strstr(rec, td_collective_name((td_collective_kind)kind)))
            fail_msg("the record does not show cpu:1 missing at #2:\n%s", rec);
        shrink_and_reuse(g, 1);
        td_group_destroy(g);
    }
}

static void a_member_whose_own_code_fails_releases_its_peers(void **state) {
    td_group *g = make_group("cpu*3", "", 60000);
    fault_args a;
    uint64_t t0 = td_clock_ns();
    memset(&a, 0, sizeof a);
    a.kind = TD_COLL_ALLREDUCE;
    a.calls = 4;
    a.fail_rank = 2;
    TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_IO);
    td_test_assert_message_contains("member 2 (cpu:2)");
    td_test_assert_message_contains("the member's own work failed");
    assert_int_equal(a.status[0], TD_ERR_DEVICE_LOST);
    assert_int_equal(a.status[1], TD_ERR_DEVICE_LOST);
    /* Released by the failure, not by the 60 s timeout. */
    assert_true(td_clock_ns() - t0 < 30ull * 1000000000ull);
    {
        int drop[1] = {2};
        td_group *s = NULL;
        TD_ASSERT_OK(td_group_shrink(g, drop, 1, &s));
        assert_int_equal(td_group_size(s), 2);
        td_group_destroy(s);
    }
    td_group_destroy(g);
}

static void the_fault_grammar_is_checked(void **state) {
    static const char *const bad[] = {"cpu:1",         "cpu:1@allreduce",       "cpu:1@sum:3",
                                      "cpu:1@any:0",   "cpu:1@any:2:sometimes", "@allreduce:1",
                                      "px/cpu:0@any:1"};
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cfg.fault = bad[i];
        TD_ASSERT_STATUS(td_group_create_spec("cpu*2", &cfg, &g), TD_ERR_PARSE);
        assert_null(g);
        td_test_assert_message_contains("TANDEM_FAULT");
    }
    cfg.fault = "p0/cpu:0@any:7,cpu:1@reducescatter:2:hang,cpu:0@broadcast:1:error";
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    td_group_destroy(g);
}

/* Items that could never fire are refused, naming the item: a test that
 * counted on one would otherwise pass for the wrong reason. */
static void items_that_could_never_fire_are_refused(void **state) {
    static const struct {
        const char *fault, *says;
        td_status st;
    } bad[] = {
        {"cpu:0@any:3,cpu:2@allreduce:1",
         "item 'cpu:2@allreduce:1' names cpu:2, which is not one of this run's devices (cpu:0, "
         "cpu:1)",
         TD_ERR_INVALID_ARG},
        {"cpu:1@sum:3", "item 'cpu:1@sum:3': 'sum' is not a collective", TD_ERR_PARSE},
        {"cpu:1@any:0", "item 'cpu:1@any:0': collectives count from 1, so a count of 0",
         TD_ERR_PARSE},
    };
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cfg.fault = bad[i].fault;
        TD_ASSERT_STATUS(td_group_create_spec("cpu*2", &cfg, &g), bad[i].st);
        assert_null(g);
        td_test_assert_message_contains("TANDEM_FAULT: ");
        td_test_assert_message_contains(bad[i].says);
    }
}

/* When no member is left, the message names the devices lost, not the
 * function that found none. */
static void a_group_with_every_member_lost_names_them(void **state) {
    td_group *g = make_group("cpu*2", "", 60000), *s = NULL;
    const int both[2] = {0, 1};
    (void)state;
    TD_ASSERT_STATUS(td_group_shrink(g, both, 2, &s), TD_ERR_DEVICE_LOST);
    assert_null(s);
    td_test_assert_message_contains("no device is left: cpu:0 and cpu:1 were lost");
    td_group_destroy(g);
}

/* A member alone in its group, stuck for good in a collective: no peer
 * times out on it, so the run itself gives up on it (after the timeout and
 * a second), names it, and leaves its host thread behind; the group and its
 * device then close without waiting for that thread. */
static void a_lone_member_stuck_for_good_is_given_up(void **state) {
    td_group *g = make_group("cpu:0", "cpu:0@allreduce:2:stuck", 200);
    fault_args a;
    uint64_t t0 = td_clock_ns();
    (void)state;
    memset(&a, 0, sizeof a);
    a.kind = TD_COLL_ALLREDUCE;
    a.calls = 4;
    a.fail_rank = -1;
    TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("member 0 (cpu:0)");
    td_test_assert_message_contains(
        "cpu:0 (rank 0) has not come back from its collective #2 (allreduce) in 1200 ms");
    assert_int_equal(atomic_load(&a.completed[0]), 1);
    assert_true(td_group_member_failed(g, 0));
    td_group_destroy(g);
    assert_true(td_clock_ns() - t0 < 20ull * 1000000000ull);
}

static void the_environment_variable_injects_faults(void **state) {
    td_group *g = NULL;
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    fault_args a;
    cfg.timeout_ms = 60000;
    setenv("TANDEM_FAULT", "cpu:0@allreduce:1:error", 1);
    TD_ASSERT_OK(td_group_create_spec("cpu*2", &cfg, &g));
    unsetenv("TANDEM_FAULT");
    memset(&a, 0, sizeof a);
    a.kind = TD_COLL_ALLREDUCE;
    a.calls = 2;
    a.fail_rank = -1;
    TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("member 0 (cpu:0)");
    td_group_destroy(g);
}

/* What td_group_destroy(g) writes to stderr, at the warning level. */
static char *stderr_of_destroy(td_group *g) {
    char path[] = "/tmp/td_faults_XXXXXX", *text;
    int fd = mkstemp(path), saved;
    assert_true(fd >= 0);
    fflush(stderr);
    saved = dup(2);
    dup2(fd, 2);
    td_log_set_level(TD_LOG_WARN);
    td_group_destroy(g);
    td_log_set_level(TD_LOG_ERROR);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    text = (char *)td_test_read_file(path, NULL);
    unlink(path);
    return text;
}

/* An item for a collective the group never runs (ZeRO-1 makes no
 * all-reduce) would be ignored without a word and a test counting on it pass
 * for the wrong reason: the group says it never fired, and what its device
 * ran instead. Items that fired, or that are another process's, say nothing. */
static void an_item_that_never_fired_is_named(void **state) {
    td_group *g = make_group("cpu*2", "cpu:1@broadcast:1,cpu:0@any:9,p1/cpu:1@allreduce:1", 60000);
    fault_args a;
    char *said;
    (void)state;
    memset(&a, 0, sizeof a);
    a.kind = TD_COLL_ALLREDUCE;
    a.calls = 3;
    a.fail_rank = -1;
    TD_ASSERT_OK(td_group_run(g, fault_fn, &a));
    said = stderr_of_destroy(g);
    if (!strstr(said, "TANDEM_FAULT item 'cpu:1@broadcast:1' never fired: cpu:1 ran 0 broadcast "
                      "of its 3 collectives (this run makes none of that kind)") ||
        !strstr(said, "TANDEM_FAULT item 'cpu:0@any:9' never fired: cpu:0 ran 3 collectives in "
                      "all") ||
        strstr(said, "p1/"))
        fail_msg("stderr: %s", said);
    free(said);
    /* Fired: nothing said. */
    g = make_group("cpu*2", "cpu:1@allreduce:2:error", 60000);
    memset(&a, 0, sizeof a);
    a.kind = TD_COLL_ALLREDUCE;
    a.calls = 3;
    a.fail_rank = -1;
    TD_ASSERT_STATUS(td_group_run(g, fault_fn, &a), TD_ERR_DEVICE_LOST);
    said = stderr_of_destroy(g);
    if (strstr(said, "never fired"))
        fail_msg("stderr: %s", said);
    free(said);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loud_fault_in_each_collective_fails_every_member),
        cmocka_unit_test(silent_fault_in_each_collective_times_out_and_names_the_member),
        cmocka_unit_test(a_member_whose_own_code_fails_releases_its_peers),
        cmocka_unit_test(the_fault_grammar_is_checked),
        cmocka_unit_test(the_environment_variable_injects_faults),
        cmocka_unit_test(items_that_could_never_fire_are_refused),
        cmocka_unit_test(a_group_with_every_member_lost_names_them),
        cmocka_unit_test(a_lone_member_stuck_for_good_is_given_up),
        cmocka_unit_test(an_item_that_never_fired_is_named),
    };
    td_log_set_level(TD_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
