/* Recording a device's queued work once and replaying it (CUDA graphs), for
 * the layers above the device layer. A backend offers it through the
 * optional graph_* slots of td_backend_ops; elsewhere every call here says
 * TD_ERR_UNSUPPORTED.
 *
 * Between td__graph_begin and td__graph_end nothing runs: the ops called on
 * the device's host thread are recorded. What is recorded is fixed: device
 * pointers, sizes and every scalar argument (a learning rate, a dropout seed)
 * are baked in, so a caller records only work whose arguments are the same
 * at every replay, and changes inputs by writing the same device memory
 * before td__graph_launch. Kernels that hand results to the host (the
 * cross-entropy's loss sum) write them at each replay to the host pointers
 * they were given while recording, which must outlive the graph. Nothing may
 * allocate, free or wait for the device while recording. */
#ifndef TD_DEVICE_GRAPH_H
#define TD_DEVICE_GRAPH_H

#include "tandem/device.h"

typedef struct td_graph td_graph;

/* 1 when dev's backend can record graphs (whether they are switched off is
 * known only at td__graph_begin). */
int td__device_has_graphs(const td_device *dev);

/* Starts recording on dev; call on dev's host thread. TD_ERR_UNSUPPORTED
 * when the backend has no graphs or they are switched off
 * (TANDEM_CUDA_GRAPHS=0). */
td_status td__graph_begin(td_device *dev);

/* Ends the recording begun on dev; always ends it, even after an op failed
 * while recording. On success *out is the graph, which the caller destroys;
 * on failure *out is NULL and the message says why. */
td_status td__graph_end(td_device *dev, td_graph **out);

/* Runs the graph on its device's host thread and waits for it; the host
 * results are written before it returns. */
td_status td__graph_launch(td_graph *g);

/* NULL-safe; from any thread, before the device is closed. */
void td__graph_destroy(td_graph *g);

#endif
