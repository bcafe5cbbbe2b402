/* The CUDA backend's device context and error translation. Shared by the C
 * files and the .cu kernels, so it includes nothing that C++ cannot read. */
#ifndef TD_BACKEND_CUDA_IMPL_H
#define TD_BACKEND_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "device/kernels.h"

typedef struct cuda_device {
    int ordinal;         /* the CUDA device number */
    char name[32];       /* tandem's name for messages */
    cudaStream_t stream; /* the device's in-order queue */
    cublasHandle_t blas; /* bound to stream */
    void *scratch;       /* device memory for reductions and im2col, grown on demand */
    size_t scratch_size;
} cuda_device;

/* Device scratch of at least nbytes, valid until the next call. */
td_status td__cuda_scratch(cuda_device *cd, size_t nbytes, void **out);
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
