/* Strategies across MPI processes: under mpirun each process runs the
 * strategy over its own devices (`local`), and member k of every process
 * forms a group of its own (`across[k]`) over which the members holding
 * the same slices sum their gradients: each process is one data-parallel
 * replica (the meshes data:P,tensor:N and data:P,pipeline:N). */
#ifndef TD_PARALLEL_PROCS_H
#define TD_PARALLEL_PROCS_H

#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

typedef struct td__procs {
    td_group *local; /* NULL in one process */
    td_group *across[TD_DP_MAX_MEMBERS];
    int n, process, nprocs;
} td__procs;

/* Makes the groups when span reaches other processes (every one must hold
 * as many members); else leaves *pp with nprocs 1 and nothing made. */
td_status td__procs_open(td_group *span, td__procs *pp);
void td__procs_close(td__procs *pp);
/* v[0..n) (n <= 8) reduced by op over member k of every process. */
td_status td__procs_agree(td__procs *pp, int k, double *v, size_t n, td_reduce_op op);
/* Member k's gradients in m summed over the processes. */
td_status td__procs_sum_grads(td__procs *pp, int k, td_model *m);
/* This process's rows of the global batch; *first: the first one's index. */
td_batch td__procs_rows(const td__procs *pp, const td_batch *all, const td_model_info *info,
                        int64_t *first);
/* Rows [lo, hi) of a batch of info's model. */
td_batch td__batch_rows(const td_batch *all, const td_model_info *info, int64_t lo, int64_t hi);

#endif
