// CUDA kernels of the td_kernels table: cuBLAS for GEMM, own kernels for the
// rest (the layers' in kernels_nn.cu). Launched on the device's stream by its
// host thread; every launch and library call is checked, and a failure
// becomes a status naming the kernel and the device. Formulas follow the CPU
// backend's (src/backend/cpu), which the GPU tests compare against. Each op
// is a template over the element type (float, double) with a C entry point
// that picks it from td_dtype.
#include <cstring>

#include "backend/cuda/kernels-impl.cuh"
#include "core/philox.h"

namespace td_cuda {

// fill and rng ------------------------------------------------------------------

template <typename T> __global__ void fill_k(T *x, size_t n, T v) {
    GRID_LOOP(i, n) x[i] = v;
}

template <typename T>
__global__ void rng_k(T *x, size_t n, int normal, uint64_t seed, uint64_t offset, double a,
                      double b) {
    GRID_LOOP(i, n) {
        double v = normal ? a + b * td__rng_normal_at(seed, offset + i)
                          : a + (b - a) * td__rng_uniform_at(seed, offset + i);
        x[i] = (T)v;
    }
}

template <typename T> td_status fill_t(cuda_device *cd, void *x, size_t n, double v) {
    fill_k<T><<<grid_for(n), kThreads, 0, cd->stream>>>((T *)x, n, (T)v);
    return launched(cd, "fill kernel");
}

td_status cuda_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    if (n == 0)
        return TD_OK;
    return dt == TD_F32 ? fill_t<float>(dev_of(ctx), x, n, value)
                        : fill_t<double>(dev_of(ctx), x, n, value);
}

template <typename T>
td_status rng_t(cuda_device *cd, void *x, size_t n, int normal, uint64_t seed, uint64_t offset,
                double a, double b) {
    rng_k<T><<<grid_for(n), kThreads, 0, cd->stream>>>((T *)x, n, normal, seed, offset, a, b);
    return launched(cd, "rng kernel");
}

td_status cuda_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                   uint64_t offset, double a, double b) {
    int normal = kind == TD_RNG_NORMAL;
    if (n == 0)
        return TD_OK;
    return dt == TD_F32 ? rng_t<float>(dev_of(ctx), x, n, normal, seed, offset, a, b)
                        : rng_t<double>(dev_of(ctx), x, n, normal, seed, offset, a, b);
}

// GEMM through cuBLAS ------------------------------------------------------------
//
// tandem's matrices are row-major; cuBLAS's are column-major, and a row-major
// X is a column-major X^T. So C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T with the operands swapped.

cublasOperation_t op_of(int t) {
    return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

td_status cuda_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                    double beta, void *c, int64_t ldc) {
    cuda_device *cd = dev_of(ctx);
    cublasStatus_t st;
    if (m == 0 || n == 0)
        return TD_OK;
    if (dt == TD_F32) {
        float al = (float)alpha, be = (float)beta;
        st = cublasSgemm(cd->blas, op_of(tb), op_of(ta), (int)n, (int)m, (int)k, &al,
                         (const float *)b, (int)ldb, (const float *)a, (int)lda, &be, (float *)c,
                         (int)ldc);
    } else {
        st = cublasDgemm(cd->blas, op_of(tb), op_of(ta), (int)n, (int)m, (int)k, &alpha,
                         (const double *)b, (int)ldb, (const double *)a, (int)lda, &beta,
                         (double *)c, (int)ldc);
    }
    return td__cublas_status(st, "cublasGemm", cd);
}

td_status cuda_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            double alpha, const void *a, int64_t lda, int64_t stride_a,
                            const void *b, int64_t ldb, int64_t stride_b, double beta, void *c,
                            int64_t ldc, int64_t stride_c, int64_t batch) {
    cuda_device *cd = dev_of(ctx);
    cublasStatus_t st;
    if (m == 0 || n == 0 || batch == 0)
        return TD_OK;
    if (dt == TD_F32) {
        float al = (float)alpha, be = (float)beta;
        st = cublasSgemmStridedBatched(cd->blas, op_of(tb), op_of(ta), (int)n, (int)m, (int)k, &al,
                                       (const float *)b, (int)ldb, stride_b, (const float *)a,
                                       (int)lda, stride_a, &be, (float *)c, (int)ldc, stride_c,
                                       (int)batch);
    } else {
        st = cublasDgemmStridedBatched(cd->blas, op_of(tb), op_of(ta), (int)n, (int)m, (int)k,
                                       &alpha, (const double *)b, (int)ldb, stride_b,
                                       (const double *)a, (int)lda, stride_a, &beta, (double *)c,
                                       (int)ldc, stride_c, (int)batch);
    }
    return td__cublas_status(st, "cublasGemmStridedBatched", cd);
}

