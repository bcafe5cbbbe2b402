/* The layers: planning their activations, forward and backward (building
 * them from JSON is layers_build.c). Each leaf layer is a few tensor ops
 * (src/tensor/ops.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/nn-impl.h"

/* Loading caps every shape's product (td__nn_numel), so this cannot overflow. */
static int64_t prod(const int64_t *s, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= s[i];
    return p;
}

int64_t td__nn_numel(const int64_t *shape, int ndim) {
    int64_t p = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(p, shape[i], &p) || p > TD_MODEL_MAX_TENSOR)
            return -1;
    return p;
}

uint64_t td__nn_mix64(uint64_t x) {
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

/* In a shard, the second linear of a pair gives a partial sum over its input
 * features: summed across the shards before the bias, which is added once.
 * The first linear's input gradient is partial likewise. A shard holding
 * none of the pair (0 features) contributes zeros. */
static td_status linear_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    int partial = l->split.kind == TD__SPLIT_IN;
    /* out (rows, out) = x (rows, in) W^T (in, out) + b */
    if (l->split.kind != TD__SPLIT_NONE && l->split.count == 0) {
        if (partial)
            TD_CHECK(td__zero(&l->out));
    } else {
        TD_CHECK(td__op_matmul(&l->out, x, 0, l->param[0], 1, 1.0, 0.0));
    }
    if (partial)
        TD_CHECK(td__model_reduce(r->model, &l->out));
    if (l->has_bias && l->out.numel)
        TD_CHECK(td__op_bias_add(&l->out, l->param[1], rows_of(&l->out), l->out_features, 1));
    return TD_OK;
}

static int linear_empty(const td_layer *l) {
    return l->split.kind != TD__SPLIT_NONE && l->split.count == 0;
}

static td_status linear_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    /* dW (out, in) = dout^T (out, rows) x (rows, in) */
    if (!linear_empty(l))
        TD_CHECK(td__op_matmul(l->grad[0], &l->dout, 1, x, 0, 1.0, r->acc ? 1.0 : 0.0));
    if (l->has_bias && l->dout.numel)
        TD_CHECK(
            td__op_bias_grad(l->grad[1], &l->dout, rows_of(&l->dout), l->out_features, 1, r->acc));
    return TD_OK;
}

static td_status linear_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    int empty = linear_empty(l);
    if (!r->defer)
        TD_CHECK(linear_weights(l, x, r));
    if (!dx)
        return TD_OK;
    if (empty)
        TD_CHECK(td__zero(dx));
    else
        TD_CHECK(td__op_matmul(dx, &l->dout, 0, l->param[0], 0, 1.0, 0.0));
    return l->split.kind == TD__SPLIT_OUT ? td__model_reduce(r->model, dx) : TD_OK;
}

const td_layer_vt td__linear_vt = {"linear", linear_plan, linear_forward, linear_backward,
                                   linear_weights};

/* Activations, dropout, flatten ---------------------------------------------------- */

/* Inside a shard's pair the activations may be empty (0 features held). */
static td_status act_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return x->numel ? td__op_act_fwd(l->act, x, &l->out) : TD_OK;
}

static td_status act_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return dx && x->numel ? td__op_act_bwd(l->act, x, &l->out, &l->dout, dx) : TD_OK;
}

const td_layer_vt td__act_vt = {"activation", linear_plan, act_forward, act_backward, NULL};

/* The stream of one dropout layer in one step. */
static uint64_t dropout_stream(const td_layer *l, const td_nn_run *r) {
    return td__nn_mix64(r->dropout_seed ^ td__nn_mix64((uint64_t)l->uid + 0x5eed));
}

/* Where the pass's masks start in the step's stream: each sample's mask
 * follows from its place in the whole batch, so a batch cut into slices (on
 * several devices, or in chunks) drops what the whole batch would. */
static uint64_t dropout_offset(const td_layer *l, const td_nn_run *r) {
    return (uint64_t)r->first_sample * (uint64_t)prod(l->in_shape, l->in_ndim);
}

