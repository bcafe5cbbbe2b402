/* The processes of a group, for work done once per process rather than per
 * member: the trace writer aligns every process's clock with the first
 * process's and gathers their text to it. Without MPI (one process) these
 * are trivial. Every process of the group calls them, from the thread that
 * creates groups, between td_group_run calls. */
#ifndef TD_COMM_PROCESS_H
#define TD_COMM_PROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/comm.h"

/* This process's rank in MPI_COMM_WORLD; 0 without MPI. */
int td__group_process(const td_group *g);

/* *offset_ns: what td_clock_ns() of this process adds to read as the first
 * process's clock (0 there), measured with a few round trips (the one
 * quickest taken); *base_ns: the first process's td_clock_ns() now. */
td_status td__group_clock_sync(td_group *g, int64_t *offset_ns, uint64_t *base_ns);

/* The first process gets every process's n bytes of text, in process
 * order, in *all (malloc'ed, NUL-terminated; *all_n bytes); the others get
 * NULL and 0. */
td_status td__group_gather_text(td_group *g, const char *text, size_t n, char **all, size_t *all_n);

#endif
