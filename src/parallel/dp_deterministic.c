/* The data strategy's deterministic mode: fixed micro-chunks whatever the
 * device count, each chunk's gradient kept, summed along a chain in chunk
 * order so the weights are bitwise the same for any number of devices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/dp-impl.h"

void td__dp_free_chunk_grads(dp_member *mb, size_t nparams) {
    for (size_t c = 0; c < mb->chunk_slots; c++) {
        for (size_t p = 0; mb->chunk_grads[c] && p < nparams; p++)
            td_tensor_destroy(mb->chunk_grads[c][p]);
        free(mb->chunk_grads[c]);
    }
    free(mb->chunk_grads);
    mb->chunk_grads = NULL;
    mb->chunk_slots = 0;
}

/* Deterministic mode: chunk gradients, then a chain in chunk order. */
static td_status ensure_chunk_slots(td_dp *dp, dp_member *mb, size_t slots) {
    td_status st;
    if (mb->chunk_slots >= slots)
        return TD_OK;
    td__dp_free_chunk_grads(mb, dp->nparams);
    mb->chunk_grads = td__calloc(sizeof *mb->chunk_grads * slots, "chunk gradients");
    if (!mb->chunk_grads)
        return TD_ERR_OUT_OF_MEMORY;
    mb->chunk_slots = slots;
    for (size_t c = 0; c < slots; c++) {
        mb->chunk_grads[c] = td__calloc(sizeof **mb->chunk_grads * dp->nparams, "chunk gradients");
        if (!mb->chunk_grads[c])
            return TD_ERR_OUT_OF_MEMORY;
        for (size_t p = 0; p < dp->nparams; p++) {
            td_tensor *gr = td_model_grad(mb->model, p);
            int64_t shape[TD_MAX_DIMS];
            for (int i = 0; i < td_tensor_ndim(gr); i++)
                shape[i] = td_tensor_dim(gr, i);
            if ((st = td_tensor_create(mb->dev, td_tensor_dtype(gr), td_tensor_ndim(gr), shape,
                                       &mb->chunk_grads[c][p])) != TD_OK)
                return st;
        }
    }
    return TD_OK;
}

td_status td__dp_step_member_deterministic(td_group *g, td_device *dev, int rank, int size,
                                           void *arg) {
    dp_work *w = arg;
    td_dp *dp = w->dp;
    dp_member *mb = td__dp_member(dp, rank);
    const int64_t C = dp->cfg.chunk_samples, B = w->batch->n;
    const int64_t nchunks = (B + C - 1) / C;
    double scale = 1.0 / (double)(B * dp->labels_per_sample);
    int64_t res_shape[2] = {nchunks, 3};
    double *res = NULL;
    td__member_row row = {0};
    uint64_t c0, c1, u0; /* compute, communication and update start */
    td_status st;

    mb->g = g;
    td_model_set_grad_hook(mb->model, NULL, NULL);
    TD_TRY(ensure_chunk_slots(dp, mb, (size_t)(w->counts[rank] > 0 ? w->counts[rank] : 1)));
    if (!mb->chunk_results || td_tensor_dim(mb->chunk_results, 0) != nchunks) {
        td_tensor_destroy(mb->chunk_results);
        td_tensor_destroy(mb->chunk_results_all);
        mb->chunk_results = mb->chunk_results_all = NULL;
        TD_TRY(td_tensor_create(dev, dp->stat_dtype, 2, res_shape, &mb->chunk_results));
        TD_TRY(td_tensor_create(dev, dp->stat_dtype, 2, res_shape, &mb->chunk_results_all));
    }
    res = td__calloc(sizeof *res * (size_t)nchunks * 3, "chunk results");
    if (!res) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    c0 = td_clock_ns();
    for (int64_t k = 0; k < w->counts[rank]; k++) {
        int64_t chunk = w->offsets[rank] + k, first = chunk * C;
        int64_t n = B - first < C ? B - first : C;
        td_batch slice = td__dp_slice(dp, w->batch, first, n);
        td_step_result r;
        TD_TRY(td_model_train_slice(mb->model, &slice, first, scale, 0, w->step, &r));
        for (size_t p = 0; p < dp->nparams; p++)
            TD_TRY(td_tensor_axpby(1.0, td_model_grad(mb->model, p), 0.0, mb->chunk_grads[k][p]));
        res[chunk * 3 + 0] = r.loss_sum;
        res[chunk * 3 + 1] = (double)r.correct;
        res[chunk * 3 + 2] = (double)r.count;
    }
    c1 = td_clock_ns();
    /* The chain: rank d folds its chunks, in order, into the running sum it
     * received, and hands it on; the fold order is the chunk order whatever
     * the ranks' shares. */
    for (int d = 0; d < size; d++) {
        if (w->counts[d] == 0)
            continue;
        if (d == rank) {
            for (int64_t k = 0; k < w->counts[rank]; k++)
                for (size_t p = 0; p < dp->nparams; p++) {
                    td_tensor *gr = td_model_grad(mb->model, p);
                    if (w->offsets[rank] + k == 0)
                        TD_TRY(td_tensor_axpby(1.0, mb->chunk_grads[k][p], 0.0, gr));
                    else
                        TD_TRY(td_tensor_axpby(1.0, mb->chunk_grads[k][p], 1.0, gr));
                }
        }
        for (size_t p = 0; p < dp->nparams; p++)
            TD_TRY(td_broadcast_tensor(g, td_model_grad(mb->model, p), d));
    }
    u0 = td_clock_ns();
    TD_TRY(td_optimizer_step(mb->opt, NULL));
    td__dp_put_times(&row, c0, c1, u0);
    /* Each chunk's numbers come from one rank and zeros from the others, so
     * the sum is exact; the fold over chunks happens in order on the host. */
    TD_TRY(td_tensor_write_f64(mb->chunk_results, res, (size_t)nchunks * 3));
    TD_TRY(td_allreduce(g, td_tensor_buffer(mb->chunk_results, NULL), 0,
                        td_tensor_buffer(mb->chunk_results_all, NULL), 0, (size_t)nchunks * 3,
                        dp->stat_dtype, TD_REDUCE_SUM));
    if (mb == w->reader)
        TD_TRY(td_tensor_read_f64(mb->chunk_results_all, w->chunk_rows, (size_t)nchunks * 3));
    st = td__dp_gather_stats(g, mb, w, &row);
fail:
    free(res);
    return st;
}
