/* The layers: building them from JSON, planning their activations, forward
 * and backward. Each leaf layer is a few tensor ops (src/tensor/ops.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/nn-impl.h"

static int64_t prod(const int64_t *s, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= s[i];
    return p;
}

static const char *shape_text(const int64_t *s, int n, char buf[64]) {
    size_t used = (size_t)snprintf(buf, 64, "(");
    for (int i = 0; i < n && used < 64; i++)
        used += (size_t)snprintf(buf + used, 64 - used, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (used < 64)
        snprintf(buf + used, 64 - used, ")");
    return buf;
}

/* The stream of one dropout layer in one step. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Per-sample rows of a (.., last) shape. */
static int64_t rows_of(const td_tensor *t) {
    return td__tensor_rows(t);
}

/* Linear ------------------------------------------------------------------------ */

static td_status plan_same(td_layer *l, td_nn_plan *p) {
    TD_CHECK(td__plan_tensor(p, &l->out, 1, l->out_ndim, l->out_shape));
    return td__plan_tensor(p, &l->dout, 1, l->out_ndim, l->out_shape);
}

static td_status linear_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    return plan_same(l, p);
}

static td_status linear_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    /* out (rows, out) = x (rows, in) W^T (in, out) + b */
    TD_CHECK(td__op_matmul(&l->out, x, 0, l->param[0], 1, 1.0, 0.0));
    if (l->has_bias)
        TD_CHECK(td__op_bias_add(&l->out, l->param[1], rows_of(&l->out), l->out_features, 1));
    return TD_OK;
}

static td_status linear_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    /* dW (out, in) = dout^T (out, rows) x (rows, in) */
    TD_CHECK(td__op_matmul(l->grad[0], &l->dout, 1, x, 0, 1.0, r->acc ? 1.0 : 0.0));
    if (l->has_bias)
        TD_CHECK(
            td__op_bias_grad(l->grad[1], &l->dout, rows_of(&l->dout), l->out_features, 1, r->acc));
    if (dx)
        TD_CHECK(td__op_matmul(dx, &l->dout, 0, l->param[0], 0, 1.0, 0.0));
    return TD_OK;
}

static const td_layer_vt linear_vt = {"linear", linear_plan, linear_forward, linear_backward};

/* Activations, dropout, flatten ---------------------------------------------------- */

static td_status act_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return td__op_act_fwd(l->act, x, &l->out);
}

static td_status act_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return dx ? td__op_act_bwd(l->act, x, &l->out, &l->dout, dx) : TD_OK;
}

static const td_layer_vt act_vt = {"activation", linear_plan, act_forward, act_backward};

static uint64_t dropout_stream(const td_layer *l, const td_nn_run *r) {
    return mix64(r->dropout_seed ^ mix64((uint64_t)l->uid + 0x5eed));
}

/* Where the pass's masks start in the step's stream: each sample's mask
 * follows from its place in the whole batch, so a batch cut into slices (on
 * several devices, or in chunks) drops what the whole batch would. */
static uint64_t dropout_offset(const td_layer *l, const td_nn_run *r) {
    return (uint64_t)r->first_sample * (uint64_t)prod(l->in_shape, l->in_ndim);
}

static td_status dropout_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    if (!r->train || l->p == 0)
        return td__op_copy(x, &l->out);
    return td__op_dropout(l->p, dropout_stream(l, r), dropout_offset(l, r), x, &l->out);
}

static td_status dropout_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    if (!dx)
        return TD_OK;
    if (!r->train || l->p == 0)
        return td__op_copy(&l->dout, dx);
    return td__op_dropout(l->p, dropout_stream(l, r), dropout_offset(l, r), &l->dout, dx);
}

static const td_layer_vt dropout_vt = {"dropout", linear_plan, dropout_forward, dropout_backward};

static td_status copy_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return td__op_copy(x, &l->out);
}

static td_status copy_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return dx ? td__op_copy(&l->dout, dx) : TD_OK;
}

static const td_layer_vt flatten_vt = {"flatten", linear_plan, copy_forward, copy_backward};

/* Layer norm ------------------------------------------------------------------------ */

static td_status ln_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    int64_t rows = prod(l->in_shape, l->in_ndim - 1);
    TD_CHECK(plan_same(l, p));
    TD_CHECK(td__plan_tensor(p, &l->ws[0], 1, 1, &rows));
    return td__plan_tensor(p, &l->ws[1], 1, 1, &rows);
}

