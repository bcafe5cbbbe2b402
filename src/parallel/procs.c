/* Process groups (procs.h): under mpirun each process runs a strategy
 * over its own devices, as in one process, and the processes share the
 * batch as the `data` strategy does. Member k of every process holds the
 * same slices, so member k's gradients are summed across the processes,
 * over a group of member k of each. For every process to cut its slices
 * alike, what each measured is agreed first (td__procs_agree). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/procs.h"

#define MAX_AGREED 8

/* A call in flight on a group of processes. */
typedef struct agree_call {
    double *v; /* every member reads it; writer alone writes the outcome */
    size_t n;  /* at most MAX_AGREED */
    td_reduce_op op;
    const td_device *writer;
    td_model *grads; /* sum_grads: the model whose gradients are summed */
} agree_call;

static td_status agree_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    agree_call *c = arg;
    double out[MAX_AGREED];
    td_buffer *buf = NULL;
    td_status st;
    (void)rank;
    (void)size;
    if ((st = td_buffer_alloc(dev, sizeof(double) * c->n, &buf)) != TD_OK)
        return st;
    if ((st = td_buffer_write(buf, 0, c->v, sizeof(double) * c->n)) == TD_OK &&
        (st = td_allreduce(g, buf, 0, buf, 0, c->n, TD_F64, c->op)) == TD_OK)
        st = td_buffer_read(buf, 0, out, sizeof(double) * c->n);
    td_buffer_free(buf);
    /* the others have read v once the all-reduce is done */
    if (st == TD_OK && dev == c->writer)
        memcpy(c->v, out, sizeof(double) * c->n);
    return st;
}

static td_status sum_grads_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    agree_call *c = arg;
    (void)dev;
    (void)rank;
    (void)size;
    for (size_t i = 0; i < td_model_param_count(c->grads); i++)
        TD_CHECK(td_allreduce_tensor(g, td_model_grad(c->grads, i), TD_REDUCE_SUM));
    return TD_OK;
}

/* Every process must hold as many members: member k pairs with member k. */
static td_status check_even(td_group *span, td_device *writer, int n) {
    double v[2] = {n, -n};
    agree_call c = {v, 2, TD_REDUCE_MAX, writer, NULL};
    TD_CHECK(td_group_run(span, agree_member, &c));
    if (v[0] != n || -v[1] != n)
        return td__error(TD_ERR_INVALID_ARG,
                         "across processes: every process needs as many devices (this one "
                         "has %d, another %g)",
                         n, v[0] != n ? v[0] : -v[1]);
    return TD_OK;
}

td_status td__procs_open(td_group *span, td__procs *pp) {
    td_device *devs[TD_DP_MAX_MEMBERS];
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    int n = 0, first = -1;
    memset(pp, 0, sizeof *pp);
    pp->nprocs = 1;
    if (td_group_size(span) == td_group_local_size(span))
        return TD_OK;
    for (int r = 0; r < td_group_size(span) && n < TD_DP_MAX_MEMBERS; r++)
        if ((devs[n] = td_group_device(span, r)) != NULL) {
            if (first < 0)
                first = r;
            n++;
        }
    TD_CHECK(check_even(span, devs[0], n));
    pp->n = n;
    pp->process = first / n; /* ranks go process by process */
    pp->nprocs = td_group_size(span) / n;
    cfg.timeout_ms = td_group_timeout_ms(span);
    cfg.fault = ""; /* injected faults count in the run's own group */
    cfg.transport = TD_TRANSPORT_LOCAL;
    TD_CHECK(td_group_create_devices(devs, (size_t)n, &cfg, &pp->local));
    cfg.transport = TD_TRANSPORT_MPI;
    for (int k = 0; k < n; k++)
        TD_CHECK(td_group_create_devices(&devs[k], 1, &cfg, &pp->across[k]));
    return TD_OK;
}

void td__procs_close(td__procs *pp) {
    for (int k = 0; k < pp->n; k++)
        td_group_destroy(pp->across[k]);
    td_group_destroy(pp->local);
    memset(pp, 0, sizeof *pp);
}

td_status td__procs_agree(td__procs *pp, int k, double *v, size_t n, td_reduce_op op) {
    agree_call c = {v, n, op, NULL, NULL};
    if (pp->nprocs == 1)
        return TD_OK;
    if (n > MAX_AGREED)
        return td__error(TD_ERR_INVALID_ARG, "td__procs_agree: %zu numbers", n);
    c.writer = td_group_device(pp->across[k], pp->process);
    return td_group_run(pp->across[k], agree_member, &c);
}

td_status td__procs_sum_grads(td__procs *pp, int k, td_model *m) {
    agree_call c = {NULL, 0, TD_REDUCE_SUM, NULL, m};
    return pp->nprocs > 1 ? td_group_run(pp->across[k], sum_grads_member, &c) : TD_OK;
}

td_batch td__procs_rows(const td__procs *pp, const td_batch *all, const td_model_info *info,
                        int64_t *first) {
    int64_t lo = all->n * pp->process / pp->nprocs, hi = all->n * (pp->process + 1) / pp->nprocs;
    *first = lo;
    return td__batch_rows(all, info, lo, hi);
}

td_batch td__batch_rows(const td_batch *all, const td_model_info *info, int64_t lo, int64_t hi) {
    td_batch b = *all;
    int64_t feats = 1, lps = info->kind == TD_INPUT_TOKENS ? info->in_shape[0] : 1;
    for (int i = 0; i < info->in_ndim; i++)
        feats *= info->in_shape[i];
    b.n = hi - lo;
    if (b.x)
        b.x += lo * feats;
    if (b.tokens)
        b.tokens += lo * feats;
    b.labels += lo * lps;
    return b;
}
