/* Tensor-level ops: checks, then the device's kernel (see ops.h). */
#include <string.h>

#include "core/error.h"
#include "tensor/tensor-impl.h"

/* The checks every op makes (tensor-impl.h). */

td_status td__op_check_thread(const td_tensor *t, const char *op) {
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "%s: a tensor is NULL", op);
    if (td_device_current() != t->dev)
        return td__error(TD_ERR_INVALID_ARG, "%s: called off %s's host thread", op,
                         td_device_name(t->dev));
    return TD_OK;
}

/* t (optional when may_be_null) lives on ref's device with ref's dtype. */
td_status td__op_check_like(const td_tensor *ref, const td_tensor *t, int may_be_null,
                            const char *op, const char *name) {
    if (!t) {
        if (may_be_null)
            return TD_OK;
        return td__error(TD_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    }
    if (t->dev != ref->dev)
        return td__error(TD_ERR_INVALID_ARG, "%s: %s is on %s, not %s", op, name,
                         td_device_name(t->dev), td_device_name(ref->dev));
    if (t->dtype != ref->dtype)
        return td__error(TD_ERR_DTYPE, "%s: %s is %s, not %s", op, name, td_dtype_name(t->dtype),
                         td_dtype_name(ref->dtype));
    return TD_OK;
}

td_status td__op_check_numel(const td_tensor *t, size_t want, const char *op, const char *name) {
    char s[64];
    if (t && t->numel != want)
        return td__error(TD_ERR_SHAPE, "%s: %s %s has %zu elements, expected %zu", op, name,
                         td__shape_str(t, s), t->numel, want);
    return TD_OK;
}

td_status td__op_check_buffer(const td_tensor *ref, const td_buffer *b, size_t nbytes,
                              const char *op, const char *name) {
    if (!b)
        return td__error(TD_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    if (b->dev != ref->dev)
        return td__error(TD_ERR_INVALID_ARG, "%s: %s is on %s, not %s", op, name,
                         td_device_name(b->dev), td_device_name(ref->dev));
    if (b->nbytes < nbytes)
        return td__error(TD_ERR_SHAPE, "%s: %s holds %zu bytes, %zu needed", op, name, b->nbytes,
                         nbytes);
    return TD_OK;
}

td_status td__tensor_view(td_tensor *view, const td_tensor *base, size_t offset, int ndim,
                          const int64_t *shape) {
    size_t numel = 1;
    if (!view || !base || ndim < 0 || ndim > TD_MAX_DIMS)
        return td__error(TD_ERR_INVALID_ARG, "tensor view: bad arguments");
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return td__error(TD_ERR_SHAPE, "tensor view: dimension %d is %lld", i,
                             (long long)shape[i]);
        numel *= (size_t)shape[i];
    }
    if (offset > base->numel || numel > base->numel - offset)
        return td__error(TD_ERR_SHAPE, "tensor view: %zu elements from %zu exceed %zu", numel,
                         offset, base->numel);
    memset(view, 0, sizeof *view);
    view->dev = base->dev;
    view->dtype = base->dtype;
    view->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        view->shape[i] = shape[i];
    view->numel = numel;
    view->buf = NULL;
    view->data = (char *)base->data + offset * td_dtype_size(base->dtype);
    return TD_OK;
}

int64_t td__tensor_cols(const td_tensor *t) {
    return t->ndim ? t->shape[t->ndim - 1] : 1;
}

int64_t td__tensor_rows(const td_tensor *t) {
    int64_t c = td__tensor_cols(t);
    return c ? (int64_t)t->numel / c : 0;
}

td_status td__op_matmul(td_tensor *c, const td_tensor *a, int ta, const td_tensor *b, int tb,
                        double alpha, double beta) {
    const char *op = "matmul";
    int64_t am, ak, bk, bn;
    char sa[64], sb[64], sc[64];
    TD_CHECK(td__op_check_thread(c, op));
    TD_CHECK(td__op_check_like(c, a, 0, op, "a"));
    TD_CHECK(td__op_check_like(c, b, 0, op, "b"));
    am = ta ? td__tensor_cols(a) : td__tensor_rows(a);
    ak = ta ? td__tensor_rows(a) : td__tensor_cols(a);
    bk = tb ? td__tensor_cols(b) : td__tensor_rows(b);
    bn = tb ? td__tensor_rows(b) : td__tensor_cols(b);
    if (ak != bk || td__tensor_rows(c) != am || td__tensor_cols(c) != bn)
        return td__error(TD_ERR_SHAPE, "matmul: %s%s x %s%s into %s", td__shape_str(a, sa),
                         ta ? "^T" : "", td__shape_str(b, sb), tb ? "^T" : "",
                         td__shape_str(c, sc));
    if (c->dtype == TD_F32 && td_device_precision(c->dev) == TD_PRECISION_BF16) {
        /* set only where the backend has the slot (td_device_set_precision) */
        KERNEL(c, gemm_bf16);
        return k_->gemm_bf16(ctx_, ta, tb, am, bn, ak, alpha, a->data, td__tensor_cols(a), b->data,
                             td__tensor_cols(b), beta, c->data, td__tensor_cols(c));
    }
    {
        KERNEL(c, gemm);
        return k_->gemm(ctx_, c->dtype, ta, tb, am, bn, ak, alpha, a->data, td__tensor_cols(a),
                        b->data, td__tensor_cols(b), beta, c->data, td__tensor_cols(c));
    }
}

/* The highest element a batched operand touches, +1. */
static size_t operand_end(td_gemm_operand o, int64_t rows, int64_t cols, int64_t batch) {
    if (rows <= 0 || cols <= 0 || batch <= 0)
        return o.off;
    return o.off + (size_t)((batch - 1) * o.stride + (rows - 1) * o.ld + cols);
}

td_status td__op_gemm_batched(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                              td_gemm_operand a, td_gemm_operand b, double beta, td_gemm_operand c,
                              int64_t batch) {
    const char *op = "gemm_batched";
    size_t es;
    TD_CHECK(td__op_check_thread(c.t, op));
    TD_CHECK(td__op_check_like(c.t, a.t, 0, op, "a"));
    TD_CHECK(td__op_check_like(c.t, b.t, 0, op, "b"));
    if (m < 0 || n < 0 || k < 0 || batch < 0 || a.ld < (ta ? m : k) || b.ld < (tb ? k : n) ||
        c.ld < n)
        return td__error(TD_ERR_INVALID_ARG,
                         "gemm_batched: m %lld n %lld k %lld with leading dims %lld %lld %lld",
                         (long long)m, (long long)n, (long long)k, (long long)a.ld, (long long)b.ld,
                         (long long)c.ld);
    if (operand_end(a, ta ? k : m, ta ? m : k, batch) > a.t->numel ||
        operand_end(b, tb ? n : k, tb ? k : n, batch) > b.t->numel ||
        operand_end(c, m, n, batch) > c.t->numel)
        return td__error(TD_ERR_SHAPE, "gemm_batched: a batch of %lld reaches past a tensor",
                         (long long)batch);
    es = td_dtype_size(c.t->dtype);
    {
        KERNEL(c.t, gemm_batched);
        return k_->gemm_batched(ctx_, c.t->dtype, ta, tb, m, n, k, alpha,
                                (const char *)a.t->data + a.off * es, a.ld, a.stride,
                                (const char *)b.t->data + b.off * es, b.ld, b.stride, beta,
                                (char *)c.t->data + c.off * es, c.ld, c.stride, batch);
    }
}

td_status td__op_bias_add(td_tensor *y, const td_tensor *bias, int64_t outer, int64_t c,
                          int64_t inner) {
    const char *op = "bias_add";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, bias, 0, op, "bias"));
    TD_CHECK(td__op_check_numel(y, (size_t)(outer * c * inner), op, "y"));
    TD_CHECK(td__op_check_numel(bias, (size_t)c, op, "bias"));
    {
        KERNEL(y, bias_add);
        return k_->bias_add(ctx_, y->dtype, y->data, bias->data, outer, c, inner);
    }
}