/* Dropout over features [first, first + count) of a pair's hidden layer of
 * `total` features in a shard: row by row, each element drawing the number
 * its place in the whole layer would, so the shards together drop what the
 * whole model does. */
static td_status dropout_split(td_layer *l, td_nn_run *r, const td_tensor *x, td_tensor *y) {
    int64_t rows = rows_of(x), cnt = l->split.count, total = l->split.total;
    uint64_t stream = dropout_stream(l, r);
    uint64_t base = (uint64_t)r->first_sample * (uint64_t)(prod(l->in_shape, l->in_ndim) / cnt) *
                    (uint64_t)total;
    for (int64_t i = 0; i < rows; i++) {
        td_tensor xi, yi;
        TD_CHECK(td__tensor_view(&xi, x, (size_t)(i * cnt), 1, &cnt));
        TD_CHECK(td__tensor_view(&yi, y, (size_t)(i * cnt), 1, &cnt));
        TD_CHECK(
            td__op_dropout(l->p, stream, base + (uint64_t)(i * total + l->split.first), &xi, &yi));
    }
    return TD_OK;
}

static td_status dropout_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    if (!x->numel)
        return TD_OK;
    if (!r->train || l->p == 0)
        return td__op_copy(x, &l->out);
    if (l->split.kind == TD__SPLIT_MID)
        return dropout_split(l, r, x, &l->out);
    return td__op_dropout(l->p, dropout_stream(l, r), dropout_offset(l, r), x, &l->out);
}

static td_status dropout_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    if (!dx || !x->numel)
        return TD_OK;
    if (!r->train || l->p == 0)
        return td__op_copy(&l->dout, dx);
    if (l->split.kind == TD__SPLIT_MID)
        return dropout_split(l, r, &l->dout, dx);
    return td__op_dropout(l->p, dropout_stream(l, r), dropout_offset(l, r), &l->dout, dx);
}

const td_layer_vt td__dropout_vt = {"dropout", linear_plan, dropout_forward, dropout_backward,
                                    NULL};

static td_status copy_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return td__op_copy(x, &l->out);
}

static td_status copy_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return dx ? td__op_copy(&l->dout, dx) : TD_OK;
}

const td_layer_vt td__flatten_vt = {"flatten", linear_plan, copy_forward, copy_backward, NULL};

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

const td_layer_vt td__layernorm_vt = {"layernorm", ln_plan, ln_forward, ln_backward, NULL};

/* Embedding ----------------------------------------------------------------------- */

static td_status embed_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    if (!r->tokens)
        return td__error(TD_ERR_INVALID_ARG, "%s: embedding without tokens", l->path);
    return td__op_embed_fwd(r->tokens, l->param[0], l->positions ? l->param[1] : NULL, &l->out);
}

/* With a tied head, whose backward ran first, the table's gradient already
 * holds the head's part: the rows are added to it, and only the positions'
 * gradient starts afresh when not accumulating. */
static td_status embed_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_tensor *dwpe = l->positions ? l->grad[1] : NULL;
    if (l->tied && !r->acc && dwpe)
        TD_CHECK(td__zero(dwpe));
    return td__op_embed_bwd(r->tokens, &l->dout, l->grad[0], dwpe, r->acc || l->tied);
}

/* Nothing flows back past an embedding: its backward is its weights'. */
static td_status embed_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    return r->defer ? TD_OK : embed_weights(l, x, r);
}

const td_layer_vt td__embedding_vt = {"embedding", linear_plan, embed_forward, embed_backward,
                                      embed_weights};

/* Causal self-attention --------------------------------------------------------------- */

/* ATT_QKV (n, t, 3c): q, k, v of every query head, what the attention
 * kernels read; with fewer key/value heads, ATT_RAW (n, t, w) is the
 * projection's output (q, then kv_heads keys and values, w = (h + 2 kv) d),
 * expanded into ATT_QKV, and ATT_DRAW its gradient. Without them the
 * projection writes ATT_QKV itself. Rotary positions rotate the
 * projection's q and k in place. A shard of grouped-query attention sums
 * its key and value heads' weight gradients with the other shards' in
 * ATT_KVSUM (every key and value head's rows, then their biases), its bias
 * gradient first made whole in ATT_DB. */