static td_status ln_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return td__op_layernorm_fwd(l->eps, x, l->param[0], l->param[1], &l->out, &l->ws[0], &l->ws[1]);
}

static td_status ln_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return td__op_layernorm_bwd(x, l->param[0], &l->ws[0], &l->ws[1], &l->dout, dx, l->grad[0],
                                l->grad[1], r->acc);
}

static const td_layer_vt layernorm_vt = {"layernorm", ln_plan, ln_forward, ln_backward};

/* Embedding ----------------------------------------------------------------------- */

static td_status embed_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    if (!r->tokens)
        return td__error(TD_ERR_INVALID_ARG, "%s: embedding without tokens", l->path);
    return td__op_embed_fwd(r->tokens, l->param[0], l->positions ? l->param[1] : NULL, &l->out);
}

static td_status embed_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return td__op_embed_bwd(r->tokens, &l->dout, l->grad[0], l->positions ? l->grad[1] : NULL,
                            r->acc);
}

static const td_layer_vt embedding_vt = {"embedding", linear_plan, embed_forward, embed_backward};

/* Causal self-attention --------------------------------------------------------------- */

enum { ATT_QKV, ATT_P, ATT_S, ATT_YH, ATT_DQKV, ATT_DYH };

int td__nn_generic_attention = 0;

/* The backend's fused kernels, unless tests ask for the composed path. */
static int att_fused(const td_device *dev) {
    return !td__nn_generic_attention && td__op_has_attention(dev);
}

static td_status att_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    int64_t t = l->in_shape[0], c = l->in_shape[1], h = l->heads;
    int64_t qkv[2] = {t, 3 * c}, tt[3] = {h, t, t}, tc[2] = {t, c};
    TD_CHECK(plan_same(l, p));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_QKV], 1, 2, qkv));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_P], 1, 3, tt));
    /* the composed path keeps raw scores apart from the probabilities */
    l->fused = att_fused(p->dev);
    if (!l->fused)
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_S], 1, 3, tt));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_YH], 1, 2, tc));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_DQKV], 1, 2, qkv));
    return td__plan_tensor(p, &l->ws[ATT_DYH], 1, 2, tc);
}

static td_gemm_operand operand(const td_tensor *t, int64_t off, int64_t ld, int64_t stride) {
    td_gemm_operand o = {t, (size_t)off, ld, stride};
    return o;
}

static td_status att_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    int64_t n = x->shape[0], t = l->in_shape[0], c = l->in_shape[1], h = l->heads, d = c / h;
    td_tensor *qkv = &l->ws[ATT_QKV], *p = &l->ws[ATT_P], *s = &l->ws[ATT_S], *yh = &l->ws[ATT_YH];
    /* qkv (n, t, 3c) = x Wqkv^T + bqkv: q, k, v side by side, heads inside each */
    TD_CHECK(td__op_matmul(qkv, x, 0, l->param[0], 1, 1.0, 0.0));
    TD_CHECK(td__op_bias_add(qkv, l->param[1], n * t, 3 * c, 1));
    if (l->fused) {
        TD_CHECK(td__op_attention_fwd(h, 1.0 / sqrt((double)d), qkv, p, yh));
        TD_CHECK(td__op_matmul(&l->out, yh, 0, l->param[2], 1, 1.0, 0.0));
        return td__op_bias_add(&l->out, l->param[3], n * t, c, 1);
    }
    for (int64_t b = 0; b < n; b++) {
        int64_t base = b * t * 3 * c;
        /* s (h, t, t) = q_h (t, d) k_h^T */
        TD_CHECK(td__op_gemm_batched(0, 1, t, t, d, 1.0, operand(qkv, base, 3 * c, d),
                                     operand(qkv, base + c, 3 * c, d), 0.0,
                                     operand(s, b * h * t * t, t, t * t), h));
    }
    TD_CHECK(td__op_causal_softmax_fwd(1.0 / sqrt((double)d), s, p));
    for (int64_t b = 0; b < n; b++) {
        int64_t base = b * t * 3 * c;
        /* yh_h (t, d) = p_h (t, t) v_h (t, d), written at column h*d of (t, c) */
        TD_CHECK(td__op_gemm_batched(0, 0, t, d, t, 1.0, operand(p, b * h * t * t, t, t * t),
                                     operand(qkv, base + 2 * c, 3 * c, d), 0.0,
                                     operand(yh, b * t * c, c, d), h));
    }
    TD_CHECK(td__op_matmul(&l->out, yh, 0, l->param[2], 1, 1.0, 0.0));
    return td__op_bias_add(&l->out, l->param[3], n * t, c, 1);
}

