/* A decoder's key/value caches (decode.c), in the model's dtype or, as an
 * option (td_decoder_set_default_kv_cache), in f16 or bf16.
 *
 * Where the device has the attend_step kernel (and the model is f32), a
 * step's attention reads each layer's cache as it is stored, so a
 * half-precision cache is just its rows in 2 bytes a value: a pass computes
 * its rows in f32 into the layer's workspace, stores them rounded, and
 * rounds the workspace's rows in place (so the pass reads what a later step
 * will). Elsewhere the attention reads f32 rows: every layer's rows are
 * kept in 2 bytes and one f32 work cache the size of the largest layer's,
 * which all layers share, gets the pass's rows and the layer's stored rows
 * [0, pos + n) expanded back before its attention (L / 2 + 1 layers' f32
 * bytes for L layers). */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/error.h"
#include "device/buffer.h"
#include "device/internal.h"
#include "nn/nn-impl.h"
#include "tandem/generate.h"

struct td__kv_cache {
    td_model *m;
    int kind; /* td_kv_cache */
    int natt;
    int64_t ctx;
    int64_t *row;       /* (natt) values a position of each layer's cache holds */
    td_tensor **own;    /* (natt) f32 caches (kind f32), or NULL */
    td_tensor *work;    /* half kinds: the shared f32 cache (ctx, max row) */
    td_buffer **stored; /* half kinds: (natt) (ctx, row) 2-byte values */
    int attends;        /* the device's attend_step reads the caches */
};

static atomic_int default_kind = TD_KV_CACHE_MODEL;

void td_decoder_set_default_kv_cache(td_kv_cache kind) {
    atomic_store(&default_kind, (int)kind);
}

td_status td__kv_cache_create(td_model *m, int natt, int64_t ctx, td__kv_cache **out) {
    td__kv_cache *c = td__calloc(sizeof *c, "a decoder's caches");
    const td_kernels *k = td__device_kernels(m->dev);
    *out = NULL;
    if (!c)
        return TD_ERR_OUT_OF_MEMORY;
    c->m = m, c->natt = natt, c->ctx = ctx, c->kind = atomic_load(&default_kind);
    c->attends = m->dtype == TD_F32 && k && k->attend_step;
    if (c->kind != TD_KV_CACHE_MODEL && m->dtype != TD_F32) {
        const char *kind = c->kind == TD_KV_CACHE_F16 ? "f16" : "bf16";
        free(c);
        return td__error(TD_ERR_DTYPE,
                         "decoder: a %s key/value cache holds an f32 model's keys and values; the "
                         "model is %s",
                         kind, td_dtype_name(m->dtype));
    }
    c->row = td__calloc(((size_t)natt + 1) * sizeof *c->row, "cache rows");
    c->own = td__calloc(((size_t)natt + 1) * sizeof *c->own, "caches");
    c->stored = td__calloc(((size_t)natt + 1) * sizeof *c->stored, "caches");
    *out = c;
    return c->row && c->own && c->stored ? TD_OK : TD_ERR_OUT_OF_MEMORY;
}

void td__kv_cache_add(td__kv_cache *c, int i, int64_t row) {
    assert(i >= 0 && i < c->natt);
    c->row[i] = row;
}

td_status td__kv_cache_finish(td__kv_cache *c) {
    int64_t wide = 0;
    for (int i = 0; i < c->natt; i++) {
        int64_t shape[2] = {c->ctx, c->row[i]};
        if (c->row[i] <= 0)
            continue;
        if (c->kind == TD_KV_CACHE_MODEL) {
            TD_CHECK(td_tensor_create(c->m->dev, c->m->dtype, 2, shape, &c->own[i]));
            continue;
        }
        TD_CHECK(td_buffer_alloc(c->m->dev, (size_t)(c->ctx * c->row[i]) * 2, &c->stored[i]));
        wide = c->row[i] > wide ? c->row[i] : wide;
    }
    if (wide > 0 && !c->attends) {
        int64_t shape[2] = {c->ctx, wide};
        TD_CHECK(td_tensor_create(c->m->dev, TD_F32, 2, shape, &c->work));
    }
    return TD_OK;
}

