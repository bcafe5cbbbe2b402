/* A band model's passes (band-impl.h): the head on this member's bands,
 * its halos traded with the neighbours through the gather hook, the head's
 * output gathered whole, then the rest of the model as on one device; the
 * backward in reverse, the head's weight gradients summed at the end. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "nn/band-impl.h"

/* Rows of every plane of a tensor: plane p starts at element off + p h w
 * and holds rows [row0, row0 + h) of the image (global row numbers). */
typedef struct rows_at {
    const td_tensor *t;
    size_t off;
    int64_t h, row0;
} rows_at;

/* Plane p's rows [first, first + count) of at, as a view. */
static td_status plane_view(rows_at at, int64_t p, int64_t first, int64_t count, int64_t w,
                            td_tensor *v) {
    int64_t len = count * w;
    assert(first >= at.row0 && first + count <= at.row0 + at.h);
    return td__tensor_view(v, at.t, at.off + (size_t)((p * at.h + first - at.row0) * w), 1, &len);
}

/* dst's rows [first, first + count) of every plane = src's (add: +=). */
static td_status copy_rows(rows_at dst, rows_at src, int64_t first, int64_t count, int64_t planes,
                           int64_t w, int add) {
    for (int64_t p = 0; count > 0 && p < planes; p++) {
        td_tensor dv, sv;
        TD_CHECK(plane_view(dst, p, first, count, w, &dv));
        TD_CHECK(plane_view(src, p, first, count, w, &sv));
        TD_CHECK(td__op_axpby(1.0, &sv, add ? 1.0 : 0.0, &dv));
    }
    return TD_OK;
}

/* Rows [first, first + count) of every plane of at set to zeros. */
static td_status zero_rows(rows_at at, int64_t first, int64_t count, int64_t planes, int64_t w) {
    for (int64_t p = 0; count > 0 && p < planes; p++) {
        td_tensor v;
        TD_CHECK(plane_view(at, p, first, count, w, &v));
        TD_CHECK(td__zero(&v));
    }
    return TD_OK;
}

/* An all-gather through the hook; a slowed device is slowed at its compute,
 * not while it waits for the others (as td__model_reduce). */
static td_status exchange(td_model *m, const td_tensor *send, td_tensor *recv, int halo) {
    struct td__bands *b = m->bands;
    td_status st;
    if (b->members == 1)
        return td__op_copy(send, recv);
    if (!b->gather)
        return td__error(TD_ERR_INVALID_ARG, "band model on %s: no gather hook",
                         td_device_name(m->dev));
    td_device_throttle(m->dev, m->stretch_start, 0);
    st = b->gather(b->gather_arg, send, recv, halo);
    m->stretch_start = td_clock_ns();
    return st;
}

/* Buffers ---------------------------------------------------------------------------- */

static void free_layer(td__band_layer *bl) {
    td_tensor *t[] = {bl->yw, bl->dyw, bl->send, bl->recv};
    if (bl->out != bl->yw) {
        td_tensor_destroy(bl->out);
        td_tensor_destroy(bl->dout);
    }
    if (!bl->x_alias) {
        td_tensor_destroy(bl->xw);
        td_tensor_destroy(bl->dxw);
    }
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        td_tensor_destroy(t[i]);
    td_buffer_free(bl->argmax);
    bl->out = bl->dout = bl->xw = bl->dxw = bl->yw = bl->dyw = bl->send = bl->recv = NULL;
    bl->argmax = NULL;
}

static void free_buffers(struct td__bands *b) {
    for (int i = 0; i < b->layers; i++)
        free_layer(&b->bl[i]);
    td_tensor_destroy(b->gsend);
    td_tensor_destroy(b->grecv);
    td_tensor_destroy(b->grads);
    b->gsend = b->grecv = b->grads = NULL;
    b->n = 0;
}

void td__bands_free(struct td__bands *b) {
    if (!b)
        return;
    free_buffers(b);
    free(b->bounds);
    free(b);
}

static td_status make(td_model *m, int64_t len, td_tensor **out) {
    return td_tensor_create(m->dev, m->dtype, 1, &len, out);
}