// Bias -------------------------------------------------------------------------

template <typename T>
__global__ void bias_add_k(T *y, const T *bias, int64_t outer, int64_t c, int64_t inner) {
    GRID_LOOP(i, outer * c * inner) y[i] += bias[(i / inner) % c];
}

// One block per channel sums dy over outer and inner.
template <typename T>
__global__ void bias_grad_k(T *db, const T *dy, int64_t outer, int64_t c, int64_t inner, int acc) {
    __shared__ double sh[kThreads];
    int64_t j = blockIdx.x;
    double s = 0;
    for (int64_t idx = threadIdx.x; idx < outer * inner; idx += blockDim.x) {
        int64_t o = idx / inner, i = idx % inner;
        s += (double)dy[(o * c + j) * inner + i];
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        db[j] = (T)((acc ? (double)db[j] : 0.0) + s);
}

template <typename T>
td_status bias_add_t(cuda_device *cd, void *y, const void *bias, int64_t outer, int64_t c,
                     int64_t inner) {
    bias_add_k<T><<<grid_for((size_t)(outer * c * inner)), kThreads, 0, cd->stream>>>(
        (T *)y, (const T *)bias, outer, c, inner);
    return launched(cd, "bias_add kernel");
}

td_status cuda_bias_add(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer, int64_t c,
                        int64_t inner) {
    if (outer * c * inner == 0)
        return TD_OK;
    return dt == TD_F32 ? bias_add_t<float>(dev_of(ctx), y, bias, outer, c, inner)
                        : bias_add_t<double>(dev_of(ctx), y, bias, outer, c, inner);
}

template <typename T>
td_status bias_grad_t(cuda_device *cd, void *db, const void *dy, int64_t outer, int64_t c,
                      int64_t inner, int acc) {
    bias_grad_k<T>
        <<<(unsigned)c, kThreads, 0, cd->stream>>>((T *)db, (const T *)dy, outer, c, inner, acc);
    return launched(cd, "bias_grad kernel");
}

td_status cuda_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer, int64_t c,
                         int64_t inner, int acc) {
    if (c == 0)
        return TD_OK;
    return dt == TD_F32 ? bias_grad_t<float>(dev_of(ctx), db, dy, outer, c, inner, acc)
                        : bias_grad_t<double>(dev_of(ctx), db, dy, outer, c, inner, acc);
}

// Elementwise ---------------------------------------------------------------------

// GELU's tanh approximation (GPT-2): sqrt(2/pi) and the cubic's coefficient.
#define GELU_K ((T)0.79788456080286535588)
#define GELU_C ((T)0.044715)

template <typename T> __global__ void act_fwd_k(td_act act, size_t n, const T *x, T *y) {
    GRID_LOOP(i, n) {
        T v = x[i];
        switch (act) {
        case TD_ACT_RELU: y[i] = v > 0 ? v : (T)0; break;
        case TD_ACT_GELU: y[i] = v * dcdf<T>(v); break;
        case TD_ACT_TANH: y[i] = tanh(v); break;
        case TD_ACT_SIGMOID: y[i] = (T)1 / ((T)1 + dexp<T>(-v)); break;
        case TD_ACT_GELU_TANH:
            y[i] = (T)0.5 * v * ((T)1 + tanh(GELU_K * (v + GELU_C * v * v * v)));
            break;
        }
    }
}

template <typename T>
__global__ void act_bwd_k(td_act act, size_t n, const T *x, const T *y, const T *dy, T *dx) {
    GRID_LOOP(i, n) {
        T v = x[i], d = 0;
        switch (act) {
        case TD_ACT_RELU: d = v > 0 ? (T)1 : (T)0; break;
        case TD_ACT_GELU:
            d = dcdf<T>(v) + v * dexp<T>((T)-0.5 * v * v) * (T)0.39894228040143267794;
            break;
        case TD_ACT_TANH: d = (T)1 - y[i] * y[i]; break;
        case TD_ACT_SIGMOID: d = y[i] * ((T)1 - y[i]); break;
        case TD_ACT_GELU_TANH: {
            T t = tanh(GELU_K * (v + GELU_C * v * v * v));
            d = (T)0.5 * ((T)1 + t) +
                (T)0.5 * v * ((T)1 - t * t) * GELU_K * ((T)1 + (T)3 * GELU_C * v * v);
            break;
        }
        }
        dx[i] = dy[i] * d;
    }
}

