/* The ops every backend implements, called on the device's host thread with
 * device pointers. The tensor and nn layers reach kernels only through this
 * table, so a new backend is a new table.
 *
 * Conventions: matrices are row-major; `dt` says whether every floating
 * pointer is float or double; token and label pointers are int32 device
 * memory; results that come back to the host (loss sums, norms) are written
 * through host pointers and are final when the call returns. A slot may be
 * NULL when a backend lacks the op: the tensor layer (src/tensor/ops.c) then
 * fails with TD_ERR_UNSUPPORTED naming the op and the backend. `acc` flags
 * choose between overwriting a gradient (0) and adding to it (1). */
#ifndef TD_DEVICE_KERNELS_H
#define TD_DEVICE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

typedef enum td_rng_kind {
    TD_RNG_UNIFORM = 0, /* a + (b - a) * u, u in [0, 1) */
    TD_RNG_NORMAL = 1,  /* a + b * z, z standard normal */
} td_rng_kind;

typedef enum td_act {
    TD_ACT_RELU = 0,
    TD_ACT_GELU = 1, /* x * Phi(x) with the exact erf, as torch.nn.GELU() */
    TD_ACT_TANH = 2,
    TD_ACT_SIGMOID = 3,
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's "gelu_new", as
     * torch.nn.GELU(approximate="tanh"); checkpoints trained with it need it */
    TD_ACT_GELU_TANH = 4,
} td_act;

typedef enum td_pool_kind {
    TD_POOL_MAX = 0,
    TD_POOL_AVG = 1, /* padding counts as zeros, as PyTorch's default */
} td_pool_kind;

/* A 2-D convolution or pooling window over NCHW images. For pooling, oc = c
 * and the kernel has no weights. oh = (h + 2 pad - kh) / stride + 1. */
typedef struct td_conv_desc {
    int64_t n, c, h, w; /* input (n, c, h, w) */
    int64_t oc, oh, ow; /* output (n, oc, oh, ow) */
    int64_t kh, kw, stride, pad;
} td_conv_desc;

/* Optimizer hyper-parameters for one update; grad_mul scales every gradient
 * first (clipping), lr is this step's rate. */
typedef struct td_opt_args {
    double lr, grad_mul, weight_decay;
    double momentum; /* SGD */
    int nesterov;    /* SGD */
    int first;       /* SGD: 1 on the first step (the buffer becomes the gradient) */
    double beta1, beta2, eps;
    double bias_corr1, bias_corr2; /* AdamW: 1 - beta^t */
} td_opt_args;

/* Which key and value head each query head reads: query head i of h reads
 * head (i + skew) / g of kv. A whole layer has g = h / kv and skew 0; a
 * shard holding query heads [first, first + h) of a layer's groups of g
 * holds the key and value heads they read, skew = first % g of them. */
typedef struct td_kv_map {
    int64_t h, kv, g, skew;
} td_kv_map;

/* The query heads [*lo, *hi) that read key and value head j. */
static inline void td__kv_queries(td_kv_map m, int64_t j, int64_t *lo, int64_t *hi) {
    int64_t a = j * m.g - m.skew, b = (j + 1) * m.g - m.skew;
    *lo = a < 0 ? 0 : a;
    *hi = b > m.h ? m.h : b;
}