td_status td__op_bias_grad(td_tensor *db, const td_tensor *dy, int64_t outer, int64_t c,
                           int64_t inner, int acc) {
    const char *op = "bias_grad";
    TD_CHECK(td__op_check_thread(db, op));
    TD_CHECK(td__op_check_like(db, dy, 0, op, "dy"));
    TD_CHECK(td__op_check_numel(dy, (size_t)(outer * c * inner), op, "dy"));
    TD_CHECK(td__op_check_numel(db, (size_t)c, op, "db"));
    {
        KERNEL(db, bias_grad);
        return k_->bias_grad(ctx_, db->dtype, db->data, dy->data, outer, c, inner, acc);
    }
}

td_status td__op_act_fwd(td_act act, const td_tensor *x, td_tensor *y) {
    const char *op = "act_fwd";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_numel(x, y->numel, op, "x"));
    {
        KERNEL(y, act_fwd);
        return k_->act_fwd(ctx_, y->dtype, act, y->numel, x->data, y->data);
    }
}

td_status td__op_act_bwd(td_act act, const td_tensor *x, const td_tensor *y, const td_tensor *dy,
                         td_tensor *dx) {
    const char *op = "act_bwd";
    TD_CHECK(td__op_check_thread(dx, op));
    TD_CHECK(td__op_check_like(dx, x, 0, op, "x"));
    TD_CHECK(td__op_check_like(dx, y, 0, op, "y"));
    TD_CHECK(td__op_check_like(dx, dy, 0, op, "dy"));
    TD_CHECK(td__op_check_numel(x, dx->numel, op, "x"));
    TD_CHECK(td__op_check_numel(y, dx->numel, op, "y"));
    TD_CHECK(td__op_check_numel(dy, dx->numel, op, "dy"));
    {
        KERNEL(dx, act_bwd);
        return k_->act_bwd(ctx_, dx->dtype, act, dx->numel, x->data, y->data, dy->data, dx->data);
    }
}

