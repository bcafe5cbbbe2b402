/* The CUDA backend: one host thread per GPU that selects the GPU once and
 * queues everything on the device's own stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "backend/cuda/cuda-impl.h"
#include "backend/cuda/cuda.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "device/backend.h"

/* Pinned staging per device unless TANDEM_CUDA_STAGING says otherwise: two
 * halves of 4 MiB, large enough to keep a PCIe DMA engine busy. */
#define STAGING_DEFAULT (8u << 20)
#define STAGING_MIN     (8u << 10)

td_status td__cuda_status(cudaError_t err, const char *call, const cuda_device *cd) {
    td_status st = TD_ERR_DEVICE;
    if (err == cudaSuccess)
        return TD_OK;
    if (err == cudaErrorMemoryAllocation)
        st = TD_ERR_OUT_OF_MEMORY;
    else if (err == cudaErrorInvalidValue)
        st = TD_ERR_INVALID_ARG;
    else if (err == cudaErrorDevicesUnavailable || err == cudaErrorLaunchFailure ||
             err == cudaErrorIllegalAddress)
        st = TD_ERR_DEVICE_LOST;
    return td__error(st, "%s: %s failed: %s (%s)", cd ? cd->name : "cuda", call,
                     cudaGetErrorString(err), cudaGetErrorName(err));
}

td_status td__cublas_status(cublasStatus_t st, const char *call, const cuda_device *cd) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return TD_OK;
    return td__error(st == CUBLAS_STATUS_ALLOC_FAILED ? TD_ERR_OUT_OF_MEMORY : TD_ERR_DEVICE,
                     "%s: %s failed: %s", cd ? cd->name : "cuda", call, cublasGetStatusString(st));
}
/* How many GPUs, or 0 with the runtime's reason in *why. A missing driver is
 * "no GPU", never a failure. */
static int gpu_count(char *why, size_t n) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        if (why)
            snprintf(why, n, "%s", cudaGetErrorString(err));
        return 0;
    }
    if (count == 0 && why)
        snprintf(why, n, "the CUDA runtime reports no device");
    return count;
}

static int cuda_count(void) {
    return gpu_count(NULL, 0);
}

static void cuda_describe(char *buf, size_t n) {
    char why[256] = "";
    int count = gpu_count(why, sizeof why);
    if (count == 0)
        snprintf(buf, n, "cuda: no CUDA device (%s)", why);
    else if (count == 1)
        snprintf(buf, n, "cuda: cuda:0 (1 GPU)");
    else
        snprintf(buf, n, "cuda: cuda:0 ... cuda:%d (%d GPUs)", count - 1, count);
}

static void cuda_close(void *ctx) {
    free(ctx);
}

static td_status add_gpu(td_device_sink *sink, int ordinal, const char *name,
                         const td_device_options *opts) {
    cuda_device *cd = td__calloc(sizeof *cd, "a CUDA device");
    if (!cd)
        return TD_ERR_OUT_OF_MEMORY;
    cd->ordinal = ordinal;
    snprintf(cd->name, sizeof cd->name, "%s", name);
    return td__device_sink_add(sink, &td__cuda_backend, name, cd, opts);
}

/* cuda:N{split=K} presents one GPU as K logical devices named cuda:N/k, each
 * with its own stream and memory budget. */
static td_status add_gpu_split(td_device_sink *sink, int ordinal, const td_device_options *opts) {
    char name[32];
    td_status st;
    int split = opts->has_split ? opts->split : 1;
    if (split == 1) {
        snprintf(name, sizeof name, "cuda:%d", ordinal);
        return add_gpu(sink, ordinal, name, opts);
    }
    for (int k = 0; k < split; k++) {
        snprintf(name, sizeof name, "cuda:%d/%d", ordinal, k);
        if ((st = add_gpu(sink, ordinal, name, opts)) != TD_OK)
            return st;
    }
    return TD_OK;
}

