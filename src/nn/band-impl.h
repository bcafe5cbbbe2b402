/* The inside of a band model (split-frame: the `spatial` strategy's
 * member): band.c finds the head and cuts its geometry, band_run.c runs the
 * passes.
 *
 * Head layer i computes its own output rows [lo, hi) of every plane (a
 * sample's channel) from the input rows [base, end), its window X' (xw):
 * the rows its kernel reads, which reach into the neighbours' bands (the
 * halo). The window starts on a row that is a multiple of the stride, so
 * the kernel, run on X' with the layer's own padding, computes output row
 * base / stride + j as its row j: its rows [y0, y0 + hi - lo) are the band's
 * (the few others, which read the kernel's padding where the image has
 * rows, are not used). Where X' meets the image's edge the kernel's padding
 * is the image's, so max-pooling and averaging pad as on one device.
 *
 * The halo travels in one all-gather per layer: every member puts the first
 * `up` rows of its input band (what the band above reads) and the last
 * `down` rows (what the band below reads) of each plane in a block of
 * (planes, up + down, width); each takes its rows out of its neighbours'
 * blocks. The backward sends the gradients of those rows back in the same
 * blocks (to the band below in the first `up` rows, to the band above in the
 * last `down`), and the owner adds them to its own. */
#ifndef TD_NN_BAND_IMPL_H
#define TD_NN_BAND_IMPL_H

#include "nn/nn-impl.h"

typedef struct td__band_layer {
    td_layer *l;  /* top-level child i of the model */
    int windowed; /* conv2d or a pool: reads rows around its own */
    int64_t c, w, oc, ow, h_in;
    int64_t lo, hi;       /* its output rows on this member */
    int64_t in_lo, in_hi; /* its input rows on this member: the band before's */
    int64_t base, end;    /* its window X': input rows [base, end) */
    int64_t y0, yh;       /* the kernel's output rows on X', and where lo is among them */
    int64_t up, down;     /* rows of the exchange blocks (0 and 0: no exchange) */
    /* This member's rows from the band above, [above0, above1), and from the
     * band below, [below0, below1) (empty when none). */
    int64_t above0, above1, below0, below1;
    /* The rows the neighbours take from this member: the band above's
     * [nb_below0, nb_below1), the band below's [nb_above0, nb_above1). */
    int64_t nb_below0, nb_below1, nb_above0, nb_above1;
    /* out and dout hold rows [row0, row0 + rows) of each plane: a windowed
     * layer's are its kernel's output on X' (yw, dyw), which holds a few
     * rows beside its own; an element-wise layer's, its own rows. */
    int64_t rows, row0;
    /* X' is the band before's output itself (its rows are exactly the
     * window's): xw and dxw are the band before's out and dout, no copy. */
    int x_alias;
    /* Per batch (n samples), owned (out and dout only when not yw and dyw,
     * xw and dxw only when not x_alias): */
    td_tensor *out, *dout;  /* (n, oc, rows, ow) */
    td_tensor *xw, *dxw;    /* (n, c, end - base, w) */
    td_tensor *yw, *dyw;    /* (n, oc, yh, ow) */
    td_buffer *argmax;      /* max-pooling: (n, oc, yh, ow) int32 */
    td_tensor *send, *recv; /* (planes, up + down, w), (members, planes, up + down, w) */
} td__band_layer;

struct td__bands {
    int members, rank, layers;
    int64_t *bounds;          /* (layers, members + 1) */
    int64_t n;                /* the batch the buffers are made for (0: none) */
    int64_t gather_rows;      /* the most rows any band holds of the head's output */
    td_tensor *gsend, *grecv; /* (planes, gather_rows, ow), (members, planes, ...) */
    td_tensor *grads;         /* every head weight gradient end to end: one reduction for all */
    td_gather_fn gather;
    void *gather_arg;
    td__band_layer bl[TD_BAND_MAX_LAYERS];
};

/* Band k's first row of head layer i's output (k = members: its height). */
static inline int64_t td__band_bound(const struct td__bands *b, int i, int k) {
    return b->bounds[(size_t)i * (size_t)(b->members + 1) + (size_t)k];
}

/* 1 for the layers a head may hold. */
int td__band_windowed(const td_layer *l);
int td__band_elementwise(const td_layer *l);

#endif
