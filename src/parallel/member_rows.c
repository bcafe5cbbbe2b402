/* Gathering each member's row of a step (member_rows.h). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "parallel/member_rows.h"

td_status td__rows_alloc(td_device *dev, int size, td__rows *r) {
    memset(r, 0, sizeof *r);
    r->size = size;
    TD_CHECK(td_buffer_alloc(dev, sizeof(td__member_row), &r->send));
    return td_buffer_alloc(dev, sizeof(td__member_row) * (size_t)size, &r->all);
}

void td__rows_free(td__rows *r) {
    td_buffer_free(r->send);
    td_buffer_free(r->all);
    memset(r, 0, sizeof *r);
}

td_status td__rows_gather(td_group *g, td__rows *r, const td__member_row *row) {
    TD_CHECK(td_buffer_write(r->send, 0, row, sizeof *row));
    return td_allgather(g, r->send, 0, r->all, 0, TD__ROW_WORDS, TD_F64);
}

td_status td__rows_read(const td__rows *r, td__member_row *rows) {
    return td_buffer_read(r->all, 0, rows, sizeof *rows * (size_t)r->size);
}

void td__rows_to_stats(const td__member_row *rows, int n, double step_s, td_member_stats *m) {
    for (int k = 0; k < n; k++) {
        m[k].compute_s = rows[k].compute_s;
        m[k].comm_s = rows[k].comm_s;
        m[k].update_s = rows[k].update_s;
        m[k].wait_s = fmax(0, step_s - rows[k].compute_s - rows[k].comm_s - rows[k].update_s);
    }
}

typedef struct eval_call {
    td_model *const *models;
    const td_batch *batches;
    size_t n;
    td_step_result *per_batch;
} eval_call;

static td_status evaluate_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    eval_call *c = arg;
    (void)g, (void)dev, (void)size;
    for (size_t i = 0; i < c->n; i++) {
        td_step_result r;
        TD_CHECK(td_model_evaluate(c->models[rank], &c->batches[i], &r));
        if (rank == 0)
            c->per_batch[i] = r;
    }
    return TD_OK;
}

td_status td__rows_evaluate_alike(td_group *g, td_model *const *models, const td_batch *batches,
                                  size_t n, td_step_result *per_batch) {
    eval_call c = {models, batches, n, per_batch};
    return n ? td_group_run(g, evaluate_job, &c) : TD_OK;
}