template <typename T> __global__ void add_k(size_t n, const T *a, const T *b, T *y) {
    GRID_LOOP(i, n) y[i] = a[i] + b[i];
}

template <typename T> __global__ void axpby_k(size_t n, T alpha, const T *x, T beta, T *y) {
    GRID_LOOP(i, n) y[i] = beta == (T)0 ? alpha * x[i] : alpha * x[i] + beta * y[i];
}

template <typename T>
__global__ void dropout_k(size_t n, double p, uint64_t seed, uint64_t offset, const T *x, T *y) {
    double keep = 1.0 / (1.0 - p);
    GRID_LOOP(i, n) {
        int kept = td__rng_uniform_at(seed, offset + i) >= p;
        y[i] = kept ? (T)((double)x[i] * keep) : (T)0;
    }
}

td_status cuda_act_fwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, void *y) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        act_fwd_k<float>
            <<<grid_for(n), kThreads, 0, cd->stream>>>(act, n, (const float *)x, (float *)y);
    else
        act_fwd_k<double>
            <<<grid_for(n), kThreads, 0, cd->stream>>>(act, n, (const double *)x, (double *)y);
    return launched(cd, "activation kernel");
}

td_status cuda_act_bwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, const void *y,
                       const void *dy, void *dx) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        act_bwd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(
            act, n, (const float *)x, (const float *)y, (const float *)dy, (float *)dx);
    else
        act_bwd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(
            act, n, (const double *)x, (const double *)y, (const double *)dy, (double *)dx);
    return launched(cd, "activation backward kernel");
}

td_status cuda_add(void *ctx, td_dtype dt, size_t n, const void *a, const void *b, void *y) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        add_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (const float *)a,
                                                               (const float *)b, (float *)y);
    else
        add_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (const double *)a,
                                                                (const double *)b, (double *)y);
    return launched(cd, "add kernel");
}

td_status cuda_axpby(void *ctx, td_dtype dt, size_t n, double alpha, const void *x, double beta,
                     void *y) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        axpby_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (float)alpha, (const float *)x,
                                                                 (float)beta, (float *)y);
    else
        axpby_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(n, alpha, (const double *)x, beta,
                                                                  (double *)y);
    return launched(cd, "axpby kernel");
}

td_status cuda_dropout(void *ctx, td_dtype dt, size_t n, double p, uint64_t seed, uint64_t offset,
                       const void *x, void *y) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        dropout_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(n, p, seed, offset,
                                                                   (const float *)x, (float *)y);
    else
        dropout_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(n, p, seed, offset,
                                                                    (const double *)x, (double *)y);
    return launched(cd, "dropout kernel");
}

// Softmax cross-entropy ---------------------------------------------------------------
//
// One block per row; the row's loss and hit go to per-row slots, summed in row
// order by a second kernel so the result does not depend on scheduling.

struct xent_out {
    double loss;
    long long correct;
    long long bad_row; // -1, or the first row whose label is out of range
};

template <typename T>
__global__ void xent_rows_k(int64_t rows, int64_t classes, const T *logits, const int32_t *labels,
                            T *dlogits, double scale, double *row_loss, int *row_hit,
                            int *row_bad) {
    __shared__ double sh[kThreads];
    __shared__ int shi[kThreads];
    int64_t r = blockIdx.x;
    const T *x = logits + r * classes;
    int32_t label = labels[r];
    double m = -INFINITY;
    int arg = 0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        if ((double)x[j] > m) {
            m = (double)x[j];
            arg = (int)j;
        }
    // The arg-max with the lowest index among equal maxima, as the CPU takes.
    sh[threadIdx.x] = m;
    shi[threadIdx.x] = arg;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            double o = sh[threadIdx.x + s];
            int oi = shi[threadIdx.x + s];
            if (o > sh[threadIdx.x] || (o == sh[threadIdx.x] && oi < shi[threadIdx.x])) {
                sh[threadIdx.x] = o;
                shi[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    m = sh[0];
    arg = shi[0];
    __syncthreads();
    double s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        s += exp((double)x[j] - m);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        int bad = label < 0 || label >= classes;
        row_bad[r] = bad;
        row_hit[r] = !bad && arg == label;
        row_loss[r] = bad ? 0.0 : log(s) + m - (double)x[label];
    }
    if (dlogits && label >= 0 && label < classes)
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            double p = exp((double)x[j] - m) / s;
            dlogits[r * classes + j] = (T)(scale * (p - (j == label ? 1.0 : 0.0)));
        }
}

