// What the CUDA kernel files share: launch geometry, status checks, block
// reductions, and the entry points kernels.cu's table takes from the others.
#ifndef TD_BACKEND_CUDA_KERNELS_IMPL_CUH
#define TD_BACKEND_CUDA_KERNELS_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend/cuda/cuda-impl.h"
#include "core/error.h"
}

namespace td_cuda {

constexpr int kThreads = 256;

inline unsigned grid_for(size_t n) {
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

#define GRID_LOOP(i, n)                                                                            \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n);                \
         i += (size_t)gridDim.x * blockDim.x)

inline td_status launched(const cuda_device *cd, const char *what) {
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? TD_OK : td__cuda_status(err, what, cd);
}

inline td_status synced(const cuda_device *cd, const char *what) {
    cudaError_t err = cudaStreamSynchronize(cd->stream);
    return err == cudaSuccess ? TD_OK : td__cuda_status(err, what, cd);
}

inline cuda_device *dev_of(void *ctx) {
    return static_cast<cuda_device *>(ctx);
}

// Sums v over the block (blockDim.x a power of two); every thread gets it.
__device__ inline double block_sum(double v, double *shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    double r = shared[0];
    __syncthreads();
    return r;
}

__device__ inline double block_max(double v, double *shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            shared[threadIdx.x] = fmax(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    double r = shared[0];
    __syncthreads();
    return r;
}

template <typename T> __device__ T dexp(T x);
template <> __device__ inline float dexp(float x) {
    return expf(x);
}
template <> __device__ inline double dexp(double x) {
    return exp(x);
}

template <typename T> __device__ T dcdf(T x);
template <> __device__ inline float dcdf(float x) {
    return 0.5f * erfcf(-x * 0.70710678f);
}
template <> __device__ inline double dcdf(double x) {
    return 0.5 * erfc(-x * 0.70710678118654752440);
}

// kernels.cu
td_status cuda_bias_add(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer, int64_t c,
                        int64_t inner);
td_status cuda_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer, int64_t c,
                         int64_t inner, int acc);
td_status cuda_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                    double beta, void *c, int64_t ldc);

// kernels_nn.cu: layers' kernels
td_status cuda_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                             const void *x, const void *gamma, const void *beta, void *y,
                             void *mean, void *rstd);
td_status cuda_layernorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                             const void *gamma, const void *mean, const void *rstd, const void *dy,
                             void *dx, void *dgamma, void *dbeta, int acc);
td_status cuda_embed_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                         const int32_t *tokens, const void *wte, const void *wpe, void *y);
td_status cuda_embed_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                         const int32_t *tokens, const void *dy, void *dwte, void *dwpe, int acc);
td_status cuda_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                          const void *w, const void *bias, void *y);
td_status cuda_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                          const void *w, const void *dy, void *dx, void *dw, void *db, int acc);
td_status cuda_pool_fwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                        const void *x, void *y, int32_t *argmax);
td_status cuda_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                        const void *dy, const int32_t *argmax, void *dx);
td_status cuda_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                  const void *s, void *p);
td_status cuda_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                  const void *p, const void *dp, void *ds);

// kernels_llama.cu: the Llama family's (see td_kernels)
td_status cuda_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                           const void *x, const void *w, void *y, void *rstd);
td_status cuda_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                           const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                           int acc);
td_status cuda_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu, void *h);
td_status cuda_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                          const void *dh, void *dgu);
td_status cuda_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                    int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                    int inverse, void *x);
td_status cuda_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                         const void *raw, void *qkv);
td_status cuda_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                         const void *dqkv, void *draw);
td_status cuda_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                              const float *x, const void *w, float *y);
td_status cuda_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src, void *dst);
td_status cuda_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                           float scale, const float *q, const void *k, const void *v, int64_t ld,
                           float *y);

} // namespace td_cuda

#endif
