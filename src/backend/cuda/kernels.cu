// CUDA kernels of the td_kernels table. Launched on the device's stream by
// its host thread; errors come back as statuses naming the kernel.
#include <cuda_runtime.h>

extern "C" {
#include "backend/cuda/cuda-impl.h"
#include "core/error.h"
}
#include "core/philox.h"

namespace {

template <typename T> __global__ void fill_kernel(T *x, size_t n, T v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

template <typename T>
__global__ void rng_kernel(T *x, size_t n, int normal, uint64_t seed, uint64_t offset, double a,
                           double b) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = normal ? a + b * td__rng_normal_at(seed, offset + i)
                          : a + (b - a) * td__rng_uniform_at(seed, offset + i);
        x[i] = (T)v;
    }
}

unsigned grid_for(size_t n) {
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

td_status launched(const cuda_device *cd, const char *what) {
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? TD_OK : td__cuda_status(err, what, cd);
}

td_status cuda_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    cuda_device *cd = (cuda_device *)ctx;
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        fill_kernel<float><<<grid_for(n), 256, 0, cd->stream>>>((float *)x, n, (float)value);
    else
        fill_kernel<double><<<grid_for(n), 256, 0, cd->stream>>>((double *)x, n, value);
    return launched(cd, "fill kernel");
}

td_status cuda_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                   uint64_t offset, double a, double b) {
    cuda_device *cd = (cuda_device *)ctx;
    int normal = kind == TD_RNG_NORMAL;
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        rng_kernel<float>
            <<<grid_for(n), 256, 0, cd->stream>>>((float *)x, n, normal, seed, offset, a, b);
    else
        rng_kernel<double>
            <<<grid_for(n), 256, 0, cd->stream>>>((double *)x, n, normal, seed, offset, a, b);
    return launched(cd, "rng kernel");
}

} // namespace

extern "C" const td_kernels td__cuda_kernels = {
    cuda_fill,
    cuda_rng,
};
