/* Arrays from users' files (.npy, safetensors) made into data sets: the
 * elements converted to the floats and int32 labels a batch holds, and
 * every value checked on the way (finite features, labels and tokens in
 * the model's range), so that a bad sample is named here rather than found
 * as a NaN loss steps later. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "nn/safetensors.h"
#include "train/data-impl.h"

static const struct {
    const char *name;
    size_t size;
    int is_float, is_signed;
} elem_types[] = {
    [TD__ELEM_F32] = {"float32", 4, 1, 1}, [TD__ELEM_F64] = {"float64", 8, 1, 1},
    [TD__ELEM_U8] = {"uint8", 1, 0, 0},    [TD__ELEM_I8] = {"int8", 1, 0, 1},
    [TD__ELEM_U16] = {"uint16", 2, 0, 0},  [TD__ELEM_I16] = {"int16", 2, 0, 1},
    [TD__ELEM_U32] = {"uint32", 4, 0, 0},  [TD__ELEM_I32] = {"int32", 4, 0, 1},
    [TD__ELEM_U64] = {"uint64", 8, 0, 0},  [TD__ELEM_I64] = {"int64", 8, 0, 1},
};

size_t td__elem_size(td__elem e) {
    return elem_types[e].size;
}

const char *td__elem_name(td__elem e) {
    return elem_types[e].name;
}

/* Element i's bytes as an unsigned integer, in the file's byte order. */
static uint64_t elem_bits(const td__array *a, size_t i) {
    size_t size = elem_types[a->elem].size;
    const uint8_t *p = a->data + i * size;
    uint64_t v = 0;
    for (size_t k = 0; k < size; k++)
        v |= (uint64_t)p[a->big_endian ? size - 1 - k : k] << (8 * k);
    return v;
}

/* Element i of an integer array as an int64 (a uint64 beyond it: INT64_MAX). */
static int64_t elem_int(const td__array *a, size_t i) {
    uint64_t v = elem_bits(a, i);
    size_t bits = 8 * elem_types[a->elem].size;
    if (!elem_types[a->elem].is_signed)
        return v > INT64_MAX ? INT64_MAX : (int64_t)v;
    if (bits < 64 && (v >> (bits - 1)) & 1)
        v |= ~(uint64_t)0 << bits; /* sign-extend */
    return (int64_t)v;
}

/* Element i as a double (a 64-bit integer beyond 2^53 rounded). */
static double elem_real(const td__array *a, size_t i) {
    uint64_t v = elem_bits(a, i);
    if (a->elem == TD__ELEM_F32) {
        uint32_t w = (uint32_t)v;
        float f;
        memcpy(&f, &w, sizeof f);
        return f;
    }
    if (a->elem == TD__ELEM_F64) {
        double d;
        memcpy(&d, &v, sizeof d);
        return d;
    }
    return elem_types[a->elem].is_signed ? (double)elem_int(a, i) : (double)v;
}

/* Features: x's values as floats, each finite. */
static td_status convert_features(const td__array *x, float *out) {
    size_t per = x->numel / (size_t)x->shape[0];
    for (size_t i = 0; i < x->numel; i++) {
        double v = elem_real(x, i);
        out[i] = (float)v;
        if (isfinite(out[i]))
            continue;
        if (isfinite(v))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: row %zu (0-based), value %zu is %g, beyond float32's range",
                             x->source, i / per, i % per, v);
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: row %zu (0-based), value %zu is %s; tandem refuses non-finite "
                         "features (drop or fill the row)",
                         x->source, i / per, i % per, isnan(v) ? "NaN" : "infinite");
    }
    return TD_OK;
}

/* Labels (or tokens): a's integers in [0, classes), as int32; *max the
 * largest. */
static td_status convert_indices(const td__array *a, int is_token, int64_t classes, int32_t *out,
                                 int64_t *max) {
    const char *one = is_token ? "token" : "label";
    size_t per = a->numel / (size_t)a->shape[0];
    if (elem_types[a->elem].is_float)
        return td__error(TD_ERR_DTYPE,
                         "%s: %ss are %s; they must be integers (save a.astype(np.int64))",
                         a->source, one, elem_types[a->elem].name);
    *max = 0;
    for (size_t i = 0; i < a->numel; i++) {
        int64_t v = elem_int(a, i);
        if (v < 0 || v >= classes) {
            char at[48] = "";
            if (per > 1)
                snprintf(at, sizeof at, ", position %zu", i % per);
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: row %zu (0-based)%s: %s %lld is outside the model's %s "
                             "[0, %lld)",
                             a->source, i / per, at, one, (long long)v,
                             is_token ? "vocabulary" : "classes", (long long)classes);
        }
        out[i] = (int32_t)v;
        if (v > *max)
            *max = v;
    }
    return TD_OK;
}

/* The shapes x and y must have together, whatever the model. */
static td_status check_pair(const td__array *x, const td__array *y) {
    if (x->ndim < 1 || y->ndim < 1)
        return td__error(TD_ERR_SHAPE, "%s: a scalar; it needs a first dimension of samples",
                         x->ndim < 1 ? x->source : y->source);
    if (x->shape[0] != y->shape[0])
        return td__error(TD_ERR_SHAPE, "%s has %lld rows but %s has %lld: they must match",
                         x->source, (long long)x->shape[0], y->source, (long long)y->shape[0]);
    if (x->shape[0] < 1 || x->numel == 0)
        return td__error(TD_ERR_SHAPE, "%s: no samples (shape has a 0)", x->source);
    if (x->ndim - 1 > TD_MAX_DIMS)
        return td__error(TD_ERR_SHAPE, "%s: samples have %d dimensions; tandem takes at most %d",
                         x->source, x->ndim - 1, TD_MAX_DIMS);
    return TD_OK;
}

