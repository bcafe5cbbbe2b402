/* The OpenCL backend: devices named opencl:P.D (platform, device), each with
 * its own context and in-order queue, driven only by its host thread. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "backend/opencl/opencl-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

#define MAX_PLATFORMS            16
#define MAX_DEVICES_PER_PLATFORM 64

const char *td__ocl_error_name(cl_int err) {
    switch (err) {
#define E(x)                                                                                       \
    case x: return #x;
        E(CL_DEVICE_NOT_FOUND)
        E(CL_DEVICE_NOT_AVAILABLE)
        E(CL_COMPILER_NOT_AVAILABLE)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        E(CL_OUT_OF_RESOURCES)
        E(CL_OUT_OF_HOST_MEMORY)
        E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_INVALID_VALUE)
        E(CL_INVALID_DEVICE)
        E(CL_INVALID_CONTEXT)
        E(CL_INVALID_COMMAND_QUEUE)
        E(CL_INVALID_MEM_OBJECT)
        E(CL_INVALID_PROGRAM)
        E(CL_INVALID_PROGRAM_EXECUTABLE)
        E(CL_INVALID_KERNEL_NAME)
        E(CL_INVALID_KERNEL)
        E(CL_INVALID_ARG_INDEX)
        E(CL_INVALID_ARG_VALUE)
        E(CL_INVALID_ARG_SIZE)
        E(CL_INVALID_KERNEL_ARGS)
        E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE)
        E(CL_INVALID_BUFFER_SIZE)
        E(CL_INVALID_PLATFORM)
        E(CL_INVALID_OPERATION)
        E(CL_INVALID_DEVICE_PARTITION_COUNT)
        E(CL_DEVICE_PARTITION_FAILED)
        E(CL_MEM_COPY_OVERLAP)
        E(CL_COMPILE_PROGRAM_FAILURE)
        E(CL_LINK_PROGRAM_FAILURE)
        E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        E(CL_INVALID_DEVICE_TYPE)
        E(CL_INVALID_QUEUE_PROPERTIES)
        E(CL_INVALID_HOST_PTR)
        E(CL_INVALID_BINARY)
        E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_KERNEL_DEFINITION)
        E(CL_INVALID_WORK_DIMENSION)
        E(CL_INVALID_GLOBAL_OFFSET)
        E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_EVENT)
        E(CL_INVALID_GLOBAL_WORK_SIZE)
        E(CL_INVALID_COMPILER_OPTIONS)
        E(CL_INVALID_LINKER_OPTIONS)
#undef E
    }
    return "CL_UNKNOWN_ERROR";
}

td_status td__ocl_status(cl_int err, const char *call, const ocl_device *od) {
    td_status st = TD_ERR_DEVICE;
    if (err == CL_SUCCESS)
        return TD_OK;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY ||
        err == CL_OUT_OF_RESOURCES)
        st = TD_ERR_OUT_OF_MEMORY;
    else if (err == CL_DEVICE_NOT_AVAILABLE)
        st = TD_ERR_DEVICE_LOST;
    return td__error(st, "%s: %s failed: %s (%d)", od ? od->name : "opencl", call,
                     td__ocl_error_name(err), (int)err);
}

/* Discovery ----------------------------------------------------------------- */

typedef struct ocl_platforms {
    cl_uint nplat;
    cl_platform_id plat[MAX_PLATFORMS];
    cl_uint ndev[MAX_PLATFORMS];
    cl_device_id dev[MAX_PLATFORMS][MAX_DEVICES_PER_PLATFORM];
} ocl_platforms;

/* Lists platforms and devices, or returns 0 with the reason in why. */
static int discover(ocl_platforms *p, char *why, size_t n) {
    cl_int err;
    int total = 0;
    memset(p, 0, sizeof *p);
    err = clGetPlatformIDs(MAX_PLATFORMS, p->plat, &p->nplat);
    if (err != CL_SUCCESS || p->nplat == 0) {
        if (why)
            snprintf(why, n, "no OpenCL platform (%s)",
                     err == CL_SUCCESS ? "none installed" : td__ocl_error_name(err));
        p->nplat = 0;
        return 0;
    }
    for (cl_uint i = 0; i < p->nplat; i++) {
        if (clGetDeviceIDs(p->plat[i], CL_DEVICE_TYPE_ALL, MAX_DEVICES_PER_PLATFORM, p->dev[i],
                           &p->ndev[i]) != CL_SUCCESS)
            p->ndev[i] = 0;
        if (p->ndev[i] > MAX_DEVICES_PER_PLATFORM)
            p->ndev[i] = MAX_DEVICES_PER_PLATFORM;
        total += (int)p->ndev[i];
    }
    if (total == 0 && why)
        snprintf(why, n, "OpenCL platforms have no device");
    return total;
}

