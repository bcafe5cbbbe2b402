/* Devices: opening them from a spec and closing them, device lists, and
 * properties (info, capabilities, throttling). Backends plug in through
 * td_backend_ops. The host threads and their queues are in queue.c, memory
 * and copies in buffer.c. */
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

/* Backends ----------------------------------------------------------------- */

static const td_backend_ops *find_backend(const char *name) {
    for (const td_backend_ops *const *b = td__backends(); *b; b++)
        if (!strcmp((*b)->name, name))
            return *b;
    return NULL;
}

/* What `auto` opens when no TD_DEVICE_CAP_AUTO backend has a device: the
 * backend of this process's own cores. */
static const td_backend_ops *fallback_backend(void) {
    for (const td_backend_ops *const *b = td__backends(); *b; b++)
        if ((*b)->caps & TD_DEVICE_CAP_HOST_CORES)
            return *b;
    return NULL;
}

/* "cpu: cpu:0, cpu:1; cuda: none (...)" for error messages. */
static void describe_all(char *buf, size_t n) {
    size_t used = 0;
    const td_backend_ops *const *b;
    const char *const *missing;
    buf[0] = '\0';
    for (b = td__backends(); *b && used + 1 < n; b++) {
        char line[512];
        (*b)->describe(line, sizeof line);
        used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? "; " : "", line);
    }
    for (missing = td__backends_left_out(); *missing && used + 1 < n; missing++)
        used += (size_t)snprintf(buf + used, n - used, "; %s", *missing);
}

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

static td_status open_backend_item(const td_backend_ops *b, const td_spec_item *item,
                                   td_device_sink *sink) {
    td_status st = b->open(item, sink);
    if (st == TD_ERR_NO_DEVICE) {
        char here[1024];
        describe_all(here, sizeof here);
        td__error_prefix(st, "device spec item '%s': ", item->text);
        /* Append the listing after the backend's own reason. */
        {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s. Devices here: %s", td_last_error(), here);
            td__error_set(msg, td_last_error_setting());
        }
    }
    return st;
}

static void add_note(td_device_list *list, const char *line) {
    size_t used = strlen(list->notes);
    snprintf(list->notes + used, sizeof list->notes - used, "%s\n", line);
}

static td_status open_item(const td_spec_item *item, td_device_sink *sink) {
    const td_backend_ops *b;
    if (!strcmp(item->backend, "all") || !strcmp(item->backend, "auto")) {
        int want_all = !strcmp(item->backend, "all");
        int gpus = 0;
        td_status st;
        for (const td_backend_ops *const *each = td__backends(); *each; each++) {
            const td_backend_ops *bk = *each;
            td_spec_item every = *item;
            int n;
            if (!want_all && !(bk->caps & TD_DEVICE_CAP_AUTO))
                continue; /* auto takes GPUs first; the CPU is the fallback below. */
            n = bk->count();
            if (n <= 0) {
                char line[512];
                bk->describe(line, sizeof line);
                add_note(sink->list, line);
                continue;
            }
            snprintf(every.backend, sizeof every.backend, "%s", bk->name);
            every.index_kind = TD_SPEC_INDEX_ALL;
            if ((st = bk->open(&every, sink)) != TD_OK)
                return st;
            gpus += !(bk->caps & TD_DEVICE_CAP_HOST_CORES);
        }
        if (!want_all && gpus == 0) {
            const td_backend_ops *host = fallback_backend();
            td_spec_item cpu = *item;
            if (!host)
                return td__error(TD_ERR_NO_DEVICE, "device spec item '%s': no CPU backend",
                                 item->text);
            snprintf(cpu.backend, sizeof cpu.backend, "%s", host->name);
            return host->open(&cpu, sink);
        }
        return TD_OK;
    }
    b = find_backend(item->backend);
    if (!b) {
        char here[1024];
        describe_all(here, sizeof here);
        return td__error(TD_ERR_NO_DEVICE,
                         "device spec item '%s': the %s backend is not built into this tandem. "
                         "Devices here: %s",
                         item->text, item->backend, here);
    }
    return open_backend_item(b, item, sink);
}

td_status td_devices_open(const char *spec, td_device_list **out) {
    td_spec_item *items = NULL;
    size_t n = 0;
    td_device_list *list = NULL;
    td_device_sink sink;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_devices_open: out is NULL");
    *out = NULL;
    TD_TRY(td__spec_parse(spec, &items, &n));
    list = td__calloc(sizeof *list, "a device list");
    if (!list) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    list->devs = td__calloc(sizeof *list->devs * MAX_DEVICES, "a device list");
    if (!list->devs) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    sink.list = list;
    for (size_t i = 0; i < n; i++)
        TD_TRY(open_item(&items[i], &sink));
    for (size_t i = 0; i < list->count; i++)
        TD_TRY(device_start(list->devs[i]));
    free(items);
    *out = list;
    return TD_OK;
fail:
    free(items);
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
           (dev->ops->graph_begin ? TD_DEVICE_CAP_GRAPHS : 0u);
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
