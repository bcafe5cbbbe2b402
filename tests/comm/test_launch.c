/* td_comm_launch: where the launcher's variables place this process, and
 * what it makes of variables that are missing or not numbers. */
#include <stdlib.h>

#include "support/support.h"

static void clear(void) {
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
}

static void expect(int rank, int size) {
    int r = -7, n = -7;
    td_comm_launch(&r, &n);
    assert_int_equal(r, rank);
    assert_int_equal(n, size);
}

static void open_mpi_and_pmi_are_read(void **state) {
    clear();
    expect(0, 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    expect(1, 2);
    clear();
    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    expect(2, 4);
    td_comm_launch(NULL, NULL);
    clear();
}

static void nonsense_is_one_process(void **state) {
    clear();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    expect(0, 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "two", 1);
    expect(0, 1);
    setenv("OMPI_COMM_WORLD_SIZE", "", 1);
    expect(0, 1);
    setenv("OMPI_COMM_WORLD_SIZE", "-2", 1);
    expect(0, 1);
    clear();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_mpi_and_pmi_are_read),
        cmocka_unit_test(nonsense_is_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