static td_status att_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    int64_t n = x->shape[0], t = l->in_shape[0], c = l->in_shape[1], h = l->heads, d = c / h;
    td_tensor *qkv = &l->ws[ATT_QKV], *p = &l->ws[ATT_P], *s = &l->ws[ATT_S], *yh = &l->ws[ATT_YH],
              *dqkv = &l->ws[ATT_DQKV], *dyh = &l->ws[ATT_DYH];
    double beta = r->acc ? 1.0 : 0.0;
    /* output projection */
    TD_CHECK(td__op_matmul(l->grad[2], &l->dout, 1, yh, 0, 1.0, beta));
    TD_CHECK(td__op_bias_grad(l->grad[3], &l->dout, n * t, c, 1, r->acc));
    TD_CHECK(td__op_matmul(dyh, &l->dout, 0, l->param[2], 0, 1.0, 0.0));
    if (l->fused) {
        TD_CHECK(td__op_attention_bwd(h, 1.0 / sqrt((double)d), qkv, p, dyh, dqkv));
        goto qkv_backward;
    }
    for (int64_t b = 0; b < n; b++) {
        int64_t base = b * t * 3 * c, sb = b * h * t * t;
        /* dp_h (t, t) = dyh_h (t, d) v_h^T, kept in s */
        TD_CHECK(td__op_gemm_batched(0, 1, t, t, d, 1.0, operand(dyh, b * t * c, c, d),
                                     operand(qkv, base + 2 * c, 3 * c, d), 0.0,
                                     operand(s, sb, t, t * t), h));
        /* dv_h (t, d) = p_h^T dyh_h */
        TD_CHECK(td__op_gemm_batched(1, 0, t, d, t, 1.0, operand(p, sb, t, t * t),
                                     operand(dyh, b * t * c, c, d), 0.0,
                                     operand(dqkv, base + 2 * c, 3 * c, d), h));
    }
    /* ds = the softmax's backward, in place */
    TD_CHECK(td__op_causal_softmax_bwd(1.0 / sqrt((double)d), p, s, s));
    for (int64_t b = 0; b < n; b++) {
        int64_t base = b * t * 3 * c, sb = b * h * t * t;
        /* dq_h = ds_h (t, t) k_h (t, d); dk_h = ds_h^T q_h */
        TD_CHECK(td__op_gemm_batched(0, 0, t, d, t, 1.0, operand(s, sb, t, t * t),
                                     operand(qkv, base + c, 3 * c, d), 0.0,
                                     operand(dqkv, base, 3 * c, d), h));
        TD_CHECK(td__op_gemm_batched(1, 0, t, d, t, 1.0, operand(s, sb, t, t * t),
                                     operand(qkv, base, 3 * c, d), 0.0,
                                     operand(dqkv, base + c, 3 * c, d), h));
    }
qkv_backward:
    TD_CHECK(td__op_matmul(l->grad[0], dqkv, 1, x, 0, 1.0, beta));
    TD_CHECK(td__op_bias_grad(l->grad[1], dqkv, n * t, 3 * c, 1, r->acc));
    if (dx)
        TD_CHECK(td__op_matmul(dx, dqkv, 0, l->param[0], 0, 1.0, 0.0));
    return TD_OK;
}

static const td_layer_vt attention_vt = {"attention", att_plan, att_forward, att_backward};

/* Convolution and pooling ------------------------------------------------------------- */

static td_conv_desc batch_desc(const td_layer *l, const td_tensor *x) {
    td_conv_desc d = l->conv;
    d.n = x->shape[0];
    return d;
}

static td_status conv_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_conv_desc d = batch_desc(l, x);
    return td__op_conv2d_fwd(&d, x, l->param[0], l->has_bias ? l->param[1] : NULL, &l->out);
}

static td_status conv_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    td_conv_desc d = batch_desc(l, x);
    return td__op_conv2d_bwd(&d, x, l->param[0], &l->dout, dx, l->grad[0],
                             l->has_bias ? l->grad[1] : NULL, r->acc);
}

static const td_layer_vt conv2d_vt = {"conv2d", linear_plan, conv_forward, conv_backward};

