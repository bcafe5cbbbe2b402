// CUDA kernels of the layers: layer norm, embedding, convolution (im2col and
// cuBLAS), pooling, causal softmax. See kernels.cu for the conventions.
#include <cstring>

#include "backend/cuda/kernels-impl.cuh"

namespace td_cuda {

// Layer norm ---------------------------------------------------------------------------

template <typename T>
__global__ void ln_fwd_k(int64_t cols, double eps, const T *x, const T *gamma, const T *beta, T *y,
                         T *mean, T *rstd) {
    __shared__ double sh[kThreads];
    int64_t r = blockIdx.x;
    const T *xr = x + r * cols;
    double s = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        s += (double)xr[j];
    double mu = block_sum(s, sh) / (double)cols;
    double v = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        double d = (double)xr[j] - mu;
        v += d * d;
    }
    double rs = 1.0 / sqrt(block_sum(v, sh) / (double)cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        y[r * cols + j] = (T)(((double)xr[j] - mu) * rs * (double)gamma[j] + (double)beta[j]);
    if (threadIdx.x == 0) {
        mean[r] = (T)mu;
        rstd[r] = (T)rs;
    }
}

template <typename T>
__global__ void ln_bwd_dx_k(int64_t cols, const T *x, const T *gamma, const T *mean, const T *rstd,
                            const T *dy, T *dx) {
    __shared__ double sh[kThreads];
    int64_t r = blockIdx.x;
    double mu = (double)mean[r], rs = (double)rstd[r], a = 0, b = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        double xhat = ((double)x[r * cols + j] - mu) * rs;
        double g = (double)dy[r * cols + j] * (double)gamma[j];
        a += g;
        b += g * xhat;
    }
    a = block_sum(a, sh) / (double)cols;
    b = block_sum(b, sh) / (double)cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        double xhat = ((double)x[r * cols + j] - mu) * rs;
        double g = (double)dy[r * cols + j] * (double)gamma[j];
        dx[r * cols + j] = (T)(rs * (g - a - xhat * b));
    }
}

// One thread per column sums over rows, in row order.
template <typename T>
__global__ void ln_bwd_params_k(int64_t rows, int64_t cols, const T *x, const T *mean,
                                const T *rstd, const T *dy, T *dgamma, T *dbeta, int acc) {
    GRID_LOOP(j, cols) {
        double g = 0, b = 0;
        for (int64_t r = 0; r < rows; r++) {
            double xhat = ((double)x[r * cols + j] - (double)mean[r]) * (double)rstd[r];
            g += (double)dy[r * cols + j] * xhat;
            b += (double)dy[r * cols + j];
        }
        dgamma[j] = (T)((acc ? (double)dgamma[j] : 0.0) + g);
        dbeta[j] = (T)((acc ? (double)dbeta[j] : 0.0) + b);
    }
}

template <typename T>
td_status ln_fwd_t(cuda_device *cd, int64_t rows, int64_t cols, double eps, const void *x,
                   const void *gamma, const void *beta, void *y, void *mean, void *rstd) {
    ln_fwd_k<T><<<(unsigned)rows, kThreads, 0, cd->stream>>>(
        cols, eps, (const T *)x, (const T *)gamma, (const T *)beta, (T *)y, (T *)mean, (T *)rstd);
    return launched(cd, "layernorm kernel");
}

td_status cuda_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                             const void *x, const void *gamma, const void *beta, void *y,
                             void *mean, void *rstd) {
    if (rows == 0)
        return TD_OK;
    return dt == TD_F32
               ? ln_fwd_t<float>(dev_of(ctx), rows, cols, eps, x, gamma, beta, y, mean, rstd)
               : ln_fwd_t<double>(dev_of(ctx), rows, cols, eps, x, gamma, beta, y, mean, rstd);
}

template <typename T>
td_status ln_bwd_t(cuda_device *cd, int64_t rows, int64_t cols, const void *x, const void *gamma,
                   const void *mean, const void *rstd, const void *dy, void *dx, void *dgamma,
                   void *dbeta, int acc) {
    td_status st;
    if (dx) {
        ln_bwd_dx_k<T><<<(unsigned)rows, kThreads, 0, cd->stream>>>(
            cols, (const T *)x, (const T *)gamma, (const T *)mean, (const T *)rstd, (const T *)dy,
            (T *)dx);
        if ((st = launched(cd, "layernorm backward kernel")) != TD_OK)
            return st;
    }
    ln_bwd_params_k<T><<<grid_for((size_t)cols), kThreads, 0, cd->stream>>>(
        rows, cols, (const T *)x, (const T *)mean, (const T *)rstd, (const T *)dy, (T *)dgamma,
        (T *)dbeta, acc);
    return launched(cd, "layernorm parameter-gradient kernel");
}

