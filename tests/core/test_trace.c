/* The timeline recorder: nothing while off, every thread's spans (nested,
 * named, stamped with the step) while on, a new session forgets the last,
 * and threads that record while a snapshot is taken (run under
 * ThreadSanitizer, this is the race check). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "support/support.h"

#define SPANS 20000 /* per thread: more than one chunk of the buffer */

static const td__trace_track *find(const td__trace_track *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name))
            return &t[i];
    return NULL;
}

static void nothing_is_recorded_while_off(void **state) {
    td__trace_track *t;
    size_t n;
    td__trace_start();
    td__trace_thread_name("off");
    assert_int_equal(td__trace_begin(), 0);
    td__trace_end(td__trace_begin(), TD__TRACE_COMPUTE, "forward", -1);
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    assert_null(find(t, n, "off"));
    td__trace_snapshot_free(t, n);
}

static void spans_nest_and_carry_the_step(void **state) {
    td__trace_track *t;
    const td__trace_track *me;
    size_t n;
    uint64_t outer, inner;
    td__trace_start();
    td__trace_thread_name("nest");
    td__trace_set_step(7);
    outer = td__trace_begin();
    inner = td__trace_begin();
    assert_true(outer && inner >= outer);
    td__trace_end(inner, TD__TRACE_COMM, "allreduce", 4096);
    td__trace_end(outer, TD__TRACE_COMPUTE, "backward", -1);
    td__trace_pause();
    td__trace_end(td__trace_begin(), TD__TRACE_COMPUTE, "after", -1);
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    me = find(t, n, "nest");
    assert_non_null(me);
    assert_int_equal(me->n, 2);
    /* Sorted by start, the outer span first although it ended last. */
    assert_string_equal(me->recs[0].name, "backward");
    assert_string_equal(me->recs[1].name, "allreduce");
    assert_true(me->recs[1].t0 >= me->recs[0].t0 && me->recs[1].t1 <= me->recs[0].t1);
    assert_int_equal(me->recs[1].bytes, 4096);
    assert_int_equal(me->recs[1].cat, TD__TRACE_COMM);
    assert_int_equal(me->recs[0].step, 7);
    td__trace_snapshot_free(t, n);
    /* A new session starts empty. */
    td__trace_start();
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    assert_null(find(t, n, "nest"));
    td__trace_snapshot_free(t, n);
}

static void *record(void *arg) {
    td__trace_thread_name("worker %d", *(int *)arg);
    for (int i = 0; i < SPANS; i++)
        td__trace_end(td__trace_begin(), TD__TRACE_COMPUTE, "forward", i);
    return NULL;
}

static void every_thread_has_its_track(void **state) {
    pthread_t th[3];
    int ids[3] = {0, 1, 2};
    td__trace_track *t;
    size_t n;
    td__trace_start();
    td__trace_set_step(1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, record, &ids[i]), 0);
    /* Taken while they record: whatever it holds is whole. */
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < t[i].n; k++)
            assert_string_equal(t[i].recs[k].name, "forward");
    td__trace_snapshot_free(t, n);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    td__trace_pause();
    /* Their threads ended; their spans stay until the next session. */
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    for (int i = 0; i < 3; i++) {
        char name[16];
        const td__trace_track *w;
        snprintf(name, sizeof name, "worker %d", i);
        w = find(t, n, name);
        assert_non_null(w);
        assert_int_equal(w->n, SPANS);
        assert_int_equal(w->dropped, 0);
        for (size_t k = 1; k < w->n; k++)
            assert_true(w->recs[k].t0 >= w->recs[k - 1].t0);
    }
    td__trace_snapshot_free(t, n);
    td__trace_start();
    TD_ASSERT_OK(td__trace_snapshot(&t, &n));
    assert_null(find(t, n, "worker 0"));
    td__trace_snapshot_free(t, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nothing_is_recorded_while_off),
        cmocka_unit_test(spans_nest_and_carry_the_step),
        cmocka_unit_test(every_thread_has_its_track),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
