/* The KV-cache decoder: a token model's forward over positions [pos, pos + n)
 * of one sequence, reading earlier positions' keys and values from a cache.
 *
 * The model's own layers are planned for whole windows, (1, T, ...) with one
 * sample; the decoder runs them layer by layer over the first n rows of the
 * same activation views (every layer but attention treats positions alike,
 * so rows [0, n) of its views can stand for any n positions). Attention
 * keeps its q, k, v rows in the layer's cache at their positions, and reads
 * every key and value before them from there.
 *
 * Prefill (positions [0, n)) uses the layer's own causal kernels, fused or
 * composed as the layer chose when planned; a step (one position after pos
 * cached ones) attends through the cache (decode_kv.c).
 *
 * A decoder of a tensor-parallel shard (shard.c) computes the shard's heads
 * and hidden features only, keeps the keys and values of its own heads, and
 * sums each unit's partial output through the model's reduce hook, as the
 * shard's forward does. A vocabulary slice makes it compute and read only
 * those rows of a linear head: the shards of one model split the head's
 * reading between them. Custom decoders (td_decoder_create_custom) leave
 * their passes to whoever made them; the checks and positions stay here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "device/internal.h"
#include "nn/nn-impl.h"
#include "tandem/generate.h"

/* The attention workspace views, as att_plan (layers.c) carves them. */
enum { ATT_QKV = 0, ATT_P = 1, ATT_S = 2, ATT_YH = 3, ATT_RAW = 6 };

struct td_decoder {
    td_decoder_impl custom; /* custom.pass NULL: the decoder of m */
    td_model *m;            /* borrowed, unless owns_model */
    int owns_model;         /* td_decoder_take_model */
    int64_t ctx;            /* positions: the model's T */
    int64_t vocab;          /* logits per position */
    int64_t token_limit;    /* the embedding's vocabulary */
    int64_t pos;            /* positions cached */
    int64_t heads;          /* the most heads any attention layer computes here */
    td_layer *head;         /* the top-level linear giving the logits; NULL: none */
    int64_t vfirst, vcount; /* the logits computed and read: [vfirst, vfirst + vcount) */
    td_buffer out;          /* a part's output rows after its last pass */
    int natt;               /* attention layers; their caches hold (T, (h + 2 kv) d) q, k, v
                               rows of the heads computed here, rotated */
    void *host;             /* vocab elements of the model's dtype, for reading logits */
    td__packed_set *packed; /* compact weight matrices (compact.c); NULL: f32 */
    td__kv_cache *kvc;      /* the caches, in forward order (decode_kv.c) */
};

/* One pass: rows [pos, pos + n) of the sequence. */
typedef struct pass {
    td_decoder *d;
    int64_t pos, n;
    int att; /* the next attention layer's cache */
} pass;

typedef td_status (*decode_fn)(td_layer *l, const td_tensor *x, pass *p);

static td_status decode_layer(td_layer *l, const td_tensor *x, pass *p);

/* The first n rows of a (1, T, w) activation view. */
static td_status first_rows(const td_tensor *full, int64_t n, td_tensor *v) {
    int64_t shape[3] = {1, n, full->shape[full->ndim - 1]};
    return td__tensor_view(v, full, 0, 3, shape);
}

/* Layers ----------------------------------------------------------------------- */

static td_status embed_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_model *m = p->d->m;
    int64_t c = l->out_shape[1];
    td_tensor y, wpe;
    TD_CHECK(first_rows(&l->out, p->n, &y));
    if (!l->param[0]->data) {
        /* the table is a tied head's, kept only packed: rows [pos, pos + n) of wpe added */
        int64_t rows[3] = {1, p->n, c};
        TD_CHECK(td__packed_embed(p->d->packed, l->param[0], &m->tokens, p->n, &y));
        if (!l->positions)
            return TD_OK;
        TD_CHECK(td__tensor_view(&wpe, l->param[1], (size_t)(p->pos * c), 3, rows));
        return td__op_add(&y, &wpe, &y);
    }
    if (!l->positions)
        return td__op_embed_fwd(&m->tokens, l->param[0], NULL, &y);
    /* the kernel adds wpe rows [0, n): start the table at the pass's position */
    int64_t rows[2] = {p->d->ctx - p->pos, c};
    TD_CHECK(td__tensor_view(&wpe, l->param[1], (size_t)(p->pos * c), 2, rows));
    return td__op_embed_fwd(&m->tokens, l->param[0], &wpe, &y);
}