/* Layer i's buffers for n samples. */
static td_status make_layer(td_model *m, struct td__bands *b, int i, int64_t n) {
    td__band_layer *bl = &b->bl[i];
    int64_t out = n * bl->oc * bl->rows * bl->ow, win = n * bl->c * (bl->end - bl->base);
    int64_t block = n * bl->c * (bl->up + bl->down) * bl->w;
    if (!bl->windowed) {
        TD_CHECK(make(m, out, &bl->out));
        TD_CHECK(make(m, out, &bl->dout));
    }
    if (bl->x_alias) { /* made before it: make_buffers goes in order */
        bl->xw = b->bl[i - 1].out;
        bl->dxw = b->bl[i - 1].dout;
    } else if (bl->windowed || i == 0) {
        TD_CHECK(make(m, win * bl->w, &bl->xw));
        TD_CHECK(make(m, win * bl->w, &bl->dxw));
    }
    if (bl->windowed) {
        int64_t y = n * bl->oc * bl->yh * bl->ow;
        TD_CHECK(make(m, y, &bl->yw));
        TD_CHECK(make(m, y, &bl->dyw));
        /* its own rows are read where the kernel wrote them */
        bl->out = bl->yw;
        bl->dout = bl->dyw;
        if (bl->l->vt == &td__pool_vt && bl->l->pool == TD_POOL_MAX)
            TD_CHECK(td_buffer_alloc(m->dev, (size_t)y * sizeof(int32_t), &bl->argmax));
    }
    if (block > 0) {
        TD_CHECK(make(m, block, &bl->send));
        TD_CHECK(make(m, block * b->members, &bl->recv));
    }
    return TD_OK;
}

/* The scalars of the head's parameters (at least 1: a head of pools has none). */
static size_t head_weights(const struct td__bands *b) {
    size_t n = 0;
    for (int i = 0; i < b->layers; i++)
        for (int j = 0; j < b->bl[i].l->nparams; j++)
            n += td_tensor_numel(b->bl[i].l->grad[j]);
    return n ? n : 1;
}

/* Every head weight gradient copied end to end into b->grads (to_flat), or
 * back from it. */
static td_status flat_grads(struct td__bands *b, int to_flat) {
    size_t at = 0;
    for (int i = 0; i < b->layers; i++)
        for (int j = 0; j < b->bl[i].l->nparams; j++) {
            td_tensor *g = b->bl[i].l->grad[j], v;
            int64_t len = (int64_t)td_tensor_numel(g);
            TD_CHECK(td__tensor_view(&v, b->grads, at, 1, &len));
            TD_CHECK(to_flat ? td__op_copy(g, &v) : td__op_copy(&v, g));
            at += (size_t)len;
        }
    return TD_OK;
}

/* The head's weight gradients summed over the bands, in one reduction (each
 * is a point every member waits for the slowest at). */
static td_status reduce_head_grads(td_model *m, struct td__bands *b) {
    TD_CHECK(flat_grads(b, 1));
    TD_CHECK(td__model_reduce(m, b->grads));
    return flat_grads(b, 0);
}

static td_status make_buffers(td_model *m, struct td__bands *b, int64_t n) {
    const td__band_layer *last = &b->bl[b->layers - 1];
    int64_t block;
    free_buffers(b);
    for (int i = 0; i < b->layers; i++)
        TD_CHECK(make_layer(m, b, i, n));
    b->gather_rows = 0;
    for (int k = 0; k < b->members; k++) {
        int64_t rows =
            td__band_bound(b, b->layers - 1, k + 1) - td__band_bound(b, b->layers - 1, k);
        b->gather_rows = rows > b->gather_rows ? rows : b->gather_rows;
    }
    block = n * last->oc * b->gather_rows * last->ow;
    TD_CHECK(make(m, block, &b->gsend));
    TD_CHECK(make(m, block * b->members, &b->grecv));
    TD_CHECK(make(m, (int64_t)head_weights(b), &b->grads));
    b->n = n;
    return TD_OK;
}

/* Forward ---------------------------------------------------------------------------- */

/* Layer i's kernel over its window X'. */
static td_conv_desc window_desc(const td__band_layer *bl, int64_t n) {
    td_conv_desc d = bl->l->conv;
    d.n = n;
    d.h = bl->end - bl->base;
    d.oh = bl->yh;
    return d;
}

