/* Device meshes: a strategy name may be axes, "data:2,tensor:2", the
 * outermost first: axis sizes multiply to the group's size, and consecutive
 * members form the innermost axis (here, cpu:0 and cpu:1 split the model,
 * as do cpu:2 and cpu:3, and the two pairs are data-parallel replicas). A
 * single axis is its strategy ("tensor:4" is tensor on 4 devices). Of the
 * compositions, data × tensor, data × pipeline and data × mirror run: the
 * tensor, pipeline or mirror strategy with `replicas` (tp_mesh.c,
 * pp_mesh.c, mirror_step.c), each replica taking its rows of the batch and
 * member k of every replica summing its
 * gradients with the others' before the update; pipeline × tensor: the
 * pipeline strategy with `tensor` (pp_mesh.c), each stage's layers split
 * over its consecutive members; and data × pipeline × tensor, replicas of
 * that. Other orders of the axes are refused by name. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/strategy-impl.h"

#define MAX_AXES 3

typedef struct axis {
    char name[16];
    long size;
} axis;

/* name's axes into ax; the count, or -1 with the error set. */
static int parse_axes(const char *name, axis *ax) {
    const char *at = name;
    int n = 0;
    while (*at) {
        const char *colon = strchr(at, ':'), *comma = strchr(at, ',');
        char *end;
        size_t len;
        if (n == MAX_AXES)
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy", "mesh '%s': at most %d axes",
                                     name, MAX_AXES),
                   -1;
        if (!colon || (comma && comma < colon) || (len = (size_t)(colon - at)) == 0 ||
            len >= sizeof ax[n].name)
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "mesh '%s': an axis is NAME:SIZE, as in data:2,tensor:2",
                                     name),
                   -1;
        memcpy(ax[n].name, at, len);
        ax[n].name[len] = '\0';
        ax[n].size = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || (*end && *end != ',') || ax[n].size < 1 || ax[n].size > 4096)
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "mesh '%s': the size of axis %s is not a whole number from "
                                     "1 to 4096",
                                     name, ax[n].name),
                   -1;
        n++;
        at = *end ? end + 1 : end;
    }
    return n;
}

td_status td__mesh_resolve(const char *name, const char **strategy, char *options, size_t n,
                           int *devices) {
    axis ax[MAX_AXES];
    int count;
    options[0] = '\0';
    *devices = 0;
    *strategy = name;
    if (!name || !strchr(name, ':'))
        return TD_OK;
    if ((count = parse_axes(name, ax)) < 0)
        return TD_ERR_INVALID_ARG;
    for (int i = 0; i < count; i++)
        if (strcmp(ax[i].name, "data") && strcmp(ax[i].name, "tensor") &&
            strcmp(ax[i].name, "pipeline") && strcmp(ax[i].name, "mirror"))
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "mesh '%s': no axis '%s' (axes: data, tensor, pipeline, "
                                     "mirror)",
                                     name, ax[i].name);
    *devices = 1;
    for (int i = 0; i < count; i++)
        *devices *= (int)ax[i].size;
    if (count == 1) {
        *strategy = ax[0].name[0] == 'd'   ? "data"
                    : ax[0].name[0] == 't' ? "tensor"
                    : ax[0].name[0] == 'p' ? "pipeline"
                                           : "mirror";
        return TD_OK;
    }
    if (count == 2 && !strcmp(ax[0].name, "data") &&
        (!strcmp(ax[1].name, "tensor") || !strcmp(ax[1].name, "pipeline") ||
         !strcmp(ax[1].name, "mirror"))) {
        *strategy = ax[1].name[0] == 't' ? "tensor" : ax[1].name[0] == 'p' ? "pipeline" : "mirror";
        snprintf(options, n, "replicas=%ld", ax[0].size);
        return TD_OK;
    }
    if (count == 2 && !strcmp(ax[0].name, "pipeline") && !strcmp(ax[1].name, "tensor")) {
        *strategy = "pipeline";
        snprintf(options, n, "tensor=%ld", ax[1].size);
        return TD_OK;
    }
    if (count == 3 && !strcmp(ax[0].name, "data") && !strcmp(ax[1].name, "pipeline") &&
        !strcmp(ax[2].name, "tensor")) {
        *strategy = "pipeline";
        snprintf(options, n, "replicas=%ld,tensor=%ld", ax[0].size, ax[2].size);
        return TD_OK;
    }
    if (count == 2 && !strcmp(ax[0].name, "tensor") && !strcmp(ax[1].name, "pipeline"))
        return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                 "mesh '%s': the tensor axis is the inner one (its members "
                                 "sum partial results at every layer): pipeline:%ld,tensor:%ld",
                                 name, ax[1].size, ax[0].size);
    return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                             "mesh '%s': of the compositions data:R,tensor:N, "
                             "data:R,pipeline:N, data:R,mirror:M, pipeline:P,tensor:N and "
                             "data:R,pipeline:P,tensor:N run yet",
                             name);
}