static td_status ln_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor y, mean, rstd;
    int64_t n = p->n;
    TD_CHECK(first_rows(&l->out, n, &y));
    TD_CHECK(td__tensor_view(&mean, &l->ws[0], 0, 1, &n));
    TD_CHECK(td__tensor_view(&rstd, &l->ws[1], 0, 1, &n));
    return td__op_layernorm_fwd(l->eps, x, l->param[0], l->param[1], &y, &mean, &rstd);
}

static td_status rms_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor y, rstd;
    int64_t n = p->n;
    TD_CHECK(first_rows(&l->out, n, &y));
    TD_CHECK(td__tensor_view(&rstd, &l->ws[0], 0, 1, &n));
    return td__op_rmsnorm_fwd(l->eps, x, l->param[0], &y, &rstd);
}

/* As in training (layers_llama.c): gu = x Wgu^T + b, h = silu(g) u, y = h Wd^T
 * + b; a shard's y summed across the shards before the bias. */
static td_status swiglu_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor y, gu, h;
    TD_CHECK(first_rows(&l->out, p->n, &y));
    if (l->hidden == 0) {
        TD_CHECK(td__zero(&y));
    } else {
        TD_CHECK(first_rows(&l->ws[0], p->n, &gu));
        TD_CHECK(first_rows(&l->ws[1], p->n, &h));
        TD_CHECK(td__packed_matmul(p->d->packed, l, 0, 0, &gu, x, l->param[0]));
        if (l->has_bias)
            TD_CHECK(td__op_bias_add(&gu, l->param[1], p->n, 2 * l->hidden, 1));
        TD_CHECK(td__op_swiglu_fwd(&gu, &h));
        TD_CHECK(td__packed_matmul(p->d->packed, l, 2, 0, &y, &h, l->param[2]));
    }
    if (l->split.kind == TD__SPLIT_GATED)
        TD_CHECK(td__model_reduce(p->d->m, &y));
    return l->has_bias ? td__op_bias_add(&y, l->param[3], p->n, y.shape[2], 1) : TD_OK;
}

/* The rows [first, first + count) of a linear head's weight and bias: the
 * decoder's vocabulary slice. */
static td_status head_slice(const td_decoder *d, td_layer *l, td_tensor *w, td_tensor *b) {
    int64_t in = l->param[0]->shape[1], rows[2] = {d->vcount, in};
    TD_CHECK(td__tensor_view(w, l->param[0], (size_t)(d->vfirst * in), 2, rows));
    return l->has_bias ? td__tensor_view(b, l->param[1], (size_t)d->vfirst, 1, &d->vcount) : TD_OK;
}

/* x's and y's last of n rows, as (1, 1, features) views. */
static td_status last_row_only(const td_tensor *x, int64_t n, td_tensor *xs, td_tensor *y) {
    int64_t in = td_tensor_dim(x, td_tensor_ndim(x) - 1), out = td_tensor_dim(y, 2);
    int64_t xshape[3] = {1, 1, in}, yshape[3] = {1, 1, out};
    td_tensor whole = *y;
    TD_CHECK(td__tensor_view(xs, x, (size_t)((n - 1) * in), 3, xshape));
    return td__tensor_view(y, &whole, (size_t)((n - 1) * out), 3, yshape);
}

static td_status linear_decode(td_layer *l, const td_tensor *x, pass *p) {
    const td_tensor *w = l->param[0], *b = l->has_bias ? l->param[1] : NULL;
    int64_t out = l->out_features;
    td_tensor y, ws, bs, xs = {0};
    if (l == p->d->head && p->d->vcount < out) {
        if (!p->d->vcount)
            return TD_OK; /* another shard's decoder computes the logits */
        TD_CHECK(head_slice(p->d, l, &ws, &bs));
        w = &ws;
        b = b ? &bs : NULL;
        out = p->d->vcount;
    }
    if (out == l->out_features) {
        TD_CHECK(first_rows(&l->out, p->n, &y));
    } else {
        /* (n, out) packed at the start of the layer's output */
        int64_t shape[3] = {1, p->n, out};
        TD_CHECK(td__tensor_view(&y, &l->out, 0, 3, shape));
    }
    /* the logits are read from the pass's last row only (read_logits): a
     * prefill's head computes that row alone, in its place */
    if (l == p->d->head && p->n > 1)
        TD_CHECK(last_row_only(x, p->n, &xs, &y));
    /* y (n, out) = x (n, in) W^T + b; a shard holding none of a pair gives zeros */
    if (l->split.kind != TD__SPLIT_NONE && l->split.count == 0) {
        if (l->split.kind == TD__SPLIT_IN)
            TD_CHECK(td__zero(&y));
    } else {
        TD_CHECK(td__packed_matmul(p->d->packed, l, 0, w == &ws ? p->d->vfirst : 0, &y,
                                   xs.data ? &xs : x, w));
    }
    /* the second linear of a pair sums its partial outputs before its bias */
    if (l->split.kind == TD__SPLIT_IN)
        TD_CHECK(td__model_reduce(p->d->m, &y));
    return b && y.numel ? td__op_bias_add(&y, b, td__tensor_rows(&y), out, 1) : TD_OK;
}