td_status cuda_layernorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                             const void *gamma, const void *mean, const void *rstd, const void *dy,
                             void *dx, void *dgamma, void *dbeta, int acc) {
    if (rows == 0 || cols == 0)
        return TD_OK;
    return dt == TD_F32 ? ln_bwd_t<float>(dev_of(ctx), rows, cols, x, gamma, mean, rstd, dy, dx,
                                          dgamma, dbeta, acc)
                        : ln_bwd_t<double>(dev_of(ctx), rows, cols, x, gamma, mean, rstd, dy, dx,
                                           dgamma, dbeta, acc);
}

// Embedding ------------------------------------------------------------------------------

template <typename T>
__global__ void embed_fwd_k(int64_t b, int64_t t, int64_t c, int64_t vocab, const int32_t *tokens,
                            const T *wte, const T *wpe, T *y, int *bad) {
    GRID_LOOP(i, b * t * c) {
        int64_t bt = i / c, j = i % c, pos = bt % t;
        int32_t tok = tokens[bt];
        if (tok < 0 || tok >= vocab) {
            atomicMin(bad, (int)bt);
            y[i] = 0;
            continue;
        }
        y[i] = wte[(int64_t)tok * c + j] + (wpe ? wpe[pos * c + j] : (T)0);
    }
}

template <typename T>
__global__ void embed_bwd_wte_k(int64_t bt, int64_t c, const int32_t *tokens, const T *dy,
                                T *dwte) {
    GRID_LOOP(i, bt * c) {
        int64_t r = i / c, j = i % c;
        atomicAdd(&dwte[(int64_t)tokens[r] * c + j], dy[i]);
    }
}

template <typename T>
__global__ void embed_bwd_wpe_k(int64_t b, int64_t t, int64_t c, const T *dy, T *dwpe, int acc) {
    GRID_LOOP(i, t * c) {
        int64_t pos = i / c, j = i % c;
        double s = acc ? (double)dwpe[i] : 0.0;
        for (int64_t r = 0; r < b; r++)
            s += (double)dy[(r * t + pos) * c + j];
        dwpe[i] = (T)s;
    }
}

// No bad token: the first bad position is at most INT_MAX - 1 below this.
constexpr int kNoBadToken = 0x7f7f7f7f;

td_status embed_result(const cuda_device *cd, int first_bad, int64_t vocab) {
    if (first_bad != kNoBadToken)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: embedding: the token at position %d is outside [0, %lld)", cd->name,
                         first_bad, (long long)vocab);
    return TD_OK;
}

td_status embed_finish(const cuda_device *cd, const cuda_deferred *d, const void *result) {
    int first_bad;
    memcpy(&first_bad, result, sizeof first_bad);
    return embed_result(cd, first_bad, d->limit);
}

td_status cuda_embed_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                         const int32_t *tokens, const void *wte, const void *wpe, void *y) {
    cuda_device *cd = dev_of(ctx);
    int *bad, host = kNoBadToken;
    td_status st;
    size_t n = (size_t)(b * t * c);
    if (n == 0)
        return TD_OK;
    if ((st = td__cuda_scratch(cd, sizeof(int), (void **)&bad)) != TD_OK)
        return st;
    // A memset, not a copy from the host, so that it can be recorded in a graph.
    TD_CUDA_CHECK(cudaMemsetAsync(bad, 0x7f, sizeof *bad, cd->stream), cd);
    if (dt == TD_F32)
        embed_fwd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(
            b, t, c, vocab, tokens, (const float *)wte, (const float *)wpe, (float *)y, bad);
    else
        embed_fwd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            b, t, c, vocab, tokens, (const double *)wte, (const double *)wpe, (double *)y, bad);
    if ((st = launched(cd, "embedding kernel")) != TD_OK)
        return st;
    if (cd->capture) {
        cuda_deferred d = {embed_finish, 0, NULL, NULL, vocab};
        return td__cuda_defer(cd, bad, sizeof *bad, &d);
    }
    TD_CUDA_CHECK(cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, cd->stream), cd);
    if ((st = synced(cd, "embedding")) != TD_OK)
        return st;
    return embed_result(cd, host, vocab);
}

