// CUDA kernels of the Llama family: RMSNorm, the SwiGLU gate, rotary
// positions and grouped-query heads (see td_kernels). Sums in double, as
// kernels_nn.cu's layer norm; the weight gradient one thread per column in
// row order, so results are repeatable.
#include "backend/cuda/kernels-impl.cuh"

namespace td_cuda {

// RMSNorm -------------------------------------------------------------------------------

template <typename T>
__global__ void rms_fwd_k(int64_t cols, double eps, const T *x, const T *w, T *y, T *rstd) {
    __shared__ double sh[kThreads];
    int64_t r = blockIdx.x;
    const T *xr = x + r * cols;
    double s = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        s += (double)xr[j] * (double)xr[j];
    double rs = 1.0 / sqrt(block_sum(s, sh) / (double)cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        y[r * cols + j] = (T)((double)xr[j] * rs * (double)w[j]);
    if (threadIdx.x == 0)
        rstd[r] = (T)rs;
}

template <typename T>
__global__ void rms_bwd_dx_k(int64_t cols, const T *x, const T *w, const T *rstd, const T *dy,
                             T *dx) {
    __shared__ double sh[kThreads];
    int64_t r = blockIdx.x;
    double rs = (double)rstd[r], dot = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        dot += (double)dy[r * cols + j] * (double)w[j] * (double)x[r * cols + j];
    dot = block_sum(dot, sh) / (double)cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        double xj = (double)x[r * cols + j];
        dx[r * cols + j] = (T)(rs * ((double)dy[r * cols + j] * (double)w[j] - xj * rs * rs * dot));
    }
}

template <typename T>
__global__ void rms_bwd_w_k(int64_t rows, int64_t cols, const T *x, const T *rstd, const T *dy,
                            T *dw, int acc) {
    GRID_LOOP(j, cols) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++)
            s += (double)dy[r * cols + j] * (double)x[r * cols + j] * (double)rstd[r];
        dw[j] = (T)((acc ? (double)dw[j] : 0.0) + s);
    }
}

template <typename T>
td_status rms_fwd_t(cuda_device *cd, int64_t rows, int64_t cols, double eps, const void *x,
                    const void *w, void *y, void *rstd) {
    rms_fwd_k<T><<<(unsigned)rows, kThreads, 0, cd->stream>>>(cols, eps, (const T *)x, (const T *)w,
                                                              (T *)y, (T *)rstd);
    return launched(cd, "RMSNorm kernel");
}

td_status cuda_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                           const void *x, const void *w, void *y, void *rstd) {
    if (rows == 0 || cols == 0)
        return TD_OK;
    return dt == TD_F32 ? rms_fwd_t<float>(dev_of(ctx), rows, cols, eps, x, w, y, rstd)
                        : rms_fwd_t<double>(dev_of(ctx), rows, cols, eps, x, w, y, rstd);
}

template <typename T>
td_status rms_bwd_t(cuda_device *cd, int64_t rows, int64_t cols, const void *x, const void *w,
                    const void *rstd, const void *dy, void *dx, void *dw, int acc) {
    td_status st;
    if (dx && rows > 0) {
        rms_bwd_dx_k<T><<<(unsigned)rows, kThreads, 0, cd->stream>>>(
            cols, (const T *)x, (const T *)w, (const T *)rstd, (const T *)dy, (T *)dx);
        if ((st = launched(cd, "RMSNorm backward kernel")) != TD_OK)
            return st;
    }
    rms_bwd_w_k<T><<<grid_for((size_t)cols), kThreads, 0, cd->stream>>>(
        rows, cols, (const T *)x, (const T *)rstd, (const T *)dy, (T *)dw, acc);
    return launched(cd, "RMSNorm weight-gradient kernel");
}

td_status cuda_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                           const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                           int acc) {
    if (cols == 0)
        return TD_OK;
    return dt == TD_F32 ? rms_bwd_t<float>(dev_of(ctx), rows, cols, x, w, rstd, dy, dx, dw, acc)
                        : rms_bwd_t<double>(dev_of(ctx), rows, cols, x, w, rstd, dy, dx, dw, acc);
}

// SwiGLU ---------------------------------------------------------------------------------

template <typename T> __global__ void swiglu_fwd_k(int64_t rows, int64_t f, const T *gu, T *h) {
    GRID_LOOP(e, rows * f) {
        int64_t r = e / f, j = e % f;
        T g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j];
        h[e] = g / ((T)1 + dexp(-g)) * u;
    }
}

template <typename T>
__global__ void swiglu_bwd_k(int64_t rows, int64_t f, const T *gu, const T *dh, T *dgu) {
    GRID_LOOP(e, rows * f) {
        int64_t r = e / f, j = e % f;
        T g = gu[r * 2 * f + j], u = gu[r * 2 * f + f + j], s = (T)1 / ((T)1 + dexp(-g));
        dgu[r * 2 * f + j] = dh[e] * u * s * ((T)1 + g * ((T)1 - s));
        dgu[r * 2 * f + f + j] = dh[e] * g * s;
    }
}

