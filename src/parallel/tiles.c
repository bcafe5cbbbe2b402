/* The `tiles` strategy (graphics cards' SuperTiling: small tiles of a frame
 * dealt to whichever card is free), for evaluation and prediction of images
 * larger than a device wants. The leading spatial layers run on overlap
 * tiles (tiles_plan.c): the last spatial layer's feature map is cut into a
 * grid of more tiles than devices, each computed from a crop of the image
 * padded by its receptive field. Devices pull tile numbers from one atomic
 * counter, so a device that slows down takes fewer; each writes its tile's
 * part of its crop's output into the stitched map, which equals the whole
 * image's bit for bit. The layers after (flatten, linear) run on the
 * stitched map on the first device. */
#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/strategy-impl.h"
#include "parallel/tiles-impl.h"
#include "tensor/view.h"

typedef struct tiles {
    td_group *g;
    int n;
    td__tile_plan plan;
    char *crop_json;                   /* the model with a crop's input shape */
    td_model *head[TD_DP_MAX_MEMBERS]; /* layers [0, spatial_end) of the crop model */
    td_model *tail;                    /* layers [spatial_end, layers) of the model, member 0 */
    float *crop[TD_DP_MAX_MEMBERS];    /* (batch, c, crop_h, crop_w) */
    char *out[TD_DP_MAX_MEMBERS];      /* (batch, out_c, crop_out_h, crop_out_w), model dtype */
    char *stitched;                    /* (batch, out_c, out_h, out_w), model dtype */
    td_buffer *stitched_buf;           /* the same on member 0's device */
    int64_t capacity;                  /* samples the buffers hold */
    size_t es;                         /* bytes per value */
    int64_t taken[TD_DP_MAX_MEMBERS];  /* tiles each member took, over the run */
    int64_t images, steps;
    td_model_info info;
} tiles;

static const td_strategy_option tiles_options[] = {
    {"grid", "N", "at most N tiles down and N across (default 4)"},
    {NULL, NULL, NULL},
};

/* Copies tile tl's crop of every sample of b into crop. */
static void cut_crop(const td__tile_plan *p, const td_batch *b, const td__tile *tl, float *crop) {
    for (int64_t i = 0; i < b->n; i++)
        for (int64_t c = 0; c < p->c; c++)
            for (int64_t y = 0; y < p->crop_h; y++) {
                const float *from = b->x + ((i * p->c + c) * p->h + tl->ch0 + y) * p->w + tl->cw0;
                memcpy(crop + ((i * p->c + c) * p->crop_h + y) * p->crop_w, from,
                       (size_t)p->crop_w * sizeof *crop);
            }
}

/* Writes tile tl's part of a crop's output (n samples) into the stitched
 * map: the crop's output row j is the whole map's row j + ch0 / stride. */
static void place(tiles *q, const td__tile *tl, const char *out, int64_t n) {
    const td__tile_plan *p = &q->plan;
    int64_t dy = tl->ch0 / p->stride, dx = tl->cw0 / p->stride;
    size_t row = (size_t)(tl->ow1 - tl->ow0) * q->es;
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < p->out_c; c++)
            for (int64_t y = tl->oh0; y < tl->oh1; y++) {
                size_t to = (size_t)(((i * p->out_c + c) * p->out_h + y) * p->out_w + tl->ow0);
                size_t from =
                    (size_t)(((i * p->out_c + c) * p->crop_out_h + y - dy) * p->crop_out_w +
                             tl->ow0 - dx);
                memcpy(q->stitched + to * q->es, out + from * q->es, row);
            }
}

typedef struct pull_args {
    tiles *q;
    const td_batch *b;
    atomic_int next;
    int64_t took[TD_DP_MAX_MEMBERS];
} pull_args;

/* Tile t of a's batch on member r: crop, forward, place. */
static td_status run_tile(pull_args *a, int r, int t) {
    tiles *q = a->q;
    td__tile tl;
    td_batch cb = {.n = a->b->n, .labels = a->b->labels};
    size_t bytes =
        (size_t)(a->b->n * q->plan.out_c * q->plan.crop_out_h * q->plan.crop_out_w) * q->es;
    td__tile_get(&q->plan, t, &tl);
    cut_crop(&q->plan, a->b, &tl, q->crop[r]);
    cb.x = q->crop[r];
    TD_CHECK(td_model_part_forward(q->head[r], 0, &cb, 0, NULL, 0, 0, 1.0, NULL));
    TD_CHECK(td_buffer_read(td_model_part_output(q->head[r], 0), 0, q->out[r], bytes));
    place(q, &tl, q->out[r], a->b->n);
    return TD_OK;
}

