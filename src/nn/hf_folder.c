/* A save_pretrained folder (hf-impl.h): config.json's fields, and the
 * weights from one file or from the shards of model.safetensors.index.json,
 * converted to f32 as they are taken. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "core/text.h"
#include "nn/hf-impl.h"
#include "nn/safetensors.h"

/* A config.json or shard index larger than this is no model's. */
#define HF_JSON_MAX_BYTES ((size_t)64 << 20)

/* config.json ---------------------------------------------------------------------- */

td_status td__hf_cfg_error(const td__hf_folder *f, const char *key, const char *what) {
    return td__error(TD_ERR_PARSE, "%s: \"%s\": %s", f->cfg_path, key, what);
}

td_status td__hf_int(const td__hf_folder *f, const char *key, int required, int64_t def,
                     int64_t *out) {
    json_t *v = json_object_get(f->cfg, key);
    if (!v || json_is_null(v)) {
        if (required)
            return td__hf_cfg_error(f, key, "missing (a required integer)");
        *out = def;
        return TD_OK;
    }
    if (!json_is_integer(v))
        return td__hf_cfg_error(f, key, "expected an integer");
    *out = json_integer_value(v);
    return TD_OK;
}

td_status td__hf_bool(const td__hf_folder *f, const char *key, int def, int *out) {
    json_t *v = json_object_get(f->cfg, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_boolean(v))
        return td__hf_cfg_error(f, key, "expected true or false");
    *out = json_is_true(v);
    return TD_OK;
}

td_status td__hf_number(const td__hf_folder *f, const char *key, double def, double *out) {
    json_t *v = json_object_get(f->cfg, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_number(v))
        return td__hf_cfg_error(f, key, "expected a number");
    *out = json_number_value(v);
    return TD_OK;
}

td_status td__hf_open_config(const char *dir, td__hf_folder *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->cfg_path, sizeof f->cfg_path, "%s/config.json", dir);
    TD_CHECK(td__read_json_file(f->cfg_path, HF_JSON_MAX_BYTES, 0, &f->cfg));
    if (!json_is_object(f->cfg))
        return td__error(TD_ERR_PARSE, "%s: expected a JSON object", f->cfg_path);
    return TD_OK;
}

/* The weights ------------------------------------------------------------------------ */

/* Opens one more file of weights at path. */
static td_status add_file(td__hf_folder *f, const char *path) {
    td_safetensors **files = realloc(f->files, (f->nfiles + 1) * sizeof *files);
    char **paths = files ? realloc(f->paths, (f->nfiles + 1) * sizeof *paths) : NULL;
    char **used = paths ? realloc(f->used, (f->nfiles + 1) * sizeof *used) : NULL;
    if (files)
        f->files = files;
    if (paths)
        f->paths = paths;
    if (!used)
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    f->used = used;
    f->files[f->nfiles] = NULL;
    f->used[f->nfiles] = NULL;
    if (!(f->paths[f->nfiles] = td__strdup(path)))
        return TD_ERR_OUT_OF_MEMORY;
    f->nfiles++;
    TD_CHECK(td__safetensors_load_any(path, &f->files[f->nfiles - 1]));
    if (!(f->used[f->nfiles - 1] =
              td__calloc(td_safetensors_count(f->files[f->nfiles - 1]) + 1, "a tensor list")))
        return TD_ERR_OUT_OF_MEMORY;
    return TD_OK;
}

static int file_index(const td__hf_folder *f, const char *path) {
    for (size_t i = 0; i < f->nfiles; i++)
        if (!strcmp(f->paths[i], path))
            return (int)i;
    return -1;
}

/* model.safetensors.index.json: every shard its weight_map names, once. */
static td_status open_shards(const char *dir, const char *index, td__hf_folder *f) {
    json_t *root = NULL, *map, *v;
    const char *name;
    td_status st = TD_OK;
    TD_CHECK(td__read_json_file(index, HF_JSON_MAX_BYTES, 0, &root));
    map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        json_decref(root);
        return td__error(TD_ERR_PARSE,
                         "%s: \"weight_map\": expected an object from tensor to shard", index);
    }
    json_object_foreach(map, name, v) {
        const char *shard = json_is_string(v) ? json_string_value(v) : NULL;
        char path[4096 + 256];
        FILE *probe;
        int i;
        if (!shard || !*shard || strchr(shard, '/') || !strcmp(shard, "..")) {
            st = td__error(TD_ERR_PARSE,
                           "%s: \"weight_map\": \"%.128s\": expected a file name in "
                           "the folder",
                           index, name);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        if ((i = file_index(f, path)) < 0) {
            if (!(probe = fopen(path, "rb"))) {
                st = td__error(TD_ERR_IO,
                               "%s: \"weight_map\": \"%.128s\" is in shard \"%.128s\": "
                               "cannot open %s: %s",
                               index, name, shard, path, strerror(errno));
                break;
            }
            fclose(probe);
            if ((st = add_file(f, path)) != TD_OK)
                break;
            i = (int)f->nfiles - 1;
        }
        if (!td_safetensors_find(f->files[i], name)) {
            st = td__error(TD_ERR_CORRUPT, "%s: \"weight_map\": \"%.128s\" is not in shard %s",
                           index, name, path);
            break;
        }
    }
    json_decref(root);
    return st;
}

