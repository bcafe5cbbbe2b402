/* Overlap-tile geometry (tiles-impl.h), along each axis alike.
 *
 * Outputs [o0, o1) of the last spatial layer read the image's rows
 * [i0, i1), found by going back through the layers (a window of kernel k,
 * stride s and padding p maps outputs [a, b) to inputs [a s - p, (b - 1) s
 * - p + k)). Every crop has one size, so one model serves every tile: the
 * largest span a tile needs, grown so that a crop ending at the image's
 * edge starts on a multiple of the strides' product (a crop's outputs then
 * fall on the whole image's grid). A crop's output is the whole image's
 * where every input it read is the image's own or genuine padding beyond
 * the image's edge; crop_serves checks that for every tile, layer by
 * layer, before any tile runs. */
#include <assert.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/tiles-impl.h"
#include "tandem/nn.h"

static int is_window(const char *type) {
    return !strcmp(type, "conv2d") || !strcmp(type, "maxpool") || !strcmp(type, "avgpool");
}

static int is_pointwise(const char *type) {
    static const char *const kinds[] = {"relu", "gelu", "tanh", "sigmoid", "dropout", NULL};
    for (int i = 0; kinds[i]; i++)
        if (!strcmp(type, kinds[i]))
            return 1;
    return 0;
}

