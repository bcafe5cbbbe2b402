/* NumPy's .npy files, read strictly.
 *
 * A .npy file is the magic string "\x93NUMPY", a major and a minor version
 * byte, the header's length (2 bytes little-endian in version 1, 4 in 2 and
 * 3), the header, then the array's bytes. The header is a Python dict
 * literal padded with spaces and ended by a newline:
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 784), }
 * There is no C library for it in Debian, and it is small: this reader takes
 * exactly that grammar (single- or double-quoted keys, the three keys once
 * each, a tuple of non-negative integers) and refuses anything else, rather
 * than evaluating Python. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/data-impl.h"
#include "train/train-impl.h"

/* A .npy file larger than this is refused before reading. */
#define TD_NPY_MAX_BYTES ((size_t)1 << 36)

/* Where the header parser stands, and what it found. */
typedef struct npy_header {
    const char *start, *p, *end; /* the header's bytes, and the place reached */
    const char *name;            /* the file, for messages */
    char descr[16];
    int fortran; /* -1 until seen */
    int ndim;    /* -1 until seen */
    int64_t shape[TD_ST_MAX_DIMS];
} npy_header;

static td_status bad_header(const npy_header *h, const char *what) {
    return td__error(TD_ERR_CORRUPT, "%s: .npy header, at its character %td: %s", h->name,
                     h->p - h->start, what);
}

static void skip_spaces(npy_header *h) {
    while (h->p < h->end && *h->p == ' ')
        h->p++;
}

/* Consumes c (after spaces), or fails naming what was expected. */
static td_status expect_char(npy_header *h, char c, const char *what) {
    skip_spaces(h);
    if (h->p >= h->end || *h->p != c)
        return bad_header(h, what);
    h->p++;
    return TD_OK;
}

/* A quoted string without escapes into buf. */
static td_status read_string(npy_header *h, char *buf, size_t size) {
    char q;
    size_t len = 0;
    skip_spaces(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return bad_header(h, "expected a quoted string");
    q = *h->p++;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\' || *h->p == '\n' || len + 1 >= size)
            return bad_header(h, "a string too long, or with an escape or a line break");
        buf[len++] = *h->p++;
    }
    if (h->p >= h->end)
        return bad_header(h, "a string without its closing quote");
    h->p++;
    buf[len] = '\0';
    return TD_OK;
}

static td_status read_bool(npy_header *h, int *out) {
    skip_spaces(h);
    if ((size_t)(h->end - h->p) >= 4 && !memcmp(h->p, "True", 4)) {
        h->p += 4;
        *out = 1;
    } else if ((size_t)(h->end - h->p) >= 5 && !memcmp(h->p, "False", 5)) {
        h->p += 5;
        *out = 0;
    } else {
        return bad_header(h, "'fortran_order' must be True or False");
    }
    return TD_OK;
}

/* A non-negative decimal integer below 2^62. */
static td_status read_extent(npy_header *h, int64_t *out) {
    int64_t v = 0;
    const char *start;
    skip_spaces(h);
    start = h->p;
    while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
        if (v > ((int64_t)1 << 62) / 10)
            return bad_header(h, "an extent too large");
        v = v * 10 + (*h->p++ - '0');
    }
    if (h->p == start)
        return bad_header(h, "expected a non-negative integer in 'shape'");
    *out = v;
    return TD_OK;
}

/* A Python tuple of extents: (), (n,) or (a, b, ...) with an optional
 * trailing comma; one element needs its comma, as in Python. */
static td_status read_shape(npy_header *h) {
    int commas = 0;
    TD_CHECK(expect_char(h, '(', "'shape' must be a tuple"));
    h->ndim = 0;
    skip_spaces(h);
    while (h->p < h->end && *h->p != ')') {
        if (h->ndim == TD_ST_MAX_DIMS)
            return td__error(TD_ERR_UNSUPPORTED, "%s: more than %d dimensions in 'shape'", h->name,
                             TD_ST_MAX_DIMS);
        TD_CHECK(read_extent(h, &h->shape[h->ndim++]));
        skip_spaces(h);
        if (h->p < h->end && *h->p == ',') {
            h->p++;
            commas++;
            skip_spaces(h);
        } else if (h->p < h->end && *h->p != ')') {
            return bad_header(h, "expected ',' or ')' in 'shape'");
        }
    }
    if (h->ndim == 1 && commas == 0)
        return bad_header(h, "a one-element 'shape' needs its comma: (n,)");
    return expect_char(h, ')', "'shape' without its closing ')'");
}