__global__ void xent_sum_k(int64_t rows, const double *row_loss, const int *row_hit,
                           const int *row_bad, xent_out *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    xent_out o = {0.0, 0, -1};
    for (int64_t r = 0; r < rows; r++) {
        o.loss += row_loss[r];
        o.correct += row_hit[r];
        if (row_bad[r] && o.bad_row < 0)
            o.bad_row = r;
    }
    *out = o;
}

td_status xent_result(const cuda_device *cd, const xent_out *o, int64_t classes, double *loss_sum,
                      int64_t *correct) {
    if (o->bad_row >= 0)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: cross-entropy: the label of row %lld is outside "
                         "[0, %lld)",
                         cd->name, o->bad_row, (long long)classes);
    *loss_sum = o->loss;
    *correct = o->correct;
    return TD_OK;
}

td_status xent_finish(const cuda_device *cd, const cuda_deferred *d, const void *result) {
    xent_out o;
    memcpy(&o, result, sizeof o);
    return xent_result(cd, &o, d->limit, (double *)d->out0, (int64_t *)d->out1);
}

td_status cuda_xent(void *ctx, td_dtype dt, int64_t rows, int64_t classes, const void *logits,
                    const int32_t *labels, void *dlogits, double grad_scale, double *loss_sum,
                    int64_t *correct) {
    cuda_device *cd = dev_of(ctx);
    void *scratch;
    xent_out host;
    td_status st;
    size_t need = sizeof(xent_out) + (size_t)rows * (sizeof(double) + 2 * sizeof(int)) + 64;
    *loss_sum = 0;
    *correct = 0;
    if (rows == 0)
        return TD_OK;
    if ((st = td__cuda_scratch(cd, need, &scratch)) != TD_OK)
        return st;
    xent_out *out = (xent_out *)scratch;
    double *row_loss = (double *)((char *)scratch + 64);
    int *row_hit = (int *)(row_loss + rows), *row_bad = row_hit + rows;
    if (dt == TD_F32)
        xent_rows_k<float><<<(unsigned)rows, kThreads, 0, cd->stream>>>(
            rows, classes, (const float *)logits, labels, (float *)dlogits, grad_scale, row_loss,
            row_hit, row_bad);
    else
        xent_rows_k<double><<<(unsigned)rows, kThreads, 0, cd->stream>>>(
            rows, classes, (const double *)logits, labels, (double *)dlogits, grad_scale, row_loss,
            row_hit, row_bad);
    if ((st = launched(cd, "cross-entropy kernel")) != TD_OK)
        return st;
    xent_sum_k<<<1, 1, 0, cd->stream>>>(rows, row_loss, row_hit, row_bad, out);
    if (cd->capture) {
        // Recorded: the sums reach loss_sum and correct at each replay.
        cuda_deferred d = {xent_finish, 0, loss_sum, correct, classes};
        if ((st = launched(cd, "cross-entropy sum kernel")) != TD_OK)
            return st;
        return td__cuda_defer(cd, out, sizeof *out, &d);
    }
    TD_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, cd->stream), cd);
    if ((st = synced(cd, "cross-entropy")) != TD_OK)
        return st;
    return xent_result(cd, &host, classes, loss_sum, correct);
}

// Reductions and optimizers ---------------------------------------------------------------

template <typename T> __global__ void sumsq_k(size_t n, const T *x, double *out) {
    __shared__ double sh[kThreads];
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        s += (double)x[i] * (double)x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        *out = s;
}

td_status sumsq_finish(const cuda_device *, const cuda_deferred *d, const void *result) {
    memcpy(d->out0, result, sizeof(double));
    return TD_OK;
}

td_status cuda_sumsq(void *ctx, td_dtype dt, size_t n, const void *x, double *out) {
    cuda_device *cd = dev_of(ctx);
    double *dev_out;
    td_status st;
    *out = 0;
    if (n == 0)
        return TD_OK;
    if ((st = td__cuda_scratch(cd, sizeof(double), (void **)&dev_out)) != TD_OK)
        return st;
    // One block: the order of the sum is fixed, so the norm is reproducible.
    if (dt == TD_F32)
        sumsq_k<float><<<1, kThreads, 0, cd->stream>>>(n, (const float *)x, dev_out);
    else
        sumsq_k<double><<<1, kThreads, 0, cd->stream>>>(n, (const double *)x, dev_out);
    if ((st = launched(cd, "sum-of-squares kernel")) != TD_OK)
        return st;
    if (cd->capture) {
        cuda_deferred d = {sumsq_finish, 0, out, NULL, 0};
        return td__cuda_defer(cd, dev_out, sizeof *dev_out, &d);
    }
    TD_CUDA_CHECK(cudaMemcpyAsync(out, dev_out, sizeof *out, cudaMemcpyDeviceToHost, cd->stream),
                  cd);
    return synced(cd, "sum of squares");
}