static int64_t int_field(json_t *layer, const char *key, int64_t dflt) {
    json_t *v = json_object_get(layer, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

/* The windows of layers [0, spatial_end) from the JSON array `layers`. */
static void read_windows(json_t *layers, td__tile_plan *p, const td_layer_info *li) {
    for (int l = 0; l < p->spatial_end; l++) {
        json_t *spec = json_array_get(layers, (size_t)l);
        td__window *w = &p->win[l];
        *w = (td__window){1, 1, 0};
        if (!is_window(li[l].type))
            continue;
        w->k = int_field(spec, "kernel", 1);
        w->s = int_field(spec, "stride", strcmp(li[l].type, "conv2d") ? w->k : 1);
        w->p = int_field(spec, "padding", 0);
    }
}

static int64_t floor_div(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return -floor_div(-a, b);
}

/* The image rows [*i0, *i1) (they may reach past its edges) that outputs
 * [o0, o1) read. */
static void receptive(const td__tile_plan *p, int64_t o0, int64_t o1, int64_t *i0, int64_t *i1) {
    for (int l = p->spatial_end - 1; l >= 0; l--) {
        const td__window *w = &p->win[l];
        o0 = o0 * w->s - w->p;
        o1 = (o1 - 1) * w->s - w->p + w->k;
    }
    *i0 = o0;
    *i1 = o1;
}

/* Whether a crop of rows [c0, c0 + size) of an image of n rows gives the
 * whole image's outputs [o0, o1). */
static int crop_serves(const td__tile_plan *p, int64_t n, int64_t c0, int64_t size, int64_t o0,
                       int64_t o1) {
    int64_t u0 = c0, u1 = c0 + size, q0 = c0; /* rows right so far; the crop's first */
    for (int l = 0; l < p->spatial_end; l++) {
        const td__window *w = &p->win[l];
        int64_t lo = u0 == 0 ? INT64_MIN / 4 : u0, hi = u1 == n ? INT64_MAX / 4 : u1;
        int64_t out_n = (n + 2 * w->p - w->k) / w->s + 1;
        int64_t crop_out = (size + 2 * w->p - w->k) / w->s + 1;
        if (q0 % w->s || crop_out < 1)
            return 0;
        q0 /= w->s;
        u0 = ceil_div(lo + w->p, w->s);
        u1 = floor_div(hi + w->p - w->k, w->s) + 1;
        u0 = u0 > q0 ? u0 : q0;
        u1 = u1 < q0 + crop_out ? u1 : q0 + crop_out;
        u0 = u0 > 0 ? u0 : 0;
        u1 = u1 < out_n ? u1 : out_n;
        n = out_n;
        size = crop_out;
    }
    return u0 <= o0 && o1 <= u1;
}

/* One axis: tiles of `tile` outputs over `out` outputs of an image of n
 * rows; the crop size every tile's span fits in, ending crops aligned. */
static int64_t crop_size(const td__tile_plan *p, int64_t n, int64_t out, int64_t tile) {
    int64_t need = 1, S = p->stride, c;
    for (int64_t o0 = 0; o0 < out; o0 += tile) {
        int64_t i0, i1, o1 = o0 + tile < out ? o0 + tile : out;
        receptive(p, o0, o1, &i0, &i1);
        i0 = i0 > 0 ? i0 : 0;
        i1 = i1 < n ? i1 : n;
        i0 -= i0 % S;
        need = i1 - i0 > need ? i1 - i0 : need;
    }
    c = n - (n - need) / S * S; /* n - c is a multiple of S */
    return c < n ? c : n;
}

/* The first row of the crop for outputs [o0, o1) along an axis of n rows. */
static int64_t crop_start(const td__tile_plan *p, int64_t n, int64_t size, int64_t o0, int64_t o1) {
    int64_t i0, i1;
    receptive(p, o0, o1, &i0, &i1);
    i0 = i0 > 0 ? i0 : 0;
    i0 -= i0 % p->stride;
    return i0 < n - size ? i0 : n - size;
}

void td__tile_get(const td__tile_plan *p, int t, td__tile *out) {
    int r = t / p->grid_w, c = t % p->grid_w;
    assert(t >= 0 && t < p->tiles);
    out->oh0 = r * p->tile_h;
    out->oh1 = out->oh0 + p->tile_h < p->out_h ? out->oh0 + p->tile_h : p->out_h;
    out->ow0 = c * p->tile_w;
    out->ow1 = out->ow0 + p->tile_w < p->out_w ? out->ow0 + p->tile_w : p->out_w;
    out->ch0 = crop_start(p, p->h, p->crop_h, out->oh0, out->oh1);
    out->cw0 = crop_start(p, p->w, p->crop_w, out->ow0, out->ow1);
}

/* The spatial prefix's end, and the output size it gives along an axis of n. */
static int64_t out_size(const td__tile_plan *p, int64_t n) {
    for (int l = 0; l < p->spatial_end; l++)
        n = (n + 2 * p->win[l].p - p->win[l].k) / p->win[l].s + 1;
    return n;
}

/* Grid, tile and crop sizes, and the check that every tile is served. */
static td_status cut(td__tile_plan *p, int grid, int members, const char *name) {
    p->stride = 1;
    for (int l = 0; l < p->spatial_end; l++)
        p->stride *= p->win[l].s;
    p->out_h = out_size(p, p->h);
    p->out_w = out_size(p, p->w);
    p->tile_h = (p->out_h + grid - 1) / grid;
    p->tile_w = (p->out_w + grid - 1) / grid;
    p->grid_h = (int)((p->out_h + p->tile_h - 1) / p->tile_h);
    p->grid_w = (int)((p->out_w + p->tile_w - 1) / p->tile_w);
    p->tiles = p->grid_h * p->grid_w;
    if (p->tiles <= members)
        return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                 "tiles: %s's %lldx%lld feature map gives %d tiles, no more than "
                                 "the %d devices (a larger `grid` or image)",
                                 name, (long long)p->out_h, (long long)p->out_w, p->tiles, members);
    p->crop_h = crop_size(p, p->h, p->out_h, p->tile_h);
    p->crop_w = crop_size(p, p->w, p->out_w, p->tile_w);
    p->crop_out_h = out_size(p, p->crop_h);
    p->crop_out_w = out_size(p, p->crop_w);
    for (int t = 0; t < p->tiles; t++) {
        td__tile tl;
        td__tile_get(p, t, &tl);
        if (!crop_serves(p, p->h, tl.ch0, p->crop_h, tl.oh0, tl.oh1) ||
            !crop_serves(p, p->w, tl.cw0, p->crop_w, tl.ow0, tl.ow1))
            return td__error(TD_ERR_INTERNAL,
                             "tiles: the crop of tile %d of %s misses part of "
                             "its receptive field",
                             t, name);
    }
    return TD_OK;
}

/* The model's JSON with its input shape (c, crop_h, crop_w). */
static td_status shrink_input(json_t *root, const td__tile_plan *p, char **out) {
    json_t *input = json_object_get(root, "input");
    json_t *shape =
        json_pack("[III]", (json_int_t)p->c, (json_int_t)p->crop_h, (json_int_t)p->crop_w);
    if (!json_is_object(input) || !shape || json_object_set_new(input, "shape", shape))
        return td__error(TD_ERR_PARSE, "tiles: the model's \"input\" has no shape to crop");
    if (!(*out = json_dumps(root, JSON_COMPACT)))
        return TD_ERR_OUT_OF_MEMORY;
    return TD_OK;
}

td_status td__tiles_plan(const char *json, const char *name, int grid, int members,
                         td__tile_plan *p, char **crop_json) {
    td_layer_info li[TD_TILES_MAX_LAYERS + 1];
    td_model_info info;
    json_t *root = NULL;
    td_status st;
    int windows = 0;
    memset(p, 0, sizeof *p);
    *crop_json = NULL;
    TD_CHECK(td_model_describe(json, name, &info, li, TD_TILES_MAX_LAYERS + 1));
    if (info.kind != TD_INPUT_FEATURES || info.in_ndim != 3)
        return td__error(TD_ERR_UNSUPPORTED,
                         "tiles: %s does not read images (channels, height, "
                         "width)",
                         name);
    p->layers = info.layers;
    while (p->spatial_end < info.layers && p->spatial_end < TD_TILES_MAX_LAYERS &&
           (is_window(li[p->spatial_end].type) || is_pointwise(li[p->spatial_end].type)))
        p->spatial_end++;
    for (int l = 0; l < p->spatial_end; l++)
        windows += is_window(li[l].type);
    if (!windows || p->spatial_end == info.layers)
        return td__error(TD_ERR_UNSUPPORTED,
                         "tiles: %s has no spatial layers to tile (conv2d, maxpool, avgpool first, "
                         "then flatten or linear on the stitched feature map)",
                         name);
    p->c = info.in_shape[0];
    p->h = info.in_shape[1];
    p->w = info.in_shape[2];
    p->out_c = li[p->spatial_end - 1].out_shape[0];
    if (!(root = json_loads(json, 0, NULL)))
        return td__error(TD_ERR_PARSE, "tiles: %s is not JSON", name);
    read_windows(json_object_get(root, "layers"), p, li);
    if ((st = cut(p, grid, members, name)) == TD_OK)
        st = shrink_input(root, p, crop_json);
    json_decref(root);
    if (st == TD_OK && (p->out_h != li[p->spatial_end - 1].out_shape[1] ||
                        p->out_w != li[p->spatial_end - 1].out_shape[2]))
        st = td__error(TD_ERR_INTERNAL,
                       "tiles: %s: the feature map's size differs from the "
                       "model's",
                       name);
    return st;
}