static int ocl_count(void) {
    ocl_platforms p;
    return discover(&p, NULL, 0);
}

static void ocl_describe(char *buf, size_t n) {
    ocl_platforms p;
    char why[128];
    size_t used;
    if (!discover(&p, why, sizeof why)) {
        snprintf(buf, n, "opencl: none (%s)", why);
        return;
    }
    used = (size_t)snprintf(buf, n, "opencl:");
    for (cl_uint i = 0; i < p.nplat; i++)
        for (cl_uint d = 0; d < p.ndev[i] && used + 1 < n; d++)
            used += (size_t)snprintf(buf + used, n - used, " opencl:%u.%u", i, d);
}

static void ocl_close(void *ctx) {
    ocl_device *od = ctx;
    if (!od)
        return;
    if (od->is_sub_device && od->device)
        clReleaseDevice(od->device);
    free(od->allocs);
    free(od);
}

static int device_has_fp64(cl_device_id d) {
    char ext[4096] = "";
    clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
    return strstr(ext, "cl_khr_fp64") != NULL;
}

static td_status add_device(td_device_sink *sink, const char *name, cl_platform_id plat,
                            cl_device_id dev, int sub, const td_device_options *opts) {
    ocl_device *od = td__calloc(sizeof *od, "an OpenCL device");
    if (!od) {
        if (sub)
            clReleaseDevice(dev);
        return TD_ERR_OUT_OF_MEMORY;
    }
    snprintf(od->name, sizeof od->name, "%s", name);
    od->platform = plat;
    od->device = dev;
    od->is_sub_device = sub;
    od->fp64 = device_has_fp64(dev);
    return td__device_sink_add(sink, &td__opencl_backend, name, od, opts);
}

/* opencl:P.D{split=K}: K sub-devices of equal compute units, opencl:P.D/k. */
static td_status add_split(td_device_sink *sink, cl_platform_id plat, cl_device_id dev, unsigned p,
                           unsigned d, const td_device_options *opts) {
    char name[32];
    cl_uint cu = 0, got = 0;
    cl_device_id subs[64];
    cl_device_partition_property props[3] = {CL_DEVICE_PARTITION_EQUALLY, 0, 0};
    td_status st;
    cl_int err;
    int k = opts->has_split ? opts->split : 1;
    if (k == 1) {
        snprintf(name, sizeof name, "opencl:%u.%u", p, d);
        return add_device(sink, name, plat, dev, 0, opts);
    }
    clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    if (cu < (cl_uint)k)
        return td__error(TD_ERR_UNSUPPORTED,
                         "opencl:%u.%u has %u compute units and cannot be split into %d", p, d, cu,
                         k);
    props[1] = (cl_device_partition_property)(cu / (cl_uint)k);
    err = clCreateSubDevices(dev, props, 64, subs, &got);
    if (err != CL_SUCCESS)
        return td__error(TD_ERR_UNSUPPORTED, "opencl:%u.%u: clCreateSubDevices failed: %s", p, d,
                         td__ocl_error_name(err));
    for (cl_uint i = 0; i < got; i++) {
        if ((int)i >= k) {
            clReleaseDevice(subs[i]); /* equal parts may leave a remainder device */
            continue;
        }
        snprintf(name, sizeof name, "opencl:%u.%u/%u", p, d, i);
        if ((st = add_device(sink, name, plat, subs[i], 1, opts)) != TD_OK) {
            for (cl_uint j = i + 1; j < got; j++)
                clReleaseDevice(subs[j]);
            return st;
        }
    }
    return TD_OK;
}

static td_status ocl_open(const td_spec_item *item, td_device_sink *sink) {
    ocl_platforms p;
    char why[128];
    td_status st;
    if (item->count != 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "'%s': an OpenCL device is split with {split=N}, not '*N'", item->text);
    if (!discover(&p, why, sizeof why))
        return td__error(TD_ERR_NO_DEVICE, "no OpenCL device: %s", why);
    if (item->index_kind == TD_SPEC_INDEX_ONE) {
        unsigned pi = (unsigned)item->index,
                 di = item->sub_index < 0 ? 0u : (unsigned)item->sub_index;
        if (pi >= p.nplat || di >= p.ndev[pi])
            return td__error(TD_ERR_NO_DEVICE, "there is no opencl:%u.%u", pi, di);
        return add_split(sink, p.plat[pi], p.dev[pi][di], pi, di, &item->opts);
    }
    for (cl_uint i = 0; i < p.nplat; i++)
        for (cl_uint d = 0; d < p.ndev[i]; d++)
            if ((st = add_split(sink, p.plat[i], p.dev[i][d], i, d, &item->opts)) != TD_OK)
                return st;
    return TD_OK;
}

