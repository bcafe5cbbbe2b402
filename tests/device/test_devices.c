/* Opening devices, their host threads and queues, and their memory. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "device/device-impl.h"
#include "support/support.h"

static void cpu_specs_give_the_devices_they_name(void **state) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    td_device_list *list = td_test_open("cpu*2");
    td_device_info info;
    assert_int_equal(td_device_list_count(list), 2);
    assert_string_equal(td_device_name(td_device_list_get(list, 0)), "cpu:0");
    assert_string_equal(td_device_name(td_device_list_get(list, 1)), "cpu:1");
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(list, 1), &info));
    assert_string_equal(info.backend, "cpu");
    assert_true(info.compute_units >= 1);
    assert_true(info.fp64);
    assert_true(info.mem_total > 0);
    assert_null(td_device_list_get(list, 2));
    td_device_list_destroy(list);

    list = td_test_open("cpu");
    assert_int_equal(td_device_list_count(list), 1);
    TD_ASSERT_OK(td_device_get_info(td_device_list_get(list, 0), &info));
    /* One device owns every core this process may use. */
    assert_true(info.compute_units >= 1 && info.compute_units <= ncpu);
    td_device_list_destroy(list);

    list = td_test_open("cpu*4"); /* more devices than cores: they share */
    assert_int_equal(td_device_list_count(list), 4);
    td_device_list_destroy(list);

    list = td_test_open("all");
    assert_true(td_device_list_count(list) >= 1);
    td_device_list_destroy(list);
}

static void unknown_devices_are_refused_with_what_exists(void **state) {
    td_device_list *list = (td_device_list *)0x1;
    TD_ASSERT_STATUS(td_devices_open("cpu:4096", &list), TD_ERR_NO_DEVICE);
    assert_null(list);
    td_test_assert_message_contains("there is no cpu:4096");
    td_test_assert_message_contains("Devices here: cpu: cpu:0");

    TD_ASSERT_STATUS(td_devices_open("cpu:0,cpu:0", &list), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("cpu:0 is named twice");

    TD_ASSERT_STATUS(td_devices_open("tpu:0", &list), TD_ERR_NO_DEVICE);
    td_test_assert_message_contains("unknown backend 'tpu'");
}

/* Each task records its order and the thread it ran on. */
typedef struct order_state {
    atomic_int next;
    int seen[64];
    td_device *ran_on[64];
} order_state;

typedef struct order_task {
    order_state *s;
    int id;
} order_task;

static td_status record_order(td_device *dev, void *arg) {
    order_task *t = arg;
    int pos = atomic_fetch_add(&t->s->next, 1);
    t->s->seen[pos] = t->id;
    t->s->ran_on[pos] = td_device_current();
    return t->id == 63 ? td__error(TD_ERR_DEVICE, "task 63 failed on purpose") : TD_OK;
}

static void tasks_run_in_order_on_the_device_thread(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    order_state s;
    order_task tasks[64];
    td_event *ev[64];
    memset(&s, 0, sizeof s);
    assert_null(td_device_current());
    for (int i = 0; i < 64; i++) {
        tasks[i] = (order_task){&s, i};
        TD_ASSERT_OK(td_device_submit(dev, record_order, &tasks[i], &ev[i]));
    }
    for (int i = 0; i < 63; i++) {
        TD_ASSERT_OK(td_event_wait(ev[i]));
        td_event_destroy(ev[i]);
    }
    /* The last task fails; its message reaches the waiter. */
    TD_ASSERT_STATUS(td_event_wait(ev[63]), TD_ERR_DEVICE);
    td_test_assert_message_contains("task 63 failed on purpose");
    assert_int_equal(td_event_query(ev[63]), TD_OK);
    td_event_destroy(ev[63]);
    for (int i = 0; i < 64; i++) {
        assert_int_equal(s.seen[i], i);
        assert_ptr_equal(s.ran_on[i], dev);
    }
    TD_ASSERT_OK(td_device_sync(dev));
    td_device_list_destroy(list);
}

/* A task that says it started and waits for leave. */
typedef struct gate {
    atomic_int started, leave;
} gate;

static td_status wait_at_gate(td_device *dev, void *arg) {
    gate *g = arg;
    (void)dev;
    atomic_store(&g->started, 1);
    while (!atomic_load(&g->leave))
        usleep(100);
    return TD_OK;
}

/* td_device_busy against what the device's thread is doing: idle, in a
 * task, with a task queued behind it, and idle again. */
static void busy_means_a_task_runs_or_waits(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_device *dev = td_device_list_get(list, 0);
    gate g;
    td_event *first, *second;
    (void)state;
    atomic_init(&g.started, 0);
    atomic_init(&g.leave, 0);
    assert_int_equal(td_device_busy(dev), 0);
    TD_ASSERT_OK(td_device_submit(dev, wait_at_gate, &g, &first));
    while (!atomic_load(&g.started))
        usleep(100);
    assert_int_equal(td_device_busy(dev), 1);
    TD_ASSERT_OK(td_device_submit(dev, wait_at_gate, &g, &second));
    assert_int_equal(td_device_busy(dev), 1);
    atomic_store(&g.leave, 1);
    TD_ASSERT_OK(td_event_wait(first));
    TD_ASSERT_OK(td_event_wait(second));
    td_event_destroy(first);
    td_event_destroy(second);
    assert_int_equal(td_device_busy(dev), 0);
    td_device_list_destroy(list);
}

static void budgets_make_out_of_memory_real(void **state) {
    td_device_list *list = td_test_open("cpu:0{mem=1M}");
    td_device *dev = td_device_list_get(list, 0);
    td_buffer *a = NULL, *b = NULL, *c = NULL;
    td_device_info info;
    TD_ASSERT_OK(td_buffer_alloc(dev, 512 * 1024, &a));
    TD_ASSERT_OK(td_buffer_alloc(dev, 512 * 1024, &b));
    assert_int_equal(td_device_mem_used(dev), 1024 * 1024);
    TD_ASSERT_STATUS(td_buffer_alloc(dev, 1, &c), TD_ERR_OUT_OF_MEMORY);
    assert_null(c);
    td_test_assert_message_contains("cpu:0: allocating 1 B exceeds its memory budget of 1.0 MiB");
    TD_ASSERT_OK(td_device_get_info(dev, &info));
    assert_int_equal(info.mem_budget, 1024 * 1024);
    assert_int_equal(info.mem_total, 1024 * 1024);
    assert_int_equal(info.mem_free, 0);
    td_buffer_free(a);
    assert_int_equal(td_device_mem_used(dev), 512 * 1024);
    TD_ASSERT_OK(td_buffer_alloc(dev, 512 * 1024, &c));
    TD_ASSERT_STATUS(td_buffer_alloc(dev, (size_t)1 << 40, &a), TD_ERR_OUT_OF_MEMORY);
    td_buffer_free(b);
    td_buffer_free(c);
    td_buffer_free(NULL);
    assert_int_equal(td_device_mem_used(dev), 0);
    td_device_list_destroy(list);
}

static void a_huge_allocation_fails_cleanly_without_a_budget(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_buffer *b = NULL;
    /* 2^62 bytes: no machine has it; the failure is a status, not a crash. */
    TD_ASSERT_STATUS(td_buffer_alloc(td_device_list_get(list, 0), (size_t)1 << 62, &b),
                     TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cpu:0: allocating");
    assert_null(b);
    assert_int_equal(td_device_mem_used(td_device_list_get(list, 0)), 0);
    td_device_list_destroy(list);
}

static void copies_between_devices_keep_every_byte(void **state) {
    static const size_t sizes[] = {0, 1, 7, 4093, 1 << 20, (64 << 20) + 5};
    td_device_list *list = td_test_open("cpu*3");
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        td_test_chain c; /* device to device, twice */
        size_t n = sizes[k];
        td_test_chain_create(list, n, 2654435761u, &c);
        memset(c.dst, 0xAB, n + 1);
        TD_ASSERT_OK(td_buffer_read(c.b[2], 0, c.dst, n));
        assert_memory_equal(c.dst, c.src, n);
        assert_int_equal(c.dst[n], 0xAB); /* nothing written past the end */
        if (n > 10) {
            /* Offsets inside both buffers. */
            TD_ASSERT_OK(td_buffer_copy(c.b[1], 3, c.b[0], 5, n - 10));
            TD_ASSERT_OK(td_buffer_read(c.b[1], 3, c.dst, n - 10));
            assert_memory_equal(c.dst, c.src + 5, n - 10);
        }
        TD_ASSERT_STATUS(td_buffer_copy(c.b[1], 1, c.b[0], 0, n), TD_ERR_INVALID_ARG);
        td_test_chain_destroy(&c);
    }
    td_device_list_destroy(list);
}

static void out_of_range_transfers_are_refused(void **state) {
    td_device_list *list = td_test_open("cpu:0");
    td_buffer *b;
    char host[16];
    TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, 0), 8, &b));
    TD_ASSERT_STATUS(td_buffer_write(b, 4, host, 8), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("outside the buffer of 8 bytes");
    TD_ASSERT_STATUS(td_buffer_read(b, 9, host, 0), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_buffer_read(b, (size_t)-1, host, 2), TD_ERR_INVALID_ARG);
    TD_ASSERT_OK(td_buffer_read(b, 8, host, 0));
    td_buffer_free(b);
    td_device_list_destroy(list);
}

