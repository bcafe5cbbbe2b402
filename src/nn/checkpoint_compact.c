/* Checkpoints whose weight matrices are compact (docs/models.md): bf16 as
 * safetensors "BF16" tensors of the parameter's shape (Python's safetensors
 * and PyTorch read them as they are), q8_0 as "U8" tensors of ggml's
 * 34-byte blocks, shape (rows, cols / 32 * 34): the bytes llama.cpp keeps
 * in a GGUF file. The metadata "tandem.weights" names the format. Reading
 * converts whatever dtype a weight has (F32, F64, BF16, F16, q8_0 blocks)
 * to the model's; any other is refused, naming the file and the tensor. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/quant.h"
#include "nn/checkpoint-impl.h"
#include "nn/nn-impl.h"
#include "nn/safetensors.h"

td_status td__ckpt_weights_meta(const td_safetensors *sf, td_weights *out) {
    const char *v = td_safetensors_meta(sf, "tandem.weights");
    *out = TD_WEIGHTS_F32;
    if (!v || !strcmp(v, "f32"))
        return TD_OK;
    if (!strcmp(v, "bf16") || !strcmp(v, "q8_0")) {
        *out = !strcmp(v, "bf16") ? TD_WEIGHTS_BF16 : TD_WEIGHTS_Q8_0;
        return TD_OK;
    }
    return td__error(TD_ERR_UNSUPPORTED,
                     "%s: metadata \"tandem.weights\" is \"%.32s\"; tandem reads f32, bf16 and "
                     "q8_0 weights",
                     td_safetensors_name(sf), v);
}

static size_t shape_numel(int ndim, const int64_t *shape) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    return n;
}

/* The file's shape is want's, but for q8_0 (last extent in blocks' bytes). */
static int file_shape_is(const td_st_tensor *t, int ndim, const int64_t *want, int q8) {
    if (t->ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++) {
        int64_t w = q8 && i == ndim - 1 ? want[i] / TD_Q8_0_BLOCK * TD_Q8_0_BYTES : want[i];
        if (t->shape[i] != w)
            return 0;
    }
    return 1;
}

static double f32_at(const void *p, size_t i) {
    float f;
    memcpy(&f, (const char *)p + 4 * i, 4);
    return f;
}

static double f64_at(const void *p, size_t i) {
    double d;
    memcpy(&d, (const char *)p + 8 * i, 8);
    return d;
}

static uint16_t u16_at(const void *p, size_t i) {
    const unsigned char *b = (const unsigned char *)p + 2 * i;
    return (uint16_t)(b[0] | b[1] << 8);
}

static td_status q8_0_values(const char *path, const td_st_tensor *t, size_t numel, double *out) {
    size_t nb = numel / TD_Q8_0_BLOCK;
    td_block_q8_0 *b = malloc((nb ? nb : 1) * sizeof *b);
    float *y = malloc((numel ? numel : 1) * sizeof *y);
    if (!b || !y) {
        free(b);
        free(y);
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no host memory to read tensor %s", path,
                         t->name);
    }
    td__q8_0_unpack(t->data, nb, b);
    td__dequantize_q8_0(b, numel, y);
    for (size_t i = 0; i < numel; i++)
        out[i] = y[i];
    free(b);
    free(y);
    return TD_OK;
}

td_status td__ckpt_values(const td_safetensors *sf, const td_st_tensor *t, int ndim,
                          const int64_t *shape, double *out) {
    const char *path = td_safetensors_name(sf), *dt = td__safetensors_dtype(sf, t);
    size_t numel = shape_numel(ndim, shape);
    int64_t cols = ndim ? shape[ndim - 1] : 1;
    int q8 = dt && !strcmp(dt, "U8");
    if (!dt ||
        (strcmp(dt, "F32") && strcmp(dt, "F64") && strcmp(dt, "BF16") && strcmp(dt, "F16") && !q8))
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: tensor %s has dtype %s; tandem reads weights in F32, F64, BF16, "
                         "F16 and q8_0 (U8 blocks)",
                         path, t->name, dt ? dt : "?");
    if (q8 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_SHAPE,
                         "%s: tensor %s is q8_0, but its rows of %lld values are not whole "
                         "blocks of %d",
                         path, t->name, (long long)cols, TD_Q8_0_BLOCK);
    if (!file_shape_is(t, ndim, shape, q8))
        return td__error(TD_ERR_CORRUPT, "%s: tensor %s is not the model's shape%s", path, t->name,
                         q8 ? " in q8_0 blocks" : "");
    if (q8)
        return q8_0_values(path, t, numel, out);
    for (size_t i = 0; i < numel; i++)
        out[i] = !strcmp(dt, "F32")    ? f32_at(t->data, i)
                 : !strcmp(dt, "F64")  ? f64_at(t->data, i)
                 : !strcmp(dt, "BF16") ? td__bf16_to_f32(u16_at(t->data, i))
                                       : td__f16_to_f32(u16_at(t->data, i));
    return TD_OK;
}

td_status td__ckpt_add_compact(td_safetensors_writer *w, const char *name, td_weights fmt,
                               const td_tensor *p) {
    int ndim = td_tensor_ndim(p);
    int64_t shape[TD_MAX_DIMS], cols;
    size_t n = td_tensor_numel(p);
    float *v;
    void *bytes = NULL;
    td_status st;
    for (int i = 0; i < ndim; i++)
        shape[i] = td_tensor_dim(p, i);
    cols = ndim ? shape[ndim - 1] : 1;
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_SHAPE,
                         "tensor %s: rows of %lld values are not whole q8_0 blocks of %d", name,
                         (long long)cols, TD_Q8_0_BLOCK);
    if (!(v = td__calloc((n ? n : 1) * sizeof *v, "a matrix to save")))
        return TD_ERR_OUT_OF_MEMORY;
    TD_TRY(td_tensor_read(p, v, n * sizeof *v));
    if (!(bytes = td__calloc(n * 2 + n / TD_Q8_0_BLOCK * TD_Q8_0_BYTES + 1, "compact weights"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    if (fmt == TD_WEIGHTS_BF16) {
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)bytes)[i] = td__f32_to_bf16(v[i]);
        st = td__safetensors_writer_add_raw(w, name, "BF16", 2, ndim, shape, bytes);
    } else {
        td_block_q8_0 *b = td__calloc(n / TD_Q8_0_BLOCK * sizeof *b + 1, "q8_0 blocks");
        if (!b) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        td__quantize_q8_0(v, n, b);
        td__q8_0_pack(b, n / TD_Q8_0_BLOCK, bytes);
        free(b);
        shape[ndim - 1] = cols / TD_Q8_0_BLOCK * TD_Q8_0_BYTES;
        st = td__safetensors_writer_add_raw(w, name, "U8", 1, ndim, shape, bytes);
    }
fail:
    free(v);
    free(bytes);
    return st;
}

td_status td_checkpoint_read_weights(const char *path, td_weights *out) {
    td_safetensors *sf = NULL;
    td_status st;
    if (!path || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_read_weights: NULL argument");
    *out = TD_WEIGHTS_F32;
    if ((st = td__safetensors_load_any(path, &sf)) == TD_OK)
        st = td__ckpt_weights_meta(sf, out);
    td_safetensors_destroy(sf);
    return st;
}