td_status td__op_add(const td_tensor *a, const td_tensor *b, td_tensor *y) {
    const char *op = "add";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, a, 0, op, "a"));
    TD_CHECK(td__op_check_like(y, b, 0, op, "b"));
    TD_CHECK(td__op_check_numel(a, y->numel, op, "a"));
    TD_CHECK(td__op_check_numel(b, y->numel, op, "b"));
    {
        KERNEL(y, add);
        return k_->add(ctx_, y->dtype, y->numel, a->data, b->data, y->data);
    }
}

td_status td__op_axpby(double alpha, const td_tensor *x, double beta, td_tensor *y) {
    const char *op = "axpby";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_numel(x, y->numel, op, "x"));
    {
        KERNEL(y, axpby);
        return k_->axpby(ctx_, y->dtype, y->numel, alpha, x->data, beta, y->data);
    }
}

td_status td_tensor_matmul(td_tensor *c, const td_tensor *a, int trans_a, const td_tensor *b,
                           int trans_b, double alpha, double beta) {
    return td__op_matmul(c, a, trans_a, b, trans_b, alpha, beta);
}

td_status td_tensor_add(const td_tensor *a, const td_tensor *b, td_tensor *y) {
    return td__op_add(a, b, y);
}

td_status td_tensor_axpby(double alpha, const td_tensor *x, double beta, td_tensor *y) {
    return td__op_axpby(alpha, x, beta, y);
}

td_status td__op_copy(const td_tensor *x, td_tensor *y) {
    return td__op_axpby(1.0, x, 0.0, y);
}