td_status cuda_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                          void *h) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(rows * f);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        swiglu_fwd_k<float>
            <<<grid_for(n), kThreads, 0, cd->stream>>>(rows, f, (const float *)gu, (float *)h);
    else
        swiglu_fwd_k<double>
            <<<grid_for(n), kThreads, 0, cd->stream>>>(rows, f, (const double *)gu, (double *)h);
    return launched(cd, "SwiGLU kernel");
}

td_status cuda_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                          const void *dh, void *dgu) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(rows * f);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        swiglu_bwd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(
            rows, f, (const float *)gu, (const float *)dh, (float *)dgu);
    else
        swiglu_bwd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            rows, f, (const double *)gu, (const double *)dh, (double *)dgu);
    return launched(cd, "SwiGLU backward kernel");
}

// Rotary positions and grouped-query heads ---------------------------------------------------

// One thread per rotated pair: (row, head, j) of x (b t, ld).
template <typename T>
__global__ void rope_k(int64_t t, int64_t rows, int64_t ld, int64_t col, int64_t heads, int64_t d,
                       int64_t pos0, int64_t npos, const T *tab, int inverse, T *x) {
    int64_t hw = d / 2;
    GRID_LOOP(e, rows * heads * hw) {
        int64_t j = e % hw, hd = e / hw % heads, r = e / (hw * heads), pos = pos0 + r % t;
        T c = tab[pos * hw + j], s = tab[(npos + pos) * hw + j];
        T *p = x + r * ld + col + hd * d;
        T x1 = p[j], x2 = p[j + hw];
        if (inverse)
            s = -s;
        p[j] = x1 * c - x2 * s;
        p[j + hw] = x2 * c + x1 * s;
    }
}

td_status cuda_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                    int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                    int inverse, void *x) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(b * t * heads * (d / 2));
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        rope_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(
            t, b * t, ld, col, heads, d, pos0, npos, (const float *)tab, inverse, (float *)x);
    else
        rope_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            t, b * t, ld, col, heads, d, pos0, npos, (const double *)tab, inverse, (double *)x);
    return launched(cd, "rotary position kernel");
}

template <typename T>
__global__ void kv_expand_k(int64_t rows, td_kv_map m, int64_t d, const T *raw, T *qkv) {
    int64_t c = m.h * d, w = (m.h + 2 * m.kv) * d;
    GRID_LOOP(e, rows * 3 * c) {
        int64_t r = e / (3 * c), k = e % (3 * c), part = k / c, i = k % c / d, q = k % d;
        const T *src = raw + r * w;
        qkv[e] =
            part == 0 ? src[k] : src[c + ((part == 2 ? m.kv : 0) + (i + m.skew) / m.g) * d + q];
    }
}

template <typename T>
__global__ void kv_reduce_k(int64_t rows, td_kv_map m, int64_t d, const T *dqkv, T *draw) {
    int64_t c = m.h * d, w = (m.h + 2 * m.kv) * d;
    GRID_LOOP(e, rows * w) {
        int64_t r = e / w, k = e % w;
        const T *src = dqkv + r * 3 * c;
        if (k < c) {
            draw[e] = src[k];
        } else {
            int64_t jj = (k - c) / d, q = (k - c) % d, j = jj < m.kv ? jj : jj - m.kv;
            int64_t base = jj < m.kv ? c : 2 * c;
            /* td__kv_queries, on the device */
            int64_t lo = max(j * m.g - m.skew, (int64_t)0), hi = min((j + 1) * m.g - m.skew, m.h);
            T s = 0;
            for (int64_t i = lo; i < hi; i++)
                s += src[base + i * d + q];
            draw[e] = s;
        }
    }
}

td_status cuda_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                         const void *raw, void *qkv) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(rows * 3 * m.h * d);
    if (n == 0 || m.kv <= 0)
        return TD_OK;
    if (dt == TD_F32)
        kv_expand_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(rows, m, d, (const float *)raw,
                                                                     (float *)qkv);
    else
        kv_expand_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            rows, m, d, (const double *)raw, (double *)qkv);
    return launched(cd, "grouped-query expansion kernel");
}

td_status cuda_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                         const void *dqkv, void *draw) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(rows * (m.h + 2 * m.kv) * d);
    if (n == 0 || m.kv <= 0)
        return TD_OK;
    if (dt == TD_F32)
        kv_reduce_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(
            rows, m, d, (const float *)dqkv, (float *)draw);
    else
        kv_reduce_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            rows, m, d, (const double *)dqkv, (double *)draw);
    return launched(cd, "grouped-query reduction kernel");
}

} // namespace td_cuda
