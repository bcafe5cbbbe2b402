/* The safetensors format's writer: tensors and metadata gathered in host
 * memory, then written atomically (a temporary file, fsync, rename, fsync
 * of the folder). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/safetensors-impl.h"

/* Writing ------------------------------------------------------------------ */

typedef struct st_entry {
    char *name;
    td_dtype dtype;
    const char *file_dtype; /* a dtype name other than F32 and F64; NULL: dtype's */
    int ndim;
    int64_t shape[TD_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
} st_entry;

struct td_safetensors_writer {
    st_entry *entries;
    size_t count, cap;
    st_meta *meta;
    size_t nmeta, meta_cap;
};

td_status td_safetensors_writer_create(td_safetensors_writer **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_writer_create: out is NULL");
    *out = td__calloc(sizeof **out, "a safetensors writer");
    return *out ? TD_OK : TD_ERR_OUT_OF_MEMORY;
}

void td_safetensors_writer_destroy(td_safetensors_writer *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->count; i++) {
        free(w->entries[i].name);
        free(w->entries[i].data);
    }
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->entries);
    free(w->meta);
    free(w);
}

static td_status add_entry(td_safetensors_writer *w, const char *name, td_dtype dtype, int ndim,
                           const int64_t *shape, st_entry **out) {
    size_t numel = 1;
    st_entry *e = NULL;
    if (!w || !name || (ndim > 0 && !shape))
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: NULL argument");
    if (!*name || !strcmp(name, "__metadata__"))
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: tensor name \"%s\" is reserved",
                         name);
    if (ndim < 0 || ndim > TD_ST_MAX_DIMS)
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: tensor \"%s\": %d dimensions",
                         name, ndim);
    for (size_t i = 0; i < w->count; i++)
        if (!strcmp(w->entries[i].name, name))
            return td__error(TD_ERR_INVALID_ARG, "safetensors writer: tensor \"%s\" added twice",
                             name);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return td__error(TD_ERR_INVALID_ARG, "safetensors writer: tensor \"%s\": shape[%d] < 0",
                             name, d);
        numel *= (size_t)shape[d];
    }
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_entry *grown = realloc(w->entries, cap * sizeof *grown);
        if (!grown)
            return td__error(TD_ERR_OUT_OF_MEMORY, "safetensors writer: no memory");
        w->entries = grown;
        w->cap = cap;
    }
    e = &w->entries[w->count];
    memset(e, 0, sizeof *e);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        e->shape[d] = shape[d];
    e->nbytes = numel * td_dtype_size(dtype);
    if (!(e->name = td__strdup(name)) || !(e->data = malloc(e->nbytes ? e->nbytes : 1))) {
        free(e->name);
        return td__error(TD_ERR_OUT_OF_MEMORY, "safetensors writer: no memory for \"%s\"", name);
    }
    w->count++;
    *out = e;
    return TD_OK;
}

td_status td_safetensors_writer_add(td_safetensors_writer *w, const char *name, td_dtype dtype,
                                    int ndim, const int64_t *shape, const void *data) {
    st_entry *e = NULL;
    td_status st = add_entry(w, name, dtype, ndim, shape, &e);
    if (st == TD_OK && e->nbytes)
        memcpy(e->data, data, e->nbytes);
    return st;
}

td_status td__safetensors_writer_add_raw(td_safetensors_writer *w, const char *name,
                                         const char *file_dtype, size_t esize, int ndim,
                                         const int64_t *shape, const void *data) {
    st_entry *e = NULL;
    /* sized as f32 first, then re-sized: add_entry checks the name and shape */
    td_status st = add_entry(w, name, TD_F32, ndim, shape, &e);
    void *bytes;
    if (st != TD_OK)
        return st;
    e->file_dtype = file_dtype;
    e->nbytes = e->nbytes / 4 * esize;
    if (!(bytes = realloc(e->data, e->nbytes ? e->nbytes : 1))) {
        w->count--;
        free(e->name);
        free(e->data);
        return td__error(TD_ERR_OUT_OF_MEMORY, "safetensors writer: no memory for \"%s\"", name);
    }
    e->data = bytes;
    if (e->nbytes)
        memcpy(e->data, data, e->nbytes);
    return TD_OK;
}