td_status td__op_dropout(double p, uint64_t seed, uint64_t offset, const td_tensor *x,
                         td_tensor *y) {
    const char *op = "dropout";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_numel(x, y->numel, op, "x"));
    if (!(p >= 0 && p < 1))
        return td__error(TD_ERR_INVALID_ARG, "dropout: p = %g is not in [0, 1)", p);
    {
        KERNEL(y, dropout);
        return k_->dropout(ctx_, y->dtype, y->numel, p, seed, offset, x->data, y->data);
    }
}

td_status td__op_xent(const td_tensor *logits, const td_buffer *labels, td_tensor *dlogits,
                      double grad_scale, double *loss_sum, int64_t *correct) {
    const char *op = "cross_entropy";
    int64_t rows, classes;
    TD_CHECK(td__op_check_thread(logits, op));
    TD_CHECK(td__op_check_like(logits, dlogits, 1, op, "dlogits"));
    TD_CHECK(td__op_check_numel(dlogits, logits->numel, op, "dlogits"));
    rows = td__tensor_rows(logits);
    classes = td__tensor_cols(logits);
    TD_CHECK(td__op_check_buffer(logits, labels, (size_t)rows * sizeof(int32_t), op, "labels"));
    {
        KERNEL(logits, xent);
        return k_->xent(ctx_, logits->dtype, rows, classes, logits->data, labels->ptr,
                        dlogits ? dlogits->data : NULL, grad_scale, loss_sum, correct);
    }
}

td_status td__op_layernorm_fwd(double eps, const td_tensor *x, const td_tensor *gamma,
                               const td_tensor *beta, td_tensor *y, td_tensor *mean,
                               td_tensor *rstd) {
    const char *op = "layernorm_fwd";
    int64_t rows, cols;
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_like(y, gamma, 0, op, "gamma"));
    TD_CHECK(td__op_check_like(y, beta, 0, op, "beta"));
    TD_CHECK(td__op_check_like(y, mean, 0, op, "mean"));
    TD_CHECK(td__op_check_like(y, rstd, 0, op, "rstd"));
    rows = td__tensor_rows(x);
    cols = td__tensor_cols(x);
    TD_CHECK(td__op_check_numel(y, x->numel, op, "y"));
    TD_CHECK(td__op_check_numel(gamma, (size_t)cols, op, "gamma"));
    TD_CHECK(td__op_check_numel(beta, (size_t)cols, op, "beta"));
    TD_CHECK(td__op_check_numel(mean, (size_t)rows, op, "mean"));
    TD_CHECK(td__op_check_numel(rstd, (size_t)rows, op, "rstd"));
    {
        KERNEL(y, layernorm_fwd);
        return k_->layernorm_fwd(ctx_, y->dtype, rows, cols, eps, x->data, gamma->data, beta->data,
                                 y->data, mean->data, rstd->data);
    }
}

td_status td__op_layernorm_bwd(const td_tensor *x, const td_tensor *gamma, const td_tensor *mean,
                               const td_tensor *rstd, const td_tensor *dy, td_tensor *dx,
                               td_tensor *dgamma, td_tensor *dbeta, int acc) {
    const char *op = "layernorm_bwd";
    int64_t rows, cols;
    TD_CHECK(td__op_check_thread(x, op));
    TD_CHECK(td__op_check_like(x, gamma, 0, op, "gamma"));
    TD_CHECK(td__op_check_like(x, mean, 0, op, "mean"));
    TD_CHECK(td__op_check_like(x, rstd, 0, op, "rstd"));
    TD_CHECK(td__op_check_like(x, dy, 0, op, "dy"));
    TD_CHECK(td__op_check_like(x, dx, 1, op, "dx"));
    TD_CHECK(td__op_check_like(x, dgamma, 0, op, "dgamma"));
    TD_CHECK(td__op_check_like(x, dbeta, 0, op, "dbeta"));
    rows = td__tensor_rows(x);
    cols = td__tensor_cols(x);
    TD_CHECK(td__op_check_numel(dy, x->numel, op, "dy"));
    TD_CHECK(td__op_check_numel(dx, x->numel, op, "dx"));
    TD_CHECK(td__op_check_numel(gamma, (size_t)cols, op, "gamma"));
    TD_CHECK(td__op_check_numel(dgamma, (size_t)cols, op, "dgamma"));
    TD_CHECK(td__op_check_numel(dbeta, (size_t)cols, op, "dbeta"));
    TD_CHECK(td__op_check_numel(mean, (size_t)rows, op, "mean"));
    TD_CHECK(td__op_check_numel(rstd, (size_t)rows, op, "rstd"));
    {
        KERNEL(x, layernorm_bwd);
        return k_->layernorm_bwd(ctx_, x->dtype, rows, cols, x->data, gamma->data, mean->data,
                                 rstd->data, dy->data, dx ? dx->data : NULL, dgamma->data,
                                 dbeta->data, acc);
    }
}

