/* The safetensors format: the verifying reader (the writer is
 * safetensors_write.c). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/safetensors-impl.h"

/* Python's safetensors refuses headers over 100 MB; so does this reader. */
#define TD_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Files larger than this are refused before reading. */
#define TD_ST_MAX_FILE ((size_t)1 << 36)

struct td_safetensors {
    char name[1024];
    uint8_t *bytes; /* the whole file: malloc'ed, or mapped */
    size_t n;
    int mapped;            /* bytes is a private mapping of the file (load_file) */
    td_st_tensor *tensors; /* sorted by data offset */
    size_t count;
    st_meta *meta;
    size_t nmeta;
    int has_checksum;
    /* Loaded by td__safetensors_load_any(): tensors of every dtype kept,
     * their dtype names in file_dtype (parallel to tensors). */
    int any_dtype;
    const char **file_dtype;
};

/* Reading ------------------------------------------------------------------ */

void td_safetensors_destroy(td_safetensors *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->count; i++)
        free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->nmeta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->tensors);
    free(st->file_dtype);
    free(st->meta);
    if (st->mapped)
        munmap(st->bytes, st->n);
    else
        free(st->bytes);
    free(st);
}

static int dtype_from_name(const char *s, td_dtype *dt) {
    if (!strcmp(s, "F32"))
        *dt = TD_F32;
    else if (!strcmp(s, "F64"))
        *dt = TD_F64;
    else
        return 0;
    return 1;
}

/* The format's dtype names and element sizes: the name as a string that
 * lives as long as the program, and its size; NULL for an unknown name. */
