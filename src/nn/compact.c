/* Compact weights for generation (bf16, q8_0; docs/models.md).
 *
 * A model's weight matrices (linear, attention's q/k/v and output
 * projections, SwiGLU's, the token embedding's table) can be rounded to a
 * compact format: td_model_set_weights rounds them in place, and a compact
 * checkpoint loads as the same rounded values, so training-side code
 * (evaluation, prefill's GEMMs) sees exactly the numbers the compact format
 * holds. A decoder then packs the matrices it multiplies into the format's
 * bytes on the model's device (a packed set) and its products read those:
 * batch-1 decoding is bound by the bytes it reads. Rounding again what was
 * rounded gives the same values (q8_0's largest weight of a block is 127 d
 * exactly), so a shard packs its own rows and gets the whole model's blocks
 * wherever its columns start on a block. */
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant.h"
#include "device/buffer.h"
#include "device/internal.h"
#include "nn/nn-impl.h"
#include "tandem/generate.h"

/* The matrices of a layer that a compact format rounds: param indexes. */
static int layer_matrices(const td_layer *l, int idx[2]) {
    if (l->vt == &td__linear_vt || l->vt == &td__embedding_vt) {
        idx[0] = 0;
        return 1;
    }
    if (l->vt == &td__attention_vt || l->vt == &td__swiglu_vt) {
        idx[0] = 0, idx[1] = 2;
        return 2;
    }
    return 0;
}

