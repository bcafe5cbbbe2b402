/* IDX files, gzipped or not, read into memory and checked against their
 * header before anything trusts it. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "train/train-impl.h"

/* A data set file larger than this (after gunzip) is refused rather than
 * allowed to exhaust memory: MNIST's largest is 47 MB. */
#define TD_IDX_MAX_BYTES ((size_t)1 << 31)

void td_idx_deinit(td_idx *idx) {
    if (!idx)
        return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

td_status td__gunzip(const uint8_t *in, size_t n, const char *name, size_t max_out, uint8_t **out,
                     size_t *out_len) {
    z_stream z;
    uint8_t *buf = NULL;
    size_t cap, len = 0;
    int zr;
    td_status st;
    *out = NULL;
    *out_len = 0;
    memset(&z, 0, sizeof z);
    /* The trailer's ISIZE (size mod 2^32) is only a hint for the first buffer. */
    cap = n >= 18 ? (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 |
                        (size_t)in[n - 1] << 24
                  : 0;
    /* Deflate expands at most 1032:1, so a larger hint is a lie. */
    if (cap < 4096 || cap > max_out || cap / 1032 > n)
        cap = 4096;
    if (!(buf = malloc(cap)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory to unpack %zu bytes", name, cap);
    if (inflateInit2(&z, 15 + 16) != Z_OK) {
        free(buf);
        return td__error(TD_ERR_INTERNAL, "%s: zlib inflateInit2 failed", name);
    }
    z.next_in = (Bytef *)in;
    for (;;) {
        size_t in_left = n - (size_t)(z.next_in - (const Bytef *)in);
        if (len == cap) {
            uint8_t *grown;
            if (cap >= max_out) {
                st = td__error(TD_ERR_CORRUPT, "%s: unpacks to more than %zu bytes", name, max_out);
                goto fail;
            }
            cap = cap * 2 > max_out ? max_out : cap * 2;
            if (!(grown = realloc(buf, cap))) {
                st =
                    td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory to unpack %zu bytes", name, cap);
                goto fail;
            }
            buf = grown;
        }
        z.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
        z.next_out = buf + len;
        z.avail_out = cap - len > (1u << 30) ? (1u << 30) : (uInt)(cap - len);
        zr = inflate(&z, Z_NO_FLUSH);
        len = (size_t)(z.next_out - buf);
        if (zr == Z_STREAM_END)
            break;
        if (zr == Z_OK)
            continue;
        if (zr == Z_BUF_ERROR && z.avail_out > 0) {
            st = td__error(TD_ERR_CORRUPT,
                           "%s: gzip stream is truncated (%zu bytes unpacked before the end)", name,
                           len);
            goto fail;
        }
        if (zr == Z_BUF_ERROR)
            continue;
        st = td__error(TD_ERR_CORRUPT, "%s: gzip data is corrupt (%s)", name,
                       z.msg ? z.msg : "inflate failed");
        goto fail;
    }
    if (z.avail_in != 0) {
        st = td__error(TD_ERR_CORRUPT, "%s: %u unexpected bytes after the gzip stream", name,
                       z.avail_in);
        goto fail;
    }
    inflateEnd(&z);
    *out = buf;
    *out_len = len;
    return TD_OK;
fail:
    inflateEnd(&z);
    free(buf);
    return st;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const char *idx_type_name(uint8_t t) {
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "16-bit integer";
    case 0x0C: return "32-bit integer";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return NULL;
    }
}

/* Checks raw (unpacked) IDX bytes and copies the data out. */
static td_status idx_parse_raw(const uint8_t *p, size_t n, const char *name, td_idx *out) {
    size_t header, count = 1;
    int ndim;
    if (n < 4)
        return td__error(TD_ERR_CORRUPT, "%s: %zu bytes, too short for the IDX magic number", name,
                         n);
    if (p[0] != 0 || p[1] != 0)
        return td__error(TD_ERR_CORRUPT,
                         "%s: bad IDX magic number 0x%02x%02x%02x%02x (expected 0x0000tt0n)", name,
                         p[0], p[1], p[2], p[3]);
    if (!idx_type_name(p[2]))
        return td__error(TD_ERR_CORRUPT, "%s: unknown IDX element type 0x%02x in the magic number",
                         name, p[2]);
    if (p[2] != 0x08)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: IDX element type 0x%02x (%s); tandem reads unsigned bytes (0x08)",
                         name, p[2], idx_type_name(p[2]));
    ndim = p[3];
    if (ndim < 1 || ndim > TD_MAX_DIMS)
        return td__error(TD_ERR_CORRUPT, "%s: IDX header says %d dimensions; expected 1 to %d",
                         name, ndim, TD_MAX_DIMS);
    header = 4 + 4 * (size_t)ndim;
    if (n < header)
        return td__error(TD_ERR_CORRUPT,
                         "%s: truncated header: %zu bytes, the %d dimensions need %zu", name, n,
                         ndim, header);
    out->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        uint32_t e = be32(p + 4 + 4 * d);
        if (e == 0)
            return td__error(TD_ERR_CORRUPT, "%s: dimension %d has extent 0", name, d);
        if (e > 0x7fffffffu || count > TD_IDX_MAX_BYTES / e)
            return td__error(TD_ERR_CORRUPT,
                             "%s: dimension %d has extent %u; the data would exceed %zu bytes",
                             name, d, e, TD_IDX_MAX_BYTES);
        count *= e;
        out->dims[d] = e;
    }
    if (n - header < count)
        return td__error(TD_ERR_CORRUPT,
                         "%s: truncated: the header promises %zu bytes of data, the file has %zu",
                         name, count, n - header);
    if (n - header > count)
        return td__error(TD_ERR_CORRUPT, "%s: %zu unexpected bytes after the %zu bytes of data",
                         name, n - header - count, count);
    if (!(out->data = malloc(count)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", name, count);
    memcpy(out->data, p + header, count);
    out->size = count;
    return TD_OK;
}

td_status td_idx_parse(const void *bytes, size_t n, const char *name, td_idx *out) {
    const uint8_t *p = bytes;
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_idx_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!name)
        name = "<memory>";
    if (!p && n)
        return td__error(TD_ERR_INVALID_ARG, "%s: bytes is NULL", name);
    if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
        if ((st = td__gunzip(p, n, name, TD_IDX_MAX_BYTES, &raw, &raw_len)) != TD_OK)
            return st;
        p = raw;
        n = raw_len;
    }
    st = idx_parse_raw(p, n, name, out);
    free(raw);
    if (st != TD_OK)
        td_idx_deinit(out);
    return st;
}

td_status td_idx_read(const char *path, td_idx *out) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path)
        return td__error(TD_ERR_INVALID_ARG, "td_idx_read: path is NULL");
    if ((st = td__read_file(path, TD_IDX_MAX_BYTES, &bytes, &n)) != TD_OK)
        return st;
    st = td_idx_parse(bytes, n, path, out);
    free(bytes);
    return st;
}
