/* Tensor-parallel generation: the `tensor` strategy's slices serving one
 * sequence. Member k of the group holds a shard of the model (the same
 * kind of shard training uses: a slice of every MLP pair's hidden features
 * and of every attention layer's heads, the rest whole) with a decoder that
 * keeps the keys and values of its own heads, and computes one slice of the
 * head's vocabulary rows. A pass runs every member's decoder on its own
 * thread; each unit's partial outputs are summed by the reduce hook's small
 * all-reduces, and each member writes its slice of the logits into the
 * caller's array, so no gather is needed (the group is one process).
 *
 * Batch-1 decoding reads every weight once per token, so the slices follow
 * each device's measured speed at that: every member in turn times
 * products of one row with a weight matrix larger than its caches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/strategy-impl.h"
#include "parallel/tp-impl.h"
#include "tensor/view.h"

typedef struct dmember {
    td_group *group;
    td_device *dev;
    td_model *m;
    td_decoder *d;
    td_shard_plan plan;
} dmember;

typedef struct tensor_dec {
    td_group *g;
    int size;
    dmember mb[TD_DP_MAX_MEMBERS];
    double share[TD_DP_MAX_MEMBERS];
    /* the pass the members run */
    const int32_t *tokens;
    int64_t pos, n;
    double *logits;
} tensor_dec;

static td_status reduce_hook(void *arg, td_tensor *t) {
    dmember *m = arg;
    /* t is a view into the model's activations: a buffer over its elements */
    td_buffer b = td__tensor_as_buffer(t);
    return td_allreduce(m->group, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t),
                        TD_REDUCE_SUM);
}

/* Sizing ---------------------------------------------------------------------------- */

static void make_plans(tensor_dec *t, const td_split_info *units, int nunits, td_weights w) {
    for (int k = 0; k < t->size; k++)
        td__cut_units(units, nunits, t->share, t->size, w, k, &t->mb[k].plan);
}

/* Passes ------------------------------------------------------------------------------- */

static td_status member_pass(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tensor_dec *t = arg;
    td_decoder *d = t->mb[rank].d;
    (void)g;
    (void)dev;
    (void)size;
    return t->pos == 0 ? td_decoder_prefill(d, t->tokens, t->n, t->logits)
                       : td_decoder_step(d, t->tokens[0], t->logits);
}

static td_status tensor_pass(void *impl, const int32_t *tokens, int64_t pos, int64_t n,
                             double *logits) {
    tensor_dec *t = impl;
    t->tokens = tokens;
    t->pos = pos;
    t->n = n;
    t->logits = logits;
    return td_group_run(t->g, member_pass, t);
}

static void tensor_dec_destroy(void *impl) {
    tensor_dec *t = impl;
    if (!t)
        return;
    for (int k = 0; k < t->size; k++) {
        td_decoder_destroy(t->mb[k].d);
        td_model_destroy(t->mb[k].m);
    }
    free(t);
}

/* Building -------------------------------------------------------------------------------- */

static td_status make_member(tensor_dec *t, int k, const char *json, const char *checkpoint,
                             td_dtype dtype, const int64_t *vfirst, const int64_t *vcount) {
    dmember *m = &t->mb[k];
    TD_CHECK(td_model_load_shard(json, checkpoint, m->dev, dtype, 0, &m->plan, &m->m));
    td_model_set_reduce_hook(m->m, reduce_hook, m);
    TD_CHECK(td_checkpoint_load_weights(checkpoint, m->m));
    TD_CHECK(td_decoder_create(m->m, &m->d));
    /* a head that is not a whole linear: the first member gives every logit */
    if (td_decoder_set_vocab_slice(m->d, vfirst[k], vcount[k]) == TD_ERR_UNSUPPORTED)
        TD_CHECK(td_decoder_set_vocab_slice(m->d, 0, k == 0 ? td_decoder_vocab(m->d) : 0));
    /* the decoder alone reads the shard: its gradients (and f32 copies of
     * packed matrices) go */
    td_decoder_take_model(m->d);
    m->m = NULL;
    return TD_OK;
}

/* The members' decoders, their shards sized by the shares. */
static td_status make_members(tensor_dec *t, const char *json, const char *checkpoint,
                              td_dtype dtype) {
    td_split_info units[TD_SHARD_MAX_UNITS];
    td_model_info info;
    int64_t vfirst[TD_DP_MAX_MEMBERS], vcount[TD_DP_MAX_MEMBERS];
    int nunits = 0;
    td_weights w = (td_weights)td_weights_default();
    TD_CHECK(td_model_describe(json, checkpoint, &info, NULL, 0));
    TD_CHECK(td_model_describe_splits(json, checkpoint, units, TD_SHARD_MAX_UNITS, &nunits));
    if (nunits == 0)
        return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                 "tensor: %s has no layer to split across devices (an MLP pair "
                                 "or attention); generate with `strategy` single",
                                 checkpoint);
    if (td_weights_default() < 0)
        TD_CHECK(td_checkpoint_read_weights(checkpoint, &w));
    make_plans(t, units, nunits, w);
    td__cut_by_shares(info.classes, t->share, t->size, vfirst, vcount);
    for (int k = 0; k < t->size; k++)
        TD_CHECK(make_member(t, k, json, checkpoint, dtype, vfirst, vcount));
    return TD_OK;
}

td_status td__tensor_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                             const char *options, td_decoder **out) {
    tensor_dec *t = td__calloc(sizeof *t, "a tensor-parallel decoder");
    td_decoder_impl impl = {tensor_pass, tensor_dec_destroy, t, 0, 0, 0};
    double alone[TD_DP_MAX_MEMBERS];
    char *json = NULL;
    td_dtype saved;
    td_status st;
    (void)options; /* data:R,tensor:N is refused above it */
    if (!t)
        return TD_ERR_OUT_OF_MEMORY;
    t->g = g;
    t->size = td_group_size(g);
    if (t->size > TD_DP_MAX_MEMBERS) {
        st = td__error(TD_ERR_INVALID_ARG, "tensor: %d devices; at most %d", t->size,
                       TD_DP_MAX_MEMBERS);
        goto fail;
    }
    for (int k = 0; k < t->size; k++) {
        dmember *m = &t->mb[k];
        m->group = g;
        m->dev = td_group_device(g, k);
        TD_TRY(td__tensor_check_dtype(m->dev, dtype));
        TD_TRY(td__speed_probe(m->dev, dtype, &alone[k]));
    }
    td__shares_from_speed(alone, t->size, t->share);
    TD_TRY(td_checkpoint_read_meta(checkpoint, &json, &saved, NULL));
    TD_TRY(make_members(t, json, checkpoint, dtype));
    impl.context = td_decoder_context(t->mb[0].d);
    impl.vocab = td_decoder_vocab(t->mb[0].d);
    impl.token_limit = td_decoder_token_limit(t->mb[0].d);
    TD_TRY(td_decoder_create_custom(&impl, out));
    free(json);
    return TD_OK;
fail:
    free(json);
    tensor_dec_destroy(t);
    return st;
}