static td_status cuda_open(const td_spec_item *item, td_device_sink *sink) {
    char why[256] = "";
    int count = gpu_count(why, sizeof why);
    td_status st;
    if (item->count != 1)
        return td__error(TD_ERR_INVALID_ARG, "'%s': a GPU is split with {split=N}, not '*N'",
                         item->text);
    if (count == 0)
        return td__error(TD_ERR_NO_DEVICE, "no CUDA device: %s", why);
    if (item->index_kind == TD_SPEC_INDEX_ONE) {
        if (item->index >= count)
            return td__error(TD_ERR_NO_DEVICE, "there is no cuda:%d: this machine has %d GPU%s",
                             item->index, count, count == 1 ? "" : "s");
        return add_gpu_split(sink, item->index, &item->opts);
    }
    for (int i = 0; i < count; i++)
        if ((st = add_gpu_split(sink, i, &item->opts)) != TD_OK)
            return st;
    return TD_OK;
}

/* "8M", "65536": a size in bytes with an optional K, M or G; 0 when unreadable. */
static size_t env_size(const char *name) {
    const char *v = getenv(name);
    char *end;
    unsigned long long n;
    if (!v || !*v)
        return 0;
    n = strtoull(v, &end, 10);
    if (*end == 'K' || *end == 'k')
        n <<= 10;
    else if (*end == 'M' || *end == 'm')
        n <<= 20;
    else if (*end == 'G' || *end == 'g')
        n <<= 30;
    return (size_t)n;
}

static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no"));
}

static td_status thread_init(cuda_device *cd) {
    int major = 0;
    size_t staging = env_size("TANDEM_CUDA_STAGING");
    TD_CUDA_CHECK(cudaSetDevice(cd->ordinal), cd);
    TD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cd->ordinal),
                  cd);
    TD_CUDA_CHECK(cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking), cd);
    /* cuBLAS's own advice: 32 MiB of workspace from Hopper on, 4 MiB before. */
    {
        size_t ws = major >= 9 ? (32u << 20) : (4u << 20);
        cublasStatus_t bs = cublasCreate(&cd->blas);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return td__cublas_status(bs, "cublasCreate", cd);
        if ((bs = cublasSetStream(cd->blas, cd->stream)) != CUBLAS_STATUS_SUCCESS)
            return td__cublas_status(bs, "cublasSetStream", cd);
        /* After cublasSetStream, which resets the workspace to cuBLAS's pool:
         * an explicit workspace means recording a graph allocates nothing. */
        TD_CUDA_CHECK(cudaMalloc(&cd->blas_ws, ws), cd);
        if ((bs = cublasSetWorkspace(cd->blas, cd->blas_ws, ws)) != CUBLAS_STATUS_SUCCESS)
            return td__cublas_status(bs, "cublasSetWorkspace", cd);
        /* TF32 only when asked for: full f32 precision by default. */
        cublasSetMathMode(cd->blas,
                          getenv("TANDEM_TF32") ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    }
    if (staging == 0)
        staging = STAGING_DEFAULT;
    if (staging < STAGING_MIN)
        staging = STAGING_MIN;
    cd->staging_size = staging / 128 * 128; /* two 64-byte aligned halves */
    cd->graphs_off = env_off("TANDEM_CUDA_GRAPHS");
    cd->peer_off = env_off("TANDEM_CUDA_PEER");
    cd->fp64_off = env_off("TANDEM_CUDA_FP64");
    return TD_OK;
}

static void free_staging(cuda_device *cd) {
    for (int i = 0; i < 2; i++)
        if (cd->staged[i])
            cudaEventDestroy(cd->staged[i]);
    if (cd->staging)
        cudaFreeHost(cd->staging);
    cd->staged[0] = cd->staged[1] = NULL;
    cd->staging = NULL;
}

static void cuda_thread_deinit(void *ctx);

/* A failed start releases what it made: the device layer calls thread_deinit
 * only after a successful thread_init. */
