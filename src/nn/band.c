/* Band models: which layers of a model run on bands (its head), and the
 * geometry of one member's bands, halos and exchanges (band-impl.h says
 * how they fit together; band_run.c runs them). */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/band-impl.h"

int td__band_windowed(const td_layer *l) {
    return l->vt == &td__conv2d_vt || l->vt == &td__pool_vt;
}

int td__band_elementwise(const td_layer *l) {
    return l->vt == &td__act_vt;
}

/* The head of m: its leading top-level layers that work on rows. */
static int head_length(const td_model *m) {
    int i = 0;
    while (
        i < m->root->nchildren && i < TD_BAND_MAX_LAYERS &&
        (td__band_windowed(m->root->children[i]) || td__band_elementwise(m->root->children[i])) &&
        m->root->children[i]->in_ndim == 3)
        i++;
    return i;
}

static td_status check_head(const td_model *m, const char *name, int layers) {
    int windowed = 0;
    if (m->kind != TD_INPUT_FEATURES || m->in_ndim != 3)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: spatial bands need images, an input of (channels, height, width)",
                         name);
    for (int i = 0; i < layers; i++)
        windowed += td__band_windowed(m->root->children[i]);
    if (!windowed)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: its first layers (before layer %d, a %s) hold no conv2d or pool: "
                         "nothing to cut into bands",
                         name, layers, m->root->children[layers]->type);
    if (layers == m->root->nchildren)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: every layer is a conv2d, pool or activation; the loss needs "
                         "classes (a flatten and a linear after them)",
                         name);
    return TD_OK;
}

