#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "core/spin.h"
#include "support/support.h"
#include "tandem/core.h"

static void spin_ns_comes_from_the_environment(void **state) {
    /* Read once per process: this test is the first to ask. */
    setenv("TANDEM_SPIN_US", "250", 1);
    assert_int_equal(td__spin_ns(), 250000);
    setenv("TANDEM_SPIN_US", "7", 1);
    assert_int_equal(td__spin_ns(), 250000);
}

typedef struct setter {
    atomic_uint *flag;
    unsigned value;
} setter;

static void *set_later(void *p) {
    setter *s = p;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    atomic_store(s->flag, s->value);
    return NULL;
}

static void spin_until_sees_another_threads_store(void **state) {
    atomic_uint flag = 0;
    setter s = {&flag, 3};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, set_later, &s), 0);
    /* A budget far beyond the 2 ms the setter sleeps. */
    assert_true(td__spin_until(&flag, 3, 20ull * 1000000000ull));
    assert_int_equal(atomic_load(&flag), 3);
    pthread_join(t, NULL);
}

static void spin_until_gives_up_after_its_budget(void **state) {
    atomic_uint flag = 1;
    uint64_t t0 = td_clock_ns();
    assert_false(td__spin_until(&flag, 2, 3000000));
    assert_true(td_clock_ns() - t0 >= 3000000);
    /* Already there: no waiting, even with no budget. */
    assert_true(td__spin_until(&flag, 1, 0));
    assert_false(td__spin_until(&flag, 2, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spin_ns_comes_from_the_environment),
        cmocka_unit_test(spin_until_sees_another_threads_store),
        cmocka_unit_test(spin_until_gives_up_after_its_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
