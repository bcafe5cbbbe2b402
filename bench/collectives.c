/* bench_collectives: algbw and busbw of every collective on the local and MPI
 * transports, beside memcpy and MPI_Allreduce, with the floors checked. The
 * same as `tandem bench collectives`; see src/comm/bench.c. */
#include "comm/bench.h"

int main(int argc, char **argv) {
    return td__comm_bench(argc, argv, "");
}
