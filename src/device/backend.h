/* The interface a backend implements: its table of operations, the sink its
 * open() adds devices to, and the list of backends built in. The backends
 * (src/backend/) include this and nothing else of the device layer's inside;
 * the device object itself stays in device-impl.h, private to the device
 * layer, so a backend reaches a device only through its own void *ctx. */
#ifndef TD_DEVICE_BACKEND_H
#define TD_DEVICE_BACKEND_H

#include <stdint.h>

#include "device/kernels.h"
#include "device/spec.h"
#include "tandem/device.h"

#define TD_BACKEND_API_VERSION 1

typedef struct td_device_sink td_device_sink;

/* A backend is a static const table of these plus a void *ctx per device.
 * Slots marked optional may be NULL; the device layer supplies the default. */
typedef struct td_backend_ops {
    uint32_t api_version; /* TD_BACKEND_API_VERSION */
    const char *name;     /* "cpu", "cuda", "opencl": for listings and messages only */
    /* td_device_cap flags true of every device of the backend. The device
     * layer adds TD_DEVICE_CAP_PEER_COPY where copy_peer is set and
     * TD_DEVICE_CAP_GRAPHS where graph_begin is (td_device_caps). `auto`
     * opens the TD_DEVICE_CAP_AUTO backends, and falls back to the
     * TD_DEVICE_CAP_HOST_CORES one when they have no device. */
    unsigned caps;

    /* Lists the devices that exist, one name a line ("cpu:0 (1 core)\n"), or
     * says why there are none. Used for listings and error messages. */
    void (*describe)(char *buf, size_t n);
    /* How many physical devices exist (0 when none; why goes to the message). */
    int (*count)(void);
    /* Expands one spec item into devices, calling td__device_sink_add() for
     * each. On failure the message names the item. */
    td_status (*open)(const td_spec_item *item, td_device_sink *sink);
    /* Releases a device's context; NULL-safe. Runs on the caller's thread
     * after the host thread has ended. */
    void (*close)(void *ctx);

    /* Optional. Run once on the device's host thread when it starts and ends:
     * pinning to cores, cudaSetDevice, queue creation. */
    td_status (*thread_init)(void *ctx);
    void (*thread_deinit)(void *ctx);

    /* The remaining calls run on the device's host thread only. */
    td_status (*info)(void *ctx, td_device_info *out);
    td_status (*alloc)(void *ctx, size_t nbytes, void **ptr);
    void (*free)(void *ctx, void *ptr); /* NULL-safe */
    /* Host to device and device to host; synchronous on return. */
    td_status (*write)(void *ctx, void *dst, const void *src, size_t nbytes);
    td_status (*read)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Within one device. */
    td_status (*copy)(void *ctx, void *dst, const void *src, size_t nbytes);
    /* Optional: between two devices of this backend, run on dst's host
     * thread. NULL: the device layer stages through host memory. */
    td_status (*copy_peer)(void *dst_ctx, void *dst, void *src_ctx, const void *src, size_t nbytes);
    /* Optional: waits for the device's own queue. NULL: already synchronous. */
    td_status (*sync)(void *ctx);

    const td_kernels *kernels;
    /* Optional: what computes its kernels' gemm_bf16 on this machine
     * ("AVX512-BF16 vdpbf16ps"), for td_device_bf16_path. */
    const char *(*bf16_path)(void);
    /* Optional: the device's precision (td_device_set_precision) for the
     * kernels with products inside them (convolution, fused attention);
     * NULL: those stay f32. Called before work is queued on the device. */
    void (*set_precision)(void *ctx, td_precision p);

    /* Optional, all four or none (NULL on cpu and opencl): recording the
     * device work that the host thread queues between graph_begin and
     * graph_end, and replaying it (CUDA graphs). While recording nothing
     * runs; kernels that give results to the host hand them over at each
     * replay instead (see td_kernels: the host pointers given while recording
     * must outlive the graph). graph_end always ends the recording; on failure
     * *graph is NULL and the message says why. graph_launch runs the graph
     * and waits for it; results are final on return. graph_begin fails with
     * TD_ERR_UNSUPPORTED when graphs are switched off. See src/device/graph.h. */
    td_status (*graph_begin)(void *ctx);
    td_status (*graph_end)(void *ctx, void **graph);
    td_status (*graph_launch)(void *ctx, void *graph);
    void (*graph_destroy)(void *ctx, void *graph); /* NULL-safe */
} td_backend_ops;

/* Called by a backend's open() once per device it makes. The name is copied;
 * ctx becomes the device's and is released with ops->close on failure too. */
td_status td__device_sink_add(td_device_sink *sink, const td_backend_ops *ops, const char *name,
                              void *ctx, const td_device_options *opts);

/* dev's context (the ctx its backend's open() gave td__device_sink_add) when
 * dev is one of the devices of the backend `ops`, else NULL (dev NULL too):
 * for a backend's calls that the layers above make with a td_device (see
 * src/backend/cuda/cuda.h). Valid while dev is open; safe from any thread. */
void *td__device_backend_ctx(const td_device *dev, const td_backend_ops *ops);

/* For the registry above the backends (src/backend/registry.c), which opens
 * a spec's devices: a new device list whose devices open() adds through the
 * sink (td__device_sink_add); their host threads start once all are open.
 * On failure *out is NULL and nothing is left open. */
td_status td__device_list_open(td_status (*open)(void *arg, td_device_sink *sink), void *arg,
                               td_device_list **out);
/* A line for the list's notes (td_device_list_notes): a backend with no
 * device, say. */
void td__device_list_note(td_device_sink *sink, const char *line);

#endif