static td_status pool_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    TD_CHECK(plan_same(l, p));
    if (l->pool == TD_POOL_MAX)
        TD_CHECK(td__plan_ints(p, &l->iws, (size_t)(p->n * prod(l->out_shape, l->out_ndim))));
    return TD_OK;
}

static td_status pool_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_conv_desc d = batch_desc(l, x);
    return td__op_pool_fwd(l->pool, &d, x, &l->out, l->pool == TD_POOL_MAX ? &l->iws : NULL);
}

static td_status pool_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    td_conv_desc d = batch_desc(l, x);
    if (!dx)
        return TD_OK;
    return td__op_pool_bwd(l->pool, &d, &l->dout, l->pool == TD_POOL_MAX ? &l->iws : NULL, dx);
}

static const td_layer_vt pool_vt = {"pool", pool_plan, pool_forward, pool_backward};

/* Containers --------------------------------------------------------------------------- */

static td_status child_backward(td_layer *c, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    TD_CHECK(c->vt->backward(c, x, dx, r));
    if (c->nparams > 0 && r->model->hook)
        r->model->hook(r->model->hook_arg, c->first_param, (size_t)c->nparams);
    return TD_OK;
}

static td_status seq_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    const td_tensor *cur = x;
    for (int i = 0; i < l->nchildren; i++) {
        TD_CHECK(l->children[i]->vt->plan(l->children[i], p, cur));
        cur = &l->children[i]->out;
    }
    l->out = l->children[l->nchildren - 1]->out;
    l->dout = l->children[l->nchildren - 1]->dout;
    return TD_OK;
}

static td_status seq_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    const td_tensor *cur = x;
    for (int i = 0; i < l->nchildren; i++) {
        TD_CHECK(l->children[i]->vt->forward(l->children[i], cur, r));
        cur = &l->children[i]->out;
    }
    return TD_OK;
}

static td_status seq_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    for (int i = l->nchildren - 1; i >= 0; i--) {
        const td_tensor *xi = i ? &l->children[i - 1]->out : x;
        td_tensor *dxi = i ? &l->children[i - 1]->dout : dx;
        TD_CHECK(child_backward(l->children[i], xi, dxi, r));
    }
    return TD_OK;
}

static const td_layer_vt sequential_vt = {"sequential", seq_plan, seq_forward, seq_backward};

/* residual: out = x + inner(x); children[0] is the inner sequential. */
static td_status res_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    td_layer *in = l->children[0];
    TD_CHECK(in->vt->plan(in, p, x));
    TD_CHECK(td__plan_tensor(p, &l->out, 1, l->out_ndim, l->out_shape));
    /* d(inner out) = d(out): one buffer serves both */
    l->dout = in->dout;
    return TD_OK;
}

static td_status res_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_layer *in = l->children[0];
    TD_CHECK(in->vt->forward(in, x, r));
    return td__op_add(x, &in->out, &l->out);
}

static td_status res_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    td_layer *in = l->children[0];
    TD_CHECK(in->vt->backward(in, x, dx, r));
    return dx ? td__op_axpby(1.0, &l->dout, 1.0, dx) : TD_OK;
}

static const td_layer_vt residual_vt = {"residual", res_plan, res_forward, res_backward};

void td__layer_destroy(td_layer *l) {
    if (!l)
        return;
    for (int i = 0; i < l->nchildren; i++)
        td__layer_destroy(l->children[i]);
    free(l->children);
    free(l);
}

/* Building from JSON --------------------------------------------------------------------- */

typedef struct build_ctx {
    td_model *m;
    const char *file;
    json_t *spec;
    const char *where;
} build_ctx;

static td_status field_error(const build_ctx *b, const char *field, const char *what) {
    return td__error(TD_ERR_PARSE, "%s: %s.%s: %s", b->file, b->where, field, what);
}

/* An integer field >= min; `def` when absent and not required. */
static td_status get_int(const build_ctx *b, const char *key, int required, int64_t def,
                         int64_t min, int64_t max, int64_t *out) {
    json_t *v = json_object_get(b->spec, key);
    char msg[128];
    if (!v) {
        if (required)
            return field_error(b, key, "missing (a required integer)");
        *out = def;
        return TD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        if (min == 1)
            snprintf(msg, sizeof msg, "expected a positive integer (at most %lld)", (long long)max);
        else
            snprintf(msg, sizeof msg, "expected an integer from %lld to %lld", (long long)min,
                     (long long)max);
        return field_error(b, key, msg);
    }
    *out = json_integer_value(v);
    return TD_OK;
}