template <typename T>
td_status embed_bwd_t(cuda_device *cd, int64_t b, int64_t t, int64_t c, int64_t vocab,
                      const int32_t *tokens, const void *dy, void *dwte, void *dwpe, int acc) {
    td_status st;
    if (!acc)
        TD_CUDA_CHECK(cudaMemsetAsync(dwte, 0, (size_t)(vocab * c) * sizeof(T), cd->stream), cd);
    embed_bwd_wte_k<T><<<grid_for((size_t)(b * t * c)), kThreads, 0, cd->stream>>>(
        b * t, c, tokens, (const T *)dy, (T *)dwte);
    if ((st = launched(cd, "embedding backward kernel")) != TD_OK)
        return st;
    if (!dwpe)
        return TD_OK;
    embed_bwd_wpe_k<T><<<grid_for((size_t)(t * c)), kThreads, 0, cd->stream>>>(
        b, t, c, (const T *)dy, (T *)dwpe, acc);
    return launched(cd, "position-embedding backward kernel");
}

td_status cuda_embed_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                         const int32_t *tokens, const void *dy, void *dwte, void *dwpe, int acc) {
    return dt == TD_F32
               ? embed_bwd_t<float>(dev_of(ctx), b, t, c, vocab, tokens, dy, dwte, dwpe, acc)
               : embed_bwd_t<double>(dev_of(ctx), b, t, c, vocab, tokens, dy, dwte, dwpe, acc);
}

// Convolution: im2col + cuBLAS, per image ---------------------------------------------------

// col (c * kh * kw, oh * ow) of one image x (c, h, w).
template <typename T> __global__ void im2col_k(td_conv_desc d, const T *x, T *col) {
    int64_t ohw = d.oh * d.ow;
    GRID_LOOP(i, d.c * d.kh * d.kw * ohw) {
        int64_t row = i / ohw, p = i % ohw;
        int64_t ch = row / (d.kh * d.kw), ki = (row / d.kw) % d.kh, kj = row % d.kw;
        int64_t ih = (p / d.ow) * d.stride - d.pad + ki, iw = (p % d.ow) * d.stride - d.pad + kj;
        col[i] =
            (ih >= 0 && ih < d.h && iw >= 0 && iw < d.w) ? x[(ch * d.h + ih) * d.w + iw] : (T)0;
    }
}

// x (c, h, w) = the sum of the col entries that read each pixel (gathered, so no atomics).
template <typename T> __global__ void col2im_k(td_conv_desc d, const T *col, T *x) {
    int64_t ohw = d.oh * d.ow;
    GRID_LOOP(i, d.c * d.h * d.w) {
        int64_t ch = i / (d.h * d.w), ih = (i / d.w) % d.h, iw = i % d.w;
        double s = 0;
        for (int64_t ki = 0; ki < d.kh; ki++) {
            int64_t oy = ih + d.pad - ki;
            if (oy < 0 || oy % d.stride)
                continue;
            oy /= d.stride;
            if (oy >= d.oh)
                continue;
            for (int64_t kj = 0; kj < d.kw; kj++) {
                int64_t ox = iw + d.pad - kj;
                if (ox < 0 || ox % d.stride)
                    continue;
                ox /= d.stride;
                if (ox >= d.ow)
                    continue;
                s += (double)col[((ch * d.kh + ki) * d.kw + kj) * ohw + oy * d.ow + ox];
            }
        }
        x[i] = (T)s;
    }
}

template <typename T>
td_status conv_fwd_t(cuda_device *cd, td_dtype dt, const td_conv_desc *d, const void *x,
                     const void *w, const void *bias, void *y) {
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    void *col;
    td_status st;
    if ((st = td__cuda_scratch(cd, (size_t)(ckk * ohw) * sizeof(T), &col)) != TD_OK)
        return st;
    for (int64_t i = 0; i < d->n; i++) {
        const T *xi = (const T *)x + i * d->c * d->h * d->w;
        T *yi = (T *)y + i * d->oc * ohw;
        im2col_k<T><<<grid_for((size_t)(ckk * ohw)), kThreads, 0, cd->stream>>>(*d, xi, (T *)col);
        if ((st = launched(cd, "im2col kernel")) != TD_OK)
            return st;
        // y_i (oc, ohw) = w (oc, ckk) col (ckk, ohw)
        if ((st = cuda_gemm(cd, dt, 0, 0, d->oc, ohw, ckk, 1.0, w, ckk, col, ohw, 0.0, yi, ohw)))
            return st;
    }
    if (bias)
        return cuda_bias_add(cd, dt, y, bias, d->n, d->oc, ohw);
    return TD_OK;
}

