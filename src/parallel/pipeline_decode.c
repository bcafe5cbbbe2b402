/* Pipeline-parallel generation: the model's layers cut into consecutive
 * stages, one per device, each a model part with a decoder that keeps the
 * cache of its own attention layers. A pass runs the stages in order from
 * the calling thread: the first reads the tokens, each later one copies the
 * rows the one before it gave, the last gives the logits. One sequence
 * leaves nothing to overlap, so this is for a model too big for one device,
 * not for speed: the weights are cut in proportion to each device's
 * measured speed at reading them, so every device's part of a token takes
 * about as long. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/pipeline-impl.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

typedef struct pstage {
    td_model *m; /* NULL: an empty stage */
    td_decoder *d;
} pstage;

typedef struct pipe_dec {
    int n;
    pstage st[TD_PP_MAX_STAGES];
} pipe_dec;

static td_status pipe_pass(void *impl, const int32_t *tokens, int64_t pos, int64_t n,
                           double *logits) {
    pipe_dec *p = impl;
    const td_buffer *in = NULL;
    int last = p->n - 1;
    while (!p->st[last].d)
        last--;
    for (int k = 0; k <= last; k++) {
        if (!p->st[k].d)
            continue;
        TD_CHECK(td_decoder_part_pass(p->st[k].d, in ? NULL : tokens, in, pos, n,
                                      k == last ? logits : NULL));
        in = td_decoder_part_output(p->st[k].d);
    }
    return TD_OK;
}

static void pipe_destroy(void *impl) {
    pipe_dec *p = impl;
    if (!p)
        return;
    for (int k = 0; k < p->n; k++) {
        td_decoder_destroy(p->st[k].d);
        td_model_destroy(p->st[k].m);
    }
    free(p);
}

/* Stage k takes top-level layers [first[k], end[k]): the cut that puts each
 * stage's weights nearest its share of all of them (a layer goes to the
 * stage its middle falls in). */
static void cut_layers(const td_layer_info *li, int nl, const double *share, int n, int *first,
                       int *end) {
    double total = 0, cum = 0, target = 0;
    int at = 0;
    for (int i = 0; i < nl; i++)
        total += (double)li[i].weights + 1;
    for (int k = 0; k < n; k++) {
        first[k] = at;
        target += share[k] * total;
        while (at < nl && (k == n - 1 || cum + ((double)li[at].weights + 1) / 2 <= target))
            cum += (double)li[at++].weights + 1;
        end[k] = at;
    }
}

/* *table: the name of the embedding's table, which an untied head reads
 * (NULL: nothing tied); set by the stage holding the embedding, the first. */
static td_status make_stage(pstage *s, td_device *dev, const char *json, const char *checkpoint,
                            td_dtype dtype, int first, int end, int untied, const char **table) {
    TD_CHECK(td_model_load_part(json, checkpoint, dev, dtype, 0, first, end, 1, &s->m));
    if (untied && first == 0)
        *table = td_model_param_name(s->m, 0);
    TD_CHECK(td_checkpoint_load_weights_alias(checkpoint, s->m, *table));
    return td_decoder_create(s->m, &s->d);
}

/* The stages of the model in json over g's devices. A head tied to the
 * embedding gets a copy of the table, so that the two may lie in different
 * stages. */
static td_status make_stages(pipe_dec *p, td_group *g, const char *json, const char *checkpoint,
                             td_dtype dtype) {
    td_model_info info;
    td_layer_info *li = NULL;
    double alone[TD_PP_MAX_STAGES], share[TD_PP_MAX_STAGES];
    int first[TD_PP_MAX_STAGES], end[TD_PP_MAX_STAGES];
    char *untied = NULL;
    const char *table = NULL;
    td_status st;
    TD_CHECK(td_model_untie(json, checkpoint, &untied));
    if (untied)
        json = untied;
    TD_TRY(td_model_describe(json, checkpoint, &info, NULL, 0));
    if (!(li = td__calloc(sizeof *li * (size_t)info.layers, "the layers' sizes"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    TD_TRY(td_model_describe(json, checkpoint, &info, li, info.layers));
    for (int k = 0; k < p->n; k++)
        TD_TRY(td__speed_probe(td_group_device(g, k), dtype, &alone[k]));
    td__shares_from_speed(alone, p->n, share);
    cut_layers(li, info.layers, share, p->n, first, end);
    for (int k = 0; k < p->n; k++)
        if (first[k] < end[k])
            TD_TRY(make_stage(&p->st[k], td_group_device(g, k), json, checkpoint, dtype, first[k],
                              end[k], untied != NULL, &table));
fail:
    free(li);
    free(untied);
    return st;
}

td_status td__pipeline_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                               td_decoder **out) {
    pipe_dec *p = td__calloc(sizeof *p, "a pipeline decoder");
    td_decoder_impl impl = {pipe_pass, pipe_destroy, p, 0, 0, 0};
    char *json = NULL;
    td_dtype saved;
    td_status st;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    p->n = td_group_size(g);
    if (p->n > TD_PP_MAX_STAGES) {
        st = td__error(TD_ERR_INVALID_ARG, "pipeline: %d devices; at most %d", p->n,
                       TD_PP_MAX_STAGES);
        goto fail;
    }
    for (int k = 0; k < p->n; k++)
        TD_TRY(td__tensor_check_dtype(td_group_device(g, k), dtype));
    TD_TRY(td_checkpoint_read_meta(checkpoint, &json, &saved, NULL));
    TD_TRY(make_stages(p, g, json, checkpoint, dtype));
    /* the first stage holds the embedding (its tokens), the last the head */
    for (int k = 0; k < p->n; k++)
        if (p->st[k].d) {
            impl.context = td_decoder_context(p->st[k].d);
            impl.token_limit =
                impl.token_limit ? impl.token_limit : td_decoder_token_limit(p->st[k].d);
            impl.vocab = td_decoder_vocab(p->st[k].d);
        }
    TD_TRY(td_decoder_create_custom(&impl, out));
    free(json);
    return TD_OK;
fail:
    free(json);
    pipe_destroy(p);
    return st;
}