template <typename T> __global__ void sgd_k(size_t n, T *w, const T *g, T *buf, td_opt_args o) {
    T gm = (T)o.grad_mul, wd = (T)o.weight_decay, mom = (T)o.momentum, nlr = (T)-o.lr;
    GRID_LOOP(i, n) {
        T gi = wd * w[i] + g[i] * gm;
        if (buf) {
            T b = o.first ? gi : mom * buf[i] + gi;
            buf[i] = b;
            gi = o.nesterov ? mom * b + gi : b;
        }
        w[i] = nlr * gi + w[i];
    }
}

template <typename T>
__global__ void adamw_k(size_t n, T *w, const T *g, T *m, T *v, td_opt_args o) {
    T decay = (T)(1.0 - o.lr * o.weight_decay), b1 = (T)o.beta1, b2 = (T)o.beta2;
    T c1 = (T)(1.0 - o.beta1), c2 = (T)(1.0 - o.beta2), gm = (T)o.grad_mul;
    T step = (T)(-o.lr / o.bias_corr1), isq2 = (T)(1.0 / sqrt(o.bias_corr2)), eps = (T)o.eps;
    GRID_LOOP(i, n) {
        T gi = g[i] * gm;
        T mi = b1 * m[i] + c1 * gi;
        T vi = b2 * v[i] + c2 * (gi * gi);
        T denom = (T)sqrt((double)vi) * isq2 + eps;
        m[i] = mi;
        v[i] = vi;
        w[i] = step * (mi / denom) + w[i] * decay;
    }
}

td_status cuda_sgd(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *buf,
                   const td_opt_args *o) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        sgd_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (float *)w, (const float *)g,
                                                               (float *)buf, *o);
    else
        sgd_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (double *)w, (const double *)g,
                                                                (double *)buf, *o);
    return launched(cd, "SGD kernel");
}

td_status cuda_adamw(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *m, void *v,
                     const td_opt_args *o) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    if (dt == TD_F32)
        adamw_k<float><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (float *)w, (const float *)g,
                                                                 (float *)m, (float *)v, *o);
    else
        adamw_k<double><<<grid_for(n), kThreads, 0, cd->stream>>>(n, (double *)w, (const double *)g,
                                                                  (double *)m, (double *)v, *o);
    return launched(cd, "AdamW kernel");
}

} // namespace td_cuda

using namespace td_cuda;

extern "C" const td_kernels td__cuda_kernels = {
    .fill = cuda_fill,
    .rng = cuda_rng,
    .gemm = cuda_gemm,
    .gemm_batched = cuda_gemm_batched,
    .bias_add = cuda_bias_add,
    .bias_grad = cuda_bias_grad,
    .act_fwd = cuda_act_fwd,
    .act_bwd = cuda_act_bwd,
    .add = cuda_add,
    .axpby = cuda_axpby,
    .dropout = cuda_dropout,
    .xent = cuda_xent,
    .layernorm_fwd = cuda_layernorm_fwd,
    .layernorm_bwd = cuda_layernorm_bwd,
    .embed_fwd = cuda_embed_fwd,
    .embed_bwd = cuda_embed_bwd,
    .conv2d_fwd = cuda_conv2d_fwd,
    .conv2d_bwd = cuda_conv2d_bwd,
    .pool_fwd = cuda_pool_fwd,
    .pool_bwd = cuda_pool_bwd,
    .causal_softmax_fwd = cuda_causal_softmax_fwd,
    .causal_softmax_bwd = cuda_causal_softmax_bwd,
    .rmsnorm_fwd = cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .swiglu_fwd = cuda_swiglu_fwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .rope = cuda_rope,
    .kv_expand = cuda_kv_expand,
    .kv_reduce = cuda_kv_reduce,
    .matmul_compact = cuda_matmul_compact,
    .convert_half = cuda_convert_half,
    .attend_step = cuda_attend_step,
    .sumsq = cuda_sumsq,
    .sgd = cuda_sgd,
    .adamw = cuda_adamw,
};
