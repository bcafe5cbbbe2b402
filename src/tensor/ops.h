/* Tensor-level ops: the internal API the nn layer computes with. Each op
 * checks shapes, types and devices, then calls the tensor's device kernel.
 *
 * Every op must be called on the tensors' device's host thread (inside
 * td_device_run or a device task); all tensors of one call live on one
 * device and share one dtype. A kernel the backend lacks gives
 * TD_ERR_UNSUPPORTED naming the op and the backend. Results are written into
 * caller-made tensors; nothing here allocates device memory. */
#ifndef TD_TENSOR_OPS_H
#define TD_TENSOR_OPS_H

#include "device/buffer.h"
#include "device/internal.h"
#include "device/kernels.h"
#include "tandem/tensor.h"
#include "tensor/view.h"

/* The tensor, here and not behind the public handle because the nn layer
 * holds tensors and views (out, dout, workspaces carved from an arena) by
 * value: a view is made per layer and pass, without an allocation. */
struct td_tensor {
    td_device *dev;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    size_t numel;
    td_buffer *buf;
    void *data; /* device pointer to element 0 */
};

/* The kernel table of the tensor's device. */
static inline const td_kernels *td__tensor_kernels(const td_tensor *t) {
    return td__device_kernels(t->dev);
}

/* Frees t's memory, keeping its shape: t is then read by no one (a
 * decoder's f32 matrices that a compact copy replaced). NULL-safe. */
void td__tensor_release(td_tensor *t);

/* Makes *view a tensor of `shape` over base's memory from element `offset`
 * on; the view owns nothing (td_tensor_destroy must not be called on it) and
 * is valid while base lives. Fails when it would reach past base's end. */
td_status td__tensor_view(td_tensor *view, const td_tensor *base, size_t offset, int ndim,
                          const int64_t *shape);

/* Rows of t seen as a matrix (prod of all but the last dim, last dim). */
int64_t td__tensor_rows(const td_tensor *t);
int64_t td__tensor_cols(const td_tensor *t);

/* c (m, n) = alpha op(a) op(b) + beta c, each tensor seen as a matrix of
 * (rows, last dim); ta / tb transpose. */
td_status td__op_matmul(td_tensor *c, const td_tensor *a, int ta, const td_tensor *b, int tb,
                        double alpha, double beta);

/* A GEMM batch over parts of tensors: matrix i of a starts at element
 * a_off + i * stride_a, has row stride lda, and so on; every access is
 * checked against the tensors' sizes. */
typedef struct td_gemm_operand {
    const td_tensor *t;
    size_t off;
    int64_t ld, stride;
} td_gemm_operand;
td_status td__op_gemm_batched(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                              td_gemm_operand a, td_gemm_operand b, double beta, td_gemm_operand c,
                              int64_t batch);

/* y (outer, c, inner) += bias (c). */
td_status td__op_bias_add(td_tensor *y, const td_tensor *bias, int64_t outer, int64_t c,
                          int64_t inner);
/* db (c) = acc db + sums of dy (outer, c, inner). */
td_status td__op_bias_grad(td_tensor *db, const td_tensor *dy, int64_t outer, int64_t c,
                           int64_t inner, int acc);
td_status td__op_act_fwd(td_act act, const td_tensor *x, td_tensor *y);
td_status td__op_act_bwd(td_act act, const td_tensor *x, const td_tensor *y, const td_tensor *dy,
                         td_tensor *dx);
/* y = a + b. */
td_status td__op_add(const td_tensor *a, const td_tensor *b, td_tensor *y);
/* y = alpha x + beta y. */
td_status td__op_axpby(double alpha, const td_tensor *x, double beta, td_tensor *y);
td_status td__op_copy(const td_tensor *x, td_tensor *y);
td_status td__op_dropout(double p, uint64_t seed, uint64_t offset, const td_tensor *x,
                         td_tensor *y);
/* Softmax cross-entropy over logits (.., classes) against `labels`, a buffer
 * of rows int32 on the same device. dlogits may be NULL. */
td_status td__op_xent(const td_tensor *logits, const td_buffer *labels, td_tensor *dlogits,
                      double grad_scale, double *loss_sum, int64_t *correct);
/* Over the last dim; mean and rstd have rows elements. */
td_status td__op_layernorm_fwd(double eps, const td_tensor *x, const td_tensor *gamma,
                               const td_tensor *beta, td_tensor *y, td_tensor *mean,
                               td_tensor *rstd);