static td_status act_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor y;
    TD_CHECK(first_rows(&l->out, p->n, &y));
    return td__op_act_fwd(l->act, x, &y);
}

/* Dropout is the identity at inference. */
static td_status copy_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor y;
    TD_CHECK(first_rows(&l->out, p->n, &y));
    return td__op_copy(x, &y);
}

static td_status seq_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_tensor cur = *x;
    for (int i = 0; i < l->nchildren; i++) {
        TD_CHECK(decode_layer(l->children[i], &cur, p));
        TD_CHECK(first_rows(&l->children[i]->out, p->n, &cur));
    }
    return TD_OK;
}

static td_status res_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_layer *in = l->children[0];
    td_tensor inner, y;
    TD_CHECK(decode_layer(in, x, p));
    TD_CHECK(first_rows(&in->out, p->n, &inner));
    TD_CHECK(first_rows(&l->out, p->n, &y));
    return td__op_add(x, &inner, &y);
}

static td_gemm_operand operand(const td_tensor *t, int64_t off, int64_t ld, int64_t stride) {
    td_gemm_operand o = {t, (size_t)off, ld, stride};
    return o;
}

/* The heads a layer computes here (all, or a shard's) and their width. */
static int64_t att_heads(const td_layer *l) {
    return td__att_map(l).h;
}

static int64_t att_kv(const td_layer *l) {
    return td__att_map(l).kv;
}

static int64_t att_width(const td_layer *l) {
    return att_heads(l) * (l->in_shape[1] / l->heads);
}

/* A cache row: q, k and v of the heads here, (h + 2 kv) d. */
static int64_t att_row(const td_layer *l) {
    return (att_heads(l) + 2 * att_kv(l)) * (l->in_shape[1] / l->heads);
}

/* Prefill from position 0: causal attention over the n cached rows, fused
 * or composed as the layer does it in training. qkv (1, n, 3c) -> yh (1, n, c). */
static td_status att_prefill(td_layer *l, const td_tensor *qkv, int64_t n, td_tensor *yh) {
    int64_t h = att_heads(l), c = att_width(l), d = l->in_shape[1] / l->heads;
    int64_t hnn[4] = {1, h, n, n};
    double scale = 1.0 / sqrt((double)d);
    td_tensor s, prob;
    TD_CHECK(td__tensor_view(&prob, &l->ws[ATT_P], 0, 4, hnn));
    if (l->fused)
        return td__op_attention_fwd(h, scale, qkv, &prob, yh);
    TD_CHECK(td__tensor_view(&s, &l->ws[ATT_S], 0, 4, hnn));
    /* s (h, n, n) = q_h (n, d) k_h^T */
    TD_CHECK(td__op_gemm_batched(0, 1, n, n, d, 1.0, operand(qkv, 0, 3 * c, d),
                                 operand(qkv, c, 3 * c, d), 0.0, operand(&s, 0, n, n * n), h));
    TD_CHECK(td__op_causal_softmax_fwd(scale, &s, &prob));
    /* yh_h (n, d) = p_h (n, n) v_h (n, d), at column h*d of (n, c) */
    return td__op_gemm_batched(0, 0, n, d, n, 1.0, operand(&prob, 0, n, n * n),
                               operand(qkv, 2 * c, 3 * c, d), 0.0, operand(yh, 0, c, d), h);
}

/* q, k, v rows go into the cache at their positions (rotated there, with
 * rotary positions); the heads' output is then projected as in training (a
 * shard's projection is partial: summed before the bias). A prefill expands
 * grouped key and value heads into the layer's workspace first. */