/* The block of member k in an exchange buffer, seen from the rows of the
 * slot that starts at global row `row0` (band-impl.h). */
static rows_at block_of(const td__band_layer *bl, const td_tensor *t, int k, int64_t planes,
                        int64_t row0) {
    int64_t rows = bl->up + bl->down;
    rows_at r = {t, (size_t)(k * planes * rows * bl->w), rows, row0};
    return r;
}

/* X' of layer i: its input rows from the input (layer 0) or the band
 * before, and the halo from the neighbours. */
static td_status fill_window(td_model *m, struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i];
    int64_t planes = b->n * bl->c, a, z;
    rows_at x = {bl->xw, 0, bl->end - bl->base, bl->base}, own;
    if (i == 0) {
        rows_at in = {&m->input, 0, bl->h_in, 0};
        return copy_rows(x, in, bl->base, bl->end - bl->base, planes, bl->w, 0);
    }
    own = (rows_at){b->bl[i - 1].out, 0, b->bl[i - 1].rows, b->bl[i - 1].row0};
    a = bl->base > bl->in_lo ? bl->base : bl->in_lo;
    z = bl->end < bl->in_hi ? bl->end : bl->in_hi;
    if (!bl->x_alias)
        TD_CHECK(copy_rows(x, own, a, z - a, planes, bl->w, 0));
    if (bl->up + bl->down == 0) /* no neighbour reads this input's rows */
        return TD_OK;
    {
        /* my first `up` rows for the band above, my last `down` for the one below */
        int64_t held = bl->in_hi - bl->in_lo;
        int64_t up = bl->up < held ? bl->up : held, down = bl->down < held ? bl->down : held;
        rows_at s_up = block_of(bl, bl->send, 0, planes, bl->in_lo);
        rows_at s_down = block_of(bl, bl->send, 0, planes, bl->in_hi - bl->down - bl->up);
        TD_CHECK(copy_rows(s_up, own, bl->in_lo, up, planes, bl->w, 0));
        TD_CHECK(copy_rows(s_down, own, bl->in_hi - down, down, planes, bl->w, 0));
    }
    TD_CHECK(exchange(m, bl->send, bl->recv, 1));
    if (bl->above1 > bl->above0) {
        rows_at from = block_of(bl, bl->recv, b->rank - 1, planes, bl->in_lo - bl->down - bl->up);
        TD_CHECK(copy_rows(x, from, bl->above0, bl->above1 - bl->above0, planes, bl->w, 0));
    }
    if (bl->below1 > bl->below0) {
        rows_at from = block_of(bl, bl->recv, b->rank + 1, planes, bl->in_hi);
        TD_CHECK(copy_rows(x, from, bl->below0, bl->below1 - bl->below0, planes, bl->w, 0));
    }
    return TD_OK;
}

/* An element-wise layer after another: its own rows of the band before's
 * output, which may hold a kernel's rows beside them (plane by plane then). */
static td_status act_forward(struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i], *pv = &b->bl[i - 1];
    rows_at x = {pv->out, 0, pv->rows, pv->row0}, y = {bl->out, 0, bl->rows, bl->row0};
    if (pv->rows == bl->rows)
        return td__op_act_fwd(bl->l->act, pv->out, bl->out);
    for (int64_t p = 0; p < b->n * bl->c; p++) {
        td_tensor xv, yv;
        TD_CHECK(plane_view(x, p, bl->lo, bl->hi - bl->lo, bl->w, &xv));
        TD_CHECK(plane_view(y, p, bl->lo, bl->hi - bl->lo, bl->w, &yv));
        TD_CHECK(td__op_act_fwd(bl->l->act, &xv, &yv));
    }
    return TD_OK;
}

/* Its backward: the gradient of the band before's own rows, and zeros in
 * the kernel's rows beside them (which the kernel's backward reads). */