enum { ATT_QKV, ATT_P, ATT_S, ATT_YH, ATT_DQKV, ATT_DYH, ATT_RAW, ATT_DRAW, ATT_KVSUM, ATT_DB };

int td__nn_generic_attention = 0;

/* The backend's fused kernels, unless tests ask for the composed path. */
static int att_fused(const td_device *dev) {
    return !td__nn_generic_attention && td__op_has_attention(dev);
}

td_kv_map td__att_map(const td_layer *l) {
    td_kv_map m = {l->heads, l->kv_heads, l->heads / l->kv_heads, 0};
    int64_t first = l->split.first, count = l->split.count;
    if (l->split.kind != TD__SPLIT_HEADS)
        return m;
    m.h = count;
    /* no query heads: no key/value heads, none shared */
    m.skew = count ? first % m.g : 0;
    m.kv = count ? (first + count - 1) / m.g - first / m.g + 1 : 0;
    return m;
}

/* The heads a layer computes: all, or a shard's; the width of their q (as
 * of k, v and the heads' output) is h * d. */
static int64_t att_heads(const td_layer *l) {
    return td__att_map(l).h;
}

static int64_t att_kv(const td_layer *l) {
    return td__att_map(l).kv;
}

static int att_grouped(const td_layer *l) {
    return att_kv(l) != att_heads(l);
}

/* A shard of grouped-query attention: its key and value heads may be held,
 * and their gradients summed, by several shards. */
static int att_shares_kv(const td_layer *l) {
    return l->split.kind == TD__SPLIT_HEADS && l->kv_heads != l->heads;
}

/* The projection's output and its gradient: (n, t, (h + 2 kv) d). */
static td_tensor *att_raw(td_layer *l) {
    return &l->ws[att_grouped(l) ? ATT_RAW : ATT_QKV];
}

static td_tensor *att_draw(td_layer *l) {
    return &l->ws[att_grouped(l) ? ATT_DRAW : ATT_DQKV];
}

static td_status att_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    int64_t t = l->in_shape[0], h = att_heads(l), d = l->in_shape[1] / l->heads, c = h * d;
    int64_t qkv[2] = {t, 3 * c}, tt[3] = {h, t, t}, tc[2] = {t, c},
            raw[2] = {t, (h + 2 * att_kv(l)) * d};
    TD_CHECK(plan_same(l, p));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_QKV], 1, 2, qkv));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_P], 1, 3, tt));
    /* the composed path keeps raw scores apart from the probabilities */
    l->fused = att_fused(p->dev);
    if (!l->fused)
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_S], 1, 3, tt));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_YH], 1, 2, tc));
    TD_CHECK(td__plan_tensor(p, &l->ws[ATT_DQKV], 1, 2, qkv));
    if (att_grouped(l)) {
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_RAW], 1, 2, raw));
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_DRAW], 1, 2, raw));
    }
    if (att_shares_kv(l)) {
        int64_t sum = 2 * l->kv_heads * d * (l->in_shape[1] + l->has_bias), db = raw[1];
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_KVSUM], 0, 1, &sum));
        TD_CHECK(td__plan_tensor(p, &l->ws[ATT_DB], 0, 1, &db));
    }
    return td__plan_tensor(p, &l->ws[ATT_DYH], 1, 2, tc);
}

static td_gemm_operand operand(const td_tensor *t, int64_t off, int64_t ld, int64_t stride) {
    td_gemm_operand o = {t, (size_t)off, ld, stride};
    return o;
}

/* raw (n, t, (h + 2 kv) d) = x Wqkv^T + bqkv, q and k rotated; then
 * expanded to every query head's k and v in ATT_QKV. */