static void slowdown_stretches_a_phase_of_work(void **state) {
    td_device_list *list = td_test_open("cpu:0{slowdown=3},cpu:1");
    td_device *slow = td_device_list_get(list, 0);
    uint64_t start = td_clock_ns(), busy_end;
    td_device_info info;
    while (td_clock_ns() - start < 20000000ull)
        ; /* 20 ms of work */
    busy_end = td_clock_ns();
    td__device_throttle(slow, start);
    /* Sleeping never ends early: the phase took at least 3x its work. */
    assert_true(td_clock_ns() - start >= 3 * (busy_end - start) - 1000000ull);
    assert_true(td__device_slowdown(td_device_list_get(list, 1)) == 1.0);
    TD_ASSERT_OK(td_device_get_info(slow, &info));
    assert_true(info.slowdown == 3.0);
    td_device_list_destroy(list);
}

/* {latency=MS} adds a fixed cost to every phase, however short. */
static void latency_adds_a_fixed_cost_to_a_phase(void **state) {
    td_device_list *list = td_test_open("cpu:0{latency=15}");
    uint64_t start = td_clock_ns();
    td__device_throttle(td_device_list_get(list, 0), start);
    assert_true(td_clock_ns() - start >= 15000000ull);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cpu_specs_give_the_devices_they_name),
        cmocka_unit_test(unknown_devices_are_refused_with_what_exists),
        cmocka_unit_test(tasks_run_in_order_on_the_device_thread),
        cmocka_unit_test(busy_means_a_task_runs_or_waits),
        cmocka_unit_test(budgets_make_out_of_memory_real),
        cmocka_unit_test(a_huge_allocation_fails_cleanly_without_a_budget),
        cmocka_unit_test(copies_between_devices_keep_every_byte),
        cmocka_unit_test(out_of_range_transfers_are_refused),
        cmocka_unit_test(slowdown_stretches_a_phase_of_work),
        cmocka_unit_test(latency_adds_a_fixed_cost_to_a_phase),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