static td_status att_decode(td_layer *l, const td_tensor *x, pass *p) {
    td_decoder *dec = p->d;
    int i = p->att++;
    int64_t h = att_heads(l), nkv = att_kv(l), c = att_width(l), d = l->in_shape[1] / l->heads,
            oc = l->out_shape[1], n = p->n;
    int64_t yrows[3] = {1, n, c}, qrows[3] = {1, n, 3 * c};
    td_tensor raw, qkv, yh, y;
    TD_CHECK(first_rows(&l->out, n, &y));
    if (!td__kv_cache_row(dec->kvc, i)) {
        TD_CHECK(td__zero(&y));
    } else {
        TD_CHECK(
            td__kv_cache_rows(dec->kvc, i, &l->ws[nkv != h ? ATT_RAW : ATT_QKV], p->pos, n, &raw));
        TD_CHECK(td__tensor_view(&yh, &l->ws[ATT_YH], 0, 3, yrows));
        /* raw (n, row) = x Wqkv^T + bqkv */
        TD_CHECK(td__packed_matmul(dec->packed, l, 0, 0, &raw, x, l->param[0]));
        if (l->has_bias)
            TD_CHECK(td__op_bias_add(&raw, l->param[1], n, att_row(l), 1));
        if (l->rope)
            TD_CHECK(td__op_rope(l->rope, p->pos, 0, h + nkv, d, 0, &raw));
        TD_CHECK(td__kv_cache_sync(dec->kvc, i, p->pos, n, &raw));
        qkv = raw;
        if (p->pos == 0 && nkv != h) {
            TD_CHECK(td__tensor_view(&qkv, &l->ws[ATT_QKV], 0, 3, qrows));
            TD_CHECK(td__op_kv_expand(td__att_map(l), d, &raw, &qkv));
        }
        if (p->pos == 0)
            TD_CHECK(att_prefill(l, &qkv, n, &yh));
        else
            TD_CHECK(td__kv_cache_attend(dec->kvc, i, td__att_map(l), d, p->pos, &raw, &yh));
        TD_CHECK(td__packed_matmul(dec->packed, l, 2, 0, &y, &yh, l->param[2]));
    }
    if (l->split.kind == TD__SPLIT_HEADS)
        TD_CHECK(td__model_reduce(dec->m, &y));
    return l->proj_bias ? td__op_bias_add(&y, l->param[3], n, oc, 1) : TD_OK;
}

/* The layers a decoder runs, by their table (anything else is refused). */
static const struct {
    const td_layer_vt *vt;
    decode_fn fn;
} decoders[] = {
    {&td__embedding_vt, embed_decode}, {&td__layernorm_vt, ln_decode},
    {&td__linear_vt, linear_decode},   {&td__act_vt, act_decode},
    {&td__dropout_vt, copy_decode},    {&td__attention_vt, att_decode},
    {&td__sequential_vt, seq_decode},  {&td__residual_vt, res_decode},
    {&td__rmsnorm_vt, rms_decode},     {&td__swiglu_vt, swiglu_decode},
};

static decode_fn decoder_of(const td_layer *l) {
    for (size_t i = 0; i < sizeof decoders / sizeof *decoders; i++)
        if (decoders[i].vt == l->vt)
            return decoders[i].fn;
    return NULL;
}

static td_status decode_layer(td_layer *l, const td_tensor *x, pass *p) {
    return decoder_of(l)(l, x, p);
}

/* Checking and building ----------------------------------------------------------- */

/* Every layer must have a decoder and give (T, features): one row per
 * position. Counts attention layers and their most heads. */
static td_status check_layer(td_decoder *d, const td_layer *l, int top) {
    if (!decoder_of(l))
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: %s: a %s layer cannot be decoded one position at a time",
                         l->path, l->type);
    if (l->out_ndim != 2 || l->out_shape[0] != d->ctx)
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: %s (%s) does not give one row per position, so it cannot "
                         "be decoded with a cache",
                         l->path, l->type);
    if (l->vt == &td__embedding_vt && !top)
        return td__error(TD_ERR_UNSUPPORTED, "decoder: %s: an embedding after the first layer",
                         l->path);
    if (l->vt == &td__attention_vt) {
        d->natt++;
        if (att_heads(l) > d->heads)
            d->heads = att_heads(l);
    }
    for (int i = 0; i < l->nchildren; i++)
        TD_CHECK(check_layer(d, l->children[i], 0));
    return TD_OK;
}