td_status td_model_describe_bands(const char *json, const char *name, td_band_head *out) {
    td_model *m = NULL;
    td_status st;
    if (!json || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_describe_bands: json or out is NULL");
    memset(out, 0, sizeof *out);
    name = name ? name : "(model)";
    TD_CHECK(td__model_build(json, name, NULL, TD_F32, 0, 0, -1, 0, NULL, 0, &m));
    out->layers = head_length(m);
    if ((st = check_head(m, name, out->layers)) == TD_OK) {
        out->in_rows = m->in_shape[1];
        for (int i = 0; i < out->layers; i++) {
            out->rows[i] = m->root->children[i]->out_shape[1];
            snprintf(out->type[i], sizeof out->type[i], "%s", m->root->children[i]->type);
        }
    }
    td_model_destroy(m);
    return st;
}

/* Geometry -------------------------------------------------------------------------- */

/* The input rows [*base, *end) of the window out of which layer l (input
 * h_in rows high) computes its output rows [lo, hi); see band-impl.h. */
static void window_of(const td_layer *l, int64_t h_in, int64_t lo, int64_t hi, int64_t *base,
                      int64_t *end) {
    const td_conv_desc *d = &l->conv;
    int64_t s, skip, last;
    if (!td__band_windowed(l)) {
        *base = lo;
        *end = hi;
        return;
    }
    s = d->stride;
    skip = (d->pad + s - 1) / s; /* outputs whose window starts in the padding */
    *base = lo > skip ? (lo - skip) * s : 0;
    last = (hi - 1) * s - d->pad + d->kh;
    *end = last < h_in ? last : h_in;
}

/* The input rows band k of layer i holds (layer 0's: the whole input,
 * which every member loads). */
static void input_band(const struct td__bands *b, int i, int k, int64_t h_in, int64_t *lo,
                       int64_t *hi) {
    *lo = i ? td__band_bound(b, i - 1, k) : 0;
    *hi = i ? td__band_bound(b, i - 1, k + 1) : h_in;
}

static td_status thin_band(const td_layer *l, int i, int k, int nb, int64_t a, int64_t z,
                           int64_t nlo, int64_t nhi) {
    return td__error(TD_ERR_INVALID_ARG,
                     "spatial: layer %d (%s, kernel %lld, stride %lld, padding %lld): band %d "
                     "reads input rows [%lld, %lld), but band %d holds only rows [%lld, %lld): "
                     "a band is thinner than the kernel's halo; use fewer devices or a taller "
                     "image",
                     i, l->type, (long long)l->conv.kh, (long long)l->conv.stride,
                     (long long)l->conv.pad, k, (long long)a, (long long)z, nb, (long long)nlo,
                     (long long)nhi);
}

/* Band k's rows from the band above, [*a0, *a1), and from the one below,
 * [*b0, *b1), at layer i; refuses a neighbour that does not hold them. */
static td_status halo_of(const struct td__bands *b, const td_layer *l, int i, int k, int64_t *a0,
                         int64_t *a1, int64_t *b0, int64_t *b1) {
    int64_t h_in = l->in_shape[1], lo, hi, base, end, in_lo, in_hi, nlo, nhi;
    lo = td__band_bound(b, i, k);
    hi = td__band_bound(b, i, k + 1);
    input_band(b, i, k, h_in, &in_lo, &in_hi);
    window_of(l, h_in, lo, hi, &base, &end);
    *a0 = base;
    *a1 = base < in_lo ? (end < in_lo ? end : in_lo) : base;
    *b0 = end > in_hi ? (base > in_hi ? base : in_hi) : end;
    *b1 = end;
    if (*a1 > *a0) {
        input_band(b, i, k - 1, h_in, &nlo, &nhi);
        if (k == 0 || *a0 < nlo)
            return thin_band(l, i, k, k - 1, base, end, nlo, nhi);
    }
    if (*b1 > *b0) {
        input_band(b, i, k + 1, h_in, &nlo, &nhi);
        if (k == b->members - 1 || *b1 > nhi)
            return thin_band(l, i, k, k + 1, base, end, nlo, nhi);
    }
    return TD_OK;
}

/* Every band of layer i holds rows, and those of an element-wise layer are
 * its input's (it reads no halo). */
static td_status check_rows(const struct td__bands *b, const td_layer *l, int i) {
    for (int k = 0; k < b->members; k++) {
        if (td__band_bound(b, i, k + 1) <= td__band_bound(b, i, k))
            return td__error(TD_ERR_INVALID_ARG,
                             "spatial: layer %d (%s): band %d of its %lld output rows is empty: "
                             "a band is thinner than the kernel's halo; use fewer devices or a "
                             "taller image",
                             i, l->type, k, (long long)l->out_shape[1]);
        if (i > 0 && !td__band_windowed(l) &&
            td__band_bound(b, i, k) != td__band_bound(b, i - 1, k))
            return td__error(TD_ERR_INVALID_ARG,
                             "spatial: layer %d (%s) is cut unlike the layer before it", i,
                             l->type);
    }
    return TD_OK;
}

/* This member's geometry of layer i, and the exchange blocks' rows. */
static td_status layer_geometry(struct td__bands *b, td_layer *l, int i) {
    td__band_layer *bl = &b->bl[i];
    int r = b->rank;
    bl->l = l;
    bl->windowed = td__band_windowed(l);
    bl->c = l->in_shape[0];
    bl->h_in = l->in_shape[1];
    bl->w = l->in_shape[2];
    bl->oc = l->out_shape[0];
    bl->ow = l->out_shape[2];
    TD_CHECK(check_rows(b, l, i));
    bl->lo = td__band_bound(b, i, r);
    bl->hi = td__band_bound(b, i, r + 1);
    input_band(b, i, r, bl->h_in, &bl->in_lo, &bl->in_hi);
    window_of(l, bl->h_in, bl->lo, bl->hi, &bl->base, &bl->end);
    if (bl->windowed) {
        const td_conv_desc *d = &l->conv;
        bl->yh = (bl->end - bl->base + 2 * d->pad - d->kh) / d->stride + 1;
        bl->y0 = bl->lo - bl->base / d->stride;
        assert(bl->y0 >= 0 && bl->y0 + bl->hi - bl->lo <= bl->yh);
        bl->rows = bl->yh;
        bl->row0 = bl->lo - bl->y0;
    } else {
        bl->rows = bl->hi - bl->lo;
        bl->row0 = bl->lo;
    }
    /* the window is the band before's own rows, which its output holds and
     * nothing beside them (a kernel's rows there would stand where the
     * neighbours' halo belongs) */
    bl->x_alias = i > 0 && bl->windowed && bl->base == bl->in_lo && bl->end == bl->in_hi &&
                  b->bl[i - 1].row0 == bl->in_lo && b->bl[i - 1].rows == bl->in_hi - bl->in_lo;
    bl->up = bl->down = 0;
    for (int k = 0; k < b->members; k++) {
        int64_t a0, a1, b0, b1, in_lo, in_hi;
        TD_CHECK(halo_of(b, l, i, k, &a0, &a1, &b0, &b1));
        input_band(b, i, k, bl->h_in, &in_lo, &in_hi);
        /* the band above sends [in_lo - down, in_lo), the one below [in_hi, in_hi + up) */
        if (a1 > a0 && in_lo - a0 > bl->down)
            bl->down = in_lo - a0;
        if (b1 > b0 && b1 - in_hi > bl->up)
            bl->up = b1 - in_hi;
        if (k == r)
            TD_CHECK(halo_of(b, l, i, k, &bl->above0, &bl->above1, &bl->below0, &bl->below1));
        if (k == r - 1)
            TD_CHECK(halo_of(b, l, i, k, &a0, &a1, &bl->nb_below0, &bl->nb_below1));
        if (k == r + 1)
            TD_CHECK(halo_of(b, l, i, k, &bl->nb_above0, &bl->nb_above1, &b0, &b1));
    }
    return TD_OK;
}

td_status td_model_set_bands(td_model *m, const td_band_plan *plan) {
    struct td__bands *b;
    size_t nb;
    int layers;
    if (!m || !plan || !plan->bounds || plan->members < 1 || plan->rank < 0 ||
        plan->rank >= plan->members)
        return td__error(TD_ERR_INVALID_ARG, "td_model_set_bands: bad arguments");
    if (m->part_first != 0 || m->part_end != m->info.layers || m->splits)
        return td__error(TD_ERR_INVALID_ARG, "td_model_set_bands: needs a whole model");
    layers = head_length(m);
    TD_CHECK(check_head(m, "the model", layers));
    if (plan->layers != layers)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_set_bands: the plan cuts %d layers; the head has %d",
                         plan->layers, layers);
    if (!(b = td__calloc(sizeof *b, "a band model")))
        return TD_ERR_OUT_OF_MEMORY;
    nb = (size_t)layers * (size_t)(plan->members + 1);
    if (!(b->bounds = td__calloc(nb * sizeof *b->bounds, "a band plan"))) {
        td__bands_free(b);
        return TD_ERR_OUT_OF_MEMORY;
    }
    memcpy(b->bounds, plan->bounds, nb * sizeof *b->bounds);
    b->members = plan->members;
    b->rank = plan->rank;
    b->layers = layers;
    for (int i = 0; i < layers; i++) {
        td_status st = layer_geometry(b, m->root->children[i], i);
        if (st != TD_OK) {
            td__bands_free(b);
            return st;
        }
    }
    td__bands_free(m->bands);
    m->bands = b;
    /* the next pass plans anew, into an arena of the band model's size */
    for (int i = 0; i < m->nslots; i++) {
        td_tensor_destroy(m->slots[i].arena);
        td_buffer_free(m->slots[i].iarena);
        m->slots[i].arena = NULL;
        m->slots[i].iarena = NULL;
        m->slots[i].cap_n = 0;
    }
    m->cur_slot = -1;
    return TD_OK;
}

td_status td__band_plan(td_model *m, td_nn_plan *p) {
    td_layer *root = m->root, **child = root->children, *last = child[m->bands->layers - 1];
    const td_tensor *cur = &last->out;
    TD_CHECK(td__plan_tensor(p, &last->out, 1, last->out_ndim, last->out_shape));
    TD_CHECK(td__plan_tensor(p, &last->dout, 1, last->out_ndim, last->out_shape));
    for (int i = m->bands->layers; i < root->nchildren; i++) {
        TD_CHECK(child[i]->vt->plan(child[i], p, cur));
        cur = &child[i]->out;
    }
    root->out = child[root->nchildren - 1]->out;
    root->dout = child[root->nchildren - 1]->dout;
    return TD_OK;
}

void td_model_set_gather_hook(td_model *m, td_gather_fn fn, void *arg) {
    if (m && m->bands) {
        m->bands->gather = fn;
        m->bands->gather_arg = arg;
    }
}
