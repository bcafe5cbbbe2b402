/* Building attention (GPT-2's and the Llama family's: grouped-query heads,
 * rotary positions, optional biases), RMSNorm and the SwiGLU MLP from their
 * JSON specs; rows of layer_kinds in layers_build.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/build-impl.h"
#include "nn/nn-impl.h"

td_status td__build_rmsnorm(build_ctx *b, td_layer *l, int variant, int in_ndim,
                            const int64_t *in) {
    static const char *const keys[] = {"type", "eps", NULL};
    int64_t c;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_real(b, "eps", 1e-6, 0.0, 1.0, 0, &l->eps));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__rmsnorm_vt;
    c = in[in_ndim - 1];
    TD_CHECK(td__model_add_param(b->m, l, "weight", 1, &c, &l->param[0]));
    return l->param[0] ? td_tensor_fill(l->param[0], 1.0) : TD_OK;
}

/* Whole parameters, each from U(+-1/sqrt(fan_in)) like a linear's. */
static td_status add_uniform(td_model *m, td_layer *l, const char *name, int ndim,
                             const int64_t *shape, int64_t fan_in, td_tensor **p) {
    return td__model_add_slice(m, l, name, ndim, shape, -1, 1, 0, 0, 0, 1.0 / sqrt((double)fan_in),
                               p);
}

td_status td__build_swiglu(build_ctx *b, td_layer *l, int variant, int in_ndim, const int64_t *in) {
    static const char *const keys[] = {"type", "hidden", "bias", NULL};
    td_model *m = b->m;
    const td__split *sp = &l->split;
    int split;
    int64_t c, s[2];
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_int(b, "hidden", 1, 0, 1, 1 << 24, &l->hidden));
    TD_CHECK(td__spec_bool(b, "bias", 0, &l->has_bias));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__swiglu_vt;
    c = in[in_ndim - 1];
    /* gate_up: the gate's rows, then the up projection's. A shard's hidden
     * features: their rows of each block of gate_up, their columns of down
     * (whose bias stays whole, added once after the sum). */
    split = sp->kind == TD__SPLIT_GATED;
    s[0] = 2 * l->hidden;
    s[1] = c;
    TD_CHECK(td__model_add_slice(m, l, "gate_up.weight", 2, s, split ? 0 : -1, 2, sp->first,
                                 sp->count, 0, 1.0 / sqrt((double)c), &l->param[0]));
    if (l->has_bias)
        TD_CHECK(td__model_add_slice(m, l, "gate_up.bias", 1, s, split ? 0 : -1, 2, sp->first,
                                     sp->count, 0, 1.0 / sqrt((double)c), &l->param[1]));
    s[0] = c;
    s[1] = l->hidden;
    TD_CHECK(td__model_add_slice(m, l, "down.weight", 2, s, split ? 1 : -1, 1, sp->first, sp->count,
                                 0, 1.0 / sqrt((double)l->hidden), &l->param[2]));
    if (l->has_bias)
        TD_CHECK(add_uniform(m, l, "down.bias", 1, s, l->hidden, &l->param[3]));
    if (split)
        l->hidden = sp->count;
    return TD_OK;
}

/* Rotary positions ------------------------------------------------------------------- */

/* Llama 3's frequency scaling (transformers' rope_type "llama3"). */
typedef struct rope_scaling {
    int on;
    double factor, low, high, original;
} rope_scaling;