/* One matrix rounded in place through the host: x -> format -> x. */
static td_status round_matrix(const td_layer *l, td_weights fmt, td_tensor *w) {
    size_t n = td_tensor_numel(w);
    int64_t cols = td_tensor_dim(w, td_tensor_ndim(w) - 1);
    float *v;
    td_block_q8_0 *b = NULL;
    td_status st;
    if (!n)
        return TD_OK;
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_SHAPE,
                         "%s (%s): its rows of %lld weights are not whole q8_0 blocks of %d; "
                         "use --weights bf16 or f32 for this model",
                         l->path, l->type, (long long)cols, TD_Q8_0_BLOCK);
    if (!(v = td__calloc(n * sizeof *v, "a matrix to round")))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td_tensor_read(w, v, n * sizeof *v)) != TD_OK)
        goto done;
    if (fmt == TD_WEIGHTS_BF16) {
        for (size_t i = 0; i < n; i++)
            v[i] = td__bf16_to_f32(td__f32_to_bf16(v[i]));
    } else {
        if (!(b = td__calloc(n / TD_Q8_0_BLOCK * sizeof *b, "q8_0 blocks"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto done;
        }
        td__quantize_q8_0(v, n, b);
        td__dequantize_q8_0(b, n, v);
    }
    st = td_tensor_write(w, v, n * sizeof *v);
done:
    free(v);
    free(b);
    return st;
}

static td_status round_layer(td_layer *l, td_weights fmt) {
    int idx[2], n = layer_matrices(l, idx);
    for (int i = 0; i < n; i++)
        if (l->param[idx[i]])
            TD_CHECK(round_matrix(l, fmt, l->param[idx[i]]));
    for (int i = 0; i < l->nchildren; i++)
        TD_CHECK(round_layer(l->children[i], fmt));
    return TD_OK;
}

td_status td_model_set_weights(td_model *m, td_weights fmt) {
    if (!m || fmt < TD_WEIGHTS_F32 || fmt > TD_WEIGHTS_Q8_0)
        return td__error(TD_ERR_INVALID_ARG, "td_model_set_weights: no model, or format %d",
                         (int)fmt);
    if (fmt != TD_WEIGHTS_F32 && m->dtype != TD_F32)
        return td__error(TD_ERR_DTYPE,
                         "%s weights compute with f32 activations; the model is %s (use "
                         "--precision f32)",
                         td_weights_name(fmt), td_dtype_name(m->dtype));
    if (fmt != TD_WEIGHTS_F32)
        TD_CHECK(round_layer(m->root, fmt));
    m->weights = fmt;
    return TD_OK;
}

td_weights td_model_weights(const td_model *m) {
    return m ? m->weights : TD_WEIGHTS_F32;
}

static void flag_layer(td_model *m, const td_layer *l, unsigned char *flags) {
    int idx[2], n = layer_matrices(l, idx);
    for (int i = 0; i < n; i++)
        for (size_t j = 0; l->param[idx[i]] && j < m->nparams; j++)
            if (m->params[j] == l->param[idx[i]])
                flags[j] = 1;
    for (int i = 0; i < l->nchildren; i++)
        flag_layer(m, l->children[i], flags);
}

td_status td__model_matrix_flags(td_model *m, unsigned char **flags) {
    if (!(*flags = td__calloc(m->nparams + 1, "matrix flags")))
        return TD_ERR_OUT_OF_MEMORY;
    flag_layer(m, m->root, *flags);
    return TD_OK;
}

/* The process's format ------------------------------------------------------------ */

static atomic_int default_weights = -1;

td_status td__model_take_default_weights(td_model *m) {
    int want = atomic_load(&default_weights);
    if (want < 0 || (td_weights)want == m->weights)
        return TD_OK;
    return td_model_set_weights(m, (td_weights)want);
}

void td_weights_set_default(int weights) {
    atomic_store(&default_weights, weights);
}

int td_weights_default(void) {
    return atomic_load(&default_weights);
}

/* Packed sets ------------------------------------------------------------------------ */

typedef struct packed {
    const td_layer *l;
    int k;          /* param index */
    td_buffer *buf; /* (rows, row bytes) on the model's device */
    int64_t rows, cols;
} packed;

struct td__packed_set {
    td_weights fmt;
    int n, cap;
    packed *mats;
    size_t bytes;
};

/* Packs matrix k of l into the set. A tied linear's weight is the
 * embedding's table, packed again under the linear's name (it is read as
 * the head only through the linear). */
static td_status pack_matrix(td__packed_set *s, td_device *dev, const td_layer *l, int k) {
    const td_tensor *w = l->param[k];
    int64_t cols = td_tensor_dim(w, td_tensor_ndim(w) - 1),
            rows = cols ? (int64_t)td_tensor_numel(w) / cols : 0;
    size_t n = td_tensor_numel(w), rb = td__compact_row_bytes(s->fmt, cols),
           nbytes = (size_t)rows * rb;
    packed *p;
    float *v = NULL;
    uint8_t *bytes = NULL;
    td_status st = TD_OK;
    if (!n)
        return TD_OK;
    if (s->fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_SHAPE,
                         "%s (%s): a slice of %lld columns splits a q8_0 block of %d; a "
                         "tensor split of q8_0 weights cuts whole blocks",
                         l->path, l->type, (long long)cols, TD_Q8_0_BLOCK);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        packed *grown = realloc(s->mats, (size_t)cap * sizeof *grown);
        if (!grown)
            return td__error(TD_ERR_OUT_OF_MEMORY, "no memory for a decoder's packed weights");
        s->mats = grown, s->cap = cap;
    }
    p = &s->mats[s->n];
    memset(p, 0, sizeof *p);
    p->l = l, p->k = k, p->rows = rows, p->cols = cols;
    if (!(v = td__calloc(n * sizeof *v, "a matrix to pack")) ||
        !(bytes = td__calloc(nbytes, "packed weights"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto done;
    }
    TD_TRY(td_tensor_read(w, v, n * sizeof *v));
    if (s->fmt == TD_WEIGHTS_BF16) {
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)bytes)[i] = td__f32_to_bf16(v[i]);
    } else {
        td_block_q8_0 *b = td__calloc(n / TD_Q8_0_BLOCK * sizeof *b, "q8_0 blocks");
        if (!b) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto done;
        }
        td__quantize_q8_0(v, n, b);
        td__q8_0_pack(b, n / TD_Q8_0_BLOCK, bytes);
        free(b);
    }
    TD_TRY(td_buffer_alloc(dev, nbytes, &p->buf));
    TD_TRY(td_buffer_write(p->buf, 0, bytes, nbytes));
    s->n++;
    s->bytes += nbytes;
fail:
done:
    if (st != TD_OK && p->buf)
        td_buffer_free(p->buf);
    free(v);
    free(bytes);
    return st;
}

static td_status pack_layer(td__packed_set *s, td_device *dev, const td_layer *l) {
    int idx[2], n = l->vt == &td__embedding_vt ? 0 : layer_matrices(l, idx);
    for (int i = 0; i < n; i++)
        if (l->param[idx[i]])
            TD_CHECK(pack_matrix(s, dev, l, idx[i]));
    for (int i = 0; i < l->nchildren; i++)
        TD_CHECK(pack_layer(s, dev, l->children[i]));
    return TD_OK;
}

void td__packed_destroy(td__packed_set *s) {
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        td_buffer_free(s->mats[i].buf);
    free(s->mats);
    free(s);
}

