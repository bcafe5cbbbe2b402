/* Devices: opening them from a spec, their host threads and in-order task
 * queues, and their memory. Backends plug in through td_backend_ops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/spin.h"
#include "core/trace.h"
#include "device/device-impl.h"

#define MAX_DEVICES   1024
#define STAGING_CHUNK (64u << 20)

struct td_device_list {
    td_device **devs;
    size_t count;
    char notes[1024];
};

struct td_device_sink {
    td_device_list *list;
};

struct td_task {
    td_device_fn fn;
    void *arg;
    td_event *ev; /* NULL when nobody waits */
    td_task *next;
};

struct td_event {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    atomic_int refs; /* the submitter's and the task's */
    int done;
    td_status status;
    char *message; /* the task's failure message, or NULL */
};

static _Thread_local td_device *current_device;

td_device *td_device_current(void) {
    return current_device;
}

/* Backends ----------------------------------------------------------------- */

static const td_backend_ops *find_backend(const char *name) {
    for (const td_backend_ops *const *b = td__backends(); *b; b++)
        if (!strcmp((*b)->name, name))
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

/* Events and tasks --------------------------------------------------------- */

static td_event *event_new(void) {
    td_event *ev = td__calloc(sizeof *ev, "an event");
    if (!ev)
        return NULL;
    pthread_mutex_init(&ev->lock, NULL);
    pthread_cond_init(&ev->done_cond, NULL);
    atomic_init(&ev->refs, 2);
    return ev;
}

static void event_release(td_event *ev) {
    if (ev && atomic_fetch_sub(&ev->refs, 1) == 1) {
        pthread_mutex_destroy(&ev->lock);
        pthread_cond_destroy(&ev->done_cond);
        free(ev->message);
        free(ev);
    }
}

static void event_complete(td_event *ev, td_status st) {
    pthread_mutex_lock(&ev->lock);
    ev->status = st;
    if (st != TD_OK) {
        const char *msg = td_last_error();
        ev->message = strdup(msg);
    }
    ev->done = 1;
    pthread_cond_broadcast(&ev->done_cond);
    pthread_mutex_unlock(&ev->lock);
}

td_status td_event_wait(td_event *ev) {
    td_status st;
    if (!ev)
        return td__error(TD_ERR_INVALID_ARG, "td_event_wait: event is NULL");
    pthread_mutex_lock(&ev->lock);
    while (!ev->done)
        pthread_cond_wait(&ev->done_cond, &ev->lock);
    st = ev->status;
    if (st != TD_OK)
        td__error_set_message(ev->message ? ev->message : td_status_str(st));
    pthread_mutex_unlock(&ev->lock);
    return st;
}

td_status td_event_query(td_event *ev) {
    int done;
    if (!ev)
        return td__error(TD_ERR_INVALID_ARG, "td_event_query: event is NULL");
    pthread_mutex_lock(&ev->lock);
    done = ev->done;
    pthread_mutex_unlock(&ev->lock);
    return done ? TD_OK : TD_IN_PROGRESS;
}

void td_event_destroy(td_event *ev) {
    event_release(ev);
}

static void *host_thread_main(void *p) {
    td_device *dev = p;
    td_status st = TD_OK;
    current_device = dev;
    td__trace_thread_name("%s", dev->name);
    if (dev->ops->thread_init)
        st = dev->ops->thread_init(dev->ctx);
    pthread_mutex_lock(&dev->lock);
    dev->init_status = st;
    dev->thread_started = true;
    pthread_cond_broadcast(&dev->wake);
    pthread_mutex_unlock(&dev->lock);
    if (st != TD_OK)
        return strdup(td_last_error());

    for (;;) {
        td_task *t;
        (void)td__spin_until(&dev->pending, 1, td__spin_ns());
        pthread_mutex_lock(&dev->lock);
        while (!dev->head && !dev->stopping)
            pthread_cond_wait(&dev->wake, &dev->lock);
        t = dev->head;
        if (!t) {
            pthread_mutex_unlock(&dev->lock);
            break;
        }
        dev->head = t->next;
        if (!dev->head)
            dev->tail = NULL;
        /* Before the queue looks empty, for td_device_busy. */
        atomic_store_explicit(&dev->in_task, true, memory_order_relaxed);
        atomic_fetch_sub_explicit(&dev->pending, 1, memory_order_release);
        pthread_mutex_unlock(&dev->lock);

        st = t->fn(dev, t->arg);
        /* Under the lock, so that a group never marks it left behind in a
         * task it has already come back from (td__device_left_behind). */
        pthread_mutex_lock(&dev->lock);
        atomic_store_explicit(&dev->in_task, false, memory_order_release);
        atomic_store_explicit(&dev->left_behind, false, memory_order_relaxed);
        pthread_mutex_unlock(&dev->lock);
        if (t->ev) {
            event_complete(t->ev, st);
            event_release(t->ev);
        } else if (st != TD_OK) {
            TD_LOG_ERROR("%s: a queued task failed nobody waits for: %s", dev->name,
                         td_last_error());
        }
        free(t);
    }
    if (dev->ops->thread_deinit)
        dev->ops->thread_deinit(dev->ctx);
    return NULL;
}

td_status td_device_submit(td_device *dev, td_device_fn fn, void *arg, td_event **event) {
    td_task *t;
    if (event)
        *event = NULL;
    if (!dev || !fn)
        return td__error(TD_ERR_INVALID_ARG, "td_device_submit: device or function is NULL");
    t = td__calloc(sizeof *t, "a device task");
    if (!t)
        return TD_ERR_OUT_OF_MEMORY;
    t->fn = fn;
    t->arg = arg;
    if (event) {
        t->ev = event_new();
        if (!t->ev) {
            free(t);
            return TD_ERR_OUT_OF_MEMORY;
        }
        *event = t->ev;
    }
    pthread_mutex_lock(&dev->lock);
    if (atomic_load(&dev->left_behind)) {
        /* Queued behind a task that may never end, it would never run. */
        pthread_mutex_unlock(&dev->lock);
        if (event) {
            event_release(t->ev);
            event_release(t->ev);
            *event = NULL;
        }
        free(t);
        return td__error(TD_ERR_DEVICE_LOST,
                         "%s: its host thread has not come back from a task its group gave up on",
                         dev->name);
    }
    if (dev->tail)
        dev->tail->next = t;
    else
        dev->head = t;
    dev->tail = t;
    atomic_fetch_add_explicit(&dev->pending, 1, memory_order_release);
    pthread_cond_signal(&dev->wake);
    pthread_mutex_unlock(&dev->lock);
    return TD_OK;
}

td_status td_device_run(td_device *dev, td_device_fn fn, void *arg) {
    td_event *ev;
    td_status st;
    if (!dev || !fn)
        return td__error(TD_ERR_INVALID_ARG, "td_device_run: device or function is NULL");
    if (current_device == dev)
        return fn(dev, arg);
    if ((st = td_device_submit(dev, fn, arg, &ev)) != TD_OK)
        return st;
    st = td_event_wait(ev);
    td_event_destroy(ev);
    return st;
}

static td_status sync_task(td_device *dev, void *arg) {
    return dev->ops->sync ? dev->ops->sync(dev->ctx) : TD_OK;
}

td_status td_device_sync(td_device *dev) {
    return td_device_run(dev, sync_task, NULL);
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

int td_device_busy(const td_device *dev) {
    return dev && (atomic_load(&dev->in_task) ||
                   atomic_load_explicit(&dev->pending, memory_order_acquire));
}

void td__device_left_behind(td_device *dev) {
    if (!dev)
        return;
    pthread_mutex_lock(&dev->lock);
    atomic_store(&dev->left_behind, atomic_load(&dev->in_task));
    pthread_mutex_unlock(&dev->lock);
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

static void free_kept(td_device *dev);

static void device_close(td_device *dev) {
    if (!dev)
        return;
    if (!atomic_load(&dev->left_behind))
        free_kept(dev);
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
    if (pthread_create(&dev->thread, NULL, host_thread_main, dev) != 0)
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
            td__error_set_message(msg);
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
            if (!want_all && (!strcmp(bk->name, "cpu") || !strcmp(bk->name, "opencl")))
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
            gpus += strcmp(bk->name, "cpu") != 0;
        }
        if (!want_all && gpus == 0) {
            td_spec_item cpu = *item;
            snprintf(cpu.backend, sizeof cpu.backend, "cpu");
            return find_backend("cpu")->open(&cpu, sink);
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

uint64_t td_device_mem_used(const td_device *dev) {
    return dev ? atomic_load(&dev->mem_used) : 0;
}

double td__device_slowdown(const td_device *dev) {
    return dev && dev->opts.has_slowdown ? dev->opts.slowdown : 1.0;
}

void td__device_throttle(td_device *dev, uint64_t start_ns) {
    td__device_throttle_part(dev, start_ns, 1);
}

void td__device_throttle_part(td_device *dev, uint64_t start_ns, int with_latency) {
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

/* Memory ------------------------------------------------------------------- */

/* Takes nbytes from the budget, or says why not. */
static td_status budget_take(td_device *dev, size_t nbytes) {
    uint64_t used = atomic_load(&dev->mem_used);
    for (;;) {
        if (dev->mem_budget && (nbytes > dev->mem_budget || used > dev->mem_budget - nbytes)) {
            char a[32], b[32], c[32];
            return td__error(TD_ERR_OUT_OF_MEMORY,
                             "%s: allocating %s exceeds its memory budget of %s (%s in use)",
                             dev->name, td__format_bytes((double)nbytes, a),
                             td__format_bytes((double)dev->mem_budget, b),
                             td__format_bytes((double)used, c));
        }
        if (atomic_compare_exchange_weak(&dev->mem_used, &used, used + nbytes))
            return TD_OK;
    }
}

typedef struct alloc_args {
    size_t nbytes;
    void *ptr;
} alloc_args;

static td_status alloc_task(td_device *dev, void *arg) {
    alloc_args *a = arg;
    return dev->ops->alloc(dev->ctx, a->nbytes, &a->ptr);
}

td_status td_buffer_alloc(td_device *dev, size_t nbytes, td_buffer **out) {
    alloc_args a = {nbytes, NULL};
    td_buffer *buf;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_buffer_alloc: out is NULL");
    *out = NULL;
    if (!dev)
        return td__error(TD_ERR_INVALID_ARG, "td_buffer_alloc: device is NULL");
    if ((st = budget_take(dev, nbytes)) != TD_OK)
        return st;
    buf = td__calloc(sizeof *buf, "a buffer handle");
    if (!buf) {
        atomic_fetch_sub(&dev->mem_used, nbytes);
        return TD_ERR_OUT_OF_MEMORY;
    }
    if ((st = td_device_run(dev, alloc_task, &a)) != TD_OK) {
        atomic_fetch_sub(&dev->mem_used, nbytes);
        free(buf);
        return td__error_prefix(st, "%s: ", dev->name);
    }
    buf->dev = dev;
    buf->ptr = a.ptr;
    buf->nbytes = nbytes;
    *out = buf;
    return TD_OK;
}

static td_status free_task(td_device *dev, void *arg) {
    dev->ops->free(dev->ctx, arg);
    return TD_OK;
}

void td_buffer_free(td_buffer *buf) {
    td_device *dev;
    if (!buf)
        return;
    dev = buf->dev;
    /* Checked first, so that freeing leaves the caller's message alone. */
    if ((current_device == dev || !atomic_load(&dev->left_behind)) &&
        td_device_run(dev, free_task, buf->ptr) == TD_OK) {
        atomic_fetch_sub(&dev->mem_used, buf->nbytes);
        free(buf);
        return;
    }
    /* The host thread never came back from a task and may still use the
     * memory: the device keeps it until it closes. */
    pthread_mutex_lock(&dev->lock);
    if (dev->nkept == dev->kept_cap) {
        size_t cap = dev->kept_cap ? 2 * dev->kept_cap : 64;
        td_buffer **grown = realloc(dev->kept, cap * sizeof *grown);
        if (grown) {
            dev->kept = grown;
            dev->kept_cap = cap;
        }
    }
    if (dev->nkept < dev->kept_cap)
        dev->kept[dev->nkept++] = buf;
    pthread_mutex_unlock(&dev->lock);
}

/* Frees what td_buffer_free kept, now that the host thread is back. */
static void free_kept(td_device *dev) {
    while (dev->nkept > 0)
        td_buffer_free(dev->kept[--dev->nkept]);
    free(dev->kept);
    dev->kept = NULL;
    dev->kept_cap = 0;
}

size_t td_buffer_size(const td_buffer *buf) {
    return buf ? buf->nbytes : 0;
}

td_device *td_buffer_device(const td_buffer *buf) {
    return buf ? buf->dev : NULL;
}

static td_status check_range(const td_buffer *buf, size_t offset, size_t nbytes, const char *what) {
    if (!buf)
        return td__error(TD_ERR_INVALID_ARG, "%s: buffer is NULL", what);
    if (offset > buf->nbytes || nbytes > buf->nbytes - offset)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s on %s: bytes [%zu, %zu + %zu) lie outside the buffer of %zu bytes",
                         what, buf->dev->name, offset, offset, nbytes, buf->nbytes);
    return TD_OK;
}

typedef struct xfer_args {
    void *dst;
    const void *src;
    void *src_ctx;
    size_t nbytes;
} xfer_args;

/* The copies are traced on the host thread that runs them, the device's. */
static td_status write_task(td_device *dev, void *arg) {
    xfer_args *a = arg;
    uint64_t tr = td__trace_begin();
    td_status st = dev->ops->write(dev->ctx, a->dst, a->src, a->nbytes);
    td__trace_end(tr, TD__TRACE_COPY, "copy HtoD", (int64_t)a->nbytes);
    return st;
}

static td_status read_task(td_device *dev, void *arg) {
    xfer_args *a = arg;
    uint64_t tr = td__trace_begin();
    td_status st = dev->ops->read(dev->ctx, a->dst, a->src, a->nbytes);
    td__trace_end(tr, TD__TRACE_COPY, "copy DtoH", (int64_t)a->nbytes);
    return st;
}

static td_status copy_task(td_device *dev, void *arg) {
    xfer_args *a = arg;
    uint64_t tr = td__trace_begin();
    td_status st = dev->ops->copy(dev->ctx, a->dst, a->src, a->nbytes);
    td__trace_end(tr, TD__TRACE_COPY, "copy DtoD", (int64_t)a->nbytes);
    return st;
}

static td_status peer_task(td_device *dev, void *arg) {
    xfer_args *a = arg;
    uint64_t tr = td__trace_begin();
    td_status st = dev->ops->copy_peer(dev->ctx, a->dst, a->src_ctx, a->src, a->nbytes);
    td__trace_end(tr, TD__TRACE_COPY, "copy peer", (int64_t)a->nbytes);
    return st;
}

td_status td_buffer_write(td_buffer *dst, size_t offset, const void *src, size_t nbytes) {
    xfer_args a;
    td_status st;
    if ((st = check_range(dst, offset, nbytes, "td_buffer_write")) != TD_OK)
        return st;
    if (nbytes == 0)
        return TD_OK;
    if (!src)
        return td__error(TD_ERR_INVALID_ARG, "td_buffer_write: source is NULL");
    a = (xfer_args){(char *)dst->ptr + offset, src, NULL, nbytes};
    return td_device_run(dst->dev, write_task, &a);
}

td_status td_buffer_read(const td_buffer *src, size_t offset, void *dst, size_t nbytes) {
    xfer_args a;
    td_status st;
    if ((st = check_range(src, offset, nbytes, "td_buffer_read")) != TD_OK)
        return st;
    if (nbytes == 0)
        return TD_OK;
    if (!dst)
        return td__error(TD_ERR_INVALID_ARG, "td_buffer_read: destination is NULL");
    a = (xfer_args){dst, (const char *)src->ptr + offset, NULL, nbytes};
    return td_device_run(src->dev, read_task, &a);
}

/* Between devices that cannot reach each other: through host memory, in
 * chunks so that a large copy does not need as much host memory again. */
static td_status copy_staged(td_buffer *dst, size_t doff, const td_buffer *src, size_t soff,
                             size_t nbytes) {
    size_t chunk = nbytes < STAGING_CHUNK ? nbytes : STAGING_CHUNK;
    void *tmp = td__aligned_alloc(chunk, "staging a device-to-device copy");
    td_status st = TD_OK;
    if (!tmp)
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t done = 0; done < nbytes && st == TD_OK; done += chunk) {
        size_t n = nbytes - done < chunk ? nbytes - done : chunk;
        st = td_buffer_read(src, soff + done, tmp, n);
        if (st == TD_OK)
            st = td_buffer_write(dst, doff + done, tmp, n);
    }
    free(tmp);
    return st;
}

td_status td_buffer_copy(td_buffer *dst, size_t dst_offset, const td_buffer *src, size_t src_offset,
                         size_t nbytes) {
    xfer_args a;
    td_status st;
    if ((st = check_range(dst, dst_offset, nbytes, "td_buffer_copy (destination)")) != TD_OK)
        return st;
    if ((st = check_range(src, src_offset, nbytes, "td_buffer_copy (source)")) != TD_OK)
        return st;
    if (nbytes == 0)
        return TD_OK;
    a = (xfer_args){(char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset,
                    src->dev->ctx, nbytes};
    if (dst->dev == src->dev)
        return td_device_run(dst->dev, copy_task, &a);
    if (dst->dev->ops == src->dev->ops && dst->dev->ops->copy_peer)
        return td_device_run(dst->dev, peer_task, &a);
    return copy_staged(dst, dst_offset, src, src_offset, nbytes);
}