td_status cuda_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                          const void *w, const void *bias, void *y) {
    if (d->n == 0)
        return TD_OK;
    return dt == TD_F32 ? conv_fwd_t<float>(dev_of(ctx), dt, d, x, w, bias, y)
                        : conv_fwd_t<double>(dev_of(ctx), dt, d, x, w, bias, y);
}

template <typename T>
td_status conv_bwd_t(cuda_device *cd, td_dtype dt, const td_conv_desc *d, const void *x,
                     const void *w, const void *dy, void *dx, void *dw, void *db, int acc) {
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    size_t col_bytes = (size_t)(ckk * ohw) * sizeof(T);
    char *scratch;
    td_status st;
    if ((st = td__cuda_scratch(cd, 2 * col_bytes, (void **)&scratch)) != TD_OK)
        return st;
    T *col = (T *)scratch, *dcol = (T *)(scratch + col_bytes);
    for (int64_t i = 0; i < d->n; i++) {
        const T *xi = (const T *)x + i * d->c * d->h * d->w;
        const T *dyi = (const T *)dy + i * d->oc * ohw;
        im2col_k<T><<<grid_for((size_t)(ckk * ohw)), kThreads, 0, cd->stream>>>(*d, xi, col);
        if ((st = launched(cd, "im2col kernel")) != TD_OK)
            return st;
        // dw (oc, ckk) (+)= dy_i (oc, ohw) col^T (ohw, ckk)
        if ((st = cuda_gemm(cd, dt, 0, 1, d->oc, ckk, ohw, 1.0, dyi, ohw, col, ohw,
                            (acc || i > 0) ? 1.0 : 0.0, dw, ckk)))
            return st;
        if (dx) {
            // dcol (ckk, ohw) = w^T (ckk, oc) dy_i (oc, ohw), then folded back
            if ((st = cuda_gemm(cd, dt, 1, 0, ckk, ohw, d->oc, 1.0, w, ckk, dyi, ohw, 0.0, dcol,
                                ohw)))
                return st;
            col2im_k<T><<<grid_for((size_t)(d->c * d->h * d->w)), kThreads, 0, cd->stream>>>(
                *d, dcol, (T *)dx + i * d->c * d->h * d->w);
            if ((st = launched(cd, "col2im kernel")) != TD_OK)
                return st;
        }
    }
    if (db)
        return cuda_bias_grad(cd, dt, db, dy, d->n, d->oc, ohw, acc);
    return TD_OK;
}

td_status cuda_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                          const void *w, const void *dy, void *dx, void *dw, void *db, int acc) {
    if (d->n == 0)
        return TD_OK;
    return dt == TD_F32 ? conv_bwd_t<float>(dev_of(ctx), dt, d, x, w, dy, dx, dw, db, acc)
                        : conv_bwd_t<double>(dev_of(ctx), dt, d, x, w, dy, dx, dw, db, acc);
}

// Pooling ----------------------------------------------------------------------------------

template <typename T>
__global__ void pool_fwd_k(td_pool_kind kind, td_conv_desc d, const T *x, T *y, int32_t *argmax) {
    GRID_LOOP(i, d.n * d.c * d.oh * d.ow) {
        int64_t plane = i / (d.oh * d.ow), oy = (i / d.ow) % d.oh, ox = i % d.ow;
        const T *xp = x + plane * d.h * d.w;
        double best = -INFINITY, sum = 0;
        int32_t at = -1;
        for (int64_t ki = 0; ki < d.kh; ki++)
            for (int64_t kj = 0; kj < d.kw; kj++) {
                int64_t ih = oy * d.stride - d.pad + ki, iw = ox * d.stride - d.pad + kj;
                if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w)
                    continue;
                double v = (double)xp[ih * d.w + iw];
                sum += v;
                if (v > best) {
                    best = v;
                    at = (int32_t)(ih * d.w + iw);
                }
            }
        if (kind == TD_POOL_MAX) {
            y[i] = (T)best;
            if (argmax)
                argmax[i] = at;
        } else {
            y[i] = (T)(sum / (double)(d.kh * d.kw));
        }
    }
}

