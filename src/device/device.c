/* Devices: opening and closing them, device lists, and properties (info,
 * capabilities, throttling). Backends plug in through td_backend_ops; which
 * backends there are, and which one a spec item names, is the registry's
 * (src/backend/registry.c), above the backends. The host threads and their
 * queues are in queue.c, memory and copies in buffer.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "device/device-impl.h"

#define MAX_DEVICES 1024

struct td_device_list {
    td_device **devs;
    size_t count;
    char notes[1024];
};

struct td_device_sink {
    td_device_list *list;
};

/* Opening and closing ------------------------------------------------------- */

td_status td__device_sink_add(td_device_sink *sink, const td_backend_ops *ops, const char *name,
                              void *ctx, const td_device_options *opts) {
    td_device_list *list = sink->list;
    td_device *dev;
    if (list->count == MAX_DEVICES) {
        ops->close(ctx);
        return td__error(TD_ERR_INVALID_ARG, "more than %d devices in one spec", MAX_DEVICES);
    }
    for (size_t i = 0; i < list->count; i++) {
        if (!strcmp(list->devs[i]->name, name)) {
            ops->close(ctx);
            return td__error(TD_ERR_INVALID_ARG,
                             "device %s is named twice; for several logical devices on one, use "
                             "'cpu*N' or '{split=N}'",
                             name);
        }
    }
    dev = td__calloc(sizeof *dev, "a device");
    if (!dev) {
        ops->close(ctx);
        return TD_ERR_OUT_OF_MEMORY;
    }
    snprintf(dev->name, sizeof dev->name, "%s", name);
    dev->ops = ops;
    dev->ctx = ctx;
    if (opts) {
        dev->opts = *opts;
        dev->mem_budget = opts->has_mem ? opts->mem : 0;
    }
    atomic_init(&dev->mem_used, 0);
    atomic_init(&dev->in_task, false);
    atomic_init(&dev->left_behind, false);
    pthread_mutex_init(&dev->lock, NULL);
    pthread_cond_init(&dev->wake, NULL);
    list->devs[list->count++] = dev;
    return TD_OK;
}

/* Devices whose host thread never came back from a task: the thread may
 * still touch them, so they stay allocated (and reachable) to the end. */
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static td_device *abandoned[64];
static int nabandoned;

/* Leaves a device whose thread is stuck in a task its group gave up on:
 * joining it would wait for ever. 1 when it did. */
static int abandon_if_stuck(td_device *dev) {
    if (!atomic_load(&dev->left_behind) || !atomic_load(&dev->in_task))
        return 0;
    pthread_mutex_lock(&abandoned_lock);
    if (nabandoned == (int)(sizeof abandoned / sizeof *abandoned)) {
        pthread_mutex_unlock(&abandoned_lock);
        return 0;
    }
    abandoned[nabandoned++] = dev;
    pthread_mutex_unlock(&abandoned_lock);
    TD_LOG_WARN("%s: its host thread has not come back from the task its group gave up on; "
                "left running, with the device and its memory",
                dev->name);
    pthread_detach(dev->thread);
    return 1;
}

static void device_close(td_device *dev) {
    if (!dev)
        return;
    if (!atomic_load(&dev->left_behind))
        td__device_free_kept(dev);
    if (dev->thread_started) {
        void *ret = NULL;
        pthread_mutex_lock(&dev->lock);
        dev->stopping = true;
        atomic_fetch_add_explicit(&dev->pending, 1, memory_order_release);
        pthread_cond_broadcast(&dev->wake);
        pthread_mutex_unlock(&dev->lock);
        if (abandon_if_stuck(dev))
            return;
        pthread_join(dev->thread, &ret);
        free(ret);
    }
    if (atomic_load(&dev->mem_used) != 0)
        TD_LOG_WARN("%s closed with %llu bytes still allocated", dev->name,
                    (unsigned long long)atomic_load(&dev->mem_used));
    dev->ops->close(dev->ctx);
    pthread_mutex_destroy(&dev->lock);
    pthread_cond_destroy(&dev->wake);
    free(dev);
}

int td__device_cpus_overlap(const td_device *a, const td_device *b) {
    cpu_set_t both;
    if (!a || !b)
        return 0;
    CPU_AND(&both, &a->cpus, &b->cpus);
    return CPU_COUNT(&both) > 0;
}

