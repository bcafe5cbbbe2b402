/* Device meshes: a strategy name may be axes, "data:2,tensor:2", the
 * outermost first: axis sizes multiply to the group's size, and consecutive
 * members form the innermost axis (here, cpu:0 and cpu:1 split the model,
 * as do cpu:2 and cpu:3, and the two pairs are data-parallel replicas). A
 * single axis is its strategy ("tensor:4" is tensor on 4 devices). Of the
 * compositions, data × tensor runs: the tensor strategy with `replicas`,
 * each replica taking its rows of the batch and member k of every replica
 * summing its gradients with the others' before the update (as processes
 * do under mpirun). The others are refused by name. */
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
            strcmp(ax[i].name, "pipeline"))
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "mesh '%s': no axis '%s' (axes: data, tensor, pipeline)", name,
                                     ax[i].name);
    *devices = 1;
    for (int i = 0; i < count; i++)
        *devices *= (int)ax[i].size;
    if (count == 1) {
        *strategy = !strcmp(ax[0].name, "data")     ? "data"
                    : !strcmp(ax[0].name, "tensor") ? "tensor"
                                                    : "pipeline";
        return TD_OK;
    }
    if (count == 2 && !strcmp(ax[0].name, "data") && !strcmp(ax[1].name, "tensor")) {
        *strategy = "tensor";
        snprintf(options, n, "replicas=%ld", ax[0].size);
        return TD_OK;
    }
    return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                             "mesh '%s': of the compositions only data:R,tensor:N runs yet", name);
}