/* y or dy (b, t, c) against wte (vocab, c) and wpe (>= t, c). */
static td_status embed_shapes(const td_tensor *y, const td_tensor *wte, const td_tensor *wpe,
                              const char *op, int64_t *b, int64_t *t, int64_t *c) {
    char s[64];
    if (y->ndim != 3 || wte->ndim != 2 || wte->shape[1] != y->shape[2] ||
        (wpe && (wpe->ndim != 2 || wpe->shape[1] != y->shape[2] || wpe->shape[0] < y->shape[1])))
        return td__error(TD_ERR_SHAPE, "%s: output %s does not fit the tables", op,
                         td__shape_str(y, s));
    *b = y->shape[0];
    *t = y->shape[1];
    *c = y->shape[2];
    return TD_OK;
}

td_status td__op_embed_fwd(const td_buffer *tokens, const td_tensor *wte, const td_tensor *wpe,
                           td_tensor *y) {
    const char *op = "embed_fwd";
    int64_t b = 0, t = 0, c = 0;
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, wte, 0, op, "wte"));
    TD_CHECK(td__op_check_like(y, wpe, 1, op, "wpe"));
    TD_CHECK(embed_shapes(y, wte, wpe, op, &b, &t, &c));
    TD_CHECK(td__op_check_buffer(y, tokens, (size_t)(b * t) * sizeof(int32_t), op, "tokens"));
    {
        KERNEL(y, embed_fwd);
        return k_->embed_fwd(ctx_, y->dtype, b, t, c, wte->shape[0], tokens->ptr, wte->data,
                             wpe ? wpe->data : NULL, y->data);
    }
}

td_status td__op_embed_bwd(const td_buffer *tokens, const td_tensor *dy, td_tensor *dwte,
                           td_tensor *dwpe, int acc) {
    const char *op = "embed_bwd";
    int64_t b = 0, t = 0, c = 0;
    TD_CHECK(td__op_check_thread(dy, op));
    TD_CHECK(td__op_check_like(dy, dwte, 0, op, "dwte"));
    TD_CHECK(td__op_check_like(dy, dwpe, 1, op, "dwpe"));
    TD_CHECK(embed_shapes(dy, dwte, dwpe, op, &b, &t, &c));
    TD_CHECK(td__op_check_buffer(dy, tokens, (size_t)(b * t) * sizeof(int32_t), op, "tokens"));
    {
        KERNEL(dy, embed_bwd);
        return k_->embed_bwd(ctx_, dy->dtype, b, t, c, dwte->shape[0], tokens->ptr, dy->data,
                             dwte->data, dwpe ? dwpe->data : NULL, acc);
    }
}

static td_status check_desc(const td_conv_desc *d, const char *op) {
    if (!d || d->n < 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->oc <= 0 || d->kh <= 0 ||
        d->kw <= 0 || d->stride <= 0 || d->pad < 0 ||
        d->oh != (d->h + 2 * d->pad - d->kh) / d->stride + 1 ||
        d->ow != (d->w + 2 * d->pad - d->kw) / d->stride + 1 || d->oh <= 0 || d->ow <= 0)
        return td__error(TD_ERR_SHAPE, "%s: inconsistent window description", op);
    return TD_OK;
}