static td_status device_start(td_device *dev) {
    void *ret = NULL;
    td_status st;
    if (pthread_create(&dev->thread, NULL, td__device_thread_main, dev) != 0)
        return td__error(TD_ERR_DEVICE, "%s: cannot start its host thread", dev->name);
    pthread_mutex_lock(&dev->lock);
    while (!dev->thread_started)
        pthread_cond_wait(&dev->wake, &dev->lock);
    st = dev->init_status;
    pthread_mutex_unlock(&dev->lock);
    if (st != TD_OK) {
        pthread_join(dev->thread, &ret);
        dev->thread_started = false;
        td__error(st, "%s: %s", dev->name, ret ? (char *)ret : td_status_str(st));
        free(ret);
        return st;
    }
    {
        td_device_info info;
        if ((st = td_device_get_info(dev, &info)) != TD_OK)
            return st;
        dev->fp64 = info.fp64;
        CPU_ZERO(&dev->cpus);
        if (info.pinned && pthread_getaffinity_np(dev->thread, sizeof dev->cpus, &dev->cpus) != 0)
            CPU_ZERO(&dev->cpus);
    }
    return TD_OK;
}

void td_device_list_destroy(td_device_list *list) {
    if (!list)
        return;
    for (size_t i = list->count; i-- > 0;)
        device_close(list->devs[i]);
    free(list->devs);
    free(list);
}

void td__device_list_note(td_device_sink *sink, const char *line) {
    td_device_list *list = sink->list;
    size_t used = strlen(list->notes);
    snprintf(list->notes + used, sizeof list->notes - used, "%s\n", line);
}

