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
 * bytes for L layers).
 *
 * That composed step needs a softmax over one row of pos + 1 scores, which
 * the kernel table has only inside cross-entropy: each row gets a leading
 * dummy score of -1e30 labelled as the target, so the kernel's gradient
 * (softmax minus the one-hot of the label) is the exact softmax in the
 * other columns (exp(-1e30 - max) is 0 in f32 and f64). This keeps the step
 * on the device with the kernels every backend has. */
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

#define DUMMY_SCORE (-1e30)

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
    int64_t heads;      /* the most query heads a layer has */
    td_tensor *scores;  /* composed steps: (heads, ctx + 1) scores, the dummy first */
    td_tensor *probs;   /* (heads, ctx + 1): their softmax */
    td_buffer *targets; /* heads int32 zeros: every row's label is the dummy */
};

static atomic_int default_kind = TD_KV_CACHE_MODEL;

void td_decoder_set_default_kv_cache(td_kv_cache kind) {
    atomic_store(&default_kind, (int)kind);
}

td_status td__kv_cache_create(td_model *m, int natt, int64_t ctx, int64_t heads,
                              td__kv_cache **out) {
    td__kv_cache *c = td__calloc(sizeof *c, "a decoder's caches");
    const td_kernels *k = td__device_kernels(m->dev);
    *out = NULL;
    if (!c)
        return TD_ERR_OUT_OF_MEMORY;
    c->m = m, c->natt = natt, c->ctx = ctx, c->heads = heads, c->kind = atomic_load(&default_kind);
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

/* The composed step's scores, probabilities and labels. */
static td_status alloc_composed(td__kv_cache *c) {
    int64_t w = (c->heads ? c->heads : 1) * (c->ctx + 1);
    size_t nt = (size_t)c->heads + 1;
    int32_t *zeros;
    td_status st;
    TD_CHECK(td_tensor_create(c->m->dev, c->m->dtype, 1, &w, &c->scores));
    TD_CHECK(td_tensor_create(c->m->dev, c->m->dtype, 1, &w, &c->probs));
    TD_CHECK(td_buffer_alloc(c->m->dev, nt * sizeof(int32_t), &c->targets));
    if (!(zeros = td__calloc(nt * sizeof *zeros, "a decoder's labels")))
        return TD_ERR_OUT_OF_MEMORY;
    st = td_buffer_write(c->targets, 0, zeros, nt * sizeof *zeros);
    free(zeros);
    return st;
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
    return c->attends ? TD_OK : alloc_composed(c);
}

int64_t td__kv_cache_row(const td__kv_cache *c, int i) {
    return c->row[i];
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

static td_gemm_operand operand(const td_tensor *t, int64_t off, int64_t ld, int64_t stride) {
    td_gemm_operand o = {t, (size_t)off, ld, stride};
    return o;
}

/* One group of query heads of a step: g query heads a key and value head
 * apart (g of them for each of nkv key and value heads, side by side in q
 * from q_head), those key and value heads from kv_head. */
typedef struct attend_group {
    int64_t g, nkv, q_head, kv_head;
} attend_group;

/* The composed step on the f32 rows kv (h query and kvh key and value heads
 * a row): see the file's head for the dummy score. The g query heads of a
 * key and value head, side by side in q, are one (g, d) matrix. */
static td_status attend_composed(const td__kv_cache *c, const td_tensor *kv, int64_t h, int64_t kvh,
                                 int64_t d, int64_t pos, int64_t row, attend_group a,
                                 td_tensor *yh) {
    int64_t len = pos + 1, w = len + 1, g = a.g;
    int64_t hw[2] = {g * a.nkv, w};
    int64_t q = pos * row + a.q_head * d, k = (h + a.kv_head) * d, v = (h + kvh + a.kv_head) * d;
    td_tensor s, prob;
    double loss;
    int64_t hits;
    TD_CHECK(td__tensor_view(&s, c->scores, 0, 2, hw));
    TD_CHECK(td__tensor_view(&prob, c->probs, 0, 2, hw));
    TD_CHECK(td_tensor_fill(&s, DUMMY_SCORE));
    /* s_h[1..len] (g, len) = scale q_{group} (g, d) K_j^T, per key head j */
    TD_CHECK(td__op_gemm_batched(0, 1, g, len, d, 1.0 / sqrt((double)d), operand(kv, q, d, g * d),
                                 operand(kv, k, row, d), 0.0, operand(&s, 1, w, g * w), a.nkv));
    TD_CHECK(td__op_xent(&s, c->targets, &prob, 1.0, &loss, &hits));
    /* yh_{group} (g, d) = p_{group}[1..len] V_j (len, d) */
    return td__op_gemm_batched(0, 0, g, d, len, 1.0, operand(&prob, 1, w, g * w),
                               operand(kv, v, row, d), 0.0, operand(yh, a.q_head * d, d, g * d),
                               a.nkv);
}

static td_status attend_group_step(const td__kv_cache *c, int i, td_kv_map m, int64_t d,
                                   int64_t pos, const td_tensor *raw, attend_group a,
                                   td_tensor *yh) {
    const td_kernels *k = td__device_kernels(c->m->dev);
    const char *base;
    size_t es;
    if (!c->attends)
        return attend_composed(c, c->own[i] ? c->own[i] : c->work, m.h, m.kv, d, pos, c->row[i], a,
                               yh);
    if (c->kind == TD_KV_CACHE_MODEL)
        base = c->own[i]->data, es = 4;
    else
        base = c->stored[i]->ptr, es = 2;
    return k->attend_step(td__device_ctx(c->m->dev), c->kind, a.g * a.nkv, a.nkv, d, pos + 1,
                          (float)(1.0 / sqrt((double)d)), (const float *)raw->data + a.q_head * d,
                          base + (size_t)((m.h + a.kv_head) * d) * es,
                          base + (size_t)((m.h + m.kv + a.kv_head) * d) * es, c->row[i],
                          (float *)yh->data + a.q_head * d);
}

td_status td__kv_cache_attend(const td__kv_cache *c, int i, td_kv_map m, int64_t d, int64_t pos,
                              const td_tensor *raw, td_tensor *yh) {
    assert(c->row[i] > 0 && pos > 0);
    if (m.skew == 0 && m.h == m.kv * m.g) {
        attend_group all = {m.g, m.kv, 0, 0};
        return attend_group_step(c, i, m, d, pos, raw, all, yh);
    }
    /* a shard's heads from within a group: a group at a time */
    for (int64_t j = 0; j < m.kv; j++) {
        int64_t lo, hi;
        td__kv_queries(m, j, &lo, &hi);
        attend_group one = {hi - lo, 1, lo, j};
        TD_CHECK(attend_group_step(c, i, m, d, pos, raw, one, yh));
    }
    return TD_OK;
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
    td_tensor_destroy(c->scores);
    td_tensor_destroy(c->probs);
    td_buffer_free(c->targets);
    free(c->row);
    free(c->own);
    free(c->stored);
    free(c);
}