td_status td__op_layernorm_bwd(const td_tensor *x, const td_tensor *gamma, const td_tensor *mean,
                               const td_tensor *rstd, const td_tensor *dy, td_tensor *dx,
                               td_tensor *dgamma, td_tensor *dbeta, int acc);
/* y (b, t, c) = wte[tokens] + wpe[t]; tokens a buffer of b*t int32. */
td_status td__op_embed_fwd(const td_buffer *tokens, const td_tensor *wte, const td_tensor *wpe,
                           td_tensor *y);
td_status td__op_embed_bwd(const td_buffer *tokens, const td_tensor *dy, td_tensor *dwte,
                           td_tensor *dwpe, int acc);
td_status td__op_conv2d_fwd(const td_conv_desc *d, const td_tensor *x, const td_tensor *w,
                            const td_tensor *bias, td_tensor *y);
td_status td__op_conv2d_bwd(const td_conv_desc *d, const td_tensor *x, const td_tensor *w,
                            const td_tensor *dy, td_tensor *dx, td_tensor *dw, td_tensor *db,
                            int acc);
/* argmax: a buffer of numel(y) int32 (max pooling), NULL in inference. */
td_status td__op_pool_fwd(td_pool_kind kind, const td_conv_desc *d, const td_tensor *x,
                          td_tensor *y, td_buffer *argmax);
td_status td__op_pool_bwd(td_pool_kind kind, const td_conv_desc *d, const td_tensor *dy,
                          const td_buffer *argmax, td_tensor *dx);
/* s, p: (.., t, t). */
td_status td__op_causal_softmax_fwd(double scale, const td_tensor *s, td_tensor *p);
td_status td__op_causal_softmax_bwd(double scale, const td_tensor *p, const td_tensor *dp,
                                    td_tensor *ds);
/* 1 when dev's backend has the fused attention kernels. */
int td__op_has_attention(const td_device *dev);
/* qkv (b, t, 3c), p (b, h, t, t), y (b, t, c); see td_kernels.attention_fwd. */
td_status td__op_attention_fwd(int64_t heads, double scale, const td_tensor *qkv, td_tensor *p,
                               td_tensor *y);
td_status td__op_attention_bwd(int64_t heads, double scale, const td_tensor *qkv,
                               const td_tensor *p, const td_tensor *dy, td_tensor *dqkv);
/* The Llama family's (ops_llama.c). RMSNorm over the last dim: y = x *
 * rstd * w, rstd (rows) kept for the backward; dx may be NULL. */
td_status td__op_rmsnorm_fwd(double eps, const td_tensor *x, const td_tensor *w, td_tensor *y,
                             td_tensor *rstd);
td_status td__op_rmsnorm_bwd(const td_tensor *x, const td_tensor *w, const td_tensor *rstd,
                             const td_tensor *dy, td_tensor *dx, td_tensor *dw, int acc);
/* h (.., f) = silu(g) u, each row of gu (.., 2f) being g then u. */
td_status td__op_swiglu_fwd(const td_tensor *gu, td_tensor *h);
td_status td__op_swiglu_bwd(const td_tensor *gu, const td_tensor *dh, td_tensor *dgu);
/* Rotates `heads` heads of d columns from column col of x (b, t, width) in
 * place, row (i, j) by position pos0 + j, from tab (2, positions, d/2); see
 * td_kernels.rope. */
td_status td__op_rope(const td_tensor *tab, int64_t pos0, int64_t col, int64_t heads, int64_t d,
                      int inverse, td_tensor *x);
/* raw (.., (h + 2 kv) d) <-> qkv (.., 3 h d); see td_kernels.kv_expand. */
td_status td__op_kv_expand(td_kv_map m, int64_t d, const td_tensor *raw, td_tensor *qkv);
td_status td__op_kv_reduce(td_kv_map m, int64_t d, const td_tensor *dqkv, td_tensor *draw);
/* y (.., rows) = x (.., cols) W^T, W (rows, cols) in fmt's compact bytes
 * at device pointer w (td_kernels.matmul_compact); x and y f32. */
td_status td__op_matmul_compact(td_tensor *y, const td_tensor *x, td_weights fmt, const void *w,
                                int64_t rows, int64_t cols);
td_status td__op_sumsq(const td_tensor *x, double *out);
td_status td__op_sgd(td_tensor *w, const td_tensor *g, td_tensor *buf, const td_opt_args *o);
td_status td__op_adamw(td_tensor *w, const td_tensor *g, td_tensor *m, td_tensor *v,
                       const td_opt_args *o);

#endif