static td_status act_backward(struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i], *pv = &b->bl[i - 1];
    rows_at x = {pv->out, 0, pv->rows, pv->row0}, dx = {pv->dout, 0, pv->rows, pv->row0};
    rows_at y = {bl->out, 0, bl->rows, bl->row0}, dy = {bl->dout, 0, bl->rows, bl->row0};
    int64_t planes = b->n * bl->c, rows = bl->hi - bl->lo;
    if (pv->rows == bl->rows)
        return td__op_act_bwd(bl->l->act, pv->out, bl->out, bl->dout, pv->dout);
    for (int64_t p = 0; p < planes; p++) {
        td_tensor xv, yv, dyv, dxv;
        TD_CHECK(plane_view(x, p, bl->lo, rows, bl->w, &xv));
        TD_CHECK(plane_view(y, p, bl->lo, rows, bl->w, &yv));
        TD_CHECK(plane_view(dy, p, bl->lo, rows, bl->w, &dyv));
        TD_CHECK(plane_view(dx, p, bl->lo, rows, bl->w, &dxv));
        TD_CHECK(td__op_act_bwd(bl->l->act, &xv, &yv, &dyv, &dxv));
    }
    TD_CHECK(zero_rows(dx, pv->row0, bl->lo - pv->row0, planes, bl->w));
    return zero_rows(dx, bl->hi, pv->row0 + pv->rows - bl->hi, planes, bl->w);
}

static td_status layer_forward(td_model *m, struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i];
    td_layer *l = bl->l;
    td_conv_desc d;
    if (bl->windowed || i == 0)
        TD_CHECK(fill_window(m, b, i));
    if (!bl->windowed)
        return i ? act_forward(b, i) : td__op_act_fwd(l->act, bl->xw, bl->out);
    d = window_desc(bl, b->n);
    if (l->vt == &td__conv2d_vt)
        return td__op_conv2d_fwd(&d, bl->xw, l->param[0], l->has_bias ? l->param[1] : NULL, bl->yw);
    return td__op_pool_fwd(l->pool, &d, bl->xw, bl->yw, bl->argmax);
}

/* The head's output, whole, into its last layer's view (n, oc, oh, ow). */
static td_status gather_head(td_model *m, struct td__bands *b) {
    td__band_layer *bl = &b->bl[b->layers - 1];
    int64_t planes = b->n * bl->oc, rows = b->gather_rows, oh = bl->l->out_shape[1];
    rows_at send = {b->gsend, 0, rows, bl->lo}, own = {bl->out, 0, bl->rows, bl->row0};
    rows_at whole = {&bl->l->out, 0, oh, 0};
    TD_CHECK(copy_rows(send, own, bl->lo, bl->hi - bl->lo, planes, bl->ow, 0));
    TD_CHECK(exchange(m, b->gsend, b->grecv, 0));
    for (int k = 0; k < b->members; k++) {
        int64_t lo = td__band_bound(b, b->layers - 1, k),
                hi = td__band_bound(b, b->layers - 1, k + 1);
        rows_at from = {b->grecv, (size_t)(k * planes * rows * bl->ow), rows, lo};
        TD_CHECK(copy_rows(whole, from, lo, hi - lo, planes, bl->ow, 0));
    }
    return TD_OK;
}

/* Backward --------------------------------------------------------------------------- */

/* The gradient of layer i's input band (the band before's dout) from its
 * window's: its own rows, and the rows the neighbours read, sent back and
 * added. */