td_status td__op_conv2d_fwd(const td_conv_desc *d, const td_tensor *x, const td_tensor *w,
                            const td_tensor *bias, td_tensor *y) {
    const char *op = "conv2d_fwd";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(check_desc(d, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_like(y, w, 0, op, "w"));
    TD_CHECK(td__op_check_like(y, bias, 1, op, "bias"));
    TD_CHECK(td__op_check_numel(x, (size_t)(d->n * d->c * d->h * d->w), op, "x"));
    TD_CHECK(td__op_check_numel(y, (size_t)(d->n * d->oc * d->oh * d->ow), op, "y"));
    TD_CHECK(td__op_check_numel(w, (size_t)(d->oc * d->c * d->kh * d->kw), op, "w"));
    TD_CHECK(td__op_check_numel(bias, (size_t)d->oc, op, "bias"));
    {
        KERNEL(y, conv2d_fwd);
        return k_->conv2d_fwd(ctx_, y->dtype, d, x->data, w->data, bias ? bias->data : NULL,
                              y->data);
    }
}

td_status td__op_conv2d_bwd(const td_conv_desc *d, const td_tensor *x, const td_tensor *w,
                            const td_tensor *dy, td_tensor *dx, td_tensor *dw, td_tensor *db,
                            int acc) {
    const char *op = "conv2d_bwd";
    TD_CHECK(td__op_check_thread(dy, op));
    TD_CHECK(check_desc(d, op));
    TD_CHECK(td__op_check_like(dy, x, 0, op, "x"));
    TD_CHECK(td__op_check_like(dy, w, 0, op, "w"));
    TD_CHECK(td__op_check_like(dy, dx, 1, op, "dx"));
    TD_CHECK(td__op_check_like(dy, dw, 0, op, "dw"));
    TD_CHECK(td__op_check_like(dy, db, 1, op, "db"));
    TD_CHECK(td__op_check_numel(x, (size_t)(d->n * d->c * d->h * d->w), op, "x"));
    TD_CHECK(td__op_check_numel(dx, x->numel, op, "dx"));
    TD_CHECK(td__op_check_numel(dy, (size_t)(d->n * d->oc * d->oh * d->ow), op, "dy"));
    TD_CHECK(td__op_check_numel(w, (size_t)(d->oc * d->c * d->kh * d->kw), op, "w"));
    TD_CHECK(td__op_check_numel(dw, w->numel, op, "dw"));
    TD_CHECK(td__op_check_numel(db, (size_t)d->oc, op, "db"));
    {
        KERNEL(dy, conv2d_bwd);
        return k_->conv2d_bwd(ctx_, dy->dtype, d, x->data, w->data, dy->data, dx ? dx->data : NULL,
                              dw->data, db ? db->data : NULL, acc);
    }
}

td_status td__op_pool_fwd(td_pool_kind kind, const td_conv_desc *d, const td_tensor *x,
                          td_tensor *y, td_buffer *argmax) {
    const char *op = "pool_fwd";
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(check_desc(d, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    if (d->oc != d->c)
        return td__error(TD_ERR_SHAPE, "pool_fwd: %lld channels in, %lld out", (long long)d->c,
                         (long long)d->oc);
    if (2 * d->pad > d->kh || 2 * d->pad > d->kw)
        return td__error(TD_ERR_SHAPE, "pool_fwd: padding %lld is more than half the window",
                         (long long)d->pad);
    TD_CHECK(td__op_check_numel(x, (size_t)(d->n * d->c * d->h * d->w), op, "x"));
    TD_CHECK(td__op_check_numel(y, (size_t)(d->n * d->c * d->oh * d->ow), op, "y"));
    if (argmax)
        TD_CHECK(td__op_check_buffer(y, argmax, y->numel * sizeof(int32_t), op, "argmax"));
    {
        KERNEL(y, pool_fwd);
        return k_->pool_fwd(ctx_, y->dtype, kind, d, x->data, y->data, argmax ? argmax->ptr : NULL);
    }
}

td_status td__op_pool_bwd(td_pool_kind kind, const td_conv_desc *d, const td_tensor *dy,
                          const td_buffer *argmax, td_tensor *dx) {
    const char *op = "pool_bwd";
    TD_CHECK(td__op_check_thread(dx, op));
    TD_CHECK(check_desc(d, op));
    TD_CHECK(td__op_check_like(dx, dy, 0, op, "dy"));
    TD_CHECK(td__op_check_numel(dx, (size_t)(d->n * d->c * d->h * d->w), op, "dx"));
    TD_CHECK(td__op_check_numel(dy, (size_t)(d->n * d->c * d->oh * d->ow), op, "dy"));
    if (kind == TD_POOL_MAX)
        TD_CHECK(td__op_check_buffer(dx, argmax, dy->numel * sizeof(int32_t), op, "argmax"));
    {
        KERNEL(dx, pool_bwd);
        return k_->pool_bwd(ctx_, dx->dtype, kind, d, dy->data,
                            argmax ? (const int32_t *)argmax->ptr : NULL, dx->data);
    }
}

static td_status square_rows(const td_tensor *s, const char *op, int64_t *mats, int64_t *t) {
    char buf[64];
    if (s->ndim < 2 || s->shape[s->ndim - 1] != s->shape[s->ndim - 2] || s->numel == 0)
        return td__error(TD_ERR_SHAPE, "%s: %s is not a stack of square matrices", op,
                         td__shape_str(s, buf));
    *t = s->shape[s->ndim - 1];
    *mats = (int64_t)s->numel / (*t * *t);
    return TD_OK;
}

td_status td__op_causal_softmax_fwd(double scale, const td_tensor *s, td_tensor *p) {
    const char *op = "causal_softmax_fwd";
    int64_t mats = 0, t = 0;
    TD_CHECK(td__op_check_thread(p, op));
    TD_CHECK(td__op_check_like(p, s, 0, op, "s"));
    TD_CHECK(square_rows(s, op, &mats, &t));
    TD_CHECK(td__op_check_numel(p, s->numel, op, "p"));
    {
        KERNEL(p, causal_softmax_fwd);
        return k_->causal_softmax_fwd(ctx_, p->dtype, mats, t, scale, s->data, p->data);
    }
}

td_status td__op_causal_softmax_bwd(double scale, const td_tensor *p, const td_tensor *dp,
                                    td_tensor *ds) {
    const char *op = "causal_softmax_bwd";
    int64_t mats = 0, t = 0;
    TD_CHECK(td__op_check_thread(ds, op));
    TD_CHECK(td__op_check_like(ds, p, 0, op, "p"));
    TD_CHECK(td__op_check_like(ds, dp, 0, op, "dp"));
    TD_CHECK(square_rows(p, op, &mats, &t));
    TD_CHECK(td__op_check_numel(dp, p->numel, op, "dp"));
    TD_CHECK(td__op_check_numel(ds, p->numel, op, "ds"));
    {
        KERNEL(ds, causal_softmax_bwd);
        return k_->causal_softmax_bwd(ctx_, ds->dtype, mats, t, scale, p->data, dp->data, ds->data);
    }
}

int td__op_has_attention(const td_device *dev) {
    const td_kernels *k = td__device_kernels(dev);
    return k && k->attention_fwd && k->attention_bwd;
}

/* qkv (b, t, 3c) and the shapes of p (b, h, t, t) and y (b, t, c) against it. */
static td_status attention_shapes(int64_t heads, const td_tensor *qkv, const td_tensor *p,
                                  const td_tensor *y, const char *op, int64_t *b, int64_t *t,
                                  int64_t *c) {
    char s[64];
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0 || heads <= 0 || (qkv->shape[2] / 3) % heads != 0)
        return td__error(TD_ERR_SHAPE, "%s: qkv %s is not (b, t, 3c) with c a multiple of %lld", op,
                         td__shape_str(qkv, s), (long long)heads);
    *b = qkv->shape[0];
    *t = qkv->shape[1];
    *c = qkv->shape[2] / 3;
    TD_CHECK(td__op_check_numel(p, (size_t)(*b * heads * *t * *t), op, "p"));
    return td__op_check_numel(y, (size_t)(*b * *t * *c), op, "y");
}

td_status td__op_attention_fwd(int64_t heads, double scale, const td_tensor *qkv, td_tensor *p,
                               td_tensor *y) {
    const char *op = "attention_fwd";
    int64_t b = 0, t = 0, c = 0;
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, qkv, 0, op, "qkv"));
    TD_CHECK(td__op_check_like(y, p, 0, op, "p"));
    TD_CHECK(attention_shapes(heads, qkv, p, y, op, &b, &t, &c));
    {
        KERNEL(y, attention_fwd);
        return k_->attention_fwd(ctx_, y->dtype, b, t, c, heads, scale, qkv->data, p->data,
                                 y->data);
    }
}