static td_status get_real(const build_ctx *b, const char *key, double def, double lo, double hi,
                          int hi_open, double *out) {
    json_t *v = json_object_get(b->spec, key);
    char msg[128];
    double x;
    if (!v) {
        *out = def;
        return TD_OK;
    }
    x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !(x >= lo) || (hi_open ? !(x < hi) : !(x <= hi))) {
        snprintf(msg, sizeof msg, "expected a number in [%g, %g%s", lo, hi, hi_open ? ")" : "]");
        return field_error(b, key, msg);
    }
    *out = x;
    return TD_OK;
}

static td_status get_bool(const build_ctx *b, const char *key, int def, int *out) {
    json_t *v = json_object_get(b->spec, key);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_boolean(v))
        return field_error(b, key, "expected true or false");
    *out = json_is_true(v);
    return TD_OK;
}

/* Every key of the spec must be in the NULL-terminated list. */
static td_status check_keys(const build_ctx *b, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(b->spec, key, v) {
        int ok = 0;
        (void)v;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = !strcmp(*a, key);
        if (!ok)
            return field_error(b, key, "unknown field for this layer type");
    }
    return TD_OK;
}

static td_status shape_error(const build_ctx *b, const char *type, const char *need, int in_ndim,
                             const int64_t *in_shape) {
    char s[64];
    return td__error(TD_ERR_PARSE, "%s: %s: %s needs %s input, got %s", b->file, b->where, type,
                     need, shape_text(in_shape, in_ndim, s));
}

static td_status init_uniform_fan_in(td_model *m, td_tensor *t, int64_t fan_in) {
    double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
    /* kaiming_uniform(a = sqrt 5) gives the same bound as the bias: 1 / sqrt(fan_in). */
    return td_tensor_rand_uniform(t, mix64(m->seed ^ mix64((uint64_t)m->nparams - 1)), 0, -bound,
                                  bound);
}

static td_status add_uniform_param(td_model *m, td_layer *l, const char *name, int ndim,
                                   const int64_t *shape, int64_t fan_in, td_tensor **p) {
    TD_CHECK(td__model_add_param(m, l, name, ndim, shape, p));
    return init_uniform_fan_in(m, *p, fan_in);
}

