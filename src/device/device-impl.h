/* The inside of the device layer: the backend interface and the device
 * object. Only the device layer and the backends include this. */
#ifndef TD_DEVICE_IMPL_H
#define TD_DEVICE_IMPL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "device/internal.h"
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

typedef struct td_task td_task;

struct td_device {
    char name[32];
    const td_backend_ops *ops;
    void *ctx;
    td_device_options opts;
    uint64_t mem_budget; /* 0: none */
    atomic_uint_least64_t mem_used;

    /* The host thread and its in-order queue of tasks. */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    td_task *head, *tail;
    atomic_uint pending; /* tasks queued, plus 1 once stopping: polled without the lock */
    bool stopping;
    atomic_bool in_task;     /* the host thread is running a task */
    atomic_bool left_behind; /* a group gave up waiting for that task */
    td_buffer **kept;        /* freed while left behind: freed at close, or kept */
    size_t nkept, kept_cap;
    td_status init_status; /* what thread_init returned */
    int fp64;              /* cached at start: tensors ask on every create */
    /* The logical CPUs its host thread is bound to, read at start; empty
     * when it is not bound (GPUs, or pinning refused). */
    cpu_set_t cpus;
};

struct td_buffer {
    td_device *dev;
    void *ptr; /* the backend's pointer: host memory for CPU devices */
    size_t nbytes;
};

/* Called by a backend's open() once per device it makes. The name is copied;
 * ctx becomes the device's and is released with ops->close on failure too. */
td_status td__device_sink_add(td_device_sink *sink, const td_backend_ops *ops, const char *name,
                              void *ctx, const td_device_options *opts);

/* Inside the device layer, across its files: the body of each device's host
 * thread (queue.c), started by td_devices_open (device.c); and freeing the
 * buffers td_buffer_free kept while the thread was left behind, now that it
 * is back (buffer.c), called when the device closes. */
void *td__device_thread_main(void *dev);
void td__device_free_kept(td_device *dev);

/* The backends built in, in listing order (cpu first), NULL-terminated, and
 * one line for each backend left out at configure time ("cuda: not built in
 * (why)"), NULL-terminated. Defined by the backends layer (src/backend/
 * backends.c): this layer names no backend. */
const td_backend_ops *const *td__backends(void);
const char *const *td__backends_left_out(void);

#endif