static td_status cuda_thread_init(void *ctx) {
    td_status st = thread_init(ctx);
    if (st != TD_OK)
        cuda_thread_deinit(ctx);
    return st;
}

static void cuda_thread_deinit(void *ctx) {
    cuda_device *cd = ctx;
    td__cuda_graph_abandon(cd);
    if (cd->live_graphs > 0)
        TD_LOG_WARN("%s: closed with %d CUDA graph%s not destroyed", cd->name, cd->live_graphs,
                    cd->live_graphs == 1 ? "" : "s");
    if (cd->blas)
        cublasDestroy(cd->blas);
    if (cd->blas_ws)
        cudaFree(cd->blas_ws);
    if (cd->scratch)
        cudaFree(cd->scratch);
    td__cuda_free_retired(cd);
    free(cd->retired);
    free_staging(cd);
    if (cd->stream)
        cudaStreamDestroy(cd->stream);
    cd->blas = NULL;
    cd->blas_ws = NULL;
    cd->scratch = NULL;
    cd->retired = NULL;
    cd->stream = NULL;
}

static int attr(enum cudaDeviceAttr a, int ordinal) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, ordinal) != cudaSuccess)
        return 0;
    return v;
}

static int pci_numa_node(int ordinal) {
    char bus[32], path[128];
    FILE *f;
    int node = -1;
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) != cudaSuccess)
        return -1;
    for (char *p = bus; *p; p++)
        if (*p >= 'A' && *p <= 'F')
            *p = (char)(*p - 'A' + 'a');
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%d", &node) != 1)
            node = -1;
        fclose(f);
    }
    return node;
}

/* f64:f32 throughput by compute capability, for a runtime that does not
 * report it (the CUDA C++ Programming Guide's arithmetic throughput table). */
static double fp64_rate_by_cc(int major, int minor) {
    if ((major == 6 || major == 7 || major == 8) && minor == 0)
        return 0.5; /* P100, V100, A100 */
    if (major == 9 || (major == 10 && minor == 0))
        return 0.5; /* H100, H200, B200 */
    if (major == 6 || major == 7)
        return 1.0 / 32;
    return 1.0 / 64; /* 8.6, 8.9, 12.x: GeForce and workstation parts */
}

static td_status cuda_info(void *ctx, td_device_info *out) {
    cuda_device *cd = ctx;
    struct cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    int drv = 0, count = 0, ratio;
    size_t used = 0;
    TD_CUDA_CHECK(cudaGetDeviceProperties(&prop, cd->ordinal), cd);
    TD_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), cd);
    snprintf(out->model, sizeof out->model, "%s", prop.name);
    snprintf(out->vendor, sizeof out->vendor, "NVIDIA");
    cudaDriverGetVersion(&drv);
    snprintf(out->driver, sizeof out->driver, "CUDA driver %d.%d", drv / 1000, (drv % 1000) / 10);
    out->compute_units = prop.multiProcessorCount;
    out->clock_mhz = attr(cudaDevAttrClockRate, cd->ordinal) / 1000;
    out->mem_total = total_b;
    out->mem_free = free_b;
    /* Every CUDA GPU does IEEE f64, at very different rates (1:2 on data
     * centre parts, 1:64 on most GeForce). TANDEM_CUDA_FP64=0 presents the
     * GPU as one without f64, which is how the refusal is tested on a GPU. */
    ratio = attr(cudaDevAttrSingleToDoublePrecisionPerfRatio, cd->ordinal);
    out->fp64 = !cd->fp64_off;
    out->fp64_rate = ratio > 0 ? 1.0 / ratio : fp64_rate_by_cc(prop.major, prop.minor);
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->numa_node = pci_numa_node(cd->ordinal);
    if (cudaDeviceGetPCIBusId(out->pci_bus_id, sizeof out->pci_bus_id, cd->ordinal) != cudaSuccess)
        out->pci_bus_id[0] = '\0';
    out->local_mem = prop.sharedMemPerBlock;
    out->max_work_group = prop.maxThreadsPerBlock;
    cudaGetDeviceCount(&count);
    out->peers[0] = '\0';
    for (int j = 0; j < count; j++) {
        int can = 0;
        if (j == cd->ordinal || cudaDeviceCanAccessPeer(&can, cd->ordinal, j) != cudaSuccess ||
            !can)
            continue;
        used += (size_t)snprintf(out->peers + used, sizeof out->peers - used, "%scuda:%d",
                                 used ? "," : "", j);
        if (used >= sizeof out->peers)
            break;
    }
    return TD_OK;
}

