/* The CUDA backend's device context and error translation. Shared by the C
 * files and the .cu kernels, so it includes nothing that C++ cannot read. */
#ifndef TD_BACKEND_CUDA_IMPL_H
#define TD_BACKEND_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "device/kernels.h"

typedef struct cuda_graph cuda_graph;

#define TD_CUDA_MAX_GPUS 64 /* peer access is remembered for GPUs below this */

typedef struct cuda_device {
    int ordinal;         /* the CUDA device number */
    char name[32];       /* tandem's name for messages */
    cudaStream_t stream; /* the device's in-order queue */
    cublasHandle_t blas; /* bound to stream */
    void *blas_ws;       /* cuBLAS's workspace, set explicitly so capture allocates nothing */
    void *scratch;       /* device memory for reductions and im2col, grown on demand */
    size_t scratch_size;

    /* Pinned host staging for write and read: two halves of staging_size / 2
     * bytes, so the CPU fills (or drains) one while the DMA engine works on the
     * other. Allocated on the host thread at first use; NULL when pinning
     * failed (then copies go from pageable memory, as the driver allows). */
    unsigned char *staging;
    size_t staging_size;
    cudaEvent_t staged[2]; /* the last DMA that used each half */
    int staging_failed;    /* cudaHostAlloc failed once: do not retry */

    /* CUDA graphs: the graph being captured on this device's stream, or NULL;
     * how many captured graphs are alive (they hold scratch pointers, so
     * scratch is retired rather than freed while any is); graphs_off is 1
     * when TANDEM_CUDA_GRAPHS=0. */
    cuda_graph *capture;
    int live_graphs;
    int graphs_off;
    void **retired; /* scratch blocks replaced while graphs were alive */
    int nretired, cap_retired;

    /* Copies between GPUs: per peer GPU, 1 direct, -1 staged, 0 not asked
     * yet; peer_off is 1 when TANDEM_CUDA_PEER=0 forces staging. */
    signed char peer[TD_CUDA_MAX_GPUS];
    int peer_off;
    int fp64_off; /* TANDEM_CUDA_FP64=0: present the GPU as having no f64 */
} cuda_device;

/* A result that an op writes to the host. Outside capture the op waits for
 * it; during capture the op copies it into the graph's pinned area instead,
 * and every replay calls finish(cd, d, result) after the graph has run.
 * out0 and out1 are the host destinations given at capture; they must live as
 * long as the graph. */
typedef struct cuda_deferred {
    td_status (*finish)(const cuda_device *cd, const struct cuda_deferred *d, const void *result);
    size_t offset; /* into the graph's pinned area */
    void *out0, *out1;
    int64_t limit; /* for messages: classes, vocabulary size */
} cuda_deferred;

/* During capture: queues a copy of nbytes of device memory src into the
 * graph's pinned area and records d (offset filled in) to be finished after
 * each replay. Fails, and marks the capture failed, when the area is full. */
td_status td__cuda_defer(cuda_device *cd, const void *src, size_t nbytes, const cuda_deferred *d);

/* Device scratch of at least nbytes, valid until the next call. During a
 * capture it cannot grow (that would free memory the graph uses): it fails
 * with TD_ERR_UNSUPPORTED and the capture is abandoned. */
td_status td__cuda_scratch(cuda_device *cd, size_t nbytes, void **out);
/* Frees the scratch blocks retired while graphs were alive. */
void td__cuda_free_retired(cuda_device *cd);

/* The backend table's graph entries (graph.c). */
td_status td__cuda_graph_begin(void *ctx);
td_status td__cuda_graph_end(void *ctx, void **out);
td_status td__cuda_graph_launch(void *ctx, void *graph);
void td__cuda_graph_destroy(void *ctx, void *graph);
/* Ends a capture left open (a closing device): what it recorded is dropped. */
void td__cuda_graph_abandon(cuda_device *cd);
/* Refuses a call that cannot be part of a graph while one is recorded, and
 * marks the capture failed. */
td_status td__cuda_not_while_recording(cuda_device *cd, const char *what);
td_status td__cublas_status(cublasStatus_t st, const char *call, const cuda_device *cd);

/* Turns a CUDA error into a status whose message names the call, the device
 * and CUDA's own words. cudaSuccess gives TD_OK. */
td_status td__cuda_status(cudaError_t err, const char *call, const cuda_device *cd);

#define TD_CUDA_CHECK(call, cd)                                                                    \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            return td__cuda_status(err_, #call, (cd));                                             \
    } while (0)

extern const td_kernels td__cuda_kernels;

#endif