/* On every member's thread: tiles from the shared counter until none is left. */
static td_status pull_tiles(td_group *g, td_device *dev, int rank, int size, void *arg) {
    pull_args *a = arg;
    (void)g;
    (void)dev;
    (void)size;
    assert(rank >= 0 && rank < a->q->n);
    for (int t; (t = atomic_fetch_add(&a->next, 1)) < a->q->plan.tiles;) {
        TD_CHECK(run_tile(a, rank, t));
        a->took[rank]++;
    }
    return TD_OK;
}

typedef struct tail_args {
    tiles *q;
    const td_batch *b;
    td_step_result res;
} tail_args;

/* On member 0's thread: the stitched map in, the layers after the tiles. */
static td_status run_tail(td_device *dev, void *arg) {
    tail_args *a = arg;
    tiles *q = a->q;
    size_t bytes = (size_t)(a->b->n * q->plan.out_c * q->plan.out_h * q->plan.out_w) * q->es;
    (void)dev;
    TD_CHECK(td_buffer_write(q->stitched_buf, 0, q->stitched, bytes));
    return td_model_part_forward(q->tail, 0, a->b, 0, q->stitched_buf, 0, 0, 1.0, &a->res);
}

/* Buffers for batches of n samples. */
static td_status ensure_capacity(tiles *q, int64_t n) {
    const td__tile_plan *p = &q->plan;
    size_t crop = (size_t)(n * p->c * p->crop_h * p->crop_w) * sizeof(float);
    size_t out = (size_t)(n * p->out_c * p->crop_out_h * p->crop_out_w) * q->es;
    size_t stitched = (size_t)(n * p->out_c * p->out_h * p->out_w) * q->es;
    if (n <= q->capacity)
        return TD_OK;
    for (int r = 0; r < q->n; r++) {
        free(q->crop[r]);
        free(q->out[r]);
        if (!(q->crop[r] = td__calloc(crop, "a tile's crop")) ||
            !(q->out[r] = td__calloc(out, "a tile's output")))
            return TD_ERR_OUT_OF_MEMORY;
    }
    free(q->stitched);
    td_buffer_free(q->stitched_buf);
    q->stitched_buf = NULL;
    if (!(q->stitched = td__calloc(stitched, "the stitched feature map")))
        return TD_ERR_OUT_OF_MEMORY;
    TD_CHECK(td_buffer_alloc(td_group_device(q->g, 0), stitched, &q->stitched_buf));
    q->capacity = n;
    return TD_OK;
}

static td_status tiles_evaluate(void *impl, const td_batch *batches, size_t n,
                                td_step_result *per_batch) {
    tiles *q = impl;
    for (size_t i = 0; i < n; i++) {
        pull_args *a = td__calloc(sizeof *a, "a tiles pass");
        tail_args t = {.q = q, .b = &batches[i]};
        td_status st;
        if (!a)
            return TD_ERR_OUT_OF_MEMORY;
        a->q = q;
        a->b = &batches[i];
        atomic_init(&a->next, 0);
        if ((st = ensure_capacity(q, batches[i].n)) == TD_OK &&
            (st = td_group_run(q->g, pull_tiles, a)) == TD_OK)
            st = td_device_run(td_group_device(q->g, 0), run_tail, &t);
        for (int r = 0; r < q->n; r++)
            q->taken[r] += a->took[r];
        free(a);
        TD_CHECK(st);
        q->images += batches[i].n;
        per_batch[i] = t.res;
    }
    return TD_OK;
}

/* What the members hold, member 0's tail first: its JSON is the model's,
 * which loading checks. Into h[0..members], one more than a member each. */
static void tiles_holdings(void *impl, td__holding *h, int *n) {
    tiles *q = impl;
    h[0] = (td__holding){q->tail, NULL, 0};
    for (int r = 0; r < q->n; r++)
        h[1 + r] = (td__holding){q->head[r], NULL, r};
    *n = 1 + q->n;
}

static td_status tiles_save(void *impl, const char *path, const td_train_state *state) {
    td__holding h[TD_DP_MAX_MEMBERS + 1];
    int n;
    tiles_holdings(impl, h, &n);
    return td__placement_save(h, n, path, state);
}