td_status td_safetensors_writer_add_tensor(td_safetensors_writer *w, const char *name,
                                           const td_tensor *t) {
    int64_t shape[TD_MAX_DIMS];
    st_entry *e = NULL;
    td_status st;
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: tensor \"%s\" is NULL",
                         name ? name : "?");
    for (int d = 0; d < td_tensor_ndim(t); d++)
        shape[d] = td_tensor_dim(t, d);
    if ((st = add_entry(w, name, td_tensor_dtype(t), td_tensor_ndim(t), shape, &e)) != TD_OK)
        return st;
    if ((st = td_tensor_read(t, e->data, e->nbytes)) != TD_OK) {
        w->count--;
        free(e->name);
        free(e->data);
        return td__error_prefix(st, "saving tensor \"%s\": ", name);
    }
    return TD_OK;
}

td_status td_safetensors_writer_set_meta(td_safetensors_writer *w, const char *key,
                                         const char *value) {
    char *v;
    if (!w || !key || !value)
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: NULL metadata");
    if (!strcmp(key, TD_ST_CRC_KEY))
        return td__error(TD_ERR_INVALID_ARG, "safetensors writer: metadata \"%s\" is reserved",
                         key);
    if (!(v = td__strdup(value)))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < w->nmeta; i++)
        if (!strcmp(w->meta[i].key, key)) {
            free(w->meta[i].value);
            w->meta[i].value = v;
            return TD_OK;
        }
    if (w->nmeta == w->meta_cap) {
        size_t cap = w->meta_cap ? 2 * w->meta_cap : 16;
        st_meta *grown = realloc(w->meta, cap * sizeof *grown);
        if (!grown) {
            free(v);
            return td__error(TD_ERR_OUT_OF_MEMORY, "safetensors writer: no memory");
        }
        w->meta = grown;
        w->meta_cap = cap;
    }
    if (!(w->meta[w->nmeta].key = td__strdup(key))) {
        free(v);
        return TD_ERR_OUT_OF_MEMORY;
    }
    w->meta[w->nmeta++].value = v;
    return TD_OK;
}

/* The header JSON, padded with spaces so the data starts 8-byte aligned. */
static td_status build_header(td_safetensors_writer *w, const char *crc, char **out, size_t *len) {
    json_t *root = json_object(), *meta = json_object();
    size_t off = 0, n, padded;
    char *text = NULL, *buf;
    td_status st = TD_ERR_OUT_OF_MEMORY;
    *out = NULL;
    if (!root || !meta)
        goto fail;
    for (size_t i = 0; i < w->nmeta; i++)
        if (json_object_set_new(meta, w->meta[i].key, json_string(w->meta[i].value)) != 0) {
            st =
                td__error(TD_ERR_INVALID_ARG,
                          "safetensors writer: metadata \"%s\" is not valid UTF-8", w->meta[i].key);
            goto fail;
        }
    json_object_set_new(meta, TD_ST_CRC_KEY, json_string(crc));
    json_object_set(root, "__metadata__", meta);
    for (size_t i = 0; i < w->count; i++) {
        const st_entry *e = &w->entries[i];
        json_t *t = json_object(), *shape = json_array();
        for (int d = 0; d < e->ndim; d++)
            json_array_append_new(shape, json_integer(e->shape[d]));
        json_object_set_new(t, "dtype",
                            json_string(e->file_dtype        ? e->file_dtype
                                        : e->dtype == TD_F64 ? "F64"
                                                             : "F32"));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + e->nbytes)));
        if (json_object_set_new(root, e->name, t) != 0) {
            st = td__error(TD_ERR_INVALID_ARG,
                           "safetensors writer: tensor name \"%s\" is not valid UTF-8", e->name);
            goto fail;
        }
        off += e->nbytes;
    }
    if (!(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)))
        goto fail;
    n = strlen(text);
    padded = (n + 7) / 8 * 8;
    if (!(buf = malloc(padded)))
        goto fail;
    memcpy(buf, text, n);
    memset(buf + n, ' ', padded - n);
    *out = buf;
    *len = padded;
    st = TD_OK;