// Gathered per input pixel: no atomics, deterministic.
template <typename T>
__global__ void pool_bwd_k(td_pool_kind kind, td_conv_desc d, const T *dy, const int32_t *argmax,
                           T *dx) {
    GRID_LOOP(i, d.n * d.c * d.h * d.w) {
        int64_t plane = i / (d.h * d.w), ih = (i / d.w) % d.h, iw = i % d.w;
        double s = 0;
        for (int64_t ki = 0; ki < d.kh; ki++) {
            int64_t oy = ih + d.pad - ki;
            if (oy < 0 || oy % d.stride || oy / d.stride >= d.oh)
                continue;
            oy /= d.stride;
            for (int64_t kj = 0; kj < d.kw; kj++) {
                int64_t ox = iw + d.pad - kj;
                if (ox < 0 || ox % d.stride || ox / d.stride >= d.ow)
                    continue;
                ox /= d.stride;
                int64_t o = (plane * d.oh + oy) * d.ow + ox;
                if (kind == TD_POOL_AVG)
                    s += (double)dy[o] / (double)(d.kh * d.kw);
                else if (argmax[o] == (int32_t)(ih * d.w + iw))
                    s += (double)dy[o];
            }
        }
        dx[i] = (T)s;
    }
}

td_status cuda_pool_fwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                        const void *x, void *y, int32_t *argmax) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(d->n * d->c * d->oh * d->ow);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        pool_fwd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(kind, *d, (const float *)x,
                                                                    (float *)y, argmax);
    else
        pool_fwd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(kind, *d, (const double *)x,
                                                                     (double *)y, argmax);
    return launched(cd, "pooling kernel");
}

td_status cuda_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                        const void *dy, const int32_t *argmax, void *dx) {
    cuda_device *cd = dev_of(ctx);
    size_t n = (size_t)(d->n * d->c * d->h * d->w);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        pool_bwd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(kind, *d, (const float *)dy,
                                                                    argmax, (float *)dx);
    else
        pool_bwd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(kind, *d, (const double *)dy,
                                                                     argmax, (double *)dx);
    return launched(cd, "pooling backward kernel");
}

// Causal softmax for attention: one block per row of each (t, t) matrix --------------------

template <typename T> __global__ void causal_fwd_k(int64_t t, double scale, const T *s, T *p) {
    __shared__ double sh[kThreads];
    int64_t row = blockIdx.x, i = row % t;
    const T *sr = s + row * t;
    T *pr = p + row * t;
    double m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
        m = fmax(m, scale * (double)sr[j]);
    m = block_max(m, sh);
    double z = 0;
    for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
        z += exp(scale * (double)sr[j] - m);
    z = block_sum(z, sh);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
        pr[j] = j <= i ? (T)(exp(scale * (double)sr[j] - m) / z) : (T)0;
}

template <typename T>
__global__ void causal_bwd_k(int64_t t, double scale, const T *p, const T *dp, T *ds) {
    __shared__ double sh[kThreads];
    int64_t row = blockIdx.x;
    const T *pr = p + row * t, *dpr = dp + row * t;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
        dot += (double)pr[j] * (double)dpr[j];
    dot = block_sum(dot, sh);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
        ds[row * t + j] = (T)(scale * (double)pr[j] * ((double)dpr[j] - dot));
}

td_status cuda_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                  const void *s, void *p) {
    cuda_device *cd = dev_of(ctx);
    // `rows` matrices of t rows each.
    unsigned blocks = (unsigned)(rows * t);
    if (blocks == 0)
        return TD_OK;
    if (dt == TD_F32)
        causal_fwd_k<float>
            <<<blocks, kThreads, 0, cd->stream>>>(t, scale, (const float *)s, (float *)p);
    else
        causal_fwd_k<double>
            <<<blocks, kThreads, 0, cd->stream>>>(t, scale, (const double *)s, (double *)p);
    return launched(cd, "causal softmax kernel");
}

td_status cuda_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                  const void *p, const void *dp, void *ds) {
    cuda_device *cd = dev_of(ctx);
    unsigned blocks = (unsigned)(rows * t);
    if (blocks == 0)
        return TD_OK;
    if (dt == TD_F32)
        causal_bwd_k<float><<<blocks, kThreads, 0, cd->stream>>>(t, scale, (const float *)p,
                                                                 (const float *)dp, (float *)ds);
    else
        causal_bwd_k<double><<<blocks, kThreads, 0, cd->stream>>>(t, scale, (const double *)p,
                                                                  (const double *)dp, (double *)ds);
    return launched(cd, "causal softmax backward kernel");
}

} // namespace td_cuda