static td_status cuda_alloc(void *ctx, size_t nbytes, void **ptr) {
    cudaError_t err = cudaMalloc(ptr, nbytes ? nbytes : 1);
    if (err != cudaSuccess) {
        char a[32];
        *ptr = NULL;
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        return td__error(err == cudaErrorMemoryAllocation ? TD_ERR_OUT_OF_MEMORY : TD_ERR_DEVICE,
                         "cudaMalloc of %s failed: %s", td__format_bytes((double)nbytes, a),
                         cudaGetErrorString(err));
    }
    return TD_OK;
}

static void cuda_free(void *ctx, void *ptr) {
    if (ptr)
        cudaFree(ptr);
}

/* The pinned staging buffer, allocated at first use on the host thread. When
 * pinning fails (a locked-memory limit) copies go from pageable memory; that
 * is said once. */
static void staging_get(cuda_device *cd) {
    cudaError_t err;
    char a[32];
    if (cd->staging || cd->staging_failed)
        return;
    err = cudaHostAlloc((void **)&cd->staging, cd->staging_size, cudaHostAllocDefault);
    for (int i = 0; i < 2 && err == cudaSuccess; i++)
        err = cudaEventCreateWithFlags(&cd->staged[i], cudaEventDisableTiming);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        free_staging(cd);
        cd->staging_failed = 1;
        TD_LOG_WARN("%s: cannot pin %s of host memory for staging copies (%s); copying from "
                    "pageable memory",
                    cd->name, td__format_bytes((double)cd->staging_size, a),
                    cudaGetErrorString(err));
    }
}

/* One copy on the device's stream, waited for: the pageable fallback of the
 * host copies and the copy within a device. */
static td_status copy_and_wait(cuda_device *cd, void *dst, const void *src, size_t nbytes,
                               enum cudaMemcpyKind kind) {
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, cd->stream), cd);
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

/* Host to device through the staging buffer, a half at a time: the CPU fills
 * one half while the DMA engine empties the other. */
