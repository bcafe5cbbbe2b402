/* The CUDA backend: one host thread per GPU that selects the GPU once and
 * queues everything on the device's own stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "device/device-impl.h"

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

/* How many GPUs, or 0 with the runtime's reason in *why. A missing driver is
 * "no GPU", never a failure. */
td_status td__cublas_status(cublasStatus_t st, const char *call, const cuda_device *cd) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return TD_OK;
    return td__error(st == CUBLAS_STATUS_ALLOC_FAILED ? TD_ERR_OUT_OF_MEMORY : TD_ERR_DEVICE,
                     "%s: %s failed: %s", cd ? cd->name : "cuda", call, cublasGetStatusString(st));
}

td_status td__cuda_scratch(cuda_device *cd, size_t nbytes, void **out) {
    if (nbytes > cd->scratch_size) {
        size_t want = nbytes < 2 * cd->scratch_size ? 2 * cd->scratch_size : nbytes;
        if (cd->scratch)
            cudaFree(cd->scratch);
        cd->scratch = NULL;
        cd->scratch_size = 0;
        TD_CUDA_CHECK(cudaMalloc(&cd->scratch, want), cd);
        cd->scratch_size = want;
    }
    *out = cd->scratch;
    return TD_OK;
}

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

static td_status cuda_thread_init(void *ctx) {
    cuda_device *cd = ctx;
    TD_CUDA_CHECK(cudaSetDevice(cd->ordinal), cd);
    TD_CUDA_CHECK(cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking), cd);
    {
        cublasStatus_t bs = cublasCreate(&cd->blas);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return td__cublas_status(bs, "cublasCreate", cd);
        if ((bs = cublasSetStream(cd->blas, cd->stream)) != CUBLAS_STATUS_SUCCESS)
            return td__cublas_status(bs, "cublasSetStream", cd);
        /* TF32 only when asked for: full f32 precision by default. */
        cublasSetMathMode(cd->blas,
                          getenv("TANDEM_TF32") ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    }
    return TD_OK;
}

static void cuda_thread_deinit(void *ctx) {
    cuda_device *cd = ctx;
    if (cd->blas)
        cublasDestroy(cd->blas);
    if (cd->scratch)
        cudaFree(cd->scratch);
    if (cd->stream)
        cudaStreamDestroy(cd->stream);
    cd->blas = NULL;
    cd->scratch = NULL;
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
    ratio = attr(cudaDevAttrSingleToDoublePrecisionPerfRatio, cd->ordinal);
    out->fp64 = 1;
    out->fp64_rate = ratio > 0 ? 1.0 / ratio : 0;
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->numa_node = pci_numa_node(cd->ordinal);
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

static td_status cuda_write(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, cd->stream), cd);
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

static td_status cuda_read(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, cd->stream), cd);
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

static td_status cuda_copy(void *ctx, void *dst, const void *src, size_t nbytes) {
    cuda_device *cd = ctx;
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cd->stream), cd);
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

/* cudaMemcpyPeerAsync uses the peer path where the pair allows it and stages
 * through the host by itself where it does not. */
static td_status cuda_copy_peer(void *dst_ctx, void *dst, void *src_ctx, const void *src,
                                size_t nbytes) {
    cuda_device *d = dst_ctx, *s = src_ctx;
    TD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, d->ordinal, src, s->ordinal, nbytes, d->stream), d);
    TD_CUDA_CHECK(cudaStreamSynchronize(d->stream), d);
    return TD_OK;
}

static td_status cuda_sync(void *ctx) {
    cuda_device *cd = ctx;
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    return TD_OK;
}

const td_backend_ops td__cuda_backend = {
    .api_version = TD_BACKEND_API_VERSION,
    .name = "cuda",
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
};
