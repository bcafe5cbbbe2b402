/* The inside of the `tiles` strategy (tiles.c): the geometry of
 * overlap-tiles (tiles_plan.c). A conv net's leading spatial layers
 * (conv2d, maxpool, avgpool and the element-wise layers between them) run
 * on crops of the image; each crop is a tile of the last spatial layer's
 * feature map padded by what its receptive field reads, so that the tile's
 * part of the crop's output equals the whole image's, bit for bit. */
#ifndef TD_TILES_IMPL_H
#define TD_TILES_IMPL_H

#include <stdint.h>

#include "tandem/status.h"

#define TD_TILES_MAX_LAYERS 64

/* A window layer's square kernel, stride and padding (1, 1, 0 for an
 * element-wise layer). */
typedef struct td__window {
    int64_t k, s, p;
} td__window;

typedef struct td__tile_plan {
    int spatial_end; /* layers [0, spatial_end) run on tiles */
    int layers;      /* the model's top-level layers */
    td__window win[TD_TILES_MAX_LAYERS];
    int64_t c, h, w;                /* the image */
    int64_t out_c, out_h, out_w;    /* the stitched feature map: layer spatial_end - 1's output */
    int64_t stride;                 /* the product of the strides: crops start on its multiples */
    int grid_h, grid_w;             /* tiles down and across */
    int64_t tile_h, tile_w;         /* a tile's output rows and columns (the last ones fewer) */
    int64_t crop_h, crop_w;         /* every crop's input rows and columns */
    int64_t crop_out_h, crop_out_w; /* and the feature map a crop gives */
    int tiles;                      /* grid_h * grid_w */
} td__tile_plan;

/* Tile t (row-major in the grid): its output rows [oh0, oh1) and columns
 * [ow0, ow1) in the stitched map, and its crop's first input row and
 * column. */
typedef struct td__tile {
    int64_t oh0, oh1, ow0, ow1;
    int64_t ch0, cw0;
} td__tile;

/* The plan for the model in json with at most `grid` tiles down and across
 * (fewer when the feature map is smaller), and the model's JSON with its
 * input shrunk to a crop (*crop_json, malloc'ed). A model that does not
 * start with a spatial layer followed by a non-spatial one (flatten,
 * linear), whose input is not an image, or for which grid gives no more
 * tiles than `members`, is TD_ERR_UNSUPPORTED or TD_ERR_INVALID_ARG
 * naming why. */
td_status td__tiles_plan(const char *json, const char *name, int grid, int members,
                         td__tile_plan *p, char **crop_json);

void td__tile_get(const td__tile_plan *p, int t, td__tile *out);

#endif