/* One `'key': value` entry. */
static td_status read_entry(npy_header *h) {
    char key[32];
    TD_CHECK(read_string(h, key, sizeof key));
    TD_CHECK(expect_char(h, ':', "expected ':' after a key"));
    if (!strcmp(key, "descr") && !h->descr[0]) {
        skip_spaces(h);
        if (h->p < h->end && *h->p == '[')
            return td__error(TD_ERR_UNSUPPORTED,
                             "%s: a structured dtype (a list of fields); tandem reads plain "
                             "numeric arrays",
                             h->name);
        TD_CHECK(read_string(h, h->descr, sizeof h->descr));
        if (!h->descr[0])
            return bad_header(h, "'descr' is empty");
        return TD_OK;
    }
    if (!strcmp(key, "fortran_order") && h->fortran < 0)
        return read_bool(h, &h->fortran);
    if (!strcmp(key, "shape") && h->ndim < 0)
        return read_shape(h);
    return td__error(TD_ERR_CORRUPT,
                     "%s: .npy header has key '%s' %s; it holds 'descr', 'fortran_order' and "
                     "'shape' once each",
                     h->name, key,
                     strcmp(key, "descr") && strcmp(key, "fortran_order") && strcmp(key, "shape")
                         ? "(unknown)"
                         : "twice");
}

/* The dict, then only spaces and the closing newline. */
static td_status read_dict(npy_header *h) {
    TD_CHECK(expect_char(h, '{', "expected '{'"));
    skip_spaces(h);
    while (h->p < h->end && *h->p != '}') {
        TD_CHECK(read_entry(h));
        skip_spaces(h);
        if (h->p < h->end && *h->p == ',')
            h->p++;
        else if (h->p < h->end && *h->p != '}')
            return bad_header(h, "expected ',' or '}'");
        skip_spaces(h);
    }
    TD_CHECK(expect_char(h, '}', "the dict without its closing '}'"));
    skip_spaces(h);
    if (h->p < h->end && *h->p == '\n')
        h->p++;
    if (h->p != h->end)
        return bad_header(h, "text after the dict");
    if (!h->descr[0] || h->fortran < 0 || h->ndim < 0)
        return td__error(TD_ERR_CORRUPT, "%s: .npy header lacks '%s'", h->name,
                         !h->descr[0]     ? "descr"
                         : h->fortran < 0 ? "fortran_order"
                                          : "shape");
    return TD_OK;
}

/* descr (byte order, kind, size: "<f4", "|u1") into an element type and
 * byte order. */
static td_status read_descr(const char *name, const char *descr, td__elem *elem, int *big) {
    static const struct {
        const char *code;
        td__elem elem;
    } types[] = {
        {"f4", TD__ELEM_F32}, {"f8", TD__ELEM_F64}, {"u1", TD__ELEM_U8},  {"b1", TD__ELEM_U8},
        {"i1", TD__ELEM_I8},  {"u2", TD__ELEM_U16}, {"i2", TD__ELEM_I16}, {"u4", TD__ELEM_U32},
        {"i4", TD__ELEM_I32}, {"u8", TD__ELEM_U64}, {"i8", TD__ELEM_I64},
    };
    char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return td__error(TD_ERR_CORRUPT, "%s: 'descr' '%s' lacks a byte order (<, >, | or =)", name,
                         descr);
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (!strcmp(descr + 1, types[i].code)) {
            *elem = types[i].elem;
            *big = order == '>' || (order == '=' && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__);
            return TD_OK;
        }
    return td__error(TD_ERR_UNSUPPORTED,
                     "%s: dtype '%s'; tandem reads float32, float64, bool and integer arrays "
                     "(convert with a.astype(np.float32), or np.int64 for labels)",
                     name, descr);
}

