/* data × tensor within one process (the mesh data:R,tensor:N, mesh.c): R
 * replicas of the tensor strategy, each over N consecutive members of the
 * group, all cut alike (the first replica's measured plan), so that member
 * k of every replica holds the same slices. A step gives replica r rows
 * [n r / R, n (r + 1) / R) of the batch; the replicas run forward and
 * backward at once (a thread each: a group's run blocks its caller), then
 * member k's gradients are summed over a group of member k of every
 * replica, and the replicas take the update at once, every one on the
 * same gradients: the weights stay equal, and one device's up to the order
 * of the sums. Under mpirun the processes are the replicas (procs.c):
 * data:P,tensor:N over P processes of N devices each. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/tp-impl.h"

struct tp_mesh {
    td__mesh m;                         /* the replicas\' groups, and those across them */
    tensor_par *rep[TD_DP_MAX_MEMBERS]; /* rep[0] is the strategy's own */
};

int td__tp_mesh_replicas(const tp_mesh *x) {
    return x ? x->m.replicas : 1;
}

tensor_par *td__tp_mesh_replica(const tp_mesh *x, int r) {
    return x->rep[r];
}

void td__tp_mesh_close(tp_mesh *x) {
    if (!x)
        return;
    for (int r = 1; r < x->m.replicas; r++)
        td__tp_free(x->rep[r]);
    td__mesh_close(&x->m);
    free(x);
}

td_status td__tp_mesh_open(td_strategy *s, int replicas, tensor_par **out) {
    td_group *g = s->group;
    tp_mesh *x;
    td_status st;
    *out = NULL;
    assert(td_group_local_size(g) == td_group_size(g)); /* processes are replicas of their own */
    if (!(x = td__calloc(sizeof *x, "a data x tensor mesh")))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td__mesh_open(g, replicas, "tensor", &x->m)) != TD_OK)
        goto fail;
    st = td__tp_build(s, x->m.rgroup[0], NULL, &x->rep[0]);
    for (int r = 1; r < replicas && st == TD_OK; r++)
        st = td__tp_build(s, x->m.rgroup[r], x->rep[0]->share, &x->rep[r]);
    if (x->rep[0])
        x->rep[0]->mesh = x;
    *out = x->rep[0];
    if (st == TD_OK || x->rep[0])
        return st; /* the strategy's destroy takes the mesh with its first replica */
fail:
    td__tp_mesh_close(x);
    return st;
}

td_status td__tp_mesh_survivors(const tp_mesh *x, td_group *g, td_group **out) {
    int gone[TD_DP_MAX_MEMBERS], n = 0;
    for (int r = 0; r < x->m.replicas; r++)
        for (int k = 0; k < x->m.n; k++)
            if (td_group_member_failed(g, r * x->m.n + k) ||
                td_group_member_failed(x->m.rgroup[r], k) ||
                td_group_member_failed(x->m.across[k], r))
                gone[n++] = r * x->m.n + k;
    return td_group_shrink(g, gone, (size_t)n, out);
}

/* Running a job on every replica at once ------------------------------------------- */

typedef struct replica_job {
    td_group *g;
    td_group_fn fn;
    void *arg;
} replica_job;

static td_status run_job(void *arg) {
    replica_job *j = arg;
    return td_group_run(j->g, j->fn, j->arg);
}

/* fn on replica r with calls[r], every replica at once; the first failure. */
static td_status run_replicas(tp_mesh *x, td_group_fn fn, tp_step_call *calls) {
    replica_job jobs[TD_DP_MAX_MEMBERS];
    void *args[TD_DP_MAX_MEMBERS];
    for (int r = 0; r < x->m.replicas; r++) {
        jobs[r] = (replica_job){x->m.rgroup[r], fn, &calls[r]};
        args[r] = &jobs[r];
    }
    return td__mesh_run_all(x->m.replicas, run_job, args);
}

/* Summing member k's gradients over the replicas: on the group across them,
 * whose rank r is replica r's member k. */
typedef struct across_call {
    tp_mesh *x;
    int k;
} across_call;

static td_status sum_across_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    across_call *c = arg;
    tp_member *m = &c->x->rep[rank]->mb[c->k];
    uint64_t t0 = td_clock_ns();
    (void)dev;
    (void)size;
    for (size_t i = 0; i < td_model_param_count(m->m); i++)
        TD_CHECK(td_allreduce_tensor(g, td_model_grad(m->m, i), TD_REDUCE_SUM));
    m->comm_s += (double)(td_clock_ns() - t0) * 1e-9;
    return TD_OK;
}

/* The step's numbers: each replica's member 0 row holds its rows' loss and
 * counts (every member of a replica computes the same); timings member by
 * member, replica after replica. */
static td_status gather_results(tp_mesh *x, const td_batch *batch, double step_s,
                                td_step_result *res, td_step_stats *stats) {
    td__member_row rows[TD_DP_MAX_MEMBERS];
    double speed = 0;
    memset(res, 0, sizeof *res);
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->members = x->m.replicas * x->m.n;
        stats->step_s = step_s;
    }
    for (int r = 0; r < x->m.replicas; r++) {
        tensor_par *p = x->rep[r];
        TD_CHECK(td__rows_read(&p->mb[0].rows, rows));
        res->loss_sum += rows[0].loss_sum;
        res->correct += (int64_t)rows[0].correct;
        res->count += (int64_t)rows[0].count;
        if (stats)
            td__rows_to_stats(rows, p->size, step_s, &stats->m[r * x->m.n]);
        for (int k = 0; stats && k < p->size; k++) {
            td_member_stats *m = &stats->m[r * x->m.n + k];
            m->samples = batch->n * (r + 1) / x->m.replicas - batch->n * r / x->m.replicas;
            m->share = p->share[k] / x->m.replicas;
            speed += p->mb[k].alone_s > 0 ? 1.0 / p->mb[k].alone_s : 0;
        }
    }
    if (stats) /* calibration timed one sample of the whole model */
        stats->ideal_s = speed > 0 ? (double)batch->n / speed : 0;
    return TD_OK;
}

td_status td__tp_mesh_step(tensor_par *p, const td_batch *batch, uint64_t step, td_step_result *res,
                           td_step_stats *stats) {
    tp_mesh *x = p->mesh;
    tp_step_call calls[TD_DP_MAX_MEMBERS];
    td_batch rows[TD_DP_MAX_MEMBERS];
    uint64_t t0 = td_clock_ns();
    if (batch->n < x->m.replicas)
        return td__error_setting(TD_ERR_INVALID_ARG, "batch",
                                 "tensor: a batch of %lld samples for %d replicas: give each at "
                                 "least one",
                                 (long long)batch->n, x->m.replicas);
    for (int r = 0; r < x->m.replicas; r++) {
        int64_t lo = batch->n * r / x->m.replicas, hi = batch->n * (r + 1) / x->m.replicas;
        rows[r] = td__batch_rows(batch, &p->info, lo, hi);
        calls[r] = (tp_step_call){x->rep[r], &rows[r], lo, step, 1.0 / (double)(batch->n * p->lps)};
    }
    TD_CHECK(run_replicas(x, td__tp_backward_job, calls));
    for (int k = 0; k < x->m.n; k++) {
        across_call c = {x, k};
        TD_CHECK(td_group_run(x->m.across[k], sum_across_job, &c));
    }
    TD_CHECK(run_replicas(x, td__tp_update_job, calls));
    return gather_results(x, batch, (double)(td_clock_ns() - t0) * 1e-9, res, stats);
}