static td_status build_leaf(build_ctx *b, const char *type, td_layer *l, int in_ndim,
                            const int64_t *in) {
    td_model *m = b->m;
    memcpy(l->out_shape, in, sizeof(int64_t) * (size_t)in_ndim);
    l->out_ndim = in_ndim;
    if (!strcmp(type, "linear")) {
        static const char *const keys[] = {"type", "out", "bias", NULL};
        int64_t w[2];
        TD_CHECK(check_keys(b, keys));
        TD_CHECK(get_int(b, "out", 1, 0, 1, 1 << 24, &l->out_features));
        TD_CHECK(get_bool(b, "bias", 1, &l->has_bias));
        if (in_ndim < 1)
            return shape_error(b, type, "at least one dimension of", in_ndim, in);
        l->vt = &linear_vt;
        l->out_shape[in_ndim - 1] = l->out_features;
        w[0] = l->out_features;
        w[1] = in[in_ndim - 1];
        TD_CHECK(add_uniform_param(m, l, "weight", 2, w, w[1], &l->param[0]));
        if (l->has_bias)
            TD_CHECK(add_uniform_param(m, l, "bias", 1, w, w[1], &l->param[1]));
        return TD_OK;
    }
    if (!strcmp(type, "relu") || !strcmp(type, "gelu") || !strcmp(type, "tanh") ||
        !strcmp(type, "sigmoid")) {
        static const char *const keys[] = {"type", NULL};
        TD_CHECK(check_keys(b, keys));
        l->vt = &act_vt;
        l->act = !strcmp(type, "relu")   ? TD_ACT_RELU
                 : !strcmp(type, "gelu") ? TD_ACT_GELU
                 : !strcmp(type, "tanh") ? TD_ACT_TANH
                                         : TD_ACT_SIGMOID;
        return TD_OK;
    }
    if (!strcmp(type, "dropout")) {
        static const char *const keys[] = {"type", "p", NULL};
        TD_CHECK(check_keys(b, keys));
        TD_CHECK(get_real(b, "p", 0.5, 0.0, 1.0, 1, &l->p));
        l->vt = &dropout_vt;
        return TD_OK;
    }
    if (!strcmp(type, "flatten")) {
        static const char *const keys[] = {"type", NULL};
        TD_CHECK(check_keys(b, keys));
        l->vt = &flatten_vt;
        l->out_ndim = 1;
        l->out_shape[0] = prod(in, in_ndim);
        return TD_OK;
    }
    if (!strcmp(type, "layernorm")) {
        static const char *const keys[] = {"type", "eps", NULL};
        int64_t c;
        TD_CHECK(check_keys(b, keys));
        TD_CHECK(get_real(b, "eps", 1e-5, 0.0, 1.0, 0, &l->eps));
        if (in_ndim < 1)
            return shape_error(b, type, "at least one dimension of", in_ndim, in);
        l->vt = &layernorm_vt;
        c = in[in_ndim - 1];
        TD_CHECK(td__model_add_param(m, l, "weight", 1, &c, &l->param[0]));
        TD_CHECK(td_tensor_fill(l->param[0], 1.0));
        TD_CHECK(td__model_add_param(m, l, "bias", 1, &c, &l->param[1]));
        return td_tensor_fill(l->param[1], 0.0);
    }
    if (!strcmp(type, "embedding")) {
        static const char *const keys[] = {"type", "vocab", "dim", "positions", NULL};
        int64_t dim, s[2];
        TD_CHECK(check_keys(b, keys));
        TD_CHECK(get_int(b, "vocab", 1, 0, 1, 1 << 24, &l->vocab));
        TD_CHECK(get_int(b, "dim", 1, 0, 1, 1 << 20, &dim));
        TD_CHECK(get_bool(b, "positions", 1, &l->positions));
        if (m->kind != TD_INPUT_TOKENS || in_ndim != 1 || m->nparams != 0)
            return shape_error(b, type, "the model's tokens as", in_ndim, in);
        if (m->classes > 0 && l->vocab != m->classes)
            return field_error(b, "vocab", "differs from input.vocab");
        l->vt = &embedding_vt;
        l->out_ndim = 2;
        l->out_shape[0] = in[0];
        l->out_shape[1] = dim;
        s[0] = l->vocab;
        s[1] = dim;
        TD_CHECK(td__model_add_param(m, l, "wte.weight", 2, s, &l->param[0]));
        TD_CHECK(td_tensor_rand_normal(
            l->param[0], mix64(m->seed ^ mix64((uint64_t)m->nparams - 1)), 0, 0.0, 1.0));
        if (l->positions) {
            s[0] = in[0];
            TD_CHECK(td__model_add_param(m, l, "wpe.weight", 2, s, &l->param[1]));
            TD_CHECK(td_tensor_rand_normal(
                l->param[1], mix64(m->seed ^ mix64((uint64_t)m->nparams - 1)), 0, 0.0, 1.0));
        }
        return TD_OK;
    }
    if (!strcmp(type, "attention")) {
        static const char *const keys[] = {"type", "heads", "causal", NULL};
        int causal;
        int64_t c, s[2];
        TD_CHECK(check_keys(b, keys));
        TD_CHECK(get_int(b, "heads", 1, 0, 1, 4096, &l->heads));
        TD_CHECK(get_bool(b, "causal", 1, &causal));
        if (!causal)
            return field_error(b, "causal", "only causal self-attention is implemented");
        if (in_ndim != 2)
            return shape_error(b, type, "(tokens, channels)", in_ndim, in);
        c = in[1];
        if (c % l->heads != 0)
            return field_error(b, "heads", "must divide the channels");
        l->vt = &attention_vt;
        s[0] = 3 * c;
        s[1] = c;
        TD_CHECK(add_uniform_param(m, l, "qkv.weight", 2, s, c, &l->param[0]));
        TD_CHECK(add_uniform_param(m, l, "qkv.bias", 1, s, c, &l->param[1]));
        s[0] = c;
        TD_CHECK(add_uniform_param(m, l, "proj.weight", 2, s, c, &l->param[2]));
        TD_CHECK(add_uniform_param(m, l, "proj.bias", 1, s, c, &l->param[3]));
        return TD_OK;
    }
    if (!strcmp(type, "conv2d") || !strcmp(type, "maxpool") || !strcmp(type, "avgpool")) {
        static const char *const conv_keys[] = {"type",    "out",  "kernel", "stride",
                                                "padding", "bias", NULL};
        static const char *const pool_keys[] = {"type", "kernel", "stride", "padding", NULL};
        int conv = !strcmp(type, "conv2d");
        td_conv_desc *d = &l->conv;
        TD_CHECK(check_keys(b, conv ? conv_keys : pool_keys));
        if (in_ndim != 3)
            return shape_error(b, type, "(channels, height, width)", in_ndim, in);
        d->c = in[0];
        d->h = in[1];
        d->w = in[2];
        TD_CHECK(get_int(b, "kernel", 1, 0, 1, 1024, &d->kh));
        d->kw = d->kh;
        TD_CHECK(get_int(b, "stride", 0, conv ? 1 : d->kh, 1, 1024, &d->stride));
        TD_CHECK(get_int(b, "padding", 0, 0, 0, 1024, &d->pad));
        if (conv) {
            TD_CHECK(get_int(b, "out", 1, 0, 1, 1 << 20, &d->oc));
            TD_CHECK(get_bool(b, "bias", 1, &l->has_bias));
        } else {
            d->oc = d->c;
            if (2 * d->pad > d->kh)
                return field_error(b, "padding", "must be at most half the kernel");
        }
        if (d->h + 2 * d->pad < d->kh || d->w + 2 * d->pad < d->kw)
            return field_error(b, "kernel", "larger than the padded input");
        d->oh = (d->h + 2 * d->pad - d->kh) / d->stride + 1;
        d->ow = (d->w + 2 * d->pad - d->kw) / d->stride + 1;
        l->out_shape[0] = d->oc;
        l->out_shape[1] = d->oh;
        l->out_shape[2] = d->ow;
        if (conv) {
            int64_t w[4] = {d->oc, d->c, d->kh, d->kw};
            l->vt = &conv2d_vt;
            TD_CHECK(add_uniform_param(m, l, "weight", 4, w, d->c * d->kh * d->kw, &l->param[0]));
            if (l->has_bias)
                TD_CHECK(add_uniform_param(m, l, "bias", 1, w, d->c * d->kh * d->kw, &l->param[1]));
        } else {
            l->vt = &pool_vt;
            l->pool = !strcmp(type, "maxpool") ? TD_POOL_MAX : TD_POOL_AVG;
        }
        return TD_OK;
    }
    return field_error(b, "type",
                       "unknown layer type (linear, conv2d, maxpool, avgpool, relu, gelu, tanh, "
                       "sigmoid, dropout, flatten, layernorm, embedding, attention, residual, "
                       "repeat)");
}

