/* A small PNG reader for tests that render an SVG with rsvg-convert and look
 * at the pixels (tests/cli/test_plot_cli.c, test_plot_trace_cli.c). */
#ifndef TD_TEST_PNG_H
#define TD_TEST_PNG_H

#include <stddef.h>

/* An image decoded from PNG: (h, w, 4) bytes, RGBA. */
typedef struct td_test_image {
    int w, h;
    unsigned char *px; /* malloc'ed; the caller frees it */
} td_test_image;

/* Decodes a PNG of 8-bit RGB or RGBA, not interlaced (what rsvg-convert
 * writes), with zlib: enough of the format to look at the pixels. Fails the
 * test when the file is anything else. */
td_test_image td_test_read_png(const char *path);

/* The pixel at (x, y): 4 bytes, RGBA. */
const unsigned char *td_test_pixel(const td_test_image *im, int x, int y);

/* Drawn on: not the white page (nor transparent). */
int td_test_inked(const unsigned char *p);

#endif