static td_status att_project(td_layer *l, const td_tensor *x) {
    int64_t n = x->shape[0], t = l->in_shape[0], h = att_heads(l), kv = att_kv(l),
            d = l->in_shape[1] / l->heads;
    td_tensor *raw = att_raw(l);
    TD_CHECK(td__op_matmul(raw, x, 0, l->param[0], 1, 1.0, 0.0));
    if (l->has_bias)
        TD_CHECK(td__op_bias_add(raw, l->param[1], n * t, (h + 2 * kv) * d, 1));
    if (l->rope)
        TD_CHECK(td__op_rope(l->rope, 0, 0, h + kv, d, 0, raw));
    return att_grouped(l) ? td__op_kv_expand(td__att_map(l), d, raw, &l->ws[ATT_QKV]) : TD_OK;
}

/* In a shard the projection of its heads is a partial sum: summed across the
 * shards, then the bias added once. Its input gradient is summed likewise.
 * c is the width of the heads computed here; the output keeps the model's
 * channels (l->out_shape[1]). */
static td_status att_forward(td_layer *l, const td_tensor *x, td_nn_run *r) {
    int64_t n = x->shape[0], t = l->in_shape[0], d = l->in_shape[1] / l->heads, h = att_heads(l),
            c = h * d, oc = l->out_shape[1];
    td_tensor *qkv = &l->ws[ATT_QKV], *p = &l->ws[ATT_P], *s = &l->ws[ATT_S], *yh = &l->ws[ATT_YH];
    if (h == 0) {
        TD_CHECK(td__zero(&l->out));
        goto reduce;
    }
    /* qkv (n, t, 3c): q, k, v side by side, heads inside each */
    TD_CHECK(att_project(l, x));
    if (l->fused) {
        TD_CHECK(td__op_attention_fwd(h, 1.0 / sqrt((double)d), qkv, p, yh));
        goto project;
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
project:
    TD_CHECK(td__op_matmul(&l->out, yh, 0, l->param[2], 1, 1.0, 0.0));
reduce:
    if (l->split.kind == TD__SPLIT_HEADS)
        TD_CHECK(td__model_reduce(r->model, &l->out));
    return l->proj_bias ? td__op_bias_add(&l->out, l->param[3], n * t, oc, 1) : TD_OK;
}

/* grad (+)= v: the rows [first, first + count) of a (., cols) tensor each. */
static td_status rows_into(td_tensor *grad, int64_t gfirst, const td_tensor *v, int64_t vfirst,
                           int64_t count, int64_t cols, int acc) {
    int64_t n = count * cols;
    td_tensor gv, vv;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__tensor_view(&gv, grad, (size_t)(gfirst * cols), 1, &n));
    TD_CHECK(td__tensor_view(&vv, v, (size_t)(vfirst * cols), 1, &n));
    return acc ? td__op_add(&gv, &vv, &gv) : td__op_copy(&vv, &gv);
}

/* A shard's qkv gradients when its key and value heads are shared: q's rows
 * as usual, the key and value rows (only what its own query heads add)
 * into their places among every head's in ATT_KVSUM, zero elsewhere; that
 * summed over the shards, each takes back its heads' rows. */