static td_status check_model(td_decoder *d) {
    td_model *m = d->m;
    td_layer *root = m->root, *last;
    int first = m->part_first == 0, last_part = m->part_end == m->info.layers;
    if (m->kind != TD_INPUT_TOKENS)
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: the model reads features, not tokens; only a token model "
                         "(an embedding first, logits over a vocabulary) generates");
    if (first && (root->nchildren < 1 || root->children[0]->vt != &td__embedding_vt))
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: the model's first layer is not an embedding");
    if (!first && (root->in_ndim != 2 || root->in_shape[0] != d->ctx))
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: part [%d, %d) does not read one row per position", m->part_first,
                         m->part_end);
    if (last_part && (root->out_ndim != 2 || root->out_shape[1] != m->classes))
        return td__error(TD_ERR_UNSUPPORTED,
                         "decoder: the model's output is not (T, vocabulary) logits");
    for (int i = 0; i < root->nchildren; i++)
        TD_CHECK(check_layer(d, root->children[i], first && i == 0));
    d->token_limit = first ? root->children[0]->vocab : 0;
    if (!last_part) {
        d->vocab = root->out_shape[1]; /* a stage's output: activations, not logits */
        return TD_OK;
    }
    last = root->children[root->nchildren - 1];
    if (last->vt == &td__linear_vt && last->split.kind == TD__SPLIT_NONE)
        d->head = last;
    return TD_OK;
}

/* One cache per attention layer, in the order the passes meet them. */
static td_status alloc_kv(td_decoder *d, const td_layer *l, int *k) {
    if (l->vt == &td__attention_vt)
        td__kv_cache_add(d->kvc, (*k)++, att_row(l));
    for (int i = 0; i < l->nchildren; i++)
        TD_CHECK(alloc_kv(d, l->children[i], k));
    return TD_OK;
}

static td_status alloc_state(td_decoder *d) {
    td_model *m = d->m;
    int k = 0;
    if (!(d->host = td__calloc((size_t)d->vocab * td_dtype_size(m->dtype), "a decoder's logits")))
        return TD_ERR_OUT_OF_MEMORY;
    TD_CHECK(td__kv_cache_create(m, d->natt, d->ctx, d->heads, &d->kvc));
    TD_CHECK(alloc_kv(d, m->root, &k));
    return td__kv_cache_finish(d->kvc);
}

static td_status prepare_task(td_device *dev, void *arg) {
    return td__model_prepare(arg, 0, 1, 1);
}

td_status td_decoder_create(td_model *m, td_decoder **out) {
    td_decoder *d = NULL;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_create: out is NULL");
    *out = NULL;
    if (!m)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_create: model is NULL");
    if (!(d = td__calloc(sizeof *d, "a decoder")))
        return TD_ERR_OUT_OF_MEMORY;
    d->m = m;
    d->ctx = m->in_shape[0];
    d->vocab = m->classes;
    TD_TRY(check_model(d));
    TD_TRY(td__packed_create(m, &d->packed));
    d->vcount = d->vocab;
    TD_TRY(alloc_state(d));
    /* the activations of one window: the decoder's workspace */
    TD_TRY(td_device_run(m->dev, prepare_task, m));
    *out = d;
    return TD_OK;
fail:
    td_decoder_destroy(d);
    return st;
}

td_status td_decoder_create_custom(const td_decoder_impl *impl, td_decoder **out) {
    td_decoder *d;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_create_custom: out is NULL");
    *out = NULL;
    if (!impl || !impl->pass || impl->context < 1 || impl->vocab < 1 || impl->token_limit < 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_create_custom: no pass, or a context, vocabulary or token "
                         "limit under 1");
    if (!(d = td__calloc(sizeof *d, "a decoder")))
        return TD_ERR_OUT_OF_MEMORY;
    d->custom = *impl;
    d->ctx = impl->context;
    d->vocab = impl->vocab;
    d->vcount = impl->vocab;
    d->token_limit = impl->token_limit;
    *out = d;
    return TD_OK;
}