td_status td__op_attention_bwd(int64_t heads, double scale, const td_tensor *qkv,
                               const td_tensor *p, const td_tensor *dy, td_tensor *dqkv) {
    const char *op = "attention_bwd";
    int64_t b = 0, t = 0, c = 0;
    TD_CHECK(td__op_check_thread(dqkv, op));
    TD_CHECK(td__op_check_like(dqkv, qkv, 0, op, "qkv"));
    TD_CHECK(td__op_check_like(dqkv, p, 0, op, "p"));
    TD_CHECK(td__op_check_like(dqkv, dy, 0, op, "dy"));
    TD_CHECK(attention_shapes(heads, qkv, p, dy, op, &b, &t, &c));
    TD_CHECK(td__op_check_numel(dqkv, qkv->numel, op, "dqkv"));
    {
        KERNEL(dqkv, attention_bwd);
        return k_->attention_bwd(ctx_, dqkv->dtype, b, t, c, heads, scale, qkv->data, p->data,
                                 dy->data, dqkv->data);
    }
}

td_status td__op_sumsq(const td_tensor *x, double *out) {
    TD_CHECK(td__op_check_thread(x, "sumsq"));
    {
        KERNEL(x, sumsq);
        return k_->sumsq(ctx_, x->dtype, x->numel, x->data, out);
    }
}