td_status td__hf_open_weights(const char *dir, td__hf_folder *f) {
    char one[4096 + 32], index[4096 + 32];
    FILE *probe;
    snprintf(one, sizeof one, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    if ((probe = fopen(one, "rb")) != NULL) {
        fclose(probe);
        snprintf(f->weights, sizeof f->weights, "%s", one);
        return add_file(f, one);
    }
    if ((probe = fopen(index, "rb")) != NULL) {
        fclose(probe);
        snprintf(f->weights, sizeof f->weights, "%s", index);
        return open_shards(dir, index, f);
    }
    return td__error(TD_ERR_IO, "%s: cannot open: %s (nor is there %s)", one, strerror(errno),
                     index);
}

void td__hf_close(td__hf_folder *f) {
    for (size_t i = 0; i < f->nfiles; i++) {
        td_safetensors_destroy(f->files[i]);
        free(f->paths[i]);
        free(f->used[i]);
    }
    free(f->files);
    free(f->paths);
    free(f->used);
    json_decref(f->cfg);
    memset(f, 0, sizeof *f);
}

/* Finding and converting ------------------------------------------------------------- */

static const td_st_tensor *find_in(const td__hf_folder *f, const char *name, size_t *file) {
    for (size_t i = 0; i < f->nfiles; i++) {
        const td_st_tensor *t = td_safetensors_find(f->files[i], name);
        if (t) {
            *file = i;
            return t;
        }
    }
    return NULL;
}

const td_st_tensor *td__hf_find(const td__hf_folder *f, const char *name, const char **path) {
    size_t i = 0;
    const td_st_tensor *t = find_in(f, name, &i);
    if (t && path)
        *path = f->paths[i];
    return t;
}

static void mark(td__hf_folder *f, size_t file, const td_st_tensor *t) {
    f->used[file][t - td_safetensors_tensor(f->files[file], 0)] = 1;
}

void td__hf_ignore(td__hf_folder *f, const char *name) {
    size_t i = 0;
    const td_st_tensor *t = find_in(f, name, &i);
    if (t)
        mark(f, i, t);
}

/* IEEE half to float. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    float x;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp != 0)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0)
        bits = sign;
    else {
        /* subnormal: man * 2^-24 */
        x = (float)man * 5.9604644775390625e-8f;
        return sign ? -x : x;
    }
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* Element i of a tensor's bytes p (possibly unaligned) as a float, one
 * function per dtype of the file. */
typedef float (*element_fn)(const unsigned char *p, size_t i);

static float f32_at(const unsigned char *p, size_t i) {
    float x;
    memcpy(&x, p + 4 * i, 4);
    return x;
}

static float f64_at(const unsigned char *p, size_t i) {
    double d;
    memcpy(&d, p + 8 * i, 8);
    return (float)d;
}

static float f16_at(const unsigned char *p, size_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return half_to_float(h);
}

/* bfloat16: the top half of a float */
static float bf16_at(const unsigned char *p, size_t i) {
    uint16_t h;
    uint32_t bits;
    float x;
    memcpy(&h, p + 2 * i, 2);
    bits = (uint32_t)h << 16;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static element_fn element_of(const char *dtype) {
    return !strcmp(dtype, "F32")    ? f32_at
           : !strcmp(dtype, "F64")  ? f64_at
           : !strcmp(dtype, "F16")  ? f16_at
           : !strcmp(dtype, "BF16") ? bf16_at
                                    : NULL;
}

td_status td__hf_take(td__hf_folder *f, const char *name, int ndim, const int64_t *want,
                      int transposed, const char *sizes, float *dst) {
    char want_s[64], got_s[64];
    int64_t stored[2] = {want[0], ndim == 2 ? want[1] : 0};
    size_t file = 0;
    const td_st_tensor *t = find_in(f, name, &file);
    const char *dtype;
    element_fn at;
    if (!t)
        return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" is missing (%s: %s)", f->weights, name,
                         f->cfg_path, sizes);
    if (transposed)
        stored[0] = want[1], stored[1] = want[0];
    if (t->ndim != ndim || t->shape[0] != stored[0] || (ndim == 2 && t->shape[1] != stored[1]))
        return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" is %s; %s (%s) says %s", f->paths[file],
                         name, td__shape_text(t->shape, t->ndim, got_s), f->cfg_path, sizes,
                         td__shape_text(stored, ndim, want_s));
    dtype = td__safetensors_dtype(f->files[file], t);
    if (!(at = element_of(dtype)))
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: tensor \"%s\": dtype %s; weights are F32, F64, F16 or BF16",
                         f->paths[file], name, dtype);
    if (transposed) {
        /* dst (out, in) = t^T, t (in, out) */
        size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        for (size_t i = 0; i < rows; i++)
            for (size_t j = 0; j < cols; j++)
                dst[j * rows + i] = at(t->data, i * cols + j);
    } else {
        for (size_t i = 0; i < t->numel; i++)
            dst[i] = at(t->data, i);
    }
    mark(f, file, t);
    return TD_OK;
}

td_status td__hf_check_all_used(const td__hf_folder *f, int (*ignorable)(const char *name),
                                const char *what) {
    for (size_t k = 0; k < f->nfiles; k++)
        for (size_t i = 0; i < td_safetensors_count(f->files[k]); i++) {
            const char *name = td_safetensors_tensor(f->files[k], i)->name;
            if (!f->used[k][i] && !(ignorable && ignorable(name)))
                return td__error(TD_ERR_SHAPE,
                                 "%s: tensor \"%s\" is not part of the %s that %s describes",
                                 f->paths[k], name, what, f->cfg_path);
        }
    return TD_OK;
}