typedef struct td_kernels {
    /* x[0:n] = value. */
    td_status (*fill)(void *ctx, void *x, td_dtype dt, size_t n, double value);
    /* x[i] = the (offset + i)-th number of stream `seed` (td_rng_uniform or
     * td_rng_normal), scaled by a and b as td_rng_kind says. */
    td_status (*rng)(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                     uint64_t offset, double a, double b);

    /* C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B) (k, n);
     * ta/tb: 1 transposes. lda, ldb, ldc are the row strides as stored. */
    td_status (*gemm)(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                      double beta, void *c, int64_t ldc);
    /* Optional: gemm for f32 matrices whose inputs are rounded to bf16
     * (nearest even) and multiplied with f32 accumulation: mixed-precision
     * training's products (td_device_set_precision). NULL: the backend has
     * no bf16 path, and the tensor layer computes in f32. */
    td_status (*gemm_bf16)(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                           float *c, int64_t ldc);
    /* `batch` GEMMs; matrix i starts stride_a * i elements after a, and so on. */
    td_status (*gemm_batched)(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                              int64_t k, double alpha, const void *a, int64_t lda, int64_t stride_a,
                              const void *b, int64_t ldb, int64_t stride_b, double beta, void *c,
                              int64_t ldc, int64_t stride_c, int64_t batch);

    /* y (outer, c, inner) += bias (c). */
    td_status (*bias_add)(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer,
                          int64_t c, int64_t inner);
    /* db (c) = acc * db + sum of dy (outer, c, inner) over outer and inner. */
    td_status (*bias_grad)(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer,
                           int64_t c, int64_t inner, int acc);
    /* y = f(x), n elements; y may be x. */
    td_status (*act_fwd)(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, void *y);
    /* dx = dy * f'(x); y = f(x) is given too (tanh and sigmoid use it). dx may be dy. */
    td_status (*act_bwd)(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, const void *y,
                         const void *dy, void *dx);
    /* y = a + b. */
    td_status (*add)(void *ctx, td_dtype dt, size_t n, const void *a, const void *b, void *y);
    /* y = alpha x + beta y (beta 0: y is only written). */
    td_status (*axpby)(void *ctx, td_dtype dt, size_t n, double alpha, const void *x, double beta,
                       void *y);
    /* y = x * keep / (1 - p), keep = (number (offset + i) of stream seed >= p).
     * The same call with dy and dx is the backward. */
    td_status (*dropout)(void *ctx, td_dtype dt, size_t n, double p, uint64_t seed, uint64_t offset,
                         const void *x, void *y);
    /* Softmax cross-entropy over logits (rows, classes) with labels (rows):
     * *loss_sum gets the sum of -log softmax[label], *correct how many rows'
     * arg-max equal the label; when dlogits is not NULL it gets
     * grad_scale * (softmax - onehot). Labels outside [0, classes) are an
     * error (TD_ERR_INVALID_ARG naming the row). */
    td_status (*xent)(void *ctx, td_dtype dt, int64_t rows, int64_t classes, const void *logits,
                      const int32_t *labels, void *dlogits, double grad_scale, double *loss_sum,
                      int64_t *correct);
    /* y = (x - mean) * rstd * gamma + beta per row of x (rows, cols); mean and
     * rstd (rows) are kept for the backward. */
    td_status (*layernorm_fwd)(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                               const void *x, const void *gamma, const void *beta, void *y,
                               void *mean, void *rstd);
    /* dx = d/dx (dx may be NULL); dgamma, dbeta as acc says. */
    td_status (*layernorm_bwd)(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                               const void *gamma, const void *mean, const void *rstd,
                               const void *dy, void *dx, void *dgamma, void *dbeta, int acc);
    /* y (b, t, c) = wte[tokens (b, t)] + wpe[t] (wpe (>= t, c) may be NULL).
     * Token ids outside [0, vocab) are an error naming the position. */
    td_status (*embed_fwd)(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                           const int32_t *tokens, const void *wte, const void *wpe, void *y);
    /* dwte[tokens] += dy, dwpe[t] += sum over b of dy; both first zeroed
     * unless acc. dwpe may be NULL. */
    td_status (*embed_bwd)(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                           const int32_t *tokens, const void *dy, void *dwte, void *dwpe, int acc);
    /* y (n, oc, oh, ow) = conv(x (n, c, h, w), w (oc, c, kh, kw)) + bias (oc). */
    td_status (*conv2d_fwd)(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                            const void *w, const void *bias, void *y);
    /* dx (NULL: skipped) = conv transposed of dy; dw, db as acc says. */
    td_status (*conv2d_bwd)(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                            const void *w, const void *dy, void *dx, void *dw, void *db, int acc);
    /* y (n, c, oh, ow) pooled from x; for max, argmax (n, c, oh, ow) gets the
     * index into the (h, w) plane of each maximum (NULL in inference). */
    td_status (*pool_fwd)(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                          const void *x, void *y, int32_t *argmax);
    /* dx = the gradient of the pooling (overwritten). */
    td_status (*pool_bwd)(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                          const void *dy, const int32_t *argmax, void *dx);
    /* For each of `rows` (t, t) matrices: p = softmax(scale * s) over each row
     * with the entries above the diagonal masked out (and written as 0). */
    td_status (*causal_softmax_fwd)(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                    const void *s, void *p);
    /* ds = scale * p * (dp - sum_j p dp) row by row (ds may be dp). */
    td_status (*causal_softmax_bwd)(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                    const void *p, const void *dp, void *ds);
    /* Optional, fused causal self-attention over qkv (b, t, 3c) (q, k, v side
     * by side, each h heads of c/h): p (b, h, t, t) = causal softmax(scale
     * q k^T), y (b, t, c) = p v with the heads side by side. NULL: the tensor
     * layer composes it from gemm_batched and causal_softmax_*. */
    td_status (*attention_fwd)(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                               double scale, const void *qkv, void *p, void *y);
    /* dqkv (b, t, 3c) from dy (b, t, c), with qkv and p from the forward. */
    td_status (*attention_bwd)(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                               double scale, const void *qkv, const void *p, const void *dy,
                               void *dqkv);
    /* The Llama family's ops (every slot optional, as ever).
     * y = x * rstd * w per row of x (rows, cols), rstd (rows) = 1 / sqrt(mean
     * of x^2 + eps), kept for the backward. */
    td_status (*rmsnorm_fwd)(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                             const void *x, const void *w, void *y, void *rstd);
    /* dx = d/dx (dx may be NULL); dw as acc says. */
    td_status (*rmsnorm_bwd)(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                             const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                             int acc);
    /* h (rows, f) = silu(g) * u, where each row of gu (rows, 2f) is g then u. */
    td_status (*swiglu_fwd)(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                            void *h);
    /* dgu (rows, 2f) from dh (rows, f) and the forward's gu. */
    td_status (*swiglu_bwd)(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                            const void *dh, void *dgu);
    /* Rotary position embedding in place on x (b, t, ld): in each row, the
     * `heads` heads of d columns from column col have their pairs (j, j +
     * d/2) rotated by the angle of the row's position, pos0 + (row's index
     * in t): x_j' = x_j cos - x_{j+d/2} sin, x_{j+d/2}' = x_{j+d/2} cos + x_j
     * sin, cos and sin read from tab (2, npos, d/2) (cos rows, then sin
     * rows; pos0 + t <= npos). inverse rotates the other way: the backward. */
    td_status (*rope)(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                      int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                      int inverse, void *x);
    /* Grouped-query attention: raw (rows, (h + 2 kv) d) (q, k, v side by
     * side, m.h query heads and m.kv key and value heads of d) into qkv
     * (rows, 3 h d), query head i reading key and value head (i + m.skew) /
     * m.g (td_kv_map). */
    td_status (*kv_expand)(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                           const void *raw, void *qkv);
    /* Its backward: draw (rows, (h + 2 kv) d) from dqkv (rows, 3 h d), each
     * key and value head's gradient summed over its query heads, in order. */
    td_status (*kv_reduce)(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                           const void *dqkv, void *draw);
    /* y (n, rows) = x (n, cols) W^T, x and y f32, W (rows, cols) compact:
     * bf16 row-major, or q8_0 (cols a multiple of 32; each row's cols / 32
     * blocks of 34 bytes, core/quant.h). The decoder's products with
     * compact weights; x is rounded as the format's kernels need (to bf16,
     * or to q8_0 blocks, as llama.cpp does) before the products. */
    td_status (*matmul_compact)(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                                const float *x, const void *w, float *y);
    /* n values between f32 and a 2-byte kind (1: f16, 2: bf16; both
     * rounded to nearest even): to_half 1 writes src's f32 into dst's 2-byte
     * values, 0 src's 2-byte values into dst's f32. A decoder's half
     * key/value caches. */
    td_status (*convert_half)(void *ctx, int kind, int to_half, size_t n, const void *src,
                              void *dst);
    /* One decoded position's attention: for each of the h query heads i,
     * y_i (d) = softmax(scale q_i K_j^T) V_j over positions [0, len), with
     * j = i / (h / kv) its key and value head. q (h d) and y (h d) are f32;
     * row t of K_j starts at element t ld + j d of k, and of V_j of v, in
     * kind's values (0: f32, 1: f16, 2: bf16), so the decoder reads its
     * cache as it is stored. NULL: the decoder composes the step from GEMMs
     * and the cross-entropy kernel on f32 rows. */
    td_status (*attend_step)(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                             float scale, const float *q, const void *k, const void *v, int64_t ld,
                             float *y);
    /* *out = sum of x[i]^2, accumulated in double. */
    td_status (*sumsq)(void *ctx, td_dtype dt, size_t n, const void *x, double *out);
    /* SGD with momentum (buf may be NULL when momentum is 0), L2 weight decay. */
    td_status (*sgd)(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *buf,
                     const td_opt_args *o);
    /* AdamW with decoupled weight decay, m and v the moments. */
    td_status (*adamw)(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *m, void *v,
                       const td_opt_args *o);
} td_kernels;

#endif
