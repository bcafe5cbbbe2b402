/* The Llama family's own layers: RMSNorm and the SwiGLU MLP, planning,
 * forward and backward (built in layers_build_llama.c; the attention's
 * grouped-query heads and rotary positions are in layers.c). */
#include "core/error.h"
#include "nn/nn-impl.h"

/* RMSNorm ---------------------------------------------------------------------------- */

static td_status rms_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    int64_t rows = td__nn_numel(l->in_shape, l->in_ndim - 1);
    TD_CHECK(td__plan_tensor(p, &l->out, 1, l->out_ndim, l->out_shape));
    TD_CHECK(td__plan_tensor(p, &l->dout, 1, l->out_ndim, l->out_shape));
    /* ws[0] (n, rows): each row's 1 / rms, for the backward */
    return td__plan_tensor(p, &l->ws[0], 1, 1, &rows);
}

static td_status rms_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return td__op_rmsnorm_fwd(l->eps, x, l->param[0], &l->out, &l->ws[0]);
}

static td_status rms_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return td__op_rmsnorm_bwd(x, l->param[0], &l->ws[0], &l->dout, dx, l->grad[0], r->acc);
}

const td_layer_vt td__rmsnorm_vt = {"rmsnorm", rms_plan, rms_forward, rms_backward, NULL};

/* SwiGLU ------------------------------------------------------------------------------ */

/* param: gate_up.weight (2f, c), gate_up.bias (2f), down.weight (c, f),
 * down.bias (c); the biases NULL without "bias". */
enum { SW_GU, SW_H, SW_DH, SW_DGU };

static td_status swiglu_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    int64_t s[TD_MAX_DIMS];
    int nd = l->in_ndim;
    TD_CHECK(td__plan_tensor(p, &l->out, 1, l->out_ndim, l->out_shape));
    TD_CHECK(td__plan_tensor(p, &l->dout, 1, l->out_ndim, l->out_shape));
    for (int i = 0; i < nd - 1; i++)
        s[i] = l->in_shape[i];
    s[nd - 1] = 2 * l->hidden;
    TD_CHECK(td__plan_tensor(p, &l->ws[SW_GU], 1, nd, s));
    TD_CHECK(td__plan_tensor(p, &l->ws[SW_DGU], 1, nd, s));
    s[nd - 1] = l->hidden;
    TD_CHECK(td__plan_tensor(p, &l->ws[SW_H], 1, nd, s));
    return td__plan_tensor(p, &l->ws[SW_DH], 1, nd, s);
}

/* In a shard (TD__SPLIT_GATED) the layer computes its hidden features only
 * (l->hidden of them, maybe none): the down projection's output is a
 * partial sum, summed across the shards before the bias is added once, and
 * the input gradient likewise. */
static td_status swiglu_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_tensor *gu = &l->ws[SW_GU], *h = &l->ws[SW_H];
    int64_t rows = td__tensor_rows(&l->out), c = td__tensor_cols(&l->out);
    /* gu (rows, 2f) = x Wgu^T + bgu; h (rows, f) = silu(g) u; out (rows, c) = h Wd^T + bd */
    if (l->hidden == 0) {
        TD_CHECK(td__zero(&l->out));
    } else {
        TD_CHECK(td__op_matmul(gu, x, 0, l->param[0], 1, 1.0, 0.0));
        if (l->has_bias)
            TD_CHECK(td__op_bias_add(gu, l->param[1], rows, 2 * l->hidden, 1));
        TD_CHECK(td__op_swiglu_fwd(gu, h));
        TD_CHECK(td__op_matmul(&l->out, h, 0, l->param[2], 1, 1.0, 0.0));
    }
    if (l->split.kind == TD__SPLIT_GATED)
        TD_CHECK(td__model_reduce(r->model, &l->out));
    return l->has_bias ? td__op_bias_add(&l->out, l->param[3], rows, c, 1) : TD_OK;
}

/* The parameter gradients, from dout, h, dgu and x. */
static td_status swiglu_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    int64_t rows = td__tensor_rows(&l->out), c = td__tensor_cols(&l->out);
    double beta = r->acc ? 1.0 : 0.0;
    if (l->has_bias)
        TD_CHECK(td__op_bias_grad(l->grad[3], &l->dout, rows, c, 1, r->acc));
    if (l->hidden == 0)
        return TD_OK;
    /* dWd (c, f) = dout^T h; dWgu (2f, in) = dgu^T x */
    TD_CHECK(td__op_matmul(l->grad[2], &l->dout, 1, &l->ws[SW_H], 0, 1.0, beta));
    TD_CHECK(td__op_matmul(l->grad[0], &l->ws[SW_DGU], 1, x, 0, 1.0, beta));
    return l->has_bias
               ? td__op_bias_grad(l->grad[1], &l->ws[SW_DGU], rows, 2 * l->hidden, 1, r->acc)
               : TD_OK;
}

static td_status swiglu_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    /* dh (rows, f) = dout Wd; dgu from dh; dx (rows, in) = dgu Wgu */
    if (l->hidden > 0) {
        TD_CHECK(td__op_matmul(&l->ws[SW_DH], &l->dout, 0, l->param[2], 0, 1.0, 0.0));
        TD_CHECK(td__op_swiglu_bwd(&l->ws[SW_GU], &l->ws[SW_DH], &l->ws[SW_DGU]));
    }
    if (!r->defer)
        TD_CHECK(swiglu_weights(l, x, r));
    if (!dx)
        return TD_OK;
    if (l->hidden == 0)
        TD_CHECK(td__zero(dx));
    else
        TD_CHECK(td__op_matmul(dx, &l->ws[SW_DGU], 0, l->param[0], 0, 1.0, 0.0));
    return l->split.kind == TD__SPLIT_GATED ? td__model_reduce(r->model, dx) : TD_OK;
}

const td_layer_vt td__swiglu_vt = {"swiglu", swiglu_plan, swiglu_forward, swiglu_backward,
                                   swiglu_weights};