td_status td__op_sgd(td_tensor *w, const td_tensor *g, td_tensor *buf, const td_opt_args *o) {
    const char *op = "sgd";
    TD_CHECK(td__op_check_thread(w, op));
    TD_CHECK(td__op_check_like(w, g, 0, op, "gradient"));
    TD_CHECK(td__op_check_like(w, buf, 1, op, "momentum buffer"));
    TD_CHECK(td__op_check_numel(g, w->numel, op, "gradient"));
    TD_CHECK(td__op_check_numel(buf, w->numel, op, "momentum buffer"));
    {
        KERNEL(w, sgd);
        return k_->sgd(ctx_, w->dtype, w->numel, w->data, g->data, buf ? buf->data : NULL, o);
    }
}

td_status td__op_adamw(td_tensor *w, const td_tensor *g, td_tensor *m, td_tensor *v,
                       const td_opt_args *o) {
    const char *op = "adamw";
    TD_CHECK(td__op_check_thread(w, op));
    TD_CHECK(td__op_check_like(w, g, 0, op, "gradient"));
    TD_CHECK(td__op_check_like(w, m, 0, op, "exp_avg"));
    TD_CHECK(td__op_check_like(w, v, 0, op, "exp_avg_sq"));
    TD_CHECK(td__op_check_numel(g, w->numel, op, "gradient"));
    TD_CHECK(td__op_check_numel(m, w->numel, op, "exp_avg"));
    TD_CHECK(td__op_check_numel(v, w->numel, op, "exp_avg_sq"));
    {
        KERNEL(w, adamw);
        return k_->adamw(ctx_, w->dtype, w->numel, w->data, g->data, m->data, v->data, o);
    }
}