/* Shared by the meshes' strategies ---------------------------------------------------- */

td_status td__mesh_open(td_group *g, int replicas, const char *what, td__mesh *m) {
    int out[TD_DP_MAX_MEMBERS], size = td_group_size(g), k;
    memset(m, 0, sizeof *m);
    if (replicas < 1 || size % replicas != 0 || replicas > TD_DP_MAX_MEMBERS)
        return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                 "%s: %d replicas do not divide the group's %d devices", what,
                                 replicas, size);
    m->replicas = replicas;
    m->n = size / replicas;
    for (int r = 0; r < replicas; r++) {
        k = 0;
        for (int rank = 0; rank < size; rank++)
            if (rank / m->n != r)
                out[k++] = rank;
        TD_CHECK(td_group_shrink(g, out, (size_t)k, &m->rgroup[r]));
    }
    for (int j = 0; j < m->n; j++) {
        k = 0;
        for (int rank = 0; rank < size; rank++)
            if (rank % m->n != j)
                out[k++] = rank;
        TD_CHECK(td_group_shrink(g, out, (size_t)k, &m->across[j]));
    }
    return TD_OK;
}

void td__mesh_close(td__mesh *m) {
    for (int k = 0; k < m->n; k++)
        td_group_destroy(m->across[k]);
    for (int r = 0; r < m->replicas; r++)
        td_group_destroy(m->rgroup[r]);
    memset(m, 0, sizeof *m);
}

typedef struct replica_call {
    td_status (*fn)(void *arg);
    void *arg;
    td_status st;
    char msg[512];
} replica_call;

static void *run_replica(void *arg) {
    replica_call *c = arg;
    c->st = c->fn(c->arg);
    if (c->st != TD_OK)
        snprintf(c->msg, sizeof c->msg, "%s", td_last_error());
    return NULL;
}

td_status td__mesh_run_all(int n, td_status (*fn)(void *arg), void *const *args) {
    replica_call calls[TD_DP_MAX_MEMBERS];
    pthread_t threads[TD_DP_MAX_MEMBERS];
    int started[TD_DP_MAX_MEMBERS] = {0};
    assert(n >= 1 && n <= TD_DP_MAX_MEMBERS);
    for (int r = 0; r < n; r++)
        calls[r] = (replica_call){fn, args[r], TD_OK, ""};
    for (int r = 1; r < n; r++)
        started[r] = pthread_create(&threads[r], NULL, run_replica, &calls[r]) == 0;
    if (n < 1)
        return TD_OK;
    run_replica(&calls[0]);
    for (int r = 1; r < n; r++) {
        if (started[r])
            pthread_join(threads[r], NULL);
        else
            run_replica(&calls[r]); /* no thread: after the others, which do not wait for it */
    }
    for (int r = 0; r < n; r++)
        if (calls[r].st != TD_OK)
            return td__error(calls[r].st, "%s", calls[r].msg);
    return TD_OK;
}
