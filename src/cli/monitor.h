/* tandem train --monitor (monitor.c): each device's busy fraction, memory
 * in use, share of the batch and time in the step, drawn from the trainer's
 * step events while the run goes on. */
#ifndef TD_CLI_MONITOR_H
#define TD_CLI_MONITOR_H

#include <stdio.h>

#include "tandem/train.h"

/* How often the monitor draws, at most: in place on a terminal, and as a
 * plain line on anything else (a log file, a pipe). */
#define TD_CLI_MONITOR_TTY_NS   500000000ull
#define TD_CLI_MONITOR_PLAIN_NS 10000000000ull

typedef struct td_cli_monitor td_cli_monitor;

/* A monitor drawing on out (borrowed: it must outlive the monitor). tty 1:
 * a block of lines redrawn in place with ANSI escapes; 0: a plain line per
 * refresh. Loads NVML (libnvidia-ml.so.1) the first time it meets a CUDA
 * device, when the library is there. NULL when out of memory. */
td_cli_monitor *td_cli_monitor_create(FILE *out, int tty);

/* Unloads NVML; NULL-safe. Does not clear the block (td_cli_monitor_clear). */
void td_cli_monitor_destroy(td_cli_monitor *m);

/* A STEP event (others are ignored): adds its per-member numbers to those
 * since the last refresh, and draws when a refresh is due. head: the line
 * above the devices (the progress bar), or NULL. Called on the trainer's
 * thread; reads the members' devices (td_device_mem_used, once
 * td_device_get_info), which is safe from any thread. */
void td_cli_monitor_step(td_cli_monitor *m, const td_train_event *ev, const char *head);

/* Erases the block drawn in place, leaving the cursor where it began, so
 * that other output can follow; nothing when not a terminal. */
void td_cli_monitor_clear(td_cli_monitor *m);

#endif
