/* bench_collectives: algbw and busbw of every collective on the local and MPI
 * transports, beside memcpy and MPI_Allreduce, with the floors checked. The
 * same as `tandem bench collectives`, built from the command's own file
 * (src/cli/bench_collectives.c). */
#include "bench_collectives.h"

int main(int argc, char **argv) {
    return td_cli_bench_collectives(argc, argv, "");
}
