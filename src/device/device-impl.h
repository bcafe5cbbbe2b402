/* The inside of the device layer: the device object and what the layer's
 * files share. Only the device layer includes this; the backends include
 * device/backend.h (the interface they implement) and the layers above
 * device/internal.h and device/buffer.h. */
#ifndef TD_DEVICE_IMPL_H
#define TD_DEVICE_IMPL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "device/backend.h"
#include "device/buffer.h"
#include "device/internal.h"
#include "device/kernels.h"
#include "device/spec.h"
#include "tandem/device.h"

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
    atomic_int precision;  /* td_precision of its f32 products */
    /* The logical CPUs its host thread is bound to, read at start; empty
     * when it is not bound (GPUs, or pinning refused). */
    cpu_set_t cpus;
};

/* Inside the device layer, across its files: the body of each device's host
 * thread (queue.c), started by td_devices_open (device.c); and freeing the
 * buffers td_buffer_free kept while the thread was left behind, now that it
 * is back (buffer.c), called when the device closes. */
void *td__device_thread_main(void *dev);
void td__device_free_kept(td_device *dev);

#endif
