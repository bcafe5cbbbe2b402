// Products with compact weights (bf16, q8_0) on CUDA: the matmul_compact
// slot, as the CPU's (kern_compact.c) and OpenCL's (kernels_compact.c): x
// rounded to the weights' kind into scratch (q8_0 blocks with an f16 scale,
// or bf16 by rounding to nearest even), then one thread per output summing
// its row, int8 block products in int times the two scales, or exact bf16
// products, in the CPU C path's order.
#include <cuda_fp16.h>

#include "backend/cuda/kernels-impl.cuh"

extern "C" {
#include "core/quant.h"
}

namespace td_cuda {

__device__ unsigned short bf16_rne(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ float f16_at(const unsigned char *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | p[1] << 8)));
}

__global__ void round_x_k(int64_t n, int64_t cols, int fmt, const float *x, unsigned char *xq) {
    if (fmt == TD_WEIGHTS_BF16) {
        GRID_LOOP(e, n * cols)
        ((unsigned short *)xq)[e] = bf16_rne(x[e]);
        return;
    }
    GRID_LOOP(b, n * (cols / 32)) {
        const float *v = x + b * 32;
        unsigned char *o = xq + b * 34;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        unsigned short h = __half_as_ushort(__float2half_rn(d));
        o[0] = (unsigned char)(h & 0xff);
        o[1] = (unsigned char)(h >> 8);
        for (int j = 0; j < 32; j++)
            o[2 + j] = (unsigned char)(signed char)roundf(__fmul_rn(v[j], id));
    }
}

__global__ void matmul_compact_k(int64_t n, int64_t rows, int64_t cols, int fmt,
                                 const unsigned char *xq, const unsigned char *w, float *y) {
    int64_t nb = cols / 32;
    GRID_LOOP(e, n * rows) {
        int64_t i = (int64_t)e / rows, r = (int64_t)e % rows;
        float acc = 0.0f;
        if (fmt == TD_WEIGHTS_BF16) {
            const unsigned short *wr = (const unsigned short *)w + r * cols;
            const unsigned short *xr = (const unsigned short *)xq + i * cols;
            for (int64_t p = 0; p < cols; p++)
                acc = __fadd_rn(acc, __fmul_rn(__uint_as_float((unsigned)wr[p] << 16),
                                               __uint_as_float((unsigned)xr[p] << 16)));
        } else {
            const unsigned char *wr = w + r * nb * 34, *xr = xq + i * nb * 34;
            for (int64_t b = 0; b < nb; b++) {
                const signed char *qw = (const signed char *)(wr + b * 34 + 2);
                const signed char *qx = (const signed char *)(xr + b * 34 + 2);
                int s = 0;
                for (int j = 0; j < 32; j++)
                    s += (int)qw[j] * (int)qx[j];
                float d = __fmul_rn(f16_at(wr + b * 34), f16_at(xr + b * 34));
                acc = __fadd_rn(acc, __fmul_rn((float)s, d));
            }
        }
        y[e] = acc;
    }
}

td_status cuda_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                              const float *x, const void *w, float *y) {
    cuda_device *cd = dev_of(ctx);
    size_t xbytes = (size_t)n * td__compact_row_bytes(fmt, cols);
    void *xq;
    if (n <= 0 || rows <= 0)
        return TD_OK;
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_INVALID_ARG,
                         "matmul_compact: q8_0 rows of %lld values are not whole blocks of 32",
                         (long long)cols);
    TD_CHECK(td__cuda_scratch(cd, xbytes, &xq));
    size_t nx = fmt == TD_WEIGHTS_Q8_0 ? (size_t)(n * (cols / 32)) : (size_t)(n * cols);
    round_x_k<<<grid_for(nx), kThreads, 0, cd->stream>>>(n, cols, (int)fmt, x, (unsigned char *)xq);
    TD_CHECK(launched(cd, "compact rounding kernel"));
    matmul_compact_k<<<grid_for((size_t)(n * rows)), kThreads, 0, cd->stream>>>(
        n, rows, cols, (int)fmt, (const unsigned char *)xq, (const unsigned char *)w, y);
    return launched(cd, "compact product kernel");
}

__global__ void convert_half_k(size_t n, int kind, int to_half, const void *src, void *dst) {
    GRID_LOOP(e, n) {
        if (to_half)
            ((unsigned short *)dst)[e] =
                kind == 1 ? __half_as_ushort(__float2half_rn(((const float *)src)[e]))
                          : bf16_rne(((const float *)src)[e]);
        else
            ((float *)dst)[e] =
                kind == 1 ? __half2float(__ushort_as_half(((const unsigned short *)src)[e]))
                          : __uint_as_float((unsigned)((const unsigned short *)src)[e] << 16);
    }
}

td_status cuda_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src,
                            void *dst) {
    cuda_device *cd = dev_of(ctx);
    if (n == 0)
        return TD_OK;
    convert_half_k<<<grid_for(n), kThreads, 0, cd->stream>>>(n, kind, to_half, src, dst);
    return launched(cd, "half conversion kernel");
}

// A cache element in kind 0 (f32), 1 (f16) or 2 (bf16), as f32.
__device__ float cache_at(int kind, const unsigned char *b, int64_t e) {
    if (kind == 0)
        return ((const float *)b)[e];
    unsigned short u = ((const unsigned short *)b)[e];
    return kind == 1 ? __half2float(__ushort_as_half(u)) : __uint_as_float((unsigned)u << 16);
}

// One position's attention, a thread per query head i (as OpenCL's): its
// scores against key head i / g into s (h, len), their softmax, y_i = p V.
__global__ void attend_step_k(int64_t h, int64_t g, int64_t d, int64_t len, int64_t ld, int kind,
                              float scale, const float *q, const unsigned char *k,
                              const unsigned char *v, float *s, float *y) {
    GRID_LOOP(i, h) {
        int64_t col = (i / g) * d;
        float *si = s + i * len, mx = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < len; t++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < d; c++)
                acc += q[i * d + c] * cache_at(kind, k, t * ld + col + c);
            si[t] = acc * scale;
            mx = fmaxf(mx, si[t]);
        }
        for (int64_t t = 0; t < len; t++) {
            si[t] = expf(si[t] - mx);
            sum += si[t];
        }
        for (int64_t c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < len; t++)
                acc += si[t] * cache_at(kind, v, t * ld + col + c);
            y[i * d + c] = acc / sum;
        }
    }
}

td_status cuda_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                           float scale, const float *q, const void *k, const void *v, int64_t ld,
                           float *y) {
    cuda_device *cd = dev_of(ctx);
    void *s;
    if (kind < 0 || kind > 2 || h < 1 || kv < 1 || h % kv || d < 1 || len < 1 || ld < 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "attend_step: kind %d, %lld heads over %lld, d %lld, %lld positions, "
                         "rows of %lld",
                         kind, (long long)h, (long long)kv, (long long)d, (long long)len,
                         (long long)ld);
    TD_CHECK(td__cuda_scratch(cd, (size_t)(h * len) * sizeof(float), &s));
    attend_step_k<<<grid_for((size_t)h), kThreads, 0, cd->stream>>>(
        h, h / kv, d, len, ld, kind, scale, q, (const unsigned char *)k, (const unsigned char *)v,
        (float *)s, y);
    return launched(cd, "attention step kernel");
}

} // namespace td_cuda
