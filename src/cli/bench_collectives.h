/* tandem bench collectives: the comm layer's collectives timed
 * (bench_collectives.c); also bench/bench_collectives. */
#ifndef TD_CLI_BENCH_COLLECTIVES_H
#define TD_CLI_BENCH_COLLECTIVES_H

/* Runs the benchmark with command-line arguments (argv[0] is the name) and
 * returns an exit status: 0, 1 on failure, 2 on a usage error, 3 when a
 * floor fails (the MPI section's included). `respawn` is what to put after
 * the executable to come back here when it starts itself under mpirun (""
 * for bench_collectives, "bench collectives" for tandem). */
int td_cli_bench_collectives(int argc, char **argv, const char *respawn);

#endif