td_status td__packed_create(td_model *m, td__packed_set **out) {
    int want = td_weights_default();
    td_weights fmt = want >= 0 ? (td_weights)want : m->weights;
    td__packed_set *s;
    td_status st;
    *out = NULL;
    if (fmt == TD_WEIGHTS_F32)
        return TD_OK;
    if (m->dtype != TD_F32)
        return td__error(TD_ERR_DTYPE,
                         "decoder: %s weights compute with f32 activations; the model is %s "
                         "(use --precision f32)",
                         td_weights_name(fmt), td_dtype_name(m->dtype));
    if (!(s = td__calloc(sizeof *s, "a decoder's packed weights")))
        return TD_ERR_OUT_OF_MEMORY;
    s->fmt = fmt;
    /* the model computes prefill and evaluation with the rounded values */
    if (m->weights != fmt)
        TD_TRY(td_model_set_weights(m, fmt));
    TD_TRY(pack_layer(s, m->dev, m->root));
    *out = s;
    return TD_OK;
fail:
    td__packed_destroy(s);
    return st;
}

td_weights td__packed_format(const td__packed_set *s) {
    return s ? s->fmt : TD_WEIGHTS_F32;
}

size_t td__packed_bytes(const td__packed_set *s) {
    return s ? s->bytes : 0;
}

td_status td__packed_matmul(const td__packed_set *s, const td_layer *l, int k, int64_t first_row,
                            td_tensor *y, const td_tensor *x, const td_tensor *w) {
    /* a prefill's rows too: its products then round x as every step does,
     * and the f32 copy need not be kept */
    for (int i = 0; s && i < s->n; i++) {
        const packed *p = &s->mats[i];
        if (p->l != l || p->k != k)
            continue;
        /* rows [first_row, first_row + y's columns) of the packed matrix */
        assert(first_row >= 0 && first_row + td_tensor_dim(y, td_tensor_ndim(y) - 1) <= p->rows);
        return td__op_matmul_compact(y, x, s->fmt,
                                     (const char *)p->buf->ptr +
                                         (size_t)first_row * td__compact_row_bytes(s->fmt, p->cols),
                                     td_tensor_dim(y, td_tensor_ndim(y) - 1), p->cols);
    }
    return td__op_matmul(y, x, 0, w, 1, 1.0, 0.0);
}

void td__packed_release_f32(td__packed_set *s) {
    for (int i = 0; s && i < s->n; i++)
        td__tensor_release(s->mats[i].l->param[s->mats[i].k]);
}

td_status td__packed_embed(const td__packed_set *s, const td_tensor *table, const td_buffer *tokens,
                           int64_t n, td_tensor *y) {
    const packed *p = NULL;
    td_device *dev = td_tensor_device(y);
    int32_t *ids = NULL;
    uint8_t *row = NULL;
    float *v = NULL;
    td_block_q8_0 *b = NULL;
    size_t rb;
    td_status st = TD_OK;
    for (int i = 0; s && i < s->n && !p; i++)
        if (s->mats[i].l->param[s->mats[i].k] == table)
            p = &s->mats[i];
    if (!p)
        return td__error(TD_ERR_UNSUPPORTED, "decoder: no packed copy of the embedding's table");
    rb = td__compact_row_bytes(s->fmt, p->cols);
    /* a few rows a pass: widened on the host, as a checkpoint's are */
    if (!(ids = td__calloc((size_t)n * sizeof *ids, "token ids")) ||
        !(row = td__calloc(rb, "a packed row")) ||
        !(v = td__calloc((size_t)(n * p->cols) * sizeof *v, "embedding rows")) ||
        !(b = td__calloc(((size_t)p->cols / TD_Q8_0_BLOCK + 1) * sizeof *b, "q8_0 blocks"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto done;
    }
    TD_TRY(td__device_read(dev, ids, tokens->ptr, (size_t)n * sizeof *ids));
    for (int64_t t = 0; t < n; t++) {
        float *out = v + t * p->cols;
        assert(ids[t] >= 0 && ids[t] < p->rows);
        TD_TRY(td__device_read(dev, row, (const char *)p->buf->ptr + (size_t)ids[t] * rb, rb));
        if (s->fmt == TD_WEIGHTS_BF16) {
            for (int64_t c = 0; c < p->cols; c++)
                out[c] = td__bf16_to_f32((uint16_t)(row[2 * c] | row[2 * c + 1] << 8));
        } else {
            td__q8_0_unpack(row, (size_t)p->cols / TD_Q8_0_BLOCK, b);
            td__dequantize_q8_0(b, (size_t)p->cols, out);
        }
    }
    st = td__device_write(dev, y->data, v, (size_t)(n * p->cols) * sizeof *v);
fail:
done:
    free(ids);
    free(row);
    free(v);
    free(b);
    return st;
}