int64_t td__kv_cache_row(const td__kv_cache *c, int i) {
    return c->row[i];
}

int td__kv_cache_attends(const td__kv_cache *c) {
    return c->attends;
}

td_status td__kv_cache_rows(const td__kv_cache *c, int i, const td_tensor *ws, int64_t pos,
                            int64_t n, td_tensor *raw) {
    int64_t rows[3] = {1, n, c->row[i]};
    if (c->own[i])
        return td__tensor_view(raw, c->own[i], (size_t)(pos * c->row[i]), 3, rows);
    if (c->work)
        return td__tensor_view(raw, c->work, (size_t)(pos * c->row[i]), 3, rows);
    return td__tensor_view(raw, ws, 0, 3, rows);
}

const td_tensor *td__kv_cache_f32(const td__kv_cache *c, int i) {
    return c->own[i] ? c->own[i] : c->work;
}

td_status td__kv_cache_sync(td__kv_cache *c, int i, int64_t pos, int64_t n, td_tensor *raw) {
    const td_kernels *k;
    void *ctx;
    char *stored;
    size_t row;
    if (c->kind == TD_KV_CACHE_MODEL || c->row[i] <= 0)
        return TD_OK;
    k = td__device_kernels(c->m->dev);
    if (!k || !k->convert_half)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: a %s key/value cache needs op 'convert_half', which the %s backend "
                         "lacks",
                         td_device_name(c->m->dev), c->kind == TD_KV_CACHE_F16 ? "f16" : "bf16",
                         td__device_backend_name(c->m->dev));
    ctx = td__device_ctx(c->m->dev);
    row = (size_t)c->row[i];
    stored = c->stored[i]->ptr;
    /* the pass's rows in, rounded; then what the attention reads, out */
    TD_CHECK(k->convert_half(ctx, c->kind, 1, (size_t)n * row, raw->data,
                             stored + (size_t)pos * row * 2));
    if (c->attends)
        return k->convert_half(ctx, c->kind, 0, (size_t)n * row, stored + (size_t)pos * row * 2,
                               raw->data);
    return k->convert_half(ctx, c->kind, 0, (size_t)(pos + n) * row, stored, c->work->data);
}

td_status td__kv_cache_attend(const td__kv_cache *c, int i, int64_t h, int64_t kv, int64_t d,
                              int64_t len, const float *q, float *y) {
    const td_kernels *k = td__device_kernels(c->m->dev);
    const char *base;
    size_t es;
    assert(c->attends && c->row[i] > 0);
    if (c->kind == TD_KV_CACHE_MODEL)
        base = c->own[i]->data, es = 4;
    else
        base = c->stored[i]->ptr, es = 2;
    return k->attend_step(td__device_ctx(c->m->dev), c->kind, h, kv, d, len,
                          (float)(1.0 / sqrt((double)d)), q, base + (size_t)(h * d) * es,
                          base + (size_t)((h + kv) * d) * es, c->row[i], y);
}

size_t td__kv_cache_bytes(const td__kv_cache *c) {
    size_t b = 0;
    for (int i = 0; c && i < c->natt; i++)
        b += c->own[i] ? td_tensor_nbytes(c->own[i]) : c->stored[i] ? c->stored[i]->nbytes : 0;
    return b + (c && c->work ? td_tensor_nbytes(c->work) : 0);
}

void td__kv_cache_destroy(td__kv_cache *c) {
    if (!c)
        return;
    for (int i = 0; i < c->natt; i++) {
        td_tensor_destroy(c->own ? c->own[i] : NULL);
        td_buffer_free(c->stored ? c->stored[i] : NULL);
    }
    td_tensor_destroy(c->work);
    free(c->row);
    free(c->own);
    free(c->stored);
    free(c);
}