static const char *known_dtype_size(const char *s, size_t *size) {
    static const struct {
        const char *name;
        size_t size;
    } dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                  {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                  {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(s, dtypes[i].name)) {
            if (size)
                *size = dtypes[i].size;
            return dtypes[i].name;
        }
    return NULL;
}

static int known_dtype(const char *s) {
    return known_dtype_size(s, NULL) != NULL;
}

/* A JSON integer in [0, max], else -1. */
static int64_t json_index(const json_t *v, int64_t max) {
    json_int_t x;
    if (!json_is_integer(v))
        return -1;
    x = json_integer_value(v);
    return x < 0 || x > max ? -1 : (int64_t)x;
}

static int cmp_meta(const void *a, const void *b) {
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

uint32_t td__st_crc_data(uint32_t crc, const void *data, size_t n) {
    const Bytef *p = data;
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

uint32_t td__st_crc_meta(uint32_t crc, st_meta *meta, size_t nmeta) {
    qsort(meta, nmeta, sizeof *meta, cmp_meta);
    for (size_t i = 0; i < nmeta; i++) {
        if (!strcmp(meta[i].key, TD_ST_CRC_KEY))
            continue;
        crc = (uint32_t)crc32(crc, (const Bytef *)meta[i].key, (uInt)strlen(meta[i].key) + 1);
        crc = (uint32_t)crc32(crc, (const Bytef *)meta[i].value, (uInt)strlen(meta[i].value) + 1);
    }
    return crc;
}

static int cmp_offset(const void *a, const void *b) {
    const td_st_tensor *x = a, *y = b;
    const uint8_t *px = x->data, *py = y->data;
    if (px != py)
        return px < py ? -1 : 1;
    /* Empty tensors share an offset with their neighbour; names break ties. */
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static td_status parse_metadata(td_safetensors *st, json_t *m) {
    const char *key;
    json_t *v;
    if (!json_is_object(m))
        return td__error(TD_ERR_CORRUPT, "%s: \"__metadata__\" is not an object", st->name);
    if (!(st->meta = td__calloc((json_object_size(m) + 1) * sizeof *st->meta, "metadata")))
        return TD_ERR_OUT_OF_MEMORY;
    json_object_foreach(m, key, v) {
        if (!json_is_string(v))
            return td__error(TD_ERR_CORRUPT, "%s: metadata \"%s\" is not a string", st->name, key);
        st->meta[st->nmeta].key = td__strdup(key);
        st->meta[st->nmeta].value = td__strdup(json_string_value(v));
        st->nmeta++;
        if (!st->meta[st->nmeta - 1].key || !st->meta[st->nmeta - 1].value)
            return TD_ERR_OUT_OF_MEMORY;
    }
    return TD_OK;
}

static td_status parse_tensor(td_safetensors *st, const char *key, json_t *v, const uint8_t *data,
                              size_t data_len, td_st_tensor *t) {
    json_t *dtype, *shape, *offsets;
    int64_t begin, end;
    size_t numel = 1, nbytes = 0, esize;
    int zero = 0, overflow = 0;
    if (!json_is_object(v))
        return td__error(TD_ERR_CORRUPT, "%s: tensor \"%s\": entry is not an object", st->name,
                         key);
    dtype = json_object_get(v, "dtype");
    shape = json_object_get(v, "shape");
    offsets = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets))
        return td__error(TD_ERR_CORRUPT,
                         "%s: tensor \"%s\": needs \"dtype\" (string), \"shape\" and "
                         "\"data_offsets\" (arrays)",
                         st->name, key);
    if (dtype_from_name(json_string_value(dtype), &t->dtype)) {
        esize = td_dtype_size(t->dtype);
    } else if (st->any_dtype && known_dtype_size(json_string_value(dtype), &esize)) {
        t->dtype = TD_F32; /* not its dtype: td__safetensors_dtype() names that */
    } else {
        /* Name what is read: a data file (any_dtype) takes integers and BOOL
         * too, lest a string tensor's message suggest only floats are. */
        return td__error(
            known_dtype(json_string_value(dtype)) ? TD_ERR_UNSUPPORTED : TD_ERR_CORRUPT,
            "%s: tensor \"%s\": dtype \"%.32s\"; %s", st->name, key, json_string_value(dtype),
            st->any_dtype ? "not one the safetensors format names (tandem reads F32, F64, BOOL "
                            "and integer (U8 to I64) tensors)"
                          : "tandem reads F32 and F64");
    }
    if (json_array_size(shape) > TD_ST_MAX_DIMS)
        return td__error(TD_ERR_UNSUPPORTED, "%s: tensor \"%s\": %zu dimensions; at most %d",
                         st->name, key, json_array_size(shape), TD_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        int64_t e = json_index(json_array_get(shape, (size_t)d), INT64_MAX);
        if (e < 0)
            return td__error(TD_ERR_CORRUPT,
                             "%s: tensor \"%s\": shape[%d] is not a non-negative integer", st->name,
                             key, d);
        t->shape[d] = e;
        if (e == 0)
            zero = 1;
        else if (__builtin_mul_overflow(numel, (size_t)e, &numel))
            overflow = 1;
    }
    if (zero)
        numel = 0;
    else if (__builtin_mul_overflow(numel, esize, &nbytes))
        overflow = 1;
    if (json_array_size(offsets) != 2 ||
        (begin = json_index(json_array_get(offsets, 0), INT64_MAX)) < 0 ||
        (end = json_index(json_array_get(offsets, 1), INT64_MAX)) < 0 || end < begin)
        return td__error(TD_ERR_CORRUPT,
                         "%s: tensor \"%s\": data_offsets must be [begin, end] with "
                         "0 <= begin <= end",
                         st->name, key);
    if ((uint64_t)end > data_len)
        return td__error(TD_ERR_CORRUPT,
                         "%s: tensor \"%s\": data ends at byte %lld, past the %zu bytes of data "
                         "in the file (truncated?)",
                         st->name, key, (long long)end, data_len);
    if (overflow || numel * esize != (size_t)(end - begin))
        return td__error(TD_ERR_CORRUPT,
                         "%s: tensor \"%s\": shape and dtype need %s bytes, data_offsets give %lld",
                         st->name, key, overflow ? "too many" : "a different number of",
                         (long long)(end - begin));
    t->numel = numel;
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    if (!(t->name = td__strdup(key)))
        return TD_ERR_OUT_OF_MEMORY;
    return TD_OK;
}

/* The file's own dtype name of each tensor, in the tensors' (sorted) order;
 * the header already passed parse_tensor(), so every name is known. */
static td_status name_dtypes(td_safetensors *st, json_t *root) {
    if (!(st->file_dtype = td__calloc((st->count + 1) * sizeof *st->file_dtype, "dtype names")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < st->count; i++) {
        json_t *dt = json_object_get(json_object_get(root, st->tensors[i].name), "dtype");
        st->file_dtype[i] = known_dtype_size(json_string_value(dt), NULL);
    }
    return TD_OK;
}

/* The checksum of n bytes of fd from offset on, read in chunks. */
static td_status crc_file(int fd, size_t offset, size_t n, const char *name, uint32_t *crc) {
    enum { CHUNK = 1 << 22 };
    uint8_t *buf = malloc(CHUNK);
    td_status st = TD_OK;
    if (!buf)
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory to check its checksum", name);
    while (n > 0 && st == TD_OK) {
        ssize_t got = pread(fd, buf, n < CHUNK ? n : CHUNK, (off_t)offset);
        if (got <= 0)
            st = td__error(TD_ERR_IO, "%s: read failed at byte %zu", name, offset);
        else {
            *crc = td__st_crc_data(*crc, buf, (size_t)got);
            offset += (size_t)got;
            n -= (size_t)got;
        }
    }
    free(buf);
    return st;
}

/* td_safetensors_parse() of bytes (n of them, malloc'ed; or mapped from the
 * file open as fd, -1 otherwise), which the file object takes over, freed
 * with it or on failure: a file read from disk is then held once, not
 * twice. A mapped file's checksum reads fd, so that the mapping's pages are
 * touched only by those who read tensors. */
static td_status parse_owned(uint8_t *bytes, size_t n, int fd, const char *name, int any_dtype,
                             td_safetensors **out) {
    int mapped = fd >= 0;
    td_safetensors *st = NULL;
    json_t *root = NULL, *v;
    json_error_t jerr;
    const char *key;
    const uint8_t *data;
    uint64_t hlen = 0;
    size_t data_len, pos;
    td_status st_;
    *out = NULL;
    if (!(st = td__calloc(sizeof *st, "a safetensors file"))) {
        if (mapped)
            munmap(bytes, n);
        else
            free(bytes);
        return TD_ERR_OUT_OF_MEMORY;
    }
    snprintf(st->name, sizeof st->name, "%s", name ? name : "<memory>");
    st->any_dtype = any_dtype;
    st->bytes = bytes;
    st->n = n;
    st->mapped = mapped;
    if (n < 8) {
        st_ = td__error(TD_ERR_CORRUPT, "%s: %zu bytes, shorter than the 8-byte header length",
                        st->name, n);
        goto fail;
    }
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | st->bytes[i];
    if (hlen > n - 8 || hlen > TD_ST_MAX_HEADER || hlen < 2) {
        st_ =
            td__error(TD_ERR_CORRUPT,
                      "%s: header length %llu does not fit the file (%zu bytes) or the limit "
                      "(%llu)",
                      st->name, (unsigned long long)hlen, n, (unsigned long long)TD_ST_MAX_HEADER);
        goto fail;
    }
    if (!(root = json_loadb((const char *)st->bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                            &jerr))) {
        st_ = td__error(TD_ERR_CORRUPT, "%s: header JSON, column %d: %s", st->name, jerr.column,
                        jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        st_ = td__error(TD_ERR_CORRUPT, "%s: header is not a JSON object", st->name);
        goto fail;
    }
    data = st->bytes + 8 + hlen;
    data_len = n - 8 - (size_t)hlen;
    if (!(st->tensors =
              td__calloc((json_object_size(root) + 1) * sizeof *st->tensors, "tensor entries"))) {
        st_ = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if ((st_ = parse_metadata(st, v)) != TD_OK)
                goto fail;
            continue;
        }
        if ((st_ = parse_tensor(st, key, v, data, data_len, &st->tensors[st->count])) != TD_OK) {
            free((char *)st->tensors[st->count].name);
            st->tensors[st->count].name = NULL;
            goto fail;
        }
        st->count++;
    }
    /* The tensors must tile the data: no gaps, no overlaps, nothing after. */
    qsort(st->tensors, st->count, sizeof *st->tensors, cmp_offset);
    pos = 0;
    for (size_t i = 0; i < st->count; i++) {
        size_t begin = (size_t)((const uint8_t *)st->tensors[i].data - data);
        if (begin != pos) {
            st_ = td__error(TD_ERR_CORRUPT,
                            "%s: tensor \"%s\": data begins at %zu, but the one before ends at %zu "
                            "(offsets must cover the data without gaps or overlaps)",
                            st->name, st->tensors[i].name, begin, pos);
            goto fail;
        }
        pos += st->tensors[i].nbytes;
    }
    if (pos != data_len) {
        st_ = td__error(TD_ERR_CORRUPT,
                        "%s: the tensors cover %zu bytes of data, the file holds %zu (truncated "
                        "or padded)",
                        st->name, pos, data_len);
        goto fail;
    }
    if (any_dtype && (st_ = name_dtypes(st, root)) != TD_OK)
        goto fail;
    {
        const char *want = td_safetensors_meta(st, TD_ST_CRC_KEY);
        if (want) {
            char got[16];
            uint32_t crc = 0;
            st_ = TD_OK;
            if (mapped)
                st_ = crc_file(fd, (size_t)(data - st->bytes), data_len, st->name, &crc);
            else
                crc = td__st_crc_data(0, data, data_len);
            if (st_ != TD_OK)
                goto fail;
            snprintf(got, sizeof got, "%08x", td__st_crc_meta(crc, st->meta, st->nmeta));
            if (strcmp(got, want) != 0) {
                st_ = td__error(TD_ERR_CORRUPT,
                                "%s: checksum mismatch (stored %.16s, computed %s): the tensors "
                                "or metadata changed after writing",
                                st->name, want, got);
                goto fail;
            }
            st->has_checksum = 1;
        }
    }
    json_decref(root);
    *out = st;
    return TD_OK;
fail:
    json_decref(root);
    td_safetensors_destroy(st);
    return st_;
}

td_status td_safetensors_parse(const void *bytes, size_t n, const char *name,
                               td_safetensors **out) {
    uint8_t *copy;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_parse: out is NULL");
    *out = NULL;
    if (!bytes && n)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_parse: bytes is NULL");
    if (!(copy = malloc(n ? n : 1)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes",
                         name ? name : "<memory>", n);
    if (n)
        memcpy(copy, bytes, n);
    return parse_owned(copy, n, -1, name, 0, out);
}

/* td_safetensors_load(), and td__safetensors_load_any() with any_dtype. The
 * file is mapped, not read into memory: its pages come from the page cache
 * as they are read (the checksum reads them all once), and never count
 * against memory as a copy would. Checkpoints are replaced by rename, so a
 * mapped file does not change under its reader. */
static td_status load_file(const char *path, int any_dtype, td_safetensors **out) {
    struct stat sb;
    void *map;
    td_status st;
    int fd;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_load: out is NULL");
    *out = NULL;
    if (!path)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_load: path is NULL");
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return td__error(TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return td__error(TD_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)sb.st_size > TD_ST_MAX_FILE) {
        close(fd);
        return td__error(TD_ERR_IO, "%s: %lld bytes: too large", path, (long long)sb.st_size);
    }
    if (sb.st_size < 8) { /* too short to map, or to be a file: parse says why */
        uint8_t *few = malloc(8);
        ssize_t got = few ? read(fd, few, (size_t)sb.st_size) : -1;
        close(fd);
        if (got < 0) {
            free(few);
            return td__error(TD_ERR_IO, "%s: read failed", path);
        }
        return parse_owned(few, (size_t)got, -1, path, any_dtype, out);
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return td__error(TD_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    }
    st = parse_owned(map, (size_t)sb.st_size, fd, path, any_dtype, out);
    close(fd);
    return st;
}

td_status td_safetensors_load(const char *path, td_safetensors **out) {
    return load_file(path, 0, out);
}

td_status td__safetensors_load_any(const char *path, td_safetensors **out) {
    return load_file(path, 1, out);
}

const char *td__safetensors_dtype(const td_safetensors *st, const td_st_tensor *t) {
    if (!st || !t || t < st->tensors || t >= st->tensors + st->count)
        return NULL;
    if (st->file_dtype)
        return st->file_dtype[t - st->tensors];
    return t->dtype == TD_F64 ? "F64" : "F32";
}

const char *td_safetensors_name(const td_safetensors *st) {
    return st ? st->name : "";
}

size_t td_safetensors_count(const td_safetensors *st) {
    return st ? st->count : 0;
}

const td_st_tensor *td_safetensors_tensor(const td_safetensors *st, size_t i) {
    return st && i < st->count ? &st->tensors[i] : NULL;
}

const td_st_tensor *td_safetensors_find(const td_safetensors *st, const char *name) {
    if (!st || !name)
        return NULL;
    for (size_t i = 0; i < st->count; i++)
        if (!strcmp(st->tensors[i].name, name))
            return &st->tensors[i];
    return NULL;
}

const char *td_safetensors_meta(const td_safetensors *st, const char *key) {
    if (!st || !key)
        return NULL;
    for (size_t i = 0; i < st->nmeta; i++)
        if (!strcmp(st->meta[i].key, key))
            return st->meta[i].value;
    return NULL;
}

int td_safetensors_has_checksum(const td_safetensors *st) {
    return st ? st->has_checksum : 0;
}

td_status td_safetensors_read_tensor(const td_safetensors *st, const char *name, td_tensor *t) {
    const td_st_tensor *e = td_safetensors_find(st, name);
    void *tmp;
    td_status s;
    int same;
    if (!st || !t)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_read_tensor: file or tensor is NULL");
    if (!e)
        return td__error(TD_ERR_CORRUPT, "%s: tensor \"%s\" is missing", st->name, name);
    if (e->dtype != td_tensor_dtype(t))
        return td__error(TD_ERR_DTYPE, "%s: tensor \"%s\" is %s; expected %s", st->name, name,
                         td_dtype_name(e->dtype), td_dtype_name(td_tensor_dtype(t)));
    same = e->ndim == td_tensor_ndim(t);
    for (int d = 0; same && d < e->ndim; d++)
        same = e->shape[d] == td_tensor_dim(t, d);
    if (!same) {
        char a[96] = "", b[96] = "";
        size_t la = 0, lb = 0;
        for (int d = 0; d < e->ndim && la < sizeof a - 24; d++)
            la += (size_t)snprintf(a + la, sizeof a - la, "%s%lld", d ? ", " : "",
                                   (long long)e->shape[d]);
        for (int d = 0; d < td_tensor_ndim(t) && lb < sizeof b - 24; d++)
            lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%lld", d ? ", " : "",
                                   (long long)td_tensor_dim(t, d));
        return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" has shape (%s); the model needs (%s)",
                         st->name, name, a, b);
    }
    /* The data may sit at any byte offset; the device copy wants aligned host memory. */
    if (!(tmp = td__aligned_alloc(e->nbytes ? e->nbytes : 64, "a tensor being loaded")))
        return TD_ERR_OUT_OF_MEMORY;
    memcpy(tmp, e->data, e->nbytes);
    s = td_tensor_write(t, tmp, e->nbytes);
    free(tmp);
    if (s != TD_OK)
        return td__error_prefix(s, "%s: tensor \"%s\": ", st->name, name);
    return TD_OK;
}