static td_status cuda_write(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    size_t half;
    if (cd->capture)
        return td__cuda_not_while_recording(cd, "a copy from the host");
    staging_get(cd);
    if (!cd->staging)
        return copy_and_wait(cd, dst, src, nbytes, cudaMemcpyHostToDevice);
    half = cd->staging_size / 2;
    for (size_t done = 0, k = 0; done < nbytes; done += half, k ^= 1) {
        size_t n = nbytes - done < half ? nbytes - done : half;
        unsigned char *buf = cd->staging + k * half;
        /* The DMA that last read this half must be over before it is refilled
         * (an event never recorded counts as done). */
        TD_CUDA_CHECK(cudaEventSynchronize(cd->staged[k]), cd);
        memcpy(buf, (const char *)src + done, n);
        TD_CUDA_CHECK(
            cudaMemcpyAsync((char *)dst + done, buf, n, cudaMemcpyHostToDevice, cd->stream), cd);
        TD_CUDA_CHECK(cudaEventRecord(cd->staged[k], cd->stream), cd);
    }
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

/* Device to host through the staging buffer: chunk i lands in half i % 2
 * while the CPU copies chunk i - 1 out of the other half. */
static td_status cuda_read(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    size_t half, chunks;
    if (cd->capture)
        return td__cuda_not_while_recording(cd, "a copy to the host");
    staging_get(cd);
    if (!cd->staging)
        return copy_and_wait(cd, dst, src, nbytes, cudaMemcpyDeviceToHost);
    half = cd->staging_size / 2;
    chunks = (nbytes + half - 1) / half;
    for (size_t i = 0; i <= chunks; i++) {
        if (i < chunks) {
            /* Half i % 2 was emptied at step i - 1, when chunk i - 2 was copied out. */
            size_t off = i * half, n = nbytes - off < half ? nbytes - off : half;
            unsigned char *buf = cd->staging + (i & 1) * half;
            TD_CUDA_CHECK(cudaMemcpyAsync(buf, (const char *)src + off, n, cudaMemcpyDeviceToHost,
                                          cd->stream),
                          cd);
            TD_CUDA_CHECK(cudaEventRecord(cd->staged[i & 1], cd->stream), cd);
        }
        if (i > 0) {
            size_t j = i - 1, off = j * half, n = nbytes - off < half ? nbytes - off : half;
            TD_CUDA_CHECK(cudaEventSynchronize(cd->staged[j & 1]), cd);
            memcpy((char *)dst + off, cd->staging + (j & 1) * half, n);
        }
    }
    return TD_OK;
}

static td_status cuda_copy(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    if (cd->capture)
        return td__cuda_not_while_recording(cd, "a synchronous copy");
    return copy_and_wait(cd, dst, src, nbytes, cudaMemcpyDeviceToDevice);
}

/* 1 when this device's context may read GPU `peer` directly, enabling the
 * access the first time (access is per context, so a logical device on the
 * same GPU may have enabled it already). Remembered per peer. */
static td_status peer_access(cuda_device *d, int peer, int *direct) {
    int can = 0;
    cudaError_t err;
    *direct = 0;
    if (peer < TD_CUDA_MAX_GPUS && d->peer[peer]) {
        *direct = d->peer[peer] > 0;
        return TD_OK;
    }
    TD_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d->ordinal, peer), d);
    if (can) {
        err = cudaDeviceEnablePeerAccess(peer, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {
            cudaGetLastError();
            err = cudaSuccess;
        }
        if (err != cudaSuccess) {
            /* A limit on peer mappings: stage instead. */
            cudaGetLastError();
            TD_LOG_INFO("%s: peer access to cuda:%d not enabled (%s); copies are staged", d->name,
                        peer, cudaGetErrorString(err));
            can = 0;
        }
    }
    if (peer < TD_CUDA_MAX_GPUS)
        d->peer[peer] = can ? 1 : -1;
    *direct = can;
    return TD_OK;
}

/* Runs on the destination's host thread. The source's stream may still be
 * computing what is copied, so it is waited for first (waiting on another
 * device's stream is allowed from any thread; nothing is queued on it). Then:
 * within one GPU (logical devices) a plain device copy; between GPUs with
 * peer access cudaMemcpyPeerAsync; otherwise through this device's pinned
 * staging buffer, each chunk read from the source and written here on this
 * stream, the two halves alternating (stream order keeps a half from being
 * refilled before its write is done). TANDEM_CUDA_PEER=0 forces staging, which
 * is how the tests reach it on one GPU. */
