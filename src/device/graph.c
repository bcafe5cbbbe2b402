/* Recorded device work (see graph.h): the device layer's side of the
 * backend's optional graph_* slots. */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "device/device-impl.h"
#include "device/graph.h"

struct td_graph {
    td_device *dev;
    void *impl; /* the backend's */
};

int td__device_has_graphs(const td_device *dev) {
    return dev && dev->ops->graph_begin && dev->ops->graph_end && dev->ops->graph_launch &&
           dev->ops->graph_destroy;
}

static td_status on_own_thread(td_device *dev, const char *what) {
    if (!td__device_has_graphs(dev))
        return td__error(TD_ERR_UNSUPPORTED, "%s: the %s backend does not record graphs",
                         td_device_name(dev), dev ? dev->ops->name : "(null)");
    if (td_device_current() != dev)
        return td__error(TD_ERR_INVALID_ARG, "%s: called off %s's host thread", what,
                         td_device_name(dev));
    return TD_OK;
}

td_status td__graph_begin(td_device *dev) {
    td_status st = on_own_thread(dev, "td__graph_begin");
    if (st != TD_OK)
        return st;
    return dev->ops->graph_begin(dev->ctx);
}

td_status td__graph_end(td_device *dev, td_graph **out) {
    td_status st;
    void *impl = NULL;
    td_graph *g;
    *out = NULL;
    if ((st = on_own_thread(dev, "td__graph_end")) != TD_OK)
        return st;
    if ((st = dev->ops->graph_end(dev->ctx, &impl)) != TD_OK)
        return st;
    if (!(g = td__calloc(sizeof *g, "a graph"))) {
        dev->ops->graph_destroy(dev->ctx, impl);
        return TD_ERR_OUT_OF_MEMORY;
    }
    g->dev = dev;
    g->impl = impl;
    *out = g;
    return TD_OK;
}

static td_status launch_task(td_device *dev, void *arg) {
    td_graph *g = arg;
    return dev->ops->graph_launch(dev->ctx, g->impl);
}

td_status td__graph_launch(td_graph *g) {
    if (!g)
        return td__error(TD_ERR_INVALID_ARG, "td__graph_launch: graph is NULL");
    return td_device_run(g->dev, launch_task, g);
}

static td_status destroy_task(td_device *dev, void *arg) {
    td_graph *g = arg;
    dev->ops->graph_destroy(dev->ctx, g->impl);
    return TD_OK;
}

void td__graph_destroy(td_graph *g) {
    if (!g)
        return;
    td_device_run(g->dev, destroy_task, g);
    free(g);
}
