/* tandem bench: benchmarks. `tandem bench devices` measures each device
 * (bench_devices.c); `tandem bench collectives` times the comm layer
 * (bench_collectives.c). */
#include <stdio.h>
#include <string.h>

#include "bench_collectives.h"
#include "bench_devices.h"
#include "cli.h"

static int bench_usage(FILE *f) {
    fprintf(f, "usage: tandem bench devices [options]       GFLOP/s, GB/s, copies, launch cost\n"
               "       tandem bench collectives [options]   the comm layer's collectives\n"
               "(--help after either for its options)\n");
    return f == stdout ? 0 : 2;
}

int td_cli_bench(int argc, char **argv) {
    if (argc < 2)
        return bench_usage(stderr);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return bench_usage(stdout);
    if (!strcmp(argv[1], "devices"))
        return td_cli_bench_devices(argc - 1, argv + 1);
    if (!strcmp(argv[1], "collectives"))
        return td_cli_bench_collectives(argc - 1, argv + 1, "bench collectives");
    fprintf(stderr, "tandem bench: unknown benchmark '%s'\n", argv[1]);
    return bench_usage(stderr);
}
