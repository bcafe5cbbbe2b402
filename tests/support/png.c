/* The PNG reader of png.h. */
#include "support/png.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "support/support.h"

static unsigned be32(const unsigned char *p) {
    return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

td_test_image td_test_read_png(const char *path) {
    size_t n, idat_n = 0, off = 8;
    unsigned char *f = td_test_read_file(path, &n), *idat = malloc(n), *raw;
    int channels = 0;
    uLongf raw_n;
    td_test_image im = {0};
    assert_non_null(idat);
    if (n < 8 || memcmp(f, "\x89PNG\r\n\x1a\n", 8))
        fail_msg("%s: not a PNG", path);
    while (off + 12 <= n) {
        unsigned len = be32(f + off);
        const unsigned char *type = f + off + 4, *data = f + off + 8;
        if (off + 12 + len > n)
            fail_msg("%s: truncated chunk", path);
        if (!memcmp(type, "IHDR", 4)) {
            im.w = (int)be32(data);
            im.h = (int)be32(data + 4);
            if (data[8] != 8 || (data[9] != 2 && data[9] != 6) || data[12] != 0)
                fail_msg("%s: depth %d, colour type %d, interlace %d: not 8-bit RGB(A)", path,
                         data[8], data[9], data[12]);
            channels = data[9] == 6 ? 4 : 3;
        } else if (!memcmp(type, "IDAT", 4)) {
            memcpy(idat + idat_n, data, len);
            idat_n += len;
        }
        off += 12 + len;
    }
    assert_true(im.w > 0 && im.h > 0 && channels > 0);
    raw_n = (uLongf)im.h * (uLongf)(1 + im.w * channels);
    raw = malloc(raw_n);
    assert_non_null(raw);
    if (uncompress(raw, &raw_n, idat, idat_n) != Z_OK ||
        raw_n != (uLongf)im.h * (uLongf)(1 + im.w * channels))
        fail_msg("%s: the image data does not inflate to %dx%d pixels", path, im.w, im.h);
    im.px = calloc((size_t)im.w * im.h, 4);
    assert_non_null(im.px);
    for (int y = 0; y < im.h; y++) {
        unsigned char *row = raw + (size_t)y * (1 + im.w * channels), *cur = row + 1;
        const unsigned char *up = y ? raw + (size_t)(y - 1) * (1 + im.w * channels) + 1 : NULL;
        for (int i = 0; i < im.w * channels; i++) {
            int a = i >= channels ? cur[i - channels] : 0, b = up ? up[i] : 0;
            int c = up && i >= channels ? up[i - channels] : 0,
                p[5] = {0, a, b, (a + b) / 2, paeth(a, b, c)};
            if (row[0] > 4)
                fail_msg("%s: row %d has filter %d", path, y, row[0]);
            cur[i] = (unsigned char)(cur[i] + p[row[0]]);
        }
        for (int x = 0; x < im.w; x++) {
            memcpy(im.px + 4 * ((size_t)y * im.w + x), cur + x * channels, 3);
            im.px[4 * ((size_t)y * im.w + x) + 3] = channels == 4 ? cur[x * channels + 3] : 255;
        }
    }
    free(raw);
    free(idat);
    free(f);
    return im;
}

const unsigned char *td_test_pixel(const td_test_image *im, int x, int y) {
    return im->px + 4 * ((size_t)y * im->w + x);
}

int td_test_inked(const unsigned char *p) {
    return p[3] > 128 && (p[0] < 240 || p[1] < 240 || p[2] < 240);
}