td_status td_decoder_set_vocab_slice(td_decoder *d, int64_t first, int64_t count) {
    if (!d || d->custom.pass)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_set_vocab_slice: no decoder, or a custom one");
    if (first < 0 || count < 0 || first + count > d->vocab)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_set_vocab_slice: [%lld, %lld) is not within the %lld "
                         "logits",
                         (long long)first, (long long)(first + count), (long long)d->vocab);
    if (count > 0 && count < d->vocab && !d->head)
        return td__error(TD_ERR_UNSUPPORTED,
                         "td_decoder_set_vocab_slice: the model's last layer is not a whole "
                         "linear head, so its logits cannot be computed in slices");
    d->vfirst = first;
    d->vcount = count;
    return TD_OK;
}

void td_decoder_destroy(td_decoder *d) {
    if (!d)
        return;
    if (d->custom.destroy)
        d->custom.destroy(d->custom.impl);
    td__kv_cache_destroy(d->kvc);
    free(d->host);
    td__packed_destroy(d->packed);
    if (d->owns_model)
        td_model_destroy(d->m);
    free(d);
}

void td_decoder_take_model(td_decoder *d) {
    if (!d || d->custom.pass)
        return;
    d->owns_model = 1;
    /* nothing but d reads the model now: its gradients and the f32 copies
     * of packed matrices go */
    td__model_release_grads(d->m);
    td__packed_release_f32(d->packed);
}

int64_t td_decoder_context(const td_decoder *d) {
    return d ? d->ctx : 0;
}
int64_t td_decoder_vocab(const td_decoder *d) {
    return d ? d->vocab : 0;
}
int64_t td_decoder_token_limit(const td_decoder *d) {
    return d ? d->token_limit : 0;
}
int64_t td_decoder_position(const td_decoder *d) {
    return d ? d->pos : 0;
}
size_t td_decoder_kv_bytes(const td_decoder *d) {
    return d ? td__kv_cache_bytes(d->kvc) : 0;
}

/* Passes ------------------------------------------------------------------------------ */

typedef struct run_args {
    td_decoder *d;
    const int32_t *tokens;
    int64_t pos, n;
    double *logits;
} run_args;

/* The logits of the pass's last row in the decoder's slice, converted to
 * doubles into their places. */
static td_status read_logits(td_decoder *d, int64_t n, double *logits) {
    td_model *m = d->m;
    size_t es = td_dtype_size(m->dtype), row = (size_t)d->vcount * es;
    const td_tensor *out;
    const char *src;
    if (!d->vcount)
        return TD_OK;
    out = d->vcount < d->vocab ? &d->head->out : &m->root->out;
    src = (const char *)out->data + (size_t)(n - 1) * row;
    TD_CHECK(td__device_read(m->dev, d->host, src, row));
    for (int64_t i = 0; i < d->vcount; i++)
        logits[d->vfirst + i] = m->dtype == TD_F64 ? ((double *)d->host)[i] : ((float *)d->host)[i];
    return TD_OK;
}

static td_status run_task(td_device *dev, void *arg) {
    run_args *a = arg;
    td_decoder *d = a->d;
    td_model *m = d->m;
    pass p = {d, a->pos, a->n, 0};
    td_tensor x = m->input;
    m->stretch_start = td_clock_ns();
    TD_CHECK(td__model_prepare(m, 0, 1, 1));
    if (m->part_first > 0)
        TD_CHECK(first_rows(&m->input, a->n, &x)); /* copied in by td_decoder_part_pass */
    else
        TD_CHECK(td__device_write(dev, m->tokens.ptr, a->tokens, (size_t)a->n * sizeof(int32_t)));
    TD_CHECK(seq_decode(m->root, &x, &p));
    if (a->logits)
        TD_CHECK(read_logits(d, a->n, a->logits));
    /* a device slowed on purpose is slowed here, as in training */
    td__device_throttle(dev, m->stretch_start);
    return TD_OK;
}

static td_status run_pass(td_decoder *d, const int32_t *tokens, int64_t pos, int64_t n,
                          double *logits) {
    run_args a = {d, tokens, pos, n, logits};
    if (d->custom.pass)
        return d->custom.pass(d->custom.impl, tokens, pos, n, logits);
    return td_device_run(d->m->dev, run_task, &a);
}

static td_status check_tokens(const td_decoder *d, const int32_t *tokens, int64_t n,
                              const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->token_limit)
            return td__error(TD_ERR_INVALID_ARG, "%s: token %d at %lld is outside [0, %lld)", what,
                             (int)tokens[i], (long long)i, (long long)d->token_limit);
    return TD_OK;
}

