/* The inside of the `tensor` strategy: tensor.c runs it and sizes its
 * slices (placement.c puts whole-model checkpoints together from the
 * members' shards and takes them apart again), tensor_decode.c generates
 * with the same slices. */
#ifndef TD_PARALLEL_TENSOR_IMPL_H
#define TD_PARALLEL_TENSOR_IMPL_H

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/generate.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

/* Under mpirun (tensor_procs.c): this process's members as a group of their
 * own, and for each member k a group of member k of every process. */
typedef struct td__tp_procs {
    td_group *local; /* NULL in one process */
    td_group *across[TD_DP_MAX_MEMBERS];
    int n, process, nprocs;
} td__tp_procs;

/* Makes the groups when span reaches other processes (every one must hold
 * as many members); else leaves *pp with nprocs 1 and nothing made. */
td_status td__tp_procs_open(td_group *span, td__tp_procs *pp);
void td__tp_procs_close(td__tp_procs *pp);
/* v[0..n) (n <= 8) reduced by op over member k of every process. */
td_status td__tp_procs_agree(td__tp_procs *pp, int k, double *v, size_t n, td_reduce_op op);
/* Member k's gradients in m summed over the processes. */
td_status td__tp_procs_sum_grads(td__tp_procs *pp, int k, td_model *m);
/* This process's rows of the global batch; *first: the first one's index. */
td_batch td__tp_procs_rows(const td__tp_procs *pp, const td_batch *all, const td_model_info *info,
                           int64_t *first);

/* The tensor strategy's decoder (td_strategy_decoder_create). */
td_status td__tensor_decoder(td_group *g, const char *checkpoint, td_dtype dtype, td_decoder **out);

#endif
