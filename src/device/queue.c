/* Devices' host threads: the thread each device runs, its in-order queue of
 * tasks (td_device_submit, td_device_run, td_device_sync), the events callers
 * wait on, and the marks a group leaves on a thread it gave up waiting for.
 * Opening and closing devices is in device.c, memory and copies in buffer.c. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/spin.h"
#include "core/trace.h"
#include "device/device-impl.h"

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

void *td__device_thread_main(void *p) {
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

int td_device_busy(const td_device *dev) {
    return dev && (atomic_load(&dev->in_task) ||
                   atomic_load_explicit(&dev->pending, memory_order_acquire));
}

int td__device_is_left_behind(const td_device *dev) {
    return dev && atomic_load(&dev->left_behind);
}

void td__device_left_behind(td_device *dev) {
    if (!dev)
        return;
    pthread_mutex_lock(&dev->lock);
    atomic_store(&dev->left_behind, atomic_load(&dev->in_task));
    pthread_mutex_unlock(&dev->lock);
}
