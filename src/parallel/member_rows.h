/* One record for what a member did in a step, gathered to every member: a
 * row per member with named fields, the same for every strategy, in place
 * of a layout of words read at offsets. */
#ifndef TD_PARALLEL_MEMBER_ROWS_H
#define TD_PARALLEL_MEMBER_ROWS_H

#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"

typedef struct td__member_row {
    double compute_s, comm_s, update_s; /* where its step went */
    double loss_sum, correct, count;    /* what its part of the batch gave */
    double part_s; /* calibrating the data strategy: a pass over a quarter of the batch (and
                      compute_s, over all of it) */
} td__member_row;

#define TD__ROW_WORDS (sizeof(td__member_row) / sizeof(double))

/* A member's buffers for gathering rows: its own, and `size` members'. */
typedef struct td__rows {
    td_buffer *send; /* (TD__ROW_WORDS) f64 */
    td_buffer *all;  /* (size, TD__ROW_WORDS) f64 */
    int size;
} td__rows;

/* Buffers on dev for a group of `size`; on failure what was made stays in
 * *r for td__rows_free. */
td_status td__rows_alloc(td_device *dev, int size, td__rows *r);
/* NULL-safe on the buffers; leaves *r empty. */
void td__rows_free(td__rows *r);
/* On the member's thread, with every member of g: row to every member. */
td_status td__rows_gather(td_group *g, td__rows *r, const td__member_row *row);
/* The rows the last gather gave this member: r->size of them. */
td_status td__rows_read(const td__rows *r, td__member_row *rows);
/* The time fields of m[0..n) from rows: each member's wait the rest of
 * step_s. */
void td__rows_to_stats(const td__member_row *rows, int n, double step_s, td_member_stats *m);

/* Evaluation where every member of g computes the same loss (a tensor
 * shard, a spatial band model): member k evaluates models[k] on each batch,
 * member 0's numbers go into per_batch. */
td_status td__rows_evaluate_alike(td_group *g, td_model *const *models, const td_batch *batches,
                                  size_t n, td_step_result *per_batch);

#endif
