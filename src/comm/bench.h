/* The collectives benchmark, shared by bench/collectives.c and `tandem bench
 * collectives`. */
#ifndef TD_COMM_BENCH_H
#define TD_COMM_BENCH_H

/* Runs the benchmark with command-line arguments (argv[0] is the name) and
 * returns an exit status: 0, 1 on failure, 2 on a usage error, 3 when a
 * floor fails. `respawn` is what to put after the executable to come back
 * here when it starts itself under mpirun ("" or "bench collectives"). */
int td__comm_bench(int argc, char **argv, const char *respawn);

#endif
