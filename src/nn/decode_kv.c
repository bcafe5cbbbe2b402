/* A decoder's key/value caches (decode.c), in the model's dtype or, as an
 * option (td_decoder_set_default_kv_cache), in f16 or bf16.
 *
 * The attention kernels read f32 caches, so a half-precision cache keeps
 * every layer's rows in 2 bytes a value and one f32 work cache the size of
 * the largest layer's, which all layers share: a pass computes its rows
 * into the work cache, stores them (rounded), and expands the layer's
 * stored rows [0, pos + n) back into the work cache for its attention
 * (rounded values for the new rows too, so a step reads what a later step
 * will). L layers then hold L / 2 + 1 layers' f32 bytes instead of L: about
 * half for a deep model (58% for GPT-2's 12 layers). */
#include <assert.h>
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
};

static atomic_int default_kind = TD_KV_CACHE_MODEL;

void td_decoder_set_default_kv_cache(td_kv_cache kind) {
    atomic_store(&default_kind, (int)kind);
}

td_status td__kv_cache_create(td_model *m, int natt, int64_t ctx, td__kv_cache **out) {
    td__kv_cache *c = td__calloc(sizeof *c, "a decoder's caches");
    *out = NULL;
    if (!c)
        return TD_ERR_OUT_OF_MEMORY;
    c->m = m, c->natt = natt, c->ctx = ctx, c->kind = atomic_load(&default_kind);
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

td_status td__kv_cache_finish(td__kv_cache *c, td_tensor **kv) {
    int64_t wide = 0;
    for (int i = 0; i < c->natt; i++) {
        int64_t shape[2] = {c->ctx, c->row[i]};
        if (c->row[i] <= 0)
            continue;
        if (c->kind == TD_KV_CACHE_MODEL) {
            TD_CHECK(td_tensor_create(c->m->dev, c->m->dtype, 2, shape, &c->own[i]));
            kv[i] = c->own[i];
            continue;
        }
        TD_CHECK(td_buffer_alloc(c->m->dev, (size_t)(c->ctx * c->row[i]) * 2, &c->stored[i]));
        wide = c->row[i] > wide ? c->row[i] : wide;
    }
    if (wide > 0) {
        int64_t shape[2] = {c->ctx, wide};
        TD_CHECK(td_tensor_create(c->m->dev, TD_F32, 2, shape, &c->work));
        for (int i = 0; i < c->natt; i++)
            kv[i] = c->row[i] > 0 ? c->work : NULL;
    }
    return TD_OK;
}

td_status td__kv_cache_sync(td__kv_cache *c, int i, int64_t pos, int64_t n) {
    const td_kernels *k;
    char *work, *stored;
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
    row = (size_t)c->row[i];
    work = c->work->data;
    stored = c->stored[i]->ptr;
    /* the pass's rows in, rounded; then every row the attention reads, out */
    TD_CHECK(k->convert_half(td__device_ctx(c->m->dev), c->kind, 1, (size_t)n * row,
                             work + (size_t)pos * row * 4, stored + (size_t)pos * row * 2));
    return k->convert_half(td__device_ctx(c->m->dev), c->kind, 0, (size_t)(pos + n) * row, stored,
                           work);
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