td_status td__device_list_open(td_status (*open)(void *arg, td_device_sink *sink), void *arg,
                               td_device_list **out) {
    td_device_list *list;
    td_device_sink sink;
    td_status st;
    *out = NULL;
    if (!(list = td__calloc(sizeof *list, "a device list")))
        return TD_ERR_OUT_OF_MEMORY;
    if (!(list->devs = td__calloc(sizeof *list->devs * MAX_DEVICES, "a device list"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    sink.list = list;
    TD_TRY(open(arg, &sink));
    for (size_t i = 0; i < list->count; i++)
        TD_TRY(device_start(list->devs[i]));
    *out = list;
    return TD_OK;
fail:
    td_device_list_destroy(list);
    return st;
}

size_t td_device_list_count(const td_device_list *list) {
    return list ? list->count : 0;
}

td_device *td_device_list_get(const td_device_list *list, size_t i) {
    return list && i < list->count ? list->devs[i] : NULL;
}

const char *td_device_list_notes(const td_device_list *list) {
    return list ? list->notes : "";
}

const char *td_device_name(const td_device *dev) {
    return dev ? dev->name : "(null)";
}

/* Properties ----------------------------------------------------------------- */

static td_status info_task(td_device *dev, void *arg) {
    td_device_info *out = arg;
    td_status st;
    memset(out, 0, sizeof *out);
    out->numa_node = -1;
    if ((st = dev->ops->info(dev->ctx, out)) != TD_OK)
        return st;
    snprintf(out->name, sizeof out->name, "%s", dev->name);
    snprintf(out->backend, sizeof out->backend, "%s", dev->ops->name);
    out->caps = td_device_caps(dev);
    /* The bf16 class follows the kernel table's slot; a backend that has the
     * slot says whether it is native, and one without a bf16 or int8 path
     * need not say anything. */
    if (!(out->caps & TD_DEVICE_CAP_BF16))
        snprintf(out->bf16, sizeof out->bf16, "none (no bf16 path yet)");
    else if (!*out->bf16)
        snprintf(out->bf16, sizeof out->bf16, "emulated (%s)", td_device_bf16_path(dev));
    if (!*out->int8)
        snprintf(out->int8, sizeof out->int8, "none");
    out->slowdown = dev->opts.has_slowdown ? dev->opts.slowdown : 1.0;
    if (dev->mem_budget) {
        uint64_t used = atomic_load(&dev->mem_used);
        out->mem_budget = dev->mem_budget;
        if (out->mem_total == 0 || dev->mem_budget < out->mem_total)
            out->mem_total = dev->mem_budget;
        if (out->mem_free == 0 || out->mem_free > dev->mem_budget - used)
            out->mem_free = used > dev->mem_budget ? 0 : dev->mem_budget - used;
    }
    return TD_OK;
}

td_status td_device_get_info(td_device *dev, td_device_info *out) {
    if (!dev || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_device_get_info: device or out is NULL");
    return td_device_run(dev, info_task, out);
}

int td_device_supports_f64(const td_device *dev) {
    return dev ? dev->fp64 : 0;
}

unsigned td_device_caps(const td_device *dev) {
    if (!dev)
        return 0;
    return dev->ops->caps | (dev->ops->copy_peer ? TD_DEVICE_CAP_PEER_COPY : 0u) |
           (dev->ops->graph_begin ? TD_DEVICE_CAP_GRAPHS : 0u) |
           (dev->ops->kernels && dev->ops->kernels->gemm_bf16 ? TD_DEVICE_CAP_BF16 : 0u);
}

td_status td_device_set_precision(td_device *dev, td_precision p) {
    if (!dev)
        return td__error(TD_ERR_INVALID_ARG, "td_device_set_precision: device is NULL");
    if (p != TD_PRECISION_F32 && p != TD_PRECISION_BF16)
        return td__error(TD_ERR_INVALID_ARG, "td_device_set_precision: unknown precision %d",
                         (int)p);
    if (p == TD_PRECISION_BF16 && !(td_device_caps(dev) & TD_DEVICE_CAP_BF16))
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: the %s backend has no bf16 matrix products; it computes in f32",
                         dev->name, dev->ops->name);
    atomic_store(&dev->precision, (int)p);
    if (dev->ops->set_precision)
        dev->ops->set_precision(dev->ctx, p);
    return TD_OK;
}

td_precision td_device_precision(const td_device *dev) {
    return dev ? (td_precision)atomic_load(&dev->precision) : TD_PRECISION_F32;
}

const char *td_device_bf16_path(const td_device *dev) {
    if (!(td_device_caps(dev) & TD_DEVICE_CAP_BF16))
        return "";
    return dev->ops->bf16_path ? dev->ops->bf16_path() : "bf16";
}

uint64_t td_device_mem_used(const td_device *dev) {
    return dev ? atomic_load(&dev->mem_used) : 0;
}

const td_kernels *td__device_kernels(const td_device *dev) {
    return dev ? dev->ops->kernels : NULL;
}

void *td__device_ctx(const td_device *dev) {
    return dev->ctx;
}

void *td__device_backend_ctx(const td_device *dev, const td_backend_ops *ops) {
    return dev && dev->ops == ops ? dev->ctx : NULL;
}

const char *td__device_backend_name(const td_device *dev) {
    return dev->ops->name;
}

td_status td__device_write(td_device *dev, void *dst, const void *src, size_t nbytes) {
    return dev->ops->write(dev->ctx, dst, src, nbytes);
}

td_status td__device_read(td_device *dev, void *dst, const void *src, size_t nbytes) {
    return dev->ops->read(dev->ctx, dst, src, nbytes);
}

double td__device_slowdown(const td_device *dev) {
    return dev && dev->opts.has_slowdown ? dev->opts.slowdown : 1.0;
}

void td__device_throttle(td_device *dev, uint64_t start_ns) {
    td_device_throttle(dev, start_ns, 1);
}

void td_device_throttle(td_device *dev, uint64_t start_ns, int with_latency) {
    double f = td__device_slowdown(dev);
    double extra_ms = with_latency && dev && dev->opts.has_latency ? dev->opts.latency_ms : 0.0;
    uint64_t now = td_clock_ns(), spent = now - start_ns;
    uint64_t deadline;
    if (f <= 1.0 && extra_ms <= 0)
        return;
    deadline = now + (uint64_t)((f - 1.0) * (double)spent + extra_ms * 1e6);
    /* Busy until the deadline, as a slower device would be. Sleeping would
     * free the core, and waking an idle virtual CPU comes late by tens to
     * hundreds of microseconds, which showed as noise in the balancing
     * benchmarks. */
    while (td_clock_ns() < deadline)
        ;
}
