/* The MPI transport's shared-memory path: when every process of a group
 * runs on one machine, their leaders all-reduce through a segment they all
 * map, with tandem's own flags, instead of through MPI (shm.c says why). */
#ifndef TD_COMM_MPI_SHM_H
#define TD_COMM_MPI_SHM_H

#include <mpi.h>

#include "comm/comm-impl.h"

typedef struct td__shm td__shm;

/* Collective over comm (every process of the group, from the thread that
 * creates groups). *out is NULL, and the status TD_OK, where the processes
 * do not share one machine, TANDEM_MPI_SHM=0, or the segment could not be
 * made: the transport then goes through MPI. Processes under different host
 * names or in different network namespaces count as different machines. */
td_status td__shm_open(MPI_Comm comm, int process, int nprocs, td__shm **out);
void td__shm_close(td__shm *s);

/* The leader's all-reduce of o->count elements from in to out (either may
 * be the other) across the group's processes. */
/* This process's group failed: the others stop waiting for it at once. */
void td__shm_failed(td__shm *s);

td_status td__shm_allreduce(td__shm *s, td__member *m, const td__op *o, const void *in, void *out);

#endif