static td_status cuda_copy_peer(void *dst_ctx, void *dst, void *src_ctx, const void *src,
                                size_t nbytes) {
    cuda_device *d = dst_ctx, *s = src_ctx;
    int direct = 0;
    size_t half;
    td_status st;
    if (d->capture)
        return td__cuda_not_while_recording(d, "a copy between devices");
    TD_CUDA_CHECK(cudaStreamSynchronize(s->stream), s);
    if (!d->peer_off) {
        if (d->ordinal == s->ordinal)
            direct = 1;
        else if ((st = peer_access(d, s->ordinal, &direct)) != TD_OK)
            return st;
    }
    if (direct) {
        if (d->ordinal == s->ordinal)
            TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, d->stream),
                          d);
        else
            TD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, d->ordinal, src, s->ordinal, nbytes, d->stream),
                          d);
        TD_CUDA_CHECK(cudaStreamSynchronize(d->stream), d);
        return TD_OK;
    }
    staging_get(d);
    if (!d->staging) {
        /* No pinned memory: the runtime stages the copy itself. */
        TD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, d->ordinal, src, s->ordinal, nbytes, d->stream), d);
        TD_CUDA_CHECK(cudaStreamSynchronize(d->stream), d);
        return TD_OK;
    }
    half = d->staging_size / 2;
    for (size_t done = 0, k = 0; done < nbytes; done += half, k ^= 1) {
        size_t n = nbytes - done < half ? nbytes - done : half;
        unsigned char *buf = d->staging + k * half;
        /* Unified addressing tells the runtime which GPU src lives on. */
        TD_CUDA_CHECK(
            cudaMemcpyAsync(buf, (const char *)src + done, n, cudaMemcpyDefault, d->stream), d);
        TD_CUDA_CHECK(
            cudaMemcpyAsync((char *)dst + done, buf, n, cudaMemcpyHostToDevice, d->stream), d);
    }
    TD_CUDA_CHECK(cudaStreamSynchronize(d->stream), d);
    return TD_OK;
}

static td_status cuda_sync(void *ctx) {
    cuda_device *cd = ctx;
    if (cd->capture)
        return td__cuda_not_while_recording(cd, "waiting for the device");
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

/* For the layers above (cuda.h) ------------------------------------------- */

static cuda_device *cuda_of(const td_device *dev) {
    return td__device_backend_ctx(dev, &td__cuda_backend);
}

int td__cuda_ordinal(const td_device *dev) {
    const cuda_device *cd = cuda_of(dev);
    return cd ? cd->ordinal : -1;
}

void *td__cuda_stream(const td_device *dev) {
    const cuda_device *cd = cuda_of(dev);
    return cd ? (void *)cd->stream : NULL;
}

td_status td__cuda_select(const td_device *dev) {
    const cuda_device *cd = cuda_of(dev);
    if (!cd)
        return td__error(TD_ERR_INVALID_ARG, "%s is not a CUDA device", td_device_name(dev));
    TD_CUDA_CHECK(cudaSetDevice(cd->ordinal), cd);
    return TD_OK;
}

td_status td__cuda_stream_query(const td_device *dev) {
    const cuda_device *cd = cuda_of(dev);
    cudaError_t err;
    if (!cd)
        return td__error(TD_ERR_INVALID_ARG, "%s is not a CUDA device", td_device_name(dev));
    err = cudaStreamQuery(cd->stream);
    if (err == cudaErrorNotReady)
        return TD_IN_PROGRESS;
    return td__cuda_status(err, "cudaStreamQuery", cd);
}

const td_backend_ops td__cuda_backend = {
    .api_version = TD_BACKEND_API_VERSION,
    .name = "cuda",
    .caps = TD_DEVICE_CAP_ASYNC_COPY | TD_DEVICE_CAP_AUTO | TD_DEVICE_CAP_NCCL,
    .describe = cuda_describe,
    .count = cuda_count,
    .open = cuda_open,
    .close = cuda_close,
    .thread_init = cuda_thread_init,
    .thread_deinit = cuda_thread_deinit,
    .info = cuda_info,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .write = cuda_write,
    .read = cuda_read,
    .copy = cuda_copy,
    .copy_peer = cuda_copy_peer,
    .sync = cuda_sync,
    .kernels = &td__cuda_kernels,
    .graph_begin = td__cuda_graph_begin,
    .graph_end = td__cuda_graph_end,
    .graph_launch = td__cuda_graph_launch,
    .graph_destroy = td__cuda_graph_destroy,
};