static td_status att_shared_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    td_kv_map m = td__att_map(l);
    int64_t c = l->in_shape[1], d = c / l->heads, kvt = l->kv_heads, nt = td__tensor_rows(x),
            w = (m.h + 2 * m.kv) * d, kfirst = m.h ? (l->split.first / m.g) : 0;
    td_tensor *draw = att_draw(l), *sum = &l->ws[ATT_KVSUM], *db = &l->ws[ATT_DB];
    double beta = r->acc ? 1.0 : 0.0;
    TD_CHECK(td__zero(sum));
    if (m.h) {
        TD_CHECK(td__op_gemm_batched(1, 0, m.h * d, c, nt, 1.0, operand(draw, 0, w, 0),
                                     operand(x, 0, c, 0), beta, operand(l->grad[0], 0, c, 0), 1));
        for (int v = 0; v < 2; v++) /* keys, then values */
            TD_CHECK(td__op_gemm_batched(
                1, 0, m.kv * d, c, nt, 1.0, operand(draw, (m.h + v * m.kv) * d, w, 0),
                operand(x, 0, c, 0), 0.0, operand(sum, (size_t)((v * kvt + kfirst) * d * c), c, 0),
                1));
    }
    if (l->has_bias && m.h) {
        TD_CHECK(td__op_bias_grad(db, draw, nt, w, 1, 0));
        TD_CHECK(rows_into(l->grad[1], 0, db, 0, m.h * d, 1, r->acc));
        for (int v = 0; v < 2; v++)
            TD_CHECK(rows_into(sum, 2 * kvt * d * c + (v * kvt + kfirst) * d, db,
                               (m.h + v * m.kv) * d, m.kv * d, 1, 0));
    }
    TD_CHECK(td__model_reduce(r->model, sum));
    for (int v = 0; v < 2; v++) {
        TD_CHECK(rows_into(l->grad[0], (m.h + v * m.kv) * d, sum, (v * kvt + kfirst) * d, m.kv * d,
                           c, r->acc));
        if (l->has_bias)
            TD_CHECK(rows_into(l->grad[1], (m.h + v * m.kv) * d, sum,
                               2 * kvt * d * c + (v * kvt + kfirst) * d, m.kv * d, 1, r->acc));
    }
    return TD_OK;
}

/* The parameter gradients, from dout, the heads' output yh and the
 * projection's gradient draw (the workspaces the forward and backward left). */
static td_status att_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    int64_t n = x->shape[0], t = l->in_shape[0], h = att_heads(l), oc = l->out_shape[1],
            w = (h + 2 * att_kv(l)) * (l->in_shape[1] / l->heads);
    double beta = r->acc ? 1.0 : 0.0;
    /* dWo (oc, c) = dout^T yh; dWqkv (w, in) = draw^T x */
    if (l->proj_bias)
        TD_CHECK(td__op_bias_grad(l->grad[3], &l->dout, n * t, oc, 1, r->acc));
    if (h)
        TD_CHECK(td__op_matmul(l->grad[2], &l->dout, 1, &l->ws[ATT_YH], 0, 1.0, beta));
    if (att_shares_kv(l))
        return att_shared_weights(l, x, r);
    if (h == 0)
        return TD_OK;
    TD_CHECK(td__op_matmul(l->grad[0], att_draw(l), 1, x, 0, 1.0, beta));
    return l->has_bias ? td__op_bias_grad(l->grad[1], att_draw(l), n * t, w, 1, r->acc) : TD_OK;
}

/* dqkv (every query head's) back to the projection's gradient: key and
 * value heads summed over their query heads, q and k rotated back. */
static td_status att_unproject(td_layer *l) {
    int64_t h = att_heads(l), kv = att_kv(l), d = l->in_shape[1] / l->heads;
    td_tensor *draw = att_draw(l);
    if (att_grouped(l))
        TD_CHECK(td__op_kv_reduce(td__att_map(l), d, &l->ws[ATT_DQKV], draw));
    return l->rope ? td__op_rope(l->rope, 0, 0, h + kv, d, 1, draw) : TD_OK;
}

static td_status att_backward(td_layer *l, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    int64_t n = x->shape[0], t = l->in_shape[0], d = l->in_shape[1] / l->heads, h = att_heads(l),
            c = h * d;
    td_tensor *qkv = &l->ws[ATT_QKV], *p = &l->ws[ATT_P], *s = &l->ws[ATT_S],
              *dqkv = &l->ws[ATT_DQKV], *dyh = &l->ws[ATT_DYH];
    /* output projection */
    if (h == 0) {
        if (!r->defer)
            TD_CHECK(att_weights(l, x, r));
        if (!dx)
            return TD_OK;
        TD_CHECK(td__zero(dx));
        return td__model_reduce(r->model, dx);
    }
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
    TD_CHECK(att_unproject(l));
    if (!r->defer)
        TD_CHECK(att_weights(l, x, r));
    if (!dx)
        return TD_OK;
    TD_CHECK(td__op_matmul(dx, att_draw(l), 0, l->param[0], 0, 1.0, 0.0));
    return l->split.kind == TD__SPLIT_HEADS ? td__model_reduce(r->model, dx) : TD_OK;
}