td_status td_decoder_prefill(td_decoder *d, const int32_t *tokens, int64_t n, double *logits) {
    td_status st;
    if (!d || !tokens)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_prefill: decoder or tokens is NULL");
    d->pos = 0;
    if (n < 1 || n > d->ctx)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_prefill: %lld tokens; the context holds 1 to %lld",
                         (long long)n, (long long)d->ctx);
    TD_CHECK(check_tokens(d, tokens, n, "td_decoder_prefill"));
    if ((st = run_pass(d, tokens, 0, n, logits)) == TD_OK)
        d->pos = n;
    return st;
}

td_status td_decoder_step(td_decoder *d, int32_t token, double *logits) {
    td_status st;
    if (!d)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_step: decoder is NULL");
    if (d->pos == 0)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_step: nothing prefilled yet");
    if (d->pos >= d->ctx)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_step: the cache is full (%lld positions); prefill a "
                         "shorter window",
                         (long long)d->ctx);
    TD_CHECK(check_tokens(d, &token, 1, "td_decoder_step"));
    if ((st = run_pass(d, &token, d->pos, 1, logits)) == TD_OK)
        d->pos++;
    return st;
}

/* Pipeline stages ---------------------------------------------------------------------- */

static td_status carve_task(td_device *dev, void *arg) {
    (void)dev;
    return td__model_prepare(arg, 0, 1, 1);
}

/* A view's elements as a buffer on the model's device. */
static td_buffer rows_buffer(const td_model *m, const td_tensor *rows) {
    td_buffer b = {m->dev, rows->data, rows->numel * td_dtype_size(m->dtype)};
    return b;
}

static td_status check_part_pass(const td_decoder *d, const int32_t *tokens, const td_buffer *in,
                                 int64_t pos, int64_t n, const double *logits) {
    const td_model *m = d->m;
    if (pos < 0 || n < 1 || pos + n > d->ctx || (pos > 0 && n != 1))
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_part_pass: positions [%lld, %lld): a prefill from 0 or one "
                         "position after it, within the context of %lld",
                         (long long)pos, (long long)(pos + n), (long long)d->ctx);
    if (pos > 0 && pos != d->pos)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_part_pass: position %lld; the cache holds %lld",
                         (long long)pos, (long long)d->pos);
    if (m->part_first == 0 ? !tokens : !in)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_part_pass: part [%d, %d) reads %s",
                         m->part_first, m->part_end,
                         m->part_first == 0 ? "tokens, and tokens is NULL"
                                            : "the previous part's rows, and in is NULL");
    if (logits && m->part_end != m->info.layers)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_decoder_part_pass: part [%d, %d) gives no logits: the last part "
                         "does",
                         m->part_first, m->part_end);
    return m->part_first == 0 ? check_tokens(d, tokens, n, "td_decoder_part_pass") : TD_OK;
}

td_status td_decoder_part_pass(td_decoder *d, const int32_t *tokens, const td_buffer *in,
                               int64_t pos, int64_t n, double *logits) {
    td_model *m;
    td_tensor rows;
    td_status st;
    if (!d || d->custom.pass)
        return td__error(TD_ERR_INVALID_ARG, "td_decoder_part_pass: no decoder, or a custom one");
    m = d->m;
    TD_CHECK(check_part_pass(d, tokens, in, pos, n, logits));
    d->pos = pos == 0 ? 0 : d->pos;
    if (m->part_first > 0) {
        td_buffer dst;
        /* the copy may need in's device thread: from here, not inside a task */
        TD_CHECK(td_device_run(m->dev, carve_task, m));
        TD_CHECK(first_rows(&m->input, n, &rows));
        dst = rows_buffer(m, &rows);
        if (td_buffer_size(in) < dst.nbytes)
            return td__error(TD_ERR_INVALID_ARG,
                             "td_decoder_part_pass: in has %zu bytes; %lld rows need %zu",
                             td_buffer_size(in), (long long)n, dst.nbytes);
        TD_CHECK(td_buffer_copy(&dst, 0, in, 0, dst.nbytes));
    }
    if ((st = run_pass(d, tokens, pos, n, logits)) != TD_OK)
        return st;
    d->pos = pos + n;
    TD_CHECK(first_rows(&m->root->out, n, &rows));
    d->out = rows_buffer(m, &rows);
    return TD_OK;
}

const td_buffer *td_decoder_part_output(const td_decoder *d) {
    return d && d->pos > 0 && !d->custom.pass ? &d->out : NULL;
}