static td_status read_scaling(const build_ctx *b, rope_scaling *sc) {
    static const char *const keys[] = {
        "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
        NULL};
    json_t *v = json_object_get(b->spec, "rope_scaling"), *type;
    char where[300];
    build_ctx sub = *b;
    int64_t original;
    memset(sc, 0, sizeof *sc);
    if (!v)
        return TD_OK;
    if (!json_is_object(v))
        return td__spec_error(b, "rope_scaling",
                              "expected an object such as {\"type\": \"llama3\", \"factor\": 8, "
                              "...}");
    snprintf(where, sizeof where, "%s.rope_scaling", b->where);
    sub.spec = v;
    sub.where = where;
    type = json_object_get(v, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "llama3"))
        return td__spec_error(&sub, "type", "expected \"llama3\" (the only scaling implemented)");
    TD_CHECK(td__spec_keys(&sub, keys));
    TD_CHECK(td__spec_real(&sub, "factor", 8.0, 1.0, 1e6, 0, &sc->factor));
    TD_CHECK(td__spec_real(&sub, "low_freq_factor", 1.0, 1e-6, 1e6, 0, &sc->low));
    TD_CHECK(td__spec_real(&sub, "high_freq_factor", 4.0, 1e-6, 1e6, 0, &sc->high));
    TD_CHECK(
        td__spec_int(&sub, "original_max_position_embeddings", 0, 8192, 1, 1 << 24, &original));
    if (!(sc->high > sc->low))
        return td__spec_error(&sub, "high_freq_factor", "must exceed low_freq_factor");
    sc->original = (double)original;
    sc->on = 1;
    return TD_OK;
}

/* Frequency j of a head of d: theta^(-2j/d), scaled as Llama 3's are: long
 * wavelengths divided by factor, short ones kept, those between blended. */
static double rope_freq(double theta, int64_t j, int64_t d, const rope_scaling *sc) {
    double f = pow(theta, -2.0 * (double)j / (double)d), wavelen, smooth;
    if (!sc->on)
        return f;
    wavelen = 2 * M_PI / f;
    if (wavelen < sc->original / sc->high)
        return f;
    if (wavelen > sc->original / sc->low)
        return f / sc->factor;
    smooth = (sc->original / wavelen - sc->low) / (sc->high - sc->low);
    return (1 - smooth) * f / sc->factor + smooth * f;
}

/* l->rope (2, t, d/2): cos then sin of position p times frequency j,
 * computed in f64. */