static td_status tiles_load(void *impl, const char *path, td_train_state *state) {
    tiles *q = impl;
    td__holding h[TD_DP_MAX_MEMBERS + 1];
    td_train_state s;
    int n;
    tiles_holdings(impl, h, &n);
    TD_CHECK(td__placement_load(h, n, path, &s));
    q->steps = s.step;
    if (state)
        *state = s;
    return TD_OK;
}

static double tiles_lr(void *impl) {
    (void)impl;
    return 0;
}

static int64_t tiles_steps(void *impl) {
    return ((tiles *)impl)->steps;
}

static void tiles_model_info(void *impl, td_model_info *out) {
    *out = ((tiles *)impl)->info;
}

static const char *tiles_plan(void *impl, char *buf, size_t n) {
    tiles *q = impl;
    const td__tile_plan *p = &q->plan;
    snprintf(buf, n,
             "every device: layers 0-%d on tiles pulled from a queue, %d a image (%dx%d of "
             "%lldx%lld outputs, crops of %lldx%lld pixels from %lldx%lld)\n%s: layers %d-%d on "
             "the stitched %lldx%lldx%lld feature map\n",
             p->spatial_end - 1, p->tiles, p->grid_h, p->grid_w, (long long)p->tile_h,
             (long long)p->tile_w, (long long)p->crop_h, (long long)p->crop_w, (long long)p->h,
             (long long)p->w, td_device_name(td_group_device(q->g, 0)), p->spatial_end,
             p->layers - 1, (long long)p->out_c, (long long)p->out_h, (long long)p->out_w);
    return buf;
}

static void tiles_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    tiles *q = impl;
    size_t used;
    (void)f;
    used =
        (size_t)snprintf(out->note, sizeof out->note,
                         "tiles: %d an image, %lld images; tiles each device took:", q->plan.tiles,
                         (long long)q->images);
    for (int r = 0; r < q->n && used < sizeof out->note; r++)
        used += (size_t)snprintf(out->note + used, sizeof out->note - used, " %s %lld",
                                 td_device_name(td_group_device(q->g, r)), (long long)q->taken[r]);
}

static void tiles_destroy(void *impl) {
    tiles *q = impl;
    if (!q)
        return;
    for (int r = 0; r < TD_DP_MAX_MEMBERS; r++) {
        td_model_destroy(q->head[r]);
        free(q->crop[r]);
        free(q->out[r]);
    }
    td_model_destroy(q->tail);
    td_buffer_free(q->stitched_buf);
    free(q->stitched);
    free(q->crop_json);
    free(q);
}

static td_status tiles_create(td_strategy *s) {
    tiles *q = td__calloc(sizeof *q, "the tiles strategy");
    td_group *g = s->group;
    int64_t grid = 4;
    if (!q)
        return TD_ERR_OUT_OF_MEMORY;
    s->impl = q;
    q->g = g;
    q->n = td_group_size(g);
    if (td_group_local_size(g) != q->n)
        return td__error(TD_ERR_UNSUPPORTED, "tiles: runs within one process; this group spans "
                                             "several");
    TD_CHECK(td__option_count(s, "grid", 1, &grid));
    TD_CHECK(td_model_describe(s->json, s->model_name, &q->info, NULL, 0));
    TD_CHECK(td__tiles_plan(s->json, s->model_name, (int)grid, q->n, &q->plan, &q->crop_json));
    q->es = td_dtype_size(s->cfg.dtype);
    for (int r = 0; r < q->n; r++) {
        td_device *dev = td_group_device(g, r);
        TD_CHECK(td__tensor_check_dtype(dev, s->cfg.dtype));
        TD_CHECK(td_model_load_part(q->crop_json, s->model_name, dev, s->cfg.dtype, s->cfg.seed, 0,
                                    q->plan.spatial_end, 1, &q->head[r]));
    }
    return td_model_load_part(s->json, s->model_name, td_group_device(g, 0), s->cfg.dtype,
                              s->cfg.seed, q->plan.spatial_end, q->plan.layers, 1, &q->tail);
}

/* Evaluation only: the image's tiles to whichever device is free. */
const td_strategy_ops td__strategy_tiles = {
    .name = "tiles",
    .summary = "evaluation: each image's conv layers on overlap tiles that the devices pull from "
               "a queue, stitched exactly",
    .evaluates_only = 1,
    .options = tiles_options,
    .report = tiles_report,
    .create = tiles_create,
    .destroy = tiles_destroy,
    .model_info = tiles_model_info,
    .plan = tiles_plan,
    .evaluate = tiles_evaluate,
    .save = tiles_save,
    .load = tiles_load,
    .lr = tiles_lr,
    .steps = tiles_steps,
};
