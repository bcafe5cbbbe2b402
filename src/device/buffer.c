/* Device memory: allocation against each device's budget, freeing (kept
 * until close while the host thread may still use it), and the copies host
 * to device, device to host and device to device (peer or staged). */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/trace.h"
#include "device/device-impl.h"

#define STAGING_CHUNK (64u << 20)

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
    if ((td_device_current() == dev || !atomic_load(&dev->left_behind)) &&
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

void td__device_free_kept(td_device *dev) {
    while (dev->nkept > 0)
        td_buffer_free(dev->kept[--dev->nkept]);
    free(dev->kept);
    dev->kept = NULL;
    dev->kept_cap = 0;
}

void *td__buffer_ptr(const td_buffer *buf) {
    return buf ? buf->ptr : NULL;
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
    if (!td_buffer_copy_is_direct(dst->dev, src->dev))
        return copy_staged(dst, dst_offset, src, src_offset, nbytes);
    return td_device_run(dst->dev, dst->dev == src->dev ? copy_task : peer_task, &a);
}

int td_buffer_copy_is_direct(const td_device *dst, const td_device *src) {
    return dst && src && (dst == src || (dst->ops == src->ops && dst->ops->copy_peer));
}