static td_status scatter_window(td_model *m, struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i];
    const td__band_layer *pv = &b->bl[i - 1];
    int64_t planes = b->n * bl->c, a, z;
    rows_at dx = {bl->dxw, 0, bl->end - bl->base, bl->base};
    rows_at mine = {pv->dout, 0, pv->rows, pv->row0};
    a = bl->base > bl->in_lo ? bl->base : bl->in_lo;
    z = bl->end < bl->in_hi ? bl->end : bl->in_hi;
    if (bl->x_alias) {
        /* the kernel wrote the gradient of every row in place */
    } else if (z > a) {
        TD_CHECK(copy_rows(mine, dx, a, z - a, planes, bl->w, 0));
        TD_CHECK(zero_rows(mine, pv->row0, a - pv->row0, planes, bl->w));
        TD_CHECK(zero_rows(mine, z, pv->row0 + pv->rows - z, planes, bl->w));
    } else {
        TD_CHECK(td__zero(pv->dout));
    }
    if (bl->up + bl->down == 0)
        return TD_OK;
    /* to the band below in the `up` slot, to the band above in the `down` one */
    TD_CHECK(copy_rows(block_of(bl, bl->send, 0, planes, bl->in_hi), dx, bl->below0,
                       bl->below1 - bl->below0, planes, bl->w, 0));
    TD_CHECK(copy_rows(block_of(bl, bl->send, 0, planes, bl->in_lo - bl->down - bl->up), dx,
                       bl->above0, bl->above1 - bl->above0, planes, bl->w, 0));
    TD_CHECK(exchange(m, bl->send, bl->recv, 1));
    if (bl->nb_above1 > bl->nb_above0) {
        rows_at from = block_of(bl, bl->recv, b->rank + 1, planes, bl->in_hi - bl->down - bl->up);
        TD_CHECK(
            copy_rows(mine, from, bl->nb_above0, bl->nb_above1 - bl->nb_above0, planes, bl->w, 1));
    }
    if (bl->nb_below1 > bl->nb_below0) {
        rows_at from = block_of(bl, bl->recv, b->rank - 1, planes, bl->in_lo);
        TD_CHECK(
            copy_rows(mine, from, bl->nb_below0, bl->nb_below1 - bl->nb_below0, planes, bl->w, 1));
    }
    return TD_OK;
}

static td_status layer_backward(td_model *m, struct td__bands *b, int i) {
    td__band_layer *bl = &b->bl[i];
    td_layer *l = bl->l;
    td_conv_desc d;
    if (!bl->windowed)
        return i ? act_backward(b, i) : TD_OK;
    /* dout is dyw, whose rows outside the band the layer after left zeros */
    d = window_desc(bl, b->n);
    if (l->vt == &td__conv2d_vt)
        TD_CHECK(td__op_conv2d_bwd(&d, bl->xw, l->param[0], bl->dyw, i ? bl->dxw : NULL, l->grad[0],
                                   l->has_bias ? l->grad[1] : NULL, 0));
    else if (i)
        TD_CHECK(td__op_pool_bwd(l->pool, &d, bl->dyw, bl->argmax, bl->dxw));
    return i ? scatter_window(m, b, i) : TD_OK;
}

/* The head's gradient: its output's own rows from the whole, then its
 * layers in reverse, then its weight gradients summed over the bands. */
static td_status head_backward(td_model *m, struct td__bands *b) {
    td__band_layer *last = &b->bl[b->layers - 1];
    rows_at own = {last->dout, 0, last->rows, last->row0};
    rows_at whole = {&last->l->dout, 0, last->l->out_shape[1], 0};
    if (last->rows != last->hi - last->lo) /* the kernel's other rows get no gradient */
        TD_CHECK(td__zero(last->dout));
    TD_CHECK(copy_rows(own, whole, last->lo, last->hi - last->lo, b->n * last->oc, last->ow, 0));
    for (int i = b->layers - 1; i >= 0; i--)
        TD_CHECK(layer_backward(m, b, i));
    return reduce_head_grads(m, b);
}

td_status td__band_passes(td_model *m, td_nn_run *r, double grad_scale, double *loss_sum,
                          int64_t *correct) {
    struct td__bands *b = m->bands;
    td_layer **child = m->root->children;
    int count = m->root->nchildren;
    int64_t n = m->input.shape[0];
    if (r->acc)
        return td__error(TD_ERR_INVALID_ARG, "band model: a step replaces the gradients "
                                             "(accumulate 0): the head's are summed over bands");
    if (b->n != n)
        TD_CHECK(make_buffers(m, b, n));
    for (int i = 0; i < b->layers; i++)
        TD_CHECK(layer_forward(m, b, i));
    TD_CHECK(gather_head(m, b));
    for (int i = b->layers; i < count; i++)
        TD_CHECK(child[i]->vt->forward(child[i], &child[i - 1]->out, r));
    TD_CHECK(td__op_xent(&m->root->out, &m->labels, r->train ? &m->root->dout : NULL, grad_scale,
                         loss_sum, correct));
    if (!r->train)
        return TD_OK;
    for (int i = count - 1; i >= b->layers; i--)
        TD_CHECK(child[i]->vt->backward(child[i], &child[i - 1]->out, &child[i - 1]->dout, r));
    return head_backward(m, b);
}