/* y's shape for the model: (N) or (N, 1) labels, or (N, T) tokens like x. */
static td_status check_labels_shape(const td__array *x, const td__array *y, int tokens) {
    char a[64], b[64];
    int ok = tokens ? y->ndim == 2 && x->ndim == 2 && y->shape[1] == x->shape[1]
                    : y->ndim == 1 || (y->ndim == 2 && y->shape[1] == 1);
    if (ok)
        return TD_OK;
    if (tokens)
        return td__error(TD_ERR_SHAPE,
                         "%s has shape %s and %s %s; a token model takes (N, T) tokens and "
                         "(N, T) next tokens",
                         x->source, td__shape_text(x->shape, x->ndim, a), y->source,
                         td__shape_text(y->shape, y->ndim, b));
    return td__error(TD_ERR_SHAPE, "%s has shape %s; labels are (N,) or (N, 1), one a row",
                     y->source, td__shape_text(y->shape, y->ndim, b));
}

td_status td__dataset_from_arrays(const char *source, const td__array *x, const td__array *y,
                                  const td_model_info *mi, td_dataset **out) {
    int tokens = mi->kind == TD_INPUT_TOKENS;
    td_dataset_info info;
    float *fx = NULL;
    int32_t *tx = NULL, *labels = NULL;
    int64_t max_label, max_token;
    td_status st;
    *out = NULL;
    TD_CHECK(check_pair(x, y));
    TD_CHECK(check_labels_shape(x, y, tokens));
    memset(&info, 0, sizeof info);
    info.kind = mi->kind;
    info.size = x->shape[0];
    info.ndim = x->ndim > 1 ? x->ndim - 1 : 1;
    info.features = (int64_t)(x->numel / (size_t)x->shape[0]);
    for (int d = 0; d < info.ndim; d++)
        info.shape[d] = x->ndim > 1 ? x->shape[d + 1] : 1;
    info.labels_per_sample = (int64_t)(y->numel / (size_t)y->shape[0]);
    if (!(labels = td__calloc(y->numel * sizeof *labels, "a data set's labels")))
        return TD_ERR_OUT_OF_MEMORY;
    TD_TRY(convert_indices(y, tokens, mi->classes, labels, &max_label));
    if (tokens) {
        if (!(tx = td__calloc(x->numel * sizeof *tx, "a data set's tokens"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        TD_TRY(convert_indices(x, 1, mi->classes, tx, &max_token));
        if (max_token > max_label)
            max_label = max_token;
    } else {
        if (!(fx = td__calloc(x->numel * sizeof *fx, "a data set's features"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        TD_TRY(convert_features(x, fx));
    }
    info.num_classes = max_label + 1;
    return td__dataset_adopt(source, &info, fx, tx, labels, out);
fail:
    free(fx);
    free(tx);
    free(labels);
    return st;
}

/* Tensor `name` of st as an array; a missing one names what the file holds. */
static td_status find_array(const td_safetensors *st, const char *path, const char *name,
                            td__array *out) {
    static const struct {
        const char *dtype;
        td__elem elem;
    } dtypes[] = {
        {"F32", TD__ELEM_F32}, {"F64", TD__ELEM_F64}, {"U8", TD__ELEM_U8},   {"BOOL", TD__ELEM_U8},
        {"I8", TD__ELEM_I8},   {"U16", TD__ELEM_U16}, {"I16", TD__ELEM_I16}, {"U32", TD__ELEM_U32},
        {"I32", TD__ELEM_I32}, {"U64", TD__ELEM_U64}, {"I64", TD__ELEM_I64},
    };
    const td_st_tensor *t = td_safetensors_find(st, name);
    const char *dtype;
    memset(out, 0, sizeof *out);
    if (!t) {
        char names[256] = "";
        size_t used = 0;
        for (size_t i = 0; i < td_safetensors_count(st) && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s\"%s\"", i ? ", " : "",
                                     td_safetensors_tensor(st, i)->name);
        return td__error(TD_ERR_SHAPE,
                         "%s: no tensor \"%s\"; a data file holds \"x\" (features or tokens) and "
                         "\"y\" (labels); this one holds %s",
                         path, name, used ? names : "none");
    }
    dtype = td__safetensors_dtype(st, t);
    snprintf(out->source, sizeof out->source, "%s: tensor \"%s\"", path, name);
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(dtype, dtypes[i].dtype)) {
            out->elem = dtypes[i].elem;
            out->ndim = t->ndim;
            memcpy(out->shape, t->shape, sizeof out->shape);
            out->numel = t->numel;
            out->data = t->data;
            return TD_OK;
        }
    return td__error(TD_ERR_DTYPE,
                     "%s: dtype %s; tandem reads F32, F64, BOOL and integer tensors (convert "
                     "to float32, or int64 for labels)",
                     out->source, dtype);
}

td_status td__tensors_open(const char *path, const td_model_info *mi, td_dataset **out) {
    td_safetensors *st = NULL;
    td__array x, y;
    td_status s;
    *out = NULL;
    if ((s = td__safetensors_load_any(path, &st)) != TD_OK)
        return s;
    if ((s = find_array(st, path, "x", &x)) == TD_OK &&
        (s = find_array(st, path, "y", &y)) == TD_OK)
        s = td__dataset_from_arrays(path, &x, &y, mi, out);
    td_safetensors_destroy(st);
    return s;
}