td_status td__layer_build(td_model *m, const char *file, json_t *spec, const char *where,
                          const char *path, int in_ndim, const int64_t *in_shape, td_layer **out) {
    build_ctx b = {m, file, spec, where};
    json_t *jt;
    const char *type;
    td_layer *l;
    td_status st;
    *out = NULL;
    if (!json_is_object(spec))
        return td__error(TD_ERR_PARSE, "%s: %s: expected an object", file, where);
    jt = json_object_get(spec, "type");
    if (!jt)
        return field_error(&b, "type", "missing (a required string)");
    if (!json_is_string(jt))
        return field_error(&b, "type", "expected a string");
    type = json_string_value(jt);
    if (!(l = td__calloc(sizeof *l, "a layer")))
        return TD_ERR_OUT_OF_MEMORY;
    snprintf(l->path, sizeof l->path, "%s", path);
    l->uid = m->nlayers_made++;
    l->in_ndim = in_ndim;
    memcpy(l->in_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
    l->first_param = m->nparams;
    if (!strcmp(type, "residual")) {
        static const char *const keys[] = {"type", "layers", NULL};
        char s1[64], s2[64], w2[256];
        td_layer *inner = NULL;
        if ((st = check_keys(&b, keys)) != TD_OK)
            goto fail;
        l->vt = &residual_vt;
        snprintf(w2, sizeof w2, "%s.layers", where);
        if ((st = td__layer_build_seq(m, file, json_object_get(spec, "layers"), w2, path, in_ndim,
                                      in_shape, &inner)) != TD_OK)
            goto fail;
        if (!(l->children = td__calloc(sizeof *l->children, "a residual block"))) {
            td__layer_destroy(inner);
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        l->children[0] = inner;
        l->nchildren = 1;
        if (inner->out_ndim != in_ndim ||
            memcmp(inner->out_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim) != 0) {
            st = td__error(TD_ERR_PARSE,
                           "%s: %s: residual: its layers turn %s into %s; they must "
                           "keep the shape",
                           file, where, shape_text(in_shape, in_ndim, s1),
                           shape_text(inner->out_shape, inner->out_ndim, s2));
            goto fail;
        }
        l->out_ndim = in_ndim;
        memcpy(l->out_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
        *out = l;
        return TD_OK;
    }
    if ((st = build_leaf(&b, type, l, in_ndim, in_shape)) != TD_OK)
        goto fail;
    l->nparams = (int)(m->nparams - l->first_param);
    for (int i = 0; i < l->nparams; i++)
        l->grad[i] = m->grads[l->first_param + (size_t)i];
    *out = l;
    return TD_OK;
fail:
    td__layer_destroy(l);
    return st;
}

static td_status seq_append(td_layer *seq, td_layer *child, int *cap) {
    if (seq->nchildren == *cap) {
        int ncap = *cap ? *cap * 2 : 8;
        td_layer **n = realloc(seq->children, sizeof *n * (size_t)ncap);
        if (!n)
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory building a model");
        seq->children = n;
        *cap = ncap;
    }
    seq->children[seq->nchildren++] = child;
    return TD_OK;
}

/* Appends the layers of JSON array arr to seq; repeat blocks expand in place. */
static td_status seq_fill(td_model *m, const char *file, json_t *arr, const char *where,
                          const char *path, td_layer *seq, int *cap, int depth) {
    size_t i;
    json_t *spec;
    td_status st;
    if (depth > 16)
        return td__error(TD_ERR_PARSE, "%s: %s: layers nested more than 16 deep", file, where);
    if (!json_is_array(arr))
        return td__error(TD_ERR_PARSE, "%s: %s: expected an array of layers", file, where);
    json_array_foreach(arr, i, spec) {
        char w[256], p[64];
        int in_ndim = seq->nchildren ? seq->children[seq->nchildren - 1]->out_ndim : seq->in_ndim;
        const int64_t *in =
            seq->nchildren ? seq->children[seq->nchildren - 1]->out_shape : seq->in_shape;
        json_t *jt = json_object_get(spec, "type");
        td_layer *child = NULL;
        snprintf(w, sizeof w, "%s[%zu]", where, i);
        if (json_is_string(jt) && !strcmp(json_string_value(jt), "repeat")) {
            build_ctx b = {m, file, spec, w};
            static const char *const keys[] = {"type", "count", "layers", NULL};
            int64_t count;
            char w2[256];
            TD_CHECK(check_keys(&b, keys));
            TD_CHECK(get_int(&b, "count", 1, 0, 1, 1024, &count));
            snprintf(w2, sizeof w2, "%s.layers", w);
            for (int64_t k = 0; k < count; k++)
                TD_CHECK(seq_fill(m, file, json_object_get(spec, "layers"), w2, path, seq, cap,
                                  depth + 1));
            continue;
        }
        snprintf(p, sizeof p, "%s.%d", path, seq->nchildren);
        if ((st = td__layer_build(m, file, spec, w, p, in_ndim, in, &child)) != TD_OK)
            return st;
        if ((st = seq_append(seq, child, cap)) != TD_OK) {
            td__layer_destroy(child);
            return st;
        }
    }
    return TD_OK;
}

td_status td__layer_build_seq(td_model *m, const char *file, json_t *arr, const char *where,
                              const char *path, int in_ndim, const int64_t *in_shape,
                              td_layer **out) {
    td_layer *seq;
    int cap = 0;
    td_status st;
    *out = NULL;
    if (!(seq = td__calloc(sizeof *seq, "a layer list")))
        return TD_ERR_OUT_OF_MEMORY;
    seq->vt = &sequential_vt;
    snprintf(seq->path, sizeof seq->path, "%s", path);
    seq->uid = m->nlayers_made++;
    seq->in_ndim = in_ndim;
    memcpy(seq->in_shape, in_shape, sizeof(int64_t) * (size_t)in_ndim);
    seq->first_param = m->nparams;
    if ((st = seq_fill(m, file, arr, where, path, seq, &cap, 0)) != TD_OK)
        goto fail;
    if (seq->nchildren == 0) {
        st = td__error(TD_ERR_PARSE, "%s: %s: expected at least one layer", file, where);
        goto fail;
    }
    seq->out_ndim = seq->children[seq->nchildren - 1]->out_ndim;
    memcpy(seq->out_shape, seq->children[seq->nchildren - 1]->out_shape,
           sizeof(int64_t) * TD_MAX_DIMS);
    *out = seq;
    return TD_OK;
fail:
    td__layer_destroy(seq);
    return st;
}
