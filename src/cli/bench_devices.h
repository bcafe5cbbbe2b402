/* tandem bench devices: how fast each device is (bench_devices.c). */
#ifndef TD_CLI_BENCH_DEVICES_H
#define TD_CLI_BENCH_DEVICES_H

/* Runs `tandem bench devices` with argv[0] "devices"; returns the exit
 * status: 0, 1 on failure (message printed), 2 on a usage error. */
int td_cli_bench_devices(int argc, char **argv);

#endif