const td_layer_vt td__attention_vt = {"attention", att_plan, att_forward, att_backward,
                                      att_weights};

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

const td_layer_vt td__conv2d_vt = {"conv2d", linear_plan, conv_forward, conv_backward, NULL};

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

const td_layer_vt td__pool_vt = {"pool", pool_plan, pool_forward, pool_backward, NULL};

/* Containers --------------------------------------------------------------------------- */

static void grads_ready(const td_layer *c, const td_nn_run *r) {
    if (c->nparams > 0)
        td__model_grads_ready(r->model, c->first_param, (size_t)c->nparams);
}

static td_status child_backward(td_layer *c, const td_tensor *x, td_tensor *dx, td_nn_run *r) {
    TD_CHECK(c->vt->backward(c, x, dx, r));
    if (!r->defer)
        grads_ready(c, r);
    return TD_OK;
}

static td_status child_weights(td_layer *c, const td_tensor *x, td_nn_run *r) {
    if (c->vt->weights)
        TD_CHECK(c->vt->weights(c, x, r));
    grads_ready(c, r);
    return TD_OK;
}

/* Inference only: child i of l in bank i % 2 from p->used on, child i - 1's
 * output (its input) in the other; each bank as large as its largest
 * child's plan, measured dry first. */
static td_status seq_plan_banks(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    size_t start = (p->used + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN, bank[2] = {0, 0};
    const td_tensor *cur = x;
    for (int i = 0; i < l->nchildren; i++) {
        td_nn_plan dry = *p;
        dry.dry = 1;
        dry.used = 0;
        TD_CHECK(l->children[i]->vt->plan(l->children[i], &dry, cur));
        bank[i % 2] = dry.used > bank[i % 2] ? dry.used : bank[i % 2];
    }
    bank[0] = (bank[0] + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    for (int i = 0; i < l->nchildren; i++) {
        p->used = start + (i % 2 ? bank[0] : 0);
        TD_CHECK(l->children[i]->vt->plan(l->children[i], p, cur));
        cur = &l->children[i]->out;
    }
    p->used = start + bank[0] + bank[1];
    return TD_OK;
}

static td_status seq_plan(td_layer *l, td_nn_plan *p, const td_tensor *x) {
    const td_tensor *cur = x;
    if (p->infer && l->nchildren > 2)
        TD_CHECK(seq_plan_banks(l, p, x));
    else
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

td_status td__seq_child_weights(td_layer *l, int i, const td_tensor *x, td_nn_run *r) {
    return child_weights(l->children[i], i ? &l->children[i - 1]->out : x, r);
}

/* In the backward's order, each child from the input it had. */
static td_status seq_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    for (int i = l->nchildren - 1; i >= 0; i--)
        TD_CHECK(td__seq_child_weights(l, i, x, r));
    return TD_OK;
}

const td_layer_vt td__sequential_vt = {"sequential", seq_plan, seq_forward, seq_backward,
                                       seq_weights};

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

static td_status res_weights(td_layer *l, const td_tensor *x, td_nn_run *r) {
    return l->children[0]->vt->weights(l->children[0], x, r);
}

const td_layer_vt td__residual_vt = {"residual", res_plan, res_forward, res_backward, res_weights};

void td__layer_destroy(td_layer *l) {
    if (!l)
        return;
    for (int i = 0; i < l->nchildren; i++)
        td__layer_destroy(l->children[i]);
    free(l->children);
    td_tensor_destroy(l->rope);
    free(l->path);
    free(l);
}