/* The host thread ----------------------------------------------------------- */

static td_status ocl_thread_init(void *ctx) {
    ocl_device *od = ctx;
    cl_int err;
    cl_context_properties props[3] = {CL_CONTEXT_PLATFORM, (cl_context_properties)od->platform, 0};
    od->context = clCreateContext(props, 1, &od->device, NULL, NULL, &err);
    TD_OCL_CHECK(err, od);
    od->queue = clCreateCommandQueue(od->context, od->device, 0, &err);
    TD_OCL_CHECK(err, od);
    return TD_OK;
}

static void ocl_thread_deinit(void *ctx) {
    ocl_device *od = ctx;
    if (od->queue)
        clFinish(od->queue);
    td__ocl_release_programs(od);
    for (size_t i = 0; i < od->nallocs; i++)
        clReleaseMemObject(od->allocs[i].mem);
    od->nallocs = 0;
    if (od->queue)
        clReleaseCommandQueue(od->queue);
    if (od->context)
        clReleaseContext(od->context);
    od->queue = NULL;
    od->context = NULL;
}

static td_status ocl_info(void *ctx, td_device_info *out) {
    ocl_device *od = ctx;
    cl_uint cu = 0, clock = 0;
    cl_ulong gmem = 0, lmem = 0;
    size_t wg = 0;
    char ver[64] = "";
    clGetDeviceInfo(od->device, CL_DEVICE_NAME, sizeof out->model, out->model, NULL);
    clGetDeviceInfo(od->device, CL_DEVICE_VENDOR, sizeof out->vendor, out->vendor, NULL);
    clGetDeviceInfo(od->device, CL_DRIVER_VERSION, sizeof ver, ver, NULL);
    snprintf(out->driver, sizeof out->driver, "OpenCL driver %s", ver);
    clGetDeviceInfo(od->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    clGetDeviceInfo(od->device, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof clock, &clock, NULL);
    clGetDeviceInfo(od->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gmem, &gmem, NULL);
    clGetDeviceInfo(od->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
    clGetDeviceInfo(od->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    out->compute_units = (int)cu;
    out->clock_mhz = (int)clock;
    out->mem_total = gmem;
    /* OpenCL does not report free memory: what tandem has not allocated. */
    {
        uint64_t used = 0;
        for (size_t i = 0; i < od->nallocs; i++)
            used += od->allocs[i].nbytes;
        out->mem_free = gmem > used ? gmem - used : 0;
    }
    out->local_mem = lmem;
    out->max_work_group = (int)wg;
    out->fp64 = od->fp64;
    snprintf(out->compact_kernels, sizeof out->compact_kernels,
             "q8_0: OpenCL C int8 block sums; bf16: OpenCL C exact products");
    out->numa_node = -1;
    return TD_OK;
}

/* Memory -------------------------------------------------------------------- */

/* Virtual addresses start high and never come back: 2^44 leaves room for
 * 16 TiB of allocations per process, page-aligned with a guard page. */
static atomic_uintptr_t next_va = (uintptr_t)1 << 44;

static size_t find_alloc(const ocl_device *od, uintptr_t p) {
    size_t lo = 0, hi = od->nallocs;
    while (lo < hi) { /* the last allocation whose base <= p */
        size_t mid = (lo + hi) / 2;
        if (od->allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo; /* index + 1 of the candidate, 0 when none */
}

td_status td__ocl_resolve(const ocl_device *od, const void *ptr, cl_mem *mem, size_t *offset) {
    uintptr_t p = (uintptr_t)ptr;
    size_t i = find_alloc(od, p);
    if (i > 0 && p - od->allocs[i - 1].base <= od->allocs[i - 1].nbytes) {
        *mem = od->allocs[i - 1].mem;
        *offset = p - od->allocs[i - 1].base;
        return TD_OK;
    }
    return td__error(TD_ERR_INVALID_ARG, "%s: pointer %p is not device memory of this device",
                     od->name, ptr);
}

static td_status ocl_alloc(void *ctx, size_t nbytes, void **ptr) {
    ocl_device *od = ctx;
    cl_int err;
    cl_mem mem = NULL;
    size_t span = ((nbytes + 4095) & ~(size_t)4095) + 4096;
    uintptr_t base;
    size_t at;
    *ptr = NULL;
    mem = clCreateBuffer(od->context, CL_MEM_READ_WRITE, nbytes ? nbytes : 4, NULL, &err);
    if (err != CL_SUCCESS) {
        char a[32];
        return td__error(TD_ERR_OUT_OF_MEMORY, "clCreateBuffer of %s failed: %s",
                         td__format_bytes((double)nbytes, a), td__ocl_error_name(err));
    }
    if (od->nallocs == od->cap) {
        size_t cap = od->cap ? od->cap * 2 : 64;
        ocl_range *grown = realloc(od->allocs, cap * sizeof *grown);
        if (!grown) {
            clReleaseMemObject(mem);
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory tracking OpenCL buffers");
        }
        od->allocs = grown;
        od->cap = cap;
    }
    base = atomic_fetch_add(&next_va, span);
    at = find_alloc(od, base);
    memmove(od->allocs + at + 1, od->allocs + at, (od->nallocs - at) * sizeof *od->allocs);
    od->allocs[at] = (ocl_range){base, nbytes, mem};
    od->nallocs++;
    *ptr = (void *)base;
    return TD_OK;
}

static void ocl_free(void *ctx, void *ptr) {
    ocl_device *od = ctx;
    size_t i = find_alloc(od, (uintptr_t)ptr);
    if (!ptr || i == 0 || od->allocs[i - 1].base != (uintptr_t)ptr)
        return;
    clReleaseMemObject(od->allocs[i - 1].mem);
    memmove(od->allocs + i - 1, od->allocs + i, (od->nallocs - i) * sizeof *od->allocs);
    od->nallocs--;
}

static td_status ocl_write(void *ctx, void *dst, const void *src, size_t nbytes) {
    ocl_device *od = ctx;
    cl_mem mem = NULL;
    size_t off = 0;
    td_status st;
    if ((st = td__ocl_resolve(od, dst, &mem, &off)) != TD_OK)
        return st;
    TD_OCL_CHECK(clEnqueueWriteBuffer(od->queue, mem, CL_TRUE, off, nbytes, src, 0, NULL, NULL),
                 od);
    return TD_OK;
}

static td_status ocl_read(void *ctx, void *dst, const void *src, size_t nbytes) {
    ocl_device *od = ctx;
    cl_mem mem = NULL;
    size_t off = 0;
    td_status st;
    if ((st = td__ocl_resolve(od, src, &mem, &off)) != TD_OK)
        return st;
    TD_OCL_CHECK(clEnqueueReadBuffer(od->queue, mem, CL_TRUE, off, nbytes, dst, 0, NULL, NULL), od);
    return TD_OK;
}

static td_status ocl_copy(void *ctx, void *dst, const void *src, size_t nbytes) {
    ocl_device *od = ctx;
    cl_mem dm = NULL, sm = NULL;
    size_t doff = 0, soff = 0;
    td_status st;
    if ((st = td__ocl_resolve(od, dst, &dm, &doff)) != TD_OK ||
        (st = td__ocl_resolve(od, src, &sm, &soff)) != TD_OK)
        return st;
    TD_OCL_CHECK(clEnqueueCopyBuffer(od->queue, sm, dm, soff, doff, nbytes, 0, NULL, NULL), od);
    TD_OCL_CHECK(clFinish(od->queue), od);
    return TD_OK;
}

static td_status ocl_sync(void *ctx) {
    ocl_device *od = ctx;
    TD_OCL_CHECK(clFinish(od->queue), od);
    return TD_OK;
}

const td_backend_ops td__opencl_backend = {
    .api_version = TD_BACKEND_API_VERSION,
    .name = "opencl",
    .caps = TD_DEVICE_CAP_ASYNC_COPY | TD_DEVICE_CAP_SUB_DEVICES,
    .describe = ocl_describe,
    .count = ocl_count,
    .open = ocl_open,
    .close = ocl_close,
    .thread_init = ocl_thread_init,
    .thread_deinit = ocl_thread_deinit,
    .info = ocl_info,
    .alloc = ocl_alloc,
    .free = ocl_free,
    .write = ocl_write,
    .read = ocl_read,
    .copy = ocl_copy,
    .copy_peer = NULL, /* separate contexts: staged through the host */
    .sync = ocl_sync,
    .kernels = &td__opencl_kernels,
};