/* The header's length and where it starts, by format version. */
static td_status read_preamble(const uint8_t *b, size_t n, const char *name, size_t *start,
                               size_t *len) {
    if (n < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return td__error(TD_ERR_CORRUPT, "%s: not a .npy file (no \\x93NUMPY magic string)", name);
    if (b[6] < 1 || b[6] > 3)
        return td__error(TD_ERR_UNSUPPORTED, "%s: .npy format version %d.%d; tandem reads 1 to 3",
                         name, b[6], b[7]);
    if (b[6] == 1) {
        *start = 10;
        *len = (size_t)b[8] | (size_t)b[9] << 8;
    } else {
        if (n < 12)
            return td__error(TD_ERR_CORRUPT, "%s: truncated .npy header", name);
        *start = 12;
        *len = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    }
    if (*len > n - *start)
        return td__error(TD_ERR_CORRUPT,
                         "%s: truncated: the .npy header is %zu bytes, the file has %zu after the "
                         "preamble",
                         name, *len, n - *start);
    return TD_OK;
}

td_status td__npy_parse(const uint8_t *bytes, size_t n, const char *name, td__array *out) {
    npy_header h;
    size_t start = 0, len = 0, need = 1, have;
    memset(out, 0, sizeof *out);
    if (!name)
        name = "<memory>";
    TD_CHECK(read_preamble(bytes, n, name, &start, &len));
    memset(&h, 0, sizeof h);
    h.start = h.p = (const char *)bytes + start;
    h.end = h.p + len;
    h.name = name;
    h.fortran = h.ndim = -1;
    TD_CHECK(read_dict(&h));
    TD_CHECK(read_descr(name, h.descr, &out->elem, &out->big_endian));
    if (h.fortran && h.ndim > 1)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: fortran_order is True (a column-major array); save it C-ordered: "
                         "np.save(path, np.ascontiguousarray(a))",
                         name);
    for (int d = 0; d < h.ndim; d++)
        if (__builtin_mul_overflow(need, (size_t)h.shape[d], &need))
            return td__error(TD_ERR_CORRUPT, "%s: the shape's size overflows", name);
    out->numel = need;
    if (__builtin_mul_overflow(need, td__elem_size(out->elem), &need))
        return td__error(TD_ERR_CORRUPT, "%s: the shape's size overflows", name);
    have = n - start - len;
    if (have < need)
        return td__error(TD_ERR_CORRUPT,
                         "%s: truncated: the header's shape and dtype '%s' need %zu bytes of data, "
                         "the file has %zu",
                         name, h.descr, need, have);
    if (have > need)
        return td__error(TD_ERR_CORRUPT, "%s: %zu unexpected bytes after the %zu bytes of data",
                         name, have - need, need);
    snprintf(out->source, sizeof out->source, "%s", name);
    out->ndim = h.ndim;
    memcpy(out->shape, h.shape, sizeof out->shape);
    out->data = bytes + start + len;
    return TD_OK;
}

td_status td__npy_open(const char *x_path, const char *y_path, const td_model_info *mi,
                       td_dataset **out) {
    uint8_t *xb = NULL, *yb = NULL;
    size_t xn = 0, yn = 0;
    td__array x, y;
    char source[2048];
    td_status st;
    *out = NULL;
    TD_TRY(td__read_file(x_path, TD_NPY_MAX_BYTES, &xb, &xn));
    TD_TRY(td__read_file(y_path, TD_NPY_MAX_BYTES, &yb, &yn));
    TD_TRY(td__npy_parse(xb, xn, x_path, &x));
    TD_TRY(td__npy_parse(yb, yn, y_path, &y));
    snprintf(source, sizeof source, "%s,%s", x_path, y_path);
    TD_TRY(td__dataset_from_arrays(source, &x, &y, mi, out));
fail:
    free(xb);
    free(yb);
    return st;
}