static td_status rope_table(td_model *m, td_layer *l, int64_t t, int64_t d, double theta,
                            const rope_scaling *sc) {
    int64_t half = d / 2, shape[3] = {2, t, half};
    size_t n = (size_t)(2 * t * half);
    double *v;
    td_status st;
    if (m->dry)
        return TD_OK;
    if (!(v = td__calloc(n * sizeof *v, "a rotary position table")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int64_t j = 0; j < half; j++) {
        double f = rope_freq(theta, j, d, sc);
        for (int64_t p = 0; p < t; p++) {
            v[p * half + j] = cos((double)p * f);
            v[(t + p) * half + j] = sin((double)p * f);
        }
    }
    st = td_tensor_create(m->dev, m->dtype, 3, shape, &l->rope);
    if (st == TD_OK)
        st = td_tensor_write_f64(l->rope, v, n);
    free(v);
    return st;
}

/* Attention ------------------------------------------------------------------------ */

/* The slice of qkv (whole shape[0..ndim)) a layer holds: all of it, or a
 * shard's rows of q, k and v; with fewer key/value heads than query heads,
 * those of the key and value heads its query heads read (td__att_map). */
static td_param_slice qkv_slice(const td_layer *l, int64_t d, int ndim, const int64_t *shape) {
    td_param_slice sl;
    td_kv_map map = td__att_map(l);
    memset(&sl, 0, sizeof sl);
    sl.ndim = ndim;
    memcpy(sl.shape, shape, sizeof(int64_t) * (size_t)ndim);
    sl.dim = -1;
    sl.blocks = 1;
    if (l->split.kind != TD__SPLIT_HEADS)
        return sl;
    sl.dim = 0;
    sl.blocks = 3;
    sl.first = l->split.first * d;
    sl.count = l->split.count * d;
    if (l->kv_heads == l->heads)
        return sl;
    sl.kv_extent = l->kv_heads * d;
    sl.kv_first = map.h ? l->split.first / map.g * d : 0;
    sl.kv_count = map.kv * d;
    sl.kv_shared = map.skew ? d : 0; /* 0 without heads: td__att_map */
    return sl;
}

td_status td__build_attention(build_ctx *b, td_layer *l, int variant, int in_ndim,
                              const int64_t *in) {
    static const char *const keys[] = {"type",       "heads",        "kv_heads",
                                       "causal",     "qkv_bias",     "proj_bias",
                                       "rope_theta", "rope_scaling", NULL};
    td_model *m = b->m;
    int causal, hd;
    int64_t c, d, s[2], kv, first, count;
    double bound, theta;
    td_param_slice qkv;
    rope_scaling sc;
    char msg[160];
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_int(b, "heads", 1, 0, 1, 4096, &l->heads));
    TD_CHECK(td__spec_int(b, "kv_heads", 0, l->heads, 1, 4096, &l->kv_heads));
    TD_CHECK(td__spec_bool(b, "causal", 1, &causal));
    TD_CHECK(td__spec_bool(b, "qkv_bias", 1, &l->has_bias));
    TD_CHECK(td__spec_bool(b, "proj_bias", 1, &l->proj_bias));
    TD_CHECK(td__spec_real(b, "rope_theta", 0.0, 0.0, 1e12, 0, &theta));
    TD_CHECK(read_scaling(b, &sc));
    if (!causal)
        return td__spec_error(b, "causal", "only causal self-attention is implemented");
    if (in_ndim != 2)
        return td__build_shape_error(b, "(tokens, channels)", in_ndim, in);
    c = in[1];
    if (c % l->heads != 0)
        return td__spec_error(b, "heads", "must divide the channels");
    if (l->heads % l->kv_heads != 0) {
        snprintf(msg, sizeof msg,
                 "%lld key/value heads cannot serve %lld query heads: heads must be a multiple "
                 "of kv_heads",
                 (long long)l->kv_heads, (long long)l->heads);
        return td__spec_error(b, "kv_heads", msg);
    }
    d = c / l->heads;
    if (json_object_get(b->spec, "rope_theta") && !(theta > 0))
        return td__spec_error(b, "rope_theta", "must be positive");
    if (theta > 0 && d % 2)
        return td__spec_error(b, "rope_theta",
                              "rotary positions need an even head width (channels / heads)");
    if (sc.on && !(theta > 0))
        return td__spec_error(b, "rope_scaling", "needs rope_theta");
    l->vt = &td__attention_vt;
    /* q (heads d), k and v (kv_heads d each) side by side: qkv.weight is
     * ((heads + 2 kv_heads) d, c). A shard's heads: their rows of q, the
     * rows of the key and value heads they read (td__att_map), and their
     * columns of the projection. */
    kv = l->kv_heads;
    hd = l->split.kind == TD__SPLIT_HEADS ? 0 : -1;
    first = l->split.first * d;
    count = l->split.count * d;
    bound = 1.0 / sqrt((double)c);
    s[0] = (l->heads + 2 * kv) * d;
    s[1] = c;
    qkv = qkv_slice(l, d, 2, s);
    TD_CHECK(td__model_add_param_slice(m, l, "qkv.weight", &qkv, 0, bound, &l->param[0]));
    if (l->has_bias) {
        qkv.ndim = 1;
        TD_CHECK(td__model_add_param_slice(m, l, "qkv.bias", &qkv, 0, bound, &l->param[1]));
    }
    s[0] = c;
    TD_CHECK(td__model_add_slice(m, l, "proj.weight", 2, s, hd < 0 ? -1 : 1, 1, first, count, 0,
                                 bound, &l->param[2]));
    if (l->proj_bias)
        TD_CHECK(add_uniform(m, l, "proj.bias", 1, s, c, &l->param[3]));
    return theta > 0 ? rope_table(m, l, in[0], d, theta, &sc) : TD_OK;
}