fail:
    if (st == TD_ERR_OUT_OF_MEMORY)
        td__error(st, "safetensors writer: no memory for the header");
    free(text);
    json_decref(meta);
    json_decref(root);
    return st;
}

static td_status write_all(int fd, const void *p, size_t n, const char *path) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return td__error(TD_ERR_IO, "%s: write failed: %s", path,
                             w < 0 ? strerror(errno) : "no progress");
        b += w;
        n -= (size_t)w;
    }
    return TD_OK;
}

/* The process's umask, read without changing it (umask() would, for a
 * moment, for every thread); 022 where /proc does not say. */
static mode_t current_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[128];
    unsigned mask = 022;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1)
            break;
    if (f)
        fclose(f);
    return (mode_t)mask;
}

td_status td_safetensors_writer_save(td_safetensors_writer *w, const char *path) {
    char tmp[PATH_MAX], dir[PATH_MAX], crc[16];
    char *header = NULL;
    size_t hlen = 0;
    uint8_t lenbytes[8];
    int fd = -1, dfd, created = 0;
    td_status st;
    if (!w || !path)
        return td__error(TD_ERR_INVALID_ARG, "td_safetensors_writer_save: NULL argument");
    if (snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof tmp)
        return td__error(TD_ERR_INVALID_ARG, "%s: path too long", path);
    {
        /* The checksum the reader recomputes: data, then sorted metadata. */
        uint32_t c = 0;
        st_meta *sorted = malloc((w->nmeta + 1) * sizeof *sorted);
        if (!sorted)
            return td__error(TD_ERR_OUT_OF_MEMORY, "safetensors writer: no memory");
        for (size_t i = 0; i < w->count; i++)
            c = td__st_crc_data(c, w->entries[i].data, w->entries[i].nbytes);
        if (w->nmeta)
            memcpy(sorted, w->meta, w->nmeta * sizeof *sorted);
        c = td__st_crc_meta(c, sorted, w->nmeta);
        free(sorted);
        snprintf(crc, sizeof crc, "%08x", c);
    }
    if ((st = build_header(w, crc, &header, &hlen)) != TD_OK)
        return st;
    for (int i = 0; i < 8; i++)
        lenbytes[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if ((fd = mkstemp(tmp)) < 0) {
        st = td__error(TD_ERR_IO, "%s: cannot create a temporary file beside it: %s", path,
                       strerror(errno));
        goto fail;
    }
    created = 1;
    TD_TRY(write_all(fd, lenbytes, 8, tmp));
    TD_TRY(write_all(fd, header, hlen, tmp));
    for (size_t i = 0; i < w->count; i++)
        TD_TRY(write_all(fd, w->entries[i].data, w->entries[i].nbytes, tmp));
    /* mkstemp makes 0600; a checkpoint is an ordinary file, with the mode
     * the user's umask gives new files. */
    if (fchmod(fd, 0666 & ~current_umask()) != 0 || fsync(fd) != 0) {
        st = td__error(TD_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = td__error(TD_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = td__error(TD_ERR_IO, "%s: cannot rename the temporary file over it: %s", path,
                       strerror(errno));
        goto fail;
    }
    /* The rename itself is durable only once the folder is synced. */
    snprintf(dir, sizeof dir, "%s", path);
    if ((dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY)) >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(header);
    return TD_OK;
fail:
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(tmp);
    free(header);
    return st;
}
